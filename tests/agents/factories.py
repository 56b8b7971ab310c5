"""Builders for agent documents with sane defaults: an idle, healthy H100 SXM machine.

Every builder takes keyword overrides for any field, so a test states only what it is about::

    status = make_status(gpus=[make_gpu(0, temp_c=85)])
    probe = make_probe(torch_cuda_version=None, torch_version="2.4.0+cpu")
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agents.probe import (
    Measurement,
    NcclOutcome,
    NcclSize,
    PairMeasurement,
    ProbeDevice,
    ProbeOutcome,
    TorchFacts,
)
from agents.protocol import (
    DriverInfo,
    GpuSnapshot,
    HostInfo,
    NvmlError,
    ProcessSnapshot,
    StatusSnapshot,
)
from agents.topology import GpuLinks, GpuPair, NvLink, Topology

GIB = 1024**3
MIB = 1024**2

H100_MEM_BYTES = 81559 * MIB

_UNSET: Any = object()


def make_host(**overrides: Any) -> HostInfo:
    """A Linux host outside any container."""
    fields: dict[str, Any] = {
        "hostname": "gpu-box",
        "os": "Ubuntu 22.04.4 LTS",
        "kernel": "5.15.0-105-generic",
        "python_version": "3.10.12",
        "agent_version": "0.1.0",
        "cpu_count": 32,
        "mem_total_bytes": 256 * GIB,
        "uptime_s": 3600.0,
        "in_container": False,
        "is_wsl": False,
    }
    fields.update(overrides)
    return HostInfo(**fields)


def make_driver(**overrides: Any) -> DriverInfo:
    """Driver 550.54.15, CUDA 12.4."""
    fields: dict[str, Any] = {
        "version": "550.54.15",
        "cuda_version": "12.4",
        "nvml_version": "12.550.54.15",
    }
    fields.update(overrides)
    return DriverInfo(**fields)


def make_gpu(index: int = 0, **overrides: Any) -> GpuSnapshot:
    """An idle, healthy H100 SXM (NVML's view)."""
    fields: dict[str, Any] = {
        "index": index,
        "uuid": f"GPU-{index:08x}-0000-0000-0000-000000000000",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "mem_total_bytes": H100_MEM_BYTES,
        "mem_used_bytes": 4 * MIB,
        "mem_free_bytes": H100_MEM_BYTES - 4 * MIB,
        "util_gpu_pct": 0,
        "util_mem_pct": 0,
        "temp_c": 31,
        "power_draw_w": 68.0,
        "power_limit_w": 700.0,
        "power_default_limit_w": 700.0,
        "sm_clock_mhz": 345,
        "sm_clock_max_mhz": 1980,
        "clock_event_reasons": ("gpu_idle",),
        "ecc_mode_enabled": True,
        "ecc_uncorrected_volatile": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "retired_pages_pending": None,
        "pcie_gen_current": 5,
        "pcie_gen_max": 5,
        "pcie_width_current": 16,
        "pcie_width_max": 16,
        "persistence_mode": True,
        "mig_mode": False,
        "compute_capability": "9.0",
        "sm_count": 132,
    }
    fields.update(overrides)
    return GpuSnapshot(**fields)


def make_process(gpu_index: int = 0, pid: int = 4242, **overrides: Any) -> ProcessSnapshot:
    """A python training process holding 10 GiB."""
    fields: dict[str, Any] = {
        "gpu_index": gpu_index,
        "pid": pid,
        "user": "alice",
        "command": "python train.py --epochs 3",
        "used_mem_bytes": 10 * GIB,
        "job_id": None,
    }
    fields.update(overrides)
    return ProcessSnapshot(**fields)


def make_status(
    gpus: Sequence[GpuSnapshot] | None = None,
    *,
    n: int = 1,
    processes: Iterable[ProcessSnapshot] = (),
    driver: DriverInfo | None = _UNSET,
    nvml_error: NvmlError | None = None,
    host: HostInfo | None = None,
    **gpu_overrides: Any,
) -> StatusSnapshot:
    """A snapshot of ``gpus`` (default: ``n`` GPUs from make_gpu with ``gpu_overrides``).

    With ``nvml_error`` there are no GPUs and no driver, as the collector reports it.
    """
    if nvml_error is not None:
        return StatusSnapshot(
            host=host or make_host(),
            driver=None,
            nvml_error=nvml_error,
            gpus=(),
            processes=(),
            collected_at="2026-01-01T00:00:00Z",
        )
    if gpus is None:
        gpus = [make_gpu(i, **gpu_overrides) for i in range(n)]
    return StatusSnapshot(
        host=host or make_host(),
        driver=make_driver() if driver is _UNSET else driver,
        nvml_error=None,
        gpus=tuple(gpus),
        processes=tuple(processes),
        collected_at="2026-01-01T00:00:00Z",
    )


def make_nvml_error(code: str = "library_not_found", **overrides: Any) -> NvmlError:
    """An NVML failure with a hint."""
    fields: dict[str, Any] = {
        "code": code,
        "message": "NVML Shared Library Not Found",
        "hint": "Start the container with GPUs.",
    }
    fields.update(overrides)
    return NvmlError(**fields)


def make_device(index: int = 0, **overrides: Any) -> ProbeDevice:
    """An H100 SXM as torch sees it."""
    fields: dict[str, Any] = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "capability": "9.0",
        "total_memory_bytes": H100_MEM_BYTES,
        "sm_count": 132,
    }
    fields.update(overrides)
    return ProbeDevice(**fields)


def make_facts(**overrides: Any) -> TorchFacts:
    """A CUDA 12.4 build of torch 2.4 that sees one H100 (``device_count`` devices)."""
    count = overrides.pop("device_count", 1)
    fields: dict[str, Any] = {
        "python_version": "3.10.12",
        "python_executable": "/opt/venv/bin/python",
        "torch_installed": True,
        "torch_import_error": None,
        "torch_version": "2.4.0+cu124",
        "torch_cuda_version": "12.4",
        "torch_hip_version": None,
        "cuda_available": True,
        "cuda_init_error": None,
        "device_count": count,
        "arch_list": ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"),
        "devices": tuple(make_device(i) for i in range(count)),
        "cuda_visible_devices": None,
    }
    fields.update(overrides)
    return TorchFacts(**fields)


def make_probe(
    facts: TorchFacts | None = _UNSET,
    *,
    failure: str | None = None,
    message: str = "",
    python: str = "python3",
    **fact_overrides: Any,
) -> ProbeOutcome:
    """A probe run: by default it reported ``make_facts(**fact_overrides)``."""
    if failure is not None:
        return ProbeOutcome(python=python, facts=None, failure=failure, message=message)
    if facts is _UNSET:
        facts = make_facts(**fact_overrides)
    return ProbeOutcome(python=python, facts=facts, elapsed_s=2.5)


def make_measurements(values: Sequence[float | None], **extra: Any) -> tuple[Measurement, ...]:
    """One measurement per GPU index with headline ``values`` and ``extra`` fields."""
    return tuple(
        Measurement(index=i, value=v, error=None, extra=dict(extra)) for i, v in enumerate(values)
    )


def make_pairs(
    count: int, gbps: float = 370.0, peer_access: bool = True, **per_pair: float | None
) -> tuple[PairMeasurement, ...]:
    """Copy bandwidth between every ordered pair of ``count`` GPUs: ``gbps`` each, except
    pairs named like ``p0_1=12.5`` (src 0, dst 1)."""
    return tuple(
        PairMeasurement(
            src=a,
            dst=b,
            gbps=per_pair.get(f"p{a}_{b}", gbps),
            peer_access=peer_access,
            error=None,
        )
        for a in range(count)
        for b in range(count)
        if a != b
    )


def make_nvswitch_topology(count: int, links: int = 18, **down: int) -> Topology:
    """``count`` GPUs, each with ``links`` NVLink 4 links to NVSwitches, all up except
    ``down`` (``g3=6`` takes 6 links of GPU 3 down); peer-to-peer ok everywhere."""
    gpus = []
    for index in range(count):
        off = down.get(f"g{index}", 0)
        gpus.append(
            GpuLinks(
                index=index,
                pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
                nvlinks=tuple(
                    NvLink(
                        link=i,
                        active=i >= off,
                        version=4,
                        remote_bus_id=None if i < off else "00000000:C0:00.0",
                        remote_type=None if i < off else "nvswitch",
                    )
                    for i in range(links)
                ),
            )
        )
    pairs = tuple(
        GpuPair(a, b, "SYS", 0, True, "ok", "ok") for a in range(count) for b in range(a + 1, count)
    )
    return Topology(gpus=tuple(gpus), pairs=pairs)


def make_pcie_topology(count: int, level: str = "PHB", p2p: str = "ok") -> Topology:
    """``count`` GPUs without NVLink, every pair over PCIe at ``level`` with ``p2p`` read."""
    gpus = tuple(
        GpuLinks(index=i, pci_bus_id=f"00000000:{0x18 + i:02X}:00.0", nvlinks=None)
        for i in range(count)
    )
    pairs = tuple(
        GpuPair(a, b, level, 0, False, p2p, "not_supported")
        for a in range(count)
        for b in range(a + 1, count)
    )
    return Topology(gpus=gpus, pairs=pairs)


def make_nccl(world_size: int = 8, busbw_gbps: float = 380.0, **overrides: Any) -> NcclOutcome:
    """An all-reduce run that reached ``busbw_gbps`` at 256 MiB."""
    factor = 2 * (world_size - 1) / world_size
    sizes = tuple(
        NcclSize(
            bytes=nbytes,
            seconds_per_op=nbytes / (busbw_gbps / factor * 1e9),
            algbw_gbps=busbw_gbps / factor,
            busbw_gbps=busbw_gbps * share,
        )
        for nbytes, share in ((1 << 20, 0.1), (1 << 25, 0.8), (1 << 28, 1.0))
    )
    fields: dict[str, Any] = {
        "python": "python3",
        "world_size": world_size,
        "sizes": sizes,
        "nccl_version": "2.21.5",
        "elapsed_s": 4.0,
    }
    fields.update(overrides)
    return NcclOutcome(**fields)


def make_full_probe(
    *,
    matmul: Sequence[float | None] | None = None,
    bandwidth: Sequence[float | None] | None = None,
    gemm: Sequence[float | None] | None = None,
    gemm_dtype: str = "bfloat16",
    p2p: tuple[PairMeasurement, ...] | None = None,
    **fact_overrides: Any,
) -> ProbeOutcome:
    """A --full probe run with the given per-GPU results (defaults: healthy H100 figures, and
    with two or more GPUs 370 GB/s between every pair)."""
    count = fact_overrides.get("device_count", 1)
    if p2p is None and count >= 2:
        p2p = make_pairs(count)
    facts = make_facts(
        p2p=p2p,
        matmul=make_measurements(matmul if matmul is not None else [2e-6] * count, n=4096),
        bandwidth=make_measurements(
            bandwidth if bandwidth is not None else [3000.0] * count, seconds=0.02
        ),
        gemm=make_measurements(
            gemm if gemm is not None else [780.0] * count, dtype=gemm_dtype, n=8192
        ),
        **fact_overrides,
    )
    return make_probe(facts)
