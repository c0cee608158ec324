"""The step chain's two round times (:mod:`planner.cost.steps`): Asteroid's closed form
(``PlanCost.closed_form_ms``) and the exact longest path through the chain's schedule
(``PlanCost.chain_ms``, what the exact solver's program computes).

Link step of the chain (reference/asteroid.md Eq. 8): ``E_f = E_b = lat + B * a_p / bw``,
bw the minimum pairwise bandwidth between the two groups and lat the largest pairwise
latency (the whole micro-batch over the slowest pair, one resource for both directions;
:meth:`planner.cost.model.CostModel.link_ms`). It is conservative against the exact figure.

Closed form: writing c_i = E_f^i + E_b^i,
C_c = sum_{i<c} c_i and PB_s = sum_{i<s} E_b^i, the closed form simplifies to

    T_round = max_c (M c_c + C_c) + max_s (T_a^s - PB_s)

because every step's finishing time T_w^s + T_e^s equals D - PB_s with D = max_c(M c_c +
C_c) (substitute Eq. 5 into both branches of Eq. 6). The dominant step is the argmax c.
"""

from __future__ import annotations

import numpy as np
from edgepipe.planner.cost.order import chain_order
from edgepipe.planner.cost.steps import StepChain


def closed_form_latency(chain: StepChain) -> tuple[float, int]:
    """Asteroid's HPP-Round latency and dominant step (module docstring; Eqs. 4-6, 11).

    O(S) for S steps.
    """
    m = chain.num_micro_batches
    best_d, dominant, prefix_c = -np.inf, 0, 0.0
    best_x, prefix_b = -np.inf, 0.0
    for s, step in enumerate(chain.steps):
        c = step.forward_ms + step.backward_ms
        if m * c + prefix_c > best_d:
            best_d, dominant = m * c + prefix_c, s
        best_x = max(best_x, step.allreduce_ms - prefix_b)
        prefix_c += c
        prefix_b += step.backward_ms
    return best_d + best_x, dominant


def schedule_makespan(chain: StepChain) -> float:
    """Exact round time of the chain's schedule: the longest path through its actions.

    Schedule: per step, 1F1B with the step's warm-up (GPipe = warm-up M), as built by
    :func:`planner.schedule.one_f_one_b`. Recurrence, each step's actions taken in order:

        end(s, a) = max(end(s, previous action of s), end(dependency of a)) + duration(a)

    with F(s, m) depending on F(s-1, m), B(s, m) on B(s+1, m) (on the last step on
    F(S-1, m)); the round ends when the last action or all-reduce ends. Actions are
    taken in a topological order (:func:`planner.cost.order.chain_order`, cached per
    warm-ups and M), so it is O(S x M).

    Raises:
        ValueError: the warm-ups make the schedule deadlock.
    """
    n_steps, m = len(chain.steps), chain.num_micro_batches
    order = chain_order(tuple(step.warmup for step in chain.steps), m)
    last = n_steps - 1
    f_end = [[0.0] * m for _ in range(n_steps)]
    b_end = [[0.0] * m for _ in range(n_steps)]
    free = [0.0] * n_steps
    forward_ms = [step.forward_ms for step in chain.steps]
    backward_ms = [step.backward_ms for step in chain.steps]
    for s, forward, mb in order:
        end = free[s]
        if forward:
            dep = f_end[s - 1][mb] if s > 0 else 0.0
            end = (dep if dep > end else end) + forward_ms[s]
            f_end[s][mb] = end
        else:
            dep = b_end[s + 1][mb] if s < last else f_end[s][mb]
            end = (dep if dep > end else end) + backward_ms[s]
            b_end[s][mb] = end
        free[s] = end
    return max(free[s] + step.allreduce_ms for s, step in enumerate(chain.steps))


def describe_step(s: int) -> str:
    """Human name of chain step ``s``: ``stage p`` or ``link p->p+1``."""
    p = s // 2
    return f"stage {p}" if s % 2 == 0 else f"link {p}->{p + 1}"
