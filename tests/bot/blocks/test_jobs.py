"""Job messages: every block valid by Slack's rules, at the limits (huge logs, 8 GPUs, long
commands), with the text escaped and the newest log lines kept."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from agents.protocol import Diagnosis, JobGpuStat, JobSummary
from bot.blocks import jobs as blocks
from bot.blocks import render
from bot.blocks.kit import MAX_BLOCKS, SECTION_TEXT_MAX
from bot.i18n import speaking
from bot.local_slack import check_blocks
from bot.services.jobs.runs import JobFinished, JobQueued
from bot.services.jobs.views import (
    AccessChange,
    JobListView,
    JobView,
    LogView,
    WhoGpuView,
    WhoProcess,
    WhoReservation,
    WhoView,
)

GIB = 1024**3


def job(**changes: Any) -> JobView:
    values: dict[str, Any] = dict(
        id=42,
        agent_job_id="20261202-120000-ab12",
        instance_id=7,
        instance_name="box1",
        state="succeeded",
        command=("python", "train.py", "--lr", "3e-4"),
        requested_by="U0ALICE",
        gpus_requested="any:2",
        gpus_assigned=(0, 1),
        retries=0,
        attempt=1,
        submitted_at=datetime(2026, 12, 2, 12, 0),
        started_at=datetime(2026, 12, 2, 12, 0, 1),
        finished_at=datetime(2026, 12, 2, 13, 30, 1),
        exit_code=0,
        duration_s=5400.0,
        gpu_hours=3.0,
        cost_micros=6_300_000,
        summary=JobSummary(
            duration_s=5400.0,
            cpu_avg_pct=180.0,
            gpus=(JobGpuStat(0, 93.4, 70 * GIB), JobGpuStat(1, 91.0, 69 * GIB)),
            diagnoses=(),
            log_tail="epoch 9 loss 0.12\ndone\n",
        ),
    )
    values.update(changes)
    return JobView(**values)


def all_text(message: tuple[str, tuple[dict[str, Any], ...]]) -> str:
    import json

    return message[0] + json.dumps(message[1], ensure_ascii=False)


def section_texts(body: tuple[dict[str, Any], ...]) -> list[str]:
    return [b["text"]["text"] for b in body if b["type"] == "section" and "text" in b]


def test_completion_reply_has_every_fact_and_the_release_button() -> None:
    text, body = blocks.completion_reply(job())
    assert check_blocks(body) == []
    shown = all_text((text, body))
    for fragment in (
        "Job 42 on box1 succeeded",
        "<@U0ALICE>",
        "*Exit code*\\n0",
        "*Duration*\\n1h 30m",
        "*GPU-hours*\\n3.00",
        "*Cost*\\n$6.30",
        "*CPU*\\n180% of a core",
        "GPU 0: 93% busy on average, peak memory 70.0 GiB",
        "GPU 1: 91% busy",
        "python train.py --lr 3e-4",
        "epoch 9 loss 0.12\\ndone",
    ):
        assert fragment in shown, fragment
    (button,) = body[-1]["elements"]
    assert (button["action_id"], button["value"]) == ("instance_release_ask", "7")
    assert button["text"]["text"] == "Release instance"
    assert "(0, 1h 30m, $6.30)" in text


def test_completion_reply_for_a_released_instance_has_no_button() -> None:
    _, body = blocks.completion_reply(job(instance_active=False))
    assert all(b["type"] != "actions" for b in body)


def test_failed_job_shows_note_attempts_and_diagnoses() -> None:
    summary = JobSummary(
        duration_s=12.5,
        cpu_avg_pct=None,
        gpus=(),
        diagnoses=(
            Diagnosis("cuda_oom", "Ran out of GPU memory: lower the batch size <now>."),
            Diagnosis("dataloader_bound", "Data loading is the bottleneck."),
        ),
        log_tail="Traceback...\nRuntimeError: CUDA out of memory\n",
    )
    message = blocks.completion_reply(
        job(
            state="failed",
            exit_code=137,
            retries=2,
            attempt=3,
            note="killed by SIGKILL",
            summary=summary,
            duration_s=12.5,
            gpus_assigned=(),
        )
    )
    assert check_blocks(message[1]) == []
    shown = all_text(message)
    assert ":x: *Job 42 on box1 failed*" in shown
    assert "killed by SIGKILL" in shown
    assert "*Attempts*\\n3 of 3" in shown
    assert "*Exit code*\\n137" in shown
    assert "*GPUs*\\nno GPU (CPU only)" in shown
    assert "lower the batch size &lt;now&gt;." in shown
    assert "Data loading is the bottleneck." in shown
    assert "*Duration*\\n12s" in shown


def test_lost_job_without_summary_or_cost() -> None:
    message = blocks.completion_reply(
        job(state="lost", exit_code=None, summary=None, duration_s=None, cost_micros=None)
    )
    assert check_blocks(message[1]) == []
    shown = all_text(message)
    assert "*Exit code*\\n-" in shown
    assert "*Cost*\\n-" in shown
    assert ":grey_question:" in shown


def test_huge_log_keeps_its_last_lines_within_a_section() -> None:
    log = "".join(f"step {i} loss 0.{i:04d} <&>\n" for i in range(100_000))
    _, body = blocks.completion_reply(job(summary=JobSummary(1.0, None, (), (), log_tail=log)))
    assert check_blocks(body) == []
    code = section_texts(body)[-1]
    assert len(code) <= SECTION_TEXT_MAX
    assert code.startswith("```\n…\nstep ")
    assert code.endswith("step 99999 loss 0.99999 &lt;&amp;&gt;\n```")


def test_a_single_giant_log_line_still_fits() -> None:
    _, body = blocks.completion_reply(
        job(summary=JobSummary(1.0, None, (), (), log_tail="x" * 50_000 + "END"))
    )
    assert check_blocks(body) == []
    assert section_texts(body)[-1].endswith("xEND\n```")


def test_code_fences_in_logs_and_commands_cannot_break_out() -> None:
    message = blocks.completion_reply(
        job(
            command=("sh", "-c", "echo ```; echo `id`"),
            summary=JobSummary(1.0, None, (), (), log_tail="```\n*bold*\n```\n"),
        )
    )
    assert check_blocks(message[1]) == []
    for text in section_texts(message[1]):
        if text.startswith("```"):
            assert text.count("```") == 2


def test_eight_gpus_and_a_very_long_command() -> None:
    eight = tuple(JobGpuStat(i, float(i * 10), i * GIB) for i in range(8))
    command = ("python", "train.py", *[f"--flag{i}='{'v' * 40}'" for i in range(200)])
    message = blocks.completion_reply(
        job(
            command=command,
            gpus_assigned=tuple(range(8)),
            summary=JobSummary(10.0, 50.0, eight, (), log_tail="ok\n"),
        )
    )
    assert check_blocks(message[1]) == []
    assert len(message[1]) <= MAX_BLOCKS
    shown = all_text(message)
    assert "GPU 7: 70% busy on average, peak memory 7.0 GiB" in shown
    assert "*GPUs*\\nGPUs 0, 1, 2, 3, 4, 5, 6, 7 (CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7)" in shown
    assert len(message[0]) <= 4000


def test_queued_message_quotes_the_command_as_typed() -> None:
    argv = ("python", "-c", "print('a b')", "$HOME", "a;b|c", "")
    text, body = blocks.queued_message(job(state="queued", command=argv, retries=2))
    assert check_blocks(body) == []
    assert shlex.split(text.split(": ", 1)[1]) == list(argv)
    assert text.endswith(""": python -c "print('a b')" '$HOME' 'a;b|c' ''""")
    shown = all_text((text, body))
    assert "Job 42 queued on box1" in shown
    assert "retries: 2" in shown
    assert "I'll reply in this thread" in shown


def test_submitted_reply_is_short_when_the_message_was_posted() -> None:
    text, body = blocks.submitted_reply(job(state="queued"), posted=True)
    assert text == (
        "Queued job 42 on box1 with GPUs 0, 1 (CUDA_VISIBLE_DEVICES=0,1). I'll reply in its "
        "thread when it ends."
    )
    assert check_blocks(body) == []
    fallback_text, _ = blocks.submitted_reply(job(state="queued"), posted=False)
    assert fallback_text.startswith("Job 42 queued on box1")


def test_job_list_of_the_fleet_and_of_one_instance() -> None:
    outside = job(id=None, agent_job_id="20261202-1", state="running", requested_by=None)
    fleet = blocks.job_list(JobListView(None, (job(), outside)))
    assert check_blocks(fleet[1]) == []
    shown = all_text(fleet)
    assert "`42` on *box1* succeeded" in shown
    assert "`box1:20261202-1` on *box1* running" in shown
    assert "$6.30" in shown
    empty = blocks.job_list(JobListView("box1", (), problem="From the bot's records: down"))
    assert empty[0] == "No jobs on box1."
    assert "From the bot" in all_text(empty)


def test_job_list_with_many_jobs_stays_within_50_blocks() -> None:
    many = tuple(job(id=i, command=("x" * 300,)) for i in range(600))
    _text, body = blocks.job_list(JobListView("box1", many))
    assert check_blocks(body) == []
    assert len(body) <= MAX_BLOCKS


def test_log_message_splits_long_logs_and_keeps_the_end() -> None:
    log = "".join(f"line {i}\n" for i in range(20_000))
    _text, body = blocks.log_message(LogView(job(), log, 20_000))
    assert check_blocks(body) == []
    codes = [t for t in section_texts(body) if t.startswith("```")]
    assert len(codes) == blocks.LOG_SECTIONS_MAX
    assert codes[0].startswith("```\n…\n")
    assert codes[-1].endswith("line 19999\n```")
    empty = blocks.log_message(LogView(job(), "", 50))
    assert "The log is empty so far." in all_text(empty)


def test_who_message_shows_slack_users_and_other_processes() -> None:
    view = WhoView(
        "box1",
        (
            WhoGpuView(
                0,
                "NVIDIA H100 80GB HBM3",
                (
                    WhoProcess(11, "ubuntu", "U0ALICE", "42", "python train.py", 30 * GIB),
                    WhoProcess(12, "root", None, None, None, None),
                ),
            ),
            WhoGpuView(1, "NVIDIA H100 80GB HBM3", ()),
        ),
    )
    text, body = blocks.who_message(view)
    assert check_blocks(body) == []
    shown = all_text((text, body))
    assert "pid 11 · <@U0ALICE> · job `42` · 30.0 GiB · `python train.py`" in shown
    assert "pid 12 · root" in shown
    assert "free" in shown
    assert blocks.who_message(WhoView("box1", ()))[0].endswith("no GPUs.")


def test_who_message_shows_use_reservations_and_queued_jobs() -> None:
    view = WhoView(
        "box1",
        (
            WhoGpuView(
                0,
                "NVIDIA H100 80GB HBM3",
                (
                    WhoProcess(
                        11,
                        "ubuntu",
                        "U0ALICE",
                        "42",
                        "python train.py",
                        30 * GIB,
                        sm_util_pct=87,
                        cpu_pct=101.4,
                        elapsed_s=3725,
                    ),
                ),
                util_gpu_pct=93,
                held_by=WhoReservation("42", "U0ALICE", "ubuntu"),
            ),
            WhoGpuView(
                1,
                "NVIDIA H100 80GB HBM3",
                (),
                util_gpu_pct=0,
                held_by=WhoReservation("43", "U0BOB", "ubuntu", starting=True),
                waiting=(WhoReservation("44", None, "carol"),),
            ),
            WhoGpuView(2, "NVIDIA H100 80GB HBM3", ()),
        ),
        waiting_any=(WhoReservation("45", "U0DAN", "ubuntu", wanted="any 2 free GPUs"),),
    )
    text, body = blocks.who_message(view)
    assert check_blocks(body) == []
    shown = all_text((text, body))
    assert "*GPU 0* NVIDIA H100 80GB HBM3 · 93% busy" in shown
    assert "held by job `42` · <@U0ALICE>\\n" in shown  # not starting: no mark
    assert (
        "pid 11 · <@U0ALICE> · job `42` · 30.0 GiB · SM 87% · CPU 101% · up 1h 2m · "
        "`python train.py`" in shown
    )
    assert "held by job `43` · <@U0BOB> (starting)" in shown
    assert "waiting: job `44` · carol" in shown
    assert "Queued for any 2 free GPUs: job `45` · <@U0DAN>" in shown
    assert shown.count("    free") == 1  # GPU 2 only: GPU 1 is reserved though empty
    assert "GPU 1: held by job 43; GPU 2: free" in text


@pytest.mark.parametrize("state", ["cancelled", "succeeded"])
def test_cancel_message(state: str) -> None:
    text, body = blocks.cancel_message(job(state=state))
    assert check_blocks(body) == []
    assert ("Cancelled job 42" in text) == (state == "cancelled")


def fact(body: tuple[dict[str, Any], ...], name: str) -> str:
    for block in body:
        for item in block.get("fields", ()):
            label, _, value = item["text"].partition("\n")
            if label == f"*{name}*":
                return str(value)
    raise AssertionError(f"no {name} field")


def test_cost_says_it_is_the_gpus_share_of_the_instance() -> None:
    _, body = blocks.completion_reply(job(instance_gpu_count=8))
    assert fact(body, "Cost") == "$6.30\n_its share: 2 of 8 GPUs_"
    assert fact(body, "GPU-hours") == "3.00"


def test_cost_of_a_job_holding_every_gpu_is_the_whole_instance() -> None:
    _, body = blocks.completion_reply(job(instance_gpu_count=2))
    assert fact(body, "Cost") == "$6.30\n_the whole instance's time_"


def test_a_job_without_gpus_is_charged_the_instance_and_says_so() -> None:
    no_gpus = job(gpus_requested=None, gpus_assigned=(), gpu_hours=0.0, instance_gpu_count=4)
    _, body = blocks.completion_reply(no_gpus)
    assert check_blocks(body) == []
    assert fact(body, "GPUs") == "no GPU (CPU only)"
    assert fact(body, "GPU-hours") == "0 (no GPU held)"
    assert fact(body, "Cost") == "$6.30\n_the whole instance's time (the job held no GPU)_"


def test_unknown_cost_has_no_basis() -> None:
    _, body = blocks.completion_reply(job(cost_micros=None, gpu_hours=None))
    assert fact(body, "Cost") == "-"
    assert fact(body, "GPU-hours") == "-"


@pytest.mark.parametrize(
    ("granted", "changed", "allowed", "fragments"),
    [
        (True, True, ("U0BOB",), ("<@U0BOB> may now run", "allowed: <@U0BOB>")),
        (True, False, ("U0BOB", "U0CAROL"), ("could already", "nothing changed", "<@U0CAROL>")),
        (False, True, (), ("may no longer run", "keep running", "allowed: nobody else")),
        (False, False, (), ("had no access", "nothing changed")),
    ],
)
def test_access_message(
    granted: bool, changed: bool, allowed: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    change = AccessChange("box_1", "U0ALICE", "U0BOB", granted, changed, allowed)
    text, body = blocks.access_message(change)
    assert check_blocks(body) == []
    shown = all_text((text, body))
    for fragment in (*fragments, "Owner: <@U0ALICE>"):
        assert fragment in shown


def test_a_note_that_repeats_the_state_is_not_shown_twice() -> None:
    _, body = blocks.completion_reply(job(state="cancelled", note="cancelled", exit_code=143))
    assert section_texts(body)[0].count("cancelled") == 1
    _, body = blocks.completion_reply(job(state="cancelled", note="cancelled while queued"))
    assert "cancelled while queued" in section_texts(body)[0]


@pytest.mark.parametrize(
    ("requested", "shown"),
    [
        ("any:2", "GPUs: any 2 free GPUs (picked when the job starts)"),
        ("any:1", "GPUs: one free GPU (picked when the job starts)"),
        ("3", "GPUs: GPU 3 (CUDA_VISIBLE_DEVICES=3)"),
        ("0,1", "GPUs: GPUs 0, 1 (CUDA_VISIBLE_DEVICES=0,1)"),
        ("all", "GPUs: all GPUs (picked when the job starts)"),
        ("none", "GPUs: no GPU (CPU only)"),
        (None, "GPUs: no GPU (CPU only)"),
    ],
)
def test_queued_message_tells_a_count_from_named_gpus(requested: str | None, shown: str) -> None:
    queued = job(state="queued", gpus_requested=requested, gpus_assigned=(), started_at=None)
    _, body = blocks.queued_message(queued)
    assert check_blocks(body) == []
    (notes,) = [b for b in body if b["type"] == "context"]
    assert notes["elements"][0]["text"] == shown


def test_a_cancelled_job_says_who_cancelled_it() -> None:
    _, body = blocks.completion_reply(
        job(state="cancelled", cancelled_by="U0BOB", note="cancelled")
    )
    head = section_texts(body)[0]
    assert "Cancelled by <@U0BOB>." in head
    assert check_blocks(body) == []


def test_the_notices_render_as_their_messages() -> None:
    queued = job(state="queued", finished_at=None, exit_code=None)
    assert render(JobQueued(queued)) == blocks.queued_message(queued)
    assert render(JobFinished(job())) == blocks.completion_reply(job())


def test_gpus_say_which_cards_a_running_job_got_as_cuda_visible_devices() -> None:
    running = job(state="running", gpus_requested="any:1", gpus_assigned=(1,), exit_code=None)
    (line,) = section_texts(blocks.job_list(JobListView("box1", (running,)))[1])
    assert "running · <@U0ALICE> · GPU 1 (CUDA_VISIBLE_DEVICES=1) · `python train.py" in line
    _, body = blocks.completion_reply(job(gpus_assigned=(1,)))
    assert fact(body, "GPUs") == "GPU 1 (CUDA_VISIBLE_DEVICES=1)"


def test_a_job_that_defaulted_to_the_cpu_says_why() -> None:
    why = "box1 has no usable NVIDIA GPU, so the job runs on the CPU"
    queued = job(
        state="queued", gpus_requested="none", gpus_assigned=(), started_at=None, gpus_note=why
    )
    _, body = blocks.queued_message(queued)
    (notes,) = [b for b in body if b["type"] == "context"]
    assert notes["elements"][0]["text"] == f"GPUs: no GPU (CPU only) ({why})"
    _, body = blocks.completion_reply(
        replace(queued, state="succeeded", started_at=queued.submitted_at)
    )
    assert f"{why}." in section_texts(body)[0]
    with speaking("zh"):
        _, queued_body = blocks.queued_message(replace(queued, gpus_note="没有"))
        _, body = blocks.completion_reply(
            replace(queued, state="succeeded", started_at=queued.submitted_at, gpus_note="没有")
        )
    assert "\uff08没有\uff09" in json.dumps(queued_body, ensure_ascii=False)
    assert "没有。" in section_texts(body)[0]


def test_who_never_calls_a_gpu_free_while_memory_is_in_use_unseen() -> None:
    unseen = WhoGpuView(
        0,
        "NVIDIA A800 80GB PCIe",
        (),
        util_gpu_pct=35,
        mem_used_bytes=20 * GIB,
        mem_total_bytes=80 * GIB,
        unseen_mem_bytes=20 * GIB,
    )
    text, body = blocks.who_message(WhoView("box1", (unseen,)))
    assert check_blocks(body) == []
    shown = all_text((text, body))
    assert "*GPU 0* NVIDIA A800 80GB PCIe · 35% busy · 20.0 GiB of 80.0 GiB" in shown
    assert "in use (no process visible: another container?) · 20.0 GiB" in shown
    assert "free" not in shown
    assert text.endswith("GPU 0: in use (no process visible: another container?)")


def test_log_of_a_job_whose_state_could_not_be_asked_says_so() -> None:
    view = LogView(job(state="running"), "step 1\n", 50, state_stale=True)
    text, body = blocks.log_message(view)
    assert "Log of job 42 on box1 (running, as the bot last saw it)" in all_text((text, body))
    fresh = blocks.log_message(LogView(job(), "done\n", 50))
    assert "Log of job 42 on box1 (succeeded)" in all_text(fresh)


#: What holds the GPUs of a 4-GPU instance: another tenant's process at 97 %, memory no
#: visible process holds, and the agent's own job.
HELD_GPUS = (
    WhoGpuView(
        0,
        "NVIDIA A800-SXM4-80GB",
        (WhoProcess(4242, "mallory", None, None, None, 70 * GIB),),
        util_gpu_pct=97,
        mem_used_bytes=70 * GIB,
        free_for_jobs=False,
    ),
    WhoGpuView(
        1,
        "NVIDIA A800-SXM4-80GB",
        (),
        util_gpu_pct=0,
        mem_used_bytes=78 * GIB,
        unseen_mem_bytes=78 * GIB,
        free_for_jobs=False,
    ),
    WhoGpuView(
        2,
        "NVIDIA A800-SXM4-80GB",
        (),
        held_by=WhoReservation("41", "U0BOB", "ubuntu", starting=True),
        free_for_jobs=False,
    ),
)


def test_a_job_waiting_for_free_gpus_says_who_or_what_holds_each() -> None:
    waiting = job(state="queued", gpus_assigned=(), gpus_in_use=HELD_GPUS, summary=None)
    expected = [
        "*GPU 0*: pid 4242 · mallory · 70.0 GiB · not a gpubot job; 97% busy",
        "*GPU 1*: 78.0 GiB in use, no process visible (another container?)",
        "*GPU 2*: job `41` · <@U0BOB>",
    ]
    assert blocks.in_use_lines(waiting)[1:] == expected
    for message in (blocks.queued_message(waiting), blocks.submitted_reply(waiting, True)):
        assert check_blocks(message[1]) == []
        shown = all_text(message)
        assert "*It waits for any 2 free GPUs (picked when the job starts).*" in shown
        for line in expected:
            assert line in shown
    assert blocks.in_use_lines(replace(waiting, gpus_in_use=())) == []
    ready = blocks.queued_message(replace(waiting, gpus_in_use=()))
    assert "These GPUs are in use" not in all_text(ready)


def test_who_marks_use_outside_gpubot() -> None:
    idle_context = WhoGpuView(
        3,
        "NVIDIA A800-SXM4-80GB",
        (WhoProcess(77, "carol", None, None, "python", 400 * 1024**2),),
        util_gpu_pct=0,
        free_for_jobs=True,
    )
    busy_unseen = WhoGpuView(4, "NVIDIA A800-SXM4-80GB", (), util_gpu_pct=97, free_for_jobs=False)
    view = WhoView("box1", (*HELD_GPUS, idle_context, busy_unseen))
    text, body = blocks.who_message(view)
    assert check_blocks(body) == []
    shown = all_text((text, body))
    marker = ":warning: in use outside gpubot: new jobs wait for it unless they name it in --gpus"
    assert shown.count(marker) == 3  # GPUs 0, 1 and 4; not 2 (the agent's job) nor 3 (free)
    assert "pid 4242 · mallory · not a gpubot job · 70.0 GiB" in shown
    assert "pid 77 · carol · not a gpubot job · 0.4 GiB" in shown  # a context only: still free
    assert text.endswith(
        "GPU 0: 1 process(es), in use outside gpubot; "
        "GPU 1: in use (no process visible: another container?); GPU 2: held by job 41; "
        "GPU 3: 1 process(es); GPU 4: busy outside gpubot"
    )
    older_agent = replace(idle_context, free_for_jobs=None)  # no word from the agent
    assert not older_agent.free


def test_memory_unseen_on_a_gpu_the_agents_job_holds_is_not_called_outside_use() -> None:
    # In a container NVML lists no process: the job's own memory shows as unseen.
    own = WhoGpuView(
        0,
        "H100",
        (),
        unseen_mem_bytes=30 * GIB,
        held_by=WhoReservation("41", "U0BOB", "ubuntu"),
        free_for_jobs=False,
    )
    assert not own.used_outside
    tenant = replace(own, processes=(WhoProcess(9, "mallory", None, None, None, GIB),))
    assert tenant.used_outside
    assert not replace(own, held_by=None, free_for_jobs=True).used_outside
    assert replace(own, held_by=None).used_outside
