"""A plan as the CLI prints it: the heading, the per-stage table (or one line per stage on
a narrow terminal), the idle devices, the replication note and the grouped assumptions;
the Gantt chart's title; the simulator set against the cost model's figures."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgepipe.planner.cli.console import compact_table, out, print_table
from edgepipe.planner.cost.closed_form import pipeline_closed_form_ms
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.plan import Plan

if TYPE_CHECKING:
    from rich.table import Table


def plan_table(plan: Plan) -> Table:
    """Per-stage summary of a plan as a rich table (fits 80 columns; the device list
    wraps). Columns: stage, blocks, devices (samples), K = in-flight micro-batches,
    forward / backward ms, all-reduce and outgoing link ms under the plan's own traffic
    (:func:`transfer_figures`), and ``mem used``: the stage's peak memory as a share of
    its most loaded device's usable memory."""
    cost, part = plan.cost, plan.partition
    figures = transfer_figures(plan)
    table = compact_table()
    for col in ("stage", "blocks", "devices (samples)", "K", "fwd ms", "bwd ms", "ar ms",
                "link ms", "mem used"):  # fmt: skip
        table.add_column(col, justify="left" if col == "devices (samples)" else "right")
    for p, (stage, sc) in enumerate(zip(part.stages, cost.stages, strict=True)):
        devices = ", ".join(f"{d} ({y})" for d, y in zip(stage.devices, stage.samples, strict=True))
        peak = max(m / b for m, b in zip(sc.memory_bytes, sc.budget_bytes, strict=True))
        table.add_row(
            str(p),
            f"{stage.first}-{stage.end - 1}",
            devices,
            str(sc.warmup),
            f"{sc.forward_ms:.1f}",
            f"{sc.backward_ms:.1f}",
            f"{figures[p][1]:.1f}",
            f"{figures[p][0]:.1f}" if p + 1 < part.num_stages else "-",
            f"{peak:.0%}",
        )
    return table


def transfer_figures(plan: Plan) -> list[tuple[float, float]]:
    """Per stage, its outgoing link (a boundary's micro-batch from post to delivery) and
    its ring all-reduce as they take in the plan's steady step, sharing the network with
    the plan's other transfers (:meth:`CostModel.stage_transfer_ms`), not alone on an
    idle network (``StageCost.link_out_ms`` / ``allreduce_ms``): the lab measured the
    former (docs/decisions.md, "The per-stage link and all-reduce columns")."""
    return CostModel(plan.problem, plan.partition.micro_batch_size).stage_transfer_ms(
        plan.partition)


DERIVED = re.compile(
    r"times for (\S+) derived from (\S+) x (\S+) \(effective GFLOP/s (\S+) / (\S+)\)"
)
SAME_REST = re.compile(r"times for (\S+) (.*)")


def grouped_assumptions(notes: Sequence[str]) -> list[str]:
    """Assumption lines with repeats merged (order of first appearance kept): derived
    times become one line per reference type, ``times derived from v100 (9800 effective
    GFLOP/s) by the ratio of effective GFLOP/s: a x 118.7 (82.56), b x 17.01 (576)``,
    and lines that differ only in the
    device type, ``times for a come from one batch size ...``, one line naming them all."""
    derived: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    same: dict[str, list[str]] = {}
    for note in notes:
        if match := DERIVED.fullmatch(note):
            name, ref, factor, ref_speed, speed = match.groups()
            derived.setdefault((ref, ref_speed), []).append((name, factor, speed))
        elif match := SAME_REST.fullmatch(note):
            same.setdefault(match.group(2), []).append(match.group(1))
        else:
            same.setdefault(note, [])
    lines = [
        f"times derived from {ref} ({ref_speed} effective GFLOP/s) by the ratio of effective "
        "GFLOP/s: " + ", ".join(f"{name} x {factor} ({speed})" for name, factor, speed in group)
        for (ref, ref_speed), group in derived.items()
    ]
    for rest, names in same.items():
        lines.append(f"times for {', '.join(names)} {rest}" if names else rest)
    return lines


def plan_heading(plan: Plan) -> str:
    """The two lines above a plan's table: id and solver; problem and prediction."""
    cost, part = plan.cost, plan.partition
    return (
        f"{plan.id}  ({plan.solver.name}, {plan.solver.status}, "
        f"{plan.solver.solve_time_s:.2f} s)\n"
        f"{plan.problem.model.name} on {plan.problem.cluster.name}: micro-batch "
        f"{part.micro_batch_size} x {part.num_micro_batches}, iteration "
        f"{cost.iteration_ms:.1f} ms{steady_text(cost)}, {cost.samples_per_s:.2f} "
        f"samples/s, bottleneck {cost.bottleneck}"
    )


def steady_text(cost: PlanCost) -> str:
    """The steady-state step beside the isolated iteration (planner/cost/steady.py) where
    it differs: shorter where consecutive steps overlap, longer where they contend;
    nothing where a run's steps are the isolated iteration (most plans)."""
    if cost.steady_ms == cost.iteration_ms:
        return ""
    how = "steps overlap" if cost.steady_ms < cost.iteration_ms else "steps contend"
    return f", steady step {cost.steady_ms:.1f} ms ({how})"


def plan_lines(plan: Plan) -> list[str]:
    """The narrow layout of :func:`plan_table`: one line per stage."""
    lines = []
    figures = transfer_figures(plan)
    for p, (stage, sc) in enumerate(zip(plan.partition.stages, plan.cost.stages, strict=True)):
        devices = ", ".join(f"{d} ({y})" for d, y in zip(stage.devices, stage.samples, strict=True))
        peak = max(m / b for m, b in zip(sc.memory_bytes, sc.budget_bytes, strict=True))
        link = f", link {figures[p][0]:.1f} ms" if p + 1 < plan.partition.num_stages else ""
        lines.append(
            f"stage {p}: blocks {stage.first}-{stage.end - 1} on {devices}; K {sc.warmup}; "
            f"fwd {sc.forward_ms:.1f} ms, bwd {sc.backward_ms:.1f} ms, all-reduce "
            f"{figures[p][1]:.1f} ms{link}; memory used {peak:.0%}"
        )
    return lines


def print_plan(plan: Plan) -> None:
    """Print the plan's heading, stages, idle devices, replication note and assumptions."""
    out.print(plan_heading(plan), highlight=False)
    print_table(plan_table(plan), lambda: plan_lines(plan))
    idle = [d.id for d in plan.problem.cluster.devices if d.id not in plan.partition.used_devices()]
    if idle:
        out.print(f"idle devices: {', '.join(idle)}", highlight=False)
    k = plan.problem.config.replication_interval
    if isinstance(k, int) and k > 1:  # auto resolves beyond 1 where a point outlasts a step
        t = CostModel(plan.problem, plan.partition.micro_batch_size).replica_transfer_ms(
            plan.partition)
        out.print(f"replication: every {k} steps; a point's transfer takes {t:.0f} ms, "
                  f"{t / plan.cost.iteration_ms:.1f} steps (a loss replays up to {2 * k - 1} "
                  "steps)", highlight=False)
    for note in grouped_assumptions(plan.assumptions):
        out.print(f"[dim]assumption: {note}[/dim]", highlight=False)


def gantt_title(plan: Plan) -> str:
    """The Gantt chart's title: the plan and the schedule it runs."""
    config = plan.problem.config
    schedule = "GPipe" if config.schedule == "gpipe" else f"1F1B, {config.warmup} warm-up"
    return f"{plan.id}: one iteration ({schedule})"


def simulation_summary(plan: Plan, simulated_ms: float, schedule: str | None = None) -> str:
    """What is compared with what: the independent simulator (each device and each
    transfer on its channel) against the cost model's figure the plan reports (the same
    semantics, written apart), the DP's closed-form search objective and Asteroid's
    closed form."""
    cost = plan.cost
    objective = pipeline_closed_form_ms(
        CostModel(plan.problem, plan.partition.micro_batch_size), plan.partition
    )
    lines = [
        f"independent simulator: {simulated_ms:.1f} ms per iteration "
        f"({plan.problem.cluster.network.kind} network)",
        f"cost model (the plan's prediction): {cost.iteration_ms:.1f} ms, "
        f"{cost.iteration_ms / simulated_ms - 1:+.1%} against the simulator",
        f"DP's search objective (closed form): {objective:.1f} ms, "
        f"{objective / simulated_ms - 1:+.1%}",
        f"Asteroid's closed form (Eqs. 4-6, 11): {cost.closed_form_ms:.1f} ms, "
        f"{cost.closed_form_ms / simulated_ms - 1:+.1%}",
    ]
    if schedule is not None and schedule != plan.problem.config.schedule:
        lines.append(
            f"note: simulated with {schedule}; the plan and its prediction use "
            f"{plan.problem.config.schedule}"
        )
    return "\n".join(lines)
