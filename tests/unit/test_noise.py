"""Specification of measuring on a busy machine (issue 27): rounds repeat until their
totals agree, the result is the median of the last rounds, and a busy machine, a spread
that never settled or an implausible time each warn in one line; figures by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from edgepipe.executor.profiling.noise import (
    NoisePolicy,
    busy,
    implausible,
    measure_until_stable,
    settled,
    spread,
    warnings,
)
from edgepipe.planner.cli.main import main
from edgepipe.planner.inputs.profile import Block, ModelProfile, Noise, Timing

POLICY = NoisePolicy(max_spread=0.05, window=3, max_rounds=5)


def test_spread_is_the_range_over_the_median() -> None:
    assert spread([10.0, 11.0, 12.0]) == 2 / 11
    assert spread([7.0]) == 0.0


def test_rounds_stop_when_the_last_three_agree_or_at_the_most() -> None:
    assert not settled([], POLICY)
    assert not settled([100.0, 100.0], POLICY)  # fewer than the window
    assert settled([100.0, 101.0, 102.0], POLICY)  # 2 / 101 = 2.0%
    assert not settled([100.0, 110.0, 120.0], POLICY)  # 20 / 110 = 18%
    assert settled([200.0, 101.0, 102.0, 103.0], POLICY)  # the last three: 2 / 102
    assert settled([100.0, 200.0, 100.0, 200.0, 100.0], POLICY)  # 5 rounds: the most


def test_busy_is_more_load_than_cores() -> None:
    assert busy(2.01, 2)
    assert not busy(2.0, 2)  # this profiler and one other process, a core each


def profile(fwd: list[float], bwd: list[float], params: list[float]) -> ModelProfile:
    """Two batch sizes (1, 2); block b's forward ``fwd[b]`` ms at batch 1 and twice that
    at batch 2, backward likewise."""
    return ModelProfile(
        name="m",
        source={"kind": "measured"},
        input_bytes_per_sample=4.0,
        blocks=tuple(Block(f"b{i}", p, 4.0, 4.0) for i, p in enumerate(params)),
        timings={"cpu": Timing(
            batch_sizes=(1, 2),
            forward_ms=tuple((f, 2 * f) for f in fwd),
            backward_ms=tuple((b, 2 * b) for b in bwd),
            source="measured",
        )},
    )


def test_the_result_is_the_median_of_the_last_rounds() -> None:
    # one block; totals 3 x (forward + backward) at batch 1: 3 x (10+20)=90, then 135,
    # 93, 91.5, 90: the last three [93, 91.5, 90] spread 3 / 91.5 = 3.3% <= 5%
    rounds = iter([
        profile([10.0], [20.0], [1.0]),
        profile([15.0], [30.0], [1.0]),
        profile([11.0], [20.0], [1.0]),
        profile([10.5], [20.0], [1.0]),
        profile([10.0], [20.0], [1.0]),
    ])
    loads = iter([0.5, 1.5, 3.25, 1.0, 0.25, 0.5])
    got = measure_until_stable(lambda: next(rounds), "cpu", POLICY, load=lambda: next(loads))
    t = got.timings["cpu"]
    assert t.forward_ms == ((10.5, 21.0),)  # median of 11, 10.5, 10
    assert t.backward_ms == ((20.0, 40.0),)
    assert t.noise == Noise(rounds=5, spread=round(3 / 91.5, 4), load_average=3.25, stable=True)


def test_rounds_that_never_settle_are_marked_unstable_and_warn() -> None:
    rounds = iter([profile([f], [2 * f], [1.0]) for f in (10.0, 20.0, 10.0, 20.0, 10.0)])
    got = measure_until_stable(lambda: next(rounds), "cpu", POLICY, load=lambda: 0.5)
    # last three totals 3 x 30, 3 x 60, 3 x 30: spread 90 / 90 = 100%
    assert got.timings["cpu"].noise == Noise(5, 1.0, 0.5, False)
    assert warnings(got, "cpu", POLICY, cores=2) == [
        "cpu: the last 3 of 5 rounds still differ by 100% (more than 5%): the machine is "
        "too noisy to measure; profile again when it is quieter"
    ]


def test_a_busy_machine_warns() -> None:
    rounds = iter([profile([10.0], [20.0], [1.0])] * 3)
    got = measure_until_stable(lambda: next(rounds), "cpu", POLICY, load=lambda: 4.5)
    assert warnings(got, "cpu", POLICY, cores=2) == [
        "the machine is busy (load average 4.5 on 2 cores) while profiling cpu: times may "
        "be too long"
    ]


def test_implausible_times_are_named() -> None:
    # b0: first block, backward < forward is fine (no input gradient); b1: backward <
    # forward with parameters; b2: parameter-free, backward 0 is fine; b3: forward 0
    odd = profile([5.0, 4.0, 1.0, 0.0], [3.0, 2.0, 0.0, 1.0], [8.0, 8.0, 0.0, 8.0])
    assert implausible(odd, "cpu") == [
        "block b1 at batch 1: backward 2 ms < forward 4 ms",
        "block b1 at batch 2: backward 4 ms < forward 8 ms",
        "block b3 at batch 1: forward 0 ms",
        "block b3 at batch 2: forward 0 ms",
    ]
    assert warnings(odd, "cpu", POLICY, cores=2) == [
        "cpu: implausible times: block b1 at batch 1: backward 2 ms < forward 4 ms; "
        "block b1 at batch 2: backward 4 ms < forward 8 ms; block b3 at batch 1: forward "
        "0 ms and 1 more"
    ]


def test_profile_warns_in_one_line_when_rounds_disagree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # real rounds of a tiny ResNet never agree within 1e-9: a warning, and the spread
    # and rounds recorded in the profile
    out = tmp_path / "r18.json"
    assert main([
        "profile", "--model", "resnet18", "--size", "resolution=32", "--size", "width=0.25",
        "--batch-sizes", "2", "--warmup", "1", "--repeats", "1", "--threads", "1",
        "--max-spread", "1e-9", "--max-rounds", "3", "-o", str(out),
    ]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert [line[:46] for line in lines if "rounds" in line] == [
        "warning: host-cpu: the last 3 of 3 rounds stil"
    ]
    noise = json.loads(out.read_text())["timings"]["host-cpu"]["noise"]
    assert noise["rounds"] == 3 and noise["spread"] > 0 and noise["stable"] is False
