"""The tensor-parallel layers: a linear split by output features (column-parallel, behind f),
one split by input features (row-parallel, before g) and a replicated layer norm (the memory-lean
softmax and dropout are the model's own: :func:`~distai.engine.model.attend`).

Weights are cut from the dense model's: rank ``r`` of ``T`` holds rows ``[r·n/T, (r+1)·n/T)``
(:func:`slice_rows`) or the same columns (:func:`slice_cols`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .f_and_g import CopyToTP, GatherFromSequence, ReduceFromTP, ReduceScatterToSequence, SPColumnLinear
from .group import TPGroup


def slice_rows(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=0)[rank]


def slice_cols(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t.chunk(size, dim=-1)[rank]


def mark_sequence_parallel(*params: nn.Parameter | None) -> None:
    """These parameters see only this rank's sequence shard: their gradients are partial sums
    that :func:`~distai.engine.tensor_parallel.parallelize.reduce_sequence_parallel_grads` adds."""
    for p in params:
        if p is not None:
            p.sequence_parallel = True  # type: ignore[attr-defined]  # a tag on the Parameter object


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
        if tp.splits_sequence:
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
        if tp.splits_sequence:
            mark_sequence_parallel(self.bias)  # sees only s/T tokens: partial gradient
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

    def __init__(self, dense: nn.Module, tp: TPGroup):
        super().__init__()
        if not isinstance(dense, nn.LayerNorm):
            raise TypeError(f"tensor parallelism splits LayerNorm blocks, not {type(dense).__name__}")
        self.weight = nn.Parameter(dense.weight.detach().clone())
        self.bias = nn.Parameter(dense.bias.detach().clone())
        self.eps = dense.eps
        if tp.splits_sequence:
            mark_sequence_parallel(self.weight, self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
