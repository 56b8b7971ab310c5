"""The console: lines in, readable chat out, through the real app and the local Slack stand-in."""

from __future__ import annotations

import argparse
import io
import os
import re
import sqlite3
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.commands.forms import FormOutcome
from bot.commands.registry import ActionSpec, CommandSpec, Registry, Reply
from bot.console import Console, Speaker, tick_steps
from bot.listeners import Forms
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.settings import Settings
from tests.chinese import assert_chinese
from tests.fixtures.cli_process import run_cli
from tests.fixtures.fake_nvml import build_config, fake_nvml_env
from tests.fixtures.instances import A100_80

ROOT = Path(__file__).resolve().parents[2]


def _rest(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rest", nargs="*")


def _card(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "box-1"}},
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": "Owner <@UALICE>, see <https://x.test/docs|the docs>",
            },
            "fields": [
                {"type": "mrkdwn", "text": "*GPUs*\n8x H100"},
                {"type": "mrkdwn", "text": "*Cost*\n$12.00"},
            ],
        },
        {"type": "divider"},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": "deadline in 2h"}]},
        {
            "type": "actions",
            "block_id": "card",
            "elements": [
                {
                    "type": "button",
                    "action_id": "card_keep",
                    "text": {"type": "plain_text", "text": "Keep"},
                    "value": "7",
                },
                {
                    "type": "button",
                    "action_id": "card_release",
                    "text": {"type": "plain_text", "text": "Release"},
                    "value": "7",
                    "style": "danger",
                    "confirm": {
                        "title": {"type": "plain_text", "text": "Release box-1?"},
                        "text": {"type": "plain_text", "text": "The meter stops."},
                        "confirm": {"type": "plain_text", "text": "Release"},
                        "deny": {"type": "plain_text", "text": "Cancel"},
                    },
                },
            ],
        },
    ]
    return Reply(text="box-1 card", blocks=tuple(blocks))


def _release(rt: Runtime, caller: Caller, value: str) -> Reply:
    return Reply(text=f"Released {value} by {caller.user_name}", replace_original=True)


def _whoami(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    return Reply(text=f"you are {caller.user_id} {caller.user_name} in {caller.channel_id}")


def _ping(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    rt.notifier.post(caller.user_id, "psst, a DM")
    assert rt.settings.channel is not None
    rt.notifier.post(rt.settings.channel, "hello ops")
    rt.notifier.upload_file(rt.settings.channel, "spend.csv", b"a,b\n1,2\n", title="Spend")
    return Reply(text="pinged")


def _slow(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    threading.Event().wait(0.3)
    return Reply(text="slow but here")


def _registry() -> Registry:
    registry = Registry()
    for name, handler in (("card", _card), ("whoami", _whoami), ("ping", _ping), ("slow", _slow)):
        registry.command(CommandSpec(name, name, f"/gpu {name}", (), _rest, handler))
    registry.action(ActionSpec("card_keep", lambda rt, caller, value: Reply(text="kept")))
    registry.action(ActionSpec("card_release", _release))
    return registry


def _chat(
    tmp_path: Path,
    lines: list[str],
    *,
    user: str = "console-user",
    registry: Registry | None = None,
    real: bool = False,
    forms: Forms | None = None,
) -> str:
    """The transcript of ``lines`` typed into a console with the test's commands (``real``:
    the bot's own commands)."""
    out = io.StringIO()
    console = Console(
        Settings(data_dir=tmp_path / "data"),
        out=out,
        user=user,
        registry=None if real else (registry or _registry()),
        forms=forms,
    )
    try:
        console.start(clock=False)
        assert console.run(lines, echo=True) == 0
    finally:
        console.close()
    return out.getvalue()


def test_blocks_print_as_text_and_buttons_are_numbered(tmp_path: Path) -> None:
    script = [":as alice", "/gpu card", "card", "click 4", "y", "click 1", "click 99"]
    out = _chat(tmp_path, script)
    assert "== box-1 ==" in out
    assert "Owner @alice, see the docs (https://x.test/docs)" in out
    assert "*GPUs* 8x H100" in out
    assert "deadline in 2h" in out
    assert "[1 Keep]  [2 Release]" in out
    assert "[3 Keep]  [4 Release]" in out
    assert "Release box-1?: confirmed." in out
    assert "(updated)\n  Released 7 by alice" in out
    assert "\n  kept" in out
    assert "There is no button 99" in out


def test_a_button_that_asks_first_is_pressed_only_on_yes(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["card", "click 2", "n", "click 2", "no", "click 2", "是"])
    assert "== Release box-1? ==" in out
    assert "The meter stops." in out
    assert "Type y for [Release], anything else for [Cancel]:" in out
    assert out.count("Not pressed; nothing was done.") == 2
    assert out.count("Released 7 by console-user") == 1


def test_as_switches_who_speaks(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["whoami", ":as bob", "whoami", ":as U123ABC", "/gpu whoami"])
    assert "you are UCONSOLEUSER console-user in C0CONSOLE" in out
    assert "you are UBOB bob in C0CONSOLE" in out
    assert "you are U123ABC u123abc in C0CONSOLE" in out
    assert "bob> whoami" in out


def test_messages_the_bot_sends_first_are_printed(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["ping"])
    assert "gpubot [DM to console-user]\n  psst, a DM" in out
    assert "gpubot [#console]\n  hello ops" in out
    assert "shared a file: Spend" in out
    saved = list((tmp_path / "data" / "console-files").glob("*-spend.csv"))
    assert [p.read_bytes() for p in saved] == [b"a,b\n1,2\n"]
    assert "pinged" in out


def test_each_reply_arrives_before_the_next_line(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["slow", "whoami"])
    assert out.index("slow but here") < out.index("you are UCONSOLEUSER")


def test_console_commands_and_mistakes(tmp_path: Path) -> None:
    out = _chat(
        tmp_path, [":help", ":nope", ":as", "/deploy now", "", "# a comment", ":quit", "whoami"]
    )
    assert "click N" in out
    assert "Say who: `:as alice`" in out
    assert "Unknown console command `:nope`" in out
    assert "Only /gpu is a command here; `/deploy` is not." in out
    assert "you are" not in out


class _ThingForm:
    """A form of the test's own: a name, a GPU to choose and a count with a default."""

    def forms(self) -> Forms:
        return Forms(
            callback_ids=frozenset({"thing_form"}),
            form_for_command=lambda text: "thing_form" if text == "thing" else None,
            form_view=self.view,
            submit_form=self.submit,
        )

    def view(self, rt: Runtime, caller: Caller, callback_id: str) -> dict[str, Any]:
        def text_input(block_id: str, label: str, **extra: Any) -> dict[str, Any]:
            return {
                "type": "input",
                "block_id": block_id,
                "label": {"type": "plain_text", "text": label},
                "element": {"type": "plain_text_input", "action_id": "value", **extra},
            }

        options = [
            {"text": {"type": "plain_text", "text": name}, "value": name.lower()}
            for name in ("A100", "H100")
        ]
        name = text_input("name", "Name", placeholder={"type": "plain_text", "text": "box1"})
        name["hint"] = {"type": "plain_text", "text": "Lowercase letters and digits."}
        count = text_input("count", "Count", initial_value="1")
        count["optional"] = True
        return {
            "type": "modal",
            "callback_id": callback_id,
            "title": {"type": "plain_text", "text": "A thing"},
            "submit": {"type": "plain_text", "text": "Make it"},
            "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": "Tell me about it."}},
                name,
                {
                    "type": "input",
                    "block_id": "gpu",
                    "label": {"type": "plain_text", "text": "GPU"},
                    "element": {"type": "static_select", "action_id": "value", "options": options},
                },
                count,
            ],
        }

    def submit(self, rt: Runtime, caller: Caller, callback_id: str, values: Any) -> FormOutcome:
        name = values["name"]["value"]["value"]
        gpu = values["gpu"]["value"]["selected_option"]["value"]
        count = values["count"]["value"]["value"]
        if not name:
            return FormOutcome(errors={"name": "Give it a name."})
        return FormOutcome(reply=Reply(text=f"Made {name}: {count}x {gpu}"))


def test_a_form_is_filled_in_from_the_next_lines_and_asks_again_where_wrong(
    tmp_path: Path,
) -> None:
    script = ["thing", "", "tpu", "2", "", "box1", "whoami"]
    out = _chat(tmp_path, script, forms=_ThingForm().forms())
    form = out.split("console-user> thing", 1)[1]
    assert "gpubot [form] A thing" in form
    assert "Tell me about it." in form
    assert "* Name\n      Lowercase letters and digits.\n      for example: box1" in form
    assert "choices: 1) A100  2) H100" in form
    assert "* Count (optional)\n      default: 1" in form
    assert "That is none of the choices" in form
    assert "Name: ⚠️ Give it a name." in form
    again = form.split("fill those fields in again:", 1)[1]
    assert "  Name:\n" in again  # asked again, the others not
    assert "  GPU:\n" not in again
    # The answer comes where the command was typed, not as a direct message.
    assert "gpubot [only console-user sees this]\n  Made box1: 1x h100" in form
    assert "[DM to console-user]" not in form
    assert "you are UCONSOLEUSER" in out.split("console-user> whoami", 1)[1]


def test_the_register_form_is_printed_and_unsent_when_the_input_ends(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["/gpu register"], real=True)
    assert "gpubot [form] Register an instance" in out
    assert "* Name" in out
    assert "choices: 1) " in out
    assert "The form was not sent." in out


@pytest.mark.parametrize("word", ["cancel", "取消", "CANCEL"])
def test_a_form_is_left_unsent_by_cancel_and_the_console_goes_on(tmp_path: Path, word: str) -> None:
    out = _chat(tmp_path, ["thing", "box1", word, "whoami"], forms=_ThingForm().forms())
    form, after = out.split("console-user> thing", 1)[1].split("console-user> whoami", 1)
    assert "The form was cancelled; nothing was sent." in form
    assert "Made box1" not in out
    assert "you are UCONSOLEUSER" in after


def test_the_real_register_form_cancelled_in_chinese_registers_nothing(tmp_path: Path) -> None:
    out = _chat(
        tmp_path, ["/gpu lang zh", "/gpu register", "gpu-z", "取消", "/gpu list"], real=True
    )
    form, listed = out.split("console-user> /gpu register", 1)[1].split("console-user> /gpu list")
    assert "表单已取消，什么也没有提交。" in form  # noqa: RUF001
    assert "gpu-z" not in listed
    assert "local" in listed


def test_home_prints_the_home_tab_and_release_asks_first(tmp_path: Path) -> None:
    script = [":home", "click 2", "n", "click 2", "y", ":home"]
    out = _chat(tmp_path, script, real=True)
    home, refused, asked, _click, released, again = out.split("console-user> ")[1:]
    assert "gpubot [Home tab of console-user]" in home
    assert "== Your GPUs ==" in home
    assert "*local*" in home
    assert "[1 Extend 1h]  [2 Release]" in home
    assert "[3 Register an instance]" in home
    assert "== Release local? ==" in refused
    assert "Not pressed; nothing was done." in asked
    assert "[DM to console-user]" not in asked
    assert "Release local?: confirmed." in released
    assert "[DM to console-user]" in released
    assert "gpubot [Home tab of console-user]" in again


def test_the_console_speaks_the_language_of_who_types(tmp_path: Path) -> None:
    out = _chat(tmp_path, ["/gpu lang zh", ":help", ":nope", ":home"], real=True)
    after = out.split("console-user> :help", 1)[1]
    help_text = after.split("console-user> :nope", 1)[0]
    assert "控制台命令" in help_text
    assert_chinese(help_text)
    assert "未知的控制台命令 `:nope`" in after
    home = after.split("console-user> :home", 1)[1]
    assert "[console-user 的主页标签]" in home
    assert "我的 GPU 实例" in home
    assert_chinese(home)


def test_speaker_ids_look_like_slack_ids() -> None:
    assert Speaker.named("alice") == Speaker("alice", "UALICE")
    assert Speaker.named("@Ann-Marie") == Speaker("Ann-Marie", "UANNMARIE")
    assert Speaker.named("W0ADMIN") == Speaker("w0admin", "W0ADMIN")


# --- the real thing, as `make run` starts it ----------------------------------------------------


def _run_cli(
    tmp_path: Path,
    script: str,
    *args: str,
    extra_env: dict[str, str] | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -m bot.cli ARGS` with ``script`` as its input: forked from a warm interpreter
    (tests/fixtures/cli_process.py), or ``fresh``, as `make run` starts it."""
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("SLACK_", "GPUBOT_"))
    }
    env["GPUBOT_DATA_DIR"] = str(tmp_path / "data")
    env.update(extra_env or {})
    if not fresh:
        return run_cli(list(args), env=env, stdin=script)
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        input=script,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=180,
        check=False,
    )


def _store(tmp_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(tmp_path / "data" / "gpubot.sqlite3") as conn:
        tables = [
            row[0]
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if row[0] != "alembic_version"
        ]
        return {
            t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables
        }


@pytest.mark.integration
def test_piped_help_and_status(tmp_path: Path) -> None:
    result = _run_cli(tmp_path, "/gpu help\n/gpu status\n", "console")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "console-user> /gpu help" in out
    assert "== gpubot: the /gpu commands ==" in out
    for name in ("register", "status", "list", "health", "extend", "release"):
        assert f"`/gpu {name}`" in out
    status = out.split("console-user> /gpu status", 1)[1]
    assert "*local*" in status
    assert "Unknown command" not in status
    assert "❌" not in status


@pytest.mark.integration
def test_register_status_and_manual_release_of_local_with_its_gpus(
    tmp_path: Path, fake_gpu_zipapp: Path
) -> None:
    config = build_config(2, A100_80, per_gpu={0: {"util_gpu": 96}})
    env = fake_nvml_env(config, tmp_path) | {"GPUBOT_AGENT_ZIPAPP": str(fake_gpu_zipapp)}
    script = [
        "/gpu register local local --gpu h100 --count 4 --price 2.10/h --release-in 3h",
        "/gpu status",
        "/gpu release local",
        "click 1",
        "y",
        "click 3",
        "y",
        "/gpu status",
    ]
    result = _run_cli(tmp_path, "\n".join(script) + "\n", "console", extra_env=env)
    assert result.returncode == 0, result.stderr
    turns = result.stdout.split("console-user> ")[1:]
    assert len(turns) == len(script)
    register, status, ask, _asks, confirm, _asks_again, released, after = turns
    # The mismatch is said once, in the reply (the ops channel is the console's own channel).
    assert "[DM to console-user]" not in register
    assert register.count("GPU mismatch on local") == 1
    assert "fewer cards: 2 delivered, 4 rented" in register
    assert "util 48% (per GPU 96%, 0%)" in status
    assert "mem 0/160 GiB" in status
    assert "[1 Yes, release local]" in ask
    assert "[3 Released on the platform]" in confirm
    assert "the meter runs until then" in confirm
    assert "is released. The meter stopped." in released
    assert "No instances yet" in after
    store = _store(tmp_path)
    [release] = store["release"]
    assert "confirmed" in release


@pytest.mark.integration
def test_piped_lines_fill_in_the_register_form_of_local(
    tmp_path: Path, fake_gpu_zipapp: Path
) -> None:
    config = build_config(2, A100_80)
    env = fake_nvml_env(config, tmp_path) | {"GPUBOT_AGENT_ZIPAPP": str(fake_gpu_zipapp)}
    # name, address, GPU (choice 9: A100 80GB SXM4), count, price, deadline, then the optional
    # fields left empty; the price is asked again.
    fields = ["local", "local", "9", "2", "cheap", "3h", *[""] * 9, "2.10/h"]
    script = ["/gpu register", *fields, "/gpu status"]
    result = _run_cli(tmp_path, "\n".join(script) + "\n", "console", extra_env=env)
    assert result.returncode == 0, result.stderr
    form, status = result.stdout.split("console-user> /gpu status")
    assert "gpubot [form] Register an instance" in form
    assert "Price of the instance: ⚠️" in form
    answer = form.split("fill those fields in again:", 1)[1]
    # The registration answers in the channel where `/gpu register` was typed.
    assert "gpubot [#console]\n  == Re-registered local ==" in answer
    assert "[DM to console-user]" not in answer
    assert "local" in answer
    assert "GPU mismatch" not in answer
    assert "*local*" in status
    [instance] = [row for row in _store(tmp_path)["instance"] if "released" not in row]
    assert 2_100_000 in instance


@pytest.mark.integration
def test_no_arguments_and_no_tokens_open_the_console(tmp_path: Path) -> None:
    result = _run_cli(tmp_path, "help\n", fresh=True)
    assert result.returncode == 0, result.stderr
    assert "gpubot console" in result.stdout
    assert "== gpubot: the /gpu commands ==" in result.stdout


@pytest.mark.integration
def test_bad_input_in_the_console_changes_nothing(tmp_path: Path) -> None:
    first = _run_cli(tmp_path, "/gpu list\n", "console")
    assert first.returncode == 0, first.stderr
    before = _store(tmp_path)
    assert before["instance"], "the console registers `local`"
    script = "\n".join(
        [
            "/gpu extend local",
            "/gpu extend local soon",
            "/gpu extend nosuch 2h",
            "/gpu release nosuch",
            "/gpu register box",
            "/gpu register 'box",
            "/gpu health",
            ":as mallory",
            "/gpu extend local 2h",
            "/gpu release local",
        ]
    )
    result = _run_cli(tmp_path, script + "\n", "console")
    assert result.returncode == 0, result.stderr
    replies = result.stdout.split("> /gpu ")[1:]
    assert len(replies) == 9
    for reply in replies:
        assert "⚠️" in reply, reply
        assert "❌" not in reply, reply
    after = _store(tmp_path)
    # Only who used the bot is remembered (so `@mallory` finds her); nothing else changed.
    people = {row[:2] for row in after.pop("person")} - {row[:2] for row in before.pop("person")}
    assert people == {("UMALLORY", "mallory")}
    # bot.replay's record of each signed request the console's Slack stand-in carried.
    after.pop("seen_signature", None)
    before.pop("seen_signature", None)
    assert after == before


def test_every_emoji_the_bot_writes_prints_as_a_symbol() -> None:
    import ast
    import re

    from bot import console

    code = re.compile(r"(?<![\w:/]):[a-z][a-z0-9_+-]*:(?![`\w])")
    used: set[str] = set()
    root = Path(console.__file__).parent
    for path in root.rglob("*.py"):
        if "store" in path.relative_to(root).parts:
            continue  # SQLite's ":memory:" is no emoji
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                used.update(code.findall(node.value))
    assert used, "expected the bot's messages to use some emoji codes"
    missing = sorted(used - set(console._EMOJI))
    assert missing == []


@pytest.mark.integration
def test_tick_moves_the_clock_and_warns_before_the_deadline(tmp_path: Path) -> None:
    script = "/gpu extend local 40m\n:tick\n:tick 15m\n:tick 5x\n"
    result = _run_cli(tmp_path, script, "console")
    assert result.returncode == 0, result.stderr
    first, rest = result.stdout.split("console-user> :tick 15m", 1)
    assert "will be released in" not in first
    assert "the console's clock is 0s ahead" in first
    # The time as every message shows one (weekday, date, time, zone), not an ISO stamp.
    assert re.search(r"ticked at \w{3} \d{2} \w{3} \d{2}:\d{2} UTC \(", first), first
    warned, bad = rest.split("console-user> :tick 5x", 1)
    assert "*local* will be released in" in warned
    assert "Extend 1h]" in warned
    assert "Release now]" in warned
    assert "the console's clock is 15m ahead" in warned
    assert "'5x' is not a duration" in bad


@pytest.mark.integration
def test_tick_over_hours_polls_each_step_and_the_idle_prompt_comes(
    tmp_path: Path, fake_gpu_zipapp: Path
) -> None:
    config = build_config(2, A100_80)  # both GPUs at rest: `local` is idle
    env = fake_nvml_env(config, tmp_path) | {"GPUBOT_AGENT_ZIPAPP": str(fake_gpu_zipapp)}
    result = _run_cli(tmp_path, ":tick\n:tick 2h\n", "console", extra_env=env)
    assert result.returncode == 0, result.stderr
    first, later = result.stdout.split("console-user> :tick 2h", 1)
    assert "has been idle" not in first
    assert "*local* has been idle for" in later
    assert "[DM to console-user]" in later
    assert "120 ticks, the console's clock is 2h ahead" in later


def test_tick_steps_cut_a_long_move_into_poll_intervals() -> None:
    minute = timedelta(minutes=1)
    assert tick_steps(timedelta(0), minute) == [timedelta(0)]
    assert tick_steps(timedelta(seconds=150), minute) == [minute, minute, timedelta(seconds=30)]
    assert len(tick_steps(timedelta(hours=2), minute)) == 120


@pytest.mark.integration
def test_tick_lets_a_short_job_on_local_end_before_the_clock_moves(
    tmp_path: Path, fake_gpu_zipapp: Path
) -> None:
    """A job runs on the real clock while `:tick 2m` moves the console's: the tick first
    gives it its real seconds (at most the move, at most 10 s), so a two-second job's reply
    comes in that tick's turn, and a job longer than the move is still running after it."""
    env = fake_nvml_env(build_config(1, A100_80), tmp_path)
    env |= {"GPUBOT_AGENT_ZIPAPP": str(fake_gpu_zipapp)}
    script = [
        "/gpu run local -- python3 -c \"import time; time.sleep(2); print('short done')\"",
        ":tick 2m",
        "/gpu run local -- sleep 30",
        ":tick 1s",
        "/gpu jobs local",
    ]
    result = _run_cli(tmp_path, "\n".join(script) + "\n", "console", extra_env=env)
    assert result.returncode == 0, result.stderr
    turns = result.stdout.split("console-user> ")[1:]
    assert len(turns) == len(script)
    _started, ticked, _long, ticked_again, jobs = turns
    assert "short done" in ticked, ticked
    assert "the console's clock is 2m ahead" in ticked
    assert "sleep 30" not in ticked_again
    assert "`1` succeeded" in jobs
    assert "`2` running" in jobs, jobs
