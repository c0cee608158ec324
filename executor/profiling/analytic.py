"""Analytic per-block times for device types that are not at hand.

For a block with ``f`` forward FLOPs per sample on a device type with peak FP32
throughput ``P`` GFLOP/s and training efficiency ``e`` (both from the device catalog), a
fixed per-block cost plus a throughput term, with a small-batch segment:

    forward_ms(b)  = f / (P * e * 1e9) * 1e3 * (w_f + b + v_f * max(0, k_f - b))
    backward_ms(b) = 2 * f / (P * e * 1e9) * 1e3 * (w_b + b + v_b * max(0, k_b - b))

Backward is twice forward because it runs two products of the forward's size per layer
(gradient with respect to the input and with respect to the weights). ``w_f`` / ``w_b``
are the block's fixed cost (kernel launches, framework overhead, memory-bound layers
such as normalisation, activations and pooling, which have no counted FLOPs) expressed
in samples of its own throughput work; below the knot ``k`` the slope changes by ``-v``
samples per sample (this CPU's math library runs other kernels at small batches). They
are fitted per block from a measured profile of the same blocks (:func:`fit_curve`:
least squares weighted by batch size of ``t(b) = a + s b + c max(0, k - b)``, the knot
``k`` one of the measured sizes or none, under ``s >= 0``, ``s - c >= 0`` and ``t(0) =
a + c k >= 0``, so the curve is non-negative and non-decreasing; ``w = a / s``, ``v = c
/ s``), so the shape of the batch curve is the measured one and its scale follows the
device's FLOP rate: the assumption is that a device's fixed costs scale with its speed as
its throughput does. Without a measured reference ``w = v = 0`` (time proportional to
batch).

The fit is made, and trusted, only over the batch sizes where leave-one-out shows it
predicts the measurement (:func:`validated_range`): the widest run of consecutive
measured sizes in which every size, predicted from the fits to the others, has the
model's summed forward and backward times within :data:`TOLERANCE`. Outside it (on this
CPU batch 1 or 2 for some models, and from batch 16 for the depthwise-convolution
models, where the math library switches kernels: docs/profiles.md) the curve is
extrapolated, and the Timing's ``valid_batch_range`` makes every plan that runs a device
there say so. The shipped analytic profiles are fitted from ``host-cpu`` measurements
(``benchmarks/profile_zoo.py``: the CNNs' batch curves in ``profiles/raw/batch-curves/``,
the transformers' measured profiles); docs/profiles.md gives the fit's error on held-out
batch sizes. Every such Timing is marked ``source: "analytic"``.

This module imports only the planner's types (no torch), so it also works on profiles
imported from elsewhere, as long as their blocks carry ``forward_flops_per_sample``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import DeviceType
from edgepipe.planner.inputs.profile import ModelProfile, Timing

#: batch sizes analytic timings are tabulated at when none are given
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: backward time as a multiple of forward time
BACKWARD_FACTOR = 2.0
#: times are stored rounded to this many decimals of a millisecond
MS_DECIMALS = 6
#: held-out relative error within which a range of batch sizes counts as validated
TOLERANCE = 0.15
#: fewest batch sizes a range needs to be validated: a line (2 parameters) from all but one
MIN_VALIDATED_SIZES = 3
#: fewest batch sizes a fit with a knot (3 parameters) is tried on: one more than it has
MIN_KNOT_SIZES = 4


@dataclass(frozen=True)
class Curve:
    """One block's time for one pass: ``t(b) = a + s b + c max(0, k - b)`` (ms, or in
    samples of throughput work when ``s = 1``); ``c = 0`` is a plain line."""

    a: float
    s: float
    c: float = 0.0
    k: float = 0.0

    def at(self, b: float) -> float:
        return self.a + self.s * b + self.c * max(0.0, self.k - b)

    def in_samples(self) -> Curve:
        """The curve divided by its throughput slope ``s`` (the fixed cost ``w = a / s``
        and ``v = c / s`` in samples); a flat curve (``s = 0``) has no throughput term
        to express them in and becomes ``Curve(0, 1)``, proportional to FLOPs."""
        if self.s <= 0:
            return Curve(0.0, 1.0)
        return Curve(self.a / self.s, 1.0, self.c / self.s, self.k)


def fit_fixed_samples(
    batch_sizes: Sequence[int], times: Sequence[float]
) -> tuple[float, float, float]:
    """Fit ``t(b) = a + s b`` to one block's ``times`` at ``batch_sizes``: returns
    ``(a, s, w)`` with ``w = a / s`` the fixed cost in samples.

    Weighted least squares with weight ``b`` on the point at batch ``b``, under ``a >= 0``
    and ``s >= 0``: minimise ``sum_b b (a + s b - t_b)^2``. The weight lets the larger
    sizes, which show the fixed-cost + throughput line, set it: at batch 1 and 2 a CPU
    library picks other kernels (measured: ResNet-18's forward is slower at batch 1 than
    at 2, its last unit's backward at batch 1 a quarter to a third below batch 2), while
    from 4 to 32 the model lies on a line (docs/profiles.md, "Analytic batch curves").
    Where the unconstrained optimum breaks a constraint, the better (lower weighted
    squared error) of the two boundary fits is taken: through the origin (``a = 0``) or
    flat (``s = 0``: a block that gets no slower with batch over the measured sizes stays
    flat rather than growing proportionally). A flat block has no throughput term to
    express a fixed cost in, so its ``w`` is 0 (its analytic curve is then proportional
    to FLOPs). O(sizes)."""
    sizes = [float(b) for b in batch_sizes]
    weights = sizes
    total = sum(weights)

    def sse(a: float, s: float) -> float:
        return sum(w * (a + s * b - t) ** 2 for w, b, t in zip(weights, sizes, times, strict=True))

    mean_b = sum(w * b for w, b in zip(weights, sizes, strict=True)) / total
    mean_t = sum(w * t for w, t in zip(weights, times, strict=True)) / total
    var = sum(w * (b - mean_b) ** 2 for w, b in zip(weights, sizes, strict=True))
    if var > 0:
        cov = sum(
            w * (b - mean_b) * (t - mean_t) for w, b, t in zip(weights, sizes, times, strict=True)
        )
        slope = cov / var
        intercept = mean_t - slope * mean_b
        if intercept >= 0 and slope > 0:
            return intercept, slope, intercept / slope
    through_origin = sum(w * b * t for w, b, t in zip(weights, sizes, times, strict=True)) / sum(
        w * b * b for w, b in zip(weights, sizes, strict=True)
    )
    candidates = [(0.0, max(through_origin, 0.0))]
    if var > 0:
        candidates.append((max(mean_t, 0.0), 0.0))
    a, s = min(candidates, key=lambda c: sse(*c))
    return a, s, a / s if a and s else 0.0


def fit_curve(
    batch_sizes: Sequence[int], times: Sequence[float], min_knot_sizes: int = MIN_KNOT_SIZES
) -> Curve:
    """Fit one block's ``times`` at ``batch_sizes`` with a line or a line with a knot.

    Candidates: the line of :func:`fit_fixed_samples`; and, with at least
    ``min_knot_sizes`` sizes, for every knot ``k`` at a measured size other than the
    smallest and the largest, ``t(b) = a + s b + c max(0, k - b)`` by least squares
    weighted by batch size (``sum_b b (t(b) - t_b)^2``, the normal equations of three
    unknowns, :func:`_solve3`), kept only if ``s >= 0``, ``s - c >= 0`` (non-decreasing on
    both sides of the knot) and ``a + c k >= 0`` (non-negative from batch 0). The candidate with the
    lowest weighted squared error wins; a knot must lower it, or the line stays.
    O(sizes^2)."""
    a, s, _ = fit_fixed_samples(batch_sizes, times)
    best = Curve(a, s)

    def sse(curve: Curve) -> float:
        return sum(b * (curve.at(b) - t) ** 2 for b, t in zip(batch_sizes, times, strict=True))

    best_sse = sse(best)
    if len(batch_sizes) < min_knot_sizes:
        return best
    for k in batch_sizes[1:-1]:
        rows = [(1.0, float(b), float(max(0, k - b))) for b in batch_sizes]
        normal = [
            [sum(b * r[i] * r[j] for b, r in zip(batch_sizes, rows, strict=True)) for j in range(3)]
            for i in range(3)
        ]
        rhs = [
            sum(b * r[i] * t for b, r, t in zip(batch_sizes, rows, times, strict=True))
            for i in range(3)
        ]
        solved = _solve3(normal, rhs)
        if solved is None:
            continue
        curve = Curve(*solved, float(k))
        if curve.s >= 0 and curve.s - curve.c >= 0 and curve.at(0) >= 0 and sse(curve) < best_sse:
            best, best_sse = curve, sse(curve)
    return best


def _det3(m: Sequence[Sequence[float]]) -> float:
    return (
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    )


def _solve3(m: Sequence[Sequence[float]], y: Sequence[float]) -> tuple[float, float, float] | None:
    """``x`` with ``m x = y`` by Cramer's rule (pure Python, so every machine gets the same
    bits); None when ``m`` is singular. O(1)."""
    det = _det3(m)
    if det == 0:
        return None
    x = [
        _det3([[y[r] if col == c else m[r][col] for col in range(3)] for r in range(3)]) / det
        for c in range(3)
    ]
    return x[0], x[1], x[2]


def held_out_errors(timing: Timing, held: int, keep: Sequence[int]) -> tuple[float, float]:
    """(forward, backward) relative error, predicted / measured - 1, of the model's summed
    time at ``timing.batch_sizes[held]`` when every block's curve is fitted
    (:func:`fit_curve`) to the sizes at positions ``keep`` only.
    O(blocks x len(keep))."""
    sizes = [timing.batch_sizes[i] for i in keep]
    b = timing.batch_sizes[held]
    errors = []
    for rows in (timing.forward_ms, timing.backward_ms):
        predicted = 0.0
        for row in rows:
            predicted += fit_curve(sizes, [row[i] for i in keep]).at(b)
        errors.append(predicted / sum(row[held] for row in rows) - 1)
    return errors[0], errors[1]


def validated_range(timing: Timing, tolerance: float = TOLERANCE) -> tuple[int, int] | None:
    """The batch sizes ``(lo, hi)`` over which the fitted curve is validated by
    leave-one-out: among the runs ``S`` of consecutive measured sizes (at least
    :data:`MIN_VALIDATED_SIZES`), those in which every ``b in S`` is predicted from the
    fits to ``S - {b}`` within ``tolerance`` (:func:`held_out_errors`, both passes); of
    these the one with the most sizes, on a tie the one of smaller batches (the sizes
    pipelines run at). None where no run validates (or there are too few sizes).
    O(sizes^3 x blocks x sizes)."""
    sizes = timing.batch_sizes
    runs = [
        (first, last)
        for first in range(len(sizes))
        for last in range(first + MIN_VALIDATED_SIZES - 1, len(sizes))
    ]
    for first, last in sorted(runs, key=lambda r: (r[0] - r[1], r[0])):
        span = range(first, last + 1)
        if all(
            abs(e) <= tolerance
            for held in span
            for e in held_out_errors(timing, held, [i for i in span if i != held])
        ):
            return sizes[first], sizes[last]
    return None


def fixed_samples(
    reference: Timing, batch_range: tuple[int, int] | None = None
) -> tuple[tuple[Curve, Curve], ...]:
    """Per block (forward, backward) curves in samples (:meth:`Curve.in_samples`) fitted
    from a measured timing at its batch sizes within ``batch_range`` (inclusive; default:
    all). A knot is tried only where leave-one-out over these sizes tried one too (its
    fits saw one size fewer), so the curve is of the kind that was validated: four sizes
    get a line. O(blocks x sizes^2)."""
    lo, hi = batch_range or (reference.batch_sizes[0], reference.batch_sizes[-1])
    keep = [i for i, b in enumerate(reference.batch_sizes) if lo <= b <= hi]
    sizes = [reference.batch_sizes[i] for i in keep]
    return tuple(
        (
            fit_curve(sizes, [f[i] for i in keep], MIN_KNOT_SIZES + 1).in_samples(),
            fit_curve(sizes, [b[i] for i in keep], MIN_KNOT_SIZES + 1).in_samples(),
        )
        for f, b in zip(reference.forward_ms, reference.backward_ms, strict=True)
    )


def analytic_timing(
    profile: ModelProfile,
    device: DeviceType,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    fixed: Sequence[tuple[Curve, Curve]] | None = None,
    valid_batch_range: tuple[int, int] | None = None,
) -> Timing:
    """Per-block analytic times of ``profile`` on ``device`` (formula in the module
    docstring), with per-block (forward, backward) curves ``fixed`` in samples (default
    ``Curve(0, 1)``: proportional to batch), tabulated at ``batch_sizes`` (also outside
    ``valid_batch_range``, the sizes the costs were fitted to, which the Timing records).
    O(blocks x batch sizes)."""
    if not batch_sizes or batch_sizes[0] < 1 or any(b <= a for a, b in pairwise(batch_sizes)):
        raise ValueError(f"batch sizes {list(batch_sizes)} must be positive and increasing")
    if fixed is None:
        fixed = [(Curve(0.0, 1.0), Curve(0.0, 1.0))] * profile.num_blocks
    if len(fixed) != profile.num_blocks:
        raise ValueError(f"{len(fixed)} fixed costs for {profile.num_blocks} blocks")
    flops_per_ms = device.effective_gflops * 1e9 / 1e3
    forward, backward = [], []
    for i, block in enumerate(profile.blocks):
        if block.forward_flops_per_sample is None:
            raise InputError(
                profile.name,
                f"$.blocks[{i}].forward_flops_per_sample",
                "missing; analytic times need every block's forward FLOPs (profile the "
                "model with edgepipe profile)",
            )
        per_sample = block.forward_flops_per_sample / flops_per_ms
        fwd, bwd = fixed[i]
        forward.append(tuple(round(per_sample * fwd.at(b), MS_DECIMALS) for b in batch_sizes))
        backward.append(
            tuple(round(BACKWARD_FACTOR * per_sample * bwd.at(b), MS_DECIMALS) for b in batch_sizes)
        )
    return Timing(
        batch_sizes=tuple(batch_sizes),
        forward_ms=tuple(forward),
        backward_ms=tuple(backward),
        source="analytic",
        valid_batch_range=valid_batch_range,
    )


def analytic_profile(
    profile: ModelProfile,
    device_types: Mapping[str, DeviceType],
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    reference: Timing | None = None,
) -> ModelProfile:
    """``profile`` plus an analytic :class:`~planner.inputs.profile.Timing` for every device type
    in ``device_types`` (e.g. ``planner.inputs.cluster.load_catalog()``) that has no timing yet;
    existing (measured or imported) timings are kept as they are. The per-block fixed
    costs are fitted from ``reference`` (a measured timing of the same blocks; default:
    none, times proportional to batch) over its validated sizes (:func:`validated_range`;
    where none validates, over all of them, and the source says so), which every timing
    records as its ``valid_batch_range``. The result's source is ``analytic`` and names
    where the FLOPs and the batch curve came from. O(types x blocks x batch sizes)."""
    if reference is not None and len(reference.forward_ms) != profile.num_blocks:
        raise ValueError(
            f"the reference timing has {len(reference.forward_ms)} blocks, the profile "
            f"{profile.num_blocks}"
        )
    valid = fixed = None
    curve = "per-block times = forward FLOPs x batch / (catalog peak FP32 x efficiency)"
    if reference is not None:
        validated = validated_range(reference)
        valid = validated or (reference.batch_sizes[0], reference.batch_sizes[-1])
        fixed = fixed_samples(reference, valid)
        fitted = [b for b in reference.batch_sizes if valid[0] <= b <= valid[1]]
        curve = (
            "per-block fixed cost + throughput + small-batch segment: times = forward FLOPs "
            "x (w + batch + v max(0, k - batch)) / (catalog peak FP32 x efficiency), w, v, k "
            "fitted per block from the measured batch "
            f"curve at batch sizes {fitted} ("
            + (
                "not validated: no run of its batch sizes predicts its held-out sizes"
                if validated is None
                else f"leave-one-out error within {TOLERANCE:.0%} there"
            )
            + "; extrapolated elsewhere)"
        )
    timings = dict(profile.timings)
    for name, device in device_types.items():
        if name not in timings:
            timings[name] = analytic_timing(profile, device, batch_sizes, fixed, valid)
    origin = profile.source.get("detail", profile.source["kind"])
    return ModelProfile(
        name=profile.name,
        source={
            "kind": "analytic",
            "detail": (
                f"{curve}, backward = {BACKWARD_FACTOR:g} x forward FLOPs; FLOPs from a "
                f"{profile.source['kind']} profile ({origin})"
            ),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "tool": "edgepipe analytic",
        },
        input_bytes_per_sample=profile.input_bytes_per_sample,
        blocks=profile.blocks,
        timings=timings,
        build=profile.build,
    )
