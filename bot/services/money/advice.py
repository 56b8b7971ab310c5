"""Sizing and buying advice: `/gpu fit` and `/gpu estimate`. Pure functions over the GPU spec
catalogue (agents.specs) and the price table (bot/data/prices.json).

`/gpu fit` follows the arithmetic of the Chinese GPU-rental guides the product was written from
(their 显存估算 sections), made explicit part by part (bytes):

- weights = parameters x bytes per parameter: 16-bit 2 ("a 7B model in FP16 needs about 14 GB
  for its weights"), 8-bit 1, 4-bit 0.5 ("4-bit quantisation, about 0.5 byte a parameter: about
  3.5 GB") plus the quantisation constants, 0.127 bits a parameter (QLoRA's double-quantised
  NF4);
- KV cache (inference only) = 2 (K and V) x layers x KV width x context x batch x 2 bytes (a
  16-bit cache). The KV width is the hidden size where every attention head keeps its own K and
  V (Llama-2-7B, Llama-2-13B); models with grouped-query attention keep fewer (hidden / heads x
  KV heads: Llama-3, Llama-2-70B, Qwen2.5). The shapes by size are in :data:`SIZE_SHAPES`;
- activations: for training only, with activation checkpointing (Korthikanti et al. 2022): each
  layer keeps its 16-bit input, 2·s·b·h bytes, and one layer at a time is recomputed in full,
  s·b·h·(34 + 5·a·s/h) bytes. Inference's own buffers are small and left to the headroom;
- LoRA (the guides: back-propagation keeps the activations, and the optimizer state takes
  more): the frozen base at its precision plus adapters of 0.5% of the parameters (rank 16 on
  every linear layer) at 16 bytes each (fp32 weights 4, gradients 4, AdamW 8); QLoRA the same
  on a 4-bit base;
- full fine-tune with AdamW in mixed precision: 16 bytes a parameter (Rajbhandari et al. 2020,
  ZeRO; EleutherAI's transformer math): 16-bit weights 2 + gradients 2 + fp32 master weights,
  momentum and variance 12: eight times the 16-bit weights, past the guides' "3 to 4 times the
  weights or more", and their "70B full fine-tune: at least 8 cards of 80 GB";
- headroom: the guides add "20% to 50%" on top for what the estimate leaves out ("通常还要加 20%
  到 50% 的余量"); :data:`DEFAULT_HEADROOM_PCT` is the low end, ``--headroom`` the user's choice.

What the estimate needs decides how many GPUs hold it; the headroom decides whether that is
comfortable or tight (the guides' 从容 and 吃紧: "8 GB for a quantised 7B is tight, 16 GB is
comfortable"; "LoRA on a 7B or 13B model is a little tight on a 4090"). So 70B in 16 bits
(140 GB of weights plus its KV cache) fits two 80 GB cards, tightly, as the guides put it.

GPUs needed: model state and activations split evenly across GPUs (FSDP / tensor parallel), each
GPU holding its share in its **usable** memory: the catalogue's capacity, published in decimal
gigabytes (10^9 bytes: a "16 GB" T4 is 14.9 GiB), less a reserve on every GPU of
``CUDA_CONTEXT_BYTES`` (0.5 GiB: the CUDA context with cuBLAS and cuDNN loaded) and
``FRAGMENTATION_FRACTION`` (5% of the capacity: the caching allocator's fragmentation and
workspaces). 5%, not more, keeps the published QLoRA result (a 65B model fine-tuned on one
48 GB card) inside the model.

Several models on one card (the guides' Ollama case: "a 4090 has 24 GB; a quantised 7B takes 6
to 8 GB, and loading a 13B model as well easily passes 24 GB") are one question: their needs
add up.

Why one module of this size: most of it is the guides' arithmetic written out (model sizes,
precisions, optimiser states, activations, KV cache, several models on one card), each rule
with its source; splitting it would separate the rules from the table they fill.
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
from bot.providers.names import platform_name
from bot.values import parse_money

GIB = 1024**3
GB = 1_000_000_000
MODES = ("inference", "lora", "qlora", "full")
#: The words a mode is asked for with, English and Chinese (推理 inference, 微调 fine-tune: LoRA,
#: 全量 a full fine-tune).
MODE_WORDS = {
    "inference": "inference",
    "infer": "inference",
    "serve": "inference",
    "推理": "inference",
    "部署": "inference",
    "lora": "lora",
    "微调": "lora",
    "lora微调": "lora",
    "qlora": "qlora",
    "qlora微调": "qlora",
    "full": "full",
    "全量": "full",
    "全量微调": "full",
    "全参": "full",
    "全参数微调": "full",
}
#: The context length, in tokens, when none is given: Ollama's default context window, and a
#: common fine-tuning cut-off.
DEFAULT_CONTEXT = 4096
DEFAULT_SEQ = DEFAULT_CONTEXT
DEFAULT_BATCH = 1
#: The guides' advice: "通常还要加 20% 到 50% 的余量"; the low end unless told.
DEFAULT_HEADROOM_PCT = 20
MAX_HEADROOM_PCT = 200
#: The most models one `/gpu fit` adds up.
MAX_MODELS = 8
#: Kept free on every GPU for the CUDA context (see the module docstring).
CUDA_CONTEXT_BYTES = GIB // 2
#: Kept free on every GPU for fragmentation and workspaces, as a share of its capacity.
FRAGMENTATION_FRACTION = Decimal("0.05")
#: The KV cache's bytes per value (a 16-bit cache).
KV_BYTES = 2
LORA_TRAINABLE_FRACTION = Decimal("0.005")
LORA_BYTES_PER_TRAINABLE = 16
FULL_BYTES_PER_PARAM = {"weights": 2, "gradients": 2, "optimizer": 12}
NF4_BITS_PER_PARAM = Decimal("4.127")
HOURS_PER_MONTH = 730
#: The hours of a 31-day month: the most a card can be used in one.
HOURS_IN_LONGEST_MONTH = 744
MAX_GPUS_SHOWN = 64
#: The cards the guides name (3090, 4090, 5090, A100, A800, H20): an answer names each that
#: holds the model, however many cheaper ones there are.
GUIDE_GPUS = (
    "rtx-3090",
    "rtx-4090",
    "rtx-5090",
    "a100-sxm4-80gb",
    "a800-sxm4-80gb",
    "h20",
)
#: A model size's shape: the model whose published config stands for it. Layers, hidden size and
#: KV width (hidden / heads x KV heads), from each model's config.json on Hugging Face (as
#: bot/data/prices.json names them; LLaMA-65B from Touvron et al. 2023, table 2):
#:
#: ====  ==============  ======  ======  ========
#: size  model           layers  hidden  KV width
#: ====  ==============  ======  ======  ========
#: 0.5B  qwen2.5-0.5b        24     896       128
#: 1B    llama-3.2-1b        16    2048       512
#: 1.5B  qwen2.5-1.5b        28    1536       256
#: 3B    llama-3.2-3b        28    3072      1024
#: 7B    llama-2-7b          32    4096      4096
#: 8B    llama-3.1-8b        32    4096      1024
#: 9B    gemma-2-9b          42    3584      2048
#: 13B   llama-2-13b         40    5120      5120
#: 14B   qwen2.5-14b         48    5120      1024
#: 27B   gemma-2-27b         46    4608      2048
#: 32B   qwen2.5-32b         64    5120      1024
#: 65B   llama-65b           80    8192      8192
#: 70B   llama-3.1-70b       80    8192      1024
#: 72B   qwen2.5-72b         80    8192      1024
#: 405B  llama-3.1-405b     126   16384      1024
#: ====  ==============  ======  ======  ========
#:
#: A size given this way keeps its round parameter count (7B is 7 x 10^9). Any other size is
#: estimated from the listed size nearest to it, and the answer says so.
SIZE_SHAPES = {
    "0.5b": "qwen2.5-0.5b",
    "1b": "llama-3.2-1b",
    "1.5b": "qwen2.5-1.5b",
    "3b": "llama-3.2-3b",
    "7b": "llama-2-7b",
    "8b": "llama-3.1-8b",
    "9b": "gemma-2-9b",
    "13b": "llama-2-13b",
    "14b": "qwen2.5-14b",
    "27b": "gemma-2-27b",
    "32b": "qwen2.5-32b",
    "65b": "llama-65b",
    "70b": "llama-3.1-70b",
    "72b": "qwen2.5-72b",
    "405b": "llama-3.1-405b",
}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([bm])$")
#: A precision after a model (``7b:4bit``, ``13b:q4_K_M``, ``70b:fp16``): its bits.
_BITS = re.compile(r"^(?:fp|bf|int|q)?(16|8|4)(?:[-_]?bits?|_[a-z0-9_]+)?$")
_NAME_SUFFIXES = ("-instruct", "-chat", "-hf", "-base", "-it")
#: Where a price table row names no platform or offer (a card's list price).
LIST_PRICE = N_("list price")
ONE_CARD = "one card"


@dataclass(frozen=True)
class ModelShape:
    """A transformer's size and shape. ``known`` is False for a bare size like ``7b``, whose
    shape is borrowed from another model (``shape_from``): the one :data:`SIZE_SHAPES` lists
    for that size, or, where ``estimated``, the listed size nearest to it."""

    name: str
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    known: bool = True
    shape_from: str | None = None
    estimated: bool = False

    @property
    def kv_width(self) -> int:
        """The K (or V) values a layer stores per token: the hidden size, or less under
        grouped-query attention."""
        return self.kv_heads * self.head_dim


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

    def __add__(self, other: MemoryBreakdown) -> MemoryBreakdown:
        return MemoryBreakdown(
            self.weights_bytes + other.weights_bytes,
            self.kv_cache_bytes + other.kv_cache_bytes,
            self.optimizer_bytes + other.optimizer_bytes,
            self.gradients_bytes + other.gradients_bytes,
            self.activations_bytes + other.activations_bytes,
        )


@dataclass(frozen=True)
class ModelNeed:
    """One model of a `/gpu fit` question: its shape, precision and memory (bytes)."""

    model: ModelShape
    bits: int
    memory: MemoryBreakdown


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
        platform = t(LIST_PRICE) if self.platform == LIST_PRICE else platform_name(self.platform)
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
    model, ``per_gpu_bytes`` what each of the ``count`` GPUs needs. ``comfortable_count`` GPUs
    hold the estimate with the headroom as well; 0 where that is more than
    :data:`MAX_GPUS_SHOWN`."""

    key: str
    name: str
    mem_bytes: int
    usable_bytes: int
    count: int
    per_gpu_bytes: int
    price_micros_per_hour: int | None
    price_source: str | None
    comfortable_count: int = 0

    @property
    def tight(self) -> bool:
        """True when ``count`` GPUs hold the estimate but not the headroom (the guides'
        吃紧)."""
        return self.comfortable_count != self.count


@dataclass(frozen=True)
class FitReport:
    """The answer to `/gpu fit`: the estimate and the GPUs that hold it, fewest GPUs first.

    ``model`` and ``bits`` are the (first) model's; ``models`` lists every model where several
    share the GPUs (empty for one), and ``memory`` is then their sum. ``headroom_pct`` is the
    margin on top of ``memory`` for a comfortable fit."""

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
    headroom_pct: int = DEFAULT_HEADROOM_PCT
    models: tuple[ModelNeed, ...] = ()

    @property
    def advised_bytes(self) -> int:
        """The estimate with the headroom: what a comfortable fit holds (bytes)."""
        return with_headroom(self.memory.total_bytes, self.headroom_pct)

    @property
    def each(self) -> tuple[ModelNeed, ...]:
        """Every model asked for, with its own need; the one model where there is one."""
        return self.models or (ModelNeed(self.model, self.bits, self.memory),)


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
    """``7b``, ``70B``, ``1.5b``, ``500m``, a known model name (``llama-3.1-8b``, Ollama's
    ``qwen2.5:7b``) as a ModelShape. A size :data:`SIZE_SHAPES` lists takes that model's shape;
    another is estimated from the nearest listed size.

    Raises UsageError naming the accepted forms and some known models.
    """
    table = table or load_price_table()
    known = table.model(text) or table.model(text.replace(":", "-"))
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
    label = f"{_plain(number)}{match.group(2)}"
    listed = table.model(SIZE_SHAPES.get(label, ""))
    shape = listed or min(
        (shape for size in SIZE_SHAPES.values() if (shape := table.model(size)) is not None),
        key=lambda shape: abs(math.log(shape.params / params)),
    )
    return ModelShape(
        name=label.upper(),
        params=params,
        layers=shape.layers,
        hidden=shape.hidden,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        known=False,
        shape_from=shape.name,
        estimated=listed is None,
    )


def parse_mode(text: str | None) -> str:
    """A mode from how it is asked for: ``inference`` (推理), ``lora`` (微调, LoRA), ``qlora``,
    ``full`` (全量, 全量微调); inference when None. Raises UsageError for anything else."""
    if text is None:
        return "inference"
    mode = MODE_WORDS.get(text.strip().lower())
    if mode is None:
        raise UsageError(
            t("{mode!r} is not a mode", mode=text),
            hint=t("Use one of: {choices}.", choices=", ".join((*MODES, "推理", "微调", "全量"))),
        )
    return mode


def parse_bits(text: str) -> int:
    """A precision as bits: ``16``, ``fp16``, ``bf16``, ``8bit``, ``int8``, ``4bit``, ``4-bit``,
    ``int4``, ``q4``, ``q4_K_M``. Raises UsageError otherwise."""
    match = _BITS.match(text.strip().lower())
    if match is None:
        raise UsageError(
            t("{text!r} is not a precision", text=text),
            hint=t("Write 16bit, 8bit or 4bit (fp16, int8, q4 also do)."),
        )
    return int(match.group(1))


def parse_models(
    text: str, table: PriceTable | None = None
) -> tuple[tuple[ModelShape, int | None], ...]:
    """``7b``, ``7b:4bit``, ``7b:4bit+13b:4bit``: the models to hold together, each with its
    precision where given (None: the mode's or ``--bits``). Raises UsageError for a bad model
    or precision, or more than :data:`MAX_MODELS` models."""
    table = table or load_price_table()
    items = [item.strip() for item in text.split("+")]
    if len(items) > MAX_MODELS:
        raise UsageError(
            t("{count} models is too many for one question", count=len(items)),
            hint=t("Ask about at most {most} models at a time.", most=MAX_MODELS),
        )
    found: list[tuple[ModelShape, int | None]] = []
    for item in items:
        if not item:
            raise UsageError(
                t("{text!r} has an empty model", text=text),
                hint=t("Join models with +, like 7b:4bit+13b:4bit."),
            )
        name, _, suffix = item.rpartition(":")
        if name and _BITS.match(suffix.strip().lower()):
            found.append((parse_size(name, table), parse_bits(suffix)))
        else:
            found.append((parse_size(item, table), None))
    return tuple(found)


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
    return bits or 16


def kv_cache_bytes(shape: ModelShape, *, seq: int, batch: int) -> int:
    """2 (K and V) x layers x KV width x ``seq`` tokens x ``batch`` x 2 bytes (a 16-bit cache)."""
    return 2 * shape.layers * shape.kv_width * seq * batch * KV_BYTES


def estimate_memory(
    shape: ModelShape, mode: str, *, seq: int, batch: int, bits: int
) -> MemoryBreakdown:
    """Memory for ``mode`` at ``seq`` tokens x ``batch`` with ``bits``-bit weights (bytes):
    inference holds weights and the KV cache; training holds activations, LoRA adapters with
    their gradients and optimizer state, a full fine-tune all of them for every parameter."""
    weights = _weight_bytes(shape.params, bits)
    if mode == "inference":
        return MemoryBreakdown(weights, kv_cache_bytes(shape, seq=seq, batch=batch), 0, 0, 0)
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


def with_headroom(size: int, headroom_pct: int) -> int:
    """``size`` bytes plus ``headroom_pct`` percent of it (rounded up)."""
    return -(-size * (100 + headroom_pct) // 100)


def capacity_bytes(spec: specs.GpuSpec) -> int:
    """A catalogue GPU's memory in bytes: its published gigabytes are decimal (10^9 bytes)."""
    return spec.mem_gb * GB


def usable_bytes(capacity: int) -> int:
    """What a GPU of ``capacity`` bytes holds for the model: the capacity less the CUDA context
    (0.5 GiB) and 5% for fragmentation; 0 when nothing is left."""
    reserve = CUDA_CONTEXT_BYTES + _ceil(capacity * FRAGMENTATION_FRACTION)
    return max(0, capacity - reserve)


def gpus_needed(memory: MemoryBreakdown | int, usable: int) -> int:
    """How many GPUs with ``usable`` bytes each hold ``memory`` (a breakdown or bytes) split
    evenly; 0 for none."""
    total = memory if isinstance(memory, int) else memory.total_bytes
    if usable <= 0:
        return 0
    return max(1, -(-total // usable))


def fit(
    size: str,
    mode: str | None = None,
    *,
    seq: int | None = None,
    batch: int | None = None,
    bits: int | None = None,
    headroom_pct: int | None = None,
    table: PriceTable | None = None,
    catalogue: tuple[specs.GpuSpec, ...] | None = None,
) -> FitReport:
    """`/gpu fit`: the memory estimate and, per GPU model, how many hold it, whether with the
    headroom (comfortable) or only without it (tight), and their price. ``size`` is one model
    or several joined with ``+`` to be held together (:func:`parse_models`); ``bits`` applies
    to those that give none; ``mode`` is one of :data:`MODE_WORDS` (inference when None);
    ``seq`` the context in tokens (default :data:`DEFAULT_CONTEXT`); ``headroom_pct`` the
    margin (default :data:`DEFAULT_HEADROOM_PCT`).

    Raises UsageError for a bad size, mode, precision, context, batch or headroom.
    """
    table = table or load_price_table()
    mode = parse_mode(mode)
    seq = DEFAULT_CONTEXT if seq is None else seq
    batch = DEFAULT_BATCH if batch is None else batch
    headroom = DEFAULT_HEADROOM_PCT if headroom_pct is None else headroom_pct
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
    if not 0 <= headroom <= MAX_HEADROOM_PCT:
        raise UsageError(
            t("{option} {value} is out of range", option="--headroom", value=headroom),
            hint=t(
                "Give a percentage from 0 to {most}; the usual advice is 20 to 50.",
                most=MAX_HEADROOM_PCT,
            ),
        )
    needs = tuple(
        ModelNeed(
            shape,
            chosen := resolve_bits(mode, own if own is not None else bits),
            estimate_memory(shape, mode, seq=seq, batch=batch, bits=chosen),
        )
        for shape, own in parse_models(size, table)
    )
    memory = needs[0].memory
    for need in needs[1:]:
        memory = memory + need.memory
    advised = with_headroom(memory.total_bytes, headroom)
    fits: list[GpuFit] = []
    too_big: list[str] = []
    for spec in catalogue or specs.load_catalogue():
        capacity = capacity_bytes(spec)
        usable = usable_bytes(capacity)
        count = gpus_needed(memory, usable)
        if count == 0 or count > MAX_GPUS_SHOWN:
            too_big.append(spec.key)
            continue
        comfortable = gpus_needed(advised, usable)
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
                comfortable_count=comfortable if comfortable <= MAX_GPUS_SHOWN else 0,
            )
        )
    fits.sort(key=lambda f: (f.count, _price_key(f.price_micros_per_hour), f.mem_bytes, f.key))
    return FitReport(
        needs[0].model,
        mode,
        seq,
        batch,
        needs[0].bits,
        memory,
        tuple(fits),
        tuple(too_big),
        currency=table.currency,
        headroom_pct=headroom,
        models=needs if len(needs) > 1 else (),
    )


def parse_headroom(text: str) -> int:
    """``30``, ``30%`` as a whole percentage from 0 to :data:`MAX_HEADROOM_PCT`. Raises
    UsageError otherwise."""
    raw = text.strip().removesuffix("%").removesuffix("\uff05")
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_HEADROOM_PCT:
        raise UsageError(
            t("--headroom {value!r} is not a percentage", value=text[:20]),
            hint=t(
                "Give a percentage from 0 to {most}; the usual advice is 20 to 50.",
                most=MAX_HEADROOM_PCT,
            ),
        )
    return int(raw)


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
