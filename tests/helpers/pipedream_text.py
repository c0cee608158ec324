"""Lines of PipeDream's graph.txt format (planner/inputs/importers/pipedream.py), written
by hand for the importer's tests."""

from __future__ import annotations


def node(nid: str, desc: str, f: float, b: float, act: float, par: float) -> str:
    """The line of node ``nid`` (layer ``desc``): forward and backward ms ``f``, ``b``,
    activation and parameter bytes ``act``, ``par``."""
    return (
        f"{nid} -- {desc} -- forward_compute_time={f:.3f}, backward_compute_time={b:.3f}, "
        f"activation_size={act:.3f}, parameter_size={par:.3f}"
    )
