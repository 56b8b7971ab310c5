"""Small helpers shared by the check modules."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from agents.protocol import GpuSnapshot, HealthCheck, StatusSnapshot

PASS = "pass"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"

GIB = 1024**3


class Text:
    """An English sentence as a template and its parameters, so that the bot can show it in
    the reader's language: ``str(text)`` is the English. A parameter is text shown as it is,
    another :class:`Text` (shown in the reader's language too), or a list of them (a
    listing, joined with commas)."""

    __slots__ = ("params", "template")

    def __init__(self, template: str, params: Mapping[str, Any]) -> None:
        self.template = template
        self.params = dict(params)

    def __str__(self) -> str:
        return self.template.format(**{key: _english(v) for key, v in self.params.items()})

    def __repr__(self) -> str:
        return f"Text({self.template!r}, {self.params!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Text)
            and other.template == self.template
            and other.params == self.params
        )

    def __hash__(self) -> int:
        return hash((self.template, repr(sorted(self.params.items()))))

    def __add__(self, other: str) -> str:
        return str(self) + other

    def __radd__(self, other: str) -> str:
        return other + str(self)

    @property
    def flat(self) -> bool:
        """Whether every parameter is plain text (it travels as template and parameters)."""
        return all(isinstance(v, str) for v in self.params.values())


def N_(template: str, **params: object) -> Text:
    """A finding's sentence: ``template`` (a literal with ``{name}`` placeholders, extracted
    for the bot's catalogue under this name) and its parameters: a :class:`Text` or a list
    stays itself, anything else is turned into text."""
    return Text(
        template,
        {
            name: value if isinstance(value, (Text, Parts, list)) else str(value)
            for name, value in params.items()
        },
    )


Message = Union[str, Text]


class Parts:
    """A finding made of several parts, each a sentence or a clause of its own: the English is
    the parts joined with ``separator``; the bot joins them in the reader's language."""

    __slots__ = ("items", "separator")

    def __init__(self, separator: str, items: Sequence[Message]) -> None:
        self.separator = separator
        self.items = tuple(items)

    def __str__(self) -> str:
        return self.separator.join(str(part) for part in self.items)

    def __repr__(self) -> str:
        return f"Parts({self.separator!r}, {self.items!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Parts)
            and other.separator == self.separator
            and other.items == self.items
        )

    def __hash__(self) -> int:
        return hash((self.separator, self.items))


Finding = Union[str, Text, Parts]


def joined(separator: str, parts: Sequence[Message]) -> Finding:
    """``parts`` as one finding: in English joined with ``separator`` ("; " for clauses, " "
    for sentences); one part stays itself, none is empty text."""
    if not parts:
        return ""
    if len(parts) == 1:
        return parts[0]
    return Parts(separator, parts)


def wire(message: Any) -> Any:
    """A part of a finding as JSON holds it: text as it is, a :class:`Text` as
    ``{"template": ..., "params": {...}}`` (parameters likewise), a list as a list."""
    if isinstance(message, Text):
        return {
            "template": message.template,
            "params": {k: wire(v) for k, v in message.params.items()},
        }
    if isinstance(message, Parts):
        return [wire(item) for item in message.items]
    if isinstance(message, (list, tuple)):
        return [wire(item) for item in message]
    return str(message)


def _english(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_english(item) for item in value)
    return str(value)


def _fields(message: Finding) -> Tuple[Optional[str], Dict[str, str], Tuple[Any, ...]]:
    """Template, parameters and parts of a finding: a flat :class:`Text` travels as template
    and parameters, a nested one or several parts as parts, plain text as neither."""
    if isinstance(message, Text) and message.flat:
        return message.template, {k: str(v) for k, v in message.params.items()}, ()
    if isinstance(message, Text):
        return None, {}, (wire(message),)
    if isinstance(message, Parts):
        return None, {}, tuple(wire(part) for part in message.items)
    return None, {}, ()


def make(
    check_id: str,
    status: str,
    summary: Finding,
    hint: Finding = "",
    details: Optional[Mapping[str, Any]] = None,
) -> HealthCheck:
    """A HealthCheck; the hint is dropped on pass, as the schema promises. A :class:`Text`
    gives the English text and, beside it, its template and parameters (or, when it holds
    other texts, one part); :class:`Parts` give the English and each part; a plain string is
    sent as it is (no template: the bot shows it in English)."""
    if status == PASS:
        hint = ""
    summary_template, summary_params, summary_parts = _fields(summary)
    hint_template, hint_params, hint_parts = _fields(hint)
    return HealthCheck(
        id=check_id,
        status=status,
        summary=str(summary),
        hint=str(hint),
        details=dict(details or {}),
        summary_template=summary_template,
        summary_params=summary_params,
        hint_template=hint_template,
        hint_params=hint_params,
        summary_parts=summary_parts,
        hint_parts=hint_parts,
    )


def nvml_gpus(status: StatusSnapshot) -> Optional[Iterable[GpuSnapshot]]:
    """The GPUs NVML reported, or None when NVML failed (the check should then skip)."""
    if status.nvml_error is not None:
        return None
    return status.gpus


def skip_without_nvml(check_id: str, status: StatusSnapshot) -> Optional[HealthCheck]:
    """A skip result when NVML failed or saw no GPU, else None."""
    if status.nvml_error is not None:
        return make(check_id, SKIP, N_("skipped: NVML is not working (see the nvml check)"))
    if not status.gpus:
        return make(check_id, SKIP, N_("skipped: NVML reports no GPU"))
    return None


def gib(value: Optional[int]) -> str:
    """Bytes as "12.3 GiB"; "?" for None."""
    return "?" if value is None else f"{value / GIB:.1f} GiB"


def gpu_list(indices: Iterable[int]) -> str:
    """ "GPU 0", "GPUs 0, 3"."""
    items = [str(i) for i in indices]
    return ("GPU " if len(items) == 1 else "GPUs ") + ", ".join(items)


def per_gpu(values: Mapping[int, Any]) -> Dict[str, Any]:
    """Per-GPU details keyed by index as text (JSON object keys are strings)."""
    return {str(index): value for index, value in sorted(values.items())}
