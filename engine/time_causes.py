"""The measured causes of a gap between a lesson's predicted time and the run's (issue 28).

A prediction (``lessons/checks.py``) names what it leaves out, and each cause is measured on its
own, never taken as measured − predicted:

* **CPU contention** — the time a rank was ready to run but waited for a core: the kernel's
  run-queue delay of the calling thread (``/proc/thread-self/schedstat``, second field), read
  around the timed region (:class:`Window`; zero where the file is absent), and in a collective
  the longest such wait of any rank's threads, the backend's included (gloo's threads do its work
  while the caller sleeps: :func:`longest_thread_wait_s`, :func:`step_contention`);
* **on-CPU time** — the thread's CPU time over the same region (``time.thread_time``): compute
  and Python overhead, without the time spent blocked in a collective or descheduled;
* **waiting for a peer** — in a collective, the time between this rank's arrival and the last
  rank's; and a **slow collective** — the time it took once every rank had arrived, beyond its
  α-β time (:func:`collective_causes`: every rank's entry times, gathered; one host's wall clock);
  or, measured apart from the run, what the same collective takes alone once every rank has
  entered it (:func:`collective_alone`);
* the machine's **matmul rate** (:func:`matmul_rate`) and **memory bandwidth**
  (``doctor.host_memcpy_bandwidth``), the α and β of the group (``doctor.group_alpha_beta``).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Window", "collective_alone", "collective_causes", "copy_bandwidth", "longest_thread_wait_s", "matmul_rate",
           "process_run_queue_s", "run_queue_s", "step_contention", "threads_run_queue_s"]

_SCHEDSTAT = "/proc/thread-self/schedstat"
#: the blocks of a :class:`Window` whose bounds it keeps (a trace draws a few steps, not a sweep)
KEPT_BLOCKS = 16


def _wait_field(schedstat: bytes) -> float:
    """Seconds of run-queue wait in a schedstat line (on-CPU ns, run-queue ns, timeslices)."""
    return int(schedstat.split()[1]) / 1e9


def _run_delay(path: str) -> float:
    try:
        with open(path, "rb") as f:
            return _wait_field(f.read())
    except (OSError, IndexError, ValueError):
        return 0.0


def run_queue_s() -> float:
    """Seconds the calling thread has waited on a run queue so far (0.0 where not reported)."""
    return _run_delay(_SCHEDSTAT)


_TASK_FILES: dict[str, int] = {}  # thread id -> its schedstat file, kept open: a read is then one pread
#: the threads whose waits delay a collective: the caller's and the backend's (gloo names its own);
#: not an intra-op pool's, whose spinning workers wait for a core all the time and delay nothing
BACKEND_THREADS = ("pt_gloo", "gloo")


def _is_backend_thread(task: str) -> bool:
    try:
        with open(f"/proc/self/task/{task}/comm") as f:
            return f.read().startswith(BACKEND_THREADS)
    except OSError:
        return False


def threads_run_queue_s() -> dict[str, float]:
    """Seconds the calling thread and the backend's threads (:data:`BACKEND_THREADS`) have waited
    for a core so far, runnable but not running (``/proc/self/task/*/schedstat``; empty where not
    reported). Cheap enough to read around every collective (about 10 µs for a gloo rank's
    threads; opening the files each time cost 86)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return {}
    out, caller = {}, str(threading.get_native_id())
    for task in tasks:
        try:
            fd = _TASK_FILES.get(task)
            if fd is None or (fd < 0 and task == caller):  # the caller counts whatever its name
                fd = _TASK_FILES[task] = os.open(f"/proc/self/task/{task}/schedstat", os.O_RDONLY) \
                    if task == caller or _is_backend_thread(task) else -1
            if fd >= 0:
                out[task] = _wait_field(os.pread(fd, 64, 0))
        except (OSError, IndexError, ValueError):
            continue
    for gone in set(_TASK_FILES) - set(tasks):  # a thread that ended: its id may come back as another's
        fd = _TASK_FILES.pop(gone, -1)  # another thread (a completion callback) may have closed it
        if fd >= 0:
            os.close(fd)
    return out


def process_run_queue_s() -> float:
    """Seconds every thread of this process has waited for a core so far, summed over them (threads
    that wait at once each count: a share of the machine's load, not a delay)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    return sum(_run_delay(f"/proc/self/task/{task}/schedstat") for task in tasks)


def longest_thread_wait_s(before: dict[str, float], skip: str = "", now: dict[str, float] | None = None) -> float:
    """The most any one thread of this process has waited for a core since ``before``
    (:func:`threads_run_queue_s`; thread ``skip`` apart), until ``now`` (a reading taken already)
    or this call. A collective's work runs on the backend's threads (gloo's) while the calling
    thread sleeps, so its delay is theirs, not the caller's; the longest, not the sum: threads that
    wait at the same moment delay it once."""
    now = threads_run_queue_s() if now is None else now
    # a thread ``before`` did not read (another caller's own) has nothing to count since then
    return max((q - before.get(task, q) for task, q in now.items() if task != skip), default=0.0)


@dataclass
class Window:
    """Wall time, on-CPU time and run-queue delay of the calling thread over ``with`` blocks
    (accumulated over every block it was entered for); ``blocks``: the first :data:`KEPT_BLOCKS`
    blocks' bounds on the wall clock (``time.time()``, the run's events' clock), where the run's
    trace draws them (``comm_trace.trace_causes``). With ``backend``, ``backend_wait_s``: the longest
    wait for a core of one of gloo's threads over each block (:data:`BACKEND_THREADS`: they run the
    block's collectives), read at the block's ends only, for a caller whose collectives are timed
    without reading the threads' clocks (``TPGroup.thread_waits`` off: those reads, after each
    wake-up, cost a decode step more CPU than its twins)."""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    run_queue_s: float = 0.0
    backend_wait_s: float = 0.0
    backend: bool = False
    blocks: list[tuple[float, float]] = field(default_factory=list)
    _start: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    _threads: dict[str, float] = field(default_factory=dict)

    @classmethod
    def total(cls, windows: Sequence[Window]) -> Window:
        """One window over all of ``windows``' blocks: their times summed, their kept blocks in order."""
        out = cls(backend=any(w.backend for w in windows))
        for w in windows:
            out.wall_s += w.wall_s
            out.cpu_s += w.cpu_s
            out.run_queue_s += w.run_queue_s
            out.backend_wait_s += w.backend_wait_s
            out.blocks.extend(w.blocks[:KEPT_BLOCKS - len(out.blocks)])
        return out

    def __enter__(self) -> Window:
        self._threads = threads_run_queue_s() if self.backend else {}
        self._start = (time.perf_counter(), time.thread_time(), run_queue_s(), time.time())
        return self

    def __exit__(self, *exc: object) -> None:
        w, c, q, t = self._start
        self.wall_s += time.perf_counter() - w
        self.cpu_s += time.thread_time() - c
        self.run_queue_s += run_queue_s() - q
        if len(self.blocks) < KEPT_BLOCKS:
            self.blocks.append((t, time.time()))
        if self.backend:
            self.backend_wait_s += longest_thread_wait_s(self._threads, skip=str(threading.get_native_id()))


def collective_causes(spans: Sequence[Sequence[float]], expected_s: list[float],
                      group: Any = None) -> dict[str, list[float]]:
    """For each collective this rank entered and left at ``spans[i][:2]`` (wall-clock seconds),
    having waited ``spans[i][2]`` on a run queue and run ``spans[i][3]`` on a CPU meanwhile, and
    its threads at most ``spans[i][4]`` (:func:`longest_thread_wait_s`; the caller's wait where
    absent): ``peer_wait``, how long it waited for the last rank of ``group`` to arrive;
    ``contention``, the longest wait for a core any rank's threads had in it (a collective ends
    when every rank's part has run), at most its time once every rank had arrived;
    ``slow``, how much longer than ``expected_s[i]`` (its α-β time, the caller's CPU time in it
    included) it took once every rank had arrived, that contention apart (the caller counts it as
    CPU contention, :func:`step_contention`; negative: faster); ``on_cpu``, its CPU time (part of
    the α-β time: a caller takes it out of the region's compute). Every rank calls it with its spans
    of the same collectives."""
    everyone: list[Any] = [list(spans)]
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, list(spans), group=group)
    if any(len(a) != len(spans) for a in everyone):
        raise RuntimeError("the ranks entered different numbers of collectives")
    last = [max(a[i][0] for a in everyone) for i in range(len(spans))]
    # a wait before the last rank arrived is waiting for a peer, not a delay of the collective
    contention = [min(max(a[i][-1] if len(a[i]) > 4 else a[i][2] for a in everyone), max(0.0, s[1] - max(t, s[0])))
                  for i, (t, s) in enumerate(zip(last, spans))]
    return {"peer_wait": [t - s[0] for t, s in zip(last, spans)], "on_cpu": [s[3] for s in spans],
            "contention": contention,
            "slow": [s[1] - max(t, s[0]) - c - e for t, s, c, e in zip(last, spans, contention, expected_s, strict=True)]}


def step_contention(window_run_queue_s: float, spans: Sequence[Sequence[float]], contention: list[float]) -> float:
    """A step's CPU contention: its own run-queue delay (``window_run_queue_s``, a
    :class:`Window` over the step), in its collectives (``spans[i][2]``) replaced by the longest
    any rank had there (:func:`collective_causes`' ``contention``: a collective waits for every
    rank's part)."""
    return window_run_queue_s - sum(s[2] for s in spans) + sum(contention)


def collective_alone(fn: Any, repeats: int = 3, group: Any = None, device: Any = "cpu",
                     run_queue_apart: bool = False) -> float:
    """Seconds the collective ``fn`` (every rank of ``group`` calls it) takes alone, apart from the
    step whose time it explains: from the moment the last rank entered it to this rank's return (the
    ranks' skew leaving the barrier before it taken out; one host's wall clock), the median of
    ``repeats`` after a warm-up. ``fn`` synchronizes its device; ``device``: where the group reduces.
    ``run_queue_apart``: less the longest wait for a core any rank's threads had in each call
    (:func:`longest_thread_wait_s`), as :func:`collective_causes`' ``slow`` is, for a caller that
    counts the step's contention on its own (:func:`step_contention`)."""
    fn()  # warm-up: connections and buffers
    marks = torch.zeros(2, repeats, dtype=torch.float64)  # entered, run-queue delay (every rank's max)
    left = torch.zeros(repeats, dtype=torch.float64)
    for i in range(repeats):
        if dist.is_initialized():
            dist.barrier(group=group)
        queued = threads_run_queue_s() if run_queue_apart else {}
        marks[0, i] = time.time()
        fn()
        left[i] = time.time()
        marks[1, i] = longest_thread_wait_s(queued) if run_queue_apart else 0.0
    own_entry = marks[0].clone()
    marks = marks.to(device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(marks, op=dist.ReduceOp.MAX, group=group)
    marks = marks.cpu()
    took = left - torch.maximum(marks[0], own_entry)
    # a thread's wait before the last rank entered is not the call's: at most the call's own time
    return float((took - torch.minimum(marks[1], took)).median())


def matmul_rate(dtype: torch.dtype = torch.float32, device: Any = "cpu", n: int = 256, repeats: int = 5) -> float:
    """FLOP/s of an n×n by n×n matmul on this device and thread count, best of ``repeats``."""
    dev = torch.device(device)
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    best = float("inf")
    for _ in range(repeats + 1):  # the first one warms up
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        a @ b
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def copy_bandwidth(device: Any = "cpu", size_bytes: int = 64 << 20, repeats: int = 3) -> float:
    """Bytes per second a copy of ``size_bytes`` reads and writes on ``device`` (host memory:
    ``doctor.host_memcpy_bandwidth``), best of ``repeats``."""
    dev = torch.device(device)
    if dev.type != "cuda":
        from .doctor import host_memcpy_bandwidth

        return host_memcpy_bandwidth(size_bytes, repeats)
    src = torch.ones(size_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats + 1):
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize(dev)
        best = min(best, time.perf_counter() - t0)
    return size_bytes / best
