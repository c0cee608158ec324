"""A lab worker's first steps, before anything allocates or opens a socket: join its
device's cgroup, move into its device's network namespace, bind gloo to its data
interface, one torch thread, and (a paced device) pace every action of its runtime to
its CPU quota (:mod:`executor.lab.pacing`); then the ordinary worker
(:func:`executor.worker.spawned`).

This module imports no torch: the spawned child unpickles :func:`start` and its
arguments before it is confined, so the run's options travel pickled (``blob``) and are
loaded, with torch, only once the process is in its cgroup (docs/lab.md, "Running").
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass

from edgepipe.executor.lab import network
from edgepipe.executor.lab.cgroups import Cgroup
from edgepipe.planner.errors import EdgepipeError

#: exit status of a worker whose confinement failed (as the worker's refusals)
EXIT_REFUSED = 2


@dataclass(frozen=True)
class Place:
    """Where one lab device's worker runs: its cgroup, its namespace and the interface
    that holds its data address (gloo's ``GLOO_SOCKET_IFNAME``)."""

    device: str
    namespace: str
    interface: str
    cgroup: Cgroup


def start(place: Place, blob: bytes) -> None:
    """Entry of a lab worker's process: confine it (module docstring), then run the
    pickled ``(WorkerOptions, Endpoint)`` in ``blob`` as :func:`executor.worker.spawned`.
    A confinement that fails exits :data:`EXIT_REFUSED` with one line."""
    try:
        place.cgroup.add(os.getpid())
        network.enter(place.namespace)
    except EdgepipeError as exc:
        os.write(2, f"edgepipe lab device {place.device}: {exc}\n".encode())
        sys.exit(EXIT_REFUSED)
    os.environ["GLOO_SOCKET_IFNAME"] = place.interface
    os.environ["OMP_NUM_THREADS"] = "1"
    conf = place.cgroup.confinement
    if conf.paced:
        from edgepipe.executor.core.runtime import pace_every_action
        from edgepipe.executor.lab.pacing import Pacer, fine_timer_slack

        fine_timer_slack()  # the runtime's actions run on this thread
        pace_every_action(Pacer(conf.cpu_cores).pace)
    from edgepipe.executor.worker import spawned

    opts, endpoint = pickle.loads(blob)
    spawned(opts, endpoint)
