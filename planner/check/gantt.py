"""Gantt chart and text summary of a simulated iteration
(:class:`planner.check.simulator.Timeline`).

Rows, top to bottom: one per device in pipeline order (its forwards, backwards and
all-reduce), then one per network channel that carried anything (its transfers; on a
shared channel they overlap and are drawn translucent). The chart is drawn on a private
:class:`~matplotlib.figure.Figure` rendered by the Agg canvas, so it touches no global
matplotlib state (no pyplot, no backend switch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgepipe.planner.check.simulator import Interval, Timeline, WorkKind
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch


@dataclass(frozen=True)
class _Style:
    """How the boxes of one interval kind are drawn, and their legend label."""

    facecolor: str
    edgecolor: str
    label: str
    hatch: str | None = None


_STYLE: dict[WorkKind, _Style] = {
    "F": _Style("#4c72b0", "white", "forward / activations"),
    "B": _Style("#dd8452", "white", "backward / gradients"),
    "AR": _Style("#d9d9d9", "#555555", "all-reduce", hatch="///"),
}
_ROW_HEIGHT_IN = 0.42
_AXIS_IN = 0.55  # a panel's tick labels and axis label
_TITLE_LINE_IN = 0.2  # one line of a panel's title
_LEGEND_IN = 0.35
_WIDTH_IN = 12.0
_DPI = 120
_MIN_LABEL_PX = 12.0  # narrowest box that gets its micro-batch number


@dataclass(frozen=True)
class Marker:
    """A labelled vertical line at ``at_ms`` on a panel (e.g. where a recovery began)."""

    at_ms: float
    label: str


def rows(timeline: Timeline) -> list[tuple[str, tuple[Interval, ...]]]:
    """The chart's rows: (label, intervals) per device, then per used channel."""
    out: list[tuple[str, tuple[Interval, ...]]] = [
        (f"stage {p} · {d}", timeline.devices[d])
        for p, devs in enumerate(timeline.stages)
        for d in devs
    ]
    per_channel: dict[str, list[Interval]] = {}
    for t in timeline.transfers:
        for ch in t.channels:
            per_channel.setdefault(ch, []).append(
                Interval(t.kind, t.micro_batch, t.start_ms, t.end_ms)
            )
    for ch in sorted(per_channel):
        out.append((ch, tuple(sorted(per_channel[ch], key=lambda iv: iv.start_ms))))
    return out


def _busy_ms(intervals: tuple[Interval, ...]) -> float:
    """Length of the union of the intervals (overlapping transfers count once)."""
    total, end = 0.0, float("-inf")
    for iv in sorted(intervals, key=lambda iv: iv.start_ms):
        if iv.end_ms > end:
            total += iv.end_ms - max(iv.start_ms, end)
            end = iv.end_ms
    return total


def draw_gantt(timeline: Timeline, path: str | Path, title: str = "") -> None:
    """Write the Gantt chart of ``timeline`` to ``path`` (format from its suffix, e.g. PNG).

    Forward and backward boxes are coloured apart and carry their micro-batch number when
    wide enough; all-reduces are hatched; idle time is left white. The x axis is in ms.
    """
    draw_gantts([(timeline, title)], path)


def draw_gantts(
    panels: Sequence[tuple[Timeline, str]],
    path: str | Path,
    markers: Mapping[int, Sequence[Marker]] | None = None,
    own_axis: Sequence[int] = (),
) -> None:
    """Several Gantt charts (e.g. predicted and measured) stacked in one figure on a
    common time axis, each as :func:`draw_gantt` draws it, with its own title.
    ``markers[i]``: vertical lines on panel ``i``; panels listed in ``own_axis`` get a
    time axis of their own (a whole run under one iteration).

    Layout: matplotlib's constrained layout places each panel's title (above it), tick
    labels and axis label (below it) so that none overlaps another panel's; one legend
    of every kind drawn sits above the first panel, right of nothing but the figure's
    edge, so it never covers a title."""
    heights = [_ROW_HEIGHT_IN * len(rows(timeline)) for timeline, _ in panels]
    titles = [1 + title.count("\n") + 1 for _, title in panels]  # + the heading line
    height_in = _LEGEND_IN + sum(h + _AXIS_IN + _TITLE_LINE_IN * n
                                 for h, n in zip(heights, titles, strict=True))
    fig = Figure(figsize=(_WIDTH_IN, height_in), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    shared = [t.makespan_ms for i, (t, _) in enumerate(panels) if i not in own_axis]
    common = max(shared, default=0.0) or 1.0
    spans = [(t.makespan_ms or 1.0) if i in own_axis else common
             for i, (t, _) in enumerate(panels)]
    for ax, (timeline, title), span in zip(axes, panels, spans, strict=True):
        _frame(ax, timeline, title, span)
    drawn = {iv.kind for t, _ in panels for _, ivs in rows(t) for iv in ivs}
    shown = [style for kind, style in _STYLE.items() if kind in drawn]
    fig.legend(
        handles=[
            Patch(facecolor=s.facecolor, edgecolor=s.edgecolor, hatch=s.hatch, label=s.label)
            for s in shown
        ],
        loc="outside upper right",
        ncol=max(len(shown), 1),
        frameon=False,
        fontsize=8,
    )
    layout = fig.get_layout_engine()
    assert layout is not None
    layout.execute(fig)  # the panels' final sizes: which boxes have room for a label
    for i, (ax, (timeline, _), span) in enumerate(zip(axes, panels, spans, strict=True)):
        _boxes(ax, timeline, span)
        for marker in (markers or {}).get(i, ()):
            ax.axvline(marker.at_ms, color="#c44e52", linewidth=1.2, linestyle="--")
            ax.text(marker.at_ms, -0.45, f" {marker.label}", color="#c44e52", fontsize=7,
                    va="bottom", ha="left")
    fig.savefig(path)


def _frame(ax: Axes, timeline: Timeline, title: str, span: float) -> None:
    """A panel's axes, row labels and title (what the layout places)."""
    chart_rows = rows(timeline)
    n = len(chart_rows)
    ax.set_xlim(0, span)
    ax.set_ylim(n - 0.5, -0.5)  # first row on top
    ax.set_yticks(range(n), [label for label, _ in chart_rows])
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.6)
    ax.set_axisbelow(True)
    heading = (
        f"makespan {timeline.makespan_ms:.3f} ms, M = {timeline.num_micro_batches}, "
        f"{timeline.topology}"
    )
    ax.set_title(f"{title}\n{heading}" if title else heading, loc="left", fontsize=9)


def _boxes(ax: Axes, timeline: Timeline, span: float) -> None:
    """A panel's boxes, each with its micro-batch number where it has room."""
    chart_rows = rows(timeline)
    px_per_ms = (ax.transData.transform((span, 0))[0] - ax.transData.transform((0, 0))[0]) / span
    n_devices = sum(len(devs) for devs in timeline.stages)

    for y, (_, intervals) in enumerate(chart_rows):
        alpha = 1.0 if y < n_devices else 0.6
        for iv in intervals:
            style = _STYLE[iv.kind]
            ax.barh(
                y, iv.duration_ms, left=iv.start_ms, height=0.7, linewidth=0.6, alpha=alpha,
                facecolor=style.facecolor, edgecolor=style.edgecolor, hatch=style.hatch,
            )
            digits = len(str(iv.micro_batch))
            if iv.kind != "AR" and iv.duration_ms * px_per_ms >= _MIN_LABEL_PX + 6 * (digits - 1):
                ax.text(
                    iv.start_ms + iv.duration_ms / 2,
                    y,
                    str(iv.micro_batch),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white",
                )


def timeline_text(timeline: Timeline) -> str:
    """A compact text summary: makespan, then per chart row its busy time and busy %."""
    chart_rows = rows(timeline)
    width = max(len(label) for label, _ in chart_rows)
    span = timeline.makespan_ms
    n_devices = sum(len(devs) for devs in timeline.stages)
    lines = [
        f"makespan {span:.3f} ms ({len(timeline.stages)} stages, {n_devices} devices, "
        f"M = {timeline.num_micro_batches}, {timeline.topology})",
        f"{'row':<{width}}  {'busy ms':>10}  {'busy':>6}",
    ]
    for label, intervals in chart_rows:
        busy = _busy_ms(intervals)
        share = f"{100 * busy / span:5.1f}%" if span > 0 else "    -"
        lines.append(f"{label:<{width}}  {busy:>10.3f}  {share:>6}")
    return "\n".join(lines)
