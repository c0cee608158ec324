"""Plans and checks for lab runs (tests/integration/test_lab_run.py).

:func:`lab_plan` is :func:`tests.helpers.executor_helpers.make_test_plan`'s plan on a
network the lab can shape exactly (a topology, latency 0); :func:`leftovers` lists what a
lab process left behind: its network namespaces and its cgroups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgepipe.executor.lab.network import leftover_namespaces
from edgepipe.planner.inputs.cluster import Cluster, Topology
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import ModelProfile
from edgepipe.planner.plan import Plan, SolverInfo, make_plan

from tests.helpers.executor_helpers import make_test_plan

CGROUPS = Path("/sys/fs/cgroup")


def lab_plan(profile: ModelProfile, stages: Any, micro_batch: int, micro_batches: int,
             topology: Topology, bandwidth_mbps: float = 100.0, **cfg: Any) -> Plan:
    """``make_test_plan(...)`` on a ``topology`` network of ``bandwidth_mbps``, latency 0,
    unreplicated (the lab does not recover)."""
    base = make_test_plan(profile, stages, micro_batch, micro_batches,
                          replication_interval=0, **cfg)
    doc = base.problem.cluster.to_dict()
    doc["network"] = {"bandwidth_mbps": bandwidth_mbps, "latency_ms": 0.0,
                      "topology": topology}
    cluster = Cluster.from_dict(doc, "lab test cluster", catalog={})
    problem = make_problem(base.problem.model, cluster, base.problem.config, catalog={})
    return make_plan(problem, base.partition, SolverInfo("hand"))


def leftovers(pid: int) -> list[str]:
    """Network namespaces and cgroups (any controller, any depth) of lab process ``pid``."""
    groups = [str(p) for p in CGROUPS.rglob(f"edgepipe-{pid}-*") if p.is_dir()]
    return leftover_namespaces(pid) + groups
