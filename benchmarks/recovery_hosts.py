"""Recovery time across hosts: in-process recovery against a checkpoint restart, when a
whole host dies with a step in flight.

Hosts are Linux network namespaces on this machine (tests/helpers/netns.py), joined by
a bridge (unshaped veth links); each runs its processes as the README's multi-host
recipe does: one torchrun agent per host (``python -m edgepipe.executor.agent``, c10d
rendezvous at host 0), each starting one edgepipe worker that uses the cross-host
coordinator (``edgepipe coordinate``'s ``python -m edgepipe.executor.ft.coordinator``,
on host 0) as its store and control plane. The hosts share this machine's two cores and
its file system (used only to read the plan and write logs; the checkpoints and metrics
are the coordinator's, on host 0).

Model: gpt2-small at 12.6 M parameters (6 layers, hidden 320, vocabulary 8192; 8
blocks), a 3-stage pipeline, one device per host (d0, d1, d2: blocks [0,3), [3,6),
[6,8)), momentum SGD, 2 micro-batches of 2 samples. The fault: once ``--kill-after``
steps are committed, every process of host 1 (its agent and its worker, d1) is
SIGKILLed; the next step is in flight then, so both arms must train it again.
Detection is the same in both arms: nothing on another host sees an exit status, so the
coordinator declares the host dead after ``--hang-timeout`` s without a heartbeat.

**Recovery** (``coordinate --recover``, the plan replicated every step; the replicas of
d1's blocks are on d2): detect (kill to the coordinator's declaration, the event's
``detected_at`` against the kill's wall clock), abort acknowledged, re-plan (the
pre-computed lookup), rebuild (every survivor's process groups), restore (d1's blocks
migrated from d2's replica, every member's state of the last durable step restored from
memory), then the first step of the new generation (its start state replicated, the
replayed step computed, the commit vote). The figures come from the recovery event of
the coordinator's ``metrics.jsonl``; the totals are this script's clock from the kill:
to the new generation's first commit, and to the commit of the step that was in flight
(back where the run was).

**Restart** (what a job without in-process recovery does: torchelastic's stop-all and
restart, reference/fault-tolerance.md §1): the same job with an unreplicated plan and a
checkpoint every ``--checkpoint-every`` steps, committed on the coordinator's host.
The loss stops it: detect + abort (kill to the coordinator's exit; it declares the host
dead, aborts, finds no copy of d1's blocks and exits 2), stop (every process left on
hosts 0 and 2 SIGKILLed, at once: a torchelastic agent would SIGTERM its workers and wait
a grace period first), re-plan (the DP for d0 and d2, ``planner.api.solve``), restart to
first commit (a new coordinator with ``--resume`` of the newest checkpoint and a new
torchrun job on hosts 0 and 2: interpreter start-up and torch import of the agents and
the workers, the rendezvous, the checkpoint sent through the store and loaded, the
process groups, the first step), redo (until the step that was in flight is committed
again). For scale, each restart half also times, in host 0 after the run, a cold
``python -c "import torch, edgepipe.executor.worker"`` (start-up and imports alone).

    .venv/bin/python benchmarks/recovery_hosts.py [--pairs 3] [--kill-after 6]
        [--checkpoint-every 4] [--steps 9] [--hang-timeout 10]

Pairs are interleaved (a recovery run and a restart run back to back, the first
alternating) and each half records the 1-minute load average before and after it.
Every process is SIGKILLed and every namespace deleted at the end of each run, also
when it fails (netns.Hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgepipe.executor.profiling import zoo
from edgepipe.executor.profiling.profiler import profile_model
from edgepipe.planner import api
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.inputs.profile import BuildSpec, ModelProfile
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, load_plan, make_plan, save_plan
from edgepipe.planner.timeouts import HANG_TIMEOUT_S

from benchmarks.local_cluster import identical_cpus
from tests.helpers import netns
from tests.helpers.processes import PY, torchrun_argv

SIZES = {"layers": 6, "hidden": 320, "heads": 4, "vocab": 8192, "max_positions": 16,
         "seq_len": 8}
BUILD = BuildSpec(zoo="gpt2-small", sizes=SIZES, seed=3)
MICRO, M = 2, 2
CUTS = ((0, 3), (3, 6), (6, 8))
LOST = 1  # host 1 runs d1, the middle stage
#: the workers' gloo timeout: a survivor blocked in a transfer with the lost host leaves
#: that op at this timeout (its generation is abandoned at once, the op is not)
GLOO_S = 20.0
WAIT_S = 600.0  # any wait of a run longer than this is a failure
POLL_S = 0.01
COORD_PORT, RDZV_PORT = 29500, 29400
ENV = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
REPO = Path(__file__).resolve().parent.parent
FIRST = "total: kill to first commit"
BACK = "total: kill to the in-flight step committed"


def build_profile() -> ModelProfile:
    torch.set_num_threads(1)
    model = zoo.build_model(BUILD.zoo, seed=BUILD.seed, **BUILD.sizes)
    return profile_model(model, lambda b: zoo.example_input(BUILD.zoo, b, **BUILD.sizes),
                         [1, 2], "host-cpu", name="gpt2-12m", warmup=1, repeats=1,
                         build=BUILD)


def config(interval: int) -> TrainingConfig:
    return TrainingConfig(global_batch=MICRO * M, micro_batch_candidates=(MICRO,),
                          optimizer="momentum", learning_rate=0.01,
                          replication_interval=interval)


def three_stage_plan(profile: ModelProfile, interval: int) -> Plan:
    """The module docstring's 3-stage plan, replicated every ``interval`` steps (0: never)."""
    problem = make_problem(profile, identical_cpus(3), config(interval), catalog={})
    stages = tuple(StageAssignment(a, b, (f"d{i}",), (MICRO,)) for i, (a, b) in enumerate(CUTS))
    return make_plan(problem, Partition(MICRO, M, stages), SolverInfo("hand"))


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of ``path`` (none while it does not exist)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def steps_of(lines: list[dict[str, Any]]) -> list[int]:
    return [m["step"] for m in lines if "type" not in m]


@dataclass
class Job:
    """A coordinator on host 0 and one torchrun agent per host of ``members`` (host 0
    among them), every worker using the coordinator as its store; logs in ``folder``."""

    hosts: netns.Hosts
    members: list[int]
    plan: Path
    folder: Path
    steps: int
    coordinator_args: list[str]
    port: int = COORD_PORT
    rdzv_port: int = RDZV_PORT
    coordinator: subprocess.Popen[str] | None = None
    agents: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def metrics(self) -> Path:
        return self.folder / "coord" / "metrics.jsonl"

    def start(self, hang_s: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "coordinator.log").open("w") as log:  # the child keeps a copy
            self.coordinator = self.hosts.start(
                0, [PY, "-m", "edgepipe.executor.ft.coordinator", str(self.plan), "--port",
                    str(self.port), "--hang-timeout", str(hang_s), "--recover", "--steps",
                    str(self.steps), "--out", str(self.folder / "coord"),
                    "--no-watch-slowdown", *self.coordinator_args],
                env=ENV, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        job = [self.hosts[i] for i in self.members]
        for n, i in enumerate(self.members):
            worker = ["-m", "edgepipe.executor.worker", str(self.plan), "--steps",
                      str(self.steps), "--out", str(self.folder / f"host{i}"), "--timeout",
                      str(GLOO_S), "--coordinator", f"{self.hosts[0].address}:{self.port}"]
            with (self.folder / f"agent{i}.log").open("w") as log:
                self.agents.append(self.hosts.start(
                    i, torchrun_argv(job, n, worker, self.rdzv_port), env=ENV, cwd=REPO,
                    stdout=log, stderr=subprocess.STDOUT, text=True))

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-2000:]}"
                         for p in sorted(self.folder.glob("*.log")))

    def wait(self, what: str, done: Callable[[], bool], ended_ok: bool = False) -> float:
        """Poll ``done`` every POLL_S until true; its time.monotonic(). Fails (with the
        logs) after WAIT_S or, unless ``ended_ok``, when the coordinator ended first."""
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert self.coordinator is not None
            over = not ended_ok and self.coordinator.poll() is not None and not done()
            if over or time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {WAIT_S:g} s or the coordinator "
                                   f"ended (rc {self.coordinator.poll()})\n{self.logs()}")
            time.sleep(POLL_S)
        return time.monotonic()

    def committed(self, n: int) -> float:
        return self.wait(f"{n} committed steps", lambda: len(steps_of(read_lines(
            self.metrics))) >= n)

    def coordinator_end(self) -> tuple[float, int]:
        """When the coordinator exited (time.monotonic()) and its exit status."""
        assert self.coordinator is not None
        rc = self.coordinator.wait(timeout=WAIT_S)
        return time.monotonic(), rc

    def agents_end(self, survivors: list[int], within_s: float = 60.0) -> float | None:
        """When the agents of hosts ``survivors`` had all exited (time.monotonic()), or
        None when one still ran ``within_s`` s after this call (it is then killed with
        the hosts)."""
        deadline = time.monotonic() + within_s
        for i in survivors:
            agent = self.agents[self.members.index(i)]
            try:
                agent.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return None
        return time.monotonic()


def kill_host(hosts: netns.Hosts, index: int) -> None:
    """SIGKILL every process inside host ``index``'s namespace (as a power cut would)."""
    for pid in netns._pids_in(hosts[index].namespace):
        netns._kill(pid)


def kill_all_in(hosts: netns.Hosts, indices: list[int]) -> float:
    """SIGKILL every process in hosts ``indices`` until none is left; time.monotonic()."""
    while pids := [p for i in indices for p in netns._pids_in(hosts[i].namespace)]:
        for pid in pids:
            netns._kill(pid)
        time.sleep(POLL_S)
    return time.monotonic()


def kill_when_committed(hosts: netns.Hosts, job: Job, after: int) -> tuple[float, float, int]:
    """Wait for ``after`` committed steps, then kill host LOST at once; the kill's
    time.monotonic(), its time.time() and the steps committed just before it."""
    job.committed(after)
    reached = len(steps_of(read_lines(job.metrics)))
    killed, wall = time.monotonic(), time.time()
    kill_host(hosts, LOST)
    return killed, wall, reached


def recovery_run(plan: Path, folder: Path, args: argparse.Namespace) -> dict[str, float]:
    """One recovery half (module docstring); its figures, seconds."""
    with netns.Hosts(3) as hosts:
        job = Job(hosts, [0, 1, 2], plan, folder, args.steps, [])
        job.start(args.hang_timeout)
        killed, wall, reached = kill_when_committed(hosts, job, args.kill_after)

        def events() -> list[dict[str, Any]]:
            return [m for m in read_lines(job.metrics) if m.get("type") == "recovery"]

        first = job.wait("the recovery's first commit", lambda: bool(events()))
        back = job.committed(reached + 1)
        ended, rc = job.coordinator_end()
        assert rc == 0, job.logs()
        agents = job.agents_end([0, 2])
    (event,) = events()
    assert event["cause"] == "hang" and event["device"] == "d1", event
    new = load_plan(folder / "coord" / "plans" / f"{event['new_plan']}.json")
    phases = ("t_abort_s", "t_replan_s", "t_rebuild_s", "t_restore_s")
    detect = event["detected_at"] - wall
    return {
        "detect (kill to declared)": detect,
        "abort acknowledged": event["t_abort_s"],
        "re-plan": event["t_replan_s"],
        "rebuild": event["t_rebuild_s"],
        "restore (from replicas)": event["t_restore_s"],
        "first step (replicate, compute, commit)":
            event["t_first_commit_s"] - sum(event[k] for k in phases),
        "after detection: to first commit (event)": event["t_first_commit_s"],
        FIRST: first - killed,
        BACK: back - killed,
        "coordinator's end after the kill": ended - killed,
        "survivors' agents' end after the kill": (agents - killed) if agents else -1.0,
        "steps committed at the kill": float(reached),
        "replayed from step": float(event["replay_from_step"]),
        "MB moved": event["bytes_moved"] / 1e6,
        "stages after": float(new.partition.num_stages),
    }


def startup_seconds(hosts: netns.Hosts) -> float:
    """Wall seconds of a cold interpreter importing torch and the worker, in host 0."""
    start = time.monotonic()
    done = hosts.run(0, [PY, "-c", "import torch, edgepipe.executor.worker"], timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - start


def restart_run(plan: Path, profile: ModelProfile, folder: Path,
                args: argparse.Namespace) -> dict[str, float]:
    """One restart half (module docstring); its figures, seconds."""
    ckpt = folder / "coord" / "checkpoints"
    with netns.Hosts(3) as hosts:
        job = Job(hosts, [0, 1, 2], plan, folder, args.steps,
                  ["--checkpoint-every", str(args.checkpoint_every)])
        job.start(args.hang_timeout)
        killed, _, reached = kill_when_committed(hosts, job, args.kill_after)
        log = job.folder / "coordinator.log"
        declared = job.wait("the coordinator's verdict", lambda: "cannot recover" in
                            log.read_text(), ended_ok=True)
        stopped = kill_all_in(hosts, [0, 2])  # the coordinator (host 0) included
        cluster = identical_cpus(3)
        survivors = replace(cluster, devices=tuple(d for d in cluster.devices if d.id != "d1"))
        new = api.solve(make_problem(profile, survivors, config(0), catalog={}), "dp")
        new_path = folder / "replanned.json"
        save_plan(new, new_path)
        replanned, replanned_wall = time.monotonic(), time.time()
        resume_from = max(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))
        resumed = Job(hosts, [0, 2], new_path, folder / "resumed", args.steps,
                      ["--resume", str(ckpt)], port=COORD_PORT + 1, rdzv_port=RDZV_PORT + 1)
        # no fault in the resumed job, so its time-out enters no figure; at 3 s a worker
        # starved while it loaded the checkpoint (load 12) was declared hung there
        resumed.start(max(args.hang_timeout, HANG_TIMEOUT_S))
        first = resumed.committed(1)
        back = resumed.committed(reached + 1 - resume_from)
        ended, rc = resumed.coordinator_end()
        assert rc == 0, resumed.logs()
        agents = resumed.agents_end([0, 2])
        startup = startup_seconds(hosts)
    line = next(m for m in read_lines(resumed.metrics) if "type" not in m)
    began = min(d.get("started_at", replanned_wall) for d in line["devices"].values())
    size = sum(p.stat().st_size for p in (ckpt / f"step-{resume_from:08d}").rglob("*")
               if p.is_file())
    return {
        "detect + abort + failed re-plan (kill to 'cannot recover')": declared - killed,
        "stop (SIGKILL every process left)": stopped - declared,
        "after the verdict: to first commit": first - declared,
        "re-plan (DP)": replanned - stopped,
        "restart to first commit": first - replanned,
        "  of which to the first step's start": began - replanned_wall,
        "redo (to the in-flight step committed)": back - first,
        FIRST: first - killed,
        BACK: back - killed,
        "coordinator's end after the kill": ended - killed,
        "survivors' agents' end after the kill": (agents - killed) if agents else -1.0,
        "steps committed at the kill": float(reached),
        "resumed from step": float(resume_from),
        "stages after": float(new.partition.num_stages),
        "checkpoint MB": size / 1e6,
        "cold python + import torch, worker (after)": startup,
    }


def paired_runs(profile: ModelProfile, tmp: Path, args: argparse.Namespace,
                failed: list[str]) -> list[dict[str, Any]]:
    """``args.pairs`` pairs of a recovery half and a restart half, back to back, the
    first of each pair alternating; each half with its load before and after. A pair
    whose half failed is left out, its first line appended to ``failed``."""
    replicated, bare = tmp / "replicated.json", tmp / "unreplicated.json"
    save_plan(three_stage_plan(profile, 1), replicated)
    save_plan(three_stage_plan(profile, 0), bare)
    out = []
    for r in range(args.pairs):
        order = ("recovery", "restart") if r % 2 == 0 else ("restart", "recovery")
        pair: dict[str, Any] = {"first": order[0]}
        for kind in order:
            before = os.getloadavg()[0]
            folder = tmp / f"{kind}-{r}"
            try:
                pair[kind] = (recovery_run(replicated, folder, args) if kind == "recovery"
                              else restart_run(bare, profile, folder, args))
            except (RuntimeError, AssertionError) as exc:  # a run that failed: say so
                failed.append(f"pair {r + 1} {kind}: {str(exc).splitlines()[0][:300]}")
                print(failed[-1], file=sys.stderr, flush=True)
                break
            pair[f"load {kind}"] = (before, os.getloadavg()[0])
            print(f"pair {r + 1} {kind}: {json.dumps(pair[kind])} load "
                  f"{pair[f'load {kind}']}", file=sys.stderr, flush=True)
        else:
            for total in (FIRST, BACK):
                pair[f"ratio {total}"] = pair["restart"][total] / pair["recovery"][total]
            out.append(pair)
    return out


def report(pairs: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"gpt2-small {SIZES} (12.6 M parameters), 3 stages on 3 namespace hosts under "
          f"torchrun + coordinator, momentum; host {LOST} (d1) SIGKILLed once "
          f"{args.kill_after} steps committed (a step in flight); hang timeout "
          f"{args.hang_timeout:g} s; restart: checkpoint every {args.checkpoint_every}; "
          f"{len(pairs)} pairs, first alternating")
    print(f"{'pair':>4} {'first':>9} {'load rec':>10} {'load rst':>10} {'rec 1st':>8} "
          f"{'rst 1st':>8} {'ratio':>6} {'rec back':>9} {'rst back':>9} {'ratio':>6}")
    for n, p in enumerate(pairs, 1):
        loads = [f"{a:.1f}-{b:.1f}" for a, b in (p["load recovery"], p["load restart"])]
        print(f"{n:>4} {p['first']:>9} {loads[0]:>10} {loads[1]:>10} "
              f"{p['recovery'][FIRST]:>8.2f} {p['restart'][FIRST]:>8.2f} "
              f"{p[f'ratio {FIRST}']:>5.1f}x {p['recovery'][BACK]:>9.2f} "
              f"{p['restart'][BACK]:>9.2f} {p[f'ratio {BACK}']:>5.1f}x")
    for total in (FIRST, BACK):
        ratios = [p[f"ratio {total}"] for p in pairs]
        print(f"restart / recovery, {total}: median {statistics.median(ratios):.1f}x, "
              f"lowest {min(ratios):.1f}x")
    print(f"{'figure (s unless named)':<50} {'median':>8}  per pair")
    for kind in ("recovery", "restart"):
        print(kind)
        for name in pairs[0][kind]:
            values = [p[kind][name] for p in pairs]
            print(f"  {name:<48} {statistics.median(values):>8.3f}  "
                  f"{', '.join(f'{v:.3f}' for v in values)}")
    print(json.dumps(pairs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--kill-after", type=int, default=6, help="steps committed before the kill")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--hang-timeout", type=float, default=HANG_TIMEOUT_S,
                   help="the coordinator's heartbeat time-out, both arms (default: its own)")
    args = p.parse_args()
    if not 0 < args.checkpoint_every <= args.kill_after < args.steps - 1:
        p.error("need 0 < --checkpoint-every <= --kill-after < --steps - 1")
    netns.remove_stale()
    profile = build_profile()
    failed: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        pairs = paired_runs(profile, Path(tmp), args, failed)
    for line in failed:
        print(f"left out: {line}")
    if not pairs:
        raise SystemExit("every pair failed")
    report(pairs, args)


if __name__ == "__main__":
    main()
