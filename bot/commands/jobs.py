"""`/gpu run`, `/gpu jobs`, `/gpu logs`, `/gpu cancel`, `/gpu who`, `/gpu allow`, `/gpu deny`:
parse, call the job service, render. ``register`` adds them to a registry."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bot.blocks import jobs as blocks
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.i18n import N_
from bot.services.access import Caller
from bot.services.jobs import access as job_access
from bot.services.jobs import runs as service
from bot.values import whole_number

if TYPE_CHECKING:
    from bot.runtime import Runtime

RUN_USAGE = (
    "/gpu run NAME [--gpus 0,1|any:N|all|none] [--retries N] [--release-when-done] -- CMD ..."
)
JOBS_USAGE = "/gpu jobs [NAME]"
LOGS_USAGE = "/gpu logs JOB [--tail N]"
CANCEL_USAGE = "/gpu cancel JOB"
WHO_USAGE = "/gpu who NAME"
ALLOW_USAGE = "/gpu allow NAME @user"
DENY_USAGE = "/gpu deny NAME @user"


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the instance")
    parser.add_argument(
        "--gpus",
        metavar="0,1|any:N|all|none",
        help=(
            "GPU indices as CUDA_VISIBLE_DEVICES numbers them (0 is GPU 0), any:N for any N "
            "free GPUs, all, or none for CPU only; default: one free GPU"
        ),
    )
    parser.add_argument(
        "--retries",
        metavar="N",
        type=whole_number("--retries"),
        default=0,
        help="re-runs on failure",
    )
    parser.add_argument("--release-when-done", action="store_true", help="release when done")


def _configure_jobs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", nargs="?", help="the instance")


def _configure_logs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="the job's number or id")
    parser.add_argument(
        "--tail", metavar="N", type=whole_number("--tail", 1), help="how many lines"
    )


def _configure_cancel(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="the job's number or id")


def _configure_who(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the instance")


def _configure_access(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the instance")
    parser.add_argument("person", metavar="@user", help="a mention or a Slack ID")


def handle_run(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """Queue the command after `--` on the instance."""
    result = service.submit(
        rt,
        caller,
        args.name,
        list(args.command),
        gpus=args.gpus,
        retries=args.retries,
        release_when_done=args.release_when_done,
    )
    text, body = blocks.submitted_reply(result.job, result.posted)
    return Reply(text=text, blocks=body, ephemeral=result.posted)


def handle_jobs(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """The queue of one instance, or the fleet's recent jobs."""
    text, body = blocks.job_list(service.list_jobs(rt, args.name, caller))
    return Reply(text=text, blocks=body)


def handle_logs(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """The last lines of a job's log."""
    text, body = blocks.log_message(service.logs(rt, caller, args.job, args.tail))
    return Reply(text=text, blocks=body)


def handle_cancel(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """Cancel a queued or running job."""
    text, body = blocks.cancel_message(service.cancel(rt, caller, args.job))
    return Reply(text=text, blocks=body)


def handle_who(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """Who holds each GPU of the instance."""
    text, body = blocks.who_message(service.who(rt, args.name, caller))
    return Reply(text=text, blocks=body)


def handle_allow(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """Let someone run and cancel jobs on the caller's instance."""
    text, body = blocks.access_message(job_access.allow(rt, caller, args.name, args.person))
    return Reply(text=text, blocks=body)


def handle_deny(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """Take that back."""
    text, body = blocks.access_message(job_access.deny(rt, caller, args.name, args.person))
    return Reply(text=text, blocks=body)


RUN = CommandSpec(
    name="run",
    summary=N_(
        "Queue a job on an instance; I reply in its thread when it ends (exit code, "
        "duration, cost, GPU use, hints, log tail). --gpus names GPUs by index as "
        "CUDA_VISIBLE_DEVICES does (--gpus 0 is GPU 0, --gpus 0,1 GPUs 0 and 1); --gpus any:2 "
        "takes any 2 free GPUs, --gpus all every GPU, --gpus none none (CPU only). Without "
        "--gpus a job gets one free GPU (it waits for one if all are busy; on a machine "
        "with no usable GPU it runs on the CPU). The job sees its GPUs as "
        "CUDA_VISIBLE_DEVICES, and my reply says which it got"
    ),
    usage=RUN_USAGE,
    examples=(
        "/gpu run box1 -- python train.py --lr 3e-4",
        "/gpu run box1 --gpus 0 -- ollama serve",
        "/gpu run box1 --gpus any:2 --retries 2 -- torchrun --nproc_per_node=2 train.py",
        "/gpu run box1 --gpus none --release-when-done -- bash -c 'make data && python eval.py'",
    ),
    configure=_configure_run,
    handler=handle_run,
    remainder=True,
)
JOBS = CommandSpec(
    name="jobs",
    summary=N_("The job queue of an instance, or the fleet's recent jobs"),
    usage=JOBS_USAGE,
    examples=("/gpu jobs", "/gpu jobs box1"),
    configure=_configure_jobs,
    handler=handle_jobs,
)
LOGS = CommandSpec(
    name="logs",
    summary=N_("The last lines of a job's log"),
    usage=LOGS_USAGE,
    examples=("/gpu logs 42", "/gpu logs 42 --tail 200", "/gpu logs box1:20261202-110000-ab12"),
    configure=_configure_logs,
    handler=handle_logs,
)
CANCEL = CommandSpec(
    name="cancel",
    summary=N_("Cancel a queued or running job (its whole process tree)"),
    usage=CANCEL_USAGE,
    examples=("/gpu cancel 42",),
    configure=_configure_cancel,
    handler=handle_cancel,
)
WHO = CommandSpec(
    name="who",
    summary=N_("Which person and job holds each GPU of an instance"),
    usage=WHO_USAGE,
    examples=("/gpu who box1",),
    configure=_configure_who,
    handler=handle_who,
)
ALLOW = CommandSpec(
    name="allow",
    summary=N_("Let someone run and cancel jobs on your instance (owner or admin)"),
    usage=ALLOW_USAGE,
    examples=("/gpu allow box1 @alice",),
    configure=_configure_access,
    handler=handle_allow,
)
DENY = CommandSpec(
    name="deny",
    summary=N_("Take back someone's access to run and cancel jobs on your instance"),
    usage=DENY_USAGE,
    examples=("/gpu deny box1 @alice",),
    configure=_configure_access,
    handler=handle_deny,
)


def register(registry: Registry) -> None:
    """Add this module's commands and buttons to ``registry``."""
    for spec in (
        RUN,
        JOBS,
        LOGS,
        CANCEL,
        WHO,
        ALLOW,
        DENY,
    ):
        registry.command(spec)
