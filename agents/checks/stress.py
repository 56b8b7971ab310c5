"""The stress check (``health --stress DURATION``): minutes of GEMM load, judged from NVML
samples of clocks, temperature, power and throttle reasons taken meanwhile, and from the GEMM
rate per window. Seconds-long tests miss a card that slows down once it is hot.
"""

from __future__ import annotations

from statistics import median
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from agents.checks.common import FAIL, N_, PASS, SKIP, WARN, Message, joined, make
from agents.checks.gpu import TEMP_FAIL_C, TEMP_WARN_C
from agents.probe import TIMEOUT, StressOutcome
from agents.protocol import HealthCheck

#: Relative fall of the SM clock or the GEMM rate, from the start of the load to its end, at
#: or above which the card is reported as slowing down.
STRESS_DROP_WARN = 0.10
#: Samples taken before this many seconds of load (or a quarter of the run) are warm-up.
STRESS_WARMUP_S = 5.0
#: Most points of the time series kept in the details.
SERIES_MAX_POINTS = 60

#: Clock-event reasons that fail the check when seen under load, and those that warn.
_HW_REASONS = {
    "hw_slowdown": "hardware slowdown",
    "hw_thermal_slowdown": "hardware thermal slowdown",
    "hw_power_brake_slowdown": "power brake",
}
_WARN_REASONS = {"sw_thermal_slowdown": "software thermal slowdown"}

_NO_CUDA = N_(
    "skipped: needs a CUDA build of torch that sees the GPUs (see torch_build, visibility)"
)
_HW_HINT = N_(
    "Under sustained load the card is slowed by its own protection: power brake means the "
    "host's power supply signalled it cannot deliver; hardware thermal slowdown means cooling "
    "fails. Both are the host's fault: ask the provider to move you to another host, and do "
    "not pay full price for this one."
)
_HOT_HINT = N_(
    "The card runs hot under load and slows down: check that its fans spin and the air intake "
    "is clear (on a rented host, ask the provider); long jobs will run slower than "
    "benchmarks promise."
)


def check_stress(stress: Optional[StressOutcome]) -> HealthCheck:
    """Fail for hardware slowdown, power brake, a GEMM error or a temperature at TEMP_FAIL_C
    under load; warn for software thermal slowdown, TEMP_WARN_C, or an SM clock or GEMM rate
    that falls by STRESS_DROP_WARN or more from the start to the end."""
    if stress is None:
        return make("stress", SKIP, _NO_CUDA)
    if stress.failure is not None:
        what = "did not finish" if stress.failure == TIMEOUT else "failed"
        return make(
            "stress",
            FAIL,
            (
                N_("the load test did not finish: {message}", message=stress.message)
                if what == "did not finish"
                else N_("the load test failed: {message}", message=stress.message)
            ),
            N_(
                "A GPU that hangs or crashes under sustained load needs a reset or a reboot; ask "
                "the provider if it persists."
            ),
            {"duration_s": stress.duration_s, "samples": len(stress.samples)},
        )
    if stress.facts is None or not stress.windows:
        return make("stress", SKIP, _NO_CUDA)
    warmup = min(STRESS_WARMUP_S, stress.duration_s / 4)
    indices = sorted(
        {int(k) for w in stress.windows for k in w.get("tflops", {})}
        | {int(k) for k in stress.errors}
    )
    per_gpu = {i: _gpu_summary(i, stress, warmup) for i in indices}
    details: Dict[str, Any] = {
        "duration_s": stress.duration_s,
        "dtype": stress.dtype,
        "n": stress.n,
        "gpus": {str(i): s for i, s in per_gpu.items()},
        "series": _series(stress.samples),
        "drop_warn": STRESS_DROP_WARN,
        "temp_warn_c": TEMP_WARN_C,
        "temp_fail_c": TEMP_FAIL_C,
    }
    failures, warnings, hints = _judge(per_gpu, stress.errors)
    hint = joined(" ", list(dict.fromkeys(hints)))
    if failures:
        return make("stress", FAIL, joined("; ", failures + warnings), hint, details)
    if warnings:
        return make("stress", WARN, joined("; ", warnings), hint, details)
    return make(
        "stress", PASS, "; ".join(_pass_text(i, s, stress) for i, s in per_gpu.items()), "", details
    )


def _gpu_summary(index: int, stress: StressOutcome, warmup: float) -> Dict[str, Any]:
    """What one GPU did under load: GEMM rate first/last/min, SM clock early/late (medians of
    the first and last thirds of the loaded samples), temperature and power, and the fraction
    of loaded samples showing each clock-event reason."""
    rates = [
        float(w["tflops"][str(index)]) for w in stress.windows if str(index) in w.get("tflops", {})
    ]
    loaded = [
        (float(s["t_s"]), g)
        for s in stress.samples
        if float(s["t_s"]) >= warmup
        for g in s.get("gpus") or ()
        if g.get("index") == index
    ]
    clocks = [g["sm_clock_mhz"] for _, g in loaded if g.get("sm_clock_mhz") is not None]
    third = max(1, len(clocks) // 3)
    temps = [g["temp_c"] for _, g in loaded if g.get("temp_c") is not None]
    power = [g["power_draw_w"] for _, g in loaded if g.get("power_draw_w") is not None]
    reasons: Dict[str, float] = {}
    with_reasons = [g for _, g in loaded if g.get("clock_event_reasons") is not None]
    for g in with_reasons:
        for name in g["clock_event_reasons"]:
            reasons[name] = reasons.get(name, 0.0) + 1.0 / len(with_reasons)
    return {
        "tflops_first": rates[0] if rates else None,
        "tflops_last": rates[-1] if rates else None,
        "tflops_max": max(rates) if rates else None,
        "tflops_min": min(rates) if rates else None,
        "sm_clock_early_mhz": median(clocks[:third]) if clocks else None,
        "sm_clock_late_mhz": median(clocks[-third:]) if clocks else None,
        "temp_max_c": max(temps) if temps else None,
        "power_max_w": max(power) if power else None,
        "power_mean_w": round(sum(power) / len(power), 1) if power else None,
        "reasons": {k: round(v, 3) for k, v in sorted(reasons.items())},
        "samples": len(loaded),
    }


def _judge(
    per_gpu: Mapping[int, Mapping[str, Any]], errors: Mapping[str, str]
) -> Tuple[List[Message], List[Message], List[Message]]:
    failures: List[Message] = []
    warnings: List[Message] = []
    hints: List[Message] = []
    for key, error in sorted(errors.items()):
        failures.append(N_("GPU {key}: GEMM failed under load ({error})", key=key, error=error))
        hints.append(N_("The GPU failed under load: reset it or ask the provider."))
    for index, s in per_gpu.items():
        seen_hw = [text for name, text in _HW_REASONS.items() if s["reasons"].get(name)]
        if seen_hw:
            failures.append(
                N_("GPU {index}: {seen_hw} under load", index=index, seen_hw=", ".join(seen_hw))
            )
            hints.append(_HW_HINT)
        temp = s["temp_max_c"]
        if temp is not None and temp >= TEMP_FAIL_C:
            failures.append(N_("GPU {index}: reached {temp} °C", index=index, temp=temp))
            hints.append(_HOT_HINT)
        elif temp is not None and temp >= TEMP_WARN_C:
            warnings.append(N_("GPU {index}: reached {temp} °C", index=index, temp=temp))
            hints.append(_HOT_HINT)
        seen_sw = [text for name, text in _WARN_REASONS.items() if s["reasons"].get(name)]
        if seen_sw:
            warnings.append(
                N_("GPU {index}: {seen_sw} under load", index=index, seen_sw=", ".join(seen_sw))
            )
            hints.append(_HOT_HINT)
        for what, early, late, unit in (
            ("SM clock", s["sm_clock_early_mhz"], s["sm_clock_late_mhz"], "MHz"),
            ("GEMM rate", s["tflops_max"], s["tflops_last"], "TFLOP/s"),
        ):
            drop = _drop(early, late)
            if drop is not None and drop >= STRESS_DROP_WARN:
                warnings.append(
                    N_(
                        "GPU {index}: {what} fell from {early} to {late} {unit} ({drop})",
                        index=index,
                        what=what,
                        early=f"{early:.0f}",
                        late=f"{late:.0f}",
                        unit=unit,
                        drop=f"{drop:.0%}",
                    )
                )
                hints.append(_HOT_HINT)
    return failures, warnings, hints


def _drop(early: Optional[float], late: Optional[float]) -> Optional[float]:
    if early is None or late is None or early <= 0:
        return None
    return (early - late) / early


def _pass_text(index: int, s: Mapping[str, Any], stress: StressOutcome) -> str:
    parts = [f"GPU {index}: {stress.duration_s:g} s"]
    if s["tflops_min"] is not None:
        parts.append(f"{s['tflops_min']:.0f}-{s['tflops_max']:.0f} TFLOP/s")
    if s["sm_clock_late_mhz"] is not None:
        parts.append(f"SM clock {s['sm_clock_late_mhz']:.0f} MHz at the end")
    if s["temp_max_c"] is not None:
        parts.append(f"max {s['temp_max_c']} °C")
    if s["power_max_w"] is not None:
        parts.append(f"up to {s['power_max_w']:.0f} W")
    cap = s["reasons"].get("sw_power_cap")
    if cap:
        parts.append(f"at its power cap {cap:.0%} of the time")
    return ", ".join(parts)


def _series(samples: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """At most SERIES_MAX_POINTS samples, evenly spread, first and last kept."""
    if len(samples) <= SERIES_MAX_POINTS:
        picked = list(samples)
    else:
        step = (len(samples) - 1) / (SERIES_MAX_POINTS - 1)
        picked = [samples[round(i * step)] for i in range(SERIES_MAX_POINTS)]
    return [{"t_s": s["t_s"], "gpus": list(s.get("gpus") or ())} for s in picked]
