"""The local launcher: one process per plan device on this machine.

:func:`launch` checks the plan before any process starts (schema and decision on load;
a build spec; memory within every device's usable memory; the built blocks against the
profile; the dataset), then hosts the run's ``TCPStore`` in this process (the control
plane: workers never own it, so it outlives any of them), starts one worker per plan
device with the ``multiprocessing`` spawn context (:func:`executor.worker.spawned`) and
polls their exit codes every ``POLL_S``. When a child dies with a non-zero status, every
other child is stopped (SIGTERM, then SIGKILL after ``GRACE_S``) and :class:`RunFailed`
names the dead device. Every child is reaped on return, on error and on Ctrl-C.

The culprit of a failure is the first child seen dead; when several are seen dead at
once, one killed by a signal or one that died without publishing an error (its peers
publish "connection closed" errors) is named.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from executor import data
from executor.checkpoint import check_resume
from executor.control import generation_store
from executor.layout import RankLayout, check_runnable
from executor.metrics import read_jsonl
from executor.stage import check_build
from executor.worker import Endpoint, WorkerOptions, spawned
from planner.errors import EdgepipeError, InputError
from planner.plan import load_plan

POLL_S = 0.02
GRACE_S = 2.0


class RunFailed(EdgepipeError):
    """A worker died; ``device`` / ``rank`` name it, ``exitcode`` is its status
    (negative: killed by that signal)."""

    def __init__(self, message: str, device: str, rank: int, exitcode: int) -> None:
        self.device, self.rank, self.exitcode = device, rank, exitcode
        super().__init__(message)


@dataclass
class RunResult:
    """A finished run: its directory and its metrics lines."""

    out_dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def losses(self) -> list[float]:
        return [m["loss"] for m in self.metrics]


def preflight(opts: WorkerOptions) -> RankLayout:
    """Every check that can refuse the run before a process starts; returns the layout."""
    if opts.steps < 1:
        raise InputError("--steps", "", f"must be at least 1, got {opts.steps}")
    plan = load_plan(opts.plan)
    check_runnable(plan)
    model = plan.problem.model
    assert model.build is not None
    check_build(model)
    name = opts.dataset or data.default_dataset(model.build)
    if name is None:
        raise InputError(
            "--dataset", "", f"model {model.build.describe()} has no built-in task; give "
            "--dataset MODULE:CALLABLE returning a torch Dataset"
        )
    rows = data.Rows(data.load_dataset(name, model.build, plan.problem.config.seed))
    data.step_indices(0, plan.partition.micro_batch_size * plan.partition.num_micro_batches,
                      rows.size, 0)
    if opts.resume:
        check_resume(plan, opts.resume)
    return RankLayout.from_plan(plan)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def launch(opts: WorkerOptions, on_start: Any = None) -> RunResult:
    """Run the plan of ``opts`` here, one process per plan device (module docstring).

    ``on_start(ranks)`` is called with the ``ranks.json`` entries once every child has
    started. Raises :class:`RunFailed` when a worker dies, any other
    :class:`~planner.errors.EdgepipeError` when the plan is refused.
    """
    layout = preflight(opts)
    out = Path(opts.out) if opts.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if not (out / "plan.json").exists() or not (out / "plan.json").samefile(opts.plan):
            shutil.copyfile(opts.plan, out / "plan.json")
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=opts.timeout_s),
    )
    errors = generation_store(store, opts.generation)
    ctx = multiprocessing.get_context("spawn")
    procs = []
    try:
        for info in layout.ranks:
            endpoint = Endpoint(info.rank, layout.world_size, "127.0.0.1", store.port,
                                local_rank=info.rank, local_world_size=layout.world_size)
            proc = ctx.Process(
                target=spawned, args=(opts, endpoint), name=f"edgepipe-{info.device}",
                daemon=True,
            )
            proc.start()
            procs.append(proc)
        ranks = [
            {"rank": i.rank, "device": i.device, "stage": i.stage, "pid": p.pid}
            for i, p in zip(layout.ranks, procs, strict=True)
        ]
        if out is not None:
            (out / "ranks.json").write_text(json.dumps(ranks, indent=1) + "\n")
        if on_start is not None:
            on_start(ranks)
        _watch(procs, layout, errors)
    finally:
        _stop(procs)
    return RunResult(out, read_jsonl(out / "metrics.jsonl") if out is not None else [])


def _error_of(store: dist.Store, rank: int) -> str | None:
    key = f"error/{rank}"
    return store.get(key).decode() if store.check([key]) else None


def _watch(procs: list, layout: RankLayout, store: dist.Store) -> None:
    """Poll until every child exited 0, or raise :class:`RunFailed` for the first death."""
    while True:
        codes = [p.exitcode for p in procs]
        dead = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if dead:
            errors = {r: _error_of(store, r) for r in dead}
            rank = min(dead, key=lambda r: (codes[r] > 0, errors[r] is not None, r))
            info = layout.ranks[rank]
            code = codes[rank]
            how = f"was killed by {_signal_name(code)}" if code < 0 else f"exited with {code}"
            why = f": {errors[rank]}" if errors[rank] else ""
            others = sum(1 for c in codes if c is None)
            raise RunFailed(
                f"device {info.device!r} (rank {rank}, stage {info.stage}) {how}{why}; "
                f"stopped the other {others} worker(s)",
                info.device, rank, code,
            )
        if all(c == 0 for c in codes):
            return
        time.sleep(POLL_S)


def _stop(procs: list) -> None:
    """SIGTERM every live child, SIGKILL those still alive after ``GRACE_S``, join all."""
    for p in procs:
        if p.exitcode is None:
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
