"""Prices and amounts typed into commands are read in the configured currency: a decimal comma is
a decimal comma, and a price in another currency changes nothing."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlmodel import select

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import UsageError
from bot.runtime import Runtime
from bot.services.access import Caller
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
