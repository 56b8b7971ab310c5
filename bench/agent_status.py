"""Benchmark: wall time and peak memory of ``gpu-agent status --json`` against the floor.

Each command runs in a fresh process, N times, interleaved round-robin so that drift in machine
load hits every command alike. Reported: the median wall time, the median CPU time (user +
system of the child, from ``os.wait4``) and the median peak RSS measured by ``/usr/bin/time``
(a small C parent, so the child's peak is its own and not a copy of this Python's), with ratios
against ``python -c pass`` run by the same interpreter with the same flags. Target: status
within 2x the floor.

"installed" is what users get from a wheel: a fresh virtual environment (no pip, nothing else
in it) holding the ``agents`` package and ``pynvml.py`` as installed files, compiled, and the
console script. ``--editable`` adds this checkout's development install, whose finder runs at
every interpreter start (the floor pays it too). The zipapp runs under ``--python`` (default
the interpreter this environment was made from), with its own GPU_AGENT_HOME.

On a machine without the NVIDIA driver the agent does not import its NVML bindings at all. The
"info" row shows what loading them costs, as on a GPU host (without NVML's own work there): the
zipapp run with a stand-in ``libnvidia-ml.so.1`` that loads but has no NVML functions. It is
printed for information and not counted against the target. The last line is the result as
JSON (bench, figure, ratio: the worst wall ratio, goal, met), for `make bench`; ``--json``
prints every row as JSON instead.

    python bench/agent_status.py [-n 21 | --quick] [--pyz dist/gpu-agent.pyz] [--python PATH]
                                 [--editable] [--breakdown] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 2.0
TIME = "/usr/bin/time"
RSS_RUNS = 5
QUICK_RUNS = 7


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    floor: str | None  # the case this one is compared with
    env: tuple[tuple[str, str], ...] = ()  # added to the environment
    targeted: bool = True  # counted against the target (else printed for information)

    def environ(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, **dict(self.env)}


@dataclass(frozen=True)
class Result:
    name: str
    median_ms: float
    p90_ms: float
    median_cpu_ms: float
    cpu_ratio: float | None
    median_rss_mib: float | None
    time_ratio: float | None
    rss_ratio: float | None
    runs: int


def run_once(argv: tuple[str, ...], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one fresh process; raises if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode(errors="replace")  # until the child closes it
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {stderr}")
    return elapsed, usage.ru_utime + usage.ru_stime


def peak_rss_mib(argv: tuple[str, ...], env: dict[str, str]) -> float | None:
    """Peak RSS in MiB of one fresh process, via /usr/bin/time; None where it is missing."""
    if not os.path.exists(TIME):
        return None
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as out:
        subprocess.run(
            [TIME, "-f", "%M", "-o", out.name, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=tempfile.gettempdir(),
            check=True,
        )
        return int(out.read().strip().splitlines()[-1]) / 1024.0  # KiB


def measure(cases: list[Case], runs: int, env: dict[str, str]) -> list[Result]:
    times: dict[str, list[float]] = {c.name: [] for c in cases}
    cpu: dict[str, list[float]] = {c.name: [] for c in cases}
    rss: dict[str, list[float]] = {c.name: [] for c in cases}
    for case in cases:  # warm the page cache and any bytecode caches
        run_once(case.argv, case.environ(env))
    for i in range(runs):
        for case in cases:
            wall, cpu_s = run_once(case.argv, case.environ(env))
            times[case.name].append(wall)
            cpu[case.name].append(cpu_s)
            if i < RSS_RUNS:
                mib = peak_rss_mib(case.argv, case.environ(env))
                if mib is not None:
                    rss[case.name].append(mib)
    medians = {n: statistics.median(v) for n, v in times.items()}
    cpu_medians = {n: statistics.median(v) for n, v in cpu.items()}
    rss_medians = {n: statistics.median(v) if v else None for n, v in rss.items()}
    results = []
    for case in cases:
        ordered = sorted(times[case.name])
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        mine, floor_rss = rss_medians[case.name], rss_medians.get(case.floor or "")
        results.append(
            Result(
                name=case.name,
                median_ms=medians[case.name] * 1000,
                p90_ms=p90 * 1000,
                median_cpu_ms=cpu_medians[case.name] * 1000,
                cpu_ratio=cpu_medians[case.name] / cpu_medians[case.floor] if case.floor else None,
                median_rss_mib=mine,
                time_ratio=medians[case.name] / medians[case.floor] if case.floor else None,
                rss_ratio=mine / floor_rss if mine and floor_rss else None,
                runs=runs,
            )
        )
    return results


def build_cases(
    python: str, installed: str, pyz: Path, editable: str | None, driver_dir: Path | None
) -> list[Case]:
    cases = [
        Case("floor: venv python -c pass", (installed_python(installed), "-c", "pass"), None),
        Case(
            "installed: gpu-agent status --json",
            (installed, "status", "--json"),
            "floor: venv python -c pass",
        ),
        Case("floor: python3 -I -c pass", (python, "-I", "-c", "pass"), None),
        Case(
            "zipapp: python3 -I gpu-agent.pyz status --json",
            (python, "-I", str(pyz), "status", "--json"),
            "floor: python3 -I -c pass",
        ),
    ]
    if driver_dir is not None:
        cases.append(
            Case(
                "info: zipapp, NVML bindings loaded",
                (python, "-I", str(pyz), "status", "--json"),
                "floor: python3 -I -c pass",
                env=(("LD_LIBRARY_PATH", str(driver_dir)),),
                targeted=False,
            )
        )
    if editable:
        cases += [
            Case(
                "floor: dev venv python -c pass", (installed_python(editable), "-c", "pass"), None
            ),
            Case(
                "editable: gpu-agent status --json",
                (editable, "status", "--json"),
                "floor: dev venv python -c pass",
            ),
        ]
    return cases


def install(python: str, where: Path) -> str:
    """A wheel-like install of the agent into a new virtual environment under ``where``: the
    package's files and pynvml.py in site-packages, compiled as pip does, and the console
    script. Returns the script's path."""
    from agents import zipapp

    venv = where / "venv"
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpython = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(vpython), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    package = ROOT / "agents"
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            target = purelib / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    shutil.copyfile(zipapp.pynvml_source(), purelib / "pynvml.py")
    subprocess.run([str(vpython), "-m", "compileall", "-q", str(purelib)], check=True)
    script = venv / "bin" / "gpu-agent"
    script.write_text(
        f"#!{vpython}\n"
        "import sys\n"
        "from agents.cli import main\n"
        "if __name__ == '__main__':\n"
        "    sys.exit(main())\n",
        encoding="utf-8",
    )
    script.chmod(0o755)
    return str(script)


def stand_in_driver(where: Path) -> Path | None:
    """Where no NVIDIA driver is installed: a directory in which ``libnvidia-ml.so.1`` is a link
    to the C library, so that with it on LD_LIBRARY_PATH the agent loads its NVML bindings as
    on a GPU host (nvmlInit then fails for want of NVML's functions). None where the driver's
    library loads, or without /proc."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return None
    except OSError:
        pass
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = [line.split()[-1] for line in maps if "/libc" in line]
    except OSError:
        return None
    libc = next((p for p in paths if os.path.basename(p).startswith(("libc.so", "libc-"))), None)
    if libc is None:
        return None
    where.mkdir()
    (where / "libnvidia-ml.so.1").symlink_to(libc)
    return where


def installed_python(script: str) -> str:
    """The interpreter named in a console script's shebang."""
    with open(script, encoding="utf-8") as fh:
        first = fh.readline().strip()
    if not first.startswith("#!"):
        return sys.executable
    return first[2:].split()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=21, help="runs per command (default 21)")
    parser.add_argument("--pyz", type=Path, help="zipapp to measure (default: build a fresh one)")
    parser.add_argument(
        "--python",
        default=getattr(sys, "_base_executable", sys.executable),
        help="interpreter for the zipapp and its floor",
    )
    parser.add_argument(
        "--editable",
        action="store_true",
        help="also measure this environment's (editable) gpu-agent console script",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_RUNS} runs each (what `make bench` runs)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--breakdown", action="store_true", help="also print the costliest imports of the zipapp"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = QUICK_RUNS
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/"),
            "GPU_AGENT_HOME": str(Path(tmp) / "agent-home"),
        }
        pyz = args.pyz.resolve() if args.pyz else None
        if pyz is None:
            from agents import zipapp

            pyz = zipapp.build(Path(tmp) / "gpu-agent.pyz")
        base = getattr(sys, "_base_executable", sys.executable)
        installed = install(base, Path(tmp))
        editable = str(Path(sys.executable).with_name("gpu-agent")) if args.editable else None
        driver_dir = stand_in_driver(Path(tmp) / "driver")
        cases = build_cases(args.python, installed, pyz, editable, driver_dir)
        results = measure(cases, args.runs, env)
        imports: list[str] = []
        if args.breakdown and not args.json:
            traced = (args.python, "-X", "importtime", "-I", str(pyz), "status", "--json")
            imports = import_costs(traced, env)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
        return 0
    print(
        f"{'command':<48} {'wall':>8} {'p90':>8} {'CPU':>8} {'peak RSS':>9} "
        f"{'wall x':>6} {'CPU x':>6} {'RSS x':>6}"
    )
    for r in results:
        mib = f"{r.median_rss_mib:.1f}MiB" if r.median_rss_mib else "-"
        print(
            f"{r.name:<48} {r.median_ms:>6.1f}ms {r.p90_ms:>6.1f}ms {r.median_cpu_ms:>6.1f}ms "
            f"{mib:>9} {_ratio(r.time_ratio):>6} {_ratio(r.cpu_ratio):>6} {_ratio(r.rss_ratio):>6}"
        )
    counted = {c.name for c in cases if c.targeted and not c.name.startswith("editable")}
    targeted = [r for r in results if r.name in counted]
    worst = max(r.time_ratio for r in targeted if r.time_ratio)
    worst_cpu = max(r.cpu_ratio for r in targeted if r.cpu_ratio)
    verdict = "within" if worst <= TARGET_RATIO else "OVER"
    if imports:
        print("costliest top-level imports of one zipapp status run (cumulative):")
        print("\n".join(imports))
    print(
        f"{results[0].runs} runs each (medians); worst wall ratio {worst:.2f}, worst CPU ratio "
        f"{worst_cpu:.2f} (installed and zipapp): wall {verdict} the {TARGET_RATIO:.0f}x target"
    )
    result = {
        "bench": "agent_status",
        "figure": "status --json wall / python floor, worst",
        "ratio": round(worst, 3),
        "goal": TARGET_RATIO,
        "better": "lower",
        "met": worst <= TARGET_RATIO,
        "cpu_ratio": round(worst_cpu, 3),
        "runs": results[0].runs,
    }
    print(json.dumps(result))
    return 0


def import_costs(argv: tuple[str, ...], env: dict[str, str], top: int = 10) -> list[str]:
    """The costliest top-level imports of one run (``-X importtime``), as printable lines."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and not parts[2].startswith("  ") and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].strip()))
    return [
        f"  {micros / 1000:7.1f}ms  {name}" for micros, name in sorted(rows, reverse=True)[:top]
    ]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
