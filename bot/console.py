"""`gpubot console`: a local chat with the bot, through the real Bolt app and the same services.

Each typed line becomes a correctly signed slash command (or, with ``click N``, a button click)
dispatched into the app; the app's Web API client and the response URLs point at an in-process
stand-in of Slack (bot.local_slack) whose messages are printed here as readable text. This
machine is registered as the instance ``local``. Piped input is read to its end, waiting for
every pending reply before exiting.

``:home`` prints the Home tab (a signed ``app_home_opened`` event, then the view Slack was
given). A command that opens a form prints it and asks for its fields on the next lines (an
empty line leaves a field as it is), then submits it; mistakes are printed by their fields,
which are asked again. A button that asks first (a Block Kit confirm) asks ``y/N`` on the next
line. The console speaks the language of whoever is typing (`/gpu lang`).

Why one module of this size: the console is a front end of its own (the typed line, the form's
field-by-field questions, confirms, the printer of Block Kit as text), used by people and by the
README's walks; its parts change together with what a person sees at the terminal.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from slack_bolt import App, BoltRequest

from bot.app import BotExecutor, build_app, build_runtime, start_clock
from bot.commands.registry import Registry
from bot.errors import GpubotError, UsageError
from bot.i18n import N_, Language, default_language, speaking, t
from bot.listeners import Forms
from bot.local_slack import Event, LocalSlack, Message, SharedFile, StoredView
from bot.runtime import Runtime
from bot.scheduler import SchedulerHandle
from bot.services.access import parse_member_id
from bot.services.instances.registration import ensure_local_instance
from bot.services.jobs.runs import poll_jobs, unfinished_count
from bot.services.speaking.people import language_for
from bot.services.tick import tick
from bot.settings import Settings
from bot.slack_requests import (
    app_home_opened_body,
    block_actions_body,
    element_options,
    signed_headers,
    slash_command_body,
    state_value,
    view_submission_body,
)
from bot.store.models import utcnow
from bot.values import format_duration, format_when, parse_duration

log = logging.getLogger(__name__)

#: Only the in-process stand-in accepts this token.
CONSOLE_TOKEN = "xoxb-console"
CONSOLE_CHANNEL = "C0CONSOLE"
DEFAULT_USER = "console-user"
#: How long to wait for the replies to one line before moving on, in seconds.
REPLY_WAIT_S = 900.0
#: A job on `local` runs on the real clock: the most real seconds `:tick DURATION` gives the
#: jobs running there to end before it moves the console's clock, and how often it looks.
LOCAL_JOBS_GRACE_S = 10.0
LOCAL_JOBS_LOOK_S = 0.2

#: Answers that press a button that asks first.
YES = frozenset({"y", "yes", "是"})
#: A field answered with one of these leaves the form without sending it.
CANCEL_WORDS = frozenset({"cancel", ":cancel", "取消"})

CONSOLE_HELP = N_(
    """\
Console commands:
  /gpu COMMAND ...   a slash command (the `/gpu` may be left out: `status` works too)
  click N            press button N (buttons are numbered across the session); a button that
                     asks first shows its question and waits for `y` on the next line
  :home              show your Home tab: your instances, jobs and spend, the team's fleet
  :as USER           speak as another user (a name like alice, or a Slack ID like U123)
  :tick [DURATION]   move the console's clock forward (e.g. `:tick 2h`) one poll interval at a
                     time, running a tick of the scheduler at each step (polls, idle prompts,
                     deadline warnings, releases, jobs, digests), as the bot would while it ran;
                     `:tick` alone runs one tick now; jobs on `local` run on the real
                     clock, so it first gives them up to 10 seconds to end
  :help              this text;  `/gpu help` lists the bot's commands
  :quit              leave (so does the end of piped input, or Ctrl-D)
A command that opens a form (`/gpu register` or `/gpu rent` alone) asks for each field on the
next lines; an empty line leaves the field empty or at its default, and `cancel`
(or `取消`) leaves the form without sending it."""
)


@dataclass(frozen=True)
class Button:
    """A numbered button the console printed: in a ``message``, or in a ``view`` (the Home
    tab); ``confirm`` is the dialog it asks first with, if any."""

    number: int
    action_id: str
    value: str
    label: str
    block_id: str
    message: Message | None
    confirm: dict[str, Any] | None
    view: dict[str, Any] | None = None


@dataclass(frozen=True)
class Speaker:
    """Who is typing: a display name and the Slack-style user ID derived from it."""

    name: str
    user_id: str

    @classmethod
    def named(cls, name: str) -> Speaker:
        """``alice`` speaks as ``UALICE``; a name that looks like a Slack ID is used as is."""
        member_id = parse_member_id(name)
        if member_id is not None:
            return cls(member_id.lower(), member_id)
        cleaned = name.strip().lstrip("@")
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
    """The chat loop: the stand-in, the app, the printer and who is speaking. ``registry`` and
    ``forms`` default to the bot's own."""

    def __init__(
        self,
        settings: Settings,
        *,
        out: TextIO,
        user: str = DEFAULT_USER,
        color: bool = False,
        registry: Registry | None = None,
        forms: Forms | None = None,
    ) -> None:
        self.out = out
        self.registry = registry
        self.forms = forms
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
        self._local_id: int | None = None
        self._real_clock: Callable[[], datetime] = utcnow
        self._input: Iterator[str] = iter(())
        self._echo = False

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
        self.app = build_app(
            self.settings, runtime=self.runtime, registry=self.registry, forms=self.forms
        )
        self._meet(self.speaker)
        self._listen_in(self.speaker)
        try:
            self._local_id = ensure_local_instance(self.runtime, self.speaker.user_id).id
        except GpubotError as exc:
            self.printer.note(
                t("could not register this machine as `local`: {error}", error=exc.user_text())
            )
        if clock:
            self._clock = start_clock(self.runtime)

    def banner(self) -> None:
        """The first lines: who you are and how to get help."""
        with speaking(self.printer.language):
            self.printer.note(
                t(
                    "gpubot console: you are {name} ({user_id}), owner of the instance `local` "
                    "(this machine). Type /gpu help, or :help for the console.",
                    name=self.speaker.name,
                    user_id=self.speaker.user_id,
                )
            )

    def run(self, lines: Iterable[str], *, echo: bool = False) -> int:
        """Handle lines until they end or ``:quit``; returns 0. A form or a button that asks
        first reads its answers from the following lines."""
        self._input = iter(lines)
        self._echo = echo
        for raw in self._input:
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
        with speaking(self._listen_in(self.speaker)):
            if line.startswith(":"):
                self._console_command(line)
            elif re.fullmatch(r"click\s+\S+", line, flags=re.IGNORECASE):
                self.click(line.split()[1])
            elif line.startswith("/") and not re.match(r"/gpu(\s|$)", line):
                self.printer.note(
                    t("Only /gpu is a command here; `{word}` is not.", word=line.split()[0])
                )
            else:
                self.command(re.sub(r"^/gpu\b", "", line).strip())
            self.wait()
        self._listen_in(self.speaker)

    def command(self, text: str) -> None:
        """Send `/gpu TEXT` as a signed slash command from the current speaker; a form it
        opens is filled in from the next lines."""
        speaker = self.speaker
        trigger = self.slack.new_trigger(speaker.user_id)
        body = slash_command_body(
            text=text,
            user_id=speaker.user_id,
            user_name=speaker.name,
            channel_id=CONSOLE_CHANNEL,
            channel_name="console",
            response_url=self.slack.response_url(CONSOLE_CHANNEL, speaker.user_id),
            trigger_id=trigger,
        )
        self._dispatch(body)
        self._fill_opened(trigger)

    def click(self, which: str) -> None:
        """Press button number ``which`` as the current speaker (after a ``y`` on the next
        line where the button asks first)."""
        button = self.printer.button(which)
        if button is None:
            self.printer.note(
                t("There is no button {which}; buttons show as [N label].", which=which)
            )
            return
        if button.confirm is not None:
            if not self._confirmed(button.confirm):
                self.printer.note(t("Not pressed; nothing was done."))
                return
            title = _text(button.confirm.get("title"))
            self.printer.note(t("{title}: confirmed.", title=title))
        speaker = self.speaker
        trigger = self.slack.new_trigger(speaker.user_id)
        common: dict[str, Any] = {
            "action_id": button.action_id,
            "value": button.value,
            "user_id": speaker.user_id,
            "user_name": speaker.name,
            "block_id": button.block_id,
            "label": button.label,
            "trigger_id": trigger,
        }
        message = button.message
        if message is None:
            body = block_actions_body(**common, view=button.view or {})
        else:
            body = block_actions_body(
                **common,
                channel_id=message.channel,
                response_url=self.slack.response_url(
                    message.channel, speaker.user_id, message_ts=message.ts
                ),
                message_ts=message.ts,
                message={"ts": message.ts, "text": message.text, "blocks": list(message.blocks)},
                ephemeral=message.ephemeral,
            )
        self._dispatch(body)
        self._fill_opened(trigger)

    def home(self) -> None:
        """Open the current speaker's Home tab (a signed ``app_home_opened`` event) and print
        the view the bot published."""
        speaker = self.speaker
        body = app_home_opened_body(user_id=speaker.user_id)
        self._dispatch(body, content_type="application/json")
        self.wait()
        view = self.slack.home_view(speaker.user_id)
        if view is None:
            self.printer.note(t("The bot published no Home tab; see its log."))
            return
        self.printer.home(view, self.speaker.name)

    def _confirmed(self, confirm: dict[str, Any]) -> bool:
        """Show a button's confirm dialog and read the answer from the next line."""
        self.printer.dialog(confirm)
        answer = self._ask()
        return answer is not None and answer.strip().lower() in YES

    def _ask(self) -> str | None:
        """The next input line (None when the input ended), echoed like a typed line."""
        line = next(self._input, None)
        if line is None:
            return None
        answer = line.rstrip("\n")
        if self._echo:
            self.printer.echo(self.speaker.name, answer)
        return answer

    def _fill_opened(self, trigger: str) -> None:
        """Fill in and submit the form opened with ``trigger``, if one was (forms open on the
        executor, after the command is answered: wait for it first)."""
        self.wait()
        stored = self.slack.opened_view(trigger)
        if stored is not None:
            self.fill(stored)

    def fill(self, stored: StoredView) -> None:
        """Print the form, read its fields from the next lines and submit it; ask again for
        the fields with mistakes until it is accepted or the input ends."""
        view = stored.view
        inputs = [b for b in view.get("blocks") or [] if b.get("type") == "input"]
        self.printer.form(view)
        values: dict[str, dict[str, dict[str, Any]]] = {}
        asking = inputs
        while True:
            for block in asking:
                entry = self._field(block)
                if entry is None:
                    return
                values[str(block.get("block_id", ""))] = entry
            errors = self._submit(view, values)
            if not errors:
                return
            self.printer.form_errors(inputs, errors)
            asking = [b for b in inputs if b.get("block_id") in errors] or inputs

    def _field(self, block: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
        """One field's state, read from the next lines (None when the input ended)."""
        element = block.get("element") or {}
        label = _text(block.get("label"))
        while True:
            self.printer.field_prompt(label)
            typed = self._ask()
            if typed is None:
                self.printer.note(t("The form was not sent."))
                return None
            if typed.strip().lower() in CANCEL_WORDS:
                self.printer.note(t("The form was cancelled; nothing was sent."))
                return None
            state = state_value(element, typed)
            if state is not None:
                return {str(element.get("action_id", "")): state}
            self.printer.note(t("That is none of the choices; type its number or its name."))

    def _submit(
        self, view: dict[str, Any], values: dict[str, dict[str, dict[str, Any]]]
    ) -> dict[str, str]:
        """Send the form as a signed view_submission; the mistakes the bot answered."""
        speaker = self.speaker
        body = view_submission_body(
            view=view, values=values, user_id=speaker.user_id, user_name=speaker.name
        )
        answer = self._dispatch(body, show=False)
        self.wait()
        try:
            parsed = json.loads(answer) if answer else {}
        except ValueError:
            parsed = {}
        if isinstance(parsed, dict) and parsed.get("response_action") == "errors":
            return {str(k): str(v) for k, v in (parsed.get("errors") or {}).items()}
        return {}

    def wait(self) -> None:
        """Wait until the executor has no pending work (the replies are printed by then)."""
        executor = self.runtime.executor if self.runtime is not None else None
        if isinstance(executor, BotExecutor) and not executor.wait_idle(REPLY_WAIT_S):
            self.printer.note(t("still working; the answer will show when it is ready."))

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

    def _dispatch(
        self,
        body: str,
        *,
        content_type: str = "application/x-www-form-urlencoded",
        show: bool = True,
    ) -> str:
        """Send a signed request into the app; its answer's body (printed unless ``show`` is
        False)."""
        if self.app is None:
            raise RuntimeError("the console is not started")
        signed = signed_headers(body, self._secret, content_type=content_type)
        headers: dict[str, str | Sequence[str]] = dict(signed)
        request = BoltRequest(body=body, headers=headers)
        response = self.app.dispatch(request)
        if response.status != 200:
            self.printer.note(
                t(
                    "the bot answered HTTP {status}: {body}",
                    status=response.status,
                    body=response.body,
                )
            )
        elif response.body and show:
            self.printer.note(_answer_text(response.body))
        return str(response.body or "")

    def _console_command(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == ":help":
            self.printer.plain(t(CONSOLE_HELP))
        elif word == ":home":
            self.home()
        elif word == ":as" and rest.strip():
            self.speaker = Speaker.named(rest)
            self._meet(self.speaker)
            with speaking(self._listen_in(self.speaker)):
                self.printer.note(
                    t(
                        "you are now {name} ({user_id})",
                        name=self.speaker.name,
                        user_id=self.speaker.user_id,
                    )
                )
        elif word == ":as":
            self.printer.note(t("Say who: `:as alice`, or a Slack ID such as `:as U0123ABC`."))
        elif word == ":tick":
            self._tick(rest.strip())
        else:
            self.printer.note(t("Unknown console command `{line}`; type :help.", line=line))

    def _tick(self, ahead: str) -> None:
        """Move the clock forward by ``ahead`` (a duration, or nothing), one poll interval at a
        time with a tick at each step, so the instances are polled as often as the running bot
        polls them (a longer gap between polls restarts their idle clock)."""
        if self.runtime is None:
            raise RuntimeError("the console is not started")
        try:
            total = parse_duration(ahead) if ahead else timedelta(0)
        except UsageError as exc:
            advice = t("Use `:tick`, or `:tick 25m` to move ahead.")
            self.printer.note(f"{exc.user_text()}\n{advice}")
            return
        if total > timedelta(0):
            self._let_local_jobs_end(min(total.total_seconds(), LOCAL_JOBS_GRACE_S))
        failed: set[str] = set()
        ticks = 0
        for step in tick_steps(total, timedelta(seconds=self.runtime.settings.poll_interval_s)):
            self._ahead += step
            report = tick(self.runtime, self.runtime.now())
            failed.update(report.errors)
            ticks += 1
            self.wait()
        at = format_when(report.now, self.runtime.settings.tz())
        ahead = format_duration(self._ahead)
        if ticks > 1:
            text = t(
                "ticked at {at} ({n} ticks, the console's clock is {ahead} ahead)",
                at=at,
                n=ticks,
                ahead=ahead,
            )
        else:
            text = t("ticked at {at} (the console's clock is {ahead} ahead)", at=at, ahead=ahead)
        if failed:
            text += "; " + t("failed steps: {steps}", steps=", ".join(sorted(failed)))
        self.printer.note(text)

    def _now(self) -> datetime:
        return self._real_clock() + self._ahead

    def _let_local_jobs_end(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` real seconds for the jobs running on `local` to end, polling
        them as the bot does (their replies are posted then), so that a short job is done
        before the console's clock jumps past it."""
        if self.runtime is None or self._local_id is None:
            return
        deadline_s = time.monotonic() + grace_s
        while unfinished_count(self.runtime, self._local_id):
            poll_jobs(self.runtime, self._local_id, self.runtime.now())
            self.wait()
            if time.monotonic() >= deadline_s or not unfinished_count(self.runtime, self._local_id):
                return
            time.sleep(LOCAL_JOBS_LOOK_S)

    def _meet(self, speaker: Speaker) -> None:
        self.slack.add_user(speaker.user_id, speaker.name)

    def _listen_in(self, speaker: Speaker) -> Language:
        """The language ``speaker`` chose, which the console now prints in too."""
        if self.runtime is not None:
            self.printer.language = language_for(self.runtime, speaker.user_id)
        return self.printer.language or default_language()

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
    """Prints messages, files, the Home tab and forms as text, numbering every button across
    the session, in ``language`` (the language of whoever is typing)."""

    def __init__(self, out: TextIO, *, color: bool = False) -> None:
        self.out = out
        self.color = color
        self.files_dir: Path | None = None
        self.names: Callable[[str], str] = lambda user_id: user_id
        self.language: Language | None = None
        self._lock = threading.Lock()
        self._buttons: dict[int, Button] = {}

    def show(self, event: Event) -> None:
        """Print a message or a shared file (called from the stand-in's threads)."""
        with speaking(self.language):
            if isinstance(event, SharedFile):
                lines = self._file_lines(event)
            else:
                lines = self._message(event)
        self._write(lines)

    def button(self, which: str) -> Button | None:
        """Button number ``which`` (as typed), if there is one."""
        with self._lock:
            return self._buttons.get(int(which)) if which.isdigit() else None

    def note(self, text: str) -> None:
        """A line from the console itself."""
        with speaking(self.language):
            line = t("(console) {text}", text=text)
        self._write([self._dim(line)])

    def echo(self, name: str, line: str) -> None:
        """Repeat an input line (for piped input, so the transcript reads like a chat)."""
        self._write([self._bold(f"{name}> ") + line])

    def plain(self, text: str) -> None:
        """Print text as is."""
        self._write(text.splitlines())

    def home(self, view: dict[str, Any], name: str) -> None:
        """Print a Home tab with its buttons numbered."""
        with speaking(self.language):
            lines = [self._bold(t("gpubot [Home tab of {name}]", name=name))]
            lines.extend(self._blocks(view.get("blocks") or [], view=view))
        self._write(lines)

    def dialog(self, confirm: dict[str, Any]) -> None:
        """Print a button's confirm dialog and the question it asks."""
        with speaking(self.language):
            lines = ["  " + self._bold(f"== {_text(confirm.get('title'))} ==")]
            lines.extend(self._paragraph(_text(confirm.get("text"))))
            lines.append(
                "  "
                + t(
                    "Type y for [{confirm}], anything else for [{deny}]:",
                    confirm=_text(confirm.get("confirm")) or t("Confirm"),
                    deny=_text(confirm.get("deny")) or t("Cancel"),
                )
            )
        self._write(lines)

    def form(self, view: dict[str, Any]) -> None:
        """Print a form: its title, its text, and each field with its hint and choices."""
        with speaking(self.language):
            lines = [self._bold(t("gpubot [form] {title}", title=_text(view.get("title"))))]
            for block in view.get("blocks") or []:
                if block.get("type") == "input":
                    lines.extend(self._input_lines(block))
                else:
                    lines.extend(self._block(block))
            lines.append(
                "  "
                + t(
                    "Type each field on its own line; an empty line leaves it as it is. "
                    "Then the form is sent ({submit}); `cancel` (or `取消`) leaves it unsent.",
                    submit=_text(view.get("submit")) or t("Submit"),
                )
            )
        self._write(lines)

    def field_prompt(self, label: str) -> None:
        """The question for one field."""
        self._write(["  " + self._bold(f"{label}:")])

    def form_errors(self, inputs: Sequence[dict[str, Any]], errors: dict[str, str]) -> None:
        """Print the bot's mistakes next to their fields."""
        labels = {str(b.get("block_id", "")): _text(b.get("label")) for b in inputs}
        with speaking(self.language):
            lines = ["  " + t("The form came back with mistakes; fill those fields in again:")]
            for block_id, problem in errors.items():
                label = labels.get(block_id, block_id)
                first, *more = self._mrkdwn(f"{label}: :warning: {problem}").split("\n")
                lines.append("    " + first)
                lines.extend("      " + line for line in more)
        self._write(lines)

    def _input_lines(self, block: dict[str, Any]) -> list[str]:
        element = block.get("element") or {}
        label = _text(block.get("label"))
        head = "  " + self._bold(f"* {label}")
        if block.get("optional"):
            head += self._dim(" " + t("(optional)"))
        lines = [head]
        hint = _text(block.get("hint"))
        if hint:
            lines.append("      " + self._dim(self._mrkdwn(hint)))
        example = _text(element.get("placeholder")) if "input" in str(element.get("type")) else ""
        if example:
            lines.append("      " + self._dim(t("for example: {example}", example=example)))
        options = element_options(element)
        if options:
            choices = [
                f"{n}) {_text(o.get('text'))}" for n, o in enumerate(options[:MAX_CHOICES], 1)
            ]
            intro = t("choices:")
            packed = _packed([f"{intro} {choices[0]}", *choices[1:]])
            lines.extend("      " + line for line in packed)
            if len(options) > MAX_CHOICES:
                lines.append(
                    "      " + t("… and {n} more (type the name)", n=len(options) - MAX_CHOICES)
                )
        default = _initial(element)
        if default:
            lines.append("      " + self._dim(t("default: {value}", value=default)))
        return lines

    def _message(self, message: Message) -> list[str]:
        where = self._where(message)
        lines = [self._bold(f"gpubot {where}")]
        if message.replaces:
            lines[0] += self._dim(" " + t("(updated)"))
        if message.blocks:
            lines.extend(self._blocks(message.blocks, message))
        else:
            lines.extend(self._paragraph(message.text))
        return lines

    def _where(self, message: Message) -> str:
        name = self.names(message.user or "")
        threaded = bool(message.thread_ts)
        if message.ephemeral:
            if threaded:
                return t("[only {name} sees this] in a thread", name=name)
            return t("[only {name} sees this]", name=name)
        if message.channel.startswith("D"):
            if threaded:
                return t("[DM to {name}] in a thread", name=name)
            return t("[DM to {name}]", name=name)
        channel = "console" if message.channel == CONSOLE_CHANNEL else message.channel
        if threaded:
            return t("[#{channel}] in a thread", channel=channel)
        return f"[#{channel}]"

    def _blocks(
        self,
        blocks: Sequence[dict[str, Any]],
        message: Message | None = None,
        *,
        view: dict[str, Any] | None = None,
    ) -> list[str]:
        lines: list[str] = []
        for block in blocks:
            lines.extend(self._block(block, message, view=view))
        return lines

    def _block(
        self,
        block: dict[str, Any],
        message: Message | None = None,
        *,
        view: dict[str, Any] | None = None,
    ) -> list[str]:
        kind = block.get("type")
        if kind == "header":
            return ["  " + self._bold(f"== {_text(block.get('text'))} ==")]
        if kind == "divider":
            return ["  " + "-" * 40]
        if kind == "context":
            parts = [self._mrkdwn(_element_text(e)) for e in block.get("elements") or []]
            return ["  " + self._dim(" | ".join(p for p in parts if p))]
        if kind == "section":
            return self._section(block, message, view)
        if kind == "actions":
            labels = [self._element(e, block, message, view) for e in block.get("elements") or []]
            return ["  " + "  ".join(labels)]
        if kind == "image":
            return ["  " + t("[image: {alt}]", alt=block.get("alt_text", ""))]
        if kind == "rich_text":
            return ["  " + line for line in _rich_text(block).splitlines()]
        return ["  " + t("[{kind} block]", kind=kind)]

    def _section(
        self, block: dict[str, Any], message: Message | None, view: dict[str, Any] | None
    ) -> list[str]:
        lines = self._paragraph(_text(block.get("text")))
        for field in block.get("fields") or []:
            value = self._mrkdwn(_text(field)).replace("\n", " ")
            lines.append(f"    {value}")
        accessory = block.get("accessory")
        if isinstance(accessory, dict) and accessory.get("type") != "image":
            lines.append("    " + self._element(accessory, block, message, view))
        return lines

    def _element(
        self,
        element: dict[str, Any],
        block: dict[str, Any],
        message: Message | None,
        view: dict[str, Any] | None,
    ) -> str:
        if element.get("type") != "button":
            return t("[{kind}: not available in the console]", kind=element.get("type"))
        if element.get("url"):
            return t("[link: {label} {url}]", label=_text(element.get("text")), url=element["url"])
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
                confirm=confirm if isinstance(confirm, dict) else None,
                view=view,
            )
        return self._bold(f"[{number} {label}]")

    def _file_lines(self, shared: SharedFile) -> list[str]:
        where = f"#{shared.channel}" if shared.channel else t("(not shared)")
        lines = [
            self._bold(
                t("gpubot [{where}] shared a file: {title}", where=where, title=shared.title)
            )
        ]
        if shared.comment:
            lines.append("  " + self._mrkdwn(shared.comment))
        saved = self._save(shared)
        size = t("{n:,} bytes", n=len(shared.content))
        if saved:
            lines.append(
                "  "
                + t("{name} ({size}), saved to {path}", name=shared.filename, size=size, path=saved)
            )
        else:
            lines.append(f"  {shared.filename} ({size})")
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
    ":arrow_forward:": "\u25b6",
    ":no_entry_sign:": "\U0001f6ab",
    ":runner:": "\U0001f3c3",
    ":grey_question:": "\u2754",
    ":bulb:": "\U0001f4a1",
}


#: The most choices of a field the console lists.
MAX_CHOICES = 30


def _text(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("text", ""))
    return "" if obj is None else str(obj)


def _initial(element: dict[str, Any]) -> str:
    """An input element's initial value as text (empty when it has none)."""
    for key in ("initial_value", "initial_time", "initial_date", "initial_user"):
        if element.get(key):
            return str(element[key])
    option = element.get("initial_option")
    if isinstance(option, dict):
        return _text(option.get("text"))
    chosen = element.get("initial_options")
    if isinstance(chosen, list):
        return ", ".join(_text(o.get("text")) for o in chosen if isinstance(o, dict))
    return ""


def _packed(items: Sequence[str], width: int = 96) -> list[str]:
    """``items`` two spaces apart, in lines of at most ``width`` characters where they fit
    (an item is never cut)."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1] += "  " + item
        else:
            lines.append(item)
    return lines


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
