"""Run the CUDA probe (agents/cuda_probe.py) in the instance's Python and parse what it says.

Standard library only (Python 3.9+). The probe's source is read with ``pkgutil.get_data`` so
it works from the zipapp, and runs as ``[python, "-c", source, ...]`` in its own process group
with a timeout: a torch that hangs, crashes or prints nonsense gives a ProbeOutcome with
``failure`` set, never an exception.
"""

from __future__ import annotations

import json
import os
import pkgutil
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

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
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        start_new_session=True,
    )
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


def summary_dict(outcome: ProbeOutcome) -> Dict[str, Any]:
    """A short JSON-ready description of a probe run for check details."""
    return {
        "python": outcome.python,
        "elapsed_s": round(outcome.elapsed_s, 3),
        "failure": outcome.failure,
    }
