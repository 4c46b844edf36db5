"""Ring all-reduce written from scratch on torch.distributed point-to-point operations.

The schedule is the lesson-1 model's (``distai.lessons.lesson1.ring_model``): N chunks,
N-1 steps of reduce-scatter (receive a chunk from the left neighbour, add it into your own
copy, forward it to the right) then N-1 steps of all-gather (receive a finished chunk, keep it,
forward it). Every rank sends 2(N-1)/N·S bytes, the bandwidth-optimal amount.

Pipelining: each chunk is cut into ``pieces`` sub-chunks. Since a rank forwards at step s+1
the chunk it received at step s, a piece is reduced and sent on as soon as it arrives, while
the rest of the chunk is still on the wire — the same trick gloo and NCCL use inside their own
ring. On gloo every message is an independent ``isend``/``irecv`` tagged by (step, piece);
NCCL runs one step at a time with the send and the receive of that step grouped in
``batch_isend_irecv`` (NCCL needs them launched together to avoid a deadlock).

With ``trace`` (an ``EventSink``) the ring emits one ``ring_step`` event per step::

    {"kind": "ring_step", "call": c, "phase": "reduce-scatter", "step": s, "of": 2(N-1),
     "chunk": sent chunk, "to": right rank, "recv_chunk": received chunk, "from": left rank,
     "bytes": bytes sent this step, "size": bytes of the whole buffer, "n": N}

so the tutor can animate a real run. Tracing is off unless asked for (it costs one write
per step, which the bandwidth sweep does not want in its timed iterations).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distai.lessons.lesson1 import ring_model as model

DEFAULT_PIECE_BYTES = 2 << 20  # aim for ~2 MiB sub-chunks (tuned with bench/ring_vs_allreduce.py)
MIN_PIPELINED_CHUNK = 512 << 10  # chunks at least this big go in >= 2 pieces
MAX_PIECES = 16

_scratch: dict[tuple, torch.Tensor] = {}


def _scratch_buffer(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A reusable receive buffer (page-faulting a fresh one every call costs real time)."""
    key = (dtype, str(device))
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _scratch[key] = buf
    return buf[:numel]


def choose_pieces(chunk_bytes: int, piece_bytes: int = DEFAULT_PIECE_BYTES) -> int:
    """How many sub-chunks to pipeline a chunk of ``chunk_bytes`` in."""
    pieces = max(1, min(MAX_PIECES, chunk_bytes // max(1, piece_bytes)))
    return max(pieces, 2) if chunk_bytes >= MIN_PIPELINED_CHUNK else pieces


def _group_info(group) -> tuple[int, int, Any]:
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    return rank, world, group


def _global(group, group_rank: int) -> int:
    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def ring_allreduce(tensor: torch.Tensor, op: str = "sum", group=None, *, pieces: int | None = None,
                   trace=None, call: int = 0) -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` with the ring; returns ``tensor``.

    ``op`` is ``"sum"`` or ``"avg"`` (the average divides each finished chunk once, by N,
    before the all-gather spreads it). ``pieces`` sub-chunks per chunk are pipelined
    (default: about 2 MiB each, at least 2 for chunks of 512 KiB or more, at most 16). ``trace``: an ``EventSink`` to receive one
    ``ring_step`` event per step; ``call`` numbers the all-reduce in those events.
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError("op='avg' needs a floating-point tensor")
    rank, n, group = _group_info(group)
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    bounds = model.chunk_bounds(flat.numel(), n)
    elem = flat.element_size()
    if pieces is None:
        pieces = choose_pieces(((flat.numel() + n - 1) // n) * elem)
    pieces = max(1, int(pieces))
    backend = dist.get_backend(group)
    if backend == "nccl":
        _ring_grouped(flat, bounds, rank, n, group, op, trace, call)
    else:
        _ring_pipelined(flat, bounds, rank, n, group, op, pieces, trace, call)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def _piece_bounds(bounds, pieces):
    """``[chunk][piece] -> (start, stop)`` in the flat buffer."""
    out = []
    for a, b in bounds:
        out.append([(a + p, a + q) for p, q in model.chunk_bounds(b - a, pieces)])
    return out


def _emit_step(trace, call, rank, n, step, bounds, elem, total_bytes):
    phase, _ = model.phase_of(step, n)
    sent = model.send_chunk(rank, step, n)
    a, b = bounds[sent]
    trace.emit("ring_step", call=call, phase=phase, step=step, of=model.num_steps(n), n=n,
               chunk=sent, to=model.right(rank, n), recv_chunk=model.recv_chunk(rank, step, n),
               **{"from": model.left(rank, n)}, bytes=(b - a) * elem, size=total_bytes)


def _ring_pipelined(flat, bounds, rank, n, group, op, pieces, trace, call):
    """Gloo (and other backends with independent async point-to-point): pipelined pieces."""
    steps = model.num_steps(n)
    rs_steps = n - 1
    pb = _piece_bounds(bounds, pieces)
    max_piece = max((q - p) for chunk in pb for p, q in chunk)
    scratch = _scratch_buffer(2 * pieces * max_piece, flat.dtype, flat.device)
    right_g, left_g = _global(group, model.right(rank, n)), _global(group, model.left(rank, n))
    elem, total_bytes = flat.element_size(), flat.numel() * flat.element_size()
    # (chunk, piece) -> sends still reading that memory. Each gloo send is waited exactly
    # once: a second wait() on the same send blocks until the collective timeout.
    outstanding: dict[tuple[int, int], list] = {}

    def piece(chunk: int, j: int) -> torch.Tensor:
        p, q = pb[chunk][j]
        return flat[p:q]

    def post_send(step: int, j: int) -> None:
        c = model.send_chunk(rank, step, n)
        src = piece(c, j)
        if src.numel() == 0:
            return
        work = dist.isend(src, dst=right_g, group=group, tag=step * pieces + j)
        outstanding.setdefault((c, j), []).append(work)

    def post_recv(step: int, j: int):
        c = model.recv_chunk(rank, step, n)
        p, q = pb[c][j]
        if q == p:
            return None
        if step < rs_steps:  # reduce-scatter lands in scratch, then gets added
            off = ((step % 2) * pieces + j) * max_piece
            target = scratch[off:off + (q - p)]
        else:  # all-gather lands in place, once nothing still reads that memory
            target = flat[p:q]
            for work in outstanding.pop((c, j), []):
                work.wait()
        return dist.irecv(target, src=left_g, group=group, tag=step * pieces + j)

    recvs: dict[tuple[int, int], Any] = {}
    for j in range(pieces):
        recvs[(0, j)] = post_recv(0, j)
    for j in range(pieces):
        post_send(0, j)
    if steps > 1:
        for j in range(pieces):
            recvs[(1, j)] = post_recv(1, j)

    for step in range(steps):
        c = model.recv_chunk(rank, step, n)
        for j in range(pieces):
            work = recvs.pop((step, j))
            if work is not None:
                work.wait()
                if step < rs_steps:
                    p, q = pb[c][j]
                    off = ((step % 2) * pieces + j) * max_piece
                    dst = flat[p:q]
                    dst.add_(scratch[off:off + (q - p)])
                    if op == "avg" and step == rs_steps - 1:
                        dst.div_(n)
            if step + 1 < steps:
                post_send(step + 1, j)
            if step + 2 < steps:
                recvs[(step + 2, j)] = post_recv(step + 2, j)
        if trace is not None:
            _emit_step(trace, call, rank, n, step, bounds, elem, total_bytes)
    for works in outstanding.values():
        for work in works:
            work.wait()


def _ring_grouped(flat, bounds, rank, n, group, op, trace, call):
    """NCCL: one step at a time, the step's send and receive launched together."""
    steps = model.num_steps(n)
    max_chunk = max(b - a for a, b in bounds)
    scratch = _scratch_buffer(max_chunk, flat.dtype, flat.device)
    right_g, left_g = _global(group, model.right(rank, n)), _global(group, model.left(rank, n))
    elem, total_bytes = flat.element_size(), flat.numel() * flat.element_size()
    for step in range(steps):
        sa, sb = bounds[model.send_chunk(rank, step, n)]
        ra, rb = bounds[model.recv_chunk(rank, step, n)]
        reduce = step < n - 1
        target = scratch[:rb - ra] if reduce else flat[ra:rb]
        ops = []
        if sb > sa:
            ops.append(dist.P2POp(dist.isend, flat[sa:sb], right_g, group))
        if rb > ra:
            ops.append(dist.P2POp(dist.irecv, target, left_g, group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        if reduce and rb > ra:
            flat[ra:rb].add_(target)
            if op == "avg" and step == n - 2:
                flat[ra:rb].div_(n)
        if trace is not None:
            _emit_step(trace, call, rank, n, step, bounds, elem, total_bytes)
