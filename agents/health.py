"""``gpu-agent health``: gather facts, apply the checks, render the checklist.

Standard library only (Python 3.9+). ``run_health`` gathers the facts (device nodes, the torch
probe run in the user's Python, sshd settings, listening sockets) and ``evaluate`` applies the
checks, pure functions in ``agents.checks``, in a fixed order. Check ids: dev_nodes, nvml,
driver, torch_build, cuda_compat, arch, visibility, identity, leftover_memory, ecc, row_remap,
throttle, temperature, power_cap, pcie, ssh_password_login, exposed_ports; with ``full``
also matmul, bandwidth and gemm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from agents.checks.cuda import (
    check_arch,
    check_cuda_compat,
    check_dev_nodes,
    check_torch_build,
    check_visibility,
)
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
from agents.checks.security import check_exposed_ports, check_ssh_password_login
from agents.probe import ProbeOutcome, run_probe
from agents.protocol import HealthCheck, HealthReport, StatusSnapshot, worst_status
from agents.render import wrap
from agents.system import (
    DevNodeFacts,
    ListeningSocket,
    SshdConfig,
    SystemPaths,
    listening_sockets,
    read_sshd_config,
    scan_dev_nodes,
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
    "ssh_password_login",
    "exposed_ports",
)
FULL_CHECK_IDS: Tuple[str, ...] = ("matmul", "bandwidth", "gemm")


@dataclass(frozen=True)
class HealthFacts:
    """Everything the checks judge. ``full_probe`` is None unless the measurements ran."""

    status: StatusSnapshot
    dev_nodes: DevNodeFacts
    probe: ProbeOutcome
    sshd: SshdConfig
    listeners: Tuple[ListeningSocket, ...]
    full_probe: Optional[ProbeOutcome] = None


def run_health(
    status: StatusSnapshot,
    *,
    full: bool = False,
    python: Optional[str] = None,
    expect_gpu: Optional[str] = None,
    expect_count: Optional[int] = None,
    timeout_s: float = 60.0,
    paths: Optional[SystemPaths] = None,
) -> HealthReport:
    """Run every check against ``status`` (an NVML snapshot taken just before).

    ``python`` is the interpreter whose torch is probed (default python3 on PATH); each probe
    run gets ``timeout_s`` seconds. ``paths`` moves the system files read (for tests). Never
    raises for a broken machine: problems become failed checks.
    """
    facts = gather_facts(status, full=full, python=python, timeout_s=timeout_s, paths=paths)
    return evaluate(facts, full=full, expect_gpu=expect_gpu, expect_count=expect_count)


def gather_facts(
    status: StatusSnapshot,
    *,
    full: bool = False,
    python: Optional[str] = None,
    timeout_s: float = 60.0,
    paths: Optional[SystemPaths] = None,
) -> HealthFacts:
    """Collect the facts: device nodes, the torch probe (and the measurements when ``full``
    and torch sees a GPU), sshd settings and listening sockets."""
    where = paths or SystemPaths()
    probe = run_probe(python, full=False, timeout_s=timeout_s)
    full_probe = None
    if full and probe.facts is not None and probe.facts.cuda_available and probe.facts.device_count:
        full_probe = run_probe(python, full=True, timeout_s=timeout_s)
    return HealthFacts(
        status=status,
        dev_nodes=scan_dev_nodes(where.dev_dir),
        probe=probe,
        sshd=read_sshd_config(where.sshd_config),
        listeners=listening_sockets(where.proc_dir),
        full_probe=full_probe,
    )


def evaluate(
    facts: HealthFacts,
    *,
    full: bool = False,
    expect_gpu: Optional[str] = None,
    expect_count: Optional[int] = None,
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
        check_ssh_password_login(facts.sshd),
        check_exposed_ports(facts.listeners),
    ]
    if full:
        checks.extend(
            [
                check_matmul(facts.full_probe),
                check_bandwidth(facts.full_probe),
                check_gemm(facts.full_probe),
            ]
        )
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
