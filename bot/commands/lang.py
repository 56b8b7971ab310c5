"""`/gpu lang [zh|en]`: the language gpubot speaks to you (without one, which it speaks now)."""

from __future__ import annotations

import argparse

from bot.commands.registry import CommandSpec, Registry, Reply
from bot.i18n import N_, active_language, speaking, t
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.speaking import people

LANG_USAGE = "/gpu lang [zh|en]"


def register(registry: Registry) -> None:
    """Add `/gpu lang`."""
    registry.command(
        CommandSpec(
            name="lang",
            summary=N_("Choose the language gpubot speaks to you: zh (简体中文) or en (English)."),
            usage=LANG_USAGE,
            examples=("/gpu lang zh", "/gpu lang en", "/gpu lang"),
            configure=_configure,
            handler=_lang,
            aliases=("language", "语言"),
        )
    )


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("language", nargs="?", metavar="zh|en")


def _lang(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    if not args.language:
        name = people.language_name(active_language())
        return Reply(
            text=t(
                "I speak {language} to you. Change it with `/gpu lang zh` or `/gpu lang en`.",
                language=name,
            )
        )
    language = people.set_language(rt, caller, args.language)
    with speaking(language):
        return Reply(
            text=t(
                ":white_check_mark: From now on I speak {language} to you.",
                language=people.language_name(language),
            )
        )
