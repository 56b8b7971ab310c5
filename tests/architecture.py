"""The import graph of the shipped packages, read from the source (nothing is imported).

``python -m tests.architecture [ROOT]`` prints each floor's imports of the other floors and any
circles among modules; ``tests/test_architecture.py`` holds the tree to the floors.

Every import counts: top-level, inside functions and under ``TYPE_CHECKING``, because each one
is a dependency a reader has to follow.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "agents")

#: What the bot may import of the agent: the wire protocol and the GPU catalogue they share.
SHARED_WITH_AGENT = ("agents.protocol", "agents.specs")

#: The floors, top to bottom, by module prefix (the longest prefix wins). Arrows point down.
FLOORS: dict[str, tuple[str, ...]] = {
    "surface": (
        "bot.app",
        "bot.check",
        "bot.cli",
        "bot.console",
        "bot.listeners",
        "bot.ack_path",
        "bot.commands",
        "bot.http_server",
        "bot.health",
        "bot.scheduler",
        "bot.replay",
        "bot.local_slack",
        "bot.slack_requests",
        "bot.feishu",
    ),
    "presentation": ("bot.blocks", "bot.charts", "bot.feishu.cards"),
    "services": ("bot.services",),
    "lower": (
        "bot.store",
        "bot.fleet",
        "bot.providers",
        "bot.billing",
        "bot.notify",
        "bot.runtime",
        "bot.slack_notifier",
        "bot.executor",
        "bot.platform_work",
        "bot.metrics",
        "bot.timebox",
        "bot.feishu.client",
    ),
    "values": (
        "bot.values",
        "bot.errors",
        "bot.settings",
        "bot.logging_setup",
        "bot.i18n",
        "bot.text",
        "bot",
    ),
    "agent": ("agents",),
}
ORDER = ("surface", "presentation", "services", "lower", "values")

#: The services' own floors, top to bottom: compositions (the clock's tick, Home, the prompt
#: kinds), then jobs, an instance's life, money, speaking, and access under everything.
SERVICE_FLOORS: dict[str, tuple[str, ...]] = {
    "compositions": ("bot.services.tick", "bot.services.home", "bot.services.prompt_kinds"),
    "jobs": ("bot.services.jobs",),
    "instances": ("bot.services.instances",),
    "money": ("bot.services.money",),
    "speaking": ("bot.services.speaking",),
    "access": ("bot.services.access", "bot.services"),
}
SERVICE_ORDER = tuple(SERVICE_FLOORS)


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` of the source's file."""

    source: str
    target: str
    line: int


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the shipped packages by dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def edges(root: Path = ROOT) -> list[Edge]:
    """Every module that one shipped module imports (once per pair, at its first import)."""
    known = modules(root)
    found: dict[tuple[str, str], Edge] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for target in _targets(node, package, known):
                if target != name and (name, target) not in found:
                    found[(name, target)] = Edge(name, target, getattr(node, "lineno", 0))
    return sorted(found.values(), key=lambda e: (e.source, e.line, e.target))


def floor_of(module: str) -> str:
    """The floor a module stands on (by the longest matching prefix)."""
    return _longest_prefix(module, FLOORS, "values")


def service_floor_of(module: str) -> str | None:
    """The services' floor a module of bot.services stands on; None outside bot.services."""
    if not module.startswith("bot.services"):
        return None
    return _longest_prefix(module, SERVICE_FLOORS, "access")


def upward_in_services(found: Iterable[Edge]) -> list[Edge]:
    """Imports between modules of bot.services that point up the services' floors."""
    wrong: list[Edge] = []
    for edge in found:
        source, target = service_floor_of(edge.source), service_floor_of(edge.target)
        if source is None or target is None:
            continue
        if SERVICE_ORDER.index(target) < SERVICE_ORDER.index(source):
            wrong.append(edge)
    return wrong


def _longest_prefix(module: str, floors: dict[str, tuple[str, ...]], default: str) -> str:
    best, best_len = default, -1
    for floor, prefixes in floors.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = floor, len(prefix)
    return best


def upward(found: Iterable[Edge]) -> list[Edge]:
    """Imports that point up a floor, from the agent into the bot, or from the bot into the
    agent beyond what they share."""
    wrong: list[Edge] = []
    for edge in found:
        source, target = floor_of(edge.source), floor_of(edge.target)
        if (source == "agent") != (target == "agent"):
            if source == "agent" or edge.target not in SHARED_WITH_AGENT:
                wrong.append(edge)
            continue
        if source != "agent" and ORDER.index(target) < ORDER.index(source):
            wrong.append(edge)
    return wrong


def cycles(found: Iterable[Edge]) -> list[list[str]]:
    """The import circles: strongly connected groups of two or more modules, each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in found:
        graph[edge.source].add(edge.target)
    return sorted(sorted(group) for group in _components(graph) if len(group) > 1)


def floor_matrix(found: Iterable[Edge]) -> dict[tuple[str, str], int]:
    """How many module imports go from each floor to each other floor."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for edge in found:
        source, target = floor_of(edge.source), floor_of(edge.target)
        if source != target:
            counts[(source, target)] += 1
    return dict(counts)


def report(root: Path = ROOT) -> str:
    """The floor-to-floor import counts, the upward imports and the circles, as text."""
    found = edges(root)
    lines = ["imports between floors (module imports, from -> to: count):"]
    for (source, target), count in sorted(floor_matrix(found).items()):
        lines.append(f"  {source} -> {target}: {count}")
    wrong = upward(found)
    lines.append(f"upward imports: {len(wrong)}")
    lines.extend(f"  {e.source} -> {e.target} (line {e.line})" for e in wrong)
    circles = cycles(found)
    lines.append(f"import circles: {len(circles)}")
    lines.extend("  " + " <-> ".join(group) for group in circles)
    return "\n".join(lines)


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield from _resolve(alias.name, known)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parent = parts[: len(parts) - node.level + 1]
            base = ".".join([*parent, base] if base else parent)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in known:
                yield submodule
            else:
                yield from _resolve(base, known)


def _resolve(name: str, known: dict[str, Path]) -> Iterator[str]:
    while name and name not in known:
        name = name.rpartition(".")[0]
    if name:
        yield name


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group: list[str] = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    groups.append(group)
                continue
            if child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


if __name__ == "__main__":
    print(report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT))
