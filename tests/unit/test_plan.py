"""Plan JSON (planner.plan): round trip, self-containment, mismatch errors."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from edgepipe.planner import api
from edgepipe.planner.errors import (
    InfeasibleError,
    InputError,
    PlanMismatchError,
    SchemaVersionError,
)
from edgepipe.planner.inputs.cluster import Cluster, load_catalog
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.schema import validate
from edgepipe.planner.plan import (
    SolverInfo,
    load_plan,
    make_plan,
    plan_from_dict,
    plan_to_dict,
    save_plan,
)
from edgepipe.planner.solvers.dp.driver import plan_dp

from tests.helpers.synthetic import random_problem


@pytest.fixture(scope="module")
def plan():
    problem = random_problem(
        8, 4, seed=1, global_batch=16, candidates=(2, 4, 8), bandwidth_mbps=1e4
    )
    result = plan_dp(problem)
    return make_plan(
        problem, result.partition, SolverInfo("dp", solve_time_s=0.1), cost=result.cost
    )


def test_plan_document_validates_and_round_trips(plan, tmp_path):
    doc = plan_to_dict(plan)
    validate(doc, "edgepipe.plan", "test")
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    again = load_plan(path)
    assert again.partition == plan.partition
    assert again.problem.model == plan.problem.model
    assert again.problem.config == plan.problem.config
    assert again.cost.iteration_ms == plan.cost.iteration_ms
    assert plan_to_dict(again) == doc


def test_plan_id_depends_on_the_content_only(plan):
    same = make_plan(plan.problem, plan.partition, SolverInfo("other", solve_time_s=9.0))
    assert same.id == plan.id and same.id.startswith("plan-")
    first, second = plan.partition.stages[:2]
    moved = replace(
        plan.partition,
        stages=(
            replace(first, end=first.end - 1),
            replace(second, first=second.first - 1),
            *plan.partition.stages[2:],
        ),
    )
    assert make_plan(plan.problem, moved, SolverInfo("dp")).id != plan.id


def test_each_device_memory_in_the_document_is_eq_3_worked_from_the_profile(plan):
    doc = plan_to_dict(plan)
    blocks = plan.problem.model.blocks
    state = 2 + 1  # weights, gradients and one momentum buffer per parameter byte
    for stage in doc["stages"]:
        first, end = stage["layers"]
        weights = sum(b.param_bytes for b in blocks[first:end])
        saved = sum(b.saved_bytes_per_sample for b in blocks[first:end])
        for d in stage["devices"]:
            expected = state * weights + stage["warmup"] * d["samples"] * saved
            assert d["memory_bytes"] == pytest.approx(expected, rel=1e-12)
            assert d["memory_bytes"] <= d["memory_limit_bytes"]


def mutate(plan, change):
    doc = copy.deepcopy(plan_to_dict(plan))
    change(doc)
    return doc


def test_plan_for_another_model_is_rejected(plan):
    def drop_block(doc):
        doc["inputs"]["model"]["blocks"].pop()
        for t in doc["inputs"]["model"]["timings"].values():
            t["forward_ms"].pop()
            t["backward_ms"].pop()

    with pytest.raises(PlanMismatchError, match="blocks"):
        plan_from_dict(mutate(plan, drop_block))


def test_unknown_device_is_rejected(plan):
    def rename(doc):
        doc["stages"][0]["devices"][0]["id"] = "ghost"

    with pytest.raises(PlanMismatchError, match="ghost"):
        plan_from_dict(mutate(plan, rename))


def test_samples_must_sum_to_the_micro_batch(plan):
    def bump(doc):
        doc["stages"][0]["devices"][0]["samples"] += 1

    with pytest.raises(PlanMismatchError, match="samples per micro-batch"):
        plan_from_dict(mutate(plan, bump))


def test_micro_batches_must_make_the_global_batch(plan):
    def more(doc):
        doc["num_micro_batches"] += 1

    with pytest.raises(PlanMismatchError, match="global batch"):
        plan_from_dict(mutate(plan, more))


def test_newer_schema_version_names_the_fix(plan):
    def newer(doc):
        doc["schema_version"] = 2

    with pytest.raises(SchemaVersionError, match="schema version 2 is not supported"):
        plan_from_dict(mutate(plan, newer))


def test_malformed_plan_file_is_an_input_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 1, "kind": "edgepipe.plan",')
    with pytest.raises(InputError, match="not valid JSON"):
        load_plan(path)


def test_wrong_document_kind_is_named(plan, tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(plan.problem.model.to_dict()))
    with pytest.raises(InputError, match=r"edgepipe\.model_profile"):
        load_plan(path)


@pytest.mark.parametrize("cluster", api.shipped("clusters"))
@pytest.mark.parametrize("model", api.shipped("models"))
def test_every_shipped_pair_plans_within_memory_and_round_trips(model, cluster, tmp_path):
    timed = set(ModelProfile.load(api.resolve(model, "models")).timings)
    cluster_types = {d.type for d in Cluster.load(api.resolve(cluster, "clusters")).devices}
    if not timed & (set(load_catalog()) | cluster_types):
        # timed only on a type without a spec (e.g. this host's CPU): nothing to derive from
        with pytest.raises(InputError, match="derived"):
            api.load_problem(model, cluster, global_batch=16)
        return
    problem = api.load_problem(model, cluster, global_batch=16)
    try:
        plan = api.solve(problem)
    except InfeasibleError as exc:
        assert exc.constraint == "memory" and "short by" in str(exc)
        return
    assert plan.cost.memory_ok
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    again = load_plan(path)
    assert plan_to_dict(again) == plan_to_dict(plan)


# -- edited plans: every guarantee of `edgepipe plan` is re-checked on load ---------------
def test_edited_plan_that_overflows_a_device_is_refused_naming_device_need_and_limit(plan):
    def shrink(doc):
        dev = doc["stages"][0]["devices"][0]["id"]
        entry = next(d for d in doc["inputs"]["cluster"]["devices"] if d["id"] == dev)
        entry["memory_bytes"] = 1000

    doc = mutate(plan, shrink)
    dev = doc["stages"][0]["devices"][0]["id"]
    with pytest.raises(PlanMismatchError) as caught:
        plan_from_dict(doc, "edited.json")
    need = doc["stages"][0]["devices"][0]["memory_bytes"]
    limit = 1000 * plan.problem.cluster.type_of(plan.problem.cluster.index(dev)).usable_fraction
    message = str(caught.value)
    assert message.startswith(f"edited.json: device {dev!r} (stage 0) needs ")
    assert f"({need:.0f} > {limit:.0f} bytes)" in message


def test_edited_decision_is_refused_as_an_id_mismatch_unless_rehashed(plan):
    def move_cut(doc):
        doc["stages"][0]["layers"][1] -= 1
        doc["stages"][1]["layers"][0] -= 1

    doc = mutate(plan, move_cut)
    with pytest.raises(PlanMismatchError) as caught:
        plan_from_dict(doc, "edited.json")
    assert str(caught.value) == (
        f"edited.json: the plan's id {plan.id!r} is not the hash of its content "
        f"({make_plan(plan.problem, plan_from_dict(doc, rehash=True).partition, plan.solver).id})"
        ": the file was edited after planning. Re-plan, or accept the edit with "
        "`edgepipe validate --rehash edited.json`"
    )
    again = plan_from_dict(doc, rehash=True)
    assert again.id != plan.id and again.partition.stages[0].end == plan.partition.stages[0].end - 1


def test_edited_id_is_refused(plan):
    def rename(doc):
        doc["id"] = "plan-0123456789abcdef"

    with pytest.raises(PlanMismatchError, match="'plan-0123456789abcdef' is not the hash"):
        plan_from_dict(mutate(plan, rename))


def test_validate_rehash_re_identifies_an_edited_plan_file(plan, tmp_path, capsys):
    from edgepipe.planner.cli.main import main

    def move_cut(doc):
        doc["stages"][0]["layers"][1] -= 1
        doc["stages"][1]["layers"][0] -= 1

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(mutate(plan, move_cut)))
    assert main(["validate", str(path)]) == 2
    assert "--rehash" in capsys.readouterr().err
    assert main(["validate", "--rehash", str(path)]) == 0
    assert "re-identified" in capsys.readouterr().out
    assert main(["show", str(path)]) == 0
    assert load_plan(path).id != plan.id


def test_a_plan_built_in_python_with_integer_sizes_loads_back_under_its_id(plan, tmp_path):
    # JSON writes 3 for an int time and loading gives the float 3.0: the id hashes the
    # values, not how Python happened to hold them
    model = plan.problem.model

    def whole(rows: tuple[tuple[float, ...], ...]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(max(1, round(t)) for t in row) for row in rows)

    timings = {
        name: replace(t, forward_ms=whole(t.forward_ms), backward_ms=whole(t.backward_ms))
        for name, t in model.timings.items()
    }
    cluster = plan.problem.cluster
    problem = make_problem(
        replace(model, timings=timings), cluster, plan.problem.config, catalog=cluster.device_types
    )
    built = make_plan(problem, plan.partition, SolverInfo("dp"))
    save_plan(built, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").id == built.id
