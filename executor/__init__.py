"""edgepipe's torch side.

The model zoo (:mod:`executor.zoo`, models as chains of blocks), the profiler that turns
a chain into a model profile (:mod:`executor.profiler`), analytic profiles for catalog
device types (:mod:`executor.analytic`, torch-free) and the device probe
(:mod:`executor.probe`), and the executor that trains a plan: :mod:`executor.layout`
(ranks and sample slices), :mod:`executor.stage`, :mod:`executor.data`,
:mod:`executor.comm`, :mod:`executor.runtime`, :mod:`executor.metrics`,
:mod:`executor.worker` and :mod:`executor.launch`. See docs/executor.md.
"""
