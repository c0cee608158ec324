"""edgepipe's planner: profiles, clusters and configs in, scored plans out.

``planner.compare(problem, ...)`` runs the planners side by side
(:mod:`planner.solvers.comparison`);
``planner.replan(plan, lost=..., slowed=..., joined=...)`` re-plans incrementally
(:mod:`planner.replan.incremental`); :mod:`planner.api` is the front door for loading inputs and
solving.
"""

from edgepipe.planner.replan.incremental import precompute, replan
from edgepipe.planner.solvers.comparison import compare

__all__ = ["compare", "precompute", "replan"]
