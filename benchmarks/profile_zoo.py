"""Profile every zoo model on this CPU and write the shipped model profiles.

For each model at the demo input size (images 64x64 at full width and depth, 1000
classes; transformers at their full configuration with 128-token sequences) this writes

* ``profiles/models/<model>-cpu.json``: measured on this machine (timing key
  ``--device-type``, default ``host-cpu``), and
* ``profiles/models/<model>-analytic.json``: the same blocks with analytic times for
  every device type of the shipped catalog (``executor.profiling.analytic``: FLOPs over each
  type's throughput, with per-block fixed costs fitted from the measured batch curve:
  ``profiles/raw/batch-curves/<model>-cpu-b1-*.json`` where one is shipped, more batch
  sizes and repeats than the profile, else the profile's own), no measured times,

and prints one line per model. Both carry the profile's ``build`` spec (zoo name, demo
sizes, seed 0), so their plans can be run by ``edgepipe run``. ``--analytic-only``
rebuilds the analytic files from the existing measured ones (after a catalog change)
without measuring again, and writes the build spec into both.

    .venv/bin/python benchmarks/profile_zoo.py                 # ~3 min, 1 thread
    .venv/bin/python benchmarks/profile_zoo.py --models resnet18 --repeats 5
    .venv/bin/python benchmarks/profile_zoo.py --analytic-only
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.analytic import analytic_profile
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner.inputs.cluster import load_catalog
from edgepipe.planner.inputs.profile import BuildSpec, ModelProfile, Timing

OUT = Path(__file__).resolve().parent.parent / "profiles" / "models"
CURVES = Path(__file__).resolve().parent.parent / "profiles" / "raw" / "batch-curves"

#: demo input sizes: 64x64 images, 128-token sequences, everything else at full size
DEMO_SIZES: dict[str, dict[str, Any]] = {
    name: {"resolution": 64} if entry.is_image else {"seq_len": 128}
    for name, entry in zoo.ZOO.items()
}


def write(profile: ModelProfile, path: Path) -> None:
    """Validate ``profile`` (schema round trip) and write it as indented JSON."""
    doc = profile.to_dict()
    ModelProfile.from_dict(doc, str(path))
    path.write_text(json.dumps(doc, indent=1) + "\n")


def analytic_reference(measured: ModelProfile, device_type: str) -> Timing:
    """The timing ``measured``'s analytic profile is fitted from: the shipped batch curve
    of the same model (``CURVES/<name>-cpu-b1-*.json``) where there is one, else the
    profile's own ``device_type`` timing."""
    curves = sorted(CURVES.glob(f"{measured.name}-cpu-b1-*.json"))
    if not curves:
        return measured.timings[device_type]
    curve = ModelProfile.load(curves[-1])
    if [b.name for b in curve.blocks] != [b.name for b in measured.blocks]:
        raise SystemExit(f"{curves[-1]} has other blocks than {measured.name}'s profile")
    return curve.timings[device_type]


def build_spec(name: str) -> BuildSpec:
    """How the executor rebuilds zoo model ``name`` at its demo size."""
    return BuildSpec(zoo=name, sizes=DEMO_SIZES[name], seed=0)


def measure(name: str, args: argparse.Namespace) -> ModelProfile:
    """Profile zoo model ``name`` at its demo size with the command-line settings."""
    size = DEMO_SIZES[name]
    return profile_model(
        zoo.build_model(name, seed=0, **size),
        partial(zoo.example_input, name, **size),
        args.batch_sizes,
        args.device_type,
        name=name,
        warmup=args.warmup,
        repeats=args.repeats,
        num_threads=args.threads,
        build=build_spec(name),
        clock=args.clock,
    )


def summary(profile: ModelProfile, device_type: str, seconds: float) -> str:
    """One table row: blocks, parameters, forward GFLOP/sample, step ms per batch size."""
    t = profile.timings[device_type]
    steps = [
        sum(t.forward_ms[i][j] + t.backward_ms[i][j] for i in range(profile.num_blocks))
        for j in range(len(t.batch_sizes))
    ]
    gflop = sum(b.forward_flops_per_sample or 0 for b in profile.blocks) / 1e9
    params = sum(b.param_bytes for b in profile.blocks) / 2**20
    cells = " ".join(f"{s:9.1f}" for s in steps)
    return (
        f"{profile.name:16s} {profile.num_blocks:6d} {params:9.1f} {gflop:9.3f} {cells}"
        f" {seconds:7.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(zoo.ZOO), choices=list(zoo.ZOO))
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8]
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--clock", choices=["wall", "thread"], default="wall",
        help="thread: time the thread's CPU time (one thread, on a shared machine)",
    )
    parser.add_argument("--device-type", default="host-cpu")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--analytic-only", action="store_true")
    args = parser.parse_args()

    catalog = load_catalog()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.analytic_only:
        sizes = " ".join(f"{'b=' + str(b) + ' ms':>9s}" for b in args.batch_sizes)
        print(
            f"{'model':16s} {'blocks':>6s} {'param MiB':>9s} {'GFLOP/smp':>9s} {sizes} "
            f"{'took s':>7s}"
        )
    for name in args.models:
        measured_path = args.out / f"{name}-cpu.json"
        if args.analytic_only:
            measured = replace(ModelProfile.load(measured_path), build=build_spec(name))
            write(measured, measured_path)
        else:
            start = time.perf_counter()
            measured = measure(name, args)
            write(measured, measured_path)
            print(summary(measured, args.device_type, time.perf_counter() - start), flush=True)
        write(
            analytic_profile(
                replace(measured, timings={}),
                catalog,
                reference=analytic_reference(measured, args.device_type),
            ),
            args.out / f"{name}-analytic.json",
        )


if __name__ == "__main__":
    main()
