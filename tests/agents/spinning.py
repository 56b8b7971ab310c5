"""A child process that spins on one core and says, when asked, how much CPU time it has used
(its own ``time.process_time()``): the truth a CPU reading of it is checked against, whatever
share of the cores a loaded machine gives it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from types import TracebackType

_CODE = """
import select, sys, time
print("go", flush=True)
while True:
    if select.select([sys.stdin], [], [], 0)[0]:
        if not sys.stdin.readline():
            break
        print(time.process_time(), flush=True)
"""

#: CPU seconds a reading may be off by: /proc counts in clock ticks (10 ms), and the window's
#: ends are read a little apart from the child's own answers.
TOLERANCE_S = 0.05


class SpinningChild:
    """``with SpinningChild() as child:`` spins until the block ends."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert self._line() == "go"
        self.pid = self.process.pid

    def __enter__(self) -> SpinningChild:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _exc: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.process.kill()
        self.process.wait()

    def cpu_s(self) -> float:
        """The CPU seconds the child has used so far, by its own count."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"?\n")
        self.process.stdin.flush()
        return float(self._line())

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().decode().strip()


def assert_reads_what_it_used(
    cpu_pct: float | None, window_s: float, used_s: float, span_s: float
) -> None:
    """A reading of ``cpu_pct`` % over a window of ``window_s`` s, taken inside a span of
    ``span_s`` s in which the child used ``used_s`` CPU seconds by its own count: the reading
    is no more than it used, and no less than it used less what it could have used outside
    the window (one core). On an idle machine that is within TOLERANCE_S of a full core; on a
    loaded one, the share it got."""
    assert cpu_pct is not None
    read_s = cpu_pct / 100 * window_s
    assert read_s <= used_s + TOLERANCE_S, (cpu_pct, used_s)
    assert read_s >= used_s - (span_s - window_s) - TOLERANCE_S, (cpu_pct, used_s, span_s)


def measured(child: SpinningChild, read: Callable[[], object]) -> tuple[float, float]:
    """Call ``read()`` between two of the child's answers: (CPU s it used between them, the
    seconds from before the first was asked to after the second came: every CPU second
    counted lies in that span)."""
    began = time.monotonic()
    before = child.cpu_s()
    read()
    after = child.cpu_s()
    return after - before, time.monotonic() - began
