"""Megatron's f and g (Shoeybi et al. 2019) and their sequence-parallel forms (Korthikanti et
al. 2022), as ``torch.autograd.Function`` s.

* **f** (:class:`CopyToTP`): identity forward, all-reduce backward. Sits before a column-parallel
  linear: the input is replicated, so each rank's input gradient is a *partial* sum.
* **g** (:class:`ReduceFromTP`): all-reduce forward, identity backward. Sits after a row-parallel
  linear: each rank's output is a partial sum; the gradient of a sum is the same on every rank.
* With sequence parallelism g becomes a reduce-scatter along the sequence
  (:class:`ReduceScatterToSequence`) and f an all-gather along it (:class:`GatherFromSequence`,
  or :class:`SPColumnLinear`, which fuses it with the column-parallel matmul and keeps only the
  sequence shard of its input, all-gathering it again in backward).

A function remembers the layer its forward ran in and tags its backward collectives with it
(phase ``bwd``).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..metering import comm_tags
from .group import TPGroup


class CopyToTP(torch.autograd.Function):
    """f: identity forward, all-reduce backward (the input was replicated, its gradient is a sum
    of every rank's partial gradient)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup, site: str) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.layer = tp, site, comm_tags()["layer"]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.tp.all_reduce(grad.clone(), ctx.site, layer=ctx.layer, phase="bwd"), None, None


class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce forward (every rank holds a partial sum), identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup, site: str) -> torch.Tensor:
        return tp.all_reduce(x.clone(), site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class GatherFromSequence(torch.autograd.Function):
    """f with sequence parallelism: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup, site: str) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.layer = tp, site, comm_tags()["layer"]
        return tp.all_gather_seq(x, site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.tp.reduce_scatter_seq(grad, ctx.site, layer=ctx.layer, phase="bwd"), None, None


class ReduceScatterToSequence(torch.autograd.Function):
    """g with sequence parallelism: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup, site: str) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.layer = tp, site, comm_tags()["layer"]
        return tp.reduce_scatter_seq(x, site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.tp.all_gather_seq(grad, ctx.site, layer=ctx.layer, phase="bwd"), None, None


class SPColumnLinear(torch.autograd.Function):
    """All-gather along the sequence fused with a column-parallel matmul.

    Saves only the rank's sequence shard of the input (``s/T·b·h``) and all-gathers it again in
    backward to form the weight gradient (site ``<site>.regather``), as Megatron-LM does: the
    activation memory of the linear's input drops by T for one extra all-gather per linear.
    """

    @staticmethod
    def forward(ctx: Any, x_shard: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                tp: TPGroup, site: str) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.layer = tp, site, comm_tags()["layer"]
        ctx.has_bias = bias is not None
        total = tp.all_gather_seq(x_shard, site)
        ctx.save_for_backward(x_shard, weight)
        return F.linear(total, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_shard, weight = ctx.saved_tensors
        tp = ctx.tp
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        # Megatron's order: the re-gather first (on GPUs it overlaps the input-gradient matmul),
        # then the reduce-scatter of the input gradient.
        if ctx.needs_input_grad[1]:
            total = tp.all_gather_seq(x_shard, ctx.site + ".regather", layer=ctx.layer, phase="bwd")
            grad_w = grad.reshape(-1, grad.shape[-1]).t().matmul(total.reshape(-1, total.shape[-1]))
        if ctx.needs_input_grad[0]:
            grad_total = grad.matmul(weight)
            grad_x = tp.reduce_scatter_seq(grad_total, ctx.site, layer=ctx.layer, phase="bwd")
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.reshape(-1, grad.shape[-1]).sum(0)
        return grad_x, grad_w, grad_b, None, None
