"""PyTorch's own tensor parallelism of the same dense block, the thing ours is compared with."""
from __future__ import annotations

from typing import Any

import torch

from ..model import Block


def dtensor_parallelize_block(block: Block, mesh: Any, sequence_parallel: bool = False) -> Block:
    """``parallelize_module`` with ColwiseParallel for W_q, W_k, W_v, fc1 and RowwiseParallel for
    W_o, fc2; with SP the layer norms get SequenceParallel on the sequence dimension 0 and the
    attention / MLP inputs are all-gathered by PrepareModuleInput. In place; returns the block."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    row = (lambda: RowwiseParallel(output_layouts=Shard(0))) if sequence_parallel else RowwiseParallel
    plan: dict[str, Any] = {
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": row(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": row()}
    if sequence_parallel:
        gather = lambda: PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),))
        plan.update({"ln1": SequenceParallel(sequence_dim=0), "ln2": SequenceParallel(sequence_dim=0),
                     "attn": gather(), "mlp": gather()})
    parallelize_module(block, mesh, plan)
    return block


def full_grad(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient as a plain tensor (a DTensor's is gathered / reduced)."""
    g = p.grad
    if g is None:
        raise ValueError("this parameter has no gradient (no backward through it yet)")
    full = getattr(g, "full_tensor", None)
    return full() if full is not None else g
