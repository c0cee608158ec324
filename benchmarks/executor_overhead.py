"""Executor overhead: our runtime against torch's own, same model, split and devices.

Identical devices (processes on this machine, gloo, one thread each), no emulation,
fast mode. Two comparisons, each measured in one run of this script:

* **pipeline**: a 2-stage plan (the same cut, one device per stage, the same micro-batch
  size and count) run by ``edgepipe run`` against
  ``torch.distributed.pipelining.PipelineStage`` + ``Schedule1F1B`` on the same stage
  modules;
* **data parallel**: a 1-stage plan over 2 devices with an even split against
  ``DistributedDataParallel`` with the same per-rank batch.

Both sides train the same zoo model (BERT-small at a reduced size, no dropout) with SGD
for ``--steps`` steps; samples/s is the global batch over the median step time after the
first. The ratio is ours / torch's (target >= 1.0, >= 0.95 at worst).

    .venv/bin/python benchmarks/executor_overhead.py [--steps 12] [--repeats 1]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.executor.core import data
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import SolverInfo, make_plan, save_plan

from benchmarks.local_cluster import identical_cpus

BUILD = BuildSpec(zoo="bert-small", sizes={"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000,
                                           "seq_len": 64, "max_positions": 64}, seed=0)
MICRO, M = 4, 4  # micro-batch size and count: global batch 16
LR = 0.01


def _plan(profile, stages, micro: int, m: int):
    n = sum(len(s[2]) for s in stages)
    cfg = TrainingConfig(global_batch=micro * m, micro_batch_candidates=(micro,),
                         optimizer="sgd", learning_rate=LR)
    problem = make_problem(profile, identical_cpus(n), cfg, catalog={})
    assigned, dev = [], 0
    for first, end, samples in stages:
        ids = tuple(f"d{dev + k}" for k in range(len(samples)))
        dev += len(samples)
        assigned.append(StageAssignment(first, end, ids, tuple(samples)))
    return make_plan(problem, Partition(micro, m, tuple(assigned)), SolverInfo("hand"))


def ours(plan, folder: Path, steps: int) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "input-plan.json"
    save_plan(plan, path)
    result = launch(WorkerOptions(str(path), steps, str(folder), timeout_s=300))
    walls = [m["wall_ms"] for m in result.metrics[1:]]
    return MICRO * M / statistics.median(walls) * 1e3


def _torch_rank(rank: int, world: int, port: int, mode: str, cut: int, steps: int,
                out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    loss_fn = zoo.loss_fn(BUILD.zoo)
    rows = data.Rows(data.synthetic(BUILD, 0))
    batch = MICRO * M
    walls = []
    if mode == "pipeline":
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        nblocks = len(zoo.block_specs(BUILD.zoo, **BUILD.sizes))
        blocks = range(0, cut) if rank == 0 else range(cut, nblocks)
        module = zoo.build_model(BUILD.zoo, seed=BUILD.seed, blocks=blocks, **BUILD.sizes)
        stage = PipelineStage(module, rank, world, torch.device("cpu"))
        schedule = Schedule1F1B(stage, M, loss_fn=loss_fn)
        opt = torch.optim.SGD(module.parameters(), lr=LR, foreach=False)
        for step in range(steps):
            idx = data.step_indices(step, batch, rows.size, 0)
            start = time.perf_counter()
            opt.zero_grad()
            if rank == 0:
                schedule.step(rows.inputs(idx))
            else:
                schedule.step(target=rows.targets(idx))
            opt.step()
            walls.append(time.perf_counter() - start)
    else:
        from torch.nn.parallel import DistributedDataParallel

        module = zoo.build_model(BUILD.zoo, seed=BUILD.seed, **BUILD.sizes)
        ddp = DistributedDataParallel(module)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR, foreach=False)
        half = batch // world
        for step in range(steps):
            idx = data.step_indices(step, batch, rows.size, 0)[rank * half:(rank + 1) * half]
            start = time.perf_counter()
            opt.zero_grad()
            # the same work as our fast mode: M micro-batches accumulated, one all-reduce
            for m in range(M):
                part = idx[m * MICRO // world:(m + 1) * MICRO // world]
                context = ddp.no_sync() if m < M - 1 else _null()
                with context:
                    loss = loss_fn(ddp(rows.inputs(part)), rows.targets(part)) / M
                    loss.backward()
            opt.step()
            walls.append(time.perf_counter() - start)
    dist.barrier()
    out.put((rank, walls))
    dist.destroy_process_group()


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def theirs(mode: str, cut: int, steps: int) -> float:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=120))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_torch_rank, args=(r, 2, store.port, mode, cut, steps, out))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join()
    step_s = [max(a, b) for a, b in zip(got[0][1:], got[1][1:], strict=True)]
    return MICRO * M / statistics.median(step_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3,
                   help="alternate ours and torch's this many times (median of each)")
    args = p.parse_args()
    torch.set_num_threads(1)
    model = zoo.build_model(BUILD.zoo, seed=BUILD.seed, **BUILD.sizes)
    profile = profile_model(model, lambda b: zoo.example_input(BUILD.zoo, b, **BUILD.sizes),
                            [1, 2, 4], "host-cpu", name="bert-small", warmup=1, repeats=1,
                            build=BUILD)
    nblocks = len(model)
    cut = nblocks // 2
    pipe = _plan(profile, [(0, cut, [MICRO]), (cut, nblocks, [MICRO])], MICRO, M)
    dp = _plan(profile, [(0, nblocks, [MICRO // 2, MICRO // 2])], MICRO, M)
    cases = [("2-stage 1F1B", "Schedule1F1B", pipe, "pipeline"), ("DP over 2", "DDP", dp, "ddp")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, other, plan, mode in cases:
            # alternating runs, so a change of machine load hits both sides alike
            a, b = [], []
            for r in range(args.repeats):
                a.append(ours(plan, Path(tmp) / f"{mode}-{r}", args.steps))
                b.append(theirs(mode, cut, args.steps))
            rows.append((name, other, statistics.median(a), statistics.median(b),
                         min(x / y for x, y in zip(a, b, strict=True))))
    print(f"bert-small {BUILD.sizes}, micro-batch {MICRO} x {M}, {args.steps} steps, "
          f"gloo, 1 thread per rank, median of {args.repeats} alternating runs")
    print(f"{'ours':<14} {'torch':<13} {'ours samples/s':>14} {'torch samples/s':>15} "
          f"{'ratio':>6} {'worst':>6}")
    for name, other, a, b, worst in rows:
        print(f"{name:<14} {other:<13} {a:>14.1f} {b:>15.1f} {a / b:>6.2f} {worst:>6.2f}")


if __name__ == "__main__":
    main()
