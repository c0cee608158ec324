"""Replay pytest-xdist's ``--dist load`` scheduler on measured test durations.

``python -m tests.helpers.xdist_replay COLLECTED CPU_FILE [WORKERS]`` reads the node ids
of a ``pytest --collect-only -q`` listing (COLLECTED, in collection order) and the wall
times of an ``EDGEPIPE_TEST_CPU`` file (tests/conftest.py; a test missing there counts
0.1 s), and prints when each worker would finish under xdist 3.8's default chunks and
under ``--maxschedchunk 1`` (docs/decisions.md, "Tests handed out one at a time").
A replay, not a run: tests running together slow each other down, which it ignores.
"""

from __future__ import annotations

import heapq
import json
import sys
from pathlib import Path

#: the wall time of a test the CPU file does not have
UNKNOWN_S = 0.1


def replay(order: list[str], wall: dict[str, float], workers: int,
           max_chunk: int | None) -> list[float]:
    """When each of ``workers`` finishes ``order`` under xdist's LoadScheduling.

    Inputs: the tests in collection order, their wall seconds, the worker count and
    ``--maxschedchunk`` (None: xdist's default, the whole collection). State: the
    pending tests (a prefix of the rest of ``order`` is handed out at a time) and each
    worker's queue; the worker that frees up first runs its queue's head. Recurrence
    (xdist 3.8, ``LoadScheduling``): first each worker gets ``max(min(n / workers / 4,
    chunk), 2)`` tests; when a test ends, a worker with fewer than ``max(2, pending /
    workers / 4)`` queued gets up to ``max(2, pending / workers / 2)`` minus its queue,
    at most ``max(2 - queued, chunk)`` at once, unless the test took 0.1 s or more and
    two are still queued. Complexity: O(n log workers) heap operations, each hand-out
    O(n) list slicing at worst.
    """
    chunk = len(order) if max_chunk is None else max_chunk
    pending = list(range(len(order)))
    queues: list[list[int]] = [[] for _ in range(workers)]
    first = max(min(len(order) // workers // 4, chunk), 2)
    for queue in queues:
        queue += pending[:first]
        del pending[:first]
    running: list[tuple[float, int]] = []
    for k, queue in enumerate(queues):
        if queue:
            heapq.heappush(running, (wall.get(order[queue[0]], UNKNOWN_S), k))
    ends = [0.0] * workers
    while running:
        now, k = heapq.heappop(running)
        took = wall.get(order[queues[k].pop(0)], UNKNOWN_S)
        queued = len(queues[k])
        if pending and queued < max(2, len(pending) // workers // 4) and not (
                took >= 0.1 and queued >= 2):
            send = min(max(2, len(pending) // workers // 2) - queued, max(2 - queued, chunk))
            queues[k] += pending[:send]
            del pending[:send]
        ends[k] = now
        if queues[k]:
            heapq.heappush(running, (now + wall.get(order[queues[k][0]], UNKNOWN_S), k))
    return ends


def main(argv: list[str]) -> None:
    order = [line.strip() for line in Path(argv[0]).read_text().splitlines() if "::" in line]
    wall: dict[str, float] = {}
    for line in Path(argv[1]).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            wall.setdefault(row["test"], float(row["wall_s"]))
    workers = int(argv[2]) if len(argv) > 2 else 3
    print(f"{len(order)} tests, a balanced split: "
          f"{sum(wall.get(t, UNKNOWN_S) for t in order) / workers:.0f} s a worker")
    for name, chunk in (("default chunks", None), ("--maxschedchunk 1", 1)):
        ends = replay(order, wall, workers, chunk)
        print(f"{name}: workers done at {' / '.join(f'{e:.0f}' for e in ends)} s")


if __name__ == "__main__":
    main(sys.argv[1:])
