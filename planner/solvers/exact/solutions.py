"""Between plans and a program's variables: a plan's values as a solver hint
(:func:`solution_hint`), the plan a solution encodes (:func:`extract`), the decision
variables a plan is read from (:func:`decision`, what :func:`no_good
<planner.solvers.exact.formulation.no_good>` excludes) and fixing them
(:func:`pin`)."""

from __future__ import annotations

from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.replan.replicas import ring_load
from edgepipe.planner.solvers.exact.formulation import Formulation
from edgepipe.planner.solvers.exact.tables import Tables


def solution_hint(form: Formulation, tables: Tables, partition: Partition) -> dict[int, float]:
    """Values of the block and device variables for ``partition`` (a MIP start / hint;
    the solvers complete the time variables)."""
    problem = tables.problem
    cls_of = {i: k for k, c in enumerate(tables.classes) for i in c.members}
    values: dict[int, float] = {}
    for p, stage in enumerate(partition.stages):
        for l_ in range(stage.first, stage.end):
            for p2 in range(1, form.num_stages):
                values[form.cum[l_, p2]] = 1.0 if p >= p2 else 0.0
    for (p, k, y), var in form.n.items():
        stage = partition.stages[p]
        count = sum(
            1
            for d, s in zip(stage.devices, stage.samples, strict=True)
            if cls_of[problem.cluster.index(d)] == k and s == y
        )
        values[var] = float(count)
        values[form.q[p, k, y]] = 1.0 if count else 0.0
    for (p, k), var in form.u.items():
        values[var] = float(
            any(cls_of[problem.cluster.index(d)] == k for d in partition.stages[p].devices)
        )
    for (p, k), var in form.d2.items():
        count = sum(cls_of[problem.cluster.index(d)] == k for d in partition.stages[p].devices)
        values[var] = 1.0 if count >= 2 else 0.0
    for (p, g), var in form.h.items():
        values[var] = 1.0 if len(partition.stages[p].devices) == g else 0.0
    if form.r:
        values.update(dict.fromkeys(form.r.values(), 0.0))
        ring = ring_load(tables.cm.replicas(partition))
        for p, stage in enumerate(partition.stages):
            for d, y in zip(stage.devices, stage.samples, strict=True):
                if d in ring and (p, cls_of[problem.cluster.index(d)], y) in form.r:
                    values[form.r[p, cls_of[problem.cluster.index(d)], y]] = 1.0
    return values


def decision(form: Formulation, values: list[float] | dict[int, float]) -> dict[int, float]:
    """The values of the variables a plan is read from (c, n and the replica holders r;
    the others follow from them): what :func:`extract` uses and :func:`no_good` excludes."""
    keys = [*form.cum.values(), *form.n.values(), *form.r.values()]
    return {v: float(round(values[v])) for v in keys}



def pin(form: Formulation, values: dict[int, float]) -> None:
    """Fix the variables of ``values`` to those values (bounds lb = ub): the program then
    prices exactly that plan (``tests/unit/test_milp.py`` compares it with the cost model)."""
    for var, value in values.items():
        form.model.lb[var] = form.model.ub[var] = value


def extract(form: Formulation, tables: Tables, values: list[float]) -> Partition:
    """The partition encoded by a solution: block ranges from c, devices from n (the
    members of a class taken in cluster order, listed in cluster order except that the
    holder of an incoming ring replica, from r, comes first)."""
    big_l, big_p = tables.n_blocks, form.num_stages
    stage_of = [sum(round(values[form.cum[l_, p]]) for p in range(1, big_p)) for l_ in range(big_l)]
    free = [list(c.members) for c in tables.classes]
    devices = tables.problem.cluster.devices
    holder = {p: (k, y) for (p, k, y), var in form.r.items() if round(values[var])}
    stages = []
    for p in range(big_p):
        blocks = [l_ for l_ in range(big_l) if stage_of[l_] == p]
        taken: list[tuple[int, int, int]] = []  # (cluster index, samples, class)
        for (sp, k, y), var in sorted(
            form.n.items(), key=lambda kv: (kv[0][0], kv[0][1], -kv[0][2])
        ):
            if sp == p:
                for _ in range(round(values[var])):
                    taken.append((free[k].pop(0), y, k))
        taken.sort()
        if p in holder:
            first = next(i for i, (_, y, k) in enumerate(taken) if (k, y) == holder[p])
            taken.insert(0, taken.pop(first))
        stages.append(
            StageAssignment(
                blocks[0],
                blocks[-1] + 1,
                tuple(devices[i].id for i, _, _ in taken),
                tuple(y for _, y, _ in taken),
            )
        )
    return Partition(form.batch, tables.problem.config.global_batch // form.batch, tuple(stages))
