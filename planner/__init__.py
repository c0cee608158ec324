"""edgepipe's planner: profiles, clusters and configs in, scored plans out.

``planner.compare(problem, ...)`` runs the planners side by side (:mod:`planner.comparison`);
``planner.replan(plan, lost=..., slowed=..., joined=...)`` re-plans incrementally
(:mod:`planner.replanning`); :mod:`planner.api` is the front door for loading inputs and
solving.
"""

from planner.comparison import compare
from planner.replanning import precompute, replan

__all__ = ["compare", "precompute", "replan"]
