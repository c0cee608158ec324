"""Lab profiles: a model profiled inside each device type's lab confinement.

For every device type of a cluster, one child process runs in a cgroup with the type's
CPU quota (:func:`executor.lab.cgroups.type_quotas`: what a device of the type at
slowdown 1 gets in every lab run of the cluster) and the memory limit a device of it
runs under (the smallest budget among the cluster's devices of the type, plus the
process baseline), on one torch thread. It builds the model itself (so its memory is
charged to its group) and profiles it in rounds until they agree
(:func:`executor.profiling.noise.measure_until_stable`).

At the same time (:func:`profile_children`): a lab run of the cluster has one confined
process per device computing at once on this machine's cores, so the profile does too,
one child per device: the first of each type measures the type, every other device
computes beside it under its own run confinement (:func:`keep_busy`, paced like the
rest), and every measuring child, once done, keeps computing until the last type is
done, so that each type is measured beside as many busy processes as a run has (they
share the cores' caches, and a process's work after its pacing sleep finds them cold
by what the others ran meanwhile). The children build their models first and start
together. docs/lab.md, "Lab profiles", "At the same time".

What is measured, and why: each block's forward and backward as the CPU time of the
process's one thread (``clock="thread"``), divided by the quota, with the child paced as
a lab run's devices are (:mod:`executor.lab.pacing`), at the granularity of a run's
action: a pace point at the start of every round of the profiler's loop over a block's
batch sizes, then an untimed forward that takes the round's cold start
(:func:`executor.profiling.profiler.time_block`'s ``pace``). Work that follows a pacing
sleep takes more CPU time than the same work right after other work (measured +45% for
a 0.9 ms convolution under load), and a run pays that once per action, not per block: a
stage's forward runs its blocks one after another between two pace points. So a block
is timed warm, as every block of an action after its first runs. The action's one cold
start is not added: the runtime's work per micro-batch, measured paced (below), holds
the runtime's own part of it, and its blocks' part (0.3-1.1 ms of CPU per forward on a
TX2) was offset by a stage's one backward call against a block's own (docs/lab.md,
"Lab profiles").
A round of one block is at most tens of milliseconds of CPU (64 ms for VGG-16's largest
on a TX2 at 0.184 core), about what the ceiling lets one stretch take (docs/lab.md, "Lab
profiles"). Under a CFS quota of
``q`` of a core a process runs at most ``q x 100 ms`` of every 100 ms period, then waits
for the next one; a block of a few milliseconds therefore either runs unthrottled or
waits up to ``(1 - q) x 100 ms``, so its wall times are two-valued, their median says
nothing of the quota, and their mean needs thousands of samples (a 1 ms block at
``q = 0.25``: about 5,400 for a 5% error). Over whole periods the process gets ``q``
CPU-seconds per second, so CPU time / ``q`` is the block's time on the device as the
lab's runs see it, step after step. That the process did get its quota is measured too:
its CPU time over its wall time while profiling (``measured_cores``, recorded), with a
warning where it falls short by more than 10%. docs/lab.md, "Lab profiles".

The runtime's own work per micro-batch (:mod:`executor.lab.runtime_work`: a real
three-stage pipeline of empty stages, the process's CPU time per stage and micro-batch)
is measured in the same child after the blocks, in rounds until stable under the same
policy, divided by the quota like the block times, and recorded as the timing's
``runtime_work`` (docs/lab.md, "Runtime work per action").
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgepipe.executor.lab.cgroups import (
    CGROUP_ROOT,
    PROCESS_BASELINE_BYTES,
    Cgroup,
    Confinement,
    check_available,
    confinements,
    type_quotas,
)
from edgepipe.executor.lab.errors import LabError
from edgepipe.executor.lab.pacing import Pacer, fine_timer_slack
from edgepipe.executor.profiling.noise import NoisePolicy, measure_until_stable, warnings
from edgepipe.executor.profiling.sources import ModelSource
from edgepipe.planner.errors import EdgepipeError
from edgepipe.planner.inputs.cluster import Cluster
from edgepipe.planner.inputs.profile import LabQuota, ModelProfile, RuntimeWork, Timing
from edgepipe.planner.units import human_bytes

if TYPE_CHECKING:
    import torch
    from torch import nn

#: a device type that reached less than this share of its quota while profiling warns
QUOTA_REACHED = 0.9
#: seconds a device type's child may take before it is killed (a hung build)
CHILD_TIMEOUT_S = 3600.0
#: seconds the children together may take to stop once told to, before they are killed
STOP_S = 10.0


@dataclass(frozen=True)
class Job:
    """What one device type's child measures: ``repeats`` timed runs per round, rounds
    until ``policy`` settles; ``pace``: the rate the child paces its profile to, once per
    round of a block (None: not paced; :func:`lab_profile` sets it from the type's
    confinement)."""

    source: ModelSource
    device_type: str
    batch_sizes: tuple[int, ...]
    warmup: int
    repeats: int
    policy: NoisePolicy
    pace: float | None = None


@dataclass(frozen=True)
class LabProfile:
    """The profile (one ``lab`` timing per device type), one line per reason to doubt it,
    and each type's peak memory while profiling."""

    profile: ModelProfile
    warnings: list[str]
    peak_memory_bytes: dict[str, int]


def type_confinements(
    cluster: Cluster, share: float, cores: int | None = None, pace: bool = True
) -> dict[str, Confinement]:
    """Each device type's confinement: its quota (:func:`type_quotas`), paced under a
    ceiling unless ``pace`` is off (as a lab run's devices, ``LabOptions.pace``), and the
    smallest memory limit among its devices (budget + :data:`PROCESS_BASELINE_BYTES`)."""
    budgets: dict[str, int] = {}
    for i, d in enumerate(cluster.devices):
        budget = int(cluster.budget_bytes(i))
        budgets[d.type] = min(budgets.get(d.type, budget), budget)
    return {
        name: Confinement(q, budgets[name] + PROCESS_BASELINE_BYTES, pace)
        for name, q in type_quotas(cluster, share, cores).items()
    }


def lab_profile(
    source: ModelSource,
    cluster: Cluster,
    share: float,
    job: Callable[[str], Job],
    on_round: Callable[[str, int, float | None], None] | None = None,
    root: Path = CGROUP_ROOT,
    pace: bool = True,
) -> LabProfile:
    """Profile ``source`` in the lab of ``cluster`` (module docstring): one confined
    child per device of the cluster (:func:`profile_children`), all computing at once
    (paced unless ``pace`` is off); ``job(type)`` says what each type's measuring child
    measures and ``on_round(type, rounds, spread so far)`` hears each round. A machine
    that cannot host the lab raises :class:`LabUnavailable`; a child killed for memory,
    or failing, raises :class:`LabError` naming its type; every group is removed and
    every child reaped on the way out (also on Ctrl-C). O(the slowest type's rounds'
    profiles / its quota).
    """
    check_available(root)
    children = profile_children(cluster, share, pace)
    tasks = [replace(job(c.device_type),
                     pace=c.confinement.cpu_cores if c.confinement.paced else None)
             for c in children]
    with contextlib.ExitStack() as stack:
        groups = [stack.enter_context(Cgroup.create(f"profile-{c.device}", c.confinement, root))
                  for c in children]
        results = _run_children(children, groups, tasks, on_round)
        peaks = {c.device_type: g.peak_memory_bytes()
                 for c, g in zip(children, groups, strict=True) if c.measures}
    measured: dict[str, tuple[ModelProfile, LabQuota, int]] = {}
    work: dict[str, RuntimeWork] = {}
    lines: list[str] = []
    for child, task in zip(children, tasks, strict=True):
        if not child.measures:
            continue
        name, conf = child.device_type, child.confinement
        doc, cores, work[name] = results[name]
        profile = ModelProfile.from_dict(doc, f"lab profile of {name}")
        quota = LabQuota(conf.cpu_cores, conf.mem_bytes, 1, round(cores, 4))
        measured[name] = (profile, quota, peaks[name])
        lines += warnings(profile, name, task.policy, wall_clock=False)
        if work[name].spread > task.policy.max_spread:
            lines.append(
                f"device type {name}: the runtime's work per micro-batch did not settle "
                f"(spread {work[name].spread:.1%} over the last rounds, {work[name].rounds} "
                "rounds): the machine is too noisy to measure it")
        if cores < QUOTA_REACHED * conf.cpu_cores:
            lines.append(
                f"device type {name} got {cores:.3g} of its {conf.cpu_cores:.3g}-core quota "
                "while profiling: the machine is too busy to give the lab its quotas, "
                "and the times are too short for a quieter lab run"
            )
    return LabProfile(_combine(measured, work, cluster, share), lines, peaks)


@dataclass(frozen=True)
class Child:
    """One process of a lab profile: ``device`` of the cluster, of ``device_type``,
    under ``confinement``; ``measures``: it profiles its type (the first device of each
    type), else it only computes beside the others (:func:`keep_busy`)."""

    device: str
    device_type: str
    confinement: Confinement
    measures: bool


def profile_children(
    cluster: Cluster, share: float, pace: bool = True, cores: int | None = None
) -> list[Child]:
    """One child per device of ``cluster``, in its order, so that a profile computes
    on as many processes at once as a lab run of every device does (module docstring,
    "At the same time"): the first device of each type measures the type under
    :func:`type_confinements` (slowdown 1, the type's smallest memory limit); every
    other device computes under its own run confinement
    (:func:`executor.lab.cgroups.confinements`), each paced unless ``pace`` is off;
    ``cores`` as :func:`type_confinements` takes it. O(devices)."""
    types = type_confinements(cluster, share, cores, pace)
    ids = [d.id for d in cluster.devices]
    runs = confinements(cluster, ids, share, cores)
    out: list[Child] = []
    seen: set[str] = set()
    for d in cluster.devices:
        first = d.type not in seen
        seen.add(d.type)
        conf = types[d.type] if first else replace(runs[d.id], paced=pace)
        out.append(Child(d.id, d.type, conf, first))
    return out


def _combine(
    measured: dict[str, tuple[ModelProfile, LabQuota, int]], work: dict[str, RuntimeWork],
    cluster: Cluster, share: float,
) -> ModelProfile:
    """One profile with each type's timing, its CPU times (blocks', the runtime's work
    per micro-batch and its optimizer steps per MiB) divided by its quota."""
    first = next(iter(measured.values()))[0]
    timings = {}
    for name, (profile, quota, _) in measured.items():
        timing = _per_quota(profile.timings[name], quota)
        w = work[name].scaled(1 / quota.cpu_cores)
        timings[name] = replace(timing, runtime_work=replace(
            w, forward_ms=round(w.forward_ms, 4), backward_ms=round(w.backward_ms, 4),
            step_ms_per_mib=tuple((k, round(v, 4)) for k, v in w.step_ms_per_mib)))
    quotas = ", ".join(f"{n} {q.cpu_cores:.4g}" for n, (_, q, _) in measured.items())
    return replace(
        first,
        source={
            "kind": "lab",
            "detail": f"lab of cluster {cluster.name} (share {share:g} of the cores) on "
            f"{first.source.get('detail', '')}; per device type a process under its CPU "
            f"quota (cores: {quotas}) and memory limit; times = the thread's CPU time / "
            "quota; runtime_work = the process's CPU time per micro-batch of a stage "
            "beyond its blocks / quota",
            "date": first.source.get("date", ""),
            "tool": "edgepipe lab profile",
        },
        timings=timings,
    )


def _per_quota(t: Timing, quota: LabQuota) -> Timing:
    def scale(m: tuple[tuple[float, ...], ...] | None) -> tuple[tuple[float, ...], ...] | None:
        if m is None:
            return None
        return tuple(tuple(round(x / quota.cpu_cores, 4) for x in row) for row in m)

    forward, backward = scale(t.forward_ms), scale(t.backward_ms)
    assert forward is not None and backward is not None
    return replace(
        t, forward_ms=forward, backward_ms=backward, source="lab",
        forward_spread_ms=scale(t.forward_spread_ms),
        backward_spread_ms=scale(t.backward_spread_ms), lab=quota,
    )


def _run_children(
    children: list[Child], groups: list[Cgroup], tasks: list[Job],
    on_round: Callable[[str, int, float | None], None] | None,
) -> dict[str, tuple[dict[str, Any], float, RuntimeWork]]:
    """Start one process per child, each put in its group before it does anything; once
    every one has built its model, start them together; return each measuring child's
    profile document, the cores it got and the runtime's CPU work per micro-batch, by
    type, once the last of them is done, then stop them all. Every child is killed
    and reaped on the way out, whatever happens; a failure raises :class:`LabError`
    naming the type."""
    ctx = mp.get_context("spawn")
    procs: list[BaseProcess] = []
    conns: list[Connection] = []
    results: dict[str, tuple[dict[str, Any], float, RuntimeWork]] = {}
    failure: tuple[int, str | None] | None = None
    try:
        for child, group, task in zip(children, groups, tasks, strict=True):
            ours, theirs = ctx.Pipe()
            conns.append(ours)  # closed below whatever happens
            try:
                proc = ctx.Process(target=child_main, args=(theirs, task, child.measures),
                                   daemon=True)
                proc.start()
            finally:
                theirs.close()
            procs.append(proc)
            assert proc.pid is not None  # started
            group.add(proc.pid)
            ours.send("go")
        failure = _converse(children, conns, on_round, results)
        if failure is None:
            for conn in conns:
                with contextlib.suppress(OSError):  # a child that has already ended
                    conn.send("stop")
            stop_by = time.monotonic() + STOP_S  # one wait for them all
            for each in procs:
                each.join(max(0.0, stop_by - time.monotonic()))
    finally:
        for each in procs:
            if each.is_alive():
                each.kill()
            each.join()
        for conn in conns:
            conn.close()
    if failure is None:
        return results
    i, message = failure
    group, task = groups[i], tasks[i]
    if group.oom_killed():
        limit = group.confinement.mem_bytes or 0
        raise LabError(
            f"profiling on device type {task.device_type} ran out of its lab memory limit "
            f"{human_bytes(limit)} (its budget {human_bytes(limit - PROCESS_BASELINE_BYTES)} "
            f"plus {human_bytes(PROCESS_BASELINE_BYTES)} for the process) at batch sizes up "
            f"to {task.batch_sizes[-1]}: profile smaller batch sizes"
        )
    who = "" if children[i].measures else f" (device {children[i].device}, computing beside it)"
    raise LabError(
        f"profiling on device type {task.device_type} failed{who}: "
        f"{message or f'its process exited with status {procs[i].exitcode}'}"
    )


def _converse(
    children: list[Child], conns: list[Connection],
    on_round: Callable[[str, int, float | None], None] | None,
    results: dict[str, tuple[dict[str, Any], float, RuntimeWork]],
) -> tuple[int, str | None] | None:
    """The parent's side of the children's messages until every measuring child is
    done (its result in ``results``): ``("ready",)`` from each, then ``"start"`` to
    all; rounds to ``on_round``. Returns None, or the first failing child's index and
    its line (None: it died without one). Past :data:`CHILD_TIMEOUT_S` the child to
    blame is the first that never said ready (the others wait for it), else the first
    measuring child not done."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    waiting = {i for i, c in enumerate(children) if c.measures}
    ready: set[int] = set()
    while waiting:
        got = wait(conns, max(0.0, deadline - time.monotonic()))
        if not got:
            late = [i for i in range(len(conns)) if i not in ready]
            if late:
                return late[0], f"did not build its model within {CHILD_TIMEOUT_S:.0f} s"
            return min(waiting), f"took more than {CHILD_TIMEOUT_S:.0f} s"
        for conn in got:
            assert isinstance(conn, Connection)
            i = conns.index(conn)
            try:
                kind, *rest = conn.recv()
            except EOFError:
                return i, None
            if kind == "ready":
                ready.add(i)
                if len(ready) == len(conns):
                    for each in conns:  # one that died since is seen by wait() as EOF
                        with contextlib.suppress(OSError):
                            each.send("start")
            elif kind == "round" and on_round is not None:
                on_round(children[i].device_type, rest[0], rest[1])
            elif kind == "done":
                results[children[i].device_type] = (rest[0], rest[1], rest[2])
                waiting.discard(i)
            elif kind == "error":
                return i, rest[0]
    return None


def child_main(conn: Connection, job: Job, measures: bool = True) -> None:
    """A device's child: wait until the parent has put it in its group, build the model
    on one thread, say ``("ready",)`` and wait for ``"start"``; a measuring child then
    profiles it (thread CPU time) until stable, then the runtime's work per micro-batch
    (:mod:`executor.lab.runtime_work`), sending ``("round", n, spread)`` per round and
    ``("done", profile document, cores, (forward ms, backward ms, spread, rounds) of
    CPU)``; every child then computes (:func:`keep_busy`) until ``"stop"``. A failure
    sends ``("error", one line)``. Deaf to Ctrl-C: the parent ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn.recv()
    try:
        import torch
        from edgepipe.executor.lab.runtime_work import measure_until_stable as runtime_work
        from edgepipe.executor.profiling.profiler import profile_model
        from edgepipe.executor.profiling.sources import build_source

        torch.set_num_threads(1)
        built = build_source(job.source)
        conn.send(("ready",))
        conn.recv()
        if measures:
            pace = None if job.pace is None else _pacer(job.pace)
            wall, cpu = time.perf_counter(), time.process_time()
            profile = measure_until_stable(
                lambda: profile_model(
                    built.model, built.example, list(job.batch_sizes), job.device_type,
                    name=built.name, warmup=job.warmup, repeats=job.repeats, num_threads=1,
                    build=built.build, clock="thread", pace=pace,
                ),
                job.device_type,
                job.policy,
                on_round=lambda n, s: conn.send(("round", n, s)),
            )
            cores = (time.process_time() - cpu) / (time.perf_counter() - wall)
            work = runtime_work(job.policy, job.pace)
            conn.send(("done", profile.to_dict(), cores, work))
        keep_busy(built.model, built.example, job.batch_sizes,
                  None if job.pace is None else _pacer(job.pace), conn.poll)
    except EdgepipeError as exc:
        conn.send(("error", str(exc)))
    except (RuntimeError, ValueError) as exc:  # torch's, from a busy child's blocks
        conn.send(("error", f"the model failed on this device: {str(exc).splitlines()[0]}"))
    finally:
        conn.close()


def keep_busy(
    model: nn.Sequential, example: Callable[[int], torch.Tensor],
    batch_sizes: Sequence[int], pace: Callable[[], None] | None, stop: Callable[[], bool],
) -> None:
    """Compute as a device of a run does until ``stop()``: forward and backward (from
    the output's sum) of ``model``'s blocks one at a time, each after a pace point
    (``pace``, if any), at each of ``batch_sizes`` in turn. The load a child puts on
    the machine while others measure (module docstring, "At the same time"); its
    gradients accumulate. O(one block's forward and backward) between two checks."""
    from edgepipe.executor.profiling.profiler import block_inputs, leaf_input

    inputs = [block_inputs(model, example(b)) for b in batch_sizes]
    model.train()
    while True:
        for xs in inputs:
            for i, (block, x) in enumerate(zip(model, xs, strict=True)):
                if stop():
                    return
                if pace is not None:
                    pace()
                out = block(leaf_input(x, i == 0))
                if out.requires_grad:
                    out.sum().backward()


def _pacer(rate: float) -> Callable[[], None]:
    """The pace point of this process at ``rate`` (:class:`executor.lab.pacing.Pacer`,
    on this thread, with its fine timer slack), which the profiler calls at the start of
    every round of a block (module docstring), never inside a timed interval."""
    fine_timer_slack()
    return Pacer(rate).pace
