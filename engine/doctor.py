"""``distai doctor``: what this machine has, and how fast it moves bytes.

Reports CPUs and memory, GPUs with their memory and interconnect (``nvidia-smi topo -m`` where
present), torch / CUDA / NCCL / gloo versions, and a quick bandwidth test: host memcpy, TCP
loopback, and an all-reduce across the local GPUs (NCCL) or CPU processes (gloo), reported as
algbw and busbw with nccl-tests' definitions (the same functions lesson 1 teaches).
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
from .runtime import timed_collective

MiB = 1 << 20


def _read_first(path: str, key: str) -> str | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def machine_info() -> dict[str, Any]:
    mem_kib = _read_first("/proc/meminfo", "MemTotal")
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": _read_first("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": int(mem_kib.split()[0]) * 1024 if mem_kib else None,
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


def _allreduce_sweep(rank: int, world_size: int, sizes: list[int], repeats: int, device_type: str,
                     back_to_back: int = 1) -> list[dict]:
    """Runs on every rank: timed all-reduces of each size (rank 0's results are reported); with
    ``back_to_back`` > 1 each sample is that many calls in a row, divided (nccl-tests' way: the
    ranks' skew leaving the barrier is paid once, not per call)."""
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    results = []
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        dist.all_reduce(buf)  # warm-up: connections and buffers

        def calls() -> None:
            for _ in range(back_to_back):
                dist.all_reduce(buf)
        times = torch.tensor([timed_collective(calls, device_type == "cuda") / back_to_back
                              for _ in range(repeats)], dtype=torch.float64, device=device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank defines the collective's time
        elapsed = times.median().item()
        results.append({"bytes": size, "time_s": elapsed, "algbw": algbw(size, elapsed),
                        "busbw": busbw(size, elapsed, world_size)})
    return results


def group_allreduce_times(sizes: list[int], repeats: int = 5, device_type: str = "cpu") -> list[dict]:
    """On every rank of the running (world) group: :func:`_allreduce_sweep`'s rows, 10 calls back
    to back per sample (as a step issues them); [] on one rank."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    return _allreduce_sweep(dist.get_rank(), n, sizes, repeats, device_type, back_to_back=10) if n > 1 else []


def fit_alpha_beta(rows: list[dict], n: int) -> tuple[float, float]:
    """α (s per ring step) and β (s per byte) from all-reduce rows (``bytes``, ``time_s``) on
    ``n`` ranks: lesson 1's fit, t = 2(n−1)α + 2(n−1)/n·S·β; (0, 0) on one rank."""
    if n < 2 or len({r["bytes"] for r in rows}) < 2:
        return 0.0, 0.0
    a, b = alpha_beta_fit([r["bytes"] for r in rows], [r["time_s"] for r in rows])
    return max(a, 0.0) / (2 * (n - 1)), max(b, 0.0) / busbw_factor(n)


def group_alpha_beta(sizes: list[int], repeats: int = 5, device_type: str = "cpu") -> tuple[float, float]:
    """α and β of the running group, on every rank (:func:`group_allreduce_times`, :func:`fit_alpha_beta`)."""
    n = dist.get_world_size() if dist.is_initialized() else 1
    return fit_alpha_beta(group_allreduce_times(sizes, repeats, device_type), n)


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
        return {"backend": "nccl", "ranks": ranks, "results": queue.get(timeout=10)}
    from .testing import run_in_group

    per_rank = run_in_group(_allreduce_sweep, ranks, sizes, repeats, "cpu")
    return {"backend": "gloo", "ranks": ranks, "results": per_rank[0]}


def lesson_advice(info: dict[str, Any], lessons) -> list[dict[str, Any]]:
    """Which lessons' experiments can run on GPUs here (one rank per GPU), and which on CPU."""
    n_gpus = len(info["gpus"])
    advice = []
    for lesson in lessons:
        ranks = lesson.ranks
        if n_gpus >= ranks:
            where, how = "gpu", f"distai run {lesson.id} --gpus {ranks}  (NCCL, one rank per GPU)"
        elif n_gpus >= 1:
            where, how = "cpu", (f"distai run {lesson.id} --cpu {ranks}  (needs {ranks} GPUs, this machine "
                                 f"has {n_gpus}; gloo on CPU processes)")
        else:
            where, how = "cpu", f"distai run {lesson.id} --cpu {ranks}  (no CUDA: gloo on CPU processes)"
        advice.append({"lesson": lesson.id, "ranks": ranks, "runs_on": where, "command": how})
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
