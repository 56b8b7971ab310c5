"""Reading the values people type: durations, times, prices, money, sizes, counts. Pure functions.

Every parser raises bot.errors.UsageError with a message that shows the accepted forms, in the
active language (bot.i18n); :func:`format_money` writes amounts as that language does (Babel),
:func:`format_duration` and :func:`format_rate` write durations and hourly prices in its units
(``4h 32m`` and ``$2.10/h`` in English; ``4 小时 32 分`` and ``¥2.10/小时`` in Chinese).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import cache
from zoneinfo import ZoneInfo

from babel import Locale
from babel.numbers import format_currency, get_currency_precision, get_currency_symbol

from bot.errors import UsageError
from bot.i18n import LOCALES, N_, Language, active_language, speaking, t

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
#: Chinese numerals as people write small counts (``两小时``, ``三十分钟``, ``一百二十分钟``).
_CHINESE_DIGITS = {
    "零": 0,
    "\u3007": 0,  # ideographic zero
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_CHINESE_TENS = {"十": 10, "百": 100, "千": 1000}
_CHINESE_NUMERAL = re.compile("[零\u3007一二两三四五六七八九十百千]+")
#: The Chinese words of a duration's units (``个小时`` and ``钟头`` are hours too).
_CHINESE_UNIT = "(?:个小时|个钟头|小时|钟头|分钟|秒钟|天|日|时|分|秒)"
#: ``一个半小时``: a count, 个 and 半 (a half more of the unit that follows).
_AND_A_HALF = re.compile(r"(\d+)个半")
#: ``半小时``, ``半个小时``, ``半天``: half of the unit that follows.
_HALF_OF = re.compile(rf"(?<![\d.])半(?=个?{_CHINESE_UNIT})")
#: ``一天半``, ``两小时半``, ``2分半``: a count, its unit, then a half of that unit.
_UNIT_AND_A_HALF = re.compile(rf"(\d+)({_CHINESE_UNIT})半")
#: Chinese counts of ten thousand, a thousand, a hundred, a hundred million: ``1.5万`` is 15000.
_AMOUNT_MULTIPLIERS = {"万": 10_000, "千": 1_000, "百": 100, "亿": 100_000_000}
#: How storage prices name their unit (per GB-month), in English and in Chinese.
_STORAGE_UNITS = frozenset(
    {
        "",
        "gb-month",
        "gb/month",
        "gb-mo",
        "gb/mo",
        "gbmonth",
        "gb",
        "gb/月",
        "gb/个月",
        "gb-月",
        "gb·月",
        "gb月",
        "gb每月",
    }
)
#: What a duration's units are called, by language: (seconds in the unit, its name), largest
#: first. English writes ``4h 32m``; Chinese ``4 小时 32 分`` (and ``45 分钟`` when minutes are
#: all there is: :data:`_ZH_MINUTES_ALONE`).
_DURATION_UNITS: dict[Language, tuple[tuple[int, str], ...]] = {
    "en": ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")),
    "zh": ((86400, "天"), (3600, "小时"), (60, "分"), (1, "秒")),
}
_ZH_MINUTES_ALONE = "分钟"
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
#: The most characters of what was typed that a refusal echoes (then "…").
_ECHO_MAX = 40


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
    ``1天``, ``1小时30分钟``, ``1.5小时``, with Chinese numerals (``两小时``, ``三十分钟``) and
    halves (``半小时``, ``一个半小时``, ``一天半``); spaces, the ideographic one too, are ignored.
    A positive timedelta (at most a year). Raises UsageError."""
    raw = _chinese_counts(_clean(text).lower())
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


def _chinese_counts(raw: str) -> str:
    """``raw`` (clean, lower case) with Chinese numerals as digits and halves as ``.5``:
    ``一个半小时`` as ``1.5小时``, ``半天`` as ``0.5天``, ``两小时半`` as ``2.5小时``."""
    raw = _CHINESE_NUMERAL.sub(lambda match: str(_chinese_number(match.group(0))), raw)
    raw = _AND_A_HALF.sub(r"\1.5", raw)
    raw = _HALF_OF.sub("0.5", raw)
    return _UNIT_AND_A_HALF.sub(r"\1.5\2", raw).replace("钟头", "小时")


def _chinese_number(numeral: str) -> int:
    """A Chinese numeral under ten thousand as a number: ``两`` 2, ``十五`` 15, ``三十`` 30,
    ``一百零五`` 105."""
    total = current = 0
    for char in numeral:
        if char in _CHINESE_TENS:
            total += (current or 1) * _CHINESE_TENS[char]
            current = 0
        else:
            current = current * 10 + _CHINESE_DIGITS[char]
    return total + current


def format_duration(delta: timedelta, *, compact: bool = False) -> str:
    """A timedelta in the active language's units, its two largest, rounded down: ``2d 3h``,
    ``1h 30m``, ``45m``, ``30s`` in English; ``2 天 3 小时``, ``1 小时 30 分``, ``45 分钟``,
    ``30 秒`` in Chinese.

    ``compact`` writes a billed span as a bill does: ``2 h`` for whole hours, ``1 min`` for whole
    minutes under an hour, else English without spaces (``1h10m``); Chinese ``2 小时``,
    ``1 分钟``, ``1 小时 10 分``."""
    seconds = int(delta.total_seconds())
    language = active_language()
    if compact and seconds > 0 and seconds % 3600 == 0:
        return t("{n} h", n=seconds // 3600)
    if compact and 0 < seconds < 3600 and seconds % 60 == 0:
        return t("{n} min", n=seconds // 60)
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    units = _DURATION_UNITS[language]
    parts: list[tuple[int, str]] = []
    for size, unit in units:
        if seconds >= size:
            parts.append((seconds // size, unit))
            seconds %= size
    parts = parts[:2] or [(0, units[-1][1])]
    if language == "en":
        return sign + ("" if compact else " ").join(f"{n}{unit}" for n, unit in parts)
    if len(parts) == 1 and parts[0][1] == "分":
        parts = [(parts[0][0], _ZH_MINUTES_ALONE)]
    return sign + " ".join(f"{n} {unit}" for n, unit in parts)


def duration_code(delta: timedelta) -> str:
    """A timedelta as English writes it (``1h 30m``), whatever the active language: for text
    the store keeps and compares (a prompt's resolution ``extended_1h 30m``), which
    :func:`parse_duration` reads back."""
    with speaking("en"):
        return format_duration(delta)


def spoken_duration(code: str) -> str:
    """A :func:`duration_code` (``1h 30m``) in the active language (``1 小时 30 分``); the text
    as it is when it is not a duration."""
    try:
        return format_duration(parse_duration(code))
    except UsageError:
        return code


def format_rate(micros_per_hour: int, currency: str) -> str:
    """An hourly price in the active language: ``$2.10/h`` in English, ``¥2.10/小时`` in
    Chinese (:func:`format_money` for the amount)."""
    return t("{price}/h", price=format_money(micros_per_hour, currency))


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
    space, and Chinese counts after the number (``1.5万`` 15000, ``3千`` 3000, ``2百`` 200,
    ``1亿``). Raises UsageError for any other comma (``2,1000``, ``1,2,3``: ambiguous) and for an
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


def parse_storage_price(text: str, currency: str) -> int:
    """A disk's price in ``currency`` as micro-units per GB-month: ``0.10/GB-month``,
    ``0.10/GB/month``, ``0.10``, and as typed in Chinese ``0.35元/GB/月``, ``¥0.35/GB/月``,
    ``0.35元每GB每月``. Raises UsageError for another unit, and as :func:`parse_money` does."""
    raw = _clean(text).lower()
    if "/" not in raw:
        raw = raw.replace("每", "/")
    amount, _, unit = raw.partition("/")
    if unit not in _STORAGE_UNITS:
        shown = text if len(text) <= _ECHO_MAX else text[:_ECHO_MAX] + "…"
        raise UsageError(
            t("{price!r} is not a storage price.", price=shown),
            hint=_storage_hint(currency),
        )
    return _amount(amount, currency, shown=text, hint=_storage_hint(currency))


def _storage_hint(currency: str) -> str:
    if currency.upper() == "CNY":
        return t("Write it like 0.35/GB-month or 0.35元/GB/月.")
    return t("Write it like 0.10/GB-month.")


def format_money(micros: int, currency: str = "USD", *, digits: int | None = None) -> str:
    """Micro-units of ``currency`` (ISO 4217) as the active language writes money (Babel, with
    the locale's grouping): ``$2.10``, ``€2.10``, ``£2.10`` and ``2.10 CHF`` in English; ``¥12.50``,
    ``US$2.10`` in Chinese. Each currency keeps its own decimals (``1,200 JPY``).

    Small amounts: English keeps 4 decimals under 0.10 so small per-second prices stay readable
    (``$0.0350``); Chinese shows at most 2 decimals, rounded half up as 四舍五入 does
    (``¥0.05``), and a positive amount under the smallest shown unit as ``不到 ¥0.01`` (a
    negative one as ``-不到 ¥0.01``). The exact figure is the spreadsheet's
    (bot.services.money.spend).
    ``digits`` (0 to 6) sets the decimals instead, for figures shown side by side (a chart's
    axis)."""
    code = currency.upper()
    value = Decimal(micros) / MICROS
    language = active_language()
    if digits is None and language == "zh":
        digits = min(get_currency_precision(code), 2)
        smallest = Decimal(1).scaleb(-digits)
        if 0 < abs(value) < smallest:
            under = t("under {amount}", amount=format_money(int(smallest * MICROS), code))
            return under if value > 0 else "-" + under
        value = value.quantize(smallest, rounding=ROUND_HALF_UP)
    if digits is None:
        digits = 4 if 0 < abs(value) < _SMALL else get_currency_precision(code)
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
    multiplier = _AMOUNT_MULTIPLIERS.get(number[-1:], 1)
    if multiplier != 1:
        number = number[:-1]
    value = _decimal(number, shown, hint) * multiplier
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
    chinese = ", 1.98元, 1.5万" if currency.upper() == "CNY" else ""
    return t(
        "Write amounts like 2.10, 1,200 (thousands), 2,10 (decimal comma){more}.",
        more=marked + chinese,
    )


def _price_examples(currency: str) -> str:
    if currency.upper() == "CNY":
        return t("1.98/h, ¥1.98/h, 1.98元/小时, 0.03元/分钟 or 40元/天")
    symbol = _SYMBOLS.get(currency.upper(), "")
    return t("2.10/h, {symbol}2.10/h, 0.04/min or 48/day", symbol=symbol)
