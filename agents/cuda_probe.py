"""The CUDA probe: runs inside the instance's own Python and reports what its torch can do.

``gpu-agent health`` runs this file's source as ``python -c SOURCE [--full]`` in a subprocess
with a timeout (the agent itself never imports torch). Standard library plus torch only, on
Python 3.7 or newer. It prints one line, ``GPU_AGENT_PROBE {json}``, on stdout (torch may print
other lines around it) and exits 0 unless the interpreter itself breaks.

Plain run: Python and torch versions, torch's CUDA version, whether CUDA initialises (with
the error when not), the compiled architectures and every visible device. With ``--full``,
per device: a 4096x4096 fp32 matmul checked against the CPU (normwise relative error), device
copy bandwidth in GB/s (bytes read plus written, 10^9) and bf16 GEMM TFLOP/s (fp16 before
compute capability 8.0), timed with CUDA events after a warm-up; with two or more devices,
peer-to-peer copy bandwidth between every ordered pair (GB/s one way, 10^9).

``--stress SECONDS [--window SECONDS]`` holds bf16 (fp16) GEMM load on every device for that
long and reports the rate per window; the agent samples clocks, temperature and power through
NVML meanwhile. ``--nccl-rank R --nccl-world N --nccl-init FILE`` is one rank of an all-reduce
run on one node (``torch.distributed``, NCCL, ``file://`` rendezvous): the agent starts N of
them; rank 0 reports algorithm and bus bandwidth per message size as nccl-tests computes them.
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
P2P_BYTES = 1 << 28
P2P_ITERS = 10
STRESS_N = 8192
STRESS_WINDOW_S = 5.0
#: Messages of the all-reduce run, bytes (float32 elements x 4).
NCCL_SIZES = (1 << 20, 1 << 25, 1 << 28)
NCCL_WARMUP_ITERS = 5
NCCL_TIMED_ITERS = 20


def main(argv: List[str]) -> int:
    """Probe and print the result line: plain, ``--full``, ``--stress S`` or one NCCL rank."""
    options = _options(argv)
    if "--nccl-rank" in options:
        sizes = options.get("--nccl-sizes")
        doc = nccl_rank(
            int(options["--nccl-rank"]),
            int(options["--nccl-world"]),
            options["--nccl-init"],
            options.get("--nccl-backend", "nccl"),
            tuple(int(v) for v in sizes.split(",")) if sizes else NCCL_SIZES,
        )
        if doc is None:
            return 0
    elif "--stress" in options:
        doc = stress(float(options["--stress"]), float(options.get("--window", STRESS_WINDOW_S)))
    else:
        doc = probe(full="--full" in argv)
    sys.stdout.flush()
    sys.stdout.write(MARKER + json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


def _options(argv: List[str]) -> Dict[str, str]:
    """``--name value`` pairs (a flag alone maps to "")."""
    found: Dict[str, str] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            found[word] = "" if nxt.startswith("--") else nxt
    return found


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
    """Matmul check, copy bandwidth and GEMM rate on each CUDA device in ``indices``; with two
    or more, peer-to-peer copy bandwidth between every ordered pair."""
    result: Dict[str, List[Dict[str, Any]]] = {"matmul": [], "bandwidth": [], "gemm": []}
    inputs = _guarded(matmul_inputs, torch, MATMUL_N)
    for index in indices:
        for name, outcome in _measure_device(torch, index, inputs).items():
            result[name].append(_tag(index, outcome))
    if len(indices) >= 2:
        result["p2p"] = [
            dict(_guarded(measure_p2p, torch, src, dst, P2P_BYTES), src=src, dst=dst)
            for src in indices
            for dst in indices
            if src != dst
        ]
    return result


def measure_p2p(
    torch: Any, src: int, dst: int, nbytes: int, iters: int = P2P_ITERS
) -> Dict[str, Any]:
    """Copy rate from device ``src`` to device ``dst`` in GB/s (10^9 bytes, one way), with
    whether CUDA lets ``src`` reach ``dst``'s memory directly (else copies go through the host)."""
    peer = bool(torch.cuda.can_device_access_peer(src, dst))
    numel = max(nbytes // 4, 1)
    source = torch.ones(numel, dtype=torch.float32, device=f"cuda:{src}")
    target = torch.empty(numel, dtype=torch.float32, device=f"cuda:{dst}")
    for _ in range(2):
        target.copy_(source)
    torch.cuda.synchronize(src)
    torch.cuda.synchronize(dst)
    began = time.perf_counter()
    for _ in range(iters):
        target.copy_(source)
    torch.cuda.synchronize(src)
    torch.cuda.synchronize(dst)
    seconds = max(time.perf_counter() - began, 1e-9)
    del source, target
    torch.cuda.empty_cache()
    moved = numel * 4 * iters
    return {
        "gbps": moved / seconds / 1e9,
        "peer_access": peer,
        "bytes_moved": moved,
        "seconds": seconds,
    }


# --- sustained load (--stress) ----------------------------------------------------------------


def stress(duration_s: float, window_s: float) -> Dict[str, Any]:
    """GEMM load on every visible device for ``duration_s``; the rate per window of ``window_s``."""
    doc = probe(full=False)
    doc["stress"] = None
    if not (doc["cuda_available"] and doc["device_count"] > 0):
        return doc
    import torch

    devices = [f"cuda:{i}" for i in range(doc["device_count"])]
    dtype = "bfloat16" if _capability(torch, 0) >= (8, 0) else "float16"
    doc["stress"] = _guarded(stress_gemm, torch, devices, duration_s, window_s, STRESS_N, dtype)
    return doc


def stress_gemm(
    torch: Any,
    devices: List[str],
    duration_s: float,
    window_s: float,
    n: int,
    dtype: str,
    clock: Callable[[], float] = time.monotonic,
) -> Dict[str, Any]:
    """Keep ``devices`` busy with n x n x n products for ``duration_s`` seconds.

    Launches go round-robin (CUDA runs them asynchronously, so every device stays busy) and
    each window ends with a synchronisation. Returns ``{"n", "dtype", "windows": [{"t_s",
    "seconds", "tflops": {index: TFLOP/s}}], "errors": {index: text}}``.
    """
    kind = getattr(torch, dtype)
    mats = {}
    errors: Dict[str, str] = {}
    for device in devices:
        try:
            a = torch.randn(n, n, device=device, dtype=kind)
            b = torch.randn(n, n, device=device, dtype=kind)
            mats[device] = (a, b, torch.empty(n, n, device=device, dtype=kind))
        except Exception as exc:  # noqa: BLE001 - reported per device
            errors[_index_of(device)] = _describe_error(exc)
    windows: List[Dict[str, Any]] = []
    began = clock()
    while mats and clock() - began < duration_s:
        start = clock()
        counts = dict.fromkeys(mats, 0)
        while clock() - start < window_s and clock() - began < duration_s:
            for device, (a, b, out) in list(mats.items()):
                try:
                    torch.matmul(a, b, out=out)
                    counts[device] += 1
                except Exception as exc:  # noqa: BLE001 - reported per device
                    errors[_index_of(device)] = _describe_error(exc)
                    del mats[device]
            if any(c and c % 4 == 0 for c in counts.values()):
                _synchronize(torch, mats)  # keep the queues short: the clock stays honest
        _synchronize(torch, mats)
        seconds = max(clock() - start, 1e-9)
        windows.append(
            {
                "t_s": round(clock() - began, 3),
                "seconds": round(seconds, 3),
                "tflops": {
                    _index_of(d): float(f"{2.0 * n**3 * c / seconds / 1e12:.6g}")
                    for d, c in counts.items()
                    if d in mats
                },
            }
        )
    return {"n": n, "dtype": dtype, "windows": windows, "errors": errors}


def _synchronize(torch: Any, mats: Dict[str, Any]) -> None:
    """Wait until every CUDA device in ``mats`` has finished what was launched on it."""
    for device in mats:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)


def _index_of(device: str) -> str:
    return device.split(":", 1)[1] if ":" in device else "0"


# --- all-reduce across the devices (one rank of the NCCL run) ---------------------------------


def nccl_rank(
    rank: int,
    world: int,
    init_file: str,
    backend: str = "nccl",
    sizes: Tuple[int, ...] = NCCL_SIZES,
) -> Optional[Dict[str, Any]]:
    """One rank of the all-reduce run; rank 0 returns the report, other ranks None.

    Bandwidths as nccl-tests computes them: algbw = bytes / time; busbw = algbw * 2(n-1)/n,
    which is comparable with one link's bandwidth whatever the number of GPUs.
    """
    try:
        import torch
        import torch.distributed as dist
    except BaseException as exc:  # noqa: BLE001 - reported
        return {"nccl": {"error": _describe_error(exc)}} if rank == 0 else None
    report: Dict[str, Any] = {"world_size": world, "backend": backend, "sizes": [], "error": None}
    try:
        if backend == "nccl" and not dist.is_nccl_available():
            raise RuntimeError("this torch has no NCCL (a CPU-only or ROCm build)")
        device = "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = f"cuda:{rank}"
            report["nccl_version"] = _nccl_version(torch)
        dist.init_process_group(
            backend, init_method="file://" + init_file, rank=rank, world_size=world
        )
        try:
            for nbytes in sizes:
                report["sizes"].append(_allreduce_size(torch, dist, device, nbytes, world))
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported
        report["error"] = _describe_error(exc)
    return {"nccl": report} if rank == 0 else None


def _nccl_version(torch: Any) -> str:
    """NCCL's version as "2.21.5" (torch gives a tuple, or an int in old releases)."""
    version = torch.cuda.nccl.version()
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _allreduce_size(torch: Any, dist: Any, device: str, nbytes: int, world: int) -> Dict[str, Any]:
    data = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    for _ in range(NCCL_WARMUP_ITERS):
        dist.all_reduce(data)
    _sync(torch, device)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(NCCL_TIMED_ITERS):
        dist.all_reduce(data)
    _sync(torch, device)
    elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank decides
    seconds = max(float(elapsed.item()) / NCCL_TIMED_ITERS, 1e-9)
    algbw = data.numel() * 4 / seconds / 1e9
    return {
        "bytes": data.numel() * 4,
        "seconds_per_op": seconds,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (world - 1) / world,
    }


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


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
