"""The pipeline as a chain of execution steps: the closed form's (and the exact solver's)
view of a plan.

A plan of P stages is a chain of S = 2P-1 steps (reference/asteroid.md §1, §3.2):
step 2p is stage p's compute, step 2p+1 the link from stage p to p+1. Each step is one
sequential resource doing a forward and a backward per micro-batch; a stage step also
all-reduces its gradients inside its group after its last backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edgepipe.planner.inputs.cluster import Topology


@dataclass(frozen=True)
class Step:
    """One step of the chain.

    Attributes:
        kind: ``"stage"`` (compute) or ``"link"`` (activations forward, gradients back).
        index: the stage index p, or for a link the index of its upstream stage.
        forward_ms / backward_ms: time of one micro-batch's forward / backward on the
            step (for a stage: its slowest device, reference/asteroid.md Eq. 8).
        allreduce_ms: intra-group gradient all-reduce after the last backward (0 for links
            and single-device stages).
        warmup: forwards the step runs before its first backward (1F1B) or M (GPipe).
        devices: ids of the stage's devices (empty for links).
        device_forward_ms / device_backward_ms: each device's own time for its share of
            a micro-batch, in the order of ``devices`` (empty for links).
    """

    kind: Literal["stage", "link"]
    index: int
    forward_ms: float
    backward_ms: float
    allreduce_ms: float
    warmup: int
    devices: tuple[str, ...] = ()
    device_forward_ms: tuple[float, ...] = ()
    device_backward_ms: tuple[float, ...] = ()


@dataclass(frozen=True)
class StepChain:
    """The steps of one plan, in pipeline order, the micro-batch count M and the
    network's topology."""

    steps: tuple[Step, ...]
    num_micro_batches: int
    topology: Topology = "switched"
