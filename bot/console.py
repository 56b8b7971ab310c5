"""`gpubot console`: a local chat with the bot, through the real Bolt app and the same services.

Each typed line becomes a correctly signed slash command (or, with ``click N``, a button click)
dispatched into the app; the app's Web API client and the response URLs point at an in-process
stand-in of Slack (bot.local_slack) whose messages are printed here as readable text. This
machine is registered as the instance ``local``. Piped input is read to its end, waiting for
every pending reply before exiting.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from slack_bolt import App, BoltRequest

from bot.app import BotExecutor, build_app, build_runtime, start_clock
from bot.commands.registry import Registry
from bot.errors import GpubotError, UsageError
from bot.local_slack import (
    Event,
    LocalSlack,
    Message,
    SharedFile,
    block_actions_body,
    signed_headers,
    slash_command_body,
)
from bot.runtime import Runtime
from bot.scheduler import SchedulerHandle
from bot.services.registration import ensure_local_instance
from bot.services.tick import tick
from bot.settings import Settings
from bot.store.models import utcnow
from bot.values import format_duration, parse_duration

log = logging.getLogger(__name__)

#: Only the in-process stand-in accepts this token.
CONSOLE_TOKEN = "xoxb-console"
CONSOLE_CHANNEL = "C0CONSOLE"
DEFAULT_USER = "console-user"
#: How long to wait for the replies to one line before moving on, in seconds.
REPLY_WAIT_S = 900.0

CONSOLE_HELP = """\
Console commands:
  /gpu COMMAND ...   a slash command (the `/gpu` may be left out: `status` works too)
  click N            press button N (buttons are numbered across the session)
  :as USER           speak as another user (a name like alice, or a Slack ID like U123)
  :tick [DURATION]   move the console's clock forward (e.g. `:tick 2h`) one poll interval at a
                     time, running a tick of the scheduler at each step (polls, idle prompts,
                     deadline warnings, releases, jobs, digests), as the bot would while it ran;
                     `:tick` alone runs one tick now
  :help              this text;  `/gpu help` lists the bot's commands
  :quit              leave (so does the end of piped input, or Ctrl-D)"""


@dataclass(frozen=True)
class Button:
    """A numbered button the console printed."""

    number: int
    action_id: str
    value: str
    label: str
    block_id: str
    message: Message
    confirm: str | None


@dataclass(frozen=True)
class Speaker:
    """Who is typing: a display name and the Slack-style user ID derived from it."""

    name: str
    user_id: str

    @classmethod
    def named(cls, name: str) -> Speaker:
        """``alice`` speaks as ``UALICE``; a name that looks like a Slack ID is used as is."""
        cleaned = name.strip().lstrip("@")
        if re.fullmatch(r"[UW][A-Z0-9]{2,}", cleaned):
            return cls(cleaned.lower(), cleaned)
        ident = re.sub(r"[^A-Z0-9]", "", cleaned.upper())[:20] or "ANON"
        return cls(cleaned or "anon", "U" + ident)


def run_console(
    settings: Settings,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    user: str = DEFAULT_USER,
    clock: bool | None = None,
) -> int:
    """Run the console until the input ends or ``:quit``; returns the exit status.

    ``clock`` runs the scheduler (deadline warnings, polling); by default only when the input
    is a terminal, so a piped script sees the answers to its own lines only.
    """
    source = stdin if stdin is not None else sys.stdin
    out = stdout if stdout is not None else sys.stdout
    interactive = source.isatty()
    console = Console(settings, out=out, user=user, color=out.isatty())
    try:
        console.start(clock=interactive if clock is None else clock)
        console.banner()
        return console.run(_lines(source, interactive), echo=not interactive)
    finally:
        console.close()


class Console:
    """The chat loop: the stand-in, the app, the printer and who is speaking."""

    def __init__(
        self,
        settings: Settings,
        *,
        out: TextIO,
        user: str = DEFAULT_USER,
        color: bool = False,
        registry: Registry | None = None,
    ) -> None:
        self.out = out
        self.registry = registry
        self.speaker = Speaker.named(user)
        self.printer = Printer(out, color=color)
        self.slack = LocalSlack(
            token=CONSOLE_TOKEN,
            channels={CONSOLE_CHANNEL: "console"},
            on_event=self.printer.show,
        )
        self.printer.names = self._display_name
        self._secret = secrets.token_hex(16)
        self._base_settings = settings
        self.settings = settings
        self.runtime: Runtime | None = None
        self.app: App | None = None
        self._clock: SchedulerHandle | None = None
        self._ahead = timedelta(0)
        self._real_clock: Callable[[], datetime] = utcnow

    def start(self, *, clock: bool = False) -> None:
        """Start the stand-in, build the runtime and the app, register `local`."""
        self.slack.start()
        base = self._base_settings
        channel = base.channel or CONSOLE_CHANNEL
        if channel != CONSOLE_CHANNEL:
            self.slack.add_channel(channel, "ops")
        self.settings = base.with_(
            slack_bot_token=CONSOLE_TOKEN,
            slack_app_token=None,
            slack_signing_secret=self._secret,
            slack_api_url=self.slack.api_url,
            channel=channel,
        )
        self.printer.files_dir = self.settings.data_dir / "console-files"
        self.runtime = build_runtime(self.settings, console=True)
        self._real_clock = self.runtime.clock
        self.runtime.clock = self._now
        self.app = build_app(self.settings, runtime=self.runtime, registry=self.registry)
        self._meet(self.speaker)
        try:
            ensure_local_instance(self.runtime, self.speaker.user_id)
        except GpubotError as exc:
            self.printer.note(f"could not register this machine as `local`: {exc.user_text()}")
        if clock:
            self._clock = start_clock(self.runtime)

    def banner(self) -> None:
        """The first lines: who you are and how to get help."""
        self.printer.note(
            f"gpubot console: you are {self.speaker.name} ({self.speaker.user_id}), owner of "
            "the instance `local` (this machine). Type /gpu help, or :help for the console."
        )

    def run(self, lines: Iterable[str], *, echo: bool = False) -> int:
        """Handle lines until they end or ``:quit``; returns 0."""
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if echo:
                self.printer.echo(self.speaker.name, line)
            if line in (":quit", ":q", ":exit"):
                break
            self.handle(line)
        self.wait()
        return 0

    def handle(self, line: str) -> None:
        """One line: a console command, a click, or a `/gpu` command."""
        if line.startswith(":"):
            self._console_command(line)
        elif re.fullmatch(r"click\s+\S+", line, flags=re.IGNORECASE):
            self.click(line.split()[1])
        elif line.startswith("/") and not re.match(r"/gpu(\s|$)", line):
            self.printer.note(f"Only /gpu is a command here; `{line.split()[0]}` is not.")
        else:
            self.command(re.sub(r"^/gpu\b", "", line).strip())
        self.wait()

    def command(self, text: str) -> None:
        """Send `/gpu TEXT` as a signed slash command from the current speaker."""
        speaker = self.speaker
        body = slash_command_body(
            text=text,
            user_id=speaker.user_id,
            user_name=speaker.name,
            channel_id=CONSOLE_CHANNEL,
            channel_name="console",
            response_url=self.slack.response_url(CONSOLE_CHANNEL, speaker.user_id),
        )
        self._dispatch(body)

    def click(self, which: str) -> None:
        """Press button number ``which`` as the current speaker."""
        button = self.printer.button(which)
        if button is None:
            self.printer.note(f"There is no button {which}; buttons show as [N label].")
            return
        if button.confirm:
            self.printer.note(f"{button.confirm}: confirmed.")
        message = button.message
        speaker = self.speaker
        body = block_actions_body(
            action_id=button.action_id,
            value=button.value,
            user_id=speaker.user_id,
            user_name=speaker.name,
            channel_id=message.channel,
            response_url=self.slack.response_url(
                message.channel, speaker.user_id, message_ts=message.ts
            ),
            block_id=button.block_id,
            label=button.label,
            message_ts=message.ts,
            message={"ts": message.ts, "text": message.text, "blocks": list(message.blocks)},
            ephemeral=message.ephemeral,
        )
        self._dispatch(body)

    def wait(self) -> None:
        """Wait until the executor has no pending work (the replies are printed by then)."""
        executor = self.runtime.executor if self.runtime is not None else None
        if isinstance(executor, BotExecutor) and not executor.wait_idle(REPLY_WAIT_S):
            self.printer.note("still working; the answer will show when it is ready.")

    def close(self) -> None:
        """Stop the clock, finish pending work, and stop the stand-in."""
        if self._clock is not None:
            self._clock.shutdown()
        if self.runtime is not None:
            self.wait()
            self.runtime.executor.shutdown(wait=True)
            if self.runtime.platform_work is not None:
                self.runtime.platform_work.shutdown(wait=True)
            self.runtime.fleet.close()
            self.runtime.db.dispose()
        self.slack.stop()

    def _dispatch(self, body: str) -> None:
        if self.app is None:
            raise RuntimeError("the console is not started")
        headers: dict[str, str | Sequence[str]] = dict(signed_headers(body, self._secret))
        request = BoltRequest(body=body, headers=headers)
        response = self.app.dispatch(request)
        if response.status != 200:
            self.printer.note(f"the bot answered HTTP {response.status}: {response.body}")
        elif response.body:
            self.printer.note(_answer_text(response.body))

    def _console_command(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == ":help":
            self.printer.plain(CONSOLE_HELP)
        elif word == ":as" and rest.strip():
            self.speaker = Speaker.named(rest)
            self._meet(self.speaker)
            self.printer.note(f"you are now {self.speaker.name} ({self.speaker.user_id})")
        elif word == ":as":
            self.printer.note("Say who: `:as alice`, or a Slack ID such as `:as U0123ABC`.")
        elif word == ":tick":
            self._tick(rest.strip())
        else:
            self.printer.note(f"Unknown console command `{line}`; type :help.")

    def _tick(self, ahead: str) -> None:
        """Move the clock forward by ``ahead`` (a duration, or nothing), one poll interval at a
        time with a tick at each step, so the instances are polled as often as the running bot
        polls them (a longer gap between polls restarts their idle clock)."""
        if self.runtime is None:
            raise RuntimeError("the console is not started")
        try:
            total = parse_duration(ahead) if ahead else timedelta(0)
        except UsageError as exc:
            self.printer.note(f"{exc.user_text()}\nUse `:tick`, or `:tick 25m` to move ahead.")
            return
        failed: set[str] = set()
        ticks = 0
        for step in tick_steps(total, timedelta(seconds=self.runtime.settings.poll_interval_s)):
            self._ahead += step
            report = tick(self.runtime, self.runtime.now())
            failed.update(report.errors)
            ticks += 1
            self.wait()
        every = f"{ticks} ticks, " if ticks > 1 else ""
        failures = f"; failed steps: {', '.join(sorted(failed))}" if failed else ""
        self.printer.note(
            f"ticked at {report.now:%Y-%m-%d %H:%M} UTC ({every}the console's clock is "
            f"{format_duration(self._ahead)} ahead){failures}"
        )

    def _now(self) -> datetime:
        return self._real_clock() + self._ahead

    def _meet(self, speaker: Speaker) -> None:
        self.slack.add_user(speaker.user_id, speaker.name)

    def _display_name(self, user_id: str) -> str:
        return self.slack.user_name(user_id) or user_id


def tick_steps(total: timedelta, interval: timedelta) -> list[timedelta]:
    """``total`` cut into steps of at most ``interval`` (at least one step: zero for no move)."""
    if total <= timedelta(0):
        return [timedelta(0)]
    step = max(interval, timedelta(seconds=1))
    full, rest = divmod(total, step)
    return [step] * int(full) + ([rest] if rest else [])


def _answer_text(body: str) -> str:
    """The text of an immediate answer (JSON with a ``text``, as a turned-away command gets)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body
    return str(answer.get("text", body)) if isinstance(answer, dict) else body


class Printer:
    """Prints messages and files as text, numbering every button across the session."""

    def __init__(self, out: TextIO, *, color: bool = False) -> None:
        self.out = out
        self.color = color
        self.files_dir: Path | None = None
        self.names: Callable[[str], str] = lambda user_id: user_id
        self._lock = threading.Lock()
        self._buttons: dict[int, Button] = {}

    def show(self, event: Event) -> None:
        """Print a message or a shared file (called from the stand-in's threads)."""
        lines = self._file_lines(event) if isinstance(event, SharedFile) else self._message(event)
        self._write(lines)

    def button(self, which: str) -> Button | None:
        """Button number ``which`` (as typed), if there is one."""
        with self._lock:
            return self._buttons.get(int(which)) if which.isdigit() else None

    def note(self, text: str) -> None:
        """A line from the console itself."""
        self._write([self._dim(f"(console) {text}")])

    def echo(self, name: str, line: str) -> None:
        """Repeat an input line (for piped input, so the transcript reads like a chat)."""
        self._write([self._bold(f"{name}> ") + line])

    def plain(self, text: str) -> None:
        """Print text as is."""
        self._write(text.splitlines())

    def _message(self, message: Message) -> list[str]:
        where = self._where(message)
        lines = [self._bold(f"gpubot {where}")]
        if message.replaces:
            lines[0] += self._dim(" (updated)")
        if message.blocks:
            lines.extend(self._blocks(message.blocks, message))
        else:
            lines.extend(self._paragraph(message.text))
        return lines

    def _where(self, message: Message) -> str:
        thread = " in a thread" if message.thread_ts else ""
        if message.ephemeral:
            return f"[only {self.names(message.user or '')} sees this]{thread}"
        if message.channel.startswith("D"):
            return f"[DM to {self.names(message.user or '')}]{thread}"
        return f"[#{'console' if message.channel == CONSOLE_CHANNEL else message.channel}]{thread}"

    def _blocks(self, blocks: Sequence[dict[str, Any]], message: Message) -> list[str]:
        lines: list[str] = []
        for block in blocks:
            lines.extend(self._block(block, message))
        return lines

    def _block(self, block: dict[str, Any], message: Message) -> list[str]:
        kind = block.get("type")
        if kind == "header":
            return ["  " + self._bold(f"== {_text(block.get('text'))} ==")]
        if kind == "divider":
            return ["  " + "-" * 40]
        if kind == "context":
            parts = [self._mrkdwn(_element_text(e)) for e in block.get("elements") or []]
            return ["  " + self._dim(" | ".join(p for p in parts if p))]
        if kind == "section":
            return self._section(block, message)
        if kind == "actions":
            labels = [self._element(e, block, message) for e in block.get("elements") or []]
            return ["  " + "  ".join(labels)]
        if kind == "image":
            return [f"  [image: {block.get('alt_text', '')}]"]
        if kind == "rich_text":
            return ["  " + line for line in _rich_text(block).splitlines()]
        return [f"  [{kind} block]"]

    def _section(self, block: dict[str, Any], message: Message) -> list[str]:
        lines = self._paragraph(_text(block.get("text")))
        for field in block.get("fields") or []:
            value = self._mrkdwn(_text(field)).replace("\n", " ")
            lines.append(f"    {value}")
        accessory = block.get("accessory")
        if isinstance(accessory, dict) and accessory.get("type") != "image":
            lines.append("    " + self._element(accessory, block, message))
        return lines

    def _element(self, element: dict[str, Any], block: dict[str, Any], message: Message) -> str:
        if element.get("type") != "button":
            return f"[{element.get('type')}: not available in the console]"
        if element.get("url"):
            return f"[link: {_text(element.get('text'))} {element['url']}]"
        label = _text(element.get("text"))
        confirm = element.get("confirm")
        with self._lock:
            number = len(self._buttons) + 1
            self._buttons[number] = Button(
                number=number,
                action_id=str(element.get("action_id", "")),
                value=str(element.get("value", "")),
                label=label,
                block_id=str(block.get("block_id", "")),
                message=message,
                confirm=_text(confirm.get("title")) if isinstance(confirm, dict) else None,
            )
        return self._bold(f"[{number} {label}]")

    def _file_lines(self, shared: SharedFile) -> list[str]:
        where = f"#{shared.channel}" if shared.channel else "(not shared)"
        lines = [self._bold(f"gpubot [{where}] shared a file: {shared.title}")]
        if shared.comment:
            lines.append("  " + self._mrkdwn(shared.comment))
        saved = self._save(shared)
        size = f"{len(shared.content):,} bytes"
        lines.append(f"  {shared.filename} ({size})" + (f", saved to {saved}" if saved else ""))
        return lines

    def _save(self, shared: SharedFile) -> Path | None:
        if self.files_dir is None:
            return None
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", shared.filename) or "file"
        path = self.files_dir / f"{shared.file_id}-{safe}"
        try:
            self.files_dir.mkdir(parents=True, exist_ok=True)
            path.write_bytes(shared.content)
        except OSError:
            log.warning("could not save %s", path, exc_info=True)
            return None
        return path

    def _paragraph(self, text: str) -> list[str]:
        """mrkdwn as indented lines: code blocks without their fences, indented further."""
        lines: list[str] = []
        in_code = False
        for raw in self._mrkdwn(text).split("\n"):
            fences = raw.count("```")
            body = raw.replace("```", "")
            if in_code or (fences and raw.strip().startswith("```")):
                if body.strip() or not fences:
                    lines.append("    " + body)
            else:
                lines.append("  " + self._emphasis(body))
            if fences % 2:
                in_code = not in_code
        return lines

    def _emphasis(self, text: str) -> str:
        if not self.color:
            return text
        return re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", lambda m: self._bold(m.group(1)), text)

    def _mrkdwn(self, text: str) -> str:
        def link(match: re.Match[str]) -> str:
            target, _, label = match.group(1).partition("|")
            if target.startswith("@"):
                return "@" + (label or self.names(target[1:]))
            if target.startswith("#"):
                return "#" + (label or target[1:])
            if target.startswith("!"):
                return "@" + (label or target[1:].split("^")[0])
            return f"{label} ({target})" if label else target

        shown = re.sub(r"<([^<>]+)>", link, text)
        for code, symbol in _EMOJI.items():
            shown = shown.replace(code, symbol)
        for entity, char in (("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&")):
            shown = shown.replace(entity, char)
        return shown

    def _bold(self, text: str) -> str:
        return f"\033[1m{text}\033[0m" if self.color else text

    def _dim(self, text: str) -> str:
        return f"\033[2m{text}\033[0m" if self.color else text

    def _write(self, lines: Sequence[str]) -> None:
        with self._lock:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()


_EMOJI = {
    ":warning:": "\u26a0\ufe0f",
    ":x:": "\u274c",
    ":no_entry:": "\u26d4",
    ":white_check_mark:": "\u2705",
    ":heavy_check_mark:": "\u2714\ufe0f",
    ":large_green_circle:": "\U0001f7e2",
    ":large_yellow_circle:": "\U0001f7e1",
    ":red_circle:": "\U0001f534",
    ":white_circle:": "\u26aa",
    ":hourglass:": "\u231b",
    ":hourglass_flowing_sand:": "\u23f3",
    ":alarm_clock:": "\u23f0",
    ":rotating_light:": "\U0001f6a8",
    ":information_source:": "\u2139\ufe0f",
    ":gear:": "\u2699\ufe0f",
    ":checkered_flag:": "\U0001f3c1",
    ":moneybag:": "\U0001f4b0",
    ":chart_with_upwards_trend:": "\U0001f4c8",
    ":zzz:": "\U0001f4a4",
    ":no_entry_sign:": "\U0001f6ab",
    ":runner:": "\U0001f3c3",
    ":grey_question:": "\u2754",
    ":bulb:": "\U0001f4a1",
}


def _text(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("text", ""))
    return "" if obj is None else str(obj)


def _element_text(element: Any) -> str:
    if isinstance(element, dict) and element.get("type") == "image":
        return f"[{element.get('alt_text', 'image')}]"
    return _text(element)


def _rich_text(block: dict[str, Any]) -> str:
    parts: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "text":
                parts.append(str(node.get("text", "")))
            for child in node.get("elements") or []:
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(block)
    return "".join(parts)


def _lines(source: TextIO, interactive: bool) -> Iterator[str]:
    if not interactive:
        yield from source
        return
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401 - line editing and history for input()
    while True:
        try:
            yield input("> ")
        except EOFError:
            print(file=sys.stdout)
            return
