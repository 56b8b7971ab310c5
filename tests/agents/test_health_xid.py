"""The xid check: sources, the catalogue, and the age edge."""

from __future__ import annotations

import pytest

from agents.checks import xid as xid_check
from agents.checks.xid import XID_CATALOGUE, XID_RECENT_S
from agents.system import KernelLogFacts, KernelXid
from tests.agents.factories import make_gpu

GPUS = [make_gpu(0), make_gpu(1, pci_bus_id="00000000:3B:00.0")]


def kernel(*xids: tuple[int, float | None], bus: str = "0000:3b:00") -> KernelLogFacts:
    return KernelLogFacts(
        "/dev/kmsg",
        tuple(KernelXid(bus, number, "pid=1, name=python", age) for number, age in xids),
    )


def test_no_xid_since_boot_passes_and_names_the_sources():
    result = xid_check.check_xid(kernel(), [], True, GPUS)
    assert result.status == "pass"
    assert result.summary == "no Xid errors since boot (/dev/kmsg, NVML events during this check)"


def test_a_recent_fall_off_the_bus_fails_with_what_to_do():
    result = xid_check.check_xid(kernel((79, 600.0)), [], False, GPUS)
    assert result.status == "fail"
    assert result.summary == "Xid 79 on GPU 1 (GPU has fallen off the bus), 10 min ago"
    assert "Reboot the instance" in result.hint
    assert result.details["xids"][0]["gpu_index"] == 1
    assert result.details["xids"][0]["kind"] == "hardware"


@pytest.mark.parametrize(
    ("age", "expected"),
    [
        (0.0, "fail"),
        (XID_RECENT_S, "fail"),
        (XID_RECENT_S + 1, "warn"),  # old: the GPU may have been repaired since
        (None, "warn"),  # a log file that may hold earlier boots
    ],
)
def test_hardware_xid_age_edge(age, expected):
    assert xid_check.check_xid(kernel((48, age)), [], False, GPUS).status == expected


@pytest.mark.parametrize(
    ("age", "expected"),
    [(60.0, "warn"), (XID_RECENT_S, "warn"), (XID_RECENT_S + 1, "pass"), (None, "pass")],
)
def test_program_xid_age_edge(age, expected):
    result = xid_check.check_xid(kernel((13, age)), [], False, GPUS)
    assert result.status == expected
    if expected == "warn":
        assert "compute-sanitizer" in result.hint
    else:
        assert "only old program errors" in result.summary


def test_events_during_the_check_fail_and_repeats_are_grouped():
    events = [
        {"gpu_index": 0, "xid": 79},
        {"gpu_index": 0, "xid": 79},
        {"gpu_index": None, "xid": 94},
    ]
    result = xid_check.check_xid(kernel(), events, True, GPUS)
    assert result.status == "fail"
    assert "Xid 79 on GPU 0 x2 (GPU has fallen off the bus), during this check" in result.summary
    assert "Xid 94 on PCI ? (contained ECC error: one program was stopped), during this check" in (
        result.summary
    )
    assert result.hint.count("Xid 79:") == 1


def test_an_unknown_xid_warns_and_points_at_the_catalogue():
    result = xid_check.check_xid(kernel((9999, 5.0), bus="0000:99:00"), [], False, GPUS)
    assert result.status == "warn"
    assert "Xid 9999 on PCI 0000:99:00" in result.summary
    assert "docs.nvidia.com/deploy/xid-errors" in result.hint


def test_an_unreadable_kernel_log_skips_and_says_why():
    unreadable = KernelLogFacts(None, (), ("/dev/kmsg: Operation not permitted",))
    result = xid_check.check_xid(unreadable, [], True, GPUS)
    assert result.status == "skip"
    assert "/dev/kmsg: Operation not permitted" in result.summary
    assert "none came during this check" in result.summary
    assert "sudo dmesg" in result.hint
    assert xid_check.check_xid(None, [], False, GPUS).status == "skip"


def test_an_unreadable_kernel_log_still_reports_nvml_events():
    unreadable = KernelLogFacts(None, (), ("/dev/kmsg: Operation not permitted",))
    result = xid_check.check_xid(unreadable, [{"gpu_index": 1, "xid": 48}], True, GPUS)
    assert result.status == "fail"
    assert "double-bit ECC" in result.summary


def test_every_catalogue_entry_says_what_to_do():
    for number, info in XID_CATALOGUE.items():
        assert "(" not in str(info.meaning), number  # it is shown in parentheses
        assert info.kind in ("hardware", "program", "driver"), number
        assert info.status in ("fail", "warn"), number
        assert info.meaning
        assert info.action
        assert not str(info.action).endswith(".")
