"""A training step and its collectives on the run's trace: ``span`` events on the ``comm`` stream.

``with traced_step(events, "step 3", step=3): train_step()`` emits the step as one ``compute``
span and, from the records of a :class:`~distai.engine.metering.CommMeter` around it, each
collective as a ``comm`` span named after the operation and what this rank puts in
(``all_gather 1.5 MiB``), from its issue to its completion (for ``async_op=True`` — FSDP2's
all-gathers and reduce-scatters, a bucketed all-reduce — when its ``Work`` completes). The meter
sees whatever reaches the c10d dispatcher, so DDP's reducer's all-reduces are timed too.
Point-to-point messages are left to the pipeline, which names them after its plan.

Spans are emitted when the step ends (a collective still in flight then is left out). The meter
is a dispatch mode: every operation of a step traced with ``collectives=True`` passes through
Python (some µs each), so an experiment draws the collectives of the step it meters anyway and
times the others (``collectives=False``: the step's span alone, at the cost of two clock reads).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext

from ..lessons.events import SPAN
from ..lessons.units import format_bytes
from .metering import CommMeter, CommRecord

#: the operations drawn as spans (torch.distributed's names)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def comm_spans(records: Iterable[CommRecord], stream: str = "comm", groups: dict | None = None) -> list[dict]:
    """The completed collectives among ``records`` as span fields, on ``stream`` or on
    ``"comm NAME"`` when they ran on the process group ``groups[NAME]`` (the capstone's ``dp``,
    ``tp`` and ``pp`` groups: one track each)."""
    names = {str(g.group_name): name for name, g in (groups or {}).items() if g is not None}
    return [{"name": f"{r.op} {format_bytes(r.input_bytes, binary=True)}",
             "stream": f"comm {names[r.group]}" if r.group in names else stream,
             "t0": r.t0, "t1": r.t1, "op": r.op, "bytes": r.input_bytes}
            for r in list(records) if r.op in COLLECTIVES and r.t1 is not None]


@contextmanager
def traced_step(events, name: str, groups: dict | None = None, collectives: bool = True,
                meter: CommMeter | None = None, **fields) -> Iterator[None]:
    """One training step as a ``compute`` span with, when ``collectives``, its collectives as
    ``comm`` spans (per group with ``groups``); nothing at all, and no meter, when ``events`` is
    None or writes nowhere. ``meter``: one the caller runs around the step anyway; the spans come
    from the records it gains in the block (a second meter would route every op through Python
    twice)."""
    if events is None or not getattr(events, "enabled", False):
        yield
        return
    if not collectives:
        with events.span(name, "compute", **fields):
            yield
        return
    own = meter is None
    step_meter = CommMeter() if meter is None else meter
    first = len(step_meter.records)
    with events.span(name, "compute", **fields):
        try:
            with step_meter if own else nullcontext():
                yield
        finally:
            for span in comm_spans(step_meter.records[first:], groups=groups):
                SPAN.emit_fields(events, {**span, **fields})
