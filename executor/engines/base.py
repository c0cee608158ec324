"""The engine interface: what turns a validated plan into training, and how engines are
found by name.

An **engine** is any object with

* ``name: str``: the name it is registered under;
* ``supports(plan, model_source) -> str | None``: ``None`` when it can run ``plan`` on the
  model ``model_source`` builds, else one line that says why not and which engine can;
* ``run(plan, model_source, options) -> RunResult``: trains (``options.worker.steps``
  steps), returns the run's step lines (:class:`executor.launch.RunResult`); refuses, with an
  :class:`~planner.errors.EdgepipeError` raised before any process starts, a plan it does
  not support or an option it cannot honour.

``model_source`` is the :class:`~planner.inputs.profile.BuildSpec` that builds the model
(a zoo name with sizes, or ``module:callable`` returning its chain of blocks): the plan's
own (``plan.problem.model.build``; None for a profile imported without one). edgepipe's
two engines build the plan's own model in every rank and refuse another
(:func:`builds_the_plans_model`); a third-party engine may accept other sources.

**Registry**: engines are found through the Python entry-point group
:data:`GROUP` (``edgepipe.engines``), so a third party adds one by installing a
distribution that declares, in its ``pyproject.toml``::

    [project.entry-points."edgepipe.engines"]
    my-engine = "my_package.engine:MyEngine"

The entry point names a class whose no-argument constructor returns the engine, or the
engine object itself; the entry point's name is the engine's name. edgepipe's own two
(``edgepipe``, ``torch-pipelining``) are registered the same way in edgepipe's
``pyproject.toml``. :func:`find` loads one by name, O(installed distributions) for the
entry-point scan.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from edgepipe.planner.errors import InputError
from edgepipe.planner.timeouts import HANG_TIMEOUT_S, HEARTBEAT_S

if TYPE_CHECKING:
    from edgepipe.executor.core.options import WorkerOptions
    from edgepipe.executor.ft.joins import EmulatedJoin
    from edgepipe.executor.launch import RunResult
    from edgepipe.planner.inputs.profile import BuildSpec
    from edgepipe.planner.plan import Plan

#: the entry-point group engines register under
GROUP = "edgepipe.engines"
#: the engine of ``edgepipe run`` without ``--engine``
DEFAULT = "edgepipe"


@dataclass(frozen=True)
class RunOptions:
    """How to run: ``worker`` is what every rank runs (steps, output folder, deterministic
    mode, dataset, timeouts, checkpoints, fault injection, emulation); the rest is the local
    launcher's control plane and fault tolerance (:func:`executor.launch.launch`'s keyword
    arguments, same meaning). An engine without fault tolerance refuses the options that
    need it (docs/engines.md)."""

    worker: WorkerOptions
    hang_timeout_s: float | None = HANG_TIMEOUT_S
    heartbeat_s: float = HEARTBEAT_S
    recover: bool | None = None
    joins: tuple[EmulatedJoin, ...] = ()
    standbys: int | None = None
    watch_slowdown: bool | None = None


@runtime_checkable
class Engine(Protocol):
    """An engine (module docstring)."""

    name: str

    def supports(self, plan: Plan, model_source: BuildSpec | None) -> str | None:
        """None when this engine can run ``plan``; else one line: why not, which engine can."""
        ...

    def run(self, plan: Plan, model_source: BuildSpec | None, options: RunOptions) -> RunResult:
        """Train ``plan`` (module docstring)."""
        ...


def _registered() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def installed() -> list[str]:
    """The names of every installed engine, sorted."""
    return sorted(_registered())


def find(name: str) -> Engine:
    """The installed engine called ``name``. Raises :class:`InputError` (one line listing
    the installed engines) when none is, or when its entry point does not load to an
    engine."""
    registered = _registered()
    if name not in registered:
        raise InputError("--engine", name, f"no engine of that name is installed; installed: "
                         f"{', '.join(sorted(registered)) or 'none'} (engines register "
                         f"under the entry-point group {GROUP}; docs/engines.md)")
    point = registered[name]
    try:
        loaded = point.load()
    except Exception as exc:  # a third party's import error: one line, not a traceback
        raise InputError("--engine", name, f"its entry point {point.value!r} does not load: "
                         f"{type(exc).__name__}: {exc}") from None
    engine = loaded() if isinstance(loaded, type) else loaded
    if not isinstance(engine, Engine):
        raise InputError("--engine", name, f"entry point {point.value!r} gives "
                         f"{type(engine).__name__}, which lacks the engine interface (name, "
                         "supports, run; docs/engines.md)")
    return engine


def refuse_unsupported(engine: Engine, plan: Plan, model_source: BuildSpec | None) -> None:
    """Raise :class:`InputError` with ``engine``'s one line when it cannot run ``plan``."""
    why = engine.supports(plan, model_source)
    if why is not None:
        raise InputError("--engine", engine.name, why)


def builds_the_plans_model(plan: Plan, model_source: BuildSpec | None) -> str | None:
    """None when ``model_source`` is the plan's own build spec (what edgepipe's engines
    build in every rank), else the one line that says why not."""
    own = plan.problem.model.build
    if own is None:
        kind = plan.problem.model.source.get("kind", "?")
        return (f"model profile {plan.problem.model.name!r} does not say how to build the "
                f"model (source: {kind}; no 'build' object), so the plan can be planned but "
                "not run; profile a model the executor can build (edgepipe profile --model "
                "ZOO_NAME|MODULE:CALLABLE) and plan that")
    if model_source != own:
        what = "no model" if model_source is None else model_source.describe()
        return (f"the plan's workers build its own model {own.describe()}, not {what}; "
                "profile that model and plan it")
    return None
