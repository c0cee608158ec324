"""One rank of the ``torch-pipelining`` engine: a plan trained with torch's own
``PipelineStage`` and schedules (``Schedule1F1B``, ``ScheduleGPipe``), the same under the
engine's local launcher (:mod:`executor.engines.torch_pipelining`) and under torchrun::

    torchrun ... -m edgepipe.executor.engines.torch_worker PLAN --steps N [--out DIR]
        [--deterministic] [--dataset NAME] [--timeout S] [--save-weights]

Inputs: a plan the engine supports (:func:`executor.engines.torch_plans.refusal`:
every stage has the same number ``g`` of devices, each with the same share ``b / g`` of
every micro-batch of size ``b``), the rank's endpoint (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT`` under torchrun). Ranks are numbered as edgepipe's
runtime numbers them (:mod:`executor.core.layout`: stage by stage, the plan's device order
within a stage).

**Replicas**: device ``j`` of every stage forms pipeline replica ``j``; its process
group (``PipelineStage(group=...)``) holds those ``P`` ranks. Replica ``j`` takes rows
``[j b/g, (j+1) b/g)`` of every micro-batch, the rows edgepipe's runtime gives device
``j`` (its ``offset``), so both engines compute on the same samples. Stage ``p``'s ``g``
ranks form its data-parallel group; with ``g > 1`` each rank all-reduces (sums) its
stage's flattened gradients in that group after the schedule's step and divides them by
``g``: the recipe of torch's pipelining notes for PP x DP without FSDP. Not torch's
``DistributedDataParallel``, although ``PipelineStage`` knows it: in torch 2.13 on gloo a
DDP-wrapped stage of the zoo's GPT-2 fails its second step inside DDP's reducer
("rebuilt parameter indices size is not same as original model parameters size", 28 vs
14: each micro-batch's backward records the parameters again), and with
``static_graph=True`` it runs but trains wrong (step losses 0.6 % off the reference's by
step 4; docs/engines.md).

**Step** ``t``: the global batch of :func:`executor.core.data.step_indices` (the sampler of
edgepipe's runtime), this replica's rows of each micro-batch concatenated in micro-batch
order (the schedule splits them back into ``M`` chunks); gradients set to None;
``schedule.step`` (first stage: inputs, last stage: targets and the per-micro-batch
losses); the optimizer of the plan's config (:func:`executor.core.build.stage_optimizer`,
the runtime's). torch scales the accumulated gradients by ``1 / M`` (``scale_grads``),
the group's average by ``1 / g``: the global-batch mean, as the runtime's fast mode
(``loss x slice / B`` per micro-batch, all-reduced sum). When ``M`` and ``g`` are powers of
two every one of these scalings is exact in floating point, so the two engines'
gradients, and weights, are bit-identical (tests/integration/test_engines.py).

**Metrics**: each rank publishes a payload per step (``metrics/<t>/<r>``, the runtime's
format: :func:`executor.core.metrics.rank_payload`'s keys) and rank 0's
:class:`~executor.core.collector.MetricsCollector` writes ``metrics.jsonl`` and
``timeline.jsonl``. The stage (:class:`TimedStage`) times each micro-batch's forward
(``F``) and backward (``B``) as torch's schedule calls them; the gradient average
(``REDUCE_GRAD``) and the optimizer step (``OPTIM``) are timed here. torch's schedule
posts its sends and waits for its receives inside ``step``, where they cannot be told
apart: the step's time outside those four is reported as ``recv_wait_ms`` (waiting and
sending) and ``send_ms`` is 0. A payload adds ``cpu_ms`` (the rank's CPU time of the
step). The last stage's ``loss_sum`` is ``sum_m loss_m x (b/g) / B``, the runtime's
fast-mode figure.

**No fault tolerance**: no heartbeats, no recovery, no checkpoints; a failing rank
publishes ``error/<r>`` (one line) and exits, the launcher stops the others.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # as executor.worker, same reason

import numpy as np
import torch
import torch.distributed as dist
from edgepipe.executor.core import data
from edgepipe.executor.core.build import load_rows, save_weights, stage_optimizer, torch_device
from edgepipe.executor.core.collector import MetricsCollector
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.metrics import MetricsWriter, peak_memory_bytes
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.core.stage import build_stage, stage_loss
from edgepipe.executor.engines.torch_plans import refusal
from edgepipe.executor.worker import (
    EXIT_REFUSED,
    _failed,
    add_training_arguments,
    check_world,
    endpoint_from_env,
    exit_status,
)
from edgepipe.planner.errors import EdgepipeError
from edgepipe.planner.plan import Plan, load_plan
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

#: the prefix of this engine's keys on the run's store (torchrun's agent shares it)
PREFIX = "torch-pipelining"
#: the plan's schedule -> torch's schedule class
SCHEDULES: dict[str, type[PipelineScheduleSingle]] = {
    "1f1b": Schedule1F1B, "gpipe": ScheduleGPipe,
}


def _groups(layout: RankLayout, me: RankInfo, timeout: timedelta, device: torch.device,
            ) -> tuple[dist.ProcessGroup, dist.ProcessGroup | None]:
    """This rank's pipeline group (replica ``me.index``: device ``me.index`` of every
    stage) and its stage's data-parallel group (None for a stage of one device). Every
    rank creates every group, in the same order (torch-and-solvers.md section 4)."""
    width = len(layout.stage_ranks[0])
    pipe = data_parallel = None
    for j in range(width):
        group = dist.new_group([ranks[j] for ranks in layout.stage_ranks], timeout=timeout)
        if j == me.index:
            pipe = group
    for p, ranks in enumerate(layout.stage_ranks):
        group = dist.new_group(list(ranks), timeout=timeout) if width > 1 else None
        if p == me.stage:
            data_parallel = group
    assert pipe is not None
    if data_parallel is not None:  # connect now (P9)
        dist.all_reduce(torch.zeros(1, device=device), group=data_parallel)
    return pipe, data_parallel


class TimedStage(PipelineStage):
    """torch's ``PipelineStage`` that records when each micro-batch's forward and backward
    ran: ``(kind, micro-batch, start, end)`` in ``time.perf_counter`` seconds, kept in
    ``intervals`` until the caller takes them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.intervals: list[tuple[str, int, float, float]] = []

    def forward_one_chunk(self, fwd_chunk_id: int, args: tuple[Any, ...],
                          kwargs: dict[str, Any] | None = None,
                          save_forward_output: bool = True) -> Any:
        start = time.perf_counter()
        out = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        self.intervals.append(("F", fwd_chunk_id, start, time.perf_counter()))
        return out

    def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None,
                           full_backward: bool = True, last_backward: bool = False) -> None:
        start = time.perf_counter()
        super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
        self.intervals.append(("B", bwd_chunk_id, start, time.perf_counter()))


def replica_rows(layout: RankLayout, me: RankInfo, indices: np.ndarray) -> np.ndarray:
    """``me``'s rows of every micro-batch of a step's global batch ``indices``, in
    micro-batch order. O(B)."""
    b = layout.micro_batch_size
    return np.concatenate([indices[m * b + me.offset: m * b + me.offset + me.samples]
                           for m in range(layout.num_micro_batches)])


class TorchRank:
    """One rank (module docstring): :meth:`run` trains it to the end."""

    def __init__(self, opts: WorkerOptions, endpoint: Endpoint, plan: Plan) -> None:
        self.opts, self.endpoint, self.plan = opts, endpoint, plan
        self.layout = RankLayout.from_plan(plan)
        check_world(self.layout, endpoint.world_size, endpoint.rank)
        self.rank = endpoint.rank
        self.me = self.layout.ranks[self.rank]
        self.device, self.backend = torch_device(endpoint)
        self.timeout = timedelta(seconds=opts.timeout_s)
        self.store = self._connect(host=endpoint.host_store)
        #: the stage's data-parallel group (None: a stage of one device)
        self.data_parallel: dist.ProcessGroup | None = None
        self.stage: TimedStage | None = None

    def _connect(self, host: bool = False) -> dist.Store:
        root = dist.TCPStore(self.endpoint.store_host, self.endpoint.store_port,
                             is_master=host, timeout=self.timeout, wait_for_workers=False)
        return dist.PrefixStore(PREFIX, root)

    def fail(self, message: str) -> None:
        self.store.set(f"error/{self.rank}", message)

    def run(self) -> None:
        me, plan = self.me, self.plan
        part = plan.partition.stages[me.stage]
        module = build_stage(plan.problem.model, part.first, part.end).to(self.device)
        rows = load_rows(plan, self.opts)
        dist.init_process_group(self.backend, store=dist.PrefixStore("pg", self.store),
                                rank=self.rank, world_size=self.layout.world_size,
                                timeout=self.timeout)
        try:
            self._train(module, rows)
        finally:
            dist.destroy_process_group()

    def _schedule(self, module: torch.nn.Module) -> PipelineScheduleSingle:
        """torch's stage and schedule of this rank (module docstring, "Replicas")."""
        layout, me = self.layout, self.me
        pipe, data_parallel = _groups(layout, me, self.timeout, self.device)
        self.data_parallel = data_parallel
        self.stage = TimedStage(module, me.stage, layout.num_stages, self.device, group=pipe)
        kind = SCHEDULES[self.plan.problem.config.schedule]
        return kind(self.stage, layout.num_micro_batches,
                    loss_fn=stage_loss(self.plan.problem.model))

    def _train(self, module: torch.nn.Sequential, rows: data.Rows) -> None:
        opts, layout, me = self.opts, self.layout, self.me
        schedule = self._schedule(module)
        optimizer = stage_optimizer(module, self.plan)
        collector = None
        if self.rank == 0 and opts.out:
            writer = MetricsWriter(Path(opts.out), layout, deterministic=False)
            collector = MetricsCollector(self._connect(), writer, layout.world_size, 0,
                                         opts.steps)
            collector.start()
        dist.barrier()
        for step in range(opts.steps):
            payload = self._step(step, schedule, optimizer, module, rows)
            self.store.set(f"metrics/{step}/{self.rank}", json.dumps(payload))
        if collector is not None:
            collector.finish(opts.timeout_s)
        if opts.save_weights and opts.out:
            save_weights(opts, self.plan, me, self.rank, module, optimizer)
        dist.barrier()

    def _step(self, step: int, schedule: PipelineScheduleSingle,
              optimizer: torch.optim.Optimizer, module: torch.nn.Module,
              rows: data.Rows) -> dict[str, Any]:
        """One training step (module docstring, "Step"); its metrics payload."""
        layout, me = self.layout, self.me
        started, t0, cpu0 = time.time(), time.perf_counter(), time.process_time()
        indices = data.step_indices(step, layout.global_batch, rows.size,
                                    self.plan.problem.config.seed)
        mine = replica_rows(layout, me, indices)
        first, last = me.stage == 0, me.stage == layout.num_stages - 1
        args = (rows.inputs(mine).to(self.device),) if first else ()
        target = rows.targets(mine).to(self.device) if last else None
        for p in module.parameters():
            p.grad = None
        losses: list[torch.Tensor] = []
        schedule.step(*args, target=target, losses=losses if last else None)
        t_reduce = time.perf_counter()
        if self.data_parallel is not None:
            self._average_gradients(module)
        t_optim = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        assert self.stage is not None
        timed = [*self.stage.intervals, ("OPTIM", None, t_optim, end)]
        if self.data_parallel is not None:
            timed.append(("REDUCE_GRAD", None, t_reduce, t_optim))
        self.stage.intervals.clear()
        compute = sum(e - s for kind, _, s, e in timed if kind in ("F", "B"))
        wall = end - t0
        share = me.samples / layout.global_batch
        return {
            "step": step, "losses": [],
            "loss_sum": sum(float(loss.detach() * share) for loss in losses) if last else None,
            "compute_ms": compute * 1e3, "send_ms": 0.0,
            "recv_wait_ms": (t_reduce - t0 - compute) * 1e3,
            "allreduce_ms": (t_optim - t_reduce) * 1e3, "optim_ms": (end - t_optim) * 1e3,
            "wall_ms": wall * 1e3, "started_at": started,
            "cpu_ms": (time.process_time() - cpu0) * 1e3,
            "peak_mem_bytes": peak_memory_bytes(self.device),
            "intervals": [[kind, m, round((s - t0) * 1e3, 4), round((e - t0) * 1e3, 4)]
                          for kind, m, s, e in timed],
        }

    def _average_gradients(self, module: torch.nn.Module) -> None:
        """The mean of the stage group's gradients (module docstring, "Replicas"): one
        all-reduce (sum) of the flattened gradients, then ``1 / g``."""
        assert self.data_parallel is not None
        params = [p for p in module.parameters() if p.requires_grad]
        flat = torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)
                          for p in params])
        dist.all_reduce(flat, group=self.data_parallel)
        flat.div_(len(self.layout.stage_ranks[self.me.stage]))
        offset = 0
        for p in params:
            p.grad = flat[offset: offset + p.numel()].view_as(p)
            offset += p.numel()


def run(opts: WorkerOptions, endpoint: Endpoint) -> None:
    """Run one rank to the end; raises on failure after publishing ``error/<rank>``."""
    torch.set_num_threads(1)
    if opts.deterministic:
        torch.use_deterministic_algorithms(True)
    rank = TorchRank(opts, endpoint, load_plan(opts.plan))
    try:
        rank.run()
    except BaseException as exc:
        message = str(exc) if isinstance(exc, EdgepipeError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):  # when the store is gone too, the exit tells
            rank.fail((message.splitlines() or [type(exc).__name__])[0])
        raise


def spawned(opts: WorkerOptions, endpoint: Endpoint) -> None:
    """Entry point of a process the engine's local launcher starts: exit status 0, 2 for
    an edgepipe error, 1 otherwise, 130 on Ctrl-C (as :func:`executor.worker.spawned`)."""
    sys.exit(exit_status(lambda: run(opts, endpoint), endpoint.rank,
                         f"edgepipe torch-pipelining rank {endpoint.rank}"))


def parse_args(argv: Sequence[str] | None = None) -> WorkerOptions:
    p = argparse.ArgumentParser(prog="python -m edgepipe.executor.engines.torch_worker",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_training_arguments(p)
    a = p.parse_args(argv)
    return WorkerOptions(a.plan, a.steps, a.out, a.deterministic, a.dataset, a.timeout,
                         a.save_weights)


def main(argv: Sequence[str] | None = None) -> int:
    """torchrun's entry: refuse a plan the engine does not support (every rank says the
    same one line, exit status 2), else train this rank."""
    opts = parse_args(argv)
    try:
        plan = load_plan(opts.plan)
        why = refusal(plan)
        if why is not None:
            raise EdgepipeError(f"torch-pipelining cannot run plan {plan.id}: {why}")
        if opts.out and int(os.environ.get("RANK", "0")) == 0:
            Path(opts.out).mkdir(parents=True, exist_ok=True)
        run(opts, endpoint_from_env())
    except EdgepipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except RuntimeError as exc:
        return _failed(os.environ.get("RANK", "?"), exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

