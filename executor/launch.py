"""The local launcher: one process per plan device on this machine.

:func:`launch` checks the plan before any process starts (schema and decision on load;
a build spec; memory within every device's usable memory; the built blocks against the
profile; the dataset), then hosts the run's ``TCPStore`` in this process (the control
plane: workers never own it, so it outlives any of them), starts one worker per plan
device (:func:`executor.worker.spawned`; forked from a forkserver that has imported torch
once, :mod:`executor.core.starting`; a placement with its own entry is spawned) and
polls their exit codes every ``POLL_S``. When a child dies with a non-zero status, every
other child is stopped (SIGTERM, then SIGKILL after ``GRACE_S``) and :class:`RunFailed`
names the dead device. Every child is reaped on return, on error and on Ctrl-C.

The culprit of a failure is the first child seen dead; when several are seen dead at
once, one killed by a signal or one that died without publishing an error (its peers
publish "connection closed" errors) is named.

**Control plane** (:mod:`executor.ft.control`; docs/executor.md, "Failure detection"): the
launcher owns the run's :class:`~executor.ft.control.Coordinator` on its store (members:
the plan's devices; ``exited``: the children with a non-zero exit status) and opens its
generation before any child starts; every child beats every ``heartbeat_s`` and checks
before every action. Each poll the launcher asks the coordinator for failures: a crash
(exit status, within one poll) or a hang (no heartbeat for ``hang_timeout_s``; a child
that has not beaten yet gets ``START_TIMEOUT_S`` for its start-up). On a failure it
aborts the generation and fences the device, waits (at most ``ABORT_GRACE_S``) until
every other child has seen the abort, SIGKILLs that device's process (which also ends a
SIGSTOPped one), gives the others ``ABORT_GRACE_S`` to stop at their next check or on
the dead peer's closed connection, then stops the rest (a rank blocked in a gloo op
cannot see the abort, P6), and raises :class:`RunFailed` naming the device, the cause
and the time to detect. A child that has published ``done/<rank>`` (its work is over;
the interpreter's shutdown can outlast a hang timeout) or exited 0 is no longer watched
for hangs, only for its exit status. ``hang_timeout_s=None`` runs without a control
plane (exit codes only).

**Standbys** (a recovering run of a plan of one stage on one device, whose replica no
other stage can hold; :func:`planner.plan.replica_standbys`): the launcher also starts a
:class:`~executor.ft.generation.RecoveringWorker` for each idle device of the cluster that can
hold the replica (``standbys`` caps how many, best first). Each is a member of every
generation (a spare: it beats, acknowledges every replication point), the first holds
the replica; when the serving device is lost the re-plan runs on the survivors and the
holder supplies the state; when the holder is lost the next standby takes the replica
over (none left: the run goes on unreplicated, the recovery event's ``warning`` says
so). ``ranks.json`` gains a line (rank ``null``, ``"role": "standby"``) per standby.

**Joins** (``joins``, ``edgepipe run --emulate-join FILE@STEP``; a recovering run only):
:class:`executor.ft.joins.JoinSchedule` starts each joining device's process (a
:class:`~executor.ft.generation.RecoveringWorker` with ``WorkerOptions.device``) and has the
Supervisor admit it at the step boundary; the launcher then tracks the device's newest
process (a rejoined device's old one is gone), and ``ranks.json`` gains a line (rank
``null``) per joining process. A join that fails (its process exits or stays silent
before it is admitted, or a rejoining device still serves) is dropped with one
``join_failed`` line in ``metrics.jsonl`` (:attr:`RunResult.join_failures`) and the run
goes on.

**State** (with ``out``): ``status.json`` says ``running`` (with this process's pid)
from before the first child starts, then ``finished``, ``failed`` or ``stopped`` with
the reason (:mod:`planner.check.live`), so ``edgepipe report`` can tell a run still
going from one that died.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch.distributed as dist
from edgepipe.executor.core import data
from edgepipe.executor.core.layout import RankLayout, check_runnable
from edgepipe.executor.core.metrics import MetricsWriter, read_jsonl
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.core.stage import check_build
from edgepipe.executor.core.starting import process, start_deaf_to_ctrl_c, worker_context
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.checkpoint import check_resume
from edgepipe.executor.ft.control import Coordinator, Failure, generation_store
from edgepipe.executor.ft.coordinator import standbys_of
from edgepipe.executor.ft.faults import check as check_faults
from edgepipe.executor.ft.faults import parse as parse_faults
from edgepipe.executor.ft.joins import FAILED as JOIN_FAILED
from edgepipe.executor.ft.joins import FLAG, EmulatedJoin, JoinSchedule, check_joins
from edgepipe.executor.ft.recovery import Supervisor
from edgepipe.executor.ft.slowdown import SlowdownWatch
from edgepipe.executor.worker import spawned
from edgepipe.planner.check import live
from edgepipe.planner.errors import EdgepipeError, InputError
from edgepipe.planner.plan import Plan, load_plan, replica_standbys
from edgepipe.planner.timeouts import HANG_TIMEOUT_S, HEARTBEAT_S, START_TIMEOUT_S

__all__ = ["ABORT_GRACE_S", "GRACE_S", "POLL_S", "Placement", "RunFailed", "RunResult",
           "launch", "preflight", "recovers"]

#: seconds between two polls of the children's exit codes (and the control plane)
POLL_S = 0.02
#: seconds a SIGTERMed child gets before SIGKILL
GRACE_S = 2.0
#: seconds the other workers get to stop on their own after an abort
ABORT_GRACE_S = 1.0


class RunFailed(EdgepipeError):
    """A worker died or hung; ``device`` / ``rank`` name it, ``exitcode`` is its status
    (negative: killed by that signal; for a hang, the SIGKILL the launcher sent),
    ``cause`` is ``crash`` or ``hang``, ``detected_at`` the launcher's decision
    (monotonic s), ``aborted_at`` the abort (wall-clock s; None without a control plane)
    and ``abort_seen`` the wall-clock time at which each other device saw it."""

    def __init__(
        self, message: str, device: str, rank: int, exitcode: int, cause: str = "crash",
        detected_at: float = 0.0, aborted_at: float | None = None,
        abort_seen: dict[str, float] | None = None,
    ) -> None:
        self.device, self.rank, self.exitcode = device, rank, exitcode
        self.cause, self.detected_at = cause, detected_at
        self.aborted_at, self.abort_seen = aborted_at, abort_seen or {}
        super().__init__(message)


@dataclass(frozen=True)
class Placement:
    """Where the workers run: the store's host as they reach it, and each worker's process
    entry and arguments. The default runs plain processes on this machine
    (:func:`executor.worker.spawned`); the lab places each in its device's network
    namespace and cgroup (:mod:`executor.lab.launch`, docs/lab.md). ``mode`` is what
    ``status.json`` records of a run that is not emulated (planner/check/live.py)."""

    mode: ClassVar[str] = "real"
    #: whether its workers fork from the preloaded forkserver
    #: (:mod:`executor.core.starting`); the lab's join their cgroup and network namespace
    #: before torch loads (so torch's memory is charged to the device's cgroup) and are
    #: spawned
    preloaded: ClassVar[bool] = True
    store_host: str = "127.0.0.1"

    def entry(self, opts: WorkerOptions, endpoint: Endpoint) -> tuple[
        Callable[..., None], tuple[Any, ...]
    ]:
        return spawned, (opts, endpoint)


@dataclass
class RunResult:
    """A finished run: its directory, its step lines and its events (recovery lines of
    ``metrics.jsonl``, :mod:`executor.ft.recovery`)."""

    #: None for a run without ``--out``
    out_dir: Path | None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: the ``join_failed`` lines: joins dropped while the run went on (executor/ft/joins.py)
    join_failures: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def read(cls, out: Path | None) -> RunResult:
        lines = read_jsonl(out / "metrics.jsonl") if out is not None else []
        return cls(out, [m for m in lines if "type" not in m],
                   [m for m in lines if m.get("type") == "recovery"],
                   [m for m in lines if m.get("type") == JOIN_FAILED])

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics]


def preflight(opts: WorkerOptions) -> RankLayout:
    """Every check that can refuse the run before a process starts; returns the layout."""
    if opts.steps < 1:
        raise InputError("--steps", "", f"must be at least 1, got {opts.steps}")
    plan = load_plan(opts.plan)
    check_runnable(plan)
    model = plan.problem.model
    assert model.build is not None
    check_build(model)
    name = opts.dataset or data.default_dataset(model.build)
    if name is None:
        raise InputError(
            "--dataset", "", f"model {model.build.describe()} has no built-in task; give "
            "--dataset MODULE:CALLABLE returning a torch Dataset"
        )
    rows = data.Rows(data.load_dataset(name, model.build, plan.problem.config.seed))
    data.step_indices(0, plan.partition.micro_batch_size * plan.partition.num_micro_batches,
                      rows.size, 0)
    if opts.resume:
        check_resume(plan, opts.resume)
    return RankLayout.from_plan(plan)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def recovers(opts: WorkerOptions, plan: Plan, hang_timeout_s: float | None,
             recover: bool | None) -> bool:
    """Whether a run recovers in-process from a lost device (``recover=None``: when the
    control plane is on and the plan replicates, ``replication_interval > 0``).
    Raises :class:`InputError` for ``recover=True`` with what recovery cannot do yet."""
    if recover is False:
        return False
    why = None
    if hang_timeout_s is None:
        why = "the control plane is off (--hang-timeout)"
    elif plan.problem.config.replication_interval == 0 and recover is None:
        why = "the plan does not replicate (replication_interval 0)"
    if why is not None and recover:
        raise InputError("--recover", "", f"in-process recovery is off: {why}; run with "
                         "--no-recover (stop on the first failure)")
    return why is None


def launch(
    opts: WorkerOptions,
    on_start: Callable[[list[dict[str, Any]]], None] | None = None,
    hang_timeout_s: float | None = HANG_TIMEOUT_S,
    heartbeat_s: float = HEARTBEAT_S,
    recover: bool | None = None,
    joins: Sequence[EmulatedJoin] = (),
    standbys: int | None = None,
    join_timeout_s: float | None = None,
    watch_slowdown: bool | None = None,
    placement: Placement = Placement(),
) -> RunResult:
    """Run the plan of ``opts`` here, one process per plan device (module docstring).

    ``on_start(ranks)`` is called with the ``ranks.json`` entries once every child has
    started. ``hang_timeout_s`` (None: no control plane) must exceed twice
    ``heartbeat_s``. ``recover`` (:func:`recovers`): recover from a lost or hung device
    in-process (:mod:`executor.ft.recovery`) instead of stopping. ``joins``: devices that
    join mid-run (module docstring, "Joins"; needs recovery); ``join_timeout_s``: how
    long a joining process may take to beat (default: the start time-out,
    max(``START_TIMEOUT_S``, the gloo timeout)), or its join is dropped. Raises
    :class:`RunFailed` when a worker dies or hangs (without recovery),
    :class:`~executor.ft.recovery.RecoveryFailed` when recovery is impossible, any other
    :class:`~planner.errors.EdgepipeError` when the plan is refused. ``standbys``: at
    most this many standby processes for a one-device plan (module docstring, "Standbys";
    None: one per idle device that can hold its replica, 0: none; 1 or more in a run that
    does not recover is an :class:`InputError`). ``watch_slowdown`` (a recovering run):
    re-partition devices that stay slower than the plan predicts
    (:mod:`executor.ft.slowdown`); None: only when emulating, whose devices run at the
    plan's budgets (this run's processes share this machine, so without emulation
    their times measure its scheduling, not devices); True without emulation: the
    predictions are calibrated over the plan's first steps ("Real devices").
    ``placement``: where the workers run (:class:`Placement`; the lab's, docs/lab.md).

    Steps: check the options and the plan (:func:`_check_heartbeat`, :func:`preflight`,
    :func:`_spares`), prepare the run's folder, host the store, open the control plane
    (:func:`_control_plane`), set up the recovery (:func:`_supervisor`,
    :func:`_join_schedule`), start the children (:class:`_Children`) and watch or
    supervise them until the end; every child is reaped on the way out.
    """
    _check_heartbeat(hang_timeout_s, heartbeat_s)
    layout = preflight(opts)
    plan = load_plan(opts.plan)
    recovering = recovers(opts, plan, hang_timeout_s, recover)
    spares = _spares(opts, plan, recovering, joins, standbys, watch_slowdown)
    check_faults(opts.faults, [*plan.partition.used_devices(), *spares,
                               *(d for join in joins for d in join.devices)],
                 opts.steps, recovering)  # as the CLI's --inject
    out = _run_folder(opts)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=opts.timeout_s),
    )
    #: each device's newest process (a rejoined device's replaces its old one)
    current: dict[str, Any] = {}
    coordinator = None
    if hang_timeout_s is not None:
        coordinator, opts = _control_plane(store, opts, layout, spares, hang_timeout_s,
                                           heartbeat_s, recovering, current)
    children = _Children(opts, layout, store.port, out, current, placement)
    supervisor = scratch = schedule = None
    if recovering:
        assert coordinator is not None
        watched = opts.emulate if watch_slowdown is None else watch_slowdown
        supervisor, scratch = _supervisor(store, coordinator, plan, opts, layout, out,
                                          watched, children)
        if joins:
            schedule = _join_schedule(joins, supervisor, children, opts, join_timeout_s)
    if out is not None:
        live.write_state(out, "running", opts.steps,
                         mode="emulated" if opts.emulate else placement.mode)
    try:
        children.start(spares)
        if on_start is not None:
            on_start(children.ranks)
        if supervisor is not None:
            assert coordinator is not None
            _supervise(current, supervisor, coordinator, opts.timeout_s, schedule)
        else:
            _watch(children.procs, layout, generation_store(store, opts.generation),
                   coordinator)
    except BaseException as exc:
        if out is not None:
            live.write_state(out, *_ended(exc, opts.steps))
        raise
    finally:
        _stop(children.procs)
        if supervisor is not None and supervisor.writer is not None:
            supervisor.writer.close()
        if scratch is not None:
            scratch.cleanup()
    if out is not None:
        live.write_state(out, "finished", opts.steps)
    return RunResult.read(out)


def _ended(exc: BaseException, steps: int) -> tuple[str, int, str]:
    """The ``status.json`` state of a run that ``exc`` ended (planner/check/live.py)."""
    if isinstance(exc, KeyboardInterrupt):
        return "stopped", steps, "interrupted (Ctrl-C or SIGINT)"
    return "failed", steps, (str(exc).splitlines() or [type(exc).__name__])[0]


def _check_heartbeat(hang_timeout_s: float | None, heartbeat_s: float) -> None:
    """Refuse a hang timeout a live device could reach between two beats."""
    if hang_timeout_s is not None and not hang_timeout_s > 2 * heartbeat_s > 0:
        raise InputError(
            "--hang-timeout", "",
            f"{hang_timeout_s:g} s must exceed twice the heartbeat interval "
            f"({heartbeat_s:g} s), or a live device could be declared hung; raise "
            "--hang-timeout or lower --heartbeat",
        )


def _spares(opts: WorkerOptions, plan: Plan, recovering: bool, joins: Sequence[EmulatedJoin],
            standbys: int | None, watch_slowdown: bool | None) -> tuple[str, ...]:
    """Refuse what only a recovering run does (watching for slowdowns, standbys, joins)
    in one that does not, check the joins; the standby devices to start."""
    if watch_slowdown and not recovering:
        raise InputError("--watch-slowdown", "", "re-partitioning a slowed device is part "
                         "of in-process recovery, which this run does not do (--no-recover, "
                         "no control plane or replication_interval 0); drop --watch-slowdown")
    if standbys and not recovering:
        raise InputError("--standbys", str(standbys), "standby processes hold a one-device "
                         "plan's replica for in-process recovery, which this run does not "
                         "do (--no-recover, no control plane or replication_interval 0); "
                         "drop --standbys")
    spares = (() if not recovering else replica_standbys(plan) if standbys is None
              else standbys_of(plan, standbys, exactly=False))
    if joins:
        if not recovering:
            raise InputError(FLAG, "", "a device can join only a run that recovers "
                             "in-process (control plane on, the plan replicating, no "
                             "--no-recover)")
        check_joins(plan, joins, opts.steps, parse_faults(opts.faults))
    return tuple(spares)


def _run_folder(opts: WorkerOptions) -> Path | None:
    """The run's folder (created, holding a copy of the plan), None without ``--out``."""
    out = Path(opts.out) if opts.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if not (out / "plan.json").exists() or not (out / "plan.json").samefile(opts.plan):
            shutil.copyfile(opts.plan, out / "plan.json")
    return out


def _control_plane(
    store: dist.TCPStore, opts: WorkerOptions, layout: RankLayout, spares: Sequence[str],
    hang_timeout_s: float, heartbeat_s: float, recovering: bool, current: dict[str, Any],
) -> tuple[Coordinator, WorkerOptions]:
    """The run's :class:`Coordinator` over the plan's devices and the standbys (a device
    whose newest process in ``current`` exited non-zero has crashed), its generation
    opened; and the options every child runs with under it."""
    coordinator = Coordinator(
        store, [i.device for i in layout.ranks] + list(spares), hang_timeout_s,
        exited=lambda: [d for d, p in current.items() if p.exitcode not in (None, 0)],
        start_timeout_s=max(START_TIMEOUT_S, opts.timeout_s),
    )
    return coordinator, replace(opts, generation=coordinator.generation,
                                heartbeat_s=heartbeat_s, recover=recovering)


class _Children:
    """The run's processes: one per plan rank, then standbys and joining devices
    (``procs``, in start order; ``current``: each device's newest process) and the
    ``ranks.json`` lines (``ranks``) that name them."""

    def __init__(self, opts: WorkerOptions, layout: RankLayout, port: int, out: Path | None,
                 current: dict[str, Any], placement: Placement) -> None:
        self.opts, self.layout, self.port, self.out = opts, layout, port, out
        self.placement = placement
        self.ctx = (worker_context() if placement.preloaded
                    else multiprocessing.get_context("spawn"))
        self.procs: list[Any] = []
        self.current = current
        self.ranks: list[dict[str, Any]] = []

    def _write_ranks(self) -> None:
        if self.out is not None:
            (self.out / "ranks.json").write_text(json.dumps(self.ranks, indent=1) + "\n")

    def start(self, spares: Sequence[str]) -> None:
        """Start one process per plan rank, then one per standby (``spares``)."""
        layout = self.layout
        for info in layout.ranks:
            endpoint = Endpoint(info.rank, layout.world_size, self.placement.store_host,
                                self.port, local_rank=info.rank,
                                local_world_size=layout.world_size)
            target, args = self.placement.entry(self.opts, endpoint)
            proc = process(self.ctx, target, args, f"edgepipe-{info.device}")
            start_deaf_to_ctrl_c(proc)
            self.procs.append(proc)
            self.current[info.device] = proc
        for device in spares:
            self.spawn(device, 0, "standby")
        self.ranks[:0] = [
            {"rank": i.rank, "device": i.device, "stage": i.stage, "pid": p.pid}
            for i, p in zip(layout.ranks, self.procs[:layout.world_size], strict=True)
        ]
        self._write_ranks()

    def spawn(self, device: str, incarnation: int, role: str = "join") -> Any:
        """Start a recovering worker for ``device`` outside the plan's ranks (a joining
        device, or a standby); returns its process."""
        n = len(self.procs)
        endpoint = Endpoint(n, self.layout.world_size, "127.0.0.1", self.port,
                            local_rank=n, local_world_size=n + 1)
        proc = process(self.ctx, spawned,
                       (replace(self.opts, device=device, incarnation=incarnation), endpoint),
                       f"edgepipe-{device}-{role}")
        start_deaf_to_ctrl_c(proc)
        self.procs.append(proc)
        self.current[device] = proc
        line = {"rank": None, "device": device, "stage": None, "pid": proc.pid,
                "incarnation": incarnation}
        self.ranks.append(line if role == "join" else {**line, "role": role})
        self._write_ranks()
        return proc

    def kill(self, device: str) -> None:
        """SIGKILL ``device``'s newest process (which also ends a SIGSTOPped one)."""
        proc = self.current[device]
        if proc.exitcode is None:
            proc.kill()
            proc.join()

    def alive(self, device: str) -> bool:
        return bool(self.current[device].exitcode is None)


def _supervisor(
    store: dist.TCPStore, coordinator: Coordinator, plan: Plan, opts: WorkerOptions,
    layout: RankLayout, out: Path | None, watched: bool, children: _Children,
) -> tuple[Supervisor, tempfile.TemporaryDirectory[str]]:
    """The recovering run's :class:`Supervisor` (from the resumed checkpoint's step, if
    any) and the scratch folder of its re-planned plans when the run has no folder."""
    scratch = tempfile.TemporaryDirectory(prefix="edgepipe-plans-")
    resume = 0
    if opts.resume:
        resume = checkpoint.resume_step(check_resume(plan, opts.resume))
    supervisor = Supervisor(
        store, coordinator, plan, opts.plan, opts.steps, resume=resume,
        checkpoint_every=opts.checkpoint_every,
        checkpoint_dir=checkpoint.folder(opts.checkpoint_dir, opts.out),
        keep_checkpoints=opts.keep_checkpoints,
        writer=(MetricsWriter(out, layout, opts.deterministic, append=resume > 0)
                if out is not None else None),
        plans_dir=out / "plans" if out is not None else Path(scratch.name),
        kill=children.kill, alive=children.alive,
        # the plan predicts the emulated devices; a real local run's processes
        # share this machine, so they are watched only when asked (calibrated)
        slowdown=(SlowdownWatch(opts.time_scale if opts.emulate else None) if watched
                  else None),
    )
    return supervisor, scratch


def _join_schedule(joins: Sequence[EmulatedJoin], supervisor: Supervisor,
                   children: _Children, opts: WorkerOptions,
                   join_timeout_s: float | None) -> JoinSchedule:
    """The schedule that starts each joining device's process and has the supervisor
    admit it (module docstring, "Joins")."""
    return JoinSchedule(
        list(joins), supervisor, children.spawn,
        gone=lambda d: children.current[d].exitcode is not None,
        start_timeout_s=(max(START_TIMEOUT_S, opts.timeout_s)
                         if join_timeout_s is None else join_timeout_s),
    )


def _supervise(current: dict[str, Any], supervisor: Supervisor, coordinator: Coordinator,
               timeout_s: float, joins: JoinSchedule | None) -> None:
    """Poll a recovering run until its last step is durable, recovering from every
    failure (:meth:`Supervisor.recover`) and admitting every join; then wait (at most
    ``timeout_s``) for the last generation's members (``current``: device -> its newest
    process) to exit 0."""
    while not supervisor.poll():
        if failures := coordinator.poll():
            supervisor.recover(failures)
        elif supervisor.slowdown is not None and (slowed := supervisor.slowdown.take()):
            # slow, not failed: re-partition at the next step boundary (executor/ft/slowdown.py)
            supervisor.repartition("slow", ",".join(slowed), slowed=slowed)
        elif joins is not None:
            joins.poll()
        time.sleep(POLL_S)
    deadline = time.monotonic() + timeout_s
    for device in supervisor.gen.members:
        current[device].join(max(0.0, deadline - time.monotonic()))
    failed = [d for d in supervisor.gen.members if current[d].exitcode != 0]
    if failed:
        raise EdgepipeError(
            f"every step is durable but device(s) {', '.join(failed)} did not exit cleanly "
            f"within {timeout_s:g} s"
        )


def _error_of(store: dist.Store, rank: int) -> str | None:
    key = f"error/{rank}"
    return store.get(key).decode() if store.check([key]) else None


def _watch(
    procs: list, layout: RankLayout, store: dist.Store, coordinator: Coordinator | None
) -> None:
    """Poll until every child exited 0, or raise :class:`RunFailed` for the first death
    (or, with a coordinator, the first hang)."""
    retired: set[int] = set()
    while True:
        codes = [p.exitcode for p in procs]
        if all(c == 0 for c in codes):
            return
        dead = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if coordinator is None or any(r in retired for r in dead):
            # without a control plane, or a rank that died after its work was done
            if dead:
                raise _crashed(layout, store, dead, codes)
        else:
            for r, c in enumerate(codes):
                if r not in retired and (c == 0 or store.check([f"done/{r}"])):
                    coordinator.retire(layout.ranks[r].device)
                    retired.add(r)
            if failures := coordinator.poll():
                raise _abort(procs, layout, store, coordinator, failures)
        time.sleep(POLL_S)


def _culprit(
    layout: RankLayout, store: dist.Store, dead: list[int], codes: list
) -> tuple[int, str]:
    """The culprit among the ``dead`` ranks (module docstring) and what happened to it."""
    errors = {r: _error_of(store, r) for r in dead}
    rank = min(dead, key=lambda r: (codes[r] > 0, errors[r] is not None, r))
    info = layout.ranks[rank]
    code = codes[rank]
    how = f"was killed by {_signal_name(code)}" if code < 0 else f"exited with {code}"
    why = f": {errors[rank]}" if errors[rank] else ""
    return rank, f"device {info.device!r} (rank {rank}, stage {info.stage}) {how}{why}"


def _crashed(layout: RankLayout, store: dist.Store, dead: list[int], codes: list) -> RunFailed:
    """The failure of a run without a control plane."""
    rank, what = _culprit(layout, store, dead, codes)
    others = sum(1 for c in codes if c is None)
    return RunFailed(f"{what}; stopped the other {others} worker(s)",
                     layout.ranks[rank].device, rank, codes[rank], "crash", time.monotonic())


def _abort(
    procs: list, layout: RankLayout, store: dist.Store, coordinator: Coordinator,
    failures: list[Failure],
) -> RunFailed:
    """Abort the generation for ``failures`` and fence the culprit; wait (at most
    ``ABORT_GRACE_S``) until every other child has seen the abort or exited; SIGKILL the
    culprit; give the others ``ABORT_GRACE_S`` to exit. Returns the failure to raise."""
    rank_of = {i.device: i.rank for i in layout.ranks}
    codes = [p.exitcode for p in procs]
    crashed = [rank_of[f.device] for f in failures if f.cause == "crash"]
    if crashed:
        rank, what = _culprit(layout, store, crashed, codes)
        failure = next(f for f in failures if f.device == layout.ranks[rank].device)
    else:
        failure = failures[0]
        rank = rank_of[failure.device]
    info = layout.ranks[rank]
    coordinator.abort(f"{failure.device} {failure.cause}", fence=[failure.device])
    aborted_at = time.time()
    # every other rank learns of the abort before the culprit's death can reach it as a
    # gloo "connection closed": wait until each has seen it (or exited), then kill
    names = [i.device for i in layout.ranks if i.rank != rank]
    deadline = time.monotonic() + ABORT_GRACE_S
    seen = coordinator.abort_seen(names)
    while time.monotonic() < deadline and any(
        d not in seen and procs[rank_of[d]].exitcode is None for d in names
    ):
        time.sleep(POLL_S)
        seen = coordinator.abort_seen(names)
    if procs[rank].exitcode is None:
        procs[rank].kill()  # SIGKILL also ends a SIGSTOPped process
        procs[rank].join()
    others = [p for r, p in enumerate(procs) if r != rank and p.exitcode is None]
    deadline = time.monotonic() + ABORT_GRACE_S
    for p in others:
        p.join(max(0.0, deadline - time.monotonic()))
    stopped = sum(1 for p in others if p.exitcode is not None)
    fate = (f"the abort reached {len(seen)} of {len(names)} other worker(s); "
            f"{stopped} of {len(others)} still running exited within {ABORT_GRACE_S:g} s, "
            f"{len(others) - stopped} were killed")
    if crashed:
        message = f"{what}; crash detected within one {POLL_S * 1e3:.0f} ms poll; {fate}"
    else:
        message = (
            f"device {info.device!r} (rank {rank}, stage {info.stage}) hung: no heartbeat "
            f"for {failure.silent_s:.2f} s (hang timeout {coordinator.hang_timeout_s:g} s), "
            f"declared dead, fenced and killed; {fate}"
        )
    return RunFailed(message, info.device, rank, procs[rank].exitcode, failure.cause,
                     failure.detected_at, aborted_at, seen)


def _stop(procs: list) -> None:
    """SIGTERM every live child, SIGKILL those still alive after ``GRACE_S``, join all."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
