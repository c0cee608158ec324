"""A recovering run's device process (``WorkerOptions.recover``; docs/fault-tolerance.md,
"Recovery"): :class:`RecoveringWorker` serves generation after generation, each in a
training thread (:class:`_GenerationRun`) that restores the generation's start state
and runs the one training loop (:func:`executor.core.loop.run_steps`) with the recovery's
hooks (:class:`_RecoveringSteps`: commit vote, checkpoint parts, ring replication).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from edgepipe.executor.core import build, storeblob
from edgepipe.executor.core.comm import StageGroup, StageLinks, Transport
from edgepipe.executor.core.emulation import Emulation
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.loop import Feed, Rows, StepHooks, run_steps
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.core.runtime import ComputeHook
from edgepipe.executor.core.stage import build_stage
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.control import (
    CoordinatorLost,
    GenerationAborted,
    WorkerControl,
    generation_store,
)
from edgepipe.executor.ft.faults import FaultHook, Injector
from edgepipe.executor.ft.faults import parse as parse_faults
from edgepipe.executor.ft.replication import (
    MIGRATION_TAG,
    REPLICA_TAG,
    Background,
    BlockState,
    Buffers,
    Copies,
    Outgoing,
    Snapshot,
    install,
    point_work,
    receive,
    receive_body,
    receive_header,
)
from edgepipe.planner.errors import UnrecoverableError
from edgepipe.planner.plan import Plan, plan_from_dict, replica_placement, replication_schedule
from edgepipe.planner.replan.replicas import RING


class RecoveringWorker:
    """One device of a recovering run (``WorkerOptions.recover``; docs/fault-tolerance.md,
    "Recovery"): the same process serves generation after generation.

    Per generation ``g`` (published by the coordinator as ``gen<g>/start``: the plan, its
    members in rank order, the step ``d`` to replay from, the migration), a training
    thread builds raw gloo groups on ``PrefixStore(gen<g>)`` (P4; warmed at once, P9),
    restores the state of step ``d`` (own copies, then the migration's transfers), posts
    a replication of it and runs steps ``d .. steps-1``: compute, **vote**
    ``vote/<t>/<rank>``, wait for the coordinator's ``commit/<t>``, apply the optimizer
    step, replicate every ``replication_interval`` steps (and after the last one; a
    short run skips some, docs/fault-tolerance.md, "Short runs"),
    acknowledge ``repl/<n>/<rank>`` (n = steps applied). The main thread watches the
    control plane: on an abort of ``g`` it marks ``g`` dead (under the copies' lock; the
    thread, maybe blocked in a gloo op, can change nothing afterwards, P6) and waits for
    generation ``g + 1``. A device left out of a generation, or told ``exit`` after the
    last step is durable, finishes (exit 0); a fenced one raises :class:`Fenced`.
    """

    def __init__(self, opts: WorkerOptions, endpoint: Endpoint, plan: Plan) -> None:
        self.opts, self.endpoint = opts, endpoint
        planned = [r.device for r in RankLayout.from_plan(plan).ranks]
        # a joining device (``opts.device``: a new one, or one lost earlier coming back
        # as a fresh process) or a standby waits until a generation includes it
        self.device_id = opts.device or planned[endpoint.rank]
        self.joining = opts.device is not None
        self.device, _ = build.torch_device(endpoint)
        self.rows = build.load_rows(plan, opts)
        self.store = self._connect()
        self.faults = Injector(self.device_id, parse_faults(opts.faults), self.store)
        if self.joining:
            self.faults.at(0, "join")  # before its first heartbeat (executor/ft/faults.py)
        self.control = WorkerControl(self._control_store, self.device_id,
                                     opts.heartbeat_s, opts.incarnation).start()
        self.dead: set[int] = set()
        self.copies = Copies(lambda g: g not in self.dead)
        self.finished = False

    def _connect(self) -> dist.TCPStore:
        return dist.TCPStore(self.endpoint.store_host, self.endpoint.store_port,
                             is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=self.opts.timeout_s))

    def _control_store(self) -> dist.Store:
        return self._connect()

    def fail(self, message: str) -> None:
        self.store.set(f"ctl/error/{self.device_id}", message)

    def run(self) -> None:
        g = 0
        try:
            while not self.finished:
                start = self._await_generation(g)
                if start is None:
                    return
                g, record = start
                self._generation(g, record)
        finally:
            self.control.stop()

    def _await_generation(self, after: int) -> tuple[int, dict] | None:
        """The next generation's start record, or None when this device is not in it.

        A joining device waits (as long as the coordinator lives) for the first
        generation that includes it, skipping those that do not. An aborted generation
        is no reason to stop here: the next one follows (a generation may even be
        aborted before this device read its start; then it starts, sees the abort and
        comes back)."""
        deadline = time.monotonic() + self.opts.timeout_s + 60.0
        while self.joining or time.monotonic() < deadline:
            with contextlib.suppress(GenerationAborted):
                self.control.check(after + 1)
            g = int(self.store.get("ctl/generation")) if self.store.check(
                ["ctl/generation"]) else 0
            if g > after and self.store.check([f"gen{g}/start"]):
                record = json.loads(self.store.get(f"gen{g}/start"))
                if self.device_id in record["members"]:
                    self.joining = False
                    return g, record
                if not self.joining:
                    return None
                after = g
            time.sleep(0.01)
        raise CoordinatorLost(f"no generation after {after} within {self.opts.timeout_s + 60:g} s")

    def _generation(self, g: int, record: dict) -> None:
        """Run generation ``g`` until it finishes the run or is aborted."""
        outcome: dict[str, BaseException] = {}

        def train() -> None:
            try:
                _GenerationRun(self, g, record).run()
            except BaseException as exc:  # the main thread decides what it means
                outcome["error"] = exc

        thread = threading.Thread(target=train, name=f"train-gen{g}", daemon=True)
        thread.start()
        error_deadline = None
        while True:
            try:
                self.control.check(g)
            except GenerationAborted:
                with self.copies.lock:
                    self.dead.add(g)
                return
            if not thread.is_alive():
                if "error" not in outcome:
                    return
                # a peer's death reaches the data plane first ("connection closed");
                # the coordinator's abort follows within a poll: wait for it
                if error_deadline is None:
                    error_deadline = time.monotonic() + self.opts.abort_wait_s
                elif time.monotonic() > error_deadline:
                    raise outcome["error"]
            self.control.wait(g, self.opts.heartbeat_s / 4)  # at once on an abort


class _GenerationRun:
    """One generation of a :class:`RecoveringWorker` (its training thread)."""

    def __init__(self, worker: RecoveringWorker, g: int, record: dict) -> None:
        self.w, self.g, self.record = worker, g, record
        self.opts = worker.opts
        self.root = worker._connect()  # this thread's own store connection
        self.store = generation_store(self.root, g)
        # the plan comes from the coordinator's store, not its file (no shared file system)
        self.plan = plan_from_dict(json.loads(storeblob.get(self.store, "plan")),
                                   f"plan of generation {g} (coordinator's store)")
        self.layout = RankLayout.from_plan(self.plan)
        self.members: list[str] = record["members"]
        self.rank = self.members.index(worker.device_id)
        self.spare = self.rank >= self.layout.world_size
        self.me = None if self.spare else self.layout.ranks[self.rank]
        self.timeout = timedelta(seconds=self.opts.timeout_s)
        # the points this generation takes and whether the last one travels; the
        # coordinator computes the same (docs/fault-tolerance.md, "Short runs")
        self.schedule = replication_schedule(self.plan, int(record["resume"]), self.opts.steps)
        self.replicas = [r for r in replica_placement(self.plan)
                         if r.kind == RING and r.holders[0] in self.members]

    def check(self) -> None:
        self.w.control.check(self.g)
        if self.g in self.w.dead:
            raise GenerationAborted(self.g, "abandoned")

    def _wait_key(self, key: str, poll_s: float = 0.001) -> None:
        while not self.store.check([key]):
            self.check()
            time.sleep(poll_s)

    def _stamp(self, key: str) -> None:
        self.store.set(f"{key}/{self.rank}", repr(time.time()))

    def _gloo_group(self, prefix: str, rank: int, size: int) -> dist.ProcessGroup:
        """A raw gloo group of this generation on ``PrefixStore(prefix)`` (P4), no global
        state. Typed as the :class:`ProcessGroup` whose calls it serves: torch's stubs
        declare ``ProcessGroupGloo`` a ``Backend`` without the collectives and
        point-to-point calls it has at runtime (``allreduce``, ``send``, ``recv``)."""
        group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, self.store), rank, size,
                                      self.timeout)
        return group  # type: ignore[return-value]  # torch's stubs (docstring)

    def run(self) -> None:
        self.pg = self._gloo_group("pg", self.rank, len(self.members))
        self.pg.allreduce(torch.zeros(1)).wait()  # connect now (P9)
        # the replicas travel in the background, beside the next step's activations: on
        # their own group (own connections; a failed op there cannot disturb the step's)
        self.rpg = self._gloo_group("repl", self.rank, len(self.members))
        self.rpg.allreduce(torch.zeros(1)).wait()
        self.buffers = Buffers()
        if self.spare:
            self._spare()
        else:
            self._train()

    def _spare(self) -> None:
        """A member the plan does not use (a survivor left idle, or a standby of a
        one-device plan: executor/launch.py): serve the migration from its copies, then
        acknowledge every replication point of the generation, receiving first the
        replicas it holds (a one-device plan's, placed on an idle device), and wait for
        the end of the run (or the generation).

        An owner posts point n only after the commit of step n - 1, and that commit
        needs the point before n durable (every member acknowledged it;
        :func:`executor.ft.recovery.commit_blocked`); so when point n arrives the point
        before it is durable and is promoted here, as the training ranks promote at the
        commit that needs it."""
        self._stamp("rebuilt")
        d = int(self.record["resume"])
        if not self.record["fresh"]:
            self._restore(d, 0, 0)
        self._stamp("restored")
        previous: list[int] = []

        def promote() -> None:  # point n is on its way: the one before it is durable
            if previous:
                self.w.copies.promote(self.g, previous[-1])

        for n in self.schedule.points:
            got = self._receive_held(n, promote)
            if got:  # a holder: received, not acknowledged yet
                self.w.faults.at(n - 1, "replication")
            self.w.copies.add(self.g, got)
            previous.append(n)
            self.store.set(f"repl/{n}/{self.rank}", "1")
        self._wait_key("exit", poll_s=0.02)
        self.w.finished = True

    def _train(self) -> None:
        plan, me, opts = self.plan, self.me, self.opts
        assert me is not None
        members = self.layout.stage_ranks[me.stage]
        group = None
        if len(members) > 1:
            raw = self._gloo_group(f"stage{me.stage}", members.index(self.rank), len(members))
            group = StageGroup(raw, members, raw=True)
            group.all_reduce(torch.zeros(1))
        self._stamp("rebuilt")
        d = int(self.record["resume"])
        if self.g > 1:
            self.w.faults.at(d, "restore")
        stage = plan.partition.stages[me.stage]
        self.first = stage.first
        module = build_stage(plan.problem.model, stage.first, stage.end).to(self.w.device)
        optimizer = build.stage_optimizer(module, plan)
        if not self.record["fresh"]:
            install(module, stage.first, optimizer, self._restore(d, stage.first, stage.end))
        elif opts.resume:  # the run's start state is the checkpoint's
            checkpoint.load(opts.resume, module, optimizer, stage.first, plan, None)
        self._stamp("restored")
        shapes, dtypes = build.stage_shapes(self.store, self.layout, me, module, self.w.rows,
                                            self.w.device)
        emulation = (Emulation.for_rank(plan, self.rank, self.store, opts.time_scale, opts.out,
                                        opts.emulate_slowdown, self.pg, first_step=d,
                                        spares=tuple(self.members[self.layout.world_size:]))
                     if opts.emulate else None)
        self.emulation = emulation
        transport = emulation.transport if emulation else Transport(self.pg)
        links = StageLinks(self.layout, self.rank, transport, shapes, dtypes, self.w.device)
        hook = FaultHook(emulation.hook if emulation else ComputeHook(), self.w.faults,
                         self._await_durable)
        runtime = build.stage_runtime(plan, self.layout, self.rank, module, optimizer, links,
                                      group, hook, self.w.device, self.check,
                                      opts.deterministic, opts.recv_ahead)
        self.module, self.optimizer = module, optimizer
        hooks = _RecoveringSteps(self, hook, d)
        feed = Feed(self.layout, me, self.w.rows, self.w.device, plan.problem.config.seed)
        run_steps(d, opts.steps, runtime, feed, self.store, hooks)
        hooks.finish()
        self._wait_key("exit")
        if opts.save_weights and opts.out:
            build.save_weights(opts, plan, me, self.rank, module, optimizer)
        self.w.finished = True

    def _await_durable(self, step: int) -> None:
        """Return once the replication point ``step`` (steps applied) is durable (every
        member acknowledged it), at once when it is none of this generation's."""
        if step in self.schedule.points:
            keys = [f"repl/{step}/{r}" for r in range(len(self.members))]
            while not self.store.check(keys):
                self.check()
                time.sleep(0.005)

    def _restore(self, d: int, first: int, end: int) -> dict[int, BlockState]:
        """The states of blocks [first, end) at step ``d``: own copies, then the
        migration's transfers (each device posts its sends, then receives in list
        order)."""
        held = self.w.copies.at(d)
        rank_of = {dev: r for r, dev in enumerate(self.members)}
        me = self.w.device_id
        out = Outgoing()
        for t in self.record["migration"]:
            if t["source"] == me and t["to"] != me:
                blocks = range(t["first"], t["end"])
                missing = [i for i in blocks if i not in held]
                if missing:
                    raise UnrecoverableError(
                        f"device {me} holds no copy of blocks {missing} at step {d}",
                        ((missing[0], missing[-1] + 1),), ())
                out.send(self.pg, rank_of[t["to"]], {i: held[i] for i in blocks},
                         MIGRATION_TAG)
        received: dict[int, BlockState] = {}
        for t in self.record["migration"]:
            if t["to"] == me and t["source"] != me:
                received.update(receive(self.pg, rank_of[t["source"]], MIGRATION_TAG))
        out.wait()
        self.w.copies.promote(self.g, d)
        self.w.copies.add(self.g, received)
        states = {**held, **received}
        missing = [i for i in range(first, end) if i not in states or states[i].step != d]
        if missing:
            raise UnrecoverableError(
                f"device {me} got no copy of blocks {missing} at step {d}",
                ((missing[0], missing[-1] + 1),), ())
        return states

    def _replicate(self, n: int, copied: threading.Event) -> Callable[[], None]:
        """Replication point ``n``: take the snapshot of this rank's state after ``n``
        steps now (:meth:`Snapshot.take`: only what the next step changes before its
        optimizer step is copied here) and return the rest, for a :class:`Background`
        thread: complete the snapshot and keep it (this rank's own copy; then set
        ``copied``), post it to the ring replica holder of the plan
        (:func:`planner.plan.replica_placement`; an emulated run paces it at the
        modelled link to the holder), receive the replicas this device holds from their
        owners, and acknowledge ``repl/<n>/<rank>`` once all of that is done."""
        self.check()  # a dead generation's thread takes no buffer
        snapshot = Snapshot.take(self.module, self.first, self.optimizer, n, self.buffers)
        rank_of = {dev: r for r, dev in enumerate(self.members)}
        me = self.w.device_id
        holders = [rank_of[r.holders[0]] for r in self.replicas
                   if self.plan.partition.stages[r.stage].devices == (me,) and self._sends(n)]
        emulation = self.emulation
        return point_work(
            self.w.copies, self.g, snapshot, self.rpg, holders,
            lambda: self._receive_held(n), lambda: self.w.faults.at(n - 1, "replication"),
            lambda: self.store.set(f"repl/{n}/{self.rank}", "1"),
            announce=lambda: self.store.set(f"posted/{n}/{self.rank}", "1"),
            pace=(lambda h, b: emulation.transport.occupy(h, b, check=self.check))
            if emulation else lambda h, b: None,
            copied=copied)

    def _sends(self, n: int) -> bool:
        """Whether point ``n``'s replicas travel: all but a last point whose wait would
        cost more than the generation's steps (:func:`planner.cost.formulas.point_schedule`;
        its owners then keep it and acknowledge at once)."""
        return n != self.opts.steps or self.schedule.final_sent

    def _receive_held(self, n: int, arrived: Callable[[], None] = lambda: None,
                      ) -> dict[int, BlockState]:
        """The ring replicas of state ``n`` this device holds, from their owners, into
        this generation's buffers; ``arrived`` runs once the first header is in (the
        owner has posted point ``n``), before any buffer is written.

        Each receive is posted only once its owner's ``posted/<n>/<owner>`` is in the
        store (polled, and ended by an abort of the generation): a standby would
        otherwise post the receive of point n as soon as it acknowledged the point
        before, and a receive waits at most the replica group's per-operation timeout
        (``--timeout``), which an interval's steps may outlast."""
        rank_of = {dev: r for r, dev in enumerate(self.members)}
        held: dict[int, BlockState] = {}
        first = True
        for r in self.replicas:
            if r.holders[0] == self.w.device_id and self._sends(n):
                owner = rank_of[self.plan.partition.stages[r.stage].devices[0]]
                self._wait_key(f"posted/{n}/{owner}", poll_s=0.005)
                header = receive_header(self.rpg, owner, REPLICA_TAG)
                if header.step != n:
                    raise RuntimeError(f"replica of stage {r.stage} is not of step {n}")
                if first:
                    arrived()
                    first = False
                held.update(receive_body(self.rpg, owner, REPLICA_TAG, header,
                                         self.buffers.take(("held", r.stage), header)))
        return held


class _RecoveringSteps(StepHooks):
    """A recovering run's hooks of the one loop (:mod:`executor.core.loop`;
    :class:`RecoveringWorker`'s docstring): its fault points; at the commit point the
    vote ``vote/<t>/<rank>`` and the wait for the coordinator's ``commit/<t>``; after the
    optimizer step its checkpoint part and, at each replication point, the snapshot
    whose rest travels in the background beside the next steps (docs/fault-tolerance.md,
    "Points in flight": point p's background half runs until the step whose commit makes
    the point after it)."""

    def __init__(self, run: _GenerationRun, faults: FaultHook, d: int) -> None:
        self.run, self.faults = run, faults
        self.points = run.schedule.points
        self.successor = dict(itertools.pairwise(self.points))
        self.point, self.copied = d, threading.Event()
        # a short run may skip its start state's point ("Short runs")
        self.pending: Background | None = (Background(f"replicate-{d}",
                                                      run._replicate(d, self.copied))
                                           if d in self.points else None)
        self.joined: int | None = None
        self.work: Callable[[], None] | None = None
        self.blocked_s, self.background_s = 0.0, 0.0
        self.acked: dict[str, float | int] = {}

    def before_compute(self, step: int) -> None:
        self.faults.step = step

    def commit(self, step: int) -> None:
        r = self.run
        # the point in flight must be complete (own copy, sends, held replicas,
        # acknowledged) before this rank votes the step whose commit makes the next
        self.blocked_s, self.background_s, self.acked = 0.0, 0.0, {}
        if self.pending is not None and self.successor.get(self.point) == step + 1:
            self.blocked_s = self.pending.join(r.check)
            self.background_s = self.pending.seconds
            self.acked = {"replication_point": self.point,
                          "replication_acked_at": self.pending.finished_at or 0.0}
            self.joined, self.pending = self.point, None
        r.store.set(f"vote/{step}/{r.rank}", "1")
        r._wait_key(f"commit/{step}")
        if self.joined is not None:  # this commit says every replica of it is acked
            r.w.copies.promote(r.g, self.joined)
        if self.pending is not None:  # its own copy is taken before the optimizer step
            self.blocked_s += self.pending.join(r.check, until=self.copied)
        r.w.faults.at(step, "optimizer")

    def after_apply(self, step: int, mine: Rows) -> dict[str, Any]:
        r, opts, me = self.run, self.run.opts, self.run.me
        assert me is not None
        n = step + 1
        if (opts.checkpoint_every and n % opts.checkpoint_every == 0
                and n > int(r.record["checkpointed"])):
            # the part goes to the coordinator, which writes and commits it (a
            # replay sends none of a committed one); a data-parallel peer's copy is
            # its stage's first member's
            part = (checkpoint.Parts.part_bytes(n, r.module, r.optimizer, r.first,
                                                r.plan.problem.config.optimizer)
                    if me.index == 0 else b"")
            storeblob.put(r.store, f"ckpt/{n}/{r.rank}", part)
        self.work = None
        if n in self.points:
            start = time.perf_counter()
            self.copied = threading.Event()
            self.work = r._replicate(n, self.copied)
            self.blocked_s += time.perf_counter() - start
        extra: dict[str, Any] = {"replication_ms": self.blocked_s * 1e3,
                                 "replication_background_ms": self.background_s * 1e3,
                                 **self.acked}
        if r.emulation is not None:  # the slowdown watch's evidence rule
            extra["overruns"] = r.emulation.hook.step_overruns
        if me.stage == 0:
            extra["samples"] = [[r.layout.positions(r.rank)[k], int(i)]
                                for k, i in enumerate(np.concatenate(mine))]
        return extra

    def after_metrics(self, step: int) -> None:
        if self.work is not None:  # after the metrics: its acknowledgement makes them due
            self.point, self.pending = step + 1, Background(f"replicate-{step + 1}", self.work)

    def finish(self) -> None:
        """After the last step: wait for the replication point in flight."""
        if self.pending is not None:
            self.pending.join(self.run.check)
