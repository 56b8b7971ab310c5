"""Findings made of several parts, and parts whose values are sentences too (what an Xid means
and what to do about it), in the reader's language: the bot translates each part and joins
them as the language does; in English they read as the agent wrote them."""

from __future__ import annotations

import pytest

from agents.checks import fabric, resources, stress
from agents.checks import xid as xid_check
from agents.checks.gpu import check_identity, check_leftover_memory, check_pcie
from agents.protocol import HealthCheck, HealthReport, ProcessSnapshot, from_dict, to_dict
from bot.blocks import instances as render
from bot.i18n import speaking
from bot.services.instances.fleet_views import health_view
from tests.agents.factories import GIB, make_gpu, make_nvswitch_topology, make_status
from tests.agents.test_health_resources import fs
from tests.agents.test_health_stress import run
from tests.agents.test_health_xid import kernel
from tests.bot.blocks.slack_limits import all_text, check_message
from tests.bot.blocks.test_instances import inst
from tests.chinese import HAN, assert_chinese


def findings() -> dict[str, HealthCheck]:
    """A failing or warning finding of each check that joins several parts."""
    narrow = [make_gpu(i, pcie_width_current=8, pcie_width_max=16) for i in range(2)]
    busy = make_status(
        n=2,
        processes=[
            ProcessSnapshot(0, 4242, "bob", "python train.py", 20 * GIB),
            ProcessSnapshot(1, 4343, "eve", "python eval.py", 10 * GIB),
        ],
    )
    return {
        "identity": check_identity(make_status(n=2), "a100", 8),
        "leftover_memory": check_leftover_memory(busy),
        "pcie": check_pcie(make_status(narrow)),
        "topology": fabric.check_topology(make_nvswitch_topology(4, g2=18, g3=5), make_status(n=4)),
        "disk": resources.check_disk(
            [
                fs(2 * GIB, roles=("home",), path="/home/me"),
                fs(GIB // 2, roles=("temp",), path="/tmp", read_only=True),
            ]
        ),
        "stress": stress.check_stress(
            run(gpus=2, temp=99, errors={"1": "cudaErrorIllegalAddress"})
        ),
        "xid": xid_check.check_xid(
            kernel((79, 600.0), (48, 7200.0), (13, 30.0)), [], False, [make_gpu(0)]
        ),
    }


def shown(check: HealthCheck) -> str:
    """The health report of one check, as wire JSON read by the bot, all its text."""
    wired = from_dict(HealthCheck, to_dict(check))
    report = HealthReport(status=check.status, checks=(wired,))
    message = render.health_report(health_view(inst(), report, full=False))
    check_message(message)
    return all_text(list(message[1]))


@pytest.mark.parametrize("check_id", sorted(findings()))
def test_each_finding_of_several_parts_is_chinese(check_id: str) -> None:
    check = findings()[check_id]
    assert check.status in ("warn", "fail"), check
    with speaking("zh"):
        text = shown(check)
    assert_chinese(text)
    assert HAN.search(text)


@pytest.mark.parametrize("check_id", sorted(findings()))
def test_in_english_each_reads_as_the_agent_wrote_it(check_id: str) -> None:
    check = findings()[check_id]
    text = shown(check)
    assert check.summary[:40].replace("`", "")[:20] in text.replace("`", "")


def test_the_xid_parts_are_joined_the_chinese_way() -> None:
    with speaking("zh"):
        text = shown(findings()["xid"])
    assert "Xid 79" in text
    assert "；" in text


def test_an_old_agents_joined_finding_shows_its_english() -> None:
    old = HealthCheck("disk", "warn", "/a is read-only; /b has 1.0 GiB free", "Free some space.")
    with speaking("zh"):
        text = shown(old)
    assert "/a is read-only; /b has 1.0 GiB free" in text
    assert "Free some space." in text


def test_a_part_the_catalogue_does_not_know_shows_the_english() -> None:
    newer = HealthCheck(
        "disk",
        "warn",
        "something new; /b is read-only",
        summary_parts=(
            {"template": "something {what}", "params": {"what": "new"}},
            {"template": "{where} is read-only", "params": {"where": "/b"}},
        ),
    )
    with speaking("zh"):
        assert "something new; /b is read-only" in shown(newer)
