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

:func:`prefix_store` adds **prefix sharing** (a :class:`~distai.lessons.lesson7.paging.PrefixCachingAllocator`,
RadixAttention's idea at block granularity): an admitted request references the cached blocks of its
longest cached prefix and prefills only the rest (``forward`` from position ``reused``, attention
reading the shared blocks through its table); a partly matched block is copied before the first write
(``KVStore.copy_pending``); finished requests leave their blocks cached until evicted (LRU).

Events: one ``kv_step`` per iteration (the blocks allocated and freed, the requests by state,
each running request's block table and length, the cached blocks, copies on write and evictions:
a block in several tables is shared, its reference count the number of tables) and one
``request`` per finished request (its time to first token, per token, the prompt tokens found
cached at its first admission), declared in ``lessons/lesson7/events.py``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..lessons.lesson7.events import KV_STEP, PREFIX_COMPARE, REQUEST
from ..lessons.lesson7.paging import (
    BlockAllocator,
    PrefixCachingAllocator,
    Request,
    Scheduler,
    snapshot,
    waste_summary,
)
from ..lessons.lesson7.routing import percentile
from .inference import DecoderShard, KVStore, contiguous_store

__all__ = ["paged_store", "prefix_store", "contiguous_store", "ContinuousBatcher", "BatchRun", "compare_prefix_sharing"]


def paged_store(shard: DecoderShard, num_blocks: int, block_size: int = 16) -> KVStore:
    """A paged KV cache of ``num_blocks`` blocks of ``block_size`` tokens for ``shard``."""
    return KVStore(BlockAllocator(num_blocks, block_size), len(shard.layers), shard.kv_local,
                   shard.cfg.head_dim, shard.dtype, shard.device)


def prefix_store(shard: DecoderShard, num_blocks: int, block_size: int = 16) -> KVStore:
    """A paged KV cache whose blocks are shared between requests with a common prefix."""
    return KVStore(PrefixCachingAllocator(num_blocks, block_size), len(shard.layers), shard.kv_local,
                   shard.cfg.head_dim, shard.dtype, shard.device)


def _prompt_ids(requests: list[Request]) -> dict[int, list[int]]:
    """Each request's prompt token ids by request id (a model runs ids, not lengths)."""
    prompts = {r.rid: r.prompt for r in requests if r.prompt is not None}
    if len(prompts) < len(requests):
        raise ValueError("requests need prompt token ids")
    return prompts


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
    prefill_tokens: int = 0  # tokens run through prefill forwards (cached prefixes excluded)

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
        prompts = _prompt_ids(requests)
        sched = Scheduler(alloc, self.max_batch)
        sched.add(requests)
        out: dict[int, list[int]] = {r.rid: [] for r in requests}
        arrival_wall: dict[int, float] = {}
        first_wall: dict[int, float] = {}
        first_reused: dict[int, int] = {}
        prefilled = 0
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
            new_tokens: dict[int, int] = {}
            for s in plan.prefill:  # from the first token not found in the prefix cache
                ids = torch.tensor([(prompts[s.rid] + out[s.rid])[s.reused:]], dtype=torch.long, device=dev)
                prefilled += ids.shape[1]
                nxt = int(shard.forward(ids, [s.rid], [s.reused]).argmax(-1)[0])
                out[s.rid].append(nxt)
                new_tokens[s.rid] = nxt
                first_wall.setdefault(s.rid, time.perf_counter())
                first_reused.setdefault(s.rid, s.reused)
            # one batched decode step for the running sequences, each at its own position
            if plan.decode:
                seqs = [s.rid for s in plan.decode]
                last = torch.tensor([[out[q][-1]] for q in seqs], dtype=torch.long, device=dev)
                pos0 = [s.cached for s in plan.decode]
                decoded = shard.forward(last, seqs, pos0).argmax(-1).tolist()
                for q, tkn in zip(seqs, decoded):
                    out[q].append(int(tkn))
                    new_tokens[q] = int(tkn)
            finished = sched.commit(plan, new_tokens)
            snap = snapshot(sched, plan, finished)
            snaps.append(snap)
            t_now = time.perf_counter()
            for s in finished:
                n = s.req.output_len
                row = {"rid": s.rid, "prompt_len": s.req.prompt_len, "output_len": n, "arrival": s.req.arrival,
                       "first_token_step": s.first_token_at, "finished_step": s.finished_at,
                       "ttft_s": first_wall[s.rid] - arrival_wall[s.rid],
                       "tpot_s": (t_now - first_wall[s.rid]) / (n - 1) if n > 1 else 0.0,
                       "preemptions": s.preemptions, "reused": first_reused[s.rid], "tokens": list(out[s.rid])}
                done_rows.append(row)
                if self.events is not None:
                    REQUEST.emit_fields(self.events, {"cache": self.cache_name,
                                                      "t_arrival": arrival_wall[s.rid] + perf_to_wall, **row})
            if self.events is not None:
                KV_STEP.emit(self.events, {
                    "cache": self.cache_name, "t0": t_iter, "step": snap.step, "allocated": snap.allocated,
                    "freed": snap.freed, "used_blocks": sum(o is not None for o in snap.owners),
                    "num_blocks": alloc.num_blocks, "block_size": alloc.block_size,
                    "tokens_stored": snap.tokens_stored, "reserved_tokens": snap.reserved_tokens,
                    "running": snap.running, "waiting": snap.waiting, "admitted": snap.admitted,
                    "finished": snap.finished, "preempted": snap.preempted,
                    "tables": {str(q): alloc.block_table(q) for q in snap.running},
                    "lengths": {str(q): alloc.lengths.get(q, 0) for q in snap.running},
                    "cached": {str(b): snap.fills[b] for b in snap.cached}, "cow": snap.cow,
                    "evicted": snap.evicted, "reused_tokens": snap.reused_tokens,
                    "logical_blocks": snap.logical_blocks})
        wall = time.perf_counter() - t_start
        return BatchRun(out, snaps, sorted(done_rows, key=lambda r: r["rid"]), wall,
                        sum(len(v) for v in out.values()), prefill_tokens=prefilled)


def compare_prefix_sharing(make_shard, requests: list[Request], num_blocks: int, block_size: int,
                           max_batch: int = 16, events=None) -> dict:
    """Serve ``requests`` twice on paged caches of ``num_blocks`` blocks: without prefix sharing
    (``cache`` "no-sharing") and with it ("prefix"), each on a fresh shard from ``make_shard()``.

    Returns ``system_prompt`` (tokens every prompt starts with), ``prompt_tokens``, and per run: ``ttft_p50_s``, ``ttft_mean_s``, ``wall_s``, ``tokens_per_s``,
    ``prefill_tokens`` (prompt tokens computed, recomputations after preemption included),
    ``peak_blocks`` and ``mean_blocks`` (physical KV blocks referenced, per iteration), ``peak_kv_bytes``,
    ``preemptions``; for the sharing run also ``logical_blocks_mean`` (the blocks the same sequences
    would hold unshared), ``memory_saved`` = 1 − Σ physical / Σ logical blocks over its iterations,
    ``reused_tokens``, ``looked_up_tokens`` (the prompt tokens looked up at admissions, a preempted request's
    again at its re-admission), ``hit_rate`` (found cached / looked up), ``cow`` and
    ``evicted`` (counts); and ``tokens_equal`` (identical outputs), ``ttft_ratio`` (p50 without /
    with), ``peak_memory_ratio`` (peak KV with / without)."""
    prompts = list(_prompt_ids(requests).values())
    common = next((i for i in range(min(map(len, prompts))) if len({p[i] for p in prompts}) > 1), min(map(len, prompts)))
    out: dict = {"requests": len(requests), "num_blocks": num_blocks, "block_size": block_size,
                 "system_prompt": common, "prompt_tokens": sum(map(len, prompts))}
    runs = {}
    for name, store in (("no-sharing", paged_store), ("prefix", prefix_store)):
        sh = make_shard()
        sh.cache = store(sh, num_blocks, block_size)
        run = ContinuousBatcher(sh, max_batch=max_batch, events=events, cache_name=name).run(requests)
        runs[name] = run
        ttft = sorted(r["ttft_s"] for r in run.requests)
        blocks = [s.physical_blocks for s in run.snapshots]
        busy = [b for b in blocks if b]
        per_block = sh.cache.bytes_per_token * block_size
        row = {"ttft_p50_s": percentile(ttft, 50), "ttft_mean_s": sum(ttft) / len(ttft), "wall_s": run.wall_s,
               "tokens_per_s": run.tokens_per_s, "peak_blocks": max(blocks), "mean_blocks": sum(busy) / len(busy),
               "peak_kv_bytes": max(blocks) * per_block, "bytes_per_block": per_block,
               "preemptions": sum(len(s.preempted) for s in run.snapshots),
               "prefill_tokens": run.prefill_tokens}
        if name == "prefix":
            logical = [s.logical_blocks for s in run.snapshots if s.logical_blocks]
            row.update(logical_blocks_mean=sum(logical) / len(logical),
                       memory_saved=1 - sum(busy) / sum(logical),
                       reused_tokens=sum(s.reused_tokens for s in run.snapshots),
                       looked_up_tokens=sh.cache.alloc.looked_up_tokens,
                       hit_rate=sh.cache.alloc.reused_tokens / max(1, sh.cache.alloc.looked_up_tokens),
                       cow=sum(len(s.cow) for s in run.snapshots), evicted=sum(len(s.evicted) for s in run.snapshots))
        out[name] = row
    a, b = out["no-sharing"], out["prefix"]
    out["tokens_equal"] = runs["prefix"].tokens == runs["no-sharing"].tokens
    out["ttft_ratio"] = a["ttft_p50_s"] / b["ttft_p50_s"] if b["ttft_p50_s"] > 0 else float("nan")
    out["peak_memory_ratio"] = b["peak_blocks"] / a["peak_blocks"]
    if events is not None:
        PREFIX_COMPARE.emit_fields(events, out)
    out["runs"] = runs
    return out
