"""`edgepipe report RUN_DIR` (planner/check/report.py, no torch): a hand-written run directory
of a real plan, whose measured figures are known exactly, set against the plan's
prediction; the predicted and measured Gantt charts; emulation overruns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from edgepipe.planner.check.report import build_report, emulation_overruns, measured_timeline

from tests.helpers.paths import REPO
from tests.helpers.runs import B_MS, F_MS, write_run


def test_measured_figures_are_means_over_the_steps_after_the_first(tmp_path: Path) -> None:
    plan = write_run(tmp_path)
    report = build_report(tmp_path)
    assert report.steps == 3 and report.steps_used == (1, 2)
    assert not report.emulated and report.time_scale == 1.0
    assert report.iteration_measured_ms == 120.0  # median of 110 and 130
    assert report.iteration_predicted_ms == plan.cost.iteration_ms
    assert report.samples_per_s_measured == pytest.approx(4 / 120 * 1e3)
    for row in report.devices:
        cost = plan.cost.stages[row.stage]
        assert (row.forward_measured, row.backward_measured) == (F_MS[row.device],
                                                                 B_MS[row.device])
        assert row.forward_predicted == cost.device_forward_ms[0]
        assert row.allreduce_measured == 0.5
        assert row.recv_wait_measured == 8.5  # steps 1 and 2: 8 and 9
    assert report.measured_step == 1  # walls 110 and 130 are equally near 120: the first


def test_an_emulated_run_is_compared_with_the_scaled_prediction(tmp_path: Path) -> None:
    plan = write_run(tmp_path, time_scale=4.0)
    report = build_report(tmp_path)
    assert report.emulated and report.time_scale == 4.0
    assert report.iteration_predicted_ms == 4.0 * plan.cost.iteration_ms
    assert report.devices[0].forward_predicted == 4.0 * plan.cost.stages[0].device_forward_ms[0]
    assert report.overrun_warning is None


def test_overruns_are_named_per_device(tmp_path: Path) -> None:
    write_run(tmp_path, time_scale=1.0, overruns=3)
    assert emulation_overruns(tmp_path) == (
        "real compute exceeded the emulated budget on orin-1 3x (worst +2.5 ms): those "
        "devices ran at this machine's speed, not the plan's; raise --time-scale"
    )


def test_the_measured_timeline_is_the_chosen_step_of_the_plans_devices(tmp_path: Path) -> None:
    plan = write_run(tmp_path)
    t = measured_timeline(tmp_path, plan, 1)
    m_count = plan.partition.num_micro_batches
    d0 = t.devices["orin-0"]
    assert [(iv.kind, iv.micro_batch) for iv in d0[:2]] == [("F", 0), ("B", 0)]
    assert d0[-1].kind == "AR"
    assert t.makespan_ms == m_count * (F_MS["orin-0"] + B_MS["orin-0"]) + 0.5


def test_the_report_command_runs_without_torch_and_draws_both_charts(tmp_path: Path) -> None:
    write_run(tmp_path / "run", time_scale=2.0, overruns=1)
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from edgepipe.planner.cli.main import main\n"
        f"raise SystemExit(main(['report', {str(tmp_path / 'run')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "measured 120.0 ms" in done.stdout
    assert "orin-1 1x" in done.stderr
    assert (tmp_path / "run" / "report.png").stat().st_size > 10_000


def test_a_directory_without_a_run_is_one_line_error(tmp_path: Path) -> None:
    script = (
        "from edgepipe.planner.cli.main import main\n"
        f"raise SystemExit(main(['report', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "plan.json" in done.stderr
