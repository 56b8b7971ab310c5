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

from agents.protocol import JobRequestError, parse_gpus, show_command
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
from bot.i18n import N_, nt, t
from bot.notify import Notice
from bot.services.jobs.runs import JobFinished, JobQueued
from bot.services.jobs.views import (
    AccessChange,
    JobListView,
    JobView,
    LogView,
    WhoGpuView,
    WhoReservation,
    WhoView,
)
from bot.services.speaking import agent_text
from bot.values import format_duration, format_money

#: Said instead of a job's command to whoever may not read it (bot.services.jobs.access).
COMMAND_HIDDEN = N_("command not shown")
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
#: A job's state in words (the states are English words in the store).
_STATE_WORDS = {
    "queued": N_("queued"),
    "running": N_("running"),
    "succeeded": N_("succeeded"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
    "lost": N_("lost"),
}
_FENCE = "```"
#: A code block's text may use this much of a section (fences and a newline each side).
CODE_MAX = SECTION_TEXT_MAX - 2 * (len(_FENCE) + 1)
#: Log sections ``/gpu logs`` may show (the newest lines win).
LOG_SECTIONS_MAX = 12
_GIB = 1024**3
#: A GPU whose memory is in use though no process on it is visible here.
UNSEEN_IN_USE = N_("in use (no process visible: another container?)")
#: A job that asked for no GPU, or got none.
NO_GPU = N_("no GPU (CPU only)")
#: A process on a GPU that no job of the agent's started.
NOT_OURS = N_("not a gpubot job")


def queued_message(job: JobView) -> Message:
    """The channel message posted when a job is queued; its thread gets the completion reply."""
    title = t("Job {ref} queued on {instance}", ref=job.ref, instance=job.instance_name)
    head = f"{STATE_EMOJI['queued']} *{escape(title)}*"
    if job.requested_by:
        head = t("{title} for {who}", title=head, who=mention(job.requested_by))
    gpus = escape(gpus_text(job))
    if job.gpus_note:
        gpus = t("{gpus} ({why})", gpus=gpus, why=escape(job.gpus_note))
    details = [t("GPUs: {gpus}", gpus=gpus)]
    if job.retries:
        details.append(t("retries: {n}", n=job.retries))
    if job.release_when_done:
        details.append(t("the instance is released when its jobs are done"))
    blocks: list[Block] = [
        section(head),
        section(code_block(command_line(job.command))),
        context(
            " · ".join(details),
            t(
                "Agent job `{id}`. I'll reply in this thread when it ends.",
                id=escape(job.agent_job_id),
            ),
        ),
    ]
    blocks.extend(section(chunk) for chunk in pack(in_use_lines(job), SECTION_TEXT_MAX))
    text = t("{title}: {command}", title=escape(title), command=escape(command_line(job.command)))
    return fallback(text), fit(blocks)


def in_use_lines(job: JobView) -> list[str]:
    """Why a job queued for any free GPUs waits: a heading, then one line per GPU it cannot
    have saying who or what holds it; [] when nothing holds it back."""
    if not job.gpus_in_use:
        return []
    head = ":hourglass_flowing_sand: " + t(
        "*It waits for {gpus}.* These GPUs are in use:", gpus=escape(gpus_text(job))
    )
    return [head, *(holder_line(gpu) for gpu in job.gpus_in_use)]


def holder_line(gpu: WhoGpuView) -> str:
    """One GPU and what holds it: the agent's job and who ran it, each process by pid, user
    and memory (marked when no job of the agent's started it), memory no visible process
    holds, and its load."""
    parts = []
    if gpu.held_by is not None:
        parts.append(_reservation_text(gpu.held_by))
    for proc in gpu.processes:
        who = mention(proc.slack_user) if proc.slack_user else escape(proc.user or t("unknown"))
        mem = f" · {_gib(proc.used_mem_bytes)}" if proc.used_mem_bytes is not None else ""
        mark = t("job {ref}", ref=code(proc.job_ref)) if proc.job_ref else t(NOT_OURS)
        parts.append(f"pid {proc.pid} · {who}{mem} · {mark}")
    if gpu.unseen_mem_bytes is not None:
        size = _gib(gpu.unseen_mem_bytes)
        parts.append(
            t("{size} in use, no process visible (another container?)", size=size)
            if not gpu.processes
            else t(
                "and {size} in use by processes not visible here (another container?)",
                size=size,
            )
        )
    if gpu.util_gpu_pct:
        parts.append(t("{percent}% busy", percent=gpu.util_gpu_pct))
    return f"*GPU {gpu.index}*: " + "; ".join(parts)


def completion_reply(job: JobView) -> Message:
    """The thread reply when a job ends: state, command, duration, exit code, GPU-hours and
    cost, per-GPU utilisation and peak memory, diagnoses, the log's last lines, and a button
    to release the instance."""
    emoji = STATE_EMOJI.get(job.state, ":grey_question:")
    title = t(
        "Job {ref} on {instance} {state}",
        ref=job.ref,
        instance=job.instance_name,
        state=state_word(job.state),
    )
    head = f"{emoji} *{escape(title)}*"
    if job.requested_by:
        head += f" {mention(job.requested_by)}"
    if job.cancelled_by:
        head += "\n" + t("Cancelled by {who}.", who=mention(job.cancelled_by))
    if job.note and job.note.strip().lower() != job.state:  # "cancelled" says nothing new
        head += f"\n{escape(job.note)}"
    if job.gpus_note:
        head += "\n" + t("{sentence}.", sentence=escape(job.gpus_note))
    blocks: list[Block] = [section(head), fields(_facts(job))]
    blocks.append(section(code_block(command_line(job.command))))
    summary = job.summary
    if summary is not None and summary.gpus:
        blocks.extend(section(chunk) for chunk in pack(_gpu_lines(job), SECTION_TEXT_MAX))
    if summary is not None and summary.diagnoses:
        lines = [f":bulb: {escape(agent_text.diagnosis(d))}" for d in summary.diagnoses]
        blocks.extend(section(chunk) for chunk in pack(lines, SECTION_TEXT_MAX))
    if summary is not None and summary.log_tail.strip():
        blocks.append(section(code_block(summary.log_tail, keep="end")))
    if job.instance_active:
        blocks.append(actions([button(t("Release instance"), RELEASE_ASK, str(job.instance_id))]))
    text = t(
        "{title} ({exit}, {duration}, {cost})",
        title=escape(title),
        exit=_exit_text(job),
        duration=_duration_text(job),
        cost=_cost_text(job),
    )
    return fallback(text), fit(blocks)


def job_list(view: JobListView) -> Message:
    """``/gpu jobs [NAME]``: one line per job, newest last."""
    name = view.instance_name
    if not view.jobs:
        text = escape(
            t("No jobs on {instance}.", instance=name) if name else t("No jobs on the fleet.")
        )
        blocks: list[Block] = [section(text)]
        if view.problem:
            blocks.append(context(escape(view.problem)))
        return text, tuple(blocks)
    lines = [_list_line(job, with_instance=name is None) for job in view.jobs]
    title = t("Jobs on {instance}", instance=name) if name else t("Jobs on the fleet")
    blocks = [header(title)]
    blocks.extend(section(chunk) for chunk in pack(lines, SECTION_TEXT_MAX))
    if view.problem:
        blocks.append(context(escape(view.problem)))
    text = escape(
        t("{title}:", title=title)
        + "\n"
        + "\n".join(f"{job.ref} {state_word(job.state)} {_shown_command(job)}" for job in view.jobs)
    )
    return fallback(text), fit(blocks, t("{n} more sections not shown."))


def log_message(view: LogView) -> Message:
    """``/gpu logs JOB``: the log's last lines as code, split over sections when long."""
    job = view.job
    state = state_word(job.state)
    if view.state_stale:
        state = t("{state}, as the bot last saw it", state=state)
    title = t(
        "Log of job {ref} on {instance} ({state})",
        ref=job.ref,
        instance=job.instance_name,
        state=state,
    )
    blocks: list[Block] = [section(f"{STATE_EMOJI.get(job.state, '')} *{escape(title)}*".strip())]
    if not view.text.strip():
        blocks.append(context(t("The log is empty so far.")))
        return fallback(escape(t("{title}: empty", title=title))), tuple(blocks)
    chunks = split_code(view.text, LOG_SECTIONS_MAX)
    blocks.extend(section(chunk) for chunk in chunks)
    more = code(f"/gpu logs {job.ref} --tail N")
    blocks.append(context(t("Last {n} lines at most. {command}", n=view.tail, command=more)))
    return fallback(escape(f"{title}\n{view.text}")), fit(blocks)


def who_message(view: WhoView) -> Message:
    """``/gpu who NAME``: every GPU, who holds it and whether it is busy; queued jobs."""
    title = t("Who uses the GPUs of {instance}", instance=view.instance_name)
    if not view.gpus:
        return t("{title}: no GPUs.", title=escape(title)), (
            section(t("*{title}*: no GPUs.", title=escape(title))),
        )
    lines = [line for gpu in view.gpus for line in _who_gpu_lines(gpu)]
    for waiting in view.waiting_any:
        job = _reservation_text(waiting)
        lines.append(
            t("Queued for {wanted}: {job}", wanted=escape(waiting.wanted), job=job)
            if waiting.wanted
            else t("Queued: {job}", job=job)
        )
    blocks: list[Block] = [header(title)]
    blocks.extend(section(chunk) for chunk in pack(lines, SECTION_TEXT_MAX))
    states = "; ".join(f"GPU {g.index}: {_gpu_state(g)}" for g in view.gpus)
    text = t("{title}: {gpus}", title=escape(title), gpus=states)
    return fallback(text), fit(blocks)


def _who_gpu_lines(gpu: WhoGpuView) -> list[str]:
    """One GPU of ``/gpu who``: its use, who holds it, its processes and who waits for it."""
    indent = "    "
    busy = []
    if gpu.util_gpu_pct is not None:
        busy.append(t("{percent}% busy", percent=gpu.util_gpu_pct))
    if gpu.mem_used_bytes is not None and gpu.mem_total_bytes:
        used, total = _gib(gpu.mem_used_bytes), _gib(gpu.mem_total_bytes)
        busy.append(t("{used} of {total}", used=used, total=total))
    lines = [f"*GPU {gpu.index}* {escape(gpu.name)}" + "".join(f" · {b}" for b in busy)]
    if gpu.held_by is not None:
        job = _reservation_text(gpu.held_by)
        held = (
            t("held by {job} (starting)", job=job)
            if gpu.held_by.starting
            else t("held by {job}", job=job)
        )
        lines.append(indent + held)
    if gpu.unseen_mem_bytes is not None and not gpu.processes:
        lines.append(f"{indent}{t(UNSEEN_IN_USE)} · {_gib(gpu.unseen_mem_bytes)}")
    elif gpu.unseen_mem_bytes is not None:
        lines.append(
            indent
            + t(
                "and {size} in use by processes not visible here (another container?)",
                size=_gib(gpu.unseen_mem_bytes),
            )
        )
    if gpu.used_outside:
        lines.append(
            f"{indent}:warning: "
            + t("in use outside gpubot: new jobs wait for it unless they name it in --gpus")
        )
    if gpu.free:
        lines.append(indent + t("free"))
    for proc in gpu.processes:
        who = mention(proc.slack_user) if proc.slack_user else escape(proc.user or t("unknown"))
        job = " · " + (t("job {ref}", ref=code(proc.job_ref)) if proc.job_ref else t(NOT_OURS))
        mem = f" · {_gib(proc.used_mem_bytes)}" if proc.used_mem_bytes is not None else ""
        use = _process_use(proc.sm_util_pct, proc.cpu_pct, proc.elapsed_s)
        cmd = f" · {code(clip(proc.command, 200))}" if proc.command else ""
        if proc.command_hidden:
            cmd = " · " + t(COMMAND_HIDDEN)
        lines.append(f"{indent}pid {proc.pid} · {who}{job}{mem}{use}{cmd}")
    for waiting in gpu.waiting:
        lines.append(indent + t("waiting: {job}", job=_reservation_text(waiting)))
    return lines


def _gpu_state(gpu: WhoGpuView) -> str:
    """One GPU in a few words, for the fallback text."""
    if gpu.processes:
        state = t("{n} process(es)", n=len(gpu.processes))
        return t("{state}, in use outside gpubot", state=state) if gpu.used_outside else state
    if gpu.held_by is not None:
        return t("held by job {ref}", ref=gpu.held_by.job_ref)
    if gpu.unseen_mem_bytes is not None:
        return t(UNSEEN_IN_USE)
    return t("free") if gpu.free else t("busy outside gpubot")


def _reservation_text(job: WhoReservation) -> str:
    who = mention(job.slack_user) if job.slack_user else escape(job.user or t("unknown"))
    return t("job {ref} · {who}", ref=code(job.job_ref), who=who)


def _process_use(sm_pct: int | None, cpu_pct: float | None, elapsed_s: float | None) -> str:
    """ " · SM 87% · CPU 101% · up 1h 2m" for what is known ("" for nothing)."""
    parts = []
    if sm_pct is not None:
        parts.append(f"SM {sm_pct}%")
    if cpu_pct is not None:
        parts.append(f"CPU {cpu_pct:.0f}%")
    if elapsed_s is not None:
        parts.append(t("up {duration}", duration=format_duration(timedelta(seconds=elapsed_s))))
    return "".join(f" · {p}" for p in parts)


def cancel_message(job: JobView) -> Message:
    """The answer to ``/gpu cancel``."""
    if job.state == "cancelled":
        text = escape(
            t("Cancelled job {ref} on {instance}.", ref=job.ref, instance=job.instance_name)
        )
    else:
        text = escape(
            t(
                "Job {ref} on {instance}: {state}.",
                ref=job.ref,
                instance=job.instance_name,
                state=state_word(job.state),
            )
        )
    return text, (section(f"{STATE_EMOJI.get(job.state, '')} {text}".strip()),)


def access_message(change: AccessChange) -> Message:
    """The answer to ``/gpu allow`` and ``/gpu deny``: what changed and who has access now."""
    who = mention(change.person_id)
    where = escape(change.instance_name)
    if change.granted:
        head = (
            t(
                ":white_check_mark: {who} may now run and cancel jobs on *{where}*.",
                who=who,
                where=where,
            )
            if change.changed
            else t(
                "{who} could already run and cancel jobs on *{where}*; nothing changed.",
                who=who,
                where=where,
            )
        )
    else:
        head = (
            t(
                ":no_entry: {who} may no longer run or cancel jobs on *{where}* "
                "(jobs they started keep running).",
                who=who,
                where=where,
            )
            if change.changed
            else t("{who} had no access to *{where}*; nothing changed.", who=who, where=where)
        )
    others = ", ".join(mention(p) for p in change.allowed) or t("nobody else")
    tail = t(
        "Owner: {owner} · allowed: {others} · admins always may.",
        owner=mention(change.owner_id),
        others=others,
    )
    text = f"{head}\n{tail}"
    return fallback(text), (section(head), context(tail))


def submitted_reply(job: JobView, posted: bool) -> Message:
    """The caller's answer to ``/gpu run``: the queued message itself when it could not be
    posted to the channel, else a short note."""
    if not posted:
        return queued_message(job)
    text = escape(
        t(
            "Queued job {ref} on {instance} with {gpus}. I'll reply in its thread when it ends.",
            ref=job.ref,
            instance=job.instance_name,
            gpus=gpus_text(job),
        )
    )
    waiting = in_use_lines(job)
    body: list[Block] = [section(text)]
    body.extend(section(chunk) for chunk in pack(waiting, SECTION_TEXT_MAX))
    return fallback("\n".join([text, *waiting])), fit(body)


# --- pieces -----------------------------------------------------------------------------------


def _shown_command(job: JobView) -> str:
    return t(COMMAND_HIDDEN) if job.command_hidden else command_line(job.command)


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
        t("*State*\n{state}", state=state_word(job.state)),
        t("*Exit code*\n{code}", code=_exit_text(job)),
        t("*Duration*\n{duration}", duration=_duration_text(job)),
        t("*GPUs*\n{gpus}", gpus=escape(gpus_text(job))),
        t("*GPU-hours*\n{hours}", hours=_gpu_hours_text(job)),
        t("*Cost*\n{cost}", cost=_cost_text(job)) + _cost_basis(job),
    ]
    if job.retries:
        facts.append(
            t("*Attempts*\n{attempt} of {total}", attempt=job.attempt, total=job.retries + 1)
        )
    if job.summary is not None and job.summary.cpu_avg_pct is not None:
        percent = f"{job.summary.cpu_avg_pct:.0f}"
        facts.append(t("*CPU*\n{percent}% of a core", percent=percent))
    return facts


def _gpu_lines(job: JobView) -> list[str]:
    assert job.summary is not None
    lines = []
    for gpu in job.summary.gpus:
        util = "?" if gpu.util_avg_pct is None else f"{gpu.util_avg_pct:.0f}%"
        peak = "?" if gpu.mem_peak_bytes is None else _gib(gpu.mem_peak_bytes)
        lines.append(
            t(
                "GPU {index}: {util} busy on average, peak memory {peak}",
                index=gpu.index,
                util=util,
                peak=peak,
            )
        )
    return lines


def _list_line(job: JobView, *, with_instance: bool) -> str:
    emoji = STATE_EMOJI.get(job.state, "")
    where = " " + t("on *{instance}*", instance=escape(job.instance_name)) if with_instance else ""
    who = f" · {mention(job.requested_by)}" if job.requested_by else ""
    extra = ""
    if job.final:
        extra = " · " + t("exit {code}", code=_exit_text(job)) + f" · {_duration_text(job)}"
        if job.cost_micros is not None:
            extra += f" · {format_money(job.cost_micros, job.currency)}"
    else:
        extra = f" · {escape(gpus_text(job))}"
    cmd = t(COMMAND_HIDDEN) if job.command_hidden else code(clip(command_line(job.command), 120))
    return f"{emoji} `{escape(job.ref)}`{where} {state_word(job.state)}{who}{extra} · {cmd}"


def state_word(state: str) -> str:
    """A job's state (``succeeded``, ``failed``…) in the reader's language."""
    word = _STATE_WORDS.get(state)
    return t(word) if word is not None else state


def gpus_text(job: JobView) -> str:
    """Which GPUs the job has, as CUDA_VISIBLE_DEVICES gives them ("GPU 0
    (CUDA_VISIBLE_DEVICES=0)"), or, before it starts, what it asked for ("one free GPU (the
    agent picks it when the job starts)"); "no GPU (CPU only)" for a job without."""
    if job.gpus_assigned:
        indices = job.gpus_assigned
        return f"{_gpu_words(indices)} (CUDA_VISIBLE_DEVICES={','.join(map(str, indices))})"
    if job.final:
        return t(NO_GPU) if job.started_at is not None else t("none (it never started)")
    wanted = job.gpus_requested
    if wanted and wanted[:1].isdigit():
        return _requested_text(wanted) + f" (CUDA_VISIBLE_DEVICES={wanted.rstrip(',')})"
    phrase = _requested_text(wanted)
    if wanted and wanted != "none":
        phrase = t("{gpus} (picked when the job starts)", gpus=phrase)
    return phrase


def _gpu_words(indices: Sequence[int]) -> str:
    """``GPU 3`` or ``GPUs 0, 1``."""
    ids = ", ".join(str(i) for i in indices)
    return nt("GPU {ids}", "GPUs {ids}", len(indices), ids=ids)


def _requested_text(wanted: str | None) -> str:
    """A request as the job record stores it (``gpus_requested``), in words: ``GPU 3``, ``one
    free GPU``, ``any 2 free GPUs``, ``all GPUs`` or ``no GPU (CPU only)`` (also for None); a
    request that does not parse as itself."""
    if not wanted or wanted.strip().lower() == "none":
        return t(NO_GPU)
    try:
        request = parse_gpus(wanted)
    except JobRequestError:
        return wanted
    if request.auto:
        return t("one free GPU")
    if request.indices:
        return _gpu_words(request.indices)
    if request.count < 0:
        return t("all GPUs")
    if request.count == 1:
        return t("one free GPU")
    return t("any {n} free GPUs", n=request.count)


def _exit_text(job: JobView) -> str:
    return "-" if job.exit_code is None else str(job.exit_code)


def _duration_text(job: JobView) -> str:
    if job.duration_s is None:
        return "-"
    if job.duration_s < 1:
        return t("{seconds}s", seconds=f"{job.duration_s:.1f}")
    return format_duration(timedelta(seconds=job.duration_s))


def _gpu_hours_text(job: JobView) -> str:
    if job.gpu_hours is None:
        return "-"
    if not job.gpus_assigned:
        return t("0 (no GPU held)")
    return f"{job.gpu_hours:.2f}"


def _cost_basis(job: JobView) -> str:
    """What the cost covers, on a line of its own: the job's GPUs' share of the instance, or
    the whole instance's time (a job that held no GPU still kept the instance rented)."""
    if job.cost_micros is None:
        return ""
    held = len(job.gpus_assigned)
    total = job.instance_gpu_count
    if held == 0:
        return "\n" + t("_the whole instance's time (the job held no GPU)_")
    if total is None or held >= total:
        return "\n" + t("_the whole instance's time_")
    return "\n" + t("_its share: {held} of {total} GPUs_", held=held, total=total)


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
