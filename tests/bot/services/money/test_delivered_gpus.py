"""Delivered, not rented: where the agent found other GPUs than were rented, Home, spend and
its CSV show the delivered model, marked, with the rented one beside it."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

from bot.blocks.home import home_view as render_home
from bot.services.money import spend
from bot.store.models import Instance
from tests.bot.blocks.test_money import report, spend_item
from tests.bot.test_home import _instance, _view


def _registered(rented: str | None, found: str | None) -> Instance:
    return Instance(name="box", owner_id="U1", host="h", gpu_model=rented, delivered_gpu_name=found)


def test_the_delivered_model_is_told_apart_from_the_rented_one_by_the_catalogue() -> None:
    assert spend.delivered_model(_registered("a100", "NVIDIA GeForce RTX 4090")) == (
        "NVIDIA GeForce RTX 4090"
    )
    # The same card in other words is no mismatch; an unknown side decides nothing.
    assert spend.delivered_model(_registered("a100-80", "NVIDIA A100-SXM4-80GB")) is None
    assert spend.delivered_model(_registered("4090", "NVIDIA GeForce RTX 4090")) is None
    assert spend.delivered_model(_registered(None, "NVIDIA GeForce RTX 4090")) is None
    assert spend.delivered_model(_registered("a100", None)) is None


def test_spend_and_its_csv_show_the_delivered_gpu() -> None:
    item = spend_item(1, gpu_model="a100", gpu_count=2, delivered_gpu_model="RTX 4090")
    assert item.gpu_label == "2x RTX 4090 (rented a100)"
    assert spend_item(2, gpu_model="a100").gpu_label == "a100"
    rows = list(csv.DictReader(io.StringIO(spend.spend_csv(report([item])).decode("utf-8-sig"))))
    assert (rows[0]["gpu_model"], rows[0]["delivered_gpu_model"]) == ("a100", "RTX 4090")


def test_the_home_marks_the_delivered_gpus() -> None:
    mismatched = replace(
        _instance(1), delivered_gpu_name="NVIDIA GeForce RTX 4090", delivered_gpu_count=4
    )
    view = replace(_view(mine=0, fleet=0), mine=(mismatched,), fleet=(mismatched,))
    shown = json.dumps(render_home(view), ensure_ascii=False)
    assert ":warning: 4x NVIDIA GeForce RTX 4090 (rented 2x A100)" in shown
    assert "*box1*  ·  2x A100" not in shown
