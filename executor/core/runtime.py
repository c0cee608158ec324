"""The loop that executes one rank's actions of one training step.

Inputs: the rank's stage blocks, its action list (``planner.schedule.build(config.schedule,
[stage warm-ups], M)[stage]``: F, B, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD), its
transfers (:class:`executor.core.comm.StageLinks`), its stage's data-parallel group, the loss
and the optimizer. State per step: per micro-batch the stage input, the output (or
per-sample losses on the last stage) and, in deterministic mode, one flat gradient per
global sample position. One step = every action in order, then the optimizer step (the
step's commit point is the caller's, see :mod:`executor.core.loop`).

**Deterministic mode** (DETERMINISTIC.md): F and B run each sample alone (a batch of
one, a freshly allocated tensor); B keeps the per-sample parameter gradient ``g_i``
(flattened) of every global position ``i`` the rank computes; REDUCE_GRAD gathers all
``B`` of them within the stage group (each member broadcasts its own in member order)
and forms ``acc = g_0.clone(); acc.add_(g_i) for i = 1..B-1; acc.div_(B)``, so every
plan sums the same tensors in the same order as the single-process reference. Cost:
``B / g`` x (stage parameters) floats per rank, and ``B`` batch-one passes.

**Fast mode**: F and B run a rank's whole slice of a micro-batch at once with the loss
scaled by ``slice / B``; gradients accumulate in ``.grad`` over micro-batches and are
all-reduced (sum) in the stage group: the global-batch mean for any sample split. Every
``.grad`` is a view of one flat buffer, made at the first step and zeroed in place at each
step's start; backward adds into it in place and the all-reduce runs on it, so no step
allocates gradients (docs/decisions.md, "Gradients live in one flat buffer").

**Receives** are posted ahead of their RECV actions and waited for at the action
(:class:`executor.core.receives.StepReceives`): ``recv_ahead`` per direction, by default
the stage's warm-up; 0 posts each at its action.

Hooks: every transfer goes through the :class:`~executor.core.comm.Transport` of the links;
after every F and B the runtime calls :meth:`ComputeHook.after_compute` with the real
seconds it took (the emulation waits there until the plan's profiled time has passed),
and after REDUCE_GRAD :meth:`ComputeHook.after_reduce`. In a lab device's process every action
(and the step's wait for its sends, and the optimizer step) ends, inside its timed
interval, with the process's pacing (:func:`pace_every_action`; executor/lab/pacing.py).

**Control checks**: before every action and before the optimizer step the runtime calls
``check()`` (the worker passes :meth:`executor.ft.control.WorkerControl.check` of its
generation), so an aborted generation stops at the next action boundary and never
applies its optimizer step. A rank blocked inside a transfer or collective does not get
there (a blocked gloo op cannot be interrupted, torch-and-solvers.md P6): the launcher
kills it after a grace period.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from edgepipe.executor.core.comm import StageGroup, StageLinks
from edgepipe.executor.core.layout import RankLayout
from edgepipe.executor.core.receives import StepReceives, warmup
from edgepipe.executor.core.stage import Loss
from edgepipe.planner.inputs.config import OptimizerName
from edgepipe.planner.schedule import Action, ActionType
from torch import nn

#: called at the end of every action of every runtime of this process (pace_every_action)
_pace: Callable[[], None] | None = None


def pace_every_action(pace: Callable[[], None] | None) -> None:
    """Call ``pace`` at the end of every action, the step's wait for its sends and the
    optimizer step of every :class:`StageRuntime` of this process, inside the action's
    timed interval (None: nothing). Only a lab device's worker sets it, to its pacer
    (:class:`executor.lab.pacing.Pacer`), before it builds its runtime: pacing is a
    property of the process the device is."""
    global _pace
    _pace = pace


class ComputeHook:
    """Called after each forward and backward with the real seconds it took; the base
    class does nothing (real time). The emulation overrides it to wait until the
    device's profiled time for the action has passed."""

    def after_compute(self, action: Action, real_seconds: float) -> None:
        return None

    def after_reduce(self, action: Action, real_seconds: float) -> None:
        """Called after each REDUCE_GRAD (the emulation waits out the link time)."""
        return None


@dataclass
class Interval:
    """One timed action: ``kind`` is an action type name or ``OPTIM``."""

    kind: str
    micro_batch: int | None
    start_ms: float
    end_ms: float


@dataclass
class StepRecord:
    """What one rank did in one step (times in ms from the step's start)."""

    step: int
    losses: list[tuple[int, float]] = field(default_factory=list)
    loss_sum: float | None = None
    intervals: list[Interval] = field(default_factory=list)
    wall_ms: float = 0.0
    #: wall-clock seconds (``time.time()``) at the step's start
    started_at: float = 0.0
    #: the step's stamped transfer pieces (:meth:`StageLinks.take_transfers`)
    transfers: list[list[Any]] = field(default_factory=list)

    def total(self, *kinds: str) -> float:
        return sum(i.end_ms - i.start_ms for i in self.intervals if i.kind in kinds)


def make_optimizer(
    params: list[nn.Parameter], name: OptimizerName, settings: dict[str, Any]
) -> torch.optim.Optimizer:
    """``torch.optim`` for the config's optimizer, ``foreach=False`` (DETERMINISTIC.md):
    sgd -> SGD(lr), momentum -> SGD(lr, momentum), adam -> Adam(lr, betas, eps)."""
    if name in ("sgd", "momentum"):
        return torch.optim.SGD(params, foreach=False, **settings)
    if name == "adam":
        return torch.optim.Adam(params, foreach=False, **settings)
    raise ValueError(f"unknown optimizer {name!r}")


class StageRuntime:
    """Executes a rank's action list: one step is :meth:`compute` then :meth:`apply`
    (:func:`executor.core.loop.run_steps` runs the step's commit point in between)."""

    def __init__(
        self,
        module: nn.Sequential,
        layout: RankLayout,
        rank: int,
        actions: tuple[Action, ...],
        links: StageLinks,
        group: StageGroup | None,
        loss_fn: Loss,
        optimizer: torch.optim.Optimizer,
        *,
        deterministic: bool,
        hook: ComputeHook | None = None,
        device: torch.device | None = None,
        check: Callable[[], None] | None = None,
        recv_ahead: int | None = None,
    ) -> None:
        self.module = module
        self.layout = layout
        self.rank = rank
        me = layout.ranks[rank]
        self.me = me
        self.first = me.stage == 0
        self.last = me.stage == layout.num_stages - 1
        self.actions = actions
        self.recv_ahead = warmup(actions) if recv_ahead is None else recv_ahead
        self.links = links
        self.members = layout.stage_ranks[me.stage]
        self.group = group if len(self.members) > 1 else None
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.deterministic = deterministic
        self.hook = hook or ComputeHook()
        self.check = check or (lambda: None)
        self.device = device or torch.device("cpu")
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.global_batch = layout.global_batch
        #: fast mode: per parameter dtype the flat buffer its ``.grad`` views (made at the
        #: first step; one, the parameters' dtype, for every model of the zoo)
        self.flat_grads: list[torch.Tensor] = []
        #: the parameters each of :attr:`flat_grads` holds, one list per dtype, in order
        self._grad_groups = [[p for p in self.params if p.dtype == dtype]
                             for dtype in dict.fromkeys(p.dtype for p in self.params)]

    # -- one step ------------------------------------------------------------------------
    def apply(self, record: StepRecord) -> None:
        """The optimizer step of the step :meth:`compute` just ran (a recovering run's
        loop calls it only once the coordinator committed the step)."""
        start = time.perf_counter()
        self.optimizer.step()
        self._mark(record, "OPTIM", None, start)
        record.wall_ms = (time.perf_counter() - self._t0) * 1e3

    def compute(
        self,
        step: int,
        inputs: list[torch.Tensor] | None,
        targets: list[torch.Tensor] | None,
    ) -> StepRecord:
        """Every action of step ``step`` (gradients in ``.grad``), no optimizer step.

        ``inputs[m]`` (first stage) / ``targets[m]`` (last stage) are this rank's rows
        of micro-batch ``m``."""
        record = StepRecord(step, started_at=time.time())
        t0 = time.perf_counter()
        self._t0 = t0
        state: dict[int, dict[str, Any]] = {}
        per_sample: dict[int, torch.Tensor] = {}
        recv_f: dict[int, torch.Tensor] = {}
        recv_b: dict[int, torch.Tensor] = {}
        self._clear_grads()
        receives = StepReceives(self.links, self.actions, self.recv_ahead)
        for action in self.actions:
            self.check()
            start = time.perf_counter()
            m = action.micro_batch
            kind = action.type
            if kind is ActionType.REDUCE_GRAD:
                self._reduce(per_sample)
                self.hook.after_reduce(action, time.perf_counter() - start)
            elif m is None:
                raise ValueError(f"action {action} names no micro-batch")
            elif kind is ActionType.RECV_F:
                recv_f[m] = receives.take(kind, m)
            elif kind is ActionType.RECV_B:
                recv_b[m] = receives.take(kind, m)
            elif kind is ActionType.F:
                x = _rows(inputs, m, "inputs") if self.first else recv_f.pop(m)
                target = _rows(targets, m, "targets") if self.last else None
                state[m] = self._forward(x, target, record, m)
                self.hook.after_compute(action, time.perf_counter() - start)
            elif kind is ActionType.SEND_F:
                self.links.send_activations(m, state[m]["send"])
                del state[m]["send"]
            elif kind is ActionType.B:
                grad = None if self.last else recv_b.pop(m)
                state[m]["input_grad"] = self._backward(state[m], grad, m, per_sample)
                self.hook.after_compute(action, time.perf_counter() - start)
            elif kind is ActionType.SEND_B:
                self.links.send_gradients(m, state[m]["input_grad"])
            self._mark(record, kind.value, m, start)
        start = time.perf_counter()
        self.links.wait_sends()
        self._mark(record, "SEND_WAIT", None, start)
        record.transfers = self.links.take_transfers()
        return record

    def _mark(self, record: StepRecord, kind: str, m: int | None, start: float) -> None:
        if _pace is not None:
            _pace()
        end = time.perf_counter()
        record.intervals.append(
            Interval(kind, m, (start - self._t0) * 1e3, (end - self._t0) * 1e3)
        )

    def _position(self, m: int, k: int) -> int:
        return m * self.layout.micro_batch_size + self.me.offset + k

    # -- compute -------------------------------------------------------------------------
    def _leaf(self, x: torch.Tensor, fresh: bool) -> torch.Tensor:
        """``x`` as the stage's input leaf; ``fresh`` copies it into its own allocation
        (deterministic mode's batch-of-one rows)."""
        x = x.detach().clone() if fresh else x.detach()
        return x.requires_grad_(not self.first and x.is_floating_point())

    def _forward(
        self, x: torch.Tensor, target: torch.Tensor | None, record: StepRecord, m: int
    ) -> dict[str, Any]:
        if self.deterministic:
            leaves = [self._leaf(x[k : k + 1], fresh=True) for k in range(len(x))]
            outs = [self.module(leaf) for leaf in leaves]
            st: dict[str, Any] = {"leaves": leaves, "outs": outs}
            if self.last:
                assert target is not None
                losses = [
                    self.loss_fn(o, target[k : k + 1].clone()) for k, o in enumerate(outs)
                ]
                st["losses"] = losses
                for k, loss in enumerate(losses):
                    record.losses.append((self._position(m, k), float(loss.detach())))
            else:
                st["send"] = torch.cat([o.detach() for o in outs])
            return st
        leaf = self._leaf(x, fresh=False)
        out = self.module(leaf)
        st = {"leaves": [leaf], "outs": [out]}
        if self.last:
            assert target is not None
            loss = self.loss_fn(out, target) * (len(x) / self.global_batch)
            st["losses"] = [loss]
            record.loss_sum = (record.loss_sum or 0.0) + float(loss.detach())
        else:
            st["send"] = out.detach()
        return st

    def _backward(
        self,
        st: dict[str, Any],
        grad: torch.Tensor | None,
        m: int,
        per_sample: dict[int, torch.Tensor],
    ) -> torch.Tensor | None:
        leaves, outs = st.pop("leaves"), st.pop("outs")
        losses = st.pop("losses", None)
        needs_input = not self.first and leaves[0].requires_grad
        if not self.deterministic:
            if self.last:
                losses[0].backward()
            else:
                torch.autograd.backward(outs[0], grad)
            return leaves[0].grad if needs_input else None
        input_grads = []
        for k, out in enumerate(outs):
            if self.last:
                roots, seeds = [losses[k]], None
            else:
                assert grad is not None
                roots, seeds = [out], [grad[k : k + 1].clone()]
            wrt = [*self.params, leaves[k]] if needs_input else list(self.params)
            grads = torch.autograd.grad(roots, wrt, seeds, allow_unused=True)
            flat = [
                (torch.zeros_like(p) if g is None else g).reshape(-1)
                for p, g in zip(self.params, grads, strict=False)
            ]
            per_sample[self._position(m, k)] = torch.cat(flat) if flat else torch.zeros(0)
            if needs_input:
                input_grads.append(grads[-1])
        return torch.cat(input_grads) if needs_input else None

    # -- gradient combination ------------------------------------------------------------
    def _reduce(self, per_sample: dict[int, torch.Tensor]) -> None:
        if self.deterministic:
            self._reduce_deterministic(per_sample)
        elif self.group is not None:
            for flat in self.flat_grads:
                self.group.all_reduce(flat)

    def _clear_grads(self) -> None:
        """Gradients at zero before a step: in deterministic mode none (REDUCE_GRAD sets
        them); in fast mode every ``.grad`` a view of its dtype's buffer in
        :attr:`flat_grads`, zeroed in place (a fresh gradient per step cost the step's first
        backwards 40-70% more CPU in a lab device, docs/decisions.md)."""
        if self.deterministic:
            for p in self.params:
                p.grad = None
            return
        if not self.flat_grads:
            self.flat_grads = [
                torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype,
                            device=self.device) for group in self._grad_groups]
        for group, flat in zip(self._grad_groups, self.flat_grads, strict=True):
            flat.zero_()
            _bind_grads(group, flat)  # (re)bound each step: nothing else may own them


    def _reduce_deterministic(self, per_sample: dict[int, torch.Tensor]) -> None:
        if not self.params:
            return
        every = dict(per_sample)
        if self.group is not None:
            for member in self.members:
                positions = self.layout.positions(member)
                if member == self.rank:
                    buf = torch.stack([per_sample[i] for i in positions])
                else:
                    size = next(iter(per_sample.values())).numel()
                    buf = torch.empty(len(positions), size, device=self.device)
                self.group.broadcast(buf, member)
                if member != self.rank:
                    every.update(zip(positions, buf.unbind(0), strict=True))
        if sorted(every) != list(range(self.global_batch)):
            raise RuntimeError(f"rank {self.rank} has gradients of positions {sorted(every)}")
        acc = every[0].clone()
        for i in range(1, self.global_batch):
            acc.add_(every[i])
        acc.div_(self.global_batch)
        _bind_grads(self.params, acc)


def _bind_grads(params: list[nn.Parameter], flat: torch.Tensor) -> None:
    """Each of ``params``' ``.grad`` the next slice of ``flat``, in order."""
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p)
        offset += n


def _rows(batches: list[torch.Tensor] | None, m: int, what: str) -> torch.Tensor:
    """This rank's rows of micro-batch ``m``: the first stage is given the inputs, the
    last the targets; ``None`` there is the caller's bug."""
    if batches is None:
        raise ValueError(f"this stage reads the {what} of each micro-batch but was given none")
    return batches[m]
