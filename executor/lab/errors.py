"""Errors of the lab."""

from __future__ import annotations

from edgepipe.planner.errors import EdgepipeError


class LabUnavailable(EdgepipeError):
    """This machine cannot host the lab (no root, no cgroups, no ``ip``/``tc``).

    The message names what is missing and says to run ``--emulate`` instead.
    """


class LabError(EdgepipeError):
    """Setting up or tearing down the lab failed; the message names the command."""
