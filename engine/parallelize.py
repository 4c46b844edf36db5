"""Every parallelism is a plan: a function that takes the one model (:class:`~distai.engine.model.GPT`)
or a pipeline stage of it, and a process group or mesh dimension, and transforms it — as
torchtitan's ``parallelize`` functions do. A run builds its model once and applies plans to it::

    model = GPT(cfg, seed=0)
    stages = split_stages(model, pp)            # pipeline: the stages share the model's modules
    stage = apply_tp(stages[s], TPGroup(tp_group, sequence_parallel=True))  # tensor (+ sequence)
    ddp = apply_dp(stage, dp_group)             # data parallelism (or apply_zero / apply_fsdp)

* :func:`apply_tp` (:mod:`distai.engine.tensor_parallel`): Megatron's column/row-parallel blocks,
  the vocabulary-parallel embedding, head and loss, sequence parallelism; the Llama shape too.
* :func:`split_stages` (:mod:`distai.engine.pipeline`): embedding / blocks / head cut into
  the stages the pipeline runner runs.
* :func:`apply_dp`, :func:`apply_zero`, :func:`apply_fsdp`: the gradient all-reduce (ours,
  bucketed and overlapped, or torch's DDP), ZeRO stage 1-3 (ours) or torch's FSDP2 over the
  model's units.
* :func:`apply_cp` (:mod:`distai.engine.context_parallel`): ring attention installed as every
  block's ``attn.core``.
* :func:`apply_ep` (:mod:`distai.engine.moe`): the experts of a mixture-of-experts model (its
  blocks' ``mlp``) sharded over an expert-parallel group.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .bucketing import BucketedDataParallel
from .context_parallel import apply_cp
from .model import GPT, ModelStage
from .moe import apply_ep
from .pipeline import split_stages
from .tensor_parallel import apply_tp, apply_tp_block, sync_tp_grads
from .zero import ZeroEngine

__all__ = ["apply_tp", "apply_tp_block", "sync_tp_grads", "split_stages", "apply_dp", "apply_zero", "apply_fsdp",
           "apply_cp", "apply_ep"]


def apply_dp(model: nn.Module, group: Any = None, impl: str = "bucketed", bucket_cap_mb: float | None = None,
             **options: Any) -> nn.Module:
    """The model wrapped for data parallelism over ``group``: ``impl="bucketed"`` is ours
    (:class:`~distai.engine.bucketing.BucketedDataParallel`, ``options`` such as ``overlap``,
    ``rebuild_buckets``), ``"ddp"`` torch's ``DistributedDataParallel`` (``options`` such as
    ``device_ids``, ``gradient_as_bucket_view``)."""
    if impl == "bucketed":
        return BucketedDataParallel(model, bucket_cap_mb, process_group=group, **options)
    if impl == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        if bucket_cap_mb is not None:
            options["bucket_cap_mb"] = bucket_cap_mb
        return DDP(model, process_group=group, **options)
    raise ValueError(f"data parallelism is 'bucketed' or 'ddp', not {impl!r}")


def _units(model: nn.Module) -> list[nn.Module]:
    if not isinstance(model, (GPT, ModelStage)):
        raise TypeError(f"ZeRO and FSDP2 shard the model's units: a GPT or a stage of it, not {type(model).__name__}")
    return model.units()


def apply_zero(model: nn.Module, stage: int, optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
               group: Any = None, **options: Any) -> ZeroEngine:
    """Our ZeRO stage 1, 2 or 3 over the model's units (embedding, each block, head), the
    optimizer state (and, from stage 2, gradients; at 3, parameters) sharded over ``group``."""
    return ZeroEngine(_units(model), stage, optimizer, group=group, **options)


def apply_fsdp(model: nn.Module, mesh: Any, **options: Any) -> nn.Module:
    """torch's FSDP2: ``fully_shard`` on every unit of the model, then on the model itself (in
    place; returns it)."""
    from torch.distributed.fsdp import fully_shard

    for unit in _units(model):
        fully_shard(unit, mesh=mesh, **options)
    fully_shard(model, mesh=mesh, **options)
    return model
