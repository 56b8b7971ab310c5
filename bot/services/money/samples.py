"""Utilisation samples: recorded with their bucket's roll-up, pruned after their retention.

Each poll writes one UtilSample row (what the idle rules and the last poll read) and adds itself
to the UtilHour row of its instance and ledger bucket (the charge it falls in) in the same
transaction, so reports join each charge to one roll-up, never to raw samples. Raw samples older
than the retention (``settings.sample_retention_days``, GPUBOT_SAMPLE_RETENTION_DAYS) are deleted
oldest first in batches of about ``PRUNE_BATCH``, each an indexed range of times in a transaction
of its own, batch after batch while any are past the retention, at most
``PRUNE_BATCHES_PER_CALL`` and what fits in the call's time box: the clock prunes every 5
minutes (bot.services.tick), so it deletes up to 720,000 an hour, six times what 2,000
instances polled once a minute write. The roll-ups stay as long as the charges they explain.

Money is split by **GPU-samples**, one GPU in one poll, each judged when polled
(:func:`judge_gpus`): idle (its utilisation read under the idle threshold, no process on it),
in use (at or over the threshold, or a process on it), or not measured (it read no
utilisation, NVML failed, or the poll failed: then every GPU of the instance). A bucket's
compute is shared out in proportion (bot.services.money.ledger); a bucket without a poll is wholly
not measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import delete
from sqlmodel import Session, col, select

from agents.protocol import StatusSnapshot
from bot import timebox
from bot.runtime import Runtime
from bot.services.money import ledger
from bot.store.models import Instance, UtilHour, UtilSample
from bot.timebox import Timebox

#: Raw samples deleted per transaction (more when samples share the last one's time), and
#: transactions per call of :func:`prune`.
PRUNE_BATCH = 5_000
PRUNE_BATCHES_PER_CALL = 12


@dataclass(frozen=True)
class GpuStates:
    """How many GPUs of one poll were idle, in use and not measured."""

    idle: int
    busy: int
    unmeasured: int


def judge_gpus(snapshot: StatusSnapshot, threshold_pct: float) -> GpuStates:
    """Each GPU of a status snapshot judged under ``threshold_pct`` (%): not measured when
    NVML failed or the GPU read no utilisation; in use when a process holds it or its
    utilisation is at or over the threshold; else idle. Pure."""
    held = {process.gpu_index for process in snapshot.processes}
    idle = busy = unmeasured = 0
    for gpu in snapshot.gpus:
        if snapshot.nvml_error is not None or gpu.util_gpu_pct is None:
            unmeasured += 1
        elif gpu.index in held or gpu.util_gpu_pct >= threshold_pct:
            busy += 1
        else:
            idle += 1
    return GpuStates(idle=idle, busy=busy, unmeasured=unmeasured)


def instance_gpus(instance: Instance) -> int:
    """The GPUs a poll that judged none stands for: those the agent found at registration, else
    those registered, else those of the last status read, at least one."""
    return max(1, instance.delivered_gpu_count or instance.gpu_count or _last_read_gpus(instance))


def _last_read_gpus(instance: Instance) -> int:
    """How many GPUs the instance's last status held (0 when none was read or it is not
    readable)."""
    if not instance.last_status_json:
        return 0
    try:
        gpus = json.loads(instance.last_status_json).get("gpus")
    except (ValueError, AttributeError):
        return 0
    return len(gpus) if isinstance(gpus, list) else 0


def record(session: Session, sample: UtilSample, tz: ZoneInfo) -> None:
    """Add ``sample`` and count it in the roll-up of its ledger bucket (``tz``: the configured
    zone, where months start), in the caller's transaction (one poll of an instance at a time:
    the poll's claim keeps two processes from racing here). A failed sample, or one that
    judged no GPU (:func:`judge_gpus`), counts every GPU of the instance
    (:func:`instance_gpus`) as not measured."""
    record_all(session, [sample], tz)


def record_all(
    session: Session,
    new_samples: list[UtilSample],
    tz: ZoneInfo,
    instances: dict[int, Instance] | None = None,
) -> None:
    """:func:`record` for each of ``new_samples``, with their instances (read in one query
    unless given, by id) and roll-ups (one query) read together, not two queries a sample."""
    if instances is None:
        ids = sorted({sample.instance_id for sample in new_samples})
        rows = session.exec(select(Instance).where(col(Instance.id).in_(ids))).all()
        instances = {inst.id: inst for inst in rows if inst.id is not None}
    starts = {
        sample.instance_id: ledger.bucket_start(instances[sample.instance_id], sample.at, tz)
        for sample in new_samples
        if sample.instance_id in instances
    }
    buckets = _buckets(session, starts)
    for sample in new_samples:
        instance = instances.get(sample.instance_id)
        if instance is not None:
            settle_gpus(sample, instance)
        session.add(sample)
        if instance is None:
            continue
        start = starts[sample.instance_id]
        key = (sample.instance_id, start)
        bucket = buckets.get(key) or UtilHour(instance_id=sample.instance_id, bucket_start=start)
        buckets[key] = bucket
        _count(bucket, sample)
        session.add(bucket)


def _buckets(session: Session, starts: dict[int, datetime]) -> dict[tuple[int, datetime], UtilHour]:
    """The existing roll-ups of ``starts`` (instance id → bucket start), by key; one query."""
    if not starts:
        return {}
    rows = session.exec(
        select(UtilHour).where(
            col(UtilHour.instance_id).in_(sorted(starts)),
            col(UtilHour.bucket_start).in_(sorted(set(starts.values()))),
        )
    ).all()
    wanted = set(starts.items())
    return {
        (row.instance_id, row.bucket_start): row
        for row in rows
        if (row.instance_id, row.bucket_start) in wanted
    }


def settle_gpus(sample: UtilSample, instance: Instance) -> None:
    """A failed ``sample``, or one that judged no GPU, counts every GPU of ``instance``
    (:func:`instance_gpus`, read from the row as it is now) as not measured."""
    judged = sample.gpus_idle + sample.gpus_busy + sample.gpus_unmeasured
    if not sample.ok or judged == 0:
        sample.gpus_idle = sample.gpus_busy = 0
        sample.gpus_unmeasured = instance_gpus(instance)


def _count(bucket: UtilHour, sample: UtilSample) -> None:
    bucket.polls += 1
    if not sample.ok or sample.util_avg_pct is None:
        bucket.bad_polls += 1
    elif bucket.max_util_pct is None or sample.util_avg_pct > bucket.max_util_pct:
        bucket.max_util_pct = sample.util_avg_pct
    bucket.idle_gpu_samples += sample.gpus_idle
    bucket.busy_gpu_samples += sample.gpus_busy
    bucket.unmeasured_gpu_samples += sample.gpus_unmeasured


def prune(rt: Runtime, now: datetime, *, box: Timebox | None = None) -> int:
    """Delete raw samples taken more than ``rt.settings.sample_retention_days`` days before
    ``now``, oldest first, returns how many were deleted. Each transaction deletes the
    ``PRUNE_BATCH`` oldest, as one range of times (with any others taken at the last one's
    time); at most ``PRUNE_BATCHES_PER_CALL`` a call, and with ``box`` none that would not fit
    in what is left of it (judged by the longest so far): the rest waits for the next call.
    Raises StoreError when the database fails."""
    cutoff = now - timedelta(days=rt.settings.sample_retention_days)
    deleted = 0
    longest_s = 0.0
    for _ in range(PRUNE_BATCHES_PER_CALL):
        if box is not None and (box.expired() or box.left_s() < longest_s):
            break
        began = timebox.monotonic()
        with rt.db.session() as session:
            last = session.exec(
                select(UtilSample.at)
                .where(col(UtilSample.at) < cutoff)
                .order_by(col(UtilSample.at))
                .offset(PRUNE_BATCH - 1)
                .limit(1)
            ).first()
            upto = col(UtilSample.at) < cutoff if last is None else col(UtilSample.at) <= last
            count = session.exec(delete(UtilSample).where(upto)).rowcount
        deleted += int(count or 0)
        longest_s = max(longest_s, timebox.monotonic() - began)
        if last is None:
            break
    return deleted
