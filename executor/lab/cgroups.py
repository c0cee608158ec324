"""Compute confinement of lab devices: a CPU quota and a memory limit per device (cgroups).

Each lab device's process runs in its own control group ``edgepipe-<pid>-<rand>-<device>``
(``<pid>`` the process that created it, so :func:`remove_stale` can tell a dead creator's
groups) with

* a **CPU quota** of ``cpu_cores`` of one core per CFS period of 100 ms (cgroup v2
  ``cpu.max``; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), or for a *paced* device
  (one whose process paces itself to ``cpu_cores``, :mod:`executor.lab.pacing`) a
  ceiling of :data:`executor.lab.pacing.CEILING` x ``cpu_cores`` per period of
  :data:`executor.lab.pacing.PERIOD_US`, and the highest CPU weight (v2
  ``cpu.weight`` 10000, v1 ``cpu.shares`` 262144), so that the quota is a ceiling the
  device reaches even while other processes load the machine;
* a **memory limit** (v2 ``memory.max``; v1 ``memory.limit_in_bytes``) with swap off for
  the group (v2 ``memory.swap.max`` 0; v1 ``memory.swappiness`` 0 and
  ``memory.memsw.limit_in_bytes`` equal to the limit where the kernel accounts swap), so a
  plan that does not fit is killed by the kernel's OOM killer instead of swapping.

Where the groups go: with cgroup v2 (``<root>/cgroup.controllers`` lists ``cpu`` and
``memory``) at the top of the unified hierarchy, whose ``cgroup.subtree_control`` gets
``+cpu +memory``; with v1 inside this process's own group of each controller (read from
``/proc/self/cgroup``), so that the lab's processes stay under whatever limits and
accounting the caller is under. docs/lab.md, "Compute", says how quotas are chosen.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import secrets
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from edgepipe.executor.lab import pacing
from edgepipe.executor.lab.errors import LabError, LabUnavailable
from edgepipe.planner.check.live import pid_alive
from edgepipe.planner.inputs.cluster import Cluster

#: where cgroup file systems are mounted
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: every group the lab creates starts with this
PREFIX = "edgepipe"
#: CFS period of the CPU quota, microseconds (the kernel's default)
CFS_PERIOD_US = 100_000
#: the smallest quota the kernel takes is 1 ms per period: 1% of a core at 100 ms
MIN_CPU_CORES = 1_000 / CFS_PERIOD_US
#: resident memory of a worker process with torch imported and gloo initialised, before
#: any model, as docs/lab.md "Compute" says: 228 MiB in the developers' venv, 288 MiB in
#: CI's freshly installed one (dependencies at their newest), so 320 MiB
PROCESS_BASELINE_BYTES = 320 * 2**20
#: the highest CPU weight of each cgroup version (v1 ``cpu.shares``, v2 ``cpu.weight``)
_MAX_WEIGHT = {1: "262144", 2: "10000"}

Version = Literal[1, 2]


@dataclass(frozen=True)
class Confinement:
    """What a lab device gets: ``cpu_cores`` of one core (0.25: a quarter) and a memory
    limit in bytes (None: no limit). ``paced``: its process paces itself to
    ``cpu_cores`` (:mod:`executor.lab.pacing`) and the group's quota is a ceiling above
    it (module docstring)."""

    cpu_cores: float
    mem_bytes: int | None
    paced: bool = False

    def quota_us(self) -> tuple[int, int]:
        """The group's CPU quota and CFS period, microseconds (module docstring; the
        kernel's smallest quota is 1 ms)."""
        if self.paced:
            return round(self.cpu_cores * pacing.CEILING * pacing.PERIOD_US), pacing.PERIOD_US
        return max(round(self.cpu_cores * CFS_PERIOD_US), 1_000), CFS_PERIOD_US


def _version(root: Path) -> Version | None:
    """2 where a unified hierarchy with the cpu and memory controllers is mounted at
    ``root``, 1 where v1's cpu and memory hierarchies are, else None."""
    controllers = root / "cgroup.controllers"
    if controllers.exists() and {"cpu", "memory"} <= set(controllers.read_text().split()):
        return 2
    if (root / "cpu" / "cpu.cfs_quota_us").exists() and (
        root / "memory" / "memory.limit_in_bytes"
    ).exists():
        return 1
    return None


def check_available(root: Path = CGROUP_ROOT) -> None:
    """Raise :class:`LabUnavailable` naming what is missing (root, a cgroup controller)
    unless this machine can confine lab devices; O(1)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (run as root)")
    if _version(root) is None:
        have = []
        if (root / "cpu" / "cpu.cfs_quota_us").exists() or _v2_has(root, "cpu"):
            have.append("cpu")
        if (root / "memory" / "memory.limit_in_bytes").exists() or _v2_has(root, "memory"):
            have.append("memory")
        lacking = [c for c in ("cpu", "memory") if c not in have]
        missing.append(
            f"the cgroup {' and '.join(lacking)} controller{'s' if len(lacking) > 1 else ''} "
            f"(mounted neither as cgroup v2 at {root} nor as v1 under {root}/cpu and "
            f"{root}/memory)"
        )
    if missing:
        raise LabUnavailable(
            f"the lab needs {'; '.join(missing)}; run the plan with --emulate instead"
        )


def _v2_has(root: Path, controller: str) -> bool:
    controllers = root / "cgroup.controllers"
    return controllers.exists() and controller in controllers.read_text().split()


def _own_path(controller: str) -> str:
    """This process's group in v1 hierarchy ``controller`` (``/`` if not listed)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path
    return "/"


def _parents(root: Path, version: Version) -> tuple[Path, ...]:
    """The directories new groups are created in (module docstring)."""
    if version == 2:
        return (root,)
    parents = []
    for controller in ("cpu", "memory"):
        own = root / controller / _own_path(controller).lstrip("/")
        parents.append(own if own.is_dir() else root / controller)
    return tuple(parents)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise LabError(f"writing {value!r} to {path} failed: {exc.strerror or exc}") from exc


def group_name(device: str, pid: int | None = None) -> str:
    """``edgepipe-<pid>-<rand>-<device>``, the device id reduced to ``[A-Za-z0-9_.-]``."""
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", device)[:64] or "device"
    return f"{PREFIX}-{os.getpid() if pid is None else pid}-{secrets.token_hex(3)}-{label}"


@dataclass(frozen=True)
class Cgroup:
    """One lab device's control group: one directory under v2, one per controller (cpu,
    memory) under v1. Picklable, so a child process may :meth:`add` itself."""

    name: str
    version: Version
    dirs: tuple[Path, ...]
    confinement: Confinement

    @classmethod
    def create(
        cls, name: str, confinement: Confinement, root: Path = CGROUP_ROOT
    ) -> Cgroup:
        """Create the group of device ``name`` (named :func:`group_name` of it) and set
        its quota, weight and memory limit. A failure removes what was made and raises
        :class:`LabError`; no cgroups at ``root`` raises :class:`LabUnavailable`."""
        if not MIN_CPU_CORES <= confinement.cpu_cores <= 1.0:
            raise ValueError(
                f"cpu_cores {confinement.cpu_cores} is outside [{MIN_CPU_CORES}, 1]"
            )
        check_available(root)
        version = _version(root)
        assert version is not None  # check_available raised otherwise
        full = group_name(name)
        if version == 2:
            _enable_v2_controllers(root)
        group = cls(full, version, tuple(p / full for p in _parents(root, version)),
                    confinement)
        try:
            for d in group.dirs:
                d.mkdir()
            group._configure()
        except BaseException:
            group.remove()
            raise
        return group

    @property
    def _cpu(self) -> Path:
        return self.dirs[0]

    @property
    def _memory(self) -> Path:
        return self.dirs[-1]

    def _configure(self) -> None:
        quota, period = self.confinement.quota_us()
        mem = self.confinement.mem_bytes
        if self.version == 2:
            _write(self._cpu / "cpu.max", f"{quota} {period}")
            _write(self._cpu / "cpu.weight", _MAX_WEIGHT[2])
            if mem is not None:
                _write(self._memory / "memory.max", str(mem))
                if (self._memory / "memory.swap.max").exists():
                    _write(self._memory / "memory.swap.max", "0")
            return
        _write(self._cpu / "cpu.cfs_period_us", str(period))
        _write(self._cpu / "cpu.cfs_quota_us", str(quota))
        _write(self._cpu / "cpu.shares", _MAX_WEIGHT[1])
        if mem is not None:
            _write(self._memory / "memory.limit_in_bytes", str(mem))
            if (self._memory / "memory.memsw.limit_in_bytes").exists():
                _write(self._memory / "memory.memsw.limit_in_bytes", str(mem))
        _write(self._memory / "memory.swappiness", "0")

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group. Memory it already
        holds stays charged where it was: add a process before it allocates."""
        for d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        """The processes in the group now (none once it is removed)."""
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(FileNotFoundError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return sorted(found)

    def peak_memory_bytes(self) -> int:
        """The most memory the group has been charged since it was created (v2
        ``memory.peak``, v1 ``memory.max_usage_in_bytes``); read it before :meth:`remove`."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int((self._memory / name).read_text().split()[0])

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of the group (v2
        ``memory.events``, v1 ``memory.oom_control``: ``oom_kill`` above 0)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self._memory / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value) > 0
        raise LabError(f"{self._memory / name} has no oom_kill count (kernel before 4.13)")

    def remove(self, wait_s: float = 5.0) -> None:
        """Delete the group. The caller reaps its processes first; any still inside (a
        grandchild) is killed (SIGKILL by pid) and waited for up to ``wait_s``. A group
        already gone is no error; one that cannot be removed is a :class:`LabError`."""
        deadline = time.monotonic() + wait_s
        for d in reversed(self.dirs):
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise LabError(f"removing cgroup {d} failed: {exc.strerror}") from exc
                    _kill(self.pids())
                    time.sleep(0.02)

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _enable_v2_controllers(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    enabled = set(control.read_text().split())
    wanted = [c for c in ("cpu", "memory") if c not in enabled]
    if wanted:
        _write(control, " ".join(f"+{c}" for c in wanted))


def remove_stale(prefix: str = PREFIX, root: Path = CGROUP_ROOT) -> list[str]:
    """Remove the groups ``<prefix>-<pid>-...`` whose creating process ``pid`` has
    ended (left by a lab killed with SIGKILL); returns their names. Groups of live
    creators are left alone. O(groups)."""
    version = _version(root)
    if version is None:
        return []
    pattern = re.compile(rf"{re.escape(prefix)}-(\d+)-")
    removed: list[str] = []
    for parent in _parents(root, version):
        for d in sorted(parent.iterdir()):
            m = pattern.match(d.name)
            if not d.is_dir() or m is None or pid_alive(int(m.group(1))):
                continue
            stale = Cgroup(d.name, version, (d,), Confinement(1.0, None))
            stale.remove()
            if d.name not in removed:
                removed.append(d.name)
    return removed


def _scale(cluster: Cluster, share: float, cores: int | None) -> float:
    """``k`` of :func:`confinements`: cores per GFLOP/s, from every device of ``cluster``."""
    if not 0 < share <= 1:
        raise ValueError(f"share {share} must be in (0, 1]")
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    speeds = [
        cluster.type_of(i).effective_gflops / d.slowdown for i, d in enumerate(cluster.devices)
    ]
    return min(share * cores / sum(speeds), 1 / max(speeds))


def _at_least_the_smallest(cpu: float, what: str, slower: float) -> float:
    if cpu < MIN_CPU_CORES:
        raise LabError(
            f"{what} would get {cpu:.2%} of a core, below the kernel's smallest quota "
            f"({MIN_CPU_CORES:.0%}): its speed is {slower:.0f}x slower than the fastest "
            "device's; leave it out of the lab's cluster or run --emulate"
        )
    return math.floor(cpu * 1e4 + 1e-9) / 1e4


def confinements(
    cluster: Cluster, device_ids: Sequence[str], share: float, cores: int | None = None
) -> dict[str, Confinement]:
    """Each device's confinement for a lab run of ``device_ids`` of ``cluster``.

    Speed of device d: ``s_d = effective_gflops / slowdown`` (catalog figures and the
    cluster's override). Quota ``q_d = k s_d`` with ``k = min(share C / sum s, 1 / max
    s)`` over *every* device of the cluster: together they use at most ``share`` of the
    ``C`` cores this process may run on (``os.sched_getaffinity``; ``cores`` overrides),
    and none more than one core (one torch thread per device). ``k`` is the cluster's,
    not the run's, so a device type's quota is the same in every plan's run and in
    :func:`type_quotas`, which lab profiles are measured at; a run of fewer devices
    uses less of the machine. Memory: the device's budget (total x usable fraction: what
    plans are made to fit) + :data:`PROCESS_BASELINE_BYTES`. A quota below
    :data:`MIN_CPU_CORES` is a :class:`LabError` naming the device. O(devices).
    """
    k = _scale(cluster, share, cores)
    fastest = max(cluster.type_of(i).effective_gflops / d.slowdown
                  for i, d in enumerate(cluster.devices))
    out = {}
    for dev in device_ids:
        i = cluster.index(dev)
        speed = cluster.type_of(i).effective_gflops / cluster.devices[i].slowdown
        cpu = _at_least_the_smallest(k * speed, f"device {dev}", fastest / speed)
        budget = int(cluster.budget_bytes(i))
        out[dev] = Confinement(cpu_cores=cpu, mem_bytes=budget + PROCESS_BASELINE_BYTES)
    return out


def type_quotas(cluster: Cluster, share: float, cores: int | None = None) -> dict[str, float]:
    """The CPU quota of each device type of ``cluster`` in its lab: ``k`` x its
    effective speed (:func:`confinements`), what a device of the type at slowdown 1
    gets; its lab timings are measured at this quota, and the cost model multiplies
    them by a device's slowdown as the lab divides its quota. O(devices)."""
    k = _scale(cluster, share, cores)
    fastest = max(t.effective_gflops for t in cluster.device_types.values())
    out = {}
    for name, t in sorted(cluster.device_types.items()):
        cpu = k * t.effective_gflops
        if cpu > 1:
            raise LabError(
                f"device type {name} would need {cpu:.2f} cores at slowdown 1 (every device "
                "of it is slowed down): the lab gives a device at most one core; profile "
                "a cluster with one of its devices at slowdown 1"
            )
        out[name] = _at_least_the_smallest(
            cpu, f"device type {name}", fastest / t.effective_gflops
        )
    return out
