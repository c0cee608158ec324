"""What the CLI prints in tables and how it words bytes (issue 27, "Output"): a number or a
device id is never cut, whatever the terminal's width (planner/cli/console.py: a table
that does not fit wraps columns at spaces or becomes one labelled line per row); column
names say what they hold; a memory error shows its figures in a unit that shows them
(planner/units.py)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
from edgepipe.planner.cli import console
from edgepipe.planner.cli.main import main
from edgepipe.planner.cli.plan_views import plan_table
from edgepipe.planner.cli.planning import comparison_lines, comparison_table
from edgepipe.planner.solvers.comparison import ComparisonResult, ComparisonRow
from edgepipe.planner.units import human_bytes
from rich.console import Console

from tests.helpers.dp_cases import hand_plan
from tests.helpers.paths import REPO
from tests.helpers.runs import write_run


def _row(**values: object) -> ComparisonRow:
    """A row of ``values``, each figure of an infeasible one None (whatever fields the
    row has beside these)."""
    return ComparisonRow(**{f.name: values.get(f.name) for f in fields(ComparisonRow)
                            if f.name in values or f.default is MISSING})


ROWS = (
    _row(planner="pipedream-2bw", feasible=True, status="feasible", iteration_ms=1234.5,
         steady_ms=1234.5, samples_per_s=444021.37, speedup_vs_data_parallel=12.3,
         solve_time_s=123.45, gap=0.012, memory_headroom=0.45, stages=3, devices_used=5,
         micro_batch_size=16),
    _row(planner="data-parallel", feasible=False, status="infeasible", solve_time_s=0.01,
         note="memory"),
)
RESULT = ComparisonResult("m", "c", 64, ROWS, {})
#: what both forms of the comparison print whole (the table's 12.3 and 3/5 read "12.3x"
#: and "3 stages on 5 devices" in the lines)
WHOLE = {"pipedream-2bw", "data-parallel", "feasible", "infeasible", "1234.5", "444021.37",
         "123.45", "1.2%", "45%", "16"}


def _words(text: str) -> set[str]:
    return {w.strip(",;:") for w in text.split()}


def _printed(monkeypatch: pytest.MonkeyPatch, width: int) -> str:
    """The comparison as ``print_table`` prints it on a terminal ``width`` columns wide."""
    monkeypatch.setattr(console, "out", Console(width=width, file=io.StringIO(), record=True))
    console.print_table(comparison_table(RESULT), lambda: comparison_lines(RESULT))
    return console.out.export_text()


def test_a_table_never_cuts_a_number_at_any_terminal_width(monkeypatch):
    # rich narrows a too-wide table's widest wrappable column, cutting 444021.37 to
    # "444021..." at 88-89 columns; every width from 20 to 130 must print each figure
    # whole, within the width, as the table (wrapped at spaces) or as labelled lines
    forms = set()
    for width in range(20, 131):
        text = _printed(monkeypatch, width)
        assert "\u2026" not in text and "..." not in text, (width, text)
        assert _words(text) >= WHOLE, (width, WHOLE - _words(text))
        assert max(len(line.rstrip()) for line in text.splitlines()) <= width
        forms.add("table" if "\u2500" in text else "lines")
    assert forms == {"table", "lines"}


def test_a_column_of_several_words_wraps_at_spaces_before_the_table_gives_up(monkeypatch):
    # the plan table's device list wraps: at 60 columns the table stays, its device
    # column on two lines, every id whole
    plan = hand_plan(
        [1, 1, 2],
        [(0, 1, ("orin-000", "orin-001", "orin-002"), (2, 1, 1)), (1, 3, ("nano-000",), (4,))],
        ["orin-000", "orin-001", "orin-002", "nano-000"],
    )
    monkeypatch.setattr(console, "out", Console(width=60, file=io.StringIO(), record=True))
    console.print_table(plan_table(plan), lambda: ["narrow"])
    text = console.out.export_text()
    assert "\u2500" in text and "\u2026" not in text
    assert {"orin-000", "orin-001", "orin-002", "nano-000"} <= _words(text)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 60


def test_report_at_a_narrow_terminal_prints_every_device_id_whole(tmp_path: Path) -> None:
    plan = write_run(tmp_path / "run")
    devices = {d for s in plan.partition.stages for d in s.devices}
    for columns in ("50", "100"):
        done = subprocess.run([sys.executable, "-m", "edgepipe.planner.cli.main", "report",
                               str(tmp_path / "run")], capture_output=True, text=True,
                              cwd=REPO, timeout=120, env={**os.environ, "COLUMNS": columns})
        assert done.returncode == 0, done.stderr
        assert "\u2026" not in done.stdout and "..." not in done.stdout, done.stdout
        assert devices <= _words(done.stdout), (columns, done.stdout)


def test_memory_columns_say_whether_they_are_memory_used_or_headroom():
    plan = hand_plan([1, 1], [(0, 1, ("a",), (4,)), (1, 2, ("b",), (4,))], ["a", "b"])
    assert [c.header for c in plan_table(plan).columns][-1] == "mem used"
    headers = [c.header for c in comparison_table(RESULT).columns]
    assert "headroom" in headers and "mem" not in headers
    assert "headroom: usable memory left free" in str(comparison_table(RESULT).caption)


def test_bytes_are_worded_in_the_largest_unit_that_shows_them():
    assert human_bytes(3 * 2**30) == "3.00 GiB"
    assert human_bytes(0.1 * 2**30) == "0.10 GiB"
    assert human_bytes(0.099 * 2**30) == "101.38 MiB"  # 0.099 x 1024 = 101.376
    assert human_bytes(600_000) == "0.57 MiB"  # 600000 / 1048576 = 0.5722
    assert human_bytes(45_504) == "44.44 KiB"  # 45504 / 1024 = 44.4375
    assert human_bytes(500) == "0.49 KiB"  # 500 / 1024 = 0.488 (>= 0.1 KiB)
    assert human_bytes(50) == "50 B"
    assert human_bytes(-2 * 2**20) == "-2.00 MiB"


def test_a_memory_error_on_a_tiny_device_shows_its_figures(tmp_path, capsys):
    # one Jetson Nano of 1 MB, 0.6 usable: 600000 B = 0.57 MiB. pipedream-alexnet's
    # block 3 (Conv2d-node5) has 1229568 parameter bytes; weights, gradients and momentum
    # take 3x = 3688704 B = 3.52 MiB; short by 3088704 B = 2.95 MiB (was "0.00 GiB")
    cluster = tmp_path / "tiny.json"
    cluster.write_text(json.dumps({
        "schema_version": 1, "kind": "edgepipe.cluster", "name": "tiny",
        "devices": [{"id": "a", "type": "jetson-nano", "memory_bytes": 1e6}],
        "network": {"bandwidth_mbps": 100, "latency_ms": 1},
    }))
    assert main(["plan", "--model", "pipedream-alexnet", "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert ("block 3 (Conv2d-node5) alone needs 3.52 MiB for weights, gradients and momentum "
            "state, but the largest device (a) has 0.57 MiB usable: short by 2.95 MiB") in err
