"""Specification of the runtime's gradients in fast mode (executor/core/runtime.py,
``StageRuntime._clear_grads``): every ``.grad`` is a view of one flat buffer made at the
first step and zeroed in place at each step's start, so a step's gradients are that
step's alone and no step allocates new ones."""

from __future__ import annotations

import torch
from edgepipe.executor.core.comm import StageLinks, Transport
from edgepipe.executor.core.layout import RankInfo, RankLayout
from edgepipe.executor.core.runtime import StageRuntime
from edgepipe.planner.schedule import one_f_one_b
from torch import nn

ROWS = torch.tensor([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
LABELS = torch.tensor([1, 0])


def _runtime(module: nn.Sequential) -> StageRuntime:
    # one stage on one rank, 2 micro-batches of 2 rows (global batch 4)
    layout = RankLayout((RankInfo(0, "d0", 0, 0, 0, 2),), ((0,),), 2, 2)
    links = StageLinks(layout, 0, Transport(), {0: (3,)}, {0: torch.float32},
                       torch.device("cpu"))
    return StageRuntime(
        module, layout, 0, one_f_one_b([1], 2)[0], links, None,
        lambda out, target: nn.functional.cross_entropy(out, target),
        torch.optim.SGD(module.parameters(), lr=0.5), deterministic=False)


def _reference_grads(module: nn.Sequential) -> list[torch.Tensor]:
    """The global batch's mean loss gradient, by plain autograd on a copy (no runtime)."""
    copy = nn.Sequential(nn.Linear(3, 2))
    copy.load_state_dict(module.state_dict())
    loss = nn.functional.cross_entropy(copy(torch.cat([ROWS, ROWS])), torch.cat([LABELS, LABELS]))
    return list(torch.autograd.grad(loss, list(copy.parameters())))


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_each_step_has_its_own_gradients_in_one_buffer_it_never_reallocates() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 2))
    runtime = _runtime(module)
    storages = []
    for step in range(3):
        expected = _reference_grads(module)
        record = runtime.compute(step, [ROWS, ROWS], [LABELS, LABELS])
        got = [p.grad for p in module.parameters()]
        for g, e in zip(got, expected, strict=True):
            assert g is not None
            torch.testing.assert_close(g, e, rtol=0, atol=1e-6)
        assert len(runtime.flat_grads) == 1
        storages.append({_storage(g) for g in got if g is not None}
                        | {_storage(runtime.flat_grads[0])})
        runtime.apply(record)  # moves the parameters: the next step's gradients differ
    assert storages[0] == storages[1] == storages[2]
    assert len(storages[0]) == 1


class _Scaled(nn.Module):
    """A float64 scale after a float32 layer: parameters of two dtypes in one stage."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.tensor(2.0, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s.float()


def test_parameters_of_two_dtypes_get_a_buffer_each() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 2), _Scaled())
    runtime = _runtime(module)
    runtime.compute(0, [ROWS, ROWS], [LABELS, LABELS])
    assert [f.dtype for f in runtime.flat_grads] == [torch.float32, torch.float64]
    copy = nn.Sequential(nn.Linear(3, 2), _Scaled())
    copy.load_state_dict(module.state_dict())
    loss = nn.functional.cross_entropy(copy(torch.cat([ROWS, ROWS])), torch.cat([LABELS, LABELS]))
    for p, e in zip(module.parameters(), torch.autograd.grad(loss, list(copy.parameters())),
                    strict=True):
        assert p.grad is not None and p.grad.dtype == p.dtype
        torch.testing.assert_close(p.grad, e, rtol=0, atol=1e-6)
