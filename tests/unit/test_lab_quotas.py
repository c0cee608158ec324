"""Specification of the lab's confinement of each device: CPU quotas in proportion to the
catalog's speeds within a share of this machine's cores, memory = budget + the measured
baseline of a worker process; figures worked by hand."""

from __future__ import annotations

import pytest
from edgepipe.executor.lab.cgroups import (
    PROCESS_BASELINE_BYTES,
    Confinement,
    confinements,
    type_quotas,
)
from edgepipe.executor.lab.errors import LabError
from edgepipe.planner.inputs.cluster import Cluster, Device, DeviceType, Network

GIB = 2**30


def device_type(name: str, gflops: float, memory_gib: float) -> DeviceType:
    # effective speed = peak x efficiency = gflops x 0.5 / 0.5
    return DeviceType(name, name, memory_gib * GIB, 0.5, 2 * gflops, 0.5, "eth", 1000.0)


def cluster(*devices: Device) -> Cluster:
    types = {"a": device_type("a", 100.0, 4), "b": device_type("b", 50.0, 2)}
    return Cluster("c", devices, Network(1000.0, 0.0), types)


C = cluster(Device("a0", "a"), Device("a1", "a"), Device("b0", "b"))
ALL = ["a0", "a1", "b0"]


def test_quotas_share_the_cores_in_proportion_to_speed() -> None:
    # speeds 100, 100, 50 (sum 250); half of 2 cores is 1 core: k = 1/250
    assert confinements(C, ALL, share=0.5, cores=2) == {
        "a0": Confinement(0.4, 2 * GIB + PROCESS_BASELINE_BYTES),  # 4 GiB x 0.5 usable
        "a1": Confinement(0.4, 2 * GIB + PROCESS_BASELINE_BYTES),
        "b0": Confinement(0.2, 1 * GIB + PROCESS_BASELINE_BYTES),
    }


def test_no_device_gets_more_than_one_core() -> None:
    # all of 4 cores would give the fast ones 1.6 each: capped at 1, k = 1/100
    got = confinements(C, ALL, share=1.0, cores=4)
    assert {d: c.cpu_cores for d, c in got.items()} == {"a0": 1.0, "a1": 1.0, "b0": 0.5}
    assert type_quotas(C, share=1.0, cores=4) == {"a": 1.0, "b": 0.5}


def test_the_scale_is_the_cluster_s_whatever_the_run_and_a_slowdown_slows() -> None:
    slowed = cluster(Device("a0", "a"), Device("a1", "a", slowdown=4.0), Device("b0", "b"))
    # speeds 100, 25 (a1 at a quarter) and 50: 1 core over 175 GFLOP/s, also for a run
    # of a0 and a1 alone (so a type's quota is the same in every plan's run)
    got = confinements(slowed, ["a0", "a1"], share=0.5, cores=2)
    assert {d: c.cpu_cores for d, c in got.items()} == {"a0": 0.5714, "a1": 0.1428}
    # the types at slowdown 1, what lab profiles are measured at: 100 / 175, 50 / 175
    assert type_quotas(slowed, share=0.5, cores=2) == {"a": 0.5714, "b": 0.2857}


def test_a_device_below_the_smallest_quota_is_named() -> None:
    tiny = cluster(Device("a0", "a"), Device("b0", "b"))
    slow = Cluster(
        "c", tiny.devices, tiny.network,
        {"a": device_type("a", 1000.0, 4), "b": device_type("b", 5.0, 2)},
    )
    # k = min(1 / 1005, 1 / 1000): b0 gets 5/1005 = 0.50% of a core, below 1%
    with pytest.raises(LabError, match=r"^device b0 would get 0\.50% of a core, below the "
                       r"kernel's smallest quota \(1%\): its speed is 200x slower"):
        confinements(slow, ["a0", "b0"], share=0.5, cores=2)
    with pytest.raises(LabError, match=r"^device type b would get 0\.50% of a core"):
        type_quotas(slow, share=0.5, cores=2)
