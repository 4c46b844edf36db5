"""``distai doctor``: what this machine has, and how fast it moves bytes.

Reports CPUs and memory, GPUs with their memory and interconnect (``nvidia-smi topo -m`` where
present), torch / CUDA / NCCL / gloo versions, and a quick bandwidth test: host memcpy, TCP
loopback, and an all-reduce across the local GPUs (NCCL) or CPU processes (gloo), reported as
algbw and busbw with nccl-tests' definitions (the same functions lesson 1 teaches), and the α and β
of one link (:func:`link_alpha_beta`: the alpha-beta model's latency and time per byte, measured by
ping-pong between two ranks), which lesson 1's run measures the same way on its own group to check
its ring formula against its all-reduce.
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from ..lessons.lesson1.formulas import algbw, alpha_beta_fit, busbw, busbw_factor
from .experiment import device_sync
from .host import host_memory_bytes, read_first
from .runtime import timed_collective
from .time_causes import collective_alone, process_run_queue_s
from .time_causes import run_queue_s as thread_run_queue_s

MiB = 1 << 20


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": read_first("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": host_memory_bytes(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "nccl": None,
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "gpus": [],
        "topology": None,
    }
    if torch.cuda.is_available():
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL missing from this build
            info["nccl"] = None
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append({"index": i, "name": props.name, "memory_bytes": props.total_memory,
                                 "capability": f"{props.major}.{props.minor}"})
        info["topology"] = gpu_topology()
    return info


def gpu_topology() -> str | None:
    """``nvidia-smi topo -m``: which GPU pairs talk over NVLink (NV#) or PCIe (PIX, PHB, SYS)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def host_memcpy_bandwidth(size_bytes: int = 256 * MiB, repeats: int = 5) -> float:
    """Bytes per second of a host-to-host copy (read + write of ``size_bytes``), best of ``repeats``."""
    src = torch.empty(size_bytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return size_bytes / best


def loopback_bandwidth(size_bytes: int = 256 * MiB, chunk: int = 4 * MiB) -> float:
    """Bytes per second through a TCP connection on 127.0.0.1 (the path gloo takes on one host)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    received = 0

    def sink() -> None:
        nonlocal received
        conn, _ = server.accept()
        with conn:
            buf = bytearray(chunk)
            view = memoryview(buf)
            while received < size_bytes:
                n = conn.recv_into(view)
                if n == 0:
                    break
                received += n

    thread = threading.Thread(target=sink, daemon=True)
    thread.start()
    payload = bytes(chunk)
    with socket.create_connection(("127.0.0.1", port)) as client:
        start = time.perf_counter()
        sent = 0
        while sent < size_bytes:
            client.sendall(payload)
            sent += chunk
        thread.join(timeout=60)
        elapsed = time.perf_counter() - start
    server.close()
    return received / elapsed


def rank_timings(fns: dict[str, Any], repeats: int, device: torch.device, inner: int = 1) -> dict[str, torch.Tensor]:
    """Every rank calls each of ``fns`` (collective: all ranks call the same ones) ``repeats``
    times, in rotating order so that they share the machine's load alike; each timing is started
    together (a barrier) and runs ``inner`` calls back to back (nccl-tests' loop: a scheduler's
    hiccup is spread over them). Per fn, a (4, repeats) tensor of seconds per call: row 0 each
    timing's wall time, as long as its slowest rank; row 1 the longest wait for a core of a rank's
    calling thread in it (its kernel run-queue delay, :func:`distai.engine.time_causes.run_queue_s`:
    runnable, not running; 0 where the kernel does not report it; at most the rank's wall time);
    row 2 the first less the second: the timing without the wait of the rank that held the others
    back (in a collective every rank waits for the one that waited for a core); row 3 the longest
    of the ranks' own times without their own wait (for a fn that does not communicate); row 4 the
    CPU seconds of the calling thread of the rank whose wall time was the longest (with the waits for a
    core, what its time was made of: the rest it was asleep on its peers)."""
    names = list(fns)
    times = torch.zeros(4, len(names), repeats, dtype=torch.float64)  # wall, wait, own time, CPU
    for i in range(repeats):
        for k in range(len(names)):
            j = (i + k) % len(names)
            fn = fns[names[j]]
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            queued, cpu, start = thread_run_queue_s(), time.thread_time(), time.perf_counter()
            for _ in range(inner):
                fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[0, j, i] = (time.perf_counter() - start) / inner
            times[3, j, i] = (time.thread_time() - cpu) / inner
            times[1, j, i] = min((thread_run_queue_s() - queued) / inner, times[0, j, i].item())
            times[2, j, i] = times[0, j, i] - times[1, j, i]
    ranks = [torch.zeros_like(times, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(ranks, times.to(device))  # NCCL gathers device tensors only
    every = torch.stack([r.cpu() for r in ranks])  # (rank, row, fn, repeat)
    slowest = every[:, 0].argmax(dim=0, keepdim=True)  # per fn and repeat, the rank with the longest wall
    cpu_of_slowest = every[:, 3].gather(0, slowest)[0]
    top = every[:, :3].amax(dim=0)
    times = torch.stack([top[0], top[1], top[0] - top[1], top[2], cpu_of_slowest])
    return {name: times[:, j] for j, name in enumerate(names)}


def slowest_rank_times(fns: dict[str, Any], repeats: int, device: torch.device, stat: str = "median",
                       inner: int = 1) -> dict[str, float]:
    """:func:`rank_timings`' wall times: per call, in seconds, the ``stat`` (``median``, or
    ``min``: the least disturbed timing) of each of ``fns``, the slowest rank's."""
    return {name: getattr(t[0], stat)().item() for name, t in rank_timings(fns, repeats, device, inner).items()}


class CoreWait:
    """``with CoreWait(device) as w: …`` (or ``w = CoreWait(device).start(); …; w.stop()``): over the block, this process's CPU time per wall second
    (``cpu_per_wall``) and its threads' wait for a core per wall second (``run_queue_share``, the
    largest over the group's ranks: every rank must leave the block together). On a machine with
    more runnable processes than cores a timing is largely that wait, which no model of compute
    or links predicts."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu_per_wall = self.run_queue_share = 0.0

    def start(self) -> CoreWait:
        self._cpu, self._wall, self._queue = time.process_time(), time.perf_counter(), process_run_queue_s()
        return self

    def stop(self) -> None:
        """The figures since :meth:`start` (every rank of the group calls it)."""
        wall = max(time.perf_counter() - self._wall, 1e-9)
        self.cpu_per_wall = (time.process_time() - self._cpu) / wall
        share = torch.tensor([(process_run_queue_s() - self._queue) / wall], dtype=torch.float64, device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(share, op=dist.ReduceOp.MAX)
        self.run_queue_share = share.item()

    def __enter__(self) -> CoreWait:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.stop()


def ping_pong(buf: torch.Tensor, rounds: int = 1, a: int = 0, b: int = 1) -> None:
    """``rounds`` round trips of ``buf`` between ranks ``a`` and ``b`` (the others do nothing):
    2·rounds messages, one after the other, on one link."""
    rank = dist.get_rank()
    for _ in range(rounds):
        if rank == a:
            dist.send(buf, dst=b)
            dist.recv(buf, src=b)
        elif rank == b:
            dist.recv(buf, src=a)
            dist.send(buf, dst=a)


#: the messages :func:`link_alpha_beta` times: α from the smallest, β from the slope up to the largest
ALPHA_BYTES, BETA_BYTES = 4, 4 * MiB


def slowest_hop_peer(world_size: int, local_world_size: int) -> int:
    """The rank rank 0 times a link with: the first rank of the next node when the run spans nodes, else
    rank 1. torchrun numbers each node's ranks together, so a ring over all ranks (and every collective
    that runs as one) crosses between nodes and waits on that hop; a link inside node 0 was up to 100x
    faster across two hosts and predicted their ring that much too fast."""
    return local_world_size if 0 < local_world_size < world_size else 1


def run_link_peer() -> int:
    """:func:`slowest_hop_peer` of the running group (torchrun's ``LOCAL_WORLD_SIZE``: ranks per node)."""
    world = dist.get_world_size()
    return slowest_hop_peer(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def link_alpha_beta(device: torch.device, repeats: int = 9, small: int = ALPHA_BYTES,
                    large: int = BETA_BYTES, rounds: int = 8, contention_apart: bool = False) -> dict[str, float]:
    """α (s) and β (s/B) of one link, run on every rank of the current group: rank 0 and
    :func:`run_link_peer` (rank 1, or the next node's first rank) ping-pong a ``small`` and a ``large`` message, ``rounds`` round trips per timing (OSU's
    latency test: a loop, so that starting together costs once), the median of ``repeats``; α is
    the small message's one-way time, β the slope up to the large one (latency from tiny
    messages, bandwidth from big ones, as nccl-tests and OSU's tests read them). ``contention_apart``:
    each size's least disturbed timing less the wait for a core in it (:func:`rank_timings`' row 2), as
    lesson 1's check times the parts it compares with: a median carried the load of a busy machine into
    α (527 µs where the same messages took 20 µs each, the rest of the gap then called "size")."""
    peer = run_link_peer()
    bufs = {size: torch.ones(max(1, size // 4), dtype=torch.float32, device=device) for size in (small, large)}
    for buf in bufs.values():
        ping_pong(buf, 1, 0, peer)  # warm-up: connections and buffers
    fns = {str(size): (lambda buf=buf: ping_pong(buf, rounds, 0, peer)) for size, buf in bufs.items()}
    if contention_apart:
        timed = rank_timings(fns, repeats, device)
        t = {name: w[2].min().item() for name, w in timed.items()}
        if t[str(large)] <= t[str(small)]:
            # the waits taken off exceeded the delay they caused (a rank runnable while its 4 MiB were in
            # flight; CI once read β = 0 so): each size's least disturbed wall time instead, waits included
            t = {name: w[0].min().item() for name, w in timed.items()}
    else:
        t = slowest_rank_times(fns, repeats, device)
    one_way = {size: t[str(size)] / (2 * rounds) for size in bufs}
    beta = max(0.0, (one_way[large] - one_way[small]) / (large - small))
    return {"alpha_s": one_way[small], "beta_s_per_byte": beta, "peer": float(peer), "small_bytes": float(small),
            "large_bytes": float(large), "small_s": one_way[small], "large_s": one_way[large]}


def _allreduce_sweep(rank: int, world_size: int, sizes: list[int], repeats: int, device_type: str) -> dict:
    """Runs on every rank: one link's α and β, and timed all-reduces of each size (rank 0's
    results are reported)."""
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    return {"results": _allreduce_rows(world_size, sizes, repeats, device), "link": link_alpha_beta(device)}


def _allreduce_rows(world_size: int, sizes: list[int], repeats: int, device: torch.device,
                    back_to_back: int = 1) -> list[dict]:
    """Every rank: timed all-reduces of each size, as long as the slowest rank; with ``back_to_back``
    > 1 each sample is that many calls in a row, divided (nccl-tests' way: the ranks' skew leaving
    the barrier is paid once, not per call)."""
    results = []
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up: connections and buffers
        elapsed = slowest_rank_times({"all_reduce": lambda: dist.all_reduce(buf)}, repeats, device,
                                     inner=back_to_back)["all_reduce"]
        results.append({"bytes": size, "time_s": elapsed, "algbw": algbw(size, elapsed),
                        "busbw": busbw(size, elapsed, world_size)})
    return results


def group_allreduce_times(sizes: list[int], repeats: int = 5, device_type: str = "cpu",
                          contention_apart: bool = False) -> list[dict]:
    """On every rank of the running (world) group: :func:`_allreduce_rows`, 10 calls back
    to back per sample (as a step issues them); [] on one rank. ``contention_apart``: each size
    timed alone instead, one call at a time less the longest wait for a core of a rank's threads
    in it (``time_causes.collective_alone``), for a check that counts CPU contention as a cause of
    its own (lessons 4 and 7)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    if n < 2:
        return []
    if not contention_apart:
        return _allreduce_rows(n, sizes, repeats, device, back_to_back=10)
    rows = []
    for size in sizes:
        buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=device)

        def reduce(buf=buf) -> None:
            dist.all_reduce(buf)
            device_sync(device)

        rows.append({"bytes": size, "time_s": collective_alone(reduce, repeats, device=device, run_queue_apart=True)})
    return rows


def fit_alpha_beta(rows: list[dict], n: int) -> tuple[float, float]:
    """α (s per ring step) and β (s per byte) from all-reduce rows (``bytes``, ``time_s``) on
    ``n`` ranks: lesson 1's fit, t = 2(n−1)α + 2(n−1)/n·S·β; (0, 0) on one rank."""
    if n < 2 or len({r["bytes"] for r in rows}) < 2:
        return 0.0, 0.0
    a, b = alpha_beta_fit([r["bytes"] for r in rows], [r["time_s"] for r in rows])
    return max(a, 0.0) / (2 * (n - 1)), max(b, 0.0) / busbw_factor(n)


def group_alpha_beta(sizes: list[int], repeats: int = 5, device_type: str = "cpu",
                     contention_apart: bool = False) -> tuple[float, float]:
    """α and β of the running group, on every rank (:func:`group_allreduce_times`, :func:`fit_alpha_beta`)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    return fit_alpha_beta(group_allreduce_times(sizes, repeats, device_type, contention_apart), n)


def concurrent_pairs_alpha_beta(sizes: tuple[int, ...] = (64, MiB), repeats: int = 5, back_to_back: int = 10,
                                device_type: str = "cpu", between: Any = None) -> tuple[float, float]:
    """On every rank of the running group: α (s per ring step) and β (s per byte) of lesson 1's ring
    inside groups of two consecutive ranks, every pair at once (as a mesh run's TP, PP and DP pairs
    talk while the other ranks do; the world itself when it is odd), from all-gathers (the op of
    sequence parallelism): t = (n−1)·α + (n−1)/n·S·β for S gathered bytes, fitted over ``sizes``
    (:func:`alpha_beta_fit`). Each sample is ``back_to_back`` calls in a row, averaged; each size's
    time the median over samples of the slowest rank. ``between``: work each rank does before each
    call (a run's compute between its collectives: a rank that computed has used its share of the
    cores and wakes later than one that only talks), its own time taken off."""
    world, rank = dist.get_world_size(), dist.get_rank()
    n = 2 if world % 2 == 0 else world
    groups = [dist.new_group(list(range(i, i + n))) for i in range(0, world, n)]
    group = groups[rank // n]
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    times = []
    for nbytes in sizes:
        shard = torch.zeros(max(1, nbytes // (4 * n)), dtype=torch.float32, device=device)
        out = [torch.empty_like(shard) for _ in range(n)]
        dist.all_gather(out, shard, group=group)  # warm-up: connections and buffers

        def calls(talk: bool = True) -> None:
            for _ in range(back_to_back):
                if between is not None:
                    between()
                if talk:
                    dist.all_gather(out, shard, group=group)
        samples = torch.tensor([[timed_collective(lambda: calls(talk), device_type == "cuda") / back_to_back
                                 for talk in ((True, False) if between is not None else (True,))]
                                for _ in range(repeats)], dtype=torch.float64, device=device)
        dist.all_reduce(samples, op=dist.ReduceOp.MAX)
        # each sample's calls less the same work without them, side by side: the load drifts between samples
        paired = samples[:, 0] - samples[:, 1] if between is not None else samples[:, 0]
        times.append(max(0.0, paired.median().item()))
    a, b = alpha_beta_fit([float(s) for s in sizes], times)
    return max(a, 0.0) / (n - 1), max(b, 0.0) * n / (n - 1)


def _nccl_worker(rank: int, world_size: int, port: int, sizes: list[int], repeats: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    try:
        res = _allreduce_sweep(rank, world_size, sizes, repeats, "cuda")
        if rank == 0:
            out.put(res)
    finally:
        dist.destroy_process_group()


def allreduce_bandwidth(ranks: int, sizes: list[int], repeats: int = 5) -> dict[str, Any]:
    """All-reduce algbw/busbw across ``ranks`` local GPUs with NCCL if there are that many, else
    across ``ranks`` CPU processes with gloo."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= ranks >= 2:
        import torch.multiprocessing as mp

        from .testing import free_port

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        mp.start_processes(_nccl_worker, args=(ranks, free_port(), sizes, repeats, queue),
                           nprocs=ranks, join=True, start_method="spawn")
        return {"backend": "nccl", "ranks": ranks, **queue.get(timeout=10)}
    from .testing import run_in_group

    per_rank = run_in_group(_allreduce_sweep, ranks, sizes, repeats, "cpu")
    return {"backend": "gloo", "ranks": ranks, **per_rank[0]}


def lesson_advice(info: dict[str, Any], lessons) -> list[dict[str, Any]]:
    """Which lessons' experiments can run on GPUs here (one rank per GPU), and which on CPU.

    Each entry: ``run`` (the command alone), ``why`` (``gpus``: a rank per GPU; ``few_gpus``: the
    lesson needs more GPUs than ``gpus_here``; ``no_cuda``), and ``command`` (``run`` with the
    reason in English, as the report has always held it); ``distai doctor`` says the reason in the
    learner's language from ``why``."""
    n_gpus = len(info["gpus"])
    advice = []
    for lesson in lessons:
        ranks = lesson.ranks
        if n_gpus >= ranks:
            where, why, run = "gpu", "gpus", f"distai run {lesson.id} --gpus {ranks}"
            how = f"{run}  (NCCL, one rank per GPU)"
        elif n_gpus >= 1:
            where, why, run = "cpu", "few_gpus", f"distai run {lesson.id} --cpu {ranks}"
            how = f"{run}  (needs {ranks} GPUs, this machine has {n_gpus}; gloo on CPU processes)"
        else:
            where, why, run = "cpu", "no_cuda", f"distai run {lesson.id} --cpu {ranks}"
            how = f"{run}  (no CUDA: gloo on CPU processes)"
        advice.append({"lesson": lesson.id, "ranks": ranks, "runs_on": where, "command": how,
                       "run": run, "why": why, "gpus_here": n_gpus})
    return advice


def diagnose(quick: bool = False, ranks: int | None = None) -> dict[str, Any]:
    from ..lessons.registry import all_lessons

    info = machine_info()
    size = 64 * MiB if quick else 256 * MiB
    report: dict[str, Any] = {"machine": info, "bandwidth": {}}
    report["bandwidth"]["host_memcpy_Bps"] = host_memcpy_bandwidth(size)
    report["bandwidth"]["loopback_tcp_Bps"] = loopback_bandwidth(size)
    n = ranks or (min(len(info["gpus"]), 8) if len(info["gpus"]) >= 2 else 2)
    sizes = [1 * MiB, 16 * MiB] if quick else [1 * MiB, 16 * MiB, 64 * MiB]
    report["bandwidth"]["allreduce"] = allreduce_bandwidth(n, sizes, repeats=3 if quick else 5)
    report["advice"] = lesson_advice(info, all_lessons())
    return report
