"""Plain-text tables for a terminal, in the spirit of nvidia-smi and gpustat.

Pure functions from protocol documents to strings; a value that is None prints as "-".
"""

from __future__ import annotations

from agents.protocol import GpuSnapshot, HostInfo, ProcessSnapshot, StatusSnapshot

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, List, Optional, Sequence

MISSING = "-"
#: Width that long text (hints) is wrapped to.
WIDTH = 100
_KIB = 1024


def render_status(status: StatusSnapshot) -> str:
    """The whole status: host line, driver line or NVML error, GPU table with notes on what
    needs attention, process table (left out when NVML could not list the GPUs)."""
    lines = [host_line(status.host)]
    if status.driver is not None:
        driver = status.driver
        lines.append(
            f"Driver {driver.version}  CUDA {driver.cuda_version or MISSING}  "
            f"NVML {driver.nvml_version or MISSING}"
        )
    if status.nvml_error is not None:
        err = status.nvml_error
        lines += ["", f"NVML error: {err.code}"]
        lines += wrap(err.message, indent="  ")
        lines += wrap(f"What to do: {err.hint}", indent="  ")
    if status.gpus:
        lines += ["", gpu_table(status.gpus)]
        lines += gpu_notes(status.gpus)
    elif status.nvml_error is None:
        lines += ["", "No NVIDIA GPUs found."]
    if status.gpus or (status.driver is not None and status.nvml_error is None):
        lines += ["", process_table(status.processes)]
    return "\n".join(lines)


def host_line(host: HostInfo) -> str:
    """One line about the machine, e.g. "gpu-box · Ubuntu 22.04 · kernel 6.5 · 32 CPUs · ..."."""
    parts = [
        host.hostname,
        host.os,
        f"kernel {host.kernel}",
        f"Python {host.python_version}",
        f"{host.cpu_count} CPUs",
        f"{format_bytes(host.mem_total_bytes)} RAM",
        f"up {format_duration(host.uptime_s)}",
        f"gpu-agent {host.agent_version}",
    ]
    if host.in_container:
        parts.append("container")
    if host.is_wsl:
        parts.append("WSL")
    return " · ".join(parts)


def gpu_table(gpus: Sequence[GpuSnapshot]) -> str:
    """One row per GPU: index, name, fan, temperature, performance state, utilisation, memory,
    power, SM and memory clocks, uncorrected ECC errors (volatile), clock events; video
    encoder/decoder use when some GPU has any."""
    video = any((g.enc_util_pct or 0) or (g.dec_util_pct or 0) for g in gpus)
    header = [
        "GPU",
        "Name",
        "Fan",
        "Temp",
        "Perf",
        "Util",
        "Memory used / total",
        "Power / limit",
        "Clocks SM / mem",
        "ECC",
        "Clock events",
    ]
    if video:
        header.insert(6, "Enc / Dec")
    rows = [header]
    for gpu in gpus:
        row = [
            str(gpu.index),
            gpu.name,
            _unit(gpu.fan_speed_pct, "%"),
            _unit(gpu.temp_c, "°C"),
            MISSING if gpu.pstate is None else f"P{gpu.pstate}",
            _unit(gpu.util_gpu_pct, "%"),
            f"{format_bytes(gpu.mem_used_bytes)} / {format_bytes(gpu.mem_total_bytes)}",
            f"{_watts(gpu.power_draw_w)} / {_watts(gpu.power_limit_w)}",
            f"{_unit(gpu.sm_clock_mhz, '')} / {_unit(gpu.mem_clock_mhz, '')} MHz",
            _unit(gpu.ecc_uncorrected_volatile, ""),
            _reasons(gpu.clock_event_reasons),
        ]
        if video:
            row.insert(6, f"{_unit(gpu.enc_util_pct, '%')} / {_unit(gpu.dec_util_pct, '%')}")
        rows.append(row)
    right = {0, 2, 3, 5, 6, 7, 8, 9} if not video else {0, 2, 3, 5, 6, 7, 8, 9, 10}
    return table(rows, right=right)


def gpu_notes(gpus: Sequence[GpuSnapshot]) -> List[str]:
    """Lines about what the table does not show and needs attention: memory rows waiting to
    be remapped or failed, retired pages pending, MIG mode, a lowered power limit."""
    notes: List[str] = []
    for gpu in gpus:
        found: List[str] = []
        if gpu.remapped_rows_failure:
            found.append("memory row remapping failed (no spare rows left)")
        if gpu.remapped_rows_pending:
            found.append("memory rows wait to be remapped (reset the GPU)")
        if gpu.retired_pages_pending:
            found.append("memory pages wait to be retired (reset the GPU)")
        if gpu.mig_mode:
            found.append("MIG mode is on (CUDA sees MIG slices, not the whole GPU)")
        limit, default = gpu.power_limit_w, gpu.power_default_limit_w
        if limit is not None and default is not None and limit < default:
            found.append(f"power limit lowered to {limit:.0f} W (default {default:.0f} W)")
        notes.extend(f"GPU {gpu.index}: {text}" for text in found)
    return ["", *notes] if notes else []


def process_table(processes: Sequence[ProcessSnapshot]) -> str:
    """One row per GPU process (as nvitop shows them): GPU memory, its share of the SMs and of
    memory bandwidth, host CPU (100% = one core), resident host memory, running time and
    command; or a line saying there are none."""
    if not processes:
        return "No processes are using the GPUs."
    rows: List[List[str]] = [
        ["GPU", "PID", "User", "GPU mem", "SM", "Mem BW", "CPU", "RSS", "Time", "Command"]
    ]
    for proc in processes:
        command = proc.command or MISSING
        if proc.job_id:
            command = f"[job {proc.job_id}] {command}"
        rows.append(
            [
                str(proc.gpu_index),
                str(proc.pid),
                proc.user or MISSING,
                format_bytes(proc.used_mem_bytes),
                _unit(proc.sm_util_pct, "%"),
                _unit(proc.mem_bw_util_pct, "%"),
                MISSING if proc.cpu_pct is None else f"{proc.cpu_pct:.0f}%",
                format_bytes(proc.rss_bytes),
                format_duration(proc.elapsed_s),
                _clip(command, 80),
            ]
        )
    return table(rows, right={0, 1, 3, 4, 5, 6, 7, 8})


def table(rows: Sequence[Sequence[str]], right: Optional[set] = None) -> str:  # type: ignore[type-arg]
    """Align columns; the first row is the header. ``right``: column indexes aligned right."""
    right = right or set()
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def wrap(text: str, indent: str = "", width: int = WIDTH, first: Optional[str] = None) -> List[str]:
    """``text`` wrapped at spaces to ``width`` columns, every line starting with ``indent``
    (the first line with ``first`` instead, when given).

    A command quoted in backticks is kept on one line, so it can be copied whole.
    """
    import textwrap

    parts = text.split("`")
    # Odd-numbered parts are inside backticks: glue their words with a placeholder.
    glued = "`".join(p.replace(" ", _GLUE) if i % 2 else p for i, p in enumerate(parts))
    lines = textwrap.wrap(
        glued,
        width=max(width, len(indent) + 40),
        initial_indent=indent if first is None else first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(_GLUE, " ") for line in lines] or [(first or indent).rstrip()]


_GLUE = "\x00"


def format_bytes(value: Optional[int]) -> str:
    """Bytes in binary units: "512 MiB", "79.6 GiB"; "-" for None."""
    if value is None:
        return MISSING
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < _KIB or unit == "TiB":
            if unit in ("B", "KiB", "MiB"):
                return f"{amount:.0f} {unit}"
            return f"{amount:.1f} {unit}"
        amount /= _KIB
    return MISSING  # unreachable: the loop returns at TiB


def format_duration(seconds: Optional[float]) -> str:
    """A rough duration: "45s", "12m", "3h05m", "2d04h"; "-" for None."""
    if seconds is None:
        return MISSING
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _unit(value: Any, unit: str) -> str:
    return MISSING if value is None else f"{value}{unit}"


def _watts(value: Optional[float]) -> str:
    return MISSING if value is None else f"{value:.0f} W"


def _reasons(reasons: Optional[Sequence[str]]) -> str:
    if reasons is None:
        return MISSING
    if not reasons:
        return "none"
    return ",".join("idle" if r == "gpu_idle" else r for r in reasons)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
