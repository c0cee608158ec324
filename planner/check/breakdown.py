"""Predicted vs measured per stage and per link of a run (no torch): what
``edgepipe report`` sets beside the per-device figures (:mod:`planner.check.report`).

Inputs: the plan (every predicted figure comes from its cost model,
:mod:`planner.cost.model`, multiplied by the emulation's time scale ``k``), the
``timeline.jsonl`` and ``transfers.jsonl`` lines of the steps compared and each device's
``started_at`` per step (``metrics.jsonl``: the wall clock at its step start; the
processes of one machine share it, across hosts it assumes synchronised clocks).

**Per link** (:class:`LinkRow`): one row per ordered device pair of a stage boundary and
direction (activations from stage p to p+1, gradients back), as the cost model re-slices
the micro-batch (:meth:`CostModel.link_transfer`). Predicted: one piece's channel time
at its pair's rate plus its latency (``Piece.ms + Piece.latency_ms``), i.e. the transfer
alone on an idle network. Measured: each piece's ``TRANSFER_F`` / ``TRANSFER_B`` line
(``transfers.jsonl``, docs/executor.md), from the sender's post to the receiver's
completion. A receiver that began waiting only after the data was in sees its completion
late, so a piece counts as timed exactly when the receiver waited more than
:data:`EXACT_WAIT_MS` for it; ``measured_ms`` is the mean over those, and ``bound_ms``
the mean over all pieces (an upper bound of the transfer time where pieces were not
timed exactly). ``per_step`` is the pieces per step (one per micro-batch).

**Per stage** (:class:`StageRow`): predicted ``StageCost.forward_ms`` /
``backward_ms`` (the slowest device's, Eq. 8) against the largest of the devices' mean
measured F / B. The all-reduce and the boundary's link are predicted under the plan's
own traffic, the figures ``edgepipe plan`` prints as ``ar ms`` and ``link ms``
(:meth:`CostModel.stage_transfer_ms`: in the steady step, the ring from its start to
its end, and the boundary's pieces of a micro-batch from the first post to the last
delivery, mean over both directions and the micro-batches; docs/decisions.md, "The
per-stage link and all-reduce columns"), not alone on an idle network
(``StageCost.allreduce_ms`` / ``link_out_ms``). Measured: the ring per step from the
last member's start of REDUCE_GRAD to the first member's end (on the shared clock: a
member that arrives early waits for the others, and that wait is not the ring's), mean
over steps, None for one device; the link, per micro-batch and direction (activations
from stage p, gradients from stage p+1) whose pieces were all timed exactly, from the
first post to the last delivery, mean over those.

O(timeline lines + P x g) for P stages of g devices, plus one steady-state simulation
of the plan (:meth:`CostModel.stage_transfer_ms`).
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.cost.transfers import reslice_pieces
from edgepipe.planner.plan import Plan

#: a receiver that waited longer than this (ms) for a piece was waiting when it came, so
#: its completion is the delivery (planner/check/breakdown.py, "Per link")
EXACT_WAIT_MS = 0.2
#: the timeline kind of each direction's transfer lines
TRANSFER_KIND = {"activations": "TRANSFER_F", "gradients": "TRANSFER_B"}


@dataclass(frozen=True)
class LinkRow:
    """Predicted vs measured transfers of one ordered device pair, one direction, of
    boundary ``boundary`` (stage p to p+1), ms per piece (module docstring)."""

    boundary: int
    direction: str
    src: str
    dst: str
    num_bytes: float
    per_step: int
    predicted_ms: float
    measured_ms: float | None
    bound_ms: float | None
    exact: int
    count: int


@dataclass(frozen=True)
class StageRow:
    """Predicted vs measured figures of one stage, ms (module docstring)."""

    stage: int
    devices: tuple[str, ...]
    forward_predicted: float
    forward_measured: float | None
    backward_predicted: float
    backward_measured: float | None
    allreduce_predicted: float
    allreduce_measured: float | None
    link_predicted: float | None
    link_measured: float | None


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _exact(e: dict[str, Any]) -> bool:
    return float(e["end_ms"]) - float(e["waited_ms"]) > EXACT_WAIT_MS


def link_rows(plan: Plan, cm: CostModel, events: list[dict[str, Any]], scale: float
              ) -> tuple[LinkRow, ...]:
    """One :class:`LinkRow` per piece of every boundary of ``plan``, activations then
    gradients, in the cost model's piece order (:func:`reslice_pieces`'s, which gives
    each piece's samples); ``cm``: the cost model of the plan's problem at its
    micro-batch size; ``events``: the timeline lines of the steps compared."""
    stages = plan.partition.stages
    spans: dict[tuple[str, str, str], list[tuple[float, bool]]] = defaultdict(list)
    for e in events:
        if e["kind"] in TRANSFER_KIND.values():
            spans[(e["kind"], e["device"], e["peer"])].append(
                (float(e["end_ms"]) - float(e["start_ms"]), _exact(e)))
    per_sample = [b.output_bytes_per_sample for b in plan.problem.model.blocks]
    rows = []
    for p, (a, b) in enumerate(itertools.pairwise(stages)):
        boundary = cm.link_transfer(a, b)
        shared = [n for _, _, n in reslice_pieces(a.samples, b.samples)]
        for direction, pieces in (("activations", boundary.forward),
                                  ("gradients", boundary.backward)):
            for x, n in zip(pieces, shared, strict=True):
                got = spans[(TRANSFER_KIND[direction], x.src, x.dst)]
                rows.append(LinkRow(
                    boundary=p, direction=direction, src=x.src, dst=x.dst,
                    num_bytes=n * per_sample[a.end - 1],
                    per_step=plan.partition.num_micro_batches,
                    predicted_ms=scale * (x.ms + x.latency_ms),
                    measured_ms=_mean([ms for ms, exact in got if exact]),
                    bound_ms=_mean([ms for ms, _ in got]),
                    exact=sum(exact for _, exact in got), count=len(got),
                ))
    return tuple(rows)


def stage_rows(plan: Plan, cm: CostModel, events: list[dict[str, Any]],
               started: dict[tuple[str, int], float], scale: float) -> tuple[StageRow, ...]:
    """One :class:`StageRow` per stage of ``plan`` (module docstring); ``cm``: the cost
    model of the plan's problem at its micro-batch size; ``started[(device, step)]`` is
    the device's ``started_at`` of the step (wall-clock s)."""
    durations: dict[tuple[str, str], list[float]] = defaultdict(list)
    # per stage: step -> its members' REDUCE_GRAD (start, end) on the shared clock
    reduce: dict[int, dict[int, list[tuple[float, float]]]] = defaultdict(
        lambda: defaultdict(list))
    # per boundary: (kind, step, micro-batch) -> its pieces (post, delivery, timed exactly)
    sent: dict[int, dict[tuple[str, int, int], list[tuple[float, float, bool]]]] = defaultdict(
        lambda: defaultdict(list))
    for e in events:
        d, step, kind = e["device"], e["step"], e["kind"]
        durations[(d, kind)].append(float(e["end_ms"]) - float(e["start_ms"]))
        t0 = started.get((d, step))
        if t0 is None:
            continue
        start, end = (t0 * 1e3 + float(e[k]) for k in ("start_ms", "end_ms"))
        if kind == "REDUCE_GRAD":
            reduce[int(e["stage"])][step].append((start, end))
        elif kind in TRANSFER_KIND.values():  # the sender's line: gradients from p + 1
            boundary = int(e["stage"]) - (kind == TRANSFER_KIND["gradients"])
            sent[boundary][(kind, step, int(e["micro_batch"]))].append(
                (start, end, _exact(e)))
    contended = cm.stage_transfer_ms(plan.partition)
    rows = []
    for p, (stage, cost, (link_ms, ring_ms)) in enumerate(
            zip(plan.partition.stages, plan.cost.stages, contended, strict=True)):
        f = [x for d in stage.devices if (x := _mean(durations[(d, "F")])) is not None]
        b = [x for d in stage.devices if (x := _mean(durations[(d, "B")])) is not None]
        rings = [min(e for _, e in xs) - max(s for s, _ in xs)
                 for xs in reduce[p].values() if len(xs) == len(stage.devices)]
        links = [max(e for _, e, _ in xs) - min(s for s, _, _ in xs)
                 for xs in sent[p].values() if all(x[2] for x in xs)]
        last = p == plan.partition.num_stages - 1
        rows.append(StageRow(
            stage=p, devices=stage.devices,
            forward_predicted=scale * cost.forward_ms, forward_measured=max(f, default=None),
            backward_predicted=scale * cost.backward_ms, backward_measured=max(b, default=None),
            allreduce_predicted=scale * ring_ms,
            allreduce_measured=_mean(rings) if len(stage.devices) > 1 else None,
            link_predicted=None if last else scale * link_ms,
            link_measured=None if last else _mean(links),
        ))
    return tuple(rows)
