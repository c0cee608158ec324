"""Analytic per-block times for device types that are not at hand.

For a block with ``f`` forward FLOPs per sample on a device type with peak FP32
throughput ``P`` GFLOP/s and training efficiency ``e`` (both from the device catalog):

    forward_ms(b)  = f * b / (P * e * 1e9) * 1e3
    backward_ms(b) = 2 * forward_ms(b)

Backward is twice forward because it runs two products of the forward's size per layer
(gradient with respect to the input and with respect to the weights). The model is
linear in the batch and ignores memory-bound work (normalisation, activations, pooling,
embedding look-ups have no counted FLOPs and so take 0 ms), which is what the efficiency
factor absorbs on average. Every such Timing is marked ``source: "analytic"``.

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


def analytic_timing(
    profile: ModelProfile, device: DeviceType, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES
) -> Timing:
    """Per-block analytic times of ``profile`` on ``device`` (formula in the module
    docstring). O(blocks x batch sizes)."""
    if not batch_sizes or batch_sizes[0] < 1 or any(b <= a for a, b in pairwise(batch_sizes)):
        raise ValueError(f"batch sizes {list(batch_sizes)} must be positive and increasing")
    flops_per_ms = device.effective_gflops * 1e9 / 1e3
    forward = []
    for i, block in enumerate(profile.blocks):
        if block.forward_flops_per_sample is None:
            raise InputError(
                profile.name, f"$.blocks[{i}].forward_flops_per_sample",
                "missing; analytic times need every block's forward FLOPs (profile the "
                "model with edgepipe profile)"
            )
        forward.append(
            tuple(
                round(block.forward_flops_per_sample * b / flops_per_ms, MS_DECIMALS)
                for b in batch_sizes
            )
        )
    return Timing(
        batch_sizes=tuple(batch_sizes),
        forward_ms=tuple(forward),
        backward_ms=tuple(
            tuple(round(BACKWARD_FACTOR * t, MS_DECIMALS) for t in row) for row in forward
        ),
        source="analytic",
    )


def analytic_profile(
    profile: ModelProfile,
    device_types: Mapping[str, DeviceType],
    *,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
) -> ModelProfile:
    """``profile`` plus an analytic :class:`~planner.profile.Timing` for every device type
    in ``device_types`` (e.g. ``planner.cluster.load_catalog()``) that has no timing yet;
    existing (measured or imported) timings are kept as they are. The result's source is
    ``analytic`` and names where the FLOPs came from. O(types x blocks x batch sizes)."""
    timings = dict(profile.timings)
    for name, device in device_types.items():
        if name not in timings:
            timings[name] = analytic_timing(profile, device, batch_sizes)
    origin = profile.source.get("detail", profile.source["kind"])
    return ModelProfile(
        name=profile.name,
        source={
            "kind": "analytic",
            "detail": (
                "per-block times = forward FLOPs x batch / (catalog peak FP32 x efficiency),"
                f" backward = {BACKWARD_FACTOR:g} x forward; FLOPs from a "
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
