"""edgepipe's planner: profiles, clusters and configs in, scored plans out.

:mod:`edgepipe.planner.api` is the front door: load inputs, solve, compare the planners
(:mod:`edgepipe.planner.solvers.comparison`) and re-plan incrementally
(:mod:`edgepipe.planner.replan.incremental`)::

    from edgepipe.planner import api
"""
