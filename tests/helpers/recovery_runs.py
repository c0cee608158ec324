"""Recovering runs of the toy GPT-2 that the recovery tests share (issue 8): the model and
its profiles, the hand-made plans (three stages; one device with idle standbys), the
launch that reaps every child, and the checks against the single-process reference
trainer (``tests/helpers/reference_trainer.py``, which shares no code with the
executor's recovery): losses, samples, final weights and optimizer state ``torch.equal``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

from edgepipe.executor.core import data
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.executor.profiling import zoo
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import BuildSpec, Timing
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import SolverInfo, load_plan, make_plan

from tests.helpers import reference_trainer as ref
from tests.helpers.executor_helpers import (
    assert_saved_state_equals,
    cluster,
    make_test_plan,
    profile_of,
    write_plan,
)
from tests.helpers.processes import alive, with_timeout_reap

STEPS = 4
#: a hang timeout well above the heartbeat stalls of a loaded two-core machine (a 2 s
#: timeout once declared a starved but live device hung there; the run still recovered)
HANG_S, BEAT_S = 5.0, 0.1
GLOO_TIMEOUT_S = 20.0
#: d0 [0,2) | d1 [2,4) | d2,d3 [4,6), one sample each of d2 and d3
THREE_STAGES = [(0, 2, [2]), (2, 4, [2]), (4, 6, [1, 1])]
#: the GPT-2-shaped toy model every recovery test trains: 6 blocks (embedding, 4 layers,
#: head), small enough for four processes on two cores
GPT2 = BuildSpec(
    zoo="gpt2-small",
    sizes={"layers": 4, "hidden": 8, "heads": 2, "vocab": 16, "max_positions": 4, "seq_len": 3},
    seed=3,
)
#: per-block forward ms of one sample (backward twice that): blocks 2, 3 (d1's stage)
#: are the bottleneck, so a joining device has something to take on
BLOCK_MS = (1.0, 1.0, 3.0, 3.0, 1.0, 1.0)

_PROFILE: list = []


def profile():
    """:data:`GPT2`'s profile on this machine, measured once per process."""
    if not _PROFILE:
        _PROFILE.append(profile_of(
            GPT2, lambda b: zoo.example_input(GPT2.zoo, b, **GPT2.sizes), name=GPT2.zoo))
    return _PROFILE[0]


def fixed_profile():
    """:func:`profile` with fixed times instead of measured ones, so that a re-plan (of a
    join, of a loss) does not depend on this machine's noise."""
    timing = Timing((1, 2), tuple((t, 2 * t) for t in BLOCK_MS),
                    tuple((2 * t, 4 * t) for t in BLOCK_MS), source="derived")
    return replace(profile(), timings={"host-cpu": timing})


_REFERENCE: dict = {}


def reference(plan, steps: int):
    """The reference trainer's ``steps`` of :data:`GPT2` under ``plan``'s optimizer,
    batch and data seed (computed once per process for each)."""
    config = plan.problem.config
    key = (config.optimizer, config.global_batch, steps)
    if key not in _REFERENCE:
        settings = config.optimizer_settings()
        _REFERENCE[key] = ref.train(
            ref.ModelSpec(GPT2.zoo, GPT2.sizes, GPT2.seed), data.synthetic(GPT2, config.seed),
            config.global_batch, steps,
            ref.OptimizerSpec(config.optimizer, lr=settings["lr"],
                              momentum=settings.get("momentum", 0.9),
                              betas=settings.get("betas", (0.9, 0.999)),
                              eps=settings.get("eps", 1e-8)),
            data_seed=config.seed,
        )
    return _REFERENCE[key]


def one_device_plan(devices: int, memory_bytes: float = 8 * 2**30, model_profile=None,
                    network: dict | None = None, **config_fields):
    """The toy model on ``d0`` alone, in a cluster of ``devices`` identical devices
    (2 micro-batches of 2, Adam, lr 0.01: the settings of :func:`run`;
    ``model_profile``: its profile, default :func:`profile`;
    ``network``: fields that replace the cluster's network ones;
    ``config_fields``: other training-config fields; replicated every step unless they
    say otherwise, as :func:`tests.helpers.executor_helpers.make_test_plan`)."""
    config = TrainingConfig(global_batch=4, micro_batch_candidates=(2,), optimizer="adam",
                            learning_rate=0.01, **{"replication_interval": 1, **config_fields})
    devices_of = cluster(devices, memory_bytes)
    if network:
        doc = devices_of.to_dict()
        doc["network"] = {**doc["network"], **network}
        devices_of = Cluster.from_dict(doc, "test cluster", catalog={})
    problem = make_problem(model_profile or profile(), devices_of, config, catalog={})
    blocks = problem.model.num_blocks
    partition = Partition(2, 2, (StageAssignment(0, blocks, ("d0",), (2,)),))
    return make_plan(problem, partition, SolverInfo("hand"))


def plan_of(out: Path, event: dict):
    """The plan a recovery ``event`` of the run in ``out`` switched to (``out/plans``)."""
    return load_plan(out / "plans" / f"{event['new_plan']}.json")


def run(tmp_path: Path, stages, faults: str = "", steps: int = STEPS, joins=(),
        model_profile=None, join_timeout_s: float | None = None, **cfg):
    """Run a 2-micro-batch plan of ``stages`` (of ``model_profile``, default
    :func:`profile`) with ``faults`` (and ``joins``: :class:`executor.ft.joins.EmulatedJoin`,
    ``join_timeout_s``: :func:`executor.launch.launch`'s); reap every child."""
    plan = make_test_plan(model_profile or profile(), stages, 2, 2,
                          optimizer=cfg.pop("optimizer", "adam"), learning_rate=0.01, **cfg)
    path = write_plan(plan, tmp_path)
    return plan, launch_reaped(
        WorkerOptions(str(path), steps, str(tmp_path), deterministic=True,
                      timeout_s=GLOO_TIMEOUT_S, save_weights=True, faults=faults),
        joins=joins, join_timeout_s=join_timeout_s)


def launch_reaped(options: WorkerOptions, **kw):
    """:func:`executor.launch.launch` ``options`` (``kw``: its other arguments) with the
    tests' hang timeout and heartbeat; SIGKILL and reap every child it started, also
    when the launch raises."""
    pids: list[int] = []
    try:
        return launch(options, on_start=lambda ranks: pids.extend(r["pid"] for r in ranks),
                      hang_timeout_s=HANG_S, heartbeat_s=BEAT_S, **kw)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:
            with_timeout_reap(pid)


def assert_matches_reference(tmp_path: Path, plan, result, steps: int = STEPS) -> None:
    """``result`` (of a run of ``plan`` in ``tmp_path``) ran steps 0, 1, ... once each,
    with the reference's losses and samples, and ended in its state under the plan of
    its last recovery event (or ``plan``)."""
    want = reference(plan, steps)
    assert [m["step"] for m in result.metrics] == list(range(steps))
    assert result.losses == want.losses
    assert [m["samples"] for m in result.metrics] == want.sample_ids
    assert_final_state_is_the_references(tmp_path, want)
    final = {e["new_plan"] for e in result.events[-1:]} or {plan.id}
    assert result.metrics[-1]["plan_id"] in final


def assert_final_state_is_the_references(out: Path, want) -> None:
    """Every rank's saved weights and optimizer state (``out/weights``) equal the
    reference's, and together they cover every parameter of :data:`GPT2`."""
    assert_saved_state_equals(out, GPT2, want)
