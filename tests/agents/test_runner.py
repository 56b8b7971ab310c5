"""The job runner with real processes: detached supervisors, the queue, retries, cancel, lost."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import zipapp
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agents import gpu_queue, jobstore, protocol, runner
from agents.jobstore import JobStore
from agents.protocol import HealthReport, JobRecord, StatusSnapshot, WhoReport
from tests.agents.runner_support import REPO, Agent, gone, make_agent, python_job

pytestmark = pytest.mark.integration

WRITE_ARGV = (
    "import json, os, sys; "
    "json.dump(sys.argv[1:], open(os.path.join(os.environ['GPUBOT_JOB_DIR'], 'argv.json'), 'w'))"
)

# Appends "<job id> <start> <end> <CUDA_VISIBLE_DEVICES>" to the file in argv[1] after
# sleeping argv[2] seconds, or after the file argv[2] appears (a gate the test opens).
RECORD_SPAN = """
import os, sys, time
start = time.time()
wait = sys.argv[2]
if wait.replace(".", "").isdigit():
    time.sleep(float(wait))
else:
    deadline = time.time() + 30
    while not os.path.exists(wait) and time.time() < deadline:
        time.sleep(0.02)
job, gpus = os.environ["GPUBOT_JOB_ID"], os.environ["CUDA_VISIBLE_DEVICES"]
with open(sys.argv[1], "a") as fh:
    fh.write(f"{job} {start} {time.time()} [{gpus}]\\n")
"""


@pytest.fixture
def agent(tmp_path: Path):
    a = make_agent(tmp_path)
    yield a
    a.cleanup()


@pytest.fixture
def gpu_agent(tmp_path: Path, fake_nvml):
    fake_nvml.gpus(4)  # idle: free for any job
    a = make_agent(tmp_path, fake_nvml.env)
    yield a
    a.cleanup()


def _spans(path: Path) -> list[tuple[str, float, float, tuple[int, ...]]]:
    spans = []
    for line in path.read_text().splitlines():
        job_id, start, end, gpus = line.split(" ")
        indices = tuple(int(g) for g in gpus.strip("[]").split(",") if g)
        spans.append((job_id, float(start), float(end), indices))
    return spans


def test_job_outlives_the_session_that_submitted_it(agent: Agent, tmp_path: Path):
    marker = tmp_path / "done"
    # A login-shell stand-in that submits, then lingers like an SSH session; killing its
    # whole session afterwards is what a dropped connection does.
    script = (
        f"{sys.executable} -m agents run --json -- sh -c 'sleep 1; echo finished > {marker}'"
        " > submitted.json; sleep 30"
    )
    shell = subprocess.Popen(
        ["sh", "-c", script], cwd=str(tmp_path), env=agent.env, start_new_session=True
    )
    deadline = time.monotonic() + 20
    submitted = tmp_path / "submitted.json"
    while not (submitted.exists() and submitted.read_text().strip()):
        assert time.monotonic() < deadline, "run did not print the job"
        time.sleep(0.05)
    record = protocol.loads(JobRecord, submitted.read_text())
    assert record.state == "queued"
    os.killpg(shell.pid, signal.SIGKILL)
    shell.wait()

    assert agent.wait(record.id, ("running",)).state == "running"
    final = agent.wait(record.id)
    assert final.state == "succeeded"
    assert final.exit_code == 0
    assert marker.read_text() == "finished\n"
    assert final.summary is not None
    assert final.summary.duration_s >= 1.0


def test_command_arrives_exactly_as_typed(agent: Agent):
    args = [
        "it's",
        'say "hi"',
        "two  spaces",
        "$HOME",
        "${PATH}",
        "a;b",
        "x | y",
        "`id`",
        "$(whoami)",
        "line1\nline2",
        "",
        "*",
        "--gpus",
        "--",
        "ünïcødé",
        "back\\slash",
        "tab\there",
    ]
    record = agent.submit(*python_job(WRITE_ARGV, *args))
    assert record.command[3:] == tuple(args)
    assert agent.wait(record.id).state == "succeeded"
    written = json.loads((agent.home / "jobs" / record.id / "argv.json").read_text())
    assert written == args


def test_job_environment_and_working_directory(agent: Agent, tmp_path: Path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    code = (
        "import json, os; json.dump({k: os.environ.get(k) for k in "
        "['GPUBOT_JOB_ID', 'GPUBOT_JOB_DIR', 'GPUBOT_ATTEMPT', 'CUDA_VISIBLE_DEVICES', 'MY_VAR']}"
        " | {'cwd': os.getcwd()}, open('env.json', 'w'))"
    )
    record = agent.submit(
        *python_job(code), options=["--cwd", str(workdir), "--env", "MY_VAR=a=b c", "--name", "e"]
    )
    assert agent.wait(record.id).state == "succeeded"
    seen = json.loads((workdir / "env.json").read_text())
    assert seen == {
        "GPUBOT_JOB_ID": record.id,
        "GPUBOT_JOB_DIR": str(agent.home / "jobs" / record.id),
        "GPUBOT_ATTEMPT": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "MY_VAR": "a=b c",
        "cwd": str(workdir),
    }
    assert agent.jobs().jobs[0].name == "e"


def test_retries_until_success(agent: Agent):
    code = (
        "import os, sys; a = int(os.environ['GPUBOT_ATTEMPT']); "
        "print('attempt', a); sys.exit(0 if a == 3 else 7)"
    )
    record = agent.submit(*python_job(code), options=["--retries", "4"])
    final = agent.wait(record.id)
    assert (final.state, final.attempt, final.exit_code) == ("succeeded", 3, 0)
    log = agent.cli("logs", record.id).stdout
    assert "attempt 1\n" in log
    assert "attempt 3\n" in log
    assert log.count("--- gpu-agent: attempt") == 2


def test_failing_job_does_not_stop_the_queue(gpu_agent: Agent):
    failing = gpu_agent.submit("sh", "-c", "exit 5", options=["--gpus", "0,", "--retries", "1"])
    behind = gpu_agent.submit("true", options=["--gpus", "0,"])
    first = gpu_agent.wait(failing.id)
    assert (first.state, first.attempt, first.exit_code) == ("failed", 2, 5)
    assert gpu_agent.wait(behind.id).state == "succeeded"


def test_queue_runs_jobs_on_one_gpu_in_fifo_order(gpu_agent: Agent, tmp_path: Path):
    spans_file = tmp_path / "spans"
    gate = tmp_path / "gate"
    holder = gpu_agent.submit(
        *python_job(RECORD_SPAN, str(spans_file), str(gate)), options=["--gpus", "1,"]
    )
    gpu_agent.running(holder.id)
    queued = [
        gpu_agent.submit(
            *python_job(RECORD_SPAN, str(spans_file), "0.05"), options=["--gpus", "1,"]
        ).id
        for _ in range(4)
    ]
    time.sleep(0.3)
    assert [gpu_agent.meta(i)["state"] for i in queued] == ["queued"] * 4
    gate.touch()
    for job_id in [holder.id, *queued]:
        assert gpu_agent.wait(job_id).state == "succeeded"
    spans = _spans(spans_file)
    assert [s[0] for s in spans] == [holder.id, *queued]
    assert all(s[3] == (1,) for s in spans)
    for earlier, later in itertools.pairwise(spans):
        assert earlier[2] <= later[1], "two jobs shared GPU 1"


def test_no_two_jobs_share_a_gpu(gpu_agent: Agent, tmp_path: Path):
    spans_file = tmp_path / "spans"
    gate = tmp_path / "gate"
    gated = [
        gpu_agent.submit(
            *python_job(RECORD_SPAN, str(spans_file), str(gate)), options=["--gpus", "any:2"]
        ).id
        for _ in range(2)
    ]
    holding = [set(gpu_agent.running(job_id)["gpus_assigned"]) for job_id in gated]
    assert holding[0] | holding[1] == {0, 1, 2, 3}  # two 2-GPU jobs share the 4 GPUs at once
    requests = ["0,1", "any:1", "3", "any:4", "2,3", "any:2"]
    ids = [
        gpu_agent.submit(*python_job(RECORD_SPAN, str(spans_file), "0.2"), options=["--gpus", r]).id
        for r in requests
    ]
    time.sleep(0.3)
    assert [gpu_agent.meta(i)["state"] for i in ids] == ["queued"] * len(ids)
    gate.touch()
    records = [gpu_agent.wait(job_id) for job_id in [*gated, *ids]]
    assert all(r.state == "succeeded" for r in records)
    spans = {s[0]: s for s in _spans(spans_file)}
    for record, request in zip(records, ["any:2", "any:2", *requests], strict=True):
        assigned = spans[record.id][3]
        assert assigned == record.gpus_assigned
        assert len(assigned) == protocol.parse_gpus(request).count
    for a in spans.values():
        for b in spans.values():
            if a[0] < b[0] and a[1] < b[2] and b[1] < a[2]:
                assert not set(a[3]) & set(b[3]), f"{a} and {b} overlap on a GPU"


def test_gpu_requests_that_cannot_be_met_fail_at_once(agent: Agent, gpu_agent: Agent):
    no_gpu = agent.cli("run", "--gpus", "any:1", "--", "true")
    assert no_gpu.returncode == 1
    assert "no NVIDIA GPU can be used on this machine" in no_gpu.stderr
    assert "--gpus none" in no_gpu.stderr
    too_many = gpu_agent.cli("run", "--gpus", "any:5", "--", "true")
    assert too_many.returncode == 2
    assert "this machine has 4 GPUs (0, 1, 2, 3); --gpus any:5 asks for 5" in too_many.stderr
    missing = gpu_agent.cli("run", "--gpus", "7,", "--", "true")
    assert missing.returncode == 2
    assert "--gpus 7 names GPU 7, which it does not have" in missing.stderr
    assert agent.store.all_ids() == []
    assert gpu_agent.store.all_ids() == []


def test_bad_requests_are_usage_errors_and_create_nothing(agent: Agent, tmp_path: Path):
    for args, message in (
        (["run", "--"], "no command given"),
        (["run", "--", "no-such-program-xyz"], "command not found"),
        (["run", "--cwd", str(tmp_path / "nope"), "--", "true"], "no such directory"),
        (["run", "--env", "NOEQUALS", "--", "true"], "NAME=VALUE"),
        (["run", "--env", "CUDA_VISIBLE_DEVICES=0", "--", "true"], "sets CUDA_VISIBLE_DEVICES"),
        (["run", "--gpus", "a,b", "--", "true"], "not understood"),
        (["run", "--retries", "-1", "--", "true"], "between 0 and 100"),
    ):
        done = agent.cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    assert agent.store.all_ids() == []


def test_cancel_kills_the_whole_process_tree(agent: Agent, tmp_path: Path):
    pids = tmp_path / "pids"
    # A child, a grandchild in its own process group, and one that ignores SIGTERM.
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(100)"
    script = (
        f"sleep 100 & echo $! >> {pids}; "
        f"sh -c 'set -m; sleep 100 & echo $! >> {pids}; wait' & "
        f"{sys.executable} -c '{stubborn}' & echo $! >> {pids}; "
        "wait"
    )
    record = agent.submit("sh", "-c", script)
    # Its leader's pid is written once it started, and under load after the script wrote its own.
    leader = agent.running(record.id)["job_pid"]
    deadline = time.monotonic() + 10
    while len(pids.read_text().split() if pids.exists() else []) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    tree = [int(p) for p in pids.read_text().split()]
    assert not any(gone(p) for p in [*tree, leader])

    done = agent.cli("cancel", "--json", record.id)
    assert done.returncode == 0, done.stderr
    final = protocol.loads(JobRecord, done.stdout)
    assert final.state == "cancelled"
    deadline = time.monotonic() + 5
    while not all(gone(p) for p in [*tree, leader]):
        assert time.monotonic() < deadline, "a process of the cancelled job survived"
        time.sleep(0.05)
    assert agent.wait(record.id).state == "cancelled"
    again = agent.cli("cancel", record.id)
    assert again.returncode == 1
    assert "already finished" in again.stderr


def test_cancelled_queued_job_never_runs(gpu_agent: Agent, tmp_path: Path):
    holder = gpu_agent.submit("sleep", "30", options=["--gpus", "0,"])
    gpu_agent.wait(holder.id, ("running",))
    marker = tmp_path / "ran"
    queued = gpu_agent.submit("touch", str(marker), options=["--gpus", "0,"])
    behind = gpu_agent.submit("true", options=["--gpus", "0,"])
    time.sleep(0.3)
    assert gpu_agent.meta(queued.id)["state"] == "queued"
    done = gpu_agent.cli("cancel", "--json", queued.id)
    assert protocol.loads(JobRecord, done.stdout).state == "cancelled"
    assert gpu_agent.cli("cancel", holder.id).returncode == 0
    assert gpu_agent.wait(behind.id).state == "succeeded"
    assert not marker.exists()


def test_killed_supervisor_means_lost_and_frees_the_queue(gpu_agent: Agent):
    victim = gpu_agent.submit("sleep", "60", options=["--gpus", "2,"])
    meta = gpu_agent.running(victim.id)
    behind = gpu_agent.submit("true", options=["--gpus", "2,"])
    os.kill(meta["supervisor_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not gone(meta["supervisor_pid"]):
        assert time.monotonic() < deadline
        time.sleep(0.02)

    listed = {j.id: j for j in gpu_agent.jobs().jobs}
    assert listed[victim.id].state == "lost"
    assert "supervisor" in (listed[victim.id].note or "")
    deadline = time.monotonic() + 5
    while not gone(meta["job_pid"]):
        assert time.monotonic() < deadline, "the lost job's process kept running"
        time.sleep(0.02)
    assert gpu_agent.wait(behind.id).state == "succeeded"


def test_concurrent_submissions_from_several_processes(agent: Agent):
    def submit(i: int) -> JobRecord:
        return agent.submit("sh", "-c", f"echo job {i}")

    with ThreadPoolExecutor(max_workers=6) as pool:
        records = list(pool.map(submit, range(6)))
    ids = [r.id for r in records]
    assert len(set(ids)) == 6
    seqs = sorted(agent.meta(i)["seq"] for i in ids)
    assert seqs == list(range(1, 7))
    for i, record in enumerate(records):
        assert agent.wait(record.id).state == "succeeded"
        assert agent.cli("logs", record.id).stdout == f"job {i}\n"


def test_jobs_since_lists_only_changed_jobs(agent: Agent):
    first = agent.submit("true")
    agent.wait(first.id)
    cutoff = agent.meta(first.id)["updated_at"]
    time.sleep(0.01)
    second = agent.submit("true")
    agent.wait(second.id)
    later = agent.jobs("--since", cutoff)
    assert [j.id for j in later.jobs] == [first.id, second.id]
    newest = agent.jobs("--since", agent.meta(second.id)["updated_at"].replace("+00:00", "Z"))
    assert [j.id for j in newest.jobs] == [second.id]
    bad = agent.cli("jobs", "--since", "yesterday")
    assert bad.returncode == 2
    assert "ISO 8601" in bad.stderr


def test_logs_tail_and_unknown_job(agent: Agent):
    record = agent.submit("sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done; echo oops >&2")
    agent.wait(record.id)
    assert agent.cli("logs", record.id, "--tail", "2").stdout == "line 5\noops\n"
    assert agent.cli("logs", record.id[:17]).stdout.startswith("line 1\n")
    missing = agent.cli("logs", "nope")
    assert missing.returncode == 1
    assert "no job 'nope'" in missing.stderr


def test_summary_reports_gpus_and_out_of_memory(gpu_agent: Agent, fake_nvml):
    code = (
        "import time; t = time.time()\n"
        "while time.time() - t < 0.8: pass\n"
        "print('RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB'); raise SystemExit(1)"
    )
    # GPUs named by index run even where something else uses them: the requester's choice.
    fake_nvml.gpus(4, util_gpu=10, memory_used=10 * 1024**3)
    record = gpu_agent.submit(*python_job(code), options=["--gpus", "0,1"])
    final = gpu_agent.wait(record.id)
    assert (final.state, final.exit_code) == ("failed", 1)
    summary = final.summary
    assert summary is not None
    assert [g.index for g in summary.gpus] == [0, 1]
    assert all(g.util_avg_pct == 10.0 for g in summary.gpus)
    assert all(g.mem_peak_bytes == 10 * 1024**3 for g in summary.gpus)
    assert summary.cpu_avg_pct is not None
    assert summary.cpu_avg_pct > 20
    assert "cuda_oom" in [d.code for d in summary.diagnoses]
    assert "CUDA out of memory" in summary.log_tail


def test_who_maps_gpu_processes_to_jobs(gpu_agent: Agent, fake_nvml):
    record = gpu_agent.submit("sleep", "30", options=["--gpus", "1,"])
    job_pid = gpu_agent.running(record.id)["job_pid"]
    outsider = os.getpid()
    fake_nvml.gpus(
        2,
        per_gpu={
            0: {"processes": [{"pid": outsider, "used_memory": 1024**3}]},
            1: {"processes": [{"pid": job_pid, "used_memory": 2 * 1024**3}]},
        },
    )
    done = gpu_agent.cli("who", "--json")
    assert done.returncode == 0, done.stderr
    report = protocol.loads(WhoReport, done.stdout)
    by_gpu = {g.index: g.processes for g in report.gpus}
    assert [(p.pid, p.job_id) for p in by_gpu[0]] == [(outsider, None)]
    assert [(p.pid, p.job_id) for p in by_gpu[1]] == [(job_pid, record.id)]
    assert by_gpu[1][0].user == gpu_agent.meta(record.id)["user"]
    text = gpu_agent.cli("who").stdout
    assert f"job {record.id}" in text
    assert "not an agent job" in text
    assert gpu_agent.cli("cancel", record.id).returncode == 0


def test_who_counts_gpus_the_agent_reserved(gpu_agent: Agent, fake_nvml):
    """A running job holds its GPUs before any of its processes opens them; queued jobs wait
    for named GPUs or for any N; who shows all of it with each process's use."""
    holder = gpu_agent.submit("sleep", "30", options=["--gpus", "0,2"])
    gpu_agent.running(holder.id)
    named = gpu_agent.submit("sleep", "30", options=["--gpus", "2,"])
    three = gpu_agent.submit("sleep", "30", options=["--gpus", "any:3"])
    outsider = os.getpid()
    fake_nvml.gpus(
        4,
        util_gpu=10,
        per_gpu={1: {"processes": [{"pid": outsider, "used_memory": 1024**3}]}},
        process_utilization=[{"pid": outsider, "sm": 64, "mem": 12}],
    )
    done = gpu_agent.cli("who", "--json")
    assert done.returncode == 0, done.stderr
    report = protocol.loads(WhoReport, done.stdout)
    gpus = {g.index: g for g in report.gpus}
    assert gpus[0].held_by is not None
    assert (gpus[0].held_by.job_id, gpus[0].held_by.state) == (holder.id, "running")
    assert gpus[0].held_by.gpus == (0, 2)
    assert gpus[0].held_by.since is not None
    assert not gpus[0].free
    assert [w.job_id for w in gpus[2].waiting] == [named.id]
    assert [(w.job_id, w.gpus, w.gpus_requested) for w in report.waiting_any] == [
        (three.id, (), "any:3")
    ]
    assert gpus[3].free
    (proc,) = gpus[1].processes
    assert (proc.sm_util_pct, proc.mem_bw_util_pct, proc.job_id) == (64, 12, None)
    assert proc.elapsed_s is not None
    assert gpus[1].util_gpu_pct == 10
    text = gpu_agent.cli("who").stdout
    assert f"held by job {holder.id}" in text
    assert "(starting)" in text
    assert f"queued: job {three.id}" in text
    assert "SM 64%" in text
    for job in (three, named, holder):
        assert gpu_agent.cli("cancel", job.id).returncode == 0


def test_reservations_are_worked_out_from_the_job_metadata():
    metas = [
        {
            "id": "c",
            "seq": 3,
            "state": "queued",
            "want_count": 2,
            "want_indices": [],
            "gpus_requested": "any:2",
        },
        {"id": "a", "seq": 1, "state": "running", "gpus_assigned": [0, 1], "started_at": "T1"},
        {
            "id": "b",
            "seq": 2,
            "state": "queued",
            "want_count": 1,
            "want_indices": [1],
            "created_at": "T0",
        },
        {"id": "d", "seq": 4, "state": "queued", "want_count": 0, "want_indices": []},
        {"id": "e", "seq": 5, "state": "running", "gpus_assigned": []},
    ]
    held, waiting, waiting_any = gpu_queue.reservations(metas)
    assert {i: j.job_id for i, j in held.items()} == {0: "a", 1: "a"}
    assert held[0].since == "T1"
    assert {i: [j.job_id for j in js] for i, js in waiting.items()} == {1: ["b"]}
    assert waiting[1][0].since == "T0"
    assert [j.job_id for j in waiting_any] == ["c"]


def test_status_and_health_tag_gpu_processes_with_their_job(gpu_agent: Agent, fake_nvml):
    record = gpu_agent.submit("sleep", "30", options=["--gpus", "1,"])
    job_pid = gpu_agent.running(record.id)["job_pid"]
    outsider = os.getpid()
    fake_nvml.gpus(
        2,
        per_gpu={
            0: {"processes": [{"pid": outsider, "used_memory": 1024**3}]},
            1: {"processes": [{"pid": job_pid, "used_memory": 2 * 1024**3}]},
        },
    )
    done = gpu_agent.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    status = protocol.loads(StatusSnapshot, done.stdout)
    assert sorted((p.pid, p.job_id) for p in status.processes) == sorted(
        [(outsider, None), (job_pid, record.id)]
    )
    health = protocol.loads(HealthReport, gpu_agent.cli("health", "--json").stdout)
    leftover = next(c for c in health.checks if c.id == "leftover_memory")
    assert str(outsider) in leftover.summary + leftover.hint + json.dumps(leftover.details)
    assert str(job_pid) not in json.dumps(leftover.details)
    assert gpu_agent.cli("cancel", record.id).returncode == 0


def test_who_without_nvml_fails_clearly(agent: Agent):
    done = agent.cli("who", "--json")
    assert done.returncode == 1
    assert "NVML" in done.stderr
    failure = protocol.loads(protocol.JobFailure, done.stdout)
    assert (failure.code, failure.exit_code) == ("nvml_failed", 1)


def test_runs_from_a_zipapp(agent: Agent, tmp_path: Path):
    source = tmp_path / "src"
    (source / "agents").mkdir(parents=True)
    for path in (REPO / "agents").glob("*.py"):
        (source / "agents" / path.name).write_bytes(path.read_bytes())
    pyz = tmp_path / "gpu-agent.pyz"
    zipapp.create_archive(source, pyz, main="agents.cli:main")
    env = dict(agent.env)
    env["PYTHONPATH"] = ""
    done = subprocess.run(
        [sys.executable, str(pyz), "run", "--json", "--", *python_job(WRITE_ARGV, "from", "pyz")],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    record = protocol.loads(JobRecord, done.stdout)
    assert agent.wait(record.id).state == "succeeded"
    written = json.loads((agent.home / "jobs" / record.id / "argv.json").read_text())
    assert written == ["from", "pyz"]


def test_gpu_job_fails_when_its_supervisor_sees_no_gpu(agent: Agent):
    from agents import runner

    meta = {
        "name": None,
        "state": "queued",
        "command": ["true"],
        "user": "me",
        "gpus_requested": "any:1",
        "want_count": 1,
        "want_indices": [],
        "gpus_assigned": [],
        "retries": 0,
        "attempt": 0,
        "created_at": jobstore.iso_now(),
        "started_at": None,
        "finished_at": None,
        "exit_code": None,
        "cwd": str(agent.home),
        "env": {},
    }
    with agent.store.locked():
        job_id = agent.store.create(meta)
        pid, start = runner._launch_supervisor(agent.store, job_id)
        meta.update(supervisor_pid=pid, supervisor_start=start)
        agent.store.write(meta)
    final = agent.wait(job_id)
    assert final.state == "failed"
    assert "no GPU is visible to the job's supervisor" in (final.note or "")
    assert final.started_at is None


def test_jobs_of_pids_finds_grandchildren_and_reads_nothing_it_need_not(
    agent: Agent, tmp_path: Path
) -> None:
    missing = JobStore(str(tmp_path / "never-created"))
    assert runner.jobs_of_pids(missing, []) == {}
    assert runner.jobs_of_pids(missing, [os.getpid()]) == {}
    assert not (tmp_path / "never-created").exists()

    pid_file = tmp_path / "grandchild"
    record = agent.submit("sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait")
    job_pid = agent.running(record.id)["job_pid"]
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the job never wrote its child's pid"
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    owners = runner.jobs_of_pids(agent.store, [job_pid, grandchild, os.getpid()])
    assert owners == {job_pid: record.id, grandchild: record.id}
    assert agent.cli("cancel", record.id).returncode == 0
    assert runner.jobs_of_pids(agent.store, [job_pid, grandchild]) == {}


def test_free_means_free_of_other_tenants_and_unseen_memory(
    gpu_agent: Agent, fake_nvml, tmp_path: Path
):
    """GPU 0: another tenant's process with 70 GiB at 97 %; GPU 1: 78 GiB held by no visible
    process. The default job goes to GPU 2; any:2 waits for two really free GPUs, its record
    names what holds each GPU it cannot have, and it starts once GPUs 0 and 1 are free."""
    tenant = subprocess.Popen(["sleep", "60"])
    try:
        fake_nvml.gpus(
            4,
            per_gpu={
                0: {
                    "util_gpu": 97,
                    "memory_used": 70 * 1024**3,
                    "processes": [{"pid": tenant.pid, "used_memory": 70 * 1024**3}],
                },
                1: {"memory_used": 78 * 1024**3},
            },
        )
        gate = tmp_path / "gate"
        spans_file = tmp_path / "spans"
        default = gpu_agent.submit(*python_job(RECORD_SPAN, str(spans_file), str(gate)))
        assert default.gpus_in_use == ()  # GPU 2 was free: nothing to explain
        assert gpu_agent.running(default.id)["gpus_assigned"] == [2]

        pair = gpu_agent.submit("true", options=["--gpus", "any:2"])
        assert pair.state == "queued"
        held = {g.index: g for g in pair.gpus_in_use}
        assert sorted(held) == [0, 1, 2]
        (foreign,) = held[0].processes
        assert (foreign.pid, foreign.job_id, foreign.used_mem_bytes) == (
            tenant.pid,
            None,
            70 * 1024**3,
        )
        assert foreign.user == gpu_agent.meta(default.id)["user"]
        assert foreign.command is None  # who holds it, not what it runs
        assert held[0].util_gpu_pct == 97
        assert (held[1].processes, held[1].unseen_mem_bytes) == ((), 78 * 1024**3)
        assert held[2].held_by is not None
        assert held[2].held_by.job_id == default.id
        assert not any(g.free for g in pair.gpus_in_use)
        time.sleep(0.3)
        assert gpu_agent.meta(pair.id)["state"] == "queued"

        report = protocol.loads(WhoReport, gpu_agent.cli("who", "--json").stdout)
        assert [g.free_for_jobs for g in report.gpus] == [False, False, False, True]
        assert [p.pid for p in report.gpus[0].foreign_processes] == [tenant.pid]

        fake_nvml.gpus(4)  # the tenant and the other container are gone
        done = gpu_agent.wait(pair.id)  # while the default job still holds GPU 2
        assert (done.state, done.gpus_assigned, done.gpus_in_use) == ("succeeded", (0, 1), ())
        gate.touch()
        assert gpu_agent.wait(default.id).state == "succeeded"
        assert _spans(spans_file)[0][3] == (2,)
    finally:
        tenant.kill()
        tenant.wait()
