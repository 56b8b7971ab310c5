"""Lambda's stand-in bills as Lambda does: each started minute of an instance's run, from when
it passed its health checks (status active) until it is terminated, on the stand-in's clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from bot.providers.http import JsonApi
from bot.providers.lambda_cloud import LambdaProvider, is_not_found_document
from tests.fixtures.platforms.lambda_cloud import LambdaStandIn

START = datetime(2027, 3, 1, 12, 0)


@pytest.fixture
def standin() -> Iterator[LambdaStandIn]:
    standin = LambdaStandIn()
    standin.now = START
    standin.start()
    yield standin
    standin.close()


def _provider(standin: LambdaStandIn) -> LambdaProvider:
    api = JsonApi.bearer(
        "lambda", standin.url + "/api/v1", standin.api_key, not_found=is_not_found_document
    )
    return LambdaProvider(api)


def test_a_run_of_90_seconds_bills_two_minutes(standin: LambdaStandIn) -> None:
    iid = standin.add(price_cents_per_hour=360)  # 6 cents a minute
    standin.now = START + timedelta(seconds=90)
    standin.terminate_outside(iid)
    standin.now = START + timedelta(hours=1)
    assert round(standin.bill(iid, START, standin.now) * 100, 9) == 12


def test_the_minutes_of_adjoining_stretches_add_up_to_the_run(standin: LambdaStandIn) -> None:
    iid = standin.add(price_cents_per_hour=198)
    standin.now = START + timedelta(minutes=10, seconds=1)
    cut = START + timedelta(minutes=5, seconds=30)
    first, second = standin.bill(iid, START, cut), standin.bill(iid, cut, standin.now)
    assert round(first * 1_000_000) == 6 * 33_000
    assert round((first + second) * 1_000_000) == 11 * 33_000
    # A running instance bills its started minute up to the clock, and nothing after it.
    assert standin.bill(iid, START, START + timedelta(days=1)) == standin.bill(
        iid, START, standin.now
    )


def test_billing_starts_at_the_health_checks_and_ends_at_the_terminate(
    standin: LambdaStandIn,
) -> None:
    provider = _provider(standin)
    launched = standin.add(type_name="gpu_1x_a10", status="booting")  # not yet healthy
    standin.now = START + timedelta(minutes=3)
    assert provider.get(launched).state == "running"  # it passes its checks at this look
    standin.now = START + timedelta(minutes=63)
    outcome = provider.release(launched, "terminate")
    assert (outcome.confirmed, outcome.state) == (True, "terminated")
    standin.now = START + timedelta(hours=5)
    # 60 minutes at 75 cents an hour; and a terminated instance still answers a look.
    assert round(standin.bill(launched, START, standin.now) * 100, 9) == 75
    assert standin.runs[launched] == (START + timedelta(minutes=3), START + timedelta(minutes=63))
    assert provider.get(launched).is_gone
    assert launched not in {i.provider_id for i in provider.list_instances()}


def test_the_clock_is_the_wall_clock_unless_set(lambda_cloud: LambdaStandIn) -> None:
    before = datetime.now(UTC).replace(tzinfo=None)
    assert before <= lambda_cloud.now <= datetime.now(UTC).replace(tzinfo=None)
    lambda_cloud.now = START
    assert lambda_cloud.now == START
