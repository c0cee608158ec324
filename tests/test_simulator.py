"""Specification of planner.simulator: hand-worked schedules, properties, and agreement
with an independent longest-path computation over the action DAG."""

from __future__ import annotations

from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.gantt import draw_gantt, rows, timeline_text
from planner.simulator import Action, Interval, Schedule, gpipe, one_f_one_b, simulate
from planner.steps import Step, StepChain


def stage(
    index: int,
    f: float,
    b: float,
    warmup: int,
    allreduce: float = 0.0,
    devices: tuple[str, ...] = (),
    device_f: tuple[float, ...] = (),
    device_b: tuple[float, ...] = (),
) -> Step:
    return Step("stage", index, f, b, allreduce, warmup, devices, device_f, device_b)


def link(index: int, f: float, b: float, warmup: int) -> Step:
    return Step("link", index, f, b, 0.0, warmup)


def F(m: int, start: float, end: float) -> Interval:
    return Interval("F", m, start, end)


def B(m: int, start: float, end: float) -> Interval:
    return Interval("B", m, start, end)


# Two stages and a link, M = 3, the slow stage first: stage 0 F=2 B=4, link F=B=1,
# stage 1 F=1 B=2. Asteroid warm-ups min(M, S-s) = (3, 2, 1).
def two_stage_chain(allreduce: tuple[float, float] = (0.0, 0.0)) -> StepChain:
    return StepChain(
        (
            stage(0, 2, 4, 3, allreduce[0]),
            link(0, 1, 1, 2),
            stage(1, 1, 2, 1, allreduce[1]),
        ),
        3,
    )


def test_single_stage_alternates_forward_and_backward() -> None:
    # One stage, no links, M=3, F=1, B=2, warm-up 1:
    # F0 [0,1] B0 [1,3] F1 [3,4] B1 [4,6] F2 [6,7] B2 [7,9]  -> makespan 9, never idle.
    chain = StepChain((stage(0, 1, 2, 1),), 3)
    t = simulate(chain)
    assert t.steps == ((F(0, 0, 1), B(0, 1, 3), F(1, 3, 4), B(1, 4, 6), F(2, 6, 7), B(2, 7, 9)),)
    assert t.makespan_ms == 9
    assert t.busy_ms == (9,)
    assert t.idle_ms == (0,)
    # GPipe: F0 F1 F2 [0,3] then B0 B1 B2 [3,9]: same makespan on one resource.
    assert simulate(chain, gpipe(chain)).makespan_ms == 9


def test_schedule_generators() -> None:
    chain = two_stage_chain()
    assert one_f_one_b(chain) == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)],
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)],
    ]
    assert gpipe(chain) == [[("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]] * 3
    # Warm-up above M is clamped to M.
    assert one_f_one_b(StepChain((stage(0, 1, 1, 9),), 2)) == [
        [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    ]


def test_two_stages_one_f_one_b_by_hand() -> None:
    # step 0 (stage 0): F0 [0,2] F1 [2,4] F2 [4,6]  .. B0 [7,11] B1 [11,15] B2 [15,19]
    # step 1 (link):      F0 [2,3] . F1 [4,5] B0 [6,7] F2 [7,8] . B1 [9,10] .. B2 [12,13]
    # step 2 (stage 1):     F0 [3,4] B0 [4,6] F1 [6,7] B1 [7,9] F2 [9,10] B2 [10,12]
    # link B0 waits for stage 1's B0 (6); stage 0's B0 for the link's B0 (7); link F2 runs
    # after its B0 (7, F2 of stage 0 done at 6); stage 1's F2 waits for link F2 (8) but is
    # busy until 9; the last backward climbs back 12 -> 13 -> 19.
    t = simulate(two_stage_chain())
    assert t.steps == (
        (F(0, 0, 2), F(1, 2, 4), F(2, 4, 6), B(0, 7, 11), B(1, 11, 15), B(2, 15, 19)),
        (F(0, 2, 3), F(1, 4, 5), B(0, 6, 7), F(2, 7, 8), B(1, 9, 10), B(2, 12, 13)),
        (F(0, 3, 4), B(0, 4, 6), F(1, 6, 7), B(1, 7, 9), F(2, 9, 10), B(2, 10, 12)),
    )
    assert t.makespan_ms == 19
    assert t.step_end_ms == (19, 13, 12)
    assert t.busy_ms == (18, 6, 9)
    assert t.idle_ms == (1, 13, 10)
    assert t.devices == {}


def test_two_stages_gpipe_by_hand() -> None:
    # step 0: F0 [0,2] F1 [2,4] F2 [4,6] ......... B0 [11,15] B1 [15,19] B2 [19,23]
    # step 1:   F0 [2,3] F1 [4,5] F2 [6,7] .. B0 [10,11] B1 [12,13] B2 [14,15]
    # step 2:     F0 [3,4] F1 [5,6] F2 [7,8] B0 [8,10] B1 [10,12] B2 [12,14]
    # All backwards of stage 0 queue behind B0, 4 ms more than 1F1B.
    chain = two_stage_chain()
    t = simulate(chain, gpipe(chain))
    assert t.steps == (
        (F(0, 0, 2), F(1, 2, 4), F(2, 4, 6), B(0, 11, 15), B(1, 15, 19), B(2, 19, 23)),
        (F(0, 2, 3), F(1, 4, 5), F(2, 6, 7), B(0, 10, 11), B(1, 12, 13), B(2, 14, 15)),
        (F(0, 3, 4), F(1, 5, 6), F(2, 7, 8), B(0, 8, 10), B(1, 10, 12), B(2, 12, 14)),
    )
    assert t.makespan_ms == 23


def test_allreduce_follows_last_backward() -> None:
    # Stage 0 ends its backwards at 19 (see the 1F1B test): a 5 ms all-reduce ends at 24.
    t = simulate(two_stage_chain((5.0, 0.0)))
    assert t.steps[0][-1] == Interval("AR", -1, 19, 24)
    assert t.makespan_ms == 24
    assert t.busy_ms[0] == 23
    # Stage 1 ends at 12: a 3 ms all-reduce [12,15] hides under stage 0's tail.
    t = simulate(two_stage_chain((0.0, 3.0)))
    assert t.steps[2][-1] == Interval("AR", -1, 12, 15)
    assert t.step_end_ms == (19, 13, 15)
    assert t.makespan_ms == 19


def test_uneven_stage_devices_idle_until_the_step_ends() -> None:
    # Stage 0 of the 1F1B example run by two devices: "a" is the straggler (2, 4) that
    # sets the step's times, "b" takes (1.5, 3) and idles for the rest of each action.
    # The all-reduce (5 ms) occupies both devices.
    chain = StepChain(
        (
            stage(0, 2, 4, 3, 5.0, ("a", "b"), (2, 1.5), (4, 3)),
            link(0, 1, 1, 2),
            stage(1, 1, 2, 1, 0.0, ("c",), (1,), (2,)),
        ),
        3,
    )
    t = simulate(chain)
    ar = Interval("AR", -1, 19, 24)
    assert t.devices["a"] == t.steps[0]
    assert t.devices["b"] == (
        F(0, 0, 1.5),
        F(1, 2, 3.5),
        F(2, 4, 5.5),
        B(0, 7, 10),
        B(1, 11, 14),
        B(2, 15, 18),
        ar,
    )
    assert t.devices["c"] == t.steps[2]
    assert list(t.devices) == ["a", "b", "c"]
    assert t.makespan_ms == 24


def test_inconsistent_warmups_deadlock() -> None:
    # Warm-ups (1, 2, 1), M = 2. Step 0 runs F0 then waits at B0 for the link's B0; the
    # link runs F0, then wants F1, which step 0 only sends after its B0: a cycle.
    chain = StepChain((stage(0, 1, 1, 1), link(0, 1, 1, 2), stage(1, 1, 1, 1)), 2)
    with pytest.raises(ValueError, match="deadlock") as err:
        simulate(chain)
    message = str(err.value)
    assert "step 0 (stage 0) cannot start ('B', 0)" in message
    assert "step 1 (link 0) cannot start ('F', 1)" in message
    # Warm-up 0 would put B0 before its own F0: refused when the schedule is built.
    with pytest.raises(ValueError, match=r"step 0 \(stage 0\): warm-up 0 is below 1"):
        simulate(StepChain((stage(0, 1, 1, 0),), 2))


@pytest.mark.parametrize(
    ("chain", "schedule", "match"),
    [
        (StepChain((stage(0, 1, 1, 1),), 0), None, "num_micro_batches"),
        (StepChain((), 2), None, "no steps"),
        (StepChain((stage(0, -1, 1, 1),), 1), None, ">= 0"),
        (StepChain((stage(0, float("nan"), 1, 1),), 1), None, ">= 0"),
        (StepChain((stage(0, 1, 1, -1),), 1), None, "below 1"),
        (StepChain((stage(0, 1, 1, 1, 0, ("a",), (2,), (1,)),), 1), None, "longer"),
        (StepChain((stage(0, 1, 1, 1, 0, ("a",), (), ()),), 1), None, "device times"),
        (
            StepChain(
                (
                    stage(0, 1, 1, 1, 0, ("a",), (1,), (1,)),
                    stage(1, 1, 1, 1, 0, ("a",), (1,), (1,)),
                ),
                1,
            ),
            None,
            "two stages",
        ),
        (StepChain((Step("link", 0, 1, 1, 2.0, 1),), 1), None, "no all-reduce"),
        (StepChain((stage(0, 1, 1, 1),), 2), [[("F", 0), ("B", 0), ("F", 1)]], "missing"),
        (StepChain((stage(0, 1, 1, 1),), 1), [[("F", 0), ("B", 0), ("F", 0)]], "twice"),
        (StepChain((stage(0, 1, 1, 1),), 1), [[("F", 0), ("B", 0), ("X", 0)]], "unknown"),
        (StepChain((stage(0, 1, 1, 1),), 1), [[("F", 0), ("B", 0)]] * 2, "schedule has 2"),
    ],
)
def test_rejects_bad_input(chain: StepChain, schedule: Schedule | None, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        simulate(chain, schedule)


# --- independent reference: longest path over the action DAG -----------------------------


class CycleError(Exception):
    """The action graph has a cycle (the schedule can never finish)."""


def longest_path_ends(
    chain: StepChain, schedule: Schedule
) -> dict[tuple[int, Action], float] | None:
    """End time of every action as the longest path in the DAG whose edges are "previous
    action on the same step" and the pipeline dependency; None if the graph has a cycle."""
    last = len(chain.steps) - 1
    previous: dict[tuple[int, Action], tuple[int, Action]] = {}
    for s, actions in enumerate(schedule):
        for a, b in pairwise(actions):
            previous[(s, b)] = (s, a)

    def preds(node: tuple[int, Action]) -> list[tuple[int, Action]]:
        s, (kind, m) = node
        out = [previous[node]] if node in previous else []
        if kind == "F" and s > 0:
            out.append((s - 1, ("F", m)))
        elif kind == "B":
            out.append((s + 1, ("B", m)) if s < last else (s, ("F", m)))
        return out

    on_stack: set[tuple[int, Action]] = set()

    @cache
    def end(node: tuple[int, Action]) -> float:
        if node in on_stack:
            raise CycleError(node)
        on_stack.add(node)
        step = chain.steps[node[0]]
        duration = step.forward_ms if node[1][0] == "F" else step.backward_ms
        value = duration + max((end(p) for p in preds(node)), default=0.0)
        on_stack.discard(node)
        return value

    try:
        return {(s, a): end((s, a)) for s, actions in enumerate(schedule) for a in actions}
    except CycleError:
        return None


@st.composite
def chains(draw: st.DrawFn, consistent_warmups: bool = True) -> StepChain:
    """Random chains with integer times (exact float arithmetic). With consistent warm-ups
    they do not increase along the chain and the last is >= 1 (deadlock-free 1F1B)."""
    num_stages = draw(st.integers(1, 4))
    m_count = draw(st.integers(1, 6))
    num_steps = 2 * num_stages - 1
    if consistent_warmups:
        raw = draw(st.lists(st.integers(1, m_count + 1), min_size=num_steps, max_size=num_steps))
        warmups = sorted(raw, reverse=True)
    else:
        warmups = draw(
            st.lists(st.integers(1, m_count + 1), min_size=num_steps, max_size=num_steps)
        )
    times = st.integers(0, 6).map(float)
    steps = []
    for s in range(num_steps):
        if s % 2:
            steps.append(link(s // 2, draw(times), draw(times), warmups[s]))
            continue
        n = draw(st.integers(0, 2))
        device_f = tuple(draw(times) for _ in range(n))
        device_b = tuple(draw(times) for _ in range(n))
        f = max(device_f) if n else draw(times)
        b = max(device_b) if n else draw(times)
        devices = tuple(f"d{s}.{k}" for k in range(n))
        steps.append(stage(s // 2, f, b, warmups[s], draw(times), devices, device_f, device_b))
    return StepChain(tuple(steps), m_count)


def assert_no_overlap(intervals: tuple[Interval, ...]) -> None:
    for a, b in pairwise(intervals):
        assert a.start_ms <= a.end_ms <= b.start_ms


@settings(max_examples=150, deadline=None)
@given(chain=chains(), use_gpipe=st.booleans())
def test_matches_longest_path_and_bounds(chain: StepChain, use_gpipe: bool) -> None:
    schedule = gpipe(chain) if use_gpipe else one_f_one_b(chain)
    t = simulate(chain, schedule)
    m_count = chain.num_micro_batches

    reference = longest_path_ends(chain, schedule)
    assert reference is not None
    for s, intervals in enumerate(t.steps):
        actions = [iv for iv in intervals if iv.kind != "AR"]
        assert [(iv.kind, iv.micro_batch) for iv in actions] == schedule[s]
        for iv in actions:
            assert iv.end_ms == reference[(s, (iv.kind, iv.micro_batch))]
        assert_no_overlap(intervals)
    for intervals in t.devices.values():
        assert_no_overlap(intervals)

    # Every step is busy M(F+B) + all-reduce; one micro-batch must cross the chain forward
    # and back.
    steps = chain.steps
    assert t.makespan_ms >= max(
        m_count * (s.forward_ms + s.backward_ms) + s.allreduce_ms for s in steps
    )
    assert t.makespan_ms >= sum(s.forward_ms + s.backward_ms for s in steps)
    assert t.makespan_ms == max(t.step_end_ms)
    for busy, idle, step in zip(t.busy_ms, t.idle_ms, steps, strict=True):
        assert busy == m_count * (step.forward_ms + step.backward_ms) + step.allreduce_ms
        assert busy + idle == t.makespan_ms


@settings(max_examples=150, deadline=None)
@given(chain=chains(consistent_warmups=False))
def test_deadlock_iff_action_graph_has_a_cycle(chain: StepChain) -> None:
    schedule = one_f_one_b(chain)
    reference = longest_path_ends(chain, schedule)
    if reference is None:
        with pytest.raises(ValueError, match="deadlock"):
            simulate(chain, schedule)
    else:
        t = simulate(chain, schedule)
        ends = {
            (s, (iv.kind, iv.micro_batch)): iv.end_ms for s, ivs in enumerate(t.steps) for iv in ivs
        }
        assert {k: v for k, v in ends.items() if k[1][0] != "AR"} == reference


def test_gantt_and_text(tmp_path: Path) -> None:
    chain = StepChain(
        (
            stage(0, 2, 4, 3, 5.0, ("a", "b"), (2, 1.5), (4, 3)),
            link(0, 1, 1, 2),
            stage(1, 1, 2, 1),
        ),
        3,
    )
    t = simulate(chain)
    assert [label for label, _ in rows(t)] == ["stage 0 · a", "stage 0 · b", "link 0→1", "stage 1"]
    path = tmp_path / "gantt.png"
    draw_gantt(t, path, title="two stages")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = timeline_text(t)
    assert text.splitlines()[0] == "makespan 24.000 ms (3 steps, M = 3)"
    # Device b: forwards 3 * 1.5 + backwards 3 * 3 + all-reduce 5 = 18.5 of 24 ms.
    assert any(line.split()[-2:] == ["18.500", "77.1%"] for line in text.splitlines())
