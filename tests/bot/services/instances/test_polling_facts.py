"""A poll stores, with the agent's status, what views read of it: the facts equal a parse of
the stored status, and they are replaced at the next poll."""

from __future__ import annotations

import json
from typing import cast

import pytest
from sqlalchemy import update
from sqlmodel import select

from agents.protocol import StatusSnapshot, from_dict
from bot.runtime import Runtime
from bot.services.instances import fleet_views, polling, registration
from bot.services.instances.lookup import compare_gpus, facts_from_json, gpu_views, status_facts
from bot.store.models import Instance
from tests.bot.services.support import Clock, get_instance
from tests.fixtures.instances import A100_80


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    local_rt.settings = local_rt.settings.with_(poll_interval_s=60)
    return local_rt


def test_a_poll_stores_the_facts_of_the_status_it_stores(rt: Runtime, fake_nvml) -> None:  # type: ignore[no-untyped-def]
    clock = cast(Clock, rt.clock)
    registration.ensure_local_instance(rt, "UOWNER")
    with rt.db.session() as session:
        iid = session.exec(select(Instance.id).where(Instance.name == "local")).one()
    assert iid is not None
    for utils in ((90, 30), (0, 5)):
        fake_nvml.gpus(2, A100_80, per_gpu={0: {"util_gpu": utils[0]}, 1: {"util_gpu": utils[1]}})
        [result] = polling.poll_instances(rt, clock.now)
        assert result.ok
        inst = get_instance(rt.db, iid)
        parsed = from_dict(StatusSnapshot, json.loads(inst.last_status_json or ""))
        facts = facts_from_json(inst.status_facts_json or "")
        assert facts == status_facts(parsed)
        assert facts is not None
        assert [g.util_pct for g in facts.gpus] == list(utils)
        assert inst.status_util_pct == round(sum(utils) / 2)
        assert inst.status_gpu_count == 2
        [row] = fleet_views.list_instances(rt).rows
        assert row.gpus == gpu_views(parsed)
        assert row.mismatch == compare_gpus(inst.gpu_model, inst.gpu_count, parsed)
        clock.advance(seconds=120)


def test_views_read_the_stored_facts_not_the_snapshot(rt: Runtime, fake_nvml) -> None:  # type: ignore[no-untyped-def]
    clock = cast(Clock, rt.clock)
    registration.ensure_local_instance(rt, "UOWNER")
    fake_nvml.gpus(2, A100_80, per_gpu={0: {"util_gpu": 70}, 1: {"util_gpu": 10}})
    polling.poll_instances(rt, clock.now)
    [polled] = fleet_views.list_instances(rt).rows
    with rt.db.session() as session:  # a snapshot no view could parse into GPUs
        session.exec(update(Instance).values(last_status_json="{}"))  # type: ignore[call-overload]
    [row] = fleet_views.list_instances(rt).rows
    assert [g.util_pct for g in row.gpus] == [70, 10]
    assert row == polled
    with rt.db.session() as session:  # without facts, the snapshot is what there is
        session.exec(update(Instance).values(status_facts_json=None))  # type: ignore[call-overload]
    [unread] = fleet_views.list_instances(rt).rows
    assert unread.gpus == ()
