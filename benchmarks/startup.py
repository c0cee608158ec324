"""Start-up cost of the ``edgepipe`` command (issue 24): CPU seconds (user + system) of
``edgepipe --version`` and ``edgepipe validate PLAN``, best of ``--repeats`` fresh
processes, against ``python -c pass`` on the same interpreter. The CPU time of a child
process (``resource.getrusage(RUSAGE_CHILDREN)``) is what a loaded machine inflates
least; the load average is printed with the table.

Target (issue 24): each command <= 0.2 s of CPU on this machine.

    .venv/bin/python benchmarks/startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from edgepipe.planner.cli.main import main

#: the command line of the ``edgepipe`` entry point on this interpreter
EDGEPIPE = [sys.executable, "-c", "from edgepipe.planner.cli.main import main; "
            "raise SystemExit(main())"]  # fmt: skip


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU seconds of one run of ``argv`` (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def report(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        plan = str(Path(tmp) / "plan.json")
        argv = ["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2",
                "--global-batch", "8", "-o", plan]  # fmt: skip
        with open(os.devnull, "w") as sink:
            stdout, sys.stdout = sys.stdout, sink
            try:
                assert main(argv) == 0
            finally:
                sys.stdout = stdout
        rows = [
            ("python -c pass", [sys.executable, "-c", "pass"]),
            ("edgepipe --version", [*EDGEPIPE, "--version"]),
            ("edgepipe validate PLAN", [*EDGEPIPE, "validate", plan]),
        ]
        best = {name: min(cpu_seconds(cmd) for _ in range(repeats)) for name, cmd in rows}
    base = best["python -c pass"]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"CPU s (user + sys), best of {repeats}")
    print(f"{'command':<24} {'CPU s':>6} {'- python -c pass':>17}")
    for name, seconds in best.items():
        print(f"{name:<24} {seconds:>6.3f} {seconds - base:>17.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    report(parser.parse_args().repeats)
