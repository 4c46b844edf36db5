"""The one model every experiment trains: a small GPT, on one process.

Each parallelism transforms *this* model rather than defining its own (as picotron applies
tensor parallelism to one model and torchtitan's ``parallelize_*`` functions do): ZeRO and FSDP2
shard its :meth:`GPT.units`, the pipeline cuts its :meth:`GPT.layers` into stages, tensor
parallelism (:mod:`distai.engine.tensor_parallel`) splits the weights of its blocks, and the
single-process model is what every one of them is compared with.

The shape is GPT-2's (Radford et al. 2019): token embedding → ``layers`` pre-LayerNorm blocks
(causal multi-head attention with W_q, W_k, W_v, W_o; a GeLU MLP of width ``ffn``, 4·hidden by
default) → final LayerNorm → LM head, by default tied to the embedding (``tie_embeddings``).

* No positional embedding: a causal decoder learns positions from its mask alone (Haviv et al.
  2022, "Transformer Language Models without Positional Encodings Still Learn Positional
  Information"; Kazemnejad et al. 2023). It keeps what a parallelism must split to the embedding,
  the blocks and the head, and the saved activations to exactly Korthikanti et al.'s count.
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

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["GPTConfig", "DropoutMasks", "Attention", "MLP", "Block", "Embedding", "Head", "GPT",
           "lm_loss", "make_batch"]


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

    def __post_init__(self) -> None:
        if min(self.vocab, self.hidden, self.heads, self.layers, self.seq) < 1:
            raise ModelConfigError(f"every model size must be at least 1: {self}")
        if self.hidden % self.heads:
            raise ModelConfigError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ModelConfigError(f"dropout probability must be in [0, 1), got {self.dropout}")

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

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
        h, f, L = self.hidden, self.ffn_size, self.layers
        block = 4 * h * h + 3 * h + (h * f + f) + (f * h + h) + 4 * h  # W_q,k,v,o; no key bias
        return self.vocab * h + L * block + 2 * h + (0 if self.tie_embeddings else self.vocab * h)


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

    def __init__(self, hidden: int, heads: int, layer: int = 0):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.wq, self.wv, self.wo = (nn.Linear(hidden, hidden) for _ in range(3))
        self.wk = nn.Linear(hidden, hidden, bias=False)
        self.masks: DropoutMasks | None = None
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b = x.shape[:2]
        q, k, v = (w(x).view(s, b, -1, self.head_dim).permute(1, 2, 0, 3)
                   for w in (self.wq, self.wk, self.wv))
        scores = q.matmul(k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = _drop(scores.masked_fill(future, float("-inf")).softmax(dim=-1), self.masks, self.layer,
                      "attn.probs")
        return self.wo(probs.matmul(v).permute(2, 0, 1, 3).reshape(s, b, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """The pre-LN block: ``x + drop(attn(ln1(x)))``, then ``x + drop(mlp(ln2(x)))``. ``[s, b, h]``
    in and out."""

    def __init__(self, cfg: GPTConfig, layer: int = 0):
        super().__init__()
        self.hidden = cfg.hidden
        self.ln1, self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.eps), nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.attn, self.mlp = Attention(cfg.hidden, cfg.heads, layer), MLP(cfg.hidden, cfg.ffn_size)
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
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self._tied = [tied_to] if tied_to is not None else []  # a list: not registered twice
        self.weight = None if tied_to is not None else nn.Parameter(torch.empty(cfg.vocab, cfg.hidden))

    @property
    def lm_weight(self) -> torch.Tensor:
        return self._tied[0].weight if self._tied else self.weight

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
            for m in self.modules():  # non-trivial layer-norm parameters, so their grads matter
                if isinstance(m, nn.LayerNorm):
                    nn.init.normal_(m.weight, mean=1.0, std=0.1)
                    nn.init.normal_(m.bias, std=0.1)
        self.to(dtype=dtype, device=device)

    def set_masks(self, masks: DropoutMasks | None) -> None:
        for b in self.blocks:
            b.set_masks(masks)

    def layers(self) -> list[nn.Module]:
        """The chain a pipeline cuts: embedding, each block, head (a tied head needs the embedding)."""
        return [self.embed, *self.blocks, self.head]

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
