"""The pieces of recovery that need no processes: block states (weights + optimizer
state) survive a copy, a byte transfer and an install into another plan's stage bit for
bit; the copies a rank keeps for rollback follow the durability rule and refuse a dead
generation; replication points and fault specs are what the docs say.
"""

from __future__ import annotations

import pytest
import torch
from edgepipe.executor.ft.faults import Fault, parse
from edgepipe.executor.ft.replication import (
    Buffers,
    Copies,
    Snapshot,
    StaleGeneration,
    flatten,
    install,
    unflatten,
)
from edgepipe.planner.cost.formulas import replication_points
from edgepipe.planner.errors import InputError
from torch import nn


def blocks(seed: int) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(3, 4), nn.Tanh()), nn.Linear(4, 4), nn.Linear(4, 2)]


def capture(module: nn.Sequential, first: int, opt: torch.optim.Optimizer, step: int):
    """The states of ``module``'s blocks after ``step`` steps, as a replication point
    takes them (in fresh buffers)."""
    return Snapshot.take(module, first, opt, step, Buffers()).complete()


def trained(module: nn.Sequential, steps: int = 2) -> torch.optim.Optimizer:
    opt = torch.optim.Adam(module.parameters(), lr=0.1, foreach=False)
    for k in range(steps):
        opt.zero_grad()
        module(torch.full((1, 3), float(k + 1))).pow(2).sum().backward()
        opt.step()
    return opt


def test_states_captured_packed_and_installed_into_a_different_split_continue_identically():
    whole = nn.Sequential(*blocks(0))
    opt = trained(whole)
    states = unflatten(*flatten(capture(whole, 0, opt, step=2)))
    assert sorted(states) == [0, 1, 2] and {s.step for s in states.values()} == {2}
    # blocks 1..2 as their own stage (another plan's cut), from different initial weights
    stage = nn.Sequential(*blocks(99)[1:])
    fresh = torch.optim.Adam(stage.parameters(), lr=0.1, foreach=False)
    install(stage, 1, fresh, states)
    for a, b in zip(list(whole.parameters())[2:], stage.parameters(), strict=True):
        assert torch.equal(a, b)
        assert opt.state[a].keys() == fresh.state[b].keys()
        for key in opt.state[a]:
            assert torch.equal(opt.state[a][key], fresh.state[b][key])
    # one more identical step on both: still bit-identical (nothing shared, nothing lost)
    x = torch.full((1, 4), 0.5)
    for module, o, inp in ((whole[1:], opt, x), (stage, fresh, x)):
        o.zero_grad()
        module(inp).pow(2).sum().backward()
        o.step()
    for a, b in zip(list(whole.parameters())[2:], stage.parameters(), strict=True):
        assert torch.equal(a, b)
    # the copy was not modified by the install or the steps after it
    assert states[1].step == 2 and not torch.equal(states[1].weights["weight"], stage[0].weight)


def test_plain_sgd_has_no_optimizer_state_and_installs_none():
    whole = nn.Sequential(*blocks(1))
    opt = torch.optim.SGD(whole.parameters(), lr=0.1, foreach=False)
    opt.step()
    states = capture(whole, 0, opt, 1)
    assert all(s.optim == {} for s in states.values())
    other = nn.Sequential(*blocks(2))
    fresh = torch.optim.SGD(other.parameters(), lr=0.1, foreach=False)
    install(other, 0, fresh, states)
    assert fresh.state_dict()["state"] == {}


def test_copies_keep_the_durable_step_until_the_next_is_promoted_and_refuse_a_dead_generation():
    dead: set[int] = set()
    copies = Copies(lambda g: g not in dead)
    whole = nn.Sequential(*blocks(0))
    opt = trained(whole, 1)
    copies.add(1, capture(whole, 0, opt, 1))
    copies.promote(1, 1)
    trained(whole, 1)
    copies.add(1, capture(whole, 0, opt, 2))  # replication point 2 in progress
    assert sorted(copies.at(1)) == [0, 1, 2] and sorted(copies.at(2)) == [0, 1, 2]
    assert copies.at(3) == {}
    dead.add(1)
    with pytest.raises(StaleGeneration):
        copies.add(1, capture(whole, 0, opt, 3))
    with pytest.raises(StaleGeneration):
        copies.promote(1, 2)
    # the next generation restores from step 1 and adds to it (same step: merged)
    copies.add(2, {9: copies.at(1)[0]})
    assert sorted(copies.at(1)) == [0, 1, 2, 9]


def test_replication_points_are_the_start_every_interval_and_the_last_step():
    assert replication_points(0, 4, 1) == [0, 1, 2, 3, 4]
    assert replication_points(3, 10, 4) == [3, 4, 8, 10]
    assert replication_points(2, 8, 0) == [2, 8]


def test_fault_specs_parse_and_a_bad_one_is_refused_naming_it():
    assert parse("d1:2:forward,d3:*:restore:STOP") == (
        Fault("d1", 2, "forward", "KILL"), Fault("d3", None, "restore", "STOP"))
    with pytest.raises(InputError, match="d1:2:sideways"):
        parse("d1:2:sideways")
