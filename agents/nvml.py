"""GPU status through NVML: the only module that imports ``pynvml`` (nvidia-ml-py).

Importing this module loads nothing heavy. :func:`collect_status_document` builds the status
as plain JSON-ready data (``gpu-agent status --json`` prints it as it is, without loading
``dataclasses`` or ``json``); :func:`collect_status` parses that same document into
``protocol.StatusSnapshot``, exactly as the bot parses what the agent prints.

``pynvml`` is imported only when the driver's NVML library loads: on a machine or container
without the driver, :class:`NvmlSession` reports ``library_not_found`` (with the loader's own
reason) without loading the 300 kB of bindings. Every per-GPU query is wrapped: a field the GPU
or driver does not support is ``None``, never an error. When NVML cannot start at all, the
status still comes back, with ``driver`` None and ``nvml_error`` set to a code from
``protocol.NVML_ERROR_CODES`` and a hint a newcomer can act on.

Each GPU process carries its share of the SMs and memory bandwidth from NVML's per-process
utilisation samples, joined with its CPU use, resident memory and age from ``/proc``
(:mod:`agents.procinfo`). For ``health``: :func:`collect_topology` (PCIe paths, NVLinks,
peer-to-peer support between every pair), :class:`XidWatch` (Xid errors NVML reports while it
is open) and :meth:`GpuSampler.sample_load` (clocks, temperature, power under load).

Units: memory in bytes, power in W (NVML reports mW), clocks in MHz, temperature in °C.

Why one module of this size: it is the agent's only importer of pynvml (one module per
outside thing): every NVML call, its error translation and the fallbacks for what a driver
does not support sit at that one boundary.
"""

from __future__ import annotations

import os
import sys
import time

from agents.schema import CLOCK_EVENT_REASONS, GPU_FIELDS, PROCESS_FIELDS, SCHEMA_VERSION

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type

    from agents.protocol import GpuSnapshot, NvmlError, StatusSnapshot

    Document = Dict[str, Any]

#: What to do for each ``nvml_error.code``.
HINTS: Dict[str, str] = {
    "library_not_found": (
        "No NVIDIA driver library (libnvidia-ml.so.1) is visible here. In a container, start it "
        "with GPUs (`docker run --gpus all ...` with the NVIDIA Container Toolkit, or the nvidia "
        "runtime). On a VM or bare metal, install the NVIDIA driver. If you rented a GPU "
        "instance and see this, ask the provider: you are paying for a GPU you cannot use."
    ),
    "driver_not_loaded": (
        "The NVIDIA kernel module is not loaded. Run `sudo modprobe nvidia` and check "
        "`sudo dmesg | grep -i nvidia` for why it did not load; if that fails, reboot. After a "
        "kernel update the driver may need rebuilding (DKMS) or reinstalling."
    ),
    "no_permission": (
        "This user may not open /dev/nvidia*. Add it to the video group "
        "(`sudo usermod -aG video $USER`, then log in again) or run the agent as a user that "
        "can use the GPU."
    ),
    "blocked_by_os": (
        "The operating system blocked access to the GPU. On WSL2, update the NVIDIA driver on "
        "Windows (not inside Linux) and run `wsl --update`; in a container, check that the "
        "cgroup device rules allow /dev/nvidia*."
    ),
    "driver_library_mismatch": (
        "The NVIDIA driver was upgraded but the old kernel module is still loaded (driver/library "
        "version mismatch). Reboot the instance; nvidia-smi fails the same way until then."
    ),
    "gpu_lost": (
        "A GPU fell off the bus (look for Xid 79 in `sudo dmesg`). Reboot the instance; if it "
        "happens again, the hardware is failing: ask the provider to replace the GPU or move "
        "you to another host, and stop paying for this one."
    ),
    "unknown": (
        "NVML failed unexpectedly. Run `nvidia-smi` to see the driver's own error and "
        "`sudo dmesg | grep -i -e nvrm -e xid` for kernel messages; a reboot often clears it."
    ),
}

# NVMLError subclass name -> nvml_error.code.
_CODES_BY_CLASS: Dict[str, str] = {
    "NVMLError_LibraryNotFound": "library_not_found",
    "NVMLError_DriverNotLoaded": "driver_not_loaded",
    "NVMLError_NoPermission": "no_permission",
    "NVMLError_OperatingSystem": "blocked_by_os",
    "NVMLError_LibRmVersionMismatch": "driver_library_mismatch",
    "NVMLError_GpuIsLost": "gpu_lost",
}

_RESET_HINT = (
    "The GPU needs a reset: stop every process using it and run `sudo nvidia-smi -r`, or reboot."
)

#: The driver's NVML library, by the name pynvml loads it on Linux.
DRIVER_LIBRARY = "libnvidia-ml.so.1"

_NVML_SUCCESS = 0
_NVML_NOT_FOUND = 6
_NVML_FUNCTION_NOT_FOUND = 13
_NVML_GPU_IS_LOST = 15
_NVML_PSTATE_UNKNOWN = 32
_NVML_CLOCK_MEM = 2
_CMDLINE_MAX_CHARS = 500
#: A per-process utilisation sample older than this (seconds) counts as no use now.
PROCESS_SAMPLE_MAX_AGE_S = 10.0
#: NVML's Xid event type bit (nvmlEventTypeXidCriticalError).
XID_EVENT_TYPE = 0x8
#: Most NVLinks a GPU has (NVML_NVLINK_MAX_LINKS in recent drivers); the scan stops earlier
#: at the first link index the driver calls invalid.
NVLINK_MAX_LINKS = 36
#: nvmlDeviceGetTopologyCommonAncestor levels as nvidia-smi topo -m names them.
TOPOLOGY_LEVELS: Dict[int, str] = {
    0: "BOARD",
    10: "PIX",
    20: "PXB",
    30: "PHB",
    40: "NODE",
    50: "SYS",
}
#: nvmlDeviceGetP2PStatus answers, by value.
P2P_STATUSES: Dict[int, str] = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
# NVML_P2P_CAPS_INDEX_* (ABI values; some pynvml releases spell READ as a tuple).
_P2P_READ = 0
_P2P_NVLINK = 2
_NVLINK_REMOTE_TYPES: Dict[int, str] = {0: "gpu", 1: "ibmnpu", 2: "nvswitch"}
#: What GpuSampler.sample_load reports per GPU.
_LOAD_FIELDS = (
    "index",
    "util_gpu_pct",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "mem_clock_mhz",
    "temp_c",
    "power_draw_w",
    "power_limit_w",
    "clock_event_reasons",
)


class NvmlUnavailable(Exception):
    """NVML could not be used; ``document`` (and, typed, ``error``) says why and what to do."""

    def __init__(self, document: Document) -> None:
        super().__init__(document["message"])
        self.document = document

    @property
    def error(self) -> NvmlError:
        """The reason as ``protocol.NvmlError``."""
        from agents.protocol import NvmlError, from_dict

        return from_dict(NvmlError, self.document)


def collect_status(clock: Optional[Callable[[], float]] = None) -> StatusSnapshot:
    """One snapshot of host, driver, GPUs and GPU processes. Never raises for NVML problems.

    ``clock`` gives the time as Unix epoch seconds (default ``time.time``).
    """
    from agents.protocol import StatusSnapshot, from_dict

    return from_dict(StatusSnapshot, collect_status_document(clock))


def collect_status_document(clock: Optional[Callable[[], float]] = None) -> Document:
    """:func:`collect_status` as the JSON-ready document the agent prints (``schema`` 1).

    Lists stand for the snapshot's tuples; ``protocol.from_dict(StatusSnapshot, ...)`` turns it
    into the snapshot. Never raises for NVML problems.
    """
    from agents.host import host_document

    host = host_document()
    now = (clock or time.time)()
    collected_at = iso_utc(now)
    try:
        with NvmlSession() as nv:
            document = _Collector(nv, now).status(host, collected_at)
    except NvmlUnavailable as exc:
        return status_document(host, None, exc.document, [], [], collected_at)
    if document["processes"]:
        from agents import procinfo

        procinfo.join(document["processes"])
    return document


def status_document(
    host: Document,
    driver: Optional[Document],
    nvml_error: Optional[Document],
    gpus: List[Document],
    processes: List[Document],
    collected_at: str,
) -> Document:
    """The top level of a status document."""
    return {
        "schema": SCHEMA_VERSION,
        "host": host,
        "driver": driver,
        "nvml_error": nvml_error,
        "gpus": gpus,
        "processes": processes,
        "collected_at": collected_at,
    }


class NvmlSession:
    """``with NvmlSession() as nv``: NVML initialised once, the ``pynvml`` module as ``nv``,
    shut down on leaving.

    Entering raises NvmlUnavailable (with a code and a hint) when the driver's library does not
    load, pynvml is missing or nvmlInit fails.
    """

    def __init__(self) -> None:
        self._nv: Any = None

    def __enter__(self) -> Any:
        if "pynvml" not in sys.modules:  # bindings already loaded (or stubbed) are used as is
            check_driver_library()
        nv = _import_pynvml()
        try:
            nv.nvmlInit()
        except Exception as exc:  # any failure to start NVML is reported, never raised further
            raise NvmlUnavailable(error_document(exc, "nvmlInit")) from exc
        self._nv = nv
        return nv

    def __exit__(self, *exc_info: Any) -> None:
        nv, self._nv = self._nv, None
        if nv is None:
            return
        # Not contextlib.suppress: importing contextlib would slow down every status.
        try:  # noqa: SIM105
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


def nvml_session() -> NvmlSession:
    """An :class:`NvmlSession` (``with nvml_session() as nv: ...``)."""
    return NvmlSession()


def check_driver_library() -> None:
    """Raise NvmlUnavailable (``library_not_found``) when the driver's NVML library does not
    load here; on other systems than Linux, leave it to pynvml's own search.

    nvmlInit loads the same library by the same name, so the answer is the same, but this one
    comes without importing pynvml and carries the loader's own reason.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        _dlopen(DRIVER_LIBRARY)
    except OSError as exc:
        raise NvmlUnavailable(
            _error(
                "library_not_found",
                f"the NVIDIA driver's NVML library does not load: {exc}",
                HINTS["library_not_found"],
            )
        ) from exc


def _dlopen(name: str) -> None:
    """Load a shared library as ``ctypes.CDLL(name)`` does; OSError when it does not load.

    Calls ``_ctypes.dlopen``, which CDLL calls itself, when it exists: importing ``ctypes``
    builds its types first, which costs more than the rest of a status without a driver.
    """
    try:
        from _ctypes import RTLD_LOCAL, dlopen
    except ImportError:
        import ctypes

        ctypes.CDLL(name)
        return
    dlopen(name, RTLD_LOCAL)


def classify_error(exc: BaseException, where: str = "NVML") -> NvmlError:
    """An NvmlError (code, message, hint) for an exception raised by pynvml."""
    from agents.protocol import NvmlError, from_dict

    return from_dict(NvmlError, error_document(exc, where))


def error_document(exc: BaseException, where: str = "NVML") -> Document:
    """:func:`classify_error` as a plain ``nvml_error`` document."""
    name = type(exc).__name__
    code = _CODES_BY_CLASS.get(name, "unknown")
    hint = _RESET_HINT if name == "NVMLError_ResetRequired" else HINTS[code]
    detail = str(exc) or name
    return _error(code, f"{where} failed: {detail} ({name})", hint)


def sample_gpus() -> List[GpuSnapshot]:
    """GPU utilisation and memory now (other fields None); [] when NVML is unavailable.

    Opens and closes NVML; to sample repeatedly, keep a :class:`GpuSampler` open instead.
    """
    try:
        with GpuSampler() as sampler:
            return sampler.sample()
    except NvmlUnavailable:
        return []


class GpuSampler:
    """Keeps NVML open to sample utilisation and memory cheaply, e.g. every few seconds.

    ``with GpuSampler() as s: s.sample()``; entering raises NvmlUnavailable when NVML fails.
    """

    def __init__(self) -> None:
        self._session: Optional[NvmlSession] = None
        self._collector: Optional[_Collector] = None
        self._ids: Dict[int, Tuple[str, str, str]] = {}

    def __enter__(self) -> GpuSampler:
        session = NvmlSession()
        self._collector = _Collector(session.__enter__())
        self._session = session
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._session is not None:
            self._session.__exit__(*exc_info)
        self._session = None
        self._collector = None

    def sample(self) -> List[GpuSnapshot]:
        """One GpuSnapshot per visible GPU with index, ids, utilisation and memory filled."""
        from agents.protocol import GpuSnapshot, from_dict

        if self._collector is None:
            raise RuntimeError("GpuSampler.sample() called outside `with GpuSampler()`")
        col = self._collector
        out: List[GpuSnapshot] = []
        for index, handle in col.handles():
            ids = self._ids.get(index)
            if ids is None:
                ids = col.identity(handle)
                self._ids[index] = ids
            values: Document = {"index": index}
            values.update(zip(("uuid", "name", "pci_bus_id"), ids))
            values.update(col.utilization(handle))
            values.update(col.memory(handle))
            out.append(from_dict(GpuSnapshot, _gpu_document(values)))
        return out

    def sample_load(self) -> List[Document]:
        """Per visible GPU, what load does to it now: ``index``, ``util_gpu_pct``,
        ``sm_clock_mhz``, ``sm_clock_max_mhz``, ``mem_clock_mhz``, ``temp_c``, ``power_draw_w``,
        ``power_limit_w`` and ``clock_event_reasons`` (None where not reported)."""
        if self._collector is None:
            raise RuntimeError("GpuSampler.sample_load() called outside `with GpuSampler()`")
        col = self._collector
        out: List[Document] = []
        for index, handle in col.handles():
            values: Document = {"index": index}
            values.update(col.utilization(handle))
            values.update(col.clocks(handle))
            values.update(col.power(handle))
            values["mem_clock_mhz"] = _int(col.query("nvmlDeviceGetClockInfo", handle, col.mem))
            out.append({name: values.get(name) for name in _LOAD_FIELDS})
        return out


def collect_topology() -> Document:
    """How the GPUs connect, for ``health --full``; never raises.

    ``{"gpus": [{"index", "pci_bus_id", "nvlinks"}], "pairs": [...], "error": None}``. Each
    GPU's ``nvlinks`` lists its links ``{"link", "active", "version", "remote_bus_id",
    "remote_type"}`` (remote_type "gpu", "nvswitch", ...), or is None where the GPU or driver
    has no NVLink. Each pair ``{"a", "b", "level", "nvlinks", "via_nvswitch", "p2p_read",
    "p2p_nvlink"}``: ``level`` is the PCIe path as nvidia-smi topo names it (PIX, PXB, PHB,
    NODE, SYS, BOARD), ``nvlinks`` the active links joining the two directly, the p2p fields
    NVML's peer-to-peer answers ("ok", "not_supported", ...). Values not reported are None.
    ``error`` is the nvml_error document when NVML could not be used.
    """
    try:
        with NvmlSession() as nv:
            return _Collector(nv).topology()
    except NvmlUnavailable as exc:
        return {"gpus": [], "pairs": [], "error": exc.document}


class XidWatch:
    """Xid errors NVML reports while the watch is open (NVML's event API).

    ``with XidWatch() as watch: ...; events = watch.events()``. NVML reports only errors that
    happen after registration; the kernel log holds earlier ones. ``available`` is False when
    NVML could not be used or no GPU supports the events (``reason`` says why); entering never
    raises.
    """

    def __init__(self, clock: Optional[Callable[[], float]] = None) -> None:
        self._clock = clock or time.time
        self._session: Optional[NvmlSession] = None
        self._nv: Any = None
        self._event_set: Any = None
        self.available = False
        self.reason = ""
        self.watched: List[int] = []
        self._seen: List[Document] = []

    def __enter__(self) -> XidWatch:
        session = NvmlSession()
        try:
            nv = session.__enter__()
        except NvmlUnavailable as exc:
            self.reason = str(exc)
            return self
        self._session, self._nv = session, nv
        col = _Collector(nv)
        errors: Tuple[Type[BaseException], ...] = (AttributeError, *col._errors)
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except errors as exc:
            self.reason = f"NVML events are not available: {exc}"
            return self
        for index, handle in col.handles():
            supported = col.query("nvmlDeviceGetSupportedEventTypes", handle)
            if supported is not None and not int(supported) & XID_EVENT_TYPE:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(handle, XID_EVENT_TYPE, self._event_set)
            except col._errors:
                continue
            self.watched.append(index)
        self.available = bool(self.watched)
        if not self.available:
            self.reason = "no GPU here reports Xid events through NVML"
        return self

    def events(self) -> List[Document]:
        """Every Xid reported since the watch opened: ``{"gpu_index", "xid", "seen_at"}``
        (``seen_at`` ISO 8601 UTC, when this call collected it; ``gpu_index`` None when the
        driver did not say)."""
        nv = self._nv
        if nv is None or self._event_set is None:
            return list(self._seen)
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or getattr(nv, "nvmlEventSetWait", None)
        if wait is None:
            return list(self._seen)
        errors = (nv.NVMLError,)
        for _ in range(10_000):  # a flood of events must not hang the health check
            try:
                data = wait(self._event_set, 0)
            except errors:
                break  # NVML_ERROR_TIMEOUT: nothing more pending (or the set broke)
            if not int(getattr(data, "eventType", 0)) & XID_EVENT_TYPE:
                continue
            try:
                index: Optional[int] = int(nv.nvmlDeviceGetIndex(data.device))
            except (AttributeError, *errors):
                index = None
            self._seen.append(
                {
                    "gpu_index": index,
                    "xid": int(data.eventData),
                    "seen_at": iso_utc(self._clock()),
                }
            )
        return list(self._seen)

    def __exit__(self, *exc_info: Any) -> None:
        nv, self._nv = self._nv, None
        if nv is not None and self._event_set is not None:
            try:  # noqa: SIM105
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError:
                pass
        self._event_set = None
        if self._session is not None:
            self._session.__exit__(*exc_info)
        self._session = None


def decode_clock_reasons(mask: int) -> Tuple[str, ...]:
    """Names of the clock-event (throttle) reason bits set in ``mask``; unknown bits as hex."""
    names = [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def cuda_version_string(value: int) -> str:
    """NVML's CUDA driver version int as "major.minor": 12040 -> "12.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def iso_utc(epoch_s: float) -> str:
    """Unix epoch seconds as ISO 8601 UTC to the second: "2026-03-01T12:30:00+00:00"."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(epoch_s))


def bus_key(bus_id: Optional[str]) -> Tuple[int, int, int]:
    """A PCI bus id as (domain, bus, device): "00000000:18:00.0" and "0000:18:00" agree."""
    if not bus_id:
        return (-1, -1, -1)
    parts = bus_id.strip().lower().replace(".", ":").split(":")
    try:
        return (int(parts[0], 16), int(parts[1], 16), int(parts[2], 16))
    except (IndexError, ValueError):
        return (-1, -1, -1)


# ---------------------------------------------------------------------------------------------


class _Collector:
    """Queries through one open NVML session; every query returns a value or None."""

    def __init__(self, nv: Any, now: Optional[float] = None) -> None:
        self.nv = nv
        self.now = time.time() if now is None else now
        self.mem = getattr(nv, "NVML_CLOCK_MEM", _NVML_CLOCK_MEM)
        mismatch = getattr(nv, "NVMLLibraryMismatchError", None)
        self._mismatch: Tuple[Type[BaseException], ...] = (mismatch,) if mismatch else ()
        self._errors: Tuple[Type[BaseException], ...] = (nv.NVMLError, *self._mismatch)
        self._lost_now = False
        self.lost_indexes: List[int] = []
        self.enum_error: Optional[Document] = None

    def status(self, host: Document, collected_at: str) -> Document:
        driver = self.driver()
        gpus: List[Document] = []
        processes: List[Document] = []
        for index, handle in self.handles():
            self._lost_now = False
            gpus.append(self.gpu(index, handle))
            processes.extend(self.processes(index, handle))
            if self._lost_now:
                self.lost_indexes.append(index)
        error = self.enum_error or self._lost_error()
        return status_document(host, driver, error, gpus, processes, collected_at)

    def driver(self) -> Document:
        version = self.query("nvmlSystemGetDriverVersion")
        cuda = self.query("nvmlSystemGetCudaDriverVersion")
        return {
            "version": _text(version) if version is not None else "unknown",
            "cuda_version": cuda_version_string(int(cuda)) if cuda else None,
            "nvml_version": _opt_text(self.query("nvmlSystemGetNVMLVersion")),
        }

    def handles(self) -> Iterator[Tuple[int, Any]]:
        """(index, handle) per GPU; a GPU whose handle fails is skipped and recorded."""
        nv = self.nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self.enum_error = error_document(exc, "nvmlDeviceGetCount")
            return
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            except nv.NVMLError as exc:
                if self.enum_error is None:
                    self.enum_error = error_document(exc, f"GPU {index}")
                continue
            yield index, handle

    def gpu(self, index: int, handle: Any) -> Document:
        values: Document = {"index": index}
        values.update(zip(("uuid", "name", "pci_bus_id"), self.identity(handle)))
        values.update(self.utilization(handle))
        values.update(self.memory(handle))
        values.update(self.power(handle))
        values.update(self.clocks(handle))
        values.update(self.ecc(handle))
        values.update(self.pcie(handle))
        values.update(self.modes(handle))
        values.update(self.cooling_and_video(handle))
        return _gpu_document(values)

    def cooling_and_video(self, handle: Any) -> Dict[str, Any]:
        """Fan, performance state, memory clock, video encoder and decoder use."""
        pstate = self.query("nvmlDeviceGetPerformanceState", handle)
        enc = self.query("nvmlDeviceGetEncoderUtilization", handle)
        dec = self.query("nvmlDeviceGetDecoderUtilization", handle)
        return {
            "fan_speed_pct": _int(self.query("nvmlDeviceGetFanSpeed", handle)),
            "pstate": None
            if pstate is None or int(pstate) >= _NVML_PSTATE_UNKNOWN
            else int(pstate),
            "mem_clock_mhz": _int(self.query("nvmlDeviceGetClockInfo", handle, self.mem)),
            "mem_clock_max_mhz": _int(self.query("nvmlDeviceGetMaxClockInfo", handle, self.mem)),
            "enc_util_pct": None if enc is None else int(enc[0]),
            "dec_util_pct": None if dec is None else int(dec[0]),
        }

    def identity(self, handle: Any) -> Tuple[str, str, str]:
        """(uuid, name, PCI bus id); "unknown" for any the driver does not give."""
        name = _opt_text(self.query("nvmlDeviceGetName", handle))
        uuid = _opt_text(self.query("nvmlDeviceGetUUID", handle))
        pci = self.query("nvmlDeviceGetPciInfo", handle)
        bus_id = _opt_text(getattr(pci, "busId", None)) if pci is not None else None
        return (uuid or "unknown", name or "unknown", bus_id or "unknown")

    def utilization(self, handle: Any) -> Dict[str, Any]:
        util = self.query("nvmlDeviceGetUtilizationRates", handle)
        if util is None:
            return {}
        return {"util_gpu_pct": _int(util.gpu), "util_mem_pct": _int(util.memory)}

    def memory(self, handle: Any) -> Dict[str, Any]:
        """Memory v2 (used excludes the driver's reservation), falling back to v1."""
        mem = None
        v2 = getattr(self.nv, "nvmlMemory_v2", None)
        if v2 is not None:
            mem = self.query("nvmlDeviceGetMemoryInfo", handle, version=v2)
        if mem is None:
            mem = self.query("nvmlDeviceGetMemoryInfo", handle)
        if mem is None:
            return {}
        return {
            "mem_total_bytes": _int(mem.total),
            "mem_used_bytes": _int(mem.used),
            "mem_free_bytes": _int(mem.free),
        }

    def power(self, handle: Any) -> Dict[str, Any]:
        sensor = getattr(self.nv, "NVML_TEMPERATURE_GPU", 0)
        return {
            "temp_c": _int(self.query("nvmlDeviceGetTemperature", handle, sensor)),
            "power_draw_w": _watts(self.query("nvmlDeviceGetPowerUsage", handle)),
            "power_limit_w": _watts(self.query("nvmlDeviceGetEnforcedPowerLimit", handle)),
            "power_default_limit_w": _watts(
                self.query("nvmlDeviceGetPowerManagementDefaultLimit", handle)
            ),
        }

    def clocks(self, handle: Any) -> Dict[str, Any]:
        sm = getattr(self.nv, "NVML_CLOCK_SM", 1)
        mask = self.query_newest(
            handle,
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        )
        return {
            "sm_clock_mhz": _int(self.query("nvmlDeviceGetClockInfo", handle, sm)),
            "sm_clock_max_mhz": _int(self.query("nvmlDeviceGetMaxClockInfo", handle, sm)),
            "clock_event_reasons": None if mask is None else list(decode_clock_reasons(int(mask))),
        }

    def ecc(self, handle: Any) -> Dict[str, Any]:
        nv = self.nv
        mode = self.query("nvmlDeviceGetEccMode", handle)
        errors = self.query(
            "nvmlDeviceGetTotalEccErrors",
            handle,
            getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(nv, "NVML_VOLATILE_ECC", 0),
        )
        rows = self.query("nvmlDeviceGetRemappedRows", handle)
        pages = self.query("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        return {
            "ecc_mode_enabled": None if mode is None else int(mode[0]) == 1,
            "ecc_uncorrected_volatile": _int(errors),
            "remapped_rows_pending": None if rows is None else bool(rows[2]),
            "remapped_rows_failure": None if rows is None else bool(rows[3]),
            "retired_pages_pending": None if pages is None else bool(pages),
        }

    def pcie(self, handle: Any) -> Dict[str, Any]:
        return {
            "pcie_gen_current": _int(self.query("nvmlDeviceGetCurrPcieLinkGeneration", handle)),
            "pcie_gen_max": _int(self.query("nvmlDeviceGetMaxPcieLinkGeneration", handle)),
            "pcie_width_current": _int(self.query("nvmlDeviceGetCurrPcieLinkWidth", handle)),
            "pcie_width_max": _int(self.query("nvmlDeviceGetMaxPcieLinkWidth", handle)),
        }

    def modes(self, handle: Any) -> Dict[str, Any]:
        persistence = self.query("nvmlDeviceGetPersistenceMode", handle)
        mig = self.query("nvmlDeviceGetMigMode", handle)
        cc = self.query("nvmlDeviceGetCudaComputeCapability", handle)
        attrs = self.query("nvmlDeviceGetAttributes", handle)
        sm_count = _int(getattr(attrs, "multiprocessorCount", None)) if attrs is not None else None
        return {
            "persistence_mode": None if persistence is None else int(persistence) == 1,
            "mig_mode": None if mig is None else int(mig[0]) == 1,
            "compute_capability": None if cc is None else f"{int(cc[0])}.{int(cc[1])}",
            "sm_count": sm_count or None,
        }

    def processes(self, index: int, handle: Any) -> List[Document]:
        """Compute and graphics processes on one GPU, each pid once (its largest memory), with
        their SM and memory-bandwidth use where the driver samples it."""
        seen: Dict[int, Optional[int]] = {}
        for kind in ("Compute", "Graphics"):
            name = f"nvmlDeviceGet{kind}RunningProcesses"
            for proc in self.query_newest(handle, name, name + "_v2") or ():
                pid = int(proc.pid)
                used = _int(getattr(proc, "usedGpuMemory", None))
                if pid not in seen or (used or 0) > (seen[pid] or 0):
                    seen[pid] = used
        if not seen:
            return []
        use = self.process_utilization(handle)
        out = []
        for pid, used in sorted(seen.items()):
            doc = _process(index, pid, used)
            if use is not None:
                doc["sm_util_pct"], doc["mem_bw_util_pct"] = use.get(pid, (0, 0))
            out.append(doc)
        return out

    def process_utilization(self, handle: Any) -> Optional[Dict[int, Tuple[int, int]]]:
        """pid -> (SM %, memory bandwidth %) from the newest recent sample of each process.

        None when the driver cannot say (no such call, not supported, MIG); {} when it
        sampled and no process used the GPU (NVML answers "not found"). A sample older than
        PROCESS_SAMPLE_MAX_AGE_S is dropped: the process has not used the GPU since.
        """
        nv = self.nv
        fn = getattr(nv, "nvmlDeviceGetProcessUtilization", None)
        if fn is None:
            return None
        try:
            samples = fn(handle, 0)
        except self._mismatch:
            return None
        except nv.NVMLError as exc:
            # "Not found": no process used the GPU lately. nvidia-ml-py raises its error even
            # for success when the driver says there are no samples at all (value 0).
            if getattr(exc, "value", None) in (_NVML_NOT_FOUND, _NVML_SUCCESS):
                return {}
            self._note(exc)
            return None
        newest: Dict[int, Tuple[int, int, int]] = {}
        for sample in samples or ():
            pid, stamp = int(sample.pid), int(sample.timeStamp)
            if pid not in newest or stamp > newest[pid][0]:
                newest[pid] = (stamp, int(sample.smUtil), int(sample.memUtil))
        return {
            pid: (sm, mem)
            for pid, (stamp, sm, mem) in newest.items()
            if not _stale_sample(stamp, self.now)
        }

    def topology(self) -> Document:
        """See :func:`collect_topology`."""
        gpus: List[Document] = []
        handles: List[Tuple[int, Any]] = list(self.handles())
        for index, handle in handles:
            _uuid, _name, bus_id = self.identity(handle)
            gpus.append({"index": index, "pci_bus_id": bus_id, "nvlinks": self.nvlinks(handle)})
        by_bus = {bus_key(g["pci_bus_id"]): g["index"] for g in gpus}
        pairs: List[Document] = []
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                pairs.append(self.pair(handles[a], handles[b], gpus[a], by_bus))
        return {"gpus": gpus, "pairs": pairs, "error": self.enum_error}

    def nvlinks(self, handle: Any) -> Optional[List[Document]]:
        """Every NVLink of one GPU; None when it has none or the driver cannot say."""
        nv = self.nv
        state_fn = getattr(nv, "nvmlDeviceGetNvLinkState", None)
        if state_fn is None:
            return None
        links: List[Document] = []
        for link in range(NVLINK_MAX_LINKS):
            try:
                active = int(state_fn(handle, link)) == 1
            except self._errors:
                break  # not supported (no NVLink) or past the last link (invalid argument)
            remote = (
                self.query("nvmlDeviceGetNvLinkRemotePciInfo", handle, link) if active else None
            )
            kind = (
                self.query("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link) if active else None
            )
            links.append(
                {
                    "link": link,
                    "active": active,
                    "version": _int(self.query("nvmlDeviceGetNvLinkVersion", handle, link)),
                    "remote_bus_id": _opt_text(getattr(remote, "busId", None)) if remote else None,
                    "remote_type": None
                    if kind is None
                    else _NVLINK_REMOTE_TYPES.get(int(kind), "unknown"),
                }
            )
        return links or None

    def pair(
        self,
        first: Tuple[int, Any],
        second: Tuple[int, Any],
        first_doc: Document,
        by_bus: Dict[Tuple[int, int, int], int],
    ) -> Document:
        """How two GPUs reach each other."""
        (a, ha), (b, hb) = first, second
        level = self.query("nvmlDeviceGetTopologyCommonAncestor", ha, hb)
        links = first_doc["nvlinks"] or []
        active = [link for link in links if link["active"]]
        direct = sum(1 for link in active if by_bus.get(bus_key(link["remote_bus_id"])) == b)
        via_switch = any(link["remote_type"] == "nvswitch" for link in active)
        return {
            "a": a,
            "b": b,
            "level": None if level is None else TOPOLOGY_LEVELS.get(int(level), str(level)),
            "nvlinks": direct,
            "via_nvswitch": via_switch,
            "p2p_read": self.p2p(ha, hb, _P2P_READ),
            "p2p_nvlink": self.p2p(ha, hb, _P2P_NVLINK),
        }

    def p2p(self, ha: Any, hb: Any, capability: int) -> Optional[str]:
        status = self.query("nvmlDeviceGetP2PStatus", ha, hb, capability)
        return None if status is None else P2P_STATUSES.get(int(status), "unknown")

    def query(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``pynvml.<name>(*args)``, or None when absent, not supported or failing."""
        fn = getattr(self.nv, name, None)
        if fn is None:
            return None
        try:
            return fn(*args, **kwargs)
        except self._errors as exc:
            self._note(exc)
            return None

    def query_newest(self, handle: Any, newest: str, older: str) -> Any:
        """Call ``newest``; fall back to ``older`` when the driver lacks the newer symbol."""
        fn = getattr(self.nv, newest, None)
        if fn is not None:
            try:
                return fn(handle)
            except self._mismatch:
                pass
            except self.nv.NVMLError as exc:
                if getattr(exc, "value", None) != _NVML_FUNCTION_NOT_FOUND:
                    self._note(exc)
                    return None
        return self.query(older, handle)

    def _note(self, exc: BaseException) -> None:
        if getattr(exc, "value", None) == _NVML_GPU_IS_LOST:
            self._lost_now = True

    def _lost_error(self) -> Optional[Document]:
        if not self.lost_indexes:
            return None
        which = ", ".join(str(i) for i in self.lost_indexes)
        return _error(
            "gpu_lost", f"GPU {which} stopped answering NVML (GPU is lost)", HINTS["gpu_lost"]
        )


def _import_pynvml() -> Any:
    try:
        stand_in = _defer_find_library()
        try:
            import pynvml
        finally:
            _restore_find_library(stand_in)
    except ImportError as exc:
        raise NvmlUnavailable(
            _error(
                "library_not_found",
                f"the Python NVML bindings (pynvml) are missing: {exc}",
                "Run the agent as the single-file gpu-agent.pyz, which carries them, or "
                "`pip install nvidia-ml-py`.",
            )
        ) from exc
    return pynvml


def _defer_find_library() -> Optional[object]:
    """Let pynvml be imported without loading ``ctypes.util``, in a single-threaded process.

    pynvml imports ``find_library`` from ``ctypes.util`` but calls it only on Windows; loading
    that module (shutil, subprocess, tempfile) costs about a third of pynvml's import, which
    the agent pays on every ``status``. Until :func:`_restore_find_library`, a stand-in module
    whose ``find_library`` loads the real one on first call sits in ``sys.modules``; it is
    returned (None when nothing was replaced). With other threads running (the bot), nothing
    is replaced: another thread could import ``ctypes.util`` meanwhile and get the stand-in.
    """
    import threading

    if "ctypes.util" in sys.modules or "pynvml" in sys.modules or threading.active_count() > 1:
        return None
    stand_in = type(sys)("ctypes.util")
    stand_in.find_library = _find_library  # type: ignore[attr-defined]
    _STAND_INS.append(stand_in)
    sys.modules["ctypes.util"] = stand_in
    return stand_in


def _restore_find_library(stand_in: Optional[object]) -> None:
    if stand_in is None:
        return
    if sys.modules.get("ctypes.util") is stand_in:
        del sys.modules["ctypes.util"]
    _STAND_INS.remove(stand_in)


_STAND_INS: List[object] = []


def _find_library(name: str) -> Optional[str]:
    """``ctypes.util.find_library(name)``, the real one (loaded now if need be)."""
    if sys.modules.get("ctypes.util") in _STAND_INS:
        del sys.modules["ctypes.util"]
    from ctypes.util import find_library

    return find_library(name)


def _error(code: str, message: str, hint: str) -> Document:
    return {"code": code, "message": message, "hint": hint}


def _gpu_document(values: Document) -> Document:
    return {name: values.get(name) for name in GPU_FIELDS}


def _process(gpu_index: int, pid: int, used: Optional[int]) -> Document:
    user, command = _proc_owner_and_command(pid)
    doc: Document = dict.fromkeys(PROCESS_FIELDS)
    doc.update(gpu_index=gpu_index, pid=pid, user=user, command=command, used_mem_bytes=used)
    return doc


def _stale_sample(stamp_us: int, now: float) -> bool:
    """Whether a sample stamped ``stamp_us`` (NVML: CPU time in microseconds since the epoch)
    is older than PROCESS_SAMPLE_MAX_AGE_S. A stamp not within a day of ``now`` is from
    another clock: then it cannot be aged, and counts as fresh."""
    age = now - stamp_us / 1e6
    if abs(age) > 86400:
        return False
    return age > PROCESS_SAMPLE_MAX_AGE_S


def _proc_owner_and_command(pid: int) -> Tuple[Optional[str], Optional[str]]:
    """User name and command line from /proc/<pid>; None for what cannot be read.

    NVML reports host pids: from inside a container's pid namespace they are not visible.
    """
    base = f"/proc/{pid}"
    user: Optional[str] = None
    command: Optional[str] = None
    try:
        uid = os.stat(base).st_uid
    except OSError:
        return None, None
    try:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        user = str(uid)
    try:
        with open(f"{base}/cmdline", "rb") as fh:
            raw = fh.read(_CMDLINE_MAX_CHARS * 4)
    except OSError:
        raw = b""
    parts = [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]
    if parts:
        command = " ".join(parts)[:_CMDLINE_MAX_CHARS]
    return user, command


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _opt_text(value: Any) -> Optional[str]:
    return None if value is None else _text(value)


def _int(value: Any) -> Optional[int]:
    return None if value is None else int(value)


def _watts(milliwatts: Any) -> Optional[float]:
    return None if milliwatts is None else round(int(milliwatts) / 1000.0, 3)
