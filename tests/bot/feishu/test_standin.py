"""The Feishu stand-in, judged by the official SDK: it takes the SDK's own requests and the SDK
reads every answer it gives; idempotent message uuids, the per-chat rate, strict fields and
cards, and the faults it puts on when asked."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import lark_oapi as lark
import pytest
import requests
from lark_oapi.api.auth.v3 import (
    InternalTenantAccessTokenRequest,
    InternalTenantAccessTokenRequestBody,
)
from lark_oapi.api.im.v1 import (
    CreateFileRequest,
    CreateFileRequestBody,
    CreateImageRequest,
    CreateImageRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    ListMessageRequest,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)

from bot.feishu.cards import card_of
from bot.feishu.standin import (
    APP_RATE_PER_S,
    CHAT_RATE_PER_S,
    CODE_BAD_CARD,
    CODE_BAD_FIELD,
    CODE_BAD_SECRET,
    CODE_BAD_TOKEN,
    CODE_BOT_NOT_IN_CHAT,
    CODE_CHAT_RATE,
    CODE_RATE_LIMIT,
    CODE_TOO_LONG,
    UUID_WINDOW_S,
    Fault,
    FeishuStandIn,
)

CHAT = "oc_ops"


class Clock:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def standin(clock: Clock) -> Iterator[FeishuStandIn]:
    with FeishuStandIn(clock=clock) as server:
        yield server


def sdk(standin: FeishuStandIn, *, app_id: str | None = None, timeout_s: float = 2.0) -> Any:
    """The official client pointed at the stand-in."""
    return (
        lark.Client.builder()
        .app_id(app_id or standin.app_id)
        .app_secret(standin.app_secret)
        .domain(standin.url)
        .timeout(timeout_s)
        .log_level(lark.LogLevel.ERROR)
        .build()
    )


def card_json(text: str = "*hello*") -> str:
    return json.dumps(card_of(text, ()))


def create(
    client: Any, *, uuid: str | None = None, chat: str = CHAT, content: str | None = None
) -> Any:
    body = CreateMessageRequestBody.builder().receive_id(chat).msg_type("interactive")
    body = body.content(content or card_json())
    if uuid is not None:
        body = body.uuid(uuid)
    request = CreateMessageRequest.builder().receive_id_type("chat_id").request_body(body.build())
    return client.im.v1.message.create(request.build())


def test_the_sdk_gets_a_tenant_token_and_a_wrong_secret_is_refused(
    standin: FeishuStandIn,
) -> None:
    client = sdk(standin)
    body = InternalTenantAccessTokenRequestBody.builder().app_id(standin.app_id)
    request = InternalTenantAccessTokenRequest.builder().request_body(
        body.app_secret(standin.app_secret).build()
    )
    response = client.auth.v3.tenant_access_token.internal(request.build())
    assert response.code == 0
    assert json.loads(response.raw.content)["tenant_access_token"] == standin.token
    wrong = InternalTenantAccessTokenRequest.builder().request_body(
        InternalTenantAccessTokenRequestBody.builder().app_id("x").app_secret("y").build()
    )
    assert client.auth.v3.tenant_access_token.internal(wrong.build()).code == CODE_BAD_SECRET


def test_a_message_is_created_once_per_uuid_within_the_hour(
    standin: FeishuStandIn, clock: Clock
) -> None:
    client = sdk(standin)
    first = create(client, uuid="k-1")
    again = create(client, uuid="k-1")
    assert first.success(), first.msg
    assert first.data.message_id == again.data.message_id
    assert first.data.chat_id == CHAT
    assert first.data.msg_type == "interactive"
    assert first.data.sender.sender_type == "app"
    assert len(standin.messages) == 1
    other = create(client, uuid="k-2")
    assert other.data.message_id != first.data.message_id
    clock.now += UUID_WINDOW_S + 1
    later = create(client, uuid="k-1")
    assert later.data.message_id not in (first.data.message_id, other.data.message_id)
    assert len(standin.messages) == 3
    assert standin.messages[0].card["body"]["elements"][0]["content"] == "**hello**"


def test_a_reply_in_thread_a_patched_card_and_the_history(standin: FeishuStandIn) -> None:
    client = sdk(standin)
    root = create(client, uuid="root").data.message_id
    body = ReplyMessageRequestBody.builder().msg_type("interactive").content(card_json("re"))
    reply = client.im.v1.message.reply(
        ReplyMessageRequest.builder()
        .message_id(root)
        .request_body(body.reply_in_thread(True).uuid("r-1").build())
        .build()
    )
    assert reply.success(), reply.msg
    assert reply.data.root_id == root
    assert reply.data.parent_id == root
    assert reply.data.thread_id.startswith("omt_")
    patch = PatchMessageRequestBody.builder().content(card_json("*changed*")).build()
    patched = client.im.v1.message.patch(
        PatchMessageRequest.builder().message_id(root).request_body(patch).build()
    )
    assert patched.success(), patched.msg
    stored = standin.message(root)
    assert stored is not None
    assert stored.card["body"]["elements"][0]["content"] == "**changed**"
    assert len(stored.versions) == 1
    listed = client.im.v1.message.list(
        ListMessageRequest.builder()
        .container_id_type("chat")
        .container_id(CHAT)
        .sort_type("ByCreateTimeDesc")
        .page_size(20)
        .build()
    )
    assert listed.success(), listed.msg
    assert [item.message_id for item in listed.data.items] == [reply.data.message_id, root]
    assert listed.data.items[1].updated is True
    gone = client.im.v1.message.reply(
        ReplyMessageRequest.builder().message_id("om_nope").request_body(body.build()).build()
    )
    assert gone.code == 230001


def test_images_and_files_are_uploaded(standin: FeishuStandIn) -> None:
    client = sdk(standin)
    image = CreateImageRequestBody.builder().image_type("message").image(io.BytesIO(b"\x89PNG1"))
    made = client.im.v1.image.create(
        CreateImageRequest.builder().request_body(image.build()).build()
    )
    assert made.success(), made.msg
    assert made.data.image_key.startswith("img_v3_")
    body = CreateFileRequestBody.builder().file_type("stream").file_name("spend.csv")
    uploaded = client.im.v1.file.create(
        CreateFileRequest.builder()
        .request_body(body.file(io.BytesIO(b"a,b\n1,2\n")).build())
        .build()
    )
    assert uploaded.success(), uploaded.msg
    assert uploaded.data.file_key.startswith("file_v3_")
    assert [(u.kind, u.name, u.content) for u in standin.uploads] == [
        ("image", "", b"\x89PNG1"),
        ("file", "spend.csv", b"a,b\n1,2\n"),
    ]
    bad = CreateFileRequestBody.builder().file_type("exe").file_name("x.exe")
    refused = client.im.v1.file.create(
        CreateFileRequest.builder().request_body(bad.file(io.BytesIO(b"x")).build()).build()
    )
    assert refused.code == CODE_BAD_FIELD


def test_a_chat_takes_five_messages_a_second(standin: FeishuStandIn, clock: Clock) -> None:
    client = sdk(standin)
    answers = [create(client, uuid=f"m-{i}") for i in range(CHAT_RATE_PER_S + 1)]
    assert [a.code for a in answers] == [0] * CHAT_RATE_PER_S + [CODE_CHAT_RATE]
    assert create(client, uuid="other", chat="oc_other").success()
    clock.now += 1.0
    assert create(client, uuid="m-late").success()
    assert len(standin.messages) == CHAT_RATE_PER_S + 2


def test_unknown_fields_and_cards_feishu_cannot_read_are_refused(standin: FeishuStandIn) -> None:
    client = sdk(standin)
    body = CreateMessageRequestBody.builder().receive_id(CHAT).msg_type("interactive")
    built = body.content(card_json()).build()
    built.priority = "high"  # a field Feishu does not have
    refused = client.im.v1.message.create(
        CreateMessageRequest.builder().receive_id_type("chat_id").request_body(built).build()
    )
    assert refused.code == CODE_BAD_FIELD
    assert "priority" in refused.msg
    card = card_of("x", ())
    card["body"]["elements"][0]["colour"] = "red"
    assert create(client, content=json.dumps(card)).code == CODE_BAD_CARD
    assert create(client, content=json.dumps({"elements": []})).code == CODE_BAD_CARD
    huge = card_of("x", ())
    huge["body"]["elements"] = [{"tag": "markdown", "content": "x" * 40_000}]
    assert create(client, content=json.dumps(huge)).code == CODE_TOO_LONG
    assert create(client, uuid="u" * 51).code == CODE_BAD_FIELD
    assert standin.messages == []


def test_a_group_without_the_bot_and_a_bad_token_are_refused() -> None:
    with FeishuStandIn(bot_chats={CHAT}) as standin:
        client = sdk(standin)
        assert create(client).success()
        assert create(client, chat="oc_elsewhere").code == CODE_BOT_NOT_IN_CHAT
        answer = requests.post(
            standin.url + "/open-apis/im/v1/messages?receive_id_type=chat_id",
            json={"receive_id": CHAT, "msg_type": "text", "content": '{"text":"x"}'},
            headers={"Authorization": "Bearer t-forged"},
            timeout=2,
        )
        assert answer.json()["code"] == CODE_BAD_TOKEN
        unknown = requests.get(standin.url + "/open-apis/im/v9/nothing", timeout=2)
        assert unknown.status_code == 404


def test_a_slow_answer_and_a_lost_one_still_store_the_message(standin: FeishuStandIn) -> None:
    client = sdk(standin, timeout_s=0.2)
    create(client, uuid="warm")  # the token, before any fault
    standin.fault(Fault.SLOW, delay_s=0.5)
    with pytest.raises(requests.ReadTimeout):
        create(client, uuid="slow")
    standin.fault(Fault.LOST)
    with pytest.raises(requests.ConnectionError):
        create(client, uuid="lost")
    assert [m.uuid for m in standin.messages] == ["warm", "slow", "lost"]


def test_rate_limits_errors_and_a_proxys_page_on_demand(standin: FeishuStandIn) -> None:
    client = sdk(standin)
    create(client, uuid="warm")
    standin.fault(Fault.RATE_LIMIT)
    limited = create(client, uuid="a")
    assert limited.code == CODE_RATE_LIMIT
    assert limited.raw.status_code == 429
    assert limited.raw.headers["x-ogw-ratelimit-reset"] == "1"
    standin.fault(Fault.SERVER_ERROR)
    failed = create(client, uuid="b")
    assert (failed.raw.status_code, failed.code) == (500, 1500)
    for fault, status in ((Fault.RATE_LIMIT_TEXT, 429), (Fault.HTML_404, 404)):
        standin.fault(fault)
        with pytest.raises(ValueError, match="Expecting value"):  # the SDK reads JSON only
            create(client, uuid="c")
        assert standin.requests[-1].answered == status
    assert [m.uuid for m in standin.messages] == ["warm"]
    assert create(client, uuid="c").success()


def test_the_app_sends_at_most_fifty_messages_a_second(standin: FeishuStandIn) -> None:
    client = sdk(standin)
    answers = [create(client, uuid=f"a-{i}", chat=f"oc_{i}") for i in range(APP_RATE_PER_S)]
    assert all(a.success() for a in answers)
    over = create(client, uuid="over", chat="oc_over")
    assert (over.raw.status_code, over.code) == (429, CODE_RATE_LIMIT)
    assert len(standin.messages) == APP_RATE_PER_S
