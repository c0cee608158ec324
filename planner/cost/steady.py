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
and reading the differences of consecutive ends that have a successor (the last
iteration's transfers share no channel with a following step, so its end is left out).
Where the last two agree (e_2 - e_1 = e_3 - e_2, 0-based, K = ``ITERATIONS``, within a
relative ``SAME``) the period is e_3 - e_2. Where they do not, the rounds have not
settled to one difference: a transient, or a cycle of several steps (on a shared
channel the steps alternate, e.g. 8959.8, 9664.2, 8959.8, ... ms, whose mean 9312.0 is
the channel's time per iteration; one difference reads one phase, up to 2.6% off).
Then ``LONG_ITERATIONS`` chained iterations run and the period is the mean over the
last ``CYCLE`` steps with a successor, (e_8 - e_4) / 4: a span of 4 steps is a whole
number of cycles of period 1, 2 or 4 (those seen), so it is their exact mean, and it
starts after a transient of 4 steps. What it cannot see: a cycle whose length does not
divide 4 (3, 5, 8, ...; or none, where rates make the rounds quasi-periodic) or a
transient longer than 4 steps. Once settled, the error is bounded by the spread of the
differences (largest less smallest): the mean of any 4 lies between them, as the
limit does; for a period 3 it is at most a quarter of the spread (one step beyond a
whole cycle, whose mean is the limit). Measured: on 6,000 random plans
(``tests.helpers.synthetic.random_plans``, seeds 2-4) the last two differences
disagree on 13; against the 36-step mean (e_38 - e_2) / 36 of 40 iterations the single
difference was off on 13 of them by up to 2.6%, (e_8 - e_4) / 4 exact to 1e-14 on
the 8 of period 2 or 4, within 9e-6 on 2 whose oscillation dies out, and off by up to
0.068% on 3 switched plans whose transient outlasts 4 steps or that never settle. The
transient is short otherwise: a device can run ahead of its successors by at most its
warm-up, set within the first chained step. A period within a relative ``SAME`` of the
isolated iteration is reported as the iteration itself (the difference of two sums can
differ from it in the last bits).

Cost: ``ITERATIONS`` times one round's evaluation (:mod:`planner.cost.makespan`);
``LONG_ITERATIONS`` more where the differences disagree (13 of 6,000 random plans).
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
#: steps averaged where the differences disagree: a whole number of cycles of 1, 2 and 4
CYCLE = 4
#: chained iterations run where they disagree: a transient of CYCLE steps, a span of
#: CYCLE steps, and the last one left out (module docstring)
LONG_ITERATIONS = 2 * CYCLE + 2

#: a period this close (relative) to the isolated iteration is the iteration
SAME = 1e-9


def steady_period_ms(schedule: Schedule, devices: list[list[tuple[str, float, float]]],
                     links: list[BoundaryCost], rings: list[RingCost], topology: Topology,
                     iteration_ms: float, optim: list[list[float]] | None = None) -> float:
    """The steady-state step of the round whose isolated iteration takes
    ``iteration_ms`` (inputs, ``optim`` the devices' optimizer steps, as
    :func:`planner.cost.makespan.round_makespan`): the difference of chained
    iterations' ends where the last two agree, else the mean over ``CYCLE`` steps of
    ``LONG_ITERATIONS`` chained ones (module docstring).

    Raises:
        ValueError: the schedule deadlocks.
    """
    ends = round_ends(schedule, devices, links, rings, topology, ITERATIONS, optim)
    period = ends[STEADY] - ends[STEADY - 1]
    if abs(period - (ends[STEADY - 1] - ends[STEADY - 2])) > SAME * period:
        ends = round_ends(schedule, devices, links, rings, topology, LONG_ITERATIONS, optim)
        period = (ends[-2] - ends[-2 - CYCLE]) / CYCLE
    return iteration_ms if abs(period - iteration_ms) <= SAME * iteration_ms else period
