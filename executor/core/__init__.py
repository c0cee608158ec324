"""edgepipe.executor.core"""
