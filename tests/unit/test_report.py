"""`edgepipe report RUN_DIR` (planner/check/report.py, no torch): a hand-written run directory
of a real plan, whose measured figures are known exactly, set against the plan's
prediction; the predicted and measured Gantt charts; emulation overruns."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from edgepipe.planner.check.live import Follower, Progress, progress, write_state
from edgepipe.planner.check.report import build_report, emulation_overruns, measured_timeline
from edgepipe.planner.errors import InputError

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


# -- a run that is still going, or that died (planner/check/live.py; issue 28) ---------


def _state(folder: Path, **doc) -> None:
    (folder / "status.json").write_text(json.dumps(doc))


def test_a_run_still_going_is_reported_with_its_steps_so_far(tmp_path: Path) -> None:
    write_run(tmp_path)
    _state(tmp_path, state="running", steps=20, pid=os.getpid(), host=socket.gethostname())
    report = build_report(tmp_path)
    assert report.steps == 3 and report.iteration_measured_ms == 120.0
    assert report.unfinished == (f"the run is in progress: 3 of 20 steps committed so far "
                                 f"(launcher pid {os.getpid()})")


def test_a_run_whose_launcher_is_gone_did_not_finish(tmp_path: Path) -> None:
    write_run(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process now
    _state(tmp_path, state="running", steps=20, pid=gone.pid, host=socket.gethostname())
    assert build_report(tmp_path).unfinished == (
        f"the run did not finish: 3 of 20 steps committed; its launcher (pid {gone.pid}) "
        "is gone without a word (killed, e.g. by SIGKILL, or crashed)")


def test_a_failed_run_says_why_and_a_finished_one_says_nothing(tmp_path: Path) -> None:
    write_run(tmp_path)
    write_state(tmp_path, "running", 20)
    write_state(tmp_path, "failed", 20, "device 'd1' (rank 1, stage 1) exited with 3")
    assert build_report(tmp_path).unfinished == (
        "the run did not finish: 3 of 20 steps committed; device 'd1' (rank 1, stage 1) "
        "exited with 3")
    write_state(tmp_path, "finished", 20)
    assert build_report(tmp_path).unfinished is None
    assert json.loads((tmp_path / "status.json").read_text())["pid"] == os.getpid()


def test_a_half_written_last_line_is_not_read(tmp_path: Path) -> None:
    write_run(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 1.0, "wall')  # its writer was killed mid-line
    with (tmp_path / "timeline.jsonl").open("a") as f:
        f.write('{"device": "orin-0", "ra')
    assert build_report(tmp_path).steps == 3


def test_a_run_without_a_step_yet_is_one_line_saying_so(tmp_path: Path) -> None:
    write_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    _state(tmp_path, state="running", steps=20, pid=os.getpid(), host=socket.gethostname())
    with pytest.raises(InputError) as exc:
        build_report(tmp_path)
    assert str(exc.value).endswith(f"no steps recorded: the run is in progress: 0 of 20 "
                                   f"steps committed so far (launcher pid {os.getpid()})")


def _line(step: int, started: float, loss: float) -> dict:
    # d1 starts each step 0.1 s after d0: the step's start is the earliest device's
    return {"step": step, "loss": loss, "wall_ms": 400.0, "samples_per_s": 10.0,
            "devices": {"d0": {"started_at": started}, "d1": {"started_at": started + 0.1}}}


def test_progress_is_the_last_step_at_the_rate_of_the_step_starts() -> None:
    lines = [_line(s, 100.0 + 0.5 * s, 1.0 / (s + 1)) for s in range(4)]
    lines.insert(2, {"type": "join_failed", "reason": "x"})  # not a step
    now = progress(lines, total=10, global_batch=4)
    # 4 of 10 done; 3 periods in 1.5 s: 0.5 s a step, 4 / 0.5 = 8 samples/s, 6 x 0.5 s left
    assert now == Progress(4, 10, 0.25, 8.0, 3.0)
    assert now.text() == "step 4/10  loss 0.2500  8.0 samples/s  ETA 0:00:03"
    # one step: its own wall time (0.4 s) is the period
    assert progress(lines[:1], 10, 4) == Progress(1, 10, 1.0, 10.0, 3.6)
    assert progress([], 10, 4) is None


def test_the_follower_reads_complete_new_lines_and_rereads_a_shrunk_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    follow = Follower(path)
    assert follow.read() == []  # no file yet
    path.write_text('{"step": 0}\n{"step": 1}\n{"ste')
    assert follow.read() == [{"step": 0}, {"step": 1}]
    with path.open("a") as f:
        f.write('p": 2}\n')
    assert follow.read() == [{"step": 2}]
    path.write_text('{"step": 0}\n')  # truncated (a rollback): read from the top again
    assert follow.read() == [{"step": 0}] and follow.lines == [{"step": 0}]
    last_two = Follower(path, keep=2)  # a long run's follower keeps the last lines only
    path.write_text("".join(f'{{"step": {s}}}\n' for s in range(5)))
    assert len(last_two.read()) == 5 and last_two.lines == [{"step": 3}, {"step": 4}]
