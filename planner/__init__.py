"""edgepipe's planner: profiles, clusters and configs in, scored plans out.

``planner.compare(problem, ...)`` runs the planners side by side (:mod:`planner.comparison`);
:mod:`planner.api` is the front door for loading inputs and solving.
"""

from planner.comparison import compare

__all__ = ["compare"]
