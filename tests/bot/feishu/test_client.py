"""FeishuClient against the stand-in: calls in the bot's terms, and every failure typed the way
the outbox reads it (unknown outcome, refused for good, slow down), with the uuid making a
retry of an unknown outcome safe."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bot.blocks import forms
from bot.errors import FeishuError
from bot.feishu.cards import card_of, form_of
from bot.feishu.client import UUID_MAX, FeishuClient, message_uuid
from bot.feishu.standin import CHAT_RATE_PER_S, Fault, FeishuStandIn
from bot.services.speaking.outbox import failure_kind
from tests.bot.blocks.test_forms import OFFERS

CHAT = "oc_ops"
CARD = card_of("*box* is due", ())


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    # A clock that stands still: the per-chat rate counts every send as in the same second.
    with FeishuStandIn(bot_chats={CHAT}, clock=lambda: 1000.0) as server:
        yield server


def client_for(standin: FeishuStandIn, *, timeout_s: float = 2.0, **kwargs: str) -> FeishuClient:
    return FeishuClient(
        kwargs.get("app_id", standin.app_id),
        kwargs.get("app_secret", standin.app_secret),
        api_url=standin.url,
        timeout_s=timeout_s,
    )


def failure(call: object) -> FeishuError:
    assert callable(call)
    with pytest.raises(FeishuError) as caught:
        call()
    return caught.value


def test_send_reply_update_and_files(standin: FeishuStandIn) -> None:
    client = client_for(standin)
    root = client.send("chat_id", CHAT, CARD, uuid="u-1")
    reply = client.reply(root, card_of("done", ()), uuid="u-2", in_thread=True)
    client.update(root, card_of("*box* was released", ()))
    dm = client.send("open_id", "ou_alice", CARD, uuid="u-3")
    chart = client.send_file(
        "chat_id", CHAT, "spend.png", b"\x89PNG", uuid="u-4", reply_to=root, in_thread=True
    )
    csv = client.send_file("open_id", "ou_alice", "spend-2026-03.csv", b"a,b\n", uuid="u-5")
    stored = {m.message_id: m for m in standin.messages}
    assert stored[root].card["body"]["elements"][0]["content"] == "**box** was released"
    assert stored[reply].root_id == root
    assert stored[reply].thread_id is not None
    assert stored[dm].chat_id == FeishuStandIn.p2p_chat("ou_alice")
    assert stored[chart].msg_type == "image"
    assert stored[chart].thread_id == stored[reply].thread_id
    assert stored[csv].msg_type == "file"
    image, file = standin.uploads
    assert (image.kind, image.content) == ("image", b"\x89PNG")
    assert (file.kind, file.name, file.content) == ("file", "spend-2026-03.csv", b"a,b\n")
    assert stored[csv].card == {"file_key": file.key}
    assert client.upload_file("report.pdf", b"%PDF").startswith("file_v3_")


@pytest.mark.parametrize("fault", [Fault.LOST, Fault.SLOW])
def test_an_unknown_outcome_retried_with_its_uuid_makes_one_message(
    standin: FeishuStandIn, fault: Fault
) -> None:
    client = client_for(standin, timeout_s=0.2)
    client.send("chat_id", CHAT, CARD, uuid="warm")
    standin.fault(fault, delay_s=0.4)
    uuid = message_uuid("outbox:7", CHAT)
    error = failure(lambda: client.send("chat_id", CHAT, CARD, uuid=uuid))
    assert error.outcome_unknown
    assert error.error == "unreachable"
    assert failure_kind(error) == "unknown"
    again = client.send("chat_id", CHAT, CARD, uuid=uuid)
    assert [m.message_id for m in standin.messages if m.uuid == uuid] == [again]
    assert len(standin.messages) == 2


@pytest.mark.parametrize(
    ("fault", "status"),
    [(Fault.SERVER_ERROR, "500"), (Fault.HTML_404, "404"), (Fault.NO_DATA, "200")],
)
def test_a_5xx_a_page_not_feishus_or_an_odd_shape_is_an_unknown_outcome(
    standin: FeishuStandIn, fault: Fault, status: str
) -> None:
    client = client_for(standin)
    standin.fault(fault)
    error = failure(lambda: client.send("chat_id", CHAT, CARD, uuid="x"))
    assert error.outcome_unknown
    assert error.error == "unknown_answer"
    assert f"HTTP {status}" in error.message
    assert failure_kind(error) == "unknown"


def test_slow_down_is_retry_later_and_nothing_was_sent(standin: FeishuStandIn) -> None:
    client = client_for(standin)
    standin.fault(Fault.RATE_LIMIT)
    limited = failure(lambda: client.send("chat_id", CHAT, CARD, uuid="a"))
    assert (limited.error, limited.code, limited.retry_after_s) == ("ratelimited", 99991400, 1.0)
    assert not limited.outcome_unknown
    assert failure_kind(limited) == "retry"
    standin.fault(Fault.RATE_LIMIT_TEXT)
    text = failure(lambda: client.send("chat_id", CHAT, CARD, uuid="a"))
    assert (text.error, text.retry_after_s, text.outcome_unknown) == ("ratelimited", None, False)
    for i in range(CHAT_RATE_PER_S):
        client.send("chat_id", CHAT, CARD, uuid=f"m-{i}")
    chat = failure(lambda: client.send("chat_id", CHAT, CARD, uuid="m-over"))
    assert (chat.error, chat.code, chat.outcome_unknown) == ("ratelimited", 230020, False)
    assert len(standin.messages) == CHAT_RATE_PER_S


def test_feishus_own_refusals_are_definite_and_typed(standin: FeishuStandIn) -> None:
    client = client_for(standin)
    outside = failure(lambda: client.send("chat_id", "oc_elsewhere", CARD, uuid="a"))
    assert (outside.error, outside.code, outside.outcome_unknown) == (
        "not_in_channel",
        230002,
        False,
    )
    assert failure_kind(outside) == "permanent"
    assert "GPUBOT_FEISHU_CHAT" in outside.hint
    bad_card = {**CARD, "body": {"elements": [{"tag": "blink"}]}}
    refused = failure(lambda: client.send("chat_id", CHAT, bad_card, uuid="b"))
    assert (refused.error, refused.code) == ("invalid_blocks", 230099)
    assert failure_kind(refused) == "permanent"
    missing = failure(lambda: client.reply("om_nope", CARD, uuid="c", in_thread=False))
    assert (missing.error, missing.outcome_unknown) == ("invalid_arguments", False)
    assert standin.messages == []


def test_a_wrong_secret_or_no_server_sends_nothing(standin: FeishuStandIn) -> None:
    wrong = client_for(standin, app_id="cli_wrong", app_secret="nope")
    denied = failure(lambda: wrong.send("chat_id", CHAT, CARD, uuid="a"))
    assert (denied.error, denied.code, denied.outcome_unknown) == ("invalid_auth", 10014, False)
    url = standin.url
    standin.stop()
    gone = FeishuClient("cli_gone", "s", api_url=url, timeout_s=0.5)
    refused = failure(lambda: gone.send("chat_id", CHAT, CARD, uuid="b"))
    assert (refused.error, refused.outcome_unknown) == ("unreachable", False)
    assert failure_kind(refused) == "retry"


def test_a_refused_token_is_forgotten_and_the_next_call_gets_a_new_one() -> None:
    with FeishuStandIn(app_id="cli_rotating") as standin:
        client = client_for(standin)
        client.send("chat_id", CHAT, CARD, uuid="a")
        standin.rotate_token()
        expired = failure(lambda: client.send("chat_id", CHAT, CARD, uuid="b"))
        assert (expired.error, expired.code) == ("token_expired", 99991663)
        client.send("chat_id", CHAT, CARD, uuid="b")
        assert [m.uuid for m in standin.messages] == ["a", "b"]


def test_message_uuids_are_stable_short_and_distinct() -> None:
    uuid = message_uuid("outbox:1", "oc_ops")
    assert uuid == message_uuid("outbox:1", "oc_ops")
    assert len(uuid) <= UUID_MAX
    assert uuid != message_uuid("outbox:1", "feishu:ou_a")
    assert uuid != message_uuid("outbox:11", "oc_ops")


def test_a_form_card_is_taken_and_a_form_outside_a_form_is_not(standin: FeishuStandIn) -> None:
    client = client_for(standin)
    view = forms.rent_form(OFFERS, ["aws", "lambda"])
    message_id = client.send("open_id", "ou_alice", form_of(view), uuid="form-1")
    stored = standin.message(message_id)
    assert stored is not None
    assert stored.card["body"]["elements"][0]["tag"] == "form"
    loose = card_of("x", ())
    loose["body"]["elements"].append({"tag": "input", "name": "free"})
    refused = failure(lambda: client.send("chat_id", CHAT, loose, uuid="form-2"))
    assert refused.error == "invalid_blocks"
