"""A run that is still going, or that died: its state file, its lines so far, its progress
(no torch).

**State** (``status.json`` in the run directory, written by the local launcher,
:func:`executor.launch.launch`): ``state`` is ``running`` from the start (with the
launcher's ``pid`` and ``host``, the ``steps`` asked for, ``started_at``, wall-clock
s, and the run's ``mode``, one of :data:`MODES`), then ``finished``, ``failed``
(``reason``: the error's first line) or ``stopped`` (``reason``: interrupted), with
``ended_at``. A file still saying ``running`` whose
launcher process is gone (same host) was killed without a word (SIGKILL, a crash of the
machine): :func:`run_state` reads it as ``died``. A folder without the file (written by
an older edgepipe, or by the cross-host coordinator) is read as ``finished``.

**Lines so far.** ``metrics.jsonl`` gets each committed step's line when the step
commits, flushed (docs/executor.md, "Run directory and metrics format"); a reader may
meet a last line whose writer is still writing it, or was killed while writing it:
:func:`complete_lines` keeps only newline-terminated lines. :class:`Follower` reads the
lines appended since its last read (O(new bytes) per read) and starts again from the
top when the file shrank (a recovery that rolls back steps truncates it).

**Progress** (:func:`progress`): the last step line's step and loss, samples/s over the
last ``WINDOW`` steps' start times (the earliest device's ``started_at`` of each step;
replication and every other pause between steps included), and the time left at that
rate. O(window).
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepipe.planner.errors import InputError

STATUS = "status.json"
#: how a run's devices ran (``mode`` in status.json): ``emulated`` (``--emulate``: each
#: device sleeps to the cost model's budgets), ``lab`` (``--lab``: real compute confined
#: like each device, shaped links) or ``real`` (this machine's own speed)
MODES = ("emulated", "lab", "real")
#: steps whose start times give the progress line's rate
WINDOW = 20


def write_state(folder: Path, state: str, steps: int, reason: str | None = None,
                mode: str | None = None) -> None:
    """Write ``folder/status.json`` (module docstring) atomically (a reader never sees
    half a file): ``running`` with this process's pid, host, the time and the run's
    ``mode`` (one of :data:`MODES`); any other state keeps the start's fields and adds
    ``ended_at`` (and ``reason``)."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"run mode {mode!r} is not one of {', '.join(MODES)}")
    path = folder / STATUS
    doc: dict[str, Any] = {"state": state, "steps": steps}
    if state == "running":
        doc.update(pid=os.getpid(), host=socket.gethostname(), started_at=time.time())
        if mode is not None:
            doc["mode"] = mode
    else:
        try:
            start = json.loads(path.read_text())
        except (OSError, ValueError):
            start = {}
        doc = {**{k: start[k] for k in ("pid", "host", "started_at", "mode") if k in start},
               **doc, "ended_at": time.time()}
        if reason is not None:
            doc["reason"] = reason
    tmp = path.with_name(f".{STATUS}.{os.getpid()}")
    tmp.write_text(json.dumps(doc) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class RunState:
    """What ``status.json`` says of a run (module docstring), read by :func:`run_state`.
    ``state``: running | finished | failed | stopped | died."""

    state: str
    steps: int | None = None
    reason: str | None = None
    pid: int | None = None
    host: str | None = None
    #: one of :data:`MODES`; None where status.json does not say (an older writer)
    mode: str | None = None

    def describe(self, committed: int) -> str | None:
        """One line on a run that is not (known to be) finished, given how many steps
        committed; None for a finished one."""
        of = f"{committed} of {self.steps}" if self.steps is not None else str(committed)
        if self.state == "running":
            where = "" if self.host in (None, socket.gethostname()) else f" on {self.host}"
            return (f"the run is in progress: {of} steps committed so far (launcher pid "
                    f"{self.pid}{where})")
        if self.state == "finished":
            return None
        why = self.reason or self.state
        if self.state == "died":
            why = (f"its launcher (pid {self.pid}) is gone without a word (killed, e.g. by "
                   "SIGKILL, or crashed)")
        return f"the run did not finish: {of} steps committed; {why}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_state(folder: Path) -> RunState:
    """The state of the run in ``folder`` (module docstring). Raises
    :class:`InputError` for a ``status.json`` that is not edgepipe's."""
    path = folder / STATUS
    if not path.exists():
        return RunState("finished")
    try:
        doc = json.loads(path.read_text())
        state, steps = str(doc["state"]), doc.get("steps")
        pid, host, mode = doc.get("pid"), doc.get("host"), doc.get("mode")
    except (OSError, ValueError, KeyError, TypeError):
        raise InputError(str(path), "", "is not a run state written by edgepipe run; "
                         "delete it to report the run as finished") from None
    if mode is not None and mode not in MODES:
        raise InputError(str(path), "$.mode", f"{mode!r} is not one of {', '.join(MODES)}")
    if state == "running" and host == socket.gethostname() and isinstance(pid, int) \
            and not pid_alive(pid):
        state = "died"
    return RunState(state, steps, doc.get("reason"), pid, host, mode)


def complete_lines(text: str, where: str) -> list[dict[str, Any]]:
    """The JSON objects of the newline-terminated lines of ``text`` (module docstring:
    an unterminated last line is being written, or its writer died). Raises
    :class:`InputError` naming the first complete line that is not JSON."""
    objects = []
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if line.strip():
            try:
                objects.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError(where, "", f"line {n} is not JSON") from None
    return objects


class Follower:
    """Reads the complete lines appended to a JSON-lines file since the last read (module
    docstring); ``lines`` holds the lines read, in file order (the last ``keep`` of them
    when given: a long run's follower stays small)."""

    def __init__(self, path: Path, keep: int | None = None) -> None:
        self.path, self.keep = path, keep
        self.offset = 0
        self.lines: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        """The new complete lines (all of them again after the file shrank); [] when the
        file is missing. A line that is not JSON restarts the next read from the top."""
        try:
            size = self.path.stat().st_size
            if size < self.offset:
                self.offset, self.lines = 0, []
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        end = chunk.rfind(b"\n") + 1
        try:
            new = [json.loads(x) for x in chunk[:end].decode().splitlines() if x.strip()]
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.offset, self.lines = 0, []
            return []
        self.offset += end
        self.lines += new
        if self.keep is not None:
            del self.lines[:-self.keep]
        return new


@dataclass(frozen=True)
class Progress:
    """Where a run stands (module docstring): ``step`` is the last committed step's number
    (``done`` = step + 1 of ``total``), ``eta_s`` None while the rate is unknown."""

    done: int
    total: int
    loss: float
    samples_per_s: float | None
    eta_s: float | None

    def text(self) -> str:
        rate = "-" if self.samples_per_s is None else f"{self.samples_per_s:.1f}"
        eta = "-" if self.eta_s is None else _clock(self.eta_s)
        return (f"step {self.done}/{self.total}  loss {self.loss:.4f}  {rate} samples/s  "
                f"ETA {eta}")


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _started(line: dict[str, Any]) -> float | None:
    starts = [d["started_at"] for d in line["devices"].values() if "started_at" in d]
    return min(starts) if starts else None


def progress(lines: list[dict[str, Any]], total: int, global_batch: int) -> Progress | None:
    """The progress of a run from its metrics lines so far (module docstring); None
    before the first step line."""
    steps = [m for m in lines if "type" not in m]
    if not steps:
        return None
    last = steps[-1]
    done = last["step"] + 1
    window = [s for s in (_started(m) for m in steps[-WINDOW:]) if s is not None]
    period = None  # seconds per step
    if len(window) >= 2 and window[-1] > window[0]:
        period = (window[-1] - window[0]) / (len(window) - 1)
    elif last["wall_ms"] > 0:
        period = last["wall_ms"] / 1e3
    if period is None:
        return Progress(done, total, float(last["loss"]), None, None)
    return Progress(done, total, float(last["loss"]), global_batch / period,
                    (total - done) * period)
