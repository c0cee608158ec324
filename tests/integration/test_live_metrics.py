"""Metrics that arrive as the run goes (issue 28, "Metrics arrive late"; docs/executor.md,
"Run directory and metrics format").

Real runs of ``edgepipe run`` in a subprocess: the toy model of
``tests.helpers.recovery_runs`` on ``d0`` alone, its replica on the standby ``d1`` (the
demo's kind of plan, which recovers in-process), replicated only at its start and end
(interval 100: no point between), emulated so that a step lasts ``STEP_S``. Each
subprocess runs in its own session; it and the workers it started are killed (by its
process group) and reaped, also when a test fails. Reading the files needs no clock
window: a line seen while the run goes on is compared with the run's own step start
times (``started_at``, the same wall clock).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.metrics import MetricsWriter, read_jsonl
from edgepipe.planner.check.live import complete_lines

from tests.helpers.executor_helpers import make_test_plan, profile_mlp, write_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import PY, alive
from tests.helpers.recovery_runs import BEAT_S, HANG_S, one_device_plan

#: emulated seconds of one step
STEP_S = 0.2
#: a deadline that only stops a hung test (many times the runs' expected length)
DEADLINE_S = 240.0


def _cli(*argv: str) -> list[str]:
    return [PY, "-c", "from edgepipe.planner.cli.main import main; import sys; "
            "raise SystemExit(main(sys.argv[1:]))", *argv]


@contextlib.contextmanager
def _run(tmp_path: Path, steps: int, *more: str) -> Iterator[subprocess.Popen[str]]:
    """``edgepipe run`` of the module's plan for ``steps`` steps into ``tmp_path/run``
    (``more``: more options), in its own session; on the way out its whole process group
    is SIGKILLed (if still there) and it is reaped, and every worker it started is
    gone."""
    plan = one_device_plan(2, replication_interval=100)
    path = write_plan(plan, tmp_path)
    scale = STEP_S * 1e3 / plan.cost.iteration_ms
    proc = subprocess.Popen(
        _cli("run", str(path), "--steps", str(steps), "--out", str(tmp_path / "run"),
             "--deterministic", "--emulate", "--time-scale", f"{scale:.6g}",
             "--hang-timeout", str(HANG_S), "--heartbeat", str(BEAT_S), *more),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        _await_gone(tmp_path / "run")


def _await_gone(folder: Path) -> None:
    """Wait (at most 10 s) until no worker named in ``ranks.json`` exists; SIGKILL the
    rest (killed with the group, they are reaped by init, not by this process)."""
    try:
        pids = [r["pid"] for r in json.loads((folder / "ranks.json").read_text())]
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)


def _steps(folder: Path) -> list[dict]:
    """The complete step lines of ``folder/metrics.jsonl`` now ([] before it exists)."""
    try:
        text = (folder / "metrics.jsonl").read_text()
    except OSError:
        return []
    return [m for m in complete_lines(text, "metrics.jsonl") if "type" not in m]


def _started(line: dict) -> float:
    return min(d["started_at"] for d in line["devices"].values())


@pytest.mark.parametrize("more", [(), ("--no-recover",)], ids=["recovering", "plain"])
def test_each_committed_step_is_in_metrics_jsonl_while_the_run_goes_on(
    tmp_path: Path, more: tuple[str, ...],
) -> None:
    # recovering: the launcher's supervisor writes the lines (it wrote them only once
    # durable: with no replication point between start and end, all at the end);
    # plain (--no-recover): rank 0's collector thread, one line per step as it ends
    steps = 12
    first_seen: dict[int, float] = {}
    seen_lines: dict[int, dict] = {}
    with _run(tmp_path, steps, *more) as proc:
        deadline = time.monotonic() + DEADLINE_S
        while proc.poll() is None and time.monotonic() < deadline:
            now = time.time()
            for m in _steps(tmp_path / "run"):
                first_seen.setdefault(m["step"], now)
                seen_lines.setdefault(m["step"], m)
            time.sleep(0.02)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    final = _steps(tmp_path / "run")
    assert [m["step"] for m in final] == list(range(steps))
    # step 0's line was there before the last step began: written when step 0
    # committed, not when the run ended (it was seen before the run ended, too)
    assert 0 in first_seen and first_seen[0] < _started(final[-1])
    # what was seen mid-run is what stands: the committed lines, unchanged
    assert all(seen_lines[s] == final[s] for s in seen_lines)
    # the progress line: a non-terminal stderr gets one line when a step first shows,
    # then at most one every 10 s, and the last step's at the end
    progress = [x for x in stderr.splitlines() if x.startswith("step ")]
    assert all(re.fullmatch(r"step \d+/12  loss \d+\.\d{4}  \d+\.\d samples/s  "
                            r"ETA \d:\d\d:\d\d", x) for x in progress), progress
    assert progress[-1] == (f"step 12/12  loss {final[-1]['loss']:.4f}  "
                            f"{progress[-1].split()[4]} samples/s  ETA 0:00:00")


def test_report_on_a_run_killed_mid_way_reports_its_committed_steps(tmp_path: Path) -> None:
    steps = 100
    with _run(tmp_path, steps) as proc:
        deadline = time.monotonic() + DEADLINE_S
        while len(_steps(tmp_path / "run")) < 4 and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it was killed"
        assert len(_steps(tmp_path / "run")) >= 4, "no committed step in metrics.jsonl"
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers, at once
        proc.communicate(timeout=60)
        launcher = proc.pid
    committed = _steps(tmp_path / "run")
    assert 4 <= len(committed) < steps
    assert [m["step"] for m in committed] == list(range(len(committed)))
    done = subprocess.run(_cli("report", str(tmp_path / "run")), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    k = len(committed)
    lines = done.stdout.splitlines()
    assert lines[0] == (f"the run did not finish: {k} of {steps} steps committed; its "
                        f"launcher (pid {launcher}) is gone without a word (killed, e.g. "
                        "by SIGKILL, or crashed)")
    assert f"steps 1-{k - 1} of {k})" in done.stdout
    median = statistics.median(m["wall_ms"] for m in committed[1:])
    assert f"measured {median:.1f} ms (median" in done.stdout
    assert "Traceback" not in done.stderr


# -- the writer's rollback (a recovering run's replay; executor/core/metrics.py) --------
def _payload(step: int, loss: float) -> dict:
    return {"step": step, "losses": [], "loss_sum": loss, "compute_ms": 1.0, "send_ms": 0.0,
            "recv_wait_ms": 0.0, "allreduce_ms": 0.0, "optim_ms": 0.0, "wall_ms": 10.0,
            "peak_mem_bytes": 1, "intervals": [["F", 0, 0.0, 1.0]]}


@pytest.mark.parametrize("append", [False, True])
def test_a_rollback_takes_the_replayed_steps_lines_out_and_keeps_the_events(
    tmp_path: Path, append: bool,
) -> None:
    plan = make_test_plan(profile_mlp(), [(0, 4, [2])], 2, 1)
    layout = RankLayout.from_plan(plan)
    if append:  # a resumed run appends to the lines of its earlier part
        (tmp_path / "metrics.jsonl").write_text('{"step": -1}\n')
        (tmp_path / "timeline.jsonl").write_text('{"step": -1}\n')
    writer = MetricsWriter(tmp_path, layout, deterministic=False, append=append)
    for step in range(4):
        writer.write_step(step, [_payload(step, float(step))])
        if step == 2:
            writer.write_event({"type": "join_failed", "reason": "d9 never beat"})
    writer.rollback(2)  # steps 2 and 3 are replayed: their lines go, the event stays
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    before = [-1] if append else []
    assert [m.get("step", m.get("type")) for m in lines] == [*before, 0, 1, "join_failed"]
    assert [e["step"] for e in read_jsonl(tmp_path / "timeline.jsonl")] == [*before, 0, 1]
    writer.write_step(2, [_payload(2, 20.0)])  # the replay's line
    writer.rollback(5)  # nothing written from step 5 on: nothing to take out
    writer.close()
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m.get("step", m.get("type")) for m in lines] == [*before, 0, 1, "join_failed", 2]
    assert lines[-1]["loss"] == 20.0
    assert [e["step"] for e in read_jsonl(tmp_path / "timeline.jsonl")] == [*before, 0, 1, 2]
