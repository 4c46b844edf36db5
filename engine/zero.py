"""ZeRO stages 1, 2 and 3, written from scratch on torch.distributed collectives.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC 2020) shard the *model states* of data-parallel training across the N ranks:

* stage 1 (P_os): each rank keeps the optimizer states (fp32 master, Adam's momentum and
  variance) of 1/N of the parameters;
* stage 2 (P_os+g): ... and only 1/N of the gradients;
* stage 3 (P_os+g+p): ... and only 1/N of the parameters, gathering each layer's full
  parameters just before it computes and freeing them right after (what FSDP does).

How this implementation lays the states out
-------------------------------------------
The model is split into *units*: modules whose forwards run one after the other (the
embedding, each transformer block, the head). A unit's parameters are packed into one flat
buffer padded to ``padded = ceil(numel / N) * N`` elements; rank ``r`` owns the slice
``[r*S, (r+1)*S)`` with ``S = padded / N`` of every unit (the *flat-buffer shard*).

==========  ===============================  ================================  =====================
stage       parameters                       gradients                         optimizer (per unit)
==========  ===============================  ================================  =====================
1           full flat buffer (module params  full flat buffer (``p.grad`` are   master/m/v of the
            are views into it)               views into it); reduce-scattered  rank's slice
                                             in place into the rank's slice
2           full flat buffer                 one unit's full gradient exists   same
                                             only during its backward, then it
                                             is reduce-scattered into a
                                             persistent shard and freed
3           only the shard; the full buffer  as stage 2                        same
            is all-gathered before the
            unit's forward and again before
            its backward, and its storage is
            freed (resized to 0) after each
==========  ===============================  ================================  =====================

The optimizer is any ``torch.optim`` optimizer, built over one fp32 *master* shard per unit.
In fp32 training the master **is** the parameter shard (no copy); with a lower
``param_dtype`` (bf16/fp16 mixed precision) it is a separate fp32 copy: the "4" of K = 12.

Stage 3 prefetches: when unit ``i`` starts its forward, the all-gather of unit ``i+1`` is
issued asynchronously so it travels while unit ``i`` computes; in backward, unit ``i-1`` is
prefetched while unit ``i`` computes. Gradients are reduce-scattered asynchronously as soon
as a unit's backward is done (its last parameter's gradient accumulated), overlapping with
the backward of the units before it.

Collectives: NCCL's ``reduce_scatter_tensor`` and ``all_gather_into_tensor`` are ring
algorithms that send (N-1)/N of the buffer per rank. Gloo's ``reduce_scatter_tensor`` is an
all-reduce of a copy in disguise (ProcessGroupGloo.cpp), which would send twice as much; on
gloo this module therefore reduce-scatters with one ``all_to_all_single`` (each rank sends the
N-1 slices it does not own, (N-1)/N of the buffer, and sums what it receives), which is the
traffic a real reduce-scatter has.

Limits: one backward per ``step()`` unless the others run with ``require_backward_grad_sync``
False (stage 1 only: gradients accumulate in the flat buffer, DDP's ``no_sync``); every parameter must receive
a gradient, units run in the order given. ``held_bytes`` measures the storage a set of tensors
really holds (:class:`distai.engine.metering.CommMeter` counts the bytes any code sends).
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten

from .collectives import all_gather_into, reduce_scatter_into
from .time_causes import run_queue_s

__all__ = ["ZeroEngine", "Collectives", "held_bytes"]


# ---------------------------------------------------------------------------------------------
# Collectives with the traffic of a real reduce-scatter on every backend
# ---------------------------------------------------------------------------------------------

class _Handle:
    """An issued collective; ``wait()`` blocks until its result is in place (idempotent), and tells
    ``waited`` how long the caller was blocked on a peer's collective (the communication the step exposes)."""

    def __init__(self, work=None, finish: Callable[[], None] | None = None,
                 waited: Callable[[float, float], None] | None = None):
        self._work, self._finish, self._done, self._waited = work, finish, False, waited

    def wait(self) -> None:
        if self._done:
            return
        if self._work is not None:
            core, start = run_queue_s(), time.perf_counter()
            self._work.wait()
            if self._waited is not None:  # how long, and how much of it woken but without a core
                self._waited(time.perf_counter() - start, run_queue_s() - core)
        if self._finish is not None:
            self._finish()
        self._done = True


class Collectives:
    """The two collectives sharding needs, on one process group."""

    def __init__(self, group=None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.backend = str(dist.get_backend(group)).lower()
        # seconds the caller has waited on issued collectives, in all, and the part of them it spent
        # woken but without a core (a step's CPU contention counts that part already)
        self.exposed_s = self.exposed_core_wait_s = 0.0

    def _exposed(self, seconds: float, core_wait: float) -> None:
        self.exposed_s += seconds
        self.exposed_core_wait_s += min(core_wait, seconds)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = True) -> _Handle:
        """``out`` (N*S elements) <- every rank's ``inp`` (S elements), in rank order."""
        if self.world_size == 1:
            if out.data_ptr() != inp.data_ptr():
                out.copy_(inp)
            return _Handle()
        return _Handle(all_gather_into(out, inp, self.group, async_op), waited=self._exposed)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, async_op: bool = True) -> _Handle:
        """``out`` (S elements) <- the sum over ranks of this rank's slice of ``inp`` (N*S)."""
        n = self.world_size
        if n == 1:
            def copy() -> None:
                if out.data_ptr() != inp.data_ptr():
                    out.copy_(inp)

            return _Handle(finish=copy)
        if self.backend != "gloo":
            return _Handle(reduce_scatter_into(out, inp, self.group, async_op), waited=self._exposed)
        received = torch.empty_like(inp)
        work = dist.all_to_all_single(received, inp, group=self.group, async_op=async_op)

        def finish():
            torch.sum(received.view(n, -1), dim=0, out=out)

        return _Handle(work, finish, waited=self._exposed)


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------

@dataclass(eq=False)
class _Unit:
    index: int
    module: nn.Module
    params: list[nn.Parameter]
    numel: int
    padded: int
    shard_numel: int
    full: torch.Tensor                      # flat parameters, param_dtype, padded
    full_nbytes: int
    shard: torch.Tensor                     # this rank's slice (a view of ``full`` in stages 1-2)
    master: nn.Parameter                    # fp32 slice the optimizer updates
    grad_shard: torch.Tensor | None = None  # persistent reduced gradient slice (param_dtype)
    grad_full: torch.Tensor | None = None   # unit's full flat gradient (stage 1: persistent)
    gather: _Handle | None = None           # in-flight all-gather of ``full``
    reduce: _Handle | None = None           # in-flight reduce-scatter of ``grad_full``
    gathered: bool = True
    grads_ready: int = 0
    pre_backward_done: bool = False
    names: list[str] = field(default_factory=list)


class ZeroEngine:
    """Data parallelism with ZeRO stage 1, 2 or 3 over ``units`` (run in this order).

    ``optimizer`` builds a ``torch.optim.Optimizer`` from a list of tensors (the fp32 master
    shards), e.g. ``lambda ps: torch.optim.Adam(ps, lr=1e-3)``. Use it like DDP::

        engine = ZeroEngine(model.units, stage=3, optimizer=make_adam)
        loss = loss_fn(model(x), y)        # the model's own forward; hooks do the sharding
        loss.backward()
        engine.step()                      # optimizer step on this rank's shard
    """

    def __init__(self, units: Sequence[nn.Module], stage: int,
                 optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer], *,
                 group=None, param_dtype: torch.dtype | None = None, prefetch: bool = True,
                 reshard_after_forward: bool = True, trace: bool = False):
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeRO stage must be 1, 2 or 3, not {stage!r}")
        self.stage = stage
        self.comm = Collectives(group)
        self.world_size, self.rank = self.comm.world_size, self.comm.rank
        self.prefetch = prefetch
        self.reshard_after_forward = reshard_after_forward
        first = next(p for u in units for p in u.parameters())
        self.device = first.device
        self.param_dtype = param_dtype or first.dtype
        # fp32 masters (fp64 ones for fp64 parameters, so fp64 runs stay exact); "mixed" when
        # the parameters are narrower than their masters
        self.master_dtype = torch.float64 if self.param_dtype == torch.float64 else torch.float32
        self.mixed = self.param_dtype != self.master_dtype
        self._units: list[_Unit] = []
        self._hooks: list = []
        #: with ``trace=True``: (action, unit index) in the order they happen, action one of
        #: forward, backward (a unit starts computing), all_gather (issued), free,
        #: reduce_scatter (issued), step
        self.trace: list[tuple[str, int]] | None = [] if trace else None
        self.peak_gathered_units = 0  # stage 3: most units whose full parameters were alive at once
        self.peak_full_grad_units = 0  # stages 2-3: most units whose full gradients were alive at once
        #: False: backwards only accumulate into the gradient buffers, nothing is reduced (gradient
        #: accumulation over microbatches, stage 1 only: DDP's ``no_sync``)
        self.require_backward_grad_sync = True
        seen: set[int] = set()
        for index, module in enumerate(units):
            params = [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
            seen.update(id(p) for p in params)
            if params:
                self._units.append(self._build_unit(index, module, params))
        self.optimizer = optimizer([u.master for u in self._units])
        self._install_hooks()

    # -- construction ---------------------------------------------------------------------------
    def _build_unit(self, index: int, module: nn.Module, params: list[nn.Parameter]) -> _Unit:
        n, r = self.world_size, self.rank
        numel = sum(p.numel() for p in params)
        shard_numel = math.ceil(numel / n)
        padded = shard_numel * n
        with torch.no_grad():
            flat32 = torch.zeros(padded, dtype=self.master_dtype, device=self.device)
            offset = 0
            for p in params:
                flat32[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
                offset += p.numel()
            full = flat32 if not self.mixed else flat32.to(self.param_dtype)
            offset = 0
            for p in params:
                p.data = full[offset:offset + p.numel()].view(p.shape)
                offset += p.numel()
            mine = slice(r * shard_numel, (r + 1) * shard_numel)
            if self.stage < 3:
                shard = full[mine]
                master = nn.Parameter(shard) if not self.mixed else nn.Parameter(flat32[mine].clone())
            else:
                master = nn.Parameter(flat32[mine].clone())
                shard = master.detach() if not self.mixed else master.detach().to(self.param_dtype)
        names = [name for name, q in module.named_parameters() if any(q is p for p in params)]
        unit = _Unit(index, module, params, numel, padded, shard_numel, full,
                     full.untyped_storage().nbytes(), shard, master, names=names)
        if self.stage == 1:
            unit.grad_full = torch.zeros(padded, dtype=self.param_dtype, device=self.device)
            self._set_grad_views(unit)
            unit.grad_shard = unit.grad_full[mine]
        else:
            unit.grad_shard = torch.zeros(shard_numel, dtype=self.param_dtype, device=self.device)
        if not self.mixed:
            master.grad = unit.grad_shard
        if self.stage == 3:
            self._reshard(unit)
        del flat32
        return unit

    @staticmethod
    def _set_grad_views(unit: _Unit) -> None:
        assert unit.grad_full is not None
        offset = 0
        for p in unit.params:
            p.grad = unit.grad_full[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()

    def _install_hooks(self) -> None:
        for unit in self._units:
            self._hooks.append(unit.module.register_forward_pre_hook(
                lambda mod, args, u=unit: self._pre_forward(u)))
            self._hooks.append(unit.module.register_forward_hook(
                lambda mod, args, out, u=unit: self._post_forward(u, out)))
            for p in unit.params:
                self._hooks.append(p.register_post_accumulate_grad_hook(
                    lambda param, u=unit: self._grad_accumulated(u)))

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    # -- stage 3: gather and free a unit's parameters -------------------------------------------------
    def _unshard(self, unit: _Unit) -> None:
        if unit.gathered or unit.gather is not None:
            return
        storage = unit.full.untyped_storage()
        if storage.nbytes() != unit.full_nbytes:
            storage.resize_(unit.full_nbytes)
        unit.gather = self.comm.all_gather(unit.full, unit.shard, async_op=True)
        self._note("all_gather", unit)
        alive = sum(1 for u in self._units if u.full.untyped_storage().nbytes() > 0)
        self.peak_gathered_units = max(self.peak_gathered_units, alive)

    def _note(self, action: str, unit: _Unit | None) -> None:
        if self.trace is not None:
            self.trace.append((action, -1 if unit is None else unit.index))

    def _wait_gather(self, unit: _Unit) -> None:
        if unit.gather is not None:
            unit.gather.wait()
            unit.gather = None
            unit.gathered = True

    def _reshard(self, unit: _Unit) -> None:
        self._wait_gather(unit)
        unit.full.untyped_storage().resize_(0)
        unit.gathered = False
        self._note("free", unit)

    # -- hooks ----------------------------------------------------------------------------------------
    def _neighbour(self, unit: _Unit, step: int) -> _Unit | None:
        j = self._units.index(unit) + step
        return self._units[j] if 0 <= j < len(self._units) else None

    def _pre_forward(self, unit: _Unit) -> None:
        unit.pre_backward_done = False
        if self.stage == 3:
            self._unshard(unit)
            nxt = self._neighbour(unit, +1)
            if self.prefetch and nxt is not None:
                self._unshard(nxt)
        self._wait_gather(unit)
        self._note("forward", unit)

    def _post_forward(self, unit: _Unit, output):
        if self.stage == 3 and self.reshard_after_forward:
            self._reshard(unit)
        if torch.is_grad_enabled():
            tensors, _ = tree_flatten(output)
            for t in tensors:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda grad, u=unit: self._pre_backward(u))
        return output

    def _pre_backward(self, unit: _Unit) -> None:
        if unit.pre_backward_done:
            return
        unit.pre_backward_done = True
        if self.stage == 3:
            self._unshard(unit)
            prev = self._neighbour(unit, -1)
            if self.prefetch and prev is not None:
                self._unshard(prev)
            self._wait_gather(unit)
        self._note("backward", unit)
        if self.stage >= 2:
            unit.grad_full = torch.zeros(unit.padded, dtype=self.param_dtype, device=self.device)
            self._set_grad_views(unit)
            alive = sum(1 for u in self._units if u.grad_full is not None)
            self.peak_full_grad_units = max(self.peak_full_grad_units, alive)

    def _grad_accumulated(self, unit: _Unit) -> None:
        if not self.require_backward_grad_sync:
            if self.stage != 1:
                raise RuntimeError("gradient accumulation without sync needs ZeRO stage 1 "
                                   "(stages 2 and 3 free the full gradients after each backward)")
            return
        unit.grads_ready += 1
        if unit.grads_ready == len(unit.params):
            self._post_backward(unit)

    def _post_backward(self, unit: _Unit) -> None:
        grad, shard = unit.grad_full, unit.grad_shard
        assert grad is not None and shard is not None  # made by _pre_backward / at construction
        grad.div_(self.world_size)  # the mean over ranks, as DDP computes it
        unit.reduce = self.comm.reduce_scatter(shard, grad, async_op=True)
        self._note("reduce_scatter", unit)
        if self.stage >= 2:
            for p in unit.params:
                p.grad = None
            # keep at most two units' full gradients alive: finish the previous reduce-scatter
            for other in self._units:
                if other is not unit and other.reduce is not None:
                    self._finish_reduce(other)
        if self.stage == 3:
            self._reshard(unit)

    def _finish_reduce(self, unit: _Unit) -> None:
        if unit.reduce is not None:
            unit.reduce.wait()
            unit.reduce = None
        if self.stage >= 2:
            unit.grad_full = None

    # -- the optimizer step -----------------------------------------------------------------------------
    def wait_gradients(self) -> None:
        """Wait for every gradient reduce-scatter (the rank's slices are final afterwards)."""
        for unit in self._units:
            self._finish_reduce(unit)

    def step(self) -> None:
        """Finish the gradient reduce-scatters, update this rank's shards, re-gather (stages 1-2)."""
        for unit in self._units:
            if unit.grads_ready != len(unit.params):
                missing = [n for n, p in zip(unit.names, unit.params) if p.grad is None]
                raise RuntimeError(f"ZeRO step before unit {unit.index}'s backward finished "
                                   f"({unit.grads_ready}/{len(unit.params)} gradients; {missing[:3]})")
            self._finish_reduce(unit)
            if self.mixed and unit.grad_shard is not None:
                unit.master.grad = unit.grad_shard.to(self.master_dtype)
        self.optimizer.step()
        self._note("step", None)
        with torch.no_grad():
            for unit in self._units:
                if self.mixed:
                    unit.shard.copy_(unit.master)
                    unit.master.grad = None
                if self.stage < 3:  # everyone needs everyone's updated slice: in-place all-gather
                    unit.gathered = False
                    unit.gather = self.comm.all_gather(unit.full, unit.shard, async_op=True)
                    self._note("all_gather", unit)
                if self.stage == 1 and unit.grad_full is not None:
                    unit.grad_full.zero_()
                unit.grads_ready = 0

    def synchronize(self) -> None:
        """Wait for every in-flight collective (stage 1-2 parameter all-gathers after a step)."""
        for unit in self._units:
            self._finish_reduce(unit) if unit.reduce is not None else None
            if self.stage < 3:
                self._wait_gather(unit)

    # -- inspection -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def gathered_parameters(self) -> Iterator[None]:
        """Inside, every module parameter holds its full value (stage 3 gathers, then frees)."""
        self.synchronize()
        if self.stage == 3:
            for unit in self._units:
                self._unshard(unit)
            for unit in self._units:
                self._wait_gather(unit)
        try:
            yield
        finally:
            if self.stage == 3:
                for unit in self._units:
                    self._reshard(unit)

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every parameter's full value in fp32, keyed ``unit{i}.{name}`` (collective call)."""
        out = {}
        with self.gathered_parameters():
            for unit in self._units:
                for name, p in zip(unit.names, unit.params):
                    out[f"unit{unit.index}.{name}"] = p.detach().float().clone()
        return out

    def held_tensors(self) -> dict[str, list[torch.Tensor]]:
        """Every tensor this rank keeps for the model states, by category (for ``held_bytes``).

        fp32 masters count as parameters when they share the parameters' storage (fp32
        training) and as optimizer state when they are a separate copy (mixed precision).
        """
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        opt: list[torch.Tensor] = []
        for unit in self._units:
            params += [unit.full, unit.shard] + list(unit.params)
            grads += [t for t in (unit.grad_shard, unit.grad_full) if t is not None]
            grads += [p.grad for p in unit.params if p.grad is not None]
            opt.append(unit.master)
        for state in self.optimizer.state.values():
            opt += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return {"params": params, "grads": grads, "optimizer": opt}

    def layout(self) -> list[dict]:
        """Per unit: its name, element count, padded size and this rank's owned slice."""
        return [{"unit": u.index, "numel": u.numel, "padded": u.padded, "shard": u.shard_numel,
                 "owned": (self.rank * u.shard_numel, (self.rank + 1) * u.shard_numel)}
                for u in self._units]

    @property
    def num_params(self) -> int:
        return sum(u.numel for u in self._units)


# ---------------------------------------------------------------------------------------------
# Measurement: bytes held
# ---------------------------------------------------------------------------------------------

def _local(t: torch.Tensor) -> torch.Tensor:
    local = getattr(t, "_local_tensor", None)  # a DTensor's shard on this rank (FSDP2)
    return local if isinstance(local, torch.Tensor) else t


def held_bytes(groups: Mapping[str, Iterable[torch.Tensor | None]]) -> dict[str, int]:
    """Bytes of distinct tensor storage per category, each storage counted once (first wins).

    What a rank really holds: a view and its base count once, a freed storage (resized to
    0) counts 0, padding counts, DTensors count their local shard.
    """
    seen: set[int] = set()
    out: dict[str, int] = {}
    for name, tensors in groups.items():
        total = 0
        for t in tensors:
            if t is None:
                continue
            storage = _local(t).untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() == 0 or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
        out[name] = total
    return out
