"""The exact planner's program as a small backend-neutral linear model: variables with
bounds and a kind (binary, integer, time in ms), rows (linear, optionally enforced by
binaries), an objective variable. :mod:`planner.solvers.exact.formulation` builds
one per (B, P); :mod:`planner.solvers.exact.backends` lowers it to each solver."""

from __future__ import annotations

from dataclasses import dataclass, field

#: variable kinds: binary, integer, time in ms
BIN, INT, TIME = "bin", "int", "time"

Lin = dict[int, float]


@dataclass
class Row:
    """``sum terms (sense) rhs``; ``unit`` says how CP-SAT scales it (``ms``: times,
    ``bytes``: memory, rounded conservatively, ``count``: exact integers); the row only
    holds when every binary in ``enforce`` is 1."""

    terms: Lin
    sense: str
    rhs: float
    unit: str
    enforce: tuple[int, ...] = ()


@dataclass
class Model:
    """Variables (bounds and kind: binary, integer, or time in ms) and rows; minimise
    the variable ``objective``."""

    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    objective: int = -1

    def var(self, kind: str, lb: float, ub: float) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.kind.append(kind)
        return len(self.kind) - 1

    def add(
        self, terms: Lin, sense: str, rhs: float, unit: str, enforce: tuple[int, ...] = ()
    ) -> None:
        terms = {v: c for v, c in terms.items() if c != 0.0}
        self.rows.append(Row(terms, sense, rhs, unit, enforce))

    def minimum(self, terms: Lin) -> float:
        """Least value of ``terms`` over the variables' bounds."""
        return sum(c * (self.lb[v] if c > 0 else self.ub[v]) for v, c in terms.items())

    def maximum(self, terms: Lin) -> float:
        """Largest value of ``terms`` over the variables' bounds."""
        return sum(c * (self.ub[v] if c > 0 else self.lb[v]) for v, c in terms.items())


def axpy(out: Lin, coef: float, terms: Lin) -> Lin:
    """``out += coef x terms`` in place; returns ``out``."""
    for v, c in terms.items():
        out[v] = out.get(v, 0.0) + coef * c
    return out
