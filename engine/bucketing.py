"""Gradient buckets whose all-reduce overlaps backward, written from scratch (lesson 6).

Data parallelism all-reduces every gradient once per step. Doing it after backward leaves the
network idle while backward computes and the processors idle while the network works.
Backward produces gradients from the last layer to the first, so the gradients of the last
layers are final long before backward ends: :class:`BucketedDataParallel` groups parameters
into *buckets* of about ``bucket_cap_mb`` MiB, in reverse order of ``module.parameters()``
(an approximation of the order backward produces them), and an autograd hook on each
parameter (``register_post_accumulate_grad_hook``) copies its gradient into its bucket's flat
buffer. When every gradient of a bucket has arrived, the bucket's all-reduce is launched
asynchronously (``async_op=True``) while backward continues with earlier layers; at the end
of backward a callback waits for all of them and copies the averaged gradients back into
``.grad``. ``overlap=False`` is the baseline: same buckets, all launched after backward.

The bucket rules are those of ``torch.nn.parallel.DistributedDataParallel`` (checked by the
tests): a bucket closes once its size reaches the current limit; the first bucket may have a
smaller limit (``first_bucket_mb``; DDP uses 1 MiB when ``bucket_cap_mb`` is left at its
default of 25 MiB, and ``bucket_cap_mb`` otherwise), so the first all-reduce can start early;
gradients are divided by the world size while being copied into the bucket; buckets are
all-reduced in order (every rank must issue the same collectives in the same order).
Like DDP (with ``find_unused_parameters=False``, its default), the first backward, whose gradient
order is not known yet, all-reduces every parameter in one bucket laid out in ``parameters()`` order;
after it the buckets are built in the order the gradients actually became ready (rank 0's order,
broadcast). With ``rebuild_buckets=False`` the reverse ``parameters()`` order under the limits is kept
from the start.

:class:`StepTimeline` records, for one step, when backward finished each layer's gradients and
when each bucket's all-reduce started and ended (seconds from the step's start); the lesson
draws it. :func:`ddp_timed_allreduce_hook` is a DDP communication hook doing what DDP's default
does (divide, all-reduce) while reporting the same bucket times, so torch DDP's timeline can be
drawn next to ours.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..lessons.lesson6.formulas import DDP_BUCKET_CAP_MB as DEFAULT_BUCKET_CAP_MB
from ..lessons.lesson6.formulas import DDP_FIRST_BUCKET_BYTES as DEFAULT_FIRST_BUCKET_BYTES
from ..lessons.lesson6.formulas import MiB as MIB
from ..lessons.lesson6.formulas import ddp_buckets
from .time_causes import longest_thread_wait_s, threads_run_queue_s

#: the limit of DDP's first-iteration bucket (``sys.maxsize`` in DistributedDataParallel): no limit
ONE_BUCKET_BYTES = sys.maxsize


def assign_buckets(sizes: Sequence[int], limits: Sequence[int],
                   keys: Sequence[object] | None = None) -> list[list[int]]:
    """Group positions ``0..len(sizes)-1`` (taken in that order) into buckets.

    Same rule as DDP's ``compute_bucket_assignment_by_size``: tensors of one key (dtype and
    device) accumulate into an open bucket; once its byte size reaches the current limit the
    bucket closes and the next limit applies (``limits`` is ``[first, cap]`` or ``[cap]``).
    Leftover open buckets close at the end. Buckets are returned in the order of their first
    member. Per key this is the lesson's formula :func:`ddp_buckets`.
    """
    if not limits or any(l <= 0 for l in limits) or len(limits) > 2:
        raise ValueError(f"bucket size limits must be one or two positive sizes, got {list(limits)}")
    keys = list(keys) if keys is not None else [None] * len(sizes)
    by_key: dict[object, list[int]] = {}
    for pos, key in enumerate(keys):
        by_key.setdefault(key, []).append(pos)
    done: list[list[int]] = []
    for positions in by_key.values():
        groups = ddp_buckets([sizes[p] for p in positions], bucket_cap_bytes=limits[-1],
                             first_bucket_bytes=limits[0])
        done.extend([positions[i] for i in g] for g in groups)
    done.sort(key=lambda b: b[0])
    return done


def bucket_limits(bucket_cap_mb: float | None, first_bucket_mb: float | None = None) -> list[int]:
    """DDP's limits: ``[1 MiB, 25 MiB]`` by default; ``[cap, cap]`` when a cap is given."""
    cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * MIB)
    if first_bucket_mb is not None:
        first = int(first_bucket_mb * MIB)
    else:
        first = DEFAULT_FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap
    if cap <= 0 or first <= 0:
        raise ValueError("bucket sizes must be positive")
    return [first, cap] if first < cap else [cap]


class StepTimeline:
    """Times (seconds since :meth:`begin`) of gradient readiness and bucket all-reduces.

    ``attach(module)`` records gradient readiness with its own hooks (used for torch DDP);
    :class:`BucketedDataParallel` reports into a timeline passed to it instead. ``thread_waits``:
    also ``waited``, each bucket's longest wait for a core of the backend's threads while it ran
    (``time_causes.threads_run_queue_s``, read at its launch and in its completion callback), and
    ``seen_wait``: how long the calling thread waited for a core between the last bucket's end and
    the ``comm_done`` mark (woken, not yet running: the step sees its communication end late).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, thread_waits: bool = False):
        self.clock = clock
        # thread_waits: each bucket's longest wait for a core of the backend's threads while it ran
        # (from its launch or the previous bucket's end, whichever is later, to its end)
        self.thread_waits = thread_waits
        self.waited: dict[int, float] = {}
        self._queued: dict[int, tuple[float, dict[str, float]]] = {}  # launch or previous end: (time, waits)
        self._caller = 0
        self._last_done = (float("-inf"), 0.0)  # the latest bucket end: (time, the caller's wait so far)
        self.seen_wait = 0.0
        self.t0 = clock()
        self.wall0 = time.time()
        self.ready: dict[str, float] = {}
        self.marks: dict[str, float] = {}
        self.launch: dict[int, float] = {}
        self.done: dict[int, float] = {}
        self.nbytes: dict[int, int] = {}
        self._handles: list = []

    def now(self) -> float:
        return self.clock() - self.t0

    def begin(self) -> None:
        self.t0 = self.clock()
        self.wall0 = time.time()  # the same instant on the wall clock: where a run's trace places it
        self.ready.clear(); self.marks.clear(); self.launch.clear(); self.done.clear()
        self.nbytes.clear(); self.waited.clear(); self._queued.clear()
        self._last_done, self.seen_wait = (float("-inf"), 0.0), 0.0

    def mark(self, name: str) -> None:
        self.marks[name] = self.now()
        if self.thread_waits and name == "comm_done" and self.done:
            caller = threads_run_queue_s().get(str(self._caller))
            if caller is not None:
                self.seen_wait = max(0.0, caller - self._last_done[1])

    def grad_ready(self, name: str) -> None:
        self.ready[name] = self.now()

    def bucket_launched(self, index: int, nbytes: int) -> None:
        self.launch[index] = self.now()
        self.nbytes[index] = int(nbytes)
        if self.thread_waits:
            self._caller = threading.get_native_id()
            prev = self._queued.get(index)
            if prev is None or prev[0] < self.launch[index]:
                self._queued[index] = (self.launch[index], threads_run_queue_s())

    def bucket_done(self, index: int) -> None:
        self.done[index] = self.now()
        if self.thread_waits:
            since = self._queued.get(index)
            now = threads_run_queue_s()
            if since is not None:
                self.waited[index] = longest_thread_wait_s(since[1], skip=str(self._caller), now=now)
            if self.done[index] > self._last_done[0]:
                self._last_done = (self.done[index], now.get(str(self._caller), 0.0))
            # the next bucket runs from here if it was launched before
            nxt = self._queued.get(index + 1)
            if nxt is None or nxt[0] < self.done[index]:
                self._queued[index + 1] = (self.done[index], now)

    def attach(self, module: torch.nn.Module, prefix: str = "") -> StepTimeline:
        for name, p in module.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(
                    lambda _p, n=prefix + name: self.grad_ready(n)))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def layers(self) -> list[tuple[str, float, float]]:
        """``(layer, start, end)``: a layer's backward ends when its last gradient is ready and
        starts when the previous one ended (or at the ``backward`` mark)."""
        ends: dict[str, float] = {}
        for name, t in self.ready.items():
            layer = name.rsplit(".", 1)[0] if "." in name else name
            layer = layer.removeprefix("module.")
            ends[layer] = max(t, ends.get(layer, t))
        start = self.marks.get("backward", min(ends.values(), default=0.0))
        out = []
        for layer, end in sorted(ends.items(), key=lambda kv: kv[1]):
            out.append((layer, start, end))
            start = end
        return out

    def to_event(self, **fields) -> dict:
        """The ``timeline`` event of lesson 6 (milliseconds)."""
        ms = lambda s: round(s * 1000.0, 3)  # noqa: E731
        return {
            **fields,
            "t_begin": self.wall0,
            "marks": {k: ms(v) for k, v in self.marks.items()},
            "layers": [[n, ms(a), ms(b)] for n, a, b in self.layers()],
            "buckets": [[i, self.nbytes.get(i, 0), ms(self.launch[i]), ms(self.done.get(i, self.launch[i]))]
                        for i in sorted(self.launch)],
        }


@dataclass
class _Bucket:
    index: int
    members: list[int]                 # parameter positions
    offsets: list[int]
    buffer: torch.Tensor
    pending: int = 0
    work: Any = None  # the in-flight all-reduce (a c10d Work)
    done_event: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class BucketedDataParallel(torch.nn.Module):
    """Data parallelism with bucketed, overlapped gradient all-reduce (see the module docstring).

    ``module``: the replica on this rank (parameters are broadcast from rank 0 at
    construction, like DDP). ``bucket_cap_mb`` / ``first_bucket_mb``: bucket limits as in DDP.
    ``overlap``: launch each bucket's all-reduce as soon as it is full (True) or all of them
    after backward (False). After ``loss.backward()`` returns, every ``.grad`` holds the
    average over ranks.
    """

    def __init__(self, module: torch.nn.Module, bucket_cap_mb: float | None = None,
                 first_bucket_mb: float | None = None, overlap: bool = True,
                 process_group=None, rebuild_buckets: bool = True, broadcast: bool = True):
        super().__init__()
        self.module = module
        self.overlap = overlap
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.limits = bucket_limits(bucket_cap_mb, first_bucket_mb)
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        if broadcast:
            with torch.no_grad():
                for t in list(module.parameters()) + list(module.buffers()):
                    dist.broadcast(t.data, src=dist.get_global_rank(process_group, 0)
                                   if process_group is not None else 0, group=process_group)
        self.timeline: StepTimeline | None = None
        self._rebuild_pending = rebuild_buckets
        #: DDP's switch for gradient accumulation: while False (inside :meth:`no_sync`) gradients
        #: only accumulate in ``.grad``; the backward that runs with it True syncs the total
        self.require_backward_grad_sync = True
        self._ready_order: list[int] = []
        self._callback_queued = False
        self._next_bucket = 0
        if rebuild_buckets:  # DDP's first iteration: one bucket, in parameters() order (no size limit)
            self._build(list(range(len(self.params))), limits=[ONE_BUCKET_BYTES])
        else:
            self._build(list(reversed(range(len(self.params)))))
        self._handles = [p.register_post_accumulate_grad_hook(
            lambda _p, i=i: self._on_grad_ready(i)) for i, p in enumerate(self.params)]

    # ---- layout ------------------------------------------------------------------------
    def _build(self, order: list[int], limits: Sequence[int] | None = None) -> None:
        sizes = [self.params[i].numel() * self.params[i].element_size() for i in order]
        keys = [(self.params[i].dtype, self.params[i].device) for i in order]
        groups = assign_buckets(sizes, limits or self.limits, keys)
        self.buckets: list[_Bucket] = []
        self._where: dict[int, tuple[int, int]] = {}
        for b, positions in enumerate(groups):
            members = [order[pos] for pos in positions]
            offsets, total = [], 0
            for i in members:
                offsets.append(total)
                total += self.params[i].numel()
                self._where[i] = (b, offsets[-1])
            p0 = self.params[members[0]]
            self.buckets.append(_Bucket(b, members, offsets,
                                        torch.zeros(total, dtype=p0.dtype, device=p0.device)))
        self._reset()

    def _reset(self) -> None:
        for bucket in self.buckets:
            bucket.pending = len(bucket.members)
            bucket.work = None
        self._next_bucket = 0
        self._callback_queued = False

    def bucket_names(self) -> list[list[str]]:
        """Parameter names per bucket, in all-reduce order."""
        return [[self.param_names[i] for i in b.members] for b in self.buckets]

    def bucket_bytes(self) -> list[int]:
        return [b.nbytes for b in self.buckets]

    # ---- forward / hooks ---------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate gradients without communicating (DDP's ``no_sync``)."""
        old, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def _on_grad_ready(self, i: int) -> None:
        if not self.require_backward_grad_sync:
            return
        if self.timeline is not None:
            self.timeline.grad_ready(self.param_names[i])
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finalize)
        if self._rebuild_pending:
            self._ready_order.append(i)
        b, offset = self._where[i]
        bucket = self.buckets[b]
        p = self.params[i]
        view = bucket.buffer[offset:offset + p.numel()].view_as(p)
        assert p.grad is not None  # this hook runs once the gradient is accumulated
        with torch.no_grad():
            torch.mul(p.grad, 1.0 / self.world_size, out=view)  # DDP divides while copying
        bucket.pending -= 1
        if bucket.pending < 0:
            raise RuntimeError(f"gradient of {self.param_names[i]} arrived twice in one backward "
                               "(reentrant backward or a parameter used twice is not supported)")
        if self.overlap:
            self._launch_ready()

    def _launch(self, bucket: _Bucket) -> None:
        tl = self.timeline
        if tl is not None:
            tl.bucket_launched(bucket.index, bucket.nbytes)
        bucket.work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)
        if tl is not None:
            bucket.work.get_future().then(lambda _f, j=bucket.index: tl.bucket_done(j))

    def _launch_ready(self) -> None:
        # Buckets go out in order: every rank must issue the same collectives in the same order.
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            self._launch(self.buckets[self._next_bucket])
            self._next_bucket += 1

    def _finalize(self) -> None:
        missing = [self.param_names[i] for b in self.buckets if b.pending
                   for i in b.members if self.params[i].grad is None]
        if any(b.pending for b in self.buckets):
            raise RuntimeError("backward ended before every parameter had a gradient "
                               f"(unused parameters are not supported): {missing or '?'}")
        self._launch_ready()
        for bucket in self.buckets:
            bucket.work.wait()
        if self.timeline is not None:
            self.timeline.mark("comm_done")  # the exposed communication ends here; copying back is compute
        with torch.no_grad():
            for bucket in self.buckets:
                for i, offset in zip(bucket.members, bucket.offsets):
                    p = self.params[i]
                    assert p.grad is not None  # every bucket was complete (checked above)
                    p.grad.copy_(bucket.buffer[offset:offset + p.numel()].view_as(p))
        if self.timeline is not None:
            self.timeline.mark("grads_ready")
        if self._rebuild_pending:
            self._rebuild_pending = False
            order = torch.tensor(self._ready_order, dtype=torch.int64)
            if len(order) == len(self.params):
                dist.broadcast(order, src=dist.get_global_rank(self.process_group, 0)
                               if self.process_group is not None else 0, group=self.process_group)
                self._ready_order = []
                self._build(order.tolist())
                return
            self._ready_order = []
        self._reset()


def ddp_timed_allreduce_hook(timeline, bucket):  # no annotations: DDP checks them literally
    """A DDP communication hook: DDP's default (divide by world size, all-reduce) plus bucket
    launch/done times reported to ``timeline``."""
    buf = bucket.buffer()
    index = bucket.index()
    timeline.bucket_launched(index, buf.numel() * buf.element_size())
    buf.div_(dist.get_world_size())
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        timeline.bucket_done(index)
        return f.value()[0]

    return fut.then(done)
