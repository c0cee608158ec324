"""The CLI's argument types, and the flags ``edgepipe coordinate`` shares with ``python -m
executor.ft.coordinator``.

Each type parses one value or raises a one-line :class:`argparse.ArgumentTypeError`, which
argparse reports naming the flag. Torch-free and importing nothing of the executor, so
that the executor's coordinator can import :func:`add_coordinate_arguments` without a
circle.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from edgepipe.planner.inputs.config import AUTO, MAX_REPLICATION_INTERVAL
from edgepipe.planner.inputs.schema import excerpt
from edgepipe.planner.timeouts import HANG_TIMEOUT_S, START_TIMEOUT_S

#: committed checkpoints a run keeps (``--keep-checkpoints``; executor/ft/checkpoint.py,
#: "Retention"): the newest, and one before it should the newest's medium fail
KEEP_CHECKPOINTS = 2


def add_coordinate_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``edgepipe coordinate``, also those of ``python -m
    executor.ft.coordinator`` (the torchrun recipe, docs/executor.md)."""
    p.add_argument("plan", help="the plan every worker runs (same file on every host)")
    p.add_argument("--port", type=positive_int, default=29500,
                   help="port of the run's store here (workers: --coordinator HOST:PORT)")
    p.add_argument("--hang-timeout", type=positive_float, default=HANG_TIMEOUT_S,
                   help="seconds without a heartbeat after which a device is declared dead")
    p.add_argument("--start-timeout", type=positive_float, default=START_TIMEOUT_S,
                   help="seconds a worker may take to send its first heartbeat")
    p.add_argument("--recover", action="store_true",
                   help="recover in-process from a lost device or host (needs --steps)")
    p.add_argument("--steps", type=positive_int, help="with --recover: the workers' --steps")
    p.add_argument("--out", help="with --recover: metrics, re-planned plans and checkpoints "
                   "(a folder on this host, the workers need not see it; default: the "
                   "plan's folder)")
    p.add_argument("--deterministic", action="store_true",
                   help="with --recover: the workers run --deterministic")
    p.add_argument("--checkpoint-every", type=positive_int, default=0,
                   help="with --recover: commit a checkpoint every N steps on this host "
                   "(the workers send their parts through the store)")
    p.add_argument("--checkpoint-dir", help="with --recover: where (default OUT/checkpoints)")
    p.add_argument("--keep-checkpoints", type=positive_int, default=KEEP_CHECKPOINTS,
                   metavar="K", help="with --recover: keep the newest K committed "
                   f"checkpoints, delete older ones (default {KEEP_CHECKPOINTS})")
    p.add_argument("--resume", help="with --recover: start from this checkpoint (or the "
                   "newest in this folder); it reaches the workers through the store")
    p.add_argument("--emulate", action="store_true",
                   help="with --recover: the workers run --emulate (the slowdown watch "
                   "then compares with the plan times --time-scale)")
    p.add_argument("--watch-slowdown", action=argparse.BooleanOptionalAction, default=None,
                   help="with --recover: re-partition a device that is 1.5x slower "
                   "than the plan predicts in most of its last 9 steps (default on; on "
                   "real devices the predictions are calibrated over each plan's first "
                   "steps; docs/fault-tolerance.md, Slowdown)")
    p.add_argument("--time-scale", type=positive_float, default=None,
                   help="with --emulate: the workers' --time-scale (default 1)")
    p.add_argument("--standbys", type=non_negative_int, default=0, metavar="N",
                   help="with --recover, a plan of one stage on one device: expect N "
                   "standby workers (python -m executor.worker ... --standby DEV) on the "
                   "plan's first N idle devices that can hold its replica (default 0: "
                   "unreplicated; docs/fault-tolerance.md, Standbys)")


def _whole_number_at_least(text: str, least: int) -> int:
    """``text`` as a whole number >= ``least``; else an ``argparse.ArgumentTypeError``
    saying which (not a whole number, or below ``least``), which argparse reports in one
    line naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    return _whole_number_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    return _whole_number_at_least(text, 0)


def replication_interval(text: str) -> int | str:
    """``auto`` or a whole number 0 .. ``MAX_REPLICATION_INTERVAL``."""
    if text == AUTO:
        return text
    try:
        value = _whole_number_at_least(text, 0)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; give {AUTO!r} or a whole number of "
                                         "steps (0: no replicas)") from None
    if value > MAX_REPLICATION_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_REPLICATION_INTERVAL}, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def device_factor(text: str) -> tuple[str, float]:
    """``DEV=FACTOR`` with a finite factor > 0, e.g. ``nano-0=3``."""
    dev, sep, factor = text.rpartition("=")
    if not sep or not dev:
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} is not DEV=FACTOR (e.g. nano-0=3)")
    return dev, positive_float(factor)


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated distinct whole numbers >= 1, e.g. ``2,4,8``."""
    values = tuple(positive_int(part.strip()) for part in text.split(","))
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} repeats a value")
    return values


def increasing_int_list(text: str) -> tuple[int, ...]:
    """Comma-separated strictly increasing whole numbers >= 1, e.g. ``1,2,4,8``."""
    values = int_list(text)
    if list(values) != sorted(values):
        raise argparse.ArgumentTypeError(
            f"{excerpt(text, 40)!r} must be increasing, e.g. {','.join(map(str, sorted(values)))}"
        )
    return values


def name_list(text: str) -> tuple[str, ...]:
    """Comma-separated non-empty names."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{excerpt(text, 40)!r} has an empty name")
    return names


def output_file(text: str) -> str:
    """A file to write: not a directory, in a folder that exists (``-`` passes through)."""
    if text == "-":
        return text
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{excerpt(text, 60)} is a directory; name a file")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"folder {excerpt(str(parent), 60)} does not exist; create it first"
        )
    return text


def file_output(text: str) -> str:
    """:func:`output_file` without ``-`` (stdout is not offered)."""
    if text == "-":
        raise argparse.ArgumentTypeError("writing to stdout is not offered here; name a file")
    return output_file(text)


#: chart formats `show -o` writes (matplotlib's Agg and vector backends)
CHART_SUFFIXES = (".png", ".svg", ".pdf")


def chart_file(text: str) -> str:
    """A chart file to write: :func:`output_file` with a PNG, SVG or PDF suffix."""
    path = file_output(text)
    if Path(path).suffix.lower() not in CHART_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{excerpt(text, 60)} has no chart suffix; use one of {', '.join(CHART_SUFFIXES)}"
        )
    return path


def output_dir(text: str) -> str:
    """A folder to write into (created if missing): not an existing file."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{excerpt(text, 60)} is a file; name a folder")
    return text
