"""Measuring on a busy machine: repeat a profile until it is stable, and say when it is not.

A *round* is one whole profile of the model (every block, every batch size, ``repeats``
timed runs each, summarised by the profiler). Its *total* is the sum over blocks and batch
sizes of forward + backward milliseconds: one number that a burst of load from other
processes moves. Rounds are taken until the last ``window`` totals agree, i.e. their
*spread* ``(max - min) / median`` is at most ``max_spread``, or ``max_rounds`` were taken
(then the profile is *unstable* and says so). The result takes, per block, batch size and
pass, the median over the rounds of that window.

Besides the spread, two facts make a warning (:func:`warnings`): the machine is *busy*
(its 1-minute load average, which counts this profiler's own thread, is above the number
of cores this process may use), and a time is *implausible*: a forward of 0 ms, a
backward of 0 ms for a block with parameters, or a backward shorter than the forward
for a block with parameters after the first (its backward computes both the input's and
the weights' gradients, two products the size of its forward's one, so it takes about
twice as long; under interference the order can flip).

Pure functions over numbers and profiles; no torch.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from edgepipe.planner.inputs.profile import ModelProfile, Noise, Timing


@dataclass(frozen=True)
class NoisePolicy:
    """When rounds count as stable: the last ``window`` totals within ``max_spread``
    (relative); at most ``max_rounds`` rounds."""

    max_spread: float = 0.05
    window: int = 3
    max_rounds: int = 8

    def __post_init__(self) -> None:
        if not self.max_spread > 0 or not 1 <= self.window <= self.max_rounds:
            raise ValueError(
                f"need max_spread > 0 and 1 <= window <= max_rounds, got {self.max_spread}, "
                f"{self.window}, {self.max_rounds}"
            )


def spread(totals: Sequence[float]) -> float:
    """``(max - min) / median`` of ``totals`` (0 for one total or a median of 0)."""
    mid = statistics.median(totals)
    return 0.0 if mid <= 0 else (max(totals) - min(totals)) / mid


def settled(totals: Sequence[float], policy: NoisePolicy) -> bool:
    """Whether to stop taking rounds after ``totals``: the last ``window`` agree within
    ``max_spread``, or ``max_rounds`` were taken. O(window)."""
    if len(totals) >= policy.max_rounds:
        return True
    return len(totals) >= policy.window and spread(totals[-policy.window:]) <= policy.max_spread


def busy(load_1min: float, cores: int) -> bool:
    """Whether the machine is busy: more runnable work (1-minute load average) than the
    cores this process may use."""
    return load_1min > cores


def round_total(timing: Timing) -> float:
    """Sum over blocks and batch sizes of forward + backward milliseconds."""
    return sum(map(sum, timing.forward_ms)) + sum(map(sum, timing.backward_ms))


def combine(rounds: Sequence[Timing], noise: Noise) -> Timing:
    """Per block, batch size and pass, the median of ``rounds``; the spreads (each
    round's inter-quartile range) likewise; ``noise`` recorded. O(rounds x blocks x
    batch sizes)."""

    def median_of(pick: Callable[[Timing], tuple[tuple[float, ...], ...] | None]) -> (
        tuple[tuple[float, ...], ...] | None
    ):
        mats = [pick(t) for t in rounds]
        if any(m is None for m in mats):
            return None
        return tuple(
            tuple(round(statistics.median(vals), 4) for vals in zip(*rows, strict=True))
            for rows in zip(*mats, strict=True)
        )

    forward = median_of(lambda t: t.forward_ms)
    backward = median_of(lambda t: t.backward_ms)
    assert forward is not None and backward is not None
    return replace(
        rounds[-1],
        forward_ms=forward,
        backward_ms=backward,
        forward_spread_ms=median_of(lambda t: t.forward_spread_ms),
        backward_spread_ms=median_of(lambda t: t.backward_spread_ms),
        noise=noise,
    )


def measure_until_stable(
    measure: Callable[[], ModelProfile],
    device_type: str,
    policy: NoisePolicy,
    load: Callable[[], float] = lambda: os.getloadavg()[0],
    on_round: Callable[[int, float | None], None] | None = None,
) -> ModelProfile:
    """Take rounds of ``measure`` (each a whole profile timed under ``device_type``) until
    :func:`settled`; return the last round's profile with :func:`combine`'s timing of the
    last ``window`` rounds, which records rounds, spread, the highest load average seen
    and whether it settled within ``max_spread``. ``on_round(rounds, spread so far)``
    after each round. O(rounds x one profile)."""
    timings: list[Timing] = []
    totals: list[float] = []
    peak_load = load()
    last: ModelProfile | None = None
    while not settled(totals, policy):
        last = measure()
        timings.append(last.timings[device_type])
        totals.append(round_total(timings[-1]))
        peak_load = max(peak_load, load())
        if on_round is not None:
            on_round(len(totals), spread(totals[-policy.window:]) if len(totals) > 1 else None)
    assert last is not None
    window = totals[-policy.window:]
    measured = spread(window)
    noise = Noise(
        rounds=len(totals),
        spread=round(measured, 4),
        load_average=round(peak_load, 2),
        stable=measured <= policy.max_spread,
    )
    combined = combine(timings[-policy.window:], noise)
    return replace(last, timings={**last.timings, device_type: combined})


def warnings(
    profile: ModelProfile,
    device_type: str,
    policy: NoisePolicy,
    cores: int | None = None,
    wall_clock: bool = True,
) -> list[str]:
    """One line per reason to doubt ``profile``'s timing of ``device_type``: a busy
    machine (for a ``wall_clock`` timing only: a thread's CPU time does not count the
    time other processes hold its core), rounds that never settled, implausible times
    (module docstring)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    timing = profile.timings[device_type]
    out = []
    noise = timing.noise
    if wall_clock and noise is not None and busy(noise.load_average, cores):
        out.append(
            f"the machine is busy (load average {noise.load_average} on {cores} cores) while "
            f"profiling {device_type}: times may be too long"
        )
    if noise is not None and not noise.stable:
        out.append(
            f"{device_type}: the last {min(policy.window, noise.rounds)} of {noise.rounds} "
            f"rounds still differ by {noise.spread:.0%} (more than {policy.max_spread:.0%}): "
            "the machine is too noisy to measure; profile again when it is quieter"
        )
    odd = implausible(profile, device_type)
    if odd:
        more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
        out.append(f"{device_type}: implausible times: {'; '.join(odd[:3])}{more}")
    return out


def implausible(profile: ModelProfile, device_type: str) -> list[str]:
    """Each implausible time of ``device_type``'s timing, as ``block b at batch n:
    why`` (module docstring). O(blocks x batch sizes)."""
    timing = profile.timings[device_type]
    out = []
    for b, block in enumerate(profile.blocks):
        for j, batch in enumerate(timing.batch_sizes):
            fwd, bwd = timing.forward_ms[b][j], timing.backward_ms[b][j]
            where = f"block {block.name} at batch {batch}"
            if fwd <= 0:
                out.append(f"{where}: forward 0 ms")
            elif block.param_bytes > 0 and bwd <= 0:
                out.append(f"{where}: backward 0 ms")
            elif block.param_bytes > 0 and b > 0 and bwd < fwd:
                out.append(f"{where}: backward {bwd:g} ms < forward {fwd:g} ms")
    return out
