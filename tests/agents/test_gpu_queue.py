"""The GPU queue's pure parts: a request against this machine's GPUs, and the FIFO plan."""

from __future__ import annotations

import pytest

from agents import gpu_queue, protocol
from agents.gpu_queue import plan_starts
from agents.protocol import GpuRequest


def test_resolve_request():
    assert gpu_queue.resolve_request(GpuRequest(), [], "none") == GpuRequest()
    every = gpu_queue.resolve_request(GpuRequest(count=-1), [0, 1, 2], "")
    assert every == GpuRequest(3, (0, 1, 2))
    assert gpu_queue.resolve_request(GpuRequest(count=2), [0, 1], "") == GpuRequest(count=2)
    with pytest.raises(protocol.JobError, match="no NVIDIA GPU can be used on this machine"):
        gpu_queue.resolve_request(GpuRequest(count=1), [], "no driver")
    with pytest.raises(protocol.JobRequestError, match="names GPU 5"):
        gpu_queue.resolve_request(GpuRequest(2, (0, 5)), [0, 1], "")


def test_the_default_is_one_free_gpu_or_the_cpu_where_there_is_none():
    default = protocol.parse_gpus(None)
    assert gpu_queue.resolve_request(default, [0, 1], "") == GpuRequest(count=1)
    assert gpu_queue.resolve_request(default, [], "NVML lists no GPUs") == GpuRequest()


def test_a_missing_gpu_index_says_what_the_machine_has_and_the_other_forms():
    with pytest.raises(protocol.JobRequestError) as err:
        gpu_queue.resolve_request(protocol.parse_gpus("3"), [0, 1], "")
    assert str(err.value).startswith("this machine has 2 GPUs (0, 1); --gpus 3 names GPU 3,")
    assert "--gpus any:N (at most 2 here)" in str(err.value)
    with pytest.raises(protocol.JobRequestError) as err:
        gpu_queue.resolve_request(protocol.parse_gpus("any:3"), [0, 1], "")
    assert str(err.value) == "this machine has 2 GPUs (0, 1); --gpus any:3 asks for 3"


def q(*items: tuple[str, str]) -> list[tuple[str, GpuRequest]]:
    return [(job_id, protocol.parse_gpus(text)) for job_id, text in items]


def test_plan_first_come_first_served_on_free_gpus():
    plan = plan_starts(q(("a", "any:2"), ("b", "any:1"), ("c", "any:2")), [0, 1, 2, 3], [])
    assert plan == {"a": (0, 1), "b": (2,)}  # c waits: only GPU 3 is left


def test_plan_nothing_starts_on_busy_gpus():
    assert plan_starts(q(("a", "0"), ("b", "any:1")), [0, 1], [0, 1]) == {}


def test_plan_exact_request_reserves_its_gpus_for_itself():
    # a waits for GPU 0 (busy); b wants any one GPU and may take GPU 1 but never GPU 0.
    plan = plan_starts(q(("a", "0,1"), ("b", "any:1"), ("c", "2")), [0, 1, 2], [0])
    assert plan == {"b": (2,)}  # GPU 1 is reserved for a; c's GPU 2 went to b first


def test_plan_exact_requests_on_other_gpus_pass_a_waiting_exact_one():
    plan = plan_starts(q(("a", "0"), ("b", "1")), [0, 1], [0])
    assert plan == {"b": (1,)}


def test_plan_waiting_count_request_holds_back_every_gpu_job_behind_it():
    plan = plan_starts(
        q(("a", "any:2"), ("b", "any:1"), ("c", "3"), ("d", "none")), [0, 1, 2, 3], [0, 1, 2]
    )
    assert plan == {"d": ()}  # a needs two; b and c would delay it; d needs no GPU


def test_plan_jobs_without_gpus_always_start():
    assert plan_starts(q(("a", "none"), ("b", "none")), [], []) == {"a": (), "b": ()}


def test_plan_exact_request_for_a_missing_gpu_never_starts():
    assert plan_starts(q(("a", "7"), ("b", "any:1")), [0, 1], []) == {"b": (0,)}


GIB = 1024**3


def test_a_gpu_is_in_use_by_memory_visible_or_not_by_one_process_or_by_load():
    in_use = gpu_queue.gpu_in_use
    # Idle, or what an idle CUDA context / the driver's reservation takes: free.
    assert not in_use(0, 0)
    assert not in_use(500 * 1024**2, 0, [400 * 1024**2])
    assert not in_use(gpu_queue.FREE_MEM_MAX_BYTES, gpu_queue.FREE_UTIL_MAX_PCT)
    assert not in_use(None, None, [None])  # nothing reported: nothing to go by
    # 78 GiB held with no process visible (another container's), a 70 GiB process, a busy GPU.
    assert in_use(78 * GIB, 0)
    assert in_use(gpu_queue.FREE_MEM_MAX_BYTES + 1, 0)
    assert in_use(None, 0, [70 * GIB])
    assert in_use(100 * 1024**2, 97)
    assert in_use(0, gpu_queue.FREE_UTIL_MAX_PCT + 1)


def test_plan_any_n_and_the_default_skip_gpus_something_else_uses():
    # GPU 0: another tenant's process; GPU 1: memory no visible process holds.
    plan = plan_starts(q(("default", "auto"), ("two", "any:2")), [0, 1, 2, 3], [], [0, 1])
    assert plan == {"default": (2,)}  # any:2 waits: only GPU 3 is really free after it
    assert plan_starts(q(("two", "any:2")), [0, 1, 2, 3], [], [0, 1]) == {"two": (2, 3)}
    # A waiting any:N holds back the GPU jobs behind it, as with the agent's own jobs.
    assert plan_starts(q(("two", "any:2"), ("one", "any:1")), [0, 1, 2], [], [0, 1]) == {}


def test_plan_gpus_named_by_index_are_the_requesters_choice():
    plan = plan_starts(q(("named", "0"), ("all", "0,1")), [0, 1], [], [0, 1])
    assert plan == {"named": (0,)}  # waits for the agent's job on GPU 0 only


def test_queue_and_busy_from_job_metadata():
    active = [
        {"id": "r", "state": "running", "gpus_assigned": [1]},
        {"id": "a", "state": "queued", "want_count": 2, "want_indices": []},
        {"id": "n", "state": "queued", "want_count": 1, "want_indices": [3]},
        {"id": "c", "state": "queued", "want_count": 0},
    ]
    assert gpu_queue.busy_of(active) == [1]
    assert gpu_queue.queue_of(active) == [
        ("a", GpuRequest(count=2)),
        ("n", GpuRequest(1, (3,))),
        ("c", GpuRequest()),
    ]
