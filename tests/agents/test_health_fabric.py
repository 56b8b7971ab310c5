"""topology, p2p and nccl: links against the catalogue, at each threshold edge."""

from __future__ import annotations

import pytest

from agents import probe as probe_mod
from agents import topology
from agents.checks import fabric
from agents.checks.fabric import NCCL_MIN_FRACTION, P2P_MIN_FRACTION
from agents.probe import PairMeasurement
from tests.agents.factories import (
    make_full_probe,
    make_gpu,
    make_nccl,
    make_nvswitch_topology,
    make_pairs,
    make_pcie_topology,
    make_status,
)

#: One direction of an H100 SXM's 18 NVLink 4 links.
H100_NVLINK = 18 * 25.0
#: One direction of PCIe 4.0 x16, the RTX 4090's link.
PCIE4 = 31.5


def rtx4090s(n: int):
    return make_status(
        gpus=[
            make_gpu(
                i,
                name="NVIDIA GeForce RTX 4090",
                mem_total_bytes=24564 * 2**20,
                sm_count=128,
                pcie_gen_max=4,
                compute_capability="8.9",
            )
            for i in range(n)
        ]
    )


# --- topology ---------------------------------------------------------------------------------


def test_topology_of_a_healthy_nvswitch_box():
    status = make_status(n=8)
    result = fabric.check_topology(make_nvswitch_topology(8), status)
    assert result.status == "pass"
    assert result.summary == (
        "8 GPUs: all 28 pair(s) NV18 (NVLink through NVSwitch); peer-to-peer ok"
    )
    assert result.details["matrix"]["0"] == {str(i): ("X" if i == 0 else "NV18") for i in range(8)}
    assert result.details["nvlinks"]["3"] == {
        "active": 18,
        "total": 18,
        "version": 4,
        "nvswitch": True,
    }


def test_one_gpu_or_no_topology_skips():
    assert fabric.check_topology(make_nvswitch_topology(1), make_status(n=1)).status == "skip"
    assert fabric.check_topology(None, make_status(n=2)).status == "skip"


@pytest.mark.parametrize(
    ("down", "expected"), [(0, "pass"), (1, "warn"), (17, "warn"), (18, "fail")]
)
def test_nvlinks_down_on_an_sxm_card(down, expected):
    links = make_nvswitch_topology(4, g2=down)
    result = fabric.check_topology(links, make_status(n=4))
    assert result.status == expected
    if expected == "warn":
        assert f"GPU 2: {18 - down} of 18 NVLinks up" in result.summary
        assert "nvidia-smi nvlink -s" in result.hint
    if expected == "fail":
        assert "GPU 2: no NVLink is up (NVIDIA H100 SXM" in result.summary
        assert "nvidia-fabricmanager" in result.hint


def test_pcie_cards_without_peer_to_peer_warn():
    links = make_pcie_topology(2, level="SYS", p2p="topology_not_supported")
    result = fabric.check_topology(links, rtx4090s(2))
    assert result.status == "warn"
    assert "no peer-to-peer between GPUs 0 and 1 (topology_not_supported)" in result.summary
    assert "ACS" in result.hint
    assert result.details["matrix"]["0"]["1"] == "SYS"


def test_pcie_cards_with_peer_to_peer_pass():
    result = fabric.check_topology(make_pcie_topology(4, level="PIX"), rtx4090s(4))
    assert result.status == "pass"
    assert result.summary == "4 GPUs: all 6 pair(s) PIX; peer-to-peer ok"


def test_topology_labels_match_nvidia_smi():
    links = topology.Topology(
        gpus=(
            topology.GpuLinks(0, "0:18:0", (topology.NvLink(0, True, 3, "x", "gpu"),) * 4),
            topology.GpuLinks(1, "0:19:0", None),
            topology.GpuLinks(2, "0:1a:0", None),
        ),
        pairs=(
            topology.GpuPair(0, 1, "PXB", 4, False, "ok", "ok"),
            topology.GpuPair(0, 2, "NODE", 0, False, "ok", None),
            topology.GpuPair(1, 2, None, 0, False, None, None),
        ),
    )
    assert (links.label(0, 1), links.label(2, 0), links.label(1, 2)) == ("NV4", "NODE", "?")


# --- expected bandwidth -----------------------------------------------------------------------


def test_expected_bandwidth_of_nvlink_and_pcie():
    nv = topology.expected_gbps(make_nvswitch_topology(2), make_status(n=2).gpus, 0, 1)
    assert nv is not None
    assert (nv.gbps, nv.kind) == (H100_NVLINK, "nvlink")
    assert nv.basis == "18 NVLink(s) x 25 GB/s each way (NVIDIA H100 SXM5 80GB catalogue figure)"
    pcie = topology.expected_gbps(make_pcie_topology(2), rtx4090s(2).gpus, 0, 1)
    assert pcie is not None
    assert (pcie.gbps, pcie.kind) == (PCIE4, "pcie")
    assert pcie.basis == "PCIe 4.0 x16: 31.5 GB/s each way"


def test_a_downtrained_slot_sets_the_pair_figure():
    status = make_status(gpus=[make_gpu(0), make_gpu(1, pcie_gen_max=3, pcie_width_max=8)])
    found = topology.expected_gbps(make_pcie_topology(2), status.gpus, 0, 1)
    assert found is not None
    assert found.gbps == 15.75 / 2


def test_an_unknown_gpu_uses_the_nvlink_generation_rate():
    status = make_status(n=2, name="NVIDIA Future GPU", sm_count=999)
    found = topology.expected_gbps(make_nvswitch_topology(2, links=6), status.gpus, 0, 1)
    assert found is not None
    assert found.gbps == 6 * 25.0
    assert "NVLink 4 rate" in found.basis


# --- p2p --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gbps", "expected"),
    [
        (H100_NVLINK * P2P_MIN_FRACTION, "pass"),
        (H100_NVLINK * P2P_MIN_FRACTION - 0.01, "warn"),
        (370.0, "pass"),
    ],
)
def test_p2p_edge_on_nvlink(gbps, expected):
    full = make_full_probe(device_count=2, p2p=make_pairs(2, 370.0, p0_1=gbps))
    result = fabric.check_p2p(full, make_nvswitch_topology(2), make_status(n=2))
    assert result.status == expected
    row = next(r for r in result.details["pairs"] if (r["src"], r["dst"]) == (0, 1))
    assert row["expected_gbps"] == H100_NVLINK
    if expected == "warn":
        assert "GPU 0 -> 1:" in result.summary
        assert "4 -> 8 may bring almost nothing" in result.hint


def test_p2p_through_host_memory_on_pcie_warns_with_both_hints():
    full = make_full_probe(device_count=2, p2p=make_pairs(2, 9.0, peer_access=False))
    result = fabric.check_p2p(full, make_pcie_topology(2, p2p="not_supported"), rtx4090s(2))
    assert result.status == "warn"
    assert "9 GB/s, 29% of 32 (through host memory)" in result.summary
    assert "ACS" in result.hint


def test_p2p_pass_summary():
    full = make_full_probe(device_count=4, p2p=make_pairs(4, 25.0))
    result = fabric.check_p2p(full, make_pcie_topology(4), rtx4090s(4))
    assert result.status == "pass"
    assert (
        result.summary
        == "12 directed pair(s): 25-25 GB/s one way (at least 79% of what the links allow)"
    )


def test_p2p_errors_fail_and_missing_measurements_skip():
    broken = (*make_pairs(2), PairMeasurement(1, 0, None, None, "RuntimeError: CUDA error"))
    result = fabric.check_p2p(make_full_probe(device_count=2, p2p=broken), None, make_status(n=2))
    assert result.status == "fail"
    assert "GPU 1 -> 0: RuntimeError: CUDA error" in result.summary
    assert fabric.check_p2p(None, None, make_status(n=2)).status == "skip"
    assert fabric.check_p2p(make_full_probe(), None, make_status(n=1)).status == "skip"
    failed = probe_mod.ProbeOutcome("python3", None, probe_mod.TIMEOUT, "python3 did not finish")
    assert fabric.check_p2p(failed, None, make_status(n=2)).status == "fail"


def test_p2p_with_cuda_visible_devices_compares_nothing():
    full = make_full_probe(device_count=2, p2p=make_pairs(2, 1.0), cuda_visible_devices="3,5")
    result = fabric.check_p2p(full, make_nvswitch_topology(8), make_status(n=8))
    assert result.status == "pass"
    assert "CUDA_VISIBLE_DEVICES" in result.details["note"]


# --- nccl -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("busbw", "expected"),
    [
        (H100_NVLINK * NCCL_MIN_FRACTION, "pass"),
        (H100_NVLINK * NCCL_MIN_FRACTION - 0.01, "warn"),
        (400.0, "pass"),
    ],
)
def test_nccl_edge_on_nvswitch(busbw, expected):
    result = fabric.check_nccl(make_nccl(8, busbw), make_nvswitch_topology(8), make_status(n=8))
    assert result.status == expected
    assert result.details["expected_gbps"] == H100_NVLINK
    assert result.summary.startswith(
        f"all-reduce across 8 GPUs: bus bandwidth {busbw:.1f} GB/s at 256 MiB"
    )
    if expected == "warn":
        assert "NCCL_DEBUG=INFO" in result.hint


def test_nccl_over_pcie_compares_with_the_slowest_link():
    status = make_status(
        gpus=[
            make_gpu(
                i,
                name="NVIDIA GeForce RTX 4090",
                mem_total_bytes=24564 * 2**20,
                sm_count=128,
                pcie_gen_max=4,
                pcie_width_max=8 if i == 3 else 16,
            )
            for i in range(4)
        ]
    )
    result = fabric.check_nccl(make_nccl(4, 10.0), make_pcie_topology(4), status)
    assert result.details["expected_gbps"] == PCIE4 / 2
    assert result.status == "pass"  # 10 of 15.75
    slow = fabric.check_nccl(make_nccl(4, 5.0), make_pcie_topology(4), status)
    assert slow.status == "warn"
    assert "only 32% of 16 GB/s, PCIe 4.0 x8" in slow.summary


def test_nccl_that_hangs_fails_with_the_peer_to_peer_hint():
    hung = make_nccl(
        8, sizes=(), failure=probe_mod.TIMEOUT, message="the all-reduce did not finish within 60 s"
    )
    result = fabric.check_nccl(hung, make_nvswitch_topology(8), make_status(n=8))
    assert result.status == "fail"
    assert "did not finish within 60 s" in result.summary
    assert "NCCL_P2P_DISABLE=1" in result.hint


def test_nccl_missing_or_broken():
    no_nccl = make_nccl(
        2, sizes=(), error="RuntimeError: this torch has no NCCL (a CPU-only or ROCm build)"
    )
    assert fabric.check_nccl(no_nccl, None, make_status(n=2)).status == "skip"
    broken = make_nccl(2, sizes=(), error="DistBackendError: NCCL error in: unhandled system error")
    result = fabric.check_nccl(broken, None, make_status(n=2))
    assert result.status == "fail"
    assert "unhandled system error" in result.summary
    assert fabric.check_nccl(None, None, make_status(n=1)).status == "skip"
    assert fabric.check_nccl(None, None, make_status(n=2)).status == "skip"


def test_nccl_without_a_figure_to_compare_passes_with_the_number():
    result = fabric.check_nccl(make_nccl(2, 50.0), None, make_status(n=2))
    assert result.status == "pass"
    assert result.summary.endswith("(no figure to compare with)")
