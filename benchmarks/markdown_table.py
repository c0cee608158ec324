"""How a benchmark hands back its table: printed, and written to ``--markdown`` when
given (benchmarks/cost_vs_simulator.py, benchmarks/dp_vs_bruteforce.py)."""

from __future__ import annotations


def emit(lines: list[str], markdown: str | None) -> None:
    """Print ``lines`` (a markdown table and its notes) and, if ``markdown`` names a
    file, write them there too, newline-terminated."""
    text = "\n".join(lines)
    print(text)
    if markdown:
        with open(markdown, "w") as fh:
            fh.write(text + "\n")
