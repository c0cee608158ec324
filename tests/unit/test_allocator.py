"""planner.solvers.dp.allocator: freed arrays stay on mapped pages once retain_freed_memory runs."""

from __future__ import annotations

import multiprocessing
import resource

import numpy as np


def churn_faults(retain: bool) -> int:
    """Minor page faults of 50 rounds of building eight 1 MB arrays that live together
    and dropping them (the DP's candidate arrays, in miniature), in this process (after
    retain_freed_memory when ``retain``)."""
    from edgepipe.planner.solvers.dp.allocator import retain_freed_memory

    if retain:
        assert retain_freed_memory()

    def round_() -> None:
        held = [np.ones(2**17) for _ in range(8)]
        sum(a.sum() for a in held)

    round_()  # the first round maps its pages either way
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(50):
        round_()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_retained_memory_spares_the_page_faults_of_each_new_array():
    # 1 MB = 256 pages: glibc hands the 8 MB free at the top of its heap back to the
    # kernel after each round (above its trim threshold), so every round faults its
    # 2,048 pages in again; with the thresholds raised the freed blocks are reused, on
    # pages already mapped
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        fresh = pool.apply(churn_faults, (False,))
    with ctx.Pool(1) as pool:
        kept = pool.apply(churn_faults, (True,))
    assert fresh >= 50 * 1000  # most of each round's pages
    assert kept < 500
