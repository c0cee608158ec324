"""The cross-host coordinator (executor/ft/coordinator.py): a stand-alone process that hosts the
store and the control plane of a job whose workers it did not start, as torchrun's are.

Real processes: the coordinator is ``python -m executor.ft.coordinator``, each worker is
``python -m executor.worker ... --coordinator HOST:PORT`` with the environment torchrun
gives it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); gloo timeouts are a minute, so a
run stopped in seconds was stopped by the control plane. Every process is reaped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from edgepipe.executor.core.metrics import read_jsonl
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.control import Coordinator, host_store
from edgepipe.executor.ft.coordinator import (
    EXIT_WAIT_S,
    EXITED_BEATS,
    _linger,
    join,
    own_hosts,
    parse_address,
    send_checkpoint,
    store_peers,
)
from edgepipe.executor.launch import launch
from edgepipe.planner.errors import InputError
from edgepipe.planner.plan import load_plan
from edgepipe.planner.timeouts import HEARTBEAT_S

from tests.helpers.executor_helpers import MLP_DATASET, make_test_plan, profile_mlp, write_plan
from tests.helpers.paths import REPO
from tests.helpers.processes import PY, free_port

STAGES = [(0, 1, [2]), (1, 2, [2]), (2, 4, [2])]
HANG_S = 3.0
#: the hang timeout of runs in which no worker fails (only the coordinator may)
NO_FAILURE_HANG_S = 20.0
#: scheduling slack on a loaded two-core machine
SLACK_S = 3.0


class Job:
    """A coordinator and its workers, as processes; :meth:`reap` kills what is left."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.coordinator: subprocess.Popen[str] | None = None
        self.workers: list[subprocess.Popen[str]] = []

    def start_coordinator(self, plan: Path, *args: str, hang_s: float = HANG_S) -> None:
        self.coordinator = subprocess.Popen(
            [PY, "-m", "edgepipe.executor.ft.coordinator", str(plan), "--port", str(self.port),
             "--hang-timeout", str(hang_s), *args],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def start_workers(self, plan: Path, world: int, *args: str, ranks: int | None = None,
                      timeout_s: float = 60) -> None:
        for rank in range(world if ranks is None else ranks):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
                   "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
            self.workers.append(subprocess.Popen(
                [PY, "-m", "edgepipe.executor.worker", str(plan), "--dataset", MLP_DATASET,
                 "--timeout", str(timeout_s), "--coordinator", f"127.0.0.1:{self.port}", *args],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))

    def reap(self) -> None:
        for p in [*self.workers, *([self.coordinator] if self.coordinator else [])]:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=30)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    j = Job(tmp_path)
    try:
        yield j
    finally:
        j.reap()


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    profile = profile_mlp()
    return write_plan(make_test_plan(profile, STAGES, 2, 2), tmp_path_factory.mktemp("plan"))


def readable(err: str, chars: int = 3000) -> str:
    """The end of a worker's stderr without the C++ frames of torch's error messages."""
    return "\n".join(line for line in err.splitlines()
                     if not line.lstrip().startswith("frame #"))[-chars:]


def wait_all(procs: list[subprocess.Popen[str]], within_s: float) -> list[tuple[int, str]]:
    """(exit status, stderr) of each process; fails if one runs past ``within_s``."""
    deadline = time.monotonic() + within_s
    results = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"process {p.args} still running after {within_s} s")
        results.append((p.returncode, err))
    return results


def test_an_address_is_host_and_port() -> None:
    assert parse_address("198.18.0.1:29500") == ("198.18.0.1", 29500)
    for bad in ("198.18.0.1", ":29500", "h:0", "h:port", "h:70000"):
        with pytest.raises(ValueError, match="is not HOST:PORT"):
            parse_address(bad)


#: a process that holds a TCP connection to the store at argv[2] from the address argv[1]
#: (a worker's, without torch: the store's server accepts any connection) until killed
CONNECTED = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind((sys.argv[1], 0)); s.connect(('127.0.0.1', int(sys.argv[2])))\n"
    "print('connected', flush=True); time.sleep(600)\n"
)


def test_an_aborted_run_lingers_until_the_silent_workers_processes_are_gone() -> None:
    # Devices a and b stopped beating (they never beat); a's process still holds its
    # connection to the store from 127.0.0.2, its host. The coordinator must outlive it
    # (a worker's beats stop when its interpreter begins to shut down, seconds before its
    # process is gone under load), but not wait for the dead device c, which shares
    # b's host 127.0.0.3: its process may live on, hung or cut off.
    store = host_store(0)
    coordinator = Coordinator(store, ["a", "b", "c"], hang_timeout_s=3.0)
    for device, address in (("a", "127.0.0.2"), ("b", "127.0.0.3"), ("c", "127.0.0.3")):
        store.set(f"ctl/host/{device}", address)
    procs = [subprocess.Popen([PY, "-c", CONNECTED, address, str(store.port)],
                              stdout=subprocess.PIPE, text=True)
             for address in ("127.0.0.2", "127.0.0.3")]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "connected\n"
        deadline = time.monotonic() + 30  # the store's thread accepts them meanwhile
        while sorted(store_peers(store.port) or []) != ["127.0.0.2", "127.0.0.3"]:
            assert time.monotonic() < deadline, store_peers(store.port)
            time.sleep(0.01)
        killed_at = [0.0]

        def kill_a() -> None:
            time.sleep(EXITED_BEATS * HEARTBEAT_S + 1.0)  # a second after a's beats went quiet
            killed_at[0] = time.monotonic()
            procs[0].kill()

        killer = threading.Thread(target=kill_a)
        killer.start()
        _linger(coordinator, ["a", "b"], own_hosts(store, ["a", "b"], ["c"]))
        ended = time.monotonic()
        killer.join()
        assert killed_at[0] > 0 and ended > killed_at[0]  # not before a's process was gone
        # and not much after (a deadline that only stops a hung test: the cap is 10 s)
        assert ended - killed_at[0] < EXIT_WAIT_S / 2, ended - killed_at[0]
        assert store_peers(store.port) == ["127.0.0.3"]  # c's host: not waited for
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


# a worker's connect time-out against an in-process store: it only stops a hung test (5 s
# timed out once while three xdist workers and other jobs started at load 5-9)
JOIN_TIMEOUT_S = 30


def recovering_store(steps: int = 4, checkpoint_every: int = 2, resume: int = 0,
                     time_scale: float | None = None):
    """A real store holding what a recovering coordinator publishes before any worker
    joins (executor/ft/coordinator.py ``supervise``)."""
    store = host_store(0)
    store.set("ctl/generation", "1")
    store.set("ctl/recover", json.dumps({
        "steps": steps, "checkpoint_every": checkpoint_every, "resume": resume,
        "emulate": time_scale is not None, "time_scale": time_scale, "standbys": [],
        "start_timeout_s": 120.0, "hang_timeout_s": 10.0}))
    return store


def test_a_worker_joining_a_recovering_coordinator_takes_its_checkpoint_interval(
    plan_file: Path,
) -> None:
    store = recovering_store(checkpoint_every=2)
    endpoint = Endpoint(rank=0, world_size=3, store_host="127.0.0.1", store_port=store.port)
    for given in (0, 2):  # none, or the coordinator's own
        opts = WorkerOptions(plan=str(plan_file), steps=4, timeout_s=JOIN_TIMEOUT_S,
                             checkpoint_every=given)
        joined, _ = join(opts, endpoint, f"127.0.0.1:{store.port}")
        assert (joined.recover, joined.generation, joined.checkpoint_every) == (True, 1, 2)
        assert joined.resume is None


@pytest.mark.parametrize(("extra", "message"), [
    ({"steps": 5}, "--steps: 5 but the coordinator runs --steps 4; give both the same"),
    ({"checkpoint_every": 3}, "--checkpoint-every: 3 but the coordinator checkpoints every 2"),
    ({"checkpoint_dir": "ckpt"}, "--checkpoint-dir: a recovering run across hosts keeps its "
     "checkpoints on the coordinator's host: give --checkpoint-dir to `edgepipe coordinate`"),
    ({"resume": "ckpt"}, "--resume: a recovering run across hosts keeps its checkpoints on "
     "the coordinator's host: give --resume to `edgepipe coordinate`"),
    ({"emulate": True, "time_scale": 4.0}, "--emulate: this worker runs --emulate "
     "--time-scale 4 but the coordinator no --emulate"),
])
def test_a_worker_contradicting_a_recovering_coordinator_is_refused_in_one_line(
    plan_file: Path, extra: dict, message: str,
) -> None:
    store = recovering_store(steps=4, checkpoint_every=2)
    endpoint = Endpoint(rank=0, world_size=3, store_host="127.0.0.1", store_port=store.port)
    opts = WorkerOptions(plan=str(plan_file), **{"steps": 4, "timeout_s": 5, **extra})
    with pytest.raises(InputError) as caught:
        join(opts, endpoint, f"127.0.0.1:{store.port}")
    assert str(caught.value).startswith(message), caught.value
    assert "\n" not in str(caught.value)


def test_an_emulating_worker_must_run_the_coordinators_time_scale(plan_file: Path) -> None:
    store = recovering_store(time_scale=40.0)
    endpoint = Endpoint(rank=0, world_size=3, store_host="127.0.0.1", store_port=store.port)
    same = WorkerOptions(plan=str(plan_file), steps=4, timeout_s=JOIN_TIMEOUT_S, emulate=True,
                         time_scale=40.0)
    assert join(same, endpoint, f"127.0.0.1:{store.port}")[0].emulate
    for worker in (replace(same, time_scale=20.0), replace(same, emulate=False)):
        with pytest.raises(InputError, match="but the coordinator --emulate --time-scale 40"):
            join(worker, endpoint, f"127.0.0.1:{store.port}")


def test_the_coordinators_checkpoint_reaches_a_worker_whole_through_the_store(
    plan_file: Path, tmp_path: Path,
) -> None:
    # a committed checkpoint with a part above the store's 8 MiB payload cap
    ckpt = tmp_path / "coord" / "step-00000002"
    (ckpt / "parts").mkdir(parents=True)
    files = {"parts/d0.pt": os.urandom(9 * 2**20), "parts/d1.pt": b"\x01\x02",
             "edgepipe-checkpoint.json": b'{"step": 2}', checkpoint.MARKER: b"2\n"}
    for name, content in files.items():
        (ckpt / name).write_bytes(content)
    store = recovering_store(resume=2)
    send_checkpoint(store, ckpt)
    endpoint = Endpoint(rank=1, world_size=3, store_host="127.0.0.1", store_port=store.port)
    out = tmp_path / "worker"
    opts = WorkerOptions(plan=str(plan_file), steps=4, timeout_s=JOIN_TIMEOUT_S, out=str(out))
    joined, _ = join(opts, endpoint, f"127.0.0.1:{store.port}")
    assert joined.resume == str(out / "resumed" / "step-00000002")
    got = Path(joined.resume)
    assert {str(f.relative_to(got)): f.read_bytes() for f in got.rglob("*") if f.is_file()
            } == files


def test_a_worker_without_a_coordinator_says_where_it_looked(job: Job, plan_file: Path) -> None:
    job.start_workers(plan_file, 3, "--steps", "1", ranks=1, timeout_s=2)
    ((status, err),) = wait_all(job.workers, within_s=120)
    assert status == 2
    assert f"no coordinator at 127.0.0.1:{job.port}" in err
    assert "start `edgepipe coordinate` there first" in err


@pytest.mark.slow
def test_a_job_under_the_coordinator_trains_as_the_local_launcher_does(
    job: Job, plan_file: Path, tmp_path: Path
) -> None:
    # nothing fails here: a long hang timeout (under a load average of 26 a 3 s one once
    # declared a starved worker hung)
    job.start_coordinator(plan_file, hang_s=NO_FAILURE_HANG_S)
    job.start_workers(plan_file, 3, "--steps", "3", "--deterministic", "--out",
                      str(tmp_path / "job"))
    results = wait_all(job.workers, within_s=180)
    assert [s for s, _ in results] == [0, 0, 0], results
    (status, err), = wait_all([job.coordinator], within_s=30)
    assert status == 0 and "every worker finished (generation 1)" in err
    local = launch(WorkerOptions(str(plan_file), 3, str(tmp_path / "local"), deterministic=True,
                                 dataset=MLP_DATASET, timeout_s=60))
    assert [m["loss"] for m in read_jsonl(tmp_path / "job" / "metrics.jsonl")] == local.losses


@pytest.mark.slow
def test_a_killed_worker_is_named_with_its_host_and_every_other_is_aborted(
    job: Job, plan_file: Path, tmp_path: Path
) -> None:
    job.start_coordinator(plan_file)
    out = tmp_path / "job"
    job.start_workers(plan_file, 3, "--steps", "100000", "--out", str(out))
    deadline = time.monotonic() + 180
    while len(read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
               ) < 2:
        assert time.monotonic() < deadline, "no two steps within 180 s"
        time.sleep(0.1)
    killed = time.monotonic()
    job.workers[2].kill()  # the last stage: its neighbour sees it only by a gloo error
    (status, err), = wait_all([job.coordinator], within_s=HANG_S + 10 + SLACK_S)
    took = time.monotonic() - killed
    assert status == 2
    assert ("device 'd2' (rank 2, stage 2) on host 127.0.0.1 went silent: no heartbeat for "
            in err), err
    assert "declared dead and fenced, generation 1 aborted" in err
    assert took >= HANG_S - 1.0, took  # never before the hang timeout (one beat of slack)
    others = wait_all(job.workers[:2], within_s=10)
    assert all(s != 0 for s, _ in others), others


@pytest.mark.slow
def test_losing_the_coordinator_stops_every_worker_and_keeps_the_last_checkpoint(
    job: Job, plan_file: Path, tmp_path: Path
) -> None:
    job.start_coordinator(plan_file, hang_s=NO_FAILURE_HANG_S)
    out, ckpt = tmp_path / "job", tmp_path / "ckpt"
    job.start_workers(plan_file, 3, "--steps", "100000", "--out", str(out),
                      "--checkpoint-every", "25", "--checkpoint-dir", str(ckpt))
    deadline = time.monotonic() + 180
    while not list(ckpt.glob("step-*")):
        if time.monotonic() > deadline or any(w.poll() is not None for w in job.workers):
            pytest.fail("no committed checkpoint within 180 s, or a worker exited")
        time.sleep(0.05)
    assert job.coordinator is not None
    os.kill(job.coordinator.pid, signal.SIGKILL)
    killed = time.monotonic()
    results = wait_all(job.workers, within_s=60)
    took = time.monotonic() - killed
    committed = sorted(d.name for d in ckpt.glob("step-*"))
    assert all(s != 0 for s, _ in results), results
    # every rank stops with one clear line, on its next store call (P5), not by a gloo error
    for status, err in results:
        assert status == 2, readable(err)
        # (the next store call fails at once; a rank whose heartbeat noticed first
        # says so with the control plane's words)
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: the coordinator is unreachable ("), readable(err)
        # and nothing of torch's: its C++ warning of each failed store call (with its
        # frames) came from any thread, before or after that line
        assert "frame #" not in err and "TCPStore.cpp" not in err, readable(err)
    # the newest committed checkpoint loads for the plan (complete, marker written)
    newest = checkpoint.check_resume(load_plan(plan_file), ckpt)
    assert newest.name == committed[-1]
    assert took < 60, took


@pytest.mark.slow
def test_losing_a_recovering_coordinator_stops_every_worker_and_keeps_its_checkpoints(
    job: Job, plan_file: Path, tmp_path: Path
) -> None:
    # the single point of failure stays one with --recover: its host holds the
    # checkpoints, the workers stop with one line, the newest committed one loads
    out, ckpt = tmp_path / "coord", tmp_path / "coord" / "checkpoints"
    steps = "100000"
    # --no-watch-slowdown: the workers share this machine's cores, so their compute
    # times measure its scheduling, not devices (executor/ft/slowdown.py, "Real devices")
    job.start_coordinator(plan_file, "--recover", "--steps", steps, "--out", str(out),
                          "--checkpoint-every", "5", "--no-watch-slowdown",
                          hang_s=NO_FAILURE_HANG_S)
    job.start_workers(plan_file, 3, "--steps", steps, "--out", str(tmp_path / "workers"))
    deadline = time.monotonic() + 180
    while len(list(ckpt.glob("step-*"))) < 2:
        if time.monotonic() > deadline or any(w.poll() is not None for w in job.workers):
            pytest.fail("no two committed checkpoints within 180 s, or a worker exited")
        time.sleep(0.05)
    assert job.coordinator is not None
    os.kill(job.coordinator.pid, signal.SIGKILL)
    results = wait_all(job.workers, within_s=90)
    for status, err in results:
        assert status == 2, readable(err)
        assert err.strip().splitlines()[-1].startswith(
            "error: the coordinator is unreachable ("), readable(err)
        assert "frame #" not in err and "TCPStore.cpp" not in err, readable(err)
    committed = sorted(d.name for d in ckpt.glob("step-*"))
    newest = checkpoint.check_resume(load_plan(plan_file), ckpt)
    assert newest.name == committed[-1]
    assert (newest / checkpoint.PARTS).is_dir()
    assert not (tmp_path / "workers" / "checkpoints").exists()
