"""Where and how every command prints: standard output and standard error as rich
consoles, one-line warnings, tables that fit the terminal (else one labelled line per
row) and progress bars for the solvers and the profiler.

rich is imported when a console is first used, not when this module is: importing it
costs about 0.03 s of CPU, which ``edgepipe --version`` and ``edgepipe validate`` (one
plain line, :func:`line`) need not pay (docs/benchmarks.md, "Start-up")."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table


def _stdout_console() -> Console:
    """Standard output's console: a reader gone (``| head``) raises BrokenPipeError,
    for the CLI's exit status (:mod:`planner.cli.main`), where rich would exit with 1."""
    from rich.console import Console

    class _Stdout(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "standard output closed")

    return _Stdout()


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


class _OnFirstUse:
    """A console made by ``make`` when one of its attributes is first read or set
    (``monkeypatch.setattr(out, "width", 40)`` reaches the console)."""

    def __init__(self, make: Callable[[], Console]) -> None:
        object.__setattr__(self, "_make", make)
        object.__setattr__(self, "_made", None)

    def made(self) -> Console:
        console = object.__getattribute__(self, "_made")
        if console is None:
            console = object.__getattribute__(self, "_make")()
            object.__setattr__(self, "_made", console)
        return console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.made(), name, value)

    @property
    def width(self) -> int:
        """The console's width, a data descriptor here as on the console, so that a
        test's ``monkeypatch.setattr(out, "width", 40)`` is undone by setting it back."""
        return self.made().width

    @width.setter
    def width(self, value: int) -> None:
        self.made().width = value


if TYPE_CHECKING:
    out: Console
    err: Console
else:
    out = _OnFirstUse(_stdout_console)
    err = _OnFirstUse(_stderr_console)


def _console(proxy: Console) -> Console:
    """The console itself, for rich's own functions that take one."""
    return proxy.made() if isinstance(proxy, _OnFirstUse) else proxy


def line(text: str) -> None:
    """Print ``text`` and a newline to stdout as it is, without rich (a closed stdout
    raises BrokenPipeError, as :data:`out` does)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def warn(text: str) -> None:
    """Print ``warning: text`` to stderr as one line, whatever the terminal's width, and
    verbatim (no markup: ``[0, 6)`` and device ids stay as written)."""
    err.print(f"warning: {text}", highlight=False, soft_wrap=True, markup=False)


def compact_table(**options: Any) -> Table:
    """A rich table (``options`` as :class:`rich.table.Table`'s) with no vertical rules and
    no outer padding, so that it fits 80 columns."""
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False,
                 title_justify="left", **options)


def _fitted(table: Table, width: int) -> bool:
    """Whether ``table`` fits ``width`` columns with no word of any cell or header cut;
    where it fits only with some columns wrapped, their widths are fixed so that it does.

    rich fits a table too wide for the terminal by narrowing its widest wrappable column,
    which cuts a number or a device id there (``444021...``) while another column could
    have wrapped at a space. Instead: each column's natural width n_i (its longest line)
    and least width w_i (its longest word; n_i where the column does not wrap), and the
    table's overhead (rules, padding: its measured natural width minus the sum of the
    n_i). Fits unwrapped when
    sum(n_i) fits; else, when sum(w_i) fits, columns are capped at the largest c with
    sum(max(w_i, min(n_i, c))) within the room (water-filling: the widest columns give
    up width first, none below its longest word), found by bisection over c. O(cells x
    log(widest column))."""
    from rich.cells import cell_len
    from rich.measure import Measurement

    texts = [[out.render_str(str(c)) for c in (col.header, *col.cells)] for col in table.columns]
    natural = [max(cell_len(line) for t in col for line in t.plain.split("\n")) for col in texts]
    least = [n if column.no_wrap else max((cell_len(w) for t in col for w in t.plain.split()),
                                          default=0)
             for column, col, n in zip(table.columns, texts, natural, strict=True)]
    widest = Measurement.get(_console(out), out.options.update_width(10**6), table).maximum
    overhead = widest - sum(natural)
    room = width - overhead
    if sum(natural) <= room:
        return True
    if sum(least) > room:
        return False

    def total(cap: int) -> int:
        return sum(max(w, min(n, cap)) for w, n in zip(least, natural, strict=True))

    low, high = 0, max(natural)  # total(low) <= room < total(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if total(mid) <= room else (low, mid)
    for column, w, n in zip(table.columns, least, natural, strict=True):
        column.width = max(w, min(n, low))
    return True


def print_table(table: Table, narrow: Callable[[], list[str]]) -> None:
    """Print ``table`` if every word of its cells fits the terminal unbroken (columns
    of several words may wrap: :func:`_fitted`), else the ``narrow`` layout: one line per
    row, labelled, wrapped at words. A number or a device id is never cut."""
    if _fitted(table, out.width):
        out.print(table)
        return
    for line in narrow():
        out.print(line, highlight=False)


def progress_bars() -> Progress:
    """The progress bars of a long step, on stderr, erased when done; none where stderr
    is not a terminal (rich would leave a blank line there)."""
    from rich.progress import Progress

    return Progress(console=_console(err), transient=True, disable=not err.is_terminal)


def progress_callback(progress: Progress, label: str) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that moves a new task of ``progress``."""
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return update
