"""Chinese typed wherever a person types a command: durations (``一个半小时``, ``半小时``),
amounts (``1.5万``, ``3千``, ``200元``), storage prices (``0.35元/GB/月``), fit's modes (``推理``,
``微调``, ``全量``) and instance names in CJK (``卡4090``), through the real parser, handlers and
store; bad input is refused in Chinese and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.commands.registry import Reply
from bot.errors import UsageError
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.i18n import speaking
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.store.db import Database
from bot.store.models import AuditLog, Instance
from tests.bot.services.support import Clock, RecordingNotifier, grant_key, make_runtime, rows
from tests.chinese import assert_chinese
from tests.fixtures.fake_nvml import FakeNvml
from tests.fixtures.sshd import SshServer

REGISTRY = build_registry()
OWNER = Caller("UOWNER", "COPS")
A100_80 = "NVIDIA A100-SXM4-80GB"
REGISTER = "register local local --gpu a100 --count 2 --price 1.98元/小时"


def run(rt: Runtime, text: str) -> Reply:
    spec, args = parse(text, REGISTRY)
    return spec.handler(rt, OWNER, args)


def shown(reply: Reply) -> str:
    return reply.text + "\n" + str(reply.blocks)


@pytest.fixture
def yuan_rt(
    sqlite_db: Database, fake_gpu_zipapp: Path, fake_nvml: FakeNvml, tmp_path: Path
) -> Iterator[Runtime]:
    """A runtime in yuan whose fleet reaches the instance ``local`` through the real agent."""
    fake_nvml.gpus(2, A100_80)
    runtime = make_runtime(
        sqlite_db,
        Clock(datetime(2026, 12, 2, 12, 0)),
        notifier=RecordingNotifier(),
        data_dir=tmp_path / "data",
        ssh_connect_timeout_s=3.0,
        ssh_command_timeout_s=30.0,
        currency="CNY",
    )
    home = tmp_path / "home"
    home.mkdir()
    fleet = Fleet(
        runtime.settings, zipapp_path=fake_gpu_zipapp, local_transport=LocalTransport(home=home)
    )
    runtime.fleet = fleet
    runtime.console = True
    try:
        yield runtime
    finally:
        fleet.close()


@pytest.mark.integration
def test_a_registration_typed_in_chinese(
    yuan_rt: Runtime, sqlite_db: Database, sshd: SshServer
) -> None:
    yuan_rt.settings = yuan_rt.settings.with_(ssh_key_dir=sshd.directory)
    grant_key(sqlite_db, sshd.client_key_path.name, OWNER.user_id)
    address = f"{sshd.user}@{sshd.host}:{sshd.port}"
    now = yuan_rt.now()
    with speaking("zh"):
        reply = run(
            yuan_rt,
            f"register 卡4090 {address} --key {sshd.client_key_path.name} --gpu a100 "
            "--price 1.98元/小时 --release-in 一个半小时 --disk 100 --storage 0.35元/GB/月",
        )
    [inst] = rows(sqlite_db, Instance)
    assert inst.name == "卡4090"
    assert inst.price_micros == 1_980_000
    assert inst.storage_micros_per_gb_month == 350_000
    assert inst.deadline_at == now + timedelta(hours=1, minutes=30)
    text = shown(reply)
    assert_chinese(reply.text)
    assert "¥1.98/小时" in text
    assert "剩余 1 小时 30 分" in text

    with speaking("zh"):
        extended = run(yuan_rt, "extend 卡4090 半小时")
        status = run(yuan_rt, "status 卡4090")
    [inst] = rows(sqlite_db, Instance)
    assert inst.deadline_at == now + timedelta(hours=2)
    assert_chinese(extended.text, status.text)
    assert "剩余 2 小时" in shown(status)


def test_chinese_values_for_this_machine(yuan_rt: Runtime, sqlite_db: Database) -> None:
    now = yuan_rt.now()
    with speaking("zh"):
        run(yuan_rt, f"{REGISTER} --release-in 两小时 --disk 100 --storage ¥0.35/GB/月")
    [inst] = rows(sqlite_db, Instance)
    assert (inst.price_micros, inst.storage_micros_per_gb_month) == (1_980_000, 350_000)
    assert inst.deadline_at == now + timedelta(hours=2)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("--release-in 两周", "'两周'"),
        ("--release-in 半", "'半'"),
        ("--disk 100 --storage 0.35元/TB/月", "'0.35元/TB/月'"),
        ("--disk 100 --storage 0.35美元/GB/月", "0.35美元"),
    ],
)
def test_bad_chinese_input_is_refused_in_chinese_and_changes_nothing(
    yuan_rt: Runtime, sqlite_db: Database, extra: str, said: str
) -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        run(yuan_rt, f"{REGISTER} {extra}")
    assert said in caught.value.message
    assert_chinese(caught.value.user_text())
    assert rows(sqlite_db, Instance) == []
    assert rows(sqlite_db, AuditLog) == []


@pytest.mark.parametrize(("name", "code"), [("卡\u200b4090", "U+200B"), ("卡\u202e4090", "U+202E")])
def test_a_cjk_name_with_hidden_characters_changes_nothing(
    yuan_rt: Runtime, sqlite_db: Database, name: str, code: str
) -> None:
    with speaking("zh"), pytest.raises(UsageError) as caught:
        run(yuan_rt, REGISTER.replace("register local", f"register {name}"))
    assert code in caught.value.message
    assert_chinese(caught.value.user_text())
    assert rows(sqlite_db, Instance) == []


@pytest.mark.parametrize(
    ("chinese", "english"),
    [
        ("推理", "inference"),
        ("微调", "lora"),
        ("全量", "full"),
        ("LoRA", "lora"),
        ("QLoRA", "qlora"),
    ],
)
def test_fit_modes_in_chinese_are_the_english_ones(
    sqlite_db: Database, chinese: str, english: str
) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)), currency="CNY")
    with speaking("zh"):
        asked = run(rt, f"fit 7b {chinese}")
        same = run(rt, f"fit 7b {english}")
    assert shown(asked) == shown(same)
    assert_chinese(asked.text)


def test_an_unknown_fit_mode_is_refused_in_chinese(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)), currency="CNY")
    with speaking("zh"), pytest.raises(UsageError) as caught:
        run(rt, "fit 7b 训练一下")
    assert "推理" in caught.value.user_text()
    assert_chinese(caught.value.user_text())


def test_amounts_in_wan_and_qian(sqlite_db: Database) -> None:
    rt = make_runtime(sqlite_db, Clock(datetime(2026, 12, 2, 12, 0)), currency="CNY")
    with speaking("zh"):
        chinese = shown(run(rt, "estimate --gpu 4090 --hours 100 --buy 1.5万 --monthly 3千元"))
        plain = shown(run(rt, "estimate --gpu 4090 --hours 100 --buy 15000 --monthly 3000"))
        rate = shown(run(rt, "estimate --gpu 4090 --hours 100 --price ¥2/小时 --buy 200元"))
    assert chinese == plain
    assert "¥15,000.00" in chinese
    assert "¥2.00/小时" in rate
    assert "/h " not in rate
