"""Held-out error of the analytic batch curve (executor.profiling.analytic) on the measured
profiles.

For every measurement (the batch curves in ``profiles/raw/batch-curves/``, then the
shipped measured profiles ``profiles/models/*-cpu.json``, timing ``host-cpu``):

1. leave-one-out over every measured size: each block's curve
(executor.profiling.analytic.fit_curve:
   a line, or a line with a knot) fitted to all other sizes, the model's summed forward
   and backward time predicted at the held-out size, relative error predicted / measured
   - 1;
2. the validated range (executor.profiling.analytic.validated_range): the widest run of
   consecutive measured sizes over which leave-one-out stays within 15%; the worst error
   there; the same check with time proportional to batch (no fixed cost); and, for each
   size outside the range, the error of the fit to the range extrapolated to it (what a
   plan that runs a device there is warned about).

    .venv/bin/python benchmarks/batch_curve_fit.py
"""

from __future__ import annotations

from pathlib import Path

from edgepipe.executor.profiling.analytic import TOLERANCE, held_out_errors, validated_range
from edgepipe.planner.inputs.profile import ModelProfile, Timing

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "profiles" / "models"
CURVES = ROOT / "profiles" / "raw" / "batch-curves"


def worst(timing: Timing, lo: int, hi: int, proportional: bool = False) -> float:
    """Largest |leave-one-out error| over the sizes in ``[lo, hi]`` (each fitted to the
    others), with the fitted lines or, if ``proportional``, with time proportional to
    batch (each block's time per sample at the other sizes, weighted as the fit is)."""
    span = [i for i, b in enumerate(timing.batch_sizes) if lo <= b <= hi]
    if not proportional:
        return max(
            abs(e) for h in span for e in held_out_errors(timing, h, [i for i in span if i != h])
        )
    sizes = timing.batch_sizes
    out = 0.0
    for h in span:
        keep = [i for i in span if i != h]
        for rows in (timing.forward_ms, timing.backward_ms):
            predicted = sum(
                sum(sizes[i] ** 2 * row[i] for i in keep)
                / sum(sizes[i] ** 3 for i in keep)
                * sizes[h]
                for row in rows
            )
            out = max(out, abs(predicted / sum(row[h] for row in rows) - 1))
    return out


def measurements() -> list[tuple[str, Timing]]:
    paths = sorted(CURVES.glob("*.json")) + sorted(MODELS.glob("*-cpu.json"))
    return [(p.stem, ModelProfile.load(p).timings["host-cpu"]) for p in paths]


def main() -> None:
    found = measurements()
    print("Leave-one-out over every measured size (fitted to all other sizes):")
    print()
    print("| measurement | pass | held-out error by batch size |")
    print("|---|---|---|")
    for name, timing in found:
        sizes = timing.batch_sizes
        errors = [
            held_out_errors(timing, h, [i for i in range(len(sizes)) if i != h])
            for h in range(len(sizes))
        ]
        for p, label in enumerate(("forward", "backward")):
            cells = " ".join(f"{b}: {e[p]:+.1%}" for b, e in zip(sizes, errors, strict=True))
            print(f"| {name} | {label} | {cells} |")
    print()
    print(f"Validated range (leave-one-out within {TOLERANCE:.0%} over a run of sizes):")
    print()
    print(
        "| measurement | validated sizes | worst in range | proportional, same range | "
        "outside, fit to the range extrapolated (fwd / bwd) |"
    )
    print("|---|---|---:|---:|---|")
    for name, timing in found:
        valid = validated_range(timing)
        if valid is None:
            print(f"| {name} | none | | | |")
            continue
        lo, hi = valid
        keep = [i for i, b in enumerate(timing.batch_sizes) if lo <= b <= hi]
        outside = []
        for h, b in enumerate(timing.batch_sizes):
            if not lo <= b <= hi:
                f, bw = held_out_errors(timing, h, keep)
                outside.append(f"{b}: {f:+.1%} / {bw:+.1%}")
        print(
            f"| {name} | {lo}-{hi} | {worst(timing, lo, hi):.1%} | "
            f"{worst(timing, lo, hi, proportional=True):.0%} | {'; '.join(outside) or '-'} |"
        )


if __name__ == "__main__":
    main()
