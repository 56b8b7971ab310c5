"""The modal forms of `/gpu register` and `/gpu rent`: the view to open, and its submission read
back through the command itself.

A submission becomes the argument list the slash command would get (each field one option of
the command), so the form and the command can never disagree: first every field is checked alone
with the parser the command applies to that option (its argparse type and choices, then the
handler's own parser: price, time, address ...), so an error lands on its field; then the words
go through :func:`bot.commands.parser.parse` and the command's handler. An error naming an
option lands on that option's field (the last named: "--storage needs --disk" on the disk), a
platform's refusal on the platform's field, any other error on the form's first field. Nothing
changes unless the command succeeds.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from agents import specs
from bot.blocks import forms as blocks
from bot.blocks.forms import REGISTER_FORM, RENT_FORM, VALUE, GpuChoice, Offer
from bot.commands import instances, rent
from bot.commands.parser import CommandArgumentParser, parse, refuse_negatives
from bot.commands.registry import CommandSpec, Registry, Reply
from bot.errors import ConfigError, Conflict, GpubotError, ProviderError, UsageError
from bot.fleet import keys
from bot.i18n import t
from bot.providers.registry import KNOWN_PROVIDERS
from bot.services.access import Caller
from bot.services.instances import registration
from bot.services.instances.lookup import echo
from bot.services.money import price_tables
from bot.values import format_duration, parse_price, parse_when

if TYPE_CHECKING:
    from bot.runtime import Runtime

#: The callback ids of the forms (the listeners route their submissions here).
FORM_CALLBACK_IDS: Final = frozenset({REGISTER_FORM, RENT_FORM})
#: The command typed without arguments that opens each form.
_COMMAND_FORMS: Final = {"register": REGISTER_FORM, "rent": RENT_FORM}
#: What Slack's slash-command text turns into plain characters (bot.commands.parser reads
#: them so); a field's value is read the same way.
_TYPED_AS: Final = str.maketrans(
    {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u2018": "'", "\u2019": "'", "\u3000": " "}
)
_TIME_LIKE = re.compile(r"\d{1,2}:\d{2}|\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class FormOutcome:
    """What a submission came to: ``errors`` by block id (shown on those fields; nothing
    changed), or the command's ``reply``."""

    errors: dict[str, str] = field(default_factory=dict)
    reply: Reply | None = None


@dataclass(frozen=True)
class _Value:
    """A field's value for the command's argument ``dest``; errors land on ``block_id``."""

    block_id: str
    dest: str
    text: str


@dataclass(frozen=True)
class _Form:
    """A form: its command, the fields that must be filled in, and the fields whose block id is
    the argparse destination they fill (``deadline`` and the rent type are read apart)."""

    spec: CommandSpec
    required: tuple[str, ...]
    plain: tuple[str, ...]
    first: str
    #: The argument whose field an error of the platform lands on, by the error's type.
    platform_errors: tuple[tuple[type[GpubotError], str], ...] = ()


_FORMS: Final = {
    REGISTER_FORM: _Form(
        spec=instances.REGISTER,
        required=("name", "address", "gpu", "price"),
        plain=tuple(name for name in blocks.REGISTER_FIELDS if name != "deadline"),
        first="name",
        platform_errors=((ConfigError, "provider"), (ProviderError, "provider_id")),
    ),
    RENT_FORM: _Form(
        spec=rent.RENT,
        required=(),
        plain=tuple(
            name
            for name in blocks.RENT_FIELDS
            if name not in ("type", "other_type", "provider", "deadline")
        ),
        first="other_type",
        platform_errors=((ConfigError, "provider"), (ProviderError, "provider")),
    ),
}


def form_for_command(text: str) -> str | None:
    """The form `/gpu TEXT` opens: ``register`` or ``rent`` typed alone; otherwise None."""
    words = text.split()
    if words[:1] == ["/gpu"]:
        words = words[1:]
    if len(words) != 1:
        return None
    return _COMMAND_FORMS.get(words[0].lower())


def form_view(rt: Runtime, caller: Caller, callback_id: str) -> dict[str, Any]:
    """The modal of the form ``callback_id`` in the active language, from what the bot knows
    locally (no network call: it opens within Slack's 3 s). Raises ValueError for another id."""
    del caller
    if callback_id == REGISTER_FORM:
        default = format_duration(timedelta(seconds=rt.settings.default_release_in_s))
        gpus = [GpuChoice(spec.key, spec.name) for spec in specs.load_catalogue()]
        return blocks.register_form(
            gpus, KNOWN_PROVIDERS, default_release_in=default, currency=rt.settings.currency
        )
    if callback_id == RENT_FORM:
        providers = _rental_providers(rt)
        return blocks.rent_form(
            _offers(providers, rt.settings.currency), providers, currency=rt.settings.currency
        )
    raise ValueError(f"no form {callback_id!r}")


def check_form(
    rt: Runtime, caller: Caller, callback_id: str, values: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """The errors of each field checked alone (fast, no network: fit for Slack's 3 s answer to
    a submission), by block id. Raises ValueError for another form id."""
    del caller
    return _checked(rt, _form(callback_id), values)[1]


def submit_form(
    rt: Runtime, caller: Caller, callback_id: str, values: Mapping[str, Mapping[str, Any]]
) -> FormOutcome:
    """Run the form's command with the submitted ``values`` (``view["state"]["values"]``):
    its reply, or the errors by block id (nothing changed then). Raises ValueError for another
    form id; every GpubotError becomes an error on a field."""
    form = _form(callback_id)
    fields, errors = _checked(rt, form, values)
    if errors:
        return FormOutcome(errors=errors)
    registry = Registry()
    registry.command(form.spec)
    try:
        spec, args = parse(_command_text(form.spec, fields), registry)
        return FormOutcome(reply=spec.handler(rt, caller, args))
    except GpubotError as exc:
        block_id = _block_of(form, fields, exc, present=values.keys())
        return FormOutcome(errors={block_id: blocks.form_error(exc.user_text())})


def _rental_providers(rt: Runtime) -> list[str]:
    """The configured providers that can rent, in `/gpu rent`'s order (all that can in
    principle when none is configured: the command then says what to set up)."""
    configured = {p.name for p in rt.providers.all() if p.capabilities.can_launch}
    names = [name for name in KNOWN_PROVIDERS if name in configured]
    return names or [name for name in KNOWN_PROVIDERS if name != "manual"]


def _offers(providers: Sequence[str], currency: str) -> list[Offer]:
    """The types of ``providers`` in the price table of ``currency`` (the configured one:
    bot.services.money.price_tables), by provider, cheapest first; none without such a table."""
    table = price_tables.table_for(currency)
    if table is None:
        return []
    rank = {name: index for index, name in enumerate(providers)}
    rows = sorted(
        (row for row in table.hourly if row.platform in rank),
        key=lambda row: (rank[row.platform], row.micros, row.offer),
    )
    return [
        Offer(row.platform, row.offer, row.gpu, row.count, row.micros, table.currency)
        for row in rows
    ]


# --- reading a submission -----------------------------------------------------------------------


def _form(callback_id: str) -> _Form:
    form = _FORMS.get(callback_id)
    if form is None:
        raise ValueError(f"no form {callback_id!r}")
    return form


def _checked(
    rt: Runtime, form: _Form, values: Mapping[str, Mapping[str, Any]]
) -> tuple[list[_Value], dict[str, str]]:
    """The fields as the command's arguments, and the errors of those that fail alone."""
    read = _read(values)
    errors = {
        block_id: blocks.form_error(t("Fill this in."))
        for block_id in form.required
        if block_id not in read
    }
    fields = [_Value(name, name, read[name]) for name in form.plain if name in read]
    if "deadline" in read:
        fields.append(_deadline(read["deadline"]))
    if form.spec is rent.RENT:
        fields.extend(_rent_target(read, errors, present=values.keys()))
    actions = _actions(form.spec)
    for value in fields:
        if value.block_id in errors:
            continue
        try:
            _check(rt, actions[value.dest], value)
        except GpubotError as exc:
            errors[value.block_id] = blocks.form_error(exc.user_text())
    return fields, errors


def _read(values: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Each block's value as typed or chosen (trimmed, read like slash-command text); empty
    fields are left out."""
    read: dict[str, str] = {}
    for block_id, elements in values.items():
        state = elements.get(VALUE)
        if state is None and elements:
            state = next(iter(elements.values()))
        text = _state_text(state).translate(_TYPED_AS).strip()
        if text:
            read[block_id] = text
    return read


def _state_text(state: Any) -> str:
    if not isinstance(state, Mapping):
        return ""
    selected = state.get("selected_option")
    if isinstance(selected, Mapping):
        return str(selected.get("value") or "")
    chosen = state.get("selected_options")
    if isinstance(chosen, Sequence) and not isinstance(chosen, str):
        return ",".join(str(item.get("value")) for item in chosen if isinstance(item, Mapping))
    value = state.get("value")
    return value if isinstance(value, str) else ""


def _deadline(text: str) -> _Value:
    """The deadline field as `--release-at` (a time) or `--release-in` (a duration)."""
    dest = "release_at" if _TIME_LIKE.search(text) else "release_in"
    return _Value("deadline", dest, text)


def _rent_target(
    read: Mapping[str, str], errors: dict[str, str], *, present: Collection[str]
) -> list[_Value]:
    """The rent command's PROVIDER and TYPE: a listed type, or a typed one and its provider."""
    listed, typed, provider = read.get("type"), read.get("other_type"), read.get("provider")
    if listed and typed:
        errors["other_type"] = blocks.form_error(t("Choose a listed type or type one, not both."))
        return []
    if listed:
        listed_provider, instance_type = blocks.split_offer(listed)
        if provider and provider != listed_provider:
            errors["provider"] = blocks.form_error(
                t(
                    "{type} is a {provider} type: choose {provider} or leave this empty.",
                    type=instance_type,
                    provider=listed_provider,
                )
            )
            return []
        return [
            _Value("type", "provider", listed_provider),
            _Value("type", "instance_type", instance_type),
        ]
    if typed:
        if not provider:
            errors["provider"] = blocks.form_error(t("Choose the provider of this type."))
            return []
        return [
            _Value("provider", "provider", provider),
            _Value("other_type", "instance_type", typed),
        ]
    where = "type" if "type" in present else "other_type"
    errors[where] = blocks.form_error(t("Choose an instance type, or type one."))
    return []


# --- checking a field alone -----------------------------------------------------------------------


def _actions(spec: CommandSpec) -> dict[str, argparse.Action]:
    """The command's arguments by destination, as its parser is configured."""
    parser = CommandArgumentParser(spec)
    spec.configure(parser)
    return {action.dest: action for action in parser._actions}


def _check(rt: Runtime, action: argparse.Action, value: _Value) -> None:
    """Raise UsageError when the command would refuse ``value`` for ``action``: its argparse
    type (negative values refused as the parser does), its choices, then the handler's parser."""
    converted: Any = value.text
    if callable(action.type):
        try:
            converted = refuse_negatives(action.type)(value.text)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            raise UsageError(t("{value!r} is not valid here.", value=echo(value.text))) from exc
    if action.choices is not None and converted not in action.choices:
        raise UsageError(
            t("{value!r} is not one of the choices.", value=echo(value.text)),
            hint=t("Use one of: {choices}.", choices=", ".join(map(str, action.choices))),
        )
    check = _HANDLER_PARSERS.get(value.dest)
    if check is not None:
        check(rt, value.text)


def _price(rt: Runtime, text: str) -> object:
    return parse_price(text, rt.settings.currency)


def _release_at(rt: Runtime, text: str) -> object:
    return parse_when(text, now_utc=rt.now(), tz=rt.settings.tz())


def _storage(rt: Runtime, text: str) -> object:
    return instances.parse_storage_price(text, rt.settings.currency)


def _key(rt: Runtime, text: str) -> object:
    return keys.key_path(rt.settings, text)


#: What the handlers (and the services before anything changes) read a value with, by the
#: command's argument, where argparse takes it as text.
_HANDLER_PARSERS: Final[Mapping[str, Callable[[Runtime, str], object]]] = {
    "name": lambda rt, text: registration.validate_name(text),
    "address": lambda rt, text: registration.parse_address(text),
    "price": _price,
    "release_at": _release_at,
    "storage": _storage,
    "key": _key,
}


# --- running the command ------------------------------------------------------------------------


def _command_text(spec: CommandSpec, fields: Sequence[_Value]) -> str:
    """The `/gpu` text the fields stand for: each option as ``--option=value``, then ``--`` and
    the positionals in the command's order (so a value that starts with a dash stays a value),
    quoted, with ``&`` escaped as Slack escapes it."""
    actions = _actions(spec)
    by_dest = {value.dest: value.text for value in fields}
    options = [
        f"{action.option_strings[0]}={by_dest[dest]}"
        for dest, action in actions.items()
        if dest in by_dest and action.option_strings
    ]
    positionals = [
        by_dest[dest]
        for dest, action in actions.items()
        if dest in by_dest and not action.option_strings
    ]
    return shlex.join([spec.name, *options, "--", *positionals]).replace("&", "&amp;")


def _block_of(
    form: _Form, fields: Sequence[_Value], exc: GpubotError, *, present: Collection[str]
) -> str:
    """The field an error belongs on: the option (or positional) the message names last, else
    the hint's; a platform's refusal on the platform's field; a name in use on the name;
    anything else on the form's first field."""
    blocks_by_dest = {"release_in": "deadline", "release_at": "deadline"}
    blocks_by_dest.update({name: name for name in form.plain})
    blocks_by_dest.update({value.dest: value.block_id for value in fields})
    names: dict[str, str] = {}
    for dest, action in _actions(form.spec).items():
        block_id = blocks_by_dest.get(dest)
        if block_id is not None:
            for name in action.option_strings or [str(action.metavar or dest)]:
                names[name] = block_id
    for text in (exc.message, exc.hint):
        found = _last_named(text, names)
        if found is not None:
            return found
    for kind, dest in form.platform_errors:
        if isinstance(exc, kind) and dest in blocks_by_dest:
            return blocks_by_dest[dest]
    if isinstance(exc, Conflict) and "name" in present:
        return "name"
    return "type" if form.spec is rent.RENT and "type" in present else form.first


def _last_named(text: str, names: Mapping[str, str]) -> str | None:
    """The field of the option named last in ``text`` (in "--storage needs --disk" the one to
    fill in), or None."""
    hits = [
        (match.start(), block_id)
        for name, block_id in names.items()
        for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
    ]
    return max(hits)[1] if hits else None
