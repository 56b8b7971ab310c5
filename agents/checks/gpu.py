"""Checks over the NVML snapshot: nvml, driver, identity, leftover_memory, ecc, row_remap,
throttle, temperature, power_cap, pcie. Pure functions of a StatusSnapshot."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

from agents import specs
from agents.checks.common import (
    FAIL,
    GIB,
    N_,
    PASS,
    SKIP,
    WARN,
    Message,
    Text,
    gib,
    gpu_list,
    joined,
    make,
    per_gpu,
    skip_without_nvml,
)
from agents.protocol import GpuSnapshot, HealthCheck, ProcessSnapshot, StatusSnapshot

#: Drivers older than this branch run CUDA 11 at most; current PyTorch wheels need CUDA 12.
DRIVER_OLD_BELOW_MAJOR = 525
#: Memory in use on an idle GPU above which it is reported as held (bytes; "> 1 GiB").
LEFTOVER_BYTES = 1 * GIB
#: GPU temperature thresholds in °C: warn at or above the first, fail at or above the second.
TEMP_WARN_C = 85
TEMP_FAIL_C = 95
#: An enforced power limit below this fraction of the default limit is a power-capped card.
POWER_CAP_MIN_FRACTION = 0.9
#: GPU utilisation (%) at or above which a PCIe link should be at full speed.
PCIE_BUSY_UTIL_PCT = 50

# Clock-event (throttle) reasons by normalised name (lower case, letters only).
_THROTTLE_FAIL = {
    "hwslowdown": "hardware slowdown",
    "hwthermalslowdown": "hardware thermal slowdown",
    "hwthermal": "hardware thermal slowdown",
    "hwpowerbrakeslowdown": "hardware power brake",
    "hwpowerbrake": "hardware power brake",
}
_THROTTLE_WARN = {
    "swthermalslowdown": "software thermal slowdown",
    "swthermal": "software thermal slowdown",
}
_THROTTLE_IGNORED = frozenset(
    {
        "gpuidle",
        "idle",
        "applicationsclockssetting",
        "appclocks",
        "applicationsclocks",
        "swpowercap",
        "syncboost",
        "displayclocksetting",
        "displayclock",
        "none",
    }
)


def check_nvml(status: StatusSnapshot) -> HealthCheck:
    """NVML loads and sees at least one GPU."""
    error = status.nvml_error
    if error is not None:
        return make(
            "nvml",
            FAIL,
            N_("NVML failed ({code}): {message}", code=error.code, message=error.message),
            error.hint,
            {"code": error.code},
        )
    if not status.gpus:
        return make(
            "nvml",
            FAIL,
            N_("NVML works but reports no GPU"),
            N_(
                "This machine has no GPU attached, or all of them are hidden from it: ask the "
                "provider for the GPUs you are paying for."
            ),
            {"gpu_count": 0},
        )
    return make(
        "nvml",
        PASS,
        N_("NVML sees {n_gpus} GPU(s)", n_gpus=len(status.gpus)),
        "",
        {"gpu_count": len(status.gpus)},
    )


def check_driver(status: StatusSnapshot) -> HealthCheck:
    """The driver reports a version; warn when it predates R525 (no CUDA 12)."""
    driver = status.driver
    if driver is None:
        return make("driver", SKIP, N_("skipped: no driver information (see the nvml check)"))
    details = {"version": driver.version, "cuda_version": driver.cuda_version}
    major = _leading_int(driver.version)
    if major is None:
        return make(
            "driver",
            WARN,
            N_("driver version {version} is not in the usual form", version=f"{driver.version!r}"),
            N_("Check the driver with `nvidia-smi`; reinstall it if the version looks wrong."),
            details,
        )
    if major < DRIVER_OLD_BELOW_MAJOR:
        return make(
            "driver",
            WARN,
            N_(
                "driver {version} is old: it runs CUDA {value} at most",
                version=driver.version,
                value=driver.cuda_version or "11",
            ),
            N_(
                "Current PyTorch wheels need CUDA 12 (driver 525.60.13 or newer). Pick an image "
                "with a newer driver, or install a torch built for CUDA 11 (cu118)."
            ),
            details,
        )
    if driver.cuda_version:
        summary = N_(
            "driver {version}, CUDA up to {cuda}", version=driver.version, cuda=driver.cuda_version
        )
    else:
        summary = N_("driver {version}", version=driver.version)
    return make("driver", PASS, summary, "", details)


def check_identity(
    status: StatusSnapshot, expect_gpu: Optional[str], expect_count: Optional[int]
) -> HealthCheck:
    """The GPUs are the rented model (name, memory, SM count) and number."""
    if expect_gpu is None and expect_count is None:
        return make(
            "identity", SKIP, N_("skipped: nothing expected (pass --expect-gpu/--expect-count)")
        )
    if status.nvml_error is not None:
        return make(
            "identity",
            FAIL,
            N_("cannot see the GPUs to compare with what was rented (NVML failed)"),
            N_("Fix NVML first (see the nvml check), then run the health check again."),
        )
    problems: List[Message] = []
    warnings: List[Tuple[Message, Message]] = []  # (what, what to do)
    wanted = specs.candidates(expect_gpu) if expect_gpu else ()
    if expect_gpu and not wanted:
        warnings.append(
            (
                N_(
                    "{expect_gpu} is not in the GPU catalogue, so only the count was compared",
                    expect_gpu=f"{expect_gpu!r}",
                ),
                N_("Name the model as the catalogue does, e.g. h100, a100-80gb, 4090 or l40s."),
            )
        )
    _compare_count(len(status.gpus), expect_count, problems, warnings)
    seen = {g.index: _describe_gpu(g) for g in status.gpus}
    if wanted:
        problems.extend(_model_problems(status.gpus, wanted, expect_gpu or ""))
    mig = [g.index for g in status.gpus if g.mig_mode]
    if mig and not problems:
        warnings.append(
            (
                N_(
                    "{gpu_list} in MIG mode: programs get MIG slices, not whole GPUs",
                    gpu_list=gpu_list(mig),
                ),
                N_(
                    "If you rented whole GPUs, ask the provider to turn MIG off "
                    "(`sudo nvidia-smi -i N -mig 0`, then reset the GPU)."
                ),
            )
        )
    details = {
        "expected_gpu": expect_gpu,
        "expected_keys": [s.key for s in wanted],
        "expected_count": expect_count,
        "gpu_count": len(status.gpus),
        "gpus": per_gpu(seen),
    }
    if problems:
        return make(
            "identity",
            FAIL,
            joined("; ", problems),
            N_(
                "This is not what was rented: ask the provider for the right GPUs (or a refund) "
                "before paying for more hours."
            ),
            details,
        )
    if warnings:
        return make(
            "identity",
            WARN,
            joined("; ", [text for text, _ in warnings]),
            joined(" ", [hint for _, hint in warnings]),
            details,
        )
    model = status.gpus[0].name if status.gpus else "GPU"
    return make(
        "identity",
        PASS,
        N_("{n_gpus} x {model} as rented", n_gpus=len(status.gpus), model=model),
        "",
        details,
    )


def _compare_count(
    count: int,
    expect_count: Optional[int],
    problems: List[Message],
    warnings: List[Tuple[Message, Message]],
) -> None:
    if expect_count is None:
        return
    if count < expect_count:
        problems.append(
            N_(
                "{count} GPU(s) visible, {expect_count} rented",
                count=count,
                expect_count=expect_count,
            )
        )
    elif count > expect_count:
        warnings.append(
            (
                N_(
                    "{count} GPUs visible, {expect_count} rented",
                    count=count,
                    expect_count=expect_count,
                ),
                N_("Check the provider's bill: you may be paying for every GPU you can see."),
            )
        )


def _model_problems(
    gpus: Sequence[GpuSnapshot], wanted: Sequence[specs.GpuSpec], expect_gpu: str
) -> List[str]:
    """What is wrong with each GPU, GPUs with the same finding named together
    ("GPUs 0, 1 are NVIDIA V100 SXM2 16GB (16.0 GiB, 80 SMs), not h100")."""
    keys = {s.key for s in wanted}
    found_by: Dict[Tuple[str, str], List[int]] = {}  # (verb, rest) -> GPU indexes
    for gpu in gpus:
        for verb, rest in _gpu_problems(gpu, keys, expect_gpu):
            found_by.setdefault((verb, rest), []).append(gpu.index)
    plural = {"is": "are", "has": "have"}
    return [
        f"{gpu_list(indexes)} {verb if len(indexes) == 1 else plural[verb]} {rest}"
        for (verb, rest), indexes in found_by.items()
    ]


def _gpu_problems(gpu: GpuSnapshot, keys: Set[str], expect_gpu: str) -> List[Tuple[str, str]]:
    """(verb, rest of the sentence) for each way one GPU differs from the rented model."""
    found = specs.match(gpu.name, gpu.mem_total_bytes, gpu.sm_count)
    if found is None and " mig " in f" {gpu.name.lower()} ":
        return [("is", f"a MIG slice ({gpu.name}, {_short(gpu)}), not a whole {expect_gpu}")]
    if found is None or found.key not in keys:
        what = found.name if found is not None else gpu.name
        return [("is", f"{what} ({_short(gpu)}), not {expect_gpu}")]
    problems: List[Tuple[str, str]] = []
    if gpu.mem_total_bytes is not None and gpu.mem_total_bytes < found.mem_min_bytes:
        problems.append(
            ("has", f"{gib(gpu.mem_total_bytes)} of the {found.mem_gb} GB a {found.name} has")
        )
    if gpu.sm_count is not None and gpu.sm_count != found.sm_count:
        problems.append(
            (
                "has",
                f"{gpu.sm_count} SMs, a {found.name} has {found.sm_count} "
                "(a MIG slice or a cut-down card)",
            )
        )
    return problems


def _describe_gpu(gpu: GpuSnapshot) -> Dict[str, object]:
    found = specs.match(gpu.name, gpu.mem_total_bytes, gpu.sm_count)
    return {
        "name": gpu.name,
        "mem_total_bytes": gpu.mem_total_bytes,
        "sm_count": gpu.sm_count,
        "catalogue_key": found.key if found is not None else None,
    }


def _short(gpu: GpuSnapshot) -> str:
    sms = f", {gpu.sm_count} SMs" if gpu.sm_count is not None else ""
    return f"{gib(gpu.mem_total_bytes)}{sms}"


def check_leftover_memory(status: StatusSnapshot) -> HealthCheck:
    """No foreign process and no more than LEFTOVER_BYTES in use on any GPU before a job."""
    skipped = skip_without_nvml("leftover_memory", status)
    if skipped is not None:
        return skipped
    foreign = [p for p in status.processes if p.job_id is None]
    job_bytes: Dict[int, int] = {}
    for proc in status.processes:
        if proc.job_id is not None:
            job_bytes[proc.gpu_index] = job_bytes.get(proc.gpu_index, 0) + (
                proc.used_mem_bytes or 0
            )
    on_gpus = {p.gpu_index for p in foreign}
    # Memory above the threshold that no listed process explains.
    held = {
        g.index: g.mem_used_bytes
        for g in status.gpus
        if g.mem_used_bytes is not None
        and g.index not in on_gpus
        and g.mem_used_bytes - job_bytes.get(g.index, 0) > LEFTOVER_BYTES
    }
    details = {
        "mem_used_bytes": per_gpu({g.index: g.mem_used_bytes for g in status.gpus}),
        "processes": [_process_details(p) for p in foreign],
        "held_without_process": per_gpu(held),
        "threshold_bytes": LEFTOVER_BYTES,
    }
    found: List[Message] = []
    hints: List[Message] = []
    if foreign:
        described = [_describe_process(p) for p in foreign[:5]]
        if len(foreign) > 5:
            described.append(N_("and {n} more", n=len(foreign) - 5))
        found.append(
            N_(
                "{n_foreign} process(es) already use the GPUs: {listed}{more}",
                n_foreign=len(foreign),
                listed=joined("; ", described),
                more="",
            )
        )
        hints.append(
            N_(
                "If they are yours and finished, stop them (`kill PID`). If not, someone else is "
                "using this machine: ask the provider."
            )
        )
    if held:
        where = ", ".join(f"GPU {i}: {gib(b)}" for i, b in sorted(held.items()))
        found.append(N_("memory in use with no process visible ({where})", where=where))
        hints.append(
            N_(
                "Memory held with no process listed belongs to a process in another container or "
                "PID namespace (run `nvidia-smi` on the host) or was left by a crashed job: reset "
                "the GPU when idle (`sudo nvidia-smi -r -i N`) or ask the provider."
            )
        )
    if found:
        return make("leftover_memory", WARN, joined("; ", found), joined(" ", hints), details)
    return make(
        "leftover_memory", PASS, N_("no memory held and no other process on the GPUs"), "", details
    )


def _describe_process(proc: ProcessSnapshot) -> Text:
    return N_(
        "pid {pid} ({user}: {command}) on GPU {gpu} holding {held}",
        pid=proc.pid,
        user=proc.user or "?",
        command=(proc.command or "?")[:60],
        gpu=proc.gpu_index,
        held=gib(proc.used_mem_bytes),
    )


def _process_details(proc: ProcessSnapshot) -> Dict[str, object]:
    return {
        "gpu_index": proc.gpu_index,
        "pid": proc.pid,
        "user": proc.user,
        "command": proc.command,
        "used_mem_bytes": proc.used_mem_bytes,
    }


def check_ecc(status: StatusSnapshot) -> HealthCheck:
    """No uncorrected (volatile) ECC errors; skip where ECC is off or unsupported."""
    skipped = skip_without_nvml("ecc", status)
    if skipped is not None:
        return skipped
    counts = {g.index: g.ecc_uncorrected_volatile for g in status.gpus}
    details = {"uncorrected_volatile": per_gpu(counts)}
    bad = {i: n for i, n in counts.items() if n is not None and n > 0}
    if bad:
        where = ", ".join(f"GPU {i}: {n}" for i, n in sorted(bad.items()))
        return make(
            "ecc",
            FAIL,
            N_("uncorrected ECC errors since the last reset ({where})", where=where),
            N_(
                "Results computed on this GPU may be corrupt. Stop using it and ask the provider "
                "to "
                "replace it; a reset (`nvidia-smi -r`) clears the counter but not the cause."
            ),
            details,
        )
    supported = [
        g
        for g in status.gpus
        if g.ecc_mode_enabled is True or g.ecc_uncorrected_volatile is not None
    ]
    if not supported:
        return make("ecc", SKIP, N_("ECC is off or not supported on these GPUs"), "", details)
    return make(
        "ecc",
        PASS,
        N_("no uncorrected ECC errors on {n_supported} GPU(s)", n_supported=len(supported)),
        "",
        details,
    )


def check_row_remap(status: StatusSnapshot) -> HealthCheck:
    """Row remapping (Ampere+) has not failed or left remaps pending; no retired pages pending."""
    skipped = skip_without_nvml("row_remap", status)
    if skipped is not None:
        return skipped
    gpus = status.gpus
    details = {
        "remapped_rows_pending": per_gpu({g.index: g.remapped_rows_pending for g in gpus}),
        "remapped_rows_failure": per_gpu({g.index: g.remapped_rows_failure for g in gpus}),
        "retired_pages_pending": per_gpu({g.index: g.retired_pages_pending for g in gpus}),
    }
    failed = [g.index for g in gpus if g.remapped_rows_failure]
    if failed:
        return make(
            "row_remap",
            FAIL,
            N_(
                "{gpu_list}: memory row remapping failed (no spare rows left)",
                gpu_list=gpu_list(failed),
            ),
            N_("The GPU memory is wearing out: ask the provider to replace the GPU."),
            details,
        )
    pending = [g.index for g in gpus if g.remapped_rows_pending or g.retired_pages_pending]
    if pending:
        return make(
            "row_remap",
            WARN,
            N_(
                "{gpu_list}: bad memory rows/pages are waiting to be retired",
                gpu_list=gpu_list(pending),
            ),
            N_(
                "Reset the GPU (`sudo nvidia-smi -r -i N` when idle) or reboot to apply them; ask "
                "the provider if you cannot."
            ),
            details,
        )
    known = [
        g
        for g in gpus
        if g.remapped_rows_pending is not None
        or g.remapped_rows_failure is not None
        or g.retired_pages_pending is not None
    ]
    if not known:
        return make("row_remap", SKIP, N_("not reported by these GPUs"), "", details)
    return make("row_remap", PASS, N_("no pending or failed memory remaps"), "", details)


def check_throttle(status: StatusSnapshot) -> HealthCheck:
    """No hardware slowdown, thermal or power-brake clock events; idle and app reasons ignored."""
    skipped = skip_without_nvml("throttle", status)
    if skipped is not None:
        return skipped
    reported = {g.index: g.clock_event_reasons for g in status.gpus}
    details = {
        "reasons": per_gpu({i: list(r) if r is not None else None for i, r in reported.items()})
    }
    if all(r is None for r in reported.values()):
        return make("throttle", SKIP, N_("clock event reasons not reported"), "", details)
    severe, mild = _classify_reasons(reported)
    if severe:
        return make(
            "throttle",
            FAIL,
            N_("clocks cut by the hardware: {reasons}", reasons=_reason_text(severe)),
            N_(
                "The GPU is overheating or its power supply is braking it, even before any job: "
                "ask the provider to check cooling and power, or move to another machine."
            ),
            details,
        )
    if mild:
        return make(
            "throttle",
            WARN,
            N_("clocks lowered by the driver: {reasons}", reasons=_reason_text(mild)),
            N_(
                "The GPU runs hot: check the temperature check and the fans/airflow; expect lower "
                "speed until it cools."
            ),
            details,
        )
    return make("throttle", PASS, N_("no hardware, thermal or power-brake slowdown"), "", details)


def _classify_reasons(
    reported: Dict[int, Optional[Tuple[str, ...]]],
) -> Tuple[Dict[int, List[str]], Dict[int, List[str]]]:
    severe: Dict[int, List[str]] = {}
    mild: Dict[int, List[str]] = {}
    for index, reasons in reported.items():
        for reason in reasons or ():
            key = normalise_reason(reason)
            if key in _THROTTLE_FAIL:
                severe.setdefault(index, []).append(_THROTTLE_FAIL[key])
            elif key in _THROTTLE_WARN:
                mild.setdefault(index, []).append(_THROTTLE_WARN[key])
    return severe, mild


def normalise_reason(reason: str) -> str:
    """A clock event reason name in any spelling ("HwSlowdown", "hw_slowdown",
    "clocks_event_reason_hw_slowdown") reduced to lower-case letters: "hwslowdown"."""
    text = re.sub(r"[^a-z]", "", reason.lower())
    for prefix in (
        "nvmlclockseventreason",
        "nvmlclocksthrottlereason",
        "clockseventreason",
        "clocksthrottlereason",
        "throttlereason",
        "eventreason",
    ):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def _reason_text(found: Dict[int, List[str]]) -> str:
    return "; ".join(f"GPU {i}: {', '.join(sorted(set(r)))}" for i, r in sorted(found.items()))


def check_temperature(status: StatusSnapshot) -> HealthCheck:
    """GPU core temperature: warn at TEMP_WARN_C °C and above, fail at TEMP_FAIL_C °C and above."""
    skipped = skip_without_nvml("temperature", status)
    if skipped is not None:
        return skipped
    temps = {g.index: g.temp_c for g in status.gpus if g.temp_c is not None}
    details = {"temp_c": per_gpu(temps), "warn_c": TEMP_WARN_C, "fail_c": TEMP_FAIL_C}
    if not temps:
        return make("temperature", SKIP, N_("temperature not reported"), "", details)
    hottest = max(temps.values())
    hot = ", ".join(f"GPU {i}: {t} °C" for i, t in sorted(temps.items()) if t >= TEMP_WARN_C)
    if hottest >= TEMP_FAIL_C:
        return make(
            "temperature",
            FAIL,
            N_("GPU too hot ({hot})", hot=hot),
            N_(
                "The cooling is failing: stop jobs on it and ask the provider to check the machine."
            ),
            details,
        )
    if hottest >= TEMP_WARN_C:
        return make(
            "temperature",
            WARN,
            N_("GPU running hot ({hot})", hot=hot),
            N_(
                "Expect thermal slowdown; if it is this hot while idle, ask the provider to check "
                "the cooling."
            ),
            details,
        )
    return make("temperature", PASS, N_("hottest GPU {hottest} °C", hottest=hottest), "", details)


def check_power_cap(status: StatusSnapshot) -> HealthCheck:
    """The enforced power limit is at least POWER_CAP_MIN_FRACTION of the default limit."""
    skipped = skip_without_nvml("power_cap", status)
    if skipped is not None:
        return skipped
    pairs = {
        g.index: (g.power_limit_w, g.power_default_limit_w)
        for g in status.gpus
        if g.power_limit_w is not None and g.power_default_limit_w
    }
    details = {
        "power_limit_w": per_gpu({i: p[0] for i, p in pairs.items()}),
        "power_default_limit_w": per_gpu({i: p[1] for i, p in pairs.items()}),
    }
    if not pairs:
        return make("power_cap", SKIP, N_("power limits not reported"), "", details)
    capped = {
        i: (limit, default)
        for i, (limit, default) in pairs.items()
        if default is not None and limit < POWER_CAP_MIN_FRACTION * default
    }
    if capped:
        where = ", ".join(
            f"GPU {i}: {limit:.0f} W of {default:.0f} W"
            for i, (limit, default) in sorted(capped.items())
        )
        return make(
            "power_cap",
            WARN,
            N_("power-capped card ({where})", where=where),
            N_(
                "Its power limit was lowered (`nvidia-smi -pl`), so it runs slower than the model "
                "should. Ask the provider, or restore it with `sudo nvidia-smi -pl <default W>` "
                "where allowed."
            ),
            details,
        )
    return make("power_cap", PASS, N_("power limits at their defaults"), "", details)


def check_pcie(status: StatusSnapshot) -> HealthCheck:
    """PCIe link at its full width, and at its full generation when the GPU is busy.

    Links drop to a lower generation when idle, so a lower generation with utilisation below
    PCIE_BUSY_UTIL_PCT % passes; a narrower link always warns.
    """
    skipped = skip_without_nvml("pcie", status)
    if skipped is not None:
        return skipped
    details = {
        "link": per_gpu(
            {
                g.index: {
                    "gen": g.pcie_gen_current,
                    "gen_max": g.pcie_gen_max,
                    "width": g.pcie_width_current,
                    "width_max": g.pcie_width_max,
                    "util_gpu_pct": g.util_gpu_pct,
                }
                for g in status.gpus
            }
        )
    }
    known = [g for g in status.gpus if _has_link_info(g)]
    if not known:
        return make("pcie", SKIP, N_("PCIe link not reported"), "", details)
    narrow, slow, idle_slow = _link_findings(known)
    if narrow or slow:
        return make(
            "pcie",
            WARN,
            joined("; ", narrow + slow),
            N_(
                "Host-to-GPU copies will be slower: the card may sit in a narrower or older slot, "
                "or a riser is faulty. Ask the provider if data loading matters to you."
            ),
            details,
        )
    note = f" ({'; '.join(idle_slow)}: normal when idle)" if idle_slow else ""
    return make("pcie", PASS, N_("PCIe links at full width{note}", note=note), "", details)


def _has_link_info(gpu: GpuSnapshot) -> bool:
    return (gpu.pcie_width_current is not None and gpu.pcie_width_max is not None) or (
        gpu.pcie_gen_current is not None and gpu.pcie_gen_max is not None
    )


def _link_findings(
    gpus: Sequence[GpuSnapshot],
) -> Tuple[List[Message], List[Message], List[str]]:
    narrow: List[Message] = []
    slow: List[Message] = []
    idle_slow: List[str] = []
    for g in gpus:
        if (
            g.pcie_width_current is not None
            and g.pcie_width_max is not None
            and g.pcie_width_current < g.pcie_width_max
        ):
            narrow.append(
                N_(
                    "GPU {index} link x{pcie_width_current} of x{pcie_width_max}",
                    index=g.index,
                    pcie_width_current=g.pcie_width_current,
                    pcie_width_max=g.pcie_width_max,
                )
            )
        if g.pcie_gen_current is None or g.pcie_gen_max is None:
            continue
        if g.pcie_gen_current < g.pcie_gen_max:
            text = f"GPU {g.index} at PCIe gen {g.pcie_gen_current} of {g.pcie_gen_max}"
            busy = g.util_gpu_pct is not None and g.util_gpu_pct >= PCIE_BUSY_UTIL_PCT
            (slow if busy else idle_slow).append(text + (" while busy" if busy else ""))
    return narrow, slow, idle_slow


def _leading_int(text: str) -> Optional[int]:
    match = re.match(r"\s*(\d+)", text)
    return int(match.group(1)) if match else None
