"""Hostile input to every loader raises only edgepipe's typed errors."""

from __future__ import annotations

import copy
import json

import pytest
from edgepipe.planner import api
from edgepipe.planner.errors import EdgepipeError, InputError
from edgepipe.planner.inputs.cluster import Cluster, catalog_from_dict
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.schema import parse_json
from edgepipe.planner.plan import SolverInfo, make_plan, plan_from_dict, plan_to_dict
from edgepipe.planner.solvers.dp.driver import plan_dp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.synthetic import random_problem

PROBLEM = random_problem(4, 3, seed=2, global_batch=8, candidates=(2, 4), bandwidth_mbps=1e4)
_RESULT = plan_dp(PROBLEM)
PLAN_DOC = plan_to_dict(make_plan(PROBLEM, _RESULT.partition, SolverInfo("dp"), cost=_RESULT.cost))
VALID = {
    "model": PLAN_DOC["inputs"]["model"],
    "cluster": PLAN_DOC["inputs"]["cluster"],
    "config": PLAN_DOC["inputs"]["config"],
    "plan": PLAN_DOC,
    "catalog": {
        "schema_version": 1,
        "kind": "edgepipe.device_catalog",
        "device_types": PLAN_DOC["inputs"]["cluster"]["device_types"],
    },
}
LOADERS = {
    "model": lambda d: ModelProfile.from_dict(d, "fuzz"),
    "cluster": lambda d: Cluster.from_dict(d, "fuzz", catalog={}),
    "config": lambda d: TrainingConfig.from_dict(d, "fuzz"),
    "plan": lambda d: plan_from_dict(d, "fuzz"),
    "catalog": lambda d: catalog_from_dict(d, "fuzz"),
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def paths(doc, prefix=()):
    """Every path to a value inside ``doc``."""
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from paths(v, (*prefix, i))


def replaced(doc, path, value):
    out = copy.deepcopy(doc)
    if not path:
        return value
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


def deleted(doc, path):
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return out


def loads(kind, doc) -> bool:
    """True if the loader accepts ``doc``, False on a typed error; anything else raises."""
    try:
        LOADERS[kind](doc)
    except EdgepipeError:
        return False
    return True


def json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


#: keys a document may lack: defaulted (config fields, shared_medium), one of several
#: entries (a device, a timed type, a catalog type), or recomputed on load (a plan's
#: predicted figures, idle devices and assumptions); "#" stands for any list index
OPTIONAL = {
    "catalog": {("device_types", "fast"), ("device_types", "slow")},
    "cluster": {("devices", "#"), ("network", "shared_medium")},
    "config": {("micro_batch_candidates",), ("micro_batch_candidates", "#"), ("optimizer",),
               ("schedule",), ("warmup",), ("replication_interval",),
               # a plan's config says its interval came from auto (the fuzzed one does)
               ("replication_interval_auto",)},
    "model": {("timings", "fast"), ("timings", "slow")},
    "plan": {("assumptions",), ("idle_devices", "#"), ("inputs", "config", "optimizer"),
             # the interval the plan resolved to is 1: a plan without it means 1
             ("inputs", "config", "replication_interval"),
             ("inputs", "config", "schedule"), ("inputs", "config", "warmup"),
             ("prediction", "dominant_step"), ("prediction", "peak_memory_fraction"),
             # plans written before the steady-state step lack it (computed on load)
             ("prediction", "steady_ms"),
             *{("stages", "#", k) for k in ("allreduce_ms", "backward_ms", "forward_ms",
                                            "link_out_ms", "warmup")},
             *{("stages", "#", "devices", "#", k) for k in ("backward_ms", "forward_ms",
                                                            "memory_bytes",
                                                            "memory_limit_bytes",
                                                            "replica_bytes")},
             # replica placement is recomputed on load, like the predictions
             ("replicas",), ("replicas", "#"), ("replicas", "#", "holders", "#")},
}  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(LOADERS)), st.data(), json_values)
def test_a_value_of_another_json_type_is_refused_with_a_typed_error(kind, data, value):
    doc = VALID[kind]
    path = data.draw(st.sampled_from(list(paths(doc))))
    accepted = loads(kind, replaced(doc, path, value))
    # garbage of another type is never silently taken (a plan's parent_id may be null)
    if accepted and not (path == ("parent_id",) and json_type(value) in ("null", "string")):
        assert json_type(value) == json_type(at(doc, path)), (path, value)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(LOADERS)), st.data())
def test_deleting_a_required_key_is_refused_with_a_typed_error(kind, data):
    doc = VALID[kind]
    options = [p for p in paths(doc) if p]
    path = data.draw(st.sampled_from(options))
    pattern = tuple("#" if isinstance(k, int) else k for k in path)
    assert loads(kind, deleted(doc, path)) == (pattern in OPTIONAL[kind]), path


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(LOADERS)), json_values)
def test_arbitrary_json_is_refused_with_a_typed_error(kind, value):
    assert not loads(kind, value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_bytes_parse_to_what_json_reads_or_raise_typed_errors(raw):
    try:
        value = parse_json(raw, "fuzz")
    except EdgepipeError as exc:
        assert str(exc).startswith("fuzz")
    else:
        assert value == json.loads(raw)


def test_deep_nesting_and_huge_numbers_are_typed_errors():
    for raw in ("[" * 100_000 + "]" * 100_000, '{"a": 1e999}', "NaN", '{"x": Infinity}'):
        try:
            parse_json(raw, "fuzz")
        except EdgepipeError as exc:
            assert "fuzz" in str(exc)
        else:
            raise AssertionError(f"accepted {raw[:20]!r}")


def test_valid_documents_load():
    for kind, doc in VALID.items():
        assert loads(kind, json.loads(json.dumps(doc))), kind


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"global_batch": 2.5}, "global_batch"),
        ({"global_batch": True}, "global_batch"),
        ({"global_batch": 8, "micro_batch_candidates": (2.0,)}, "micro_batch_candidates"),
        ({"global_batch": 8, "max_stages": 1.5}, "max_stages"),
    ],
)
def test_api_config_refuses_non_integer_counts_with_a_typed_error(kwargs, field):
    with pytest.raises(InputError, match=rf"\$\.{field}: must be a whole number"):
        TrainingConfig(**kwargs)


HUGE = ("x" * 100_000, list(range(20_000)), {"k" * 50_000: 1})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(LOADERS)), st.data(), st.sampled_from(HUGE))
def test_a_huge_value_anywhere_is_quoted_in_at_most_a_short_excerpt(kind, data, value):
    doc = VALID[kind]
    path = data.draw(st.sampled_from(list(paths(doc))))
    try:
        LOADERS[kind](replaced(doc, path, value))
    except EdgepipeError as exc:
        assert len(str(exc)) < 600, str(exc)[:200]


API_PROBLEM = api.load_problem("pipedream-alexnet", "orin-pair-2", global_batch=8)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: api.load_problem("pipedream-alexnet", "orin-pair-2", global_batch=2.5),
         "global_batch: must be a whole number"),
        (lambda: api.load_problem(123, "orin-pair-2"), "expected a shipped name or a path"),
        (lambda: api.load_problem("pipedream-alexnet", "orin-pair-2", {"global_batch": 8}),
         "expected a config file, a TrainingConfig or None"),
        (lambda: api.solve(API_PROBLEM, "milp", time_limit="x"), "expected seconds"),
        (lambda: api.solve(API_PROBLEM, "milp", time_limit=-1.0), "positive seconds"),
        (lambda: api.solve(API_PROBLEM, "milp", backend="gurobi"), "unknown backend"),
        (lambda: api.solve(API_PROBLEM, "annealing"), "unknown solver"),
        (lambda: api.compare(API_PROBLEM, "dp"), "expected a list of planner names"),
    ],
    ids=["float-batch", "model-int", "config-dict", "time-limit-str", "time-limit-negative",
         "backend", "solver", "planners-str"],
)  # fmt: skip
def test_api_mistakes_raise_typed_errors(call, message):
    with pytest.raises(InputError, match=message):
        call()
