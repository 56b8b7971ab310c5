"""`gpubot check` and `gpubot --version`, run as real processes: a good configuration on SQLite
and PostgreSQL, and each misconfiguration that used to end in a traceback or fail later."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.errors import ConfigError
from bot.local_slack import LocalSlack
from bot.metrics import Metrics
from bot.settings import Settings
from bot.store.db import Database
from tests.bot.services.support import add_instance
from tests.fixtures.cli_process import run_cli
from tests.fixtures.slack import BOT_TOKEN, CHANNEL, SIGNING_SECRET
from tests.fixtures.sshd import make_client_key

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def run_gpubot(
    *args: str, env: dict[str, str], fresh: bool = False
) -> subprocess.CompletedProcess[str]:
    """`python -m bot.cli ARGS` with a clean environment plus ``env``; waits for its end. The
    process is forked from a warm interpreter (tests/fixtures/cli_process.py) unless ``fresh``
    asks for a new interpreter, as a shell starts it."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    full.update(env)
    if not fresh:
        return run_cli(list(args), env=full)
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        cwd=ROOT,
        env=full,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def good_env(tmp_path: Path, local_slack: LocalSlack) -> dict[str, str]:
    """A configuration with nothing wrong: Slack at the stand-in, a channel ID, a default key,
    a key directory with one key, an agent archive, the SQLite store in the data directory."""
    (tmp_path / "ssh").mkdir()
    (tmp_path / "keys").mkdir()
    agent = tmp_path / "gpu-agent.pyz"
    with zipfile.ZipFile(agent, "w") as archive:
        archive.writestr("__main__.py", "print('agent')\n")
    make_client_key(tmp_path / "keys", "team")
    return {
        "GPUBOT_DATA_DIR": str(tmp_path / "data"),
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "GPUBOT_SLACK_API_URL": local_slack.api_url,
        "GPUBOT_CHANNEL": CHANNEL,
        "GPUBOT_ADMINS": "U0ALICE",
        "GPUBOT_SSH_KEY": str(make_client_key(tmp_path / "ssh", "default")),
        "GPUBOT_SSH_KEY_DIR": str(tmp_path / "keys"),
        "GPUBOT_AGENT_ZIPAPP": str(agent),
    }


def test_a_good_configuration_prints_ok_and_makes_nothing(
    good_env: dict[str, str], local_slack: LocalSlack, tmp_path: Path
) -> None:
    done = run_gpubot("check", env=good_env, fresh=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
    assert [call.token for call in local_slack.calls_to("auth.test")] == [BOT_TOKEN]
    assert not (tmp_path / "data").exists()


def test_a_good_configuration_on_a_migrated_store_prints_ok(
    good_env: dict[str, str], db: Database
) -> None:
    """SQLite, then the PostgreSQL at 127.0.0.1:5432."""
    add_instance(db, ssh_key_name="team")
    env = {**good_env, "GPUBOT_DATABASE_URL": db.url.render_as_string(hide_password=False)}
    done = run_gpubot("check", env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


def test_a_key_that_registered_instances_name_but_is_gone_is_a_problem(
    good_env: dict[str, str], sqlite_db: Database
) -> None:
    add_instance(sqlite_db, ssh_key_name="gone")
    env = {**good_env, "GPUBOT_DATABASE_URL": sqlite_db.url.render_as_string()}
    done = run_gpubot("check", env=env)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"GPUBOT_SSH_KEY_DIR: registered instances use the key 'gone', which is not in "
        f"{good_env['GPUBOT_SSH_KEY_DIR']}. Put the key back or register those instances with "
        "another key."
    ]


def test_a_store_migrated_by_a_newer_gpubot_is_a_problem(
    good_env: dict[str, str], sqlite_db: Database
) -> None:
    with sqlite_db.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = 'f00dfacade99'")
    env = {**good_env, "GPUBOT_DATABASE_URL": sqlite_db.url.render_as_string()}
    done = run_gpubot("check", env=env)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"GPUBOT_DATABASE_URL: the database {sqlite_db.url.render_as_string()} is at schema "
        f"revision f00dfacade99, which gpubot {VERSION} does not know: a newer gpubot migrated "
        "it. Run that version."
    ]


BAD = "postgresql://postgres:hunter2@127.0.0.1:1/gpubot"


@pytest.mark.parametrize(
    ("change", "line"),
    [
        pytest.param(
            lambda tmp: {"SLACK_BOT_TOKEN": "xoxb-wrong"},
            r"SLACK_BOT_TOKEN: Slack at http://127\.0\.0\.1:\d+/api/ refused it: invalid_auth\.",
            id="slack-refuses-auth-test",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_SLACK_API_URL": "http://127.0.0.1:1/api/"},
            r"GPUBOT_SLACK_API_URL: cannot reach Slack at http://127\.0\.0\.1:1/api/: ",
            id="slack-unreachable",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_CHANNEL": "#gpu-ops"},
            r"GPUBOT_CHANNEL: '#gpu-ops' is not a channel ID\. Give the channel's ID",
            id="channel-hash-name",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_CHANNEL": "gpu-ops"},
            r"GPUBOT_CHANNEL: 'gpu-ops' is not a channel ID\.",
            id="channel-name",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_ADMINS": "U0ALICE,@bob"},
            r"GPUBOT_ADMINS: '@bob' is not a Slack user ID\.",
            id="admin-name",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_SSH_KEY_DIR": str(tmp / "no-keys")},
            r"GPUBOT_SSH_KEY_DIR: .*/no-keys is not a directory\.",
            id="missing-key-directory",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_SSH_KEY": str(tmp / "ssh" / "gone")},
            r"GPUBOT_SSH_KEY: cannot read the SSH key .*/ssh/gone: .*No such file",
            id="missing-key",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_AGENT_ZIPAPP": str(tmp / "dist" / "gpu-agent.pyz")},
            r"GPUBOT_AGENT_ZIPAPP: the agent archive .*/dist/gpu-agent\.pyz is missing\. "
            r"Build it with `make agent`",
            id="missing-agent-archive",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_AGENT_ZIPAPP": str(tmp / "ssh" / "default.pub")},
            r"GPUBOT_AGENT_ZIPAPP: .*default\.pub is not an agent archive",
            id="agent-archive-not-a-zip",
        ),
        pytest.param(
            lambda tmp: {"GPUBOT_DATABASE_URL": BAD},
            r"GPUBOT_DATABASE_URL: cannot reach the database "
            r"postgresql\+psycopg://postgres:\*\*\*@127\.0\.0\.1:1/gpubot: ",
            id="database-unreachable",
        ),
        pytest.param(
            lambda tmp: {"SLACK_SIGNING_SECRET": ""},
            r"SLACK_APP_TOKEN: is not set and neither is SLACK_SIGNING_SECRET",
            id="no-mode-can-start",
        ),
    ],
)
def test_each_misconfiguration_is_one_line_and_status_1(
    good_env: dict[str, str],
    tmp_path: Path,
    change: Callable[[Path], dict[str, str]],
    line: str,
) -> None:
    done = run_gpubot("check", env={**good_env, **change(tmp_path)})
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, lines
    assert re.match(line, lines[0]), lines[0]
    assert done.stderr == ""
    assert "hunter2" not in done.stdout


@pytest.mark.parametrize(
    ("where", "line"),
    [
        (
            "api",
            r"GPUBOT_SLACK_API_URL: 'http://127\.0\.0\.1:\d+/api' does not end with a slash",
        ),
        (
            "elsewhere/",
            r"GPUBOT_SLACK_API_URL: http://127\.0\.0\.1:\d+/elsewhere/ does not answer as "
            r"Slack's Web API: auth\.test got HTTP 404",
        ),
        (
            "api/ down",
            r"GPUBOT_SLACK_API_URL: http://127\.0\.0\.1:\d+/api/ does not answer as Slack's "
            r"Web API: auth\.test got HTTP 500 \(internal_error\)",
        ),
    ],
)
def test_an_address_that_is_not_slacks_api_is_said_as_such(
    good_env: dict[str, str], local_slack: LocalSlack, where: str, line: str
) -> None:
    path, _, down = where.partition(" ")
    if down:
        local_slack.outage("auth.test", 500)
    env = {**good_env, "GPUBOT_SLACK_API_URL": local_slack.base_url + path}
    done = run_gpubot("check", env=env)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 1, lines
    assert re.match(line, lines[0]), lines[0]


def test_every_problem_at_once_is_one_line_each(good_env: dict[str, str], tmp_path: Path) -> None:
    env = {
        **good_env,
        "GPUBOT_CHANNEL": "#gpu-ops",
        "SLACK_BOT_TOKEN": "xoxb-wrong",
        "GPUBOT_SSH_KEY": str(tmp_path / "gone"),
        "GPUBOT_SSH_KEY_DIR": str(tmp_path / "no-keys"),
        "GPUBOT_AGENT_ZIPAPP": str(tmp_path / "no-agent.pyz"),
    }
    done = run_gpubot("check", env=env)
    assert done.returncode == 1
    assert [line.split(":", 1)[0] for line in done.stdout.splitlines()] == [
        "GPUBOT_CHANNEL",
        "SLACK_BOT_TOKEN",
        "GPUBOT_SSH_KEY",
        "GPUBOT_SSH_KEY_DIR",
        "GPUBOT_AGENT_ZIPAPP",
    ]


@pytest.mark.parametrize(
    ("command", "var", "value", "message"),
    [
        (
            "check",
            "GPUBOT_DATABASE_URL",
            "mysql://gpubot:hunter2@db/gpubot",
            "gpubot: GPUBOT_DATABASE_URL names a mysql database; gpubot runs on SQLite and "
            "PostgreSQL only.",
        ),
        (
            "migrate",
            "GPUBOT_DATABASE_URL",
            "mysql+pymysql://gpubot:hunter2@db/gpubot",
            "gpubot: GPUBOT_DATABASE_URL names a mysql database",
        ),
        (
            "migrate",
            "GPUBOT_DATABASE_URL",
            "postgresql://gpubot:hunter2@db:port/gpubot",
            "gpubot: GPUBOT_DATABASE_URL='postgresql://gpubot:***@db:port/gpubot' has a port "
            "that is not a number from 1 to 65535.",
        ),
        (
            "check",
            "GPUBOT_DATABASE_URL",
            "gpubot.sqlite3",
            "gpubot: GPUBOT_DATABASE_URL='gpubot.sqlite3' is not a database URL.",
        ),
        (
            "check",
            "GPUBOT_SLACK_API_URL",
            "slack.com/api/",
            "gpubot: GPUBOT_SLACK_API_URL='slack.com/api/' is not an http:// or https:// URL.",
        ),
        (
            "console",
            "GPUBOT_SLACK_API_URL",
            "ftp://slack.com/api/",
            "gpubot: GPUBOT_SLACK_API_URL='ftp://slack.com/api/' is not an http:// or https://",
        ),
        (
            "check",
            "GPUBOT_RUNPOD_API_URL",
            "https://api.runpod.io:http/v2",
            "gpubot: GPUBOT_RUNPOD_API_URL='https://api.runpod.io:http/v2' has a port that is",
        ),
    ],
)
def test_bad_urls_and_unsupported_databases_exit_2_without_a_traceback(
    good_env: dict[str, str], command: str, var: str, value: str, message: str
) -> None:
    done = run_gpubot(command, env={**good_env, var: value})
    assert done.returncode == 2
    assert done.stderr.startswith(message), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "hunter2" not in done.stderr
    assert len(done.stderr.splitlines()) == 2  # what is wrong, then what to do


def test_version_names_the_package_and_python() -> None:
    done = run_gpubot("--version", env={}, fresh=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"gpubot {VERSION} (Python {platform.python_version()})\n"


def test_build_info_is_served_with_the_metrics() -> None:
    text = Metrics().exposition()[0].decode()
    expected = f'gpubot_build_info{{python="{platform.python_version()}",version="{VERSION}"}} 1.0'
    assert expected in text.splitlines()


@pytest.mark.parametrize(
    "url",
    ["sqlite:///var/lib/gpubot.sqlite3", "sqlite://", "postgresql://u@h/d", "postgres://h/d"],
)
def test_sqlite_and_postgresql_urls_are_accepted(url: str) -> None:
    assert Settings.from_env({"GPUBOT_DATABASE_URL": url}).database_url == url


@pytest.mark.parametrize(
    "url", ["mssql+pyodbc://h/d", "oracle://h/d", "://h/d", "postgresql:/h/d", "sqlite"]
)
def test_other_database_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="GPUBOT_DATABASE_URL"):
        Settings.from_env({"GPUBOT_DATABASE_URL": url})


@pytest.mark.parametrize(
    "url", ["https://slack.com/api/", "http://127.0.0.1:8080/api/", "http://[::1]:80/"]
)
def test_http_urls_are_accepted(url: str) -> None:
    assert Settings(slack_api_url=url, vast_api_url=url).vast_api_url == url


@pytest.mark.parametrize(
    "url", ["slack.com", "file:///etc/passwd", "https://", "http://[::1/", "http://h:70000/"]
)
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="GPUBOT_VAST_API_URL"):
        Settings(vast_api_url=url)
