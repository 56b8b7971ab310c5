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
    with pytest.raises(protocol.JobError, match="no NVIDIA GPU can be used here \\(no driver\\)"):
        gpu_queue.resolve_request(GpuRequest(count=1), [], "no driver")
    with pytest.raises(protocol.JobRequestError, match="more GPUs than this machine has \\(2\\)"):
        gpu_queue.resolve_request(GpuRequest(count=3), [0, 1], "")
    with pytest.raises(protocol.JobRequestError, match="names GPU 5"):
        gpu_queue.resolve_request(GpuRequest(2, (0, 5)), [0, 1], "")


def q(*items: tuple[str, str | None]) -> list[tuple[str, GpuRequest]]:
    return [(job_id, protocol.parse_gpus(text)) for job_id, text in items]


def test_plan_first_come_first_served_on_free_gpus():
    plan = plan_starts(q(("a", "2"), ("b", "1"), ("c", "2")), [0, 1, 2, 3], [])
    assert plan == {"a": (0, 1), "b": (2,)}  # c waits: only GPU 3 is left


def test_plan_nothing_starts_on_busy_gpus():
    assert plan_starts(q(("a", "0,"), ("b", "1")), [0, 1], [0, 1]) == {}


def test_plan_exact_request_reserves_its_gpus_for_itself():
    # a waits for GPU 0 (busy); b wants any one GPU and may take GPU 1 but never GPU 0.
    plan = plan_starts(q(("a", "0,1"), ("b", "1"), ("c", "2,")), [0, 1, 2], [0])
    assert plan == {"b": (2,)}  # GPU 1 is reserved for a; c's GPU 2 went to b first


def test_plan_exact_requests_on_other_gpus_pass_a_waiting_exact_one():
    plan = plan_starts(q(("a", "0,"), ("b", "1,")), [0, 1], [0])
    assert plan == {"b": (1,)}


def test_plan_waiting_count_request_holds_back_every_gpu_job_behind_it():
    plan = plan_starts(q(("a", "2"), ("b", "1"), ("c", "3,"), ("d", None)), [0, 1, 2, 3], [0, 1, 2])
    assert plan == {"d": ()}  # a needs two; b and c would delay it; d needs no GPU


def test_plan_jobs_without_gpus_always_start():
    assert plan_starts(q(("a", None), ("b", None)), [], []) == {"a": (), "b": ()}


def test_plan_exact_request_for_a_missing_gpu_never_starts():
    assert plan_starts(q(("a", "7,"), ("b", "1")), [0, 1], []) == {"b": (0,)}
