"""What the agent tells a person, as templates and parameters: job refusals, why the GPUs
cannot be read, a job's notes and its diagnoses.

Standard library only, Python 3.9. Each template is an English sentence with ``{name}``
placeholders; it is the message id of the bot's catalogue, so the bot shows it in the
reader's language, filled with the parameters sent beside it. Parameters are numbers or
text; a number carries its unit in its name and is written out by the reader
(:func:`shown_value`: ``busy_pct`` 12.3 is "12%", ``rise_bytes`` is GiB). The parameter
``name`` is the machine: the agent says "this machine", the bot puts the instance's name.

The agent prints the English (:func:`english`) on its command line and in the ``message``
fields beside the template, so a reader that knows no template (an older bot, a terminal)
still reads a whole sentence.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

#: What the agent calls the machine it runs on (the ``name`` parameter).
THIS_MACHINE = "this machine"
_GIB = 1024.0**3


def N_(template: str) -> str:
    """Mark ``template`` for the bot's catalogue; it is used as it is."""
    return template


def shown_value(name: str, value: Any) -> str:
    """A parameter as English text: ``*_pct`` as a whole percent, ``*_bytes`` as GiB with one
    decimal, anything else as ``str``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if name.endswith("_pct"):
            return f"{value:.0f}%"
        if name.endswith("_bytes"):
            return f"{value / _GIB:.1f} GiB"
    return str(value)


def english(template: str, params: Mapping[str, Any]) -> str:
    """``template`` filled with ``params`` as English text."""
    if not params:
        return template
    return template.format(**{key: shown_value(key, value) for key, value in params.items()})


def clause(sentence: str) -> str:
    """A sentence as the tail of ``gpu-agent: error: ...``: first letter small, no stop."""
    text = sentence.rstrip(".")
    return text[:1].lower() + text[1:]


def params_of(**values: Any) -> Dict[str, Any]:
    """Parameters as JSON holds them: numbers stay numbers, anything else becomes text."""
    return {
        key: value
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else str(value)
        for key, value in values.items()
    }


# --- job refusals: code -> template(s) --------------------------------------------------------

GPUS_NOT_UNDERSTOOD = N_(
    "--gpus {text} is not understood: write --gpus 0 or --gpus 0,1 (these GPUs, numbered "
    "as CUDA_VISIBLE_DEVICES and nvidia-smi number them), --gpus any:2 (any 2 free GPUs), "
    "--gpus all, --gpus none (CPU only); without --gpus: one free GPU."
)
GPUS_WRITE_NONE = N_("--gpus {text}: for a job without GPUs write --gpus none.")
GPUS_TWICE = N_("--gpus {text} names a GPU twice; give each GPU once.")
GPUS_ANY_COUNT = N_(
    "--gpus {text}: write any:N with N a number of GPUs from 1 (--gpus any:2), or --gpus "
    "none for CPU only."
)
#: GPUs named that the machine lacks: (the machine has one GPU, one GPU named missing).
GPUS_MISSING = {
    (False, True): N_(
        "{name} has {count} GPUs ({indices}); --gpus {text} names GPU {missing}, which it does "
        "not have. --gpus takes GPU indices as CUDA_VISIBLE_DEVICES does; for a number of free "
        "GPUs write --gpus any:N (at most {most} here)."
    ),
    (False, False): N_(
        "{name} has {count} GPUs ({indices}); --gpus {text} names GPUs {missing}, which it "
        "does not have. --gpus takes GPU indices as CUDA_VISIBLE_DEVICES does; for a number of "
        "free GPUs write --gpus any:N (at most {most} here)."
    ),
    (True, True): N_(
        "{name} has 1 GPU ({indices}); --gpus {text} names GPU {missing}, which it does not "
        "have. --gpus takes GPU indices as CUDA_VISIBLE_DEVICES does; for a number of free GPUs "
        "write --gpus any:N (at most {most} here)."
    ),
    (True, False): N_(
        "{name} has 1 GPU ({indices}); --gpus {text} names GPUs {missing}, which it does not "
        "have. --gpus takes GPU indices as CUDA_VISIBLE_DEVICES does; for a number of free GPUs "
        "write --gpus any:N (at most {most} here)."
    ),
}
#: More GPUs asked for than the machine has: (the machine has one GPU).
GPUS_TOO_MANY = {
    False: N_("{name} has {count} GPUs ({indices}); --gpus {text} asks for {wanted}."),
    True: N_("{name} has 1 GPU ({indices}); --gpus {text} asks for {wanted}."),
}
NO_USABLE_GPU = N_(
    "No NVIDIA GPU can be used on {name} ({why}), and --gpus {text} asks for GPUs; "
    "`gpu-agent health` shows why, or run the job with --gpus none for CPU only."
)
#: Why the GPUs cannot be read; ``hint`` is the agent's hint for the NVML error (one of
#: agents.nvml's fixed sentences), ``code`` its kind (``NVML_ERROR_CODES``).
NVML_NO_DRIVER = N_("No NVIDIA driver on {name} (nvidia-smi / NVML not found): {hint}")
NVML_NOT_LOADED = N_("The NVIDIA driver on {name} is installed but not loaded: {error}. {hint}")
NVML_FAILED = N_("The GPUs of {name} cannot be read (NVML: {code}): {error}. {hint}")
NO_COMMAND = N_("No command given: put it after --, e.g. run -- python train.py.")
RETRIES_RANGE = N_("--retries must be between 0 and {most}.")
ENV_FORM = N_("--env {item}: write it as NAME=VALUE.")
ENV_RESERVED = N_("--env {key}: the agent sets {key} itself.")
CWD_MISSING = N_("--cwd {path}: no such directory.")
NOT_EXECUTABLE = N_("{program}: not an executable file (from {path}).")
COMMAND_NOT_FOUND = N_("{program}: command not found on PATH.")
SINCE_FORM = N_("--since {value} is not an ISO 8601 time (like 2026-12-02T11:00:00Z).")
JOB_FINISHED = N_("Job {job} has already finished ({state}).")
SUPERVISOR_FAILED = N_("Could not start the job's supervisor: {error}.")

#: Every code a job command's error document may carry, with its templates (codes without
#: a template are sent with the English only: ``job_failed``, ``job_not_found``).
ERROR_TEMPLATES: Mapping[str, Tuple[str, ...]] = {
    "gpus_not_understood": (GPUS_NOT_UNDERSTOOD, GPUS_WRITE_NONE),
    "gpus_twice": (GPUS_TWICE,),
    "gpus_any_count": (GPUS_ANY_COUNT,),
    "gpus_missing": tuple(GPUS_MISSING.values()),
    "gpus_too_many": tuple(GPUS_TOO_MANY.values()),
    "no_usable_gpu": (NO_USABLE_GPU,),
    "nvml_failed": (NVML_NO_DRIVER, NVML_NOT_LOADED, NVML_FAILED),
    "no_command": (NO_COMMAND,),
    "retries_range": (RETRIES_RANGE,),
    "env_form": (ENV_FORM,),
    "env_reserved": (ENV_RESERVED,),
    "cwd_missing": (CWD_MISSING,),
    "not_executable": (NOT_EXECUTABLE,),
    "command_not_found": (COMMAND_NOT_FOUND,),
    "since_form": (SINCE_FORM,),
    "job_finished": (JOB_FINISHED,),
    "supervisor_failed": (SUPERVISOR_FAILED,),
    "job_not_found": (),
    "job_failed": (),
    "bad_request": (),
}

# --- a job's notes ----------------------------------------------------------------------------

NOTE_CANCELLED_QUEUED = N_("cancelled while queued")
NOTE_CANCELLED = N_("cancelled")
NOTE_SUPERVISOR_GONE = N_(
    "the job's supervisor process is gone (killed, or the machine rebooted); what was left "
    "of the job was stopped"
)
NOTE_SUPERVISOR_FAILED = N_("could not start the job's supervisor: {error}")
NOTE_CANCELLED_BEFORE_START = N_("cancelled before it started")
NOTE_SUPERVISOR_CRASHED = N_("the job's supervisor failed: {error}")
NOTE_KILLED_BY = N_("killed by {signal}")
NOTE_NOT_STARTED = N_("could not start {program}: {error}")
NOTE_NO_GPU_VISIBLE = N_("no GPU is visible to the job's supervisor ({error})")
NOTE_NO_GPU_LISTED = N_("no GPU is visible to the job's supervisor (NVML lists none)")
#: Every note a job may carry.
NOTE_TEMPLATES: Tuple[str, ...] = (
    NOTE_CANCELLED_QUEUED,
    NOTE_CANCELLED,
    NOTE_SUPERVISOR_GONE,
    NOTE_SUPERVISOR_FAILED,
    NOTE_SUPERVISOR_CRASHED,
    NOTE_CANCELLED_BEFORE_START,
    NOTE_KILLED_BY,
    NOTE_NOT_STARTED,
    NOTE_NO_GPU_VISIBLE,
    NOTE_NO_GPU_LISTED,
)

# --- diagnoses ----------------------------------------------------------------------------------

DIAGNOSIS_CUDA_OOM = N_(
    "The job ran out of GPU memory (CUDA out of memory). Lower the batch size and use "
    "gradient accumulation to keep the effective batch, train in mixed precision (bf16), "
    "or turn on activation checkpointing; `/gpu fit` estimates what fits."
)
DIAGNOSIS_DATALOADER_BOUND = N_(
    "The GPUs were busy only {gpu_util_pct} of the time while the CPU ran at {cpu_pct} "
    "(of one core): feeding data is likely the bottleneck. Use more DataLoader workers "
    "(`num_workers`), `pin_memory=True`, preprocess the data once, or read it from faster "
    "local disk."
)
DIAGNOSIS_GPU_IMBALANCE = N_(
    "GPU {busy_gpu} averaged {busy_pct} but GPU {idle_gpu} only {idle_pct}: the work is not "
    "spread over the GPUs. Launch one process per GPU (`torchrun --nproc_per_node={gpus}` "
    "with DistributedDataParallel), or ask for fewer GPUs."
)
DIAGNOSIS_GPU_UNUSED = N_(
    "The job held its GPUs but never used them: check that the model and data are moved to "
    "the GPU (`.to('cuda')`) and that torch sees CUDA (`/gpu health`), or run it without "
    "--gpus."
)
DIAGNOSIS_MEMORY_LEAK = N_(
    "GPU {gpu} memory kept rising (+{rise_bytes} after warm-up): something holds on to "
    "tensors. Log losses with `loss.item()` rather than keeping the tensor, detach what you "
    "store across steps, and run evaluation under `torch.no_grad()`."
)
