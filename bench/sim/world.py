"""The world outside the bot, as the team-month simulation stands it in: Slack's Web API and
the clock, misbehaving on the world's seeded dice (the platforms are stand-ins of their APIs
behind the bot's own clients: bench/sim/platforms.py); and the questions the invariants ask of
what the world did (outages, suspensions)."""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bot.errors import SlackError
from bot.notify import MessageRef

#: The ops channel (GPUBOT_CHANNEL): escalations and the digest go there.
OPS = "COPS"
#: Every kind of fault the world injects; each is also scheduled once in the first day.
FAULT_KINDS = (
    "slack_outage",
    "slack_429",
    "slack_lost_answer",
    "slack_late_post",
    "platform_outage",
    "platform_error",
    "platform_catch_all_404",
    "platform_429",
    "platform_lost_answer",
    "platform_operation_lock",
    "ended_on_platform",
    "ssh_hang",
    "ssh_drop",
    "gpu_idle",
    "gpu_overheat",
    "gpu_gone",
    "job_host_reboot",
    "job_store_wiped",
    "job_run_lost_answer",
    "process_kill",
    "clock_jump",
)


@dataclass
class World:
    """What the outside edges are doing now, and what they did."""

    rng: random.Random
    faults: Counter[str] = field(default_factory=Counter)
    slack_down_until: datetime | None = None
    platform_down_until: datetime | None = None
    #: (start, end) of each platform outage, to excuse what it kept billing.
    platform_outages: list[tuple[datetime, datetime]] = field(default_factory=list)
    slack_outages: list[tuple[datetime, datetime]] = field(default_factory=list)
    #: (start, end) of each time the bot's host was suspended (the clock jumped over it).
    suspensions: list[tuple[datetime, datetime]] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    #: True while the invariants read the world: no fault fires.
    calm: bool = False
    #: Kinds whose scheduled moment came: each fires at its next chance, whatever the dice.
    due: set[str] = field(default_factory=set)

    def fires(self, kind: str, probability: float) -> bool:
        """Whether a fault of ``kind`` happens at this chance (counted when it does)."""
        if self.calm:
            return False
        if kind in self.due:
            self.due.discard(kind)
        elif self.rng.random() >= probability:
            return False
        self.faults[kind] += 1
        return True

    def log(self, now: datetime, what: str) -> None:
        self.trace.append(f"{now:%m-%d %H:%M} {what}")

    def slack_up(self, now: datetime) -> bool:
        return self.slack_down_until is None or now >= self.slack_down_until

    def platform_up(self, now: datetime) -> bool:
        if self.calm:
            return True
        return self.platform_down_until is None or now >= self.platform_down_until


@dataclass
class Posted:
    channel: str
    text: str
    key: str | None
    ts: str


#: How late a post may land after the client gave up on it, seconds (``slack_late_post``):
#: Slack stores a message it was slow to answer within seconds, at most a minute and a half;
#: well inside the outbox's claim lease, after which another process looks for it.
LATE_POST_S = (5, 90)


class SimSlack:
    """Slack's Web API as the bot's notifier sees it: outages (unreachable), 429s, posts that
    land although the answer was lost (outcome unknown), and posts that land only after the
    client timed out (``slack_late_post``: not in the conversation when the bot gave up, there
    ``LATE_POST_S`` seconds later)."""

    def __init__(self, world: World, clock: SimClock, *, double_post: bool = False) -> None:
        self.world = world
        self.clock = clock
        self._posts: list[Posted] = []
        #: (when it lands, what) of posts Slack is still storing.
        self._landing: list[tuple[datetime, Posted]] = []
        self.double_post = double_post
        self._ts = 0

    @property
    def posts(self) -> list[Posted]:
        """What is in the conversations now (late posts once their moment came)."""
        self._settle(self.clock())
        return self._posts

    def land_everything(self) -> None:
        """Let every late post land (the run is over: Slack has stored them all)."""
        self._posts.extend(posted for _, posted in self._landing)
        self._landing.clear()

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        now = self.clock()
        if not self.world.slack_up(now):
            raise SlackError("Slack is unreachable", error="unreachable")
        if self.world.fires("slack_429", 0.02):
            raise SlackError("ratelimited", error="ratelimited")
        if self.world.fires("slack_late_post", 0.01):
            delay_s = self.world.rng.randint(*LATE_POST_S)
            self._land(channel, text, key, at=now + timedelta(seconds=delay_s))
            self.world.log(now, f"a post to {channel} timed out; it lands {delay_s} s later")
            raise SlackError("timed out", error="timeout", outcome_unknown=True)
        ref = self._land(channel, text, key)
        if self.double_post and key is not None:
            self._land(channel, text, key)
        if self.world.fires("slack_lost_answer", 0.02):
            raise SlackError("timed out", error="timeout", outcome_unknown=True)
        return ref

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        if not self.world.slack_up(self.clock()):
            raise SlackError("Slack is unreachable", error="unreachable")
        for posted in self.posts:
            if posted.channel == channel and posted.key == key:
                return MessageRef(channel=channel, ts=posted.ts)
        return None

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        if not self.world.slack_up(self.clock()):
            raise SlackError("Slack is unreachable", error="unreachable")

    def upload_file(self, channel: str, filename: str, content: bytes, **_: Any) -> None:
        if not self.world.slack_up(self.clock()):
            raise SlackError("Slack is unreachable", error="unreachable")

    def _land(
        self, channel: str, text: str, key: str | None, *, at: datetime | None = None
    ) -> MessageRef:
        """Store a post now, or (``at``) when Slack gets round to it."""
        self._ts += 1
        ts = f"{self._ts}.000100"
        posted = Posted(channel, text, key, ts)
        if at is None:
            self._posts.append(posted)
        else:
            self._landing.append((at, posted))
        return MessageRef(channel=channel, ts=ts)

    def _settle(self, now: datetime) -> None:
        if not self._landing:
            return
        landed = [posted for at, posted in self._landing if at <= now]
        self._landing = [(at, posted) for at, posted in self._landing if at > now]
        self._posts.extend(landed)


@dataclass
class Machine:
    """One machine as the platform keeps it: billed per second while not ended
    (``price_per_s`` in micro-units)."""

    provider_id: str
    price_per_s: int
    started_at: datetime
    ended_at: datetime | None = None
    ended_by: str = ""
    #: The platform it runs on (bench/sim/platforms.py).
    platform: str = ""


class SimClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class ErrorCount(logging.Handler):
    """Counts what the bot logged as an error (each one is a finding to look at)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.messages: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages[record.getMessage()[:160]] += 1


def box_name(provider_id: str) -> str:
    """The instance's name for the platform's id (the pod ``pod0003xyz`` is ``box3``)."""
    return f"box{int(''.join(c for c in provider_id if c.isdigit()))}"


def overlap_s(start: datetime, end: datetime, spans: Sequence[tuple[datetime, datetime]]) -> int:
    """Seconds of [start, end) that fall in any of ``spans``."""
    total = 0
    for a, b in spans:
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            total += int((hi - lo).total_seconds())
    return total


def slack_was_down(world: World, at: datetime | None) -> bool:
    """Whether Slack was down within an hour of ``at``."""
    if at is None:
        return False
    window = timedelta(hours=1)
    return any(a - window <= at <= b + window for a, b in world.slack_outages)


def slack_up_for(world: World, due: datetime, now: datetime, span: timedelta) -> bool:
    """Whether Slack was up for ``span`` without a break between ``due`` and ``now``."""
    moments = sorted([due] + [b for a, b in world.slack_outages if due <= b <= now])
    for at in moments:
        if at + span > now:
            return False
        if not any(a <= at < b or at < a < at + span for a, b in world.slack_outages):
            return True
    return False
