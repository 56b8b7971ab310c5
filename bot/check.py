"""`gpubot check`: try a configuration before starting the bot on it.

Settings that cannot be read at all (a number that is not one, a URL that is not http(s), a
database other than SQLite or PostgreSQL) stop ``gpubot`` before this runs, with status 2. What
this module looks at is each setting that reads well but would fail later: the Slack tokens'
kinds, the ops channel and admins given as IDs, the data directory, the database (reached and
at a schema this version knows), Slack's ``auth.test`` with the bot token, the default SSH key,
the key directory and the keys stored registrations name, and the agent archive. Each problem is
one :class:`Problem`; nothing is changed (the database is only read, a SQLite file that does
not exist yet is not created).

Feishu's settings are looked at when its app is configured (FEISHU_APP_ID or
FEISHU_APP_SECRET set): both credentials, the App ID's shape (``cli_...``), the request URL's
verification token and encrypt key set together (``gpubot feishu --http`` needs both), an API
URL over https, and the credentials tried against Feishu (a tenant token asked for, as the
SDK does). The ops group's ``chat_id`` (``oc_...``) and the admins' open ids
(``ou_...``) are refused, with the variable named, when the settings are read.
"""

from __future__ import annotations

import json
import os
import platform
import re
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from alembic.script import ScriptDirectory
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from sqlalchemy import exc as sa_exc
from sqlmodel import col, select

from bot import __version__
from bot.errors import GpubotError
from bot.fleet.keys import KEY_NAME_RE
from bot.fleet.ssh import load_private_key
from bot.settings import Settings
from bot.slack_notifier import make_client
from bot.store.db import Database, alembic_config, normalize_url, sqlite_in_memory
from bot.store.models import Instance

#: Slack channel IDs: public (C...) and private (G...) channels.
CHANNEL_ID_RE = re.compile(r"[CG][A-Z0-9]{6,}")
#: Slack user IDs (U..., W... in Enterprise Grid).
USER_ID_RE = re.compile(r"[UW][A-Z0-9]{2,}")
#: Seconds a PostgreSQL server gets to answer the connection.
DATABASE_CONNECT_TIMEOUT_S = 10
#: A Feishu app's App ID.
FEISHU_APP_ID_RE = re.compile(r"cli_[A-Za-z0-9]{4,}")
#: Where a Feishu app asks for its tenant token, below the API URL.
FEISHU_TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
#: Seconds Feishu gets to answer the token request.
FEISHU_TIMEOUT_S = 10
#: Asks Feishu at the API URL for a tenant token with an app id and secret: Feishu's answer
#: (``{"code", "msg", ...}``). Raises OSError or ValueError when no such answer comes.
FeishuTokenAsk = Callable[[str, str, str], Mapping[str, object]]


@dataclass(frozen=True)
class Problem:
    """One thing wrong: the variable (or part) it concerns, and what is wrong and what to do."""

    setting: str
    text: str

    def line(self) -> str:
        """The problem as one line of text: ``SETTING: TEXT``."""
        return f"{self.setting}: {' '.join(self.text.split())}"


def version_text() -> str:
    """What ``gpubot --version`` prints: ``gpubot VERSION (Python X.Y.Z)``."""
    return f"gpubot {__version__} (Python {platform.python_version()})"


def check(
    settings: Settings,
    *,
    slack_client: Callable[[Settings], WebClient] = make_client,
    feishu_token: FeishuTokenAsk | None = None,
) -> list[Problem]:
    """Every problem found in ``settings``, in a fixed order (empty when all is well).
    Reaches the database, Slack (through ``slack_client``), Feishu (``feishu_token``,
    default :func:`ask_feishu_token`) and the files named; never raises for what it finds."""
    ask = feishu_token if feishu_token is not None else ask_feishu_token
    found: list[Problem] = []
    for part in (
        _slack_settings,
        lambda s: _feishu(s, ask),
        _data_dir,
        _database,
        lambda s: _slack(s, slack_client),
        _ssh_keys,
        _agent,
    ):
        found.extend(part(settings))
    return found


def _slack_settings(settings: Settings) -> Iterator[Problem]:
    bot, app, secret = (
        settings.slack_bot_token,
        settings.slack_app_token,
        settings.slack_signing_secret,
    )
    if bot and not bot.startswith("xoxb-"):
        yield Problem(
            "SLACK_BOT_TOKEN",
            "is not a bot token (xoxb-...). Use the Bot User OAuth Token from the app's "
            "Install App page.",
        )
    if app and not app.startswith("xapp-"):
        yield Problem(
            "SLACK_APP_TOKEN",
            "is not an app-level token (xapp-...). Make one with connections:write on the "
            "app's Basic Information page.",
        )
    if not bot and (app or secret):
        yield Problem(
            "SLACK_BOT_TOKEN",
            "is not set, so neither Socket Mode nor HTTP mode can start. Set it to the app's "
            "bot token (xoxb-...).",
        )
    if bot and not (app or secret):
        yield Problem(
            "SLACK_APP_TOKEN",
            "is not set and neither is SLACK_SIGNING_SECRET: set SLACK_APP_TOKEN for Socket "
            "Mode or SLACK_SIGNING_SECRET for HTTP mode.",
        )
    channel = settings.channel
    if channel is not None and not CHANNEL_ID_RE.fullmatch(channel):
        yield Problem(
            "GPUBOT_CHANNEL",
            f"{channel!r} is not a channel ID. Give the channel's ID (such as C0123ABCD, at "
            "the bottom of the channel's details in Slack), not its name.",
        )
    for admin in sorted(settings.admins):
        if not USER_ID_RE.fullmatch(admin):
            yield Problem(
                "GPUBOT_ADMINS",
                f"{admin!r} is not a Slack user ID. Give user IDs (such as U0123ABCD, under "
                "the person's profile > Copy member ID), not names.",
            )


def ask_feishu_token(api_url: str, app_id: str, app_secret: str) -> Mapping[str, object]:
    """Feishu's answer to a tenant token request (``tenant_access_token/internal``) for the app.
    Raises OSError (unreachable, or an HTTP error without Feishu's JSON) or ValueError (an
    answer that is not Feishu's JSON)."""
    body = json.dumps({"app_id": app_id, "app_secret": app_secret}).encode()
    request = urllib.request.Request(  # noqa: S310 - an https URL (checked before)
        api_url.rstrip("/") + FEISHU_TOKEN_PATH,
        data=body,
        headers={"Content-Type": "application/json; charset=utf-8"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=FEISHU_TIMEOUT_S) as answer:  # noqa: S310
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        if exc.code >= 500 or not raw.lstrip().startswith(b"{"):
            raise OSError(f"HTTP {exc.code}") from exc
    loaded = json.loads(raw)
    if not isinstance(loaded, dict) or "code" not in loaded:
        raise ValueError("an answer without Feishu's code")
    return loaded


def _feishu(settings: Settings, ask: FeishuTokenAsk) -> Iterator[Problem]:
    """The Feishu settings' problems; the credentials are tried only when there is none."""
    found = list(_feishu_settings(settings))
    yield from found
    app_id, secret = settings.feishu_app_id, settings.feishu_app_secret
    if app_id and secret and not found:
        yield from _feishu_reached(settings.feishu_api_url, app_id, secret, ask)


def _feishu_settings(settings: Settings) -> Iterator[Problem]:
    app_id, secret = settings.feishu_app_id, settings.feishu_app_secret
    if not (app_id or secret):
        return
    if not app_id:
        yield Problem(
            "FEISHU_APP_ID",
            "is not set, but FEISHU_APP_SECRET is. Copy the App ID (cli_...) from the app's "
            "Credentials & Basic Info page in Feishu's developer console.",
        )
    elif not FEISHU_APP_ID_RE.fullmatch(app_id):
        yield Problem(
            "FEISHU_APP_ID",
            f"{app_id!r} is not a Feishu App ID (cli_...). Copy it from the app's Credentials "
            "& Basic Info page.",
        )
    if not secret:
        yield Problem(
            "FEISHU_APP_SECRET",
            "is not set, so `gpubot feishu` cannot start. Copy the App Secret from the app's "
            "Credentials & Basic Info page.",
        )
    token, key = settings.feishu_verification_token, settings.feishu_encrypt_key
    for name, value, other in (
        ("FEISHU_VERIFICATION_TOKEN", token, key),
        ("FEISHU_ENCRYPT_KEY", key, token),
    ):
        if other and not value:
            yield Problem(
                name,
                "is not set, so `gpubot feishu --http` cannot check Feishu's requests. Copy "
                "it from the app's Events and Callbacks > Encryption Strategy (or unset both "
                "to use the long connection, `gpubot feishu`).",
            )
    url = settings.feishu_api_url
    if not url.startswith("https://"):
        yield Problem(
            "GPUBOT_FEISHU_API_URL",
            f"{url!r} is not https, so the app secret would cross the network unencrypted. "
            "Use https://open.feishu.cn (Feishu) or https://open.larksuite.com (Lark).",
        )


def _feishu_reached(url: str, app_id: str, secret: str, ask: FeishuTokenAsk) -> Iterator[Problem]:
    """Feishu's judgement of the app's credentials (the tenant token the SDK asks for)."""
    try:
        answer = ask(url, app_id, secret)
    except (OSError, ValueError) as exc:
        yield Problem(
            "GPUBOT_FEISHU_API_URL",
            f"cannot reach Feishu's OpenAPI at {url}: {exc}. Check the address (Lark: "
            "https://open.larksuite.com) and this machine's network.",
        )
        return
    if answer.get("code") != 0:
        yield Problem(
            "FEISHU_APP_SECRET",
            f"Feishu at {url} refused the App ID and App Secret: {answer.get('msg')} (code "
            f"{answer.get('code')}). Copy both again from the app's Credentials & Basic Info "
            "page; a Lark app needs GPUBOT_FEISHU_API_URL=https://open.larksuite.com.",
        )


def _data_dir(settings: Settings) -> Iterator[Problem]:
    path = settings.data_dir
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            yield Problem(
                "GPUBOT_DATA_DIR", f"{path} is not writable by this user. Give a directory it owns."
            )
        return
    if path.exists():
        yield Problem("GPUBOT_DATA_DIR", f"{path} is not a directory. Give a directory.")
        return
    parent = _existing_parent(path)
    if not os.access(parent, os.W_OK | os.X_OK):
        yield Problem(
            "GPUBOT_DATA_DIR",
            f"{path} does not exist and cannot be made ({parent} is not writable). Give a "
            "directory this user may create.",
        )


def _database(settings: Settings) -> Iterator[Problem]:
    try:
        url = normalize_url(settings.effective_database_url)
    except (GpubotError, ValueError) as exc:
        text = exc.user_text() if isinstance(exc, GpubotError) else str(exc)
        yield Problem("GPUBOT_DATABASE_URL", f"cannot be read: {text}")
        return
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite":
        file = Path(url.database or "").expanduser()
        if sqlite_in_memory(url.database) or str(url.database).startswith("file:"):
            return
        if not file.exists():
            return  # made at the first start; the data directory check covers where
        if not os.access(file, os.R_OK | os.W_OK):
            yield Problem("GPUBOT_DATABASE_URL", f"{file} is not readable and writable here.")
            return
    elif "connect_timeout" not in url.query:
        url = url.update_query_dict({"connect_timeout": str(DATABASE_CONNECT_TIMEOUT_S)})
    try:
        db = Database(url.render_as_string(hide_password=False))
    except GpubotError as exc:
        yield Problem("GPUBOT_DATABASE_URL", exc.user_text())
        return
    try:
        yield from _schema(db, shown, settings)
    except (sa_exc.SQLAlchemyError, GpubotError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines() or [repr(exc)]
        yield Problem(
            "GPUBOT_DATABASE_URL",
            f"cannot reach the database {shown}: {reason[0]}. Check the address, user, "
            "password and database name, and that the server is running.",
        )
    finally:
        db.dispose()


def _schema(db: Database, shown: str, settings: Settings) -> Iterator[Problem]:
    revision = db.current_revision()
    if revision is None:
        return  # empty: migrated at the first start
    scripts = ScriptDirectory.from_config(alembic_config(db))
    if revision not in {script.revision for script in scripts.walk_revisions()}:
        yield Problem(
            "GPUBOT_DATABASE_URL",
            f"the database {shown} is at schema revision {revision}, which gpubot "
            f"{__version__} does not know: a newer gpubot migrated it. Run that version.",
        )
        return
    if revision != scripts.get_current_head():
        return  # older schema: migrated at the next start
    yield from _stored_key_names(db, settings)


def _stored_key_names(db: Database, settings: Settings) -> Iterator[Problem]:
    """Keys that registered instances name but the key directory does not hold."""
    with db.read_session() as session:
        names = session.exec(
            select(Instance.ssh_key_name)
            .where(col(Instance.ssh_key_name).is_not(None), Instance.state != "released")
            .distinct()
        ).all()
    used = sorted(name for name in names if name)
    directory = settings.ssh_key_dir
    if directory is None:
        if used:
            yield Problem(
                "GPUBOT_SSH_KEY_DIR",
                f"is not set, but registered instances use keys by name ({', '.join(used)}). "
                "Set it to the directory that holds them.",
            )
        return
    if not directory.is_dir():
        return  # said by the key directory's own check
    for name in used:
        if not (directory / name).is_file():
            yield Problem(
                "GPUBOT_SSH_KEY_DIR",
                f"registered instances use the key {name!r}, which is not in {directory}. Put "
                "the key back or register those instances with another key.",
            )


def _slack(settings: Settings, client: Callable[[Settings], WebClient]) -> Iterator[Problem]:
    if not settings.slack_bot_token:
        return
    url = settings.slack_api_url
    if not url.endswith("/"):
        yield Problem(
            "GPUBOT_SLACK_API_URL",
            f"{url!r} does not end with a slash, so Slack's methods would be looked for "
            f"beside it. Use {url + '/'!r}.",
        )
        return
    try:
        client(settings).auth_test()
    except SlackApiError as exc:
        status = exc.response.status_code
        data = exc.response.data
        code = data.get("error") if isinstance(data, dict) else None
        if status != 200 or not code:
            yield Problem(
                "GPUBOT_SLACK_API_URL",
                f"{url} does not answer as Slack's Web API: auth.test got HTTP {status}"
                f"{f' ({code})' if code else ''}. Check the address, or try again if Slack is "
                "having trouble.",
            )
            return
        yield Problem(
            "SLACK_BOT_TOKEN",
            f"Slack at {url} refused it: {code}. Use the Bot User OAuth Token (xoxb-...) from "
            "the app's Install App page.",
        )
    except (SlackClientError, OSError, ValueError) as exc:
        yield Problem(
            "GPUBOT_SLACK_API_URL",
            f"cannot reach Slack at {url}: {exc}. Check the address and this machine's network.",
        )


def _ssh_keys(settings: Settings) -> Iterator[Problem]:
    if settings.ssh_key is not None:
        try:
            load_private_key(settings.ssh_key.expanduser())
        except GpubotError as exc:
            yield Problem("GPUBOT_SSH_KEY", exc.user_text())
    directory = settings.ssh_key_dir
    if directory is None:
        return
    if not directory.is_dir():
        yield Problem(
            "GPUBOT_SSH_KEY_DIR",
            f"{directory} is not a directory. Create it and put the keys there, or leave "
            "GPUBOT_SSH_KEY_DIR unset.",
        )
        return
    if not os.access(directory, os.R_OK | os.X_OK):
        yield Problem("GPUBOT_SSH_KEY_DIR", f"{directory} cannot be read by this user.")
        return
    for entry in sorted(directory.iterdir()):
        if not entry.is_file() or entry.name.endswith(".pub"):
            continue
        if not KEY_NAME_RE.fullmatch(entry.name):
            continue
        try:
            load_private_key(entry)
        except GpubotError as exc:
            yield Problem("GPUBOT_SSH_KEY_DIR", exc.user_text())


def _agent(settings: Settings) -> Iterator[Problem]:
    path = settings.agent_zipapp
    if not path.is_file():
        yield Problem(
            "GPUBOT_AGENT_ZIPAPP",
            f"the agent archive {path} is missing. Build it with `make agent`, or point "
            "GPUBOT_AGENT_ZIPAPP at it.",
        )
    elif not zipfile.is_zipfile(path):
        yield Problem(
            "GPUBOT_AGENT_ZIPAPP",
            f"{path} is not an agent archive (not a zip file). Build it again with `make agent`.",
        )


def _existing_parent(path: Path) -> Path:
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")
