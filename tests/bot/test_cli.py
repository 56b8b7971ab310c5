"""`gpubot`: modes, clear errors for missing settings, and the real processes in HTTP and Socket
Mode against the local Slack stand-in."""

from __future__ import annotations

import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bot.cli import PRIVATE_UMASK, main
from bot.local_slack import LocalSlack
from bot.slack_requests import signed_headers, slash_command_body, slash_command_payload
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET
from tests.fixtures.socket_slack import SocketModeSlack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    """main() sets the process's umask; give the test process its own back afterwards."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for key in list(os.environ):
        if key.startswith(("SLACK_", "GPUBOT_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GPUBOT_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["serve"], {}, "`gpubot serve` needs --http."),
        (["serve", "--http"], {}, "SLACK_BOT_TOKEN is not set."),
        (["serve", "--http"], {"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_SIGNING_SECRET is not set."),
        (["socket"], {}, "SLACK_BOT_TOKEN is not set."),
        (["socket"], {"SLACK_BOT_TOKEN": "xoxb-1"}, "SLACK_APP_TOKEN is not set."),
        (["console"], {"GPUBOT_TIMEZONE": "Mars/Olympus"}, "is not a known time zone"),
        (
            ["migrate"],
            {"GPUBOT_IDLE_WINDOW_S": "soon"},
            "GPUBOT_IDLE_WINDOW_S='soon' is not a number",
        ),
        (
            ["migrate"],
            {"GPUBOT_DATABASE_URL": "mysql://gpubot@db/gpubot"},
            "GPUBOT_DATABASE_URL names a mysql database",
        ),
        (
            ["console"],
            {"GPUBOT_SLACK_API_URL": "slack.com/api/"},
            "GPUBOT_SLACK_API_URL='slack.com/api/' is not an http:// or https:// URL.",
        ),
        (
            ["check"],
            {"GPUBOT_AWS_ENDPOINT_URL": "localhost:4566"},
            "GPUBOT_AWS_ENDPOINT_URL='localhost:4566' is not an http:// or https:// URL.",
        ),
    ],
)
def test_missing_or_bad_settings_exit_2_with_a_message(
    clean_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    message: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpubot: ")
    assert message in err
    assert not (clean_env / "gpubot.sqlite3").exists()


def test_version_exits_0_and_check_makes_no_data_directory(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(
        r"gpubot \d+\.\d+\.\d+\S* \(Python \d+\.\d+\.\d+\)\n", capsys.readouterr().out
    )
    main(["check"])
    assert not clean_env.exists()


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["launch"])
    assert exit_.value.code == 2
    assert "invalid choice: 'launch'" in capsys.readouterr().err


# --- real processes -----------------------------------------------------------------------------


@contextmanager
def gpubot(tmp_path: Path, *args: str, env: dict[str, str], umask: int = -1) -> Iterator[_Process]:
    """Run `python -m bot.cli ARGS` with a clean environment plus ``env`` (and ``umask`` when
    given); killed at the end if still running. The metrics port is a free one unless ``env``
    names one (tests run side by side)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    full.update({"GPUBOT_DATA_DIR": str(tmp_path / "data"), "GPUBOT_METRICS_PORT": "0", **env})
    child = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", *args],
        cwd=ROOT,
        env=full,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        umask=umask,
    )
    process = _Process(child)
    try:
        yield process
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


class _Process:
    """A child whose output is read line by line in the background."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.child = child
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def wait_for_line(self, pattern: str, timeout_s: float = 120.0) -> re.Match[str]:
        """The first output line matching ``pattern`` (fails the test after the timeout)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout_s)
            except queue.Empty:
                pytest.fail(f"no line matching {pattern!r}; output so far:\n{''.join(self.seen)}")
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def terminate(self) -> int:
        """SIGTERM; the exit status."""
        self.child.send_signal(signal.SIGTERM)
        return self.child.wait(timeout=60)

    def _pump(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self.lines.put(line)


@pytest.mark.integration
def test_http_mode_serves_signed_requests_and_stops_on_sigterm(
    tmp_path: Path, local_slack: LocalSlack
) -> None:
    env = {
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "GPUBOT_SLACK_API_URL": local_slack.api_url,
        "GPUBOT_METRICS_PORT": "0",
    }
    with gpubot(tmp_path, "serve", "--http", "--port", "0", env=env) as proc:
        ops = proc.wait_for_line(r"serving metrics and health at (http://127\.0\.0\.1:\d+)")[1]
        url = proc.wait_for_line(
            r"serving Slack requests at (http://127\.0\.0\.1:\d+/slack/events)"
        )[1]
        # Probes answer on their own listener, not on the Slack port.
        with urllib.request.urlopen(f"{ops}/healthz", timeout=10) as response:
            assert response.read() == b"ok"
        body = slash_command_body(
            text="help",
            user_id="U0ALICE",
            user_name="alice",
            channel_id="C0GENERAL",
            response_url=local_slack.response_url("C0GENERAL", "U0ALICE"),
        )
        request = urllib.request.Request(
            url, data=body.encode(), headers=signed_headers(body, SIGNING_SECRET)
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        assert local_slack.wait_for(lambda s: len(s.responses) == 1, 30)
        assert "/gpu status" in local_slack.responses[0].payload["text"]
        bad = urllib.request.Request(
            url, data=body.encode(), headers=signed_headers(body, "wrong-secret")
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(bad, timeout=10)
        assert refused.value.code == 401
        assert proc.terminate() == 0
    assert len(local_slack.responses) == 1


@pytest.mark.integration
def test_with_both_tokens_gpubot_speaks_socket_mode(tmp_path: Path) -> None:
    with SocketModeSlack(token=BOT_TOKEN, app_token="xapp-test") as slack:
        env = {
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_APP_TOKEN": "xapp-test",
            "GPUBOT_SLACK_API_URL": slack.api_url,
        }
        with gpubot(tmp_path, env=env) as proc:
            proc.wait_for_line(r"connected to Slack in Socket Mode")
            assert slack.wait_for(lambda s: s.socket_connections == 1, 30)
            envelope = slack.send_envelope(
                "slash_commands",
                slash_command_payload(
                    text="help",
                    user_id="U0ALICE",
                    user_name="alice",
                    channel_id="C0GENERAL",
                    response_url=slack.response_url("C0GENERAL", "U0ALICE"),
                ),
            )
            assert slack.wait_for(
                lambda s: any(m.get("envelope_id") == envelope for m in s.socket_messages), 30
            )
            assert slack.wait_for(lambda s: len(s.responses) == 1, 30)
            assert "/gpu status" in slack.responses[0].payload["text"]
            assert proc.terminate() == 0
        tokens = {call.method: call.token for call in slack.calls}
        assert tokens["auth.test"] == BOT_TOKEN
        assert tokens["apps.connections.open"] == "xapp-test"


@pytest.mark.integration
def test_a_wrong_app_token_is_refused_by_slack(tmp_path: Path) -> None:
    with SocketModeSlack(token=BOT_TOKEN, app_token="xapp-test") as slack:
        env = {
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_APP_TOKEN": "xapp-wrong",
            "GPUBOT_SLACK_API_URL": slack.api_url,
        }
        with gpubot(tmp_path, "socket", env=env) as proc:
            proc.wait_for_line(r"^gpubot: Slack refused SLACK_APP_TOKEN: invalid_auth\.")
            assert proc.child.wait(timeout=60) == 2
        assert slack.socket_connections == 0


@pytest.mark.integration
def test_a_wrong_bot_token_stops_http_mode_at_once(tmp_path: Path) -> None:
    with LocalSlack(token=BOT_TOKEN) as slack:
        env = {
            "SLACK_BOT_TOKEN": "xoxb-wrong",
            "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "GPUBOT_SLACK_API_URL": slack.api_url,
        }
        with gpubot(tmp_path, "serve", "--http", "--port", "0", env=env) as proc:
            proc.wait_for_line(r"^gpubot: Slack refused SLACK_BOT_TOKEN: invalid_auth\.")
            assert proc.child.wait(timeout=60) == 2
        assert [call.method for call in slack.calls] == ["auth.test"]


@pytest.mark.integration
def test_migrate_creates_the_store(tmp_path: Path) -> None:
    with gpubot(tmp_path, "migrate", env={}) as proc:
        proc.wait_for_line(r"gpubot: the database is at revision \w+")
        assert proc.child.wait(timeout=60) == 0
    assert (tmp_path / "data" / "gpubot.sqlite3").is_file()


@pytest.mark.integration
def test_the_data_directory_and_the_store_are_private(tmp_path: Path) -> None:
    data = tmp_path / "state" / "gpubot"
    # A permissive umask handed down by the shell: gpubot sets its own.
    with gpubot(tmp_path, "migrate", env={"GPUBOT_DATA_DIR": str(data)}, umask=0o022) as proc:
        proc.wait_for_line(r"gpubot: the database is at revision \w+")
        assert proc.child.wait(timeout=60) == 0
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = sorted(data.iterdir())
    assert data / "gpubot.sqlite3" in files
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in files} == {
        path.name: 0o600 for path in files
    }


def test_main_sets_the_private_umask_before_anything_else(clean_env: Path) -> None:
    os.umask(0o022)
    assert main(["serve"]) == 2  # refused after the umask and the data directory
    assert os.umask(0o022) == PRIVATE_UMASK
    assert stat.S_IMODE(clean_env.stat().st_mode) == 0o700


def test_a_data_directory_that_cannot_be_made_exits_2(
    clean_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GPUBOT_DATA_DIR", str(blocker / "data"))
    assert main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert f"gpubot: Cannot create the data directory {blocker / 'data'}" in err
    assert "Set GPUBOT_DATA_DIR to a directory this user may create and write." in err
