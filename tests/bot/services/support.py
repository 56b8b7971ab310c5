"""Helpers for service tests: a controlled clock, a recording notifier, runtimes and rows."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import event
from sqlmodel import select

from bot.blocks import render, render_files
from bot.errors import ProviderNotFound, SlackError
from bot.notify import MessageRef
from bot.providers.base import (
    InstanceTypeInfo,
    LaunchRequest,
    Provider,
    ProviderCapabilities,
    ProviderInstance,
    ReleaseOutcome,
    no_launch,
)
from bot.providers.manual import ManualProvider
from bot.providers.registry import ProviderRegistry, platform_billing
from bot.runtime import Runtime
from bot.services.instances.registration import RegisterRequest
from bot.settings import Settings
from bot.store.db import Database
from bot.store.models import Instance, KeyGrant, Person

T0 = datetime(2026, 12, 2, 12, 0, 0)
#: GPUBOT_INSTANCE_NETWORKS for tests whose machines listen on loopback.
LOOPBACK_NETWORKS = ("public", "127.0.0.0/8", "::1/128")


class Clock:
    """A clock the test moves by hand (naive UTC)."""

    def __init__(self, start: datetime = T0) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> datetime:
        self.now += timedelta(**kwargs)
        return self.now

    def set(self, at: datetime) -> datetime:
        self.now = at
        return at


@dataclass
class Posted:
    channel: str
    text: str
    blocks: tuple[dict[str, Any], ...]
    ts: str
    thread_ts: str | None = None
    updates: list[tuple[str, tuple[dict[str, Any], ...]]] = field(default_factory=list)
    key: str | None = None

    def action_ids(self) -> list[str]:
        blocks = self.updates[-1][1] if self.updates else self.blocks
        return [
            element["action_id"]
            for block in blocks
            if block.get("type") == "actions"
            for element in block["elements"]
        ]

    def button_value(self, action_id: str) -> str:
        for block in self.blocks:
            for element in block.get("elements", []) if block.get("type") == "actions" else []:
                if element["action_id"] == action_id:
                    return str(element["value"])
        raise AssertionError(f"no button {action_id} in {self.text!r}")

    @property
    def current_text(self) -> str:
        return self.updates[-1][0] if self.updates else self.text


class RecordingNotifier:
    """Stands in for Slack's Web API: records posts and updates; can be told to fail."""

    def __init__(self) -> None:
        self.posts: list[Posted] = []
        self.fail_posts = False
        self._ts = itertools.count(1)
        self._lock = threading.Lock()

    def post(
        self,
        channel: str,
        text: str,
        blocks: Sequence[dict[str, Any]] = (),
        *,
        thread_ts: str | None = None,
        key: str | None = None,
    ) -> MessageRef:
        if self.fail_posts:
            raise SlackError("Slack is unreachable", error="unreachable")
        with self._lock:
            ts = f"{next(self._ts)}.000100"
            self.posts.append(Posted(channel, text, tuple(blocks), ts, thread_ts, key=key))
        return MessageRef(channel=channel, ts=ts)

    def find(self, channel: str, key: str, *, since: datetime) -> MessageRef | None:
        for posted in self.posts:
            if posted.channel == channel and posted.key == key:
                return MessageRef(channel=channel, ts=posted.ts)
        return None

    def update(self, ref: MessageRef, text: str, blocks: Sequence[dict[str, Any]] = ()) -> None:
        for posted in self.posts:
            if posted.ts == ref.ts and posted.channel == ref.channel:
                posted.updates.append((text, tuple(blocks)))
                return
        raise SlackError("message_not_found", error="message_not_found")

    def upload_file(
        self,
        channel: str,
        filename: str,
        content: bytes,
        *,
        title: str,
        comment: str = "",
        thread_ts: str | None = None,
    ) -> None:
        raise AssertionError("no uploads expected")

    def to(self, channel: str) -> list[Posted]:
        return [p for p in self.posts if p.channel == channel]

    def containing(self, fragment: str) -> list[Posted]:
        return [p for p in self.posts if fragment in p.text]


class ScriptedPlatform:
    """A platform whose answers a test scripts (the cloud is a boundary): ``answers`` holds the
    outcome of each release call; ``state`` is what ``get`` reports."""

    name = "scripted"
    capabilities = ProviderCapabilities(
        can_stop=True,
        storage_bills_when_stopped=True,
        # A platform the bot does not know bills as typed, as billing reads it.
        billing=platform_billing("scripted"),
        can_launch=False,
    )

    def __init__(self) -> None:
        self.state = "running"
        self.answers: deque[object] = deque()
        self.release_calls: list[tuple[str, str]] = []
        self.gate: threading.Event | None = None

    def list_instances(self) -> list[ProviderInstance]:
        return [self.get("i-1")]

    def get(self, provider_id: str) -> ProviderInstance:
        if self.state == "missing":
            raise ProviderNotFound(f"{provider_id} not found")
        return ProviderInstance(provider_id=provider_id, state=self.state, raw_state=self.state)

    def release(self, provider_id: str, mode: str) -> ReleaseOutcome:
        self.release_calls.append((provider_id, mode))
        if self.gate is not None:
            self.gate.wait(5)
        answer = self.answers.popleft() if self.answers else "terminated"
        if isinstance(answer, Exception):
            raise answer
        self.state = str(answer)
        done = answer == "terminated" or (mode == "stop" and answer == "stopped")
        return ReleaseOutcome(provider_id, mode, confirmed=done, state=str(answer))

    def price(self, instance_type: str) -> int | None:
        return None

    def instance_types(self) -> list[InstanceTypeInfo]:
        return []

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        raise no_launch(self.name)


def make_runtime(
    db: Database,
    clock: Clock,
    *,
    providers: Sequence[Provider] = (),
    notifier: RecordingNotifier | None = None,
    fleet: Any = None,
    console: bool = False,
    **settings: Any,
) -> Runtime:
    """A runtime over ``db`` with the manual provider plus ``providers``; ``console`` makes it
    the local console's, the only one that reaches the instance ``local``."""
    registry = ProviderRegistry([ManualProvider(), *providers])
    # The test machines (sshd, the platform stand-ins) listen on loopback: listed, as
    # GPUBOT_INSTANCE_NETWORKS=public,127.0.0.0/8,::1/128 would.
    base: dict[str, Any] = {
        "admins": frozenset({"UADMIN"}),
        "channel": "COPS",
        "instance_networks": LOOPBACK_NETWORKS,
    }
    base.update(settings)
    return Runtime(
        settings=Settings(**base),
        db=db,
        fleet=fleet,
        providers=registry,
        notifier=notifier or RecordingNotifier(),
        clock=clock,
        executor=ThreadPoolExecutor(max_workers=2),
        render=render,
        render_files=render_files,
        console=console,
    )


#: Ports for instances a test adds: each is another machine unless the test says otherwise.
_PORTS = itertools.count(20_000)


def add_instance(db: Database, **fields: Any) -> int:
    """Insert an active instance (owner UOWNER unless given, a machine of its own) and return
    its id."""
    values: dict[str, Any] = {
        "name": "box",
        "owner_id": "UOWNER",
        "state": "active",
        "host": "127.0.0.1",
        "port": next(_PORTS),
        "ssh_user": "root",
        "price_micros": 2_100_000,
        "gpu_model": "A100",
        "gpu_count": 1,
        "created_at": T0,
    }
    values.update(fields)
    with db.session() as session:
        if session.get(Person, values["owner_id"]) is None:
            session.add(Person(slack_id=values["owner_id"]))
            session.flush()
        inst = Instance(**values)
        session.add(inst)
        session.flush()
        assert inst.id is not None
        return inst.id


def get_instance(db: Database, instance_id: int) -> Instance:
    with db.session() as session:
        inst = session.get(Instance, instance_id)
        assert inst is not None
        return inst


def local_request(**changes: object) -> RegisterRequest:
    """A registration of the bot's own machine (``local``, 2x A100 at $4.20/h for 3 h), with
    ``changes`` applied."""
    values: dict[str, object] = {
        "name": "local",
        "address": "local",
        "gpu_model": "a100",
        "gpu_count": 2,
        "price_micros_per_hour": 4_200_000,
        "release_in": timedelta(hours=3),
    }
    values.update(changes)
    return RegisterRequest(**values)  # type: ignore[arg-type]


def rows(db: Database, model: type[Any]) -> list[Any]:
    """Every row of ``model``, in the order of its primary key (PostgreSQL returns rows without
    an ORDER BY in any order: an updated row moves)."""
    with db.session() as session:
        return list(session.exec(select(model).order_by(*model.__table__.primary_key)).all())


class NoFleet:
    """A fleet that holds no connections (releasing only forgets the instance's)."""

    def forget(self, name: str) -> None:
        return None


def grant_key(db: Database, key_name: str, *people: str) -> None:
    """Let ``people`` (Slack IDs) register with the key ``key_name``, as `/gpu keys allow`
    by an admin would (bot.services.instances.key_grants)."""
    with db.session() as session:
        for person_id in people:
            if session.get(Person, person_id) is None:
                session.add(Person(slack_id=person_id))
                session.flush()
            session.add(KeyGrant(key_name=key_name, person_id=person_id, granted_by="UADMIN"))


@contextmanager
def counting_statements(db: Database) -> Iterator[list[str]]:
    """The SQL statements ``db`` runs inside the block, in order."""
    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


def selects(statements: list[str]) -> list[str]:
    """The SELECTs among ``statements``."""
    return [s for s in statements if s.lstrip().upper().startswith("SELECT")]
