"""The library's front door: load inputs by path or shipped name, and solve.

>>> from edgepipe.planner import api
>>> problem = api.load_problem("pipedream-vgg16", "jetson-testbed-6", global_batch=32)
>>> plan = api.solve(problem)                      # the DP planner
>>> plan.cost.iteration_ms, plan.partition.num_stages
>>> exact = api.solve(problem, "milp", backend="cpsat", time_limit=60)
>>> table = api.compare(problem)                   # DP, exact solver and baselines
>>> after = api.replan(plan, lost=["nano-1"])       # incremental re-plan + migration
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import Problem, make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.inputs.resources import data_dir
from edgepipe.planner.plan import Plan, SolverInfo, load_plan, make_plan, save_plan
from edgepipe.planner.replan.incremental import precompute, replan
from edgepipe.planner.solvers.baselines import BASELINES, plan_baseline
from edgepipe.planner.solvers.dp.driver import plan_dp
from edgepipe.planner.solvers.exact.solver import DEFAULT_BACKEND, DEFAULT_TIME_LIMIT, plan_milp

if TYPE_CHECKING:
    from edgepipe.planner.solvers.comparison import ComparisonResult

__all__ = [
    "load_plan",
    "load_problem",
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


def planners() -> list[str]:
    """Names accepted by :func:`solve`: the DP, the exact solver and the baselines."""
    return ["dp", "milp", *BASELINES]


def solve(
    problem: Problem,
    solver: str = "dp",
    progress: Callable[[int, int], None] | None = None,
    *,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = DEFAULT_TIME_LIMIT,
    multilevel: bool = True,
) -> Plan:
    """Plan ``problem`` with ``solver`` and return the scored :class:`Plan`.

    ``solver``: ``"dp"`` (Asteroid's DP, :mod:`planner.solvers.dp.driver`; past ``time_limit``
    seconds
    it returns its best plan so far with status ``timed_out``), ``"milp"`` (the exact
    solver, :mod:`planner.solvers.exact.solver`, with ``backend`` in cpsat | cbc | highs and a
    wall-clock
    ``time_limit`` in seconds, warm-started from the DP) or a baseline of
    :mod:`planner.solvers.baselines`. ``progress(done, total)`` is called as the DP finishes each
    level of a micro-batch candidate or the exact solver each (micro-batch, stage count)
    program. ``multilevel`` (dp only): plan a model of more than ``dp.MULTILEVEL_ABOVE``
    blocks coarse to fine (:mod:`planner.solvers.dp.multilevel`; the default), or on every block.

    Raises:
        InfeasibleError: nothing fits memory (the message names the binding figure).
        InputError: unknown solver or backend name, or a non-positive time limit.
    """
    if not isinstance(time_limit, int | float) or isinstance(time_limit, bool):
        raise InputError(
            "--time-limit", "", f"expected seconds as a number, got a {type(time_limit).__name__}"
        )
    if solver == "dp":
        result = plan_dp(problem, progress=progress, time_limit=time_limit,
                         multilevel=multilevel)  # fmt: skip
        info = SolverInfo(
            name="dp",
            settings={
                "micro_batch_sizes": problem.config.micro_batch_sizes(),
                "time_limit_s": time_limit,
                "state_graph": result.graph,
                "coarse_to_fine": result.coarse_to_fine,
            },
            solve_time_s=result.solve_time_s,
            status="timed_out" if result.status == "timed_out" else "heuristic",
        )
        return make_plan(problem, result.partition, info, cost=result.cost)
    if solver == "milp":
        exact = plan_milp(problem, backend=backend, time_limit=time_limit, progress=progress)
        info = SolverInfo(
            name="milp",
            settings={
                "backend": exact.backend,
                "time_limit_s": exact.time_limit_s,
                "micro_batch_sizes": problem.config.micro_batch_sizes(),
                "warm_start": "dp",
                "warm_start_ms": exact.warm_start_ms,
                "programs": len(exact.subproblems),
                "programs_closed": sum(s.closed for s in exact.subproblems),
                "program_ms": exact.program_ms,
            },
            solve_time_s=exact.solve_time_s,
            status=exact.status,
            objective_bound_ms=exact.bound_ms,
            gap=exact.gap,
        )
        return make_plan(problem, exact.partition, info, cost=exact.cost)
    if solver in BASELINES:
        start = time.perf_counter()
        partition, cost = plan_baseline(problem, solver)
        info = SolverInfo(
            name=solver,
            settings={"micro_batch_sizes": problem.config.micro_batch_sizes()},
            solve_time_s=time.perf_counter() - start,
            status="heuristic",
        )
        return make_plan(problem, partition, info, cost=cost)
    raise InputError("--solver", "", f"unknown solver {solver!r}; available: {planners()}")


def compare(
    problem: Problem,
    planners: list[str] | None = None,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = DEFAULT_TIME_LIMIT,
    progress: Callable[[str, int, int], None] | None = None,
) -> ComparisonResult:
    """Run several planners on ``problem`` and tabulate them
    (:func:`planner.solvers.comparison.compare`)."""
    from edgepipe.planner.solvers.comparison import compare as run_comparison

    return run_comparison(problem, planners, backend, time_limit, progress)
