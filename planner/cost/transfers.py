"""The transfers of one round: a stage boundary's micro-batch re-sliced into pieces by
sample interval, and a stage's ring all-reduce as chunks.

Boundary p -> p+1 (:meth:`planner.cost.model.CostModel.link_transfer`): a micro-batch's
activations are re-sliced by sample interval (:func:`reslice_pieces`): the piece from
device i of stage p to device j of stage p+1 carries their n_ij shared samples, n_ij x a_p
bytes (a_p the boundary bytes per sample), taking n_ij a_p / bw_ij ms of channel time at
its pair's rate and delivered lat_ij after its last byte; gradients travel the same pieces
back. Alone on their channels, pieces started together take the most loaded channel
(:func:`planner.cost.channels.channel_loads`: max over pieces point-to-point, max over
ports switched, the sum on a shared medium) plus the latency: ``StageCost.link_out_ms``.

Ring all-reduce (reference/asteroid.md §3.3; :meth:`planner.cost.model.CostModel.ring`):
2(g-1) steps, in each member r sends r+1 a chunk of W_p / g.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgepipe.planner.cost.channels import channel_loads
from edgepipe.planner.inputs.cluster import Topology


def reslice_pieces(
    samples_a: tuple[int, ...], samples_b: tuple[int, ...]
) -> list[tuple[int, int, int]]:
    """The pieces of a micro-batch re-sliced from a group with per-device samples
    ``samples_a`` to one with ``samples_b`` (consecutive sample intervals in group order):
    ``(i, j, n)`` for every sender i and receiver j whose intervals share n > 0 samples.
    O(|a| + |b|) pieces."""
    pieces = []
    i = j = 0
    lo_a = lo_b = 0
    while i < len(samples_a) and j < len(samples_b):
        hi_a, hi_b = lo_a + samples_a[i], lo_b + samples_b[j]
        n = min(hi_a, hi_b) - max(lo_a, lo_b)
        if n > 0:
            pieces.append((i, j, n))
        if hi_a <= hi_b:
            i, lo_a = i + 1, hi_a
        if hi_b <= hi_a:
            j, lo_b = j + 1, hi_b
    return pieces


@dataclass(frozen=True)
class Piece:
    """One transfer: ``ms`` of channel time at the pair's rate from device ``src`` to
    device ``dst``, delivered ``latency_ms`` after its last byte."""

    src: str
    dst: str
    ms: float
    latency_ms: float


@dataclass(frozen=True)
class BoundaryCost:
    """One stage boundary p -> p+1: the re-sliced pieces of a micro-batch's activations
    (``forward``, stage p to p+1) and of its gradients (``backward``, the same pieces
    reversed), on the network ``topology``."""

    forward: tuple[Piece, ...]
    backward: tuple[Piece, ...]
    topology: Topology

    @property
    def latency_ms(self) -> float:
        """The largest latency over the boundary's pairs."""
        return max((x.latency_ms for x in self.forward), default=0.0)

    @property
    def forward_load(self) -> tuple[tuple[str, float], ...]:
        """Channel time per channel of the activations (:func:`channel_loads`)."""
        return channel_loads([(x.src, x.dst, x.ms) for x in self.forward], self.topology)

    @property
    def backward_load(self) -> tuple[tuple[str, float], ...]:
        """Channel time per channel of the gradients (:func:`channel_loads`)."""
        return channel_loads([(x.src, x.dst, x.ms) for x in self.backward], self.topology)

    @property
    def occupancy_ms(self) -> float:
        """Channel time of one direction: the most loaded channel (the time the pieces
        take when they start together and nothing else is on their channels)."""
        return max((ms for _, ms in self.forward_load), default=0.0)


@dataclass(frozen=True)
class RingCost:
    """A stage's ring all-reduce as transfers: ``chunks[r]`` is what member r sends member
    r+1 (mod g) in each of the 2(g-1) ring steps, W_p / g bytes (§3.3). Empty for g = 1."""

    chunks: tuple[Piece, ...] = ()
