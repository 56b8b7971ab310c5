"""bot.health: readiness fails for a database that fails or hangs, a clock three intervals late
and a Socket Mode connection that is down; the real `gpubot` answers /healthz, /readyz and
/metrics in Socket Mode (on its own port) and in HTTP mode, and the image's health check script
reads them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bot import cli
from bot.app import build_app, build_health, build_ops, build_runtime, start_clock
from bot.errors import ConfigError, StoreError
from bot.health import LATE_TICKS, Health
from bot.http_server import OpsEndpoints, SlackHttpServer, ops_server
from bot.local_slack import LocalSlack
from bot.settings import Settings
from bot.store.db import Database
from bot.store.stats import ping
from tests.bot.test_cli import gpubot
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET
from tests.fixtures.socket_slack import SocketModeSlack

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"
SERVING_OPS = r'"serving metrics and health at (http://127\.0\.0\.1:\d+)'


class Monotonic:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _health(
    clock: Monotonic,
    *,
    database: Callable[[], None] = lambda: None,
    slack: Callable[[], bool] | None = None,
    db_timeout_s: float = 1.0,
) -> Health:
    return Health(
        tick_interval_s=30,
        database=database,
        slack_connected=slack,
        clock=clock,
        db_timeout_s=db_timeout_s,
    )


def _failed(health: Health) -> dict[str, str]:
    return {check.name: check.detail for check in health.ready().checks if not check.ok}


def test_ready_while_the_clock_ticks_and_late_past_three_intervals() -> None:
    clock = Monotonic()
    health = _health(clock)
    assert health.ready().ok  # just started: the first tick has time
    clock.now += LATE_TICKS * 30
    assert health.ready().ok
    clock.now += 1
    assert "no tick has ended yet" in _failed(health)["clock"]
    health.tick_finished()
    assert health.ready().ok
    clock.now += 90.5
    late = health.ready()
    assert not late.ok
    assert "FAIL clock: the last tick ended 90 s ago (more than 90 s" in late.text()
    assert late.text().startswith("ok database: answered in")
    assert health.live().ok  # liveness does not depend on the clock


def test_a_failing_database_is_not_ready() -> None:
    def broken() -> None:
        raise StoreError("the database failed: connection refused")

    failed = _failed(_health(Monotonic(), database=broken))
    assert failed == {"database": "the database failed: connection refused"}


def test_a_hanging_database_holds_the_check_only_its_timeout_and_is_asked_once() -> None:
    release = threading.Event()
    calls: list[float] = []

    def hangs() -> None:
        calls.append(time.monotonic())
        release.wait(10)

    clock = Monotonic()
    health = _health(clock, database=hangs, db_timeout_s=0.2)
    started = time.monotonic()
    assert "no answer for" in _failed(health)["database"]
    assert "no answer for" in _failed(health)["database"]
    assert time.monotonic() - started < 2
    assert len(calls) == 1  # the second check waited for the first probe, it started none
    release.set()
    deadline = time.monotonic() + 5
    while not health.ready().ok and time.monotonic() < deadline:
        time.sleep(0.01)
    assert health.ready().ok
    assert len(calls) >= 2


def test_socket_mode_down_is_not_ready() -> None:
    connected = [True]
    health = _health(Monotonic(), slack=lambda: connected[0])
    assert health.ready().ok
    connected[0] = False
    assert _failed(health) == {"slack": "the Socket Mode connection is down"}


def test_ping_reaches_sqlite_and_postgresql_and_fails_on_a_dead_server(db: Database) -> None:
    ping(db)
    dead = Database("postgresql+psycopg://postgres@127.0.0.1:9/gpubot?connect_timeout=2")
    try:
        with pytest.raises(StoreError):
            ping(dead)
    finally:
        dead.dispose()


# --- the real process ---------------------------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _wait_status(url: str, status: int, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    code, body = _get(url)
    while code != status and time.monotonic() < deadline:
        time.sleep(0.1)
        code, body = _get(url)
    assert code == status, body
    return body


def _healthcheck(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.integration
def test_socket_mode_serves_health_and_metrics_on_its_own_port(tmp_path: Path) -> None:
    slack = SocketModeSlack(token=BOT_TOKEN, app_token="xapp-test").start()
    env = {
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_APP_TOKEN": "xapp-test",
        "GPUBOT_SLACK_API_URL": slack.api_url,
        "GPUBOT_METRICS_PORT": "0",
        "GPUBOT_LOG_FORMAT": "json",
        "GPUBOT_TICK_INTERVAL_S": "1",
    }
    try:
        with gpubot(tmp_path, "socket", env=env) as proc:
            base = proc.wait_for_line(SERVING_OPS)[1]
            line = proc.wait_for_line(r"connected to Slack in Socket Mode")
            record = json.loads(line.string)  # the log is JSON lines
            assert record["level"] == "INFO"
            assert record["message"] == "connected to Slack in Socket Mode"
            assert {"time", "logger", "thread"} <= set(record)

            assert _get(f"{base}/healthz") == (200, "ok")
            ready = _wait_status(f"{base}/readyz", 200)
            assert "ok slack: the Socket Mode connection is up" in ready
            assert "ok clock:" in ready
            done = _healthcheck(f"{base}/readyz")
            assert done.returncode == 0, done.stdout
            assert "ok database:" in done.stdout

            code, metrics = _get(f"{base}/metrics")
            assert code == 200
            assert "gpubot_store_up 1.0" in metrics
            assert 'gpubot_releases{state="pending"} 0.0' in metrics
            assert "gpubot_ticks_total" in metrics
            assert _get(f"{base}/slack/events")[0] == 404  # Slack talks over the socket here

            slack.stop()  # Slack goes away: the bot is no longer ready
            down = _wait_status(f"{base}/readyz", 503)
            assert "FAIL slack: the Socket Mode connection is down" in down
            failed = _healthcheck(f"{base}/readyz")
            assert failed.returncode == 1
            assert "FAIL slack" in failed.stdout
            assert proc.terminate() == 0
    finally:
        slack.stop()
    assert _healthcheck(f"{base}/readyz").returncode == 1  # nobody answers any more


@pytest.mark.integration
def test_http_mode_serves_readiness_and_metrics_beside_slack(
    sqlite_db: Database, tmp_path: Path, local_slack: LocalSlack
) -> None:
    # As `gpubot serve --http` wires it (bot.cli._serve), in this process.
    settings = Settings(
        slack_bot_token=BOT_TOKEN,
        slack_signing_secret=SIGNING_SECRET,
        slack_api_url=local_slack.api_url,
        data_dir=tmp_path / "data",
        tick_interval_s=1,
    )
    rt = build_runtime(settings, db=sqlite_db)
    health = build_health(rt)
    server = SlackHttpServer(build_app(settings, runtime=rt), port=0).start()
    ops = ops_server(build_ops(rt, health), host="127.0.0.1", port=0).start()
    clock = start_clock(rt, health=health)
    try:
        assert _get(f"{server.base_url}/readyz")[0] == 404  # not on the Slack port
        base = ops.base_url
        ready = _wait_status(f"{base}/readyz", 200)
        assert "slack" not in ready  # HTTP mode has no connection to keep
        deadline = time.monotonic() + 30
        while "ok clock: the last tick ended" not in ready:
            assert time.monotonic() < deadline, ready
            time.sleep(0.1)
            ready = _wait_status(f"{base}/readyz", 200)
        code, metrics = _get(f"{base}/metrics")
        assert code == 200
        assert "gpubot_tick_duration_seconds_count" in metrics
        assert "gpubot_store_up 1.0" in metrics
        assert _healthcheck(f"{base}/readyz").returncode == 0
        clock.shutdown()  # the clock stops: three intervals later the bot is not ready
        late = _wait_status(f"{base}/readyz", 503, timeout_s=10)
        assert "FAIL clock: the last tick ended" in late
    finally:
        clock.shutdown()
        ops.shutdown()
        server.shutdown()
        rt.executor.shutdown(wait=True)
        if rt.platform_work is not None:
            rt.platform_work.shutdown(wait=True)
        rt.fleet.close()


def test_the_health_check_script_refuses_what_is_no_http_url() -> None:
    done = _healthcheck("file:///etc/passwd")
    assert done.returncode == 2
    assert "not an http://" in done.stdout


def test_a_metrics_port_in_use_is_a_setting_error_naming_it(tmp_path: Path) -> None:
    """main() turns this ConfigError into exit status 2 (tests/bot/test_cli.py)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(data_dir=tmp_path, metrics_port=port)
        health = Health(tick_interval_s=30, database=lambda: None)
        with pytest.raises(ConfigError) as refused:
            cli._ops_server(settings, OpsEndpoints(health=health))
    assert refused.value.message.startswith(f"Cannot serve metrics and health on 127.0.0.1:{port}")
    assert refused.value.hint.startswith("Set GPUBOT_METRICS_PORT to a free port")


def test_a_missing_cjk_font_is_told_in_readiness_and_the_log_when_chinese_is_in_use(
    sqlite_db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from bot import charts
    from tests.bot.services.support import Clock, make_runtime

    missing = "no CJK font found (none of Noto Sans CJK SC): Chinese draws as empty boxes"
    monkeypatch.setattr(charts, "cjk_font_missing", lambda: missing)
    english = build_health(make_runtime(sqlite_db, Clock()))
    assert "fonts" not in english.ready().text()  # nobody reads Chinese: nothing to say
    with caplog.at_level("WARNING"):
        health = build_health(make_runtime(sqlite_db, Clock(), language="zh"))
    assert f"Chinese is in use, but {missing}" in caplog.text
    verdict = health.ready()
    assert f"ok fonts: {missing}\n" in verdict.text()
    assert verdict.ok  # said, never failed: the bot works, its Chinese charts do not read
    monkeypatch.setattr(charts, "cjk_font_missing", lambda: None)
    assert "ok fonts: a CJK font for the charts is found" in health.ready().text()
