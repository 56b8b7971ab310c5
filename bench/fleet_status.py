"""`/gpu status` over 20 instances: the bot's fleet overview against a loop of plain `ssh` calls.

Each of the 20 instances is its own real sshd on loopback, with its own host key (a machine
has one live registration, and the bot tells machines apart by host key), its own client key and
its own GPU_AGENT_HOME. The client keys sit in one key directory (GPUBOT_SSH_KEY_DIR) under the
instances' names; the bench's caller is an admin and registers each with ``--key NAME``. Run as
root, the instances log in as a dedicated account (default ``gpubench``, made when missing with a
fresh home and ``/bin/sh``): an SSH command then pays what a fresh instance's login costs, not the
start-up files of this machine's root shell. The 20 instances are registered in parallel (as
many at once as the registration attempt limiter lets one person have under way) through the
real register path (scan, pin, agent upload once per agent home, status, quick health) into a
SQLite store; the output says whether the instances' Python has torch (when it has not, the
health check's torch probe ends at its ImportError). Instance-side CPU is summed over all 20
servers' process trees. Then, in interleaved rounds of the same run:

  (a) bot.services.instances.fleet_views.fleet_overview: what `/gpu status` runs (store
      read, concurrent status over pooled, kept-alive connections, results recorded);
  (b) a loop of OpenSSH client calls, one after another, each running the same agent command
      with its pinned host key (`ssh -p PORT -i KEY USER@HOST env GPU_AGENT_HOME=... python3 ...`)
      and OpenSSH's default algorithms, whose key exchange is most of (e)'s client CPU;
  (c) one instance's status through the same path (`/gpu status NAME`: instance_detail).

Also printed: the bare Fleet.fan_out over all 20, an empty command over a pooled connection, an
empty command over a fresh `ssh` login, and the agent's own CPU time per status call.

Every instance here shares this machine's CPUs. A real fleet runs each agent on its own machine;
here 20 agents' Python start-ups queue for the same cores, so no bot can answer 20 instances
faster than ``20 x instance CPU per call / cores`` (the CPU floor). The ratios are printed raw
and against that floor. Targets: (b)/(a) >= 10 and (a)/(c) <= 2; on this machine (a)/(c)
is judged against the floor: (a)/max((c), floor) <= 2. The last line is the result as JSON
(bench, figure, ratio: that figure, goal, met: both targets), for `make bench`.

Run: python bench/fleet_status.py [--instances 20] [--rounds 3 | --quick] [--user NAME]
                                  [--python PATH]       (--quick: one round)
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import pwd
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlmodel import select  # noqa: E402

from agents.protocol import StatusSnapshot, loads  # noqa: E402
from agents.zipapp import build  # noqa: E402
from bot.app import build_runtime  # noqa: E402
from bot.fleet.base import Target  # noqa: E402
from bot.fleet.fleet import Fleet  # noqa: E402
from bot.notify import MessageRef  # noqa: E402
from bot.runtime import Runtime  # noqa: E402
from bot.services.access import Caller  # noqa: E402
from bot.services.instances import fleet_views, instance_trust, lookup, registration  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.store.models import Instance  # noqa: E402
from tests.fixtures.sshd import SshServer, start_sshd  # noqa: E402

OWNER = Caller(user_id="UBENCH", channel_id="CBENCH")
BENCH_USER = "gpubench"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
AGENT_RUNS = 5
#: (a)/max((c), floor), at most, and (b)/(a), at least.
GOAL_COST = 2.0
GOAL_SPEED_UP = 10.0


@dataclass(frozen=True)
class Sample:
    """Per run of a case: the median wall seconds; the mean CPU seconds (the kernel counts in
    clock ticks, so a mean is steadier than a median) of the sshd tree (the instances' side:
    sshd, shells, agents) and of the bot's side (this process and the ssh clients it ran)."""

    wall_s: float
    instance_cpu_s: float
    bot_cpu_s: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round (what `make bench` runs)")
    parser.add_argument(
        "--user",
        default=BENCH_USER if os.geteuid() == 0 else None,
        help="the account the instances log in as (default: gpubench when run as root, made "
        "when missing; otherwise the current user)",
    )
    parser.add_argument(
        "--python",
        default=None,
        help="the instances' interpreter (default: the system python3 for another login user, "
        "else this one resolved past any shims)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    login = args.user or getpass.getuser()
    python = args.python or _default_python(login)

    names = [f"gpu-{i:02d}" for i in range(args.instances)]
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        zipapp = build(work / "gpu-agent.pyz")
        servers = _start_servers(work, names, login, stack)
        key_dir = _key_directory(work / "keys", names, servers)
        homes = _homes_base(work, login)
        if homes.parent != work:
            stack.callback(shutil.rmtree, homes, ignore_errors=True)
        settings = Settings(
            data_dir=work / "data",
            channel="CBENCH",
            ssh_key_dir=key_dir,
            admins=frozenset({OWNER.user_id}),  # an admin uses any key of the directory
            instance_networks=("127.0.0.0/8",),  # the instances are loopback sshd's
        )
        fleet = Fleet(settings, zipapp_path=zipapp)
        stack.callback(fleet.close)  # before the servers stop (ExitStack runs it first)
        rt = build_runtime(settings, notifier=_QuietNotifier(), fleet=fleet)
        return _run(rt, servers, work, homes, names, args.rounds, python)


def _start_servers(
    work: Path, names: list[str], login: str, stack: contextlib.ExitStack
) -> dict[str, SshServer]:
    """One sshd per instance (own host key, own client key), each stopped when ``stack`` closes,
    also when a later one fails to start."""
    servers: dict[str, SshServer] = {}

    def start(name: str) -> SshServer:
        return start_sshd(work / "sshd" / name, user=login)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(start, name) for name in names}
        failure: BaseException | None = None
        for name, future in futures.items():
            try:
                server = future.result()
            except Exception as exc:  # the others still get stopped
                failure = failure or exc
                continue
            servers[name] = server
            stack.callback(server.stop)
        if failure is not None:
            raise failure
    return servers


def _key_directory(directory: Path, names: list[str], servers: dict[str, SshServer]) -> Path:
    """The key directory the bot picks keys from: each instance's client key under its name."""
    directory.mkdir(mode=0o700)
    for name in names:
        key = directory / name
        shutil.copyfile(servers[name].client_key_path, key)
        key.chmod(0o600)
    return directory


def _run(
    rt: Runtime,
    servers: dict[str, SshServer],
    work: Path,
    homes: Path,
    names: list[str],
    rounds: int,
    python: str,
) -> int:
    instances_n = len(names)
    load_before = os.getloadavg()
    setup_s = _register_all(rt, servers, homes, names, python)
    targets = _stored_targets(rt, names)
    fleet = rt.fleet
    known_hosts = work / "known_hosts"
    known_hosts.write_text(
        "".join(
            f"[{s.host}]:{s.port} {s.host_key.key_type} {s.host_key.key_b64}\n"
            for s in servers.values()
        )
    )
    first = servers[names[0]]

    def overview() -> None:
        rows = fleet_views.fleet_overview(rt).rows
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
            loads(
                StatusSnapshot,
                _ssh(
                    servers[target.name],
                    known_hosts,
                    fleet.agent(target).argv(["status", "--json"]),
                ),
            )

    def single() -> None:
        detail = fleet_views.instance_detail(rt, names[0])
        if detail.row.problem is not None:
            raise SystemExit(f"instance_detail: {detail.row.problem}")

    def empty_pooled() -> None:
        fleet.transport(targets[0]).exec(["true"], timeout_s=60)

    def empty_fresh() -> None:
        _ssh(first, known_hosts, ["true"])

    overview()  # the bot's steady state: connections already pooled
    cases: dict[str, tuple[Callable[[], None], int]] = {
        "overview": (overview, 1),
        "fan_out": (fan_out, 1),
        "loop": (ssh_loop, 1),
        "single": (single, 3),
        "empty_pooled": (empty_pooled, 3),
        "empty_fresh": (empty_fresh, 3),
    }
    samples = _interleaved(cases, list(servers.values()), rounds)
    agent_cpu_s, agent_wall_s = _agent_alone(fleet, targets[0], first.user)
    _report(
        samples,
        instances_n=instances_n,
        setup_s=setup_s,
        load_before=load_before,
        login=first.user,
        python=python,
        agent_cpu_s=agent_cpu_s,
        agent_wall_s=agent_wall_s,
    )
    return 0


def _register_all(
    rt: Runtime, servers: dict[str, SshServer], homes: Path, names: list[str], python: str
) -> float:
    """Register every instance at once (each its own server, uploading the agent into its own
    home, with its own key picked by name from the key directory); seconds."""

    def register(name: str) -> None:
        server = servers[name]
        target = server.target(name, agent_home=homes / name, python_path=python)
        registration.register(
            rt,
            OWNER,
            registration.RegisterRequest(
                name=name,
                address=f"{server.user}@{server.host}:{server.port}",
                price_micros_per_hour=2_100_000,
                python_path=python,
                key_name=name,
                agent_home=target.agent_home,
            ),
        )

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=_register_workers(len(names))) as pool:
        list(pool.map(register, names))
    return time.perf_counter() - started


def _register_workers(instances_n: int) -> int:
    """Registrations in flight at once: the attempt limiter counts each from its start until it
    succeeds, so one person has fewer than ``instance_trust.ATTEMPTS`` under way."""
    return max(1, min(instances_n, instance_trust.ATTEMPTS - 1))


def _stored_targets(rt: Runtime, names: list[str]) -> list[Target]:
    """The targets exactly as the bot builds them from the store (same pooled connections)."""
    with rt.db.session() as session:
        found = session.exec(select(Instance).where(Instance.state != "released")).all()
        rows = {inst.name: inst for inst in found}
        return [lookup.target_for(rt, rows[name]) for name in names]


def _interleaved(
    cases: dict[str, tuple[Callable[[], None], int]], servers: Sequence[SshServer], rounds: int
) -> dict[str, Sample]:
    """Each case ``repeat`` times per round, rounds interleaved so that drift in the machine's
    load hits every case alike."""
    seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (fn, repeat) in cases.items():
            for _ in range(repeat):
                seen[name].append(_measure(fn, servers))
    return {
        name: Sample(
            wall_s=statistics.median(v[0] for v in values),
            instance_cpu_s=statistics.fmean(v[1] for v in values),
            bot_cpu_s=statistics.fmean(v[2] for v in values),
        )
        for name, values in seen.items()
    }


def _measure(fn: Callable[[], None], servers: Sequence[SshServer]) -> tuple[float, float, float]:
    """Wall, instance CPU (summed over every server) and bot CPU seconds of one run (reading
    /proc stays outside)."""
    inst0 = _servers_cpu_s(servers)
    bot0 = _bot_cpu_s()
    started = time.perf_counter()
    fn()
    wall = time.perf_counter() - started
    bot = _bot_cpu_s() - bot0
    return wall, _servers_cpu_s(servers) - inst0, bot


def _servers_cpu_s(servers: Sequence[SshServer]) -> float:
    """CPU seconds (user + system) used so far by every server and all it ran: each live
    process of their trees, with the children each has already reaped (SshServer.cpu_seconds
    for all of them, from one pass over /proc)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(entry.name)
        stats[pid] = fields
        children.setdefault(int(fields[1]), []).append(pid)
    ticks = 0
    stack = [server.pid for server in servers]
    while stack:
        pid = stack.pop()
        found = stats.get(pid)
        if found is not None:
            # After the command name: utime, stime, cutime, cstime are fields 14-17.
            ticks += sum(int(v) for v in found[11:15])
        stack.extend(children.get(pid, []))
    return ticks / os.sysconf("SC_CLK_TCK")


def _bot_cpu_s() -> float:
    """This process (all threads) plus the child processes it waited for (the ssh clients)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _agent_alone(fleet: Fleet, target: Target, login: str) -> tuple[float, float]:
    """CPU and wall seconds per `gpu-agent status --json` run directly (no SSH), as the login
    user with the same argv; medians are not needed: the CPU time is summed over the runs."""
    argv = fleet.agent(target).argv(["status", "--json"])
    account = pwd.getpwnam(login)
    env = {"PATH": SYSTEM_PATH, "HOME": account.pw_dir, "USER": login, "LANG": "C.UTF-8"}
    as_user = login if login != getpass.getuser() else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    for _ in range(AGENT_RUNS):
        done = subprocess.run(
            argv, env=env, user=as_user, cwd=account.pw_dir, capture_output=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"agent status failed: {done.stderr.decode()[-500:]}")
    wall = (time.perf_counter() - started) / AGENT_RUNS
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu / AGENT_RUNS, wall


def _report(
    samples: dict[str, Sample],
    *,
    instances_n: int,
    setup_s: float,
    load_before: tuple[float, float, float],
    login: str,
    python: str,
    agent_cpu_s: float,
    agent_wall_s: float,
) -> None:
    cores = os.cpu_count() or 1
    overview, loop, single = samples["overview"], samples["loop"], samples["single"]
    per_call_cpu_s = single.instance_cpu_s
    floor_s = instances_n * per_call_cpu_s / cores
    bound_s = max(single.wall_s, floor_s)
    shell = pwd.getpwnam(login).pw_shell
    ms = 1000.0

    print(
        f"setup: {instances_n} instances registered in parallel "
        f"({_register_workers(instances_n)} at a time) in {setup_s:.1f} s"
    )
    print(
        f"machine: {cores} CPUs shared by the bot and all {instances_n} instances' sshd's; "
        f"load average before {_load(load_before)}, after {_load(os.getloadavg())}"
    )
    print(f"login: {login} (shell {shell}); instances' python: {python} ({_torch_note(python)})")
    print()
    head = "per run (wall: median; CPU: mean)"
    print(f"{head:52s}{'wall ms':>9s}{'inst CPU ms':>13s}{'bot CPU ms':>12s}")
    rows = [
        ("overview", f"(a) /gpu status (fleet_overview), {instances_n} instances"),
        ("fan_out", f"    bare Fleet.fan_out(status), {instances_n} instances"),
        ("loop", f"(b) loop of {instances_n} plain ssh status calls"),
        ("single", "(c) /gpu status NAME (instance_detail), one"),
        ("empty_pooled", "(d) empty command (true), pooled connection"),
        ("empty_fresh", "(e) empty command (true), fresh ssh login"),
    ]
    for key, label in rows:
        s = samples[key]
        print(
            f"{label:52s}{s.wall_s * ms:9.1f}{s.instance_cpu_s * ms:13.1f}{s.bot_cpu_s * ms:12.1f}"
        )
    print()
    print(
        f"agent alone (status --json run directly, {AGENT_RUNS} runs): "
        f"{agent_cpu_s * ms:.1f} ms CPU, {agent_wall_s * ms:.1f} ms wall per call"
    )
    print(
        f"instance CPU per status over SSH (sshd + shell + agent, from (c)): "
        f"{per_call_cpu_s * ms:.1f} ms"
    )
    print(
        f"CPU floor for {instances_n} status calls here: {instances_n} x "
        f"{per_call_cpu_s * ms:.1f} ms / {cores} CPUs = {floor_s * ms:.1f} ms"
    )
    concurrent_floor_s = overview.instance_cpu_s / cores
    print(
        f"  the instances' CPU measured during (a) / {cores} CPUs = "
        f"{concurrent_floor_s * ms:.1f} ms (agents running at once cost more each than one alone)"
    )
    print()
    print("raw ratios (stopwatch on this machine):")
    speed_up, cost = loop.wall_s / overview.wall_s, overview.wall_s / single.wall_s
    print(f"  speed-up over the ssh loop (b)/(a): {speed_up:6.1f}x  (target >= 10x)")
    print(f"  cost over one instance (a)/(c):     {cost:6.1f}x  (target <= 2x)")
    print(f"against the CPU floor (bound = max((c), floor) = {bound_s * ms:.1f} ms):")
    print(
        f"  (a)/bound: {overview.wall_s / bound_s:6.1f}x  (target <= 2x, the analogue of (a)/(c))"
    )
    print(
        f"  (b)/bound: {loop.wall_s / bound_s:6.1f}x  (the largest speed-up this machine can show; "
        f"(a) reaches {bound_s / overview.wall_s * 100:.0f}% of it)"
    )
    busy = (overview.instance_cpu_s + overview.bot_cpu_s) / (overview.wall_s * cores)
    print(
        f"  during (a) the instances and the bot kept {busy * 100:.0f}% of the {cores} CPUs busy "
        "(the rest: other processes here, or waiting)"
    )
    print()
    print(
        "What they mean: the raw ratios are what a stopwatch shows here, where every instance's\n"
        f"agent starts its Python on the same {cores} CPUs; a real fleet runs each on its own\n"
        "machine. The floor is the least time the instances' own work takes when it queues for\n"
        f"{cores} CPUs, however good the bot: no fan-out can beat it here, and a real fleet does\n"
        "not have it (its bound is one instance's time, (c)). (a)/bound is the time the bot takes\n"
        "over the least this machine allows; (b)/bound caps the speed-up measurable here. The\n"
        "loop (b) pays a fresh SSH login per call (see (e)); (a) reuses one connection each."
    )
    against_floor = overview.wall_s / bound_s
    result = {
        "bench": "fleet_status",
        "figure": "status of all / max(one, CPU floor)",
        "ratio": round(against_floor, 3),
        "goal": GOAL_COST,
        "better": "lower",
        "met": against_floor <= GOAL_COST and speed_up >= GOAL_SPEED_UP,
        "raw_all_over_one": round(cost, 3),
        "ssh_loop_over_all": round(speed_up, 3),
        "instances": instances_n,
    }
    print(json.dumps(result))


def _default_python(login: str) -> str:
    if login != getpass.getuser():
        found = shutil.which("python3", path=SYSTEM_PATH)
        if found is None:
            raise SystemExit("no python3 on the system PATH for the login user; pass --python")
        return found
    return os.path.realpath(sys.executable)


def _homes_base(work: Path, login: str) -> Path:
    """Where the agent homes go: under ``work``, or in the login user's own home when it is
    another account (which cannot enter this process's private temporary directory)."""
    if login == getpass.getuser():
        return work / "homes"
    account = pwd.getpwnam(login)
    base = Path(tempfile.mkdtemp(prefix="fleet-bench-", dir=account.pw_dir))
    os.chown(base, account.pw_uid, account.pw_gid)
    return base


def _ssh(server: SshServer, known_hosts: Path, argv: list[str]) -> str:
    """One command the way a script runs it: a fresh OpenSSH client each time; its stdout."""
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
            shlex.join(argv),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ssh failed ({done.returncode}): {done.stderr[-500:]}")
    return done.stdout


def _torch_note(python: str) -> str:
    found = subprocess.run(
        [python, "-I", "-c", "import importlib.util as u; print(u.find_spec('torch') is not None)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.stdout.strip() == "True":
        return "has torch: the setup's health checks imported it"
    return "no torch"


def _load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{v:.1f}" for v in load)


class _QuietNotifier:
    """Outgoing messages are not part of the measurement: kept, never sent."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str]] = []

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        self.posts.append((channel, text))
        return MessageRef(channel=channel, ts=f"{len(self.posts)}.000000")

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        return None  # nothing is sent, so no post's answer is ever lost

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        self.posts.append((ref.channel, text))

    def upload_file(
        self,
        channel: str,
        filename: str,
        content: bytes,
        *,
        title: str,
        comment: str = "",
        thread_ts: str | None = None,
    ) -> None:
        self.posts.append((channel, title))


if __name__ == "__main__":
    raise SystemExit(main())
