"""Slowdown detection with hysteresis (executor/slowdown.py): exact step sequences, ratios
worked out by hand (measured / expected)."""

from __future__ import annotations

import pytest
import torch

from executor.slowdown import Slowdown, SlowdownDetector, SlowdownPolicy, expected_compute_ms
from planner.profile import BuildSpec
from tests.executor_helpers import MLP_IN, emulated_plan, profile_of

EXPECTED = {"a": 10.0, "b": 20.0}


def feed(detector: SlowdownDetector, a: list[float], b: list[float] | None = None,
         first_step: int = 0) -> list[Slowdown]:
    """Steps first_step, first_step + 1, ... with ``a``'s (and ``b``'s) measured ms; b
    runs on time unless given."""
    b = b or [20.0] * len(a)
    declared = []
    for i, (ma, mb) in enumerate(zip(a, b, strict=True)):
        declared += detector.observe(first_step + i, {"a": ma, "b": mb})
    return declared


def test_one_slow_step_triggers_nothing() -> None:
    assert feed(SlowdownDetector(EXPECTED), [10, 10, 100, 10, 10, 10, 10]) == []


def test_two_slow_steps_trigger_nothing() -> None:
    assert feed(SlowdownDetector(EXPECTED), [10, 30, 30, 10, 30, 30, 10, 10]) == []


def test_three_consecutive_slow_steps_declare_the_median_factor_at_the_third() -> None:
    detector = SlowdownDetector(EXPECTED)
    assert feed(detector, [10, 30, 31]) == []
    assert detector.observe(3, {"a": 29.0, "b": 20.0}) == [
        Slowdown("a", 3.0, 3, (3.0, 3.1, 2.9))
    ]


def test_a_normal_step_breaks_the_streak() -> None:
    detector = SlowdownDetector(EXPECTED)
    declared = feed(detector, [10, 30, 30, 12, 30, 30])
    assert declared == []
    assert detector.streak("a") == (3.0, 3.0)
    assert detector.observe(6, {"a": 40.0, "b": 20.0}) == [
        Slowdown("a", 3.0, 6, (3.0, 3.0, 4.0))
    ]


def test_noise_around_the_threshold_never_declares() -> None:
    # 1.5 exactly is not above the threshold; 1.4 / 1.6 alternate: no three in a row
    noisy = [10, 15, 15, 15, 16, 14, 16, 14, 16, 15, 16, 16, 14]
    assert feed(SlowdownDetector(EXPECTED), noisy) == []


def test_the_first_step_is_not_judged() -> None:
    detector = SlowdownDetector(EXPECTED)
    assert feed(detector, [50, 30, 30]) == []  # step 0 (start-up) does not count
    assert detector.streak("a") == (3.0, 3.0)


def test_a_faster_device_is_declared_with_a_factor_below_one() -> None:
    detector = SlowdownDetector(EXPECTED)
    assert feed(detector, [10, 10, 10, 10], [20, 10, 10, 8]) == [
        Slowdown("b", 0.5, 3, (0.5, 0.5, 0.4))
    ]


def test_a_switch_from_slow_to_fast_starts_a_new_streak() -> None:
    detector = SlowdownDetector(EXPECTED)
    assert feed(detector, [10, 30, 30, 5, 5]) == []
    assert detector.streak("a") == (0.5, 0.5)
    assert detector.observe(5, {"a": 6.0, "b": 20.0}) == [
        Slowdown("a", 0.5, 5, (0.5, 0.5, 0.6))
    ]


def test_a_declared_device_is_not_declared_again_by_the_same_detector() -> None:
    detector = SlowdownDetector(EXPECTED)
    # slow on, then back to normal and slow again: the new plan's detector judges that
    first = feed(detector, [10, 30, 30, 30, 30, 30, 10, 30, 30, 30, 30])
    assert [(s.device, s.step) for s in first] == [("a", 3)]


def test_two_devices_slowed_together_are_declared_together() -> None:
    declared = feed(SlowdownDetector(EXPECTED), [10, 20, 20, 20], [20, 80, 80, 80])
    assert declared == [Slowdown("a", 2.0, 3, (2.0, 2.0, 2.0)),
                        Slowdown("b", 4.0, 3, (4.0, 4.0, 4.0))]


def test_a_stricter_policy() -> None:
    policy = SlowdownPolicy(threshold=2.0, consecutive=2, warmup_steps=0)
    detector = SlowdownDetector(EXPECTED, policy)
    # 1.9 is below the threshold 2; two steps at 2.5 suffice, step 0 counts
    assert feed(detector, [25, 19, 25, 25]) == [Slowdown("a", 2.5, 3, (2.5, 2.5))]


def test_a_step_without_every_device_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no compute figure for \['b'\]"):
        SlowdownDetector(EXPECTED).observe(1, {"a": 10.0})


@pytest.mark.parametrize(
    "kwargs, message",
    [({"threshold": 1.0}, "threshold must exceed 1"),
     ({"consecutive": 0}, "consecutive must be at least 1"),
     ({"warmup_steps": -1}, "warmup_steps must be >= 0")],
)
def test_a_policy_that_cannot_work_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlowdownPolicy(**kwargs)


def test_expected_compute_is_m_forward_plus_backward_times_slowdown_and_scale() -> None:
    build = BuildSpec(callable="tests.executor_helpers:mlp", kwargs={"width": 8})
    profile = profile_of(build, lambda b: torch.randn(b, MLP_IN))
    plan = emulated_plan(profile, [(0, 2, [2, 2]), (2, 4, [4])], 4, 3, [1.0, 3.0, 1.0])
    s0, s1 = plan.cost.stages
    expected = expected_compute_ms(plan, time_scale=2.0)
    assert expected == {
        "d0": 2.0 * 3 * (s0.device_forward_ms[0] + s0.device_backward_ms[0]),
        "d1": 2.0 * 3 * (s0.device_forward_ms[1] + s0.device_backward_ms[1]),
        "d2": 2.0 * 3 * (s1.device_forward_ms[0] + s1.device_backward_ms[0]),
    }
    # same blocks and samples, slowdown 3: three times the time
    assert expected["d1"] == pytest.approx(3 * expected["d0"], rel=1e-12)
