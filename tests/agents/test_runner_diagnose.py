"""Job statistics and diagnoses: pure functions over sample series, tested at their edges."""

from __future__ import annotations

import pytest

from agents import diagnose, messages
from agents.diagnose import GpuPoint, Sample, SampleSeries

GIB = 1024**3
TOTAL = 80 * GIB


def series(
    utils: dict[int, list[float | None]],
    cpu: float | None = 50.0,
    mems: dict[int, list[int | None]] | None = None,
) -> list[Sample]:
    """Samples with per-GPU utilisation (and memory) lists of equal length."""
    length = len(next(iter(utils.values())))
    out = []
    for i in range(length):
        points = tuple(
            GpuPoint(index=g, util_pct=u[i], mem_used_bytes=(mems or {}).get(g, [GIB] * length)[i])
            for g, u in utils.items()
        )
        out.append(Sample(t_s=float(i), cpu_pct=cpu, gpus=points))
    return out


def codes(found) -> list[str]:
    return [d.code for d in found]


def test_gpu_stats_average_and_peak_ignore_gaps():
    samples = series(
        {0: [10, None, 30], 1: [None, None, None]}, mems={0: [GIB, 3 * GIB, None], 1: [None] * 3}
    )
    stats = diagnose.gpu_stats(samples, [0, 1, 2])
    assert [(s.index, s.util_avg_pct, s.mem_peak_bytes) for s in stats] == [
        (0, 20.0, 3 * GIB),
        (1, None, None),
        (2, None, None),
    ]


@pytest.mark.parametrize(
    ("util", "cpu", "n", "expected"),
    [
        (49.9, 90.0, 5, True),
        (50.0, 90.0, 5, False),  # GPU busy half the time: not flagged
        (10.0, 89.9, 5, False),  # CPU not busy enough
        (10.0, 400.0, 4, False),  # too few samples
        (10.0, None, 10, False),  # CPU unknown
    ],
)
def test_dataloader_bound_edges(util, cpu, n, expected):
    samples = series({0: [util] * n}, mems={0: [40 * GIB] * n})
    stats = diagnose.gpu_stats(samples, [0])
    found = diagnose.dataloader_bound(samples, stats, cpu)
    assert (found is not None) == expected
    if found:
        assert "num_workers" in found.message


def test_dataloader_bound_needs_every_gpu_idle():
    samples = series({0: [90.0] * 6, 1: [5.0] * 6})
    stats = diagnose.gpu_stats(samples, [0, 1])
    assert diagnose.dataloader_bound(samples, stats, 300.0) is None


@pytest.mark.parametrize(
    ("busy", "idle", "expected"),
    [
        (50.0, 12.5, True),  # exactly a quarter of the busy one
        (50.0, 12.6, False),
        (49.9, 0.0, False),  # the busy one is not busy enough
        (100.0, 0.0, True),
    ],
)
def test_gpu_imbalance_edges(busy, idle, expected):
    samples = series({0: [busy] * 5, 1: [idle] * 5})
    stats = diagnose.gpu_stats(samples, [0, 1])
    found = diagnose.gpu_imbalance(samples, stats)
    assert (found is not None) == expected
    if found:
        assert "GPU 0" in found.message
        assert "GPU 1" in found.message
        assert "--nproc_per_node=2" in found.message


def test_gpu_imbalance_needs_two_gpus_and_enough_samples():
    one = series({0: [100.0] * 10})
    assert diagnose.gpu_imbalance(one, diagnose.gpu_stats(one, [0])) is None
    short = series({0: [100.0] * 4, 1: [0.0] * 4})
    assert diagnose.gpu_imbalance(short, diagnose.gpu_stats(short, [0, 1])) is None


def leak_series(rise_per_step: int, n: int = 16, start: int = 10 * GIB) -> list[int]:
    return [start + i * rise_per_step for i in range(n)]


def test_memory_leak_flags_a_steady_rise():
    found = diagnose.memory_leak(leak_series(512 * 1024**2), 0, TOTAL)
    assert found is not None
    assert found.code == "memory_leak"
    assert "GPU 0" in found.message
    assert "no_grad" in found.message


def test_memory_leak_threshold_edges():
    # 12 samples after a 4-sample warm-up -> thirds of 4; segment means rise by 4 steps each.
    threshold = max(256 * 1024**2, TOTAL * 0.02)  # 1.6 GiB on an 80 GiB GPU
    step_at_edge = int(threshold / 8) + 1  # last - first = 8 steps >= threshold
    assert diagnose.memory_leak(leak_series(step_at_edge), 0, TOTAL) is not None
    assert diagnose.memory_leak(leak_series(int(threshold / 8) - 1024), 0, TOTAL) is None


def test_memory_leak_ignores_warmup_plateau_and_short_series():
    warmup_then_flat = [GIB * i for i in range(1, 5)] + [20 * GIB] * 12
    assert diagnose.memory_leak(warmup_then_flat, 0, TOTAL) is None
    # One jump in the middle then flat: the last third does not rise over the middle.
    jump = [10 * GIB] * 8 + [30 * GIB] * 8
    assert diagnose.memory_leak(jump, 0, TOTAL) is None
    # 9 samples are needed after the warm-up quarter: 10 leave 8, 11 leave 9.
    assert diagnose.memory_leak(leak_series(GIB, n=10), 0, TOTAL) is None
    assert diagnose.memory_leak(leak_series(GIB, n=11), 0, TOTAL) is not None
    falling = list(reversed(leak_series(GIB)))
    assert diagnose.memory_leak(falling, 0, TOTAL) is None


def test_memory_leak_threshold_without_total_is_256_mib():
    assert diagnose.memory_leak(leak_series(40 * 1024**2), 0, None) is not None
    assert diagnose.memory_leak(leak_series(20 * 1024**2), 0, None) is None


@pytest.mark.parametrize(
    "line",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        "RuntimeError: cuda Out Of Memory",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate",
        "torch.cuda.OutOfMemoryError: something",
    ],
)
def test_cuda_oom_found_in_log(line):
    found = diagnose.cuda_oom(f"step 1\n{line}\n")
    assert found is not None
    assert "batch size" in found.message
    assert "gradient accumulation" in found.message


def test_cuda_oom_not_for_other_memory_errors():
    assert diagnose.cuda_oom("MemoryError: out of memory (host)\nKilled\n") is None
    assert diagnose.cuda_oom("") is None


def test_gpu_unused_when_util_and_memory_stay_at_zero():
    samples = series({0: [0.0] * 6}, cpu=100.0, mems={0: [4 * 1024**2] * 6})
    found = diagnose.diagnose(samples, [0], {0: TOTAL}, 100.0, "")
    assert codes(found) == ["gpu_unused"]  # not dataloader_bound: the GPU was never used


def test_gpu_unused_edges():
    used_memory = series({0: [0.0] * 6}, mems={0: [int(TOTAL * 0.02) + 1] * 6})
    assert (
        diagnose.gpu_unused(used_memory, diagnose.gpu_stats(used_memory, [0]), {0: TOTAL}) is None
    )
    at_edge = series({0: [1.0] * 6}, mems={0: [int(TOTAL * 0.02)] * 6})
    assert diagnose.gpu_unused(at_edge, diagnose.gpu_stats(at_edge, [0]), {0: TOTAL}) is not None
    no_total = series({0: [0.0] * 6})
    assert diagnose.gpu_unused(no_total, diagnose.gpu_stats(no_total, [0]), {0: None}) is None


def test_diagnose_combines_findings_in_order():
    n = 16
    samples = series(
        {0: [95.0] * n, 1: [2.0] * n},
        mems={0: leak_series(GIB, n), 1: [GIB] * n},
    )
    found = diagnose.diagnose(samples, [0, 1], {0: TOTAL, 1: TOTAL}, 120.0, "CUDA out of memory")
    assert codes(found) == ["cuda_oom", "gpu_imbalance", "memory_leak"]


def test_diagnose_healthy_job_finds_nothing():
    samples = series(
        {0: [97.0] * 20, 1: [96.0] * 20}, cpu=150.0, mems={0: [70 * GIB] * 20, 1: [70 * GIB] * 20}
    )
    assert diagnose.diagnose(samples, [0, 1], {0: TOTAL, 1: TOTAL}, 150.0, "epoch 3 done\n") == ()


def test_diagnose_without_gpus_or_samples():
    assert diagnose.diagnose([], [], {}, None, "") == ()
    assert diagnose.diagnose([], [0], {0: TOTAL}, 300.0, "") == ()


def test_sample_series_stays_bounded_and_keeps_peaks():
    kept = SampleSeries(limit=8)
    for i in range(100):
        mem = 50 * GIB if i == 37 else GIB
        kept.add(Sample(t_s=float(i), cpu_pct=100.0, gpus=(GpuPoint(0, 40.0, mem),)))
    samples = kept.samples()
    assert 4 <= len(samples) <= 8
    assert samples[0].t_s == 0.0
    assert max(p.mem_used_bytes or 0 for s in samples for p in s.gpus) == 50 * GIB
    assert all(s.cpu_pct == 100.0 for s in samples)
    assert diagnose.gpu_stats(samples, [0])[0].util_avg_pct == 40.0


def test_sample_series_merges_gaps():
    kept = SampleSeries(limit=4)
    values = [None, 20.0, 40.0, None, 60.0]
    for i, util in enumerate(values):
        kept.add(
            Sample(t_s=float(i), cpu_pct=None if i % 2 else 10.0, gpus=(GpuPoint(0, util, None),))
        )
    merged = kept.samples()
    assert [p.util_pct for s in merged for p in s.gpus] == [20.0, 40.0, 60.0]
    assert [s.cpu_pct for s in merged] == [10.0, 10.0, 10.0]


def test_sample_series_rejects_tiny_limit():
    with pytest.raises(ValueError, match="at least 4"):
        SampleSeries(limit=3)


def test_a_diagnosis_carries_its_template_and_raw_numbers_for_the_reader():
    found = diagnose.memory_leak(leak_series(512 * 1024**2), 0, TOTAL)
    assert found is not None
    assert found.template == messages.DIAGNOSIS_MEMORY_LEAK
    assert found.params["gpu"] == 0
    assert isinstance(found.params["rise_bytes"], int)  # bytes: the reader writes them out
    assert found.message == messages.english(found.template, found.params)
    assert "+5.5 GiB after warm-up" in found.message
    loader = series({0: [10.0] * 6}, cpu=350.0)
    slow = diagnose.dataloader_bound(loader, diagnose.gpu_stats(loader, [0]), 350.0)
    assert slow is not None
    assert slow.params == {"gpu_util_pct": 10.0, "cpu_pct": 350.0}
    assert "busy only 10% of the time while the CPU ran at 350%" in slow.message
