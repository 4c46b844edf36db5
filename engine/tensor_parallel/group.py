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
from ..time_causes import run_queue_s


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
        #: when a list: the wall-clock times this rank entered and left each collective, and the
        #: run-queue delay and on-CPU time it had meanwhile (the peers' wait, the collective's own
        #: time, ``engine/time_causes.collective_causes``)
        self.spans: list[tuple[float, float, float, float]] | None = None

    @contextmanager
    def _timed(self) -> Iterator[None]:
        if self.spans is None:
            yield
            return
        t0, q0, c0 = time.time(), run_queue_s(), time.thread_time()
        yield
        self.spans.append((t0, time.time(), run_queue_s() - q0, time.thread_time() - c0))

    @property
    def splits_sequence(self) -> bool:
        return self.sequence_parallel and self.size > 1

    def all_reduce(self, t: torch.Tensor, site: str, *, op: Any = None, layer: object = None,
                   phase: str | None = None) -> torch.Tensor:
        if self.size == 1 or site in self.skip_sites:
            return t
        t = t.contiguous()
        with comm_scope(layer, phase, site), self._timed():
            dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=self.group)
        return t

    def all_gather_seq(self, t: torch.Tensor, site: str, *, layer: object = None,
                       phase: str | None = None) -> torch.Tensor:
        if self.size == 1:
            return t
        t = t.contiguous()
        out = torch.empty((t.shape[0] * self.size, *t.shape[1:]), dtype=t.dtype, device=t.device)
        with comm_scope(layer, phase, site), self._timed():
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
        with comm_scope(layer, phase, site), self._timed():
            reduce_scatter_into(out, t, self.group)
        return out
