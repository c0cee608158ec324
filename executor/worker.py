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
data-parallel group; discover boundary shapes (:mod:`executor.core.build`); then the
one training loop (:func:`executor.core.loop.run_steps`) with this run's hooks: after each
step's payload, **commit** (``commit/<rank>``; rank 0's
:class:`~executor.core.collector.MetricsCollector` writes the metrics) and, every
``--checkpoint-every`` steps, a DCP checkpoint; after the final barrier ``done/<rank>``.
A failing worker publishes ``error/<rank>`` (one line) before it exits, so the launcher
can name it. A recovering run (``WorkerOptions.recover``) runs the same loop with the
recovery's hooks instead (:class:`executor.ft.generation.RecoveringWorker`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

# torch logs every failed store or socket operation (a dead peer, a lost coordinator) as a
# C++ warning with dozens of lines of C++ frames, from whichever thread made the call, in
# no order with this rank's own one-line error; it reads the level once, when it loads.
# A user's own TORCH_CPP_LOG_LEVEL (WARNING or INFO, to see them) is kept; the launcher's
# children inherit this one.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

import torch
import torch.distributed as dist
from edgepipe.executor.core import data
from edgepipe.executor.core.build import (
    load_rows,
    save_weights,
    stage_optimizer,
    stage_runtime,
    stage_shapes,
    torch_device,
)
from edgepipe.executor.core.collector import MetricsCollector
from edgepipe.executor.core.comm import StageGroup, StageLinks, Transport
from edgepipe.executor.core.emulation import EmulatedSlowdown, Emulation
from edgepipe.executor.core.layout import RankLayout, check_runnable
from edgepipe.executor.core.loop import Feed, StepHooks, run_steps
from edgepipe.executor.core.metrics import MetricsWriter
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.core.runtime import ComputeHook
from edgepipe.executor.core.stage import build_stage
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.control import CoordinatorLost, WorkerControl, generation_store
from edgepipe.executor.ft.faults import FaultHook, Injector
from edgepipe.executor.ft.faults import parse as parse_faults
from edgepipe.executor.ft.generation import RecoveringWorker
from edgepipe.planner.cli.args import KEEP_CHECKPOINTS, positive_int
from edgepipe.planner.errors import EdgepipeError, InputError, PlanMismatchError
from edgepipe.planner.plan import Plan, load_plan
from edgepipe.planner.timeouts import GLOO_TIMEOUT_S

#: exit status of a worker that refused or failed with an edgepipe error
EXIT_REFUSED = 2
#: exit status of a worker that failed otherwise
EXIT_FAILED = 1
#: store timeout of the heartbeat connection: a lost coordinator is noticed after about
#: three of them (the store client's reconnection attempts, executor.ft.control)
CONTROL_STORE_TIMEOUT_S = 10.0


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


class Worker:
    """One rank of a run (see the module docstring)."""

    def __init__(self, opts: WorkerOptions, endpoint: Endpoint, plan: Plan) -> None:
        self.opts, self.endpoint, self.plan = opts, endpoint, plan
        self.layout = RankLayout.from_plan(plan)
        self.rank = endpoint.rank
        self.me = self.layout.ranks[self.rank]
        self.device, self.backend = torch_device(endpoint)
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
            self._train(module, rows)
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

    def _train(self, module: torch.nn.Sequential, rows: data.Rows) -> None:
        plan, layout, me, opts = self.plan, self.layout, self.me, self.opts
        group = self._groups()
        shapes, dtypes = stage_shapes(self.store, layout, me, module, rows, self.device)
        links = StageLinks(layout, self.rank, self.transport(), shapes, dtypes, self.device)
        optimizer = stage_optimizer(module, plan)
        # fault injection works here at the forward / backward points only
        faults = Injector(me.device, parse_faults(opts.faults), self.store)
        hook = FaultHook(self.compute_hook(), faults)
        runtime = stage_runtime(plan, layout, self.rank, module, optimizer, links, group, hook,
                                self.device, self.check, opts.deterministic,
                                opts.recv_ahead)
        first_block = plan.partition.stages[me.stage].first
        ckpt_group = None
        if opts.checkpoint_every or opts.resume:
            ckpt_group = dist.new_group(backend="gloo", timeout=self.timeout)
        start = 0
        if opts.resume:
            start = checkpoint.load(opts.resume, module, optimizer, first_block, plan,
                                    ckpt_group)
        collector = None
        if self.rank == 0 and opts.out:
            writer = MetricsWriter(Path(opts.out), layout, opts.deterministic, append=start > 0)
            collector = MetricsCollector(self._connect(), writer, layout.world_size, start,
                                         opts.steps)
            collector.start()
        dist.barrier()
        feed = Feed(layout, me, rows, self.device, plan.problem.config.seed)
        hooks = _PlainSteps(self, hook, checkpoint.Dcp(ckpt_group), module, optimizer,
                            first_block)
        run_steps(start, opts.steps, runtime, feed, self.store, hooks)
        if collector is not None:
            collector.finish(self.opts.timeout_s)
        if opts.save_weights and opts.out:
            save_weights(opts, plan, me, self.rank, module, optimizer)
        dist.barrier()
        # the launcher stops watching this rank's heartbeat: the process's shutdown
        # (interpreter finalisation, > 1 s under load) is not a hang
        self.store.set(f"done/{self.rank}", "1")
        if self.control is not None:
            # stop beating before the interpreter finalises: a daemon thread still in a
            # store call then would abort the process ("terminate called without an
            # active exception", SIGABRT) after its work is done
            self.control.stop()

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


class _PlainSteps(StepHooks):
    """A plain run's hooks of the one loop (:mod:`executor.core.loop`): its fault points;
    after each step's metrics its commit key ``commit/<rank>``, a control check and,
    every ``--checkpoint-every`` steps, a DCP checkpoint (collective,
    :meth:`executor.ft.checkpoint.Dcp.save`)."""

    def __init__(self, worker: Worker, faults: FaultHook, layout: checkpoint.Dcp,
                 module: torch.nn.Sequential, optimizer: torch.optim.Optimizer,
                 first_block: int) -> None:
        self.w, self.faults, self.layout = worker, faults, layout
        self.module, self.optimizer, self.first_block = module, optimizer, first_block

    def before_compute(self, step: int) -> None:
        self.faults.step = step

    def after_metrics(self, step: int) -> None:
        w, opts = self.w, self.w.opts
        w.store.set(f"commit/{w.rank}", str(step))
        w.check()
        if opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0:
            self.layout.save(checkpoint.folder(opts.checkpoint_dir, opts.out), step + 1,
                             self.module, self.optimizer, self.first_block, w.plan, w.rank,
                             opts.keep_checkpoints)


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
    stderr (a bug). Ctrl-C reaches the terminal's whole process group: a worker then
    exits 130 without a word, the launcher stops the others and says the one line."""
    status = exit_status(lambda: run(opts, endpoint), endpoint.rank,
                         f"edgepipe worker {endpoint.rank}")
    _leave_if_recovering(opts, status)
    sys.exit(status)


def exit_status(train: Callable[[], None], rank: int, who: str) -> int:
    """Run ``train`` and map its end to a spawned process's exit status: 0; 2 for an
    edgepipe error (one line, ``who: message``); 130 on Ctrl-C, without a word; else
    :func:`_failed`'s (one line for a broken peer, the traceback for a bug)."""
    try:
        train()
    except EdgepipeError as exc:
        _line(f"{who}: {exc}")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        return _failed(str(rank), exc)
    return 0


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


def add_training_arguments(p: argparse.ArgumentParser) -> None:
    """The options every engine's worker takes: the first seven of :class:`WorkerOptions`
    (plan, steps, out, deterministic, dataset, timeout, save_weights)."""
    p.add_argument("plan")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--dataset")
    p.add_argument("--timeout", type=float, default=GLOO_TIMEOUT_S)
    p.add_argument("--save-weights", action="store_true")


def parse_args(argv: Sequence[str] | None = None) -> WorkerOptions:
    p = argparse.ArgumentParser(prog="python -m executor.worker", description=__doc__)
    add_training_arguments(p)
    p.add_argument("--generation", type=int, default=0)
    p.add_argument("--emulate", action="store_true")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--keep-checkpoints", type=positive_int, default=KEEP_CHECKPOINTS)
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
                         coordinator=a.coordinator, join=a.join,
                         keep_checkpoints=a.keep_checkpoints)


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
