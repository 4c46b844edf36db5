"""The one model every experiment trains: a small GPT, on one process.

Each parallelism transforms *this* model rather than defining its own (as picotron applies
tensor parallelism to one model and torchtitan's ``parallelize_*`` functions do): ZeRO and FSDP2
shard its :meth:`GPT.units`, the pipeline cuts its :meth:`GPT.layers` into stages, tensor
parallelism (:mod:`distai.engine.tensor_parallel`) splits the weights of its blocks, and the
single-process model is what every one of them is compared with.

The shape is GPT-2's (Radford et al. 2019): token embedding → ``layers`` pre-LayerNorm blocks
(causal multi-head attention with W_q, W_k, W_v, W_o; a GeLU MLP of width ``ffn``, 4·hidden by
default) → final LayerNorm → LM head, by default tied to the embedding (``tie_embeddings``).
Lesson 7 serves the same model in Llama's shape (Touvron et al. 2023), by configuration:
``norm="rms"`` (RMSNorm, Zhang & Sennrich 2019), ``mlp="swiglu"`` (Shazeer 2020, width 3·hidden by
default), ``kv_heads`` < ``heads`` (grouped-query attention, Ainslie et al. 2023), rotary
positions (``rope_theta``, Su et al. 2021) and ``bias=False``.

* No positional embedding unless ``rope_theta`` is set: a causal decoder learns positions from its
  mask alone (Haviv et al. 2022, "Transformer Language Models without Positional Encodings Still
  Learn Positional Information"; Kazemnejad et al. 2023). It keeps what a parallelism must split to
  the embedding, the blocks and the head, and the saved activations to exactly Korthikanti et
  al.'s count.
* Layout: token ids and targets are batch-first ``[b, s]`` as data comes; hidden states are
  sequence-first ``[s, b, h]`` (Megatron's layout), so that a sequence shard is contiguous;
  logits are ``[s, b, V]`` and :func:`lm_loss` pairs them with ``[b, s]`` targets.
* Dropout draws its masks from :class:`DropoutMasks` — a function of (seed, step, layer, site)
  and the full tensor's shape — so a sharded model can drop exactly the same elements.
* One attention forward (:class:`Attention`) serves training, every parallel layout and decoding:
  ``attn(x, positions=None, cache=None)``. Its core, :func:`attend` (scores, causal or cache mask,
  grouped-query heads, softmax, dropout), is the one place attention is written.
* Hooks a plan replaces per module (in place, as torchtitan's ``parallelize`` functions do):
  ``block.attn.core`` — any ``core(q, k, v, mask=None, dropout=None)`` on ``[b, heads, s, d]``
  queries and ``[b, kv_heads, s, d]`` keys/values (``apply_cp`` installs ring attention; it is
  called with ``mask``/``dropout`` only when there is a cache or dropout); ``block.mlp`` — any
  module ``[s, b, h] → [s, b, h]`` (``apply_ep`` installs a mixture of experts); ``attn.project``
  / ``mlp.project`` — how the input reaches the column projections (tensor parallelism puts
  one f, or one sequence all-gather, in front of all of them); the projections themselves
  (``wq``, ``wk``, ``wv``, ``wo``, ``fc1``, ``gate``, ``fc2``: any module with that weight's
  name, sharded or not).
* Decoding passes one :class:`KVCache` per block (``model(ids, positions=..., caches=...)``): the
  attention writes the new keys/values and reads back all of them with a validity mask.
* A tied head cannot be cut away from the embedding (ZeRO-3 frees the embedding's unit before
  the head runs; pipeline stages hold either end): those configurations use
  ``tie_embeddings=False`` (Megatron-LM's ``--untie-embeddings-and-output-weights``).
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..lessons.model_size import ModelConfigError
from ..lessons.model_size import ModelSize as GPTConfig  # the engine's name for the model's size
from .metering import comm_scope

__all__ = ["GPTConfig", "ModelConfigError", "DropoutMasks", "Attention", "MLP", "Block", "Embedding", "Head",
           "GPT", "ModelStage", "KVCache", "GrowingKVCache", "attend", "project", "masked_dropout", "ScaledMaskedSoftmax",
           "apply_rope", "lm_loss", "make_batch"]


class DropoutMasks:
    """Keep-masks that depend only on (seed, step, layer, site) and the full tensor's shape.

    ``full(...)`` draws the mask of the whole (dense) tensor; a tensor-parallel rank slices its
    heads or its sequence shard out of it, so dense and sharded blocks drop the same elements.
    """

    def __init__(self, p: float, seed: int = 0):
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.seed = seed
        self.step = 0

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.p)

    def full(self, layer: object, site: str, shape: tuple[int, ...],
             device: torch.device | str | None = None) -> torch.Tensor:
        key = zlib.crc32(f"{self.seed}/{self.step}/{layer}/{site}".encode())
        gen = torch.Generator().manual_seed(key)
        keep = torch.rand(shape, generator=gen) >= self.p
        return keep.to(device) if device is not None else keep


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021), Llama's half-split layout. ``x``: ``[..., heads,
    d]``; ``positions``: the absolute position of each of ``x``'s leading entries (``x.shape[:-2]``)."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    ang = positions.to(torch.float64)[..., None, None] * inv  # [..., 1, d/2]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def make_norm(cfg: GPTConfig) -> nn.Module:
    return nn.LayerNorm(cfg.hidden, eps=cfg.eps) if cfg.norm == "layer" else nn.RMSNorm(cfg.hidden, eps=cfg.eps)


class _MaskedDropout(torch.autograd.Function):
    """Dropout with a given keep-mask, saving only the (1-byte) mask."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, torch.zeros((), dtype=grad.dtype, device=grad.device)), None, None


def masked_dropout(x: torch.Tensor, masks: DropoutMasks | None, layer: object, site: str,
                   full_shape: tuple[int, ...],
                   slicer: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Dropout of this rank's part of a tensor of ``full_shape``: the dense model's mask, sliced
    by ``slicer`` (a tensor-parallel rank's heads, a sequence-parallel rank's tokens)."""
    if masks is None or masks.p == 0.0:
        return x
    keep = masks.full(layer, site, tuple(full_shape), device=x.device)
    if slicer is not None:
        keep = slicer(keep)
    keep = keep.clone()  # own storage: never keep the full mask alive through a view
    return _MaskedDropout.apply(x, keep, masks.scale)


class ScaledMaskedSoftmax(torch.autograd.Function):
    """softmax(scale·scores), masked causally (``allowed=None``) or by ``allowed`` (True: the
    query may see that key), saving only its output, like Megatron's fused scale-mask-softmax:
    the scores themselves are not kept for backward."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, scale: float, allowed: torch.Tensor | None) -> torch.Tensor:
        if allowed is None:
            s_q, s_k = scores.shape[-2:]
            hidden = torch.ones(s_q, s_k, dtype=torch.bool, device=scores.device).triu_(1 + s_k - s_q)
        else:
            hidden = ~allowed
        probs = torch.softmax((scores * scale).masked_fill_(hidden, float("-inf")), dim=-1)
        ctx.save_for_backward(probs)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (probs,) = ctx.saved_tensors
        dot = (grad * probs).sum(-1, keepdim=True)
        return probs * (grad - dot) * ctx.scale, None, None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           dropout: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """The attention core, the one place scores, mask, softmax and dropout are written.

    ``q``: ``[b, heads, s_q, d]``; ``k``, ``v``: ``[b, kv_heads, s_k, d]`` (grouped-query attention
    when ``kv_heads < heads``: each K/V head serves ``heads/kv_heads`` consecutive query heads).
    ``mask``: None for causal attention (the last query sees every key), else a boolean tensor
    broadcastable to ``[b, heads, s_q, s_k]``, True where the query may see the key (a KV cache's).
    ``dropout``: applied to the probabilities. Returns ``[b, heads, s_q, d]``."""
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    probs = ScaledMaskedSoftmax.apply(q.matmul(k.transpose(-1, -2)), 1.0 / math.sqrt(q.shape[-1]), mask)
    if dropout is not None:
        probs = dropout(probs)
    return probs.matmul(v)


def project(x: torch.Tensor, linears: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Each of ``linears`` applied to ``x``: the default input side of attention and the MLP
    (tensor parallelism installs one that passes ``x`` through one f, or one sequence all-gather,
    for all of them)."""
    return [lin(x) for lin in linears]


class KVCache(Protocol):
    """What the decode path passes to one layer's attention: it stores this forward's keys and
    values and gives back every key and value the queries may read.

    ``update(k, v)``: ``k``, ``v`` ``[b, s, kv_heads, d]`` (keys after RoPE) are the new tokens'
    (at the positions the attention was given). Returns ``(keys, values, valid)``: ``[b, L,
    kv_heads, d]`` where entry ``l`` is position ``l`` of each sequence, and ``valid`` ``[b, L]``
    (False: not written for that sequence) or None when every entry below the query's position
    is valid."""

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        ...


class GrowingKVCache:
    """The simplest :class:`KVCache`: one layer's keys and values concatenated along the sequence
    (every sequence of the batch at the same length)."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=1)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=1)
        return self.k, self.v, None


def _positions(positions: torch.Tensor | None, s: int, b: int, device: torch.device) -> torch.Tensor:
    """Absolute positions ``[s, b]`` from None (``0..s-1``), ``[s]`` (shared) or ``[b, s]``."""
    if positions is None:
        positions = torch.arange(s, device=device)
    if positions.dim() == 1:
        return positions[:, None].expand(s, b)
    return positions.t()


class Attention(nn.Module):
    """Causal self-attention with separate W_q, W_k, W_v, W_o (``nn.Linear``), for training and
    for decoding with a KV cache.

    ``forward(x [s, b, h], positions=None, cache=None)``: ``project`` the input through wq, wk,
    wv; RoPE at ``positions`` (absolute, ``[s]`` or ``[b, s]``; default ``0..s-1``); with a
    ``cache`` (:class:`KVCache`) store the new keys/values and read back all of them; ``core``
    (default :func:`attend`) does the rest; then wo.

    The keys have no bias: a key bias adds ``q·b_k`` to every score of a query alike, which the
    softmax cancels, so it never changes the output and its true gradient is zero; kept, it is a
    parameter that optimizers like Adam move by its rounding noise alone (and differently for
    every parallel layout). The numbers of query and key/value heads are inferred from the
    projections' widths (``view(s, b, -1, d)``), so a tensor-parallel rank's column-sharded
    projections run this same code (``head_offset``: its first query head, for dropout)."""

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        h, kv = cfg.hidden, cfg.group_heads * cfg.head_dim
        self.heads, self.head_dim, self.rope_theta = cfg.heads, cfg.head_dim, cfg.rope_theta
        self.wq = nn.Linear(h, h, bias=cfg.bias)
        self.wo: nn.Module = nn.Linear(h, h, bias=cfg.bias)  # a plan may make it row-parallel
        self.wk, self.wv = nn.Linear(h, kv, bias=False), nn.Linear(h, kv, bias=cfg.bias)
        self.project: Callable[[torch.Tensor, Sequence[nn.Module]], list[torch.Tensor]] = project
        self.core: Callable[..., torch.Tensor] = attend
        self.masks: DropoutMasks | None = None
        self.layer, self.head_offset = layer, 0

    def _dropout(self, b: int, s_q: int, s_k: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
        if self.masks is None or self.masks.p == 0:
            return None
        masks, lo = self.masks, self.head_offset
        return lambda probs: masked_dropout(probs, masks, self.layer, "attn.probs", (b, self.heads, s_q, s_k),
                                            lambda m: m[:, lo:lo + probs.shape[1]])

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        q, k, v = self.project(x, (self.wq, self.wk, self.wv))  # under SP: the whole sequence
        s, b = q.shape[:2]
        q, k, v = (t.view(s, b, -1, self.head_dim) for t in (q, k, v))
        pos = _positions(positions, s, b, x.device)
        if self.rope_theta is not None:
            q, k = apply_rope(q, pos, self.rope_theta), apply_rope(k, pos, self.rope_theta)
        mask = None
        if cache is not None:
            keys, values, valid = cache.update(k.transpose(0, 1), v.transpose(0, 1))
            k, v = keys.transpose(0, 1), values.transpose(0, 1)
            allowed = torch.arange(k.shape[0], device=x.device)[None, None, :] <= pos.t()[:, :, None]
            mask = (allowed if valid is None else allowed & valid[:, None, :])[:, None]  # [b, 1, s, L]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        dropout = self._dropout(b, q.shape[2], k.shape[2])
        extra = {k_: v_ for k_, v_ in (("mask", mask), ("dropout", dropout)) if v_ is not None}
        ctx = self.core(q, k, v, **extra)
        return self.wo(ctx.permute(2, 0, 1, 3).reshape(s, b, -1))


class MLP(nn.Module):
    """``fc2(gelu(fc1 x))``, or with SwiGLU ``fc2(silu(gate x) · fc1 x)``; its input side is
    ``project`` as in :class:`Attention`."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        h, f = cfg.hidden, cfg.ffn_size
        self.fc1 = nn.Linear(h, f, bias=cfg.bias)
        self.fc2: nn.Module = nn.Linear(f, h, bias=cfg.bias)  # a plan may make it row-parallel
        self.gate = nn.Linear(h, f, bias=cfg.bias) if cfg.mlp == "swiglu" else None
        self.project: Callable[[torch.Tensor, Sequence[nn.Module]], list[torch.Tensor]] = project

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            up, gate = self.project(x, (self.fc1, self.gate))
            return self.fc2(F.silu(gate) * up)
        (up,) = self.project(x, (self.fc1,))
        return self.fc2(F.gelu(up))


class Block(nn.Module):
    """The pre-LN block: ``x + drop(attn(ln1(x)))``, then ``x + drop(mlp(ln2(x)))``. ``[s, b, h]``
    in and out (``[s/T, b, h]``, this rank's tokens, under sequence parallelism: then
    ``sequence_shard = (rank, T)`` slices the residual dropouts' masks). Its collectives are tagged
    with its layer. ``mlp`` is any module ``[s, b, h] → [s, b, h]`` (``apply_ep`` installs experts)."""

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        self.hidden = cfg.hidden
        self.ln1, self.ln2 = make_norm(cfg), make_norm(cfg)
        self.attn = Attention(cfg, layer)
        self.mlp: nn.Module = MLP(cfg)
        self.layer = layer
        self.masks: DropoutMasks | None = None
        self.sequence_shard: tuple[int, int] | None = None

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        self.attn.masks = masks

    def _dropout(self, y: torch.Tensor, site: str) -> torch.Tensor:
        if self.sequence_shard is None:
            return masked_dropout(y, self.masks, self.layer, site, tuple(y.shape))
        (rank, size), n = self.sequence_shard, y.shape[0]
        return masked_dropout(y, self.masks, self.layer, site, (n * size, *y.shape[1:]),
                              lambda m: m[rank * n:(rank + 1) * n])

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        with comm_scope(self.layer):
            x = x + self._dropout(self.attn(self.ln1(x), positions=positions, cache=cache), "attn.out")
            return x + self._dropout(self.mlp(self.ln2(x)), "mlp.out")


class Embedding(nn.Embedding):
    """Token ids ``[b, s]`` → hidden states ``[s, b, h]``."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids.t())


class Head(nn.Module):
    """Final LayerNorm and LM head: ``[s, b, h]`` → logits ``[s, b, V]``. Tied: the embedding's
    table is the head's weight (not a parameter of the head)."""

    def __init__(self, cfg: GPTConfig, tied_to: Embedding | None = None):
        super().__init__()
        self.hidden = cfg.hidden
        self.norm = make_norm(cfg)
        self._tied = [tied_to] if tied_to is not None else []  # a list: not registered twice
        self.weight = None if tied_to is not None else nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))

    @property
    def lm_weight(self) -> torch.Tensor:
        if self._tied:
            return self._tied[0].weight
        assert self.weight is not None  # untied heads own their weight
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(x), self.lm_weight)

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of the head's logits of ``x`` against ``[b, s]`` targets."""
        return lm_loss(self(x), targets)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits ``[s, b, V]`` against targets ``[b, s]``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.t().reshape(-1))


class GPT(nn.Module):
    """Embedding → blocks → head, initialised from ``seed`` on the CPU (the same weights on every
    rank and device). ``model(ids)`` gives logits ``[s, b, V]``; ``model(ids, targets)`` the loss."""

    def __init__(self, cfg: GPTConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None):
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = Embedding(cfg.vocab, cfg.hidden)
            self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.layers))
            self.head = Head(cfg, self.embed if cfg.tie_embeddings else None)
            nn.init.normal_(self.embed.weight, std=cfg.hidden ** -0.5)
            if self.head.weight is not None:
                nn.init.normal_(self.head.weight, std=cfg.hidden ** -0.5)
            for m in self.modules():  # non-trivial norm parameters, so their grads matter
                if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
                    nn.init.normal_(m.weight, mean=1.0, std=0.1)
                if isinstance(m, nn.LayerNorm):
                    nn.init.normal_(m.bias, std=0.1)
        self.to(dtype=dtype, device=device)

    def set_masks(self, masks: DropoutMasks | None) -> None:
        for b in self.block_list():
            b.set_masks(masks)

    def block_list(self) -> list[Block]:
        return [cast(Block, b) for b in self.blocks]

    def layers(self) -> list[nn.Module]:
        """The chain a pipeline cuts: embedding, each block, head (a tied head needs the embedding)."""
        return [self.embed, *self.block_list(), self.head]

    def units(self) -> list[nn.Module]:
        """What ZeRO-3 and FSDP2 gather and free one at a time (the same chain)."""
        if self.cfg.tie_embeddings:
            raise ModelConfigError("a tied head shares the embedding's weight: shard an untied model "
                                   "(tie_embeddings=False)")
        return self.layers()

    def hidden_states(self, ids: torch.Tensor, positions: torch.Tensor | None = None,
                      caches: Sequence[KVCache] | None = None) -> torch.Tensor:
        """The blocks' output ``[s, b, h]`` (before the final norm); ``positions`` and one KV
        cache per block as :class:`Attention` takes them."""
        x = self.embed(ids)
        for i, b in enumerate(self.block_list()):
            x = b(x, positions, caches[i] if caches is not None else None)
        return x

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, caches: Sequence[KVCache] | None = None) -> torch.Tensor:
        x = self.hidden_states(ids, positions, caches)
        return self.head(x) if targets is None else self.head.loss(x, targets)


class ModelStage(nn.Module):
    """A contiguous piece of the model — [embedding] → blocks ``layers`` → [head] — sharing the
    model's own modules (a pipeline stage; :func:`~distai.engine.pipeline.split_stages` cuts
    them). Parameter names are the model's (``embed.weight``, ``blocks.{i}.…``, ``head.…``).
    Input: token ids ``[b, s]`` (first stage) or hidden states ``[s, b, h]``; output: the next
    stage's input, or the logits (last stage)."""

    def __init__(self, model: GPT, layers: range, first: bool, last: bool):
        super().__init__()
        if model.cfg.tie_embeddings and first != last:
            raise ModelConfigError("the first and the last stage would each hold a copy of a tied "
                                   "embedding: cut an untied model (tie_embeddings=False)")
        self.cfg = model.cfg
        self.embed: nn.Module | None = model.embed if first else None
        blocks = model.block_list()
        self.blocks = nn.ModuleDict({str(i): blocks[i] for i in layers})
        self.head: nn.Module | None = model.head if last else None

    def block_list(self) -> list[Block]:
        return [cast(Block, b) for b in self.blocks.values()]

    def units(self) -> list[nn.Module]:
        """The modules in the order their forwards run (what ZeRO gathers one at a time)."""
        return [m for m in (self.embed, *self.block_list(), self.head) if m is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units():
            x = unit(x)
        return x


def make_batch(cfg: GPTConfig, batch: int, seed: int = 0, step: int = 0,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets ``[b, s]`` drawn uniformly, identical on every rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    ids = torch.randint(0, cfg.vocab, (cfg.seq + 1, batch), generator=gen).t().to(device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
