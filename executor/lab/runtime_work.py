"""The executor's own CPU work per micro-batch of a stage, beyond its blocks' compute.

What is measured, and why it is the executor's work: three ranks of a real pipeline
(:class:`executor.core.runtime.StageRuntime`, the loop every lab and real run uses) run
in three threads of this process, each on its own gloo process group (a raw
``ProcessGroupGloo`` over an in-process store, as the workers make theirs, through the
:class:`~executor.core.comm.Transport` the workers use), one rank per stage,
``MICRO_BATCHES`` micro-batches of ``SAMPLES`` samples a step under 1F1B. The stages
hold no blocks (an empty ``nn.Sequential``; the first stage one scale, so that its
backward has a graph), so what they spend is the runtime's work alone: posting and
waiting for receives (``torch.empty``, ``irecv``, stamps), slicing and posting sends,
the leaf detach and ``requires_grad``, autograd's backward call, the control check and
the interval stamps per action, and the step's final wait for its sends. The middle
rank's thread CPU time (``time.thread_time``) is read before every action (the runtime's
``check`` hook) and after the step, which splits its work into a forward part (RECV_F,
F, SEND_F) and a backward part (RECV_B, B, SEND_B and the step's wait for its sends).

A CPU quota meters every thread of a device's process, gloo's I/O threads (which
read, write and wake the waiting rank for every piece) included, and those take more
than the rank's own thread (measured unconfined at load 20: the middle rank's thread
0.23 ms per micro-batch, the process 0.60 ms per rank and micro-batch). So the figure
is the process's CPU time (``time.process_time``, every thread) over rounds of steps
after the first, between barriers that start each step on all ranks together, divided
by 3 ranks and the micro-batches: the mean stage's work per micro-batch, split forward
/ backward in the middle rank's own proportion. Divided by the quota it is the time
the work takes on the device, as the block times of :mod:`executor.lab.profiling`. It
counts the three ranks' GIL hand-overs, which a device's one runtime thread does not
pay, and the last stage's loss on an output of ``WIDTH`` classes.

Paced (``pace``, as a lab run's devices are, :mod:`executor.lab.pacing`): each rank's
thread paces its own CPU time to the rate before every action and after the step, so
every action starts after a pacing sleep as in a paced run, where the same work takes
more CPU than back to back (docs/lab.md, "Compute").

The caller sets torch's threads as the device's process has them (one in the lab): a
pool of idle intra-op threads spins on CPU and would be counted (with the default pool
on this machine's cores the figure was 3-6x the one-thread figure).

**The optimizer step** (:func:`measure_step`; docs/cost-model.md, "The optimizer
step"): what the runtime's :meth:`~executor.core.runtime.StageRuntime.apply` runs once
per step, ``optimizer.step()`` of the config's optimizer as the executor builds it
(:func:`executor.core.runtime.make_optimizer`, ``foreach=False``, the config's default
settings), over parameters shaped as a fully connected layer (``STEP_SHAPES``: a
1024 x 1024 float32 weight and its bias, 4 MiB) with gradients set. Each timed step
starts after a pace point, as a run's ``OPTIM`` does (the step's ``SEND_WAIT`` ends
with one), and its CPU time is the calling thread's (the step runs on it alone, one
torch thread). The figure is CPU ms per MiB of parameters, for each of ``OPTIMIZERS``
(the profile does not know which one a config will train with): the step's work is
per element (SGD reads the gradient and writes the weight; momentum also its buffer;
Adam its two moments), plus a per-tensor call overhead that this shape makes small:
a stage of many small tensors costs more per MiB than this prices.

Cost: per round ``ROUND_STEPS`` steps x 3 ranks x (6 x MICRO_BATCHES) actions, and one
gloo rendezvous: about a second of CPU unconfined; the optimizer steps, ``STEP_ROUND``
per round of each optimizer, about 0.1 s more.
"""

from __future__ import annotations

import statistics
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from edgepipe.executor.core.comm import StageLinks, Transport
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.runtime import StageRuntime, make_optimizer
from edgepipe.executor.lab.pacing import Pacer, fine_timer_slack
from edgepipe.executor.profiling.noise import NoisePolicy, settled, spread
from edgepipe.planner.inputs.config import OPTIMIZER_STATE, OptimizerName, TrainingConfig
from edgepipe.planner.inputs.profile import RuntimeWork
from edgepipe.planner.schedule import ActionType, build
from torch import nn

#: micro-batches of one measured step, and samples of each
MICRO_BATCHES = 16
SAMPLES = 4
#: floats of one sample at every boundary (4 KiB)
WIDTH = 1024
#: stages of the measured pipeline; the middle one (index 1) is measured
STAGES = 3
#: steps of one round of the measurement
ROUND_STEPS = 2
#: seconds a gloo operation may block before the measurement fails
TIMEOUT_S = 30.0

FORWARD = (ActionType.RECV_F, ActionType.F, ActionType.SEND_F)

#: the optimizer step's parameters: a fully connected layer's weight and bias (4 MiB)
STEP_SHAPES = ((1024, 1024), (1024,))
#: timed optimizer steps per round of :func:`measure_step`
STEP_ROUND = 8
#: the optimizers whose step is measured (every one a config may name)
OPTIMIZERS: tuple[OptimizerName, ...] = tuple(OPTIMIZER_STATE)


class _Scale(nn.Module):
    """``x * w``: the first stage's one op, so its output has a gradient to back-propagate."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def measure_until_stable(policy: NoisePolicy, pace: float | None = None) -> RuntimeWork:
    """The runtime's CPU ms per micro-batch of a stage (module docstring), each rank
    paced to ``pace`` (None: not paced): one warm-up step, then rounds of
    ``ROUND_STEPS`` steps until the last ``policy.window`` rounds' totals agree within
    ``policy.max_spread`` (at most ``policy.max_rounds``,
    :func:`executor.profiling.noise.settled`); the median round of those is kept. One
    gloo rendezvous for all of them. Then each of ``OPTIMIZERS``' step
    (:func:`measure_step`), paced the same; ``spread`` is the largest of the
    measurements'. Raises RuntimeError when a rank fails."""
    store = dist.HashStore()
    layout = RankLayout(
        tuple(RankInfo(r, f"s{r}", r, 0, 0, SAMPLES) for r in range(STAGES)),
        tuple((r,) for r in range(STAGES)),
        SAMPLES,
        MICRO_BATCHES,
    )
    schedule = build("1f1b", [STAGES - p for p in range(STAGES)], MICRO_BATCHES)
    middle: list[tuple[float, float]] = []  # the middle rank's (forward, backward) per step
    errors: list[BaseException] = []
    clock: list[float] = []  # process CPU seconds as each step starts, and at the end
    totals: list[float] = []  # ms per micro-batch and stage, per round
    done = threading.Event()

    def between_steps() -> None:
        """Run by the last rank to reach the barrier: the clock, and whether to stop."""
        clock.append(time.process_time())
        steps = len(clock) - 2  # measured steps finished (the first is the warm-up)
        if steps > 0 and steps % ROUND_STEPS == 0:
            cpu = clock[-1] - clock[-1 - ROUND_STEPS]
            totals.append(cpu * 1e3 / (STAGES * ROUND_STEPS * MICRO_BATCHES))
            if settled(totals, policy):
                done.set()

    barrier = threading.Barrier(STAGES, action=between_steps, timeout=TIMEOUT_S)

    def rank_main(rank: int) -> None:
        pacer = None
        try:
            # as the workers make theirs (executor/ft/generation.py; torch's stubs lack
            # the point-to-point calls a gloo group has)
            pg: dist.ProcessGroup = dist.ProcessGroupGloo(  # type: ignore[assignment]
                store, rank, STAGES, timedelta(seconds=TIMEOUT_S))
            marks: list[float] = []
            shape: dict[int, tuple[int, ...]] = {p: (WIDTH,) for p in range(STAGES)}
            dtype = dict.fromkeys(range(STAGES), torch.float32)
            links = StageLinks(layout, rank, Transport(pg), shape, dtype, torch.device("cpu"))
            spare = nn.Parameter(torch.zeros(1))
            if pace is not None:
                fine_timer_slack()
                pacer = Pacer(pace, cpu=time.thread_time)

            def check() -> None:
                marks.append(time.thread_time())
                if pacer is not None:
                    pacer.pace()

            runtime = StageRuntime(
                nn.Sequential(_Scale()) if rank == 0 else nn.Sequential(), layout, rank,
                schedule[rank], links, None,
                lambda out, target: nn.functional.cross_entropy(out, target),
                torch.optim.SGD([spare], lr=0.0), deterministic=False,
                check=check,
            )
            inputs = [torch.randn(SAMPLES, WIDTH) for _ in range(MICRO_BATCHES)]
            targets = [torch.zeros(SAMPLES, dtype=torch.long) for _ in range(MICRO_BATCHES)]
            step = 0
            while not done.is_set():
                barrier.wait()
                if done.is_set():
                    break
                marks.clear()
                runtime.compute(step, inputs if rank == 0 else None,
                                targets if rank == STAGES - 1 else None)
                check()
                if rank == 1 and step > 0:
                    middle.append(_split(runtime, marks))
                step += 1
        except BaseException as exc:  # reported by the caller, with the others reaped
            errors.append(exc)
            barrier.abort()
        finally:
            if pacer is not None:
                pacer.close()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(STAGES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"measuring the runtime's work failed: {errors[0]!r}")
    window = totals[-policy.window:]
    total = statistics.median(window)
    forward = sum(f for f, _ in middle)
    share = forward / (forward + sum(b for _, b in middle))
    steps = {name: measure_step(name, policy, pace) for name in OPTIMIZERS}
    worst = max([spread(window), *(s for _, s in steps.values())])
    return RuntimeWork(total * share, total * (1 - share), round(worst, 4), len(totals),
                       tuple(sorted((name, ms) for name, (ms, _) in steps.items())))


def measure_step(name: OptimizerName, policy: NoisePolicy,
                 pace: float | None = None) -> tuple[float, float]:
    """The CPU ms per MiB of parameters of one ``optimizer.step()`` of optimizer
    ``name`` (module docstring, "The optimizer step"), on this thread, paced to
    ``pace`` before every step (None: not paced): one untimed step (it creates the
    optimizer's state), then rounds of ``STEP_ROUND`` timed steps until
    ``policy`` settles; the median of the last ``policy.window`` rounds, and their
    spread. O(rounds x STEP_ROUND x parameters)."""
    params = [nn.Parameter(torch.randn(shape)) for shape in STEP_SHAPES]
    for p in params:
        p.grad = torch.randn_like(p)
    mib = sum(p.numel() * p.element_size() for p in params) / 2**20
    settings = TrainingConfig(1, optimizer=name).optimizer_settings()
    optimizer = make_optimizer(params, name, settings)
    optimizer.step()
    pacer = None
    if pace is not None:
        fine_timer_slack()
        pacer = Pacer(pace, cpu=time.thread_time)
    totals: list[float] = []  # CPU ms per MiB, per round
    try:
        while not settled(totals, policy):
            spent = 0.0
            for _ in range(STEP_ROUND):
                if pacer is not None:
                    pacer.pace()
                start = time.thread_time()
                optimizer.step()
                spent += time.thread_time() - start
            totals.append(spent * 1e3 / (STEP_ROUND * mib))
    finally:
        if pacer is not None:
            pacer.close()
    window = totals[-policy.window:]
    return statistics.median(window), spread(window)


def _split(runtime: StageRuntime, marks: list[float]) -> tuple[float, float]:
    """(forward, backward) ms per micro-batch from the CPU clock read before each action
    and after the step: action i took ``marks[i + 1] - marks[i]``; the last action's span
    includes the step's wait for its sends (backward)."""
    forward = backward = 0.0
    for i, action in enumerate(runtime.actions):
        spent = (marks[i + 1] - marks[i]) * 1e3
        if action.type in FORWARD:
            forward += spent
        else:
            backward += spent
    return forward / MICRO_BATCHES, backward / MICRO_BATCHES
