"""A JSON cache of the exact solver's results per benchmark instance.

The exact solver is what makes ``solver_vs_dp.py`` and ``speedup.py`` slow (up to its
time limit per instance, about two hours for the whole suite under load), while the DP
and the baselines take seconds. Each instance's exact result is stored once, keyed by
its label, and reused while the instance and the solver settings are unchanged, so the
DP side can be re-run in minutes against the stored results and an interrupted exact
run resumes where it stopped.

An entry holds: the instance's hash (model, cluster and training config), the solver
settings (backend, time limit, programs run side by side, threads per program), the
best plan found (iteration time and partition), its lower bound and status, the solve
time, the warm start it was given (the DP's plan of that commit, whose figures are kept
too), the commit and whether the tree was modified, the UTC time, the load average and
how many CPUs the process could run on (``taskset`` confines a run to fewer).
An entry whose hash or settings differ from the current ones is stale and solved again.
The file is rewritten atomically after every instance.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from edgepipe.planner.cost.model import CostModel
from edgepipe.planner.inputs.problem import Problem
from edgepipe.planner.partition import Partition, StageAssignment
from edgepipe.planner.solvers.exact.search import PARALLEL
from edgepipe.planner.solvers.exact.solver import QUICK_SHARE, MILPResult, plan_milp

ROOT = Path(__file__).resolve().parent.parent

#: the default cache of the suites' exact results
DEFAULT_PATH = ROOT / "benchmarks" / "results" / "exact_cpsat_60s.json"

#: plans known for some instances from elsewhere (source named in each), part of the
#: best known
KNOWN_PATH = ROOT / "benchmarks" / "results" / "known_plans.json"


#: optional fields added to the domain types after entries were first cached: unset
#: (None) they are left out of the hash, so an instance that does not use them keeps
#: the hash it had before they existed (``Timing.valid_batch_range``, 3bc0d22)
LATER_OPTIONAL_FIELDS = frozenset({"valid_batch_range"})


def _without_later_unset(value: Any) -> Any:
    """``value`` (``dataclasses.asdict`` output) without the keys of
    :data:`LATER_OPTIONAL_FIELDS` whose value is None, at any depth."""
    if isinstance(value, dict):
        return {
            k: _without_later_unset(v)
            for k, v in value.items()
            if not (k in LATER_OPTIONAL_FIELDS and v is None)
        }
    if isinstance(value, list | tuple):
        return [_without_later_unset(v) for v in value]
    return value


def instance_hash(problem: Problem) -> str:
    """SHA-256 of the model profile, the cluster and the training config (what the
    planners read; the derived timings follow from them), leaving out unset
    :data:`LATER_OPTIONAL_FIELDS`.

    A replicating config hashes with ``replication_interval`` 1, whatever its interval
    (``"auto"``, the default since 4eccc79, or any k > 0): the planners read only
    whether ring replicas exist (``TrainingConfig.replicated``; replica memory is the
    same for every positive interval) and ``make_plan`` resolves the interval after the
    search, so every such config has the same exact optimum and the entries cached
    under interval 1 stay valid."""
    config = dataclasses.asdict(problem.config)
    if config["replication_interval"] != 0:
        config["replication_interval"] = 1
    doc = _without_later_unset(
        {
            "model": dataclasses.asdict(problem.model),
            "cluster": dataclasses.asdict(problem.cluster),
            "config": config,
        }
    )
    text = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def settings(backend: str, time_limit: float) -> dict[str, Any]:
    """The solver settings an entry was solved with (one CP-SAT thread per program)."""
    return {
        "backend": backend,
        "time_limit_s": time_limit,
        "programs_side_by_side": PARALLEL,
        "threads_per_program": 1,
        "quick_share": QUICK_SHARE,
    }


def commit() -> str:
    """HEAD of the working tree, ``+modified`` when tracked files differ from it."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", "planner"], cwd=ROOT, capture_output=True
    ).returncode
    return head + ("+modified" if dirty else "")


def partition_to_dict(p: Partition) -> dict[str, Any]:
    return dataclasses.asdict(p)


def partition_from_dict(d: dict[str, Any]) -> Partition:
    stages = tuple(
        StageAssignment(s["first"], s["end"], tuple(s["devices"]), tuple(s["samples"]))
        for s in d["stages"]
    )
    return Partition(d["micro_batch_size"], d["num_micro_batches"], stages)


def rescored_ms(problem: Problem, entry: dict[str, Any]) -> float:
    """The cached plan's iteration time under this tree's cost model (equal to the
    cached ``best_ms`` unless the cost model changed since)."""
    cm = CostModel(problem, max(problem.config.micro_batch_sizes()))
    return cm.evaluate(partition_from_dict(entry["partition"])).iteration_ms


def known_plans_ms(problem: Problem, label: str, path: Path = KNOWN_PATH) -> list[float]:
    """Iteration times under this tree's cost model of the plans recorded for ``label`` in
    the known-plans file (plans found outside the suite's runs, e.g. by an earlier DP),
    those that fit memory only."""
    if not path.exists():
        return []
    cm = CostModel(problem, max(problem.config.micro_batch_sizes()))
    costs = [
        cm.evaluate(partition_from_dict(k["partition"]))
        for k in json.loads(path.read_text())["plans"].get(label, [])
    ]
    return [c.iteration_ms for c in costs if c.memory_ok]


class ExactCache:
    """The cache file at ``path``: :meth:`get` a valid entry, :meth:`solve` one."""

    def __init__(self, path: Path = DEFAULT_PATH, backend: str = "cpsat", time_limit: float = 60.0):
        self.path = Path(path)
        self.settings = settings(backend, time_limit)
        self.commit = commit()  # once: the code this process imported
        self.entries: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            self.entries = json.loads(self.path.read_text())["instances"]

    def get(self, label: str, problem: Problem) -> dict[str, Any] | None:
        """The entry of ``label`` if it was solved for this very instance and settings."""
        e = self.entries.get(label)
        if e is None or e["instance_hash"] != instance_hash(problem):
            return None
        return e if e["settings"] == self.settings else None

    def solve(
        self, label: str, problem: Problem, warm_start: Partition, dp: dict[str, Any]
    ) -> dict[str, Any]:
        """Solve ``problem`` with the exact solver warm-started from ``warm_start``, the
        DP's plan (what :func:`planner.solvers.exact.solver.plan_milp` does by default), store and
        return
        the entry; ``dp``: that DP run's figures, kept beside it."""
        load_before = os.getloadavg()[0]
        r: MILPResult = plan_milp(
            problem,
            backend=self.settings["backend"],
            time_limit=self.settings["time_limit_s"],
            warm_start=warm_start,
        )
        entry = {
            "instance_hash": instance_hash(problem),
            "settings": self.settings,
            "status": r.status,
            "best_ms": r.cost.iteration_ms,
            "bound_ms": r.bound_ms,
            "gap": r.gap,
            "solve_time_s": r.solve_time_s,
            "warm_start_ms": r.warm_start_ms,
            "partition": partition_to_dict(r.partition),
            "dp": dp,
            "commit": self.commit,
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "cpus_allowed": len(os.sched_getaffinity(0)),
        }
        self._write(label, entry)
        return entry

    def _write(self, label: str, entry: dict[str, Any]) -> None:
        """Add ``entry`` to the file as it is now (another run may have added some)."""
        if self.path.exists():
            self.entries = json.loads(self.path.read_text())["instances"]
        self.entries[label] = entry
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        doc = {"about": __doc__.splitlines()[0], "instances": self.entries}
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
