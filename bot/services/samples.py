"""Utilisation samples: recorded with their bucket's roll-up, pruned after their retention.

Each poll writes one UtilSample row (what the idle rules and the last poll read) and adds itself
to the UtilHour row of its instance and ledger bucket (the charge it falls in) in the same
transaction, so reports join each charge to one roll-up, never to raw samples. Raw samples older
than the retention (``settings.sample_retention_days``, GPUBOT_SAMPLE_RETENTION_DAYS) are deleted
in bounded batches; the roll-ups stay as long as the charges they explain.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import delete
from sqlmodel import Session, col, select

from bot.runtime import Runtime
from bot.services import ledger
from bot.store.models import Instance, UtilHour, UtilSample

#: At most this many raw samples are deleted per transaction, and per call of :func:`prune`.
PRUNE_BATCH = 5_000
PRUNE_BATCHES_PER_CALL = 4


def record(session: Session, sample: UtilSample, tz: ZoneInfo) -> None:
    """Add ``sample`` and count it in the roll-up of its ledger bucket (``tz``: the configured
    zone, where months start), in the caller's transaction (one poll of an instance at a time:
    the poll's claim keeps two processes from racing here)."""
    session.add(sample)
    instance = session.get(Instance, sample.instance_id)
    if instance is None:
        return
    start = ledger.bucket_start(instance, sample.at, tz)
    bucket = session.get(UtilHour, (sample.instance_id, start))
    if bucket is None:
        bucket = UtilHour(instance_id=sample.instance_id, bucket_start=start)
    bucket.polls += 1
    if not sample.ok or sample.util_avg_pct is None:
        bucket.bad_polls += 1
    elif bucket.max_util_pct is None or sample.util_avg_pct > bucket.max_util_pct:
        bucket.max_util_pct = sample.util_avg_pct
    session.add(bucket)


def prune(rt: Runtime, now: datetime) -> int:
    """Delete raw samples taken more than ``rt.settings.sample_retention_days`` days before
    ``now``, at most ``PRUNE_BATCH`` per transaction and ``PRUNE_BATCHES_PER_CALL`` batches per
    call (the rest waits for the next call); returns how many were deleted."""
    cutoff = now - timedelta(days=rt.settings.sample_retention_days)
    deleted = 0
    for _ in range(PRUNE_BATCHES_PER_CALL):
        with rt.db.session() as session:
            oldest = select(UtilSample.id).where(col(UtilSample.at) < cutoff).limit(PRUNE_BATCH)
            count = session.exec(delete(UtilSample).where(col(UtilSample.id).in_(oldest))).rowcount
        deleted += int(count or 0)
        if not count or count < PRUNE_BATCH:
            break
    return deleted
