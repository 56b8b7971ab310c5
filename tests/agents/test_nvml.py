"""agents.nvml: the real NVML path on this machine and the fake driving the collector."""

from __future__ import annotations

import ctypes
import os
import pwd
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from agents import nvml, protocol, wire
from agents.protocol import NVML_ERROR_CODES, NvmlError, StatusSnapshot
from agents.schema import HOST_FIELDS
from tests.agents.spinning import SpinningChild, assert_reads_what_it_used, measured

GIB = 1024**3
MIB = 1024**2


def _driver_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def _unused_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


# --- the real nvidia-ml-py on this machine -----------------------------------------------------


def test_real_nvml_without_a_driver_reports_library_not_found(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    status = nvml.collect_status()
    if _driver_library_loads():
        # A machine with a driver: NVML either works or says why, never raises.
        assert status.nvml_error is None or status.nvml_error.code in NVML_ERROR_CODES
        return
    assert "pynvml" not in sys.modules  # the library does not load: no bindings imported
    assert status.driver is None
    assert status.gpus == ()
    assert status.processes == ()
    err = status.nvml_error
    assert err is not None
    assert err.code == "library_not_found"
    assert "libnvidia-ml.so.1: cannot open shared object file" in err.message  # dlopen's reason
    assert "--gpus all" in err.hint
    assert "install the NVIDIA driver" in err.hint


def test_real_bindings_already_loaded_report_library_not_found_from_nvml_init(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    import pynvml

    assert "fake_nvml" not in pynvml.__file__, "the real nvidia-ml-py must be under test"
    status = nvml.collect_status()
    if _driver_library_loads():
        assert status.nvml_error is None or status.nvml_error.code in NVML_ERROR_CODES
        return
    err = status.nvml_error
    assert err is not None
    assert err.code == "library_not_found"
    assert "NVMLError_LibraryNotFound" in err.message
    assert err.hint == nvml.HINTS["library_not_found"]


def test_importing_the_module_loads_no_nvml():
    code = "import sys, agents.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


_IMPORT_REAL_PYNVML = """
import sys, threading
import agents.nvml
if sys.argv[1] == "threads":
    stop = threading.Event()
    threading.Thread(target=stop.wait).start()
nv = agents.nvml._import_pynvml()
assert "fake_nvml" not in nv.__file__
print("ctypes.util" in sys.modules)
print(nv.find_library("c") or "")
print(type(sys.modules["ctypes.util"]).__name__, hasattr(sys.modules["ctypes.util"], "__file__"))
if sys.argv[1] == "threads":
    stop.set()
"""


@pytest.mark.parametrize(("threads", "loaded"), [("single", "False"), ("threads", "True")])
def test_pynvml_import_defers_ctypes_util_only_in_a_single_thread(threads, loaded):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUBOT_FAKE_NVML")}
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_REAL_PYNVML, threads],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        timeout=60,
        check=True,
    )
    before, library, module = done.stdout.splitlines()
    assert before == loaded
    assert library.startswith("libc.so")  # find_library works, through the real ctypes.util
    assert module == "module True"  # afterwards sys.modules holds the real ctypes.util


# --- the collector over 1..8 fake GPUs ---------------------------------------------------------


@pytest.mark.parametrize("count", range(1, 9))
def test_collects_every_gpu(fake_nvml, count):
    fake_nvml.gpus(count, per_gpu={count - 1: {"util_gpu": 97, "temperature": 81}})
    status = nvml.collect_status()
    assert status.nvml_error is None
    assert [g.index for g in status.gpus] == list(range(count))
    assert len({g.uuid for g in status.gpus}) == count
    assert len({g.pci_bus_id for g in status.gpus}) == count
    last = status.gpus[-1]
    assert (last.util_gpu_pct, last.temp_c) == (97, 81)
    if count > 1:
        assert (status.gpus[0].util_gpu_pct, status.gpus[0].temp_c) == (0, 31)


def test_maps_every_field_with_units(fake_nvml):
    fake_nvml.gpus(
        1,
        driver_version="535.161.08",
        cuda_driver_version=12020,
        memory_total=80 * GIB,
        memory_reserved=600 * MIB,
        memory_used=30 * GIB,
        util_gpu=87,
        util_mem=41,
        temperature=66,
        power_usage=412345,
        power_limit=650000,
        power_default_limit=700000,
        sm_clock=1755,
        sm_clock_max=1980,
        clocks_event_reasons=0x4 | 0x40,
        ecc_mode=1,
        ecc_uncorrected_volatile=3,
        remapped_rows=[2, 1, 1, 0],
        pcie_gen=4,
        pcie_gen_max=5,
        pcie_width=8,
        pcie_width_max=16,
        persistence_mode=0,
        mig_mode=1,
        compute_capability=[9, 0],
        multiprocessor_count=132,
    )
    status = nvml.collect_status()
    assert status.driver == protocol.DriverInfo("535.161.08", "12.2", "12.550.54.15")
    gpu = status.gpus[0]
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid.startswith("GPU-")
    assert gpu.pci_bus_id == "00000000:18:00.0"
    assert gpu.mem_total_bytes == 80 * GIB
    assert gpu.mem_used_bytes == 30 * GIB  # v2: the driver's reservation is not "used"
    assert gpu.mem_free_bytes == 80 * GIB - 600 * MIB - 30 * GIB
    assert (gpu.util_gpu_pct, gpu.util_mem_pct, gpu.temp_c) == (87, 41, 66)
    assert gpu.power_draw_w == pytest.approx(412.345)
    assert (gpu.power_limit_w, gpu.power_default_limit_w) == (650.0, 700.0)
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz) == (1755, 1980)
    assert gpu.clock_event_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert (gpu.ecc_mode_enabled, gpu.ecc_uncorrected_volatile) == (True, 3)
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (True, False)
    assert gpu.retired_pages_pending is None  # not supported on Hopper
    assert (gpu.pcie_gen_current, gpu.pcie_gen_max) == (4, 5)
    assert (gpu.pcie_width_current, gpu.pcie_width_max) == (8, 16)
    assert (gpu.persistence_mode, gpu.mig_mode) == (False, True)
    assert (gpu.compute_capability, gpu.sm_count) == ("9.0", 132)


def test_older_gpu_reports_retired_pages_not_remapped_rows(fake_nvml):
    fake_nvml.gpus(1, model="Tesla V100-SXM2-16GB", retired_pages_pending=1)
    gpu = nvml.collect_status().gpus[0]
    assert gpu.retired_pages_pending is True
    assert gpu.remapped_rows_pending is None
    assert gpu.remapped_rows_failure is None
    assert gpu.mig_mode is None
    assert gpu.compute_capability == "7.0"


# fake field -> the snapshot fields it feeds
UNSUPPORTED = {
    "name": ("name",),
    "memory_total": ("mem_total_bytes", "mem_used_bytes", "mem_free_bytes"),
    "util_gpu": ("util_gpu_pct", "util_mem_pct"),
    "temperature": ("temp_c",),
    "power_usage": ("power_draw_w",),
    "power_limit": ("power_limit_w",),
    "power_default_limit": ("power_default_limit_w",),
    "sm_clock": ("sm_clock_mhz",),
    "sm_clock_max": ("sm_clock_max_mhz",),
    "clocks_event_reasons": ("clock_event_reasons",),
    "ecc_mode": ("ecc_mode_enabled",),
    "ecc_uncorrected_volatile": ("ecc_uncorrected_volatile",),
    "remapped_rows": ("remapped_rows_pending", "remapped_rows_failure"),
    "pcie_gen": ("pcie_gen_current",),
    "pcie_gen_max": ("pcie_gen_max",),
    "pcie_width": ("pcie_width_current",),
    "pcie_width_max": ("pcie_width_max",),
    "persistence_mode": ("persistence_mode",),
    "mig_mode": ("mig_mode",),
    "compute_capability": ("compute_capability",),
    "multiprocessor_count": ("sm_count",),
    "fan_speed": ("fan_speed_pct",),
    "pstate": ("pstate",),
    "mem_clock": ("mem_clock_mhz",),
    "mem_clock_max": ("mem_clock_max_mhz",),
    "enc_util": ("enc_util_pct",),
    "dec_util": ("dec_util_pct",),
}


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_an_unsupported_field_is_null_and_nothing_else_changes(fake_nvml, field):
    fake_nvml.gpus(2, fan_speed=40)  # an H100 has no fan of its own: give it one here
    baseline = protocol.to_dict(nvml.collect_status().gpus[1])
    fake_nvml.gpus(2, fan_speed=40, per_gpu={1: {field: "unsupported"}})
    status = nvml.collect_status()
    assert status.nvml_error is None
    got = protocol.to_dict(status.gpus[1])
    for name in UNSUPPORTED[field]:
        if name == "name":
            assert got[name] == "unknown"
        else:
            assert got[name] is None, name
    changed = {k for k in got if got[k] != baseline[k]}
    assert changed == set(UNSUPPORTED[field])
    assert status.gpus[0] == nvml.collect_status().gpus[0]


def test_every_field_unsupported_still_gives_a_gpu(fake_nvml):
    fake_nvml.gpus(
        1,
        **dict.fromkeys(UNSUPPORTED, "unsupported"),
        uuid="unsupported",
        pci_bus_id="unsupported",
        processes="unsupported",
        graphics_processes="unsupported",
    )
    status = nvml.collect_status()
    gpu = status.gpus[0]
    assert (gpu.index, gpu.uuid, gpu.name, gpu.pci_bus_id) == (0, "unknown", "unknown", "unknown")
    values = protocol.to_dict(gpu)
    assert all(
        values[k] is None for k in values if k not in ("index", "uuid", "name", "pci_bus_id")
    )
    assert status.processes == ()
    assert status.nvml_error is None


# --- NVML errors -------------------------------------------------------------------------------

INIT_ERRORS = {
    "LibraryNotFound": ("library_not_found", "--gpus all"),
    "DriverNotLoaded": ("driver_not_loaded", "modprobe nvidia"),
    "NoPermission": ("no_permission", "video group"),
    "OperatingSystem": ("blocked_by_os", "WSL"),
    "LibRmVersionMismatch": ("driver_library_mismatch", "Reboot"),
    "GpuIsLost": ("gpu_lost", "Xid 79"),
    "Unknown": ("unknown", "nvidia-smi"),
    "ResetRequired": ("unknown", "nvidia-smi -r"),
    "Uninitialized": ("unknown", "dmesg"),
}


@pytest.mark.parametrize("name", sorted(INIT_ERRORS))
def test_init_errors_map_to_codes_with_hints(fake_nvml, name):
    fake_nvml.init_error(name)
    status = nvml.collect_status()
    code, phrase = INIT_ERRORS[name]
    assert status.driver is None
    assert status.gpus == ()
    assert status.nvml_error is not None
    assert status.nvml_error.code == code
    assert status.nvml_error.code in NVML_ERROR_CODES
    assert f"NVMLError_{name}" in status.nvml_error.message
    assert phrase in status.nvml_error.hint


def test_every_error_code_has_a_hint():
    assert set(nvml.HINTS) == set(NVML_ERROR_CODES)
    assert all(len(hint) > 40 for hint in nvml.HINTS.values())


def test_no_configuration_behaves_like_no_driver(fake_nvml):
    fake_nvml.no_library()
    status = nvml.collect_status()
    assert status.nvml_error is not None
    assert status.nvml_error.code == "library_not_found"


def test_missing_bindings_are_library_not_found(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    status = nvml.collect_status()
    assert status.nvml_error is not None
    assert status.nvml_error.code == "library_not_found"
    assert "nvidia-ml-py" in status.nvml_error.hint


def test_a_lost_gpu_is_skipped_and_reported(fake_nvml):
    fake_nvml.gpus(3, per_gpu={1: {"handle_error": "GpuIsLost"}})
    status = nvml.collect_status()
    assert [g.index for g in status.gpus] == [0, 2]
    assert status.driver is not None
    assert status.nvml_error is not None
    assert status.nvml_error.code == "gpu_lost"
    assert "GPU 1" in status.nvml_error.message


def test_a_gpu_lost_during_queries_is_reported(fake_nvml):
    fake_nvml.gpus(2, per_gpu={1: {"temperature": {"error": "GpuIsLost"}}})
    status = nvml.collect_status()
    assert len(status.gpus) == 2
    assert status.gpus[1].temp_c is None
    assert status.nvml_error is not None
    assert status.nvml_error.code == "gpu_lost"
    assert "GPU 1 " in status.nvml_error.message


def test_device_count_failure_keeps_the_driver(fake_nvml):
    fake_nvml.configure({"driver_version": "550.54.15", "count_error": "NoPermission", "gpus": []})
    status = nvml.collect_status()
    assert status.driver is not None
    assert status.driver.version == "550.54.15"
    assert status.gpus == ()
    assert status.nvml_error is not None
    assert status.nvml_error.code == "no_permission"


def test_zero_gpus_is_not_an_error(fake_nvml):
    fake_nvml.gpus(0)
    status = nvml.collect_status()
    assert status.nvml_error is None
    assert status.gpus == ()
    assert status.driver is not None


def test_nvml_is_initialised_and_shut_down_once_per_snapshot(fake_nvml):
    fake_nvml.gpus(4)
    nvml.collect_status()
    calls = fake_nvml.calls()
    assert calls.count("nvmlInitWithFlags") == 1
    assert calls.count("nvmlShutdown") == 1
    assert calls[-1] == "nvmlShutdown"


# --- older drivers -----------------------------------------------------------------------------


def test_clock_reasons_fall_back_to_throttle_reasons(fake_nvml):
    fake_nvml.gpus(
        1,
        clocks_event_reasons=0x20 | 0x8,
        missing_functions=["nvmlDeviceGetCurrentClocksEventReasons"],
    )
    gpu = nvml.collect_status().gpus[0]
    assert gpu.clock_event_reasons == ("hw_slowdown", "sw_thermal_slowdown")
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake_nvml.calls()


def test_memory_falls_back_to_v1(fake_nvml):
    fake_nvml.gpus(
        1,
        memory_total=24 * GIB,
        memory_reserved=300 * MIB,
        memory_used=2 * GIB,
        missing_functions=["nvmlDeviceGetMemoryInfo_v2"],
    )
    gpu = nvml.collect_status().gpus[0]
    assert gpu.mem_total_bytes == 24 * GIB
    assert gpu.mem_used_bytes == 2 * GIB + 300 * MIB  # v1 counts the reservation as used
    assert gpu.mem_free_bytes == 24 * GIB - 2 * GIB - 300 * MIB
    assert "nvmlDeviceGetMemoryInfo" in fake_nvml.calls()


def test_processes_fall_back_to_v2(fake_nvml):
    me = os.getpid()
    fake_nvml.gpus(
        1,
        processes=[{"pid": me, "used_memory": 5 * GIB}],
        missing_functions=["nvmlDeviceGetComputeRunningProcesses_v3"],
    )
    status = nvml.collect_status()
    assert [(p.pid, p.used_mem_bytes) for p in status.processes] == [(me, 5 * GIB)]
    assert "nvmlDeviceGetComputeRunningProcesses_v2" in fake_nvml.calls()


def test_sm_count_is_null_without_device_attributes(fake_nvml):
    fake_nvml.gpus(1, missing_functions=["nvmlDeviceGetAttributes_v2"])
    gpu = nvml.collect_status().gpus[0]
    assert gpu.sm_count is None
    assert gpu.compute_capability == "9.0"


# --- processes ---------------------------------------------------------------------------------


def test_processes_carry_user_and_command_line(fake_nvml, tmp_path):
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen(
        [sys.executable, "-c", code, "--marker", "a b"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"  # exec is done: /proc shows its command
    gone = _unused_pid()
    try:
        fake_nvml.gpus(
            2,
            per_gpu={
                0: {"processes": [{"pid": child.pid, "used_memory": 3 * GIB}]},
                1: {
                    "processes": [{"pid": gone, "used_memory": None}],
                    "graphics_processes": [{"pid": child.pid, "used_memory": 64 * MIB}],
                },
            },
        )
        status = nvml.collect_status()
    finally:
        child.communicate(b"")
    me = pwd.getpwuid(os.getuid()).pw_name
    procs = {(p.gpu_index, p.pid): p for p in status.processes}
    assert set(procs) == {(0, child.pid), (1, child.pid), (1, gone)}
    first = procs[(0, child.pid)]
    assert first.user == me
    assert first.command is not None
    assert first.command.endswith("--marker a b")
    assert first.used_mem_bytes == 3 * GIB
    assert procs[(1, child.pid)].used_mem_bytes == 64 * MIB
    unknown = procs[(1, gone)]
    assert (unknown.user, unknown.command, unknown.used_mem_bytes) == (None, None, None)
    assert unknown.job_id is None


def test_a_pid_in_compute_and_graphics_lists_appears_once(fake_nvml):
    me = os.getpid()
    fake_nvml.gpus(
        1,
        processes=[{"pid": me, "used_memory": 2 * GIB}],
        graphics_processes=[{"pid": me, "used_memory": 1 * GIB}],
    )
    status = nvml.collect_status()
    assert [(p.pid, p.used_mem_bytes) for p in status.processes] == [(me, 2 * GIB)]


# --- sampling for the job runner ---------------------------------------------------------------


def test_sample_gpus_fills_utilisation_and_memory_only(fake_nvml):
    fake_nvml.gpus(3, util_gpu=55, util_mem=12, memory_used=7 * GIB, temperature=70)
    samples = nvml.sample_gpus()
    assert [s.index for s in samples] == [0, 1, 2]
    assert all(s.util_gpu_pct == 55 and s.util_mem_pct == 12 for s in samples)
    assert all(s.mem_used_bytes == 7 * GIB for s in samples)
    assert all(s.temp_c is None and s.power_draw_w is None for s in samples)
    assert all(s.uuid.startswith("GPU-") for s in samples)
    assert "nvmlDeviceGetTemperature" not in fake_nvml.calls()


def test_sample_gpus_without_nvml_is_empty(fake_nvml):
    fake_nvml.init_error("DriverNotLoaded")
    assert nvml.sample_gpus() == []


def test_sampler_keeps_one_session_and_sees_changes(fake_nvml):
    fake_nvml.gpus(2, util_gpu=10)
    with nvml.GpuSampler() as sampler:
        first = sampler.sample()
        fake_nvml.gpus(2, util_gpu=90)  # the GPUs get busy while the session stays open
        second = sampler.sample()
    assert [s.util_gpu_pct for s in first] == [10, 10]
    assert [s.util_gpu_pct for s in second] == [90, 90]
    calls = fake_nvml.calls()
    assert calls.count("nvmlInitWithFlags") == 1
    assert calls.count("nvmlDeviceGetName") == 2  # names looked up once per GPU
    assert calls.count("nvmlDeviceGetUtilizationRates") == 4


def test_sampler_outside_with_is_an_error():
    with pytest.raises(RuntimeError, match="outside"):
        nvml.GpuSampler().sample()


def test_sampler_raises_when_nvml_is_unavailable(fake_nvml):
    fake_nvml.init_error("NoPermission")
    with pytest.raises(nvml.NvmlUnavailable) as info, nvml.GpuSampler():
        pass
    assert info.value.error.code == "no_permission"


# --- helpers and the document ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, ()),
        (0x1, ("gpu_idle",)),
        (0x4 | 0x80, ("sw_power_cap", "hw_power_brake_slowdown")),
        (0x100, ("display_clock_setting",)),
        (0x200 | 0x1, ("gpu_idle", "unknown_0x200")),
    ],
)
def test_decode_clock_reasons(mask, names):
    assert nvml.decode_clock_reasons(mask) == names


@pytest.mark.parametrize(
    ("value", "text"), [(12040, "12.4"), (11080, "11.8"), (12090, "12.9"), (13000, "13.0")]
)
def test_cuda_version_string(value, text):
    assert nvml.cuda_version_string(value) == text


def test_snapshot_round_trips_through_json(fake_nvml):
    fake_nvml.gpus(2, processes=[{"pid": os.getpid(), "used_memory": GIB}])
    moment = datetime(2026, 3, 1, 12, 30, tzinfo=UTC).timestamp()
    status = nvml.collect_status(clock=lambda: moment)
    assert status.collected_at == "2026-03-01T12:30:00+00:00"
    text = protocol.dumps(status)
    assert protocol.loads(StatusSnapshot, text) == status
    doc = protocol.to_dict(status)
    assert doc["schema"] == 1
    assert set(doc) >= {"host", "driver", "nvml_error", "gpus", "processes"}


_DOCUMENT_CASES = {
    "gpus and processes": lambda fake: fake.gpus(
        3, processes=[{"pid": os.getpid(), "used_memory": GIB}], per_gpu={1: {"temperature": 91}}
    ),
    "no driver": lambda fake: fake.no_library(),
    "init error": lambda fake: fake.init_error("DriverNotLoaded"),
    "count error": lambda fake: fake.gpus(2, count_error="Unknown"),
    "every field unsupported": lambda fake: fake.gpus(
        1, missing_functions=["nvmlDeviceGetAttributes", "nvmlDeviceGetPciInfo"]
    ),
}


@pytest.mark.parametrize("case", sorted(_DOCUMENT_CASES))
def test_the_status_document_is_exactly_the_snapshot(fake_nvml, case):
    """What ``status --json`` prints (the plain document) is byte for byte what the bot's
    StatusSnapshot writes after parsing it: no key missing, none extra, same values."""
    _DOCUMENT_CASES[case](fake_nvml)
    document = nvml.collect_status_document(clock=lambda: 1_772_368_200.0)
    snapshot = protocol.from_dict(StatusSnapshot, document)
    assert wire.dumps(document) == protocol.dumps(snapshot)
    assert document["schema"] == 1
    assert set(document["host"]) == set(HOST_FIELDS)


def test_nvml_unavailable_carries_the_document_and_the_typed_error():
    error = nvml.NvmlUnavailable({"code": "gpu_lost", "message": "gone", "hint": "reboot"})
    assert str(error) == "gone"
    assert error.error == NvmlError(code="gpu_lost", message="gone", hint="reboot")


# --- fan, performance state, memory clock, video engines ---------------------------------------


def test_maps_cooling_and_video_fields(fake_nvml):
    fake_nvml.gpus(
        1,
        model="NVIDIA GeForce RTX 4090",
        fan_speed=63,
        pstate=2,
        mem_clock=10251,
        mem_clock_max=10501,
        enc_util=35,
        dec_util=4,
    )
    gpu = nvml.collect_status().gpus[0]
    assert (gpu.fan_speed_pct, gpu.pstate) == (63, 2)
    assert (gpu.mem_clock_mhz, gpu.mem_clock_max_mhz) == (10251, 10501)
    assert (gpu.enc_util_pct, gpu.dec_util_pct) == (35, 4)


def test_a_passively_cooled_card_has_no_fan_and_an_unknown_pstate_is_null(fake_nvml):
    fake_nvml.gpus(1, pstate=32)  # an H100: no fan of its own; NVML_PSTATE_UNKNOWN
    gpu = nvml.collect_status().gpus[0]
    assert gpu.fan_speed_pct is None
    assert gpu.pstate is None
    assert gpu.mem_clock_mhz == 2619


@pytest.mark.parametrize(
    "symbol",
    [
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetPerformanceState",
        "nvmlDeviceGetEncoderUtilization",
        "nvmlDeviceGetDecoderUtilization",
    ],
)
def test_a_driver_lacking_a_new_call_gives_null_for_it_only(fake_nvml, symbol):
    fake_nvml.gpus(1, fan_speed=40, pstate=0, enc_util=1, dec_util=2)
    full = protocol.to_dict(nvml.collect_status().gpus[0])
    fake_nvml.gpus(1, fan_speed=40, pstate=0, enc_util=1, dec_util=2, missing_functions=[symbol])
    lacking = protocol.to_dict(nvml.collect_status().gpus[0])
    changed = {k for k in full if full[k] != lacking[k]}
    assert len(changed) == 1
    assert lacking[changed.pop()] is None


# --- per-process utilisation and the /proc join --------------------------------------------------


def test_processes_carry_sm_use_and_the_proc_view(fake_nvml, monkeypatch):
    monkeypatch.setenv("GPU_AGENT_CPU_WINDOW_S", "0.3")
    idle = os.getpid()
    statuses = []
    with SpinningChild() as child:
        fake_nvml.gpus(
            1,
            processes=[
                {"pid": child.pid, "used_memory": 3 * GIB},
                {"pid": idle, "used_memory": GIB},
            ],
            process_utilization=[
                {"pid": child.pid, "sm": 97, "mem": 41, "age_s": 5.0},
                {"pid": child.pid, "sm": 88, "mem": 30, "age_s": 0.2},  # the newest counts
                {"pid": _unused_pid(), "sm": 50, "mem": 5},  # not on the GPU any more
            ],
        )
        used_s, span_s = measured(child, lambda: statuses.append(nvml.collect_status()))
    procs = {p.pid: p for p in statuses[0].processes}
    busy, quiet = procs[child.pid], procs[idle]
    assert (busy.sm_util_pct, busy.mem_bw_util_pct) == (88, 30)
    assert (quiet.sm_util_pct, quiet.mem_bw_util_pct) == (0, 0)  # no sample: no use
    assert quiet.cpu_pct is not None
    # Spinning: 100 % on an idle machine, its share of the cores on a loaded one, as the
    # child itself counts it.
    assert_reads_what_it_used(busy.cpu_pct, 0.3, used_s, span_s)
    assert busy.rss_bytes is not None
    assert busy.rss_bytes > MIB
    assert busy.elapsed_s is not None
    assert 0 <= busy.elapsed_s < 60
    assert quiet.elapsed_s is not None
    assert set(procs) == {child.pid, idle}


def test_no_samples_means_no_use_and_an_old_sample_is_dropped(fake_nvml):
    me = os.getpid()
    fake_nvml.gpus(1, processes=[{"pid": me, "used_memory": GIB}])  # NVML: "not found"
    (proc,) = nvml.collect_status().processes
    assert (proc.sm_util_pct, proc.mem_bw_util_pct) == (0, 0)
    old = nvml.PROCESS_SAMPLE_MAX_AGE_S + 1
    fake_nvml.gpus(
        1,
        processes=[{"pid": me, "used_memory": GIB}],
        process_utilization=[{"pid": me, "sm": 90, "mem": 50, "age_s": old}],
    )
    (proc,) = nvml.collect_status().processes
    assert proc.sm_util_pct == 0
    fresh = nvml.PROCESS_SAMPLE_MAX_AGE_S - 1
    fake_nvml.gpus(
        1,
        processes=[{"pid": me, "used_memory": GIB}],
        process_utilization=[{"pid": me, "sm": 90, "mem": 50, "age_s": fresh}],
    )
    (proc,) = nvml.collect_status().processes
    assert proc.sm_util_pct == 90


def test_a_sample_stamped_by_another_clock_is_kept(fake_nvml):
    me = os.getpid()
    fake_nvml.gpus(
        1,
        processes=[{"pid": me, "used_memory": GIB}],
        process_utilization=[{"pid": me, "sm": 12, "mem": 3, "timestamp_us": 5_000_000}],
    )
    (proc,) = nvml.collect_status().processes
    assert proc.sm_util_pct == 12


@pytest.mark.parametrize(
    "config",
    [
        {"process_utilization": "unsupported"},  # MIG, vGPU, pre-Maxwell
        {"missing_functions": ["nvmlDeviceGetProcessUtilization"]},  # an older driver
        {"process_utilization": {"error": "NoPermission"}},
    ],
    ids=["not-supported", "old-driver", "no-permission"],
)
def test_per_process_use_is_null_where_the_driver_cannot_say(fake_nvml, config):
    me = os.getpid()
    fake_nvml.gpus(1, processes=[{"pid": me, "used_memory": GIB}], **config)
    status = nvml.collect_status()
    (proc,) = status.processes
    assert (proc.sm_util_pct, proc.mem_bw_util_pct) == (None, None)
    assert proc.used_mem_bytes == GIB
    assert status.nvml_error is None


def test_an_idle_status_asks_nothing_about_processes(fake_nvml):
    fake_nvml.gpus(2)
    nvml.collect_status()
    assert "nvmlDeviceGetProcessUtilization" not in fake_nvml.calls()


def test_the_status_document_carries_every_process_field(fake_nvml):
    from agents.schema import PROCESS_FIELDS

    fake_nvml.gpus(1, processes=[{"pid": os.getpid(), "used_memory": GIB}])
    doc = nvml.collect_status_document()
    assert tuple(doc["processes"][0]) == PROCESS_FIELDS


# --- topology ------------------------------------------------------------------------------------


def _switch_links(n: int = 18, down: int = 0) -> list[dict]:
    return [
        {
            "active": 0 if i < down else 1,
            "version": 4,
            "remote_bus_id": "00000000:C0:00.0",
            "remote_type": 2,
        }
        for i in range(n)
    ]


def test_topology_of_an_nvswitch_box(fake_nvml):
    fake_nvml.gpus(
        4,
        nvlinks=_switch_links(),
        per_gpu={3: {"nvlinks": _switch_links(down=6)}},
        topology={"0-1": 40, "0-2": 50},
        p2p={"0-1": {"nvlink": 0}, "2-3": {"read": 4}},
    )
    doc = nvml.collect_topology()
    assert doc["error"] is None
    gpus = {g["index"]: g for g in doc["gpus"]}
    assert len(gpus[0]["nvlinks"]) == 18
    assert sum(link["active"] for link in gpus[3]["nvlinks"]) == 12
    assert gpus[0]["nvlinks"][0] == {
        "link": 0,
        "active": True,
        "version": 4,
        "remote_bus_id": "00000000:C0:00.0",
        "remote_type": "nvswitch",
    }
    assert gpus[3]["nvlinks"][0]["remote_type"] is None  # a link that is down names nothing
    pairs = {(p["a"], p["b"]): p for p in doc["pairs"]}
    assert len(pairs) == 6
    assert pairs[(0, 1)]["level"] == "NODE"
    assert pairs[(0, 2)]["level"] == "SYS"
    assert pairs[(1, 2)]["level"] == "PHB"  # the fake's default
    assert pairs[(0, 1)]["via_nvswitch"] is True
    assert (pairs[(0, 1)]["p2p_read"], pairs[(0, 1)]["p2p_nvlink"]) == ("ok", "ok")
    assert pairs[(2, 3)]["p2p_read"] == "disabled_by_regkey"
    assert pairs[(1, 2)]["p2p_nvlink"] == "not_supported"


def test_topology_counts_direct_nvlinks_between_a_pair(fake_nvml):
    bus = [f"00000000:{0x18 + i * 0x10:02X}:00.0" for i in range(2)]
    fake_nvml.gpus(
        2,
        per_gpu={
            0: {"nvlinks": [{"remote_bus_id": bus[1], "remote_type": 0}] * 4},
            1: {"nvlinks": [{"remote_bus_id": bus[0], "remote_type": 0}] * 4},
        },
    )
    (pair,) = nvml.collect_topology()["pairs"]
    assert (pair["nvlinks"], pair["via_nvswitch"]) == (4, False)


def test_topology_without_nvlink_or_without_the_calls(fake_nvml):
    fake_nvml.gpus(2, model="NVIDIA GeForce RTX 4090")  # no NVLink: "not supported"
    doc = nvml.collect_topology()
    assert [g["nvlinks"] for g in doc["gpus"]] == [None, None]
    assert doc["pairs"][0]["level"] == "PHB"
    fake_nvml.gpus(
        2,
        missing_functions=[
            "nvmlDeviceGetNvLinkState",
            "nvmlDeviceGetTopologyCommonAncestor",
            "nvmlDeviceGetP2PStatus",
        ],
    )
    doc = nvml.collect_topology()
    assert [g["nvlinks"] for g in doc["gpus"]] == [None, None]
    assert doc["pairs"] == [
        {
            "a": 0,
            "b": 1,
            "level": None,
            "nvlinks": 0,
            "via_nvswitch": False,
            "p2p_read": None,
            "p2p_nvlink": None,
        }
    ]


def test_topology_without_nvml(fake_nvml):
    fake_nvml.init_error("DriverNotLoaded")
    doc = nvml.collect_topology()
    assert (doc["gpus"], doc["pairs"]) == ([], [])
    assert doc["error"]["code"] == "driver_not_loaded"


@pytest.mark.parametrize(
    ("bus_id", "key"),
    [
        ("00000000:3B:00.0", (0, 0x3B, 0)),
        ("0000:3b:00", (0, 0x3B, 0)),
        ("0001:c1:1f.0", (1, 0xC1, 0x1F)),
        ("garbage", (-1, -1, -1)),
        (None, (-1, -1, -1)),
    ],
)
def test_bus_key(bus_id, key):
    assert nvml.bus_key(bus_id) == key


# --- Xid events ----------------------------------------------------------------------------------


def test_xid_watch_reports_events_per_gpu(fake_nvml):
    fake_nvml.gpus(3, per_gpu={1: {"xid_events": [79]}, 2: {"xid_events": [48, 63]}})
    with nvml.XidWatch(clock=lambda: 1_767_225_600.0) as watch:
        assert watch.available
        assert watch.watched == [0, 1, 2]
        events = watch.events()
        assert watch.events() == events  # collected once, kept
    assert [(e["gpu_index"], e["xid"]) for e in events] == [(1, 79), (2, 48), (2, 63)]
    assert {e["seen_at"] for e in events} == {"2026-01-01T00:00:00+00:00"}
    calls = fake_nvml.calls()
    assert calls.count("nvmlEventSetFree") == 1
    assert calls[-1] == "nvmlShutdown"


def test_xid_watch_skips_gpus_without_the_event(fake_nvml):
    fake_nvml.gpus(2, per_gpu={0: {"supported_events": 0x3}, 1: {"xid_events": "unsupported"}})
    with nvml.XidWatch() as watch:
        assert not watch.available
        assert "no GPU" in watch.reason
        assert watch.events() == []


@pytest.mark.parametrize(
    "setup",
    [
        lambda fake: fake.init_error("NoPermission"),
        lambda fake: fake.gpus(1, missing_functions=["nvmlEventSetCreate"]),
        lambda fake: fake.no_library(),
    ],
    ids=["no-permission", "old-driver", "no-driver"],
)
def test_xid_watch_never_raises(fake_nvml, setup):
    setup(fake_nvml)
    with nvml.XidWatch() as watch:
        assert not watch.available
        assert watch.reason
        assert watch.events() == []


# --- load samples for the stress check -----------------------------------------------------------


def test_sample_load_has_clocks_temperature_power_and_reasons(fake_nvml):
    fake_nvml.gpus(
        2,
        util_gpu=100,
        sm_clock=1755,
        mem_clock=2619,
        temperature=78,
        power_usage=690_000,
        clocks_event_reasons=0x4,
        per_gpu={1: {"clocks_event_reasons": 0x80, "temperature": "unsupported"}},
    )
    with nvml.GpuSampler() as sampler:
        first, second = sampler.sample_load()
    assert first == {
        "index": 0,
        "util_gpu_pct": 100,
        "sm_clock_mhz": 1755,
        "sm_clock_max_mhz": 1980,
        "mem_clock_mhz": 2619,
        "temp_c": 78,
        "power_draw_w": 690.0,
        "power_limit_w": 700.0,
        "clock_event_reasons": ["sw_power_cap"],
    }
    assert second["temp_c"] is None
    assert second["clock_event_reasons"] == ["hw_power_brake_slowdown"]
