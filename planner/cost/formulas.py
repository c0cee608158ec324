"""The cost model's closed formulas of one quantity each: a ring all-reduce, a point-to-point
transfer, a device's memory (and the samples and warm-up that fit it), and the replication
interval that hides a transfer, and the replication points a run of some steps takes and
sends. Elementwise on numpy arrays where they say so, so the
planners' tables evaluate them over whole grids.

All-reduce (reference/asteroid.md §3.3): ring over the g devices of a group,
``2(g-1)/g * W_p / bw_min + 2(g-1) * lat`` (the closed form's T_a); on a shared medium
the g concurrent transfers of each ring step share one channel, so ``2(g-1) * W_p / bw +
2(g-1) * lat``. Zero for g = 1. It runs as the executor runs it: once, after the stage's
last backward (``REDUCE_GRAD`` of :mod:`planner.schedule`), not in buckets overlapped with
the backward.

Memory per device (Eq. 3): ``(2 + k_opt) * W_p + K_p * y_d * A_p`` - weights, gradients
and k_opt optimizer buffers per parameter (SGD 0, momentum 1, Adam 2), plus the saved
activations of its y_d samples for each of the stage's K_p in-flight micro-batches
(A_p = sum of the stage's saved bytes per sample; K_p from
:meth:`TrainingConfig.warmup_depth`). The total must not exceed the device's usable memory.
"""

from __future__ import annotations

import math
import sys
from typing import NamedTuple

import numpy as np


def ring_allreduce_ms(grad_bytes, group_size, bw_min, lat_max, shared_medium: bool):
    """Ring all-reduce time (§3.3) of ``grad_bytes`` over ``group_size`` devices whose
    slowest pair moves ``bw_min`` bytes/ms with latency ``lat_max`` ms. Works on numpy
    arrays elementwise; 0 where the group has one device."""
    g = np.asarray(group_size, dtype=float)
    per_byte = 2 * (g - 1) if shared_medium else 2 * (g - 1) / np.maximum(g, 1)
    t = per_byte * np.asarray(grad_bytes) / bw_min + 2 * (g - 1) * lat_max
    return np.where(g > 1, t, 0.0)


def transfer_ms(num_bytes, bw, lat):
    """Point-to-point transfer of ``num_bytes`` at ``bw`` bytes/ms after ``lat`` ms."""
    return lat + num_bytes / bw


def stage_memory_bytes(static_bytes, warmup, samples, saved_per_sample):
    """Eq. 3: static state + ``warmup`` in-flight micro-batches of ``samples`` samples."""
    return static_bytes + warmup * samples * saved_per_sample


def samples_that_fit(budget, static_bytes, warmup, saved_per_sample, batch: int):
    """Eq. 3 solved for y: the most samples (<= ``batch``) a device of ``budget`` bytes can
    take with ``warmup`` micro-batches in flight; 0 if even the static state does not fit.
    Elementwise on numpy arrays."""
    room = np.asarray(budget) - static_bytes
    per = warmup * np.asarray(saved_per_sample, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        most = np.where(per > 0, np.floor(room / np.where(per > 0, per, 1)), batch)
    return np.clip(np.where(room < 0, 0, most), 0, batch).astype(np.int64)


def warmup_that_fits(budget, static_bytes, samples, saved_per_sample):
    """Eq. 3 solved for K: the deepest warm-up at which a device taking ``samples`` fits
    (inf when it holds no activations, -inf when the static state alone overflows)."""
    room = np.asarray(budget) - static_bytes
    per = np.asarray(samples) * np.asarray(saved_per_sample, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        depth = np.where(per > 0, np.floor(room / np.where(per > 0, per, 1)), np.inf)
    return np.where(room < 0, -np.inf, depth)


def hiding_interval(transfer_ms: float, iteration_ms: float) -> int:
    """The smallest replication interval k whose k steps hide a replication point's
    transfer: a point travels beside the steps of its interval (docs/fault-tolerance.md,
    "Points in flight"), so the commit that makes the next point waits
    max(0, transfer - k x iteration); k = max(1, ceil(transfer / iteration)). A transfer
    that never ends (``inf``, :func:`planner.cost.channels.background_ms` on a channel
    never free) is hidden by no interval: ``sys.maxsize`` (``make_plan`` caps it at the
    config's maximum)."""
    if not iteration_ms > 0:
        return 1
    if math.isinf(transfer_ms):
        return sys.maxsize
    return max(1, math.ceil(transfer_ms / iteration_ms))


def replication_points(resume: int, steps: int, interval: int) -> list[int]:
    """The candidate replication points (states, in steps applied) of a generation that
    runs steps ``resume .. steps - 1``: its start ``resume``, every multiple of
    ``interval`` after it, and ``steps`` (docs/fault-tolerance.md, "Durability").
    O(steps / interval)."""
    points = [resume]
    if interval > 0:
        points += range((resume // interval + 1) * interval, steps, interval)
    if steps > resume:
        points.append(steps)
    return points


class PointSchedule(NamedTuple):
    """The replication points a generation takes (:func:`point_schedule`)."""

    #: the points taken, ascending: every member acknowledges each; the last is ``steps``
    points: tuple[int, ...]
    #: the candidate points dropped: no member copies, sends or acknowledges them
    skipped: tuple[int, ...]
    #: whether the last point's replicas travel (else each member keeps only its own
    #: state of it, and acknowledges at once)
    final_sent: bool


def point_schedule(resume: int, steps: int, interval: int, transfer_ms: float,
                   iteration_ms: float) -> PointSchedule:
    """Which of :func:`replication_points` a generation takes so that it never waits
    for a point longer than its own steps take (issue 28; docs/fault-tolerance.md,
    "Short runs").

    Inputs: the generation's first step ``resume`` and the run's ``steps``; the plan's
    ``interval``; one point's predicted transfer ``transfer_ms``
    (:meth:`planner.cost.model.CostModel.replica_transfer_ms`: the background flow's
    time beside training) and the predicted step ``iteration_ms``. A point p before the
    last travels beside the steps after it up to the next point taken p', and the
    commit that makes p' waits for the rest, ``max(0, transfer - (p' - p) x
    iteration)`` ("Points in flight"). Rule, over the candidates from the last down:

    * a point p at the interval is **skipped** when ``transfer_ms > (steps - p) x
      iteration_ms``: its transfer outlasts every step the run has left, it could only
      be waited for; the waits between points the interval leaves are the interval's
      own price (:func:`planner.plan.interval_note` names it);
    * the start point ``resume`` is taken only when the steps up to the next point taken
      hide it, ``transfer_ms <= (p' - resume) x iteration_ms``: its distance to the
      interval's next multiple is where the generation happens to start, not a choice;
    * the last point (``steps``) has no step after it: it is always taken (every member
      keeps and acknowledges its own final state, which ends the run), but its replicas
      are **sent** only when waiting for them costs no more than the generation's
      steps, ``transfer_ms <= (steps - resume) x iteration_ms``.

    An ``inf`` or NaN transfer skips every point and sends none; a zero one (no ring
    replicas) keeps them all. At an interval of at least :func:`hiding_interval` every
    point taken before the last is hidden, so a generation's predicted wait is at most
    the last point's transfer, at most its steps' time. O(steps / interval)."""
    *before, last = replication_points(resume, steps, interval)
    kept: list[int] = []
    following = steps  # the next point taken after the one looked at
    for p in reversed(before):
        if transfer_ms <= ((following if p == resume else steps) - p) * iteration_ms:
            kept.insert(0, p)
            following = p
    taken = set(kept)
    return PointSchedule((*kept, last), tuple(p for p in before if p not in taken),
                         transfer_ms <= (steps - resume) * iteration_ms)
