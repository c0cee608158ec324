"""The library's front door: load inputs by path or shipped name, and solve.

>>> from planner import api
>>> problem = api.load_problem("pipedream-vgg16", "jetson-testbed-6", global_batch=32)
>>> plan = api.solve(problem)                      # the DP planner
>>> plan.cost.iteration_ms, plan.partition.num_stages
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from planner.cluster import Cluster
from planner.config import TrainingConfig
from planner.dp import plan_dp
from planner.errors import InputError
from planner.plan import Plan, SolverInfo, load_plan, make_plan, save_plan
from planner.problem import Problem, make_problem
from planner.profile import ModelProfile
from planner.resources import data_dir

__all__ = ["load_plan", "load_problem", "resolve", "save_plan", "shipped", "solve"]

#: the demo: a real third-party profile on the 6-device mixed Jetson testbed
DEMO_MODEL = "pipedream-vgg16"
DEMO_CLUSTER = "jetson-testbed-6"
DEMO_GLOBAL_BATCH = 32


def shipped(kind: str) -> list[str]:
    """Names of the shipped ``models`` or ``clusters`` (file stems)."""
    return sorted(p.stem for p in (data_dir("profiles") / kind).glob("*.json"))


def resolve(name_or_path: str | Path, kind: str) -> Path:
    """A path as given if it exists, else the shipped ``profiles/<kind>/<name>.json``."""
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
    profile = ModelProfile.load(resolve(model, "models"))
    cl = Cluster.load(resolve(cluster, "clusters"))
    if isinstance(config, TrainingConfig):
        cfg = config
    elif config is not None:
        cfg = TrainingConfig.load(config)
    else:
        cfg = TrainingConfig(global_batch or DEMO_GLOBAL_BATCH)
    return make_problem(profile, cl, cfg)


def solve(
    problem: Problem,
    solver: str = "dp",
    progress: Callable[[int, int], None] | None = None,
) -> Plan:
    """Plan ``problem`` with ``solver`` (``"dp"``) and return the scored :class:`Plan`.

    Raises:
        InfeasibleError: nothing fits memory (the message names the binding figure).
        InputError: unknown solver name.
    """
    if solver != "dp":
        raise InputError("--solver", "", f"unknown solver {solver!r}; available: ['dp']")
    result = plan_dp(problem, progress=progress)
    info = SolverInfo(
        name="dp",
        settings={"micro_batch_sizes": problem.config.micro_batch_sizes()},
        solve_time_s=result.solve_time_s,
        status="heuristic",
    )
    return make_plan(problem, result.partition, info, cost=result.cost)
