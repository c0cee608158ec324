"""Devices joining a run (issue 8, "a new device joining"): the cluster document a joiner
brings, and the checks of the plan that admits it."""

from __future__ import annotations

from tests.helpers.executor_helpers import HOST_CPU


def join_doc(*ids: str) -> dict:
    """A cluster document of the devices ``ids``, each of the tests' type ``host-cpu``."""
    return {
        "schema_version": 1, "kind": "edgepipe.cluster", "name": "joining",
        "device_types": {"host-cpu": HOST_CPU},
        "devices": [{"id": d, "type": "host-cpu"} for d in ids],
        "network": {"bandwidth_mbps": 1000, "latency_ms": 0.1},
    }


def serves(plan, device: str) -> tuple[int, int, int]:
    """(first block, end block, samples per micro-batch) of ``device`` in ``plan``."""
    for stage in plan.partition.stages:
        if device in stage.devices:
            return stage.first, stage.end, stage.samples[stage.devices.index(device)]
    raise AssertionError(f"{device} serves no stage of {plan.id}")


def assert_each_serves_blocks_received_from_their_owner(plan, new, devices) -> None:
    """Each of ``devices`` serves blocks and samples in ``new``, and every block it
    serves was sent to it by a device that served that block under ``plan``."""
    for device in devices:
        first, end, samples = serves(new, device)
        assert end > first and samples > 0
        moved = [t for t in new.migration if t.to == device]
        assert sorted(i for t in moved for i in range(t.first, t.end)) == list(
            range(first, end))
        assert all(serves(plan, t.source)[0] <= t.first < t.end <= serves(plan, t.source)[1]
                   for t in moved)
