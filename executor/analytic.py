"""Analytic per-block times for device types that are not at hand.

For a block with ``f`` forward FLOPs per sample on a device type with peak FP32
throughput ``P`` GFLOP/s and training efficiency ``e`` (both from the device catalog), a
fixed per-block cost plus a throughput term:

    forward_ms(b)  = f / (P * e * 1e9) * 1e3 * (w_f + b)
    backward_ms(b) = 2 * f / (P * e * 1e9) * 1e3 * (w_b + b)

Backward is twice forward because it runs two products of the forward's size per layer
(gradient with respect to the input and with respect to the weights). ``w_f`` / ``w_b``
are the block's fixed cost (kernel launches, framework overhead, memory-bound layers
such as normalisation, activations and pooling, which have no counted FLOPs) expressed
in samples of its own throughput work. They are fitted per block from a measured
profile of the same blocks (:func:`fit_fixed_samples`: least squares of ``t(b) = a +
s b`` weighted by batch size, ``a, s >= 0``, ``w = a / s``), so the shape of the batch
curve is the measured one and its scale follows the device's FLOP rate: the assumption is that a
device's fixed costs scale with its speed as its throughput does. Without a measured
reference ``w = 0`` (time proportional to batch). The shipped analytic profiles are fitted
from the ``host-cpu`` profiles measured with ``edgepipe profile``; docs/profiles.md gives
the fit's error on held-out batch sizes. Every such Timing is marked ``source:
"analytic"``.

This module imports only the planner's types (no torch), so it also works on profiles
imported from elsewhere, as long as their blocks carry ``forward_flops_per_sample``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from itertools import pairwise

from planner.cluster import DeviceType
from planner.errors import InputError
from planner.profile import ModelProfile, Timing

#: batch sizes analytic timings are tabulated at when none are given
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: backward time as a multiple of forward time
BACKWARD_FACTOR = 2.0
#: times are stored rounded to this many decimals of a millisecond
MS_DECIMALS = 6


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


def fixed_samples(reference: Timing) -> tuple[tuple[float, float], ...]:
    """Per block (w_f, w_b): the fixed cost in samples fitted from a measured timing."""
    return tuple(
        (
            fit_fixed_samples(reference.batch_sizes, f)[2],
            fit_fixed_samples(reference.batch_sizes, b)[2],
        )
        for f, b in zip(reference.forward_ms, reference.backward_ms, strict=True)
    )


def analytic_timing(
    profile: ModelProfile,
    device: DeviceType,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    fixed: Sequence[tuple[float, float]] | None = None,
) -> Timing:
    """Per-block analytic times of ``profile`` on ``device`` (formula in the module
    docstring), with per-block fixed costs ``fixed`` = (w_f, w_b) in samples (default 0:
    proportional to batch). O(blocks x batch sizes)."""
    if not batch_sizes or batch_sizes[0] < 1 or any(b <= a for a, b in pairwise(batch_sizes)):
        raise ValueError(f"batch sizes {list(batch_sizes)} must be positive and increasing")
    if fixed is None:
        fixed = [(0.0, 0.0)] * profile.num_blocks
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
        w_f, w_b = fixed[i]
        forward.append(tuple(round(per_sample * (w_f + b), MS_DECIMALS) for b in batch_sizes))
        backward.append(
            tuple(round(BACKWARD_FACTOR * per_sample * (w_b + b), MS_DECIMALS) for b in batch_sizes)
        )
    return Timing(
        batch_sizes=tuple(batch_sizes),
        forward_ms=tuple(forward),
        backward_ms=tuple(backward),
        source="analytic",
    )


def analytic_profile(
    profile: ModelProfile,
    device_types: Mapping[str, DeviceType],
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    reference: Timing | None = None,
) -> ModelProfile:
    """``profile`` plus an analytic :class:`~planner.profile.Timing` for every device type
    in ``device_types`` (e.g. ``planner.cluster.load_catalog()``) that has no timing yet;
    existing (measured or imported) timings are kept as they are. The per-block fixed
    costs are fitted from ``reference`` (a measured timing of the same blocks; default:
    none, times proportional to batch). The result's source is ``analytic`` and names
    where the FLOPs and the batch curve came from. O(types x blocks x batch sizes)."""
    if reference is not None and len(reference.forward_ms) != profile.num_blocks:
        raise ValueError(
            f"the reference timing has {len(reference.forward_ms)} blocks, the profile "
            f"{profile.num_blocks}"
        )
    fixed = fixed_samples(reference) if reference is not None else None
    timings = dict(profile.timings)
    for name, device in device_types.items():
        if name not in timings:
            timings[name] = analytic_timing(profile, device, batch_sizes, fixed)
    origin = profile.source.get("detail", profile.source["kind"])
    curve = (
        "per-block fixed cost + throughput: times = forward FLOPs x (w + batch) / (catalog "
        "peak FP32 x efficiency), w fitted per block from the measured batch curve at "
        f"batch sizes {list(reference.batch_sizes)}"
        if reference is not None
        else "per-block times = forward FLOPs x batch / (catalog peak FP32 x efficiency)"
    )
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
