"""Shared fixtures for the bot's tests: a hand clock, a scripted platform and a runtime over
them. A module that needs another runtime (the local console's ``local_rt``, other settings)
defines its own ``rt``, or ``clock``, which takes the place of these for its tests."""

from __future__ import annotations

import pytest

from bot.runtime import Runtime
from bot.store.db import Database
from tests.bot.services.support import Clock, ScriptedPlatform, make_runtime


@pytest.fixture
def clock() -> Clock:
    """A clock the test moves by hand, at ``support.T0``."""
    return Clock()


@pytest.fixture
def platform() -> ScriptedPlatform:
    """A platform whose release answers the test scripts."""
    return ScriptedPlatform()


@pytest.fixture
def rt(db: Database, clock: Clock, platform: ScriptedPlatform) -> Runtime:
    """A runtime over ``db`` (SQLite, then PostgreSQL) with ``clock``, the manual provider and
    ``platform``, a recording notifier, admin ``UADMIN`` and channel ``COPS``."""
    return make_runtime(db, clock, providers=[platform])
