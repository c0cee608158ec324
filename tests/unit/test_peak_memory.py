"""A worker's peak memory is its own, not its launcher's (docs/executor.md, metrics)."""

from __future__ import annotations

import multiprocessing as mp

PARENT_MIB = 800


def _child(q: mp.Queue) -> None:
    from edgepipe.executor.core import metrics

    q.put(metrics.peak_memory_bytes(__import__("torch").device("cpu")))


def test_a_spawned_worker_does_not_report_its_larger_launchers_peak():
    # the parent touches 800 MiB; a child with torch imported peaks near 230 MiB, and
    # ru_maxrss (carried across fork and exec) would read the parent's 800+
    held = bytearray(PARENT_MIB * 2**20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    try:
        peak = q.get(timeout=120)
    finally:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()
    assert 50 * 2**20 < peak < (PARENT_MIB - 200) * 2**20
