"""The stress check at each edge: throttle reasons, temperature, clock and GEMM-rate falls."""

from __future__ import annotations

from typing import Any

import pytest

from agents import probe as probe_mod
from agents.checks import stress
from agents.checks.gpu import TEMP_FAIL_C, TEMP_WARN_C
from agents.checks.stress import SERIES_MAX_POINTS, STRESS_DROP_WARN
from agents.probe import StressOutcome
from tests.agents.factories import make_facts


def run(
    seconds: int = 60,
    *,
    gpus: int = 1,
    clock: Any = 1980,
    temp: Any = 70,
    reasons: Any = ("sw_power_cap",),
    rates: Any = None,
    **overrides: Any,
) -> StressOutcome:
    """A stress run sampled once a second. ``clock``, ``temp`` and ``reasons`` are values or
    functions of the second; ``rates`` the GEMM TFLOP/s per 5 s window."""

    def at(value: Any, t: int) -> Any:
        return value(t) if callable(value) else value

    samples = tuple(
        {
            "t_s": float(t),
            "gpus": [
                {
                    "index": i,
                    "util_gpu_pct": 100,
                    "sm_clock_mhz": at(clock, t),
                    "sm_clock_max_mhz": 1980,
                    "mem_clock_mhz": 2619,
                    "temp_c": at(temp, t),
                    "power_draw_w": 690.0,
                    "power_limit_w": 700.0,
                    "clock_event_reasons": list(at(reasons, t)),
                }
                for i in range(gpus)
            ],
        }
        for t in range(seconds + 1)
    )
    windows = tuple(
        {"t_s": 5.0 * (w + 1), "seconds": 5.0, "tflops": {str(i): r for i in range(gpus)}}
        for w, r in enumerate(rates or [780.0] * (seconds // 5))
    )
    fields: dict[str, Any] = {
        "python": "python3",
        "duration_s": float(seconds),
        "samples": samples,
        "windows": windows,
        "dtype": "bfloat16",
        "n": 8192,
        "facts": make_facts(device_count=gpus),
        "elapsed_s": seconds + 3.0,
    }
    fields.update(overrides)
    return StressOutcome(**fields)


def test_a_steady_card_passes():
    result = stress.check_stress(run(gpus=2))
    assert result.status == "pass"
    assert result.summary.startswith(
        "GPU 0: 60 s, 780-780 TFLOP/s, SM clock 1980 MHz at the end, max 70 °C, up to 690 W, "
        "at its power cap 100% of the time"
    )
    assert set(result.details["gpus"]) == {"0", "1"}
    assert result.details["gpus"]["0"]["samples"] == 56  # 5 s of warm-up left out


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("hw_power_brake_slowdown", "fail"),
        ("hw_thermal_slowdown", "fail"),
        ("hw_slowdown", "fail"),
        ("sw_thermal_slowdown", "warn"),
        ("sw_power_cap", "pass"),
        ("gpu_idle", "pass"),
    ],
)
def test_throttle_reasons_under_load(reason, expected):
    late = run(reasons=lambda t: ("sw_power_cap", reason) if t > 50 else ("sw_power_cap",))
    result = stress.check_stress(late)
    assert result.status == expected
    if expected == "fail":
        assert "ask the provider to move you" in result.hint


def test_a_reason_during_warm_up_only_is_ignored():
    early = run(reasons=lambda t: ("hw_power_brake_slowdown",) if t < 5 else ())
    assert stress.check_stress(early).status == "pass"


@pytest.mark.parametrize(
    ("temp", "expected"),
    [
        (TEMP_WARN_C - 1, "pass"),
        (TEMP_WARN_C, "warn"),
        (TEMP_FAIL_C - 1, "warn"),
        (TEMP_FAIL_C, "fail"),
    ],
)
def test_temperature_edges(temp, expected):
    result = stress.check_stress(run(temp=lambda t: temp if t == 40 else 70))
    assert result.status == expected
    if expected != "pass":
        assert f"reached {temp} °C" in result.summary


def test_clock_fall_edge():
    # Early third (t 5-22) at 2000 MHz, late third (t 43-60) lower.
    def falling(late: float):
        return lambda t: 2000 if t < 30 else late

    just_under = 2000 * (1 - STRESS_DROP_WARN) + 1
    assert stress.check_stress(run(clock=falling(just_under))).status == "pass"
    at_edge = stress.check_stress(run(clock=falling(2000 * (1 - STRESS_DROP_WARN))))
    assert at_edge.status == "warn"
    assert "SM clock fell from 2000 to 1800 MHz (10%)" in at_edge.summary


def test_gemm_rate_fall_edge():
    steady = [800.0] * 11 + [720.0 + 0.1]
    assert stress.check_stress(run(rates=steady)).status == "pass"
    fallen = stress.check_stress(run(rates=[800.0] * 11 + [720.0]))
    assert fallen.status == "warn"
    assert "GEMM rate fell from 800 to 720 TFLOP/s (10%)" in fallen.summary


def test_gemm_errors_and_failed_runs_fail():
    errors = stress.check_stress(
        run(errors={"0": "RuntimeError: CUDA error: an illegal memory access"})
    )
    assert errors.status == "fail"
    assert "GPU 0: GEMM failed under load (RuntimeError" in errors.summary
    hung = StressOutcome(
        "python3", 60.0, failure=probe_mod.TIMEOUT, message="the load did not end within 120 s"
    )
    result = stress.check_stress(hung)
    assert result.status == "fail"
    assert result.summary == "the load test did not finish: the load did not end within 120 s"


def test_without_cuda_or_without_a_run_it_skips():
    assert stress.check_stress(None).status == "skip"
    assert stress.check_stress(run(windows=())).status == "skip"
    assert stress.check_stress(run(facts=None)).status == "skip"


def test_without_nvml_samples_the_gemm_rate_is_still_judged():
    no_samples = run(samples=(), rates=[800.0] * 11 + [600.0])
    result = stress.check_stress(no_samples)
    assert result.status == "warn"
    assert "GEMM rate fell" in result.summary


def test_the_series_is_thinned_to_a_bounded_size():
    result = stress.check_stress(run(seconds=600))
    series = result.details["series"]
    assert len(series) == SERIES_MAX_POINTS
    assert (series[0]["t_s"], series[-1]["t_s"]) == (0.0, 600.0)
    short = stress.check_stress(run(seconds=20))
    assert len(short.details["series"]) == 21
