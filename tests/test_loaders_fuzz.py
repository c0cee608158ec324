"""Hostile input to every loader raises only edgepipe's typed errors."""

from __future__ import annotations

import contextlib
import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cluster import Cluster, catalog_from_dict
from planner.config import TrainingConfig
from planner.dp import plan_dp
from planner.errors import EdgepipeError
from planner.plan import SolverInfo, make_plan, plan_from_dict, plan_to_dict
from planner.profile import ModelProfile
from planner.schema import parse_json
from planner.synthetic import random_problem

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


def load_or_typed_error(kind, doc):
    with contextlib.suppress(EdgepipeError):
        LOADERS[kind](doc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(LOADERS)), st.data(), json_values)
def test_replacing_any_value_raises_only_typed_errors(kind, data, value):
    doc = VALID[kind]
    path = data.draw(st.sampled_from(list(paths(doc))))
    load_or_typed_error(kind, replaced(doc, path, value))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(LOADERS)), st.data())
def test_deleting_any_key_raises_only_typed_errors(kind, data):
    doc = VALID[kind]
    options = [p for p in paths(doc) if p]
    path = data.draw(st.sampled_from(options))
    load_or_typed_error(kind, deleted(doc, path))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(LOADERS)), json_values)
def test_arbitrary_json_raises_only_typed_errors(kind, value):
    load_or_typed_error(kind, value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_arbitrary_bytes_parse_or_raise_typed_errors(raw):
    with contextlib.suppress(EdgepipeError):
        parse_json(raw, "fuzz")


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
        LOADERS[kind](json.loads(json.dumps(doc)))
