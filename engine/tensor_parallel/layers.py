"""The tensor-parallel layers: projections split by output features (column-parallel, behind one
f), a linear split by input features (row-parallel, before g), and the tag on parameters that see
only a sequence shard (the memory-lean softmax and dropout are the model's own:
:func:`~distai.engine.model.attend`).

Weights are cut from the dense model's: rank ``r`` of ``T`` holds rows ``[r·n/T, (r+1)·n/T)``
(:func:`slice_rows`) or the same columns (:func:`slice_cols`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

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
    that :func:`~distai.engine.tensor_parallel.parallelize.sync_tp_grads` adds."""
    for p in params:
        if p is not None:
            p.sequence_parallel = True  # type: ignore[attr-defined]  # a tag on the Parameter object


def column_parallel(x: torch.Tensor, tp: TPGroup, site: str,
                    params: Sequence[tuple[torch.Tensor, torch.Tensor | None]]) -> list[torch.Tensor]:
    """``Y_i = X · W_i^T (+ b_i)`` for column-parallel weights ``W_i`` (this rank's output rows),
    all behind ONE f: without SP the input is replicated and passes through f (:class:`CopyToTP`);
    with SP it is a sequence shard, all-gathered once on the way in (:class:`SPColumnLinear`,
    which keeps only the shard and gathers it again in backward, or :class:`GatherFromSequence`
    without the re-gather). The outputs stay sharded by feature."""
    if tp.splits_sequence and tp.regather:
        return list(SPColumnLinear.apply(x, tp, site, *[t for pair in params for t in pair]))
    x = GatherFromSequence.apply(x, tp, site) if tp.splits_sequence else CopyToTP.apply(x, tp, site)
    return [F.linear(x, w, b) for w, b in params]


class ColumnParallelInput(nn.Module):
    """The input side of a tensor-parallel sub-block (what ``attn.project`` / ``mlp.project`` of
    the model become): its column-parallel projections, sharded ``nn.Linear`` s, behind one f
    (site ``attn.f`` or ``mlp.f``)."""

    def __init__(self, tp: TPGroup, site: str):
        super().__init__()
        self.tp, self.site = tp, site

    def forward(self, x: torch.Tensor, linears: Sequence[nn.Module]) -> list[torch.Tensor]:
        return column_parallel(x, self.tp, self.site, [(cast(torch.Tensor, m.weight), cast(torch.Tensor | None, m.bias))
                                                       for m in linears])


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
