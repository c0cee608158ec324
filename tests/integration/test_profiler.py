"""Specification of the profiler, the analytic profiles and the device probe: byte and
FLOP counts worked by hand for small layers, times that grow with the batch and are
predicted by the planner's fitted time model, profiles that validate, round-trip and
plan end to end, and a probe whose output is a valid catalog device type."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from dataclasses import replace
from functools import partial
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.analytic import analytic_profile, analytic_timing
from edgepipe.executor.profiling.models.transformer import SelfAttention
from edgepipe.executor.profiling.probe import ProbeError, memory_bytes, probe_device, probe_link
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner import api
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster, DeviceType, load_catalog
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import Block, ModelProfile, Timing, batch_curve
from edgepipe.planner.inputs.resources import profile_path
from edgepipe.planner.inputs.schema import validate
from torch import nn

torch.set_num_threads(1)

F32 = 4  # bytes per float32


def sizes_of(block: nn.Module, shape: tuple[int, ...]) -> Block:
    """Profile ``block`` alone on standard-normal input of ``shape`` (batch first)."""
    def example(batch: int) -> torch.Tensor:
        return torch.randn(batch, *shape[1:], generator=torch.Generator().manual_seed(0))

    profile = profile_model(
        nn.Sequential(block), example, [shape[0]], "cpu", warmup=0, repeats=1
    )
    return profile.blocks[0]


# -- sizes, worked by hand ----------------------------------------------------------------


def test_linear_layer_bytes_and_flops() -> None:
    # Linear(16 -> 8) on (4, 16): output 8 floats per sample; autograd keeps the input
    # (for the weight gradient) and the weight, which is a parameter, not an activation.
    assert sizes_of(nn.Linear(16, 8), (4, 16)) == Block(
        name="0",
        param_bytes=(16 * 8 + 8) * F32,  # 544
        output_bytes_per_sample=8 * F32,  # 32
        saved_bytes_per_sample=16 * F32,  # 64
        forward_flops_per_sample=2 * 16 * 8,  # 256
    )


class Square(nn.Module):
    """y = lin(x); y * y: the product saves y twice (as both operands)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * y


def test_a_tensor_saved_twice_counts_once() -> None:
    # saved: x (16 floats) and y (8 floats) once; counting per save would give 16 + 8 + 8
    assert sizes_of(Square(), (4, 16)).saved_bytes_per_sample == (16 + 8) * F32
    # ReLU saves its output: x (16) + relu output (8)
    relu = sizes_of(nn.Sequential(nn.Linear(16, 8), nn.ReLU()), (4, 16))
    assert relu.saved_bytes_per_sample == (16 + 8) * F32


def test_conv_layer_bytes_and_flops() -> None:
    # Conv2d(3 -> 8, 3x3, pad 1) on (2, 3, 8, 8): output 8x8x8; saves its 3x8x8 input
    assert sizes_of(nn.Conv2d(3, 8, 3, padding=1), (2, 3, 8, 8)) == Block(
        name="0",
        param_bytes=(8 * 3 * 3 * 3 + 8) * F32,  # 896
        output_bytes_per_sample=8 * 8 * 8 * F32,  # 2048
        saved_bytes_per_sample=3 * 8 * 8 * F32,  # 768
        forward_flops_per_sample=2 * (3 * 3 * 3) * 8 * (8 * 8),  # 27648
    )


def test_attention_block_bytes_and_flops() -> None:
    # SelfAttention(d=32, h=4) on (2, L=8, 32). Saved per sample, in floats:
    #   x, kept by the qkv projection                  L*d    = 256
    #   the qkv output (q, k, v are views of it)       3*L*d  = 768
    #   SDPA's output, which is also the (contiguous)
    #   input the output projection keeps              L*d    = 256
    #   SDPA's log-sum-exp per head and query          h*L    = 32
    # FLOPs per sample: projections 2*L*d*3d + 2*L*d*d = 65536, plus the attention
    # scores QK^T and the weighted sum AV, 2 * 2*h*L*L*(d/h) = 8192, which the flop
    # counter only sees with the math SDPA kernel.
    L, d, h = 8, 32, 4
    assert sizes_of(SelfAttention(d, h, causal=False), (2, L, d)) == Block(
        name="0",
        param_bytes=(d * 3 * d + 3 * d + d * d + d) * F32,  # 16896
        output_bytes_per_sample=L * d * F32,  # 1024
        saved_bytes_per_sample=(5 * L * d + h * L) * F32,  # 5248
        forward_flops_per_sample=2 * L * d * 4 * d + 4 * L * L * d,  # 73728
    )


def test_per_sample_figures_are_measured_at_the_largest_batch() -> None:
    model = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8))
    profile = profile_model(model, lambda b: torch.randn(b, 16), [2, 5], "cpu", repeats=1)
    assert profile.input_bytes_per_sample == 16 * F32
    # batch norm keeps its input (5 x 8 floats) plus a mean and an inverse std per channel
    assert profile.blocks[1].saved_bytes_per_sample == (5 * 8 + 2 * 8) * F32 / 5


# -- times ----------------------------------------------------------------------------------


def wide_mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Sequential(nn.Linear(1024, 2048), nn.ReLU()), nn.Linear(2048, 1024)
    )


def time_model_problems(timing: Timing, held_out: int) -> list[str]:
    """What is wrong with ``timing`` as a time model: rows that shrink by more than 10%
    from one batch size to the next, and held-out batch sizes that the planner's fitted
    curve over the other sizes misses by more than 20%."""
    sizes = timing.batch_sizes
    fit_sizes = tuple(b for j, b in enumerate(sizes) if j != held_out)
    problems = []
    for matrix in (timing.forward_ms, timing.backward_ms):
        for row in matrix:
            if not all(b >= 0.9 * a for a, b in pairwise(row)):
                problems.append(f"not monotone: {row}")
            fit = np.array([[x for j, x in enumerate(row) if j != held_out]])
            predicted = batch_curve(fit_sizes, fit, sizes[-1])[0, sizes[held_out]]
            if abs(predicted - row[held_out]) > 0.2 * row[held_out]:
                problems.append(f"batch {sizes[held_out]} predicted {predicted:.3f}: {row}")
    return problems


# measured times within 10% (monotone) and 20% (the held-out batch): the other xdist
# worker's processes on this 2-core machine broke all three attempts once (session 12)
@pytest.mark.serial
def test_times_grow_with_batch_and_the_fitted_curve_predicts_a_held_out_batch() -> None:
    # Each block takes ~2-10 ms per pass at these sizes, far above timer resolution.
    # This CPU is shared (2 cores); a run that overlaps a burst of work from another
    # process is measured again, at most 3 times in all.
    attempts = []
    for _ in range(3):
        profile = profile_model(
            wide_mlp(), lambda b: torch.randn(b, 1024), [32, 64, 128, 192, 256], "cpu",
            warmup=2, repeats=7,
        )
        attempts.append(time_model_problems(profile.timings["cpu"], held_out=3))
        if not attempts[-1]:
            return
    pytest.fail(f"every attempt failed: {attempts}")


def test_the_time_model_check_rejects_bad_timings() -> None:
    sizes = (32, 64, 128, 192, 256)
    good = Timing(sizes, ((1.0, 2.0, 4.0, 6.0, 8.0),), ((2.0, 4.0, 8.0, 12.0, 16.0),))
    assert time_model_problems(good, held_out=3) == []
    shrinking = replace(good, forward_ms=((1.0, 2.0, 1.5, 6.0, 8.0),))
    assert time_model_problems(shrinking, held_out=3)[0].startswith("not monotone")
    bent = replace(good, backward_ms=((2.0, 4.0, 8.0, 9.0, 16.0),))  # 12 predicted, 9 seen
    assert time_model_problems(bent, held_out=3) == [
        "batch 192 predicted 12.000: (2.0, 4.0, 8.0, 9.0, 16.0)"
    ]


def test_timing_records_medians_spreads_and_repeats() -> None:
    profile = profile_model(
        wide_mlp(), lambda b: torch.randn(b, 1024), [1, 4], "host", warmup=1, repeats=3
    )
    t = profile.timings["host"]
    assert (t.batch_sizes, t.repeats, t.source) == ((1, 4), 3, "measured")
    for matrix in (t.forward_ms, t.backward_ms, t.forward_spread_ms, t.backward_spread_ms):
        assert matrix is not None and len(matrix) == 2
        assert all(len(row) == 2 and min(row) >= 0 for row in matrix)
    assert all(x > 0 for row in t.forward_ms + t.backward_ms for x in row)
    assert profile.source["kind"] == "measured"
    assert "torch" in profile.source["detail"] and profile.source["date"][:2] == "20"


def test_a_parameter_free_first_block_has_no_backward() -> None:
    model = nn.Sequential(nn.ReLU(), nn.Linear(4, 4))
    profile = profile_model(model, lambda b: torch.randn(b, 4), [2], "cpu", repeats=2)
    assert profile.timings["cpu"].backward_ms[0] == (0.0,)
    assert profile.blocks[0].saved_bytes_per_sample == 0


class Sleeper(nn.Module):
    """A block that waits 30 ms in its forward without using the CPU (as if descheduled)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return self.lin(x)


def test_the_thread_clock_leaves_out_time_the_thread_does_not_run() -> None:
    # wall time counts the 30 ms sleep; the thread's CPU time does not (a Linear(4, 4) on
    # 2 samples takes microseconds), so a descheduled thread is not billed for others' work
    def forward_ms(clock: str) -> float:
        profile = profile_model(
            nn.Sequential(Sleeper()), lambda b: torch.randn(b, 4), [2], "cpu", warmup=0,
            repeats=3, num_threads=1, clock=clock,
        )
        return profile.timings["cpu"].forward_ms[0][0]

    assert forward_ms("wall") >= 30.0
    assert forward_ms("thread") < 10.0


def test_the_thread_clock_needs_one_thread_and_a_known_clock() -> None:
    def run(**kwargs: object) -> None:
        profile_model(nn.Sequential(nn.Linear(4, 4)), lambda b: torch.randn(b, 4), [2], "cpu",
                      **kwargs)

    with pytest.raises(ValueError, match="needs num_threads=1, got 2"):
        run(clock="thread", num_threads=2)
    with pytest.raises(ValueError, match="clock 'cpu' is not one of"):
        run(clock="cpu", num_threads=1)


# -- the profile as a document ----------------------------------------------------------------

TINY = {"resolution": 32, "width": 0.25, "num_classes": 10}


@pytest.fixture(scope="module")
def resnet_profile() -> ModelProfile:
    return profile_model(
        zoo.build_model("resnet18", **TINY),
        partial(zoo.example_input, "resnet18", **TINY),
        [2, 4],
        "host-cpu",
        name="resnet18-tiny",
        warmup=1,
        repeats=2,
    )


def test_a_zoo_profile_validates_and_round_trips(resnet_profile: ModelProfile) -> None:
    doc = resnet_profile.to_dict()
    validate(doc, "edgepipe.model_profile", "test")
    assert ModelProfile.from_dict(doc) == resnet_profile
    assert ModelProfile.from_dict(json.loads(json.dumps(doc))) == resnet_profile
    model = zoo.build_model("resnet18", **TINY)
    assert [b.name for b in resnet_profile.blocks] == [n for n, _ in model.named_children()]
    assert sum(b.param_bytes for b in resnet_profile.blocks) == 4 * sum(
        p.numel() for p in model.parameters()
    )
    assert resnet_profile.input_bytes_per_sample == 3 * 32 * 32 * F32


def test_progress_and_restored_state() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model.eval()
    before = model[1].running_mean.clone()
    calls: list[tuple[int, int]] = []
    profile_model(
        model, lambda b: torch.randn(b, 4), [2, 3, 4], "cpu", repeats=1, num_threads=2,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert calls == [(k, 4) for k in range(1, 5)]  # 2 blocks x (sizes pass, timing pass)
    assert torch.get_num_threads() == 1
    assert torch.equal(model[1].running_mean, before)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


class Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


def test_a_block_must_return_one_tensor() -> None:
    model = nn.Sequential(nn.Linear(2, 2), Pair(), nn.Linear(2, 2))
    with pytest.raises(InputError, match="block '1': returned tuple"):
        profile_model(model, lambda b: torch.randn(b, 2), [1], "cpu")


def test_bad_arguments() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    for sizes, warmup, repeats in (([4, 2], 1, 1), ([], 1, 1), ([0, 1], 1, 1), ([1], -1, 1),
                                   ([1], 1, 0)):
        with pytest.raises(ValueError):
            profile_model(model, lambda b: torch.randn(b, 2), sizes, "cpu", warmup=warmup,
                          repeats=repeats)


# -- analytic profiles ----------------------------------------------------------------------


def device(name: str, peak: float, efficiency: float) -> DeviceType:
    return DeviceType(
        name=name, description=name, memory_bytes=8 * 2**30, usable_fraction=0.8,
        peak_fp32_gflops=peak, efficiency=efficiency, interface="ethernet",
        bandwidth_mbps=1000.0, sources={"all": "test"},
    )


def flops_profile(flops: tuple[float | None, ...]) -> ModelProfile:
    return ModelProfile(
        name="m",
        source={"kind": "measured", "detail": "here"},
        input_bytes_per_sample=4.0,
        blocks=tuple(Block(f"b{i}", 0.0, 4.0, 4.0, f) for i, f in enumerate(flops)),
        timings={"host": Timing((1,), ((1.0,),) * len(flops), ((2.0,),) * len(flops))},
    )


def test_analytic_times_follow_flops_over_effective_throughput() -> None:
    # 100 GFLOP/s peak x 0.5 efficiency = 5e7 FLOP per ms:
    #   1e9 FLOP/sample -> 20 ms per sample forward, 40 ms backward
    t = analytic_timing(flops_profile((1e9, 2.5e8)), device("d", 100.0, 0.5), (1, 4))
    assert t == Timing(
        batch_sizes=(1, 4),
        forward_ms=((20.0, 80.0), (5.0, 20.0)),
        backward_ms=((40.0, 160.0), (10.0, 40.0)),
        source="analytic",
    )


def test_analytic_profile_adds_types_and_keeps_measured_ones() -> None:
    base = flops_profile((1e9, 1e9))
    out = analytic_profile(base, {"host": device("host", 1.0, 1.0), "d": device("d", 10, 1)})
    assert out.timings["host"] is base.timings["host"]  # measured wins
    assert out.timings["d"].source == "analytic"
    assert out.timings["d"].forward_ms[0][0] == pytest.approx(100.0)
    assert out.source["kind"] == "analytic" and "measured profile (here)" in out.source["detail"]
    assert out.blocks == base.blocks
    with pytest.raises(InputError, match=r"blocks\[1\].forward_flops_per_sample"):
        analytic_profile(flops_profile((1e9, None)), {"d": device("d", 10, 1)})


def test_analytic_profile_for_the_shipped_catalog_validates(resnet_profile: ModelProfile) -> None:
    catalog = load_catalog()
    out = analytic_profile(replace(resnet_profile, timings={}), catalog)
    assert set(out.timings) == set(catalog)
    assert ModelProfile.from_dict(out.to_dict()) == out


# -- end to end: profile -> plan --------------------------------------------------------------


def test_an_analytic_zoo_profile_plans_on_a_shipped_cluster(resnet_profile: ModelProfile) -> None:
    profile = ModelProfile.from_dict(analytic_profile(resnet_profile, load_catalog()).to_dict())
    cluster = Cluster.load(profile_path("clusters/orin-pair-2.json"))
    plan = api.solve(make_problem(profile, cluster, TrainingConfig(8)))
    stages = plan.partition.stages
    assert stages[0].first == 0 and stages[-1].end == profile.num_blocks
    assert plan.cost.iteration_ms > 0


def test_a_measured_profile_plans_on_a_cluster_of_this_host(resnet_profile: ModelProfile) -> None:
    host = device("host-cpu", 200.0, 0.5)
    cluster = Cluster.from_dict({
        "schema_version": 1, "kind": "edgepipe.cluster", "name": "two-hosts",
        "device_types": {"host-cpu": host.to_dict()},
        "devices": [{"id": "a", "type": "host-cpu"}, {"id": "b", "type": "host-cpu"}],
        "network": {"bandwidth_mbps": 1000, "latency_ms": 0.1},
    })
    plan = api.solve(make_problem(resnet_profile, cluster, TrainingConfig(8)))
    assert plan.problem.timings["host-cpu"] is resnet_profile.timings["host-cpu"]
    assert plan.cost.iteration_ms > 0


# -- device probe -----------------------------------------------------------------------------


def test_memory_figures_are_consistent() -> None:
    total, available = memory_bytes()
    assert 0 < available <= total
    meminfo = dict(line.split(":") for line in Path("/proc/meminfo").read_text().splitlines())
    assert total <= int(meminfo["MemTotal"].split()[0]) * 1024


def test_link_probe_failure_is_an_error_and_reaps_its_ranks() -> None:
    start = time.monotonic()
    with pytest.raises(ProbeError, match="no result within"):
        probe_link(timeout_s=0.3)  # too short for two interpreters to even import torch
    assert time.monotonic() - start < 5
    assert mp.active_children() == []


@pytest.mark.slow
def test_probe_returns_a_valid_catalog_device_type() -> None:
    entry = probe_device(
        model=wide_mlp(), example_input_fn=lambda b: torch.randn(b, 1024), batch_size=16,
        repeats=2, message_bytes=2**20, num_threads=1,
    )
    validate(
        {"schema_version": 1, "kind": "edgepipe.device_catalog", "device_types": {"me": entry}},
        "edgepipe.device_catalog", "probe",
    )
    dev = DeviceType.from_dict("me", entry)
    assert dev.peak_fp32_gflops > 0 and 0 < dev.efficiency <= 1 and dev.bandwidth_mbps > 0
    assert set(entry["sources"]) == {
        "memory", "usable_fraction", "peak_fp32_gflops", "efficiency", "network"
    }
    assert all(s.startswith("measured by edgepipe probe on ") for s in entry["sources"].values())
    assert mp.active_children() == []
    assert torch.get_num_threads() == 1


# -- the shipped profiles ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_shipped_profiles_match_the_zoo_and_the_catalog(name: str) -> None:
    measured = ModelProfile.load(profile_path(f"models/{name}-cpu.json"))
    analytic = ModelProfile.load(profile_path(f"models/{name}-analytic.json"))
    with torch.device("meta"):
        model = zoo.build_model(name)
    assert [b.name for b in measured.blocks] == [n for n, _ in model.named_children()]
    assert [b.param_bytes for b in measured.blocks] == [
        float(sum(p.numel() * 4 for p in block.parameters())) for block in model.children()
    ]
    assert (measured.source["kind"], list(measured.timings)) == ("measured", ["host-cpu"])
    assert analytic.blocks == measured.blocks
    # regenerate with `benchmarks/profile_zoo.py --analytic-only` when the catalog changes;
    # that the times are the fit's is checked in tests/unit/test_analytic.py
    assert set(analytic.timings) == set(load_catalog())


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_shipped_analytic_profiles_plan_on_the_demo_cluster(name: str) -> None:
    plan = api.solve(api.load_problem(f"{name}-analytic", "jetson-testbed-6", global_batch=32))
    assert plan.partition.stages[-1].end == len(zoo.block_specs(name))
