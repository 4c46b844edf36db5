"""The ring all-reduce as a pure model: which chunk every rank sends and receives at every step.

N ranks sit on a ring; rank ``r`` sends only to its right neighbour ``(r + 1) % N`` and receives
only from its left neighbour ``(r - 1) % N``. Every rank's buffer is cut into N chunks (sizes
differ by at most one element when N does not divide the length, like ``numpy.array_split``).
The algorithm takes 2(N-1) steps (Patarasuk & Yuan, JPDC 2009):

* **reduce-scatter**, steps ``s = 0 … N-2``: rank ``r`` sends chunk ``(r - s) % N`` and receives
  chunk ``(r - s - 1) % N``, which it **adds** into its own copy. After N-1 steps rank ``r``
  holds the complete sum of chunk ``(r + 1) % N`` (:func:`owned_chunk`).
* **all-gather**, steps ``s = 0 … N-2`` (global step ``N-1+s``): rank ``r`` sends chunk
  ``(r + 1 - s) % N`` and receives chunk ``(r - s) % N``, which it **copies** over its own.

At every step the chunk a rank sends is the one it received the step before, so the whole
algorithm is a stream of chunks moving one hop right per step; the engine's ring
(``distai.engine.ring``) walks this very schedule, and the lesson-1 visualizer animates it.
Each rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N·S in all, the bandwidth-optimal amount.

No torch here, and no I/O: :func:`simulate` runs the schedule on numpy arrays.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"
PHASES = (REDUCE_SCATTER, ALL_GATHER)


@dataclass(frozen=True)
class Transfer:
    """One message of the ring: at ``step`` rank ``src`` sends ``chunk`` to rank ``dst``."""

    step: int  # global step, 0 … 2(N-1)-1
    phase: str  # REDUCE_SCATTER or ALL_GATHER
    phase_step: int  # step within the phase, 0 … N-2
    src: int
    dst: int
    chunk: int
    reduce: bool  # True: the receiver adds the chunk into its copy; False: it overwrites it


def _check(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"a ring needs at least one rank, got {n!r}")


def num_steps(n: int) -> int:
    """2(N-1): N-1 steps of reduce-scatter, then N-1 of all-gather."""
    _check(n)
    return 2 * (n - 1)


def right(rank: int, n: int) -> int:
    return (rank + 1) % n


def left(rank: int, n: int) -> int:
    return (rank - 1) % n


def phase_of(step: int, n: int) -> tuple[str, int]:
    """``(phase, step within the phase)`` of a global step."""
    if not 0 <= step < num_steps(n):
        raise ValueError(f"step {step} is outside 0 … {num_steps(n) - 1} for N={n}")
    return (REDUCE_SCATTER, step) if step < n - 1 else (ALL_GATHER, step - (n - 1))


def send_chunk(rank: int, step: int, n: int) -> int:
    """The chunk ``rank`` sends to its right neighbour at global ``step``."""
    phase, s = phase_of(step, n)
    return (rank - s) % n if phase == REDUCE_SCATTER else (rank + 1 - s) % n


def recv_chunk(rank: int, step: int, n: int) -> int:
    """The chunk ``rank`` receives from its left neighbour at global ``step``."""
    phase, s = phase_of(step, n)
    return (rank - s - 1) % n if phase == REDUCE_SCATTER else (rank - s) % n


def owned_chunk(rank: int, n: int) -> int:
    """The chunk whose complete sum ``rank`` holds after reduce-scatter."""
    _check(n)
    return (rank + 1) % n


def step_transfers(step: int, n: int) -> list[Transfer]:
    """The N messages of one step, one per sending rank (index = sender)."""
    phase, s = phase_of(step, n)
    return [
        Transfer(step=step, phase=phase, phase_step=s, src=r, dst=right(r, n),
                 chunk=send_chunk(r, step, n), reduce=phase == REDUCE_SCATTER)
        for r in range(n)
    ]


def schedule(n: int) -> list[list[Transfer]]:
    """Every step's transfers: ``schedule(n)[step][sender]``."""
    return [step_transfers(step, n) for step in range(num_steps(n))]


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of the N chunks of a ``length``-element buffer.

    The first ``length % n`` chunks get one element more, as ``numpy.array_split`` and
    ``torch.tensor_split`` do; chunks may be empty when ``length < n``.
    """
    _check(n)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    base, extra = divmod(length, n)
    bounds, start = [], 0
    for c in range(n):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def bytes_sent(size_bytes: float, n: int, steps_done: int | None = None) -> float:
    """Bytes one rank has sent after ``steps_done`` steps (default: all): steps·S/N.

    Counted with equal chunks of S/N; at the end this is 2(N-1)/N·S.
    """
    steps = num_steps(n) if steps_done is None else steps_done
    if not 0 <= steps <= num_steps(n):
        raise ValueError(f"steps_done must be within 0 … {num_steps(n)}")
    return steps * size_bytes / n


@dataclass(frozen=True)
class RingState:
    """Which ranks' contributions every chunk copy holds: ``holds[rank][chunk]`` is a frozenset.

    Before step 0 each copy holds only its own rank; a reduce adds the sender's set, a copy
    replaces it. After 2(N-1) steps every copy holds all N ranks.
    """

    n: int
    steps_done: int
    holds: tuple[tuple[frozenset[int], ...], ...]

    def count(self, rank: int, chunk: int) -> int:
        return len(self.holds[rank][chunk])

    @property
    def complete(self) -> bool:
        return all(len(h) == self.n for row in self.holds for h in row)


def states(n: int) -> Iterator[RingState]:
    """The ring's state before step 0 and after each of the 2(N-1) steps."""
    holds = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    yield RingState(n, 0, tuple(tuple(row) for row in holds))
    for step, transfers in enumerate(schedule(n)):
        sent = [holds[t.src][t.chunk] for t in transfers]  # everyone sends before anyone receives
        for t, payload in zip(transfers, sent):
            holds[t.dst][t.chunk] = holds[t.dst][t.chunk] | payload if t.reduce else payload
        yield RingState(n, step + 1, tuple(tuple(row) for row in holds))


def simulate(buffers: Sequence, steps: int | None = None) -> list:
    """Run the schedule on N equal-length numpy arrays (one per rank); returns new arrays.

    With ``steps`` given, stops after that many steps (to show a partial state).
    """
    import numpy as np

    n = len(buffers)
    _check(n)
    bufs = [np.array(b, copy=True).reshape(-1) for b in buffers]
    length = bufs[0].size
    if any(b.size != length for b in bufs):
        raise ValueError("every rank's buffer must have the same length")
    bounds = chunk_bounds(length, n)
    total = num_steps(n) if steps is None else steps
    for transfers in schedule(n)[:total]:
        payloads = [bufs[t.src][slice(*bounds[t.chunk])].copy() for t in transfers]
        for t, payload in zip(transfers, payloads):
            view = bufs[t.dst][slice(*bounds[t.chunk])]
            if t.reduce:
                view += payload
            else:
                view[...] = payload
    return [b.reshape(np.shape(buffers[0])) for b in bufs]
