"""The two tensor collectives whose names moved between torch releases, in one place.

``all_gather_into_tensor`` / ``reduce_scatter_tensor`` are deprecated in favour of
``all_gather_single`` / ``reduce_scatter_single`` (torch ≥ 2.10); older releases only have the
former. Both write into a preallocated ``out`` along dimension 0, and both are what NCCL runs
as ring collectives. (Gloo's ``reduce_scatter_tensor`` is an all-reduce of a copy: see
:class:`distai.engine.zero.Collectives` for a reduce-scatter with a real one's traffic.)
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["all_gather_into", "reduce_scatter_into"]


def all_gather_into(out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """``out`` (N× ``inp`` along dim 0) <- every rank's ``inp``, in rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def reduce_scatter_into(out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
    """``out`` <- the sum over ranks of this rank's 1/N slice (along dim 0) of ``inp``."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, op=dist.ReduceOp.SUM, group=group, async_op=async_op)
