"""Lesson 7 experiment: serving a small decoder-only model across ranks.

Run on W ranks::

    python -m torch.distributed.run --nproc-per-node 2 -m distai.engine.experiments.lesson7
    distai run lesson7 --cpu 2          (or --cpu 4)

1. **Tensor-parallel decode** over the W ranks (heads split, each rank's KV cache holds only its KV
   heads): greedy tokens compared with the single-process model (every rank also decodes alone),
   all-reduces counted per token against 2·L, each rank's KV bytes against ``kv_cache_total``.
2. **Pipeline-parallel decode** over W stages (layers split, each stage caches only its layers),
   ``--microbatches`` in flight: same token check, hidden-state sends counted, KV bytes per stage.
   With ``--tp T --pp P`` (T·P = W) parts 1 and 2 become one **TP × PP decode** on a (pp, tp)
   ``DeviceMesh``: each rank holds its TP rank's KV heads of its stage's layers, all-reduces inside
   its stage and sends hidden states to its peer in the next stage; tokens checked the same way.
3. **Paged vs contiguous KV cache** (rank 0): the same Poisson request mix served with continuous
   batching on a paged cache (blocks of ``--block-size`` tokens) and on a contiguous one (a
   ``max_len`` region per request) with the same KV memory (``--kv-budget`` tokens): tokens must be
   identical; reserved vs stored KV memory measured every iteration, tokens/s of both.
   Meanwhile the last rank times the real model's prefill (per prompt length) and decode step (per
   batch size) — the cost model of the next part.
4. **Prefix sharing** (rank 0): requests that all start with the same ``--system-prompt`` tokens,
   served on a paged cache of the same ``--kv-budget`` without and with prefix sharing (a radix tree
   of shared blocks, :class:`distai.lessons.lesson7.paging.PrefixCachingAllocator`): tokens must be
   identical; KV blocks in use (against what the same sequences would hold unshared), prompt tokens
   computed and TTFT measured side by side.
5. **Routing** (rank 0): ``--replicas`` replicas behind round-robin, least-outstanding and
   prefix-aware routers on a Poisson workload with shared prefixes (:mod:`distai.lessons.lesson7.routing`),
   with the costs measured in 3 (``--cost measured``, the default) or the roofline of Llama-2-70B
   on 4 H100s (``--cost roofline``); the arrival rate is set for an offered load of ``--load``.

Events (besides ``phase``, ``log`` and rank 0's ``summary``):

- ``config``: the model shape, W, dtype, device;
- ``tokens``: ``mode`` (single|tp|pp|tp-pp), ``step``, ``tokens`` (one per sequence) — rank 0 for tp,
  the last stage for pp;
- ``kv_shard``: ``mode`` (tp|pp|tp-pp; tp-pp adds ``stage``, ``tp_rank``, ``tp``, ``pp``), ``rank``, ``layers`` (list), ``kv_heads`` (list of global KV head
  ids), ``bytes`` (measured), ``formula_bytes``, ``tokens``;
- ``decode``: ``mode``, ``rank``, ``equal`` (tokens = single process), ``all_reduces_per_token``,
  ``sends_per_token``, ``decode_tokens_per_s``, ``prefill_s``;
- ``kv_step`` and ``request`` from :class:`distai.engine.paged_kv.ContinuousBatcher` (``cache``:
  paged|contiguous): blocks allocated/freed per iteration, per-request TTFT/TPOT;
- ``kv_compare``: both caches' waste, peaks, tokens/s and ``tokens_equal``;
- ``kv_step``/``request`` with ``cache`` no-sharing|prefix, then ``prefix_compare``
  (:func:`distai.engine.paged_kv.compare_prefix_sharing`'s figures);
- ``cost_model``: the fitted costs and the measured points;
- ``route``: ``policy``, ``rid``, ``replica``, ``prefix_hit``, ``ttft_s``, ``tpot_s``;
- ``routing``: ``policy`` and its metrics (TTFT/TPOT p50/p99, throughput, hit rate);
- ``check`` (rank 0, issue 28): the TP decode's TTFT and TPOT against ``planner.ttft``/``tpot`` on
  this machine's measured FLOP/s, bandwidth, α and β, with their measured causes.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import Check, check
from ...lessons.events import CHECK, PHASE
from ...lessons.lesson7 import formulas as f7
from ...lessons.lesson7 import planner, routing
from ...lessons.lesson7.events import (
    CONFIG,
    COST_MODEL,
    DECODE,
    KV_COMPARE,
    KV_SHARD,
    ROUTE,
    ROUTING,
    TOKENS,
)
from ...lessons.lesson7.paging import BlockAllocator, poisson_requests
from ...lessons.model_size import ModelSize, add_model_options
from ...lessons.model_spec import ModelSpec
from ...lessons.strings import TranslatedError
from ...lessons.units import format_count, format_fixed, format_fixed_percent, format_integer, format_plain
from ..comm_trace import trace_causes
from ..doctor import group_alpha_beta, link_alpha_beta
from ..experiment import (
    UsageError,
    all_ranks_true,
    exit_with,
    launch_world_size,
    run_experiment,
    run_language,
    summary_lines,
)
from ..inference import (
    DecoderShard,
    KVStore,
    build_model,
    contiguous_store,
    decode_params,
    generate,
    generate_pp,
    mesh_shard,
    split_layers,
)
from ..mesh_args import DECODE_MODEL, DECODE_SIZE_FLAGS, check_decode_parts
from ..metering import CommMeter
from ..model import ModelConfigError
from ..paged_kv import ContinuousBatcher, compare_prefix_sharing, paged_store
from ..time_causes import Window, collective_causes, copy_bandwidth, matmul_rate, step_contention

DEFAULT_MODEL = DECODE_MODEL  # the GPT this lesson serves, in Llama's shape (its size flags default to this)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run lesson7")
    g = p.add_argument_group("model")
    add_model_options(g, DEFAULT_MODEL, DECODE_SIZE_FLAGS)
    g.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("decode")
    g.add_argument("--batch", type=int, default=4)
    g.add_argument("--prompt", type=int, default=16)
    g.add_argument("--new-tokens", type=int, default=24)
    g.add_argument("--microbatches", type=int, default=None)
    g.add_argument("--tp", type=int, default=None)
    g.add_argument("--pp", type=int, default=None)
    g = p.add_argument_group("paged")
    g.add_argument("--requests", type=int, default=32)
    g.add_argument("--block-size", type=int, default=8)
    g.add_argument("--kv-budget", type=int, default=640)
    g.add_argument("--max-batch", type=int, default=16)
    g.add_argument("--arrival-rate", type=float, default=1.0)
    g = p.add_argument_group("prefix")
    g.add_argument("--system-prompt", type=int, default=100)
    g = p.add_argument_group("routing")
    g.add_argument("--replicas", type=int, default=4)
    g.add_argument("--route-requests", type=int, default=600)
    g.add_argument("--load", type=float, default=1.3)
    g.add_argument("--cost", choices=("measured", "roofline"), default="measured")
    g.add_argument("--prefix-slots", type=int, default=4)
    g.add_argument("--skip", default="")
    return p


#: timed runs of the TP decode, their times summed: TTFT is one prefill of a few ms, which one wait for
#: a core can lengthen by half on a shared machine
TIMED_DECODES = 9

#: tokens of the metered TP/PP runs that count the collectives (prefill + 2 decode steps): the
#: meter costs Python time per op, so the timed runs are separate and unmetered
METERED_TOKENS = 3


# ----------------------------------------------------------------------------------------------
# 1-2. TP and PP decode against the single process
# ----------------------------------------------------------------------------------------------

def single_process(cfg, w, prompts, n, device, ev, rank) -> dict:
    sh = DecoderShard(cfg, w, device=device)
    r = generate(sh, prompts, n)
    if rank == 0:
        for step in range(n):
            TOKENS.emit(ev, {"mode": "single", "step": step, "tokens": r["tokens"][:, step].tolist()})
    return r


def tp_decode(cfg, w, prompts, n, ref, ctx) -> dict:
    rank, W, ev = ctx.rank, ctx.world_size, ctx.events
    sh = DecoderShard(cfg, w, tp_rank=rank, tp_size=W, device=ctx.device)
    on_token = (lambda step, t: TOKENS.emit(ev, {"mode": "tp", "step": step, "tokens": t.tolist()})) \
        if rank == 0 else None
    sh.tp.spans = []  # when this rank entered and left each all-reduce
    sh.tp.thread_waits = False  # gloo's threads' waits read around each step instead (Window.backend_wait_s)
    twins = (overhead_twin(cfg, sh.dtype, ctx), compute_twin(cfg, w, sh.dtype, ctx))
    timed = []
    for run in range(TIMED_DECODES):
        sh.cache, sh.tp.spans = None, []  # each run a fresh cache on the same shard (no second copy of the weights)
        if W > 1:
            dist.barrier()  # the ranks start each timed decode together
        timed.append((generate(sh, prompts, n, on_token=on_token if run == 0 else None, twins=twins), sh.tp.spans))
    sh.cache, sh.tp.spans = None, None  # the metered decode
    counted = generate(sh, prompts, min(n, METERED_TOKENS), meter=CommMeter())
    k = counted["comm_prefill"]["all_reduces"]
    r, spans = _timed_together(timed, k)
    for found in serving_checks(cfg, prompts, n, r, spans, k * len(timed), sh.dtype, ctx):
        if rank == 0:
            CHECK.emit_fields(ev, found.event())
    B, s = prompts.shape
    tokens = B * (s + n - 1)
    formula = f7.kv_cache_total(cfg.layers, cfg.group_heads, cfg.head_dim, sh.store.k.element_size(), tokens, tp=W)
    equal = all_ranks_true(torch.equal(r["tokens"], ref["tokens"]))
    steps = max(1, counted["decode_steps"])
    out = {"equal": equal, "kv_bytes": r["kv_bytes"], "formula_bytes": formula["per_gpu_bytes"],
           "kv_heads": list(range(sh.kv0, sh.kv0 + sh.kv_local)), "layers": sh.layers,
           "all_reduces_per_token": counted["comm_decode"]["all_reduces"] / steps,
           "expected_per_token": 2 * cfg.layers,
           "all_reduce_bytes_per_token": counted["comm_decode"]["all_reduce_bytes"] / steps,
           "decode_tokens_per_s": B * r["decode_steps"] / r["decode_s"] if r["decode_s"] > 0 else None,
           "prefill_s": r["prefill_s"], "weight_bytes": sh.weight_bytes}
    KV_SHARD.emit(ev, {"mode": "tp", "rank": rank, "layers": out["layers"], "kv_heads": out["kv_heads"],
                       "bytes": out["kv_bytes"], "formula_bytes": out["formula_bytes"], "tokens": tokens,
                       "kv_heads_total": cfg.group_heads, "layers_total": cfg.layers})
    DECODE.emit(ev, {"mode": "tp", "rank": rank, "equal": equal, "all_reduces_per_token": out["all_reduces_per_token"],
                     "sends_per_token": 0, "decode_tokens_per_s": out["decode_tokens_per_s"],
                     "prefill_s": r["prefill_s"]})
    return out


def pp_decode(cfg, w, prompts, n, ref, ctx, microbatches: int) -> dict:
    rank, W, ev = ctx.rank, ctx.world_size, ctx.events
    rng = split_layers(cfg.layers, W)[rank]
    sh = DecoderShard(cfg, w, layer_range=rng, device=ctx.device)
    on_token = (lambda step, g, t: TOKENS.emit(ev, {"mode": "pp", "step": step, "seqs": g, "tokens": t.tolist()})) \
        if rank == W - 1 else None
    r = generate_pp(sh, prompts, n, stage=rank, stages=W, microbatches=microbatches, on_token=on_token)
    sh.cache = None  # the metered decode: a fresh cache on the same shard (no second copy of the weights)
    counted = generate_pp(sh, prompts, min(n, METERED_TOKENS), stage=rank, stages=W, microbatches=microbatches,
                          meter=CommMeter())
    B, s = prompts.shape
    tokens = B * (s + n - 1)
    kv_heads = cfg.group_heads
    per_layer = f7.kv_cache_bytes_per_token(1, kv_heads, cfg.head_dim, sh.store.k.element_size()) * tokens
    equal = all_ranks_true(torch.equal(r["tokens"], ref["tokens"]))
    steps = max(1, counted["decode_steps"])
    out = {"equal": equal, "kv_bytes": r["kv_bytes"], "formula_bytes": per_layer * len(sh.layers),
           "busiest_formula_bytes": f7.kv_cache_total(cfg.layers, kv_heads, cfg.head_dim,
                                                      sh.store.k.element_size(), tokens, pp=W)["per_gpu_bytes"],
           "layers": sh.layers, "sends_per_token": counted["comm_decode"]["sends"] / steps,
           "send_bytes_per_token": counted["comm_decode"]["send_bytes"] / steps, "microbatches": r["microbatches"],
           "decode_tokens_per_s": B * r["decode_steps"] / r["decode_s"] if r["decode_s"] > 0 else None,
           "prefill_s": r["prefill_s"], "weight_bytes": sh.weight_bytes}
    KV_SHARD.emit(ev, {"mode": "pp", "rank": rank, "layers": out["layers"], "kv_heads": list(range(kv_heads)),
                       "bytes": out["kv_bytes"], "formula_bytes": out["formula_bytes"], "tokens": tokens,
                       "kv_heads_total": kv_heads, "layers_total": cfg.layers})
    DECODE.emit(ev, {"mode": "pp", "rank": rank, "equal": equal, "all_reduces_per_token": 0,
                     "sends_per_token": out["sends_per_token"], "decode_tokens_per_s": out["decode_tokens_per_s"],
                     "prefill_s": r["prefill_s"]})
    return out


def mesh_decode(cfg, w, prompts, n, ref, ctx, tp: int, pp: int, microbatches: int) -> dict:
    """TP × PP decode on a (pp, tp) DeviceMesh: each rank holds the heads of its tensor-parallel rank
    in the layers of its stage (engine.inference.mesh_shard + generate_pp)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank, ev = ctx.rank, ctx.events
    mesh = init_device_mesh(ctx.device.type, (pp, tp), mesh_dim_names=("pp", "tp"))
    sh, pipe, stage = mesh_shard(cfg, w, mesh, device=ctx.device)
    last_stage_lead = stage == pp - 1 and sh.tp_rank == 0
    on_token = (lambda step, g, t: TOKENS.emit(ev, {"mode": "tp-pp", "step": step, "seqs": g, "tokens": t.tolist()})) \
        if last_stage_lead else None
    r = generate_pp(sh, prompts, n, stage=stage, stages=pp, microbatches=microbatches, on_token=on_token, pipe=pipe)
    sh.cache = None  # the metered decode: a fresh cache on the same shard (no second copy of the weights)
    counted = generate_pp(sh, prompts, min(n, METERED_TOKENS), stage=stage, stages=pp, microbatches=microbatches,
                          pipe=pipe, meter=CommMeter())
    B, s = prompts.shape
    tokens = B * (s + n - 1)
    formula = f7.kv_cache_bytes_per_token(len(sh.layers), sh.kv_local, cfg.head_dim, sh.store.k.element_size()) * tokens
    equal = all_ranks_true(torch.equal(r["tokens"], ref["tokens"]))
    steps = max(1, counted["decode_steps"])
    m = r["microbatches"]
    out = {"equal": equal, "kv_bytes": r["kv_bytes"], "formula_bytes": formula, "stage": stage, "tp_rank": sh.tp_rank,
           "kv_heads": list(range(sh.kv0, sh.kv0 + sh.kv_local)), "layers": sh.layers, "microbatches": m,
           # per decode position, each microbatch passes this stage's layers: 2 all-reduces each (Megatron)
           "all_reduces_per_token": counted["comm_decode"]["all_reduces"] / steps,
           "expected_per_token": 2 * len(sh.layers) * m,
           "sends_per_token": counted["comm_decode"]["sends"] / steps,
           "decode_tokens_per_s": B * r["decode_steps"] / r["decode_s"] if r["decode_s"] > 0 else None,
           "prefill_s": r["prefill_s"]}
    KV_SHARD.emit(ev, {"mode": "tp-pp", "rank": rank, "stage": stage, "tp_rank": sh.tp_rank, "tp": tp, "pp": pp,
                       "layers": sh.layers, "kv_heads": out["kv_heads"], "bytes": out["kv_bytes"],
                       "formula_bytes": formula, "tokens": tokens, "kv_heads_total": cfg.group_heads,
                       "layers_total": cfg.layers})
    DECODE.emit(ev, {"mode": "tp-pp", "rank": rank, "equal": equal,
                     "all_reduces_per_token": out["all_reduces_per_token"], "sends_per_token": out["sends_per_token"],
                     "decode_tokens_per_s": out["decode_tokens_per_s"], "prefill_s": r["prefill_s"]})
    return out


# ----------------------------------------------------------------------------------------------
# TTFT and TPOT against the serving planner (issue 28)
# ----------------------------------------------------------------------------------------------

def this_machine(cfg, prompts, dtype: torch.dtype, ctx) -> planner.Hardware:
    """The planner's hardware, measured here: the matmul rate (FLOP/s), the memory bandwidth of a
    copy, and α, β of the group's all-reduces at the sizes of the prefill's and a decode step's."""
    B, s = prompts.shape
    elem = torch.empty((), dtype=dtype).element_size()
    sizes = sorted({B * cfg.hidden * elem, B * s * cfg.hidden * elem, 8 * B * s * cfg.hidden * elem})
    # timed alone, the cores' contention apart: the checks count it as a cause of its own
    alpha, beta = group_alpha_beta(sizes, repeats=3, device_type=ctx.device.type, contention_apart=True)
    if not all_ranks_true(alpha > 0 and beta > 0, ctx.device):  # decided together: the fallback is a collective
        # three sizes on loaded cores can time the largest no slower than the smallest: the fit's time per
        # byte is then 0 (all-reduces of any size free beyond α); or the smallest slower than the line through
        # the others, whose intercept is then below 0 (free latency: α 0 with one core taken by another
        # process). One link's ping-pong measures what the fit lost: its smallest message's one-way time
        # and its 4 MiB one's time per byte
        link = link_alpha_beta(ctx.device, contention_apart=True)
        alpha = alpha if alpha > 0 else link["alpha_s"]
        beta = beta if beta > 0 else link["beta_s_per_byte"]
    return planner.Hardware(gpus=ctx.world_size, gpu_memory=1.0, bandwidth=copy_bandwidth(ctx.device),
                            flops=matmul_rate(dtype, ctx.device), link_bandwidth=1 / beta if beta > 0 else 1e30,
                            alpha=alpha, nccl_allreduce=False)  # gloo's measured ring, not NCCL's model


def overhead_twin(cfg, dtype: torch.dtype, ctx) -> DecoderShard:
    """This rank's tensor-parallel shard with every width shrunk (head dimension 2, MLP 8) and its
    all-reduces skipped: the same operations with next to no arithmetic and no communication. Run
    as the decode's twin (``generate(..., twins=...)``), each of its steps right after the real one,
    its on-CPU time is the Python and kernel-launch overhead of those operations, then and there."""
    tiny = dataclasses.replace(cfg, hidden=2 * cfg.heads, ffn=8)
    return _silent_shard(tiny, build_model(tiny, 0, dtype), ctx)


def _silent_shard(cfg, w, ctx) -> DecoderShard:
    """This rank's tensor-parallel shard of ``w`` with its all-reduces skipped (a twin's)."""
    sh = DecoderShard(cfg, w, tp_rank=ctx.rank, tp_size=ctx.world_size, device=ctx.device)
    sh.tp.skip_sites = frozenset({"attn.g", "mlp.g"})  # a decode step's only collectives
    sh.tp.spans, sh.tp.thread_waits = [], False  # timed as the decode's are: reading the clocks costs it what it costs the decode
    return sh


def compute_twin(cfg, w, dtype: torch.dtype, ctx) -> DecoderShard:
    """This rank's tensor-parallel shard, full width, its all-reduces skipped: the decode's compute
    without its communication. Run as the decode's twin, each of its steps right after the real one,
    its on-CPU time is the compute (and the per-operation overhead) measured on its own, then and
    there: in the same seconds, on the same cores as the decode."""
    sh = _silent_shard(cfg, w, ctx)
    if sh.dtype != dtype:
        raise RuntimeError(f"the compute twin holds {sh.dtype}, the decode {dtype}")
    return sh


def _timed_together(timed: list[tuple[dict, list]], k: int) -> tuple[dict, list]:
    """The timed decodes ``timed`` (each :func:`generate`'s result and its all-reduces' spans, the first
    ``k`` the prefill's) as one: the first's tokens, the windows summed (``prefills`` of them, and
    every decode step), the spans of every prefill first, then of every decode step."""
    first = timed[0][0]
    twins = len(first.get("twin_windows", ()))
    r = {**first, "prefills": len(timed), "prefill_s": sum(t["prefill_s"] for t, _ in timed) / len(timed),
         "decode_s": sum(t["decode_s"] for t, _ in timed), "decode_steps": sum(t["decode_steps"] for t, _ in timed),
         "prefill_window": Window.total([t["prefill_window"] for t, _ in timed]),
         "decode_window": Window.total([t["decode_window"] for t, _ in timed]),
         "twin_windows": [tuple(Window.total([t["twin_windows"][i][phase] for t, _ in timed]) for phase in (0, 1))
                          for i in range(twins)]}
    return r, [s for _, spans in timed for s in spans[:k]] + [s for _, spans in timed for s in spans[k:]]


def serving_checks(cfg, prompts, n: int, r: dict, spans: list, k: int,
                   dtype: torch.dtype, ctx) -> list[Check]:
    """TTFT (the batch's prefill) and TPOT (a decode step) of the tensor-parallel decode ``r``
    against the planner (``planner.ttft``, ``planner.tpot``) on this machine's measured hardware;
    ``spans``: its all-reduces (the first ``k`` the prefills', as the meter counted them; ``r`` may sum
    ``r["prefills"]`` timed decodes, :func:`_timed_together`, and TTFT is then a prefill's mean). Causes,
    each measured on its own: the per-operation overhead (the twin's on-CPU time, step by step beside
    the decode), compute slower than the roofline (:func:`compute_twin`'s on-CPU time, the same steps
    without communication beside the decode, less the overhead, beyond the roofline), CPU contention
    (the decode's run-queue delay and its gloo threads' longest wait over each phase,
    ``Window.backend_wait_s``), waiting for a peer, all-reduces slower than α-β (their spans, that
    wait apart), and the compute slower in the decode than beside it (the decode's own on-CPU time
    outside its all-reduces, ``on_cpu_s`` in the detail, beyond the compute twin's: the same work on
    the same cores, run between gloo's all-reduces and their caches). The figures are the slowest
    rank's (every rank returns the same checks)."""
    B, s = prompts.shape
    W, steps = ctx.world_size, max(1, r["decode_steps"])
    hw = this_machine(cfg, prompts, dtype, ctx)
    elem = torch.empty((), dtype=dtype).element_size()
    ab = [f7.ring_allreduce_time((B * s if i < k else B) * cfg.hidden * elem, W, hw.alpha, 1 / hw.link_bandwidth)
          for i in range(len(spans))]
    found = collective_causes(spans, ab)
    waits, slow, in_comm = found["peer_wait"], found["slow"], found["on_cpu"]  # in_comm: part of α-β
    # the decode's wait for a core, in its all-reduces the longest any rank had there (out of their slowness)
    queued = [step_contention(w.run_queue_s, spans[part], found["contention"][part])
              for w, part in ((r["prefill_window"], slice(0, k)), (r["decode_window"], slice(k, None)))]
    for name, window, part in (("ttft", r["prefill_window"], slice(0, k)), ("tpot", r["decode_window"], slice(k, None))):
        trace_causes(ctx.events, window.blocks, spans[part], waits[part], names="all_reduce", check=name)
    p, d = r["prefill_window"], r["decode_window"]
    (tp_, td), (cp, cd) = r["twin_windows"]  # the overhead twin's, the compute twin's
    # the spans carry no gloo-thread waits (reading every thread at every all-reduce cost the decode more CPU than
    # its twins): gloo's threads' waits over each phase are its all-reduces' contention, out of their slowness
    prefills = r.get("prefills", 1)  # TTFT: a prefill's mean
    # the trace keeps the first blocks of the decode steps (Window.blocks): their waits, for what it draws
    drawn = len(d.blocks)
    drawn_wait = sum(waits[k:k + drawn * (len(spans) - k) // steps]) / max(1, drawn)
    mine = {"ttft": tuple(x / prefills for x in (
                p.wall_s, tp_.cpu_s, cp.cpu_s - tp_.cpu_s, queued[0] + p.backend_wait_s, sum(waits[:k]),
                sum(slow[:k]) - p.backend_wait_s, p.cpu_s - sum(in_comm[:k]), sum(waits[:k]))),
            "tpot": (d.wall_s / steps, td.cpu_s / steps, (cd.cpu_s - td.cpu_s) / steps,
                     (queued[1] + d.backend_wait_s) / steps, sum(waits[k:]) / steps,
                     (sum(slow[k:]) - d.backend_wait_s) / steps, (d.cpu_s - sum(in_comm[k:])) / steps, drawn_wait)}
    everyone: list[Any] = [mine]
    if W > 1:
        everyone = [None] * W
        dist.all_gather_object(everyone, mine)
    m = ModelSpec(params=decode_params(cfg), layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads,
                  kv_heads=cfg.group_heads, head_dim=cfg.head_dim, dtype_bytes=elem)
    decode_load = planner.Workload(prompt=s, output=n)
    n_stage, w_stage, _layers = planner.stage_params(m, W, 1)
    planned = {"ttft": (planner.ttft(m, hw, planner.Workload(prompt=B * s, output=n), W, 1),
                        f7.prefill_time(n_stage, B * s, w_stage, hw.flops, hw.bandwidth)),
               "tpot": (planner.tpot(m, hw, decode_load, W, 1, B)[0],
                        planner.stage_decode_time(m, hw, decode_load, W, 1, B)["roofline"])}
    out = []
    for name in ("ttft", "tpot"):
        rank = max(range(len(everyone)), key=lambda i: everyone[i][name][0])
        measured, overhead, computed, delayed, waited, slower, on_cpu, waited_drawn = everyone[rank][name]  # computed: less overhead
        predicted, roofline = planned[name]
        out.append(check(name, predicted, measured, "s",
                         causes={"op_overhead": overhead, "slow_compute": computed - roofline,
                                 "compute_in_decode": on_cpu - (computed + overhead),
                                 "cpu_contention": delayed, "peer_wait": waited, "slow_collective": slower},
                         detail={"rank": rank, "on_cpu_s": on_cpu, "peer_wait_drawn_s": waited_drawn, "compute_alone_s": computed + overhead, "roofline_s": roofline,
                                 "flops": hw.flops,
                                 "bandwidth": hw.bandwidth, "alpha_s": hw.alpha,
                                 "beta_s_per_byte": 1 / hw.link_bandwidth, "batch": B, "prompt": s}))
    return out


# ----------------------------------------------------------------------------------------------
# 3. paged vs contiguous, and the cost model
# ----------------------------------------------------------------------------------------------

def paged_vs_contiguous(cfg, w, args, ctx) -> dict:
    reqs = poisson_requests(args.requests, args.arrival_rate, prompt_range=(4, 32), output_range=(2, 48),
                            seed=args.seed + 7, vocab=cfg.vocab)
    max_len = max(r.prompt_len + r.output_len - 1 for r in reqs)
    runs = {}
    for name in ("contiguous", "paged"):
        sh = DecoderShard(cfg, w, device=ctx.device)
        if name == "paged":
            sh.cache = paged_store(sh, args.kv_budget // args.block_size, args.block_size)
        else:
            sh.cache = contiguous_store(sh, max(1, args.kv_budget // max_len), max_len)
        runs[name] = ContinuousBatcher(sh, max_batch=args.max_batch, events=ctx.events).run(reqs)
        runs[name].bytes_per_token = sh.cache.bytes_per_token
        runs[name].storage_bytes = sh.cache.storage_bytes
    # unlimited memory: how much KV each needs at its peak for the same mix (pure model, same scheduler)
    out = {"tokens_equal": runs["paged"].tokens == runs["contiguous"].tokens, "max_len": max_len,
           "requests": len(reqs), "block_size": args.block_size, "kv_budget_tokens": args.kv_budget}
    for name, run in runs.items():
        ws = run.waste()
        ttft = sorted(r["ttft_s"] for r in run.requests)
        out[name] = {"waste_fraction": ws["waste_fraction"], "peak_reserved_tokens": ws["peak_reserved_tokens"],
                     "peak_stored_tokens": ws["peak_stored_tokens"], "iterations": ws["iterations"],
                     "mean_running": ws["mean_batch"], "tokens_per_s": run.tokens_per_s, "wall_s": run.wall_s,
                     "preemptions": sum(len(s.preempted) for s in run.snapshots),
                     "storage_bytes": run.storage_bytes, "bytes_per_token": run.bytes_per_token,
                     "ttft_p50_s": routing.percentile(ttft, 50), "ttft_p99_s": routing.percentile(ttft, 99),
                     "max_running": max(len(s.running) + len(s.finished) for s in run.snapshots)}
    out["throughput_ratio"] = out["paged"]["tokens_per_s"] / out["contiguous"]["tokens_per_s"]
    KV_COMPARE.emit_fields(ctx.events, out)
    return out


def prefix_sharing(cfg, w, args, ctx) -> dict:
    """The same shared-system-prompt workload without and with prefix sharing, same KV memory."""
    reqs = poisson_requests(args.requests, args.arrival_rate, prompt_range=(4, 24), output_range=(2, 24),
                            seed=args.seed + 9, vocab=cfg.vocab, system_prompt=args.system_prompt)
    res = compare_prefix_sharing(lambda: DecoderShard(cfg, w, device=ctx.device), reqs,
                                 args.kv_budget // args.block_size, args.block_size, args.max_batch, ctx.events)
    res.pop("runs")
    return res


@torch.no_grad()
def measure_costs(cfg, w, device, repeats: int = 5) -> dict:
    """Time the real model: prefill of one prompt per length, one decode step per batch size."""
    sh = DecoderShard(cfg, w, device=device)
    lengths, batches = (16, 64, 128, 256), (1, 4, 16, 32)
    cache = sh.cache = KVStore(BlockAllocator(64, 128), cfg.layers, sh.kv_local, cfg.head_dim, sh.dtype, device)

    def timed(fn):
        best = float("inf")
        for _ in range(repeats):
            for q in list(cache.alloc.tables):
                cache.alloc.free(q)
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    g = torch.Generator().manual_seed(0)
    prefill = []
    for n in lengths:
        ids = torch.randint(0, cfg.vocab, (1, n), generator=g).to(device)
        prefill.append((n, timed(lambda: sh.forward(ids, [0], [0]))))
    decode = []
    ctx_len = 48
    for b in batches:
        ids = torch.randint(0, cfg.vocab, (b, ctx_len), generator=g).to(device)
        last = torch.randint(0, cfg.vocab, (b, 1), generator=g).to(device)

        def step():
            cache.alloc.lengths.clear()
            for q in range(b):
                cache.reserve(q, ctx_len + 1)
            sh.forward(last, list(range(b)), [ctx_len] * b)

        decode.append((b, timed(step)))
    return {"prefill": prefill, "decode": decode, "decode_context": ctx_len}


# ----------------------------------------------------------------------------------------------
# 4. routing
# ----------------------------------------------------------------------------------------------

def routing_comparison(args, points: dict | None, ev) -> dict:
    shape: dict[str, Any]
    if args.cost == "measured":
        assert points is not None  # measured on the real model before routing runs
        cost = routing.CostModel.fit(points["prefill"], points["decode"], "measured")
        shape = dict(prefixes=16, prefix_len=128, suffix_range=(8, 32), mean_output=16, max_output=64)
    else:  # Llama-2-70B on TP=4 H100s, 4,096-token contexts
        kv = f7.kv_cache_total(80, 8, 128, 2, 4096, tp=4)["per_gpu_bytes"]
        cost = routing.CostModel.roofline(69e9 / 4, 2 * 69e9 / 4, kv, 989e12, 3.35e12)
        shape = dict(prefixes=16, prefix_len=1024, suffix_range=(64, 512), mean_output=128, max_output=1024)
    probe = routing.poisson_workload(args.route_requests, 1.0, seed=args.seed + 11, **shape)
    batch = max(1, args.max_batch // 2)
    per_req = sum(cost.prefill(r.prompt_len) + (r.output_len - 1) * cost.decode(batch) / batch for r in probe)
    per_req = max(per_req / len(probe), 1e-9)
    rate = args.load * args.replicas / per_req
    reqs = routing.poisson_workload(args.route_requests, rate, seed=args.seed + 11, **shape)
    res = routing.compare(reqs, args.replicas, cost, max_batch=args.max_batch, prefix_slots=args.prefix_slots)
    for policy, r in res.items():
        for row in r["requests"]:
            ROUTE.emit(ev, {"policy": policy, "rid": row["rid"], "replica": row["replica"],
                            "prefix_hit": row["prefix_hit"], "arrival": row["arrival"], "ttft_s": row["ttft_s"],
                            "tpot_s": row["tpot_s"]})
        ROUTING.emit_fields(ev, {"policy": policy, "replicas": args.replicas, "cost_source": cost.source,
                                 **r["metrics"]})
    plen = shape["prefix_len"] + sum(shape["suffix_range"]) // 2
    examples = {"prefix_len": shape["prefix_len"], "prefill_prefix_s": cost.prefill(shape["prefix_len"]),
                "prompt_len": plen, "prefill_prompt_s": cost.prefill(plen), "decode_1_s": cost.decode(1),
                "max_batch": args.max_batch, "decode_max_s": cost.decode(args.max_batch)}
    return {"cost": cost.as_dict(), "cost_examples": examples, "rate_per_s": rate, "load": args.load, "replicas": args.replicas,
            "requests": len(reqs), "policies": {p: r["metrics"] for p, r in res.items()}}


# ----------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------

def _fmt_bytes(n: float, lang: str = "en") -> str:
    from ...lessons.units import format_bytes

    return format_bytes(n, binary=True, lang=lang)


def _ms(x, lang: str = "en"):
    return f"{format_fixed(x * 1e3, 1, lang)} ms"


# ---------------------------------------------------------------------------------- the report
# Rank 0's printed lines, in the learner's language (``lang``, else the run's), from summary.toml.

def _say(lang: str | None) -> tuple[Any, str]:
    lang = lang or run_language()
    return summary_lines("lesson7", lang), lang


def head_lines(cfg, params: float, dtype: str, W: int, backend: str, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    return [say("head", params=format_count(params, 3, lang), L=cfg.layers, h=cfg.hidden, heads=cfg.heads,
                kv_heads=cfg.group_heads, dtype=dtype), say("served", W=W, backend=backend)]


def tp_lines(out: dict, W: int, layers: int, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    b = lambda n: _fmt_bytes(n, lang)  # noqa: E731
    n = out["all_reduces_per_token"]
    lines = ["\n" + say("tp", W=W, eq="=" if out["equal"] else "≠", n=format_plain(n, lang))]
    if W > 1:
        lines.append(say("tp_each", two_l=2 * layers, size=b(out["all_reduce_bytes_per_token"] / max(1, n))))
    lines += [say("tp_rank", r=r, heads=sh["kv_heads"], cache=b(sh["kv_bytes"]), formula=b(sh["formula_bytes"]))
              for r, sh in enumerate(out["shards"])]
    return lines


def pp_lines(out: dict, W: int, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    lines = ["\n" + say("pp", W=W, m=out["microbatches"], eq="=" if out["equal"] else "≠")]
    for r, sh in enumerate(out["shards"]):
        sends = say("sends", n=format_plain(sh["sends_per_token"], lang)) if r < W - 1 else say("back")
        lines.append(say("pp_stage", r=r, first=sh["layers"][0], last=sh["layers"][-1],
                         cache=_fmt_bytes(sh["kv_bytes"], lang), formula=_fmt_bytes(sh["formula_bytes"], lang),
                         sends=sends))
    return lines


def mesh_lines(out: dict, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    lines = ["\n" + say("mesh", tp=out["tp"], pp=out["pp"], m=out["microbatches"], eq="=" if out["equal"] else "≠")]
    for r, sh in enumerate(out["shards"]):
        heads = sh["kv_heads"]
        lines += [say("mesh_rank", r=r, stage=sh["stage"], tp=sh["tp_rank"], first=sh["layers"][0],
                      last=sh["layers"][-1], h0=heads[0], h1=heads[-1], cache=_fmt_bytes(sh["kv_bytes"], lang),
                      formula=_fmt_bytes(sh["formula_bytes"], lang)),
                  say("mesh_all_reduces", n=format_plain(sh["all_reduces_per_token"], lang), layers=len(sh["layers"]),
                      m=out["microbatches"], expected=format_plain(sh["expected_per_token"], lang))]
    return lines


def kv_lines(kv: dict, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    p, c = kv["paged"], kv["contiguous"]
    pct = lambda x: format_fixed_percent(x, 1, lang)  # noqa: E731
    return ["\n" + say("kv", requests=kv["requests"], budget=kv["kv_budget_tokens"],
                        same=say("identical" if kv["tokens_equal"] else "different")),
            say("kv_contiguous", regions=max(1, kv["kv_budget_tokens"] // kv["max_len"]), max_len=kv["max_len"],
                waste=pct(c["waste_fraction"]), running=c["max_running"]),
            say("kv_iterations", n=c["iterations"], rate=format_integer(c["tokens_per_s"], lang)),
            say("kv_paged", block=kv["block_size"], waste=pct(p["waste_fraction"]), running=p["max_running"],
                preemptions=p["preemptions"]),
            say("kv_paged_iterations", n=p["iterations"], rate=format_integer(p["tokens_per_s"], lang),
                ratio=format_fixed(kv["throughput_ratio"], 2, lang))]


def prefix_lines(px: dict, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    a, b = px["no-sharing"], px["prefix"]
    pct = lambda x: format_fixed_percent(x, 0, lang)  # noqa: E731
    return ["\n" + say("prefix", requests=px["requests"], system=px["system_prompt"],
                        same=say("identical" if px["tokens_equal"] else "different")),
            say("prefix_blocks", mean=format_integer(b["mean_blocks"], lang),
                logical=format_integer(b["logical_blocks_mean"], lang), saved=pct(b["memory_saved"])),
            say("prefix_peak", peak=b["peak_blocks"], size=_fmt_bytes(b["peak_kv_bytes"], lang), other=a["peak_blocks"],
                other_size=_fmt_bytes(a["peak_kv_bytes"], lang)),
            # prefill = looked up − found cached; the unshared run's beyond the prompts is recomputation
            say("prefix_prefill", tokens=format_integer(b["prefill_tokens"], lang),
                looked=format_integer(b["looked_up_tokens"], lang), reused=format_integer(b["reused_tokens"], lang),
                other=format_integer(a["prefill_tokens"], lang), hit=pct(b["hit_rate"]),
                recomputed=format_integer(a["prefill_tokens"] - px["prompt_tokens"], lang), cow=b["cow"],
                evicted=b["evicted"]),
            say("prefix_ttft", ttft=_ms(b["ttft_p50_s"], lang), other=_ms(a["ttft_p50_s"], lang),
                ratio=format_fixed(px["ttft_ratio"], 1, lang))]


def routing_lines(rt: dict, lang: str | None = None) -> list[str]:
    say, lang = _say(lang)
    ex, ms = rt["cost_examples"], lambda x: _ms(x, lang)
    lines = ["\n" + say("routing", replicas=rt["replicas"], requests=rt["requests"],
                         rate=format_fixed(rt["rate_per_s"], 1, lang), load=format_plain(rt["load"], lang),
                         source=say("sources." + rt["cost"]["source"])),
             say("routing_costs", prefix=ex["prefix_len"], prefill_prefix=ms(ex["prefill_prefix_s"]),
                 prompt=ex["prompt_len"], prefill_prompt=ms(ex["prefill_prompt_s"]), one=ms(ex["decode_1_s"]),
                 b=ex["max_batch"], full=ms(ex["decode_max_s"])),
             f"  {say('policy'):<18} {'TTFT p50/p99 ms':>15} {'TPOT p50/p99 ms':>15} {'tokens/s':>8} {say('hits'):>5}"]
    f1 = lambda x: format_fixed(x * 1e3, 1, lang)  # noqa: E731
    for policy, mtr in rt["policies"].items():
        ttft = f"{f1(mtr['ttft_p50_s'])}/{f1(mtr['ttft_p99_s'])}"
        tpot = f"{f1(mtr['tpot_p50_s'])}/{f1(mtr['tpot_p99_s'])}"
        lines.append(f"  {policy:<18} {ttft:>15} {tpot:>15} {format_integer(mtr['throughput_tokens_per_s'], lang):>8} "
                     f"{format_fixed_percent(mtr['prefix_hit_rate'], 0, lang):>5}")
    return lines


def main(argv: list[str] | None = None) -> int:
    return run_experiment("lesson7", build_parser().parse_args, run, argv, usage_errors=(ModelConfigError,),
                          check=lambda args: _parts(args, ModelSize.from_args(args, DEFAULT_MODEL), launch_world_size()))


def _parts(args: argparse.Namespace, cfg: ModelSize, W: int) -> tuple[tuple[int, int] | None, set[str]]:
    """The (tp, pp) mesh asked for (or None) and the parts to skip, checked against the model."""
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    try:
        mesh, skip = check_decode_parts(cfg, args, W, skip)
    except TranslatedError as exc:
        raise UsageError(texts=exc.texts) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.system_prompt < 1:
        raise UsageError.keyed("system_prompt", value=args.system_prompt)
    bad = skip - {"tp", "pp", "paged", "prefix", "routing"}
    if bad:
        raise UsageError.keyed("skip", part=repr(sorted(bad)[0]))
    return mesh, skip


def _tp_part(cfg: ModelSize, w, prompts, args: argparse.Namespace, ref: dict, ctx) -> dict:
    """Tensor-parallel decode over all ranks: its summary (:func:`tp_lines` reports it)."""
    ev, W = ctx.events, ctx.world_size
    PHASE.emit(ev, {"name": "tensor-parallel decode"})
    tp = tp_decode(cfg, w, prompts, args.new_tokens, ref, ctx)
    shards: list[Any] = [None] * W
    dist.all_gather_object(shards, {k: tp[k] for k in ("kv_bytes", "formula_bytes", "kv_heads")})
    out = {k: tp[k] for k in ("equal", "all_reduces_per_token", "expected_per_token",
                          "all_reduce_bytes_per_token", "decode_tokens_per_s")}
    out["shards"] = shards
    return out


def _pp_part(cfg: ModelSize, w, prompts, args: argparse.Namespace, ref: dict, ctx) -> dict:
    """Pipeline-parallel decode over all ranks: its summary (:func:`pp_lines` reports it)."""
    ev, W = ctx.events, ctx.world_size
    PHASE.emit(ev, {"name": "pipeline-parallel decode"})
    m = args.microbatches or W
    pp = pp_decode(cfg, w, prompts, args.new_tokens, ref, ctx, m)
    shards: list[Any] = [None] * W
    dist.all_gather_object(shards, {k: pp[k] for k in ("kv_bytes", "formula_bytes", "layers", "sends_per_token")})
    out = {k: pp[k] for k in ("equal", "microbatches", "decode_tokens_per_s")}
    out["shards"] = shards
    return out


def _mesh_part(cfg: ModelSize, w, prompts, args: argparse.Namespace, ref: dict, ctx, mesh: tuple[int, int]) -> dict:
    """Tensor × pipeline parallel decode on a (pp, tp) mesh: its summary (:func:`mesh_lines` reports it)."""
    ev, W = ctx.events, ctx.world_size
    tp_deg, pp_deg = mesh
    PHASE.emit(ev, {"name": "tensor × pipeline parallel decode"})
    mp = mesh_decode(cfg, w, prompts, args.new_tokens, ref, ctx, tp_deg, pp_deg, args.microbatches or pp_deg)
    shards: list[Any] = [None] * W
    dist.all_gather_object(shards, {k: mp[k] for k in ("stage", "tp_rank", "kv_bytes", "formula_bytes", "layers",
                                                       "kv_heads", "all_reduces_per_token", "expected_per_token")})
    out = {"equal": mp["equal"], "tp": tp_deg, "pp": pp_deg, "microbatches": mp["microbatches"],
           "decode_tokens_per_s": mp["decode_tokens_per_s"], "shards": shards}
    return out


def _kv_part(cfg: ModelSize, w, args: argparse.Namespace, ctx, skip: set[str], summary: dict) -> dict | None:
    """Paged vs contiguous KV cache (rank 0) and the measured costs (last rank) the routing part
    reads; returns those costs (None: the analytic ones)."""
    ev, W, rank = ctx.events, ctx.world_size, ctx.rank
    points = None
    if "paged" not in skip or "routing" not in skip:
        PHASE.emit(ev, {"name": "paged vs contiguous KV cache" if "paged" not in skip else "measuring costs"})
        kv = None
        if rank == 0 and "paged" not in skip:
            kv = paged_vs_contiguous(cfg, w, args, ctx)
        if rank == W - 1 and args.cost == "measured" and "routing" not in skip:
            points = measure_costs(cfg, w, ctx.device)
        box = [points]
        if W > 1:
            dist.broadcast_object_list(box, src=W - 1)
        points = box[0]
        if rank == 0 and points is not None:
            COST_MODEL.emit_fields(ev, points)
        if kv is not None:
            summary["kv"] = kv
    return points


def _prefix_part(cfg: ModelSize, w, args: argparse.Namespace, ctx) -> dict:
    """Prefix sharing on rank 0: its summary (:func:`prefix_lines` reports it)."""
    ev = ctx.events
    PHASE.emit(ev, {"name": "prefix sharing"})
    return prefix_sharing(cfg, w, args, ctx)


def _routing_part(args: argparse.Namespace, points: dict | None, ctx) -> dict:
    """Routing across replicas on rank 0: its summary (:func:`routing_lines` reports it)."""
    ev = ctx.events
    PHASE.emit(ev, {"name": "routing across replicas"})
    return routing_comparison(args, points, ev)


def run(ctx, args: argparse.Namespace) -> tuple[dict | None, int]:
    ev, W, rank = ctx.events, ctx.world_size, ctx.rank
    if ctx.device.type == "cpu":
        torch.set_num_threads(1)
    cfg = ModelSize.from_args(args, DEFAULT_MODEL)
    mesh, skip = _parts(args, cfg, W)
    t0 = time.time()
    dtype = DTYPES[args.dtype]
    w = build_model(cfg, args.seed, dtype)
    CONFIG.emit(ev, {"W": W, "hidden": cfg.hidden, "layers": cfg.layers, "heads": cfg.heads,
                     "kv_heads": cfg.group_heads, "head_dim": cfg.head_dim, "vocab": cfg.vocab, "norm": cfg.norm,
                     "dtype": args.dtype, "device": ctx.device.type, "batch": args.batch, "prompt": args.prompt,
                     "new_tokens": args.new_tokens, "block_size": args.block_size, "kv_budget": args.kv_budget,
                     "params": decode_params(cfg), "tp": mesh[0] if mesh else None, "pp": mesh[1] if mesh else None})
    prompts = torch.randint(0, cfg.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(args.seed + 1))
    # with what each part adds, all its printed report says: runs show writes it again from this event
    summary: dict = {"lesson": "lesson7", "W": W, "device": ctx.device.type, "dtype": args.dtype,
                     "backend": ctx.backend, "params": decode_params(cfg),
                     **{k: getattr(cfg, k) for k in ("layers", "hidden", "heads", "group_heads")}}
    PHASE.emit(ev, {"name": "single-process reference"})
    ref = single_process(cfg, w, prompts, args.new_tokens, ctx.device, ev, rank)
    summary["single"] = {"decode_tokens_per_s": args.batch * ref["decode_steps"] / ref["decode_s"]}

    if "tp" not in skip:
        summary["tp"] = _tp_part(cfg, w, prompts, args, ref, ctx)
    if "pp" not in skip:
        summary["pp"] = _pp_part(cfg, w, prompts, args, ref, ctx)
    if mesh is not None:
        summary["tp_pp"] = _mesh_part(cfg, w, prompts, args, ref, ctx, mesh)
    points = _kv_part(cfg, w, args, ctx, skip, summary)
    if "prefix" not in skip and rank == 0:
        summary["prefix"] = _prefix_part(cfg, w, args, ctx)
    if "routing" not in skip and rank == 0:
        summary["routing"] = _routing_part(args, points, ctx)
    summary["seconds"] = time.time() - t0
    ok = all(summary.get(k, {}).get("equal", True) for k in ("tp", "pp", "tp_pp")) and \
        all(summary.get(k, {}).get("tokens_equal", True) for k in ("kv", "prefix"))
    summary["ok"] = ok
    if rank == 0:
        print(summary_from_event(summary))
    return (summary if rank == 0 else None), 0 if ok else 1


def summary_from_event(summary: dict, lang: str | None = None) -> str:
    """Rank 0's printed report from its summary event alone (``distai runs show`` writes it again in
    another language), in ``lang`` (else the run's): the model, then each part the run did, in order."""
    from types import SimpleNamespace

    say, lang = _say(lang)
    W, cfg = summary["W"], SimpleNamespace(**{k: summary[k] for k in ("layers", "hidden", "heads", "group_heads")})
    lines = head_lines(cfg, summary["params"], summary["dtype"], W, summary["backend"], lang)
    if "tp" in summary:
        lines += tp_lines(summary["tp"], W, cfg.layers, lang)
    if "pp" in summary:
        lines += pp_lines(summary["pp"], W, lang)
    if "tp_pp" in summary:
        lines += mesh_lines(summary["tp_pp"], lang)
    for part, write in (("kv", kv_lines), ("prefix", prefix_lines), ("routing", routing_lines)):
        if part in summary:
            lines += write(summary[part], lang)
    return "\n".join(lines) + "\n\n" + say("seconds", s=format_fixed(summary["seconds"], 1, lang))


if __name__ == "__main__":
    exit_with(main)
