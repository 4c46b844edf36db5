"""The tensor-parallel group: the ranks that share one layer's weights, the mode (with or
without sequence parallelism), and its collectives, each tagged with the site it serves so a
:class:`~distai.engine.metering.CommMeter` can tell f from g and forward from backward.

Collectives are skipped entirely on one rank (nothing to talk to).
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from ..collectives import all_gather_into, reduce_scatter_into
from ..metering import comm_scope
from ..time_causes import longest_thread_wait_s, run_queue_s, threads_run_queue_s


class TPGroup:
    """The ranks that split each layer, and how (``sequence_parallel``, ``regather``)."""

    def __init__(self, group: Any = None, sequence_parallel: bool = False, regather: bool = True,
                 skip_sites: Iterable[str] = ()):
        if dist.is_available() and dist.is_initialized():
            self.size = dist.get_world_size(group)
            self.rank = dist.get_rank(group)
        else:
            self.size, self.rank = 1, 0
        self.group = group
        self.sequence_parallel = sequence_parallel
        # With SP, keep only the sequence shard of a column-parallel linear's input and
        # all-gather it again in backward (Megatron's choice: saves memory, costs 2 all-gathers).
        self.regather = regather
        # For the lesson's bug demonstrations only: all-reduces at these sites are silently
        # skipped (e.g. {"mlp.g"}: "forgot g"), and the dense comparison must catch it.
        self.skip_sites = frozenset(skip_sites)
        #: the widest logits any rank's loss held (vocab-parallel: V/T, never V)
        self.max_logits_width = 0
        #: when a list: the wall-clock times this rank entered and left each collective, the
        #: run-queue delay and on-CPU time it had meanwhile, and the longest wait for a core of any
        #: of its threads, the backend's included (``engine/time_causes.collective_causes``)
        self.spans: list[tuple[float, ...]] | None = None
        #: read every thread's wait for a core around each collective (the spans' last two fields);
        #: off, the spans keep the clocks and the caller's own wait (a caller reads the backend's
        #: threads' waits around its whole step: ``time_causes.Window.backend_wait_s``)
        self.thread_waits = True

    @contextmanager
    def _timed(self, t: torch.Tensor) -> Iterator[None]:
        if self.spans is None:
            yield
            return
        # NCCL returns once the collective is queued: a timed span waits for the GPU on both sides, so
        # that it holds the collective's run (and its wait for the peers), not the queued compute before
        sync = torch.cuda.synchronize if t.is_cuda else (lambda: None)
        sync()
        if not self.thread_waits:  # the caller's own wait for a core only: one read each side
            q0, c0, t0 = run_queue_s(), time.thread_time(), time.time()
            yield
            sync()
            t1, c1, q1 = time.time(), time.thread_time(), run_queue_s()
            self.spans.append((t0, t1, q1 - q0, c1 - c0))
            return
        threads = threads_run_queue_s()  # read outside the span: its cost is the step's, not the collective's
        q0, c0, t0 = run_queue_s(), time.thread_time(), time.time()
        yield
        sync()
        t1, c1, q1 = time.time(), time.thread_time(), run_queue_s()
        self.spans.append((t0, t1, q1 - q0, c1 - c0, longest_thread_wait_s(threads)))

    @property
    def splits_sequence(self) -> bool:
        return self.sequence_parallel and self.size > 1

    def all_reduce(self, t: torch.Tensor, site: str, *, op: Any = None, layer: object = None,
                   phase: str | None = None) -> torch.Tensor:
        skipped = site in self.skip_sites
        if self.size == 1 or (skipped and self.spans is None):
            return t
        t = t.contiguous()
        # a timed twin (spans kept) skips only the collective: the step's other work, its
        # timing included, is the twin's too
        with comm_scope(layer, phase, site), self._timed(t):
            if not skipped:
                dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=self.group)
        return t

    def all_gather_seq(self, t: torch.Tensor, site: str, *, layer: object = None,
                       phase: str | None = None) -> torch.Tensor:
        if self.size == 1:
            return t
        t = t.contiguous()
        out = torch.empty((t.shape[0] * self.size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        with comm_scope(layer, phase, site), self._timed(t):
            all_gather_into(out, t, self.group)
        return out

    def reduce_scatter_seq(self, t: torch.Tensor, site: str, *, layer: object = None,
                           phase: str | None = None) -> torch.Tensor:
        if self.size == 1:
            return t
        if t.shape[0] % self.size:
            raise ValueError(f"sequence length {t.shape[0]} is not divisible by T={self.size}")
        t = t.contiguous()
        out = torch.empty((t.shape[0] // self.size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        with comm_scope(layer, phase, site), self._timed(t):
            reduce_scatter_into(out, t, self.group)
        return out
