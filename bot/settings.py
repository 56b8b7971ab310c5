"""All configuration, read from the environment in one place; explicit arguments override it."""

from __future__ import annotations

import ipaddress
import math
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.errors import ConfigError
from bot.i18n import language_of
from bot.logging_setup import FORMATS, LEVELS

DEFAULT_SLACK_API_URL = "https://slack.com/api/"
#: Feishu's OpenAPI (``https://open.larksuite.com`` for Lark).
DEFAULT_FEISHU_API_URL = "https://open.feishu.cn"


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
    #: The Feishu (Lark) app: its credentials, the OpenAPI's address, the ops group's chat_id
    #: (``oc_...``) and the admins among Feishu people, by open_id (``ou_...``).
    feishu_app_id: str | None = None
    feishu_app_secret: str | None = None
    feishu_verification_token: str | None = None
    feishu_encrypt_key: str | None = None
    feishu_api_url: str = DEFAULT_FEISHU_API_URL
    feishu_chat: str | None = None
    feishu_admins: frozenset[str] = frozenset()
    timezone: str = "UTC"
    currency: str = "USD"
    #: The workspace's language: ``en`` or ``zh`` (each person may choose with `/gpu lang`).
    language: str = "en"
    ssh_key: Path | None = None
    ssh_key_dir: Path | None = None
    ssh_connect_timeout_s: float = 10.0
    ssh_command_timeout_s: float = 120.0
    #: From SIGTERM to exit, seconds: keep it under the service manager's stop timeout
    #: (TimeoutStopSec=30 in deploy/systemd), with room for the interpreter to go.
    stop_timeout_s: float = 22.0
    agent_zipapp: Path = Path("dist/gpu-agent.pyz")
    aws_endpoint_url: str | None = None
    aws_region: str = "us-east-1"
    lambda_api_url: str = "https://cloud.lambda.ai/api/v1"
    lambda_api_key: str | None = None
    runpod_api_url: str = "https://api.runpod.io/v2"
    runpod_api_key: str | None = None
    vast_api_url: str = "https://console.vast.ai"
    vast_api_key: str | None = None
    compshare_api_url: str = "https://api.compshare.cn"
    compshare_public_key: str | None = None
    compshare_private_key: str | None = None
    compshare_region: str = "cn-wlcb"
    compshare_project_id: str | None = None
    #: Compshare's billing increment, second or hour: no Compshare document states it (the
    #: price guide in bot/data/prices_cny.json says per second, unverified); "hour", the
    #: larger, is the unverified default so that costs are never under-stated.
    compshare_billing: str = "hour"
    tick_interval_s: float = 30.0
    poll_interval_s: float = 60.0
    warning_offsets_s: tuple[int, ...] = (1800, 600)
    idle_threshold_pct: float = 5.0
    idle_window_s: int = 1800
    default_release_in_s: int = 8 * 3600
    #: How long a stopped instance's disk is kept before it is released (terminated), counted
    #: from the stop; 0: kept until its owner releases it (reminded on a widening schedule).
    stopped_keep_s: int = 0
    #: Raw utilisation samples (one row per poll) older than this many days are deleted.
    sample_retention_days: int = 35
    executor_workers: int = 32
    #: Users' commands waiting for one of the executor's workers, at most; more are turned away.
    command_queue_max: int = 64
    #: Commands one person may have queued or running at once.
    commands_per_user: int = 4
    #: DEBUG, INFO, WARNING, ERROR or CRITICAL; ``text`` or ``json`` lines.
    log_level: str = "INFO"
    log_format: str = "text"
    #: Where both modes serve /metrics, /healthz and /readyz (port 0: any free port).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464
    #: Where instances may be registered from Slack: CIDRs, and ``public`` for every public
    #: address (GPUBOT_INSTANCE_NETWORKS, comma-separated; default public addresses only).
    instance_networks: tuple[str, ...] = ("public",)

    def __post_init__(self) -> None:
        """Check every numeric setting's range and the named choices; normalise the currency
        and the log level and format. Raises ConfigError naming the variable and what it
        accepts."""
        for spec in NUMBERS:
            object.__setattr__(self, spec.field, spec.check(getattr(self, spec.field)))
        _check_offsets(self.warning_offsets_s)
        object.__setattr__(self, "instance_networks", _networks(self.instance_networks))
        for name, var, choices, hint in _CHOICES:
            raw = getattr(self, name)
            value = str(raw).strip().upper() if name not in _LOWER else str(raw).strip().lower()
            if value not in choices:
                raise ConfigError(f"{var}={raw!r} is not accepted.", hint=hint)
            object.__setattr__(self, name, value)
        language = language_of(self.language)
        if language is None:
            raise ConfigError(
                f"GPUBOT_LANGUAGE={self.language!r} is not accepted.",
                hint="Use en (English) or zh (简体中文).",
            )
        object.__setattr__(self, "language", language)
        if not self.metrics_host.strip():
            raise ConfigError(
                "GPUBOT_METRICS_HOST is empty.",
                hint="Give the address to serve metrics on, such as 127.0.0.1 or 0.0.0.0.",
            )
        for name, var in URL_SETTINGS:
            url = getattr(self, name)
            if url is not None:
                check_http_url(var, url)
        if self.database_url is not None:
            check_database_url(self.database_url)
        _check_feishu_ids(self)

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
        _put(
            values,
            "database_url",
            with_database_password(
                env.get("GPUBOT_DATABASE_URL"), env.get("GPUBOT_DATABASE_PASSWORD")
            ),
        )
        _put(values, "channel", env.get("GPUBOT_CHANNEL"))
        _put(values, "feishu_app_id", env.get("FEISHU_APP_ID"))
        _put(values, "feishu_app_secret", env.get("FEISHU_APP_SECRET"))
        _put(values, "feishu_verification_token", env.get("FEISHU_VERIFICATION_TOKEN"))
        _put(values, "feishu_encrypt_key", env.get("FEISHU_ENCRYPT_KEY"))
        _put(values, "feishu_api_url", env.get("GPUBOT_FEISHU_API_URL"))
        _put(values, "feishu_chat", env.get("GPUBOT_FEISHU_CHAT"))
        if env.get("GPUBOT_FEISHU_ADMINS"):
            values["feishu_admins"] = frozenset(env["GPUBOT_FEISHU_ADMINS"].split(","))
        _put(values, "currency", env.get("GPUBOT_CURRENCY"))
        _put(values, "language", env.get("GPUBOT_LANGUAGE"))
        _put(values, "aws_endpoint_url", env.get("GPUBOT_AWS_ENDPOINT_URL"))
        _put(values, "aws_region", env.get("GPUBOT_AWS_REGION"))
        _put(values, "lambda_api_url", env.get("GPUBOT_LAMBDA_API_URL"))
        _put(values, "lambda_api_key", env.get("GPUBOT_LAMBDA_API_KEY"))
        _put(values, "runpod_api_url", env.get("GPUBOT_RUNPOD_API_URL"))
        _put(values, "runpod_api_key", env.get("GPUBOT_RUNPOD_API_KEY"))
        _put(values, "vast_api_url", env.get("GPUBOT_VAST_API_URL"))
        _put(values, "vast_api_key", env.get("GPUBOT_VAST_API_KEY"))
        _put(values, "compshare_api_url", env.get("GPUBOT_COMPSHARE_API_URL"))
        _put(values, "compshare_public_key", env.get("GPUBOT_COMPSHARE_PUBLIC_KEY"))
        _put(values, "compshare_private_key", env.get("GPUBOT_COMPSHARE_PRIVATE_KEY"))
        _put(values, "compshare_region", env.get("GPUBOT_COMPSHARE_REGION"))
        _put(values, "compshare_project_id", env.get("GPUBOT_COMPSHARE_PROJECT_ID"))
        _put(values, "compshare_billing", env.get("GPUBOT_COMPSHARE_BILLING"))
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
        for spec in NUMBERS:
            if env.get(spec.var):
                values[spec.field] = _number(spec.var, env[spec.var])
        _put(values, "log_level", env.get("GPUBOT_LOG_LEVEL"))
        _put(values, "log_format", env.get("GPUBOT_LOG_FORMAT"))
        _put(values, "metrics_host", env.get("GPUBOT_METRICS_HOST"))
        if env.get("GPUBOT_INSTANCE_NETWORKS"):
            values["instance_networks"] = tuple(env["GPUBOT_INSTANCE_NETWORKS"].split(","))
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
        """Whether a Slack user ID is listed in GPUBOT_ADMINS, or a Feishu person
        (``feishu:ou_...``) in GPUBOT_FEISHU_ADMINS."""
        if user_id.startswith(FEISHU_USER_PREFIX):
            return user_id.removeprefix(FEISHU_USER_PREFIX) in self.feishu_admins
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
_SECRET_SUFFIXES = (
    "_token",
    "_secret",
    "_api_key",
    "_private_key",
    "_password",
    "_encrypt_key",
)


def is_secret_field(name: str) -> bool:
    """Whether a Settings field holds a secret, by its name (``*_token``, ``*_secret``,
    ``*_api_key``, ``*_private_key``, ``*_password``, ``*_encrypt_key``)."""
    return name.endswith(_SECRET_SUFFIXES)


def mask_url_password(url: str) -> str:
    """``url`` with the password of its user part (up to the last ``@``, as SQLAlchemy reads
    it) and of any ``password=`` query parameter replaced by ``***``."""
    masked = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", url, count=1)
    return _QUERY_PASSWORD.sub(rf"\g<head>{MASK}", masked)


_URL_PASSWORD = re.compile(r"^(?P<head>[^:/?#]+://[^:/?#@]*:).*@(?=[^@]*$)", re.DOTALL)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:password|passwd)=)[^&#]*", re.IGNORECASE)


#: Settings that hold the URL of an HTTP API: field and variable.
URL_SETTINGS = (
    ("slack_api_url", "GPUBOT_SLACK_API_URL"),
    ("feishu_api_url", "GPUBOT_FEISHU_API_URL"),
    ("aws_endpoint_url", "GPUBOT_AWS_ENDPOINT_URL"),
    ("lambda_api_url", "GPUBOT_LAMBDA_API_URL"),
    ("runpod_api_url", "GPUBOT_RUNPOD_API_URL"),
    ("vast_api_url", "GPUBOT_VAST_API_URL"),
    ("compshare_api_url", "GPUBOT_COMPSHARE_API_URL"),
)
#: The databases gpubot runs on, by the URL's scheme (before any ``+driver``).
DATABASE_SCHEMES = frozenset({"sqlite", "postgresql", "postgres"})
_DATABASE_HINT = "Set GPUBOT_DATABASE_URL to sqlite:///PATH or postgresql://USER@HOST:PORT/DB."


def check_http_url(var: str, url: str) -> str:
    """``url`` when it is an ``http://`` or ``https://`` URL with a host (and a numeric port,
    if any). Raises ConfigError naming ``var``."""
    shown = mask_url_password(url)
    try:
        parts: urllib.parse.SplitResult | None = urllib.parse.urlsplit(url.strip())
    except ValueError:  # a malformed [IPv6] host
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{var}={shown!r} is not an http:// or https:// URL.",
            hint=f"Give {var} as a full URL such as https://host/path/, or leave it unset.",
        )
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if not port_ok:
        raise ConfigError(
            f"{var}={shown!r} has a port that is not a number from 1 to 65535.",
            hint=f"Correct the port in {var}, or leave it out.",
        )
    return url


def with_database_password(url: str | None, password: str | None) -> str | None:
    """``url`` with ``password`` (GPUBOT_DATABASE_PASSWORD) put in percent-encoded, replacing
    any password it has, so that a password may hold any character (an ``@``, ``:`` or ``/``
    written into a URL breaks it). Without a password, ``url`` as it is. Raises ConfigError when
    there is a password but no URL with a user name to give it to."""
    if not password:
        return url
    hint = "Set GPUBOT_DATABASE_URL without the password: postgresql+psycopg://USER@HOST:PORT/DB."
    if not url:
        raise ConfigError("GPUBOT_DATABASE_PASSWORD is set, GPUBOT_DATABASE_URL is not.", hint=hint)
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError as exc:  # a malformed [IPv6] host
        raise ConfigError("GPUBOT_DATABASE_URL is not a database URL.", hint=hint) from exc
    userinfo, at, host = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    if not at or not user:
        raise ConfigError(
            "GPUBOT_DATABASE_PASSWORD is set, but GPUBOT_DATABASE_URL names no user to give it to.",
            hint=hint,
        )
    netloc = f"{user}:{urllib.parse.quote(password, safe='')}@{host}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def check_database_url(url: str) -> str:
    """``url`` when it names SQLite or PostgreSQL (``sqlite:///PATH``,
    ``postgresql[+psycopg]://...``). Raises ConfigError saying which databases work."""
    shown = mask_url_password(url)
    scheme, sep, _rest = url.strip().partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise ConfigError(
            f"GPUBOT_DATABASE_URL={shown!r} is not a database URL.", hint=_DATABASE_HINT
        )
    backend = scheme.split("+", 1)[0].lower()
    if backend not in DATABASE_SCHEMES:
        raise ConfigError(
            f"GPUBOT_DATABASE_URL names a {backend} database; gpubot runs on SQLite and "
            "PostgreSQL only.",
            hint=_DATABASE_HINT,
        )
    try:
        port = urllib.parse.urlsplit(url.strip()).port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise ConfigError(
            f"GPUBOT_DATABASE_URL={shown!r} has a port that is not a number from 1 to 65535.",
            hint=_DATABASE_HINT,
        )
    return url


def _put(values: dict[str, Any], name: str, value: str | None) -> None:
    if value:
        values[name] = value


def _number(var: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{var}={raw!r} is not a number.", hint=f"Give {NUMBERS_BY_VAR[var].accepts()}."
        ) from exc


@dataclass(frozen=True)
class NumberSetting:
    """A numeric setting: the field, its variable, the range it accepts (``low`` excluded when
    ``low_open``) in ``unit``, and whether it takes whole numbers only."""

    field: str
    var: str
    low: float
    high: float
    unit: str
    whole: bool = False
    low_open: bool = False
    #: What it accepts in words, where the unit alone does not say it well.
    words: str = ""

    def accepts(self) -> str:
        """What the setting accepts, in words."""
        if self.words:
            return self.words
        kind = "a whole number of" if self.whole else "a number of"
        low = f"above {_figure(self.low)}" if self.low_open else f"from {_figure(self.low)}"
        return f"{kind} {self.unit} {low} to {_figure(self.high)}"

    def check(self, value: object) -> float | int:
        """``value`` when in range (as an int for whole numbers). Raises ConfigError."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._refused(value)
        number = float(value)
        if not math.isfinite(number) or number > self.high:
            raise self._refused(value)
        if number < self.low or (self.low_open and number == self.low):
            raise self._refused(value)
        if self.whole:
            if not number.is_integer():
                raise self._refused(value)
            return int(number)
        return value

    def _refused(self, value: object) -> ConfigError:
        shown = _shown(value)
        return ConfigError(f"{self.var}={shown} is not accepted.", hint=f"Give {self.accepts()}.")


_DAY_S = 86400
#: The longest idle window (GPUBOT_IDLE_WINDOW_S) accepted, in seconds.
IDLE_WINDOW_MAX_S = 30 * _DAY_S
#: Every numeric setting, its variable and its range.
NUMBERS = (
    NumberSetting("slack_timeout_s", "GPUBOT_SLACK_TIMEOUT_S", 1, 300, "seconds"),
    NumberSetting(
        "ssh_connect_timeout_s", "GPUBOT_SSH_CONNECT_TIMEOUT_S", 0, 300, "seconds", low_open=True
    ),
    NumberSetting(
        "ssh_command_timeout_s", "GPUBOT_SSH_COMMAND_TIMEOUT_S", 0, 3600, "seconds", low_open=True
    ),
    # The stop's last 3 s (bot.cli.ABANDON_S), or all of a shorter one, go to abandoning
    # what still runs.
    NumberSetting("stop_timeout_s", "GPUBOT_STOP_TIMEOUT_S", 1, 3600, "seconds"),
    NumberSetting("tick_interval_s", "GPUBOT_TICK_INTERVAL_S", 0.1, 3600, "seconds"),
    # The top is about 30 years: polling that seldom is never, which a setting may ask for.
    NumberSetting("poll_interval_s", "GPUBOT_POLL_INTERVAL_S", 1, 10**9, "seconds"),
    NumberSetting(
        "idle_threshold_pct",
        "GPUBOT_IDLE_THRESHOLD_PCT",
        0,
        100,
        "percent",
        words="a GPU utilisation in percent from 0 to 100",
    ),
    NumberSetting(
        "idle_window_s", "GPUBOT_IDLE_WINDOW_S", 60, IDLE_WINDOW_MAX_S, "seconds", whole=True
    ),
    # Reports never read raw samples: the ledger, /gpu spend and the digest (this month's and the
    # last) read the hourly roll-ups (utilhour) and the charges that carry them, which are kept.
    # Raw samples are read as each instance's newest poll (deadlines) and by people asking why an
    # instance was found idle; the bottom keeps every poll of the longest idle window, a day more.
    NumberSetting(
        "sample_retention_days",
        "GPUBOT_SAMPLE_RETENTION_DAYS",
        IDLE_WINDOW_MAX_S // _DAY_S + 1,
        3650,
        "days",
        whole=True,
    ),
    NumberSetting(
        "default_release_in_s",
        "GPUBOT_DEFAULT_RELEASE_IN_S",
        60,
        30 * _DAY_S,
        "seconds",
        whole=True,
    ),
    NumberSetting(
        "stopped_keep_s", "GPUBOT_STOPPED_KEEP_S", 0, 365 * _DAY_S, "seconds", whole=True
    ),
    NumberSetting("executor_workers", "GPUBOT_EXECUTOR_WORKERS", 1, 1024, "threads", whole=True),
    NumberSetting(
        "command_queue_max", "GPUBOT_COMMAND_QUEUE_MAX", 0, 100_000, "commands", whole=True
    ),
    NumberSetting("commands_per_user", "GPUBOT_COMMANDS_PER_USER", 1, 1000, "commands", whole=True),
    NumberSetting(
        "metrics_port",
        "GPUBOT_METRICS_PORT",
        0,
        65535,
        "port",
        whole=True,
        words="a TCP port number from 1 to 65535 (or 0 for any free port)",
    ),
)
NUMBERS_BY_VAR = {spec.var: spec for spec in NUMBERS}
#: A warning goes out this many seconds before a deadline, at least and at most.
WARNING_OFFSET_RANGE_S = (60, 7 * _DAY_S)

_ISO_4217_CODES = """
    AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN
    BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD
    FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY
    KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP
    MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR
    RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT
    TND TOP TRY TTD TWD TZS UAH UGX USD UYU UZS VED VES VND VUV WST XAF XCD XCG XOF XPF YER
    ZAR ZMW ZWG
"""
#: Active ISO 4217 currency codes (funds, metals and test codes left out).
ISO_4217 = frozenset(_ISO_4217_CODES.split())
#: Settings that take one of a few names: field, variable, the names, and the hint.
_LOWER = frozenset({"log_format", "compshare_billing"})
_CHOICES: tuple[tuple[str, str, frozenset[str], str], ...] = (
    ("currency", "GPUBOT_CURRENCY", ISO_4217, "Use an ISO 4217 code such as USD, EUR, GBP or CNY."),
    ("log_level", "GPUBOT_LOG_LEVEL", frozenset(LEVELS), f"Use one of {', '.join(LEVELS)}."),
    ("log_format", "GPUBOT_LOG_FORMAT", frozenset(FORMATS), f"Use {' or '.join(FORMATS)}."),
    (
        "compshare_billing",
        "GPUBOT_COMPSHARE_BILLING",
        frozenset({"second", "hour"}),
        "Use second or hour.",
    ),
)


#: How a Feishu person's user id starts in the bot (``feishu:ou_...``).
FEISHU_USER_PREFIX = "feishu:"
_FEISHU_OPEN_ID = re.compile(r"ou_[A-Za-z0-9]{1,60}")
_FEISHU_CHAT_ID = re.compile(r"oc_[A-Za-z0-9]{1,60}")


def _check_feishu_ids(settings: Settings) -> None:
    """GPUBOT_FEISHU_ADMINS as open_ids (a ``feishu:`` before one allowed, and dropped) and
    GPUBOT_FEISHU_CHAT as a chat_id. Raises ConfigError naming the one that is not."""
    admins: set[str] = set()
    for raw in settings.feishu_admins:
        item = raw.strip().removeprefix(FEISHU_USER_PREFIX)
        if not item:
            continue
        if not _FEISHU_OPEN_ID.fullmatch(item):
            raise ConfigError(
                f"GPUBOT_FEISHU_ADMINS: {raw.strip()!r} is not a Feishu open_id.",
                hint="Give open_ids (ou_...), separated by commas.",
            )
        admins.add(item)
    object.__setattr__(settings, "feishu_admins", frozenset(admins))
    chat = settings.feishu_chat
    if chat is not None and not _FEISHU_CHAT_ID.fullmatch(chat):
        raise ConfigError(
            f"GPUBOT_FEISHU_CHAT={chat!r} is not a Feishu chat_id.",
            hint="Give the ops group's chat_id (oc_...), not its name.",
        )


def _check_offsets(offsets: tuple[int, ...]) -> None:
    low, high = WARNING_OFFSET_RANGE_S
    ok = bool(offsets) and all(
        isinstance(offset, int) and not isinstance(offset, bool) and low <= offset <= high
        for offset in offsets
    )
    if not ok:
        raise ConfigError(
            f"warning_offsets_s={offsets!r} is not accepted.",
            hint=f"Give one or more whole numbers of seconds from {low} to {high}.",
        )


def _networks(items: tuple[str, ...]) -> tuple[str, ...]:
    """GPUBOT_INSTANCE_NETWORKS as CIDRs in their normal form (``public`` kept as a word).
    Raises ConfigError naming the item that is neither."""
    found: list[str] = []
    for item in (part.strip() for part in items):
        if not item:
            continue
        if item.lower() == "public":
            found.append("public")
            continue
        try:
            found.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError as exc:
            raise ConfigError(
                f"GPUBOT_INSTANCE_NETWORKS: {item!r} is not a network.",
                hint="Give CIDRs such as 10.0.0.0/8 or fd00::/8, and public for public "
                "addresses, separated by commas.",
            ) from exc
    if not found:
        raise ConfigError(
            "GPUBOT_INSTANCE_NETWORKS lists no network.",
            hint="Give public, CIDRs such as 10.0.0.0/8, or both, separated by commas.",
        )
    return tuple(dict.fromkeys(found))


def _figure(number: float) -> str:
    """A bound as people read it: ``2,592,000``, ``0.1``."""
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


def _shown(value: object) -> str:
    """A value as the person typed it: a float that is whole without its ``.0``."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return repr(str(int(value)))
    return repr(str(value))
