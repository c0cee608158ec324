"""The PipeDream importer's time on a large graph (planner/inputs/importers/pipedream.py),
judged by this process's CPU time, which other processes on the machine do not stretch
as they stretch the wall clock (it ran alone, ``serial``, on a wall-clock verdict: 9.7 s
of wall for about 1 s of CPU at load 18); away from the importer's other tests in
tests/unit/test_pipedream_import.py."""

from __future__ import annotations

import random
import time

from edgepipe.planner.inputs.importers.pipedream import parse_pipedream

from tests.helpers.pipedream_text import node


def test_large_graph_imports_in_linear_time() -> None:
    units = 3000  # 12,001 nodes: residual units a -> b -> c, a -> c, c -> d
    lines = [node("node0", "Input", 0, 0, 128, 0)]
    edges = []
    prev = "node0"
    for u in range(units):
        a, b, c, d = (f"node{4 * u + i + 1}" for i in range(4))
        lines += [node(x, "Conv2d()", 0.5, 1.0, 256, 10) for x in (a, b, c, d)]
        edges += [(prev, a), (a, b), (b, c), (a, c), (c, d)]
        prev = d
    rng = random.Random(3)
    rng.shuffle(lines)
    rng.shuffle(edges)
    text = "\n".join(lines + [f" \t{x} -- {y}" for x, y in edges])
    start = time.process_time()
    p = parse_pipedream(text, "big", batch_size=128)
    cpu_s = time.process_time() - start
    assert p.num_blocks == 4 * units  # [a], [b], [c], [d] per unit
    assert cpu_s < 5.0
