"""`/gpu status` over 20 instances: the bot's fleet overview against a loop of plain `ssh` calls.

One real sshd on loopback serves 20 instances (distinct names, each with its own GPU_AGENT_HOME),
registered once through the real register path (scan, pin, bootstrap, health) into a SQLite
store. Then, in the same run, medians of several rounds of:

  (a) bot.services.instances.fleet_overview: what `/gpu status` runs (store read, concurrent
      status over pooled, kept-alive connections, results recorded);
  (b) a loop of OpenSSH client calls, one after another, each running the same agent command
      with the pinned host key (`ssh -p PORT -i KEY HOST env GPU_AGENT_HOME=... python3 ...`);
  (c) one instance's status through the same path (`/gpu status NAME`: instance_detail).

The bare Fleet.fan_out over all 20 is printed too.

Targets: (b)/(a) >= 10 and (a)/(c) <= 2. Every instance here shares this machine's CPUs, so the
per-instance work (a login shell and a Python start on the "instance") is not spread over 20
machines as it is in a real fleet; the CPU count is printed with the ratios.

Run: python bench/fleet_status.py [--instances 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agents.protocol import StatusSnapshot, loads  # noqa: E402
from agents.zipapp import build  # noqa: E402
from bot.app import build_runtime  # noqa: E402
from bot.commands.registry import Caller  # noqa: E402
from bot.fleet.base import Target  # noqa: E402
from bot.fleet.fleet import Fleet  # noqa: E402
from bot.notify import MessageRef  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from bot.services import instances  # noqa: E402
from bot.settings import Settings  # noqa: E402
from tests.fixtures.sshd import SshServer, start_sshd  # noqa: E402

OWNER = Caller(user_id="UBENCH", channel_id="CBENCH")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--python",
        default=os.path.realpath(sys.executable),
        help="the instances' interpreter (default: this one, resolved past any shims)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        work = Path(tmp)
        zipapp = build(work / "gpu-agent.pyz")
        server = start_sshd(work / "sshd")
        settings = Settings(data_dir=work / "data", channel="CBENCH")
        fleet = Fleet(settings, zipapp_path=zipapp)
        rt = build_runtime(settings, notifier=_QuietNotifier(), fleet=fleet)
        try:
            return _run(rt, server, work, args.instances, args.rounds, args.python)
        finally:
            fleet.close()
            server.stop()


def _run(
    rt: Runtime, server: SshServer, work: Path, instances_n: int, rounds: int, python: str
) -> int:
    names = [f"gpu-{i:02d}" for i in range(instances_n)]
    started = time.perf_counter()
    for name in names:
        home = work / "homes" / name
        home.mkdir(parents=True)
        instances.register(
            rt,
            OWNER,
            instances.RegisterRequest(
                name=name,
                address=f"{server.user}@{server.host}:{server.port}",
                price_micros_per_hour=2_100_000,
                python_path=python,
                key_path=str(server.client_key_path),
                agent_home=str(home),
            ),
        )
    print(f"registered {instances_n} instances in {time.perf_counter() - started:.2f} s")
    fleet = rt.fleet
    targets = [
        server.target(name, agent_home=work / "homes" / name, python_path=python) for name in names
    ]
    known_hosts = work / "known_hosts"
    key = server.host_key
    known_hosts.write_text(f"[{server.host}]:{server.port} {key.key_type} {key.key_b64}\n")

    def overview() -> None:
        rows = instances.fleet_overview(rt).rows
        bad = [row for row in rows if row.problem is not None]
        if len(rows) != instances_n or bad:
            raise SystemExit(f"fleet_overview: {len(rows)} rows, problems: {bad[:1]}")

    def fan_out() -> None:
        results = fleet.fan_out(targets, lambda agent: agent.status(), timeout_s=60)
        bad = [r for r in results.values() if not isinstance(r, StatusSnapshot)]
        if bad:
            raise SystemExit(f"fan_out failed: {bad[0]}")

    def ssh_loop() -> None:
        for target in targets:
            _ssh_status(server, target, fleet, known_hosts)

    def single() -> None:
        detail = instances.instance_detail(rt, names[0])
        if detail.row.problem is not None:
            raise SystemExit(f"instance_detail: {detail.row.problem}")

    def empty_command() -> None:
        fleet.transport(targets[0]).exec(["true"], timeout_s=60)

    overview()  # the bot's steady state: connections already pooled
    overview_s = _median(overview, rounds)
    fan_out_s = _median(fan_out, rounds)
    loop_s = _median(ssh_loop, rounds)
    single_s = _median(single, rounds * 3)
    empty_s = _median(empty_command, rounds * 3)

    print(f"CPUs on this machine (shared by all {instances_n} instances): {os.cpu_count()}")
    print(f"instances' python: {python}")
    print(f"(a) /gpu status (fleet_overview), {instances_n} instances: {overview_s * 1000:8.1f} ms")
    print(f"    bare Fleet.fan_out(status), {instances_n} instances:   {fan_out_s * 1000:8.1f} ms")
    print(f"(b) loop of plain ssh status calls:                {loop_s * 1000:8.1f} ms")
    print(f"(c) /gpu status NAME (instance_detail), one:       {single_s * 1000:8.1f} ms")
    print(
        f"(d) an empty command (true), one instance:         {empty_s * 1000:8.1f} ms"
        "  (the login shell's cost, paid per command by (a), (b) and (c) alike)"
    )
    print(f"speed-up over the ssh loop (b)/(a): {loop_s / overview_s:5.1f}x  (target >= 10x)")
    print(f"cost over one instance (a)/(c):     {overview_s / single_s:5.1f}x  (target <= 2x)")
    return 0


class _QuietNotifier:
    """Outgoing messages are not part of the measurement: kept, never sent."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str]] = []

    def post(self, channel, text, blocks=(), *, thread_ts=None) -> MessageRef:
        self.posts.append((channel, text))
        return MessageRef(channel=channel, ts=f"{len(self.posts)}.000000")

    def update(self, ref, text, blocks=()) -> None:
        self.posts.append((ref.channel, text))

    def upload_file(self, channel, filename, content, *, title, comment="", thread_ts=None):
        self.posts.append((channel, title))


def _ssh_status(server: SshServer, target: Target, fleet: Fleet, known_hosts: Path) -> None:
    """One status call the way a script would do it: a fresh OpenSSH client each time."""
    remote = shlex.join(fleet.agent(target).argv(["status", "--json"]))
    done = subprocess.run(
        [
            "ssh",
            "-p",
            str(server.port),
            "-i",
            str(server.client_key_path),
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "LogLevel=ERROR",
            f"{server.user}@{server.host}",
            remote,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ssh failed ({done.returncode}): {done.stderr[-500:]}")
    loads(StatusSnapshot, done.stdout)


def _median(fn: Callable[[], None], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


if __name__ == "__main__":
    raise SystemExit(main())
