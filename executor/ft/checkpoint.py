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

**Retention.** Each commit keeps the newest ``keep`` (at least 1) committed checkpoints
of its folder and deletes the older ones (:func:`prune`), only after the new one is
committed (its rename), so the newest always stays. A deletion first renames the old
``step-<N>`` to ``.step-<N>.del`` (one ``rename``: from then on :func:`resolve` no longer
sees it, and it was never the newest) and then removes it; a crash mid-deletion leaves
at most a ``.del`` folder, removed by the next prune.

**One interface, two layouts.** Every checkpoint has the same record, marker and
commit (:func:`resolve` picks the newest committed one, :func:`resume_step` says where
it resumes: every reader of the resume step, the launcher, the coordinator and
:func:`load`, asks it). How its tensors lie on disk is its :class:`Layout`, the back
end :func:`load` reads through: :class:`Dcp` or :class:`Parts`. A run with a default
process group saves one DCP checkpoint (:meth:`Dcp.save`, above). A recovering run
(:mod:`executor.ft.recovery`: raw per-generation groups, no default group) saves
**parts** instead, without collectives: after applying step ``N`` the first member of
every stage serialises the plan-independent keys of its blocks (and ``step``) with
``torch.save`` (:meth:`Parts.part_bytes`) and sends them to the coordinator through the
run's store (``ckpt/<N>/<rank>``; its data-parallel peers, whose copies are identical,
send an empty value), so no worker needs the checkpoint folder; once every rank of the
generation reported, the coordinator writes each part to
``.step-<N>.tmp/parts/<device>.pt`` (:meth:`Parts.write`: via a temporary name and
``os.replace``, so a part on disk is whole), the record (with ``"parts"``: the devices
whose parts count) and the marker, and renames, as above (:meth:`Parts.commit`).
:func:`load` takes either layout under any plan: from parts, each block's keys come
from whichever listed part holds them, tensor bytes copied.

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
from abc import ABC, abstractmethod
from dataclasses import dataclass
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
           optimizer_name: str, fresh: bool
           ) -> tuple[dict[str, Any], list[tuple[nn.Parameter, dict[str, torch.Tensor]]]]:
    """The plan-independent tensors of a rank (module docstring, "Keys"); with ``fresh``
    the optimizer entries are new zero tensors to load into (returned with the parameter
    they belong to)."""
    keys = _block_keys(module, first)
    state: dict[str, Any] = {}
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


def _saved(module: nn.Sequential, optimizer: torch.optim.Optimizer, first: int,
           optimizer_name: str, step: int) -> dict[str, Any]:
    """What a rank saves after ``step`` completed steps: ``step`` and its tensors."""
    return {"step": step, **_state(module, optimizer, first, optimizer_name, False)[0]}


def _dcp() -> ModuleType:
    """``torch.distributed.checkpoint``, imported on first use: it pulls in DTensor and
    sympy (about a third of a worker's import time), which only the DCP layout needs, so
    a worker that never saves or loads one (every recovering run's) does not pay it."""
    import torch.distributed.checkpoint as dcp

    return dcp


def _directories(root: str | Path, step: int) -> tuple[Path, Path]:
    """The committed directory of ``step`` under ``root`` and the ``.tmp`` one it is built
    in (module docstring, "Atomic")."""
    root = Path(root)
    return root / f"step-{step:08d}", root / f".step-{step:08d}.tmp"


def _commit(tmp: Path, final: Path, record: dict[str, Any], keep: int) -> None:
    """Write ``record`` and the marker (synced to disk) into the complete ``tmp``, then
    rename it to ``final``, replacing an older one: the checkpoint counts from the rename;
    then :func:`prune` to the newest ``keep``. Both layouts commit through here."""
    (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    with open(tmp / MARKER, "w") as f:
        f.write(f"{record['step']}\n")
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    prune(final.parent, keep, final)


def _committed(root: Path) -> list[Path]:
    """The committed ``step-*`` checkpoints in ``root``, oldest first (the zero-padded
    step sorts by name)."""
    return sorted(d for d in root.glob("step-*") if (d / MARKER).is_file())


def prune(root: str | Path, keep: int, spare: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` (>= 1) committed checkpoints in ``root`` (module
    docstring, "Retention"), never ``spare`` (the one just committed, older than some
    left by an earlier run in the same folder), and what an interrupted prune left;
    returns the deleted ones. Each goes by a ``rename`` to ``.step-<N>.del`` first, so
    none is half-deleted under its committed name. O(checkpoints + the deleted files)."""
    if keep < 1:
        raise InputError("--keep-checkpoints", "", f"must be at least 1, got {keep}")
    root = Path(root)
    old = [c for c in _committed(root)[:-keep] if c != spare]
    for ckpt in old:
        ckpt.rename(root / f".{ckpt.name}.del")
    for gone in root.glob(".step-*.del"):
        shutil.rmtree(gone, ignore_errors=True)
    return old


def folder(checkpoint_dir: str | None, out: str | None) -> Path:
    """Where a run's checkpoints go: ``checkpoint_dir``, else ``<out>/checkpoints``."""
    return Path(checkpoint_dir or Path(out or ".") / "checkpoints")


class Layout(ABC):
    """How a committed checkpoint's tensors lie on disk: a back end of :func:`load`
    (module docstring, "One interface, two layouts")."""

    @abstractmethod
    def read(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Fill ``state`` (plan-independent key -> tensor to copy into, or value) in place
        from the committed checkpoint ``ckpt``."""

    @staticmethod
    def of(ckpt: Path, group: dist.ProcessGroup | None) -> Layout:
        """The layout ``ckpt`` was written in (a ``parts`` folder: :class:`Parts`); a DCP
        one is read collectively over ``group`` (None: without collectives)."""
        return Parts() if (ckpt / PARTS).is_dir() else Dcp(group)


@dataclass(frozen=True)
class Dcp(Layout):
    """The DCP layout (module docstring, "Keys are plan-independent"): one folder written
    by ``torch.distributed.checkpoint``, collectively over ``group`` (every rank of a
    run with a default process group; None reads it without collectives)."""

    group: dist.ProcessGroup | None

    def save(self, root: str | Path, step: int, module: nn.Sequential,
             optimizer: torch.optim.Optimizer, first: int, plan: Plan, rank: int,
             keep: int) -> Path:
        """Collective: save the run after ``step`` completed steps to ``root/step-<step>``
        (module docstring, "Atomic"), keeping the newest ``keep`` ("Retention"); every
        rank of the run calls it. Returns the directory."""
        assert self.group is not None, "a DCP save is collective"
        final, tmp = _directories(root, step)
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier(group=self.group)
        state = _saved(module, optimizer, first, plan.problem.config.optimizer, step)
        dcp = _dcp()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp)), process_group=self.group)
        dist.barrier(group=self.group)
        if rank == 0:
            _commit(tmp, final, {**training_record(plan), "step": step, "plan": plan.id}, keep)
        dist.barrier(group=self.group)
        return final

    def read(self, ckpt: Path, state: dict[str, Any]) -> None:
        dcp = _dcp()
        reader = dcp.FileSystemReader(str(ckpt))
        if self.group is None:
            dcp.load(state, storage_reader=reader, no_dist=True)
        else:
            dcp.load(state, storage_reader=reader, process_group=self.group)


class Parts(Layout):
    """The parts layout (module docstring, "One interface, two layouts"): one
    ``torch.save`` file per stage, written and committed by the coordinator, no
    collectives."""

    @staticmethod
    def part_bytes(step: int, module: nn.Sequential, optimizer: torch.optim.Optimizer,
                   first: int, optimizer_name: str) -> bytes:
        """This rank's part of the checkpoint of ``step``, serialised with ``torch.save``
        (it travels to the coordinator through the store; :meth:`write` puts it on disk
        there). O(the rank's state)."""
        state = _saved(module, optimizer, first, optimizer_name, step)
        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                    for k, v in state.items()}, buffer)
        return buffer.getvalue()

    @staticmethod
    def write(root: str | Path, step: int, device: str, part: bytes) -> Path:
        """Write ``device``'s part (:meth:`part_bytes`) of the checkpoint of ``step`` to
        ``root/.step-<step>.tmp/parts/<device>.pt`` via a temporary name and
        ``os.replace`` (a part on disk is whole); returns it. The checkpoint counts only
        once :meth:`commit` names the part."""
        parts = _directories(root, step)[1] / PARTS
        parts.mkdir(parents=True, exist_ok=True)
        path, tmp = parts / f"{device}.pt", parts / f".{device}.pt.tmp"
        with open(tmp, "wb") as f:
            f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    @staticmethod
    def commit(root: str | Path, step: int, plan: Plan, devices: list[str], keep: int) -> Path:
        """Commit the checkpoint of ``step`` whose parts ``devices`` wrote (every rank of a
        generation of ``plan``, so every block): record, marker, rename, then keep the
        newest ``keep`` (module docstring, "Retention"). Returns it."""
        final, tmp = _directories(root, step)
        missing = [d for d in devices if not (tmp / PARTS / f"{d}.pt").is_file()]
        if missing:
            raise InputError(str(tmp), "", f"no checkpoint part of device(s) {missing}")
        _commit(tmp, final, {**training_record(plan), "step": step, "plan": plan.id,
                             PARTS: sorted(set(devices))}, keep)
        return final

    def read(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Each key from the first part the record lists that holds it. Raises
        :class:`InputError` for a key none holds. O(parts x keys)."""
        wanted = set(state)
        with torch.no_grad():
            for device in _record(ckpt)[PARTS]:
                part = torch.load(ckpt / PARTS / f"{device}.pt", map_location="cpu",
                                  weights_only=True)
                for key in [k for k in wanted if k in part]:
                    if isinstance(state[key], torch.Tensor):
                        state[key].copy_(part[key])
                    else:
                        state[key] = part[key]
                    wanted.discard(key)
        if wanted:
            raise InputError(str(ckpt), "", f"no part of this checkpoint holds "
                             f"{sorted(wanted)[:3]} ({len(wanted)} key(s)); it is not of "
                             "this model")


def resolve(path: str | Path) -> Path:
    """The checkpoint to resume from: ``path`` itself when it is a committed checkpoint,
    else the committed ``step-*`` with the most steps in ``path`` or ``path/checkpoints``.
    Raises :class:`InputError` when there is none."""
    p = Path(path)
    if (p / MARKER).is_file():
        return p
    for folder in (p, p / "checkpoints"):
        done = _committed(folder)
        if done:
            return done[-1]
    raise InputError(str(p), "", "no committed checkpoint here (a step-N directory with a "
                     f"{MARKER} marker); give --resume a checkpoint or a run's checkpoints")


def _record(ckpt: Path) -> dict[str, Any]:
    """The record of the committed checkpoint ``ckpt``; :class:`InputError` when it
    cannot be read."""
    try:
        record: dict[str, Any] = json.loads((ckpt / RECORD).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(str(ckpt / RECORD), "", f"unreadable checkpoint record ({exc})") from None
    return record


def resume_step(path: str | Path) -> int:
    """The step a run resumed from ``path`` starts at: the completed steps (the record's
    ``step``) of the checkpoint :func:`resolve` picks. The one reader of the resume step:
    the launcher, the coordinator and :func:`load` all ask it."""
    return int(_record(resolve(path))["step"])


def check_resume(plan: Plan, path: str | Path) -> Path:
    """:func:`resolve` ``path`` and refuse a checkpoint trained otherwise than ``plan``
    trains (model, blocks, global batch, optimizer and settings, data seed)."""
    ckpt = resolve(path)
    record = _record(ckpt)
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
    (:func:`check_resume`; either layout, :meth:`Layout.of`) into ``module`` and
    ``optimizer`` in place; returns :func:`resume_step`. Collective over ``group`` for a
    DCP checkpoint; ``group=None`` (a recovering run) reads it without collectives."""
    ckpt = check_resume(plan, path)
    state, slots = _state(module, optimizer, first, plan.problem.config.optimizer, True)
    Layout.of(ckpt, group).read(ckpt, state)
    for param, per_param in slots:
        if per_param:
            optimizer.state[param] = per_param
    return resume_step(ckpt)
