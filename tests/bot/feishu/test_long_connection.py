"""`gpubot feishu`'s long connection, the official SDK's own client (lark_oapi.ws.Client), against
a fake Feishu that speaks its protocol: the endpoint asked for over HTTP with the app's id and
secret, then a WebSocket carrying protobuf frames (lark_oapi/ws/pb). An event frame in
runs its command and the answer goes out through the OpenAPI stand-in; every frame is
acknowledged, one the bot does not handle without a traceback.

The SDK runs its connection on one event loop of its module for the life of the process, so a
single connection serves every test here (a module fixture)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from lark_oapi.ws import client as ws_client
from lark_oapi.ws.exception import ClientException
from lark_oapi.ws.pb.pbbp2_pb2 import Frame
from websockets.asyncio.server import Server, ServerConnection, serve

from bot.blocks.forms import REGISTER_FORM
from bot.blocks.home import HOME_REGISTER
from bot.feishu.client import FeishuClient
from bot.feishu.serve import EventGate, LongConnection, build_gate
from bot.feishu.standin import FeishuStandIn, StoredMessage
from tests.bot.feishu.test_events import card_event, message_event
from tests.bot.services.support import Clock, make_runtime
from tests.fixtures.store import fresh_database

APP_ID = "cli_longconn1"
APP_SECRET = "long-connection-secret"
ENDPOINT_PATH = "/callback/ws/endpoint"
#: Frame.method of a data frame (lark_oapi.ws.enum.FrameType.DATA); 0 is a control frame.
DATA = 1
WAIT_S = 10.0
#: Feishu's code for credentials it does not take at the endpoint (lark_oapi.ws.const).
AUTH_FAILED = 514


class FakeFeishuWs:
    """Feishu's side of the long connection: ``POST /callback/ws/endpoint`` answers the
    WebSocket's URL to an app with the right id and secret, and the WebSocket sends the frames
    a test gives it and keeps the data frames that come back (the acknowledgements)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.answers: queue.Queue[Frame] = queue.Queue()
        self.connected = threading.Event()
        self.asked: list[dict[str, Any]] = []
        self._socket: ServerConnection | None = None
        self._server: Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ids = itertools.count(1)

    def start(self) -> FakeFeishuWs:
        ready = threading.Event()

        async def listen() -> None:
            self._stop = asyncio.Event()
            async with serve(self._serve, "127.0.0.1", 0, close_timeout=1) as server:
                self._server = server
                ready.set()
                await self._stop.wait()

        self._thread = threading.Thread(
            target=self.loop.run_until_complete, args=(listen(),), name="fake-feishu-ws"
        )
        self._thread.daemon = True
        self._thread.start()
        assert ready.wait(WAIT_S)
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _endpoint_handler(self))
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop answering: the WebSocket is closed and its loop's thread ends."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        if self._thread is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(WAIT_S)
            self.loop.close()

    @property
    def domain(self) -> str:
        """The domain to give the SDK (its endpoint is asked for below it)."""
        assert self._http is not None
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def ws_url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/ws?device_id=dev-1&service_id=7"

    def send_event(self, payload: dict[str, Any]) -> str:
        """Send ``payload`` as an event data frame, as Feishu does; its message id."""
        message_id = f"msg-{next(self._ids)}"
        frame = Frame(
            SeqID=0, LogID=0, service=7, method=DATA, payload=json.dumps(payload).encode()
        )
        for key, value in (
            ("type", "event"),
            ("message_id", message_id),
            ("sum", "1"),
            ("seq", "0"),
            ("trace_id", f"trace-{message_id}"),
        ):
            header = frame.headers.add()
            header.key, header.value = key, value
        assert self._socket is not None, "the bot has not connected"
        sent = asyncio.run_coroutine_threadsafe(
            self._socket.send(frame.SerializeToString()), self.loop
        )
        sent.result(WAIT_S)
        return message_id

    def answer_to(self, message_id: str) -> dict[str, Any]:
        """The bot's acknowledgement of the frame ``message_id``: its JSON payload."""
        deadline = time.monotonic() + WAIT_S
        while True:
            frame = self.answers.get(timeout=max(0.0, deadline - time.monotonic()))
            headers = {h.key: h.value for h in frame.headers}
            if headers.get("message_id") == message_id:
                answer = json.loads(frame.payload)
                assert isinstance(answer, dict)
                return answer

    async def _serve(self, socket: ServerConnection) -> None:
        self._socket = socket
        self.connected.set()
        async for raw in socket:
            frame = Frame()
            frame.ParseFromString(raw if isinstance(raw, bytes) else raw.encode())
            if frame.method == DATA:
                self.answers.put(frame)


def _endpoint_handler(fake: FakeFeishuWs) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            fake.asked.append(body)
            if self.path != ENDPOINT_PATH:
                answer: dict[str, Any] = {"code": 404, "msg": "not found"}
            elif body.get("AppID") != APP_ID or body.get("AppSecret") != APP_SECRET:
                answer = {"code": AUTH_FAILED, "msg": "app secret invalid"}
            else:
                config = {
                    "ReconnectCount": 0,
                    "ReconnectInterval": 1,
                    "ReconnectNonce": 0,
                    "PingInterval": 3600,
                }
                answer = {"code": 0, "data": {"URL": fake.ws_url, "ClientConfig": config}}
            raw = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


@dataclass
class Connected:
    fake: FakeFeishuWs
    standin: FeishuStandIn
    client: FeishuClient
    gate: EventGate
    refused: BaseException | None


@pytest.fixture(scope="module")
def connected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connected]:
    """The bot on a long connection to the fake Feishu, answering through the stand-in; first
    refused once with a wrong secret (what it raised is kept)."""
    tmp: Path = tmp_path_factory.mktemp("long-connection")
    fake = FakeFeishuWs().start()
    with fresh_database("sqlite", tmp) as db, FeishuStandIn() as standin:
        rt = make_runtime(db, Clock())
        client = FeishuClient(standin.app_id, standin.app_secret, api_url=standin.url)
        gate = build_gate(rt, client)
        refused: BaseException | None = None
        wrong = LongConnection(gate, app_id=APP_ID, app_secret="stale", domain=fake.domain)
        try:
            wrong.run()
        except ClientException as exc:
            refused = exc
        connection = LongConnection(gate, app_id=APP_ID, app_secret=APP_SECRET, domain=fake.domain)
        running = threading.Thread(target=connection.run, name="long-connection", daemon=True)
        running.start()
        assert fake.connected.wait(WAIT_S), "the SDK never connected"
        try:
            yield Connected(fake, standin, client, gate, refused)
        finally:
            connection.stop()  # run() returns ...
            running.join(WAIT_S)
            _end_the_sdks_loop()  # ... before the SDK's thread ends
            fake.stop()
            gate.front.close()


def _end_the_sdks_loop() -> None:
    """Cancel what the SDK runs on its module's event loop (its connection, pings and the
    wait that keeps it running), so that its thread ends with this module's tests."""
    loop = ws_client.loop

    async def cancel() -> None:
        for task in asyncio.all_tasks(loop):
            if task is not asyncio.current_task():
                task.cancel()

    asyncio.run_coroutine_threadsafe(cancel(), loop).result(WAIT_S)


def typed_in_p2p(connected: Connected, text: str, event_id: str) -> dict[str, Any]:
    """Alice's message ``text`` as Feishu stores it and its im.message.receive_v1 event."""
    message_id = connected.client.send_content(
        "open_id", "ou_alice", "text", {"text": text}, uuid=f"u-{event_id}"
    )
    event = message_event(text, event_id=event_id)
    event["event"]["message"].update(
        chat_id=connected.standin.p2p_chat("ou_alice"), message_id=message_id
    )
    return event


def wait_for(done: Callable[[], StoredMessage | None]) -> StoredMessage:
    deadline = time.monotonic() + WAIT_S
    while (found := done()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return found


def test_credentials_feishu_refuses_stop_the_connection_with_its_reason(
    connected: Connected,
) -> None:
    assert isinstance(connected.refused, ClientException)
    assert "app secret invalid" in str(connected.refused)
    assert {"AppID": APP_ID, "AppSecret": "stale"} in connected.fake.asked


def test_a_message_frame_runs_its_command_and_the_answer_goes_out(connected: Connected) -> None:
    event = typed_in_p2p(connected, "/gpu help", "ev-ws-help")
    typed = event["event"]["message"]["message_id"]
    frame_id = connected.fake.send_event(event)
    assert connected.fake.answer_to(frame_id)["code"] == 200
    answer = wait_for(
        lambda: next((m for m in connected.standin.messages if m.parent_id == typed), None)
    )
    assert answer.msg_type == "interactive"
    assert "/gpu status" in json.dumps(answer.card, ensure_ascii=False)


def test_a_card_frame_is_answered_and_its_button_runs(connected: Connected) -> None:
    p2p = connected.standin.p2p_chat("ou_alice")
    before = len([m for m in connected.standin.messages if m.chat_id == p2p])
    click = card_event({"action_id": HOME_REGISTER, "value": "register"}, event_id="ev-ws-card")
    click["event"]["operator"]["open_id"] = "ou_alice"
    frame_id = connected.fake.send_event(click)
    answer = connected.fake.answer_to(frame_id)
    assert answer["code"] == 200
    assert json.loads(base64.b64decode(answer["data"])) == {}  # no toast: it ran
    form = wait_for(
        lambda: next(
            (
                m
                for m in connected.standin.messages
                if m.chat_id == p2p and '"tag": "form"' in m.content
            ),
            None,
        )
    )
    assert REGISTER_FORM in form.content
    assert len([m for m in connected.standin.messages if m.chat_id == p2p]) == before + 1


def test_an_unknown_event_frame_is_acknowledged_without_a_traceback(
    connected: Connected, caplog: pytest.LogCaptureFixture
) -> None:
    unknown = message_event(event_id="ev-ws-unknown")
    unknown["header"]["event_type"] = "im.chat.member.bot.added_v1"
    broken = card_event({"action_id": "x", "value": "1"}, event_id="ev-ws-broken")
    del broken["event"]["operator"]
    sent = len(connected.standin.messages)
    with caplog.at_level(logging.INFO):
        for payload in (unknown, broken):
            assert connected.fake.answer_to(connected.fake.send_event(payload))["code"] == 200
    time.sleep(0.2)
    assert len(connected.standin.messages) == sent
    assert "Traceback" not in caplog.text
    assert not [record for record in caplog.records if record.exc_info]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
