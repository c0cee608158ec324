"""The orders a round's actions are taken in: the plan's schedule (built once per shape)
and a topological order of its lanes, in which every action comes after what it waits for.

Both round computations walk a plan in such an order: the chain recurrence
(:func:`planner.cost.chain.schedule_makespan`, one lane per chain step) and the round's
makespans (:mod:`planner.cost.makespan`, one lane per stage, every device of a stage
running its stage's lane).
"""

from __future__ import annotations

from functools import lru_cache
from typing import cast

from edgepipe.planner import schedule as schedule_module
from edgepipe.planner.schedule import (
    ActionType,
    Schedule,
    ScheduleName,
    compute_actions,
    compute_order,
)

#: the error of a round whose schedule has no topological order
DEADLOCK = "the schedule deadlocks: a device waits for a transfer never sent"

#: one lane's compute actions in order, each ``(is forward, micro-batch)``
Lane = list[tuple[bool, int]]

#: every action of a round as ``(lane, is forward, micro-batch)``, in topological order
Order = list[tuple[int, bool, int]]


@lru_cache(maxsize=256)
def cached_schedule(name: ScheduleName, warmups: tuple[int, ...], num_micro_batches: int
                    ) -> Schedule:
    """The plan's schedule, :func:`planner.schedule.build`, cached per (name, warm-ups,
    M): a schedule is immutable and building one is O(P x M) objects, which a planner
    evaluating thousands of plans of the same shape would rebuild each time."""
    return schedule_module.build(name, warmups, num_micro_batches)


def topological(lanes: list[Lane]) -> Order | None:
    """Lanes p = 0..P-1 (stages or chain steps), each a list of ``(is forward,
    micro-batch)`` run in order; ``F m`` of lane p waits for ``F m`` of lane p-1 and
    ``B m`` for ``B m`` of lane p+1. Returns every action as ``(lane, is forward,
    micro-batch)`` in an order that respects both, or None if none exists (a deadlock).
    Worklist: a lane advances while its next action's dependency is done and wakes the
    lane that waits for what it did; O(actions)."""
    last = len(lanes) - 1
    m_count = 1 + max((m for lane in lanes for _, m in lane), default=0)
    done = [(bytearray(m_count), bytearray(m_count)) for _ in lanes]  # backward, forward
    pos = [0] * len(lanes)
    order: Order = []
    work = list(range(len(lanes)))
    while work:  # a lane runs as far as it can, then wakes the lanes that wait for it
        p = work.pop()
        lane, k = lanes[p], pos[p]
        before = done[p - 1][1] if p > 0 else None
        after = done[p + 1][0] if p < last else None
        mine_b, mine_f = done[p]
        sent_f = sent_b = False
        while k < len(lane):
            forward, m = lane[k]
            if forward:
                if before is not None and not before[m]:
                    break
                mine_f[m] = sent_f = True
            else:
                if after is not None and not after[m]:
                    break
                mine_b[m] = sent_b = True
            order.append((p, forward, m))
            k += 1
        pos[p] = k
        if sent_f and p < last:
            work.append(p + 1)
        if sent_b and p > 0:
            work.append(p - 1)
    if any(pos[p] < len(lane) for p, lane in enumerate(lanes)):
        return None
    return order


@lru_cache(maxsize=256)
def chain_order(warmups: tuple[int, ...], num_micro_batches: int) -> Order:
    """:func:`topological` order of the chain's steps with these warm-ups (each step's
    lane its :func:`planner.schedule.compute_order`). Raises ValueError if the warm-ups
    deadlock."""
    order = topological(
        [
            [(kind == "F", mb) for kind, mb in compute_order(num_micro_batches, w)]
            for w in warmups
        ]
    )
    if order is None:
        raise ValueError(
            "the schedule's warm-ups deadlock; warm-ups must not grow along the chain"
        )
    return order


def stage_order(schedule: Schedule) -> tuple[list[Lane], Order | None, int]:
    """Per stage its forwards and backwards as ``(is forward, micro-batch)`` in schedule
    order, every stage's actions in an order where each comes after what it waits for
    (:func:`topological`; None if the schedule deadlocks), and 1 + the largest
    micro-batch number. Every device of a stage runs
    the stage's actions and waits only for devices of the neighbouring stages, so the
    order is topological for every device's actions too. Cached per schedule object
    (schedules are immutable; the entry keeps its schedule alive, so its id is not
    reused while cached)."""
    hit = _STAGE_ORDERS.get(id(schedule))
    if hit is not None and hit[0] is schedule:
        return hit[1], hit[2], hit[3]
    # a compute action (F or B) always names its micro-batch
    lanes = [
        [(a.type is ActionType.F, cast(int, a.micro_batch)) for a in compute_actions(actions)]
        for actions in schedule
    ]
    order = topological(lanes)
    m_count = 1 + max((m for lane in lanes for _, m in lane), default=0)
    if len(_STAGE_ORDERS) >= 64:
        _STAGE_ORDERS.clear()
    _STAGE_ORDERS[id(schedule)] = (schedule, lanes, order, m_count)
    return lanes, order, m_count


_STAGE_ORDERS: dict[int, tuple[Schedule, list[Lane], Order | None, int]] = {}
