"""The ``torch-pipelining`` engine: a plan trained with torch.distributed.pipelining's own
``PipelineStage`` and schedules (one rank: :mod:`executor.engines.torch_worker`), on this
machine (:func:`launch_local`: one process per plan device, forked from the preloaded
forkserver of :mod:`executor.core.starting`, gloo with the run's
short timeout) or across hosts under torchrun (``-m edgepipe.executor.engines.torch_worker``).

**What it runs** (:func:`executor.engines.torch_plans.refusal` says why not, in one line,
for any other plan): stage boundaries and micro-batches from the plan, torch's
``Schedule1F1B`` or ``ScheduleGPipe`` for the plan's ``1f1b`` / ``gpipe`` (torch's own
warm-up, not the plan's ``K_p``), data-parallel stage groups (each stage's gradients
averaged in its group after the step; not DDP, which fails or trains wrong with
pipelining in torch 2.13 on gloo: torch_worker.py), provided every stage has the same
number of devices (one pipeline per replica) and every device of a stage the same share
of each micro-batch. It refuses:

* stages of different widths: edgepipe's runtime re-slices activations between them,
  torch pipelining sends a stage's whole output to one peer;
* uneven shares: torch's data parallelism gives every replica the same batch
  (pytorch issue #126600, "heterogeneous data parallel");
* ``1f1b`` with fewer micro-batches than stages (``Schedule1F1B`` raises; ``gpipe`` runs it).

**No fault tolerance** (:func:`refuse_fault_tolerance`): no control plane, no heartbeats,
no in-process recovery, no replication, no checkpoints, no emulation or fault injection;
options that need any of them are refused before a process starts, and a plan's
``replication_interval`` is ignored. A failing rank stops the run
(:class:`executor.launch.RunFailed` names it).
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.options import Endpoint, WorkerOptions
from edgepipe.executor.core.starting import process, start_deaf_to_ctrl_c, worker_context
from edgepipe.executor.engines.base import RunOptions, builds_the_plans_model
from edgepipe.executor.engines.torch_plans import refusal
from edgepipe.executor.engines.torch_worker import PREFIX, spawned
from edgepipe.executor.launch import (
    RunResult,
    _ended,
    _run_folder,
    _stop,
    _watch,
    preflight,
)
from edgepipe.planner.check import live
from edgepipe.planner.errors import InputError
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.plan import Plan


def refuse_fault_tolerance(options: RunOptions) -> None:
    """Raise :class:`InputError` for the first option that needs fault tolerance, which
    this engine does not have (module docstring)."""
    w = options.worker
    needs = [
        ("--recover", options.recover is True),
        ("--emulate-join", bool(options.joins)),
        ("--standbys", bool(options.standbys)),
        ("--watch-slowdown", options.watch_slowdown is True),
        ("--checkpoint-every", w.checkpoint_every > 0),
        ("--resume", bool(w.resume)),
        ("--inject", bool(w.faults)),
        ("--emulate", w.emulate or bool(w.emulate_slowdown)),
        ("--coordinator", bool(w.coordinator or w.join or w.device)),
    ]
    for flag, given in needs:
        if given:
            raise InputError(flag, "", "the torch-pipelining engine runs without edgepipe's "
                             "fault tolerance and emulation (docs/engines.md); drop "
                             f"{flag}, or run with --engine edgepipe")


class TorchPipeliningEngine:
    """torch.distributed.pipelining (module docstring)."""

    name = "torch-pipelining"

    def supports(self, plan: Plan, model_source: BuildSpec | None) -> str | None:
        return builds_the_plans_model(plan, model_source) or refusal(plan)

    def run(self, plan: Plan, model_source: BuildSpec | None, options: RunOptions) -> RunResult:
        """Refuse what the engine cannot run (:meth:`supports`,
        :func:`refuse_fault_tolerance`), then :func:`launch_local`."""
        why = self.supports(plan, model_source)
        if why is not None:
            raise InputError("--engine", self.name, why)
        refuse_fault_tolerance(options)
        return launch_local(options.worker)


def launch_local(opts: WorkerOptions) -> RunResult:
    """Train ``opts.plan`` here with one process per plan device
    (:func:`executor.engines.torch_worker.spawned`), with the local launcher's own parts:
    its checks before any process starts (:func:`executor.launch.preflight`), its run folder
    and ``status.json``, the run's store hosted in this process (the engine's keys under
    :data:`~executor.engines.torch_worker.PREFIX`), and its watch without a control plane
    (a dead child stops the others; :class:`~executor.launch.RunFailed` names it). Every
    child is reaped on return, on error and on Ctrl-C."""
    layout = preflight(opts)
    out = _run_folder(opts)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=opts.timeout_s))
    ctx = worker_context()  # forked from the preloaded forkserver (executor/core/starting.py)
    procs: list[Any] = []
    if out is not None:
        live.write_state(out, "running", opts.steps)
    try:
        for info in layout.ranks:
            endpoint = Endpoint(info.rank, layout.world_size, "127.0.0.1", store.port,
                                local_rank=info.rank, local_world_size=layout.world_size)
            proc = process(ctx, spawned, (opts, endpoint), f"edgepipe-torch-{info.device}")
            start_deaf_to_ctrl_c(proc)
            procs.append(proc)
        _write_ranks(out, layout, procs)
        _watch(procs, layout, dist.PrefixStore(PREFIX, store), None)
    except BaseException as exc:
        if out is not None:
            live.write_state(out, *_ended(exc, opts.steps))
        raise
    finally:
        _stop(procs)
    if out is not None:
        live.write_state(out, "finished", opts.steps)
    return RunResult.read(out)


def _write_ranks(out: Path | None, layout: RankLayout, procs: list[Any]) -> None:
    if out is not None:
        ranks = [{"rank": i.rank, "device": i.device, "stage": i.stage, "pid": p.pid}
                 for i, p in zip(layout.ranks, procs, strict=True)]
        (out / "ranks.json").write_text(json.dumps(ranks, indent=1) + "\n")
