"""What the rest of the bot needs from the fleet: targets, transports and the agent client API.

Every method raises bot.errors.FleetError subclasses (Unreachable, AuthenticationFailed,
HostKeyChanged, AgentMissing, AgentBroken, CommandTimeout); nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from agents.protocol import HealthReport, JobList, JobRecord, StatusSnapshot, WhoReport

LOCAL_HOST = "local"


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


class Transport(Protocol):
    """Runs argv on an instance (never through a shell on the bot's side) and copies files."""

    def exec(
        self, argv: Sequence[str], *, timeout_s: float, stdin: bytes | None = None
    ) -> ExecResult:
        """Run a command; argv is quoted for the remote shell, never joined unquoted."""
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
