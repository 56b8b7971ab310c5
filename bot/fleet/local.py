"""The instance ``local``: the machine the bot runs on, reached without SSH.

Commands run as subprocesses (never through a shell) in the user's home directory, so relative
paths mean the same as over SSH; a missing program reads like a shell's "command not found"
(exit 127) so the agent client treats both transports alike. Output is read up to the same caps
as over SSH: a command printing more is killed.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from bot.errors import CommandTimeout, FleetError
from bot.fleet.base import (
    LOCAL_HOST,
    MAX_STDERR_BYTES,
    MAX_STDOUT_BYTES,
    ExecResult,
    output_too_large,
)
from bot.i18n import t

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
_READ_CHUNK = 65536
_WRITE_CHUNK = 65536


class LocalTransport:
    """Runs argv on this machine; ``home`` (default the user's) is the working directory.
    A command may print at most ``max_stdout_bytes`` and ``max_stderr_bytes``."""

    def __init__(
        self,
        *,
        home: Path | None = None,
        name: str = LOCAL_HOST,
        max_stdout_bytes: int = MAX_STDOUT_BYTES,
        max_stderr_bytes: int = MAX_STDERR_BYTES,
    ) -> None:
        self.home = home if home is not None else Path.home()
        self.name = name
        self.max_stdout_bytes = max_stdout_bytes
        self.max_stderr_bytes = max_stderr_bytes

    def exec(
        self, argv: Sequence[str], *, timeout_s: float, stdin: bytes | None = None
    ) -> ExecResult:
        """Run argv; the process is killed and CommandTimeout raised after ``timeout_s``
        seconds, OutputTooLarge once it prints past a cap."""
        if not argv:
            raise ValueError("empty argv")
        deadline = time.monotonic() + timeout_s
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.home,
            )
        except FileNotFoundError:
            return ExecResult(EXIT_NOT_FOUND, "", f"{argv[0]}: No such file or directory\n")
        except PermissionError:
            return ExecResult(EXIT_NOT_EXECUTABLE, "", f"{argv[0]}: Permission denied\n")
        try:
            out, err = self._communicate(proc, stdin or b"", deadline)
            exit_code = proc.wait(max(0.0, deadline - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired) as exc:
            raise CommandTimeout(
                f"{self.name}: the command did not finish within {timeout_s:g} s",
                instance=self.name,
                hint="Try again; if it keeps happening this machine may be overloaded.",
            ) from exc
        finally:
            _stop(proc)
        return ExecResult(
            exit_code=exit_code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
        )

    def put_file(self, local_path: str, remote_path: str, *, mode: int = 0o755) -> None:
        """Copy to a temporary name beside the destination, then rename into place."""
        dest = self.home / Path(remote_path).expanduser()
        temp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local_path, temp)
            os.chmod(temp, mode)
            os.replace(temp, dest)
        except OSError as exc:
            _remove_quietly(temp)
            raise FleetError(
                t(
                    "could not copy {name} to {dest}: {exc}",
                    name=Path(local_path).name,
                    dest=dest,
                    exc=exc,
                ),
                instance=self.name,
                hint=t("Check free disk space and write permission on this machine."),
            ) from exc

    def _communicate(
        self, proc: subprocess.Popen[bytes], stdin: bytes, deadline: float
    ) -> tuple[bytearray, bytearray]:
        """Feed ``stdin`` and read both outputs until they close (not past their caps).

        Raises TimeoutError at ``deadline`` (time.monotonic), OutputTooLarge past a cap."""
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        out, err = bytearray(), bytearray()
        readers: dict[int, tuple[bytearray, int, str]] = {
            proc.stdout.fileno(): (out, self.max_stdout_bytes, "stdout"),
            proc.stderr.fileno(): (err, self.max_stderr_bytes, "stderr"),
        }
        with selectors.DefaultSelector() as selector:
            for fd in readers:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            pending = memoryview(stdin)
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                for key, _ in selector.select(remaining):
                    fd = int(key.fd)
                    if fd not in readers:
                        pending = _feed(proc.stdin, pending)
                        if not pending:
                            selector.unregister(fd)
                            proc.stdin.close()
                        continue
                    buffer, cap, stream = readers[fd]
                    data = os.read(fd, _READ_CHUNK)
                    if not data:
                        selector.unregister(fd)
                        continue
                    buffer += data
                    if len(buffer) > cap:
                        raise output_too_large(self.name, stream, cap)
        return out, err


def _feed(pipe: IO[bytes], pending: memoryview) -> memoryview:
    """Write what the pipe takes now; the rest (empty once written, or when the command
    closed its input)."""
    try:
        written = os.write(pipe.fileno(), pending[:_WRITE_CHUNK])
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[:0]
    return pending[written:]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        return
