"""Sizing and buying advice: `/gpu fit` and `/gpu estimate`. Pure functions over the GPU spec
catalogue (agents.specs) and the price table (bot/data/prices.json).

Memory model (bytes), after the sources in the module's constants:

- weights: parameters x bytes per parameter (16-bit 2, 8-bit 1, 4-bit 0.5 plus quantisation
  constants of 0.127 bits per parameter, QLoRA's double-quantised NF4);
- KV cache (inference): 2 x layers x kv_heads x head_dim x seq x batch x 2 bytes (a 16-bit cache);
- inference activations and buffers: 20% of the weights ("inference needs about 1.2 x the
  weights");
- full fine-tune with AdamW in mixed precision: 16 bytes per parameter (EleutherAI's
  transformer math): 16-bit weights 2 + 16-bit gradients 2 + fp32 master weights, momentum and
  variance 12;
- LoRA: frozen 16-bit (or 8-bit) base plus adapters of 0.5% of the parameters (rank 16 on every
  linear layer) at 16 bytes each (fp32 weights 4, gradients 4, AdamW 8); QLoRA: the same on a
  4-bit base;
- training activations with activation checkpointing (Korthikanti et al. 2022): each layer keeps
  its 16-bit input, 2·s·b·h bytes, and one layer at a time is recomputed in full,
  s·b·h·(34 + 5·a·s/h) bytes.

GPUs needed: model state and activations split evenly across GPUs (FSDP / tensor parallel), each
GPU holding its share in its **usable** memory: the catalogue's capacity, published in decimal
gigabytes (10^9 bytes: a "16 GB" T4 is 14.9 GiB), less a reserve on every GPU of
``CUDA_CONTEXT_BYTES`` (0.5 GiB: the CUDA context with cuBLAS and cuDNN loaded) and
``FRAGMENTATION_FRACTION`` (5% of the capacity: the caching allocator's fragmentation and
workspaces). 5%, not more, keeps the published QLoRA result (a 65B model fine-tuned on one
48 GB card) inside the model.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from importlib import resources
from typing import Any

from agents import specs
from bot.errors import UsageError
from bot.i18n import N_, nt, t
from bot.values import parse_money

GIB = 1024**3
GB = 1_000_000_000
MODES = ("inference", "lora", "qlora", "full")
DEFAULT_SEQ = 2048
DEFAULT_BATCH = 1
#: Kept free on every GPU for the CUDA context (see the module docstring).
CUDA_CONTEXT_BYTES = GIB // 2
#: Kept free on every GPU for fragmentation and workspaces, as a share of its capacity.
FRAGMENTATION_FRACTION = Decimal("0.05")
INFERENCE_BUFFER_FRACTION = Decimal("0.2")
LORA_TRAINABLE_FRACTION = Decimal("0.005")
LORA_BYTES_PER_TRAINABLE = 16
FULL_BYTES_PER_PARAM = {"weights": 2, "gradients": 2, "optimizer": 12}
NF4_BITS_PER_PARAM = Decimal("4.127")
HOURS_PER_MONTH = 730
#: The hours of a 31-day month: the most a card can be used in one.
HOURS_IN_LONGEST_MONTH = 744
MAX_GPUS_SHOWN = 64
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([bm])$")
_NAME_SUFFIXES = ("-instruct", "-chat", "-hf", "-base", "-it")
#: Where a price table row names no platform or offer (a card's list price).
LIST_PRICE = N_("list price")
ONE_CARD = "one card"


@dataclass(frozen=True)
class ModelShape:
    """A transformer's size and shape. ``known`` is False for a bare size like ``7b``, whose
    shape is borrowed from the known model closest in size (``shape_from``)."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    known: bool = True
    shape_from: str | None = None


@dataclass(frozen=True)
class MemoryBreakdown:
    """Memory needed, in bytes, by part."""

    weights_bytes: int
    kv_cache_bytes: int
    optimizer_bytes: int
    gradients_bytes: int
    activations_bytes: int

    @property
    def total_bytes(self) -> int:
        """Everything together, to be held in the GPUs' usable memory (the CUDA context and
        fragmentation are reserved there, see :func:`usable_bytes`)."""
        return (
            self.weights_bytes
            + self.kv_cache_bytes
            + self.optimizer_bytes
            + self.gradients_bytes
            + self.activations_bytes
        )

    def parts(self) -> tuple[tuple[str, int], ...]:
        """(label, bytes) in display order."""
        return (
            ("weights", self.weights_bytes),
            ("KV cache", self.kv_cache_bytes),
            ("optimizer state", self.optimizer_bytes),
            ("gradients", self.gradients_bytes),
            ("activations", self.activations_bytes),
        )


@dataclass(frozen=True)
class PriceRow:
    """One offer from the price table: ``count`` GPUs of catalogue model ``gpu`` for
    ``micros`` per hour (hourly) or per month (monthly), or to buy one card (purchase)."""

    platform: str
    offer: str
    gpu: str
    count: int
    micros: int
    source: str
    as_of: str
    verified: bool = False
    note: str = ""

    @property
    def label(self) -> str:
        """Where the price comes from, for a reader (in the active language): platform, offer,
        date, and whether the figure was checked against the platform's own page."""
        platform = t(LIST_PRICE) if self.platform == LIST_PRICE else self.platform
        offer = _cards(1) if self.offer == ONE_CARD else self.offer
        if self.verified:
            return f"{platform} {offer}, {self.as_of}"
        return t(
            "{platform} {offer}, {date}, unverified",
            platform=platform,
            offer=offer,
            date=self.as_of,
        )

    @property
    def per_gpu_micros(self) -> int:
        """The price of one of its GPUs (rounded up)."""
        return -(-self.micros // self.count)


@dataclass(frozen=True)
class PriceTable:
    """The price table: hourly offers, monthly plans, card prices, and known model shapes."""

    hourly: tuple[PriceRow, ...]
    monthly: tuple[PriceRow, ...]
    purchase: tuple[PriceRow, ...]
    models: tuple[ModelShape, ...]
    currency: str = "USD"

    def cheapest_hourly(self, gpu: str) -> PriceRow | None:
        """The lowest per-GPU hourly offer for a catalogue key, or None."""
        return _cheapest(row for row in self.hourly if row.gpu == gpu)

    def cheapest_monthly(self, gpu: str) -> PriceRow | None:
        """The lowest per-GPU monthly plan for a catalogue key, or None."""
        return _cheapest(row for row in self.monthly if row.gpu == gpu)

    def purchase_price(self, gpu: str) -> PriceRow | None:
        """The listed price of one card, or None."""
        return _cheapest(row for row in self.purchase if row.gpu == gpu)

    def model(self, name: str) -> ModelShape | None:
        """A known model by name (case and common suffixes ignored), or None."""
        wanted = _model_key(name)
        for shape in self.models:
            if shape.name == wanted:
                return shape
        return None


@dataclass(frozen=True)
class GpuFit:
    """How many GPUs of one model hold the estimate, and what that costs per hour where the
    price table knows (``price_micros_per_hour`` for ``count`` GPUs). ``mem_bytes`` is the
    catalogue capacity (decimal GB as bytes), ``usable_bytes`` what is left of it for the
    model, ``per_gpu_bytes`` what each of the ``count`` GPUs needs."""

    key: str
    name: str
    mem_bytes: int
    usable_bytes: int
    count: int
    per_gpu_bytes: int
    price_micros_per_hour: int | None
    price_source: str | None


@dataclass(frozen=True)
class FitReport:
    """The answer to `/gpu fit`: the estimate and the GPUs that hold it, fewest GPUs first."""

    model: ModelShape
    mode: str
    seq: int
    batch: int
    bits: int
    memory: MemoryBreakdown
    fits: tuple[GpuFit, ...]
    too_big: tuple[str, ...]
    #: The ISO 4217 currency of the prices (the price table's).
    currency: str = "USD"


@dataclass(frozen=True)
class Option:
    """One way to get the GPU time: what it costs for all the cards (micros; a month of it for
    renting, once for buying), or None where no price is known."""

    name: str
    cost_micros: int | None
    detail: str


@dataclass(frozen=True)
class EstimateReport:
    """The answer to `/gpu estimate`: a month of renting by the hour at ``hours`` a month vs a
    monthly plan, and buying, with the break-evens. Prices are per card (``*_per_card_micros``:
    an hour, a month of the plan, a card bought); the totals are for ``count`` cards."""

    gpu_key: str
    gpu_name: str
    count: int
    hours: Decimal
    hourly_per_card_micros: int | None
    hourly_source: str
    monthly_per_card_micros: int | None
    monthly_source: str
    buy_per_card_micros: int | None
    buy_source: str
    options: tuple[Option, ...]
    #: Hours a month from which the plan costs less than the hourly price, or None.
    monthly_break_even_hours: Decimal | None
    #: Hours of renting by the hour that cost what buying does, or None.
    buy_break_even_hours: Decimal | None
    #: Months at ``hours`` a month, against the cheaper way to rent, until buying pays, or None.
    buy_break_even_months: Decimal | None
    #: The way to rent the buy break-even in months is counted against.
    buy_against: str | None

    @property
    def hourly_micros(self) -> int | None:
        """An hour of all the cards."""
        return _times(self.hourly_per_card_micros, self.count)

    @property
    def monthly_micros(self) -> int | None:
        """A month of the plan for all the cards."""
        return _times(self.monthly_per_card_micros, self.count)

    @property
    def buy_micros(self) -> int | None:
        """Buying all the cards."""
        return _times(self.buy_per_card_micros, self.count)

    @property
    def plan_never_pays(self) -> bool:
        """True when the plan costs more than renting by the hour for the longest month around
        the clock: it pays off at no usage."""
        even = self.monthly_break_even_hours
        return even is not None and even > HOURS_IN_LONGEST_MONTH

    @property
    def cheapest(self) -> Option | None:
        """The cheaper way to rent for a month at ``hours`` (buying is a one-off, compared by
        its break-even instead)."""
        priced = [
            option
            for option in self.options
            if option.cost_micros is not None and option.name != "buy"
        ]
        return min(priced, key=lambda option: option.cost_micros or 0) if priced else None


def load_price_table() -> PriceTable:
    """The packaged price table (cached). Raises ValueError if the packaged file is malformed."""
    return _load_price_table()


def parse_size(text: str, table: PriceTable | None = None) -> ModelShape:
    """``7b``, ``70B``, ``1.5b``, ``500m`` or a known model name as a ModelShape.

    Raises UsageError naming the accepted forms and some known models.
    """
    table = table or load_price_table()
    known = table.model(text)
    if known is not None:
        return known
    match = _SIZE.match(text.strip().lower())
    if match is None:
        names = ", ".join(shape.name for shape in table.models[:8])
        raise UsageError(
            t("{text!r} is not a model size or a model I know", text=text),
            hint=t("Give a size like 7b, 70b or 1.5b, or a model such as {names}.", names=names),
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the pattern admits only decimals
        raise UsageError(t("{text!r} is not a model size", text=text)) from exc
    params = int(number * (10**9 if match.group(2) == "b" else 10**6))
    if not 10**7 <= params <= 5 * 10**12:
        raise UsageError(
            t("{text!r} is out of range", text=text), hint=t("Give a size between 10m and 5000b.")
        )
    closest = min(table.models, key=lambda shape: abs(math.log(shape.params / params)))
    return ModelShape(
        name=f"{match.group(1)}B" if match.group(2) == "b" else f"{match.group(1)}M",
        params=params,
        layers=closest.layers,
        hidden=closest.hidden,
        heads=closest.heads,
        kv_heads=closest.kv_heads,
        head_dim=closest.head_dim,
        known=False,
        shape_from=closest.name,
    )


def resolve_bits(mode: str, bits: int | None) -> int:
    """The weight precision for a mode: qlora is 4-bit, a full fine-tune 16-bit, inference and
    LoRA 16-bit unless told. Raises UsageError for an unknown mode or a precision it cannot use."""
    if mode not in MODES:
        raise UsageError(
            t("{mode!r} is not a mode", mode=mode),
            hint=t("Use one of: {choices}.", choices=", ".join(MODES)),
        )
    if bits is not None and bits not in (16, 8, 4):
        raise UsageError(
            t("--bits {bits} is not supported", bits=bits), hint=t("Use --bits 16, 8 or 4.")
        )
    if mode == "qlora":
        if bits not in (None, 4):
            raise UsageError(t("QLoRA trains on a 4-bit base"), hint=t("Drop --bits or use lora."))
        return 4
    if mode == "full":
        if bits not in (None, 16):
            raise UsageError(
                t("a full fine-tune trains 16-bit weights"),
                hint=t("Drop --bits, or use qlora (4-bit) or lora (8-bit base)."),
            )
        return 16
    if mode == "lora" and bits == 4:
        return 4
    return bits or 16


def estimate_memory(
    shape: ModelShape, mode: str, *, seq: int, batch: int, bits: int
) -> MemoryBreakdown:
    """Memory for ``mode`` at ``seq`` tokens x ``batch`` with ``bits``-bit weights (bytes)."""
    weights = _weight_bytes(shape.params, bits)
    if mode == "inference":
        kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * seq * batch * 2
        buffers = int(weights * INFERENCE_BUFFER_FRACTION)
        return MemoryBreakdown(weights, kv, 0, 0, buffers)
    activations = _training_activations(shape, seq=seq, batch=batch)
    if mode == "full":
        return MemoryBreakdown(
            weights_bytes=shape.params * FULL_BYTES_PER_PARAM["weights"],
            kv_cache_bytes=0,
            optimizer_bytes=shape.params * FULL_BYTES_PER_PARAM["optimizer"],
            gradients_bytes=shape.params * FULL_BYTES_PER_PARAM["gradients"],
            activations_bytes=activations,
        )
    trainable = int(shape.params * LORA_TRAINABLE_FRACTION)
    return MemoryBreakdown(
        weights_bytes=weights + trainable * 4,
        kv_cache_bytes=0,
        optimizer_bytes=trainable * 8,
        gradients_bytes=trainable * 4,
        activations_bytes=activations,
    )


def capacity_bytes(spec: specs.GpuSpec) -> int:
    """A catalogue GPU's memory in bytes: its published gigabytes are decimal (10^9 bytes)."""
    return spec.mem_gb * GB


def usable_bytes(capacity: int) -> int:
    """What a GPU of ``capacity`` bytes holds for the model: the capacity less the CUDA context
    (0.5 GiB) and 5% for fragmentation; 0 when nothing is left."""
    reserve = CUDA_CONTEXT_BYTES + _ceil(capacity * FRAGMENTATION_FRACTION)
    return max(0, capacity - reserve)


def gpus_needed(memory: MemoryBreakdown, usable: int) -> int:
    """How many GPUs with ``usable`` bytes each hold the estimate split evenly; 0 for none."""
    if usable <= 0:
        return 0
    return max(1, -(-memory.total_bytes // usable))


def fit(
    size: str,
    mode: str,
    *,
    seq: int | None = None,
    batch: int | None = None,
    bits: int | None = None,
    table: PriceTable | None = None,
    catalogue: tuple[specs.GpuSpec, ...] | None = None,
) -> FitReport:
    """`/gpu fit`: the memory estimate and, per GPU model, how many hold it and their price.

    Raises UsageError for a bad size, mode, precision, sequence length or batch.
    """
    table = table or load_price_table()
    shape = parse_size(size, table)
    bits = resolve_bits(mode.lower(), bits)
    seq = DEFAULT_SEQ if seq is None else seq
    batch = DEFAULT_BATCH if batch is None else batch
    if not 1 <= seq <= 10_000_000:
        raise UsageError(
            t("{option} {value} is out of range", option="--seq", value=seq),
            hint=t("Give a sequence length like 4096."),
        )
    if not 1 <= batch <= 100_000:
        raise UsageError(
            t("{option} {value} is out of range", option="--batch", value=batch),
            hint=t("Give a batch size like 1."),
        )
    memory = estimate_memory(shape, mode.lower(), seq=seq, batch=batch, bits=bits)
    fits: list[GpuFit] = []
    too_big: list[str] = []
    for spec in catalogue or specs.load_catalogue():
        capacity = capacity_bytes(spec)
        usable = usable_bytes(capacity)
        count = gpus_needed(memory, usable)
        if count == 0 or count > MAX_GPUS_SHOWN:
            too_big.append(spec.key)
            continue
        price = table.cheapest_hourly(spec.key)
        fits.append(
            GpuFit(
                key=spec.key,
                name=spec.name,
                mem_bytes=capacity,
                usable_bytes=usable,
                count=count,
                per_gpu_bytes=-(-memory.total_bytes // count),
                price_micros_per_hour=price.per_gpu_micros * count if price else None,
                price_source=price.label if price else None,
            )
        )
    fits.sort(key=lambda f: (f.count, _price_key(f.price_micros_per_hour), f.mem_bytes, f.key))
    return FitReport(
        shape,
        mode.lower(),
        seq,
        batch,
        bits,
        memory,
        tuple(fits),
        tuple(too_big),
        currency=table.currency,
    )


def estimate(
    gpu: str,
    *,
    hours: Decimal,
    count: int = 1,
    hourly_micros: int | None = None,
    monthly_micros: int | None = None,
    buy_micros: int | None = None,
    table: PriceTable | None = None,
    currency: str | None = None,
) -> EstimateReport:
    """`/gpu estimate`: ``count`` cards used ``hours`` a month each, rented by the hour vs on a
    monthly plan, and bought. Every price is **per card**, given or from the table:
    ``hourly_micros`` an hour, ``monthly_micros`` a month of the plan, ``buy_micros`` one card;
    totals are for ``count`` cards. Given prices are in ``currency``; the table's are used only
    when it is the table's currency (or None).

    Raises UsageError for an unknown GPU, a bad count, hours that are not 0 < h <= 744 (the
    hours of a 31-day month), a given price of 0, or no price at all.
    """
    table = table or load_price_table()
    foreign = currency is not None and currency != table.currency
    spec = specs.lookup(gpu)
    if spec is None:
        raise UsageError(
            t("{gpu!r} is not a GPU model I know", gpu=gpu),
            hint=t("Use a model like 4090, a100, h100-sxm, l40s or h200."),
        )
    if not 1 <= count <= 1024:
        raise UsageError(
            t("{option} {value} is out of range", option="--count", value=count),
            hint=t("Give 1 to 1024 GPUs."),
        )
    if not Decimal(0) < hours <= HOURS_IN_LONGEST_MONTH:
        raise UsageError(
            t("--hours {hours} is not hours a month", hours=hours),
            hint=t(
                "--hours is the hours each card is used a month: more than 0, at most "
                "{most} (a 31-day month), like 50 or 400.",
                most=HOURS_IN_LONGEST_MONTH,
            ),
        )
    for option, given in (("--price", hourly_micros), ("--monthly", monthly_micros)):
        _require_positive(option, given)
    _require_positive("--buy", buy_micros)
    missing = (
        t("the price table is in {currency}", currency=table.currency)
        if foreign
        else t("not in the price table")
    )
    hourly, hourly_source = _priced(
        hourly_micros, None if foreign else table.cheapest_hourly(spec.key), missing
    )
    monthly, monthly_source = _priced(
        monthly_micros, None if foreign else table.cheapest_monthly(spec.key), missing
    )
    buy, buy_source = _priced(
        buy_micros, None if foreign else table.purchase_price(spec.key), missing
    )
    if hourly is None and monthly is None and buy is None:
        raise UsageError(
            t(
                "no prices known for {gpu} in {currency} (the price table is in {table})",
                gpu=spec.name,
                currency=currency,
                table=table.currency,
            )
            if foreign
            else t("no prices known for {gpu}", gpu=spec.name),
            hint=t("Give them per card: --price 2.10 (an hour), --monthly 1200, --buy 30000."),
        )
    rent_month = None if hourly is None else _ceil(hours * hourly * count)
    plan_month = _times(monthly, count)
    cards = _cards(count)
    options = (
        Option(
            "hourly",
            rent_month,
            t("{hours} h by the hour, {cards}", hours=_plain(hours), cards=cards),
        ),
        Option("monthly plan", plan_month, t("the plan, {cards}", cards=cards)),
        Option(
            "buy", _times(buy, count), t("{cards} (power and hosting not included)", cards=cards)
        ),
    )
    against = _cheaper_rent(rent_month, plan_month)
    return EstimateReport(
        gpu_key=spec.key,
        gpu_name=spec.name,
        count=count,
        hours=hours,
        hourly_per_card_micros=hourly,
        hourly_source=hourly_source,
        monthly_per_card_micros=monthly,
        monthly_source=monthly_source,
        buy_per_card_micros=buy,
        buy_source=buy_source,
        options=options,
        monthly_break_even_hours=_ratio(monthly, hourly),
        buy_break_even_hours=_ratio(buy, hourly),
        buy_break_even_months=(
            None if buy is None or against is None else _ratio(buy * count, against[1])
        ),
        buy_against=None if against is None else against[0],
    )


def parse_hours(text: str) -> Decimal:
    """``50``, ``1.5``, ``50h`` as hours. Raises UsageError otherwise."""
    raw = text.strip().lower().removesuffix("h")
    try:
        value = Decimal(raw)
    except InvalidOperation as exc:
        raise UsageError(
            t("{text!r} is not a number of hours", text=text), hint=t("Write hours like 50.")
        ) from exc
    if not value.is_finite() or value <= 0:
        raise UsageError(
            t("{text!r} is not a positive number of hours", text=text),
            hint=t("Write hours like 50."),
        )
    return value


def _priced(given: int | None, row: PriceRow | None, missing: str) -> tuple[int | None, str]:
    """A per-card price: the one given, else the table's, else None and why."""
    if given is not None:
        return given, t("as given")
    if row is None:
        return None, missing
    return row.per_gpu_micros, row.label


def _require_positive(option: str, micros: int | None) -> None:
    if micros is not None and micros <= 0:
        raise UsageError(
            t("{option} 0 means nothing to compare", option=option),
            hint=t(
                "Give {option} the price of one card, more than 0, or leave it out.", option=option
            ),
        )


def _cards(count: int) -> str:
    """``one card``, ``2 cards``."""
    return nt("one card", "{n} cards", count, n=count)


def _times(micros: int | None, count: int) -> int | None:
    return None if micros is None else micros * count


def _cheaper_rent(rent_month: int | None, plan_month: int | None) -> tuple[str, int] | None:
    """The cheaper way to rent a month (name, micros), or None when neither is priced."""
    priced = [
        (name, micros)
        for name, micros in (("hourly", rent_month), ("monthly plan", plan_month))
        if micros
    ]
    return min(priced, key=lambda item: item[1]) if priced else None


def _plain(value: Decimal) -> str:
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _ratio(numerator: int | None, per_hour: int | None) -> Decimal | None:
    if numerator is None or not per_hour:
        return None
    return (Decimal(numerator) / Decimal(per_hour)).quantize(Decimal("0.1"))


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def _price_key(price: int | None) -> int:
    return price if price is not None else 2**62


def _weight_bytes(params: int, bits: int) -> int:
    if bits == 4:
        return _ceil(params * NF4_BITS_PER_PARAM / 8)
    return params * bits // 8


def _training_activations(shape: ModelShape, *, seq: int, batch: int) -> int:
    sbh = seq * batch * shape.hidden
    kept = shape.layers * 2 * sbh
    recomputed = sbh * 34 + 5 * shape.heads * seq * seq * batch
    return kept + recomputed


def _cheapest(rows: Any) -> PriceRow | None:
    found = list(rows)
    return min(found, key=lambda row: (row.per_gpu_micros, row.platform)) if found else None


def _model_key(name: str) -> str:
    key = re.sub(r"\s+", "-", name.strip().lower())
    for suffix in _NAME_SUFFIXES:
        key = key.removesuffix(suffix)
    return key


@cache
def _load_price_table() -> PriceTable:
    raw = resources.files("bot").joinpath("data/prices.json").read_text(encoding="utf-8")
    data = json.loads(raw)
    currency = str(data.get("currency", "USD"))
    try:
        return PriceTable(
            currency=currency,
            hourly=tuple(price_row(item, "per_hour", currency) for item in data["hourly"]),
            monthly=tuple(price_row(item, "per_month", currency) for item in data["monthly"]),
            purchase=tuple(price_row(item, "price", currency) for item in data["purchase"]),
            models=tuple(
                ModelShape(
                    name=name,
                    params=int(item["params"]),
                    layers=int(item["layers"]),
                    hidden=int(item["hidden"]),
                    heads=int(item["heads"]),
                    kv_heads=int(item["kv_heads"]),
                    head_dim=int(item["head_dim"]),
                )
                for name, item in data["models"].items()
            ),
        )
    except (KeyError, TypeError, UsageError) as exc:
        raise ValueError(f"bot/data/prices.json is malformed: {exc}") from exc


def price_row(item: dict[str, Any], price_field: str, currency: str) -> PriceRow:
    """One row of a price file; ``price_field`` names its price in ``currency``. Raises
    KeyError, TypeError or UsageError for a malformed row."""
    return PriceRow(
        platform=str(item.get("platform", LIST_PRICE)),
        offer=str(item.get("offer", ONE_CARD)),
        gpu=str(item["gpu"]),
        count=int(item.get("count", 1)),
        micros=parse_money(str(item[price_field]), currency),
        source=str(item["source"]),
        as_of=str(item["as_of"]),
        verified=item.get("verified") is True,
        note=str(item.get("note", "")),
    )
