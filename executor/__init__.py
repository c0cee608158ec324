"""edgepipe's torch side.

The model zoo (:mod:`executor.profiling.zoo`, models as chains of blocks), the profiler that turns
a chain into a model profile (:mod:`executor.profiling.profiler`), analytic profiles for catalog
device types (:mod:`executor.profiling.analytic`, torch-free) and the device probe
(:mod:`executor.profiling.probe`), and the executor that trains a plan: :mod:`executor.core.layout`
(ranks and sample slices), :mod:`executor.core.stage`, :mod:`executor.core.data`,
:mod:`executor.core.comm`, :mod:`executor.core.runtime`, :mod:`executor.core.metrics`,
:mod:`executor.worker` and :mod:`executor.launch`. See docs/executor.md.
"""
