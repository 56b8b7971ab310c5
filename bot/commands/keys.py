"""`/gpu keys [allow|revoke KEY @person]`: who may use which SSH key (admins only).

The service is bot.services.instances.key_grants; without arguments the command lists the keys of
GPUBOT_SSH_KEY_DIR and who holds each.
"""

from __future__ import annotations

import argparse

from bot.blocks.kit import code, mention
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import UsageError
from bot.i18n import N_, t
from bot.runtime import Runtime
from bot.services.access import Caller
from bot.services.instances import key_grants

KEYS_USAGE = "/gpu keys [allow|revoke KEY @person]"


def register(registry: Registry) -> None:
    """Add `/gpu keys`."""
    registry.command(
        CommandSpec(
            name="keys",
            summary=N_("Admins: say who may register with which SSH key."),
            usage=KEYS_USAGE,
            examples=(
                "/gpu keys",
                "/gpu keys allow lab-a100 @alice",
                "/gpu keys revoke lab-a100 @alice",
            ),
            configure=_configure,
            handler=handle_keys,
            aliases=("key", "密钥"),
        )
    )


def handle_keys(rt: Runtime, caller: Caller, args: argparse.Namespace) -> Reply:
    """List the keys, or grant or take back one."""
    if args.action is None:
        return Reply(text=_listing_text(key_grants.listing(rt, caller)), ephemeral=True)
    if args.key is None or args.person is None:
        raise UsageError(t("Name a key and a person."), usage=KEYS_USAGE)
    if args.action == "allow":
        change = key_grants.allow(rt, caller, args.key, args.person)
    else:
        change = key_grants.revoke(rt, caller, args.key, args.person)
    return Reply(text=_change_text(change), ephemeral=True)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("allow", "revoke"))
    parser.add_argument("key", nargs="?", metavar="KEY")
    parser.add_argument("person", nargs="?", metavar="@person")


def _change_text(change: key_grants.KeyChange) -> str:
    key, person = code(change.key_name), mention(change.person_id)
    if change.granted:
        if change.changed:
            return t(
                ":white_check_mark: {person} may now register with the key {key}.",
                person=person,
                key=key,
            )
        return t("{person} may already use the key {key}.", person=person, key=key)
    if change.changed:
        return t(
            ":white_check_mark: {person} may no longer register with the key {key}.",
            person=person,
            key=key,
        )
    return t("{person} did not hold the key {key}.", person=person, key=key)


def _listing_text(view: key_grants.KeyListView) -> str:
    if not view.keys and not view.granted_missing:
        return t("The key directory holds no keys (GPUBOT_SSH_KEY_DIR).")
    lines = [t("SSH keys and who may use them:")]
    for holders in view.keys:
        lines.append(_holders_line(holders))
    for holders in view.granted_missing:
        lines.append(_holders_line(holders) + " " + t("(no longer in the key directory)"))
    return "\n".join(lines)


def _holders_line(holders: key_grants.KeyHolders) -> str:
    people = ", ".join(mention(p) for p in holders.people) if holders.people else t("admins only")
    return f"• {code(holders.key_name)}: {people}"
