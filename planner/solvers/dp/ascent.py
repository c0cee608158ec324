"""The step schedule shared by the DP's Lagrangian bounds (Zp, :mod:`planner.solvers.dp.prices`;
Zw, :mod:`planner.solvers.dp.block_weights`): projected subgradient ascent with Polyak's step toward
a target, its scale halved after ``PATIENCE`` steps without a new best."""

from __future__ import annotations

from dataclasses import dataclass

#: steps without a new best after which the scale halves
PATIENCE = 3


@dataclass
class StepScale:
    """The best dual value so far and the step scale (from 1, halving)."""

    best: float = float("-inf")
    scale: float = 1.0
    stale: int = 0

    def record(self, value: float) -> None:
        """Take one step's dual value: a new best resets the count, else after
        ``PATIENCE`` steps without one the scale halves."""
        if value > self.best:
            self.best, self.stale = value, 0
            return
        self.stale += 1
        if self.stale >= PATIENCE:
            self.scale, self.stale = self.scale / 2, 0

    def done(self, target: float, min_step: float) -> bool:
        """Whether to stop: the best exceeds ``target``, or the scale fell below
        ``min_step``."""
        return self.best > target or self.scale < min_step
