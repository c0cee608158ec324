"""Which process runs which plan device, and whether a plan can be run at all (no torch).

Rank order (the same under the local launcher and under ``torchrun``): stage by stage in
pipeline order, within a stage the plan's device order. Rank ``r`` is the ``r``-th entry
of ``[d for stage in plan.stages for d in stage.devices]``; idle devices get no rank.

Sample slices: micro-batch ``m`` (size ``b``) holds global positions ``[m*b, (m+1)*b)``;
in a stage whose devices take ``y_0..y_{g-1}`` samples, device ``j`` owns the positions
``m*b + sum(y_<j) .. m*b + sum(y_<=j) - 1`` (DETERMINISTIC.md). :func:`overlaps` gives
the rows that travel between two stages of different widths.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgepipe.planner.errors import InfeasibleError, PlanMismatchError
from edgepipe.planner.plan import Plan

GIB = 2**30


@dataclass(frozen=True)
class RankInfo:
    """One process of a run: plan device ``device`` at index ``index`` of stage ``stage``,
    owning rows ``[offset, offset + samples)`` of every micro-batch."""

    rank: int
    device: str
    stage: int
    index: int
    offset: int
    samples: int


@dataclass(frozen=True)
class RankLayout:
    """Every rank of a plan and the ranks of each stage (its data-parallel group)."""

    ranks: tuple[RankInfo, ...]
    stage_ranks: tuple[tuple[int, ...], ...]
    micro_batch_size: int
    num_micro_batches: int

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.num_micro_batches

    def stage_members(self, stage: int) -> list[RankInfo]:
        return [self.ranks[r] for r in self.stage_ranks[stage]]

    def positions(self, rank: int) -> list[int]:
        """Global positions (0..B-1) rank ``rank`` computes, in order (micro-batch, row)."""
        me = self.ranks[rank]
        b = self.micro_batch_size
        return [
            m * b + me.offset + k for m in range(self.num_micro_batches) for k in range(me.samples)
        ]

    @classmethod
    def from_plan(cls, plan: Plan) -> RankLayout:
        ranks: list[RankInfo] = []
        stage_ranks: list[tuple[int, ...]] = []
        for p, stage in enumerate(plan.partition.stages):
            offset, members = 0, []
            for j, (dev, y) in enumerate(zip(stage.devices, stage.samples, strict=True)):
                members.append(len(ranks))
                ranks.append(RankInfo(len(ranks), dev, p, j, offset, y))
                offset += y
            stage_ranks.append(tuple(members))
        return cls(
            tuple(ranks),
            tuple(stage_ranks),
            plan.partition.micro_batch_size,
            plan.partition.num_micro_batches,
        )


@dataclass(frozen=True)
class Overlap:
    """Rows ``[start, end)`` of a micro-batch go from ``src`` (rank) to ``dst`` (rank)."""

    src: int
    dst: int
    start: int
    end: int


def overlaps(senders: list[RankInfo], receivers: list[RankInfo]) -> list[Overlap]:
    """Interval overlap of two stages' slices of one micro-batch: every non-empty
    ``[max(a0, b0), min(a1, b1))`` of a sender's ``[a0, a1)`` and a receiver's
    ``[b0, b1)``, in sender order then receiver order (position order for each side).
    O(g_p + g_{p+1}) pieces, found in O(g_p x g_{p+1})."""
    out = []
    for s in senders:
        for r in receivers:
            start = max(s.offset, r.offset)
            end = min(s.offset + s.samples, r.offset + r.samples)
            if start < end:
                out.append(Overlap(s.rank, r.rank, start, end))
    return out


def check_runnable(plan: Plan) -> None:
    """Refuse a plan the executor cannot run, before any process starts.

    Raises :class:`PlanMismatchError` when its model profile has no build spec (an
    imported profile), :class:`InfeasibleError` when a device's memory (cost model,
    Eq. 3) exceeds its usable memory.
    """
    model = plan.problem.model
    if model.build is None:
        raise PlanMismatchError(
            f"plan {plan.id}: model profile {model.name!r} does not say how to build the "
            f"model (source: {model.source.get('kind', '?')}; no 'build' object), so it can "
            "be planned but not run. Profile a model the executor can build with "
            "`edgepipe profile --model ZOO_NAME|MODULE:CALLABLE` (or use a shipped "
            "*-cpu / *-analytic zoo profile) and plan that instead"
        )
    for p, sc in enumerate(plan.cost.stages):
        devices = plan.partition.stages[p].devices
        for dev, need, have in zip(devices, sc.memory_bytes, sc.budget_bytes, strict=True):
            if need > have:
                raise InfeasibleError(
                    f"plan {plan.id}: device {dev!r} (stage {p}) needs {need / GIB:.3f} GiB "
                    f"but has {have / GIB:.3f} GiB usable; re-plan for this cluster (or give "
                    "the device more memory)",
                    "memory",
                    need - have,
                )
