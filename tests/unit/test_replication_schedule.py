"""Which replication points a run takes and sends (issue 28): a point whose transfer
outlasts every step the run has left after it is skipped, and the last point's replicas
travel only when waiting for them costs no more than the run's steps
(:func:`planner.cost.formulas.point_schedule`; docs/fault-tolerance.md, "Short runs").
Expected values worked out by hand from the rule; the bound on a run's wait is checked
against an independent model of the waits ("Points in flight")."""

from __future__ import annotations

import math
import random

import pytest
from edgepipe.planner.cost.formulas import hiding_interval, point_schedule


def test_without_ring_replicas_every_candidate_point_is_taken_and_sent():
    # candidates of a 10-step run at interval 4: the start, 4, 8 and the end
    assert point_schedule(0, 10, 4, 0.0, 5.0) == ((0, 4, 8, 10), (), True)


def test_a_short_run_of_a_one_device_plan_skips_its_start_and_keeps_its_end_unsent():
    # the demo's shape: the replica's transfer lasts 40 steps, auto resolved to 40, and
    # the run has 10 steps: point 0 has 10 steps after it (40 > 10, skipped), and the
    # end's wait of 40 steps would outlast the run's 10 (taken, not sent)
    assert point_schedule(0, 10, 40, 40 * 5.0, 5.0) == ((10,), (0,), False)


def test_a_point_too_close_to_the_end_is_deferred_to_the_end():
    # 2.5 steps of transfer at interval 3: candidates 0, 3, 6, 9, 10; point 9 has one
    # step left (2.5 > 1, skipped); the end waits 2.5 steps of the run's 10 (sent)
    assert point_schedule(0, 10, 3, 2.5 * 4.0, 4.0) == ((0, 3, 6, 10), (9,), True)


def test_a_transfer_exactly_as_long_as_the_steps_left_is_taken():
    # candidates 0, 4, 8, 10: point 8 has 2 steps of 5 ms left, exactly its 10 ms
    assert point_schedule(0, 10, 4, 10.0, 5.0) == ((0, 4, 8, 10), (), True)


def test_a_recovered_generation_counts_the_steps_from_its_own_start():
    # from step 5 at interval 4, 3 steps of transfer: candidates 5, 8, 10; point 8 has
    # 2 steps left (skipped); the end's 3 steps are within the generation's 5 (sent)
    assert point_schedule(5, 10, 4, 3.0, 1.0) == ((5, 10), (8,), True)
    # with 6 steps of transfer the end is not sent either (6 > 5), and point 5 is
    # skipped (6 > 5)
    assert point_schedule(5, 10, 4, 6.0, 1.0) == ((10,), (5, 8), False)


def test_the_start_point_is_taken_only_when_the_steps_to_the_next_point_hide_it():
    # from step 17 at interval 5, 5 steps of transfer: candidates 17, 20, 25, 26; point
    # 25 has 1 step left (skipped); 20 has 6 (taken); the start 17 has only 3 steps
    # before point 20 (skipped: the commit making point 20 would wait 2 steps for it)
    assert point_schedule(17, 26, 5, 5.0, 1.0) == ((20, 26), (17, 25), True)


def test_a_chosen_interval_shorter_than_the_transfer_keeps_its_waits():
    # interval 1, 2.5 steps of transfer, 5 steps: 4 and 3 have fewer steps left than
    # 2.5 (skipped), 2 and 1 are kept with their waits (the interval's price), and the
    # start 0 has one step before point 1 (skipped)
    assert point_schedule(0, 5, 1, 2.5, 1.0) == ((1, 2, 5), (0, 3, 4), True)


@pytest.mark.parametrize("transfer", [math.inf, math.nan])
def test_a_transfer_that_never_ends_skips_every_point_and_sends_none(transfer):
    assert point_schedule(0, 10, 4, transfer, 5.0) == ((10,), (0, 4, 8), False)


def test_a_generation_with_no_step_left_takes_its_start_as_its_end():
    assert point_schedule(10, 10, 4, 0.0, 5.0) == ((10,), (), True)
    assert point_schedule(10, 10, 4, 1.0, 5.0) == ((10,), (), False)


def test_interval_zero_takes_the_start_and_the_end():
    assert point_schedule(0, 6, 0, 0.0, 5.0) == ((0, 6), (), True)


def waits(resume: int, steps: int, transfer: float, step: float,
          schedule: tuple[tuple[int, ...], tuple[int, ...], bool]) -> float:
    """An independent model of a generation's waits for its points ("Points in flight"):
    a point p sent after step p - 1 travels beside the steps p .. p' - 1 before the
    commit that makes the next point p' (the end, at the latest), which waits for the
    rest; the end's own transfer, when sent, is waited for in full after the last step."""
    points, _, final_sent = schedule
    total = 0.0
    for p, after in zip(points, [*points[1:], steps], strict=True):
        if p < steps:
            total += max(0.0, transfer - (after - p) * step)
    return total + (transfer if final_sent and transfer > 0 else 0.0)


def test_at_the_hiding_interval_a_run_never_waits_longer_than_its_steps():
    rng = random.Random(28)
    for _ in range(2000):
        step = rng.uniform(0.5, 50.0)
        transfer = rng.choice([0.0, rng.uniform(0.0, 60.0) * step])
        steps = rng.randint(1, 80)
        resume = rng.randint(0, steps)
        k = hiding_interval(transfer, step)
        schedule = point_schedule(resume, steps, k, transfer, step)
        assert waits(resume, steps, transfer, step, schedule) <= (steps - resume) * step + 1e-9
        # and the points are today's candidates less the skipped ones
        points, skipped, _ = schedule
        assert sorted(points + skipped) == sorted({resume, steps, *range(
            (resume // k + 1) * k, steps, k)})
