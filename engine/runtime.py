"""What every experiment does first: join the process group torchrun prepared.

NCCL on GPUs, gloo on CPU processes. The launcher sets ``DISTAI_DEVICE`` (``cuda`` or ``cpu``);
collectives get a timeout so a dead peer ends the run instead of hanging it.
"""
from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..lessons.strings import detect_language, translated
from ..lessons.units import format_number
from .events import JOIN_FAILED_EXIT, EventSink, backend_for
from .experiment import collective_timeout_s
from .lifeline import watch_launcher
from .profiling import RankProfile, start_profiler, stop_profiler

DEVICE_ENV = "DISTAI_DEVICE"
JOIN_GRACE_S = 10.0  # past the group's own timeout, before a rank that has not joined gives up


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    events: EventSink
    profiler: RankProfile | None = None  # torch.profiler.profile under ``distai run --profile``

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def choose_device(local_rank: int) -> torch.device:
    wanted = os.environ.get(DEVICE_ENV, "cuda" if torch.cuda.is_available() else "cpu")
    if wanted == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(timeout_s: float | None = None) -> DistContext:
    """Join the group described by torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, …).
    Under ``distai run`` the rank first ties its life to torchrun's and the launcher's."""
    watch_launcher()
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = choose_device(local_rank)
    backend = backend_for(device.type)
    timeout = timedelta(seconds=collective_timeout_s(timeout_s))
    if not dist.is_initialized():
        with join_deadline(timeout, rank, world_size):
            dist.init_process_group(backend=backend, timeout=timeout, device_id=device if backend == "nccl" else None)
    return DistContext(rank, world_size, local_rank, device, backend, EventSink(rank),
                       start_profiler(rank, device.type == "cuda"))


@contextmanager
def join_deadline(timeout: timedelta, rank: int, world: int) -> Iterator[None]:
    """End this rank if joining the group takes longer than torch itself could wait for a healthy join:
    the store's connection and each of the ``world`` − 1 peers' addresses may each take up to ``timeout``
    (peers arriving one after another), plus a grace.

    gloo's connectFullMesh can wait without end (``Pair::waitUntilConnected``, seen past 7 minutes under
    a 120 s timeout) when torchrun's store still holds a peer address from an earlier attempt of the
    group: the attempt then never fails, and neither torchrun's restarts nor the engine's supervisor
    get their turn. A rank that has not joined by then says so and exits, as a failed rank does."""
    joined = threading.Event()
    deadline_s = timeout.total_seconds() * max(1, world) + JOIN_GRACE_S

    def give_up() -> None:
        if not joined.wait(deadline_s):
            lang = detect_language()
            why = translated("run", "reasons.join_deadline", lang, rank=rank, s=format_number(deadline_s, 4, lang))
            sys.stderr.write(why + "\n")  # in the learner's language, as the run's ending says it
            sys.stderr.flush()
            os._exit(JOIN_FAILED_EXIT)  # the main thread is inside gloo's C++ wait: no exception reaches it

    threading.Thread(target=give_up, name="distai-join-deadline", daemon=True).start()
    try:
        yield
    finally:
        joined.set()


def shutdown(ctx: DistContext | None = None) -> None:
    if ctx is not None:
        stop_profiler(ctx.profiler)
        ctx.profiler = None
        ctx.events.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def timed_collective(fn, cuda: bool) -> float:
    """Seconds one call of ``fn`` takes on this rank, started together on every rank (a barrier
    first) and, on CUDA, with the device's queued work included."""
    import time

    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start
