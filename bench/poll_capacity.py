"""How many instances one bot process can poll in a tick: the clock's polling step at its
configured concurrency against the same step one instance at a time, in the same run.

A SQLite store (a file, as the bot's default) holds ``--instances`` active instances, all due.
The fleet is the bot's own (bot.fleet.fleet.Fleet: its polling pool, fan-out, agent client and
JSON parsing) with one thing replaced: every instance's transport answers ``gpu-agent status
--json`` after a fixed ``--latency-ms`` (default 200 ms: a pooled SSH channel to a remote
instance plus the agent's Python start-up) with an 8-GPU snapshot. On loopback sshd every
agent's start-up would queue for this machine's cores (bench/fleet_status.py measures that), so
the figure would be the instances' CPU, not the bot's; here the bot's own work (claims, threads,
parsing, samples and their roll-ups) is the only CPU work. In interleaved rounds:

  (a) polling.poll_instances over every instance, as the tick runs it (the fleet's polling pool,
      ``FAN_OUT_WORKERS`` threads, ``POLL_BATCH`` instances a batch);
  (b) the baseline: the same step on a fleet with one polling thread, one batch (serial);
  (c) as (a) with answers at once: the bot's own cost per poll, its ceiling on this machine.

Printed: polls per second of each, (a)/(b) against the threads' width (what latency alone
allows), and the instances pollable per poll interval (60 s) at (a)'s rate, in all and within
the poll step's budget (its share of each tick; the rest stays due for the next tick).
Goal: (a)/(b) at least 10x. The last line is the result as JSON (bench, figure, ratio, goal,
met), for `make bench`.

Run: python bench/poll_capacity.py [--instances 640] [--latency-ms 200] [--rounds 3] [--quick]
(--quick: 320 instances, one round)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import insert  # noqa: E402

from agents.protocol import dumps  # noqa: E402
from bot.fleet.base import ExecResult, Target, Transport  # noqa: E402
from bot.fleet.fleet import FAN_OUT_WORKERS, Fleet, polling  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from bot.services.instances import polling as poll_step  # noqa: E402
from bot.services.tick import step_budget_s  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.store.db import Database  # noqa: E402
from bot.store.models import Instance, Person  # noqa: E402
from bot.timebox import Timebox  # noqa: E402
from tests.agents.factories import make_process, make_status  # noqa: E402
from tests.bot.services.support import Clock, make_runtime  # noqa: E402
from tests.fixtures.store import fresh_database  # noqa: E402

NOW = datetime(2026, 6, 10, 12, 0)
GPUS = 8
#: (a)/(b): the polling step's rate over its one-thread baseline, at least.
GOAL_SPEED_UP = 10.0
QUICK_INSTANCES = 320


@dataclass(frozen=True)
class Run:
    """One run of a case: instances polled, wall seconds, this process's CPU seconds."""

    polled: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        """Polls per second."""
        return self.polled / self.wall_s


class FixedLatencyTransport:
    """Every command answers ``stdout`` after ``latency_s`` seconds (the threads sleep, as they
    wait on a remote agent); nothing is copied."""

    def __init__(self, latency_s: float, stdout: str) -> None:
        self.latency_s = latency_s
        self.stdout = stdout

    def exec(
        self, argv: Sequence[str], *, timeout_s: float, stdin: bytes | None = None
    ) -> ExecResult:
        if self.latency_s:
            time.sleep(self.latency_s)
        return ExecResult(exit_code=0, stdout=self.stdout, stderr="")

    def put_file(self, local_path: str, remote_path: str, *, mode: int = 0o755) -> None:
        raise AssertionError("the agent is in place: nothing is uploaded")


class FixedLatencyFleet(Fleet):
    """The bot's fleet, every instance reached through one FixedLatencyTransport."""

    def __init__(
        self,
        settings: Settings,
        transport: FixedLatencyTransport,
        *,
        poll_workers: int,
        zipapp: Path,
    ) -> None:
        super().__init__(settings, zipapp_path=zipapp, poll_workers=poll_workers)
        self._fixed = transport

    def transport(self, target: Target) -> Transport:
        return self._fixed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=640)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_INSTANCES} instances, one round (what `make bench` runs)",
    )
    args = parser.parse_args()
    if args.quick:
        args.instances, args.rounds = QUICK_INSTANCES, 1
    latency_s = args.latency_ms / 1000
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="poll-bench-") as tmp:
        work = Path(tmp)
        zipapp = work / "gpu-agent.pyz"
        zipapp.write_bytes(b"the agent's bytes: only their digest names the remote file")
        with fresh_database("sqlite", work) as db:
            _fill(db, args.instances)
            runs = _measure(db, zipapp, args.instances, latency_s, args.rounds)
    _report(runs, instances=args.instances, latency_s=latency_s, rounds=args.rounds)
    after = os.getloadavg()
    print(f"\nload average before {_load(load_before)}, after {_load(after)}")
    speed_up = runs["concurrent"].rate / runs["serial"].rate
    result = {
        "bench": "poll_capacity",
        "figure": "poll rate, 32 threads / 1 thread",
        "ratio": round(speed_up, 3),
        "goal": GOAL_SPEED_UP,
        "better": "higher",
        "met": speed_up >= GOAL_SPEED_UP,
        "instances": args.instances,
        "polls_per_s": round(runs["concurrent"].rate, 1),
        "cpu_ms_per_poll": round(runs["no_latency"].cpu_s / runs["no_latency"].polled * 1000, 2),
    }
    print(json.dumps(result))
    return 0


def _measure(
    db: Database, zipapp: Path, instances: int, latency_s: float, rounds: int
) -> dict[str, Run]:
    """Each case once per round, rounds interleaved; per case the run of median wall time."""
    clock = Clock(NOW)
    answer = _status_json()
    cases: dict[str, tuple[Runtime, Timebox | None, int]] = {}
    fleets: list[Fleet] = []
    for name, latency, workers, budget in (
        ("concurrent", latency_s, FAN_OUT_WORKERS, None),
        ("serial", latency_s, 1, 0.0),  # a spent budget: the first batch only
        ("no_latency", 0.0, FAN_OUT_WORKERS, None),
    ):
        settings = Settings(channel="CBENCH")
        fleet = FixedLatencyFleet(
            settings, FixedLatencyTransport(latency, answer), poll_workers=workers, zipapp=zipapp
        )
        fleets.append(fleet)
        rt = make_runtime(db, clock, fleet=fleet)
        expected = poll_step.POLL_BATCH if budget is not None else instances
        cases[name] = (rt, None if budget is None else Timebox.open(budget), expected)
    seen: dict[str, list[Run]] = {name: [] for name in cases}
    try:
        for _ in range(rounds):
            for name, (rt, box, expected) in cases.items():
                # Everything due again: a poll's successor is due at its place in the interval
                # at least half an interval later, so within 1.5 intervals.
                clock.advance(seconds=2 * rt.settings.poll_interval_s)
                seen[name].append(_poll(rt, clock.now, box, expected, name))
    finally:
        for fleet in fleets:
            fleet.close()
    return {
        name: sorted(runs, key=lambda r: r.wall_s)[len(runs) // 2] for name, runs in seen.items()
    }


def _median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda run: run.wall_s)[len(runs) // 2]


def _poll(rt: Runtime, now: datetime, box: Timebox | None, expected: int, case: str) -> Run:
    cpu0, started = time.process_time(), time.perf_counter()
    with polling():
        results = poll_step.poll_instances(rt, now, timebox=box)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    failed = [r for r in results if not r.ok]
    if len(results) != expected or failed:
        raise SystemExit(f"{case}: polled {len(results)} of {expected}; failed: {failed[:1]}")
    return Run(polled=len(results), wall_s=wall, cpu_s=cpu)


def _report(runs: dict[str, Run], *, instances: int, latency_s: float, rounds: int) -> None:
    cores = os.cpu_count() or 1
    settings = Settings()
    window_s = settings.poll_interval_s
    tick_s = settings.tick_interval_s
    budget_s = step_budget_s("poll", tick_s) * (window_s / tick_s)
    concurrent, serial, bare = runs["concurrent"], runs["serial"], runs["no_latency"]
    ms = 1000.0
    print(
        f"{instances} instances on SQLite, every status answered after {latency_s * ms:g} ms "
        f"({GPUS} GPUs); {cores} CPUs; median of {rounds} rounds"
    )
    print(
        f"polling step: {FAN_OUT_WORKERS} threads (FAN_OUT_WORKERS), batches of "
        f"{poll_step.POLL_BATCH} (POLL_BATCH)"
    )
    print()
    print(f"{'per run':50s}{'polls':>7s}{'wall s':>9s}{'polls/s':>10s}{'CPU ms/poll':>13s}")
    rows: list[tuple[str, Run]] = [
        (f"(a) poll step, {FAN_OUT_WORKERS} threads", concurrent),
        ("(b) poll step, 1 thread (baseline)", serial),
        (f"(c) poll step, {FAN_OUT_WORKERS} threads, answers at once", bare),
    ]
    for label, run in rows:
        print(
            f"{label:50s}{run.polled:7d}{run.wall_s:9.2f}{run.rate:10.1f}"
            f"{run.cpu_s / run.polled * ms:13.2f}"
        )
    print()
    ceiling = FAN_OUT_WORKERS / latency_s
    print(
        f"(a)/(b): {concurrent.rate / serial.rate:.1f}x the serial rate "
        f"({FAN_OUT_WORKERS}x is what {FAN_OUT_WORKERS} threads waiting {latency_s * ms:g} ms "
        f"allow); (a) reaches {concurrent.rate / ceiling * 100:.0f}% of {ceiling:.0f} polls/s"
    )
    print(
        f"(c): the bot's own cost, {bare.wall_s / bare.polled * ms:.2f} ms wall and "
        f"{bare.cpu_s / bare.polled * ms:.2f} ms CPU per poll, caps it at {bare.rate:.0f} polls/s"
    )
    print()
    pollable = concurrent.rate * window_s
    print(f"instances pollable per {window_s:g} s tick at (a)'s rate: {pollable:,.0f}")
    print(
        f"  within the poll step's budget ({step_budget_s('poll', tick_s):g} s of each "
        f"{tick_s:g} s tick: {budget_s:g} s in {window_s:g} s): {concurrent.rate * budget_s:,.0f}"
    )
    print(
        f"  serial (b), the same budget: {serial.rate * budget_s:,.0f}; "
        f"the bot's ceiling (c): {bare.rate * budget_s:,.0f}"
    )


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{value:.1f}" for value in load)


def _status_json() -> str:
    """What a busy 8-GPU instance's agent answers: every GPU at 80 %, one process each."""
    processes = [make_process(i, pid=4000 + i) for i in range(GPUS)]
    return dumps(make_status(n=GPUS, processes=processes, util_gpu_pct=80))


def _fill(db: Database, size: int) -> None:
    created = NOW - timedelta(hours=2)
    rows = [
        {
            "name": f"box{i}",
            "owner_id": "UOWNER",
            "state": "active",
            "provider": "manual",
            "host": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            "port": 22,
            "ssh_user": "root",
            "price_micros": 2_100_000,
            "gpu_model": "H100",
            "gpu_count": GPUS,
            "created_at": created,
            "deadline_at": NOW + timedelta(days=30),
        }
        for i in range(size)
    ]
    with db.session() as session:
        session.add(Person(slack_id="UOWNER", created_at=created))
        session.flush()
        session.execute(insert(Instance), rows)


if __name__ == "__main__":
    raise SystemExit(main())
