"""Ring all-reduce written from scratch on torch.distributed point-to-point operations.

The schedule is the lesson-1 model's (``distai.lessons.lesson1.ring_model``): N chunks,
N-1 steps of reduce-scatter (receive a chunk from the left neighbour, add it into your own
copy, forward it to the right) then N-1 steps of all-gather (receive a finished chunk, keep it,
forward it). Every rank sends 2(N-1)/N·S bytes, the bandwidth-optimal amount.

Pipelining: each chunk is cut into ``pieces`` sub-chunks. Since a rank forwards at step s+1
the chunk it received at step s, a piece is reduced and sent on as soon as it arrives, while
the rest of the chunk is still on the wire — the same trick gloo and NCCL use inside their own
ring. On gloo every message is an independent ``isend``/``irecv`` tagged by (channel, step,
piece), receives are posted a few segments ahead into a small ring of scratch slots.

Channels: with ``channels=2`` the buffer is split in two halves; the first half goes round the ring 0 → 1 → … → N-1 → 0, the
second round the same ring backwards, each half following the model's schedule on its own ring
order. Every TCP connection between neighbours then carries data both ways (NCCL likewise runs
several rings, "channels", at once). Bytes sent per rank are unchanged: 2(N-1)/N·S. On
loopback gloo it measured no faster than one ring, so one ring is the default.

NCCL runs one step at a time with the send and the receive of that step grouped in
``batch_isend_irecv`` (NCCL needs them launched together to avoid a deadlock).

With ``trace`` (an ``EventSink``) the ring emits one ``ring_step`` event per step (the chunk sent
to the right neighbour and the one received from the left, their bytes, when the step began;
``lessons/lesson1/events.py``) so the tutor can animate a real run. A traced call runs one channel, the textbook ring the
model describes. Tracing is off unless asked for (the bandwidth sweep traces only its untimed
warm-up calls).
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from ..lessons.lesson1 import ring_model as model
from ..lessons.lesson1.events import RING_STEP

# Tuned with bench/ring_vs_allreduce.py on gloo (CPU, loopback); environment overrides for tuning.
DEFAULT_PIECE_BYTES = int(os.environ.get("DISTAI_RING_PIECE_BYTES", 4 << 20))
MIN_PIPELINED_CHUNK = 2 * DEFAULT_PIECE_BYTES  # smaller chunks travel whole
MAX_PIECES = 64
WINDOW_BYTES = int(os.environ.get("DISTAI_RING_WINDOW_BYTES", 16 << 20))  # receives posted ahead
# Two counter-rotating rings measured no faster than one on loopback gloo (bench, 4 ranks on 2
# cores), so they are opt-in: channels=2, or set this to a size to make them the default above it.
MIN_TWO_CHANNEL_BYTES = int(os.environ.get("DISTAI_RING_TWO_CHANNEL_BYTES", 1 << 62))
TAG_STRIDE = 1 << 20  # tags of channel c start at c·TAG_STRIDE

_scratch: dict[tuple, torch.Tensor] = {}


def _scratch_buffer(numel: int, dtype: torch.dtype, device: torch.device, channel: int = 0) -> torch.Tensor:
    """A reusable receive buffer (page-faulting a fresh one every call costs real time)."""
    key = (dtype, str(device), channel)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _scratch[key] = buf
    return buf[:numel]


def choose_pieces(chunk_bytes: int, piece_bytes: int | None = None) -> int:
    """How many sub-chunks to pipeline a chunk of ``chunk_bytes`` in."""
    piece_bytes = piece_bytes or DEFAULT_PIECE_BYTES
    if chunk_bytes < MIN_PIPELINED_CHUNK:
        return 1
    return max(2, min(MAX_PIECES, chunk_bytes // max(1, piece_bytes)))


def choose_channels(total_bytes: int, n: int, backend: str) -> int:
    """Two counter-rotating rings on gloo when N >= 3 and the message reaches MIN_TWO_CHANNEL_BYTES."""
    return 2 if backend != "nccl" and n >= 3 and total_bytes >= MIN_TWO_CHANNEL_BYTES else 1


def _global(group, group_rank: int) -> int:
    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def ring_allreduce(tensor: torch.Tensor, op: str = "sum", group=None, *, pieces: int | None = None,
                   channels: int | None = None, trace=None, call: int = 0) -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` with the ring; returns ``tensor``.

    ``op`` is ``"sum"`` or ``"avg"`` (the average divides each finished chunk once, by N,
    before the all-gather spreads it). ``pieces`` sub-chunks per chunk are pipelined
    (default: chunks of 8 MiB or more in ~4 MiB pieces). ``channels``: 1 (one ring, the
    default) or 2 (two counter-rotating rings on the two halves, gloo only).
    ``trace``: an ``EventSink`` to receive one ``ring_step`` event per step (a traced call runs
    one channel); ``call`` numbers the all-reduce in those events.
    """
    if op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg', got {op!r}")
    if op == "avg" and not tensor.is_floating_point():
        raise ValueError("op='avg' needs a floating-point tensor")
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if n == 1:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    elem = flat.element_size()
    backend = dist.get_backend(group)
    if backend == "nccl":
        _ring_grouped(flat, model.chunk_bounds(flat.numel(), n), rank, n, group, op, trace, call)
    else:
        if channels is None:
            channels = 1 if trace is not None else choose_channels(flat.numel() * elem, n, backend)
        channels = max(1, min(2, int(channels)))
        parts = [p for p in flat.tensor_split(channels) if p.numel() > 0] if channels > 1 else [flat]
        rings = []
        for c, part in enumerate(parts):
            order = list(range(n)) if c == 0 else [(-i) % n for i in range(n)]  # 0, N-1, …, 1
            k = pieces if pieces is not None else choose_pieces(((part.numel() + n - 1) // n) * elem)
            rings.append(_RingChannel(part, rank, n, order, group, op, max(1, int(k)), c,
                                      trace if c == 0 else None, call))
        _run_channels(rings)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def _piece_bounds(bounds, pieces):
    """``[chunk][piece] -> (start, stop)`` in the flat buffer."""
    out = []
    for a, b in bounds:
        out.append([(a + p, a + q) for p, q in model.chunk_bounds(b - a, pieces)])
    return out


def _emit_step(trace, call, rank, n, step, bounds, elem, total_bytes, t0):
    """One ``ring_step`` event; ``t0`` is when the step began (it ends now), for the run's trace."""
    phase, _ = model.phase_of(step, n)
    sent = model.send_chunk(rank, step, n)
    a, b = bounds[sent]
    RING_STEP.emit(trace, {"call": call, "phase": phase, "step": step, "of": model.num_steps(n), "n": n,
                           "chunk": sent, "to": model.right(rank, n), "recv_chunk": model.recv_chunk(rank, step, n),
                           "from": model.left(rank, n), "bytes": (b - a) * elem, "size": total_bytes, "t0": t0})


class _RingChannel:
    """One ring over ``order`` (global ranks in ring order) reducing ``flat``: the model's
    schedule with this rank's position on that ring, as a stream of segments
    ``k = step·pieces + piece`` (gloo and other backends with independent async p2p)."""

    def __init__(self, flat, rank, n, order, group, op, pieces, channel, trace, call):
        self.flat, self.n, self.group, self.op, self.pieces = flat, n, group, op, pieces
        self.trace, self.call, self.channel = trace, call, channel
        self.pos = order.index(rank)  # this rank's place on the ring: the model's "rank"
        self.right_g = _global(group, order[(self.pos + 1) % n])
        self.left_g = _global(group, order[(self.pos - 1) % n])
        self.steps = model.num_steps(n)
        self.rs_steps = n - 1
        self.bounds = model.chunk_bounds(flat.numel(), n)
        self.pb = _piece_bounds(self.bounds, pieces)
        self.max_piece = max(1, max((q - p) for chunk in self.pb for p, q in chunk))
        self.elem = flat.element_size()
        self.total = self.steps * pieces
        self.window = max(2, min(self.total, WINDOW_BYTES // (self.max_piece * self.elem)))
        self.slots = max(1, min(self.window, self.rs_steps * pieces))
        self.scratch = _scratch_buffer(self.slots * self.max_piece, flat.dtype, flat.device, channel)
        self.tag0 = channel * TAG_STRIDE
        # (chunk, piece) -> sends still reading that memory. Each gloo send is waited exactly
        # once: a second wait() on the same send blocks until the collective timeout.
        self.outstanding: dict[tuple[int, int], list] = {}
        self.recvs: dict[int, Any] = {}

    def _send(self, step: int, j: int) -> None:
        c = model.send_chunk(self.pos, step, self.n)
        p, q = self.pb[c][j]
        if q == p:
            return
        work = dist.isend(self.flat[p:q], dst=self.right_g, group=self.group, tag=self.tag0 + step * self.pieces + j)
        self.outstanding.setdefault((c, j), []).append(work)

    def _recv(self, k: int) -> None:
        step, j = divmod(k, self.pieces)
        c = model.recv_chunk(self.pos, step, self.n)
        p, q = self.pb[c][j]
        if q == p:
            self.recvs[k] = None
            return
        if step < self.rs_steps:  # reduce-scatter lands in a scratch slot, then gets added
            off = (k % self.slots) * self.max_piece
            target = self.scratch[off:off + (q - p)]
        else:  # all-gather lands in place, once nothing still reads that memory
            target = self.flat[p:q]
            for work in self.outstanding.pop((c, j), []):
                work.wait()
        self.recvs[k] = dist.irecv(target, src=self.left_g, group=self.group, tag=self.tag0 + k)

    def start(self) -> None:
        self.step_t0 = time.time()  # a traced ring's step k runs from the end of step k - 1
        first = min(self.pieces, self.window)
        for k in range(first):
            self._recv(k)
        for j in range(self.pieces):
            self._send(0, j)
        for k in range(first, self.window):
            self._recv(k)

    def advance(self, k: int) -> None:
        """Segment ``k`` arrives: reduce it (reduce-scatter), forward it, post a receive."""
        step, j = divmod(k, self.pieces)
        work = self.recvs.pop(k)
        if work is not None:
            work.wait()
            if step < self.rs_steps:
                c = model.recv_chunk(self.pos, step, self.n)
                p, q = self.pb[c][j]
                off = (k % self.slots) * self.max_piece
                dst = self.flat[p:q]
                dst.add_(self.scratch[off:off + (q - p)])
                if self.op == "avg" and step == self.rs_steps - 1:
                    dst.div_(self.n)
        if step + 1 < self.steps:
            self._send(step + 1, j)
        if k + self.window < self.total:
            self._recv(k + self.window)
        if self.trace is not None and j == self.pieces - 1:
            _emit_step(self.trace, self.call, self.pos, self.n, step, self.bounds, self.elem,
                       self.flat.numel() * self.elem, self.step_t0)
            self.step_t0 = time.time()

    def finish(self) -> None:
        for works in self.outstanding.values():
            for work in works:
                work.wait()
        self.outstanding.clear()


def _run_channels(rings: list[_RingChannel]) -> None:
    """Drive the channels' segment streams side by side from one thread."""
    for ring in rings:
        ring.start()
    for k in range(max(r.total for r in rings)):
        for ring in rings:
            if k < ring.total:
                ring.advance(k)
    for ring in rings:
        ring.finish()


def _ring_grouped(flat, bounds, rank, n, group, op, trace, call):
    """NCCL: one step at a time, the step's send and receive launched together."""
    steps = model.num_steps(n)
    max_chunk = max(b - a for a, b in bounds)
    scratch = _scratch_buffer(max_chunk, flat.dtype, flat.device)
    right_g, left_g = _global(group, model.right(rank, n)), _global(group, model.left(rank, n))
    elem, total_bytes = flat.element_size(), flat.numel() * flat.element_size()
    for step in range(steps):
        t0 = time.time()
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
            _emit_step(trace, call, rank, n, step, bounds, elem, total_bytes, t0)
