"""Choosing a serving configuration: TP × PP × replicas for G GPUs, ranked by throughput within the SLO.

For every split ``tp · pp · replicas = G`` the planner

1. **checks the shape**: ``tp`` must divide the query heads and divide, or be a multiple of, the KV
   heads (:func:`~.formulas.kv_heads_per_gpu`); ``pp`` at most the layers;
2. **checks the fit**: per GPU, the weights of the busiest stage ``W·⌈L/pp⌉/L / tp`` must fit in the
   usable memory (``gpu_memory · memory_util``, vLLM's ``gpu_memory_utilization``, default 0.9), and
   what is left must hold the KV cache of at least one sequence of ``prompt + output`` tokens
   (:func:`~.formulas.kv_cache_total`, sharded by heads and layers); the sequences a replica can keep
   in flight are ``⌊free / KV per sequence⌋`` (:func:`~.formulas.max_kv_tokens`);
3. **estimates TTFT** with the roofline (:func:`~.formulas.prefill_time` on each stage's share of the
   parameters and weights, plus the tensor-parallel all-reduces of the prompt's activations,
   :func:`~.formulas.tp_decode_comm_time` with ``batch = prompt`` tokens, plus one hop per stage
   boundary), for one prompt on an idle replica — no queueing;
4. **estimates TPOT**: with ``n`` sequences in flight, cut into ``m = min(n, pp)`` microbatches of
   ``b = ⌈n/m⌉``, one stage's decode step is :func:`~.formulas.decode_time_per_token` (max of compute
   ``2·N_stage·b / peak`` and memory ``(W_stage + b·KV_stage) / bandwidth``, the KV at the mean context
   ``prompt + output/2``) plus its layers' 2 all-reduces per layer (:func:`~.formulas.tp_decode_comm_time`)
   plus a hop of ``b·hidden`` values (on the node's link when the replica fits in a node, else on the
   inter-node link); a token passes all ``pp`` stages, so ``TPOT = pp · stage time``;
5. **picks the batch**: the ``n`` (at most the memory's limit and ``max_batch``) with the most output
   tokens per second ``replicas · n / TPOT`` whose TPOT meets the SLO;
6. **ranks** the configurations that meet both targets by throughput; every other one keeps the
   reason it failed (``shape``, ``memory``, ``ttft`` or ``tpot``).

The model is deliberately simple — ideal overlap, no queueing, no prefill/decode interference, ring
all-reduces in the α-β model (:func:`distai.lessons.lesson1.formulas.ring_allreduce_time`; tensor
parallelism wider than a node uses the inter-node link) — so it ranks configurations and explains
why one wins; measure the winners. Pure Python.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import units
from ..model_size import Refusal, explain_texts, refusals
from ..model_spec import ModelSpec
from ..strings import LANGUAGES, translated
from . import formulas as f

REASONS = ("shape", "memory", "ttft", "tpot")
MESSAGE_ALPHA = 5e-6  # s, one message inside a node (a pipeline hop): NCCL's Simple protocol's scale


@dataclass(frozen=True)
class Hardware:
    gpus: int
    gpu_memory: float  # bytes
    bandwidth: float  # memory bandwidth, B/s
    flops: float = 989e12  # peak dense FLOP/s (H100 SXM bf16)
    link_bandwidth: float = 450e9  # tensor-parallel link, B/s per direction (NVLink 4)
    alpha: float = MESSAGE_ALPHA  # latency per message inside a node, s: pipeline hops, and all-reduce steps without nccl_allreduce
    nccl_allreduce: bool = True  # TP all-reduces inside a node as NCCL's tuner prices them (its LL protocol for
    #                              small messages); False: the α-β ring with ``alpha`` (a measured link, or gloo)
    internode_bandwidth: float = 50e9  # between nodes (400 Gb/s), B/s: pipeline hops, TP wider than a node
    internode_alpha: float = 10e-6
    gpus_per_node: int = 8
    memory_util: float = 0.9


@dataclass(frozen=True)
class Workload:
    prompt: int = 2048
    output: int = 2048
    ttft_slo: float = 1.0
    tpot_slo: float = 0.05
    max_batch: int = 256  # sequences in flight per replica (vLLM's max_num_seqs)


@dataclass
class Candidate:
    tp: int
    pp: int
    replicas: int
    accepted: bool = False
    reason: str | None = None  # "shape" | "memory" | "ttft" | "tpot"
    detail: str = ""  # in English; detail_text: in each language {"en": ..., "es": ...}
    detail_text: dict = field(default_factory=dict)
    weights_per_gpu_bytes: float | None = None
    usable_bytes: float | None = None
    free_bytes: float | None = None
    kv_per_seq_per_gpu_bytes: float | None = None
    max_seqs: int | None = None  # sequences per replica that fit
    batch: int | None = None  # sequences in flight per replica (chosen)
    microbatches: int | None = None
    microbatch_size: int | None = None
    batch_limit: str | None = None  # "memory" | "max-batch" | "tpot"
    kv_per_gpu_bytes: float | None = None  # at the chosen batch, full context
    ttft_s: float | None = None
    tpot_s: float | None = None
    tpot_at_1_s: float | None = None
    stage_time_s: float | None = None
    comm_per_token_s: float | None = None  # TP all-reduces per token, whole model
    hop_s: float | None = None
    decode_bound: str | None = None  # "memory-bandwidth" | "compute"
    throughput_tokens_per_s: float | None = None
    throughput_per_gpu: float | None = None
    requests_per_s: float | None = None
    curve: list = field(default_factory=list)  # [(n, tpot_s, tokens_per_s)] over batch sizes

    def as_dict(self, curve: bool = False) -> dict:
        d = asdict(self)
        if not curve:
            d.pop("curve")
        return d


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_link(hw: Hardware, tp: int) -> tuple[float | None, float]:
    """(α, β) of the tensor-parallel all-reduce: the node's link, or the inter-node one when wider; α None
    inside a node with ``nccl_allreduce``: NCCL's own model (:func:`~.formulas.tp_decode_comm_time`)."""
    if tp <= hw.gpus_per_node:
        return (None if hw.nccl_allreduce else hw.alpha), 1.0 / hw.link_bandwidth
    return hw.internode_alpha, 1.0 / hw.internode_bandwidth


def stage_params(m: ModelSpec, tp: int, pp: int) -> tuple[float, float, int]:
    """(parameters, weight bytes) one GPU of the busiest stage holds, and its layers ⌈L/pp⌉."""
    layers = -(-m.layers // pp)
    share = layers / m.layers / tp
    return m.params * share, m.weight_bytes * share, layers


def hop_time(m: ModelSpec, hw: Hardware, tokens: int, tp: int, pp: int) -> float:
    """One stage-to-stage send of ``tokens · hidden`` values (0 without pipeline parallelism), on the
    node's link when the whole replica fits in a node, else on the inter-node link."""
    if pp == 1:
        return 0.0
    if tp * pp <= hw.gpus_per_node:
        return hw.alpha + tokens * m.hidden * m.activation_bytes / hw.link_bandwidth
    return hw.internode_alpha + tokens * m.hidden * m.activation_bytes / hw.internode_bandwidth


def stage_decode_time(m: ModelSpec, hw: Hardware, wl: Workload, tp: int, pp: int, b: int) -> dict:
    """One stage's decode step for a microbatch of ``b`` sequences: roofline + TP all-reduces + hop."""
    n_stage, w_stage, layers = stage_params(m, tp, pp)
    ctx_mean = wl.prompt + wl.output // 2
    kv_seq = f.kv_cache_total(m.layers, m.kv_heads, m.d, m.dtype_bytes, ctx_mean, tp, pp)["per_gpu_bytes"]
    compute = f.forward_flops(n_stage, b) / hw.flops
    memory = f.decode_step_bytes(w_stage, kv_seq, b) / hw.bandwidth
    roof = f.decode_time_per_token(n_stage, w_stage, kv_seq, hw.flops, hw.bandwidth, b)
    alpha, beta = _tp_link(hw, tp)
    comm = f.tp_decode_comm_time(layers, m.hidden, b, tp, alpha, beta, m.activation_bytes) if tp > 1 else 0.0
    hop = hop_time(m, hw, b, tp, pp)
    return {"time": roof + comm + hop, "roofline": roof, "comm": comm, "hop": hop,
            "bound": "compute" if compute > memory else "memory-bandwidth"}


def tpot(m: ModelSpec, hw: Hardware, wl: Workload, tp: int, pp: int, n: int) -> tuple[float, dict, int, int]:
    """TPOT with ``n`` sequences in flight on one replica: (TPOT, stage detail, microbatches, size)."""
    mb = min(n, pp)
    b = -(-n // mb)
    st = stage_decode_time(m, hw, wl, tp, pp, b)
    return pp * st["time"], st, mb, b


def ttft(m: ModelSpec, hw: Hardware, wl: Workload, tp: int, pp: int) -> float:
    """Prefill of one prompt on an idle replica: every stage in turn, with its TP all-reduces, + hops."""
    n_stage, w_stage, layers = stage_params(m, tp, pp)
    pre = f.prefill_time(n_stage, wl.prompt, w_stage, hw.flops, hw.bandwidth)
    alpha, beta = _tp_link(hw, tp)
    comm = f.tp_decode_comm_time(layers, m.hidden, wl.prompt, tp, alpha, beta, m.activation_bytes) if tp > 1 else 0.0
    return pp * (pre + comm) + (pp - 1) * hop_time(m, hw, wl.prompt, tp, pp)


def shape_refusals(m: ModelSpec, tp: int, pp: int) -> list[Refusal]:
    """The course's one shape check (:func:`~distai.lessons.model_size.refusals`) for serving: tp
    over the heads, the hidden size and the KV heads (split, or replicated when tp is a multiple of
    them), at most one pipeline stage per layer; the embedding and output layer are replicated and
    decode has no sequence parallelism, so the vocabulary and the sequence are not split."""
    return refusals(tp=tp, pp=pp, heads=m.heads, kv_heads=m.kv_heads, hidden=m.hidden, layers=m.layers)


def _texts(key: str, **fields) -> dict[str, str]:
    """A rejection's detail in every language (``lessons/catalog/calc.toml`` ``[<lang>.serve.detail]``);
    a field given as a function of the language (a number through ``units``) is called with it."""
    return {lang: translated("calc", f"serve.detail.{key}", lang,
                             **{k: v(lang) if callable(v) else v for k, v in fields.items()}) for lang in LANGUAGES}


def _bytes_apart(more: float, less: float):
    """Two sizes as the learner reads them, with the digits it takes for the larger to read larger
    (the pair formatted once per language)."""
    pairs = {lang: units.format_bytes_apart(more, less, lang) for lang in LANGUAGES}
    return (lambda lang: pairs[lang][0]), (lambda lang: pairs[lang][1])


def _ms(seconds: float, digits: int | None = None):
    ms = seconds * 1e3
    return lambda lang: (units.format_plain(ms, lang) if digits is None else units.format_fixed(ms, digits, lang)) + " ms"


def _detail(c: Candidate, texts: dict[str, str]) -> None:
    c.detail, c.detail_text = texts["en"], dict(texts)


def evaluate(m: ModelSpec, hw: Hardware, wl: Workload, tp: int, pp: int) -> Candidate:
    """One configuration: fit, TTFT, TPOT, the best batch within the TPOT target, throughput."""
    c = Candidate(tp, pp, hw.gpus // (tp * pp))
    found = shape_refusals(m, tp, pp)
    if found:
        c.reason = "shape"
        _detail(c, explain_texts(found))
        return c
    _n, w_gpu, _layers = stage_params(m, tp, pp)
    c.weights_per_gpu_bytes = w_gpu
    c.usable_bytes = hw.gpu_memory * hw.memory_util
    c.free_bytes = c.usable_bytes - w_gpu
    ctx = wl.prompt + wl.output
    kv_seq = f.kv_cache_total(m.layers, m.kv_heads, m.d, m.dtype_bytes, ctx, tp, pp)["per_gpu_bytes"]
    c.kv_per_seq_per_gpu_bytes = kv_seq
    if c.free_bytes <= 0:
        c.reason = "memory"
        usable = c.usable_bytes
        weights, usable_text = _bytes_apart(w_gpu, usable)
        _detail(c, _texts("weights", weights=weights, usable=usable_text,
                          util=lambda lang: units.format_fixed_percent(hw.memory_util, 0, lang),
                          memory=lambda lang: units.format_bytes(hw.gpu_memory, lang=lang)))
        return c
    per_token = kv_seq / ctx
    c.max_seqs = f.max_kv_tokens(c.free_bytes, per_token) // ctx
    if c.max_seqs < 1:
        c.reason = "memory"
        kv, free = _bytes_apart(kv_seq, c.free_bytes)
        _detail(c, _texts("kv", free=free, kv=kv, tokens=lambda lang: units.format_integer(ctx, lang)))
        return c
    c.ttft_s = ttft(m, hw, wl, tp, pp)
    limit = min(c.max_seqs, wl.max_batch)
    best = None
    for n in range(1, limit + 1):
        t, st, mb, b = tpot(m, hw, wl, tp, pp, n)
        thr = c.replicas * n / t
        if n == 1 or n & (n - 1) == 0 or n == limit:
            c.curve.append((n, t, thr))
        if n == 1:
            c.tpot_at_1_s = t
        if t <= wl.tpot_slo and (best is None or thr > best[0] * (1 + 1e-12)):
            best = (thr, n, t, st, mb, b)
    if best is None:  # even one sequence is too slow: report the batch-1 numbers
        t, st, mb, b = tpot(m, hw, wl, tp, pp, 1)
        best = (c.replicas / t, 1, t, st, mb, b)
        c.reason = "tpot"
        _detail(c, _texts("tpot", tpot=_ms(t, 1), target=_ms(wl.tpot_slo)))
    thr, n, t, st, mb, b = best
    c.batch, c.microbatches, c.microbatch_size, c.tpot_s = n, mb, b, t
    c.stage_time_s, c.hop_s, c.decode_bound = st["time"], st["hop"], st["bound"]
    c.comm_per_token_s = pp * st["comm"]
    c.throughput_tokens_per_s = thr
    c.throughput_per_gpu = thr / hw.gpus
    c.requests_per_s = thr / wl.output
    c.kv_per_gpu_bytes = kv_seq * n
    if c.reason is None:
        nxt = tpot(m, hw, wl, tp, pp, n + 1)[0] if n < limit else None
        c.batch_limit = ("tpot" if nxt is not None and nxt > wl.tpot_slo else
                         "memory" if n == c.max_seqs and c.max_seqs <= wl.max_batch else
                         "max-batch" if n == wl.max_batch else "tpot")
    if c.reason is None and c.ttft_s > wl.ttft_slo:
        c.reason = "ttft"
        _detail(c, _texts("ttft", ttft=_ms(c.ttft_s, 0), target=_ms(wl.ttft_slo)))
    c.accepted = c.reason is None
    return c


def enumerate_configs(gpus: int) -> list[tuple[int, int, int]]:
    """Every (tp, pp, replicas) with tp · pp · replicas = gpus."""
    return [(tp, pp, gpus // (tp * pp)) for tp in divisors(gpus) for pp in divisors(gpus // tp)]


def plan(m: ModelSpec, hw: Hardware, wl: Workload) -> dict:
    """All configurations for ``hw.gpus`` GPUs: ``accepted`` (best first) and ``rejected`` (with reasons)."""
    if hw.gpus < 1:
        raise ValueError("need at least one GPU")
    for name, v in (("gpu memory", hw.gpu_memory), ("bandwidth", hw.bandwidth), ("peak FLOP/s", hw.flops),
                    ("link bandwidth", hw.link_bandwidth), ("inter-node bandwidth", hw.internode_bandwidth),
                    ("TTFT target", wl.ttft_slo), ("TPOT target", wl.tpot_slo)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0")
    if not 0 < hw.memory_util <= 1:
        raise ValueError("memory utilisation must be in (0, 1]")
    cands = [evaluate(m, hw, wl, tp, pp) for tp, pp, _r in enumerate_configs(hw.gpus)]
    accepted = sorted([c for c in cands if c.accepted], key=lambda c: (-(c.throughput_tokens_per_s or 0), c.tpot_s))
    order: dict[str | None, int] = {r: i for i, r in enumerate(REASONS)}
    rejected = sorted([c for c in cands if not c.accepted],
                      key=lambda c: (order[c.reason], -(c.throughput_tokens_per_s or 0), c.tp, c.pp))
    return {"accepted": accepted, "rejected": rejected, "best": accepted[0] if accepted else None}


def llama2_70b(dtype_bytes: float = 2) -> ModelSpec:
    """Llama-2-70B: ≈69B parameters, 80 layers, hidden 8192, 64 query heads, 8 KV heads of 128
    (Touvron et al. 2023; the released config)."""
    return ModelSpec(params=69e9, layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, dtype_bytes=dtype_bytes)


def h100_node(gpus: int = 8) -> Hardware:
    """H100 SXM 80 GB: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16, NVLink 450 GB/s per direction."""
    return Hardware(gpus=gpus, gpu_memory=80e9, bandwidth=3.35e12, flops=989e12, link_bandwidth=450e9)


def fmt_reason(c: Candidate) -> str:
    return f"{c.reason}: {c.detail}" if c.reason else "ok"

