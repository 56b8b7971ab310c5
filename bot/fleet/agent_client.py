"""The agent on one instance, run over a Transport and answered in its JSON schema.

The zipapp is uploaded as ``gpu-agent-<sha256[:12]>.pyz``: the file name is the version, so an
instance holding another build simply lacks this name. Nothing is checked up front: a command
runs, and when Python reports that the file is missing the client uploads it and runs the
command once more. Exit 127/126 (no Python) means AgentMissing; output that is not the
expected JSON means AgentBroken, with the tail of stderr.
"""

from __future__ import annotations

import hashlib
import posixpath
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from agents.protocol import (
    HealthReport,
    JobFailure,
    JobList,
    JobRecord,
    ProtocolError,
    StatusSnapshot,
    VersionInfo,
    WhoReport,
    loads,
)
from bot.errors import AgentBroken, AgentMissing, FleetError
from bot.fleet.base import ExecResult, Target, Transport
from bot.i18n import t

#: Where the zipapp goes, relative to the login directory (or under GPU_AGENT_HOME when set).
INSTALL_DIR = ".gpubot"
DEFAULT_TIMEOUT_S = 120.0
_STDERR_TAIL_CHARS = 600
_MISSING_FILE = "can't open file"
_EXIT_USAGE = 2
_EXIT_FAILED = 1
_EXIT_NO_PROGRAM = (126, 127)

D = TypeVar("D")


class AgentRefused(AgentBroken):
    """A job command failed and the agent said why as a document (``failure``: its code,
    English, template and parameters); the message is as for any AgentBroken."""

    def __init__(self, message: str, *, failure: JobFailure, instance: str | None = None) -> None:
        super().__init__(message, instance=instance)
        self.failure = failure


_digest_lock = threading.Lock()
_digests: dict[tuple[str, int, int], str] = {}


class RemoteAgent:
    """AgentClient for one target. ``agent_home`` (default ``target.agent_home``) becomes
    ``GPU_AGENT_HOME``; ``python`` (default ``target.python_path`` or ``python3``) runs it."""

    def __init__(
        self,
        transport: Transport,
        *,
        target: Target,
        zipapp_path: Path,
        agent_home: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        python: str | None = None,
        install_dir: str | None = None,
    ) -> None:
        self.transport = transport
        self.target = target
        self.zipapp_path = Path(zipapp_path)
        self.agent_home = agent_home if agent_home is not None else target.agent_home
        self.timeout_s = timeout_s
        self.python = python or target.python_path or "python3"
        if install_dir is None:
            install_dir = (
                posixpath.join(self.agent_home, INSTALL_DIR) if self.agent_home else INSTALL_DIR
            )
        self.install_dir = install_dir
        #: How many times this client uploaded the zipapp.
        self.uploads = 0

    @property
    def remote_path(self) -> str:
        """The zipapp's path on the instance; it names the build's content hash."""
        return posixpath.join(self.install_dir, f"gpu-agent-{self._digest()[:12]}.pyz")

    def ensure_agent(self) -> str:
        """Upload the zipapp if this build is not there; return the agent version it reports."""
        return self._call(VersionInfo, ["version", "--json"]).agent_version

    def status(self) -> StatusSnapshot:
        """``gpu-agent status --json``."""
        return self._call(StatusSnapshot, ["status", "--json"])

    def health(
        self,
        *,
        full: bool = False,
        python: str | None = None,
        expect_gpu: str | None = None,
        expect_count: int | None = None,
    ) -> HealthReport:
        """``gpu-agent health --json``; exit 1 (a failing check) is a report, not an error."""
        args = ["health", "--json"]
        if full:
            args.append("--full")
        if python:
            args += ["--python", python]
        if expect_gpu:
            args += ["--expect-gpu", expect_gpu]
        if expect_count is not None:
            args += ["--expect-count", str(expect_count)]
        return self._call(HealthReport, args, ok_codes=(0, _EXIT_FAILED))

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
        if not command:
            raise ValueError("run needs a command")
        args = ["run", "--json"]
        if gpus:
            args += ["--gpus", gpus]
        if name:
            args += ["--name", name]
        if retries:
            args += ["--retries", str(retries)]
        for key, value in (env or {}).items():
            args += ["--env", f"{key}={value}"]
        if cwd:
            args += ["--cwd", cwd]
        return self._call(JobRecord, [*args, "--", *command])

    def jobs(self, *, since: str | None = None) -> JobList:
        """``gpu-agent jobs --json [--since ISO]``."""
        args = ["jobs", "--json"]
        if since:
            args += ["--since", since]
        return self._call(JobList, args)

    def logs(self, job_id: str, *, tail: int | None = None) -> str:
        """``gpu-agent logs JOB [--tail N]``: the log text."""
        args = ["logs", job_id]
        if tail is not None:
            args += ["--tail", str(tail)]
        return self._checked(self._run_agent(args), args).stdout

    def cancel(self, job_id: str) -> JobRecord:
        """``gpu-agent cancel --json JOB``."""
        return self._call(JobRecord, ["cancel", "--json", job_id])

    def who(self) -> WhoReport:
        """``gpu-agent who --json``."""
        return self._call(WhoReport, ["who", "--json"])

    def argv(self, args: Sequence[str]) -> list[str]:
        """The full argv that runs the agent with ``args`` on the instance."""
        prefix = ["env", f"GPU_AGENT_HOME={self.agent_home}"] if self.agent_home else []
        return [*prefix, self.python, "-I", self.remote_path, *args]

    # --- running --------------------------------------------------------------------------

    def _call(self, cls: type[D], args: list[str], *, ok_codes: tuple[int, ...] = (0,)) -> D:
        result = self._checked(self._run_agent(args), args, ok_codes=ok_codes)
        try:
            return loads(cls, result.stdout)
        except ProtocolError as exc:
            raise AgentBroken(
                t(
                    "{name}: gpu-agent {value} answered something that is not its "
                    "JSON ({exc}){tail}",
                    name=self.target.name,
                    value=args[0],
                    exc=exc,
                    tail=_tail(result),
                ),
                instance=self.target.name,
                hint=t(
                    "Check the instance's Python (3.9 or newer); the bot "
                    "re-uploads the agent when its version changes."
                ),
            ) from exc

    def _run_agent(self, args: list[str]) -> ExecResult:
        result = self._exec(args)
        if not self._file_missing(result):
            return result
        self._upload()
        result = self._exec(args)
        if self._file_missing(result):
            raise AgentMissing(
                t(
                    "{name}: gpu-agent is still missing at {remote_path} after uploading it{tail}",
                    name=self.target.name,
                    remote_path=self.remote_path,
                    tail=_tail(result),
                ),
                instance=self.target.name,
                hint=t("Check that the instance's disk is not full and its home is writable."),
            )
        return result

    def _exec(self, args: list[str]) -> ExecResult:
        return self.transport.exec(self.argv(args), timeout_s=self.timeout_s)

    def _checked(
        self, result: ExecResult, args: Sequence[str], *, ok_codes: tuple[int, ...] = (0,)
    ) -> ExecResult:
        if result.exit_code in ok_codes:
            return result
        if result.exit_code in _EXIT_NO_PROGRAM:
            raise AgentMissing(
                t(
                    "{name}: cannot run {python} on the instance{tail}",
                    name=self.target.name,
                    python=self.python,
                    tail=_tail(result),
                ),
                instance=self.target.name,
            )
        message = t(
            "{name}: gpu-agent {value} failed with exit code {exit_code}{tail}",
            name=self.target.name,
            value=args[0],
            exit_code=result.exit_code,
            tail=_tail(result),
        )
        failure = _failure(result)
        if failure is not None:
            raise AgentRefused(message, failure=failure, instance=self.target.name)
        raise AgentBroken(message, instance=self.target.name)

    def _file_missing(self, result: ExecResult) -> bool:
        return (
            result.exit_code == _EXIT_USAGE
            and _MISSING_FILE in result.stderr
            and posixpath.basename(self.remote_path) in result.stderr
        )

    def _upload(self) -> None:
        try:
            self.transport.put_file(str(self.zipapp_path), self.remote_path, mode=0o644)
        except FleetError as exc:
            if type(exc) is not FleetError:
                raise
            raise AgentMissing(
                t(
                    "{name}: could not upload gpu-agent: {message}",
                    name=self.target.name,
                    message=exc.message,
                ),
                instance=self.target.name,
                hint=exc.hint or None,
            ) from exc
        self.uploads += 1

    def _digest(self) -> str:
        return zipapp_digest(self.zipapp_path)


def zipapp_digest(path: Path) -> str:
    """The SHA-256 hex digest of the zipapp (cached while its size and mtime stay).

    Raises AgentMissing when the file is not there (the bot's build step did not run).
    """
    try:
        stat = path.stat()
    except OSError as exc:
        raise AgentMissing(
            t("the agent build {path} is missing on the bot's machine", path=path),
            hint=t("Build it with `make agent` (python -m agents.zipapp dist/gpu-agent.pyz)."),
        ) from exc
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _digest_lock:
        cached = _digests.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with _digest_lock:
        _digests[key] = digest
    return digest


def _failure(result: ExecResult) -> JobFailure | None:
    """The error document a job command printed with ``--json``, if it printed one."""
    if not result.stdout.lstrip().startswith("{"):
        return None
    try:
        return loads(JobFailure, result.stdout)
    except ProtocolError:
        return None


def _tail(result: ExecResult) -> str:
    text = (result.stderr or result.stdout).strip()
    if not text:
        return ""
    if len(text) > _STDERR_TAIL_CHARS:
        text = "…" + text[-_STDERR_TAIL_CHARS:]
    return f"\n{text}"
