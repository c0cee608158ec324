"""A plan of one stage on one device keeps its replica on an idle device (issue 8 item 3:
"every stage's weights and optimizer state exist in the memory of at least one other
device"), and recovers from the loss of either (item 4).

The plan runs the 4-block GPT-2-shaped toy model of ``tests.helpers.recovery_runs`` on ``d0``
alone; the cluster's other devices are idle. The launcher runs a standby process on
each idle device that can hold the replica (executor/launch.py, "Standbys"); the first
(``d1``, ties in cluster order) holds it. Real processes over gloo, real SIGKILLs (the
victim signals itself, :mod:`executor.ft.faults`), deterministic mode: every run ends
with per-step losses, samples, final weights and Adam state ``torch.equal`` to the
single-process reference trainer (``tests/helpers/reference_trainer.py``; the checks are
``tests.helpers.recovery_runs``'). Every child is reaped by PID whatever happens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.planner.check.report import RECOVERY_KEYS, RecoveryEvent
from edgepipe.planner.cli.main import main
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import SolverInfo, make_plan, plan_to_dict, replica_standbys
from edgepipe.planner.replan.replicas import placement, refusal, standbys

from tests.helpers.executor_helpers import cluster, write_plan
from tests.helpers.processes import alive
from tests.helpers.recovery_runs import (
    BEAT_S,
    GLOO_TIMEOUT_S,
    HANG_S,
    assert_matches_reference,
    launch_reaped,
    one_device_plan,
    plan_of,
    profile,
)

STEPS = 4


def run(tmp_path: Path, devices: int, faults: str = "", steps: int = STEPS,
        interval: int = 1, **kw):
    plan = one_device_plan(devices, replication_interval=interval)
    path = write_plan(plan, tmp_path)
    return plan, launch_reaped(
        WorkerOptions(str(path), steps, str(tmp_path), deterministic=True,
                      timeout_s=GLOO_TIMEOUT_S, save_weights=True, faults=faults), **kw)


# -- the planner's side: who holds the replica, and who cannot -------------------------
def test_a_one_device_plan_names_its_idle_holder_and_the_standbys_after_it():
    plan = one_device_plan(3)
    assert replica_standbys(plan) == ("d1", "d2")
    (replica,) = plan_to_dict(plan)["replicas"]
    assert (replica["kind"], replica["holders"]) == ("ring", ["d1"])


def test_an_idle_device_too_small_for_the_replica_is_refused_with_one_line():
    plan = one_device_plan(2)
    cm = CostModel(plan.problem, 2)
    need = cm.replica_bytes(0, plan.problem.model.num_blocks)
    # the idle device d1 has exactly one byte too little; d0 runs the stage either way
    budget = {"d0": 8 * 2**30, "d1": need - 1}

    assert standbys(plan.partition, budget, True, cm.replica_bytes) == ()
    (replica,) = placement(plan.partition, budget, True, cm.replica_bytes)
    assert (replica.kind, replica.holders) == ("none", ())
    note = refusal(plan.partition, budget, True, cm.replica_bytes)
    # 45504 B = 44.4375 KiB, 45503 B = 44.4365 KiB: both 44.44 KiB (not 0.000 GiB)
    assert need == 45504
    assert note == (
        "stage 0 (blocks [0, 6)) is not replicated: its weights and optimizer state take "
        "44.44 KiB (45504 bytes) and no idle device can hold them (the largest, d1, "
        "has 44.44 KiB usable, 45503 bytes); losing d0 stops the run")
    # one byte more and d1 holds it; no idle device at all is no refusal
    assert standbys(plan.partition, {**budget, "d1": need}, True, cm.replica_bytes) == ("d1",)
    assert refusal(plan.partition, {"d0": 8 * 2**30}, True, cm.replica_bytes) is None
    # with replication off nothing is refused either
    assert refusal(plan.partition, budget, False, cm.replica_bytes) is None


def test_a_plan_whose_idle_devices_are_all_too_small_says_so_in_its_assumptions():
    plan = one_device_plan(2)
    assert plan.assumptions == ()  # d1 can hold the replica: nothing to say
    need = CostModel(plan.problem, 2).replica_bytes(0, plan.problem.model.num_blocks)
    doc = cluster(2).to_dict()
    doc["device_types"]["tiny"] = {**doc["device_types"]["host-cpu"],
                                   "memory_bytes": need, "usable_fraction": 0.5}
    doc["devices"][1]["type"] = "tiny"
    small = Cluster.from_dict(doc, "test cluster", catalog={})
    problem = make_problem(profile(), small, plan.problem.config, catalog={})
    tight = make_plan(problem, plan.partition, SolverInfo("hand"))
    assert replica_standbys(tight) == ()
    # after the problem's own notes (the tiny type's derived times)
    *problem_notes, note = tight.assumptions
    assert tuple(problem_notes) == problem.assumptions
    assert note.startswith("stage 0 (blocks [0, 6)) is not replicated") and "d1" in note
    assert plan_to_dict(tight)["assumptions"][-1] == note
    assert plan_to_dict(tight)["replicas"][0]["kind"] == "none"


# -- the executor's side ---------------------------------------------------------------
def test_without_a_standby_the_loss_of_the_only_device_fails_in_one_line(tmp_path, capsys):
    # --standbys 0: nobody holds the replica (what the launcher did before standbys); the
    # idle devices run no process, so no re-plan may use them
    path = write_plan(one_device_plan(3), tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path), "--steps", "2", "--standbys", "0",
                 "--deterministic", "--hang-timeout", str(HANG_S), "--heartbeat",
                 str(BEAT_S), "--timeout", str(GLOO_TIMEOUT_S),
                 "--inject", "d0:1:forward"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "device d0 crashed at generation 1; cannot recover: no device that runs a process "
        "is left (d1, d2 run(s) no process)")
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert [r["device"] for r in ranks] == ["d0"]
    assert not any(alive(r["pid"]) for r in ranks)


def test_standbys_asked_of_a_run_that_does_not_recover_are_refused_in_one_line(
    tmp_path, capsys
):
    # --no-recover: nothing would use a standby; refused before any process starts
    path = write_plan(one_device_plan(3), tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path), "--steps", "1", "--no-recover",
                 "--standbys", "2"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --standbys: 2: standby processes hold a one-device plan's replica for "
        "in-process recovery, which this run does not do (--no-recover, no control plane "
        "or replication_interval 0); drop --standbys")
    assert not (tmp_path / "ranks.json").exists()


def test_standbys_asked_of_a_plan_of_several_devices_are_refused_in_one_line(
    tmp_path, capsys
):
    # its stages hold each other's replicas: a standby would hold nothing
    plan = one_device_plan(3)
    blocks = plan.problem.model.num_blocks
    two = Partition(2, 2, (StageAssignment(0, 2, ("d0",), (2,)),
                           StageAssignment(2, blocks, ("d1",), (2,))))
    path = write_plan(make_plan(plan.problem, two, SolverInfo("hand")), tmp_path)
    assert main(["run", str(path), "--out", str(tmp_path), "--steps", "1",
                 "--standbys", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: --standbys: the plan runs 2 devices, which hold each other's replicas (a "
        "data-parallel peer or the next stage); standbys serve a plan of one stage on one "
        "device; omit --standbys")
    assert not (tmp_path / "ranks.json").exists()


@pytest.mark.slow
def test_a_one_device_run_without_failure_replicates_to_its_standby(tmp_path):
    plan, result = run(tmp_path, 3)
    assert result.events == []
    assert_matches_reference(tmp_path, plan, result, STEPS)
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert [(r["device"], r["rank"], r.get("role")) for r in ranks] == [
        ("d0", 0, None), ("d1", None, "standby"), ("d2", None, "standby")]


def test_sigkill_of_the_only_device_recovers_from_the_standby_bit_identically(tmp_path):
    plan, result = run(tmp_path, 3, "d0:2:forward")
    assert_matches_reference(tmp_path, plan, result, STEPS)
    (event,) = result.events
    assert (event["cause"], event["device"], event["replay_from_step"]) == ("crash", "d0", 2)
    new = plan_of(tmp_path, event)
    assert "d0" not in new.partition.used_devices()
    # every block of the new plan comes from d1, the holder of the replica
    assert {t.source for t in new.migration} == {"d1"}
    assert all(t.from_replica for t in new.migration)
    assert [m["generation"] for m in result.metrics] == [1, 1, 2, 2]
    assert "warning" not in event


@pytest.mark.parametrize(("signal", "cause"), [
    ("KILL", "crash"), pytest.param("STOP", "hang", marks=pytest.mark.slow)])
def test_the_device_lost_during_its_background_send_replays_from_the_point_before(
    tmp_path, signal, cause
):
    # d0 is SIGKILLed, or SIGSTOPped (declared hung, fenced, killed), in the background
    # thread of point 2 (the state after step 1): its sends posted, nothing acknowledged,
    # while its training thread computes step 2; point 2 is not durable, so the run
    # replays from point 1, which d1 holds
    plan, result = run(tmp_path, 3, f"d0:1:replication:{signal}")
    assert_matches_reference(tmp_path, plan, result, STEPS)
    (event,) = result.events
    assert (event["cause"], event["device"], event["replay_from_step"]) == (cause, "d0", 1)
    assert {t.source for t in plan_of(tmp_path, event).migration} == {"d1"}
    assert [m["generation"] for m in result.metrics] == [1, 2, 2, 2]


@pytest.mark.slow
def test_with_replication_every_second_step_the_holder_serves_its_older_state(tmp_path):
    # interval 2: the holder gets the states with 0, 2 and 4 steps applied (and the last);
    # d0 dies after the commit of step 3 (which waits for point 2: its successor 4 is the
    # state that commit makes), before its optimizer step, so the run replays steps 2 and
    # 3 from the state with 2 applied whatever the transfer's timing (a fault in step 3's
    # forward raced point 2, which travels beside steps 2 and 3: review 7, F1)
    plan, result = run(tmp_path, 3, "d0:3:optimizer", steps=5, interval=2)
    assert_matches_reference(tmp_path, plan, result, 5)
    (event,) = result.events
    assert (event["device"], event["replay_from_step"]) == ("d0", 2)
    assert {t.source for t in plan_of(tmp_path, event).migration} == {"d1"}


@pytest.mark.slow
def test_sigkill_of_the_holder_moves_the_replica_to_the_next_standby(tmp_path):
    # d1 is killed with the replica of the state after step 2 received, not acknowledged:
    # that state is not durable, the run replays step 2 with d2 as the holder; then d0
    # dies, and only d2 has its state
    plan, result = run(tmp_path, 3, "d1:1:replication,d0:3:forward")
    assert_matches_reference(tmp_path, plan, result, STEPS)
    first, second = result.events
    assert (first["device"], first["replay_from_step"]) == ("d1", 1)
    after_holder = plan_of(tmp_path, first)
    assert after_holder.partition == plan.partition  # d0 serves on, nothing moves
    (replica,) = plan_to_dict(after_holder)["replicas"]
    assert replica["holders"] == ["d2"]
    assert (second["device"], second["replay_from_step"]) == ("d0", 3)
    last = plan_of(tmp_path, second)
    assert last.partition.used_devices() == ["d2"]
    assert {t.source for t in last.migration} == {"d2"}
    # d2 now serves alone: nothing is left to hold its replica
    assert "unreplicated" in second["warning"]


@pytest.mark.slow
def test_the_holder_lost_with_no_standby_left_goes_on_unreplicated_with_a_warning(tmp_path):
    plan, result = run(tmp_path, 2, "d1:1:replication")
    assert_matches_reference(tmp_path, plan, result, STEPS)
    (event,) = result.events
    assert event["device"] == "d1"
    assert event["warning"] == (
        "the run goes on unreplicated: no device left can hold the replica of stage 0 "
        "(blocks [0, 6)) on d0; losing it now stops the run")


@pytest.mark.slow
def test_a_sigstopped_holder_is_declared_hung_and_replaced_by_the_next_standby(tmp_path):
    plan, result = run(tmp_path, 3, "d1:1:replication:STOP")
    assert_matches_reference(tmp_path, plan, result, STEPS)
    (event,) = result.events
    assert (event["cause"], event["device"], event["replay_from_step"]) == ("hang", "d1", 1)
    (replica,) = plan_to_dict(plan_of(tmp_path, event))["replicas"]
    assert replica["holders"] == ["d2"]


def test_the_report_reads_a_recovery_warning():
    line = {k: 0 for k in RECOVERY_KEYS} | {
        "cause": "crash", "device": "d1", "old_plan": "a", "new_plan": "b",
        "warning": "the run goes on unreplicated"}
    assert RecoveryEvent.from_line(line, "metrics.jsonl").warning == (
        "the run goes on unreplicated")
    assert RecoveryEvent.from_line({**line, "warning": None}, "m").warning is None
    del line["warning"]  # lines written before warnings, and runs without one
    assert RecoveryEvent.from_line(line, "metrics.jsonl").warning is None


def test_a_standby_is_started_only_for_a_recovering_run(tmp_path):
    plan = one_device_plan(2)
    path = write_plan(plan, tmp_path)
    launch_reaped(WorkerOptions(str(path), 1, str(tmp_path), deterministic=True,
                                timeout_s=GLOO_TIMEOUT_S), recover=False)
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert [r["device"] for r in ranks] == ["d0"]
