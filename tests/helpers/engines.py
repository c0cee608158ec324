"""A third party's engine for the engine tests: a real distribution (a package and its
``dist-info`` with an ``entry_points.txt``) written into a folder that goes on
``sys.path`` (or ``PYTHONPATH`` for a CLI process), where ``importlib.metadata`` finds it
as it finds an installed one. Nothing is installed into the virtual environment, so
nothing is left behind when the folder goes."""

from __future__ import annotations

from pathlib import Path

import pytest

#: the third party's engine: trains a plan in this one process (the whole model, each
#: micro-batch in turn, its mean loss over M: fast mode's global-batch mean)
THIRD_PARTY = '''
"""One-process engine (a test's third party)."""
import time

from edgepipe.executor.core import data
from edgepipe.executor.core.build import load_rows, stage_optimizer
from edgepipe.executor.core.stage import build_stage, stage_loss
from edgepipe.executor.launch import RunResult


class OneProcess:
    name = "one-process"

    def supports(self, plan, model_source):
        if model_source != plan.problem.model.build:
            return "one-process builds the plan's own model only"
        return None

    def run(self, plan, model_source, options):
        opts, model_profile = options.worker, plan.problem.model
        model = build_stage(model_profile, 0, model_profile.num_blocks)
        rows, loss_fn = load_rows(plan, opts), stage_loss(model_profile)
        optimizer = stage_optimizer(model, plan)
        b, count = plan.partition.micro_batch_size, plan.partition.num_micro_batches
        lines = []
        for step in range(opts.steps):
            start = time.perf_counter()
            batch = data.step_indices(step, b * count, rows.size, plan.problem.config.seed)
            optimizer.zero_grad()
            total = 0.0
            for m in range(count):
                mine = batch[m * b:(m + 1) * b]
                loss = loss_fn(model(rows.inputs(mine)), rows.targets(mine)) / count
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            wall_ms = (time.perf_counter() - start) * 1e3
            lines.append({"step": step, "loss": total, "wall_ms": wall_ms,
                          "samples_per_s": b * count / wall_ms * 1e3, "devices": {}})
        return RunResult(None, lines)
'''


def install_engine(folder: Path, monkeypatch: pytest.MonkeyPatch | None = None,
                   name: str = "one-process", source: str = THIRD_PARTY,
                   target: str = "OneProcess") -> Path:
    """Write a distribution registering ``source``'s ``target`` as engine ``name`` under
    ``folder/site``; put that folder on ``sys.path`` with ``monkeypatch`` (undone after the
    test). Returns the folder (a ``PYTHONPATH`` entry for a CLI process)."""
    site = folder / "site"
    package = "edgepipe_test_engine_" + name.replace("-", "_")
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(source)
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[edgepipe.engines]\n{name} = {package}:{target}\n")
    if monkeypatch is not None:
        monkeypatch.syspath_prepend(str(site))
    return site
