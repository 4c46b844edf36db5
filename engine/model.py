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
* A tied head cannot be cut away from the embedding (ZeRO-3 frees the embedding's unit before
  the head runs; pipeline stages hold either end): those configurations use
  ``tie_embeddings=False`` (Megatron-LM's ``--untie-embeddings-and-output-weights``).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "ModelConfigError", "DropoutMasks", "Attention", "MLP", "Block", "Embedding", "Head",
           "GPT", "apply_rope", "lm_loss", "make_batch"]


class ModelConfigError(ValueError):
    """A model shape that cannot be built or split as asked (a clear one-line message)."""


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 128
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    seq: int = 16
    ffn: int | None = None  # MLP width; default 4·hidden
    dropout: float = 0.0
    eps: float = 1e-5
    tie_embeddings: bool = True
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: = heads
    norm: str = "layer"  # "layer" (LayerNorm) or "rms" (RMSNorm)
    mlp: str = "gelu"  # "gelu" (fc2(gelu(fc1 x))) or "swiglu" (fc2(silu(gate x) * fc1 x))
    rope_theta: float | None = None  # rotary positions with this base; None: no positions
    bias: bool = True  # biases in the linear layers (keys never have one: see Attention)

    def __post_init__(self) -> None:
        if min(self.vocab, self.hidden, self.heads, self.layers, self.seq) < 1:
            raise ModelConfigError(f"every model size must be at least 1: {self}")
        if self.hidden % self.heads:
            raise ModelConfigError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if self.heads % self.group_heads:
            raise ModelConfigError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ModelConfigError(f"dropout probability must be in [0, 1), got {self.dropout}")
        if self.norm not in ("layer", "rms"):
            raise ModelConfigError(f"norm must be 'layer' or 'rms', not {self.norm!r}")
        if self.mlp not in ("gelu", "swiglu"):
            raise ModelConfigError(f"mlp must be 'gelu' or 'swiglu', not {self.mlp!r}")
        if self.rope_theta is not None and self.head_dim % 2:
            raise ModelConfigError(f"rotary positions need an even head dimension, not {self.head_dim}")

    @property
    def ffn_size(self) -> int:
        return self.ffn or (3 if self.mlp == "swiglu" else 4) * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def group_heads(self) -> int:
        """Key/value heads (``kv_heads``, or ``heads`` without grouped-query attention)."""
        return self.kv_heads or self.heads

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.heads // self.group_heads

    @property
    def gpt2_shape(self) -> bool:
        """LayerNorm, GeLU, multi-head, no positions, biases: what tensor-parallel training splits."""
        return (self.norm, self.mlp, self.group_heads, self.rope_theta, self.bias) == \
            ("layer", "gelu", self.heads, None, True)

    def check_tp(self, t: int, sequence_parallel: bool = False, seq: int | None = None) -> None:
        """Raise ModelConfigError if this model cannot be split over ``t`` tensor-parallel ranks."""
        for what, n in (("heads", self.heads), ("ffn", self.ffn_size), ("vocab", self.vocab)):
            if n % t:
                raise ModelConfigError(f"{what} = {n} is not divisible by the tensor-parallel size T={t}")
        s = seq if seq is not None else self.seq
        if sequence_parallel and s % t:
            raise ModelConfigError(f"sequence {s} is not divisible by T={t} (needed by sequence parallelism)")

    def num_params(self) -> int:
        """Parameters of the model (a tied head adds none)."""
        h, f, L, kv = self.hidden, self.ffn_size, self.layers, self.group_heads * self.head_dim
        b = 1 if self.bias else 0
        attn = 2 * h * h + 2 * h * kv + b * (2 * h + kv)  # W_q, W_k, W_v, W_o; no key bias
        mlp = (3 if self.mlp == "swiglu" else 2) * h * f + b * ((2 if self.mlp == "swiglu" else 1) * f + h)
        norm = h if self.norm == "rms" else 2 * h
        return self.vocab * h + L * (attn + mlp + 2 * norm) + norm + (0 if self.tie_embeddings else self.vocab * h)


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


def _drop(y: torch.Tensor, masks: DropoutMasks | None, layer: object, site: str) -> torch.Tensor:
    if masks is None or masks.p == 0:
        return y
    return y * masks.full(layer, site, tuple(y.shape), y.device) * masks.scale


class Attention(nn.Module):
    """Causal multi-head self-attention with separate W_q, W_k, W_v, W_o (``nn.Linear``).

    The keys have no bias: a key bias adds ``q·b_k`` to every score of a query alike, which the
    softmax cancels, so it never changes the output and its true gradient is zero; kept, it is a
    parameter that optimizers like Adam move by its rounding noise alone (and differently for
    every parallel layout). The number of heads is inferred from the projection's width
    (``view(s, b, -1, d)``), so the same code runs on DTensor's column-sharded local tensors."""

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        h, kv = cfg.hidden, cfg.group_heads * cfg.head_dim
        self.heads, self.head_dim, self.rope_theta = cfg.heads, cfg.head_dim, cfg.rope_theta
        self.wq, self.wo = nn.Linear(h, h, bias=cfg.bias), nn.Linear(h, h, bias=cfg.bias)
        self.wk, self.wv = nn.Linear(h, kv, bias=False), nn.Linear(h, kv, bias=cfg.bias)
        self.masks: DropoutMasks | None = None
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b = x.shape[:2]
        q, k, v = (w(x).view(s, b, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        if self.rope_theta is not None:
            pos = torch.arange(s, device=x.device)[:, None].expand(s, b)
            q, k = apply_rope(q, pos, self.rope_theta), apply_rope(k, pos, self.rope_theta)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
        if k.shape[1] != q.shape[1]:  # grouped-query attention: each K/V head serves a group
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        scores = q.matmul(k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = _drop(scores.masked_fill(future, float("-inf")).softmax(dim=-1), self.masks, self.layer,
                      "attn.probs")
        return self.wo(probs.matmul(v).permute(2, 0, 1, 3).reshape(s, b, -1))


class MLP(nn.Module):
    """``fc2(gelu(fc1 x))``, or with SwiGLU ``fc2(silu(gate x) · fc1 x)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        h, f = cfg.hidden, cfg.ffn_size
        self.fc1, self.fc2 = nn.Linear(h, f, bias=cfg.bias), nn.Linear(f, h, bias=cfg.bias)
        self.gate = nn.Linear(h, f, bias=cfg.bias) if cfg.mlp == "swiglu" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.fc2(F.silu(self.gate(x)) * self.fc1(x))
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """The pre-LN block: ``x + drop(attn(ln1(x)))``, then ``x + drop(mlp(ln2(x)))``. ``[s, b, h]``
    in and out."""

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        self.hidden = cfg.hidden
        self.ln1, self.ln2 = make_norm(cfg), make_norm(cfg)
        self.attn, self.mlp = Attention(cfg, layer), MLP(cfg)
        self.layer = layer
        self.masks: DropoutMasks | None = None

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        self.attn.masks = masks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + _drop(self.attn(self.ln1(x)), self.masks, self.layer, "attn.out")
        return x + _drop(self.mlp(self.ln2(x)), self.masks, self.layer, "mlp.out")


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

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The blocks' output ``[s, b, h]`` (before the final norm)."""
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return x

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.hidden_states(ids))
        return logits if targets is None else lm_loss(logits, targets)


def make_batch(cfg: GPTConfig, batch: int, seed: int = 0, step: int = 0,
               device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets ``[b, s]`` drawn uniformly, identical on every rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    ids = torch.randint(0, cfg.vocab, (cfg.seq + 1, batch), generator=gen).t().to(device)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
