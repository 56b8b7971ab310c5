"""Logging for the bot's processes: text or JSON lines, to stderr or to a file, and the ids of
what a line is about.

A line about an instance, a job or a release carries their ids as record attributes
(:data:`ID_FIELDS`): given one call at a time with ``extra=log_ids(release_id=7)``, or for
everything logged in a block (on this thread) with ``with log_context(release_id=7):``. The
text format appends them as ``[instance_id=3 release_id=7]``; the JSON format (one object per
line: ``time``, ``level``, ``logger``, ``thread``, ``message``, the ids, ``exception``) has them
as fields.

Each slash command, click, form and tick runs under a request id (:func:`request_context`):
every line logged while it runs, on the listener's thread and on the executor's (the work is
handed over with its context), carries the same ``request_id``, and another request another.

A failure that repeats on every tick is logged through a :class:`RepeatLimiter`: the first
with its traceback, then at most one line per key a minute saying how often it happened, and
one when it works again.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"
#: Log formats GPUBOT_LOG_FORMAT accepts.
FORMATS = ("text", "json")
#: Levels GPUBOT_LOG_LEVEL and --log-level accept.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: The ids a line may carry, in the order they are shown.
ID_FIELDS = ("request_id", "instance_id", "instance", "job_id", "release_id", "launch_id")
#: Hex digits in a request id.
REQUEST_ID_LENGTH = 12
#: Seconds: a repeated failure is logged at most once per key this often.
REPEAT_EVERY_S = 60.0

#: The ids of the current :func:`log_context`, as (name, value) pairs.
_CONTEXT: contextvars.ContextVar[tuple[tuple[str, object], ...]] = contextvars.ContextVar(
    "gpubot_log_ids", default=()
)


def configure_logging(
    level: str | int = "INFO", *, file: Path | None = None, json_format: bool = False
) -> None:
    """Send the root logger's records at ``level`` and above to ``file`` (appending; its
    directory is created) or to stderr, as text or (``json_format``) JSON lines. Quietens the
    chattiest libraries to warnings."""
    handler: logging.Handler
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_format else TextFormatter(FORMAT))
    handler.addFilter(ContextIds())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("paramiko", "apscheduler", "slack_sdk", "urllib3", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_ids(**ids: object) -> dict[str, object]:
    """``extra=`` for one logging call: the ids of what the line is about (None values are
    left out). Raises ValueError for a name not in :data:`ID_FIELDS`."""
    _check_names(ids)
    return {name: value for name, value in ids.items() if value is not None}


@contextmanager
def log_context(**ids: object) -> Iterator[None]:
    """Every line logged in the block, on this thread (and in contexts copied from it), carries
    ``ids`` unless the call gives its own. Raises ValueError for a name not in
    :data:`ID_FIELDS`."""
    token = _CONTEXT.set(tuple({**dict(_CONTEXT.get()), **log_ids(**ids)}.items()))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def new_request_id() -> str:
    """A fresh request id: :data:`REQUEST_ID_LENGTH` random hex digits."""
    return uuid.uuid4().hex[:REQUEST_ID_LENGTH]


@contextmanager
def request_context(request_id: str | None = None) -> Iterator[str]:
    """Every line logged in the block carries ``request_id`` (default a new one), which the
    block is given; work handed to another thread keeps it when run in a copy of this context
    (``contextvars.copy_context().run``)."""
    rid = request_id or new_request_id()
    with log_context(request_id=rid):
        yield rid


def current_request_id() -> str | None:
    """The request id of the current :func:`request_context`, or None outside one."""
    value = dict(_CONTEXT.get()).get("request_id")
    return None if value is None else str(value)


@dataclass(frozen=True)
class Repeat:
    """What :meth:`RepeatLimiter.admit` says of a failure to log: ``first`` when it opens a
    run (log it in full), else ``count`` failures (this one included) since the last line,
    ``window_s`` seconds ago."""

    first: bool
    count: int
    window_s: float


class RepeatLimiter:
    """At most one log line per key every ``every_s`` seconds about something that fails
    again and again: the first failure of a run (log it in full), then one line with how many
    failed since the last one. Working again is said (:meth:`settle`) once ``every_s`` have
    passed since the last line, with the failures held back since it; a key that fails again
    before that goes on counting, so a step that fails every other time logs no more. Times
    are given by the caller, in seconds (a time ``every_s`` or more before the last line, a clock
    gone back, starts a new window).
    Thread-safe."""

    def __init__(self, every_s: float = REPEAT_EVERY_S) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        #: By key: when its last line was let through (seconds), failures held back since.
        self._runs: dict[str, tuple[float, int]] = {}

    def admit(self, key: str, at_s: float) -> Repeat | None:
        """Note one failure of ``key`` at ``at_s``: what to log, or None to log nothing."""
        with self._lock:
            run = self._runs.get(key)
            if run is None:
                self._runs[key] = (at_s, 0)
                return Repeat(first=True, count=1, window_s=0.0)
            logged_at_s, held = run
            if self._within(logged_at_s, at_s):
                self._runs[key] = (logged_at_s, held + 1)
                return None
            self._runs[key] = (at_s, 0)
            return Repeat(first=False, count=held + 1, window_s=max(0.0, at_s - logged_at_s))

    def settle(self, key: str, at_s: float) -> int | None:
        """Note that ``key`` worked at ``at_s``. Returns the failures held back since its last
        line when it was failing and ``every_s`` have passed since that line (say it works
        again; the run ends), else None (log nothing)."""
        with self._lock:
            run = self._runs.get(key)
            if run is None or self._within(run[0], at_s):
                return None
            del self._runs[key]
            return run[1]

    def _within(self, logged_at_s: float, at_s: float) -> bool:
        # A time a little before the last line is a thread that read the clock before another
        # took the lock: the same window. One a whole window before it is a clock gone back.
        return logged_at_s - self.every_s < at_s < logged_at_s + self.every_s


def record_ids(record: logging.LogRecord) -> dict[str, object]:
    """The ids a record carries, in :data:`ID_FIELDS` order."""
    return {
        name: getattr(record, name) for name in ID_FIELDS if getattr(record, name, None) is not None
    }


class ContextIds(logging.Filter):
    """Stamps the ids of the current :func:`log_context` on each record that lacks them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _CONTEXT.get():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


class TextFormatter(logging.Formatter):
    """The text format, with the record's ids appended in brackets."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        ids = record_ids(record)
        if not ids:
            return text
        shown = " ".join(f"{name}={value}" for name, value in ids.items())
        head, newline, rest = text.partition("\n")  # keep a traceback below the ids
        return f"{head} [{shown}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601 UTC), ``level``, ``logger``, ``thread``,
    ``message``, the ids and, with an exception, ``exception`` (its traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "thread": record.threadName,
            "message": record.getMessage(),
        }
        entry.update({name: _plain(value) for name, value in record_ids(record).items()})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


def _plain(value: object) -> object:
    return value if isinstance(value, (int, float, str, bool)) else str(value)


def _check_names(ids: dict[str, object]) -> None:
    unknown = sorted(set(ids) - set(ID_FIELDS))
    if unknown:
        raise ValueError(f"unknown log id(s) {', '.join(unknown)}; use {', '.join(ID_FIELDS)}")
