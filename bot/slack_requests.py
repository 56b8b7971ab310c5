"""What Slack sends the bot, built as Slack builds it: a request signed as Slack signs it, and
the bodies of a slash command, a button click, an ``app_home_opened`` event and a modal's
submission, with the state a modal's elements hold. The console and the local Slack stand-in
(bot.local_slack) click and type through these; tests and benches send them to the real app.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

from slack_sdk.signature import SignatureVerifier


def signed_headers(
    body: str,
    signing_secret: str,
    *,
    timestamp: int | None = None,
    content_type: str = "application/x-www-form-urlencoded",
) -> dict[str, str]:
    """Headers that sign ``body`` as Slack does: HMAC-SHA256 of ``v0:{timestamp}:{body}``
    (events come as ``application/json``, everything else as a form)."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(signing_secret).generate_signature(timestamp=stamp, body=body)
    if signature is None:
        raise ValueError("the signing secret must not be empty")
    return {
        "content-type": content_type,
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": signature,
    }


def slash_command_payload(
    *,
    text: str,
    user_id: str,
    user_name: str,
    channel_id: str,
    response_url: str,
    channel_name: str = "general",
    command: str = "/gpu",
    team_id: str = "T0LOCAL",
    trigger_id: str | None = None,
) -> dict[str, str]:
    """The fields of a slash command; ``text`` is escaped as Slack escapes it (&, <, >).
    ``trigger_id`` defaults to a new one (:func:`new_trigger_id`)."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return {
        "token": "unused-verification-token",
        "team_id": team_id,
        "team_domain": "local",
        "channel_id": channel_id,
        "channel_name": channel_name,
        "user_id": user_id,
        "user_name": user_name,
        "command": command,
        "text": escaped,
        "api_app_id": "A0GPUBOT",
        "is_enterprise_install": "false",
        "response_url": response_url,
        "trigger_id": trigger_id or new_trigger_id(),
    }


def slash_command_body(**fields: str) -> str:
    """The form body of a slash command (arguments as :func:`slash_command_payload`)."""
    return urllib.parse.urlencode(slash_command_payload(**fields))


def block_actions_payload(
    *,
    action_id: str,
    value: str,
    user_id: str,
    user_name: str,
    channel_id: str | None = None,
    response_url: str | None = None,
    block_id: str = "actions",
    label: str = "",
    message_ts: str | None = None,
    message: Mapping[str, Any] | None = None,
    ephemeral: bool = False,
    team_id: str = "T0LOCAL",
    trigger_id: str | None = None,
    view: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The payload of a button click (sent as ``payload=`` JSON in a form body). A click in a
    message has its channel and response URL; one in a ``view`` (the Home tab, a modal) has
    neither, as with Slack."""
    now = f"{time.time():.6f}"
    container: dict[str, Any]
    if view is not None:
        container = {"type": "view", "view_id": str(view.get("id", ""))}
    else:
        container = {
            "type": "message",
            "message_ts": message_ts or now,
            "channel_id": channel_id,
            "is_ephemeral": ephemeral,
        }
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": {"id": user_id, "username": user_name, "name": user_name, "team_id": team_id},
        "api_app_id": "A0GPUBOT",
        "token": "unused-verification-token",
        "container": container,
        "trigger_id": trigger_id or new_trigger_id(),
        "team": {"id": team_id, "domain": "local"},
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": block_id,
                "text": {"type": "plain_text", "text": label or action_id},
                "value": value,
                "action_ts": now,
            }
        ],
    }
    if view is None:
        payload["channel"] = {"id": channel_id, "name": channel_id}
        payload["response_url"] = response_url
    else:
        payload["view"] = dict(view)
    if message is not None:
        payload["message"] = dict(message)
    return payload


def block_actions_body(**fields: Any) -> str:
    """The form body of a button click (arguments as :func:`block_actions_payload`)."""
    return urllib.parse.urlencode({"payload": json.dumps(block_actions_payload(**fields))})


def new_trigger_id() -> str:
    """A fresh trigger id shaped like Slack's (its Unix time first)."""
    return f"{int(time.time())}.{next(_TRIGGER_SERIAL)}.{secrets.token_hex(8)}"


_TRIGGER_SERIAL = itertools.count(1)


def app_home_opened_payload(
    *, user_id: str, tab: str = "home", team_id: str = "T0LOCAL"
) -> dict[str, Any]:
    """The Events API envelope of ``user_id`` opening the app's ``tab`` (``home`` or
    ``messages``)."""
    now = time.time()
    return {
        "token": "unused-verification-token",
        "team_id": team_id,
        "api_app_id": "A0GPUBOT",
        "type": "event_callback",
        "event_id": f"Ev{secrets.token_hex(6).upper()}",
        "event_time": int(now),
        "event": {
            "type": "app_home_opened",
            "user": user_id,
            "channel": "D" + hashlib.sha256(user_id.encode()).hexdigest()[:10].upper(),
            "tab": tab,
            "event_ts": f"{now:.6f}",
        },
    }


def app_home_opened_body(**fields: str) -> str:
    """The JSON body of an ``app_home_opened`` event (arguments as
    :func:`app_home_opened_payload`); sign it with ``content_type="application/json"``."""
    return json.dumps(app_home_opened_payload(**fields))


def view_submission_payload(
    *,
    view: Mapping[str, Any],
    values: Mapping[str, Mapping[str, Mapping[str, Any]]],
    user_id: str,
    user_name: str,
    team_id: str = "T0LOCAL",
) -> dict[str, Any]:
    """The payload of a modal's submission: ``view`` as Slack keeps it with ``values`` as its
    state (block id -> action id -> what the element holds, see :func:`state_value`)."""
    submitted = {**view, "state": {"values": {k: dict(v) for k, v in values.items()}}}
    return {
        "type": "view_submission",
        "team": {"id": team_id, "domain": "local"},
        "user": {"id": user_id, "username": user_name, "name": user_name, "team_id": team_id},
        "api_app_id": "A0GPUBOT",
        "token": "unused-verification-token",
        "trigger_id": new_trigger_id(),
        "view": submitted,
        "response_urls": [],
        "is_enterprise_install": False,
    }


def view_submission_body(**fields: Any) -> str:
    """The form body of a modal's submission (arguments as :func:`view_submission_payload`)."""
    return urllib.parse.urlencode({"payload": json.dumps(view_submission_payload(**fields))})


def element_options(element: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The options an input element offers (a select's, grouped ones included; radio buttons'
    and checkboxes')."""
    options = [o for o in element.get("options") or [] if isinstance(o, dict)]
    for group in element.get("option_groups") or []:
        if isinstance(group, dict):
            options.extend(o for o in group.get("options") or [] if isinstance(o, dict))
    return options


def state_value(element: Mapping[str, Any], typed: str) -> dict[str, Any] | None:
    """What Slack puts in a view's state for an input ``element`` into which a person typed
    ``typed`` (empty: left as it is, the element's initial value). An option is chosen by its
    number, value or label; several (checkboxes, multi-selects) are separated by commas. None
    when ``typed`` names no option of the element."""
    kind = str(element.get("type", ""))
    text = typed.strip()
    if kind in ("plain_text_input", "number_input", "email_text_input", "url_text_input"):
        value = text or element.get("initial_value")
        return {"type": kind, "value": value if value not in ("", None) else None}
    if kind in ("static_select", "radio_buttons"):
        if not text:
            return {"type": kind, "selected_option": element.get("initial_option")}
        option = _option(element, text)
        return None if option is None else {"type": kind, "selected_option": option}
    if kind in ("checkboxes", "multi_static_select"):
        if not text:
            return {"type": kind, "selected_options": list(element.get("initial_options") or [])}
        chosen = [_option(element, part) for part in text.split(",") if part.strip()]
        if any(option is None for option in chosen):
            return None
        return {"type": kind, "selected_options": chosen}
    if kind == "timepicker":
        return {"type": kind, "selected_time": text or element.get("initial_time")}
    if kind == "datepicker":
        return {"type": kind, "selected_date": text or element.get("initial_date")}
    if kind == "users_select":
        return {"type": kind, "selected_user": text or element.get("initial_user")}
    return {"type": kind, "value": text or None}


def _option(element: Mapping[str, Any], typed: str) -> dict[str, Any] | None:
    wanted = typed.strip()
    options = element_options(element)
    if wanted.isdigit() and 1 <= int(wanted) <= len(options):
        return options[int(wanted) - 1]
    for option in options:
        if wanted in (str(option.get("value", "")), _text_of(option.get("text"))):
            return option
    lowered = wanted.lower()
    for option in options:
        if lowered in (str(option.get("value", "")).lower(), _text_of(option.get("text")).lower()):
            return option
    return None


def _text_of(obj: Any) -> str:
    if isinstance(obj, dict):
        return str(obj.get("text", ""))
    return "" if obj is None else str(obj)
