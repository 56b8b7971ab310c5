"""What one instance can cost the bot: output read up to a cap, and dials that give up early.

Over the real sshd on loopback and real subprocesses: a command printing 100 MB is stopped at
the cap (memory measured with tracemalloc stays far below what it printed); a host that takes
TCP connections and never speaks SSH is dialled once, then refused at once for a back-off
(timed by a clock the test moves), and nobody waits for someone else's dial past their deadline.
Polling fans out on a pool of its own.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from bot.errors import CommandTimeout, OutputTooLarge, Unreachable
from bot.fleet.agent_client import RemoteAgent
from bot.fleet.base import MAX_STDERR_BYTES, MAX_STDOUT_BYTES, Target
from bot.fleet.fleet import Fleet, polling
from bot.fleet.local import LocalTransport
from bot.fleet.ssh import DIAL_BACKOFF_S, SshTransport
from bot.settings import Settings
from tests.fixtures.sshd import SshServer

pytestmark = pytest.mark.integration

PRINTED = 100_000_000
#: Far below the 100 MB printed: the cap (16 MiB) plus buffers, with room to spare.
MEMORY_BOUND = 40 * 2**20


@dataclass
class Allocation:
    """Peak bytes allocated by Python (all threads) above the level at the start."""

    peak: int = 0


@contextmanager
def peak_allocation() -> Iterator[Allocation]:
    """Measure the peak of Python allocations inside the block."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    seen = Allocation()
    try:
        yield seen
    finally:
        seen.peak = tracemalloc.get_traced_memory()[1] - start
        if not was_tracing:
            tracemalloc.stop()


@dataclass
class SilentHost:
    """A TCP listener on 127.0.0.1 that accepts connections and never says anything."""

    listener: socket.socket
    accepted: list[socket.socket] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.arrived:
                self.accepted.append(conn)
                self.arrived.notify_all()

    def connections(self) -> int:
        with self.arrived:
            return len(self.accepted)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.accepted) >= count, timeout_s)

    def close(self) -> None:
        # Wakes the accept() blocked in serve(); a bare close() does not on Linux.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.arrived:
            for conn in self.accepted:
                conn.close()


@pytest.fixture
def silent_host() -> Iterator[SilentHost]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    host = SilentHost(listener)
    thread = threading.Thread(target=host.serve, daemon=True)
    thread.start()
    try:
        yield host
    finally:
        host.close()
        thread.join(5)
        assert not thread.is_alive()


class Clock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


# --- output caps over SSH -----------------------------------------------------------------------


def test_100_mb_on_stdout_over_ssh_is_cut_at_the_cap(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))
    transport.exec(["true"], timeout_s=30)  # connected before measuring

    with peak_allocation() as allocated, pytest.raises(OutputTooLarge) as caught:
        transport.exec(["head", "-c", str(PRINTED), "/dev/zero"], timeout_s=120)

    assert allocated.peak < MEMORY_BOUND, allocated.peak
    assert caught.value.instance == "gpu-a"
    assert "gpu-a" in str(caught.value)
    assert "16 MiB" in str(caught.value)
    assert "--tail" in caught.value.hint
    # The connection keeps serving other commands.
    assert transport.exec(["echo", "ok"], timeout_s=30).stdout == "ok\n"


def test_stderr_over_ssh_has_a_smaller_cap(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))

    with pytest.raises(OutputTooLarge, match="1 MiB on stderr"):
        transport.exec(["sh", "-c", f"head -c {PRINTED} /dev/zero >&2"], timeout_s=120)


def test_output_up_to_the_cap_comes_back_whole(fleet: Fleet, sshd: SshServer) -> None:
    transport = fleet.transport(sshd.target("gpu-a"))
    assert isinstance(transport, SshTransport)
    small = SshTransport(
        transport.target, settings=fleet.settings, max_stdout_bytes=1000, max_stderr_bytes=10
    )
    try:
        result = small.exec(
            ["sh", "-c", "head -c 1000 /dev/zero; printf 0123456789 >&2"], timeout_s=30
        )
        assert (len(result.stdout), result.stderr) == (1000, "0123456789")
        with pytest.raises(OutputTooLarge, match="1000 bytes on stdout"):
            small.exec(["head", "-c", "1001", "/dev/zero"], timeout_s=30)
    finally:
        small.close()


def test_a_log_tail_past_the_cap_is_output_too_large(
    fleet: Fleet, sshd: SshServer, tmp_path: Path
) -> None:
    flood = _script(tmp_path / "python", f"exec head -c {PRINTED} /dev/zero\n")
    agent = fleet.agent(sshd.target("gpu-a", python_path=flood))

    with peak_allocation() as allocated, pytest.raises(OutputTooLarge) as caught:
        agent.logs("j-1", tail=10**9)

    assert allocated.peak < MEMORY_BOUND, allocated.peak
    assert caught.value.instance == "gpu-a"


# --- output caps on this machine ----------------------------------------------------------------


def test_100_mb_on_stdout_locally_kills_the_command(tmp_path: Path) -> None:
    local = LocalTransport(home=tmp_path)
    marker = tmp_path / "finished"

    with peak_allocation() as allocated, pytest.raises(OutputTooLarge) as caught:
        local.exec(["sh", "-c", f'head -c {PRINTED} /dev/zero && touch "{marker}"'], timeout_s=120)

    assert allocated.peak < MEMORY_BOUND, allocated.peak
    assert caught.value.instance == "local"
    assert f"{MAX_STDOUT_BYTES // 2**20} MiB on stdout" in str(caught.value)
    assert not marker.exists()  # stopped, not left to print the rest


def test_stderr_locally_has_its_own_cap(tmp_path: Path) -> None:
    local = LocalTransport(home=tmp_path)

    with pytest.raises(OutputTooLarge, match=f"{MAX_STDERR_BYTES // 2**20} MiB on stderr"):
        local.exec(["sh", "-c", f"head -c {PRINTED} /dev/zero >&2"], timeout_s=120)


def test_local_output_up_to_the_cap_comes_back_whole(tmp_path: Path) -> None:
    local = LocalTransport(home=tmp_path, max_stdout_bytes=3_000_000, max_stderr_bytes=3)
    data = b"0123456789abcdef" * 187_500  # 3 MB: far more than a pipe holds, both ways at once

    result = local.exec(["sh", "-c", "cat; printf err >&2"], timeout_s=60, stdin=data)

    assert (result.exit_code, result.stdout, result.stderr) == (0, data.decode(), "err")
    with pytest.raises(OutputTooLarge, match="on stdout"):
        local.exec(["cat"], timeout_s=60, stdin=data + b"!")


# --- dials: deadlines and back-off --------------------------------------------------------------


@pytest.fixture
def quick_settings(fleet_settings: Settings) -> Settings:
    return fleet_settings.with_(ssh_connect_timeout_s=0.5)


def test_a_silent_host_is_dialled_once_then_refused_at_once(
    quick_settings: Settings, sshd: SshServer, silent_host: SilentHost
) -> None:
    clock = Clock()
    target = replace(sshd.target("dead"), port=silent_host.port)
    transport = SshTransport(target, settings=quick_settings, clock=clock)
    try:
        with pytest.raises(Unreachable, match="did not complete the SSH handshake"):
            transport.exec(["true"], timeout_s=30)
        for _ in range(5):
            with pytest.raises(Unreachable) as caught:
                transport.exec(["true"], timeout_s=30)
            assert not isinstance(caught.value, CommandTimeout)
            assert "tries again in 30 s" in str(caught.value)
            assert "SSH port is open" in caught.value.hint
            assert caught.value.instance == "dead"
        assert silent_host.connections() == 1

        clock.now += DIAL_BACKOFF_S  # the back-off is over: one more dial, which fails too
        with pytest.raises(Unreachable, match="handshake"):
            transport.exec(["true"], timeout_s=30)
        assert silent_host.connections() == 2

        clock.now += DIAL_BACKOFF_S  # a second failure doubled the back-off
        with pytest.raises(Unreachable, match="tries again in 30 s"):
            transport.exec(["true"], timeout_s=30)
        assert silent_host.connections() == 2
        clock.now += DIAL_BACKOFF_S
        with pytest.raises(Unreachable, match="handshake"):
            transport.exec(["true"], timeout_s=30)
        assert silent_host.connections() == 3
    finally:
        transport.close()


def test_a_dial_that_works_again_ends_the_back_off(
    quick_settings: Settings, sshd: SshServer
) -> None:
    clock = Clock()
    transport = SshTransport(sshd.target("box"), settings=quick_settings, clock=clock)
    try:
        sshd.stop()
        with pytest.raises(Unreachable, match="connection refused"):
            transport.exec(["true"], timeout_s=30)
        sshd.restart()
        with pytest.raises(Unreachable, match="tries again in 30 s"):
            transport.exec(["true"], timeout_s=30)

        clock.now += DIAL_BACKOFF_S
        assert transport.exec(["echo", "up"], timeout_s=30).stdout == "up\n"

        sshd.stop()
        transport.close()  # also forgets the failures: the next one starts the back-off anew
        with pytest.raises(Unreachable, match="connection refused"):
            transport.exec(["true"], timeout_s=30)
        with pytest.raises(Unreachable, match="tries again in 30 s"):
            transport.exec(["true"], timeout_s=30)
    finally:
        transport.close()


def test_waiting_for_another_calls_dial_ends_at_the_callers_deadline(
    fleet_settings: Settings, sshd: SshServer, silent_host: SilentHost
) -> None:
    settings = fleet_settings.with_(ssh_connect_timeout_s=30.0)
    target = replace(sshd.target("dead"), port=silent_host.port)
    transport = SshTransport(target, settings=settings)
    first_done = threading.Event()
    first_error: list[BaseException] = []

    def first() -> None:
        try:
            transport.exec(["true"], timeout_s=60)
        except Unreachable as exc:
            first_error.append(exc)
        finally:
            first_done.set()

    dialler = threading.Thread(target=first)
    dialler.start()
    try:
        silent_host.wait_for(1)  # the first call is dialling (for up to 30 s)
        with pytest.raises(CommandTimeout, match="still connecting") as caught:
            transport.exec(["true"], timeout_s=0.3)
        assert not first_done.is_set()  # it gave up on its own deadline, not the dial's
        assert caught.value.hint
        assert silent_host.connections() == 1
    finally:
        silent_host.close()  # the first dial fails now
        dialler.join(30)
        transport.close()
    assert first_done.is_set()
    assert first_error


def test_a_dial_that_hangs_is_not_waited_for_past_the_join_window(
    fleet_settings: Settings, sshd: SshServer, silent_host: SilentHost
) -> None:
    settings = fleet_settings.with_(ssh_connect_timeout_s=30.0)
    target = replace(sshd.target("dead"), port=silent_host.port)
    transport = SshTransport(target, settings=settings, join_dial_s=0.2)
    first_done = threading.Event()

    def first() -> None:
        try:
            transport.exec(["true"], timeout_s=60)
        except Unreachable:
            pass
        finally:
            first_done.set()

    dialler = threading.Thread(target=first)
    dialler.start()
    try:
        silent_host.wait_for(1)
        with pytest.raises(Unreachable, match="another call is still at it") as caught:
            transport.exec(["true"], timeout_s=60)  # a deadline far past the window
        assert not isinstance(caught.value, CommandTimeout)
        assert "SSH port" in caught.value.hint
        assert not first_done.is_set()
        assert silent_host.connections() == 1
    finally:
        silent_host.close()
        dialler.join(30)
        transport.close()


def test_while_a_retry_dials_the_others_fail_at_once(
    fleet_settings: Settings, sshd: SshServer, silent_host: SilentHost
) -> None:
    clock = Clock()
    target = replace(sshd.target("dead"), port=silent_host.port)
    settings = fleet_settings.with_(ssh_connect_timeout_s=30.0)
    transport = SshTransport(target, settings=settings, clock=clock)
    # A first dial fails (cut short by its caller's deadline); the retry after the back-off
    # may take up to 30 s.
    with pytest.raises(Unreachable, match="handshake"):
        transport.exec(["true"], timeout_s=0.5)
    clock.now += DIAL_BACKOFF_S
    retry_done = threading.Event()

    def retry() -> None:
        try:
            transport.exec(["true"], timeout_s=60)
        except Unreachable:
            pass
        finally:
            retry_done.set()

    dialler = threading.Thread(target=retry)
    dialler.start()
    try:
        silent_host.wait_for(2)
        with pytest.raises(Unreachable, match="trying again now") as caught:
            transport.exec(["true"], timeout_s=60)
        assert not isinstance(caught.value, CommandTimeout)
        assert not retry_done.is_set()
        assert silent_host.connections() == 2
    finally:
        silent_host.close()
        dialler.join(30)
        transport.close()


def test_sixteen_calls_to_a_silent_host_cost_one_dial(
    quick_settings: Settings, agent_zipapp: Path, sshd: SshServer, silent_host: SilentHost
) -> None:
    target = replace(sshd.target("dead"), port=silent_host.port)
    errors: list[Unreachable] = []
    lock = threading.Lock()

    with Fleet(quick_settings, zipapp_path=agent_zipapp) as fleet:

        def health() -> None:
            try:
                fleet.agent(target).health()
            except Unreachable as exc:
                with lock:
                    errors.append(exc)

        callers = [threading.Thread(target=health) for _ in range(16)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(30)

    assert len(errors) == 16
    assert silent_host.connections() == 1


# --- pools ----------------------------------------------------------------------------------------


def test_polling_does_not_wait_for_a_full_commands_pool(
    fleet_settings: Settings, agent_zipapp: Path, tmp_path: Path
) -> None:
    local = Target(name="local", host="local")
    release = threading.Event()
    entered = threading.Event()

    def stuck(agent: RemoteAgent) -> str:
        entered.set()
        assert release.wait(30)
        return "late"

    with Fleet(
        fleet_settings,
        zipapp_path=agent_zipapp,
        local_transport=LocalTransport(home=tmp_path),
        max_workers=1,
        poll_workers=1,
    ) as fleet:
        command = threading.Thread(target=fleet.fan_out, args=([local], stuck))
        command.start()
        try:
            assert entered.wait(10)  # the commands' only thread is taken
            with polling():
                polled = fleet.fan_out([local], lambda agent: "polled", timeout_s=30)
            assert polled == {"local": "polled"}
            assert command.is_alive()
        finally:
            release.set()
            command.join(30)
