"""Tensor parallelism applied to the whole :class:`~distai.engine.model.GPT`: vocab-parallel
embedding → tensor-parallel blocks → final layer norm → LM head split by vocabulary (the
embedding's own shard when tied) → vocab-parallel loss. Also the gradient all-reduce sequence
parallelism needs, and the map from the dense model's tensors to a rank's shards."""
from __future__ import annotations

from collections import defaultdict
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..metering import SavedActivationMeter, comm_scope
from ..model import GPT, DropoutMasks, Head, ModelConfigError
from .block import TPBlock
from .f_and_g import CopyToTP, GatherFromSequence, SPColumnLinear
from .group import TPGroup
from .layers import TPLayerNorm, slice_cols, slice_rows
from .vocab_parallel import VocabParallelCrossEntropy, VocabParallelEmbedding


class TPHead(nn.Module):
    """The final layer norm (replicated) and this rank's ``V/T`` rows of the LM head (the
    embedding's shard when the model is tied)."""

    def __init__(self, dense: Head, embed: VocabParallelEmbedding, tp: TPGroup):
        super().__init__()
        self.norm = TPLayerNorm(dense.norm, tp)
        self._embed = [embed]  # tied: not registered twice
        self.weight = (nn.Parameter(slice_rows(dense.weight, tp.rank, tp.size).detach().clone())
                       if dense.weight is not None else None)

    @property
    def lm_weight(self) -> torch.Tensor:
        return self.weight if self.weight is not None else self._embed[0].weight


class TPModel(nn.Module):
    """The GPT ``dense``, split over ``tp``. ``model(ids, targets)`` is the mean cross-entropy over
    all ``s·b`` tokens (the same number on every rank)."""

    def __init__(self, dense: GPT, tp: TPGroup):
        super().__init__()
        cfg = dense.cfg
        if not cfg.gpt2_shape:
            raise ModelConfigError("tensor-parallel training splits the GPT-2 shape (LayerNorm, GeLU, "
                                   "multi-head attention, no positions, biases)")
        cfg.check_tp(tp.size, tp.sequence_parallel)
        self.cfg, self.tp = cfg, tp
        self.embed = VocabParallelEmbedding(dense.embed.weight, tp)
        self.blocks = nn.ModuleList(TPBlock(b, tp, i) for i, b in enumerate(dense.block_list()))
        self.head = TPHead(dense.head, self.embed, tp)
        self.masks: DropoutMasks | None = None
        #: when set, each block's forward is measured into ``meter.per_layer``
        self.meter: SavedActivationMeter | None = None

    def block_list(self) -> list[TPBlock]:
        return [cast(TPBlock, b) for b in self.blocks]

    def set_masks(self, masks: DropoutMasks | None) -> None:
        self.masks = masks
        for b in self.block_list():
            b.set_masks(masks)

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The final layer norm's output (this rank's sequence shard with SP)."""
        with comm_scope("embed", "fwd"):
            x = self.embed(ids)
        for block in self.block_list():
            if self.meter is not None:
                with self.meter.measure(block.layer):
                    x = block(x)
            else:
                x = block(x)
        with comm_scope("head", "fwd"):
            return self.head.norm(x)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.hidden_states(ids)
        tp, weight = self.tp, self.head.lm_weight
        with comm_scope("head", "fwd"):
            if tp.splits_sequence:
                if tp.regather:
                    logits = SPColumnLinear.apply(x, weight, None, tp, "head.f")
                else:
                    logits = F.linear(GatherFromSequence.apply(x, tp, "head.f"), weight)
            else:
                logits = F.linear(CopyToTP.apply(x, tp, "head.f"), weight)
            losses = VocabParallelCrossEntropy.apply(logits, targets.t(), tp, self.embed.start)
        return losses.mean()


def reduce_sequence_parallel_grads(model: nn.Module, tp: TPGroup) -> int:
    """All-reduce the gradients of the parameters that saw only a sequence shard (layer norms,
    row-parallel biases): one flattened all-reduce per layer. Returns how many were run.

    Without it each rank's layer-norm gradient covers only its ``s/T`` tokens and the
    replicated weights silently drift apart.
    """
    if not tp.splits_sequence:
        return 0
    groups: dict[str, list[nn.Parameter]] = defaultdict(list)
    for name, p in model.named_parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            parts = name.split(".")
            layer = parts[1] if parts[0] == "blocks" else "head"
            groups[layer].append(p)
    for layer, params in groups.items():
        grads = [p.grad for p in params if p.grad is not None]
        flat = tp.all_reduce(torch.cat([g.reshape(-1) for g in grads]), "sp.grads", layer=layer,
                             phase="grad-sync")
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return len(groups)


def shard_dense_state(dense: dict[str, torch.Tensor], rank: int, size: int) -> dict[str, torch.Tensor]:
    """The dense model's tensors (weights or gradients) cut the way rank ``rank`` of ``size``
    holds them in :class:`TPModel` (``attn.wq/wk/wv`` weights → the stacked ``attn.qkv.weight``,
    the query and value biases → ``attn.qv_bias``)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in dense.items():
        prefix, _, leaf = ("." + name).rpartition(".")
        if prefix.endswith(".attn.wq"):
            stem = name[: -len("wq." + leaf)]
            projections = ("wq", "wk", "wv") if leaf == "weight" else ("wq", "wv")
            key = f"{stem}qkv.weight" if leaf == "weight" else f"{stem}qv_bias"
            out[key] = torch.cat([slice_rows(dense[f"{stem}{w}.{leaf}"], rank, size) for w in projections])
        elif prefix.endswith((".attn.wk", ".attn.wv")):
            continue
        elif prefix.endswith(".attn.wo") or prefix.endswith(".mlp.fc2"):
            out[name] = slice_cols(t, rank, size) if leaf == "weight" else t
        elif prefix.endswith(".mlp.fc1") or name in ("embed.weight", "head.weight"):
            out[name] = slice_rows(t, rank, size)
        else:
            out[name] = t
    return out
