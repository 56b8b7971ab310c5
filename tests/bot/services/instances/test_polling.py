"""Polling the real agent (local transport, NVML faked) into UtilSample rows and idle_since;
idle prompts from real polls; a failed poll counts as active."""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import cast

import pytest
from sqlalchemy import update
from sqlmodel import col, select

from bot.runtime import Runtime
from bot.services.instances import polling, registration
from bot.services.tick import tick
from bot.store.models import Instance, UtilSample
from tests.bot.services.support import Clock, RecordingNotifier, get_instance
from tests.fixtures.instances import A100_80

POLL_S = 60


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    local_rt.settings = local_rt.settings.with_(poll_interval_s=POLL_S, idle_window_s=600)
    return local_rt


@pytest.fixture
def clock(rt: Runtime) -> Clock:
    return cast(Clock, rt.clock)


@pytest.fixture
def iid(rt: Runtime) -> int:
    registration.ensure_local_instance(rt, "UOWNER")
    with rt.db.session() as session:
        inst = session.exec(select(Instance).where(Instance.name == "local")).one()
        assert inst.id is not None
        return inst.id


def _samples(rt: Runtime, iid: int) -> list[UtilSample]:
    with rt.db.session() as session:
        return list(
            session.exec(
                select(UtilSample).where(UtilSample.instance_id == iid).order_by(col(UtilSample.id))
            ).all()
        )


def test_an_idle_gpu_is_sampled_and_marks_the_instance_idle(rt, clock, iid, fake_nvml):
    fake_nvml.gpus(2, A100_80, per_gpu={0: {"util_gpu": 2}, 1: {"util_gpu": 0}})
    [result] = polling.poll_instances(rt, clock.now)
    assert result.ok
    assert result.idle
    [sample] = _samples(rt, iid)
    assert sample.ok
    assert sample.util_avg_pct == 1.0
    assert sample.gpu_procs == 0
    inst = get_instance(rt.db, iid)
    assert inst.idle_since == clock.now
    assert inst.last_poll_ok
    assert '"gpus"' in (inst.last_status_json or "")

    # Not due again until a poll interval passed.
    assert polling.poll_instances(rt, clock.now + timedelta(seconds=30)) == []


def test_busy_gpu_or_a_gpu_process_is_activity(rt, clock, iid, fake_nvml):
    fake_nvml.gpus(2, A100_80)
    polling.poll_instances(rt, clock.now)
    assert get_instance(rt.db, iid).idle_since is not None

    fake_nvml.gpus(2, A100_80, per_gpu={1: {"util_gpu": 97}})
    clock.advance(seconds=POLL_S)
    polling.poll_instances(rt, clock.now)
    assert get_instance(rt.db, iid).idle_since is None

    fake_nvml.gpus(
        2, A100_80, per_gpu={0: {"processes": [{"pid": os.getpid(), "used_memory": 2**30}]}}
    )
    clock.advance(seconds=POLL_S)
    [result] = polling.poll_instances(rt, clock.now)
    assert not result.idle
    assert _samples(rt, iid)[-1].gpu_procs == 1


def test_idle_for_the_window_prompts_the_owner_with_the_cost(rt, clock, iid, fake_nvml):
    with rt.db.session() as session:
        session.exec(update(Instance).where(col(Instance.id) == iid).values(price_micros=3_500_000))
    fake_nvml.gpus(2, A100_80)
    notifier = cast(RecordingNotifier, rt.notifier)
    start = clock.now
    while clock.now < start + timedelta(seconds=600):
        tick(rt, clock.now)
        clock.advance(seconds=POLL_S)
    assert notifier.containing("has been idle") == []
    tick(rt, clock.now)
    [prompt] = notifier.containing("has been idle")
    assert "$3.50/h" in prompt.text
    assert prompt.channel == "UOWNER"


def test_a_failed_poll_counts_as_active(rt, clock, iid, fake_nvml):
    fake_nvml.gpus(2, A100_80)
    polling.poll_instances(rt, clock.now)
    assert get_instance(rt.db, iid).idle_since is not None
    # The instance moves somewhere nothing answers.
    with rt.db.session() as session:
        session.exec(
            update(Instance)
            .where(col(Instance.id) == iid)
            .values(host="127.0.0.1", port=_closed_port(), ssh_user="nobody")
        )
    rt.fleet.forget("local")
    clock.advance(seconds=POLL_S)
    [result] = polling.poll_instances(rt, clock.now)
    assert not result.ok
    assert not result.idle
    inst = get_instance(rt.db, iid)
    assert inst.idle_since is None
    assert inst.last_poll_ok is False
    assert inst.last_error
    assert _samples(rt, iid)[-1].ok is False


def test_two_pollers_at_once_poll_once(rt, clock, iid, fake_nvml):
    fake_nvml.gpus(2, A100_80)
    results: list[int] = []
    barrier = threading.Barrier(2)

    def poll() -> None:
        barrier.wait(5)
        results.append(len(polling.poll_instances(rt, clock.now)))

    workers = [threading.Thread(target=poll) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert sorted(results) == [0, 1]
    assert len(_samples(rt, iid)) == 1


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
