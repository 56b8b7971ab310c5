"""--full checks at their edges: matmul error, bandwidth and GEMM against the spec table."""

from __future__ import annotations

import pytest

from agents import probe as probe_mod
from agents.checks import perf
from agents.probe import Measurement
from tests.agents.factories import (
    make_device,
    make_facts,
    make_full_probe,
    make_measurements,
    make_probe,
)

H100_BANDWIDTH = 3350.0
H100_BF16 = 989.0


def test_full_checks_skip_when_not_run():
    for check in (perf.check_matmul, perf.check_bandwidth, perf.check_gemm):
        result = check(None)
        assert result.status == "skip"
        assert "CUDA build" in result.summary
        no_measurements = check(make_probe())
        assert no_measurements.status == "skip"


@pytest.mark.parametrize("failure", [probe_mod.TIMEOUT, probe_mod.CRASHED])
def test_full_checks_fail_when_the_gpu_tests_hang_or_crash(failure):
    outcome = make_probe(failure=failure, message="python3 did not finish within 60 s")
    for check in (perf.check_matmul, perf.check_bandwidth, perf.check_gemm):
        result = check(outcome)
        assert result.status == "fail"
        assert "python3 did not finish" in result.summary


# --- matmul -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (0.0, "pass"),
        (2e-6, "pass"),
        (9.99e-4, "pass"),
        (1e-3, "warn"),
        (9.99e-3, "warn"),
        (1e-2, "fail"),
        (0.5, "fail"),
        (None, "fail"),  # non-finite values
    ],
)
def test_matmul_error_edges(error, expected):
    result = perf.check_matmul(make_full_probe(matmul=[error]))
    assert result.status == expected
    assert result.details["gpus"]["0"]["max_rel_error"] == error


def test_matmul_names_the_bad_gpu():
    result = perf.check_matmul(make_full_probe(matmul=[1e-6, 0.3], device_count=2))
    assert result.status == "fail"
    assert "GPU 1: relative error 3.0e-01" in result.summary
    assert "GPU 0" not in result.summary


def test_matmul_error_from_cuda_fails():
    facts = make_facts(
        matmul=(Measurement(index=0, value=None, error="RuntimeError: CUDA error", extra={}),)
    )
    result = perf.check_matmul(make_probe(facts))
    assert result.status == "fail"
    assert "RuntimeError: CUDA error" in result.summary


# --- bandwidth --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [(0.90, "pass"), (0.60, "pass"), (0.599, "warn"), (0.2, "warn")],
)
def test_bandwidth_edge_at_sixty_percent_of_spec(fraction, expected):
    result = perf.check_bandwidth(make_full_probe(bandwidth=[H100_BANDWIDTH * fraction]))
    assert result.status == expected
    row = result.details["gpus"]["0"]
    assert row["spec"] == H100_BANDWIDTH
    assert row["gpu"] == "h100-sxm"
    assert row["fraction_of_spec"] == pytest.approx(fraction, abs=1e-3)
    if expected == "warn":
        assert "of the 3350 spec" in result.summary
        assert "identity" in result.hint


def test_bandwidth_pass_summary_gives_the_figures():
    result = perf.check_bandwidth(make_full_probe(bandwidth=[3015.0]))
    assert result.summary == "GPU 0: 3015 GB/s (90% of spec)"


def test_bandwidth_of_an_unknown_gpu_passes_with_the_numbers():
    facts = make_facts(
        devices=(make_device(0, name="NVIDIA B200", sm_count=148),),
        bandwidth=make_measurements([6000.0]),
    )
    result = perf.check_bandwidth(make_probe(facts))
    assert result.status == "pass"
    assert "no spec figure" in result.summary
    assert result.details["gpus"]["0"]["measured"] == 6000.0


# --- gemm -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [(0.80, "pass"), (0.50, "pass"), (0.499, "warn"), (0.1, "warn")],
)
def test_gemm_edge_at_half_of_spec(fraction, expected):
    result = perf.check_gemm(make_full_probe(gemm=[H100_BF16 * fraction]))
    assert result.status == expected
    assert result.details["gpus"]["0"]["spec"] == H100_BF16


def test_gemm_geforce_above_spec_passes():
    facts = make_facts(
        devices=(
            make_device(
                0,
                name="NVIDIA GeForce RTX 4090",
                capability="8.9",
                total_memory_bytes=24564 * 1024**2,
                sm_count=128,
            ),
        ),
        gemm=make_measurements([180.0], dtype="bfloat16"),
    )
    result = perf.check_gemm(make_probe(facts))
    assert result.status == "pass"
    assert "109% of spec" in result.summary


def test_gemm_fp16_on_a_t4_uses_the_fp16_figure():
    t4 = make_device(
        0, name="Tesla T4", capability="7.5", total_memory_bytes=15360 * 1024**2, sm_count=40
    )
    ok = make_facts(devices=(t4,), gemm=make_measurements([40.0], dtype="float16"))
    result = perf.check_gemm(make_probe(ok))
    assert result.status == "pass"
    assert result.details["gpus"]["0"]["spec"] == 65.0
    slow = make_facts(devices=(t4,), gemm=make_measurements([20.0], dtype="float16"))
    assert perf.check_gemm(make_probe(slow)).status == "warn"


def test_gemm_on_eight_gpus_names_the_slow_one():
    values = [780.0] * 7 + [300.0]
    result = perf.check_gemm(make_full_probe(gemm=values, device_count=8))
    assert result.status == "warn"
    assert result.summary.startswith("far below spec: GPU 7: 300 TFLOP/s, 30% of the 989 spec")
