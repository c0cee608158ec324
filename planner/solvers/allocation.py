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

Without memory caps, for groups of identical devices whose times strictly grow with the
samples, :func:`allocate_classes` computes the same split per class with O(classes)
work per row and move (its docstring says why).

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


def allocate_classes(
    curves: np.ndarray, classes: np.ndarray, counts: np.ndarray, rows: np.ndarray, batch: int
) -> np.ndarray:
    """:func:`allocate` without memory caps for devices in classes of identical devices,
    O(classes) per row and move instead of O(devices).

    Args:
        curves: (C, R, batch + 1) time of one device of class c on block range r at y
            samples, *strictly* increasing in y on the rows used (the precondition; see
            below).
        classes, counts: (K,) the classes of the group and their devices; the device
            slots are class by class, as :func:`allocate`'s are.
        rows: (n,) the block ranges to split.
        batch: micro-batch size B.

    Returns:
        (n, sum(counts)) samples per slot: per class the same multiset as
        :func:`allocate` with every cap at B gives (always feasible), written with the
        first r devices of a class at v + 1 and the others at v (allocate may order a
        class's devices otherwise).

    Why a class is two values v, v + 1: step 1's one round (no cap binds) gives each
    device of a class the same share, its floor plus one of the extras, which go in
    order of the fractional parts, ties to the lower slot, so the classes in order of
    (fraction descending, class) and each class's first devices. Step 2 moves a sample
    off a device of largest time (ties: lowest slot, so the class of lowest index among
    those whose top device, at v + (r > 0), has that time; with strict curves every
    device of a class at its top has the same time and which one gives the sample does
    not change the multiset) to a device of least time at one more sample (ties: lowest
    class; in a class a device at v). Strict curves make the giving and the taking
    class differ (a class's own offer t(v + 1) is never below its top's time, so where
    it is the least offer nothing moves, as in allocate, which skips the giving device's
    own offer: then no other is below that time either), so a class keeps two values.
    With flat stretches allocate's tie to the lowest slot can take a sample from a
    device below the class's top, which this cannot follow: hence the precondition.
    Same moves as allocate, so the same number of rounds: O(rounds x rows x K) work."""
    flat = curves.reshape(-1)
    width = curves.shape[2]
    # flat index of (class, row, y = 0) per row and class of the group
    origin = (classes[None, :] * curves.shape[1] + rows[:, None]) * width
    # step 1: the shares' denominator summed over the devices, as allocate sums it
    speed = 1.0 / np.maximum(flat[origin + batch], 1e-12)  # (n, K)
    total = np.repeat(speed, counts, axis=1).sum(axis=1, keepdims=True)
    share = batch * speed / np.maximum(total, 1e-300)
    base = np.floor(share).astype(np.int64)
    extra = batch - base @ counts
    order = np.argsort(-(share - base), axis=1, kind="stable")
    ahead = np.cumsum(counts[order], axis=1) - counts[order]  # devices before, in order
    before = np.empty_like(ahead)
    np.put_along_axis(before, order, ahead, axis=1)
    r = np.clip(extra[:, None] - before, 0, counts[None, :])
    v = base + (r == counts)
    r = np.where(r == counts, 0, r)
    # step 2 on the rows still moving (compact copies; a row's result is written back
    # when it stops)
    active = np.arange(len(rows))
    va, ra, oa = v, r, origin
    for _ in range((batch + 1) * batch * int(counts.sum()) + 1):  # allocate's bound
        if not len(active):
            break
        at = np.arange(len(active))
        top = va + (ra > 0)
        now = np.where(top > 0, flat[oa + top], -np.inf)
        slow = np.argmax(now, axis=1)
        offer = np.where(va < batch, flat[oa + np.minimum(va + 1, batch)], np.inf)
        fast = np.argmin(offer, axis=1)
        move = offer[at, fast] < now[at, slow]
        stop = ~move
        v[active[stop]], r[active[stop]] = va[stop], ra[stop]
        if not move.any():
            break
        active, slow, fast = active[move], slow[move], fast[move]
        va, ra, oa = va[move], ra[move], oa[move]
        at = np.arange(len(active))
        # the slow class gives from its top, the fast one takes at its bottom
        had = ra[at, slow] > 0
        ra[at, slow] = np.where(had, ra[at, slow] - 1, counts[slow] - 1)
        va[at, slow] -= (~had).astype(np.int64)
        ra[at, fast] += 1
        full = ra[at, fast] == counts[fast]
        va[at, fast] += full.astype(np.int64)
        ra[at, fast] = np.where(full, 0, ra[at, fast])
    v[active], r[active] = va, ra
    position = np.concatenate([np.arange(c) for c in counts])[None, :]
    return np.repeat(v, counts, axis=1) + (position < np.repeat(r, counts, axis=1))
