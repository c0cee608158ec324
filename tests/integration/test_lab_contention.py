"""How the lab's shared medium shares itself (docs/decisions.md, "The shared medium is
shared by sender"): real TCP transfers between lab namespaces, started together, each
timed from its first send to its receiver's last byte, set against the cost model's rule
(:func:`planner.cost.channels.medium_shares`).

Three transfers of equal size on one medium, d0 -> d1, d0 -> d2 and d3 -> d1: by sender,
d0 and d3 get half the air each, d0's two pieces a quarter each; d3's piece ends at 2x
a transfer alone, and d0's, alone on the air from then on, at 3x. One share per transfer
(a third each) would end all three at 3x. The verdicts are ratios of transfers measured
together in one run, so the machine's load cancels (measured at load 14-19 on 2 cores:
d3's 1.99-2.04x, d0's 2.71-3.51x; benchmarks/network_semantics.py; at load 24, 1.57x
and 2.07x / 2.45x). A plain FIFO bucket on the medium (one share per TCP flow) fails
it: d3's 2.94x.
"""

from __future__ import annotations

import pytest
from edgepipe.executor.lab.network import LabNetwork
from edgepipe.planner.cost.channels import medium_shares

from tests.helpers import needs
from tests.helpers.lab_links import cluster, rates

NBYTES = 2_000_000  # 0.33 s alone at 50 Mbit/s, 1 s for the three


@pytest.fixture(autouse=True)
def lab_machine():
    """Fail, naming the fix, where root or iproute2 is missing (docs/testing.md)."""
    needs.network_namespaces()


# serial: a measured rate (docs/testing.md): three TCP senders in namespaces must each
# get their share of the shaped medium; in CI's parallel call (-n 4, load 2-3) d3's piece
# took 0.93 of d0's instead of <= 0.85
@pytest.mark.serial
def test_the_medium_is_shared_by_sender():
    transfers = [("d0", "d1"), ("d0", "d2"), ("d3", "d1")]
    # the shares by sender (planner/cost/channels.py): d0's two a quarter each, d3's half
    assert medium_shares([a for a, _ in transfers]) == [0.25, 0.25, 0.5]
    with LabNetwork(cluster(4, "shared_medium"), ["d0", "d1", "d2", "d3"]) as net:
        alone = 1 / rates(net, [transfers[2]], NBYTES)[0]
        took = [1 / r / alone for r in rates(net, transfers, NBYTES)]
    # d3's piece ends first: at 2/3 of d0's by sender, with them by transfer (1.0)
    assert took[2] / min(took[:2]) <= 0.85, took
    # and at 2x a transfer alone by sender, 3x by transfer (a loaded machine slows the
    # transfer alone too, which lowers every ratio: at load 24, 1.57x)
    assert took[2] <= 2.5, took
