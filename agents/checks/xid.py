"""The xid check: Xid errors the NVIDIA driver logged, each with what it means and what to do.

Two sources: the kernel log since boot (agents.system.kernel_xids) and NVML's event API while
the health check ran (agents.nvml.XidWatch). Meanings follow NVIDIA's Xid catalogue
(docs.nvidia.com/deploy/xid-errors). Pure functions of those facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from agents.checks.common import FAIL, N_, PASS, SKIP, WARN, Message, Parts, Text, make
from agents.nvml import bus_key
from agents.protocol import GpuSnapshot, HealthCheck
from agents.system import KernelLogFacts

#: An Xid newer than this (seconds) counts in full; an older one (or one of unknown age, from a
#: log file that may hold earlier boots) is at most a warning, and an old program error is
#: only listed.
XID_RECENT_S = 24 * 3600

NVML_SOURCE = "NVML during this check"
KERNEL_SOURCE = "kernel log"

HARDWARE = "hardware"
PROGRAM = "program"
DRIVER = "driver"

_RESET = N_("Stop the jobs on it and reset the GPU (`sudo nvidia-smi -r -i INDEX`) or reboot")
_REPLACE = N_(
    "if it happens again, ask the provider to replace the GPU (or move you to another host)"
)
_UPDATE = N_("update the driver")
_DEBUG = N_(
    "Usually a bug in the program that ran (an out-of-bounds access): run it under "
    "`compute-sanitizer`; if different programs hit it, the GPU may be failing"
)


def _then(first: Text, then: Text) -> Text:
    """Two things to do, one after the other."""
    return N_("{first}; {then}", first=first, then=then)


@dataclass(frozen=True)
class XidInfo:
    """What an Xid means: ``kind`` (hardware, program or driver), ``status`` when recent
    (fail or warn), a short meaning and what to do."""

    kind: str
    status: str
    meaning: Text
    action: Text


#: The Xids that matter on rented GPUs.
XID_CATALOGUE: Mapping[int, XidInfo] = {
    8: XidInfo(DRIVER, WARN, N_("GPU stopped responding: a kernel ran too long"), _RESET),
    13: XidInfo(PROGRAM, WARN, N_("graphics engine exception"), _DEBUG),
    31: XidInfo(PROGRAM, WARN, N_("GPU memory page fault: an invalid address"), _DEBUG),
    32: XidInfo(
        HARDWARE,
        WARN,
        N_("corrupted command stream, often PCIe errors"),
        N_("See the pcie check; {replace}", replace=_REPLACE),
    ),
    38: XidInfo(DRIVER, WARN, N_("driver firmware error"), _then(_RESET, _UPDATE)),
    43: XidInfo(PROGRAM, WARN, N_("GPU stopped a program that faulted"), _DEBUG),
    45: XidInfo(
        PROGRAM,
        WARN,
        N_("processes stopped after an earlier error"),
        N_("Look at the Xid before it"),
    ),
    48: XidInfo(
        HARDWARE, FAIL, N_("double-bit ECC error: uncorrectable memory"), _then(_RESET, _REPLACE)
    ),
    61: XidInfo(DRIVER, FAIL, N_("internal micro-controller breakpoint"), _then(_RESET, _UPDATE)),
    62: XidInfo(DRIVER, FAIL, N_("internal micro-controller halt"), _then(_RESET, _UPDATE)),
    63: XidInfo(
        HARDWARE,
        WARN,
        N_("memory row remapping or page retirement recorded"),
        N_("Reset the GPU when convenient so the repair takes effect (see row_remap)"),
    ),
    64: XidInfo(
        HARDWARE,
        FAIL,
        N_("memory row remapping or page retirement failed"),
        _then(_RESET, _REPLACE),
    ),
    69: XidInfo(PROGRAM, WARN, N_("graphics engine class error"), _DEBUG),
    74: XidInfo(
        HARDWARE,
        FAIL,
        N_("NVLink error"),
        N_(
            "Multi-GPU jobs will hang or crash: reset the GPUs; check `nvidia-smi nvlink -s`; "
            "{replace}",
            replace=_REPLACE,
        ),
    ),
    79: XidInfo(
        HARDWARE,
        FAIL,
        N_("GPU has fallen off the bus"),
        N_("Reboot the instance; {replace}, and stop paying for this one", replace=_REPLACE),
    ),
    92: XidInfo(
        HARDWARE,
        WARN,
        N_("high single-bit ECC error rate"),
        N_("Watch the ecc check; {replace}", replace=_REPLACE),
    ),
    94: XidInfo(
        HARDWARE,
        WARN,
        N_("contained ECC error: one program was stopped"),
        N_("Restart the affected job; reset the GPU when convenient; repeats mean failing memory"),
    ),
    95: XidInfo(
        HARDWARE,
        FAIL,
        N_("uncontained ECC error: every program on the GPU"),
        _then(_RESET, _REPLACE),
    ),
    109: XidInfo(PROGRAM, WARN, N_("context switch timeout"), _DEBUG),
    119: XidInfo(
        DRIVER,
        FAIL,
        N_("GSP timeout: the GPU system processor stopped answering"),
        _then(_then(_RESET, _UPDATE), _REPLACE),
    ),
    120: XidInfo(DRIVER, FAIL, N_("GSP error in the GPU system processor"), _then(_RESET, _UPDATE)),
    121: XidInfo(HARDWARE, FAIL, N_("chip-to-chip link error"), _then(_RESET, _REPLACE)),
    140: XidInfo(HARDWARE, FAIL, N_("unrecovered ECC error"), _then(_RESET, _REPLACE)),
    154: XidInfo(
        HARDWARE,
        FAIL,
        N_("the driver says the GPU needs recovery"),
        N_("Do what `nvidia-smi -q | grep -i -A1 recovery` asks (reset the GPU or reboot)"),
    ),
}
_UNKNOWN = XidInfo(
    DRIVER,
    WARN,
    N_("an Xid this agent does not know"),
    N_("Look it up in NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors)"),
)


@dataclass(frozen=True)
class XidFinding:
    """One Xid seen: where (GPU index when known, else the PCI address), when, and from which
    source ("kernel log" or "NVML during this check")."""

    xid: int
    gpu_index: Optional[int]
    pci_bus_id: Optional[str]
    age_s: Optional[float]
    source: str
    message: str = ""


def xid_info(xid: int) -> XidInfo:
    """The catalogue entry for ``xid`` (a generic one for Xids not listed)."""
    return XID_CATALOGUE.get(xid, _UNKNOWN)


def check_xid(
    kernel: Optional[KernelLogFacts],
    nvml_events: Sequence[Mapping[str, Any]],
    nvml_watching: bool,
    gpus: Sequence[GpuSnapshot],
) -> HealthCheck:
    """Xids since boot (kernel log) and during this check (NVML events): fail for a recent
    hardware or driver fault, warn for a program fault or an older or undated fault, skip
    when neither source can be read."""
    findings = _findings(kernel, nvml_events, gpus)
    sources = _sources(kernel, nvml_watching)
    details: Dict[str, Any] = {
        "sources": sources,
        "kernel_log_unreadable": list(kernel.unreadable) if kernel else [],
        "recent_s": XID_RECENT_S,
        "xids": [_finding_row(f) for f in findings],
    }
    if not findings:
        if kernel is None or not kernel.readable:
            why = "; ".join(kernel.unreadable) if kernel and kernel.unreadable else "not found"
            during = " and none came during this check (NVML)" if nvml_watching else ""
            return make(
                "xid",
                SKIP,
                N_(
                    "skipped: the kernel log cannot be read ({why}){during}", why=why, during=during
                ),
                N_(
                    "Run the agent as root, or run `sudo dmesg | grep -i xid` yourself; in a "
                    "container the host's kernel log is not visible."
                ),
                details,
            )
        return make(
            "xid",
            PASS,
            N_("no Xid errors since boot ({sources})", sources=", ".join(sources)),
            "",
            details,
        )
    graded = [(_grade(f), f) for f in findings]
    shown = [(status, f) for status, f in graded if status != PASS]
    if not shown:
        return make(
            "xid",
            PASS,
            N_("only old program errors: {list} (more than a day ago)", list=_list(findings)),
            "",
            details,
        )
    worst = FAIL if any(status == FAIL for status, _ in shown) else WARN
    findings_shown = [f for _, f in shown]
    hints = dict.fromkeys(
        N_("Xid {xid}: {action}.", xid=f.xid, action=xid_info(f.xid).action) for f in findings_shown
    )
    return make("xid", worst, _list(findings_shown), Parts(" ", list(hints)), details)


def _findings(
    kernel: Optional[KernelLogFacts],
    nvml_events: Sequence[Mapping[str, Any]],
    gpus: Sequence[GpuSnapshot],
) -> List[XidFinding]:
    by_bus = {bus_key(g.pci_bus_id): g.index for g in gpus}
    found: List[XidFinding] = []
    for xid in kernel.xids if kernel is not None else ():
        found.append(
            XidFinding(
                xid=xid.xid,
                gpu_index=by_bus.get(bus_key(xid.pci_bus_id)),
                pci_bus_id=xid.pci_bus_id,
                age_s=xid.age_s,
                source=KERNEL_SOURCE,
                message=xid.message,
            )
        )
    for event in nvml_events:
        index = event.get("gpu_index")
        found.append(
            XidFinding(
                xid=int(event["xid"]),
                gpu_index=None if index is None else int(index),
                pci_bus_id=None,
                age_s=0.0,
                source=NVML_SOURCE,
            )
        )
    return found


def _grade(finding: XidFinding) -> str:
    """pass (only listed), warn or fail for one Xid, by kind and age."""
    info = xid_info(finding.xid)
    recent = finding.age_s is not None and finding.age_s <= XID_RECENT_S
    if recent:
        return info.status
    if info.kind == PROGRAM:
        return PASS
    return WARN


def _sources(kernel: Optional[KernelLogFacts], nvml_watching: bool) -> List[str]:
    sources = []
    if kernel is not None and kernel.source is not None:
        sources.append(kernel.source)
    if nvml_watching:
        sources.append("NVML events during this check")
    return sources


def _list(findings: Sequence[XidFinding]) -> Parts:
    """ "Xid 79 on GPU 2 (GPU has fallen off the bus), 3h ago; ..." grouped by Xid and GPU."""
    groups: Dict[Tuple[int, str], List[XidFinding]] = {}
    for f in findings:
        where = f"GPU {f.gpu_index}" if f.gpu_index is not None else f"PCI {f.pci_bus_id or '?'}"
        groups.setdefault((f.xid, where), []).append(f)
    parts: List[Message] = []
    for (xid, where), items in groups.items():
        count = f" x{len(items)}" if len(items) > 1 else ""
        newest = min((i.age_s for i in items if i.age_s is not None), default=None)
        if any(i.source == NVML_SOURCE for i in items):
            when = N_("during this check")
        else:
            when = N_("age unknown") if newest is None else _ago(newest)
        parts.append(
            N_(
                "Xid {xid} on {where}{count} ({meaning}), {when}",
                xid=xid,
                where=where,
                count=count,
                meaning=xid_info(xid).meaning,
                when=when,
            )
        )
    return Parts("; ", parts)


def _ago(seconds: float) -> Text:
    if seconds < 60:
        return N_("just now")
    if seconds < 3600:
        return N_("{minutes} min ago", minutes=f"{seconds / 60:.0f}")
    if seconds < 86400:
        return N_("{hours} h ago", hours=f"{seconds / 3600:.1f}")
    return N_("{days} days ago", days=f"{seconds / 86400:.1f}")


def _finding_row(f: XidFinding) -> Dict[str, Any]:
    info = xid_info(f.xid)
    return {
        "xid": f.xid,
        "gpu_index": f.gpu_index,
        "pci_bus_id": f.pci_bus_id,
        "age_s": f.age_s,
        "source": f.source,
        "kind": info.kind,
        "meaning": str(info.meaning),
        "message": f.message,
    }
