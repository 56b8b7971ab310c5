"""agents.specs: the GPU catalogue, NVML-name matching and typed-name lookup."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agents import specs

MIB = 1024**2
ROOT = Path(__file__).resolve().parents[2]

REQUIRED_KEYS = {
    "rtx-3090",
    "rtx-4090",
    "rtx-4090d",
    "rtx-5090",
    "a10",
    "a100-pcie-40gb",
    "a100-sxm4-40gb",
    "a100-pcie-80gb",
    "a100-sxm4-80gb",
    "a800-sxm4-80gb",
    "h20",
    "h100-pcie",
    "h100-sxm",
    "h200-sxm",
    "l4",
    "l40s",
    "t4",
    "v100-sxm2-16gb",
    "v100-sxm2-32gb",
    "v100-pcie-16gb",
    "v100-pcie-32gb",
}

# NVML name, total memory as NVML reports it, SM count -> catalogue key.
NVML_CASES = [
    ("NVIDIA GeForce RTX 3090", 24576 * MIB, 82, "rtx-3090"),
    ("NVIDIA GeForce RTX 4090", 24564 * MIB, 128, "rtx-4090"),
    ("NVIDIA GeForce RTX 4090 D", 24564 * MIB, 114, "rtx-4090d"),
    ("NVIDIA GeForce RTX 5090", 32607 * MIB, 170, "rtx-5090"),
    ("NVIDIA A10", 23028 * MIB, 72, "a10"),
    ("NVIDIA A100-PCIE-40GB", 40960 * MIB, 108, "a100-pcie-40gb"),
    ("NVIDIA A100-SXM4-40GB", 40960 * MIB, 108, "a100-sxm4-40gb"),
    ("NVIDIA A100 80GB PCIe", 81920 * MIB, 108, "a100-pcie-80gb"),
    ("NVIDIA A100-SXM4-80GB", 81920 * MIB, 108, "a100-sxm4-80gb"),
    ("NVIDIA A800-SXM4-80GB", 81920 * MIB, 108, "a800-sxm4-80gb"),
    ("NVIDIA H20", 97871 * MIB, 78, "h20"),
    ("NVIDIA H100 PCIe", 81559 * MIB, 114, "h100-pcie"),
    ("NVIDIA H100 80GB HBM3", 81559 * MIB, 132, "h100-sxm"),
    ("NVIDIA H200", 143771 * MIB, 132, "h200-sxm"),
    ("NVIDIA L4", 23034 * MIB, 58, "l4"),
    ("NVIDIA L40S", 46068 * MIB, 142, "l40s"),
    ("Tesla T4", 15360 * MIB, 40, "t4"),
    ("Tesla V100-SXM2-16GB", 16384 * MIB, 80, "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", 32768 * MIB, 80, "v100-sxm2-32gb"),
    ("Tesla V100-PCIE-16GB", 16384 * MIB, 80, "v100-pcie-16gb"),
    ("Tesla V100-PCIE-32GB", 32768 * MIB, 80, "v100-pcie-32gb"),
]


def test_catalogue_has_every_required_gpu():
    keys = {spec.key for spec in specs.load_catalogue()}
    assert keys >= REQUIRED_KEYS


def test_every_row_has_a_source_and_sane_figures():
    for spec in specs.load_catalogue():
        assert len(spec.source) > 10, spec.key
        assert spec.mem_bytes == spec.mem_gb * 1024**3
        assert 100 <= spec.bandwidth_gbps <= 10_000, spec.key
        assert 5 <= spec.fp32_tflops <= 120, spec.key
        assert spec.fp16_tflops is not None
        assert spec.fp16_tflops > spec.fp32_tflops, spec.key
        assert 20 <= spec.sm_count <= 200, spec.key
        assert 50 <= spec.tdp_w <= 1000, spec.key
        assert spec.form_factor in ("pcie", "sxm"), spec.key
        assert spec.nvml_names, spec.key
        major, minor = spec.compute_capability.split(".")
        assert int(major) >= 7
        assert 0 <= int(minor) <= 9


def test_dense_figures_match_the_reference_table():
    h100 = specs.by_key("h100-sxm")
    assert h100 is not None
    assert (h100.bf16_tflops, h100.fp32_tflops, h100.bandwidth_gbps) == (989, 67, 3350)
    assert (h100.sm_count, h100.nvlink_gbps, h100.ecc) == (132, 900, True)
    h200 = specs.by_key("h200-sxm")
    assert h200 is not None
    assert (h200.mem_gb, h200.bandwidth_gbps, h200.bf16_tflops) == (141, 4800, 989)


def test_gpus_without_bf16_say_so():
    for key in ("t4", "v100-sxm2-16gb", "v100-pcie-32gb"):
        spec = specs.by_key(key)
        assert spec is not None
        assert spec.bf16_tflops is None
        assert spec.fp16_tflops


def test_ecc_is_none_where_it_must_be_queried():
    assert specs.by_key("rtx-4090").ecc is None  # type: ignore[union-attr]
    assert specs.by_key("rtx-3090").ecc is False  # type: ignore[union-attr]
    assert specs.by_key("a100-sxm4-80gb").ecc is True  # type: ignore[union-attr]


def test_catalogue_is_cached():
    assert specs.load_catalogue() is not None
    first = specs.load_catalogue()
    assert first == specs.load_catalogue()
    assert first[0] is specs.load_catalogue()[0]


@pytest.mark.parametrize(("name", "mem", "sms", "key"), NVML_CASES)
def test_match_every_nvml_name(name, mem, sms, key):
    found = specs.match(name, mem, sms)
    assert found is not None
    assert found.key == key
    by_name_only = specs.match(name)
    assert by_name_only is not None
    assert by_name_only.key == key


def test_sm_count_separates_4090_from_4090d_under_the_same_name():
    found = specs.match("NVIDIA GeForce RTX 4090", 24564 * MIB, 114)
    assert found is not None
    assert found.key == "rtx-4090d"
    full = specs.match("NVIDIA GeForce RTX 4090", 24564 * MIB, 128)
    assert full is not None
    assert full.key == "rtx-4090"


def test_mig_slices_match_nothing():
    assert specs.match("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 4864 * MIB, 14) is None
    assert specs.match("NVIDIA H100 80GB HBM3", 81559 * MIB, 16) is None
    assert specs.match("NVIDIA H100 80GB HBM3", 10 * 1024 * MIB, None) is None


def test_match_tolerates_spacing_and_case_but_not_other_models():
    found = specs.match("nvidia  h100   80gb hbm3")
    assert found is not None
    assert found.key == "h100-sxm"
    assert specs.match("NVIDIA A10G") is None
    assert specs.match("NVIDIA GeForce RTX 3090 Ti") is None
    assert specs.match("NVIDIA B200") is None


@pytest.mark.parametrize(
    ("typed", "key"),
    [
        ("4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("rtx4090", "rtx-4090"),
        ("4090D", "rtx-4090d"),
        ("rtx 4090 d", "rtx-4090d"),
        ("rtx 5090", "rtx-5090"),
        ("RTX-3090", "rtx-3090"),
        ("a100", "a100-sxm4-80gb"),
        ("A100 80GB", "a100-sxm4-80gb"),
        ("a100-80g", "a100-sxm4-80gb"),
        ("A100 80GB PCIe", "a100-pcie-80gb"),
        ("a100-pcie-40gb", "a100-pcie-40gb"),
        ("A100 40GB", "a100-sxm4-40gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("h100", "h100-sxm"),
        ("h100-sxm", "h100-sxm"),
        ("H100 SXM5", "h100-sxm"),
        ("H100 PCIe", "h100-pcie"),
        ("h200", "h200-sxm"),
        ("h20", "h20"),
        ("a800", "a800-sxm4-80gb"),
        ("L40S", "l40s"),
        ("l4", "l4"),
        ("a10", "a10"),
        ("tesla t4", "t4"),
        ("v100", "v100-sxm2-16gb"),
        ("V100 32GB PCIe", "v100-pcie-32gb"),
        ("v100-sxm2-32gb", "v100-sxm2-32gb"),
    ],
)
def test_lookup_typed_names(typed, key):
    found = specs.lookup(typed)
    assert found is not None
    assert found.key == key


@pytest.mark.parametrize("typed", ["", "   ", "b200", "a10g", "3090 ti", "4080", "h100x", "l40"])
def test_lookup_unknown_names_give_none(typed):
    assert specs.lookup(typed) is None
    assert specs.candidates(typed) == ()


def test_candidates_expose_every_variant_of_an_ambiguous_name():
    keys = [s.key for s in specs.candidates("a100")]
    assert keys[0] == "a100-sxm4-80gb"
    assert set(keys) == {"a100-pcie-40gb", "a100-sxm4-40gb", "a100-pcie-80gb", "a100-sxm4-80gb"}
    assert {s.key for s in specs.candidates("h100")} == {"h100-sxm", "h100-pcie"}
    assert [s.key for s in specs.candidates("4090")] == ["rtx-4090"]


def test_memory_fits_allows_nvml_shortfall_and_gddr_ecc():
    h100 = specs.by_key("h100-sxm")
    l40s = specs.by_key("l40s")
    assert h100 is not None
    assert l40s is not None
    assert specs.memory_fits(h100, 81559 * MIB)
    assert not specs.memory_fits(h100, int(h100.mem_bytes * 0.94))
    assert specs.memory_fits(h100, int(h100.mem_bytes * 0.95) + 1)
    # L40S with ECC on reports 15/16 of its 48 GiB.
    assert specs.memory_fits(l40s, 46068 * MIB)
    assert not specs.memory_fits(l40s, 40 * 1024 * MIB)


def test_catalogue_loads_from_a_zip_import(tmp_path):
    """pkgutil.get_data reads the JSON from inside a zip, as in the zipapp."""
    archive = tmp_path / "agent.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("__init__.py", "specs.py", "gpu_specs.json"):
            zf.write(ROOT / "agents" / name, f"agents/{name}")
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); from agents import specs;"
        "print(specs.__file__); print(json.dumps([s.key for s in specs.load_catalogue()]))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", code, str(archive)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    location, keys_json = result.stdout.splitlines()
    assert str(archive) in location
    assert set(json.loads(keys_json)) >= REQUIRED_KEYS


def test_a_broken_data_file_is_reported(monkeypatch):
    monkeypatch.setattr(specs, "_CACHE", {})
    monkeypatch.setattr(pkgutil, "get_data", lambda _pkg, _name: b'{"gpus": [{"key": 1}]}')
    with pytest.raises(specs.CatalogueError, match="row"):
        specs.load_catalogue()


# --- interconnect figures -----------------------------------------------------------------------


def test_every_gpu_has_interconnect_figures_with_a_source():
    for spec in specs.load_catalogue():
        assert spec.pcie_gen in (3, 4, 5), spec.key
        assert spec.pcie_lanes == 16, spec.key
        assert spec.interconnect_source, spec.key
        assert specs.pcie_gbps(spec.pcie_gen) is not None, spec.key
        if spec.nvlink_links:
            assert spec.nvlink_gen in (2, 3, 4, 5), spec.key
            assert spec.nvlink_total_gbps is not None, spec.key
            assert "NVLink" in spec.interconnect_source, spec.key
        else:
            assert spec.nvlink_gen is None, spec.key
            assert spec.nvlink_total_gbps is None, spec.key
        assert (spec.nvlink_bridge_gbps is not None) == (
            spec.nvlink_bridge and spec.nvlink_links > 0
        )


def test_nvlink_totals_are_links_times_the_generation_rate_both_ways():
    """The datasheet totals agree with the per-link rates of their NVLink generation; the
    RTX 3090's GA102 runs its four links slower (112.5 GB/s in all, per the whitepaper)."""
    for spec in specs.load_catalogue():
        if not spec.nvlink_links:
            continue
        rate = specs.nvlink_generation_gbps(spec.nvlink_gen)
        assert rate is not None, spec.key
        if spec.key == "rtx-3090":
            assert spec.nvlink_link_gbps == 112.5 / 8
            continue
        assert spec.nvlink_total_gbps == spec.nvlink_links * 2 * rate, spec.key
        assert spec.nvlink_link_gbps == rate, spec.key


@pytest.mark.parametrize(
    ("generation", "lanes", "gbps"),
    [
        (3, 16, 15.75),
        (4, 16, 31.5),
        (5, 16, 63.0),
        (4, 8, 15.75),
        (5, 4, 15.75),
        (2, 16, None),
        (None, 16, None),
        (4, None, None),
    ],
)
def test_pcie_rates(generation, lanes, gbps):
    assert specs.pcie_gbps(generation, lanes) == gbps


def test_link_rates_carry_their_sources():
    for kind, generations in (("pcie", (3, 4, 5, 6)), ("nvlink", (2, 3, 4, 5))):
        for generation in generations:
            rate = specs.link_rate(kind, generation)
            assert rate is not None
            assert rate.source.startswith(("PCI-SIG", "NVIDIA"))
    assert specs.link_rate("nvlink", 1) is None
    h100 = specs.by_key("h100-sxm")
    assert h100 is not None
    assert (h100.pcie_gen, h100.nvlink_gen, h100.nvlink_links) == (5, 4, 18)
