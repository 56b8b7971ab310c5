"""Charts: real PNGs from matplotlib, deterministic, bounded, with readable money axes, and
Chinese names drawn in a CJK font rather than as empty boxes."""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable
from datetime import date, timedelta

import numpy as np
import pytest
from matplotlib import font_manager, image
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from bot import charts
from bot.i18n import speaking

USD = 1_000_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def pixels(png: bytes) -> np.ndarray:
    assert png.startswith(PNG_MAGIC)
    return np.asarray(image.imread(io.BytesIO(png), format="png"))


def test_bar_chart_is_a_png_whose_height_follows_the_bars() -> None:
    small = pixels(charts.bar_chart("Spend", [("alice", 2016 * USD), ("bob", 533_740_000)]))
    large = pixels(charts.bar_chart("Spend", [(f"u{i}", (i + 1) * USD) for i in range(15)]))
    assert small.shape[1] == large.shape[1] == int(charts.WIDTH_IN * charts.DPI)
    assert small.shape[0] < large.shape[0]
    # Something is drawn: the bar colour (#3b6ea8) appears.
    bar = np.array([0x3B, 0x6E, 0xA8]) / 255
    assert (np.abs(small[:, :, :3] - bar).max(axis=2) < 0.02).any()


def test_same_data_gives_the_same_bytes() -> None:
    items = [("alice", 5 * USD), ("bob", 3 * USD)]
    assert charts.bar_chart("Spend", items) == charts.bar_chart("Spend", list(reversed(items)))


def test_more_than_fifteen_groups_end_in_others() -> None:
    items = [(f"user{i:02}", (100 - i) * USD) for i in range(40)]
    top = charts._top(items)
    assert len(top) == charts.MAX_BARS
    assert top[0] == ("user00", 100 * USD)
    assert top[-1] == ("26 others", sum((100 - i) * USD for i in range(14, 40)))
    assert sum(micros for _, micros in top) == sum(micros for _, micros in items)


def test_daily_chart_draws_a_month_and_an_empty_day() -> None:
    start = date(2026, 3, 1)
    days = [(start + timedelta(days=i), (i % 7) * 10 * USD, i * USD, USD, 0) for i in range(31)]
    png = charts.daily_chart("Per day", days)
    assert pixels(png).shape[1] == int(charts.WIDTH_IN * charts.DPI)
    empty = charts.daily_chart("Per day", [(start, 0, 0, 0, 0)])
    assert empty.startswith(PNG_MAGIC)


def drawn(figure: Figure) -> dict[str, float]:
    """The height of each labelled bar series drawn in ``figure``, summed over its columns."""
    (axes,) = figure.axes
    return {
        str(container.get_label()): sum(bar.get_height() for bar in container.patches)
        for container in axes.containers
        if isinstance(container, BarContainer)
    }


def colour_present(png: bytes, colour: str) -> bool:
    wanted = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)]) / 255
    return bool((np.abs(pixels(png)[:, :, :3] - wanted).max(axis=2) < 0.02).any())


def test_daily_chart_stacks_in_use_idle_and_not_measured_apart() -> None:
    start = date(2026, 3, 1)
    # A month with nothing running but a host that did not answer: all of it not measured.
    dark = [(start, 0, 0, 999_700_000, 0)]
    series = charts.daily_series(dark)
    assert [(one.label, one.micros) for one in series] == [
        ("in use", (0,)),
        ("idle", (0,)),
        ("not measured", (999_700_000,)),
    ]
    assert drawn(charts.daily_figure("Per day", dark)) == {
        "in use": 0.0,
        "idle": 0.0,
        "not measured": 999.7,
    }
    png = charts.daily_chart("Per day", dark)
    assert colour_present(png, charts._UNMEASURED)
    days = [(start + timedelta(days=i), 3 * USD, i * USD, 2 * USD, 10_000) for i in range(3)]
    series = charts.daily_series(days)
    assert [one.label for one in series] == ["in use", "idle", "not measured", "storage"]
    assert [sum(one.micros) for one in series] == [9 * USD, 3 * USD, 6 * USD, 30_000]
    assert drawn(charts.daily_figure("Per day", days)) == pytest.approx(
        {"in use": 9.0, "idle": 3.0, "not measured": 6.0, "storage": 0.03}
    )
    png = charts.daily_chart("Per day", days)
    for colour in (charts._BAR, charts._IDLE, charts._UNMEASURED, charts._STORAGE):
        assert colour_present(png, colour), colour


def test_money_axis_drops_zero_cents() -> None:
    usd = charts._money_axis("USD")
    assert usd(500.0, 0) == "$500"
    assert usd(1500.0, 0) == "$1,500"
    assert usd(2.5, 0) == "$2.50"
    chf = charts._money_axis("CHF")
    assert chf(500.0, 0) == "500 CHF"


# --- Chinese, Japanese and Korean names ------------------------------------------------------

CHINESE_PROJECT = "训练集群"
NO_CJK_FONT = (
    "No CJK font is installed (none of {families}), so Chinese names draw as empty boxes. "
    "Install Debian's fonts-noto-cjk (apt-get install fonts-noto-cjk), as .ci/run and "
    "deploy/Dockerfile do."
)


def missing_glyphs(draw: Callable[[], bytes]) -> list[str]:
    """The "Glyph ... missing from font(s)" warnings matplotlib gives while ``draw`` runs."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert draw().startswith(PNG_MAGIC)  # the chart draws whatever the fonts
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


def draw_chinese() -> bytes:
    days = [(date(2026, 3, 1), 3 * USD, USD, USD, 0)]
    bars = charts.bar_chart(f"{CHINESE_PROJECT} 三月", [(CHINESE_PROJECT, 5 * USD)], currency="CNY")
    return charts.daily_chart(f"{CHINESE_PROJECT} 每日", days, currency="CNY") + bars


def test_chinese_project_names_draw_with_every_glyph(caplog: pytest.LogCaptureFixture) -> None:
    families = charts.font_families()
    if not set(families) & set(charts.CJK_FAMILIES):
        pytest.fail(NO_CJK_FONT.format(families=", ".join(charts.CJK_FAMILIES)))
    caplog.set_level(logging.WARNING, logger="matplotlib")
    assert missing_glyphs(draw_chinese) == []
    # Only installed families are asked for: no "findfont: Font family ... not found" lines.
    assert [r.getMessage() for r in caplog.records if "findfont" in r.getMessage()] == []


def test_a_latin_only_font_list_is_caught_missing_the_chinese(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(charts, "font_families", lambda: [charts.LATIN_FAMILY])
    missing = missing_glyphs(draw_chinese)
    assert any("CJK UNIFIED IDEOGRAPH" in message for message in missing), missing


def draw_with_legend_and_others() -> bytes:
    days = [(date(2026, 3, 1) + timedelta(days=i), 3 * USD, i * USD, USD, USD) for i in range(3)]
    many = [(f"user{i:02}", (30 - i) * USD) for i in range(20)]
    title = "2026年3月 每日 GPU 花费"
    return charts.daily_chart(title, days, currency="CNY") + charts.bar_chart(title, many)


def test_the_legend_and_the_others_bar_are_chinese_with_every_glyph(
    caplog: pytest.LogCaptureFixture,
) -> None:
    families = charts.font_families()
    if not set(families) & set(charts.CJK_FAMILIES):
        pytest.fail(NO_CJK_FONT.format(families=", ".join(charts.CJK_FAMILIES)))
    caplog.set_level(logging.WARNING, logger="matplotlib")
    english = draw_with_legend_and_others()
    with speaking("zh"):
        assert charts._top([(f"u{i:02}", USD) for i in range(40)])[-1][0] == "其他 26 项"
        assert missing_glyphs(draw_with_legend_and_others) == []
        chinese = draw_with_legend_and_others()
    assert chinese != english
    assert [r.getMessage() for r in caplog.records if "findfont" in r.getMessage()] == []


def test_money_axis_ticks_share_their_decimals() -> None:
    # Ticks from 2.5 cents to 12 cents read $0.0250 ... $0.12 one tick at a time.
    assert charts.tick_labels([0.0, 0.025, 0.05, 0.075, 0.1, 0.125]) == [
        "$0.000",
        "$0.025",
        "$0.050",
        "$0.075",
        "$0.100",
        "$0.125",
    ]
    assert charts.tick_labels([0.0, 0.02, 0.04, 0.12]) == ["$0.00", "$0.02", "$0.04", "$0.12"]
    assert charts.tick_labels([0.0, 500.0, 1500.0]) == ["$0", "$500", "$1,500"]
    assert charts.tick_labels([0.0, 0.5], "CHF") == ["0.00 CHF", "0.50 CHF"]


def test_a_drawn_axis_labels_every_tick_alike() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure()
    axes = figure.add_subplot()
    axes.barh([0, 1, 2], [0.025, 0.12, 0.06])
    axes.xaxis.set_major_formatter(charts._money_axis("USD"))
    FigureCanvasAgg(figure).draw()
    labels = [tick.get_text() for tick in axes.get_xticklabels()]
    assert labels
    assert {len(label.split(".")[1]) for label in labels} == {2}


def test_a_currency_without_decimals_labels_every_tick_with_its_amount() -> None:
    # Yen have no decimals: each tick shows its own amount, never "0 JPY" on every one.
    assert charts.tick_labels([0.0, 500.0, 1500.0], "JPY") == ["0 JPY", "500 JPY", "1,500 JPY"]
    with speaking("zh"):
        assert charts.tick_labels([0.0, 500.0], "JPY") == ["JP¥0", "JP¥500"]


def test_the_amounts_on_the_bars_are_rounded_as_the_spend_message_rounds_money() -> None:
    # A release billed partly at an earlier price sums to 3.999445 dollars: the bar says $4.00.
    assert charts.bar_labels([3_999_445, 50_000]) == ["$4.00", "$0.05"]
    assert charts.bar_labels([300, 50_000]) == ["$0.0003", "$0.0500"]
    assert charts.bar_labels([1_200_000_000], "JPY") == ["1,200 JPY"]


def test_the_font_make_puts_in_the_environment_draws_chinese_without_a_system_font(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`make` takes Noto Sans CJK SC from PyPI into the environment: on a machine with no CJK
    font of its own, the charts find it there and draw Chinese."""
    bundled = charts.BUNDLED_FONT_DIR / "NotoSansCJKsc-Regular.otf"
    assert bundled.is_file(), "make test puts the CJK font in the environment"
    manager = font_manager.fontManager
    latin_only = [f for f in manager.ttflist if f.name not in charts.CJK_FAMILIES]
    monkeypatch.setattr(manager, "ttflist", latin_only)
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [])
    monkeypatch.setattr(charts, "_families", None)
    assert charts.font_families() == [charts.LATIN_FAMILY, "Noto Sans CJK SC"]
    assert any(f.fname == str(bundled) for f in manager.ttflist)
