"""Baseline planners: the ways of splitting work users would otherwise reach for.

Each baseline is written from the published description of its system
(/work/shared/reference/anchors.md), not from its code, and returns a
:class:`~planner.partition.Partition` that the shared cost model scores like any other
plan. The knobs a baseline leaves to the user (micro-batch size; HetPipe's number of
virtual workers) are chosen by the shared cost model among the config's candidates, which
favours the baselines: the comparison is conservative. Devices keep the cluster file's
order where the original system has no notion of heterogeneity.

- ``data-parallel``: data parallelism only (PyTorch DDP / Horovod, with per-device sample
  counts as in heterogeneity-aware data parallelism, e.g. EDDL). Every device that can
  hold the whole model's weights, gradients, optimizer state and one sample's
  activations joins one stage (so micro-batches smaller than that device count do not
  apply); each takes one sample plus a share of the rest in proportion to its speed
  (Eq. 9: inverse whole-model time at the micro-batch size), capped by its memory.
- ``gpipe``: pipeline only, GPipe / torch.distributed.pipelining style: one device per
  stage, every device in cluster order (at most L stages, ``max_stages`` respected), blocks
  split evenly by count (the first ``L mod P`` stages take one block more).
- ``torchgpipe``: as ``gpipe`` but blocks balanced by time (torchgpipe's
  ``balance_by_time``): profiled on one device (the cluster's first), so the split assumes
  identical devices; the exact min-max contiguous partition replaces torchgpipe's
  block-partition heuristic.
- ``deepspeed``: as ``gpipe`` but blocks balanced by parameter bytes (DeepSpeed
  ``PipelineModule(partition_method="parameters")``), min-max contiguous partition.
- ``pipedream``: PipeDream's optimizer (SOSP'19), the recurrence of
  ``optimizer/optimizer_graph_hierarchical.py`` in msr-fiddle/pipedream with one level of
  machines, as its README runs it (``--activation_compression_ratio 1``) plus its
  ``--use_memory_constraint`` (:func:`pipedream_partition`). PipeDream assumes identical
  machines: every device is taken as the cluster's average device (mean of the cost
  model's per-device block times at the micro-batch size), one bandwidth (the cluster's
  slowest pair) and one memory (the smallest usable memory). Stages take devices in
  cluster order and split the micro-batch's samples evenly over their replicas (so a
  stage has at most B replicas, a bound PipeDream, whose replicas take whole minibatches
  in turn, does not have).
- ``hetpipe``: HetPipe (ATC'20) virtual workers: k virtual workers of P = N // k mixed
  devices each (the ED policy: devices sorted by speed are dealt round-robin, so virtual
  worker j gets the j-th fastest device of every speed rank; the slowest N mod k sit out),
  every virtual worker pipelines the model with the same stage cuts (min-max partition
  under memory, stage time = its slowest member's), and virtual workers are data parallel
  (the p-th devices of all virtual workers form stage p; samples split evenly). HetPipe's
  parameter server with bounded staleness becomes the synchronous all-reduce of the cost
  model.

Every baseline optimises its own objective (PipeDream: its slowest-stage time; the
balanced splits: their weights; HetPipe: min-max stage time); every one of their plans is
then scored by the one cost model (:mod:`planner.cost.model`), which also supplies every
figure the baselines read (block times, parameter and activation bytes, memory, budgets,
bandwidths).

Complexity: O(#candidates x (N + L)) for data-parallel and the even split, O(#candidates
x P L^2) for the balanced splits and HetPipe (x N for the choice of k), and
O(#candidates x L^2 N^2) for PipeDream's DP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from edgepipe.planner.cost.formulas import samples_that_fit
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.errors import InfeasibleError, InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.units import human_bytes

#: a baseline builds, for one micro-batch size, its partition (None: not applicable)
Builder = Callable[[Problem, CostModel, int], Partition | None]


def even_split(n_blocks: int, parts: int) -> list[int]:
    """Stage boundaries [0, b_1, ..., L] of an even split by count; the first
    ``n_blocks mod parts`` stages take one block more. O(parts)."""
    base, extra = divmod(n_blocks, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return bounds


def balanced_split(cost: Callable[[int, int, int], float], n_blocks: int, parts: int) -> list[int]:
    """Stage boundaries minimising the largest ``cost(stage, first, end)`` over contiguous
    non-empty stages (exact min-max partition by DP; ties: earliest cuts). O(parts x L^2)
    cost calls. Raises ``ValueError`` when every split has an infinite cost."""
    inf = float("inf")
    # best[p][j]: least max cost of blocks [0, j) in stages 0..p-1
    best = [[inf] * (n_blocks + 1) for _ in range(parts + 1)]
    cut = [[0] * (n_blocks + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for j in range(p, n_blocks - (parts - p) + 1):
            for i in range(p - 1, j):
                if best[p - 1][i] == inf:
                    continue
                value = max(best[p - 1][i], cost(p - 1, i, j))
                if value < best[p][j]:
                    best[p][j], cut[p][j] = value, i
    if best[parts][n_blocks] == inf:
        raise ValueError("no split fits")
    bounds = [n_blocks]
    for p in range(parts, 0, -1):
        bounds.append(cut[p][bounds[-1]])
    return bounds[::-1]


def _stages(
    bounds: list[int], groups: list[list[str]], samples: list[list[int]]
) -> tuple[StageAssignment, ...]:
    return tuple(
        StageAssignment(bounds[p], bounds[p + 1], tuple(groups[p]), tuple(samples[p]))
        for p in range(len(groups))
    )


def _spread(batch: int, parts: int) -> list[int]:
    """``batch`` samples over ``parts`` devices as evenly as possible, larger first."""
    base, extra = divmod(batch, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _pipeline_devices(problem: Problem) -> list[str]:
    """One device per stage, cluster order: at most L (and ``max_stages``) devices."""
    limit = min(problem.model.num_blocks, len(problem.cluster.devices))
    if problem.config.max_stages:
        limit = min(limit, problem.config.max_stages)
    return [d.id for d in problem.cluster.devices[:limit]]


# -- builders ---------------------------------------------------------------------------
def _data_parallel(problem: Problem, cm: CostModel, batch: int) -> Partition | None:
    n_blocks, m = problem.model.num_blocks, problem.config.global_batch // batch
    warm = problem.config.warmup_depth(0, 1, m)
    static, saved = cm.static_bytes(0, n_blocks), cm.saved_bytes(0, n_blocks)
    caps = samples_that_fit(cm.budget, static, warm, saved, batch)
    fits = [i for i in range(len(problem.cluster.devices)) if caps[i] >= 1]
    if not fits or batch < len(fits):
        return None
    speed = np.array([1.0 / sum(cm.device_times(0, n_blocks, i, batch)) for i in fits])
    y = _proportional(batch, speed, caps[fits])
    if y is None:
        return None
    ids = tuple(problem.cluster.devices[i].id for i in fits)
    return Partition(batch, m, (StageAssignment(0, n_blocks, ids, tuple(y)),))


def _proportional(batch: int, speed: np.ndarray, caps: np.ndarray) -> list[int] | None:
    """One sample per device, the rest in proportion to ``speed`` (largest remainder,
    ties to the earlier device) without exceeding ``caps``; what a full device cannot
    take goes round again to the others. None if the caps hold fewer than ``batch``."""
    y = np.ones(len(speed), dtype=np.int64)
    if caps.sum() < batch:
        return None
    while (left := batch - int(y.sum())) > 0:
        room = caps > y
        share = np.where(room, speed, 0.0) / np.where(room, speed, 0.0).sum() * left
        add = np.floor(share).astype(np.int64)
        order = np.argsort(-(share - add), kind="stable")
        add[order[: left - int(add.sum())]] += 1
        y = np.minimum(y + np.where(room, add, 0), caps)
    return [int(v) for v in y]


def _gpipe(problem: Problem, cm: CostModel, batch: int) -> Partition | None:
    devices = _pipeline_devices(problem)
    bounds = even_split(problem.model.num_blocks, len(devices))
    m = problem.config.global_batch // batch
    return Partition(batch, m, _stages(bounds, [[d] for d in devices], [[batch]] * len(devices)))


def _balanced(problem: Problem, batch: int, weights: np.ndarray) -> Partition:
    devices = _pipeline_devices(problem)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    bounds = balanced_split(
        lambda _p, i, j: float(prefix[j] - prefix[i]), problem.model.num_blocks, len(devices)
    )
    m = problem.config.global_batch // batch
    return Partition(batch, m, _stages(bounds, [[d] for d in devices], [[batch]] * len(devices)))


def _torchgpipe(problem: Problem, cm: CostModel, batch: int) -> Partition | None:
    # profiled on the cluster's first device, as torchgpipe's balance_by_time does
    blocks = range(problem.model.num_blocks)
    times = np.array([sum(cm.device_times(b, b + 1, 0, batch)) for b in blocks])
    return _balanced(problem, batch, times)


def _deepspeed(problem: Problem, cm: CostModel, batch: int) -> Partition | None:
    return _balanced(problem, batch, np.diff(cm.param_prefix))


def pipedream_partition(
    compute_ms: Sequence[float],
    param_bytes: Sequence[float],
    stash_bytes: Sequence[float],
    output_bytes: Sequence[float],
    machines: int,
    bytes_per_ms: float,
    memory_bytes: float | None = None,
    max_replicas: int | None = None,
    max_stages: int | None = None,
) -> tuple[float, list[tuple[int, int, int]]] | None:
    """PipeDream's optimizer on a chain of L blocks and ``machines`` identical machines:
    the least slowest-stage time and the stages ``(first, end, replicas)``.

    Inputs per block l (one minibatch on one machine): ``compute_ms`` (forward +
    backward), ``param_bytes`` W, ``stash_bytes`` (activations kept for the backward
    pass) and ``output_bytes`` a (what it sends to the next block); one bandwidth and,
    optionally, one memory per machine and a cap on replicas per stage.

    State: A(j, n), the least slowest-stage time of blocks [0, j) on exactly n machines
    (PipeDream's ``A[0][j-1][n-1]``; its ``use_fewer_machines`` is off). With prefix
    sums T, W, S over [i, j) and a stage of blocks [i, j) replicated r times taking

        stage(i, j, r) = (T(i, j) + 4 (r-1) W(i, j) / (r bw)) / r

    (the all-reduce of PipeDream's data-parallel stages is divided by r with the
    compute), the recurrence is

        A(j, n) = min( stage(0, j, n),
                       min over 1 <= k < j, 1 <= r < n of
                           max(A(k, n - r), stage(k, j, r), 2 a_{k-1} / (r bw),
                               2 a_{j-1} / (r bw) if j < L) )

    (input and output transfers, PipeDream's terms with compression ratio 1). With a
    memory, a stage [i, j) with r replicas is allowed only if its stash
    ``ceil((N - n) / r) * (S(i, j) + W(i, j))`` fits (N = ``machines``, n = machines
    up to and including the stage), as PipeDream's ``--use_memory_constraint``. Ties
    keep the first candidate in the order: the single stage, then k ascending, r
    ascending. Answer A(L, N). O(L^2 N^2) time, O(L N) space. None when nothing fits.

    ``max_stages`` (the config's, which PipeDream does not have) adds the stage count p
    to the state, A(j, n, p), and takes the best A(L, N, p) over p <= ``max_stages``
    (fewest stages on ties): O(L^2 N^2 P) time, O(L N P) space.
    """
    n_blocks = len(compute_ms)
    t = np.concatenate([[0.0], np.cumsum(compute_ms)])
    w = np.concatenate([[0.0], np.cumsum(param_bytes)])
    act = np.concatenate([[0.0], np.cumsum(stash_bytes)])
    cap = machines if max_replicas is None else max_replicas
    # stage counts are tracked only under a limit (None: one level, PipeDream's own DP)
    counts: list[int | None] = list(range(1, max_stages + 1)) if max_stages else [None]

    def stage(i: int, j: int, r: int) -> float:
        return (t[j] - t[i] + 4.0 * (r - 1) * (w[j] - w[i]) / (r * bytes_per_ms)) / r

    def fits(i: int, j: int, r: int, used: int) -> bool:
        if memory_bytes is None:
            return True
        in_flight = -(-(machines - used) // r)  # ceil((N - n) / r)
        return in_flight * (act[j] - act[i] + w[j] - w[i]) <= memory_bytes

    # best[(j, n, p)] = (A(j, n) with p stages, (k, r, previous p)) for reachable states
    best: dict[tuple[int, int, int | None], tuple[float, tuple[int, int, int | None]]] = {}
    for n in range(1, machines + 1):
        for j in range(1, n_blocks + 1):
            if n <= cap and fits(0, j, n, n):
                best[(j, n, counts[0])] = (stage(0, j, n), (0, n, None))
            for k in range(1, j):
                for r in range(1, min(n - 1, cap) + 1):
                    if not fits(k, j, r, n):
                        continue
                    cost = max(stage(k, j, r), 2.0 * output_bytes[k - 1] / (r * bytes_per_ms))
                    if j < n_blocks:
                        cost = max(cost, 2.0 * output_bytes[j - 1] / (r * bytes_per_ms))
                    for q in counts[:-1] if max_stages else counts:
                        before = best.get((k, n - r, q))
                        if before is None:
                            continue
                        key = (j, n, None if q is None else q + 1)
                        value = max(before[0], cost)
                        if key not in best or value < best[key][0]:
                            best[key] = (value, (k, r, q))
    finals = [best[(n_blocks, machines, p)] for p in counts if (n_blocks, machines, p) in best]
    if not finals:
        return None
    value = min(f[0] for f in finals)
    p = next(p for p in counts if best.get((n_blocks, machines, p), (None,))[0] == value)
    stages: list[tuple[int, int, int]] = []
    j, n = n_blocks, machines
    while j > 0:
        _, (k, r, q) = best[(j, n, p)]
        stages.append((k, j, r))
        j, n, p = k, n - r, q
    return value, stages[::-1]


def _pipedream(problem: Problem, cm: CostModel, batch: int) -> Partition | None:
    n_blocks, n_dev = problem.model.num_blocks, len(problem.cluster.devices)
    # the average machine: mean over devices of the cost model's block times at batch
    compute = [
        float(np.mean([sum(cm.device_times(b, b + 1, d, batch)) for d in range(n_dev)]))
        for b in range(n_blocks)
    ]
    off_diagonal = ~np.eye(n_dev, dtype=bool)
    result = pipedream_partition(
        compute,
        np.diff(cm.param_prefix).tolist(),
        [batch * cm.saved_bytes(b, b + 1) for b in range(n_blocks)],
        [batch * float(cm.boundary[b]) for b in range(n_blocks)],
        n_dev,
        float(cm.bw[off_diagonal].min()) if n_dev > 1 else float("inf"),
        memory_bytes=float(cm.budget.min()),
        max_replicas=batch,
        max_stages=problem.config.max_stages,
    )
    if result is None:
        return None
    ids = [d.id for d in problem.cluster.devices]
    stages, taken = [], 0
    for first, end, r in result[1]:
        stages.append(
            StageAssignment(first, end, tuple(ids[taken : taken + r]), tuple(_spread(batch, r)))
        )
        taken += r
    return Partition(batch, problem.config.global_batch // batch, tuple(stages))


def _hetpipe(problem: Problem, cm: CostModel, batch: int) -> Partition | None:
    cluster, n_blocks = problem.cluster, problem.model.num_blocks
    m = problem.config.global_batch // batch
    speed_order = sorted(
        range(len(cluster.devices)),
        key=lambda i: (-cluster.type_of(i).effective_gflops / cluster.devices[i].slowdown, i),
    )
    best: tuple[float, Partition] | None = None
    for k in range(1, min(len(speed_order), batch) + 1):
        n_stages = min(len(speed_order) // k, n_blocks)
        if problem.config.max_stages:
            n_stages = min(n_stages, problem.config.max_stages)
        # stage p = the p-th speed rank of every virtual worker
        groups = [speed_order[p * k : (p + 1) * k] for p in range(n_stages)]
        samples = _spread(batch, k)

        def stage_cost(
            p: int,
            i: int,
            j: int,
            groups: list[list[int]] = groups,
            samples: list[int] = samples,
            n_stages: int = n_stages,
        ) -> float:
            warm = problem.config.warmup_depth(p, n_stages, m)
            worst = 0.0
            for d, y in zip(groups[p], samples, strict=True):
                if cm.device_memory(i, j, y, warm) > cm.budget[d]:
                    return float("inf")
                f, b = cm.device_times(i, j, d, y)
                worst = max(worst, f + b)
            return worst

        try:
            bounds = balanced_split(stage_cost, n_blocks, n_stages)
        except ValueError:
            continue
        ids = [[cluster.devices[d].id for d in g] for g in groups]
        part = Partition(batch, m, _stages(bounds, ids, [samples] * n_stages))
        value = cm.evaluate(part).iteration_ms
        if best is None or value < best[0]:
            best = (value, part)
    return None if best is None else best[1]


BASELINES: dict[str, Builder] = {
    "data-parallel": _data_parallel,
    "gpipe": _gpipe,
    "torchgpipe": _torchgpipe,
    "deepspeed": _deepspeed,
    "pipedream": _pipedream,
    "hetpipe": _hetpipe,
}


def plan_baseline(problem: Problem, name: str) -> tuple[Partition, PlanCost]:
    """The baseline ``name``'s partition, best over the micro-batch candidates by the
    shared cost model (ties: smaller micro-batch), and its figures.

    Raises:
        InputError: unknown baseline name.
        InfeasibleError: no candidate's plan fits memory (constraint ``memory``; the
            message names the baseline, the device and the shortfall).
    """
    if name not in BASELINES:
        raise InputError("--solver", "", f"unknown baseline {name!r}; available: {list(BASELINES)}")
    sizes = problem.config.micro_batch_sizes()
    cm = CostModel(problem, max(sizes))
    best: tuple[float, Partition, PlanCost] | None = None
    overflow: tuple[float, str] | None = None  # least shortfall of a memory-infeasible plan
    for batch in sizes:
        part = BASELINES[name](problem, cm, batch)
        if part is None:
            continue
        cost = cm.evaluate(part)
        if not cost.memory_ok:
            short, where = _shortfall(part, cost)
            if overflow is None or short < overflow[0]:
                overflow = (short, where)
            continue
        if best is None or cost.iteration_ms < best[0]:
            best = (cost.iteration_ms, part, cost)
    if best is None:
        raise _infeasible(problem, cm, name, overflow)
    return best[1], best[2]


def _shortfall(part: Partition, cost: PlanCost) -> tuple[float, str]:
    worst = (0.0, "")
    for stage, sc in zip(part.stages, cost.stages, strict=True):
        for dev, mem, budget in zip(stage.devices, sc.memory_bytes, sc.budget_bytes, strict=True):
            if mem - budget > worst[0]:
                worst = (mem - budget, f"{dev} (stage {stage.first}-{stage.end - 1})")
    return worst


def _infeasible(
    problem: Problem, cm: CostModel, name: str, overflow: tuple[float, str] | None
) -> InfeasibleError:
    static = cm.static_bytes(0, problem.model.num_blocks)
    largest = float(cm.budget.max())
    if name == "data-parallel" and overflow is None and static <= largest:
        fits = int((cm.budget >= static).sum())
        return InfeasibleError(
            f"data-parallel gives each of the {fits} devices that hold the model at least one "
            f"sample, but the largest micro-batch candidate is "
            f"{max(problem.config.micro_batch_sizes())}; add a micro-batch size >= {fits}",
            "micro_batch",
        )
    if name == "data-parallel" and overflow is None:
        return InfeasibleError(
            f"memory: data-parallel needs the whole model's weights, gradients and "
            f"{problem.config.optimizer} state ({human_bytes(static)}) on every device, but "
            f"the largest device has {human_bytes(largest)} usable: short by "
            f"{human_bytes(static - largest)}. Use a pipeline planner (dp, milp).",
            "memory",
            static - largest,
        )
    if overflow is None:
        return InfeasibleError(
            f"memory: {name} finds no stage layout that fits memory for any micro-batch size",
            "memory",
        )
    short, where = overflow
    return InfeasibleError(
        f"memory: {name}'s best attempt overflows device {where} by {human_bytes(short)} "
        "for every micro-batch size; use a memory-aware planner (dp, milp) or smaller "
        "micro_batch_candidates",
        "memory",
        short,
    )
