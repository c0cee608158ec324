"""The cross-host coordinator: one process that owns a torchrun job's control plane.

``edgepipe coordinate plan.json --port P`` (or ``python -m executor.ft.coordinator``) hosts
the run's ``TCPStore`` on ``0.0.0.0:P`` and runs :class:`executor.ft.control.Coordinator`
over the plan's devices; every worker, started by torchrun on its own host with
``--coordinator HOST:P``, connects to that store instead of torchrun's agent store
(:func:`join`): its process groups rendezvous there under ``gen<g>/``, its heartbeat
thread beats there, and it publishes the address it reaches the coordinator from
(``ctl/host/<device>``), so every failure names the device's host. torchrun keeps only
its own job: starting one worker per host (its c10d rendezvous is separate). The store
outlives every worker (torch-and-solvers.md P5) and a worker never owns it
(reference/fault-tolerance.md §2, lesson 1).

What the coordinator does (docs/executor.md, "Across hosts"):

* **Heartbeats and hangs.** Every ``POLL_S`` it reads every member's heartbeat counter;
  a device silent for ``hang_timeout_s`` is declared dead. Across hosts there are no
  exit codes to read: a crashed process, a host whose processes were all killed and a
  host whose link went down (``ip link set ... down``) all show as silence, and all are
  declared within ``hang_timeout_s + POLL_S`` of the device's last beat. A device that
  has not beaten yet gets ``start_timeout_s`` (interpreter start and torch import on
  every host).
* **Abort and fencing.** On a failure it fences the dead device (``ctl/fenced/<dev>``:
  a worker that wakes up or whose link comes back sees it and exits) and aborts the
  generation; every other rank sees the abort within one heartbeat. The coordinator
  cannot kill a process on another host: fencing is what keeps a dead device out.
* **End.** A rank that finished publishes ``done/<rank>`` (in its generation's prefix)
  and is retired; when every rank is done the coordinator returns. After an abort it
  waits up to ``ABORT_GRACE_S`` until every other rank saw it, keeps the store up until
  they all stopped beating (at most ``LINGER_S``) and their processes are gone (at most
  ``EXIT_WAIT_S`` more), then raises :class:`RunStopped` naming the device, its host,
  the cause and how far the abort reached. A rank's beats stop when its interpreter
  begins to shut down, which can take over a second more under load; its process is
  gone when its connections to the store close, which the coordinator reads from its
  own sockets (the store's server runs in its process; Linux's ``/proc``): every
  connection from the address a surviving rank joined from, unless the dead device
  joined from that address too (its process may live on, hung or cut off: there the
  beats alone tell).
* **Recovery** (``--recover --steps N [--out DIR]``): the coordinator runs the in-process
  recovery of executor/ft/recovery.py (:class:`~executor.ft.recovery.Supervisor`, as the local
  launcher does) and publishes its settings as ``ctl/recover`` (steps, checkpoint
  interval, resume step, emulation time scale), so every joining worker runs as a
  recovering worker (commit vote, ring replicas, generations) with those settings
  (:func:`join` refuses a worker flag that contradicts them). A silent device is then
  fenced and left behind (the coordinator cannot kill it), the plan is repaired and the
  survivors replay from the last durable step. **No shared file system**: every
  generation's plan reaches the workers through the store (``gen<g>/plan``), and so do
  checkpoint parts (``--checkpoint-every K``: the Supervisor writes and commits them on
  this host, in ``--checkpoint-dir``, default ``DIR/checkpoints``) and the checkpoint to
  resume from (``--resume``: :func:`send_checkpoint`, each worker writes a copy under its
  ``--out``); metrics go to ``DIR/metrics.jsonl`` and a record of the re-planned plans
  to ``DIR/plans`` on this host (the default DIR is the plan's folder). The
  Supervisor's :class:`~executor.ft.slowdown.SlowdownWatch` reads every durable step's
  compute from the workers' metrics keys and the coordinator re-partitions off a device
  it declares slow: against the plan's prediction times S with ``--emulate
  --time-scale S`` (the workers' emulation), else against the prediction calibrated
  over each plan's first steps (real devices, one per host: executor/ft/slowdown.py,
  "Real devices"); ``--no-watch-slowdown`` turns it off.
* **Standbys** (``--recover --standbys N``; a plan of one stage on one device, whose
  replica no other stage can hold): the first N of the plan's standbys
  (:func:`planner.plan.replica_standbys`, best first) are members of every generation
  from the first on, as the local launcher's are (executor/launch.py, "Standbys"); the
  coordinator publishes them in ``ctl/recover`` and waits for each to beat like any
  worker. Each runs outside the torchrun job, on its own host, as ``python -m
  executor.worker plan.json --steps N --coordinator HOST:PORT --standby DEV``
  (:func:`join` refuses a device the coordinator does not expect, and a second process
  under a standby's id). The first holds the replica; when the serving device or its
  host is lost the Supervisor re-plans onto the survivors, the holder supplies the
  state and the next standby takes the replica over.
* **Its own loss** is the run's single point of failure (with ``--recover`` its host
  also holds the checkpoints): the workers' heartbeats fail,
  each stops at its next check with ``CoordinatorLost`` (or on its next store call),
  writing nothing, so the last committed checkpoint stays intact
  (:mod:`executor.ft.checkpoint` writes a checkpoint under a temporary name and renames it
  once complete).

Cost: one store round trip per member per poll.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from pathlib import Path

from edgepipe.executor.core import storeblob
from edgepipe.executor.core.layout import RankLayout, check_runnable
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.control import (
    Coordinator,
    Failure,
    connect_store,
    generation_store,
    host_store,
)
from edgepipe.executor.ft.joins import JoinRequests, read_join, register
from edgepipe.planner.cli.args import KEEP_CHECKPOINTS, add_coordinate_arguments
from edgepipe.planner.errors import EdgepipeError, InputError
from edgepipe.planner.plan import Plan, load_plan, replica_standbys
from edgepipe.planner.timeouts import HANG_TIMEOUT_S, HEARTBEAT_S, START_TIMEOUT_S
from torch.distributed import Store

#: seconds between two polls of the members' heartbeats
POLL_S = 0.05
#: seconds the other ranks get to see an abort
ABORT_GRACE_S = 2.0
#: after an abort the store stays up until every other rank stopped beating (exited),
#: at most this long: a rank blocked in a gloo op with the dead device leaves it only at
#: its gloo timeout (torch-and-solvers.md P6), and a store that vanished first would
#: tell it "coordinator lost" instead of the abort
LINGER_S = 90.0
#: heartbeat intervals of silence after which an aborted rank counts as exited
EXITED_BEATS = 4
#: once the aborted ranks stopped beating, at most this many seconds more until their
#: connections to the store close (their processes are gone; module docstring, "End")
EXIT_WAIT_S = 10.0
#: what :func:`host_of` says of a device that has not joined
UNKNOWN_HOST = "unknown host"
#: seconds between two reads of the store's connections while waiting for the exit
PEERS_POLL_S = 0.25
#: a TCP socket's state "established" in /proc/net/tcp (the kernel's TCP_ESTABLISHED)
_ESTABLISHED = "01"


class RunStopped(EdgepipeError):
    """The coordinator stopped the run: ``device`` on ``host`` failed (``cause``)."""

    def __init__(self, message: str, device: str, host: str, cause: str) -> None:
        self.device, self.host, self.cause = device, host, cause
        super().__init__(message)


@dataclass(frozen=True)
class Stopped:
    """What :func:`coordinate` returns for a run that finished: the generation, and
    the one-line reasons of the joins that were dropped (:mod:`executor.ft.joins`)."""

    generation: int
    join_failures: tuple[str, ...] = ()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ValueError names the form."""
    host, sep, port = text.rpartition(":")
    if not (host and sep and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{text!r} is not HOST:PORT, e.g. 198.18.0.1:29500")
    return host, int(port)


def local_address(host: str, port: int) -> str:
    """The address this machine reaches ``host`` from (the interface the route to it
    leaves by; no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return str(s.getsockname()[0])


def join(opts: WorkerOptions, endpoint: Endpoint, address: str
         ) -> tuple[WorkerOptions, Endpoint]:
    """A worker's side: the options and endpoint of a rank that joins the coordinator at
    ``address`` (``HOST:PORT``): the store is the coordinator's, the generation the one
    it opened, heartbeats on (``HEARTBEAT_S`` unless the options set one); publishes
    ``ctl/host/<device>``. Raises :class:`InputError` when the coordinator cannot be
    reached within the worker's timeout (``--timeout``)."""
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise InputError("--coordinator", "", str(exc)) from None
    plan = load_plan(opts.plan)
    joining, join_step = read_join(opts.join, plan) if opts.join else (None, None)
    standby = None if joining is not None else opts.device  # --standby DEV
    device = (joining["devices"][0]["id"] if joining is not None
              else standby or RankLayout.from_plan(plan).ranks[endpoint.rank].device)
    try:
        store = connect_store(host, port, timeout_s=opts.timeout_s)
        store.wait(["ctl/generation"])
        generation = int(store.get("ctl/generation"))
        recover = (json.loads(store.get("ctl/recover")) if store.check(["ctl/recover"])
                   else None)
        if standby is not None:
            _check_standby(store, standby, recover)
        else:  # a standby's address is written once it holds its id (below)
            store.set(f"ctl/host/{device}", local_address(host, port))
    except InputError:
        raise
    except Exception as exc:  # the store client raises several types
        raise InputError("--coordinator", "", f"no coordinator at {address} "
                         f"({str(exc).splitlines()[0][:120]}); start `edgepipe coordinate` "
                         "there first") from None
    if joining is not None:  # a device that joins the run (executor/ft/joins.py)
        if recover is None:
            raise InputError("--join", "", "the coordinator does not recover (start it with "
                             "--recover): nothing can admit a joining device")
        opts = replace(opts, device=device,
                       incarnation=register(store, joining, opts.timeout_s, join_step))
    opts = replace(opts, generation=generation, heartbeat_s=opts.heartbeat_s or HEARTBEAT_S,
                   recover=opts.recover or recover is not None)
    if recover is not None:
        opts = _recovering(opts, recover, store)
    if standby is not None:  # every check passed: only now does it take the id
        _claim_standby(store, standby)
        store.set(f"ctl/host/{device}", local_address(host, port))
    endpoint = replace(endpoint, store_host=host, store_port=port, host_store=False)
    return opts, endpoint


def _check_standby(store: Store, device: str, settings: dict | None) -> None:
    """Refuse ``--standby device`` (one line) unless the coordinator recovers and expects
    ``device`` among its standbys (``ctl/recover``)."""
    expected = settings["standbys"] if settings is not None else []
    if not expected:
        how = ("does not recover" if settings is None else "runs no standbys")
        raise InputError("--standby", "", f"the coordinator {how}: start it with "
                         "--recover --standbys N to keep a one-device plan's replica on "
                         "standbys")
    if device not in expected:
        raise InputError("--standby", "", f"device {device!r} is not a standby of this "
                         f"run: the coordinator "
                         f"expects {', '.join(expected)} (its --standbys N takes the plan's "
                         "first N idle devices that can hold the replica, best first); "
                         "start this worker with one of them")


def _claim_standby(store: Store, device: str) -> None:
    """Take the standby id ``device`` once every other check passed (a start refused for
    a flag does not lock its corrected restart out); refuse (one line) a second process
    under it (``ctl/standby/<device>`` counts them: one store round trip)."""
    if store.add(f"ctl/standby/{device}", 1) > 1:
        raise InputError("--standby", "", f"device {device!r} already runs as a standby "
                         "of this run: a "
                         "second process under its id is refused while the first lives; "
                         "stop that one (a standby lost mid-run comes back with --join "
                         "FILE once the coordinator has declared it lost)")


def standbys_of(plan: Plan, wanted: int, exactly: bool = True) -> tuple[str, ...]:
    """The ``wanted`` standbys of ``plan`` (the first of :func:`replica_standbys`, best
    first; 0: none). Raises :class:`InputError` (one line naming the fix) for a plan that
    has no standbys, or (``exactly``: across hosts, where each is started by hand) fewer
    than ``wanted``; without ``exactly`` (the local launcher's "at most N") it gives
    those there are. O(devices log devices)."""
    if wanted == 0:
        return ()
    available = replica_standbys(plan)
    stages = plan.partition.stages
    if not available:
        if len(stages) != 1 or len(stages[0].devices) != 1:
            why = (f"the plan runs {len(plan.partition.used_devices())} devices, which hold "
                   "each other's replicas (a data-parallel peer or the next stage); "
                   "standbys serve a plan of one stage on one device")
        elif plan.problem.config.replication_interval == 0:
            why = "the plan does not replicate (replication_interval 0)"
        else:
            why = ("no idle device of the plan's cluster can hold its replica (the plan's "
                   "assumptions say why)")
        raise InputError("--standbys", "", f"{why}; omit --standbys")
    if exactly and wanted > len(available):
        raise InputError("--standbys", "", f"{wanted}, but only {len(available)} idle "
                         f"device(s) "
                         f"can hold the replica ({', '.join(available)}); give at most "
                         f"{len(available)}")
    return available[:wanted]


def _recovering(opts: WorkerOptions, settings: dict, store: Store) -> WorkerOptions:
    """A worker's options under a recovering coordinator's ``settings`` (``ctl/recover``,
    :func:`supervise`): the coordinator's checkpoint interval, its checkpoint to resume
    from received through the store into ``<out>/resumed`` (a temporary folder without
    ``--out``), and an abort wait of its start + hang time-outs (a peer that never
    started fails the first rendezvous after the worker's ``--timeout``, which may be
    shorter than the coordinator's start time-out: the abort then still comes). Raises
    :class:`InputError` for a flag that contradicts the coordinator (its one-line
    message says which flag goes where)."""
    worker_scale = opts.time_scale if opts.emulate else None
    coordinator_scale = settings["time_scale"] if settings["emulate"] else None
    if opts.steps != settings["steps"]:
        raise InputError("--steps", "", f"{opts.steps} but the coordinator runs "
                         f"--steps {settings['steps']}; give both the same")
    if worker_scale != coordinator_scale:
        def what(scale: float | None) -> str:
            return f"--emulate --time-scale {scale:g}" if scale is not None else "no --emulate"
        raise InputError("--emulate", "", f"this worker runs {what(worker_scale)} but the "
                         f"coordinator {what(coordinator_scale)} (its slowdown watch "
                         "predicts from it); give both the same")
    if opts.checkpoint_every not in (0, settings["checkpoint_every"]):
        raise InputError("--checkpoint-every", "", f"{opts.checkpoint_every} but the "
                         f"coordinator checkpoints every {settings['checkpoint_every']} "
                         "step(s) (0: never); a recovering run across hosts checkpoints "
                         "on the coordinator's host: give --checkpoint-every to "
                         "`edgepipe coordinate` only")
    for flag, value in (("--checkpoint-dir", opts.checkpoint_dir), ("--resume", opts.resume)):
        if value:
            raise InputError(flag, "", "a recovering run across hosts keeps its "
                             "checkpoints on the coordinator's host: give "
                             f"{flag} to `edgepipe coordinate`, not to the workers")
    # a peer that never came up fails this rank's first rendezvous after --timeout,
    # but the coordinator declares it only after its start time-out: wait for that abort
    # as long as the coordinator may take to detect any loss
    abort_wait_s = max(opts.abort_wait_s,
                       settings["start_timeout_s"] + settings["hang_timeout_s"])
    resume = None
    if settings["resume"]:
        manifest = json.loads(store.get("ctl/resume"))
        root = (Path(opts.out) / "resumed" if opts.out
                else Path(tempfile.mkdtemp(prefix="edgepipe-resumed-")))
        resume = str(receive_checkpoint(store, manifest, root))
    return replace(opts, checkpoint_every=settings["checkpoint_every"], resume=resume,
                   abort_wait_s=abort_wait_s)


def send_checkpoint(store: Store, ckpt: Path) -> None:
    """Publish every file of the committed checkpoint ``ckpt`` (either layout of
    :mod:`executor.ft.checkpoint`) as ``ctl/resume/<i>`` and its manifest as
    ``ctl/resume``."""
    files = sorted(f for f in ckpt.rglob("*") if f.is_file())
    for i, f in enumerate(files):
        storeblob.put(store, f"ctl/resume/{i}", f.read_bytes())
    store.set("ctl/resume", json.dumps(
        {"name": ckpt.name, "files": [str(f.relative_to(ckpt)) for f in files]}))


def receive_checkpoint(store: Store, manifest: dict, root: Path) -> Path:
    """Write the checkpoint :func:`send_checkpoint` published into ``root/<name>``
    (files under temporary names first, the commit marker last); returns it."""
    folder = root / manifest["name"]
    for i, name in sorted(enumerate(manifest["files"]), key=lambda f: f[1] == checkpoint.MARKER):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(storeblob.get(store, f"ctl/resume/{i}"))
        tmp.replace(path)
    return folder


def host_of(store: Store, device: str) -> str:
    """The address ``device`` joined from, or :data:`UNKNOWN_HOST` before it joined."""
    key = f"ctl/host/{device}"
    return store.get(key).decode() if store.check([key]) else UNKNOWN_HOST


def coordinate(
    plan_path: str,
    store: Store,
    hang_timeout_s: float = HANG_TIMEOUT_S,
    start_timeout_s: float = START_TIMEOUT_S,
    on_failure: Callable[[Coordinator, list[Failure]], bool] | None = None,
) -> Stopped:
    """Run the control plane of ``plan_path``'s job on ``store`` (hosted by the caller)
    until every rank is done (module docstring). ``on_failure(coordinator, failures)``,
    when given, may handle the failures (return True: the run goes on); otherwise the
    generation is aborted and :class:`RunStopped` raised."""
    plan = load_plan(plan_path)
    check_runnable(plan)
    layout = RankLayout.from_plan(plan)
    coordinator = Coordinator(store, [r.device for r in layout.ranks], hang_timeout_s,
                              start_timeout_s=start_timeout_s)
    retired: set[int] = set()
    while True:
        gen = generation_store(store, coordinator.generation)
        for info in layout.ranks:
            if info.rank not in retired and gen.check([f"done/{info.rank}"]):
                coordinator.retire(info.device)
                retired.add(info.rank)
        if len(retired) == layout.world_size:
            return Stopped(coordinator.generation)
        failures = coordinator.poll()
        if failures and not (on_failure is not None and on_failure(coordinator, failures)):
            raise _stop(store, coordinator, layout, failures)
        time.sleep(POLL_S)


@dataclass(frozen=True)
class Checkpointing:
    """A recovering coordinator's checkpoint settings: commit one every ``every`` steps
    (0: never) into ``folder`` (on the coordinator's host; None: ``<out>/checkpoints``),
    and start from the checkpoint ``resume`` (a checkpoint or a folder of them;
    :func:`executor.ft.checkpoint.resolve`)."""

    every: int = 0
    folder: str | None = None
    resume: str | None = None
    #: committed checkpoints kept (executor/ft/checkpoint.py, "Retention")
    keep: int = KEEP_CHECKPOINTS


def supervise(
    plan_path: str,
    store: Store,
    steps: int,
    out: str | None = None,
    hang_timeout_s: float = HANG_TIMEOUT_S,
    start_timeout_s: float = START_TIMEOUT_S,
    deterministic: bool = False,
    checkpoints: Checkpointing = Checkpointing(),
    emulated_time_scale: float | None = None,
    standbys: int = 0,
    watch_slowdown: bool = True,
) -> Stopped:
    """Run ``plan_path``'s job for ``steps`` steps with in-process recovery on ``store``
    (module docstring, "Recovery"); returns once every step is durable and the workers
    left. ``checkpoints``: what to commit and resume from (module docstring,
    "Checkpoints"); ``emulated_time_scale``: the workers run ``--emulate`` at this time
    scale (None: they do not); ``watch_slowdown``: re-partition a device that stays
    slower than predicted (module docstring, "Recovery"); ``standbys``:
    how many standby workers of a one-device plan to expect (module docstring,
    "Standbys"; :func:`standbys_of`). Raises
    :class:`executor.ft.recovery.RecoveryFailed` when a failure cannot be recovered."""
    from edgepipe.executor.core.metrics import MetricsWriter
    from edgepipe.executor.ft.recovery import Supervisor
    from edgepipe.executor.ft.slowdown import SlowdownWatch

    plan = load_plan(plan_path)
    check_runnable(plan)
    layout = RankLayout.from_plan(plan)
    spares = standbys_of(plan, standbys)
    folder = Path(out) if out else Path(plan_path).resolve().parent
    folder.mkdir(parents=True, exist_ok=True)
    resume = 0
    if checkpoints.resume:
        ckpt = checkpoint.check_resume(plan, checkpoints.resume)
        resume = checkpoint.resume_step(ckpt)
        send_checkpoint(store, ckpt)
    # before the generation: a joining worker reads both
    store.set("ctl/recover", json.dumps({
        "steps": steps, "checkpoint_every": checkpoints.every, "resume": resume,
        "emulate": emulated_time_scale is not None, "time_scale": emulated_time_scale,
        "standbys": list(spares), "start_timeout_s": start_timeout_s,
        "hang_timeout_s": hang_timeout_s,
    }))
    coordinator = Coordinator(store, [r.device for r in layout.ranks] + list(spares),
                              hang_timeout_s, start_timeout_s=start_timeout_s)
    supervisor = Supervisor(
        store, coordinator, plan, plan_path, steps, resume=resume,
        checkpoint_every=checkpoints.every,
        checkpoint_dir=Path(checkpoints.folder or folder / "checkpoints"),
        keep_checkpoints=checkpoints.keep,
        writer=(MetricsWriter(folder, layout, deterministic, append=resume > 0)
                if out else None),
        plans_dir=folder / "plans",
        kill=lambda device: None,  # on another host: fencing keeps it out
        slowdown=SlowdownWatch(emulated_time_scale) if watch_slowdown else None,
    )
    joins = JoinRequests(store, supervisor, plan, start_timeout_s)
    try:
        while not supervisor.poll():
            if failures := coordinator.poll():
                supervisor.recover(failures)
            elif supervisor.slowdown is not None and (slowed := supervisor.slowdown.take()):
                # fed by the workers' per-step compute (metrics/<t>/<rank> in the store):
                # slow, not failed, re-partition at the next step boundary
                supervisor.repartition("slow", ",".join(slowed), slowed=slowed)
            else:
                joins.poll()  # devices that register to join (executor/ft/joins.py)
            time.sleep(POLL_S)
        _linger(coordinator, list(supervisor.gen.members))
    finally:
        if supervisor.writer is not None:
            supervisor.writer.close()
    return Stopped(supervisor.gen.number, tuple(str(f) for f in joins.failures))


def _stop(store: Store, coordinator: Coordinator, layout: RankLayout,
          failures: list[Failure]) -> RunStopped:
    """Fence the first dead device and abort; wait (at most ``ABORT_GRACE_S``) until
    every other member saw the abort, then for the members' exit (:func:`_linger`; not
    from the hosts of any of ``failures``, whose processes may live on); the error to
    raise, naming the first."""
    failure = failures[0]
    coordinator.abort(f"{failure.device} {failure.cause}", fence=[failure.device])
    others = [r.device for r in layout.ranks if r.device != failure.device]
    deadline = time.monotonic() + ABORT_GRACE_S
    seen = coordinator.abort_seen(others)
    while time.monotonic() < deadline and len(seen) < len(others):
        time.sleep(POLL_S)
        seen = coordinator.abort_seen(others)
    _linger(coordinator, others, own_hosts(store, others, [f.device for f in failures]))
    info = next(r for r in layout.ranks if r.device == failure.device)
    host = host_of(store, failure.device)
    missed = sorted(set(others) - set(seen))
    reach = f"the abort reached {len(seen)} of {len(others)} other worker(s)" + (
        f" (not {', '.join(missed)})" if missed else "")
    return RunStopped(
        f"device {failure.device!r} (rank {info.rank}, stage {info.stage}) on host {host} "
        f"went silent: no heartbeat for {failure.silent_s:.2f} s (hang timeout "
        f"{coordinator.hang_timeout_s:g} s; a crash, a killed host or a lost link); "
        f"declared dead and fenced, generation {coordinator.generation} aborted; {reach}",
        failure.device, host, failure.cause,
    )


def own_hosts(store: Store, devices: list[str], elsewhere: list[str]) -> set[str]:
    """The addresses ``devices`` joined from (``ctl/host``) that none of ``elsewhere``
    (devices not waited for: one declared dead may live on, hung or cut off) joined
    from. Two store round trips per device of either (:func:`host_of`)."""
    taken = {host_of(store, d) for d in elsewhere} | {UNKNOWN_HOST}
    return {host_of(store, d) for d in devices} - taken


def _linger(coordinator: Coordinator, devices: list[str],
            hosts: AbstractSet[str] = frozenset()) -> None:
    """Return once none of ``devices`` has beaten for ``EXITED_BEATS`` heartbeat
    intervals and no connection from any of ``hosts`` (addresses) to the store is open
    (their processes are gone; waited for at most ``EXIT_WAIT_S`` after the beats
    stopped), or after ``LINGER_S``. Each poll: one store round trip per device, and
    once they are quiet a read of this process's sockets (:func:`store_peers`, about
    10 CPU ms) at most every ``PEERS_POLL_S``."""
    quiet_s = EXITED_BEATS * HEARTBEAT_S
    port = getattr(coordinator.store, "port", None)  # a TCPStore served by this process
    last = {d: (coordinator.beats(d), time.monotonic()) for d in devices}
    deadline = time.monotonic() + LINGER_S
    quiet_since: float | None = None
    read_at = -PEERS_POLL_S
    while time.monotonic() < deadline:
        now = time.monotonic()
        for d in devices:
            count = coordinator.beats(d)
            if count != last[d][0]:
                last[d] = (count, now)
        if not all(now - since >= quiet_s for _, since in last.values()):
            quiet_since = None
        else:
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= EXIT_WAIT_S or not hosts or not port:
                return
            if now - read_at >= PEERS_POLL_S:
                read_at = now
                peers = store_peers(port)
                if peers is None or hosts.isdisjoint(peers):
                    return
        time.sleep(POLL_S)


def _endpoint(field: str) -> tuple[str, int]:
    """An address of ``/proc/net/tcp`` or ``tcp6`` (``0100007F:1F90``: each 32-bit word
    of the address in the host's byte order, the port in hexadecimal) as (address,
    port); an IPv4 address mapped into IPv6 in its IPv4 form."""
    address, port = field.split(":")
    raw = b"".join(struct.pack("=I", int(address[i:i + 8], 16))
                   for i in range(0, len(address), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def store_peers(port: int) -> list[str] | None:
    """The addresses from which the store this process serves on ``port`` has
    connections open: the peers of this process's established TCP sockets whose local
    port is ``port``, less the store's own client in this process. None where the
    sockets cannot be read (no Linux ``/proc``). O(TCP sockets of this network
    namespace + descriptors of this process)."""
    try:
        inodes = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # closed since the listing
                link = os.readlink(f"/proc/self/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:["):-1])
        sockets = []
        for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
            if table.endswith("6") and not os.path.exists(table):
                continue  # IPv6 disabled: no table, no IPv6 connection
            with open(table) as rows:
                next(rows)  # the header
                for row in rows:
                    fields = row.split()
                    if fields[3] == _ESTABLISHED and fields[9] in inodes:
                        sockets.append((_endpoint(fields[1]), _endpoint(fields[2])))
    except OSError:
        return None
    own_clients = {local for local, remote in sockets if remote[1] == port}
    return [remote[0] for local, remote in sockets
            if local[1] == port and remote not in own_clients]


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m executor.ft.coordinator``: those of ``edgepipe coordinate``."""
    p = argparse.ArgumentParser(prog="python -m executor.ft.coordinator",
                                description=__doc__.split("\n\n")[0])
    add_coordinate_arguments(p)
    return p


def run(args: argparse.Namespace) -> Stopped:
    """Host the store and coordinate (the command's body)."""
    if not args.hang_timeout > 2 * HEARTBEAT_S:
        raise InputError("--hang-timeout", "", f"{args.hang_timeout:g} s must exceed twice "
                         f"the workers' heartbeat ({HEARTBEAT_S:g} s)")
    if args.recover and not (args.steps and args.steps > 0):
        raise InputError("--steps", "", "--recover needs the workers' --steps (at least 1)")
    if args.checkpoint_every < 0:
        raise InputError("--checkpoint-every", "", f"must be >= 0, got {args.checkpoint_every}")
    if args.time_scale is not None and not args.emulate:
        raise InputError("--time-scale", "", f"{args.time_scale:g} stretches emulated times, "
                         "but the workers do not emulate here; add --emulate or drop "
                         "--time-scale")
    scale = 1.0 if args.time_scale is None else args.time_scale
    if not scale > 0:
        raise InputError("--time-scale", "", f"must be positive, got {scale:g}")
    needs = [f for f, v in (("--checkpoint-every", args.checkpoint_every),
                            ("--checkpoint-dir", args.checkpoint_dir),
                            ("--resume", args.resume), ("--emulate", args.emulate)) if v]
    if args.watch_slowdown is not None and not args.recover:
        flag = "--watch-slowdown" if args.watch_slowdown else "--no-watch-slowdown"
        raise InputError(flag, "", "only with --recover (re-partitioning a slowed device "
                         "is part of in-process recovery); drop it")
    if needs and not args.recover:
        raise InputError(needs[0], "", "only with --recover (without it the workers "
                         "checkpoint and emulate themselves: give it to them)")
    if args.standbys and not args.recover:
        raise InputError("--standbys", "", "only with --recover (a "
                         "standby holds the replica a recovery restores)")
    plan = load_plan(args.plan)  # refuse a bad plan (or checkpoint) before binding the port
    if args.resume:
        checkpoint.check_resume(plan, args.resume)
    standbys_of(plan, args.standbys)
    try:
        store = host_store(args.port)
    except Exception as exc:  # the store raises DistNetworkError / RuntimeError
        raise InputError("--port", "", f"cannot host the store on port {args.port} "
                         f"({str(exc).splitlines()[0][:120]}); choose a free port") from None
    if args.recover:
        return supervise(args.plan, store, args.steps, args.out, args.hang_timeout,
                         args.start_timeout, args.deterministic,
                         Checkpointing(args.checkpoint_every, args.checkpoint_dir, args.resume,
                                       args.keep_checkpoints),
                         scale if args.emulate else None, args.standbys,
                         args.watch_slowdown is not False)
    return coordinate(args.plan, store, args.hang_timeout, args.start_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        done = run(args)
    except EdgepipeError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    for reason in done.join_failures:
        print(f"warning: {reason}", file=sys.stderr)
    print(f"every worker finished (generation {done.generation})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
