"""Intra-stage sample allocation: Asteroid's Algorithm 1 (reference/asteroid.md §4.1).

Splits the B samples of a micro-batch over the g devices of one stage group, for many
candidate stages (rows) at once, so the DP can price every layer range in one call.

Inputs:
    time(d, y): per row, device d's forward+backward time for the stage at y samples,
        non-decreasing in y (read from prefix tables, see :func:`allocate`).
    caps[r, d]: the most samples device d can take in row r without exceeding its memory
        (Eq. 3 solved for y); 0 for a device that cannot hold the stage at all.

Algorithm (per row):
    1. Memory-aware proportional balancing. Capacity v_d = 1 / time(d, B) (Eq. 9). Split
       the unallocated samples over devices with headroom in proportion to v_d (floor,
       then largest remainder), clip at caps, and repeat with the leftovers until all B
       are placed or no device has headroom (row infeasible). At most g rounds, since each
       round that leaves samples over fills at least one device to its cap.
    2. Straggler offloading. Repeatedly move one sample from the slowest device s (largest
       time T at its y) to the device f whose time after taking one more sample is
       smallest (with headroom), as long as that time is below T; stop when none is.
       The maximum never grows (s's time does not increase, f stays below T), and while
       it stays at T the samples held by devices at T strictly decrease, so the loop
       ends. At the end no device can take a sample and stay below T, which makes the
       split min-max optimal for non-decreasing time curves, flat stretches included:
       an optimum below T would give s fewer samples, so some f more, at time >= T.
       Rows are processed in lockstep.

Devices may end with 0 samples (they then sit idle). Ties break toward the lower device
index, so results are deterministic and independent of the other rows.

Complexity: O(g) rounds for step 1, O(rows x g) numpy work each; O(moves) rounds for step 2,
each O(rows still moving x g) comparisons and two table reads per moving row (the times
at y and y + 1 are kept per row and updated where a sample moved).
"""

from __future__ import annotations

import numpy as np


def _times(table: np.ndarray, first: np.ndarray, end: np.ndarray, y: np.ndarray) -> np.ndarray:
    """time(d, y) per row: ``table[d, end, y] - table[d, first, y]`` with y of shape (n, g)."""
    d = np.arange(table.shape[0])[None, :]
    return table[d, end[:, None], y] - table[d, first[:, None], y]


def _time(
    table: np.ndarray, d: np.ndarray, first: np.ndarray, end: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """time(d, y) of one device d per row (all arrays of shape (n,))."""
    return table[d, end, y] - table[d, first, y]


def allocate(
    table: np.ndarray, first: np.ndarray, end: np.ndarray, batch: int, caps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Allocate ``batch`` samples per row over the g devices of ``table``.

    Args:
        table: (g, blocks + 1, max_batch + 1) prefix sums of forward+backward ms per device
            (row i: blocks [0, i)), already scaled by each device's slowdown.
        first, end: (n,) block range [first, end) of each row.
        batch: micro-batch size B (<= max_batch).
        caps: (n, g) most samples per device by memory.

    Returns:
        ``(samples, ok)``: (n, g) integer samples per device and (n,) feasibility; rows
        that cannot place all B samples have ``ok`` False (their samples are partial).
    """
    n, g = caps.shape
    caps = np.clip(caps, 0, batch).astype(np.int64)
    full = _times(table, first, end, np.full((n, g), batch))
    speed = 1.0 / np.maximum(full, 1e-12)
    y = np.zeros((n, g), dtype=np.int64)
    for _ in range(g + 1):
        left = batch - y.sum(axis=1)
        room = caps > y
        todo = (left > 0) & room.any(axis=1)
        if not todo.any():
            break
        w = np.where(room, speed, 0.0)
        share = np.where(
            todo[:, None], left[:, None] * w / np.maximum(w.sum(1, keepdims=True), 1e-300), 0.0
        )
        base = np.floor(share).astype(np.int64)
        extra_count = np.where(todo, left - base.sum(axis=1), 0)
        order = np.argsort(-(share - base), axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(g)[None, :].repeat(n, axis=0), axis=1)
        add = base + (rank < extra_count[:, None])
        y = np.minimum(y + add, caps)
    ok = y.sum(axis=1) == batch

    # step 2 on the rows that placed every sample, each row's times at y and y + 1 kept
    # up to date: a move changes two devices of a row, so each round reads two times per
    # moving row from the table instead of all g at y and at y + 1
    active = np.flatnonzero(ok)
    big = np.inf
    ya, ca, fa, ea = y[active], caps[active], first[active], end[active]
    now = _times(table, fa, ea, ya)
    up = _times(table, fa, ea, np.minimum(ya + 1, batch))
    for _ in range((batch + 1) * batch * g + 1):  # bound from the termination argument
        if not len(active):
            break
        rows = np.arange(len(active))
        slow = np.argmax(np.where(ya > 0, now, -big), axis=1)
        offer = np.where(ya < ca, up, big)
        offer[rows, slow] = big
        fast = np.argmin(offer, axis=1)
        move = offer[rows, fast] < now[rows, slow]
        if not move.any():
            break
        active, slow, fast = active[move], slow[move], fast[move]
        ya, ca, fa, ea, now, up = (v[move] for v in (ya, ca, fa, ea, now, up))
        rows = np.arange(len(active))
        ya[rows, slow] -= 1
        ya[rows, fast] += 1
        y[active, slow] -= 1
        y[active, fast] += 1
        # the slow device's time at y + 1 is its old time at y; the fast one's time at y
        # its old time at y + 1
        up[rows, slow] = now[rows, slow]
        now[rows, fast] = up[rows, fast]
        now[rows, slow] = _time(table, slow, fa, ea, ya[rows, slow])
        up[rows, fast] = _time(table, fast, fa, ea, np.minimum(ya[rows, fast] + 1, batch))
    return y, ok
