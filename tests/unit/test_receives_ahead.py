"""Receives posted ahead of their actions (executor/core/receives.py): which receive is
posted when, worked out by hand from the 1F1B action list."""

from __future__ import annotations

import pytest
import torch
from edgepipe.executor.core.comm import StageLinks, Transport
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.receives import StepReceives, warmup
from edgepipe.planner.schedule import ActionType, gpipe, one_f_one_b

F, B = ActionType.RECV_F, ActionType.RECV_B


class _Done:
    def __init__(self, log: list[tuple[str, int, int]], src: int, tag: int) -> None:
        self.log, self.src, self.tag = log, src, tag

    def wait(self) -> None:
        self.log.append(("wait", self.src, self.tag))


class Recording(Transport):
    """A transport whose receives are in at once, logging each post and wait."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int, int]] = []

    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> _Done:
        self.log.append(("post", src, tag))
        return _Done(self.log, src, tag)


def middle_rank(micro_batches: int) -> tuple[StageLinks, Recording]:
    """Rank 1 of three one-device stages (activations from rank 0, gradients from 2)."""
    layout = RankLayout(tuple(RankInfo(r, f"d{r}", r, 0, 0, 1) for r in range(3)),
                        ((0,), (1,), (2,)), 1, micro_batches)
    transport = Recording()
    shape = {0: (8,), 1: (8,), 2: (3,)}
    dtype = dict.fromkeys(shape, torch.float32)
    links = StageLinks(layout, 1, transport, shape, dtype, torch.device("cpu"))
    return links, transport


# stage 1 of warm-ups [3, 2, 1], M = 4: F0 F1 B0 F2 B1 F3 B2 B3, so its receives come
# RECV_F0 RECV_F1 RECV_B0 RECV_F2 RECV_B1 RECV_F3 RECV_B2 RECV_B3; tags 2m (activations,
# from rank 0) and 2m + 1 (gradients, from rank 2)
TAKES = [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (B, 3)]


def take_all(ahead: int) -> list[tuple[str, int, int]]:
    links, transport = middle_rank(4)
    actions = one_f_one_b([3, 2, 1], 4)[1]
    assert [(a.type, a.micro_batch) for a in actions if a.type in (F, B)] == TAKES
    receives = StepReceives(links, actions, ahead)
    for kind, m in TAKES:
        receives.take(kind, m)
    return transport.log


def test_two_ahead_keeps_two_of_each_direction_posted_before_their_action() -> None:
    assert take_all(2) == [
        ("post", 0, 0), ("post", 0, 2), ("post", 2, 1), ("post", 2, 3),  # step start
        ("post", 0, 4), ("wait", 0, 0),  # RECV_F0: F2's posted, then F0 waited for
        ("post", 0, 6), ("wait", 0, 2),  # RECV_F1
        ("post", 2, 5), ("wait", 2, 1),  # RECV_B0
        ("wait", 0, 4),  # RECV_F2: no forward left to post
        ("post", 2, 7), ("wait", 2, 3),  # RECV_B1
        ("wait", 0, 6), ("wait", 2, 5), ("wait", 2, 7),
    ]


def test_none_ahead_posts_each_receive_at_its_action() -> None:
    want = []
    for kind, m in TAKES:
        src, tag = (0, 2 * m) if kind is F else (2, 2 * m + 1)
        want += [("post", src, tag), ("wait", src, tag)]
    assert take_all(0) == want


def test_the_default_ahead_is_the_stages_warmup() -> None:
    assert [warmup(stage) for stage in one_f_one_b([3, 2, 1], 4)] == [3, 2, 1]
    assert [warmup(stage) for stage in one_f_one_b([7, 5], 4)] == [4, 4]  # clamped to M
    assert [warmup(stage) for stage in gpipe(2, 5)] == [5, 5]


def test_a_receive_taken_out_of_order_is_refused() -> None:
    links, _ = middle_rank(4)
    receives = StepReceives(links, one_f_one_b([3, 2, 1], 4)[1], 0)
    with pytest.raises(RuntimeError, match="RECV_F 1 is out of"):
        receives.take(F, 1)
    with pytest.raises(ValueError, match="must be >= 0"):
        StepReceives(links, (), -1)
