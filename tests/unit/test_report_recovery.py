"""Recovery events in `edgepipe report` (planner/check/report.py, issue 8 item 5): a hand-written
run directory whose steps 0-2 ran under plan.json, whose step 2 was interrupted by a
crash, re-planned and replayed, and whose steps 2-3 ran under the new plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from edgepipe.planner.check.report import RecoveryEvent, build_report, run_timeline
from edgepipe.planner.errors import InputError

from tests.helpers.paths import REPO
from tests.helpers.runs import write_run

RECOVERY = {
    "type": "recovery", "generation": 2, "detected_at": 1764590000.25, "cause": "crash",
    "device": "orin-1", "old_plan": "plan-aaaa", "new_plan": "plan-bbbb",
    "replay_from_step": 2, "blocks_moved": [[3, 7]], "bytes_moved": 12_500_000.0,
    "t_detect_s": 0.02, "t_replan_s": 0.004, "t_rebuild_s": 0.31, "t_restore_s": 0.12,
    "t_first_commit_s": 0.9,
}
#: wall ms of the replayed step 2 and of step 3 (under the new plan)
REPLAY_WALLS = {2: 200.0, 3: 150.0}


def step_line(step: int, wall: float, devices: list[str]) -> dict:
    figures = {"rank": 0, "stage": 0, "compute_ms": 1.0, "send_ms": 0.0, "recv_wait_ms": 0.0,
               "allreduce_ms": 0.0, "optim_ms": 0.1, "wall_ms": wall, "peak_mem_bytes": 1}
    return {"step": step, "loss": 0.5, "wall_ms": wall, "samples_per_s": 4 / wall * 1e3,
            "devices": {d: figures for d in devices}}


def write_recovered_run(folder: Path) -> None:
    """write_run's steps 0-2 (walls 900, 110, 130), then the recovery line, the replayed
    step 2 and step 3 on orin-0 and a device plan.json does not have, nx-new."""
    write_run(folder)
    with (folder / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(RECOVERY) + "\n")
        for step, wall in REPLAY_WALLS.items():
            f.write(json.dumps(step_line(step, wall, ["orin-0", "nx-new"])) + "\n")
    with (folder / "timeline.jsonl").open("a") as f:
        for step in REPLAY_WALLS:
            for d, ms in (("orin-0", 4.0), ("nx-new", 6.0)):
                for kind, start in (("F", 0.0), ("B", ms)):
                    f.write(json.dumps({"device": d, "rank": 0, "stage": 0, "step": step,
                                        "kind": kind, "micro_batch": 0, "start_ms": start,
                                        "end_ms": start + ms}) + "\n")


def test_recovery_lines_become_events_and_the_first_plans_figures_stop_before_them(
    tmp_path: Path,
) -> None:
    write_recovered_run(tmp_path)
    report = build_report(tmp_path)
    assert report.recoveries == (RecoveryEvent(
        generation=2, detected_at=1764590000.25, cause="crash", device="orin-1",
        old_plan="plan-aaaa", new_plan="plan-bbbb", replay_from_step=2,
        blocks_moved=((3, 7),), bytes_moved=12_500_000.0, t_detect_s=0.02,
        t_replan_s=0.004, t_rebuild_s=0.31, t_restore_s=0.12, t_first_commit_s=0.9,
    ),)
    assert report.recoveries[0].num_blocks == 4
    # plan.json ran steps 0 and 1 (step 2 was replayed under the new plan): step 1 only
    assert report.steps == 2 and report.steps_used == (1,)
    assert report.iteration_measured_ms == 110.0
    # every committed step once; step 2 is the replay's line
    assert [(m["step"], m["wall_ms"]) for m in report.step_lines] == [
        (0, 900.0), (1, 110.0), (2, 200.0), (3, 150.0)
    ]


def test_the_run_timeline_lays_steps_end_to_end_and_marks_the_replay(tmp_path: Path) -> None:
    write_recovered_run(tmp_path)
    report = build_report(tmp_path)
    timeline, markers = run_timeline(report, tmp_path)
    # offsets: step 0 at 0, 1 at 900, 2 at 1010, 3 at 1210; the run ends at 1360
    assert timeline.makespan_ms == 1360.0
    assert [(m.at_ms, m.label) for m in markers] == [
        (1010.0, "gen 2: crash of orin-1, replay from step 2")
    ]
    # plan.json's stages, then the device only the new plan used
    assert timeline.stages[-1] == ("nx-new",)
    assert [(iv.kind, iv.start_ms, iv.end_ms) for iv in timeline.devices["nx-new"]] == [
        ("F", 1010.0, 1016.0), ("B", 1016.0, 1022.0), ("F", 1210.0, 1216.0),
        ("B", 1216.0, 1222.0),
    ]
    # orin-0's step 2: only the replay's actions (the aborted try's are dropped)
    step2 = [iv for iv in timeline.devices["orin-0"] if 1010.0 <= iv.start_ms < 1210.0]
    assert [(iv.kind, iv.start_ms) for iv in step2] == [("F", 1010.0), ("B", 1014.0)]
    # orin-1 crashed in step 2: its aborted try is not in the run, nor anything later
    assert max(iv.end_ms for iv in timeline.devices["orin-1"]) <= 1010.0


def test_a_recovery_line_without_a_key_is_a_one_line_error(tmp_path: Path) -> None:
    write_run(tmp_path)
    broken = {k: v for k, v in RECOVERY.items() if k != "t_restore_s"}
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(broken) + "\n")
    with pytest.raises(InputError, match=r"metrics.jsonl line 4.*lacks t_restore_s"):
        build_report(tmp_path)


def test_the_report_command_prints_the_recovery_table_and_draws_three_panels(
    tmp_path: Path,
) -> None:
    write_run(tmp_path / "plain")
    plain = subprocess.run([sys.executable, "-m", "edgepipe.planner.cli", "report",
                            str(tmp_path / "plain")], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
    write_recovered_run(tmp_path / "run")
    script = (
        "import sys; sys.modules['torch'] = None\n"
        "from edgepipe.planner.cli.main import main\n"
        f"raise SystemExit(main(['report', {str(tmp_path / 'run')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env={"COLUMNS": "250", "PATH": ""})
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if "plan-aaaa" in line)
    cells = [c.strip() for c in row.strip("│┃| ").split("│")]
    assert cells == ["2", "crash", "orin-1", "plan-aaaa", "plan-bbbb", "2", "4", "12.50",
                     "0.020", "0.004", "0.310", "0.120", "0.900"]
    assert "recoveries" not in plain.stdout
    narrow = subprocess.run([sys.executable, "-m", "edgepipe.planner.cli", "report",
                             str(tmp_path / "run")], capture_output=True, text=True,
                            cwd=REPO, timeout=120, env={"COLUMNS": "80", "PATH": ""})
    assert " ".join(narrow.stdout.split()).count(
        "recovery 2: crash of orin-1; plan-aaaa -> plan-bbbb, replay from step 2; 4 blocks, "
        "12.50 MB moved; detect 0.020 s, re-plan 0.004 s, rebuild 0.310 s, restore 0.120 s, "
        "first commit 0.900 s") == 1
    # the third panel makes the chart taller than the two-panel one of a plain run
    chart, plain_chart = tmp_path / "run" / "report.png", tmp_path / "plain" / "report.png"
    assert png_height(chart) > png_height(plain_chart)


def png_height(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[20:24], "big")


def test_a_recovery_that_never_committed_shows_its_missing_phases_as_dashes(
    tmp_path: Path,
) -> None:
    write_run(tmp_path)
    failed = {**RECOVERY, "device": "orin-0,orin-1", "blocks_moved": 0,
              "t_rebuild_s": 0.25, "t_restore_s": None, "t_first_commit_s": None}
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(failed) + "\n")
    (event,) = build_report(tmp_path).recoveries
    assert (event.num_blocks, event.t_restore_s, event.t_first_commit_s) == (0, None, None)
    done = subprocess.run([sys.executable, "-m", "edgepipe.planner.cli", "report", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"COLUMNS": "80", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert "rebuild 0.250 s, restore - s, first commit - s" in " ".join(done.stdout.split())


def test_every_warning_of_the_report_command_is_one_line_at_any_width(tmp_path: Path) -> None:
    # the recovery's warning (the loss of a one-device plan's last standby) and the
    # emulation's overruns, each longer than the 60 columns of the terminal: one line
    # each on stderr, word for word, the brackets of "[0, 6)" kept
    unreplicated = ("the run goes on unreplicated: no device left can hold the replica of "
                    "stage 0 (blocks [0, 6)) on d0; losing it now stops the run")
    write_run(tmp_path, time_scale=1.0, overruns=3)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**RECOVERY, "warning": unreplicated}) + "\n")
    done = subprocess.run([sys.executable, "-m", "edgepipe.planner.cli", "report", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"COLUMNS": "60", "PATH": ""})
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: real compute exceeded the emulated budget on orin-1 3x (worst +2.5 ms): "
        "those devices ran at this machine's speed, not the plan's; raise --time-scale",
        f"warning: recovery 2: {unreplicated}",
    ]


def test_a_dropped_join_is_a_warning_of_the_report(tmp_path: Path) -> None:
    # the join_failed line edgepipe run wrote (executor/ft/joins.py, "Failed joins"): the
    # report names it once, as a warning; its steps are the run's, untouched
    reason = ("join of e at step 2 (--emulate-join e.json@2) failed: joining device 'e' "
              "exited with status -9 before it was admitted; the run goes on without it")
    write_run(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"type": "join_failed", "device": "e", "step": 2,
                            "detected_at": 1764590000.5, "reason": reason}) + "\n")
    report = build_report(tmp_path)
    assert report.join_failures == (reason,)
    assert report.recoveries == () and report.steps == 3
    done = subprocess.run([sys.executable, "-m", "edgepipe.planner.cli", "report", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"COLUMNS": "80", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("warning: ")] == [
        f"warning: {reason}"]


def test_a_join_failed_line_without_its_reason_is_a_one_line_error(tmp_path: Path) -> None:
    write_run(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"type": "join_failed", "device": "e", "step": 2}) + "\n")
    with pytest.raises(InputError, match=r"metrics.jsonl line 4: a join_failed line lacks "
                                         r"its reason"):
        build_report(tmp_path)
