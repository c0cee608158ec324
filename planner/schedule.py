"""The pipeline schedule as data: per stage, the ordered list of actions it executes.

One module generates the schedule; the simulator, the cost model and the executor all
consume it (DESIGN.md, Executor). The vocabulary is that of
``torch.distributed.pipelining.schedules`` (``_ComputationType``), so an action prints as
torch prints it: ``1F0`` is stage 1's forward of micro-batch 0, ``0SEND_B3`` does not
exist (stage 0 has nobody upstream), ``2REDUCE_GRAD`` is stage 2's gradient reduction.

Every device of a stage runs the stage's list over its own slice of each micro-batch, so
the schedule is per stage, not per device; which rows travel to which peer of the next
stage is the executor's re-slicing, not the schedule's concern.

Compute order of a stage with warm-up w (forwards in flight before its first backward,
K_p of reference/asteroid.md §3.3, clamped to M):

    F0 .. F(w-1), then B(i) followed by F(i+w) while forwards remain, then the rest of B.

GPipe is the same rule with w = M on every stage (all forwards, then all backwards).
The communication actions wrap the compute: ``RECV_F m`` before ``F m`` (not on the
first stage), ``SEND_F m`` after it (not on the last stage), ``RECV_B m`` before
``B m`` (not on the last stage), ``SEND_B m`` after it (not on the first stage), and
one ``REDUCE_GRAD`` after the last backward.

Complexity: O(P·M) actions for P stages and M micro-batches, generated in that time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Literal

ScheduleName = Literal["1f1b", "gpipe"]


class ActionType(Enum):
    """What a stage does; values are torch's ``_ComputationType`` names."""

    F = "F"
    B = "B"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    REDUCE_GRAD = "REDUCE_GRAD"


COMPUTE = (ActionType.F, ActionType.B)


@dataclass(frozen=True)
class Action:
    """One action of stage ``stage`` on micro-batch ``micro_batch`` (None for REDUCE_GRAD)."""

    stage: int
    type: ActionType
    micro_batch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.micro_batch is None else str(self.micro_batch)
        return f"{self.stage}{self.type.value}{mb}"


Schedule = tuple[tuple[Action, ...], ...]
"""Per stage, in pipeline order, the stage's actions in execution order."""


def compute_order(num_micro_batches: int, warmup: int) -> list[tuple[Literal["F", "B"], int]]:
    """The forwards and backwards of one stage with warm-up ``warmup`` (clamped to
    ``[1, M]``), as ``("F", m)`` / ``("B", m)`` pairs in execution order.

    Raises ``ValueError`` for M < 1 or a warm-up < 1.
    """
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches is {num_micro_batches}; it must be >= 1")
    if warmup < 1:
        raise ValueError(f"warm-up {warmup} must be >= 1")
    w = min(warmup, num_micro_batches)
    order: list[tuple[Literal["F", "B"], int]] = [("F", m) for m in range(w)]
    for i in range(num_micro_batches):
        order.append(("B", i))
        if i + w < num_micro_batches:
            order.append(("F", i + w))
    return order


def one_f_one_b(warmups: Sequence[int], num_micro_batches: int) -> Schedule:
    """1F1B for ``len(warmups)`` stages, stage p keeping ``warmups[p]`` forwards in
    flight (the plan's ``stages[p].warmup``).

    Raises ``ValueError`` if the schedule would deadlock: after clamping to M the
    warm-ups must not increase along the pipeline (a stage must have sent every forward
    its successor runs before that successor's first backward).
    """
    if not warmups:
        raise ValueError("a schedule needs at least one stage")
    clamped = [min(w, num_micro_batches) for w in warmups]
    for p in range(len(clamped) - 1):
        if clamped[p] < clamped[p + 1]:
            raise ValueError(
                f"warm-ups {list(warmups)} deadlock at stages {p}-{p + 1} with "
                f"{num_micro_batches} micro-batches: they must not increase along the "
                "pipeline"
            )
    stages = len(warmups)
    return tuple(
        _with_communication(p, stages, compute_order(num_micro_batches, w))
        for p, w in enumerate(warmups)
    )


def gpipe(num_stages: int, num_micro_batches: int) -> Schedule:
    """GPipe for ``num_stages`` stages: all M forwards, then all M backwards."""
    return one_f_one_b([num_micro_batches] * num_stages, num_micro_batches)


def build(name: ScheduleName, warmups: Sequence[int], num_micro_batches: int) -> Schedule:
    """The schedule a plan names (``config.schedule``); GPipe ignores the warm-ups."""
    if name == "gpipe":
        return gpipe(len(warmups), num_micro_batches)
    if name == "1f1b":
        return one_f_one_b(warmups, num_micro_batches)
    raise ValueError(f"unknown schedule {name!r}; use '1f1b' or 'gpipe'")


def compute_actions(actions: Sequence[Action]) -> list[Action]:
    """Only the forwards and backwards of a stage's actions, in order."""
    return [a for a in actions if a.type in COMPUTE]


def to_csv(schedule: Schedule) -> str:
    """One line per stage, its actions comma-separated (torch's ``_dump_csv`` layout)."""
    return "".join(",".join(str(a) for a in actions) + "\n" for actions in schedule)


_ACTION = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|REDUCE_GRAD|F|B)(\d*)$")


def from_csv(text: str) -> Schedule:
    """Parse :func:`to_csv` output; raises ``ValueError`` naming a malformed action."""
    schedule = []
    for line_no, line in enumerate(text.strip().splitlines(), start=1):
        actions = []
        for token in line.strip().split(","):
            match = _ACTION.match(token.strip())
            if match is None:
                raise ValueError(f"line {line_no}: {token.strip()[:40]!r} is not an action")
            stage, kind, mb = match.groups()
            actions.append(Action(int(stage), ActionType(kind), int(mb) if mb else None))
        schedule.append(tuple(actions))
    return tuple(schedule)


def _with_communication(
    stage: int, num_stages: int, order: list[tuple[Literal["F", "B"], int]]
) -> tuple[Action, ...]:
    first, last = stage == 0, stage == num_stages - 1
    actions: list[Action] = []
    for kind, m in order:
        if kind == "F":
            if not first:
                actions.append(Action(stage, ActionType.RECV_F, m))
            actions.append(Action(stage, ActionType.F, m))
            if not last:
                actions.append(Action(stage, ActionType.SEND_F, m))
        else:
            if not last:
                actions.append(Action(stage, ActionType.RECV_B, m))
            actions.append(Action(stage, ActionType.B, m))
            if not first:
                actions.append(Action(stage, ActionType.SEND_B, m))
    actions.append(Action(stage, ActionType.REDUCE_GRAD))
    return tuple(actions)
