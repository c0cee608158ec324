"""Specification of where a lab profile paces (executor/lab/profiling.py through the
profiler's ``pace``; docs/lab.md, "Lab profiles"): a pace point at the start of every
round of a block's timing loop, then an untimed forward that takes the round's cold
start, and never a pace point inside a timed forward or backward, so blocks are timed
warm, as a paced run's action runs its blocks one after another. A scripted block and
clock give exact figures."""

from __future__ import annotations

import pytest
import torch
from edgepipe.executor.profiling.profiler import profile_model, time_block
from torch import nn

#: what a pace point would add to a timed interval that held it (ms of the fake clock)
PACE_MS = 1000.0
#: per batch size (1, 2), the timed forwards and backwards of two rounds: the scripted
#: block's own work (the clock's seconds back to ms: equal up to rounding)
EXPECTED = [
    (pytest.approx([1.0, 1.0]), pytest.approx([2.0, 2.0])),
    (pytest.approx([2.0, 2.0]), pytest.approx([4.0, 4.0])),
]


class Scripted(nn.Module):
    """A block whose forward at batch ``b`` spends ``b`` ms of ``clock`` and whose
    backward spends ``2 b``, each logged in ``log`` (``F<b>``, ``B<b>``)."""

    def __init__(self, log: list[str], clock: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.log, self.clock = log, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = len(x)
        self.log.append(f"F{b}")
        self.clock[0] += b
        out = x * self.w

        def backward(grad: torch.Tensor) -> None:
            self.log.append(f"B{b}")
            self.clock[0] += 2 * b

        out.register_hook(backward)
        return out


def run(paced: bool) -> tuple[list[str], list[tuple[list[float], list[float]]]]:
    """``time_block`` over batch sizes 1 and 2, 1 warm-up round and 2 timed ones, on the
    scripted clock (ms); a pace point logs ``pace`` and advances the clock by
    ``PACE_MS``."""
    log: list[str] = []
    clock = [0.0]

    def pace() -> None:
        log.append("pace")
        clock[0] += PACE_MS

    xs = [torch.zeros(b, 1, requires_grad=True) for b in (1, 2)]
    samples = time_block(Scripted(log, clock), xs, warmup=1, repeats=2,
                         clock=lambda: clock[0] / 1e3, pace=pace if paced else None)
    return log, samples


def test_each_round_starts_with_a_pace_point_and_an_untimed_forward() -> None:
    log, samples = run(paced=True)
    # 3 rounds: the pace point, the untimed forward at the first batch size, then the
    # timed forward and backward at each batch size in turn
    assert log == ["pace", "F1", "F1", "B1", "F2", "B2"] * 3
    # no pace point and no untimed forward inside a timed interval: each sample is the
    # block's own work, forward b ms and backward 2b ms at batch b
    assert samples == EXPECTED


def test_without_pace_the_loop_is_as_it_was() -> None:
    log, samples = run(paced=False)
    assert log == ["F1", "B1", "F2", "B2"] * 3
    assert samples == EXPECTED


def test_a_profile_paces_once_per_round_of_every_block() -> None:
    paces: list[int] = []
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    profile = profile_model(model, lambda b: torch.zeros(b, 3), [1, 2], "cpu", warmup=1,
                            repeats=2, num_threads=1, clock="thread",
                            pace=lambda: paces.append(1))
    # 3 blocks x (1 warm-up + 2 timed rounds); the sizes pass and the blocks' inputs
    # are not paced
    assert len(paces) == 9
    assert profile.timings["cpu"].repeats == 2
