"""The instance ``local``: the machine the bot runs on, reached without SSH.

Commands run as subprocesses (never through a shell) in the user's home directory, so relative
paths mean the same as over SSH; a missing program reads like a shell's "command not found"
(exit 127) so the agent client treats both transports alike.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

from bot.errors import CommandTimeout, FleetError
from bot.fleet.base import LOCAL_HOST, ExecResult

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126


class LocalTransport:
    """Runs argv on this machine; ``home`` (default the user's) is the working directory."""

    def __init__(self, *, home: Path | None = None, name: str = LOCAL_HOST) -> None:
        self.home = home if home is not None else Path.home()
        self.name = name

    def exec(
        self, argv: Sequence[str], *, timeout_s: float, stdin: bytes | None = None
    ) -> ExecResult:
        """Run argv; raises CommandTimeout (the process is killed) after ``timeout_s`` seconds."""
        if not argv:
            raise ValueError("empty argv")
        try:
            done = subprocess.run(
                list(argv),
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout_s,
                cwd=self.home,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(
                f"{self.name}: the command did not finish within {timeout_s:g} s",
                instance=self.name,
                hint="Try again; if it keeps happening this machine may be overloaded.",
            ) from exc
        except FileNotFoundError:
            return ExecResult(EXIT_NOT_FOUND, "", f"{argv[0]}: No such file or directory\n")
        except PermissionError:
            return ExecResult(EXIT_NOT_EXECUTABLE, "", f"{argv[0]}: Permission denied\n")
        return ExecResult(
            exit_code=done.returncode,
            stdout=done.stdout.decode("utf-8", errors="replace"),
            stderr=done.stderr.decode("utf-8", errors="replace"),
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
                f"could not copy {Path(local_path).name} to {dest}: {exc}",
                instance=self.name,
                hint="Check free disk space and write permission on this machine.",
            ) from exc


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        return
