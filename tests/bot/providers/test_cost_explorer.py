"""AWS bills through Cost Explorer's GetCostAndUsageWithResources: the real boto3 client against
a stand-in that checks each request against botocore's own service model."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from bot.errors import ProviderError, ProviderRateLimited
from bot.providers.aws import AwsProvider
from bot.providers.base import PlatformCharge
from tests.fixtures.platforms.cost_explorer import CostExplorerStandIn, cost_explorer_standin


@pytest.fixture
def ce(monkeypatch: pytest.MonkeyPatch) -> Iterator[CostExplorerStandIn]:
    with cost_explorer_standin(monkeypatch, page_days=2) as standin:
        yield standin


def _aws(ce: CostExplorerStandIn) -> AwsProvider:
    return AwsProvider(region="eu-west-1", cost_explorer_url=ce.url)


def test_charges_per_instance_and_day_across_pages(ce: CostExplorerStandIn) -> None:
    ce.bill("i-0aaa", date(2026, 12, 1), "12.3456785")
    ce.bill("i-0aaa", date(2026, 12, 3), "1.50")
    ce.bill("i-0bbb", date(2026, 12, 3), "0.20")
    ce.bill("NoResourceId", date(2026, 12, 3), "9.99")

    found = _aws(ce).charges(datetime(2026, 12, 1), datetime(2026, 12, 4, 10, 0))

    assert sorted(found, key=lambda c: (c.provider_id, c.start)) == [
        PlatformCharge(
            "i-0aaa", datetime(2026, 12, 1), datetime(2026, 12, 2), 12_345_679, None, 12_345_679
        ),
        PlatformCharge(
            "i-0aaa", datetime(2026, 12, 3), datetime(2026, 12, 4), 1_500_000, None, 1_500_000
        ),
        PlatformCharge(
            "i-0bbb", datetime(2026, 12, 3), datetime(2026, 12, 4), 200_000, None, 200_000
        ),
    ]
    # Four days, two a page: two calls, the second with the first's token.
    assert ce.targets == ["AWSInsightsIndexService.GetCostAndUsageWithResources"] * 2
    bodies = [body for _, _, body in ce.calls]
    assert bodies[0]["TimePeriod"] == {"Start": "2026-12-01", "End": "2026-12-05"}
    assert bodies[0]["Granularity"] == "DAILY"
    assert bodies[0]["Filter"] == {
        "Dimensions": {"Key": "SERVICE", "Values": ["Amazon Elastic Compute Cloud - Compute"]}
    }
    assert bodies[0]["GroupBy"] == [{"Type": "DIMENSION", "Key": "RESOURCE_ID"}]
    assert "NextPageToken" not in bodies[0]
    assert bodies[1]["NextPageToken"] == "2"


def test_only_the_last_14_days_are_asked_for(ce: CostExplorerStandIn) -> None:
    _aws(ce).charges(datetime(2026, 11, 1), datetime(2026, 12, 4, 10, 0))
    assert ce.calls[0][2]["TimePeriod"]["Start"] == "2026-11-20"


def test_the_stand_in_refuses_what_the_service_model_refuses(ce: CostExplorerStandIn) -> None:
    # botocore's own validation would refuse first: turn it off to send the request as it is.
    client = boto3.client(
        "ce",
        region_name="us-east-1",
        endpoint_url=ce.url,
        config=Config(parameter_validation=False),
    )
    with pytest.raises(ClientError) as caught:
        client.get_cost_and_usage_with_resources(
            TimePeriod={"Start": "2026-12-01", "End": "2026-12-02"}, Granularity="DAILY"
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "'Filter'" in caught.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as caught:
        client.get_cost_and_usage_with_resources(
            TimePeriod={"Start": "2026-12-01", "End": "2026-12-02"},
            Granularity="WEEKLY",
            Filter={"Dimensions": {"Key": "SERVICE", "Values": ["x"]}},
        )
    assert "Granularity must be one of DAILY" in caught.value.response["Error"]["Message"]


def test_data_unavailable_is_worth_retrying(ce: CostExplorerStandIn) -> None:
    ce.refuse_next("DataUnavailableException", "Data is not available yet.")
    with pytest.raises(ProviderError) as caught:
        _aws(ce).charges(datetime(2026, 12, 1), datetime(2026, 12, 2))
    assert caught.value.retryable
    assert "DataUnavailableException" in caught.value.message


def test_throttling_is_rate_limited(ce: CostExplorerStandIn) -> None:
    ce.refuse_next("LimitExceededException", "Rate exceeded", times=3)
    with pytest.raises(ProviderRateLimited):
        _aws(ce).charges(datetime(2026, 12, 1), datetime(2026, 12, 2))


def test_an_account_without_resource_level_data_is_told_how_to_opt_in(
    ce: CostExplorerStandIn,
) -> None:
    ce.not_opted_in()
    with pytest.raises(ProviderError) as caught:
        _aws(ce).charges(datetime(2026, 12, 1), datetime(2026, 12, 2))
    assert not caught.value.retryable
    assert "not opted in to resource-level cost data" in caught.value.message
    assert "Cost Explorer preferences" in (caught.value.hint or "")


def test_unsigned_requests_are_refused(ce: CostExplorerStandIn) -> None:
    client = boto3.client(
        "ce",
        region_name="us-east-1",
        endpoint_url=ce.url,
        config=Config(signature_version=UNSIGNED),
    )
    with pytest.raises(ClientError):
        client.get_cost_and_usage_with_resources(
            TimePeriod={"Start": "2026-12-01", "End": "2026-12-02"},
            Granularity="DAILY",
            Filter={"Dimensions": {"Key": "SERVICE", "Values": ["x"]}},
        )
    assert ce.answered_to("POST") == [401]


def test_a_window_ending_at_midnight_leaves_that_day_out(ce: CostExplorerStandIn) -> None:
    _aws(ce).charges(datetime(2026, 11, 25), datetime(2026, 12, 1))
    assert ce.calls[0][2]["TimePeriod"] == {"Start": "2026-11-25", "End": "2026-12-01"}
