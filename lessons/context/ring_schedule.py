"""Which attention tiles each rank computes at each step of ring attention: the schedule that the
engine runs (:mod:`distai.engine.context_parallel`), the visualizer draws and the formulas count.

The sequence of ``s`` tokens is cut into equal chunks. ``contiguous``: ``cp`` chunks, rank ``i``
holds chunk ``i``. ``zigzag`` (load-balanced; Megatron-LM's context parallelism, Llama 3 §3.3.2):
``2·cp`` chunks, rank ``i`` holds chunks ``i`` and ``2·cp−1−i``, so every rank gets one early and
one late piece of the causal triangle. Each rank keeps its queries; at ring step ``t`` it holds the
keys and values of rank ``(i − t) mod cp`` (they travel to the right, one hop a step). A tile is a
(query chunk, key chunk) pair: ``full`` when every query comes after every key, ``diagonal`` when
they are the same chunk (the causal mask cuts it in half), ``skip`` when every key is in the future.

Pure Python.
"""
from __future__ import annotations

from ..model_size import explain, explain_texts, refusals
from ..strings import TranslatedError

LAYOUTS = ("zigzag", "contiguous")
VARIANTS = ("ring", "allgather")
FULL, DIAGONAL, SKIP = "full", "diagonal", "skip"


class LayoutError(TranslatedError):
    """A sequence that cannot be split as asked (one line for the learner, in every language where it
    comes from the course's shape check)."""


def check_layout(seq: int, cp: int, layout: str) -> None:
    """Raise :class:`LayoutError` unless ``seq`` tokens split into the layout's equal chunks."""
    if layout not in LAYOUTS:
        raise LayoutError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if cp < 1:
        raise LayoutError(f"the context-parallel size must be at least 1, not {cp}")
    found = refusals(cp=cp, zigzag=layout == "zigzag", seq=seq)  # the course's one shape check
    if found:
        raise LayoutError(explain(found), texts=explain_texts(found))


def num_chunks(cp: int, layout: str) -> int:
    """Chunks the sequence is cut into: ``2·cp`` (zigzag) or ``cp`` (contiguous)."""
    return 2 * cp if layout == "zigzag" else cp


def rank_chunks(rank: int, cp: int, layout: str) -> tuple[int, ...]:
    """The chunks rank ``rank`` holds, in the order its shard stores them."""
    return (rank, 2 * cp - 1 - rank) if layout == "zigzag" else (rank,)


def positions(rank: int, seq: int, cp: int, layout: str) -> list[int]:
    """The absolute positions of the tokens rank ``rank`` holds, in its shard's order."""
    check_layout(seq, cp, layout)
    c = seq // num_chunks(cp, layout)
    return [p for chunk in rank_chunks(rank, cp, layout) for p in range(chunk * c, (chunk + 1) * c)]


def owner(rank: int, step: int, cp: int) -> int:
    """Whose keys and values rank ``rank`` holds at ring step ``step``."""
    return (rank - step) % cp


def tile_kind(q_chunk: int, k_chunk: int) -> str:
    if q_chunk > k_chunk:
        return FULL
    return DIAGONAL if q_chunk == k_chunk else SKIP


def step_tiles(rank: int, step: int, cp: int, layout: str) -> list[tuple[int, int, str]]:
    """``(query chunk, key chunk, kind)`` of every tile rank ``rank`` meets at ring step ``step``."""
    keys = rank_chunks(owner(rank, step, cp), cp, layout)
    return [(q, k, tile_kind(q, k)) for q in rank_chunks(rank, cp, layout) for k in keys]


def tile_scores(kind: str, chunk: int) -> int:
    """Query-key pairs the causal mask lets through in one tile of ``chunk`` × ``chunk`` tokens."""
    return {FULL: chunk * chunk, DIAGONAL: chunk * (chunk + 1) // 2, SKIP: 0}[kind]


def work_per_step(seq: int, cp: int, layout: str) -> list[list[int]]:
    """``[rank][step]``: the causal query-key pairs (per head and sequence) each rank computes at
    each ring step; a rank with 0 waits for the step's slowest rank."""
    check_layout(seq, cp, layout)
    c = seq // num_chunks(cp, layout)
    return [[sum(tile_scores(kind, c) for _, _, kind in step_tiles(r, t, cp, layout)) for t in range(cp)]
            for r in range(cp)]


def idle_fraction(seq: int, cp: int, layout: str) -> float:
    """The share of the ranks' time spent waiting: each step lasts as long as its busiest rank.

    Counted from the schedule's tiles without listing them (``calc context --cp 65536`` never ended listing
    cp² of them; the tests check the count against :func:`work_per_step`'s list): contiguous, step 0 is every
    rank's diagonal tile and step t ≥ 1 a full tile on ranks t … cp−1 (the others' keys are in the future),
    rank cp−1 the busiest; zigzag, step 0 is two diagonal tiles and a full one on every rank and each later
    step two full tiles on every rank, so no rank waits."""
    check_layout(seq, cp, layout)
    c = seq // num_chunks(cp, layout)
    if layout == "zigzag":
        return 0.0
    diagonal, full = tile_scores(DIAGONAL, c), tile_scores(FULL, c)
    done = cp * diagonal + full * cp * (cp - 1) // 2
    busiest = diagonal + (cp - 1) * full
    return 1.0 - done / (cp * busiest) if busiest else 0.0
