"""The register and rent forms: opened without the network, submitted through the command itself
(the same parser and services as the slash command), errors on the field they belong to."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.models.views import View

from bot.blocks.forms import REGISTER_FIELDS, REGISTER_FORM, RENT_FORM, VALUE
from bot.commands import build_registry, forms
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import ProviderError
from bot.fleet.fleet import Fleet
from bot.i18n import speaking
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    ProviderInstance,
    ReleaseOutcome,
)
from bot.providers.runpod import RunpodProvider
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.store.db import Database
from bot.store.models import AuditLog, Instance
from tests.bot.services.support import Clock, add_instance, make_runtime, rows
from tests.chinese import assert_chinese
from tests.fixtures.store import fresh_database

REGISTRY = build_registry()
OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
SELECTS = frozenset({"gpu", "provider", "billing", "type"})
#: Input checks need no second database: these run on SQLite only.
SQLITE_ONLY = pytest.mark.parametrize("db", ["sqlite"], indirect=True)
REGISTER = {
    "name": "local",
    "address": "local",
    "gpu": "a100-sxm4-80gb",
    "count": "2",
    "price": "2.10/h",
    "deadline": "3h",
    "billing": "minute",
    "min_charge": "1m",
    "project": "llm",
}
REGISTER_TEXT = (
    "register local local --gpu a100-sxm4-80gb --count 2 --price 2.10/h --release-in 3h "
    "--billing minute --min-charge 1m --project llm"
)
#: What differs between two registrations of one machine by the same values.
_PER_ROW = {"id", "last_status_json"}


def submitted(**fields: str | None) -> dict[str, dict[str, Any]]:
    """``view.state.values`` as Slack sends it for these fields (None: left empty)."""
    values: dict[str, dict[str, Any]] = {}
    for block_id, text in fields.items():
        if block_id in SELECTS:
            chosen = None if text is None else {"text": {"type": "plain_text", "text": text}}
            values[block_id] = {
                VALUE: {
                    "type": "static_select",
                    "selected_option": chosen and {**chosen, "value": text},
                }
            }
        else:
            values[block_id] = {VALUE: {"type": "plain_text_input", "value": text}}
    return values


def run(rt: Runtime, text: str) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, OWNER, args)


class NoNetwork:
    """A launching platform that fails the test if the form calls it."""

    name = "runpod"
    capabilities = RunpodProvider.capabilities

    def __getattr__(self, name: str) -> Callable[..., Any]:
        raise AssertionError(f"the form called the platform ({name})")


class LaunchingPlatform(NoNetwork):
    """RunPod as the rent command checks it: prices reported per pod, launches recorded."""

    def __init__(self) -> None:
        self.launched: list[LaunchRequest] = []

    def __getattr__(self, name: str) -> Callable[..., Any]:
        raise AttributeError(name)

    def price(self, instance_type: str) -> int | None:
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        return []

    def list_instances(self) -> list[ProviderInstance]:
        return []

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        raise ProviderError("not here")

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        self.launched.append(request)
        return []


class RecordingExecutor:
    """Holds the background work a command hands over instead of running it."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        self.jobs.append((fn, args))
        future: Future[Any] = Future()
        future.set_result(None)
        return future


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


@pytest.fixture
def rent_rt(sqlite_db: Database) -> Runtime:
    runtime = make_runtime(sqlite_db, Clock(), providers=[LaunchingPlatform()])
    runtime.executor = RecordingExecutor()  # type: ignore[assignment]
    return runtime


@pytest.mark.parametrize(
    ("text", "form"),
    [
        ("register", REGISTER_FORM),
        (" /gpu register ", REGISTER_FORM),
        ("REGISTER", REGISTER_FORM),
        ("rent", RENT_FORM),
        ("/gpu rent", RENT_FORM),
        ("register box1", None),
        ("rent aws g5.xlarge", None),
        ("status", None),
        ("", None),
        ("/gpu", None),
    ],
)
def test_a_command_typed_alone_opens_its_form(text: str, form: str | None) -> None:
    assert forms.form_for_command(text) == form
    assert {REGISTER_FORM, RENT_FORM} == forms.FORM_CALLBACK_IDS


@SQLITE_ONLY
def test_the_forms_open_fast_from_what_is_known_locally(rt: Runtime) -> None:
    rt.providers.add(NoNetwork())
    started = time.monotonic()
    register = forms.form_view(rt, OWNER, REGISTER_FORM)
    rent = forms.form_view(rt, OWNER, RENT_FORM)
    assert time.monotonic() - started < 1.0
    for view in (register, rent):
        View(**view).validate_json()
        assert len(view["blocks"]) <= 100
    gpus = [
        o["value"] for o in register["blocks"][REGISTER_FIELDS.index("gpu")]["element"]["options"]
    ]
    assert "a100-sxm4-80gb" in gpus
    groups = rent["blocks"][0]["element"]["option_groups"]
    assert [group["label"]["text"] for group in groups] == ["RunPod"]
    assert {o["value"] for o in groups[0]["options"]} >= {"runpod:RTX 4090"}
    with pytest.raises(ValueError, match="no form"):
        forms.form_view(rt, OWNER, "other_form")


def test_the_register_form_registers_exactly_like_the_command(
    rt: Runtime, db: Database, tmp_path: Path
) -> None:
    outcome = forms.submit_form(rt, OWNER, REGISTER_FORM, submitted(**REGISTER))
    assert outcome.errors == {}
    assert outcome.reply is not None
    assert outcome.reply.text == "Registered local (local)."
    [by_form] = rows(db, Instance)

    with fresh_database("sqlite", tmp_path / "other") as other_db:
        other = make_runtime(other_db, Clock(), console=True, data_dir=rt.settings.data_dir)
        assert isinstance(rt.fleet, Fleet)
        other.fleet = rt.fleet
        reply = run(other, REGISTER_TEXT)
        [by_command] = rows(other_db, Instance)
    assert reply.text == outcome.reply.text
    assert by_form.model_dump(exclude=_PER_ROW) == by_command.model_dump(exclude=_PER_ROW)
    assert (by_form.price_micros, by_form.billing_increment, by_form.min_charge_s) == (
        2_100_000,
        "minute",
        60,
    )


@SQLITE_ONLY
@pytest.mark.parametrize(
    ("changes", "block_id", "said"),
    [
        ({"price": "abc"}, "price", "abc"),
        ({"price": "-1/h"}, "price", "negative"),
        ({"deadline": "2y"}, "deadline", "2y"),
        ({"deadline": "-1h"}, "deadline", "negative"),
        ({"deadline": "25:00"}, "deadline", "25:00"),
        ({"address": "root@"}, "address", ""),
        ({"address": "nobody"}, "address", "nobody"),
        ({"name": "Box 1"}, "name", "Box 1"),
        ({"count": "0"}, "count", ""),
        ({"count": "x"}, "count", ""),
        ({"billing": "week"}, "billing", "week"),
        ({"provider": "azure"}, "provider", "azure"),
        ({"disk": "lots"}, "disk", "lots"),
        ({"disk": "100", "storage": "0.1/TB"}, "storage", "0.1/TB"),
        ({"storage": "0.10/GB-month"}, "disk", "--disk"),
        ({"provider": "runpod"}, "provider_id", "--provider-id"),
        ({"min_charge": "forever"}, "min_charge", "forever"),
        ({"key": "../x"}, "key", ""),
        ({"price": None}, "price", ""),
        ({"gpu": None}, "gpu", ""),
    ],
)
def test_a_bad_field_says_so_on_that_field_and_changes_nothing(
    rt: Runtime, db: Database, changes: dict[str, str | None], block_id: str, said: str
) -> None:
    outcome = forms.submit_form(rt, OWNER, REGISTER_FORM, submitted(**{**REGISTER, **changes}))
    assert outcome.reply is None
    assert list(outcome.errors) == [block_id], outcome.errors
    assert said in outcome.errors[block_id]
    assert rows(db, Instance) == []
    assert rows(db, AuditLog) == []


@SQLITE_ONLY
def test_several_bad_fields_are_each_shown_and_the_fast_check_needs_no_network(
    rt: Runtime,
) -> None:
    values = submitted(**{**REGISTER, "price": "x", "deadline": "soon", "count": "-2"})
    errors = forms.check_form(rt, OWNER, REGISTER_FORM, values)
    assert set(errors) == {"price", "deadline", "count"}
    assert forms.submit_form(rt, OWNER, REGISTER_FORM, values).errors == errors
    assert forms.check_form(rt, OWNER, REGISTER_FORM, submitted(**REGISTER)) == {}


@SQLITE_ONLY
def test_a_refusal_that_names_no_option_lands_on_the_first_field(rt: Runtime, db: Database) -> None:
    outcome = forms.submit_form(rt, OWNER, REGISTER_FORM, submitted(**{**REGISTER, "name": "box"}))
    assert list(outcome.errors) == ["name"]
    assert "local" in outcome.errors["name"]
    assert rows(db, Instance) == []


@SQLITE_ONLY
def test_a_release_time_becomes_release_at(rt: Runtime, db: Database) -> None:
    clock = rt.clock
    assert isinstance(clock, Clock)
    outcome = forms.submit_form(
        rt, OWNER, REGISTER_FORM, submitted(**{**REGISTER, "deadline": "18:00"})
    )
    assert outcome.errors == {}
    [inst] = rows(db, Instance)
    assert inst.deadline_at == clock.now.replace(hour=18, minute=0)


@pytest.mark.parametrize(
    "typed",
    ["a b", "&lt;x&gt; &amp; &", "it's", '"q"', "-x", "--y", "\\", "$HOME; rm", "x=y", "中文"],
)
def test_values_reach_the_command_unchanged(typed: str) -> None:
    fields = [
        forms._Value("x", dest, typed) for dest in ("name", "address", "gpu", "price", "project")
    ]
    spec, args = parse(forms._command_text(REGISTRY.commands["register"], fields), REGISTRY)
    assert spec.name == "register"
    assert (args.name, args.address, args.project) == (typed, typed, typed)


@SQLITE_ONLY
def test_the_register_form_in_chinese(rt: Runtime, db: Database) -> None:
    with speaking("zh"):
        view = forms.form_view(rt, OWNER, REGISTER_FORM)
        missing = forms.submit_form(
            rt, OWNER, REGISTER_FORM, submitted(**{**REGISTER, "price": None})
        )
        storage = forms.submit_form(
            rt, OWNER, REGISTER_FORM, submitted(**{**REGISTER, "storage": "0.10/GB-month"})
        )
        bad_storage = forms.submit_form(
            rt, OWNER, REGISTER_FORM, submitted(**{**REGISTER, "disk": "9", "storage": "1/TB"})
        )
    assert_chinese(view)
    assert view["title"]["text"] == "注册实例"
    texts = [missing.errors["price"], storage.errors["disk"], bad_storage.errors["storage"]]
    assert_chinese(*texts)
    assert all(re.search("[\u4e00-\u9fff]", text) for text in texts), texts
    assert "1/TB" in texts[2]
    assert rows(db, Instance) == []


def test_the_rent_form_rents_like_the_command(rent_rt: Runtime) -> None:
    values = submitted(type="runpod:RTX 4090", count="2", name="pod", deadline="8h")
    outcome = forms.submit_form(rent_rt, OWNER, RENT_FORM, values)
    assert outcome.errors == {}
    assert outcome.reply is not None
    by_command = run(rent_rt, "rent runpod 'RTX 4090' --count 2 --name pod --release-in 8h")
    assert outcome.reply == by_command
    executor = rent_rt.executor
    assert isinstance(executor, RecordingExecutor)
    [(_, (_, _, form_plan)), (_, (_, _, command_plan))] = executor.jobs
    assert form_plan.request == command_plan.request
    assert form_plan.names == ("pod-1", "pod-2")

    typed = submitted(other_type="NVIDIA GeForce RTX 4090", provider="runpod", name="big")
    assert forms.submit_form(rent_rt, OWNER, RENT_FORM, typed).errors == {}
    assert executor.jobs[-1][1][2].request.instance_type == "NVIDIA GeForce RTX 4090"
    unnamed = submitted(other_type="NVIDIA GeForce RTX 4090", provider="runpod")
    assert list(forms.submit_form(rent_rt, OWNER, RENT_FORM, unnamed).errors) == ["other_type"]


def test_a_name_in_use_lands_on_the_name(rent_rt: Runtime) -> None:
    add_instance(rent_rt.db, name="taken")
    values = submitted(type="runpod:RTX 4090", name="taken")
    outcome = forms.submit_form(rent_rt, OWNER, RENT_FORM, values)
    assert list(outcome.errors) == ["name"]
    assert "taken" in outcome.errors["name"]


@pytest.mark.parametrize(
    ("fields", "block_id"),
    [
        ({}, "type"),
        ({"type": "runpod:RTX 4090", "other_type": "x"}, "other_type"),
        ({"type": "runpod:RTX 4090", "provider": "aws"}, "provider"),
        ({"other_type": "x"}, "provider"),
        ({"other_type": "x", "provider": "manual"}, "provider"),
        ({"type": "runpod:RTX 4090", "count": "9"}, "count"),
        ({"type": "runpod:RTX 4090", "disk": "-1"}, "disk"),
        ({"type": "runpod:RTX 4090", "price": "free"}, "price"),
        ({"type": "runpod:RTX 4090", "deadline": "1h", "name": "Pod"}, "name"),
    ],
)
def test_a_bad_rent_field_says_so_on_that_field(
    rent_rt: Runtime, fields: dict[str, str], block_id: str
) -> None:
    values = submitted(type=None, **fields) if "type" not in fields else submitted(**fields)
    outcome = forms.submit_form(rent_rt, OWNER, RENT_FORM, values)
    assert outcome.reply is None
    assert list(outcome.errors) == [block_id], outcome.errors
    executor = rent_rt.executor
    assert isinstance(executor, RecordingExecutor)
    assert executor.jobs == []


def test_the_rent_form_in_chinese(rent_rt: Runtime) -> None:
    with speaking("zh"):
        view = forms.form_view(rent_rt, OWNER, RENT_FORM)
        nothing = forms.submit_form(rent_rt, OWNER, RENT_FORM, submitted(type=None))
        both = forms.submit_form(
            rent_rt, OWNER, RENT_FORM, submitted(type="runpod:RTX 4090", provider="aws")
        )
    assert_chinese(view)
    texts = [nothing.errors["type"], both.errors["provider"]]
    assert_chinese(*texts)
    assert all(re.search("[\u4e00-\u9fff]", text) for text in texts), texts
    assert "RTX 4090" in texts[1]


class ChinesePlatform(NoNetwork):
    """A launching platform priced in yuan, which the form must not call either."""

    name = "compshare"


@pytest.mark.parametrize(("currency", "listed"), [("CNY", True), ("EUR", False)])
def test_the_rent_form_lists_the_types_of_the_configured_currencys_table(
    sqlite_db: Database, currency: str, listed: bool
) -> None:
    """Prices are quoted from the table of the bot's currency (as `/gpu fit` quotes them):
    yuan for a yuan-priced platform; no list, only the typed type, where there is no table."""
    runtime = make_runtime(
        sqlite_db, Clock(), providers=[ChinesePlatform(), NoNetwork()], currency=currency
    )
    view = forms.form_view(runtime, OWNER, RENT_FORM)
    View(**view).validate_json()
    text = json.dumps(view, ensure_ascii=False)
    assert ("compshare:" in text) is listed
    assert "runpod:" not in text  # its prices are in dollars
    if listed:
        assert "¥" in text or "CNY" in text
