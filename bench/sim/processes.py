"""Bot processes in the team-month simulation, and what a ``kill -9`` leaves behind.

A process is a :class:`~bot.runtime.Runtime` on the shared store with its own executor and its
own handles on Slack and the platform (:class:`ProcessSlack`, :class:`ProcessCloud`), through
which it can be killed mid-post or mid-release: :class:`Killed` (a BaseException, so that no
``except Exception`` of the bot catches it) unwinds the process where it stands, its open
transactions rolled back as a dead connection's are, its claims and leases left held. With two
processes (``--processes 2``, on PostgreSQL by default) both tick the same moments, one after
the other, in one thread: two processes sharing the store, deterministically interleaved.

:func:`store_consistent` is the store's own consistency check, run after every kill and at the
end: no machine with two live registrations, no instance with two open releases, compute
charges that neither overlap nor leave a gap, outbox rows in a known delivery state; and at the
end (``final``) no release, outbox post or job reply still claimed by a lease long expired.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlmodel import col, select

from bench.sim.platforms import PlatformCloud
from bench.sim.world import SimSlack, World
from bot.errors import ProviderError, SlackError
from bot.notify import MessageRef
from bot.providers.base import ReleaseOutcome
from bot.services.instances import releases
from bot.services.jobs import runs
from bot.services.speaking import outbox
from bot.store.db import Database
from bot.store.models import Charge, Instance, Job, OutboxMessage, Release

#: Where a doomed process dies: at its next post to Slack, or its next release call.
KILL_POINTS = ("post", "release")
#: Outbox delivery states (None: not posted yet).
DELIVERY_STATES = (None, outbox.POSTED, outbox.UNCONFIRMED, outbox.FAILED)
#: A lease expired this long ago, at the end of a run, was left by a process for good.
STALE_AFTER = timedelta(hours=1)


class Killed(BaseException):
    """``kill -9`` of a bot process: nothing of the bot catches it."""


@dataclass
class Doom:
    """Whether (and where) the process dies at its next chance."""

    at: str | None = None
    #: Whether the call it dies in went through first (the post landed, the release was made).
    after: bool = False
    #: Set when it died (also where the bot caught it: in a worker thread's future).
    fired: bool = False


class ProcessSlack:
    """One process's handle on Slack: :class:`SimSlack`, unless the process is doomed to die
    at its next post (before it lands, or after, before the answer is read)."""

    def __init__(self, slack: SimSlack, doom: Doom) -> None:
        self.slack = slack
        self.doom = doom

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        if self.doom.at == "post":
            self.doom.at, self.doom.fired = None, True
            if self.doom.after:
                # Dead before Slack's answer, whatever it was (a late post still lands).
                with contextlib.suppress(SlackError):
                    self.slack.post(channel, text, blocks, thread_ts=thread_ts, key=key)
            raise Killed("killed mid-post")
        return self.slack.post(channel, text, blocks, thread_ts=thread_ts, key=key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.slack, name)


class ProcessCloud:
    """One process's handle on a platform (:class:`PlatformCloud`), unless the process is doomed
    to die at its next release call (before the platform acts, or after)."""

    def __init__(self, cloud: PlatformCloud, doom: Doom) -> None:
        self.cloud = cloud
        self.doom = doom
        self.name = cloud.name
        self.capabilities = cloud.capabilities

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        if self.doom.at == "release":
            self.doom.at, self.doom.fired = None, True
            if self.doom.after:
                # Dead before the platform's answer, whatever it was.
                with contextlib.suppress(ProviderError):
                    self.cloud.release(provider_id, mode)
            raise Killed("killed mid-release")
        return self.cloud.release(provider_id, mode)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)


def doom(world: World, proc: Doom) -> str:
    """Arm ``proc`` to die at its next post or release (half the time after the call went
    through); returns where."""
    proc.at = world.rng.choice(KILL_POINTS)
    proc.after = world.rng.random() < 0.5
    return f"{proc.at} ({'after' if proc.after else 'before'} the call)"


def store_consistent(db: Database, now: datetime, *, final: bool = False) -> list[str]:
    """What the store holds that no run of the bot may leave (see the module docstring)."""
    found: list[str] = []
    with db.session() as session:
        instances = session.exec(select(Instance)).all()
        open_releases = session.exec(
            select(Release).where(col(Release.state).in_(releases.OPEN_STATES))
        ).all()
        charges = session.exec(
            select(Charge).where(Charge.kind == "compute").order_by(col(Charge.start_at))
        ).all()
        messages = session.exec(select(OutboxMessage)).all()
        claimed_jobs = session.exec(
            select(Job).where(col(Job.reply_claimed_at).is_not(None), col(Job.replied_at).is_(None))
        ).all()
    live = Counter((i.host, i.port) for i in instances if i.state in ("active", "stopped"))
    found += [f"{h}:{p}: {n} live registrations" for (h, p), n in live.items() if n > 1]
    per_instance = Counter(r.instance_id for r in open_releases)
    found += [f"instance {i}: {n} open releases" for i, n in per_instance.items() if n > 1]
    found += _ledger_gaps(charges)
    for message in messages:
        if message.delivery not in DELIVERY_STATES:
            found.append(f"outbox {message.id}: delivery {message.delivery!r}")
    if not final:
        return found
    stale = now - STALE_AFTER
    for release in open_releases:
        lease = release.next_attempt_at
        if release.state == "in_progress" and lease is not None and lease < stale:
            found.append(f"release {release.id}: claimed by a lease that ended at {lease}")
    lease_s = timedelta(seconds=outbox.CLAIM_LEASE_S)
    for message in messages:
        claimed = message.claimed_at
        if message.delivery is None and claimed is not None and claimed + lease_s < stale:
            found.append(f"outbox {message.id}: claimed since {claimed}, never posted")
    for job in claimed_jobs:
        claimed_at = job.reply_claimed_at
        if claimed_at is not None and claimed_at + runs.CLAIM_TIMEOUT < stale:
            found.append(f"job {job.id}: its reply claimed since {claimed_at}, never queued")
    return found


def _ledger_gaps(charges: Sequence[Charge]) -> list[str]:
    """Compute charges of one instance that overlap, or leave a gap between them."""
    found: list[str] = []
    by_instance: dict[int, list[Charge]] = defaultdict(list)
    for charge in charges:
        by_instance[charge.instance_id].append(charge)
    for instance_id, rows in by_instance.items():
        for before, after in itertools.pairwise(rows):
            if after.start_at < before.end_at:
                found.append(f"instance {instance_id}: charges overlap at {after.start_at}")
            elif after.start_at > before.end_at:
                found.append(f"instance {instance_id}: no charge {before.end_at}-{after.start_at}")
    return found
