"""The DP's cells hold fronts, not one number: a few entries per (state, blocks) cell, the
selection that keeps them, and their storage per level.

Inputs: the candidate entries of a cell (D, X'; the carried S, Y, ...: the recurrence of
:mod:`planner.solvers.dp.recurrence`).

A front holds ``FRONT`` entries (:func:`_pareto`): the least D + X', the least S, the least
X' (Pareto points in (D, X', S)), then the least D among the entries whose head group has
fewer samples per device (Y) than the first pick's, when no pick so far has (it prices its
link lower), else the next least D + X'. X' = max(X, H) with H a lower bound on the
backward traversal of the stages before the cell's suffix
(:func:`planner.solvers.dp.bounds.hidden_bound`): the suffix's X reaches the root as
X - PB <= X - H, and the root's X is at least its first stage's T_a >= 0, so X below H
never shows and entries equal in X' are equal at the root. Comparing X itself ranked a
suffix of wide stages (large all-reduces that the stages before it hide) below 1-device
ones and dropped it from fronts of 4: on 100 blocks x 64 identical devices the DP
returned 1777 ms where a 32 x 2-device pipeline runs in 1762 (with X': 1583). Y, N,
FREE, TAIL are carried, not compared, so the recurrence is a heuristic where a dropped
entry would have priced its link (Y) or fit a replica (FREE, TAIL) better; the
re-scoring by the exact makespan decides.

Complexity: O(FRONT x rows x candidates) per selection; a level's storage is O(S L
FRONT) floats for its values and small integers for its traceback (S states).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Pareto front entries kept per DP state
FRONT = 4

INF = np.inf


def _pareto(
    d: np.ndarray, x: np.ndarray, carry: np.ndarray, y: np.ndarray, keep: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, indices of ``keep`` candidates of the front, and whether each slot holds
    one (rows with fewer candidates alive are padded); ``x`` is the compared X' = max(X,
    H) of the module docstring. Picks in turn: least D + X; least
    S; least X; least D among the candidates whose Y is below the first pick's, when
    none of the picks so far has such a Y (else, or if there is none, least D + X);
    then least D + X again. S and X get a slot of their own because a later head adds
    the suffix's traversal S to its warm-up bubble and hides X behind its own backward
    time (:mod:`planner.solvers.dp.recurrence`): a suffix that ranks low by D + X can win
    after composition. The fourth slot keeps a suffix whose head group takes fewer
    samples per device (Y) in the front: it prices the link before it lower (a switch's
    busiest port carries max(Y_a, Y_b) samples), which D + X, S and X do not see. Such a
    group has more devices, so a larger all-reduce T_a in X, which the stages before it
    often hide (X' = max(T_a0, X - E_b0 - ...)), hence D as its key. Seen:
    pipedream-resnet18 on the 6-device Ethernet testbed, 8.96% above the best known plan
    while that plan's two-Nano suffix (Y = 2 against the Xavier NX's 4, the least D of
    its cell, 13th by D + X) had no slot.

    Selection by repeated argmin: take the alive candidate of least key (ties: least D),
    then drop every candidate it dominates in (D, X, S) (itself included). No alive
    candidate dominates a pick by the keys D + X, S or X (it would have a lower or
    equal key), so those picks are Pareto points in (D, X, S); the fourth is the least
    D of its subset. O(keep x rows x candidates).
    """
    total = d + x
    alive = np.isfinite(total) & np.isfinite(carry)
    rows = np.arange(len(d))
    chosen = np.zeros((len(d), keep), dtype=np.int64)
    valid = np.zeros((len(d), keep), dtype=bool)
    y_first = np.full((len(d), 1), -INF)
    y_kept = np.zeros((len(d), 1), dtype=bool)  # a pick has fewer samples than the first
    for j in range(keep):
        key = {1: carry, 2: x}.get(j, total) if keep > 3 else total
        if j == 3:
            fewer = alive & (y < y_first) & ~y_kept
            key = np.where(fewer.any(axis=1, keepdims=True), np.where(fewer, d, INF), total)
        masked = np.where(alive, key, INF)
        least = masked.min(axis=1, keepdims=True)
        # a row with no alive candidate (least inf) picks a dead one: found is false
        pick = np.argmin(np.where(masked == least, d, INF), axis=1)
        found = alive[rows, pick]
        chosen[:, j], valid[:, j] = np.where(found, pick, 0), found  # empty: column 0
        if not found.any() or j == keep - 1:
            break  # (after the last pick nothing reads what it dominates)
        if j == 0:
            y_first = y[rows, pick][:, None]
        y_kept |= (y[rows, pick][:, None] < y_first) & found[:, None]
        # keep what the pick does not dominate in (D, X, S): alive candidates are finite
        # in all three, and a row without a pick compares with inf (keeps every one)
        d_pick = np.where(found, d[rows, pick], INF)[:, None]
        alive &= (d < d_pick) | (x < x[rows, pick][:, None]) | (carry < carry[rows, pick][:, None])
        alive[rows, pick] = False
    return chosen, valid


def _front(
    d: np.ndarray, x: np.ndarray, carry: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pareto`'s ``FRONT`` picks, run on the columns where some row has a finite D
    when they are fewer than half (a column of inf D holds no candidate: the picks and
    their order are the same; an empty slot reads column 0, as there)."""
    live = np.flatnonzero(np.isfinite(d).any(axis=0))
    if 2 * len(live) >= d.shape[1]:
        return _pareto(d, x, carry, y, FRONT)
    if not len(live):
        return np.zeros((len(d), FRONT), dtype=np.int64), np.zeros((len(d), FRONT), dtype=bool)
    chosen, ok = _pareto(d[:, live], x[:, live], carry[:, live], y[:, live], FRONT)
    return np.where(ok, live[chosen], 0), ok


def _fields(packed: np.ndarray) -> np.ndarray:
    """``packed`` with its last axis (an entry's fields) first, a view to unpack."""
    return packed.transpose(packed.ndim - 1, *range(packed.ndim - 1))


@dataclass
class _Level:
    """Fronts of one level over every state: values D, X, the carried S (summed
    traversal), Y (largest per-device samples of the entry's head group), N (its
    stage count, which a collapsed level does not fix), FREE (the memory left on its
    head's ring-replica holder) and TAIL (the ring replica its last stage sends to the
    plan's first stage), the head
    composition H of each entry and its parent (edge, l', slot, and whether the parent
    lies in this level: a skip, or a move inside a collapsed level). ``warm`` is the
    heads' warm-up; a ``collapsed`` level holds every stage count from its first on."""

    warm: int
    collapsed: bool
    #: (states, L + 1, FRONT, 7): D, X, S, O, Y, FREE, TAIL of each entry, and (.., 2):
    #: H, N; packed so that the search gathers an entry's values in one read
    vals: np.ndarray
    ints: np.ndarray
    edge: np.ndarray
    l_sub: np.ndarray
    k_sub: np.ndarray
    same: np.ndarray

    def __post_init__(self) -> None:
        self.d, self.x, self.s, self.o, self.y, self.free, self.tail = _fields(self.vals)
        self.h, self.n = _fields(self.ints)

    @classmethod
    def empty(cls, n_states: int, n_blk: int, warm: int, collapsed: bool) -> _Level:
        shape = (n_states, n_blk + 1, FRONT)
        vals = np.full((*shape, 7), INF)
        vals[..., 5] = -INF  # FREE
        ints = np.zeros((*shape, 2), dtype=np.int32)
        ints[..., 0] = -1  # H
        return cls(
            warm,
            collapsed,
            vals,
            ints,
            np.full(shape, -1, dtype=np.int32),
            np.zeros(shape, dtype=np.int32),
            np.zeros(shape, dtype=np.int8),
            np.zeros(shape, dtype=bool),
        )

    def trim(self) -> None:
        """Keep only the traceback (the values of a finished level are no longer read)."""
        self.vals, self.ints = np.empty((0, 0, 0, 7)), np.empty((0, 0, 0, 2), dtype=np.int32)
        self.__post_init__()
