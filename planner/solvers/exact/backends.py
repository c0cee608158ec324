"""Solver backends of the exact planner: lower a
:class:`~planner.solvers.exact.linear_model.Model` to a solver, solve it under a time
limit, and report status, values and bound.

Backends: OR-Tools CP-SAT (``cpsat``: integer program; times scaled to integer units of
about 1e-8 of the incumbent, memory rounded conservatively to bytes, indicators as
enforcement literals, the DP plan as a solution hint, one worker per program) and pulp
with CBC (``cbc``: big-M indicators, the DP plan as MIP start) or HiGHS (``highs``:
big-M, the DP value as the objective cutoff; pulp's HiGHS interface has no MIP start).
CP-SAT's optimum is exact up to that time resolution (relative error below about 1e-5).

Standard output: CP-SAT and CBC (a subprocess of pulp's) print nothing when told to be
quiet, but HiGHS prints a banner from C++ straight to file descriptor 1 the first time a
solver object is built in a process. Redirecting descriptor 1 around it would silence
every thread of the caller's process, so HiGHS programs run in worker processes
(:class:`HighsWorkers`, spawned, their descriptor 1 on /dev/null); the caller's stdout
is never touched.

Interrupts (Ctrl-C): a solve runs in a thread of the search, or in a HiGHS worker, while
the caller's main thread takes the KeyboardInterrupt; :class:`Halt` then stops every
running solve at once: CP-SAT by its ``stop_search``, HiGHS, which cannot be stopped
from outside its process, by killing its workers (:meth:`HighsWorkers.kill`); CBC, a
child in the terminal's process group, stops on the same Ctrl-C. CP-SAT would
otherwise install its own SIGINT handler for every solve (``catch_sigint_signal``, on
by default, sat_parameters.proto), two solves in two threads overriding each other's:
a Ctrl-C then killed the process without a word or aborted it
(``std::bad_function_call``, status 134). It is turned off, so Python's handler stays.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgepipe.planner.solvers.exact.linear_model import BIN, INT, TIME, Model, axpy

#: rows lowered to CP-SAT between two looks at the time left (a callable ``time_limit``)
LOWER_CHECK = 50

#: a CBC limit below this (seconds) may end without a solution file (pulp raises):
#: that solve counts as unknown (seen at 0.07-0.08 s on pipedream-vgg16 programs)
CBC_SHORT_S = 1.0


# --------------------------------------------------------------------------------------
# backends
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """One program's result: ``status`` optimal | feasible (limit hit, solution) |
    infeasible (nothing at or under the cutoff) | unknown (limit hit, no solution);
    ``values`` per variable (times in ms); ``bound_ms`` a lower bound on the program's
    optimum (None if the solver has none)."""

    status: str
    values: list[float] | None
    bound_ms: float | None


class Halt:
    """Stops a search's running solves from another thread (module docstring).

    A solve registers how to stop it for as long as it runs (:meth:`during`);
    :meth:`stop` marks the search stopped and calls every registered stop. A solve that
    registers after :meth:`stop` is stopped at once; CP-SAT ignores a stop that comes
    before its solve has started, so a caller stopping a search calls :meth:`stop` again
    until its threads are done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stops: dict[int, Callable[[], None]] = {}
        self._stopped = threading.Event()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @contextmanager
    def during(self, stop: Callable[[], None]) -> Iterator[None]:
        """Register ``stop`` while the block runs (called at once if already stopped)."""
        with self._lock:
            key = max(self._stops, default=0) + 1
            self._stops[key] = stop
        if self.stopped:
            stop()
        try:
            yield
        finally:
            with self._lock:
                del self._stops[key]

    def stop(self) -> None:
        """Mark the search stopped and stop every solve running now."""
        self._stopped.set()
        with self._lock:
            stops = list(self._stops.values())
        for stop in stops:
            stop()


def solve_cpsat(
    md: Model,
    hint: dict[int, float],
    time_limit: float | Callable[[], float],
    units_per_ms: float,
    halt: Halt | None = None,
) -> Outcome:
    """Lower the program to CP-SAT (times in integer units of 1 / ``units_per_ms`` ms,
    memory rounded conservatively, indicator rows as enforcement literals) and solve it
    with one worker, ``hint`` as the solution hint; ``halt`` (if given) can stop it.
    ``time_limit``: seconds, or a function asked for them once the model is lowered
    (lowering a long chain's program takes seconds); none left: ``unknown`` unsolved."""
    from ortools.sat.python import cp_model

    model = cp_model.CpModel()
    scale = units_per_ms
    cp_vars = []
    for lb, ub, kind in zip(md.lb, md.ub, md.kind, strict=True):
        if kind in (BIN, INT):
            cp_vars.append(model.new_int_var(int(lb), int(ub), ""))
        else:
            cp_vars.append(model.new_int_var(math.floor(lb * scale), math.ceil(ub * scale), ""))
    for i, row in enumerate(md.rows):
        if callable(time_limit) and i % LOWER_CHECK == LOWER_CHECK - 1 and time_limit() <= 0:
            return Outcome("unknown", None, None)  # out of time while lowering
        coefs: list[int] = []
        if row.unit == "ms":
            for v, c in row.terms.items():
                coefs.append(int(c) if md.kind[v] == TIME else round(c * scale))
            rhs = round(row.rhs * scale)
        elif row.unit == "bytes":  # only <= rows: round up the load, down the budget
            coefs = [math.ceil(c) for c in row.terms.values()]
            rhs = math.floor(row.rhs)
        else:
            coefs = [round(c) for c in row.terms.values()]
            rhs = round(row.rhs)
        expr = cp_model.LinearExpr.weighted_sum([cp_vars[v] for v in row.terms], coefs)
        if row.sense == ">=":
            ct = model.add(expr >= rhs)
        elif row.sense == "<=":
            ct = model.add(expr <= rhs)
        else:
            ct = model.add(expr == rhs)
        if row.enforce:
            ct.only_enforce_if([cp_vars[v] for v in row.enforce])
    model.minimize(cp_vars[md.objective])
    for v, value in hint.items():
        model.add_hint(cp_vars[v], round(value))
    if callable(time_limit):
        time_limit = time_limit()
        if time_limit <= 0:
            return Outcome("unknown", None, None)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit, 0.01)
    solver.parameters.num_workers = 1  # PARALLEL programs run side by side
    solver.parameters.log_search_progress = False
    solver.parameters.catch_sigint_signal = False  # keep Python's handler (module docstring)
    with (halt or Halt()).during(solver.stop_search):
        status = solver.solve(model)
    bound = solver.best_objective_bound / scale
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        values = [
            solver.value(v) / scale if kind == TIME else float(solver.value(v))
            for v, kind in zip(cp_vars, md.kind, strict=True)
        ]
        if status == cp_model.OPTIMAL:
            return Outcome("optimal", values, solver.objective_value / scale)
        return Outcome("feasible", values, bound)
    if status == cp_model.INFEASIBLE:
        return Outcome("infeasible", None, None)
    return Outcome("unknown", None, bound if math.isfinite(bound) else None)


def solve_pulp(md: Model, hint: dict[int, float], time_limit: float, backend: str) -> Outcome:
    """Lower the program to pulp (indicator rows as big-M rows from the variables'
    bounds, memory in MiB) and solve it with CBC (MIP start from ``hint``) or HiGHS."""
    import pulp

    prob = pulp.LpProblem("edgepipe", pulp.LpMinimize)
    cats = {BIN: "Integer", INT: "Integer", TIME: "Continuous"}
    lp_vars = [
        prob.add_variable(f"v{i}", lowBound=lb, upBound=ub, cat=cats[kind])
        for i, (lb, ub, kind) in enumerate(zip(md.lb, md.ub, md.kind, strict=True))
    ]
    prob += lp_vars[md.objective]
    for row in md.rows:
        terms, rhs = dict(row.terms), row.rhs
        if row.unit == "bytes":  # MiB keeps the big-M coefficients moderate
            terms = {v: c / 2**20 for v, c in terms.items()}
            rhs /= 2**20
        if row.enforce:
            # slack by `big` unless every literal is 1; a row that always holds is dropped
            literals = {v: 1.0 for v in row.enforce}
            if row.sense == ">=":
                big = rhs - md.minimum(terms)
                terms, rhs = axpy(terms, -big, literals), rhs - big * len(literals)
            else:
                big = md.maximum(terms) - rhs
                terms, rhs = axpy(terms, big, literals), rhs + big * len(literals)
            if big <= 0:
                continue
        expr = pulp.lpSum(c * lp_vars[v] for v, c in terms.items())
        prob += {">=": expr >= rhs, "<=": expr <= rhs, "==": expr == rhs}[row.sense]
    deadline = time.perf_counter() + max(time_limit, 0.01)
    if backend == "cbc":
        for v, value in hint.items():
            lp_vars[v].setInitialValue(round(value))
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "cbc.log"
            with warnings.catch_warnings():
                # pulp 3 deprecates PULP_CBC_CMD, its only way to the bundled CBC binary
                warnings.simplefilter("ignore", DeprecationWarning)
                solver = pulp.PULP_CBC_CMD(
                    msg=False,
                    timeLimit=max(time_limit, 0.01),
                    warmStart=bool(hint),
                    logPath=str(log),
                    threads=1,
                )
            started = time.perf_counter()
            try:
                prob.solve(solver)
            except pulp.PulpSolverError:
                # under a limit of a fraction of a second CBC can stop before it writes
                # a solution file or a log (pulp raises): no answer within the limit
                if time_limit >= CBC_SHORT_S:
                    raise
                return Outcome("unknown", None, None)
            elapsed = time.perf_counter() - started
            verdict, bound = cbc_result(log.read_text() if log.exists() else "")
        if infeasible_proved(verdict, prob.status == pulp.LpStatusInfeasible, elapsed,
                             max(time_limit, 0.01)):
            return Outcome("infeasible", None, None)
        stopped = verdict != "optimal"
    else:
        import highspy

        for presolve in ("choose", "off"):
            solver = pulp.HiGHS(
                msg=False,
                timeLimit=max(deadline - time.perf_counter(), 0.01),
                threads=1,
                mip_rel_gap=0.0,
                presolve=presolve,
            )
            prob.solve(solver)
            status = prob.solverModel.getModelStatus()
            # HiGHS 1.16's presolve can end in a solve error ("MIP solver claims
            # optimality, but with ... infeasibilities"): solve again without presolve
            if status != highspy.HighsModelStatus.kSolveError:
                break
        if status == highspy.HighsModelStatus.kInfeasible:
            return Outcome("infeasible", None, None)
        stopped = status != highspy.HighsModelStatus.kOptimal
        dual = float(prob.solverModel.getInfo().mip_dual_bound)
        bound = dual if math.isfinite(dual) else None
    solved = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    # a variable in no row (pulp leaves it out of the solver's model) takes its lower bound
    values = (
        [
            float(lb if v.varValue is None else v.varValue)
            for v, lb in zip(lp_vars, md.lb, strict=True)
        ]
        if solved
        else None
    )
    if values is not None and not stopped:
        return Outcome("optimal", values, values[md.objective])
    return Outcome("feasible" if values is not None else "unknown", values, bound)


def cbc_result(log: str) -> tuple[str, float | None]:
    """CBC's verdict (optimal | infeasible | stopped) and final lower bound from its log."""
    verdict = re.search(r"Result - (.*)", log)
    text = verdict.group(1).lower() if verdict else ""
    found = re.search(r"Lower bound:\s*([-+0-9.eE]+)", log)
    bound = float(found.group(1)) if found else None
    if "infeasible" in text:
        return "infeasible", None
    if "optimal" in text:
        return "optimal", bound
    return "stopped", bound


def infeasible_proved(verdict: str, pulp_infeasible: bool, elapsed: float,
                      time_limit: float) -> bool:
    """Whether a CBC run proved its program infeasible: its log's verdict says so, or
    pulp read the solution file as infeasible from a run that ended (``elapsed`` s, CBC's
    start and files included) before its ``time_limit``. CBC's pre-processing stopped by
    the limit says "Cut generators found to be infeasible! ... Pre-processing says
    infeasible" and pulp reads the program as infeasible (seen under a 0.03 s limit with
    two cores busy, on a program its warm start satisfies): no answer."""
    return verdict == "infeasible" or (pulp_infeasible and elapsed < time_limit)


def _silence_stdout() -> None:
    """Worker initializer: descriptor 1 (and ``sys.stdout``) to /dev/null, in this
    worker process only; Ctrl-C ignored (it reaches the terminal's whole process group:
    the caller stops the workers, :meth:`HighsWorkers.kill`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the worker


class HighsWorkers:
    """HiGHS programs solved in ``workers`` spawned processes whose stdout is /dev/null
    (module docstring). Use as a context manager; :meth:`solve` blocks until the
    program's result is back."""

    def __init__(self, workers: int) -> None:
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_silence_stdout,
        )

    def solve(self, md: Model, hint: dict[int, float], time_limit: float) -> Outcome:
        return self.pool.submit(solve_pulp, md, hint, time_limit, "highs").result()

    def kill(self) -> None:
        """Kill every worker now (an interrupted search: HiGHS cannot be stopped from
        outside its process); their solves end as ``BrokenProcessPool``."""
        for process in list((self.pool._processes or {}).values()):  # no public list before 3.14
            process.kill()

    def __enter__(self) -> HighsWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
