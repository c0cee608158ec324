"""A whole head table that no warm-up binds is built once per (composition, B) and read
at every such warm-up (planner/solvers/dp/tables.py ``_Tables.head``, issue 29 item 5):
the same figures as a table built for that warm-up alone, and never for a warm-up at
which some range is split again under memory caps."""

from __future__ import annotations

import numpy as np
from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.solvers.classes import device_classes
from edgepipe.planner.solvers.dp.tables import _Tables

from tests.helpers.synthetic import random_problem

BATCH = 4


def tables() -> _Tables:
    # 12 blocks on 4 devices of two types with little memory: two devices of the first
    # type fit the deepest warm-up 3 on every range with Algorithm 1's split, not 4
    problem = random_problem(12, 4, seed=3, global_batch=16, candidates=(BATCH,),
                             memory=(1e8, 5e7))  # fmt: skip
    return _Tables(problem, CostModel(problem, BATCH), device_classes(problem))


def asked_range_by_range(warm: int) -> np.ndarray:
    """The head table of two first-type devices at ``warm``, built for that warm-up alone
    (every range asked for by index: a table of its own per warm-up)."""
    t = tables()
    cid = t.comp((2, 0))
    return t.head(cid, warm, BATCH, np.arange(len(t.rows_first))).copy()


def test_a_table_no_warmup_binds_is_shared_and_reads_as_its_own():
    t = tables()
    cid = t.comp((2, 0))
    assert t.unconstrained(cid, BATCH)[2].min() == 3  # the least deepest warm-up
    at_1, at_3 = t.head(cid, 1, BATCH), t.head(cid, 3, BATCH)
    assert at_1 is at_3  # one table for warm-ups 1..3
    assert np.array_equal(at_3, asked_range_by_range(3))
    assert np.array_equal(at_1, asked_range_by_range(1))
    assert np.isfinite(at_3[0]).sum() == 78  # every range [L-l, L-l') of 12 blocks
    # at 4 some range no longer fits its split: a table of its own, split again there
    at_4 = t.head(cid, 4, BATCH)
    assert at_4 is not at_3
    assert np.array_equal(at_4, asked_range_by_range(4))
    assert not np.array_equal(at_4, at_3)


def test_dropping_other_warmups_keeps_the_shared_table():
    t = tables()
    cid = t.comp((2, 0))
    shared, own = t.head(cid, 2, BATCH), t.head(cid, 4, BATCH)
    t.drop_warmups(5)  # a later level's warm-up: 4's table goes, the shared one stays
    assert t.head(cid, 1, BATCH) is shared
    assert t.head(cid, 4, BATCH) is not own
    assert np.array_equal(t.head(cid, 4, BATCH), own)
