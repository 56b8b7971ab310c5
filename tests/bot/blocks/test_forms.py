"""The register and rent modals as Slack reads them: valid views within the limits, every
field keyed by its block id, in English and in Chinese."""

from __future__ import annotations

import re
from typing import Any

from slack_sdk.models.views import View

from agents import specs
from bot.blocks import forms
from bot.blocks.forms import GpuChoice, Offer
from bot.i18n import speaking
from tests.chinese import assert_chinese, texts_of

GPUS = [GpuChoice(spec.key, spec.name) for spec in specs.load_catalogue()]
OFFERS = [
    Offer("aws", "g6.xlarge", "l4", 1, 804_800, "USD"),
    Offer("aws", "p5.48xlarge", "h100-sxm", 8, 55_040_000, "USD"),
    Offer("lambda", "gpu_1x_a10", "a10", 1, 750_000, "USD"),
]
PROVIDERS = ("manual", "aws", "lambda", "runpod", "vast", "compshare")


def check_view(view: dict[str, Any]) -> None:
    """slack_sdk reads ``view`` as a valid modal, exactly as built, within Slack's limits."""
    model = View(**view)
    model.validate_json()
    assert model.to_dict() == view
    assert view["type"] == "modal"
    assert 0 < len(view["title"]["text"]) <= 24
    assert 0 < len(view["submit"]["text"]) <= 24
    assert 0 < len(view["close"]["text"]) <= 24
    assert 0 < len(view["blocks"]) <= 100
    for block in view["blocks"]:
        assert block["type"] == "input"
        assert len(block["block_id"]) <= 255
        assert len(block["label"]["text"]) <= 2000
        element = block["element"]
        assert element["action_id"] == forms.VALUE
        assert len(element.get("placeholder", {}).get("text", "")) <= 150
        groups = element.get("option_groups", [{"options": element.get("options", [])}])
        assert len(groups) <= 100
        for group in groups:
            assert len(group["options"]) <= 100
            for option in group["options"]:
                assert len(option["text"]["text"]) <= 75
                assert len(option["value"]) <= 150


def block_ids(view: dict[str, Any]) -> list[str]:
    return [block["block_id"] for block in view["blocks"]]


def test_the_register_form_has_every_option_of_the_command() -> None:
    view = forms.register_form(GPUS, PROVIDERS, default_release_in="8h")
    check_view(view)
    assert view["callback_id"] == forms.REGISTER_FORM
    assert block_ids(view) == list(forms.REGISTER_FIELDS)
    gpu = view["blocks"][block_ids(view).index("gpu")]["element"]
    assert [option["value"] for option in gpu["options"]] == [gpu.key for gpu in GPUS]
    provider = view["blocks"][block_ids(view).index("provider")]["element"]
    assert provider["initial_option"]["value"] == "manual"
    required = [block["block_id"] for block in view["blocks"] if not block["optional"]]
    assert required == ["name", "address", "gpu", "price"]
    assert "8h from now" in str(view)


def test_the_rent_form_lists_the_types_by_provider() -> None:
    view = forms.rent_form(OFFERS, ["aws", "lambda", "runpod"])
    check_view(view)
    assert view["callback_id"] == forms.RENT_FORM
    assert block_ids(view) == list(forms.RENT_FIELDS)
    groups = view["blocks"][0]["element"]["option_groups"]
    assert [group["label"]["text"] for group in groups] == ["AWS", "Lambda"]
    first = groups[0]["options"][0]
    assert forms.split_offer(first["value"]) == ("aws", "g6.xlarge")
    assert first["description"]["text"] == "1x l4, $0.80/h"


def test_without_listed_types_the_rent_form_asks_for_a_typed_one() -> None:
    view = forms.rent_form([], ["runpod"])
    check_view(view)
    assert block_ids(view)[0] == "other_type"
    assert view["blocks"][0]["optional"] is False


def test_long_catalogues_are_cut_to_slacks_limits() -> None:
    many = [Offer("aws", f"type-{i}" + "x" * 80, "l4", 1, 1, "USD") for i in range(300)]
    too_long = Offer("lambda", "y" * 200, "l4", 1, 1, "USD")
    view = forms.rent_form([*many, too_long], ["aws", "lambda"])
    check_view(view)
    assert [group["label"]["text"] for group in view["blocks"][0]["element"]["option_groups"]] == [
        "AWS"
    ]
    gpus = [GpuChoice(f"k{i}", "n" * 300) for i in range(250)]
    check_view(forms.register_form(gpus, PROVIDERS, default_release_in="8h"))


def test_the_forms_in_chinese() -> None:
    with speaking("zh"):
        register = forms.register_form(GPUS, PROVIDERS, default_release_in="8h")
        rent = forms.rent_form(OFFERS, ["aws", "lambda"])
        error = forms.form_error("x" * 5000)
    for view in (register, rent):
        check_view(view)
        assert_chinese(view)
        labels = [block["label"]["text"] for block in view["blocks"]]
        assert all(re.search("[\u4e00-\u9fff]", label) for label in labels), labels
    assert register["title"]["text"] == "注册实例"
    assert rent["submit"]["text"] == "租用"
    assert any("8h" in text for text in texts_of(register))
    assert "1 张 l4" in str(rent)
    assert len(error) == forms.ERROR_MAX
