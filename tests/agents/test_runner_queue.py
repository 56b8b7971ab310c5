"""The runner's pure parts and its store: GPU requests, the FIFO plan, /proc, times, logs."""

from __future__ import annotations

import os
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agents import runner
from agents.runner import GpuRequest, JobStore, plan_starts


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, GpuRequest()),
        ("0", GpuRequest()),
        ("2", GpuRequest(count=2)),
        ("all", GpuRequest(count=-1)),
        ("0,1", GpuRequest(count=2, indices=(0, 1))),
        ("3,1", GpuRequest(count=2, indices=(1, 3))),
        ("3,", GpuRequest(count=1, indices=(3,))),
        (" 0, 2 ", GpuRequest(count=2, indices=(0, 2))),
    ],
)
def test_parse_gpus(text, expected):
    assert runner.parse_gpus(text) == expected


@pytest.mark.parametrize("text", ["", ",", "a", "1,,2", "-1", "1.5", "0,0", "gpu0"])
def test_parse_gpus_rejects(text):
    with pytest.raises(runner.JobRequestError):
        runner.parse_gpus(text)


def test_gpu_request_text_round_trips():
    for text in ("2", "0,1", "3,"):
        assert runner.parse_gpus(runner.parse_gpus(text).text) == runner.parse_gpus(text)
    assert GpuRequest().text is None


def test_resolve_request():
    assert runner.resolve_request(GpuRequest(), [], "none") == GpuRequest()
    assert runner.resolve_request(GpuRequest(count=-1), [0, 1, 2], "") == GpuRequest(3, (0, 1, 2))
    assert runner.resolve_request(GpuRequest(count=2), [0, 1], "") == GpuRequest(count=2)
    with pytest.raises(runner.JobError, match="no NVIDIA GPU can be used here \\(no driver\\)"):
        runner.resolve_request(GpuRequest(count=1), [], "no driver")
    with pytest.raises(runner.JobRequestError, match="more GPUs than this machine has \\(2\\)"):
        runner.resolve_request(GpuRequest(count=3), [0, 1], "")
    with pytest.raises(runner.JobRequestError, match="names GPU 5"):
        runner.resolve_request(GpuRequest(2, (0, 5)), [0, 1], "")


def q(*items: tuple[str, str | None]) -> list[tuple[str, GpuRequest]]:
    return [(job_id, runner.parse_gpus(text)) for job_id, text in items]


def test_plan_first_come_first_served_on_free_gpus():
    plan = plan_starts(q(("a", "2"), ("b", "1"), ("c", "2")), [0, 1, 2, 3], [])
    assert plan == {"a": (0, 1), "b": (2,)}  # c waits: only GPU 3 is left


def test_plan_nothing_starts_on_busy_gpus():
    assert plan_starts(q(("a", "0,"), ("b", "1")), [0, 1], [0, 1]) == {}


def test_plan_exact_request_reserves_its_gpus_for_itself():
    # a waits for GPU 0 (busy); b wants any one GPU and may take GPU 1 but never GPU 0.
    plan = plan_starts(q(("a", "0,1"), ("b", "1"), ("c", "2,")), [0, 1, 2], [0])
    assert plan == {"b": (2,)}  # GPU 1 is reserved for a; c's GPU 2 went to b first


def test_plan_exact_requests_on_other_gpus_pass_a_waiting_exact_one():
    plan = plan_starts(q(("a", "0,"), ("b", "1,")), [0, 1], [0])
    assert plan == {"b": (1,)}


def test_plan_waiting_count_request_holds_back_every_gpu_job_behind_it():
    plan = plan_starts(q(("a", "2"), ("b", "1"), ("c", "3,"), ("d", None)), [0, 1, 2, 3], [0, 1, 2])
    assert plan == {"d": ()}  # a needs two; b and c would delay it; d needs no GPU


def test_plan_jobs_without_gpus_always_start():
    assert plan_starts(q(("a", None), ("b", None)), [], []) == {"a": (), "b": ()}


def test_plan_exact_request_for_a_missing_gpu_never_starts():
    assert plan_starts(q(("a", "7,"), ("b", "1")), [0, 1], []) == {"b": (0,)}


def test_proc_stat_of_this_process():
    me = runner.proc_stat(os.getpid())
    assert me is not None
    assert me.running
    assert me.ppid == os.getppid()
    assert me.session == os.getsid(0)
    assert me.pgrp == os.getpgrp()
    assert runner.pid_alive(os.getpid(), me.start_ticks)
    assert not runner.pid_alive(os.getpid(), me.start_ticks + 1)  # a reused pid is not ours
    assert not runner.pid_alive(None, None)


def test_proc_stat_parses_names_with_spaces_and_parentheses(tmp_path: Path):
    odd = tmp_path / "odd) name ("
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "5"])
    try:
        stat = runner.proc_stat(proc.pid)
        assert stat is not None
        assert stat.ppid == os.getpid()
    finally:
        proc.kill()
        proc.wait()
    assert runner.proc_stat(proc.pid) is None


def test_session_members_and_stop_session():
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    try:
        start = runner.proc_stat(proc.pid).start_ticks
        for _ in range(100):
            if len(runner.session_members(proc.pid, start)) == 3:
                break
            threading.Event().wait(0.02)
        assert len(runner.session_members(proc.pid, start)) == 3
        assert runner.session_members(proc.pid, start + 1) == []  # leader pid reused: not ours
        runner.stop_session(proc.pid, start, grace_s=2.0)
        proc.wait(timeout=5)
        assert runner.session_members(proc.pid, start) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_iso_times():
    now = runner.parse_iso(runner.iso_now())
    assert now.tzinfo is not None
    assert abs((datetime.now(UTC) - now).total_seconds()) < 5
    assert runner.parse_iso("2026-12-02T11:00:00Z") == datetime(2026, 12, 2, 11, tzinfo=UTC)
    assert runner.parse_iso("2026-12-02T12:00:00+01:00") == runner.parse_iso("2026-12-02T11:00:00")
    assert runner.parse_iso("") == datetime.min.replace(tzinfo=UTC)
    with pytest.raises(ValueError, match="yesterday"):
        runner.parse_iso("yesterday")


def test_tail_lines(tmp_path: Path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert runner.tail_lines(str(path), 3) == "line 99997\nline 99998\nline 99999\n"
    assert runner.tail_lines(str(path), 0) == ""
    assert runner.tail_lines(str(path), 5, max_chars=12) == "\nline 99999\n"
    path.write_text("no newline at the end")
    assert runner.tail_lines(str(path), 10) == "no newline at the end"
    path.write_bytes(b"bad \xff byte\n")
    assert runner.tail_lines(str(path), 1) == "bad \ufffd byte\n"


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
    with pytest.raises(runner.JobNotFound, match="matches 2 jobs"):
        store.resolve(a[:8])
    with pytest.raises(runner.JobNotFound, match="no job 'zzz'"):
        store.resolve("zzz")


def test_reap_lost_marks_jobs_without_a_live_supervisor(tmp_path: Path):
    store = JobStore(str(tmp_path / "home"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    me = runner.proc_stat(os.getpid())
    with store.locked():
        orphan = store.create({"state": "queued", "supervisor_pid": None})
        gone = store.create(
            {"state": "running", "supervisor_pid": dead.pid, "started_at": runner.iso_now()}
        )
        alive = store.create(
            {"state": "queued", "supervisor_pid": os.getpid(), "supervisor_start": me.start_ticks}
        )
        reused = store.create(
            {
                "state": "queued",
                "supervisor_pid": os.getpid(),
                "supervisor_start": me.start_ticks - 1,
            }
        )
        assert sorted(runner.reap_lost(store)) == sorted([orphan, gone, reused])
        assert runner.reap_lost(store) == []
    assert store.read(alive)["state"] == "queued"
    assert [m["id"] for m in store.active_metas()] == [alive]
    lost = store.read(gone)
    assert lost["state"] == "lost"
    assert lost["finished_at"]
    assert lost["summary"]["duration_s"] >= 0
    assert lost["summary"]["log_tail"] == ""
    assert store.read(orphan)["summary"] is None


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
