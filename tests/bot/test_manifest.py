"""deploy/ stays in step with the code: the Slack manifest with the listeners and the registry,
the scopes with the Web API methods the bot calls, the env example with the settings."""

from __future__ import annotations

import ast
import inspect
import re
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from slack_sdk import WebClient

from bot.cli import cli_parser
from bot.commands import build_registry
from bot.listeners import SLASH_COMMAND
from bot.local_slack import LocalSlack
from bot.slack_notifier import SlackNotifier
from bot.slack_requests import app_home_opened_body, signed_headers
from tests.fixtures.slack import BOT_TOKEN, SIGNING_SECRET, SlackBot

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

#: The bot scopes each Web API method the bot calls needs (Slack's method reference), for the
#: conversations it calls them on: posts go to DMs and to an ops channel the bot may not have
#: been invited to (chat:write.public); its own posts are looked up in DMs, public and private
#: channels.
SCOPES = {
    "chat.postMessage": frozenset({"chat:write", "chat:write.public"}),
    "chat.update": frozenset({"chat:write"}),
    "conversations.open": frozenset({"im:write"}),
    "conversations.history": frozenset({"im:history", "channels:history", "groups:history"}),
    "files.getUploadURLExternal": frozenset({"files:write"}),
    "files.completeUploadExternal": frozenset({"files:write"}),
}
#: The scope of the slash command itself.
COMMAND_SCOPE = "commands"
#: Web API methods that need no scope: the token check, the Home tab and modals.
NO_SCOPE = frozenset({"auth.test", "views.publish", "views.open", "views.update"})


def _scopes_of(methods: set[str]) -> set[str]:
    return {scope for method in methods for scope in SCOPES[method]}


def _web_api_methods(client_method: str) -> set[str]:
    """The Web API methods one WebClient method calls: its own ``api_call``, and those of the
    WebClient methods it calls in turn (files_upload_v2 makes two)."""
    source = inspect.getsource(getattr(WebClient, client_method))
    methods = set(re.findall(r'api_call\(\s*"([\w.]+)"', source))
    for inner in re.findall(r"self\.([a-z]\w*)\(", source):
        if inner != client_method and inner in vars(WebClient):
            methods |= _web_api_methods(inner)
    return methods


def _web_api_methods_the_code_calls() -> dict[str, set[str]]:
    """Every Web API method a WebClient method called anywhere in bot/ and agents/ makes, with
    the files that call it."""
    client_methods = {name for name in vars(WebClient) if not name.startswith("_")}
    found: dict[str, set[str]] = {}
    for path in sorted([*(ROOT / "bot").rglob("*.py"), *(ROOT / "agents").rglob("*.py")]):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in client_methods
            ):
                for method in _web_api_methods(node.func.attr):
                    found.setdefault(method, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_manifest_asks_for_exactly_the_scopes_of_the_methods_the_code_calls() -> None:
    called = _web_api_methods_the_code_calls()
    assert {"chat.postMessage", "views.publish", "files.completeUploadExternal"} <= set(called)
    unknown = set(called) - set(SCOPES) - NO_SCOPE
    assert unknown == set(), f"add the scopes of {unknown} (called in {called}) to SCOPES"
    wanted = {COMMAND_SCOPE} | _scopes_of(set(called) - NO_SCOPE)
    asked = _manifest()["oauth_config"]["scopes"]["bot"]
    assert len(asked) == len(set(asked)), "a scope is listed twice"
    assert set(asked) - wanted == set(), "the manifest asks for scopes nothing uses"
    assert wanted - set(asked) == set(), "the manifest lacks scopes the code needs"


def _manifest() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "manifest.yaml").read_text())
    assert isinstance(data, dict)
    return data


def _slash(manifest: dict[str, Any]) -> dict[str, Any]:
    (command,) = manifest["features"]["slash_commands"]
    assert isinstance(command, dict)
    return command


def test_manifest_declares_the_one_slash_command_the_app_listens_to() -> None:
    command = _slash(_manifest())
    assert command["command"] == SLASH_COMMAND
    assert command["should_escape"] is True
    assert command["url"].endswith("/slack/events")


def test_every_registered_command_is_in_the_usage_hint() -> None:
    hint = _slash(_manifest())["usage_hint"]
    words = set(re.findall(r"[a-z][a-z-]*", hint))
    missing = [spec.name for spec in build_registry().primary_commands() if spec.name not in words]
    assert missing == [], f"add {missing} to the usage_hint in deploy/manifest.yaml"
    assert len(hint) <= 1000


def test_interactivity_and_socket_mode_are_on() -> None:
    settings = _manifest()["settings"]
    assert build_registry().actions, "buttons are registered, so interactivity is needed"
    assert settings["interactivity"]["is_enabled"] is True
    assert settings["interactivity"]["request_url"].endswith("/slack/events")
    assert settings["socket_mode_enabled"] is True


def test_scopes_cover_every_web_api_method_the_notifier_calls(local_slack: LocalSlack) -> None:
    notifier = SlackNotifier(WebClient(token=BOT_TOKEN, base_url=local_slack.api_url))
    ref = notifier.post("U0ALICE", "hello")
    notifier.update(ref, "hello again")
    notifier.upload_file("C0GENERAL", "a.csv", b"a\n", title="A")
    assert notifier.find("U0ALICE", "prompt:1", since=datetime(2026, 1, 1)) is None
    called = {call.method for call in local_slack.calls}
    assert called <= set(SCOPES), f"add the scopes of {called - set(SCOPES)} here"
    scopes = set(_manifest()["oauth_config"]["scopes"]["bot"])
    assert COMMAND_SCOPE in scopes
    assert _scopes_of(called) <= scopes
    # Looking up the bot's own posts reads DMs, public and private channels it is in.
    assert {"im:history", "channels:history", "groups:history"} <= scopes


@pytest.mark.integration
def test_the_manifest_command_and_every_button_are_handled(slack_bot: SlackBot) -> None:
    command = _slash(_manifest())["command"].removeprefix("/")
    assert command == "gpu"
    assert slack_bot.command("help") == 200
    actions = sorted(build_registry().actions)
    for action_id in actions:
        # A click on a button the app registered is acked (200), never unhandled (404).
        assert slack_bot.click(action_id, "0") == 200, action_id
    assert slack_bot.click("no_such_button", "0") == 404
    replies = slack_bot.replies(1 + len(actions))
    assert all(reply.payload["text"] for reply in replies)
    assert not any(":x: Something went wrong" in r.payload["text"] for r in replies)


def test_the_home_tab_and_its_event_are_on() -> None:
    manifest = _manifest()
    home = manifest["features"]["app_home"]
    assert home["home_tab_enabled"] is True
    assert home["messages_tab_enabled"] is True
    events = manifest["settings"]["event_subscriptions"]
    assert events["bot_events"] == ["app_home_opened"]
    assert events["request_url"].endswith("/slack/events")
    assert "lang" in _slash(manifest)["usage_hint"].split(" | ")


@pytest.mark.integration
def test_the_manifest_event_and_the_forms_are_handled_with_its_scopes(
    slack_bot: SlackBot,
) -> None:
    body = app_home_opened_body(user_id="U0ALICE")
    headers = signed_headers(body, SIGNING_SECRET, content_type="application/json")
    assert slack_bot.post(body, headers) == 200
    assert slack_bot.slack.wait_for(lambda s: s.home_view("U0ALICE") is not None)
    assert slack_bot.command("register") == 200
    assert slack_bot.slack.wait_for(lambda s: bool(s.calls_to("views.open")))
    called = {call.method for call in slack_bot.slack.calls}
    assert {"views.publish", "views.open"} <= called
    assert called <= set(SCOPES) | NO_SCOPE
    scopes = set(_manifest()["oauth_config"]["scopes"]["bot"])
    assert _scopes_of(called - NO_SCOPE) <= scopes


def test_env_example_lists_every_setting() -> None:
    names = set(
        re.findall(r'"((?:GPUBOT|SLACK)_[A-Z0-9_]+)"', (ROOT / "bot/settings.py").read_text())
    )
    example = (DEPLOY / ".env.example").read_text()
    listed = set(re.findall(r"^#?\s*((?:GPUBOT|SLACK)_[A-Z0-9_]+)=", example, flags=re.M))
    assert names, "settings read the environment"
    assert names - listed == set(), "document these in deploy/.env.example"
    assert listed - names == set(), "deploy/.env.example names settings that do not exist"


def test_readme_names_every_setting_and_no_other() -> None:
    names = set(
        re.findall(r'"((?:GPUBOT|SLACK)_[A-Z0-9_]+)"', (ROOT / "bot/settings.py").read_text())
    )
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`((?:GPUBOT|SLACK)_[A-Z0-9_]+)`", readme))
    # `GPUBOT_*_API_KEY` stands for the three provider keys.
    named |= {f"GPUBOT_{p}_API_KEY" for p in ("LAMBDA", "RUNPOD", "VAST")}
    assert names - named == set(), "document these in README.md"
    assert named - names == set(), "README.md names settings that do not exist"
    commands = readme.split("\n## ", 1)[0]
    assert "make run" in commands
    assert "make test" in commands


def test_compose_runs_the_bot_on_postgresql() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert services["db"]["image"].startswith("postgres:")
    bot = services["bot"]
    assert bot["environment"]["GPUBOT_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert bot["depends_on"]["db"]["condition"] == "service_healthy"
    assert bot["build"]["dockerfile"] == "deploy/Dockerfile"
    cli_parser().parse_args(bot["command"])


def test_service_units_run_commands_the_cli_has() -> None:
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert [u.name for u in units] == ["gpubot-http.service", "gpubot.service"]
    for unit in units:
        for line in unit.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")):
                argv = shlex.split(line.split("=", 1)[1])
                assert argv[0].endswith("/gpubot")
                cli_parser().parse_args(argv[1:])


def test_service_units_keep_the_data_private() -> None:
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        service: dict[str, str] = {}
        for line in unit.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not line.startswith("#"):
                service[name] = value
        data_dir = service["Environment"].removeprefix("GPUBOT_DATA_DIR=")
        assert data_dir == f"/var/lib/{service['StateDirectory']}", unit.name
        assert service["StateDirectoryMode"] == "0700", unit.name
        assert service["UMask"] == "0077", unit.name


def test_dockerfile_entrypoint_is_the_cli() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    # The entrypoint script (tests/bot/test_deploy.py runs it) ends by running the CLI.
    assert 'ENTRYPOINT ["gpubot-entrypoint"]' in text
    assert "COPY deploy/entrypoint.sh /usr/local/bin/gpubot-entrypoint" in text
    assert 'exec gpubot "$@"' in (DEPLOY / "entrypoint.sh").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, flags=re.M)
    cli_parser().parse_args(yaml.safe_load(cmd))
