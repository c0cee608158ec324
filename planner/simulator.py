"""Discrete-event simulation of one synchronous pipeline round over a :class:`StepChain`.

This is the ground truth the closed-form cost model (reference/asteroid.md §3.4) is
checked against, so it is written from the schedule semantics alone, never from the
formulas.

Model:
    * Every step of the chain (stage compute or link) is one sequential resource. It runs
      the actions of its list in order, one at a time, without preemption: ``("F", m)``
      (forward of micro-batch m) takes ``Step.forward_ms``, ``("B", m)`` takes
      ``Step.backward_ms``.
    * An action starts as soon as the step has finished its previous action and its
      dependency is done:

        - ``F(s, m)`` needs ``F(s-1, m)`` (no dependency on step 0);
        - ``B(s, m)`` needs ``B(s+1, m)``; on the last step it needs ``F(S-1, m)``.

    * After its last action a stage step all-reduces its gradients for
      ``Step.allreduce_ms``; nothing waits for the all-reduce, it only extends the round.
    * Inside a stage every device starts each action with the step and is busy for its own
      time (``device_forward_ms`` / ``device_backward_ms``), then idle until the step's
      action ends; all devices take part in the whole all-reduce.

A schedule is data, as in ``torch.distributed.pipelining``: per step an ordered list of
actions. :func:`one_f_one_b` builds 1F1B from the steps' warm-ups, :func:`gpipe` the
all-forwards-then-all-backwards schedule, both with the compute order of
:func:`planner.schedule.compute_order` (the one schedule generator).

Complexity: every action is pushed on and popped from an event heap once, so a round of
S steps and M micro-batches costs O(S·M log(S·M)) time (the heap never holds more than S
events) and O(S·M) memory.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal, NamedTuple

from planner.schedule import compute_order
from planner.steps import Step, StepChain

ActionKind = Literal["F", "B"]
Action = tuple[ActionKind, int]
Schedule = list[list[Action]]


class Interval(NamedTuple):
    """One busy interval: an action (``"F"``, ``"B"``) or the all-reduce (``"AR"``,
    micro-batch -1), from ``start_ms`` to ``end_ms`` after the round starts."""

    kind: Literal["F", "B", "AR"]
    micro_batch: int
    start_ms: float
    end_ms: float

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class Timeline:
    """The simulated round.

    Attributes:
        chain: the simulated chain.
        steps: per step, its intervals in execution order (the all-reduce last).
        devices: per device id of a stage, its busy intervals in time order; keys follow
            pipeline order, then the order of ``Step.devices``.
        makespan_ms: end of the last interval of any step, all-reduces included.
        step_end_ms: per step, the end of its last interval.
        busy_ms: per step, the summed length of its intervals.
        idle_ms: per step, ``makespan_ms - busy_ms``.
    """

    chain: StepChain
    steps: tuple[tuple[Interval, ...], ...]
    devices: dict[str, tuple[Interval, ...]]
    makespan_ms: float
    step_end_ms: tuple[float, ...]
    busy_ms: tuple[float, ...]
    idle_ms: tuple[float, ...]


def one_f_one_b(chain: StepChain) -> Schedule:
    """The 1F1B schedule: step s with warm-up w = min(Step.warmup, M) runs F0..F(w-1),
    then B(i) followed by F(i+w) while forwards remain, then the remaining backwards.

    Warm-ups must not increase along the chain (after clamping) and the last must be at
    least 1, or :func:`simulate` reports a deadlock. Raises ``ValueError`` for M < 1 or a
    warm-up below 1.
    """
    m_count = _micro_batches(chain)
    for s, step in enumerate(chain.steps):
        if step.warmup < 1:
            raise ValueError(f"step {s} ({_name(step)}): warm-up {step.warmup} is below 1")
    return [compute_order(m_count, step.warmup) for step in chain.steps]


def gpipe(chain: StepChain) -> Schedule:
    """The GPipe schedule: every step runs all M forwards, then all M backwards."""
    m_count = _micro_batches(chain)
    return [compute_order(m_count, m_count) for _ in chain.steps]


def simulate(chain: StepChain, schedule: Schedule | None = None) -> Timeline:
    """Simulate one round of ``chain`` under ``schedule`` (default :func:`one_f_one_b`).

    Raises ``ValueError`` if the chain is malformed (no steps, M < 1, a negative or NaN
    time, device times that do not match the step), if the schedule does not list every
    ``F`` and ``B`` of every micro-batch exactly once per step, or if it deadlocks (the
    message names each blocked step, the action it cannot start and what that waits for).
    """
    _check_chain(chain)
    if schedule is None:
        schedule = one_f_one_b(chain)
    _check_schedule(chain, schedule)
    steps = chain.steps
    last = len(steps) - 1

    done: dict[tuple[int, Action], float] = {}  # (step, action) -> end time
    intervals: list[list[Interval]] = [[] for _ in steps]
    position = [0] * len(steps)  # index of the next action of each step
    free_at = [0.0] * len(steps)  # end of each step's previous action
    running = [False] * len(steps)
    events: list[tuple[float, int]] = []  # (end time, step); one per running step

    def try_start(s: int) -> None:
        if running[s] or position[s] == len(schedule[s]):
            return
        action = schedule[s][position[s]]
        start = free_at[s]
        dep = _dependency(s, action, last)
        if dep is not None:
            if dep not in done:
                return
            start = max(start, done[dep])
        kind, m = action
        duration = steps[s].forward_ms if kind == "F" else steps[s].backward_ms
        intervals[s].append(Interval(kind, m, start, start + duration))
        running[s] = True
        heapq.heappush(events, (start + duration, s))

    for s in range(len(steps)):
        try_start(s)
    while events:
        end, s = heapq.heappop(events)
        done[(s, schedule[s][position[s]])] = end
        position[s] += 1
        running[s] = False
        free_at[s] = end
        # Only the step itself and its two neighbours can have been waiting on this action.
        for r in (s - 1, s, s + 1):
            if 0 <= r <= last:
                try_start(r)

    if len(done) < sum(len(actions) for actions in schedule):
        raise ValueError(_deadlock_message(chain, schedule, position, done))

    for s, step in enumerate(steps):
        if step.allreduce_ms > 0:
            intervals[s].append(Interval("AR", -1, free_at[s], free_at[s] + step.allreduce_ms))
    step_end = tuple(iv[-1].end_ms for iv in intervals)
    makespan = max(step_end)
    busy = tuple(sum(i.duration_ms for i in iv) for iv in intervals)
    return Timeline(
        chain=chain,
        steps=tuple(tuple(iv) for iv in intervals),
        devices=_device_intervals(steps, intervals),
        makespan_ms=makespan,
        step_end_ms=step_end,
        busy_ms=busy,
        idle_ms=tuple(makespan - b for b in busy),
    )


def _dependency(s: int, action: Action, last: int) -> tuple[int, Action] | None:
    """The (step, action) that must be done before ``action`` may start on step s."""
    kind, m = action
    if kind == "F":
        return (s - 1, ("F", m)) if s > 0 else None
    return (s + 1, ("B", m)) if s < last else (s, ("F", m))


def _device_intervals(
    steps: tuple[Step, ...], intervals: list[list[Interval]]
) -> dict[str, tuple[Interval, ...]]:
    devices: dict[str, tuple[Interval, ...]] = {}
    for step, step_intervals in zip(steps, intervals, strict=True):
        for d, device in enumerate(step.devices):
            own = {"F": step.device_forward_ms[d], "B": step.device_backward_ms[d]}
            devices[device] = tuple(
                iv
                if iv.kind == "AR"
                else Interval(iv.kind, iv.micro_batch, iv.start_ms, iv.start_ms + own[iv.kind])
                for iv in step_intervals
            )
    return devices


def _micro_batches(chain: StepChain) -> int:
    if chain.num_micro_batches < 1:
        raise ValueError(f"num_micro_batches is {chain.num_micro_batches}; it must be >= 1")
    return chain.num_micro_batches


def _name(step: Step) -> str:
    return f"stage {step.index}" if step.kind == "stage" else f"link {step.index}"


def _slack(ms: float) -> float:
    """``ms`` plus a rounding tolerance, for device times recomputed by the caller."""
    return ms * (1 + 1e-9) + 1e-12


def _check_chain(chain: StepChain) -> None:
    _micro_batches(chain)
    if not chain.steps:
        raise ValueError("the chain has no steps")
    seen: set[str] = set()
    for s, step in enumerate(chain.steps):
        where = f"step {s} ({_name(step)})"
        times = (step.forward_ms, step.backward_ms, step.allreduce_ms)
        times += step.device_forward_ms + step.device_backward_ms
        if not all(t >= 0 for t in times):  # also rejects NaN
            raise ValueError(f"{where}: times must be >= 0, got {times}")
        if step.kind == "link" and (step.allreduce_ms or step.devices):
            raise ValueError(f"{where}: a link has no devices and no all-reduce")
        n = len(step.devices)
        if len(step.device_forward_ms) != n or len(step.device_backward_ms) != n:
            raise ValueError(
                f"{where}: {n} devices but {len(step.device_forward_ms)} forward and "
                f"{len(step.device_backward_ms)} backward device times"
            )
        for device, f, b in zip(
            step.devices, step.device_forward_ms, step.device_backward_ms, strict=True
        ):
            if f > _slack(step.forward_ms) or b > _slack(step.backward_ms):
                raise ValueError(
                    f"{where}: device {device!r} takes ({f}, {b}) ms, longer than the "
                    f"step's ({step.forward_ms}, {step.backward_ms}) ms"
                )
            if device in seen:
                raise ValueError(f"{where}: device {device!r} appears in two stages")
            seen.add(device)


def _check_schedule(chain: StepChain, schedule: Schedule) -> None:
    if len(schedule) != len(chain.steps):
        raise ValueError(f"the schedule has {len(schedule)} steps, the chain {len(chain.steps)}")
    expected = {(kind, m) for kind in ("F", "B") for m in range(chain.num_micro_batches)}
    for s, actions in enumerate(schedule):
        where = f"step {s} ({_name(chain.steps[s])})"
        seen: set[Action] = set()
        for action in actions:
            if action not in expected:
                raise ValueError(f"{where}: unknown action {action!r}")
            if action in seen:
                raise ValueError(f"{where}: action {action!r} appears twice")
            seen.add(action)
        if missing := sorted(expected - seen):
            raise ValueError(f"{where}: actions {missing} are missing")


def _deadlock_message(
    chain: StepChain,
    schedule: Schedule,
    position: list[int],
    done: dict[tuple[int, Action], float],
) -> str:
    last = len(chain.steps) - 1
    blocked = []
    for s, actions in enumerate(schedule):
        if position[s] < len(actions):
            action = actions[position[s]]
            dep = _dependency(s, action, last)
            assert dep is not None and dep not in done  # only dependencies can block
            blocked.append(
                f"step {s} ({_name(chain.steps[s])}) cannot start {action!r}, which waits "
                f"for {dep[1]!r} on step {dep[0]}"
            )
    return "the schedule deadlocks: " + "; ".join(blocked)
