"""Fleet test setup: the agent zipapp built once per session, and a Fleet with short timeouts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.fleet.fleet import Fleet
from bot.settings import Settings


@pytest.fixture(scope="session")
def agent_zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dist/gpu-agent.pyz as the build step makes it, built into a temporary directory."""
    from agents.zipapp import build

    return build(tmp_path_factory.mktemp("agent") / "gpu-agent.pyz")


@pytest.fixture
def fleet_settings(tmp_path: Path) -> Settings:
    """Settings with timeouts short enough for tests."""
    return Settings(
        data_dir=tmp_path / "data", ssh_connect_timeout_s=3.0, ssh_command_timeout_s=30.0
    )


@pytest.fixture
def fleet(fleet_settings: Settings, agent_zipapp: Path) -> Iterator[Fleet]:
    """A Fleet uploading the session's zipapp; closed after the test."""
    fleet = Fleet(fleet_settings, zipapp_path=agent_zipapp)
    try:
        yield fleet
    finally:
        fleet.close()
