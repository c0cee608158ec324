"""The worker: one process per plan device, the same under the local launcher and torchrun.

``python -m executor.worker plan.json --steps N [--out DIR] [--deterministic]
[--dataset NAME] [--timeout S] [--save-weights]`` reads ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the
environment (torchrun sets them); the local launcher calls :func:`run` directly in each
spawned child. Rank ``r`` runs plan device ``r`` in :mod:`executor.layout` order (stage
by stage, the plan's device order within a stage); ``EDGEPIPE_DEVICE``, when set, must
name that device (a guard against a mis-ordered multi-host start).
``--emulate [--time-scale K]`` runs with :mod:`executor.emulation`'s hooks;
``--checkpoint-every N [--checkpoint-dir DIR]`` saves and ``--resume DIR`` continues a
run with :mod:`executor.checkpoint` (``--steps`` counts from step 0 either way).
``--heartbeat S`` (the local launcher sets it; off under torchrun, which has no
coordinator yet) starts a :class:`executor.control.WorkerControl` on its own store
connection that beats every S seconds; the rank checks it before every action, at the
start of every step and after every commit, and stops (exit status 2) when the launcher
aborted its generation or fenced its device.

Sequence: refuse a mismatched start (world size vs plan devices) before touching the
network; connect to the run's store (hosted by the launcher, by torchrun's agent when
``TORCHELASTIC_USE_AGENT_STORE=True``, else by rank 0) under the generation's prefix
``gen<G>`` (:func:`executor.control.generation_store`); build and check the stage's
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
import json
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor import checkpoint, data
from executor.comm import StageGroup, StageLinks, Transport
from executor.control import WorkerControl, generation_store
from executor.emulation import EmulatedSlowdown, Emulation
from executor.layout import RankLayout, check_runnable
from executor.metrics import MetricsWriter, rank_payload
from executor.runtime import ComputeHook, StageRuntime, make_optimizer
from executor.stage import build_stage, stage_loss
from planner.errors import EdgepipeError, InputError, PlanMismatchError
from planner.plan import Plan, load_plan
from planner.schedule import build as build_schedule

#: exit status of a worker that refused or failed with an edgepipe error
EXIT_REFUSED = 2
#: exit status of a worker that failed otherwise
EXIT_FAILED = 1
#: store timeout of the heartbeat connection: a lost coordinator is noticed after about
#: three of them (the store client's reconnection attempts, executor.control)
CONTROL_STORE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WorkerOptions:
    """What to run; the same for every rank."""

    plan: str
    steps: int
    out: str | None = None
    deterministic: bool = False
    dataset: str | None = None
    timeout_s: float = 60.0
    save_weights: bool = False
    generation: int = 0
    emulate: bool = False
    time_scale: float = 1.0
    checkpoint_every: int = 0
    checkpoint_dir: str | None = None
    resume: str | None = None
    heartbeat_s: float = 0.0
    #: with ``emulate``: devices that slow down mid-run (executor/emulation.py)
    emulate_slowdown: tuple[EmulatedSlowdown, ...] = ()


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
        dataset_name = opts.dataset or data.default_dataset(model.build)
        if dataset_name is None:
            raise InputError(
                "--dataset", "", f"model {model.build.describe()} has no built-in task; "
                "give --dataset MODULE:CALLABLE returning a torch Dataset"
            )
        config = plan.problem.config
        rows = data.Rows(data.load_dataset(dataset_name, model.build, config.seed))
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
        """Per-sample output shape and dtype of every stage up to and including ours,
        published on the store by each stage's first device."""
        p = self.me.stage
        shapes: dict[int, tuple[int, ...]] = {}
        dtypes: dict[int, torch.dtype] = {}
        if p == 0:
            x = rows.sample_input().to(self.device)
        else:
            prev = json.loads(self.store.get(f"shape/{p - 1}"))
            shapes[p - 1], dtypes[p - 1] = tuple(prev["shape"]), _dtype(prev["dtype"])
            x = torch.zeros((1, *shapes[p - 1]), dtype=dtypes[p - 1], device=self.device)
        if self.me.index == 0 and p + 1 < self.layout.num_stages:
            module.eval()
            with torch.no_grad():
                out = module(x)
            module.train()
            self.store.set(
                f"shape/{p}", json.dumps({"shape": list(out.shape[1:]), "dtype": str(out.dtype)})
            )
        if p + 1 < self.layout.num_stages:
            mine = json.loads(self.store.get(f"shape/{p}"))
            shapes[p], dtypes[p] = tuple(mine["shape"]), _dtype(mine["dtype"])
        return shapes, dtypes

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
        runtime = StageRuntime(
            module, layout, self.rank, schedule[me.stage], links, group, loss_fn, optimizer,
            deterministic=opts.deterministic, hook=self.compute_hook(), device=self.device,
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
            record = runtime.run_step(step, inputs, targets)
            payload = json.dumps(rank_payload(record, self.device))
            self.store.set(f"metrics/{step}/{self.rank}", payload)
            self.store.set(f"commit/{self.rank}", str(step))
            self.check()
            if opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0:
                assert ckpt_group is not None
                folder = opts.checkpoint_dir or str(Path(opts.out or ".") / "checkpoints")
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
        folder = Path(self.opts.out) / "weights"
        folder.mkdir(parents=True, exist_ok=True)
        stage = self.plan.partition.stages[self.me.stage]
        torch.save(
            {
                "step": self.opts.steps,
                "device": self.me.device,
                "stage": self.me.stage,
                "blocks": [stage.first, stage.end],
                "model": {k: v.cpu() for k, v in module.state_dict().items()},
                "optimizer": optimizer.state_dict(),
            },
            folder / f"rank{self.rank}.pt",
        )

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


def run(opts: WorkerOptions, endpoint: Endpoint) -> None:
    """Run one rank to the end; raises on failure after publishing ``error/<rank>``."""
    torch.set_num_threads(1)
    plan = load_plan(opts.plan)
    check_runnable(plan)
    check_world(RankLayout.from_plan(plan), endpoint.world_size, endpoint.rank)
    worker = Worker(opts, endpoint, plan)
    try:
        worker.run()
    except BaseException as exc:
        message = str(exc) if isinstance(exc, EdgepipeError) else f"{type(exc).__name__}: {exc}"
        # when the store is gone too, the exit status still tells
        with contextlib.suppress(Exception):
            worker.fail(message.splitlines()[0] if message else type(exc).__name__)
        raise
    # the heartbeat thread is a daemon: it beats until the process is gone (stopping it
    # earlier would make a slow interpreter shutdown look like a hang)


def spawned(opts: WorkerOptions, endpoint: Endpoint) -> None:
    """Entry point of a process started by the local launcher: exit status 0 on success,
    2 for an edgepipe error, 1 otherwise (with the traceback on stderr)."""
    try:
        run(opts, endpoint)
    except EdgepipeError as exc:
        print(f"edgepipe worker {endpoint.rank}: {exc}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    except BaseException:
        traceback.print_exc()
        sys.exit(EXIT_FAILED)


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
    p.add_argument("--timeout", type=float, default=60.0)
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
    a = p.parse_args(argv)
    return WorkerOptions(a.plan, a.steps, a.out, a.deterministic, a.dataset, a.timeout,
                         a.save_weights, a.generation, a.emulate, a.time_scale,
                         a.checkpoint_every, a.checkpoint_dir, a.resume, a.heartbeat,
                         tuple(a.emulate_slowdown))


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        run(opts, endpoint_from_env())
    except EdgepipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
