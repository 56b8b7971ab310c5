"""disk and shm checks at each threshold edge."""

from __future__ import annotations

import pytest

from agents.checks import resources
from agents.checks.resources import (
    DISK_FAIL_FREE_BYTES,
    DISK_WARN_FREE_BYTES,
    SHM_FAIL_BYTES,
    SHM_PER_GPU_BYTES,
)
from agents.system import FilesystemFacts, ShmFacts
from tests.agents.factories import GIB, MIB, make_host

TB = 1000 * GIB


def fs(
    free: int, *, total: int = TB, roles=("home", "jobs", "temp"), **overrides
) -> FilesystemFacts:
    fields = {
        "path": "/root",
        "roles": roles,
        "total_bytes": total,
        "free_bytes": free,
        "inodes_total": 1_000_000,
        "inodes_free": 900_000,
        "read_only": False,
        "error": None,
    }
    fields.update(overrides)
    return FilesystemFacts(**fields)


@pytest.mark.parametrize(
    ("free", "expected"),
    [
        (0, "fail"),
        (DISK_FAIL_FREE_BYTES - 1, "fail"),
        (DISK_FAIL_FREE_BYTES, "warn"),
        (DISK_WARN_FREE_BYTES - 1, "warn"),
        (DISK_WARN_FREE_BYTES, "pass"),
        (500 * GIB, "pass"),
    ],
)
def test_disk_free_space_edges(free, expected):
    result = resources.check_disk([fs(free)])
    assert result.status == expected
    assert result.details["filesystems"][0]["free_bytes"] == free
    if expected == "pass":
        assert result.hint == ""
        assert "home and job directory and temporary directory (/root)" in result.summary
    else:
        assert "pip cache purge" in result.hint


@pytest.mark.parametrize(
    ("inodes_free", "expected"),
    [(0, "fail"), (49_999, "warn"), (50_000, "pass"), (900_000, "pass")],
)
def test_disk_inode_edges(inodes_free, expected):
    result = resources.check_disk([fs(100 * GIB, inodes_free=inodes_free)])
    assert result.status == expected
    if expected != "pass":
        assert "inodes" in result.summary
        assert "small files" in result.hint


def test_a_filesystem_without_inode_limits_is_fine():
    assert resources.check_disk([fs(100 * GIB, inodes_total=None, inodes_free=None)]).status == (
        "pass"
    )


def test_read_only_fails_and_names_the_role():
    result = resources.check_disk(
        [fs(100 * GIB), fs(100 * GIB, roles=("temp",), path="/tmp", read_only=True)]
    )
    assert result.status == "fail"
    assert "temporary directory (/tmp) is read-only" in result.summary
    assert "read-only" in result.hint


def test_the_worst_filesystem_decides_and_all_are_named():
    result = resources.check_disk(
        [fs(2 * GIB, roles=("home",), path="/home/me"), fs(GIB // 2, roles=("temp",), path="/tmp")]
    )
    assert result.status == "fail"
    assert "temporary directory (/tmp) has 0.5 GiB free" in result.summary
    assert "home (/home/me) has only 2.0 GiB free" in result.summary


def test_an_unmeasurable_directory_warns():
    broken = fs(0, total_bytes=None, free_bytes=None, error="/x: Permission denied")
    result = resources.check_disk([broken])
    assert result.status == "warn"
    assert "cannot be measured (/x: Permission denied)" in result.summary


def test_nothing_to_measure_skips():
    assert resources.check_disk([]).status == "skip"


# --- shm --------------------------------------------------------------------------------------


def shm(free: int, total: int | None = None, **overrides) -> ShmFacts:
    fields = {
        "path": "/dev/shm",
        "exists": True,
        "total_bytes": free if total is None else total,
        "free_bytes": free,
        "fs_type": "tmpfs",
        "error": None,
    }
    fields.update(overrides)
    return ShmFacts(**fields)


CONTAINER = make_host(in_container=True)
BARE = make_host(in_container=False)


@pytest.mark.parametrize(
    ("free", "gpus", "expected"),
    [
        (64 * MIB, 1, "fail"),  # Docker's default
        (SHM_FAIL_BYTES - 1, 1, "fail"),
        (SHM_FAIL_BYTES, 1, "warn"),
        (SHM_PER_GPU_BYTES - 1, 1, "warn"),
        (SHM_PER_GPU_BYTES, 1, "pass"),
        (SHM_PER_GPU_BYTES, 0, "pass"),  # no GPU: still one training process's worth
        (8 * SHM_PER_GPU_BYTES - 1, 8, "warn"),
        (8 * SHM_PER_GPU_BYTES, 8, "pass"),
    ],
)
def test_shm_edges(free, gpus, expected):
    result = resources.check_shm(shm(free), CONTAINER, gpus)
    assert result.status == expected
    assert result.details["warn_below_bytes"] == resources.shm_needed_bytes(gpus)
    if expected == "fail":
        assert "bus error" in result.summary
    if expected != "pass":
        assert "--shm-size=16g" in result.hint
        assert "RunPod" in result.hint


def test_shm_hint_outside_a_container_says_how_to_remount():
    result = resources.check_shm(shm(64 * MIB), BARE, 1)
    assert result.hint.startswith("Enlarge it with `sudo mount -o remount,size=16G /dev/shm`")


def test_shm_filled_by_leftovers_says_so():
    result = resources.check_shm(shm(100 * MIB, total=16 * GIB), CONTAINER, 1)
    assert result.status == "fail"
    assert "100 MiB free of 16.0 GiB" in result.summary
    assert "torch_*" in result.hint


def test_no_shm_fails_and_an_unreadable_one_warns():
    assert (
        resources.check_shm(
            shm(0, exists=False, total_bytes=None, free_bytes=None), CONTAINER, 1
        ).status
        == "fail"
    )
    unreadable = shm(0, total_bytes=None, free_bytes=None, error="/dev/shm: Permission denied")
    result = resources.check_shm(unreadable, CONTAINER, 1)
    assert result.status == "warn"
    assert "Permission denied" in result.summary
    assert resources.check_shm(None, CONTAINER, 1).status == "skip"
