"""Receives posted ahead of their action (executor/core/receives.py) over real gloo: a
sender's message moves before its receiver reaches the receive's action.

gloo sends a point-to-point message only once its receiver posted the receive. Here the
last stage of a 2-stage, 2-micro-batch pipeline (warm-up 1) waits at RECV_F0, and the
first stage sends micro-batch 1's activations first and waits for that send to complete
before it sends micro-batch 0. Posted one ahead (the stage's warm-up, the runtime's
default), RECV_F1 is posted when RECV_F0's wait begins, so the send completes and both
arrive; posted at the action (``ahead = 0``) the two ranks wait for each other until
gloo's time-out.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from edgepipe.executor.core.comm import StageLinks, Transport
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.receives import StepReceives, warmup
from edgepipe.executor.core.starting import process, worker_context
from edgepipe.planner.schedule import ActionType, one_f_one_b

TIMEOUT_S = 3.0
#: d0 (stage 0) and d1 (stage 1), 2 samples each, 2 micro-batches of 2
LAYOUT = RankLayout((RankInfo(0, "d0", 0, 0, 0, 2), RankInfo(1, "d1", 1, 0, 0, 2)),
                    ((0,), (1,)), 2, 2)


def _rank(rank: int, store_path: str, out: Any, ahead: int | None) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank,
                            world_size=2, timeout=timedelta(seconds=TIMEOUT_S))
    shape, dtype = {0: (8,), 1: (3,)}, {0: torch.float32, 1: torch.float32}
    links = StageLinks(LAYOUT, rank, Transport(), shape, dtype, torch.device("cpu"))
    try:
        if rank == 0:
            links.send_activations(1, torch.full((2, 8), 1.0))
            links.wait_sends()  # completes only once rank 1 posted RECV_F1
            links.send_activations(0, torch.full((2, 8), 0.0))
            links.wait_sends()
            out.put((rank, "sent"))
        else:
            actions = one_f_one_b([2, 1], 2)[1]
            receives = StepReceives(links, actions,
                                    warmup(actions) if ahead is None else ahead)
            got = [receives.take(ActionType.RECV_F, m) for m in (0, 1)]
            out.put((rank, [float(g.sum()) for g in got]))
    except RuntimeError as exc:
        out.put((rank, f"failed: {exc}"))


def exchange(folder: Path, ahead: int | None) -> dict[int, Any]:
    """What each rank put: rank 0 ``"sent"``, rank 1 the sums of its two receives (or
    a rank's ``"failed: ..."``). The ranks fork from the executor's preloaded forkserver
    (executor/core/starting.py), as its workers do: spawned, each imported torch again."""
    ctx = worker_context()
    out = ctx.Queue()
    procs = [process(ctx, _rank, (r, str(folder / "store"), out, ahead), f"rank{r}")
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join()
    return got


def test_a_send_completes_before_its_receiver_reaches_the_receive(tmp_path: Path) -> None:
    got = exchange(tmp_path, None)
    # micro-batch 0's rows are zeros, micro-batch 1's ones: 2 x 8 of them
    assert got == {0: "sent", 1: [0.0, 16.0]}
