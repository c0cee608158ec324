"""What some tests need from the machine, checked so that such a test *fails*, naming
the fix, where it is missing: a skipped test would pass the suite silently (issue 27:
16 multi-host tests were skipped where ``ip`` was missing). ``.ci/run`` installs what
it can beforehand (docs/testing.md, "What the suite needs")."""

from __future__ import annotations

import os
import shutil

import pytest


def network_namespaces() -> None:
    """Fail the calling test unless this process can make network namespaces with
    shaped links (tests/helpers/netns.py): root, and iproute2's ``ip`` and ``tc``."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the multi-host tests need "
                    "iproute2 (apt-get install -y iproute2; .ci/run installs it)",
                    pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests make network namespaces: run the suite as root",
                    pytrace=False)


def cgroups() -> None:
    """Fail the calling test unless this process can confine lab devices in cgroups
    (executor/lab/cgroups.py): root, and the cpu and memory controllers mounted (v2, or
    v1 under ``cpu`` and ``memory``), and the directories the lab creates its groups in
    (``executor.lab.cgroups._parents``) writable."""
    from edgepipe.executor.lab.cgroups import CGROUP_ROOT, _parents, _version, check_available
    from edgepipe.executor.lab.errors import LabUnavailable

    try:
        check_available()
        missing = ""
    except LabUnavailable as exc:
        missing = str(exc)
    if missing:  # failed outside the handler: one line, no chained exception
        pytest.fail(f"{missing} (the lab's tests need them: run the suite as root where the "
                    "cgroup cpu and memory controllers are mounted writable; .ci/run "
                    "checks it)", pytrace=False)
    version = _version(CGROUP_ROOT)
    assert version is not None  # check_available passed
    locked = [p for p in _parents(CGROUP_ROOT, version) if not os.access(p, os.W_OK)]
    if locked:
        pytest.fail(f"{locked[0]} is not writable: the lab's tests create cgroups there "
                    "(mount it read-write, e.g. docker run --privileged or "
                    "--cgroupns=private with a writable /sys/fs/cgroup)", pytrace=False)
