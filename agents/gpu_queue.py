"""The GPU queue: what a job's ``--gpus`` can get on this machine and which queued jobs start.

Standard library only, Python 3.9. Everything but :func:`gpu_indices` and :class:`GpuWatch`
(which ask NVML) is pure: the queue is in FIFO order and GPUs are NVML indices.

Free means free: a job that asks for any N GPUs (and the default, one) gets only GPUs that no
agent job holds and that nothing else uses either (:func:`gpu_in_use`): another tenant's
process, one of this user's own started outside the agent, or memory held by processes NVML
does not list here (another container's). GPUs named by index (and ``all``) are the
requester's own choice: they wait for agent jobs only.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from agents import messages
from agents.protocol import GpuRequest, JobError, JobRequestError, WhoJob

#: More GPU memory in use than this, in bytes, by all processes together (visible here or
#: not) or by any one of them, and a GPU is not free for a new job. An idle process's CUDA
#: context takes about 300-500 MiB and drivers that count their own reservation as used show
#: about as much on an idle GPU, so 1 GiB lets those pass while any real model, dataset or
#: cache (which a new job would run out of memory beside) stops it.
FREE_MEM_MAX_BYTES = 2**30
#: A GPU busier than this, in % of the driver's last sample period with a kernel running, is
#: not free for a new job (an idle GPU reads 0 %; a job sharing it would run slowly).
FREE_UTIL_MAX_PCT = 10


def gpu_in_use(
    mem_used_bytes: Optional[int],
    util_gpu_pct: Optional[int],
    process_mem_bytes: Iterable[Optional[int]] = (),
) -> bool:
    """Whether something uses a GPU so that a new job should not get it: more than
    FREE_MEM_MAX_BYTES of its memory in use (``mem_used_bytes``, every process's, visible or
    not) or held by one process (``process_mem_bytes``), or more than FREE_UTIL_MAX_PCT busy.
    A value NVML does not report (None) counts as no use."""
    if mem_used_bytes is not None and mem_used_bytes > FREE_MEM_MAX_BYTES:
        return True
    if util_gpu_pct is not None and util_gpu_pct > FREE_UTIL_MAX_PCT:
        return True
    return any(m is not None and m > FREE_MEM_MAX_BYTES for m in process_mem_bytes)


def resolve_request(request: GpuRequest, available: Sequence[int], why: str) -> GpuRequest:
    """Check ``request`` against the GPU indices this machine has: ``all`` becomes exact
    indices, the default (``auto``) one free GPU, or no GPU when ``available`` is empty.

    ``why`` explains an empty ``available``. Raises JobError when no GPU can be used here,
    JobRequestError when the request names GPUs this machine lacks or more than it has (codes
    ``no_usable_gpu``, ``gpus_missing``, ``gpus_too_many``); the machine is the ``name``
    parameter, "this machine" in the English (the bot puts the instance's name there).
    """
    if request.auto:
        return GpuRequest(count=1) if available else GpuRequest()
    if request.count == 0:
        return request
    if not available:
        raise JobError.said(
            "no_usable_gpu",
            messages.NO_USABLE_GPU,
            name=messages.THIS_MACHINE,
            why=why,
            text=request.text,
        )
    have = sorted(available)
    if request.count < 0:
        return GpuRequest(count=len(have), indices=tuple(have))
    machine: Dict[str, Any] = {
        "name": messages.THIS_MACHINE,
        "count": len(have),
        "indices": ", ".join(map(str, have)),
        "text": request.text,
    }
    missing = [i for i in request.indices if i not in available]
    if missing:
        raise JobRequestError.said(
            "gpus_missing",
            messages.GPUS_MISSING[len(have) == 1, len(missing) == 1],
            missing=", ".join(map(str, missing)),
            most=len(have),
            **machine,
        )
    if request.count > len(have):
        raise JobRequestError.said(
            "gpus_too_many",
            messages.GPUS_TOO_MANY[len(have) == 1],
            wanted=request.count,
            **machine,
        )
    return request


def plan_starts(
    queue: Sequence[Tuple[str, GpuRequest]],
    gpus: Sequence[int],
    busy: Iterable[int],
    in_use: Iterable[int] = (),
) -> Dict[str, Tuple[int, ...]]:
    """Which queued jobs may start now, and on which GPUs. Pure.

    ``queue`` is in FIFO order, ``gpus`` every GPU index, ``busy`` those running jobs hold,
    ``in_use`` those something else uses (:func:`gpu_in_use`): a request for any N never gets
    those; one naming GPUs by index does. A later job never takes a GPU an earlier waiting job
    needs: an exact request that cannot start reserves its GPUs; a request for any N that
    cannot start holds back every GPU job behind it. Jobs without GPUs start at once.
    """
    used = set(in_use)
    taken: Set[int] = set(busy)
    reserved: Set[int] = set()
    hold_gpu_jobs = False
    plan: Dict[str, Tuple[int, ...]] = {}
    for job_id, request in queue:
        if request.count == 0:
            plan[job_id] = ()
            continue
        if hold_gpu_jobs:
            continue
        if request.indices:
            if all(i in gpus and i not in taken and i not in reserved for i in request.indices):
                plan[job_id] = request.indices
                taken.update(request.indices)
            else:
                reserved.update(request.indices)
            continue
        free = [g for g in sorted(gpus) if g not in taken and g not in reserved and g not in used]
        if len(free) < request.count:
            hold_gpu_jobs = True
            continue
        chosen = tuple(free[: request.count])
        plan[job_id] = chosen
        taken.update(chosen)
    return plan


def queue_of(active: Iterable[Mapping[str, Any]]) -> List[Tuple[str, GpuRequest]]:
    """The queued jobs among unfinished jobs' metadata (in the order given) and their
    requests, for :func:`plan_starts`."""
    return [
        (
            str(m["id"]),
            GpuRequest(
                count=int(m.get("want_count") or 0),
                indices=tuple(int(i) for i in m.get("want_indices") or ()),
            ),
        )
        for m in active
        if m.get("state") == "queued"
    ]


def busy_of(active: Iterable[Mapping[str, Any]]) -> List[int]:
    """The GPUs running jobs hold, from unfinished jobs' metadata."""
    return [
        int(g) for m in active if m.get("state") == "running" for g in m.get("gpus_assigned") or ()
    ]


def reservations(
    metas: Iterable[Mapping[str, Any]],
) -> Tuple[Dict[int, WhoJob], Dict[int, List[WhoJob]], List[WhoJob]]:
    """The GPUs unfinished jobs hold or wait for. Pure.

    Returns (GPU index -> the running job assigned to it, GPU index -> queued jobs that asked
    for it by index, queued jobs that asked for a count of GPUs), each in FIFO order.
    """
    held: Dict[int, WhoJob] = {}
    waiting: Dict[int, List[WhoJob]] = {}
    waiting_any: List[WhoJob] = []
    for meta in sorted(metas, key=lambda m: m.get("seq", 0)):
        state = meta.get("state")
        if state == "running":
            job = _who_job(meta, tuple(int(g) for g in meta.get("gpus_assigned") or ()))
            for index in job.gpus:
                held.setdefault(index, job)
        elif state == "queued" and int(meta.get("want_count") or 0) != 0:
            indices = tuple(int(g) for g in meta.get("want_indices") or ())
            job = _who_job(meta, indices)
            if indices:
                for index in indices:
                    waiting.setdefault(index, []).append(job)
            else:
                waiting_any.append(job)
    return held, waiting, waiting_any


def _who_job(meta: Mapping[str, Any], gpus: Tuple[int, ...]) -> WhoJob:
    running = meta.get("state") == "running"
    return WhoJob(
        job_id=str(meta["id"]),
        name=meta.get("name"),
        user=meta.get("user"),
        state=str(meta.get("state")),
        gpus=gpus,
        gpus_requested=meta.get("gpus_requested"),
        since=meta.get("started_at") if running else meta.get("created_at"),
    )


def gpu_indices() -> Tuple[List[int], str]:
    """The GPU indices NVML sees, and why there are none when the list is empty."""
    from agents import nvml

    try:
        with nvml.GpuSampler() as sampler:
            found = [g.index for g in sampler.sample()]
    except nvml.NvmlUnavailable as exc:
        return [], exc.error.message
    return found, "" if found else "NVML lists no GPUs"


class GpuWatch:
    """NVML kept open while a job waits for GPUs: ``with GpuWatch() as watch`` then
    :meth:`look` as often as the queue is looked at. Entering raises ``nvml.NvmlUnavailable``
    when NVML cannot be used."""

    def __init__(self) -> None:
        self._sampler: Any = None
        self._last: Tuple[List[int], Set[int]] = ([], set())

    def __enter__(self) -> GpuWatch:
        from agents import nvml

        sampler = nvml.GpuSampler()
        self._sampler = sampler.__enter__()
        self._last = self.look()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self._sampler is not None:
            self._sampler.__exit__(None, None, None)
            self._sampler = None

    def look(self) -> Tuple[List[int], Set[int]]:
        """(every GPU index, those in use by something, :func:`gpu_in_use`) now; the previous
        answer when NVML fails this once."""
        if self._sampler is None:
            raise RuntimeError("GpuWatch.look() called outside `with GpuWatch()`")
        try:
            gpus = self._sampler.sample()
        except Exception:  # noqa: BLE001 - one failed look keeps the last answer
            return self._last
        self._last = (
            [g.index for g in gpus],
            {g.index for g in gpus if gpu_in_use(g.mem_used_bytes, g.util_gpu_pct)},
        )
        return self._last
