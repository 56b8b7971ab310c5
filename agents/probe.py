"""Run the CUDA probe (agents/cuda_probe.py) in the instance's Python and parse what it says.

Standard library only (Python 3.9+). The probe's source is read with ``pkgutil.get_data`` so
it works from the zipapp, and runs as ``[python, "-c", source, ...]`` in its own process group
with a timeout: a torch that hangs, crashes or prints nonsense gives a ProbeOutcome with
``failure`` set, never an exception. :func:`run_nccl` starts one probe per GPU for the
all-reduce run (NcclOutcome); :func:`run_stress` holds GEMM load while sampling the GPUs
through a callable the caller gives (StressOutcome).
"""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

MARKER = "GPU_AGENT_PROBE "
DEFAULT_PYTHON = "python3"

#: ``ProbeOutcome.failure`` values.
PYTHON_NOT_FOUND = "python_not_found"
TIMEOUT = "timeout"
CRASHED = "crashed"
BAD_OUTPUT = "bad_output"

_STDERR_TAIL_CHARS = 600


@dataclass(frozen=True)
class ProbeDevice:
    """A CUDA device as torch sees it; ``capability`` like "9.0"."""

    index: int
    name: str
    capability: str
    total_memory_bytes: int
    sm_count: int


@dataclass(frozen=True)
class Measurement:
    """One --full measurement on one device; ``error`` set when it could not run.

    ``value`` is the headline number: normwise relative error (matmul), GB/s (bandwidth) or
    TFLOP/s (gemm); ``extra`` holds the rest (n, dtype, seconds, bytes moved, finite).
    """

    index: int
    value: Optional[float]
    error: Optional[str]
    extra: Mapping[str, Any]


@dataclass(frozen=True)
class PairMeasurement:
    """Copy bandwidth from GPU ``src`` to GPU ``dst`` in GB/s one way; ``peer_access`` says
    whether CUDA let ``src`` reach ``dst``'s memory directly; ``error`` when it failed."""

    src: int
    dst: int
    gbps: Optional[float]
    peer_access: Optional[bool]
    error: Optional[str]


@dataclass(frozen=True)
class TorchFacts:
    """What the probe found. ``torch_version`` None: torch not importable (see import error)."""

    python_version: str
    python_executable: str
    torch_installed: bool
    torch_import_error: Optional[str]
    torch_version: Optional[str]
    torch_cuda_version: Optional[str]
    torch_hip_version: Optional[str]
    cuda_available: bool
    cuda_init_error: Optional[str]
    device_count: int
    arch_list: Tuple[str, ...]
    devices: Tuple[ProbeDevice, ...]
    cuda_visible_devices: Optional[str]
    matmul: Optional[Tuple[Measurement, ...]] = None
    bandwidth: Optional[Tuple[Measurement, ...]] = None
    gemm: Optional[Tuple[Measurement, ...]] = None
    p2p: Optional[Tuple[PairMeasurement, ...]] = None

    @property
    def has_torch(self) -> bool:
        """True when torch imported."""
        return self.torch_version is not None


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe run: ``facts`` when it reported, else ``failure`` (a constant above) and
    ``message`` saying what happened. ``python`` is the interpreter as asked for."""

    python: str
    facts: Optional[TorchFacts]
    failure: Optional[str] = None
    message: str = ""
    elapsed_s: float = 0.0


def probe_source() -> str:
    """The probe script's source, from the package (works inside the zipapp)."""
    raw = pkgutil.get_data("agents", "cuda_probe.py")
    if raw is None:
        raise FileNotFoundError("agents/cuda_probe.py is not packaged with the agent")
    return raw.decode("utf-8")


def resolve_python(python: Optional[str]) -> Optional[str]:
    """The interpreter to run: ``python`` or python3 from PATH; None when it cannot be found."""
    wanted = python or DEFAULT_PYTHON
    if os.sep in wanted:
        path = os.path.abspath(os.path.expanduser(wanted))
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    found = shutil.which(wanted)
    return os.path.abspath(found) if found else None


def run_probe(python: Optional[str], *, full: bool, timeout_s: float) -> ProbeOutcome:
    """Run the probe (plain, or ``full`` for the measurements) within ``timeout_s`` seconds."""
    asked = python or DEFAULT_PYTHON
    resolved = resolve_python(python)
    if resolved is None:
        return ProbeOutcome(
            python=asked,
            facts=None,
            failure=PYTHON_NOT_FOUND,
            message=f"{asked}: no such Python (not on PATH or not executable)",
        )
    argv = [resolved, "-c", probe_source()] + (["--full"] if full else [])
    began = time.monotonic()
    try:
        code, stdout, stderr, timed_out = _run(argv, timeout_s)
    except OSError as exc:
        return ProbeOutcome(
            python=asked, facts=None, failure=CRASHED, message=f"{asked} could not start: {exc}"
        )
    elapsed = time.monotonic() - began
    if timed_out:
        return ProbeOutcome(
            python=asked,
            facts=None,
            failure=TIMEOUT,
            message=f"{asked} did not finish within {timeout_s:g} s{_tail(stderr)}",
            elapsed_s=elapsed,
        )
    facts = parse_output(stdout)
    if facts is not None:
        return ProbeOutcome(python=asked, facts=facts, elapsed_s=elapsed)
    if code != 0:
        return ProbeOutcome(
            python=asked,
            facts=None,
            failure=CRASHED,
            message=f"{asked} exited with {_exit_text(code)}{_tail(stderr)}",
            elapsed_s=elapsed,
        )
    return ProbeOutcome(
        python=asked,
        facts=None,
        failure=BAD_OUTPUT,
        message=f"{asked} printed no probe result{_tail(stderr or stdout)}",
        elapsed_s=elapsed,
    )


def parse_output(stdout: str) -> Optional[TorchFacts]:
    """The facts from the probe's marked line, or None when there is none or it is malformed."""
    for line in reversed(stdout.splitlines()):
        if not line.startswith(MARKER):
            continue
        try:
            return facts_from_dict(json.loads(line[len(MARKER) :]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
    return None


def facts_from_dict(doc: Mapping[str, Any]) -> TorchFacts:
    """Build TorchFacts from the probe's JSON document. Raises KeyError/TypeError/ValueError."""
    full = doc.get("full")
    return TorchFacts(
        python_version=str(doc["python_version"]),
        python_executable=str(doc["python_executable"]),
        torch_installed=bool(doc["torch_installed"]),
        torch_import_error=_opt_str(doc.get("torch_import_error")),
        torch_version=_opt_str(doc.get("torch_version")),
        torch_cuda_version=_opt_str(doc.get("torch_cuda_version")),
        torch_hip_version=_opt_str(doc.get("torch_hip_version")),
        cuda_available=bool(doc["cuda_available"]),
        cuda_init_error=_opt_str(doc.get("cuda_init_error")),
        device_count=int(doc["device_count"]),
        arch_list=tuple(str(a) for a in doc["arch_list"]),
        devices=tuple(_device(d) for d in doc["devices"]),
        cuda_visible_devices=_opt_str(doc.get("cuda_visible_devices")),
        matmul=_measurements(full, "matmul", "max_rel_error"),
        bandwidth=_measurements(full, "bandwidth", "gbps"),
        gemm=_measurements(full, "gemm", "tflops"),
        p2p=_pairs(full),
    )


def _pairs(full: Optional[Mapping[str, Any]]) -> Optional[Tuple[PairMeasurement, ...]]:
    if not full or "p2p" not in full:
        return None
    return tuple(
        PairMeasurement(
            src=int(item["src"]),
            dst=int(item["dst"]),
            gbps=None if item.get("gbps") is None else float(item["gbps"]),
            peer_access=None if item.get("peer_access") is None else bool(item["peer_access"]),
            error=_opt_str(item.get("error")),
        )
        for item in full["p2p"]
    )


def _device(doc: Mapping[str, Any]) -> ProbeDevice:
    return ProbeDevice(
        index=int(doc["index"]),
        name=str(doc["name"]),
        capability=str(doc["capability"]),
        total_memory_bytes=int(doc["total_memory_bytes"]),
        sm_count=int(doc["sm_count"]),
    )


def _measurements(
    full: Optional[Mapping[str, Any]], name: str, headline: str
) -> Optional[Tuple[Measurement, ...]]:
    if not full or name not in full:
        return None
    result: List[Measurement] = []
    for item in full[name]:
        value = item.get(headline)
        extra = {k: v for k, v in item.items() if k not in ("index", "error", headline)}
        result.append(
            Measurement(
                index=int(item["index"]),
                value=None if value is None else float(value),
                error=_opt_str(item.get("error")),
                extra=extra,
            )
        )
    return tuple(result)


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def _run(argv: Sequence[str], timeout_s: float) -> Tuple[int, str, str, bool]:
    """Run ``argv`` in a new process group; on timeout kill the whole group.

    Returns (exit code, stdout, stderr, timed out). The child's working directory is "/"
    so that files in the caller's directory cannot shadow modules.
    """
    proc = _start(argv)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = _drain(proc)
        return proc.returncode, _text(out), _text(err), True
    return proc.returncode, _text(out), _text(err), False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()


def _drain(proc: subprocess.Popen[bytes]) -> Tuple[bytes, bytes]:
    """Collect what the killed child wrote; give up after a few seconds (a grandchild that left
    the process group may hold the pipes open)."""
    try:
        return proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return b"", b""


def _text(raw: Optional[bytes]) -> str:
    return (raw or b"").decode("utf-8", "replace")


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    tail = " | ".join(lines[-3:])
    return ": " + tail[-_STDERR_TAIL_CHARS:]


# --- the all-reduce run ------------------------------------------------------------------------

#: Seconds the other ranks get to finish once rank 0 has reported.
_NCCL_STRAGGLER_S = 10.0


@dataclass(frozen=True)
class NcclSize:
    """All-reduce of ``bytes``: time per operation and bandwidths in GB/s (10^9)."""

    bytes: int
    seconds_per_op: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class NcclOutcome:
    """One all-reduce run across ``world_size`` GPUs. ``failure`` (a constant above) when the
    run did not report; ``error`` when it reported that it could not run (no NCCL, init
    failed). ``busbw_gbps`` is the bus bandwidth at the largest message."""

    python: str
    world_size: int
    sizes: Tuple[NcclSize, ...] = ()
    error: Optional[str] = None
    nccl_version: Optional[str] = None
    failure: Optional[str] = None
    message: str = ""
    elapsed_s: float = 0.0

    @property
    def busbw_gbps(self) -> Optional[float]:
        """Bus bandwidth of the largest message, GB/s; None without results."""
        if not self.sizes:
            return None
        return max(self.sizes, key=lambda size: size.bytes).busbw_gbps


def run_nccl(
    python: Optional[str],
    world_size: int,
    *,
    timeout_s: float,
    backend: str = "nccl",
    sizes: Optional[Sequence[int]] = None,
) -> NcclOutcome:
    """All-reduce across GPUs 0..world_size-1: one probe process per GPU, ``torch.distributed``
    with a ``file://`` rendezvous (no port to find), within ``timeout_s`` seconds in all.

    ``sizes`` are the message sizes in bytes (default the probe's: 1 MiB, 32 MiB, 256 MiB);
    ``backend`` "gloo" runs the same on CPUs. Never raises for a broken machine.
    """
    import tempfile

    asked = python or DEFAULT_PYTHON
    resolved = resolve_python(python)
    if resolved is None:
        return NcclOutcome(
            python=asked,
            world_size=world_size,
            failure=PYTHON_NOT_FOUND,
            message=f"{asked}: no such Python (not on PATH or not executable)",
        )
    source = probe_source()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-agent-nccl-") as where:
        init = os.path.join(where, "rendezvous")
        argv = [resolved, "-c", source, "--nccl-world", str(world_size), "--nccl-init", init]
        argv += ["--nccl-backend", backend]
        if sizes:
            argv += ["--nccl-sizes", ",".join(str(int(n)) for n in sizes)]
        try:
            procs = [_start([*argv, "--nccl-rank", str(rank)]) for rank in range(world_size)]
        except OSError as exc:
            return NcclOutcome(
                python=asked,
                world_size=world_size,
                failure=CRASHED,
                message=f"{asked} could not start: {exc}",
            )
        code, out, err, timed_out = _collect_ranks(procs, began + timeout_s)
    elapsed = time.monotonic() - began
    return _nccl_outcome(asked, world_size, code, out, err, timed_out, timeout_s, elapsed)


def _start(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start a probe in a session of its own, in "/", numbering CUDA devices in PCI order as
    NVML does (CUDA's default puts the fastest first)."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env=dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID"),
        start_new_session=True,
    )


def _collect_ranks(
    procs: List[subprocess.Popen[bytes]], deadline: float
) -> Tuple[int, str, str, bool]:
    """Rank 0's exit code, stdout and stderr (with the first failing rank's stderr appended),
    and whether the run timed out; every rank is gone afterwards."""
    lead = procs[0]
    timed_out = False
    try:
        out, err = lead.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        for proc in procs:
            _kill_group(proc)
        out, err = _drain(lead)
    errors = [_text(err)]
    for proc in procs[1:]:
        left = min(_NCCL_STRAGGLER_S, max(0.0, deadline - time.monotonic()))
        try:
            _, rank_err = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _, rank_err = _drain(proc)
        if proc.returncode not in (0, None) and len(errors) == 1:
            errors.append(_text(rank_err))
    return lead.returncode, _text(out), "\n".join(e for e in errors if e), timed_out


def _nccl_outcome(
    asked: str,
    world_size: int,
    code: int,
    stdout: str,
    stderr: str,
    timed_out: bool,
    timeout_s: float,
    elapsed: float,
) -> NcclOutcome:
    base: Dict[str, Any] = {"python": asked, "world_size": world_size, "elapsed_s": elapsed}
    if timed_out:
        return NcclOutcome(
            **base,
            failure=TIMEOUT,
            message=f"the all-reduce did not finish within {timeout_s:g} s{_tail(stderr)}",
        )
    doc = _marked(stdout)
    report = doc.get("nccl") if isinstance(doc, dict) else None
    if not isinstance(report, dict):
        what = f"exited with {_exit_text(code)}" if code != 0 else "printed no result"
        return NcclOutcome(
            **base,
            failure=CRASHED if code else BAD_OUTPUT,
            message=f"{asked} {what}{_tail(stderr)}",
        )
    try:
        sizes = tuple(
            NcclSize(
                bytes=int(item["bytes"]),
                seconds_per_op=float(item["seconds_per_op"]),
                algbw_gbps=float(item["algbw_gbps"]),
                busbw_gbps=float(item["busbw_gbps"]),
            )
            for item in report.get("sizes") or ()
        )
    except (KeyError, TypeError, ValueError):
        return NcclOutcome(
            **base, failure=BAD_OUTPUT, message=f"{asked} printed a malformed result"
        )
    return NcclOutcome(
        **base,
        sizes=sizes,
        error=_opt_str(report.get("error")),
        nccl_version=_opt_str(report.get("nccl_version")),
    )


def _marked(stdout: str) -> Any:
    """The JSON after the last marker line, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER) :])
            except ValueError:
                return None
    return None


# --- sustained load ---------------------------------------------------------------------------

#: Seconds between NVML samples during the stress run.
STRESS_SAMPLE_S = 1.0


@dataclass(frozen=True)
class StressOutcome:
    """A stress run: ``samples`` are ``{"t_s", "gpus": [...]}`` as the sampler gave them, one
    per interval; ``windows`` the probe's GEMM rate per window (``{"t_s", "seconds",
    "tflops": {index: TFLOP/s}}``); ``errors`` per GPU index. ``failure`` (a constant above)
    when the probe did not report; None ``facts`` with no failure: torch sees no GPU."""

    python: str
    duration_s: float
    samples: Tuple[Mapping[str, Any], ...] = ()
    windows: Tuple[Mapping[str, Any], ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)
    dtype: Optional[str] = None
    n: Optional[int] = None
    facts: Optional[TorchFacts] = None
    failure: Optional[str] = None
    message: str = ""
    elapsed_s: float = 0.0


def run_stress(
    python: Optional[str],
    duration_s: float,
    *,
    sample: Callable[[], Any],
    timeout_s: float,
    interval_s: float = STRESS_SAMPLE_S,
    window_s: Optional[float] = None,
    clock: Callable[[], float] = time.monotonic,
) -> StressOutcome:
    """Hold GEMM load for ``duration_s`` seconds, calling ``sample()`` every ``interval_s``
    (its result is stored with the time since the start). The run may take ``timeout_s`` on
    top of ``duration_s``. Never raises for a broken machine."""
    asked = python or DEFAULT_PYTHON
    resolved = resolve_python(python)
    if resolved is None:
        return StressOutcome(
            python=asked,
            duration_s=duration_s,
            failure=PYTHON_NOT_FOUND,
            message=f"{asked}: no such Python (not on PATH or not executable)",
        )
    window = window_s if window_s is not None else max(1.0, min(10.0, duration_s / 12))
    argv = [
        resolved,
        "-c",
        probe_source(),
        "--stress",
        f"{duration_s:g}",
        "--window",
        f"{window:g}",
    ]
    began = clock()
    try:
        proc = _start(argv)
    except OSError as exc:
        return StressOutcome(
            python=asked, duration_s=duration_s, failure=CRASHED, message=f"{asked}: {exc}"
        )
    samples: List[Mapping[str, Any]] = []
    deadline = began + duration_s + timeout_s
    while True:
        samples.append({"t_s": round(clock() - began, 3), "gpus": sample()})
        try:
            out, err = proc.communicate(timeout=interval_s)
            break
        except subprocess.TimeoutExpired:
            if clock() >= deadline:
                _kill_group(proc)
                _drain(proc)
                return StressOutcome(
                    python=asked,
                    duration_s=duration_s,
                    samples=tuple(samples),
                    failure=TIMEOUT,
                    message=f"the load did not end within {duration_s + timeout_s:g} s",
                    elapsed_s=clock() - began,
                )
    return _stress_outcome(
        asked, duration_s, proc.returncode, _text(out), _text(err), samples, clock() - began
    )


def _stress_outcome(
    asked: str,
    duration_s: float,
    code: int,
    stdout: str,
    stderr: str,
    samples: List[Mapping[str, Any]],
    elapsed: float,
) -> StressOutcome:
    base: Dict[str, Any] = {
        "python": asked,
        "duration_s": duration_s,
        "samples": tuple(samples),
        "elapsed_s": elapsed,
    }
    doc = _marked(stdout)
    if not isinstance(doc, dict) or "stress" not in doc:
        what = f"exited with {_exit_text(code)}" if code != 0 else "printed no result"
        return StressOutcome(
            **base,
            failure=CRASHED if code else BAD_OUTPUT,
            message=f"{asked} {what}{_tail(stderr)}",
        )
    try:
        facts = facts_from_dict(doc)
    except (ValueError, TypeError, KeyError, AttributeError):
        return StressOutcome(
            **base, failure=BAD_OUTPUT, message=f"{asked} printed a malformed result"
        )
    result = doc["stress"]
    if not isinstance(result, dict):
        return StressOutcome(**base, facts=facts)
    return StressOutcome(
        **base,
        facts=facts,
        windows=tuple(result.get("windows") or ()),
        errors={str(k): str(v) for k, v in dict(result.get("errors") or {}).items()},
        dtype=_opt_str(result.get("dtype")),
        n=None if result.get("n") is None else int(result["n"]),
        failure=None if "error" not in result else CRASHED,
        message=str(result.get("error") or ""),
    )


def summary_dict(outcome: ProbeOutcome) -> Dict[str, Any]:
    """A short JSON-ready description of a probe run for check details."""
    return {
        "python": outcome.python,
        "elapsed_s": round(outcome.elapsed_s, 3),
        "failure": outcome.failure,
    }
