"""The control plane's default timeouts and intervals, in seconds: one source for the
CLI's defaults (planner/cli/running.py and args.py: ``edgepipe run``, ``coordinate``) and the
executor's (executor/launch.py, executor/ft/coordinator.py, executor/worker.py).

Pure Python with no imports, so the planner side, which never imports torch or
executor/ (tests/integration/test_packaging.py), and the executor can both read it.
"""

#: heartbeat silence after which a device is declared dead (hung, or its host lost)
HANG_TIMEOUT_S = 10.0
#: how long a worker may take to send its first heartbeat (interpreter start, torch
#: import, plan load: over 20 s for four children on a loaded two-core machine)
START_TIMEOUT_S = 120.0
#: seconds between two heartbeats of a worker
HEARTBEAT_S = 0.5
#: how long one transfer or collective may wait (gloo's per-operation timeout)
GLOO_TIMEOUT_S = 60.0
