"""``gpu-agent health``: gather facts, apply the checks, render the checklist.

Standard library only (Python 3.9+). ``run_health`` gathers the facts (device nodes, the torch
probe run in the user's Python, sshd settings, listening sockets, disk and /dev/shm space,
Xid errors from the kernel log and from NVML while the checks run) and ``evaluate`` applies
the checks, pure functions in ``agents.checks``, in a fixed order. Check ids: see CHECK_IDS;
with ``full`` also FULL_CHECK_IDS (measurements through the instance's own torch: matmul,
bandwidth, gemm, and between GPUs topology, p2p, nccl); with a stress duration also stress.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from agents import nvml, topology
from agents.checks.cuda import (
    check_arch,
    check_cuda_compat,
    check_dev_nodes,
    check_torch_build,
    check_visibility,
)
from agents.checks.fabric import check_nccl, check_p2p, check_topology
from agents.checks.gpu import (
    check_driver,
    check_ecc,
    check_identity,
    check_leftover_memory,
    check_nvml,
    check_pcie,
    check_power_cap,
    check_row_remap,
    check_temperature,
    check_throttle,
)
from agents.checks.perf import check_bandwidth, check_gemm, check_matmul
from agents.checks.resources import check_disk, check_shm
from agents.checks.security import check_exposed_ports, check_ssh_password_login
from agents.checks.stress import check_stress
from agents.checks.xid import check_xid
from agents.probe import (
    NcclOutcome,
    ProbeOutcome,
    StressOutcome,
    run_nccl,
    run_probe,
    run_stress,
)
from agents.protocol import HealthCheck, HealthReport, StatusSnapshot, worst_status
from agents.render import wrap
from agents.system import (
    DevNodeFacts,
    FilesystemFacts,
    KernelLogFacts,
    ListeningSocket,
    ShmFacts,
    SshdConfig,
    SystemPaths,
    default_disk_dirs,
    disk_facts,
    kernel_xids,
    listening_sockets,
    read_sshd_config,
    scan_dev_nodes,
    shm_facts,
)

CHECK_IDS: Tuple[str, ...] = (
    "dev_nodes",
    "nvml",
    "driver",
    "torch_build",
    "cuda_compat",
    "arch",
    "visibility",
    "identity",
    "leftover_memory",
    "ecc",
    "row_remap",
    "throttle",
    "temperature",
    "power_cap",
    "pcie",
    "xid",
    "disk",
    "shm",
    "ssh_password_login",
    "exposed_ports",
)
FULL_CHECK_IDS: Tuple[str, ...] = ("matmul", "bandwidth", "gemm", "topology", "p2p", "nccl")
STRESS_CHECK_ID = "stress"


@dataclass(frozen=True)
class HealthFacts:
    """Everything the checks judge. ``full_probe``, ``topology`` and ``nccl`` are None unless
    the --full measurements ran, ``stress`` unless a stress run was asked for. ``xid_events``
    are the Xids NVML reported while the checks ran (``xid_watching``: it could watch)."""

    status: StatusSnapshot
    dev_nodes: DevNodeFacts
    probe: ProbeOutcome
    sshd: SshdConfig
    listeners: Tuple[ListeningSocket, ...]
    full_probe: Optional[ProbeOutcome] = None
    disks: Tuple[FilesystemFacts, ...] = ()
    shm: Optional[ShmFacts] = None
    kernel_log: Optional[KernelLogFacts] = None
    xid_events: Tuple[Mapping[str, Any], ...] = ()
    xid_watching: bool = False
    topology: Optional[topology.Topology] = None
    nccl: Optional[NcclOutcome] = None
    stress: Optional[StressOutcome] = None


def run_health(
    status: StatusSnapshot,
    *,
    full: bool = False,
    python: Optional[str] = None,
    expect_gpu: Optional[str] = None,
    expect_count: Optional[int] = None,
    timeout_s: float = 60.0,
    paths: Optional[SystemPaths] = None,
    stress_s: Optional[float] = None,
) -> HealthReport:
    """Run every check against ``status`` (an NVML snapshot taken just before).

    ``python`` is the interpreter whose torch is probed (default python3 on PATH); each probe
    run gets ``timeout_s`` seconds. ``stress_s`` adds the stress check: that many seconds of
    GEMM load (the run may take ``timeout_s`` longer). ``paths`` moves the system files read
    (for tests). Never raises for a broken machine: problems become failed checks.
    """
    facts = gather_facts(
        status, full=full, python=python, timeout_s=timeout_s, paths=paths, stress_s=stress_s
    )
    return evaluate(
        facts,
        full=full,
        expect_gpu=expect_gpu,
        expect_count=expect_count,
        stress=stress_s is not None,
    )


def gather_facts(
    status: StatusSnapshot,
    *,
    full: bool = False,
    python: Optional[str] = None,
    timeout_s: float = 60.0,
    paths: Optional[SystemPaths] = None,
    stress_s: Optional[float] = None,
) -> HealthFacts:
    """Collect the facts: device nodes, the kernel log's Xids (read first, so that NVML's
    events cover the rest of the run), the torch probe (and, when ``full`` and torch sees a
    GPU, the measurements, the topology and the all-reduce; with ``stress_s``, the load),
    sshd settings, listening sockets, disk and /dev/shm space."""
    where = paths or SystemPaths()
    kernel = kernel_xids(where.kmsg, where.kernel_logs, f"{where.proc_dir}/uptime")
    with nvml.XidWatch() as watch:
        probe = run_probe(python, full=False, timeout_s=timeout_s)
        sees_gpu = bool(
            probe.facts is not None and probe.facts.cuda_available and probe.facts.device_count
        )
        full_probe = links = nccl = None
        if full and sees_gpu:
            full_probe = run_probe(python, full=True, timeout_s=timeout_s)
            links = _topology(status)
            nccl = _nccl(python, probe, timeout_s)
        stress = _stress(python, stress_s, timeout_s) if stress_s and sees_gpu else None
        events = tuple(watch.events())
        watching = watch.available
    return HealthFacts(
        status=status,
        dev_nodes=scan_dev_nodes(where.dev_dir),
        probe=probe,
        sshd=read_sshd_config(where.sshd_config),
        listeners=listening_sockets(where.proc_dir),
        full_probe=full_probe,
        disks=disk_facts(where.disk_dirs or default_disk_dirs()),
        shm=shm_facts(where.shm_dir, where.mounts),
        kernel_log=kernel,
        xid_events=events,
        xid_watching=watching,
        topology=links,
        nccl=nccl,
        stress=stress,
    )


def _topology(status: StatusSnapshot) -> Optional[topology.Topology]:
    """How the GPUs connect, when there are two or more; None otherwise or when malformed."""
    if len(status.gpus) < 2:
        return None
    try:
        return topology.from_document(nvml.collect_topology())
    except (KeyError, TypeError, ValueError):
        return None


def _nccl(python: Optional[str], probe: ProbeOutcome, timeout_s: float) -> Optional[NcclOutcome]:
    """The all-reduce across every GPU torch sees, when it sees two or more."""
    count = probe.facts.device_count if probe.facts is not None else 0
    if count < 2:
        return None
    return run_nccl(python, count, timeout_s=timeout_s)


def _stress(python: Optional[str], duration_s: float, timeout_s: float) -> StressOutcome:
    """GEMM load for ``duration_s`` seconds with the GPUs sampled through NVML meanwhile (no
    samples when NVML cannot be used: the GEMM rate is still judged)."""
    try:
        with nvml.GpuSampler() as sampler:
            return run_stress(python, duration_s, sample=sampler.sample_load, timeout_s=timeout_s)
    except nvml.NvmlUnavailable:
        return run_stress(python, duration_s, sample=list, timeout_s=timeout_s)


def evaluate(
    facts: HealthFacts,
    *,
    full: bool = False,
    expect_gpu: Optional[str] = None,
    expect_count: Optional[int] = None,
    stress: bool = False,
) -> HealthReport:
    """Apply every check to ``facts`` (no I/O); the report's status is the worst check's."""
    status = facts.status
    checks: List[HealthCheck] = [
        check_dev_nodes(facts.dev_nodes, status.host),
        check_nvml(status),
        check_driver(status),
        check_torch_build(facts.probe, status),
        check_cuda_compat(facts.probe, status),
        check_arch(facts.probe, status),
        check_visibility(facts.probe, status),
        check_identity(status, expect_gpu, expect_count),
        check_leftover_memory(status),
        check_ecc(status),
        check_row_remap(status),
        check_throttle(status),
        check_temperature(status),
        check_power_cap(status),
        check_pcie(status),
        check_xid(facts.kernel_log, facts.xid_events, facts.xid_watching, status.gpus),
        check_disk(facts.disks),
        check_shm(facts.shm, status.host, len(status.gpus)),
        check_ssh_password_login(facts.sshd),
        check_exposed_ports(facts.listeners),
    ]
    if full:
        checks.extend(
            [
                check_matmul(facts.full_probe),
                check_bandwidth(facts.full_probe),
                check_gemm(facts.full_probe),
                check_topology(facts.topology, status),
                check_p2p(facts.full_probe, facts.topology, status),
                check_nccl(facts.nccl, facts.topology, status),
            ]
        )
    if stress:
        checks.append(check_stress(facts.stress))
    return HealthReport(status=worst_status(tuple(c.status for c in checks)), checks=tuple(checks))


_LABELS: Dict[str, str] = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}


def render_text(report: HealthReport) -> str:
    """The report as a terminal checklist: one line per check (wrapped), its hint indented
    below after "What to do:", and a closing line with the overall status and the counts."""
    width = max((len(c.id) for c in report.checks), default=0)
    indent = " " * (6 + width + 2)
    lines: List[str] = []
    for check in report.checks:
        label = _LABELS.get(check.status, check.status.upper())
        first = f"{label:<4}  {check.id:<{width}}  "
        lines.extend(wrap(check.summary, indent, first=first))
        if check.hint:
            lines.extend(wrap(f"What to do: {check.hint}", indent))
    counts = {s: sum(1 for c in report.checks if c.status == s) for s in _LABELS}
    tally = ", ".join(f"{counts[s]} {s}" for s in ("fail", "warn", "skip", "pass") if counts[s])
    lines.append("")
    lines.append(
        f"health: {_LABELS.get(report.status, report.status.upper())} ({tally or 'no checks'})"
    )
    return "\n".join(lines)
