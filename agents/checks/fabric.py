"""The --full checks between GPUs: topology (PCIe paths, NVLinks up, peer-to-peer support),
p2p (copy bandwidth between every pair) and nccl (all-reduce bus bandwidth), each measured
figure against what the catalogue says the connection should carry.

Typical achievable fractions: peer-to-peer copies 75-90 % of one direction of the link (NVLink
or PCIe); NCCL all-reduce bus bandwidth 75-95 % on NVLink, 60-85 % on PCIe with peer-to-peer.
Far below that, copies go through host memory (no peer-to-peer) or links are down.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from agents.checks.common import (
    FAIL,
    N_,
    PASS,
    SKIP,
    WARN,
    Message,
    joined,
    make,
    skip_without_nvml,
)
from agents.probe import TIMEOUT, NcclOutcome, PairMeasurement, ProbeOutcome
from agents.protocol import GpuSnapshot, HealthCheck, StatusSnapshot
from agents.topology import Expectation, Topology, describe, expected_gbps, gpu_spec

#: Measured / expected below which a peer-to-peer copy is reported as slow.
P2P_MIN_FRACTION = 0.5
#: Measured / expected below which the all-reduce bus bandwidth is reported as slow.
NCCL_MIN_FRACTION = 0.5

_NO_CUDA = N_(
    "skipped: needs a CUDA build of torch that sees the GPUs (see torch_build, visibility)"
)
_ONE_GPU = N_("skipped: one GPU, nothing to connect")

_FABRIC_MANAGER_HINT = N_(
    "On NVSwitch systems (HGX, DGX) the NVIDIA Fabric Manager must run, in the driver's own "
    "version (`systemctl status nvidia-fabricmanager`); without it the GPUs talk over PCIe "
    "only, or CUDA does not start. Ask the provider: you are paying for NVLink."
)
_DEGRADED_HINT = N_(
    "A link that is down slows every multi-GPU job on this GPU: `nvidia-smi nvlink -s` shows "
    "each link. Reset the GPUs (or reboot); if it stays down, ask the provider."
)
_NO_P2P_HINT = N_(
    "Without peer-to-peer, GPU-to-GPU copies and NCCL go through host memory, several times "
    "slower. In VMs and containers, PCIe ACS or IOMMU settings often block it; ask the "
    "provider for a host with peer-to-peer enabled. If NCCL hangs, NCCL_P2P_DISABLE=1 "
    "avoids the hang at that cost."
)
_SLOW_HINT = N_(
    "GPU-to-GPU traffic runs far below what the links allow: see the topology check (links "
    "down, no peer-to-peer, GPUs on different CPU sockets). `NCCL_DEBUG=INFO` shows which "
    "transport NCCL chose (P2P, SHM or NET). Data-parallel training all-reduces the gradients "
    "every step: at this rate more GPUs bring little (4 -> 8 may bring almost nothing)."
)


def check_topology(topology: Optional[Topology], status: StatusSnapshot) -> HealthCheck:
    """NVLinks up as the catalogue says the card has them, and peer-to-peer between every pair;
    the ``nvidia-smi topo -m`` matrix in the details."""
    early = skip_without_nvml("topology", status)
    if early is not None:
        return early
    if len(status.gpus) < 2:
        return make("topology", SKIP, _ONE_GPU)
    if topology is None:
        return make("topology", SKIP, N_("skipped: the topology was not collected"))
    details: Dict[str, Any] = describe(topology)
    if topology.error:
        details["error"] = topology.error
    failures, warnings, hints = _link_problems(topology, status.gpus)
    blocked = [
        f"GPUs {p.a} and {p.b} ({p.p2p_read})"
        for p in topology.pairs
        if p.p2p_read is not None and p.p2p_read != "ok"
    ]
    if blocked:
        warnings.append("no peer-to-peer between " + ", ".join(blocked))
        hints.append(_NO_P2P_HINT)
    hint = joined(" ", list(dict.fromkeys(hints)))
    if failures:
        return make("topology", FAIL, joined("; ", failures + warnings), hint, details)
    if warnings:
        return make("topology", WARN, joined("; ", warnings), hint, details)
    return make("topology", PASS, _topology_summary(topology, status.gpus), "", details)


def check_p2p(
    full: Optional[ProbeOutcome], topology: Optional[Topology], status: StatusSnapshot
) -> HealthCheck:
    """Copy bandwidth between every ordered pair of GPUs against its connection's figure;
    warn below P2P_MIN_FRACTION of it."""
    if len(status.gpus) < 2 and (full is None or full.facts is None or full.facts.device_count < 2):
        return make("p2p", SKIP, _ONE_GPU)
    if full is None:
        return make("p2p", SKIP, _NO_CUDA)
    if full.failure is not None:
        return _probe_failed("p2p", full.failure, full.message)
    facts = full.facts
    if facts is None or facts.p2p is None:
        return make("p2p", SKIP, _NO_CUDA)
    mapped = not facts.cuda_visible_devices
    rows: List[Dict[str, Any]] = []
    failed: List[Message] = []
    slow: List[Message] = []
    for m in facts.p2p:
        expected = _pair_expectation(topology, status.gpus, m.src, m.dst) if mapped else None
        row = _pair_row(m, expected)
        rows.append(row)
        if m.error or m.gbps is None:
            failed.append(
                N_(
                    "GPU {src} -> {dst}: {value}",
                    src=m.src,
                    dst=m.dst,
                    value=m.error or "no result",
                )
            )
        elif expected is not None and expected.gbps and m.gbps / expected.gbps < P2P_MIN_FRACTION:
            path = "peer-to-peer" if m.peer_access else "through host memory"
            slow.append(
                N_(
                    "GPU {src} -> {dst}: {gbps} GB/s, {row} of {row2} ({path})",
                    src=m.src,
                    dst=m.dst,
                    gbps=f"{m.gbps:.0f}",
                    row=f"{row['fraction']:.0%}",
                    row2=f"{row['expected_gbps']:.0f}",
                    path=path,
                )
            )
    details = {"pairs": rows, "unit": "GB/s one way", "min_fraction": P2P_MIN_FRACTION}
    if not mapped:
        details["note"] = "CUDA_VISIBLE_DEVICES is set: GPU numbers are torch's, not NVML's"
    if failed:
        return make(
            "p2p",
            FAIL,
            N_("copy between GPUs failed: {pairs}", pairs="; ".join(map(str, failed))),
            N_("A GPU that cannot copy to another needs a reset; ask the provider if it persists."),
            details,
        )
    if slow:
        no_peer = any(not m.peer_access for m in facts.p2p)
        hint = (_NO_P2P_HINT + " " if no_peer else "") + _SLOW_HINT
        return make(
            "p2p", WARN, N_("slow: {pairs}", pairs="; ".join(map(str, slow))), hint, details
        )
    return make("p2p", PASS, _p2p_summary(facts.p2p, rows), "", details)


def check_nccl(
    nccl: Optional[NcclOutcome], topology: Optional[Topology], status: StatusSnapshot
) -> HealthCheck:
    """All-reduce bus bandwidth across every GPU (one rank per GPU) against the slowest
    connection's figure; warn below NCCL_MIN_FRACTION of it."""
    if len(status.gpus) < 2 and (nccl is None or nccl.world_size < 2):
        return make("nccl", SKIP, _ONE_GPU)
    if nccl is None:
        return make("nccl", SKIP, _NO_CUDA)
    details: Dict[str, Any] = {
        "world_size": nccl.world_size,
        "nccl_version": nccl.nccl_version,
        "elapsed_s": round(nccl.elapsed_s, 1),
        "sizes": [
            {
                "bytes": s.bytes,
                "seconds_per_op": s.seconds_per_op,
                "algbw_gbps": round(s.algbw_gbps, 2),
                "busbw_gbps": round(s.busbw_gbps, 2),
            }
            for s in nccl.sizes
        ],
        "min_fraction": NCCL_MIN_FRACTION,
    }
    if nccl.failure is not None:
        return _probe_failed("nccl", nccl.failure, nccl.message, details, hung=True)
    if nccl.error is not None:
        if "no NCCL" in nccl.error:
            return make("nccl", SKIP, N_("skipped: {error}", error=nccl.error), "", details)
        return make(
            "nccl",
            FAIL,
            N_(
                "NCCL could not run across {world_size} GPUs: {error}",
                world_size=nccl.world_size,
                error=nccl.error,
            ),
            "Run with `NCCL_DEBUG=INFO` to see why; " + _NO_P2P_HINT,
            details,
        )
    busbw = nccl.busbw_gbps
    if busbw is None:
        return make("nccl", FAIL, N_("the all-reduce reported no result"), "", details)
    expected = _ring_expectation(topology, status.gpus, nccl.world_size)
    fraction = busbw / expected.gbps if expected is not None and expected.gbps else None
    details.update(
        busbw_gbps=round(busbw, 2),
        expected_gbps=None if expected is None else expected.gbps,
        expected_basis=None if expected is None else expected.basis,
        fraction=None if fraction is None else round(fraction, 3),
    )
    largest = max(nccl.sizes, key=lambda s: s.bytes).bytes
    text = (
        f"all-reduce across {nccl.world_size} GPUs: bus bandwidth {busbw:.1f} GB/s "
        f"at {_mib(largest)}"
    )
    if expected is None or fraction is None:
        return make("nccl", PASS, text + " (no figure to compare with)", "", details)
    against = f"{fraction:.0%} of {expected.gbps:.0f} GB/s, {expected.basis}"
    if fraction < NCCL_MIN_FRACTION:
        return make(
            "nccl",
            WARN,
            N_("{text}, only {against}", text=text, against=against),
            _SLOW_HINT,
            details,
        )
    return make("nccl", PASS, N_("{text} ({against})", text=text, against=against), "", details)


def _link_problems(
    topology: Topology, gpus: Sequence[GpuSnapshot]
) -> Tuple[List[Message], List[Message], List[Message]]:
    """(failures, warnings, hints) about NVLinks that are down."""
    failures: List[Message] = []
    warnings: List[Message] = []
    hints: List[Message] = []
    for gpu in gpus:
        links = topology.gpu(gpu.index)
        spec = gpu_spec(gpu)
        expected = spec.nvlink_links if spec is not None and spec.nvlink_gbps else 0
        if links is None:
            continue
        active = links.active_links
        if expected and active == 0:
            model = spec.name if spec is not None else "this model"
            failures.append(
                N_(
                    "GPU {index}: no NVLink is up ({model} has {expected})",
                    index=gpu.index,
                    model=model,
                    expected=expected,
                )
            )
            hints.append(_FABRIC_MANAGER_HINT)
        elif expected and active < expected:
            warnings.append(
                N_(
                    "GPU {index}: {active} of {expected} NVLinks up",
                    index=gpu.index,
                    active=active,
                    expected=expected,
                )
            )
            hints.append(_DEGRADED_HINT)
        elif links.nvlinks and 0 < active < len(links.nvlinks) and not expected:
            warnings.append(
                N_(
                    "GPU {index}: {active} of {n_nvlinks} NVLinks up",
                    index=gpu.index,
                    active=active,
                    n_nvlinks=len(links.nvlinks),
                )
            )
            hints.append(_DEGRADED_HINT)
    return failures, warnings, hints


def _topology_summary(topology: Topology, gpus: Sequence[GpuSnapshot]) -> str:
    indices = [g.index for g in gpus]
    labels = Counter(topology.label(a, b) for i, a in enumerate(indices) for b in indices[i + 1 :])
    pairs = sum(labels.values())
    parts = [f"{count} pair(s) {label}" for label, count in sorted(labels.items())]
    if len(labels) == 1:
        parts = [f"all {pairs} pair(s) {next(iter(labels))}"]
    switch = any(g.on_nvswitch for g in topology.gpus)
    p2p = all(p.p2p_read in (None, "ok") for p in topology.pairs)
    return (
        f"{len(indices)} GPUs: {', '.join(parts)}"
        + (" (NVLink through NVSwitch)" if switch else "")
        + ("; peer-to-peer ok" if p2p else "")
    )


def _pair_expectation(
    topology: Optional[Topology], gpus: Sequence[GpuSnapshot], a: int, b: int
) -> Optional[Expectation]:
    if topology is None:
        return None
    return expected_gbps(topology, gpus, a, b)


def _ring_expectation(
    topology: Optional[Topology], gpus: Sequence[GpuSnapshot], world: int
) -> Optional[Expectation]:
    """The slowest connection among the first ``world`` GPUs: a ring all-reduce runs at it."""
    indices = [g.index for g in gpus][:world]
    found = [
        _pair_expectation(topology, gpus, a, b)
        for i, a in enumerate(indices)
        for b in indices[i + 1 :]
    ]
    known = [e for e in found if e is not None]
    if not known or len(known) < len(found):
        return None
    return min(known, key=lambda e: e.gbps)


def _pair_row(m: PairMeasurement, expected: Optional[Expectation]) -> Dict[str, Any]:
    fraction = (
        m.gbps / expected.gbps
        if (m.gbps is not None and expected is not None and expected.gbps)
        else None
    )
    return {
        "src": m.src,
        "dst": m.dst,
        "gbps": None if m.gbps is None else round(m.gbps, 2),
        "peer_access": m.peer_access,
        "expected_gbps": None if expected is None else expected.gbps,
        "basis": None if expected is None else expected.basis,
        "fraction": None if fraction is None else round(fraction, 3),
        "error": m.error,
    }


def _p2p_summary(pairs: Sequence[PairMeasurement], rows: Sequence[Dict[str, Any]]) -> str:
    values = [m.gbps for m in pairs if m.gbps is not None]
    text = f"{len(pairs)} directed pair(s): {min(values):.0f}-{max(values):.0f} GB/s one way"
    fractions = [r["fraction"] for r in rows if r["fraction"] is not None]
    if fractions:
        text += f" (at least {min(fractions):.0%} of what the links allow)"
    if not all(m.peer_access for m in pairs):
        text += "; some pairs go through host memory"
    return text


def _probe_failed(
    check_id: str,
    failure: str,
    message: str,
    details: Optional[Dict[str, Any]] = None,
    hung: bool = False,
) -> HealthCheck:
    what = "did not finish" if failure == TIMEOUT else "failed"
    hint = (
        "GPUs that hang when they talk to each other usually cannot use peer-to-peer (see the "
        "topology check): " + _NO_P2P_HINT
        if hung and failure == TIMEOUT
        else "Reset the GPUs or reboot; ask the provider if it persists. Allow more time with "
        "--timeout on slow GPUs."
    )
    return make(
        check_id,
        FAIL,
        (
            N_("the GPU test did not finish: {message}", message=message)
            if what == "did not finish"
            else N_("the GPU test failed: {message}", message=message)
        ),
        hint,
        details or {},
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB"
