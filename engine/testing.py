"""Run a function on N gloo processes in one process group: the tests' shared harness.

Start the group once and run several checks inside it (``run_in_group(check_all, 4)``
returning a dict of results), rather than one launch per assertion: each launch costs
seconds of torch import on a 2-core machine.
"""
from __future__ import annotations

import os
import pickle
import socket
import tempfile
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


def run_in_group(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` gloo processes (started by
    :func:`_start_method`'s); returns each rank's result.

    ``fn`` must be importable (defined at module level). A failure on any rank raises with
    that rank's traceback.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_worker, args=(world_size, free_port(), fn, args, out_dir, timeout_s),
                           nprocs=world_size, join=True, start_method=_start_method())
        results = []
        for rank in range(world_size):
            status, value = pickle.loads((Path(out_dir) / f"{rank}.pkl").read_bytes())
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results.append(value)
        return results
