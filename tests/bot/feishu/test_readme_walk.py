"""The README's console walks, typed again through Feishu: every line, in order, on two bots
built as `gpubot console` builds its own (``console=True``, a Fleet whose local transport runs
the agent zipapp with a fake RTX 4090 at 90% use, the instance ``local`` registered for the
person at start), one answering as Slack's command path does and one as Feishu's front end.

- A `/gpu` line is sent as Feishu sends a message (encrypted and signed) to the request URL;
  the bot answers through the official SDK to the OpenAPI stand-in. On Slack's side it runs
  through the same command path (bot.listeners.execute_command, in the caller's language).
- ``:home`` (the console's Home tab) is `/gpu home` on Feishu, which has no Home tab; Slack's
  side is the Home tab's view (bot.blocks.home over bot.services.home).
- ``click N`` presses the Nth button shown so far, numbered as the console numbers them
  (bot.console.Printer: every button of every message shown, a message updated in place
  shown again, links not numbered). Slack's side runs the button's action
  (bot.listeners.execute_action); Feishu's gets a signed, encrypted ``card.action.trigger`` for
  the same button of the card that shows it. A button that asks first shows its dialog on that
  line (Slack's confirm and the card button's ``confirm``, compared); ``y`` answers it.
  Feishu's client shows that dialog itself and sends the click only once it is confirmed, so
  on Feishu the click event sent on the ``y`` line *is* the confirmed click.

Everything a line makes the bot show (its answer, and each direct message, channel message
and update it posts meanwhile) is compared in order, one Feishu card for each Slack message:
every word of the Slack message appears in its card, format aside. Both sides are the same
person (``feishu:ou_alice``, so names read alike), each with its own store, data directory
(where the local agent keeps its state) and home, and a controlled clock; both clocks move a
second before each line. The walks have no ``:tick`` line and no form; a line of a kind not
repeated here fails the test rather than being left out."""

from __future__ import annotations

import html
import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bot.ack_path import Languages
from bot.app import timed_registry, with_home_buttons
from bot.blocks import home as home_blocks
from bot.commands import build_registry
from bot.commands.registry import Registry
from bot.executor import BotExecutor
from bot.feishu.cards import plain_of
from bot.feishu.client import FeishuClient
from bot.feishu.events import EventVerifier
from bot.feishu.notifier import FeishuNotifier
from bot.feishu.routing import RoutingNotifier
from bot.feishu.serve import EVENTS_PATH, FeishuEndpoint, build_gate
from bot.feishu.standin import FeishuStandIn
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.http_server import SlackHttpServer
from bot.i18n import speaking
from bot.listeners import execute_action, execute_command, remember_caller
from bot.notify import MessageRef
from bot.runtime import Runtime
from bot.services import home
from bot.services.access import Caller
from bot.services.instances.registration import ensure_local_instance
from bot.services.speaking import identities
from bot.services.speaking.people import language_for
from bot.store.db import Database
from tests.bot.feishu.test_events import KEY, TOKEN, card_event, message_event
from tests.bot.feishu.test_serve import now_sealed, post
from tests.bot.services.support import Clock, RecordingNotifier, make_runtime
from tests.bot.test_readme_zh import RTX_4090, walkthrough, walkthrough_en
from tests.fixtures.fake_nvml import FakeNvml
from tests.fixtures.store import fresh_database

OPEN_ID = "ou_alice"
USER_ID = "feishu:" + OPEN_ID
OPS_CHAT = "oc_ops"
#: How long a side may take to finish what one line started, in seconds.
IDLE_WAIT_S = 60.0
#: What answers a button's question (bot.console.YES).
YES = frozenset({"y", "yes", "是"})
_CLICK = re.compile(r"click\s+(\d+)", re.IGNORECASE)
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_AT = re.compile(r"<at id=([^>]*)></at>")
_TAG = re.compile(r"</?font[^>]*>")
_MESSAGES = "/open-apis/im/v1/messages"

#: The words a message shows, piece by piece (a Slack message) or whole (a Feishu card).
Pieces = list[str]


@pytest.fixture(params=["zh", "en"])
def walk(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """The README's walk in a language, every line it types: the Chinese one (in yuan) and
    the English one."""
    if request.param == "zh":
        return "zh", walkthrough()
    return "en", [line[2:] for line in walkthrough_en() if line.startswith("> ")]


def settings_for(language: str) -> dict[str, Any]:
    return {"language": "zh", "currency": "CNY"} if language == "zh" else {}


class ShownNotifier(RecordingNotifier):
    """The recording notifier, also keeping every message posted or updated, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[tuple[str, tuple[dict[str, Any], ...]]] = []

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        ref = super().post(channel, text, blocks, thread_ts=thread_ts, key=key)
        self.shown.append((text, tuple(blocks)))
        return ref

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        super().update(ref, text, blocks)
        self.shown.append((text, tuple(blocks)))


@pytest.fixture
def fake_4090(fake_nvml: FakeNvml) -> FakeNvml:
    """The README's machine: one RTX 4090 at 90% use (the agent's subprocess reads it)."""
    fake_nvml.gpus(1, RTX_4090, per_gpu={0: {"util_gpu": 90}})
    return fake_nvml


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    ticks = itertools.count(0.0, 1.0)  # a second between calls: Alice types at her own pace
    with FeishuStandIn(clock=lambda: next(ticks)) as running:
        yield running


@pytest.fixture
def slack_rt(
    tmp_path: Path, walk: tuple[str, list[str]], fake_4090: FakeNvml, fake_gpu_zipapp: Path
) -> Iterator[Runtime]:
    with fresh_database("sqlite", tmp_path / "slack") as db:
        rt = console_runtime(
            db, tmp_path / "slack", fake_gpu_zipapp, ShownNotifier(), **settings_for(walk[0])
        )
        try:
            yield rt
        finally:
            close(rt)


@pytest.fixture
def feishu_rt(
    tmp_path: Path,
    walk: tuple[str, list[str]],
    fake_4090: FakeNvml,
    fake_gpu_zipapp: Path,
    standin: FeishuStandIn,
) -> Iterator[Runtime]:
    """As `gpubot feishu` serves Feishu alone: a routing notifier with Feishu's, the ops
    channel a Feishu group."""
    client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
    clock = Clock()
    router = RoutingNotifier(slack=None, feishu=FeishuNotifier(client, now=clock))
    with fresh_database("sqlite", tmp_path / "feishu") as db:
        settings = settings_for(walk[0]) | {"channel": OPS_CHAT, "feishu_chat": OPS_CHAT}
        rt = console_runtime(db, tmp_path / "feishu", fake_gpu_zipapp, router, clock, **settings)
        router.feishu_of = partial(identities.feishu_of, rt)
        try:
            yield rt
        finally:
            close(rt)


def console_runtime(
    db: Database,
    where: Path,
    zipapp: Path,
    notifier: Any,
    clock: Clock | None = None,
    **settings: Any,
) -> Runtime:
    """A runtime as the console builds its own, under ``where`` (data directory and home),
    with the person's instance ``local`` registered."""
    (where / "home").mkdir(parents=True)
    rt = make_runtime(
        db,
        clock if clock is not None else Clock(),
        notifier=notifier,
        console=True,
        data_dir=where / "data",
        ssh_command_timeout_s=30.0,
        **settings,
    )
    rt.executor.shutdown()
    rt.executor = BotExecutor(4, thread_name_prefix="walk")
    rt.fleet = Fleet(
        rt.settings, zipapp_path=zipapp, local_transport=LocalTransport(home=where / "home")
    )
    ensure_local_instance(rt, USER_ID)
    return rt


def close(rt: Runtime) -> None:
    rt.executor.shutdown(wait=True)
    rt.fleet.close()


def bots_registry(rt: Runtime) -> Registry:
    """The commands and buttons as the bot wires them on either platform."""
    return timed_registry(with_home_buttons(build_registry()), rt.metrics)


@dataclass(frozen=True)
class SlackButton:
    """A button Slack's side showed: its Block Kit element."""

    element: Mapping[str, Any]

    @property
    def label(self) -> str:
        return flat(plain_of(_mrkdwn(self.element["text"])))

    @property
    def dialog(self) -> list[str] | None:
        """The words of the question it asks first, if it asks one."""
        confirm = self.element.get("confirm")
        if not isinstance(confirm, dict):
            return None
        return [flat(plain_of(_mrkdwn(confirm[part]))) for part in ("title", "text")]


@dataclass(frozen=True)
class FeishuButton:
    """A button Feishu's side showed: the card message holding it, and its element."""

    message_id: str
    chat_id: str
    element: Mapping[str, Any]

    @property
    def label(self) -> str:
        return flat(str(self.element["text"]["content"]))

    @property
    def dialog(self) -> list[str] | None:
        confirm = self.element.get("confirm")
        if not isinstance(confirm, dict):
            return None
        return [flat(str(confirm[part]["content"])) for part in ("title", "text")]

    @property
    def value(self) -> dict[str, Any]:
        [callback] = [b for b in self.element["behaviors"] if b["type"] == "callback"]
        return dict(callback["value"])


class SlackSide:
    """Slack's answers to the walk from the command path itself, the buttons numbered as the
    console numbers them."""

    def __init__(self, rt: Runtime) -> None:
        assert isinstance(rt.notifier, ShownNotifier)
        self.rt = rt
        self.notifier = rt.notifier
        self.registry = bots_registry(rt)
        self.languages = Languages(rt)
        self.caller = Caller(user_id=USER_ID, channel_id="D0ALICE")
        self.buttons: list[SlackButton] = []

    def command(self, text: str) -> list[Pieces]:
        """`/gpu TEXT`: the messages it shows."""
        mark = len(self.notifier.shown)
        remember_caller(self.rt, self.caller)
        with speaking(self.languages.read(USER_ID)):
            reply = execute_command(self.rt, self.registry, self.caller, text)
        return self._settle(mark, reply.text, reply.blocks)

    def home(self) -> list[Pieces]:
        """The Home tab as the person opens it."""
        mark = len(self.notifier.shown)
        with speaking(self.languages.read(USER_ID)):
            view = home_blocks.home_view(home.home_view(self.rt, USER_ID))
        return self._settle(mark, "", view["blocks"])

    def click(self, button: SlackButton) -> list[Pieces]:
        """Press ``button`` (its question, if any, answered yes): the messages it shows."""
        mark = len(self.notifier.shown)
        action_id, value = str(button.element["action_id"]), str(button.element["value"])
        remember_caller(self.rt, self.caller)
        with speaking(language_for(self.rt, USER_ID)):
            reply = execute_action(self.rt, self.registry, self.caller, action_id, value)
        return self._settle(mark, reply.text, reply.blocks)

    def _settle(self, mark: int, text: str, blocks: Sequence[Mapping[str, Any]]) -> list[Pieces]:
        """What was posted meanwhile, then the answer, each as its words; buttons numbered."""
        assert isinstance(self.rt.executor, BotExecutor)
        assert self.rt.executor.wait_idle(IDLE_WAIT_S)
        shown = [*self.notifier.shown[mark:], (text, tuple(blocks))]
        for _, shown_blocks in shown:
            self.buttons.extend(SlackButton(e) for e in _block_buttons(shown_blocks))
        return [slack_words(shown_text, shown_blocks) for shown_text, shown_blocks in shown]


class FeishuSide:
    """Feishu's answers to the walk: messages and clicks sent to the request URL, the cards
    the bot sent the stand-in in the order it sent them, their buttons numbered."""

    def __init__(
        self, rt: Runtime, standin: FeishuStandIn, url: str, client: FeishuClient, name: str
    ) -> None:
        self.rt = rt
        self.standin = standin
        self.url = url
        self.client = client
        self.events = (f"ev-{name}-{n}" for n in itertools.count())
        self.buttons: list[FeishuButton] = []

    def command(self, line: str) -> list[str]:
        """Alice sends ``line`` in her one-to-one chat with the bot: the cards shown."""
        event_id = next(self.events)
        typed = self.client.send_content(
            "open_id", OPEN_ID, "text", {"text": line}, uuid=f"u-{event_id}"
        )
        mark = len(self.standin.requests)
        event = message_event(line, event_id=event_id)
        event["event"]["message"].update(chat_id=self.standin.p2p_chat(OPEN_ID), message_id=typed)
        assert post(self.url, *now_sealed(event)) == (200, {})
        return self._settle(mark)

    def click(self, button: FeishuButton) -> list[str]:
        """Alice clicks ``button`` (confirmed in her client, if it asks first)."""
        event = card_event(button.value, event_id=next(self.events))
        event["event"]["operator"]["open_id"] = OPEN_ID
        event["event"]["context"] = {
            "open_message_id": button.message_id,
            "open_chat_id": button.chat_id,
        }
        mark = len(self.standin.requests)
        assert post(self.url, *now_sealed(event)) == (200, {})
        return self._settle(mark)

    def _settle(self, mark: int) -> list[str]:
        assert isinstance(self.rt.executor, BotExecutor)
        assert self.rt.executor.wait_idle(IDLE_WAIT_S)
        shown: list[str] = []
        for message_id, card in self._cards_since(mark):
            message = self.standin.message(message_id)
            assert message is not None
            self.buttons.extend(
                FeishuButton(message_id, message.chat_id, element)
                for element in _card_buttons(card["body"]["elements"])
            )
            shown.append(card_words(card))
        return shown

    def _cards_since(self, mark: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each card the bot posted or put in place of another since request ``mark``, with
        its message id, in order."""
        for request in self.standin.requests[mark:]:
            if request.answered != 200 or not request.path.startswith(_MESSAGES):
                continue
            body = request.body
            if request.method == "PATCH":
                yield request.path.rsplit("/", 1)[1], json.loads(body["content"])
            elif request.method == "POST" and body.get("msg_type") == "interactive":
                [message] = [m for m in self.standin.messages if m.uuid == body["uuid"]]
                yield message.message_id, json.loads(body["content"])


@pytest.mark.integration
def test_the_readmes_walk_through_feishu_says_what_slack_says(
    walk: tuple[str, list[str]],
    slack_rt: Runtime,
    feishu_rt: Runtime,
    standin: FeishuStandIn,
) -> None:
    language, lines = walk
    assert lines[0] == "/gpu help"
    client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
    gate = build_gate(feishu_rt, client)
    verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
    server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
    slack = SlackSide(slack_rt)
    feishu = FeishuSide(feishu_rt, standin, server.base_url + EVENTS_PATH, client, language)
    answers: list[tuple[str, list[str]]] = []
    try:
        asking: tuple[SlackButton, FeishuButton] | None = None
        for line in lines:
            for rt in (slack_rt, feishu_rt):
                assert isinstance(rt.clock, Clock)
                rt.clock.advance(seconds=1)
            clicked = _CLICK.fullmatch(line)
            if line == ":home":
                expected, shown = slack.home(), feishu.command("/gpu home")
            elif line.startswith("/gpu "):
                expected, shown = slack.command(line.removeprefix("/gpu ")), feishu.command(line)
            elif clicked is not None:
                pair = numbered(slack.buttons, feishu.buttons, int(clicked.group(1)))
                if pair[0].dialog is not None:
                    assert pair[0].dialog == pair[1].dialog, f"{line!r}: the dialogs differ"
                    asking = pair
                    answers.append((line, pair[1].dialog))
                    continue
                expected, shown = slack.click(pair[0]), feishu.click(pair[1])
            elif line.lower() in YES:
                assert asking is not None, f"{line!r} answers no question"
                expected, shown = slack.click(asking[0]), feishu.click(asking[1])
                asking = None
            else:
                pytest.fail(f"the walk has a line this test does not repeat: {line!r}")
            assert_says_the_same(line, expected, shown)
            answers.append((line, shown))
    finally:
        server.shutdown()
        gate.front.close()
    assert_the_readmes_facts(language, answers)


def numbered(
    slack: Sequence[SlackButton], feishu: Sequence[FeishuButton], number: int
) -> tuple[SlackButton, FeishuButton]:
    """Button ``number`` on both sides, the same button."""
    assert len(slack) == len(feishu), (
        f"Slack showed {len(slack)} buttons, Feishu {len(feishu)}: "
        f"{[b.label for b in slack]} / {[b.label for b in feishu]}"
    )
    assert 1 <= number <= len(slack), f"there is no button {number}"
    pair = slack[number - 1], feishu[number - 1]
    assert pair[0].label == pair[1].label
    assert pair[0].element["action_id"] == pair[1].value["action_id"]
    return pair


def assert_says_the_same(line: str, expected: Sequence[Pieces], shown: Sequence[str]) -> None:
    """One Feishu card for each Slack message, holding every word of it, in order."""
    assert len(shown) == len(expected), f"{line!r}: Slack showed {expected!r}, Feishu {shown!r}"
    for pieces, card in zip(expected, shown, strict=True):
        assert pieces, f"{line!r}: Slack showed an empty message"
        for piece in pieces:
            assert piece in card, f"{line!r}: Feishu's card lacks {piece!r}: {card!r}"


def assert_the_readmes_facts(language: str, answers: Sequence[tuple[str, list[str]]]) -> None:
    """What the README's walk promises, in the cards Feishu was given."""
    first: dict[str, str] = {}
    for line, cards in answers:
        first.setdefault(line, " ".join(cards))
    last = " ".join(answers[-1][1])
    released = " ".join([cards for line, cards in answers if line.lower() in YES][-1])
    if language == "zh":
        assert "1x 4090 · ¥1.98/小时" in first["/gpu status"]
        assert "剩余 2 小时 29 分" in first[":home"]
        assert "¥1.66/小时起" in first["/gpu fit 7b inference"]
        assert "请立即在平台上释放 local" in first["y"]
        assert "local 已释放，已停止计费" in released  # noqa: RUF001 - the README's punctuation
        assert "还没有实例" in " ".join(answers[-2][1])
        assert "简体中文" in last
    else:
        assert "Release local (local)? It has cost $0.00 so far." in first["/gpu release local"]
        assert "Please release local on its platform now (requested by its owner)" in first["y"]
        assert "local is released. The meter stopped. It cost $0.00" in released


def slack_words(text: str, blocks: Sequence[Mapping[str, Any]]) -> Pieces:
    """What a Slack message says, piece by piece (its blocks, or its text), as plain text."""
    pieces = list(_block_texts(blocks)) if blocks else [text]
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


def _block_buttons(blocks: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """The buttons the console numbers in Slack's blocks, in its order (links are not)."""
    for block in blocks:
        elements = list(block.get("elements", ())) if block.get("type") == "actions" else []
        accessory = block.get("accessory")
        if block.get("type") == "section" and isinstance(accessory, dict):
            elements.append(accessory)
        for element in elements:
            if element.get("type") == "button" and not element.get("url"):
                yield element


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


def _card_buttons(elements: Sequence[Any]) -> Iterator[Mapping[str, Any]]:
    """A card's buttons that call the bot back, in the order the card shows them."""
    for element in elements:
        if not isinstance(element, dict):
            continue
        behaviors = element.get("behaviors", [])
        if element.get("tag") == "button" and any(b.get("type") == "callback" for b in behaviors):
            yield element
        yield from _card_buttons(element.get("elements", []))
        yield from _card_buttons(element.get("columns", []))


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
