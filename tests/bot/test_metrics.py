"""bot.metrics and bot.store.stats: the store's gauges add up the rows on SQLite and PostgreSQL in
a fixed number of queries; SSH, Slack and command figures are counted where they happen (real
sshd, the Slack stand-in, the real app); the text parses as Prometheus' format."""

from __future__ import annotations

import socket
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from prometheus_client.parser import text_string_to_metric_families
from slack_sdk import WebClient
from sqlalchemy import event
from sqlmodel import col, select

from bot import billing
from bot.errors import AuthenticationFailed, CommandTimeout, SlackError, StoreError, Unreachable
from bot.fleet.ssh import SshTransport
from bot.local_slack import LocalSlack
from bot.metrics import Metrics, StoreStats, error_kind
from bot.notify import MessageRef
from bot.providers.registry import platform_billing
from bot.settings import Settings
from bot.slack_notifier import SlackNotifier
from bot.store.db import Database
from bot.store.models import Charge, Instance, OutboxMessage, Prompt, Release
from bot.store.stats import month_bounds, ping, read_stats
from tests.bot.services.support import add_instance
from tests.bot.test_slack_notifier import BOUNDED_LABELS, html_slack
from tests.fixtures.slack import BOT_TOKEN, SlackBot
from tests.fixtures.sshd import SshServer, make_client_key

NOW = datetime(2025, 6, 15, 12, 0)
BERLIN = ZoneInfo("Europe/Berlin")
POLL_S = 60.0


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition by (name, sorted labels)."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _fleet(db: Database) -> dict[str, int]:
    """Instances in every state the gauges tell apart, polled recently except ``late``."""
    recent = {"created_at": NOW - timedelta(days=2), "last_polled_at": NOW - timedelta(seconds=30)}
    return {
        "idle8": add_instance(
            db,
            name="idle8",
            provider="aws",
            provider_instance_id="i-1",
            gpu_count=8,
            delivered_gpu_count=8,
            price_micros=2_100_000,
            price_per="gpu_hour",
            idle_since=NOW - timedelta(minutes=40),
            **recent,
        ),
        "busy": add_instance(db, name="busy", price_micros=1_000_000, **recent),
        "late": add_instance(
            db,
            name="late",
            price_micros=5_000_000,
            billing_from="ssh_ready",
            created_at=NOW - timedelta(days=2),
            last_polled_at=NOW - timedelta(seconds=200),
        ),
        "stopped": add_instance(
            db,
            name="stopped",
            price_micros=9_000_000,
            stopped_at=NOW - timedelta(hours=1),
            **recent,
        ),
        "releasing": add_instance(
            db,
            name="releasing",
            state="releasing",
            provider="vast",
            provider_instance_id="v-1",
            currency="EUR",
            price_micros=3_000_000,
            gpu_count=2,
            **recent,
        ),
        "gone": add_instance(
            db,
            name="gone",
            state="released",
            provider="aws",
            provider_instance_id="i-2",
            price_micros=7_000_000,
            released_at=NOW - timedelta(days=1),
            **recent,
        ),
    }


def _ledger_and_queues(db: Database, ids: dict[str, int]) -> None:
    busy, releasing = ids["busy"], ids["releasing"]
    with db.session() as session:
        for start, micros, currency, instance_id in (
            # 23:30 UTC on 31 May is already June in Berlin: it counts.
            (datetime(2025, 5, 31, 23, 30), 1_500_000, "USD", busy),
            (NOW - timedelta(hours=3), 2_500_000, "USD", busy),
            (NOW - timedelta(hours=2), 700_000, "EUR", releasing),
            (datetime(2025, 5, 31, 21, 0), 100_000_000, "USD", busy),  # May in Berlin too
        ):
            session.add(
                Charge(
                    instance_id=instance_id,
                    kind="compute",
                    start_at=start,
                    end_at=start + timedelta(hours=1),
                    billed_s=3600,
                    amount_micros=micros,
                    currency=currency,
                )
            )
        for state, due in (
            ("pending", NOW - timedelta(seconds=90)),  # the longest due: 90 s late
            ("pending", NOW + timedelta(minutes=5)),
            ("escalated", NOW - timedelta(seconds=10)),
            ("failed", None),
            ("awaiting_owner", NOW + timedelta(hours=1)),
            ("confirmed", None),
            ("confirmed", None),
        ):
            session.add(
                Release(
                    instance_id=releasing,
                    reason="user",
                    requested_by="UOWNER",
                    requested_at=NOW - timedelta(minutes=30),
                    state=state,
                    next_attempt_at=due,
                )
            )
        for key, created, due, delivery in (
            ("a", NOW - timedelta(seconds=300), NOW - timedelta(seconds=120), None),
            ("b", NOW - timedelta(seconds=60), NOW + timedelta(seconds=30), None),
            ("c", NOW - timedelta(days=3), NOW - timedelta(days=3), "posted"),
        ):
            session.add(
                OutboxMessage(
                    key=key,
                    kind="notice",
                    recipient="COPS",
                    text=key,
                    created_at=created,
                    due_at=due,
                    delivery=delivery,
                )
            )
        session.add(
            Prompt(
                instance_id=busy,
                kind="deadline_warning",
                key="w1",
                recipient="UOWNER",
                due_at=NOW - timedelta(seconds=30),
            )
        )


def test_store_gauges_add_up_the_rows(db: Database) -> None:
    ids = _fleet(db)
    _ledger_and_queues(db, ids)

    stats = read_stats(db, NOW, tz=BERLIN, poll_interval_s=POLL_S)

    assert stats.instances == {
        ("active", "aws"): 1,
        ("active", "manual"): 3,
        ("releasing", "vast"): 1,
    }
    assert stats.gpus == {"aws": 8, "manual": 3}
    assert stats.gpus_idle == {"aws": 8, "manual": 0}
    # What bot.billing says an hour of each instance that bills now costs.
    with db.session() as session:
        names = ["idle8", "busy", "releasing"]
        billing_now = session.exec(select(Instance).where(col(Instance.name).in_(names))).all()
        expected: dict[str, int] = {}
        for inst in billing_now:
            rate = billing.rules_for(inst, platform_billing(inst.provider)).hourly_micros
            expected[inst.currency] = expected.get(inst.currency, 0) + rate
    assert stats.spend_micros_per_hour == expected == {"USD": 17_800_000, "EUR": 3_000_000}
    assert stats.charges_this_month_micros == {"USD": 4_000_000, "EUR": 700_000}
    assert stats.releases == {"pending": 2, "escalated": 1, "failed": 1, "awaiting_owner": 1}
    assert stats.outbox_pending == 2
    assert stats.outbox_oldest_age_s == 300
    assert stats.due_lag_s == {"poll": 140, "release": 90, "prompt": 30, "outbox": 120}


def test_an_empty_store_reads_as_zeros(db: Database) -> None:
    stats = read_stats(db, NOW, tz=BERLIN, poll_interval_s=POLL_S)
    assert stats == StoreStats(due_lag_s={"poll": 0, "release": 0, "prompt": 0, "outbox": 0})
    text, _ = Metrics().exposition(lambda: stats)
    found = samples(text)
    assert found[("gpubot_outbox_pending", ())] == 0
    # The states a dashboard watches are there at 0 rather than missing.
    for state in ("pending", "failed", "escalated"):
        assert found[("gpubot_releases", (("state", state),))] == 0


def test_the_spend_rate_sums_billings_hourly_cost_of_each_instance(db: Database) -> None:
    """The gauge adds the hour up in SQL; it reads the GPU count and the price as
    bot.billing.hourly_cost_micros does (registered count, else the agent's, at least one)."""
    counts = [(None, 4), (0, None), (None, None), (3, 8), (2, 2)]
    for n, (registered, delivered) in enumerate(counts):
        for price_per in ("gpu_hour", "instance_hour"):
            add_instance(
                db,
                name=f"{price_per}{n}",
                gpu_count=registered,
                delivered_gpu_count=delivered,
                price_micros=1_000_000 + n,
                price_per=price_per,
                ssh_ready_at=NOW - timedelta(hours=1),
            )
    with db.session() as session:
        rows = session.exec(select(Instance)).all()
        wanted = sum(billing.hourly_cost_micros(inst) for inst in rows)
    assert read_stats(db, NOW, tz=BERLIN, poll_interval_s=POLL_S).spend_micros_per_hour == {
        "USD": wanted
    }


def test_reading_the_gauges_takes_the_same_queries_for_5_or_150_instances(
    db: Database,
) -> None:
    def statements() -> int:
        seen: list[str] = []

        def note(*args: object) -> None:
            seen.append(str(args[2]))

        event.listen(db.engine, "before_cursor_execute", note)
        try:
            read_stats(db, NOW, tz=BERLIN, poll_interval_s=POLL_S)
        finally:
            event.remove(db.engine, "before_cursor_execute", note)
        return len(seen)

    for n in range(5):
        add_instance(db, name=f"small{n}", last_polled_at=NOW, idle_since=NOW)
    few = statements()
    for n in range(145):
        add_instance(db, name=f"big{n}", last_polled_at=NOW, provider="aws")
    many = statements()
    assert few == many
    assert many <= 7  # the six aggregates (and SQLite's BEGIN)


def test_the_month_of_the_charges_follows_the_time_zone() -> None:
    assert month_bounds(NOW, BERLIN) == (datetime(2025, 5, 31, 22, 0), datetime(2025, 6, 30, 22, 0))
    assert month_bounds(datetime(2025, 12, 31, 23, 30), BERLIN)[0] == datetime(2025, 12, 31, 23)
    assert month_bounds(NOW, ZoneInfo("UTC")) == (datetime(2025, 6, 1), datetime(2025, 7, 1))


def test_exposition_parses_and_names_every_gauge(sqlite_db: Database) -> None:
    _fleet(sqlite_db)
    metrics = Metrics()
    metrics.ssh_error("unreachable")
    metrics.command_took("status", 0.2)
    text, content_type = metrics.exposition(
        lambda: read_stats(sqlite_db, NOW, tz=BERLIN, poll_interval_s=POLL_S)
    )
    assert content_type.startswith("text/plain; version=0.0.4")
    found = samples(text)
    assert found[("gpubot_store_up", ())] == 1
    assert found[("gpubot_instances", (("provider", "aws"), ("state", "active")))] == 1
    assert found[("gpubot_gpus_idle", (("provider", "aws"),))] == 8
    assert found[("gpubot_spend_rate_per_hour", (("currency", "USD"),))] == pytest.approx(17.8)
    assert found[("gpubot_spend_rate_per_hour", (("currency", "EUR"),))] == pytest.approx(3.0)
    assert found[("gpubot_due_lag_seconds", (("work", "poll"),))] == 140
    assert found[("gpubot_ssh_errors_total", (("kind", "unreachable"),))] == 1
    assert found[("gpubot_command_duration_seconds_count", (("command", "status"),))] == 1
    assert any(name == "process_resident_memory_bytes" for name, _ in found)


def test_a_store_that_cannot_be_read_leaves_the_process_figures() -> None:
    port = _closed_port()
    gone = Database(f"postgresql+psycopg://postgres@127.0.0.1:{port}/gpubot?connect_timeout=2")
    try:
        with pytest.raises(StoreError):
            ping(gone)
        metrics = Metrics()
        metrics.tick_skipped()
        text, _ = metrics.exposition(
            lambda: read_stats(gone, NOW, tz=BERLIN, poll_interval_s=POLL_S)
        )
    finally:
        gone.dispose()
    found = samples(text)
    assert found[("gpubot_store_up", ())] == 0
    assert found[("gpubot_ticks_skipped_total", ())] == 1
    assert not any(name == "gpubot_instances" for name, _ in found)


def test_tick_figures_keep_duration_overrun_and_failures() -> None:
    metrics = Metrics()
    metrics.tick_done(
        took_s=7.5,
        lag_s=12.0,
        steps_s={"poll": 7.0, "outbox": 0.5},
        budgets_s={"poll": 6.0, "outbox": 1.5},
        failed=["outbox"],
        over_budget=["poll"],
        ended_at_unix_s=1_750_000_000,
    )
    metrics.tick_failed()
    assert metrics.value("gpubot_tick_step_overrun_seconds", step="poll") == 1.0
    assert metrics.value("gpubot_tick_step_overrun_seconds", step="outbox") == 0.0
    assert metrics.value("gpubot_tick_step_over_budget_total", step="poll") == 1
    assert metrics.value("gpubot_tick_step_failures_total", step="outbox") == 1
    assert metrics.value("gpubot_tick_step_duration_seconds_sum", step="poll") == 7.0
    assert metrics.value("gpubot_tick_lag_seconds") == 12.0
    assert metrics.value("gpubot_tick_last_completed_timestamp_seconds") == 1_750_000_000
    assert metrics.value("gpubot_ticks_total", outcome="ok") == 1
    assert metrics.value("gpubot_ticks_total", outcome="failed") == 1


def test_error_kinds_are_snake_case() -> None:
    assert error_kind(CommandTimeout("x")) == "command_timeout"
    assert error_kind(AuthenticationFailed("x")) == "authentication_failed"
    assert error_kind(Unreachable("x")) == "unreachable"


# --- counted where they happen ---------------------------------------------------------------


def _ssh_errors(metrics: Metrics, kind: str) -> float:
    return metrics.value("gpubot_ssh_errors_total", kind=kind) or 0.0


@pytest.mark.integration
def test_ssh_failures_are_counted_by_kind(sshd: SshServer, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, ssh_connect_timeout_s=3.0, ssh_command_timeout_s=30.0)
    metrics = Metrics()
    before = {
        k: _ssh_errors(metrics, k)
        for k in ("authentication_failed", "command_timeout", "unreachable")
    }

    stranger = make_client_key(tmp_path)
    refused = SshTransport(
        sshd.target("stranger", key_path=stranger), settings=settings, metrics=metrics
    )
    with pytest.raises(AuthenticationFailed):
        refused.connect()
    refused.close()

    slow = SshTransport(sshd.target("slow"), settings=settings, metrics=metrics)
    try:
        with pytest.raises(CommandTimeout):
            slow.exec(["sleep", "5"], timeout_s=0.5)
    finally:
        slow.close()

    nowhere = SshTransport(
        replace(sshd.target("closed"), port=_closed_port()), settings=settings, metrics=metrics
    )
    with pytest.raises(Unreachable):
        nowhere.connect()
    nowhere.close()

    assert _ssh_errors(metrics, "authentication_failed") == before["authentication_failed"] + 1
    assert _ssh_errors(metrics, "command_timeout") == before["command_timeout"] + 1
    assert _ssh_errors(metrics, "unreachable") == before["unreachable"] + 1
    assert _ssh_errors(Metrics(), "unreachable") == 0  # each runtime counts into its own


@pytest.mark.integration
def test_slack_errors_and_rate_limits_are_counted(local_slack: LocalSlack) -> None:
    metrics = Metrics()
    notifier = SlackNotifier(
        WebClient(token=BOT_TOKEN, base_url=local_slack.api_url, timeout=5), metrics=metrics
    )
    post = "chat.postMessage"

    def limited() -> float:
        return metrics.value("gpubot_slack_rate_limited_total", method=post) or 0.0

    def errors(code: str) -> float:
        return metrics.value("gpubot_slack_api_errors_total", method=post, error=code) or 0.0

    limited_before, missing_before = limited(), errors("channel_not_found")
    unreachable_before = errors("unreachable")

    local_slack.rate_limit(post, times=1)
    notifier.post("C0GENERAL", "after one 429")  # waited out and tried again
    assert limited() == limited_before + 1

    local_slack.rate_limit(post, times=3)  # past the two retries: refused
    with pytest.raises(SlackError):
        notifier.post("C0GENERAL", "given up")
    assert limited() == limited_before + 4
    assert errors("ratelimited") >= 1

    with pytest.raises(SlackError):
        notifier.post("C0NOWHERE", "to nowhere")
    assert errors("channel_not_found") == missing_before + 1

    dead = SlackNotifier(
        WebClient(token=BOT_TOKEN, base_url=f"http://127.0.0.1:{_closed_port()}/api/", timeout=2),
        metrics=metrics,
    )
    with pytest.raises(SlackError):
        dead.post("C0GENERAL", "nobody there")
    assert errors("unreachable") == unreachable_before + 1


def test_the_slack_error_label_stays_bounded_whatever_slack_answers() -> None:
    """A proxy's HTML pages (each unlike the last) add no label values: the exposition's
    Slack error labels stay within the known set, HTML-free."""
    metrics = Metrics()
    with html_slack((502, 200, 504)) as url:
        notifier = SlackNotifier(
            WebClient(token=BOT_TOKEN, base_url=url, timeout=5), metrics=metrics
        )
        for _ in range(30):
            with pytest.raises(SlackError):
                notifier.update(MessageRef("C0GENERAL", "1.000001"), "x")
    text, _ = metrics.exposition()
    labels = {
        dict(labels)["error"]
        for (name, labels) in samples(text)
        if name == "gpubot_slack_api_errors_total" and dict(labels)["method"] == "chat.update"
    }
    assert labels <= BOUNDED_LABELS
    assert {"http_5xx", "other"} <= labels
    assert b"<html" not in text


@pytest.mark.integration
def test_command_latency_is_recorded_by_command(slack_bot: SlackBot) -> None:
    metrics = slack_bot.rt.metrics
    before = metrics.value("gpubot_command_duration_seconds_count", command="help") or 0.0
    assert slack_bot.command("help") == 200
    slack_bot.replies(1)  # the handler has ended before its reply goes out
    assert metrics.value("gpubot_command_duration_seconds_count", command="help") == before + 1


def _closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
