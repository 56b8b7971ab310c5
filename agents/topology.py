"""How the GPUs of a machine connect: the document ``nvml.collect_topology`` builds, as types.

Standard library only (Python 3.9+). :func:`from_document` parses it; :meth:`Topology.label`
names a pair's connection as ``nvidia-smi topo -m`` does (NV18, PIX, PXB, PHB, NODE, SYS) and
:func:`expected_gbps` says what bandwidth that connection should give one way, from the spec
catalogue's interconnect figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from agents import specs
from agents.protocol import GpuSnapshot


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU; ``remote_type`` "gpu" or "nvswitch" (None when inactive)."""

    link: int
    active: bool
    version: Optional[int]
    remote_bus_id: Optional[str]
    remote_type: Optional[str]


@dataclass(frozen=True)
class GpuLinks:
    """A GPU's NVLinks; ``nvlinks`` None when it has none or the driver cannot say."""

    index: int
    pci_bus_id: str
    nvlinks: Optional[Tuple[NvLink, ...]]

    @property
    def active_links(self) -> int:
        """How many of its NVLinks are up."""
        return sum(1 for link in self.nvlinks or () if link.active)

    @property
    def nvlink_version(self) -> Optional[int]:
        """The NVLink generation its active links report, or None."""
        versions = [link.version for link in self.nvlinks or () if link.active and link.version]
        return max(versions) if versions else None

    @property
    def on_nvswitch(self) -> bool:
        """Whether its active links go to an NVSwitch (every GPU on it is one hop away)."""
        return any(link.active and link.remote_type == "nvswitch" for link in self.nvlinks or ())


@dataclass(frozen=True)
class GpuPair:
    """Two GPUs (``a`` < ``b``): the PCIe path's ``level`` (PIX, PXB, PHB, NODE, SYS, BOARD),
    active NVLinks joining them directly, whether both reach an NVSwitch, and NVML's
    peer-to-peer answers ("ok", "not_supported", ...; None when not reported)."""

    a: int
    b: int
    level: Optional[str]
    nvlinks: int
    via_nvswitch: bool
    p2p_read: Optional[str]
    p2p_nvlink: Optional[str]


@dataclass(frozen=True)
class Topology:
    """Every GPU's links and every pair; ``error`` holds NVML's failure message, if any."""

    gpus: Tuple[GpuLinks, ...]
    pairs: Tuple[GpuPair, ...]
    error: Optional[str] = None

    def gpu(self, index: int) -> Optional[GpuLinks]:
        """The GPU with this index, or None."""
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def pair(self, a: int, b: int) -> Optional[GpuPair]:
        """The pair of GPUs ``a`` and ``b`` in either order, or None."""
        low, high = min(a, b), max(a, b)
        for pair in self.pairs:
            if (pair.a, pair.b) == (low, high):
                return pair
        return None

    def nvlink_count(self, a: int, b: int) -> int:
        """NVLinks between ``a`` and ``b``: direct ones, or through an NVSwitch the fewer
        active links of the two; 0 when they talk over PCIe."""
        pair = self.pair(a, b)
        if pair is None:
            return 0
        if pair.nvlinks:
            return pair.nvlinks
        first, second = self.gpu(a), self.gpu(b)
        if first and second and first.on_nvswitch and second.on_nvswitch:
            return min(first.active_links, second.active_links)
        return 0

    def label(self, a: int, b: int) -> str:
        """The connection as ``nvidia-smi topo -m`` prints it: "NV18", "PIX", ..., "?"."""
        links = self.nvlink_count(a, b)
        if links:
            return f"NV{links}"
        pair = self.pair(a, b)
        return pair.level if pair is not None and pair.level else "?"


def from_document(doc: Mapping[str, Any]) -> Topology:
    """Parse ``nvml.collect_topology()``. Raises KeyError/TypeError/ValueError when malformed."""
    gpus = tuple(
        GpuLinks(
            index=int(g["index"]),
            pci_bus_id=str(g["pci_bus_id"]),
            nvlinks=None
            if g.get("nvlinks") is None
            else tuple(
                NvLink(
                    link=int(link["link"]),
                    active=bool(link["active"]),
                    version=_opt_int(link.get("version")),
                    remote_bus_id=link.get("remote_bus_id"),
                    remote_type=link.get("remote_type"),
                )
                for link in g["nvlinks"]
            ),
        )
        for g in doc.get("gpus") or ()
    )
    pairs = tuple(
        GpuPair(
            a=int(p["a"]),
            b=int(p["b"]),
            level=p.get("level"),
            nvlinks=int(p.get("nvlinks") or 0),
            via_nvswitch=bool(p.get("via_nvswitch")),
            p2p_read=p.get("p2p_read"),
            p2p_nvlink=p.get("p2p_nvlink"),
        )
        for p in doc.get("pairs") or ()
    )
    error = doc.get("error")
    message = str(error.get("message")) if isinstance(error, Mapping) else None
    return Topology(gpus=gpus, pairs=pairs, error=message)


@dataclass(frozen=True)
class Expectation:
    """What a connection should carry one way, in GB/s, and how that was worked out."""

    gbps: float
    basis: str
    kind: str  # "nvlink" or "pcie"


def expected_gbps(
    topology: Topology, gpus: Sequence[GpuSnapshot], a: int, b: int
) -> Optional[Expectation]:
    """The one-way bandwidth GPUs ``a`` and ``b`` should reach: their NVLinks times one link's
    rate (the GPU's catalogue figure, else its NVLink generation's), else the slower PCIe link
    of the two at the best generation and width NVML reports. None when nothing is known."""
    by_index = {g.index: g for g in gpus}
    links = topology.nvlink_count(a, b)
    if links:
        rate, source = _link_rate(topology, by_index.get(a))
        if rate is not None:
            return Expectation(
                gbps=links * rate,
                basis=f"{links} NVLink(s) x {rate:g} GB/s each way ({source})",
                kind="nvlink",
            )
    rates = [_pcie(by_index.get(i)) for i in (a, b)]
    known = [r for r in rates if r is not None]
    if len(known) < 2:
        return None
    slower = min(known, key=lambda r: r[0])
    return Expectation(gbps=slower[0], basis=slower[1], kind="pcie")


def gpu_spec(gpu: Optional[GpuSnapshot]) -> Optional[specs.GpuSpec]:
    """The catalogue entry for a GPU as NVML reports it, or None."""
    if gpu is None:
        return None
    return specs.match(gpu.name, gpu.mem_total_bytes, gpu.sm_count)


def describe(topology: Topology) -> Dict[str, Any]:
    """JSON-ready details: the ``nvidia-smi topo -m`` matrix and each GPU's NVLinks."""
    indices = [g.index for g in topology.gpus]
    matrix = {
        str(a): {str(b): ("X" if a == b else topology.label(a, b)) for b in indices}
        for a in indices
    }
    links = {
        str(g.index): None
        if g.nvlinks is None
        else {
            "active": g.active_links,
            "total": len(g.nvlinks),
            "version": g.nvlink_version,
            "nvswitch": g.on_nvswitch,
        }
        for g in topology.gpus
    }
    return {"matrix": matrix, "nvlinks": links}


def _link_rate(topology: Topology, gpu: Optional[GpuSnapshot]) -> Tuple[Optional[float], str]:
    spec = gpu_spec(gpu)
    if spec is not None and spec.nvlink_link_gbps is not None:
        return spec.nvlink_link_gbps, f"{spec.name} catalogue figure"
    links = topology.gpu(gpu.index) if gpu is not None else None
    version = links.nvlink_version if links is not None else None
    rate = specs.nvlink_generation_gbps(version)
    return rate, f"NVLink {version} rate"


def _pcie(gpu: Optional[GpuSnapshot]) -> Optional[Tuple[float, str]]:
    if gpu is None:
        return None
    spec = gpu_spec(gpu)
    generation = gpu.pcie_gen_max or (spec.pcie_gen if spec else None)
    if spec is not None and spec.pcie_gen is not None and generation is not None:
        generation = min(generation, spec.pcie_gen)
    width = gpu.pcie_width_max or (spec.pcie_lanes if spec else None)
    rate = specs.pcie_gbps(generation, width)
    if rate is None:
        return None
    return rate, f"PCIe {generation}.0 x{width}: {rate:g} GB/s each way"


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)
