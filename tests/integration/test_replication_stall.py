"""A short run never waits longer for its replication points than its steps take (issue
28; docs/fault-tolerance.md, "Short runs").

Two plans whose replica transfer lasts about 21 of their predicted steps, at the default
interval (``auto``, which resolves to that many steps), run for 10 steps through
``edgepipe run --emulate`` with their replicas on (:mod:`tests.helpers.stall_runs`): the
toy model on ``d0`` alone with the standbys ``d1`` and ``d2`` (the demo's kind of plan),
and a two-stage plan on ``d0`` and ``d1``, each holding the other's ring replica. Before
the fix each waited for point 0's transfer before its last commit and for the final
point's in full afterwards, 2.5 to 3 times its steps' time. The verdict compares the
run's wall time, from its first step's start to the CLI's return, with its steps' time
measured in the same run (each step's ``wall_ms`` less its wait for a replication point,
from ``metrics.jsonl``): a reference that the machine's load stretches with the run, so
the test runs in the parallel call (docs/testing.md, "Timing verdicts"; it passed with
both cores busy, docs/decisions.md, session 21).
"""

from __future__ import annotations

import math
import time

import pytest
from edgepipe.planner.cli.main import main

from tests.helpers.executor_helpers import write_plan
from tests.helpers.recovery_runs import BEAT_S, GLOO_TIMEOUT_S, HANG_S
from tests.helpers.stall_runs import one_device, transfer_ms, two_stages, wall_and_steps

STEPS = 10
#: the emulated length of one predicted step: 10 steps last about 5 s
STEP_S = 0.5


@pytest.mark.parametrize("make", [one_device, two_stages], ids=["standbys", "two-stages"])
def test_a_short_run_takes_at_most_twice_its_steps_and_names_the_points_it_skips(
    tmp_path, capsys, make,
):
    plan = make()
    span = transfer_ms(plan) / plan.cost.iteration_ms
    assert span > 2 * STEPS  # waiting for point 0 and for the end would cost 3x its steps
    assert plan.problem.config.replication_interval == math.ceil(span)  # auto
    path = write_plan(plan, tmp_path)
    scale = STEP_S * 1e3 / plan.cost.iteration_ms
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--steps", str(STEPS),
                 "--emulate", "--time-scale", f"{scale:g}", "--hang-timeout", str(HANG_S),
                 "--heartbeat", str(BEAT_S), "--timeout", str(GLOO_TIMEOUT_S)]) == 0
    wall, steps = wall_and_steps(tmp_path / "out", time.time(), STEPS)
    assert wall <= 2 * steps, f"{wall:.1f} s of wall time for {steps:.1f} s of steps"
    err = capsys.readouterr().err
    assert err.count(
        f"warning: a run of {STEPS} steps skips replication point 0 and sends no replica "
        f"of its final state (point {STEPS}): a point's transfer takes ") == 1
    assert ("a failure replays from the last point taken or the start state (plan with "
            "--replication-interval 0 to turn replicas off)") in err
