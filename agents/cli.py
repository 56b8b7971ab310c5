"""The ``gpu-agent`` command line: ``status``, ``health``, ``version`` and the job commands.

Exit codes: 0 success, 1 a health check failed or the command failed, 2 usage error (the
message goes to stderr). Every command takes ``--json`` and then prints exactly one JSON
document on stdout carrying ``"schema": 1``.

Subcommands are dispatched through ``set_defaults(handler=...)``: a handler takes the parsed
``argparse.Namespace`` and returns the exit code. Modules that add subcommands expose
``register(subparsers) -> None`` and follow the same rule. Heavy modules (NVML, health checks,
the job runner) are imported inside the handlers, and the job subcommands are registered only
when the command line asks for one of them (or for help), so ``status`` loads only what it needs.
"""

from __future__ import annotations

import argparse
import os
import sys

from agents import __version__

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence

    from agents.protocol import StatusSnapshot

    Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Commands this module defines; any other command line also gets the job subcommands.
CORE_COMMANDS = frozenset({"status", "health", "version"})


class UsageError(Exception):
    """Bad command-line input: reported on stderr (after ``usage``, if any) with exit code 2."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.usage = usage


class AgentHelpFormatter(argparse.HelpFormatter):
    """argparse's formatter with the terminal width looked up once, not per argument."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: Optional[int] = None,
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or terminal_width())


class AgentArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of exiting, so main() owns the exit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", AgentHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}", self.format_usage())


_WIDTH: List[int] = []


def terminal_width() -> int:
    """Columns for help text: $COLUMNS, else the terminal's, else 80; minus a margin of 2."""
    if not _WIDTH:
        try:
            columns = int(os.environ.get("COLUMNS", "0"))
        except ValueError:
            columns = 0
        if columns <= 0:
            try:
                columns = os.get_terminal_size(sys.stdout.fileno()).columns
            except (AttributeError, ValueError, OSError):  # not a terminal, or no fileno
                columns = 80
        _WIDTH.append(max(columns - 2, 40))
    return _WIDTH[0]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the agent CLI with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(with_jobs=not (words and words[0] in CORE_COMMANDS))
    try:
        args, extra = parser.parse_known_args(words)
        if extra:  # said by the command's own parser, whose usage fits
            owner: argparse.ArgumentParser = getattr(args, "_command_parser", parser)
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as exc:
        sys.stderr.write(exc.usage)
        sys.stderr.write(f"{exc}\n")
        return EXIT_USAGE
    except SystemExit as exc:  # --help and friends
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    handler: Optional[Handler] = getattr(args, "handler", None)
    if handler is None:
        sys.stderr.write(parser.format_usage())
        sys.stderr.write(f"{parser.prog}: error: choose a command\n")
        return EXIT_USAGE
    try:
        return handler(args)
    except UsageError as exc:
        sys.stderr.write(exc.usage)
        sys.stderr.write(f"{exc}\n")
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write("gpu-agent: interrupted\n")
        return 130


def build_parser(with_jobs: bool = True) -> argparse.ArgumentParser:
    """The argument parser; the job subcommands (agents.jobs_cli) unless ``with_jobs`` is False."""
    parser = AgentArgumentParser(
        prog="gpu-agent",
        description="GPU status, CUDA health checks and a job runner for a rented GPU instance.",
    )
    sub = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=AgentArgumentParser
    )
    _add_status(sub)
    _add_health(sub)
    _add_version(sub)
    if with_jobs:
        from agents import jobs_cli

        jobs_cli.register(sub)
    return parser


def emit(text: str) -> None:
    """Write ``text`` and a newline to stdout."""
    sys.stdout.write(text)
    sys.stdout.write("\n")
    sys.stdout.flush()


def positive_float(raw: str) -> float:
    """argparse type: a number of seconds above zero."""
    try:
        value = float(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds") from exc
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{raw!r} must be a positive number of seconds")
    return value


def positive_int(raw: str) -> int:
    """argparse type: a whole number of 1 or more."""
    try:
        value = int(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} must be 1 or more")
    return value


def _add_status(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="one snapshot: host, driver, GPUs, processes")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_cmd_status, _command_parser=p)


def _add_health(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("health", help="the health checklist (pass/warn/fail/skip with hints)")
    p.add_argument("--full", action="store_true", help="also run matmul, bandwidth and GEMM tests")
    p.add_argument("--python", metavar="PATH", help="Python whose torch to check (default python3)")
    p.add_argument("--expect-gpu", metavar="MODEL", help="the GPU model that was rented, e.g. h100")
    p.add_argument("--expect-count", metavar="N", type=positive_int, help="GPUs that were rented")
    p.add_argument(
        "--timeout",
        metavar="S",
        type=positive_float,
        default=None,
        help="seconds allowed for each torch probe",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_cmd_health, _command_parser=p)


def _add_version(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("version", help="agent and Python versions")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=_cmd_version, _command_parser=p)


def _cmd_status(args: argparse.Namespace) -> int:
    from agents import protocol

    snapshot = _collect_status()
    if args.json:
        emit(protocol.dumps(snapshot))
    else:
        from agents import render

        emit(render.render_status(snapshot))
    return EXIT_OK


def _cmd_health(args: argparse.Namespace) -> int:
    from agents import health, protocol

    snapshot = _collect_status()
    kwargs: Dict[str, Any] = {
        "full": args.full,
        "python": args.python,
        "expect_gpu": args.expect_gpu,
        "expect_count": args.expect_count,
    }
    if args.timeout is not None:
        kwargs["timeout_s"] = args.timeout
    report = health.run_health(snapshot, **kwargs)
    emit(protocol.dumps(report) if args.json else health.render_text(report))
    return EXIT_FAILED if report.status == "fail" else EXIT_OK


def _collect_status() -> StatusSnapshot:
    """The NVML snapshot, each GPU process tagged with the agent job it belongs to.

    The job runner is imported only when some process holds a GPU, so an idle status stays cheap.
    """
    from dataclasses import replace

    from agents import nvml

    snapshot = nvml.collect_status()
    if not snapshot.processes:
        return snapshot
    from agents import runner

    owners = runner.jobs_of_pids(runner.JobStore.from_env(), [p.pid for p in snapshot.processes])
    if not owners:
        return snapshot
    tagged = tuple(replace(p, job_id=owners.get(p.pid)) for p in snapshot.processes)
    return replace(snapshot, processes=tagged)


def _cmd_version(args: argparse.Namespace) -> int:
    from agents import protocol
    from agents.host import python_version

    info = protocol.VersionInfo(agent_version=__version__, python_version=python_version())
    if args.json:
        emit(protocol.dumps(info))
    else:
        emit(f"gpu-agent {info.agent_version} (Python {info.python_version})")
    return EXIT_OK


__all__: List[str] = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "AgentArgumentParser",
    "UsageError",
    "build_parser",
    "emit",
    "main",
    "positive_float",
    "positive_int",
]
