"""`/gpu link @person feishu:ou_...` and `/gpu unlink ...`: one person's Slack and Feishu
identities made one (admins only).

The service is bot.services.speaking.identities; `/gpu link` alone lists the links.
"""

from __future__ import annotations

import argparse

from bot.blocks.kit import code, mention
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import UsageError
from bot.i18n import N_, nt, t
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.speaking import identities

LINK_USAGE = "/gpu link [@person feishu:ou_...]"
UNLINK_USAGE = "/gpu unlink feishu:ou_...|@person"


def register(registry: Registry) -> None:
    """Add `/gpu link` and `/gpu unlink`."""
    registry.command(
        CommandSpec(
            name="link",
            summary=N_("Admins: make a person's Slack and Feishu identities one."),
            usage=LINK_USAGE,
            examples=("/gpu link", "/gpu link @alice feishu:ou_1a2b3c"),
            configure=_configure_link,
            handler=handle_link,
        )
    )
    registry.command(
        CommandSpec(
            name="unlink",
            summary=N_("Admins: take a Feishu identity's link to Slack away."),
            usage=UNLINK_USAGE,
            examples=("/gpu unlink feishu:ou_1a2b3c", "/gpu unlink @alice"),
            configure=_configure_unlink,
            handler=handle_unlink,
        )
    )


def handle_link(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """List the links, or link a Slack person and a Feishu identity."""
    if args.person is None:
        return Reply(text=_listing_text(identities.links(rt, caller)))
    if args.feishu is None:
        raise UsageError(t("Name a Slack person and a Feishu identity."), usage=LINK_USAGE)
    change = identities.link(rt, caller, args.person, args.feishu)
    person, feishu = mention(change.slack_id), code(change.feishu_id)
    if not change.changed:
        return Reply(text=t("{feishu} is already {person}.", feishu=feishu, person=person))
    text = t(
        ":white_check_mark: {feishu} is now {person}: one owner on Slack and Feishu.",
        feishu=feishu,
        person=person,
    )
    if change.moved:
        text += " " + nt(
            "The {n} instance {feishu} held is now theirs.",
            "The {n} instances {feishu} held are now theirs.",
            change.moved,
            n=change.moved,
            feishu=feishu,
        )
    return Reply(text=text)


def handle_unlink(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """Remove a link."""
    change = identities.unlink(rt, caller, args.who)
    return Reply(
        text=t(
            ":white_check_mark: {feishu} is no longer {person}; it holds nothing of theirs.",
            feishu=code(change.feishu_id),
            person=mention(change.slack_id),
        )
    )


def _configure_link(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("person", nargs="?", metavar="@person")
    parser.add_argument("feishu", nargs="?", metavar="feishu:ou_...")


def _configure_unlink(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("who", metavar="feishu:ou_...|@person")


def _listing_text(links: tuple[identities.LinkView, ...]) -> str:
    if not links:
        return t("No Feishu identity is linked to a Slack person.")
    lines = [t("Feishu identities linked to Slack people:")]
    lines += [f"• {mention(link.slack_id)} = {code(link.feishu_id)}" for link in links]
    return "\n".join(lines)
