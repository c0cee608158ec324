"""The tables the exact planner's programs and closed-form bounds are built from, once per
problem: per-class block times, memory and network figures (:class:`Tables`), the ring
all-reduce's linear coefficients (:func:`ring_coefficients`) and the stages' action
order of a schedule (:func:`stage_orders`). Every coefficient comes from
:mod:`planner.cost.model`, none is re-derived here."""

from __future__ import annotations

import numpy as np
from edgepipe.planner.cost.formulas import ring_allreduce_ms, transfer_ms
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.schedule import build, compute_actions
from edgepipe.planner.solvers.classes import DeviceClass, representative_pair


class Tables:
    """Per-class block and network tables shared by every (B, P) program of one problem.
    Every coefficient comes from :mod:`planner.cost.model` (its per-block figures, its
    closed-form pieces evaluated at unit arguments), none is re-derived here."""

    def __init__(self, problem: Problem, cm: CostModel, classes: list[DeviceClass]) -> None:
        self.problem, self.cm, self.classes = problem, cm, classes
        self.n_blocks = n_blocks = problem.model.num_blocks
        # per class: (L, max_batch + 1) forward / backward ms of each block at each batch
        self.tf = [np.diff(cm.fwd[c.type], axis=0) * c.slowdown for c in classes]
        self.tb = [np.diff(cm.bwd[c.type], axis=0) * c.slowdown for c in classes]
        #: per class the runtime's forward / backward ms per micro-batch on a used device
        #: (CostModel.device_times; docs/lab.md "Runtime work per action")
        self.wf = [cm.work[c.type][0] * c.slowdown for c in classes]
        self.wb = [cm.work[c.type][1] * c.slowdown for c in classes]
        self.static = np.array([cm.static_bytes(b, b + 1) for b in range(n_blocks)])
        self.saved = np.array([cm.saved_bytes(b, b + 1) for b in range(n_blocks)])
        self.replica = np.array([cm.replica_bytes(b, b + 1) for b in range(n_blocks)])
        self.grad = np.diff(cm.param_prefix)
        self.boundary = cm.boundary
        self.topology = problem.cluster.network.kind
        self.shared = cm.shared_medium  # the ring all-reduce's formula (cost.py)
        self.replicated = problem.config.replicated
        n_cls = len(classes)
        inv = np.full((n_cls, n_cls), np.nan)
        lat = np.full((n_cls, n_cls), np.nan)
        for a, ca in enumerate(classes):
            for b, cb in enumerate(classes):
                pair = representative_pair(ca, cb)
                if pair is not None:
                    # ms per byte and latency of the pair (cost.transfer_ms)
                    inv[a, b] = float(transfer_ms(1.0, cm.bw[pair], 0.0))
                    lat[a, b] = float(transfer_ms(0.0, cm.bw[pair], cm.lat[pair]))
        self.inv_bw, self.lat = inv, lat
        #: distinct ms-per-byte values of device pairs, ascending (v_0 < v_1 < ...)
        self.inv_values = sorted(set(inv[~np.isnan(inv)].tolist()))
        known = lat[~np.isnan(lat)]
        self.lat_lo = float(known.min()) if known.size else 0.0
        self.lat_hi = float(known.max()) if known.size else 0.0
        self.v_lo = self.inv_values[0] if self.inv_values else 0.0
        self.v_hi = self.inv_values[-1] if self.inv_values else 0.0
        #: per class, the least ms per byte to any other device (a lower bound on its
        #: per-byte time to whichever device it talks to)
        self.v_min = [float(np.nanmin(row)) if not np.isnan(row).all() else 0.0 for row in inv]
        self.uniform_bw = len(self.inv_values) <= 1
        self.uniform = self.uniform_bw and self.lat_lo == self.lat_hi
        #: per class, whether every block's times are non-decreasing in the batch size.
        #: Then splitting a class's samples in a stage evenly (counts differing by at
        #: most 1) is never worse: moving one sample from a device with y samples to one
        #: of the same class with y' <= y - 2 leaves both at or below the first device's
        #: old time and memory, and changes no other figure.
        self.monotone = [
            bool((np.diff(tf, axis=1) >= 0).all() and (np.diff(tb, axis=1) >= 0).all())
            for tf, tb in zip(self.tf, self.tb, strict=True)
        ]
        self.n_devices = sum(c.count for c in classes)


def ring_coefficients(group: int, shared: bool) -> tuple[float, float]:
    """The ring all-reduce of :func:`planner.cost.formulas.ring_allreduce_ms` over ``group``
    devices as ``(per gradient byte per ms-per-byte, per ms of latency)``: the formula is
    linear in W_p / bw and in the latency, so its value at unit arguments are the
    coefficients."""
    per_byte = float(ring_allreduce_ms(1.0, group, 1.0, 0.0, shared))
    per_lat = float(ring_allreduce_ms(0.0, group, 1.0, 1.0, shared))
    return per_byte, per_lat


def stage_orders(problem: Problem, batch: int, num_stages: int) -> list[list[tuple[str, int]]]:
    """Per stage its forwards and backwards in execution order, from the plan's schedule
    (:func:`planner.schedule.build` with the config's warm-ups), as the cost model runs
    them."""
    config = problem.config
    m_count = config.global_batch // batch
    warmups = [config.warmup_depth(p, num_stages, m_count) for p in range(num_stages)]
    schedule = build(config.schedule, warmups, m_count)
    return [
        # every forward and backward names its micro-batch (only REDUCE_GRAD has none)
        [(a.type.value, a.micro_batch) for a in compute_actions(acts) if a.micro_batch is not None]
        for acts in schedule
    ]
