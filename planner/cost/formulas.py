"""The cost model's closed formulas of one quantity each: a ring all-reduce, a point-to-point
transfer, a device's memory (and the samples and warm-up that fit it), and the replication
interval that hides a transfer. Elementwise on numpy arrays where they say so, so the
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
