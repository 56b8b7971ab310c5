"""A bot process for restart tests: the real runtime (store, providers, Slack notifier) built
from the environment, ticking at the times read from stdin, one ISO time per line.

After each tick, and the platform calls it handed off, it prints ``ticked <time> <errors>`` and
flushes, so the test knows where the
process is before it kills it. Time comes only from those lines: nothing here reads a fake
clock from the environment.
"""

from __future__ import annotations

import sys
from datetime import datetime

from bot.app import build_runtime
from bot.services.tick import tick
from bot.settings import Settings


def main() -> int:
    now = datetime(1970, 1, 1)

    def clock() -> datetime:
        return now

    rt = build_runtime(Settings.from_env(), clock=clock)
    print("ready", flush=True)
    for line in sys.stdin:
        text = line.strip()
        if not text:
            continue
        now = datetime.fromisoformat(text)
        report = tick(rt, now)
        # The platform calls the tick handed off finish before the clock moves on.
        if rt.platform_work is not None:
            rt.platform_work.wait_idle(60)
        print(f"ticked {now.isoformat()} {','.join(report.errors) or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
