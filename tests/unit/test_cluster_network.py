"""Specification of :class:`Network`'s topology: the ``shared_medium`` flag (which the cost
model reads) and the topology (which the simulator and the channels read) cannot
disagree, whether the network is built in code or loaded from a cluster file."""

from __future__ import annotations

import pytest
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.cluster import Cluster, Network

from tests.helpers.paths import REPO


@pytest.mark.parametrize(("flag", "topology"), [
    (False, "shared_medium"),  # was priced as switched by the cost model's idle ring
    (True, "switched"),
    (True, "point_to_point"),
])
def test_a_network_built_in_code_refuses_a_topology_contradicting_its_flag(
        flag: bool, topology: str) -> None:
    with pytest.raises(InputError) as got:
        Network(8.0, 1.0, flag, topology=topology)  # type: ignore[arg-type]
    assert str(got.value) == (
        f"Network: topology: topology {topology!r} contradicts shared_medium {flag}; make "
        "them agree (shared_medium=True exactly when topology='shared_medium')")


@pytest.mark.parametrize(("flag", "topology", "kind"), [
    (False, None, "switched"),
    (True, None, "shared_medium"),
    (True, "shared_medium", "shared_medium"),
    (False, "switched", "switched"),
    (False, "point_to_point", "point_to_point"),
])
def test_a_flag_and_topology_that_agree_resolve_to_one_kind(
        flag: bool, topology: str | None, kind: str) -> None:
    network = Network(8.0, 1.0, flag, topology=topology)  # type: ignore[arg-type]
    # what the simulator reads and what the cost model reads (CostModel.shared_medium)
    assert (network.kind, network.shared_medium) == (kind, kind == "shared_medium")


def test_a_cluster_file_with_the_contradiction_is_refused_at_its_topology() -> None:
    doc = Cluster.load(REPO / "profiles" / "clusters" / "pi-lab-4.json").to_dict()
    doc["network"]["topology"] = "shared_medium"  # the file keeps shared_medium false
    with pytest.raises(InputError, match=r"^lab\.json: \$\.network\.topology: topology "
                       r"'shared_medium' contradicts shared_medium False"):
        Cluster.from_dict(doc, "lab.json")
