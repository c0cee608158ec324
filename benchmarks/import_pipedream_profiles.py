"""Import the four PipeDream profiles shipped as data into ``profiles/models/``.

Re-runnable: ``python benchmarks/import_pipedream_profiles.py [--data-dir DIR] [--out DIR]``.
By default it reads ``profiles/raw/pipedream`` (in the repository) and
writes ``profiles/models/pipedream-<model>.json``, then prints one line per model.

The profiled minibatch is not the same for all four files. It is read off the Input node
(``activation_size`` of one 3x224x224 fp32 image is 602,112 bytes) and cross-checked on
the last Linear layer (1000 fp32 logits = 4,000 bytes per sample):

=============  ============================  =====================  =====
model          Input activation_size          last Linear output     batch
=============  ============================  =====================  =====
alexnet        154,140,672 = 256 x 602,112   1,024,000 = 256 x 4000   256
vgg16           77,070,336 = 128 x 602,112     512,000 = 128 x 4000   128
resnet18       154,140,672 = 256 x 602,112   1,024,000 = 256 x 4000   256
squeezenet1_0  154,140,672 = 256 x 602,112   (conv10 + avgpool)       256
=============  ============================  =====================  =====

The script refuses to write a profile whose input bytes per sample differ from 602,112,
so a wrong batch cannot slip through.

It then imports a synthetic NASNet-style graph of 400 layers (25 cells of five
two-branch units, each unit two convolutions summed by a free ``Add``, the cell's
``Concat`` free, every cell reading the two cells before it: skip connections
everywhere), prints its layer, free-layer and block counts and the import time, and
plans it with the DP on 16 identical Jetson Orin Nanos (gigabit switch), printing the
planning time (wall and this process's CPU time: on a shared machine the second is the
steadier figure). Nothing is written for it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import time  # noqa: E402

from edgepipe.planner.inputs.cluster import Cluster, Device, Network, load_catalog  # noqa: E402
from edgepipe.planner.inputs.config import TrainingConfig  # noqa: E402
from edgepipe.planner.inputs.importers.pipedream import import_pipedream, parse_pipedream  # noqa: E402
from edgepipe.planner.inputs.problem import make_problem  # noqa: E402
from edgepipe.planner.inputs.profile import ModelProfile  # noqa: E402
from edgepipe.planner.solvers.dp.driver import plan_dp  # noqa: E402

from tests.helpers.synthetic import nasnet_like  # noqa: E402

#: model -> profiled minibatch (see the module docstring for the evidence)
BATCH = {"alexnet": 256, "vgg16": 128, "resnet18": 256, "squeezenet1_0": 256}

#: bytes of one 3x224x224 fp32 ImageNet sample
IMAGE_BYTES = 3 * 224 * 224 * 4

#: device type the PipeDream times were measured on (see profiles/devices/catalog.json)
DEVICE_TYPE = "v100"


def dense_row() -> str:
    """Import :func:`nasnet_like` and plan it with the DP on 16 Orin Nanos: one line."""
    text = nasnet_like()
    start = time.perf_counter()
    profile = parse_pipedream(text, "nasnet-like", batch_size=32, device_type=DEVICE_TYPE)
    import_ms = (time.perf_counter() - start) * 1e3
    layers = sum(len(b.members) for b in profile.blocks)
    free = sum(1 for line in text.splitlines() if "Add()" in line or "Concat(1)" in line)
    catalog = load_catalog()
    kinds = {"jetson-orin-nano": catalog["jetson-orin-nano"], DEVICE_TYPE: catalog[DEVICE_TYPE]}
    cluster = Cluster(
        "orin-16",
        tuple(Device(f"orin-{i}", "jetson-orin-nano") for i in range(16)),
        Network(940.0, 0.2, False),
        {"jetson-orin-nano": kinds["jetson-orin-nano"]},
    )
    problem = make_problem(profile, cluster, TrainingConfig(64), catalog=kinds)
    start, cpu = time.perf_counter(), time.process_time()
    plan = plan_dp(problem, time_limit=120.0)
    plan_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return (
        f"nasnet-like: {layers} layers ({free} free), {profile.num_blocks} blocks, import "
        f"{import_ms:.0f} ms; DP on 16 Orin Nanos {plan_s:.1f} s ({cpu_s:.1f} s CPU, "
        f"{plan.status}): "
        f"{plan.partition.num_stages} stages, {plan.cost.iteration_ms:.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / "profiles" / "raw" / "pipedream",
        help="folder with <model>.graph.txt files (default: profiles/raw/pipedream)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "profiles" / "models",
        help="output folder (default: profiles/models)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"{'model':<14} {'batch':>5} {'nodes':>5} {'blocks':>6} {'params MB':>10} "
        f"{'fwd ms':>8} {'bwd ms':>8}"
    )
    for model, batch in BATCH.items():
        src = args.data_dir / f"{model}.graph.txt"
        profile = import_pipedream(
            src, batch_size=batch, device_type=DEVICE_TYPE, name=f"pipedream-{model}"
        )
        if profile.input_bytes_per_sample != IMAGE_BYTES:
            print(
                f"{model}: input is {profile.input_bytes_per_sample} bytes per sample, "
                f"expected {IMAGE_BYTES}; is batch {batch} right?",
                file=sys.stderr,
            )
            return 1
        doc = profile.to_dict()
        if ModelProfile.from_dict(doc, str(src)) != profile:
            print(f"{model}: profile does not round-trip", file=sys.stderr)
            return 1
        (args.out / f"pipedream-{model}.json").write_text(json.dumps(doc, indent=1) + "\n")
        t = profile.timings[DEVICE_TYPE]
        nodes = sum(len(b.members) for b in profile.blocks)
        print(
            f"{model:<14} {batch:>5} {nodes:>5} {profile.num_blocks:>6} "
            f"{sum(b.param_bytes for b in profile.blocks) / 1e6:>10.1f} "
            f"{sum(r[0] for r in t.forward_ms):>8.1f} {sum(r[0] for r in t.backward_ms):>8.1f}"
        )
    print(dense_row())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
