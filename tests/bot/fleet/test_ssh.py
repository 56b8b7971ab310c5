"""The fleet over a real OpenSSH server on loopback: pinning, bootstrap, agent calls, failures."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agents.protocol import FINAL_JOB_STATES, HealthReport, JobRecord, StatusSnapshot
from bot.errors import (
    AgentBroken,
    AgentMissing,
    AuthenticationFailed,
    CommandTimeout,
    HostKeyChanged,
    HostKeyNotPinned,
    Unreachable,
)
from bot.fleet import ssh as ssh_module
from bot.fleet.agent_client import RemoteAgent
from bot.fleet.base import AgentClient
from bot.fleet.fleet import Fleet
from bot.fleet.hostkeys import host_key_from_line
from bot.fleet.ssh import IDLE_WAKE_S, SshTransport, dial, load_private_key
from bot.settings import Settings
from tests.fixtures.sshd import SshServer, make_client_key, start_sshd

pytestmark = pytest.mark.integration


def _sessions(server: SshServer) -> int:
    return server.log_path.read_text(errors="replace").count("Starting session:")


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def other_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A second, independent sshd (a healthy neighbour instance)."""
    server = start_sshd(tmp_path_factory.mktemp("sshd-other"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never says anything (a hung host)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- register: scan, pin, bootstrap, status, health -----------------------------------------


def test_scan_host_key_matches_ssh_keygen_fingerprint(fleet: Fleet, sshd: SshServer) -> None:
    scanned = fleet.scan_host_key(sshd.host, sshd.port)

    pub = sshd.directory / "ssh_host_key.pub"
    keygen = subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True)
    assert keygen.returncode == 0, keygen.stderr
    assert scanned.fingerprint == keygen.stdout.split()[1]
    assert scanned.key_type == "ssh-ed25519"
    assert scanned == sshd.host_key
    assert sshd.accepted_logins() == 0  # scanning never logs in


def test_register_flow_pins_bootstraps_and_reports(fleet: Fleet, sshd: SshServer) -> None:
    pinned = fleet.scan_host_key(sshd.host, sshd.port)
    target = sshd.target("gpu-a", host_key=pinned)
    agent = fleet.agent(target)

    version = agent.ensure_agent()
    status = agent.status()
    health = agent.health(expect_gpu="h100", expect_count=1)

    assert version == status.host.agent_version
    assert agent.uploads == 1
    assert sshd.sftp_sessions() == 1
    installed = Path(target.agent_home or "") / ".gpubot" / Path(agent.remote_path).name
    assert installed.read_bytes() == fleet.zipapp_path.read_bytes()
    assert isinstance(status, StatusSnapshot)
    # No NVIDIA driver here: the agent's real answer is "library not found", not a failure.
    assert status.nvml_error is not None
    assert status.nvml_error.code == "library_not_found"
    assert status.driver is None
    assert status.gpus == ()
    assert isinstance(health, HealthReport)
    assert health.status == "fail"  # expected an H100, found no driver: a report, not an error
    assert any(check.status == "fail" for check in health.checks)


def test_second_call_reuses_connection_and_does_not_upload(fleet: Fleet, sshd: SshServer) -> None:
    target = sshd.target("gpu-a")
    fleet.agent(target).ensure_agent()
    logins, uploads = sshd.accepted_logins(), sshd.sftp_sessions()

    again = fleet.agent(target)
    again.status()
    again.ensure_agent()

    assert again.uploads == 0
    assert sshd.accepted_logins() == logins == 1
    assert sshd.sftp_sessions() == uploads == 1
    transport = fleet.transport(target)
    assert isinstance(transport, SshTransport)
    assert transport.dial_count == 1


def test_vanished_agent_is_uploaded_again_and_the_call_retried(
    fleet: Fleet, sshd: SshServer
) -> None:
    target = sshd.target("gpu-a")
    agent = fleet.agent(target)
    agent.ensure_agent()
    installed = Path(target.agent_home or "") / ".gpubot" / Path(agent.remote_path).name
    installed.unlink()

    status = agent.status()

    assert status.host.agent_version
    assert agent.uploads == 2
    assert installed.exists()


def test_another_agent_build_is_uploaded_beside_the_old(
    fleet_settings: Settings, sshd: SshServer, agent_zipapp: Path, tmp_path: Path
) -> None:
    target = sshd.target("gpu-a")
    newer = tmp_path / "gpu-agent-newer.pyz"
    newer.write_bytes(agent_zipapp.read_bytes() + b"\0")  # trailing bytes: still a valid zip
    old_fleet = Fleet(fleet_settings, zipapp_path=agent_zipapp)
    new_fleet = Fleet(fleet_settings, zipapp_path=newer)
    try:
        old = old_fleet.agent(target)
        old.ensure_agent()
        new = new_fleet.agent(target)
        new.ensure_agent()
        assert new.remote_path != old.remote_path
        assert (old.uploads, new.uploads) == (1, 1)
        home = Path(target.agent_home or "") / ".gpubot"
        assert sorted(p.name for p in home.glob("gpu-agent-*.pyz")) == sorted(
            [Path(old.remote_path).name, Path(new.remote_path).name]
        )
    finally:
        old_fleet.close()
        new_fleet.close()


def test_remote_agent_is_an_agent_client(fleet: Fleet, sshd: SshServer) -> None:
    client: AgentClient = fleet.agent(sshd.target("gpu-a"))
    assert isinstance(client, RemoteAgent)
    assert client.ensure_agent() == client.status().host.agent_version


# --- refusals ---------------------------------------------------------------------------------


def test_changed_host_key_is_refused_before_anything_runs(fleet: Fleet, sshd: SshServer) -> None:
    target = sshd.target("gpu-a")
    fleet.agent(target).ensure_agent()
    pinned = target.host_key
    assert pinned is not None
    presented = sshd.restart_with_new_host_key()
    logins, sessions = sshd.accepted_logins(), _sessions(sshd)

    with pytest.raises(HostKeyChanged) as caught:
        fleet.agent(target).status()

    assert caught.value.instance == "gpu-a"
    assert caught.value.expected_fingerprint == pinned.fingerprint
    assert caught.value.presented_fingerprint == presented.fingerprint
    assert presented.fingerprint in str(caught.value)
    assert (sshd.accepted_logins(), _sessions(sshd)) == (logins, sessions)
    # Re-registering pins the new key and works again.
    repinned = replace(target, host_key=fleet.scan_host_key(sshd.host, sshd.port))
    assert fleet.agent(repinned).ensure_agent()


def test_unpinned_target_is_refused(fleet: Fleet, sshd: SshServer) -> None:
    target = replace(sshd.target("gpu-a"), host_key=None)

    with pytest.raises(HostKeyNotPinned):
        fleet.agent(target).status()
    assert sshd.accepted_logins() == 0


def test_wrong_user_key_is_refused(fleet: Fleet, sshd: SshServer, tmp_path: Path) -> None:
    stranger = make_client_key(tmp_path)
    target = sshd.target("gpu-a", key_path=stranger)

    with pytest.raises(AuthenticationFailed) as caught:
        fleet.agent(target).status()

    assert caught.value.instance == "gpu-a"
    assert "authorized_keys" in caught.value.hint
    assert sshd.accepted_logins() == 0
    assert _sessions(sshd) == 0


def test_unreadable_key_file_is_an_authentication_failure(
    fleet: Fleet, sshd: SshServer, tmp_path: Path
) -> None:
    junk = tmp_path / "not-a-key"
    junk.write_text("hello\n")

    with pytest.raises(AuthenticationFailed, match="cannot read the SSH key"):
        fleet.agent(sshd.target("gpu-a", key_path=junk)).status()


def test_closed_port_is_unreachable_at_once(fleet: Fleet, sshd: SshServer) -> None:
    target = replace(sshd.target("gpu-a"), port=_closed_port())
    started = time.monotonic()

    with pytest.raises(Unreachable, match="connection refused"):
        fleet.agent(target).status()

    assert time.monotonic() - started < 1.0


def test_unknown_host_name_says_to_check_the_name(fleet: Fleet, sshd: SshServer) -> None:
    target = replace(sshd.target("gpu-a"), host="no-such-host.invalid")

    with pytest.raises(Unreachable, match="cannot resolve") as caught:
        fleet.agent(target).status()

    assert "host name" in caught.value.hint


def test_silent_host_times_out_as_unreachable(
    fleet_settings: Settings, agent_zipapp: Path, sshd: SshServer, silent_port: int
) -> None:
    settings = fleet_settings.with_(ssh_connect_timeout_s=0.5)
    target = replace(sshd.target("gpu-a"), port=silent_port)
    fleet = Fleet(settings, zipapp_path=agent_zipapp)
    started = time.monotonic()
    try:
        with pytest.raises(Unreachable):
            fleet.agent(target).status()
    finally:
        fleet.close()
    assert time.monotonic() - started < 2.0


def test_missing_python_is_agent_missing(fleet: Fleet, sshd: SshServer) -> None:
    target = sshd.target("gpu-a", python_path="/nonexistent/python3")

    with pytest.raises(AgentMissing) as caught:
        fleet.agent(target).status()
    assert "/nonexistent/python3" in str(caught.value)


def test_garbage_output_is_agent_broken_with_stderr(
    fleet: Fleet, sshd: SshServer, tmp_path: Path
) -> None:
    fake_python = _script(tmp_path / "python", "echo 'not json'\necho 'boom: bad things' >&2\n")
    target = sshd.target("gpu-a", python_path=fake_python)

    with pytest.raises(AgentBroken) as caught:
        fleet.agent(target).status()
    assert "boom: bad things" in str(caught.value)


def test_agent_failure_exit_is_agent_broken(fleet: Fleet, sshd: SshServer, tmp_path: Path) -> None:
    failing = _script(tmp_path / "python", "echo 'gpu-agent: error: disk full' >&2\nexit 1\n")

    with pytest.raises(AgentBroken, match="exit code 1") as caught:
        fleet.agent(sshd.target("gpu-a", python_path=failing)).status()
    assert "disk full" in str(caught.value)


# --- commands ---------------------------------------------------------------------------------


def test_argv_with_metacharacters_arrives_exactly(fleet: Fleet, sshd: SshServer) -> None:
    argv = [
        "it's",
        'say "hi"',
        "a b  c",
        "$HOME",
        "`id`",
        "$(touch /tmp/should-not-exist)",
        "x; rm -rf /",
        "a|b&c>d<e",
        "*",
        "~",
        "",
        "tab\there",
        "new\nline",
        "ünïcødé ✓",
        "\\back\\slash",
    ]
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    transport = fleet.transport(sshd.target("gpu-a"))

    result = transport.exec(["python3", "-c", code, *argv], timeout_s=20)

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == argv
    assert not Path("/tmp/should-not-exist").exists()


def test_stdin_exit_code_and_stderr_come_back(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))

    result = transport.exec(
        ["sh", "-c", "tr a-z A-Z; echo warn >&2; exit 3"], timeout_s=20, stdin=b"hello\n"
    )

    assert (result.exit_code, result.stdout, result.stderr) == (3, "HELLO\n", "warn\n")


def test_large_output_on_both_streams(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))
    code = "import sys; sys.stdout.write('o' * 3_000_000); sys.stderr.write('e' * 1_000_000)"

    result = transport.exec(["python3", "-c", code], timeout_s=30)

    assert (len(result.stdout), len(result.stderr)) == (3_000_000, 1_000_000)


def test_output_after_the_exit_status_is_read_and_a_held_stream_waits_only_a_grace(
    fleet: Fleet, sshd: SshServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))
    # A child that outlives the command keeps its output open: sshd sends the exit status but
    # no end of output, so the rest is awaited for the grace only, not up to the timeout.
    monkeypatch.setattr(ssh_module, "EOF_GRACE_S", 0.5)
    started = time.monotonic()
    result = transport.exec(["sh", "-c", "echo first; (sleep 30; echo late) &"], timeout_s=20)
    assert (result.exit_code, result.stdout) == (0, "first\n")
    assert time.monotonic() - started < 5


def test_slow_command_times_out(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))
    started = time.monotonic()

    with pytest.raises(CommandTimeout):
        transport.exec(["sleep", "5"], timeout_s=0.5)

    assert time.monotonic() - started < 2.0
    # The connection stays usable.
    assert transport.exec(["true"], timeout_s=20).exit_code == 0


def test_many_concurrent_commands_share_one_connection(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))
    results: list[str] = []

    def one(i: int) -> None:
        results.append(transport.exec(["echo", str(i)], timeout_s=30).stdout.strip())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(results, key=int) == [str(i) for i in range(20)]
    assert sshd.accepted_logins() == 1


def test_connection_sends_small_packets_at_once_and_idles_quietly(sshd: SshServer) -> None:
    conn = dial(sshd.target("gpu-a"), timeout_s=5, key=load_private_key(sshd.client_key_path))
    try:
        sock = conn.sock
        assert isinstance(sock, socket.socket)
        # A command is a few small packets each way; Nagle's algorithm would hold each one back
        # until the previous was acknowledged (a delayed ACK, tens of ms, per command).
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        # The reader thread of an idle pooled connection wakes once a second, not ten times.
        assert sock.gettimeout() == IDLE_WAKE_S >= 1.0
        chan = conn.open_session(timeout=5)
        chan.exec_command("echo hi")
        assert chan.makefile("rb").read() == b"hi\n"
        assert chan.recv_exit_status() == 0
    finally:
        conn.close()


def test_forget_drops_the_pooled_connection(fleet: Fleet, sshd: SshServer) -> None:
    target = sshd.target("gpu-a")
    fleet.agent(target).ensure_agent()

    fleet.forget("gpu-a")
    fleet.agent(target).ensure_agent()

    assert sshd.accepted_logins() == 2


def test_dead_pooled_connection_is_redialled(fleet: Fleet, sshd: SshServer) -> None:
    target = sshd.target("gpu-a")
    fleet.agent(target).ensure_agent()
    sshd.kill()
    sshd.restart()

    assert fleet.agent(target).ensure_agent()
    assert sshd.accepted_logins() == 2


# --- a server dying mid-call; fan-out -----------------------------------------------------------


def test_sshd_killed_mid_call_is_a_typed_error_and_others_still_answer(
    fleet: Fleet, sshd: SshServer, other_sshd: SshServer, tmp_path: Path
) -> None:
    slow_python = _script(tmp_path / "slow-python", 'sleep 10\nexec python3 "$@"\n')
    doomed = sshd.target("doomed", python_path=slow_python)
    healthy = [other_sshd.target(f"ok-{i}") for i in range(3)]
    for target in healthy:
        fleet.agent(target).ensure_agent()
    fleet.agent(doomed).transport.exec(["true"], timeout_s=20)  # connected before the kill
    killer = threading.Timer(1.0, sshd.kill)
    started = time.monotonic()
    killer.start()
    try:
        results = fleet.fan_out([doomed, *healthy], lambda agent: agent.status(), timeout_s=20)
    finally:
        killer.join()
    elapsed = time.monotonic() - started

    assert isinstance(results["doomed"], Unreachable)
    assert not isinstance(results["doomed"], CommandTimeout)
    assert "dropped" in str(results["doomed"]) or "failed" in str(results["doomed"])
    for target in healthy:
        assert isinstance(results[target.name], StatusSnapshot), results[target.name]
    assert elapsed < 8.0  # nobody waited for the slow command's end (10 s)


def test_fan_out_bounds_a_hung_host_by_the_timeout(
    fleet: Fleet, sshd: SshServer, silent_port: int
) -> None:
    hung = replace(sshd.target("hung"), port=silent_port)
    refused = replace(sshd.target("refused"), port=_closed_port())
    healthy = sshd.target("ok")
    fleet.agent(healthy).ensure_agent()
    started = time.monotonic()

    results = fleet.fan_out([hung, refused, healthy], lambda a: a.status(), timeout_s=5.0)

    elapsed = time.monotonic() - started
    assert list(results) == ["hung", "refused", "ok"]
    assert isinstance(results["hung"], Unreachable)
    assert isinstance(results["refused"], Unreachable)
    assert isinstance(results["ok"], StatusSnapshot), results["ok"]
    assert elapsed < 6.5  # bounded by the connect timeout (3 s) within the 5 s fan-out timeout


def test_fan_out_turns_unexpected_errors_into_agent_broken(fleet: Fleet, sshd: SshServer) -> None:
    def explode(agent: RemoteAgent) -> str:
        if agent.target.name == "bad":
            raise ValueError("bug in caller")
        return agent.ensure_agent()

    results = fleet.fan_out([sshd.target("bad"), sshd.target("good")], explode, timeout_s=20)

    assert isinstance(results["bad"], AgentBroken)
    assert isinstance(results["good"], str)


def test_fan_out_results_are_by_target_name(fleet: Fleet, sshd: SshServer) -> None:
    targets = [sshd.target(f"gpu-{i}") for i in range(5)]

    results = fleet.fan_out(targets, lambda a: a.status().host.agent_version, timeout_s=30)

    assert list(results) == [t.name for t in targets]
    assert all(isinstance(v, str) and v for v in results.values()), results
    assert sshd.accepted_logins() == 5


def test_errors_name_the_instance(fleet: Fleet, sshd: SshServer) -> None:
    target = replace(sshd.target("nowhere"), port=_closed_port())

    results = fleet.fan_out([target], lambda a: a.status(), timeout_s=5)

    error = results["nowhere"]
    assert isinstance(error, Unreachable)
    assert error.instance == "nowhere"
    assert "SSH port" in error.user_text()


# --- the job commands over SSH ------------------------------------------------------------------


def _wait_final(agent: RemoteAgent, job_id: str, timeout_s: float = 20.0) -> JobRecord:
    deadline = time.monotonic() + timeout_s
    while True:
        job = next(j for j in agent.jobs().jobs if j.id == job_id)
        if job.state in FINAL_JOB_STATES or time.monotonic() > deadline:
            return job
        time.sleep(0.2)


def test_job_command_arrives_exactly_and_its_log_comes_back(fleet: Fleet, sshd: SshServer) -> None:
    weird = ["it's", 'say "hi"', "$HOME", "`id`", "a;b|c&d", "*", "", "ünï ✓"]
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    agent = fleet.agent(sshd.target("gpu-a"))

    queued = agent.run(["python3", "-c", code, *weird], name="argv-check", env={"GREETING": "a b"})
    done = _wait_final(agent, queued.id)
    log_text = agent.logs(queued.id)

    assert queued.command == ("python3", "-c", code, *weird)
    assert queued.name == "argv-check"
    assert done.state == "succeeded", done
    assert done.exit_code == 0
    assert json.dumps(weird) in log_text


def test_agent_failure_reaches_the_caller_with_its_explanation(
    fleet: Fleet, sshd: SshServer
) -> None:
    # `who` needs NVML; with no driver here the agent fails and says why.
    with pytest.raises(AgentBroken, match="exit code 1") as caught:
        fleet.agent(sshd.target("gpu-a")).who()
    assert "NVML" in str(caught.value)


def test_cancel_a_running_job(fleet: Fleet, sshd: SshServer) -> None:
    agent = fleet.agent(sshd.target("gpu-a"))
    queued = agent.run(["sleep", "30"])

    cancelled = agent.cancel(queued.id)
    done = _wait_final(agent, queued.id)

    assert cancelled.id == queued.id
    assert done.state == "cancelled"
    assert [j.id for j in agent.jobs(since="2000-01-01T00:00:00Z").jobs] == [queued.id]


def test_command_killed_by_a_signal_is_not_a_lost_connection(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))

    result = transport.exec(["sh", "-c", "echo partial; kill -9 $$"], timeout_s=20)

    assert result.exit_code == -1  # OpenSSH reports a signal, which carries no exit status
    assert result.stdout == "partial\n"
    assert transport.exec(["true"], timeout_s=20).exit_code == 0
    assert sshd.accepted_logins() == 1


def test_pinned_key_of_a_type_the_server_no_longer_has_is_refused(
    fleet: Fleet, sshd: SshServer, tmp_path: Path
) -> None:
    other = tmp_path / "old_rsa_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-N", "", "-f", str(other)], check=True)
    pinned = host_key_from_line(other.with_suffix(".pub").read_text())
    target = sshd.target("gpu-a", host_key=pinned)

    with pytest.raises(HostKeyChanged) as caught:
        fleet.agent(target).status()

    assert caught.value.instance == "gpu-a"
    assert caught.value.expected_fingerprint == pinned.fingerprint
    assert caught.value.presented_fingerprint is None
    assert sshd.accepted_logins() == 0


def test_pinned_key_of_an_unknown_type_is_not_trusted(fleet: Fleet, sshd: SshServer) -> None:
    odd = replace(sshd.host_key, key_type="ssh-unknown@example.com")

    with pytest.raises(HostKeyNotPinned, match="cannot check") as caught:
        fleet.agent(sshd.target("gpu-a", host_key=odd)).status()

    assert caught.value.instance == "gpu-a"
    assert sshd.accepted_logins() == 0


@pytest.mark.parametrize(
    ("keygen_type", "key_type"), [("rsa", "ssh-rsa"), ("ecdsa", "ecdsa-sha2-nistp256")]
)
def test_rsa_and_ecdsa_host_keys_are_pinned_and_verified(
    fleet: Fleet, tmp_path_factory: pytest.TempPathFactory, keygen_type: str, key_type: str
) -> None:
    server = start_sshd(tmp_path_factory.mktemp("sshd-" + keygen_type), host_key_type=keygen_type)
    try:
        served = server.host_key
        pinned = fleet.scan_host_key(server.host, server.port)
        transport = fleet.transport(server.target("gpu-a", host_key=pinned))
        result = transport.exec(["echo", "ok"], timeout_s=20)
        server.restart_with_new_host_key()
        fleet.forget("gpu-a")
        with pytest.raises(HostKeyChanged):
            fleet.transport(server.target("gpu-a", host_key=pinned)).exec(["true"], timeout_s=20)
    finally:
        server.stop()

    assert pinned == served
    assert pinned.key_type == key_type
    assert result.stdout == "ok\n"
