"""The lab's network (executor/lab/network.py): links shaped to the cluster's bandwidth
measure that bandwidth over real TCP between device namespaces, transfers share exactly
the channels the cost model says they share (planner/cost/channels.py), and nothing the
lab creates outlives it.

Figures: a 50 Mbit/s link carries 50 x 1448/1514 = 47.8 Mbit/s of TCP payload (tbf counts
the Ethernet frame; :data:`GOODPUT`); a shared channel gives each of two transfers half.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from edgepipe.executor.lab import network
from edgepipe.executor.lab.errors import LabUnavailable
from edgepipe.executor.lab.network import GOODPUT, LabNetwork, leftover_namespaces

from tests.helpers import needs
from tests.helpers.lab_links import cluster, rates
from tests.helpers.processes import ctrl_c_at_default


@pytest.fixture(autouse=True)
def lab_machine():
    """Fail, naming the fix, where root or iproute2 is missing (docs/testing.md)."""
    needs.network_namespaces()


RATE = 50.0
FULL = RATE * GOODPUT  # 47.8 Mbit/s of payload
NBYTES = 3_000_000  # 0.5 s alone at FULL, 1 s shared
TOL = 0.12


def within(measured: list[float], want: float) -> bool:
    return all(abs(m / want - 1) <= TOL for m in measured)


def devices(n: int) -> list[str]:
    return [f"d{i}" for i in range(n)]


# each verdict is a measured rate (docs/testing.md): alone on the machine's CPU
@pytest.mark.serial
def test_point_to_point_every_pair_has_its_own_link():
    slow = cluster(3, "point_to_point", links=[("d0", "d2", RATE / 2)])
    with LabNetwork(slow, devices(3)) as net:
        assert within(rates(net, [("d0", "d1")], NBYTES), FULL)
        # d0 -> d1 and d2 -> d1 use two links: each at the full rate
        both = rates(net, [("d0", "d1"), ("d2", "d1")], NBYTES)
        assert within(both, FULL), both
        # a pair's own link rate, both ways
        assert within(rates(net, [("d2", "d0")], NBYTES // 2), FULL / 2)
        assert within(rates(net, [("d0", "d2")], NBYTES // 2), FULL / 2)
    assert leftover_namespaces() == []


@pytest.mark.serial
def test_switched_port_is_shared_by_transfers_into_one_device():
    with LabNetwork(cluster(4, "switched"), devices(4)) as net:
        assert within(rates(net, [("d0", "d1")], NBYTES), FULL)
        # into one device: its downlink is shared, each gets half
        into_one = rates(net, [("d0", "d1"), ("d2", "d1")], NBYTES)
        assert within(into_one, FULL / 2), into_one
        # between other ports: no channel in common, each at the full rate
        apart = rates(net, [("d0", "d1"), ("d2", "d3")], NBYTES)
        assert within(apart, FULL), apart
    assert leftover_namespaces() == []


@pytest.mark.serial
def test_shared_medium_carries_every_transfer_on_one_channel():
    with LabNetwork(cluster(4, "shared_medium"), devices(4)) as net:
        assert within(rates(net, [("d0", "d1")], NBYTES), FULL)
        # two transfers with no device in common still share the medium: half each
        apart = rates(net, [("d0", "d1"), ("d2", "d3")], NBYTES)
        assert within(apart, FULL / 2), apart
    assert leftover_namespaces() == []


def test_the_lab_says_what_it_does_not_reproduce():
    net = LabNetwork(cluster(2, "switched", latency_ms=2.0), devices(2))
    assert net.notes == ["the lab runs latency 0 (tc has no netem here); cluster "
                         "lab-switched-2's links have up to 2 ms, which predictions count"]
    assert leftover_namespaces() == []  # nothing is made before entering


def test_a_pair_link_a_switch_cannot_shape_is_named():
    odd = cluster(3, "switched", links=[("d0", "d2", 20.0)])
    assert LabNetwork(odd, devices(3)).notes == [
        "the lab shapes ports, not pairs, on a switched network: pair d0-d2 runs at "
        "50 Mbit/s, not its link's 20 (1 such pair(s))"]


def test_every_namespace_is_removed_when_the_body_raises():
    with pytest.raises(RuntimeError, match="boom"), LabNetwork(
        cluster(3, "shared_medium"), devices(3)
    ) as net:
        assert sorted(leftover_namespaces()) == sorted(
            [net.control_namespace, f"{net.control_namespace[:-4]}-hub",
             *(d.namespace for d in net.devices.values())])
        raise RuntimeError("boom")
    assert leftover_namespaces() == []


HOLD = textwrap.dedent("""
    import sys, time
    from edgepipe.executor.lab.network import LabNetwork
    from tests.helpers.lab_links import cluster
    with LabNetwork(cluster(2, "point_to_point"), ["d0", "d1"]):
        print("up", flush=True)
        time.sleep(60)
""")


def hold_in_child() -> subprocess.Popen[str]:
    # SIGINT at its default: a background job's children inherit it ignored (POSIX), and
    # an ignored Ctrl-C is what the user asked for, not what this test checks
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd(), preexec_fn=ctrl_c_at_default)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert len(leftover_namespaces(proc.pid)) == 3
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_tear_the_lab_down(sig):
    proc = hold_in_child()
    try:
        proc.send_signal(sig)
        proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert leftover_namespaces(proc.pid) == []


def test_namespaces_of_a_killed_process_are_removed_as_stale():
    proc = hold_in_child()
    proc.kill()
    proc.wait()
    left = leftover_namespaces(proc.pid)
    assert len(left) == 3
    assert set(left) <= set(network.remove_stale())  # and those of any other dead process
    assert leftover_namespaces(proc.pid) == []


def test_a_machine_without_iproute2_is_told_to_emulate(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabUnavailable) as err:
        network.check_available()
    assert str(err.value) == (
        "the lab cannot run here: it needs the `ip` command (iproute2), the `tc` command "
        "(iproute2); run the plan with --emulate instead (emulated devices and links)")
