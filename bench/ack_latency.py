"""Time to acknowledgement under a burst: 50 concurrent, correctly signed slash commands.

The real Bolt app is served over HTTP on loopback (bot.http_server) in a process of its own, as
Slack and the bot are apart, with its client and the response URLs pointed at the local Slack
stand-in in this process. Each command's handler does slow work (``--work-s`` seconds, standing
in for SSH and database calls). In the same run:

  (a) gpubot: the listener acks at once and hands the work to the bot's own executor;
  (b) baseline: the common Bolt pattern - ack(), then the slow work inside the listener, on
      Bolt's default pool of 5 listener threads.

For each: p50, p99 and max time from sending a request to its HTTP 200 (the ack Slack waits for,
at most 3 s), how many were acked within Slack's 3 s, and how many replies reached their response
URLs (none may be lost). Target for (a): p99 under 300 ms, 50 of 50 acked in time and answered.

Run: python bench/ack_latency.py [--requests 50] [--work-s 1.0]
(``--serve gpubot|baseline --api URL`` is how this script starts its own server processes.)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slack_bolt import Ack, App, Respond  # noqa: E402
from slack_sdk import WebClient  # noqa: E402

from bot.app import build_app, build_runtime  # noqa: E402
from bot.commands.registry import CommandSpec, Registry, Reply  # noqa: E402
from bot.http_server import SlackHttpServer  # noqa: E402
from bot.local_slack import LocalSlack, signed_headers, slash_command_body  # noqa: E402
from bot.services.access import Caller  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.store.db import Database  # noqa: E402

TOKEN = "xoxb-bench"
SECRET = "bench-signing-secret"
SLACK_ACK_LIMIT_S = 3.0
TARGET_P99_S = 0.300


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--work-s", type=float, default=1.0, help="slow work per command")
    parser.add_argument("--serve", choices=["gpubot", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.api, args.work_s)
    with LocalSlack(token=TOKEN) as slack:
        print(
            f"{args.requests} concurrent signed /gpu commands, {args.work_s:.1f} s of work each "
            f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f})"
        )
        with server_process("gpubot", slack, args.work_s) as (url, pid):
            cpu_before = cpu_seconds(pid)
            ours = burst(slack, url, args.requests)
            ours.cpu_s = cpu_seconds(pid) - cpu_before
        with server_process("baseline", slack, args.work_s) as (url, pid):
            cpu_before = cpu_seconds(pid)
            base = burst(slack, url, args.requests)
            base.cpu_s = cpu_seconds(pid) - cpu_before
    report("(a) gpubot: ack, then the bot's executor", ours)
    report("(b) baseline: work in Bolt's 5 listener threads", base)
    ratio = base.p99_s / ours.p99_s if ours.p99_s > 0 else float("inf")
    print(f"p99 ratio baseline/gpubot: {ratio:.1f}x")
    met = ours.p99_s < TARGET_P99_S and ours.in_time == ours.sent and ours.answered == ours.sent
    print(
        f"target (p99 < {TARGET_P99_S * 1000:.0f} ms, none late, none lost): "
        f"{'met' if met else 'NOT met'}"
    )
    return 0


class Result:
    """One burst: per-request ack latency (None when the request failed) and replies counted."""

    def __init__(self, sent: int, latencies: list[float | None], answered: int) -> None:
        self.sent = sent
        ok = sorted(x for x in latencies if x is not None)
        self.acked = len(ok)
        self.in_time = sum(1 for x in ok if x <= SLACK_ACK_LIMIT_S)
        self.answered = answered
        self.p50_s = statistics.median(ok) if ok else float("nan")
        self.p99_s = percentile(ok, 0.99) if ok else float("nan")
        self.max_s = ok[-1] if ok else float("nan")
        self.cpu_s = float("nan")


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


def _raw_request(slack: LocalSlack, parts: urllib.parse.SplitResult, i: int) -> bytes:
    body = slash_command_body(
        text=f"slow {i}",
        user_id=f"U{i:04d}",
        user_name=f"user{i}",
        channel_id="C0GENERAL",
        response_url=slack.response_url("C0GENERAL", f"U{i:04d}"),
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


@contextmanager
def server_process(kind: str, slack: LocalSlack, work_s: float) -> Iterator[tuple[str, int]]:
    """Start ``--serve KIND`` in a child process; yields its URL and process id once one
    request went through."""
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            kind,
            "--api",
            slack.api_url,
            "--work-s",
            str(work_s),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError(f"the {kind} server did not start")
        if burst(slack, url, 1).answered != 1:  # the first request makes the app call auth.test
            raise RuntimeError(f"the {kind} server did not answer")
        yield url, child.pid
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)


def serve(kind: str, api_url: str, work_s: float) -> int:
    """In the child: serve until standard input closes, printing the URL first."""
    make = gpubot_server if kind == "gpubot" else baseline_server
    with tempfile.TemporaryDirectory() as tmp, make(api_url, Path(tmp), work_s) as url:
        print(url, flush=True)
        sys.stdin.read()
    return 0


@contextmanager
def gpubot_server(api_url: str, tmp: Path, work_s: float) -> Iterator[str]:
    """The bot's app and HTTP server with a registry holding one slow command."""
    registry = Registry()
    registry.command(
        CommandSpec(
            name="slow",
            summary="slow work",
            usage="/gpu slow N",
            examples=(),
            configure=_configure,
            handler=_slow_handler(work_s),
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
def baseline_server(api_url: str, tmp: Path, work_s: float) -> Iterator[str]:
    """Bolt as often written: the slow work inside the listener after ack()."""
    app = App(
        signing_secret=SECRET,
        client=WebClient(token=TOKEN, base_url=api_url),
        token_verification_enabled=False,
    )

    @app.command("/gpu")
    def slow(ack: Ack, respond: Respond) -> None:
        ack()
        time.sleep(work_s)
        respond(text="done")

    server = SlackHttpServer(app, port=0).start()
    try:
        yield server.url
    finally:
        server.shutdown()


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("n")


def _slow_handler(work_s: float) -> Callable[..., Reply]:
    def handle(rt: object, caller: Caller, args: argparse.Namespace) -> Reply:
        time.sleep(work_s)
        return Reply(text=f"done {args.n}")

    return handle


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
