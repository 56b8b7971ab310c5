"""The instance ``local``: the agent run on this machine through subprocesses, no SSH."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents.protocol import StatusSnapshot
from bot.errors import AgentMissing, CommandTimeout, FleetError
from bot.fleet.base import Target
from bot.fleet.fleet import Fleet
from bot.fleet.local import LocalTransport
from bot.settings import Settings


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def local_fleet(fleet_settings: Settings, agent_zipapp: Path, home: Path) -> Iterator[Fleet]:
    fleet = Fleet(
        fleet_settings, zipapp_path=agent_zipapp, local_transport=LocalTransport(home=home)
    )
    try:
        yield fleet
    finally:
        fleet.close()


def _local_target(tmp_path: Path) -> Target:
    return Target(name="local", host="local", agent_home=str(tmp_path / "agent-home"))


def test_argv_arrives_exactly_without_a_shell(home: Path) -> None:
    argv = ["it's", 'say "hi"', "$HOME", "`id`", "a;b|c", "*", "", "new\nline", "ünï ✓"]
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"

    result = LocalTransport(home=home).exec([sys.executable, "-c", code, *argv], timeout_s=20)

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == argv


def test_commands_run_in_the_home_directory_with_stdin(home: Path) -> None:
    result = LocalTransport(home=home).exec(
        ["sh", "-c", "pwd; cat; echo err >&2; exit 4"], timeout_s=20, stdin=b"in\n"
    )

    assert (result.exit_code, result.stdout, result.stderr) == (4, f"{home}\nin\n", "err\n")


def test_missing_program_reads_like_a_shell(home: Path) -> None:
    result = LocalTransport(home=home).exec(["/nonexistent/python3", "-V"], timeout_s=20)

    assert result.exit_code == 127
    assert "/nonexistent/python3" in result.stderr


def test_timeout_kills_the_command(home: Path) -> None:
    with pytest.raises(CommandTimeout):
        LocalTransport(home=home).exec(["sh", "-c", "sleep 0.5; touch late"], timeout_s=0.2)
    assert not (home / "late").exists()


def test_put_file_copies_atomically_with_mode(home: Path, tmp_path: Path) -> None:
    source = tmp_path / "payload"
    source.write_bytes(b"x" * 1000)

    LocalTransport(home=home).put_file(str(source), ".gpubot/sub/payload", mode=0o640)

    dest = home / ".gpubot" / "sub" / "payload"
    assert dest.read_bytes() == source.read_bytes()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    assert [p.name for p in dest.parent.iterdir()] == ["payload"]  # no temporary left behind


def test_put_file_failure_is_a_fleet_error(home: Path, tmp_path: Path) -> None:
    source = tmp_path / "payload"
    source.write_bytes(b"x")
    (home / "blocker").write_text("a file, not a directory")

    with pytest.raises(FleetError, match="could not copy"):
        LocalTransport(home=home).put_file(str(source), "blocker/payload")


def test_local_agent_bootstraps_and_reports(local_fleet: Fleet, home: Path, tmp_path: Path) -> None:
    target = _local_target(tmp_path)
    agent = local_fleet.agent(target)

    version = agent.ensure_agent()
    status = agent.status()
    again = local_fleet.agent(target)
    again.status()

    assert agent.python == sys.executable
    assert (agent.uploads, again.uploads) == (1, 0)
    assert isinstance(status, StatusSnapshot)
    assert status.host.agent_version == version
    assert status.host.hostname == os.uname().nodename
    assert status.nvml_error is not None
    assert status.nvml_error.code == "library_not_found"
    installed = Path(target.agent_home or "") / ".gpubot" / Path(agent.remote_path).name
    assert installed.exists()


def test_local_agent_with_missing_python_is_agent_missing(
    local_fleet: Fleet, tmp_path: Path
) -> None:
    target = Target(name="local", host="local", python_path="/nonexistent/python3")

    with pytest.raises(AgentMissing):
        local_fleet.agent(target).status()


def test_local_fan_out(local_fleet: Fleet, tmp_path: Path) -> None:
    results = local_fleet.fan_out(
        [_local_target(tmp_path)], lambda a: a.status().host.agent_version, timeout_s=30
    )

    assert isinstance(results["local"], str)
    assert results["local"]
