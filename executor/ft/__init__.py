"""edgepipe.executor.ft"""
