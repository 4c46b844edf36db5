"""Megatron-style tensor parallelism of a whole Transformer block, written from scratch.

Everything here is plain ``torch.distributed`` (gloo on CPU, NCCL on GPU) and a handful of
``torch.autograd.Function`` s; PyTorch's own DTensor tensor parallelism is only used by the
experiment and the tests, as the thing we are compared with.

The pieces, in the order lesson 4 teaches them (Shoeybi et al. 2019, Korthikanti et al. 2022):

* **f** (:class:`CopyToTP`): identity forward, all-reduce backward. Sits before a column-parallel
  linear: the input is replicated, so each rank's input gradient is a *partial* sum.
* **g** (:class:`ReduceFromTP`): all-reduce forward, identity backward. Sits after a row-parallel
  linear: each rank's output is a partial sum; the gradient of a sum is the same on every rank.
* Column-parallel linear (weight rows = output features split) and row-parallel linear (input
  features split): the MLP is column then row, attention is QKV column-parallel (so each rank
  owns whole heads) then the output projection row-parallel. One f and one g per sub-block,
  i.e. 2 all-reduces forward and 2 backward per layer.
* **Sequence parallelism** (``sequence_parallel=True``): g becomes a reduce-scatter along the
  sequence (:class:`ReduceScatterToSequence`) and f an all-gather along the sequence
  (:class:`SPColumnLinear` fuses it into the column-parallel matmul and, like Megatron, keeps
  only the sequence shard of its input, all-gathering it again in backward). Layer norms,
  dropouts and residual adds then run on ``s/T`` of the tokens. The layer-norm weights and the
  row-parallel biases see only a shard of the sequence, so their gradients are partial sums
  that need their own all-reduce: :func:`reduce_sequence_parallel_grads` (the classic bug is to
  forget it).
* A vocabulary-parallel embedding (:class:`VocabParallelEmbedding`) and cross-entropy
  (:class:`VocabParallelCrossEntropy`): the max and the sum of exponentials (and the target
  logit) are all-reduced over ``s·b`` numbers; no rank ever holds more than ``V/T`` logits.

Activations are laid out ``[sequence, batch, hidden]`` (Megatron's ``s, b, h``) so that
sequence shards are contiguous along dimension 0.

Every collective is recorded by a :class:`CommCounter` with the layer it belongs to and whether
it ran in forward, backward or the gradient sync, so the experiment can check the counts and
bytes against the lesson's formulas. Bytes are given two ways: ``payload_bytes``, the size of
the full (unsharded) tensor the collective is about, and ``wire_bytes``, what one rank sends
with the ring algorithm (all-reduce ``2(T-1)/T·N``, all-gather and reduce-scatter ``(T-1)/T·N``
each, so that a reduce-scatter plus an all-gather moves exactly what one all-reduce does).

Dropout masks are drawn by :class:`DropoutMasks` for the *full* tensor from a seed that depends
only on (seed, step, layer, site), then sliced to the rank's heads or sequence shard, so the
tensor-parallel block is exactly the dense block, dropout included. (Megatron instead forks the
random generator per rank inside the sharded regions; the masks are then different draws from
the same distribution.)
"""
from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "CommCounter", "CommRecord", "TPGroup", "DropoutMasks", "ModelConfig",
    "CopyToTP", "ReduceFromTP", "GatherFromSequence", "ReduceScatterToSequence", "SPColumnLinear",
    "ColumnParallelLinear", "RowParallelLinear", "TPAttention", "TPMLP", "TPBlock",
    "VocabParallelEmbedding", "VocabParallelCrossEntropy", "TPModel",
    "DenseAttention", "DenseMLP", "DenseBlock", "DenseModel",
    "shard_dense_state", "reduce_sequence_parallel_grads", "SavedActivationMeter",
    "dtensor_parallelize_block", "full_grad", "make_batch",
]


# ----------------------------------------------------------------------------------------------
# Counting collectives
# ----------------------------------------------------------------------------------------------

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"


@dataclass(frozen=True)
class CommRecord:
    """One collective one rank took part in."""

    layer: str  # "embed", "0", "1", …, "head"
    phase: str  # "fwd", "bwd" or "grad-sync"
    op: str  # all_reduce, all_gather or reduce_scatter
    site: str  # where in the block: "attn.g", "mlp.f", "attn.f.regather", "ce.max", …
    numel: int  # elements of the full (unsharded) tensor
    elem_size: int  # bytes per element
    world: int  # ranks in the tensor-parallel group

    @property
    def payload_bytes(self) -> int:
        return self.numel * self.elem_size

    @property
    def wire_bytes(self) -> float:
        """Bytes one rank sends with the ring algorithm."""
        t = self.world
        factor = 2 * (t - 1) / t if self.op == ALL_REDUCE else (t - 1) / t
        return factor * self.payload_bytes


class CommCounter:
    """Every collective of one rank, tagged with its layer and its phase."""

    def __init__(self) -> None:
        self.records: list[CommRecord] = []
        self.layer = "-"
        self.phase = "fwd"  # backward functions record "bwd" themselves

    def reset(self) -> None:
        self.records.clear()

    @contextmanager
    def scope(self, layer: object, phase: str | None = None) -> Iterator[None]:
        old = (self.layer, self.phase)
        self.layer = str(layer)
        if phase is not None:
            self.phase = phase
        try:
            yield
        finally:
            self.layer, self.phase = old

    def record(self, op: str, site: str, numel: int, elem_size: int, world: int,
               layer: str | None = None, phase: str | None = None) -> None:
        self.records.append(CommRecord(layer if layer is not None else self.layer,
                                       phase or self.phase, op, site, int(numel), int(elem_size),
                                       int(world)))

    def table(self, include_sites: bool = False) -> dict:
        """``{layer: {phase: {op: {"count", "payload_bytes", "wire_bytes"}}}}`` (JSON-ready)."""
        out: dict = defaultdict(lambda: defaultdict(dict))
        for r in self.records:
            key = f"{r.op}:{r.site}" if include_sites else r.op
            cell = out[r.layer][r.phase].setdefault(key, {"count": 0, "payload_bytes": 0,
                                                          "wire_bytes": 0.0})
            cell["count"] += 1
            cell["payload_bytes"] += r.payload_bytes
            cell["wire_bytes"] += r.wire_bytes
        return {layer: {phase: dict(ops) for phase, ops in phases.items()}
                for layer, phases in out.items()}

    def of(self, layer: object, phase: str | None = None, sites: Iterable[str] | None = None,
           exclude_sites: Iterable[str] = ()) -> list[CommRecord]:
        wanted = set(sites) if sites is not None else None
        skip = set(exclude_sites)
        return [r for r in self.records
                if r.layer == str(layer) and (phase is None or r.phase == phase)
                and (wanted is None or r.site in wanted) and r.site not in skip]


# ----------------------------------------------------------------------------------------------
# The tensor-parallel group and its counted collectives
# ----------------------------------------------------------------------------------------------

def _all_gather_dim0(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


def _reduce_scatter_dim0(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, group=group)


class TPGroup:
    """The ranks that share one layer's weights, the mode (with or without sequence parallelism)
    and the counter that sees every collective they run."""

    def __init__(self, group=None, sequence_parallel: bool = False,
                 counter: CommCounter | None = None, regather: bool = True,
                 skip_sites: Iterable[str] = ()):
        if dist.is_available() and dist.is_initialized():
            self.size = dist.get_world_size(group)
            self.rank = dist.get_rank(group)
        else:
            self.size, self.rank = 1, 0
        self.group = group
        self.sequence_parallel = sequence_parallel
        # With SP, keep only the sequence shard of a column-parallel linear's input and
        # all-gather it again in backward (Megatron's choice: saves memory, costs 2 all-gathers).
        self.regather = regather
        self.counter = counter if counter is not None else CommCounter()
        # For the lesson's bug demonstrations only: all-reduces at these sites are silently
        # skipped (e.g. {"mlp.g"}: "forgot g"), and the dense comparison must catch it.
        self.skip_sites = frozenset(skip_sites)

    # Collectives: skipped entirely on one rank (nothing to talk to), counted otherwise.
    def all_reduce(self, t: torch.Tensor, site: str, *, op=None, layer=None, phase=None) -> torch.Tensor:
        if self.size == 1 or site in self.skip_sites:
            return t
        t = t.contiguous()
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=self.group)
        self.counter.record(ALL_REDUCE, site, t.numel(), t.element_size(), self.size, layer, phase)
        return t

    def all_gather_seq(self, t: torch.Tensor, site: str, *, layer=None, phase=None) -> torch.Tensor:
        if self.size == 1:
            return t
        t = t.contiguous()
        out = torch.empty((t.shape[0] * self.size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        _all_gather_dim0(out, t, self.group)
        self.counter.record(ALL_GATHER, site, out.numel(), t.element_size(), self.size, layer, phase)
        return out

    def reduce_scatter_seq(self, t: torch.Tensor, site: str, *, layer=None, phase=None) -> torch.Tensor:
        if self.size == 1:
            return t
        if t.shape[0] % self.size:
            raise ValueError(f"sequence length {t.shape[0]} is not divisible by T={self.size}")
        t = t.contiguous()
        out = torch.empty((t.shape[0] // self.size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        _reduce_scatter_dim0(out, t, self.group)
        self.counter.record(REDUCE_SCATTER, site, t.numel(), t.element_size(), self.size, layer, phase)
        return out


# ----------------------------------------------------------------------------------------------
# f, g and their sequence-parallel versions
# ----------------------------------------------------------------------------------------------

class CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward (the input was replicated, its gradient is a sum
    of every rank's partial gradient)."""

    @staticmethod
    def forward(ctx, x, tp: TPGroup, site: str):
        ctx.tp, ctx.site, ctx.layer = tp, site, tp.counter.layer
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.all_reduce(grad.clone(), ctx.site, layer=ctx.layer, phase="bwd"), None, None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (every rank holds a partial sum), identity backward."""

    @staticmethod
    def forward(ctx, x, tp: TPGroup, site: str):
        return tp.all_reduce(x.clone(), site)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class GatherFromSequence(torch.autograd.Function):
    """f with sequence parallelism: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, tp: TPGroup, site: str):
        ctx.tp, ctx.site, ctx.layer = tp, site, tp.counter.layer
        return tp.all_gather_seq(x, site)

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.reduce_scatter_seq(grad, ctx.site, layer=ctx.layer, phase="bwd"), None, None


class ReduceScatterToSequence(torch.autograd.Function):
    """g with sequence parallelism: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, tp: TPGroup, site: str):
        ctx.tp, ctx.site, ctx.layer = tp, site, tp.counter.layer
        return tp.reduce_scatter_seq(x, site)

    @staticmethod
    def backward(ctx, grad):
        return ctx.tp.all_gather_seq(grad, ctx.site, layer=ctx.layer, phase="bwd"), None, None


class SPColumnLinear(torch.autograd.Function):
    """All-gather along the sequence fused with a column-parallel matmul.

    Saves only the rank's sequence shard of the input (``s/T·b·h``) and all-gathers it again in
    backward to form the weight gradient (site ``<site>.regather``), as Megatron-LM does: the
    activation memory of the linear's input drops by T for one extra all-gather per linear.
    """

    @staticmethod
    def forward(ctx, x_shard, weight, bias, tp: TPGroup, site: str):
        ctx.tp, ctx.site, ctx.layer = tp, site, tp.counter.layer
        ctx.has_bias = bias is not None
        total = tp.all_gather_seq(x_shard, site)
        ctx.save_for_backward(x_shard, weight)
        return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x_shard, weight = ctx.saved_tensors
        tp = ctx.tp
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        # Megatron's order: the re-gather first (on GPUs it overlaps the input-gradient matmul),
        # then the reduce-scatter of the input gradient.
        if ctx.needs_input_grad[1]:
            total = tp.all_gather_seq(x_shard, ctx.site + ".regather", layer=ctx.layer, phase="bwd")
            grad_w = grad.reshape(-1, grad.shape[-1]).t().matmul(total.reshape(-1, total.shape[-1]))
        if ctx.needs_input_grad[0]:
            grad_total = grad.matmul(weight)
            grad_x = tp.reduce_scatter_seq(grad_total, ctx.site, layer=ctx.layer, phase="bwd")
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.reshape(-1, grad.shape[-1]).sum(0)
        return grad_x, grad_w, grad_b, None, None


class _ScaledCausalSoftmax(torch.autograd.Function):
    """softmax(scale·scores + causal mask), saving only its output (like Megatron's fused
    scale-mask-softmax): the scores themselves are not kept for backward."""

    @staticmethod
    def forward(ctx, scores, scale: float):
        s_q, s_k = scores.shape[-2:]
        future = torch.ones(s_q, s_k, dtype=torch.bool, device=scores.device).triu_(1)
        probs = torch.softmax((scores * scale).masked_fill_(future, float("-inf")), dim=-1)
        ctx.save_for_backward(probs)
        ctx.scale = scale
        return probs

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        dot = (grad * probs).sum(-1, keepdim=True)
        return probs * (grad - dot) * ctx.scale, None


class _MaskedDropout(torch.autograd.Function):
    """Dropout with a given keep-mask, saving only the (1-byte) mask."""

    @staticmethod
    def forward(ctx, x, keep: torch.Tensor, scale: float):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, torch.zeros((), dtype=x.dtype, device=x.device))

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, torch.zeros((), dtype=grad.dtype, device=grad.device)), None, None


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

    def full(self, layer: object, site: str, shape: tuple[int, ...], device=None) -> torch.Tensor:
        key = zlib.crc32(f"{self.seed}/{self.step}/{layer}/{site}".encode())
        gen = torch.Generator().manual_seed(key)
        keep = torch.rand(shape, generator=gen) >= self.p
        return keep.to(device) if device is not None else keep


def _dropout(x: torch.Tensor, masks: DropoutMasks | None, layer, site: str, full_shape,
             slicer=None) -> torch.Tensor:
    if masks is None or masks.p == 0.0:
        return x
    keep = masks.full(layer, site, tuple(full_shape), device=x.device)
    if slicer is not None:
        keep = slicer(keep)
    keep = keep.clone()  # own storage: never keep the full mask alive through a view
    return _MaskedDropout.apply(x, keep, masks.scale)


# ----------------------------------------------------------------------------------------------
# Tensor-parallel layers
# ----------------------------------------------------------------------------------------------

class ColumnParallelLinear(nn.Module):
    """``Y_r = X · W_r^T``: this rank holds ``out/T`` rows of the weight (output features).

    Without SP the input is replicated and passes through f; with SP it is a sequence shard,
    all-gathered on the way in (:class:`SPColumnLinear`). The output stays sharded by feature.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup, site: str):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.tp, self.site = tp, site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        if tp.sequence_parallel and tp.size > 1:
            if tp.regather:
                return SPColumnLinear.apply(x, self.weight, self.bias, tp, self.site)
            x = GatherFromSequence.apply(x, tp, self.site)
        else:
            x = CopyToTP.apply(x, tp, self.site)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``Y = Σ_r X_r · W_r^T``: this rank holds ``in/T`` columns of the weight (input features),
    takes a feature-sharded input and produces a partial sum, completed by g (an all-reduce, or
    a reduce-scatter along the sequence with SP). The bias is added once, after the sum."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tp: TPGroup, site: str):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        if self.bias is not None and tp.sequence_parallel and tp.size > 1:
            self.bias.sequence_parallel = True  # sees only s/T tokens: partial gradient
        self.tp, self.site = tp, site

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        if self.tp.sequence_parallel:
            out = ReduceScatterToSequence.apply(partial, self.tp, self.site)
        else:
            out = ReduceFromTP.apply(partial, self.tp, self.site)
        return out + self.bias if self.bias is not None else out


class TPLayerNorm(nn.Module):
    """A replicated layer norm. With SP it normalises only this rank's tokens, so its weight and
    bias gradients are partial sums (``sequence_parallel`` attribute set on them)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, tp: TPGroup, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone())
        self.eps = eps
        if tp.sequence_parallel and tp.size > 1:
            self.weight.sequence_parallel = True
            self.bias.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


@dataclass(frozen=True)
class ModelConfig:
    hidden: int = 64
    heads: int = 4
    ffn: int | None = None  # default 4·hidden
    vocab: int = 128
    layers: int = 2
    seq: int = 16
    dropout: float = 0.0
    eps: float = 1e-5

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def check_tp(self, t: int, sequence_parallel: bool = False, seq: int | None = None) -> None:
        """Raise ValueError if this model cannot be split over ``t`` ranks."""
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not divisible by heads {self.heads}")
        for what, n in (("heads", self.heads), ("ffn", self.ffn_size), ("vocab", self.vocab)):
            if n % t:
                raise ValueError(f"{what} = {n} is not divisible by the tensor-parallel size T={t}")
        s = seq if seq is not None else self.seq
        if sequence_parallel and s % t:
            raise ValueError(f"sequence {s} is not divisible by T={t} (needed by sequence parallelism)")


def _slice_rows(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=0)[rank]


def _slice_cols(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=-1)[rank]


class TPAttention(nn.Module):
    """Causal self-attention split by heads: this rank owns ``a/T`` whole heads.

    QKV is one column-parallel linear whose local weight stacks this rank's rows of W_q, W_k and
    W_v (so the three projections share one f / one all-gather); the output projection is
    row-parallel (g). Nothing inside a head ever needs another rank.
    """

    def __init__(self, dense: DenseAttention, tp: TPGroup, layer: int):
        super().__init__()
        r, t = tp.rank, tp.size
        qkv_w = torch.cat([_slice_rows(m.weight, r, t) for m in (dense.wq, dense.wk, dense.wv)])
        qkv_b = torch.cat([_slice_rows(m.bias, r, t) for m in (dense.wq, dense.wk, dense.wv)])
        self.qkv = ColumnParallelLinear(qkv_w, qkv_b, tp, "attn.f")
        self.wo = RowParallelLinear(_slice_cols(dense.wo.weight, r, t), dense.wo.bias, tp, "attn.g")
        self.heads, self.head_dim = dense.heads, dense.head_dim
        self.tp, self.layer = tp, layer
        self.masks: DropoutMasks | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        qkv = self.qkv(x)  # [s, b, 3·h/T]
        s, b = qkv.shape[:2]
        local_heads = self.heads // tp.size
        q, k, v = (u.view(s, b, local_heads, self.head_dim).permute(1, 2, 0, 3)
                   for u in qkv.chunk(3, dim=-1))  # [b, a/T, s, d]
        probs = _ScaledCausalSoftmax.apply(q.matmul(k.transpose(-1, -2)), 1.0 / math.sqrt(self.head_dim))
        lo = tp.rank * local_heads
        probs = _dropout(probs, self.masks, self.layer, "attn.probs", (b, self.heads, s, s),
                         lambda m: m[:, lo:lo + local_heads])
        ctx = probs.matmul(v).permute(2, 0, 1, 3).reshape(s, b, local_heads * self.head_dim)
        return self.wo(ctx)


class TPMLP(nn.Module):
    """fc1 column-parallel (f) → GeLU on ``4h/T`` features, no communication → fc2 row-parallel (g)."""

    def __init__(self, dense: DenseMLP, tp: TPGroup):
        super().__init__()
        r, t = tp.rank, tp.size
        self.fc1 = ColumnParallelLinear(_slice_rows(dense.fc1.weight, r, t),
                                        _slice_rows(dense.fc1.bias, r, t), tp, "mlp.f")
        self.fc2 = RowParallelLinear(_slice_cols(dense.fc2.weight, r, t), dense.fc2.bias, tp, "mlp.g")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TPBlock(nn.Module):
    """A pre-LN Transformer block, tensor-parallel (and optionally sequence-parallel).

    Input and output: ``[s, b, h]`` replicated, or ``[s/T, b, h]`` (this rank's sequence shard)
    with sequence parallelism.
    """

    def __init__(self, dense: DenseBlock, tp: TPGroup, layer: int):
        super().__init__()
        self.tp, self.layer = tp, layer
        self.ln1 = TPLayerNorm(dense.ln1.weight, dense.ln1.bias, tp, dense.ln1.eps)
        self.attn = TPAttention(dense.attn, tp, layer)
        self.ln2 = TPLayerNorm(dense.ln2.weight, dense.ln2.bias, tp, dense.ln2.eps)
        self.mlp = TPMLP(dense.mlp, tp)
        self.masks: DropoutMasks | None = None

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        self.attn.masks = masks

    def _residual_dropout(self, y: torch.Tensor, site: str) -> torch.Tensor:
        tp = self.tp
        if tp.sequence_parallel and tp.size > 1:
            n = y.shape[0]
            full = (n * tp.size, *y.shape[1:])
            return _dropout(y, self.masks, self.layer, site, full,
                            lambda m: m[tp.rank * n:(tp.rank + 1) * n])
        return _dropout(y, self.masks, self.layer, site, y.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.tp.counter.scope(self.layer):
            x = x + self._residual_dropout(self.attn(self.ln1(x)), "attn.out")
            return x + self._residual_dropout(self.mlp(self.ln2(x)), "mlp.out")


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows ``[r·V/T, (r+1)·V/T)`` of the embedding table; a token outside them
    looks up zeros, and g (an all-reduce, or a reduce-scatter along the sequence with SP) adds
    the one rank that has it."""

    def __init__(self, weight: torch.Tensor, tp: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(_slice_rows(weight, tp.rank, tp.size).detach().clone())
        self.tp = tp
        self.start = tp.rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = self.weight.shape[0]
        outside = (ids < self.start) | (ids >= self.start + n)
        out = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.tp.sequence_parallel:
            return ReduceScatterToSequence.apply(out, self.tp, "embed.g")
        return ReduceFromTP.apply(out, self.tp, "embed.g")


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary (``[s, b, V/T]`` per rank).

    Forward all-reduces three ``s·b`` tensors: the max logit (MAX), the target's logit (SUM:
    only the rank owning the target contributes) and the sum of exponentials (SUM). Backward
    needs no communication: ``softmax - onehot`` restricted to this rank's columns.
    """

    @staticmethod
    def forward(ctx, logits, targets, tp: TPGroup, vocab_start: int):
        n = logits.shape[-1]
        tp.counter.max_logits_width = max(getattr(tp.counter, "max_logits_width", 0), n)
        top = tp.all_reduce(logits.max(dim=-1).values, "ce.max", op=dist.ReduceOp.MAX)
        shifted = logits - top.unsqueeze(-1)
        outside = (targets < vocab_start) | (targets >= vocab_start + n)
        local = (targets - vocab_start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        target_logit = tp.all_reduce(target_logit, "ce.target")
        exp = shifted.exp()
        sum_exp = tp.all_reduce(exp.sum(dim=-1), "ce.sumexp")
        probs = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(probs, local, outside)
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad):
        probs, local, outside = ctx.saved_tensors
        g = probs.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(g.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


class TPModel(nn.Module):
    """Vocab-parallel embedding → L tensor-parallel blocks → final layer norm → LM head (the
    embedding's own shard, tied, column-parallel over the vocabulary) → vocab-parallel loss."""

    def __init__(self, dense: DenseModel, tp: TPGroup):
        super().__init__()
        cfg = dense.cfg
        cfg.check_tp(tp.size, tp.sequence_parallel)
        self.cfg, self.tp = cfg, tp
        self.embed = VocabParallelEmbedding(dense.embed.weight, tp)
        self.blocks = nn.ModuleList(TPBlock(b, tp, i) for i, b in enumerate(dense.blocks))
        self.ln_f = TPLayerNorm(dense.ln_f.weight, dense.ln_f.bias, tp, dense.ln_f.eps)
        self.masks: DropoutMasks | None = None
        self.meter: SavedActivationMeter | None = None

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        for b in self.blocks:
            b.set_masks(masks)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The final layer norm's output (this rank's sequence shard with SP)."""
        counter = self.tp.counter
        with counter.scope("embed", "fwd"):
            x = self.embed(ids)
        for block in self.blocks:
            if self.meter is not None:
                with self.meter.measure(block.layer, self.parameters()):
                    x = block(x)
            else:
                x = block(x)
        with counter.scope("head", "fwd"):
            return self.ln_f(x)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over all ``s·b`` tokens (the same number on every rank)."""
        x = self.hidden(ids)
        tp = self.tp
        with tp.counter.scope("head", "fwd"):
            if tp.sequence_parallel and tp.size > 1:
                if tp.regather:
                    logits = SPColumnLinear.apply(x, self.embed.weight, None, tp, "head.f")
                else:
                    logits = F.linear(GatherFromSequence.apply(x, tp, "head.f"), self.embed.weight)
            else:
                logits = F.linear(CopyToTP.apply(x, tp, "head.f"), self.embed.weight)
            losses = VocabParallelCrossEntropy.apply(logits, targets, tp, self.embed.start)
        return losses.mean()


def reduce_sequence_parallel_grads(model: nn.Module, tp: TPGroup) -> int:
    """All-reduce the gradients of the parameters that saw only a sequence shard (layer norms,
    row-parallel biases): one flattened all-reduce per layer. Returns how many were run.

    Without it each rank's layer-norm gradient covers only its ``s/T`` tokens and the
    replicated weights silently drift apart.
    """
    if not (tp.sequence_parallel and tp.size > 1):
        return 0
    groups: dict[str, list[nn.Parameter]] = defaultdict(list)
    for name, p in model.named_parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            parts = name.split(".")
            layer = parts[1] if parts[0] == "blocks" else "head"
            groups[layer].append(p)
    for layer, params in groups.items():
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat = tp.all_reduce(flat, "sp.grads", layer=layer, phase="grad-sync")
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n
    return len(groups)


def shard_dense_state(dense: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """The dense model's tensors (weights or gradients) cut the way rank ``rank`` of ``size``
    holds them in :class:`TPModel` (``attn.wq/wk/wv`` → the stacked ``attn.qkv``)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in dense.items():
        prefix, _, leaf = ("." + name).rpartition(".")
        if prefix.endswith(".attn.wq"):
            stem = name[: -len("wq." + leaf)]
            parts = [dense[f"{stem}{w}.{leaf}"] for w in ("wq", "wk", "wv")]
            out[f"{stem}qkv.{leaf}"] = torch.cat([_slice_rows(p, rank, size) for p in parts])
        elif prefix.endswith((".attn.wk", ".attn.wv")):
            continue
        elif prefix.endswith(".attn.wo") or prefix.endswith(".mlp.fc2"):
            out[name] = _slice_cols(t, rank, size) if leaf == "weight" else t
        elif prefix.endswith(".mlp.fc1") or name == "embed.weight":
            out[name] = _slice_rows(t, rank, size)
        else:
            out[name] = t
    return out


# ----------------------------------------------------------------------------------------------
# Activation memory, measured from what autograd keeps for backward
# ----------------------------------------------------------------------------------------------

class SavedActivationMeter:
    """Bytes of the tensors autograd saves for backward, per layer (each storage counted once,
    parameters excluded). ``per_layer[layer]`` after a forward run inside ``measure(layer)``."""

    def __init__(self) -> None:
        self.per_layer: dict[str, int] = {}

    @contextmanager
    def measure(self, layer: object, params: Iterable[torch.Tensor]) -> Iterator[None]:
        param_storages = {p.untyped_storage().data_ptr() for p in params}
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr and ptr not in param_storages and ptr not in seen:
                seen[ptr] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        self.per_layer[str(layer)] = sum(seen.values())


# ----------------------------------------------------------------------------------------------
# The dense reference: plain PyTorch modules (also what DTensor's parallelize_module splits)
# ----------------------------------------------------------------------------------------------

class DenseAttention(nn.Module):
    """Causal multi-head self-attention with separate W_q, W_k, W_v, W_o (``nn.Linear``).

    The number of heads is inferred from the projection's width (``view(s, b, -1, d)``), so the
    same code runs on DTensor's column-sharded local tensors."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(hidden, hidden) for _ in range(4))
        self.masks: DropoutMasks | None = None
        self.layer = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b = x.shape[:2]
        q, k, v = (w(x).view(s, b, -1, self.head_dim).permute(1, 2, 0, 3)
                   for w in (self.wq, self.wk, self.wv))
        scores = q.matmul(k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        future = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        if self.masks is not None and self.masks.p > 0:
            probs = probs * self.masks.full(self.layer, "attn.probs", probs.shape, x.device) * self.masks.scale
        return self.wo(probs.matmul(v).permute(2, 0, 1, 3).reshape(s, b, -1))


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class DenseBlock(nn.Module):
    """The single-process pre-LN block every tensor-parallel variant must reproduce."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.eps), nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.attn, self.mlp = DenseAttention(cfg.hidden, cfg.heads), DenseMLP(cfg.hidden, cfg.ffn_size)
        self.layer = layer
        self.attn.layer = layer
        self.masks: DropoutMasks | None = None

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        self.attn.masks = masks

    def _drop(self, y: torch.Tensor, site: str) -> torch.Tensor:
        if self.masks is None or self.masks.p == 0:
            return y
        return y * self.masks.full(self.layer, site, y.shape, y.device) * self.masks.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self.attn(self.ln1(x)), "attn.out")
        return x + self._drop(self.mlp(self.ln2(x)), "mlp.out")


class DenseModel(nn.Module):
    """Embedding → blocks → final layer norm → tied LM head → cross-entropy, on one process."""

    def __init__(self, cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
            self.blocks = nn.ModuleList(DenseBlock(cfg, i) for i in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
            nn.init.normal_(self.embed.weight, std=cfg.hidden ** -0.5)
            for m in self.modules():  # non-trivial layer-norm parameters, so their grads matter
                if isinstance(m, nn.LayerNorm):
                    nn.init.normal_(m.weight, mean=1.0, std=0.1)
                    nn.init.normal_(m.bias, std=0.1)
        self.to(dtype=dtype, device=device)  # initialised on the CPU: the same weights on any device

    def set_masks(self, masks: DropoutMasks | None) -> None:
        for b in self.blocks:
            b.set_masks(masks)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.hidden(ids), self.embed.weight)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def dtensor_parallelize_block(block: DenseBlock, mesh, sequence_parallel: bool = False) -> DenseBlock:
    """PyTorch's own tensor parallelism of the same dense block (``parallelize_module`` with
    ColwiseParallel for W_q, W_k, W_v, fc1 and RowwiseParallel for W_o, fc2; with SP the layer
    norms get SequenceParallel on the sequence dimension 0 and the attention / MLP inputs are
    all-gathered by PrepareModuleInput). In place; returns the block."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    out = {"output_layouts": Shard(0)} if sequence_parallel else {}
    plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(**out), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(**out)}
    if sequence_parallel:
        gather = dict(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),))
        plan.update({"ln1": SequenceParallel(sequence_dim=0), "ln2": SequenceParallel(sequence_dim=0),
                     "attn": PrepareModuleInput(**gather), "mlp": PrepareModuleInput(**gather)})
    parallelize_module(block, mesh, plan)
    return block


def full_grad(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient as a plain tensor (a DTensor's is gathered / reduced)."""
    g = p.grad
    return g.full_tensor() if hasattr(g, "full_tensor") else g


def make_batch(cfg: ModelConfig, batch: int, seed: int = 0, step: int = 0,
               device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets ``[s, b]``, identical on every rank."""
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    ids = torch.randint(0, cfg.vocab, (cfg.seq + 1, batch), generator=gen).to(device)
    return ids[:-1].contiguous(), ids[1:].contiguous()
