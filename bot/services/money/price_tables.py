"""The price tables by currency: ``bot/data/prices.json`` (its own currency, USD) and one file a
currency more, ``bot/data/prices_<code>.json`` (``prices_cny.json``: yuan on the Chinese
platforms). `/gpu fit` and `/gpu estimate` quote the table of the configured currency and none
where there is no table in it (they never quote another currency's prices as if they were in
it). Every table shares the model shapes of ``prices.json``.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from bot.errors import UsageError
from bot.services.money import advice

#: The price files of the currencies other than the main table's, by ISO 4217 code.
_FILE = "data/prices_{code}.json"


def table_for(currency: str) -> advice.PriceTable | None:
    """The packaged price table in ``currency`` (an ISO 4217 code), or None where the bot has
    none. Raises ValueError if the packaged file is malformed."""
    code = currency.strip().upper()
    main = advice.load_price_table()
    if code == main.currency:
        return main
    return _other_table(code)


def unpriced(currency: str) -> advice.PriceTable:
    """A table in ``currency`` without a single price: the model shapes alone."""
    return advice.PriceTable(
        hourly=(),
        monthly=(),
        purchase=(),
        models=advice.load_price_table().models,
        currency=currency.strip().upper(),
    )


def currencies() -> tuple[str, ...]:
    """The currencies the bot has a price table in, the main table's first."""
    main = advice.load_price_table().currency
    others = sorted(
        path.name.removeprefix("prices_").removesuffix(".json").upper()
        for path in resources.files("bot").joinpath("data").iterdir()
        if path.name.startswith("prices_") and path.name.endswith(".json")
    )
    return (main, *(code for code in others if code != main))


@cache
def _other_table(code: str) -> advice.PriceTable | None:
    source = resources.files("bot").joinpath(_FILE.format(code=code.lower()))
    if not source.is_file():
        return None
    name = f"bot/{_FILE.format(code=code.lower())}"
    data = json.loads(source.read_text(encoding="utf-8"))
    if str(data.get("currency", "")).upper() != code:
        raise ValueError(f"{name} is not in {code}")
    try:
        return advice.PriceTable(
            hourly=tuple(
                advice.price_row(item, "per_hour", code) for item in data.get("hourly", ())
            ),
            monthly=tuple(
                advice.price_row(item, "per_month", code) for item in data.get("monthly", ())
            ),
            purchase=tuple(
                advice.price_row(item, "price", code) for item in data.get("purchase", ())
            ),
            models=advice.load_price_table().models,
            currency=code,
        )
    except (KeyError, TypeError, UsageError) as exc:
        raise ValueError(f"{name} is malformed: {exc}") from exc
