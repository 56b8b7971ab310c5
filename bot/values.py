"""Reading the values people type: durations, times, prices, money, sizes, counts. Pure functions.

Every parser raises bot.errors.UsageError with a message that shows the accepted forms, in the
active language (bot.i18n); :func:`format_money` writes amounts as that language does (Babel).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from functools import cache
from zoneinfo import ZoneInfo

from babel import Locale
from babel.numbers import format_currency, get_currency_precision, get_currency_symbol

from bot.errors import UsageError
from bot.i18n import LOCALES, N_, Language, active_language, t

MICROS = 1_000_000

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MAX_DURATION = timedelta(days=366)
_PRICE_UNITS = {
    "": 3600,
    "h": 3600,
    "hr": 3600,
    "hrs": 3600,
    "hour": 3600,
    "hours": 3600,
    "小时": 3600,
    "个小时": 3600,
    "时": 3600,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "分钟": 60,
    "分": 60,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "秒": 1,
    "秒钟": 1,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "天": 86400,
    "日": 86400,
}
#: Chinese duration units as the letters parse_duration reads, longest first.
_CHINESE_DURATION_UNITS = (
    ("个小时", "h"),
    ("小时", "h"),
    ("分钟", "m"),
    ("秒钟", "s"),
    ("时", "h"),
    ("分", "m"),
    ("秒", "s"),
    ("天", "d"),
    ("日", "d"),
)
_DOLLARS = frozenset({"USD", "AUD", "CAD", "HKD", "NZD", "SGD", "TWD"})
#: Currency marks people type around an amount: (mark, what it is called, the codes it means),
#: longest first so ``us$`` is taken before ``$``.
_CURRENCY_MARKS: tuple[tuple[str, str, frozenset[str]], ...] = (
    ("人民币", "CNY (人民币)", frozenset({"CNY"})),
    ("us$", "USD (US$)", frozenset({"USD"})),
    ("hk$", "HKD (HK$)", frozenset({"HKD"})),
    ("rmb", "CNY (RMB)", frozenset({"CNY"})),
    ("$", N_("dollars ($)"), _DOLLARS),
    ("€", "EUR (€)", frozenset({"EUR"})),
    ("£", "GBP (£)", frozenset({"GBP"})),
    ("¥", N_("CNY or JPY (¥)"), frozenset({"CNY", "JPY"})),
    ("元", "CNY (元)", frozenset({"CNY"})),
    ("块", "CNY (块)", frozenset({"CNY"})),
    ("円", "JPY (円)", frozenset({"JPY"})),
)
_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "CNY": "¥", "JPY": "¥"}
#: Currencies English shows by their symbol (``$2.10``); any other by its code (``2.10 CHF``).
_ENGLISH_SYMBOLS = frozenset({"USD", "EUR", "GBP"})
#: Amounts under this many units keep 4 decimals (per-second prices stay readable).
_SMALL = Decimal("0.10")
_CODE = re.compile(r"^([a-z]{3})|([a-z]{3})$")
_PLAIN_NUMBER = re.compile(r"\d+\.?\d*|\.\d+")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_DECIMAL_COMMA = re.compile(r"\d+,\d{1,2}")


def whole_number(option: str, low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """A parser for ``option``'s value: a whole number from ``low`` to ``high`` (no upper bound
    when None), digits only. The parser raises UsageError naming the option and the range."""

    def parse(text: str) -> int:
        stripped = text.strip()
        if not (stripped.isascii() and stripped.isdigit()):
            raise UsageError(
                t("{option} {value!r} is not a whole number.", option=option, value=text[:20]),
                hint=t(
                    "Give {option} a number such as {example}.", option=option, example=max(low, 1)
                ),
            )
        value = int(stripped)
        if value < low:
            raise UsageError(
                t(
                    "{option} must be {low} or more, not {value}.",
                    option=option,
                    low=low,
                    value=value,
                )
            )
        if high is not None and value > high:
            raise UsageError(
                t(
                    "{option} must be {high:,} or less, not {value:,}.",
                    option=option,
                    high=high,
                    value=value,
                )
            )
        return value

    return parse


def parse_duration(text: str) -> timedelta:
    """``90m``, ``2h``, ``1h30m``, ``3d``, ``1.5h``, and in Chinese ``2小时``, ``30分钟``,
    ``1天``, ``1小时30分钟`` (spaces, the ideographic one too, are ignored) as a positive
    timedelta (at most a year). Raises UsageError."""
    raw = _clean(text).lower()
    for word, letter in _CHINESE_DURATION_UNITS:
        raw = raw.replace(word, letter)
    pos = 0
    total = Decimal(0)
    for match in _DURATION_PART.finditer(raw):
        if match.start() != pos:
            break
        total += Decimal(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if not raw or pos != len(raw):
        raise UsageError(
            t("{text!r} is not a duration", text=text),
            hint=t("Write durations like 90m, 2h, 1h30m, 3d or 2小时, 30分钟, 1天."),
        )
    seconds = int(total)
    if seconds <= 0:
        raise UsageError(
            t("{text!r} is not a positive duration", text=text), hint=t("Use at least 1s.")
        )
    if timedelta(seconds=seconds) > _MAX_DURATION:
        raise UsageError(
            t("{text!r} is longer than a year", text=text), hint=t("Use a shorter duration.")
        )
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    """A timedelta as ``2d 3h``, ``1h 30m``, ``45m``, ``30s`` (two largest units, rounded down)."""
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return sign + (" ".join(parts[:2]) if parts else "0s")


#: The days and months of :func:`format_when`, Monday and January first.
_WEEKDAYS = (N_("Mon"), N_("Tue"), N_("Wed"), N_("Thu"), N_("Fri"), N_("Sat"), N_("Sun"))
_MONTHS = (
    N_("Jan"),
    N_("Feb"),
    N_("Mar"),
    N_("Apr"),
    N_("May"),
    N_("Jun"),
    N_("Jul"),
    N_("Aug"),
    N_("Sep"),
    N_("Oct"),
    N_("Nov"),
    N_("Dec"),
)


def format_when(at: datetime, tz: ZoneInfo) -> str:
    """A naive-UTC time in ``tz`` with weekday, date, time and zone: ``Wed 03 Dec 18:00 CET``,
    in the active language. The one way every message shows a time (the presentation kit's
    ``when`` is this; a service's error text uses it too)."""
    local = at.replace(tzinfo=ZoneInfo("UTC")).astimezone(tz)
    return t(
        "{weekday} {day} {month} {time} {zone}",
        weekday=t(_WEEKDAYS[local.weekday()]),
        day=local.strftime("%d"),
        month=t(_MONTHS[local.month - 1]),
        time=local.strftime("%H:%M"),
        zone=local.strftime("%Z"),
    )


def parse_when(text: str, *, now_utc: datetime, tz: ZoneInfo) -> datetime:
    """``18:00`` (next such time in ``tz``), or ISO 8601 (``2026-12-03T18:00``, with or without
    offset; without one it is read in ``tz``). Returns naive UTC, which must lie in the future."""
    raw = text.strip()
    local_now = now_utc.replace(tzinfo=ZoneInfo("UTC")).astimezone(tz)
    at: datetime
    if re.fullmatch(r"\d{1,2}:\d{2}", raw):
        hour, minute = (int(part) for part in raw.split(":"))
        if hour > 23 or minute > 59:
            raise UsageError(
                t("{text!r} is not a time of day", text=text), hint=t("Use HH:MM, like 18:00.")
            )
        candidate = datetime.combine(local_now.date(), time(hour, minute), tzinfo=tz)
        if candidate <= local_now:
            candidate = datetime.combine(
                local_now.date() + timedelta(days=1), time(hour, minute), tzinfo=tz
            )
        at = candidate
    else:
        try:
            parsed = datetime.fromisoformat(raw)
        except ValueError as exc:
            raise UsageError(
                t("{text!r} is not a time", text=text),
                hint=t("Use HH:MM (like 18:00) or ISO 8601 (like 2026-12-03T18:00)."),
            ) from exc
        at = parsed if parsed.tzinfo else parsed.replace(tzinfo=tz)
    at_utc = at.astimezone(ZoneInfo("UTC")).replace(tzinfo=None)
    if at_utc <= now_utc:
        raise UsageError(
            t(
                "{text!r} is already past: it is now {now}.",
                text=text,
                now=format_when(now_utc, tz),
            ),
            hint=t("Give a later time (like 18:00 or 2026-12-03T18:00), or a duration."),
        )
    return at_utc


def parse_money(text: str, currency: str) -> int:
    """An amount in ``currency`` (the configured ISO 4217 code) as integer micro-units
    (non-negative, at most 6 decimals).

    Accepted: ``2.10``, ``1,200`` and ``12,345,678.5`` (a comma before groups of exactly three
    digits separates thousands), ``2,10`` and ``1,5`` (a single comma before one or two digits
    and no period is a decimal comma), a currency symbol or code before or after (``$2.10``,
    ``¥1.98``, ``￥2``, ``1.98元``, ``2.10 USD``), full-width characters and the ideographic
    space. Raises UsageError for any other comma (``2,1000``, ``1,2,3``: ambiguous) and for an
    amount that names a currency other than ``currency``.
    """
    return _amount(text, currency, shown=text, hint=_amount_hint(currency))


def parse_price(text: str, currency: str) -> int:
    """A price in ``currency`` as micro-units per hour: ``2.10/h``, ``2.10`` (per hour),
    ``$0.035/min``, ``0.0006/s``, ``48/day``, and as typed in Chinese: ``1.98元/小时``,
    ``¥1.98/h``, ``2元/时``, ``0.03元/分钟``, ``40元/天`` (per day is over 24 h). Per-minute,
    per-second and per-day prices are converted to per hour, rounded down to a whole micro-unit.
    Raises UsageError as :func:`parse_money` does, and for a unit it does not know."""
    raw = _clean(text).lower()
    amount, _, unit = raw.partition("/")
    unit_s = _PRICE_UNITS.get(unit)
    hint = t("Write prices like {examples}.", examples=_price_examples(currency))
    if unit_s is None:
        raise UsageError(t("{text!r} is not a price", text=text), hint=hint)
    return _amount(amount, currency, shown=text, hint=hint) * 3600 // unit_s


def format_money(micros: int, currency: str = "USD", *, digits: int | None = None) -> str:
    """Micro-units of ``currency`` (ISO 4217) as the active language writes money (Babel, with
    the locale's grouping): ``$2.10``, ``€2.10``, ``£2.10`` and ``2.10 CHF`` in English; ``¥12.50``,
    ``US$2.10`` in Chinese. Each currency keeps its own decimals (``1,200 JPY``); an amount under
    0.10 keeps 4 decimals so small per-second prices stay readable. ``digits`` (0 to 6) sets the
    decimals instead, for figures shown side by side (a chart's axis)."""
    code = currency.upper()
    value = Decimal(micros) / MICROS
    if digits is None:
        digits = 4 if 0 < abs(value) < _SMALL else get_currency_precision(code)
    language = active_language()
    locale = LOCALES[language]
    pattern = _money_pattern(code, language, digits)
    return format_currency(value, code, format=pattern, locale=locale, currency_digits=False)


@cache
def _money_pattern(code: str, language: Language, digits: int) -> str:
    """How ``language`` writes ``code`` with ``digits`` decimals: the locale's currency
    pattern (``¤#,##0.00``) where it shows the currency's symbol, else the number and the code
    (``#,##0.00 ¤¤``). Read from Babel once per currency, language and digits."""
    number = "#,##0" + ("." + "0" * digits if digits else "")
    locale = LOCALES[language]
    symbol = get_currency_symbol(code, locale)
    if symbol == code or (language == "en" and code not in _ENGLISH_SYMBOLS):
        return f"{number} ¤¤"
    standard = Locale.parse(locale).currency_formats["standard"].pattern
    return standard.replace("#,##0.00", number) if "#,##0.00" in standard else "¤" + number


def parse_size_gb(text: str) -> float:
    """``200``, ``200G``, ``200GB``, ``1.5T`` as gigabytes (positive)."""
    raw = text.strip().lower().removesuffix("b")
    factor = 1.0
    if raw.endswith("t"):
        factor, raw = 1000.0, raw[:-1]
    elif raw.endswith("g"):
        raw = raw[:-1]
    try:
        value = float(raw) * factor
    except ValueError as exc:
        raise UsageError(
            t("{text!r} is not a size", text=text), hint=t("Write sizes like 200 or 200GB.")
        ) from exc
    if not value > 0 or value > 10**7:
        raise UsageError(t("{text!r} is not a sensible size in GB", text=text))
    return value


def _amount(text: str, currency: str, *, shown: str, hint: str) -> int:
    """:func:`parse_money` of ``text``; errors quote ``shown`` (what was typed) and end with
    ``hint``."""
    number, named = _split_currency(text)
    _require_currency(shown, named, currency)
    value = _decimal(number, shown, hint)
    micros = value * MICROS
    if micros != micros.to_integral_value():
        raise UsageError(t("{text!r} has more than 6 decimals", text=shown), hint=hint)
    if micros > 10**15:
        raise UsageError(t("{text!r} is too large", text=shown), hint=hint)
    return int(micros)


def _clean(text: str) -> str:
    """``text`` in compatibility form (full-width digits, signs and punctuation as their plain
    forms) without any space, the ideographic space included."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def _split_currency(text: str) -> tuple[str, list[tuple[str, frozenset[str]]]]:
    """The number in ``text`` and the currency marks around it: (what each is called, the
    codes it may mean)."""
    raw = _clean(text).replace("_", "")
    marks: list[tuple[str, frozenset[str]]] = []
    found = True
    while found and raw:
        found = False
        lowered = raw.lower()
        for mark, label, codes in _CURRENCY_MARKS:
            if lowered.startswith(mark):
                raw, found = raw[len(mark) :], True
            elif lowered.endswith(mark):
                raw, found = raw[: -len(mark)], True
            if found:
                marks.append((label, codes))
                break
        if found:
            continue
        code = _CODE.search(lowered)
        rest = "" if code is None else (raw[3:] if code.group(1) else raw[:-3])
        if code is not None and (rest[:1].isdigit() or rest[-1:].isdigit()):
            named = (code.group(1) or code.group(2)).upper()
            raw = rest
            marks.append((named, frozenset({named})))
            found = True
    return raw, marks


def _require_currency(text: str, marks: list[tuple[str, frozenset[str]]], currency: str) -> None:
    for label, codes in marks:
        if currency.upper() not in codes:
            raise UsageError(
                t(
                    "{text!r} is in {named}, but amounts here are in {currency} "
                    "(GPUBOT_CURRENCY); it was not taken.",
                    text=text,
                    named=t(label),
                    currency=currency,
                ),
                hint=t(
                    "Give it in {currency}, like {examples}.",
                    currency=currency,
                    examples=_currency_examples(currency),
                ),
            )


def _decimal(number: str, text: str, hint: str) -> Decimal:
    """The number as a Decimal after the comma rules of :func:`parse_money`."""
    if number.startswith("-"):
        raise UsageError(t("{text!r} is not a non-negative amount", text=text), hint=hint)
    if _THOUSANDS.fullmatch(number):
        plain = number.replace(",", "")
    elif _DECIMAL_COMMA.fullmatch(number):
        plain = number.replace(",", ".")
    elif "," in number:
        raise UsageError(
            t(
                "{text!r} is ambiguous: a comma separates thousands before groups of 3 digits "
                "(1,200) or is a decimal comma before 1 or 2 digits (2,10)",
                text=text,
            ),
            hint=hint,
        )
    else:
        plain = number
    if not _PLAIN_NUMBER.fullmatch(plain):
        raise UsageError(t("{text!r} is not an amount", text=text), hint=hint)
    try:
        return Decimal(plain)
    except InvalidOperation as exc:  # pragma: no cover - the patterns admit only decimals
        raise UsageError(t("{text!r} is not an amount", text=text), hint=hint) from exc


def _currency_examples(currency: str) -> str:
    symbol = _SYMBOLS.get(currency.upper())
    if currency.upper() == "CNY":
        return t("1.98, ¥1.98 or 1.98元")
    if symbol:
        return t("2.10 or {symbol}2.10", symbol=symbol)
    return t("2.10 or 2.10 {currency}", currency=currency)


def _amount_hint(currency: str) -> str:
    symbol = _SYMBOLS.get(currency.upper())
    marked = f", {symbol}2.10" if symbol else f", 2.10 {currency}"
    chinese = ", 1.98元" if currency.upper() == "CNY" else ""
    return t(
        "Write amounts like 2.10, 1,200 (thousands), 2,10 (decimal comma){more}.",
        more=marked + chinese,
    )


def _price_examples(currency: str) -> str:
    if currency.upper() == "CNY":
        return t("1.98/h, ¥1.98/h, 1.98元/小时, 0.03元/分钟 or 40元/天")
    symbol = _SYMBOLS.get(currency.upper(), "")
    return t("2.10/h, {symbol}2.10/h, 0.04/min or 48/day", symbol=symbol)
