"""Held-out error of the analytic batch curve (executor.analytic) on the measured profiles.

For every shipped measured profile (``profiles/models/*-cpu.json``, timing ``host-cpu``)
and every measured batch size b: fit each block's ``t = a + s x batch`` to the other
sizes (executor.analytic.fit_fixed_samples), predict the model's summed forward and
backward time at b, and print the relative error (predicted / measured - 1). The
proportional model (time at the smallest other size scaled by batch, what analytic
profiles used before) is shown for comparison. Then, for the measurements at batch sizes
1-32 in ``profiles/raw/batch-curves/``, the fit to sizes 1-8 (what the shipped profiles
have) extrapolated to 16 and 32.

    .venv/bin/python benchmarks/batch_curve_fit.py
"""

from __future__ import annotations

from pathlib import Path

from executor.analytic import fit_fixed_samples
from planner.profile import ModelProfile

MODELS = Path(__file__).resolve().parent.parent / "profiles" / "models"
CURVES = Path(__file__).resolve().parent.parent / "profiles" / "raw" / "batch-curves"


def held_out(
    rows: tuple[tuple[float, ...], ...],
    sizes: tuple[int, ...],
    held: int,
    keep: list[int] | None = None,
) -> tuple[float, float]:
    """(affine fit, proportional) relative errors of the summed rows at ``sizes[held]``,
    fitted to the sizes at positions ``keep`` (default: all others)."""
    if keep is None:
        keep = [i for i in range(len(sizes)) if i != held]
    measured = sum(row[held] for row in rows)
    fit = prop = 0.0
    for row in rows:
        a, s, _ = fit_fixed_samples([sizes[i] for i in keep], [row[i] for i in keep])
        fit += a + s * sizes[held]
        prop += row[keep[0]] / sizes[keep[0]] * sizes[held]
    return fit / measured - 1, prop / measured - 1


def main() -> None:
    print("| model | pass | " + " | ".join(f"b={b} fit (prop.)" for b in (1, 2, 4, 8)) + " |")
    print("|---|---|" + "---:|" * 4)
    for path in sorted(MODELS.glob("*-cpu.json")):
        timing = ModelProfile.load(path).timings["host-cpu"]
        for label, rows in (("forward", timing.forward_ms), ("backward", timing.backward_ms)):
            cells = []
            for held in range(len(timing.batch_sizes)):
                fit, prop = held_out(rows, timing.batch_sizes, held)
                cells.append(f"{fit:+.1%} ({prop:+.0%})")
            print(f"| {path.stem} | {label} | " + " | ".join(cells) + " |")
    print()
    print("| measurement | pass | fitted to | b=16 fit (prop.) | b=32 fit (prop.) |")
    print("|---|---|---|---:|---:|")
    for path in sorted(CURVES.glob("*.json")):
        timing = ModelProfile.load(path).timings["host-cpu"]
        sizes = timing.batch_sizes
        keep = [i for i, b in enumerate(sizes) if b <= 8]
        for label, rows in (("forward", timing.forward_ms), ("backward", timing.backward_ms)):
            cells = []
            for b in (16, 32):
                fit, prop = held_out(rows, sizes, sizes.index(b), keep)
                cells.append(f"{fit:+.1%} ({prop:+.0%})")
            fitted = ", ".join(str(sizes[i]) for i in keep)
            print(f"| {path.stem} | {label} | {fitted} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
