"""`/gpu status` over 20 instances: the fleet's fan-out against a loop of plain `ssh` calls.

One real sshd on loopback serves 20 targets (distinct names, each with its own GPU_AGENT_HOME),
bootstrapped once. Then, in the same run, medians of several rounds of:

  (a) Fleet.fan_out(status) over all 20 (pooled, kept-alive connections, concurrent);
  (b) a loop of OpenSSH client calls, one after another, each running the same agent command
      with the pinned host key (`ssh -p PORT -i KEY HOST env GPU_AGENT_HOME=... python3 ...`);
  (c) one instance's status through the fleet.

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
from bot.errors import FleetError  # noqa: E402
from bot.fleet.base import Target  # noqa: E402
from bot.fleet.fleet import Fleet  # noqa: E402
from bot.settings import Settings  # noqa: E402
from tests.fixtures.sshd import SshServer, start_sshd  # noqa: E402


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
        fleet = Fleet(Settings(data_dir=work / "data"), zipapp_path=zipapp)
        try:
            return _run(fleet, server, work, args.instances, args.rounds, args.python)
        finally:
            fleet.close()
            server.stop()


def _run(
    fleet: Fleet, server: SshServer, work: Path, instances: int, rounds: int, python: str
) -> int:
    targets = [server.target(f"gpu-{i:02d}", python_path=python) for i in range(instances)]
    started = time.perf_counter()
    booted = fleet.fan_out(targets, lambda agent: agent.ensure_agent(), timeout_s=120)
    failed = {name: r for name, r in booted.items() if isinstance(r, FleetError)}
    if failed:
        print(f"bootstrap failed: {failed}", file=sys.stderr)
        return 1
    print(f"bootstrapped {instances} instances in {time.perf_counter() - started:.2f} s")
    known_hosts = work / "known_hosts"
    key = server.host_key
    known_hosts.write_text(f"[{server.host}]:{server.port} {key.key_type} {key.key_b64}\n")

    def fan_out() -> None:
        results = fleet.fan_out(targets, lambda agent: agent.status(), timeout_s=60)
        bad = [r for r in results.values() if not isinstance(r, StatusSnapshot)]
        if bad:
            raise SystemExit(f"fan_out failed: {bad[0]}")

    def ssh_loop() -> None:
        for target in targets:
            _ssh_status(server, target, fleet, known_hosts)

    def single() -> None:
        fleet.agent(targets[0]).status()

    fan_out()  # the bot's steady state: connections already pooled
    fan_out_s = _median(fan_out, rounds)
    loop_s = _median(ssh_loop, rounds)
    single_s = _median(single, rounds * 3)

    print(f"CPUs on this machine (shared by all {instances} instances): {os.cpu_count()}")
    print(f"instances' python: {python}")
    print(f"(a) fleet fan_out status, {instances} instances: {fan_out_s * 1000:8.1f} ms")
    print(f"(b) loop of plain ssh status calls:            {loop_s * 1000:8.1f} ms")
    print(f"(c) one instance's status through the fleet:   {single_s * 1000:8.1f} ms")
    print(f"speed-up over the ssh loop (b)/(a): {loop_s / fan_out_s:5.1f}x  (target >= 10x)")
    print(f"cost over one instance (a)/(c):     {fan_out_s / single_s:5.1f}x  (target <= 2x)")
    return 0


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
