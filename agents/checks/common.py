"""Small helpers shared by the check modules."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional

from agents.protocol import GpuSnapshot, HealthCheck, StatusSnapshot

PASS = "pass"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"

GIB = 1024**3


def make(
    check_id: str,
    status: str,
    summary: str,
    hint: str = "",
    details: Optional[Mapping[str, Any]] = None,
) -> HealthCheck:
    """A HealthCheck; the hint is dropped on pass, as the schema promises."""
    return HealthCheck(
        id=check_id,
        status=status,
        summary=summary,
        hint="" if status == PASS else hint,
        details=dict(details or {}),
    )


def nvml_gpus(status: StatusSnapshot) -> Optional[Iterable[GpuSnapshot]]:
    """The GPUs NVML reported, or None when NVML failed (the check should then skip)."""
    if status.nvml_error is not None:
        return None
    return status.gpus


def skip_without_nvml(check_id: str, status: StatusSnapshot) -> Optional[HealthCheck]:
    """A skip result when NVML failed or saw no GPU, else None."""
    if status.nvml_error is not None:
        return make(check_id, SKIP, "skipped: NVML is not working (see the nvml check)")
    if not status.gpus:
        return make(check_id, SKIP, "skipped: NVML reports no GPU")
    return None


def gib(value: Optional[int]) -> str:
    """Bytes as "12.3 GiB"; "?" for None."""
    return "?" if value is None else f"{value / GIB:.1f} GiB"


def gpu_list(indices: Iterable[int]) -> str:
    """ "GPU 0", "GPUs 0, 3"."""
    items = [str(i) for i in indices]
    return ("GPU " if len(items) == 1 else "GPUs ") + ", ".join(items)


def per_gpu(values: Mapping[int, Any]) -> Dict[str, Any]:
    """Per-GPU details keyed by index as text (JSON object keys are strings)."""
    return {str(index): value for index, value in sorted(values.items())}
