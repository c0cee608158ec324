"""In-process recovery, the coordinator's side: commit votes, durability, re-plan, rebuild.

The coordinator (the local launcher, or a cross-host coordinator process) runs one
:class:`Supervisor` beside its :class:`~executor.ft.control.Coordinator`; the workers run
:class:`executor.ft.generation.RecoveringWorker`. Protocol (docs/fault-tolerance.md,
"Recovery"; reference/fault-tolerance.md §2 lessons 3-5):

* **Generations.** Generation ``g`` is published as ``gen<g>/plan`` (the plan document,
  :mod:`executor.core.storeblob`: every host reads it from the store, none needs a shared
  file system) and ``gen<g>/start``: the plan's file on the coordinator's host, its
  members (devices in rank order), the step ``d`` to replay from, whether that state is
  the untrained start (``fresh``: every device rebuilds any block from the model seed)
  and the migration (which device sends which blocks to whom). All other keys of the
  generation are under ``gen<g>/``, so a dead generation's late writes never count.
* **Commit vote** (torchft's ``should_commit``): a rank writes ``vote/<t>/<rank>`` when
  step ``t``'s compute is done; :meth:`Supervisor.poll` writes ``commit/<t>`` once every
  voter (plan rank) voted and every replication point whose successor is at most
  ``t + 1`` is durable (below: acknowledged by every member, standbys included): a
  point stays in flight beside the steps up to the one whose commit makes the next
  point, and that commit waits for it (:func:`commit_blocked`); no rank applies step
  ``t``'s
  optimizer step before that, so a step applies everywhere or nowhere (a rank killed
  after the commit is replayed from the last durable step, as every other rank is).
* **Durability.** After applying step ``t`` a rank replicates at replication points
  (every ``replication_interval`` steps, after the last step, and the start state of
  each generation, less those a short run skips:
  :func:`planner.plan.replication_schedule`, docs/fault-tolerance.md, "Short runs") and
  writes ``repl/<n>/<rank>`` (``n`` = steps applied) once its sends are posted and its
  replicas received; ``n`` is **durable** when every member did.
  Every rank keeps its own state at the last durable step until the next is durable
  (:class:`executor.ft.replication.Copies`).
* **Metrics.** A step's ``metrics.jsonl`` line is written (flushed) as soon as the step
  has committed and every voter has published its payload, so a person watching the run
  (or reading a run that died) sees every committed step, and the slowdown watch gets
  its compute per device then too (a watch fed at durability would see nothing until
  the end of a run whose points are all skipped or deferred); its payloads are deleted
  once it is durable. A recovery that replays
  from ``d`` first takes the lines of steps ``d`` and later out of the file again
  (:meth:`executor.core.metrics.MetricsWriter.rollback`), so the file holds only
  committed steps that stand, each once.
* **Recovery** (:meth:`Supervisor.recover`, called with the coordinator's failures):
  abort generation ``g`` and fence the dead; wait until every other member has
  acknowledged the abort or died (event-driven, at most ``ABORT_SEEN_S``; the members
  that die before acknowledging are lost in the same failure); kill the dead's
  processes (``kill`` callback); take the last durable state (step ``d`` and the plan
  under which its copies were placed: a generation that failed before its own start
  state was durable hands on its parent's); look up the pre-computed plan for a single
  loss of that plan (:func:`planner.replan.incremental.precompute`), else
  :func:`planner.replan` with every device lost since; open ``g + 1`` with the new
  plan's devices and publish it. An :class:`~planner.errors.UnrecoverableError` (no
  copy of some block survives) or an infeasible re-plan raises
  :class:`RecoveryFailed`: one line, within ``hang_timeout + ABORT_SEEN_S`` plus the
  re-plan time of the failure; no worker writes anything afterwards, so the last
  checkpoint stays as it was.
* A failure while a generation recovers (before its start state is durable) is
  recovered again from the same durable state and plan, with both devices lost; one
  after it uses the new generation's plan. Never a mix: every rank restores exactly the
  states of step ``d`` (a state of any other step is refused by the worker).

**Checkpoints** (``checkpoint_every`` > 0; :mod:`executor.ft.checkpoint`, "Two layouts"):
after applying step ``t`` with ``t + 1`` a multiple of the interval, every rank writes
``ckpt/<t + 1>/<rank>``: its part of checkpoint ``t + 1`` (serialised; empty for a
data-parallel peer other than its stage's first member), before its ``repl`` key of
any later point; once every rank of the generation did, :meth:`Supervisor.poll` writes
the parts into ``checkpoint_dir`` on its own host (so the workers need no shared file
system), deletes the keys and commits the checkpoint (record, marker, rename), before
it tells the members to ``exit``. A
checkpoint whose parts are incomplete when a generation fails is written again by the
replay (a checkpoint at or before the replay step is dropped: its state is durable, so
its parts were all in). A replay past a committed checkpoint sends none of its parts
again: the generation's ``start`` record names the last committed one
(``checkpointed``), and only later ones are sent (a part sent again would stay in the
store unread, and committing it again would rewrite a committed checkpoint). A run
resumed from a checkpoint (``resume``) starts from it: ``fresh`` then means "load the
checkpoint", also for a replay of the first generation.

Recovery event (one ``metrics.jsonl`` line per recovery, written when the new
generation commits its first step or fails): ``type`` ``"recovery"``, ``generation``
(the new one), ``detected_at`` (wall clock), ``cause`` (crash | hang | slow | join),
``device`` (comma-separated when several), ``old_plan`` / ``new_plan`` (ids),
``replay_from_step`` (``d``), ``blocks_moved`` / ``bytes_moved`` (the migration, replica
promotions on the device itself not counted), ``t_detect_s`` (fault to detection: exact
when the fault was injected, else the device's heartbeat silence), ``t_abort_s``
(detection to every other member's acknowledgement of the abort, or its death; 0 for a
re-partitioning, which waits for none), ``t_replan_s``,
``t_rebuild_s`` (generation opened to every member's groups built), ``t_restore_s``
(groups built to every member's state restored), ``t_first_commit_s`` (detection to
the first commit of the new generation; null when it failed first); ``warning``, only
when the new plan leaves a stage without a replica although it replicates (the loss of a
one-device plan's last standby: :func:`unreplicated`).

A slowdown whose re-plan would run exactly as the current plan (:func:`same_work`) is not
re-partitioned (issue 27): one ``"type": "repartition_skipped"`` line instead (``cause``,
``device``, ``slowed``: device -> factor, ``plan``: the current one, ``detected_at``,
``step``: the next to commit, ``t_replan_s``); its factors join the next re-plan's.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepipe.executor.core import storeblob
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.metrics import MetricsWriter
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.control import Coordinator, Failure, generation_store
from edgepipe.executor.ft.slowdown import SlowdownWatch
from edgepipe.planner.cli.args import KEEP_CHECKPOINTS
from edgepipe.planner.errors import EdgepipeError, InfeasibleError, InputError, UnrecoverableError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.plan import (
    Plan,
    plan_to_dict,
    replica_placement,
    replication_schedule,
    save_plan,
)
from edgepipe.planner.replan.incremental import precompute, replan
from edgepipe.planner.replan.replicas import NONE
from torch.distributed import Store

#: the longest the survivors get to acknowledge an abort before the dead are killed and
#: the next generation opens (a live survivor's abort watcher answers within a few store
#: round trips; only a hung, starved or unreachable one takes this long)
ABORT_SEEN_S = 1.0
#: seconds between two looks at the acknowledgements and exit statuses meanwhile
ACK_POLL_S = 0.005


class RecoveryFailed(EdgepipeError):
    """A failure the run cannot recover from; ``device`` / ``cause`` name it."""

    def __init__(self, message: str, device: str, cause: str) -> None:
        self.device, self.cause = device, cause
        super().__init__(message)


@dataclass
class Generation:
    """What the coordinator tracks of one generation."""

    number: int
    plan: Plan
    members: tuple[str, ...]
    voters: int
    resume: int
    store: Store
    opened_wall: float
    next_commit: int = 0
    durable: int | None = None
    points: list[int] = field(default_factory=list)

    @property
    def world(self) -> int:
        return len(self.members)

    def all_wrote(self, key: str, everyone: bool = False) -> bool:
        """Whether every voter (``everyone``: every member) wrote ``key/<rank>``."""
        n = self.world if everyone else self.voters
        return self.store.check([f"{key}/{r}" for r in range(n)])

    def times(self, key: str) -> list[float]:
        return [float(self.store.get(f"{key}/{r}")) for r in range(self.world)]


def _precompute_into(slot: dict, plan: Plan) -> None:
    """Fill ``slot`` with :func:`planner.replan.incremental.precompute`'s plans (a background
    thread's job). A plan with no device to lose (one device) leaves it empty: a failure
    then re-plans at once and raises the re-planner's one-line error."""
    with contextlib.suppress(EdgepipeError):
        slot.update(precompute(plan))


def commit_blocked(step: int, undurable: Sequence[int]) -> bool:
    """Whether step ``step`` must wait for a replication point before it commits, given
    the generation's points not durable yet (``undurable``, ascending; durability comes
    in point order, so they are a suffix of the generation's points,
    :func:`planner.plan.replication_schedule`).

    Rule (docs/fault-tolerance.md, "Points in flight"): the commit of step t makes state
    t + 1, so it needs every point p durable whose successor p' <= t + 1; the first
    undurable point's successor is ``undurable[1]``. Point p may thus stay in flight
    beside steps p .. p' - 2. At most one taken point is ever undurable (p' is taken
    only after the commit of p' - 1, which needs p durable), but the durable p and the
    travelling p' coexist, so each stream needs two buffer sets
    (:class:`executor.ft.replication.Buffers`). With interval 1 (p' = p + 1) it is the
    rule "every point up to t is durable". O(1)."""
    return len(undurable) > 1 and undurable[1] <= step + 1


def unreplicated(plan: Plan, members: Sequence[str]) -> str | None:
    """One line naming the stages of ``plan`` whose state no other member will hold
    although the plan replicates: no device can hold the replica (kind ``none``) or its
    holder runs no process in the generation (``members``); None when every stage is
    covered. O(P)."""
    if plan.problem.config.replication_interval == 0:
        return None
    bare = [r for r in replica_placement(plan)
            if r.kind == NONE or not set(r.holders) & set(members)]
    if not bare:
        return None
    stages = plan.partition.stages
    what = "; ".join(f"stage {r.stage} (blocks [{r.first}, {r.end})) on "
                     f"{', '.join(stages[r.stage].devices)}" for r in bare)
    return (f"the run goes on unreplicated: no device left can hold the replica of {what}; "
            "losing it now stops the run")


def same_work(new: Plan, current: Plan) -> bool:
    """Whether ``new`` would run exactly as ``current`` does: the same cuts, devices
    and their order, sample shares, micro-batch size and count, and replication
    interval (its predicted times may differ: a re-partition to it would change
    nothing but cost an abort, a rebuild and a replay). O(stages)."""
    return (new.partition == current.partition
            and new.problem.config.replication_interval
            == current.problem.config.replication_interval)


def _relies_on(plan: Plan, devices: Sequence[str]) -> bool:
    """Whether ``plan`` gives any of ``devices`` blocks or a ring replica."""
    used = set(plan.partition.used_devices())
    used.update(h for r in replica_placement(plan) if r.kind != NONE for h in r.holders)
    return bool(used & set(devices))


class Supervisor:
    """The coordinator's side of a recovering run (module docstring).

    Args:
        store: the run's store (unprefixed).
        coordinator: the control plane (its generation 1 already open with ``plan``'s
            devices).
        plan: the plan of generation 1.
        steps: steps to train; ``resume``: steps already applied at the start.
        writer: the metrics writer (or None: no metrics files).
        plans_dir: where re-planned plans are written for the workers to load.
        plan_path: the file of ``plan``.
        kill: ``kill(device)`` ends a dead device's process (the local launcher SIGKILLs
            it; across hosts, where the coordinator cannot, fencing alone stops it).
        alive: ``alive(device)`` whether a device's process may still be running
            (a waiting period for the abort to be seen ends early for the dead).
        precompute_plans: pre-compute the re-plan of every single-device loss of each
            generation's plan in the background, so a recovery is a lookup.
        checkpoint_every / checkpoint_dir / keep_checkpoints: commit a checkpoint every
            that many steps into that folder, keeping the newest ``keep_checkpoints``
            (module docstring, "Checkpoints"; 0: none).
        slowdown: fed every committed step's compute per device
            (:class:`executor.ft.slowdown.SlowdownWatch`); the coordinator re-partitions
            (:meth:`repartition`, cause ``slow``) for what it declares.

    Each :meth:`poll` costs O(1) store round trips (one ``check`` per kind of key).
    """

    def __init__(
        self, store: Store, coordinator: Coordinator, plan: Plan, plan_path: str, steps: int,
        *, resume: int = 0, writer: MetricsWriter | None = None,
        plans_dir: Path, kill: Callable[[str], None],
        alive: Callable[[str], bool] = lambda d: True, precompute_plans: bool = True,
        slowdown: SlowdownWatch | None = None, checkpoint_every: int = 0,
        checkpoint_dir: Path | None = None, keep_checkpoints: int = KEEP_CHECKPOINTS,
    ) -> None:
        self.slowdown = slowdown
        self.checkpoint_dir, self.keep_checkpoints = checkpoint_dir, keep_checkpoints
        #: checkpoints still to commit (steps applied)
        self.checkpoints = [n for n in range(resume + 1, steps + 1)
                            if checkpoint_every and n % checkpoint_every == 0]
        #: the last checkpoint committed (0: none; a resumed run's own): a replay past
        #: it sends no part of it again (the parts would stay in the store, unread)
        self.checkpointed = resume
        self.store, self.coordinator = store, coordinator
        self.steps, self.writer, self.plans_dir = steps, writer, plans_dir
        self.kill, self.alive = kill, alive
        self.lost: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._pending_event: dict[str, Any] | None = None
        #: re-partitions skipped because the plan would not change (:meth:`_keep`) ...
        self.skipped: list[dict[str, Any]] = []
        #: ... and their factors (device -> product), for the next re-plan
        self._kept: dict[str, float] = {}
        self._precomputed: dict[str, dict] = {}
        self._precompute = precompute_plans
        #: steps before this one have their metrics line (written at commit) ...
        self._written = resume
        #: ... and before this one are durable (payloads deleted, slowdown fed)
        self._settled = resume
        # the last durable state: (plan whose placement holds its copies, step, fresh)
        self.base: tuple[Plan, int, bool] = (plan, resume, True)
        self.finished = False
        self.devices = coordinator.members
        #: steps from this one on are not committed (a join is due here: :meth:`hold`)
        self.held: int | None = None
        self.gen = self._open(coordinator.generation, plan, plan_path, resume, fresh=True,
                              migration=[])

    # -- generations -------------------------------------------------------------------
    def _open(self, g: int, plan: Plan, path: str, resume: int, *, fresh: bool,
              migration: list[dict]) -> Generation:
        layout = RankLayout.from_plan(plan)
        members = self.members_of(plan)
        gstore = generation_store(self.store, g)
        gen = Generation(g, plan, members, layout.world_size, resume, gstore, time.time(),
                         next_commit=resume)
        self.checkpoints = [n for n in self.checkpoints if n > resume]
        # the points it takes (the workers compute the same from the same plan)
        gen.points = list(replication_schedule(plan, resume, self.steps).points)
        # the plan itself travels through the store: hosts need no shared file system
        storeblob.put(gstore, "plan", json.dumps(plan_to_dict(plan)).encode())
        gstore.set("start", json.dumps({
            "plan": path, "members": list(members), "resume": resume, "fresh": fresh,
            "migration": migration, "checkpointed": self.checkpointed,
        }))
        if self._precompute and plan.id not in self._precomputed:
            slot: dict = {}
            self._precomputed[plan.id] = slot
            threading.Thread(target=_precompute_into, args=(slot, plan), daemon=True,
                             name=f"precompute-{plan.id}").start()
        return gen

    def _discard_checkpoint_parts(self, old: Generation) -> None:
        """Free the parts ``old``'s ranks sent of checkpoints it did not commit (the
        next generation replays those steps and sends them under its own prefix; left
        here they would stay in the store unread, review 8 F1). A rank sends
        ``ckpt/<n>`` only after ``commit/<n - 1>``, so only ``n <= old.next_commit`` can
        have parts: O(voters) store calls per such checkpoint, none for the rest."""
        for n in self.checkpoints:
            if n > old.next_commit:
                break
            for r in range(old.voters):
                storeblob.discard(old.store, f"ckpt/{n}/{r}")

    def members_of(self, plan: Plan) -> tuple[str, ...]:
        """A generation's members in rank order: the plan's devices (:mod:`executor.core.layout`
        order), then every other survivor as a **spare** (it serves the copies it holds
        to the migration, then waits; a later re-plan may use it)."""
        ranked = tuple(r.device for r in RankLayout.from_plan(plan).ranks)
        return ranked + tuple(d for d in self.devices if d not in ranked and d not in self.lost)

    # -- steady state ------------------------------------------------------------------
    def poll(self) -> bool:
        """Advance commits, durability and metrics; True once the run is finished (every
        member's final state is durable; the members were told to exit)."""
        gen = self.gen
        if self.finished:
            return True
        end = self.steps if self.held is None else max(self.held, gen.resume)
        # a point is durable once every member acknowledged it (spares included: one
        # may hold a one-device plan's replica); a step commits only once every point
        # it needs is (commit_blocked; the voters' votes imply their own acknowledgements)
        while gen.points and gen.all_wrote(f"repl/{gen.points[0]}", everyone=True):
            n = gen.points.pop(0)
            gen.durable = n
            self.base = (gen.plan, n, False)
            self._write_metrics(gen, n)
            self._settle(gen, n)
        while (gen.next_commit < end and not commit_blocked(gen.next_commit, gen.points)
               and gen.all_wrote(f"vote/{gen.next_commit}")):
            gen.store.set(f"commit/{gen.next_commit}", repr(time.time()))
            gen.next_commit += 1
            if self._pending_event is not None and self._pending_event["generation"] == gen.number:
                self._finish_event(time.time())
        # the lines of the committed steps whose payloads every voter published
        while self._written < gen.next_commit and gen.all_wrote(f"metrics/{self._written}"):
            self._write_metrics(gen, self._written + 1)
        # after the repl keys: a rank writes its ckpt key before any later repl key
        while self.checkpoints and gen.all_wrote(f"ckpt/{self.checkpoints[0]}"):
            self._commit_checkpoint(gen, self.checkpoints.pop(0))
        if self._pending_event is not None:
            self._event_phases(gen)
        if gen.durable == self.steps:
            gen.store.set("exit", "1")
            self.finished = True
        return self.finished

    def _commit_checkpoint(self, gen: Generation, n: int) -> None:
        """Write the parts the voters sent for checkpoint ``n`` (an empty value: a
        data-parallel peer, whose copy is its stage's first member's) and commit it."""
        assert self.checkpoint_dir is not None
        senders = []
        for r, device in enumerate(gen.members[:gen.voters]):
            key = f"ckpt/{n}/{r}"
            part = storeblob.get(gen.store, key)
            if part:
                checkpoint.Parts.write(self.checkpoint_dir, n, device, part)
                senders.append(device)
            storeblob.delete(gen.store, key)
        checkpoint.Parts.commit(self.checkpoint_dir, n, gen.plan, senders,
                                self.keep_checkpoints)
        self.checkpointed = n

    # -- joins -------------------------------------------------------------------------
    def hold(self, step: int | None) -> None:
        """Commit no step from ``step`` on (None: commit again), so that the run stands
        at a step boundary when a device is admitted there (:meth:`at_boundary`). A
        generation that replays from a later step commits from its start."""
        self.held = step

    def at_boundary(self) -> bool:
        """Whether the run stands at the held step boundary: the current generation has
        made every state up to it durable and commits nothing beyond (steps past the
        last replication point before the boundary are replayed after the join)."""
        gen = self.gen
        return (self.held is not None and not self.finished and gen.durable is not None
                and (not gen.points or gen.points[0] > max(self.held, gen.resume)))

    def readmit(self, device: str) -> int:
        """Let ``device``, lost earlier, come back as a fresh process (its incarnation is
        returned, :meth:`executor.ft.control.Coordinator.readmit`); a later
        :meth:`repartition` with ``joined`` naming it admits it."""
        if device not in self.lost:
            raise ValueError(f"device {device} is not lost: it cannot rejoin")
        return self.coordinator.readmit(device)

    def _write_metrics(self, gen: Generation, n: int) -> None:
        """The lines of the committed steps before ``n`` not written yet, and their
        compute per device to the slowdown watch (module docstring, "Metrics"; every
        voter has published its payload)."""
        if self.writer is None and self.slowdown is None:
            self._written = max(self._written, n)
            return
        if self.writer is not None:
            self.writer.layout = RankLayout.from_plan(gen.plan)
        for step in range(self._written, n):
            payloads = [json.loads(gen.store.get(f"metrics/{step}/{r}"))
                        for r in range(gen.voters)]
            if self.slowdown is not None:
                members = list(zip(gen.members, payloads, strict=False))
                self.slowdown.observe(gen.plan, step, {d: p["compute_ms"] for d, p in members},
                                      {d for d, p in members if p.get("overruns")})
            samples = dict(s for p in payloads for s in p.get("samples", []))
            if self.writer is not None:
                self.writer.write_step(step, payloads, {
                    "generation": gen.number, "plan_id": gen.plan.id,
                    "samples": [samples[i] for i in sorted(samples)],
                })
        self._written = max(self._written, n)

    def _settle(self, gen: Generation, n: int) -> None:
        """Steps before ``n`` are durable (never replayed again): delete their
        payloads."""
        for step in range(self._settled, n):
            for r in range(gen.voters):
                gen.store.delete_key(f"metrics/{step}/{r}")
        self._settled = max(self._settled, n)

    # -- recovery ----------------------------------------------------------------------
    def recover(self, failures: Iterable[Failure]) -> dict[str, Any]:
        """Run one recovery for ``failures`` (the coordinator's, all of the current
        generation): abort, fence, kill, re-plan from the last durable state and open
        the next generation (every survivor is a member: :meth:`members_of`). Returns
        the (pending) recovery event; raises
        :class:`RecoveryFailed` when the run cannot go on."""
        failures = list(failures)
        detected_wall = time.time()
        old = self.gen
        if self._pending_event is not None:  # the previous recovery never committed
            self._finish_event(None)
        dead = {f.device: f for f in failures}
        cause = failures[0].cause
        self.coordinator.abort(f"{','.join(dead)} {cause}", fence=list(dead))
        self._await_acknowledgements(dead, [d for d in old.members if d not in dead])
        t_abort = time.time() - detected_wall
        for device in dead:
            self.kill(device)
        self.lost += [d for d in dead if d not in self.lost]
        names = ",".join(dead)
        t_detect = max(self._detect_s(f, detected_wall) for f in dead.values())
        what = f"device {names} {'hung' if cause == 'hang' else 'crashed'}"
        return self._next(cause, names, what, detected_wall, t_detect, t_abort)

    def _await_acknowledgements(self, dead: dict[str, Failure], others: list[str]) -> None:
        """Return once every one of ``others`` has acknowledged the abort
        (``ctl/seen``) or exited, at most ``ABORT_SEEN_S`` after it. A member whose exit
        status arrives meanwhile joins ``dead``, fenced, whether or not it acknowledged
        first: the re-plan has not run yet, so it belongs to the same failure (two
        devices killed at once make one recovery) rather than to a generation opened
        with a dead member. A member declared hung meanwhile is
        not grouped: its silence may be the load of the recovery itself, and the next
        generation watches it afresh. No fixed wait: each look costs one store round
        trip per member not yet settled, every ``ACK_POLL_S``."""
        deadline = time.monotonic() + ABORT_SEEN_S
        pending = list(others)
        while True:
            # read before the poll, so that a member that crashed is among its failures
            # (grouped) before it leaves ``pending``, never only seen exited after it
            gone = [d for d in pending if not self.alive(d)]
            for f in self.coordinator.poll():
                if f.device not in dead and f.cause == "crash":
                    dead[f.device] = f
                    self.coordinator.abort(f"{f.device} {f.cause}", fence=[f.device])
            pending = [d for d in pending if d not in dead and d not in gone]
            seen = self.coordinator.abort_seen(pending)
            pending = [d for d in pending if d not in seen]
            if not pending or time.monotonic() >= deadline:
                return
            time.sleep(ACK_POLL_S)

    def repartition(
        self, cause: str, device: str, *, slowed: Mapping[str, float] | None = None,
        joined: Cluster | None = None,
    ) -> dict[str, Any]:
        """Move to a re-plan for ``slowed`` devices (id -> factor on their slowdown in
        the current plan) or ``joined`` ones (their worker processes started, running
        :class:`executor.ft.generation.RecoveringWorker` with the joined device's id) at the
        next step boundary: abort the current generation (nobody is fenced), re-plan
        from the last durable state and open the next generation with every survivor
        and joined device. ``cause`` (``slow`` | ``join``) and ``device`` go into the
        event. Returns the pending event; raises :class:`RecoveryFailed` when no plan
        fits. A slowdown whose re-plan would run as the current plan does
        (:func:`same_work`) is not re-partitioned: :meth:`_keep`, whose
        ``repartition_skipped`` line is returned instead."""
        detected_wall = time.time()
        for d in joined.devices if joined is not None else ():
            if d.id in self.devices and (d.id not in self.lost or self.coordinator.is_fenced(d.id)):
                why = ("serves the run" if d.id not in self.lost
                       else "was lost and is fenced: readmit it first (Supervisor.readmit)")
                raise InputError("join", "", f"device {d.id!r} {why}; a joining device is new "
                                 "or one lost earlier")
        started = time.perf_counter()
        planned = self._slowed_plan(slowed) if slowed and joined is None else None
        planned_s = time.perf_counter() - started
        if planned is not None and same_work(planned, self.gen.plan):
            assert slowed is not None
            return self._keep(cause, device, slowed, detected_wall, planned_s)
        if self._pending_event is not None:
            self._finish_event(None)
        self.coordinator.abort(f"{device} {cause}")
        if joined is not None:
            ids = [d.id for d in joined.devices]
            self.devices = self.devices + tuple(d for d in ids if d not in self.devices)
            self.lost = [d for d in self.lost if d not in ids]  # a rejoin
            self.held = None
        return self._next(cause, device, f"{cause} of device {device}", detected_wall, 0.0,
                          slowed=slowed, joined=joined, planned=(planned, planned_s))

    def _slowed_plan(self, slowed: Mapping[str, float]) -> Plan | None:
        """The re-plan for ``slowed`` from the last durable state, when that state is
        the current generation's plan (else None, as when no plan fits: the re-partition
        then re-plans and reports as any)."""
        base = self.base[0]
        if base.id != self.gen.plan.id:
            return None
        lost = self._lost_of(base)
        try:
            return replan(base, lost=lost, slowed=self._with_kept(slowed, lost))
        except (UnrecoverableError, InfeasibleError):
            return None

    def _keep(self, cause: str, device: str, slowed: Mapping[str, float],
              detected_wall: float, replan_s: float) -> dict[str, Any]:
        """Skip a re-partition whose plan would be this one (:func:`same_work`): no
        abort, no rebuild, no replay. The factors are kept for the next re-plan and the
        slowdown watch predicts them from now on (executor/ft/slowdown.py,
        "Cool-down"). Returns the ``repartition_skipped`` line (metrics.jsonl)."""
        for d, f in slowed.items():
            self._kept[d] = self._kept.get(d, 1.0) * f
        if self.slowdown is not None:
            self.slowdown.keep(slowed)
        event = {"type": "repartition_skipped", "cause": cause, "device": device,
                 "slowed": dict(slowed), "plan": self.gen.plan.id,
                 "detected_at": detected_wall, "step": self.gen.next_commit,
                 "t_replan_s": replan_s}
        self.skipped.append(event)
        if self.writer is not None:
            self.writer.write_event(event)
        return event

    def _lost_of(self, base: Plan) -> list[str]:
        return [x for x in self.lost if x in {dev.id for dev in base.problem.cluster.devices}]

    def _with_kept(self, slowed: Mapping[str, float] | None,
                   lost: list[str]) -> dict[str, float]:
        """``slowed`` with the factors of skipped re-partitions (:meth:`_keep`) not yet
        in a plan, multiplied in (a lost device's are dropped)."""
        merged = {d: f for d, f in self._kept.items() if d not in lost}
        for d, f in (slowed or {}).items():
            merged[d] = merged.get(d, 1.0) * f
        return merged

    def _next(
        self, cause: str, names: str, what: str, detected_wall: float, t_detect: float,
        t_abort: float = 0.0, slowed: Mapping[str, float] | None = None,
        joined: Cluster | None = None, planned: tuple[Plan | None, float] = (None, 0.0),
    ) -> dict[str, Any]:
        """Re-plan from the last durable state and open the next generation
        (``planned``: that re-plan, already made, and the seconds it took)."""
        old = self.gen
        base, d, fresh = self.base
        lost = self._lost_of(base)
        # only devices outside the base plan were lost (a joined device lost before its
        # first generation's start state was durable): go on under the base plan itself,
        # whose copies every member holds (no migration)
        unchanged = not lost and not slowed and joined is None
        if not unchanged:
            slowed = self._with_kept(slowed, lost)
        if joined is None and set(lost) >= {dev.id for dev in base.problem.cluster.devices}:
            raise RecoveryFailed(
                f"{what} at generation {old.number}; cannot recover: every device of the "
                "run is lost; resume from the last checkpoint (--resume) once devices are "
                "back", names, cause)
        # devices of the cluster that run no process (idle ones the launcher started
        # nothing for): a plan that gives one of them blocks or a replica is re-planned
        # with them lost too
        absent = [x.id for x in base.problem.cluster.devices
                  if x.id not in self.devices and x.id not in lost]
        start = time.perf_counter()
        note = ""
        try:
            ready = planned[0] if planned[0] is not None else base if unchanged else None
            if len(lost) == 1 and not slowed and joined is None:
                ready = self._precomputed.get(base.id, {}).get(lost[0])
            if isinstance(ready, EdgepipeError) and not absent:
                raise ready
            new = ready if isinstance(ready, Plan) else None
            if new is None and not isinstance(ready, EdgepipeError):
                new = replan(base, lost=lost, slowed=slowed, joined=joined)
            if new is None or (absent and _relies_on(new, absent)):
                note = f" ({', '.join(absent)} run(s) no process)"
                if joined is None and len(lost) + len(absent) == len(base.problem.cluster.devices):
                    raise UnrecoverableError(
                        "no device that runs a process is left", (), tuple(lost))
                new = replan(base, lost=lost + absent, slowed=slowed, joined=joined)
        except (UnrecoverableError, InfeasibleError) as exc:
            raise RecoveryFailed(
                f"{what} at generation {old.number}; cannot recover: "
                f"{str(exc).splitlines()[0]}{note}", names, cause,
            ) from None
        t_replan = time.perf_counter() - start + planned[1]
        if not unchanged:
            self._kept = {}  # in the new plan now
        path = self.plans_dir / f"{new.id}.json"
        self.plans_dir.mkdir(parents=True, exist_ok=True)
        save_plan(new, path)
        migration: list[dict[str, Any]] = [] if fresh or unchanged else [
            {"to": t.to, "source": t.source, "first": t.first, "end": t.end,
             "bytes": t.bytes} for t in new.migration
        ]
        members = self.members_of(new)
        self._discard_checkpoint_parts(old)
        g = self.coordinator.open_generation(members)
        if self.writer is not None:  # the replayed steps' lines go (module docstring)
            self.writer.rollback(d)
        self._written = d
        self.gen = self._open(g, new, str(path), d, fresh=fresh, migration=migration)
        moved = [t for t in migration if t["source"] != t["to"]]
        event = {
            "type": "recovery", "generation": g, "detected_at": detected_wall,
            "cause": cause, "device": names, "old_plan": old.plan.id, "new_plan": new.id,
            "replay_from_step": d,
            "blocks_moved": sum(t["end"] - t["first"] for t in moved),
            "bytes_moved": sum(t["bytes"] for t in moved),
            "t_detect_s": t_detect, "t_abort_s": t_abort, "t_replan_s": t_replan,
            "t_rebuild_s": None,
            "t_restore_s": None, "t_first_commit_s": None,
        }
        if (warning := unreplicated(new, members)) is not None:
            event["warning"] = warning
        self._pending_event = event
        self._detected_wall = detected_wall
        return event

    def _detect_s(self, failure: Failure, detected_wall: float) -> float:
        key = f"ctl/fault/{failure.device}"
        if self.store.check([key]):
            return max(0.0, detected_wall - float(self.store.get(key)))
        return failure.silent_s

    def _event_phases(self, gen: Generation) -> None:
        event = self._pending_event
        assert event is not None
        if event["t_rebuild_s"] is None and gen.all_wrote("rebuilt", everyone=True):
            event["t_rebuild_s"] = max(gen.times("rebuilt")) - gen.opened_wall
        if event["t_restore_s"] is None and gen.all_wrote("restored", everyone=True):
            event["t_restore_s"] = max(gen.times("restored")) - max(gen.times("rebuilt"))

    def _finish_event(self, committed_wall: float | None) -> None:
        event = self._pending_event
        assert event is not None
        if event["generation"] == self.gen.number:
            self._event_phases(self.gen)
        if committed_wall is not None:
            event["t_first_commit_s"] = committed_wall - self._detected_wall
        self._pending_event = None
        self.events.append(event)
        if self.writer is not None:
            self.writer.write_event(event)
