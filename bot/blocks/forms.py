"""The modal forms of `/gpu register` and `/gpu rent`: pure functions from what the bot knows
locally (the GPU catalogue, the providers, the price table) to a Block Kit modal view.

Each input block's ``block_id`` names the field (:data:`REGISTER_FIELDS`, :data:`RENT_FIELDS`);
its one element has the action id :data:`VALUE`. bot.commands.forms reads the submission back
and turns it into the command's arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from bot.blocks import kit
from bot.blocks.kit import Block
from bot.i18n import N_, t
from bot.providers.names import platform_name
from bot.values import format_money

REGISTER_FORM = "register_form"
RENT_FORM = "rent_form"
#: The action id of every field's element (a block holds one element).
VALUE = "value"
#: The longest error shown on a field.
ERROR_MAX = 500
#: What separates the provider from the type in a listed type's option value.
OFFER_SEPARATOR = ":"

#: The register form's fields, top to bottom.
REGISTER_FIELDS = (
    "name",
    "address",
    "gpu",
    "count",
    "price",
    "deadline",
    "provider",
    "provider_id",
    "billing",
    "min_charge",
    "disk",
    "storage",
    "project",
    "python",
    "key",
)
#: The rent form's fields, top to bottom (``type`` only where the price table lists types).
RENT_FIELDS = (
    "type",
    "other_type",
    "provider",
    "count",
    "name",
    "deadline",
    "price",
    "image",
    "ssh_key",
    "region",
    "user",
    "project",
    "python",
    "key",
    "disk",
)
#: The billing increments `--billing` takes, as the form shows them.
#: The price fields' examples, as the workspace's currency writes them (CNY: yuan figures).
_PRICE_EXAMPLES = {
    "USD": ("2.10/h", "0.10/GB-month", "1.01/h"),
    "CNY": ("3.5元/小时", "0.35元/GB/月", "7.3元/小时"),
}
_INCREMENTS = (("second", N_("per second")), ("minute", N_("per minute")), ("hour", N_("per hour")))


@dataclass(frozen=True)
class GpuChoice:
    """A GPU model of the catalogue: its ``key`` (what `--gpu` gets) and its full name."""

    key: str
    name: str


@dataclass(frozen=True)
class Offer:
    """A rentable type of a provider from the price table: ``count`` GPUs of ``gpu`` for
    ``micros_per_hour`` in ``currency`` (a list price)."""

    provider: str
    instance_type: str
    gpu: str
    count: int
    micros_per_hour: int
    currency: str


def form_error(text: str) -> str:
    """An error as shown under a field (at most :data:`ERROR_MAX` characters)."""
    return kit.clip(text, ERROR_MAX)


def offer_value(provider: str, instance_type: str) -> str:
    """The option value of a listed type (read back by :func:`split_offer`)."""
    return f"{provider}{OFFER_SEPARATOR}{instance_type}"


def split_offer(value: str) -> tuple[str, str]:
    """(provider, type) of an option value made by :func:`offer_value`."""
    provider, _, instance_type = value.partition(OFFER_SEPARATOR)
    return provider, instance_type


def register_form(
    gpus: Sequence[GpuChoice],
    providers: Sequence[str],
    *,
    default_release_in: str,
    currency: str = "USD",
) -> Block:
    """The `/gpu register` modal: every option of the command as a field. ``gpus`` are the
    catalogue's models; ``default_release_in`` is the deadline given when the field is left
    empty (like ``8h``); the price examples are in ``currency``."""
    price, storage, _ = _price_examples(currency)
    blocks = [
        _text(
            "name",
            t("Name"),
            placeholder="box1",
            hint=t("1-31 lowercase letters, digits and dashes, starting with a letter or digit."),
        ),
        _text(
            "address",
            t("SSH address"),
            placeholder="root@203.0.113.7:22",
            hint=t("USER@HOST or USER@HOST:PORT; an IPv6 host in brackets, like [2001:db8::1]."),
        ),
        kit.input_block(
            t("GPU model"),
            kit.static_select(
                VALUE,
                [kit.option(gpu.name, gpu.key) for gpu in gpus],
                placeholder=t("Choose the rented GPU"),
            ),
            block_id="gpu",
        ),
        _text("count", t("Number of GPUs"), placeholder="1", optional=True),
        _text(
            "price",
            t("Price of the instance"),
            placeholder=price,
            hint=t("Per hour or per minute, like 2.10/h or 0.035/min."),
        ),
        _deadline(default_release_in),
        kit.input_block(
            t("Provider"),
            kit.static_select(
                VALUE,
                [kit.option(platform_name(name), name) for name in providers],
                initial=(
                    kit.option(platform_name("manual"), "manual") if "manual" in providers else None
                ),
            ),
            block_id="provider",
            optional=True,
        ),
        _text(
            "provider_id",
            t("Instance id at the provider"),
            placeholder="abc123",
            optional=True,
            hint=t("Needed for every provider but manual."),
        ),
        kit.input_block(
            t("Billing increment"),
            kit.static_select(
                VALUE,
                [kit.option(t(shown), name) for name, shown in _INCREMENTS],
                placeholder=t("The provider's usual one"),
            ),
            block_id="billing",
            optional=True,
        ),
        _text("min_charge", t("Minimum charge"), placeholder="1m", optional=True),
        _text("disk", t("Disk size in GB"), placeholder="200", optional=True),
        _text(
            "storage",
            t("Storage price"),
            placeholder=storage,
            optional=True,
            hint=t("Charged on the disk size, also while the instance is stopped."),
        ),
        *_common_tail(),
    ]
    return kit.modal(
        t("Register an instance"),
        blocks,
        callback_id=REGISTER_FORM,
        submit=t("Register"),
        close=t("Cancel"),
    )


def rent_form(offers: Sequence[Offer], providers: Sequence[str], *, currency: str = "USD") -> Block:
    """The `/gpu rent` modal: the listed ``offers`` (grouped by provider, in the given order;
    a type too long for an option value is left to be typed), or another type and one of
    ``providers``, then the command's options."""
    blocks: list[Block] = []
    choosable = [
        offer
        for offer in offers
        if len(offer_value(offer.provider, offer.instance_type)) <= kit.OPTION_VALUE_MAX
    ]
    groups = [
        kit.option_group(platform_name(provider), [_offer_option(offer) for offer in listed])
        for provider, listed in groupby(choosable, key=lambda offer: offer.provider)
    ]
    if groups:
        blocks.append(
            kit.input_block(
                t("Instance type"),
                kit.static_select(VALUE, groups=groups, placeholder=t("Choose a listed type")),
                block_id="type",
                optional=True,
                hint=t("List prices from the bot's price table; the platform's price applies."),
            )
        )
    blocks.extend(
        [
            _text(
                "other_type",
                t("Another instance type") if groups else t("Instance type"),
                placeholder="g5.xlarge",
                optional=bool(groups),
                hint=t("A type the list lacks, as the platform names it; choose its provider."),
            ),
            kit.input_block(
                t("Provider of that type"),
                kit.static_select(
                    VALUE,
                    [kit.option(platform_name(name), name) for name in providers],
                    placeholder=t("Choose a provider"),
                ),
                block_id="provider",
                optional=True,
            ),
            _text("count", t("Number of instances"), placeholder="1", optional=True),
            _text(
                "name",
                t("Name"),
                placeholder="box1",
                optional=True,
                hint=t("Empty: named after the provider and the type."),
            ),
            _deadline(None),
            _text(
                "price",
                t("Your price per hour"),
                placeholder=_price_examples(currency)[2],
                optional=True,
                hint=t("Empty: the platform's price."),
            ),
            _text("image", t("Image"), placeholder="ami-0abc1234", optional=True),
            _text("ssh_key", t("SSH key name at the platform"), placeholder="bot", optional=True),
            _text("region", t("Region"), placeholder="us-east-1", optional=True),
            _text("user", t("SSH user"), placeholder="root", optional=True),
            *_common_tail(),
            _text("disk", t("Disk size in GB"), placeholder="100", optional=True),
        ]
    )
    return kit.modal(
        t("Rent an instance"),
        blocks,
        callback_id=RENT_FORM,
        submit=t("Rent"),
        close=t("Cancel"),
    )


def _offer_option(offer: Offer) -> Block:
    return kit.option(
        offer.instance_type,
        offer_value(offer.provider, offer.instance_type),
        description=t(
            "{count}x {gpu}, {price}/h",
            count=offer.count,
            gpu=offer.gpu,
            price=format_money(offer.micros_per_hour, offer.currency),
        ),
    )


def _deadline(default_release_in: str | None) -> Block:
    hint = (
        t(
            "A duration like 3h or 1h30m, or a time like 18:00 or 2026-12-03T18:00. "
            "Empty: {default} from now.",
            default=default_release_in,
        )
        if default_release_in is not None
        else t("A duration like 3h or 1h30m, or a time like 18:00 or 2026-12-03T18:00.")
    )
    return _text("deadline", t("Release in or at"), placeholder="3h", optional=True, hint=hint)


def _common_tail() -> list[Block]:
    return [
        _text("project", t("Project"), placeholder="llm", optional=True),
        _text(
            "python",
            t("Python on the instance"),
            placeholder="/usr/bin/python3",
            optional=True,
        ),
        _text(
            "key",
            t("The bot's SSH key to use"),
            placeholder="id_ed25519",
            optional=True,
            hint=t("Empty: the bot's default key."),
        ),
    ]


def _text(
    block_id: str,
    label: str,
    *,
    placeholder: str,
    optional: bool = False,
    hint: str | None = None,
) -> Block:
    return kit.input_block(
        label,
        kit.plain_text_input(VALUE, placeholder=placeholder),
        block_id=block_id,
        optional=optional,
        hint=hint,
    )


def _price_examples(currency: str) -> tuple[str, str, str]:
    """(hourly price, storage price, rented price) examples for ``currency``'s workspace."""
    return _PRICE_EXAMPLES.get(currency.upper(), _PRICE_EXAMPLES["USD"])
