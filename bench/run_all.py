"""Run the quick size of every bench in bench/ and print one table of their results.

Each bench runs on its own, one after another (they time things, so never two at once), as
``python bench/NAME.py --quick``. Its last line of output is its result as JSON:

    {"bench": "stall", "figure": "...", "ratio": 1.17, "goal": 2.0, "met": true, ...}

with ``better`` saying whether a ratio is good when ``lower`` (the default) or ``higher`` than
its goal; a goal that is not one number (a sentence) is shown as given, up to
``GOAL_TEXT_MAX`` characters. Each ratio is against a baseline the bench measured in the same
run. A bench that prints no such line (it failed, timed out, or does not report one) gets a row
saying so.
``--log-dir`` keeps each bench's whole output.

Exit status: 0 when every bench met its goal, 1 otherwise.

Run: python bench/run_all.py [--only NAME ...] [--timeout SECONDS] [--log-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
#: Seconds one bench may run before it is stopped (its row then says "timed out").
DEFAULT_TIMEOUT_S = 900.0
#: The longest goal shown when a bench states it in words.
GOAL_TEXT_MAX = 40


@dataclass(frozen=True)
class Row:
    """One bench's line of the table; ``ratio`` and ``goal`` are None without a result
    (``goal`` is a number, or a bench's own words)."""

    bench: str
    figure: str
    ratio: float | None
    goal: float | str | None
    better: str
    met: bool | None
    seconds: float
    note: str = ""

    @property
    def goal_text(self) -> str:
        if self.goal is None:
            return "-"
        if isinstance(self.goal, str):
            return _shortened(self.goal, GOAL_TEXT_MAX)
        return f"{'>=' if self.better == 'higher' else '<='} {self.goal:g}x"

    @property
    def met_text(self) -> str:
        if self.met is None:
            return self.note or "no result"
        return "yes" if self.met else "NO"


def benches(only: Sequence[str] = ()) -> list[Path]:
    """The bench scripts (bench/*.py but this one), by name; ``only`` keeps those named."""
    found = sorted(
        path
        for path in BENCH_DIR.glob("*.py")
        if path.name != Path(__file__).name and not path.name.startswith("_")
    )
    if only:
        wanted = {name.removesuffix(".py") for name in only}
        unknown = wanted - {path.stem for path in found}
        if unknown:
            raise SystemExit(f"no such bench: {', '.join(sorted(unknown))}")
        found = [path for path in found if path.stem in wanted]
    return found


def result_of(name: str, stdout: str, returncode: int, seconds: float) -> Row:
    """The row for a bench's output: its last line read as its JSON result, else "no result"
    (with its exit status when it failed)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    failed = f"no result (exit {returncode})" if returncode else "no result"
    if not lines:
        return Row(name, "", None, None, "lower", None, seconds, failed)
    try:
        data = json.loads(lines[-1])
    except ValueError:
        return Row(name, "", None, None, "lower", None, seconds, failed)
    if not isinstance(data, dict):
        return Row(name, "", None, None, "lower", None, seconds, failed)
    ratio, met = _finite(data.get("ratio")), data.get("met")
    stated = data.get("goal")
    goal = stated.strip() or None if isinstance(stated, str) else _finite(stated)
    figure = str(data.get("figure", ""))
    if goal is None or not isinstance(met, bool) or (met and ratio is None):
        return Row(name, figure, None, None, "lower", None, seconds, failed)
    better = "higher" if data.get("better") == "higher" else "lower"
    if returncode:
        met = False  # a bench that exits with an error has not shown its goal met
    return Row(
        str(data.get("bench") or name),
        figure,
        ratio,  # None: what it measures did not finish
        goal,
        better,
        met,
        seconds,
    )


def run(path: Path, timeout_s: float, log_dir: Path | None) -> Row:
    """Run one bench with ``--quick``; its row."""
    started = time.perf_counter()
    argv = [sys.executable, str(path), "--quick"]
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        seconds = time.perf_counter() - started
        _keep(log_dir, path.stem, _text(exc.stdout), _text(exc.stderr))
        return Row(path.stem, "", None, None, "lower", None, seconds, "timed out")
    seconds = time.perf_counter() - started
    _keep(log_dir, path.stem, done.stdout, done.stderr)
    row = result_of(path.stem, done.stdout, done.returncode, seconds)
    if row.met is None:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        print(f"{path.stem}: {row.met_text}; its last lines:", file=sys.stderr)
        for line in tail:
            print(f"  {line}", file=sys.stderr)
    return row


def table(rows: Sequence[Row]) -> str:
    """The rows as an aligned text table."""
    head = ("bench", "figure", "ratio", "goal", "met", "seconds")
    cells = [
        (
            row.bench,
            row.figure or "-",
            "-" if row.ratio is None else f"{row.ratio:.2f}x",
            row.goal_text,
            row.met_text,
            f"{row.seconds:.0f}",
        )
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [head, *cells]) for i in range(len(head))]
    right = {2, 5}  # numbers
    out = []
    for line in [head, *cells]:
        out.append(
            "  ".join(
                cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
                for i, cell in enumerate(line)
            ).rstrip()
        )
    out.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=(), metavar="NAME", help="these benches")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds per bench (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument("--log-dir", type=Path, help="keep each bench's output here")
    args = parser.parse_args(argv)
    rows = []
    for path in benches(args.only):
        print(f"running {path.name} --quick ...", file=sys.stderr, flush=True)
        rows.append(run(path, args.timeout, args.log_dir))
    print(table(rows))
    return 0 if rows and all(row.met for row in rows) else 1


def _finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _shortened(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _keep(log_dir: Path | None, name: str, stdout: str, stderr: str) -> None:
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{name}.out").write_text(stdout)
        (log_dir / f"{name}.err").write_text(stderr)


if __name__ == "__main__":
    sys.exit(main())
