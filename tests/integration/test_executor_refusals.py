"""`edgepipe run` refuses a plan it cannot run before any process starts, in one line.

Each case edits a valid plan file and runs the real command line in-process; "before any
process starts" is observable: the run directory is never created (the launcher creates
it, with ``ranks.json``, only when it starts the workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from edgepipe.planner.cli.main import main
from edgepipe.planner.plan import plan_from_dict

from tests.helpers.executor_helpers import MLP_DATASET, make_test_plan, profile_mlp, write_plan
from tests.helpers.paths import REPO


@pytest.fixture(scope="module")
def plan_doc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    profile = profile_mlp()
    path = write_plan(make_test_plan(profile, [(0, 2, [1, 1]), (2, 4, [2])], 2, 2), folder)
    return json.loads(path.read_text())


def run_edited(tmp_path, doc, capsys, *extra):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "run"
    status = main(["run", str(path), "--steps", "1", "--out", str(out), "--dataset", MLP_DATASET,
                   *extra])
    err = capsys.readouterr().err
    assert status == 2
    assert not out.exists(), "a refused plan must not start the run"
    assert "Traceback" not in err
    return " ".join(err.split())


def test_wrong_schema_version(tmp_path, plan_doc, capsys):
    doc = {**plan_doc, "schema_version": 7}
    assert "schema version 7 is not supported" in run_edited(tmp_path, doc, capsys)


def test_decision_edited_to_mismatch_its_inputs(tmp_path, plan_doc, capsys):
    doc = json.loads(json.dumps(plan_doc))
    doc["stages"][1]["devices"][0]["samples"] = 3
    err = run_edited(tmp_path, doc, capsys)
    assert "stage 1's devices take 3 samples per micro-batch" in err


def rehashed(doc):
    """``doc`` with the id of its edited content (what `validate --rehash` writes), so
    that the check under test, not the id check, is the one that refuses it."""
    return {**doc, "id": plan_from_dict(doc, rehash=True).id}


def test_built_blocks_that_differ_from_the_profile(tmp_path, plan_doc, capsys):
    doc = json.loads(json.dumps(plan_doc))
    doc["inputs"]["model"]["build"]["kwargs"]["width"] = 6
    doc = rehashed(doc)
    err = run_edited(tmp_path, doc, capsys)
    # block 0 = Linear(6, 6): 42 floats = 168 bytes; the profile's Linear(6, 8) has 224
    assert "block 0 ('0') has 168 parameter bytes but profile 'model' says 224" in err


def test_a_model_with_more_blocks_than_the_profile(tmp_path, plan_doc, capsys):
    doc = json.loads(json.dumps(plan_doc))
    doc["inputs"]["model"]["build"]["kwargs"]["depth"] = 5
    doc = rehashed(doc)
    assert "builds 5 blocks but profile 'model' has 4" in run_edited(tmp_path, doc, capsys)


def test_memory_that_does_not_fit(tmp_path, plan_doc, capsys):
    doc = json.loads(json.dumps(plan_doc))
    doc["inputs"]["cluster"]["device_types"]["host-cpu"]["memory_bytes"] = 1000
    err = run_edited(tmp_path, doc, capsys)
    # 1000 B x 0.9 usable = 900 B = 0.88 KiB against 1660 B = 1.62 KiB: in the unit that
    # shows them (not 0.000 GiB)
    assert "device 'd0' (stage 0) needs 1.62 KiB," in err
    assert "but has 0.88 KiB usable (1660 > 900 bytes)" in err


def test_a_profile_without_a_build_spec(tmp_path, capsys):
    plan = tmp_path / "imported.json"
    assert main(["plan", "--model", "pipedream-alexnet", "--cluster", "orin-pair-2",
                 "--global-batch", "8", "-o", str(plan)]) == 0
    capsys.readouterr()
    err = run_edited(tmp_path, json.loads(plan.read_text()), capsys)
    assert "does not say how to build the model (source: imported" in err
    assert "edgepipe profile --model" in err


def test_device_count_not_matching_the_ranks(tmp_path, plan_doc):
    """Under torchrun the worker refuses a world size that is not the plan's device
    count before it touches the network (nothing listens on the given port)."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "9", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "edgepipe.executor.worker", str(path), "--steps", "1"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert "the plan runs on 3 devices (d0, d1, d2) but 2 ranks were started" in run.stderr
    assert "Traceback" not in run.stderr


NO_TORCH = """
import sys
sys.modules["torch"] = None
from edgepipe.planner.cli.main import main
from edgepipe.planner.plan import plan_from_dict
raise SystemExit(main(["run", sys.argv[1], "--steps", "1"]))
"""


def test_run_without_torch_says_what_to_install(tmp_path, plan_doc):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_doc))
    run = subprocess.run([sys.executable, "-c", NO_TORCH, str(path)], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert run.returncode == 2
    assert "pip install 'edgepipe[executor]'" in " ".join(run.stderr.split())
