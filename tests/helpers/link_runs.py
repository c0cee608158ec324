"""A hand-worked hybrid plan and a hand-written run directory of it (``timeline.jsonl``
and ``transfers.jsonl`` included), for the per-stage and per-link rows of ``edgepipe
report`` (planner/check/breakdown.py) and the transfer lines of the metrics writer
(executor/core/metrics.py).

Plan: the three-block model of tests/helpers/hand_model.py on devices A, B, C of type
``t``, switched, 8 Mbit/s = 1000 bytes/ms and 1 ms latency, except B-C at 0.8 Mbit/s =
100 bytes/ms and 4 ms. Micro-batch 2, M = 2. Stage 0: blocks b0, b1 on A and B, one
sample each; stage 1: block b2 on C, two samples. The boundary carries b1's 20 bytes
per sample: pieces A -> C and B -> C of one sample each (gradients back the same way).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgepipe.planner.inputs.cluster import Cluster, Device, Link, Network
from edgepipe.planner.inputs.config import TrainingConfig
from edgepipe.planner.inputs.problem import make_problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.plan import Plan, SolverInfo, make_plan, save_plan

from tests.helpers.hand_model import MODEL, T

MIB = 2**20
#: wall-clock s at each device's step start, per step
STARTED = {"A": 100.000, "B": 100.002, "C": 100.001}


def hand_plan() -> Plan:
    """The plan of the module docstring."""
    net = Network(8.0, 1.0, links=(Link("B", "C", 0.8, 4.0),))
    cluster = Cluster("hand", (Device("A", "t"), Device("B", "t"), Device("C", "t")), net,
                      {"t": T})
    problem = make_problem(MODEL, cluster, TrainingConfig(4, (2,)), catalog={"t": T})
    partition = Partition(2, 2, (StageAssignment(0, 2, ("A", "B"), (1, 1)),
                                 StageAssignment(2, 3, ("C",), (2,))))
    return make_plan(problem, partition, SolverInfo("hand"))


def _line(device: str, step: int, kind: str, m: int | None, start: float, end: float,
          **more: Any) -> dict[str, Any]:
    rank = "ABC".index(device)
    return {"device": device, "rank": rank, "stage": 0 if device in "AB" else 1, "step": step,
            "kind": kind, "micro_batch": m, "start_ms": start, "end_ms": end, **more}


def _transfer(src: str, dst: str, step: int, kind: str, m: int, start: float, end: float,
              waited: float) -> dict[str, Any]:
    return _line(src, step, kind, m, start, end, peer=dst, peer_rank="ABC".index(dst),
                 waited_ms=waited)


#: per device of step 1: (compute, all-reduce, optimizer, wall) ms, peak and baseline bytes
FIGURES = {
    "A": (12.0, 10.0, 1.0, 50.0, 300 * MIB, 200 * MIB),
    "B": (16.0, 8.0, 1.0, 50.0, 320 * MIB, 200 * MIB),
    "C": (6.0, 0.0, 1.0, 50.0, 90 * MIB, None),
}


def write_link_run(folder: Path) -> Plan:
    """Write into ``folder`` the hand plan and two steps (step 0, start-up, is left out
    of the comparison; its lines are step 1's, 10x as long). Step 1, times in ms from
    each device's step start (:data:`STARTED`):

    - F of every micro-batch: A 2, B 3, C 1; B: A 4, B 5, C 2;
    - REDUCE_GRAD: A 30-40, B 31-39 (on the shared clock A 30-40, B 33-41);
    - activations, sender's frame (start, end, receiver began waiting):
      A -> C m0 (2, 3.5, 1), m1 (4, 5.1, 5.05: the data was in before the wait);
      B -> C m0 (3, 7.5, 2), m1 (6, 10.5, 9);
    - gradients: C -> A m0 (8, 9.02, 0), C -> B m0 (8, 12.2, 0);
    - per device :data:`FIGURES`.
    Returns the plan."""
    plan = hand_plan()
    folder.mkdir(parents=True, exist_ok=True)
    save_plan(plan, folder / "plan.json")
    metrics, timeline = [], []
    for step in (0, 1):
        k = 10.0 if step == 0 else 1.0
        for d, (f, b) in {"A": (2.0, 4.0), "B": (3.0, 5.0), "C": (1.0, 2.0)}.items():
            t = 0.0
            for m in range(2):
                timeline.append(_line(d, step, "F", m, t, t + k * f))
                timeline.append(_line(d, step, "B", m, t + k * f, t + k * (f + b)))
                t += k * (f + b)
        timeline += [_line("A", step, "REDUCE_GRAD", None, 30.0 * k, 40.0 * k),
                     _line("B", step, "REDUCE_GRAD", None, 31.0 * k, 39.0 * k)]
        for src, m, start, end, waited in (("A", 0, 2.0, 3.5, 1.0), ("A", 1, 4.0, 5.1, 5.05),
                                           ("B", 0, 3.0, 7.5, 2.0), ("B", 1, 6.0, 10.5, 9.0)):
            timeline.append(_transfer(src, "C", step, "TRANSFER_F", m, k * start, k * end,
                                      k * waited))
        timeline += [_transfer("C", "A", step, "TRANSFER_B", 0, k * 8.0, k * 9.02, 0.0),
                     _transfer("C", "B", step, "TRANSFER_B", 0, k * 8.0, k * 12.2, 0.0)]
        devices = {}
        for d, (compute, ar, optim, wall, peak, base) in FIGURES.items():
            devices[d] = {"rank": "ABC".index(d), "stage": 0 if d in "AB" else 1,
                          "compute_ms": k * compute, "send_ms": 0.1, "recv_wait_ms": 3.0,
                          "allreduce_ms": k * ar, "optim_ms": k * optim, "wall_ms": k * wall,
                          "started_at": STARTED[d] + step, "peak_mem_bytes": peak,
                          **({} if base is None else {"baseline_mem_bytes": base})}
        metrics.append({"step": step, "loss": 1.0, "wall_ms": 50.0 * k,
                        "samples_per_s": 4 / (50.0 * k) * 1e3, "devices": devices})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    actions = [e for e in timeline if not e["kind"].startswith("TRANSFER")]
    transfers = [e for e in timeline if e["kind"].startswith("TRANSFER")]
    (folder / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in actions))
    (folder / "transfers.jsonl").write_text("".join(json.dumps(e) + "\n" for e in transfers))
    return plan
