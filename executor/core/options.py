"""What a rank runs and where it sits: :class:`WorkerOptions` (the same for every rank of
a run) and :class:`Endpoint` (this rank's place and the run's store).

The worker (:mod:`executor.worker`), the launcher (:mod:`executor.launch`) and the
cross-host coordinator (:mod:`executor.ft.coordinator`) all read these; they live apart
from each of them so that none imports another for its types.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgepipe.executor.core.emulation import EmulatedSlowdown
from edgepipe.planner.cli.args import KEEP_CHECKPOINTS
from edgepipe.planner.timeouts import GLOO_TIMEOUT_S

#: seconds a recovering worker whose training thread failed waits for the coordinator's
#: abort (a peer's death reaches the data plane first) before it fails itself
ERROR_ABORT_WAIT_S = 10.0


@dataclass(frozen=True)
class WorkerOptions:
    """What to run; the same for every rank."""

    plan: str
    steps: int
    out: str | None = None
    deterministic: bool = False
    dataset: str | None = None
    timeout_s: float = GLOO_TIMEOUT_S
    save_weights: bool = False
    generation: int = 0
    emulate: bool = False
    time_scale: float = 1.0
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: str | None = None
    heartbeat_s: float = 0.0
    #: with ``emulate``: devices that slow down mid-run (executor/core/emulation.py)
    emulate_slowdown: tuple[EmulatedSlowdown, ...] = ()
    recover: bool = False
    faults: str = ""
    #: the device this process runs, when it is not the plan's rank-th (a joining one,
    #: or a standby: ``--standby DEV``; the rank is then its place in the generation)
    device: str | None = None
    #: a re-admitted device's incarnation (executor/ft/control.py, "Re-admission")
    incarnation: int = 0
    #: ``HOST:PORT`` of a cross-host coordinator (executor/ft/coordinator.py) to join
    coordinator: str | None = None
    #: ``FILE[@STEP]``: a cluster file naming the one device this worker runs, which
    #: joins the run mid-training through the coordinator, not before STEP
    #: (executor/ft/joins.py, "Across hosts")
    join: str | None = None
    #: seconds a recovering worker whose training thread failed waits for the
    #: coordinator's abort before it fails itself (a cross-host coordinator sets its own
    #: detection bound: executor/ft/coordinator.py)
    abort_wait_s: float = ERROR_ABORT_WAIT_S
    #: committed checkpoints kept (executor/ft/checkpoint.py, "Retention")
    keep_checkpoints: int = KEEP_CHECKPOINTS
    #: receives posted ahead of their action per direction (None: the stage's warm-up;
    #: 0: each at its action), executor/core/receives.py
    recv_ahead: int | None = None


@dataclass(frozen=True)
class Endpoint:
    """Where this rank sits and where the store is."""

    rank: int
    world_size: int
    store_host: str
    store_port: int
    host_store: bool = False
    local_rank: int = 0
    local_world_size: int = 1
