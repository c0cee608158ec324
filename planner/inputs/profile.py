"""Model profiles: a DNN as an ordered chain of blocks, with sizes and per-device-type times.

A block is the unit the planner cuts between (a layer, a residual unit, a transformer
layer). Per block the profile records parameter bytes, the bytes per sample of its output
(what crosses a stage cut), the bytes per sample it saves for backward, and optionally its
forward FLOPs per sample. Per device type it records forward and backward milliseconds at
several batch sizes (shared by all blocks of that type); the cost model interpolates
between them (:func:`batch_curve`), never assuming time proportional to batch; the cost
model and the simulator both read times through it.

An optional :class:`BuildSpec` says how the executor builds the model (a zoo name with
sizes and seed, or a ``package.module:callable`` with keyword arguments); a profile
without one (an imported PipeDream profile) can be planned but not run.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.schema import load_document, validate

KIND = "edgepipe.model_profile"


@dataclass(frozen=True)
class Block:
    """One block of the chain. Sizes are bytes; ``*_per_sample`` scale with the batch."""

    name: str
    param_bytes: float
    output_bytes_per_sample: float
    saved_bytes_per_sample: float
    forward_flops_per_sample: float | None = None
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Noise:
    """How a measured timing settled (executor/profiling/noise.py): ``rounds`` whole
    profiles taken, the relative ``spread`` (max - min) / median of the last rounds'
    totals, the highest 1-minute ``load_average`` seen, and whether the spread met the
    threshold (``stable``)."""

    rounds: int
    spread: float
    load_average: float
    stable: bool


@dataclass(frozen=True)
class LabQuota:
    """The confinement a ``lab`` timing was measured in (docs/lab.md, "Lab profiles"):
    ``cpu_cores`` of one core (the CPU quota), the memory limit in bytes (None: none),
    torch ``threads``, and ``measured_cores``: the CPU time the process got over the wall
    time it ran, the share of a core it actually reached."""

    cpu_cores: float
    mem_bytes: int | None
    threads: int
    measured_cores: float


@dataclass(frozen=True)
class RuntimeWork:
    """The executor's own CPU work per micro-batch of a stage beyond its blocks' compute,
    in ms on the device type (``edgepipe lab profile``; docs/lab.md, "Runtime work per
    action"): ``forward_ms`` for the actions RECV_F, F and SEND_F of one micro-batch,
    ``backward_ms`` for RECV_B, B and SEND_B, as on a stage with a neighbour on both
    sides; ``spread`` (max - min) / median of the rounds kept (the larger of the two
    measurements'), ``rounds`` taken. The cost model adds it to every used device's
    forward and backward per micro-batch.

    ``step_ms_per_mib``: per optimizer (``sgd``, ``momentum``, ``adam``, sorted by name)
    the optimizer step's ms per MiB (2^20 bytes) of parameters on the device type
    (docs/cost-model.md, "The optimizer step"); the cost model charges a device
    ``step_ms(optimizer) x its stage's parameter MiB`` once per iteration, after its
    last backward and its stage's all-reduce. Empty, or the config's optimizer absent: 0.
    """

    forward_ms: float
    backward_ms: float
    spread: float = 0.0
    rounds: int = 1
    step_ms_per_mib: tuple[tuple[str, float], ...] = ()

    def scaled(self, factor: float) -> RuntimeWork:
        """The same work on a device ``factor`` times slower."""
        return replace(self, forward_ms=self.forward_ms * factor,
                       backward_ms=self.backward_ms * factor,
                       step_ms_per_mib=tuple((k, v * factor) for k, v in self.step_ms_per_mib))

    def step_ms(self, optimizer: str) -> float:
        """The optimizer step's ms per MiB of parameters for ``optimizer`` (0 when not
        measured)."""
        return dict(self.step_ms_per_mib).get(optimizer, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The profile's ``runtime_work`` object; ``step_ms_per_mib`` only when measured,
        so a profile without it writes what it did before."""
        out: dict[str, Any] = {"forward_ms": self.forward_ms, "backward_ms": self.backward_ms,
                               "spread": self.spread, "rounds": self.rounds}
        if self.step_ms_per_mib:
            out["step_ms_per_mib"] = dict(self.step_ms_per_mib)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RuntimeWork:
        """From the schema-validated ``runtime_work`` object."""
        return cls(d["forward_ms"], d["backward_ms"], d["spread"], d["rounds"],
                   tuple(sorted((k, float(v)) for k, v in d.get("step_ms_per_mib", {}).items())))


@dataclass(frozen=True)
class Timing:
    """Forward/backward times of every block on one device type.

    ``forward_ms[b][j]`` is block ``b``'s forward time at ``batch_sizes[j]`` samples.
    ``noise``: how the measurement settled; ``lab``: the confinement of a ``lab``
    timing; ``runtime_work``: the runtime's per-micro-batch work (None: 0).
    ``valid_batch_range`` (analytic timings): the smallest and largest batch size of the
    measurements the batch curve was fitted to, and validated on where they allow it
    (docs/profiles.md, "Analytic batch curves"); outside it the times are an
    extrapolation, and a plan that runs a device there says so.
    """

    batch_sizes: tuple[int, ...]
    forward_ms: tuple[tuple[float, ...], ...]
    backward_ms: tuple[tuple[float, ...], ...]
    source: str | None = None
    forward_spread_ms: tuple[tuple[float, ...], ...] | None = None
    backward_spread_ms: tuple[tuple[float, ...], ...] | None = None
    repeats: int | None = None
    valid_batch_range: tuple[int, int] | None = None
    noise: Noise | None = None
    lab: LabQuota | None = None
    runtime_work: RuntimeWork | None = None


def batch_curve(batch_sizes: tuple[int, ...], times: np.ndarray, max_batch: int) -> np.ndarray:
    """Times at every integer batch 0..max_batch from times measured at ``batch_sizes``.

    ``times`` has shape (blocks, len(batch_sizes)); the result (blocks, max_batch + 1).
    Between measured sizes b_1 < ... < b_k time is interpolated linearly; below b_1 it
    falls proportionally to 0 at batch 0; above b_k it grows with the last segment's
    slope (proportionally when k = 1). O(blocks x max_batch).
    """
    sizes = np.asarray(batch_sizes, dtype=float)
    ys = np.arange(max_batch + 1, dtype=float)
    out = np.empty((times.shape[0], max_batch + 1))
    for r, row in enumerate(times):
        curve = np.interp(ys, sizes, row)
        low = ys < sizes[0]
        curve[low] = row[0] * ys[low] / sizes[0]
        high = ys > sizes[-1]
        if len(sizes) == 1:
            slope = row[0] / sizes[0]
        else:
            slope = max((row[-1] - row[-2]) / (sizes[-1] - sizes[-2]), 0.0)
        curve[high] = row[-1] + slope * (ys[high] - sizes[-1])
        out[r] = curve
    return out


@dataclass(frozen=True)
class BuildSpec:
    """How to build the profiled model: exactly one of ``zoo`` (a zoo model name, built
    with ``sizes`` and initialised per block from ``seed``) or ``callable``
    (``"package.module:callable"`` called with ``kwargs``; ``loss`` optionally names a
    ``package.module:callable`` loss, default mean cross-entropy)."""

    zoo: str | None = None
    sizes: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    callable: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss: str | None = None

    def __post_init__(self) -> None:
        if (self.zoo is None) == (self.callable is None):
            raise InputError("model profile", "$.build", "give exactly one of zoo or callable")

    def describe(self) -> str:
        """``vgg16(resolution=64, seed 0)`` or ``pkg.mod:fn(width=8)``."""
        if self.zoo is not None:
            args = ", ".join(f"{k}={v}" for k, v in sorted(self.sizes.items()))
            return f"{self.zoo}({args}{', ' if args else ''}seed {self.seed})"
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.kwargs.items()))
        return f"{self.callable}({args})"

    def to_dict(self) -> dict[str, Any]:
        if self.zoo is not None:
            return {"zoo": self.zoo, "sizes": dict(self.sizes), "seed": self.seed}
        out: dict[str, Any] = {"callable": self.callable, "kwargs": dict(self.kwargs)}
        if self.loss is not None:
            out["loss"] = self.loss
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildSpec:
        """From the schema-validated ``build`` object."""
        if "zoo" in d:
            return cls(zoo=d["zoo"], sizes=dict(d.get("sizes", {})), seed=d.get("seed", 0))
        return cls(callable=d["callable"], kwargs=dict(d.get("kwargs", {})), loss=d.get("loss"))


@dataclass(frozen=True)
class ModelProfile:
    """A profiled model; ``timings`` maps a device type name to its :class:`Timing`."""

    name: str
    source: dict[str, str]
    input_bytes_per_sample: float
    blocks: tuple[Block, ...]
    timings: dict[str, Timing] = field(default_factory=dict)
    build: BuildSpec | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def to_dict(self) -> dict[str, Any]:
        blocks = []
        for b in self.blocks:
            d: dict[str, Any] = {
                "name": b.name,
                "param_bytes": b.param_bytes,
                "output_bytes_per_sample": b.output_bytes_per_sample,
                "saved_bytes_per_sample": b.saved_bytes_per_sample,
            }
            if b.forward_flops_per_sample is not None:
                d["forward_flops_per_sample"] = b.forward_flops_per_sample
            if b.members:
                d["members"] = list(b.members)
            blocks.append(d)
        timings: dict[str, Any] = {}
        for type_name, t in self.timings.items():
            td: dict[str, Any] = {
                "batch_sizes": list(t.batch_sizes),
                "forward_ms": [list(r) for r in t.forward_ms],
                "backward_ms": [list(r) for r in t.backward_ms],
            }
            if t.source is not None:
                td["source"] = t.source
            if t.forward_spread_ms is not None:
                td["forward_spread_ms"] = [list(r) for r in t.forward_spread_ms]
            if t.backward_spread_ms is not None:
                td["backward_spread_ms"] = [list(r) for r in t.backward_spread_ms]
            if t.repeats is not None:
                td["repeats"] = t.repeats
            if t.valid_batch_range is not None:
                td["valid_batch_range"] = list(t.valid_batch_range)
            if t.noise is not None:
                td["noise"] = asdict(t.noise)
            if t.lab is not None:
                td["lab"] = asdict(t.lab)
            if t.runtime_work is not None:
                td["runtime_work"] = t.runtime_work.to_dict()
            timings[type_name] = td
        out: dict[str, Any] = {
            "schema_version": 1,
            "kind": KIND,
            "name": self.name,
            "source": dict(self.source),
        }
        if self.build is not None:
            out["build"] = self.build.to_dict()
        out.update(
            input_bytes_per_sample=self.input_bytes_per_sample, blocks=blocks, timings=timings
        )
        return out

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<model profile>") -> ModelProfile:
        """Validate ``doc`` (schema + shape checks) and build the profile."""
        validate(doc, KIND, source)
        blocks = tuple(
            Block(
                name=b["name"],
                param_bytes=b["param_bytes"],
                output_bytes_per_sample=b["output_bytes_per_sample"],
                saved_bytes_per_sample=b["saved_bytes_per_sample"],
                forward_flops_per_sample=b.get("forward_flops_per_sample"),
                members=tuple(b.get("members", ())),
            )
            for b in doc["blocks"]
        )
        timings = {
            name: _timing_from_dict(t, len(blocks), source, f"$.timings.{name}")
            for name, t in doc["timings"].items()
        }
        return cls(
            name=doc["name"],
            source=dict(doc["source"]),
            input_bytes_per_sample=doc["input_bytes_per_sample"],
            blocks=blocks,
            timings=timings,
            build=BuildSpec.from_dict(doc["build"]) if "build" in doc else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> ModelProfile:
        return cls.from_dict(load_document(path, KIND), str(path))


def _matrix(
    rows: list[list[float]], n_blocks: int, n_batch: int, source: str, path: str
) -> tuple[tuple[float, ...], ...]:
    if len(rows) != n_blocks:
        raise InputError(
            source,
            path,
            f"has {len(rows)} rows but the profile has {n_blocks} blocks; give one row per block",
        )
    for i, row in enumerate(rows):
        if len(row) != n_batch:
            raise InputError(
                source,
                f"{path}[{i}]",
                f"has {len(row)} times but there are {n_batch} "
                "batch sizes; give one time per batch size",
            )
    return tuple(tuple(float(x) for x in row) for row in rows)


def _timing_from_dict(t: dict[str, Any], n_blocks: int, source: str, path: str) -> Timing:
    sizes = tuple(t["batch_sizes"])
    if any(b <= a for a, b in itertools.pairwise(sizes)):
        raise InputError(source, f"{path}.batch_sizes", "batch sizes must be strictly increasing")
    n = len(sizes)
    valid = t.get("valid_batch_range")
    if valid is not None and valid[0] > valid[1]:
        raise InputError(
            source,
            f"{path}.valid_batch_range",
            f"{valid} runs backwards; give the smallest batch size first",
        )

    def opt(key: str) -> tuple[tuple[float, ...], ...] | None:
        return _matrix(t[key], n_blocks, n, source, f"{path}.{key}") if key in t else None

    return Timing(
        batch_sizes=sizes,
        forward_ms=_matrix(t["forward_ms"], n_blocks, n, source, f"{path}.forward_ms"),
        backward_ms=_matrix(t["backward_ms"], n_blocks, n, source, f"{path}.backward_ms"),
        source=t.get("source"),
        forward_spread_ms=opt("forward_spread_ms"),
        backward_spread_ms=opt("backward_spread_ms"),
        repeats=t.get("repeats"),
        valid_batch_range=None if valid is None else (valid[0], valid[1]),
        noise=Noise(**t["noise"]) if "noise" in t else None,
        lab=LabQuota(**t["lab"]) if "lab" in t else None,
        runtime_work=RuntimeWork.from_dict(t["runtime_work"]) if "runtime_work" in t else None,
    )
