"""The library's front door: load inputs by path or shipped name, solve, compare the
planners and re-plan. ``__all__`` is the public surface; every other module is an
implementation detail that may move.

>>> from edgepipe.planner import api
>>> problem = api.load_problem("pipedream-vgg16", "jetson-testbed-6", global_batch=32)
>>> plan = api.solve(problem)                      # the DP planner
>>> plan.cost.iteration_ms, plan.partition.num_stages
>>> exact = api.solve(problem, "milp", backend="cpsat", time_limit=60)
>>> table = api.compare(problem)                   # DP, exact solver and baselines
>>> after = api.replan(plan, lost=["nano-1"])       # incremental re-plan + migration
"""

from __future__ import annotations

from pathlib import Path

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.resources import data_dir
from edgepipe.planner.plan import load_plan, save_plan
from edgepipe.planner.replan.incremental import precompute, replan
from edgepipe.planner.solvers.comparison import compare
from edgepipe.planner.solvers.solve import planners, solve

__all__ = [
    "DEMO_CLUSTER",
    "DEMO_GLOBAL_BATCH",
    "DEMO_MODEL",
    "compare",
    "load_plan",
    "load_problem",
    "planners",
    "precompute",
    "replan",
    "resolve",
    "save_plan",
    "shipped",
    "solve",
]

#: the demo: a real third-party profile on the 6-device mixed Jetson testbed
DEMO_MODEL = "pipedream-vgg16"
DEMO_CLUSTER = "jetson-testbed-6"
DEMO_GLOBAL_BATCH = 32


def shipped(kind: str) -> list[str]:
    """Names of the shipped ``models`` or ``clusters`` (file stems)."""
    return sorted(p.stem for p in (data_dir("profiles") / kind).glob("*.json"))


def resolve(name_or_path: str | Path, kind: str) -> Path:
    """A path as given if it exists, else the shipped ``profiles/<kind>/<name>.json``."""
    if not isinstance(name_or_path, str | Path):
        raise InputError(
            kind[:-1],
            "",
            f"expected a shipped name or a path, got a {type(name_or_path).__name__}",
        )
    path = Path(name_or_path)
    if path.exists():
        return path
    candidate = data_dir("profiles") / kind / f"{name_or_path}.json"
    if candidate.exists():
        return candidate
    raise InputError(
        str(name_or_path),
        "",
        f"no such file, and no shipped {kind[:-1]} of that name; shipped: {shipped(kind)}",
    )


def load_problem(
    model: str | Path,
    cluster: str | Path,
    config: str | Path | TrainingConfig | None = None,
    global_batch: int | None = None,
) -> Problem:
    """Load model profile, cluster and config (by path or shipped name) into a Problem.

    ``config`` may be a file, a :class:`TrainingConfig`, or ``None`` for the defaults
    with ``global_batch`` (default 32).
    """
    if not isinstance(config, str | Path | TrainingConfig | None):
        raise InputError(
            "config",
            "",
            f"expected a config file, a TrainingConfig or None, got a {type(config).__name__}",
        )
    profile = ModelProfile.load(resolve(model, "models"))
    cl = Cluster.load(resolve(cluster, "clusters"))
    if isinstance(config, TrainingConfig):
        cfg = config
    elif config is not None:
        cfg = TrainingConfig.load(config)
    else:
        cfg = TrainingConfig(DEMO_GLOBAL_BATCH if global_batch is None else global_batch)
    return make_problem(profile, cl, cfg)
