"""Checkpoints of recovering runs (issue 8; executor/ft/checkpoint.py "Two layouts"): a
recovering run that loses a device still commits its checkpoints, a new run resumes
from them under another plan (recovering, or not) bit-identically to the
single-process reference; an unrecoverable loss leaves the last committed checkpoint
intact and loadable. Real processes over gloo, real signals, real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.ft import checkpoint
from edgepipe.executor.ft.recovery import RecoveryFailed

from tests.helpers.executor_helpers import make_test_plan, write_plan
from tests.helpers.recovery_runs import (
    GLOO_TIMEOUT_S,
    THREE_STAGES,
    assert_final_state_is_the_references,
    launch_reaped,
    one_device_plan,
    profile,
    reference,
)

OTHER = [(0, 4, [1, 1]), (4, 6, [2])]


def run(tmp_path: Path, name: str, stages, steps: int, faults: str = "",
        recover: bool | None = None, **kw):
    """Run a 2-micro-batch Adam plan of ``stages`` in ``tmp_path/name``; reap every child."""
    plan = make_test_plan(profile(), stages, 2, 2, optimizer="adam", learning_rate=0.01)
    path = write_plan(plan, tmp_path, f"{name}.json")
    return plan, launch_reaped(
        WorkerOptions(str(path), steps, str(tmp_path / name), deterministic=True,
                      timeout_s=GLOO_TIMEOUT_S, save_weights=True, faults=faults, **kw),
        recover=recover)


def kept_stores(monkeypatch) -> list[dist.TCPStore]:
    """Every ``TCPStore`` made in this process from now on (the launcher's own store),
    kept to be read after the run."""
    stores: list[dist.TCPStore] = []
    real = dist.TCPStore

    def kept(*args, **kwargs):
        stores.append(real(*args, **kwargs))
        return stores[-1]

    monkeypatch.setattr(dist, "TCPStore", kept)
    return stores


def ckpt_keys_left(store: dist.TCPStore, generations, steps: int, ranks: int) -> list[str]:
    """The checkpoint parts' keys (count key, first chunk) still in ``store``."""
    return [key for g in generations for n in range(1, steps + 1) for r in range(ranks)
            for key in (f"gen{g}/ckpt/{n}/{r}", f"gen{g}/ckpt/{n}/{r}/0")
            if store.check([key])]


@pytest.mark.slow
def test_a_recovering_run_checkpoints_through_a_loss_and_resumes_under_other_plans(
    tmp_path,
):
    # d1 dies in step 1's forward: generation 2 replays step 1 and commits step-2
    plan, first = run(tmp_path, "a", THREE_STAGES, 2, "d1:1:forward", checkpoint_every=2)
    assert len(first.events) == 1
    saved = tmp_path / "a" / "checkpoints" / "step-00000002"
    assert (saved / checkpoint.MARKER).is_file()
    assert (saved / checkpoint.PARTS).is_dir()
    assert not list((tmp_path / "a" / "checkpoints").glob(".*.tmp"))
    want = reference(plan, 4)
    # a recovering run resumes it under another plan ...
    _, second = run(tmp_path, "b", OTHER, 4, resume=str(tmp_path / "a"))
    assert [m["step"] for m in second.metrics] == [2, 3]
    assert first.losses + second.losses == want.losses
    assert [m["samples"] for m in second.metrics] == want.sample_ids[2:]
    assert_final_state_is_the_references(tmp_path / "b", want)
    # ... and so does a run without recovery (one stage, the default process group)
    _, third = run(tmp_path, "c", [(0, 6, [2])], 4, recover=False,
                   resume=str(tmp_path / "a"))
    assert first.losses + third.losses == want.losses
    assert_final_state_is_the_references(tmp_path / "c", want)


@pytest.mark.slow
def test_an_unrecoverable_loss_leaves_the_last_checkpoint_intact_and_loadable(tmp_path):
    # d1 runs stage 1 alone, its replica lives on d2: both lost after step 0's checkpoint
    with pytest.raises(RecoveryFailed, match="cannot recover"):
        run(tmp_path, "a", THREE_STAGES, 4, "d1:1:optimizer,d2:1:optimizer",
            checkpoint_every=1)
    folder = tmp_path / "a" / "checkpoints"
    assert checkpoint.resolve(tmp_path / "a") == folder / "step-00000001"
    assert [d.name for d in folder.glob("step-*")] == ["step-00000001"]
    plan, resumed = run(tmp_path, "b", OTHER, 3, resume=str(tmp_path / "a"))
    want = reference(plan, 3)
    assert [m["step"] for m in resumed.metrics] == [1, 2]
    assert resumed.losses == want.losses[1:]
    assert_final_state_is_the_references(tmp_path / "b", want)


@pytest.mark.slow
def test_a_replay_past_committed_checkpoints_sends_none_of_their_parts_again(
    tmp_path, monkeypatch,
):
    # d0 runs the toy model alone, its replica on the standby d1, replicated only at the
    # start and after the last step (interval 100 > 4 steps); d0 sends its parts of
    # checkpoints 1, 2 and 3, which the coordinator commits, then dies in step 3's
    # forward: d1 replays steps 0 .. 3 from point 0, past those three checkpoints
    stores = kept_stores(monkeypatch)
    plan = one_device_plan(2, replication_interval=100)
    result = launch_reaped(
        WorkerOptions(str(write_plan(plan, tmp_path)), 4, str(tmp_path), deterministic=True,
                      timeout_s=GLOO_TIMEOUT_S, save_weights=True, faults="d0:3:forward",
                      checkpoint_every=1, keep_checkpoints=4))  # keep all: the commits count
    (event,) = result.events
    assert (event["device"], event["replay_from_step"]) == ("d0", 0)
    folder = tmp_path / "checkpoints"
    assert sorted(d.name for d in folder.glob("step-*")) == [
        f"step-0000000{n}" for n in (1, 2, 3, 4)]
    assert all((folder / f"step-0000000{n}" / checkpoint.MARKER).is_file() for n in (1, 2, 3, 4))
    # no part of any checkpoint is left in either generation's store, neither its count
    # key nor its first chunk (one rank votes in each: d0, then d1)
    (store,) = stores
    assert ckpt_keys_left(store, (event["generation"] - 1, event["generation"]), 4, 1) == []
    assert result.losses == reference(plan, 4).losses


def test_a_checkpoint_cut_short_by_a_loss_leaves_no_part_of_the_dead_generation(
    tmp_path, monkeypatch,
):
    # d2 dies before its optimizer step of step 1: the other ranks have applied it and
    # sent their parts of checkpoint 2, d2 never will, so the generation cannot commit
    # it; the next generation replays step 1 and sends checkpoint 2 afresh (review 8 F1)
    stores = kept_stores(monkeypatch)
    plan, result = run(tmp_path, "cut", THREE_STAGES, 3, faults="d2:1:optimizer",
                       checkpoint_every=1, keep_checkpoints=3)  # keep all: the commits count
    (event,) = result.events
    folder = tmp_path / "cut" / "checkpoints"
    assert sorted(d.name for d in folder.glob("step-*")) == [
        f"step-0000000{n}" for n in (1, 2, 3)]
    (store,) = stores
    assert ckpt_keys_left(store, (event["generation"] - 1, event["generation"]), 3, 4) == []
    assert result.losses == reference(plan, 3).losses
