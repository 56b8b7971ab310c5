"""The instance commands through the real parser: usage, odd values, replies and buttons."""

from __future__ import annotations

import re
import shlex
from datetime import timedelta
from typing import Any, cast

import pytest

import bot.commands.instances as commands
import bot.commands.rent as rent_commands
from bot.commands import build_registry
from bot.commands.parser import CommandArgumentParser, parse
from bot.commands.registry import Reply
from bot.errors import NotAuthorized, NotFound, UsageError
from bot.i18n import speaking, t
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, Release
from bot.values import format_duration
from tests.bot.services.support import Clock, RecordingNotifier, add_instance, rows
from tests.chinese import assert_chinese

REGISTRY = build_registry()

OWNER = Caller(user_id="UOWNER", channel_id="CTEAM")
OTHER = Caller(user_id="UOTHER", channel_id="CTEAM")
#: Input checks need no second database: these run on SQLite only.
SQLITE_ONLY = pytest.mark.parametrize("db", ["sqlite"], indirect=True)
REGISTER_LOCAL = "register local local --gpu a100 --count 2 --price 2.10/h --release-in 3h"


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


@pytest.fixture
def clock(rt: Runtime) -> Clock:
    return cast(Clock, rt.clock)


def run(rt: Runtime, text: str, caller: Caller = OWNER) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, caller, args)


def click(rt: Runtime, action_id: str, value: str, caller: Caller = OWNER) -> Reply:
    return REGISTRY.actions[action_id].handler(rt, caller, value)


def test_the_commands_and_buttons_are_registered() -> None:
    for name in ("register", "status", "list", "health", "extend", "release"):
        assert REGISTRY.commands[name].handler is not None
    assert REGISTRY.commands["ls"] is commands.LIST
    for action in (
        "instance_release_ask",
        "instance_release_confirm",
        "instance_release_cancel",
        "instance_release_done",
    ):
        assert action in REGISTRY.actions


@pytest.mark.parametrize("spec", REGISTRY.primary_commands(), ids=lambda spec: spec.name)
def test_every_example_of_every_command_parses(spec: Any) -> None:
    assert spec.examples, f"/gpu help {spec.name} shows no example"
    for example in spec.examples:
        assert example.startswith(f"/gpu {spec.name}"), example
        parsed, _ = parse(example.removeprefix("/gpu "), REGISTRY)
        assert parsed.name == spec.name, example
    assert spec.usage.startswith(f"/gpu {spec.name}")


@pytest.mark.parametrize("spec", REGISTRY.primary_commands(), ids=lambda spec: spec.name)
def test_help_names_only_options_the_command_has_and_every_one_it_has(spec: Any) -> None:
    parser = CommandArgumentParser(spec)
    spec.configure(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    said = " ".join((spec.usage, spec.summary, *(e.split(" -- ")[0] for e in spec.examples)))
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", said))
    assert named <= known, f"{spec.name}: help names {sorted(named - known)}"
    in_usage = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", spec.usage))
    assert known <= in_usage, f"{spec.name}: usage lacks {sorted(known - in_usage)}"


def test_usage_lines_follow_the_design() -> None:
    assert commands.REGISTER.usage.startswith(
        "/gpu register NAME USER@HOST[:PORT] --gpu MODEL [--count N] --price 2.10/h "
        "[--release-in 3h | --release-at 18:00] "
        "[--provider manual|aws|lambda|runpod|vast|compshare --provider-id ID] "
        "[--billing second|minute|hour] [--min-charge 1m] [--disk 200 --storage 0.10/GB-month] "
        "[--project P] [--python PATH]"
    )
    assert commands.EXTEND.usage == "/gpu extend NAME DURATION"
    assert commands.RELEASE.usage == "/gpu release NAME [--stop]"
    assert commands.HEALTH.usage == "/gpu health NAME [--full]"
    assert commands.STATUS.usage == "/gpu status [NAME]"


@SQLITE_ONLY
@pytest.mark.parametrize(
    "extra",
    [
        "--price abc",
        "--price -1/h",
        "--price 2.10/week",
        "--count 0",
        "--count x",
        "--count 1000",
        "--release-in 0m",
        "--release-in 2y",
        "--release-in 1h --release-at 18:00",
        "--release-at 25:00",
        "--release-at 2020-01-01T00:00",
        "--release-at soon",
        "--billing week",
        "--min-charge forever",
        "--disk -5",
        "--disk lots",
        "--disk 100 --storage 0.1/TB",
        "--storage 0.10/GB-month",
        "--provider azure",
        "--provider aws",
        "--key /nonexistent/id_ed25519",
        "--unknown-flag 1",
        "surplus",
    ],
)
def test_register_with_odd_values_says_what_is_wrong_and_changes_nothing(
    rt: Runtime, db: Database, extra: str
) -> None:
    with pytest.raises(UsageError) as info:
        run(rt, f"{REGISTER_LOCAL.replace(' --release-in 3h', '')} {extra}")
    assert info.value.message
    assert rows(db, Instance) == []
    assert rows(db, AuditLog) == []


@SQLITE_ONLY
@pytest.mark.parametrize(
    "text",
    [
        "register",
        "register box",
        "register box root@h --price 1/h",
        "register box root@h --gpu a100",
        "register Box root@h --gpu a100 --price 1/h",
        "register box root@ --gpu a100 --price 1/h",
        "register box root@[::1 --gpu a100 --price 1/h",
        "status a b",
        "health",
        "extend box",
        "extend box 2x",
        "extend box -1h",
        "release",
    ],
)
def test_malformed_commands_raise_usage_errors(rt: Runtime, db: Database, text: str) -> None:
    with pytest.raises(UsageError):
        run(rt, text)
    assert rows(db, Instance) == []


def test_register_then_status_list_health_through_the_commands(rt: Runtime, db: Database) -> None:
    reply = run(rt, REGISTER_LOCAL + " --project llm --min-charge 1m --billing minute")
    assert not reply.ephemeral
    assert reply.text == "Registered local (local)."
    [inst] = rows(db, Instance)
    assert (inst.price_micros, inst.billing_increment, inst.min_charge_s) == (
        2_100_000,
        "minute",
        60,
    )

    overview = run(rt, "status", OTHER)
    assert overview.ephemeral
    assert "GPU fleet: 1 instance(s)" in overview.text
    detail = run(rt, "status local")
    assert detail.text.startswith("local: active, util 0%")
    listed = run(rt, "ls")
    assert "Instances: 1 of yours; the team has 1" in listed.text
    report = run(rt, "health local")
    assert report.text.startswith("Health check of local:")


def test_register_with_release_at_and_storage(rt: Runtime, db: Database, clock: Clock) -> None:
    run(
        rt,
        "register local local --gpu a100 --count 2 --price 0.035/min "
        "--release-at 18:00 --disk 200GB --storage 0.10/GB-month",
    )
    [inst] = rows(db, Instance)
    assert inst.deadline_at == clock.now.replace(hour=18, minute=0)
    assert inst.price_micros == 2_100_000
    assert (inst.disk_gb, inst.storage_micros_per_gb_month) == (200.0, 100_000)


def test_extend_through_the_command(rt: Runtime, db: Database, clock: Clock) -> None:
    add_instance(db, name="box1", deadline_at=clock.now + timedelta(hours=1))
    reply = run(rt, "extend box1 1h30m")
    assert not reply.ephemeral
    assert "2h 30m left" in reply.text
    with pytest.raises(NotAuthorized):
        run(rt, "extend box1 1h", OTHER)
    with pytest.raises(NotFound):
        run(rt, "extend nope 1h")


def test_release_asks_then_the_buttons_release(rt: Runtime, db: Database, clock: Clock) -> None:
    inst_id = add_instance(db, name="box1", created_at=clock.now - timedelta(hours=1))
    ask = run(rt, "release box1")
    assert ask.ephemeral
    values = [
        (e["action_id"], e["value"])
        for b in ask.blocks
        if b["type"] == "actions"
        for e in b["elements"]
    ]
    assert values == [
        ("instance_release_confirm", str(inst_id)),
        ("instance_release_cancel", str(inst_id)),
    ]
    assert rows(db, Release) == []

    cancelled = click(rt, "instance_release_cancel", str(inst_id))
    assert cancelled.replace_original
    assert rows(db, Release) == []

    with pytest.raises(NotAuthorized):
        click(rt, "instance_release_confirm", str(inst_id), OTHER)
    confirmed = click(rt, "instance_release_confirm", str(inst_id))
    assert confirmed.replace_original
    assert "Released on the platform" in confirmed.text
    notifier = cast(RecordingNotifier, rt.notifier)
    assert "instance_release_done" in notifier.to("UOWNER")[-1].action_ids()

    done = click(rt, "instance_release_done", str(inst_id))
    assert "is released" in done.text
    assert rows(db, Instance)[0].state == "released"


def test_the_release_button_in_the_detail_asks_first(rt: Runtime, db: Database) -> None:
    inst_id = add_instance(db, name="box1")
    reply = click(rt, "instance_release_ask", str(inst_id))
    assert "Release *box1*" in reply.text
    assert rows(db, Release) == []


@SQLITE_ONLY
@pytest.mark.parametrize("value", ["", "abc", "1.5", "-1", "\uff11"])
def test_broken_button_values_are_usage_errors(rt: Runtime, value: str) -> None:
    for action in ("instance_release_confirm", "instance_release_cancel", "instance_release_done"):
        with pytest.raises(UsageError, match="broken"):
            click(rt, action, value)


@pytest.mark.parametrize(
    ("text", "micros"),
    [("0.10/GB-month", 100_000), ("0.1", 100_000), ("$0.08/gb/month", 80_000)],
)
def test_parse_storage_price(text: str, micros: int) -> None:
    assert commands.parse_storage_price(text, "USD") == micros


def test_quoted_names_reach_the_service_unchanged(rt: Runtime) -> None:
    with pytest.raises(UsageError, match="not a valid instance name"):
        run(rt, f"register {shlex.quote('my box')} root@h --gpu a100 --price 1/h")


LONG_NAME = "n" * 10_000


@SQLITE_ONLY
@pytest.mark.parametrize(
    "text",
    [
        f"register {LONG_NAME} local --gpu a100 --price 2.10/h",
        f"register {LONG_NAME.upper()} root@10.0.0.1 --gpu a100 --price 2.10/h",
        f"status {LONG_NAME}",
        f"health {LONG_NAME}",
        f"health {LONG_NAME} --full",
        f"extend {LONG_NAME} 1h",
        f"release {LONG_NAME}",
        f"policy {LONG_NAME}",
        f"policy {LONG_NAME} --idle-release 1h",
        f"cap {LONG_NAME} 3d",
        f"register local local --gpu a100 --price 2.10/h --provider-id {LONG_NAME} "
        "--provider runpod",
        f"register box root@{LONG_NAME} --gpu a100 --price 2.10/h",
        f"register box {LONG_NAME}@host --gpu a100 --price 2.10/h",
    ],
)
def test_a_10000_character_name_is_echoed_cut(rt: Runtime, db: Database, text: str) -> None:
    from bot.errors import GpubotError
    from bot.listeners import error_reply

    with pytest.raises(GpubotError) as info:
        run(rt, text, caller=Caller(user_id="UADMIN", channel_id="CTEAM"))
    shown = error_reply(info.value).text
    assert "n" * 41 not in shown, shown[:300]
    assert "N" * 41 not in shown, shown[:300]
    assert len(info.value.message) <= 200, info.value.message[:300]
    assert rows(db, Instance) == []


@SQLITE_ONLY
@pytest.mark.parametrize(
    "text",
    [
        f"fit {LONG_NAME} lora",
        f"estimate --gpu {LONG_NAME} --hours 5",
        f"budget set project {LONG_NAME} 5",
        f"logs {LONG_NAME}",
        f"cancel {LONG_NAME}",
        f"run box --gpus {LONG_NAME} -- true",
        f"register box root@10.0.0.1 --gpu a100 --price {LONG_NAME}",
        f"register box root@10.0.0.1 --gpu {LONG_NAME} --price 2.10/h",
        f"spend {LONG_NAME}",
        f"lang {LONG_NAME}",
    ],
)
def test_no_command_sends_a_10000_character_word_back_whole(rt: Runtime, text: str) -> None:
    from bot.listeners import execute_command

    add_instance(rt.db, name="box", owner_id=OWNER.user_id)
    shown = execute_command(rt, REGISTRY, Caller(user_id="UADMIN", channel_id="CTEAM"), text)
    assert shown.text.startswith(":warning:"), shown.text[:300]
    assert "n" * 41 not in shown.text, shown.text[:300]


def test_the_register_summary_names_the_default_deadline() -> None:
    default = format_duration(timedelta(seconds=Settings.default_release_in_s))
    assert f"({default} from now unless" in commands.REGISTER.summary


def test_the_summaries_in_chinese() -> None:
    specs = [s for s in REGISTRY.primary_commands() if s.handler.__module__ == commands.__name__]
    specs.append(rent_commands.RENT)
    with speaking("zh"):
        summaries = [t(spec.summary) for spec in specs]
    assert len(summaries) == 8
    assert_chinese(*summaries)
    assert all(re.search("[\u4e00-\u9fff]", text) for text in summaries), summaries


@SQLITE_ONLY
def test_register_errors_in_chinese(rt: Runtime, db: Database) -> None:
    with speaking("zh"), pytest.raises(UsageError) as needs_disk:
        run(rt, f"{REGISTER_LOCAL} --storage 0.10/GB-month")
    with speaking("zh"), pytest.raises(UsageError) as not_a_price:
        commands.parse_storage_price("3/TB", "USD")
    texts = [needs_disk.value.user_text(), not_a_price.value.user_text()]
    assert_chinese(*texts)
    assert all(re.search("[\u4e00-\u9fff]", text) for text in texts), texts
    assert "3/TB" in texts[1]
    assert rows(db, Instance) == []
