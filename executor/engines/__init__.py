"""edgepipe.executor.engines: engines that turn a validated plan into training.

Engines are found by name through the entry-point group ``edgepipe.engines``.
"""
