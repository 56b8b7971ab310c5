"""What an agent said, in the reader's language: a template of agents.messages (the
catalogue's message id) filled with the parameters the agent sent beside it.

Numbers are written out here (``*_pct`` a whole percent, ``*_bytes`` GiB); the parameter
``name`` is the machine, shown as the instance's name; ``hint`` is one of the agent's fixed
hints (:mod:`bot.services.speaking.nvml_words`), ``code`` beside it the kind of NVML error, and
``error``/``why`` the driver's own words (shown with no backquotes, which the catalogue's
code spans hold). Text without a template (an agent before templates, or a failure the agent
tells in English only) is shown as the agent wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agents.protocol import Diagnosis, shown_value
from bot.i18n import active_language, placeholders, t
from bot.services.speaking import nvml_words


def said(
    template: str | None,
    params: Mapping[str, object],
    english: str,
    *,
    name: str | None = None,
    shown: Mapping[str, str] | None = None,
) -> str:
    """The agent's sentence in the active language: ``template`` translated and filled with
    ``params`` (``shown`` holds values already in words, which win); ``english`` as it is
    when there is no template or the parameters do not fit it. ``name`` is the instance's
    name for the ``name`` parameter."""
    if not template:
        return english
    text = t(template)
    wanted = placeholders(text)
    values = {key: _shown(key, value, params) for key, value in params.items()}
    if name is not None:
        values["name"] = name
    values.update(shown or {})
    if not wanted <= values.keys():
        return english
    return text.format(**{key: values[key] for key in wanted})


def diagnosis(found: Diagnosis) -> str:
    """A job's diagnosis in the active language (its English from agents before
    templates)."""
    return said(found.template, found.params, found.message)


def _shown(key: str, value: object, params: Mapping[str, object]) -> str:
    if key == "hint" and isinstance(value, str):
        return nvml_words.hint(value)
    if key == "code" and "hint" in params and active_language() != "en":
        return nvml_words.kind(str(value))
    if key in ("error", "why"):
        return str(value).replace("`", "'")
    return shown_value(key, value)


#: How deep parts may nest (a part's parameter is a part, ...); deeper is shown in English.
_MOST_NESTED = 8
#: Full-width stop, exclamation and question marks, colon and closing parenthesis.
_SENTENCE_ENDS = ("\u3002", "\uff01", "\uff1f", "\uff1a", "\uff09")
#: The full-width semicolon that joins Chinese clauses.
_CLAUSES = "\uff1b"


class _Untold(Exception):
    """A part the catalogue cannot show in the active language."""


def parts(english: str, items: Sequence[object], *, sentences: bool) -> str:
    """A finding of several parts (``HealthCheck.summary_parts``/``hint_parts``) in the
    active language: each part translated and filled, clauses joined with a full-width
    semicolon, sentences with nothing after a full stop (else a space). ``english`` as sent
    in English, and when a part has a template the catalogue does not know, parameters that
    do not fit it, or a shape the agent does not send."""
    if active_language() == "en":
        return english
    try:
        shown = [_part(item, 0) for item in items]
    except _Untold:
        return english
    if not shown:
        return english
    if not sentences:
        return _CLAUSES.join(shown)
    text = shown[0]
    for part in shown[1:]:
        text += part if text.endswith(_SENTENCE_ENDS) else " " + part
    return text


def _part(value: object, depth: int) -> str:
    if depth > _MOST_NESTED:
        raise _Untold
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        listed = [_part(item, depth + 1) for item in value]
        return (", " if active_language() == "en" else "、").join(listed)
    if not isinstance(value, Mapping):
        raise _Untold
    template, params = value.get("template"), value.get("params", {})
    if not isinstance(template, str) or not isinstance(params, Mapping):
        raise _Untold
    text = t(template)
    if text == template and active_language() != "en":
        raise _Untold
    wanted = placeholders(text)
    if not wanted <= params.keys():
        raise _Untold
    return text.format(**{key: _part(params[key], depth + 1) for key in wanted})
