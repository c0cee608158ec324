"""edgepipe.executor.lab: real, confined compute and shaped links on one machine.

Each planned device runs as a real process under a CPU quota and a memory limit
(cgroups) in its own network namespace, linked in the cluster's topology by links shaped
with ``tc tbf`` (docs/lab.md).
"""
