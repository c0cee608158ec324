"""Workers forked from the preloaded forkserver (executor/core/starting.py) start as a
spawned worker did: deaf to Ctrl-C, with the launcher's environment and stderr as they
are at the worker's start (not at the server's), and their exit status seen by the
launcher; the worker modules are already imported."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from edgepipe.executor.core.starting import process, start_deaf_to_ctrl_c, worker_context


def _report(path: str) -> None:
    """A worker's view of its start, written to ``path``, and one line on stderr."""
    Path(path).write_text(json.dumps({
        "sigint_ignored": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
        "late": os.environ.get("EDGEPIPE_TEST_STARTING_LATE"),
        "preloaded": "edgepipe.executor.worker" in sys.modules,
    }))
    print("starting-test worker on stderr", file=sys.stderr, flush=True)


def _killed() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_is_deaf_to_ctrl_c_sees_the_launchers_env_and_stderr_and_dies_visibly(
    tmp_path, capfd, monkeypatch
):
    with capfd.disabled():  # the server starts here, with another stderr, and before
        ctx = worker_context()  # the variable below is set
    assert ctx.get_start_method() == "forkserver"
    monkeypatch.setenv("EDGEPIPE_TEST_STARTING_LATE", "set after the server started")
    seen = tmp_path / "seen.json"
    proc = process(ctx, _report, (str(seen),), "edgepipe-test-report")
    start_deaf_to_ctrl_c(proc)
    proc.join(30)
    dead = process(ctx, _killed, (), "edgepipe-test-killed")
    dead.start()
    dead.join(30)
    assert proc.exitcode == 0
    assert json.loads(seen.read_text()) == {
        "sigint_ignored": True, "late": "set after the server started", "preloaded": True,
    }
    assert "starting-test worker on stderr" in capfd.readouterr().err
    assert dead.exitcode == -signal.SIGKILL
