"""clip() never cuts inside an entity: Slack's ``&amp;``, ``&lt;``, ``&gt;`` or a ``<...>``
one (mentions, channels, links), checked over generated text (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.blocks.kit import ELLIPSIS, clip, escape

ENTITIES = (
    "&amp;",
    "&lt;",
    "&gt;",
    "<@U123>",
    "<#C1|name>",
    "<https://x|y>",
    "<!here>",
    "<https://example.com/a?b=1&amp;c=2|a &lt;link&gt;>",
)
#: Plain characters that never make an entity by themselves (no ``<``, ``>``, and no letters
#: of ``amp``, ``lt``, ``gt``).
PLAIN = "ab &|;:/x.*_ 中"


def _pieces(plain: str) -> st.SearchStrategy[list[tuple[str, bool]]]:
    piece = st.one_of(
        st.sampled_from(ENTITIES).map(lambda text: (text, True)),
        st.text(alphabet=plain, min_size=1, max_size=6).map(lambda text: (text, False)),
    )
    return st.lists(piece, max_size=25)


def _spans(pieces: list[tuple[str, bool]]) -> tuple[str, list[tuple[int, int]]]:
    """The text the pieces make, and where each entity in it starts and ends."""
    text, spans = "", []
    for piece, entity in pieces:
        if entity:
            spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


def _check(text: str, spans: list[tuple[int, int]], limit: int) -> str:
    clipped = clip(text, limit)
    assert len(clipped) <= max(limit, 1)
    if clipped == text:
        assert len(text) <= limit
        return ""
    assert clipped.endswith(ELLIPSIS)
    body = clipped.removesuffix(ELLIPSIS)
    assert text.startswith(body)
    cut = len(body)
    assert not any(start < cut < end for start, end in spans), (text, limit, clipped)
    return body


@settings(max_examples=300, deadline=None)
@given(_pieces(PLAIN), st.integers(min_value=1, max_value=120))
def test_a_cut_keeps_as_much_as_fits_and_never_splits_an_entity(
    pieces: list[tuple[str, bool]], limit: int
) -> None:
    text, spans = _spans(pieces)
    body = _check(text, spans, limit)
    if body or len(text) > limit:
        # Only an entity the limit would split is left out; everything before it is kept.
        want = limit - 1
        inside = [start for start, end in spans if start < want < end]
        assert len(body) == (inside[0] if inside else want)


@settings(max_examples=300, deadline=None)
@given(_pieces(PLAIN + "<>"), st.integers(min_value=1, max_value=120))
def test_stray_brackets_beside_entities_never_make_a_cut_split_one(
    pieces: list[tuple[str, bool]], limit: int
) -> None:
    text, spans = _spans(pieces)
    _check(text, spans, limit)


def test_clip_of_escaped_text_keeps_its_entities_whole() -> None:
    text = escape("a & b < c > d")  # "a &amp; b &lt; c &gt; d"
    assert clip(text, 5) == "a " + ELLIPSIS
    assert clip(text, 9) == "a &amp; " + ELLIPSIS
    assert clip("see <https://x|y> now", 8) == "see " + ELLIPSIS
    assert clip("<@U123> said", 4) == ELLIPSIS
    assert clip("abcd", 3) == "ab" + ELLIPSIS
