"""A pre-LN Transformer block, tensor-parallel (and optionally sequence-parallel), cut from the
dense :class:`~distai.engine.model.Block`.

Attention is split by heads (QKV column-parallel, so each rank owns whole heads, then W_o
row-parallel); the MLP by its hidden features (fc1 column-parallel, fc2 row-parallel). One f and
one g per sub-block: 2 all-reduces forward and 2 backward per layer (Shoeybi et al. 2019). With
sequence parallelism the layer norms, dropouts and residual adds run on ``s/T`` of the tokens.
"""
from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..metering import comm_scope
from ..model import MLP, Attention, Block, DropoutMasks, attend, masked_dropout
from .group import TPGroup
from .layers import ColumnParallelLinear, RowParallelLinear, TPLayerNorm, slice_cols, slice_rows


class TPAttention(nn.Module):
    """Causal self-attention split by heads: this rank owns ``a/T`` whole heads.

    QKV is one column-parallel linear whose local weight stacks this rank's rows of W_q, W_k and
    W_v (so the three projections share one f / one all-gather), followed by this rank's slices
    of the query and value biases (keys have none); the output projection is row-parallel (g).
    Nothing inside a head ever needs another rank.
    """

    def __init__(self, dense: Attention, tp: TPGroup, layer: int):
        super().__init__()
        r, t = tp.rank, tp.size
        qkv_w = torch.cat([slice_rows(m.weight, r, t) for m in (dense.wq, dense.wk, dense.wv)])
        self.qkv = ColumnParallelLinear(qkv_w, None, tp, "attn.f")
        self.qv_bias = nn.Parameter(torch.cat([slice_rows(m.bias, r, t) for m in (dense.wq, dense.wv)])
                                    .detach().clone())
        self.wo = RowParallelLinear(slice_cols(dense.wo.weight, r, t), dense.wo.bias, tp, "attn.g")
        self.heads, self.head_dim = dense.heads, dense.head_dim
        self.tp, self.layer = tp, layer
        self.masks: DropoutMasks | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tp = self.tp
        bq, bv = self.qv_bias.chunk(2)
        # one add over the stacked output: Q, K and V stay views of one tensor (what backward keeps)
        qkv = self.qkv(x) + torch.cat([bq, torch.zeros_like(bq), bv])  # [s, b, 3·h/T]
        s, b = qkv.shape[:2]
        local_heads = self.heads // tp.size
        q, k, v = (u.view(s, b, local_heads, self.head_dim).permute(1, 2, 0, 3)
                   for u in qkv.chunk(3, dim=-1))  # [b, a/T, s, d]
        lo, masks = tp.rank * local_heads, self.masks
        ctx = attend(q, k, v, dropout=lambda p: masked_dropout(p, masks, self.layer, "attn.probs",
                                                                (b, self.heads, s, s),
                                                                lambda m: m[:, lo:lo + local_heads]))
        ctx = ctx.permute(2, 0, 1, 3).reshape(s, b, local_heads * self.head_dim)
        return self.wo(ctx)


class TPMLP(nn.Module):
    """fc1 column-parallel (f) → GeLU on ``4h/T`` features, no communication → fc2 row-parallel (g)."""

    def __init__(self, dense: MLP, tp: TPGroup):
        super().__init__()
        r, t = tp.rank, tp.size
        self.fc1 = ColumnParallelLinear(slice_rows(dense.fc1.weight, r, t),
                                        slice_rows(dense.fc1.bias, r, t), tp, "mlp.f")
        self.fc2 = RowParallelLinear(slice_cols(dense.fc2.weight, r, t), dense.fc2.bias, tp, "mlp.g")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TPBlock(nn.Module):
    """Input and output: ``[s, b, h]`` replicated, or ``[s/T, b, h]`` (this rank's sequence shard)
    with sequence parallelism. Its collectives are tagged with its layer index."""

    def __init__(self, dense: Block, tp: TPGroup, layer: int):
        super().__init__()
        self.tp, self.layer = tp, layer
        self.ln1 = TPLayerNorm(dense.ln1, tp)
        self.attn = TPAttention(dense.attn, tp, layer)
        self.ln2 = TPLayerNorm(dense.ln2, tp)
        self.mlp = TPMLP(cast(MLP, dense.mlp), tp)
        self.masks: DropoutMasks | None = None

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        self.attn.masks = masks

    def _residual_dropout(self, y: torch.Tensor, site: str) -> torch.Tensor:
        tp = self.tp
        if tp.splits_sequence:
            n = y.shape[0]
            full = (n * tp.size, *y.shape[1:])
            return masked_dropout(y, self.masks, self.layer, site, full,
                                  lambda m: m[tp.rank * n:(tp.rank + 1) * n])
        return masked_dropout(y, self.masks, self.layer, site, tuple(y.shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with comm_scope(self.layer):
            x = x + self._residual_dropout(self.attn(self.ln1(x)), "attn.out")
            return x + self._residual_dropout(self.mlp(self.ln2(x)), "mlp.out")
