"""The job store on the instance: one directory of state files per job, under a lock.

Standard library only, Python 3.9. State lives under ``GPU_AGENT_HOME`` (default
``~/.gpu-agent``)::

    lock                     flock'ed by everything that changes a job
    seq                      the last submission number (the queue's FIFO order)
    active/<id>              an empty file for every job that is not final yet
    jobs/<id>/meta.json      the job: JobRecord fields plus private ones, replaced atomically
    jobs/<id>/log            the job's stdout and stderr, all attempts
    jobs/<id>/supervisor.log the supervisor's own errors

Times are ISO 8601 UTC strings.
"""

from __future__ import annotations

import json
import os
import secrets
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from typing import Any, Dict, Iterator, List, Mapping, Optional

from agents.protocol import JobError, JobNotFound, JobRecord, from_dict

ENV_HOME = "GPU_AGENT_HOME"


class JobStore:
    """The jobs under one GPU_AGENT_HOME. Change a job only inside ``with store.locked():``."""

    def __init__(self, home: str) -> None:
        self.home = os.path.abspath(os.path.expanduser(home))
        self.jobs_dir = os.path.join(self.home, "jobs")
        self.active_dir = os.path.join(self.home, "active")
        self.lock_path = os.path.join(self.home, "lock")
        self.seq_path = os.path.join(self.home, "seq")

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> JobStore:
        """The store named by GPU_AGENT_HOME (default ~/.gpu-agent)."""
        env = os.environ if env is None else env
        return cls(env.get(ENV_HOME) or os.path.join("~", ".gpu-agent"))

    def ensure(self) -> None:
        """Create the directories (private to the user)."""
        for path in (self.home, self.jobs_dir, self.active_dir):
            os.makedirs(path, mode=0o700, exist_ok=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's exclusive lock (fcntl.flock) for the block."""
        import fcntl

        self.ensure()
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def job_dir(self, job_id: str) -> str:
        return os.path.join(self.jobs_dir, job_id)

    def log_path(self, job_id: str) -> str:
        return os.path.join(self.jobs_dir, job_id, "log")

    def read(self, job_id: str) -> Dict[str, Any]:
        """A job's metadata. Raises JobNotFound."""
        try:
            with open(os.path.join(self.jobs_dir, job_id, "meta.json"), encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError as exc:
            raise JobNotFound(f"no job {job_id!r} on this machine") from exc
        except ValueError as exc:
            raise JobError(f"job {job_id!r} has unreadable metadata: {exc}") from exc
        if not isinstance(data, dict):
            raise JobError(f"job {job_id!r} has unreadable metadata")
        return data

    def write(self, meta: Dict[str, Any]) -> None:
        """Replace a job's metadata atomically (temporary file, fsync, rename), stamping
        ``updated_at``."""
        meta["updated_at"] = iso_now()
        path = os.path.join(self.jobs_dir, meta["id"], "meta.json")
        _write_atomic(path, json.dumps(meta, sort_keys=True, indent=1).encode("utf-8"))

    def finish(self, meta: Dict[str, Any]) -> None:
        """Write a job that reached a final state and drop it from the active set."""
        self.write(meta)
        with suppress(FileNotFoundError):
            os.unlink(os.path.join(self.active_dir, meta["id"]))

    def all_ids(self) -> List[str]:
        try:
            return sorted(n for n in os.listdir(self.jobs_dir) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def active_ids(self) -> List[str]:
        try:
            return sorted(os.listdir(self.active_dir))
        except FileNotFoundError:
            return []

    def active_metas(self) -> List[Dict[str, Any]]:
        """Metadata of every job not yet final, in FIFO order."""
        metas = []
        for job_id in self.active_ids():
            try:
                metas.append(self.read(job_id))
            except JobNotFound:
                _unlink_quietly(os.path.join(self.active_dir, job_id))
        return sorted(metas, key=lambda m: m.get("seq", 0))

    def create(self, meta: Dict[str, Any]) -> str:
        """Give ``meta`` a new unique id and FIFO number, write it and mark it active (locked)."""
        seq = self._next_seq()
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        for _ in range(50):
            job_id = f"{stamp}-{secrets.token_hex(2)}"
            try:
                os.mkdir(self.job_dir(job_id), 0o700)
            except FileExistsError:
                continue
            meta.update(id=job_id, seq=seq)
            self.write(meta)
            with open(os.path.join(self.active_dir, job_id), "wb"):
                pass
            return job_id
        raise JobError("could not pick a new job id; try again")

    def resolve(self, ref: str) -> str:
        """The id of the job ``ref`` names: its id, a unique prefix of it, or a unique name."""
        ids = self.all_ids()
        if ref in ids:
            return ref
        matches = [i for i in ids if i.startswith(ref)] if ref else []
        if not matches:
            matches = [i for i in ids if _safe_name(self, i) == ref]
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(matches[:5])
            raise JobNotFound(f"{ref!r} matches {len(matches)} jobs ({shown}); give more of the id")
        raise JobNotFound(f"no job {ref!r} on this machine; `gpu-agent jobs` lists them")

    def _next_seq(self) -> int:
        try:
            with open(self.seq_path, encoding="utf-8") as fh:
                current = int(fh.read().strip() or "0")
        except (FileNotFoundError, ValueError):
            current = 0
        _write_atomic(self.seq_path, str(current + 1).encode("ascii"))
        return current + 1


def record_of(meta: Mapping[str, Any]) -> JobRecord:
    """The public JobRecord in a job's metadata."""
    return from_dict(JobRecord, dict(meta))


def iso_now() -> str:
    """Now, as ISO 8601 UTC with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def parse_iso(text: str) -> datetime:
    """An ISO 8601 time as aware UTC (naive means UTC; a trailing Z is accepted).
    Raises ValueError; an empty string is the earliest time."""
    if not text:
        return datetime.min.replace(tzinfo=timezone.utc)
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    moment = datetime.fromisoformat(raw)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def tail_lines(path: str, lines: int, max_chars: Optional[int] = None) -> str:
    """The last ``lines`` lines of a file (read from its end), at most ``max_chars`` long."""
    if lines <= 0:
        return ""
    block = 64 * 1024
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        pos = end
        data = b""
        while pos > 0 and data.count(b"\n") <= lines:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
            if max_chars is not None and len(data) > max_chars * 4:
                break
    text = data.decode("utf-8", "replace")
    kept = text.splitlines()[-lines:]
    out = "\n".join(kept)
    if text.endswith("\n") and kept:
        out += "\n"
    if max_chars is not None and len(out) > max_chars:
        out = out[-max_chars:]
    return out


def _safe_name(store: JobStore, job_id: str) -> Optional[str]:
    try:
        name = store.read(job_id).get("name")
    except JobError:
        return None
    return name if isinstance(name, str) else None


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _unlink_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)
