"""Rank the tests of an ``EDGEPIPE_TEST_CPU`` file (tests/conftest.py) by CPU seconds.

``python -m tests.helpers.cpu_ranking FILE [N]`` prints the N (default 30) tests with
the most CPU (this pytest process's plus its reaped children's), with their wall time
and the load at their end, then the file's totals and, per xdist worker, when it
finished (the parallel call's tail: how long its last worker ran on after the first was
done). Wall times on a loaded machine are stretched by the load; the CPU seconds much
less so (docs/testing.md, "CPU per test").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def ranking(path: Path) -> list[dict[str, float | str]]:
    """The file's lines, most CPU first, each with its ``cpu_s`` (self + children)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        row["cpu_s"] = round(row["self_s"] + row["children_s"], 3)
    return sorted(rows, key=lambda r: -float(r["cpu_s"]))


def main(argv: list[str]) -> None:
    rows = ranking(Path(argv[0]))
    top = int(argv[1]) if len(argv) > 1 else 30
    print(f"{'cpu s':>7} {'self':>6} {'child':>6} {'wall s':>7} {'load':>5}  test")
    for r in rows[:top]:
        print(f"{r['cpu_s']:7.1f} {r['self_s']:6.1f} {r['children_s']:6.1f} "
              f"{r['wall_s']:7.1f} {r['load_1m']:5.1f}  {r['test']}")
    cpu = sum(float(r["cpu_s"]) for r in rows)
    wall = sum(float(r["wall_s"]) for r in rows)
    print(f"{len(rows)} tests: {cpu:.1f} CPU s, {wall:.1f} wall s (summed over tests)")
    for line in worker_spans(rows):
        print(line)


def worker_spans(rows: list[dict]) -> list[str]:
    """One line per xdist worker of the rows that say when they ended (``end``): its
    tests, its busy seconds and when it finished, counted from the first test's start;
    the last line, the tail: how long the last worker ran after the first had finished."""
    timed = [r for r in rows if "end" in r and "worker" in r]
    if not timed:
        return []
    start = min(float(r["end"]) - float(r["wall_s"]) for r in timed)
    ends: dict[str, float] = {}
    lines = []
    for worker in sorted({str(r["worker"]) for r in timed}):
        mine = [r for r in timed if r["worker"] == worker]
        ends[worker] = max(float(r["end"]) for r in mine) - start
        busy = sum(float(r["wall_s"]) for r in mine)
        lines.append(f"{worker}: {len(mine)} tests, {busy:.1f} s busy, "
                     f"done at {ends[worker]:.1f} s")
    lines.append(f"tail: {max(ends.values()) - min(ends.values()):.1f} s")
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
