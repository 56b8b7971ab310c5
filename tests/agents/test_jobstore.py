"""The job store: ISO times, log tails, unique ids in FIFO order, resolving a job and atomic
metadata writes."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents import jobstore, protocol
from agents.jobstore import JobStore


def test_iso_times():
    now = jobstore.parse_iso(jobstore.iso_now())
    assert now.tzinfo is not None
    assert abs((datetime.now(UTC) - now).total_seconds()) < 5
    assert jobstore.parse_iso("2026-12-02T11:00:00Z") == datetime(2026, 12, 2, 11, tzinfo=UTC)
    eleven = jobstore.parse_iso("2026-12-02T11:00:00")
    assert jobstore.parse_iso("2026-12-02T12:00:00+01:00") == eleven
    assert jobstore.parse_iso("") == datetime.min.replace(tzinfo=UTC)
    with pytest.raises(ValueError, match="yesterday"):
        jobstore.parse_iso("yesterday")


def test_tail_lines(tmp_path: Path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert jobstore.tail_lines(str(path), 3) == "line 99997\nline 99998\nline 99999\n"
    assert jobstore.tail_lines(str(path), 0) == ""
    assert jobstore.tail_lines(str(path), 5, max_chars=12) == "\nline 99999\n"
    path.write_text("no newline at the end")
    assert jobstore.tail_lines(str(path), 10) == "no newline at the end"
    path.write_bytes(b"bad \xff byte\n")
    assert jobstore.tail_lines(str(path), 1) == "bad \ufffd byte\n"


def test_store_ids_are_unique_and_in_fifo_order(tmp_path: Path):
    store = JobStore(str(tmp_path / "home"))
    ids = []
    with store.locked():
        for _ in range(20):
            ids.append(store.create({"state": "queued", "command": ["true"]}))
    assert len(set(ids)) == 20
    assert [m["id"] for m in store.active_metas()] == ids
    assert [store.read(i)["seq"] for i in ids] == list(range(1, 21))
    assert oct(os.stat(store.home).st_mode & 0o777) == "0o700"


def test_store_resolve(tmp_path: Path):
    store = JobStore(str(tmp_path / "home"))
    with store.locked():
        a = store.create({"state": "queued", "name": "train"})
        b = store.create({"state": "queued", "name": None})
    assert store.resolve(a) == a
    assert store.resolve("train") == a
    unique = next(b[:n] for n in range(1, len(b) + 1) if not a.startswith(b[:n]))
    assert store.resolve(unique) == b
    with pytest.raises(protocol.JobNotFound, match="matches 2 jobs"):
        store.resolve(a[:8])
    with pytest.raises(protocol.JobNotFound, match="no job 'zzz'"):
        store.resolve("zzz")


def test_meta_writes_are_atomic_under_concurrent_readers(tmp_path: Path):
    store = JobStore(str(tmp_path / "home"))
    with store.locked():
        job_id = store.create({"state": "queued", "payload": "x" * 200_000})
    stop = threading.Event()
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                assert len(store.read(job_id)["payload"]) == 200_000
            except Exception as exc:  # collected and reported below
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(50):
            with store.locked():
                meta = store.read(job_id)
                meta["n"] = i
                store.write(meta)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert store.read(job_id)["n"] == 49
