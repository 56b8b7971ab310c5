"""All configuration, read from the environment in one place; explicit arguments override it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.errors import ConfigError

DEFAULT_SLACK_API_URL = "https://slack.com/api/"


@dataclass(frozen=True)
class Settings:
    """The bot's configuration. Build with :meth:`from_env`; durations are in seconds."""

    slack_bot_token: str | None = None
    slack_app_token: str | None = None
    slack_signing_secret: str | None = None
    slack_api_url: str = DEFAULT_SLACK_API_URL
    slack_timeout_s: float = 15.0
    data_dir: Path = field(default_factory=lambda: Path.home() / ".local" / "share" / "gpubot")
    database_url: str | None = None
    admins: frozenset[str] = frozenset()
    channel: str | None = None
    timezone: str = "UTC"
    currency: str = "USD"
    ssh_key: Path | None = None
    ssh_key_dir: Path | None = None
    ssh_connect_timeout_s: float = 10.0
    ssh_command_timeout_s: float = 120.0
    agent_zipapp: Path = Path("dist/gpu-agent.pyz")
    aws_endpoint_url: str | None = None
    aws_region: str = "us-east-1"
    lambda_api_url: str = "https://cloud.lambdalabs.com/api/v1"
    lambda_api_key: str | None = None
    runpod_api_url: str = "https://rest.runpod.io/v1"
    runpod_api_key: str | None = None
    vast_api_url: str = "https://console.vast.ai"
    vast_api_key: str | None = None
    tick_interval_s: float = 30.0
    poll_interval_s: float = 60.0
    warning_offsets_s: tuple[int, ...] = (1800, 600)
    idle_threshold_pct: float = 5.0
    idle_window_s: int = 1800
    default_release_in_s: int = 8 * 3600
    executor_workers: int = 32
    #: Users' commands waiting for one of the executor's workers, at most; more are turned away.
    command_queue_max: int = 64
    #: Commands one person may have queued or running at once.
    commands_per_user: int = 4

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``GPUBOT_*`` and ``SLACK_*`` variables; keyword arguments win over the environment.

        Raises ConfigError naming the variable when a value cannot be read.
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        _put(values, "slack_bot_token", env.get("SLACK_BOT_TOKEN"))
        _put(values, "slack_app_token", env.get("SLACK_APP_TOKEN"))
        _put(values, "slack_signing_secret", env.get("SLACK_SIGNING_SECRET"))
        _put(values, "slack_api_url", env.get("GPUBOT_SLACK_API_URL"))
        _put(values, "database_url", env.get("GPUBOT_DATABASE_URL"))
        _put(values, "channel", env.get("GPUBOT_CHANNEL"))
        _put(values, "currency", env.get("GPUBOT_CURRENCY"))
        _put(values, "aws_endpoint_url", env.get("GPUBOT_AWS_ENDPOINT_URL"))
        _put(values, "aws_region", env.get("GPUBOT_AWS_REGION"))
        _put(values, "lambda_api_url", env.get("GPUBOT_LAMBDA_API_URL"))
        _put(values, "lambda_api_key", env.get("GPUBOT_LAMBDA_API_KEY"))
        _put(values, "runpod_api_url", env.get("GPUBOT_RUNPOD_API_URL"))
        _put(values, "runpod_api_key", env.get("GPUBOT_RUNPOD_API_KEY"))
        _put(values, "vast_api_url", env.get("GPUBOT_VAST_API_URL"))
        _put(values, "vast_api_key", env.get("GPUBOT_VAST_API_KEY"))
        if env.get("GPUBOT_DATA_DIR"):
            values["data_dir"] = Path(env["GPUBOT_DATA_DIR"]).expanduser()
        if env.get("GPUBOT_SSH_KEY"):
            values["ssh_key"] = Path(env["GPUBOT_SSH_KEY"]).expanduser()
        if env.get("GPUBOT_SSH_KEY_DIR"):
            values["ssh_key_dir"] = Path(env["GPUBOT_SSH_KEY_DIR"]).expanduser()
        if env.get("GPUBOT_AGENT_ZIPAPP"):
            values["agent_zipapp"] = Path(env["GPUBOT_AGENT_ZIPAPP"]).expanduser()
        if env.get("GPUBOT_ADMINS"):
            values["admins"] = frozenset(
                part.strip() for part in env["GPUBOT_ADMINS"].split(",") if part.strip()
            )
        if env.get("GPUBOT_TIMEZONE"):
            values["timezone"] = env["GPUBOT_TIMEZONE"]
        for name, var in (
            ("tick_interval_s", "GPUBOT_TICK_INTERVAL_S"),
            ("poll_interval_s", "GPUBOT_POLL_INTERVAL_S"),
            ("idle_threshold_pct", "GPUBOT_IDLE_THRESHOLD_PCT"),
        ):
            if env.get(var):
                values[name] = _number(var, env[var])
        if env.get("GPUBOT_IDLE_WINDOW_S"):
            values["idle_window_s"] = int(
                _number("GPUBOT_IDLE_WINDOW_S", env["GPUBOT_IDLE_WINDOW_S"])
            )
        values.update(overrides)
        settings = cls(**values)
        settings.tz()  # fail early on an unknown zone
        return settings

    def with_(self, **changes: Any) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def socket_mode(self) -> bool:
        """True when both tokens for Socket Mode are set."""
        return bool(self.slack_bot_token and self.slack_app_token)

    @property
    def effective_database_url(self) -> str:
        """``database_url``, or a SQLite file in ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'gpubot.sqlite3'}"

    def tz(self) -> ZoneInfo:
        """The configured time zone. Raises ConfigError for an unknown name."""
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(
                f"GPUBOT_TIMEZONE={self.timezone!r} is not a known time zone; "
                "use an IANA name such as Europe/Berlin"
            ) from exc

    def is_admin(self, user_id: str) -> bool:
        """Whether a Slack user ID is listed in GPUBOT_ADMINS."""
        return user_id in self.admins

    def __repr__(self) -> str:
        """Every field, with tokens, secrets and keys shown only as set or not, and the
        passwords in URLs (``database_url``, the API URLs) masked; ``str()`` is the same."""
        shown = []
        for item in fields(self):
            if not item.repr:
                continue
            value = getattr(self, item.name)
            if is_secret_field(item.name) and value:
                text = repr(MASK)
            elif item.name.endswith("_url") and isinstance(value, str):
                text = repr(mask_url_password(value))
            else:
                text = repr(value)
            shown.append(f"{item.name}={text}")
        return f"{type(self).__name__}({', '.join(shown)})"


#: What a secret shows as in the repr of Settings.
MASK = "***"
_SECRET_SUFFIXES = ("_token", "_secret", "_api_key", "_password")


def is_secret_field(name: str) -> bool:
    """Whether a Settings field holds a secret, by its name (``*_token``, ``*_secret``,
    ``*_api_key``, ``*_password``)."""
    return name.endswith(_SECRET_SUFFIXES)


def mask_url_password(url: str) -> str:
    """``url`` with the password of its user part (up to the last ``@``, as SQLAlchemy reads
    it) and of any ``password=`` query parameter replaced by ``***``."""
    masked = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", url, count=1)
    return _QUERY_PASSWORD.sub(rf"\g<head>{MASK}", masked)


_URL_PASSWORD = re.compile(r"^(?P<head>[^:/?#]+://[^:/?#@]*:).*@(?=[^@]*$)", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|passwd)=)[^&#]*", re.IGNORECASE)


def _put(values: dict[str, Any], name: str, value: str | None) -> None:
    if value:
        values[name] = value


def _number(var: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} is not a number") from exc
