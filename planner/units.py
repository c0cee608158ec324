"""Quantities worded for people: a byte count in the unit that shows it.

A memory error of a small model on a small device said "needs 0.00 GiB ... has 0.00 GiB";
every message that states bytes words them through :func:`human_bytes`.
"""

from __future__ import annotations

#: binary units, largest first
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def human_bytes(n: float) -> str:
    """``n`` bytes with two decimals in the largest binary unit of which its magnitude is
    at least a tenth: GiB from 0.1 GiB (102.4 MiB), MiB from 0.1 MiB, KiB from 0.1 KiB,
    else whole bytes. Each figure of a message takes its own unit: one unit for all would
    show the smaller of two far-apart figures as 0.00 again. O(1)."""
    for unit, one in UNITS:
        if abs(n) >= one / 10:
            return f"{n / one:.2f} {unit}"
    return f"{n:.0f} B"
