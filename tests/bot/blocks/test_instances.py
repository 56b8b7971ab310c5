"""Instance renderers: what they say, and that Slack accepts every message they make."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from bot.blocks import instances as render
from bot.blocks import render as render_notice
from bot.services.instances.lookup import HostKeyAlert
from bot.services.instances.registration import GpuMismatch
from bot.services.instances.views import (
    CheckView,
    FleetOverview,
    GpuView,
    HealthView,
    InstanceDetail,
    InstanceRow,
    InstanceSettings,
    InstanceView,
    JobBrief,
    Mismatch,
    ProblemView,
    ProcessView,
    RegisterResult,
    ReleaseAsk,
    ReleaseView,
    SettingsView,
)
from tests.bot.blocks.slack_limits import all_text, buttons, check_message

NOW = datetime(2026, 12, 2, 12, 0, 0)
GIB = 1024**3
LONG = "x" * 5000


def inst(name: str = "box1", **changes: object) -> InstanceView:
    view = InstanceView(
        id=7,
        name=name,
        owner_id="UOWNER",
        state="active",
        provider="manual",
        provider_instance_id=None,
        host="203.0.113.7",
        port=2222,
        ssh_user="root",
        project=None,
        gpu_model="h100",
        gpu_count=8,
        delivered_gpu_name="NVIDIA H100 80GB HBM3",
        delivered_gpu_count=8,
        price_micros_per_hour=24_000_000,
        currency="USD",
        created_at=NOW - timedelta(hours=2),
        deadline_at=NOW + timedelta(hours=3, minutes=15),
        lifetime_cap_at=None,
        host_key_fingerprint="SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
        python_path=None,
        agent_version="0.1.0",
        channel_id="CTEAM",
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def gpus(
    n: int = 8, name: str = "NVIDIA H100 80GB HBM3", util: int | None = 50
) -> tuple[GpuView, ...]:
    return tuple(GpuView(i, name, util, 10 * GIB, 80 * GIB, 55, 300.0) for i in range(n))


def row(view: InstanceView | None = None, **changes: object) -> InstanceRow:
    base = InstanceRow(
        instance=view or inst(),
        live=True,
        gpus=gpus(),
        problem=None,
        running_jobs=(),
        cost_micros=48_000_000,
        polled_at=NOW,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def overview(rows: list[InstanceRow]) -> FleetOverview:
    return FleetOverview(rows=tuple(rows), now=NOW, timezone="Europe/Berlin")


# --- fleet overview ---------------------------------------------------------------------------


def test_overview_shows_owner_gpus_utilisation_memory_job_deadline_and_cost() -> None:
    job = JobBrief(3, "j3", "UOTHER", "python train.py --epochs 3", NOW - timedelta(minutes=5))
    blocks = check_message(render.fleet_overview(overview([row(running_jobs=(job,))])))
    text = all_text(blocks)
    assert "*box1*" in text
    assert "<@UOWNER>" in text
    assert "8x h100" in text
    assert "util 50% (per GPU " + ", ".join(["50%"] * 8) + ")" in text
    assert "mem 80/640 GiB" in text
    assert "`python train.py --epochs 3` by <@UOTHER>" in text
    assert "3h 15m left" in text
    assert "$48.00 so far" in text
    assert "$24.00/h together" in text


def test_overview_shows_an_unreachable_instance_with_its_error_and_last_data() -> None:
    problem = ProblemView("Unreachable", "box2: connection refused", "Check that it runs.")
    stale = row(inst("box2"), live=False, problem=problem, polled_at=NOW - timedelta(minutes=7))
    blocks = check_message(render.fleet_overview(overview([row(), stale])))
    text = all_text(blocks)
    assert "*Unreachable*: box2: connection refused Check that it runs." in text
    assert "(as of 7m ago)" in text
    assert "1 not reachable" in text


def test_overview_of_nothing_says_how_to_register() -> None:
    blocks = check_message(render.fleet_overview(overview([])))
    assert "/gpu register" in all_text(blocks)


@pytest.mark.parametrize("count", [1, 45, 46, 100, 400])
def test_overview_of_many_big_instances_stays_within_slack_limits(count: int) -> None:
    long_name = "n" * 64
    job = JobBrief(1, "j", "UOTHER", LONG, NOW)
    problem = ProblemView("AgentBroken", LONG, LONG)
    rows = [
        row(
            inst(f"{long_name}{i}", project=LONG, gpu_model="m" * 64),
            gpus=gpus(8, name="G" * 200),
            running_jobs=(job, job),
            problem=problem if i % 3 == 0 else None,
        )
        for i in range(count)
    ]
    blocks = check_message(render.fleet_overview(overview(rows)))
    assert len(blocks) <= 50
    shown = all_text(blocks).count(long_name)
    note = "more sections not shown; ask for one instance with `/gpu status NAME`."
    if count <= render.ROWS_AS_SECTIONS:
        assert shown == count
        assert note not in all_text(blocks)
    if count == 400:
        assert note in all_text(blocks)
        assert 0 < shown < count


def test_list_shows_stored_instances() -> None:
    stored = row(live=False, gpus=(), polled_at=None)
    blocks = check_message(render.instance_list(overview([stored])))
    text = all_text(blocks)
    assert "*box1*" in text
    assert "not polled yet" in text


# --- one instance -----------------------------------------------------------------------------


def detail(**changes: object) -> InstanceDetail:
    base = InstanceDetail(
        row=row(),
        now=NOW,
        timezone="Europe/Berlin",
        hostname="gpu-7",
        driver_version="550.54.15",
        cuda_version="12.4",
        processes=(ProcessView(0, 4242, "alice", "python train.py", 9 * GIB, "j3"),),
        compute_cost_micros=48_000_000,
        storage_cost_micros=1_500_000,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_detail_shows_everything_and_a_release_button() -> None:
    blocks = check_message(render.instance_detail(detail()))
    text = all_text(blocks)
    assert "root@203.0.113.7:2222" in text
    assert "`SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG`" in text
    assert "driver 550.54.15, CUDA 12.4" in text
    assert "$49.50 (storage $1.50)" in text
    assert "Wed 02 Dec 16:15 CET (3h 15m left)" in text
    assert "pid 4242" in text
    assert buttons(blocks) == [("instance_release_ask", "7")]


def test_detail_of_a_released_instance_has_no_button() -> None:
    released = row(inst(state="released"), live=False, gpus=())
    blocks = check_message(render.instance_detail(detail(row=released, processes=())))
    assert buttons(blocks) == []
    assert "released" in all_text(blocks)


def test_detail_with_huge_values_stays_within_limits() -> None:
    many = tuple(ProcessView(i % 8, i, LONG, LONG, GIB, None) for i in range(500))
    jobs = tuple(JobBrief(i, "j", "U", LONG, None) for i in range(50))
    big = row(inst("n" * 200, project=LONG), gpus=gpus(64, name=LONG), running_jobs=jobs)
    blocks = check_message(
        render.instance_detail(detail(row=big, processes=many, driver_version=LONG))
    )
    text = all_text(blocks)
    assert "more processes." in text
    assert "more GPUs." in text
    assert "more jobs." in text


# --- health -----------------------------------------------------------------------------------


def test_health_lists_every_check_with_hints_for_problems() -> None:
    checks = (
        CheckView("driver", "pass", "driver 550.54.15", ""),
        CheckView("ecc", "fail", "2 uncorrected ECC errors", "Ask the platform for another GPU."),
        CheckView("pcie", "warn", "x8 instead of x16", "Judge the link under load."),
        CheckView("cuda", "skip", "skipped", "Run with --full."),
    )
    view = HealthView(instance=inst(), status="fail", checks=checks, full=False)
    text, blocks = render.health_report(view)
    check_message((text, blocks))
    shown = all_text(list(blocks))
    assert "FAIL" in text
    assert "1 fail, 1 warn, 1 pass, 1 skip" in text
    assert ":x: *ecc*: 2 uncorrected ECC errors" in shown
    assert "_Ask the platform for another GPU._" in shown
    assert "--full" in shown


def test_health_with_many_long_checks_stays_within_limits() -> None:
    checks = tuple(CheckView(f"c{i}" * 30, "warn", LONG, LONG) for i in range(200))
    view = HealthView(instance=inst(), status="warn", checks=checks, full=True)
    check_message(render.health_report(view))


# --- registration -----------------------------------------------------------------------------


def registered(**changes: object) -> RegisterResult:
    base = RegisterResult(
        instance=inst(),
        host_key_fingerprint="SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
        agent_version="0.1.0",
        health=HealthView(inst(), "pass", (CheckView("driver", "pass", "ok", ""),), False),
        gpus=gpus(),
        mismatch=None,
        re_registered=False,
        now=NOW,
        timezone="UTC",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_registration_shows_the_pinned_host_key_and_delivered_gpus() -> None:
    text, blocks = render.register_result(registered())
    shown = all_text(check_message((text, blocks)))
    assert text == "Registered box1 (root@203.0.113.7:2222)."
    assert "*Host key (pinned)*\n`SHA256:abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG`" in shown
    assert "8x NVIDIA H100 80GB HBM3" in shown
    assert "$24.00/h" in shown
    assert "mismatch" not in shown.lower()


def test_registration_with_a_mismatch_says_so_loudly() -> None:
    mismatch = Mismatch(
        "h100", 8, ("NVIDIA A100-SXM4-80GB",), ("fewer cards: 1 delivered, 8 rented",)
    )
    result = registered(mismatch=mismatch, gpus=gpus(1, "NVIDIA A100-SXM4-80GB"))
    text, blocks = render.register_result(result)
    shown = all_text(check_message((text, blocks)))
    assert "do not match" in text
    assert ":rotating_light: *GPU mismatch on box1*" in shown
    assert "• fewer cards: 1 delivered, 8 rented" in shown
    notice_text, notice = render.mismatch_notice(result)
    check_message((notice_text, notice))
    assert "<@UOWNER>" in notice_text
    assert "rented 8x h100, delivered 1x NVIDIA A100-SXM4-80GB" in notice_text


def test_registration_with_failing_checks_and_huge_values_stays_within_limits() -> None:
    checks = tuple(CheckView(f"c{i}", "fail", LONG, LONG) for i in range(100))
    mismatch = Mismatch(LONG, 8, (LONG,), tuple(LONG for _ in range(20)))
    result = registered(
        instance=inst("n" * 300, project=LONG),
        health=HealthView(inst(), "fail", checks, False),
        mismatch=mismatch,
        agent_version=LONG,
        gpus=gpus(64, name=LONG),
    )
    check_message(render.register_result(result))
    check_message(render.mismatch_notice(result))


def test_host_key_alert_shows_both_fingerprints() -> None:
    text, blocks = render.host_key_changed(inst(), expected="SHA256:old", presented="SHA256:new")
    check_message((text, blocks))
    assert "`SHA256:old`" in text
    assert "`SHA256:new`" in text
    assert "/gpu register box1 root@203.0.113.7:2222" in text


def test_the_notices_render_as_their_messages() -> None:
    mismatch = Mismatch("h100", 8, (), ("fewer cards: 0 delivered, 8 rented",))
    result = registered(mismatch=mismatch, gpus=())
    assert render_notice(GpuMismatch(result)) == render.mismatch_notice(result)
    alert = HostKeyAlert(inst(), expected="SHA256:old", presented="SHA256:new")
    assert render_notice(alert) == render.host_key_changed(
        inst(), expected="SHA256:old", presented="SHA256:new"
    )


def test_user_text_is_escaped() -> None:
    problem = ProblemView("AgentBroken", "<!channel> & <@U1>", "")
    blocks = check_message(render.fleet_overview(overview([row(problem=problem, live=False)])))
    text = all_text(blocks)
    assert "&lt;!channel&gt; &amp; &lt;@U1&gt;" in text
    assert "<!channel>" not in text


# --- extend and release -----------------------------------------------------------------------


def test_extended_shows_the_new_deadline_and_the_cap() -> None:
    capped = inst(lifetime_cap_at=NOW + timedelta(hours=5))
    text, blocks = render.extended(capped, now=NOW, timezone="UTC")
    check_message((text, blocks))
    assert "Wed 02 Dec 15:15 UTC (3h 15m left)" in text
    assert "An admin limited its lifetime to Wed 02 Dec 17:00 UTC" in text


def test_release_ask_has_confirm_and_cancel_buttons_and_warns_about_jobs() -> None:
    jobs = (JobBrief(3, "j3", "UOTHER", "python train.py", NOW),)
    ask = ReleaseAsk(instance=inst(), manual=True, cost_micros=12_340_000, running_jobs=jobs)
    text, blocks = render.release_ask(ask)
    check_message((text, blocks))
    assert "$12.34 so far" in text
    assert "1 job(s) still running" in text
    assert "Released on the platform" in text
    assert buttons(list(blocks)) == [
        ("instance_release_confirm", "7"),
        ("instance_release_cancel", "7"),
    ]
    api = render.release_ask(replace(ask, manual=False, running_jobs=()))
    assert "terminate it on manual" in api[0]


@pytest.mark.parametrize(
    ("state", "manual", "expected"),
    [
        ("confirmed", False, "is released. The meter stopped."),
        ("awaiting_owner", True, "press *Released on the platform*"),
        ("pending", False, "waiting for manual to confirm it"),
        ("escalated", False, "keeps failing"),
    ],
)
def test_release_result(state: str, manual: bool, expected: str) -> None:
    view = ReleaseView(inst(), 1, state, manual, "HTTP 500" if state == "escalated" else None)
    text, blocks = render.release_result(view)
    check_message((text, blocks))
    assert expected in text


def test_release_cancelled() -> None:
    text, blocks = render.release_cancelled(inst())
    check_message((text, blocks))
    assert "nothing changed" in text


def test_rows_without_gpus_say_whether_they_were_ever_seen() -> None:
    seen = row(live=False, gpus=(), polled_at=NOW - timedelta(minutes=3))
    never = row(inst("box2"), live=False, gpus=(), polled_at=None)
    text = all_text(check_message(render.instance_list(overview([seen, never]))))
    assert ":white_circle: no GPUs (as of 3m ago)" in text
    assert ":white_circle: not polled yet" in text


def test_release_ask_of_an_instance_without_a_price() -> None:
    ask = ReleaseAsk(
        instance=inst(price_micros_per_hour=0), manual=True, cost_micros=0, running_jobs=()
    )
    text, _ = render.release_ask(ask)
    assert "It has cost $0.00 so far." in text
    assert "no price" not in text


# --- what was rented against what was delivered, and the settings ------------------------------

RTX_MISMATCH = Mismatch(
    "a100", 8, ("NVIDIA GeForce RTX 4090",) * 4, ("fewer cards: 4 delivered, 8 rented",)
)


def test_a_row_whose_gpus_differ_says_rented_and_delivered() -> None:
    odd = row(
        inst(gpu_model="A100", gpu_count=8),
        gpus=gpus(4, "NVIDIA GeForce RTX 4090"),
        mismatch=RTX_MISMATCH,
    )
    said = "rented 8x A100, delivered 4x NVIDIA GeForce RTX 4090"
    for message in (
        render.fleet_overview(overview([odd])),
        render.instance_list(overview([odd])),
        render.instance_detail(detail(row=odd)),
    ):
        text = all_text(check_message(message))
        assert f":warning: {said}" in text
    fine = all_text(check_message(render.fleet_overview(overview([row()]))))
    assert "delivered" not in fine
    assert "8x h100" in fine


def test_a_row_with_no_visible_gpu_says_so() -> None:
    none = Mismatch("a100", 1, (), ("no GPU is visible: driver not loaded",))
    odd = row(inst(gpu_model="A100", gpu_count=1), gpus=(), mismatch=none)
    text = all_text(check_message(render.fleet_overview(overview([odd]))))
    assert "rented 1x A100, delivered no visible GPU" in text


def settings(**changes: object) -> SettingsView:
    base = SettingsView(
        name="box1",
        at_deadline="wait-for-jobs",
        max_grace_s=7200,
        idle_release_after_s=1800,
        release_when_done=True,
        lifetime_cap_at=NOW + timedelta(days=3),
        billing_increment="minute",
        min_charge_s=60,
        disk_gb=200.0,
        storage_micros_per_gb_month=100_000,
        currency="USD",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_the_settings_show_policy_cap_billing_and_disk() -> None:
    view = InstanceSettings(inst(), settings(), NOW, "Europe/Berlin")
    text = all_text(check_message(render.instance_settings(view)))
    for line in (
        "*box1*: deadline Wed 02 Dec 16:15 CET (3h 15m left)",
        "at the deadline: wait for running jobs, at most 2h",
        "idle: released 30m after the idle prompt",
        "when its jobs are done: released",
        "lifetime cap: Sat 05 Dec 13:00 CET",
        "billing: per minute, minimum charge 1m",
        "disk: 200 GB at $0.10/GB-month",
        "/gpu policy box1 --at-deadline",
    ):
        assert line in text, line
    plain = settings(
        at_deadline="release",
        idle_release_after_s=None,
        release_when_done=False,
        lifetime_cap_at=None,
        min_charge_s=0,
        disk_gb=None,
        storage_micros_per_gb_month=0,
    )
    stop = settings(at_deadline="stop", max_grace_s=86_400)
    text = all_text(check_message(render.instance_settings(replace(view, settings=stop))))
    assert "at the deadline: stop (disk kept and billed), released 1d after the deadline" in text
    text = all_text(check_message(render.instance_settings(replace(view, settings=plain))))
    for line in (
        "at the deadline: release",
        "idle: prompt only",
        "when its jobs are done: kept",
        "lifetime cap: none",
        "minimum charge none",
        "disk: not given",
    ):
        assert line in text, line


def test_registration_and_detail_carry_the_settings() -> None:
    result = registered(settings=settings())
    assert "*Settings*" in all_text(check_message(render.register_result(result)))
    assert "*Settings*" in all_text(
        check_message(render.instance_detail(detail(settings=settings())))
    )
    assert "*Settings*" not in all_text(check_message(render.register_result(registered())))


def test_a_default_deadline_is_called_the_default() -> None:
    text = all_text(check_message(render.register_result(registered(default_deadline_s=3600))))
    assert "(the default; `--release-in` or `--release-at` to choose)" in text
    assert "the default" not in all_text(check_message(render.register_result(registered())))


# --- confirm dialogs --------------------------------------------------------------------------


def _confirms(blocks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The confirm dialog of each button that has one, by action id."""
    found: dict[str, dict[str, Any]] = {}
    for block in blocks:
        for element in block.get("elements", []):
            if element.get("type") == "button" and "confirm" in element:
                found[element["action_id"]] = element["confirm"]
    return found


@pytest.mark.parametrize(
    ("mode", "action", "said"),
    [
        ("terminate", "instance_release_confirm", "Releasing *box1* ends its $24.00/h"),
        ("stop", "instance_stop_confirm", "Stopping *box1* ends its compute billing"),
    ],
)
def test_the_yes_button_asks_again_naming_the_instance_and_its_cost(
    mode: str, action: str, said: str
) -> None:
    ask = ReleaseAsk(
        instance=inst(storage_micros_per_hour=50_000),
        manual=False,
        cost_micros=12_340_000,
        running_jobs=(),
        mode=mode,
    )
    blocks = check_message(render.release_ask(ask))
    dialogs = _confirms(blocks)
    assert list(dialogs) == [action]
    dialog = dialogs[action]
    assert "box1" in dialog["title"]["text"]
    assert said in dialog["text"]["text"]
    assert "$12.34 so far" in dialog["text"]["text"]
    assert dialog["deny"]["text"] == "Cancel"
    assert dialog["confirm"]["text"] in ("Yes, release it", "Yes, stop it")
    if mode == "stop":
        assert "keeps billing ($0.05" in dialog["text"]["text"]


@pytest.mark.parametrize("mode", ["terminate", "stop"])
@pytest.mark.parametrize("price", [0, 24_000_000])
def test_confirm_dialogs_of_long_names_stay_within_slack_limits(mode: str, price: int) -> None:
    long = inst("n" * 300, price_micros_per_hour=price, provider="p" * 300)
    ask = ReleaseAsk(instance=long, manual=True, cost_micros=10**15, running_jobs=(), mode=mode)
    dialog = _confirms(check_message(render.release_ask(ask)))
    (only,) = dialog.values()
    assert len(only["title"]["text"]) <= 100
    assert len(only["text"]["text"]) <= 300
    assert len(only["confirm"]["text"]) <= 30
    assert len(only["deny"]["text"]) <= 30


def test_buttons_that_only_ask_or_change_nothing_have_no_dialog() -> None:
    ask = ReleaseAsk(instance=inst(), manual=False, cost_micros=0, running_jobs=())
    assert "instance_release_cancel" not in _confirms(check_message(render.release_ask(ask)))
    assert _confirms(check_message(render.instance_detail(detail()))) == {}
