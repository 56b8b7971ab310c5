"""The CUDA probe: runs inside the instance's own Python and reports what its torch can do.

``gpu-agent health`` runs this file's source as ``python -c SOURCE [--full]`` in a subprocess
with a timeout (the agent itself never imports torch). Standard library plus torch only, on
Python 3.7 or newer. It prints one line, ``GPU_AGENT_PROBE {json}``, on stdout (torch may print
other lines around it) and exits 0 unless the interpreter itself breaks.

Plain run: Python and torch versions, torch's CUDA version, whether CUDA initialises (with
the error when not), the compiled architectures and every visible device. With ``--full``,
per device: a 4096x4096 fp32 matmul checked against the CPU (normwise relative error), device
copy bandwidth in GB/s (bytes read plus written, 10^9) and bf16 GEMM TFLOP/s (fp16 before
compute capability 8.0), timed with CUDA events after a warm-up.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

MARKER = "GPU_AGENT_PROBE "
PROBE_SCHEMA = 1

MATMUL_N = 4096
GEMM_N = 8192
COPY_BYTES = 1 << 30
GEMM_WARMUP_ITERS = 10
GEMM_TIMED_ITERS = 30
COPY_WARMUP_ITERS = 5
COPY_TIMED_ITERS = 30


def main(argv: List[str]) -> int:
    """Probe and print the result line; ``--full`` adds the measurements."""
    doc = probe(full="--full" in argv)
    sys.stdout.flush()
    sys.stdout.write(MARKER + json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


def probe(full: bool) -> Dict[str, Any]:
    """Everything the health checks need from this Python, as a JSON-ready dict."""
    doc: Dict[str, Any] = {
        "probe_schema": PROBE_SCHEMA,
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "torch_installed": False,
        "torch_import_error": None,
        "torch_version": None,
        "torch_cuda_version": None,
        "torch_hip_version": None,
        "cuda_available": False,
        "cuda_init_error": None,
        "device_count": 0,
        "arch_list": [],
        "devices": [],
        "full": None,
    }
    torch = _import_torch(doc)
    if torch is None:
        return doc
    _describe_cuda(torch, doc)
    if full and doc["cuda_available"] and doc["device_count"] > 0:
        doc["full"] = measure_all(torch, list(range(doc["device_count"])))
    return doc


def _import_torch(doc: Dict[str, Any]) -> Any:
    """Import torch, recording why not; returns the module or None."""
    try:
        import torch
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            doc["torch_import_error"] = "No module named 'torch'"
            return None
        doc["torch_installed"] = True
        doc["torch_import_error"] = _describe_error(exc)
        return None
    except BaseException as exc:  # noqa: BLE001 - a broken install raises anything
        doc["torch_installed"] = True
        doc["torch_import_error"] = _describe_error(exc)
        return None
    doc["torch_installed"] = True
    version = getattr(torch, "__version__", None)
    if version is None:
        doc["torch_import_error"] = (
            "torch has no __version__: a leftover directory of an old install"
        )
        return None
    doc["torch_version"] = str(version)
    return torch


def _describe_cuda(torch: Any, doc: Dict[str, Any]) -> None:
    version = getattr(torch, "version", None)
    doc["torch_cuda_version"] = getattr(version, "cuda", None)
    doc["torch_hip_version"] = getattr(version, "hip", None)
    try:
        doc["arch_list"] = [str(a) for a in torch.cuda.get_arch_list()]
    except Exception as exc:  # noqa: BLE001 - reported
        doc["cuda_init_error"] = _describe_error(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = bool(torch.cuda.is_available())
        except Exception as exc:  # noqa: BLE001 - reported
            available = False
            doc["cuda_init_error"] = _describe_error(exc)
    doc["cuda_available"] = available
    if not available:
        if doc["torch_cuda_version"] and doc["cuda_init_error"] is None:
            doc["cuda_init_error"] = _cuda_init_error(torch, caught)
        return
    try:
        doc["device_count"] = int(torch.cuda.device_count())
        doc["devices"] = [_device(torch, i) for i in range(doc["device_count"])]
    except Exception as exc:  # noqa: BLE001 - reported
        doc["cuda_init_error"] = _describe_error(exc)


def _cuda_init_error(torch: Any, caught: List[Any]) -> Optional[str]:
    """Why CUDA did not initialise: torch.cuda.init()'s error, else the warning it gave."""
    try:
        torch.cuda.init()
    except Exception as exc:  # noqa: BLE001 - reported
        return _describe_error(exc)
    for warning in caught:
        return str(warning.message).strip()
    return None


def _device(torch: Any, index: int) -> Dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": str(props.name),
        "capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": int(props.total_memory),
        "sm_count": int(props.multi_processor_count),
    }


# --- measurements (--full) --------------------------------------------------------------------


def measure_all(torch: Any, indices: List[int]) -> Dict[str, List[Dict[str, Any]]]:
    """Matmul check, copy bandwidth and GEMM rate on each CUDA device in ``indices``."""
    result: Dict[str, List[Dict[str, Any]]] = {"matmul": [], "bandwidth": [], "gemm": []}
    inputs = _guarded(matmul_inputs, torch, MATMUL_N)
    for index in indices:
        for name, outcome in _measure_device(torch, index, inputs).items():
            result[name].append(_tag(index, outcome))
    return result


def _measure_device(torch: Any, index: int, inputs: Any) -> Dict[str, Any]:
    """The three measurements on one device; a device that breaks gives errors, not an abort."""
    device = f"cuda:{index}"
    try:
        with torch.cuda.device(index):
            if isinstance(inputs, tuple):
                matmul = _guarded(check_matmul, torch, device, *inputs)
            else:
                matmul = inputs
            bandwidth = _guarded(measure_bandwidth, torch, device, _copy_bytes(torch, index))
            dtype = "bfloat16" if _capability(torch, index) >= (8, 0) else "float16"
            gemm = _guarded(measure_gemm, torch, device, GEMM_N, dtype)
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - any CUDA failure is a finding, not a crash
        error = {"error": _describe_error(exc)}
        return {"matmul": error, "bandwidth": error, "gemm": error}
    return {"matmul": matmul, "bandwidth": bandwidth, "gemm": gemm}


def matmul_inputs(torch: Any, n: int) -> Tuple[Any, Any, Any]:
    """Two seeded n x n fp32 matrices in [-1, 1) on the CPU, and their product there."""
    generator = torch.Generator().manual_seed(20240601)
    a = torch.rand(n, n, generator=generator) * 2 - 1
    b = torch.rand(n, n, generator=generator) * 2 - 1
    return a, b, a @ b


def check_matmul(torch: Any, device: str, a: Any, b: Any, ref: Any) -> Dict[str, Any]:
    """``a @ b`` on ``device`` against ``ref``: max |difference| / max |ref| (full fp32)."""
    _full_fp32(torch)
    out = (a.to(device) @ b.to(device)).cpu()
    finite = bool(torch.isfinite(out).all())
    scale = float(ref.abs().max()) or 1.0
    error = float((out - ref).abs().max()) / scale if finite else None
    return {"n": int(a.shape[0]), "finite": finite, "max_rel_error": error}


def measure_bandwidth(
    torch: Any, device: str, nbytes: int, iters: int = COPY_TIMED_ITERS
) -> Dict[str, Any]:
    """Device-to-device copy rate: GB/s (10^9 bytes) counting bytes read plus written."""
    numel = max(nbytes // 4, 1)
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(COPY_WARMUP_ITERS):
        dst.copy_(src)
    seconds = _timed(torch, device, lambda: dst.copy_(src), iters)
    moved = 2 * numel * 4 * iters
    return {"gbps": moved / seconds / 1e9, "bytes_moved": moved, "seconds": seconds}


def measure_gemm(
    torch: Any, device: str, n: int, dtype: str, iters: int = GEMM_TIMED_ITERS
) -> Dict[str, Any]:
    """Dense n x n x n matrix product rate in TFLOP/s (2 n^3 per product) in ``dtype``."""
    kind = getattr(torch, dtype)
    a = torch.randn(n, n, device=device, dtype=kind)
    b = torch.randn(n, n, device=device, dtype=kind)
    out = torch.empty(n, n, device=device, dtype=kind)
    for _ in range(GEMM_WARMUP_ITERS):
        torch.matmul(a, b, out=out)
    seconds = _timed(torch, device, lambda: torch.matmul(a, b, out=out), iters)
    return {
        "tflops": 2.0 * n**3 * iters / seconds / 1e12,
        "dtype": dtype,
        "n": n,
        "seconds": seconds,
    }


def _timed(torch: Any, device: str, step: Callable[[], Any], iters: int) -> float:
    """Seconds for ``iters`` calls of ``step``: CUDA events on a GPU, a wall clock on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        return max(float(start.elapsed_time(end)) / 1000.0, 1e-9)
    began = time.perf_counter()
    for _ in range(iters):
        step()
    return max(time.perf_counter() - began, 1e-9)


def _copy_bytes(torch: Any, index: int) -> int:
    """Buffer size for the copy test: 1 GiB, less when the GPU has little free memory."""
    try:
        free, _total = torch.cuda.mem_get_info(index)
    except (AttributeError, RuntimeError):
        return COPY_BYTES // 4
    return int(max(min(COPY_BYTES, free // 8), 1 << 20))


def _capability(torch: Any, index: int) -> Tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def _full_fp32(torch: Any) -> None:
    """Turn TF32 off so the GPU product is comparable with the CPU's."""
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    except (AttributeError, RuntimeError):
        return


def _guarded(action: Callable[..., Any], *args: Any) -> Any:
    """``action(*args)``; an exception becomes ``{"error": "..."}`` so other tests still run."""
    try:
        return action(*args)
    except Exception as exc:  # noqa: BLE001 - reported in the result
        return {"error": _describe_error(exc)}


def _tag(index: int, result: Any) -> Dict[str, Any]:
    tagged: Dict[str, Any] = {"index": index}
    tagged.update(result if isinstance(result, dict) else {"error": "no result"})
    return tagged


def _describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:500]}" if first else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
