"""Side-by-side comparison of planners on one problem (module `planner.solvers.comparison`;
the function is exported as `planner.api.compare`).

Every planner (the DP, the exact solver, the baselines of :mod:`planner.solvers.baselines`)
returns a plan scored by the one cost model, so the rows are directly comparable. A row
holds: planner, feasible, status, predicted iteration time, samples/s, speed-up over the
data-parallel baseline (ratio of iteration times, i.e. of throughputs), solve time, the
exact solver's optimality gap, peak memory headroom (1 - the most loaded device's memory
/ its usable memory), stage / device counts and micro-batch size; an infeasible planner
gets a row with its error message. Runtime: the sum of the planners' (the exact solver's
is bounded by its time limit).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from edgepipe.planner.errors import InfeasibleError, InputError
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.plan import Plan
from edgepipe.planner.solvers import solve as solving
from edgepipe.planner.solvers.exact.solver import DEFAULT_BACKEND, DEFAULT_TIME_LIMIT

#: the reference of the speed-up column
REFERENCE = "data-parallel"


@dataclass(frozen=True)
class ComparisonRow:
    """One planner's result; figures are None where it found no feasible plan."""

    planner: str
    feasible: bool
    status: str  # the plan's solver status, or "infeasible"
    iteration_ms: float | None
    #: the steady-state step (``PlanCost.steady_ms``): what a run's steps take, the
    #: figure rows are ranked by; samples/s and the speedup are of it
    steady_ms: float | None
    samples_per_s: float | None
    speedup_vs_data_parallel: float | None
    solve_time_s: float
    gap: float | None
    memory_headroom: float | None
    stages: int | None
    devices_used: int | None
    micro_batch_size: int | None
    note: str = ""


COLUMNS = tuple(ComparisonRow.__dataclass_fields__)


@dataclass(frozen=True)
class ComparisonResult:
    """The comparison table (``rows``, in the order the planners were asked for) and the
    plans behind its feasible rows."""

    model: str
    cluster: str
    global_batch: int
    rows: tuple[ComparisonRow, ...]
    plans: dict[str, Plan]

    def row(self, planner: str) -> ComparisonRow:
        for r in self.rows:
            if r.planner == planner:
                return r
        raise KeyError(planner)

    def best(self) -> ComparisonRow:
        """The feasible row with the least steady-state step (first on ties).

        Raises ``ValueError`` when no planner found a feasible plan."""
        feasible = [r for r in self.rows if r.feasible]
        if not feasible:
            raise ValueError("no planner found a feasible plan")
        return min(feasible, key=lambda r: r.steady_ms)  # type: ignore[arg-type, return-value]

    def to_records(self) -> list[dict]:
        return [asdict(r) for r in self.rows]

    def to_csv(self) -> str:
        """The table as CSV with a header row (empty cells for missing figures)."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for record in self.to_records():
            writer.writerow({k: "" if v is None else v for k, v in record.items()})
        return buf.getvalue()

    def to_json(self) -> str:
        doc = {
            "model": self.model,
            "cluster": self.cluster,
            "global_batch": self.global_batch,
            "reference": REFERENCE,
            "rows": self.to_records(),
            "plan_ids": {name: plan.id for name, plan in self.plans.items()},
        }
        return json.dumps(doc, indent=1)

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write ``compare.csv``, ``compare.json`` and the bar chart ``compare.png``."""
        folder = Path(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        paths = [folder / "compare.csv", folder / "compare.json", folder / "compare.png"]
        paths[0].write_text(self.to_csv())
        paths[1].write_text(self.to_json() + "\n")
        draw_chart(self, paths[2])
        return paths


def compare(
    problem: Problem,
    planners: list[str] | None = None,
    backend: str = DEFAULT_BACKEND,
    time_limit: float = DEFAULT_TIME_LIMIT,
    progress: Callable[[str, int, int], None] | None = None,
) -> ComparisonResult:
    """Run ``planners`` (default: every one, :func:`planner.solvers.solve.planners`) on
    ``problem``; the exact solver with ``backend`` and ``time_limit``.

    ``progress(label, done, total)`` reports each planner's progress (the DP per
    micro-batch candidate, the exact solver per program, a baseline when done).

    Raises:
        InputError: an unknown planner name (before anything runs).
    """
    if isinstance(planners, str):
        raise InputError("--planners", "", f"expected a list of planner names, got {planners!r}")
    names = list(planners) if planners is not None else solving.planners()
    unknown = [n for n in names if n not in solving.planners()]
    if unknown or not names:
        raise InputError(
            "--planners", "", f"unknown planners {unknown}; available: {solving.planners()}"
        )
    plans: dict[str, Plan] = {}
    notes: dict[str, str] = {}
    for name in names:
        label = f"{name} ({backend}, <= {time_limit:g} s)" if name == "milp" else name

        def report(done: int, total: int, label: str = label) -> None:
            if progress is not None:
                progress(label, done, total)

        report(0, 1)
        try:
            plans[name] = solving.solve(
                problem, name, progress=report, backend=backend, time_limit=time_limit
            )
        except InfeasibleError as exc:
            notes[name] = str(exc)
        report(1, 1)
    reference = plans.get(REFERENCE)
    rows = []
    for name in names:
        plan = plans.get(name)
        if plan is None:
            rows.append(
                ComparisonRow(
                    planner=name,
                    feasible=False,
                    status="infeasible",
                    iteration_ms=None,
                    steady_ms=None,
                    samples_per_s=None,
                    speedup_vs_data_parallel=None,
                    solve_time_s=0.0,
                    gap=None,
                    memory_headroom=None,
                    stages=None,
                    devices_used=None,
                    micro_batch_size=None,
                    note=notes[name],
                )
            )
            continue
        cost = plan.cost
        rows.append(
            ComparisonRow(
                planner=name,
                feasible=True,
                status=plan.solver.status,
                iteration_ms=cost.iteration_ms,
                steady_ms=cost.steady_ms,
                samples_per_s=cost.samples_per_s,
                speedup_vs_data_parallel=(
                    reference.cost.steady_ms / cost.steady_ms if reference else None
                ),
                solve_time_s=plan.solver.solve_time_s,
                gap=plan.solver.gap,
                memory_headroom=1.0 - cost.peak_memory_fraction,
                stages=plan.partition.num_stages,
                devices_used=len(plan.partition.used_devices()),
                micro_batch_size=plan.partition.micro_batch_size,
            )
        )
    return ComparisonResult(
        problem.model.name,
        problem.cluster.name,
        problem.config.global_batch,
        tuple(rows),
        plans,
    )


def draw_chart(result: ComparisonResult, path: str | Path) -> None:
    """Horizontal bars of predicted samples/s per planner, labelled with the speed-up
    over data-parallel; infeasible planners are marked. Drawn on a private Figure with
    the Agg canvas (no pyplot state); matplotlib is imported only here."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result.rows
    height = 1.2 + 0.45 * len(rows)
    fig = Figure(figsize=(8.0, height), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ys = list(range(len(rows)))[::-1]
    values = [r.samples_per_s or 0.0 for r in rows]
    colors = ["#4c72b0" if r.planner in ("dp", "milp") else "#8c8c8c" for r in rows]
    ax.barh(ys, values, color=colors)
    ax.set_yticks(ys, [r.planner for r in rows])
    top = max(values) if any(values) else 1.0
    for y, r in zip(ys, rows, strict=True):
        if not r.feasible:
            text = "infeasible"
        elif r.speedup_vs_data_parallel is not None:
            text = f"{r.samples_per_s:.2f}/s  ({r.speedup_vs_data_parallel:.2f}x data-parallel)"
        else:
            text = f"{r.samples_per_s:.2f}/s"
        ax.text((r.samples_per_s or 0.0) + top * 0.01, y, text, va="center", fontsize=8)
    ax.set_xlim(0, top * 1.35)
    ax.set_xlabel("predicted samples/s (cost model)")
    ax.set_title(
        f"{result.model} on {result.cluster}, global batch {result.global_batch}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path)
