"""Why a row has no live data is named in the reader's language, for every fleet error."""

from __future__ import annotations

from bot import errors
from bot.blocks.instances import PROBLEM_KINDS, problem_kind
from bot.i18n import speaking
from tests.chinese import assert_said_in_chinese


def _fleet_errors() -> set[str]:
    return {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.FleetError)
    }


def test_every_fleet_error_has_a_name() -> None:
    assert _fleet_errors() == set(PROBLEM_KINDS)


def test_the_names_are_words_in_each_language() -> None:
    assert problem_kind("Unreachable") == "Unreachable"
    assert problem_kind("HostKeyChanged") == "Host key changed"
    assert problem_kind("SomethingNew") == "SomethingNew"
    with speaking("zh"):
        names = [problem_kind(kind) for kind in sorted(PROBLEM_KINDS)]
        assert problem_kind("Unreachable") == "无法连接"
    assert_said_in_chinese(*names)
