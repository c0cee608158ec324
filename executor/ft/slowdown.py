"""Slowdown detection with hysteresis (issue 8, item 4: a device that stays slower than
its profile by more than a threshold for several steps triggers re-partitioning; noise
never causes churn).

Pure logic, no torch and no clock: the coordinator feeds it, once per committed step,
every device's measured compute of that step and gets back the devices it declares
slowed (or sped up) with a factor for ``api.replan(plan, slowed={device: factor})``
(docs/fault-tolerance.md, "Re-planning"; the factor multiplies the device's
``slowdown``, so after the re-plan the new plan's prediction matches the device again).

Inputs:
    * ``expected_ms[d]``: the compute device ``d`` should spend per step under the plan
      it runs, :func:`expected_compute_ms`: the cost model's forward + backward time
      per micro-batch at its sample count (``plan.cost.stages[p].device_forward_ms[j]
      + device_backward_ms[j]``, planner/cost/model.py, the times the emulation waits out)
      times the M micro-batches, times the emulation's time scale ``k`` (1 on real
      devices);
    * per step ``t``: ``measured_ms[d]``, the step's F + B time of ``d``
      (``compute_ms`` of metrics.jsonl, docs/executor.md). Waits for neighbours,
      transfers, all-reduce and the optimizer step are not in it, so a slow device
      does not make the devices around it look slow;
    * per step, the devices whose figure is *no evidence*: in an emulated run, those
      whose real compute overran an emulated budget in that step (``overruns`` of
      executor/core/emulation.py). Their figure measures this machine (its load), not the
      emulated device, which by construction runs at its budgets; on a loaded host
      the fastest device, whose budgets are the smallest, overruns first and would
      otherwise be declared slowed and re-partitioned for the host's load.

Real devices (``calibrate``). On a real device the profile's times are this device's
only up to a factor (a profile taken on a loaded machine, another software stack, a
heat state), so the prediction is first *calibrated*: the ``calibration_steps`` steps
after the warm-up are not judged; each device's ratio ``measured / expected`` over
them is taken (its median), and every prediction is multiplied by the least of those
medians, ``c`` (the run's common factor: the fastest device relative to its profile).
From then on the recurrence below runs on ``measured / (c x expected)``. So a profile
that is off by a common factor triggers nothing; a device slower than the others,
relative to their profiles, by more than the threshold is declared (at the third judged
step when it already was during the calibration: its profile was wrong for it, and the
re-plan corrects the plan once), as is one that slows down later; so is one of several
devices that is faster than its profile (the others then read slow: the plan's
balance is off either way). A calibration step whose figure is 0 or less is no
evidence, and the calibration goes on until some device gave evidence. When, at one
step, every device still watched (two or more) would be declared in the same
direction, their relative speeds did not change (the host's load, a room's heat): the
common factor is multiplied by the median of their factors and their streaks are
cleared, and nothing is declared. A one-device plan has no such reference: its device
is declared. The emulation needs no calibration: its devices run at their budgets
times the known time scale.

State per device: the current *streak* - the ratios ``r = measured / expected`` of
the consecutive latest steps that were all slow (``r > threshold``) or all fast
(``r < 1 / threshold``) - and whether the device was already declared.

Recurrence, for each step ``t >= warmup_steps`` and device ``d`` not yet declared:
    no evidence -> the streak is left as it is (neither extended nor cleared);
    ``r = measured / expected``;
    slow if ``r > threshold``, fast if ``r < 1 / threshold``, else neither;
    neither -> the streak is cleared;
    slow (fast) -> ``r`` extends the streak if it is a slow (fast) streak, else starts
    a new one;
    when the streak reaches ``consecutive`` ratios, ``d`` is declared with
    ``factor = median(streak)`` and is not watched any more.

A detector serves one plan: after the re-plan the coordinator builds a new one from
the new plan (whose prediction includes the factor), so a declared device cannot be
declared again on the same evidence, and the new plan's first ``warmup_steps`` steps
(process-group rebuild, migrated state, cold caches) are not judged.

Defaults (:class:`SlowdownPolicy`): ``threshold`` 1.5 - a device must be at least 50%
slower (or, for "fast", 33% faster) than predicted; the emulation meets its budgets to
well within that whenever real compute fits (docs/executor.md, "Heterogeneity
emulation"), and real devices' throttling is a factor, not a few per cent.
``consecutive`` 3 steps - one or two slow steps (a garbage collection, another
process's burst) trigger nothing; a device 3x slower is declared at the third slow step
after the warm-up. ``warmup_steps`` 1 - step 0 of a plan carries start-up costs.
``calibration_steps`` 3 - a median of three steps, so one noisy step does not set the
factor (real devices only).

Complexity: O(devices) per step; state O(devices x max(consecutive, calibration_steps)).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

from edgepipe.planner.plan import Plan

Direction = Literal["slow", "fast"]


@dataclass(frozen=True)
class SlowdownPolicy:
    """When a device counts as slowed (module docstring: defaults and why)."""

    threshold: float = 1.5
    consecutive: int = 3
    warmup_steps: int = 1
    calibration_steps: int = 3

    def __post_init__(self) -> None:
        if self.calibration_steps < 1:
            raise ValueError(f"calibration_steps must be at least 1, got "
                             f"{self.calibration_steps}")
        if not self.threshold > 1.0:
            raise ValueError(f"threshold must exceed 1, got {self.threshold}")
        if self.consecutive < 1:
            raise ValueError(f"consecutive must be at least 1, got {self.consecutive}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")


@dataclass(frozen=True)
class Slowdown:
    """A device declared slowed (``factor`` > 1) or sped up (``factor`` < 1) at ``step``
    (the last step of the evidence), with the ratios that made the case."""

    device: str
    factor: float
    step: int
    ratios: tuple[float, ...]


@dataclass
class _Track:
    direction: Direction | None = None
    ratios: list[float] = field(default_factory=list)
    declared: bool = False


def expected_compute_ms(plan: Plan, time_scale: float = 1.0) -> dict[str, float]:
    """Each used device's predicted F + B time per step under ``plan`` (ms, times the
    emulation's ``time_scale``): M x (forward + backward per micro-batch at its
    sample count). O(devices)."""
    m = plan.partition.num_micro_batches
    expected = {}
    for stage, cost in zip(plan.partition.stages, plan.cost.stages, strict=True):
        for j, device in enumerate(stage.devices):
            per_micro_batch = cost.device_forward_ms[j] + cost.device_backward_ms[j]
            expected[device] = time_scale * m * per_micro_batch
    return expected


class SlowdownDetector:
    """Declares devices slowed after ``policy.consecutive`` slow steps (module
    docstring). ``expected_ms``: per device, its predicted compute per step (ms, > 0);
    ``calibrate``: real devices, whose predictions are scaled by the run's common
    factor measured over the first steps (module docstring, "Real devices")."""

    def __init__(
        self, expected_ms: Mapping[str, float], policy: SlowdownPolicy | None = None,
        *, calibrate: bool = False,
    ) -> None:
        bad = {d: e for d, e in expected_ms.items() if not e > 0}
        if bad:
            raise ValueError(f"expected compute must be positive: {bad}")
        self.expected = dict(expected_ms)
        self.policy = policy or SlowdownPolicy()
        self._tracks = {d: _Track() for d in self.expected}
        #: the common factor once calibrated (1 without calibration); None while measuring
        self.scale: float | None = None if calibrate else 1.0
        self.calibrating = calibrate
        self._calibration: dict[str, list[float]] = {d: [] for d in self.expected}

    def observe(self, step: int, measured_ms: Mapping[str, float],
                no_evidence: Collection[str] = ()) -> list[Slowdown]:
        """Feed step ``step``'s measured compute of every device; ``no_evidence``: the
        devices whose figure of this step does not count (module docstring). Returns
        the devices declared at this step (usually none), in the plan's device order."""
        missing = set(self.expected) - set(measured_ms)
        if missing:
            raise ValueError(f"step {step} has no compute figure for {sorted(missing)}")
        if step < self.policy.warmup_steps:
            return []
        if self.scale is None:
            self._calibrate(step, measured_ms, no_evidence)
            return []
        scale, theta = self.scale, self.policy.threshold
        declared = []
        watched = [d for d, t in self._tracks.items() if not t.declared]
        for device, expected in self.expected.items():
            track = self._tracks[device]
            if track.declared or device in no_evidence:
                continue
            ratio = measured_ms[device] / (scale * expected)
            direction: Direction | None = (
                "slow" if ratio > theta else "fast" if ratio < 1.0 / theta else None
            )
            if direction is None:
                track.direction, track.ratios = None, []
                continue
            if direction != track.direction:
                track.direction, track.ratios = direction, []
            track.ratios.append(ratio)
            if len(track.ratios) == self.policy.consecutive:
                track.declared = True
                declared.append(Slowdown(device, statistics.median(track.ratios), step,
                                         tuple(track.ratios)))
        if (self.calibrating and len(watched) >= 2
                and [s.device for s in declared] == watched
                and len({s.factor > 1 for s in declared}) == 1):
            # every device changed alike: their relative speeds, all a re-partition
            # could act on, did not; the common factor follows instead
            self.scale = scale * statistics.median(s.factor for s in declared)
            for device in watched:
                self._tracks[device] = _Track()
            return []
        return declared

    def _calibrate(self, step: int, measured_ms: Mapping[str, float],
                   no_evidence: Collection[str]) -> None:
        """One calibration step: record each device's ratio (a figure of 0 or less is no
        evidence); once the calibration steps have passed and some device gave evidence,
        the common factor is the least of the devices' median ratios."""
        for device, expected in self.expected.items():
            ratio = measured_ms[device] / expected
            if device not in no_evidence and ratio > 0:
                self._calibration[device].append(ratio)
        medians = [statistics.median(r) for r in self._calibration.values() if r]
        if medians and step + 1 >= self.policy.warmup_steps + self.policy.calibration_steps:
            self.scale = min(medians)

    def streak(self, device: str) -> tuple[float, ...]:
        """The current streak of ``device`` (its latest consecutive slow or fast
        ratios)."""
        return tuple(self._tracks[device].ratios)


class SlowdownWatch:
    """The coordinator's slowdown detection over a run that changes plans: one
    :class:`SlowdownDetector` per plan (a new one, with its warm-up, whenever the plan
    changes), fed each committed step's compute per device; the declared slowdowns wait
    in :meth:`take` until the coordinator re-plans for them at a step boundary.

    ``time_scale``: the emulation's; ``None`` on real devices, whose predictions each
    plan's detector calibrates (module docstring, "Real devices")."""

    def __init__(self, time_scale: float | None, policy: SlowdownPolicy | None = None) -> None:
        self.time_scale, self.policy = time_scale, policy or SlowdownPolicy()
        self._plan_id: str | None = None
        self._detector: SlowdownDetector | None = None
        self._first_step = 0
        self._pending: dict[str, float] = {}
        self.declared: list[Slowdown] = []

    def observe(self, plan: Plan, step: int, compute_ms: Mapping[str, float],
                overran: Collection[str] = ()) -> None:
        """Step ``step`` under ``plan`` has committed (a replay may feed it again);
        ``compute_ms``: every used device's measured F + B time of it; ``overran``: the
        devices whose emulation overran a budget in it (no evidence). Steps count from
        the plan's first (its warm-up)."""
        if plan.id != self._plan_id:
            self._plan_id = plan.id
            self._detector = SlowdownDetector(
                expected_compute_ms(plan, self.time_scale or 1.0), self.policy,
                calibrate=self.time_scale is None)
            self._first_step = step
        assert self._detector is not None
        mine = {d: compute_ms[d] for d in self._detector.expected}
        for found in self._detector.observe(step - self._first_step, mine, overran):
            self.declared.append(found)
            self._pending[found.device] = found.factor

    def take(self) -> dict[str, float]:
        """The slowdowns declared since the last call (device -> factor)."""
        pending, self._pending = self._pending, {}
        return pending
