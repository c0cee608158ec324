"""Facts about this host for the ``source`` of measured profiles and probed devices."""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_detail(num_threads: int) -> str:
    """One line naming host, CPU, cores, torch threads and torch version."""
    return (
        f"{platform.node()}: {cpu_model()}, {os.cpu_count()} cores, {num_threads} torch "
        f"threads, torch {torch.__version__}"
    )


def now_iso() -> str:
    """Current UTC time, ISO 8601, whole seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")
