"""The README's console walkthroughs, run as written. The Chinese one: every line between the
``console-zh`` markers is typed into `gpubot console` (GPUBOT_LANGUAGE=zh, GPUBOT_CURRENCY=CNY,
a fake RTX 4090), and every reply reads as Chinese, the health checks' findings and hints
too: the agent sends each one's English template and parameters, and the bot translates.
The English one (``console-en``) prints every line the README shows, in its order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chinese import assert_chinese
from tests.fixtures.fake_nvml import build_config, fake_nvml_env

ROOT = Path(__file__).resolve().parents[2]
RTX_4090 = "NVIDIA GeForce RTX 4090"


def walkthrough() -> list[str]:
    """The lines the README's Chinese walkthrough types, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- console-zh -->", 1)[1].split("<!-- /console-zh -->", 1)[0]
    return [line[2:] for line in block.splitlines() if line.startswith("> ")]


def _console_in_chinese(
    script: list[str], config: dict[str, object], tmp_path: Path, zipapp: Path
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Type ``script`` into `gpubot console` in Chinese and yuan, on the fake GPUs of
    ``config``; the finished process and its turns, one per line typed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env |= fake_nvml_env(config, tmp_path)
    env |= {
        "GPUBOT_AGENT_ZIPAPP": str(zipapp),
        "GPUBOT_DATA_DIR": str(tmp_path / "data"),
        "GPUBOT_LANGUAGE": "zh",
        "GPUBOT_CURRENCY": "CNY",
    }
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "console"],
        input="\n".join(script) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    turns = result.stdout.split("console-user> ")[1:]
    assert len(turns) == len(script)
    return result, turns


@pytest.mark.integration
def test_the_readme_walkthrough_in_chinese_runs_as_written(
    tmp_path: Path, fake_gpu_zipapp: Path
) -> None:
    script = walkthrough()
    assert script[0] == "/gpu help"
    config = build_config(1, RTX_4090, per_gpu={0: {"util_gpu": 90}})
    result, turns = _console_in_chinese(script, config, tmp_path, fake_gpu_zipapp)
    for line, turn in zip(script, turns, strict=True):
        reply = turn.removeprefix(line)
        assert reply.strip(), f"no reply to {line!r}"
        assert_chinese(reply)
    by_line: dict[str, str] = {}
    for line, turn in zip(script, turns, strict=True):
        by_line.setdefault(line, turn)  # the first time a line is typed
    assert "1x 4090 · ¥1.98/小时" in by_line["/gpu status"]
    assert re.search(r"剩余 2 小时 (29|30) 分", by_line[":home"])
    assert "¥1.66/小时起" in by_line["/gpu fit 7b inference"]
    assert "已释放，已停止计费" in result.stdout
    assert "还没有实例" in turns[-2]
    assert "简体中文" in turns[-1]


def guides_walk() -> list[str]:
    """The lines of the README's walk through the guides' cases, in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- console-zh-guides -->", 1)[1].split("<!-- /console-zh-guides -->")[0]
    return [line[2:] for line in block.splitlines() if line.startswith("> ")]


@pytest.mark.integration
def test_the_guides_cases_in_chinese_run_as_written(tmp_path: Path, fake_gpu_zipapp: Path) -> None:
    """Another tenant holds GPU 0 (抢显存): `who` names it and the job goes to GPU 1; the job
    runs out of memory and the reply diagnoses it in Chinese; fit follows the guides' figures;
    the hourly-billed instance's warning offers the rest of the hour already paid for."""
    script = guides_walk()
    held: dict[str, object] = {"util_gpu": 97, "memory_used": 20 * 1024**3}
    held["processes"] = [{"pid": 4242, "used_gpu_memory": 20 * 1024**3}]
    config = build_config(2, RTX_4090, per_gpu={0: held})
    _, turns = _console_in_chinese(script, config, tmp_path, fake_gpu_zipapp)
    replies = [turn.removeprefix(line) for line, turn in zip(script, turns, strict=True)]
    for reply in replies:
        # The job's own command and log lines are the person's text, not the bot's.
        assert_chinese("\n".join(x for x in reply.splitlines() if "RuntimeError" not in x))
    registered, who, _queued, done, fit7, fit70, warned = replies
    assert "2x NVIDIA GeForce RTX 4090" in registered
    assert "被 gpubot 以外的程序占用" in who
    assert "pid 4242" in who
    assert "GPU 1 (CUDA_VISIBLE_DEVICES=1)" in done  # not GPU 0, which the other tenant holds
    assert "任务显存不足（`CUDA out of memory`）" in done
    assert "`/gpu fit`" in done
    assert re.search(r"至少需要 \*[5-8]\.\d GiB\*", fit7)  # 7B 4-bit inference: 6-8 GB
    assert "2x *NVIDIA A100 80GB SXM4*" in fit70  # 70B 16-bit inference on 2x80 GB
    assert "2x *NVIDIA H20*" in fit70
    assert "它按整小时计费" in warned
    assert re.search(r"\[\d+ 保留到 \d\d:\d\d（已付）\]", warned)


def walkthrough_en() -> list[str]:
    """The README's English console block: the lines it types (``> ``) and the lines it
    shows, in order (``...`` stands for lines left out)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- console-en -->", 1)[1].split("<!-- /console-en -->", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("```")]


@pytest.mark.integration
def test_the_english_walkthrough_shows_what_the_console_prints(
    tmp_path: Path, fake_gpu_zipapp: Path
) -> None:
    block = walkthrough_en()
    typed = [line[2:] for line in block if line.startswith("> ")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env |= fake_nvml_env(build_config(1, RTX_4090), tmp_path)
    env |= {"GPUBOT_AGENT_ZIPAPP": str(fake_gpu_zipapp), "GPUBOT_DATA_DIR": str(tmp_path / "d")}
    result = subprocess.run(
        [sys.executable, "-m", "bot.cli", "console"],
        input="\n".join(typed) + "\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # Every line the README shows is printed, in the README's order; "..." leaves lines out.
    printed = result.stdout.replace("console-user> ", "> ").splitlines()
    at = 0
    for line in block:
        if line == "...":
            continue
        head = line.split(" ...", 1)[0]
        found = next((i for i in range(at, len(printed)) if printed[i].startswith(head)), None)
        assert found is not None, f"the console never printed {line!r} after line {at}"
        at = found + 1
