"""Charts as PNG bytes, drawn with matplotlib's Agg backend.

No pyplot: each chart is its own Figure on its own canvas, so charts can be drawn from several
threads at once. The same data always gives the same bytes (fixed size, fonts and DPI; no
timestamp or software version in the PNG metadata) on the same fonts and language (the legend
and the "others" bar are in the active language of :mod:`bot.i18n`). Text is set in DejaVu Sans,
and each character it lacks (Chinese, Japanese, Korean) in the first installed CJK family that
has it: the Noto Sans CJK SC that `make` puts in the environment (:data:`BUNDLED_FONT_DIR`),
else a system one such as Debian's ``fonts-noto-cjk``; with none the chart still draws, those
characters as empty boxes.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from babel.numbers import get_currency_precision
from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import Formatter

from bot.i18n import t
from bot.values import MICROS, format_money

WIDTH_IN = 8.0
DPI = 100
MAX_BARS = 15
HEADROOM = 1.1
_BAR = "#3b6ea8"
_IDLE = "#d08c3a"
_UNMEASURED = "#a6a6a6"
_STORAGE = "#6a9f6a"
#: Latin, Greek and Cyrillic; matplotlib ships it, so it is always there.
LATIN_FAMILY = "DejaVu Sans"
#: Where `make` puts the CJK font it takes from PyPI (Noto Sans CJK SC, SIL OFL 1.1), in the
#: environment the bot runs in: found without any system font package.
BUNDLED_FONT_DIR = Path(sys.prefix) / "share" / "gpubot-fonts"
#: Families for what DejaVu Sans lacks, in order of preference: Debian's fonts-noto-cjk
#: (Simplified Chinese forms first), then fonts-wqy-zenhei and fonts-wqy-microhei.
CJK_FAMILIES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Source Han Sans SC",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
)


def bar_chart(title: str, items: Sequence[tuple[str, int]], *, currency: str = "USD") -> bytes:
    """A horizontal bar per (label, micros), largest on top; at most 15 bars, the rest summed
    into "others"; the amounts on the bars (as the spend message rounds them, :func:`bar_labels`)
    and the axis each with one number of decimals. Returns PNG bytes."""
    rows = _top(items)
    family = font_families()
    height = 1.2 + 0.38 * max(1, len(rows))
    figure = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    axes = figure.add_subplot()
    labels = [label for label, _ in reversed(rows)]
    values = [micros / MICROS for _, micros in reversed(rows)]
    axes.barh(range(len(values)), values, color=_BAR)
    axes.set_yticks(range(len(labels)), labels, fontsize=9, fontfamily=family)
    axes.xaxis.set_major_formatter(_money_axis(currency))
    amounts = bar_labels([micros for _, micros in reversed(rows)], currency)
    for index, (_, micros) in enumerate(reversed(rows)):
        axes.annotate(
            amounts[index],
            (micros / MICROS, index),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
            fontfamily=family,
        )
    axes.margins(x=0.18)
    _finish(figure, axes, title, family)
    return _png(figure)


#: One day of :func:`daily_chart`: (day, compute in use, idle, not measured, storage), micros.
DayColumn = tuple[date, int, int, int, int]


@dataclass(frozen=True)
class Series:
    """One stacked series of :func:`daily_chart`: its legend label, colour and micros per day."""

    label: str
    color: str
    micros: tuple[int, ...]


def daily_series(days: Sequence[DayColumn]) -> list[Series]:
    """The series :func:`daily_chart` stacks, bottom first: compute in use, idle and not
    measured, always; storage when any day has some. Each adds up to its column of ``days``."""
    series = [
        Series(t("in use"), _BAR, tuple(day[1] for day in days)),
        Series(t("idle"), _IDLE, tuple(day[2] for day in days)),
        Series(t("not measured"), _UNMEASURED, tuple(day[3] for day in days)),
    ]
    storage = tuple(day[4] for day in days)
    if any(storage):
        series.append(Series(t("storage"), _STORAGE, storage))
    return series


def daily_chart(
    title: str,
    days: Sequence[DayColumn],
    *,
    currency: str = "USD",
) -> bytes:
    """Spend per day as stacked columns (:func:`daily_series`) from ``days``: (day, compute in
    use, idle, not measured, storage) in micros. Returns PNG bytes."""
    return _png(daily_figure(title, days, currency=currency))


def daily_figure(title: str, days: Sequence[DayColumn], *, currency: str = "USD") -> Figure:
    """The figure :func:`daily_chart` draws: one bar container per series, labelled."""
    family = font_families()
    figure = Figure(figsize=(WIDTH_IN, 3.6), dpi=DPI)
    axes = figure.add_subplot()
    positions = list(range(len(days)))
    series = daily_series(days)
    bottom = [0.0] * len(days)
    for one in series:
        values = [micros / MICROS for micros in one.micros]
        axes.bar(positions, values, bottom=bottom, color=one.color, label=one.label)
        bottom = [low + value for low, value in zip(bottom, values, strict=True)]
    labels = [day[0].strftime("%d") for day in days]
    axes.set_xticks(positions, labels, fontsize=7, fontfamily=family)
    axes.yaxis.set_major_formatter(_money_axis(currency))
    highest = max(bottom, default=0.0)
    axes.set_ylim(0, highest * HEADROOM if highest > 0 else 1.0)
    # Above the plot, right-aligned, so no column hides under it.
    axes.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncols=len(series),
        prop={"family": family, "size": 8},
        frameon=False,
        borderaxespad=0.2,
    )
    _finish(figure, axes, title, family)
    return figure


def cjk_font_missing() -> str | None:
    """What is wrong when no CJK font is found (Chinese in the charts draws as empty boxes),
    with what to do; None when one is."""
    if len(font_families()) > 1:
        return None
    return (
        f"no CJK font found (none of {', '.join(CJK_FAMILIES)}): Chinese in the charts draws "
        f"as empty boxes; `make` puts one in {BUNDLED_FONT_DIR}, or install fonts-noto-cjk"
    )


def font_families() -> list[str]:
    """The family list every text in a chart is set in: DejaVu Sans, then the installed ones
    of :data:`CJK_FAMILIES` (matplotlib takes each character from the first that has it).
    Fonts installed after matplotlib cached its font list are found too: when no CJK family is
    known, the system's font files matplotlib has not seen are added once per process."""
    global _families
    with _FAMILIES_LOCK:
        if _families is None:
            installed = _known_families()
            if not installed & set(CJK_FAMILIES):
                _add_font_files(sorted(BUNDLED_FONT_DIR.glob("*.otf")))
                installed = _known_families()
            if not installed & set(CJK_FAMILIES):
                _add_font_files(font_manager.findSystemFonts())
                installed = _known_families()
            _families = (LATIN_FAMILY, *(name for name in CJK_FAMILIES if name in installed))
        return list(_families)


def _top(items: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    ordered = sorted(items, key=lambda item: (-item[1], item[0]))
    if len(ordered) <= MAX_BARS:
        return ordered
    head = ordered[: MAX_BARS - 1]
    rest = sum(micros for _, micros in ordered[MAX_BARS - 1 :])
    return [*head, (t("{n} others", n=len(ordered) - MAX_BARS + 1), rest)]


def tick_labels(values: Sequence[float], currency: str = "USD") -> list[str]:
    """Money axis labels for tick ``values`` (currency units), all with the same decimals: none
    when every tick is a whole amount (``$0``, ``$500``, ``$1,000``), else the fewest from 2
    to 6 that show every tick exactly (``$0.000``, ``$0.025`` ... ``$0.125``)."""
    decimals = _decimals(values)
    return [_tick(value, decimals, currency) for value in values]


def bar_labels(amounts: Sequence[int], currency: str = "USD") -> list[str]:
    """The amounts written on bars (micro-units), all with the same decimals and rounded as
    format_money rounds money: the currency's own (``$4.00`` for 3.999445 dollars, ``¥1,200``)
    when any bar reaches 0.10, else 4 (``$0.0003``)."""
    small = all(abs(micros) < MICROS // 10 for micros in amounts)
    digits = 4 if small else get_currency_precision(currency.upper())
    return [format_money(micros, currency, digits=digits) for micros in amounts]


def _tick(value: float, decimals: int, currency: str) -> str:
    """``value`` with ``decimals`` decimals, marked as format_money marks ``currency``."""
    micros = round(value * MICROS)
    if abs(value) < 0.5 * 10**-decimals:
        micros = 0  # no "-0.00"
    return format_money(micros, currency, digits=decimals)


def _decimals(values: Sequence[float]) -> int:
    def exact(value: float, digits: int) -> bool:
        scaled = value * 10**digits
        return bool(abs(scaled - round(scaled)) < 1e-6)

    if all(exact(value, 0) for value in values):
        return 0
    return next((d for d in range(2, 7) if all(exact(value, d) for value in values)), 6)


class _MoneyFormatter(Formatter):
    """Tick labels of a money axis, the same decimals on every tick (:func:`tick_labels`)."""

    def __init__(self, currency: str) -> None:
        self.currency = currency
        #: Set from all the ticks at once; None: a label asked for alone decides for itself.
        self.decimals: int | None = None

    def set_locs(self, locs: list[float]) -> None:
        super().set_locs(locs)
        self.decimals = _decimals(list(locs))

    def __call__(self, x: float, pos: int | None = None) -> str:
        decimals = _decimals([x]) if self.decimals is None else self.decimals
        return _tick(x, decimals, self.currency)


def _money_axis(currency: str) -> Formatter:
    return _MoneyFormatter(currency)


_FAMILIES_LOCK = threading.Lock()
_families: tuple[str, ...] | None = None


def _known_families() -> set[str]:
    return {font.name for font in font_manager.fontManager.ttflist}


def _add_font_files(paths: Sequence[str | Path]) -> None:
    """Add the font files matplotlib has not seen."""
    seen = {font.fname for font in font_manager.fontManager.ttflist}
    for path in map(str, paths):
        if path in seen:
            continue
        try:
            font_manager.fontManager.addfont(path)
        except (OSError, RuntimeError, ValueError):
            continue  # a file FreeType cannot read is left out, as matplotlib itself does


def _finish(figure: Figure, axes: Axes, title: str, family: list[str]) -> None:
    figure.suptitle(title, fontsize=11, fontfamily=family)
    axes.tick_params(labelfontfamily=family)
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    figure.tight_layout()


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
