"""What the rest of the bot needs from the fleet: targets, transports and the agent client API.

Every method raises bot.errors.FleetError subclasses (Unreachable, AuthenticationFailed,
HostKeyChanged, AgentMissing, AgentBroken, CommandTimeout, OutputTooLarge); nothing else
escapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agents.protocol import HealthReport, JobList, JobRecord, StatusSnapshot, WhoReport
from bot.errors import OutputTooLarge
from bot.i18n import t

LOCAL_HOST = "local"
#: Bytes of standard output the bot reads from one command; past this the command is stopped.
MAX_STDOUT_BYTES = 16 * 2**20
#: Bytes of standard error the bot reads from one command; past this the command is stopped.
MAX_STDERR_BYTES = 2**20


@dataclass(frozen=True)
class HostKey:
    """A server host key as pinned: ``fingerprint`` is OpenSSH's ``SHA256:...`` form."""

    key_type: str
    key_b64: str
    fingerprint: str


@dataclass(frozen=True)
class Target:
    """How to reach one instance. ``host == "local"`` means this machine, without SSH."""

    name: str
    host: str
    port: int = 22
    user: str = "root"
    key_path: str | None = None
    host_key: HostKey | None = None
    python_path: str | None = None
    agent_home: str | None = None

    @property
    def is_local(self) -> bool:
        """True for the machine the bot runs on."""
        return self.host == LOCAL_HOST


@dataclass(frozen=True)
class ExecResult:
    """A finished remote command: exit code, and stdout/stderr decoded as UTF-8 (replacing)."""

    exit_code: int
    stdout: str
    stderr: str


def output_too_large(instance: str, stream: str, cap_bytes: int) -> OutputTooLarge:
    """The error for a command on ``instance`` whose ``stream`` (stdout, stderr) passed
    ``cap_bytes``."""
    return OutputTooLarge(
        t(
            "{instance}: the command printed more than {size} on {stream}; "
            "the bot stopped it and read no more",
            instance=instance,
            size=_size(cap_bytes),
            stream=stream,
        ),
        instance=instance,
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


class Transport(Protocol):
    """Runs argv on an instance (never through a shell on the bot's side) and copies files."""

    def exec(
        self, argv: Sequence[str], *, timeout_s: float, stdin: bytes | None = None
    ) -> ExecResult:
        """Run a command; argv is quoted for the remote shell, never joined unquoted. Output
        past :data:`MAX_STDOUT_BYTES` / :data:`MAX_STDERR_BYTES` stops it (OutputTooLarge)."""
        ...

    def put_file(self, local_path: str, remote_path: str, *, mode: int = 0o755) -> None:
        """Copy a file to the instance (SFTP for SSH)."""
        ...


class AgentClient(Protocol):
    """The agent on one instance, uploaded when missing or of another version."""

    def ensure_agent(self) -> str:
        """Upload the zipapp if needed; return the agent version running there."""
        ...

    def status(self) -> StatusSnapshot:
        """``gpu-agent status --json``."""
        ...

    def health(
        self,
        *,
        full: bool = False,
        python: str | None = None,
        expect_gpu: str | None = None,
        expect_count: int | None = None,
    ) -> HealthReport:
        """``gpu-agent health --json``; a failing check is a report, not an error."""
        ...

    def run(
        self,
        command: Sequence[str],
        *,
        gpus: str | None = None,
        name: str | None = None,
        retries: int = 0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> JobRecord:
        """``gpu-agent run --json ... -- CMD``; the command arrives exactly as given."""
        ...

    def jobs(self, *, since: str | None = None) -> JobList:
        """``gpu-agent jobs --json [--since ISO]``."""
        ...

    def logs(self, job_id: str, *, tail: int | None = None) -> str:
        """``gpu-agent logs JOB [--tail N]``."""
        ...

    def cancel(self, job_id: str) -> JobRecord:
        """``gpu-agent cancel --json JOB``."""
        ...

    def who(self) -> WhoReport:
        """``gpu-agent who --json``."""
        ...
