"""The job subcommands of ``gpu-agent``: parsing, exit codes, JSON and text output."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agents import cli, jobs_cli, protocol
from agents.jobstore import JobStore
from agents.protocol import (
    JobList,
    JobRecord,
    JobSummary,
    ProcessSnapshot,
    WhoGpu,
    WhoJob,
    WhoReport,
)

WRITE_ARGV = (
    "import json, os, sys; "
    "json.dump(sys.argv[1:], open(os.path.join(os.environ['GPUBOT_JOB_DIR'], 'argv.json'), 'w'))"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "agent-home"
    monkeypatch.setenv("GPU_AGENT_HOME", str(path))
    monkeypatch.setenv("GPU_AGENT_QUEUE_POLL_S", "0.05")
    monkeypatch.setenv("GPU_AGENT_SAMPLE_S", "0.1")
    return path


def wait_final(home: Path, job_id: str) -> dict:
    store = JobStore(str(home))
    deadline = time.monotonic() + 20
    while store.read(job_id)["state"] not in protocol.FINAL_JOB_STATES:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return store.read(job_id)


def record(**changes) -> JobRecord:
    base = dict(
        id="20261202-110000-ab12",
        name=None,
        state="running",
        command=("python", "train.py", "--lr", "3e-4"),
        user="alice",
        gpus_requested="any:2",
        gpus_assigned=(0, 1),
        retries=1,
        attempt=1,
        created_at="2026-12-02T11:00:00.000+00:00",
        started_at="2026-12-02T11:00:01.000+00:00",
        finished_at=None,
        exit_code=None,
    )
    base.update(changes)
    return JobRecord(**base)


def test_job_commands_are_registered(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("run", "jobs", "logs", "cancel", "who"):
        assert name in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--retries", "x", "--", "true"], "not a whole number"),
        (["run", "--retries", "101", "--", "true"], "between 0 and 100"),
        (["logs"], "JOB"),
        (["logs", "abc", "--tail", "-1"], "0 or more"),
        (["cancel"], "JOB"),
        (["jobs", "--since"], "expected one argument"),
        (["run", "--env", "=x", "--", "true"], "NAME=VALUE"),
    ],
)
def test_usage_errors_exit_2(argv, message, home, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())


def test_run_json_strips_only_the_first_separator(home, capsys):
    code = cli.main(["run", "--json", "--", sys.executable, "-c", WRITE_ARGV, "--", "--gpus", "1"])
    assert code == 0
    job = protocol.loads(JobRecord, capsys.readouterr().out)
    assert job.state == "queued"
    assert job.attempt == 0
    # No --gpus on a machine without a usable GPU: the default became "none" (CPU only).
    assert job.gpus_requested == "none"
    assert job.command == (sys.executable, "-c", WRITE_ARGV, "--", "--gpus", "1")
    assert wait_final(home, job.id)["state"] == "succeeded"
    assert json.loads((home / "jobs" / job.id / "argv.json").read_text()) == ["--", "--gpus", "1"]


def test_run_without_separator_and_text_output(home, capsys):
    assert cli.main(["run", "--name", "hello", "echo", "hi there"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("queued job ")
    assert " on no GPU (CPU only): echo 'hi there'" in out
    job_id = out.split()[2]
    assert wait_final(home, job_id)["state"] == "succeeded"
    assert cli.main(["logs", "hello"]) == 0
    assert capsys.readouterr().out == "hi there\n"
    assert cli.main(["jobs"]) == 0
    table = capsys.readouterr().out
    assert job_id in table
    assert "succeeded" in table
    assert "1/1" in table


def test_jobs_json_and_empty_text(home, capsys):
    assert cli.main(["jobs"]) == 0
    assert capsys.readouterr().out == "no jobs\n"
    assert cli.main(["jobs", "--json"]) == 0
    assert protocol.loads(JobList, capsys.readouterr().out) == JobList(jobs=())


def test_cancel_and_logs_of_unknown_job_fail(home, capsys):
    assert cli.main(["cancel", "--json", "nope"]) == 1
    captured = capsys.readouterr()
    failure = protocol.loads(protocol.JobFailure, captured.out)
    assert (failure.code, failure.exit_code, failure.template) == ("job_not_found", 1, None)
    assert "no job 'nope'" in failure.message
    assert "no job 'nope'" in captured.err
    assert cli.main(["logs", "nope"]) == 1
    assert "gpu-agent jobs" in capsys.readouterr().err


def test_render_jobs_table():
    finished = record(
        state="failed",
        exit_code=1,
        attempt=2,
        command=("sh", "-c", "x" * 100),
        summary=JobSummary(duration_s=1.0, cpu_avg_pct=None, gpus=(), diagnoses=()),
    )
    table = jobs_cli.render_jobs(JobList(jobs=(record(), finished)))
    lines = table.splitlines()
    assert lines[0].split() == ["ID", "STATE", "GPUS", "TRY", "EXIT", "CREATED", "COMMAND"]
    assert lines[1].split()[:6] == [
        "20261202-110000-ab12",
        "running",
        "0,1",
        "1/2",
        "-",
        "2026-12-02",
    ]
    assert "python train.py --lr 3e-4" in lines[1]
    assert lines[2].split()[1:5] == ["failed", "0,1", "2/2", "1"]
    assert lines[2].endswith("…")
    assert len(lines[2].split("  ")[-1]) <= 60


def _who_job(job_id: str, state: str, gpus: tuple[int, ...], requested: str) -> WhoJob:
    return WhoJob(
        job_id=job_id,
        name="train" if job_id == "j-1" else None,
        user="alice",
        state=state,
        gpus=gpus,
        gpus_requested=requested,
        since="2026-03-01T12:00:00.000+00:00",
    )


def test_render_who():
    running = _who_job("j-1", "running", (0,), "0")
    starting = _who_job("j-2", "running", (1,), "1")
    report = WhoReport(
        gpus=(
            WhoGpu(
                index=0,
                name="NVIDIA H100 80GB HBM3",
                processes=(
                    ProcessSnapshot(
                        0,
                        42,
                        "alice",
                        "python train.py",
                        2 * 1024**3,
                        "j-1",
                        sm_util_pct=87,
                        mem_bw_util_pct=40,
                        cpu_pct=101.2,
                        rss_bytes=1024**3,
                        elapsed_s=3725,
                    ),
                    ProcessSnapshot(0, 43, None, None, None, None),
                ),
                util_gpu_pct=93,
                mem_used_bytes=3 * 1024**3,
                mem_total_bytes=80 * 1024**3,
                held_by=running,
            ),
            WhoGpu(index=1, name="NVIDIA H100 80GB HBM3", processes=(), held_by=starting),
            WhoGpu(
                index=2,
                name="NVIDIA H100 80GB HBM3",
                processes=(),
                waiting=(_who_job("j-3", "queued", (2,), "2"),),
            ),
            WhoGpu(
                index=3,
                name="NVIDIA H100 80GB HBM3",
                processes=(),
                util_gpu_pct=0,
                mem_used_bytes=20 * 1024**3,
                mem_total_bytes=80 * 1024**3,
            ),
        ),
        waiting_any=(_who_job("j-4", "queued", (), "any:2"),),
    )
    text = jobs_cli.render_who(report)
    assert text.splitlines() == [
        "GPU 0  NVIDIA H100 80GB HBM3  93% busy, 3.0 GiB of 80.0 GiB",
        "  held by job j-1 (train), alice",
        "  pid 42  alice  2048 MiB  SM 87%  CPU 101%  up 1h02m  job j-1  python train.py",
        "  pid 43  ?  ?  SM ?  CPU ?  up -  not an agent job",
        "GPU 1  NVIDIA H100 80GB HBM3",
        "  held by job j-2, alice (starting)",
        "GPU 2  NVIDIA H100 80GB HBM3",
        "  free",
        "  waited for by job j-3, alice",
        "GPU 3  NVIDIA H100 80GB HBM3  0% busy, 20.0 GiB of 80.0 GiB",
        "  in use (no process visible: another container?)",
        "queued: job j-4, alice waits for any 2 free GPUs",
    ]
    assert not report.gpus[1].free
    assert report.gpus[2].free
    assert not report.gpus[3].free  # 20 GiB in use by processes this agent cannot see
    assert jobs_cli.render_who(WhoReport(gpus=())) == "no GPUs"


def test_render_who_counts_memory_no_visible_process_holds() -> None:
    partly_seen = WhoGpu(
        index=0,
        name="NVIDIA A800 80GB PCIe",
        processes=(ProcessSnapshot(0, 42, "bob", "python serve.py", 2 * 1024**3),),
        mem_used_bytes=22 * 1024**3,
        mem_total_bytes=80 * 1024**3,
    )
    idle = replace(partly_seen, processes=(), mem_used_bytes=300 * 1024**2)
    lines = jobs_cli.render_who(WhoReport(gpus=(partly_seen, idle))).splitlines()
    assert "  20.0 GiB more in use by processes not visible here" in lines
    assert lines[-1] == "  free"  # what an idle driver reserves is no one's use
    assert partly_seen.unseen_mem_bytes == 20 * 1024**3
    assert idle.free


def test_all_gpus_reads_back_as_all() -> None:
    from agents.protocol import parse_gpus

    assert parse_gpus("all").text == "all"
    assert parse_gpus(parse_gpus("all").text) == parse_gpus("all")
