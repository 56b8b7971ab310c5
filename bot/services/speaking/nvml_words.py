"""Why an instance's GPUs cannot be read, in the reader's language, by the kind of NVML error.

The agent reports an NVML failure as ``nvml_error`` (``code``, ``message``, ``hint``: see
agents/nvml.py), and its job commands refuse GPU work with an error document of code
``nvml_failed`` whose parameters are those three (agents/runner.py, read by
:mod:`bot.services.speaking.agent_text`). The code names the kind (``protocol.NVML_ERROR_CODES``);
the message is the driver's or loader's own English (``libnvidia-ml.so.1: cannot open shared
object file``), shown only as a detail in code formatting; the hint is one of the agent's
fixed sentences, marked here word for word so that the catalogue translates it (looked up
whole, never parsed).
"""

from __future__ import annotations

from bot.i18n import N_, t

#: What each kind of NVML error means, as the end of "the GPUs cannot be read: ...".
_KINDS = {
    "library_not_found": N_("the NVIDIA driver library does not load"),
    "driver_not_loaded": N_("the NVIDIA driver is installed but not loaded"),
    "no_permission": N_("the agent's user may not open the GPU devices"),
    "blocked_by_os": N_("the operating system blocks access to the GPUs"),
    "driver_library_mismatch": N_(
        "the NVIDIA driver library and the loaded kernel module are of different versions"
    ),
    "gpu_lost": N_("a GPU fell off the bus"),
    "unknown": N_("NVML failed unexpectedly"),
}
#: The agent's hint for each kind (agents/nvml.py's ``HINTS``, word for word), and the one it
#: gives when a GPU needs a reset.
HINTS = {
    "library_not_found": N_(
        "No NVIDIA driver library (libnvidia-ml.so.1) is visible here. In a container, start it "
        "with GPUs (`docker run --gpus all ...` with the NVIDIA Container Toolkit, or the nvidia "
        "runtime). On a VM or bare metal, install the NVIDIA driver. If you rented a GPU "
        "instance and see this, ask the provider: you are paying for a GPU you cannot use."
    ),
    "driver_not_loaded": N_(
        "The NVIDIA kernel module is not loaded. Run `sudo modprobe nvidia` and check "
        "`sudo dmesg | grep -i nvidia` for why it did not load; if that fails, reboot. After a "
        "kernel update the driver may need rebuilding (DKMS) or reinstalling."
    ),
    "no_permission": N_(
        "This user may not open /dev/nvidia*. Add it to the video group "
        "(`sudo usermod -aG video $USER`, then log in again) or run the agent as a user that "
        "can use the GPU."
    ),
    "blocked_by_os": N_(
        "The operating system blocked access to the GPU. On WSL2, update the NVIDIA driver on "
        "Windows (not inside Linux) and run `wsl --update`; in a container, check that the "
        "cgroup device rules allow /dev/nvidia*."
    ),
    "driver_library_mismatch": N_(
        "The NVIDIA driver was upgraded but the old kernel module is still loaded (driver/library "
        "version mismatch). Reboot the instance; nvidia-smi fails the same way until then."
    ),
    "gpu_lost": N_(
        "A GPU fell off the bus (look for Xid 79 in `sudo dmesg`). Reboot the instance; if it "
        "happens again, the hardware is failing: ask the provider to replace the GPU or move "
        "you to another host, and stop paying for this one."
    ),
    "unknown": N_(
        "NVML failed unexpectedly. Run `nvidia-smi` to see the driver's own error and "
        "`sudo dmesg | grep -i -e nvrm -e xid` for kernel messages; a reboot often clears it."
    ),
}
RESET_HINT = N_(
    "The GPU needs a reset: stop every process using it and run `sudo nvidia-smi -r`, or reboot."
)
_KNOWN_HINTS = frozenset((*HINTS.values(), RESET_HINT))
#: The longest detail shown, in characters (the loader's reasons can be long).
DETAIL_MAX = 300


def kind(code: str) -> str:
    """What an NVML error of ``code`` means, in the active language (an unknown code, from a
    newer agent, as ``unknown``)."""
    return t(_KINDS.get(code, _KINDS["unknown"]))


def hint(said: str) -> str:
    """The agent's hint in the active language; one the bot does not know as it was sent."""
    return t(said) if said in _KNOWN_HINTS else said


def detail(text: str) -> str:
    """The driver's own words as a code span, on one line and cut to :data:`DETAIL_MAX`."""
    flat = " ".join(text.replace("`", "'").split())
    if len(flat) > DETAIL_MAX:
        flat = flat[: DETAIL_MAX - 1] + "…"
    return f"`{flat}`"


def described(code: str, message: str) -> str:
    """The kind of the error in words, with the driver's message as a code-formatted detail:
    ``the NVIDIA driver is installed but not loaded (NVML said: `nvmlInit failed: ...`)``."""
    what = kind(code)
    if not message.strip():
        return what
    return t("{kind} (NVML said: {detail})", kind=what, detail=detail(message))
