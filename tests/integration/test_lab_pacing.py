"""Specification of a paced lab device on this machine's real cgroups
(executor/lab/pacing.py): under a quarter-core quota every action takes four times its
CPU time, a short one included, where the bare CFS quota runs a short action at a whole
core (docs/lab.md, "Compute")."""

from __future__ import annotations

import json
import os
import statistics

import pytest
from edgepipe.executor.lab.cgroups import Cgroup, Confinement

from tests.helpers import needs
from tests.helpers.processes import run_in_group

#: a device that waits for a line on stdin (so that it is in its group before it works),
#: then runs 20 actions of 4 ms of CPU and 5 of 40 ms, each paced to a quarter core when
#: argv[1] is "paced", and prints per action [CPU s asked, wall s, CPU s]
ACTIONS = (
    "import json, sys, time\n"
    "from edgepipe.executor.lab.pacing import Pacer, fine_timer_slack\n"
    "sys.stdin.readline()\n"
    "paced = sys.argv[1] == 'paced'\n"
    "fine_timer_slack()\n"
    "pacer = Pacer(0.25)\n"
    "out = []\n"
    "for s in [0.004] * 20 + [0.04] * 5:\n"
    "    t, c = time.perf_counter(), time.process_time()\n"
    "    end = time.thread_time() + s\n"
    "    while time.thread_time() < end: pass\n"
    "    if paced: pacer.pace()\n"
    "    out.append([s, time.perf_counter() - t, time.process_time() - c])\n"
    "print(json.dumps(out))\n"
)


def ratios(group: Cgroup, mode: str) -> dict[float, float]:
    """Median wall / CPU time per action size of the ACTIONS child run in ``group``."""
    done = run_in_group(group, ACTIONS, mode)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    return {size: statistics.median(w / c for s, w, c in rows if s == size)
            for size in (0.004, 0.04)}


@pytest.mark.serial  # wall-clock verdict: paced actions within 3.4x-4.6x their CPU time
def test_a_paced_quarter_core_device_takes_four_times_the_cpu_time_of_every_action() -> None:
    needs.cgroups()
    # Bare: a 25% quota of a 100 ms period; a 4 ms action fits in what is left of the
    # period's 25 ms most of the time, so it runs at a whole core (seen: 1.0x). Paced:
    # the quota a ceiling of 1.25 x 25% over 1 s, the process sleeping each action out
    # to CPU / 0.25 (seen: 4.0x for both sizes at load 2-7).
    with Cgroup.create("bare", Confinement(0.25, None)) as bare, Cgroup.create(
        "paced", Confinement(0.25, None, paced=True)
    ) as paced:
        unpaced = ratios(bare, "bare")
        got = ratios(paced, "paced")
    load = os.getloadavg()
    assert unpaced[0.004] < 2.0, (unpaced, load)
    assert 3.4 <= got[0.004] <= 4.6, (got, load)
    assert 3.4 <= got[0.04] <= 4.6, (got, load)
