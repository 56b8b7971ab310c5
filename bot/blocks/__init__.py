"""The presentation floor: notices and views in, Slack messages out (pure functions).

Every Block Kit block comes from :mod:`bot.blocks.kit`, which keeps Slack's limits in one place.
:func:`render` is the one door for what the services say on their own (:class:`bot.notify.Notice`):
each module lists its renderers in its ``RENDERERS`` table, joined here. The words for a notice
live in the module named after the service module that defines it (a notice of
``bot.services.instances.releases`` in :mod:`bot.blocks.releases`), or in its domain's module where
a service has only a notice or two (``bot.services.money.budgets`` in :mod:`bot.blocks.money`);
``tests/bot/blocks/test_words_follow_notices.py`` holds the table and keeps it so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bot.blocks import (
    answers,
    bills,
    deadlines,
    instances,
    jobs,
    money,
    outbox,
    reconcile,
    releases,
    rent,
    trust,
)
from bot.notify import FileAttachment, Message, Notice

#: Every notice type and the function that renders it.
RENDERERS: dict[type[Notice], Callable[[Any], Message]] = {
    **answers.RENDERERS,
    **bills.RENDERERS,
    **deadlines.RENDERERS,
    **instances.RENDERERS,
    **jobs.RENDERERS,
    **money.RENDERERS,
    **outbox.RENDERERS,
    **reconcile.RENDERERS,
    **releases.RENDERERS,
    **rent.RENDERERS,
    **trust.RENDERERS,
}


#: Every notice that comes with files and the function that draws them.
FILE_RENDERERS: dict[type[Notice], Callable[[Any], tuple[FileAttachment, ...]]] = {
    **money.FILE_RENDERERS,
}


def render(notice: Notice) -> Message:
    """``notice`` as a message. Raises TypeError when no renderer knows its type."""
    renderer = RENDERERS.get(type(notice))
    if renderer is None:
        raise TypeError(f"no renderer for the notice {type(notice).__name__}")
    return renderer(notice)


def render_files(notice: Notice) -> tuple[FileAttachment, ...]:
    """The files ``notice`` comes with. Raises TypeError when no file renderer knows its type."""
    renderer = FILE_RENDERERS.get(type(notice))
    if renderer is None:
        raise TypeError(f"no file renderer for the notice {type(notice).__name__}")
    return renderer(notice)
