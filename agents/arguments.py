"""The ``gpu-agent`` argument parser: argparse, loaded only for command lines that need it.

``agents.cli.main`` answers the hot command lines (``status``, ``status --json``) without it.
Subcommands are dispatched through ``set_defaults(handler=...)``: a handler takes the parsed
``argparse.Namespace`` and returns the exit code. Modules that add subcommands expose
``register(subparsers) -> None`` and follow the same rule.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, List, Mapping, NoReturn, Optional

from agents.usage import UsageError

#: A subcommand's handler: the parsed arguments in, the exit code out.
Handler = Callable[[argparse.Namespace], int]


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


def build_parser(
    handlers: Mapping[str, Handler], register_jobs: Optional[Callable[[Any], None]] = None
) -> argparse.ArgumentParser:
    """The argument parser: ``status``, ``health`` and ``version`` run ``handlers`` (by command
    name); ``register_jobs(subparsers)`` adds the job subcommands (agents.jobs_cli) when given."""
    parser = AgentArgumentParser(
        prog="gpu-agent",
        description="GPU status, CUDA health checks and a job runner for a rented GPU instance.",
    )
    sub = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=AgentArgumentParser
    )
    _add_status(sub, handlers["status"])
    _add_health(sub, handlers["health"])
    _add_version(sub, handlers["version"])
    if register_jobs is not None:
        register_jobs(sub)
    return parser


def positive_float(raw: str) -> float:
    """argparse type: a number of seconds above zero."""
    try:
        value = float(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of seconds") from exc
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{raw!r} must be a positive number of seconds")
    return value


#: Shortest and longest ``health --stress`` load, seconds.
STRESS_MIN_S = 5.0
STRESS_MAX_S = 4 * 3600.0
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def stress_duration(raw: str) -> float:
    """argparse type: how long to hold the load, "90s", "5m", "1h30m" or plain seconds,
    between STRESS_MIN_S and STRESS_MAX_S."""
    import re

    text = raw.strip().lower()
    seconds: Optional[float] = None
    if re.fullmatch(r"\d+(\.\d+)?", text):
        seconds = float(text)
    elif text and re.fullmatch(r"(\d+(\.\d+)?[hms])+", text):
        seconds = sum(
            float(amount) * _DURATION_UNITS[unit]
            for amount, _, unit in re.findall(r"(\d+(\.\d+)?)([hms])", text)
        )
    if seconds is None:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not a duration: write it like 90s, 5m or 1h30m"
        )
    if not STRESS_MIN_S <= seconds <= STRESS_MAX_S:
        raise argparse.ArgumentTypeError(
            f"{raw!r} must be between {STRESS_MIN_S:g} s and {STRESS_MAX_S / 3600:g} h"
        )
    return seconds


def whole_number(low: int, high: Optional[int] = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` up (to ``high`` inclusive, when given)."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from exc
        if value < low or (high is not None and value > high):
            span = f"{low} or more" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"{raw!r} must be {span}")
        return value

    return parse


def _add_status(sub: argparse._SubParsersAction, handler: Handler) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="one snapshot: host, driver, GPUs, processes")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=handler, _command_parser=p)


def _add_health(sub: argparse._SubParsersAction, handler: Handler) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("health", help="the health checklist (pass/warn/fail/skip with hints)")
    p.add_argument(
        "--full",
        action="store_true",
        help="also measure: matmul, bandwidth, GEMM, topology, peer-to-peer copies, NCCL",
    )
    p.add_argument(
        "--stress",
        metavar="DURATION",
        type=stress_duration,
        default=None,
        help="hold GEMM load this long (90s, 5m) and report clocks, temperature, power and "
        "throttling over time",
    )
    p.add_argument("--python", metavar="PATH", help="Python whose torch to check (default python3)")
    p.add_argument("--expect-gpu", metavar="MODEL", help="the GPU model that was rented, e.g. h100")
    p.add_argument(
        "--expect-count", metavar="N", type=whole_number(1), help="GPUs that were rented"
    )
    p.add_argument(
        "--timeout",
        metavar="S",
        type=positive_float,
        default=None,
        help="seconds allowed for each torch probe",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=handler, _command_parser=p)


def _add_version(sub: argparse._SubParsersAction, handler: Handler) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("version", help="agent and Python versions")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(handler=handler, _command_parser=p)
