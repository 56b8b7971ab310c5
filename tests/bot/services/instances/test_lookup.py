"""Shared instance lookups: the host key alert a failed fleet call raises, on SQLite and
PostgreSQL."""

from __future__ import annotations

from typing import cast

import pytest
from sqlmodel import select

from bot.errors import HostKeyChanged
from bot.runtime import Runtime
from bot.services.instances import lookup
from bot.store.db import Database
from bot.store.models import Instance, Prompt
from tests.bot.services.support import RecordingNotifier, add_instance, rows


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


@pytest.fixture
def notifier(rt: Runtime) -> RecordingNotifier:
    return cast(RecordingNotifier, rt.notifier)


# --- host key alerts --------------------------------------------------------------------------


def test_a_changed_host_key_alerts_the_owner_once_per_presented_key(
    rt: Runtime, db: Database, notifier: RecordingNotifier
) -> None:
    add_instance(db, name="box1", host_key_fingerprint="SHA256:old")
    with db.session() as session:
        inst = session.exec(select(Instance)).one()

    def changed(presented: str) -> HostKeyChanged:
        return HostKeyChanged(
            "box1: host key changed",
            instance="box1",
            expected_fingerprint="SHA256:old",
            presented_fingerprint=presented,
        )

    lookup.handle_fleet_error(rt, inst, changed("SHA256:new"))
    lookup.handle_fleet_error(rt, inst, changed("SHA256:new"))
    lookup.handle_fleet_error(rt, inst, changed("SHA256:other"))
    alerts = notifier.to("UOWNER")
    assert len(alerts) == 2
    assert "SHA256:old" in alerts[0].text
    assert "SHA256:new" in alerts[0].text
    assert "SHA256:other" in alerts[1].text
    assert len(rows(db, Prompt)) == 2


def test_a_failed_alert_is_retried_later(
    rt: Runtime, db: Database, notifier: RecordingNotifier
) -> None:
    add_instance(db, name="box1", host_key_fingerprint="SHA256:old")
    with db.session() as session:
        inst = session.exec(select(Instance)).one()
    error = HostKeyChanged("changed", instance="box1", presented_fingerprint="SHA256:new")
    notifier.fail_posts = True
    lookup.handle_fleet_error(rt, inst, error)  # never raises
    notifier.fail_posts = False
    lookup.handle_fleet_error(rt, inst, error)
    assert len(notifier.to("UOWNER")) == 1
