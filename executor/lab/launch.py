"""``edgepipe run PLAN --lab``: every planned device a real process doing real compute,
confined like the device it stands for (docs/lab.md, "Running").

:func:`run_lab` checks the machine (:func:`executor.lab.network.check_available`,
:func:`executor.lab.cgroups.check_available`), removes what labs killed by SIGKILL left
(``remove_stale`` of both), works out each device's confinement
(:func:`executor.lab.cgroups.confinements`: CPU quota, which each device's process paces
itself to under a ceiling unless :attr:`LabOptions.pace` is off, memory limit = budget + the
process baseline, or :attr:`LabOptions.memory_limits`), checks that each device's
memory under the plan fits its limit (:func:`check_memory`), then builds the lab's network
(:class:`executor.lab.network.LabNetwork`) and one cgroup per device, and runs the
ordinary launcher (:func:`executor.launch.launch`) with a :class:`LabPlacement`:

- the launcher's thread enters the control namespace for the run, so the store it
  hosts (and every connection it opens) lives there, reachable from every device's
  namespace over the unshaped control network at
  :data:`executor.lab.network.STORE_ADDRESS`;
- each worker starts in :func:`executor.lab.entry.start`, which joins its cgroup and
  its device's namespace before torch loads, and binds gloo to its shaped interface.

A device the kernel's OOM killer killed makes the run fail with one line naming it
(:class:`~executor.lab.errors.LabError`). The lab runs without in-process recovery (a
lost device ends the run). Everything the lab made (processes, cgroups, namespaces) is
removed on return, on an error, on Ctrl-C and on SIGTERM; with ``out``, ``lab.json``
records each device's confinement, namespace and peak memory, the shaped links and the
notes.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, ClassVar

from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.lab import cgroups, network
from edgepipe.executor.lab.cgroups import Cgroup, Confinement
from edgepipe.executor.lab.entry import Place, start
from edgepipe.executor.lab.errors import LabError
from edgepipe.executor.launch import Placement, RunFailed, RunResult, launch
from edgepipe.planner.plan import Plan, load_plan
from edgepipe.planner.units import human_bytes

#: share of this machine's cores the lab's devices use together by default
DEFAULT_SHARE = 0.5


@dataclass(frozen=True)
class LabOptions:
    """How the lab confines the devices: ``share`` of this machine's cores for all of
    them together; ``memory_limits`` (device -> bytes) replaces a device's limit;
    ``skip_memory_check`` launches a plan that does not fit (the kernel then kills
    the device that overflows); ``pace``: each device's process paces its work to its
    quota, under a ceiling (:mod:`executor.lab.pacing`), instead of running under the
    bare CFS quota."""

    share: float = DEFAULT_SHARE
    memory_limits: Mapping[str, int] = field(default_factory=dict)
    skip_memory_check: bool = False
    pace: bool = True


@dataclass(frozen=True)
class LabPlacement(Placement):
    """The lab's :class:`~executor.launch.Placement`: the store on the control network,
    each rank's worker started confined (:func:`executor.lab.entry.start`)."""

    mode: ClassVar[str] = "lab"
    preloaded: ClassVar[bool] = False  # confined before torch loads (Placement.preloaded)
    places: tuple[Place, ...] = ()

    def entry(self, opts: WorkerOptions, endpoint: Endpoint) -> tuple[Any, tuple[Any, ...]]:
        return start, (self.places[endpoint.rank], pickle.dumps((opts, endpoint)))


@dataclass
class LabRun:
    """A finished lab run: the launcher's result, each device's confinement and peak
    memory (bytes, its cgroup's), the shaped links and what each sent, and what the lab
    did not reproduce."""

    result: RunResult
    confinements: dict[str, Confinement]
    peak_memory_bytes: dict[str, int]
    shaped: list[network.ShapedLink]
    #: bytes each shaped link sent (by channel): the run's data traffic
    sent_bytes: dict[str, int]
    notes: list[str]


def plan_memory(plan: Plan) -> dict[str, float]:
    """Each device's memory under the plan (the cost model's, replicas included)."""
    return {dev: mem
            for stage, cost in zip(plan.partition.stages, plan.cost.stages, strict=True)
            for dev, mem in zip(stage.devices, cost.memory_bytes, strict=True)}


def check_memory(plan: Plan, limits: Mapping[str, Confinement]) -> None:
    """Refuse (:class:`LabError`, one line naming the device) a plan under which a device
    needs more than its lab memory limit: the plan's memory plus the measured process
    baseline (:data:`executor.lab.cgroups.PROCESS_BASELINE_BYTES`). O(devices)."""
    base = cgroups.PROCESS_BASELINE_BYTES
    for dev, need in plan_memory(plan).items():
        limit = limits[dev].mem_bytes
        if limit is not None and need + base > limit:
            raise LabError(
                f"device {dev} needs {human_bytes(need)} under the plan plus "
                f"{human_bytes(base)} for its process, above its lab memory limit "
                f"{human_bytes(limit)}; re-plan for less memory, or force the run with "
                "--lab-skip-memory-check (the kernel then kills the device)")


def confine(plan: Plan, devices: list[str], lab: LabOptions) -> dict[str, Confinement]:
    """Each device's confinement (module docstring), the memory checked."""
    conf = cgroups.confinements(plan.problem.cluster, devices, lab.share)
    unknown = sorted(set(lab.memory_limits) - set(devices))
    if unknown:
        raise LabError(f"--lab-memory names {', '.join(unknown)}, which run(s) no process "
                       f"of this plan (its devices: {', '.join(devices)})")
    conf = {d: Confinement(c.cpu_cores, lab.memory_limits.get(d, c.mem_bytes), lab.pace)
            for d, c in conf.items()}
    if not lab.skip_memory_check:
        check_memory(plan, conf)
    return conf


def run_lab(opts: WorkerOptions, lab: LabOptions = LabOptions(), **kwargs: Any) -> LabRun:
    """Run ``opts``'s plan in the lab (module docstring); ``kwargs`` go to
    :func:`executor.launch.launch` (no ``recover``, ``joins``, ``standbys``: the lab
    does not recover). Raises :class:`~executor.lab.errors.LabUnavailable` on a
    machine that cannot host it, :class:`LabError` for a plan that does not fit or a
    device killed for memory, and what :func:`executor.launch.launch` raises."""
    network.check_available()
    cgroups.check_available()
    network.remove_stale()  # what labs killed by SIGKILL left
    cgroups.remove_stale()
    plan = load_plan(opts.plan)
    devices = [r.device for r in RankLayout.from_plan(plan).ranks]
    conf = confine(plan, devices, lab)
    with ExitStack() as stack:
        net = stack.enter_context(network.LabNetwork(plan.problem.cluster, devices))
        groups: dict[str, Cgroup] = {}
        for dev in devices:
            groups[dev] = stack.enter_context(Cgroup.create(dev, conf[dev]))
        placement = LabPlacement(network.STORE_ADDRESS, tuple(
            Place(d, net.devices[d].namespace, net.devices[d].interface, groups[d])
            for d in devices))
        # multiprocessing's resource tracker, a process started with the first child,
        # must live here, not in the control namespace, whose processes die with it
        resource_tracker.ensure_running()
        try:
            with network.entered(net.control_namespace):
                result = launch(opts, placement=placement, recover=False, **kwargs)
        except RunFailed as exc:
            oom = [d for d in devices if groups[d].oom_killed()]
            if oom:
                raise LabError(
                    f"device {oom[0]} ran out of memory: the kernel killed it at its lab "
                    f"limit {human_bytes(conf[oom[0]].mem_bytes or 0)} (peak "
                    f"{human_bytes(groups[oom[0]].peak_memory_bytes())}); re-plan for "
                    "less memory") from exc
            raise
        run = LabRun(result, conf, {d: g.peak_memory_bytes() for d, g in groups.items()},
                     list(net.shaped), net.sent_bytes(), list(net.notes))
    if opts.out:
        _write_record(Path(opts.out), run, net)
    return run


def _write_record(out: Path, run: LabRun, net: network.LabNetwork) -> None:
    """``lab.json``: what each device ran under, the links, the notes."""
    doc = {
        "topology": net.topology,
        "devices": {
            d: {"cpu_cores": c.cpu_cores, "paced": c.paced,
                "cpu_quota_us": list(c.quota_us()), "memory_limit_bytes": c.mem_bytes,
                "peak_memory_bytes": run.peak_memory_bytes[d],
                "address": net.devices[d].address}
            for d, c in run.confinements.items()
        },
        "links": [{**asdict(s), "sent_bytes": run.sent_bytes[s.channel]}
                  for s in run.shaped],
        "notes": run.notes,
        "load": os.getloadavg()[0],
    }
    (out / "lab.json").write_text(json.dumps(doc, indent=1) + "\n")
