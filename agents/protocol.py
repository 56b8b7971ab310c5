"""The agent's JSON schema as frozen dataclasses: the agent prints them, the bot parses them.

Runs on Python 3.9 with the standard library only. Every document carries ``"schema": 1``;
fields carry their unit in their name. A value the hardware or driver does not report is
``None`` (JSON ``null``), never an error. Unknown keys are ignored so that a newer agent can
add fields without breaking an older bot.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from itertools import accumulate

from agents import messages, wire

# What the agent tells a person, as templates (agents.messages); re-exported for the bot.
from agents.messages import NOTE_CANCELLED as NOTE_CANCELLED
from agents.messages import NOTE_CANCELLED_QUEUED as NOTE_CANCELLED_QUEUED
from agents.messages import NOTE_SUPERVISOR_GONE as NOTE_SUPERVISOR_GONE
from agents.messages import shown_value as shown_value

# The names of the schema live in agents.schema (cheap to import); re-exported here.
from agents.schema import CHECK_STATUSES as CHECK_STATUSES
from agents.schema import CLOCK_EVENT_REASONS as CLOCK_EVENT_REASONS
from agents.schema import FINAL_JOB_STATES as FINAL_JOB_STATES
from agents.schema import JOB_STATES as JOB_STATES
from agents.schema import NVML_ERROR_CODES as NVML_ERROR_CODES
from agents.schema import PROCESS_FIELDS as PROCESS_FIELDS
from agents.schema import SCHEMA_VERSION as SCHEMA_VERSION

# ``typing`` is needed by type checkers only: not importing it keeps the agent's start fast.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type, TypeVar

    T = TypeVar("T")
    E = TypeVar("E", bound="JobError")


#: The deepest nesting of arrays and objects :func:`loads` accepts (the schema needs about 6).
MAX_DEPTH = 64
#: The longest document :func:`loads` accepts, in characters.
MAX_DOCUMENT_CHARS = 16 * 2**20

# String literals (skipped whole) and runs of anything but brackets and quotes: what is left
# after removing them is the document's brackets in order (and the quote of a string left open).
_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^\[\]{}"]+')
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1, '"': 0}


class ProtocolError(ValueError):
    """A document that is not valid JSON of the expected schema version and shape."""


@dataclass(frozen=True)
class HostInfo:
    """The machine the agent runs on."""

    hostname: str
    os: str
    kernel: str
    python_version: str
    agent_version: str
    cpu_count: int
    mem_total_bytes: Optional[int]
    uptime_s: Optional[float]
    in_container: bool
    is_wsl: bool


@dataclass(frozen=True)
class DriverInfo:
    """The NVIDIA driver: ``version`` like "550.54.15"; ``cuda_version``, the newest CUDA."""

    version: str
    cuda_version: Optional[str]
    nvml_version: Optional[str]


@dataclass(frozen=True)
class NvmlError:
    """Why NVML could not be used, with a hint a newcomer can act on."""

    code: str
    message: str
    hint: str


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one moment. ``None`` means not supported or not reported by this GPU/driver."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    mem_total_bytes: Optional[int]
    mem_used_bytes: Optional[int]
    mem_free_bytes: Optional[int]
    util_gpu_pct: Optional[int]
    util_mem_pct: Optional[int]
    temp_c: Optional[int]
    power_draw_w: Optional[float]
    power_limit_w: Optional[float]
    power_default_limit_w: Optional[float]
    sm_clock_mhz: Optional[int]
    sm_clock_max_mhz: Optional[int]
    clock_event_reasons: Optional[Tuple[str, ...]]
    ecc_mode_enabled: Optional[bool]
    ecc_uncorrected_volatile: Optional[int]
    remapped_rows_pending: Optional[bool]
    remapped_rows_failure: Optional[bool]
    retired_pages_pending: Optional[bool]
    pcie_gen_current: Optional[int]
    pcie_gen_max: Optional[int]
    pcie_width_current: Optional[int]
    pcie_width_max: Optional[int]
    persistence_mode: Optional[bool]
    mig_mode: Optional[bool]
    compute_capability: Optional[str]
    sm_count: Optional[int]
    #: Fan speed as % of its maximum (the first fan); None on passively cooled cards.
    fan_speed_pct: Optional[int] = None
    #: Performance state: 0 (P0, full speed) to 15 (P15, lowest); None when unknown.
    pstate: Optional[int] = None
    mem_clock_mhz: Optional[int] = None
    mem_clock_max_mhz: Optional[int] = None
    #: Video encoder and decoder utilisation, % over the driver's last sample period.
    enc_util_pct: Optional[int] = None
    dec_util_pct: Optional[int] = None


@dataclass(frozen=True)
class ProcessSnapshot:
    """A process holding GPU memory; ``job_id`` is set when an agent job started it.

    ``sm_util_pct`` and ``mem_bw_util_pct`` are its share of the GPU's SMs and memory bandwidth
    in the driver's latest sample (0 when it had no sample, None when the driver does not
    report per-process use). From ``/proc``: ``cpu_pct`` (100 = one CPU core busy, measured
    over a fraction of a second), ``rss_bytes`` (resident host memory) and ``elapsed_s`` (time
    since the process started); None where the process is not visible (another container's).
    """

    gpu_index: int
    pid: int
    user: Optional[str]
    command: Optional[str]
    used_mem_bytes: Optional[int]
    job_id: Optional[str] = None
    sm_util_pct: Optional[int] = None
    mem_bw_util_pct: Optional[int] = None
    cpu_pct: Optional[float] = None
    rss_bytes: Optional[int] = None
    elapsed_s: Optional[float] = None


@dataclass(frozen=True)
class StatusSnapshot:
    """``gpu-agent status --json``. ``driver`` is None and ``nvml_error`` set when NVML failed."""

    host: HostInfo
    driver: Optional[DriverInfo]
    nvml_error: Optional[NvmlError]
    gpus: Tuple[GpuSnapshot, ...]
    processes: Tuple[ProcessSnapshot, ...]
    collected_at: str
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class HealthCheck:
    """One check: ``status`` is pass, warn, fail or skip; ``hint`` says what to do ("" on pass).

    ``summary`` and ``hint`` are English. ``summary_template`` and ``hint_template``, when not
    None, are the English templates they were formatted from (``template.format(**params)``,
    parameters as text), so that a reader can show them in another language; agents before
    these fields send neither (they default to None and {})."""

    id: str
    status: str
    summary: str
    hint: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    summary_template: Optional[str] = None
    summary_params: Mapping[str, str] = field(default_factory=dict)
    hint_template: Optional[str] = None
    hint_params: Mapping[str, str] = field(default_factory=dict)
    #: A finding of several parts (or one whose parameters are texts too), when the templates
    #: are not above: each part is English text shown as it is, or ``{"template": ...,
    #: "params": {...}}`` whose parameters are text, such parts, or lists of them. Summary
    #: parts are clauses (English joins them with "; "), hint parts sentences (with " ").
    summary_parts: Tuple[Any, ...] = ()
    hint_parts: Tuple[Any, ...] = ()


@dataclass(frozen=True)
class HealthReport:
    """``gpu-agent health --json``: ``status`` is the worst status among the checks."""

    status: str
    checks: Tuple[HealthCheck, ...]
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class JobGpuStat:
    """What one GPU did during a job: average utilisation % and peak memory in bytes."""

    index: int
    util_avg_pct: Optional[float]
    mem_peak_bytes: Optional[int]


@dataclass(frozen=True)
class Diagnosis:
    """A finding about a job a person can act on, e.g. code "dataloader_bound".

    ``message`` is English; ``template`` (agents.messages) and ``params`` are what it was
    made of, so that a reader shows it in another language (numbers carry their unit in
    their name: ``busy_pct``, ``rise_bytes``). Agents before these fields send neither."""

    code: str
    message: str
    template: Optional[str] = None
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSummary:
    """Filled in when a job ends."""

    duration_s: float
    cpu_avg_pct: Optional[float]
    gpus: Tuple[JobGpuStat, ...]
    diagnoses: Tuple[Diagnosis, ...]
    log_tail: str = ""


@dataclass(frozen=True)
class JobRecord:
    """A job on an instance; times are ISO 8601 UTC strings."""

    id: str
    name: Optional[str]
    state: str
    command: Tuple[str, ...]
    user: Optional[str]
    gpus_requested: Optional[str]
    gpus_assigned: Tuple[int, ...]
    retries: int
    attempt: int
    created_at: str
    started_at: Optional[str]
    finished_at: Optional[str]
    exit_code: Optional[int]
    summary: Optional[JobSummary] = None
    #: When the agent last changed this record (``jobs --since`` compares against it).
    updated_at: Optional[str] = None
    #: Why a job failed to start, was killed or was lost, in English; None when nothing to
    #: add. ``note_template`` and ``note_params``, when the template is not None, are what it
    #: was made of (agents.messages), for a reader of another language; older agents, and
    #: notes without a template, send the English only.
    note: Optional[str] = None
    note_template: Optional[str] = None
    note_params: Mapping[str, Any] = field(default_factory=dict)
    #: When a job asking for any free GPUs could not start as it was queued: every GPU it
    #: could not have, with what holds it (an agent job, processes, memory no visible process
    #: accounts for, or load), as ``who`` shows it but without command lines; () otherwise,
    #: once the job starts, and from agents before this field.
    gpus_in_use: Tuple[WhoGpu, ...] = ()


@dataclass(frozen=True)
class JobList:
    """``gpu-agent jobs --json``."""

    jobs: Tuple[JobRecord, ...]
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class WhoJob:
    """An agent job that holds or waits for GPUs.

    ``state`` "running": the GPUs in ``gpus`` are the job's from the moment it starts, before
    any of its processes opens them. "queued": it waits; ``gpus`` are the GPUs it asked for
    by index, () when it asked for a count (``gpus_requested``). ``since`` is when it started
    (running) or was queued, ISO 8601 UTC.
    """

    job_id: str
    name: Optional[str]
    user: Optional[str]
    state: str
    gpus: Tuple[int, ...]
    gpus_requested: Optional[str]
    since: Optional[str]


#: GPU memory in use with no visible process behind it that makes a GPU "in use", in bytes
#: (an idle GPU's driver reserves well under this).
UNSEEN_MEM_MIN_BYTES = 2**30


@dataclass(frozen=True)
class WhoGpu:
    """One GPU and every process on it, with the agent job that started it where known.

    ``held_by`` is the running agent job the GPU is assigned to (also while its processes are
    starting); ``waiting`` the queued jobs that asked for this GPU by index.
    """

    index: int
    name: str
    processes: Tuple[ProcessSnapshot, ...]
    util_gpu_pct: Optional[int] = None
    mem_used_bytes: Optional[int] = None
    mem_total_bytes: Optional[int] = None
    held_by: Optional[WhoJob] = None
    waiting: Tuple[WhoJob, ...] = ()
    #: Whether the agent gives this GPU to a new job that asks for any free GPU: no agent
    #: job holds it, no more than ``agents.gpu_queue.FREE_MEM_MAX_BYTES`` of its memory is in
    #: use (by any process, visible here or not) and it is at most
    #: ``agents.gpu_queue.FREE_UTIL_MAX_PCT`` busy. None from agents before this field.
    free_for_jobs: Optional[bool] = None

    @property
    def unseen_mem_bytes(self) -> Optional[int]:
        """GPU memory in use beyond what the visible processes hold, in bytes, when it is at
        least :data:`UNSEEN_MEM_MIN_BYTES` (processes of another container or PID namespace,
        which NVML does not list here); None when there is none or it cannot be told."""
        if self.mem_used_bytes is None:
            return None
        held = [p.used_mem_bytes for p in self.processes]
        if any(m is None for m in held):
            return None
        unseen = self.mem_used_bytes - sum(m or 0 for m in held)
        return unseen if unseen >= UNSEEN_MEM_MIN_BYTES else None

    @property
    def free(self) -> bool:
        """Whether a new job may have it: :attr:`free_for_jobs` where the agent said; from
        older agents, no process on it, no agent job holding it, and no memory in use by
        processes that are not visible here."""
        if self.free_for_jobs is not None:
            return self.free_for_jobs
        return not self.processes and self.held_by is None and self.unseen_mem_bytes is None

    @property
    def foreign_processes(self) -> Tuple[ProcessSnapshot, ...]:
        """The processes on it that no agent job started."""
        return tuple(p for p in self.processes if p.job_id is None)


@dataclass(frozen=True)
class WhoReport:
    """``gpu-agent who --json``; ``waiting_any`` are queued jobs that asked for a count of GPUs
    (any free ones)."""

    gpus: Tuple[WhoGpu, ...]
    waiting_any: Tuple[WhoJob, ...] = ()
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class VersionInfo:
    """``gpu-agent version --json``."""

    agent_version: str
    python_version: str
    schema: int = SCHEMA_VERSION


# Which fields hold nested documents: name -> (class, is a list).
_NESTING: Dict[type, Dict[str, Tuple[type, bool]]] = {
    StatusSnapshot: {
        "host": (HostInfo, False),
        "driver": (DriverInfo, False),
        "nvml_error": (NvmlError, False),
        "gpus": (GpuSnapshot, True),
        "processes": (ProcessSnapshot, True),
    },
    HealthReport: {"checks": (HealthCheck, True)},
    JobSummary: {"gpus": (JobGpuStat, True), "diagnoses": (Diagnosis, True)},
    JobRecord: {"summary": (JobSummary, False), "gpus_in_use": (WhoGpu, True)},
    JobList: {"jobs": (JobRecord, True)},
    WhoGpu: {
        "processes": (ProcessSnapshot, True),
        "held_by": (WhoJob, False),
        "waiting": (WhoJob, True),
    },
    WhoReport: {"gpus": (WhoGpu, True), "waiting_any": (WhoJob, True)},
}


def to_dict(doc: Any) -> Dict[str, Any]:
    """A dataclass document as plain JSON-ready data (tuples become lists)."""
    return asdict(doc)


def dumps(doc: Any) -> str:
    """A document as one line of JSON (compact, keys sorted; see :mod:`agents.wire`)."""
    return wire.dumps(to_dict(doc))


def loads(cls: Type[T], text: str) -> T:
    """Parse ``text`` as a ``cls`` document. Raises ProtocolError on bad JSON, schema or shape,
    and, before parsing, on a document over :data:`MAX_DOCUMENT_CHARS` characters or nested
    deeper than :data:`MAX_DEPTH`."""
    if len(text) > MAX_DOCUMENT_CHARS:
        raise ProtocolError(
            f"the document is {len(text)} characters long; at most {MAX_DOCUMENT_CHARS} are read"
        )
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise ProtocolError(f"the document nests {depth} deep; at most {MAX_DEPTH} is read")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    return from_dict(cls, data)


def nesting_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON ``text`` (brackets inside strings do not
    count); without recursion, in time linear in the length. Meant for valid JSON: for other
    text it is a bound the parser will refuse anyway."""
    brackets = _NOT_BRACKETS.sub("", text)
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def from_dict(cls: Type[T], data: Any) -> T:
    """Build a ``cls`` document from parsed JSON. Raises ProtocolError when it does not fit."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    if "schema" in names and data.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ProtocolError(
            f"{cls.__name__}: schema {data.get('schema')!r}, this build reads {SCHEMA_VERSION}"
        )
    nested = _NESTING.get(cls, {})
    kwargs: Dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name not in data:
            continue
        value = data[f.name]
        sub = nested.get(f.name)
        if sub is not None and value is not None:
            sub_cls, many = sub
            if many:
                if not isinstance(value, list):
                    raise ProtocolError(f"{cls.__name__}.{f.name}: expected a list")
                value = tuple(from_dict(sub_cls, item) for item in value)
            else:
                value = from_dict(sub_cls, value)
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"{cls.__name__}: {exc}") from exc


def worst_status(statuses: Tuple[str, ...]) -> str:
    """The worst of some check statuses (fail > warn > skip > pass); "pass" for none."""
    order = {name: rank for rank, name in enumerate(CHECK_STATUSES)}
    return max(statuses, key=lambda s: order[s], default="pass")


# --- jobs: GPU requests and errors ----------------------------------------------------------


class JobError(Exception):
    """A job command failed; ``str(err)`` says why and what to do (English). Exit code 1.

    ``code`` names the kind of failure (a key of ``agents.messages.ERROR_TEMPLATES``);
    ``template`` and ``params``, when the template is not None, are the sentence it was made
    of, for a reader of another language (``--json`` prints them as a :class:`JobFailure`).
    Build one with :meth:`said`; a plain message has no template."""

    exit_code = 1
    default_code = "job_failed"

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        template: Optional[str] = None,
        params: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.template = template
        self.params: Dict[str, Any] = dict(params or {})

    @classmethod
    def said(
        cls: Type[E], code: str, template: str, /, *, sentence: bool = False, **params: Any
    ) -> E:
        """The error of ``code`` told by ``template`` filled with ``params``; its English is
        the sentence as a clause (``gpu-agent: error: this machine has ...``) unless
        ``sentence``."""
        values = messages.params_of(**params)
        text = messages.english(template, values)
        return cls(
            text if sentence else messages.clause(text),
            code=code,
            template=template,
            params=values,
        )

    def failure(self) -> JobFailure:
        """The error as the document ``--json`` prints."""
        return JobFailure(
            code=self.code,
            message=str(self),
            template=self.template,
            params=dict(self.params),
            exit_code=self.exit_code,
        )


class JobRequestError(JobError):
    """The request itself is wrong (bad --gpus, missing command, unknown directory). Exit code 2."""

    exit_code = 2
    default_code = "bad_request"


class JobNotFound(JobError):
    """No job has this id (or more than one starts with it)."""

    default_code = "job_not_found"


@dataclass(frozen=True)
class JobFailure:
    """What a job command with ``--json`` prints on stdout when it fails (exit code 1 or 2;
    the English is on stderr too): ``code`` (agents.messages.ERROR_TEMPLATES), ``message``
    in English, and the ``template`` and ``params`` it was made of (None and {} for a
    failure told in English only)."""

    code: str
    message: str
    template: Optional[str] = None
    params: Mapping[str, Any] = field(default_factory=dict)
    exit_code: int = 1
    error: bool = True
    schema: int = SCHEMA_VERSION


@dataclass(frozen=True)
class GpuRequest:
    """GPUs a job wants: ``count`` of them (0: none, -1: all, N: any N free ones), exactly
    ``indices`` when given (then ``count`` is their number). ``auto`` is the default, one free
    GPU (count 1), which :func:`agents.gpu_queue.resolve_request` turns into no GPU on a
    machine without a usable one."""

    count: int = 0
    indices: Tuple[int, ...] = ()
    auto: bool = False

    @property
    def text(self) -> str:
        """The request as ``--gpus`` takes it: ``auto``, ``none``, ``all``, ``any:N`` or GPU
        indices (``0,1``; ``3``)."""
        if self.auto:
            return GPUS_AUTO
        if self.indices:
            return ",".join(str(i) for i in self.indices)
        if self.count < 0:
            return "all"
        return f"any:{self.count}" if self.count else "none"


#: ``--gpus`` when it is not given: one free GPU (no GPU on a machine without a usable one).
GPUS_AUTO = "auto"
#: The forms ``--gpus`` takes, for help texts and error messages.
GPUS_FORMS = (
    "--gpus 0 or --gpus 0,1 (these GPUs, numbered as CUDA_VISIBLE_DEVICES and nvidia-smi "
    "number them), --gpus any:2 (any 2 free GPUs), --gpus all, --gpus none (CPU only); "
    "without --gpus: one free GPU"
)
_ANY = "any"


def parse_gpus(text: Optional[str]) -> GpuRequest:
    """``--gpus`` as a request. GPU indices mean what ``CUDA_VISIBLE_DEVICES`` means: ``0``
    is GPU 0, ``0,1`` GPUs 0 and 1 (``1,`` is GPU 1). ``any:N`` (or ``any``, one) is any N
    free GPUs, ``all`` every GPU, ``none`` no GPU; None or ``auto`` is the default, one free
    GPU. Raises JobRequestError, whose message shows the forms."""
    if text is None:
        return GpuRequest(count=1, auto=True)
    raw = text.strip().lower().replace(" ", "")
    if raw == GPUS_AUTO:
        return GpuRequest(count=1, auto=True)
    if raw == "none":
        return GpuRequest()
    if raw == "all":
        return GpuRequest(count=-1)
    if raw == _ANY or raw.startswith(_ANY + ":"):
        return _parse_any(text, raw)
    parts = raw.split(",")
    if len(parts) > 1 and parts[-1] == "":
        parts = parts[:-1]  # "1," is GPU 1, as CUDA_VISIBLE_DEVICES reads it
    if not all(p.isdigit() for p in parts):
        raise _not_understood(text, raw)
    indices = tuple(int(p) for p in parts)
    if len(set(indices)) != len(indices):
        raise JobRequestError.said("gpus_twice", messages.GPUS_TWICE, text=repr(text))
    return GpuRequest(count=len(indices), indices=tuple(sorted(indices)))


def _parse_any(text: str, raw: str) -> GpuRequest:
    number = raw[len(_ANY) + 1 :] if raw != _ANY else "1"
    if not number.isdigit() or int(number) == 0:
        raise JobRequestError.said("gpus_any_count", messages.GPUS_ANY_COUNT, text=repr(text))
    return GpuRequest(count=int(number))


def _not_understood(text: str, raw: str) -> JobRequestError:
    template = messages.GPUS_WRITE_NONE if raw in ("", "-1") else messages.GPUS_NOT_UNDERSTOOD
    return JobRequestError.said("gpus_not_understood", template, text=repr(text))


def gpus_phrase(text: Optional[str]) -> str:
    """A request as a job record stores it (``gpus_requested``), in words: "GPU 3",
    "GPUs 0, 1", "one free GPU", "any 2 free GPUs", "all GPUs", or "no GPU (CPU only)" (also
    for None, which older records store for no GPU)."""
    if not text or text.strip().lower() == "none":
        return "no GPU (CPU only)"
    try:
        request = parse_gpus(text)
    except JobRequestError:
        return text
    if request.auto:
        return "one free GPU"
    if request.indices:
        return assigned_phrase(request.indices, with_env=False)
    if request.count < 0:
        return "all GPUs"
    return "one free GPU" if request.count == 1 else f"any {request.count} free GPUs"


def assigned_phrase(indices: Sequence[int], *, with_env: bool = True) -> str:
    """GPUs a job got, as "GPU 0 (CUDA_VISIBLE_DEVICES=0)" or "GPUs 0, 1
    (CUDA_VISIBLE_DEVICES=0,1)"; "no GPU (CPU only)" for none."""
    if not indices:
        return "no GPU (CPU only)"
    words = ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)
    if not with_env:
        return words
    return f"{words} (CUDA_VISIBLE_DEVICES={','.join(str(i) for i in indices)})"


# --- commands as people read them ----------------------------------------------------------

#: Characters that make a shell argument need quotes (at any place in it).
_SHELL_SPECIAL = frozenset(" \t\n\r'\"\\$`|&;<>()*?[]{}!#~")
_SAFE_IN_DOUBLE = re.compile(r'(["\\$`])')


def show_command(argv: Sequence[str]) -> str:
    """argv as one readable line: an argument is quoted only where a space or a character
    the shell treats specially needs it, in single quotes, or double quotes when it holds a
    single quote (``python -c "print('hi')"``); control characters as ``$'\\n'``. For
    showing only: the exact argv is what runs."""
    return " ".join(_shown_arg(arg) for arg in argv)


def _shown_arg(arg: str) -> str:
    if arg == "":
        return "''"
    if any((ch < " " and ch != "\t") or ch == "\x7f" for ch in arg):
        return "$'" + "".join(_c_escape(ch) for ch in arg) + "'"
    if not any(ch in _SHELL_SPECIAL for ch in arg):
        return arg
    if "'" not in arg:
        return f"'{arg}'"
    return '"' + _SAFE_IN_DOUBLE.sub(r"\\\1", arg) + '"'


def _c_escape(ch: str) -> str:
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "'": "\\'", "\\": "\\\\"}
    if ch in named:
        return named[ch]
    if ch < " " or ch == "\x7f":
        return f"\\x{ord(ch):02x}"
    return ch
