"""edgepipe.executor.profiling"""
