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
