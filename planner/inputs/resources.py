"""Where the shipped data (JSON Schemas, device catalog, example profiles) lives.

In a wheel the top-level ``schemas/`` and ``profiles/`` folders are installed as
``edgepipe/planner/schemas`` and ``edgepipe/planner/profiles`` (see pyproject.toml); in a source
checkout
or an editable install they are read from the repository root.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_dir(name: str) -> Path:
    """Return the folder of shipped data ``name`` ("schemas" or "profiles")."""
    installed = Path(str(files("edgepipe.planner"))) / name
    if installed.is_dir():
        return installed
    return Path(__file__).resolve().parents[2] / name


def profile_path(relative: str) -> Path:
    """Path of a shipped profile, e.g. ``profile_path("clusters/jetson-testbed-6.json")``."""
    return data_dir("profiles") / relative
