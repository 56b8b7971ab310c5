"""The --full checks: matmul (correctness), bandwidth and gemm (speed against the spec table).

Typical achievable fractions of the datasheet figure: device copy 85-92%; large bf16 GEMM
66-87% on datacenter cards and above 100% on GeForce cards that boost. Far below that the card
is shared, throttled or not the model it claims to be.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from agents import specs
from agents.checks.common import FAIL, N_, PASS, SKIP, WARN, Message, make
from agents.probe import TIMEOUT, Measurement, ProbeOutcome, TorchFacts
from agents.protocol import HealthCheck

#: Normwise relative error of the fp32 GPU product against the CPU: warn / fail at or above.
MATMUL_WARN_REL_ERROR = 1e-3
MATMUL_FAIL_REL_ERROR = 1e-2
#: Measured / spec below which the GPU is reported as slow.
BANDWIDTH_MIN_FRACTION = 0.6
GEMM_MIN_FRACTION = 0.5

_NO_CUDA = N_(
    "skipped: needs a CUDA build of torch that sees the GPUs (see torch_build, visibility)"
)


def check_matmul(full: Optional[ProbeOutcome]) -> HealthCheck:
    """The 4096x4096 fp32 product on each GPU matches the CPU's."""
    facts, early = _measured("matmul", full, lambda f: f.matmul)
    if early is not None:
        return early
    assert facts is not None
    assert facts.matmul is not None
    rows = {
        m.index: {"max_rel_error": m.value, "error": m.error, **dict(m.extra)} for m in facts.matmul
    }
    details = {
        "gpus": _keyed(rows),
        "warn_at": MATMUL_WARN_REL_ERROR,
        "fail_at": MATMUL_FAIL_REL_ERROR,
    }
    broken = [
        m for m in facts.matmul if m.error or m.value is None or m.value >= MATMUL_FAIL_REL_ERROR
    ]
    if broken:
        return make(
            "matmul",
            FAIL,
            N_(
                "wrong matrix product: {products}",
                products="; ".join(_matmul_text(m) for m in broken),
            ),
            N_(
                "This GPU computes wrong results: do not use it; ask the provider to replace it "
                "(check the ecc and row_remap checks too)."
            ),
            details,
        )
    loose = [m for m in facts.matmul if m.value is not None and m.value >= MATMUL_WARN_REL_ERROR]
    if loose:
        return make(
            "matmul",
            WARN,
            N_(
                "imprecise fp32 product: {products}",
                products="; ".join(_matmul_text(m) for m in loose),
            ),
            N_(
                "Reduced precision is forced somewhere (e.g. NVIDIA_TF32_OVERRIDE=1); unset it for "
                "exact fp32, or check the GPU if nothing forces it."
            ),
            details,
        )
    worst = max((m.value or 0.0) for m in facts.matmul)
    return make(
        "matmul",
        PASS,
        N_(
            "matrix product matches the CPU on {n_matmul} GPU(s) (max relative error {worst})",
            n_matmul=len(facts.matmul),
            worst=f"{worst:.1e}",
        ),
        "",
        details,
    )


def _matmul_text(m: Measurement) -> str:
    if m.error:
        return f"GPU {m.index}: {m.error}"
    if m.value is None:
        return f"GPU {m.index}: non-finite values"
    return f"GPU {m.index}: relative error {m.value:.1e}"


def check_bandwidth(full: Optional[ProbeOutcome]) -> HealthCheck:
    """Device copy GB/s against the spec; warn below BANDWIDTH_MIN_FRACTION of it."""
    facts, early = _measured("bandwidth", full, lambda f: f.bandwidth)
    if early is not None:
        return early
    assert facts is not None
    assert facts.bandwidth is not None
    return _against_spec(
        "bandwidth",
        facts,
        facts.bandwidth,
        unit="GB/s",
        minimum=BANDWIDTH_MIN_FRACTION,
        spec_value=lambda spec, _m: spec.bandwidth_gbps,
    )


def check_gemm(full: Optional[ProbeOutcome]) -> HealthCheck:
    """bf16 (fp16 before Ampere) GEMM TFLOP/s against the spec; warn below GEMM_MIN_FRACTION."""
    facts, early = _measured("gemm", full, lambda f: f.gemm)
    if early is not None:
        return early
    assert facts is not None
    assert facts.gemm is not None
    return _against_spec(
        "gemm",
        facts,
        facts.gemm,
        unit="TFLOP/s",
        minimum=GEMM_MIN_FRACTION,
        spec_value=_gemm_spec,
    )


def _gemm_spec(spec: specs.GpuSpec, m: Measurement) -> Optional[float]:
    return spec.fp16_tflops if m.extra.get("dtype") == "float16" else spec.bf16_tflops


def _measured(
    check_id: str, full: Optional[ProbeOutcome], pick: Any
) -> Tuple[Optional[TorchFacts], Optional[HealthCheck]]:
    """The facts holding the measurements, or the early result when there are none."""
    if full is None:
        return None, make(check_id, SKIP, _NO_CUDA)
    if full.failure is not None:
        what = "did not finish" if full.failure == TIMEOUT else "failed"
        return None, make(
            check_id,
            FAIL,
            (
                N_("the GPU tests did not finish: {message}", message=full.message)
                if what == "did not finish"
                else N_("the GPU tests failed: {message}", message=full.message)
            ),
            N_(
                "A GPU that hangs or crashes under a simple product needs a reset or a reboot; ask "
                "the provider if it persists. Allow more time with --timeout on slow GPUs."
            ),
            {"python": full.python, "failure": full.failure},
        )
    facts = full.facts
    if facts is None or pick(facts) is None:
        return None, make(check_id, SKIP, _NO_CUDA)
    return facts, None


def _against_spec(
    check_id: str,
    facts: TorchFacts,
    results: Tuple[Measurement, ...],
    *,
    unit: str,
    minimum: float,
    spec_value: Any,
) -> HealthCheck:
    rows: Dict[int, Dict[str, Any]] = {}
    slow: List[Message] = []
    failed: List[Message] = []
    for m in results:
        spec = _spec_for(facts, m.index)
        expected = spec_value(spec, m) if spec is not None else None
        ratio = m.value / expected if (m.value is not None and expected) else None
        rows[m.index] = {
            "measured": m.value,
            "spec": expected,
            "fraction_of_spec": None if ratio is None else round(ratio, 3),
            "gpu": spec.key if spec is not None else None,
            "error": m.error,
            **dict(m.extra),
        }
        if m.error or m.value is None:
            failed.append(N_("GPU {index}: {value}", index=m.index, value=m.error or "no result"))
        elif ratio is not None and ratio < minimum:
            slow.append(
                N_(
                    "GPU {index}: {value} {unit}, {ratio} of the {expected} spec",
                    index=m.index,
                    value=f"{m.value:.0f}",
                    unit=unit,
                    ratio=f"{ratio:.0%}",
                    expected=f"{expected:.0f}",
                )
            )
    details = {"gpus": _keyed(rows), "unit": unit, "min_fraction_of_spec": minimum}
    if failed:
        return make(
            check_id,
            FAIL,
            N_("measurement failed: {failures}", failures="; ".join(map(str, failed))),
            N_("The GPU failed a simple workload: reset it or ask the provider."),
            details,
        )
    if slow:
        return make(
            check_id,
            WARN,
            N_("far below spec: {gpus}", gpus="; ".join(map(str, slow))),
            N_(
                "The GPU is shared (oversold or a MIG slice), throttled (see throttle, "
                "temperature, "
                "power_cap) or not the model it claims to be (see identity)."
            ),
            details,
        )
    return make(
        check_id,
        PASS,
        "; ".join(_pass_text(i, r, unit) for i, r in sorted(rows.items())),
        "",
        details,
    )


def _pass_text(index: int, row: Dict[str, Any], unit: str) -> str:
    measured = f"GPU {index}: {row['measured']:.0f} {unit}"
    ratio = row["fraction_of_spec"]
    return (
        f"{measured} ({ratio:.0%} of spec)" if ratio is not None else f"{measured} (no spec figure)"
    )


def _spec_for(facts: TorchFacts, index: int) -> Optional[specs.GpuSpec]:
    for device in facts.devices:
        if device.index == index:
            return specs.match(device.name, device.total_memory_bytes, device.sm_count)
    return None


def _keyed(rows: Dict[int, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    return {str(i): row for i, row in sorted(rows.items())}
