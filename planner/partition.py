"""The decision a planner makes: micro-batch size and count, and per stage its block
range and its devices with their sample counts. Plain data, no figures: every figure of a
partition comes from :mod:`planner.cost.model`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageAssignment:
    """Stage running blocks ``[first, end)`` on ``devices``; device ``devices[i]`` takes
    ``samples[i]`` samples of every micro-batch (sum = micro-batch size)."""

    first: int
    end: int
    devices: tuple[str, ...]
    samples: tuple[int, ...]


@dataclass(frozen=True)
class Partition:
    micro_batch_size: int
    num_micro_batches: int
    stages: tuple[StageAssignment, ...]

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def used_devices(self) -> list[str]:
        return [d for s in self.stages for d in s.devices]
