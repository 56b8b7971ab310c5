"""`/gpu help` states the billing rules that are settings, not documented facts."""

from __future__ import annotations

import pytest

from bot.commands import build_registry
from bot.commands.parser import parse
from bot.i18n import speaking
from bot.providers.compshare import CompshareProvider
from bot.runtime import Runtime
from bot.services.access import Caller

REGISTRY = build_registry()
CALLER = Caller(user_id="UOWNER", channel_id="CTEAM")


@pytest.fixture
def rt(local_rt: Runtime) -> Runtime:
    return local_rt


def _help(rt: Runtime) -> str:
    spec, args = parse("help", REGISTRY)
    reply = spec.handler(rt, CALLER, args)
    return " ".join(str(block) for block in reply.blocks)


@pytest.mark.parametrize(("billing", "word"), [("hour", "hour"), ("second", "second")])
def test_help_says_compshare_s_increment_is_an_unverified_setting(rt, billing, word):
    settings = rt.settings.with_(
        compshare_public_key="pub", compshare_private_key="priv", compshare_billing=billing
    )
    rt.providers.add(CompshareProvider.from_settings(settings))
    object.__setattr__(rt, "settings", settings)
    shown = _help(rt)
    assert f"billed here by the {word} (GPUBOT_COMPSHARE_BILLING)" in shown
    assert "unverified" in shown
    with speaking("zh"):
        assert "未经核实" in _help(rt)


def test_without_compshare_help_says_nothing_of_it(rt):
    assert "Compshare" not in _help(rt)
