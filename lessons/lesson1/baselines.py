"""The all-reduces the ring is compared with, as pure models: naive reduce + broadcast, binomial tree.

Both move the **whole buffer** (S bytes) in every message, unlike the ring's S/N chunks. Each
model is a list of steps; a step is the messages sent at the same time (the alpha-beta model of
``distai.lessons.lesson1.formulas``: one full-duplex link per rank, a rank's messages are
serialised, so a step holds at most one send and one receive per rank).

* **naive** (``formulas.naive_allreduce_time``): steps ``0 … N-2`` reduce — rank ``k+1`` sends
  its buffer to rank 0, which adds it; steps ``N-1 … 2N-3`` broadcast — rank 0 sends the sum to
  rank ``k+1``. 2(N-1) steps, and rank 0's link carries (N-1)·S bytes each way.
* **tree** (``formulas.tree_allreduce_time``, binomial tree, Thakur et al. 2005 Sec. 4.2/4.6):
  reduce round ``k = 1 … ⌈log2 N⌉``: every rank ``r`` with ``r mod 2^k = 2^(k-1)`` sends its
  partial sum to ``r - 2^(k-1)``; broadcast round ``k = ⌈log2 N⌉ … 1``: every rank with
  ``r mod 2^k = 0`` sends the result to ``r + 2^(k-1)`` (when that rank exists).
  2⌈log2 N⌉ steps; rank 0 receives, then sends, ⌈log2 N⌉·S bytes.

:func:`holds_after` follows which ranks' contributions each rank's buffer holds, as
``ring_model.states`` does per chunk for the ring. No torch, no numpy, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass

NAIVE = "naive"
TREE = "tree"
REDUCE = "reduce"
BROADCAST = "broadcast"


@dataclass(frozen=True)
class Message:
    """At ``step`` rank ``src`` sends its whole buffer to ``dst``, who adds it (``reduce``) or keeps it."""

    step: int
    phase: str  # REDUCE or BROADCAST
    src: int
    dst: int
    reduce: bool


def _check(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"an all-reduce needs at least one rank, got {n!r}")


def naive_schedule(n: int) -> list[list[Message]]:
    """Reduce to rank 0 one buffer at a time, then broadcast one buffer at a time."""
    _check(n)
    steps = [[Message(k, REDUCE, k + 1, 0, True)] for k in range(n - 1)]
    steps += [[Message(n - 1 + k, BROADCAST, 0, k + 1, False)] for k in range(n - 1)]
    return steps


def tree_depth(n: int) -> int:
    """⌈log2 n⌉ rounds (0 for one rank)."""
    _check(n)
    return (n - 1).bit_length()


def tree_schedule(n: int) -> list[list[Message]]:
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast from rank 0."""
    depth = tree_depth(n)
    steps: list[list[Message]] = []
    for k in range(1, depth + 1):
        half = 1 << (k - 1)
        steps.append([Message(len(steps), REDUCE, r, r - half, True)
                      for r in range(n) if r % (1 << k) == half])
    for k in range(depth, 0, -1):
        half = 1 << (k - 1)
        steps.append([Message(len(steps), BROADCAST, r, r + half, False)
                      for r in range(n) if r % (1 << k) == 0 and r + half < n])
    return steps


def schedule(algorithm: str, n: int) -> list[list[Message]]:
    if algorithm == NAIVE:
        return naive_schedule(n)
    if algorithm == TREE:
        return tree_schedule(n)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose {NAIVE!r} or {TREE!r}")


def holds_after(algorithm: str, n: int) -> list[tuple[frozenset[int], ...]]:
    """Whose contributions each rank's buffer holds: before step 0, then after every step."""
    holds = [frozenset({r}) for r in range(n)]
    out = [tuple(holds)]
    for messages in schedule(algorithm, n):
        sent = [holds[m.src] for m in messages]  # everyone sends before anyone receives
        for m, payload in zip(messages, sent):
            holds[m.dst] = holds[m.dst] | payload if m.reduce else payload
        out.append(tuple(holds))
    return out


def link_bytes(algorithm: str, n: int, size_bytes: float) -> tuple[list[float], list[float]]:
    """Bytes each rank sends and receives over the whole all-reduce: ``(sent, received)``, index = rank."""
    sent, received = [0.0] * n, [0.0] * n
    for messages in schedule(algorithm, n):
        for m in messages:
            sent[m.src] += size_bytes
            received[m.dst] += size_bytes
    return sent, received
