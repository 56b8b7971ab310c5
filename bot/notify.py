"""How services speak first (warnings, completion replies, digests) without knowing Slack.

A service says what happened as a :class:`Notice`: a frozen value, no words and no Block Kit.
The runtime's :data:`Render` (the presentation floor's ``bot.blocks.render``, wired in
``bot.app``) turns it into a :data:`Message` where the bot speaks on its own (the outbox and
prompts); a :class:`Notifier` carries the message to Slack. The Slack notifier wraps the Web API
client; the console's prints to the terminal; tests use either against the local Slack stand-in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

Block = dict[str, Any]
#: A message as Slack takes it: the fallback text and its blocks.
Message = tuple[str, tuple[Block, ...]]


@dataclass(frozen=True)
class Notice:
    """Base of everything a service has to say: subclasses are frozen dataclasses of plain
    values (naive UTC times, micro-unit money) that name what happened, never how it reads."""


#: Turns a notice into a message; raises TypeError for a notice it has no renderer for.
Render = Callable[[Notice], Message]


@dataclass(frozen=True)
class FileAttachment:
    """A file to share in the thread of the message it comes with (a chart, a CSV)."""

    name: str
    content: bytes
    title: str = ""


#: Turns a notice into the files it comes with (a chart); raises TypeError for a notice it has
#: no file renderer for.
RenderFiles = Callable[[Notice], tuple[FileAttachment, ...]]


@dataclass(frozen=True)
class MessageRef:
    """Where a posted message lives, so it can be updated or replied to in its thread."""

    channel: str
    ts: str


class Notifier(Protocol):
    """Outgoing messages. Every method raises bot.errors.GpubotError subclasses on failure."""

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        """Post to a channel ID (or a user ID, which opens a DM); ``text`` is the fallback.
        ``key`` marks the message (in Slack's message metadata) so :meth:`find` can tell later
        whether a post whose answer was lost happened."""
        ...

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        """The bot's message marked ``key`` in ``channel`` (a user ID means the DM) posted at
        ``since`` (naive UTC) or later, or None."""
        ...

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        """Replace a message the bot posted."""
        ...

    def upload_file(
        self,
        channel: str,
        filename: str,
        content: bytes,
        *,
        title: str,
        comment: str = "",
        thread_ts: str | None = None,
    ) -> None:
        """Share a file (chart PNG, CSV) in a channel."""
        ...
