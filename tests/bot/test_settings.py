"""Settings keep their secrets out of repr() and str(), wherever they came from."""

from __future__ import annotations

import logging
from dataclasses import fields

import pytest

from bot.settings import MASK, Settings, is_secret_field, mask_url_password

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
