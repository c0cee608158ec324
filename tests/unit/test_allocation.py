"""Algorithm 1 (planner.solvers.allocation): proportional split + straggler offloading."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from edgepipe.planner.solvers.allocation import allocate, allocate_classes


def table_from(times: list[list[float]]) -> np.ndarray:
    """(g, 2, Y+1) prefix table for one block whose device d takes times[d][y] at y."""
    arr = np.asarray(times, dtype=float)
    return np.stack([np.zeros_like(arr), arr], axis=1)


def run(times: list[list[float]], batch: int, caps: list[int] | None = None):
    table = table_from(times)
    g = len(times)
    cap = np.array([caps if caps is not None else [batch] * g])
    y, ok = allocate(table, np.array([0]), np.array([1]), batch, cap)
    return list(y[0]), bool(ok[0])


def linear(rate: float, batch: int) -> list[float]:
    return [rate * y for y in range(batch + 1)]


def test_equal_devices_split_evenly():
    assert run([linear(1, 4), linear(1, 4)], 4) == ([2, 2], True)


def test_three_times_faster_device_takes_three_quarters():
    # v = 1/(1*8) and 1/(3*8): shares 6 and 2
    assert run([linear(1, 8), linear(3, 8)], 8) == ([6, 2], True)


def test_memory_cap_moves_samples_to_the_device_with_room():
    # device 0 is faster but may hold one sample only
    assert run([linear(1, 4), linear(2, 4)], 4, caps=[1, 4]) == ([1, 3], True)


def test_caps_below_the_batch_are_infeasible():
    _, ok = run([linear(1, 4), linear(1, 4)], 4, caps=[1, 2])
    assert not ok


def test_a_useless_device_is_left_idle():
    # device 1 needs 100 ms for one sample; device 0 does all 3 in 3 ms
    y, ok = run([linear(1, 3), [0, 100, 200, 300]], 3)
    assert ok and y == [3, 0]


def test_offloading_fixes_a_bad_proportional_start():
    # at B=4 both take 8 ms (equal v -> 2/2), but device 1 has a large fixed cost:
    # t0(y) = 2y, t1(y) = 7 + y/4 for y > 0. Best: y = (3, 1) with max(6, 7.25) = 7.25
    t1 = [0.0] + [7 + y / 4 for y in range(1, 5)]
    y, ok = run([linear(2, 4), t1], 4)
    assert ok and y == [3, 1]


def test_a_straggler_on_a_flat_stretch_still_offloads():
    # device 0 takes 3 ms for 1 to 4 samples (flat), device 1 1 ms per sample: moving
    # one sample off device 0 does not speed it up, but moving all of them does
    flat = [0.0, 3.0, 3.0, 3.0, 3.0]
    y, ok = run([flat, [0.0, 0.5, 1.0, 1.5, 2.0]], 4, caps=[4, 4])
    assert ok and y == [0, 4]


@pytest.mark.parametrize("seed", range(60))
def test_result_is_min_max_optimal_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    g, batch = int(rng.integers(2, 5)), int(rng.integers(1, 9))
    times = []
    for _ in range(g):
        # non-decreasing curve with random shape and flat stretches
        steps = rng.uniform(0.1, 3.0, size=batch) * (rng.random(batch) < 0.7)
        times.append([0.0, *np.cumsum(steps).tolist()])
    caps = [int(c) for c in rng.integers(0, batch + 1, size=g)]
    y, ok = run(times, batch, caps)
    feasible = [c for c in itertools.product(*(range(k + 1) for k in caps)) if sum(c) == batch]
    assert ok == bool(feasible)
    if feasible:
        best = min(max(times[d][c[d]] for d in range(g)) for c in feasible)
        assert max(times[d][y[d]] for d in range(g)) == pytest.approx(best)
        assert sum(y) == batch and all(0 <= y[d] <= caps[d] for d in range(g))


def test_rows_are_independent():
    times = [linear(1, 4), linear(3, 4)]
    table = np.concatenate([table_from(times), table_from([linear(2, 4), linear(2, 4)])[:, 1:]], 1)
    # rows: block 0 alone, block 1 alone, both blocks
    first, end = np.array([0, 1, 0]), np.array([1, 2, 2])
    y, ok = allocate(table, first, end, 4, np.full((3, 2), 4))
    for r in range(3):
        y1, _ = allocate(table, first[r : r + 1], end[r : r + 1], 4, np.full((1, 2), 4))
        assert list(y[r]) == list(y1[0])
    assert ok.all()


def algorithm_1_one_row(times: list[list[float]], batch: int, caps: list[int]) -> list[int]:
    """The module docstring's Algorithm 1 for one row, device by device in plain Python
    (the oracle: shares no code with planner.solvers.allocation)."""
    g = len(times)
    caps = [min(max(c, 0), batch) for c in caps]
    speed = [1.0 / max(t[batch], 1e-12) for t in times]
    y = [0] * g
    for _ in range(g + 1):
        left = batch - sum(y)
        room = [caps[d] > y[d] for d in range(g)]
        if left <= 0 or not any(room):
            break
        w = [speed[d] if room[d] else 0.0 for d in range(g)]
        total = sum(w)
        share = [left * w[d] / total for d in range(g)]
        base = [int(np.floor(s)) for s in share]
        order = sorted(range(g), key=lambda d: -(share[d] - base[d]))  # stable: index
        extra = left - sum(base)
        for rank, d in enumerate(order):
            y[d] = min(y[d] + base[d] + (rank < extra), caps[d])
    if sum(y) != batch:
        return y
    while True:
        busy = [times[d][y[d]] if y[d] > 0 else -np.inf for d in range(g)]
        slow = max(range(g), key=lambda d: (busy[d], -d))
        offers = [times[d][y[d] + 1] if y[d] < caps[d] and d != slow else np.inf for d in range(g)]
        fast = min(range(g), key=lambda d: (offers[d], d))
        if not offers[fast] < times[slow][y[slow]]:
            return y
        y[slow] -= 1
        y[fast] += 1


@pytest.mark.parametrize("seed", range(20))
def test_many_rows_equal_the_one_row_oracle(seed):
    # rows stop offloading after different numbers of moves (some at once, some after
    # many), so the lockstep bookkeeping of the rows still moving is exercised
    rng = np.random.default_rng(100 + seed)
    g, batch, blocks = int(rng.integers(2, 7)), int(rng.integers(4, 17)), 4
    steps = rng.uniform(0.0, 2.0, size=(g, blocks, batch)) * (rng.random((g, blocks, batch)) < 0.8)
    # large fixed costs make the proportional start far from the optimum: many moves
    fixed = rng.uniform(0.0, 20.0, size=(g, blocks, 1)) * (rng.random((g, blocks, 1)) < 0.5)
    per_block = np.concatenate([np.zeros((g, blocks, 1)), fixed + np.cumsum(steps, axis=2)], 2)
    per_block[:, :, 0] = 0.0
    table = np.concatenate([np.zeros((g, 1, batch + 1)), np.cumsum(per_block, axis=1)], 1)
    first, end = np.triu_indices(blocks + 1, k=1)
    caps = rng.integers(0, batch + 1, size=(len(first), g))
    caps[rng.random(len(first)) < 0.5] = batch
    y, ok = allocate(table, first, end, batch, caps)
    for r in range(len(first)):
        times = (table[:, end[r]] - table[:, first[r]]).tolist()
        expected = algorithm_1_one_row(times, batch, caps[r].tolist())
        assert list(y[r]) == expected
        assert bool(ok[r]) == (sum(expected) == batch)


@pytest.mark.parametrize("seed", range(30))
def test_class_by_class_gives_each_class_the_samples_allocate_gives(seed):
    # strictly increasing curves (the precondition), classes of 1-4 identical devices,
    # large fixed costs for many offloading moves; per class the same samples as the
    # device-by-device Algorithm 1 with every cap at B, its first devices at v + 1
    rng = np.random.default_rng(200 + seed)
    k, batch, blocks = int(rng.integers(1, 4)), int(rng.integers(1, 17)), 3
    counts = rng.integers(1, 5, size=k)
    steps = rng.uniform(0.01, 2.0, size=(k, blocks, batch))
    fixed = rng.uniform(0.0, 20.0, size=(k, blocks, 1)) * (rng.random((k, blocks, 1)) < 0.5)
    per_block = np.concatenate([np.zeros((k, blocks, 1)), fixed + np.cumsum(steps, axis=2)], 2)
    table = np.concatenate([np.zeros((k, 1, batch + 1)), np.cumsum(per_block, axis=1)], 1)
    first, end = np.triu_indices(blocks + 1, k=1)
    curves = table[:, end] - table[:, first]
    rows = np.arange(len(first))[::-1]  # any rows, in any order
    y = allocate_classes(curves, np.arange(k), counts, rows, batch)
    slots = np.repeat(table, counts, axis=0)
    expected, ok = allocate(
        slots, first[rows], end[rows], batch, np.full((len(rows), sum(counts)), batch)
    )
    assert ok.all()
    edges = np.concatenate([[0], np.cumsum(counts)])
    for a, b in itertools.pairwise(edges):
        assert (np.sort(y[:, a:b], axis=1) == np.sort(expected[:, a:b], axis=1)).all()
        assert (np.diff(y[:, a:b], axis=1) <= 0).all() and (y[:, a] - y[:, b - 1] <= 1).all()
