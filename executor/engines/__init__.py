"""edgepipe.executor.engines: engines that turn a validated plan into training.

Engines are found by name through the entry-point group ``edgepipe.engines``
(:mod:`.base`: the protocol and the registry). Built in: ``edgepipe`` (:mod:`.runtime`,
edgepipe's own runtime) and ``torch-pipelining`` (:mod:`.torch_pipelining`, with its
ranks in :mod:`.torch_worker` and its refusals in :mod:`.torch_plans`). docs/engines.md.
"""
