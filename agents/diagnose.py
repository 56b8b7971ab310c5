"""What a finished job's samples say: per-GPU statistics and diagnoses a person can act on.

Pure functions over a series of samples taken while the job ran (standard library only,
Python 3.9); each diagnosis is told by a template of agents.messages and its parameters.
Utilisation is in percent (``util_pct``: share of time a kernel ran); CPU use is
in percent of one core summed over the job's processes (200 = two busy cores); memory in bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from agents import messages
from agents.protocol import Diagnosis, JobGpuStat

#: Fewer samples than this say nothing about utilisation.
MIN_UTIL_SAMPLES = 5
#: GPU utilisation (every GPU's average) below which a busy CPU points at data loading.
DATALOADER_MAX_GPU_UTIL_PCT = 50.0
#: CPU use (percent of one core) that counts as busy.
DATALOADER_MIN_CPU_PCT = 90.0
#: A GPU averaging at least this is "busy" when comparing GPUs.
IMBALANCE_BUSY_PCT = 50.0
#: ... and one averaging at most this share of the busiest is "idle".
IMBALANCE_IDLE_RATIO = 0.25
#: Below this average utilisation and memory share a GPU counts as unused.
UNUSED_MAX_UTIL_PCT = 1.0
UNUSED_MAX_MEM_SHARE = 0.02
#: The first share of a memory series is warm-up (allocator caches grow) and is ignored.
LEAK_WARMUP_SHARE = 0.25
#: Samples needed after the warm-up to judge a leak (three segments of at least 3).
LEAK_MIN_SAMPLES = 9
#: Rise, first to last segment, that counts as a leak: the larger of these.
LEAK_MIN_RISE_BYTES = 256 * 1024 * 1024
LEAK_MIN_RISE_SHARE = 0.02

_OOM_PATTERNS = (
    re.compile(r"CUDA out of memory", re.IGNORECASE),
    re.compile(r"torch\.(cuda\.)?OutOfMemoryError"),
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
    re.compile(r"cudaErrorMemoryAllocation"),
)


@dataclass(frozen=True)
class GpuPoint:
    """One GPU at one sample; ``None`` where NVML did not report the value."""

    index: int
    util_pct: Optional[float]
    mem_used_bytes: Optional[int]


@dataclass(frozen=True)
class Sample:
    """The job at ``t_s`` seconds after it started: its CPU use and its GPUs."""

    t_s: float
    cpu_pct: Optional[float]
    gpus: Tuple[GpuPoint, ...]


class SampleSeries:
    """Samples in time order, at most ``limit`` of them: when full, neighbours are merged
    (mean utilisation and CPU, peak memory), so a week-long job keeps a bounded series."""

    def __init__(self, limit: int = 2048) -> None:
        if limit < 4:
            raise ValueError("limit must be at least 4")
        self.limit = limit
        self._samples: List[Sample] = []

    def add(self, sample: Sample) -> None:
        """Append a sample, halving the resolution when the series is full."""
        self._samples.append(sample)
        if len(self._samples) > self.limit:
            self._samples = _halve(self._samples)

    def samples(self) -> Tuple[Sample, ...]:
        """The samples kept, oldest first."""
        return tuple(self._samples)


def gpu_stats(samples: Sequence[Sample], gpu_indices: Sequence[int]) -> Tuple[JobGpuStat, ...]:
    """Average utilisation and peak memory of each GPU in ``gpu_indices`` (None when unreported)."""
    stats = []
    for index in gpu_indices:
        utils = _util_series(samples, index)
        mems = _mem_series(samples, index)
        stats.append(
            JobGpuStat(
                index=index,
                util_avg_pct=round(_mean(utils), 1) if utils else None,
                mem_peak_bytes=max(mems) if mems else None,
            )
        )
    return tuple(stats)


def diagnose(
    samples: Sequence[Sample],
    gpu_indices: Sequence[int],
    mem_total_bytes: Mapping[int, Optional[int]],
    cpu_avg_pct: Optional[float],
    log_text: str,
) -> Tuple[Diagnosis, ...]:
    """Every diagnosis that applies, most telling first.

    ``mem_total_bytes`` maps a GPU index to its memory size; ``cpu_avg_pct`` is the job's
    average CPU use over its whole run; ``log_text`` is the end of its log.
    """
    found: List[Diagnosis] = []
    oom = cuda_oom(log_text)
    if oom is not None:
        found.append(oom)
    stats = gpu_stats(samples, gpu_indices)
    unused = gpu_unused(samples, stats, mem_total_bytes)
    if unused is not None:
        found.append(unused)
    else:
        loader = dataloader_bound(samples, stats, cpu_avg_pct)
        if loader is not None:
            found.append(loader)
    imbalance = gpu_imbalance(samples, stats)
    if imbalance is not None and unused is None:
        found.append(imbalance)
    for index in gpu_indices:
        leak = memory_leak(_mem_series(samples, index), index, mem_total_bytes.get(index))
        if leak is not None:
            found.append(leak)
    return tuple(found)


def cuda_oom(log_text: str) -> Optional[Diagnosis]:
    """``cuda_oom`` when the log shows CUDA running out of memory."""
    if not any(pattern.search(log_text) for pattern in _OOM_PATTERNS):
        return None
    return _diagnosis("cuda_oom", messages.DIAGNOSIS_CUDA_OOM)


def dataloader_bound(
    samples: Sequence[Sample], stats: Sequence[JobGpuStat], cpu_avg_pct: Optional[float]
) -> Optional[Diagnosis]:
    """``dataloader_bound`` when every GPU was mostly idle while the CPU was busy."""
    utils = [s.util_avg_pct for s in stats if s.util_avg_pct is not None]
    if not utils or cpu_avg_pct is None or len(samples) < MIN_UTIL_SAMPLES:
        return None
    busiest = max(utils)
    if busiest >= DATALOADER_MAX_GPU_UTIL_PCT or cpu_avg_pct < DATALOADER_MIN_CPU_PCT:
        return None
    return _diagnosis(
        "dataloader_bound",
        messages.DIAGNOSIS_DATALOADER_BOUND,
        gpu_util_pct=round(busiest, 1),
        cpu_pct=round(cpu_avg_pct, 1),
    )


def gpu_imbalance(samples: Sequence[Sample], stats: Sequence[JobGpuStat]) -> Optional[Diagnosis]:
    """``gpu_imbalance`` when one GPU was busy while another of the job's GPUs idled."""
    known = [s for s in stats if s.util_avg_pct is not None]
    if len(known) < 2 or len(samples) < MIN_UTIL_SAMPLES:
        return None
    busy = max(known, key=lambda s: s.util_avg_pct or 0.0)
    idle = min(known, key=lambda s: s.util_avg_pct or 0.0)
    busy_pct = busy.util_avg_pct or 0.0
    idle_pct = idle.util_avg_pct or 0.0
    if busy_pct < IMBALANCE_BUSY_PCT or idle_pct > busy_pct * IMBALANCE_IDLE_RATIO:
        return None
    return _diagnosis(
        "gpu_imbalance",
        messages.DIAGNOSIS_GPU_IMBALANCE,
        busy_gpu=busy.index,
        busy_pct=round(busy_pct, 1),
        idle_gpu=idle.index,
        idle_pct=round(idle_pct, 1),
        gpus=len(known),
    )


def gpu_unused(
    samples: Sequence[Sample],
    stats: Sequence[JobGpuStat],
    mem_total_bytes: Mapping[int, Optional[int]],
) -> Optional[Diagnosis]:
    """``gpu_unused`` when the job held GPUs but never used any of them."""
    if not stats or len(samples) < MIN_UTIL_SAMPLES:
        return None
    for stat in stats:
        total = mem_total_bytes.get(stat.index)
        if stat.util_avg_pct is None or stat.util_avg_pct > UNUSED_MAX_UTIL_PCT:
            return None
        if stat.mem_peak_bytes is None or not total:
            return None
        if stat.mem_peak_bytes > total * UNUSED_MAX_MEM_SHARE:
            return None
    return _diagnosis("gpu_unused", messages.DIAGNOSIS_GPU_UNUSED)


def memory_leak(
    mem_series: Sequence[int], index: int, mem_total_bytes: Optional[int]
) -> Optional[Diagnosis]:
    """``memory_leak`` when GPU ``index``'s memory kept rising after the warm-up.

    The series after the warm-up is cut in three; each segment's mean must exceed the one
    before by a third of the threshold, and the last the first by the whole threshold.
    """
    skip = int(len(mem_series) * LEAK_WARMUP_SHARE)
    series = list(mem_series[skip:])
    if len(series) < LEAK_MIN_SAMPLES:
        return None
    threshold = float(LEAK_MIN_RISE_BYTES)
    if mem_total_bytes:
        threshold = max(threshold, mem_total_bytes * LEAK_MIN_RISE_SHARE)
    third = len(series) // 3
    first = _mean(series[:third])
    middle = _mean(series[third : 2 * third])
    last = _mean(series[2 * third :])
    step = threshold / 3.0
    if middle - first < step or last - middle < step or last - first < threshold:
        return None
    return _diagnosis(
        "memory_leak",
        messages.DIAGNOSIS_MEMORY_LEAK,
        gpu=index,
        rise_bytes=int(max(series) - min(series)),
    )


def _diagnosis(code: str, template: str, **params: object) -> Diagnosis:
    """A diagnosis in English with the template and parameters it was made of."""
    values = messages.params_of(**params)
    return Diagnosis(
        code=code, message=messages.english(template, values), template=template, params=values
    )


def _util_series(samples: Sequence[Sample], index: int) -> List[float]:
    return [
        float(p.util_pct)
        for s in samples
        for p in s.gpus
        if p.index == index and p.util_pct is not None
    ]


def _mem_series(samples: Sequence[Sample], index: int) -> List[int]:
    return [
        int(p.mem_used_bytes)
        for s in samples
        for p in s.gpus
        if p.index == index and p.mem_used_bytes is not None
    ]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _halve(samples: Sequence[Sample]) -> List[Sample]:
    merged: List[Sample] = []
    for i in range(0, len(samples) - 1, 2):
        merged.append(_merge(samples[i], samples[i + 1]))
    if len(samples) % 2:
        merged.append(samples[-1])
    return merged


def _merge(a: Sample, b: Sample) -> Sample:
    points: Dict[int, GpuPoint] = {}
    for point in a.gpus + b.gpus:
        prior = points.get(point.index)
        if prior is None:
            points[point.index] = point
            continue
        points[point.index] = GpuPoint(
            index=point.index,
            util_pct=_mean_opt(prior.util_pct, point.util_pct),
            mem_used_bytes=_max_opt(prior.mem_used_bytes, point.mem_used_bytes),
        )
    return Sample(
        t_s=a.t_s,
        cpu_pct=_mean_opt(a.cpu_pct, b.cpu_pct),
        gpus=tuple(points[i] for i in sorted(points)),
    )


def _mean_opt(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None:
        return b
    if b is None:
        return a
    return (a + b) / 2.0


def _max_opt(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)
