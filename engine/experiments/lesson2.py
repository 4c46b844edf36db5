"""Lesson 2 experiment: one small transformer trained five ways, and what each way costs.

DDP, our ZeRO-1, ZeRO-2 and ZeRO-3 (``distai.engine.zero``) and torch's FSDP2
(``fully_shard``) train the same model on the same data from the same initial weights. For
each strategy every rank measures

* the bytes it really holds in parameters, gradients and optimizer state right after the
  optimizer step (distinct tensor storage, ``held_bytes``; for FSDP2 also FSDP2's own
  memory tracker, ``torch.distributed._tools.fsdp2_mem_tracker``; on GPU also
  ``torch.cuda.max_memory_allocated``),
* the bytes it sends in one training step (``CommMeter``: every c10d collective, charged with
  what the backend's algorithm sends per rank),
* the step time, and how far its parameters end up from a single-process run on the whole
  batch,

and rank 0 prints measured against the calculator's prediction
(``distai.lessons.lesson2.formulas``).

Run: ``python -m torch.distributed.run --nproc-per-node 4 -m distai.engine.experiments.lesson2``
(or ``distai run lesson2 --cpu 4``). Options: ``--steps``, ``--strategies ddp,zero1,...``,
``--precision fp32|bf16``, ``--optimizer adam|sgd``, model size ``--hidden --heads --layers --vocab
--seq``, ``--batch`` (global batch, split across ranks).

Events (besides the common ``phase``/``step``/``log``/``summary``): per rank and strategy
``memory`` (bytes held after the metered step, beside the calculator's) and ``comm`` (bytes sent in
it), ``strategy_done``, and ``progress`` over all strategies' steps, declared in
``lessons/lesson2/events.py``.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.checks import Check, check
from ...lessons.events import CHECK, LOG, PROGRESS
from ...lessons.lesson2.events import COMM, MEMORY, PHASE, STEP, STRATEGY_DONE
from ...lessons.model_size import ModelSize, add_model_options
from ..comm_trace import traced_step
from ..doctor import CoreWait
from ..experiment import UsageError, exit_with, run_experiment, run_language, summary_lines
from ..metering import CommMeter
from ..model import GPT, GPTConfig, ModelConfigError, lm_loss
from ..parallelize import apply_dp, apply_fsdp, apply_zero
from ..time_causes import run_queue_s
from ..zero import held_bytes

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2")
#: the calculator's name for each strategy
CALC_STRATEGY = {"ddp": "ddp", "zero1": "zero1", "zero2": "zero2", "zero3": "zero3", "fsdp2": "fsdp"}


# ---------------------------------------------------------------------------------------------
# The model and the data
# ---------------------------------------------------------------------------------------------

#: the GPT this lesson trains (its size flags default to this): untied, because ZeRO-3 and FSDP2
#: shard its embedding, blocks and head as separate units (a tied head would need the embedding's
#: freed parameters)
DEFAULT_MODEL = ModelSize(vocab=256, hidden=64, layers=4, heads=4, seq=32, tie_embeddings=False)


def make_model(cfg: GPTConfig, seed: int = 0, device="cpu") -> GPT:
    return GPT(cfg, seed=seed, device=device)


def make_batches(cfg: GPTConfig, steps: int, batch: int, seed: int = 1234) -> list[torch.Tensor]:
    """``steps`` batches of ``batch`` token sequences (length seq + 1) from a random bigram
    language (each token has a few likely successors), identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(cfg.vocab, cfg.vocab, generator=g) * 3.0
    probs = torch.softmax(logits, dim=1)
    out = []
    for _ in range(steps):
        seq = torch.empty(batch, cfg.seq + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, cfg.vocab, (batch,), generator=g)
        for t in range(cfg.seq):
            seq[:, t + 1] = torch.multinomial(probs[seq[:, t]], 1, generator=g).squeeze(1)
        out.append(seq)
    return out


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return lm_loss(logits.float(), targets)


def make_optimizer(name: str, params, lr: float = 1e-3) -> torch.optim.Optimizer:
    params = list(params)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr * 10, momentum=0.9, foreach=False)
    raise ValueError(f"unknown optimizer {name!r}; choose adam or sgd")


# ---------------------------------------------------------------------------------------------
# One trainer per strategy, all with the same interface
# ---------------------------------------------------------------------------------------------

class Trainer:
    """``step(batch)`` trains on this rank's slice of a global batch and returns the loss."""

    name = "?"
    opt: torch.optim.Optimizer  # the torch optimizer of the trainers that use one

    def __init__(self, model: GPT, rank: int, world_size: int, device):
        self.model, self.rank, self.world_size, self.device = model, rank, world_size, device

    def local(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        per = batch.shape[0] // self.world_size
        mine = batch[self.rank * per:(self.rank + 1) * per].to(self.device)
        return mine[:, :-1], mine[:, 1:]

    def step(self, batch: torch.Tensor) -> float:
        raise NotImplementedError

    def exposed_s(self) -> float | None:
        """Seconds this rank has waited on its collectives so far (the communication its steps
        expose), where the trainer's own code issues and waits for them; None where torch does."""
        return None

    def _optimizer_step(self, module: torch.nn.Module, batch: torch.Tensor, autocast: bool = False,
                        set_to_none: bool = True) -> float:
        """A step with the torch optimizer ``self.opt``: ``module`` (the model, or the wrapper that
        communicates for it) on this rank's slice, in bf16 autocast when ``autocast``."""
        self.opt.zero_grad(set_to_none=set_to_none)
        x, y = self.local(batch)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(module(x), y)
        loss.backward()
        self.opt.step()
        return loss.item()

    def held(self) -> dict[str, int]:
        """Bytes of storage this rank holds for the model and a torch optimizer ``self.opt``."""
        params = list(self.model.parameters())
        return held_bytes({"params": params, "grads": [p.grad for p in params],
                           "optimizer": _optimizer_tensors(self.opt)})

    def full_params(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError


class SingleTrainer(Trainer):
    """The reference: one process, the whole global batch, plain torch.optim."""

    name = "single"

    def __init__(self, model, device, optimizer="adam", precision="fp32"):
        super().__init__(model, 0, 1, device)
        self.opt = make_optimizer(optimizer, model.parameters())
        self.autocast = precision != "fp32"

    def step(self, batch):
        return self._optimizer_step(self.model, batch, self.autocast)

    def full_params(self):
        return {n: p.detach().float().clone() for n, p in self.model.named_parameters()}


def bf16_allreduce_hook(group, bucket):  # DDP reads these annotations: a string one (this module's) is refused
    """DDP's bucket all-reduced in bf16, as torch's ``bf16_compress_hook`` does (the bucket cast, divided by the
    group's size, reduced, copied back), which refuses to run without CUDA and NCCL: gloo reduces bf16 too."""
    group = group if group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done):
        return bucket.buffer().copy_(done.value()[0])

    return future.then(decompress)


class DDPTrainer(Trainer):
    """torch's DistributedDataParallel; gradients are views into its all-reduce buckets."""

    name = "ddp"

    def __init__(self, model, rank, world_size, device, optimizer="adam", precision="fp32", group=None):
        super().__init__(model, rank, world_size, device)
        ids = [device.index] if device.type == "cuda" else None
        self.ddp = apply_dp(model, group, impl="ddp", device_ids=ids, gradient_as_bucket_view=True)
        self.opt = make_optimizer(optimizer, model.parameters())
        self.autocast = precision != "fp32"  # mixed precision the torch way: fp32 params, bf16 compute
        if self.autocast:
            # the ZeRO paper's mixed-precision DDP reduces 16-bit gradients (2Ψ elements of 2 bytes); autocast
            # leaves them fp32, which sent twice the bytes the lesson compares ZeRO with
            ddp: Any = self.ddp  # torch's DistributedDataParallel (apply_dp's type is nn.Module)
            ddp.register_comm_hook(group, bf16_allreduce_hook)

    def step(self, batch):
        return self._optimizer_step(self.ddp, batch, self.autocast, set_to_none=False)  # grads are bucket views

    def full_params(self):
        return {n: p.detach().float().clone() for n, p in self.model.named_parameters()}


class ZeroTrainer(Trainer):
    """Our ZeRO stage 1, 2 or 3 (``distai.engine.zero.ZeroEngine``)."""

    def __init__(self, model, rank, world_size, device, stage, optimizer="adam", precision="fp32",
                 prefetch=True, trace=False, group=None):
        super().__init__(model, rank, world_size, device)
        self.name = f"zero{stage}"
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        self.engine = apply_zero(model, stage, lambda ps: make_optimizer(optimizer, ps),
                                 group=group, param_dtype=dtype, prefetch=prefetch, trace=trace)

    def step(self, batch):
        x, y = self.local(batch)
        loss = loss_fn(self.model(x), y)
        loss.backward()
        self.engine.step()
        return loss.item()

    def exposed_s(self) -> float | None:
        if self.device.type != "cpu":  # a GPU's wait() only orders streams: the host times nothing
            return None
        comm = self.engine.comm  # without the time it waited for a core once woken: the step's contention
        return comm.exposed_s - comm.exposed_core_wait_s

    def held(self):
        return held_bytes(self.engine.held_tensors())

    def full_params(self):
        with self.engine.gathered_parameters():
            return {n: p.detach().float().clone() for n, p in self.model.named_parameters()}


_MESHES: dict = {}


class FSDP2Trainer(Trainer):
    """torch's FSDP2: ``fully_shard`` on every unit, then on the root."""

    name = "fsdp2"

    def __init__(self, model, rank, world_size, device, optimizer="adam", precision="fp32", group=None):
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy

        super().__init__(model, rank, world_size, device)
        key = (device.type, world_size, id(group or dist.group.WORLD))
        if key not in _MESHES:  # building a mesh sets up a process group: once per run
            _MESHES[key] = (DeviceMesh.from_group(group, device.type) if group is not None
                            else init_device_mesh(device.type, (world_size,)))
        mesh = _MESHES[key]
        mp = MixedPrecisionPolicy()
        if precision != "fp32":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        apply_fsdp(model, mesh, mp_policy=mp)
        self.opt = make_optimizer(optimizer, model.parameters())

    def step(self, batch):
        return self._optimizer_step(self.model, batch)  # mixed precision: FSDP2's own policy

    def full_params(self):
        from torch.distributed.tensor import DTensor

        out = {}
        for n, p in self.model.named_parameters():
            shard = p.detach()
            if not isinstance(shard, DTensor):  # fully_shard made every parameter a DTensor
                raise TypeError(f"{n} is not sharded by fully_shard")
            out[n] = shard.full_tensor().float().clone()
        return out


def _optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def make_trainer(strategy: str, cfg: GPTConfig, rank: int, world_size: int, device,
                 optimizer: str = "adam", precision: str = "fp32", seed: int = 0,
                 prefetch: bool = True, trace: bool = False, group=None) -> Trainer:
    """``strategy``'s trainer over ``group`` (default: every rank; ``rank``/``world_size`` are
    this rank's place in it)."""
    model = make_model(cfg, seed, device)
    if strategy == "ddp":
        return DDPTrainer(model, rank, world_size, device, optimizer, precision, group=group)
    if strategy in ("zero1", "zero2", "zero3"):
        return ZeroTrainer(model, rank, world_size, device, int(strategy[-1]), optimizer, precision,
                           prefetch=prefetch, trace=trace, group=group)
    if strategy == "fsdp2":
        return FSDP2Trainer(model, rank, world_size, device, optimizer, precision, group=group)
    raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def reference_params(cfg: GPTConfig, batches, optimizer="adam", precision="fp32", seed=0,
                     device="cpu") -> tuple[dict[str, torch.Tensor], list[float]]:
    """Parameters and losses of the single-process run on the whole batch (no collectives)."""
    trainer = SingleTrainer(make_model(cfg, seed, device), torch.device(device), optimizer, precision)
    losses = [trainer.step(b) for b in batches]
    return trainer.full_params(), losses


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise KeyError(f"parameter names differ: {sorted(set(a) ^ set(b))[:5]}")
    return max((a[k].cpu() - b[k].cpu()).abs().max().item() for k in a)


# ---------------------------------------------------------------------------------------------
# Measuring one strategy
# ---------------------------------------------------------------------------------------------

def count_params(cfg: GPTConfig) -> int:
    return sum(p.numel() for p in GPT(cfg).parameters())


def predicted_model_state_bytes(num_params: int, world_size: int, strategy: str, optimizer: str,
                                precision: str) -> dict[str, int]:
    """The calculator's per-GPU model-state bytes for this strategy (params/grads/optimizer/total)."""
    from ...lessons.lesson2.formulas import model_state_bytes

    return model_state_bytes(num_params, world_size, CALC_STRATEGY[strategy], optimizer,
                             calc_precision(precision))


#: the memory check's tolerance: the bytes are counted, so only a float's rounding is allowed
MEMORY_TOLERANCE = 1e-12

#: torch.optim.Adam keeps each parameter's step count as a float32 scalar tensor (not fused/capturable)
ADAM_STEP_BYTES = 4


def layout_terms(strategy: str, trainer: Trainer, world_size: int, rank: int, optimizer: str,
                 precision: str) -> dict[str, float]:
    """Bytes this rank's storage holds beyond the calculator's model states, predicted from the
    trainer's layout (its tensors' shapes and counts, not their bytes): Adam's step counters; our ZeRO's
    units padded to a multiple of N elements (``distai.engine.zero``); FSDP2's dim-0 shards, ⌈d₀/N⌉ rows
    each in its padded fp32 storage of parameters and gradients, while the optimizer's states take the
    rank's own rows (``torch.chunk``'s split: the last ranks get fewer or none)."""
    from ...lessons.lesson2.formulas import bytes_per_param

    terms: dict[str, float] = {}
    opt = trainer.engine.optimizer if isinstance(trainer, ZeroTrainer) else trainer.opt
    if optimizer == "adam":
        terms["adam_step_counters"] = float(ADAM_STEP_BYTES * sum(len(g["params"]) for g in opt.param_groups))
    num_params = sum(p.numel() for p in trainer.model.parameters())  # a DTensor's global count
    formula = predicted_model_state_bytes(num_params, world_size, strategy, optimizer, precision)["total_bytes"]
    if isinstance(trainer, ZeroTrainer):
        padded = sum(u["padded"] for u in trainer.engine.layout())
        if padded != num_params:
            terms["zero_padding"] = float(predicted_model_state_bytes(padded, world_size, strategy, optimizer,
                                                                      precision)["total_bytes"] - formula)
    if isinstance(trainer, FSDP2Trainer):
        per = bytes_per_param(optimizer, "fp32")  # FSDP2 keeps fp32 shards (mixed precision casts per unit)
        held = 0
        for p in trainer.model.parameters():
            rows, rest = (p.shape[0], math.prod(p.shape[1:])) if p.dim() else (1, 1)
            chunk = -(-rows // world_size)
            own = max(0, min(chunk, rows - rank * chunk))
            held += (per["params"] + per["grads"]) * chunk * rest + per["optimizer"] * own * rest
        if held != formula:
            terms["fsdp2_dim0_shards"] = float(held - formula)
    return terms


def predicted_traffic_bytes(num_params: int, world_size: int, strategy: str, precision: str) -> float:
    """The calculator's bytes each rank sends per step: 2Ψ or 3Ψ elements times (N-1)/N."""
    from ...lessons.lesson2.formulas import comm_volume_per_step

    elem = 4 if precision == "fp32" else 2
    return float(comm_volume_per_step(num_params, CALC_STRATEGY[strategy], world_size, elem)["exact_bytes"])


def calc_precision(precision: str) -> str:
    """This experiment's ``--precision`` in the calculator's words."""
    return "fp32" if precision == "fp32" else "mixed"


def run_strategy(strategy: str, cfg: GPTConfig, batches, rank: int, world_size: int, device,
                 optimizer="adam", precision="fp32", meter_step: int | None = None,
                 reference: dict | None = None, fsdp_tracker: bool = True,
                 trace: bool = False, events=None, check_steps: int = 0) -> dict:
    """Train ``strategy`` on ``batches``; measure memory and traffic on step ``meter_step``
    (default: the last one). Returns this rank's figures. With ``events`` each step and its
    all-gathers/reduce-scatters are timed for the run's trace. With ``check_steps``, that many
    more steps, each started together (a barrier), timed with this thread's wait for a core in
    it (``check_steps_s``: :func:`_timed_step`'s four figures each; the step-time check's measurement)."""
    meter_step = len(batches) - 1 if meter_step is None else meter_step
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = make_trainer(strategy, cfg, rank, world_size, device, optimizer, precision, trace=trace)
    losses, times, held, meter, tracker = [], [], None, None, None
    for i, batch in enumerate(batches):
        dist.barrier()
        t0 = time.perf_counter()
        if i == meter_step:
            meter = CommMeter()
            if isinstance(trainer, FSDP2Trainer) and fsdp_tracker:
                tracker = _fsdp_tracker(trainer)
            with meter, (tracker if tracker is not None else _null()), \
                    traced_step(events, f"{strategy} step {i} (metered: each collective timed)", meter=meter,
                                check=f"step_time_{strategy}", strategy=strategy, step=i):
                loss = trainer.step(batch)
            held = trainer.held()
        else:
            # timed: its span only (the metered step above draws the collectives)
            with traced_step(events, f"{strategy} step {i}", collectives=False, strategy=strategy, step=i):
                loss = trainer.step(batch)
            if i > 0 or len(batches) == 2:  # step 0 pays lazy initialisation (FSDP2)
                times.append(time.perf_counter() - t0)
        losses.append(loss)
        STEP.emit(events, {"step": i, "of": len(batches), "loss": loss, "strategy": strategy})
    result = {"strategy": strategy, "losses": losses, "held": held,
              "sent": meter.sent if meter else None,
              "by_op": dict(meter.by_op) if meter else {}, "calls": dict(meter.calls) if meter else {},
              "collectives": [(r.op, r.payload_bytes, r.input_bytes) for r in meter.records
                              if r.op in REPLAYED] if meter else [],
              "step_time_s": _median(times) if times else float("nan"), "step_times_s": times}
    if isinstance(trainer, ZeroTrainer):
        result["peak_gathered_units"] = trainer.engine.peak_gathered_units
        result["peak_full_grad_units"] = trainer.engine.peak_full_grad_units
        result["trace"] = list(trainer.engine.trace or [])
        result["units"] = len(trainer.engine.layout())
    result["layout_terms"] = layout_terms(strategy, trainer, world_size, rank, optimizer, precision)
    if tracker is not None:
        snap = tracker.get_tracker_snapshot("current")
        per_device: dict = next(iter(snap.values()), {})
        result["fsdp_tracker"] = {str(k): int(v) for k, v in per_device.items()}
    if device.type == "cuda":
        result["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(device))
    if reference is not None:
        result["max_abs_diff"] = max_abs_diff(trainer.full_params(), reference)
    if check_steps:  # after every figure above: these steps train on
        # the steps the step-time check measures, on the trace as they ran (no meter: their collectives are
        # not drawn; the metered step above shows how such a step divides)
        timed: list[tuple[float, float, float, float]] = []
        for k in range(check_steps):
            with events.span(f"{strategy} check step {k} (unmetered, as the step-time check times it)", "compute",
                             strategy=strategy) if getattr(events, "enabled", False) else _null():
                timed.append(_timed_step(trainer, batches[k % len(batches)], barrier=True))
        result["check_steps_s"] = timed
    return result


def _fsdp_tracker(trainer: FSDP2Trainer):
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    return FSDPMemTracker(trainer.model, trainer.opt)


@__import__("contextlib").contextmanager
def _null():
    yield


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else 0.5 * (xs[len(xs) // 2 - 1] + xs[len(xs) // 2])


# ---------------------------------------------------------------------------------------------
# The lesson's predictions, checked (issue 28)
# ---------------------------------------------------------------------------------------------

#: the steps a step-time check times, of the strategy and of each part (the least disturbed is kept)
CHECK_STEPS = 8
#: the collectives a step's check replays (what the meter recorded, by torch.distributed's name)
REPLAYED = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: messages one rank sends, one after the other, in each ring collective (lesson 1's model)
RING_MESSAGES = {"all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1,
                 "reduce_scatter": lambda n: n - 1, "all_to_all": lambda n: n - 1}


def compute_time(cfg: GPTConfig, batches, world_size: int, device, optimizer: str, precision: str) -> float:
    """Seconds of one training step of this rank's share of the batch on one process, no
    collective (the compute a strategy's step time is predicted from): the least disturbed of a
    few steps, the slowest rank's."""
    from ..experiment import max_over_ranks

    trainer = SingleTrainer(make_model(cfg, 0, device), device, optimizer, precision)
    return max_over_ranks(_least_disturbed(trainer, batches, world_size), device)


def alone_time(strategy: str, cfg: GPTConfig, batches, world_size: int, device, optimizer: str,
               precision: str, alone) -> float:
    """Seconds of ``strategy``'s step on this rank's share of the batch in a group of this rank
    alone (``alone``: ``dist.new_subgroups(1)``'s): the wrapper's hooks, copies and bookkeeping
    with the same compute and no peer to wait for (the least disturbed of a few steps, the slowest
    rank's, without its wait for a core: :func:`_least_disturbed`)."""
    from ..experiment import max_over_ranks

    trainer = make_trainer(strategy, cfg, 0, 1, device, optimizer, precision, group=alone)
    return max_over_ranks(_least_disturbed(trainer, batches, world_size), device)


def _timed_step(trainer: Trainer, batch, barrier: bool = False) -> tuple[float, float, float, float]:
    """Wall seconds of one ``trainer.step(batch)`` (started together on every rank: ``barrier``),
    the calling thread's wait for a core in it (the kernel's run-queue delay,
    :func:`distai.engine.time_causes.run_queue_s`), its wait on its collectives and its CPU seconds.
    The wait: where torch waits for them, its time off a core (:func:`off_cpu_is_collective_wait`), else
    NaN; where our ZeRO's code waits (:meth:`Trainer.exposed_s`), the time it timed there, and on a CPU
    rank of one thread no less than its time off a core: by the same argument all of that is a wait on
    gloo, also where it falls outside the timed waits (3.2 ms of a 26.7 ms step in one CI run)."""
    if barrier:
        dist.barrier()
    e0 = trainer.exposed_s()
    q, c0, t0 = run_queue_s(), time.thread_time(), time.perf_counter()
    trainer.step(batch)
    t, q, cpu = time.perf_counter() - t0, run_queue_s() - q, time.thread_time() - c0
    e1 = trainer.exposed_s()
    off_cpu = max(0.0, t - min(q, t) - cpu) if off_cpu_is_collective_wait(trainer.device) else float("nan")
    if e0 is not None and e1 is not None:
        return t, q, max(e1 - e0, off_cpu) if math.isfinite(off_cpu) else e1 - e0, cpu
    return t, q, off_cpu, cpu


def off_cpu_is_collective_wait(device) -> bool:
    """Whether a step's time off a core (neither running nor runnable: wall − CPU − wait for a core)
    is its wait on its collectives: on CPU ranks of one intra-op thread, the step's work runs on the
    calling thread and only gloo's threads run beside it, so the thread sleeps only while it waits
    for them. That is how torch's DDP and FSDP2, which wait inside torch, are timed in the step."""
    return device.type == "cpu" and torch.get_num_threads() == 1


def _least_disturbed(trainer: Trainer, batches, world_size: int, timed: int = CHECK_STEPS) -> float:
    """The fastest of ``timed`` steps of ``trainer`` on one rank's share of the batches (after one
    untimed step, which pays lazy initialisation): the step least disturbed by the machine's load,
    in seconds without this thread's wait for a core in it, and never less than its CPU seconds (the
    kernel can charge a wait that began before the step to it: a step of a few ms would read 0)."""
    per = batches[0].shape[0] // world_size
    trainer.step(batches[0][:per])
    return min(max(t - q, cpu) for t, q, _, cpu in (_timed_step(trainer, batches[(i + 1) % len(batches)][:per])
                                                   for i in range(timed)))


def replay_time(collectives: list[tuple[str, int, int]], world_size: int, device, repeats: int = CHECK_STEPS) -> float:
    """Seconds the metered step's collectives take alone, back to back, same ops and sizes, no
    compute (the least disturbed of ``repeats``, the slowest rank's, without its wait for a core)."""
    from ..collectives import all_gather_into, reduce_scatter_into
    from ..doctor import rank_timings

    f32 = lambda nbytes: torch.zeros(max(world_size, nbytes // 4 // world_size * world_size),  # noqa: E731
                                     dtype=torch.float32, device=device)
    calls = []
    for op, payload, inp in collectives:
        full = f32(payload)
        if op == "all_reduce":
            calls.append(lambda full=full: dist.all_reduce(full))
        elif op == "all_gather":
            calls.append(lambda full=full: all_gather_into(full, full[:full.numel() // world_size].clone()))
        elif op == "reduce_scatter":
            calls.append(lambda full=full: reduce_scatter_into(full[:full.numel() // world_size].clone(), full))
        else:
            calls.append(lambda full=full: dist.all_to_all_single(torch.empty_like(full), full))
    t = rank_timings({"step": lambda: [c() for c in calls]}, repeats, device)["step"]
    return t[2].min().item()


@dataclass(frozen=True)
class StepInputs:
    """What a strategy's step is timed on again, alone: the model, the batches, the optimizer
    and precision, a group of this rank alone (``dist.new_subgroups(1)``'s), and the ranks' wait
    for a core since the strategy began (stopped once everything is timed)."""
    cfg: GPTConfig
    batches: list
    optimizer: str
    precision: str
    alone: Any
    waited: CoreWait


def strategy_checks(strategy: str, r: dict, held_total: int, predicted_bytes: float, predicted_sent: float,
                    link: dict[str, float], inputs: StepInputs, world: int, device) -> list[Check]:
    """The calculator's model-state bytes against the bytes this rank holds, and the step time
    against compute + the α-β time of the strategy's collectives (the strategy's step timed
    ``CHECK_STEPS`` more times after the run's, as many as each part, the least disturbed of them
    as the parts' are chosen: the run's own one or two timed steps against the least of four would
    compare one draw of the machine's load with the best of four): ``messages·α + bytes·β`` with
    the messages of the collectives the meter saw (a ring's: 2(N−1) per all-reduce, N−1 per
    all-gather or reduce-scatter) and the bytes of the calculator's ``comm_volume_per_step``, α and
    β one link's (lesson 1, ``distai doctor``'s ping-pong on this group). A missed step time names
    ``cpu_contention``, the measured step's own wait for a core (the kernel's run-queue delay of the
    calling thread, the slowest rank's), the same step's ``collective_waits``, the time it was blocked on
    its collectives (without the wait for a core once woken) minus their α-β time — on CPU ranks timed
    around the waits by our ZeRO's code, and for torch's DDP and FSDP2 (which wait inside torch) the step's time
    off a core, on CPU ranks of one thread (:func:`off_cpu_is_collective_wait`) — and
    ``strategy_overhead``, its main thread's CPU seconds minus the plain step's compute. Where those
    are not that wait (GPUs, whose waits only order streams; several intra-op threads), the strategies name
    ``replayed_collectives``, the same collectives replayed alone minus their α-β time, and
    ``strategy_overhead``, the strategy's step in a group of one rank (:func:`alone_time`) minus the
    plain step's compute. Every time is taken
    without its wait for a core, and the measured step is chosen the same way (the least such).
    All are timed right after the strategy's steps (the machine's load changes by the second);
    ``detail`` keeps the ranks' wait for a core per wall second over the strategy's steps and
    these timings (``run_queue_share``)."""
    i = inputs
    compute_s = compute_time(i.cfg, i.batches, world, device, i.optimizer, i.precision)
    # exact: the formula's bytes plus what the layout adds (layout_terms), to the byte
    memory = check(f"memory_{strategy}", predicted_bytes, float(held_total), "B", tolerance=MEMORY_TOLERANCE,
                   causes=r.get("layout_terms"), detail={"world_size": world})
    messages = sum(RING_MESSAGES[op](world) for op, _, _ in r["collectives"])
    comm = messages * link["alpha_s"] + predicted_sent * link["beta_s_per_byte"]
    from ..experiment import slowest_rank_parts

    # the least disturbed of as many steps as each part is timed on, chosen as they are: the least
    # without its wait for a core; the slowest rank's, with its own wait
    step, wait, exposed, cpu = slowest_rank_parts(*min(((t, (min(q, t), e, c)) for t, q, e, c in r["check_steps_s"]),
                                                       key=lambda tq: tq[0] - tq[1][0]), device)
    detail = {"compute_s": compute_s, "comm_alpha_beta_s": comm, "messages": messages, "alpha_s": link["alpha_s"],
              "beta_s_per_byte": link["beta_s_per_byte"], "step_wait_s": wait, "step_cpu_s": cpu}
    if math.isfinite(exposed):  # the step's own waits on its collectives, as they happened in it
        i.waited.stop()
        causes = {"collective_waits": exposed - comm, "strategy_overhead": cpu - compute_s, "cpu_contention": wait}
        # 1: the waits are the step's time off a core (torch's DDP, FSDP2), 0: timed in our ZeRO's code
        detail.update(exposed_s=exposed, waits_off_cpu=float(not strategy.startswith("zero")))
    else:  # torch's DDP and FSDP2 where their waits cannot be told apart: collectives and overhead timed alone
        alone_s = alone_time(strategy, i.cfg, i.batches, world, device, i.optimizer, i.precision, i.alone)
        replay = replay_time(r["collectives"], world, device)
        i.waited.stop()
        causes = {"replayed_collectives": replay - comm, "strategy_overhead": alone_s - compute_s,
                  "cpu_contention": wait}
        detail.update(replayed_s=replay, alone_s=alone_s)
    # where the waits are the step's time off a core, the causes are its parts (on a core, waiting for one,
    # off one): they add up to the step by construction
    timed = check(f"step_time_{strategy}", compute_s + comm, step, "s", causes=causes,
                  detail={**detail, "run_queue_share": i.waited.run_queue_share},
                  decomposition=bool(detail.get("waits_off_cpu")))
    return [memory, timed]


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run lesson2")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--batch", type=int, default=16)
    add_model_options(p, DEFAULT_MODEL)
    p.add_argument("--no-check", action="store_true")
    p.help_fields = {"strategies": {"all": ", ".join(STRATEGIES)}}
    return p


def _checked(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments, with ``strategies`` as a list; UsageError on values argparse cannot check."""
    if isinstance(args.strategies, str):
        args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in args.strategies if s not in STRATEGIES]
    if bad:
        raise UsageError.keyed("strategies", bad=bad, choices=", ".join(STRATEGIES))
    if args.steps < 2:
        raise UsageError.keyed("steps_two")
    return args


def main(argv=None) -> int:
    return run_experiment("lesson2", lambda a: _checked(build_parser().parse_args(a)), run, argv,
                          usage_errors=(ModelConfigError,))


def run(ctx, args: argparse.Namespace) -> dict:
    rank, world, ev = ctx.rank, ctx.world_size, ctx.events
    if args.batch % world:
        args.batch = math.ceil(args.batch / world) * world
    cfg = ModelSize.from_args(args, DEFAULT_MODEL)
    num_params = count_params(cfg)
    batches = make_batches(cfg, args.steps, args.batch)
    PHASE.emit(ev, {"name": "setup", "world_size": world, "num_params": num_params, "precision": args.precision,
                    "optimizer": args.optimizer, "strategies": args.strategies, "backend": ctx.backend})
    reference = None
    if not args.no_check:
        reference, _ = reference_params(cfg, batches, args.optimizer, args.precision, device=ctx.device)
    rows = []
    link, alone = _check_inputs(ctx)
    total_steps = len(args.strategies) * args.steps
    for k, strategy in enumerate(args.strategies):
        PHASE.emit(ev, {"name": strategy})
        PROGRESS.emit(ev, {"done": k * args.steps, "total": total_steps, "label": strategy})
        waited = CoreWait(ctx.device).start()  # stopped once the step's check is timed
        r = run_strategy(strategy, cfg, batches, rank, world, ctx.device, args.optimizer,
                         args.precision, reference=reference, events=ev, check_steps=CHECK_STEPS if link else 0)
        held = r["held"]
        total = sum(held.values())
        try:
            parts = predicted_model_state_bytes(num_params, world, strategy, args.optimizer,
                                                args.precision)
            predicted = float(parts["total_bytes"])
            predicted_sent = predicted_traffic_bytes(num_params, world, strategy, args.precision)
        except (ImportError, AttributeError, ValueError, TypeError) as exc:
            parts, predicted = {}, float("nan")
            predicted_sent = float("nan")
            LOG.emit(ev, {"msg": f"calculator unavailable: {exc}"})
        MEMORY.emit(ev, {"strategy": strategy, "params": held["params"], "grads": held["grads"],
                         "optimizer": held["optimizer"], "total": total, "predicted": predicted, "predicted_parts": parts,
                         "peak": r.get("cuda_max_allocated"), "fsdp_tracker": r.get("fsdp_tracker"), "world_size": world,
                         "num_params": num_params, "precision": args.precision, "optimizer_name": args.optimizer})
        COMM.emit(ev, {"strategy": strategy, "sent": r["sent"], "by_op": r["by_op"], "calls": r["calls"],
                       "predicted": predicted_sent, "num_params": num_params})
        if link is not None:
            for c in strategy_checks(strategy, r, total, predicted, predicted_sent, link,
                                     StepInputs(cfg, batches, args.optimizer, args.precision, alone, waited),
                                     world, ctx.device):
                CHECK.emit_fields(ev, c.event())
        STRATEGY_DONE.emit(ev, {"strategy": strategy, "step_time_s": r["step_time_s"],
                                "max_abs_diff": r.get("max_abs_diff"), "final_loss": r["losses"][-1]})
        PROGRESS.emit(ev, {"done": (k + 1) * args.steps, "total": total_steps, "label": strategy})
        rows.append((strategy, total, predicted, r["sent"], predicted_sent, r["step_time_s"],
                     r.get("max_abs_diff"), r["losses"]))
    summary = {"world_size": world, "num_params": num_params, "precision": args.precision,
               "optimizer": args.optimizer, "steps": args.steps, "backend": ctx.backend,
               "strategies": {s: {"model_state_bytes": t, "predicted_bytes": p, "sent_bytes": sent,
                                  "predicted_sent_bytes": ps, "step_time_s": st, "max_abs_diff": d,
                                  "final_loss": losses[-1]}
                              for s, t, p, sent, ps, st, d, losses in rows}}
    if rank == 0:
        print(summary_from_event(summary))
    return summary


def _check_inputs(ctx) -> tuple[dict[str, float] | None, Any]:
    """One link's α and β (``distai doctor``'s measurement, on this group) and a group of this
    rank alone: what every strategy's step time is predicted from and explained by (None alone:
    nothing to check)."""
    if ctx.world_size < 2:
        return None, None
    from ..doctor import link_alpha_beta

    alone, _ = dist.new_subgroups(1)
    return link_alpha_beta(ctx.device), alone


def summary_from_event(summary: dict, lang: str | None = None) -> str:
    """Rank 0's printed table from its summary event alone, in ``lang`` (else the run's): ``distai runs
    show`` writes it again from it in another language."""
    from types import SimpleNamespace

    rows = [(name, s["model_state_bytes"], s["predicted_bytes"], s["sent_bytes"], s["predicted_sent_bytes"],
             s["step_time_s"], s["max_abs_diff"], None) for name, s in summary["strategies"].items()]
    args = SimpleNamespace(precision=summary["precision"], optimizer=summary["optimizer"], steps=summary["steps"])
    return "\n".join(summary_table(rows, summary["num_params"], summary["world_size"], args, summary["backend"], lang))


def summary_table(rows, num_params, world, args, backend: str, lang: str | None = None) -> list[str]:
    """Rank 0's figures in the learner's language, in lines of at most 70 characters (the launcher
    prefixes each line)."""
    from ...lessons.units import format_bytes, format_fixed, format_integer, format_number, number_separator

    lang = lang or run_language()
    say = summary_lines("lesson2", lang)
    fb = lambda n: format_bytes(n, lang=lang)  # noqa: E731
    ratio = lambda a, b: format_fixed(a / b if b else float("nan"), 2, lang)  # noqa: E731
    lines = [say("head", params=format_integer(num_params, lang), world=world, precision=args.precision,
                 optimizer=args.optimizer, steps=args.steps)]
    m, c, r = say("measured"), say("calc"), say("ratio")
    lines.append(f"{'':<6} {say('held'):^22}  {say('sent'):^22}")
    lines.append(f"{'':<6} {m:>8} {c:>8} {r:>4}  {m:>8} {c:>8} {r:>4}  {say('step'):>7} {'max|Δw|':>7}")
    ddp_sent = next((r[3] for r in rows if r[0] == "ddp"), None)
    for s, total, pred, sent, psent, st, diff, _ in rows:
        diff_s = "-" if diff is None else format_number(diff, 2, lang)
        lines.append(f"{s:<6} {fb(total):>8} {fb(pred):>8} {ratio(total, pred):>4}  {fb(sent):>8} {fb(psent):>8} "
                     f"{ratio(sent, psent):>4}  {format_fixed(st * 1e3, 0, lang):>5}ms {diff_s:>7}")
    lines.append(say("diff_legend"))
    lines.append(say("step_legend"))
    if ddp_sent:
        ratios = number_separator(lang).join(f"{s} {ratio(sent, ddp_sent)}x" for s, _, _, sent, *_ in rows if s != "ddp")
        lines.append(say("vs_ddp", ratios=ratios))
    if any(r[0] == "fsdp2" for r in rows) and backend == "gloo":
        lines += say("fsdp2_gloo").splitlines()
    if args.precision != "fp32":
        lines += say("bf16").splitlines()
    return lines


if __name__ == "__main__":
    exit_with(main)
