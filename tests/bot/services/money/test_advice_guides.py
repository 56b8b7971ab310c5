"""`/gpu fit` against the figures of the Chinese GPU-rental guides the product was written from
(their 显存估算 sections), and the published shapes the KV cache is counted from."""

from __future__ import annotations

import inspect
import json
import re

import pytest

from bot.blocks import money
from bot.errors import UsageError
from bot.i18n import speaking
from bot.notify import Message
from bot.services.money import advice
from tests.bot.blocks.slack_limits import check_message

GB = 1_000_000_000
GIB = 1024**3


def validate(message: Message) -> str:
    """The message checked against Slack's rules; all its text as JSON."""
    blocks = check_message(message)
    return message[0] + json.dumps(blocks, ensure_ascii=False)


def by_key(report: advice.FitReport) -> dict[str, advice.GpuFit]:
    return {fit.key: fit for fit in report.fits}


# --- the guides' figures, one row each ----------------------------------------------------------


def test_7b_in_16_bits_is_about_14_gb_of_weights() -> None:
    """ "7B 参数, FP16 精度下每个参数占 2 字节, 那么权重本身约需要 14GB"; 4-bit "约 3.5GB"."""
    assert advice.fit("7b", "inference").memory.weights_bytes == 14 * GB
    four = advice.fit("7b", "inference", bits=4).memory.weights_bytes
    assert 3.5 * GB <= four <= 3.7 * GB  # 0.5 byte a parameter plus NF4's constants


def test_7b_4bit_inference_takes_6_to_8_gb() -> None:
    """ "一个 7B 参数的模型, 哪怕用 4bit 量化, 推理时也经常需要 6GB 到 8GB 显存"."""
    report = advice.fit("7b", "inference", bits=4)
    assert 6 * GB <= report.advised_bytes <= 8 * GB
    assert report.memory.total_bytes < report.advised_bytes
    # At the guides' upper headroom it is still about 8 GB, not more.
    upper = advice.fit("7b", "inference", bits=4, headroom_pct=50)
    assert upper.advised_bytes <= 9 * GB


def test_13b_lora_is_tight_on_a_4090() -> None:
    """ "对 7B 或 13B 模型做 LoRA, 4090 就有点吃紧": on an 8-bit base one 4090 holds it without
    the headroom; a 16-bit base (26 GB of weights alone) takes two."""
    report = advice.fit("13b", "lora", bits=8)
    rtx4090 = by_key(report)["rtx-4090"]
    assert rtx4090.count == 1
    assert rtx4090.tight
    assert rtx4090.comfortable_count == 2
    assert report.memory.total_bytes <= rtx4090.usable_bytes < report.advised_bytes
    assert by_key(advice.fit("13b", "lora"))["rtx-4090"].count == 2


def test_7b_lora_is_tight_on_a_4090_and_comfortable_on_a_5090() -> None:
    """ "7B 模型做 LoRA 微调, 24GB 显存是比较稳妥的起点"; "7B 到 14B ... LoRA 微调, 那么 4090 或
    5090 通常够用"."""
    fits = by_key(advice.fit("7b", "lora"))
    assert fits["rtx-4090"].count == 1
    assert fits["rtx-4090"].tight
    assert fits["rtx-5090"].count == 1
    assert not fits["rtx-5090"].tight
    assert fits["t4"].count == 2  # under 16 GB: "16GB 以下的消费级显卡会非常吃力"


def test_70b_4bit_inference_needs_40_gb_or_more() -> None:
    """ "70B 级别的模型, 推理显存需求至少在 40GB 以上"."""
    report = advice.fit("70b", "inference", bits=4)
    assert report.advised_bytes >= 40 * GB
    fits = by_key(report)
    assert fits["a100-sxm4-80gb"].count == fits["h20"].count == 1
    assert fits["rtx-4090"].count == 2  # more than one 24 GB card
    assert fits["rtx-5090"].count == 2


def test_70b_16bit_inference_fits_two_80_gb_cards() -> None:
    """About 140 GB of weights plus the KV cache: two 80 GB cards hold it (tightly); two H20s
    (96 GB) leave the headroom; one H200 (141 GB) does not hold it."""
    report = advice.fit("70b", "inference")
    assert report.memory.weights_bytes == 140 * GB
    assert 0 < report.memory.kv_cache_bytes < 5 * GB
    fits = by_key(report)
    for key in ("a100-sxm4-80gb", "a800-sxm4-80gb", "h100-sxm"):
        assert fits[key].count == 2
        assert fits[key].tight
    assert fits["h20"].count == 2
    assert not fits["h20"].tight
    assert fits["h200-sxm"].count == 2


def test_70b_full_fine_tune_needs_at_least_eight_80_gb_cards() -> None:
    """ "70B 模型全参数微调至少需要 8 张 80GB 显卡"; "通常是权重的 3 到 4 倍以上"."""
    report = advice.fit("70b", "full")
    fits = by_key(report)
    assert fits["a100-sxm4-80gb"].count >= 8
    assert fits["h100-sxm"].count >= 8
    assert fits["h20"].count >= 8
    assert report.memory.total_bytes >= 3 * report.memory.weights_bytes


@pytest.mark.parametrize("size", ["1.5b", "7b", "13b", "14b", "32b", "70b", "72b"])
def test_inference_needs_less_than_lora_and_lora_less_than_a_full_fine_tune(size: str) -> None:
    inference = advice.fit(size, "inference").memory
    lora = advice.fit(size, "lora").memory
    full = advice.fit(size, "full").memory
    assert inference.total_bytes < lora.total_bytes < full.total_bytes
    assert inference.activations_bytes == 0  # activations are for training only
    assert lora.kv_cache_bytes == full.kv_cache_bytes == 0
    assert lora.optimizer_bytes < full.optimizer_bytes
    assert inference.optimizer_bytes == 0


# --- several models on one card: the guides' Ollama case --------------------------------------


def test_a_quantised_7b_and_a_13b_on_one_4090() -> None:
    """ "4090 是 24GB 显存, 加载一个 7B 量化模型可能占 6 到 8GB, 再加载一个 13B 模型总占用很容易
    超过 24GB": a 16-bit 13B beside it does not fit one 4090; a 4-bit one does."""
    both = advice.fit("7b:4bit+13b", "inference")
    assert [need.bits for need in both.each] == [4, 16]
    assert both.memory.total_bytes == sum(need.memory.total_bytes for need in both.each)
    assert both.memory.total_bytes > 24 * GB
    assert by_key(both)["rtx-4090"].count == 2
    quantised = advice.fit("7b:4bit+13b:q4_K_M", "inference")
    assert by_key(quantised)["rtx-4090"].count == 1
    alone = advice.fit("7b", "inference", bits=4).memory.total_bytes
    assert quantised.each[0].memory.total_bytes == alone


def test_bits_apply_to_the_models_that_give_none() -> None:
    report = advice.fit("7b+13b:16", "inference", bits=4)
    assert [need.bits for need in report.each] == [4, 16]
    assert advice.fit("7b", "inference").models == ()  # one model: no list


def test_several_models_render_each_with_the_sum() -> None:
    shown = validate(money.fit_message(advice.fit("7b:4bit+13b:4bit", "inference")))
    assert "7B (shaped like llama-2-7b) 4-bit + 13B (shaped like llama-2-13b) 4-bit" in shown
    assert "together, inference" in shown
    assert "*NVIDIA GeForce RTX 4090* (24 GB: 20.7 GiB usable, needs" in shown


# --- flags: context, batch, headroom; Chinese modes ---------------------------------------------


def test_the_kv_cache_follows_context_and_batch() -> None:
    """2 (K and V) x 32 layers x 4096 hidden x 4096 tokens x 2 bytes = 2 GiB for a 7B."""
    base = advice.fit("7b", "inference")
    assert base.seq == advice.DEFAULT_CONTEXT == 4096
    assert base.memory.kv_cache_bytes == 2 * 32 * 4096 * 4096 * 2 == 2 * GIB
    longer = advice.fit("7b", "inference", seq=8192, batch=4)
    assert longer.memory.kv_cache_bytes == 8 * base.memory.kv_cache_bytes
    assert longer.memory.weights_bytes == base.memory.weights_bytes


def test_headroom_decides_tight_or_comfortable() -> None:
    none = advice.fit("7b", "lora", headroom_pct=0)
    assert none.advised_bytes == none.memory.total_bytes
    assert not any(fit.tight for fit in none.fits)
    half = advice.fit("7b", "lora", headroom_pct=50)
    assert half.advised_bytes == -(-none.memory.total_bytes * 150 // 100)
    # A 5090 holds a 7B LoRA with 20% to spare, not with 60%.
    assert not by_key(advice.fit("7b", "lora"))["rtx-5090"].tight
    assert by_key(advice.fit("7b", "lora", headroom_pct=60))["rtx-5090"].tight
    assert advice.fit("7b", "lora").headroom_pct == advice.DEFAULT_HEADROOM_PCT == 20


@pytest.mark.parametrize(
    ("word", "mode"),
    [
        ("推理", "inference"),
        ("微调", "lora"),
        ("全量", "full"),
        ("全量微调", "full"),
        ("LoRA", "lora"),
    ],
)
def test_modes_are_read_in_chinese(word: str, mode: str) -> None:
    assert advice.fit("7b", word).memory == advice.fit("7b", mode).memory
    assert advice.fit("7b", word).mode == mode


def test_the_mode_defaults_to_inference() -> None:
    assert advice.fit("7b").mode == "inference"


@pytest.mark.parametrize(
    ("text", "bits"),
    [("16", 16), ("fp16", 16), ("BF16", 16), ("8bit", 8), ("int8", 8), ("4-bit", 4), ("q4", 4)],
)
def test_precisions_are_read_as_people_write_them(text: str, bits: int) -> None:
    assert advice.parse_bits(text) == bits


@pytest.mark.parametrize(
    ("size", "mode", "headroom", "message"),
    [
        ("7b+", "inference", None, "empty model"),
        ("+".join(["7b"] * 9), "inference", None, "too many"),
        ("7b:3bit", "inference", None, "not a model size"),
        ("7b", "inference", 500, "--headroom"),
        ("7b", "训练", None, "not a mode"),
        ("7b:4bit+13b", "full", None, "full fine-tune"),
    ],
)
def test_bad_questions_are_refused(
    size: str, mode: str, headroom: int | None, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        advice.fit(size, mode, headroom_pct=headroom)


def test_headroom_is_read_as_a_percentage() -> None:
    assert advice.parse_headroom("30") == advice.parse_headroom("30%") == 30
    with pytest.raises(UsageError, match="not a percentage"):
        advice.parse_headroom("lots")
    with pytest.raises(UsageError, match="not a percentage"):
        advice.parse_headroom("201")


# --- the shapes by size -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "layers", "hidden", "kv_width"),
    [
        ("7b", 32, 4096, 4096),  # Llama-2-7B: every head keeps its K and V
        ("13b", 40, 5120, 5120),  # Llama-2-13B
        ("14b", 48, 5120, 1024),  # Qwen2.5-14B: 8 KV heads of 128
        ("32b", 64, 5120, 1024),  # Qwen2.5-32B
        ("70b", 80, 8192, 1024),  # Llama-3.1-70B (Llama-2-70B has the same shape)
        ("72b", 80, 8192, 1024),  # Qwen2.5-72B
    ],
)
def test_common_sizes_take_published_shapes(
    size: str, layers: int, hidden: int, kv_width: int
) -> None:
    shape = advice.parse_size(size)
    assert (shape.layers, shape.hidden, shape.kv_width) == (layers, hidden, kv_width)
    assert shape.params == int(size.removesuffix("b")) * GB
    assert not shape.estimated
    assert shape.shape_from == advice.SIZE_SHAPES[size]


def test_an_unlisted_size_is_estimated_and_said_so() -> None:
    shape = advice.parse_size("20b")
    assert shape.estimated
    assert shape.shape_from in advice.SIZE_SHAPES.values()
    shown = validate(money.fit_message(advice.fit("20b", "inference")))
    assert "20B (estimated: shaped like" in shown
    with speaking("zh"):
        zh = validate(money.fit_message(advice.fit("20b", "推理")))
    assert "估算" in zh
    assert "推理" in zh


def test_an_ollama_name_is_a_known_model() -> None:
    assert advice.parse_size("qwen2.5:7b").name == "qwen2.5-7b"


# --- the guides' cards are named where they fit -----------------------------------------------


def test_the_h20_and_5090_are_named_where_they_fit() -> None:
    shown = validate(money.fit_message(advice.fit("70b", "inference")))
    assert "2x *NVIDIA H20* (96 GB" in shown
    assert "*NVIDIA GeForce RTX 5090*" in shown
    # The 4090 comes after a dozen dearer fits, and is still named.
    report = advice.fit("70b", "inference")
    assert [fit.key for fit in report.fits].index("rtx-4090") >= money.TOP_FITS
    assert "*NVIDIA GeForce RTX 4090*" in shown
    assert "tight: 3 cards with 20% headroom" in shown
    assert "comfortable with 20% headroom" in shown
    small = validate(money.fit_message(advice.fit("7b", "inference", bits=4)))
    assert "*NVIDIA GeForce RTX 5090* (32 GB" in small
    assert "*NVIDIA H20* (96 GB" in small


def test_the_answer_says_tight_and_comfortable_in_chinese() -> None:
    with speaking("zh"):
        shown = validate(money.fit_message(advice.fit("70b", "推理")))
    assert "吃紧" in shown
    assert "从容" in shown
    assert "余量" in shown
    assert "推理" in shown


def test_the_table_of_shapes_by_size_agrees_with_the_data() -> None:
    """The table in SIZE_SHAPES' comment is what a size is counted with, row by row."""
    rows = re.findall(
        r"^#: (\d+(?:\.\d+)?B)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)$",
        inspect.getsource(advice),
        flags=re.MULTILINE,
    )
    assert len(rows) == len(advice.SIZE_SHAPES)
    for size, name, layers, hidden, kv_width in rows:
        shape = advice.parse_size(size.lower())
        assert shape.shape_from == name == advice.SIZE_SHAPES[size.lower()]
        assert (shape.layers, shape.hidden, shape.kv_width) == (
            int(layers),
            int(hidden),
            int(kv_width),
        )
