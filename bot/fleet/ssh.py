"""SSH to instances with paramiko: keys only, pinned host keys, one kept-alive connection each.

A connection is made only after the server has shown the pinned host key; a different key
raises HostKeyChanged before the bot authenticates or sends anything. Commands cross as one
quoted string (``shlex.join`` of the argv), so the remote shell sees exactly the argv given;
their output is read up to a cap (OutputTooLarge past it). One call dials at a time; the
others wait for it only briefly and never past their own deadline. A dial that fails puts the
instance in a back-off: until it ends, calls fail at once with Unreachable instead of dialling.
Every paramiko and socket error leaves this module as a bot.errors.FleetError.

Why one module of this size: it is the one SSH transport (the design keeps one module per
outside thing): dialling with the pinned key, the kept-alive connection and its back-off,
bounded reads, uploads and every error translation belong to that one boundary.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import posixpath
import select
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.ssh_exception import IncompatiblePeer

from bot.errors import (
    AuthenticationFailed,
    CommandTimeout,
    FleetError,
    HostKeyChanged,
    HostKeyNotPinned,
    Unreachable,
)
from bot.fleet.base import (
    MAX_STDERR_BYTES,
    MAX_STDOUT_BYTES,
    ExecResult,
    HostKey,
    Target,
    output_too_large,
)
from bot.fleet.hostkeys import algorithms_for, host_key_from_blob
from bot.i18n import t
from bot.metrics import Metrics, error_kind
from bot.settings import Settings

log = logging.getLogger(__name__)

#: Seconds between keepalive packets on an idle connection.
KEEPALIVE_S = 15
#: Seconds a pooled connection's reader thread sleeps in recv() between its housekeeping
#: checks (keepalive, rekey, close). paramiko's 0.1 s wakes every idle connection ten times a
#: second; data, EOF and errors still wake it at once.
IDLE_WAKE_S = 1.0
#: Channels used at once on one connection (OpenSSH's MaxSessions defaults to 10).
MAX_CHANNELS = 8
_READ_CHUNK = 65536
#: How long to wait for the rest of a command's output once its exit status is in (s).
EOF_GRACE_S = 2.0
# How often a wait for output also looks for the exit status, in seconds.
_STATUS_POLL_S = 0.25
#: Seconds calls fail at once after a dial failed; doubled after each further failure...
DIAL_BACKOFF_S = 30.0
#: ...up to this many seconds.
DIAL_BACKOFF_MAX_S = 300.0
#: Seconds into another call's dial that a call waits for it to finish; past that it fails at
#: once (a healthy host answers well within this, a dead one never does).
DIAL_JOIN_S = 2.0


@dataclass(frozen=True)
class _DialFailure:
    """The last failed dial: why, when (back-off clock seconds), until when calls fail at
    once, and how many dials in a row failed."""

    reason: str
    at: float
    retry_at: float
    count: int


class SshTransport:
    """The Transport for one SSH target: one connection, re-dialled when it has died.

    Thread-safe: concurrent calls share the connection, each on its own channel; one call
    dials, the others wait for it up to ``join_dial_s`` seconds into its dial and never past
    their own deadline. A command may print at most ``max_stdout_bytes`` and
    ``max_stderr_bytes``. ``clock`` (monotonic seconds) times the back-off after a failed dial.
    """

    def __init__(
        self,
        target: Target,
        *,
        settings: Settings,
        key_loader: Callable[[Path], paramiko.PKey] | None = None,
        max_stdout_bytes: int = MAX_STDOUT_BYTES,
        max_stderr_bytes: int = MAX_STDERR_BYTES,
        clock: Callable[[], float] = time.monotonic,
        join_dial_s: float = DIAL_JOIN_S,
        metrics: Metrics | None = None,
    ) -> None:
        self.target = target
        #: Where SSH failures are counted (the runtime's; a transport alone counts its own).
        self.metrics = metrics if metrics is not None else Metrics()
        self._settings = settings
        self._load_key = key_loader or load_private_key
        self.max_stdout_bytes = max_stdout_bytes
        self.max_stderr_bytes = max_stderr_bytes
        self._clock = clock
        self._join_dial_s = join_dial_s
        #: Guards the fields below (never held while dialling); notified when a dial ends.
        self._state = threading.Condition()
        self._channels = threading.BoundedSemaphore(MAX_CHANNELS)
        self._conn: paramiko.Transport | None = None
        self._failure: _DialFailure | None = None
        #: When the dial under way started (time.monotonic); None when no call dials.
        self._dial_started: float | None = None
        #: Counts close() calls: a dial that was under way across one keeps nothing.
        self._generation = 0
        #: How many connections this transport has made (a pooled one is reused).
        self.dial_count = 0

    def exec(
        self, argv: Sequence[str], *, timeout_s: float, stdin: bytes | None = None
    ) -> ExecResult:
        """Run argv on the instance; raises CommandTimeout after ``timeout_s`` seconds,
        OutputTooLarge (the command is stopped) when it prints past a cap, Unreachable when
        the connection drops, and the dial errors of :meth:`connect`."""
        if not argv:
            raise ValueError("empty argv")
        command = shlex.join(argv)
        deadline = time.monotonic() + timeout_s
        with self._channel(deadline) as chan:
            # paramiko waits for some replies without a timeout: close the channel at the
            # deadline so that nothing blocks past it.
            alarm = WATCHDOG.schedule(deadline, chan.close)
            try:
                chan.settimeout(self._remaining(deadline))
                chan.exec_command(command)
                if stdin:
                    chan.sendall(stdin)
                chan.shutdown_write()
                result = self._collect(chan, deadline, timeout_s)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                if alarm.fired:
                    raise self._timeout(timeout_s) from exc
                raise self._lost(exc) from exc
            finally:
                alarm.cancel()
            if alarm.fired and result.exit_code == -1:
                raise self._timeout(timeout_s)
            return result

    def put_file(self, local_path: str, remote_path: str, *, mode: int = 0o755) -> None:
        """Upload over SFTP to a temporary name, then rename into place (readers never see a
        partial file). Relative remote paths are relative to the user's home directory.

        Takes at most the SSH command timeout; raises FleetError when the file cannot be
        written there, Unreachable or CommandTimeout when the connection fails."""
        timeout_s = self._settings.ssh_command_timeout_s
        deadline = time.monotonic() + timeout_s
        with self._channel(deadline) as chan:
            alarm = WATCHDOG.schedule(deadline, chan.close)
            try:
                chan.settimeout(self._remaining(deadline))
                chan.invoke_subsystem("sftp")
                sftp = paramiko.SFTPClient(chan)
                self._upload(sftp, local_path, remote_path, mode)
            except FleetError:
                raise
            except (paramiko.SSHException, EOFError, TimeoutError) as exc:
                if alarm.fired:
                    raise self._timeout(timeout_s) from exc
                raise self._lost(exc) from exc
            except OSError as exc:
                if alarm.fired or chan.closed:
                    raise self._lost(exc) from exc
                raise FleetError(
                    t(
                        "could not copy {name} to {name2}:{remote_path}: {exc}",
                        name=Path(local_path).name,
                        name2=self.target.name,
                        remote_path=remote_path,
                        exc=exc,
                    ),
                    instance=self.target.name,
                    hint=t("Check free disk space and write permission on the instance."),
                ) from exc
            finally:
                alarm.cancel()

    def connect(self) -> None:
        """Make sure a verified, authenticated connection is up (dial when needed).

        Raises HostKeyNotPinned, HostKeyChanged, AuthenticationFailed, Unreachable (at once
        while in the back-off after a failed dial) and CommandTimeout."""
        deadline = time.monotonic() + self._settings.ssh_connect_timeout_s
        self._connection(deadline)

    @property
    def connected(self) -> bool:
        """True while the pooled connection is up."""
        conn = self._conn
        return conn is not None and conn.is_active()

    def close(self) -> None:
        """Drop the connection and forget a failed dial; a later call dials again."""
        with self._state:
            conn, self._conn = self._conn, None
            self._failure = None
            self._generation += 1
        if conn is not None:
            conn.close()

    # --- connection -----------------------------------------------------------------------

    @contextmanager
    def _channel(self, deadline: float) -> Iterator[paramiko.Channel]:
        if not self._channels.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CommandTimeout(
                f"{self.target.name}: too many commands at once; none finished in time",
                instance=self.target.name,
            )
        try:
            chan = self._open_channel(deadline)
            try:
                yield chan
            finally:
                chan.close()
        finally:
            self._channels.release()

    def _open_channel(self, deadline: float) -> paramiko.Channel:
        conn = self._connection(deadline)
        try:
            return conn.open_session(timeout=self._remaining(deadline))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            # The pooled connection died quietly: nothing ran yet, so dial once more.
            log.info("ssh %s: connection went stale (%s); dialling again", self.target.name, exc)
            self._drop(conn)
        conn = self._connection(deadline)
        try:
            return conn.open_session(timeout=self._remaining(deadline))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._drop(conn)
            raise self._lost(exc) from exc

    def _connection(self, deadline: float) -> paramiko.Transport:
        """The live connection, dialled when there is none. Raises at once while in the
        back-off; waits for another call's dial until ``deadline`` (time.monotonic) or
        ``join_dial_s`` into that dial, whichever is first."""
        with self._state:
            live = self._await_dial(deadline)
            if live is not None:
                return live
            stale, self._conn = self._conn, None
            self._dial_started = time.monotonic()
            generation = self._generation
        if stale is not None:
            stale.close()
        try:
            conn = self._dial(deadline, generation)
        finally:
            with self._state:
                self._dial_started = None
                self._state.notify_all()
        with self._state:
            if generation == self._generation:
                self._failure = None
                self.dial_count += 1
                self._conn = conn
                return conn
        conn.close()
        raise Unreachable(
            t("{name}: the connection was closed while it was being made", name=self.target.name),
            instance=self.target.name,
            hint=t("Try again."),
        )

    def _await_dial(self, deadline: float) -> paramiko.Transport | None:
        """With ``_state`` held: wait out another call's dial. Returns the live connection, or
        None when this call is to dial. Raises Unreachable (in the back-off, or another call's
        dial taking too long) or CommandTimeout (``deadline`` passed while waiting)."""
        while True:
            conn = self._conn
            if conn is not None and conn.is_active():
                return conn
            self._refuse_while_failing()
            started = self._dial_started
            if started is None:
                return None
            now = time.monotonic()
            if now >= deadline:
                raise CommandTimeout(
                    f"{self.target.name}: another call was still connecting when this one ran "
                    "out of time",
                    instance=self.target.name,
                    hint="Try again in a moment; if it keeps happening check the instance.",
                )
            if now >= started + self._join_dial_s:
                raise Unreachable(
                    t(
                        "{name}: connecting has taken {value:.0f} s so far (another "
                        "call is still at it)",
                        name=self.target.name,
                        value=now - started,
                    ),
                    instance=self.target.name,
                    hint=t(
                        "Try again in a moment; if it keeps failing check that the "
                        "instance is running and that its SSH port is open to the bot."
                    ),
                )
            self._state.wait(min(deadline, started + self._join_dial_s) - now)

    def _dial(self, deadline: float, generation: int) -> paramiko.Transport:
        """Dial within the connect timeout and ``deadline``; a failure to reach the host
        starts the back-off (unless the transport was closed since ``generation``)."""
        timeout_s = min(self._settings.ssh_connect_timeout_s, self._remaining(deadline))
        key = self._key()
        try:
            return dial(self.target, timeout_s=timeout_s, key=key)
        except FleetError as exc:
            self.metrics.ssh_error(error_kind(exc))
            if exc.instance is None:
                exc.instance = self.target.name
            if isinstance(exc, Unreachable):
                with self._state:
                    if generation == self._generation:
                        self._note_failure(exc)
            raise

    def _note_failure(self, exc: Unreachable) -> None:
        """With ``_state`` held: start (or lengthen) the back-off after a failed dial."""
        now = self._clock()
        count = self._failure.count + 1 if self._failure is not None else 1
        wait_s = min(DIAL_BACKOFF_S * 2 ** (count - 1), DIAL_BACKOFF_MAX_S)
        self._failure = _DialFailure(exc.message, now, now + wait_s, count)
        log.info(
            "ssh %s: dial failed (%d in a row); calls fail at once for %g s",
            self.target.name,
            count,
            wait_s,
        )

    def _refuse_while_failing(self) -> None:
        """With ``_state`` held: raise Unreachable at once while in the back-off after a failed
        dial, and while another call dials again after one."""
        failure = self._failure
        if failure is None:
            return
        now = self._clock()
        if now < failure.retry_at:
            wait_s = math.ceil(failure.retry_at - now)
            raise Unreachable(
                t(
                    "{name}: connecting failed {value:.0f} s ago ({reason}); the "
                    "bot tries again in {wait_s} s",
                    name=self.target.name,
                    value=now - failure.at,
                    reason=failure.reason,
                    wait_s=wait_s,
                ),
                instance=self.target.name,
                hint=(
                    t(
                        "Check that the instance is running and that its SSH port is "
                        "open to the bot, then try again in {wait_s} s.",
                        wait_s=wait_s,
                    )
                ),
            )
        if self._dial_started is not None:
            raise Unreachable(
                t(
                    "{name}: connecting failed before ({reason}) and the bot is trying again now",
                    name=self.target.name,
                    reason=failure.reason,
                ),
                instance=self.target.name,
                hint=t("Try again in a moment; if it keeps failing check the instance."),
            )

    def _drop(self, conn: paramiko.Transport) -> None:
        with self._state:
            if self._conn is conn:
                self._conn = None
        conn.close()

    def _key(self) -> paramiko.PKey:
        path = self.target.key_path or self._settings.ssh_key
        if path is None:
            raise AuthenticationFailed(
                t("{name}: no SSH key configured", name=self.target.name),
                instance=self.target.name,
                hint=t("Set GPUBOT_SSH_KEY to the private key the bot uses for instances."),
            )
        try:
            return self._load_key(Path(path).expanduser())
        except AuthenticationFailed as exc:
            exc.instance = self.target.name
            raise

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CommandTimeout(
                f"{self.target.name}: ran out of time before the command started",
                instance=self.target.name,
            )
        return remaining

    # --- commands -------------------------------------------------------------------------

    def _collect(self, chan: paramiko.Channel, deadline: float, timeout_s: float) -> ExecResult:
        out = bytearray()
        err = bytearray()
        while not chan.exit_status_ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._timeout(timeout_s)
            if chan.eof_received:
                # All output is in; only the exit status is still on its way.
                chan.status_event.wait(remaining)
            else:
                # The exit status does not wake a poll on the channel (a child holding the
                # output open means no EOF follows it), so poll in short slices.
                _wait_readable(chan, min(remaining, _STATUS_POLL_S))
            self._drain(chan, out, err)
        self._drain_after_exit(chan, out, err, deadline)
        status = chan.recv_exit_status()
        if status == -1 and _connection_lost(chan):
            raise Unreachable(
                t("{name}: the connection dropped during the command", name=self.target.name),
                instance=self.target.name,
            )
        return ExecResult(
            exit_code=status,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def _drain_after_exit(
        self, chan: paramiko.Channel, out: bytearray, err: bytearray, deadline: float
    ) -> None:
        """Read what is left once the exit status is in: sshd may send the status before the
        last of a stream it is still reading from the command, so read until its end of output
        (EOF), for at most ``EOF_GRACE_S`` (a command that left a child holding its output
        open never sends EOF) and never past ``deadline``. A closed channel (the connection
        closed under a hung command, as on shutdown) has nothing more to come: not waited on."""
        until = min(deadline, time.monotonic() + EOF_GRACE_S)
        while not chan.eof_received and not chan.closed:
            remaining = until - time.monotonic()
            if remaining <= 0:
                break
            _wait_readable(chan, remaining)
            self._drain(chan, out, err)
        self._drain(chan, out, err)

    def _drain(self, chan: paramiko.Channel, out: bytearray, err: bytearray) -> None:
        """Read what has arrived; past a cap, close the channel (the remote command stops)
        and raise OutputTooLarge."""
        for ready, recv, buffer, cap, stream in (
            (chan.recv_ready, chan.recv, out, self.max_stdout_bytes, "stdout"),
            (chan.recv_stderr_ready, chan.recv_stderr, err, self.max_stderr_bytes, "stderr"),
        ):
            while ready():
                buffer += recv(_READ_CHUNK)
                if len(buffer) > cap:
                    chan.close()
                    self.metrics.ssh_error("output_too_large")
                    raise output_too_large(self.target.name, stream, cap)

    def _upload(
        self, sftp: paramiko.SFTPClient, local_path: str, remote_path: str, mode: int
    ) -> None:
        directory = posixpath.dirname(remote_path)
        if directory:
            _sftp_makedirs(sftp, directory)
        temp = posixpath.join(directory, f".{posixpath.basename(remote_path)}.{uuid.uuid4().hex}")
        try:
            sftp.put(local_path, temp)
            sftp.chmod(temp, mode)
            sftp.posix_rename(temp, remote_path)
        except BaseException:
            _remove_quietly(sftp, temp)
            raise
        finally:
            sftp.close()

    def _timeout(self, timeout_s: float) -> CommandTimeout:
        self.metrics.ssh_error("command_timeout")
        return CommandTimeout(
            f"{self.target.name}: the command did not finish within {timeout_s:g} s",
            instance=self.target.name,
            hint="Try again; if it keeps happening the instance may be overloaded.",
        )

    def _lost(self, exc: BaseException) -> Unreachable:
        self.metrics.ssh_error(
            "command_timeout" if isinstance(exc, TimeoutError) else "connection_lost"
        )
        if isinstance(exc, TimeoutError):
            return CommandTimeout(
                f"{self.target.name}: SSH timed out ({exc})", instance=self.target.name
            )
        return Unreachable(
            t(
                "{name}: the SSH connection failed ({describe})",
                name=self.target.name,
                describe=_describe(exc),
            ),
            instance=self.target.name,
        )


def dial(target: Target, *, timeout_s: float, key: paramiko.PKey) -> paramiko.Transport:
    """Connect, check the server's host key against the pin, then authenticate with ``key``.

    Raises HostKeyNotPinned, HostKeyChanged (before anything is sent), AuthenticationFailed
    or Unreachable.
    """
    pinned = target.host_key
    if pinned is None:
        raise HostKeyNotPinned(
            t("{name}: no host key is pinned", name=target.name), instance=target.name
        )
    try:
        conn = _handshake(
            target.host,
            target.port,
            timeout_s=timeout_s,
            key_types=algorithms_for(pinned.key_type),
        )
    except HostKeyChanged as exc:
        exc.instance = target.name
        exc.expected_fingerprint = pinned.fingerprint
        raise
    except HostKeyNotPinned as exc:
        exc.instance = target.name
        raise
    try:
        presented = _server_key(conn)
        if presented.key_b64 != pinned.key_b64 or presented.key_type != pinned.key_type:
            raise HostKeyChanged(
                t(
                    "{name}: the host key of {host}:{port} changed: pinned "
                    "{fingerprint}, presented {fingerprint2}; refusing to connect",
                    name=target.name,
                    host=target.host,
                    port=target.port,
                    fingerprint=pinned.fingerprint,
                    fingerprint2=presented.fingerprint,
                ),
                instance=target.name,
                expected_fingerprint=pinned.fingerprint,
                presented_fingerprint=presented.fingerprint,
            )
        _authenticate(conn, target, key)
        conn.set_keepalive(KEEPALIVE_S)
        conn.sock.settimeout(IDLE_WAKE_S)
    except BaseException:
        conn.close()
        raise
    return conn


def scan_host_key(host: str, port: int = 22, *, timeout_s: float) -> HostKey:
    """The host key a server presents (for pinning); authenticates nothing, trusts nothing.

    Raises Unreachable.
    """
    conn = _handshake(host, port, timeout_s=timeout_s, key_types=None)
    try:
        return _server_key(conn)
    finally:
        conn.close()


def load_private_key(path: Path) -> paramiko.PKey:
    """Read an unencrypted private key (ed25519, ECDSA or RSA; OpenSSH or PEM format).

    Raises AuthenticationFailed saying what is wrong with the file.
    """
    try:
        return _read_key(path)
    except paramiko.PasswordRequiredException as exc:
        raise AuthenticationFailed(
            t("the SSH key {path} is protected by a passphrase", path=path),
            hint=t("Give the bot a key without a passphrase (GPUBOT_SSH_KEY)."),
        ) from exc
    except (paramiko.SSHException, OSError, ValueError) as exc:
        raise AuthenticationFailed(
            t("cannot read the SSH key {path}: {exc}", path=path, exc=exc),
            hint=t("Point GPUBOT_SSH_KEY (or the instance's key) at a readable private key file."),
        ) from exc


def _read_key(path: Path) -> paramiko.PKey:
    key: paramiko.PKey = paramiko.PKey.from_path(path)
    return key


def _handshake(
    host: str, port: int, *, timeout_s: float, key_types: Sequence[str] | None
) -> paramiko.Transport:
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as exc:
        raise Unreachable(
            t("cannot resolve {host!r}: {strerror}", host=host, strerror=exc.strerror),
            hint=t("Check the host name (or use the instance's IP address) and the bot's DNS."),
        ) from exc
    except TimeoutError as exc:
        raise Unreachable(
            t("{where} did not answer within {timeout_s:g} s", where=where, timeout_s=timeout_s)
        ) from exc
    except OSError as exc:
        raise Unreachable(
            t("cannot connect to {where}: {describe}", where=where, describe=_describe(exc))
        ) from exc
    # Commands are a few small packets each way: without this, Nagle's algorithm holds a packet
    # back until the previous one is acknowledged (up to a delayed-ACK time per command).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        conn = paramiko.Transport(sock)
    except (paramiko.SSHException, OSError) as exc:
        sock.close()
        raise Unreachable(
            t("cannot start SSH with {where}: {describe}", where=where, describe=_describe(exc))
        ) from exc
    conn.banner_timeout = timeout_s
    conn.handshake_timeout = timeout_s
    conn.auth_timeout = timeout_s
    if key_types is not None:
        try:
            conn.get_security_options().key_types = tuple(key_types)
        except ValueError as exc:
            conn.close()
            raise HostKeyNotPinned(
                t(
                    "the host key pinned for {where} is of a type this bot cannot "
                    "check ({choices})",
                    where=where,
                    choices=", ".join(key_types),
                )
            ) from exc
    started = time.monotonic()
    try:
        conn.start_client(timeout=timeout_s)
    except IncompatiblePeer as exc:
        conn.close()
        raise HostKeyChanged(
            t(
                "{where} offers no host key of the pinned type ({choices}); refusing to connect",
                where=where,
                choices=", ".join(key_types or ()),
            ),
            presented_fingerprint=None,
        ) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        conn.close()
        # A peer that never sends its banner fails here or below depending on which timer
        # fires first; both are the same silence.
        if not conn.remote_version and time.monotonic() - started >= timeout_s * 0.9:
            raise Unreachable(
                t(
                    "{where} did not complete the SSH handshake within {timeout_s:g} s",
                    where=where,
                    timeout_s=timeout_s,
                )
            ) from exc
        raise Unreachable(
            t("SSH handshake with {where} failed: {describe}", where=where, describe=_describe(exc))
        ) from exc
    if not (conn.is_active() and conn.initial_kex_done):
        conn.close()
        raise Unreachable(
            t(
                "{where} did not complete the SSH handshake within {timeout_s:g} s",
                where=where,
                timeout_s=timeout_s,
            )
        )
    return conn


def _server_key(conn: paramiko.Transport) -> HostKey:
    key = conn.get_remote_server_key()
    return host_key_from_blob(key.get_name(), key.asbytes())


def _authenticate(conn: paramiko.Transport, target: Target, key: paramiko.PKey) -> None:
    try:
        conn.auth_publickey(target.user, key)
    except paramiko.AuthenticationException as exc:
        raise AuthenticationFailed(
            t(
                "{name}: {user}@{host} refused the bot's SSH key",
                name=target.name,
                user=target.user,
                host=target.host,
            ),
            instance=target.name,
        ) from exc
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise Unreachable(
            t(
                "{name}: the connection failed while logging in ({describe})",
                name=target.name,
                describe=_describe(exc),
            ),
            instance=target.name,
        ) from exc
    if not conn.is_authenticated():
        raise AuthenticationFailed(
            t(
                "{name}: {user}@{host} did not accept the bot's SSH key",
                name=target.name,
                user=target.user,
                host=target.host,
            ),
            instance=target.name,
        )


def _connection_lost(chan: paramiko.Channel) -> bool:
    """Whether a channel that closed without an exit status did so because the connection died
    (rather than the command being killed by a signal, which paramiko reports the same way)."""
    conn = chan.get_transport()
    if conn is None:
        return True
    # The transport thread closes channels just before it marks itself inactive.
    return getattr(conn, "saved_exception", None) is not None or not conn.is_active()


def _wait_readable(chan: paramiko.Channel, timeout_s: float) -> None:
    """Wait until the channel has output, EOF or closed (poll: no select() fd limit)."""
    poller = select.poll()
    poller.register(chan.fileno(), select.POLLIN)
    poller.poll(max(1, math.ceil(timeout_s * 1000)))


def _sftp_makedirs(sftp: paramiko.SFTPClient, directory: str) -> None:
    """``mkdir -p`` over SFTP (relative to the login directory unless absolute)."""
    parts = [p for p in directory.split("/") if p]
    path = "/" if directory.startswith("/") else ""
    for part in parts:
        path = posixpath.join(path, part) if path else part
        try:
            sftp.stat(path)
        except FileNotFoundError:
            try:
                sftp.mkdir(path, mode=0o755)
            except OSError:
                sftp.stat(path)  # made concurrently by another upload: fine; else raise


def _remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except (OSError, paramiko.SSHException, EOFError):
        return


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, EOFError):
        return "the server closed the connection"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the server"
    return text


@dataclass(order=True)
class _Alarm:
    deadline: float
    seq: int
    action: Callable[[], None] = field(compare=False)
    fired: bool = field(default=False, compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class _Watchdog:
    """One daemon thread running actions at monotonic deadlines unless cancelled first."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[_Alarm] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, deadline: float, action: Callable[[], None]) -> _Alarm:
        """Run ``action`` at ``deadline`` (time.monotonic) unless the alarm is cancelled."""
        alarm = _Alarm(deadline, next(self._seq), action)
        with self._cv:
            heapq.heappush(self._heap, alarm)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ssh-watchdog", daemon=True)
                self._thread.start()
            self._cv.notify()
        return alarm

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._heap or (
                    not self._heap[0].cancelled and self._heap[0].deadline > time.monotonic()
                ):
                    wait = self._heap[0].deadline - time.monotonic() if self._heap else None
                    self._cv.wait(wait)
                alarm = heapq.heappop(self._heap)
                if alarm.cancelled:
                    continue
                alarm.fired = True
            try:
                alarm.action()
            except Exception:
                log.exception("ssh watchdog action failed")


WATCHDOG = _Watchdog()
