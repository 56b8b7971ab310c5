"""Only the platform's own answer confirms: for every REST platform, an answer that is not the
platform's own (a proxy's catch-all HTML 404, a retired API version, a redirect, a plain-text
page) is an unknown outcome, never "already gone", and the instance is untouched by it."""

from __future__ import annotations

import pytest

from bot.errors import ProviderError, ProviderNotFound, ProviderUnknownOutcome
from tests.bot.providers.test_contract import Platform, rest_platform

pytestmark = pytest.mark.integration

__all__ = ["rest_platform"]


def _answer_as_a_proxy(platform: Platform, how: str) -> None:
    assert platform.standin is not None
    if how == "html 404":
        platform.standin.catch_all()
    elif how == "plain 404":
        platform.standin.catch_all(404, b"404 page not found", "text/plain")
    elif how == "json 404 of another server":
        platform.standin.catch_all(404, b'{"message": "no Route matched"}', "application/json")
    else:
        platform.standin.redirect_to("https://moved.example/api")


PROXIES = ["html 404", "plain 404", "json 404 of another server", "redirect"]


@pytest.mark.parametrize("how", PROXIES)
def test_a_release_through_a_proxy_is_an_unknown_outcome(rest_platform: Platform, how: str):
    iid = rest_platform.create()
    _answer_as_a_proxy(rest_platform, how)

    with pytest.raises(ProviderError) as caught:
        rest_platform.provider.release(iid, "terminate")

    assert isinstance(caught.value, ProviderUnknownOutcome), caught.value
    assert not isinstance(caught.value, ProviderNotFound)
    assert rest_platform.standin is not None
    rest_platform.standin.catch_all(None)
    assert rest_platform.provider.get(iid).state in ("pending", "running")


@pytest.mark.parametrize("how", PROXIES)
def test_a_list_or_get_through_a_proxy_is_not_an_absence(rest_platform: Platform, how: str):
    iid = rest_platform.create()
    _answer_as_a_proxy(rest_platform, how)

    with pytest.raises(ProviderUnknownOutcome):
        rest_platform.provider.list_instances()
    with pytest.raises(ProviderUnknownOutcome):
        rest_platform.provider.get(iid)
