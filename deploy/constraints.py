"""Print pins (``name==version``) for gpubot's runtime dependencies as installed here.

`make test` installs with ``-c constraints.txt`` and the image from deploy/requirements.lock,
the same versions with the hash of every file, so two builds get the same bytes. After changing
a dependency in pyproject.toml, install it and regenerate both:

    .venv/bin/pip install -e '.[dev]'
    .venv/bin/python deploy/constraints.py > constraints.txt
    deploy/lock.sh

Only what gpubot needs to run is pinned (its ``dependencies`` and theirs, with the extras they
ask for, on this platform); the test tools are left free. Exits 1 naming a dependency that is
not installed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "gpubot"


def runtime_pins(project: str = PROJECT) -> dict[str, str]:
    """Installed version of every distribution ``project`` needs at run time, by name."""
    pins: dict[str, str] = {}
    wanted: list[tuple[str, frozenset[str]]] = [(project, frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while wanted:
        name, extras = wanted.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        if canonicalize_name(name) != canonicalize_name(project):
            pins[canonicalize_name(dist.metadata["Name"])] = dist.version
        for requirement in _needed(dist.requires or (), extras):
            wanted.append((requirement.name, frozenset(requirement.extras)))
    return pins


def main() -> int:
    try:
        pins = runtime_pins()
    except metadata.PackageNotFoundError as exc:
        print(
            f"constraints: {exc.name} is not installed; run pip install -e '.[dev]'",
            file=sys.stderr,
        )
        return 1
    print(f"# Runtime pins for {PROJECT}, written by deploy/constraints.py (see there).")
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")
    return 0


def _needed(lines: Iterable[str], extras: frozenset[str]) -> Iterable[Requirement]:
    """The requirements that apply here, with ``extras`` of the requiring package asked for."""
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is None:
            yield requirement
            continue
        environments = [{"extra": extra} for extra in extras] or [{"extra": ""}]
        if any(requirement.marker.evaluate(env) for env in environments):
            yield requirement


if __name__ == "__main__":
    sys.exit(main())
