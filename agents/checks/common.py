"""Small helpers shared by the check modules."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Union

from agents.protocol import GpuSnapshot, HealthCheck, StatusSnapshot

PASS = "pass"
WARN = "warn"
FAIL = "fail"
SKIP = "skip"

GIB = 1024**3


class Text:
    """An English sentence as a template and its parameters (values shown as they are), so
    that the bot can show it in the reader's language: ``str(text)`` is the English."""

    __slots__ = ("params", "template")

    def __init__(self, template: str, params: Mapping[str, str]) -> None:
        self.template = template
        self.params = dict(params)

    def __str__(self) -> str:
        return self.template.format(**self.params)

    def __repr__(self) -> str:
        return f"Text({self.template!r}, {self.params!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Text)
            and other.template == self.template
            and other.params == self.params
        )

    def __hash__(self) -> int:
        return hash((self.template, tuple(sorted(self.params.items()))))

    def __add__(self, other: str) -> str:
        return str(self) + other

    def __radd__(self, other: str) -> str:
        return other + str(self)


def N_(template: str, **params: object) -> Text:
    """A finding's sentence: ``template`` (a literal with ``{name}`` placeholders, extracted
    for the bot's catalogue under this name) and its parameters, each turned into text."""
    return Text(template, {name: str(value) for name, value in params.items()})


Message = Union[str, Text]


def joined(separator: str, parts: Sequence[Message]) -> Message:
    """``parts`` joined as English text; one part stays itself, so that a single finding
    keeps its template (several are sent as English only)."""
    if len(parts) == 1:
        return parts[0]
    return separator.join(str(part) for part in parts)


def make(
    check_id: str,
    status: str,
    summary: Message,
    hint: Message = "",
    details: Optional[Mapping[str, Any]] = None,
) -> HealthCheck:
    """A HealthCheck; the hint is dropped on pass, as the schema promises. A :class:`Text`
    gives the English text and, beside it, its template and parameters; a plain string is
    sent as it is (no template: the bot shows it in English)."""
    if status == PASS:
        hint = ""
    return HealthCheck(
        id=check_id,
        status=status,
        summary=str(summary),
        hint=str(hint),
        details=dict(details or {}),
        summary_template=summary.template if isinstance(summary, Text) else None,
        summary_params=dict(summary.params) if isinstance(summary, Text) else {},
        hint_template=hint.template if isinstance(hint, Text) else None,
        hint_params=dict(hint.params) if isinstance(hint, Text) else {},
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
