"""Slack messages as Feishu cards: mrkdwn converted exactly, buttons that call back with the
Slack action, and every message the bot makes within Feishu's documented limits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from bot.blocks import forms, kit, money, render
from bot.blocks.forms import GpuChoice, Offer
from bot.feishu import cards
from bot.feishu.cards import (
    action_of,
    card_bytes,
    card_of,
    count_elements,
    form_of,
    markdown_of,
    plain_of,
    submission_of,
)
from bot.feishu.standin import card_problems
from bot.i18n import LANGUAGES, speaking
from bot.services.instances.deadlines import DeadlineWarning
from bot.services.money.budgets import BudgetAlert, BudgetStatus
from bot.services.money.digest import Digest, DigestData, JobSpend
from tests.bot.blocks.test_deadlines import NOW, PRICED, UNPRICED, _prompts
from tests.bot.blocks.test_escaping import RENDERERS as ESCAPING_RENDERERS
from tests.bot.blocks.test_forms import GPUS, OFFERS, PROVIDERS
from tests.bot.blocks.test_money import USD, report, spend_item
from tests.bot.blocks.test_text_property import FORMATTED, TRICKY, renderings

Message = tuple[str, tuple[dict[str, Any], ...]]


@pytest.mark.parametrize(
    ("mrkdwn", "markdown"),
    [
        ("*Release* now", "**Release** now"),
        ("_soon_ and ~gone~", "*soon* and ~~gone~~"),
        ("*bold _both_*", "**bold *both***"),
        ("<https://example.com/a?b=1|the console>", "[the console](https://example.com/a?b=1)"),
        ("<https://example.com>", "[https://example.com](https://example.com)"),
        ("<https://example.com/(x)|x>", "[x](https://example.com/(x%29)"),
        ("owner <@feishu:ou_7d8a6e6d>", "owner <at id=ou_7d8a6e6d></at>"),
        ("owner <@U0ALICE>", "owner @U0ALICE"),
        ("in <#C0OPS|ops>", "in #ops"),
        ("<!here> look", "@here look"),
        (":warning: late :white_check_mark:", "\u26a0\ufe0f late \u2705"),
        (":unknown_code: 12:00:30", ":unknown&#95;code: 12:00:30"),
        ("at 12:30:warning: now", "at 12:30\u26a0\ufe0f now"),
        ("<https://a.example/?x=1&amp;y=2|q>", "[q](https://a.example/?x=1&y=2)"),
        ("`gpu_8x *a100*`", "`gpu_8x *a100*`"),
        ("```line_1\n*two*```", "```\nline_1\n*two*\n```"),
        ("a &lt;b&gt; &amp; c", "a &lt;b&gt; &amp; c"),
        ("gpu_8x_a100 /dev/nvidia* 2*3", "gpu&#95;8x&#95;a100 /dev/nvidia&#42; 2&#42;3"),
        ("[text](https://evil.example)", "&#91;text&#93;(https://evil.example)"),
        ("# not a heading\nline #2", "&#35; not a heading\nline #2"),
        ("back\\slash", "back&#92;slash"),
    ],
)
def test_mrkdwn_becomes_feishu_markdown_exactly(mrkdwn: str, markdown: str) -> None:
    assert markdown_of(mrkdwn) == markdown


def test_plain_text_drops_marks_and_keeps_characters() -> None:
    assert plain_of("*Release* _x_ <https://a.example|docs> &lt;3 &amp; <@U1>") == (
        "Release x docs <3 & @U1"
    )
    assert plain_of("<@feishu:ou_abc>") == "@ou_abc"


@pytest.mark.parametrize("word", TRICKY)
def test_text_from_people_never_becomes_a_mention_link_or_formatting(word: str) -> None:
    hostile = f"<at id=all></at> [x](https://e.example) **{word}** *{word}* _{word}_ ~{word}~"
    escaped = kit.escape(hostile)
    shown = markdown_of(escaped)
    assert "<at" not in shown
    assert "](" not in shown
    # Formatting only where Slack itself reads some in the escaped text (``**<**`` escapes to
    # a look-alike, a mark, ``&lt;``, a look-alike and a mark, which Slack's rule reads as
    # bold): the card shows what Slack shows.
    if not FORMATTED.search(escaped):
        assert "**" not in shown
        assert "~~" not in shown
        assert "*" not in shown.replace("&#42;", "")


def test_a_malformed_feishu_id_stays_text() -> None:
    assert markdown_of("<@feishu:ou_x id=all>") == "@feishu:ou&#95;x id=all"


def _buttons(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in _walk(card["body"]["elements"]) if e.get("tag") == "button"]


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for key in ("elements", "columns"):
            yield from _walk(node.get(key, []))
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def test_a_button_calls_back_with_the_slack_action_and_asks_first() -> None:
    confirm = kit.confirm_dialog("Release *box*?", "It has cost *$3.00*.", confirm="Yes")
    blocks = (
        kit.header("Deadline"),
        kit.section("*box* is due"),
        kit.actions(
            [
                kit.button("Release", "release", "7", style="danger", confirm=confirm),
                kit.button("Extend 1h", "extend", "7:3600", style="primary"),
                kit.button("Keep", "keep", "7"),
            ]
        ),
    )
    card = card_of("box is due", blocks)
    assert card["header"] == {
        "title": {"tag": "plain_text", "content": "Deadline"},
        "template": "blue",
    }
    release, extend, keep = _buttons(card)
    assert release["behaviors"] == [
        {"type": "callback", "value": {"action_id": "release", "value": "7"}}
    ]
    assert release["type"] == "danger"
    assert release["confirm"] == {
        "title": {"tag": "plain_text", "content": "Release box?"},
        "text": {"tag": "plain_text", "content": "It has cost $3.00."},
    }
    assert (extend["type"], keep["type"]) == ("primary", "default")
    assert "confirm" not in keep
    assert action_of(extend["behaviors"][0]["value"]) == ("extend", "7:3600")
    [row] = [e for e in card["body"]["elements"] if e["tag"] == "column_set"]
    assert [c["elements"][0]["tag"] for c in row["columns"]] == ["button"] * 3
    assert card_problems(card) == []


@pytest.mark.parametrize(
    "value",
    [{}, {"action_id": "x"}, {"action_id": "", "value": "1"}, {"action_id": 3, "value": ""}],
)
def test_a_callback_the_bot_did_not_write_is_refused(value: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="action_id"):
        action_of(value)


def test_blocks_map_to_their_card_components() -> None:
    blocks = (
        kit.section("intro"),
        kit.header("A later header *not bold*"),
        kit.fields(["*GPU*\nA100", "*Owner*\n<@feishu:ou_1>", "*Cost*\n$2"]),
        kit.divider(),
        kit.context("just now", "_1 poll_"),
        kit.section("with a button", accessory=kit.button("Open", "open", "1")),
    )
    card = card_of("fallback", blocks)
    tags = [e["tag"] for e in card["body"]["elements"]]
    assert tags == ["markdown", "markdown", "column_set", "hr", "markdown", "markdown", "button"]
    assert "header" not in card
    assert card["body"]["elements"][1]["content"] == "**A later header &#42;not bold&#42;**"
    left, right = card["body"]["elements"][2]["columns"]
    assert [e["content"] for e in left["elements"]] == ["**GPU**\nA100", "**Cost**\n$2"]
    assert [e["content"] for e in right["elements"]] == ["**Owner**\n<at id=ou_1></at>"]
    assert card["body"]["elements"][4] == {
        "tag": "markdown",
        "content": "just now  *1 poll*",
        "text_size": "notation",
    }
    assert card["config"] == {"update_multi": True, "summary": {"content": "fallback"}}
    assert card_problems(card) == []


def test_a_message_without_blocks_is_its_text() -> None:
    card = card_of(":warning: *box* is late", ())
    assert card["body"]["elements"] == [
        {"tag": "markdown", "content": "\u26a0\ufe0f **box** is late"}
    ]
    assert card["config"]["summary"] == {"content": "\u26a0\ufe0f box is late"}


def test_a_block_the_kit_does_not_make_is_refused() -> None:
    with pytest.raises(ValueError, match="input"):
        card_of("x", ({"type": "input", "block_id": "b"},))


def test_an_oversized_message_keeps_its_start_and_says_how_much_was_left_out() -> None:
    blocks = tuple(kit.section("卡" * 2900) for _ in range(40))
    card = card_of("big", blocks)
    assert card_bytes(card) <= cards.CARD_BYTES_MAX - cards.REQUEST_FIELDS_BYTES
    elements = card["body"]["elements"]
    kept = len(elements) - 1
    assert 0 < kept < 40
    assert elements[-1]["content"] == f"{40 - kept} more not shown."
    assert card_problems(card) == []


def test_too_many_components_are_cut_to_feishus_200() -> None:
    buttons = [kit.button(f"b{i}", "a", str(i)) for i in range(25)]
    card = card_of("many", tuple(kit.actions(buttons) for _ in range(20)))
    assert count_elements(card) <= cards.CARD_ELEMENTS_MAX
    assert card["body"]["elements"][-1]["content"].endswith("more not shown.")
    with speaking("zh"):
        card_zh = card_of("many", tuple(kit.actions(buttons) for _ in range(20)))
    assert card_zh["body"]["elements"][-1]["content"].startswith("另有 ")


def _messages() -> list[Message]:
    """Messages the bot makes: prompts with buttons, notices, replies, the digest."""
    words = "".join(TRICKY) + "x" * 300
    found: list[Message] = []
    for inst in (PRICED, UNPRICED):
        found += _prompts(inst)
    found += [make() for make in renderings(words).values()]
    found += [make() for make in renderings("ok").values()]
    status = BudgetStatus(2, "project", "llm", 100 * USD, 120 * USD)
    found.append(render(BudgetAlert(status, 100, "USD")))
    job = JobSpend("j-1", "box-0", "U0000", "python `train`.py <x>", 7200, 6 * USD)
    found.append(render(Digest(DigestData("2026-03", report([spend_item(0)]), 0, (), (job,)))))
    many = [spend_item(i, name="x" * 60 + str(i)) for i in range(400)]
    found.append(money.spend_message(report(many, by="instance")))
    found.append(
        render(
            DeadlineWarning(
                PRICED,
                prompt_id=1,
                deadline_at=NOW + timedelta(minutes=30),
                release_at=NOW + timedelta(minutes=30),
                now=NOW,
                tz_name="UTC",
            )
        )
    )
    return found


@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_message_the_bot_makes_is_a_card_feishu_takes(language: str) -> None:
    with speaking(language):  # type: ignore[arg-type]
        messages = _messages()
        made = [card_of(text, blocks) for text, blocks in messages]
    assert len(made) > 15
    for (text, blocks), card in zip(messages, made, strict=True):
        assert card_problems(card) == [], text
        assert card_bytes(card) <= cards.CARD_BYTES_MAX - cards.REQUEST_FIELDS_BYTES
        assert count_elements(card) <= cards.CARD_ELEMENTS_MAX
        wanted = {
            (e["action_id"], e["value"])
            for b in blocks
            if b["type"] == "actions"
            for e in b["elements"]
        }
        got = {action_of(b["behaviors"][0]["value"]) for b in _buttons(card)}
        assert got == wanted, text
        confirms = sum(
            1 for b in blocks if b["type"] == "actions" for e in b["elements"] if "confirm" in e
        )
        assert sum(1 for b in _buttons(card) if "confirm" in b) == confirms


@pytest.mark.parametrize("name", sorted(ESCAPING_RENDERERS))
def test_every_renderer_makes_a_card_feishu_takes_that_mentions_nobody(name: str) -> None:
    """Every renderer of bot.blocks (tests.bot.blocks.test_escaping walks them all), fed words
    that try a mention and a link: a card within Feishu's limits, its buttons those of the Slack
    message, and no ``<at>`` or link but the bot's own."""
    for language in LANGUAGES:
        with speaking(language):
            text, blocks = ESCAPING_RENDERERS[name]()
            card = card_of(text, blocks)
        assert card_problems(card) == [], name
        assert card_bytes(card) <= cards.CARD_BYTES_MAX - cards.REQUEST_FIELDS_BYTES
        shown = json.dumps(card, ensure_ascii=False)
        assert "<at" not in shown
        assert "evil.example)" not in shown
        wanted = {
            (e["action_id"], e["value"])
            for b in blocks
            if b["type"] == "actions"
            for e in b["elements"]
        }
        assert {action_of(b["behaviors"][0]["value"]) for b in _buttons(card)} == wanted


def _form_fields(card: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [form] = card["body"]["elements"]
    assert form["tag"] == "form"
    return {e["name"]: e for e in form["elements"] if "name" in e and e["tag"] != "button"}


def test_the_register_form_is_a_card_form_whose_submission_reads_as_slacks() -> None:
    view = forms.register_form(GPUS, PROVIDERS, default_release_in="8h")
    card = form_of(view)
    assert card_problems(card) == []
    assert card["header"]["title"]["content"] == view["title"]["text"]
    fields = _form_fields(card)
    assert list(fields) == list(forms.REGISTER_FIELDS)
    assert fields["name"]["tag"] == "input"
    assert fields["name"]["required"] is True
    assert fields["name"]["placeholder"] == {"tag": "plain_text", "content": "box1"}
    assert fields["gpu"]["tag"] == "select_static"
    assert [o["value"] for o in fields["gpu"]["options"]] == [gpu.key for gpu in GPUS]
    assert fields["provider"]["initial_option"] == "manual"
    [submit] = _buttons(card)
    assert submit["form_action_type"] == "submit"
    value = submit["behaviors"][0]["value"]
    typed = {"name": "box1", "address": "root@203.0.113.7", "gpu": GPUS[0].key, "price": ""}
    submission = submission_of(value, typed)
    assert submission.callback_id == forms.REGISTER_FORM
    assert submission.values["name"] == {forms.VALUE: {"type": "plain_text_input", "value": "box1"}}
    assert submission.values["gpu"] == {
        forms.VALUE: {"type": "static_select", "selected_option": {"value": GPUS[0].key}}
    }
    assert submission.values["price"][forms.VALUE]["value"] is None
    assert submission.values["provider"][forms.VALUE]["selected_option"] is None
    assert set(submission.values) == set(forms.REGISTER_FIELDS)


def test_the_rent_form_flattens_its_groups_and_keeps_its_metadata() -> None:
    view = forms.rent_form(OFFERS, ["aws", "lambda", "runpod"])
    card = form_of({**view, "private_metadata": "C0OPS"})
    assert card_problems(card) == []
    offers = next(iter(_form_fields(card).values()))
    first = offers["options"][0]
    assert first["text"]["content"] == "AWS: g6.xlarge \u00b7 1x l4, $0.80/h"
    assert forms.split_offer(first["value"]) == ("aws", "g6.xlarge")
    value = _buttons(card)[0]["behaviors"][0]["value"]
    submission = submission_of(value, {})
    assert (submission.callback_id, submission.private_metadata) == (forms.RENT_FORM, "C0OPS")


def test_long_catalogues_and_chinese_forms_stay_within_feishus_limits() -> None:
    many = [Offer("aws", f"type-{i}" + "x" * 80, "l4", 1, 1, "USD") for i in range(300)]
    gpus = [GpuChoice(f"k{i}", "n" * 300) for i in range(250)]
    with speaking("zh"):
        made = [
            form_of(forms.rent_form(many, ["aws", "lambda"])),
            form_of(forms.register_form(gpus, PROVIDERS, default_release_in="8h")),
        ]
    for card in made:
        assert card_problems(card) == []
        assert card_bytes(card) <= cards.CARD_BYTES_MAX - cards.REQUEST_FIELDS_BYTES


def test_checkboxes_become_a_multi_select_and_read_back_as_options() -> None:
    boxes = kit.checkboxes(
        forms.VALUE,
        [kit.option("GPU 0", "0"), kit.option("GPU 1", "1")],
        initial=[kit.option("GPU 1", "1")],
    )
    view = kit.modal(
        "Pick",
        [kit.input_block("GPUs", boxes, block_id="gpus", hint="any")],
        callback_id="pick",
        submit="Go",
        close="Cancel",
    )
    card = form_of(view)
    assert card_problems(card) == []
    field = _form_fields(card)["gpus"]
    assert (field["tag"], field["selected_values"]) == ("multi_select_static", ["1"])
    value = _buttons(card)[0]["behaviors"][0]["value"]
    assert submission_of(value, {"gpus": ["0", "1"]}).values["gpus"][forms.VALUE] == {
        "type": "checkboxes",
        "selected_options": [{"value": "0"}, {"value": "1"}],
    }
    with pytest.raises(ValueError, match="callback_id"):
        submission_of({"action_id": "x", "value": "1"}, {})


def test_a_card_without_fallback_text_has_no_preview() -> None:
    card = card_of("", (kit.section("body"),))
    assert card["config"] == {"update_multi": True}
    assert card_problems(card) == []
