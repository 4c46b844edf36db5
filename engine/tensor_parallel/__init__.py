"""Megatron-style tensor parallelism of the GPT (:mod:`distai.engine.model`), written from scratch.

Everything here is plain ``torch.distributed`` (gloo on CPU, NCCL on GPU) and a handful of
``torch.autograd.Function`` s; PyTorch's own DTensor tensor parallelism is only used by the
experiment and the tests, as the thing we are compared with.

The pieces, in the order lesson 4 teaches them (Shoeybi et al. 2019, Korthikanti et al. 2022):

* **f** (:class:`CopyToTP`): identity forward, all-reduce backward. Sits before a column-parallel
  linear: the input is replicated, so each rank's input gradient is a *partial* sum.
* **g** (:class:`ReduceFromTP`): all-reduce forward, identity backward. Sits after a row-parallel
  linear: each rank's output is a partial sum; the gradient of a sum is the same on every rank.
* Column-parallel projections (weight rows = output features split) and row-parallel linear
  (input features split): the MLP is column then row, attention is W_q, W_k, W_v column-parallel
  (so each rank owns whole heads) then the output projection row-parallel. One f and one g per
  sub-block, i.e. 2 all-reduces forward and 2 backward per layer. All of it is a plan
  (:func:`apply_tp`) applied to the one model: the attention and MLP code are the model's own.
* **Sequence parallelism** (``sequence_parallel=True``): g becomes a reduce-scatter along the
  sequence (:class:`ReduceScatterToSequence`) and f an all-gather along the sequence
  (:class:`SPColumnLinear` fuses it into the column-parallel matmul and, like Megatron, keeps
  only the sequence shard of its input, all-gathering it again in backward). Layer norms,
  dropouts and residual adds then run on ``s/T`` of the tokens. The layer-norm weights and the
  row-parallel biases see only a shard of the sequence, so their gradients are partial sums
  that need their own all-reduce: :func:`sync_tp_grads` (the classic bug is to
  forget it).
* A vocabulary-parallel embedding (:class:`VocabParallelEmbedding`) and cross-entropy
  (:class:`VocabParallelCrossEntropy`): the max and the sum of exponentials (and the target
  logit) are all-reduced over ``s·b`` numbers; no rank ever holds more than ``V/T`` logits.

Token ids are ``[batch, sequence]``; activations are laid out ``[sequence, batch, hidden]`` (Megatron's ``s, b, h``) so that
sequence shards are contiguous along dimension 0.

Every collective is tagged (:func:`~distai.engine.metering.comm_scope`) with the layer it belongs
to, whether it ran in forward, backward or the gradient sync, and its site, so a
:class:`~distai.engine.metering.CommMeter` around a step can check the counts and bytes against
the lesson's formulas. Bytes are given two ways: ``payload_bytes``, the size of
the full (unsharded) tensor the collective is about, and ``wire_bytes``, what one rank sends
with the ring algorithm (all-reduce ``2(T-1)/T·N``, all-gather and reduce-scatter ``(T-1)/T·N``
each, so that a reduce-scatter plus an all-gather moves exactly what one all-reduce does).

Dropout masks are drawn by :class:`~distai.engine.model.DropoutMasks` for the *full* tensor from a seed that depends
only on (seed, step, layer, site), then sliced to the rank's heads or sequence shard, so the
tensor-parallel block is exactly the dense block, dropout included. (Megatron instead forks the
random generator per rank inside the sharded regions; the masks are then different draws from
the same distribution.)

Where each idea lives: ``group.py`` (the group and its tagged collectives), ``f_and_g.py``
(f, g and their sequence-parallel forms), ``layers.py`` (column/row-parallel projections),
``vocab_parallel.py`` (the embedding and the cross-entropy), ``parallelize.py`` (the plan:
:func:`apply_tp_block`, :func:`apply_tp`, the partial-gradient sync, the dense-to-shard map),
``dtensor_reference.py`` (PyTorch's DTensor plan for the same block).
"""
from __future__ import annotations

from .dtensor_reference import dtensor_parallelize_block, full_grad
from .f_and_g import CopyToTP, GatherFromSequence, ReduceFromTP, ReduceScatterToSequence, SPColumnLinear
from .group import TPGroup
from .layers import ColumnParallelInput, RowParallelLinear, column_parallel
from .parallelize import VocabParallelHead, apply_tp, apply_tp_block, shard_dense_state, sync_tp_grads
from .vocab_parallel import VocabParallelCrossEntropy, VocabParallelEmbedding, vocab_parallel_loss

__all__ = [
    "TPGroup", "CopyToTP", "ReduceFromTP", "GatherFromSequence", "ReduceScatterToSequence", "SPColumnLinear",
    "ColumnParallelInput", "RowParallelLinear", "column_parallel", "VocabParallelEmbedding",
    "VocabParallelCrossEntropy", "vocab_parallel_loss", "VocabParallelHead", "apply_tp", "apply_tp_block",
    "sync_tp_grads", "shard_dense_state", "dtensor_parallelize_block", "full_grad",
]
