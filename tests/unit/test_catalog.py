"""Specification of the shipped device catalog and example clusters: every figure has a
source, the CPU peaks follow the stated arithmetic, and every cluster loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from edgepipe.planner.inputs.cluster import Cluster, load_catalog
from edgepipe.planner.inputs.schema import validate

from tests.helpers.paths import REPO

CATALOG = REPO / "profiles" / "devices" / "catalog.json"
CLUSTERS = sorted((REPO / "profiles" / "clusters").glob("*.json"))
GiB = 2**30

#: type -> memory in GiB, as the brief and the spec sheets give it
REQUIRED = {
    "jetson-nano": 4,
    "jetson-tx2": 8,
    "jetson-xavier-nx": 8,
    "jetson-orin-nano": 8,
    "raspberry-pi-4": 4,
    "raspberry-pi-5": 8,
    "laptop-cpu": 16,
    "v100": 16,
}
FIGURES = ("memory", "peak_fp32_gflops", "efficiency", "network", "usable_fraction")


def test_catalog_validates_and_has_the_required_types() -> None:
    doc = json.loads(CATALOG.read_text())
    validate(doc, "edgepipe.device_catalog", str(CATALOG))
    catalog = load_catalog(CATALOG)
    assert load_catalog() == catalog  # the shipped default is this file
    for name, gib in REQUIRED.items():
        assert catalog[name].memory_bytes == gib * GiB, name


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_figure_has_a_source(name: str) -> None:
    t = load_catalog()[name]
    assert t.description
    for figure in FIGURES:
        src = t.sources.get(figure, "")
        assert "http" in src or "estimate" in src.lower(), f"{name}.{figure}: {src!r}"
    # estimates say so; spec-sheet figures carry a URL
    assert "estimate" in t.sources["efficiency"].lower()
    assert "estimate" in t.sources["usable_fraction"].lower()
    assert "http" in t.sources["memory"]
    assert "http" in t.sources["peak_fp32_gflops"]


def test_peaks_follow_the_stated_arithmetic() -> None:
    c = load_catalog()
    # GPUs: CUDA cores x 2 FLOP per FMA x max GPU clock
    assert c["jetson-nano"].peak_fp32_gflops == pytest.approx(128 * 2 * 0.9216, abs=0.05)
    assert c["jetson-tx2"].peak_fp32_gflops == pytest.approx(256 * 2 * 1.3)
    assert c["jetson-xavier-nx"].peak_fp32_gflops == pytest.approx(384 * 2 * 1.1)
    assert c["jetson-orin-nano"].peak_fp32_gflops == pytest.approx(1024 * 2 * 0.625)
    # CPUs: cores x GHz x FP32 FLOP per cycle
    assert c["raspberry-pi-4"].peak_fp32_gflops == pytest.approx(4 * 1.5 * 8)
    assert c["raspberry-pi-5"].peak_fp32_gflops == pytest.approx(4 * 2.4 * 16)
    assert c["laptop-cpu"].peak_fp32_gflops == pytest.approx(8 * 1.9 * 32)
    assert c["v100"].peak_fp32_gflops == 14000.0


def test_effective_speeds_are_ordered_sensibly() -> None:
    c = load_catalog()
    eff = {n: t.effective_gflops for n, t in c.items()}
    assert max(eff, key=eff.__getitem__) == "v100"
    assert eff["jetson-nano"] < eff["jetson-tx2"] < eff["jetson-xavier-nx"]
    assert eff["jetson-xavier-nx"] < eff["jetson-orin-nano"]
    assert eff["raspberry-pi-4"] < eff["raspberry-pi-5"] < eff["laptop-cpu"]
    for t in c.values():
        assert 0 < t.efficiency <= 1
        assert 0 < t.usable_fraction <= 1
        assert t.bandwidth_mbps > 0


def test_all_example_clusters_are_shipped() -> None:
    names = {p.stem for p in CLUSTERS}
    assert {"jetson-testbed-6", "pi-lab-4", "home-mixed-5", "orin-pair-2"} <= names


@pytest.mark.parametrize("path", CLUSTERS, ids=lambda p: p.stem)
def test_every_cluster_loads_and_names_types_only(path: Path) -> None:
    doc = json.loads(path.read_text())
    assert "device_types" not in doc  # types come from the catalog by name
    cluster = Cluster.load(path)
    assert cluster.name == path.stem
    assert cluster.description
    ids = [d.id for d in cluster.devices]
    assert len(ids) == len(set(ids))
    catalog = load_catalog()
    for d in cluster.devices:
        assert d.type in catalog
        assert cluster.device_types[d.type] == catalog[d.type]


def test_demo_cluster_is_six_jetsons_on_shared_wifi() -> None:
    c = Cluster.load(REPO / "profiles" / "clusters" / "jetson-testbed-6.json")
    assert [d.type for d in c.devices] == [
        "jetson-nano",
        "jetson-nano",
        "jetson-tx2",
        "jetson-tx2",
        "jetson-xavier-nx",
        "jetson-orin-nano",
    ]
    assert c.network.shared_medium
    assert c.bandwidth_mbps(0, 5) == 100  # the Wi-Fi, below every Jetson's gigabit port
    assert c.latency_ms(0, 5) == 3
    assert c.budget_bytes(0) == pytest.approx(4 * GiB * 0.6)
    assert c.budget_bytes(5) == pytest.approx(8 * GiB * 0.7)


def test_other_clusters() -> None:
    folder = REPO / "profiles" / "clusters"
    lab = Cluster.load(folder / "pi-lab-4.json")
    assert not lab.network.shared_medium
    assert lab.bandwidth_mbps(0, 3) == 940
    home = Cluster.load(folder / "home-mixed-5.json")
    assert home.network.shared_medium and len(home.network.links) == 1
    nano, laptop, orin = home.index("nano-0"), home.index("laptop-0"), home.index("orin-0")
    assert home.bandwidth_mbps(nano, laptop) == home.bandwidth_mbps(laptop, nano) == 40
    assert home.latency_ms(nano, laptop) == 8
    assert home.bandwidth_mbps(nano, orin) == 100
    pair = Cluster.load(folder / "orin-pair-2.json")
    assert len(pair.devices) == 2
