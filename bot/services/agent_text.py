"""What an agent said, in the reader's language: a template of agents.messages (the
catalogue's message id) filled with the parameters the agent sent beside it.

Numbers are written out here (``*_pct`` a whole percent, ``*_bytes`` GiB); the parameter
``name`` is the machine, shown as the instance's name; ``hint`` is one of the agent's fixed
hints (:mod:`bot.services.nvml_words`), ``code`` beside it the kind of NVML error, and
``error``/``why`` the driver's own words (shown with no backquotes, which the catalogue's
code spans hold). Text without a template (an agent before templates, or a failure the agent
tells in English only) is shown as the agent wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping

from agents.protocol import Diagnosis, shown_value
from bot.i18n import active_language, placeholders, t
from bot.services import nvml_words


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
