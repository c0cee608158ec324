"""edgepipe's torch side.

The model zoo (:mod:`executor.zoo`, models as chains of blocks), the profiler that turns
a chain into a model profile (:mod:`executor.profiler`), analytic profiles for catalog
device types (:mod:`executor.analytic`, torch-free) and the device probe
(:mod:`executor.probe`). See docs/executor.md.
"""
