"""Time to acknowledgement under a burst: 50 concurrent, correctly signed slash commands.

The real Bolt app is served over HTTP on loopback (bot.http_server) in a process of its own, as
Slack and the bot are apart, with its client and the response URLs pointed at the local Slack
stand-in in this process. Two kinds of handler, each in its own burst:

  - sleeping: ``--work-s`` seconds of waiting (SSH and database calls), the GIL free;
  - CPU-bound: ``--cpu-ms`` milliseconds of pure Python (rendering, parsing), the GIL held, so
    the handlers compete with the threads that ack.

Servers, in the same run, each burst repeated ``--rounds`` times and interleaved, after one
burst per server that is not counted (threads started, users met):

  (a) gpubot: the bot's app, store and executor, as it runs (replay check in the store
      included);
  (b) baseline: bare Bolt on the same HTTP server, the listener acks and hands the work to a
      thread pool: the least an ack can cost here;
  (c) with ``--previous REV``: gpubot as it was at git revision REV (its ``bot`` package read
      with ``git archive``; nothing in the work tree changes), beside the current one.

For each: p50, p99 and max time from sending a request to its HTTP 200 (the ack Slack waits for,
at most 3 s), how many were acked within Slack's 3 s, how many replies reached their response
URLs (none may be lost), and the server's CPU per command. Goal for (a): p99 under 100 ms with
CPU-bound handlers, none late, none lost. The last line printed is JSON:
``{"bench": "ack_latency", "ratio": gpubot p99 / baseline p99 (CPU-bound), "goal": ...,
"met": ..., "p99_ms": ...}``.

Run: python bench/ack_latency.py [--quick] [--requests 50] [--work-s 1.0] [--cpu-ms 5]
[--rounds 3] [--previous REV]
(``--serve KIND --api URL`` is how this script starts its own server processes.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A child serving an older revision reads that revision's ``bot`` package first.
sys.path.insert(0, os.environ.get("GPUBOT_BENCH_TREE") or str(ROOT))

from slack_bolt import Ack, App, Respond  # noqa: E402
from slack_sdk import WebClient  # noqa: E402

from bot.local_slack import LocalSlack  # noqa: E402
from bot.slack_requests import signed_headers, slash_command_body  # noqa: E402

TOKEN = "xoxb-bench"
SECRET = "bench-signing-secret"
SLACK_ACK_LIMIT_S = 3.0
TARGET_P99_S = 0.100
GOAL = "p99 < 100 ms, none late or lost"
KINDS = ("sleep", "cpu")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--work-s", type=float, default=1.0, help="sleeping work per command")
    parser.add_argument("--cpu-ms", type=float, default=5.0, help="GIL-held work per command")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per server and kind")
    parser.add_argument("--quick", action="store_true", help="one round, 0.2 s of sleep")
    parser.add_argument("--previous", metavar="REV", help="also serve gpubot as of REV")
    parser.add_argument("--serve", choices=["gpubot", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.work_s = 1, min(args.work_s, 0.2)
    if args.serve:
        return serve(args.serve, args.api, args.work_s, args.cpu_ms)
    servers: dict[str, str | None] = {"gpubot": None, "baseline": None}
    with tempfile.TemporaryDirectory() as tmp:
        if args.previous:
            servers[f"gpubot@{args.previous}"] = extract_revision(args.previous, Path(tmp))
        with LocalSlack(token=TOKEN) as slack:
            print(
                f"{args.requests} concurrent signed /gpu commands: sleeping {args.work_s:.1f} s, "
                f"or {args.cpu_ms:g} ms of GIL-held CPU; {args.rounds} round(s) "
                f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})"
            )
            results = measure(slack, servers, args)
    for (name, kind), result in results.items():
        report(f"{name}, {kind} handlers", result)
    ours, base = results["gpubot", "cpu"], results["baseline", "cpu"]
    ratio = ours.p99_s / base.p99_s if base.p99_s > 0 else float("inf")
    met = ours.p99_s < TARGET_P99_S and ours.in_time == ours.sent and ours.answered == ours.sent
    print(f"CPU-bound p99, gpubot / baseline: {ratio:.2f}x; goal {'met' if met else 'NOT met'}")
    print(
        json.dumps(
            {
                "bench": "ack_latency",
                "figure": (
                    f"ack p99 with {args.cpu_ms:g} ms CPU handlers: gpubot "
                    f"{ours.p99_s * 1000:.0f} ms, bare Bolt {base.p99_s * 1000:.0f} ms"
                ),
                "ratio": round(ratio, 3),
                "goal": GOAL,
                "met": met,
                "p99_ms": round(ours.p99_s * 1000, 1),
            }
        )
    )
    return 0


def measure(
    slack: LocalSlack, servers: dict[str, str | None], args: argparse.Namespace
) -> dict[tuple[str, str], Result]:
    """Each server serves each kind of handler; rounds interleave the servers."""
    samples: dict[tuple[str, str], list[Result]] = {}
    for kind in KINDS:
        with ExitStack() as stack:
            running = {
                name: stack.enter_context(
                    server_process(name, tree, slack, kind, args.work_s, args.cpu_ms)
                )
                for name, tree in servers.items()
            }
            for url, _pid in running.values():
                # A first burst, not counted: each server starts its threads and meets its
                # 50 users (their rows, their first replies) before it is timed.
                burst(slack, url, args.requests)
            for _ in range(args.rounds):
                for name, (url, pid) in running.items():
                    cpu_before = cpu_seconds(pid)
                    result = burst(slack, url, args.requests)
                    result.cpu_s = cpu_seconds(pid) - cpu_before
                    samples.setdefault((name, kind), []).append(result)
    return {key: Result.merge(results) for key, results in samples.items()}


class Result:
    """Bursts of one server and kind: per-request ack latency (None when the request failed)
    and replies counted."""

    def __init__(self, sent: int, latencies: list[float | None], answered: int) -> None:
        self.sent = sent
        self.latencies = latencies
        ok = sorted(x for x in latencies if x is not None)
        self.acked = len(ok)
        self.in_time = sum(1 for x in ok if x <= SLACK_ACK_LIMIT_S)
        self.answered = answered
        self.p50_s = statistics.median(ok) if ok else float("nan")
        self.p99_s = percentile(ok, 0.99) if ok else float("nan")
        self.max_s = ok[-1] if ok else float("nan")
        self.cpu_s = float("nan")

    @classmethod
    def merge(cls, results: list[Result]) -> Result:
        """One result of several bursts: latencies pooled, counts and CPU summed."""
        merged = cls(
            sum(r.sent for r in results),
            [x for r in results for x in r.latencies],
            sum(r.answered for r in results),
        )
        merged.cpu_s = sum(r.cpu_s for r in results)
        return merged


def burst(slack: LocalSlack, url: str, count: int) -> Result:
    """Send ``count`` commands at once; wait (up to a minute) for their replies.

    Each request is built and its connection opened beforehand, so the time measured is the
    server's: from the request's first byte sent to the first line of its answer.
    """
    before = len(slack.responses)
    parts = urllib.parse.urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    requests = [_raw_request(slack, parts, i) for i in range(count)]
    barrier = threading.Barrier(count)
    latencies: list[float | None] = [None] * count

    def one(i: int) -> None:
        try:
            with socket.create_connection(address, timeout=30) as sock:
                barrier.wait()
                start = time.perf_counter()
                sock.sendall(requests[i])
                status = sock.makefile("rb").readline().split()
                if len(status) > 1 and status[1] == b"200":
                    latencies[i] = time.perf_counter() - start
        except (OSError, threading.BrokenBarrierError):
            return

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    slack.wait_for(lambda s: len(s.responses) - before >= count, timeout_s=60)
    return Result(count, latencies, len(slack.responses) - before)


_SENT = iter(range(10**9))


def _raw_request(slack: LocalSlack, parts: urllib.parse.SplitResult, i: int) -> bytes:
    user = f"U{i:04d}"
    body = slash_command_body(
        text=f"slow {next(_SENT)}",  # every request's body, so its signature, differs
        user_id=user,
        user_name=f"user{i}",
        channel_id="C0GENERAL",
        response_url=slack.response_url("C0GENERAL", user),
    )
    data = body.encode()
    lines = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Content-Length: {len(data)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in signed_headers(body, SECRET).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def extract_revision(revision: str, into: Path) -> str:
    """The ``bot`` package of git revision ``revision``, written under ``into`` (git archive:
    the work tree and the index are untouched); returns the directory to put on sys.path."""
    tree = into / "previous"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "bot"],
        check=True,
        capture_output=True,
    ).stdout
    archive_path = into / "previous.tar"
    archive_path.write_bytes(archive)
    with tarfile.open(archive_path) as tar:
        tar.extractall(tree, filter="data")
    return str(tree)


@contextmanager
def server_process(
    name: str, tree: str | None, slack: LocalSlack, kind: str, work_s: float, cpu_ms: float
) -> Iterator[tuple[str, int]]:
    """Start ``--serve`` for server ``name`` (``tree``: an older revision's package) in a child
    process with handlers of ``kind``; yields its URL and process id once one request went
    through."""
    env = dict(os.environ)
    if tree is not None:
        env["GPUBOT_BENCH_TREE"] = tree
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "baseline" if name == "baseline" else "gpubot",
            "--api",
            slack.api_url,
            "--work-s",
            str(work_s if kind == "sleep" else 0.0),
            "--cpu-ms",
            str(cpu_ms if kind == "cpu" else 0.0),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the {name} server did not start")
        if burst(slack, url, 1).answered != 1:  # the first request makes the app call auth.test
            raise RuntimeError(f"the {name} server did not answer")
        yield url, child.pid
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)


def serve(kind: str, api_url: str, work_s: float, cpu_ms: float) -> int:
    """In the child: serve until standard input closes, printing the URL first."""
    make = gpubot_server if kind == "gpubot" else baseline_server
    work = _work(work_s, cpu_ms)
    with tempfile.TemporaryDirectory() as tmp, make(api_url, Path(tmp), work) as url:
        print(url, flush=True)
        sys.stdin.read()
    return 0


def _work(work_s: float, cpu_ms: float) -> Callable[[], None]:
    """A handler's work: ``work_s`` seconds asleep, then ``cpu_ms`` ms of pure Python."""

    def work() -> None:
        if work_s > 0:
            time.sleep(work_s)
        if cpu_ms > 0:
            until = time.thread_time() + cpu_ms / 1000
            spins = 0
            while time.thread_time() < until:
                spins += sum(range(50))

    return work


@contextmanager
def gpubot_server(api_url: str, tmp: Path, work: Callable[[], None]) -> Iterator[str]:
    """The bot's app and HTTP server with a registry holding one slow command."""
    from bot.app import build_app, build_runtime
    from bot.commands.registry import CommandSpec, Registry, Reply
    from bot.http_server import SlackHttpServer
    from bot.settings import Settings
    from bot.store.db import Database

    def handle(rt: object, caller: object, args: argparse.Namespace) -> Reply:
        work()
        return Reply(text=f"done {args.n}")

    registry = Registry()
    registry.command(
        CommandSpec(
            name="slow",
            summary="slow work",
            usage="/gpu slow N",
            examples=(),
            configure=_configure,
            handler=handle,
        )
    )
    settings = Settings(
        slack_bot_token=TOKEN,
        slack_signing_secret=SECRET,
        slack_api_url=api_url,
        data_dir=tmp,
        executor_workers=64,
    )
    db = Database(settings.effective_database_url)
    db.migrate()
    rt = build_runtime(settings, db=db)
    server = SlackHttpServer(build_app(settings, runtime=rt, registry=registry), port=0).start()
    try:
        yield server.url
    finally:
        server.shutdown()
        rt.executor.shutdown(wait=True)
        db.dispose()


@contextmanager
def baseline_server(api_url: str, tmp: Path, work: Callable[[], None]) -> Iterator[str]:
    """Bare Bolt on the same HTTP server: the listener acks and hands the work to a pool of
    as many threads as gpubot's executor has."""
    from bot.http_server import SlackHttpServer

    app = App(
        signing_secret=SECRET,
        client=WebClient(token=TOKEN, base_url=api_url),
        token_verification_enabled=False,
        process_before_response=True,
    )
    pool = ThreadPoolExecutor(max_workers=64)

    def run(respond: Respond) -> None:
        work()
        respond(text="done")

    @app.command("/gpu")
    def slow(ack: Ack, respond: Respond) -> None:
        pool.submit(run, respond)
        ack()

    server = SlackHttpServer(app, port=0).start()
    try:
        yield server.url
    finally:
        server.shutdown()
        pool.shutdown(wait=True)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("n")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used, from /proc; NaN where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of sorted values."""
    rank = max(1, min(len(sorted_values), round(q * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def report(name: str, result: Result) -> None:
    print(
        f"{name}\n"
        f"  ack p50 {result.p50_s * 1000:7.1f} ms   p99 {result.p99_s * 1000:7.1f} ms   "
        f"max {result.max_s * 1000:7.1f} ms\n"
        f"  acked {result.acked}/{result.sent} (within 3 s: {result.in_time}),   "
        f"replies at response URLs {result.answered}/{result.sent},   "
        f"server CPU {result.cpu_s * 1000 / result.sent:.1f} ms per command"
    )


if __name__ == "__main__":
    sys.exit(main())
