"""Prices and amounts typed into commands are read in the configured currency: a decimal comma is
a decimal comma, and a price in another currency changes nothing."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlmodel import select

from agents import specs
from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import UsageError
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.money import price_tables
from bot.store.db import Database
from bot.store.models import Instance
from tests.bot.services.support import Clock, make_runtime

REGISTRY = build_registry()
OWNER = Caller("UOWNER", "COPS")


def run(rt: Runtime, text: str) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, OWNER, args)


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 12, 2, 12, 0))


def test_a_decimal_comma_is_a_decimal_point(sqlite_db: Database, clock: Clock) -> None:
    rt = make_runtime(sqlite_db, clock)
    reply = run(rt, "estimate --gpu 4090 --hours 10 --price 2,10/h")
    assert "hourly $2.10/h (as given)" in reply.text + str(reply.blocks)
    assert "$21.00" in str(reply.blocks)


def test_chinese_prices_in_yuan(sqlite_db: Database, clock: Clock) -> None:
    rt = make_runtime(sqlite_db, clock, currency="CNY")
    shown = str(run(rt, "estimate --gpu 4090 --hours 10 --price 1.98元/小时").blocks)
    assert "hourly 1.98 CNY/h (as given)" in shown


@pytest.mark.parametrize(
    ("currency", "command", "message"),
    [
        ("CNY", "register box root@h --gpu a100 --price $1.98/h", "is in dollars"),
        ("USD", "register box root@h --gpu a100 --price ¥2/h", "is in CNY or JPY"),
        ("USD", "register box root@h --gpu a100 --price 2元/小时", "is in CNY"),
        ("USD", "register box root@h --gpu a100 --price 2,1000/h", "ambiguous"),
        ("CNY", "adopt lambda i-1 box --price $1/h", "is in dollars"),
        ("USD", "rent lambda gpu_1x_a10 --price 1,2,3/h", "ambiguous"),
        (
            "USD",
            "register box root@h --gpu a100 --price 2/h --disk 100 --storage 0.10元/GB-month",
            "is in CNY",
        ),
    ],
)
def test_a_price_in_another_currency_changes_nothing(
    sqlite_db: Database, clock: Clock, currency: str, command: str, message: str
) -> None:
    rt = make_runtime(sqlite_db, clock, currency=currency)
    with pytest.raises(UsageError, match=message):
        run(rt, command)
    with sqlite_db.session() as session:
        assert list(session.exec(select(Instance))) == []


def test_the_ideographic_space_separates_words(sqlite_db: Database, clock: Clock) -> None:
    rt = make_runtime(sqlite_db, clock, currency="CNY")
    reply = run(
        rt, "estimate\u3000--gpu 4090\u3000--hours\u300010\u3000--price '1.98\u3000元/小时'"
    )
    assert "hourly 1.98 CNY/h (as given)" in str(reply.blocks)


# --- the price table of the configured currency -------------------------------------------------


def test_estimate_quotes_the_yuan_table_when_the_currency_is_cny(
    sqlite_db: Database, clock: Clock
) -> None:
    rt = make_runtime(sqlite_db, clock, currency="CNY")
    shown = str(run(rt, "estimate --gpu 4090 --hours 100").blocks)
    assert "*166.00 CNY* a month" in shown
    assert "hourly 1.66 CNY/h (Compshare RTX 4090, 2026, unverified)" in shown
    assert "$" not in shown
    with speaking("zh"):
        chinese = str(run(rt, "estimate --gpu a100 --hours 10").blocks)
    assert "¥50.00" in chinese
    assert "AutoDL A100" in chinese


def test_fit_quotes_the_yuan_table_when_the_currency_is_cny(
    sqlite_db: Database, clock: Clock
) -> None:
    rt = make_runtime(sqlite_db, clock, currency="CNY")
    shown = str(run(rt, "fit 7b inference").blocks)
    assert "from 1.66 CNY/h on Compshare" in shown
    assert "$" not in shown
    assert "Compshare RTX 4090" in shown
    assert "runpod" not in shown
    assert "no price table" not in shown


def test_usd_keeps_the_dollar_table(sqlite_db: Database, clock: Clock) -> None:
    rt = make_runtime(sqlite_db, clock)
    assert "hourly $0.69/h (RunPod RTX 4090" in str(
        run(rt, "estimate --gpu 4090 --hours 100").blocks
    )
    fit = str(run(rt, "fit 7b inference").blocks)
    assert "$0.69/h on RunPod RTX 4090" in fit
    assert "优云智算" not in fit


def test_without_a_table_in_the_currency_no_price_is_quoted(
    sqlite_db: Database, clock: Clock
) -> None:
    rt = make_runtime(sqlite_db, clock, currency="EUR")
    with pytest.raises(UsageError, match="no price table in EUR") as caught:
        run(rt, "estimate --gpu 4090 --hours 10")
    assert "--price" in (caught.value.hint or "")
    given = str(run(rt, "estimate --gpu 4090 --hours 10 --price 2/h").blocks)
    assert "€20.00" in given
    assert "has tables in USD, CNY" in given
    assert "$" not in given
    fit = str(run(rt, "fit 7b inference").blocks)
    assert "/h on" not in fit
    assert "no price table in EUR (GPUBOT_CURRENCY)" in fit


def test_every_price_file_reads_and_names_catalogue_gpus() -> None:
    keys = {spec.key for spec in specs.load_catalogue()}
    assert price_tables.currencies() == ("USD", "CNY")
    table = price_tables.table_for("cny")
    assert table is not None
    assert table.currency == "CNY"
    rows = (*table.hourly, *table.monthly, *table.purchase)
    assert rows
    assert all(row.gpu in keys and not row.verified and row.source for row in rows)
    assert price_tables.table_for("EUR") is None
