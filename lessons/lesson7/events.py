"""Lesson 7's run events (``engine/experiments/lesson7.py``, ``engine/paged_kv.py``): see
``lessons/events.py``. ``mode``: ``single`` (one process), ``tp``, ``pp`` or ``tp-pp``."""
from typing import Any, TypedDict

from ..events import Envelope, EventKind, NotRequired


class Config(Envelope):
    """The run: ``W`` ranks decoding a model of this shape (``tp``·``pp`` when both run)."""
    W: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    norm: str
    dtype: str
    device: str
    batch: int
    prompt: int
    new_tokens: int
    block_size: int
    kv_budget: int
    params: int
    tp: int | None
    pp: int | None


class Tokens(Envelope):
    """The tokens one decode step chose (``seqs``: which sequences, for a pipeline's group)."""
    mode: str
    step: int
    tokens: list[int]
    seqs: NotRequired[list[int]]


class KVShard(Envelope):
    """The KV cache one rank holds: its layers and KV heads, bytes against the formula
    (tensor × pipeline: its ``stage``, ``tp_rank`` and the mesh ``tp``·``pp``)."""
    mode: str
    layers: list[int]
    kv_heads: list[int]
    bytes: int
    formula_bytes: int
    tokens: int
    kv_heads_total: int
    layers_total: int
    stage: NotRequired[int]
    tp_rank: NotRequired[int]
    tp: NotRequired[int]
    pp: NotRequired[int]


class Decode(Envelope):
    """One rank's decode: tokens ``equal`` to one process's, collectives per token, speed."""
    mode: str
    equal: bool
    all_reduces_per_token: float
    sends_per_token: float
    decode_tokens_per_s: float | None  # None: no decode step took measurable time
    prefill_s: float


class KVStep(Envelope):
    """One step of the continuous batcher on ``cache`` (``contiguous``, ``paged``,
    ``no-sharing``, ``prefix``): blocks allocated and freed, requests by state, each running
    request's block table and length, cached blocks' fill (unreferenced ones), copies on write,
    evictions, ``logical_blocks`` (Σ table lengths: a block in several tables is shared); ``t0``
    and ``t``: the wall clock at the iteration's start and end."""
    cache: str
    t0: float
    step: int
    allocated: list[int]
    freed: list[int]
    used_blocks: int
    num_blocks: int
    block_size: int
    tokens_stored: int
    reserved_tokens: int
    running: list[int]
    waiting: list[int]
    admitted: list[int]
    finished: list[int]
    preempted: list[int]
    tables: dict[str, list[int]]
    lengths: dict[str, int]
    cached: dict[str, int]
    cow: list[int]
    evicted: list[int]
    reused_tokens: int
    logical_blocks: int


class Request(Envelope):
    """A request the batcher finished: its sizes, steps, time to first token and per token."""
    cache: str
    t_arrival: float
    rid: int
    prompt_len: int
    output_len: int
    arrival: int
    first_token_step: int | None
    finished_step: int | None
    ttft_s: float
    tpot_s: float
    preemptions: int
    reused: int
    tokens: list[int]


class KVCompare(Envelope):
    """Paged against contiguous KV cache on the same requests and memory (figures of each)."""
    tokens_equal: bool
    max_len: int
    requests: int
    block_size: int
    kv_budget_tokens: int
    contiguous: dict[str, float]
    paged: dict[str, float]
    throughput_ratio: float


# "no-sharing" is no identifier: this field needs the functional form
_NoSharing = TypedDict("_NoSharing", {"no-sharing": dict[str, float]})


class PrefixCompare(Envelope, _NoSharing):
    """Prefix sharing against none, on requests sharing a system prompt."""
    requests: int
    num_blocks: int
    block_size: int
    system_prompt: int
    prompt_tokens: int
    prefix: dict[str, float]
    tokens_equal: bool
    ttft_ratio: float
    peak_memory_ratio: float


class CostModel(Envelope):
    """Measured ``[tokens, s]`` of a prefill and ``[batch, s]`` of a decode step."""
    prefill: list[list[float]]
    decode: list[list[float]]
    decode_context: int


class Route(Envelope):
    """Where one routing ``policy`` sent a request, and its latencies."""
    policy: str
    rid: int
    replica: int
    prefix_hit: bool
    arrival: float
    ttft_s: float
    tpot_s: float


class Routing(Envelope):
    """One routing policy's figures over ``replicas``."""
    policy: str
    replicas: int
    cost_source: str
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    mean_ttft_s: float
    throughput_tokens_per_s: float
    requests_per_s: float
    prefix_hit_rate: float
    makespan_s: float
    per_replica: list[Any]


CONFIG = EventKind("config", Config)
TOKENS = EventKind("tokens", Tokens)
KV_SHARD = EventKind("kv_shard", KVShard)
DECODE = EventKind("decode", Decode)
KV_STEP = EventKind("kv_step", KVStep)
REQUEST = EventKind("request", Request)
KV_COMPARE = EventKind("kv_compare", KVCompare)
PREFIX_COMPARE = EventKind("prefix_compare", PrefixCompare)
COST_MODEL = EventKind("cost_model", CostModel)
ROUTE = EventKind("route", Route)
ROUTING = EventKind("routing", Routing)

EVENTS = (CONFIG, TOKENS, KV_SHARD, DECODE, KV_STEP, REQUEST, KV_COMPARE, PREFIX_COMPARE, COST_MODEL, ROUTE,
          ROUTING)
