"""agents.cli and agents.render: commands, exit codes, usage errors, JSON and text output."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import __version__, cli, protocol, render
from agents.protocol import StatusSnapshot, VersionInfo

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3


def run_agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m agents ARGS`` in a fresh process."""
    return subprocess.run(
        [sys.executable, "-m", "agents", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


# --- status ------------------------------------------------------------------------------------


def test_status_json_round_trips(fake_nvml, capsys):
    fake_nvml.gpus(2, model="NVIDIA A100-SXM4-80GB", util_gpu=73)
    assert cli.main(["status", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.count("\n") == 1
    status = protocol.loads(StatusSnapshot, out)
    assert [g.name for g in status.gpus] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert [g.util_gpu_pct for g in status.gpus] == [73, 73]
    assert [g.sm_count for g in status.gpus] == [108, 108]
    assert json.loads(out)["schema"] == 1
    assert protocol.dumps(status) == out.strip()


def test_status_json_in_a_subprocess_with_the_fake(fake_nvml):
    fake_nvml.gpus(8, model="NVIDIA H200", processes=[{"pid": os.getpid(), "used_memory": GIB}])
    result = run_agent("status", "--json", env=fake_nvml.env)
    assert result.returncode == 0, result.stderr
    status = protocol.loads(StatusSnapshot, result.stdout)
    assert len(status.gpus) == 8
    assert {g.name for g in status.gpus} == {"NVIDIA H200"}
    assert len(status.processes) == 8
    assert all(p.pid == os.getpid() and p.command for p in status.processes)


def test_status_exits_zero_when_nvml_fails(fake_nvml, capsys):
    fake_nvml.init_error("LibRmVersionMismatch")
    assert cli.main(["status", "--json"]) == 0
    status = protocol.loads(StatusSnapshot, capsys.readouterr().out)
    assert status.nvml_error is not None
    assert status.nvml_error.code == "driver_library_mismatch"


def test_status_text_is_a_table(fake_nvml, capsys):
    fake_nvml.gpus(
        2,
        per_gpu={1: {"clocks_event_reasons": 0x4, "util_gpu": 100, "temperature": 83}},
        processes=[{"pid": os.getpid(), "used_memory": 3 * GIB}],
        driver_version="550.54.15",
        cuda_driver_version=12040,
    )
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "Driver 550.54.15  CUDA 12.4" in out
    header = next(line for line in lines if line.startswith("GPU  Name"))
    assert "Memory used / total" in header
    row1 = next(line for line in lines if line.lstrip().startswith("1  NVIDIA H100"))
    assert "83°C" in row1
    assert "100%" in row1
    assert "sw_power_cap" in row1
    row0 = next(line for line in lines if line.lstrip().startswith("0  NVIDIA H100"))
    assert "idle" in row0
    assert "79.6 GiB" in row0  # 81559 MiB total
    assert "68 W / 700 W" in row0
    assert out.count(str(os.getpid())) == 2
    assert "3.0 GiB" in out


def test_status_text_explains_an_nvml_error(fake_nvml, capsys):
    fake_nvml.init_error("DriverNotLoaded")
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "NVML error: driver_not_loaded" in out
    assert "What to do:" in out
    assert "modprobe nvidia" in out
    assert "GPU  Name" not in out


def test_status_text_with_no_gpus(fake_nvml, capsys):
    fake_nvml.gpus(0)
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "No NVIDIA GPUs found." in out
    assert "No processes are using the GPUs." in out


def test_status_text_shows_ecc_errors_and_notes_what_needs_attention(fake_nvml, capsys):
    fake_nvml.gpus(
        5,
        per_gpu={
            0: {"power_limit": 300000, "power_default_limit": 700000},
            1: {"ecc_uncorrected_volatile": 3},
            2: {"remapped_rows": [0, 0, 1, 0]},
            3: {"remapped_rows": [0, 0, 0, 1], "mig_mode": 1},
            4: {"ecc_uncorrected_volatile": "unsupported"},
        },
    )
    assert cli.main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("GPU  Name"))
    assert header.split()[-3:] == ["ECC", "Clock", "events"]
    rows = [line for line in lines if line[:3].strip().isdigit()]
    at = header.index("ECC")  # a right-aligned column as wide as its header
    assert [row[at : at + 3].strip() for row in rows] == ["0", "3", "0", "0", "-"]
    assert "GPU 0: power limit lowered to 300 W (default 700 W)" in lines
    assert "GPU 2: memory rows wait to be remapped (reset the GPU)" in lines
    assert "GPU 3: memory row remapping failed (no spare rows left)" in lines
    assert "GPU 3: MIG mode is on (CUDA sees MIG slices, not the whole GPU)" in lines
    assert not [line for line in lines if line.startswith(("GPU 1:", "GPU 4:"))]


def test_status_text_of_healthy_gpus_has_no_notes(fake_nvml, capsys):
    fake_nvml.gpus(2)
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0:" not in out
    assert "GPU 1:" not in out


def test_status_text_without_a_gpu_list_shows_no_process_table(fake_nvml, capsys):
    fake_nvml.gpus(2, count_error="Unknown")
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    assert "NVML error: unknown" in out
    assert "No processes" not in out
    assert "No NVIDIA GPUs found." not in out


def test_status_text_wraps_the_hint_without_splitting_commands(fake_nvml, capsys):
    fake_nvml.init_error("Unknown")
    assert cli.main(["status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    hint = lines[lines.index("NVML error: unknown") + 2 :]
    assert hint[0].startswith("  What to do: NVML failed unexpectedly.")
    assert all(line.startswith("  ") and len(line) <= 100 for line in hint)
    text = " ".join(line.strip() for line in hint)
    for command in ("`nvidia-smi`", "`sudo dmesg | grep -i -e nvrm -e xid`"):
        assert any(command in line for line in hint), command
        assert command in text


@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        ("short", 100, ["short"]),
        ("", 100, [""]),
        ("a b `c d e` f", 40, ["a b `c d e` f"]),
        ("word " * 12 + "`run this whole command please`", 50, None),
    ],
)
def test_wrap(text, width, expected):
    lines = render.wrap(text, "  ", width)
    if expected is not None:
        assert lines == ["  " + line if line else "" for line in expected]
        return
    assert len(lines) == 2
    assert lines[1].endswith(" `run this whole command please`")
    assert all(line.startswith("  ") and len(line) <= width for line in lines)


# --- version -----------------------------------------------------------------------------------


def test_version_json_and_text(capsys):
    assert cli.main(["version", "--json"]) == 0
    info = protocol.loads(VersionInfo, capsys.readouterr().out)
    assert info.agent_version == __version__
    assert info.python_version == ".".join(map(str, sys.version_info[:3]))
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out == f"gpu-agent {__version__} (Python {info.python_version})\n"


# --- usage errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "choose a command"),
        (["bogus"], "invalid choice: 'bogus'"),
        (["status", "--bogus"], "unrecognized arguments: --bogus"),
        (["version", "extra"], "unrecognized arguments: extra"),
        (["health", "--expect-count", "0"], "'0' must be 1 or more"),
        (["health", "--expect-count", "two"], "'two' is not a whole number"),
        (["health", "--timeout", "-3"], "'-3' must be a positive number of seconds"),
        (["health", "--timeout", "nan"], "'nan' must be a positive number of seconds"),
        (["health", "--timeout", "soon"], "'soon' is not a number of seconds"),
        (["health", "--python"], "expected one argument"),
        (["health", "--stress", "4.9"], "'4.9' must be between 5 s and 4 h"),
        (["health", "--stress", "4h1s"], "'4h1s' must be between 5 s and 4 h"),
        (["health", "--stress", "soon"], "'soon' is not a duration: write it like 90s, 5m"),
        (["health", "--stress", "5 m"], "'5 m' is not a duration"),
        (["health", "--stress", "5x"], "'5x' is not a duration"),
    ],
)
def test_usage_errors_exit_2_with_a_message(capsys, argv, message):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err
    assert err.startswith("usage: gpu-agent")


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("5", 5.0), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("2.5m", 150.0), ("4h", 14400.0)],
)
def test_stress_durations(raw, seconds):
    from agents import arguments

    assert arguments.stress_duration(raw) == seconds


def test_help_exits_zero(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("status", "health", "version"):
        assert command in out


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["status", "--bogus"], "usage: gpu-agent status [-h] [--json]"),
        (["version", "extra"], "usage: gpu-agent version [-h] [--json]"),
        (["health", "--fast"], "usage: gpu-agent health [-h] [--full]"),
        (["--bogus"], "usage: gpu-agent [-h] COMMAND ..."),
    ],
)
def test_unrecognized_arguments_show_the_commands_own_usage(capsys, argv, usage):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert f"unrecognized arguments: {argv[-1]}" in err


def test_job_commands_are_still_registered(capsys):
    assert cli.main(["jobs", "--help"]) == 0
    assert "--since" in capsys.readouterr().out
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    for command in ("status", "health", "version", "run", "jobs", "logs", "cancel", "who"):
        assert repr(command) in err


#: What ``status`` must not load: each costs more than the rest of a status without a driver.
HEAVY_MODULES = {
    "argparse",
    "dataclasses",
    "enum",
    "inspect",
    "json",
    "re",
    "typing",
    "agents.protocol",
    "agents.jobs_cli",
    "agents.runner",
    "agents.jobstore",
    "agents.sessions",
    "agents.gpu_queue",
    "agents.health",
}

_LOADED_BY_STATUS = """
import sys
before = set(sys.modules)
from agents.cli import main
main(sys.argv[1:])
sys.stderr.write(repr(sorted(set(sys.modules) - before)))
"""


def modules_loaded_by(*args: str, env: dict[str, str]) -> tuple[str, set[str]]:
    """Stdout of ``main(args)`` in a fresh ``python -c`` and the modules it loaded."""
    result = subprocess.run(
        [sys.executable, "-c", _LOADED_BY_STATUS, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return result.stdout, set(ast.literal_eval(result.stderr))


@pytest.mark.parametrize("words", [("status", "--json"), ("status",)])
def test_status_without_a_driver_loads_only_what_it_needs(words):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUBOT_FAKE_NVML")}
    out, loaded = modules_loaded_by(*words, env=env)
    if "--json" in words:
        assert protocol.loads(StatusSnapshot, out).nvml_error.code == "library_not_found"
        assert not loaded & HEAVY_MODULES
        assert {"agents.cli", "agents.nvml", "agents.host", "agents.wire"} <= loaded
    else:  # the table is rendered from the typed snapshot
        assert "library_not_found" in out
        assert "agents.protocol" in loaded
    assert "pynvml" not in loaded  # no driver library: the bindings are not even imported


def test_status_with_gpus_loads_only_what_it_needs(fake_nvml):
    fake_nvml.gpus(2)
    out, loaded = modules_loaded_by("status", "--json", env=fake_nvml.env)
    assert len(protocol.loads(StatusSnapshot, out).gpus) == 2
    assert "pynvml" in loaded
    assert not loaded & (HEAVY_MODULES - {"json", "re", "enum"})  # the fake reads JSON


def test_status_fast_path_prints_what_the_parser_path_prints(fake_nvml, capsys):
    """``status --json`` skips argparse; an abbreviation goes through it: same document."""
    fake_nvml.gpus(3, processes=[{"pid": os.getpid(), "used_memory": GIB}])
    fixed = {"collected_at": "x", "host": None}
    moving = {"cpu_pct", "rss_bytes", "elapsed_s"}  # this process's, a moment apart

    def steady(doc: dict) -> dict:
        doc["processes"] = [
            {k: v for k, v in p.items() if k not in moving} for p in doc["processes"]
        ]
        return doc | fixed

    assert cli.main(["status", "--json"]) == 0
    fast = steady(json.loads(capsys.readouterr().out))
    assert cli.main(["status", "--js"]) == 0
    parsed = steady(json.loads(capsys.readouterr().out))
    assert fast == parsed
    assert len(fast["gpus"]) == 3
    assert len(fast["processes"]) == 3


def test_usage_error_in_a_subprocess():
    result = run_agent("status", "--nope")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: gpu-agent")
    assert "unrecognized arguments: --nope" in result.stderr


def test_usage_error_changes_nothing(fake_nvml, capsys):
    fake_nvml.gpus(1)
    assert cli.main(["health", "--expect-count", "-1"]) == 2
    capsys.readouterr()
    assert fake_nvml.calls() == []  # NVML never touched


# --- health (through agents.health) ------------------------------------------------------------


def test_health_fails_with_exit_1_when_nvml_fails(fake_nvml, tmp_path):
    fake_nvml.init_error("DriverNotLoaded")
    result = run_agent(
        "health", "--json", "--python", sys.executable, "--timeout", "60", env=fake_nvml.env
    )
    assert result.returncode == 1, result.stderr
    report = protocol.loads(protocol.HealthReport, result.stdout)
    assert report.status == "fail"
    failing = {c.id for c in report.checks if c.status == "fail"}
    assert "nvml" in failing


def test_health_text_output(fake_nvml):
    fake_nvml.init_error("LibraryNotFound")
    result = run_agent("health", "--python", sys.executable, env=fake_nvml.env)
    assert result.returncode == 1
    assert "nvml" in result.stdout
    assert "fail" in result.stdout.lower()


# --- render helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (2048, "2 KiB"),
        (512 * 1024**2, "512 MiB"),
        (81559 * 1024**2, "79.6 GiB"),
        (3 * 1024**4, "3.0 TiB"),
    ],
)
def test_format_bytes(value, text):
    assert render.format_bytes(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (5, "5s"), (59.9, "59s"), (60, "1m"), (3660, "1h01m"), (90000, "1d01h")],
)
def test_format_duration(seconds, text):
    assert render.format_duration(seconds) == text


def test_process_table_marks_agent_jobs_and_shows_use():
    procs = [
        protocol.ProcessSnapshot(
            0,
            42,
            "alice",
            "python train.py",
            2 * GIB,
            job_id="j-1",
            sm_util_pct=87,
            mem_bw_util_pct=41,
            cpu_pct=312.4,
            rss_bytes=6 * GIB,
            elapsed_s=3725,
        ),
        protocol.ProcessSnapshot(1, 43, None, None, None),
    ]
    text = render.process_table(procs)
    lines = text.splitlines()
    assert lines[0].split() == [
        "GPU",
        "PID",
        "User",
        "GPU",
        "mem",
        "SM",
        "Mem",
        "BW",
        "CPU",
        "RSS",
        "Time",
        "Command",
    ]
    assert lines[1].split()[:12] == [
        "0",
        "42",
        "alice",
        "2.0",
        "GiB",
        "87%",
        "41%",
        "312%",
        "6.0",
        "GiB",
        "1h02m",
        "[job",
    ]
    assert "[job j-1] python train.py" in lines[1]
    assert lines[2].split() == ["1", "43", "-", "-", "-", "-", "-", "-", "-", "-"]
