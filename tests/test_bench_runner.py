"""bench/run_all.py: each bench run for real as a subprocess with --quick, its last line read as
its JSON result, and one table; a bench without a result (no JSON line, a crash, no --quick,
too slow) gets a row saying so instead of stopping the others."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "bench" / "run_all.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run_all = _runner()


def _bench(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import argparse, json, sys, time\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--quick', action='store_true')\n"
        "args = parser.parse_args()\n" + body
    )
    return path


def _result(**fields: object) -> str:
    return f"print({json.dumps(json.dumps(fields))})\n"


def test_the_last_line_is_the_result(tmp_path: Path) -> None:
    path = _bench(
        tmp_path,
        "fast",
        "assert args.quick\nprint('a table')\n"
        + _result(bench="fast", figure="x / y", ratio=1.5, goal=2.0, met=True, extra=3),
    )
    row = run_all.run(path, 60, None)
    assert (row.bench, row.figure, row.ratio, row.goal, row.met) == (
        "fast",
        "x / y",
        1.5,
        2.0,
        True,
    )
    assert (row.goal_text, row.met_text) == ("<= 2x", "yes")


def test_a_higher_is_better_goal_and_a_miss(tmp_path: Path) -> None:
    path = _bench(
        tmp_path,
        "wide",
        _result(bench="wide", figure="f", ratio=8.0, goal=10.0, better="higher", met=False),
    )
    row = run_all.run(path, 60, None)
    assert (row.goal_text, row.met_text) == (">= 10x", "NO")


def test_a_goal_in_words_is_shown_as_given() -> None:
    said = {
        "bench": "ack",
        "ratio": 0.85,
        "goal": "p99 < 100 ms for concurrent signed commands, none late or lost",
        "met": False,
    }
    row = run_all.result_of("ack", "a table\n" + json.dumps(said), 0, 1.0)
    assert (row.ratio, row.met, row.met_text) == (0.85, False, "NO")
    assert row.goal_text == "p99 < 100 ms for concurrent signed co..."
    assert len(row.goal_text) == run_all.GOAL_TEXT_MAX


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("print('a table, no JSON yet')\n", "no result"),
        ('print(\'{"bench": "half"}\')\n', "no result"),
        ("raise SystemExit('broke')\n", "no result (exit 1)"),
        ("", "no result"),
    ],
)
def test_a_bench_without_a_result_gets_a_row_saying_so(
    tmp_path: Path, body: str, says: str
) -> None:
    row = run_all.run(_bench(tmp_path, "old", body), 60, None)
    assert (row.ratio, row.met, row.met_text) == (None, None, says)


def test_a_bench_that_does_not_take_quick_or_runs_too_long(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    assert run_all.run(plain, 60, None).met_text == "no result (exit 2)"
    slow = _bench(tmp_path, "slow", "time.sleep(30)\n")
    row = run_all.run(slow, 1, tmp_path / "logs")
    assert row.met_text == "timed out"


def test_the_table_has_a_row_per_bench_and_a_failed_one_is_not_met(tmp_path: Path) -> None:
    good = run_all.result_of(
        "good", json.dumps({"figure": "f", "ratio": 1.0, "goal": 2, "met": True}), 0, 1.0
    )
    crashed = run_all.result_of(
        "crashed", json.dumps({"figure": "f", "ratio": 1.0, "goal": 2, "met": True}), 1, 1.0
    )
    unfinished = run_all.result_of(
        "unfinished", json.dumps({"figure": "f", "ratio": None, "goal": 2, "met": False}), 0, 1.0
    )
    missing = run_all.result_of("missing", "", 0, 1.0)
    text = run_all.table([good, crashed, unfinished, missing])
    lines = text.splitlines()
    assert lines[0].split() == ["bench", "figure", "ratio", "goal", "met", "seconds"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[-2] == "yes"
    assert lines[3].split()[-2] == "NO"
    assert lines[4].split()[2:4] == ["-", "<="]
    assert lines[4].split()[-2] == "NO"
    assert "no result" in lines[5]


def test_every_bench_in_the_directory_is_run() -> None:
    names = [path.stem for path in run_all.benches()]
    assert "run_all" not in names
    assert {"agent_status", "fleet_status", "poll_capacity", "stall"} <= set(names)
    assert [p.stem for p in run_all.benches(["stall.py"])] == ["stall"]
    with pytest.raises(SystemExit, match="no such bench"):
        run_all.benches(["nothing"])


@pytest.mark.parametrize("name", ["agent_status", "fleet_status", "poll_capacity", "stall"])
def test_these_benches_take_quick_and_end_with_their_result(name: str) -> None:
    text = (ROOT / "bench" / f"{name}.py").read_text()
    assert '"--quick"' in text
    assert "print(json.dumps(result))\n" in text
    for key in ('"bench"', '"figure"', '"ratio"', '"goal"', '"met"'):
        assert key in text
