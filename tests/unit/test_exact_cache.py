"""The exact-result cache's instance key (benchmarks/exact_cache.py): an entry stays
valid while the instance is the same, and only then."""

import dataclasses
import hashlib
import json

from edgepipe.planner.inputs.problem import make_problem

from benchmarks.exact_cache import instance_hash
from tests.helpers.synthetic import random_problem


def with_timing(problem, **changes):
    model = problem.model
    timings = {k: dataclasses.replace(t, **changes) for k, t in model.timings.items()}
    return make_problem(
        dataclasses.replace(model, timings=timings), problem.cluster, problem.config
    )


def hash_of_doc_without_valid_range(problem) -> str:
    """The key as it was computed before ``Timing.valid_batch_range`` existed and
    before ``replication_interval`` could be ``"auto"``: the same documents, the
    timings without that key, the interval the integer 1 of the old default."""
    model = dataclasses.asdict(problem.model)
    for timing in model["timings"].values():
        del timing["valid_batch_range"]
    config = dataclasses.asdict(problem.config)
    config["replication_interval"] = 1
    doc = {
        "model": model,
        "cluster": dataclasses.asdict(problem.cluster),
        "config": config,
    }
    text = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_an_unset_later_field_keeps_the_key_entries_were_cached_under():
    problem = random_problem(4, 2, seed=3)
    assert all(t.valid_batch_range is None for t in problem.model.timings.values())
    assert instance_hash(problem) == hash_of_doc_without_valid_range(problem)


def test_a_set_valid_batch_range_is_another_instance():
    problem = random_problem(4, 2, seed=3)
    assert instance_hash(with_timing(problem, valid_batch_range=(1, 8))) != instance_hash(problem)
    assert instance_hash(with_timing(problem, valid_batch_range=(1, 8))) != instance_hash(
        with_timing(problem, valid_batch_range=(1, 16))
    )


def test_changed_times_are_another_instance():
    problem = random_problem(4, 2, seed=3)
    timing = next(iter(problem.model.timings.values()))
    slower = tuple(tuple(2 * x for x in row) for row in timing.forward_ms)
    assert instance_hash(with_timing(problem, forward_ms=slower)) != instance_hash(problem)


def with_interval(problem, interval):
    config = dataclasses.replace(problem.config, replication_interval=interval)
    return make_problem(problem.model, problem.cluster, config)


def test_every_replicating_interval_is_the_instance_cached_under_interval_1():
    problem = random_problem(4, 2, seed=3)
    assert problem.config.replication_interval == "auto"
    keys = {instance_hash(with_interval(problem, k)) for k in ("auto", 1, 7)}
    assert keys == {hash_of_doc_without_valid_range(problem)}


def test_replication_off_is_another_instance():
    problem = random_problem(4, 2, seed=3)
    assert instance_hash(with_interval(problem, 0)) != instance_hash(problem)
