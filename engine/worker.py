"""What every experiment process wraps its ``main`` in.

* An exception on a rank becomes an ``error`` event (with its traceback) and exit status 1, so
  the launcher can say which rank failed first and why; the process exits without running
  ``atexit`` hooks (a dead peer can make a process-group teardown hang).
* :func:`checkpoint` is a ``monitored_barrier`` between phases: when a rank does not arrive in
  time, rank 0's error names it ("Rank 2 failed to pass monitoredBarrier …"), which the
  launcher turns into "rank 2 did not arrive". It needs a gloo group; on NCCL runs a side gloo
  group is made once.

No signal handlers are installed: torchrun's SIGTERM (and the launcher's SIGKILL) must end a
rank even while it is blocked inside a collective.
"""
from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta

from .events import EventSink

BARRIER_TIMEOUT_ENV = "DISTAI_BARRIER_TIMEOUT_S"
_gloo_group = None


def run_experiment(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> None:
    """Run ``main(argv)`` and exit with its status; report an exception as an ``error`` event."""
    try:
        code = main(argv)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported, then the process ends
        rank = int(os.environ.get("RANK", "0"))
        tb = traceback.format_exc()
        try:
            sink = EventSink(rank)
            sink.emit("error", error=f"{type(exc).__name__}: {exc}"[:2000], traceback=tb[-6000:])
            sink.close()
        except OSError:
            pass
        sys.stderr.write(tb)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code or 0)


def barrier_group():
    """A gloo group for monitored barriers (the world group itself when it is gloo)."""
    global _gloo_group
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    if _gloo_group is None:
        _gloo_group = dist.new_group(backend="gloo")
    return _gloo_group


def checkpoint(name: str, timeout_s: float | None = None) -> None:
    """Every rank must reach ``name`` within ``timeout_s``; otherwise rank 0 names the missing ranks."""
    import torch.distributed as dist

    seconds = float(timeout_s if timeout_s is not None else os.environ.get(BARRIER_TIMEOUT_ENV, "60"))
    try:
        dist.monitored_barrier(group=barrier_group(), timeout=timedelta(seconds=seconds), wait_all_ranks=True)
    except RuntimeError as exc:
        raise RuntimeError(f"checkpoint {name!r}: {exc}") from None
