"""Dynamic loss scaling and fp32 master weights, written from scratch (lesson 6).

fp16 keeps about 3 decimal digits over a narrow range (normal numbers from 2^-14 up to 65504,
subnormals down to 2^-24). Small gradients fall below that range and become zero; multiplying
the loss by a large factor ``S`` moves every gradient up by ``log2(S)`` binades, the chain rule
carries the factor through backward, and dividing by ``S`` again in fp32 before the update
restores the true values. If ``S`` is too large, some value exceeds 65504 and becomes inf: the
step is skipped and ``S`` shrinks.

:class:`DynamicLossScaler` follows the same rules as ``torch.amp.GradScaler`` (the tests check
it against GradScaler step for step):

* ``scale(loss)`` returns ``loss * S``;
* ``unscale_(optimizer)`` multiplies every gradient by ``1/S`` (the reciprocal taken in
  float64, rounded to float32) and records whether any gradient holds an inf or a NaN;
* ``step(optimizer)`` unscales if that has not happened yet, then calls ``optimizer.step()``
  only when no inf/NaN was found: the step is *skipped* otherwise;
* ``update()``: after an overflow ``S <- S * backoff_factor`` and the run of good steps restarts
  at zero; after ``growth_interval`` consecutive good steps ``S <- S * growth_factor`` (unless
  that would be inf in float32) and the run restarts. ``S`` is a float32 number, like
  GradScaler's scale tensor, and each product is rounded to float32 as its C++ kernel does.

:class:`MasterWeightOptimizer` is the other half of mixed precision as Micikevicius et al.
describe it: the model holds fp16/bf16 weights and computes in that format, while the optimizer
keeps an fp32 *master* copy, applies the update there and copies the rounded result back. An
update smaller than half the spacing between neighbouring fp16 numbers would be lost if applied
to the fp16 weight directly; added to the fp32 master it accumulates. (With ``torch.autocast``
the parameters themselves are fp32 and autocast casts them per operation: the optimizer then
works on fp32 weights directly and needs no wrapper.)
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..lessons.lesson6.formulas import GRADSCALER_DEFAULTS


def to_float32(x: float) -> float:
    """``x`` rounded to the nearest float32 (overflow gives inf), as ``static_cast<float>`` does."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


@dataclass
class ScalerRecord:
    """What happened at one optimizer step."""

    step: int
    scale: float          # the scale the step's loss was multiplied by
    found_inf: bool       # an inf/NaN appeared in some gradient
    skipped: bool         # so optimizer.step() was not called
    new_scale: float      # the scale after update()
    growth_tracker: int   # consecutive good steps after update()


class DynamicLossScaler:
    """A from-scratch equivalent of ``torch.amp.GradScaler`` (see the module docstring).

    ``sync_found_inf=True``: when gradients are *not* identical across ranks at unscale time
    (sharded optimizers), the inf/NaN flag is all-reduced (MAX) over ``process_group`` (the
    default group if None) so every rank skips the same steps. With DDP-style data parallelism the gradients are already all-reduced,
    every rank sees the same inf, and no extra communication is needed.
    """

    def __init__(self, init_scale: float = GRADSCALER_DEFAULTS["init_scale"],
                 growth_factor: float = GRADSCALER_DEFAULTS["growth_factor"],
                 backoff_factor: float = GRADSCALER_DEFAULTS["backoff_factor"],
                 growth_interval: int = int(GRADSCALER_DEFAULTS["growth_interval"]),
                 enabled: bool = True, sync_found_inf: bool = False, process_group=None):
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"init_scale must be a positive finite number, got {init_scale}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor}")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError(f"growth_interval must be a positive integer, got {growth_interval}")
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.enabled = enabled
        self.sync_found_inf = sync_found_inf
        self.process_group = process_group
        self._scale = to_float32(init_scale)
        self._growth_tracker = 0
        self._steps = 0
        self._found_inf: dict[int, bool] = {}   # per optimizer, this iteration
        self._stepped: set[int] = set()
        self.history: list[ScalerRecord] = []

    # ---- state -------------------------------------------------------------------------
    def get_scale(self) -> float:
        return self._scale if self.enabled else 1.0

    @property
    def growth_tracker(self) -> int:
        return self._growth_tracker

    def state_dict(self) -> dict:
        return {"scale": self._scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        self._scale = to_float32(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker = int(state["_growth_tracker"])

    # ---- the three calls of a training step --------------------------------------------
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * S`` (S as a float32 0-d tensor, like GradScaler)."""
        if not self.enabled:
            return loss
        return loss * torch.tensor(self._scale, dtype=torch.float32, device=loss.device)

    @staticmethod
    def _grads(optimizer) -> list[torch.Tensor]:
        return [p.grad for group in optimizer.param_groups for p in group["params"]
                if p.grad is not None]

    def unscale_(self, optimizer) -> bool:
        """Divide the optimizer's gradients by S in place; return whether an inf/NaN was found."""
        key = id(optimizer)
        if not self.enabled:
            return False
        if key in self._found_inf:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update()")
        grads = self._grads(optimizer)
        # The reciprocal in float64, rounded to float32 (GradScaler does the same).
        inv_scale = to_float32(1.0 / self._scale)
        found = False
        with torch.no_grad():
            if grads:
                # amax propagates NaN, and |inf| is inf: one check per gradient tensor.
                peaks = torch.stack([g.detach().abs().amax().float() for g in grads])
                found = not bool(torch.isfinite(peaks).all())
                torch._foreach_mul_(grads, inv_scale)
        if self.sync_found_inf:
            flag = torch.tensor([1.0 if found else 0.0], device=grads[0].device if grads else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.process_group)
            found = bool(flag.item() > 0)
        self._found_inf[key] = found
        return found

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless an inf/NaN was found in this step's gradients."""
        if not self.enabled:
            return optimizer.step(*args, **kwargs)
        key = id(optimizer)
        if key in self._stepped:
            raise RuntimeError("step() has already been called since the last update()")
        if key not in self._found_inf:
            self.unscale_(optimizer)
        self._stepped.add(key)
        if self._found_inf[key]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self) -> ScalerRecord | None:
        """Back off after an overflow; grow after ``growth_interval`` good steps in a row."""
        if not self.enabled:
            return None
        if not self._found_inf:
            raise RuntimeError("no inf checks were recorded before update(): call step() first")
        found = any(self._found_inf.values())
        old = self._scale
        if found:
            self._scale = to_float32(self._scale * self.backoff_factor)
            self._growth_tracker = 0
        else:
            successful = self._growth_tracker + 1
            if successful == self.growth_interval:
                grown = to_float32(self._scale * self.growth_factor)
                if math.isfinite(grown):
                    self._scale = grown
                self._growth_tracker = 0
            else:
                self._growth_tracker = successful
        record = ScalerRecord(self._steps, old, found, found, self._scale, self._growth_tracker)
        self.history.append(record)
        self._steps += 1
        self._found_inf = {}
        self._stepped = set()
        return record


class MasterWeightOptimizer:
    """fp32 master copies of a low-precision model's weights, updated by an inner optimizer.

    ``model_params``: the model's fp16/bf16 parameters. ``optimizer_factory(master_params)``
    builds the inner optimizer (``lambda ps: torch.optim.SGD(ps, lr=0.1)``). After backward,
    :meth:`grads_to_master` copies the low-precision gradients into fp32 ``.grad`` of the
    masters (so a loss scaler can unscale and check them there, in fp32); :meth:`step`
    updates the masters and writes their rounded values back into the model.
    The object behaves like an optimizer for a loss scaler: ``param_groups`` and ``state``
    are the inner optimizer's.
    """

    def __init__(self, model_params: Iterable[torch.nn.Parameter], optimizer_factory):
        self.model_params = [p for p in model_params if p.requires_grad]
        self.master_params = [torch.nn.Parameter(p.detach().float().clone())
                              for p in self.model_params]
        self.optimizer = optimizer_factory(self.master_params)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def grads_to_master(self) -> None:
        for p, m in zip(self.model_params, self.master_params):
            m.grad = None if p.grad is None else p.grad.detach().float()

    def step(self, *args, **kwargs):
        out = self.optimizer.step(*args, **kwargs)
        with torch.no_grad():
            for p, m in zip(self.model_params, self.master_params):
                p.copy_(m)  # rounds to the model's format
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
        for p in self.model_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
