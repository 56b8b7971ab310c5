"""Reading the values people type: durations, times, prices, money, sizes, counts. Pure functions.

Every parser raises bot.errors.UsageError with a message that shows the accepted forms.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from zoneinfo import ZoneInfo

from bot.errors import UsageError

MICROS = 1_000_000

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MAX_DURATION = timedelta(days=366)
_PRICE_UNITS = {
    "": 3600,
    "h": 3600,
    "hr": 3600,
    "hour": 3600,
    "m": 60,
    "min": 60,
    "minute": 60,
    "s": 1,
    "sec": 1,
    "second": 1,
}


def whole_number(option: str, low: int = 0, high: int | None = None) -> Callable[[str], int]:
    """A parser for ``option``'s value: a whole number from ``low`` to ``high`` (no upper bound
    when None), digits only. The parser raises UsageError naming the option and the range."""

    def parse(text: str) -> int:
        stripped = text.strip()
        if not (stripped.isascii() and stripped.isdigit()):
            raise UsageError(
                f"{option} {text[:20]!r} is not a whole number.",
                hint=f"Give {option} a number such as {max(low, 1)}.",
            )
        value = int(stripped)
        if value < low:
            raise UsageError(f"{option} must be {low} or more, not {value}.")
        if high is not None and value > high:
            raise UsageError(f"{option} must be {high:,} or less, not {value:,}.")
        return value

    return parse


def parse_duration(text: str) -> timedelta:
    """``90m``, ``2h``, ``1h30m``, ``3d``, ``1.5h`` as a positive timedelta (at most a year)."""
    raw = text.strip().lower()
    pos = 0
    total = Decimal(0)
    for match in _DURATION_PART.finditer(raw):
        if match.start() != pos:
            break
        total += Decimal(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if not raw or pos != len(raw):
        raise UsageError(
            f"{text!r} is not a duration",
            hint="Write durations like 90m, 2h, 1h30m or 3d.",
        )
    seconds = int(total)
    if seconds <= 0:
        raise UsageError(f"{text!r} is not a positive duration", hint="Use at least 1s.")
    if timedelta(seconds=seconds) > _MAX_DURATION:
        raise UsageError(f"{text!r} is longer than a year", hint="Use a shorter duration.")
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


def parse_when(text: str, *, now_utc: datetime, tz: ZoneInfo) -> datetime:
    """``18:00`` (next such time in ``tz``), or ISO 8601 (``2026-12-03T18:00``, with or without
    offset; without one it is read in ``tz``). Returns naive UTC, which must lie in the future."""
    raw = text.strip()
    local_now = now_utc.replace(tzinfo=ZoneInfo("UTC")).astimezone(tz)
    at: datetime
    if re.fullmatch(r"\d{1,2}:\d{2}", raw):
        hour, minute = (int(part) for part in raw.split(":"))
        if hour > 23 or minute > 59:
            raise UsageError(f"{text!r} is not a time of day", hint="Use HH:MM, like 18:00.")
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
                f"{text!r} is not a time",
                hint="Use HH:MM (like 18:00) or ISO 8601 (like 2026-12-03T18:00).",
            ) from exc
        at = parsed if parsed.tzinfo else parsed.replace(tzinfo=tz)
    at_utc = at.astimezone(ZoneInfo("UTC")).replace(tzinfo=None)
    if at_utc <= now_utc:
        raise UsageError(f"{text!r} is in the past", hint="Give a time in the future.")
    return at_utc


def parse_money(text: str) -> int:
    """``2.10``, ``$2.10``, ``1,200`` as integer micro-units (non-negative, at most 6 decimals)."""
    raw = text.strip().lstrip("$€£¥").replace(",", "").replace("_", "")
    try:
        value = Decimal(raw)
    except InvalidOperation as exc:
        raise UsageError(f"{text!r} is not an amount", hint="Write amounts like 2.10.") from exc
    if not value.is_finite() or value < 0:
        raise UsageError(f"{text!r} is not a non-negative amount", hint="Write amounts like 2.10.")
    micros = value * MICROS
    if micros != micros.to_integral_value():
        raise UsageError(f"{text!r} has more than 6 decimals")
    if micros > 10**15:
        raise UsageError(f"{text!r} is too large")
    return int(micros)


def parse_price(text: str) -> int:
    """``2.10/h``, ``2.10``, ``$0.035/min``, ``0.0006/s`` as micro-units per hour."""
    raw = text.strip().lower()
    amount, _, unit = raw.partition("/")
    if unit not in _PRICE_UNITS:
        raise UsageError(f"{text!r} is not a price", hint="Write prices like 2.10/h or 0.04/min.")
    micros = parse_money(amount)
    return micros * 3600 // _PRICE_UNITS[unit]


def format_money(micros: int, currency: str = "USD") -> str:
    """Micro-units as ``$2.10`` (USD, EUR, GBP symbols; else ``2.10 CHF``); cents below 10 cents
    keep 4 decimals so small per-second prices stay readable."""
    symbols = {"USD": "$", "EUR": "€", "GBP": "£"}
    sign = "-" if micros < 0 else ""
    value = Decimal(abs(micros)) / MICROS
    digits = "0.0001" if 0 < value < Decimal("0.10") else "0.01"
    number = f"{value.quantize(Decimal(digits)):,}"
    if currency in symbols:
        return f"{sign}{symbols[currency]}{number}"
    return f"{sign}{number} {currency}"


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
        raise UsageError(f"{text!r} is not a size", hint="Write sizes like 200 or 200GB.") from exc
    if not value > 0 or value > 10**7:
        raise UsageError(f"{text!r} is not a sensible size in GB")
    return value
