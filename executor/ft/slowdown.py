"""Slowdown detection with hysteresis (issue 8, item 4; issue 27: a device that stays
slower than its profile by more than a threshold over most of a window of steps
triggers re-partitioning; noise - jitter, bursts of a few steps, the host's load - never
does).

Pure logic, no torch and no clock: the coordinator feeds it, once per committed step,
every device's measured compute of that step and gets back the devices it declares
slowed (or sped up) with a factor for ``api.replan(plan, slowed={device: factor})``
(docs/fault-tolerance.md, "Slowdown"; the factor multiplies the device's
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
      emulated device, which by construction runs at its budgets. A figure of 0 or
      less is no evidence either.

State per device: its *window*, the raw ratios ``r = measured / expected`` of its last
``W`` steps with evidence (``window``, oldest dropped), and whether it was declared.

Reference ``c`` (what "on time" is): with the emulation, 1 (its devices run at their
budgets times the known time scale). On real devices (``calibrate``) the profile's
times are this device's only up to a factor (a profile taken on a loaded machine,
another software stack, a heat state), so the prediction is first *calibrated*: once
some device's window is full (``W`` steps after the warm-up, none judged before),
``c`` = the lower median of the full windows' medians (with two devices, the faster
relative to its profile). It is measured once: a reference measured again at every
step would, sooner or later, be drawn from the low tail of the noise just as some
device's window is drawn from its high tail. A profile off by a common factor thus
triggers nothing.

Decision, at each step ``t >= warmup_steps`` once ``c`` is known, after appending the
step's evidence: each device's *speed* ``s`` = the median of its window padded to ``W``
ratios with on-time ones (1), divided by ``c``. So a window that is not full yet needs
a majority of the ``W`` steps too: ``s`` exceeds a threshold only when more than half
of the last ``W`` steps did.
    ``s > threshold`` -> slow; ``s < 1 / fast_threshold`` -> fast (the exit side of
    the hysteresis: a device faster than its prediction costs the plan little, and a
    device slowed earlier that comes back only part of the way stays as planned);
    with the emulation, a slow or fast device is declared. On real devices, when the
    lower median of the devices' speeds (two or more devices) is slow, or fast, most
    devices moved alike (the host's load, a room's heat; with two devices, the faster
    one moved too): their relative speeds, all a re-partition could act on, are what
    is left to judge, so ``c`` is multiplied by that lower median, the windows
    restart, and nothing is declared; else a slow (fast) device is declared only if
    ``s`` is also beyond the threshold relative to the lower median of the other
    devices' speeds (they did not move with it); a one-device plan has no other device
    and is declared on ``s``.
    factor = the median of the window's ratios (divided by ``c``) beyond the threshold
    in that direction (the slowed speed, not the crossing value).
So bursts of up to ``W // 2`` steps, and jitter that keeps the window's median within
the thresholds, are never declared, however often they recur; a device that really
slows by more than the threshold is declared at its ``W // 2 + 1``-th slow step. A
normal step does not clear the evidence and a slow one does not make it: the
hysteresis in time; the two thresholds are the hysteresis in level.

Cool-down: a detector serves one plan. After a re-partition the coordinator builds a
new one from the new plan (whose prediction includes the factor), with empty windows:
its first ``warmup_steps`` steps (process-group rebuild, migrated state, cold caches)
are not judged, and no device can be declared before ``W // 2 + 1`` more steps
(``W`` more on real devices, which calibrate again). A re-partition that would not
change the plan is skipped (executor/ft/recovery.py, :meth:`Supervisor.repartition`):
the detector then takes the factor into the device's prediction and restarts its
window (:meth:`SlowdownDetector.absorb`), the same cool-down without an abort.

Defaults (:class:`SlowdownPolicy`): ``threshold`` 1.5 - a device must be at least 50%
slower than predicted; ``fast_threshold`` 2 - or run in half its predicted time; the
emulation meets its budgets to well within that whenever real compute fits
(docs/executor.md, "Heterogeneity emulation"), and real devices' throttling is a
factor, not a few per cent.
``window`` 9 steps - a burst of up to 4 steps (a garbage collection, another process's
compile) triggers nothing; a device 2x slower is declared at its fifth slow step; the
previous rule (3 consecutive slow steps) re-partitioned 3 times in a 40-step run on a
noisy machine (issue 27). ``warmup_steps`` 1 - step 0 of a plan carries start-up costs.
Checked on exact sequences (tests/unit/test_slowdown_hysteresis.py; offline, 200 seeds
x 300 steps, 2 and 3 devices): every device within +-30% of its prediction, with or
without bursts of 4 steps at 2.2x every 10 steps on one device or on all at once,
declared nothing; a device 2x slower (same jitter) was declared first, within 12 steps.

Complexity: O(devices x W) per step; state O(devices x W).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from edgepipe.planner.plan import Plan


@dataclass(frozen=True)
class SlowdownPolicy:
    """When a device counts as slowed (module docstring: defaults and why)."""

    threshold: float = 1.5
    fast_threshold: float = 2.0
    window: int = 9
    warmup_steps: int = 1

    def __post_init__(self) -> None:
        if not self.threshold > 1.0:
            raise ValueError(f"threshold must exceed 1, got {self.threshold}")
        if not self.fast_threshold > 1.0:
            raise ValueError(f"fast_threshold must exceed 1, got {self.fast_threshold}")
        if self.window < 1:
            raise ValueError(f"window must be at least 1, got {self.window}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")


@dataclass(frozen=True)
class Slowdown:
    """A device declared slowed (``factor`` > 1) or sped up (``factor`` < 1) at ``step``
    (the last step of the evidence), with its window's ratios (divided by the
    reference) that made the case."""

    device: str
    factor: float
    step: int
    ratios: tuple[float, ...]


@dataclass
class _Track:
    ratios: deque[float] = field(default_factory=deque)
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
    """Declares a device slowed once the median of its last ``policy.window`` steps
    exceeds the threshold (module docstring). ``expected_ms``: per device, its predicted
    compute per step (ms, > 0); ``calibrate``: real devices, judged against the
    reference the devices themselves set (module docstring, "Reference")."""

    def __init__(
        self, expected_ms: Mapping[str, float], policy: SlowdownPolicy | None = None,
        *, calibrate: bool = False,
    ) -> None:
        bad = {d: e for d, e in expected_ms.items() if not e > 0}
        if bad:
            raise ValueError(f"expected compute must be positive: {bad}")
        self.expected = dict(expected_ms)
        self.policy = policy or SlowdownPolicy()
        self.calibrate = calibrate
        self._tracks = {d: self._track() for d in self.expected}
        #: the reference ``c`` (module docstring); None while it is being measured
        self.scale: float | None = None if calibrate else 1.0

    def _track(self) -> _Track:
        return _Track(deque(maxlen=self.policy.window))

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
        for device, track in self._tracks.items():
            ratio = measured_ms[device] / self.expected[device]
            if not track.declared and device not in no_evidence and ratio > 0:
                track.ratios.append(ratio)
        if self.scale is None:
            self.scale = self._calibrated()
            return []
        watched = {d: self._speed(d) for d, t in self._tracks.items() if not t.declared}
        slow, fast = self.policy.threshold, 1.0 / self.policy.fast_threshold
        beyond = {d: s for d, s in watched.items() if s > slow or s < fast}
        if not self.calibrate:
            return [self._declare(d, step, s > 1.0) for d, s in beyond.items()]
        typical = statistics.median_low(watched.values()) if len(watched) >= 2 else 1.0
        if typical > slow or typical < fast:
            # most devices changed alike (the host's load): their relative speeds, all a
            # re-partition could act on, did not; the reference follows instead
            self.scale *= typical
            for device in watched:
                self._tracks[device] = self._track()
            return []
        declared = []
        for device, speed in beyond.items():
            others = [s for d, s in watched.items() if d != device]
            if others and not self._apart(speed, statistics.median_low(others)):
                continue  # the others moved alike: the host, not this device
            declared.append(self._declare(device, step, speed > 1.0))
        return declared

    def _calibrated(self) -> float | None:
        """``c`` once some device's window is full: the lower median of the full
        windows' medians (module docstring, "Reference"); 1 with the emulation."""
        if not self.calibrate:
            return 1.0
        full = [statistics.median(t.ratios) for t in self._tracks.values()
                if len(t.ratios) == self.policy.window]
        return statistics.median_low(full) if full else None

    def _speed(self, device: str) -> float:
        """The median of ``device``'s window padded to ``W`` ratios with on-time ones,
        divided by the reference (module docstring, "Decision")."""
        assert self.scale is not None
        ratios = [r / self.scale for r in self._tracks[device].ratios]
        return statistics.median(ratios + [1.0] * (self.policy.window - len(ratios)))

    def _apart(self, speed: float, others: float) -> bool:
        """Whether ``speed`` is beyond the threshold relative to the others' too."""
        return (speed > 1.0 and speed / others > self.policy.threshold) or (
            speed < 1.0 and speed / others < 1.0 / self.policy.fast_threshold)

    def _declare(self, device: str, step: int, slow: bool) -> Slowdown:
        """Declare ``device`` (not watched any more): factor = the median of its window's
        ratios beyond the threshold in that direction."""
        assert self.scale is not None
        self._tracks[device].declared = True
        slowest, fastest = self.policy.threshold, 1.0 / self.policy.fast_threshold
        ratios = tuple(r / self.scale for r in self._tracks[device].ratios)
        beyond = [r for r in ratios if (r > slowest if slow else r < fastest)]
        return Slowdown(device, statistics.median(beyond), step, ratios)

    def absorb(self, device: str, factor: float) -> None:
        """The re-partition for ``device`` at ``factor`` was skipped (it would not
        change the plan): predict its compute ``factor`` x slower from now on and
        restart its window (module docstring, "Cool-down")."""
        self.expected[device] *= factor
        self._tracks[device] = self._track()

    def window(self, device: str) -> tuple[float, ...]:
        """The raw ratios (measured / expected) of ``device``'s window, oldest first."""
        return tuple(self._tracks[device].ratios)


class SlowdownWatch:
    """The coordinator's slowdown detection over a run that changes plans: one
    :class:`SlowdownDetector` per plan (a new one, with its warm-up, whenever the plan
    changes), fed each committed step's compute per device; the declared slowdowns wait
    in :meth:`take` until the coordinator re-plans for them at a step boundary.

    ``time_scale``: the emulation's; ``None`` on real devices, whose predictions each
    plan's detector calibrates (module docstring, "Reference")."""

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

    def keep(self, slowed: Mapping[str, float]) -> None:
        """The re-partition for ``slowed`` (what :meth:`take` returned) was skipped, the
        plan stands: its detector takes the factors into the devices' predictions and
        restarts their windows (:meth:`SlowdownDetector.absorb`)."""
        assert self._detector is not None
        for device, factor in slowed.items():
            self._detector.absorb(device, factor)
