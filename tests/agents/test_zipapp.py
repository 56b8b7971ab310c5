"""agents.zipapp: a deterministic single-file agent that runs under ``python3 -I``."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from agents import __version__, protocol
from agents import zipapp as builder
from agents.protocol import StatusSnapshot

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "agents"
pytestmark = pytest.mark.integration

# Fields that change between two runs a moment apart.
VOLATILE_HOST = {"uptime_s"}
VOLATILE_GPU = {
    "util_gpu_pct",
    "util_mem_pct",
    "temp_c",
    "power_draw_w",
    "sm_clock_mhz",
    "clock_event_reasons",
    "mem_used_bytes",
    "mem_free_bytes",
    "pcie_gen_current",
    "pcie_width_current",
}


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builder.build(tmp_path_factory.mktemp("zipapp") / "gpu-agent.pyz")


def clean_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def run_pyz(
    pyz: Path,
    *args: str,
    flags: tuple[str, ...] = ("-I",),
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
):
    return subprocess.run(
        [sys.executable, *flags, str(pyz), *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        cwd=cwd or pyz.parent,
        timeout=60,
        check=False,
    )


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    doc = dict(doc)
    doc.pop("collected_at")
    doc["host"] = {k: v for k, v in doc["host"].items() if k not in VOLATILE_HOST}
    doc["gpus"] = [{k: v for k, v in g.items() if k not in VOLATILE_GPU} for g in doc["gpus"]]
    doc.pop("processes")  # other people's GPU processes come and go
    return doc


def test_the_build_is_deterministic(tmp_path):
    source = tmp_path / "src" / "agents"
    shutil.copytree(AGENTS, source, ignore=shutil.ignore_patterns("__pycache__"))
    first = builder.build(tmp_path / "first.pyz", package_dir=source)
    os.utime(source / "cli.py", (1_000_000, 1_000_000))  # file times do not matter
    second = builder.build(tmp_path / "second.pyz", package_dir=source)
    code = (
        "import sys; from pathlib import Path; from agents import zipapp; "
        "zipapp.build(Path(sys.argv[1]), package_dir=Path(sys.argv[2]))"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "third.pyz"), str(source)],
        env=dict(os.environ, PYTHONHASHSEED="12345"),
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    third = tmp_path / "third.pyz"
    assert first.read_bytes() == second.read_bytes() == third.read_bytes()
    assert builder.sha256(first) == builder.sha256(third)
    (source / "cli.py").write_text((source / "cli.py").read_text() + "\n# changed\n")
    changed = builder.build(tmp_path / "changed.pyz", package_dir=source)
    assert builder.sha256(changed) != builder.sha256(first)


def test_starts_with_the_shebang_and_is_executable(pyz):
    first = pyz.read_bytes().split(b"\n", 1)[0]
    assert first == b"#!/usr/bin/env python3"
    assert os.stat(pyz).st_mode & 0o111


def test_contents(pyz):
    with zipfile.ZipFile(pyz) as archive:
        infos = archive.infolist()
        names = [i.filename for i in infos]
        assert names == sorted(names)
        assert {i.date_time for i in infos} == {builder.FIXED_DATE_TIME}
        main = archive.read("__main__.py").decode()
        assert main == builder.main_source(
            {n: archive.read(n) for n in names}, built_for=sys.implementation.cache_tag
        )
        assert f"BUILT_FOR = {sys.implementation.cache_tag!r}" in main
        assert "FILES = ['agents/__init__.py', " in main
        real = Path(str(metadata.distribution("nvidia-ml-py").locate_file("pynvml.py")))
        assert archive.read("pynvml.py") == real.read_bytes()
        for name in ("agents/__init__.py", "agents/cli.py", "agents/nvml.py", "agents/protocol.py"):
            assert archive.read(name) == (ROOT / name).read_bytes()
            assert name + "c" in names
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/")]
    assert not [n for n in names if "fake_nvml" in n]
    data_files = sorted(
        p.relative_to(ROOT).as_posix()
        for p in AGENTS.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    )
    assert set(data_files) <= set(names)


def test_every_source_parses_as_python_3_9(pyz):
    with zipfile.ZipFile(pyz) as archive:
        sources = [n for n in archive.namelist() if n.endswith(".py")]
        assert len(sources) >= 6
        for name in sources:
            ast.parse(archive.read(name), filename=name, feature_version=(3, 9))


@pytest.mark.parametrize("flags", [("-I",), ("-I", "-S")], ids=["isolated", "no-site"])
def test_status_matches_the_installed_agent(pyz, flags):
    zipped = run_pyz(pyz, "status", "--json", flags=flags)
    assert zipped.returncode == 0, zipped.stderr
    installed = subprocess.run(
        [sys.executable, "-m", "agents", "status", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    a = protocol.loads(StatusSnapshot, zipped.stdout)
    b = protocol.loads(StatusSnapshot, installed.stdout)
    assert comparable(protocol.to_dict(a)) == comparable(protocol.to_dict(b))
    assert a.nvml_error == b.nvml_error


def test_runs_from_sources_when_bytecode_is_absent(tmp_path):
    plain = builder.build(tmp_path / "plain.pyz", bytecode=False)
    with zipfile.ZipFile(plain) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".pyc")]
    env = dict(clean_env(), GPU_AGENT_HOME=str(tmp_path / "not-a-dir"))
    (tmp_path / "not-a-dir").write_text("a file: nothing can be extracted here")
    result = run_pyz(plain, "version", "--json", flags=("-I", "-S"), env=env)
    assert result.returncode == 0, result.stderr
    assert (
        json.loads(result.stdout)["agent_version"]
        == protocol.loads(protocol.VersionInfo, result.stdout).agent_version
    )


def extracted_dirs(home: Path) -> list[Path]:
    lib = home / "lib"
    return sorted(lib.iterdir()) if lib.exists() else []


def test_a_python_without_fitting_bytecode_extracts_once_and_keeps_bytecode(tmp_path):
    """No bytecode for this Python in the archive (as on an instance whose Python differs from
    the bot's): the files are extracted once under GPU_AGENT_HOME/lib and Python caches the
    bytecode there; later runs reuse them and print the same."""
    plain = builder.build(tmp_path / "plain.pyz", bytecode=False)
    home = tmp_path / "home"
    env = dict(clean_env(), GPU_AGENT_HOME=str(home))
    first = run_pyz(plain, "status", "--json", env=env)
    assert first.returncode == 0, first.stderr
    [where] = extracted_dirs(home)
    assert where.name.endswith("-" + sys.implementation.cache_tag)
    with zipfile.ZipFile(plain) as archive:
        for name in ("agents/cli.py", "agents/gpu_specs.json", "agents/cuda_probe.py", "pynvml.py"):
            assert (where / name).read_bytes() == archive.read(name)
    cached = {p.name for p in (where / "agents" / "__pycache__").iterdir()}
    tag = sys.implementation.cache_tag
    assert {f"cli.{tag}.pyc", f"nvml.{tag}.pyc", f"wire.{tag}.pyc"} <= cached
    marker = where / "agents" / "marker"
    marker.write_text("left alone")
    second = run_pyz(plain, "status", "--json", env=env)
    assert second.returncode == 0, second.stderr
    assert extracted_dirs(home) == [where]
    assert marker.read_text() == "left alone"
    a, b = (protocol.loads(StatusSnapshot, r.stdout) for r in (first, second))
    assert comparable(protocol.to_dict(a)) == comparable(protocol.to_dict(b))
    in_place = run_pyz(plain, "status", "--json", flags=("-I", "-B"), env=env)
    assert comparable(json.loads(in_place.stdout)) == comparable(json.loads(first.stdout))
    assert not [p for p in (home / "lib").iterdir() if p.name.endswith(".tmp")]


def test_the_building_python_runs_from_the_archive(pyz, tmp_path):
    home = tmp_path / "home"
    result = run_pyz(pyz, "version", "--json", env=dict(clean_env(), GPU_AGENT_HOME=str(home)))
    assert result.returncode == 0, result.stderr
    assert not home.exists()


def test_another_build_gets_its_own_directory(tmp_path):
    source = tmp_path / "src" / "agents"
    shutil.copytree(AGENTS, source, ignore=shutil.ignore_patterns("__pycache__"))
    first = builder.build(tmp_path / "first.pyz", bytecode=False, package_dir=source)
    (source / "__init__.py").write_text('"""changed"""\n__version__ = "9.9.9"\n')
    second = builder.build(tmp_path / "second.pyz", bytecode=False, package_dir=source)
    home = tmp_path / "home"
    env = dict(clean_env(), GPU_AGENT_HOME=str(home))
    versions = []
    for pyz in (first, second, first):
        result = run_pyz(pyz, "version", "--json", env=env)
        assert result.returncode == 0, result.stderr
        versions.append(json.loads(result.stdout)["agent_version"])
    assert versions == [__version__, "9.9.9", __version__]
    assert len(extracted_dirs(home)) == 2


def test_collected_entries_never_extract():
    """collect_entries() is for archives assembled by hand (tests swap files in): they run in
    place, so a swapped file is never mistaken for another build's extracted one."""
    main = builder.collect_entries()["__main__.py"].decode()
    assert "BUILD_ID = ''" in main


def test_usage_error_exit_code_from_the_zipapp(pyz):
    result = run_pyz(pyz, "frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_data_files_are_readable_inside_the_zipapp(pyz):
    names = sorted(p.name for p in AGENTS.glob("*.json"))
    code = (
        "import json, pkgutil, sys\n"
        "for name in sys.argv[1:]:\n"
        "    json.loads(pkgutil.get_data('agents', name))\n"
        "print(len(sys.argv) - 1)\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(pyz)!r})\n" + code,
            *names,
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(len(names))


def test_main_builds_and_prints_the_hash(tmp_path, capsys):
    out = tmp_path / "sub" / "gpu-agent.pyz"
    assert builder.main([str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == f"{out} sha256={builder.sha256(out)}"


def test_missing_nvidia_ml_py_is_a_clear_error(monkeypatch, tmp_path, capsys):
    def not_installed(name: str) -> metadata.Distribution:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", not_installed)
    assert builder.main([str(tmp_path / "x.pyz")]) == 1
    assert "pip install nvidia-ml-py" in capsys.readouterr().err
    assert not (tmp_path / "x.pyz").exists()


def _python_3_9() -> str | None:
    """A working Python 3.9: ``python3.9`` on PATH, else one that pyenv installed (its shim on
    PATH may point at another version); None when there is none."""
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [
        shutil.which("python3.9"),
        *map(str, pyenv_root.glob("versions/3.9*/bin/python3.9")),
    ]
    for candidate in candidates:
        if candidate is not None and _runs_3_9(candidate):
            return candidate
    return None


def _runs_3_9(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-I", "-c", "import sys; print(sys.version_info[:2] == (3, 9))"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return False
    return done.stdout.strip() == "True"


def test_status_and_health_run_under_python_3_9(pyz, tmp_path):
    """The oldest Python the agent supports runs the archive (extracting it, as the bytecode
    is another Python's): status with the new fields, and health with its new checks."""
    python = _python_3_9()
    if python is None:
        pytest.skip("no working Python 3.9 (on PATH or installed by pyenv)")
    env = dict(clean_env(), GPU_AGENT_HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [python, "-I", str(pyz), "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    status = protocol.loads(StatusSnapshot, done.stdout)
    assert status.host.python_version.startswith("3.9.")
    health = subprocess.run(
        [python, "-I", str(pyz), "health", "--json", "--python", python],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert health.returncode in (0, 1), health.stderr
    checks = {c["id"]: c for c in json.loads(health.stdout)["checks"]}
    assert {"xid", "disk", "shm"} <= set(checks)
    assert checks["disk"]["status"] in ("pass", "warn", "fail")


def test_job_commands_run_under_python_3_9(pyz, tmp_path):
    """The job commands' GPU requests and messages under the oldest Python the agent
    supports, on a machine without a driver: the default runs on the CPU, a GPU request is
    refused in words, and who says there is no driver."""
    python = _python_3_9()
    if python is None:
        pytest.skip("no working Python 3.9 (on PATH or installed by pyenv)")
    env = dict(clean_env(), GPU_AGENT_HOME=str(tmp_path / "home"))

    def agent(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-I", str(pyz), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    queued = agent("run", "--json", "--", "echo", "it's")
    assert queued.returncode == 0, queued.stderr
    assert protocol.loads(protocol.JobRecord, queued.stdout).gpus_requested == "none"
    asked = agent("run", "--gpus", "any:1", "--", "true")
    assert asked.returncode == 1
    assert "no NVIDIA GPU can be used on this machine" in asked.stderr
    bad = agent("run", "--gpus", "gpu0", "--", "true")
    assert bad.returncode == 2
    assert "--gpus any:2 (any 2 free GPUs)" in bad.stderr
    who = agent("who")
    assert who.returncode == 1
    assert "No NVIDIA driver on this machine (nvidia-smi / NVML not found)" in who.stderr
    listed = agent("jobs")
    assert listed.returncode == 0, listed.stderr
    assert """echo "it's\"""" in listed.stdout
