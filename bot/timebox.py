"""Time budgets for the clock's steps, measured on a monotonic clock in seconds.

A :class:`Timebox` holds a budget in seconds from the moment it is opened. A step that loops
over many rows asks :meth:`Timebox.expired` before it takes the next one and, once the budget is
spent, leaves the rest for the next tick; that is safe because the work is rows (whatever is
not taken stays due). A timebox never interrupts work under way: the item in hand finishes, so
a step can run past its budget by as long as one item takes (a platform call is bounded by its
HTTP timeout, an agent poll by the SSH command timeout).

:func:`monotonic` is the clock every timebox reads (``time.monotonic``, float seconds). Tests
replace it (``monkeypatch.setattr(bot.timebox, "monotonic", fake)``) to run budgets under
controlled time; nothing here sleeps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


def monotonic() -> float:
    """Seconds on the monotonic clock (only differences mean anything)."""
    return time.monotonic()


@dataclass(frozen=True)
class Timebox:
    """``budget_s`` seconds from ``started`` (a :func:`monotonic` reading)."""

    budget_s: float
    started: float

    @classmethod
    def open(cls, budget_s: float) -> Timebox:
        """A timebox of ``budget_s`` seconds starting now."""
        return cls(budget_s=budget_s, started=monotonic())

    def elapsed_s(self) -> float:
        """Seconds since the timebox was opened."""
        return monotonic() - self.started

    def left_s(self) -> float:
        """Seconds of the budget left (0 once it is spent)."""
        return max(self.budget_s - self.elapsed_s(), 0.0)

    def expired(self) -> bool:
        """Whether the budget is spent: take no new item."""
        return self.elapsed_s() >= self.budget_s


def expired(timebox: Timebox | None) -> bool:
    """``timebox.expired()``; False for no timebox (no limit)."""
    return timebox is not None and timebox.expired()
