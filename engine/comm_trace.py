"""A training step and its collectives on the run's trace: ``span`` events on the ``comm`` stream.

``with traced_step(events, "step 3", step=3): train_step()`` emits the step as one ``compute``
span and, from the records of a :class:`~distai.engine.metering.CommMeter` around it, each
collective as a ``comm`` span named after the operation and what this rank puts in
(``all_gather 1.5 MiB``), from its issue to its completion (for ``async_op=True`` — FSDP2's
all-gathers and reduce-scatters, a bucketed all-reduce — when its ``Work`` completes). The meter
sees whatever reaches the c10d dispatcher, so DDP's reducer's all-reduces are timed too.
Point-to-point messages are left to the pipeline, which names them after its plan.

:func:`trace_causes` draws a timed region the way a lesson's check decomposes it (issue 28), on
four tracks that tile each of its blocks (a step, a prefill) from the first rank's start to the
last rank's end: ``compute`` (this rank's block outside its collectives), ``wait`` (inside a
collective, until the last rank of the group arrived: the check's ``peer_wait``), ``comm`` (the
rest of the collective) and ``idle`` (before this rank's block began or after it ended, while
a peer was still in its own: what the slowest rank's wall time holds and this rank's does not).
The lessons reach it three ways: with the check's own figures (lesson 4's steps, lesson 7's
prefill and decode steps: a :class:`~distai.engine.time_causes.Window`'s blocks, the
collectives' spans and ``peer_wait`` of ``collective_causes``; lesson 6's exposed communication);
through ``traced_step(check=...)``, the waits measured here per process group (lesson 2's and
the capstone's metered step, the pipeline's receives with it); through :func:`trace_call`, one
more call of what the check timed, its steps reported to a sink (lesson 1's ring).

Spans are emitted when the step ends (a collective still in flight then is left out). The meter
is a dispatch mode: every operation of a step traced with ``collectives=True`` passes through
Python (some µs each), so an experiment draws the collectives of the step it meters anyway and
times the others (``collectives=False``: the step's span alone, at the cost of two clock reads).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from ..lessons.events import SPAN
from ..lessons.units import format_bytes
from .metering import CommMeter, CommRecord
from .time_causes import Window
from .trace_export import uncovered

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
                meter: CommMeter | None = None, check: str | None = None, **fields) -> Iterator[list]:
    """One training step as a ``compute`` span with, when ``collectives``, its collectives as
    ``comm`` spans (per group with ``groups``); nothing at all, and no meter, when ``events`` is
    None or writes nowhere. ``meter``: one the caller runs around the step anyway; the spans come
    from the records it gains in the block (a second meter would route every op through Python
    twice). ``check``: the step also drawn as :func:`trace_causes` does, for that check, each
    collective's wait for the last rank of its group measured here (:func:`peer_waits`; every
    rank passes the same ``check``, and a step that raised draws nothing); the block adds to the
    list it is given its waits on a peer's message (``(t0, t1)``: a pipeline's receives)."""
    waits: list[tuple[float, float]] = []  # the block adds its point-to-point waits (drawn with ``check``)
    if events is None or not getattr(events, "enabled", False):
        yield waits
        return
    if not collectives:
        with events.span(name, "compute", **fields):
            yield waits
        return
    own = meter is None
    step_meter = CommMeter() if meter is None else meter
    first = len(step_meter.records)
    with events.span(name, "compute", **fields):
        t0 = time.time()
        try:
            with step_meter if own else nullcontext():
                yield waits
        finally:
            t1 = time.time()
            for span in comm_spans(step_meter.records[first:], groups=groups):
                SPAN.emit_fields(events, {**span, **fields})
    if check is not None:
        _draw_step(events, (t0, t1), step_meter.records[first:], groups, waits, check=check, **fields)


def _draw_step(events, bounds: tuple[float, float], records: list[CommRecord], groups: dict | None,
               p2p: list[tuple[float, float]], **fields) -> None:
    """A traced step's compute, waits, collectives and idle time (:func:`trace_causes`); ``p2p``:
    its waits on a peer's message, each a wait from end to end."""
    ordered = [g for g in (groups or {}).values() if g is not None]
    named = {str(g.group_name): g for g in ordered}
    done = [r for r in records if r.op in COLLECTIVES]
    waits = peer_waits([r.t0 for r in done], [named.get(r.group) if groups else None for r in done],
                       ordered if groups else [None])
    drawn = sorted([(r.t0, r.t0 if r.t1 is None else r.t1, w, r.op) for r, w in zip(done, waits)]
                   + [(a, b, b - a, "recv") for a, b in p2p])
    trace_causes(events, [bounds], [d[:2] for d in drawn], [d[2] for d in drawn], names=[d[3] for d in drawn],
                 **fields)


def _everyone(mine: Any, group: Any = None) -> list[Any]:
    if not (dist.is_initialized() and dist.get_world_size(group) > 1):
        return [mine]
    out: list[Any] = [None] * dist.get_world_size(group)
    with _disable_current_modes():  # a meter still open around the step does not count the trace's gathers
        dist.all_gather_object(out, mine, group=group)
    return out


def peer_waits(entries: Sequence[float], groups: Sequence[Any], order: Sequence[Any] = (None,)) -> list[float]:
    """How long this rank waited in each collective it entered at ``entries[i]`` (wall-clock
    seconds) for the last rank of its process group ``groups[i]`` to enter it —
    ``time_causes.collective_causes``' ``peer_wait``: for each group of ``order`` (None: the world;
    the same order on every rank, each rank calling with its own groups), the entries on it
    gathered among its ranks; 0 where its ranks entered different numbers of collectives."""
    waits = [0.0] * len(entries)
    for g in order:
        idx = [i for i, o in enumerate(groups) if o is g]
        everyone = _everyone([entries[i] for i in idx], g)
        if all(len(o) == len(idx) for o in everyone):
            for j, i in enumerate(idx):
                waits[i] = max(o[j] for o in everyone) - entries[i]
    return waits


def trace_causes(events, blocks: Sequence[tuple[float, float]], spans: Sequence[Sequence[float]],
                 peer_wait: Sequence[float] | None = None, names: str | Sequence[str] = "collective",
                 group: Any = None, **fields) -> None:
    """Draw ``blocks`` (this rank's timed blocks, wall-clock seconds: a
    :class:`~distai.engine.time_causes.Window`'s ``blocks``) on the run's trace as ``compute``,
    ``wait``, ``comm`` and ``idle`` spans (the module's doc); ``spans``: the collectives this rank
    entered and left (``spans[i][:2]``), ``peer_wait[i]`` how long it waited in each for the last
    peer — the figures the check reports (``time_causes.collective_causes``); None: measured here
    the same way, from every rank's entry times. ``names``: each collective's name, or one for all (``all_reduce``).
    Every rank of ``group`` calls it with the same number of blocks and collectives (it gathers
    their bounds); nothing is gathered or emitted when ``events`` writes nowhere. ``fields`` go
    on every span (``check="tp_step_time"``: the check it draws)."""
    if events is None or not getattr(events, "enabled", False):
        return
    mine = ([tuple(b) for b in blocks], [(float(s[0]), float(s[1])) for s in spans])
    everyone = _everyone(mine[0], group)
    if peer_wait is None:
        peer_wait = peer_waits([a for a, _ in mine[1]], [group] * len(mine[1]), [group])
    for k in range(min(len(o) for o in everyone)):
        t0, t1 = mine[0][k]
        start, end = min(o[k][0] for o in everyone), max(o[k][1] for o in everyone)
        parts = [("idle", "idle", a, b) for a, b in uncovered(start, end, [(t0, t1)])]
        held, at = [], t0  # the collectives one after the other (asynchronous ones may overlap)
        for i, (a, b) in enumerate(mine[1]):
            if t0 <= a <= t1:
                a = max(a, at)
                at = max(a, min(b, t1))
                waited = max(a, min(at, mine[1][i][0] + max(0.0, peer_wait[i])))
                op = names if isinstance(names, str) else names[i]
                parts += [("wait", f"wait for the last peer ({op})", a, waited), ("comm", op, waited, at)]
                held.append((a, at))
        parts += [("compute", "compute", a, b) for a, b in uncovered(t0, t1, held)]
        for stream, name, a, b in parts:
            if b > a:
                SPAN.emit_fields(events, {"name": name, "stream": stream, "t0": a, "t1": b, "block": k, **fields})


class _StepClock:
    """A sink that keeps, for each event that says when it began (``t0``), its bounds: from
    ``t0`` to when it is reported (a traced ring's steps, ``ring.ring_allreduce(trace=...)``)."""
    enabled = True

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []

    def emit(self, kind: str, **fields: Any) -> None:
        if isinstance(fields.get("t0"), (int, float)):
            self.spans.append((float(fields["t0"]), time.time()))


def trace_call(events, call: Callable[..., Any], names: str = "ring step", **fields) -> None:
    """Run ``call(sink)`` once more, timed, and draw it as :func:`trace_causes` does: each step it
    reports to ``sink`` (``t0`` to its report) a collective whose wait for the last rank is
    measured from every rank's step starts. Every rank calls it; nothing runs when ``events``
    writes nowhere."""
    if events is None or not getattr(events, "enabled", False):
        return
    steps, window = _StepClock(), Window()
    with window:
        call(steps)
    trace_causes(events, window.blocks, steps.spans, None, names=names, **fields)
