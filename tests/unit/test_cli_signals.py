"""Ctrl-C during the exact solver and a standard output closed early (issue 27, "Signals
and pipes"; docs/usage.md, "The command line", exit status).

Each command runs as ``python -m edgepipe.planner.cli`` in its own session, with SIGINT
at its default (a background job would inherit it ignored), and gets its Ctrl-C as a
terminal sends one: SIGINT to its whole process group (the solver's worker processes and
CBC included). Every verdict is the exit status, the whole of stderr, and that nothing of
the group is left.

When the solve has begun is measured, not guessed: the same command with the DP alone
(``--planners dp``) gives this machine's time to the exact solver's start; the exact
solver's closed-form bounds take at most BOUND_SHARE of its time limit
(planner/solvers/exact/solver.py), and on this problem its search uses the whole limit;
the Ctrl-C comes in between, and the test checks that the
command was still running then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from edgepipe.planner.plan import load_plan
from edgepipe.planner.solvers.exact.solver import BOUND_SHARE

from tests.helpers.paths import REPO
from tests.helpers.processes import PY, ctrl_c_at_default, group_gone
from tests.helpers.runs import write_run

PROBLEM = ["--model", "pipedream-vgg16", "--cluster", "jetson-testbed-6"]
#: a deadline that only stops a hung test
DEADLINE_S = 120.0
#: the one line of an interrupted planning command
INTERRUPTED = "interrupted; nothing was written\n"


def _start(argv: list[str], **options) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "edgepipe.planner.cli", *argv], cwd=REPO, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_at_default, **options)


def _finish(proc: subprocess.Popen[str]) -> str:
    """``proc``'s stderr once it has ended; SIGKILL its group past DEADLINE_S."""
    try:
        _, err = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return err


def _timing() -> tuple[float, float]:
    """The exact solver's time limit and when, after its start, ``compare --planners
    milp`` is inside its search: twice this machine's time to the DP's plan, plus the
    bounds' share of the limit, plus 2 s; the limit is at least 20 s and leaves 40% of
    itself after that."""
    t0 = time.monotonic()
    dp = subprocess.run([PY, "-m", "edgepipe.planner.cli", "compare", *PROBLEM,
                         "--planners", "dp"], cwd=REPO, capture_output=True, timeout=DEADLINE_S)
    assert dp.returncode == 0, dp.stderr
    before = 2 * (time.monotonic() - t0) + 2.0
    limit = max(20.0, before / (0.6 - BOUND_SHARE))
    return limit, before + BOUND_SHARE * limit


def _interrupt_the_search(backend: str, limit: float, at: float) -> tuple[int, str, float]:
    """Start the exact solver's comparison under time limit ``limit``, Ctrl-C it ``at`` s
    after its start; its exit status, its stderr and the seconds from the Ctrl-C to its
    end."""
    proc = _start(["compare", *PROBLEM, "--planners", "milp", "--backend", backend,
                   "--time-limit", f"{limit:.1f}"],
                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(at)
    assert proc.poll() is None, _finish(proc)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    err = _finish(proc)
    took = time.monotonic() - sent
    assert group_gone(proc.pid)
    return proc.returncode, err, took


def test_ctrl_c_during_a_cpsat_solve_exits_130_with_one_line():
    # CP-SAT's own SIGINT handler (catch_sigint_signal) killed the process without a word
    # (-2) or aborted it (-6, std::bad_function_call); stopped, the search's threads
    # ran on to the time limit
    limit, at = _timing()
    for _ in range(3):
        assert _interrupt_the_search("cpsat", limit, at)[:2] == (130, INTERRUPTED)


@pytest.mark.serial  # a Ctrl-C acted on within a quarter of the solve's remaining time
def test_ctrl_c_during_a_highs_solve_acts_at_once():
    # HiGHS solves in worker processes that nothing could stop: the command ended only
    # when the search's time limit did
    limit, at = _timing()
    status, err, took = _interrupt_the_search("highs", limit, at)
    assert (status, err) == (130, INTERRUPTED)
    assert took < (limit - at) / 4


def test_ctrl_c_during_a_cbc_solve_exits_130_and_leaves_no_cbc():
    limit, at = _timing()
    assert _interrupt_the_search("cbc", limit, at)[:2] == (130, INTERRUPTED)


def _closed_early(argv: list[str]) -> tuple[int, str]:
    """Run ``edgepipe argv`` with its stdout a pipe whose reader is gone before it
    prints (``| head`` that has read enough); its exit status and stderr."""
    proc = _start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = _finish(proc)
    return proc.returncode, err


def test_a_stdout_closed_early_loses_no_file_and_exits_141_silently(tmp_path):
    # the file was written after the summary: `plan -o plan.json | head` wrote no file
    # and exited 1 with a blank line (rich's exit on a broken pipe, and its progress bar)
    plan = tmp_path / "plan.json"
    assert _closed_early(["plan", *PROBLEM, "-o", str(plan)]) == (141, "")
    first = load_plan(plan)  # a whole plan
    gantt = tmp_path / "gantt.png"
    assert _closed_early(["show", str(plan), "-o", str(gantt)]) == (141, "")
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _closed_early(["simulate", str(plan)]) == (141, "")
    lost = first.partition.stages[0].devices[0]
    replanned = tmp_path / "replanned.json"
    assert _closed_early(["replan", str(plan), "--lost", lost, "-o", str(replanned)]) == (
        141, "")
    assert lost not in load_plan(replanned).partition.used_devices()
    folder = tmp_path / "compare"
    assert _closed_early(["compare", *PROBLEM, "--planners", "dp,data-parallel",
                          "--out", str(folder)]) == (141, "")
    assert sorted(p.name for p in folder.iterdir()) == [
        "compare.csv", "compare.json", "compare.png"]
    run = tmp_path / "run"
    write_run(run)
    chart = tmp_path / "report.png"
    assert _closed_early(["report", str(run), "-o", str(chart)]) == (141, "")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_to_a_closed_stdout_exits_141_silently(tmp_path: Path):
    assert _closed_early(["plan", *PROBLEM, "-o", "-"]) == (141, "")


def test_ctrl_c_during_the_demos_planning_exits_130_naming_what_it_wrote(tmp_path):
    # the demo profiles its model, writes the profile, then plans it with every planner
    # (the DP, the exact solver under a limit it cannot reach here, the baselines): the
    # Ctrl-C comes while it plans, checked by the command still running then
    folder = tmp_path / "demo"
    proc = _start(["demo", "--emulate", "--out", str(folder), "--time-limit", "60",
                   "--run-steps", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE_S
    while not (folder / "emulated-profile.json").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, _finish(proc)
        time.sleep(0.05)
    time.sleep(0.5)
    assert proc.poll() is None, _finish(proc)
    os.killpg(proc.pid, signal.SIGINT)
    err = _finish(proc)  # after the demo's progress lines, the one line
    assert (err.splitlines()[-1], proc.returncode) == (
        f"interrupted; the demo's files so far are in {folder}", 130), err
    assert "Traceback" not in err, err
    assert group_gone(proc.pid)
    assert not (folder / "gantt.png").exists()  # interrupted before the DP plan was drawn


A_MODEL_WITH_A_BROKEN_PIPE = """\
def model():
    raise BrokenPipeError(32, "a socket of the model")
"""


def test_a_broken_pipe_other_than_stdout_is_not_taken_for_a_closed_stdout(tmp_path):
    # a BrokenPipeError of the user's code, stdout still read: not the silent 141
    (tmp_path / "broken_pipe_model.py").write_text(A_MODEL_WITH_A_BROKEN_PIPE)
    proc = _start(["profile", "--model", "broken_pipe_model:model",
                   "--input", "broken_pipe_model:model", "-o", str(tmp_path / "x.json")],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  env={**os.environ, "PYTHONPATH": str(tmp_path)})
    err = _finish(proc)
    assert proc.returncode != 141 and "a socket of the model" in err
    assert not (tmp_path / "x.json").exists()
