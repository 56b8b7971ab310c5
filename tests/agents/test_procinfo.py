"""agents.procinfo: CPU use, resident memory and age of GPU processes from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents import procinfo
from tests.agents.spinning import SpinningChild, assert_reads_what_it_used, measured

HZ = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def write_proc(root: Path, pid: int, utime: int, stime: int, start: int, rss_pages: int) -> None:
    """A /proc/<pid>/stat and statm as the kernel writes them (the command holds a space and a
    parenthesis, as real ones can)."""
    where = root / str(pid)
    where.mkdir(parents=True, exist_ok=True)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "0", "0", "0", "0"]
    fields += [str(utime), str(stime), "5", "6", "20", "0", "8", "0", str(start)]
    fields += ["123456789", "42"]
    (where / "stat").write_text(f"{pid} (python (x) y) " + " ".join(fields) + "\n")
    (where / "statm").write_text(f"9999 {rss_pages} 100 10 0 200 0\n")


class FakeTime:
    """A clock that only moves when ``sleep`` is called; ``on_sleep`` runs meanwhile."""

    def __init__(self, on_sleep=None) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.on_sleep = on_sleep

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep()


def test_cpu_rss_and_age_over_the_window(tmp_path):
    proc = tmp_path / "proc"
    (proc).mkdir()
    (proc / "uptime").write_text("5000.50 9000.00\n")
    write_proc(proc, 42, utime=1000, stime=200, start=400 * HZ, rss_pages=2560)
    write_proc(proc, 43, utime=10, stime=0, start=4990 * HZ, rss_pages=10)

    def busy() -> None:  # pid 42 uses 1.5 cores over the 0.5 s window; pid 43 is idle
        write_proc(
            proc,
            42,
            utime=1000 + int(0.6 * HZ),
            stime=200 + int(0.15 * HZ),
            start=400 * HZ,
            rss_pages=2560,
        )

    fake = FakeTime(busy)
    found = procinfo.sample(
        [42, 43], window_s=0.5, proc=str(proc), clock=fake.clock, sleep=fake.sleep
    )
    assert fake.slept == [0.5]
    assert found[42] == {"cpu_pct": 150.0, "rss_bytes": 2560 * PAGE, "elapsed_s": 4600.5}
    assert found[43]["cpu_pct"] == 0.0
    assert found[43]["elapsed_s"] == 10.5


def test_a_process_that_goes_away_or_is_reused_gets_no_cpu(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text("100.0 1.0\n")
    write_proc(proc, 7, utime=1, stime=1, start=10 * HZ, rss_pages=1)
    write_proc(proc, 8, utime=1, stime=1, start=10 * HZ, rss_pages=1)

    def churn() -> None:
        (proc / "7" / "stat").unlink()  # exited
        write_proc(proc, 8, utime=500, stime=0, start=60 * HZ, rss_pages=3)  # pid reused

    fake = FakeTime(churn)
    found = procinfo.sample(
        [7, 8], window_s=0.2, proc=str(proc), clock=fake.clock, sleep=fake.sleep
    )
    assert 7 not in found
    assert found[8]["cpu_pct"] is None
    assert found[8]["rss_bytes"] == 3 * PAGE


def test_nothing_readable_means_no_wait(tmp_path):
    fake = FakeTime()
    assert (
        procinfo.sample(
            [123456789], window_s=1.0, proc=str(tmp_path), clock=fake.clock, sleep=fake.sleep
        )
        == {}
    )
    assert fake.slept == []


def test_join_fills_status_documents_in_place(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text("100.0 1.0\n")
    write_proc(proc, 42, utime=0, stime=0, start=40 * HZ, rss_pages=4)
    docs = [
        {"gpu_index": 0, "pid": 42, "cpu_pct": None, "rss_bytes": None, "elapsed_s": None},
        {"gpu_index": 1, "pid": 42, "cpu_pct": None, "rss_bytes": None, "elapsed_s": None},
        {"gpu_index": 1, "pid": 99, "cpu_pct": None, "rss_bytes": None, "elapsed_s": None},
    ]
    fake = FakeTime()
    procinfo.join(docs, window_s=0.1, proc=str(proc), clock=fake.clock, sleep=fake.sleep)
    assert [d["elapsed_s"] for d in docs] == [60.0, 60.0, None]
    assert docs[0]["rss_bytes"] == docs[1]["rss_bytes"] == 4 * PAGE
    assert docs[0]["cpu_pct"] == 0.0


def test_a_real_busy_process():
    found: dict[int, dict] = {}
    with SpinningChild() as child:
        used_s, span_s = measured(
            child, lambda: found.update(procinfo.sample([child.pid, os.getpid()], window_s=0.3))
        )
    busy = found[child.pid]
    # One core spinning: 100 % on an idle machine, its share of the cores on a loaded one,
    # as the child itself counts it.
    assert_reads_what_it_used(busy["cpu_pct"], 0.3, used_s, span_s)
    assert busy["rss_bytes"] > 1024**2
    assert 0 <= busy["elapsed_s"] < 60
    assert found[os.getpid()]["cpu_pct"] is not None


@pytest.mark.parametrize(
    ("raw", "window"),
    [
        (None, procinfo.DEFAULT_CPU_WINDOW_S),
        ("", procinfo.DEFAULT_CPU_WINDOW_S),
        ("0", 0.0),
        ("0.5", 0.5),
        ("5", 5.0),
        ("5.01", procinfo.MAX_CPU_WINDOW_S),
        ("-1", procinfo.DEFAULT_CPU_WINDOW_S),
        ("nan", procinfo.DEFAULT_CPU_WINDOW_S),
        ("soon", procinfo.DEFAULT_CPU_WINDOW_S),
    ],
)
def test_cpu_window_from_the_environment(monkeypatch, raw, window):
    if raw is None:
        monkeypatch.delenv(procinfo.ENV_CPU_WINDOW_S, raising=False)
    else:
        monkeypatch.setenv(procinfo.ENV_CPU_WINDOW_S, raw)
    assert procinfo.cpu_window_s() == window


def test_read_stat_survives_garbage(tmp_path):
    (tmp_path / "5").mkdir()
    (tmp_path / "5" / "stat").write_text("5 (x) S 1 2")
    assert procinfo.read_stat(5, str(tmp_path)) is None
    assert procinfo.read_stat(6, str(tmp_path)) is None
