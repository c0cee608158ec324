"""What a rank builds before its first step, the same in a plain and a recovering run:
its torch device and backend, the run's dataset, every stage boundary's per-sample shape
and dtype, its optimizer and its :class:`~executor.core.runtime.StageRuntime`; and, after
its last step, its saved weights.

Boundary shapes: the first device of stage ``p`` runs one sample of the stage's input
through its blocks (evaluation mode, no gradient) and publishes the output's shape and
dtype as ``shape/<p>`` on the run's store; every device of stage ``p`` reads
``shape/<p-1>`` (its input) and ``shape/<p>`` (its output). O(one forward of one sample).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from edgepipe.executor.core import data
from edgepipe.executor.core.comm import StageGroup, StageLinks
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.core.runtime import ComputeHook, StageRuntime, make_optimizer
from edgepipe.executor.core.stage import stage_loss
from edgepipe.planner.errors import InputError
from edgepipe.planner.plan import Plan
from edgepipe.planner.schedule import build as build_schedule


def torch_device(endpoint: Endpoint) -> tuple[torch.device, str]:
    """The rank's device and process-group backend: its own GPU and nccl when every
    local rank has one, else the CPU and gloo."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= endpoint.local_world_size:
        return torch.device("cuda", endpoint.local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def load_rows(plan: Plan, opts: WorkerOptions) -> data.Rows:
    """The run's dataset (``--dataset`` or the model's built-in task)."""
    build = plan.problem.model.build
    assert build is not None
    name = opts.dataset or data.default_dataset(build)
    if name is None:
        raise InputError(
            "--dataset", "", f"model {build.describe()} has no built-in task; "
            "give --dataset MODULE:CALLABLE returning a torch Dataset"
        )
    return data.Rows(data.load_dataset(name, build, plan.problem.config.seed))


def _dtype(name: str) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, name.removeprefix("torch."))
    return dtype


def stage_shapes(
    store: dist.Store, layout: RankLayout, me: RankInfo, module: torch.nn.Sequential,
    rows: data.Rows, device: torch.device,
) -> tuple[dict[int, tuple[int, ...]], dict[int, torch.dtype]]:
    """Per-sample output shape and dtype of every stage up to and including ``me``'s,
    published on ``store`` by each stage's first device (module docstring)."""
    p = me.stage
    shapes: dict[int, tuple[int, ...]] = {}
    dtypes: dict[int, torch.dtype] = {}
    if p == 0:
        x = rows.sample_input().to(device)
    else:
        prev = json.loads(store.get(f"shape/{p - 1}"))
        shapes[p - 1], dtypes[p - 1] = tuple(prev["shape"]), _dtype(prev["dtype"])
        x = torch.zeros((1, *shapes[p - 1]), dtype=dtypes[p - 1], device=device)
    if me.index == 0 and p + 1 < layout.num_stages:
        module.eval()
        with torch.no_grad():
            out = module(x)
        module.train()
        store.set(f"shape/{p}", json.dumps({"shape": list(out.shape[1:]), "dtype": str(out.dtype)}))
    if p + 1 < layout.num_stages:
        mine = json.loads(store.get(f"shape/{p}"))
        shapes[p], dtypes[p] = tuple(mine["shape"]), _dtype(mine["dtype"])
    return shapes, dtypes


def stage_optimizer(module: torch.nn.Sequential, plan: Plan) -> torch.optim.Optimizer:
    """The optimizer of the plan's training configuration over the stage's trainable
    parameters."""
    config = plan.problem.config
    params = [p for p in module.parameters() if p.requires_grad]
    return make_optimizer(params, config.optimizer, config.optimizer_settings())


def stage_runtime(
    plan: Plan, layout: RankLayout, rank: int, module: torch.nn.Sequential,
    optimizer: torch.optim.Optimizer, links: StageLinks, group: StageGroup | None,
    hook: ComputeHook, device: torch.device, check: Callable[[], None], deterministic: bool,
    recv_ahead: int | None = None,
) -> StageRuntime:
    """The runtime of ``rank``'s actions: the plan's schedule (its warm-ups, its
    micro-batches), the stage's loss; ``recv_ahead``: receives posted ahead of their
    action per direction (None: the stage's warm-up, :mod:`executor.core.receives`)."""
    schedule = build_schedule(
        plan.problem.config.schedule, [s.warmup for s in plan.cost.stages],
        layout.num_micro_batches,
    )
    return StageRuntime(
        module, layout, rank, schedule[layout.ranks[rank].stage], links, group,
        stage_loss(plan.problem.model), optimizer, deterministic=deterministic, hook=hook,
        device=device, check=check, recv_ahead=recv_ahead,
    )


def save_weights(
    opts: WorkerOptions, plan: Plan, me: RankInfo, rank: int, module: torch.nn.Sequential,
    optimizer: torch.optim.Optimizer,
) -> None:
    """``<out>/weights/rank<r>.pt``: the rank's final weights and optimizer state."""
    assert opts.out is not None
    folder = Path(opts.out) / "weights"
    folder.mkdir(parents=True, exist_ok=True)
    stage = plan.partition.stages[me.stage]
    torch.save(
        {
            "step": opts.steps,
            "device": me.device,
            "stage": me.stage,
            "blocks": [stage.first, stage.end],
            "model": {k: v.cpu() for k, v in module.state_dict().items()},
            "optimizer": optimizer.state_dict(),
        },
        folder / f"rank{rank}.pt",
    )
