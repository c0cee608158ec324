"""The steady-state step (``PlanCost.steady_ms``): training is a sequence of iterations,
and where a device's own share of step t is done before the whole step is, its step t+1
starts early, so consecutive steps overlap.

What a device waits for before its step t+1 (the executor's loop,
:mod:`executor.core.loop` and :mod:`executor.core.runtime`): its own actions of step t,
its own ring all-reduce (the collective returns when its last chunk arrived), then its
optimizer step (``optimizer.step()``, O_d ms where the profile measured it,
:mod:`planner.cost.model`). Nothing else: no barrier ends a step, so stage 0, with no
all-reduce or a short one, starts step t+1's forwards while a later stage's all-reduce
(and its optimizer step) of step t is still running; that stage's step t+1 forwards
wait for its own ring and its own optimizer step, and step t+1 is shorter than an
isolated iteration by up to the overlap. So an optimizer step is on a device's own
cycle (no step is shorter than a device's actions, ring and optimizer step), but it
lengthens the steady step only where that cycle is the plan's critical one; on a stage
whose step ends early it hides behind the later stages' work. Every other rule is the
iteration's (docs/cost-model.md): each ordered pair keeps its messages in posting order
across steps, and on a switch or a shared medium step t+1's pieces share channels
max-min fairly with step t's rings.

Definition: with T_n the time n chained iterations take from a cold start, the
steady-state period is lim_{n -> inf} T_n / n. Point to point the chained rounds are a
max-plus linear system x(t+1) = A (x) x(t) (every time the latest of what it waits for
plus a duration), whose period is the max-plus eigenvalue of A, the largest mean weight
of a cycle of its dependency graph (Baccelli, Cohen, Olsder, Quadrat, *Synchronization
and Linearity*, 1992, Ch. 3); on a shared channel the rates make the system non-linear.

How it is computed: not by a cycle search (A would have to be built per plan, and it
does not exist where channels are shared) but by running the cost model's own event
rules over ``ITERATIONS`` chained iterations (:func:`planner.cost.makespan.round_ends`)
and taking the difference of the ends of the last two iterations that have a successor
(e_{K-2} - e_{K-3}, 0-based, K = ``ITERATIONS``): the last iteration's transfers share
no channel with a following step, so it is left out. The transient is short: a device
can run ahead of its successors by at most its warm-up, and the lead is set within the
first chained step: on 2,100 random plans the difference is constant from e_2 - e_1 on
for all but one (5 stages on a shared medium), from e_3 - e_2 on for all of another
1,800 (tests/unit/test_steady_state.py checks it against 8 iterations). A period within a
relative 1e-9 of the isolated iteration is reported as the iteration itself (the
difference of two sums can differ from it in the last bits).

Cost: ``ITERATIONS`` times one round's evaluation (:mod:`planner.cost.makespan`).
"""

from __future__ import annotations

from edgepipe.planner.cost.makespan import round_ends
from edgepipe.planner.cost.transfers import BoundaryCost, RingCost
from edgepipe.planner.inputs.cluster import Topology
from edgepipe.planner.schedule import Schedule

#: chained iterations run to read the steady period (module docstring)
ITERATIONS = 5
#: the round whose end less the one before is the steady period (0-based: e_{K-2})
STEADY = ITERATIONS - 2

#: a period this close (relative) to the isolated iteration is the iteration
SAME = 1e-9


def steady_period_ms(schedule: Schedule, devices: list[list[tuple[str, float, float]]],
                     links: list[BoundaryCost], rings: list[RingCost], topology: Topology,
                     iteration_ms: float, optim: list[list[float]] | None = None) -> float:
    """The steady-state step of the round whose isolated iteration takes
    ``iteration_ms`` (inputs, ``optim`` the devices' optimizer steps, as
    :func:`planner.cost.makespan.round_makespan`): the difference of chained
    iterations' ends (module docstring).

    Raises:
        ValueError: the schedule deadlocks.
    """
    ends = round_ends(schedule, devices, links, rings, topology, ITERATIONS, optim)
    period = ends[STEADY] - ends[STEADY - 1]
    return iteration_ms if abs(period - iteration_ms) <= SAME * iteration_ms else period
