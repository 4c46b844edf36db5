"""The all-reduce lesson 1's visualizer plays back: every step's messages and what each rank holds.

A :class:`Plan` is an all-reduce laid out for drawing: per step the messages (:class:`Send`),
and per frame (frame k = after k steps) the contributions each chunk of each rank holds and the
bytes each rank has sent and received. :func:`model_plan` builds it from the pure models
(``ring_model.py`` for the ring, ``baselines.py`` for the tree and the naive all-reduce);
:func:`recorded_plan` from a real run's traced call (``ring_run.py``), checked message by message
against the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from . import baselines, ring_model
from .ring_run import RecordedCall

RING, TREE, NAIVE = "ring", "tree", "naive"
ALGORITHMS = (RING, TREE, NAIVE)


@dataclass(frozen=True)
class Send:
    """One message of a step: ``src`` → ``dst``, the chunks it carries, add or overwrite, bytes."""

    src: int
    dst: int
    chunks: tuple[int, ...]
    reduce: bool
    nbytes: float


@dataclass
class Plan:
    """Everything the drawing needs, per step and per frame (frame k = after k steps).

    ``sent``/``recv`` are cumulative per rank, in bytes (simulated plans: in units of S, scaled at
    drawing time). ``ready`` is how many steps are known (a live run may still be sending).
    """

    algorithm: str
    n: int
    total: int  # steps the algorithm takes
    phases: list[str]
    sends: list[list[Send]]
    counts: list[tuple[tuple[int, ...], ...]]
    sent: list[tuple[float, ...]]
    recv: list[tuple[float, ...]]
    whole_buffer: bool
    missing: list[list[int]] = field(default_factory=list)  # per step: ranks not heard from yet
    mismatches: int = 0

    @property
    def ready(self) -> int:
        return len(self.counts) - 1

    def receivers(self, step: int) -> dict[int, Send]:
        return {s.dst: s for s in self.sends[step]}

    def senders(self, step: int) -> dict[int, Send]:
        return {s.src: s for s in self.sends[step]}


def fold_sends(n: int, sends: list[list[Send]]):
    holds = [[frozenset({r})] * n for r in range(n)]
    counts = [tuple(tuple(len(h) for h in row) for row in holds)]
    sent = [tuple([0.0] * n)]
    recv = [tuple([0.0] * n)]
    for step in sends:
        payloads = [[holds[s.src][c] for c in s.chunks] for s in step]  # all send, then all receive
        out, got = list(sent[-1]), list(recv[-1])
        for s, payload in zip(step, payloads):
            for c, p in zip(s.chunks, payload):
                holds[s.dst][c] = holds[s.dst][c] | p if s.reduce else p
            out[s.src] += s.nbytes
            got[s.dst] += s.nbytes
        counts.append(tuple(tuple(len(h) for h in row) for row in holds))
        sent.append(tuple(out))
        recv.append(tuple(got))
    return counts, sent, recv


@lru_cache(maxsize=64)
def model_plan(algorithm: str, n: int) -> Plan:
    """The simulated plan of ``algorithm`` on ``n`` ranks (bytes in units of the buffer size S)."""
    if algorithm == RING:
        sends = [[Send(t.src, t.dst, (t.chunk,), t.reduce, 1.0 / n) for t in step]
                 for step in ring_model.schedule(n)]
        phases = [ring_model.phase_of(k, n)[0] for k in range(len(sends))]
    else:
        sched = baselines.schedule(algorithm, n)
        every = tuple(range(n))
        sends = [[Send(m.src, m.dst, every, m.reduce, 1.0) for m in step] for step in sched]
        phases = [step[0].phase for step in sched]
    counts, sent, recv = fold_sends(n, sends)
    return Plan(algorithm, n, len(sends), phases, sends, counts, sent, recv, algorithm != RING,
                missing=[[] for _ in sends])


def recorded_plan(rec: RecordedCall) -> Plan:
    """The plan of a run's traced call: its ranks' own messages, as far as they have arrived
    (``Plan.ready``), with the ranks not heard from yet and the messages that differ from the model."""
    n = rec.n
    sends: list[list[Send]] = []
    phases: list[str] = []
    missing: list[list[int]] = []
    mismatches = 0
    for step in range(rec.total):
        phase = ring_model.phase_of(step, n)[0]
        phases.append(phase)
        row = {r: e for r in range(n) if (e := rec.events.get((step, r))) is not None}
        gone = [r for r in range(n) if r not in row]
        missing.append(gone)
        if gone:
            break
        step_sends = []
        for r, e in row.items():
            chunk, dst = int(e.get("chunk", -1)), int(e.get("to", -1))
            if (chunk != ring_model.send_chunk(r, step, n) or dst != ring_model.right(r, n)
                    or int(e.get("recv_chunk", -1)) != ring_model.recv_chunk(r, step, n)):
                mismatches += 1
            if not (0 <= chunk < n and 0 <= dst < n):
                continue
            step_sends.append(Send(r, dst, (chunk,), e.get("phase", phase) == ring_model.REDUCE_SCATTER,
                                   float(e.get("bytes", 0))))
        sends.append(step_sends)
    phases += [ring_model.phase_of(k, n)[0] for k in range(len(phases), rec.total)]
    missing += [list(range(n)) for _ in range(len(missing), rec.total)]
    counts, sent, recv = fold_sends(n, sends)
    return Plan(RING, n, rec.total, phases, sends + [[] for _ in range(rec.total - len(sends))],
                counts, sent, recv, False, missing=missing, mismatches=mismatches)
