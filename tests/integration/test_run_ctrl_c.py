"""Ctrl-C during ``edgepipe run`` (issue 27, "Signals and pipes"; docs/usage.md, exit
status): 130 and one line, and every process of the run gone.

A real run of the toy model of ``tests.helpers.recovery_runs`` on ``d0`` (its standby
on ``d1``), emulated at 0.2 s a step for far more steps than the test waits, in its own
session with SIGINT at its default (a background job would inherit it ignored). Its
Ctrl-C comes as a terminal sends one: SIGINT to the whole process group, workers
included, once its first step is in ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.executor_helpers import write_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import PY, alive, ctrl_c_at_default, group_gone
from tests.helpers.recovery_runs import one_device_plan

#: a deadline that only stops a hung test
DEADLINE_S = 240.0


def _gone(pids: list[int]) -> bool:
    """Whether every process of ``pids`` has ended (waiting at most 10 s)."""
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_ctrl_c_stops_a_run_with_130_and_one_line_and_leaves_no_process(tmp_path: Path):
    # the CLI turned the launcher's KeyboardInterrupt into an error: status 2
    plan = one_device_plan(2, replication_interval=100)
    scale = 200 / plan.cost.iteration_ms
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [PY, "-m", "edgepipe.planner.cli", "run", str(write_plan(plan, tmp_path)),
         "--steps", "100000", "--out", str(out), "--emulate", "--time-scale", f"{scale:.6g}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=ctrl_c_at_default)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not ((out / "metrics.jsonl").is_file() and (out / "ranks.json").is_file()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        workers = [r["pid"] for r in json.loads((out / "ranks.json").read_text())]
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "interrupted; every worker was stopped"
    assert "Traceback" not in err and "error" not in err
    assert _gone(workers)
    assert group_gone(proc.pid)

