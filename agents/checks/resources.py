"""Checks over the container's own limits: disk (free space where work is written) and shm
(the shared memory PyTorch DataLoader workers pass batches through). Pure functions of facts
read by agents.system."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from agents.checks.common import FAIL, GIB, N_, PASS, SKIP, WARN, Message, gib, joined, make
from agents.protocol import HealthCheck, HostInfo
from agents.system import FilesystemFacts, ShmFacts

MIB = 1024**2

#: Free space (bytes) below which a filesystem fails: writes (checkpoints, pip, logs) will.
DISK_FAIL_FREE_BYTES = 1 * GIB
#: Free space (bytes) below which it warns: one checkpoint or model download fills it.
DISK_WARN_FREE_BYTES = 10 * GIB
#: Free inodes, as a fraction of all, below which it warns (many small files: datasets, caches).
DISK_WARN_INODE_FRACTION = 0.05

#: /dev/shm free space (bytes) below which DataLoader workers die at once ("bus error").
#: Docker's default is 64 MiB.
SHM_FAIL_BYTES = 256 * MIB
#: /dev/shm wanted per GPU (bytes): each DataLoader worker keeps ``prefetch_factor`` (2)
#: batches there; 4 workers with 128 MiB batches (256 images of 3x224x224 in uint8 are 37 MiB,
#: in float32 147 MiB) need about 1 GiB per training process.
SHM_PER_GPU_BYTES = 1 * GIB

_ROLE_NAMES = {"home": "home", "jobs": "job directory", "temp": "temporary directory"}

_DISK_HINT = N_(
    "Free space: `du -xsh ~/.cache/* /tmp/* 2>/dev/null | sort -h | tail` shows what is big; "
    "pip and Hugging Face caches are the usual culprits (`pip cache purge`, "
    "`huggingface-cli delete-cache`). Keep datasets and checkpoints on a larger volume and "
    "point HF_HOME and TMPDIR there. On container platforms the disk size is fixed at launch: "
    "ask for a larger container disk or attach a volume."
)
_READ_ONLY_HINT = N_(
    "This filesystem is mounted read-only: jobs cannot write logs or checkpoints there. "
    "Point GPU_AGENT_HOME and TMPDIR at a writable volume, or ask the provider why it is "
    "read-only (a full or failing disk is remounted read-only by the kernel)."
)
_INODE_HINT = N_(
    "The filesystem is running out of inodes (too many small files): delete caches of many "
    "small files (`find ~/.cache -xdev -type f | wc -l`), or pack datasets into fewer files "
    "(tar, WebDataset shards)."
)


def check_disk(filesystems: Sequence[FilesystemFacts]) -> HealthCheck:
    """Free space and inodes on the filesystems of the home, job and temporary directories:
    fail below DISK_FAIL_FREE_BYTES, read-only or out of inodes; warn below
    DISK_WARN_FREE_BYTES or DISK_WARN_INODE_FRACTION of inodes free."""
    if not filesystems:
        return make("disk", SKIP, N_("skipped: no directory to measure"))
    details: Dict[str, Any] = {
        "filesystems": [_disk_row(fs) for fs in filesystems],
        "fail_below_bytes": DISK_FAIL_FREE_BYTES,
        "warn_below_bytes": DISK_WARN_FREE_BYTES,
        "warn_below_inode_fraction": DISK_WARN_INODE_FRACTION,
    }
    failures: List[Message] = []
    warnings: List[Message] = []
    hints: List[Message] = []
    for fs in filesystems:
        where = _where(fs)
        if fs.error is not None:
            warnings.append(
                N_("{where}: cannot be measured ({error})", where=where, error=fs.error)
            )
            continue
        free = fs.free_bytes or 0
        if fs.read_only:
            failures.append(N_("{where} is read-only", where=where))
            hints.append(_READ_ONLY_HINT)
        elif free < DISK_FAIL_FREE_BYTES:
            failures.append(N_("{where} has {gib} free", where=where, gib=gib(free)))
            hints.append(_DISK_HINT)
        elif free < DISK_WARN_FREE_BYTES:
            warnings.append(N_("{where} has only {gib} free", where=where, gib=gib(free)))
            hints.append(_DISK_HINT)
        inodes = _inode_fraction(fs)
        if inodes is not None and fs.inodes_free == 0:
            failures.append(N_("{where} has no inodes left", where=where))
            hints.append(_INODE_HINT)
        elif inodes is not None and inodes < DISK_WARN_INODE_FRACTION:
            warnings.append(
                N_(
                    "{where} has only {inodes} of its inodes free",
                    where=where,
                    inodes=f"{inodes:.1%}",
                )
            )
            hints.append(_INODE_HINT)
    hint = joined(" ", list(dict.fromkeys(hints)))
    if failures:
        return make("disk", FAIL, joined("; ", failures + warnings), hint, details)
    if warnings:
        return make("disk", WARN, joined("; ", warnings), hint or _DISK_HINT, details)
    summary = "; ".join(
        f"{_where(fs)}: {gib(fs.free_bytes)} free of {gib(fs.total_bytes)}" for fs in filesystems
    )
    return make("disk", PASS, summary, "", details)


def shm_needed_bytes(gpu_count: int) -> int:
    """/dev/shm wanted for ``gpu_count`` training processes with DataLoader workers (bytes)."""
    return SHM_PER_GPU_BYTES * max(1, gpu_count)


def check_shm(shm: Optional[ShmFacts], host: HostInfo, gpu_count: int) -> HealthCheck:
    """Free space in /dev/shm: fail below SHM_FAIL_BYTES (or none at all), warn below
    :func:`shm_needed_bytes` for this many GPUs."""
    if shm is None:
        return make("shm", SKIP, N_("skipped: /dev/shm was not looked at"))
    needed = shm_needed_bytes(gpu_count)
    details: Dict[str, Any] = {
        "path": shm.path,
        "total_bytes": shm.total_bytes,
        "free_bytes": shm.free_bytes,
        "fs_type": shm.fs_type,
        "fail_below_bytes": SHM_FAIL_BYTES,
        "warn_below_bytes": needed,
        "in_container": host.in_container,
    }
    hint = _shm_hint(host)
    if not shm.exists:
        return make(
            "shm",
            FAIL,
            N_(
                "{path} does not exist: PyTorch DataLoader workers cannot share batches",
                path=shm.path,
            ),
            hint,
            details,
        )
    if shm.free_bytes is None or shm.total_bytes is None:
        return make(
            "shm",
            WARN,
            N_("{path} cannot be measured ({error})", path=shm.path, error=shm.error),
            hint,
            details,
        )
    size = f"{_size(shm.free_bytes)} free of {_size(shm.total_bytes)}"
    leftovers = shm.free_bytes < shm.total_bytes / 2
    if leftovers:
        hint = (
            "Much of it is taken: files left by killed DataLoader workers stay until deleted "
            f"(`ls -la {shm.path}`; remove the torch_* files of processes that are gone). "
        ) + hint
    if shm.free_bytes < SHM_FAIL_BYTES:
        return make(
            "shm",
            FAIL,
            N_(
                "{path} has {size}: DataLoader workers (num_workers > 0) die with "
                '"bus error" or "insufficient shared memory"',
                path=shm.path,
                size=size,
            ),
            hint,
            details,
        )
    if shm.free_bytes < needed:
        return make(
            "shm",
            WARN,
            N_(
                "{path} has {size}; {size2} is wanted for DataLoader workers on {value} GPU(s)",
                path=shm.path,
                size=size,
                size2=_size(needed),
                value=max(1, gpu_count),
            ),
            hint,
            details,
        )
    return make("shm", PASS, N_("{path} has {size}", path=shm.path, size=size), "", details)


def _where(fs: FilesystemFacts) -> str:
    roles = " and ".join(_ROLE_NAMES.get(role, role) for role in fs.roles)
    return f"{roles} ({fs.path})"


def _inode_fraction(fs: FilesystemFacts) -> Optional[float]:
    if not fs.inodes_total or fs.inodes_free is None:
        return None
    return fs.inodes_free / fs.inodes_total


def _disk_row(fs: FilesystemFacts) -> Dict[str, Any]:
    return {
        "path": fs.path,
        "roles": list(fs.roles),
        "total_bytes": fs.total_bytes,
        "free_bytes": fs.free_bytes,
        "inodes_total": fs.inodes_total,
        "inodes_free": fs.inodes_free,
        "read_only": fs.read_only,
        "error": fs.error,
    }


def _shm_hint(host: HostInfo) -> str:
    docker = (
        "In Docker, start the container with `--shm-size=16g` (or `--ipc=host`); in compose, "
        'set `shm_size: "16gb"`; in Kubernetes, mount an emptyDir with `medium: Memory` at '
        "/dev/shm. "
    )
    platform = (
        "On platforms that set it themselves (RunPod, Vast.ai and other container clouds) it "
        "cannot be changed from inside: pick an instance with more RAM or ask the provider; "
        "as root with CAP_SYS_ADMIN, `mount -o remount,size=16G /dev/shm` works. Meanwhile "
        "use fewer DataLoader workers or a smaller prefetch_factor, or call "
        '`torch.multiprocessing.set_sharing_strategy("file_system")`.'
    )
    if host.in_container:
        return docker + platform
    return (
        "Enlarge it with `sudo mount -o remount,size=16G /dev/shm` (and in /etc/fstab to keep "
        "it); if this is a container after all: " + docker + platform
    )


def _size(value: int) -> str:
    return f"{value / MIB:.0f} MiB" if value < GIB else gib(value)
