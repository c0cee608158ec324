"""Rank the tests of an ``EDGEPIPE_TEST_CPU`` file (tests/conftest.py) by CPU seconds.

``python -m tests.helpers.cpu_ranking FILE [N]`` prints the N (default 30) tests with
the most CPU (this pytest process's plus its reaped children's), with their wall time
and the load at their end, then the file's totals. Wall times on a loaded machine are
stretched by the load; the CPU seconds much less so (docs/testing.md, "CPU per test").
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


if __name__ == "__main__":
    main(sys.argv[1:])
