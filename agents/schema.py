"""Names and constants of the agent's JSON schema, importable without ``dataclasses``.

``agents.protocol`` defines the documents as frozen dataclasses and re-exports these. The
status path of the agent (``agents.nvml``, ``agents.host``) builds documents from the field
names here so that ``gpu-agent status`` starts without loading ``dataclasses``; the tests check
that each tuple lists its dataclass's fields in order.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

#: ``nvml_error.code`` values.
NVML_ERROR_CODES = (
    "library_not_found",
    "driver_not_loaded",
    "no_permission",
    "blocked_by_os",
    "driver_library_mismatch",
    "gpu_lost",
    "unknown",
)

#: ``GpuSnapshot.clock_event_reasons`` names, by NVML clock-event (throttle) reason bit.
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)

#: Health check outcomes, best first; a report's status is the worst of its checks.
CHECK_STATUSES = ("pass", "skip", "warn", "fail")

#: Job states; the last four are final.
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled", "lost")
FINAL_JOB_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})

#: ``HostInfo`` fields.
HOST_FIELDS = (
    "hostname",
    "os",
    "kernel",
    "python_version",
    "agent_version",
    "cpu_count",
    "mem_total_bytes",
    "uptime_s",
    "in_container",
    "is_wsl",
)

#: ``GpuSnapshot`` fields; the collector fills each one or sets it to None.
GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "mem_total_bytes",
    "mem_used_bytes",
    "mem_free_bytes",
    "util_gpu_pct",
    "util_mem_pct",
    "temp_c",
    "power_draw_w",
    "power_limit_w",
    "power_default_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "clock_event_reasons",
    "ecc_mode_enabled",
    "ecc_uncorrected_volatile",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "retired_pages_pending",
    "pcie_gen_current",
    "pcie_gen_max",
    "pcie_width_current",
    "pcie_width_max",
    "persistence_mode",
    "mig_mode",
    "compute_capability",
    "sm_count",
    "fan_speed_pct",
    "pstate",
    "mem_clock_mhz",
    "mem_clock_max_mhz",
    "enc_util_pct",
    "dec_util_pct",
)

#: ``ProcessSnapshot`` fields; the collector fills each one or sets it to None.
PROCESS_FIELDS = (
    "gpu_index",
    "pid",
    "user",
    "command",
    "used_mem_bytes",
    "job_id",
    "sm_util_pct",
    "mem_bw_util_pct",
    "cpu_pct",
    "rss_bytes",
    "elapsed_s",
)
