"""The ``gpu-agent`` command line: ``status``, ``health``, ``version`` and the job commands.

Exit codes: 0 success, 1 a health check failed or the command failed, 2 usage error (the
message goes to stderr). Every command takes ``--json`` and then prints exactly one JSON
document on stdout carrying ``"schema": 1``.

``status`` is what the bot runs on every poll of every instance, so ``status`` and
``status --json`` are answered without argparse, ``dataclasses`` or ``json``: the collector's
document is printed as it is (see :mod:`agents.nvml`). Every other command line, abbreviations
and ``--help`` included, goes through the parser in :mod:`agents.arguments`. Heavy modules (NVML,
health checks, the job runner) are imported inside the commands, and the job subcommands are
registered only when the command line asks for one of them (or for help).
"""

from __future__ import annotations

import sys

from agents import __version__
from agents.usage import UsageError

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, Dict, List, Optional, Sequence

    from agents.protocol import StatusSnapshot

    Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Commands this module defines; any other command line also gets the job subcommands.
CORE_COMMANDS = frozenset({"status", "health", "version"})


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the agent CLI with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words in (["status"], ["status", "--json"]):
        return _guarded(lambda: run_status(as_json=len(words) == 2))
    from agents import arguments

    handlers: Dict[str, Handler] = {
        "status": lambda args: run_status(args.json),
        "health": run_health,
        "version": lambda args: run_version(args.json),
    }
    with_jobs = not (words and words[0] in CORE_COMMANDS)
    parser = arguments.build_parser(handlers, _jobs_commands() if with_jobs else None)
    try:
        args, extra = parser.parse_known_args(words)
        if extra:  # said by the command's own parser, whose usage fits
            owner: argparse.ArgumentParser = getattr(args, "_command_parser", parser)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as exc:
        return _usage_error(exc)
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    handler: Optional[Handler] = getattr(args, "handler", None)
    if handler is None:
        sys.stderr.write(parser.format_usage())
        sys.stderr.write(f"{parser.prog}: error: choose a command\n")
        return EXIT_USAGE
    return _guarded(lambda: handler(args))


def emit(text: str) -> None:
    """Write ``text`` and a newline to stdout."""
    sys.stdout.write(text)
    sys.stdout.write("\n")
    sys.stdout.flush()


def run_status(as_json: bool) -> int:
    """``gpu-agent status [--json]``: one snapshot as a JSON document or a table."""
    document = collect_status_document()
    if as_json:
        from agents import wire

        emit(wire.dumps(document))
        return EXIT_OK
    from agents import render
    from agents.protocol import StatusSnapshot, from_dict

    emit(render.render_status(from_dict(StatusSnapshot, document)))
    return EXIT_OK


def run_health(args: argparse.Namespace) -> int:
    """``gpu-agent health``: the checklist; exit 1 when a check fails."""
    from agents import health, protocol

    snapshot = collect_status()
    kwargs: Dict[str, Any] = {
        "full": args.full,
        "python": args.python,
        "expect_gpu": args.expect_gpu,
        "expect_count": args.expect_count,
    }
    if args.timeout is not None:
        kwargs["timeout_s"] = args.timeout
    if args.stress is not None:
        kwargs["stress_s"] = args.stress
    report = health.run_health(snapshot, **kwargs)
    emit(protocol.dumps(report) if args.json else health.render_text(report))
    return EXIT_FAILED if report.status == "fail" else EXIT_OK


def run_version(as_json: bool) -> int:
    """``gpu-agent version [--json]``: agent and Python versions."""
    from agents import protocol
    from agents.host import python_version

    info = protocol.VersionInfo(agent_version=__version__, python_version=python_version())
    if as_json:
        emit(protocol.dumps(info))
    else:
        emit(f"gpu-agent {info.agent_version} (Python {info.python_version})")
    return EXIT_OK


def collect_status() -> StatusSnapshot:
    """:func:`collect_status_document` as a ``protocol.StatusSnapshot``."""
    from agents.protocol import StatusSnapshot, from_dict

    return from_dict(StatusSnapshot, collect_status_document())


def collect_status_document() -> Dict[str, Any]:
    """The NVML status document, each GPU process tagged with the agent job it belongs to.

    The job runner is imported only when some process holds a GPU, so an idle status stays cheap.
    """
    from agents import nvml

    document = nvml.collect_status_document()
    processes: List[Dict[str, Any]] = document["processes"]
    if not processes:
        return document
    from agents import jobstore, runner

    owners = runner.jobs_of_pids(jobstore.JobStore.from_env(), [p["pid"] for p in processes])
    for process in processes:
        process["job_id"] = owners.get(process["pid"])
    return document


def _jobs_commands() -> Callable[[Any], None]:
    """``register(subparsers)`` of the job subcommands (agents.jobs_cli)."""
    from agents import jobs_cli

    return jobs_cli.register


def _guarded(command: Callable[[], int]) -> int:
    """Run a command, turning usage errors, a closed stdout and Ctrl-C into exit codes."""
    try:
        return command()
    except UsageError as exc:
        return _usage_error(exc)
    except BrokenPipeError:
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("gpu-agent: interrupted\n")
        return 130


def _usage_error(exc: UsageError) -> int:
    sys.stderr.write(exc.usage)
    sys.stderr.write(f"{exc}\n")
    return EXIT_USAGE


__all__: List[str] = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "collect_status",
    "collect_status_document",
    "emit",
    "main",
    "run_health",
    "run_status",
    "run_version",
]
