"""A planning problem: model profile + cluster + training config, with every device type
of the cluster given a timing (measured in the profile, or derived from another type).

Derivation rule (docs/profiles.md): a device type missing from the profile's timings gets
the times of a reference type scaled by the ratio of effective throughputs,
``t(target) = t(ref) * effective_gflops(ref) / effective_gflops(target)`` with
``effective_gflops = peak_fp32_gflops * efficiency``. The reference is the timed type
whose effective throughput is closest (in ratio) to the target's; ties by name. Every
derivation is recorded in :attr:`Problem.assumptions` and so in the plan; so is, per plan,
every device type run outside the batch sizes its analytic curve was checked at
(:func:`batch_range_notes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from edgepipe.planner.errors import InputError, PlanMismatchError
from edgepipe.planner.inputs.cluster import Cluster, DeviceType, load_catalog
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.profile import ModelProfile, Timing
from edgepipe.planner.inputs.schema import excerpt
from edgepipe.planner.partition import Partition


@dataclass(frozen=True)
class Problem:
    model: ModelProfile
    cluster: Cluster
    config: TrainingConfig
    timings: dict[str, Timing]
    assumptions: tuple[str, ...]


def _scaled(t: Timing, factor: float) -> Timing:
    def scale(m: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(x * factor for x in row) for row in m)

    return Timing(
        batch_sizes=t.batch_sizes,
        forward_ms=scale(t.forward_ms),
        backward_ms=scale(t.backward_ms),
        source="derived",
        valid_batch_range=t.valid_batch_range,
        runtime_work=None if t.runtime_work is None else t.runtime_work.scaled(factor),
    )


def make_problem(
    model: ModelProfile,
    cluster: Cluster,
    config: TrainingConfig,
    catalog: dict[str, DeviceType] | None = None,
) -> Problem:
    """Bundle the inputs and resolve a timing for every device type in the cluster.

    Specs of reference types not in the cluster are taken from ``catalog`` (default: the
    shipped catalog) and added to the cluster's ``device_types`` so that a plan embedding
    the cluster stays self-contained.

    Raises:
        InputError: a type needs derived times but no timed type has a known spec.
    """
    known = {**(load_catalog() if catalog is None else catalog), **cluster.device_types}
    types_used = sorted({d.type for d in cluster.devices})
    timings: dict[str, Timing] = {}
    assumptions: list[str] = []
    extra_types: dict[str, DeviceType] = {}
    for name in types_used:
        if name in model.timings:
            timings[name] = model.timings[name]
            continue
        refs = [r for r in sorted(model.timings) if r in known]
        if not refs:
            raise InputError(
                f"model profile {model.name!r}",
                "$.timings",
                f"has times for {sorted(model.timings)} but the cluster uses {name!r}; "
                "profile the model on that type, or add the timed type's spec to the "
                "cluster's device_types so times can be derived",
            )
        target = known[name]
        ref = min(
            refs,
            key=lambda r: (abs(math.log(known[r].effective_gflops / target.effective_gflops)), r),
        )
        factor = known[ref].effective_gflops / target.effective_gflops
        timings[name] = _scaled(model.timings[ref], factor)
        if ref not in cluster.device_types:
            extra_types[ref] = known[ref]
        assumptions.append(
            f"times for {name} derived from {ref} x {factor:.4g} "
            f"(effective GFLOP/s {known[ref].effective_gflops:.4g} / "
            f"{target.effective_gflops:.4g})"
        )
    if extra_types:
        cluster = replace(cluster, device_types={**cluster.device_types, **extra_types})
    for name in types_used:
        if len(timings[name].batch_sizes) == 1:
            assumptions.append(
                f"times for {name} come from one batch size "
                f"({timings[name].batch_sizes[0]}); other batch sizes scale proportionally"
            )
    return Problem(model, cluster, config, timings, tuple(assumptions))


def batch_range_notes(problem: Problem, partition: Partition) -> tuple[str, ...]:
    """One note per device type that ``partition`` runs on a number of samples per
    micro-batch outside its timing's ``valid_batch_range``: there its analytic batch curve
    is an extrapolation beyond the measurements it was fitted to (docs/profiles.md, "Analytic
    batch curves"). A device's batch is its ``samples`` share of the micro-batch; devices
    with no samples are skipped. O(devices)."""
    type_of = {d.id: d.type for d in problem.cluster.devices}
    outside: dict[str, tuple[tuple[int, int], set[int]]] = {}
    for stage in partition.stages:
        for device, samples in zip(stage.devices, stage.samples, strict=True):
            kind = type_of[device]
            valid = problem.timings[kind].valid_batch_range
            if samples > 0 and valid is not None and not valid[0] <= samples <= valid[1]:
                outside.setdefault(kind, (valid, set()))[1].add(samples)
    return tuple(
        f"times for {kind} at batch {', '.join(map(str, sorted(sizes)))} are extrapolated: "
        f"its analytic batch curve was fitted to measurements at batch {lo}-{hi} only"
        for kind, ((lo, hi), sizes) in sorted(outside.items())
    )


def check_partition(problem: Problem, partition: Partition) -> None:
    """Raise :class:`PlanMismatchError` unless ``partition`` fits ``problem``: stages
    cover blocks [0, L) contiguously and are non-empty, every device exists and serves
    one stage once, each takes at least one sample, a stage's samples sum to the
    micro-batch size, and micro-batch size x count = global batch.

    The one check of a decision against its inputs, made at every public entry that takes
    a partition (:func:`planner.plan.make_plan` and plan loading,
    :meth:`planner.cost.model.CostModel.evaluate`, :func:`planner.check.simulator.simulate`).
    O(P x g) for P stages of at most g devices: well under 1% of an ``evaluate``."""
    n_blocks = problem.model.num_blocks
    g = problem.config.global_batch
    mb, m = partition.micro_batch_size, partition.num_micro_batches
    if mb * m != g:
        raise PlanMismatchError(
            f"micro-batch size {mb} x {m} micro-batches = {mb * m}, but the config's "
            f"global batch is {g}; re-plan for this config"
        )
    expected_first = 0
    seen: set[str] = set()
    for p, stage in enumerate(partition.stages):
        if stage.first != expected_first or stage.end <= stage.first:
            raise PlanMismatchError(
                f"stage {p} covers blocks [{stage.first}, {stage.end}) but should start at "
                f"block {expected_first} and be non-empty; stages must tile the model's "
                f"{n_blocks} blocks in order"
            )
        expected_first = stage.end
        for dev in stage.devices:
            if not problem.cluster.has_device(dev):
                raise PlanMismatchError(
                    f"stage {p} uses device {_quoted(dev)}, which is not in cluster "
                    f"{_quoted(problem.cluster.name)}; re-plan for this cluster"
                )
            if dev in seen:
                raise PlanMismatchError(
                    f"device {_quoted(dev)} is listed twice (stage {p}); a device serves "
                    "one stage once"
                )
            seen.add(dev)
        if not stage.devices or len(stage.devices) != len(stage.samples):
            raise PlanMismatchError(
                f"stage {p} needs at least one device and one sample count per device"
            )
        if min(stage.samples) < 1:
            raise PlanMismatchError(
                f"stage {p} gives a device {min(stage.samples)} samples; list only devices "
                "that take at least one (others stay idle)"
            )
        if sum(stage.samples) != mb:
            raise PlanMismatchError(
                f"stage {p}'s devices take {sum(stage.samples)} samples per micro-batch, "
                f"but the micro-batch size is {mb}"
            )
    if expected_first != n_blocks:
        raise PlanMismatchError(
            f"the stages cover blocks [0, {expected_first}) but model "
            f"{_quoted(problem.model.name)} has {n_blocks} blocks; the plan was made for another "
            "model, re-plan for this one"
        )


def _quoted(value: str) -> str:
    return excerpt(repr(value), 40)
