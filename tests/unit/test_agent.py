"""``python -m edgepipe.executor.agent``: torchrun with a short exit barrier (issue 27);
its own flag is read before torchrun's arguments. The barrier across lost hosts is
tested in tests/integration/test_multihost.py (the agents of a recovered job exit within
30 s of the coordinator, no traceback)."""

from __future__ import annotations

import pytest
from edgepipe.executor import agent


def test_torchruns_arguments_pass_through_with_the_default_barrier() -> None:
    assert agent.parse(["--nnodes", "2", "-m", "edgepipe.executor.worker"]) == (
        agent.EXIT_BARRIER_S, ["--nnodes", "2", "-m", "edgepipe.executor.worker"])


def test_the_exit_barrier_is_read_first() -> None:
    assert agent.parse(["--exit-barrier", "2.5", "--nnodes", "3"]) == (2.5, ["--nnodes", "3"])


@pytest.mark.parametrize("argv, message", [
    (["--exit-barrier"], "--exit-barrier needs a number of seconds"),
    (["--exit-barrier", "soon", "--nnodes", "1"],
     "--exit-barrier: 'soon' is not a number of seconds"),
    (["--exit-barrier", "0", "--nnodes", "1"],
     "--exit-barrier must be a positive number of seconds, got 0"),
    (["--exit-barrier", "inf"], "--exit-barrier must be a positive number of seconds"),
])
def test_a_bad_exit_barrier_is_refused_in_one_line_before_torchrun_runs(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        agent.main(argv)
    assert exit_.value.code == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: " + message), first
