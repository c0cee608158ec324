"""The edgepipe command line, run in-process on shipped data and temp files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
from edgepipe.planner.api import resolve
from edgepipe.planner.check.simulator import simulate
from edgepipe.planner.cli import console, plan_views
from edgepipe.planner.cli.main import build_parser, main
from edgepipe.planner.cli.torch_imports import holding_ctrl_c
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.plan import load_plan

from tests.helpers.paths import REPO

SMALL = ["--model", "pipedream-alexnet", "--cluster", "orin-pair-2", "--global-batch", "8"]
#: one Jetson Nano with 1 MB of memory: no model fits
TINY_CLUSTER = {
    "schema_version": 1,
    "kind": "edgepipe.cluster",
    "name": "tiny",
    "devices": [{"id": "a", "type": "jetson-nano", "memory_bytes": 1e6}],
    "network": {"bandwidth_mbps": 100, "latency_ms": 1},
}


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "plan.json"
    assert main(["plan", *SMALL, "-o", str(path)]) == 0
    return path


def test_plan_writes_a_valid_plan_and_prints_a_summary(plan_file, capsys):
    plan = load_plan(plan_file)
    assert plan.problem.model.name == "pipedream-alexnet"
    assert plan.partition.micro_batch_size * plan.partition.num_micro_batches == 8
    assert main(["show", str(plan_file)]) == 0
    text = capsys.readouterr().out
    assert plan.id in text and "samples/s" in text


def test_plan_to_stdout_is_exactly_one_json_document(capsys):
    assert main(["plan", *SMALL, "-o", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "edgepipe.plan"


def test_show_draws_a_gantt_png(plan_file, tmp_path):
    png = tmp_path / "gantt.png"
    assert main(["show", str(plan_file), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_prints_the_cost_models_error_against_the_simulator(plan_file, capsys):
    assert main(["simulate", str(plan_file)]) == 0
    out = capsys.readouterr().out.splitlines()
    plan = load_plan(plan_file)
    simulated = simulate(plan.problem, plan.partition).makespan_ms
    sim_line = next(x for x in out if x.startswith("independent simulator:"))
    cost_line = next(x for x in out if x.startswith("cost model (the plan's prediction):"))
    assert f"{simulated:.1f} ms" in sim_line
    assert f"{plan.cost.iteration_ms:.1f} ms" in cost_line
    assert f"{plan.cost.iteration_ms / simulated - 1:+.1%} against the simulator" in cost_line
    objective = pipeline_closed_form_ms(CostModel(plan.problem), plan.partition)
    dp_line = next(x for x in out if x.startswith("DP's search objective (closed form):"))
    assert f"{objective:.1f} ms, {objective / simulated - 1:+.1%}" in dp_line


def test_validate_accepts_every_kind(plan_file, capsys):
    assert main(["validate", str(plan_file)]) == 0
    assert "valid edgepipe.plan" in capsys.readouterr().out


def test_missing_file_is_one_line_error_with_status_2(capsys):
    assert main(["plan", "--model", "no-such-model", "--cluster", "orin-pair-2"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "shipped" in err and "Traceback" not in err


def test_infeasible_memory_is_reported_not_raised(tmp_path, capsys):
    path = write_json(tmp_path / "tiny.json", TINY_CLUSTER)
    assert main(["plan", "--model", "pipedream-vgg16", "--cluster", path]) == 2
    err = capsys.readouterr().err
    assert "memory" in err and "short by" in err


def tiny_resnet_profile_args(batch_sizes: str, output) -> list[str]:
    """``edgepipe profile`` of a small ResNet-18 (32x32 input, quarter width)."""
    return [
        "profile", "--model", "resnet18", "--size", "resolution=32", "--size", "width=0.25",
        "--batch-sizes", batch_sizes, "--warmup", "1", "--repeats", "1", "--threads", "1",
        "-o", str(output),
    ]


def test_profile_then_plan_end_to_end(tmp_path):
    profile = tmp_path / "r18.json"
    assert main([*tiny_resnet_profile_args("2,4", profile), "--analytic"]) == 0
    assert main(["plan", "--model", str(profile), "--cluster", "orin-pair-2",
                 "--global-batch", "8", "-o", str(tmp_path / "plan.json")]) == 0
    assert load_plan(tmp_path / "plan.json").problem.model.name == "resnet18"


def test_profile_failure_is_a_one_line_error(tmp_path, capsys):
    # batch norm cannot train on one value per channel: 32x32 input, batch 1
    assert main(tiny_resnet_profile_args("1", tmp_path / "x.json")) == 2
    assert "batch norm" in capsys.readouterr().err


def test_probe_writes_a_catalog_entry(tmp_path):
    path = tmp_path / "host.json"
    assert main(["probe", "--name", "this-host", "--threads", "1", "-o", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert list(doc["device_types"]) == ["this-host"]
    assert main(["validate", str(path)]) == 0


def write_json(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, plan_file):
    """Files for the bad-argument table: a directory, a FIFO, a plain file, a config with
    a float count, a cluster document."""
    root = tmp_path_factory.mktemp("bad")
    fifo = root / "fifo.json"
    os.mkfifo(fifo)
    (root / "afile").write_text("x")
    config = {"schema_version": 1, "kind": "edgepipe.training_config", "global_batch": 16.0}
    cluster = json.loads(Path(resolve("orin-pair-2", "clusters")).read_text())
    return {
        "dir": str(root),
        "fifo": str(fifo),
        "file": str(root / "afile"),
        "missing": str(root / "no" / "such" / "plan.json"),
        "config": write_json(root / "config.json", config),
        "cluster": write_json(root / "cluster.json", cluster),
        "plan": str(plan_file),
    }


PLAN = ["plan", *SMALL]
PROFILE = ["profile", "--model", "resnet18"]
#: argv (with {placeholders} from bad_inputs) -> what the one-line message must name
BAD_ARGUMENTS = [
    ([*PLAN, "--micro-batches", "2,x"], "--micro-batches"),
    ([*PLAN, "--micro-batches", "4,4"], "--micro-batches"),
    ([*PLAN, "--micro-batches", "0"], "--micro-batches"),
    ([*PLAN, "--global-batch", "0"], "--global-batch"),
    ([*PLAN, "--global-batch", "-3"], "--global-batch"),
    ([*PLAN, "--global-batch", "2.5"], "--global-batch"),
    ([*PLAN, "--max-stages", "0"], "--max-stages"),
    ([*PLAN, "--solver", "milp", "--time-limit", "0"], "--time-limit"),
    ([*PLAN, "--solver", "milp", "--time-limit", "nan"], "--time-limit"),
    ([*PLAN, "--backend", "highs"], "--backend"),
    ([*PLAN, "--solver", "gpipe", "--time-limit", "5"], "--time-limit"),
    ([*PLAN, "--solver", "milp", "--every-block"], "--every-block"),
    ([*PLAN, "--solver", "annealing"], "--solver"),
    ([*PLAN, "-o", "{dir}"], "-o/--output"),
    ([*PLAN, "-o", "{missing}"], "-o/--output"),
    ([*PLAN, "--config", "{config}"], "global_batch"),
    ([*PLAN, "--schedule", "zigzag"], "--schedule"),
    (["plan", "--model", "{fifo}", "--cluster", "orin-pair-2"], "not a regular file"),
    (["plan", "--model", "{dir}", "--cluster", "orin-pair-2"], "directory"),
    (["compare", *SMALL, "--planners", "dp,annealing"], "--planners"),
    (["compare", *SMALL, "--planners", "dp,"], "--planners"),
    (["compare", *SMALL, "--planners", "dp", "--backend", "highs"], "--backend"),
    (["compare", *SMALL, "--out", "{file}"], "--out"),
    (["show", "{plan}", "-o", "{dir}/chart.txt"], "-o/--output"),
    (["show", "{plan}", "-o", "{dir}"], "-o/--output"),
    (["show", "{fifo}"], "not a regular file"),
    (["validate", "{fifo}"], "not a regular file"),
    (["validate", "{cluster}", "--rehash"], "--rehash"),
    (["demo", "--out", "{file}"], "--out"),
    ([*PROFILE, "--batch-sizes", "4,2", "-o", "{dir}/p.json"], "--batch-sizes"),
    ([*PROFILE, "--batch-sizes", "2,x", "-o", "{dir}/p.json"], "--batch-sizes"),
    ([*PROFILE, "--repeats", "0", "-o", "{dir}/p.json"], "--repeats"),
    ([*PROFILE, "-o", "{dir}"], "-o/--output"),
    (["probe", "--threads", "0", "-o", "{dir}/h.json"], "--threads"),
    (["probe", "-o", "-"], "-o/--output"),
    (["import-pipedream", "{fifo}", "--batch-size", "8", "-o", "{dir}/m.json"], "regular"),
    (["import-pipedream", "{file}", "--batch-size", "0", "-o", "{dir}/m.json"], "--batch-size"),
    (
        ["import-pipedream", "{file}", "--batch-size", "8", "--device-type", "v1000",
         "-o", "{dir}/m.json"],
        "--device-type",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "names"), BAD_ARGUMENTS, ids=lambda v: " ".join(v)[:60])
def test_every_bad_argument_is_a_one_line_error_with_status_2(argv, names, bad_inputs, capsys):
    before = sorted(os.listdir(bad_inputs["dir"]))
    assert main([a.format(**bad_inputs) for a in argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert names in lines[0] and "error" in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert sorted(os.listdir(bad_inputs["dir"])) == before  # nothing written, no *.tmp


def test_profile_without_torch_says_which_extra_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    for name in [m for m in sys.modules if m.split(".")[:2] == ["edgepipe", "executor"]]:
        monkeypatch.delitem(sys.modules, name)
    for argv in (["profile", "--model", "resnet18"], ["probe"]):
        assert main([*argv, "-o", str(tmp_path / "x.json")]) == 2
        err = capsys.readouterr().err
        assert "install edgepipe[executor]" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


@pytest.fixture
def ctrl_c_delivered():
    """SIGINT handled as Python's default for the test and the children it starts.

    A shell without job control starts a background job (`pytest ... &`) with SIGINT
    ignored, and an ignored signal stays ignored across exec: then no Ctrl-C reaches the
    CLI, as POSIX wants for background jobs, and these tests would test nothing. A handled
    signal is reset to its default across exec, so the children get a Ctrl-C again.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_exits_130_and_leaves_nothing_half_written(tmp_path, ctrl_c_delivered):
    out = tmp_path / "r18.json"
    cmd = [sys.executable, "-m", "edgepipe.planner.cli", "profile", "--model", "resnet18", "--size",
           "resolution=32", "--batch-sizes", "2,4", "--repeats", "100000", "--threads", "1",
           "-o", str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # torch is imported inside the command (within its Ctrl-C handling): wait until
        # its library is mapped, then a little, so the run is measuring (for hours)
        deadline = time.monotonic() + 240
        while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(2)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


CTRL_C_INSIDE_EXEC = """\
import signal


def model():
    # code built from a string and run by exec(), as dataclasses builds __init__ and
    # __repr__ (torch's import runs hundreds): the Ctrl-C arrives while it runs
    exec("signal.raise_signal(signal.SIGINT)", {"signal": signal})
"""


def test_ctrl_c_during_a_string_exec_still_exits_130(tmp_path, ctrl_c_delivered):
    # CPython 3.11 marks a KeyboardInterrupt leaving a string exec() as unhandled even when
    # the CLI catches it; under `python -m` the interpreter then killed itself with SIGINT
    # after printing our line (returncode -2, the flake of the Ctrl-C test above)
    (tmp_path / "ctrl_c_inside_exec.py").write_text(CTRL_C_INSIDE_EXEC)
    out = tmp_path / "never.json"
    cmd = [sys.executable, "-m", "edgepipe.planner.cli", "profile",
           "--model", "ctrl_c_inside_exec:model",
           "--input", "ctrl_c_inside_exec:model", "-o", str(out)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert (proc.returncode, proc.stderr) == (130, "interrupted; nothing was written\n")
    assert not out.exists()


def test_a_ctrl_c_during_the_torch_import_arrives_once_the_import_is_done(
    ctrl_c_delivered,
):
    # a KeyboardInterrupt inside torch's import can abort the process from C++ (seen: -6,
    # "terminate called after throwing ... pybind11::error_already_set"): held back
    finished = False
    with pytest.raises(KeyboardInterrupt), holding_ctrl_c():
        signal.raise_signal(signal.SIGINT)
        finished = True
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_explicit_flags_beat_the_config_file(tmp_path):
    config = {"schema_version": 1, "kind": "edgepipe.training_config", "global_batch": 16,
              "micro_batch_candidates": [2, 4], "schedule": "gpipe"}  # fmt: skip
    path = write_json(tmp_path / "config.json", config)
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2", "--config",
            path, "--global-batch", "8", "--micro-batches", "4", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    config = load_plan(out).problem.config
    assert (config.global_batch, config.micro_batch_candidates) == (8, (4,))
    assert config.schedule == "gpipe"  # not given on the command line: the file's value


def test_compare_exits_1_when_no_planner_finds_a_feasible_plan(tmp_path, capsys):
    path = write_json(tmp_path / "tiny.json", TINY_CLUSTER)
    argv = ["compare", "--model", "pipedream-vgg16", "--cluster", path, "--planners", "dp,gpipe"]
    assert main(argv) == 1
    assert "no planner found a feasible plan" in capsys.readouterr().err


def test_version_names_the_installed_release(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"edgepipe {metadata.version('edgepipe')}"


LOADED = """\
import json, sys
from edgepipe.planner.cli.main import main
status = main(sys.argv[1:])
print(json.dumps([status, sorted(sys.modules)]))
"""


def modules_loaded_by(*argv: str) -> set[str]:
    """The modules a fresh ``edgepipe ARGV`` process has imported when it finishes."""
    done = subprocess.run([sys.executable, "-c", LOADED, *argv], capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    status, loaded = json.loads(done.stdout.splitlines()[-1])
    assert status == 0, done.stderr
    return set(loaded)


def top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_version_starts_without_numpy_jsonschema_rich_or_torch():
    # the deterministic proxy of its start-up time (<= 0.2 s of CPU: benchmarks/startup.py)
    loaded = modules_loaded_by("--version")
    assert top_level(loaded) & {"numpy", "jsonschema", "rich", "torch"} == set()
    assert not [m for m in loaded if m.startswith("edgepipe.planner.cli.")
                and m != "edgepipe.planner.cli.main"]  # fmt: skip


def test_validate_loads_neither_torch_nor_a_solver_nor_matplotlib_nor_rich(plan_file):
    # its one line is printed without rich (0.03 s of start-up: benchmarks/startup.py)
    loaded = modules_loaded_by("validate", str(plan_file))
    assert top_level(loaded) & {"torch", "matplotlib", "scipy", "ortools", "pulp",
                                "rich"} == set()
    assert not [m for m in loaded if m.startswith(("edgepipe.planner.solvers",
                                                   "edgepipe.executor"))]  # fmt: skip


def test_every_command_is_filled_in_by_the_module_the_table_names():
    import importlib

    from edgepipe.planner.cli.main import COMMANDS

    for module in {module for module, _ in COMMANDS.values()}:
        arguments = importlib.import_module(f"edgepipe.planner.cli.{module}").ARGUMENTS
        assert set(arguments) == {c for c, (m, _) in COMMANDS.items() if m == module}


def readme_example() -> list[str]:
    """The `edgepipe plan` example of README.md, without its command and timing line."""
    text = (REPO / "README.md").read_text()
    block = text.split("```text\n$ edgepipe plan --model pipedream-vgg16", 1)[1]
    return block.split("```", 1)[0].splitlines()[2:]


def test_plan_output_fits_80_columns_and_is_the_readme_example(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["plan", "--model", "pipedream-vgg16", "--cluster", "jetson-testbed-6"]
    assert main([*argv, "-o", "plan.json"]) == 0
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert max(map(len, lines)) <= 80
    assert lines[1:] == readme_example(), "update README.md's example to this output"


def test_compare_table_fits_80_columns_with_every_planner(capsys):
    assert main(["compare", *SMALL, "--time-limit", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    assert any(line.split()[:1] == ["data-parallel"] for line in lines)  # not cut


def test_a_narrow_terminal_gets_one_labelled_line_per_row(plan_file, capsys, monkeypatch):
    monkeypatch.setattr(console.out, "width", 40)
    assert main(["show", str(plan_file)]) == 0
    text = capsys.readouterr().out
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 40
    assert "stage 0: blocks 0-" in text and "…" not in text


def test_repeated_assumptions_are_grouped():
    notes = [
        "times for a derived from v100 x 118.7 (effective GFLOP/s 9800 / 82.56)",
        "times for b derived from v100 x 17.01 (effective GFLOP/s 9800 / 576)",
        "times for a come from one batch size (128); other batch sizes scale proportionally",
        "times for b come from one batch size (128); other batch sizes scale proportionally",
        "something else",
    ]
    assert plan_views.grouped_assumptions(notes) == [
        "times derived from v100 (9800 effective GFLOP/s) by the ratio of effective GFLOP/s: "
        "a x 118.7 (82.56), b x 17.01 (576)",
        "times for a, b come from one batch size (128); other batch sizes scale proportionally",
        "something else",
    ]


def test_the_gantt_title_names_the_plan_s_schedule(plan_file):
    plan = load_plan(plan_file)
    assert plan_views.gantt_title(plan) == f"{plan.id}: one iteration (1F1B, asteroid warm-up)"
    gpipe = replace(plan, problem=replace(plan.problem, config=replace(
        plan.problem.config, schedule="gpipe")))  # fmt: skip
    assert plan_views.gantt_title(gpipe) == f"{plan.id}: one iteration (GPipe)"


def edited(kind: str, change) -> dict:
    """A shipped document of ``kind`` (cluster orin-pair-2, model pipedream-alexnet)
    after ``change``."""
    name = {"clusters": "orin-pair-2", "models": "pipedream-alexnet"}[kind]
    doc = json.loads(Path(resolve(name, kind)).read_text())
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (edited("clusters", lambda d: d["devices"].append(dict(d["devices"][0]))), "used twice"),
        (
            edited("clusters", lambda d: d["network"].setdefault("links", []).append(
                {"a": d["devices"][0]["id"], "b": "ghost", "latency_ms": 1})),
            "'ghost', which is not in devices",
        ),
        (edited("models", lambda d: next(iter(d["timings"].values()))["forward_ms"].pop()), "rows"),
        (
            {"schema_version": 1, "kind": "edgepipe.training_config", "global_batch": 16.0},
            "$.global_batch: 16.0 is not of type 'integer'",
        ),
    ],
    ids=["duplicate-device", "link-to-unknown-device", "timing-rows", "float-count"],
)  # fmt: skip
def test_validate_runs_the_semantic_checks_plan_runs(doc, message, tmp_path, capsys):
    path = write_json(tmp_path / "doc.json", doc)
    assert main(["validate", path]) == 2
    assert message in capsys.readouterr().err


def test_a_finished_coordinate_run_prints_each_dropped_join_as_one_warning_line(capsys):
    # what edgepipe coordinate prints once the run finished (coordinator.run's Stopped):
    # every join_failed reason on its own line, as python -m executor.ft.coordinator does
    from edgepipe.executor.ft.coordinator import Stopped
    from edgepipe.planner.cli.running import coordinated

    reason = ("join of e failed: it registered but sent no heartbeat within 120 s "
              "(--start-timeout); the run goes on without it")
    coordinated(Stopped(3, (reason,)))
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {reason}", "every worker finished (generation 3)"]


def test_the_control_planes_defaults_have_one_source_for_the_cli_and_the_executor():
    # planner/timeouts.py (no torch, no executor/): the CLI's defaults are the figures
    # the launcher, the coordinator and the worker use when called as a library
    import dataclasses

    from edgepipe.executor import launch
    from edgepipe.executor.core import options
    from edgepipe.executor.ft import coordinator
    from edgepipe.planner import timeouts

    parser = build_parser()
    run = parser.parse_args(["run", "plan.json", "--steps", "1"])
    coordinate = parser.parse_args(["coordinate", "plan.json"])
    assert (run.hang_timeout, run.heartbeat, run.timeout) == (
        timeouts.HANG_TIMEOUT_S, timeouts.HEARTBEAT_S, timeouts.GLOO_TIMEOUT_S)
    assert (coordinate.hang_timeout, coordinate.start_timeout) == (
        timeouts.HANG_TIMEOUT_S, timeouts.START_TIMEOUT_S)
    assert (launch.HANG_TIMEOUT_S, launch.HEARTBEAT_S, launch.START_TIMEOUT_S) == (
        timeouts.HANG_TIMEOUT_S, timeouts.HEARTBEAT_S, timeouts.START_TIMEOUT_S)
    assert (coordinator.HANG_TIMEOUT_S, coordinator.START_TIMEOUT_S,
            coordinator.HEARTBEAT_S) == (timeouts.HANG_TIMEOUT_S, timeouts.START_TIMEOUT_S,
                                         timeouts.HEARTBEAT_S)
    (field,) = [f for f in dataclasses.fields(options.WorkerOptions) if f.name == "timeout_s"]
    assert field.default == timeouts.GLOO_TIMEOUT_S
