"""Revision 0019: rentals recorded the old way, in the audit log, become Launch rows; those in
flight are due to orphan recovery as they were before, the settled ones stay settled."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from alembic import command
from sqlmodel import col, select

from bot.store.db import Database, alembic_config
from bot.store.models import AuditLog, Launch
from tests.bot.services.support import T0, add_instance


def _audit(
    db: Database, at: datetime, action: str, actor: str = "UOWNER", **details: object
) -> None:
    with db.session() as session:
        session.add(AuditLog(at=at, actor=actor, action=action, details_json=json.dumps(details)))


def _intent(db: Database, at: datetime, launch_id: str, *names: str) -> None:
    _audit(
        db,
        at,
        "rent_launching",
        provider="runpod",
        launch_id=launch_id,
        platform_name=f"{names[0]}-{launch_id}",
        names=list(names),
        instance_type="NVIDIA A40",
    )


def test_rentals_in_the_audit_log_become_launch_rows(db: Database) -> None:
    with db.engine.connect() as connection:  # back to before the Launch table
        command.downgrade(alembic_config(db, connection), "0018")
        connection.commit()
    add_instance(db, name="b1", provider="runpod", provider_instance_id="p1")
    old = T0 - timedelta(days=8)
    _intent(db, old, "old00000", "gone")  # before the lookback: not in flight
    _intent(db, T0, "aa000000", "a1")  # no answer yet
    _intent(db, T0, "bb000000", "b1", "b2")
    _audit(db, T0, "rent_launched", provider="runpod", launch_id="bb000000", ids=["p1", "p2"],
           names=["b1", "b2"], instance_type="NVIDIA A40")  # fmt: skip
    _intent(db, T0, "cc000000", "c1")
    _audit(db, T0, "rent_launch_refused", provider="runpod", launch_id="cc000000", error="no")
    _intent(db, T0, "dd000000", "d1")
    _audit(db, T0 + timedelta(minutes=11), "rent_launch_checked", actor="gpubot",
           provider="runpod", launch_id="dd000000", terminated=["p4"])  # fmt: skip
    _audit(db, T0, "rent_launched", provider="runpod", ids=["p5", "p6"], names=["e1", "e2"])
    _audit(db, T0 + timedelta(hours=1), "rent_recovered", actor="gpubot", provider="runpod",
           id="p5", detail="terminated")  # fmt: skip
    _audit(db, T0 + timedelta(hours=1), "rent_recover_failed", actor="gpubot",
           provider="runpod", id="p6", error="HTTP 500")  # fmt: skip
    _intent(db, T0, "gg000000", "g1")
    _audit(db, T0, "rent_launched", provider="runpod", launch_id="gg000000", ids=["p7"],
           names=["g1"])  # fmt: skip
    gave_back = T0 + timedelta(minutes=20)
    _audit(db, gave_back, "rent_given_back", provider="runpod", id="p7",
           detail="terminating failed too: HTTP 500")  # fmt: skip

    db.migrate()

    with db.session() as session:
        rows = list(session.exec(select(Launch).order_by(col(Launch.id))).all())
    got = {
        (r.launch_key, r.position): (r.provider_id, r.name, r.state, r.lease_until, r.told_at)
        for r in rows
    }
    setting_up = timedelta(minutes=25)  # the longest one instance could take to set up
    assert got == {
        ("aa000000", 1): (None, "a1", "launching", T0 + timedelta(minutes=10), None),
        ("bb000000", 1): ("p1", "b1", "adopted", T0 + 2 * setting_up, None),
        ("bb000000", 2): ("p2", "b2", "launched", T0 + 2 * setting_up, None),
        ("cc000000", 1): (None, "c1", "refused", T0, None),
        ("dd000000", 1): ("p4", None, "terminated", T0, None),
        (_key_of(rows, "p5"), 1): ("p5", "e1", "terminated", T0 + 2 * setting_up, None),
        (_key_of(rows, "p5"), 2): (
            "p6",
            "e2",
            "launched",
            T0 + 2 * setting_up,
            T0 + timedelta(hours=1),  # its renter was told once already
        ),
        ("gg000000", 1): ("p7", "g1", "orphaned", gave_back, gave_back),
    }
    by_key = {r.launch_key: r for r in rows}
    assert by_key["aa000000"].platform_name == "a1-aa000000"
    assert by_key["aa000000"].renter == "UOWNER"
    assert by_key["gg000000"].reason == "it could not be registered"
    assert all(r.holder is None for r in rows)  # no process holds them: recovery may


def _key_of(rows: list[Launch], provider_id: str) -> str:
    return next(r.launch_key for r in rows if r.provider_id == provider_id)
