"""Sizing and buying advice against published figures."""

from __future__ import annotations

import json
from decimal import Decimal
from importlib import resources

import pytest

from agents import specs
from bot.errors import UsageError
from bot.providers.names import platform_name
from bot.services.money import advice

GB = 1_000_000_000
GIB = 1024**3


def by_key(report: advice.FitReport) -> dict[str, advice.GpuFit]:
    return {fit.key: fit for fit in report.fits}


def test_7b_fp16_weights_are_about_14_gb() -> None:
    report = advice.fit("7b", "inference")
    assert report.memory.weights_bytes == 14 * GB
    assert report.bits == 16
    assert report.memory.optimizer_bytes == report.memory.gradients_bytes == 0
    # A 24 GB card holds it; a 16 GB T4 does not, alone.
    assert by_key(report)["rtx-4090"].count == 1
    assert by_key(report)["t4"].count == 2


def test_kv_cache_per_token_matches_published_figures() -> None:
    """Llama-3.1-8B bf16: 128 KiB per token (GQA, 8 KV heads); Llama-2-7B: 512 KiB."""
    table = advice.load_price_table()
    llama3 = advice.parse_size("llama-3.1-8b", table)
    llama2 = advice.parse_size("Llama-2-7B-hf", table)
    one_token = {"seq": 1, "batch": 1, "bits": 16}
    assert advice.estimate_memory(llama3, "inference", **one_token).kv_cache_bytes == 128 * 1024
    assert advice.estimate_memory(llama2, "inference", **one_token).kv_cache_bytes == 512 * 1024
    long = advice.estimate_memory(llama3, "inference", seq=8192, batch=4, bits=16)
    assert long.kv_cache_bytes == 128 * 1024 * 8192 * 4


def test_70b_full_fine_tune_needs_well_over_a_terabyte() -> None:
    report = advice.fit("70b", "full")
    assert report.memory.total_bytes > 1_100 * GB
    assert report.memory.optimizer_bytes == 70 * GB * 12
    fits = by_key(report)
    # Many 80 GB cards: more than a single 8-GPU server holds.
    assert fits["h100-sxm"].count >= 14
    assert fits["a100-sxm4-80gb"].count == fits["h100-sxm"].count
    assert fits["h100-sxm"].per_gpu_bytes <= fits["h100-sxm"].mem_bytes
    assert "t4" not in fits  # more than 64 T4s: listed as too big instead
    assert "t4" in report.too_big


def test_qlora_65b_fits_one_48_gb_gpu() -> None:
    """Dettmers et al. 2023: QLoRA fine-tunes a 65B model on a single 48 GB GPU (here at a
    2048-token sequence; the default 4096 needs more activation memory)."""
    report = advice.fit("llama-65b", "qlora", seq=2048)
    assert report.bits == 4
    assert report.memory.total_bytes < 48 * GIB
    assert by_key(report)["l40s"].count == 1
    # The same model in 16-bit LoRA does not.
    assert by_key(advice.fit("llama-65b", "lora", seq=2048))["l40s"].count >= 3
    assert advice.fit("llama-65b", "qlora").memory.total_bytes > 48 * GB


def test_fits_are_priced_from_the_table() -> None:
    report = advice.fit("7b", "inference")
    fits = by_key(report)
    table = advice.load_price_table()
    row = table.cheapest_hourly("rtx-4090")
    assert row is not None
    assert fits["rtx-4090"].price_micros_per_hour == row.per_gpu_micros
    assert fits["rtx-4090"].price_source is not None
    assert fits["h20"].price_micros_per_hour is None
    assert report.fits[0].count == 1


def test_full_fine_tune_7b_needs_two_80_gb_cards_or_one_h200() -> None:
    fits = by_key(advice.fit("7b", "full"))
    assert fits["h100-sxm"].count == 2
    assert fits["h200-sxm"].count == 1


def test_generic_sizes_borrow_the_closest_shape() -> None:
    shape = advice.parse_size("1.5b")
    assert shape.params == 1_500_000_000
    assert not shape.known
    assert shape.shape_from == "qwen2.5-1.5b"
    assert advice.parse_size("500M").params == 500_000_000


def test_longer_sequences_need_more_activation_memory() -> None:
    short = advice.fit("7b", "lora", seq=512)
    long = advice.fit("7b", "lora", seq=8192)
    assert long.memory.activations_bytes > 10 * short.memory.activations_bytes
    assert advice.fit("7b", "lora", bits=8).memory.weights_bytes < short.memory.weights_bytes


@pytest.mark.parametrize(
    ("size", "mode", "kwargs", "message"),
    [
        ("7x", "lora", {}, "not a model size"),
        ("7b", "pretrain", {}, "not a mode"),
        ("7b", "full", {"bits": 4}, "full fine-tune"),
        ("7b", "qlora", {"bits": 16}, "4-bit"),
        ("7b", "lora", {"bits": 3}, "not supported"),
        ("7b", "lora", {"seq": 0}, "--seq"),
        ("7b", "lora", {"batch": 0}, "--batch"),
        ("0.001b", "lora", {}, "out of range"),
    ],
)
def test_bad_fit_input_is_refused(
    size: str, mode: str, kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        advice.fit(
            size, mode, seq=kwargs.get("seq"), batch=kwargs.get("batch"), bits=kwargs.get("bits")
        )


def test_estimate_hourly_monthly_buy_with_break_even() -> None:
    report = advice.estimate(
        "4090",
        hours=Decimal(500),
        hourly_micros=500_000,
        monthly_micros=300_000_000,
        buy_micros=2_000_000_000,
    )
    costs = {option.name: option.cost_micros for option in report.options}
    assert costs == {"hourly": 250_000_000, "monthly plan": 300_000_000, "buy": 2_000_000_000}
    assert report.monthly_break_even_hours == Decimal(600)
    assert report.buy_break_even_hours == Decimal(4000)
    assert report.cheapest is not None
    assert report.cheapest.name == "hourly"
    # --hours is each card's use a month: a plan is paid once a month, and no month has more
    # than 744 hours.
    busy = advice.estimate(
        "4090", hours=Decimal(731), hourly_micros=500_000, monthly_micros=300_000_000
    )
    assert {o.name: o.cost_micros for o in busy.options}["monthly plan"] == 300_000_000
    with pytest.raises(UsageError, match="--hours 745 is not hours a month"):
        advice.estimate("4090", hours=Decimal(745), hourly_micros=500_000)


def test_estimate_uses_the_table_scaled_to_the_count() -> None:
    table = advice.load_price_table()
    row = table.cheapest_hourly("h100-sxm")
    assert row is not None
    report = advice.estimate("h100", hours=Decimal(10), count=4)
    assert report.gpu_key == "h100-sxm"
    assert report.hourly_micros == row.per_gpu_micros * 4
    assert report.hourly_source.startswith(platform_name(row.platform))


def test_estimate_refuses_unknown_gpus_and_missing_prices() -> None:
    with pytest.raises(UsageError, match="not a GPU model"):
        advice.estimate("voodoo5", hours=Decimal(1))
    assert specs.lookup("h20") is not None
    with pytest.raises(UsageError, match="no prices known"):
        advice.estimate("h20", hours=Decimal(1))
    with pytest.raises(UsageError, match="--count"):
        advice.estimate("4090", hours=Decimal(1), count=0)
    with pytest.raises(UsageError, match="not a number of hours"):
        advice.parse_hours("lots")
    assert advice.parse_hours("12.5h") == Decimal("12.5")


def test_price_table_rows_carry_source_and_date() -> None:
    table = advice.load_price_table()
    catalogue = {spec.key for spec in specs.load_catalogue()}
    for row in (*table.hourly, *table.monthly, *table.purchase):
        assert row.gpu in catalogue, row
        assert row.source
        assert len(row.as_of) == 10
        assert row.micros > 0
    assert table.model("llama-3.1-70b") is not None


def test_price_rows_say_whether_they_were_checked() -> None:
    raw = json.loads(resources.files("bot").joinpath("data/prices.json").read_text("utf-8"))
    for section in ("hourly", "monthly", "purchase"):
        for item in raw[section]:
            assert isinstance(item.get("verified"), bool), item
            assert item.get("note"), item
    table = advice.load_price_table()
    unchecked = [row for row in table.hourly if not row.verified]
    assert unchecked
    assert all(row.label.endswith(", unverified") for row in unchecked)


def test_unverified_prices_are_labelled_in_fit_and_estimate() -> None:
    report = advice.fit("7b", "inference")
    priced = [fit for fit in report.fits if fit.price_source]
    assert priced
    assert all("unverified" in str(fit.price_source) for fit in priced)
    estimate = advice.estimate("4090", hours=Decimal(10))
    assert estimate.hourly_source.endswith(", unverified")


def test_estimate_in_another_currency_needs_given_prices() -> None:
    with pytest.raises(UsageError, match="in EUR \\(the price table is in USD\\)"):
        advice.estimate("4090", hours=Decimal(10), currency="EUR")
    report = advice.estimate(
        "4090", hours=Decimal(10), hourly_micros=600_000, buy_micros=1_700_000_000, currency="EUR"
    )
    assert report.hourly_source == "as given"
    assert report.monthly_micros is None
    assert report.monthly_source == "the price table is in USD"
    assert advice.estimate("4090", hours=Decimal(10), currency="USD").hourly_micros == 690_000


# --- `/gpu estimate --count`: prices per card ------------------------------------------------


def test_given_prices_are_per_card_and_multiplied_by_the_count() -> None:
    one = advice.estimate(
        "4090", hours=Decimal(100), hourly_micros=500_000, buy_micros=1_800_000_000
    )
    two = advice.estimate(
        "4090", hours=Decimal(100), count=2, hourly_micros=500_000, buy_micros=1_800_000_000
    )
    costs = {option.name: option.cost_micros for option in two.options}
    assert costs["hourly"] == 2 * 100 * 500_000
    assert costs["buy"] == 2 * 1_800_000_000
    assert two.hourly_per_card_micros == one.hourly_per_card_micros == 500_000
    assert two.buy_micros == 2 * one.buy_micros  # type: ignore[operator]
    # The break-even is the same per card whatever the count.
    assert two.buy_break_even_hours == one.buy_break_even_hours == Decimal(3600)
    assert all("one card" not in option.detail for option in two.options)
    assert "2 cards" in {o.name: o.detail for o in two.options}["buy"]


def test_a_plan_dearer_than_a_month_around_the_clock_never_pays_off() -> None:
    report = advice.estimate(
        "a100-sxm4-80gb", hours=Decimal(50), hourly_micros=869_000, monthly_micros=1015 * 10**6
    )
    assert report.monthly_break_even_hours == Decimal("1168.0")
    assert report.plan_never_pays
    fine = advice.estimate(
        "4090", hours=Decimal(50), hourly_micros=500_000, monthly_micros=300_000_000
    )
    assert not fine.plan_never_pays


def test_buying_pays_off_in_months_at_the_users_pace() -> None:
    report = advice.estimate(
        "a100-sxm4-80gb", hours=Decimal(50), hourly_micros=1_740_000, buy_micros=4031 * 10**6
    )
    assert report.buy_break_even_hours == Decimal("2316.7")
    assert report.buy_break_even_months == Decimal("46.3")
    assert report.buy_against == "hourly"


@pytest.mark.parametrize("option", ["hourly_micros", "monthly_micros", "buy_micros"])
def test_a_price_of_zero_is_refused(option: str) -> None:
    flag = {"hourly_micros": "--price", "monthly_micros": "--monthly", "buy_micros": "--buy"}
    with pytest.raises(UsageError, match=f"^{flag[option]} 0 means nothing") as err:
        advice.estimate("4090", hours=Decimal(10), **{option: 0})  # type: ignore[arg-type]
    assert "more than 0" in (err.value.hint or "")


# --- `/gpu fit`: decimal gigabytes and a reserve per card -------------------------------------


def test_catalogue_gigabytes_are_decimal_and_a_reserve_is_kept() -> None:
    t4 = specs.lookup("t4")
    assert t4 is not None
    capacity = advice.capacity_bytes(t4)
    assert capacity == 16 * GB  # 14.9 GiB, not 16
    reserve = advice.CUDA_CONTEXT_BYTES + int(capacity * advice.FRAGMENTATION_FRACTION)
    assert advice.usable_bytes(capacity) == capacity - reserve
    assert advice.usable_bytes(capacity) < 14 * GIB


def test_7b_lora_does_not_fit_one_t4() -> None:
    report = advice.fit("7b", "lora")
    t4 = by_key(report)["t4"]
    assert report.memory.total_bytes > t4.usable_bytes
    assert t4.count == 2
    assert t4.per_gpu_bytes <= t4.usable_bytes < t4.mem_bytes
    assert by_key(report)["rtx-4090"].count == 1
