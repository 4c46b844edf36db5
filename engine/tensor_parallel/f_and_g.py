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

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

from ..metering import comm_tags
from .group import TPGroup


def _identity(tp: TPGroup, t: torch.Tensor, site: str, **tags: Any) -> torch.Tensor:
    return t.view_as(t)


def _all_reduce(tp: TPGroup, t: torch.Tensor, site: str, **tags: Any) -> torch.Tensor:
    return tp.all_reduce(t.clone(), site, **tags)


def _all_gather(tp: TPGroup, t: torch.Tensor, site: str, **tags: Any) -> torch.Tensor:
    return tp.all_gather_seq(t, site, **tags)


def _reduce_scatter(tp: TPGroup, t: torch.Tensor, site: str, **tags: Any) -> torch.Tensor:
    return tp.reduce_scatter_seq(t, site, **tags)


_Op = Callable[..., torch.Tensor]


def _conjugate_pair(name: str, forward_op: _Op, backward_op: _Op, doc: str) -> type[torch.autograd.Function]:
    """An autograd function ``(x, tp, site)`` that runs ``forward_op`` on the input and
    ``backward_op`` on its gradient, the backward tagged with the forward's layer (f and g are
    each other's conjugate: what one does forward, the other does backward)."""

    def forward(ctx: Any, x: torch.Tensor, tp: TPGroup, site: str) -> torch.Tensor:
        ctx.tp, ctx.site, ctx.layer = tp, site, comm_tags()["layer"]
        return forward_op(tp, x, site)

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return backward_op(ctx.tp, grad, ctx.site, layer=ctx.layer, phase="bwd"), None, None

    return type(name, (torch.autograd.Function,), {"__doc__": doc, "__module__": __name__,
                                                   "forward": staticmethod(forward),
                                                   "backward": staticmethod(backward)})


CopyToTP = _conjugate_pair("CopyToTP", _identity, _all_reduce, """f: identity forward, all-reduce backward
    (the input was replicated, its gradient is a sum of every rank's partial gradient).""")
ReduceFromTP = _conjugate_pair("ReduceFromTP", _all_reduce, _identity, """g: all-reduce forward (every rank
    holds a partial sum), identity backward.""")
GatherFromSequence = _conjugate_pair("GatherFromSequence", _all_gather, _reduce_scatter, """f with sequence
    parallelism: all-gather along the sequence forward, reduce-scatter backward.""")
ReduceScatterToSequence = _conjugate_pair("ReduceScatterToSequence", _reduce_scatter, _all_gather, """g with
    sequence parallelism: reduce-scatter along the sequence forward, all-gather backward.""")


class SPColumnLinear(torch.autograd.Function):
    """All-gather along the sequence fused with column-parallel matmuls: ``apply(x_shard, tp,
    site, w_1, b_1, w_2, b_2, …)`` returns one output per (weight, bias) pair, all from one
    gathered input (attention's W_q, W_k, W_v; SwiGLU's up and gate projections).

    Saves only the rank's sequence shard of the input (``s/T·b·h``) and all-gathers it again in
    backward, once for all the weights' gradients (site ``<site>.regather``), as Megatron-LM
    does: the activation memory of the projections' input drops by T for one extra all-gather.
    """

    @staticmethod
    def forward(ctx: Any, x_shard: torch.Tensor, tp: TPGroup, site: str,
                *params: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        ctx.tp, ctx.site, ctx.layer = tp, site, comm_tags()["layer"]
        weights, biases = params[0::2], params[1::2]
        ctx.has_bias = [b is not None for b in biases]
        total = tp.all_gather_seq(x_shard, site)
        ctx.save_for_backward(x_shard, *weights)
        return tuple(F.linear(total, cast(torch.Tensor, w), b) for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x_shard, *weights = ctx.saved_tensors
        tp = ctx.tp
        grads = tuple(g.contiguous() for g in grads)
        wants_w = [ctx.needs_input_grad[3 + 2 * i] for i in range(len(weights))]
        grad_params: list[torch.Tensor | None] = []
        total = None
        # Megatron's order: the re-gather first (on GPUs it overlaps the input-gradient matmul),
        # then the reduce-scatter of the input gradient.
        if any(wants_w):
            total = tp.all_gather_seq(x_shard, ctx.site + ".regather", layer=ctx.layer, phase="bwd")
            total = total.reshape(-1, total.shape[-1])
        for i, g in enumerate(grads):
            flat = g.reshape(-1, g.shape[-1])
            grad_params.append(flat.t().matmul(total) if wants_w[i] and total is not None else None)
            grad_params.append(flat.sum(0) if ctx.has_bias[i] and ctx.needs_input_grad[4 + 2 * i] else None)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_total = sum(g.matmul(w) for g, w in zip(grads, weights))
            grad_x = tp.reduce_scatter_seq(cast(torch.Tensor, grad_total), ctx.site, layer=ctx.layer, phase="bwd")
        return (grad_x, None, None, *grad_params)
