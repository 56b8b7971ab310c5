"""The Notifier (bot/notify.py) on Feishu: cards to chats and people, updates, replies, files.

Channels are Feishu's: a group's ``chat_id`` (``oc_...``), or a person as the bot knows them,
``feishu:ou_...``, which is the bot's one-to-one chat with that open_id. A message is a card
(bot.feishu.cards) and a :class:`bot.notify.MessageRef` holds the channel as given and the
message id as ``ts``; a ``thread_ts`` is the message id to reply to, in its thread.

Exactly once: a post marked with a ``key`` carries a uuid made from the key and where it goes
(bot.feishu.client.message_uuid), and Feishu makes one message per uuid within an hour. So a
post whose answer was lost, tried again with the same key within the hour, answers with the
message the first try made instead of making a second. :meth:`FeishuNotifier.find` relies on
that: it answers None, and the post that follows it is the look. Feishu's messages carry no
metadata to look a key up by, so an earlier try over an hour old cannot be found: such a post
may then be made twice (the outbox takes a lapsed claim over after two minutes, so this needs
the bot to have been down for an hour in the middle of a post).
"""

from __future__ import annotations

import logging
import time
import uuid as uuids
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from bot.errors import FeishuError
from bot.feishu.cards import FEISHU_USER_PREFIX, card_of
from bot.feishu.client import IMAGE_SUFFIXES, FeishuClient, message_uuid
from bot.i18n import N_, t
from bot.notify import MessageRef

log = logging.getLogger(__name__)

#: How long Feishu answers a repeated message uuid with the message it made (its hour, less
#: a margin for clocks).
UUID_WINDOW = timedelta(minutes=55)
#: The wait after Feishu asks to slow down without saying how long (a chat's 5 messages a
#: second), and the longest wait taken before giving up to the caller, in seconds.
RATE_WAIT_S = 1.0
RATE_WAIT_MAX_S = 5.0
RATE_LIMITED = "ratelimited"
T = TypeVar("T")

_NOT_FEISHU_HINT = N_(
    "Feishu takes a group's chat_id (oc_...) or a person as feishu:ou_...; check where this "
    "message was addressed."
)


class FeishuNotifier:
    """Posts, updates and files through ``client``; ``now`` is the clock (naive UTC) that
    tells whether an earlier try is within Feishu's uuid hour; replies go in the thread of the
    message they answer unless ``in_thread`` is False. A call Feishu asks to slow down is made
    again after its wait (``sleep``), up to ``max_rate_limit_retries`` times. Every method
    raises bot.errors.FeishuError on failure."""

    def __init__(
        self,
        client: FeishuClient,
        *,
        now: Callable[[], datetime],
        in_thread: bool = True,
        max_rate_limit_retries: int = 2,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.now = now
        self.in_thread = in_thread
        self.max_rate_limit_retries = max_rate_limit_retries
        self.sleep = sleep

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        """Post ``text`` and ``blocks`` as a card to ``channel`` (a reply in the thread of
        ``thread_ts`` when given). A ``key`` makes the post idempotent for Feishu's hour."""
        card = _card(text, blocks)
        uuid = message_uuid(key, channel, thread_ts or "") if key else _fresh_uuid()
        if thread_ts is not None:
            reply_to = thread_ts
            message_id = self._slowed(
                lambda: self.client.reply(reply_to, card, uuid=uuid, in_thread=self.in_thread)
            )
        else:
            id_type, receive_id = receiver_of(channel)
            message_id = self._slowed(
                lambda: self.client.send(id_type, receive_id, card, uuid=uuid)
            )
        return MessageRef(channel=channel, ts=message_id)

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        """None: a post with ``key`` made within Feishu's uuid hour of ``since`` (naive UTC) is
        found by posting it again (see the module). Logs when ``since`` is older than that."""
        if self.now() - since > UUID_WINDOW:
            log.warning(
                "%s may have been posted to %s over an hour ago; Feishu cannot say, so it may "
                "be posted twice",
                key,
                channel,
            )
        return None

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        """Replace the card of a message the bot posted."""
        card = _card(text, blocks)
        self._slowed(lambda: self.client.update(ref.ts, card))

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
        """Share a file in ``channel`` (in the thread of ``thread_ts`` when given): a picture as
        an image message after a caption (its title in bold, then ``comment``), anything else
        (a CSV) as a file message after ``comment`` when there is one."""
        picture = filename.lower().endswith(IMAGE_SUFFIXES)
        caption = "\n".join(part for part in (f"*{title}*" if picture else "", comment) if part)
        if caption:
            self.post(channel, caption, thread_ts=thread_ts)
        id_type, receive_id = receiver_of(channel)
        self._slowed(
            lambda: self.client.send_file(
                id_type,
                receive_id,
                filename,
                content,
                uuid=_fresh_uuid(),
                reply_to=thread_ts,
                in_thread=self.in_thread,
            )
        )

    def _slowed(self, call: Callable[[], T]) -> T:
        return slowed(call, retries=self.max_rate_limit_retries, sleep=self.sleep)


def slowed(call: Callable[[], T], *, retries: int, sleep: Callable[[float], object]) -> T:
    """``call``, made again after Feishu's wait (its ``retry_after_s``, else
    :data:`RATE_WAIT_S`, at most :data:`RATE_WAIT_MAX_S`) when Feishu asks the bot to slow down
    (it did nothing then: a chat takes 5 messages a second), at most ``retries`` more times.
    Raises what ``call`` raises."""
    for _ in range(retries):
        try:
            return call()
        except FeishuError as exc:
            if exc.error != RATE_LIMITED:
                raise
            wait_s = exc.retry_after_s if exc.retry_after_s is not None else RATE_WAIT_S
            sleep(min(max(wait_s, 0.0), RATE_WAIT_MAX_S))
    return call()


def receiver_of(channel: str) -> tuple[str, str]:
    """Feishu's ``(receive_id_type, receive_id)`` for a channel: ``feishu:ou_x`` is the person
    ``ou_x`` (``open_id``), ``oc_...`` a chat. Raises FeishuError (``channel_not_found``) for
    anything else, such as a Slack ID."""
    if channel.startswith(FEISHU_USER_PREFIX + "ou_"):
        return "open_id", channel[len(FEISHU_USER_PREFIX) :]
    if channel.startswith("oc_"):
        return "chat_id", channel
    raise FeishuError(
        t("{channel} is not a Feishu chat or person.", channel=channel),
        error="channel_not_found",
        hint=t(_NOT_FEISHU_HINT),
    )


def _card(text: str, blocks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The message as a card; a block Feishu's cards cannot show is refused for good (it is the
    bot's, so no retry can fix it) as FeishuError ``invalid_blocks``."""
    try:
        return card_of(text, blocks)
    except ValueError as exc:
        raise FeishuError(
            t("This message cannot be shown as a Feishu card: {error}", error=str(exc)),
            error="invalid_blocks",
        ) from exc


def _fresh_uuid() -> str:
    """A uuid for a post that is not to be deduplicated (it has no key)."""
    return "gpubot-" + uuids.uuid4().hex
