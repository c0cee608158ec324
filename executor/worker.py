"""The worker: one process per plan device, the same under the local launcher and torchrun.

``python -m executor.worker plan.json --steps N [--out DIR] [--deterministic]
[--dataset NAME] [--timeout S] [--save-weights]`` reads ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the
environment (torchrun sets them); the local launcher calls :func:`run` directly in each
spawned child. Rank ``r`` runs plan device ``r`` in :mod:`executor.core.layout` order (stage
by stage, the plan's device order within a stage); ``EDGEPIPE_DEVICE``, when set, must
name that device (a guard against a mis-ordered multi-host start).
``--emulate [--time-scale K]`` runs with :mod:`executor.core.emulation`'s hooks;
``--checkpoint-every N [--checkpoint-dir DIR]`` saves and ``--resume DIR`` continues a
run with :mod:`executor.ft.checkpoint` (``--steps`` counts from step 0 either way).
``--heartbeat S`` (the local launcher sets it; off under torchrun, which has no
coordinator yet) starts a :class:`executor.ft.control.WorkerControl` on its own store
connection that beats every S seconds; the rank checks it before every action, at the
start of every step and after every commit, and stops (exit status 2) when the launcher
aborted its generation or fenced its device.

Sequence: refuse a mismatched start (world size vs plan devices) before touching the
network; connect to the run's store (hosted by the launcher, by torchrun's agent when
``TORCHELASTIC_USE_AGENT_STORE=True``, else by rank 0) under the generation's prefix
``gen<G>`` (:func:`executor.ft.control.generation_store`); build and check the stage's
blocks; init the process group (gloo, or nccl when every local rank has its own GPU)
with a short timeout; create every stage's
data-parallel group; discover boundary shapes; then per step: read the step's rows,
:meth:`StageRuntime.run_step`, **commit** (publish the step's payload and
``commit/<rank>``; rank 0 writes the metrics); after the final barrier ``done/<rank>``.
A failing worker publishes ``error/<rank>`` (one line) before it exits, so the launcher
can name it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

# torch logs every failed store or socket operation (a dead peer, a lost coordinator) as a
# C++ warning with dozens of lines of C++ frames, from whichever thread made the call, in
# no order with this rank's own one-line error; it reads the level once, when it loads.
# A user's own TORCH_CPP_LOG_LEVEL (WARNING or INFO, to see them) is kept; the launcher's
# children inherit this one.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import numpy as np
import torch
import torch.distributed as dist
from edgepipe.executor.core import data, storeblob
from edgepipe.executor.core.comm import StageGroup, StageLinks, Transport
from edgepipe.executor.core.emulation import EmulatedSlowdown, Emulation
from edgepipe.executor.core.layout import RankInfo, RankLayout, check_runnable
from edgepipe.executor.core.metrics import MetricsWriter, rank_payload
from edgepipe.executor.core.runtime import ComputeHook, StageRuntime, make_optimizer
from edgepipe.executor.core.stage import build_stage, stage_loss
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.control import (
    CoordinatorLost,
    GenerationAborted,
    WorkerControl,
    generation_store,
)
from edgepipe.executor.ft.faults import Injector
from edgepipe.executor.ft.faults import parse as parse_faults
from edgepipe.executor.ft.recovery import replication_points
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
from edgepipe.planner.errors import EdgepipeError, InputError, PlanMismatchError, UnrecoverableError
from edgepipe.planner.plan import Plan, load_plan, plan_from_dict, replica_placement
from edgepipe.planner.replan.replicas import RING
from edgepipe.planner.schedule import Action, ActionType
from edgepipe.planner.schedule import build as build_schedule
from edgepipe.planner.timeouts import GLOO_TIMEOUT_S

#: exit status of a worker that refused or failed with an edgepipe error
EXIT_REFUSED = 2
#: exit status of a worker that failed otherwise
EXIT_FAILED = 1
#: store timeout of the heartbeat connection: a lost coordinator is noticed after about
#: three of them (the store client's reconnection attempts, executor.ft.control)
CONTROL_STORE_TIMEOUT_S = 10.0
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


def check_world(layout: RankLayout, world_size: int, rank: int) -> None:
    """Refuse a start whose ranks do not match the plan's devices."""
    devices = [r.device for r in layout.ranks]
    if world_size != layout.world_size:
        raise PlanMismatchError(
            f"the plan runs on {layout.world_size} devices ({', '.join(devices)}) but "
            f"{world_size} ranks were started; start exactly {layout.world_size} (torchrun: "
            "--nnodes x --nproc-per-node)"
        )
    if not 0 <= rank < world_size:
        raise PlanMismatchError(f"rank {rank} is outside 0..{world_size - 1}")
    expected = os.environ.get("EDGEPIPE_DEVICE")
    if expected and expected != devices[rank]:
        raise PlanMismatchError(
            f"rank {rank} runs plan device {devices[rank]!r} but EDGEPIPE_DEVICE says "
            f"{expected!r}; order the hosts so that rank r runs the r-th plan device "
            f"(order: {', '.join(devices)})"
        )


def _device(endpoint: Endpoint) -> tuple[torch.device, str]:
    if torch.cuda.is_available() and torch.cuda.device_count() >= endpoint.local_world_size:
        return torch.device("cuda", endpoint.local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def stage_shapes(
    store: dist.Store, layout: RankLayout, me: RankInfo, module: torch.nn.Sequential,
    rows: data.Rows, device: torch.device,
) -> tuple[dict[int, tuple[int, ...]], dict[int, torch.dtype]]:
    """Per-sample output shape and dtype of every stage up to and including ``me``'s,
    published on ``store`` by each stage's first device."""
    p = me.stage
    shapes: dict[int, tuple[int, ...]] = {}
    dtypes: dict[int, torch.dtype] = {}
    if p == 0:
        x = rows.sample_input().to(device)
    else:
        prev = json.loads(store.get(f"shape/{p - 1}"))
        shapes[p - 1], dtypes[p - 1] = tuple(prev["shape"]), _dtype(prev["dtype"])
        x = torch.zeros((1, *shapes[p - 1]), dtype=dtypes[p - 1], device=device)
    if me.index == 0 and p + 1 < layout.num_stages:
        module.eval()
        with torch.no_grad():
            out = module(x)
        module.train()
        store.set(f"shape/{p}", json.dumps({"shape": list(out.shape[1:]), "dtype": str(out.dtype)}))
    if p + 1 < layout.num_stages:
        mine = json.loads(store.get(f"shape/{p}"))
        shapes[p], dtypes[p] = tuple(mine["shape"]), _dtype(mine["dtype"])
    return shapes, dtypes


def save_weights(
    opts: WorkerOptions, plan: Plan, me: RankInfo, rank: int, module: torch.nn.Sequential,
    optimizer: torch.optim.Optimizer,
) -> None:
    """``<out>/weights/rank<r>.pt``: the rank's final weights and optimizer state."""
    assert opts.out is not None
    folder = Path(opts.out) / "weights"
    folder.mkdir(parents=True, exist_ok=True)
    stage = plan.partition.stages[me.stage]
    torch.save(
        {
            "step": opts.steps,
            "device": me.device,
            "stage": me.stage,
            "blocks": [stage.first, stage.end],
            "model": {k: v.cpu() for k, v in module.state_dict().items()},
            "optimizer": optimizer.state_dict(),
        },
        folder / f"rank{rank}.pt",
    )


def load_rows(plan: Plan, opts: WorkerOptions) -> data.Rows:
    """The run's dataset (``--dataset`` or the model's built-in task)."""
    build = plan.problem.model.build
    assert build is not None
    name = opts.dataset or data.default_dataset(build)
    if name is None:
        raise InputError(
            "--dataset", "", f"model {build.describe()} has no built-in task; "
            "give --dataset MODULE:CALLABLE returning a torch Dataset"
        )
    return data.Rows(data.load_dataset(name, build, plan.problem.config.seed))


class MetricsCollector(threading.Thread):
    """Rank 0's metrics thread: waits for every rank's payload of each step in turn
    (blocking store reads on its own connection), merges and writes it, and deletes the
    keys, so the training loop never waits for metrics."""

    def __init__(
        self, store: dist.Store, writer: MetricsWriter, world_size: int, first: int, end: int
    ) -> None:
        super().__init__(name="edgepipe-metrics", daemon=True)
        self.store, self.writer = store, writer
        self.world_size, self.first, self.end = world_size, first, end
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def _get(self, key: str) -> bytes:
        while True:
            try:
                return self.store.get(key)
            except dist.DistStoreError:
                if self._stop_event.is_set():
                    raise
                # a step longer than the store timeout: keep waiting

    def run(self) -> None:
        try:
            for step in range(self.first, self.end):
                keys = [f"metrics/{step}/{r}" for r in range(self.world_size)]
                payloads = [json.loads(self._get(k)) for k in keys]
                self.writer.write_step(step, payloads)
                for k in keys:
                    self.store.delete_key(k)
        except BaseException as exc:
            self.error = exc
        finally:
            self.writer.close()

    def finish(self, timeout_s: float) -> None:
        """Wait for the last step's line (every rank has published it by now unless one
        failed); re-raise the thread's error."""
        self._stop_event.set()
        self.join(timeout_s)
        if self.is_alive():
            raise RuntimeError(f"metrics of the last step did not arrive within {timeout_s} s")
        if self.error is not None:
            raise self.error


class Worker:
    """One rank of a run (see the module docstring)."""

    def __init__(self, opts: WorkerOptions, endpoint: Endpoint, plan: Plan) -> None:
        self.opts, self.endpoint, self.plan = opts, endpoint, plan
        self.layout = RankLayout.from_plan(plan)
        self.rank = endpoint.rank
        self.me = self.layout.ranks[self.rank]
        self.device, self.backend = _device(endpoint)
        self.timeout = timedelta(seconds=opts.timeout_s)
        self.store = self._connect(host=endpoint.host_store)
        self._emulated: Emulation | None = None
        self.control: WorkerControl | None = None
        if opts.heartbeat_s > 0:
            self.control = WorkerControl(
                self._control_store, self.me.device, opts.heartbeat_s
            ).start()

    def _connect(self, host: bool = False) -> dist.Store:
        """A connection to the run's store under this generation's prefix (``host``:
        this process hosts the store)."""
        root = dist.TCPStore(
            self.endpoint.store_host,
            self.endpoint.store_port,
            is_master=host,
            timeout=self.timeout,
            wait_for_workers=False,
        )
        return generation_store(root, self.opts.generation)

    def _control_store(self) -> dist.Store:
        """The heartbeat thread's own connection to the run's store (no prefix: the
        control plane's keys span generations)."""
        return dist.TCPStore(
            self.endpoint.store_host,
            self.endpoint.store_port,
            is_master=False,
            timeout=timedelta(seconds=CONTROL_STORE_TIMEOUT_S),
            wait_for_workers=False,
        )

    def check(self) -> None:
        """Raise if the coordinator aborted this generation, fenced this device or is
        gone (:meth:`WorkerControl.check`); nothing without a control plane."""
        if self.control is not None:
            self.control.check(self.opts.generation)

    def fail(self, message: str) -> None:
        self.store.set(f"error/{self.rank}", message)

    def run(self) -> None:
        plan, layout, me, opts = self.plan, self.layout, self.me, self.opts
        model = plan.problem.model
        assert model.build is not None
        stage_part = plan.partition.stages[me.stage]
        module = build_stage(model, stage_part.first, stage_part.end).to(self.device)
        rows = load_rows(plan, opts)
        dist.init_process_group(
            self.backend,
            store=dist.PrefixStore("pg", self.store),
            rank=self.rank,
            world_size=layout.world_size,
            timeout=self.timeout,
        )
        try:
            self._train(module, rows, stage_loss(model))
        finally:
            dist.destroy_process_group()

    def _groups(self) -> StageGroup | None:
        mine = None
        for members in self.layout.stage_ranks:
            group = dist.new_group(list(members), timeout=self.timeout)
            if self.rank in members:
                mine = StageGroup(group, members, raw=False)
        if mine is not None and len(self.layout.stage_ranks[self.me.stage]) > 1:
            mine.all_reduce(torch.zeros(1, device=self.device))  # connect now (P9)
        return mine

    def _shapes(
        self, module: torch.nn.Sequential, rows: data.Rows
    ) -> tuple[dict[int, tuple[int, ...]], dict[int, torch.dtype]]:
        return stage_shapes(self.store, self.layout, self.me, module, rows, self.device)

    def _train(self, module: torch.nn.Sequential, rows: data.Rows, loss_fn: Any) -> None:
        plan, layout, me, opts = self.plan, self.layout, self.me, self.opts
        config = plan.problem.config
        group = self._groups()
        shapes, dtypes = self._shapes(module, rows)
        links = StageLinks(layout, self.rank, self.transport(), shapes, dtypes, self.device)
        schedule = build_schedule(
            config.schedule, [s.warmup for s in plan.cost.stages], layout.num_micro_batches
        )
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, config.optimizer, config.optimizer_settings())
        # fault injection works here at the forward / backward points only
        faults = Injector(me.device, parse_faults(opts.faults), self.store)
        hook = _FaultHook(self.compute_hook(), faults)
        runtime = StageRuntime(
            module, layout, self.rank, schedule[me.stage], links, group, loss_fn, optimizer,
            deterministic=opts.deterministic, hook=hook, device=self.device,
            check=self.check,
        )
        first, last = me.stage == 0, me.stage == layout.num_stages - 1
        b = layout.micro_batch_size
        stage_part = plan.partition.stages[me.stage]
        ckpt_group = None
        if opts.checkpoint_every or opts.resume:
            ckpt_group = dist.new_group(backend="gloo", timeout=self.timeout)
        start = 0
        if opts.resume:
            start = checkpoint.load(opts.resume, module, optimizer, stage_part.first, plan,
                                    ckpt_group)
        collector = None
        if self.rank == 0 and opts.out:
            writer = MetricsWriter(Path(opts.out), layout, opts.deterministic, append=start > 0)
            collector = MetricsCollector(self._connect(), writer, layout.world_size, start,
                                         opts.steps)
            collector.start()
        dist.barrier()
        for step in range(start, opts.steps):
            self.check()
            idx = data.step_indices(step, layout.global_batch, rows.size, config.seed)
            mine = [idx[m * b + me.offset : m * b + me.offset + me.samples]
                    for m in range(layout.num_micro_batches)]
            inputs = [rows.inputs(i).to(self.device) for i in mine] if first else None
            targets = [rows.targets(i).to(self.device) for i in mine] if last else None
            hook.step = step
            record = runtime.run_step(step, inputs, targets)
            payload = json.dumps(rank_payload(record, self.device))
            self.store.set(f"metrics/{step}/{self.rank}", payload)
            self.store.set(f"commit/{self.rank}", str(step))
            self.check()
            if opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0:
                assert ckpt_group is not None
                folder = checkpoint.folder(opts.checkpoint_dir, opts.out)
                checkpoint.save(folder, step + 1, module, optimizer, stage_part.first, plan,
                                self.rank, ckpt_group)
        if collector is not None:
            collector.finish(self.opts.timeout_s)
        if opts.save_weights and opts.out:
            self._save(module, optimizer)
        dist.barrier()
        # the launcher stops watching this rank's heartbeat: the process's shutdown
        # (interpreter finalisation, > 1 s under load) is not a hang
        self.store.set(f"done/{self.rank}", "1")
        if self.control is not None:
            # stop beating before the interpreter finalises: a daemon thread still in a
            # store call then would abort the process ("terminate called without an
            # active exception", SIGABRT) after its work is done
            self.control.stop()

    def _save(self, module: torch.nn.Sequential, optimizer: torch.optim.Optimizer) -> None:
        save_weights(self.opts, self.plan, self.me, self.rank, module, optimizer)

    # -- hooks for the emulation ---------------------------------------------------------
    def _emulation(self) -> Emulation:
        if self._emulated is None:
            self._emulated = Emulation.for_rank(
                self.plan, self.rank, self.store, self.opts.time_scale, self.opts.out,
                self.opts.emulate_slowdown,
            )
        return self._emulated

    def transport(self) -> Transport:
        """The transport every send and receive goes through (emulated links with
        ``--emulate``)."""
        return self._emulation().transport if self.opts.emulate else Transport()

    def compute_hook(self) -> ComputeHook:
        """Called after every forward / backward / reduce (emulated device speed with
        ``--emulate``)."""
        return self._emulation().hook if self.opts.emulate else ComputeHook()



class RecoveringWorker:
    """One device of a recovering run (``WorkerOptions.recover``; docs/fault-tolerance.md,
    "Recovery"): the same process serves generation after generation.

    Per generation ``g`` (published by the coordinator as ``gen<g>/start``: the plan, its
    members in rank order, the step ``d`` to replay from, the migration), a training
    thread builds raw gloo groups on ``PrefixStore(gen<g>)`` (P4; warmed at once, P9),
    restores the state of step ``d`` (own copies, then the migration's transfers), posts
    a replication of it and runs steps ``d .. steps-1``: compute, **vote**
    ``vote/<t>/<rank>``, wait for the coordinator's ``commit/<t>``, apply the optimizer
    step, replicate every ``replication_interval`` steps (and after the last one),
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
        self.device, _ = _device(endpoint)
        self.rows = load_rows(plan, opts)
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
        self.interval = self.plan.problem.config.replication_interval
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

    def run(self) -> None:
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("pg", self.store), self.rank,
                                        len(self.members), self.timeout)
        self.pg.allreduce(torch.zeros(1)).wait()  # connect now (P9)
        # the replicas travel in the background, beside the next step's activations: on
        # their own group (own connections; a failed op there cannot disturb the step's)
        self.rpg = dist.ProcessGroupGloo(dist.PrefixStore("repl", self.store), self.rank,
                                         len(self.members), self.timeout)
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

        for n in replication_points(d, self.opts.steps, self.interval):
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
        model = plan.problem.model
        config = plan.problem.config
        members = self.layout.stage_ranks[me.stage]
        group = None
        if len(members) > 1:
            raw = dist.ProcessGroupGloo(dist.PrefixStore(f"stage{me.stage}", self.store),
                                        members.index(self.rank), len(members), self.timeout)
            group = StageGroup(raw, members, raw=True)
            group.all_reduce(torch.zeros(1))
        self._stamp("rebuilt")
        d = int(self.record["resume"])
        if self.g > 1:
            self.w.faults.at(d, "restore")
        stage = plan.partition.stages[me.stage]
        self.first = stage.first
        module = build_stage(model, stage.first, stage.end).to(self.w.device)
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, config.optimizer, config.optimizer_settings())
        if not self.record["fresh"]:
            install(module, stage.first, optimizer, self._restore(d, stage.first, stage.end))
        elif opts.resume:  # the run's start state is the checkpoint's
            checkpoint.load(opts.resume, module, optimizer, stage.first, plan, None)
        self._stamp("restored")
        shapes, dtypes = stage_shapes(self.store, self.layout, me, module, self.w.rows,
                                      self.w.device)
        emulation = (Emulation.for_rank(plan, self.rank, self.store, opts.time_scale, opts.out,
                                        opts.emulate_slowdown, self.pg, first_step=d,
                                        spares=tuple(self.members[self.layout.world_size:]))
                     if opts.emulate else None)
        self.emulation = emulation
        transport = emulation.transport if emulation else Transport(self.pg)
        links = StageLinks(self.layout, self.rank, transport, shapes, dtypes, self.w.device)
        schedule = build_schedule(
            config.schedule, [s.warmup for s in plan.cost.stages], self.layout.num_micro_batches
        )
        hook = _FaultHook(emulation.hook if emulation else ComputeHook(), self.w.faults,
                          self._await_durable)
        runtime = StageRuntime(
            module, self.layout, self.rank, schedule[me.stage], links, group,
            stage_loss(model), optimizer, deterministic=opts.deterministic, hook=hook,
            device=self.w.device, check=self.check,
        )
        self.module, self.optimizer = module, optimizer
        # point p's background half runs beside the steps until the one whose commit
        # makes the point after it (docs/fault-tolerance.md, "Points in flight")
        points = replication_points(d, opts.steps, self.interval)
        successor = dict(itertools.pairwise(points))
        point, copied = d, threading.Event()
        pending: Background | None = Background(f"replicate-{d}", self._replicate(d, copied))
        first, last = me.stage == 0, me.stage == self.layout.num_stages - 1
        b = self.layout.micro_batch_size
        joined: int | None = None
        for step in range(d, opts.steps):
            self.check()
            idx = data.step_indices(step, self.layout.global_batch, self.w.rows.size,
                                    config.seed)
            mine = [idx[m * b + me.offset : m * b + me.offset + me.samples]
                    for m in range(self.layout.num_micro_batches)]
            inputs = [self.w.rows.inputs(i).to(self.w.device) for i in mine] if first else None
            targets = [self.w.rows.targets(i).to(self.w.device) for i in mine] if last else None
            hook.step = step
            record = runtime.compute(step, inputs, targets)
            # the point in flight must be complete (own copy, sends, held replicas,
            # acknowledged) before this rank votes the step whose commit makes the next
            blocked_s, background_s = 0.0, 0.0
            acked: dict[str, float | int] = {}
            if pending is not None and successor.get(point) == step + 1:
                blocked_s, background_s = pending.join(self.check), pending.seconds
                acked = {"replication_point": point,
                         "replication_acked_at": pending.finished_at or 0.0}
                joined, pending = point, None
            self.store.set(f"vote/{step}/{self.rank}", "1")
            self._wait_key(f"commit/{step}")
            if joined is not None:  # this commit says every replica of it is acked
                self.w.copies.promote(self.g, joined)
            if pending is not None:  # its own copy is taken before the optimizer step
                blocked_s += pending.join(self.check, until=copied)
            self.w.faults.at(step, "optimizer")
            self.check()
            runtime.apply(record)
            n = step + 1
            if (opts.checkpoint_every and n % opts.checkpoint_every == 0
                    and n > int(self.record["checkpointed"])):
                # the part goes to the coordinator, which writes and commits it (a
                # replay sends none of a committed one); a data-parallel peer's copy is
                # its stage's first member's
                part = (checkpoint.part_bytes(n, module, optimizer, stage.first,
                                              config.optimizer) if me.index == 0 else b"")
                storeblob.put(self.store, f"ckpt/{n}/{self.rank}", part)
            work = None
            if n in points:
                start = time.perf_counter()
                copied = threading.Event()
                work = self._replicate(n, copied)
                blocked_s += time.perf_counter() - start
            payload = rank_payload(record, self.w.device)
            payload["replication_ms"] = blocked_s * 1e3
            payload["replication_background_ms"] = background_s * 1e3
            payload.update(acked)
            if emulation is not None:  # the slowdown watch's evidence rule
                payload["overruns"] = emulation.hook.step_overruns
            if first:
                payload["samples"] = [[self.layout.positions(self.rank)[k], int(i)]
                                      for k, i in enumerate(np.concatenate(mine))]
            self.store.set(f"metrics/{step}/{self.rank}", json.dumps(payload))
            if work is not None:  # after the metrics: its acknowledgement makes them due
                point, pending = n, Background(f"replicate-{n}", work)
        if pending is not None:
            pending.join(self.check)
        self._wait_key("exit")
        if opts.save_weights and opts.out:
            self._save()
        self.w.finished = True

    def _await_durable(self, step: int) -> None:
        """Return once the replication point ``step`` (steps applied) is durable (every
        member acknowledged it), at once when it is none of this generation's."""
        if step in replication_points(int(self.record["resume"]), self.opts.steps,
                                      self.interval):
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
                   if self.plan.partition.stages[r.stage].devices == (me,)]

        return point_work(
            self.w.copies, self.g, snapshot, self.rpg, holders,
            lambda: self._receive_held(n), lambda: self.w.faults.at(n - 1, "replication"),
            lambda: self.store.set(f"repl/{n}/{self.rank}", "1"),
            announce=lambda: self.store.set(f"posted/{n}/{self.rank}", "1"),
            pace=(lambda h, b: self.emulation.transport.occupy(h, b, check=self.check))
            if self.emulation else lambda h, b: None,
            copied=copied)

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
            if r.holders[0] == self.w.device_id:
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

    def _save(self) -> None:
        assert self.me is not None
        save_weights(self.opts, self.plan, self.me, self.rank, self.module, self.optimizer)


class _FaultHook(ComputeHook):
    """The compute hook with the fault points ``forward`` / ``backward``
    (:mod:`executor.ft.faults`) of the step in :attr:`step`; ``settle(step)`` runs before
    one fires (a recovering run's: when the step is itself a replication point, wait until
    that point is durable; at a step beside which a point travels it fires at once,
    docs/fault-tolerance.md, "Fault injection")."""

    def __init__(self, inner: ComputeHook, faults: Injector,
                 settle: Callable[[int], None] = lambda step: None) -> None:
        self.inner, self.faults, self.step, self.settle = inner, faults, -1, settle

    def after_compute(self, action: Action, real_seconds: float) -> None:
        self.inner.after_compute(action, real_seconds)
        phase = {ActionType.F: "forward", ActionType.B: "backward"}.get(action.type)
        if phase is not None and self.faults.due(self.step, phase):
            self.settle(self.step)
            self.faults.at(self.step, phase)

    def after_reduce(self, action: Action, real_seconds: float) -> None:
        self.inner.after_reduce(action, real_seconds)


def run(opts: WorkerOptions, endpoint: Endpoint) -> None:
    """Run one rank to the end; raises on failure after publishing ``error/<rank>``."""
    torch.set_num_threads(1)
    plan = load_plan(opts.plan)
    check_runnable(plan)
    if opts.device is None:  # a joining device takes its rank from the generation
        check_world(RankLayout.from_plan(plan), endpoint.world_size, endpoint.rank)
    worker = RecoveringWorker(opts, endpoint, plan) if opts.recover else Worker(
        opts, endpoint, plan)
    try:
        try:
            worker.run()
        except dist.DistNetworkError as exc:
            if worker.control is None:
                raise
            # the store is the coordinator's: a broken connection is its loss (P5)
            worker.control.stop()
            raise CoordinatorLost(
                f"the coordinator is unreachable ({str(exc).splitlines()[0][:120]}); "
                "this rank stopped without writing anything, the last committed "
                "checkpoint is intact") from None
        except RuntimeError:
            # across hosts, a gloo error from a peer that stopped (on an abort, or because
            # its own neighbour's host died before the coordinator declared it): report
            # the abort (the cause), which reaches the heartbeat thread within the
            # coordinator's hang timeout plus a beat, shorter than the data-plane timeout
            # (the local launcher names the culprit itself)
            if worker.control is not None and opts.coordinator:
                deadline = time.monotonic() + opts.timeout_s
                while time.monotonic() < deadline:
                    worker.control.check(opts.generation)
                    time.sleep(worker.control.interval_s)
            raise
    except BaseException as exc:
        message = str(exc) if isinstance(exc, EdgepipeError) else f"{type(exc).__name__}: {exc}"
        # when the store is gone too, the exit status still tells
        with contextlib.suppress(Exception):
            worker.fail(message.splitlines()[0] if message else type(exc).__name__)
        raise
    # the heartbeat thread is a daemon: it beats until the process is gone (stopping it
    # earlier would make a slow interpreter shutdown look like a hang)


#: what gloo's messages say when the other end of a pair went away (a killed peer, or
#: one the launcher stopped): reported in one line, the launcher names the culprit
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def spawned(opts: WorkerOptions, endpoint: Endpoint) -> None:
    """Entry point of a process started by the local launcher: exit status 0 on success,
    2 for an edgepipe error, 1 otherwise: one line when a peer's connection broke (the
    launcher's own error names the device that failed), else the traceback on
    stderr (a bug)."""
    status = 0
    try:
        run(opts, endpoint)
    except EdgepipeError as exc:
        _line(f"edgepipe worker {endpoint.rank}: {exc}")
        status = EXIT_REFUSED
    except BaseException as exc:
        status = _failed(str(endpoint.rank), exc)
    _leave_if_recovering(opts, status)
    sys.exit(status)


def _peer_gone(exc: BaseException) -> str | None:
    """What gloo says when ``exc`` is the other end of a pair going away, else None."""
    if isinstance(exc, RuntimeError):
        return next((s for s in PEER_GONE if s in str(exc)), None)
    return None


def _failed(rank: str, exc: BaseException) -> int:
    """Report a worker's failure on stderr: one line when a peer's connection broke (the
    launcher's or the coordinator's error names the device that failed), else the
    traceback (a bug); the exit status."""
    if (gone := _peer_gone(exc)) is not None:
        _line(f"edgepipe worker {rank}: stopped, a peer's connection broke "
              f"({gone.lower()}); the launcher's error names the device that failed")
    else:
        traceback.print_exc()
    return EXIT_FAILED


def _line(text: str) -> None:
    """``text`` and its newline on stderr in one write, so that the lines of workers
    sharing the launcher's stderr do not interleave."""
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), f"{text}\n".encode())


def _leave_if_recovering(opts: WorkerOptions, status: int) -> None:
    """End a recovering worker's process with ``status`` now, without finalising the
    interpreter: a training thread abandoned by a recovery may still be blocked in a
    gloo op (P6), and finalising under it aborts the process (SIGABRT, "terminate
    called without an active exception"); every file this rank wrote is closed."""
    if opts.recover:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def endpoint_from_env() -> Endpoint:
    """The endpoint torchrun (or any env:// launcher) describes."""
    env = os.environ
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise InputError(
            "environment", "", f"{', '.join(missing)} not set; start the worker with torchrun "
            "(or use `edgepipe run`, which starts the workers itself)"
        )
    rank = int(env["RANK"])
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    return Endpoint(
        rank=rank,
        world_size=int(env["WORLD_SIZE"]),
        store_host=env["MASTER_ADDR"],
        store_port=int(env["MASTER_PORT"]),
        host_store=not agent_store and rank == 0,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
    )


def parse_args(argv: Sequence[str] | None = None) -> WorkerOptions:
    p = argparse.ArgumentParser(prog="python -m executor.worker", description=__doc__)
    p.add_argument("plan")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--dataset")
    p.add_argument("--timeout", type=float, default=GLOO_TIMEOUT_S)
    p.add_argument("--save-weights", action="store_true")
    p.add_argument("--generation", type=int, default=0)
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--resume")
    p.add_argument("--heartbeat", type=float, default=0.0)
    p.add_argument("--emulate-slowdown", type=EmulatedSlowdown.parse, action="append",
                   default=[])
    p.add_argument("--coordinator", help="HOST:PORT of `edgepipe coordinate` (its store "
                   "and control plane instead of torchrun's agent store)")
    p.add_argument("--join", metavar="FILE[@STEP]", help="with --coordinator, outside the "
                   "torchrun job: join the running job as the one device of cluster file "
                   "FILE (a new device, or one lost earlier) at the next step boundary, not "
                   "before STEP (executor/ft/joins.py)")
    p.add_argument("--standby", metavar="DEV", help="with --coordinator, outside the "
                   "torchrun job: run idle device DEV as a standby of a one-device plan "
                   "(the coordinator's --standbys; executor/ft/coordinator.py)")
    a = p.parse_args(argv)
    return WorkerOptions(a.plan, a.steps, a.out, a.deterministic, a.dataset, a.timeout,
                         a.save_weights, a.generation, a.emulate, a.time_scale,
                         a.checkpoint_every, a.checkpoint_dir, a.resume, a.heartbeat,
                         tuple(a.emulate_slowdown), device=a.standby,
                         coordinator=a.coordinator, join=a.join)


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    status = 0
    try:
        if opts.join or opts.device:
            # not a torchrun rank: the coordinator's store, a rank from the generation
            flag = "--join" if opts.join else "--standby"
            if opts.join and opts.device:
                raise InputError("--standby", "", "a worker either joins (--join) or "
                                 "stands by (--standby); give one of them")
            if not opts.coordinator:
                raise InputError(flag, "", "needs --coordinator HOST:PORT (the running "
                                 "job's coordinator admits the device)")
            endpoint = Endpoint(0, 1, "", 0)
        else:
            endpoint = endpoint_from_env()
        if opts.coordinator:
            from edgepipe.executor.ft.coordinator import join

            opts, endpoint = join(opts, endpoint, opts.coordinator)
        run(opts, endpoint)
    except EdgepipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = EXIT_REFUSED
    except BaseException as exc:
        if not opts.recover and _peer_gone(exc) is None:
            raise
        status = _failed(os.environ.get("RANK", "?"), exc)
    _leave_if_recovering(opts, status)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
