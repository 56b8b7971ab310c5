"""CUDA-stack checks: dev_nodes, torch_build, cuda_compat, arch, visibility, wheel choice."""

from __future__ import annotations

import re

import pytest

from agents import probe as probe_mod
from agents.checks import cuda
from agents.system import DevNode, DevNodeFacts
from tests.agents.factories import (
    make_device,
    make_driver,
    make_gpu,
    make_host,
    make_nvml_error,
    make_probe,
    make_status,
)

NO_NVML = make_status(nvml_error=make_nvml_error())


def node(path: str, exists: bool = True, usable: bool | None = None) -> DevNode:
    return DevNode(path=path, exists=exists, usable=exists if usable is None else usable)


def nodes(
    control: bool = True, gpus: int = 1, uvm: bool = True, usable: bool = True, dxg: bool = False
) -> DevNodeFacts:
    return DevNodeFacts(
        control=node("/dev/nvidiactl", control, control and usable),
        gpus=tuple(node(f"/dev/nvidia{i}", True, usable) for i in range(gpus)),
        uvm=node("/dev/nvidia-uvm", uvm),
        dxg=node("/dev/dxg", dxg),
    )


# --- dev_nodes --------------------------------------------------------------------------------


def test_dev_nodes_pass():
    result = cuda.check_dev_nodes(nodes(gpus=8), make_host())
    assert result.status == "pass"
    assert "8 GPU node(s)" in result.summary


def test_dev_nodes_absent_is_a_container_without_gpus():
    result = cuda.check_dev_nodes(nodes(control=False, gpus=0, uvm=False), make_host())
    assert result.status == "fail"
    assert "docker run --gpus all" in result.hint
    assert "nvidia-container-toolkit" in result.hint


def test_dev_nodes_incomplete():
    result = cuda.check_dev_nodes(nodes(control=True, gpus=0), make_host())
    assert result.status == "fail"
    assert "missing" in result.summary


def test_dev_nodes_without_permission():
    result = cuda.check_dev_nodes(nodes(usable=False), make_host())
    assert result.status == "fail"
    assert "/dev/nvidia0" in result.summary
    assert "video" in result.hint


def test_dev_nodes_uvm_missing_matters_in_containers_only():
    assert cuda.check_dev_nodes(nodes(uvm=False), make_host(in_container=True)).status == "warn"
    on_host = cuda.check_dev_nodes(nodes(uvm=False), make_host())
    assert on_host.status == "pass"
    assert "first CUDA use" in on_host.summary


def test_dev_nodes_on_wsl_use_dxg():
    wsl = make_host(is_wsl=True)
    assert cuda.check_dev_nodes(nodes(control=False, gpus=0, dxg=True), wsl).status == "pass"
    result = cuda.check_dev_nodes(nodes(control=False, gpus=0, dxg=False), wsl)
    assert result.status == "fail"
    assert "Windows" in result.hint


# --- torch_build ------------------------------------------------------------------------------


def test_torch_build_passes_for_a_cuda_build():
    result = cuda.check_torch_build(make_probe(), make_status())
    assert result.status == "pass"
    assert result.summary == "torch 2.4.0+cu124 built for CUDA 12.4"


def test_cpu_only_build_fails_with_an_install_command_for_the_driver():
    probe = make_probe(
        torch_version="2.13.0+cpu",
        torch_cuda_version=None,
        cuda_available=False,
        device_count=0,
        arch_list=(),
    )
    result = cuda.check_torch_build(probe, make_status())
    assert result.status == "fail"
    assert "CPU-only" in result.summary
    assert result.hint == (
        "Replace it with a CUDA build: `/opt/venv/bin/python -m pip uninstall -y torch && "
        "/opt/venv/bin/python -m pip install torch --index-url "
        "https://download.pytorch.org/whl/cu124`."
    )


def test_torch_not_installed():
    probe = make_probe(
        torch_installed=False,
        torch_version=None,
        torch_cuda_version=None,
        torch_import_error="No module named 'torch'",
        cuda_available=False,
        device_count=0,
    )
    result = cuda.check_torch_build(probe, make_status())
    assert result.status == "fail"
    assert result.summary.startswith("torch not installed in /opt/venv/bin/python")
    assert "uninstall" not in result.hint
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu124" in result.hint
    assert "--python" in result.hint


def test_torch_that_fails_to_import():
    probe = make_probe(
        torch_version=None,
        torch_cuda_version=None,
        cuda_available=False,
        torch_import_error="OSError: libcudnn.so.9: cannot open shared object file",
    )
    result = cuda.check_torch_build(probe, make_status())
    assert result.status == "fail"
    assert "libcudnn.so.9" in result.summary
    assert "uninstall -y torch" in result.hint


def test_rocm_build_fails():
    probe = make_probe(
        torch_version="2.4.0+rocm6.1", torch_cuda_version=None, torch_hip_version="6.1.40091"
    )
    result = cuda.check_torch_build(probe, make_status())
    assert result.status == "fail"
    assert "ROCm" in result.summary


@pytest.mark.parametrize(
    ("failure", "message", "words"),
    [
        (probe_mod.PYTHON_NOT_FOUND, "python3: no such Python", "--python"),
        (probe_mod.TIMEOUT, "python3 did not finish within 60 s", "--timeout"),
        (probe_mod.CRASHED, "python3 exited with signal SIGSEGV", "import torch"),
        (probe_mod.CRASHED, "python3 exited with status 1: SyntaxError: invalid syntax", "3.7"),
        (probe_mod.BAD_OUTPUT, "python3 printed no probe result", "import torch"),
    ],
)
def test_probe_failures_fail_torch_build_with_hints(failure, message, words):
    result = cuda.check_torch_build(make_probe(failure=failure, message=message), make_status())
    assert result.status == "fail"
    assert words in result.hint
    assert result.details["failure"] == failure


@pytest.mark.parametrize(
    ("driver_cuda", "tag"),
    [
        ("12.4", "cu124"),
        ("12.5", "cu124"),
        ("12.2", "cu121"),
        ("12.0", "cu121"),
        ("12.8", "cu128"),
        ("13.1", "cu130"),
        ("11.4", "cu118"),
        ("10.2", "cu118"),
        ("14.2", "cu130"),
        (None, "cu126"),
    ],
)
def test_wheel_tag_follows_the_driver(driver_cuda, tag):
    assert cuda.wheel_tag(make_status(driver=make_driver(cuda_version=driver_cuda))) == tag


def test_wheel_tag_without_nvml_and_for_blackwell():
    assert cuda.wheel_tag(NO_NVML) == "cu126"
    blackwell = make_status(driver=make_driver(cuda_version="12.4"), compute_capability="12.0")
    assert cuda.wheel_tag(blackwell) == "cu128"


# --- cuda_compat ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch_cuda", "driver_cuda", "expected"),
    [
        ("12.4", "12.4", "pass"),
        ("12.1", "12.4", "pass"),
        ("12.8", "12.4", "pass"),  # minor-version compatibility
        ("11.8", "12.4", "pass"),
        ("12.1", "11.8", "fail"),
        ("13.0", "12.9", "fail"),
    ],
)
def test_cuda_compat_majors(torch_cuda, driver_cuda, expected):
    status = make_status(driver=make_driver(cuda_version=driver_cuda))
    result = cuda.check_cuda_compat(make_probe(torch_cuda_version=torch_cuda), status)
    assert result.status == expected


def test_cuda_compat_fail_names_the_minimum_driver():
    status = make_status(driver=make_driver(version="470.82.01", cuda_version="11.4"))
    result = cuda.check_cuda_compat(make_probe(torch_cuda_version="12.1"), status)
    assert "525.60.13" in result.hint
    assert "whl/cu118" in result.hint
    status13 = make_status(driver=make_driver(cuda_version="12.8"))
    assert (
        "580.65.06" in cuda.check_cuda_compat(make_probe(torch_cuda_version="13.0"), status13).hint
    )


def test_cuda_compat_minor_newer_says_so():
    status = make_status(driver=make_driver(cuda_version="12.2"))
    result = cuda.check_cuda_compat(make_probe(torch_cuda_version="12.4"), status)
    assert "minor-version compatibility" in result.summary


def test_cuda_compat_driver_too_old_error_from_torch():
    probe = make_probe(
        cuda_available=False,
        device_count=0,
        cuda_init_error="RuntimeError: The NVIDIA driver on your system is too old",
    )
    result = cuda.check_cuda_compat(probe, make_status())
    assert result.status == "fail"


TOO_OLD = "RuntimeError: The NVIDIA driver on your system is too old (found version 12040)."


def test_a_driver_new_enough_for_the_major_is_never_told_to_upgrade_to_an_older_one():
    # Driver 550.54.15 (CUDA 12.4) and a torch for CUDA 12.6 that reports the driver too old.
    probe = make_probe(
        torch_cuda_version="12.6", cuda_available=False, device_count=0, cuda_init_error=TOO_OLD
    )
    result = cuda.check_cuda_compat(probe, make_status())
    assert result.status == "fail"
    assert "525.60.13 or newer" not in result.hint
    assert "CUDA 12.6's own minimum driver is 560.28.03" in result.summary
    assert "upgrade the NVIDIA driver to 560.28.03 or newer" in result.hint
    assert "install a torch built for CUDA 12.4 or older" in result.hint
    assert "whl/cu124" in result.hint


def test_a_driver_that_meets_the_minimum_points_at_another_libcuda():
    probe = make_probe(
        torch_cuda_version="12.4", cuda_available=False, device_count=0, cuda_init_error=TOO_OLD
    )
    result = cuda.check_cuda_compat(probe, make_status())  # driver 550.54.15 runs CUDA 12.4
    assert result.status == "fail"
    assert "meets CUDA 12.4's minimum (550.54.14)" in result.summary
    assert "Upgrade" not in result.hint
    assert "libcuda" in result.hint


def test_every_driver_hint_names_a_version_newer_than_the_one_running():
    versions = [
        ("470.82.01", "11.4"),
        ("525.60.13", "12.0"),
        ("550.54.15", "12.4"),
        ("560.35.03", "12.6"),
        ("570.124.06", "12.8"),
    ]
    for driver, driver_cuda in versions:
        status = make_status(driver=make_driver(version=driver, cuda_version=driver_cuda))
        for torch_cuda in ("11.8", "12.1", "12.4", "12.6", "12.8", "12.9", "13.0"):
            probe = make_probe(torch_cuda_version=torch_cuda, cuda_init_error=TOO_OLD)
            hint = cuda.check_cuda_compat(probe, status).hint
            for named in re.findall(r"driver to (\d+(?:\.\d+)+) or newer", hint):
                assert cuda._driver_version(named) > cuda._driver_version(driver), (
                    driver,
                    torch_cuda,
                    hint,
                )


def test_cuda_compat_skips():
    cpu = make_probe(torch_cuda_version=None)
    assert cuda.check_cuda_compat(cpu, make_status()).status == "skip"
    assert cuda.check_cuda_compat(make_probe(), NO_NVML).status == "skip"
    assert cuda.check_cuda_compat(make_probe(failure="timeout"), make_status()).status == "skip"


# --- arch -------------------------------------------------------------------------------------

OLD_WHEEL = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
CU128_WHEEL = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")


@pytest.mark.parametrize(
    ("capability", "arch_list", "verdict"),
    [
        ((9, 0), OLD_WHEEL, "native"),
        ((8, 9), OLD_WHEEL, "native"),  # sm_86 code runs on 8.9
        ((12, 0), OLD_WHEEL, "missing"),
        ((12, 0), CU128_WHEEL, "native"),
        ((12, 1), CU128_WHEEL, "native"),
        ((3, 7), CU128_WHEEL, "missing"),
        ((7, 0), CU128_WHEEL, "missing"),
        ((9, 0), ("sm_80", "compute_80"), "ptx"),
        ((9, 0), ("sm_90a",), "native"),
        ((9, 1), ("sm_90a",), "missing"),
        ((10, 0), ("sm_90", "sm_100a", "garbage", "sm_1"), "native"),
    ],
)
def test_arch_support(capability, arch_list, verdict):
    assert cuda.arch_support(capability, arch_list) == verdict


def test_arch_rtx_5090_on_an_old_wheel_fails_with_cu128():
    status = make_status(
        name="NVIDIA GeForce RTX 5090",
        compute_capability="12.0",
        sm_count=170,
        driver=make_driver(version="570.86.10", cuda_version="12.8"),
    )
    result = cuda.check_arch(make_probe(arch_list=OLD_WHEEL), status)
    assert result.status == "fail"
    assert "sm_120" in result.summary
    assert "whl/cu128" in result.hint
    assert cuda.check_arch(make_probe(arch_list=CU128_WHEEL), status).status == "pass"


def test_arch_dropped_old_gpu():
    status = make_status(compute_capability="7.0")
    result = cuda.check_arch(make_probe(arch_list=CU128_WHEEL), status)
    assert result.status == "fail"
    assert "older torch" in result.hint


def test_arch_ptx_only_warns():
    result = cuda.check_arch(make_probe(arch_list=("sm_80", "compute_80")), make_status())
    assert result.status == "warn"
    assert "PTX" in result.summary


def test_arch_uses_torch_devices_when_nvml_is_down():
    probe = make_probe(devices=(make_device(0, capability="12.0"),), arch_list=OLD_WHEEL)
    assert cuda.check_arch(probe, NO_NVML).status == "fail"


def test_arch_skips():
    assert cuda.check_arch(make_probe(torch_cuda_version=None), make_status()).status == "skip"
    assert cuda.check_arch(make_probe(arch_list=()), make_status()).status == "skip"
    no_caps = make_probe(devices=())
    assert cuda.check_arch(no_caps, make_status(compute_capability=None)).status == "skip"


# --- visibility -------------------------------------------------------------------------------


def test_visibility_all_seen():
    result = cuda.check_visibility(make_probe(device_count=8), make_status(n=8))
    assert result.status == "pass"
    assert "all 8" in result.summary


def test_visibility_fewer_without_cuda_visible_devices_fails():
    result = cuda.check_visibility(make_probe(device_count=7), make_status(n=8))
    assert result.status == "fail"
    assert "7 of 8" in result.summary


def test_visibility_fewer_because_of_cuda_visible_devices_warns():
    probe = make_probe(device_count=2, cuda_visible_devices="0,1")
    result = cuda.check_visibility(probe, make_status(n=8))
    assert result.status == "warn"
    assert "CUDA_VISIBLE_DEVICES=0,1" in result.summary


@pytest.mark.parametrize("cvd", ["", "-1"])
def test_visibility_cuda_visible_devices_hides_everything(cvd):
    probe = make_probe(device_count=0, cuda_available=False, cuda_visible_devices=cvd)
    result = cuda.check_visibility(probe, make_status(n=2))
    assert result.status == "fail"
    assert "unset it" in result.hint


def test_visibility_torch_cannot_start_cuda():
    probe = make_probe(
        device_count=0, cuda_available=False, cuda_init_error="RuntimeError: CUDA unknown error"
    )
    result = cuda.check_visibility(probe, make_status(n=1))
    assert result.status == "fail"
    assert "CUDA unknown error" in result.summary
    assert "dev_nodes" in result.hint


def test_visibility_mig_and_nvml_down():
    mig = make_status(gpus=[make_gpu(0, mig_mode=True)])
    assert cuda.check_visibility(make_probe(device_count=3), mig).status == "warn"
    assert cuda.check_visibility(make_probe(device_count=2), NO_NVML).status == "pass"
    assert (
        cuda.check_visibility(make_probe(torch_cuda_version=None), make_status()).status == "skip"
    )
