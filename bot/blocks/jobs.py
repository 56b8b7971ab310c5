"""Block Kit for jobs: the "queued" message, the completion reply, the job list, logs, who and
cancel. Pure functions: views in, ``(text, blocks)`` out, within Slack's limits.

Command lines and logs are shown as code, escaped for mrkdwn (in the fallback text too); a
log is cut from its start so its last lines always fit.
"""

from __future__ import annotations

from collections.abc import Callable as _Callable
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from agents.protocol import assigned_phrase, gpus_phrase, show_command
from bot.blocks.kit import (
    SECTION_TEXT_MAX,
    Block,
    Message,
    actions,
    button,
    clip,
    code,
    context,
    escape,
    fallback,
    fields,
    fit,
    header,
    mention,
    pack,
    section,
)
from bot.notify import Notice
from bot.services.job_views import (
    AccessChange,
    JobListView,
    JobView,
    LogView,
    WhoGpuView,
    WhoReservation,
    WhoView,
)
from bot.services.jobs import JobFinished, JobQueued
from bot.values import format_duration, format_money

#: The button that asks to release the instance (registered by the instance commands).
RELEASE_ASK = "instance_release_ask"

STATE_EMOJI = {
    "queued": ":hourglass_flowing_sand:",
    "running": ":runner:",
    "succeeded": ":white_check_mark:",
    "failed": ":x:",
    "cancelled": ":no_entry_sign:",
    "lost": ":grey_question:",
}
_FENCE = "```"
#: A code block's text may use this much of a section (fences and a newline each side).
CODE_MAX = SECTION_TEXT_MAX - 2 * (len(_FENCE) + 1)
#: Log sections ``/gpu logs`` may show (the newest lines win).
LOG_SECTIONS_MAX = 12
_GIB = 1024**3
#: A GPU whose memory is in use though no process on it is visible here.
UNSEEN_IN_USE = "in use (no process visible: another container?)"


def queued_message(job: JobView) -> Message:
    """The channel message posted when a job is queued; its thread gets the completion reply."""
    title = f"Job {job.ref} queued on {job.instance_name}"
    lines = [
        f"{STATE_EMOJI['queued']} *{escape(title)}*"
        + (f" for {mention(job.requested_by)}" if job.requested_by else ""),
    ]
    details = [f"GPUs: {escape(gpus_text(job))}"]
    if job.gpus_note:
        details[0] += f" ({escape(job.gpus_note)})"
    if job.retries:
        details.append(f"retries: {job.retries}")
    if job.release_when_done:
        details.append("the instance is released when its jobs are done")
    blocks: list[Block] = [
        section("\n".join(lines)),
        section(code_block(command_line(job.command))),
        context(
            " · ".join(details),
            f"Agent job `{escape(job.agent_job_id)}`. I'll reply in this thread when it ends.",
        ),
    ]
    text = f"{escape(title)}: {escape(command_line(job.command))}"
    return fallback(text), fit(blocks)


def completion_reply(job: JobView) -> Message:
    """The thread reply when a job ends: state, command, duration, exit code, GPU-hours and
    cost, per-GPU utilisation and peak memory, diagnoses, the log's last lines, and a button
    to release the instance."""
    emoji = STATE_EMOJI.get(job.state, ":grey_question:")
    title = f"Job {job.ref} on {job.instance_name} {job.state}"
    head = f"{emoji} *{escape(title)}*"
    if job.requested_by:
        head += f" {mention(job.requested_by)}"
    if job.cancelled_by:
        head += f"\nCancelled by {mention(job.cancelled_by)}."
    if job.note and job.note.strip().lower() != job.state:  # "cancelled" says nothing new
        head += f"\n{escape(job.note)}"
    if job.gpus_note:
        head += f"\n{escape(job.gpus_note)}."
    blocks: list[Block] = [section(head), fields(_facts(job))]
    blocks.append(section(code_block(command_line(job.command))))
    summary = job.summary
    if summary is not None and summary.gpus:
        blocks.extend(section(chunk) for chunk in pack(_gpu_lines(job), SECTION_TEXT_MAX))
    if summary is not None and summary.diagnoses:
        lines = [f":bulb: {escape(d.message)}" for d in summary.diagnoses]
        blocks.extend(section(chunk) for chunk in pack(lines, SECTION_TEXT_MAX))
    if summary is not None and summary.log_tail.strip():
        blocks.append(section(code_block(summary.log_tail, keep="end")))
    if job.instance_active:
        blocks.append(actions([button("Release instance", RELEASE_ASK, str(job.instance_id))]))
    text = f"{escape(title)} ({_exit_text(job)}, {_duration_text(job)}, {_cost_text(job)})"
    return fallback(text), fit(blocks)


def job_list(view: JobListView) -> Message:
    """``/gpu jobs [NAME]``: one line per job, newest last."""
    where = view.instance_name or "the fleet"
    if not view.jobs:
        text = escape(f"No jobs on {where}.")
        blocks: list[Block] = [section(text)]
        if view.problem:
            blocks.append(context(escape(view.problem)))
        return text, tuple(blocks)
    lines = [_list_line(job, with_instance=view.instance_name is None) for job in view.jobs]
    blocks = [header(f"Jobs on {where}")]
    blocks.extend(section(chunk) for chunk in pack(lines, SECTION_TEXT_MAX))
    if view.problem:
        blocks.append(context(escape(view.problem)))
    text = escape(
        f"Jobs on {where}:\n"
        + "\n".join(f"{job.ref} {job.state} {command_line(job.command)}" for job in view.jobs)
    )
    return fallback(text), fit(blocks, "{n} more sections not shown.")


def log_message(view: LogView) -> Message:
    """``/gpu logs JOB``: the log's last lines as code, split over sections when long."""
    job = view.job
    state = f"{job.state}, as the bot last saw it" if view.state_stale else job.state
    title = f"Log of job {job.ref} on {job.instance_name} ({state})"
    blocks: list[Block] = [section(f"{STATE_EMOJI.get(job.state, '')} *{escape(title)}*".strip())]
    if not view.text.strip():
        blocks.append(context("The log is empty so far."))
        return fallback(escape(title + ": empty")), tuple(blocks)
    chunks = split_code(view.text, LOG_SECTIONS_MAX)
    blocks.extend(section(chunk) for chunk in chunks)
    blocks.append(
        context(f"Last {view.tail} lines at most. {code(f'/gpu logs {job.ref} --tail N')}")
    )
    return fallback(escape(f"{title}\n{view.text}")), fit(blocks)


def who_message(view: WhoView) -> Message:
    """``/gpu who NAME``: every GPU, who holds it and whether it is busy; queued jobs."""
    title = f"Who uses the GPUs of {view.instance_name}"
    if not view.gpus:
        return f"{escape(title)}: no GPUs.", (section(f"*{escape(title)}*: no GPUs."),)
    lines = []
    for gpu in view.gpus:
        busy = f" · {gpu.util_gpu_pct}% busy" if gpu.util_gpu_pct is not None else ""
        if gpu.mem_used_bytes is not None and gpu.mem_total_bytes:
            busy += f" · {_gib(gpu.mem_used_bytes)} of {_gib(gpu.mem_total_bytes)}"
        lines.append(f"*GPU {gpu.index}* {escape(gpu.name)}{busy}")
        if gpu.held_by is not None:
            starting = " (starting)" if gpu.held_by.starting else ""
            lines.append(f"    held by {_reservation_text(gpu.held_by)}{starting}")
        if gpu.unseen_mem_bytes is not None and not gpu.processes:
            lines.append(f"    {UNSEEN_IN_USE} · {_gib(gpu.unseen_mem_bytes)}")
        elif gpu.unseen_mem_bytes is not None:
            lines.append(
                f"    and {_gib(gpu.unseen_mem_bytes)} in use by processes not visible here "
                "(another container?)"
            )
        if gpu.free:
            lines.append("    free")
        for proc in gpu.processes:
            who = mention(proc.slack_user) if proc.slack_user else escape(proc.user or "unknown")
            job = f" · job {code(proc.job_ref)}" if proc.job_ref else ""
            mem = f" · {_gib(proc.used_mem_bytes)}" if proc.used_mem_bytes is not None else ""
            use = _process_use(proc.sm_util_pct, proc.cpu_pct, proc.elapsed_s)
            cmd = f" · {code(clip(proc.command, 200))}" if proc.command else ""
            lines.append(f"    pid {proc.pid} · {who}{job}{mem}{use}{cmd}")
        for waiting in gpu.waiting:
            lines.append(f"    waiting: {_reservation_text(waiting)}")
    for waiting in view.waiting_any:
        wanted = f" for {escape(waiting.wanted)}" if waiting.wanted else ""
        lines.append(f"Queued{wanted}: {_reservation_text(waiting)}")
    blocks: list[Block] = [header(title)]
    blocks.extend(section(chunk) for chunk in pack(lines, SECTION_TEXT_MAX))
    text = f"{escape(title)}: " + "; ".join(f"GPU {g.index}: {_gpu_state(g)}" for g in view.gpus)
    return fallback(text), fit(blocks)


def _gpu_state(gpu: WhoGpuView) -> str:
    """One GPU in a few words, for the fallback text."""
    if gpu.processes:
        return f"{len(gpu.processes)} process(es)"
    if gpu.held_by is not None:
        return f"held by job {gpu.held_by.job_ref}"
    return UNSEEN_IN_USE if gpu.unseen_mem_bytes is not None else "free"


def _reservation_text(job: WhoReservation) -> str:
    who = mention(job.slack_user) if job.slack_user else escape(job.user or "unknown")
    return f"job {code(job.job_ref)} · {who}"


def _process_use(sm_pct: int | None, cpu_pct: float | None, elapsed_s: float | None) -> str:
    """ " · SM 87% · CPU 101% · up 1h 2m" for what is known ("" for nothing)."""
    parts = []
    if sm_pct is not None:
        parts.append(f"SM {sm_pct}%")
    if cpu_pct is not None:
        parts.append(f"CPU {cpu_pct:.0f}%")
    if elapsed_s is not None:
        parts.append(f"up {format_duration(timedelta(seconds=elapsed_s))}")
    return "".join(f" · {p}" for p in parts)


def cancel_message(job: JobView) -> Message:
    """The answer to ``/gpu cancel``."""
    text = escape(f"Job {job.ref} on {job.instance_name}: {job.state}.")
    if job.state == "cancelled":
        text = escape(f"Cancelled job {job.ref} on {job.instance_name}.")
    return text, (section(f"{STATE_EMOJI.get(job.state, '')} {text}".strip()),)


def access_message(change: AccessChange) -> Message:
    """The answer to ``/gpu allow`` and ``/gpu deny``: what changed and who has access now."""
    who = mention(change.person_id)
    where = escape(change.instance_name)
    if change.granted:
        head = (
            f":white_check_mark: {who} may now run and cancel jobs on *{where}*."
            if change.changed
            else f"{who} could already run and cancel jobs on *{where}*; nothing changed."
        )
    else:
        head = (
            f":no_entry: {who} may no longer run or cancel jobs on *{where}* "
            "(jobs they started keep running)."
            if change.changed
            else f"{who} had no access to *{where}*; nothing changed."
        )
    others = ", ".join(mention(p) for p in change.allowed) or "nobody else"
    tail = f"Owner: {mention(change.owner_id)} · allowed: {others} · admins always may."
    text = f"{head}\n{tail}"
    return fallback(text), (section(head), context(tail))


def submitted_reply(job: JobView, posted: bool) -> Message:
    """The caller's answer to ``/gpu run``: the queued message itself when it could not be
    posted to the channel, else a short note."""
    if not posted:
        return queued_message(job)
    text = escape(
        f"Queued job {job.ref} on {job.instance_name} with {gpus_text(job)}. I'll reply in "
        "its thread when it ends."
    )
    return text, (section(text),)


# --- pieces -----------------------------------------------------------------------------------


def command_line(command: Sequence[str]) -> str:
    """argv as one line as it was typed: quotes only where a space or a character the shell
    treats specially needs them (the exact argv is what runs)."""
    return show_command(command)


def code_block(text: str, *, keep: str = "start") -> str:
    """``text`` as a code block that fits one section: cut at the end (``keep="start"``) or at
    the start (``keep="end"``, for logs), whole lines where possible."""
    body = escape(text.rstrip("\n")).replace(_FENCE, "'''")
    if len(body) > CODE_MAX:
        body = _cut_end(body, CODE_MAX) if keep == "end" else clip(body, CODE_MAX)
    return f"{_FENCE}\n{body or ' '}\n{_FENCE}"


def split_code(text: str, max_sections: int) -> list[str]:
    """A long text as code blocks of one section each, at most ``max_sections`` of them,
    keeping its end."""
    lines = escape(text.rstrip("\n")).replace(_FENCE, "'''").split("\n")
    chunks = pack(lines, CODE_MAX)
    kept = chunks[-max_sections:]
    if len(chunks) > len(kept):
        kept[0] = _cut_end("…\n" + kept[0], CODE_MAX)
    return [f"{_FENCE}\n{chunk or ' '}\n{_FENCE}" for chunk in kept]


def _cut_end(body: str, limit: int) -> str:
    """The last ``limit`` characters of ``body``, starting at a line where possible."""
    if len(body) <= limit:
        return body
    tail = body[-(limit - 2) :]
    newline = tail.find("\n")
    if 0 <= newline < len(tail) // 2:
        tail = tail[newline + 1 :]
    return "…\n" + tail


def _facts(job: JobView) -> list[str]:
    facts = [
        f"*State*\n{job.state}",
        f"*Exit code*\n{_exit_text(job)}",
        f"*Duration*\n{_duration_text(job)}",
        f"*GPUs*\n{escape(gpus_text(job))}",
        f"*GPU-hours*\n{_gpu_hours_text(job)}",
        f"*Cost*\n{_cost_text(job)}{_cost_basis(job)}",
    ]
    if job.retries:
        facts.append(f"*Attempts*\n{job.attempt} of {job.retries + 1}")
    if job.summary is not None and job.summary.cpu_avg_pct is not None:
        facts.append(f"*CPU*\n{job.summary.cpu_avg_pct:.0f}% of a core")
    return facts


def _gpu_lines(job: JobView) -> list[str]:
    assert job.summary is not None
    lines = []
    for gpu in job.summary.gpus:
        util = "?" if gpu.util_avg_pct is None else f"{gpu.util_avg_pct:.0f}%"
        peak = "?" if gpu.mem_peak_bytes is None else _gib(gpu.mem_peak_bytes)
        lines.append(f"GPU {gpu.index}: {util} busy on average, peak memory {peak}")
    return lines


def _list_line(job: JobView, *, with_instance: bool) -> str:
    emoji = STATE_EMOJI.get(job.state, "")
    where = f" on *{escape(job.instance_name)}*" if with_instance else ""
    who = f" · {mention(job.requested_by)}" if job.requested_by else ""
    extra = ""
    if job.final:
        extra = f" · exit {_exit_text(job)} · {_duration_text(job)}"
        if job.cost_micros is not None:
            extra += f" · {format_money(job.cost_micros, job.currency)}"
    else:
        extra = f" · {escape(gpus_text(job))}"
    cmd = code(clip(command_line(job.command), 120))
    return f"{emoji} `{escape(job.ref)}`{where} {job.state}{who}{extra} · {cmd}"


def gpus_text(job: JobView) -> str:
    """Which GPUs the job has, as CUDA_VISIBLE_DEVICES gives them ("GPU 0
    (CUDA_VISIBLE_DEVICES=0)"), or, before it starts, what it asked for ("one free GPU (the
    agent picks it when the job starts)"); "no GPU (CPU only)" for a job without."""
    if job.gpus_assigned:
        return assigned_phrase(job.gpus_assigned)
    if job.final:
        return "no GPU (CPU only)" if job.started_at is not None else "none (it never started)"
    wanted = job.gpus_requested
    if wanted and wanted[:1].isdigit():
        return gpus_phrase(wanted) + f" (CUDA_VISIBLE_DEVICES={wanted.rstrip(',')})"
    phrase = gpus_phrase(wanted)
    if wanted and wanted != "none":
        phrase += " (picked when the job starts)"
    return phrase


def _exit_text(job: JobView) -> str:
    return "-" if job.exit_code is None else str(job.exit_code)


def _duration_text(job: JobView) -> str:
    if job.duration_s is None:
        return "-"
    if job.duration_s < 1:
        return f"{job.duration_s:.1f}s"
    return format_duration(timedelta(seconds=job.duration_s))


def _gpu_hours_text(job: JobView) -> str:
    if job.gpu_hours is None:
        return "-"
    if not job.gpus_assigned:
        return "0 (no GPU held)"
    return f"{job.gpu_hours:.2f}"


def _cost_basis(job: JobView) -> str:
    """What the cost covers, on a line of its own: the job's GPUs' share of the instance, or
    the whole instance's time (a job that held no GPU still kept the instance rented)."""
    if job.cost_micros is None:
        return ""
    held = len(job.gpus_assigned)
    total = job.instance_gpu_count
    if held == 0:
        return "\n_the whole instance's time (the job held no GPU)_"
    if total is None or held >= total:
        return "\n_the whole instance's time_"
    return f"\n_its share: {held} of {total} GPUs_"


def _cost_text(job: JobView) -> str:
    return "-" if job.cost_micros is None else format_money(job.cost_micros, job.currency)


def _gib(n_bytes: int | None) -> str:
    return "?" if n_bytes is None else f"{n_bytes / _GIB:.1f} GiB"


def _job_queued(notice: JobQueued) -> Message:
    """The notice of a queued job, as its channel message."""
    return queued_message(notice.job)


def _job_finished(notice: JobFinished) -> Message:
    """The notice of a job that ended, as its completion reply."""
    return completion_reply(notice.job)


#: The notices this module renders (joined in bot.blocks.RENDERERS).
RENDERERS: dict[type[Notice], _Callable[[Any], Message]] = {
    JobQueued: _job_queued,
    JobFinished: _job_finished,
}
