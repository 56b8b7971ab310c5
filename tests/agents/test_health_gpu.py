"""NVML-snapshot checks at every threshold edge: nvml, driver, identity, leftover_memory, ecc,
row_remap, throttle, temperature, power_cap, pcie."""

from __future__ import annotations

from typing import Any

import pytest

from agents.checks import gpu
from tests.agents.factories import (
    GIB,
    MIB,
    make_driver,
    make_gpu,
    make_nvml_error,
    make_process,
    make_status,
)

NO_NVML = make_status(nvml_error=make_nvml_error())


# --- nvml / driver ----------------------------------------------------------------------------


def test_nvml_passes_with_gpus():
    result = gpu.check_nvml(make_status(n=8))
    assert (result.status, result.hint) == ("pass", "")
    assert result.details["gpu_count"] == 8
    assert "8 GPU" in result.summary


def test_nvml_error_fails_with_its_hint():
    error = make_nvml_error(
        "driver_library_mismatch",
        message="Driver/library version mismatch",
        hint="Reboot: the driver was upgraded.",
    )
    result = gpu.check_nvml(make_status(nvml_error=error))
    assert result.status == "fail"
    assert "driver_library_mismatch" in result.summary
    assert "Driver/library version mismatch" in result.summary
    assert result.hint == "Reboot: the driver was upgraded."


def test_nvml_without_gpus_fails():
    result = gpu.check_nvml(make_status(gpus=[]))
    assert result.status == "fail"
    assert result.hint


@pytest.mark.parametrize(
    ("version", "expected"),
    [("550.54.15", "pass"), ("525.60.13", "pass"), ("524.99", "warn"), ("470.223.02", "warn")],
)
def test_driver_age_edge(version, expected):
    result = gpu.check_driver(make_status(driver=make_driver(version=version)))
    assert result.status == expected
    assert result.details["version"] == version
    assert bool(result.hint) == (expected != "pass")


def test_driver_unknown_or_odd():
    assert gpu.check_driver(NO_NVML).status == "skip"
    assert gpu.check_driver(make_status(driver=make_driver(version="unknown"))).status == "warn"


# --- identity ---------------------------------------------------------------------------------


def test_identity_skips_when_nothing_is_expected():
    assert gpu.check_identity(make_status(), None, None).status == "skip"


def test_identity_passes_for_the_rented_model_and_count():
    result = gpu.check_identity(make_status(n=8), "h100", 8)
    assert result.status == "pass"
    assert result.details["gpus"]["0"]["catalogue_key"] == "h100-sxm"
    assert "8 x NVIDIA H100 80GB HBM3" in result.summary


def test_identity_accepts_any_variant_of_a_short_name():
    status = make_status(
        name="NVIDIA A100 80GB PCIe",
        mem_total_bytes=81920 * MIB,
        sm_count=108,
        compute_capability="8.0",
    )
    assert gpu.check_identity(status, "a100", None).status == "pass"
    assert gpu.check_identity(status, "A100 80GB", None).status == "pass"
    result = gpu.check_identity(status, "a100-sxm4-80gb", None)
    assert result.status == "fail"
    assert "not a100-sxm4-80gb" in result.summary


@pytest.mark.parametrize(("count", "expected"), [(7, "fail"), (8, "pass"), (9, "warn")])
def test_identity_count_edge(count, expected):
    result = gpu.check_identity(make_status(n=count), None, 8)
    assert result.status == expected


def test_identity_pcie_card_sold_as_sxm():
    status = make_status(name="NVIDIA H100 PCIe", sm_count=114)
    result = gpu.check_identity(status, "h100-sxm", 1)
    assert result.status == "fail"
    assert "GPU 0 is NVIDIA H100 PCIe" in result.summary
    assert result.hint


def test_identity_4090d_sold_as_4090_is_caught_by_sm_count():
    status = make_status(
        name="NVIDIA GeForce RTX 4090",
        mem_total_bytes=24564 * MIB,
        sm_count=114,
        compute_capability="8.9",
    )
    result = gpu.check_identity(status, "4090", None)
    assert result.status == "fail"
    assert "RTX 4090 D" in result.summary
    assert gpu.check_identity(status, "4090d", None).status == "pass"


def test_identity_memory_edge_five_percent_below_nominal():
    nominal = 80 * GIB
    at_edge = make_status(mem_total_bytes=int(nominal * 0.95))
    below = make_status(mem_total_bytes=int(nominal * 0.95) - 1)
    assert gpu.check_identity(at_edge, "h100", None).status == "pass"
    result = gpu.check_identity(below, "h100", None)
    assert result.status == "fail"
    assert "not h100" in result.summary  # too little memory for any H100: not the model


def test_identity_mig_slice_or_cut_down_card():
    status = make_status(sm_count=66)
    result = gpu.check_identity(status, "h100", None)
    assert result.status == "fail"
    assert "66 SMs" in result.summary


def test_identity_one_bad_gpu_among_eight():
    gpus = [make_gpu(i) for i in range(7)] + [
        make_gpu(7, name="NVIDIA A100-SXM4-80GB", mem_total_bytes=81920 * MIB, sm_count=108)
    ]
    result = gpu.check_identity(make_status(gpus), "h100", 8)
    assert result.status == "fail"
    assert "GPU 7" in result.summary
    assert "GPU 0" not in result.summary


def test_identity_unknown_model_warns_and_still_counts():
    assert gpu.check_identity(make_status(n=2), "b200", 2).status == "warn"
    assert gpu.check_identity(make_status(n=1), "b200", 2).status == "fail"


def test_identity_names_gpus_with_the_same_finding_together():
    status = make_status(n=8, name="Tesla V100-SXM2-16GB", mem_total_bytes=16160 * MIB, sm_count=80)
    result = gpu.check_identity(status, "h100", 8)
    assert result.status == "fail"
    assert result.summary.count("V100") == 1
    assert "GPUs 0, 1, 2, 3, 4, 5, 6, 7 are NVIDIA V100 SXM2 16GB" in result.summary
    assert result.summary.endswith("not h100")


def test_identity_calls_a_mig_device_a_slice():
    status = make_status(
        name="NVIDIA A100-SXM4-80GB MIG 3g.40gb", mem_total_bytes=40 * GIB, sm_count=42
    )
    result = gpu.check_identity(status, "a100-80gb", 1)
    assert result.status == "fail"
    assert "GPU 0 is a MIG slice (NVIDIA A100-SXM4-80GB MIG 3g.40gb" in result.summary
    assert "not a whole a100-80gb" in result.summary


@pytest.mark.parametrize(
    ("mig_mode", "expected"), [(None, "pass"), (False, "pass"), (True, "warn")]
)
def test_identity_warns_about_a_whole_gpu_in_mig_mode(mig_mode, expected):
    status = make_status(
        n=2,
        name="NVIDIA A100-SXM4-80GB",
        mem_total_bytes=81920 * MIB,
        sm_count=108,
        mig_mode=mig_mode,
    )
    result = gpu.check_identity(status, "a100", 2)
    assert result.status == expected
    if expected == "warn":
        assert "GPUs 0, 1 in MIG mode" in result.summary
        assert "`sudo nvidia-smi -i N -mig 0`" in result.hint


def test_identity_hints_fit_each_warning():
    extra = gpu.check_identity(make_status(n=9), "h100", 8)
    assert extra.status == "warn"
    assert "bill" in extra.hint
    assert "catalogue" not in extra.hint
    unknown = gpu.check_identity(make_status(n=1), "b200", None)
    assert unknown.status == "warn"
    assert "h100, a100-80gb" in unknown.hint
    assert "bill" not in unknown.hint


def test_identity_fails_without_nvml():
    result = gpu.check_identity(NO_NVML, "h100", 1)
    assert result.status == "fail"
    assert "nvml check" in result.hint


# --- leftover_memory --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("used", "expected"), [(GIB - 1, "pass"), (GIB, "pass"), (GIB + 1, "warn")]
)
def test_leftover_memory_edge_at_one_gib(used, expected):
    result = gpu.check_leftover_memory(make_status(mem_used_bytes=used))
    assert result.status == expected


def test_leftover_memory_names_foreign_processes():
    status = make_status(
        n=2, processes=[make_process(1, pid=777, user="bob", command="vllm serve")]
    )
    result = gpu.check_leftover_memory(status)
    assert result.status == "warn"
    assert "pid 777 (bob: vllm serve) on GPU 1 holding 10.0 GiB" in result.summary
    assert result.details["processes"][0]["pid"] == 777
    assert "kill" in result.hint


def test_leftover_memory_ignores_agent_jobs():
    status = make_status(
        mem_used_bytes=12 * GIB,
        processes=[make_process(0, used_mem_bytes=11 * GIB + 512 * MIB, job_id="j-1")],
    )
    assert gpu.check_leftover_memory(status).status == "pass"


def test_leftover_memory_without_visible_processes_mentions_containers():
    result = gpu.check_leftover_memory(make_status(mem_used_bytes=20 * GIB))
    assert result.status == "warn"
    assert "GPU 0: 20.0 GiB" in result.summary
    assert "container" in result.hint


def test_leftover_memory_reports_both_foreign_processes_and_unexplained_memory():
    gpus = [make_gpu(0, mem_used_bytes=30 * GIB), make_gpu(1, mem_used_bytes=10 * GIB), make_gpu(2)]
    procs = [make_process(0, pid=777, used_mem_bytes=30 * GIB)]
    result = gpu.check_leftover_memory(make_status(gpus, processes=procs))
    assert result.status == "warn"
    assert "pid 777" in result.summary
    assert "no process visible (GPU 1: 10.0 GiB)" in result.summary
    assert "GPU 0: 30" not in result.summary  # explained by pid 777
    assert result.details["held_without_process"] == {"1": 10 * GIB}
    assert "kill" in result.hint
    assert "container" in result.hint


def test_leftover_memory_lists_at_most_five():
    procs = [make_process(0, pid=100 + i) for i in range(7)]
    result = gpu.check_leftover_memory(make_status(processes=procs))
    assert "and 2 more" in result.summary
    assert len(result.details["processes"]) == 7


def test_gpu_checks_skip_without_nvml():
    for check in (
        gpu.check_leftover_memory,
        gpu.check_ecc,
        gpu.check_row_remap,
        gpu.check_throttle,
        gpu.check_temperature,
        gpu.check_power_cap,
        gpu.check_pcie,
    ):
        result = check(NO_NVML)
        assert result.status == "skip", check.__name__
        assert "NVML" in result.summary


# --- ecc / row_remap --------------------------------------------------------------------------


@pytest.mark.parametrize(("errors", "expected"), [(0, "pass"), (1, "fail"), (12, "fail")])
def test_ecc_uncorrected_edge(errors, expected):
    status = make_status(gpus=[make_gpu(0), make_gpu(1, ecc_uncorrected_volatile=errors)])
    result = gpu.check_ecc(status)
    assert result.status == expected
    if expected == "fail":
        assert f"GPU 1: {errors}" in result.summary


def test_ecc_unsupported_skips():
    status = make_status(ecc_mode_enabled=None, ecc_uncorrected_volatile=None)
    assert gpu.check_ecc(status).status == "skip"
    off = make_status(ecc_mode_enabled=False, ecc_uncorrected_volatile=None)
    assert gpu.check_ecc(off).status == "skip"


def test_row_remap_failure_fails_and_pending_warns():
    assert gpu.check_row_remap(make_status()).status == "pass"
    failed = gpu.check_row_remap(
        make_status(gpus=[make_gpu(0), make_gpu(1, remapped_rows_failure=True)])
    )
    assert failed.status == "fail"
    assert "GPU 1" in failed.summary
    pending = gpu.check_row_remap(make_status(remapped_rows_pending=True))
    assert pending.status == "warn"
    assert "reset" in pending.hint.lower()


def test_retired_pages_pending_on_volta_warns():
    volta: dict[str, Any] = {"remapped_rows_pending": None, "remapped_rows_failure": None}
    assert gpu.check_row_remap(make_status(retired_pages_pending=False, **volta)).status == "pass"
    assert gpu.check_row_remap(make_status(retired_pages_pending=True, **volta)).status == "warn"
    assert gpu.check_row_remap(make_status(retired_pages_pending=None, **volta)).status == "skip"


# --- throttle ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasons", "expected"),
    [
        ((), "pass"),
        (("gpu_idle",), "pass"),
        (
            ("gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"),
            "pass",
        ),
        (("sw_power_cap",), "pass"),
        (("sw_thermal_slowdown",), "warn"),
        (("hw_slowdown",), "fail"),
        (("hw_slowdown", "hw_thermal_slowdown"), "fail"),
        (("hw_slowdown", "hw_power_brake_slowdown"), "fail"),
        (("HwPowerBrake",), "fail"),
        (("0x8000",), "pass"),
    ],
)
def test_throttle_reasons(reasons, expected):
    result = gpu.check_throttle(make_status(clock_event_reasons=reasons))
    assert result.status == expected


def test_throttle_names_the_gpu_and_skips_when_unreported():
    status = make_status(
        gpus=[make_gpu(0), make_gpu(3, clock_event_reasons=("hw_thermal_slowdown",))]
    )
    result = gpu.check_throttle(status)
    assert "GPU 3: hardware thermal slowdown" in result.summary
    assert gpu.check_throttle(make_status(clock_event_reasons=None)).status == "skip"


def test_normalise_reason_spellings():
    assert gpu.normalise_reason("hw_power_brake_slowdown") == "hwpowerbrakeslowdown"
    assert gpu.normalise_reason("nvmlClocksEventReasonHwSlowdown") == "hwslowdown"
    assert gpu.normalise_reason("clocks_throttle_reason_sw_thermal_slowdown") == "swthermalslowdown"


# --- temperature / power_cap / pcie -----------------------------------------------------------


@pytest.mark.parametrize(
    ("temp", "expected"), [(84, "pass"), (85, "warn"), (94, "warn"), (95, "fail"), (101, "fail")]
)
def test_temperature_edges(temp, expected):
    status = make_status(gpus=[make_gpu(0, temp_c=40), make_gpu(1, temp_c=temp)])
    result = gpu.check_temperature(status)
    assert result.status == expected
    assert result.details["temp_c"]["1"] == temp
    if expected != "pass":
        assert f"GPU 1: {temp} °C" in result.summary


def test_temperature_not_reported_skips():
    assert gpu.check_temperature(make_status(temp_c=None)).status == "skip"


@pytest.mark.parametrize(
    ("limit", "expected"), [(700.0, "pass"), (630.0, "pass"), (629.9, "warn"), (300.0, "warn")]
)
def test_power_cap_edge_at_ninety_percent(limit, expected):
    result = gpu.check_power_cap(make_status(power_limit_w=limit, power_default_limit_w=700.0))
    assert result.status == expected
    if expected == "warn":
        assert "power-capped" in result.summary
        assert "nvidia-smi -pl" in result.hint


def test_power_cap_unreported_skips():
    assert gpu.check_power_cap(make_status(power_default_limit_w=None)).status == "skip"
    assert gpu.check_power_cap(make_status(power_limit_w=None)).status == "skip"


@pytest.mark.parametrize(
    ("gen", "width", "util", "expected"),
    [
        (5, 16, 0, "pass"),
        (1, 16, 0, "pass"),  # idle downshift
        (1, 16, 49, "pass"),
        (1, 16, 50, "warn"),  # busy and slow
        (5, 8, 0, "warn"),  # narrow link
        (4, 16, 100, "warn"),
        (5, 16, None, "pass"),
        (2, 16, None, "pass"),
    ],
)
def test_pcie_edges(gen, width, util, expected):
    status = make_status(pcie_gen_current=gen, pcie_width_current=width, util_gpu_pct=util)
    result = gpu.check_pcie(status)
    assert result.status == expected


def test_pcie_idle_downshift_is_noted_and_unreported_skips():
    result = gpu.check_pcie(make_status(pcie_gen_current=1))
    assert "normal when idle" in result.summary
    nothing = make_status(
        pcie_gen_current=None, pcie_gen_max=None, pcie_width_current=None, pcie_width_max=None
    )
    assert gpu.check_pcie(nothing).status == "skip"


def test_pcie_narrow_link_is_named():
    result = gpu.check_pcie(make_status(pcie_width_current=4))
    assert "x4 of x16" in result.summary
