"""Structured events from every rank: one JSON object per line, appended to the run's folder.

The launcher sets ``DISTAI_EVENTS_DIR``; each rank appends to ``rank{R}.jsonl`` there and the
launcher tails those files live. Outside a launch (tests, a plain ``python`` call) events go
nowhere unless a directory is given. Each line is written with one ``os.write`` on an
``O_APPEND`` descriptor, so a killed rank leaves whole lines only (a torn last line is skipped
by readers), and emitting costs a syscall, not a flush of Python buffers.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeGuard

from ..lessons.events import SPAN

#: a rank's exit status when it could not join its process group in time (runtime.join_deadline), which the
#: launcher's failure analysis names as such
JOIN_FAILED_EXIT = 3

EVENTS_DIR_ENV = "DISTAI_EVENTS_DIR"
#: "1": every event is checked against its declaration (lessons/events.py) before it is written
CHECK_EVENTS_ENV = "DISTAI_CHECK_EVENTS"


def backend_for(device_type: str) -> str:
    """The process group's backend on ``device_type``'s ranks: NCCL on GPUs, gloo on CPU processes
    (what ``runtime.init_distributed`` joins, and what the launcher's ``run_start`` announces)."""
    return "nccl" if device_type == "cuda" else "gloo"


class EventSink:
    def __init__(self, rank: int = 0, directory: str | os.PathLike | None = None):
        self.rank = rank
        self.check_events = os.environ.get(CHECK_EVENTS_ENV) == "1"
        directory = directory if directory is not None else os.environ.get(EVENTS_DIR_ENV)
        self._fd: int | None = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            path = Path(directory) / f"rank{rank}.jsonl"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def emit(self, kind: str, **fields: Any) -> None:
        """Record one event; ``t`` (wall-clock seconds) and ``rank`` are added. Experiments emit
        through the kind's declaration (``KIND.emit(sink, {...})``, ``lessons/events.py``)."""
        if self._fd is None:
            return
        record = {"kind": kind, "t": time.time(), "rank": self.rank, **fields}
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    @contextmanager
    def span(self, name: str, stream: str = "compute", **fields: Any) -> Iterator[None]:
        """Time the ``with`` body as one ``span`` event (``t0``/``t1`` wall-clock seconds) on
        ``stream`` (``compute``, ``comm``, ``io``…): what ``distai runs export --format
        chrome-trace`` draws as one complete event on that stream's track."""
        if self._fd is None:
            yield
            return
        t0 = time.time()
        try:
            yield
        finally:
            SPAN.emit_fields(self, {"name": name, "stream": stream, "t0": t0, "t1": time.time(), **fields})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def is_number(x: object) -> TypeGuard[float]:
    """A JSON number as Python reads it: an int or a float, not a bool (``True`` is an int to Python)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def time_span(events: Iterable[dict]) -> tuple[float, float] | None:
    """The first and the last time the events carry (None when none does): a run's span where its record
    lacks it (a killed launcher's, a damaged record's)."""
    times = [e["t"] for e in events if is_number(e.get("t"))]
    return (min(times), max(times)) if times else None


def _bounded_int(text: str) -> int:
    value = int(text)
    if abs(value) >= 1 << 63:  # no count a run writes; past a float's range, readers' arithmetic would overflow
        raise ValueError(text)
    return value


def parse_event(line: bytes) -> dict | None:
    """One line of a rank's events file as its event, or None when it is no event a run writes: not UTF-8
    JSON, JSON that is not an object (``5``, ``null``: a file damaged by hand or by the disk), a time that is
    not a finite number, or a whole number past 2⁶³. (A NaN loss or an inf loss scale is a run's own: the
    sink writes them as JSON's NaN and Infinity; readers of such fields cope, :func:`feed_readable`.)"""
    try:
        event = json.loads(line, parse_int=_bounded_int)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, a whole number no run writes
        return None
    t = event.get("t") if isinstance(event, dict) else None
    if isinstance(event, dict) and (t is None or is_number(t) and math.isfinite(t)):  # json reads NaN too
        return event  # every reader orders events by a time that is a number
    return None


def read_events(path: str | os.PathLike) -> Iterator[dict]:
    """Every complete event in one rank's file (:func:`parse_event`); a torn last line is left out."""
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            event = parse_event(line)
            if event is not None:
                yield event
