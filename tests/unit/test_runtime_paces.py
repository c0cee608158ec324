"""Specification of the runtime's pacing hook (executor/core/runtime.py,
:func:`pace_every_action`): a lab device's pacer is called once at the end of every
timed interval of a step, each action's, the wait for the sends' and the optimizer's."""

from __future__ import annotations

import torch
from edgepipe.executor.core.comm import StageLinks, Transport
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.runtime import StageRuntime, pace_every_action
from edgepipe.planner.schedule import one_f_one_b
from torch import nn


def test_the_pacer_is_called_once_per_recorded_interval() -> None:
    # one stage on one rank, 2 micro-batches of 2 rows: 1F1B gives F0 B0 F1 B1 and the
    # stage's REDUCE_GRAD (a group of one: no ring, no sends nor receives), then the
    # step's SEND_WAIT and OPTIM: 7 intervals, 7 pace calls
    layout = RankLayout((RankInfo(0, "d0", 0, 0, 0, 2),), ((0,),), 2, 2)
    links = StageLinks(layout, 0, Transport(), {0: (3,)}, {0: torch.float32},
                       torch.device("cpu"))
    module = nn.Sequential(nn.Linear(3, 2))
    runtime = StageRuntime(
        module, layout, 0, one_f_one_b([1], 2)[0], links, None,
        lambda out, target: nn.functional.cross_entropy(out, target),
        torch.optim.SGD(module.parameters(), lr=0.1), deterministic=False)
    calls: list[int] = []
    pace_every_action(lambda: calls.append(len(calls)))
    try:
        record = runtime.compute(0, [torch.ones(2, 3)] * 2,
                                 [torch.zeros(2, dtype=torch.long)] * 2)
        runtime.apply(record)
    finally:
        pace_every_action(None)
    assert [i.kind for i in record.intervals] == [
        "F", "B", "F", "B", "REDUCE_GRAD", "SEND_WAIT", "OPTIM"]
    assert len(calls) == 7
