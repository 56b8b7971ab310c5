"""Feishu's OpenAPI for the bot: messages (cards, images, files), replies, card updates, uploads.

:class:`FeishuClient` wraps the official SDK's ``lark_oapi.Client`` (which gets, caches and
renews the tenant token) and answers in the bot's terms: a message id, an image or file key, or
bot.errors.FeishuError. What a failure means, as the outbox (bot.services.speaking.outbox)
reads it:

- **Outcome unknown** (``outcome_unknown``): no answer in time, the connection dropped after
  the request went out, a 5xx, or an answer that is not Feishu's (an HTML page, a body that is
  not JSON, JSON without what the call returns). The call may have happened. A message sent
  again with the same ``uuid`` within an hour is not sent twice (Feishu answers with the one
  it made), so a retry of such a send is safe within that hour.
- **Refused** (Feishu's own code): definite. The codes that mean what a Slack error means carry
  that error's word (:data:`ERRORS`), so the outbox's permanent/retry rules hold unchanged.
- **Slow down** (HTTP 429, code 99991400, or 230020 for a chat's 5 messages a second):
  ``ratelimited``, not carried out; ``retry_after_s`` from ``x-ogw-ratelimit-reset``.

Every call is bounded by ``timeout_s`` (connect and read, each).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Mapping
from typing import Any

import lark_oapi as lark
import requests
from lark_oapi.api.im.v1 import (
    CreateFileRequest,
    CreateFileRequestBody,
    CreateImageRequest,
    CreateImageRequestBody,
    CreateMessageRequest,
    CreateMessageRequestBody,
    CreatePinRequest,
    CreatePinRequestBody,
    PatchMessageRequest,
    PatchMessageRequestBody,
    ReplyMessageRequest,
    ReplyMessageRequestBody,
)
from lark_oapi.core.exception import ObtainAccessTokenException
from lark_oapi.core.model import BaseRequest, BaseResponse, RequestOption
from lark_oapi.core.token.manager import TokenManager
from lark_oapi.core.utils import Files
from requests_toolbelt import MultipartEncoder

from bot.errors import FeishuError
from bot.i18n import N_, t

log = logging.getLogger(__name__)

#: Feishu's API, by default (Lark's is https://open.larksuite.com).
DEFAULT_API_URL = "https://open.feishu.cn"
DEFAULT_TIMEOUT_S = 10.0
#: A message uuid's most characters (Feishu's).
UUID_MAX = 50
#: Feishu's codes the bot tells apart.
CODE_RATE_LIMIT = 99991400
CODE_CHAT_RATE = 230020
CODE_TOKEN_INVALID = 99991663
#: Feishu's codes that mean what a Slack error means, as that error's word.
ERRORS: Mapping[int, str] = {
    CODE_RATE_LIMIT: "ratelimited",
    CODE_CHAT_RATE: "ratelimited",
    CODE_TOKEN_INVALID: "token_expired",
    10014: "invalid_auth",
    230001: "invalid_arguments",
    230002: "not_in_channel",
    230025: "msg_too_long",
    230099: "invalid_blocks",
    99992402: "invalid_arguments",
}
#: Words of failures that carry no Feishu code.
UNREACHABLE = "unreachable"
UNKNOWN_ANSWER = "unknown_answer"
#: A file whose name ends so is sent as an image message; anything else as a file.
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp")
#: Feishu's file types by suffix (anything else is a ``stream``).
FILE_TYPES = {".pdf": "pdf", ".doc": "doc", ".docx": "doc", ".xls": "xls", ".xlsx": "xls"}

_HINTS = {
    "not_in_channel": N_("Add the bot to that Feishu group (GPUBOT_FEISHU_CHAT)."),
    "invalid_auth": N_("Check FEISHU_APP_ID and FEISHU_APP_SECRET."),
    "ratelimited": N_("Feishu asked the bot to slow down; it will try again later."),
}
_NETWORK_HINT = N_("Check the network and GPUBOT_FEISHU_API_URL.")
#: urllib3's and the socket's errors of a connection never made.
_NEVER_CONNECTED = frozenset(
    {"NewConnectionError", "NameResolutionError", "ConnectionRefusedError", "gaierror"}
)


def message_uuid(*parts: str) -> str:
    """A message uuid that is the same for the same ``parts`` (a post's key and where it goes),
    so a send repeated within Feishu's hour makes one message."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
    return f"gpubot-{digest[: UUID_MAX - 7]}"


class FeishuClient:
    """The bot's calls to Feishu through ``client`` (or one built from the app's id, secret,
    API URL and timeout). Every method raises bot.errors.FeishuError on failure."""

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        *,
        api_url: str = DEFAULT_API_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        client: lark.Client | None = None,
    ) -> None:
        self.app_id = app_id
        self.client = client or (
            lark.Client.builder()
            .app_id(app_id)
            .app_secret(app_secret)
            .domain(api_url.rstrip("/"))
            .timeout(timeout_s)
            .log_level(lark.LogLevel.ERROR)
            .build()
        )

    def send(
        self, receive_id_type: str, receive_id: str, card: Mapping[str, Any], *, uuid: str
    ) -> str:
        """Send ``card`` to a chat (``chat_id``) or a person (``open_id``); the message id."""
        return self.send_content(receive_id_type, receive_id, "interactive", card, uuid=uuid)

    def send_content(
        self,
        receive_id_type: str,
        receive_id: str,
        msg_type: str,
        content: Mapping[str, Any],
        *,
        uuid: str,
    ) -> str:
        """Send a message of ``msg_type`` (``interactive``, ``image``, ``file``, ``text``);
        the message id."""
        body = (
            CreateMessageRequestBody.builder()
            .receive_id(receive_id)
            .msg_type(msg_type)
            .content(json.dumps(content, ensure_ascii=False))
            .uuid(uuid)
            .build()
        )
        request = (
            CreateMessageRequest.builder().receive_id_type(receive_id_type).request_body(body)
        ).build()
        return _text("im.message.create", self._call("im.message.create", request), "message_id")

    def reply(self, message_id: str, card: Mapping[str, Any], *, uuid: str, in_thread: bool) -> str:
        """Reply to ``message_id`` with ``card`` (``in_thread``: in its thread); the reply's id."""
        return self.reply_content(message_id, "interactive", card, uuid=uuid, in_thread=in_thread)

    def reply_content(
        self,
        message_id: str,
        msg_type: str,
        content: Mapping[str, Any],
        *,
        uuid: str,
        in_thread: bool,
    ) -> str:
        """Reply to ``message_id`` with a message of ``msg_type``; the reply's id."""
        body = (
            ReplyMessageRequestBody.builder()
            .msg_type(msg_type)
            .content(json.dumps(content, ensure_ascii=False))
            .reply_in_thread(in_thread)
            .uuid(uuid)
            .build()
        )
        request = ReplyMessageRequest.builder().message_id(message_id).request_body(body).build()
        return _text("im.message.reply", self._call("im.message.reply", request), "message_id")

    def update(self, message_id: str, card: Mapping[str, Any]) -> None:
        """Replace the card of a message the bot sent (everyone sees the new one)."""
        body = PatchMessageRequestBody.builder().content(json.dumps(card, ensure_ascii=False))
        request = (
            PatchMessageRequest.builder().message_id(message_id).request_body(body.build())
        ).build()
        self._call("im.message.patch", request)

    def pin(self, message_id: str) -> None:
        """Pin a message the bot sent in its group (``im/v1/pins``); everyone sees it on top."""
        body = CreatePinRequestBody.builder().message_id(message_id).build()
        self._call("im.pin.create", CreatePinRequest.builder().request_body(body).build())

    def upload_image(self, png: bytes) -> str:
        """Upload an image to send in a message; its image key."""
        body = CreateImageRequestBody.builder().image_type("message").image(io.BytesIO(png))
        request = CreateImageRequest.builder().request_body(body.build()).build()
        data = self._call("im.image.create", request, multipart=True)
        return _text("im.image.create", data, "image_key")

    def upload_file(self, name: str, content: bytes) -> str:
        """Upload a file (a CSV, a PDF ...) to send in a message; its file key."""
        suffix = name[name.rfind(".") :].lower() if "." in name else ""
        body = (
            CreateFileRequestBody.builder()
            .file_type(FILE_TYPES.get(suffix, "stream"))
            .file_name(name)
            .file(io.BytesIO(content))
        )
        request = CreateFileRequest.builder().request_body(body.build()).build()
        data = self._call("im.file.create", request, multipart=True)
        return _text("im.file.create", data, "file_key")

    def send_file(
        self,
        receive_id_type: str,
        receive_id: str,
        name: str,
        content: bytes,
        *,
        uuid: str,
        reply_to: str | None = None,
        in_thread: bool = True,
    ) -> str:
        """Upload ``content`` and send it: an image message for a picture (by ``name``'s
        suffix), else a file message; as a reply to ``reply_to`` when given. The message id."""
        if name.lower().endswith(IMAGE_SUFFIXES):
            msg_type, content_json = "image", {"image_key": self.upload_image(content)}
        else:
            msg_type, content_json = "file", {"file_key": self.upload_file(name, content)}
        if reply_to is not None:
            return self.reply_content(
                reply_to, msg_type, content_json, uuid=uuid, in_thread=in_thread
            )
        return self.send_content(receive_id_type, receive_id, msg_type, content_json, uuid=uuid)

    def _call(self, method: str, request: BaseRequest, *, multipart: bool = False) -> Any:
        """Make one call; its ``data``. Raises FeishuError (see the module)."""
        option = RequestOption()
        if multipart:
            form = MultipartEncoder(Files.parse_form_data(request.body))
            request.body = form
            option.headers["Content-Type"] = form.content_type
        else:
            option.headers["Content-Type"] = "application/json; charset=utf-8"
        self._token(method)
        try:
            response = self.client.request(request, option)
        except requests.RequestException as exc:
            raise _unreachable(method, exc, sent=_was_sent(exc)) from exc
        except ValueError as exc:  # an answer that says JSON and is not
            raise _unknown(method, None, str(exc)) from exc
        return self._data(method, response)

    def _token(self, method: str) -> None:
        """Have the SDK's tenant token ready (cached, or asked for now), so that a failure to
        get it is told apart from the call's own: nothing was sent then."""
        config = self.client.config
        assert config is not None
        try:
            TokenManager.get_self_tenant_token(config)
        except ObtainAccessTokenException as exc:
            raise _refused(method, int(exc.code or 0), str(exc.msg)) from exc
        except requests.RequestException as exc:
            raise _unreachable(method, exc, sent=False) from exc
        except ValueError as exc:
            error = _unknown(method, None, str(exc))
            error.outcome_unknown = False
            raise error from exc

    def _data(self, method: str, response: BaseResponse) -> Any:
        raw = response.raw
        status = raw.status_code if raw is not None else None
        answer = _answer_of(raw.content if raw is not None else b"")
        if status == 429 and (answer is None or answer.get("code") in (None, CODE_RATE_LIMIT)):
            raise _rate_limited(method, CODE_RATE_LIMIT, raw.headers if raw else {})
        if answer is None or not isinstance(answer.get("code"), int):
            raise _unknown(method, status, _excerpt(raw.content if raw is not None else b""))
        code = answer["code"]
        if status is not None and status >= 500:
            raise _unknown(method, status, f"code {code}: {answer.get('msg', '')}")
        if code in (CODE_RATE_LIMIT, CODE_CHAT_RATE):
            raise _rate_limited(method, code, raw.headers if raw else {})
        if code != 0:
            if code == CODE_TOKEN_INVALID:
                self._forget_token()
            raise _refused(method, code, str(answer.get("msg", "")))
        return answer.get("data")

    def _forget_token(self) -> None:
        """Drop the SDK's cached tenant token so the next call gets a fresh one."""
        config = self.client.config
        app_id = config.app_id if config is not None else self.app_id
        TokenManager.cache.set(f"self_tenant_token:{app_id}", "", 0)


def _answer_of(content: bytes) -> dict[str, Any] | None:
    try:
        answer = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _text(method: str, data: Any, name: str) -> str:
    value = data.get(name) if isinstance(data, dict) else None
    if not isinstance(value, str) or not value:
        raise _unknown(method, 200, f"no {name} in the answer")
    return value


def _was_sent(exc: requests.RequestException) -> bool:
    """Whether the request may have reached Feishu: after a read timeout or a connection lost
    mid-answer it may have; not when the connection was never made (refused, unresolved, a
    connect timeout, a failed TLS handshake) or the request never formed (a bad URL)."""
    if isinstance(exc, (requests.ConnectTimeout, requests.exceptions.SSLError)):
        return False
    if isinstance(exc, requests.ConnectionError):
        return not _never_connected(exc)
    lost = (
        requests.Timeout,
        requests.exceptions.ChunkedEncodingError,
        requests.exceptions.ContentDecodingError,
    )
    return isinstance(exc, lost)


def _never_connected(exc: BaseException) -> bool:
    reason: BaseException | None = exc
    seen: set[int] = set()
    while reason is not None and id(reason) not in seen:
        if type(reason).__name__ in _NEVER_CONNECTED:
            return True
        seen.add(id(reason))
        reason = reason.__context__ or reason.__cause__ or _inner(reason)
    return False


def _inner(exc: BaseException) -> BaseException | None:
    """The error a urllib3 or requests error wraps (in its args or ``reason``)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException) and reason is not exc:
        return reason
    for arg in exc.args:
        if isinstance(arg, BaseException) and arg is not exc:
            return arg
    return None


def _excerpt(content: bytes) -> str:
    return content[:200].decode("utf-8", "replace")


def _refused(method: str, code: int, msg: str) -> FeishuError:
    error = ERRORS.get(code, f"feishu_{code}")
    hint = _HINTS.get(error)
    return FeishuError(
        t("Feishu refused {method}: {code} {msg}", method=method, code=code, msg=msg),
        error=error,
        code=code,
        hint=t(hint) if hint else "",
    )


def _rate_limited(method: str, code: int, headers: Mapping[str, str]) -> FeishuError:
    reset = {k.lower(): v for k, v in headers.items()}.get("x-ogw-ratelimit-reset")
    try:
        retry_after_s = float(reset) if reset is not None else None
    except ValueError:
        retry_after_s = None
    return FeishuError(
        t("Feishu asked the bot to slow down ({method}).", method=method),
        error="ratelimited",
        code=code,
        hint=t(_HINTS["ratelimited"]),
        retry_after_s=retry_after_s,
    )


def _unreachable(method: str, exc: BaseException, *, sent: bool) -> FeishuError:
    return FeishuError(
        t("Could not reach Feishu for {method}: {error}", method=method, error=type(exc).__name__),
        error=UNREACHABLE,
        hint=t(_NETWORK_HINT),
        outcome_unknown=sent,
    )


def _unknown(method: str, status: int | None, answer: str) -> FeishuError:
    log.warning("Feishu's answer to %s was not its own (HTTP %s): %s", method, status, answer)
    return FeishuError(
        t(
            "Feishu did not answer {method} as itself (HTTP {status}); it may have happened.",
            method=method,
            status=status if status is not None else "-",
        ),
        error=UNKNOWN_ANSWER,
        hint=t(_NETWORK_HINT),
        outcome_unknown=True,
    )
