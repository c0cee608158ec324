"""Rank order, sample slices, interval re-slicing and the sampler, worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from edgepipe.executor.core.data import step_indices
from edgepipe.executor.core.layout import Overlap, RankInfo, overlaps
from edgepipe.planner.errors import InputError


def stage(first_rank: int, samples: list[int], stage_index: int = 0) -> list[RankInfo]:
    out, offset = [], 0
    for j, y in enumerate(samples):
        out.append(RankInfo(first_rank + j, f"d{first_rank + j}", stage_index, j, offset, y))
        offset += y
    return out


def test_two_devices_feeding_one_send_their_own_rows():
    # stage 0: d0 rows [0,1), d1 rows [1,3); stage 1: d2 rows [0,3)
    assert overlaps(stage(0, [1, 2]), stage(2, [3], 1)) == [
        Overlap(0, 2, 0, 1),
        Overlap(1, 2, 1, 3),
    ]


def test_unequal_widths_resliced_by_interval_overlap():
    # [0,2) [2,3)  ->  [0,1) [1,2) [2,3)
    assert overlaps(stage(0, [2, 1]), stage(2, [1, 1, 1], 1)) == [
        Overlap(0, 2, 0, 1),
        Overlap(0, 3, 1, 2),
        Overlap(1, 4, 2, 3),
    ]
    # [0,1) [1,4) [4,6)  ->  [0,3) [3,6)
    assert overlaps(stage(0, [1, 3, 2]), stage(3, [3, 3], 1)) == [
        Overlap(0, 3, 0, 1),
        Overlap(1, 3, 1, 3),
        Overlap(1, 4, 3, 4),
        Overlap(2, 4, 4, 6),
    ]


def test_every_row_travels_exactly_once():
    pieces = overlaps(stage(0, [3, 1, 4]), stage(3, [2, 5, 1], 1))
    rows = sorted(r for o in pieces for r in range(o.start, o.end))
    assert rows == list(range(8))


def test_sampler_follows_the_spec_and_uses_every_sample_once_per_epoch():
    n, b, seed = 10, 4, 7
    # steps_per_epoch = 10 // 4 = 2; the 2 leftover samples of each epoch are unused
    order0 = np.random.default_rng(np.random.SeedSequence((seed, 0))).permutation(n)
    order1 = np.random.default_rng(np.random.SeedSequence((seed, 1))).permutation(n)
    assert list(step_indices(0, b, n, seed)) == list(order0[0:4])
    assert list(step_indices(1, b, n, seed)) == list(order0[4:8])
    assert list(step_indices(2, b, n, seed)) == list(order1[0:4])
    epoch = np.concatenate([step_indices(t, b, n, seed) for t in (0, 1)])
    assert len(set(epoch.tolist())) == 8


def test_a_dataset_smaller_than_the_batch_is_refused():
    with pytest.raises(InputError, match="fewer than the global batch"):
        step_indices(0, 8, 5, 0)
