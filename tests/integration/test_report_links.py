"""An emulated run's per-link report (issue 25 item 3): real processes over gloo stamp
every transfer on both sides (executor/core/comm.py), the metrics writer matches them
(executor/core/metrics.py) and ``edgepipe report`` sets each link's measured transfer,
post to delivery, against the cost model's (planner/check/breakdown.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgepipe.executor.core.options import WorkerOptions
from edgepipe.executor.launch import launch
from edgepipe.planner.check.report import build_report

from tests.helpers.executor_helpers import MLP_DATASET, emulated_plan, profile_mlp, write_plan


@pytest.mark.serial  # wall-clock verdict: a 56.2 ms emulated transfer measured within 15%
@pytest.mark.slow
def test_an_emulated_runs_links_are_measured_as_the_emulation_delivers(tmp_path: Path) -> None:
    # two stages of one device, one micro-batch: each receiver waits for its transfer,
    # so every piece is timed exactly; 0.01 Mbit/s = 1.25 bytes/ms, 5 ms latency
    plan = emulated_plan(profile_mlp(), [(0, 2, [2]), (2, 4, [2])], 2, 1, [1, 1],
                         bandwidth_mbps=0.01, latency_ms=5.0)
    path = write_plan(plan, tmp_path)
    launch(WorkerOptions(str(path), 3, str(tmp_path / "run"), dataset=MLP_DATASET,
                         timeout_s=30, emulate=True))
    report = build_report(tmp_path / "run")
    assert report.mode == "emulated" and report.steps_used == (1, 2)
    assert [(r.boundary, r.direction, r.src, r.dst) for r in report.links] == [
        (0, "activations", "d0", "d1"), (0, "gradients", "d1", "d0")]
    for r in report.links:
        assert r.num_bytes == 2 * 8 * 4  # two samples of the width-8 MLP's float32 row
        assert r.predicted_ms == pytest.approx(r.num_bytes / 1.25 + 5.0)  # 56.2 ms
        assert (r.exact, r.count) == (2, 2)
        assert r.measured_ms is not None
        # the emulation never delivers before its link time; the OS may wake it late
        assert r.predicted_ms - 0.01 <= r.measured_ms <= 1.15 * r.predicted_ms
    first = report.stages[0]
    assert first.link_predicted == pytest.approx(56.2)
    assert first.link_measured is not None
    assert 56.2 - 0.01 <= first.link_measured <= 1.15 * 56.2
