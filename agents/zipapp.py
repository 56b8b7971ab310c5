"""Build ``gpu-agent.pyz``: the agent as one file that runs under ``python3 -I``, nothing installed.

``python -m agents.zipapp OUT`` writes a zipapp (stdlib ``zipapp``) holding the ``agents``
package with its data files, nvidia-ml-py's ``pynvml.py`` vendored at the root, and a
``__main__.py`` that runs ``agents.cli.main``; the shebang is ``/usr/bin/env python3``.

The output is deterministic: entries sorted, fixed timestamps and permissions, so its SHA-256
names the version. Unchecked hash-based ``.pyc`` files for the building Python sit next to the
sources; zipimport uses them on that Python version and falls back to the sources elsewhere
(Python 3.9 or newer). Data files must be read with ``pkgutil.get_data``, never via ``__file__``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipapp
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

INTERPRETER = "/usr/bin/env python3"
MAIN = "import sys\n\nfrom agents.cli import main\n\nsys.exit(main())\n"
NVML_DISTRIBUTION = "nvidia-ml-py"
#: DOS timestamps cannot go before 1980.
FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}

# Compiles (source, target, name-in-archive) triples; run with a fixed hash seed.
_COMPILE_SCRIPT = """
import json, py_compile, sys
for src, dst, name in json.load(sys.stdin):
    py_compile.compile(src, cfile=dst, dfile=name, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
"""


class BuildError(Exception):
    """The zipapp could not be built (missing nvidia-ml-py, a file that does not compile)."""


def build(out_path: Path, bytecode: bool = True, package_dir: Optional[Path] = None) -> Path:
    """Write the zipapp to ``out_path`` (parents created, mode 0755) and return its path.

    ``package_dir`` is the ``agents`` directory to pack (default: this package).
    Raises BuildError when nvidia-ml-py is not installed or a source does not compile.
    """
    out_path = Path(out_path)
    entries = collect_entries(package_dir)
    if bytecode:
        entries.update(_compile(entries))
    payload = _zip_bytes(entries)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    zipapp.create_archive(io.BytesIO(payload), tmp, interpreter=INTERPRETER)
    os.chmod(tmp, 0o755)  # noqa: S103 - an executable zipapp, like any program in bin/
    os.replace(tmp, out_path)
    return out_path


def collect_entries(package_dir: Optional[Path] = None) -> Dict[str, bytes]:
    """Archive name -> content: the agents package, pynvml.py and __main__.py."""
    package_dir = Path(package_dir or Path(__file__).resolve().parent)
    entries: Dict[str, bytes] = {}
    for path in sorted(package_dir.rglob("*")):
        rel = path.relative_to(package_dir.parent)
        if not path.is_file() or _skipped(rel):
            continue
        entries[rel.as_posix()] = path.read_bytes()
    entries["pynvml.py"] = pynvml_source().read_bytes()
    entries["__main__.py"] = MAIN.encode()
    return entries


def pynvml_source() -> Path:
    """The installed nvidia-ml-py's pynvml.py (found by distribution, never a look-alike)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(NVML_DISTRIBUTION)
    except metadata.PackageNotFoundError as exc:
        raise BuildError(
            f"{NVML_DISTRIBUTION} is not installed; `pip install nvidia-ml-py` first"
        ) from exc
    path = Path(str(dist.locate_file("pynvml.py")))
    if not path.is_file():
        raise BuildError(f"{NVML_DISTRIBUTION} is installed but {path} is missing")
    return path


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file: the zipapp's version identity."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m agents.zipapp OUT [--no-bytecode]``: build and print the path and SHA-256."""
    parser = argparse.ArgumentParser(prog="python -m agents.zipapp", description=__doc__)
    parser.add_argument("out", type=Path, help="where to write the .pyz")
    parser.add_argument("--no-bytecode", action="store_true", help="sources only, no .pyc")
    args = parser.parse_args(argv)
    try:
        path = build(args.out, bytecode=not args.no_bytecode)
    except BuildError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"{path} sha256={sha256(path)}\n")
    return 0


def _skipped(rel: Path) -> bool:
    return bool(_SKIP_DIRS.intersection(rel.parts)) or rel.suffix in _SKIP_SUFFIXES


def _compile(entries: Dict[str, bytes]) -> Dict[str, bytes]:
    """``name.pyc`` next to every ``name.py``, compiled by this Python with a fixed hash seed."""
    sources = sorted(name for name in entries if name.endswith(".py"))
    with tempfile.TemporaryDirectory(prefix="gpu-agent-build-") as tmp:
        jobs: List[Tuple[str, str, str]] = []
        for i, name in enumerate(sources):
            src = Path(tmp, f"{i}.py")
            src.write_bytes(entries[name])
            jobs.append((str(src), str(Path(tmp, f"{i}.pyc")), name))
        env = dict(os.environ, PYTHONHASHSEED="0")
        import json

        result = subprocess.run(
            [sys.executable, "-I", "-c", _COMPILE_SCRIPT],
            input=json.dumps(jobs),
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(f"compiling the agent failed:\n{result.stderr.strip()}")
        return {name + "c": Path(dst).read_bytes() for _, dst, name in jobs}


def _zip_bytes(entries: Dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so the permissions below are read
            info.external_attr = 0o100644 << 16
            archive.writestr(info, entries[name], compresslevel=9)
    return buffer.getvalue()


if __name__ == "__main__":
    sys.exit(main())
