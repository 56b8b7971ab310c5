"""agents.cuda_probe (the script) and agents.probe (running it): real interpreters, real torch.

The torch in this virtual environment is the CPU build, so the probe really reports a
CPU-only torch; the measurement functions are exercised on the CPU device with that torch.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from agents import cuda_probe, probe

ROOT = Path(__file__).resolve().parents[2]


def fake_python(tmp_path: Path, name: str, body: str) -> str:
    """An executable script standing in for a Python interpreter."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def python_without_torch(tmp_path: Path) -> str:
    """This interpreter with site-packages switched off (-S): a Python where torch is absent."""
    return fake_python(tmp_path, "python-no-site", f'exec "{sys.executable}" -S "$@"')


# --- the probe in real interpreters -----------------------------------------------------------


@pytest.mark.integration
def test_probe_of_the_cpu_build_of_torch():
    outcome = probe.run_probe(sys.executable, full=False, timeout_s=120)
    assert outcome.failure is None, outcome.message
    facts = outcome.facts
    assert facts is not None
    assert facts.has_torch
    assert facts.torch_version is not None
    assert facts.torch_version.startswith("2.")
    assert facts.torch_cuda_version is None
    assert facts.cuda_available is False
    assert facts.device_count == 0
    assert facts.devices == ()
    assert facts.python_executable == sys.executable
    assert facts.matmul is None


@pytest.mark.integration
def test_probe_in_a_python_without_torch(tmp_path):
    outcome = probe.run_probe(python_without_torch(tmp_path), full=False, timeout_s=30)
    assert outcome.failure is None, outcome.message
    facts = outcome.facts
    assert facts is not None
    assert not facts.torch_installed
    assert not facts.has_torch
    assert facts.torch_import_error == "No module named 'torch'"


@pytest.mark.integration
def test_probe_reports_a_torch_that_fails_to_import(tmp_path):
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "raise OSError('libcudnn.so.9: cannot open shared object file')\n"
    )
    python = fake_python(
        tmp_path,
        "python-broken-torch",
        f'PYTHONPATH="{broken.parent}" exec "{sys.executable}" -S "$@"',
    )
    outcome = probe.run_probe(python, full=False, timeout_s=30)
    facts = outcome.facts
    assert facts is not None
    assert facts.torch_installed
    assert facts.torch_version is None
    assert facts.torch_import_error == "OSError: libcudnn.so.9: cannot open shared object file"


@pytest.mark.integration
def test_probe_reports_a_leftover_torch_directory(tmp_path):
    leftover = tmp_path / "site" / "torch"
    leftover.mkdir(parents=True)  # a namespace package: imports, has no __version__
    python = fake_python(
        tmp_path,
        "python-leftover",
        f'PYTHONPATH="{leftover.parent}" exec "{sys.executable}" -S "$@"',
    )
    facts = probe.run_probe(python, full=False, timeout_s=30).facts
    assert facts is not None
    assert facts.torch_version is None
    assert facts.torch_import_error is not None
    assert "leftover" in facts.torch_import_error


@pytest.mark.integration
def test_a_hanging_python_times_out_and_is_killed(tmp_path):
    marker = tmp_path / "child-pid"
    python = fake_python(tmp_path, "python-hangs", f'echo $$ > "{marker}"\nexec sleep 60')
    began = time.monotonic()
    outcome = probe.run_probe(python, full=False, timeout_s=1.0)
    assert time.monotonic() - began < 10
    assert outcome.failure == probe.TIMEOUT
    assert outcome.facts is None
    assert "did not finish within 1 s" in outcome.message
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.integration
def test_a_crashing_python_is_reported_with_its_stderr(tmp_path):
    python = fake_python(
        tmp_path, "python-crash", 'echo "Segmentation fault in libcuda" >&2\nexit 139'
    )
    outcome = probe.run_probe(python, full=False, timeout_s=10)
    assert outcome.failure == probe.CRASHED
    assert "status 139" in outcome.message
    assert "Segmentation fault in libcuda" in outcome.message


@pytest.mark.integration
def test_a_python_killed_by_a_signal(tmp_path):
    python = fake_python(tmp_path, "python-abort", "kill -ABRT $$")
    outcome = probe.run_probe(python, full=False, timeout_s=10)
    assert outcome.failure == probe.CRASHED
    assert "SIGABRT" in outcome.message


@pytest.mark.integration
def test_output_without_the_marker_is_bad_output(tmp_path):
    python = fake_python(tmp_path, "python-chatty", 'echo "hello from a wrapper"')
    outcome = probe.run_probe(python, full=False, timeout_s=10)
    assert outcome.failure == probe.BAD_OUTPUT
    assert "hello from a wrapper" in outcome.message


def test_python_not_found(tmp_path):
    outcome = probe.run_probe(str(tmp_path / "no-such-python"), full=False, timeout_s=10)
    assert outcome.failure == probe.PYTHON_NOT_FOUND
    outcome = probe.run_probe("no-such-python-on-path-xyz", full=False, timeout_s=10)
    assert outcome.failure == probe.PYTHON_NOT_FOUND
    assert outcome.python == "no-such-python-on-path-xyz"


def test_a_non_executable_python_is_not_found(tmp_path):
    path = tmp_path / "python"
    path.write_text("not a program")
    assert probe.resolve_python(str(path)) is None


def test_default_python_is_python3_on_path(monkeypatch, tmp_path):
    python = fake_python(tmp_path, "python3", "true")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert probe.resolve_python(None) == python


def test_relative_python_paths_are_made_absolute(monkeypatch, tmp_path):
    python = fake_python(tmp_path, "py", "true")
    monkeypatch.chdir(tmp_path)
    assert probe.resolve_python("./py") == python


# --- parsing ----------------------------------------------------------------------------------


def test_parse_output_takes_the_marked_line_among_noise():
    doc = cuda_probe.probe(full=False)
    text = "warning: something\n" + cuda_probe.MARKER + json.dumps(doc) + "\ntrailing\n"
    facts = probe.parse_output(text)
    assert facts is not None
    assert facts.python_version == doc["python_version"]


def test_parse_output_rejects_malformed_documents():
    assert probe.parse_output("") is None
    assert probe.parse_output(probe.MARKER + "{not json") is None
    assert probe.parse_output(probe.MARKER + json.dumps({"python_version": "3.10"})) is None


def test_parse_output_reads_full_measurements():
    doc = {
        "python_version": "3.10.12",
        "python_executable": "/usr/bin/python3",
        "torch_installed": True,
        "torch_version": "2.4.0+cu124",
        "torch_cuda_version": "12.4",
        "cuda_available": True,
        "device_count": 1,
        "arch_list": ["sm_90"],
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H200",
                "capability": "9.0",
                "total_memory_bytes": 150754820096,
                "sm_count": 132,
            }
        ],
        "full": {
            "matmul": [{"index": 0, "n": 4096, "finite": True, "max_rel_error": 1.5e-6}],
            "bandwidth": [{"index": 0, "gbps": 4300.0, "bytes_moved": 10, "seconds": 0.1}],
            "gemm": [{"index": 0, "error": "RuntimeError: CUDA error: an illegal memory access"}],
        },
    }
    facts = probe.parse_output(probe.MARKER + json.dumps(doc))
    assert facts is not None
    assert facts.devices[0].sm_count == 132
    assert facts.matmul is not None
    assert facts.matmul[0].value == 1.5e-6
    assert facts.matmul[0].extra == {"n": 4096, "finite": True}
    assert facts.bandwidth is not None
    assert facts.bandwidth[0].value == 4300.0
    assert facts.gemm is not None
    assert facts.gemm[0].value is None
    assert facts.gemm[0].error is not None
    assert "illegal memory access" in facts.gemm[0].error


def test_probe_source_is_the_script():
    source = probe.probe_source()
    assert source == (ROOT / "agents" / "cuda_probe.py").read_text(encoding="utf-8")
    compile(source, "cuda_probe.py", "exec")


# --- the measurements, on the CPU with the real torch -----------------------------------------


@pytest.fixture(scope="module")
def torch():
    import torch as real_torch

    return real_torch


def test_check_matmul_against_itself_on_the_cpu(torch):
    a, b, ref = cuda_probe.matmul_inputs(torch, 128)
    assert a.shape == (128, 128)
    assert float(a.min()) >= -1.0
    assert float(a.max()) < 1.0
    result = cuda_probe.check_matmul(torch, "cpu", a, b, ref)
    assert result["finite"] is True
    assert result["n"] == 128
    assert result["max_rel_error"] < 1e-5


def test_check_matmul_catches_a_wrong_product(torch):
    a, b, ref = cuda_probe.matmul_inputs(torch, 64)
    wrong = ref.clone()
    wrong[3, 5] += float(ref.abs().max())
    result = cuda_probe.check_matmul(torch, "cpu", a, b, wrong)
    expected = float(ref.abs().max()) / float(wrong.abs().max())
    assert result["max_rel_error"] == pytest.approx(expected, rel=1e-4)
    assert result["max_rel_error"] > 0.4
    nan_ref = ref.clone()
    result = cuda_probe.check_matmul(torch, "cpu", a * float("nan"), b, nan_ref)
    assert result["finite"] is False
    assert result["max_rel_error"] is None


def test_measure_bandwidth_counts_read_and_written_bytes(torch):
    result = cuda_probe.measure_bandwidth(torch, "cpu", 1 << 20, iters=4)
    assert result["bytes_moved"] == 2 * (1 << 20) * 4
    assert result["seconds"] > 0
    assert result["gbps"] == pytest.approx(result["bytes_moved"] / result["seconds"] / 1e9)


def test_measure_gemm_counts_two_n_cubed_per_product(torch):
    result = cuda_probe.measure_gemm(torch, "cpu", 64, "bfloat16", iters=3)
    assert result["dtype"] == "bfloat16"
    assert result["n"] == 64
    assert result["tflops"] == pytest.approx(2 * 64**3 * 3 / result["seconds"] / 1e12)


def test_guarded_turns_exceptions_into_errors():
    def boom() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    assert cuda_probe._guarded(boom) == {
        "error": "RuntimeError: CUDA error: an illegal memory access was encountered"
    }


def test_stress_gemm_reports_each_window_on_the_cpu(torch):
    result = cuda_probe.stress_gemm(torch, ["cpu"], 0.3, 0.1, 64, "float32")
    assert result["errors"] == {}
    assert (result["n"], result["dtype"]) == (64, "float32")
    windows = result["windows"]
    assert len(windows) >= 2
    assert all(w["tflops"]["0"] > 0 for w in windows)
    assert windows[-1]["t_s"] >= 0.3
    assert all(0.09 < w["seconds"] < 0.3 for w in windows[:-1])  # the last one may be cut short


def test_stress_gemm_reports_a_device_that_cannot_be_used(torch):
    result = cuda_probe.stress_gemm(torch, ["cpu", "cuda:7"], 0.05, 0.05, 32, "float32")
    assert set(result["errors"]) == {"7"}
    assert all(set(w["tflops"]) == {"0"} for w in result["windows"])


def test_options_of_the_probe_command_line():
    argv = ["--nccl-rank", "1", "--nccl-world", "8", "--full", "--nccl-init", "/tmp/x"]
    assert cuda_probe._options(argv) == {
        "--nccl-rank": "1",
        "--nccl-world": "8",
        "--full": "",
        "--nccl-init": "/tmp/x",
    }


def test_parse_output_reads_peer_to_peer_pairs():
    doc = {
        "python_version": "3.10.12",
        "python_executable": "/usr/bin/python3",
        "torch_installed": True,
        "cuda_available": True,
        "device_count": 2,
        "arch_list": [],
        "devices": [],
        "full": {
            "matmul": [],
            "bandwidth": [],
            "gemm": [],
            "p2p": [
                {"src": 0, "dst": 1, "gbps": 371.5, "peer_access": True, "seconds": 0.01},
                {"src": 1, "dst": 0, "error": "RuntimeError: peer access is not supported"},
            ],
        },
    }
    facts = probe.parse_output(probe.MARKER + json.dumps(doc))
    assert facts is not None
    assert facts.p2p == (
        probe.PairMeasurement(0, 1, 371.5, True, None),
        probe.PairMeasurement(1, 0, None, None, "RuntimeError: peer access is not supported"),
    )


# --- the stress run and the all-reduce run, as the agent starts them ----------------------------

STRESS_OUTPUT = (
    "import json, sys, time\n"
    "time.sleep(0.3)\n"
    'doc = {"python_version": "3.11.7", "python_executable": sys.executable,\n'
    '       "torch_installed": True, "torch_version": "2.4.0+cu124", "cuda_available": True,\n'
    '       "device_count": 1, "arch_list": [], "devices": [],\n'
    '       "stress": {"n": 8192, "dtype": "bfloat16", "errors": {},\n'
    '                  "windows": [{"t_s": 0.1, "seconds": 0.1, "tflops": {"0": 700.0}}]}}\n'
    'print("torch says hello")\n'
    'print("GPU_AGENT_PROBE " + json.dumps(doc))\n'
)


def test_run_stress_samples_while_the_load_runs(tmp_path):
    script = tmp_path / "stress.py"
    script.write_text(STRESS_OUTPUT)
    python = fake_python(tmp_path, "python-stress", f'exec "{sys.executable}" "{script}"')
    calls: list[int] = []

    def sample() -> list[dict]:
        calls.append(1)
        return [{"index": 0, "sm_clock_mhz": 1980}]

    outcome = probe.run_stress(python, 5.0, sample=sample, timeout_s=10, interval_s=0.05)
    assert outcome.failure is None, outcome.message
    assert len(calls) >= 3  # sampled every 0.05 s for about 0.3 s
    assert len(outcome.samples) == len(calls)
    assert outcome.samples[0]["gpus"] == [{"index": 0, "sm_clock_mhz": 1980}]
    assert [s["t_s"] for s in outcome.samples] == sorted(s["t_s"] for s in outcome.samples)
    assert outcome.windows[0]["tflops"] == {"0": 700.0}
    assert (outcome.dtype, outcome.n) == ("bfloat16", 8192)
    assert outcome.facts is not None
    assert outcome.facts.cuda_available


def test_run_stress_kills_a_load_that_never_ends(tmp_path):
    python = fake_python(tmp_path, "python-hangs", "exec sleep 60")
    began = time.monotonic()
    outcome = probe.run_stress(
        python, 5.0, sample=list, timeout_s=0.0, interval_s=0.05, clock=_fast_clock()
    )
    assert time.monotonic() - began < 10
    assert outcome.failure == probe.TIMEOUT
    assert "did not end within 5 s" in outcome.message
    assert outcome.samples


def _fast_clock():
    """A clock that runs a second per look, so a 5 s run is over after a few samples."""
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    return clock


def test_run_stress_with_a_python_that_prints_nothing(tmp_path):
    python = fake_python(tmp_path, "python-quiet", "echo boom >&2; exit 3")
    outcome = probe.run_stress(python, 5.0, sample=list, timeout_s=5, interval_s=0.05)
    assert outcome.failure == probe.CRASHED
    assert "exited with status 3: boom" in outcome.message
    missing = probe.run_stress("/nonexistent/python3", 5.0, sample=list, timeout_s=5)
    assert missing.failure == probe.PYTHON_NOT_FOUND


@pytest.mark.integration
def test_run_nccl_runs_every_rank_and_reports_bus_bandwidth():
    """Two ranks of the real probe in this environment's torch, over gloo on the CPU (the
    same code path as NCCL on GPUs, rendezvous and timing included)."""
    outcome = probe.run_nccl(
        sys.executable, 2, timeout_s=120, backend="gloo", sizes=[1 << 16, 1 << 20]
    )
    assert outcome.failure is None, outcome.message
    assert outcome.error is None
    assert [s.bytes for s in outcome.sizes] == [1 << 16, 1 << 20]
    for size in outcome.sizes:
        assert size.seconds_per_op > 0
        assert size.algbw_gbps == pytest.approx(size.bytes / size.seconds_per_op / 1e9)
        assert size.busbw_gbps == pytest.approx(size.algbw_gbps * 2 * (2 - 1) / 2)
    assert outcome.busbw_gbps == outcome.sizes[-1].busbw_gbps


def test_run_nccl_kills_ranks_that_hang(tmp_path):
    python = fake_python(tmp_path, "python-hangs", "exec sleep 60")
    began = time.monotonic()
    outcome = probe.run_nccl(python, 3, timeout_s=0.5)
    assert time.monotonic() - began < 15
    assert outcome.failure == probe.TIMEOUT
    assert "did not finish within 0.5 s" in outcome.message


def test_run_nccl_reports_a_rank_that_crashed(tmp_path):
    python = fake_python(tmp_path, "python-crash", "echo 'NCCL WARN oops' >&2; exit 1")
    outcome = probe.run_nccl(python, 2, timeout_s=10)
    assert outcome.failure == probe.CRASHED
    assert "NCCL WARN oops" in outcome.message
    assert probe.run_nccl("/nonexistent/python3", 2, timeout_s=1).failure == probe.PYTHON_NOT_FOUND


def test_probes_number_cuda_devices_as_nvml_does(tmp_path):
    python = fake_python(tmp_path, "python-env", 'echo "order=$CUDA_DEVICE_ORDER"')
    proc = probe._start([python])
    out, _ = proc.communicate(timeout=10)
    assert out == b"order=PCI_BUS_ID\n"


# --- a real GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.integration
def test_full_probe_on_a_real_gpu():
    outcome = probe.run_probe(sys.executable, full=True, timeout_s=300)
    facts = outcome.facts
    assert facts is not None, outcome.message
    assert facts.cuda_available
    assert facts.device_count >= 1
    assert facts.matmul is not None
    assert facts.bandwidth is not None
    assert facts.gemm is not None
    for m in facts.matmul:
        assert m.error is None
        assert m.value is not None
        assert m.value < 1e-3
    for m in facts.bandwidth + facts.gemm:
        assert m.error is None
        assert m.value is not None
        assert m.value > 0
    print(
        json.dumps(
            {
                "bandwidth_gbps": [m.value for m in facts.bandwidth],
                "gemm_tflops": [m.value for m in facts.gemm],
                "matmul_rel_error": [m.value for m in facts.matmul],
            }
        )
    )
