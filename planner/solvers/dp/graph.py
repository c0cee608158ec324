"""The DP's state graphs (per micro-batch size B): which groups of devices a stage may
take, and in which device orders.

Inputs: the cost tables (:class:`planner.solvers.dp.tables._Tables`: the device classes'
counts and whether each class's times never fall with the batch), B and the device
orders of :func:`device_orders`.

States are count vectors r = (r_1..r_K), the devices still available per class; a
*move* r -> r - g makes the group g (a composition, g_k devices of class k) the head
stage; a *skip* r -> r - e_k leaves one device idle. Two graphs:

* complete (when it has at most ``COMPLETE_MOVES`` moves): every r <= counts and every
  composition g <= r is a move. This is every assignment of devices to stages, in any
  order, idle devices included - no device order is imposed.
* ordered (otherwise): the union, over the device orders of :func:`device_orders`
  (memory descending, Asteroid's; speed ascending; speed descending), of Asteroid's
  contiguous groups: with the devices of an order laid out class by class, the states
  are its suffixes, a move takes the first n - n' devices of a suffix of n, and a skip
  drops the first device of a suffix (so any device may stay idle between groups).
  Memory descending gives the deep-warm-up early stages the large memories; speed
  ascending puts the fastest devices last, where the stage holding the heaviest blocks
  often sits (with memory order only, the DP's worst gap to the exact optimum on the
  solver benchmark was 53%: gpt2-small on the 8-device Ethernet testbed). Taking the
  union makes the DP at least as good as the best single order, in one run.

Both graphs drop two kinds of dominated moves (:func:`useful`): groups of more than B
devices (some device would get no sample; the same plan is a smaller group plus skips)
and a group of s devices of one class whose times never fall with the batch size when a
smaller group s' < s of that class has the same largest share ceil(B/s') = ceil(B/s)
(the same stage times and memory, a cheaper all-reduce, fewer devices used). So a class
contributes O(sqrt B) homogeneous group sizes. The ordered graph also keeps a group of
several classes (one that straddles a class boundary of an order) only at those sizes,
where the even share ceil(B/s) falls (:func:`falls`). This is a heuristic cut, not a
dominance (a mixed group's split is Algorithm 1's, not even): such groups are most of
the compositions on many classes (3,472 of 3,560 at B = 32 on 512 devices of 8 types);
measured on 35 ordered-graph instances of 2-8 classes (docs/decisions.md) the plans were
the same on 32, better on two and worse on one (+0.70%), in 0.6-0.95x the time.

Complexity: the complete graph has S = prod_k (c_k + 1) states and E = prod_k (c_k + 1)
(c_k + 2) / 2 moves at most; the ordered graph S <= 3 (N + 1) and E <= 3 (N + 1) min(B,
N); building either is O(E K).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.solvers.classes import DeviceClass
from edgepipe.planner.solvers.dp.tables import _Tables

#: the complete state graph is used when it has at most this many moves
COMPLETE_MOVES = 1500


@dataclass
class _Graph:
    """States (count vectors, ascending size), edges (state, composition or -1 for a
    skip, next state) and each state's edge indices."""

    states: list[tuple[int, ...]]
    edges: list[tuple[int, int, int]]
    out: list[list[int]]
    kind: str


def device_orders(problem: Problem, classes: list[DeviceClass]) -> list[list[int]]:
    """Class orders of the ordered graph: memory descending (then speed descending),
    speed ascending, speed descending; speed = 1 / (the whole model's forward + backward
    time at the largest micro-batch candidate); ties by first appearance. Duplicates
    removed."""
    cm_batch = max(problem.config.micro_batch_sizes())
    timing = problem.timings
    n_blocks = problem.model.num_blocks

    def model_ms(c: DeviceClass) -> float:
        t = timing[c.type]
        per_block = [
            float(np.interp(cm_batch, t.batch_sizes, f) + np.interp(cm_batch, t.batch_sizes, b))
            for f, b in zip(t.forward_ms, t.backward_ms, strict=True)
        ]
        return sum(per_block[:n_blocks]) * c.slowdown

    ks = range(len(classes))
    ms = [model_ms(c) for c in classes]
    orders = [
        sorted(ks, key=lambda k: (-classes[k].budget, ms[k], k)),
        sorted(ks, key=lambda k: (-ms[k], k)),
        sorted(ks, key=lambda k: (ms[k], k)),
    ]
    unique: list[list[int]] = []
    for order in orders:
        if order not in unique:
            unique.append(order)
    return unique


def useful(tables: _Tables, g: tuple[int, ...], batch: int) -> bool:
    """Whether group g is not dominated (module docstring): at most B devices, and a
    one-class group of a monotone class has the least size of its largest share."""
    size = sum(g)
    if not 1 <= size <= batch:
        return False
    if np.count_nonzero(g) == 1:
        k = next(i for i, v in enumerate(g) if v)
        if tables.monotone[k]:
            share = -(-batch // size)
            return size == -(-batch // share)
    return True


def falls(g: tuple[int, ...], batch: int) -> bool:
    """Whether the ordered graph keeps group g (module docstring): a one-class group
    always (:func:`useful` has dropped its dominated sizes), a group of several
    classes only at a size where the even share falls, |g| = ceil(B / ceil(B / |g|))
    (the sizes a one-class group of a monotone class keeps)."""
    if np.count_nonzero(g) == 1:
        return True
    size = sum(g)
    return size == -(-batch // -(-batch // size))


def state_graph(tables: _Tables, batch: int, orders: list[list[int]]) -> _Graph:
    """The complete graph if it has at most ``COMPLETE_MOVES`` moves, else the
    ordered one (module docstring)."""
    if complete_fits(tables.counts):
        return _complete(tables, batch)
    return _ordered(tables, batch, orders)


def complete_fits(counts: tuple[int, ...]) -> bool:
    """Whether the complete graph on ``counts`` devices per class has at most
    ``COMPLETE_MOVES`` moves (at any B)."""
    return math.prod((c + 1) * (c + 2) // 2 for c in counts) <= COMPLETE_MOVES


def _complete(tables: _Tables, batch: int) -> _Graph:
    states = sorted(itertools.product(*(range(c + 1) for c in tables.counts)), key=sum)
    index = {s: i for i, s in enumerate(states)}
    edges: list[tuple[int, int, int]] = []
    out: list[list[int]] = [[] for _ in states]
    for i, r in enumerate(states):
        for g in itertools.product(*(range(v + 1) for v in r)):
            if useful(tables, g, batch):
                sub = tuple(a - b for a, b in zip(r, g, strict=True))
                out[i].append(len(edges))
                edges.append((i, tables.comp(g), index[sub]))
    return _Graph(states, edges, out, "complete")


def _ordered(tables: _Tables, batch: int, orders: list[list[int]]) -> _Graph:
    n_cls = len(tables.counts)
    suffixes: list[list[tuple[int, ...]]] = []
    for order in orders:
        seq = [k for k in order for _ in range(tables.counts[k])]
        vecs = []
        for n in range(len(seq) + 1):
            v = [0] * n_cls
            for k in seq[len(seq) - n :]:
                v[k] += 1
            vecs.append(tuple(v))
        suffixes.append(vecs)
    states = sorted({v for vecs in suffixes for v in vecs}, key=lambda v: (sum(v), v))
    index = {s: i for i, s in enumerate(states)}
    seen: set[tuple[int, int, int]] = set()
    for vecs in suffixes:
        for n in range(1, len(vecs)):
            r = vecs[n]
            seen.add((index[r], -1, index[vecs[n - 1]]))
            for n_sub in range(max(0, n - batch), n):
                g = tuple(a - b for a, b in zip(r, vecs[n_sub], strict=True))
                if useful(tables, g, batch) and falls(g, batch):
                    seen.add((index[r], tables.comp(g), index[vecs[n_sub]]))
    edges = sorted(seen)
    out: list[list[int]] = [[] for _ in states]
    for e, (i, _, _) in enumerate(edges):
        out[i].append(e)
    return _Graph(states, edges, out, "ordered")
