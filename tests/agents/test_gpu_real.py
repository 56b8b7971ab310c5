"""Real NVML on a real NVIDIA GPU: the collector, the CLI and the zipapp report sensible values."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import nvml, protocol
from agents.protocol import CLOCK_EVENT_REASONS, StatusSnapshot

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
KNOWN_REASONS = {name for _, name in CLOCK_EVENT_REASONS}


@pytest.fixture(scope="module")
def status() -> StatusSnapshot:
    sys.modules.pop("pynvml", None)  # the real nvidia-ml-py, never the fake
    return nvml.collect_status()


def test_nvml_works_and_names_the_driver(status):
    assert status.nvml_error is None, status.nvml_error
    assert status.driver is not None
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", status.driver.version)
    assert status.driver.cuda_version is not None
    assert re.fullmatch(r"1[1-9]\.\d", status.driver.cuda_version)
    assert len(status.gpus) >= 1
    assert [g.index for g in status.gpus] == list(range(len(status.gpus)))


def test_every_gpu_has_sensible_values(status):
    for gpu in status.gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-")), gpu.uuid
        assert "NVIDIA" in gpu.name or "Tesla" in gpu.name or "Quadro" in gpu.name, gpu.name
        assert re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", gpu.pci_bus_id)
        assert gpu.mem_total_bytes is not None
        assert gpu.mem_total_bytes > 4 * GIB
        assert gpu.mem_used_bytes is not None
        assert gpu.mem_free_bytes is not None
        assert gpu.mem_used_bytes + gpu.mem_free_bytes <= gpu.mem_total_bytes
        assert gpu.util_gpu_pct is not None
        assert 0 <= gpu.util_gpu_pct <= 100
        assert gpu.temp_c is not None
        assert 5 <= gpu.temp_c <= 110
        assert gpu.power_draw_w is not None
        assert gpu.power_limit_w is not None
        assert 0 < gpu.power_draw_w <= gpu.power_limit_w * 1.3
        assert 10 <= gpu.power_limit_w <= 1500
        assert gpu.sm_clock_mhz is not None
        assert gpu.sm_clock_max_mhz is not None
        assert 0 < gpu.sm_clock_mhz <= gpu.sm_clock_max_mhz * 1.1
        assert gpu.clock_event_reasons is not None
        assert set(gpu.clock_event_reasons) <= KNOWN_REASONS | {
            r for r in gpu.clock_event_reasons if r.startswith("unknown_0x")
        }
        assert gpu.compute_capability is not None
        assert re.fullmatch(r"\d{1,2}\.\d", gpu.compute_capability)
        assert gpu.sm_count is None or 10 <= gpu.sm_count <= 256
        assert gpu.pcie_gen_max is None or 1 <= gpu.pcie_gen_max <= 6
        assert gpu.pcie_width_max is None or gpu.pcie_width_max in (1, 2, 4, 8, 16, 32)
        assert isinstance(gpu.persistence_mode, bool)
        assert gpu.mig_mode is None or isinstance(gpu.mig_mode, bool)
        if gpu.ecc_mode_enabled:
            assert gpu.ecc_uncorrected_volatile is not None
            assert gpu.ecc_uncorrected_volatile >= 0


def test_processes_are_on_known_gpus(status):
    indexes = {g.index for g in status.gpus}
    for proc in status.processes:
        assert proc.gpu_index in indexes
        assert proc.pid > 0


def test_sampling_matches_the_snapshot(status):
    samples = nvml.sample_gpus()
    assert [s.uuid for s in samples] == [g.uuid for g in status.gpus]
    assert all(s.util_gpu_pct is not None and s.mem_total_bytes for s in samples)


def test_cli_and_zipapp_report_the_same_gpus(status, tmp_path):
    from agents import zipapp

    pyz = zipapp.build(tmp_path / "gpu-agent.pyz")
    runs = {
        "module": [sys.executable, "-m", "agents", "status", "--json"],
        "zipapp": [sys.executable, "-I", str(pyz), "status", "--json"],
    }
    for name, argv in runs.items():
        result = subprocess.run(
            argv, capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
        )
        assert result.returncode == 0, (name, result.stderr)
        got = protocol.loads(StatusSnapshot, result.stdout)
        assert got.nvml_error is None, name
        assert [(g.uuid, g.name, g.mem_total_bytes) for g in got.gpus] == [
            (g.uuid, g.name, g.mem_total_bytes) for g in status.gpus
        ], name


def test_text_table_lists_every_gpu(status):
    from agents import render

    text = render.render_status(status)
    for gpu in status.gpus:
        assert gpu.name in text
    assert "NVML error" not in text


def test_cooling_clocks_and_video_fields_are_sensible(status):
    for gpu in status.gpus:
        assert gpu.fan_speed_pct is None or 0 <= gpu.fan_speed_pct <= 100
        assert gpu.pstate is None or 0 <= gpu.pstate <= 15
        assert gpu.mem_clock_mhz is None or 0 < gpu.mem_clock_mhz <= 40000
        if gpu.mem_clock_mhz is not None and gpu.mem_clock_max_mhz is not None:
            assert gpu.mem_clock_mhz <= gpu.mem_clock_max_mhz * 1.1
        for value in (gpu.enc_util_pct, gpu.dec_util_pct):
            assert value is None or 0 <= value <= 100


def test_topology_and_xid_watch_on_the_real_driver(status):
    doc = nvml.collect_topology()
    assert doc["error"] is None
    assert [g["index"] for g in doc["gpus"]] == [g.index for g in status.gpus]
    n = len(status.gpus)
    assert len(doc["pairs"]) == n * (n - 1) // 2
    for pair in doc["pairs"]:
        assert pair["level"] in (None, "BOARD", "PIX", "PXB", "PHB", "NODE", "SYS")
    with nvml.XidWatch() as watch:
        assert isinstance(watch.available, bool)
        assert watch.available or watch.reason
        assert all(event["xid"] > 0 for event in watch.events())


def _cuda_torch() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def test_a_busy_torch_process_shows_its_sm_and_cpu_use():
    if not _cuda_torch():
        pytest.skip("this environment's torch cannot use the GPU")
    code = (
        "import time, torch\n"
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.float16)\n"
        "print('go', flush=True)\n"
        "t = time.time()\n"
        "while time.time() - t < 30:\n"
        "    a @ a\n"
        "    torch.cuda.synchronize()\n"
    )
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert job.stdout is not None
        assert job.stdout.readline() == b"go\n"
        found = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(1)
            found = next((p for p in nvml.collect_status().processes if p.pid == job.pid), None)
            if found is not None and (found.sm_util_pct or 0) > 0:
                break
    finally:
        job.kill()
        job.wait()
    assert found is not None, "the torch process never appeared among the GPU processes"
    assert found.sm_util_pct is not None
    assert found.sm_util_pct > 0
    assert found.cpu_pct is not None
    assert found.elapsed_s is not None
    assert found.rss_bytes is not None
