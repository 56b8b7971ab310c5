"""Shared test setup. Fixtures live in tests/fixtures/, one module per outside thing."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bot.i18n import set_default_language

pytest_plugins = [
    "tests.fixtures.fake_nvml",
    "tests.fixtures.sshd",
    "tests.fixtures.slack",
    "tests.fixtures.store",
    "tests.fixtures.providers",
    "tests.fixtures.instances",
]

HAS_GPU = os.path.exists("/dev/nvidiactl")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests need a real NVIDIA GPU: skipped elsewhere, with the reason in the summary."""
    if HAS_GPU:
        return
    no_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU and driver (/dev/nvidiactl)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(no_gpu)


@pytest.fixture(autouse=True)
def _workspace_language_is_english() -> Iterator[None]:
    """A test that sets the workspace's language (GPUBOT_LANGUAGE) leaves English behind."""
    yield
    set_default_language("en")
