"""``gpu-agent run | jobs | logs | cancel | who``: the job commands on the agent's command line.

``register(subparsers)`` adds them to agents.cli's parser. Each handler returns the exit code:
0 ok, 1 the command failed, 2 usage error (the message goes to stderr). With ``--json`` the
output is one JSON document: ``run`` and ``cancel`` print a JobRecord, ``jobs`` a JobList,
``who`` a WhoReport (agents.protocol); a failure prints a JobFailure (its code, English, and
the template and parameters it was made of).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, List, Optional, Tuple

from agents import messages, protocol
from agents.arguments import whole_number

_MIB = 1024 * 1024


def register(subparsers: Any) -> None:
    """Add the job subcommands to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    run = subparsers.add_parser(
        "run",
        help="queue a command as a detached job",
        description=(
            "Queue a command as a job that outlives this session. The command is given as "
            f"arguments after --, run without a shell. GPUs: {protocol.GPUS_FORMS}, or none "
            "when this machine has no usable GPU. The job sees its GPUs as "
            "CUDA_VISIBLE_DEVICES."
        ),
    )
    run.add_argument(
        "--gpus",
        metavar="0,1|any:N|all|none",
        help="GPUs by index as CUDA_VISIBLE_DEVICES, any N free, all, or none",
    )
    run.add_argument("--name", help="a name for the job")
    run.add_argument(
        "--retries",
        type=whole_number(0, 100),
        default=0,
        metavar="N",
        help="re-run up to N times on failure",
    )
    run.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="set a variable (repeatable)"
    )
    run.add_argument("--cwd", metavar="DIR", help="working directory (default: the current one)")
    run.add_argument("--json", action="store_true", help="print the new job as JSON")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARG...")
    run.set_defaults(handler=_guard(cmd_run))

    jobs = subparsers.add_parser("jobs", help="list jobs")
    jobs.add_argument("--since", metavar="ISO", help="only jobs changed at or after this time")
    jobs.add_argument("--json", action="store_true", help="print one JSON document")
    jobs.set_defaults(handler=_guard(cmd_jobs))

    logs = subparsers.add_parser("logs", help="print a job's log")
    logs.add_argument("job", metavar="JOB", help="job id (or a unique prefix, or its name)")
    logs.add_argument("--tail", type=whole_number(0), metavar="N", help="only the last N lines")
    logs.set_defaults(handler=_guard(cmd_logs))

    cancel = subparsers.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job", metavar="JOB", help="job id (or a unique prefix, or its name)")
    cancel.add_argument("--json", action="store_true", help="print the job as JSON")
    cancel.set_defaults(handler=_guard(cmd_cancel))

    who = subparsers.add_parser("who", help="which user and job holds each GPU")
    who.add_argument("--json", action="store_true", help="print one JSON document")
    who.set_defaults(handler=_guard(cmd_who))


def cmd_run(args: argparse.Namespace) -> int:
    """``run``: queue the job and start its supervisor."""
    from agents import jobstore, runner

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    request = runner.RunRequest(
        command=tuple(command),
        gpus=protocol.parse_gpus(args.gpus),
        name=args.name,
        retries=args.retries,
        env=tuple(_env_pair(item) for item in args.env),
        cwd=args.cwd,
    )
    record = runner.submit(jobstore.JobStore.from_env(), request)
    if args.json:
        _emit(protocol.dumps(record))
    else:
        _emit(
            f"queued job {record.id} on {protocol.gpus_phrase(record.gpus_requested)}: "
            f"{_shown_command(record.command)}"
        )
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    """``jobs``: every job, oldest first."""
    from agents import jobstore, runner

    since = None
    if args.since:
        try:
            since = jobstore.parse_iso(args.since)
        except ValueError as exc:
            raise protocol.JobRequestError.said(
                "since_form", messages.SINCE_FORM, value=repr(args.since)
            ) from exc
    listing = runner.list_jobs(jobstore.JobStore.from_env(), since)
    _emit(protocol.dumps(listing) if args.json else render_jobs(listing))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """``logs``: the job's log as it is now."""
    from agents import jobstore, runner

    text = runner.read_log(jobstore.JobStore.from_env(), args.job, args.tail)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """``cancel``: stop the job and print it once final."""
    from agents import jobstore, runner

    record = runner.cancel(jobstore.JobStore.from_env(), args.job)
    if args.json:
        _emit(protocol.dumps(record))
    else:
        _emit(f"job {record.id}: {record.state}")
    return 0


def cmd_who(args: argparse.Namespace) -> int:
    """``who``: each GPU's processes with their user and job."""
    from agents import jobstore, runner

    report = runner.who(jobstore.JobStore.from_env())
    _emit(protocol.dumps(report) if args.json else render_who(report))
    return 0


def render_jobs(listing: protocol.JobList) -> str:
    """The job list as a text table."""
    if not listing.jobs:
        return "no jobs"
    rows: List[Tuple[str, ...]] = [("ID", "STATE", "GPUS", "TRY", "EXIT", "CREATED", "COMMAND")]
    for job in listing.jobs:
        rows.append(
            (
                job.id,
                job.state,
                ",".join(str(g) for g in job.gpus_assigned) or (job.gpus_requested or "none"),
                f"{job.attempt}/{job.retries + 1}",
                "-" if job.exit_code is None else str(job.exit_code),
                job.created_at[:19].replace("T", " "),
                _shown_command(job.command, 60),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows
    )


def render_who(report: protocol.WhoReport) -> str:
    """Each GPU with its use, the agent job holding it, its processes (GPU memory, SM %, CPU %,
    running time) and the jobs waiting for it; then jobs waiting for any GPU."""
    if not report.gpus:
        return "no GPUs"
    from agents.render import format_bytes, format_duration

    lines = []
    for gpu in report.gpus:
        use = ""
        if gpu.util_gpu_pct is not None:
            use = f"  {gpu.util_gpu_pct}% busy"
        if gpu.mem_used_bytes is not None and gpu.mem_total_bytes:
            use += f", {format_bytes(gpu.mem_used_bytes)} of {format_bytes(gpu.mem_total_bytes)}"
        lines.append(f"GPU {gpu.index}  {gpu.name}{use}")
        holder = gpu.held_by
        if holder is not None:
            started = any(p.job_id == holder.job_id for p in gpu.processes)
            lines.append(f"  held by job {_job_label(holder)}{'' if started else ' (starting)'}")
        unseen = gpu.unseen_mem_bytes
        if unseen is not None and not gpu.processes:
            lines.append("  in use (no process visible: another container?)")
        elif unseen is not None:
            lines.append(f"  {format_bytes(unseen)} more in use by processes not visible here")
        if gpu.free:
            lines.append("  free")
        for proc in gpu.processes:
            mem = "?" if proc.used_mem_bytes is None else f"{proc.used_mem_bytes // _MIB} MiB"
            owner = f"job {proc.job_id}" if proc.job_id else "not an agent job"
            sm = "SM ?" if proc.sm_util_pct is None else f"SM {proc.sm_util_pct}%"
            cpu = "CPU ?" if proc.cpu_pct is None else f"CPU {proc.cpu_pct:.0f}%"
            age = f"up {format_duration(proc.elapsed_s)}"
            lines.append(
                f"  pid {proc.pid}  {proc.user or '?'}  {mem}  {sm}  {cpu}  {age}  {owner}  "
                f"{proc.command or ''}".rstrip()
            )
        for waiter in gpu.waiting:
            lines.append(f"  waited for by job {_job_label(waiter)}")
    for job in report.waiting_any:
        wanted = protocol.gpus_phrase(job.gpus_requested)
        lines.append(f"queued: job {_job_label(job)} waits for {wanted}")
    return "\n".join(lines)


def _job_label(job: protocol.WhoJob) -> str:
    name = f" ({job.name})" if job.name else ""
    return f"{job.job_id}{name}, {job.user or '?'}"


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the runner's errors into a message on stderr and their exit code; with ``--json``
    also the error document (protocol.JobFailure) on stdout."""

    def handler(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except protocol.JobError as exc:
            sys.stderr.write(f"gpu-agent: error: {exc}\n")
            if getattr(args, "json", False):
                _emit(protocol.dumps(exc.failure()))
            return exc.exit_code

    handler.__doc__ = fn.__doc__
    return handler


def _emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _env_pair(item: str) -> Tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise protocol.JobRequestError.said("env_form", messages.ENV_FORM, item=repr(item))
    return key, value


def _shown_command(command: Any, limit: Optional[int] = None) -> str:
    text = protocol.show_command(command)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text
