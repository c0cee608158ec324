"""The test suite needs nothing beside the repository.

The repository's files (as ``git ls-files`` lists them, committed or not yet committed)
are copied into an empty folder and the tests that read data files run there, with an
audit hook that refuses to open any file in the original checkout or beside it (where a
the developers' shared folder would sit). A test that reads a file the repository does not hold
fails there, even on a machine where that file exists.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers.paths import REPO

#: every test module that opens files of the repository (profiles, raw data, catalog)
DATA_TESTS = [
    "tests/unit/test_pipedream_import.py",
    "tests/unit/test_catalog.py",
    "tests/unit/test_zoo.py",
]

GUARD = textwrap.dedent(
    """
    import os, sys

    FORBIDDEN = [p for p in os.environ["EDGEPIPE_FORBIDDEN"].split(os.pathsep) if p]
    ALLOWED = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]

    def _inside(path, roots):
        return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)

    def _guard(event, args):
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.realpath(os.fsdecode(args[0]))
        if _inside(path, FORBIDDEN) and not _inside(path, ALLOWED):
            raise PermissionError(f"test read {path}, which is outside the repository")

    sys.addaudithook(_guard)
    """
)


def repository_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f and (REPO / f).is_file()]


def test_data_dependent_tests_pass_in_a_bare_copy_of_the_repository(tmp_path: Path) -> None:
    copy = tmp_path / "clone"
    for rel in repository_files():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, copy / rel)
    (tmp_path / "guard").mkdir()
    (tmp_path / "guard" / "no_outside_reads.py").write_text(GUARD)
    # the copy's packages under their installed names (pyproject's package-dir mapping):
    # links first on the path, ahead of the editable install, which reads the repository
    installed = tmp_path / "site" / "edgepipe"
    installed.mkdir(parents=True)
    for package in ("planner", "executor"):
        (installed / package).symlink_to(copy / package)
    forbidden = [str(REPO)]
    if REPO.parent != Path(REPO.anchor):
        forbidden.append(str(REPO.parent))
    # (nor the CPU hook's file: this test's line counts the inner run as its children)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "EDGEPIPE_TEST_CPU")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path / "guard"), str(tmp_path / "site")]),
        EDGEPIPE_FORBIDDEN=os.pathsep.join(forbidden),
        HOME=str(tmp_path / "home"),
        XDG_CACHE_HOME=str(tmp_path / "home" / ".cache"),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-p",
        "no_outside_reads",
        "-p",
        "no:cacheprovider",
        "-m",
        # the serial tests time themselves (README, "Tests"): they run alone in make
        # test's second call, not inside this test's; none of them reads a data file
        "not slow and not serial",
        *DATA_TESTS,
    ]
    run = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
