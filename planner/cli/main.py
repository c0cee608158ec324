"""``edgepipe`` command line: a thin shell over the library.

Every command prints a human summary; files are written only where ``-o`` says (``-o -``
writes the JSON document to stdout, after any solver has finished), each atomically (a
temporary file renamed into place, removed again on any failure or Ctrl-C).

Every argument is parsed into a typed value before anything runs (:mod:`planner.cli.args`);
flags given explicitly beat a ``--config`` file's values; a flag that does not apply to
the chosen planner is an error. Exit status: 0 success; 1 ``compare`` found no feasible
plan; 2 a bad argument or input, or any other error of edgepipe
(:class:`~planner.errors.EdgepipeError`), printed as one line; 130 interrupted (Ctrl-C),
printed as one line; 141 standard output closed early (``edgepipe plan -o f | head``):
the status of a command killed by SIGPIPE, as ``cat`` gives; nothing more is printed,
and every file was written before the command printed its summary.

This module parses and dispatches. Each command lives in the module :data:`COMMANDS`
names, which adds the command's arguments to its parser and runs it; that module is
imported only once argparse has chosen the command, so ``edgepipe --version`` loads none
of them, and only the commands that need torch, the solvers or matplotlib load them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from edgepipe.planner.errors import EdgepipeError

#: command -> (module of planner.cli that adds its arguments and runs it, its help line),
#: in the order ``edgepipe --help`` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("planning", "solve for the best plan and write it as JSON"),
    "compare": ("planning", "run the DP, the exact solver and the baselines side by side"),
    "show": ("documents", "print a plan's summary; -o draws its timeline (PNG)"),
    "simulate": (
        "documents",
        "replay a plan's iteration in the independent simulator and print the cost "
        "model's error against it",
    ),
    "replan": (
        "planning", "re-plan after devices are lost, slow down or join; list the migration"
    ),
    "validate": (
        "documents", "check any edgepipe document: its schema and the checks `plan` makes"
    ),
    "import-pipedream": ("documents", "convert a PipeDream graph.txt profile"),
    "profile": ("measuring", "measure a zoo (or your own) model's blocks on this machine"),
    "probe": ("measuring", "measure this machine as a device type (catalog entry)"),
    "run": ("running", "train a plan here: one process per planned device"),
    "lab": ("lab_profile", "the lab's commands: `lab profile` measures a model in each "
            "device type's lab confinement"),
    "coordinate": (
        "running",
        "host the control plane of a multi-host torchrun job (docs/executor.md, "
        "Across hosts)",
    ),
    "report": (
        "reporting", "a run's measurements against its plan's prediction, with Gantt charts"
    ),
    "export": (
        "exporting", "print a plan as torchtitan's or DeepSpeed's pipeline configuration"
    ),
    "demo": (
        "demo",
        "plan the demo model on the demo cluster, show it, compare the planners, run a "
        "plan here (emulated)",
    ),
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``edgepipe plan: error: argument --x: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Commands(argparse._SubParsersAction):
    """The subcommands, each parser filled in by its module (:data:`COMMANDS`) once
    argparse has chosen it and before it parses the command's arguments."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        command = values[0]  # a valid choice: argparse has checked it
        subparser = self.choices[command]
        if subparser.get_default("func") is None:  # once: a parser may parse again
            module = importlib.import_module(f"edgepipe.planner.cli.{COMMANDS[command][0]}")
            module.ARGUMENTS[command](subparser)
        super().__call__(parser, namespace, values, option_string)


class _Version(argparse._VersionAction):
    """``--version``: the installed release, looked up only when asked for."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        from importlib import metadata

        try:
            release = metadata.version("edgepipe")
        except metadata.PackageNotFoundError:
            release = "unknown (not installed)"
        self.version = f"edgepipe {release}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="edgepipe",
        description="Plan hybrid pipeline-parallel training on heterogeneous edge devices.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, action=_Commands)
    for command, (_, help_line) in COMMANDS.items():
        sub.add_parser(command, help=help_line)
    return parser


#: exit status when standard output was closed early: 128 + SIGPIPE (module docstring)
BROKEN_PIPE = 141


def _stdout_gone() -> bool:
    """Whether descriptor 1 is a pipe whose reader has gone (poll reports an error on
    its write end), so that a BrokenPipeError of any other pipe is not taken for it."""
    poll = select.poll()
    poll.register(sys.stdout.fileno(), 0)
    return any(events & select.POLLERR for _, events in poll.poll(0))


def _drop_stdout() -> None:
    """Point descriptor 1 at /dev/null after its reader went away, so that flushing what
    is still buffered at exit neither fails nor prints "Exception ignored"."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _forget_handled_interrupts() -> None:
    """Keep the exit status ours after a Ctrl-C that was caught.

    CPython 3.11 and 3.12 set a flag whenever a KeyboardInterrupt leaves code run from a
    string (``exec``/``eval``: dataclasses and namedtuples build their methods so, hundreds
    of times while torch is imported), even if a caller catches it later; under
    ``python -m`` the interpreter then ignores the status and kills itself with SIGINT at
    exit. Every string ``exec`` clears that flag when it starts, so one empty one does;
    later CPython sets the flag only for an interrupt nobody caught, and this is a no-op.
    """
    exec("pass", {})


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (module docstring).

    Returning means nothing escaped, so any Ctrl-C on the way was handled (130, or the
    one-line error of ``run``): :func:`_forget_handled_interrupts` before every return.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) or a bad argument (2, printed)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        status = args.func(args)
    except EdgepipeError as exc:
        from edgepipe.planner.cli.console import err
        from rich.markup import escape

        message = f"[bold red]error:[/bold red] {escape(str(exc))}"
        err.print(message, highlight=False, soft_wrap=True)
        status = 2
    except KeyboardInterrupt as exc:  # a command may say what it stopped
        from edgepipe.planner.cli.console import err

        said = str(exc) or "interrupted; nothing was written"
        err.print(said, highlight=False, soft_wrap=True, markup=False)
        status = 130
    except BrokenPipeError:
        if not _stdout_gone():  # another pipe's: an error like any other
            raise
        _drop_stdout()
        status = BROKEN_PIPE
    _forget_handled_interrupts()
    return 0 if status is None else status


if __name__ == "__main__":
    raise SystemExit(main())
