"""A billing rule nobody said is NULL in the store, and billing reads the platform's rule, which
its provider module declares, in its place."""

from __future__ import annotations

from datetime import timedelta

from alembic import command
from sqlmodel import select

from bot import billing
from bot.providers.registry import platform_billing
from bot.store.db import Database, alembic_config
from bot.store.models import Instance
from tests.bot.services.support import T0, add_instance, get_instance

RULES = ("billing_increment", "min_charge_s", "billing_from")


def test_rules_not_said_stay_null_and_bill_by_the_platform(db: Database) -> None:
    iid = add_instance(db, provider="lambda", provider_instance_id="l-1", price_micros=1_200_000)
    inst = get_instance(db, iid)
    assert (inst.billing_increment, inst.min_charge_s, inst.billing_from) == (None, None, None)
    rules = billing.rules_for(inst, platform_billing(inst.provider))
    assert (rules.increment, rules.min_charge_s, rules.billing_from) == (
        "minute",
        0,
        "ssh_ready",
    )
    assert billing.billing_start(inst, platform_billing(inst.provider)) is None  # not reached
    reached = inst.model_copy(update={"ssh_ready_at": T0 + timedelta(minutes=5)})
    # Ready at 10:05, 61 s later: two started minutes at 2 cents.
    at = T0 + timedelta(minutes=6, seconds=1)
    assert billing.cost_so_far(reached, platform_billing("lambda"), at) == 40_000


def test_a_zero_minimum_said_is_kept_apart_from_one_not_said(db: Database) -> None:
    said = add_instance(
        db, name="said", provider="aws", provider_instance_id="i-said", min_charge_s=0
    )
    unsaid = add_instance(db, name="unsaid", provider="aws", provider_instance_id="i-unsaid")
    said_row, unsaid_row = get_instance(db, said), get_instance(db, unsaid)
    assert (said_row.min_charge_s, unsaid_row.min_charge_s) == (0, None)
    aws = platform_billing("aws")
    assert billing.rules_for(said_row, aws).min_charge_s == 0
    assert billing.rules_for(unsaid_row, aws).min_charge_s == 60  # EC2's minimum per start


def test_rules_copied_from_the_platform_become_not_said(db: Database) -> None:
    """Rentals and registrations through a provider copied its rules into the row; the
    migration makes those NULL, and leaves alone what differs from the platform's rule and
    whatever a manual instance was typed with."""
    rented = add_instance(
        db,
        name="rented",
        provider="aws",
        provider_instance_id="i-1",
        billing_increment="second",
        min_charge_s=60,
    )
    on_lambda = add_instance(
        db,
        name="lambda",
        provider="lambda",
        provider_instance_id="l-1",
        billing_increment="minute",
        min_charge_s=0,
        billing_from="ssh_ready",
    )
    by_setting = add_instance(
        db,
        name="cs",
        provider="compshare",
        provider_instance_id="uhost-1",
        billing_increment="second",
        min_charge_s=0,
    )
    said = add_instance(
        db,
        name="said",
        provider="runpod",
        provider_instance_id="pod-1",
        billing_increment="hour",
        min_charge_s=600,
        billing_from="ssh_ready",
    )
    manual = add_instance(
        db, name="manual", billing_increment="second", min_charge_s=0, billing_from="created"
    )
    before = _costs(db)
    with db.engine.connect() as connection:
        command.downgrade(alembic_config(db, connection), "0017")
        connection.commit()
    db.migrate()
    with db.session() as session:
        rows = {
            inst.id: tuple(getattr(inst, name) for name in RULES)
            for inst in session.exec(select(Instance)).all()
        }
    assert rows == {
        rented: (None, None, None),
        on_lambda: (None, None, None),
        by_setting: ("second", None, None),  # the setting's increment, not the documented one
        said: ("hour", 600, "ssh_ready"),
        manual: ("second", 0, "created"),
    }
    assert _costs(db) == before  # each bills as it did


def _costs(db: Database) -> dict[int | None, int]:
    at = T0 + timedelta(hours=1, minutes=30)
    with db.session() as session:
        return {
            inst.id: billing.cost_so_far(
                inst.model_copy(update={"ssh_ready_at": T0}), platform_billing(inst.provider), at
            )
            for inst in session.exec(select(Instance)).all()
        }
