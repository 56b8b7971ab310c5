"""Checks of the CUDA stack: dev_nodes, torch_build, cuda_compat, arch, visibility.

Pure functions of the device-node facts, the NVML snapshot and the torch probe's outcome.
"""

from __future__ import annotations

import re
import shlex
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from agents.checks.common import FAIL, N_, PASS, SKIP, WARN, Message, Text, make
from agents.probe import BAD_OUTPUT, CRASHED, PYTHON_NOT_FOUND, TIMEOUT, ProbeOutcome, TorchFacts
from agents.protocol import HealthCheck, HostInfo, StatusSnapshot
from agents.system import DevNodeFacts

WHEEL_INDEX = "https://download.pytorch.org/whl/"
#: CUDA versions PyTorch publishes wheel indexes for (cuXYZ), oldest first.
WHEEL_CUDA_VERSIONS: Tuple[Tuple[int, int], ...] = (
    (11, 8),
    (12, 1),
    (12, 4),
    (12, 6),
    (12, 8),
    (12, 9),
    (13, 0),
)
#: The index suggested when the driver's CUDA version is unknown.
DEFAULT_WHEEL_CUDA = (12, 6)
#: Compute capabilities (and newer) that only CUDA 12.8+ wheels know (Blackwell).
BLACKWELL_MIN_CAPABILITY = (10, 0)
#: Minimum Linux driver for each CUDA major version (minor-version compatibility).
MIN_DRIVER_FOR_CUDA_MAJOR: Dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
#: Minimum Linux x86_64 driver of each CUDA release on its own (the CUDA Toolkit release
#: notes' driver table, GA releases). Below it, down to the major's minimum, a build for that
#: release runs only through minor-version compatibility: without what needs the release's
#: own driver, such as JIT-compiling its PTX for a GPU the build has no native code for.
MIN_DRIVER_FOR_CUDA: Dict[Tuple[int, int], str] = {
    (11, 0): "450.51.05",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}

_CONTAINER_HINT = N_(
    "The container was started without GPUs: start it with `docker run --gpus all` (the "
    "nvidia-container-toolkit must be installed on the host), or pick a GPU template at the "
    "provider."
)


# --- dev_nodes --------------------------------------------------------------------------------


def check_dev_nodes(nodes: DevNodeFacts, host: Optional[HostInfo] = None) -> HealthCheck:
    """/dev/nvidiactl and /dev/nvidiaN exist and this user may read and write them
    (/dev/dxg on WSL)."""
    details = {
        "nvidiactl": nodes.control.exists,
        "gpu_nodes": [n.path for n in nodes.gpus],
        "nvidia_uvm": nodes.uvm.exists,
    }
    if host is not None and host.is_wsl and not nodes.control.exists:
        return _wsl_nodes(nodes, details)
    if not nodes.control.exists and not nodes.gpus:
        return make("dev_nodes", FAIL, N_("no /dev/nvidia* device nodes"), _CONTAINER_HINT, details)
    if not nodes.control.exists or not nodes.gpus:
        missing = nodes.control.path if not nodes.control.exists else "/dev/nvidia0.."
        return make(
            "dev_nodes",
            FAIL,
            N_("{missing} missing: the GPU device nodes are incomplete", missing=missing),
            N_(
                "Load the driver (`sudo modprobe nvidia`, or reboot after installing it); in a "
                "container: The container was started without GPUs: start it with `docker run "
                "--gpus all` (the nvidia-container-toolkit must be installed on the host), or "
                "pick a GPU template at the provider."
            ),
            details,
        )
    unusable = [n.path for n in (nodes.control, *nodes.gpus) if not n.usable]
    if unusable:
        return make(
            "dev_nodes",
            FAIL,
            N_("no read/write access to {unusable}", unusable=", ".join(unusable)),
            N_(
                "Add your user to the group that owns them (see `ls -l /dev/nvidia*`, often "
                "`video`: `sudo usermod -aG video $USER`, then log in again)."
            ),
            details,
        )
    in_container = host is not None and host.in_container
    if not nodes.uvm.exists and in_container:
        return make(
            "dev_nodes",
            WARN,
            N_("/dev/nvidia-uvm missing: CUDA programs will fail to start"),
            N_(
                "Start the container with `--gpus all` (the toolkit passes nvidia-uvm), or ask "
                "the provider."
            ),
            details,
        )
    if nodes.uvm.exists:
        summary = N_("/dev/nvidiactl and {n} GPU node(s) usable", n=len(nodes.gpus))
    else:
        summary = N_(
            "/dev/nvidiactl and {n} GPU node(s) usable (/dev/nvidia-uvm appears on first CUDA use)",
            n=len(nodes.gpus),
        )
    return make("dev_nodes", PASS, summary, "", details)


def _wsl_nodes(nodes: DevNodeFacts, details: Dict[str, object]) -> HealthCheck:
    details = dict(details, dxg=nodes.dxg.exists)
    if nodes.dxg.usable:
        return make("dev_nodes", PASS, N_("WSL: GPU reached through /dev/dxg"), "", details)
    return make(
        "dev_nodes",
        FAIL,
        N_("WSL: /dev/dxg missing or not usable"),
        N_(
            "Install the current NVIDIA driver on Windows (not inside WSL) and run `wsl --update`, "
            "then `wsl --shutdown` and start WSL again."
        ),
        details,
    )


# --- torch_build ------------------------------------------------------------------------------


def check_torch_build(probe: ProbeOutcome, status: StatusSnapshot) -> HealthCheck:
    """torch imports and is a CUDA build; a CPU-only or ROCm build fails with the install
    command for a CUDA wheel matching the driver."""
    failed = _probe_failure("torch_build", probe)
    if failed is not None:
        return failed
    facts = probe.facts
    assert facts is not None
    python = facts.python_executable or probe.python
    details = _torch_details(facts)
    if not facts.torch_installed:
        return make(
            "torch_build",
            FAIL,
            N_(
                "torch not installed in {python} (Python {python_version})",
                python=python,
                python_version=facts.python_version,
            ),
            N_(
                "Install a CUDA build: `{install_command}`. If your jobs use another Python, pass "
                "it with --python PATH.",
                install_command=install_command(python, status, reinstall=False),
            ),
            details,
        )
    if facts.torch_version is None:
        return make(
            "torch_build",
            FAIL,
            N_(
                "torch fails to import: {torch_import_error}",
                torch_import_error=facts.torch_import_error,
            ),
            N_(
                "Reinstall it: `{install_command}`.",
                install_command=install_command(python, status, reinstall=True),
            ),
            details,
        )
    if facts.torch_hip_version:
        return make(
            "torch_build",
            FAIL,
            N_("torch {torch_version} is a ROCm (AMD) build", torch_version=facts.torch_version),
            N_(
                "Install the CUDA build: `{install_command}`.",
                install_command=install_command(python, status, reinstall=True),
            ),
            details,
        )
    if not facts.torch_cuda_version:
        return make(
            "torch_build",
            FAIL,
            N_(
                "torch {torch_version} is a CPU-only build: it cannot use the GPU",
                torch_version=facts.torch_version,
            ),
            N_(
                "Replace it with a CUDA build: `{install_command}`.",
                install_command=install_command(python, status, reinstall=True),
            ),
            details,
        )
    return make(
        "torch_build",
        PASS,
        N_(
            "torch {torch_version} built for CUDA {torch_cuda_version}",
            torch_version=facts.torch_version,
            torch_cuda_version=facts.torch_cuda_version,
        ),
        "",
        details,
    )


def install_command(python: str, status: StatusSnapshot, *, reinstall: bool) -> str:
    """The pip command line that installs a CUDA build of torch for this driver and GPU."""
    py = shlex.quote(python)
    install = f"{py} -m pip install torch --index-url {WHEEL_INDEX}{wheel_tag(status)}"
    return f"{py} -m pip uninstall -y torch && {install}" if reinstall else install


def wheel_tag(status: StatusSnapshot) -> str:
    """The PyTorch wheel index (e.g. "cu124") for the driver's CUDA version and the GPUs:
    the newest index of the driver's CUDA major not above its version (else that major's
    oldest); cu128 or newer for Blackwell GPUs; cu126 when the driver is unknown."""
    driver_cuda = _parse_version(status.driver.cuda_version) if status.driver else None
    chosen = DEFAULT_WHEEL_CUDA
    if driver_cuda is not None:
        same_major = [v for v in WHEEL_CUDA_VERSIONS if v[0] == driver_cuda[0]]
        fitting = [v for v in same_major if v <= driver_cuda]
        # Within a major version any minor runs (minor-version compatibility).
        if fitting or same_major:
            chosen = fitting[-1] if fitting else same_major[0]
        else:
            older = [v for v in WHEEL_CUDA_VERSIONS if v <= driver_cuda]
            chosen = older[-1] if older else WHEEL_CUDA_VERSIONS[0]
    if _capabilities(status) and max(_capabilities(status)) >= BLACKWELL_MIN_CAPABILITY:
        chosen = max(chosen, (12, 8))
    return f"cu{chosen[0]}{chosen[1]}"


def _torch_details(facts: TorchFacts) -> Dict[str, object]:
    return {
        "python": facts.python_executable,
        "python_version": facts.python_version,
        "torch_version": facts.torch_version,
        "torch_cuda_version": facts.torch_cuda_version,
        "torch_import_error": facts.torch_import_error,
    }


def _probe_failure(check_id: str, probe: ProbeOutcome) -> Optional[HealthCheck]:
    """A fail result when the probe itself did not report, else None."""
    details = {
        "python": probe.python,
        "failure": probe.failure,
        "elapsed_s": round(probe.elapsed_s, 3),
    }
    if probe.failure == PYTHON_NOT_FOUND:
        return make(
            check_id,
            FAIL,
            N_("{python}: Python not found", python=probe.python),
            N_("Pass the Python your jobs use with --python /path/to/venv/bin/python."),
            details,
        )
    if probe.failure == TIMEOUT:
        return make(
            check_id,
            FAIL,
            N_("`import torch` and CUDA start-up did not finish: {message}", message=probe.message),
            N_(
                "Run `{python} -c 'import torch; print(torch.cuda.is_available())'` to see where "
                "it hangs (a stuck GPU, a slow network filesystem); a GPU that hangs needs a reset "
                "or a reboot. Allow more time with --timeout.",
                python=probe.python,
            ),
            details,
        )
    if probe.failure == CRASHED and "SyntaxError" in probe.message:
        return make(
            check_id,
            FAIL,
            N_(
                "{python} is too old to run the torch probe: {message}",
                python=probe.python,
                message=probe.message,
            ),
            N_("Pass a Python 3.7 or newer (the one your jobs use) with --python PATH."),
            details,
        )
    if probe.failure in (CRASHED, BAD_OUTPUT):
        return make(
            check_id,
            FAIL,
            N_("the torch probe failed: {message}", message=probe.message),
            N_(
                "Run `{python} -c 'import torch'` to see the error, then reinstall torch.",
                python=probe.python,
            ),
            details,
        )
    if probe.facts is None:
        return make(
            check_id,
            FAIL,
            N_("the torch probe gave no result: {message}", message=probe.message),
            "",
            details,
        )
    return None


# --- cuda_compat ------------------------------------------------------------------------------


def check_cuda_compat(probe: ProbeOutcome, status: StatusSnapshot) -> HealthCheck:
    """torch's CUDA major is not above the driver's; a newer minor within the major passes."""
    facts = _cuda_facts(probe)
    if facts is None or not facts.torch_cuda_version:
        return make("cuda_compat", SKIP, N_("skipped: no CUDA build of torch (see torch_build)"))
    torch_cuda = _parse_version(facts.torch_cuda_version)
    driver_text = status.driver.cuda_version if status.driver else None
    driver_cuda = _parse_version(driver_text)
    details = {"torch_cuda_version": facts.torch_cuda_version, "driver_cuda_version": driver_text}
    if torch_cuda is None or driver_cuda is None:
        return make(
            "cuda_compat",
            SKIP,
            N_("skipped: the driver's CUDA version is unknown (see nvml)"),
            "",
            details,
        )
    if torch_cuda[0] > driver_cuda[0] or _says_driver_too_old(facts.cuda_init_error):
        summary, hint = _driver_too_old(facts, status, torch_cuda, driver_cuda)
        return make("cuda_compat", FAIL, summary, hint, details)
    if torch_cuda > driver_cuda:
        return make(
            "cuda_compat",
            PASS,
            N_(
                "torch CUDA {torch_cuda_version} on a CUDA {driver_text} driver (minor-version "
                "compatibility)",
                torch_cuda_version=facts.torch_cuda_version,
                driver_text=driver_text,
            ),
            "",
            details,
        )
    return make(
        "cuda_compat",
        PASS,
        N_(
            "torch CUDA {torch_cuda_version} within the driver's CUDA {driver_text}",
            torch_cuda_version=facts.torch_cuda_version,
            driver_text=driver_text,
        ),
        "",
        details,
    )


def _driver_too_old(
    facts: TorchFacts,
    status: StatusSnapshot,
    torch_cuda: Tuple[int, int],
    driver_cuda: Tuple[int, int],
) -> Tuple[Text, Text]:
    """(summary, hint) for a torch whose CUDA the driver cannot run. The hint compares the
    driver's version with the minimums and never names one older than what runs: a driver
    new enough for the major gets the real cause (the release's own minimum, or another
    libcuda loaded than the driver's)."""
    torch_text = facts.torch_cuda_version or ""
    version = status.driver.version if status.driver is not None else ""
    driver_text = f"{version} (CUDA {driver_cuda[0]}.{driver_cuda[1]})".strip()
    have = _driver_version(version)
    major_min = MIN_DRIVER_FOR_CUDA_MAJOR.get(torch_cuda[0])
    own_min = MIN_DRIVER_FOR_CUDA.get(torch_cuda)
    command = install_command(facts.python_executable, status, reinstall=True)
    older = f"{driver_cuda[0]}.{driver_cuda[1]}"
    needs_major = torch_cuda[0] > driver_cuda[0] or major_min is None
    if (needs_major or _older(have, major_min)) and (have is None or _older(have, major_min)):
        return (
            N_(
                "torch needs CUDA {torch_cuda}; driver {driver} runs CUDA {driver_cuda} at most",
                torch_cuda=torch_text,
                driver=version or "?",
                driver_cuda=older,
            ),
            N_(
                "Upgrade the NVIDIA driver to {need} or newer (then reboot), or install a "
                "torch built for CUDA {driver_cuda} or older: `{command}`.",
                need=major_min or N_("a driver for CUDA {cuda}", cuda=torch_text),
                driver_cuda=older,
                command=command,
            ),
        )
    if torch_cuda > driver_cuda and (own_min is None or have is None or _older(have, own_min)):
        target: Message = own_min or N_(
            "a driver for CUDA {cuda} (nvidia-smi's CUDA Version)", cuda=torch_text
        )
        return (
            N_(
                "torch (CUDA {torch_cuda}) cannot start CUDA on driver {driver}: CUDA "
                "{torch_cuda}'s own minimum driver is {minimum}",
                torch_cuda=torch_text,
                driver=driver_text,
                minimum=own_min or N_("newer"),
            ),
            N_(
                "Driver {version} runs CUDA {major}.x builds only through minor-version "
                "compatibility, without what needs CUDA {torch_cuda}'s own driver (JIT-compiling "
                "its PTX for a GPU the build has no native code for). Either install a torch "
                "built for CUDA {driver_cuda} or older: `{command}`, or upgrade the NVIDIA "
                "driver to {target} or newer (then reboot).",
                version=version,
                major=torch_cuda[0],
                torch_cuda=torch_text,
                driver_cuda=older,
                command=command,
                target=target,
            ),
        )
    python = shlex.quote(facts.python_executable)
    return (
        N_(
            "torch (CUDA {torch_cuda}) says the driver is too old, but driver {driver} "
            "meets CUDA {torch_cuda}'s minimum ({minimum})",
            torch_cuda=torch_text,
            driver=driver_text,
            minimum=own_min or major_min,
        ),
        N_(
            "The driver is not what is old: torch loads another libcuda.so than the driver's, "
            "e.g. from a cuda-compat package, a CUDA toolkit's stubs directory or the container "
            "image. Find it with `ldconfig -p | grep libcuda` and LD_LIBRARY_PATH, and remove it "
            "so the driver's own libcuda.so.1 loads; `{python} -c 'import torch; "
            "torch.cuda.init()'` shows the error.",
            python=python,
        ),
    )


def _driver_version(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    """ "550.54.15" -> (550, 54, 15); None when absent or unreadable."""
    parts = (text or "").strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _older(have: Optional[Tuple[int, ...]], minimum: Optional[str]) -> bool:
    """Whether driver ``have`` is older than ``minimum`` (a version string); False when
    either is unknown."""
    needed = _driver_version(minimum)
    return have is not None and needed is not None and have < needed


def _says_driver_too_old(error: Optional[str]) -> bool:
    text = (error or "").lower()
    return "driver" in text and ("insufficient" in text or "too old" in text)


# --- arch -------------------------------------------------------------------------------------


def check_arch(probe: ProbeOutcome, status: StatusSnapshot) -> HealthCheck:
    """Each GPU's sm_XY is in torch's arch list, or binary-compatible code (same major,
    lower minor) is; PTX only warns (JIT at start-up)."""
    facts = _cuda_facts(probe)
    if facts is None or not facts.torch_cuda_version:
        return make("arch", SKIP, N_("skipped: no CUDA build of torch (see torch_build)"))
    if not facts.arch_list:
        return make(
            "arch", SKIP, N_("skipped: torch cannot start CUDA, so it lists no architectures")
        )
    capabilities = _capabilities(status) or [
        c for c in (_parse_version(d.capability) for d in facts.devices) if c is not None
    ]
    if not capabilities:
        return make("arch", SKIP, N_("skipped: no GPU compute capability known"))
    details = {"arch_list": list(facts.arch_list), "gpus": sorted({_sm(c) for c in capabilities})}
    verdicts = {c: arch_support(c, facts.arch_list) for c in set(capabilities)}
    missing = sorted(c for c, v in verdicts.items() if v == "missing")
    if missing:
        return make(
            "arch",
            FAIL,
            N_(
                "torch {torch_version} has no kernels for {sm}",
                torch_version=facts.torch_version,
                sm=", ".join(_sm(c) for c in missing),
            ),
            _arch_hint(missing, facts, status),
            details,
        )
    ptx = sorted(c for c, v in verdicts.items() if v == "ptx")
    if ptx:
        return make(
            "arch",
            WARN,
            N_(
                "{sm} runs only through PTX JIT (slow first start)",
                sm=", ".join(_sm(c) for c in ptx),
            ),
            N_(
                "Install a torch whose wheel lists {sm}: `{install_command}`.",
                sm=", ".join(_sm(c) for c in ptx),
                install_command=install_command(facts.python_executable, status, reinstall=True),
            ),
            details,
        )
    return make(
        "arch",
        PASS,
        N_("torch has kernels for {details}", details=", ".join(details["gpus"])),
        "",
        details,
    )


def arch_support(capability: Tuple[int, int], arch_list: Sequence[str]) -> str:
    """ "native" (sm_XY or a binary-compatible sm_X(y-k)), "ptx" (only compute_ZW <= XY) or
    "missing" for a GPU of ``capability`` and torch's ``get_arch_list()``."""
    sass: List[Tuple[int, int]] = []
    sass_exact_only: List[Tuple[int, int]] = []
    ptx: List[Tuple[int, int]] = []
    for entry in arch_list:
        parsed = _parse_arch(entry)
        if parsed is None:
            continue
        kind, version, specific = parsed
        if kind == "compute":
            ptx.append(version)
        elif specific:
            sass_exact_only.append(version)
        else:
            sass.append(version)
    if capability in sass or capability in sass_exact_only:
        return "native"
    if any(v[0] == capability[0] and v[1] <= capability[1] for v in sass):
        return "native"
    if any(v <= capability for v in ptx):
        return "ptx"
    return "missing"


def _parse_arch(entry: str) -> Optional[Tuple[str, Tuple[int, int], bool]]:
    """ "sm_90" -> ("sm", (9, 0), False); "sm_90a" -> ("sm", (9, 0), True); "compute_86" PTX."""
    match = re.match(r"^(sm|compute)_(\d+)([af]?)$", entry.strip())
    if not match:
        return None
    digits = match.group(2)
    if len(digits) < 2:
        return None
    return match.group(1), (int(digits[:-1]), int(digits[-1])), bool(match.group(3))


def _arch_hint(
    missing: Sequence[Tuple[int, int]], facts: TorchFacts, status: StatusSnapshot
) -> Text:
    known = [p for p in (_parse_arch(a) for a in facts.arch_list) if p is not None]
    newest = max((p[1] for p in known), default=(0, 0))
    if max(missing) > newest:
        return N_(
            "This GPU is newer than the wheel: install a build that lists {sm}: `{command}` "
            "(Blackwell GPUs such as the RTX 5090 need cu128 or newer).",
            sm=_sm(max(missing)),
            command=install_command(facts.python_executable, status, reinstall=True),
        )
    return N_(
        "This torch dropped support for {sm}: install an older torch release "
        "whose `torch.cuda.get_arch_list()` still lists it, or rent a newer GPU.",
        sm=_sm(min(missing)),
    )


def _sm(capability: Tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


# --- visibility -------------------------------------------------------------------------------


def check_visibility(probe: ProbeOutcome, status: StatusSnapshot) -> HealthCheck:
    """torch sees as many CUDA devices as NVML sees GPUs (CUDA_VISIBLE_DEVICES explains fewer)."""
    facts = _cuda_facts(probe)
    if facts is None or not facts.torch_cuda_version:
        return make("visibility", SKIP, N_("skipped: no CUDA build of torch (see torch_build)"))
    torch_count = facts.device_count if facts.cuda_available else 0
    nvml_count = len(status.gpus) if status.nvml_error is None else None
    cvd = facts.cuda_visible_devices
    details = {
        "torch_device_count": torch_count,
        "nvml_gpu_count": nvml_count,
        "cuda_visible_devices": cvd,
        "cuda_init_error": facts.cuda_init_error,
    }
    if torch_count == 0:
        return _torch_sees_none(facts, cvd, details)
    if nvml_count is None:
        return make(
            "visibility",
            PASS,
            N_(
                "torch sees {torch_count} GPU(s) (NVML unavailable to compare)",
                torch_count=torch_count,
            ),
            "",
            details,
        )
    if torch_count == nvml_count:
        return make(
            "visibility",
            PASS,
            N_("torch sees all {torch_count} GPU(s)", torch_count=torch_count),
            "",
            details,
        )
    if torch_count > nvml_count or any(g.mig_mode for g in status.gpus):
        return make(
            "visibility",
            WARN,
            N_(
                "torch sees {torch_count} device(s), NVML {nvml_count} GPU(s) (MIG mode?)",
                torch_count=torch_count,
                nvml_count=nvml_count,
            ),
            N_(
                "With MIG each process sees the MIG instances it is given: check "
                "`nvidia-smi -L` and CUDA_VISIBLE_DEVICES."
            ),
            details,
        )
    if cvd is not None:
        return make(
            "visibility",
            WARN,
            N_(
                "torch sees {torch_count} of {nvml_count} GPUs: CUDA_VISIBLE_DEVICES={cvd}",
                torch_count=torch_count,
                nvml_count=nvml_count,
                cvd=cvd,
            ),
            N_("Unset CUDA_VISIBLE_DEVICES (or list every GPU) if you meant to use them all."),
            details,
        )
    return make(
        "visibility",
        FAIL,
        N_(
            "torch sees {torch_count} of {nvml_count} GPUs",
            torch_count=torch_count,
            nvml_count=nvml_count,
        ),
        N_(
            "Some GPUs do not start CUDA: check `nvidia-smi -q` for errors, reset them "
            "(`sudo nvidia-smi -r -i N`) or ask the provider."
        ),
        details,
    )


def _torch_sees_none(
    facts: TorchFacts, cvd: Optional[str], details: Mapping[str, object]
) -> HealthCheck:
    if cvd is not None and _hides_everything(cvd):
        hint = N_("CUDA_VISIBLE_DEVICES={cvd} hides every GPU: unset it.", cvd=repr(cvd))
    else:
        hint = N_(
            "torch cannot start CUDA: see dev_nodes and cuda_compat; after a driver upgrade, "
            "reboot."
        )
    if facts.cuda_init_error:
        summary = N_("torch sees no CUDA device: {error}", error=facts.cuda_init_error)
    else:
        summary = N_("torch sees no CUDA device")
    return make("visibility", FAIL, summary, hint, details)


def _hides_everything(cvd: str) -> bool:
    first = cvd.strip().split(",")[0].strip()
    return first == "" or first.startswith("-")


# --- helpers ----------------------------------------------------------------------------------


def _cuda_facts(probe: ProbeOutcome) -> Optional[TorchFacts]:
    facts = probe.facts
    if facts is None or facts.torch_version is None or facts.torch_hip_version:
        return None
    return facts


def _capabilities(status: StatusSnapshot) -> List[Tuple[int, int]]:
    found = [_parse_version(g.compute_capability) for g in status.gpus]
    return [c for c in found if c is not None]


def _parse_version(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """ "12.4" -> (12, 4); "12" -> (12, 0); None when absent or unreadable."""
    if not text:
        return None
    match = re.match(r"^\s*(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 0)
