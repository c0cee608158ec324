"""Typed errors of edgepipe.

Every failure a user can cause (bad files, impossible memory, a plan that does not match
its inputs) raises a subclass of :class:`EdgepipeError` whose message names the problem
and the fix. The CLI prints the message and exits non-zero; it never shows a traceback
for these.
"""

from __future__ import annotations


class EdgepipeError(Exception):
    """Base class of every error edgepipe raises on purpose."""


class InputError(EdgepipeError):
    """A file or value given by the user is malformed or does not validate.

    Attributes:
        source: the file (or other origin) the bad value came from.
        path: JSON path of the offending value, e.g. ``$.blocks[3].param_bytes``.
        problem: what is wrong and how to fix it.
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {problem}")


class SchemaVersionError(InputError):
    """The document was written for a schema version this release does not read."""


class InfeasibleError(EdgepipeError):
    """No plan satisfies the constraints.

    Attributes:
        constraint: short name of the binding constraint (e.g. ``memory``).
        shortfall: by how much it is violated, in the constraint's unit (bytes for
            memory), or ``None`` when not measurable.
    """

    def __init__(self, message: str, constraint: str, shortfall: float | None = None) -> None:
        self.constraint = constraint
        self.shortfall = shortfall
        super().__init__(message)


class PlanMismatchError(EdgepipeError):
    """A plan does not fit the model, cluster or config it is used with."""


class UnrecoverableError(EdgepipeError):
    """Devices were lost together with every copy of some blocks' committed state.

    Attributes:
        blocks: the half-open block ranges ``(first, end)`` no surviving device holds.
        lost: the lost device ids.
    """

    def __init__(self, message: str, blocks: tuple[tuple[int, int], ...], lost: tuple[str, ...]):
        self.blocks = blocks
        self.lost = lost
        super().__init__(message)
