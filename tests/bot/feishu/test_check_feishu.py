"""`gpubot check` on Feishu's settings: each half-made or wrong setting is one line naming the
variable with what to do, and the App ID and Secret are tried against Feishu (the OpenAPI
stand-in, answering as Feishu does)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from bot.check import Problem, ask_feishu_token, check
from bot.feishu.standin import Fault, FeishuStandIn
from bot.settings import Settings
from tests.bot.test_check import run_gpubot

FEISHU = "https://open.feishu.cn"


@pytest.fixture
def standin() -> Iterator[FeishuStandIn]:
    with FeishuStandIn(app_id="cli_a1b2c3d4", app_secret="the-secret") as running:
        yield running


def feishu_problems(
    tmp_path: Path, standin: FeishuStandIn | None = None, **settings: Any
) -> list[Problem]:
    """The problems `gpubot check` finds in Feishu's settings; Feishu is the stand-in (asked
    for a token at its own address whatever the API URL says) or, without one, must not be
    asked at all."""
    asked: list[str] = []

    def ask(url: str, app_id: str, secret: str) -> Mapping[str, object]:
        asked.append(url)
        assert standin is not None, "Feishu was asked"
        return ask_feishu_token(standin.url, app_id, secret)

    found = check(Settings(data_dir=tmp_path / "data", **settings), feishu_token=ask)
    return [p for p in found if p.setting.startswith(("FEISHU_", "GPUBOT_FEISHU_"))]


def lines(problems: list[Problem]) -> list[str]:
    return [problem.line() for problem in problems]


def test_no_feishu_app_is_no_feishu_problem(tmp_path: Path) -> None:
    assert feishu_problems(tmp_path) == []
    assert feishu_problems(tmp_path, feishu_chat="oc_ops", feishu_admins={"ou_boss"}) == []


def test_good_credentials_that_feishu_takes_are_no_problem(
    tmp_path: Path, standin: FeishuStandIn
) -> None:
    good = {"feishu_app_id": "cli_a1b2c3d4", "feishu_app_secret": "the-secret"}
    assert feishu_problems(tmp_path, standin, **good) == []
    also_http = {**good, "feishu_verification_token": "t", "feishu_encrypt_key": "k"}
    assert feishu_problems(tmp_path, standin, **also_http) == []
    paths = [r.path for r in standin.requests]
    assert paths == ["/open-apis/auth/v3/tenant_access_token/internal"] * 2


def test_a_secret_feishu_refuses_is_said_with_feishus_reason(
    tmp_path: Path, standin: FeishuStandIn
) -> None:
    found = feishu_problems(
        tmp_path, standin, feishu_app_id="cli_a1b2c3d4", feishu_app_secret="stale"
    )
    [line] = lines(found)
    assert line.startswith("FEISHU_APP_SECRET: Feishu at https://open.feishu.cn refused")
    assert "app secret invalid (code 10014)" in line
    assert "https://open.larksuite.com" in line  # the hint for a Lark app


@pytest.mark.parametrize("fault", [Fault.HTML_404, Fault.SERVER_ERROR])
def test_an_api_url_that_does_not_answer_as_feishu_is_said_as_such(
    tmp_path: Path, standin: FeishuStandIn, fault: Fault
) -> None:
    standin.fault(fault, path="/open-apis/auth")
    found = feishu_problems(
        tmp_path, standin, feishu_app_id="cli_a1b2c3d4", feishu_app_secret="the-secret"
    )
    [line] = lines(found)
    assert line.startswith("GPUBOT_FEISHU_API_URL: cannot reach Feishu's OpenAPI at " + FEISHU)


def test_an_unreachable_feishu_is_said_as_such(tmp_path: Path) -> None:
    def unreachable(url: str, app_id: str, secret: str) -> Mapping[str, object]:
        return ask_feishu_token("http://127.0.0.1:9", app_id, secret)

    settings = Settings(
        data_dir=tmp_path, feishu_app_id="cli_a1b2c3d4", feishu_app_secret="the-secret"
    )
    found = [p for p in check(settings, feishu_token=unreachable) if "FEISHU" in p.setting]
    assert [p.setting for p in found] == ["GPUBOT_FEISHU_API_URL"]
    assert "cannot reach Feishu's OpenAPI" in found[0].text


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"feishu_app_id": "cli_a1b2c3d4"},
            ["FEISHU_APP_SECRET: is not set, so `gpubot feishu` cannot start."],
        ),
        (
            {"feishu_app_secret": "the-secret"},
            ["FEISHU_APP_ID: is not set, but FEISHU_APP_SECRET is."],
        ),
        (
            {"feishu_app_id": "gpubot", "feishu_app_secret": "s"},
            ["FEISHU_APP_ID: 'gpubot' is not a Feishu App ID (cli_...)."],
        ),
        (
            {"feishu_app_id": "cli_a1b2c3d4", "feishu_verification_token": "t"},
            [
                "FEISHU_APP_SECRET: is not set",
                "FEISHU_ENCRYPT_KEY: is not set, so `gpubot feishu --http` cannot check",
            ],
        ),
        (
            {"feishu_app_id": "cli_a1b2c3d4", "feishu_app_secret": "s", "feishu_encrypt_key": "k"},
            ["FEISHU_VERIFICATION_TOKEN: is not set, so `gpubot feishu --http` cannot check"],
        ),
        (
            {
                "feishu_app_id": "cli_a1b2c3d4",
                "feishu_app_secret": "s",
                "feishu_api_url": "http://open.feishu.cn",
            },
            ["GPUBOT_FEISHU_API_URL: 'http://open.feishu.cn' is not https"],
        ),
    ],
)
def test_each_feishu_mistake_is_one_line_with_what_to_do(
    tmp_path: Path, settings: dict[str, Any], expected: list[str]
) -> None:
    found = lines(feishu_problems(tmp_path, **settings))
    assert len(found) == len(expected), found
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start), line
        assert len(line) > len(start) + 20  # and a hint follows


def test_gpubot_check_prints_feishus_problems_and_exits_1(tmp_path: Path) -> None:
    result = run_gpubot(
        "check",
        env={"GPUBOT_DATA_DIR": str(tmp_path / "data"), "FEISHU_APP_ID": "cli_a1b2c3d4"},
    )
    assert result.returncode == 1, result.stderr
    assert "FEISHU_APP_SECRET: is not set" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"GPUBOT_FEISHU_CHAT": "ops"}, "GPUBOT_FEISHU_CHAT='ops' is not a Feishu chat_id"),
        ({"GPUBOT_FEISHU_ADMINS": "ou_boss,alice"}, "'alice' is not a Feishu open_id"),
    ],
)
def test_a_chat_or_admin_that_is_not_an_id_stops_gpubot_check_with_2(
    tmp_path: Path, env: dict[str, str], said: str
) -> None:
    result = run_gpubot("check", env={"GPUBOT_DATA_DIR": str(tmp_path / "data"), **env})
    assert result.returncode == 2
    assert said in result.stderr
    assert "Traceback" not in result.stderr
