"""What a rank sends and what it keeps for backward, measured rather than assumed.

* :class:`CommMeter` — a ``TorchDispatchMode`` that sees every c10d operation issued inside its
  ``with`` (our collectives, DDP's bucket all-reduces, FSDP2's and DTensor's gathers, pipeline
  sends), whoever issues them. Each one becomes a :class:`CommRecord`: the op, the bytes of the
  full tensor it is about, what one rank sends for it, the size of the group it ran on, the
  tags (``layer``, ``phase``, ``site``) that the code around it set with :func:`comm_scope`,
  and when it was issued and completed (the run's trace draws these: ``comm_trace.py``).
* :class:`SavedActivationMeter` — the bytes of the tensors autograd saves for backward
  (parameters excluded, each storage once), live and at their peak, and per layer.

Bytes per rank for ring algorithms (Patarasuk & Yuan 2009; NCCL's ``busbw`` conventions,
nccl-tests/doc/PERFORMANCE.md): an all-reduce is a reduce-scatter then an all-gather,
``2(N-1)/N`` of the buffer; an all-gather or a reduce-scatter ``(N-1)/N`` of the full buffer;
an all-to-all the ``N-1`` slices meant for others. Gloo runs ``reduce_scatter_tensor`` as an
all-reduce of a copy (ProcessGroupGloo.cpp), so on gloo it really sends twice that:
:func:`sent_bytes_per_rank` charges what the backend sends, :attr:`CommRecord.wire_bytes` what
the ring algorithm sends (the lessons' formulas).
"""
from __future__ import annotations

import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

__all__ = ["CommMeter", "CommRecord", "SavedActivationMeter", "comm_scope", "comm_tags",
           "sent_bytes_per_rank", "ring_bytes_per_rank"]


# ----------------------------------------------------------------------------------------------
# Tags: which layer, which phase, which site of the model a collective belongs to
# ----------------------------------------------------------------------------------------------

_TAG_NAMES = ("layer", "phase", "site")
_TAGS: ContextVar[tuple[str, str, str]] = ContextVar("distai_comm_tags", default=("-", "fwd", ""))


def comm_tags() -> dict[str, str]:
    """The tags a collective issued now is recorded with (``layer``, ``phase``, ``site``)."""
    return dict(zip(_TAG_NAMES, _TAGS.get()))


@contextmanager
def comm_scope(layer: object = None, phase: str | None = None, site: str | None = None) -> Iterator[None]:
    """Collectives issued inside are tagged with these (``None`` keeps the enclosing tag).

    Backward runs after the forward's scopes have closed: an autograd function stores its
    forward's tags and reopens a scope with ``phase="bwd"`` around its backward collectives.
    """
    old = _TAGS.get()
    new = tuple(old[i] if value is None else str(value) for i, value in enumerate((layer, phase, site)))
    token = _TAGS.set((new[0], new[1], new[2]))
    try:
        yield
    finally:
        _TAGS.reset(token)


# ----------------------------------------------------------------------------------------------
# Bytes per rank
# ----------------------------------------------------------------------------------------------

def ring_bytes_per_rank(op: str, payload: float, n: int) -> float:
    """Bytes one rank sends with the ring algorithm for ``op`` (torch.distributed's name) over a
    full buffer of ``payload`` bytes among ``n`` ranks."""
    if n <= 1:
        return 0.0
    frac = (n - 1) / n
    if op == "all_reduce":
        return 2 * frac * payload
    if op in ("all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        return frac * payload
    if op == "send":
        return float(payload)
    return 0.0


def sent_bytes_per_rank(op: str, payload: int, n: int, backend: str = "nccl") -> float:
    """Bytes one rank sends for c10d op family ``op`` (``allreduce``, ``allgather``,
    ``reduce_scatter``, ``alltoall``, ``broadcast``, ``send``) over ``payload`` bytes on
    ``backend``: the ring figure, except gloo's reduce-scatter, an all-reduce in disguise."""
    api = _API_NAME.get(op, op)
    sent = ring_bytes_per_rank(api, payload, n)
    return 2 * sent if api == "reduce_scatter" and backend == "gloo" else sent


#: c10d op -> (op family, index of the argument whose size is the payload, index of the input):
#: they differ for an all-gather, whose payload is the gathered output and input this rank's shard
_C10D_OPS = {
    "allreduce_": ("allreduce", 0, 0), "allreduce_coalesced_": ("allreduce", 0, 0),
    "_allgather_base_": ("allgather", 0, 1), "allgather_": ("allgather", 0, 1),
    "allgather_into_tensor_coalesced_": ("allgather", 0, 1),
    "_reduce_scatter_base_": ("reduce_scatter", 1, 1), "reduce_scatter_": ("reduce_scatter", 1, 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, 1),
    "alltoall_base_": ("alltoall", 1, 1), "alltoall_": ("alltoall", 1, 1),
    "broadcast_": ("broadcast", 0, 0), "send": ("send", 0, 0), "recv_": ("recv", 0, 0),
}
#: functional collective (``_c10d_functional``: DTensor's redistributions, torch.distributed's
#: ``_functional_collectives``) -> c10d op family; the input is the first argument, the group's
#: name the last, and the result is waited for by ``wait_tensor``
_FUNCTIONAL_OPS = {
    "all_reduce": "allreduce", "all_reduce_coalesced": "allreduce",
    "all_gather_into_tensor": "allgather", "all_gather_into_tensor_coalesced": "allgather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "alltoall", "broadcast": "broadcast",
}
#: c10d's op family -> torch.distributed's function name
_API_NAME = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
             "alltoall": "all_to_all", "broadcast": "broadcast", "send": "send", "recv": "recv"}


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _storage_keys(x: Any) -> list[int]:
    """The storages of a collective's result (inside a wrapper such as an AsyncCollectiveTensor)."""
    keys = []
    for t in x if isinstance(x, (list, tuple)) else [x]:
        if is_traceable_wrapper_subclass(t):
            keys += _storage_keys([getattr(t, inner) for inner in t.__tensor_flatten__()[0]])
        elif isinstance(t, torch.Tensor):
            keys.append(t.untyped_storage().data_ptr())
    return keys


def _kept_bytes(x: Any, input_splits: Any, group: Any) -> int | None:
    """The bytes of all-to-all input ``x`` that stay on this rank (its own split), or None when
    the splits are even (empty): then every destination, itself included, gets 1/world of it."""
    if not isinstance(x, torch.Tensor) or not input_splits or x.shape[0] == 0:
        return None if not input_splits else 0
    rank = group.rank() if group is not None else dist.get_rank()
    return int(input_splits[rank]) * (_nbytes(x) // x.shape[0])


def _named_group(name: Any) -> Any:
    """The process group a functional collective names (None: unknown, taken as the world)."""
    try:
        return dist.distributed_c10d._resolve_process_group(name)
    except (AttributeError, KeyError, RuntimeError, ValueError):
        return None


def _group_of(args: tuple) -> Any:
    """The process group a c10d op runs on (an argument boxed as a ScriptObject)."""
    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return dist.ProcessGroup.unbox(a)
            except RuntimeError:  # another boxed argument (a reduce op, a timeout)
                continue
    return None


# ----------------------------------------------------------------------------------------------
# The communication meter
# ----------------------------------------------------------------------------------------------

@dataclass
class CommRecord:
    """One c10d operation one rank took part in (``t1`` is set from the backend's thread when it
    completes)."""

    op: str  # torch.distributed's name: all_reduce, all_gather, reduce_scatter, all_to_all, send, …
    layer: str  # the comm_scope's tags: "embed", "0", "1", …, "head" ("-" outside any)
    phase: str  # "fwd", "bwd", "grad-sync", …
    site: str  # where in the model: "attn.g", "mlp.f", "ce.max", … ("" when untagged)
    payload_bytes: int  # the full tensor (all-gather output, reduce-scatter input, …)
    sent_bytes: float  # what this rank sends on the backend in use
    world: int  # ranks in the group it ran on
    group: str = ""  # that group's name
    input_bytes: int = 0  # what this rank contributes: its shard for an all-gather, else the payload
    t0: float = 0.0  # wall-clock seconds when it was issued
    t1: float | None = None  # … and when it completed (None: not yet, or not observable)
    kept_bytes: int | None = None  # an all-to-all's own slice (None: an even split, 1/world of it)

    @property
    def wire_bytes(self) -> float:
        """Bytes one rank sends with the ring algorithm (the lessons' formulas); an all-to-all
        with uneven splits sends all but its own slice."""
        if self.kept_bytes is not None:
            return float(self.payload_bytes - self.kept_bytes)
        return ring_bytes_per_rank(self.op, self.payload_bytes, self.world)


def _is_async(func: Any, args: tuple, kwargs: dict) -> bool:
    """The c10d op's ``async_op`` argument (true for ops without one: sends and receives)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "async_op":
            return bool(kwargs.get("async_op", args[i] if i < len(args) else True))
    return True


def _time_completion(func: Any, args: tuple, kwargs: dict, out: Any, record: CommRecord) -> None:
    """Set ``record.t1`` when the c10d op ``func`` that returned ``out`` completes.

    The returned ``Work``'s future runs the callback on the backend's thread (gloo completes it
    before ``wait()`` returns; on NCCL a Work's future completes when the kernel is enqueued, so
    there ``t1`` is the launch). Some Works have no future (gloo's reduce-scatter and
    point-to-point) and their ``wait()`` happens in the caller, out of the dispatcher's sight: a
    blocking op's Work is waited for here (its caller waits for it next anyway), an async one is
    timed to its launch.
    """
    work = next((dist.Work.unbox(x) for x in (out if isinstance(out, tuple) else (out,))
                 if isinstance(x, torch.ScriptObject)), None)
    try:
        future = work.get_future() if work is not None else None
    except RuntimeError:  # "Work::getFuture not implemented"
        future = None
    if future is None:
        if work is not None and not _is_async(func, args, kwargs):
            work.wait()
        record.t1 = time.time()
        return

    def done(_future: Any) -> None:
        record.t1 = time.time()
    future.add_done_callback(done)


class CommMeter(TorchDispatchMode):
    """Every c10d operation issued inside the ``with`` on this rank, as :class:`CommRecord` s.

    Catches everything that reaches the dispatcher: our collectives, DDP's bucket all-reduces,
    FSDP2's all-gathers/reduce-scatters, point-to-point sends, and functional collectives
    (DTensor's redistributions). ``sent`` totals the bytes sent;
    ``by_op`` and ``calls`` break it down by c10d op family (``allreduce``, ``allgather``,
    ``reduce_scatter``, ``alltoall``, ``broadcast``, ``send``). It costs Python time on every
    op: meter a step, not a run. The meter may be entered several times; records accumulate.
    """

    def __init__(self, backend: str | None = None) -> None:
        super().__init__()
        if backend is None:
            backend = str(dist.get_backend()) if dist.is_available() and dist.is_initialized() else "none"
        self.backend = backend.lower()
        self.records: list[CommRecord] = []
        self.sent = 0.0
        self.by_op: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._in_flight: dict[int, CommRecord] = {}  # functional collectives' results -> their records

    def reset(self) -> None:
        self.records.clear()
        self._in_flight.clear()
        self.sent = 0.0
        self.by_op.clear()
        self.calls.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace = func.namespace
        if namespace == "c10d":
            name = func._overloadpacket.__name__
            family, index, input_index = _C10D_OPS.get(name, (None, 0, 0))
            if family is None:
                return func(*args, **kwargs)
            group = _group_of(args)
            kept = _kept_bytes(args[1], args[4], group) if name == "alltoall_base_" else None
            record = self._record(family, group, _nbytes(args[index]), _nbytes(args[input_index]), kept)
            out = func(*args, **kwargs)
            _time_completion(func, args, kwargs, out, record)
            return out
        if namespace == "_c10d_functional":
            # A functional op runs its c10d op with this mode off: it is recorded here and completes
            # at the wait_tensor on its result, unless an AsyncCollectiveTensor waits inside its own
            # dispatch, out of this mode's sight (t1 then stays None).
            name = func._overloadpacket.__name__
            out = func(*args, **kwargs)
            if name == "wait_tensor":
                for key in _storage_keys(args[0]):
                    waited = self._in_flight.pop(key, None)
                    if waited is not None:
                        waited.t1 = time.time()
            elif name in _FUNCTIONAL_OPS:
                family = _FUNCTIONAL_OPS[name]
                group = _named_group(kwargs.get("group_name", args[-1]))
                sent_in = _nbytes(args[0])
                payload = _nbytes(out) if family == "allgather" else sent_in
                kept = _kept_bytes(args[0], args[2], group) if family == "alltoall" else None
                record = self._record(family, group, payload, sent_in, kept)
                for key in _storage_keys(out):
                    self._in_flight[key] = record
            return out
        return func(*args, **kwargs)

    def _record(self, family: str, group: Any, payload: int, input_bytes: int,
                kept_bytes: int | None = None) -> CommRecord:
        """Record, tagged and issued now, one op of c10d ``family`` on ``group`` (None: the world);
        ``kept_bytes``: an all-to-all's slice for this rank itself, which it does not send."""
        world = group.size() if group is not None else dist.get_world_size()
        sent = (sent_bytes_per_rank(family, payload, world, self.backend) if kept_bytes is None
                else float(payload - kept_bytes))
        layer, phase, site = _TAGS.get()
        record = CommRecord(_API_NAME[family], layer, phase, site, payload, sent, world,
                            str(getattr(group, "group_name", "")) if group else "", input_bytes, time.time(),
                            kept_bytes=kept_bytes)
        self.records.append(record)
        if family != "recv":
            self.sent += sent
            self.by_op[family] += sent
            self.calls[family] += 1
        return record

    # -- views -----------------------------------------------------------------------------------
    def of(self, layer: object = None, phase: str | None = None, sites: Iterable[str] | None = None,
           exclude_sites: Iterable[str] = (), op: str | None = None) -> list[CommRecord]:
        """The records of ``layer`` (any when None) in ``phase``, at ``sites``, of ``op``."""
        wanted = set(sites) if sites is not None else None
        skip = set(exclude_sites)
        return [r for r in self.records
                if (layer is None or r.layer == str(layer)) and (phase is None or r.phase == phase)
                and (wanted is None or r.site in wanted) and r.site not in skip
                and (op is None or r.op == op)]

    def table(self, include_sites: bool = False) -> dict:
        """``{layer: {phase: {op[:site]: {"count", "payload_bytes", "wire_bytes"}}}}`` (JSON-ready)."""
        out: dict = defaultdict(lambda: defaultdict(dict))
        for r in self.records:
            key = f"{r.op}:{r.site}" if include_sites else r.op
            cell = out[r.layer][r.phase].setdefault(key, {"count": 0, "payload_bytes": 0, "wire_bytes": 0.0})
            cell["count"] += 1
            cell["payload_bytes"] += r.payload_bytes
            cell["wire_bytes"] += r.wire_bytes
        return {layer: {phase: dict(ops) for phase, ops in phases.items()} for layer, phases in out.items()}

    def counts(self) -> dict[str, int]:
        """Operations per torch.distributed name (``{"all_reduce": 4, …}``)."""
        out: dict[str, int] = defaultdict(int)
        for r in self.records:
            out[r.op] += 1
        return dict(out)


# ----------------------------------------------------------------------------------------------
# The activation meter
# ----------------------------------------------------------------------------------------------

class _Saved:
    """What autograd holds instead of a saved tensor while the meter watches: its release
    (the graph that saved it being freed) uncounts the storage."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedActivationMeter:
    """Bytes of the tensors autograd saves for backward while the meter is entered (``with``),
    each storage counted once, ``params`` excluded.

    ``live``/``peak``: bytes saved and not yet freed (a storage is uncounted when the graph that
    saved it is released), and their maximum since :meth:`reset_peak`. ``per_layer[layer]``:
    the distinct bytes saved inside ``measure(layer)`` (a storage saved again by another layer
    counts in both layers).
    """

    def __init__(self, params: Iterable[torch.Tensor] = ()) -> None:
        self._skip = {p.untyped_storage().data_ptr() for p in params}
        self._held: dict[int, list[int]] = {}  # storage ptr -> [references, nbytes]
        self._layer: dict[int, int] | None = None
        self.live = 0
        self.peak = 0
        self.per_layer: dict[str, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor) -> Any:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._skip or t.device.type == "meta":
            return t
        if self._layer is not None and ptr not in self._layer:
            self._layer[ptr] = storage.nbytes()
        entry = self._held.get(ptr)
        if entry is None:
            entry = self._held[ptr] = [0, storage.nbytes()]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        saved = _Saved(t)
        weakref.finalize(saved, self._release, ptr)
        return saved

    def _release(self, ptr: int) -> None:
        entry = self._held.get(ptr)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._held[ptr]

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved

    def reset_peak(self) -> None:
        self.peak = self.live

    @contextmanager
    def per_module(self, modules: Mapping[object, torch.nn.Module]) -> Iterator[None]:
        """While entered, each module's forward is measured into ``per_layer[str(key)]``
        (:meth:`measure` around it, through forward hooks)."""
        open_scopes: dict[object, Any] = {}
        handles = []
        for key, module in modules.items():
            def enter(_m: Any, _args: Any, key: object = key) -> None:
                open_scopes[key] = self.measure(key)
                open_scopes[key].__enter__()

            def leave(_m: Any, _args: Any, _out: Any, key: object = key) -> None:
                open_scopes.pop(key).__exit__(None, None, None)

            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def measure(self, layer: object) -> Iterator[None]:
        """Record in ``per_layer[str(layer)]`` the distinct bytes saved inside."""
        outer, self._layer = self._layer, {}
        try:
            with self:
                yield
            self.per_layer[str(layer)] = sum(self._layer.values())
        finally:
            self._layer = outer

    def __enter__(self) -> SavedActivationMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
