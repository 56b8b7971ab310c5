"""Build ``gpu-agent.pyz``: the agent as one file that runs under ``python3 -I``, nothing installed.

``python -m agents.zipapp OUT`` writes a zipapp (stdlib ``zipapp``) holding the ``agents``
package with its data files, nvidia-ml-py's ``pynvml.py`` vendored at the root, and a
``__main__.py`` that runs ``agents.cli.main``; the shebang is ``/usr/bin/env python3``.

The output is deterministic: entries sorted, fixed timestamps and permissions, so its SHA-256
names the version. Unchecked hash-based ``.pyc`` files for the building Python sit next to the
sources; zipimport uses them on that Python version. zipimport cannot cache bytecode, so on any
other Python (3.9 or newer) every run would compile the sources again (pynvml alone is 300 kB):
there ``__main__.py`` extracts the archive once into
``$GPU_AGENT_HOME/lib/<build id>-<cache tag>/`` (default ``~/.gpu-agent``) and imports from there,
where Python keeps the bytecode; when that directory cannot be written it runs from the archive.
Data files must be read with ``pkgutil.get_data``, never via ``__file__``.
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
#: The archive's ``__main__.py``; filled in by :func:`main_source`. Python 3.9, stdlib only.
MAIN_TEMPLATE = '''\
"""gpu-agent as one file: runs agents.cli (built by agents/zipapp.py)."""
import sys

#: The Python whose bytecode the archive carries (sys.implementation.cache_tag), "" for none.
BUILT_FOR = {built_for!r}
#: Identifies the archive's sources and names the extraction directory; "" never extracts.
BUILD_ID = {build_id!r}
#: Files extracted for other Pythons.
FILES = {files!r}


def extracted():
    """A directory holding this archive's files for this Python, or None to run from the
    archive (its bytecode fits, it is not a zip, or nothing can be written)."""
    tag = sys.implementation.cache_tag
    archive = getattr(globals().get("__loader__"), "archive", None)
    if not (tag and BUILD_ID) or tag == BUILT_FOR or archive is None or sys.dont_write_bytecode:
        return None
    import os

    home = os.environ.get("GPU_AGENT_HOME") or os.path.join("~", ".gpu-agent")
    target = os.path.join(os.path.expanduser(home), "lib", BUILD_ID + "-" + tag)
    if os.path.isdir(target):
        return target
    temp = "%s.%d.tmp" % (target, os.getpid())
    try:
        for name in FILES:
            path = os.path.join(temp, *name.split("/"))
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "wb") as out:
                out.write(__loader__.get_data(name))
        os.rename(temp, target)
    except OSError:
        remove(temp)
    return target if os.path.isdir(target) else None


def remove(top):
    """Delete a directory tree of our own making, as far as possible."""
    import os

    for root, dirs, files in os.walk(top, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        try:
            os.rmdir(root)
        except OSError:
            pass


where = extracted()
if where is not None:
    sys.path.insert(0, where)

from agents.cli import main  # noqa: E402

sys.exit(main())
'''
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
    tag = (sys.implementation.cache_tag or "") if bytecode else ""
    entries["__main__.py"] = main_source(entries, built_for=tag).encode()
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
    """Archive name -> content: the agents package, pynvml.py and a __main__.py that runs the
    agent in place (:func:`build` writes one that may extract; see :func:`main_source`)."""
    package_dir = Path(package_dir or Path(__file__).resolve().parent)
    entries: Dict[str, bytes] = {}
    for path in sorted(package_dir.rglob("*")):
        rel = path.relative_to(package_dir.parent)
        if not path.is_file() or _skipped(rel):
            continue
        entries[rel.as_posix()] = path.read_bytes()
    entries["pynvml.py"] = pynvml_source().read_bytes()
    entries["__main__.py"] = main_source(entries, built_for="", extract=False).encode()
    return entries


def main_source(entries: Dict[str, bytes], built_for: str, *, extract: bool = True) -> str:
    """``__main__.py`` for an archive of ``entries`` (name -> content; ``.pyc`` files and any
    ``__main__.py`` ignored) whose bytecode is for the cache tag ``built_for`` ("" for none).

    With ``extract`` False the archive always runs in place (no build id is recorded, so
    entries changed afterwards cannot be mistaken for the extracted files of another build).
    """
    files = sorted(n for n in entries if n != "__main__.py" and not n.endswith(".pyc"))
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0")
        digest.update(hashlib.sha256(entries[name]).digest())
    build_id = digest.hexdigest()[:16] if extract else ""
    return MAIN_TEMPLATE.format(built_for=built_for, build_id=build_id, files=files)


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
