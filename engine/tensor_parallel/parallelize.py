"""Tensor parallelism as a plan: :func:`apply_tp` transforms the one model
(:class:`~distai.engine.model.GPT`, or a pipeline stage of it) in place, as torchtitan's
``parallelize`` functions do; nothing here has a forward of its own but the vocabulary-parallel head.

Per block (:func:`apply_tp_block`): W_q, W_k, W_v and the MLP's up (and SwiGLU gate) projections
keep this rank's output rows (column-parallel) and sit behind one f each
(:class:`~.layers.ColumnParallelInput` as ``attn.project`` / ``mlp.project``), W_o and the MLP's
down projection keep their input columns (row-parallel, :class:`~.layers.RowParallelLinear`: g).
The attention's own code then sees ``heads/T`` query heads and its share of the key/value heads
(it infers both from the widths). The KV-heads rule: ``kv_heads % T == 0`` splits the KV heads;
``T % kv_heads == 0`` replicates each on ``T/kv_heads`` ranks (vLLM's way; in training the
replicas' W_k/W_v gradients are summed over the ranks sharing the head by :func:`sync_tp_grads`);
anything else is refused. With sequence parallelism the norms, dropouts and residual adds run on
``s/T`` of the tokens (the norms' and row biases' gradients are then partial: :func:`sync_tp_grads`).
A block whose MLP is experts (:func:`~distai.engine.moe.make_moe`) keeps them whole: under SP they
route this rank's ``s/T`` tokens, and their gradients are partial like the norms'.

The whole model (:func:`apply_tp`): the embedding and the LM head split by vocabulary
(:class:`VocabParallelHead`, the embedding's shard when tied) and the vocabulary-parallel loss,
or (``vocab_parallel=False``, for decoding) both replicated. Parameter names stay the dense
model's, so :func:`shard_dense_state` maps a dense tensor to a rank's shard by name.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TypeVar, cast

import torch
import torch.nn as nn

from ...lessons.lesson7.formulas import kv_heads_per_gpu
from ..metering import comm_scope
from ..model import GPT, MLP, Block, Head, ModelConfigError, ModelStage
from .group import TPGroup
from .layers import (
    ColumnParallelInput,
    RowParallelLinear,
    column_parallel,
    mark_sequence_parallel,
    slice_cols,
    slice_rows,
)
from .vocab_parallel import VocabParallelEmbedding, vocab_parallel_loss

#: the one model, or a pipeline stage of it
Part = TypeVar("Part", GPT, ModelStage)


class VocabParallelHead(nn.Module):
    """The final norm (replicated) and this rank's ``V/T`` rows of the LM head (the embedding's
    shard when the model is tied): ``[s, b, h]`` (or this rank's ``[s/T, b, h]``) → this rank's
    logits ``[s, b, V/T]``; :meth:`loss` is the vocabulary-parallel cross-entropy."""

    def __init__(self, dense: Head, tp: TPGroup, tied_to: VocabParallelEmbedding | None = None):
        super().__init__()
        self.norm = dense.norm
        if tp.splits_sequence:
            mark_sequence_parallel(*self.norm.parameters())
        self._tied = [tied_to] if tied_to is not None else []  # a list: not registered twice
        if dense.weight is None and tied_to is None:
            raise ValueError("a tied head needs its (vocabulary-parallel) embedding on the same rank")
        self.weight = (nn.Parameter(slice_rows(dense.weight, tp.rank, tp.size).detach().clone())
                       if dense.weight is not None else None)
        self.tp = tp
        self.vocab_start = tp.rank * self.lm_weight.shape[0]

    @property
    def lm_weight(self) -> torch.Tensor:
        return self.weight if self.weight is not None else self._tied[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with comm_scope("head", "fwd"):
            (logits,) = column_parallel(self.norm(x), self.tp, "head.f", [(self.lm_weight, None)])
        return logits

    def loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_loss(self(x), targets, self.tp, self.vocab_start)


def _keep_rows(lin: nn.Module, start: int, n: int) -> None:
    """Keep output rows ``[start, start + n)`` of an ``nn.Linear`` (its bias too), in place."""
    lin = cast(nn.Linear, lin)
    lin.weight = nn.Parameter(lin.weight.detach()[start:start + n].clone())
    if lin.bias is not None:
        lin.bias = nn.Parameter(lin.bias.detach()[start:start + n].clone())
    lin.out_features = n


def kv_shard(heads: int, kv_heads: int, rank: int, size: int) -> tuple[int, int]:
    """(first KV head, KV heads) of tensor-parallel rank ``rank``: those its query heads use."""
    kv_local = kv_heads_per_gpu(kv_heads, size)  # raises unless one divides the other
    return (rank * (heads // size)) // (heads // kv_heads), kv_local


def apply_tp_block(block: Block, tp: TPGroup) -> Block:
    """Split one block over ``tp`` in place (see the module docstring); returns it."""
    r, t = tp.rank, tp.size
    attn, d = block.attn, block.attn.head_dim
    kv_heads = attn.wk.out_features // d
    q_local = attn.heads // t
    kv0, kv_local = kv_shard(attn.heads, kv_heads, r, t)
    _keep_rows(attn.wq, r * q_local * d, q_local * d)
    for lin in (attn.wk, attn.wv):
        _keep_rows(lin, kv0 * d, kv_local * d)
        if kv_local * t > kv_heads:  # replicated: every rank sharing the head holds a partial gradient
            for p in lin.parameters():
                p.kv_replica = (kv0, kv_heads)  # type: ignore[attr-defined]  # a tag on the Parameter
    wo = cast(nn.Linear, attn.wo)
    attn.wo = RowParallelLinear(slice_cols(wo.weight, r, t), wo.bias, tp, "attn.g")
    attn.project = ColumnParallelInput(tp, "attn.f")
    attn.head_offset = r * q_local
    if isinstance(block.mlp, MLP):
        _split_mlp(block.mlp, tp)
    elif tp.splits_sequence:  # experts (apply_ep) stay whole: they see this rank's s/T tokens
        mark_sequence_parallel(*block.mlp.parameters())
    if tp.splits_sequence:
        mark_sequence_parallel(*block.ln1.parameters(), *block.ln2.parameters())
        block.sequence_shard = (r, t)
    return block


def _split_mlp(mlp: MLP, tp: TPGroup) -> None:
    r, t = tp.rank, tp.size
    f_local = mlp.fc1.out_features // t
    for column in (mlp.fc1, mlp.gate):
        if column is not None:
            _keep_rows(column, r * f_local, f_local)
    fc2 = cast(nn.Linear, mlp.fc2)
    mlp.fc2 = RowParallelLinear(slice_cols(fc2.weight, r, t), fc2.bias, tp, "mlp.g")
    mlp.project = ColumnParallelInput(tp, "mlp.f")


def apply_tp(model: Part, tp: TPGroup, vocab_parallel: bool = True) -> Part:
    """Split the model (or a pipeline stage of it: its embedding and head only if it holds them)
    over ``tp`` in place; returns it. ``model(ids, targets)`` is then the mean cross-entropy over
    all ``s·b`` tokens (the same number on every rank) and ``model(ids)`` this rank's ``V/T``
    logits. With ``vocab_parallel=False`` (decoding) the embedding and head stay whole and
    replicated: ``model(ids)`` is the full logits on every rank."""
    cfg = model.cfg
    if vocab_parallel:
        cfg.check_tp(tp.size, tp.sequence_parallel)
    elif tp.splits_sequence:
        raise ModelConfigError("sequence parallelism shards the embedding's output: keep vocab_parallel")
    for block in model.block_list():
        apply_tp_block(block, tp)
    if not vocab_parallel:
        return model
    embed = cast(nn.Module | None, model.embed)
    if embed is not None:
        model.embed = VocabParallelEmbedding(cast(torch.Tensor, embed.weight), tp)  # type: ignore[assignment]
    head = cast(Head | None, model.head)
    if head is not None:
        tied = cast(VocabParallelEmbedding | None, model.embed) if cfg.tie_embeddings else None
        model.head = VocabParallelHead(head, tp, tied)  # type: ignore[assignment]
    return model


def sync_tp_grads(model: nn.Module, tp: TPGroup) -> int:
    """All-reduce, over the tensor-parallel group, the gradients that are partial on each rank:
    those of parameters that saw only a sequence shard (norms, row-parallel biases, with SP) and
    those of replicated key/value heads (each rank's slot of a zero-padded tensor of all KV
    heads, so the sum adds exactly the ranks sharing a head). One flattened all-reduce per layer
    (site ``sp.grads``, or ``kv.grads`` without SP). Returns how many were run.

    Without it each rank's norm gradient covers only its ``s/T`` tokens and the replicated
    weights silently drift apart (the classic bug of sequence parallelism)."""
    if tp.size == 1:
        return 0
    groups: dict[str, list[nn.Parameter]] = defaultdict(list)
    for name, p in model.named_parameters():
        partial = getattr(p, "sequence_parallel", False) or hasattr(p, "kv_replica")
        if partial and p.grad is not None:
            parts = name.split(".")
            groups[parts[parts.index("blocks") + 1] if "blocks" in parts else "head"].append(p)
    for layer, params in groups.items():
        pieces = []
        for p in params:
            g = cast(torch.Tensor, p.grad)
            if hasattr(p, "kv_replica"):
                head, heads = p.kv_replica
                padded = g.new_zeros((heads, *g.shape))
                padded[head] = g
                g = padded
            pieces.append(g.reshape(-1))
        site = "sp.grads" if tp.splits_sequence else "kv.grads"
        flat = tp.all_reduce(torch.cat(pieces), site, layer=layer, phase="grad-sync")
        offset = 0
        for p, piece in zip(params, pieces):
            g = cast(torch.Tensor, p.grad)
            got = flat[offset:offset + piece.numel()]
            g.copy_(got.view(p.kv_replica[1], *g.shape)[p.kv_replica[0]] if hasattr(p, "kv_replica")
                    else got.view_as(g))
            offset += piece.numel()
    return len(groups)


_COLUMN = (".attn.wq", ".mlp.fc1", ".mlp.gate")
_ROW = (".attn.wo", ".mlp.fc2")


def shard_dense_state(dense: dict[str, torch.Tensor], rank: int, size: int, heads: int | None = None,
                      kv_heads: int | None = None) -> dict[str, torch.Tensor]:
    """The dense model's tensors (weights or gradients) cut the way rank ``rank`` of ``size``
    holds them after :func:`apply_tp` (same names): column-parallel rows, row-parallel weight
    columns (their biases whole), the vocabulary's rows of the embedding and head, this rank's
    key/value heads of W_k/W_v (give ``heads`` and ``kv_heads`` when they differ)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in dense.items():
        prefix, _, leaf = ("." + name).rpartition(".")
        if prefix.endswith((".attn.wk", ".attn.wv")) and kv_heads is not None and heads is not None:
            d = t.shape[0] // kv_heads
            kv0, n = kv_shard(heads, kv_heads, rank, size)
            out[name] = t[kv0 * d:(kv0 + n) * d]
        elif prefix.endswith(_ROW):
            out[name] = slice_cols(t, rank, size) if leaf == "weight" else t
        elif prefix.endswith(_COLUMN + (".attn.wk", ".attn.wv")) or name in ("embed.weight", "head.weight"):
            out[name] = slice_rows(t, rank, size)
        else:
            out[name] = t
    return out
