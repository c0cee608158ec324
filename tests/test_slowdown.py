"""Slowdown detection with hysteresis (executor/slowdown.py): exact step sequences, ratios
worked out by hand (measured / expected)."""

from __future__ import annotations

import io
import json
import math

import pytest
import torch

from executor.emulation import EmulatedSlowdown, Emulation
from executor.slowdown import Slowdown, SlowdownDetector, SlowdownPolicy, expected_compute_ms
from planner.profile import BuildSpec
from planner.schedule import Action, ActionType
from tests.executor_helpers import MLP_IN, emulated_plan, profile_of, write_plan

MLP = BuildSpec(callable="tests.executor_helpers:mlp", kwargs={"width": 8})
#: emulated times x this: budgets far above real compute on a loaded machine, so that only
#: the emulated slowdown makes a device slow
TIME_SCALE = 40.0

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


def test_a_step_whose_emulation_overran_neither_extends_nor_clears_the_streak() -> None:
    detector = SlowdownDetector(EXPECTED)
    assert feed(detector, [10, 30, 30]) == []
    # step 3 overran (this machine was loaded): its 10 ms neither clears nor extends
    assert detector.observe(3, {"a": 10.0, "b": 20.0}, no_evidence={"a"}) == []
    assert detector.streak("a") == (3.0, 3.0)
    assert detector.observe(4, {"a": 40.0, "b": 20.0}) == [
        Slowdown("a", 3.0, 4, (3.0, 3.0, 4.0))
    ]


def test_a_device_whose_emulation_overruns_every_step_is_never_declared() -> None:
    detector = SlowdownDetector(EXPECTED)
    # the fastest device on a loaded host: 10x its tiny budget, every step an overrun
    declared = [detector.observe(t, {"a": 100.0, "b": 20.0}, no_evidence={"a"})
                for t in range(8)]
    assert declared == [[]] * 8
    assert detector.streak("a") == ()


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
    profile = profile_of(MLP, lambda b: torch.randn(b, MLP_IN))
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


# -- the emulated slowdown that the detector is tested against ------------------------------


@pytest.mark.parametrize(
    "text, parsed",
    [("d1=3@2", EmulatedSlowdown("d1", 3.0, 2)), ("orin-0=0.5", EmulatedSlowdown("orin-0", 0.5))],
)
def test_an_emulated_slowdown_reads_device_factor_and_step(text: str, parsed) -> None:
    assert EmulatedSlowdown.parse(text) == parsed


@pytest.mark.parametrize("text", ["d1", "d1=", "=3", "d1=x", "d1=3@x", "d1=0", "d1=3@-1"])
def test_a_malformed_emulated_slowdown_names_the_form(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not DEVICE=SLOWDOWN\[@STEP\], e.g. d1=3@2"):
        EmulatedSlowdown.parse(text)


def test_from_its_step_on_a_slowed_device_budgets_its_slowdown_over_the_plans() -> None:
    profile = profile_of(MLP, lambda b: torch.randn(b, MLP_IN))
    # the plan already assumes d1 at slowdown 1.5; the device really runs at 3 from step 2
    plan = emulated_plan(profile, [(0, 2, [2]), (2, 4, [2])], 2, 2, [1.0, 1.5])
    slow = (EmulatedSlowdown("d1", 3.0, 2), EmulatedSlowdown("d0", 5.0, 0))
    hook = Emulation.for_rank(plan, 1, None, 10.0, None, slow).hook  # type: ignore[arg-type]
    assert hook.slowdown == ((2, 2.0),)
    report = io.StringIO()
    hook.report = report
    f, b = plan.cost.stages[1].device_forward_ms[0], plan.cost.stages[1].device_backward_ms[0]
    for _ in range(4):
        for kind in (ActionType.F, ActionType.B):
            hook.after_compute(Action(1, kind, 0), real_seconds=60.0)  # overruns: no sleep
        hook.after_reduce(Action(1, ActionType.REDUCE_GRAD), real_seconds=0.0)
    budgets = [json.loads(line)["budget_ms"] for line in report.getvalue().splitlines()]
    one = 10.0 * (f + b)  # time scale 10, factor 1 before step 2, 3 / 1.5 from there
    assert budgets == pytest.approx([one, one, 2 * one, 2 * one], abs=1e-4)
    # no slowdown for this device: factor 1 throughout
    assert Emulation.for_rank(plan, 0, None, 1.0, None, slow[:1]).hook.factor() == 1.0  # type: ignore[arg-type]


def test_the_emulation_counts_the_overruns_of_the_step_it_finished() -> None:
    profile = profile_of(MLP, lambda b: torch.randn(b, MLP_IN))
    plan = emulated_plan(profile, [(0, 2, [2]), (2, 4, [2])], 2, 2, [1.0, 1.0])
    hook = Emulation.for_rank(plan, 1, None, 1e-3, None).hook  # type: ignore[arg-type]
    counts = []
    for real_seconds in (60.0, 0.0):  # step 0: F and B both over budget; step 1: within
        for kind in (ActionType.F, ActionType.B):
            hook.after_compute(Action(1, kind, 0), real_seconds=real_seconds)
        hook.after_reduce(Action(1, ActionType.REDUCE_GRAD), real_seconds=0.0)
        counts.append(hook.step_overruns)
    assert counts == [2, 0]


def test_several_slowdowns_of_one_device_each_apply_from_its_step_on() -> None:
    profile = profile_of(MLP, lambda b: torch.randn(b, MLP_IN))
    plan = emulated_plan(profile, [(0, 2, [2]), (2, 4, [2])], 2, 2, [1.0, 1.0])
    # given out of order: 3x slow at step 2 only, back to its profile from step 3
    slow = (EmulatedSlowdown("d1", 1.0, 3), EmulatedSlowdown("d1", 3.0, 2))
    hook = Emulation.for_rank(plan, 1, None, 1.0, None, slow).hook  # type: ignore[arg-type]
    factors = []
    for step in range(5):
        hook.step = step
        factors.append(hook.factor())
    assert factors == [1.0, 1.0, 3.0, 1.0, 1.0]


# -- end to end: a device slowed 3x mid-run is re-partitioned, never declared failed ----------


def work(plan, device: str) -> int:
    """Samples x blocks that ``device`` computes per micro-batch under ``plan``."""
    return sum(y * (s.end - s.first) for s in plan.partition.stages
               for d, y in zip(s.devices, s.samples, strict=True) if d == device)


@pytest.mark.slow
def test_a_device_slowed_three_times_is_repartitioned_at_a_step_boundary_never_failed(
    tmp_path,
) -> None:
    from executor import zoo
    from executor.launch import launch
    from executor.profiler import profile_model
    from executor.worker import WorkerOptions
    from planner.plan import load_plan
    from tests.test_recovery import GLOO_TIMEOUT_S, GPT2, assert_matches_reference

    steps = 7
    # a careful profile (warmed up, 5 rounds): the budgets are the emulated devices' speed
    torch.set_num_threads(1)
    model = zoo.build_model(GPT2.zoo, seed=GPT2.seed, **GPT2.sizes)
    profile = profile_model(model, lambda b: zoo.example_input(GPT2.zoo, b, **GPT2.sizes),
                            [1, 2], "host-cpu", name=GPT2.zoo, warmup=3, repeats=5, build=GPT2)
    # stage 0 on d0 + d1 (one sample each of every micro-batch), stage 1 on d2
    plan = emulated_plan(profile, [(0, 3, [1, 1]), (3, 6, [2])], 2, 2, [1.0, 1.0, 1.0])
    path = write_plan(plan, tmp_path)
    result = launch(
        WorkerOptions(str(path), steps, str(tmp_path), deterministic=True, emulate=True,
                      time_scale=TIME_SCALE, timeout_s=GLOO_TIMEOUT_S, save_weights=True,
                      emulate_slowdown=(EmulatedSlowdown("d1", 3.0, 1),)),
        hang_timeout_s=10.0, heartbeat_s=0.1,
    )
    # declared at the third slow step after the first (steps 1, 2, 3), never failed
    assert [(e["cause"], e["device"]) for e in result.events] == [("slow", "d1")]
    (event,) = result.events
    assert event["replay_from_step"] == 4
    new = load_plan(tmp_path / "plans" / f"{event['new_plan']}.json")
    d1 = new.problem.cluster.devices[new.problem.cluster.index("d1")]
    assert 2.5 < d1.slowdown < 3.5  # the measured factor
    assert work(new, "d1") < work(plan, "d1")  # work moved off the slowed device
    assert [m["plan_id"] for m in result.metrics] == [plan.id] * 4 + [new.id] * 3
    assert_matches_reference(tmp_path, plan, result, steps)


@pytest.mark.slow
def test_a_host_too_loaded_for_the_emulation_repartitions_nothing(tmp_path) -> None:
    from executor.launch import launch
    from executor.worker import WorkerOptions
    from tests.test_recovery import GLOO_TIMEOUT_S

    # time scale 1e-4: every budget is far below real compute, as for the fastest device
    # on a loaded host; every device overruns every step, which is no slowdown evidence
    profile = profile_of(MLP, lambda b: torch.randn(b, MLP_IN))
    plan = emulated_plan(profile, [(0, 2, [2]), (2, 4, [2])], 2, 2, [1.0, 1.0])
    result = launch(
        WorkerOptions(str(write_plan(plan, tmp_path)), 6, str(tmp_path), deterministic=True,
                      emulate=True, time_scale=1e-4, timeout_s=GLOO_TIMEOUT_S,
                      dataset="tests.executor_helpers:mlp_dataset"),
        hang_timeout_s=10.0, heartbeat_s=0.1,
    )
    lines = [json.loads(line) for f in sorted((tmp_path / "emulation").iterdir())
             for line in f.read_text().splitlines()]
    assert lines and all(line["overruns"] > 0 for line in lines)
    assert result.events == []
    assert [m["plan_id"] for m in result.metrics] == [plan.id] * 6


def test_a_spare_outside_the_plans_cluster_gets_no_link_figures_and_breaks_nothing() -> None:
    # a device that joined after the plan a recovery re-planned from is a spare of the
    # new generation, but the plan's cluster has no figures for it (review 7, F3: was a
    # KeyError in every emulated rank)
    profile = profile_of(MLP, lambda b: torch.randn(b, MLP_IN))
    plan = emulated_plan(profile, [(0, 2, [2]), (2, 4, [2])], 2, 2, [1.0, 1.0])
    links = Emulation.for_rank(plan, 0, None, 1.0, None,  # type: ignore[arg-type]
                               spares=("d1", "joined-later")).transport.links
    cluster = plan.problem.cluster
    assert links.bytes_per_ms[:3] == (float("inf"), cluster.bytes_per_ms(0, 1),
                                      cluster.bytes_per_ms(0, 1))
    assert math.isnan(links.bytes_per_ms[3]) and math.isnan(links.latency_ms[3])
