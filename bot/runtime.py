"""The running bot's parts, handed to every handler and service entry point.

Built once by ``bot.app.build_runtime`` (Slack and the console share it); tests build their own
with a controlled clock, a temporary store and the Slack stand-in.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from bot.metrics import Metrics
from bot.settings import Settings

if TYPE_CHECKING:
    from bot.fleet.fleet import Fleet
    from bot.notify import FileAttachment, Message, Notice, Notifier, Render, RenderFiles
    from bot.platform_work import PlatformWork
    from bot.providers.registry import ProviderRegistry
    from bot.store.db import Database


@dataclass
class Runtime:
    """Settings, store, fleet, providers, outgoing messages, the clock (naive UTC) and the
    executor that runs slow work after a listener has acked. ``console`` is True only where
    the runtime serves the local console: only then does the instance ``local`` exist."""

    settings: Settings
    db: Database
    fleet: Fleet
    providers: ProviderRegistry
    notifier: Notifier
    clock: Callable[[], datetime]
    executor: Executor
    #: The presentation floor's renderer for what services say (``bot.blocks.render``).
    render: Render
    #: The presentation floor's renderer for the files a notice comes with.
    render_files: RenderFiles
    console: bool = False
    #: Pools for the platforms' API calls off the clock; None runs them in the caller.
    platform_work: PlatformWork | None = None
    #: The process's metrics (``/metrics``): its transports, notifier, clock and commands count
    #: into these.
    metrics: Metrics = field(default_factory=Metrics)

    def message(self, notice: Notice) -> Message:
        """``notice`` in words and Block Kit, as the presentation floor renders it."""
        return self.render(notice)

    def files(self, notice: Notice) -> tuple[FileAttachment, ...]:
        """The files ``notice`` comes with (a chart), as the presentation floor draws them."""
        return self.render_files(notice)

    def now(self) -> datetime:
        """The current time, naive UTC, from the injected clock."""
        return self.clock()
