"""Idle as measured, per GPU and per poll: real polls of the real agent (NVML faked) judge each
GPU idle, in use or not measured; a failed poll and an hour without a poll are not measured;
`/gpu spend`, the CSV, the digest's text and its chart's series give the same three figures
to the micro-unit, on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import os
import socket
from datetime import datetime, timedelta
from decimal import Decimal
from typing import cast
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from bot import charts
from bot.blocks import money
from bot.runtime import Runtime
from bot.services.instances import polling, registration
from bot.services.money import budgets, digest, ledger, samples, spend
from bot.store.db import Database
from bot.store.models import Instance, UtilHour, UtilSample
from bot.values import MICROS, format_money
from tests.bot.services.money.test_ledger import add_instance
from tests.bot.services.support import Clock
from tests.fixtures.fake_nvml import FakeNvml
from tests.fixtures.instances import A100_80

#: Per instance hour: not a multiple of the GPU-samples, so the shares need rounding.
PRICE = 8_000_001
GPUS = 4
UTC_TZ = ZoneInfo("UTC")


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    local_rt.settings = local_rt.settings.with_(poll_interval_s=900, idle_threshold_pct=5.0)
    return local_rt


@pytest.fixture
def box(rt: Runtime) -> int:
    """The local instance, 4 GPUs billed by the second from its creation at the top of an hour."""
    registration.ensure_local_instance(rt, "UOWNER")
    with rt.db.session() as session:
        inst = session.exec(select(Instance).where(Instance.name == "local")).one()
        assert inst.id is not None
        assert inst.created_at.minute == inst.created_at.second == 0
        inst.price_micros = PRICE
        inst.price_per = "instance_hour"
        inst.billing_increment = "second"
        inst.min_charge_s = 0
        inst.billing_from = "created"
        session.add(inst)
        return inst.id


def poll(rt: Runtime, iid: int, at: datetime) -> polling.PollResult:
    """One poll of the box at ``at`` (made due then)."""
    cast(Clock, rt.clock).set(at)
    with rt.db.session() as session:
        session.exec(
            update(Instance)
            .where(col(Instance.id) == iid)
            .values(last_polled_at=None, poll_due_at=None)
        )
    [result] = polling.poll_instances(rt, at)
    return result


def go_dark(rt: Runtime, iid: int) -> None:
    """The box moves where nothing answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with rt.db.session() as session:
        session.exec(
            update(Instance)
            .where(col(Instance.id) == iid)
            .values(host="127.0.0.1", port=port, ssh_user="nobody")
        )
    rt.fleet.forget("local")


def test_failed_polls_mixed_gpus_and_a_dark_host_split_to_the_micro_unit(
    rt: Runtime, box: int, fake_nvml: FakeNvml
) -> None:
    start = rt.now()
    # Hour 1: GPU 0 busy, the other three idle, at each of four polls.
    fake_nvml.gpus(GPUS, A100_80, per_gpu={0: {"util_gpu": 90}})
    for minute in (5, 20, 35, 50):
        assert poll(rt, box, start + timedelta(minutes=minute)).ok
    # Hour 2: a process holds GPU 0 (at 0%), the rest idle; then two polls nobody answers.
    held = {0: {"processes": [{"pid": os.getpid(), "used_memory": 2**30}]}}
    fake_nvml.gpus(GPUS, A100_80, per_gpu=held)
    for minute in (65, 80):
        result = poll(rt, box, start + timedelta(minutes=minute))
        assert result.ok
        assert not result.idle
    go_dark(rt, box)
    for minute in (95, 110):
        assert not poll(rt, box, start + timedelta(minutes=minute)).ok
    # Hour 3: no poll at all. Released at its end.
    with rt.db.session() as session:
        session.exec(
            update(Instance)
            .where(col(Instance.id) == box)
            .values(released_at=start + timedelta(hours=3), state="released")
        )
    with rt.db.read_session() as session:
        hours = session.exec(
            select(UtilHour).where(UtilHour.instance_id == box).order_by(col(UtilHour.bucket_start))
        ).all()
    counts = [(h.idle_gpu_samples, h.busy_gpu_samples, h.unmeasured_gpu_samples) for h in hours]
    assert counts == [(12, 4, 0), (6, 2, 8)]

    tz = rt.settings.tz()
    month = ledger.month_of(start, tz)
    now = ledger.month_bounds(month, tz)[1] + timedelta(days=1, hours=10)
    report = spend.spend_report(
        rt.db, month, tz=tz, now=now, idle_threshold_pct=5.0, currency="USD"
    )
    [item] = report.instances
    # Hour 1: 12/16 idle, rounded down; in use the rest. Hour 2: 6/16 idle, 8/16 not
    # measured. Hour 3: wholly not measured.
    idle = PRICE * 12 // 16 + PRICE * 6 // 16
    unmeasured = PRICE * 8 // 16 + PRICE
    assert (item.compute_micros, item.idle_micros, item.unmeasured_micros) == (
        3 * PRICE,
        idle,
        unmeasured,
    )
    assert (idle, unmeasured) == (9_000_000, 12_000_001)
    assert item.in_use_micros == 3 * PRICE - idle - unmeasured == 3_000_002
    [day] = [day for day in report.days if day.total_micros]
    assert (day.in_use_micros, day.idle_micros, day.unmeasured_micros) == (
        3_000_002,
        9_000_000,
        12_000_001,
    )

    [row] = csv.DictReader(io.StringIO(spend.spend_csv(report).decode("utf-8-sig")))
    assert (row["in_use_USD"], row["idle_USD"], row["unmeasured_USD"]) == (
        "3.000002",
        "9.000000",
        "12.000001",
    )

    # The digest: nothing the month before, said once; its chart's series are its figures.
    data = digest.build_digest(rt.db, month, tz=tz, now=now, idle_threshold_pct=5.0, currency="USD")
    assert data.previous_total_micros == 0
    text, blocks = money.digest_message(data)
    shown = text + "\n".join(str(block) for block in blocks)
    assert "nothing was charged the month before" in shown
    assert "$0.00 in the month before" not in shown
    series = {one.label: sum(one.micros) for one in charts.daily_series(money.day_columns(report))}
    assert series == {"in use": 3_000_002, "idle": 9_000_000, "not measured": 12_000_001}
    for figure in series.values():
        assert format_money(figure, "USD") in shown
    assert sum(series.values()) == data.report.total_micros


def test_every_owner_s_three_figures_agree_in_spend_the_csv_the_digest_and_budgets(
    db: Database,
) -> None:
    """Three owners, GPU-samples recorded as polls judge them: per owner, the report's group,
    its instances, the CSV rows and the digest's lines give the same idle and not measured
    figures, and budgets the same total, to the micro-unit; in use is the rest of compute."""
    hour = datetime(2026, 3, 3, 10)
    fleet = {
        "UALICE": [(4, [(3, 1, 0), None, (0, 0, 4)]), (1, [(1, 0, 0)])],
        "UBOB": [(2, [(1, 1, 0), (2, 0, 0), None])],
        "UCAROL": [(8, [])],  # went dark: never a poll
    }
    for owner, boxes in fleet.items():
        for number, (gpus, polls) in enumerate(boxes):
            iid = add_instance(
                db,
                name=f"{owner.lower()}-{number}",
                owner_id=owner,
                gpu_count=gpus,
                price_micros=1_000_003 * gpus,
                created_at=hour,
                released_at=hour + timedelta(hours=2),
                state="released",
            )
            with db.session() as session:
                for index, judged in enumerate(polls):
                    idle, busy, unmeasured = judged or (0, 0, 0)
                    samples.record(
                        session,
                        UtilSample(
                            instance_id=iid,
                            at=hour + timedelta(minutes=10 + 20 * index),
                            ok=judged is not None,
                            util_avg_pct=None if judged is None else 1.0,
                            gpus_idle=idle,
                            gpus_busy=busy,
                            gpus_unmeasured=unmeasured,
                        ),
                        UTC_TZ,
                    )
    now = datetime(2026, 4, 2, 12)
    report = spend.spend_report(
        db, "2026-03", tz=UTC_TZ, now=now, idle_threshold_pct=5.0, currency="USD"
    )
    rows = list(csv.DictReader(io.StringIO(spend.spend_csv(report).decode("utf-8-sig"))))
    data = digest.build_digest(
        db, "2026-03", tz=UTC_TZ, now=now, idle_threshold_pct=5.0, currency="USD"
    )
    digest_text = "\n".join(str(block) for block in money.digest_message(data)[1])
    spent = budgets.month_to_date(db, datetime(2026, 3, 31, 23), UTC_TZ)
    lines = {line.key: line for line in report.groups}
    assert set(lines) == set(fleet)
    for owner in fleet:
        mine = [item for item in report.instances if item.owner_id == owner]
        line = lines[owner]
        idle = sum(item.idle_micros for item in mine)
        unmeasured = sum(item.unmeasured_micros for item in mine)
        assert (line.idle_micros, line.unmeasured_micros) == (idle, unmeasured)
        assert (
            line.total_micros == sum(item.total_micros for item in mine) == spent.of("user", owner)
        )
        for item in mine:
            assert item.in_use_micros >= 0
            assert item.in_use_micros + item.idle_micros + item.unmeasured_micros == (
                item.compute_micros
            )
        owned = [row for row in rows if row["owner"] == owner]
        for name, wanted in (("idle", idle), ("unmeasured", unmeasured)):
            assert sum(Decimal(row[f"{name}_USD"]) for row in owned) * MICROS == wanted
        assert money._group_line(line, "user", "USD") in digest_text
    # Alice's 4-GPU box: hour 1 judged 3 idle, 1 in use, 4 not measured (the failed poll),
    # 4 not measured; hour 2 had no poll.
    alice = next(item for item in report.instances if item.name == "ualice-0")
    hourly = 4 * 1_000_003
    assert alice.idle_micros == hourly * 3 // 12
    assert alice.unmeasured_micros == hourly * 8 // 12 + hourly
    carol = next(item for item in report.instances if item.owner_id == "UCAROL")
    assert (carol.idle_micros, carol.unmeasured_micros) == (0, carol.compute_micros)
