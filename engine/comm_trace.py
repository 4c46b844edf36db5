"""Time every collective an experiment issues, as ``span`` events on the ``comm`` stream.

``with traced_collectives(events, strategy="zero3"): train_step()`` wraps ``torch.distributed``'s
collective functions for the duration of the block: each call becomes one span named after the
operation and its payload (``all_gather 1.5 MiB``), from the call to the collective's completion:
the return of a blocking call, or, for ``async_op=True`` (FSDP2's all-gathers and
reduce-scatters, a bucketed all-reduce), the moment its ``Work``'s future completes. Libraries
that call through the ``torch.distributed`` module (FSDP2, DTensor's redistributions, the
engine's own ZeRO and tensor-parallel layers) are seen; collectives issued from C++ (DDP's
reducer) are not — lesson 6 times those with a DDP communication hook instead.

Spans are buffered and emitted when the block ends, so tracing costs the collectives a clock
read, not a write. The wrappers are removed on exit, even on an exception.
"""
from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist

from ..lessons.units import format_bytes
from .metering import _nbytes

# function name -> (what the span says, index of the argument whose size is the payload: the
# input, i.e. a shard for an all-gather and the full tensor for a reduce-scatter)
COLLECTIVES = {
    "all_reduce": ("all_reduce", 0),
    "all_gather_into_tensor": ("all_gather", 1),
    "all_gather_single": ("all_gather", 1),
    "all_gather": ("all_gather", 1),
    "reduce_scatter_tensor": ("reduce_scatter", 1),
    "reduce_scatter_single": ("reduce_scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "all_to_all_single": ("all_to_all", 1),
    "broadcast": ("broadcast", 0),
}


@contextmanager
def traced_collectives(events, stream: str = "comm", groups: dict | None = None, **fields) -> Iterator[list[dict]]:
    """Within the block, every collective is recorded; on exit each is emitted as a ``span``
    (with ``op``, ``bytes`` and ``fields``) on ``stream``, or on ``"comm NAME"`` when it ran on the
    process group ``groups[NAME]`` (the capstone's ``dp``, ``tp`` and ``pp`` groups: one track
    each). Yields the list of records (also when events are off)."""
    records: list[dict] = []
    names = {id(g): name for name, g in (groups or {}).items() if g is not None}
    lock = threading.Lock()  # async completions arrive on the backend's threads
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name, fn):
        op, index = COLLECTIVES[name]

        signature = inspect.signature(fn) if names else None

        def traced(*args, **kwargs):
            payload = args[index] if len(args) > index else None
            nbytes = _nbytes(payload) if payload is not None else 0
            on = stream
            if signature is not None:
                try:
                    group = signature.bind_partial(*args, **kwargs).arguments.get("group")
                except TypeError:
                    group = None
                on = f"comm {names[id(group)]}" if id(group) in names else stream
            rec = {"name": f"{op} {format_bytes(nbytes, binary=True)}", "op": op, "bytes": nbytes, "t0": time.time(), "t1": None,
                   "stream": on}
            work = fn(*args, **kwargs)
            if work is None or not kwargs.get("async_op", False):
                rec["t1"] = time.time()
            else:
                def done(_fut, rec=rec):
                    rec["t1"] = time.time()
                try:
                    work.get_future().add_done_callback(done)
                except (AttributeError, RuntimeError):  # a backend without futures: the launch only
                    rec["t1"] = time.time()
            with lock:
                records.append(rec)
            return work

        traced.__wrapped__ = fn
        return traced

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield records
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
        if events is not None and getattr(events, "enabled", False):
            with lock:
                finished = [r for r in records if r["t1"] is not None]
            for r in finished:
                events.emit("span", name=r["name"], stream=r["stream"], t0=r["t0"], t1=r["t1"], op=r["op"],
                            bytes=r["bytes"], **fields)


@contextmanager
def traced_step(events, name: str, groups: dict | None = None, **fields) -> Iterator[None]:
    """One training step as a ``compute`` span with its collectives as ``comm`` spans (per group
    with ``groups``; nothing at all when ``events`` is None or writes nowhere)."""
    if events is None or not getattr(events, "enabled", False):
        yield
        return
    with events.span(name, "compute", **fields), traced_collectives(events, groups=groups, **fields):
        yield
