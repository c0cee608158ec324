"""The ``edgepipe`` engine: edgepipe's own runtime (:func:`executor.launch.launch`, one
spawned process per plan device, 1F1B / GPipe from the plan's action lists, uneven
shares, re-slicing between stages of different widths, in-process recovery), wrapped as
an engine (:mod:`executor.engines.base`). It runs every plan whose model it can build.
"""

from __future__ import annotations

from edgepipe.executor.engines.base import RunOptions, builds_the_plans_model
from edgepipe.executor.launch import RunResult, launch
from edgepipe.planner.inputs.profile import BuildSpec
from edgepipe.planner.plan import Plan


class EdgepipeEngine:
    """edgepipe's runtime (module docstring)."""

    name = "edgepipe"

    def supports(self, plan: Plan, model_source: BuildSpec | None) -> str | None:
        """Every plan runs whose model is the plan's own build."""
        return builds_the_plans_model(plan, model_source)

    def run(self, plan: Plan, model_source: BuildSpec | None, options: RunOptions) -> RunResult:
        """:func:`executor.launch.launch` of ``options`` (it reads the plan from
        ``options.worker.plan``, the file of ``plan``, and checks it before any process
        starts)."""
        return launch(
            options.worker, hang_timeout_s=options.hang_timeout_s,
            heartbeat_s=options.heartbeat_s, recover=options.recover, joins=options.joins,
            standbys=options.standbys, watch_slowdown=options.watch_slowdown,
        )
