"""Where the tests find the repository: its root, for files it ships and for the working
folder of the processes they start."""

from __future__ import annotations

from pathlib import Path

#: the repository's root (this file is tests/helpers/paths.py)
REPO = Path(__file__).resolve().parents[2]
