"""Charts as PNG bytes, drawn with matplotlib's Agg backend.

No pyplot: each chart is its own Figure on its own canvas, so charts can be drawn from several
threads at once. The same data always gives the same bytes (fixed size, fonts and DPI; no
timestamp or software version in the PNG metadata).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from datetime import date

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bot.values import MICROS, format_money

WIDTH_IN = 8.0
DPI = 100
MAX_BARS = 15
HEADROOM = 1.1
_BAR = "#3b6ea8"
_IDLE = "#d08c3a"
_FONT = "DejaVu Sans"


def bar_chart(title: str, items: Sequence[tuple[str, int]], *, currency: str = "USD") -> bytes:
    """A horizontal bar per (label, micros), largest on top; at most 15 bars, the rest summed
    into "others". Returns PNG bytes."""
    rows = _top(items)
    height = 1.2 + 0.38 * max(1, len(rows))
    figure = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    axes = figure.add_subplot()
    labels = [label for label, _ in reversed(rows)]
    values = [micros / MICROS for _, micros in reversed(rows)]
    axes.barh(range(len(values)), values, color=_BAR)
    axes.set_yticks(range(len(labels)), labels, fontsize=9, fontfamily=_FONT)
    axes.xaxis.set_major_formatter(_money_axis(currency))
    for index, (_, micros) in enumerate(reversed(rows)):
        axes.annotate(
            format_money(micros, currency),
            (micros / MICROS, index),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            fontfamily=_FONT,
        )
    axes.margins(x=0.18)
    _finish(figure, axes, title)
    return _png(figure)


def daily_chart(
    title: str,
    days: Sequence[tuple[date, int, int]],
    *,
    currency: str = "USD",
) -> bytes:
    """Spend per day as stacked columns: (day, active micros, idle micros). Returns PNG bytes."""
    figure = Figure(figsize=(WIDTH_IN, 3.6), dpi=DPI)
    axes = figure.add_subplot()
    positions = list(range(len(days)))
    active = [micros / MICROS for _, micros, _ in days]
    idle = [micros / MICROS for _, _, micros in days]
    axes.bar(positions, active, color=_BAR, label="in use")
    axes.bar(positions, idle, bottom=active, color=_IDLE, label="idle")
    labels = [day.strftime("%d") for day, _, _ in days]
    axes.set_xticks(positions, labels, fontsize=7, fontfamily=_FONT)
    axes.yaxis.set_major_formatter(_money_axis(currency))
    highest = max((a + i for a, i in zip(active, idle, strict=True)), default=0.0)
    axes.set_ylim(0, highest * HEADROOM if highest > 0 else 1.0)
    # Above the plot, right-aligned, so no column hides under it.
    axes.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncols=2,
        fontsize=8,
        frameon=False,
        borderaxespad=0.2,
    )
    _finish(figure, axes, title)
    return _png(figure)


def _top(items: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    ordered = sorted(items, key=lambda item: (-item[1], item[0]))
    if len(ordered) <= MAX_BARS:
        return ordered
    head = ordered[: MAX_BARS - 1]
    rest = sum(micros for _, micros in ordered[MAX_BARS - 1 :])
    return [*head, (f"{len(ordered) - MAX_BARS + 1} others", rest)]


def _money_axis(currency: str) -> FuncFormatter:
    def label(value: float, _position: int) -> str:
        text = format_money(round(value * MICROS), currency)
        # Axis ticks are round numbers: "$500", not "$500.00".
        return re.sub(r"\.0+(?= |$)", "", text)

    return FuncFormatter(label)


def _finish(figure: Figure, axes: Axes, title: str) -> None:
    figure.suptitle(title, fontsize=11, fontfamily=_FONT)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    figure.tight_layout()


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
