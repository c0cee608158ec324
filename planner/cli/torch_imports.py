"""Importing torch (or the executor, which imports it) from inside a command: a missing
torch becomes a one-line install hint, and a Ctrl-C during the import waits for its end.

Only the commands that run torch import it (``profile``, ``probe``, ``run``,
``coordinate`` and the demo's run), each inside :func:`needs_torch` or
:func:`executor_imports`, so the planner's commands start without it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from edgepipe.planner.errors import EdgepipeError


@contextmanager
def holding_ctrl_c() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) back while the block runs, then deliver it.

    For the import of torch: a KeyboardInterrupt raised at an arbitrary point inside it
    can abort the process from C++ (``terminate called after throwing an instance of
    'pybind11::error_already_set'``, status -6), be lost in a callback that cannot raise
    (the command then runs on), or leave CPython's unhandled-interrupt flag set
    (:func:`planner.cli.main._forget_handled_interrupts`). Held back, it arrives as an
    ordinary KeyboardInterrupt once the import is done (or failed). In a thread other
    than the main one, which receives no signals, the block just runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # to the handler before ours, as if now


@contextmanager
def _torch_or_hint(hint: str, missing: type[ImportError]) -> Iterator[None]:
    """Run the block's imports holding Ctrl-C back; a ``missing`` error for torch (or
    one of its modules) becomes ``EdgepipeError(hint)``, any other is raised as it is."""
    try:
        with holding_ctrl_c():
            yield
    except missing as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        raise EdgepipeError(hint) from None


def needs_torch(command: str) -> AbstractContextManager[None]:
    """Turn a missing torch (the ``executor`` extra) into a one-line error naming
    ``edgepipe command``; a Ctrl-C during the import waits for its end."""
    return _torch_or_hint(
        f"`edgepipe {command}` measures with torch, which is not installed: "
        "install edgepipe[executor] (pip install 'edgepipe[executor]')",
        ModuleNotFoundError,
    )


def executor_imports() -> AbstractContextManager[None]:
    """Import executor modules, turning a missing torch into an install hint; a Ctrl-C
    during the import waits for its end."""
    return _torch_or_hint(
        "running a plan needs the executor's dependencies (torch): "
        "pip install 'edgepipe[executor]'",
        ImportError,
    )
