"""The trust model (bot.services.access) as a property, checked from the database itself.

Random sequences of register, re-register, rename, allow, deny, ask_release, release, confirm
and extend, by three members and one admin, over a pool of three machines. After every step:

1. no machine has two live registrations (state != 'released'): by address, by host key, by
   ``(provider, provider id)``, nor by the machine behind them;
2. every change (a row's owner, name, deadline, price, address, state; InstanceAccess rows;
   releases; audit rows) was made by the owner of that registration at the time or an admin;
   a call by anyone else raised NotAuthorized or Conflict and changed nothing at all (a
   snapshot of the tables before and after); people the owner allowed get no more than that
   (they may run jobs, which this test does not do);
3. registering a held machine, by anyone but its owner or an admin, is refused with a Conflict
   that names the holder (``<@OWNER>``).

A model of who holds what (written from the module docstrings, not from the code) predicts
each outcome; the database must agree with it after every step.

And a plain race: two people registering one machine under two names at the same moment store
exactly one registration, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlmodel import select

from agents.protocol import HealthCheck as AgentCheck
from agents.protocol import HealthReport, StatusSnapshot
from bot.errors import Conflict, GpubotError, NotAuthorized, NotFound, Unreachable, UsageError
from bot.fleet.base import HostKey, Target
from bot.services.access import Caller
from bot.services.instances import lifecycle, registration
from bot.services.instances.views import RegisterResult
from bot.services.jobs import access as job_access
from bot.store.db import Database
from bot.store.models import AuditLog, Instance, InstanceAccess, Person, Prompt, Release
from tests.agents.factories import make_status
from tests.bot.services.support import Clock, make_runtime

ADMIN = "UADMIN"
MEMBERS = ("U0ALICE", "U0BOB", "U0CAROL")
PEOPLE = (*MEMBERS, ADMIN)
NAMES = ("alpha", "beta", "gamma", "delta")
PRICES = (0, 1_500_000, 2_100_000)
RELEASE_IN = (None, timedelta(hours=1), timedelta(hours=2))
#: What a registration without a deadline gets (Settings.default_release_in_s).
DEFAULT_RELEASE_IN = timedelta(hours=8)
AGENT_VERSION = "0.1.0"
#: The actor of the audit rows the bot writes for its own decisions.
BOT = "gpubot"
#: GPUBOT_INSTANCE_NETWORKS: the machines' private addresses are listed.
NETWORKS = ("10.0.0.0/8",)


# --- the machines -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """One rented machine: its host key, its id at the platform and the addresses that reach
    it (SSH as root or ubuntu on its private address, and as root through a NAT port)."""

    index: int
    host_key: HostKey
    provider_id: str
    addresses: tuple[str, ...]

    @property
    def endpoints(self) -> tuple[tuple[str, int], ...]:
        return tuple(_endpoint(address) for address in self.addresses)


def _machine(index: int) -> Machine:
    n = index + 1
    digest = hashlib.sha256(f"machine-{n}".encode()).digest()
    return Machine(
        index=index,
        host_key=HostKey(
            key_type="ssh-ed25519",
            key_b64=base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519" + digest).decode(),
            fingerprint="SHA256:" + base64.b64encode(digest).decode().rstrip("="),
        ),
        provider_id=f"vm-{n}",
        addresses=(f"root@10.0.0.{n}:22", f"ubuntu@10.0.0.{n}:22", f"root@10.9.0.{n}:2222"),
    )


MACHINES = tuple(_machine(i) for i in range(3))


def _endpoint(address: str) -> tuple[str, int]:
    parsed = registration.parse_address(address)
    return parsed.host, parsed.port


def _machine_at(host: str, port: int) -> Machine | None:
    for machine in MACHINES:
        if (host, port) in machine.endpoints:
            return machine
    return None


class StandInAgent:
    """The agent on one of the stand-in machines: installed, no GPUs, healthy."""

    def __init__(self, fleet: StandInFleet, machine: Machine) -> None:
        self.fleet = fleet
        self.machine = machine

    def ensure_agent(self) -> str:
        return AGENT_VERSION

    def status(self) -> StatusSnapshot:
        return make_status(gpus=())

    def health(self, **_options: Any) -> HealthReport:
        if self.fleet.barrier is not None:
            self.fleet.barrier.wait()
        return HealthReport(status="pass", checks=(AgentCheck("ssh", "pass", "reachable"),))


class StandInFleet:
    """Stands for the machines: the fleet (SSH, the agent) is the boundary of these tests.

    ``scan_host_key`` answers each machine's host key at each of its addresses (Unreachable
    elsewhere); ``agent`` reaches a machine only with its pinned key, and its agent is
    installed, sees no GPUs and is healthy. ``barrier``, when given, holds every ``health``
    call until that many callers are in it (a registration has passed its pre-checks there and
    not stored anything yet)."""

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        self.barrier = barrier

    def scan_host_key(self, host: str, port: int) -> HostKey:
        machine = _machine_at(host, port)
        if machine is None:
            raise Unreachable(f"{host}:{port} does not answer")
        return machine.host_key

    def forget(self, name: str) -> None:
        return None

    def agent(self, target: Target) -> StandInAgent:
        machine = _machine_at(target.host, target.port)
        assert machine is not None, target
        assert target.host_key == machine.host_key, "the fleet is asked with the key it pins"
        return StandInAgent(self, machine)


# --- reading the database ---------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Every row a call could change, as plain values."""

    instances: dict[int, dict[str, Any]]
    access: dict[tuple[int, str], str]
    releases: dict[int, dict[str, Any]]
    prompts: dict[int, dict[str, Any]]
    audit: dict[int, dict[str, Any]]
    people: frozenset[str]


def snapshot(db: Database) -> Snapshot:
    with db.session() as session:
        return Snapshot(
            instances={i.id or 0: i.model_dump() for i in session.exec(select(Instance))},
            access={
                (a.instance_id, a.person_id): a.granted_by
                for a in session.exec(select(InstanceAccess))
            },
            releases={r.id or 0: r.model_dump() for r in session.exec(select(Release))},
            prompts={p.id or 0: p.model_dump() for p in session.exec(select(Prompt))},
            audit={a.id or 0: a.model_dump() for a in session.exec(select(AuditLog))},
            people=frozenset(p.slack_id for p in session.exec(select(Person))),
        )


def live_rows(db: Database) -> list[Instance]:
    with db.session() as session:
        return list(session.exec(select(Instance).where(Instance.state != "released")).all())


def _may_change(caller: str, owner: str) -> bool:
    return caller in (owner, ADMIN)


def check_changes_are_the_callers(caller: str, before: Snapshot, after: Snapshot) -> None:
    """Invariant 2 for a call that went through: whatever changed belongs to a registration the
    caller owned (or the caller is an admin); no owner changes; new registrations are the
    caller's."""

    def owner_of(instance_id: int) -> str:
        row = before.instances.get(instance_id) or after.instances[instance_id]
        return str(row["owner_id"])

    for instance_id, row in after.instances.items():
        old = before.instances.get(instance_id)
        if old is None:
            assert row["owner_id"] == caller, f"{caller} stored a registration for {row}"
        elif old != row:
            assert _may_change(caller, str(old["owner_id"])), (
                f"{caller} changed {old['name']} of {old['owner_id']}: {_diff(old, row)}"
            )
            assert row["owner_id"] == old["owner_id"], "a registration changed hands"
    assert before.instances.keys() <= after.instances.keys(), "a registration vanished"
    for instance_id, person in before.access.keys() ^ after.access.keys():
        assert _may_change(caller, owner_of(instance_id)), (
            f"{caller} changed who may run jobs on {instance_id} ({person})"
        )
    for key in after.access.keys() - before.access.keys():
        assert after.access[key] == caller, "access granted in someone else's name"
    for release_id, release in after.releases.items():
        if before.releases.get(release_id) != release:
            assert _may_change(caller, owner_of(release["instance_id"])), (
                f"{caller} changed release {release} of {owner_of(release['instance_id'])}"
            )
    for audit_id in after.audit.keys() - before.audit.keys():
        entry = after.audit[audit_id]
        # the caller's, or the bot's own decision taken during the call (a release escalated)
        assert entry["actor"] in (caller, BOT), f"audit row {entry} of a call by {caller}"
        if entry["instance_id"] is not None:
            assert _may_change(caller, owner_of(entry["instance_id"])), entry


def _diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (old[k], new[k]) for k in old if old[k] != new.get(k)}


# --- the model --------------------------------------------------------------------------------


@dataclass
class Reg:
    """What the model knows of one registration."""

    id: int
    name: str
    owner: str
    machine: int
    address: str
    provider_id: str | None
    price: int
    deadline: datetime
    state: str = "active"
    allowed: set[str] = field(default_factory=set)

    @property
    def live(self) -> bool:
        return self.state != "released"


@dataclass(frozen=True)
class Expect:
    """A predicted outcome: ``error`` None for success; ``names`` a Slack ID the error must
    mention; ``apply`` changes the model after a success (given the snapshot after it)."""

    error: type[GpubotError] | None = None
    names: str | None = None
    apply: Callable[[Snapshot], None] | None = None
    why: str = ""


OK_NO_CHANGE = Expect()


class TrustModel(RuleBasedStateMachine):
    """The trust model over a fresh database per example (a copy of a migrated template)."""

    def __init__(self, template: Path, workdir: Path) -> None:
        super().__init__()
        self.db = _copy_database(template, workdir)
        self.clock = Clock()
        self.rt = make_runtime(
            self.db, self.clock, fleet=StandInFleet(), instance_networks=NETWORKS
        )
        self.regs: dict[int, Reg] = {}

    def teardown(self) -> None:
        self.rt.executor.shutdown(wait=True)
        self.db.dispose()
        shutil.rmtree(Path(str(self.db.url.database)).parent)

    # --- the model's view ---------------------------------------------------------------------

    def live(self) -> list[Reg]:
        return [r for r in self.regs.values() if r.live]

    def holder_of(self, machine: int) -> Reg | None:
        held = [r for r in self.live() if r.machine == machine]
        assert len(held) <= 1
        return held[0] if held else None

    def live_named(self, name: str) -> Reg | None:
        return next((r for r in self.live() if r.name == name), None)

    # --- running a call -----------------------------------------------------------------------

    def call(self, caller: str, what: str, expect: Expect, fn: Callable[[Caller], object]) -> None:
        before = snapshot(self.db)
        error: GpubotError | None = None
        try:
            fn(Caller(user_id=caller, channel_id="CTEAM"))
        except GpubotError as exc:
            error = exc
        after = snapshot(self.db)
        if error is not None:
            assert after == before, f"{what} by {caller} failed ({error!r}) but changed the store"
            assert expect.error is not None, (
                f"{what} by {caller} should succeed ({expect.why}) but raised {error!r}"
            )
            assert isinstance(error, expect.error), (
                f"{what} by {caller}: expected {expect.error.__name__} ({expect.why}), "
                f"got {error!r}"
            )
            if expect.names is not None:
                assert f"<@{expect.names}>" in error.message, (
                    f"{what} by {caller}: the refusal should name <@{expect.names}>: "
                    f"{error.message!r}"
                )
            return
        assert expect.error is None, (
            f"{what} by {caller} should raise {expect.error.__name__} ({expect.why}) but went "
            "through"
        )
        check_changes_are_the_callers(caller, before, after)
        if expect.apply is not None:
            expect.apply(after)

    # --- register, re-register, rename --------------------------------------------------------

    def register(
        self,
        caller: str,
        machine: Machine,
        address: str,
        name: str,
        with_provider_id: bool,
        price: int,
        release_in: timedelta | None,
    ) -> None:
        provider_id = machine.provider_id if with_provider_id else None
        now = self.clock.now
        holder = self.holder_of(machine.index)
        named = self.live_named(name)
        expect: Expect
        if holder is not None and not _may_change(caller, holder.owner):
            expect = Expect(Conflict, names=holder.owner, why="the machine is someone else's")
        elif named is not None and named is not holder:
            expect = Expect(Conflict, why=f"the name {name} is another machine's")
        elif holder is not None and holder.state != "active":
            expect = Expect(Conflict, why=f"{holder.name} is being released")
        elif holder is not None and provider_id not in (None, holder.provider_id):
            # An id given without --provider changes nothing: both, and an admin, change it.
            expect = Expect(UsageError, why="--provider-id without --provider on a held machine")
        elif holder is not None:
            kept = holder

            def change_it(_after: Snapshot) -> None:
                kept.name, kept.address = name, address  # the platform id is kept
                kept.price = price
                if release_in is not None:
                    kept.deadline = now + release_in

            expect = Expect(
                apply=change_it, why="a re-registration or rename by its owner or admin"
            )
        else:

            def add_it(after: Snapshot) -> None:
                [new_id] = [i for i in after.instances if i not in self.regs]
                self.regs[new_id] = Reg(
                    id=new_id,
                    name=name,
                    owner=caller,
                    machine=machine.index,
                    address=address,
                    provider_id=provider_id,
                    price=price,
                    deadline=now + (release_in or DEFAULT_RELEASE_IN),
                )

            expect = Expect(apply=add_it, why="nobody holds the machine or the name")
        request = registration.RegisterRequest(
            name=name,
            address=address,
            price_micros_per_hour=price,
            release_in=release_in,
            provider_id=provider_id,
        )
        shown = f"register {name} at {address} pid={provider_id} in={release_in}"
        self.call(caller, shown, expect, lambda c: registration.register(self.rt, c, request))

    # --- whom the rules pick ------------------------------------------------------------------

    def pick_live(self, pick: int) -> Reg | None:
        """Mostly a live registration; now and then none (``pick`` past the live ones)."""
        live = self.live()
        return live[pick % len(live)] if live and pick < 12 else None

    def pick_name(self, pick: int) -> str:
        """Mostly the name of a live registration; now and then any name."""
        reg = self.pick_live(pick)
        return reg.name if reg is not None else NAMES[pick % len(NAMES)]

    @staticmethod
    def pick_caller(reg: Reg | None, who: int) -> str:
        """The owner, someone the owner allowed, an admin, or any member."""
        if reg is None or who >= 3:
            return PEOPLE[who % len(PEOPLE)]
        if who == 1 and reg.allowed:
            return sorted(reg.allowed)[0]
        return reg.owner if who == 0 else ADMIN

    # --- the rules --------------------------------------------------------------------------

    @initialize(
        callers=st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=3),
        with_provider_id=st.booleans(),
    )
    def some_machines_are_held(self, callers: list[str], with_provider_id: bool) -> None:
        """Each of the first machines registered by a member, at its first address."""
        for machine, caller, name in zip(MACHINES, callers, NAMES, strict=False):
            self.register(
                caller, machine, machine.addresses[0], name, with_provider_id, PRICES[1], None
            )

    @rule(
        caller=st.sampled_from(PEOPLE),
        machine=st.sampled_from(MACHINES),
        at=st.integers(0, 2),
        name=st.sampled_from(NAMES),
        with_provider_id=st.booleans(),
        price=st.sampled_from(PRICES),
        release_in=st.sampled_from(RELEASE_IN),
    )
    def register_any(
        self,
        caller: str,
        machine: Machine,
        at: int,
        name: str,
        with_provider_id: bool,
        price: int,
        release_in: timedelta | None,
    ) -> None:
        """Anyone registers any machine, at any of its addresses, under any name."""
        self.register(
            caller, machine, machine.addresses[at], name, with_provider_id, price, release_in
        )

    @rule(
        who=st.integers(0, 6),
        pick=st.integers(0, 11),
        same_address=st.booleans(),
        at=st.integers(0, 2),
        with_provider_id=st.booleans(),
        price=st.sampled_from(PRICES),
        release_in=st.sampled_from(RELEASE_IN),
    )
    def re_register(
        self,
        who: int,
        pick: int,
        same_address: bool,
        at: int,
        with_provider_id: bool,
        price: int,
        release_in: timedelta | None,
    ) -> None:
        """A held machine registered again under its name (by its owner: a re-registration)."""
        reg = self.pick_live(pick)
        if reg is None:
            return
        machine = MACHINES[reg.machine]
        address = reg.address if same_address else machine.addresses[at]
        caller = self.pick_caller(reg, who)
        self.register(caller, machine, address, reg.name, with_provider_id, price, release_in)

    @rule(
        who=st.integers(0, 6),
        pick=st.integers(0, 11),
        name=st.sampled_from(NAMES),
        same_address=st.booleans(),
        at=st.integers(0, 2),
        release_in=st.sampled_from(RELEASE_IN),
    )
    def rename(
        self,
        who: int,
        pick: int,
        name: str,
        same_address: bool,
        at: int,
        release_in: timedelta | None,
    ) -> None:
        """A held machine registered under another name (by its owner: a rename)."""
        reg = self.pick_live(pick)
        if reg is None:
            return
        machine = MACHINES[reg.machine]
        address = reg.address if same_address else machine.addresses[at]
        caller = self.pick_caller(reg, who)
        with_provider_id = reg.provider_id is not None
        self.register(caller, machine, address, name, with_provider_id, reg.price, release_in)

    @rule(
        caller=st.sampled_from(PEOPLE),
        pick=st.integers(0, 11),
        at=st.integers(0, 2),
        same_name=st.booleans(),
        with_provider_id=st.booleans(),
    )
    def register_a_released_machine(
        self, caller: str, pick: int, at: int, same_name: bool, with_provider_id: bool
    ) -> None:
        """A machine whose registration was released, registered again by anyone."""
        released = [r for r in self.regs.values() if not r.live]
        if not released:
            return
        reg = released[pick % len(released)]
        machine = MACHINES[reg.machine]
        name = reg.name if same_name else NAMES[pick % len(NAMES)]
        address = machine.addresses[at]
        self.register(caller, machine, address, name, with_provider_id, PRICES[2], None)

    def _access_expect(self, caller: str, name: str, person: str) -> tuple[Reg | None, Expect]:
        reg = self.live_named(name)
        if reg is None:
            return None, Expect(NotFound, why=f"no live {name}")
        if not _may_change(caller, reg.owner):
            return reg, Expect(NotAuthorized, names=reg.owner, why="not the owner nor an admin")
        if person == reg.owner:
            return reg, Expect(UsageError, why="the owner always has access")
        return reg, OK_NO_CHANGE

    @rule(who=st.integers(0, 6), pick=st.integers(0, 15), person=st.sampled_from(PEOPLE))
    def allow(self, who: int, pick: int, person: str) -> None:
        name = self.pick_name(pick)
        caller = self.pick_caller(self.live_named(name), who)
        reg, expect = self._access_expect(caller, name, person)
        if reg is not None and expect.error is None:
            expect = Expect(apply=lambda _after: reg.allowed.add(person))
        self.call(
            caller,
            f"allow {name} {person}",
            expect,
            lambda c: job_access.allow(self.rt, c, name, person),
        )

    @rule(who=st.integers(0, 6), pick=st.integers(0, 15), person=st.sampled_from(PEOPLE))
    def deny(self, who: int, pick: int, person: str) -> None:
        name = self.pick_name(pick)
        caller = self.pick_caller(self.live_named(name), who)
        reg, expect = self._access_expect(caller, name, person)
        if reg is not None and expect.error is None:
            expect = Expect(apply=lambda _after: reg.allowed.discard(person))
        self.call(
            caller,
            f"deny {name} {person}",
            expect,
            lambda c: job_access.deny(self.rt, c, name, person),
        )

    @rule(who=st.integers(0, 6), pick=st.integers(0, 15), hours=st.sampled_from((1, 3)))
    def extend(self, who: int, pick: int, hours: int) -> None:
        name = self.pick_name(pick)
        reg = self.live_named(name)
        caller = self.pick_caller(reg, who)
        delta = timedelta(hours=hours)
        now = self.clock.now
        if reg is None:
            expect = Expect(NotFound, why=f"no live {name}")
        elif not _may_change(caller, reg.owner):
            expect = Expect(NotAuthorized, names=reg.owner, why="not the owner nor an admin")
        elif reg.state not in ("active", "awaiting_confirmation"):
            expect = Expect(Conflict, why=f"{name} is {reg.state}")
        else:
            found = reg

            def apply(_after: Snapshot) -> None:
                # Extending a manual instance that awaits its release confirmation keeps it:
                # the release request is withdrawn.
                found.state = "active"
                found.deadline = max(found.deadline, now) + delta

            expect = Expect(apply=apply)
        self.call(
            caller,
            f"extend {name} {hours}h",
            expect,
            lambda c: lifecycle.extend(self.rt, c, name, delta),
        )

    @rule(who=st.integers(0, 6), pick=st.integers(0, 15))
    def ask_release(self, who: int, pick: int) -> None:
        name = self.pick_name(pick)
        reg = self.live_named(name)
        caller = self.pick_caller(reg, who)
        if reg is None:
            expect = Expect(NotFound, why=f"no live {name}")
        elif not _may_change(caller, reg.owner):
            expect = Expect(NotAuthorized, names=reg.owner, why="not the owner nor an admin")
        elif reg.state != "active":
            expect = Expect(Conflict, why=f"{name} is {reg.state}")
        else:
            expect = OK_NO_CHANGE
        before = snapshot(self.db)
        self.call(
            caller, f"ask_release {name}", expect, lambda c: lifecycle.ask_release(self.rt, c, name)
        )
        assert snapshot(self.db) == before, "asking what a release means changed the store"

    def pick_by_id(
        self, who: int, pick: int, state: str
    ) -> tuple[str, int, Reg | None, Expect | None]:
        """A registration by id (button values carry ids), mostly one in ``state``, else any
        (released ones too), and its caller; now and then an id nobody has. With the Expect
        when the call must fail whatever the registration's state."""
        if not self.regs or pick >= 12:
            return PEOPLE[who % len(PEOPLE)], 10_000 + pick, None, Expect(NotFound, why="no id")
        regs = sorted(self.regs.values(), key=lambda r: r.id)
        preferred = [r for r in regs if r.state == state]
        reg = preferred[pick % len(preferred)] if preferred and pick < 8 else regs[pick % len(regs)]
        caller = self.pick_caller(reg, who)
        if not _may_change(caller, reg.owner):
            return caller, reg.id, reg, Expect(NotAuthorized, names=reg.owner, why="not owner")
        return caller, reg.id, reg, None

    @rule(who=st.integers(0, 6), pick=st.integers(0, 12))
    def release(self, who: int, pick: int) -> None:
        caller, instance_id, reg, expect = self.pick_by_id(who, pick, "active")
        if expect is None:
            assert reg is not None
            if reg.state == "released":
                expect = Expect(Conflict, why="already released")
            else:
                found = reg

                def apply(_after: Snapshot) -> None:
                    found.state = "awaiting_confirmation"

                expect = Expect(apply=apply)
        self.call(
            caller,
            f"release #{instance_id}",
            expect,
            lambda c: lifecycle.release(self.rt, c, instance_id),
        )

    @rule(who=st.integers(0, 6), pick=st.integers(0, 12))
    def confirm_released(self, who: int, pick: int) -> None:
        caller, instance_id, reg, expect = self.pick_by_id(who, pick, "awaiting_confirmation")
        if expect is None:
            assert reg is not None
            if reg.state == "active":
                expect = Expect(Conflict, why="no release awaits a confirmation")
            else:
                found = reg

                def apply(_after: Snapshot) -> None:
                    found.state = "released"

                expect = Expect(apply=apply)
        self.call(
            caller,
            f"confirm_released #{instance_id}",
            expect,
            lambda c: lifecycle.confirm_released(self.rt, c, instance_id),
        )

    @rule(minutes=st.sampled_from((5, 45, 150)))
    def time_passes(self, minutes: int) -> None:
        self.clock.advance(minutes=minutes)

    # --- invariants ---------------------------------------------------------------------------

    @invariant()
    def no_machine_has_two_live_registrations(self) -> None:
        rows = live_rows(self.db)
        by: dict[str, set[object]] = {"address": set(), "key": set(), "provider": set()}
        machines: set[int] = set()
        for row in rows:
            address = (row.host, row.port, row.ssh_user)
            assert address not in by["address"], f"two live registrations at {address}"
            by["address"].add(address)
            assert row.host_key_fingerprint, f"{row.name} has no pinned key"
            assert row.host_key_fingerprint not in by["key"], "two live with one host key"
            by["key"].add(row.host_key_fingerprint)
            if row.provider_instance_id is not None:
                pid = (row.provider, row.provider_instance_id)
                assert pid not in by["provider"], f"two live registrations of {pid}"
                by["provider"].add(pid)
            machine = _machine_at(row.host, row.port)
            assert machine is not None
            assert machine.host_key.fingerprint == row.host_key_fingerprint
            assert machine.index not in machines, f"machine {machine.index} registered twice"
            machines.add(machine.index)

    @invariant()
    def the_store_agrees_with_the_model(self) -> None:
        with self.db.session() as session:
            rows = {i.id: i for i in session.exec(select(Instance))}
            granted: dict[int, set[str]] = {}
            for a in session.exec(select(InstanceAccess)):
                granted.setdefault(a.instance_id, set()).add(a.person_id)
        assert set(rows) == set(self.regs), "registrations the model does not know"
        for reg in self.regs.values():
            row = rows[reg.id]
            machine = MACHINES[reg.machine]
            stored = {
                "name": row.name,
                "owner": row.owner_id,
                "state": row.state,
                "address": registration.format_address(row.ssh_user, row.host, row.port),
                "key": row.host_key_fingerprint,
                "provider_id": row.provider_instance_id,
                "price": row.price_micros,
                "deadline": row.deadline_at,
                "allowed": granted.get(reg.id, set()),
            }
            expected = {
                "name": reg.name,
                "owner": reg.owner,
                "state": reg.state,
                "address": reg.address,
                "key": machine.host_key.fingerprint,
                "provider_id": reg.provider_id,
                "price": reg.price,
                "deadline": reg.deadline,
                "allowed": reg.allowed,
            }
            assert stored == expected, f"#{reg.id}: {_diff(expected, stored)}"


_COPIES = itertools.count()


def _copy_database(template: Path, workdir: Path) -> Database:
    """A fresh migrated SQLite database: a copy of the template file (faster than migrating)."""
    target = workdir / f"example-{next(_COPIES)}" / template.name
    target.parent.mkdir(parents=True)
    shutil.copyfile(template, target)
    return Database(f"sqlite:///{target}")


@pytest.fixture
def template(sqlite_db: Database) -> Path:
    """The migrated ``sqlite_db`` file, closed so that a copy of it is whole."""
    path = Path(str(sqlite_db.url.database))
    sqlite_db.dispose()  # the last connection to close checkpoints the write-ahead log
    assert not path.with_name(path.name + "-wal").exists()
    return path


def test_trust_model_holds_over_random_sequences(template: Path, tmp_path: Path) -> None:
    class OnACopyOfTheTemplate(TrustModel):
        def __init__(self) -> None:
            super().__init__(template, tmp_path)

    run_state_machine_as_test(
        OnACopyOfTheTemplate,
        settings=settings(
            max_examples=50,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            report_multiple_bugs=False,
            # no Phase.explain: its line tracing makes shrinking a failure take minutes
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        ),
    )


# --- two registrations of one machine at once -------------------------------------------------


def test_two_people_registering_one_machine_at_once_store_one(db: Database) -> None:
    barrier = threading.Barrier(2, timeout=20)
    rt = make_runtime(db, Clock(), fleet=StandInFleet(barrier), instance_networks=NETWORKS)
    attempts = {"U0ALICE": "alpha", "U0BOB": "beta"}
    outcomes: dict[str, object] = {}

    def attempt(person: str, name: str) -> None:
        request = registration.RegisterRequest(
            name=name,
            address="root@10.0.0.1:22",
            price_micros_per_hour=2_100_000,
            release_in=timedelta(hours=2),
        )
        try:
            outcomes[person] = registration.register(
                rt, Caller(user_id=person, channel_id="CTEAM"), request
            )
        except Exception as exc:  # the test looks at what each got
            outcomes[person] = exc

    threads = [threading.Thread(target=attempt, args=item) for item in attempts.items()]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        rt.executor.shutdown(wait=True)
    assert not any(thread.is_alive() for thread in threads)
    won = [p for p, outcome in outcomes.items() if isinstance(outcome, RegisterResult)]
    assert len(won) == 1, outcomes
    [winner] = won
    [loser] = [p for p in attempts if p != winner]
    refusal = outcomes[loser]
    assert isinstance(refusal, Conflict), refusal
    assert f"<@{winner}>" in refusal.message, refusal.message
    [row] = live_rows(db)
    assert (row.owner_id, row.name) == (winner, attempts[winner])
    assert (row.host, row.port, row.ssh_user) == ("10.0.0.1", 22, "root")
    assert row.host_key_fingerprint == MACHINES[0].host_key.fingerprint
