"""edgepipe's planner: profiles, clusters and configs in, scored plans out.

``planner.compare(problem, ...)`` runs the planners side by side (:mod:`planner.compare`);
:mod:`planner.api` is the front door for loading inputs and solving.
"""

from planner.compare import compare

__all__ = ["compare"]
