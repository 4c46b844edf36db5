"""A paged KV cache and continuous batching, on the real model.

:func:`paged_store` gives a :class:`~distai.engine.inference.KVStore` whose allocator is a
:class:`~distai.lessons.lesson7.paging.BlockAllocator`: K and V live in torch tensors of
``num_blocks`` fixed-size blocks (``[layers, blocks, block_size, kv_heads, head_dim]``), each sequence
has a block table, a block is taken from the free list when the sequence's last one is full and
returned when the sequence finishes, and attention gathers K/V through the block tables
(``KVStore.read``: ``k[layer][tables]`` then the masked attention) — PagedAttention (Kwon et al.,
SOSP 2023), with the gather done by indexing instead of inside a fused kernel.

:class:`ContinuousBatcher` serves a request mix with the lesson's
:class:`~distai.lessons.lesson7.paging.Scheduler`: every iteration the running sequences decode one
token each in one batched forward (each at its own position), finished ones leave and free their
blocks, and arrived requests are prefilled and join as soon as a batch place and their prompt's
blocks are free; when the pool runs dry the newest sequence is preempted and later recomputed.
The same batcher runs on :func:`~distai.engine.inference.contiguous_store` (one pre-allocated ``max_len`` region per request),
so the two caches are compared on the same request mix: identical tokens (greedy), and the KV memory
each reserves against what it really stores.

Events (``events.emit``), one ``kv_step`` per iteration: ``cache`` (paged|contiguous), ``step``,
``allocated`` and ``freed`` (block ids), ``used_blocks``, ``num_blocks``, ``block_size``,
``tokens_stored``, ``reserved_tokens``, ``running``, ``waiting``, ``admitted``, ``finished``,
``preempted`` (request ids), ``tables`` ({request id: block table}), ``lengths`` ({request id:
tokens stored}), ``t0`` and ``t`` (wall clock at the iteration's start and end);
one ``request`` per finished request: ``t_arrival`` (wall clock), ``rid``, ``prompt_len``, ``output_len``, ``arrival``,
``first_token_step``, ``finished_step``, ``ttft_s``, ``tpot_s``, ``preemptions``, ``tokens``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..lessons.lesson7.paging import (
    BlockAllocator,
    Request,
    Scheduler,
    snapshot,
    waste_summary,
)
from .inference import DecoderShard, KVStore, contiguous_store

__all__ = ["paged_store", "contiguous_store", "ContinuousBatcher", "BatchRun"]


def paged_store(shard: DecoderShard, num_blocks: int, block_size: int = 16) -> KVStore:
    """A paged KV cache of ``num_blocks`` blocks of ``block_size`` tokens for ``shard``."""
    return KVStore(BlockAllocator(num_blocks, block_size), len(shard.layers), shard.kv_local,
                   shard.cfg.head_dim, shard.dtype, shard.device)


@dataclass
class BatchRun:
    """The outcome of serving a request mix."""

    tokens: dict  # rid -> list of output tokens
    snapshots: list  # lessons.lesson7.paging.Snapshot per iteration
    requests: list  # per request: dict of timings (see module doc, ``request`` event)
    wall_s: float
    generated: int
    bytes_per_token: int = 0  # of the cache it ran on (set by whoever reports it)
    storage_bytes: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.wall_s if self.wall_s > 0 else float("nan")

    def waste(self) -> dict:
        return waste_summary(self.snapshots)


class ContinuousBatcher:
    """Serve requests on one model shard (all layers) with continuous batching over ``shard.cache``."""

    def __init__(self, shard: DecoderShard, max_batch: int = 16, events=None, cache_name: str | None = None):
        if not (shard.first and shard.last) or shard.tp_size != 1:
            raise ValueError("the batcher runs a whole single-process model")
        if shard.cache is None:
            raise ValueError("attach a KV cache (paged_store / contiguous_store) first")
        self.shard, self.max_batch, self.events = shard, max_batch, events
        self.cache_name = cache_name or shard.cache.alloc.kind

    @torch.no_grad()
    def run(self, requests: list[Request]) -> BatchRun:
        shard, alloc = self.shard, self.shard.store.alloc
        if any(r.prompt is None for r in requests):
            raise ValueError("requests need prompt token ids")
        sched = Scheduler(alloc, self.max_batch)
        sched.add(requests)
        out: dict[int, list[int]] = {r.rid: [] for r in requests}
        arrival_wall: dict[int, float] = {}
        first_wall: dict[int, float] = {}
        snaps, done_rows = [], []
        dev = shard.device
        t_start = time.perf_counter()
        perf_to_wall = time.time() - t_start  # request events carry wall-clock times, as every event
        while not sched.done:
            now = time.perf_counter()
            for s in list(sched.pending):
                if s.req.arrival <= sched.step:
                    arrival_wall.setdefault(s.rid, now)
            t_iter = time.time()
            plan = sched.plan()
            # prefill each newly admitted sequence (prompt + tokens already produced, if preempted)
            for s in plan.prefill:
                ids = torch.tensor([s.req.prompt + out[s.rid]], dtype=torch.long, device=dev)
                nxt = int(shard.forward(ids, [s.rid], [0]).argmax(-1)[0])
                out[s.rid].append(nxt)
                first_wall.setdefault(s.rid, time.perf_counter())
            # one batched decode step for the running sequences, each at its own position
            if plan.decode:
                seqs = [s.rid for s in plan.decode]
                last = torch.tensor([[out[q][-1]] for q in seqs], dtype=torch.long, device=dev)
                pos0 = [s.cached for s in plan.decode]
                new_tokens = shard.forward(last, seqs, pos0).argmax(-1).tolist()
                for q, tkn in zip(seqs, new_tokens):
                    out[q].append(int(tkn))
            finished = sched.commit(plan)
            snap = snapshot(sched, plan, finished)
            snaps.append(snap)
            t_now = time.perf_counter()
            for s in finished:
                n = s.req.output_len
                row = {"rid": s.rid, "prompt_len": s.req.prompt_len, "output_len": n, "arrival": s.req.arrival,
                       "first_token_step": s.first_token_at, "finished_step": s.finished_at,
                       "ttft_s": first_wall[s.rid] - arrival_wall[s.rid],
                       "tpot_s": (t_now - first_wall[s.rid]) / (n - 1) if n > 1 else 0.0,
                       "preemptions": s.preemptions, "tokens": list(out[s.rid])}
                done_rows.append(row)
                if self.events is not None:
                    self.events.emit("request", cache=self.cache_name, t_arrival=arrival_wall[s.rid] + perf_to_wall,
                                     **row)
            if self.events is not None:
                self.events.emit("kv_step", cache=self.cache_name, t0=t_iter, step=snap.step, allocated=snap.allocated,
                                 freed=snap.freed, used_blocks=sum(o is not None for o in snap.owners),
                                 num_blocks=alloc.num_blocks, block_size=alloc.block_size,
                                 tokens_stored=snap.tokens_stored, reserved_tokens=snap.reserved_tokens,
                                 running=snap.running, waiting=snap.waiting, admitted=snap.admitted,
                                 finished=snap.finished, preempted=snap.preempted,
                                 tables={str(q): alloc.block_table(q) for q in snap.running},
                                 lengths={str(q): alloc.lengths.get(q, 0) for q in snap.running})
        wall = time.perf_counter() - t_start
        return BatchRun(out, snaps, sorted(done_rows, key=lambda r: r["rid"]), wall,
                        sum(len(v) for v in out.values()))
