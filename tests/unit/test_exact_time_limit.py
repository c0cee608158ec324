"""Time limits that mean what they say (issue 29): the exact solver's limit covers its
set-up (the warm start's DP, the tables, the closed-form bounds, each program's build),
a CPU-time budget stops the DP and the exact solver, and a plan stopped by a limit
says so on stderr in one line."""

from __future__ import annotations

import re
import time

import pytest
from edgepipe.planner.cli.main import main
from edgepipe.planner.inputs.cluster import Cluster, Device, Network, load_catalog
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.importers.pipedream import parse_pipedream
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.solver import plan_milp
from edgepipe.planner.solvers.time_limit import default_time_limit

from tests.helpers.dp_cases import identical
from tests.helpers.synthetic import nasnet_like


def long_chain() -> Problem:
    """A NASNet-like graph of 30 cells imported by the PipeDream importer (302 blocks)
    on 16 Orin Nanos: the exact solver's bound tables of one micro-batch size alone took
    ~5 s (21 s at 60 cells) before they were built within the limit."""
    profile = parse_pipedream(nasnet_like(30), "nasnet-like", batch_size=32, device_type="v100")
    catalog = load_catalog()
    kinds = {"jetson-orin-nano": catalog["jetson-orin-nano"]}
    devices = tuple(Device(f"orin-{i}", "jetson-orin-nano") for i in range(16))
    cluster = Cluster("orin-16", devices, Network(940.0, 0.2, False), kinds)
    return make_problem(profile, cluster, TrainingConfig(64), catalog=catalog)


def test_the_exact_solvers_cpu_budget_covers_its_set_up_on_a_long_chain():
    problem = long_chain()
    start = time.process_time()
    result = plan_milp(problem, time_limit=600.0, cpu_time_limit=2.0)
    used = time.process_time() - start
    assert used <= 2.0 * 1.1
    assert result.status in ("feasible", "optimal")  # a bound whatever happens
    assert result.gap is not None and 0.0 <= result.gap < 1.0


@pytest.mark.serial  # wall-clock verdict: an 8 s limit, window 10% (0.8 s)
def test_the_exact_solvers_wall_clock_limit_covers_its_set_up_on_a_long_chain():
    problem = long_chain()
    start = time.perf_counter()
    result = plan_milp(problem, time_limit=8.0)
    assert time.perf_counter() - start <= 8.0 * 1.1
    assert result.gap is not None


def test_the_dps_cpu_budget_stops_it():
    problem = identical(256, 30, types=4)  # 0.5-2.0 CPU s to complete
    start = time.process_time()
    result = plan_dp(problem, time_limit=600.0, cpu_time_limit=0.1)
    used = time.process_time() - start
    assert result.status == "timed_out"
    assert used <= 0.1 + 1.0  # the overshoot: one size's tables and the final scoring


def test_the_default_limit_grows_with_the_cluster_past_256_devices():
    assert default_time_limit(5) == 60.0
    assert default_time_limit(256) == 60.0
    assert default_time_limit(1024) == 240.0


DP_WARNING = re.compile(
    r"warning: dp stopped at its time limit \(60 s wall clock or 0\.001 CPU s\) after "
    r"\d+\.\d s, \d+\.\d CPU s: plans for micro-batch sizes \[\d+(, \d+)*\] of "
    r"\[1, 2, 4, 8, 16, 32\]; no bound on the gap is known; raise --time-limit or "
    r"--cpu-time-limit\n"
)
MILP_WARNING = re.compile(
    r"warning: milp stopped at its time limit \(0\.5 s wall clock\) after \d+\.\d s, "
    r"\d+\.\d CPU s: \d+ of 24 programs closed; the plan is at most \d+\.\d% slower "
    r"than the best \(bound \d+\.\d ms\); raise --time-limit\n"
)


def test_a_timed_out_plan_warns_on_stderr_in_one_line(capsys):
    main(["plan", "--model", "pipedream-vgg16", "--cluster", "pi-lab-4",
          "--cpu-time-limit", "0.001"])  # fmt: skip
    out, err = capsys.readouterr()
    assert DP_WARNING.fullmatch(err), err
    assert "timed_out" in out


def test_the_exact_solvers_warning_gives_its_proven_gap(capsys):
    main(["plan", "--model", "pipedream-vgg16", "--cluster", "pi-lab-4", "--solver", "milp",
          "--time-limit", "0.5"])  # fmt: skip
    _, err = capsys.readouterr()
    assert MILP_WARNING.fullmatch(err), err


def test_a_complete_plan_warns_of_nothing(capsys):
    main(["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2"])
    _, err = capsys.readouterr()
    assert err == ""
