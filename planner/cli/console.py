"""Where and how every command prints: standard output and standard error as rich
consoles, one-line warnings, tables that fit the terminal (else one labelled line per
row) and progress bars for the solvers and the profiler."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from rich.progress import Progress

out = Console()
err = Console(stderr=True)



def warn(text: str) -> None:
    """Print ``warning: text`` to stderr as one line, whatever the terminal's width, and
    verbatim (no markup: ``[0, 6)`` and device ids stay as written)."""
    err.print(f"warning: {text}", highlight=False, soft_wrap=True, markup=False)


def compact_table(**options: Any) -> Table:
    """A rich table (``options`` as :class:`rich.table.Table`'s) with no vertical rules and
    no outer padding, so that it fits 80 columns."""
    return Table(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False,
                 title_justify="left", **options)


def unbroken_width(table: Table) -> int:
    """Columns needed to print ``table`` with no word of any cell or header cut: each
    column as wide as its longest word plus the two spaces rich puts around it."""
    widths = [
        max(len(word) for cell in (column.header, *column.cells) for word in str(cell).split())
        for column in table.columns
    ]
    return sum(widths) + 2 * len(widths)


def print_table(table: Table, narrow: Callable[[], list[str]]) -> None:
    """Print ``table`` if every cell fits the terminal unbroken (rich may wrap the device
    lists), else the ``narrow`` layout: one line per row, labelled, wrapped at words."""
    if unbroken_width(table) <= out.width:
        out.print(table)
        return
    for line in narrow():
        out.print(line, highlight=False)


def progress_callback(progress: Progress, label: str) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that moves a new task of ``progress``."""
    task = progress.add_task(label, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return update
