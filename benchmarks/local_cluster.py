"""The cluster of the executor benchmarks: identical devices that are processes on this
machine (benchmarks/recovery.py, benchmarks/executor_overhead.py)."""

from __future__ import annotations

from edgepipe.planner.inputs.cluster import Cluster


def identical_cpus(n: int) -> Cluster:
    """``n`` identical devices ``d0`` .. ``d{n-1}`` of one type, ``host-cpu`` (this
    machine: 8 GiB, 100 GFLOP/s peak at efficiency 0.5), on a 10 Gbit/s, 0.05 ms network
    (loopback). The figures only steer a planner where a benchmark lets one choose; the
    runs measure this machine."""
    doc = {
        "schema_version": 1, "kind": "edgepipe.cluster", "name": f"identical-{n}",
        "device_types": {"host-cpu": {
            "description": "this machine", "memory_bytes": 8 * 2**30, "usable_fraction": 0.9,
            "peak_fp32_gflops": 100, "efficiency": 0.5,
            "network": {"interface": "loopback", "bandwidth_mbps": 10000},
            "sources": {"all": "benchmark figures"},
        }},
        "devices": [{"id": f"d{i}", "type": "host-cpu"} for i in range(n)],
        "network": {"bandwidth_mbps": 10000, "latency_ms": 0.05},
    }
    return Cluster.from_dict(doc, "benchmark cluster", catalog={})
