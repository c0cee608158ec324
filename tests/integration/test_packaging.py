"""planner/ runs without torch, and the wheel carries the schemas and shipped profiles."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from tests.helpers.paths import REPO

NO_TORCH = """
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
from edgepipe.planner.cli.main import main
raise SystemExit(main(["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2",
                       "--global-batch", "8", "--solver", "milp", "-o", "-"]))
"""


def test_the_planner_and_its_cli_run_without_torch():
    run = subprocess.run(
        [sys.executable, "-c", NO_TORCH], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert '"kind": "edgepipe.plan"' in run.stdout


@pytest.mark.slow
def test_the_wheel_ships_schemas_catalog_profiles_and_type_markers(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = build.stdout + build.stderr
    for warning in ("BuildBackendWarning", "SetuptoolsWarning", "SetuptoolsDeprecationWarning"):
        assert warning not in log
    (wheel,) = tmp_path.glob("edgepipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # one top-level package, edgepipe (pyproject's package-dir mapping), and its metadata
    assert all(n.startswith(("edgepipe/", "edgepipe-")) for n in names)
    for schema in ("model_profile", "cluster", "training_config", "plan", "device_catalog"):
        assert f"edgepipe/planner/schemas/{schema}.schema.json" in names
    assert "edgepipe/planner/profiles/devices/catalog.json" in names
    assert "edgepipe/planner/profiles/clusters/jetson-testbed-6.json" in names
    assert "edgepipe/planner/profiles/models/pipedream-vgg16.json" in names
    assert "edgepipe/executor/profiling/models/cnn.py" in names
    assert {"edgepipe/planner/py.typed", "edgepipe/executor/py.typed"} <= names
    assert not any("profiles/raw" in n for n in names)  # third-party raw data stays out
