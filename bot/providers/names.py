"""Platforms as a reader calls them: the provider keys of the bot (``compshare``, ``runpod``)
shown by name, in the active language, wherever a sentence names one (replies, errors, cards).
Compshare is 优云智算 to a Chinese reader; RunPod, Vast, AWS and Lambda are their own names in
every language. A key typed back into a command
(``/gpu adopt compshare ...``) stays the key: only what a person reads is named here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from bot.i18n import N_, t

#: What each provider key is called; marked names have a name of their own in a language.
PLATFORM_NAMES: Final[Mapping[str, str]] = {
    "compshare": N_("Compshare"),
    "runpod": "RunPod",
    "vast": "Vast",
    "aws": "AWS",
    "lambda": "Lambda",
    "manual": N_("manual"),
    # Platforms of the price tables the bot has no client for.
    "autodl": "AutoDL",
    "aliyun": N_("Alibaba Cloud"),
    "gpushare": N_("GpuShare"),
    "matpool": N_("Matpool"),
}
#: The names with a translation of their own (the others read the same everywhere).
_TRANSLATED: Final = frozenset({"compshare", "manual", "aliyun", "gpushare", "matpool"})
#: What separates names in a list (an enumeration comma in Chinese).
LIST_SEPARATOR: Final = N_(", ")


def platform_name(provider: str) -> str:
    """The platform ``provider`` (a provider key) names, as the active language calls it:
    ``Compshare`` / ``优云智算``, ``RunPod``, ``AWS``; a key the bot does not know is shown as
    it is. Plain text: callers escape it for mrkdwn as they escape any name."""
    key = provider.strip().lower()
    name = PLATFORM_NAMES.get(key)
    if name is None:
        return provider
    return t(name) if key in _TRANSLATED else name


def platform_list(providers: Iterable[str]) -> str:
    """Several platforms in one phrase, as the active language lists names (``RunPod, AWS``;
    ``优云智算、AWS``)."""
    return t(LIST_SEPARATOR).join(platform_name(provider) for provider in providers)
