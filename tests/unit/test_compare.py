"""api.compare and `edgepipe compare`: one table, every planner, one cost model."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest
from edgepipe.planner import api
from edgepipe.planner.cli.main import main
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.solvers.comparison import COLUMNS, ComparisonResult

from tests.helpers.synthetic import random_problem


@pytest.fixture(scope="module")
def result() -> ComparisonResult:
    problem = random_problem(8, 4, seed=3, global_batch=8, candidates=(2, 4, 8))
    return api.compare(problem, time_limit=60)


def test_every_planner_gets_a_row_scored_by_the_cost_model(result):
    assert [r.planner for r in result.rows] == api.planners()
    problem = next(iter(result.plans.values())).problem
    for row in result.rows:
        assert row.feasible
        # the row is the cost model's verdict on the plan, whatever the planner optimised
        partition = result.plans[row.planner].partition
        fresh = CostModel(problem, partition.micro_batch_size).evaluate(partition)
        assert row.iteration_ms == fresh.iteration_ms
        assert row.steady_ms == fresh.steady_ms
        assert row.samples_per_s == pytest.approx(8 / fresh.steady_ms * 1e3)
        assert row.memory_headroom == pytest.approx(1 - max(fresh.memory_fractions()))
        assert (row.stages, row.micro_batch_size) == (
            partition.num_stages,
            partition.micro_batch_size,
        )


def test_exact_row_is_best_and_speedups_are_relative_to_data_parallel(result):
    exact = result.row("milp")
    assert exact.status == "optimal" and exact.gap == 0.0
    assert result.best().iteration_ms == exact.iteration_ms
    reference = result.row("data-parallel")
    for row in result.rows:
        if row.feasible:
            assert exact.iteration_ms <= row.iteration_ms * (1 + 1e-9)
            assert row.speedup_vs_data_parallel == pytest.approx(
                reference.steady_ms / row.steady_ms
            )


def test_csv_and_json_carry_the_same_table(result):
    rows = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert tuple(rows[0]) == COLUMNS and len(rows) == len(result.rows)
    doc = json.loads(result.to_json())
    assert doc["reference"] == "data-parallel"
    assert [r["planner"] for r in doc["rows"]] == [r["planner"] for r in rows]
    milp = next(r for r in doc["rows"] if r["planner"] == "milp")
    assert (
        float(next(r for r in rows if r["planner"] == "milp")["iteration_ms"])
        == milp["iteration_ms"]
    )


def test_infeasible_planner_gets_a_row_with_its_reason():
    problem = random_problem(6, 3, seed=0, global_batch=8, candidates=(2, 4), memory=(3e7, 3e7))
    # without ring replicas, whose memory would make even the DP's plans overflow here
    problem = replace(problem, config=replace(problem.config, replication_interval=0))
    table = api.compare(problem, ["dp", "data-parallel"])
    dp, data_parallel = table.rows
    assert dp.feasible and dp.speedup_vs_data_parallel is None
    assert not data_parallel.feasible and "memory" in data_parallel.note


def test_progress_is_reported_while_the_exact_solver_runs():
    seen = []
    problem = random_problem(5, 3, seed=1, global_batch=8, candidates=(2, 4))
    api.compare(problem, ["milp"], progress=lambda *args: seen.append(args))
    labels = {label for label, _, _ in seen}
    assert len(labels) == 1 and "milp" in labels.pop()
    assert len(seen) >= 3 and seen[-1][1] == seen[-1][2]


def test_unknown_planner_is_rejected_before_anything_runs():
    with pytest.raises(InputError, match="simulated-annealing"):
        api.compare(random_problem(3, 2), ["dp", "simulated-annealing"])


def test_cli_compare_prints_the_table_and_writes_csv_json_png(tmp_path, capsys):
    status = main(
        ["compare", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2",
         "--time-limit", "30", "--out", str(tmp_path)]
    )  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    for name in api.planners():
        assert name in printed
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert doc["cluster"] == "orin-pair-2" and len(doc["rows"]) == len(api.planners())
    assert (tmp_path / "compare.csv").read_text().startswith("planner,feasible,")


def test_cli_plan_takes_backend_and_time_limit(tmp_path):
    out = tmp_path / "plan.json"
    status = main(
        ["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2", "--solver",
         "milp", "--backend", "cbc", "--time-limit", "20", "-o", str(out)]
    )  # fmt: skip
    assert status == 0
    solver = json.loads(out.read_text())["solver"]
    assert solver["name"] == "milp" and solver["settings"]["backend"] == "cbc"
    assert solver["settings"]["time_limit_s"] == 20.0


def test_cli_unknown_solver_is_a_clean_error(capsys):
    status = main(["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2",
                   "--solver", "magic"])  # fmt: skip
    assert status == 2
    assert "unknown solver" in capsys.readouterr().err
