"""Run a function on N gloo processes in one process group: the tests' shared harness.

Start the group once and run several checks inside it (``run_in_group(check_all, 4)``
returning a dict of results), rather than one launch per assertion: each launch costs
seconds of torch import on a 2-core machine.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, out_dir: str,
            timeout_s: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), DISTAI_DEVICE="cpu")
    import torch

    torch.set_num_threads(1)  # N ranks share 2 cores in CI
    # a rank that never returns can be asked where it is stuck: run_in_group sends SIGUSR1
    stacks = open(Path(out_dir) / f"{rank}.stack", "w")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    outcome: tuple[str, Any]
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        outcome = ("ok", fn(rank, world_size, *args))
    except BaseException:  # noqa: BLE001 - shipped to the parent with its traceback
        outcome = ("error", traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(Path(out_dir) / f"{rank}.pkl", "wb") as f:
        pickle.dump(outcome, f)


def _start_method() -> str:
    """A fork server that imported torch once, so each rank starts in milliseconds rather than
    re-importing torch (seconds on 2 cores); plain spawn where fork servers are unavailable."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    # torch._dynamo: the first optimizer a process builds imports it (seconds per rank otherwise)
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo",
                                            "distai.engine.testing"])
    return "forkserver"


def run_in_group(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120,
                 stuck_after_s: float | None = None) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes (started by
    :func:`_start_method`'s); returns each rank's result.

    ``fn`` must be importable (defined at module level). A failure on any rank raises with
    that rank's traceback. Once one rank has exited, the others get ``stuck_after_s`` (by default
    the group's collective timeout plus a minute) to follow; a rank still running then is stuck,
    and the call raises with its Python stacks instead of stalling the suite.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_worker, args=(world_size, free_port(), fn, args, out_dir, timeout_s),
                                     nprocs=world_size, join=False, start_method=_start_method())
        _join_or_raise_stuck(context, out_dir, grace_s=timeout_s + 60 if stuck_after_s is None else stuck_after_s)
        results = []
        for rank in range(world_size):
            status, value = pickle.loads((Path(out_dir) / f"{rank}.pkl").read_bytes())
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results.append(value)
        return results


def _join_or_raise_stuck(context: Any, out_dir: str, grace_s: float) -> None:
    """Join every rank (``context.join`` raises for one that died); if one rank has been gone
    ``grace_s`` seconds while another still runs, dump the survivors' stacks, kill them and raise."""
    first_exit: float | None = None
    while not context.join(timeout=1):
        if first_exit is None and any(not p.is_alive() for p in context.processes):
            first_exit = time.monotonic()
        failed = _failed_rank(context, out_dir)
        if failed is not None or (first_exit is not None and time.monotonic() - first_exit > grace_s):
            # a rank that failed leaves its peers waiting for it (a collective, a rendezvous): they are stuck
            # now, and its traceback says why (CI waited 120 s on a peer stuck in init_process_group)
            stuck = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
            for rank in stuck:
                os.kill(context.processes[rank].pid, signal.SIGUSR1)
            time.sleep(2)
            for rank in stuck:
                context.processes[rank].kill()
            stacks = "\n".join(f"rank {rank}:\n{(Path(out_dir) / f'{rank}.stack').read_text()}"
                                for rank in stuck)
            if failed is not None:
                rank, why = failed
                raise RuntimeError(f"rank {rank} failed:\n{why}\nrank(s) {stuck}, waiting for it, were at:\n{stacks}")
            raise RuntimeError(f"rank(s) {stuck} still running {grace_s:.0f} s after a peer exited:\n{stacks}")


def _failed_rank(context: Any, out_dir: str) -> tuple[int, str] | None:
    """(rank, traceback) of a rank that has exited with its failure written (:func:`_worker`), else None."""
    for rank, p in enumerate(context.processes):
        path = Path(out_dir) / f"{rank}.pkl"
        if not p.is_alive() and path.exists():
            try:
                status, value = pickle.loads(path.read_bytes())
            except (OSError, EOFError, pickle.UnpicklingError):
                continue  # being written
            if status != "ok":
                return rank, value
    return None
