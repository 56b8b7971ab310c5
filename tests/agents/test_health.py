"""agents.health: run_health end to end (real torch in a real subprocess, real files), evaluate's
order and worst status, render_text, and the JSON document."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

import pytest

from agents import health, protocol
from agents.checks import common
from agents.protocol import HealthCheck, HealthReport
from agents.system import (
    FilesystemFacts,
    KernelLogFacts,
    ShmFacts,
    SystemPaths,
    read_sshd_config,
    scan_dev_nodes,
)
from tests.agents.factories import (
    GIB,
    make_driver,
    make_full_probe,
    make_gpu,
    make_nccl,
    make_nvml_error,
    make_nvswitch_topology,
    make_probe,
    make_status,
)


def cpu_torch() -> bool:
    """Whether this environment's torch is the CPU-only build (as in the development setup)."""
    import torch

    return torch.version.cuda is None


@pytest.fixture
def healthy_paths(tmp_path: Path) -> SystemPaths:
    """A /dev with 8 usable GPU nodes, a keys-only sshd and nothing listening."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ["nvidiactl", "nvidia-uvm"] + [f"nvidia{i}" for i in range(8)]:
        (dev / name).write_text("")
    ssh = tmp_path / "ssh"
    ssh.mkdir()
    (ssh / "sshd_config").write_text("PasswordAuthentication no\nKbdInteractiveAuthentication no\n")
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text("  sl  local_address rem_address   st\n")
    (proc / "uptime").write_text("3600.00 7000.00\n")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1000000,-;Linux version 6.8.0\n")
    shm = tmp_path / "shm"
    shm.mkdir()
    return SystemPaths(
        dev_dir=str(dev),
        sshd_config=str(ssh / "sshd_config"),
        proc_dir=str(proc),
        shm_dir=str(shm),
        kmsg=str(kmsg),
        kernel_logs=(),
        disk_dirs=(("home", str(tmp_path)),),
    )


def fake_python(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def by_id(report: HealthReport) -> dict[str, HealthCheck]:
    return {c.id: c for c in report.checks}


# --- run_health end to end --------------------------------------------------------------------


@pytest.mark.integration
def test_run_health_with_this_environments_torch(healthy_paths):
    status = make_status(n=8)
    report = health.run_health(
        status,
        full=True,
        python=sys.executable,
        expect_gpu="h100",
        expect_count=8,
        paths=healthy_paths,
        timeout_s=120,
    )
    checks = by_id(report)
    assert tuple(checks) == health.CHECK_IDS + health.FULL_CHECK_IDS
    torch_build = checks["torch_build"]
    if cpu_torch():
        assert torch_build.status == "fail"
        assert "CPU-only build" in torch_build.summary
        assert f"{sys.executable} -m pip uninstall -y torch" in torch_build.hint
        assert "--index-url https://download.pytorch.org/whl/cu124" in torch_build.hint
        for skipped in ("cuda_compat", "arch", "visibility", "matmul", "bandwidth", "gemm"):
            assert checks[skipped].status == "skip", skipped
        assert "CUDA build" in checks["gemm"].summary
        assert report.status == "fail"
    else:
        assert torch_build.status == "pass"
    for passing in (
        "dev_nodes",
        "nvml",
        "driver",
        "identity",
        "leftover_memory",
        "ecc",
        "row_remap",
        "throttle",
        "temperature",
        "power_cap",
        "pcie",
        "xid",
        "ssh_password_login",
        "exposed_ports",
    ):
        assert checks[passing].status == "pass", (passing, checks[passing].summary)
    assert checks["disk"].details["filesystems"][0]["path"] == str(healthy_paths.disk_dirs[0][1])
    assert checks["shm"].details["path"] == healthy_paths.shm_dir


@pytest.mark.integration
def test_run_health_in_a_python_without_torch(tmp_path, healthy_paths):
    python = fake_python(tmp_path, "python-no-site", f'exec "{sys.executable}" -S "$@"')
    report = health.run_health(make_status(), python=python, paths=healthy_paths)
    torch_build = by_id(report)["torch_build"]
    assert torch_build.status == "fail"
    assert torch_build.summary.startswith("torch not installed in")
    assert (
        "pip install torch --index-url https://download.pytorch.org/whl/cu124" in torch_build.hint
    )


@pytest.mark.integration
def test_run_health_survives_a_hanging_torch(tmp_path, healthy_paths):
    python = fake_python(tmp_path, "python-hangs", "exec sleep 60")
    began = time.monotonic()
    report = health.run_health(make_status(), python=python, paths=healthy_paths, timeout_s=1.0)
    assert time.monotonic() - began < 10
    checks = by_id(report)
    assert checks["torch_build"].status == "fail"
    assert "did not finish within 1 s" in checks["torch_build"].summary
    assert checks["nvml"].status == "pass"
    assert report.status == "fail"


@pytest.mark.integration
def test_run_health_with_a_missing_python(healthy_paths):
    report = health.run_health(
        make_status(), python="/nonexistent/bin/python3", paths=healthy_paths
    )
    torch_build = by_id(report)["torch_build"]
    assert torch_build.status == "fail"
    assert "Python not found" in torch_build.summary


@pytest.mark.integration
def test_run_health_on_this_machine_as_it_is(tmp_path):
    """Real /dev, /etc/ssh and /proc; NVML as on a machine without a driver."""
    status = make_status(nvml_error=make_nvml_error())
    python = fake_python(tmp_path, "python-no-site", f'exec "{sys.executable}" -S "$@"')
    report = health.run_health(status, python=python)
    checks = by_id(report)
    assert tuple(checks) == health.CHECK_IDS
    assert checks["nvml"].status == "fail"
    assert checks["dev_nodes"].status == ("pass" if scan_dev_nodes().control.exists else "fail")
    sshd = read_sshd_config()
    assert checks["ssh_password_login"].status in (
        ("warn", "pass", "skip") if sshd.found else ("skip",)
    )
    assert report.status == "fail"
    assert protocol.loads(HealthReport, protocol.dumps(report)) == report


# --- evaluate ---------------------------------------------------------------------------------


HEALTHY_DISKS = (
    FilesystemFacts(
        "/home/me", ("home", "jobs", "temp"), 500 * GIB, 200 * GIB, 10**7, 9 * 10**6, False
    ),
)
HEALTHY_SHM = ShmFacts("/dev/shm", True, 64 * GIB, 64 * GIB, "tmpfs")


def facts_for(status, probe=None, full_probe=None, paths: SystemPaths | None = None, **extra):
    """Facts of a healthy machine around ``status``: files under ``paths``, plenty of disk and
    /dev/shm, a kernel log without Xids and, with ``full_probe``, NVSwitch links and a fast
    all-reduce; ``extra`` replaces any of them."""
    where = paths or SystemPaths()
    count = len(status.gpus)
    fields = {
        "status": status,
        "dev_nodes": scan_dev_nodes(where.dev_dir),
        "probe": probe or make_probe(device_count=count),
        "sshd": read_sshd_config(where.sshd_config),
        "listeners": (),
        "full_probe": full_probe,
        "disks": HEALTHY_DISKS,
        "shm": HEALTHY_SHM,
        "kernel_log": KernelLogFacts("/dev/kmsg", ()),
        "xid_watching": True,
        "topology": make_nvswitch_topology(count) if full_probe and count > 1 else None,
        "nccl": make_nccl(count) if full_probe and count > 1 else None,
    }
    fields.update(extra)
    return health.HealthFacts(**fields)


def test_evaluate_a_healthy_machine_passes_everything(healthy_paths):
    status = make_status(n=8)
    full = make_full_probe(device_count=8)
    report = health.evaluate(
        facts_for(status, full_probe=full, paths=healthy_paths),
        full=True,
        expect_gpu="h100-sxm",
        expect_count=8,
    )
    assert [(c.id, c.status) for c in report.checks] == [
        (i, "pass") for i in health.CHECK_IDS + health.FULL_CHECK_IDS
    ]
    assert report.status == "pass"
    assert all(c.hint == "" for c in report.checks)


def test_evaluate_reports_the_worst_status(healthy_paths):
    status = make_status(gpus=[make_gpu(0, temp_c=90)])
    report = health.evaluate(facts_for(status, paths=healthy_paths))
    assert report.status == "warn"
    assert by_id(report)["temperature"].status == "warn"
    hot_and_broken = make_status(gpus=[make_gpu(0, temp_c=90, ecc_uncorrected_volatile=2)])
    assert health.evaluate(facts_for(hot_and_broken, paths=healthy_paths)).status == "fail"


def test_evaluate_without_full_has_no_measurement_checks(healthy_paths):
    report = health.evaluate(facts_for(make_status(), paths=healthy_paths))
    assert tuple(c.id for c in report.checks) == health.CHECK_IDS


def test_driver_too_old_for_torch_shows_in_several_checks(healthy_paths):
    status = make_status(driver=make_driver(version="470.82.01", cuda_version="11.4"))
    probe = make_probe(
        cuda_available=False,
        device_count=0,
        cuda_init_error="RuntimeError: The NVIDIA driver on your system is too old",
    )
    checks = by_id(health.evaluate(facts_for(status, probe=probe, paths=healthy_paths)))
    assert checks["driver"].status == "warn"
    assert checks["cuda_compat"].status == "fail"
    assert checks["visibility"].status == "fail"


# --- the JSON document and the text -----------------------------------------------------------


def test_report_json_round_trips(healthy_paths):
    status = make_status(n=2, temp_c=96)
    report = health.evaluate(
        facts_for(status, full_probe=make_full_probe(device_count=2), paths=healthy_paths),
        full=True,
        expect_gpu="h100",
    )
    text = protocol.dumps(report)
    doc = json.loads(text)
    assert doc["schema"] == 1
    assert doc["status"] == "fail"
    assert {c["status"] for c in doc["checks"]} <= {"pass", "warn", "fail", "skip"}
    keys = {"id", "status", "summary", "hint", "details"}
    translatable = {"summary_template", "summary_params", "hint_template", "hint_params"}
    translatable |= {"summary_parts", "hint_parts"}
    assert all(set(c) == keys | translatable for c in doc["checks"])
    assert protocol.loads(HealthReport, text) == report


def test_each_finding_carries_its_english_template_and_parameters(healthy_paths):
    """The English text is the template filled with the parameters, for summary and hint."""
    status = make_status(n=2, temp_c=96)
    report = health.evaluate(
        facts_for(status, full_probe=make_full_probe(device_count=2), paths=healthy_paths),
        full=True,
        expect_gpu="h100",
    )
    templated = 0
    for check in report.checks:
        for text, template, params in (
            (check.summary, check.summary_template, check.summary_params),
            (check.hint, check.hint_template, check.hint_params),
        ):
            if template is not None:
                templated += 1
                assert all(isinstance(v, str) for v in params.values())
                assert template.format(**params) == text
    assert templated >= 20
    hot = next(c for c in report.checks if c.id == "temperature")
    assert hot.summary_template == "GPU too hot ({hot})"
    assert "96" in hot.summary_params["hot"]


def test_an_old_agents_check_without_templates_still_parses():
    doc = {"id": "nvml", "status": "pass", "summary": "NVML sees 8 GPU(s)", "hint": ""}
    check = protocol.from_dict(HealthCheck, doc)
    assert (check.summary_template, check.summary_params) == (None, {})
    assert (check.hint_template, check.hint_params) == (None, {})
    plain = common.make("nvml", "fail", "as sent", "do this")
    assert (plain.summary, plain.summary_template, plain.hint, plain.hint_template) == (
        "as sent",
        None,
        "do this",
        None,
    )
    text = common.make("x", "pass", common.N_("{n} GPU(s)", n=2), common.N_("dropped on pass"))
    assert (text.summary, text.summary_template, text.summary_params) == (
        "2 GPU(s)",
        "{n} GPU(s)",
        {"n": "2"},
    )
    assert (text.hint, text.hint_template, text.hint_params) == ("", None, {})


def test_render_text_is_a_checklist_with_indented_hints():
    report = HealthReport(
        status="fail",
        checks=(
            HealthCheck("nvml", "pass", "NVML sees 8 GPU(s)"),
            HealthCheck(
                "torch_build", "fail", "torch 2.4.0+cpu is a CPU-only build", "Reinstall it."
            ),
            HealthCheck("identity", "skip", "skipped: nothing expected"),
            HealthCheck("temperature", "warn", "GPU running hot", "Check the cooling " * 12),
        ),
    )
    text = health.render_text(report)
    lines = text.splitlines()
    assert lines[0] == "PASS  nvml         NVML sees 8 GPU(s)"
    assert lines[1] == "FAIL  torch_build  torch 2.4.0+cpu is a CPU-only build"
    assert lines[2] == " " * 19 + "What to do: Reinstall it."
    assert lines[3].startswith("SKIP  identity")
    assert lines[4].startswith("WARN  temperature  GPU running hot")
    hint_lines = [line for line in lines[5:] if line.startswith(" " * 19)]
    assert len(hint_lines) >= 2
    assert all(len(line) <= 100 for line in lines)
    assert lines[-1] == "health: FAIL (1 fail, 1 warn, 1 skip, 1 pass)"


def test_render_text_wraps_long_summaries_and_keeps_commands_whole():
    command = "`/opt/venv/bin/python -m pip install torch --index-url https://example.org/cu126`"
    report = HealthReport(
        status="fail",
        checks=(
            HealthCheck("identity", "fail", "GPU 0 is something else entirely, " * 5, "Ask."),
            HealthCheck("torch_build", "fail", "CPU-only build", f"Replace it: {command}."),
        ),
    )
    lines = health.render_text(report).splitlines()
    indent = " " * 19
    assert lines[0].startswith("FAIL  identity     GPU 0 is")
    assert lines[1].startswith(indent)
    assert lines[1][len(indent)] != " "
    summary_lines = [line for line in lines if "something else" in line]
    assert len(summary_lines) >= 2
    assert all(len(line) <= 100 for line in summary_lines)
    assert any(line == indent + command + "." for line in lines)


def test_render_text_of_an_empty_report():
    assert health.render_text(HealthReport(status="pass", checks=())).endswith(
        "health: PASS (no checks)"
    )


# --- a real GPU -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.integration
def test_health_full_on_a_real_gpu():
    from agents import nvml

    status = nvml.collect_status()
    report = health.run_health(status, full=True, python=sys.executable, timeout_s=300)
    checks = by_id(report)
    print(health.render_text(report))
    assert checks["nvml"].status == "pass"
    assert checks["dev_nodes"].status == "pass"
    assert checks["identity"].status == "skip"
    if not cpu_torch():
        for check_id in ("torch_build", "cuda_compat", "arch", "visibility", "matmul"):
            assert checks[check_id].status == "pass", checks[check_id]
        for check_id in ("bandwidth", "gemm"):
            assert checks[check_id].status in ("pass", "warn")
            assert checks[check_id].details["gpus"]["0"]["measured"] > 0


def test_one_joined_finding_keeps_its_template_and_several_travel_as_parts():
    one = common.joined("; ", [common.N_("{where} is read-only", where="/data")])
    assert isinstance(one, common.Text)
    assert str(one) == "/data is read-only"
    two = common.joined(
        "; ", [common.N_("{where} is read-only", where="/a"), "/b has 1.0 GiB free"]
    )
    assert str(two) == "/a is read-only; /b has 1.0 GiB free"
    check = common.make("disk", "warn", two, common.joined(" ", []))
    assert (check.summary, check.summary_template) == ("/a is read-only; /b has 1.0 GiB free", None)
    assert check.summary_parts == (
        {"template": "{where} is read-only", "params": {"where": "/a"}},
        "/b has 1.0 GiB free",
    )
    assert (check.hint, check.hint_parts) == ("", ())
    nested = common.N_("Xid {xid} ({meaning})", xid=79, meaning=common.N_("fell off"))
    check = common.make("xid", "fail", nested)
    assert (check.summary, check.summary_template) == ("Xid 79 (fell off)", None)
    assert check.summary_parts == (
        {
            "template": "Xid {xid} ({meaning})",
            "params": {"xid": "79", "meaning": {"template": "fell off", "params": {}}},
        },
    )
