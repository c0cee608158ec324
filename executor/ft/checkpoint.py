"""Checkpoints of a run with ``torch.distributed.checkpoint`` (DCP), resumable under any
plan of the same model and training configuration.

**Keys are plan-independent.** A rank holding blocks ``first..end-1`` saves every tensor
under the block's index, not its stage-local position: parameter or buffer ``rest`` of
block ``i`` is ``model.<i>.<rest>``; optimizer state ``name`` of that parameter is
``optim.<i>.<rest>.<name>`` (``momentum_buffer``; Adam's ``step``, ``exp_avg``,
``exp_avg_sq``); ``step`` is the number of completed steps (the next step to run). The
members of a data-parallel group hold identical copies; DCP's planner writes each key
once. Loading under another plan, each rank asks for the keys of its own blocks and DCP
reads them from whichever files hold them: resharding by block, bit for bit (tensor
bytes are copied, never recomputed).

**Atomic.** A checkpoint of step ``N`` is written to ``<dir>/.step-<N>.tmp``, then (after
every rank's files and DCP's ``.metadata`` are on disk) rank 0 writes
``edgepipe-checkpoint.json`` (what it was trained with) and the commit marker
``COMMITTED``, and renames the directory to ``<dir>/step-<N>`` (one ``rename``). A
directory without the marker is never loaded; a crash mid-save leaves at most a
``.tmp`` directory, removed by the next save of that step. DCP's collectives run on a
process group of their own (gloo), as P11 of the torch reference advises.

**Two layouts, one loader.** A run with a default process group saves one DCP
checkpoint (above). A recovering run (:mod:`executor.ft.recovery`: raw per-generation
groups, no default group) saves **parts** instead, without collectives: after applying
step ``N`` the first member of every stage serialises the plan-independent keys of its
blocks (and ``step``) with ``torch.save`` (:func:`part_bytes`) and sends them to the
coordinator through the run's store (``ckpt/<N>/<rank>``; its data-parallel peers, whose
copies are identical, send an empty value), so no worker needs the checkpoint folder;
once every rank of the generation reported, the coordinator writes each part to
``.step-<N>.tmp/parts/<device>.pt`` (:func:`write_part`: via a temporary name and
``os.replace``, so a part on disk is whole), the record (with ``"parts"``: the devices
whose parts count) and the marker, and renames, as above. :func:`load` takes either
layout under any plan: from parts, each block's keys come from whichever listed part
holds them, tensor bytes copied.

**Compatible.** Resuming checks the model's build spec, the global batch, the optimizer
and its settings and the data seed against the checkpoint's record and refuses a
mismatch with a message naming it (the plan itself may differ: that is the point).

Storage: a DCP checkpoint needs a directory every rank can reach (on several hosts, a
shared file system); parts need one on the coordinator's host only.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from edgepipe.planner.errors import InputError
from edgepipe.planner.plan import Plan
from torch import nn

MARKER = "COMMITTED"
PARTS = "parts"
RECORD = "edgepipe-checkpoint.json"
#: optimizer state each optimizer of the training config keeps per parameter
OPTIMIZER_STATE = {"sgd": (), "momentum": ("momentum_buffer",),
                   "adam": ("step", "exp_avg", "exp_avg_sq")}


def training_record(plan: Plan) -> dict[str, Any]:
    """What a checkpoint must agree with to be resumed under ``plan``."""
    config = plan.problem.config
    build = plan.problem.model.build
    return {
        "model": build.describe() if build is not None else plan.problem.model.name,
        "blocks": plan.problem.model.num_blocks,
        "global_batch": config.global_batch,
        "optimizer": config.optimizer,
        "optimizer_settings": {k: list(v) if isinstance(v, tuple) else v
                               for k, v in config.optimizer_settings().items()},
        "data_seed": config.seed,
    }


def _block_keys(module: nn.Sequential, first: int) -> dict[str, str]:
    """Stage-local state-dict key -> plan-independent key (``model.<block>.<rest>``)."""
    index = {name: first + k for k, (name, _) in enumerate(module.named_children())}
    out = {}
    for key in module.state_dict():
        child, _, rest = key.partition(".")
        out[key] = f"{index[child]}.{rest}"
    return out


def _state(module: nn.Sequential, optimizer: torch.optim.Optimizer, first: int,
           optimizer_name: str, step: int, fresh: bool) -> tuple[dict[str, Any], list]:
    """The DCP state dict of a rank; with ``fresh`` the optimizer entries are new zero
    tensors to load into (returned with the parameter they belong to)."""
    keys = _block_keys(module, first)
    state: dict[str, Any] = {"step": step}
    for local, tensor in module.state_dict(keep_vars=True).items():
        state[f"model.{keys[local]}"] = tensor.detach()
    slots = []
    for local, param in module.named_parameters():
        if not param.requires_grad:
            continue
        per_param = {}
        for name in OPTIMIZER_STATE[optimizer_name]:
            if fresh:
                value = (torch.tensor(0.0) if name == "step"
                         else torch.zeros_like(param, memory_format=torch.preserve_format))
            else:
                value = optimizer.state[param][name]
            state[f"optim.{keys[local]}.{name}"] = value
            per_param[name] = value
        slots.append((param, per_param))
    return state, slots


def _dcp() -> ModuleType:
    """``torch.distributed.checkpoint``, imported on first use: it pulls in DTensor and
    sympy (about a third of a worker's import time), which only the DCP layout needs, so
    a worker that never saves or loads one (every recovering run's) does not pay it."""
    import torch.distributed.checkpoint as dcp

    return dcp


def save(root: str | Path, step: int, module: nn.Sequential, optimizer: torch.optim.Optimizer,
         first: int, plan: Plan, rank: int, group: dist.ProcessGroup) -> Path:
    """Collective: save the run after ``step`` completed steps to ``root/step-<step>``
    (module docstring); every rank of the run calls it. Returns the directory."""
    final, tmp = _directories(root, step)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier(group=group)
    state, _ = _state(module, optimizer, first, plan.problem.config.optimizer, step, False)
    dcp = _dcp()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp)), process_group=group)
    dist.barrier(group=group)
    if rank == 0:
        _commit(tmp, final, {**training_record(plan), "step": step, "plan": plan.id})
    dist.barrier(group=group)
    return final


def _directories(root: str | Path, step: int) -> tuple[Path, Path]:
    """The committed directory of ``step`` under ``root`` and the ``.tmp`` one it is built
    in (module docstring, "Atomic")."""
    root = Path(root)
    return root / f"step-{step:08d}", root / f".step-{step:08d}.tmp"


def _commit(tmp: Path, final: Path, record: dict[str, Any]) -> None:
    """Write ``record`` and the marker (synced to disk) into the complete ``tmp``, then
    rename it to ``final``, replacing an older one: the checkpoint counts from the rename."""
    (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    with open(tmp / MARKER, "w") as f:
        f.write(f"{record['step']}\n")
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def folder(checkpoint_dir: str | None, out: str | None) -> Path:
    """Where a run's checkpoints go: ``checkpoint_dir``, else ``<out>/checkpoints``."""
    return Path(checkpoint_dir or Path(out or ".") / "checkpoints")


def part_bytes(step: int, module: nn.Sequential, optimizer: torch.optim.Optimizer,
               first: int, optimizer_name: str) -> bytes:
    """No collectives: this rank's part of the checkpoint of ``step`` (module docstring,
    "Two layouts"), serialised with ``torch.save`` (it travels to the coordinator through
    the store; :func:`write_part` puts it on disk there). O(the rank's state)."""
    state, _ = _state(module, optimizer, first, optimizer_name, step, False)
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                for k, v in state.items()}, buffer)
    return buffer.getvalue()


def write_part(root: str | Path, step: int, device: str, part: bytes) -> Path:
    """Write ``device``'s part (:func:`part_bytes`) of the checkpoint of ``step`` to
    ``root/.step-<step>.tmp/parts/<device>.pt`` via a temporary name and ``os.replace``
    (a part on disk is whole); returns it. The checkpoint counts only once
    :func:`commit_parts` names the part."""
    parts = _directories(root, step)[1] / PARTS
    parts.mkdir(parents=True, exist_ok=True)
    path, tmp = parts / f"{device}.pt", parts / f".{device}.pt.tmp"
    with open(tmp, "wb") as f:
        f.write(part)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def commit_parts(root: str | Path, step: int, plan: Plan, devices: list[str]) -> Path:
    """Commit the checkpoint of ``step`` whose parts ``devices`` wrote (every rank of a
    generation of ``plan``, so every block): record, marker, rename. Returns it."""
    final, tmp = _directories(root, step)
    missing = [d for d in devices if not (tmp / PARTS / f"{d}.pt").is_file()]
    if missing:
        raise InputError(str(tmp), "", f"no checkpoint part of device(s) {missing}")
    _commit(tmp, final, {**training_record(plan), "step": step, "plan": plan.id,
                         PARTS: sorted(set(devices))})
    return final


def resolve(path: str | Path) -> Path:
    """The checkpoint to resume from: ``path`` itself when it is a committed checkpoint,
    else the committed ``step-*`` with the most steps in ``path`` or ``path/checkpoints``.
    Raises :class:`InputError` when there is none."""
    p = Path(path)
    if (p / MARKER).is_file():
        return p
    for folder in (p, p / "checkpoints"):
        done = sorted(d for d in folder.glob("step-*") if (d / MARKER).is_file())
        if done:
            return done[-1]
    raise InputError(str(p), "", "no committed checkpoint here (a step-N directory with a "
                     f"{MARKER} marker); give --resume a checkpoint or a run's checkpoints")


def check_resume(plan: Plan, path: str | Path) -> Path:
    """:func:`resolve` ``path`` and refuse a checkpoint trained otherwise than ``plan``
    trains (model, blocks, global batch, optimizer and settings, data seed)."""
    ckpt = resolve(path)
    try:
        record = json.loads((ckpt / RECORD).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(str(ckpt / RECORD), "", f"unreadable checkpoint record ({exc})") from None
    want = training_record(plan)
    for key, value in want.items():
        if record.get(key) != value:
            raise InputError(
                str(ckpt), "", f"checkpoint has {key} {record.get(key)!r} but plan {plan.id} "
                f"trains with {value!r}; resume under a plan of the same model and training "
                "configuration"
            )
    return ckpt


def load(path: str | Path, module: nn.Sequential, optimizer: torch.optim.Optimizer,
         first: int, plan: Plan, group: dist.ProcessGroup | None) -> int:
    """Load this rank's blocks and their optimizer state from the checkpoint at ``path``
    (:func:`check_resume`; either layout) into ``module`` and ``optimizer`` in place;
    returns the number of completed steps. Collective over ``group`` for a DCP
    checkpoint; ``group=None`` (a recovering run) reads it without collectives."""
    ckpt = check_resume(plan, path)
    name = plan.problem.config.optimizer
    state, slots = _state(module, optimizer, first, name, 0, True)
    if (ckpt / PARTS).is_dir():
        _load_parts(ckpt, state)
    elif group is None:
        dcp = _dcp()
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(ckpt)), no_dist=True)
    else:
        dcp = _dcp()
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(ckpt)), process_group=group)
    for param, per_param in slots:
        if per_param:
            optimizer.state[param] = per_param
    return int(state["step"])


def _load_parts(ckpt: Path, state: dict[str, Any]) -> None:
    """Fill ``state`` in place from the parts the record of ``ckpt`` lists: each key
    from the first part holding it. Raises :class:`InputError` for a key none holds.
    O(parts x keys)."""
    record = json.loads((ckpt / RECORD).read_text())
    wanted = set(state)
    with torch.no_grad():
        for device in record[PARTS]:
            part = torch.load(ckpt / PARTS / f"{device}.pt", map_location="cpu",
                              weights_only=True)
            for key in [k for k in wanted if k in part]:
                if isinstance(state[key], torch.Tensor):
                    state[key].copy_(part[key])
                else:
                    state[key] = part[key]
                wanted.discard(key)
    if wanted:
        raise InputError(str(ckpt), "", f"no part of this checkpoint holds {sorted(wanted)[:3]} "
                         f"({len(wanted)} key(s)); it is not of this model")
