"""A small decoder-only transformer served three ways: one process, tensor-parallel, pipeline-parallel.

The model is the course's one GPT (:mod:`distai.engine.model`) in Llama's shape
(``GPTConfig.preset("llama-tiny", ...)``): token embedding, ``layers`` blocks of (norm → attention with rotary
positions and ``kv_heads`` key/value heads shared by groups of query heads (GQA; ``kv_heads = heads``
is plain multi-head attention, 1 is multi-query) → residual → norm → SwiGLU MLP → residual), a final
norm and an output projection. The norm is RMSNorm (Llama) or LayerNorm (GPT), ``norm="rms"|"layer"``.
Weights are drawn from a seed, so every process builds the same model and cuts its own part
(:class:`DecoderShard`: a layer range of the model for pipeline parallelism, split by
:func:`~distai.engine.tensor_parallel.apply_tp` for tensor parallelism); the decode path runs that
model itself, its KV cache passed to each layer's attention.

Decoding is greedy (argmax) with a **KV cache**: the prompt is run once (prefill) and stores every
layer's keys and values; each decode step runs one new token per sequence and appends its K/V.
The cache is a :class:`KVStore` — torch tensors of fixed-size blocks addressed through an allocator
from :mod:`distai.lessons.lesson7.paging`: a :class:`~distai.lessons.lesson7.paging.ContiguousAllocator`
(one ``max_len`` region per sequence) or a paged
:class:`~distai.lessons.lesson7.paging.BlockAllocator` (see :mod:`distai.engine.paged_kv`).
Attention reads K and V through the sequence's block table.

* **Single process** (:class:`DecoderShard` with ``tp_size=1`` and all layers): the reference for
  the parallel versions; it is itself checked against :func:`reference_greedy`, which runs the
  model itself (``GPT.forward``) on the whole sequence every step, without any cache.
* **Tensor parallel** (``tp_size = T``): rank ``r`` owns query heads ``[r·H/T, (r+1)·H/T)`` and the
  key/value heads they use, i.e. ``H_kv/T`` of them (when ``T > H_kv`` each KV head is replicated on
  ``T/H_kv`` ranks, as vLLM does) — so **its KV cache holds only its heads**. Q/K/V and the MLP's gate
  and up projections are column-parallel, the attention output and the MLP's down projection
  row-parallel, so every layer ends its attention and its MLP with an all-reduce of ``batch·hidden``
  numbers: **2 all-reduces per layer per decoded token** (Megatron-LM, Shoeybi et al. 2019). The
  embedding and the output projection are replicated (vocabulary parallelism is lesson 4's).
* **Pipeline parallel** (:func:`generate_pp`): stage ``r`` owns a contiguous run of layers and **the
  KV cache of those layers only**; hidden states go from stage to stage with point-to-point sends
  (``isend``/``recv``), and the last stage sends each new token back to the first. With ``m``
  microbatches in flight the stages work on different microbatches at once.
* **Both at once** (``generate_pp(..., pipe=...)`` on a shard with ``tp_size > 1``): a (pp, tp) mesh.
  The shard all-reduces inside its stage's tensor-parallel group; ``pipe`` (the process group of
  the ranks with the same tensor-parallel index, one per stage) carries the hidden states and tokens. Every tensor-parallel rank of a stage holds the full hidden states after
  its all-reduce and sends them to its peer in the next stage (Megatron-LM's layout, Narayanan et al.
  2021, without the scatter/gather optimisation), so each rank's cache holds its heads of its layers.

Every collective and point-to-point message is counted by a
:class:`~distai.engine.metering.CommMeter` around the run (prefill and decode tagged apart) so the
experiment can check the 2·L all-reduces per token and the ``p − 1`` hidden-state sends, and
measure bytes.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..lessons.lesson7.paging import ContiguousAllocator
from .experiment import device_sync
from .mesh_args import check_decode
from .metering import CommMeter, comm_scope
from .model import GPT, GPTConfig, ModelConfigError, ModelStage
from .tensor_parallel import TPGroup, apply_tp
from .tensor_parallel.parallelize import kv_shard
from .time_causes import Window

__all__ = ["build_model", "decode_params",
           "reference_logits", "reference_greedy", "comm_counts", "KVStore", "LayerCache", "DecoderShard", "generate",
           "generate_pp", "split_layers", "contiguous_store", "mesh_shard"]


# ----------------------------------------------------------------------------------------------
# the model: the one GPT, in Llama's shape
# ----------------------------------------------------------------------------------------------

def build_model(cfg: GPTConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> GPT:
    """The model every process builds from ``seed`` (the same weights everywhere), for decoding."""
    if cfg.bias or cfg.mlp != "swiglu" or cfg.rope_theta is None:
        raise ModelConfigError("the decode path serves the Llama shape: GPTConfig.preset('llama-tiny', ...)")
    model = GPT(cfg, seed=seed, dtype=dtype)
    model.requires_grad_(False)
    return model


def decode_params(cfg: GPTConfig, include_embedding: bool = False) -> int:
    """Parameters a decode step reads: the layers, final norm and output projection (the embedding
    table only when asked: a step reads one row of it)."""
    return cfg.num_params() - (0 if include_embedding else cfg.vocab * cfg.hidden)


# ----------------------------------------------------------------------------------------------
# the reference: the model itself, no cache, the whole sequence recomputed every step
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def reference_logits(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """Logits at every position of ``ids`` [B, s], causal, no KV cache: [B, s, vocab]."""
    return model(ids).transpose(0, 1)


def reference_greedy(model: GPT, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy decoding without a cache: ``new_tokens`` tokens per prompt, [B, new_tokens]."""
    ids = prompts
    out = []
    for _ in range(new_tokens):
        nxt = reference_logits(model, ids)[:, -1].argmax(-1)
        out.append(nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


# ----------------------------------------------------------------------------------------------
# communication: plain torch.distributed, counted by a CommMeter around the run
# ----------------------------------------------------------------------------------------------

def _global(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group`` (torch's point-to-point calls take global ranks)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _isend(t: torch.Tensor, dst: int, group: Any, pending: list) -> None:
    t = t.contiguous()
    pending.append((dist.isend(t, _global(group, dst), group=group), t))  # t lives until the send is done


def _recv(shape: tuple[int, ...], dtype: torch.dtype, src: int, device: Any, group: Any) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(t, _global(group, src), group=group)
    return t


def _wait(pending: list) -> None:
    for work, _t in pending:
        work.wait()
    pending.clear()


def comm_counts(meter: CommMeter | None, phase: str) -> dict[str, int] | None:
    """What one rank issued in ``phase`` (``prefill`` or ``decode``): all-reduces and their bytes
    (the full tensor), sends and their bytes, receives. None without a meter."""
    if meter is None:
        return None
    rs = meter.of(phase=phase)
    ar, sends = [r for r in rs if r.op == "all_reduce"], [r for r in rs if r.op == "send"]
    return {"all_reduces": len(ar), "all_reduce_bytes": sum(r.payload_bytes for r in ar),
            "sends": len(sends), "send_bytes": sum(r.payload_bytes for r in sends),
            "recvs": sum(1 for r in rs if r.op == "recv")}


# ----------------------------------------------------------------------------------------------
# the KV cache: blocks of torch tensors addressed through an allocator
# ----------------------------------------------------------------------------------------------

@dataclass
class Addressing:
    """Where one forward's tokens go and what it reads, computed once for all layers: the
    (block, offset) of every new token, the block tables padded to the longest sequence, and the
    number of positions to read."""

    blocks: torch.Tensor  # [B·s] physical block of each new token
    offsets: torch.Tensor  # [B·s] offset inside it
    tables: torch.Tensor  # [B, nb] block tables (padded with block 0)
    length: int  # positions read: max over the batch of pos0 + s


class KVStore:
    """K and V of ``layers`` layers and ``kv_heads`` heads in ``allocator.num_blocks`` blocks of
    ``allocator.block_size`` tokens: tensors ``[layers, blocks, block_size, kv_heads, head_dim]``
    (token-major inside a block, so a gathered run of blocks is already a run of tokens).
    Where token ``p`` of a sequence lives is the allocator's business (its block table)."""

    def __init__(self, allocator, layers: int, kv_heads: int, head_dim: int, dtype=torch.float32,
                 device="cpu"):
        self.alloc = allocator
        shape = (layers, allocator.num_blocks, allocator.block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token on this shard: 2·layers·kv_heads·head_dim·element size."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.k.element_size()

    @property
    def storage_bytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def reserve(self, seq, new_len: int) -> None:
        self.alloc.grow(seq, new_len)

    def copy_pending(self) -> None:
        """Carry out the allocator's copy-on-write copies (source block, destination block, tokens):
        the first ``tokens`` positions of K and V, every layer. Done before any write of the next
        forward, so a source block is read before anything can reuse it."""
        for src, dst, n in getattr(self.alloc, "take_copies", list)():
            self.k[:, dst, :n] = self.k[:, src, :n]
            self.v[:, dst, :n] = self.v[:, src, :n]

    def address(self, seqs, pos0, s: int) -> Addressing:
        """The addressing of a forward that appends ``s`` tokens to each of ``seqs`` (holding
        ``pos0[b]`` tokens): block tables looked up once, used by every layer."""
        self.copy_pending()
        bs = self.alloc.block_size
        tabs = [self.alloc.tables[q] for q in seqs]
        blocks, offs = [], []
        for table, p0 in zip(tabs, pos0):
            for p in range(p0, p0 + s):
                blocks.append(table[p // bs])
                offs.append(p % bs)
        length = max(pos0) + s
        nb = -(-length // bs)
        dev = self.k.device
        return Addressing(torch.tensor(blocks, device=dev), torch.tensor(offs, device=dev),
                          torch.tensor([(t + [0] * nb)[:nb] for t in tabs], dtype=torch.long, device=dev), length)

    def write(self, layer: int, at: Addressing, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` [B, s, kv_heads, d] at the new positions of ``at``."""
        B, s, H, d = k.shape
        self.k[layer][at.blocks, at.offsets] = k.reshape(B * s, H, d)
        self.v[layer][at.blocks, at.offsets] = v.reshape(B * s, H, d)

    def read(self, layer: int, at: Addressing) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of the first ``at.length`` positions of every sequence, gathered through the block
        tables: [B, length, kv_heads, d] (positions past a sequence's end hold garbage; mask them)."""
        B, nb = at.tables.shape
        if nb == 1:  # one block per sequence (always so for a contiguous cache): slice, then gather
            return self.k[layer, :, : at.length][at.tables[:, 0]], self.v[layer, :, : at.length][at.tables[:, 0]]
        bs = self.alloc.block_size
        K = self.k[layer][at.tables].view(B, nb * bs, self.kv_heads, self.head_dim)
        V = self.v[layer][at.tables].view(B, nb * bs, self.kv_heads, self.head_dim)
        return K[:, : at.length], V[:, : at.length]


def contiguous_store(shard: DecoderShard, sequences: int, max_len: int, dtype=None, device=None) -> KVStore:
    """A pre-allocated contiguous cache: ``sequences`` regions of ``max_len`` tokens for ``shard``."""
    return KVStore(ContiguousAllocator(sequences, max_len), len(shard.layers), shard.kv_local, shard.cfg.head_dim,
                   dtype or shard.dtype, device or shard.device)


# ----------------------------------------------------------------------------------------------
# one process's part of the model
# ----------------------------------------------------------------------------------------------

def split_layers(layers: int, stages: int) -> list[range]:
    """Contiguous layer ranges per pipeline stage, the first ``layers % stages`` one layer longer."""
    if not 1 <= stages <= layers:
        raise ValueError(f"{stages} stages for {layers} layers")
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


class LayerCache:
    """One layer's view of a :class:`KVStore` for one forward, the model's
    :class:`~distai.engine.model.KVCache`: writes the new tokens' keys and values at the
    forward's addressing and reads back the first ``at.length`` positions of every sequence."""

    def __init__(self, store: KVStore, layer: int, at: Addressing):
        self.store, self.layer, self.at = store, layer, at

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        self.store.write(self.layer, self.at, k, v)
        keys, values = self.store.read(self.layer, self.at)
        return keys, values, None  # positions past a sequence's end are beyond every query's: causal hides them


class DecoderShard:
    """The layers ``layer_range`` of the model and, of each, the heads and MLP columns of
    tensor-parallel rank ``tp_rank`` of ``tp_size``: the model itself, cut
    (:class:`~distai.engine.model.ModelStage`) and split (:func:`~distai.engine.tensor_parallel.apply_tp`
    with the embedding and head replicated). ``forward`` runs it with the KV cache ``self.cache``
    passed to each layer's attention (:class:`LayerCache`)."""

    def __init__(self, cfg: GPTConfig, model: GPT, tp_rank: int = 0, tp_size: int = 1,
                 layer_range: range | None = None, group: Any = None, device: Any = "cpu"):
        check_decode(cfg, tp=tp_size)
        if cfg.rope_theta is None:
            raise ModelConfigError("the decode path needs rotary positions: GPTConfig.preset('llama-tiny', ...)")
        self.cfg, self.tp_rank, self.tp_size = cfg, tp_rank, tp_size
        self.layers = list(layer_range if layer_range is not None else range(cfg.layers))
        self.first, self.last = self.layers[0] == 0, self.layers[-1] == cfg.layers - 1
        self.group = group  # the tensor-parallel (or pipeline) group; None: the world
        self.device = torch.device(device)
        self.tp = TPGroup(group)
        self.tp.rank, self.tp.size = tp_rank, tp_size
        stage = ModelStage(copy.deepcopy(model), range(self.layers[0], self.layers[-1] + 1), self.first, self.last)
        self.model = apply_tp(stage, self.tp, vocab_parallel=False).to(self.device)
        self.q_local = cfg.heads // tp_size
        self.q0 = tp_rank * self.q_local
        self.kv0, self.kv_local = kv_shard(cfg.heads, cfg.group_heads, tp_rank, tp_size)
        self.dtype = next(self.model.parameters()).dtype
        self.cache: KVStore | None = None

    @property
    def store(self) -> KVStore:
        """The attached KV cache (``shard.cache = ...`` first)."""
        if self.cache is None:
            raise RuntimeError("attach a KV cache first (shard.cache = ...)")
        return self.cache

    @property
    def weight_bytes(self) -> int:
        """Bytes of this shard's weights a decode step reads (the embedding table excluded: a step
        reads only one row of it)."""
        return sum(p.numel() * p.element_size() for n, p in self.model.named_parameters() if not n.startswith("embed."))

    @torch.no_grad()
    def forward(self, inp: torch.Tensor, seqs, pos0) -> torch.Tensor:
        """Run this shard's layers on ``inp`` — token ids [B, s] on the first stage, hidden states
        [B, s, h] after — for sequences ``seqs`` whose caches hold ``pos0[b]`` tokens. Returns the
        last position's logits [B, vocab] on the last stage, else the hidden states [B, s, h]."""
        store = self.store
        s = inp.shape[1]
        for b, q in enumerate(seqs):
            store.reserve(q, pos0[b] + s)
        pos = torch.tensor([[p + j for j in range(s)] for p in pos0], device=self.device)  # [B, s]
        at = store.address(seqs, pos0, s)
        stage = self.model
        x = stage.embed(inp) if stage.embed is not None else inp.transpose(0, 1)  # [s, B, h]
        for li, block in enumerate(stage.block_list()):
            x = block(x, positions=pos, cache=LayerCache(store, li, at))
        if stage.head is None:
            return x.transpose(0, 1).contiguous()
        return stage.head(x[-1:])[0]


# ----------------------------------------------------------------------------------------------
# greedy generation: one process or tensor-parallel (every TP rank gets the same logits)
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def generate(shard: DecoderShard, prompts: torch.Tensor, new_tokens: int, on_token=None,
             meter: CommMeter | None = None, twins: tuple[DecoderShard, ...] = ()) -> dict:
    """Greedy decoding of a batch of equal-length prompts [B, s] with a contiguous cache (created if
    the shard has none). Works for one process and for tensor parallelism (the shard all-reduces).
    Returns ``tokens`` [B, new_tokens], ``prefill_s``, ``decode_s`` (the new_tokens − 1 decode
    steps; ``on_token`` and the twin not counted), ``prefill_window`` and ``decode_window`` (their
    on-CPU time and run-queue delay, :class:`~distai.engine.time_causes.Window`), ``comm_prefill``
    and ``comm_decode`` (:func:`comm_counts`, with a ``meter``: it watches the whole run, at a
    Python cost per op that the times then include), ``kv_bytes`` (this rank's cache of the batch at
    the end), ``kv_bytes_per_token``. ``twins``: other shards (no collectives), each running its own
    prefill and decode steps right after this one's, timed in ``twin_windows`` (each twin's prefill
    and decode :class:`~distai.engine.time_causes.Window`) — a measurement taken in the same seconds
    as the decode's."""
    with meter if meter is not None else contextlib.nullcontext():
        out = _generate(shard, prompts, new_tokens, on_token, [_Twin(t, prompts, new_tokens) for t in twins])
    return {**out, "comm_prefill": comm_counts(meter, "prefill"), "comm_decode": comm_counts(meter, "decode")}


class _Twin:
    """A shard decoding the same prompts in step with :func:`generate`'s, each step timed."""

    def __init__(self, shard: DecoderShard, prompts: torch.Tensor, new_tokens: int):
        B, self.s = prompts.shape
        shard.cache = contiguous_store(shard, B, self.s + new_tokens)
        self.shard, self.prompts, self.seqs = shard, prompts.to(shard.device), list(range(B))
        self.prefill, self.decode = Window(), Window()
        self.nxt = self.prompts

    def step(self, step: int) -> None:
        window = self.prefill if step == 0 else self.decode
        inp, pos0 = (self.prompts, 0) if step == 0 else (self.nxt[:, None], self.s + step - 1)
        with window:
            self.nxt = self.shard.forward(inp, self.seqs, [pos0] * len(self.seqs)).argmax(-1)
            device_sync(self.shard.device)


def _generate(shard: DecoderShard, prompts: torch.Tensor, new_tokens: int, on_token, twins: list[_Twin]) -> dict:
    if not (shard.first and shard.last):
        raise ValueError("generate() needs a shard with all layers; use generate_pp for pipelines")
    B, s = prompts.shape
    if shard.cache is None:
        shard.cache = contiguous_store(shard, B, s + new_tokens)
    seqs = list(range(B))
    prompts = prompts.to(shard.device)
    device_sync(shard.device)
    # each phase's wall, on-CPU time and waits for a core; gloo's threads' too where the all-reduces
    # are timed (their spans kept: the checked decode), not in an untimed or single-process one
    timed = shard.tp.spans is not None
    prefill, decode = Window(backend=timed), Window(backend=timed)
    with comm_scope(phase="prefill"), prefill:
        nxt = shard.forward(prompts, seqs, [0] * B).argmax(-1)
        device_sync(shard.device)
    out = [nxt]
    for twin in twins:
        twin.step(0)
    if on_token:
        on_token(0, nxt)
    with comm_scope(phase="decode"):
        for step in range(1, new_tokens):
            with decode:
                nxt = shard.forward(nxt[:, None], seqs, [s + step - 1] * B).argmax(-1)
                if twins or step == new_tokens - 1:
                    device_sync(shard.device)
            out.append(nxt)
            for twin in twins:
                twin.step(step)
            if on_token:
                on_token(step, nxt)
    stored = s + new_tokens - 1
    extra = {"twin_windows": [(t.prefill, t.decode) for t in twins]} if twins else {}
    return {"tokens": torch.stack(out, 1).cpu(), "prefill_s": prefill.wall_s, "decode_s": decode.wall_s,
            "decode_steps": new_tokens - 1, "prefill_window": prefill, "decode_window": decode, **extra,
            "kv_bytes": shard.cache.bytes_per_token * stored * B,
            "kv_bytes_per_token": shard.cache.bytes_per_token}


# ----------------------------------------------------------------------------------------------
# pipeline-parallel generation
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def generate_pp(shard: DecoderShard, prompts: torch.Tensor, new_tokens: int, stage: int, stages: int,
                microbatches: int = 1, on_token=None, meter: CommMeter | None = None, pipe: Any = None) -> dict:
    """Greedy decoding through a pipeline of ``stages`` processes (this one is ``stage``, holding
    ``shard.layers``). The batch is cut into ``microbatches``; for every position, each microbatch
    goes through the stages in order: the hidden states [b, s, h] with ``isend``/``recv`` to the next
    stage, and from the last stage the new tokens back to the first. Sends are non-blocking, so the
    stages work on different microbatches at once. Every stage returns the tokens (broadcast from the
    last stage at the end) and its own counts (with a ``meter``: the shard's all-reduces and the
    pipeline's messages) and cache bytes, like :func:`generate`.

    ``pipe`` is the process group over the stages (default: the shard's own). With a
    tensor-parallel shard it must be a separate one: the group of this rank's peers with the same
    tensor-parallel index (:func:`mesh_shard`)."""
    if pipe is None:
        if shard.tp_size > 1 and stages > 1:
            raise ValueError("tensor and pipeline parallelism together need a separate pipeline group (pipe=...)")
        pipe = shard.group
    with meter if meter is not None else contextlib.nullcontext():
        out = _generate_pp(shard, prompts, new_tokens, stage, stages, microbatches, on_token, pipe)
    return {**out, "comm_prefill": comm_counts(meter, "prefill"), "comm_decode": comm_counts(meter, "decode")}


def _generate_pp(shard: DecoderShard, prompts: torch.Tensor, new_tokens: int, stage: int, stages: int,
                 microbatches: int, on_token, group: Any) -> dict:
    B, s = prompts.shape
    m = max(1, min(microbatches, B))
    if shard.cache is None:
        shard.cache = contiguous_store(shard, B, s + new_tokens)
    dev, h = shard.device, shard.cfg.hidden
    groups = [g.tolist() for g in torch.arange(B).tensor_split(m)]
    prompts = prompts.to(dev)
    last = stages - 1
    tokens = torch.zeros(B, new_tokens, dtype=torch.long)
    pending: list = []
    device_sync(dev)
    t0 = time.perf_counter()
    t1 = t0
    for i in range(new_tokens):
        with comm_scope(phase="prefill" if i == 0 else "decode"):
            for g in groups:
                b, seq_len = len(g), (s if i == 0 else 1)
                pos0 = [0 if i == 0 else s + i - 1] * b
                if stage == 0:
                    if i == 0:
                        inp = prompts[g[0]:g[-1] + 1]
                    else:
                        inp = _recv((b, 1), torch.long, last, dev, group) if stages > 1 else \
                            tokens[g[0]:g[-1] + 1, i - 1:i].to(dev)
                else:
                    inp = _recv((b, seq_len, h), shard.dtype, stage - 1, dev, group)
                out = shard.forward(inp, g, pos0)
                if stage == last:
                    nxt = out.argmax(-1)
                    tokens[g[0]:g[-1] + 1, i] = nxt.cpu()
                    if on_token:
                        on_token(i, g, nxt)
                    if stages > 1 and i < new_tokens - 1:
                        _isend(nxt[:, None], 0, group, pending)
                else:
                    _isend(out, stage + 1, group, pending)
            if i == 0:
                _wait(pending)
                device_sync(dev)
                t1 = time.perf_counter()
    _wait(pending)
    device_sync(dev)
    t2 = time.perf_counter()
    if stages > 1:
        tok = tokens.to(dev)
        with comm_scope(phase="gather-tokens"):
            dist.broadcast(tok, _global(group, last), group=group)
        tokens = tok.cpu()
    stored = s + new_tokens - 1
    return {"tokens": tokens, "prefill_s": t1 - t0, "decode_s": t2 - t1, "decode_steps": new_tokens - 1,
            "kv_bytes": shard.cache.bytes_per_token * stored * B,
            "kv_bytes_per_token": shard.cache.bytes_per_token, "microbatches": m}


def mesh_shard(cfg: GPTConfig, model: GPT, mesh: Any, device: Any = "cpu") -> tuple[DecoderShard, Any, int]:
    """This rank's part of the model on a ``DeviceMesh`` with dimensions ("pp", "tp"): the layers of
    its stage and, of those, the heads and MLP columns of its tensor-parallel rank. Returns the shard
    (it all-reduces over "tp"), the pipeline group ("pp") and the stage, ready for
    ``generate_pp(shard, ..., stage=stage, stages=mesh.size(0), pipe=pipe)``."""
    pp, tp = mesh.size(mesh.mesh_dim_names.index("pp")), mesh.size(mesh.mesh_dim_names.index("tp"))
    check_decode(cfg, tp=tp, pp=pp)
    stage, tp_rank = mesh.get_local_rank("pp"), mesh.get_local_rank("tp")
    shard = DecoderShard(cfg, model, tp_rank=tp_rank, tp_size=tp, layer_range=split_layers(cfg.layers, pp)[stage],
                         group=mesh.get_group("tp"), device=device)
    return shard, mesh.get_group("pp"), stage
