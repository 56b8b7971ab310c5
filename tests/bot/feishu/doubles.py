"""Doubles for the Feishu front end's tests: a sender that records, cards as plain data."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.errors import GpubotError

#: Seconds a test waits for the executor to answer.
WAIT_S = 10.0


@dataclass(frozen=True)
class Sent:
    """One call the front made: ``how`` is send, reply or update."""

    how: str
    target: str
    card: dict[str, Any]
    uuid: str = ""
    in_thread: bool = False
    receive_id_type: str = ""


class RecordingSender:
    """A FeishuSender that records each call; ``fail`` makes the next reply or update raise."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.fail: GpubotError | None = None
        self._changed = threading.Condition()

    def send(
        self, receive_id_type: str, receive_id: str, card: dict[str, Any], *, uuid: str
    ) -> str:
        self._record(Sent("send", receive_id, card, uuid, receive_id_type=receive_id_type))
        return f"om_sent{len(self.sent)}"

    def reply(self, message_id: str, card: dict[str, Any], *, uuid: str, in_thread: bool) -> str:
        self._raise()
        self._record(Sent("reply", message_id, card, uuid, in_thread))
        return f"om_reply{len(self.sent)}"

    def update(self, message_id: str, card: dict[str, Any]) -> None:
        self._raise()
        self._record(Sent("update", message_id, card))

    def wait_for(self, count: int) -> list[Sent]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.sent) >= count, WAIT_S), self.sent
            return list(self.sent)

    def _raise(self) -> None:
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail

    def _record(self, sent: Sent) -> None:
        with self._changed:
            self.sent.append(sent)
            self._changed.notify_all()


def card_of(text: str, blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A stand-in card: what it was made of."""
    return {"text": text, "blocks": [dict(block) for block in blocks]}


def action_of(value: Mapping[str, Any]) -> tuple[str, str]:
    return str(value["action_id"]), str(value["value"])
