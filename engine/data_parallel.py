"""Data-parallel training with gradients averaged by our own ring all-reduce.

Every rank holds the same model — the project's GPT (:mod:`distai.engine.model`), built from the
same seed — takes its own slice of each global batch of token sequences, computes the gradient
of the mean next-token loss over its slice, and the ranks average those gradients with
:func:`distai.engine.ring.ring_allreduce`. With equal slices the average of the slices'
mean-loss gradients is the gradient of the mean loss over the whole batch, so every rank takes
the very step a single process would take on the full batch (the lesson's claim, checked in
``tests/test_engine_ring.py`` against single-process training and against torch's
``DistributedDataParallel``).

Gradients travel as one flat bucket (as DDP's buckets do): one all-reduce per step, not one
per parameter.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .ring import ring_allreduce


def global_batch(x: torch.Tensor, y: torch.Tensor, step: int, batch_size: int):
    """The ``step``-th global batch of rows of ``x`` (token ids) and ``y`` (their targets),
    cycling through the data set (:func:`distai.engine.model.make_batch` makes one)."""
    n = x.shape[0]
    start = (step * batch_size) % n
    idx = torch.arange(start, start + batch_size) % n
    return x[idx], y[idx]


def shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s equal slice of a global batch."""
    if batch.shape[0] % world_size:
        raise ValueError(f"the global batch ({batch.shape[0]}) must split evenly over {world_size} ranks")
    per = batch.shape[0] // world_size
    return batch[rank * per:(rank + 1) * per]


def sgd_step(params: Iterable[torch.Tensor], lr: float) -> None:
    """Plain SGD, ``p -= lr * p.grad`` (what ``torch.optim.SGD`` does without momentum; written
    out because creating a ``torch.optim`` optimizer imports torch._dynamo, seconds per rank)."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


def zero_grad(params: Iterable[torch.Tensor]) -> None:
    for p in params:
        p.grad = None


def flat_grads(params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([_grad(p).reshape(-1) for p in params])


def _grad(p: torch.Tensor) -> torch.Tensor:
    if p.grad is None:
        raise ValueError("a parameter has no gradient")
    return p.grad


def average_gradients(params: Iterable[torch.Tensor], group=None,
                      allreduce: Callable | None = None, **ring_kwargs) -> int:
    """Average every parameter's ``.grad`` over the group in one flat bucket; returns bytes.

    ``allreduce(flat)`` defaults to our ring with ``op="avg"``.
    """
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0
    flat = flat_grads(params)
    if allreduce is None:
        ring_allreduce(flat, op="avg", group=group, **ring_kwargs)
    else:
        allreduce(flat)
    offset = 0
    for p in params:
        g = _grad(p)
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel() * flat.element_size()


@dataclass
class StepStats:
    step: int
    loss: float  # the global batch's mean loss (average of the ranks' slice losses)
    compute_s: float
    comm_s: float
    grad_bytes: int


def train_data_parallel(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int,
                        batch_size: int, lr: float, rank: int, world_size: int, group=None,
                        on_step: Callable[[StepStats], None] | None = None,
                        ring_kwargs_for_step: Callable[[int], dict] | None = None,
                        allreduce: Callable | None = None) -> list[float]:
    """SGD on ``model`` for ``steps`` steps, gradients averaged with the ring; returns losses.

    ``model(ids, targets)`` is the mean loss of a slice (the GPT's next-token cross-entropy).
    ``allreduce(flat)`` replaces the ring (the tests use a do-nothing one as a negative control).
    """
    params = list(model.parameters())
    losses = []
    for step in range(steps):
        t0 = time.perf_counter()
        xb, yb = global_batch(x, y, step, batch_size)
        xs, ys = shard(xb, rank, world_size), shard(yb, rank, world_size)
        zero_grad(params)
        loss = model(xs, ys)
        loss.backward()
        t1 = time.perf_counter()
        extra = ring_kwargs_for_step(step) if ring_kwargs_for_step else {}
        nbytes = average_gradients(params, group=group, allreduce=allreduce, **extra)
        t2 = time.perf_counter()
        sgd_step(params, lr)
        # the global loss, for reporting only (not part of the training math)
        report = loss.detach().to(torch.float64).reshape(1)
        dist.all_reduce(report, group=group)
        global_loss = report.item() / world_size
        losses.append(global_loss)
        if on_step is not None:
            on_step(StepStats(step, global_loss, (t1 - t0) + (time.perf_counter() - t2), t2 - t1, nbytes))
    return losses


def train_single_process(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int,
                         batch_size: int, lr: float) -> list[float]:
    """The reference: the same SGD on the full global batch in one process."""
    return _train_on_slices(model, x, y, steps=steps, batch_size=batch_size, lr=lr, rank=0, world_size=1)


def train_ddp(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int,
              lr: float, rank: int, world_size: int) -> list[float]:
    """The same training under torch's own ``DistributedDataParallel`` (for comparison)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return _train_on_slices(DDP(model), x, y, steps=steps, batch_size=batch_size, lr=lr, rank=rank,
                            world_size=world_size)


def _train_on_slices(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int, batch_size: int,
                     lr: float, rank: int, world_size: int) -> list[float]:
    """SGD on this rank's slice of each global batch with the gradients ``model``'s backward leaves
    (DDP's are averaged over the ranks already); this rank's losses."""
    params = list(model.parameters())
    losses = []
    for step in range(steps):
        xb, yb = global_batch(x, y, step, batch_size)
        zero_grad(params)
        loss = model(shard(xb, rank, world_size), shard(yb, rank, world_size))
        loss.backward()
        sgd_step(params, lr)
        losses.append(loss.item())
    return losses
