"""Shared test setup. Fixtures live in tests/fixtures/, one module per outside thing."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from bot.i18n import set_default_language

# Test runs keep the compiled (and, for test modules, assertion-rewritten) modules in
# __pycache__ even where PYTHONDONTWRITEBYTECODE is set: rewriting and compiling every module
# again costs each test process about 9 s of CPU before the first test runs.
sys.dont_write_bytecode = False

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


@pytest.fixture(autouse=True)
def _umask_is_kept() -> Iterator[None]:
    """``gpubot``'s main sets the process's umask to 0o077 (its files are its user's alone); a
    test that runs it in this process gives the next test the umask it found."""
    found = os.umask(0o022)
    os.umask(found)
    yield
    os.umask(found)
