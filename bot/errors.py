"""The one error tree. Every error a user can see says what went wrong and what to do.

Outside errors (paramiko, SQLAlchemy, boto3, HTTP) are translated into these at the module that
owns the outside thing, with ``raise ... from exc``.
"""

from __future__ import annotations

from bot.i18n import N_, t


class GpubotError(Exception):
    """Base of every error the bot expects; ``str(err)`` is fit to show a user (raisers pass
    the message and hint already in the active language: ``t(...)``)."""

    #: The hint of every error of the class (marked with ``N_``, translated when read).
    default_hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self._hint = hint

    @property
    def hint(self) -> str:
        """Shown to the user as the next step; empty when the message already says it."""
        if self._hint is not None:
            return self._hint
        return t(self.default_hint) if self.default_hint else ""

    @property
    def message(self) -> str:
        """The message, without the hint."""
        return str(self.args[0]) if self.args else ""

    def user_text(self) -> str:
        """The message and, where there is one, the hint."""
        return f"{self.message}\n{self.hint}" if self.hint else self.message


class ConfigError(GpubotError):
    """A setting in the environment cannot be used."""


class UsageError(GpubotError):
    """A command was typed wrong; ``usage`` holds the command's usage line."""

    def __init__(self, message: str, *, usage: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.usage = usage


class NotFound(GpubotError):
    """A named instance, job or other thing does not exist."""


class Conflict(GpubotError):
    """The request clashes with the current state (a name in use, already released ...)."""


class AlreadyAnswered(Conflict):
    """A prompt was answered already (a double click, or two people at once): nothing changed."""


class NotAuthorized(GpubotError):
    """The user may not change this; only its owner or an admin may."""


class BudgetExceeded(NotAuthorized):
    """A budget's cap is reached: new rentals and extensions need an admin."""


# --- Fleet: reaching instances and their agent ---------------------------------------------


class FleetError(GpubotError):
    """Talking to an instance failed; ``instance`` names it where known."""

    def __init__(
        self, message: str, *, instance: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.instance = instance


class Unreachable(FleetError):
    """The host did not answer, refused the connection, or the connection dropped or timed out."""

    default_hint = N_(
        "Check that the instance is running and that its SSH port is open to the bot."
    )


class AuthenticationFailed(FleetError):
    """The instance refused the bot's key."""

    default_hint = N_(
        "Add the bot's public key to ~/.ssh/authorized_keys of that user on the instance."
    )


class HostKeyChanged(FleetError):
    """The host key differs from the one pinned at registration: refused, owner alerted."""

    default_hint = N_(
        "If the instance was rebuilt, re-register it; otherwise treat this as a possible "
        "man-in-the-middle and do not use the instance."
    )

    def __init__(
        self,
        message: str,
        *,
        instance: str | None = None,
        hint: str | None = None,
        expected_fingerprint: str | None = None,
        presented_fingerprint: str | None = None,
    ) -> None:
        super().__init__(message, instance=instance, hint=hint)
        #: The pinned key's ``SHA256:`` fingerprint, and the one the server showed (None when
        #: it offered no key of the pinned type).
        self.expected_fingerprint = expected_fingerprint
        self.presented_fingerprint = presented_fingerprint


class HostKeyNotPinned(FleetError):
    """No host key is pinned for the instance, so the bot will not connect to it."""

    default_hint = N_("Register the instance again so that its host key is pinned.")


class AgentMissing(FleetError):
    """gpu-agent is not on the instance (or no usable Python 3.9+ is)."""

    default_hint = N_(
        "Install python3 (3.9 or newer) on the instance; the bot uploads the agent itself."
    )


class AgentBroken(FleetError):
    """The agent ran but failed or printed something that is not its JSON."""


class CommandTimeout(Unreachable):
    """A command on the instance did not finish in time."""


class LocalRefused(FleetError):
    """The bot's own machine (``local``) was addressed outside the local console."""


class OutputTooLarge(FleetError):
    """A command printed more than the bot reads from an instance; it was stopped unread."""

    default_hint = N_(
        "Ask for less (a smaller --tail for logs); if a plain status or health check does "
        "this, the agent on the instance is misbehaving: check the instance."
    )


# --- Providers ------------------------------------------------------------------------------


class ProviderError(GpubotError):
    """A platform API call failed; ``retryable`` tells whether trying again may help."""

    retryable: bool = True

    def __init__(
        self, message: str, *, retryable: bool | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        if retryable is not None:
            self.retryable = retryable


class ProviderBusy(ProviderError):
    """The platform answered that the machine is busy (HTTP 409: a transition or another
    operation under way on it): the platform is up, and trying again shortly may succeed."""


class ProviderAuthError(ProviderError):
    """The platform rejected the API key (401/403)."""

    retryable = False
    default_hint = N_("Check the provider's API key in the bot's environment.")


class ProviderRateLimited(ProviderError):
    """The platform asked to slow down (429); ``retry_after_s`` from its Retry-After header."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        retryable: bool | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, hint=hint)
        self.retry_after_s = retry_after_s


class ProviderNotFound(ProviderError):
    """The platform itself says it does not know the instance: its own not-found document for
    that instance (each provider recognises its own), never a bare 404. For a release, gone."""

    retryable = False


class ProviderUnknownOutcome(ProviderError):
    """Something other than the platform's own answer came back: a 404 that is not the
    platform's not-found document (a proxy's catch-all HTML page, a retired API version, a moved
    host), a redirect, a body that is not JSON or a content type that is not. The request may or
    may not have happened: nothing may be concluded from it (never "already gone").

    ``status`` is the HTTP status and ``answer`` a short, credential-masked excerpt of what came
    back, for the escalation that names it."""

    retryable = True
    default_hint = N_(
        "The platform's API did not answer as itself (check its status page and the bot's "
        "API URL setting); the bot keeps checking and changes nothing until it does."
    )

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        answer: str = "",
        retryable: bool | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, hint=hint)
        self.status = status
        self.answer = answer


# --- Store ----------------------------------------------------------------------------------


class StoreError(GpubotError):
    """The database could not be reached or refused an operation (locked, gone, out of space)."""

    default_hint = N_(
        "Try again in a moment; if it keeps failing, check GPUBOT_DATABASE_URL and the database."
    )


# --- Slack ----------------------------------------------------------------------------------


class SlackError(GpubotError):
    """The Slack Web API refused a call or could not be reached; ``error`` is Slack's error code
    (``channel_not_found``, ``invalid_auth`` ...) or ``unreachable``.

    ``outcome_unknown`` is True when the call may have happened all the same (the answer timed
    out or the connection dropped after the request was sent): a post must not be repeated
    blindly then."""

    def __init__(
        self,
        message: str,
        *,
        error: str = "",
        hint: str | None = None,
        outcome_unknown: bool = False,
    ) -> None:
        super().__init__(message, hint=hint)
        self.error = error
        self.outcome_unknown = outcome_unknown


class FeishuError(SlackError):
    """Feishu's OpenAPI refused a call or could not be reached (bot.feishu.client). A chat
    error like SlackError, so the outbox's rules hold for both: ``error`` is the word the
    outbox knows where Feishu's ``code`` means the same (``not_in_channel``, ``ratelimited``,
    ``invalid_blocks`` ...), else ``feishu_<code>``, ``unreachable`` or ``unknown_answer``;
    ``code`` is Feishu's code (0 when none came), ``retry_after_s`` Feishu's wait after a
    rate limit (None when it named none)."""

    def __init__(
        self,
        message: str,
        *,
        error: str = "",
        code: int = 0,
        hint: str | None = None,
        outcome_unknown: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, error=error, hint=hint, outcome_unknown=outcome_unknown)
        self.code = code
        self.retry_after_s = retry_after_s
