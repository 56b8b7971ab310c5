"""Prometheus metrics: the one module that imports prometheus_client.

Two kinds of figures:

- the process's own counters, histograms and gauges (:class:`Metrics`, one per runtime:
  ``Runtime.metrics``, handed to its SSH transports, Slack notifier and clock): SSH errors by
  kind, Slack API errors and rate limits, command latency, and the clock's ticks (duration
  and overrun per step, lag, failures);
- gauges read from the store when scraped (:class:`StoreStats`, read by
  ``bot.store.stats.read_stats`` in a fixed handful of aggregate queries, whatever the fleet's
  size): instances by state and provider, GPUs and idle GPUs, the spend rate, the month's
  charges, open releases, the outbox and how late each kind of due work is.

:meth:`Metrics.exposition` renders both in Prometheus' text format for ``GET /metrics``. A store
that fails while scraped leaves its gauges out and sets ``gpubot_store_up`` to 0; the process's
figures are still served. Money is exposed in currency units (``micros / 1e6``), times in
seconds.
"""

from __future__ import annotations

import logging
import platform
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from bot import __version__
from bot.errors import GpubotError
from bot.values import MICROS

log = logging.getLogger(__name__)

#: The content type of :meth:`Metrics.exposition` (Prometheus text format 0.0.4).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
#: Release states reported even when no release is in them.
RELEASE_STATES = (
    "pending",
    "in_progress",
    "escalated",
    "awaiting_owner",
    "awaiting_owner_quiet",
    "failed",
)
#: Kinds of due work whose lateness is reported, even when nothing is due.
DUE_WORK = ("poll", "release", "prompt", "outbox")

#: Seconds; a slash command or button runs from about 10 ms to a few minutes (SSH, platforms).
COMMAND_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: Seconds; a tick step takes milliseconds with nothing due and its budget (6 s at most at the
#: default interval) when busy.
TICK_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass(frozen=True)
class StoreStats:
    """What the store holds now, for the gauges. Counts are rows; money is micros per
    currency; ages and lags are seconds (0 when nothing is late)."""

    #: Instances that are not released, by (state, provider).
    instances: Mapping[tuple[str, str], int] = field(default_factory=dict)
    #: GPUs of active instances, by provider.
    gpus: Mapping[str, int] = field(default_factory=dict)
    #: GPUs of active instances found idle by the last poll, by provider.
    gpus_idle: Mapping[str, int] = field(default_factory=dict)
    #: What the running instances' compute costs per hour, by currency.
    spend_micros_per_hour: Mapping[str, int] = field(default_factory=dict)
    #: Charges in the ledger that start in the current month, by currency.
    charges_this_month_micros: Mapping[str, int] = field(default_factory=dict)
    #: Releases that are not confirmed, by state.
    releases: Mapping[str, int] = field(default_factory=dict)
    #: Outbox messages not yet posted (``delivery IS NULL``).
    outbox_pending: int = 0
    #: Seconds since the oldest of those was queued.
    outbox_oldest_age_s: float = 0.0
    #: Seconds the oldest due item of each kind of work (``DUE_WORK``) has waited past its time.
    due_lag_s: Mapping[str, float] = field(default_factory=dict)


class Metrics:
    """The process's metrics in a registry of their own (``registry``). Thread-safe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        ProcessCollector(registry=reg)
        build_info = Gauge(
            "gpubot_build_info",
            "Always 1; its labels say which gpubot (version) runs on which Python (python).",
            ["version", "python"],
            registry=reg,
        )
        build_info.labels(version=__version__, python=platform.python_version()).set(1)
        self._ssh_errors = Counter(
            "gpubot_ssh_errors",
            "SSH failures talking to instances, by kind (unreachable, command_timeout, "
            "authentication_failed, host_key_changed, output_too_large, ...).",
            ["kind"],
            registry=reg,
        )
        self._slack_errors = Counter(
            "gpubot_slack_api_errors",
            "Slack Web API calls that failed, by method and Slack's error code: a documented "
            "one, 'unreachable' when no answer came, 'http_5xx' for a server error without "
            "Slack's JSON, else 'other'.",
            ["method", "error"],
            registry=reg,
        )
        self._slack_rate_limited = Counter(
            "gpubot_slack_rate_limited",
            "Slack Web API answers with HTTP 429 (each is waited out and tried again, a few "
            "times), by method.",
            ["method"],
            registry=reg,
        )
        self._command_s = Histogram(
            "gpubot_command_duration_seconds",
            "Time a /gpu command or a button's handler took to run, by command.",
            ["command"],
            buckets=COMMAND_BUCKETS_S,
            registry=reg,
        )
        self._ticks = Counter(
            "gpubot_ticks",
            "Ticks of the clock, by outcome (ok, failed).",
            ["outcome"],
            registry=reg,
        )
        self._ticks_skipped = Counter(
            "gpubot_ticks_skipped",
            "Ticks not started because the previous one was still running.",
            registry=reg,
        )
        self._tick_s = Histogram(
            "gpubot_tick_duration_seconds",
            "Time one whole tick took.",
            buckets=TICK_BUCKETS_S,
            registry=reg,
        )
        self._tick_lag_s = Gauge(
            "gpubot_tick_lag_seconds",
            "How late the last tick started: seconds past one tick interval after the start "
            "of the tick before it.",
            registry=reg,
        )
        self._tick_last = Gauge(
            "gpubot_tick_last_completed_timestamp_seconds",
            "Unix time at which the last tick ended.",
            registry=reg,
        )
        self._step_s = Histogram(
            "gpubot_tick_step_duration_seconds",
            "Time each step of a tick took.",
            ["step"],
            buckets=TICK_BUCKETS_S,
            registry=reg,
        )
        self._step_overrun_s = Gauge(
            "gpubot_tick_step_overrun_seconds",
            "Seconds each step ran past its time budget in the last tick (0 within it).",
            ["step"],
            registry=reg,
        )
        self._step_over_budget = Counter(
            "gpubot_tick_step_over_budget",
            "Ticks in which a step ran past its time budget.",
            ["step"],
            registry=reg,
        )
        self._step_failures = Counter(
            "gpubot_tick_step_failures", "Ticks in which a step failed.", ["step"], registry=reg
        )

    # --- counted where they happen -----------------------------------------------------------

    def ssh_error(self, kind: str) -> None:
        """Count an SSH failure of ``kind`` (see :func:`error_kind`)."""
        self._ssh_errors.labels(kind=kind).inc()

    def slack_error(self, method: str, error: str) -> None:
        """Count a failed Slack Web API call; ``error`` is one of a fixed set of labels
        (bot.slack_notifier.error_label), never Slack's raw answer."""
        self._slack_errors.labels(method=method, error=error).inc()

    def slack_rate_limited(self, method: str) -> None:
        """Count one HTTP 429 answer from Slack's Web API."""
        self._slack_rate_limited.labels(method=method).inc()

    def command_took(self, command: str, seconds: float) -> None:
        """Record how long a command's handler ran."""
        self._command_s.labels(command=command).observe(max(0.0, seconds))

    def tick_skipped(self) -> None:
        """Count a tick the scheduler did not start because the last one still ran."""
        self._ticks_skipped.inc()

    def tick_failed(self) -> None:
        """Count a tick that raised as a whole (its steps' figures are unknown)."""
        self._ticks.labels(outcome="failed").inc()

    def tick_done(
        self,
        *,
        took_s: float,
        lag_s: float,
        steps_s: Mapping[str, float],
        budgets_s: Mapping[str, float],
        failed: Iterable[str] = (),
        over_budget: Iterable[str] = (),
        ended_at_unix_s: float | None = None,
    ) -> None:
        """Record one tick that ran: its duration, how late it started, each step's duration
        and overrun past ``budgets_s`` (a step without a budget has no overrun), the steps that
        failed or ran over, and when it ended (Unix seconds; default now)."""
        self._ticks.labels(outcome="ok").inc()
        self._tick_s.observe(max(0.0, took_s))
        self._tick_lag_s.set(max(0.0, lag_s))
        self._tick_last.set(time.time() if ended_at_unix_s is None else ended_at_unix_s)
        for step, seconds in steps_s.items():
            self._step_s.labels(step=step).observe(max(0.0, seconds))
            budget = budgets_s.get(step)
            overrun = 0.0 if budget is None else max(0.0, seconds - budget)
            self._step_overrun_s.labels(step=step).set(overrun)
        for step in set(over_budget):
            self._step_over_budget.labels(step=step).inc()
        for step in set(failed):
            self._step_failures.labels(step=step).inc()

    # --- serving -----------------------------------------------------------------------------

    def exposition(self, stats: Callable[[], StoreStats] | None = None) -> tuple[bytes, str]:
        """The text for ``GET /metrics`` and its content type: the process's figures and, given
        ``stats``, the store's gauges read now."""
        sources: list[Collector] = [self.registry]
        if stats is not None:
            sources.append(StoreCollector(stats))
        return generate_latest(_Chain(sources)), CONTENT_TYPE

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's current value (None when it has none yet), e.g.
        ``value("gpubot_ssh_errors_total", kind="unreachable")``."""
        return self.registry.get_sample_value(name, labels)


class StoreCollector:
    """Gauges read from the store by ``read`` each time they are collected."""

    def __init__(self, read: Callable[[], StoreStats]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        """The store's gauges, or only ``gpubot_store_up 0`` when reading failed."""
        started = time.perf_counter()
        up = GaugeMetricFamily("gpubot_store_up", "1 when the last scrape could read the store.")
        took = GaugeMetricFamily(
            "gpubot_store_scrape_duration_seconds", "Time reading the store's gauges took."
        )
        try:
            stats = self._read()
        except GpubotError as exc:
            log.warning("metrics: could not read the store: %s", exc)
            up.add_metric([], 0)
            took.add_metric([], time.perf_counter() - started)
            yield up
            yield took
            return
        up.add_metric([], 1)
        took.add_metric([], time.perf_counter() - started)
        yield up
        yield took
        yield from store_metrics(stats)


def store_metrics(stats: StoreStats) -> Iterator[Metric]:
    """The gauges of one :class:`StoreStats`."""
    instances = GaugeMetricFamily(
        "gpubot_instances",
        "Registered instances that are not released, by state and provider.",
        labels=["state", "provider"],
    )
    for (state, provider), count in sorted(stats.instances.items()):
        instances.add_metric([state, provider], count)
    yield instances
    yield _by_label("gpubot_gpus", "GPUs of active instances, by provider.", "provider", stats.gpus)
    yield _by_label(
        "gpubot_gpus_idle",
        "GPUs of active instances the last poll found idle, by provider.",
        "provider",
        stats.gpus_idle,
    )
    yield _by_label(
        "gpubot_spend_rate_per_hour",
        "What the running instances' compute costs per hour, in units of the currency.",
        "currency",
        {currency: micros / MICROS for currency, micros in stats.spend_micros_per_hour.items()},
    )
    yield _by_label(
        "gpubot_charges_this_month",
        "Charges in the ledger for the current month (GPUBOT_TIMEZONE), in units of the currency.",
        "currency",
        {currency: micros / MICROS for currency, micros in stats.charges_this_month_micros.items()},
    )
    releases = {state: 0 for state in RELEASE_STATES}
    releases.update(stats.releases)
    yield _by_label("gpubot_releases", "Releases not yet confirmed, by state.", "state", releases)
    pending = GaugeMetricFamily("gpubot_outbox_pending", "Outbox messages not yet posted.")
    pending.add_metric([], stats.outbox_pending)
    yield pending
    age = GaugeMetricFamily(
        "gpubot_outbox_oldest_age_seconds",
        "Seconds since the oldest outbox message not yet posted was queued (0: none).",
    )
    age.add_metric([], stats.outbox_oldest_age_s)
    yield age
    lag = {work: 0.0 for work in DUE_WORK}
    lag.update(stats.due_lag_s)
    yield _by_label(
        "gpubot_due_lag_seconds",
        "Seconds the oldest due item of each kind of work (poll, release, prompt, outbox) has "
        "waited past its time (0: nothing late).",
        "work",
        lag,
    )


def error_kind(exc: BaseException) -> str:
    """An error's kind for a label: its class name in snake case (``CommandTimeout`` ->
    ``command_timeout``)."""
    return _CAMEL.sub("_", type(exc).__name__).lower()


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _by_label(
    name: str, documentation: str, label: str, values: Mapping[str, float]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class _Chain:
    """Several collectors read as one."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self._sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()
