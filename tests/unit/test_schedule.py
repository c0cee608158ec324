"""The schedule generator, specified by hand-worked action lists."""

from __future__ import annotations

import pytest
from edgepipe.planner.schedule import (
    Action,
    ActionType,
    build,
    compute_actions,
    compute_order,
    from_csv,
    gpipe,
    one_f_one_b,
    to_csv,
)


def names(actions: tuple[Action, ...] | list[Action]) -> list[str]:
    return [str(a) for a in actions]


def test_compute_order_with_warmup_two_of_four() -> None:
    assert compute_order(4, 2) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)
    ]  # fmt: skip


def test_compute_order_clamps_warmup_to_micro_batches() -> None:
    assert compute_order(2, 5) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@pytest.mark.parametrize(("m", "w"), [(0, 1), (3, 0)])
def test_compute_order_refuses_empty_rounds_and_zero_warmup(m: int, w: int) -> None:
    with pytest.raises(ValueError):
        compute_order(m, w)


def test_two_stage_one_f_one_b_with_communication() -> None:
    first, last = one_f_one_b([2, 1], 3)
    assert names(first) == [
        "0F0", "0SEND_F0", "0F1", "0SEND_F1",
        "0RECV_B0", "0B0", "0F2", "0SEND_F2",
        "0RECV_B1", "0B1", "0RECV_B2", "0B2", "0REDUCE_GRAD",
    ]  # fmt: skip
    assert names(last) == [
        "1RECV_F0", "1F0", "1B0", "1SEND_B0",
        "1RECV_F1", "1F1", "1B1", "1SEND_B1",
        "1RECV_F2", "1F2", "1B2", "1SEND_B2", "1REDUCE_GRAD",
    ]  # fmt: skip


def test_middle_stage_receives_and_sends_both_ways() -> None:
    middle = one_f_one_b([3, 2, 1], 2)[1]
    assert names(middle) == [
        "1RECV_F0", "1F0", "1SEND_F0", "1RECV_F1", "1F1", "1SEND_F1",
        "1RECV_B0", "1B0", "1SEND_B0", "1RECV_B1", "1B1", "1SEND_B1", "1REDUCE_GRAD",
    ]  # fmt: skip


def test_single_stage_has_no_communication() -> None:
    (only,) = one_f_one_b([1], 2)
    assert names(only) == ["0F0", "0B0", "0F1", "0B1", "0REDUCE_GRAD"]


def test_gpipe_runs_all_forwards_then_all_backwards() -> None:
    for actions in gpipe(3, 3):
        kinds = [a.type for a in compute_actions(actions)]
        assert kinds == [ActionType.F] * 3 + [ActionType.B] * 3
    assert build("gpipe", [5, 3, 1], 3) == gpipe(3, 3)


def test_increasing_warmups_are_refused_as_a_deadlock() -> None:
    with pytest.raises(ValueError, match="deadlock at stages 0-1"):
        one_f_one_b([1, 2], 4)


def test_warmups_equal_after_clamping_are_allowed() -> None:
    assert one_f_one_b([7, 5], 3) == gpipe(2, 3)


def test_unknown_schedule_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown schedule 'zb'"):
        build("zb", [1], 1)  # type: ignore[arg-type]


def test_csv_round_trip_and_torch_style_names() -> None:
    schedule = one_f_one_b([3, 2, 1], 4)
    text = to_csv(schedule)
    assert text.splitlines()[2].startswith("2RECV_F0,2F0,2B0,2SEND_B0,")
    assert from_csv(text) == schedule


def test_csv_with_a_malformed_action_names_it() -> None:
    with pytest.raises(ValueError, match="line 1: '0X1' is not an action"):
        from_csv("0F0,0X1\n")
