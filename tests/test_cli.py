"""The edgepipe command line, run in-process on shipped data and temp files."""

from __future__ import annotations

import json

import pytest

from planner.cli import main
from planner.plan import load_plan

SMALL = ["--model", "pipedream-alexnet", "--cluster", "orin-pair-2", "--global-batch", "8"]


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


def test_simulate_agrees_with_the_cost_model(plan_file, capsys):
    assert main(["simulate", str(plan_file)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("simulated"))
    simulated, predicted = line.split()[1], line.split()[6]
    assert simulated == predicted


def test_validate_accepts_every_kind(plan_file, capsys):
    assert main(["validate", str(plan_file)]) == 0
    assert "valid edgepipe.plan" in capsys.readouterr().out


def test_missing_file_is_one_line_error_with_status_2(capsys):
    assert main(["plan", "--model", "no-such-model", "--cluster", "orin-pair-2"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "shipped" in err and "Traceback" not in err


def test_infeasible_memory_is_reported_not_raised(tmp_path, capsys):
    cluster = {
        "schema_version": 1,
        "kind": "edgepipe.cluster",
        "name": "tiny",
        "devices": [{"id": "a", "type": "jetson-nano", "memory_bytes": 1e6}],
        "network": {"bandwidth_mbps": 100, "latency_ms": 1},
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cluster))
    assert main(["plan", "--model", "pipedream-vgg16", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert "memory" in err and "short by" in err


def test_demo_writes_plan_and_chart(tmp_path):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    assert load_plan(tmp_path / "plan.json").problem.cluster.name == "jetson-testbed-6"
    assert (tmp_path / "gantt.png").stat().st_size > 0


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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--global-batch", "0"], "global_batch"),
        (["--global-batch", "8", "--micro-batches", "3"], "divides"),
        (["--micro-batches", "0"], "micro_batch_candidates"),
        (["--max-stages", "0"], "max_stages"),
    ],
)
def test_bad_config_options_are_one_line_errors(extra, message, capsys):
    assert main(["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
