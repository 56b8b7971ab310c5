"""The fleet: pooled transports to every instance, agent clients, and concurrent fan-out.

One SSH connection per instance is kept alive and shared by every call for it; ``forget``
drops it (after a release or re-registration). ``fan_out`` asks many instances at once on a
bounded pool of threads: each answer, or the FleetError that stopped it, comes back by name,
and a dead host costs the others nothing beyond the timeout. The clock's polling (inside
:func:`polling`) fans out on a pool of its own, so users' commands and polls never wait for
each other's threads.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TypeVar

from bot.errors import AgentBroken, CommandTimeout, FleetError, LocalRefused
from bot.fleet.agent_client import RemoteAgent
from bot.fleet.base import HostKey, Target, Transport
from bot.fleet.local import LocalTransport
from bot.fleet.ssh import SshTransport, scan_host_key
from bot.i18n import t
from bot.metrics import Metrics
from bot.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Threads asking instances at once in ``fan_out``.
FAN_OUT_WORKERS = 32
#: Extra seconds ``fan_out`` waits past the per-target timeout for an answer under way.
_GRACE_S = 1.0

_PoolKey = tuple[str, int, str, str | None, str | None]

_POLLING: ContextVar[bool] = ContextVar("gpubot_fleet_polling", default=False)


@contextmanager
def polling() -> Iterator[None]:
    """Within this block (in this thread), ``Fleet.fan_out`` runs on the polling pool."""
    token = _POLLING.set(True)
    try:
        yield
    finally:
        _POLLING.reset(token)


class Fleet:
    """Every instance's transport and agent. Thread-safe; ``close()`` when the bot stops.

    ``max_workers`` threads fan out for users' commands, ``poll_workers`` for the polling.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        zipapp_path: Path | None = None,
        local_transport: LocalTransport | None = None,
        max_workers: int = FAN_OUT_WORKERS,
        poll_workers: int = FAN_OUT_WORKERS,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        #: Where the transports count SSH failures.
        self.metrics = metrics if metrics is not None else Metrics()
        self.zipapp_path = Path(zipapp_path) if zipapp_path is not None else settings.agent_zipapp
        #: The bot's own machine, only where the runtime serves a local console.
        self._local = local_transport
        self._lock = threading.Lock()
        self._pool: dict[str, tuple[_PoolKey, SshTransport]] = {}
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="fleet-commands"
        )
        self._poll_executor = ThreadPoolExecutor(
            max_workers=poll_workers, thread_name_prefix="fleet-poll"
        )
        self._closed = False

    def scan_host_key(
        self, host: str, port: int = 22, *, timeout_s: float | None = None
    ) -> HostKey:
        """The host key ``host:port`` presents, for pinning at registration.

        Nothing is authenticated or trusted. Raises Unreachable.
        """
        return scan_host_key(host, port, timeout_s=timeout_s or self.settings.ssh_connect_timeout_s)

    def transport(self, target: Target) -> Transport:
        """The pooled transport for ``target`` (a new connection when its address or pinned key
        changed since the last call)."""
        if target.is_local:
            if self._local is None:
                raise LocalRefused(
                    t("local is the machine the bot runs on; it is reached only from the console"),
                    instance=target.name,
                    hint=t("Register a remote instance over SSH instead."),
                )
            return self._local
        key = _pool_key(target)
        stale: SshTransport | None = None
        with self._lock:
            if self._closed:
                raise FleetError(t("the fleet is shut down"), instance=target.name)
            entry = self._pool.get(target.name)
            if entry is not None and entry[0] == key:
                return entry[1]
            if entry is not None:
                stale = entry[1]
            transport = SshTransport(target, settings=self.settings, metrics=self.metrics)
            self._pool[target.name] = (key, transport)
        if stale is not None:
            stale.close()
        return transport

    def agent(self, target: Target, *, timeout_s: float | None = None) -> RemoteAgent:
        """The agent client for ``target``, over its pooled transport; each command may take
        ``timeout_s`` seconds (default GPUBOT's SSH command timeout)."""
        python = target.python_path
        if target.is_local and python is None:
            python = sys.executable
        return RemoteAgent(
            self.transport(target),
            target=target,
            zipapp_path=self.zipapp_path,
            timeout_s=timeout_s or self.settings.ssh_command_timeout_s,
            python=python,
        )

    def fan_out(
        self,
        targets: Sequence[Target],
        fn: Callable[[RemoteAgent], T],
        *,
        timeout_s: float | None = None,
    ) -> dict[str, T | FleetError]:
        """Call ``fn(agent)`` for every target at once; by target name, its result or the
        FleetError that stopped it. A target still busy after ``timeout_s`` seconds (default
        the SSH command timeout) gets CommandTimeout; other errors of ``fn`` become AgentBroken.
        Runs on the polling pool inside :func:`polling`, else on the commands' pool.
        """
        timeout = timeout_s or self.settings.ssh_command_timeout_s
        started = time.monotonic()
        futures: dict[str, Future[T]] = {}
        results: dict[str, T | FleetError] = {}
        pool = self._poll_executor if _POLLING.get() else self._executor
        for target in targets:
            try:
                agent = self.agent(target, timeout_s=timeout)
            except FleetError as exc:
                results[target.name] = exc
                continue
            # The caller's context (its language among it) goes with the call.
            futures[target.name] = pool.submit(contextvars.copy_context().run, _call, fn, agent)
        wait_futures(futures.values(), timeout=timeout + _GRACE_S)
        for name, future in futures.items():
            outcome: T | FleetError = _outcome(name, future, timeout)
            results[name] = outcome
        log.debug("fan_out over %d targets took %.3f s", len(targets), time.monotonic() - started)
        return {target.name: results[target.name] for target in targets}

    def forget(self, name: str) -> None:
        """Drop the pooled connection of instance ``name`` (the next call dials again)."""
        with self._lock:
            entry = self._pool.pop(name, None)
        if entry is not None:
            entry[1].close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the bot is shutting down): what failed since, failed
        because the bot hung up, not because the machine did."""
        return self._closed

    def close(self) -> None:
        """Close every connection and stop the fan-out threads."""
        with self._lock:
            self._closed = True
            entries = list(self._pool.values())
            self._pool.clear()
        for _, transport in entries:
            transport.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._poll_executor.shutdown(wait=False, cancel_futures=True)


def _pool_key(target: Target) -> _PoolKey:
    pinned = target.host_key.key_b64 if target.host_key else None
    return (target.host, target.port, target.user, target.key_path, pinned)


def _call(fn: Callable[[RemoteAgent], T], agent: RemoteAgent) -> T:
    return fn(agent)


def _outcome(name: str, future: Future[R], timeout_s: float) -> R | FleetError:
    if not future.done():
        future.cancel()
        return CommandTimeout(
            f"{name}: no answer within {timeout_s:g} s",
            instance=name,
            hint="Try again; if it keeps happening check the instance.",
        )
    exc = future.exception()
    if exc is None:
        return future.result()
    if isinstance(exc, FleetError):
        return exc
    log.error("fan_out: unexpected error for %s", name, exc_info=exc)
    return AgentBroken(t("{name}: unexpected error: {exc}", name=name, exc=exc), instance=name)
