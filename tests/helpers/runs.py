"""A hand-written run directory of a real plan (the folder ``edgepipe run --out`` writes:
plan, metrics, timeline, emulation reports) whose measured figures are known exactly, for
the tests of ``edgepipe report`` (planner/check/report.py)."""

from __future__ import annotations

import json
from pathlib import Path

from edgepipe.planner import api
from edgepipe.planner.plan import Plan, save_plan

#: measured ms of every F / B action per device (steps 1 and 2); step 0 is 10x slower
F_MS = {"orin-0": 3.0, "orin-1": 2.0}
B_MS = {"orin-0": 5.0, "orin-1": 4.0}
WALLS = [900.0, 110.0, 130.0]


def write_run(folder: Path, time_scale: float | None = None, overruns: int = 0) -> Plan:
    """Write into ``folder`` the DP's plan of pipedream-alexnet on orin-pair-2 (batch 4)
    and three steps of it: every F and B of a device takes :data:`F_MS` / :data:`B_MS`
    (10x as long at step 0), step walls :data:`WALLS`; with ``time_scale``, emulation
    reports at that scale in which ``orin-1`` overran its budget ``overruns`` times at
    step 1. Returns the plan."""
    plan = api.solve(api.load_problem("pipedream-alexnet", "orin-pair-2", global_batch=4), "dp")
    folder.mkdir(parents=True, exist_ok=True)
    save_plan(plan, folder / "plan.json")
    m_count = plan.partition.num_micro_batches
    metrics, timeline = [], []
    for step, wall in enumerate(WALLS):
        slow = 10.0 if step == 0 else 1.0
        devices = {}
        for p, stage in enumerate(plan.partition.stages):
            for d in stage.devices:
                t = 0.0
                for m in range(m_count):
                    for kind, ms in (("F", F_MS[d]), ("B", B_MS[d])):
                        timeline.append({"device": d, "rank": p, "stage": p, "step": step,
                                         "kind": kind, "micro_batch": m, "start_ms": t,
                                         "end_ms": t + ms * slow})
                        t += ms * slow
                timeline.append({"device": d, "rank": p, "stage": p, "step": step,
                                 "kind": "REDUCE_GRAD", "micro_batch": None, "start_ms": t,
                                 "end_ms": t + 0.5})
                devices[d] = {"rank": p, "stage": p, "compute_ms": 1.0, "send_ms": 0.0,
                              "recv_wait_ms": 7.0 + step, "allreduce_ms": 0.5,
                              "optim_ms": 0.1, "wall_ms": wall, "peak_mem_bytes": 1}
        metrics.append({"step": step, "loss": 1.0, "wall_ms": wall,
                        "samples_per_s": 4 / wall * 1e3, "devices": devices})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (folder / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in timeline))
    if time_scale is not None:
        (folder / "emulation").mkdir()
        for rank, d in enumerate(F_MS):
            lines = [{"step": s, "device": d, "rank": rank, "budget_ms": 10.0, "real_ms": 1.0,
                      "overruns": overruns if (d == "orin-1" and s == 1) else 0,
                      "worst_overrun_ms": 2.5 if (d == "orin-1" and s == 1) else 0.0,
                      "time_scale": time_scale} for s in range(3)]
            (folder / "emulation" / f"rank{rank}.jsonl").write_text(
                "".join(json.dumps(x) + "\n" for x in lines))
    return plan
