"""Per device, per stage and per link: ``edgepipe report`` on a hand-written run of a
hand-worked hybrid plan (tests/helpers/link_runs.py), every figure worked out by hand;
the metrics writer's transfer lines from hand-written rank payloads; the run's mode in
the text and the chart titles (issue 25 item 3, issue 27); a stage's link and ring
predicted under the plan's own traffic, as ``edgepipe plan`` prints them, on a switch
and a shared medium, worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.metrics import transfer_lines
from edgepipe.planner.check.breakdown import StageRow, stage_rows
from edgepipe.planner.check.live import write_state
from edgepipe.planner.check.report import build_report, device_rows, report_panels
from edgepipe.planner.cli.plan_views import transfer_figures
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster, Device, Link, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import RuntimeWork
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan

from tests.helpers.hand_model import MODEL, T
from tests.helpers.link_runs import MIB, hand_plan, write_link_run
from tests.helpers.paths import REPO


def test_link_rows_set_each_piece_against_the_cost_models_piece(tmp_path: Path) -> None:
    write_link_run(tmp_path)
    report = build_report(tmp_path)
    assert report.steps_used == (1,)
    got = {(r.direction, r.src, r.dst): r for r in report.links}
    assert list(got) == [("activations", "A", "C"), ("activations", "B", "C"),
                         ("gradients", "C", "A"), ("gradients", "C", "B")]
    for r in report.links:
        assert (r.boundary, r.per_step, r.num_bytes) == (0, 2, 20.0)  # one sample of b1
    # 20 bytes at 1000 bytes/ms + 1 ms; B-C: 20 bytes at 100 bytes/ms + 4 ms
    a_c, b_c = got[("activations", "A", "C")], got[("activations", "B", "C")]
    assert a_c.predicted_ms == pytest.approx(1.02)
    assert b_c.predicted_ms == pytest.approx(4.2)
    assert got[("gradients", "C", "B")].predicted_ms == pytest.approx(4.2)
    # A -> C: m0 timed exactly (1.5 ms); m1's receiver came after the data (1.1 ms, a bound)
    assert (a_c.measured_ms, a_c.exact, a_c.count) == (pytest.approx(1.5), 1, 2)
    assert a_c.bound_ms == pytest.approx((1.5 + 1.1) / 2)
    assert (b_c.measured_ms, b_c.exact, b_c.count) == (pytest.approx(4.5), 2, 2)
    assert got[("gradients", "C", "A")].measured_ms == pytest.approx(1.02)


def test_stage_rows_time_the_ring_and_the_boundary_on_the_shared_clock(tmp_path: Path) -> None:
    write_link_run(tmp_path)
    first, last = build_report(tmp_path).stages
    assert first.devices == ("A", "B")
    # the slowest device's mean action: B's F 3 and B 5 ms; predicted b0 + b1 at batch 1
    assert (first.forward_measured, first.backward_measured) == (3.0, 5.0)
    assert (first.forward_predicted, first.backward_predicted) == (3.0, 6.0)
    # ring: A 30-40 ms from 101.000 s, B 31-39 from 101.002: last start 101033, first end 101040
    assert first.allreduce_measured == pytest.approx(7.0)
    # predicted under the plan's own traffic (what `edgepipe plan` prints), by hand: A and
    # B run F0 F1 B0 B1 (warm-up min(2(2-0)-1, M) = 2), 3 and 6 ms a micro-batch; C runs
    # F0 B0 F1 B1, 6 and 12 ms. Pieces: A-C 20 B at 1000 B/ms = 0.02 ms + 1 ms latency,
    # B-C 20 B at 100 B/ms = 0.2 ms + 4 ms. Activations m0 posted at 3: on C's downlink
    # half each, A's ends at 3.04, B's alone then, at 3.22 (delivered 4.04, 7.22): 4.22
    # ms; m1 posted at 6, the downlink idle again: 4.22. C: F0 7.22-13.22, B0 -25.22,
    # gradients m0 on C's uplink the same way, 4.22; F1 -31.22, B1 -43.22, m1 4.22. The
    # link: the mean of four 4.22 ms (the idle figure too: nothing else on the network)
    assert first.link_predicted == pytest.approx(4.22)
    # the ring once both joined: A's B1 44.26-50.26 (gradient m1 at 43.22 + 0.04 + 1), B's
    # 47.44-53.44 (43.22 + 0.22 + 4); chunks of 3000 B / 2 at 1000 B/ms = 1.5 ms + 1 ms,
    # A up to B down and B up to A down, nothing else in flight: 2 steps x 2.5 = 5.0.
    # A and B start the next step at 58.44, after their ring, on an idle network (C idle
    # since 43.22): every step is the first shifted, the steady one too
    assert first.allreduce_predicted == pytest.approx(5.0)
    # per micro-batch and direction whose pieces were all timed exactly, post to last
    # delivery: activations m0 A at 101002 (101.000 s + 2) to B's at 101009.5 (101.002 s
    # + 7.5) = 7.5; m1 not (A's m1 not timed exactly); gradients m0 C at 101009 (101.001
    # s + 8) to C -> B's at 101013.2 = 4.2 (m1 none): (7.5 + 4.2) / 2
    assert first.link_measured == pytest.approx(5.85)
    assert (last.allreduce_measured, last.link_predicted, last.link_measured) == (None, None,
                                                                                 None)


def contended_plan(topology: str) -> Plan:
    """Devices A, B, C of the hand type; A alone holds b0-b1 for both samples, B and C
    hold b2 for one sample each (a ring); 0.016 Mbit/s = 2 bytes/ms, except B-C at
    8 Mbit/s = 1000 bytes/ms; latency 0; micro-batch 2, M = 2."""
    net = Network(0.016, 0.0, topology == "shared_medium", links=(Link("B", "C", 8.0, 0.0),))
    cluster = Cluster("contended", (Device("A", "t"), Device("B", "t"), Device("C", "t")), net,
                      {"t": T})
    problem = make_problem(MODEL, cluster, TrainingConfig(4, (2,)), catalog={"t": T})
    partition = Partition(2, 2, (StageAssignment(0, 2, ("A",), (2,)),
                                 StageAssignment(2, 3, ("B", "C"), (1, 1))))
    return make_plan(problem, partition, SolverInfo("hand"))


def predicted_rows(plan: Plan) -> tuple[StageRow, ...]:
    """``plan``'s stage rows with no run lines: the predictions alone."""
    return stage_rows(plan, CostModel(plan.problem, plan.partition.micro_batch_size),
                      [], {}, 1.0)


@pytest.mark.parametrize(("topology", "link", "ring", "idle_ring"), [
    # switched, by hand. A: F 6, B 12 ms (b0 + b1 at batch 2), F0 F1 B0 B1; B and C: F 3,
    # B 6 (b2 at batch 1), F0 B0 F1 B1. Pieces A-B, A-C: 20 B at 2 B/ms = 10 ms; chunks
    # B-C: 1500 B at 1000 B/ms = 1.5 ms. Activations m0 posted at 6, both on A's uplink
    # at half: delivered at 26 (20 ms); m1 posted at 12 queues behind m0 on each pair,
    # 26-46 (34 ms). B, C: F0 26-29, B0 -35, gradients m0 on A's downlink at half, 35-55
    # (20); F1 46-49, B1 -55, gradients m1 55-75 (20). Link (20 + 34 + 20 + 20) / 4. Ring
    # from 55 with the gradients m1: B's uplink, C's uplink and A's downlink each hold
    # two transfers, all at half: 3 ms a step, 55-61 (6; idle 2(g-1)/g x 3000 / 1000 = 3).
    # A: B0 55-67, B1 75-87, then its next step at once on an idle network (B and C free
    # since 61): every step is the first shifted
    ("switched", 23.5, 6.0, 3.0),
    # shared medium, by sender, by hand. Activations m0: A alone sends both, half each,
    # 6-26; m1 from 26 at half. At 35 B and C post gradients m0 (m1's pieces have 5.5 ms
    # left): three senders, A's two pieces 1/6 each, B's and C's 1/3: the gradients end
    # at 65 (10 ms at 1/3), m1's pieces have 5.5 - 30/6 = 0.5 ms left, A alone, half:
    # delivered at 66. B, C: F1 66-69, B1 -75, then gradients m1 and the ring together:
    # two senders, each two transfers, 1/4 each: ring steps 75-81, 81-87 (1.5 ms at 1/4);
    # the gradients then have 10 - 12/4 = 7 ms left, half each: 87-101. Link: m0 20, m1
    # 12-66 = 54, gradients m0 30, m1 26: 130 / 4. Ring 12 (idle 2(g-1) x 3000 / 1000 =
    # 6). A: B0 65-77, B1 101-113, its next step on an idle network: the first shifted
    ("shared_medium", 32.5, 12.0, 6.0),
])
def test_a_stages_link_and_ring_are_predicted_under_the_plans_own_traffic(
        topology: str, link: float, ring: float, idle_ring: float) -> None:
    plan = contended_plan(topology)
    # no run lines: the rows carry the predictions alone
    first, last = predicted_rows(plan)
    assert (first.link_predicted, first.allreduce_predicted) == (pytest.approx(link), 0.0)
    assert (last.link_predicted, last.allreduce_predicted) == (None, pytest.approx(ring))
    # not the figures alone on an idle network: A's uplink, 10 + 10 ms, and the ring alone
    assert (plan.cost.stages[0].link_out_ms, plan.cost.stages[1].allreduce_ms) == (
        pytest.approx(20.0), pytest.approx(idle_ring))
    # one source with `edgepipe plan`'s `link ms` and `ar ms`
    assert transfer_figures(plan) == [(pytest.approx(link), 0.0), (0.0, pytest.approx(ring))]


@pytest.mark.parametrize(("topology", "steady", "ring", "b_idle"), [
    # switched (the hand timeline of the test above): A's next step starts at 87, its
    # B1's end; B (and C): F0 26-29, B0 -35, F1 46-49, B1 -55, ring 55-61, idle 0-26,
    # 35-46 and 61-87: 26 + 11 + 26 = 63
    ("switched", 87.0, 6.0, 63.0),
    # shared medium: A's next step at 113; B: F0 26-29, B0 -35, F1 66-69, B1 -75, ring
    # 75-87, idle 0-26, 35-66 and 87-113: 26 + 31 + 26 = 83
    ("shared_medium", 113.0, 12.0, 83.0),
])
def test_a_devices_all_reduce_and_bubbles_are_its_stages_ring_under_the_plans_own_traffic(
        topology: str, steady: float, ring: float, b_idle: float) -> None:
    plan = contended_plan(topology)
    assert plan.cost.steady_ms == pytest.approx(steady)
    a, b, c = device_rows(plan, [], [], 1.0, predicted_rows(plan))
    # A: no ring; compute M x (f + b) = 2 x (6 + 12) = 36, bubbles the step less that
    # (switched: F0 F1 0-12, B0 55-67, B1 75-87: idle 43 + 8 = 51)
    assert (a.allreduce_predicted, a.compute_predicted) == (0.0, pytest.approx(36.0))
    assert a.bubble_predicted == pytest.approx(steady - 36.0)
    # B and C: the stage's contended ring (not the idle 3.0 / 6.0), compute 2 x (3 + 6) =
    # 18, bubbles the step less both: exactly the time each is idle in the steady step
    for dev in (b, c):
        assert dev.allreduce_predicted == pytest.approx(ring)
        assert dev.compute_predicted == pytest.approx(18.0)
        assert dev.bubble_predicted == pytest.approx(steady - 18.0 - ring)
        assert dev.bubble_predicted == pytest.approx(b_idle)


def test_device_rows_give_compute_bubbles_and_memory_per_step(tmp_path: Path) -> None:
    plan = write_link_run(tmp_path)
    a, b, c = build_report(tmp_path).devices
    # A: M x (f + b) = 2 x ((1 + 2) + (2 + 4)) ms at batch 1
    assert a.compute_predicted == pytest.approx(18.0)
    assert a.compute_measured == 12.0
    # bubble: the step less compute, all-reduce (and, measured, the optimizer step)
    assert a.bubble_predicted == pytest.approx(plan.cost.steady_ms - 18.0 - 5.0)
    assert (a.bubble_measured, b.bubble_measured, c.bubble_measured) == (27.0, 25.0, 43.0)
    # C at batch 2: 2 x (6 + 12) ms, no all-reduce
    assert c.bubble_predicted == pytest.approx(plan.cost.steady_ms - 36.0)
    assert a.memory_predicted == plan.cost.stages[0].memory_bytes[0]
    assert (a.memory_measured, b.memory_measured) == (100 * MIB, 120 * MIB)
    assert c.memory_measured == 90 * MIB  # no baseline recorded: the peak


def test_the_writer_matches_each_send_to_its_receive() -> None:
    layout = RankLayout.from_plan(hand_plan())  # ranks 0 A, 1 B, 2 C
    payloads = [
        {"started_at": 100.0, "transfers": [["send", 2, 0, 100.002],
                                            ["recv", 2, 1, 100.004, 100.00902]]},
        {"started_at": 100.002, "transfers": [["send", 2, 0, 100.005]]},
        # C posted its receive 0.5 ms before it began to wait (an older writer's
        # receive, A's, has no post: it posted at the wait)
        {"started_at": 100.001, "transfers": [["recv", 0, 0, 100.001, 100.0035, 100.0005],
                                              ["send", 0, 1, 100.008]]},
    ]
    lines = transfer_lines(1, layout, payloads)
    # B's send has no receive (a payload without it): left out
    assert lines == [
        {"device": "A", "rank": 0, "stage": 0, "step": 1, "kind": "TRANSFER_F",
         "micro_batch": 0, "peer": "C", "peer_rank": 2, "start_ms": 2.0, "end_ms": 3.5,
         "waited_ms": 1.0, "recv_posted_ms": 0.5},
        {"device": "C", "rank": 2, "stage": 1, "step": 1, "kind": "TRANSFER_B",
         "micro_batch": 0, "peer": "A", "peer_rank": 0, "start_ms": 7.0, "end_ms": 8.02,
         "waited_ms": 3.0, "recv_posted_ms": 3.0},
    ]


@pytest.mark.parametrize(("mode", "words"), [
    ("lab", "lab run (real compute, confined)"),
    ("real", "real run (this machine's speed)"),
    (None, "real run (this machine's speed)"),  # an older run without a mode: not emulated
])
def test_the_chart_titles_say_what_was_measured(tmp_path: Path, mode, words) -> None:
    write_link_run(tmp_path)
    if mode is not None:
        write_state(tmp_path, "running", 2, mode=mode)
        write_state(tmp_path, "finished", 2)
    report = build_report(tmp_path)
    panels, _ = report_panels(report, tmp_path)
    assert [words in title for _, title in panels] == [True, True]
    measured = panels[1][0]
    # on the shared clock, a channel row per device pair: A -> C's m0 from 1002 ms on
    # (step 1's earliest start 101.000 s is 0): posted 2 ms after A's start
    a_c = [x for x in measured.transfers if (x.src, x.dst, x.micro_batch, x.kind)
           == ("A", "C", 0, "F")]
    assert [(x.start_ms, x.delivered_ms) for x in a_c] == [(pytest.approx(2.0),
                                                           pytest.approx(3.5))]


def test_the_command_prints_every_link_whole_at_any_width(tmp_path: Path) -> None:
    write_link_run(tmp_path)
    write_state(tmp_path, "running", 2, mode="lab")
    write_state(tmp_path, "finished", 2)
    run = [sys.executable, "-m", "edgepipe.planner.cli", "report", str(tmp_path)]
    wide = subprocess.run(run, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={"COLUMNS": "200", "PATH": ""})
    assert wide.returncode == 0, wide.stderr
    assert "predicted vs measured, lab run" in wide.stdout
    row = next(line for line in wide.stdout.splitlines() if "activations" in line
               and " A " in line)
    cells = [c.strip() for c in row.strip("│┃| ").split("│")]
    assert cells == ["0->1", "activations", "A", "C", "20 B", "2", "1.0", "1.5", "1.47", "1/2"]
    narrow = subprocess.run(run, capture_output=True, text=True, cwd=REPO, timeout=120,
                            env={"COLUMNS": "50", "PATH": ""})
    text = " ".join(narrow.stdout.split())
    assert ("activations A -> C (stage 0 -> 1, 20 B, 2 a step): 1.0 predicted, 1.5 "
            "measured (ms; 1 of 2 timed)") in text
    assert "A per step: compute 18.0 predicted, 12.0 measured; bubble" in text
    # the cost model gives A 15600 bytes (Eq. 3 and the ring replica it holds); measured
    # 300 MiB peak less a 200 MiB baseline
    assert "memory 15.23 KiB / 100.00 MiB" in text
    assert json.loads((tmp_path / "status.json").read_text())["mode"] == "lab"


def test_a_mode_other_than_emulated_lab_or_real_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'fast' is not one of emulated, lab, real"):
        write_state(tmp_path, "running", 2, mode="fast")
    write_link_run(tmp_path)
    (tmp_path / "status.json").write_text('{"state": "finished", "steps": 2, "mode": 3}\n')
    with pytest.raises(InputError, match=r"status.json: \$.mode: 3 is not one of"):
        build_report(tmp_path)


def test_a_devices_predicted_bubbles_leave_out_its_optimizer_step() -> None:
    # the contended plan with a measured momentum step of 2^20 / 1000 ms per MiB: each
    # device holds 3000 B of parameters (A: b0 + b1, B and C: b2), so each steps 3.0 ms
    # after its ring: time it neither computes, all-reduces nor idles
    plan = contended_plan("switched")
    work = RuntimeWork(0.0, 0.0, 0.0, 1, (("momentum", 2**20 / 1000),))
    timings = {n: replace(t, runtime_work=work) for n, t in plan.problem.model.timings.items()}
    problem = make_problem(replace(MODEL, timings=timings), plan.problem.cluster,
                           plan.problem.config, catalog={"t": T})
    stepped = make_plan(problem, plan.partition, SolverInfo("hand"))
    rows = {row.device: row for row in device_rows(stepped, [], [], 1.0,
                                                    predicted_rows(stepped))}
    steady = stepped.cost.steady_ms
    assert rows["A"].bubble_predicted == pytest.approx(steady - 36.0 - 3.0)
    ring = rows["B"].allreduce_predicted
    for device in ("B", "C"):
        assert rows[device].bubble_predicted == pytest.approx(steady - 18.0 - ring - 3.0)
