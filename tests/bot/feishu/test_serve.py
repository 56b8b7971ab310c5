"""The request URL /feishu/events on the production HTTP server, sent real encrypted and signed
requests over a real socket; and the long connection's dispatcher, sent the SDK's frames."""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTriggerResponse
from lark_oapi.event.dispatcher_handler import EventDispatcherHandler

from bot.cli import main
from bot.commands.registry import ActionSpec, CommandSpec, Registry, Reply
from bot.errors import ConfigError, StoreError
from bot.feishu.client import FeishuClient
from bot.feishu.events import EventOnce, EventVerifier
from bot.feishu.front import FeishuFront
from bot.feishu.serve import (
    EVENTS_PATH,
    EventGate,
    FeishuEndpoint,
    GuardedDispatcher,
    LongConnection,
    build_gate,
    long_connection_dispatcher,
)
from bot.feishu.standin import FeishuStandIn, StoredMessage
from bot.http_server import SlackHttpServer
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Instance
from tests.bot.feishu.doubles import RecordingSender, action_of, card_of
from tests.bot.feishu.test_events import KEY, TOKEN, card_event, message_event, sealed
from tests.bot.services.support import Clock, add_instance, make_runtime

RAN: list[str] = []


def _whoami(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    RAN.append(caller.user_id)
    return Reply(text=f"you are {caller.user_id}", ephemeral=False)


def _swap(rt: Runtime, caller: Caller, value: str) -> Reply:
    RAN.append(caller.user_id)
    return Reply(text=f"swapped {value}", replace_original=True)


def registry() -> Registry:
    made = Registry()
    made.command(
        CommandSpec(
            name="whoami",
            summary="who",
            usage="/gpu whoami",
            examples=(),
            configure=lambda parser: None,
            handler=_whoami,
        )
    )
    made.action(ActionSpec("swap", _swap))
    return made


@dataclass
class Served:
    url: str
    sender: RecordingSender
    front: FeishuFront


class FailingGuard:
    """A replay guard whose store does not answer."""

    def first_time(self, signature: str, timestamp: str | None) -> bool:
        raise StoreError("the database is gone")


def gate_for(rt: Runtime, sender: RecordingSender, once: EventOnce | None = None) -> EventGate:
    front = FeishuFront(rt, registry(), sender, card_of=card_of, action_of=action_of)
    return EventGate(front, once if once is not None else EventOnce())


@pytest.fixture
def rt(sqlite_db: Database) -> Runtime:
    return make_runtime(sqlite_db, Clock())


@pytest.fixture
def served(rt: Runtime) -> Iterator[Served]:
    RAN.clear()
    sender = RecordingSender()
    gate = gate_for(rt, sender)
    verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
    server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
    try:
        yield Served(server.base_url + EVENTS_PATH, sender, gate.front)
    finally:
        server.shutdown()
        gate.front.close()


def post(
    url: str, headers: dict[str, str], body: bytes, method: str = "POST"
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def now_sealed(payload: dict[str, Any], **kwargs: Any) -> tuple[dict[str, str], bytes]:
    return sealed(payload, stamp=kwargs.pop("stamp", time.time()), **kwargs)


# --- over HTTP ---------------------------------------------------------------------------------


def test_the_url_challenge_is_answered(served: Served) -> None:
    _, body = now_sealed({"challenge": "ch-42", "token": TOKEN, "type": "url_verification"})
    assert post(served.url, {"Content-Type": "application/json"}, body) == (
        200,
        {"challenge": "ch-42"},
    )


def test_a_message_runs_its_command_and_the_reply_is_sent(served: Served) -> None:
    headers, body = now_sealed(message_event("/gpu whoami"))
    assert post(served.url, headers, body) == (200, {})
    [sent] = served.sender.wait_for(1)
    assert (sent.how, sent.target) == ("reply", "om_1")
    assert sent.card["text"] == "you are feishu:ou_alice"
    assert RAN == ["feishu:ou_alice"]


def test_an_event_sent_again_runs_once(served: Served) -> None:
    payload = message_event("/gpu whoami", event_id="ev-twice")
    first = now_sealed(payload)
    again = now_sealed(payload, nonce="another")  # Feishu's retry: signed anew
    assert post(served.url, *first) == (200, {})
    assert post(served.url, *again) == (200, {})
    served.sender.wait_for(1)
    time.sleep(0.2)
    assert len(served.sender.sent) == 1
    assert RAN == ["feishu:ou_alice"]


def test_a_card_click_updates_the_card(served: Served) -> None:
    headers, body = now_sealed(card_event({"action_id": "swap", "value": "3"}))
    assert post(served.url, headers, body) == (200, {})
    [sent] = served.sender.wait_for(1)
    assert (sent.how, sent.target, sent.card["text"]) == ("update", "om_card", "swapped 3")
    assert RAN == ["feishu:ou_bob"]


def test_a_bad_signature_is_401_and_runs_nothing(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    headers, body = now_sealed(message_event("/gpu whoami"))
    headers["X-Lark-Signature"] = "0" * 64
    with caplog.at_level(logging.INFO):
        assert post(served.url, headers, body) == (401, {})
    time.sleep(0.2)
    assert RAN == []
    assert served.sender.sent == []
    assert "a bad signature" in caplog.text
    assert "Traceback" not in caplog.text


def test_a_stale_timestamp_is_refused(served: Served) -> None:
    headers, body = now_sealed(message_event("/gpu whoami"), stamp=time.time() - 600)
    assert post(served.url, headers, body)[0] == 401
    assert RAN == []


def test_a_wrong_token_is_refused(served: Served) -> None:
    headers, body = now_sealed(message_event("/gpu whoami", token="guessed"))
    assert post(served.url, headers, body)[0] == 401
    assert RAN == []


def test_an_unknown_event_is_200_without_a_traceback(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    payload = message_event()
    payload["header"]["event_type"] = "im.message.reaction.created_v1"
    headers, body = now_sealed(payload)
    with caplog.at_level(logging.DEBUG):
        assert post(served.url, headers, body) == (200, {})
    ours = [record for record in caplog.records if record.name.startswith("bot.")]
    assert [record.levelno for record in ours] == [logging.DEBUG]
    assert not [record for record in caplog.records if record.exc_info]
    assert served.sender.sent == []


@pytest.mark.parametrize(
    ("path", "method", "status"),
    [(EVENTS_PATH, "GET", 405), ("/slack/events", "POST", 404), ("/", "POST", 404)],
)
def test_other_paths_and_methods(served: Served, path: str, method: str, status: int) -> None:
    url = served.url.replace(EVENTS_PATH, path)
    body = None if method == "GET" else b"{}"
    request = urllib.request.Request(url, data=body, method=method)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == status


def test_an_unreadable_body_is_400(served: Served) -> None:
    assert post(served.url, {}, b"not json")[0] == 400


def test_a_store_that_cannot_say_whether_an_event_is_new_is_503(
    rt: Runtime, sqlite_db: Database
) -> None:
    RAN.clear()
    sender = RecordingSender()
    gate = gate_for(rt, sender, EventOnce(FailingGuard()))  # type: ignore[arg-type]
    verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
    server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
    try:
        headers, body = now_sealed(message_event("/gpu whoami"))
        assert post(server.base_url + EVENTS_PATH, headers, body)[0] == 503
    finally:
        server.shutdown()
        gate.front.close()
    assert RAN == []


# --- the long connection -----------------------------------------------------------------------


@pytest.fixture
def dispatcher(rt: Runtime) -> Iterator[tuple[GuardedDispatcher, RecordingSender]]:
    RAN.clear()
    sender = RecordingSender()
    gate = gate_for(rt, sender)
    yield long_connection_dispatcher(gate), sender
    gate.front.close()


def frame(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def test_a_message_frame_runs_its_command(
    dispatcher: tuple[GuardedDispatcher, RecordingSender],
) -> None:
    handler, sender = dispatcher
    assert isinstance(handler, EventDispatcherHandler)
    assert handler._do_without_validation(frame(message_event("/gpu whoami"))) is None
    [sent] = sender.wait_for(1)
    assert sent.card["text"] == "you are feishu:ou_alice"


def test_a_card_frame_is_answered_through_the_sdks_callback(
    dispatcher: tuple[GuardedDispatcher, RecordingSender],
) -> None:
    handler, sender = dispatcher
    answer = handler._do_without_validation(frame(card_event({"action_id": "swap", "value": "5"})))
    assert isinstance(answer, P2CardActionTriggerResponse)
    [sent] = sender.wait_for(1)
    assert (sent.how, sent.target) == ("update", "om_card")
    assert RAN == ["feishu:ou_bob"]


def test_unknown_and_unreadable_frames_are_acknowledged_without_a_traceback(
    dispatcher: tuple[GuardedDispatcher, RecordingSender], caplog: pytest.LogCaptureFixture
) -> None:
    handler, sender = dispatcher
    unknown = message_event()
    unknown["header"]["event_type"] = "im.chat.disbanded_v1"
    broken = card_event({"action_id": "swap", "value": "5"})
    del broken["event"]["operator"]
    with caplog.at_level(logging.INFO):
        assert handler._do_without_validation(frame(unknown)) is None
        assert handler._do_without_validation(frame(broken)) is None
    assert "Traceback" not in caplog.text
    assert not [record for record in caplog.records if record.exc_info]
    assert sender.sent == []
    assert RAN == []


def test_the_long_connection_uses_the_sdk_client_with_the_settings_domain(
    rt: Runtime,
) -> None:
    made: dict[str, Any] = {}

    class FakeClient:
        def __init__(self, app_id: str, app_secret: str, **kwargs: Any) -> None:
            made.update(app_id=app_id, app_secret=app_secret, **kwargs)

        def start(self) -> None:
            raise ConnectionError("refused")

    gate = gate_for(rt, RecordingSender())
    connection = LongConnection(
        gate,
        app_id="cli_1",
        app_secret="s3cret",
        domain="http://127.0.0.1:9/",
        make_client=FakeClient,
    )
    try:
        assert made["domain"] == "http://127.0.0.1:9"
        assert isinstance(made["event_handler"], GuardedDispatcher)
        with pytest.raises(ConnectionError):
            connection.run()
    finally:
        gate.front.close()


# --- settings and `gpubot feishu` --------------------------------------------------------------


def test_the_feishu_settings_are_read_and_their_secrets_never_shown() -> None:
    settings = Settings.from_env(
        {
            "FEISHU_APP_ID": "cli_app",
            "FEISHU_APP_SECRET": "app-secret-value",
            "FEISHU_VERIFICATION_TOKEN": "token-value",
            "FEISHU_ENCRYPT_KEY": "encrypt-key-value",
            "GPUBOT_FEISHU_CHAT": "oc_ops",
            "GPUBOT_FEISHU_ADMINS": "ou_boss, feishu:ou_second",
        }
    )
    assert settings.feishu_api_url == "https://open.feishu.cn"
    assert settings.feishu_chat == "oc_ops"
    assert settings.feishu_admins == frozenset({"ou_boss", "ou_second"})
    shown = repr(settings)
    for secret in ("app-secret-value", "token-value", "encrypt-key-value"):
        assert secret not in shown
    assert "cli_app" in shown
    assert settings.is_admin("feishu:ou_boss")
    assert not settings.is_admin("ou_boss")
    assert not settings.is_admin("feishu:ou_other")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"GPUBOT_FEISHU_ADMINS": "alice"},
            "GPUBOT_FEISHU_ADMINS: 'alice' is not a Feishu open_id",
        ),
        ({"GPUBOT_FEISHU_CHAT": "ops"}, "GPUBOT_FEISHU_CHAT='ops' is not a Feishu chat_id"),
        ({"GPUBOT_FEISHU_API_URL": "open.feishu.cn"}, "is not an http:// or https:// URL"),
    ],
)
def test_bad_feishu_settings_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(env)
    assert message in caught.value.message


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    umask = os.umask(0o022)
    os.umask(umask)
    for key in list(os.environ):
        if key.startswith(("SLACK_", "GPUBOT_", "FEISHU_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GPUBOT_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    os.umask(umask)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["feishu"], {}, "FEISHU_APP_ID is not set."),
        (["feishu"], {"FEISHU_APP_ID": "cli_1"}, "FEISHU_APP_SECRET is not set."),
        (
            ["feishu", "--http"],
            {"FEISHU_APP_ID": "cli_1", "FEISHU_APP_SECRET": "s"},
            "FEISHU_VERIFICATION_TOKEN is not set.",
        ),
        (
            ["feishu", "--http"],
            {"FEISHU_APP_ID": "cli_1", "FEISHU_APP_SECRET": "s", "FEISHU_VERIFICATION_TOKEN": "t"},
            "FEISHU_ENCRYPT_KEY is not set.",
        ),
    ],
)
def test_gpubot_feishu_needs_its_settings(
    clean_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (clean_env / "gpubot.sqlite3").exists()


# --- the whole way: Feishu's request in, the SDK's calls out to the stand-in -----------------


def test_a_release_asked_in_a_group_and_cancelled_on_its_card(
    rt: Runtime, sqlite_db: Database
) -> None:
    box = add_instance(sqlite_db, name="box", owner_id="feishu:ou_alice")
    with FeishuStandIn() as feishu:
        client = FeishuClient(feishu.app_id, feishu.app_secret, api_url=feishu.url)
        gate = build_gate(rt, client)
        verifier = EventVerifier(verification_token=TOKEN, encrypt_key=KEY)
        server = SlackHttpServer(None, chat=FeishuEndpoint(verifier, gate), port=0).start()
        url = server.base_url + EVENTS_PATH
        try:
            # Alice's message in the team's group, as Feishu stored it.
            typed = client.send_content(
                "chat_id", "oc_team", "text", {"text": "@_user_1 /gpu release box"}, uuid="typed"
            )
            mention = {"key": "@_user_1", "id": {"open_id": "ou_bot"}, "mentioned_type": "bot"}
            event = message_event(
                "@_user_1 /gpu release box", chat_type="group", mentions=[mention]
            )
            event["event"]["message"].update(chat_id="oc_team", message_id=typed)
            assert post(url, *now_sealed(event)) == (200, {})
            ask = _wait_for_message(feishu, feishu.p2p_chat("ou_alice"))
            assert ask.msg_type == "interactive"
            assert ask.card["schema"] == "2.0"
            assert "box" in json.dumps(ask.card, ensure_ascii=False)
            # The ask shows in Alice's own chat; she cancels on its card, which changes in place.
            click = card_event(
                {"action_id": "instance_release_cancel", "value": str(box)}, event_id="ev-x"
            )
            click["event"]["operator"]["open_id"] = "ou_alice"
            click["event"]["context"]["open_message_id"] = ask.message_id
            assert post(url, *now_sealed(click)) == (200, {})
            _wait_until(lambda: bool(feishu.message(ask.message_id).versions))  # type: ignore[union-attr]
        finally:
            server.shutdown()
            gate.front.close()
    with sqlite_db.session() as session:
        assert session.get(Instance, box).state == "active"  # type: ignore[union-attr]


def _wait_for_message(feishu: FeishuStandIn, chat_id: str) -> StoredMessage:
    _wait_until(lambda: any(m.chat_id == chat_id for m in feishu.messages))
    return next(m for m in feishu.messages if m.chat_id == chat_id)


def _wait_until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
