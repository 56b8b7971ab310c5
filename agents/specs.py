"""The GPU spec catalogue: dense datasheet figures per model, read from ``gpu_specs.json``.

Standard library only (Python 3.9+). The data file is read with ``pkgutil.get_data`` so it
works from the zipapp too, and cached after the first load. Three ways in:

- ``match(nvml_name, mem_total_bytes, sm_count)`` for what NVML reports (the SM count
  separates an RTX 4090 from a 4090 D and a whole GPU from a MIG slice);
- ``lookup(model)`` / ``candidates(model)`` for what a person types ("4090", "a100",
  "h100-sxm", "A100 80GB", "rtx 5090"), tolerant of case, spaces and dashes.

Interconnect figures (GB/s, 10^9 bytes, per direction unless named otherwise): each GPU's PCIe
generation and NVLink links, and per-generation link rates (``pcie_gbps``,
``nvlink_generation_gbps``), each with its source.
"""

from __future__ import annotations

import json
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

GIB = 1024**3

#: Words people and NVML put around a model name that say nothing about which model it is.
_NOISE_WORDS = frozenset({"nvidia", "geforce", "tesla", "gpu", "card"})

#: Smallest fraction of the nominal capacity NVML reports for a whole GPU: HBM cards report
#: about 99%; GDDR cards with ECC on hold back a further 1/16 for the check bits.
MEM_MIN_FRACTION_HBM = 0.95
MEM_MIN_FRACTION_GDDR = 0.95 * 15 / 16
#: Largest fraction of the nominal capacity a whole GPU may report.
MEM_MAX_FRACTION = 1.05


class CatalogueError(ValueError):
    """The data file is missing or malformed (a packaging bug, not a user error)."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. Figures are dense (no sparsity); ``None`` means not applicable.

    ``mem_bytes`` is the nominal capacity (``mem_gb`` GiB). ``bf16_tflops``/``fp16_tflops`` are
    tensor-core rates with fp32 accumulation. ``nvlink_gbps`` (both directions, all links) is
    None where the card has no NVLink or only a bridge (``nvlink_bridge``, whose total is
    ``nvlink_bridge_gbps``). ``nvlink_links`` counts its NVLinks (0: none). ``ecc`` None means
    "query the card". ``interconnect_source`` says where the PCIe and NVLink figures come from.
    """

    key: str
    name: str
    aliases: Tuple[str, ...]
    nvml_names: Tuple[str, ...]
    mem_bytes: int
    mem_gb: int
    mem_type: str
    bandwidth_gbps: float
    bf16_tflops: Optional[float]
    fp16_tflops: Optional[float]
    fp32_tflops: float
    tdp_w: int
    sm_count: int
    compute_capability: str
    nvlink_gbps: Optional[float]
    nvlink_bridge: bool
    ecc: Optional[bool]
    form_factor: str
    segment: str
    source: str
    qualifiers: Tuple[Tuple[str, ...], ...] = ()
    pcie_gen: Optional[int] = None
    pcie_lanes: int = 16
    nvlink_gen: Optional[int] = None
    nvlink_links: int = 0
    nvlink_bridge_gbps: Optional[float] = None
    interconnect_source: str = ""

    @property
    def nvlink_total_gbps(self) -> Optional[float]:
        """NVLink bandwidth of the GPU, both directions over all links (SXM or bridge)."""
        return self.nvlink_gbps if self.nvlink_gbps is not None else self.nvlink_bridge_gbps

    @property
    def nvlink_link_gbps(self) -> Optional[float]:
        """One NVLink's bandwidth in one direction, from the GPU's own total; None without."""
        total = self.nvlink_total_gbps
        if total is None or self.nvlink_links <= 0:
            return None
        return total / (2 * self.nvlink_links)

    @property
    def is_hbm(self) -> bool:
        """True for HBM memory (no capacity held back for ECC)."""
        return self.mem_type.upper().startswith("HBM")

    @property
    def mem_min_bytes(self) -> int:
        """The least total memory a whole, healthy GPU of this model reports through NVML."""
        fraction = MEM_MIN_FRACTION_HBM if self.is_hbm else MEM_MIN_FRACTION_GDDR
        return int(self.mem_bytes * fraction)


_CACHE: Dict[str, Any] = {}


def load_catalogue() -> Tuple[GpuSpec, ...]:
    """Every GPU in the catalogue, in file order. Raises CatalogueError if the file is bad."""
    cached = _CACHE.get("specs")
    if cached is not None:
        return tuple(cached)
    data = _read_data()
    specs, preferred = _parse(data)
    _CACHE["interconnects"] = _parse_interconnects(data.get("interconnects"))
    _CACHE["specs"] = specs
    _CACHE["preferred"] = preferred
    return specs


@dataclass(frozen=True)
class LinkRate:
    """A link generation's rate in GB/s per direction (PCIe: at x16; NVLink: per link)."""

    kind: str
    generation: int
    gbps: float
    source: str


def pcie_gbps(generation: Optional[int], lanes: Optional[int] = 16) -> Optional[float]:
    """PCIe bandwidth in GB/s per direction for a link of ``generation`` and ``lanes``; None
    when either is unknown or the generation is not in the catalogue."""
    rate = link_rate("pcie", generation)
    if rate is None or not lanes:
        return None
    return rate.gbps * lanes / 16


def nvlink_generation_gbps(generation: Optional[int]) -> Optional[float]:
    """One NVLink's bandwidth in GB/s per direction for an NVLink ``generation``, or None."""
    rate = link_rate("nvlink", generation)
    return None if rate is None else rate.gbps


def link_rate(kind: str, generation: Optional[int]) -> Optional[LinkRate]:
    """The catalogue's rate for ``kind`` ("pcie" or "nvlink") and ``generation``, or None."""
    if generation is None:
        return None
    load_catalogue()
    rates: Mapping[Tuple[str, int], LinkRate] = _CACHE["interconnects"]
    return rates.get((kind, int(generation)))


def by_key(key: str) -> Optional[GpuSpec]:
    """The spec with catalogue key ``key`` (e.g. "h100-sxm"), or None."""
    for spec in load_catalogue():
        if spec.key == key:
            return spec
    return None


def lookup(model: str) -> Optional[GpuSpec]:
    """The spec for a typed model name, or None when nothing fits.

    An ambiguous short name (e.g. "a100") gives the most commonly rented variant; see
    ``candidates`` for all of them.
    """
    found = candidates(model)
    return found[0] if found else None


def candidates(model: str) -> Tuple[GpuSpec, ...]:
    """Every spec a typed model name could mean, the most commonly rented first."""
    compact = _compact(model)
    if not compact:
        return ()
    found = [spec for spec in load_catalogue() if _spelled_by(spec, compact)]
    preferred: Mapping[str, str] = _CACHE["preferred"]
    first = preferred.get(compact)
    # The named favourite first, then SXM boards (what clouds mostly rent), then file order.
    found.sort(key=lambda spec: (spec.key != first, spec.form_factor != "sxm"))
    return tuple(found)


def match(
    name: str, mem_total_bytes: Optional[int] = None, sm_count: Optional[int] = None
) -> Optional[GpuSpec]:
    """The spec for a GPU as NVML reports it, or None (unknown model or a MIG slice).

    ``mem_total_bytes`` and ``sm_count`` (when given) pick between models that share a name
    and reject a partial GPU (fewer SMs or much less memory than any candidate).
    """
    if " mig " in f" {name.lower()} ":
        return None
    found = _by_nvml_name(name) or list(candidates(name))
    if not found:
        return None
    if sm_count is not None:
        exact = [spec for spec in found if spec.sm_count == sm_count]
        if exact:
            found = exact
        elif sm_count < min(spec.sm_count for spec in found):
            return None
    if mem_total_bytes is not None:
        fitting = [spec for spec in found if memory_fits(spec, mem_total_bytes)]
        if fitting:
            found = fitting
        elif all(mem_total_bytes < spec.mem_min_bytes for spec in found):
            return None
    return found[0]


def memory_fits(spec: GpuSpec, mem_total_bytes: int) -> bool:
    """Whether NVML's total memory (bytes) is what a whole ``spec`` GPU reports."""
    return spec.mem_min_bytes <= mem_total_bytes <= spec.mem_bytes * MEM_MAX_FRACTION


def _by_nvml_name(name: str) -> List[GpuSpec]:
    wanted = _squash(name)
    primary = [s for s in load_catalogue() if s.nvml_names and _squash(s.nvml_names[0]) == wanted]
    others = [
        s
        for s in load_catalogue()
        if s not in primary and any(_squash(n) == wanted for n in s.nvml_names)
    ]
    return primary + others


def _read_data() -> Dict[str, Any]:
    try:
        raw = pkgutil.get_data("agents", "gpu_specs.json")
    except OSError as exc:
        raise CatalogueError(f"cannot read agents/gpu_specs.json: {exc}") from exc
    if raw is None:
        raise CatalogueError("agents/gpu_specs.json is not packaged with the agent")
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise CatalogueError(f"agents/gpu_specs.json is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise CatalogueError("agents/gpu_specs.json has no 'gpus' list")
    return data


def _parse(data: Mapping[str, Any]) -> Tuple[Tuple[GpuSpec, ...], Dict[str, str]]:
    specs = tuple(_parse_row(row) for row in data["gpus"])
    keys = [spec.key for spec in specs]
    if len(set(keys)) != len(keys):
        raise CatalogueError("agents/gpu_specs.json has duplicate keys")
    preferred = {_compact(k): str(v) for k, v in dict(data.get("preferred", {})).items()}
    unknown = set(preferred.values()) - set(keys)
    if unknown:
        raise CatalogueError(f"agents/gpu_specs.json prefers unknown keys: {sorted(unknown)}")
    return specs, preferred


def _parse_row(row: Mapping[str, Any]) -> GpuSpec:
    try:
        model_aliases = tuple(_compact(a) for a in row["model_aliases"])
        qualifiers = tuple(tuple(_compact(q) for q in group) for group in row["qualifiers"])
        return GpuSpec(
            key=str(row["key"]),
            name=str(row["name"]),
            aliases=model_aliases,
            nvml_names=tuple(str(n) for n in row["nvml_names"]),
            mem_bytes=int(row["mem_gb"]) * GIB,
            mem_gb=int(row["mem_gb"]),
            mem_type=str(row["mem_type"]),
            bandwidth_gbps=float(row["bandwidth_gbps"]),
            bf16_tflops=_opt_float(row["bf16_tflops"]),
            fp16_tflops=_opt_float(row["fp16_tflops"]),
            fp32_tflops=float(row["fp32_tflops"]),
            tdp_w=int(row["tdp_w"]),
            sm_count=int(row["sm_count"]),
            compute_capability=str(row["compute_capability"]),
            nvlink_gbps=_opt_float(row["nvlink_gbps"]),
            nvlink_bridge=bool(row["nvlink_bridge"]),
            ecc=None if row["ecc"] is None else bool(row["ecc"]),
            form_factor=str(row["form_factor"]),
            segment=str(row["segment"]),
            source=str(row["source"]),
            qualifiers=qualifiers,
            pcie_gen=_opt_int(row.get("pcie_gen")),
            pcie_lanes=int(row.get("pcie_lanes", 16)),
            nvlink_gen=_opt_int(row.get("nvlink_gen")),
            nvlink_links=int(row.get("nvlink_links", 0)),
            nvlink_bridge_gbps=_opt_float(row.get("nvlink_bridge_gbps")),
            interconnect_source=str(row.get("interconnect_source", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CatalogueError(f"agents/gpu_specs.json row {row.get('key')!r}: {exc}") from exc


def _parse_interconnects(data: Any) -> Dict[Tuple[str, int], LinkRate]:
    """The ``interconnects`` section: (kind, generation) -> LinkRate."""
    rates: Dict[Tuple[str, int], LinkRate] = {}
    if data is None:
        return rates
    headline = {"pcie": "gbps_per_direction_x16", "nvlink": "gbps_per_link_per_direction"}
    try:
        for kind, field_name in headline.items():
            for generation, row in dict(data.get(kind, {})).items():
                rates[(kind, int(generation))] = LinkRate(
                    kind=kind,
                    generation=int(generation),
                    gbps=float(row[field_name]),
                    source=str(row["source"]),
                )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise CatalogueError(f"agents/gpu_specs.json interconnects: {exc}") from exc
    return rates


def _opt_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


def _opt_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _squash(text: str) -> str:
    """Lower case with runs of white space made one space (for exact NVML name matches)."""
    return " ".join(text.lower().split())


def _compact(text: str) -> str:
    """A name reduced to letters and digits, noise words dropped ("RTX 4090-D": "rtx4090d")."""
    words = re.split(r"[^0-9a-z]+", text.lower())
    return "".join(w for w in words if w and w not in _NOISE_WORDS)


def _spelled_by(spec: GpuSpec, compact: str) -> bool:
    """Whether ``compact`` is one of the spec's model aliases followed by distinct qualifiers."""
    for alias in (*spec.aliases, _compact(spec.key)):
        if compact.startswith(alias) and _qualified(compact[len(alias) :], spec.qualifiers):
            return True
    return False


def _qualified(rest: str, groups: Sequence[Tuple[str, ...]]) -> bool:
    """Whether ``rest`` is a concatenation of spellings from distinct qualifier groups."""
    if not rest:
        return True
    for index, group in enumerate(groups):
        remaining = tuple(groups[:index]) + tuple(groups[index + 1 :])
        for spelling in group:
            if rest.startswith(spelling) and _qualified(rest[len(spelling) :], remaining):
                return True
    return False
