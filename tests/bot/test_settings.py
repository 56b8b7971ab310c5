"""Settings keep their secrets out of repr() and str(), wherever they came from; every numeric
setting has a range and every named one its choices, and a bad value stops `gpubot` with exit
status 2 and a message naming the variable and what it accepts."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from bot.errors import ConfigError
from bot.settings import MASK, NUMBERS, Settings, is_secret_field, mask_url_password

SECRET_FIELDS = {
    "slack_bot_token",
    "slack_app_token",
    "slack_signing_secret",
    "lambda_api_key",
    "runpod_api_key",
    "vast_api_key",
}
DB_PASSWORD = "db-pass-4e1f"
DATABASE_URL = f"postgresql+psycopg://gpubot:{DB_PASSWORD}@db.internal:5432/gpubot"


def _secret_names() -> set[str]:
    return {item.name for item in fields(Settings) if is_secret_field(item.name)}


def _with_every_secret() -> tuple[Settings, list[str]]:
    secrets = {name: f"SECRET-{name}-9c2d" for name in _secret_names()}
    settings = Settings(**secrets, database_url=DATABASE_URL, channel="C0OPS")  # type: ignore[arg-type]
    return settings, [*secrets.values(), DB_PASSWORD]


def test_every_secret_looking_field_is_treated_as_secret() -> None:
    assert _secret_names() >= SECRET_FIELDS
    assert not {"ssh_key", "ssh_key_dir", "slack_api_url", "data_dir"} & _secret_names()


def test_repr_and_str_show_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    settings, secrets = _with_every_secret()
    caplog.set_level(logging.INFO)
    logging.getLogger("test").info("settings: %s", settings)
    for shown in (repr(settings), str(settings), f"{settings}", caplog.text):
        assert [secret for secret in secrets if secret in shown] == [], shown
        assert f"slack_bot_token={MASK!r}" in shown
        assert "database_url='postgresql+psycopg://gpubot:***@db.internal:5432/gpubot'" in shown
        assert "channel='C0OPS'" in shown  # the rest is still there to read


def test_secrets_read_from_the_environment_are_hidden_too() -> None:
    env = {
        "SLACK_BOT_TOKEN": "xoxb-env-token",
        "SLACK_APP_TOKEN": "xapp-env-token",
        "SLACK_SIGNING_SECRET": "env-signing-secret",
        "GPUBOT_LAMBDA_API_KEY": "env-lambda-key",
        "GPUBOT_RUNPOD_API_KEY": "env-runpod-key",
        "GPUBOT_VAST_API_KEY": "env-vast-key",
        "GPUBOT_DATABASE_URL": DATABASE_URL,
    }
    shown = repr(Settings.from_env(env))
    assert [secret for secret in (*env.values(), DB_PASSWORD) if secret in shown] == []
    assert shown.count(repr(MASK)) == len(SECRET_FIELDS)


def test_unset_secrets_say_so() -> None:
    shown = repr(Settings())
    assert "slack_bot_token=None" in shown
    assert "database_url=None" in shown
    assert MASK not in shown


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:p%40ss@h:5432/d", "postgresql://u:***@h:5432/d"),
        ("postgresql://u:pa/ss@h/d", "postgresql://u:***@h/d"),  # SQLAlchemy reads "pa/ss"
        ("postgresql://u:p@ss@h/d", "postgresql://u:***@h/d"),
        ("postgresql://:p@h/d", "postgresql://:***@h/d"),
        ("postgresql://u:p@[::1]:5432/d", "postgresql://u:***@[::1]:5432/d"),
        (
            "postgresql://h/d?sslmode=require&Password=p",
            "postgresql://h/d?sslmode=require&Password=***",
        ),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("sqlite:////var/lib/gpubot/gpubot.sqlite3", "sqlite:////var/lib/gpubot/gpubot.sqlite3"),
    ],
)
def test_mask_url_password(url: str, masked: str) -> None:
    assert mask_url_password(url) == masked


# --- ranges and names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "raw", "accepts"),
    [
        ("GPUBOT_TICK_INTERVAL_S", "-5", "a number of seconds from 0.1 to 3,600"),
        ("GPUBOT_TICK_INTERVAL_S", "nan", "a number of seconds from 0.1 to 3,600"),
        ("GPUBOT_TICK_INTERVAL_S", "30000", "a number of seconds from 0.1 to 3,600"),
        ("GPUBOT_POLL_INTERVAL_S", "0", "a number of seconds from 1 to 1,000,000,000"),
        ("GPUBOT_POLL_INTERVAL_S", "inf", "a number of seconds from 1 to 1,000,000,000"),
        ("GPUBOT_IDLE_THRESHOLD_PCT", "150", "a GPU utilisation in percent from 0 to 100"),
        ("GPUBOT_IDLE_THRESHOLD_PCT", "-1", "a GPU utilisation in percent from 0 to 100"),
        ("GPUBOT_IDLE_WINDOW_S", "inf", "a whole number of seconds from 60 to 2,592,000"),
        ("GPUBOT_IDLE_WINDOW_S", "1800.5", "a whole number of seconds from 60 to 2,592,000"),
        ("GPUBOT_DEFAULT_RELEASE_IN_S", "0", "a whole number of seconds from 60 to 2,592,000"),
        ("GPUBOT_SLACK_TIMEOUT_S", "0.5", "a number of seconds from 1 to 300"),
        ("GPUBOT_SSH_CONNECT_TIMEOUT_S", "0", "a number of seconds above 0 to 300"),
        ("GPUBOT_SSH_COMMAND_TIMEOUT_S", "-inf", "a number of seconds above 0 to 3,600"),
        ("GPUBOT_EXECUTOR_WORKERS", "0", "a whole number of threads from 1 to 1,024"),
        ("GPUBOT_COMMAND_QUEUE_MAX", "-1", "a whole number of commands from 0 to 100,000"),
        ("GPUBOT_COMMANDS_PER_USER", "2.5", "a whole number of commands from 1 to 1,000"),
        ("GPUBOT_SAMPLE_RETENTION_DAYS", "30", "a whole number of days from 31 to 3,650"),
        ("GPUBOT_SAMPLE_RETENTION_DAYS", "0", "a whole number of days from 31 to 3,650"),
        ("GPUBOT_SAMPLE_RETENTION_DAYS", "3651", "a whole number of days from 31 to 3,650"),
        ("GPUBOT_SAMPLE_RETENTION_DAYS", "35.5", "a whole number of days from 31 to 3,650"),
        (
            "GPUBOT_METRICS_PORT",
            "70000",
            "a TCP port number from 1 to 65535 (or 0 for any free port)",
        ),
    ],
)
def test_a_number_out_of_range_names_the_variable_and_its_range(
    var: str, raw: str, accepts: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({var: raw})
    assert refused.value.message == f"{var}={raw!r} is not accepted."
    assert refused.value.hint == f"Give {accepts}."


def test_text_where_a_number_belongs_says_so_and_what_to_give() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"GPUBOT_TICK_INTERVAL_S": "30s"})
    assert refused.value.user_text() == (
        "GPUBOT_TICK_INTERVAL_S='30s' is not a number.\nGive a number of seconds from 0.1 to 3,600."
    )


@pytest.mark.parametrize(
    ("var", "raw", "hint"),
    [
        ("GPUBOT_CURRENCY", "XYZ", "Use an ISO 4217 code such as USD, EUR, GBP or CNY."),
        ("GPUBOT_CURRENCY", "dollars", "Use an ISO 4217 code such as USD, EUR, GBP or CNY."),
        ("GPUBOT_LOG_LEVEL", "loud", "Use one of DEBUG, INFO, WARNING, ERROR, CRITICAL."),
        ("GPUBOT_LOG_FORMAT", "xml", "Use text or json."),
    ],
)
def test_an_unknown_name_is_refused_with_what_is_accepted(var: str, raw: str, hint: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({var: raw})
    assert refused.value.message == f"{var}={raw!r} is not accepted."
    assert refused.value.hint == hint


def test_edges_of_the_ranges_and_spellings_are_accepted() -> None:
    settings = Settings.from_env(
        {
            "GPUBOT_IDLE_THRESHOLD_PCT": "100",
            "GPUBOT_IDLE_WINDOW_S": "600.0",
            "GPUBOT_TICK_INTERVAL_S": "0.1",
            "GPUBOT_COMMAND_QUEUE_MAX": "0",
            "GPUBOT_METRICS_PORT": "0",
            "GPUBOT_CURRENCY": " eur ",
            "GPUBOT_LOG_LEVEL": "debug",
            "GPUBOT_LOG_FORMAT": "JSON",
        }
    )
    assert settings.idle_threshold_pct == 100
    assert settings.idle_window_s == 600
    assert isinstance(settings.idle_window_s, int)
    assert settings.tick_interval_s == 0.1
    assert (settings.command_queue_max, settings.metrics_port) == (0, 0)
    assert (settings.currency, settings.log_level, settings.log_format) == ("EUR", "DEBUG", "json")


def test_every_numeric_field_has_a_range_and_a_variable() -> None:
    numeric = {
        item.name
        for item in fields(Settings)
        if item.type in ("float", "int") and item.name not in {"warning_offsets_s"}
    }
    assert numeric == {spec.field for spec in NUMBERS}
    assert len({spec.var for spec in NUMBERS}) == len(NUMBERS)
    defaults = Settings()
    for spec in NUMBERS:  # the defaults are inside their own ranges
        assert spec.check(getattr(defaults, spec.field)) == getattr(defaults, spec.field)


def test_sample_retention_is_read_in_days_and_keeps_the_longest_idle_window() -> None:
    assert Settings().sample_retention_days == 35
    settings = Settings.from_env({"GPUBOT_SAMPLE_RETENTION_DAYS": "90"})
    assert settings.sample_retention_days == 90
    assert isinstance(settings.sample_retention_days, int)
    assert Settings.from_env({"GPUBOT_SAMPLE_RETENTION_DAYS": "31"}).sample_retention_days == 31
    # Every poll behind an idle decision is still there: the bottom is past the longest window.
    (retention,) = [spec for spec in NUMBERS if spec.var == "GPUBOT_SAMPLE_RETENTION_DAYS"]
    (window,) = [spec for spec in NUMBERS if spec.var == "GPUBOT_IDLE_WINDOW_S"]
    assert retention.low * 86400 > window.high
    with pytest.raises(ConfigError) as refused:
        Settings(sample_retention_days=7)
    assert refused.value.user_text() == (
        "GPUBOT_SAMPLE_RETENTION_DAYS='7' is not accepted.\n"
        "Give a whole number of days from 31 to 3,650."
    )


def test_values_given_in_code_are_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"GPUBOT_IDLE_THRESHOLD_PCT='150' is not accepted"):
        Settings(idle_threshold_pct=150.0)
    with pytest.raises(ConfigError, match=r"GPUBOT_TICK_INTERVAL_S"):
        Settings().with_(tick_interval_s=float("nan"))
    with pytest.raises(ConfigError, match=r"warning_offsets_s=\(\) is not accepted"):
        Settings(warning_offsets_s=())
    with pytest.raises(ConfigError, match=r"warning_offsets_s=\(1800, -600\)"):
        Settings(warning_offsets_s=(1800, -600))
    with pytest.raises(ConfigError, match=r"GPUBOT_METRICS_HOST is empty"):
        Settings(metrics_host=" ")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"GPUBOT_IDLE_WINDOW_S": "inf"},
            "gpubot: GPUBOT_IDLE_WINDOW_S='inf' is not accepted.\n"
            "Give a whole number of seconds from 60 to 2,592,000.\n",
        ),
        (
            {"GPUBOT_CURRENCY": "XBT"},
            "gpubot: GPUBOT_CURRENCY='XBT' is not accepted.\n"
            "Use an ISO 4217 code such as USD, EUR, GBP or CNY.\n",
        ),
    ],
    ids=["idle-window-inf", "unknown-currency"],
)
def test_the_installed_gpubot_exits_2_naming_the_setting(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    script = Path(sys.executable).with_name("gpubot")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    full.update({"GPUBOT_DATA_DIR": str(tmp_path / "data"), **env})
    done = subprocess.run(
        [str(script), "migrate"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr, done.stdout) == (2, message, "")
    assert not (tmp_path / "data" / "gpubot.sqlite3").exists()  # nothing was touched


@pytest.mark.parametrize(("raw", "language"), [("zh", "zh"), ("中文", "zh"), ("EN", "en")])
def test_the_workspace_language_is_read_as_people_name_it(raw: str, language: str) -> None:
    assert Settings.from_env({"GPUBOT_LANGUAGE": raw}).language == language


def test_a_language_gpubot_does_not_speak_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"GPUBOT_LANGUAGE='fr' is not accepted") as refused:
        Settings.from_env({"GPUBOT_LANGUAGE": "fr"})
    assert "zh" in refused.value.user_text()
