"""Every argument is checked before anything runs (docs/usage.md, "The command line";
issue 27, "Arguments checked late or not at all").

The CLI runs in-process (``main([...])``): a bad argument exits 2 with exactly one line
on stderr naming the flag and the fix, no traceback, nothing written, and for ``run`` no
process started. The library's entries raise a typed error naming the value and the fix.
"""

from __future__ import annotations

import math
import multiprocessing

import pytest
from edgepipe.planner import api
from edgepipe.planner.cli.main import main
from edgepipe.planner.errors import InputError
from edgepipe.planner.plan import replica_standbys
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.solver import plan_milp

from tests.helpers.paths import REPO
from tests.helpers.processes import free_port

GRAPHS = REPO / "profiles" / "raw" / "pipedream"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """ResNet-18 (analytic, a zoo build) on orin-pair-2: a runnable plan of one stage on
    orin-0 that replicates, so a run of it recovers in-process, with orin-1 a standby
    holding its replica: both run a process."""
    path = tmp_path_factory.mktemp("arguments") / "plan.json"
    assert main(["plan", "--model", "resnet18-analytic", "--cluster", "orin-pair-2",
                 "--global-batch", "8", "-o", str(path)]) == 0
    plan = api.load_plan(path)
    assert plan.partition.used_devices() == ["orin-0"]
    assert plan.problem.config.replication_interval > 0
    assert replica_standbys(plan) == ("orin-1",)
    return path


def one_error_line(capsys, argv: list[str]) -> str:
    """Run ``argv``; assert exit 2 and a single stderr line (no traceback); return it."""
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_demo_refuses_negative_run_steps_at_parse_time_naming_the_flag(capsys, tmp_path):
    # it used to plan, compare for a minute and more, then fail naming --steps
    out = tmp_path / "demo"
    line = one_error_line(capsys, ["demo", "--out", str(out), "--run-steps", "-1"])
    assert line == ("edgepipe demo: error: argument --run-steps: must be at least 0, got -1 "
                    "(see edgepipe demo --help)")
    assert not out.exists()


RUN_REFUSALS = {
    "unparsable --inject": (
        ["--inject", "garbage"],
        "error: --inject: garbage: expected DEVICE:STEP:PHASE[:SIGNAL] with STEP a number or "
        "* (* for join), PHASE one of forward, backward, optimizer, replication, restore, "
        "join, SIGNAL one of KILL, STOP; e.g. d1:2:forward",
    ),
    "--inject of a device not in the plan": (
        ["--inject", "nano-9:1:forward"],
        "error: --inject: nano-9:1:forward: device 'nano-9' runs no process in this run; "
        "name one of orin-0, orin-1",
    ),
    "--inject beyond the last step": (
        ["--inject", "orin-0:2:forward"],
        "error: --inject: orin-0:2:forward: step 2 is beyond the run (--steps 2 trains steps "
        "0..1); give a step below 2",
    ),
    "--inject of a recovery phase in a run that does not recover": (
        ["--no-recover", "--inject", "orin-0:1:optimizer"],
        "error: --inject: orin-0:1:optimizer: phase optimizer happens only in a run that "
        "recovers in-process; this one does not (--no-recover, or the plan does not "
        "replicate): use forward or backward",
    ),
    "--inject of the standby in a run that does not recover (it has no standbys)": (
        ["--no-recover", "--inject", "orin-1:1:forward"],
        "error: --inject: orin-1:1:forward: device 'orin-1' runs no process in this run; "
        "name one of orin-0",
    ),
    "--time-scale without --emulate": (
        ["--time-scale", "2"],
        "error: --time-scale: 2 stretches emulated times, but this run does not emulate; "
        "add --emulate or drop --time-scale",
    ),
}


@pytest.mark.parametrize("case", RUN_REFUSALS)
def test_run_refuses_before_starting_a_process(plan_file, capsys, tmp_path, case):
    flags, expected = RUN_REFUSALS[case]
    out = tmp_path / "run"
    line = one_error_line(capsys, ["run", str(plan_file), "--steps", "2", "--out", str(out),
                                   *flags])
    assert line == expected
    assert not out.exists()  # the launcher makes the run folder before its first process
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("case", ["unparsable --inject", "--inject of a device not in the plan",
                                  "--inject beyond the last step"])
def test_the_launch_api_refuses_a_fault_spec_as_the_cli_does(plan_file, tmp_path, case):
    # launch(WorkerOptions(faults=...)) ran "garbage" until every device was lost and
    # ignored a device not in the plan (issue 27); it refuses as `run --inject` does
    from edgepipe.executor.core.options import WorkerOptions
    from edgepipe.executor.launch import launch

    (_, spec), expected = RUN_REFUSALS[case]
    out = tmp_path / "run"
    with pytest.raises(InputError) as caught:
        launch(WorkerOptions(str(plan_file), 2, str(out), faults=spec))
    assert f"error: {caught.value}" == expected
    assert not out.exists()
    assert multiprocessing.active_children() == []


def test_coordinate_refuses_a_time_scale_without_emulate_like_run(plan_file, capsys):
    # the coordinator compares the workers' flags with its own; a scale without
    # --emulate stretches nothing and was accepted silently (issue 27)
    capsys.readouterr()
    assert main(["coordinate", str(plan_file), "--port", str(free_port()), "--recover",
                 "--steps", "2", "--time-scale", "2"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]  # after the command's banner
    assert line == ("error: --time-scale: 2 stretches emulated times, but the workers do "
                    "not emulate here; add --emulate or drop --time-scale")


def test_import_pipedream_refuses_a_batch_that_splits_a_linear_output(capsys, tmp_path):
    # resnet18 was profiled at batch 256: its last Linear outputs 1,024,000 bytes = 256 x
    # 1000 fp32 logits; 512 divides its Input node (154,140,672 bytes) but not that
    out = tmp_path / "resnet18.json"
    line = one_error_line(capsys, ["import-pipedream", str(GRAPHS / "resnet18.graph.txt"),
                                   "--batch-size", "512", "-o", str(out)])
    assert line == (
        f"error: {GRAPHS / 'resnet18.graph.txt'}: line 31: Linear node node71 outputs 1024000 "
        "bytes for the profiled minibatch, not a whole number of 512 samples x 1000 fp32 "
        "values; give the --batch-size the graph was profiled at (a classifier's: its last "
        "Linear's activation_size / 4 / out_features)"
    )
    assert not out.exists()


def test_import_pipedream_warns_when_the_batch_is_below_the_classifiers(capsys, tmp_path):
    # 128 divides every size of a graph profiled at 256, so it cannot be refused; the
    # Linear layers hold 256 samples' outputs (1,024,000 / 4 / 1000), and the CLI says so
    out = tmp_path / "resnet18.json"
    capsys.readouterr()
    assert main(["import-pipedream", str(GRAPHS / "resnet18.graph.txt"), "--batch-size", "128",
                 "-o", str(out)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "warning: the Linear layers' outputs hold 256 samples of out_features fp32 values, "
        "not --batch-size 128: if this is a classifier (one vector per sample), it was "
        "profiled at batch 256 and every per-sample figure here is 2x too large: re-import "
        "with --batch-size 256; a sequence model's hold one per token: then ignore this"
    ]
    assert main(["import-pipedream", str(GRAPHS / "resnet18.graph.txt"), "--batch-size", "256",
                 "-o", str(out)]) == 0
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def problem():
    return api.load_problem("pipedream-alexnet", "orin-pair-2", global_batch=8)


BAD_LIMITS = {
    0: "--time-limit: must be positive seconds (a finite number), got 0; give e.g. 60",
    -1: "--time-limit: must be positive seconds (a finite number), got -1; give e.g. 60",
    math.nan: "--time-limit: must be positive seconds (a finite number), got nan; give e.g. 60",
    math.inf: "--time-limit: must be positive seconds (a finite number), got inf; give e.g. 60",
    "60": "--time-limit: expected seconds as a number, got a str; give e.g. 60",
    True: "--time-limit: expected seconds as a number, got a bool; give e.g. 60",
}
SOLVE_ENTRIES = {
    "api.solve dp": lambda problem, limit: api.solve(problem, "dp", time_limit=limit),
    "api.solve milp": lambda problem, limit: api.solve(problem, "milp", time_limit=limit),
    "plan_dp": lambda problem, limit: plan_dp(problem, time_limit=limit),
    "plan_milp": lambda problem, limit: plan_milp(problem, time_limit=limit),
}


@pytest.mark.parametrize("entry", SOLVE_ENTRIES)
@pytest.mark.parametrize("limit", BAD_LIMITS, ids=repr)
def test_every_solver_entry_refuses_a_time_limit_that_is_not_positive_finite_seconds(
    problem, entry, limit
):
    # 0 and -1 used to return the DP's first, slower plan; inf and nan a plan that
    # save_plan wrote and load_plan refused
    with pytest.raises(InputError) as caught:
        SOLVE_ENTRIES[entry](problem, limit)
    assert str(caught.value) == BAD_LIMITS[limit]


def test_solve_and_save_plan_name_the_type_they_expect(problem, tmp_path):
    with pytest.raises(TypeError) as caught:
        api.solve(None)  # type: ignore[arg-type]
    assert str(caught.value) == "solve() takes a Problem (api.load_problem), got a NoneType"
    path = tmp_path / "plan.json"
    with pytest.raises(TypeError) as caught:
        api.save_plan(None, path)  # type: ignore[arg-type]
    assert str(caught.value) == ("save_plan() takes a Plan (api.solve, api.load_plan), got a "
                                 "NoneType")
    with pytest.raises(TypeError) as caught:
        api.save_plan(api.solve(problem), None)  # type: ignore[arg-type]
    assert str(caught.value) == ("save_plan() writes to a path (str or pathlib.Path), got a "
                                 "NoneType")
    assert list(tmp_path.iterdir()) == []
