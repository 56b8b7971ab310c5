"""Platforms by the reader's name for them (优云智算 for Compshare in Chinese), spend groups and
the spend CSV's header in the reader's language, with the CSV's cells the same in both."""

from __future__ import annotations

import csv
import io
from datetime import datetime

import pytest

from bot.blocks import bills as bill_blocks
from bot.blocks import money
from bot.i18n import speaking
from bot.providers.names import PLATFORM_NAMES, platform_list, platform_name
from bot.services.money import spend
from bot.services.money.digest import BillsDigest
from tests.bot.blocks.test_money import report, spend_item
from tests.chinese import assert_said_in_chinese


@pytest.mark.parametrize(
    ("provider", "english", "chinese"),
    [
        ("compshare", "Compshare", "优云智算"),
        ("runpod", "RunPod", "RunPod"),
        ("vast", "Vast", "Vast"),
        ("aws", "AWS", "AWS"),
        ("lambda", "Lambda", "Lambda"),
        ("manual", "manual", "手动登记"),
        ("acme", "acme", "acme"),
    ],
)
def test_a_platform_is_named_in_the_reader_s_language(
    provider: str, english: str, chinese: str
) -> None:
    assert platform_name(provider) == english
    with speaking("zh"):
        assert platform_name(provider) == chinese


def test_every_provider_the_bot_has_is_named() -> None:
    from bot.providers import aws, compshare, lambda_cloud, manual, runpod, vast

    keys = {
        module.name
        for module in (
            aws.AwsProvider,
            compshare.CompshareProvider,
            lambda_cloud.LambdaProvider,
            manual.ManualProvider,
            runpod.RunpodProvider,
            vast.VastProvider,
        )
    }
    assert keys <= set(PLATFORM_NAMES)


def test_a_list_of_platforms_reads_as_the_language_lists() -> None:
    assert platform_list(["compshare", "aws"]) == "Compshare, AWS"
    with speaking("zh"):
        assert platform_list(["compshare", "aws"]) == "优云智算、AWS"


def _rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))


def test_the_csv_header_is_in_the_reader_s_language_and_the_cells_are_the_same() -> None:
    items = [
        spend_item(0, provider="compshare", project="llm", idle_micros=123_457),
        spend_item(1, gpu_model=None),
    ]
    shown = report(items)
    english = _rows(spend.spend_csv(shown))
    with speaking("zh"):
        chinese = _rows(spend.spend_csv(shown))
    assert english[0][:3] == ["month", "instance", "owner"]
    assert english[0][-1] == "total_USD"
    assert chinese[0][:3] == ["月份", "实例", "所有者"]
    assert chinese[0][-1] == "合计（USD）"
    assert "计算时长（小时）" in chinese[0]
    assert len(set(chinese[0])) == len(chinese[0]) == len(english[0])
    assert_said_in_chinese(*chinese[0])
    assert chinese[1:] == english[1:]
    by_name = {row[1]: row for row in english[1:]}
    assert by_name["box-0"][english[0].index("idle_USD")] == "0.123457"


def test_spend_by_provider_names_the_platform_and_no_project_in_chinese() -> None:
    items = [spend_item(0, provider="compshare"), spend_item(1, provider="runpod")]
    with speaking("zh"):
        _, blocks = money.spend_message(report(items, by="provider"))
    shown = str(blocks)
    assert "优云智算" in shown
    assert "RunPod" in shown
    assert "compshare" not in shown
    items = [spend_item(0, project=None), spend_item(1, project="llm")]
    with speaking("zh"):
        _, blocks = money.spend_message(report(items, by="project"))
        assert money.group_name(spend.NO_PROJECT, "project") == "（无项目）"
        assert spend_item(2, gpu_model=None).gpu_label == "（未知 GPU）"
    assert "（无项目）" in str(blocks)
    assert money.group_name(spend.NO_PROJECT, "project") == "(no project)"
    assert money.group_name("compshare", "provider") == "Compshare"
    assert money.group_name("compshare", "instance") == "compshare"


def test_the_digest_names_the_platforms_without_a_bill_in_chinese() -> None:
    section_data = BillsDigest(
        month="2026-11", now=datetime(2026, 12, 1), platforms=(), unreadable=("compshare", "lambda")
    )
    assert "Compshare, Lambda publish no per-instance bill" in bill_blocks.digest_section(
        section_data
    )
    with speaking("zh"):
        said = bill_blocks.digest_section(section_data)
    assert "优云智算、Lambda 不提供" in said
    assert_said_in_chinese(said)


def test_a_rented_instance_is_told_on_its_platform_s_name() -> None:
    from bot.blocks import rent

    with speaking("zh"):
        said = rent._rented("compshare", "uhost-1", "cs1")
    assert said.startswith("优云智算")
    assert "compshare" not in said
