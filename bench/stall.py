"""`/gpu help` while a dead host is asked about: does one dead instance stall everyone?

The real Bolt app is served over HTTP on loopback (bot.http_server) with the Slack stand-in
(bot.local_slack) and a SQLite store, with the bot's default settings (32 workers, 4 commands
per person, 10 s SSH connect timeout). The dead host is a TCP listener on 127.0.0.1 that accepts
connections and never speaks SSH, registered as the active instance ``dead`` with a pinned host
key, so ``/gpu health dead`` makes the fleet dial it. In the same run, on the same app, after
a few rounds to warm up:

  (b) dead host: 10 people send 30 ``/gpu health dead`` (3 each) at once; once the dead host
      has taken the first connection, 10 other people ask ``/gpu help`` at once, round after
      round (a round waits for its 10 answers), until all 30 have been answered (at least
      ``--rounds`` rounds; the connect timeout makes that about 10 s);
  (a) baseline: as many rounds of help again, with nothing else going on.

For each: p50, p99 and max time from sending a help to its answer at the response URL. Also:
how the 30 dead-host commands were answered and when the last was, and how many connections
the dead host accepted. Target: p99 of (b) within 2x that of (a). The last line is the
result as JSON (bench, figure, ratio, goal, met), for `make bench`.

Run: python bench/stall.py [--rounds 20 | --quick] [--workers N]  (N: the executor's workers,
default 32)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import paramiko  # noqa: E402

from agents.zipapp import build  # noqa: E402
from bot.app import build_app, build_runtime  # noqa: E402
from bot.fleet.hostkeys import host_key_from_blob  # noqa: E402
from bot.http_server import SlackHttpServer  # noqa: E402
from bot.local_slack import LocalSlack  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.slack_requests import signed_headers, slash_command_body  # noqa: E402
from bot.store.db import Database  # noqa: E402
from tests.bot.services.support import add_instance  # noqa: E402

TOKEN = "xoxb-bench"
SECRET = "bench-signing-secret"
CHANNEL = "C0GENERAL"
PEOPLE = 10
DEAD_COMMANDS = 30
TARGET_RATIO = 2.0
QUICK_ROUNDS = 8
WARM_UP_ROUNDS = 3
#: The longest any one answer is waited for.
ANSWER_WAIT_S = 60.0


class DeadHost:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte; counts them."""

    def __init__(self) -> None:
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = int(self.listener.getsockname()[1])
        self.accepted: list[socket.socket] = []
        self.first = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)
            self.first.set()

    def close(self) -> None:
        self.listener.close()
        for conn in self.accepted:
            conn.close()
        self._thread.join(5)


class Client:
    """Sends signed slash commands to the app and waits for their answers at response URLs."""

    def __init__(self, slack: LocalSlack, url: str) -> None:
        self.slack = slack
        self.url = url

    def send(self, text: str, user: str) -> tuple[str, bytes]:
        """POST `/gpu TEXT` as ``user``; its response URL and the immediate answer's body."""
        response_url = self.slack.response_url(CHANNEL, user)
        body = slash_command_body(
            text=text,
            user_id=user,
            user_name=user.lower(),
            channel_id=CHANNEL,
            response_url=response_url,
        )
        request = urllib.request.Request(
            self.url, data=body.encode(), headers=signed_headers(body, SECRET)
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return response_url, response.read()

    def answer(self, response_url: str, timeout_s: float = ANSWER_WAIT_S) -> str | None:
        """The text posted to ``response_url`` (waits for it); None if none came in time."""
        found: list[str] = []

        def arrived(slack: LocalSlack) -> bool:
            for post in slack.responses:
                if post.url == response_url:
                    found.append(str(post.payload.get("text", "")))
                    return True
            return False

        self.slack.wait_for(arrived, timeout_s)
        return found[0] if found else None

    def timed_help(self, user: str) -> float:
        """Seconds from sending `/gpu help` to its answer (inf when none came)."""
        start = time.perf_counter()
        response_url, immediate = self.send("help", user)
        if immediate:  # turned away at once: no answer will follow
            return float("inf")
        if self.answer(response_url) is None:
            return float("inf")
        return time.perf_counter() - start


def help_rounds(
    client: Client, rounds: int, until: threading.Event | None = None, limit_s: float = 120.0
) -> list[float]:
    """Rounds of 10 people asking `/gpu help` at once: ``rounds`` of them, and then more until
    ``until`` is set (for ``limit_s`` seconds at most); every latency."""
    latencies: list[float] = []
    give_up = time.monotonic() + limit_s
    done = 0
    while done < rounds or (
        until is not None and not until.is_set() and time.monotonic() < give_up
    ):
        done += 1
        results = [0.0] * PEOPLE
        barrier = threading.Barrier(PEOPLE)

        def one(i: int, out: list[float] = results, start: threading.Barrier = barrier) -> None:
            start.wait()
            out[i] = client.timed_help(f"UHELP{i:02d}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(PEOPLE)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        latencies += results
    return latencies


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of the values."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


def report(name: str, latencies: list[float]) -> None:
    print(
        f"{name}\n"
        f"  help answered: p50 {statistics.median(latencies) * 1000:7.1f} ms   "
        f"p99 {percentile(latencies, 0.99) * 1000:7.1f} ms   "
        f"max {max(latencies) * 1000:7.1f} ms   ({len(latencies)} answers)"
    )


def dead_commands(
    client: Client,
) -> tuple[list[threading.Thread], list[tuple[float, str]], threading.Event]:
    """Send the 30 `/gpu health dead` at once, from 10 people; threads collecting
    (seconds to answer, answer text), and an event set once all are answered."""
    outcomes: list[tuple[float, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(DEAD_COMMANDS)
    all_answered = threading.Event()

    def one(i: int) -> None:
        user = f"UDEAD{i % PEOPLE:02d}"
        barrier.wait()
        start = time.perf_counter()
        response_url, immediate = client.send("health dead", user)
        text = immediate.decode() if immediate else client.answer(response_url) or "(none)"
        with lock:
            outcomes.append((time.perf_counter() - start, text))
            if len(outcomes) == DEAD_COMMANDS:
                all_answered.set()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(DEAD_COMMANDS)]
    for thread in threads:
        thread.start()
    return threads, outcomes, all_answered


def describe(outcomes: list[tuple[float, str]]) -> str:
    kinds: dict[str, int] = {}
    other = ""
    for _, text in outcomes:
        if "hourglass" in text:
            kind = "turned away at once"
        elif "tries again in" in text or "still at it" in text or "trying again now" in text:
            kind = "failed fast (back-off)"
        elif "handshake" in text or "did not answer" in text:
            kind = "failed dialling"
        else:
            kind = "other"
            other = other or " ".join(text.split())[:120]
        kinds[kind] = kinds.get(kind, 0) + 1
    described = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    return f"{described} (other: {other!r})" if other else described


@contextmanager
def bot(tmp: Path, slack: LocalSlack, dead: DeadHost, workers: int) -> Iterator[str]:
    """The app on HTTP with ``dead`` registered and ``workers`` executor workers; yields its
    URL."""
    key_path = tmp / "bot_key"
    paramiko.ECDSAKey.generate().write_private_key_file(str(key_path))
    settings = Settings(
        slack_bot_token=TOKEN,
        slack_signing_secret=SECRET,
        slack_api_url=slack.api_url,
        data_dir=tmp,
        ssh_key=key_path,
        agent_zipapp=build(tmp / "gpu-agent.pyz"),
        executor_workers=workers,
    )
    db = Database(settings.effective_database_url)
    db.migrate()
    pinned_key = paramiko.ECDSAKey.generate()
    pinned = host_key_from_blob(pinned_key.get_name(), pinned_key.asbytes())
    add_instance(
        db,
        name="dead",
        host="127.0.0.1",
        port=dead.port,
        host_key_type=pinned.key_type,
        host_key_b64=pinned.key_b64,
        host_key_fingerprint=pinned.fingerprint,
    )
    rt = build_runtime(settings, db=db)
    server = SlackHttpServer(build_app(settings, runtime=rt), port=0).start()
    try:
        yield server.url
    finally:
        server.shutdown()
        rt.executor.shutdown(wait=True)
        rt.fleet.close()
        db.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of 10 helps per phase")
    parser.add_argument("--workers", type=int, default=Settings().executor_workers)
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds (what `make bench` runs)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds = QUICK_ROUNDS
    # paramiko logs each failed handshake with its traceback; the figures are what matters here.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # "Task queue depth is N"
    print(
        f"{PEOPLE} people asking /gpu help round after round; {DEAD_COMMANDS} /gpu health on a "
        f"dead host; {args.workers} workers ({os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f})"
    )
    dead = DeadHost()
    with (
        tempfile.TemporaryDirectory() as tmp,
        LocalSlack(token=TOKEN) as slack,
        bot(Path(tmp), slack, dead, args.workers) as url,
    ):
        client = Client(slack, url)
        client.timed_help("UWARMUP")  # the first request makes the app call auth.test
        help_rounds(client, WARM_UP_ROUNDS)

        started = time.perf_counter()
        threads, outcomes, all_answered = dead_commands(client)
        if not dead.first.wait(30):
            raise RuntimeError("the dead host was never dialled")
        stalled = help_rounds(client, args.rounds, until=all_answered)
        helps_done = time.perf_counter() - started
        for thread in threads:
            thread.join(ANSWER_WAIT_S)
        base = help_rounds(client, len(stalled) // PEOPLE)
    dead.close()

    report("(a) baseline: no dead host", base)
    report(f"(b) while {DEAD_COMMANDS} commands target a dead host", stalled)
    print(
        f"  the helps of (b) ended {helps_done:.1f} s after the dead-host commands were sent; "
        f"those were answered: {describe(outcomes)}; the last after "
        f"{max((t for t, _ in outcomes), default=float('nan')):.1f} s; the dead host accepted "
        f"{len(dead.accepted)} connection(s)"
    )
    ratio = percentile(stalled, 0.99) / percentile(base, 0.99)
    print(f"p99 ratio (b)/(a): {ratio:.2f}x")
    met = ratio <= TARGET_RATIO and all(t != float("inf") for t in base + stalled)
    print(
        f"target (p99 within {TARGET_RATIO:g}x, every help answered): {'met' if met else 'NOT met'}"
    )
    result = {
        "bench": "stall",
        "figure": "help p99 with a dead host / without",
        # Not a number when a help went unanswered (its time is infinite).
        "ratio": round(ratio, 3) if math.isfinite(ratio) else None,
        "goal": TARGET_RATIO,
        "better": "lower",
        "met": met,
        "helps": len(base) + len(stalled),
        "unanswered": sum(t == float("inf") for t in base + stalled),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
