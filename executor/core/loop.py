"""The one training loop of a rank, with hooks: a plain run passes none, a recovering
run (:mod:`executor.ft.generation`) supplies its commit, checkpoint parts and
replication through them, as torchft plugs into torchtitan's trainer (one loop,
``trainer.py``).

Inputs: the rank's :class:`~executor.core.runtime.StageRuntime` (its action list, links,
group, optimizer, ``check``), its :class:`Feed` (dataset rows, layout, data seed), the
run's store and the :class:`StepHooks`. State: none of its own (the runtime's module and optimizer,
the hooks' own). Per step ``t`` of ``first .. end - 1``:

1. ``check()`` (an aborted generation or a fenced device stops here);
2. the step's rows: :func:`executor.core.data.step_indices` (``t``, the global batch,
   the dataset's size, the data seed), this rank's samples of every micro-batch
   (inputs on the first stage, targets on the last);
3. :meth:`StepHooks.before_compute` (both runs point their fault hook,
   :class:`executor.ft.faults.FaultHook`, at the step), then
   :meth:`StageRuntime.compute`: every action of the schedule, no optimizer step;
4. :meth:`StepHooks.commit`: the step's commit point (a recovering run votes and waits
   for the coordinator's commit; a plain run has none);
5. ``check()``, then :meth:`StageRuntime.apply` (the optimizer step);
6. :meth:`StepHooks.after_apply`, then the metrics payload
   (:func:`executor.core.metrics.rank_payload` and what the hook returned), published as
   ``metrics/<t>/<rank>``;
7. :meth:`StepHooks.after_metrics`.

Complexity: O(steps x the rank's actions) plus whatever the hooks do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from edgepipe.executor.core import data
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.metrics import rank_payload
from edgepipe.executor.core.runtime import StageRuntime

#: this rank's global sample indices of every micro-batch of a step
Rows = list[np.ndarray]


@dataclass(frozen=True)
class Feed:
    """Where a rank's rows of each step come from (module docstring, step 2)."""

    layout: RankLayout
    me: RankInfo
    rows: data.Rows
    device: torch.device
    seed: int

    def batch(self, step: int) -> tuple[Rows, list[torch.Tensor] | None,
                                        list[torch.Tensor] | None]:
        """This rank's sample indices of every micro-batch of ``step``, and their inputs
        (first stage) and targets (last stage) on the rank's device."""
        layout, me, b = self.layout, self.me, self.layout.micro_batch_size
        idx = data.step_indices(step, layout.global_batch, self.rows.size, self.seed)
        mine = [idx[m * b + me.offset : m * b + me.offset + me.samples]
                for m in range(layout.num_micro_batches)]
        first, last = me.stage == 0, me.stage == layout.num_stages - 1
        inputs = [self.rows.inputs(i).to(self.device) for i in mine] if first else None
        targets = [self.rows.targets(i).to(self.device) for i in mine] if last else None
        return mine, inputs, targets


class StepHooks:
    """What a run adds to the loop's steps (module docstring); this base adds nothing
    (every hook returns at once)."""

    def before_compute(self, step: int) -> None:
        """Before the step's first action, once its rows are on the device."""

    def commit(self, step: int) -> None:
        """Between the step's compute and its optimizer step: its commit point."""

    def after_apply(self, step: int, mine: Rows) -> dict[str, Any]:
        """After the optimizer step, before the metrics are published: what to add to the
        step's metrics payload; ``mine`` are the rank's sample indices of the step."""
        return {}

    def after_metrics(self, step: int) -> None:
        """After the step's metrics are published."""


def run_steps(first: int, end: int, runtime: StageRuntime, feed: Feed, store: dist.Store,
              hooks: StepHooks) -> None:
    """Run steps ``first .. end - 1`` of the rank (module docstring): the one loop of
    every worker."""
    for step in range(first, end):
        runtime.check()
        mine, inputs, targets = feed.batch(step)
        hooks.before_compute(step)
        record = runtime.compute(step, inputs, targets)
        hooks.commit(step)
        runtime.check()
        runtime.apply(record)
        extra = hooks.after_apply(step, mine)
        payload = {**rank_payload(record, feed.device), **extra}
        store.set(f"metrics/{step}/{runtime.rank}", json.dumps(payload))
        hooks.after_metrics(step)
