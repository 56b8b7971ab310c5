"""The README's console walks, typed again as Feishu messages: each `/gpu` line is sent as Feishu
sends a message (encrypted and signed) to the request URL, answered through the official SDK to
the OpenAPI stand-in, and the card it gets holds every word of what Slack's answer to the same
line says (its blocks, or its text when it has none), format aside. Slack's answers come from
the same command path (bot.listeners.execute_command, in the caller's language) on a store of
its own that the walk goes through in the same order.

Outside the console the instance ``local`` does not exist, on Slack and on Feishu alike, so the
walk's lines about it are answered as such on both; its ``click N`` and ``y`` lines press the
buttons of ``local``'s release, which only the console shows, and ``:home`` is the console's
own, so those lines are not sent."""

from __future__ import annotations

import html
import itertools
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.ack_path import Languages
from bot.app import timed_registry, with_home_buttons
from bot.commands import build_registry
from bot.commands.registry import Registry
from bot.feishu.cards import plain_of
from bot.feishu.client import FeishuClient
from bot.feishu.events import EventVerifier
from bot.feishu.serve import EVENTS_PATH, FeishuEndpoint, build_gate
from bot.feishu.standin import FeishuStandIn, StoredMessage
from bot.http_server import SlackHttpServer
from bot.i18n import speaking
from bot.listeners import execute_command, remember_caller
from bot.runtime import Runtime
from bot.services.access import Caller
from tests.bot.feishu.test_events import KEY, TOKEN, message_event
from tests.bot.feishu.test_serve import now_sealed, post
from tests.bot.services.support import Clock, make_runtime
from tests.bot.test_readme_zh import walkthrough, walkthrough_en
from tests.fixtures.store import fresh_database

OPEN_ID = "ou_alice"
USER_ID = "feishu:" + OPEN_ID
WAIT_S = 10.0
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_AT = re.compile(r"<at id=([^>]*)></at>")
_TAG = re.compile(r"</?font[^>]*>")


def commands_of(lines: Sequence[str]) -> list[str]:
    """The `/gpu` lines of a walk (see the module for the others)."""
    return [line for line in lines if line.startswith("/gpu ")]


@pytest.fixture(params=["zh", "en"])
def walk(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """The README's walk in a language: the Chinese one (in yuan) and the English one."""
    if request.param == "zh":
        return "zh", commands_of(walkthrough())
    typed = [line[2:] for line in walkthrough_en() if line.startswith("> ")]
    return "en", commands_of(typed)


def settings_for(language: str) -> dict[str, Any]:
    return {"language": "zh", "currency": "CNY"} if language == "zh" else {}


@pytest.fixture
def slack_rt(tmp_path: Path, walk: tuple[str, list[str]]) -> Iterator[Runtime]:
    with fresh_database("sqlite", tmp_path / "slack") as db:
        yield make_runtime(db, Clock(), **settings_for(walk[0]))


@pytest.fixture
def feishu_rt(tmp_path: Path, walk: tuple[str, list[str]]) -> Iterator[Runtime]:
    with fresh_database("sqlite", tmp_path / "feishu") as db:
        yield make_runtime(db, Clock(), **settings_for(walk[0]))


def bots_registry(rt: Runtime) -> Registry:
    """The commands and buttons as the bot wires them on either platform."""
    return timed_registry(with_home_buttons(build_registry()), rt.metrics)


def slack_words(rt: Runtime, registry: Registry, languages: Languages, text: str) -> list[str]:
    """What Slack's answer to `/gpu TEXT` says, piece by piece, as plain text."""
    caller = Caller(user_id=USER_ID, channel_id="D0ALICE")
    remember_caller(rt, caller)
    with speaking(languages.read(USER_ID)):
        reply = execute_command(rt, registry, caller, text.removeprefix("/gpu "))
    pieces = list(_block_texts(reply.blocks)) if reply.blocks else [reply.text]
    return [flat(plain_of(piece)) for piece in pieces if flat(plain_of(piece))]


def card_words(card: Mapping[str, Any]) -> str:
    """Everything a card shows (header, markdown, buttons), as plain text."""
    texts: list[str] = []
    header = card.get("header")
    if isinstance(header, dict):
        texts.append(str(header["title"]["content"]))
    texts.extend(_card_texts(card["body"]["elements"]))
    return flat(" ".join(texts))


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_readmes_walk_through_feishu_says_what_slack_says(
    walk: tuple[str, list[str]], slack_rt: Runtime, feishu_rt: Runtime
) -> None:
    language, lines = walk
    assert lines[0] == "/gpu help"
    slack_registry, languages = bots_registry(slack_rt), Languages(slack_rt)
    ticks = itertools.count(0.0, 1.0)  # a second between calls: Alice types at her own pace
    with FeishuStandIn(clock=lambda: next(ticks)) as standin:
        client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
        gate = build_gate(feishu_rt, client)
        verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
        server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
        try:
            for number, line in enumerate(lines):
                expected = slack_words(slack_rt, slack_registry, languages, line)
                card = feishu_answer(
                    server.base_url + EVENTS_PATH, client, standin, line, f"ev-{language}-{number}"
                )
                shown = card_words(card)
                for piece in expected:
                    assert piece in shown, f"{line!r}: Feishu's card lacks {piece!r}: {shown!r}"
        finally:
            server.shutdown()
            gate.front.close()


def feishu_answer(
    url: str, client: FeishuClient, standin: FeishuStandIn, line: str, event_id: str
) -> dict[str, Any]:
    """Alice sends ``line`` in her one-to-one chat with the bot; the card it answers with."""
    typed = client.send_content("open_id", OPEN_ID, "text", {"text": line}, uuid=f"u-{event_id}")
    event = message_event(line, event_id=event_id)
    event["event"]["message"].update(chat_id=standin.p2p_chat(OPEN_ID), message_id=typed)
    assert post(url, *now_sealed(event)) == (200, {})
    answer = _wait_for_reply(standin, typed)
    assert answer.msg_type == "interactive"
    return answer.card


def _wait_for_reply(standin: FeishuStandIn, message_id: str) -> StoredMessage:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = next((m for m in standin.messages if m.parent_id == message_id), None)
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"no answer to {message_id}"
        time.sleep(0.02)


def _block_texts(blocks: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    """Every text a person reads in Slack's blocks (a button's words too), as mrkdwn."""
    for block in blocks:
        item = block.get("text")
        if isinstance(item, dict):
            yield _mrkdwn(item)
        for item in block.get("fields", ()):
            yield _mrkdwn(item)
        for element in block.get("elements", ()):
            if element.get("type") == "button":
                yield _mrkdwn(element["text"])
            elif "text" in element:
                yield _mrkdwn(element)
        accessory = block.get("accessory")
        if isinstance(accessory, dict) and accessory.get("type") == "button":
            yield _mrkdwn(accessory["text"])


def _mrkdwn(item: Mapping[str, Any]) -> str:
    text = str(item.get("text", ""))
    if item.get("type") == "plain_text":
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text


def _card_texts(elements: Sequence[Any]) -> Iterator[str]:
    for element in elements:
        if not isinstance(element, dict):
            continue
        if element.get("tag") == "markdown":
            yield _plain_markdown(str(element["content"]))
        if element.get("tag") == "button":
            yield str(element["text"]["content"])
        yield from _card_texts(element.get("elements", []))
        yield from _card_texts(element.get("columns", []))


def _plain_markdown(markdown: str) -> str:
    """Feishu card markdown as the words it shows: marks dropped (a literal mark is always
    a character reference in the bot's cards), links as their text, mentions as ``@id``."""
    text = _TAG.sub("", markdown)
    text = _AT.sub(lambda found: "@" + found.group(1), text)
    text = _LINK.sub(lambda found: found.group(1), text)
    text = text.replace("```", "").replace("`", "")
    for mark in ("**", "~~", "*"):
        text = text.replace(mark, "")
    return html.unescape(text)
