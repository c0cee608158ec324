"""How the executor starts its worker processes: forked from a forkserver that imported
torch once, instead of spawned interpreters that each import it again (~1.1-1.5 CPU s a
worker; docs/decisions.md, "Workers start from a preloaded forkserver").

:func:`worker_context` is ``multiprocessing``'s forkserver context whose server imports
:data:`PRELOAD` (the worker modules, which import torch and torch.distributed) before it
forks any child. CPython runs one server per parent process, started at its first
forkserver ``Process.start`` and alive until the parent exits; a child is a fork of the
server, so it inherits the server's state, not the launcher's at its start:

* **Signals.** The server ignores SIGINT; each child restores the disposition the
  server's interpreter started with. :func:`worker_context` starts the server with
  SIGINT ignored (from the main thread; an ignored signal stays ignored across exec and
  Python then installs no KeyboardInterrupt handler), so every worker starts deaf to the
  terminal's Ctrl-C, as a spawned child started under ``SIG_IGN`` does. Outside the main
  thread it returns the spawn context.
* **Environment, stdout, stderr.** The server's are the launcher's at the server's start.
  :func:`process` wraps the target in :func:`_forked`, which gets the launcher's current
  ``os.environ`` and its descriptors 1 and 2 (sent with the process,
  ``multiprocessing.reduction.DupFd``) and installs them before the target runs.
  Variables read only at import (``TORCH_CPP_LOG_LEVEL``, ``OMP_NUM_THREADS``) keep the
  server's values.
* **Exit status, kill, join.** As with spawn: the server reaps the child and sends its
  status over the sentinel (negative: killed by that signal); ``pid`` is the worker's.

No OpenMP region runs in the server (it only imports), so a child may set its own
thread count, as torch's DataLoader workers forked after ``import torch`` do.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing import forkserver, reduction
from multiprocessing.context import BaseContext
from typing import Any

__all__ = ["PRELOAD", "deaf_to_ctrl_c", "process", "start_deaf_to_ctrl_c", "worker_context"]

#: what the forkserver imports before it forks any worker (each sets its environment
#: defaults, then imports torch and torch.distributed)
PRELOAD = ["edgepipe.executor.worker", "edgepipe.executor.engines.torch_worker"]


@contextmanager
def deaf_to_ctrl_c() -> Iterator[None]:
    """SIGINT ignored in this process for the ``with`` block, the previous handler back
    after it; outside the main thread (where Python sets no handler) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_deaf_to_ctrl_c(proc: Any) -> None:
    """Start ``proc`` with SIGINT ignored, which a spawned child keeps across exec (a
    forkserver child restores the server's, ignored too: module docstring). Ctrl-C
    reaches the terminal's whole process group; the launcher, not each worker, handles it
    (it stops every worker and the CLI says one line), so a worker interrupted in its
    imports or its training no longer prints a traceback into the launcher's stderr.
    The launcher's own SIGINT is ignored only while the child starts (a few ms)."""
    with deaf_to_ctrl_c():
        proc.start()


def worker_context() -> BaseContext:
    """The forkserver context, its server started (deaf to SIGINT, :data:`PRELOAD`
    imported); the spawn context where that cannot be done here (module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        # Python sets signal handlers only in the main thread
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read only when the server starts
    with deaf_to_ctrl_c():
        forkserver.ensure_running()  # a no-op while the server runs
    return ctx


class _Stdio:
    """The launcher's stdout and stderr descriptors, sent with a forkserver child."""

    def __init__(self, fds: tuple[int, int]) -> None:
        self.fds = fds

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled while the child is being sent: each DupFd travels as a descriptor
        return (_Stdio._received, (reduction.DupFd(1), reduction.DupFd(2)))

    @staticmethod
    def _received(out: Any, err: Any) -> _Stdio:
        return _Stdio((out.detach(), err.detach()))

    def install(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, fd in zip((1, 2), self.fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)


def _forked(env: dict[str, str], stdio: _Stdio, target: Callable[..., None],
            args: tuple[Any, ...]) -> None:
    """Entry of a forkserver child: the launcher's environment and stdio, then ``target``."""
    os.environ.clear()
    os.environ.update(env)
    stdio.install()
    target(*args)


def process(ctx: BaseContext, target: Callable[..., None], args: tuple[Any, ...],
            name: str) -> Any:
    """A daemon ``Process`` of ``ctx`` running ``target(*args)``; under the forkserver
    with this process's environment and stdout/stderr (module docstring)."""
    if ctx.get_start_method() == "forkserver":
        target, args = _forked, (dict(os.environ), _Stdio((1, 2)), target, args)
    return ctx.Process(target=target, args=args, name=name, daemon=True)  # type: ignore[attr-defined]
