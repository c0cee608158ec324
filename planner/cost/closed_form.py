"""The planners' closed form of a plan's round time (the DP's objective,
:func:`pipeline_closed_form_ms`) and its pieces for a stage boundary: the channel time of
one direction (:func:`boundary_occupancy_ms`), the steady-state period of the busiest
channel (:func:`link_period_ms`) and what the boundary before reads of it
(:func:`link_downstream_ms`). It extends Asteroid's closed form
(:func:`planner.cost.chain.closed_form_latency`; reference/asteroid.md §3) to full-duplex
links, channels shared by several boundaries, and 1F1B's warm-up.
"""

from __future__ import annotations

import numpy as np
from edgepipe.planner.cost.model import CostModel, PlanCost
from edgepipe.planner.partition import Partition


def boundary_occupancy_ms(per_sample_bytes, sent_max, received_max, batch, bw_min, topology):
    """Closed-form channel time of one direction of a stage boundary (the exact figure's
    :meth:`CostModel.link_transfer` when every pair has the slowest pair's rate
    ``bw_min``): a sender's pieces sum to its samples and a receiver's to its, so

        switched:       max(sent_max, received_max) x a / bw   (the most loaded port)
        point_to_point: min(sent_max, received_max) x a / bw   (bounds the largest piece)
        shared_medium:  batch x a / bw                         (all pieces, one medium)

    ``sent_max`` / ``received_max``: the largest per-device samples of the two groups;
    ``a``: the boundary's bytes per sample. Elementwise on numpy arrays. Exact for
    switched and shared medium with uniform bandwidth, an upper bound otherwise."""
    if topology == "shared_medium":
        samples = np.asarray(batch, dtype=float)
    elif topology == "switched":
        samples = np.maximum(sent_max, received_max)
    else:
        samples = np.minimum(sent_max, received_max)
    return np.asarray(per_sample_bytes) * samples / bw_min


def link_period_ms(occupancy, downstream, topology):
    """Channel time per micro-batch on the busiest channel a boundary uses, in steady
    state: point-to-point, activations and gradients travel on separate channels
    (``occupancy``); switched, a device's uplink carries its stage's activations out and
    its gradients back, so the receiving stage's ports also carry the next boundary
    (``occupancy + downstream``, downstream = that boundary's occupancy, 0 after the
    last stage); a shared medium carries both directions of this and every later
    boundary (``2 x occupancy + downstream``, downstream = the later boundaries' medium
    time). Elementwise on numpy arrays."""
    occupancy = np.asarray(occupancy)
    if topology == "point_to_point":
        return occupancy
    return occupancy * (2.0 if topology == "shared_medium" else 1.0) + downstream


def link_downstream_ms(occupancy, downstream, topology):
    """What :func:`link_period_ms` reads as ``downstream`` for the boundary before this
    one: this boundary's occupancy (switched), the medium time of this and every later
    boundary (shared medium: ``2 x occupancy + downstream``), 0 point to point."""
    occupancy = np.asarray(occupancy)
    if topology == "switched":
        return occupancy
    if topology == "shared_medium":
        return 2.0 * occupancy + downstream
    return np.zeros_like(occupancy)


def pipeline_closed_form_ms(cm: CostModel, partition: Partition,
                            cost: PlanCost | None = None) -> float:
    """The planners' closed-form round time of ``partition`` (the DP's objective): steps
    i = stage 0, link 0->1, stage 1, ... with traversal tau_i (stage: E_f + E_b; link:
    2 (occupancy + latency), :func:`boundary_occupancy_ms` over the groups' slowest pair
    and largest latency), steady-state period pi_i (stage: E_f + E_b; link:
    :func:`link_period_ms`, which on a switch adds the next boundary's occupancy and on a
    shared medium every later boundary's medium time), warm-up K_i and E_f^i:

        T = max_i [C_i + max((M - 1) pi_i + tau_i + w_i, W_i)] + max_s (T_a^s - PB_s)

    with C_i = sum_{j<i} tau_j, PB_s the summed backward traversal (E_b; a link's
    occupancy + latency) before stage s, and the warm-up bubble of a stage
    w_i = max(0, R_i - (min(K_i, M) - 1) E_f^i), R_i = sum_{j>i} tau_j: its first
    backward waits for the first micro-batch's round trip downstream while it runs only
    K_i forwards (0 for links and the last stage). W_i = ceil(M / min(K_i, M)) (tau_i +
    R_i) is a stage's warm-up window (0 for links): 1F1B starts its forward of
    micro-batch j + K_i only after the backward of j, which ends a whole round trip
    tau_i + R_i after that forward began, so M micro-batches take at least
    ceil(M / K_i) round trips (it binds when few micro-batches are in flight over slow
    links: pipedream-resnet18 on orin-pair-2 at micro-batch 1, a plan priced 298 ms
    without it that the schedule runs in 353 ms). With half-duplex links (pi = tau),
    w = 0 and no window it is Asteroid's closed form
    (:func:`planner.cost.chain.closed_form_latency`).
    O(P + g); ``cost``: ``cm.evaluate(partition)`` when the caller has it already."""
    cost = cost if cost is not None else cm.evaluate(partition)
    cluster = cm.problem.cluster
    topology = cluster.network.kind
    m = partition.num_micro_batches
    occs: list[tuple[float, float]] = []  # per boundary: occupancy, latency
    for stage, nxt in zip(partition.stages, partition.stages[1:], strict=False):
        ga = [cluster.index(d) for d in stage.devices]
        gb = [cluster.index(d) for d in nxt.devices]
        sub = np.ix_(ga, gb)
        occ = float(boundary_occupancy_ms(cm.boundary[stage.end - 1], max(stage.samples),
                                          max(nxt.samples), partition.micro_batch_size,
                                          cm.bw[sub].min(), topology))  # fmt: skip
        occs.append((occ, float(cm.lat[sub].max())))
    periods, downstream = [0.0] * len(occs), 0.0
    for q in range(len(occs) - 1, -1, -1):
        periods[q] = float(link_period_ms(occs[q][0], downstream, topology))
        downstream = float(link_downstream_ms(occs[q][0], downstream, topology))
    steps: list[tuple[float, float, float, float, float, int]] = []  # tau, pi, f, b, T_a, K
    for p, sc in enumerate(cost.stages):
        steps.append((sc.forward_ms + sc.backward_ms, sc.forward_ms + sc.backward_ms,
                      sc.forward_ms, sc.backward_ms, sc.allreduce_ms, sc.warmup))  # fmt: skip
        if p < len(occs):
            one_way = occs[p][0] + occs[p][1]
            steps.append((2 * one_way, periods[p], one_way, one_way, 0.0, 0))
    total_tau = sum(s[0] for s in steps)
    best_d, best_x, before, before_b = -np.inf, -np.inf, 0.0, 0.0
    for i, (tau, pi, f, b, ar, k) in enumerate(steps):
        bubble = window = 0.0
        if i % 2 == 0:
            rest = total_tau - before - tau
            bubble = max(0.0, rest - (min(k, m) - 1) * f)
            window = -(-m // min(k, m)) * (tau + rest)
            best_x = max(best_x, ar - before_b)
        best_d = max(best_d, before + max((m - 1) * pi + tau + bubble, window))
        before += tau
        before_b += b
    return best_d + best_x
