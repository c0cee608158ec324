"""edgepipe export (planner/export.py): a hand-made plan in torchtitan's and DeepSpeed's
terms, exactly, and the plans they cannot express refused in one line."""

from __future__ import annotations

import pytest
from edgepipe.planner.cli.main import main
from edgepipe.planner.errors import PlanMismatchError
from edgepipe.planner.export import SPLIT_BUILDER, export
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import Block, BuildSpec, ModelProfile, Timing
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan, save_plan

#: a GPT split at layers.0, layers.1 and head; its first block runs two modules
BUILD = BuildSpec(
    callable=SPLIT_BUILDER,
    kwargs={
        "factory": "mygpt:factory",
        "split": ["layers.0", "layers.1", "head"],
        "seed": 0,
        "modules": [["embed", "pos"], ["layers.0"], ["layers.1"], ["head"]],
    },
)
NAMES = ("embed", "layers_0", "layers_1", "head")
DEVICE_TYPE = {
    "description": "test", "memory_bytes": 2**30, "usable_fraction": 0.9,
    "peak_fp32_gflops": 100, "efficiency": 0.5,
    "network": {"interface": "ethernet", "bandwidth_mbps": 1000}, "sources": {"all": "test"},
}


def hand_plan(
    stages: list[tuple[int, int, tuple[int, ...]]], *, build: BuildSpec | None = BUILD,
    schedule: str = "1f1b", micro_batch: int = 4, micro_batches: int = 3,
) -> Plan:
    """Blocks of 1 kB, 1 ms forward at batch 1; devices d0, d1, ... in stage order."""
    profile = ModelProfile(
        "mygpt", {"kind": "analytic"}, 64.0,
        tuple(Block(n, 1000.0, 100.0, 100.0) for n in NAMES),
        {"t": Timing((1,), ((1.0,),) * 4, ((2.0,),) * 4)}, build,
    )
    n = sum(len(s[2]) for s in stages)
    cluster = Cluster.from_dict({
        "schema_version": 1, "kind": "edgepipe.cluster", "name": "four",
        "device_types": {"t": DEVICE_TYPE},
        "devices": [{"id": f"d{i}", "type": "t"} for i in range(n)],
        "network": {"bandwidth_mbps": 1000, "latency_ms": 0.1},
    }, "test cluster", catalog={})
    config = TrainingConfig(global_batch=micro_batch * micro_batches,
                            micro_batch_candidates=(micro_batch,), schedule=schedule)
    problem = make_problem(profile, cluster, config, catalog={})
    assigned, dev = [], 0
    for first, end, samples in stages:
        ids = tuple(f"d{dev + k}" for k in range(len(samples)))
        dev += len(samples)
        assigned.append(StageAssignment(first, end, ids, samples))
    return make_plan(problem, Partition(micro_batch, micro_batches, tuple(assigned)),
                     SolverInfo("hand"))


#: two stages (blocks 0-1, 2-3) of two devices taking 2 + 2 of every 4-sample micro-batch
EVEN = [(0, 2, (2, 2)), (2, 4, (2, 2))]


def test_torchtitan_gets_split_points_parts_schedule_and_batches():
    plan = hand_plan(EVEN)
    # stage 1 starts at block 2 (layers_1), whose module is layers.1; per device
    # 3 micro-batches of 2 samples: local batch 6, global 12 = 2 replicas x 6
    assert export(plan, "torchtitan") == f"""\
# torchtitan: plan {plan.id} (mygpt on four)
# 2 stages of 2 devices each; per device 3 micro-batches of 2 samples, schedule 1F1B
# ranks (pipeline outermost): 0 d0, 1 d1, 2 d2, 3 d3

# TOML job config (torchtitan/config/job_config.py, until 2026-02)
[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_split_points = ["layers.1"]
pipeline_parallel_schedule = "1F1B"
pipeline_parallel_microbatch_size = 2
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 1

[training]
local_batch_size = 6
global_batch_size = 12

# Python config (torchtitan/config/configs.py, ParallelismConfig)
config.parallelism.pipeline_parallel_degree = 2
config.parallelism.module_fqns_per_model_part = [
    ["embed", "pos", "layers.0"],
    ["layers.1", "head"],
]
config.parallelism.pipeline_parallel_schedule = "1F1B"
config.parallelism.num_pp_microbatches = 3
config.parallelism.data_parallel_replicate_degree = 2
config.parallelism.data_parallel_shard_degree = 1
# training.num_tokens_per_microbatch_per_dp_rank: 2 samples' tokens
"""


def test_deepspeed_gets_a_marked_layer_at_each_stage_start_and_its_batch_config():
    plan = hand_plan(EVEN)
    # train_batch_size 12 = 2 per device x 3 accumulation steps x 2 data-parallel replicas
    assert export(plan, "deepspeed") == f"""\
# DeepSpeed: plan {plan.id} (mygpt on four)
# 2 stages of 2 devices each; per device 3 micro-batches of 2 samples, schedule 1F1B
# ranks (pipeline outermost): 0 d0, 1 d1, 2 d2, 3 d3
# partition_method 'type:' weighs layers whose class name matches 1, balances the
# sums: one marked layer per stage start cuts exactly there
from deepspeed.pipe import PipelineModule
from edgepipe.executor.profiling.zoo import load_model, load_callable
from torch import nn

blocks = list(load_model(
    'edgepipe.executor.profiling.split:chain',
    **{{'factory': 'mygpt:factory',
     'split': ['layers.0', 'layers.1', 'head'],
     'seed': 0,
     'modules': [['embed', 'pos'], ['layers.0'], ['layers.1'], ['head']]}},
))


class EdgepipeStageStart(nn.Sequential):
    \"\"\"The first layer of a pipeline stage.\"\"\"


STAGE_STARTS = (0, 2)  # embed, layers_1
layers = [EdgepipeStageStart(b) if i in STAGE_STARTS else b for i, b in enumerate(blocks)]
model = PipelineModule(
    layers=layers, num_stages=2, partition_method="type:^EdgepipeStageStart$",
    loss_fn=load_callable('edgepipe.executor.profiling.zoo:cross_entropy'),
)
ds_config = {{
    "train_batch_size": 12,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 3,
}}
"""


def test_a_zoo_chain_names_its_blocks_and_builds_them_from_the_zoo():
    zoo = BuildSpec(zoo="gpt2-small", sizes={"layers": 2}, seed=3)
    plan = hand_plan(EVEN, build=zoo)
    assert 'pipeline_parallel_split_points = ["layers_1"]' in export(plan, "torchtitan")
    assert "blocks = list(build_model('gpt2-small', seed=3, layers=2))" in export(
        plan, "deepspeed"
    )


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed"])
def test_uneven_shares_and_mixed_groups_are_refused_in_one_line(target):
    name = {"torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}[target]
    uneven = hand_plan([(0, 2, (3, 1)), (2, 4, (2, 2))])
    with pytest.raises(PlanMismatchError) as err:
        export(uneven, target)
    assert str(err.value) == (
        f"{name} cannot express plan {uneven.id}: stage 0's devices take uneven shares of "
        f"each micro-batch (d0 3, d1 1); {name} gives every data-parallel replica the same "
        "share (run it with edgepipe run)"
    )
    mixed = hand_plan([(0, 2, (4,)), (2, 4, (2, 2))])
    with pytest.raises(PlanMismatchError) as err:
        export(mixed, target)
    assert str(err.value) == (
        f"{name} cannot express plan {mixed.id}: its stages have [1, 2] devices; {name} "
        "replicates every stage the same number of times (run it with edgepipe run)"
    )


def test_a_module_cut_inside_is_refused_by_torchtitan_not_by_deepspeed():
    inside = BuildSpec(callable=SPLIT_BUILDER, kwargs={
        **BUILD.kwargs, "modules": [["embed"], ["layers.0"], ["layers.0", "layers.1"], ["head"]]
    })
    plan = hand_plan(EVEN, build=inside)
    with pytest.raises(PlanMismatchError, match=r"module layers\.0 runs in stages 0 and 1 "
                       r"\(the model was cut inside it\)"):
        export(plan, "torchtitan")
    assert "STAGE_STARTS = (0, 2)" in export(plan, "deepspeed")


def test_deepspeed_refuses_a_gpipe_plan():
    plan = hand_plan(EVEN, schedule="gpipe")
    assert 'pipeline_parallel_schedule = "GPipe"' in export(plan, "torchtitan")
    with pytest.raises(PlanMismatchError, match="runs only its 1F1B TrainSchedule"):
        export(plan, "deepspeed")


def test_the_command_prints_the_export_or_one_line(tmp_path, capsys):
    path = tmp_path / "plan.json"
    save_plan(hand_plan(EVEN), path)
    assert main(["export", str(path), "--to", "torchtitan"]) == 0
    assert capsys.readouterr().out == export(hand_plan(EVEN), "torchtitan")
    save_plan(hand_plan([(0, 2, (3, 1)), (2, 4, (2, 2))]), path)
    assert main(["export", str(path), "--to", "deepspeed"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stage 0's devices take uneven shares" in err
