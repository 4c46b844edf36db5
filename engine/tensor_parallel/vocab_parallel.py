"""The vocabulary split over the tensor-parallel ranks: the embedding lookup and the
cross-entropy, so that no rank ever holds more than ``V/T`` logits per token (Megatron-LM's
vocab-parallel embedding and cross-entropy, Shoeybi et al. 2019 §3)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..metering import comm_scope
from .f_and_g import ReduceFromTP, ReduceScatterToSequence
from .group import TPGroup
from .layers import slice_rows


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows ``[r·V/T, (r+1)·V/T)`` of the embedding table; a token outside them
    looks up zeros, and g (an all-reduce, or a reduce-scatter along the sequence with SP) adds
    the one rank that has it. Token ids ``[b, s]`` in, hidden states ``[s, b, h]`` (or this
    rank's ``[s/T, b, h]``) out."""

    def __init__(self, weight: torch.Tensor, tp: TPGroup):
        super().__init__()
        self.weight = nn.Parameter(slice_rows(weight, tp.rank, tp.size).detach().clone())
        self.tp = tp
        self.start = tp.rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.t()
        n = self.weight.shape[0]
        outside = (ids < self.start) | (ids >= self.start + n)
        out = F.embedding((ids - self.start).masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        with comm_scope("embed", "fwd"):
            if self.tp.sequence_parallel:
                return ReduceScatterToSequence.apply(out, self.tp, "embed.g")
            return ReduceFromTP.apply(out, self.tp, "embed.g")


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary (``[s, b, V/T]`` per rank, targets ``[s, b]``).

    Forward all-reduces three ``s·b`` tensors: the max logit (MAX), the target's logit (SUM:
    only the rank owning the target contributes) and the sum of exponentials (SUM). Backward
    needs no communication: ``softmax - onehot`` restricted to this rank's columns.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, tp: TPGroup,
                vocab_start: int) -> torch.Tensor:
        n = logits.shape[-1]
        tp.max_logits_width = max(tp.max_logits_width, n)
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
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        probs, local, outside = ctx.saved_tensors
        g = probs.clone()
        g.scatter_add_(-1, local.unsqueeze(-1), -(~outside).to(g.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None, None


def vocab_parallel_loss(logits: torch.Tensor, targets: torch.Tensor, tp: TPGroup, vocab_start: int) -> torch.Tensor:
    """The mean cross-entropy of this rank's logits ``[s, b, V/T]`` against targets ``[b, s]``
    (the same number on every rank), its all-reduces tagged with the head."""
    with comm_scope("head", "fwd"):
        return VocabParallelCrossEntropy.apply(logits, targets.t(), tp, vocab_start).mean()
