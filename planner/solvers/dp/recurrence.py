"""The DP's recurrence: prepending a head stage and its link to an entry of a suffix's
front gives the entry of the longer suffix, exactly as the cost model's closed form prices
the plan.

Inputs: the head's figures (Eq. 8's E_f, E_b: reference/asteroid.md §3.2; §3.3's
all-reduce T_a; its samples per device), the entry's values, the link between the two
groups (Eq. 8's slowest pair and largest latency), M and the heads' warm-ups.

Value (objective: :func:`planner.cost.closed_form.pipeline_closed_form_ms`, whose pieces -
stage figures, all-reduce, the closed-form boundary
:func:`~planner.cost.closed_form.boundary_occupancy_ms` and
:func:`~planner.cost.closed_form.link_period_ms`, memory - all come from
:mod:`planner.cost`): for the suffix plan putting the last l blocks into stages on devices
drawn from r, not one number but a front of entries (D, X; S, Y, N, FREE, TAIL). The round
time is ``D + X``, D = max over steps i of ``C_i + max((M - 1) pi_i + tau_i + w_i, W_i)``
(traversal tau: a stage's E_f + E_b, a link's 2 (occupancy + latency); steady-state period
pi: a stage's E_f + E_b, a link's :func:`~planner.cost.closed_form.link_period_ms`: its
occupancy point to point, plus the next boundary's occupancy on a switch (a stage's ports
carry both its boundaries), twice it plus every later boundary's medium time on a shared
medium; w_i the warm-up bubble and W_i the warm-up window of a stage), X = max_s (T_a^s -
PB_s). S is the suffix's summed traversal, O what the suffix adds to the period of the
link before it (:func:`~planner.cost.closed_form.link_downstream_ms`), Y the largest
per-device samples of its head group (a switch's busiest port carries max(Y_a, Y_b)
samples of a boundary, a point-to-point piece at most min(Y_a, Y_b), a shared medium all
B), N its stage count. Prepending a head (c0 = E_f + E_b, E_f0, E_b0, T_a0, samples Y0,
warm-up K = K(N + 1)) and the link to the entry's head (occupancy o from Y0 and Y, latency
lam, tau1 = 2 (o + lam), period pi1) gives exactly

    D' = max(M c0 + max(0, tau1 + S - (min(K, M) - 1) E_f0),   (head; its bubble)
             ceil(M / min(K, M)) (c0 + tau1 + S),              (head; its window)
             c0 + tau1 + (M - 1) pi1(o, O),                    (the link)
             c0 + tau1 + D)                                    (the suffix, shifted)
    X' = max(T_a0, X - E_b0 - (o + lam))   S' = c0 + tau1 + S   O' = downstream(o, O)
    Y' = Y0   N' = N + 1

non-decreasing in D, X, S and O. The bubble: the head's first backward waits for the first
micro-batch's round trip downstream (tau1 + S) while the head runs only K forwards; with
few micro-batches this is what the older closed form (Asteroid's, half-duplex links, no
bubble: ``PlanCost.closed_form_ms``) missed, misranking plans by up to 25%
(docs/planners.md). The window: 1F1B starts the head's forward of micro-batch j + K only
after its backward of j, a round trip c0 + tau1 + S after that forward began, so its M
micro-batches take ceil(M / K) round trips at least (without it the closed form priced a
plan of pipedream-resnet18 on orin-pair-2 at 298 ms that the schedule runs in 353, and the
DP missed the optimum by 2.64%).

Complexity: O(1) numpy work per candidate (the caller's arrays: rows x moves x l' x
front slots).
"""

from __future__ import annotations

import numpy as np
from edgepipe.planner.cost.closed_form import (
    boundary_occupancy_ms,
    link_downstream_ms,
    link_period_ms,
)


def compose(
    c0: np.ndarray, eb0: np.ndarray, ta0: np.ndarray, y0: np.ndarray,
    sub_d: np.ndarray, sub_x: np.ndarray, sub_s: np.ndarray, sub_o: np.ndarray,
    sub_y: np.ndarray, sub_n: np.ndarray,
    per_sample: np.ndarray, bw: np.ndarray, lat: np.ndarray,
    *, m: int, batch: int, topology: str, k_of: np.ndarray, rounds_of: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(D', X', S', O') of a head (c0 = E_f + E_b, E_b0, T_a0, samples Y0) prepended to
    entries (D, X, S, O, Y, N: ``sub_*``) over a link of ``per_sample`` bytes per sample,
    bandwidth ``bw`` and latency ``lat`` (the module docstring's recurrence; arrays
    broadcast together). ``k_of[n]`` is the in-flight micro-batches of the head of an
    n-stage suffix, ``rounds_of[n]`` its window's round trips ceil(M / min(K, M)) when it
    heads n + 1 stages."""
    with np.errstate(invalid="ignore"):
        occ = boundary_occupancy_ms(per_sample, y0, sub_y, batch, bw, topology)
        one_way = occ + lat  # (l, T, l', f)
        tau1 = 2 * one_way
        rest = tau1 + sub_s
        ef0 = c0 - eb0
        bubble = np.maximum(0.0, rest - (k_of[sub_n + 1] - 1) * ef0)
        s_new = c0 + rest
        d_new = np.maximum(
            np.maximum(
                np.maximum(m * c0 + bubble, rounds_of[sub_n] * s_new),
                c0 + tau1 + (m - 1) * link_period_ms(occ, sub_o, topology),
            ),
            c0 + tau1 + sub_d,
        )
        x_new = np.maximum(ta0, sub_x - eb0 - one_way)
        o_new = link_downstream_ms(occ, sub_o, topology)
    return d_new, x_new, s_new, o_new
