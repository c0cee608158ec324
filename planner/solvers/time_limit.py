"""The check of a solver's wall-clock limit, made by every public entry that takes one
(:func:`planner.solvers.solve.solve`, :func:`planner.solvers.dp.driver.plan_dp`,
:func:`planner.solvers.exact.solver.plan_milp`)."""

from __future__ import annotations

import math

from edgepipe.planner.errors import InputError


def check_time_limit(time_limit: object) -> float:
    """``time_limit`` as seconds; raises :class:`InputError` naming the value and the fix
    unless it is a finite number above 0 (not a bool). A limit of 0 or below would stop
    a search before it starts (the DP then returns its first, slower plan); an infinite
    or NaN one cannot be written into a plan file (JSON has no such numbers)."""
    if isinstance(time_limit, bool) or not isinstance(time_limit, int | float):
        raise InputError("--time-limit", "", f"expected seconds as a number, got a "
                         f"{type(time_limit).__name__}; give e.g. 60")
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise InputError("--time-limit", "", f"must be positive seconds (a finite number), "
                         f"got {time_limit!r}; give e.g. 60")
    return float(time_limit)
