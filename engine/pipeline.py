"""A real pipeline: a small transformer cut into stages, one process per stage, driven by the
lesson's simulator.

Each rank holds ``v`` chunks (virtual stages ``rank, rank + p, …``) of the model. For a
schedule (``gpipe``, ``1f1b`` or ``interleaved``) the rank asks
:mod:`distai.lessons.lesson5.simulator` for its order of forward and backward blocks and for
the point-to-point plan around them (:func:`~distai.lessons.lesson5.simulator.comm_plan`), and
executes exactly that: activations go forward and gradients backward with
``torch.distributed.batch_isend_irecv``; a receive is posted where the plan says and waited on
right before the block that needs it. The plan posts messages in one global order on every
rank, so it needs no tags (NCCL has none) and cannot deadlock even when every posted operation
blocks (proved for each order by ``check_comm_plan`` in the tests).

Before the first step, :meth:`PipelineRunner.validate` gathers every stage's declared input and
the output it actually produces, so a stage that expects a different shape or dtype than its
predecessor sends stops every rank with the same clear error instead of a hang.

The loss of each microbatch is divided by ``m``; gradients accumulate over the microbatches, so
after a step they equal the gradients of the whole batch through the unsplit model (the tests
check it, and check them against ``torch.distributed.pipelining`` too).

:class:`SavedActivationMeter` counts the bytes autograd keeps for backward (parameters
excluded) as they are saved and freed, so the peak activation memory of a stage is measured the
same way for our schedules and for torch's.

Events (``kind`` = ``pp_op``) per block: ``schedule, step, op ("F"/"B"), mb, chunk, stage,
t0, t1`` (wall-clock seconds, on CUDA after a synchronize); and ``span`` events on the ``comm``
stream for posting the plan's sends and receives and for each wait on a receive (emitted after the
step, so recording them does not slow it).
"""
from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..lessons.lesson5 import simulator as sim


class PipelineConfigError(ValueError):
    """A pipeline that cannot run as configured (too few microbatches, shapes that do not chain)."""


# ---------------------------------------------------------------------------------------------
# The model: a small GPT, as a list of layers that can be cut anywhere.

@dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 8
    seq: int = 32

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise PipelineConfigError(f"d_model = {self.d_model} is not divisible by n_heads = {self.n_heads}")


class Embedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention and a 4x MLP."""

    def __init__(self, cfg: ModelConfig, d_model: int | None = None):
        super().__init__()
        d = d_model or cfg.d_model
        self.d_model, self.n_heads = d, cfg.n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        heads = lambda t: t.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)  # noqa: E731
        att = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_model = cfg.d_model
        self.ln = nn.LayerNorm(cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def build_layers(cfg: ModelConfig, seed: int = 0) -> list[nn.Module]:
    """Embedding, ``n_layers`` blocks, head: the same weights on every rank for the same seed."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return [Embedding(cfg)] + [Block(cfg) for _ in range(cfg.n_layers)] + [Head(cfg)]
    finally:
        torch.random.set_rng_state(gen_state)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(t.shape), str(t.dtype).replace("torch.", ""))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"

    def empty(self, device) -> torch.Tensor:
        return torch.empty(self.shape, dtype=getattr(torch, self.dtype), device=device)


class StageModule(nn.Module):
    """A run of consecutive layers: one virtual stage."""

    def __init__(self, layers: Sequence[nn.Module], cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def input_meta(self, microbatch_size: int) -> TensorMeta:
        """What this stage expects to receive."""
        first = self.layers[0]
        if isinstance(first, Embedding):
            return TensorMeta((microbatch_size, self.cfg.seq), "int64")
        return TensorMeta((microbatch_size, self.cfg.seq, first.d_model), "float32")


def split_layers(layers: Sequence[nn.Module], n_stages: int, cfg: ModelConfig) -> list[StageModule]:
    """Cut the blocks into ``n_stages`` runs of equal length (embedding joins the first, head
    the last)."""
    blocks = list(layers[1:-1])
    if len(blocks) < n_stages:
        raise PipelineConfigError(f"{len(blocks)} transformer blocks cannot fill {n_stages} stages; "
                                  f"use at least {n_stages} layers")
    if len(blocks) % n_stages:
        raise PipelineConfigError(f"{len(blocks)} transformer blocks do not split evenly into {n_stages} "
                                  f"stages; use a multiple of {n_stages} layers")
    per = len(blocks) // n_stages
    stages = []
    for s in range(n_stages):
        chunk = blocks[s * per:(s + 1) * per]
        if s == 0:
            chunk = [layers[0]] + chunk
        if s == n_stages - 1:
            chunk = chunk + [layers[-1]]
        stages.append(StageModule(chunk, cfg))
    return stages


def default_layers(p: int, v: int, minimum: int = 8) -> int:
    """The fewest blocks ≥ ``minimum`` that split evenly for both v = 1 and v chunks per rank."""
    unit = p * v
    return unit * max(1, math.ceil(minimum / unit))


def make_batch(cfg: ModelConfig, batch: int, seed: int = 1234, device="cpu"):
    """A learnable toy task: predict the next token of sequences that count up modulo vocab."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, cfg.vocab, (batch, 1), generator=g)
    step = torch.randint(1, 4, (batch, 1), generator=g)
    idx = torch.arange(cfg.seq + 1).unsqueeze(0)
    seqs = (start + step * idx) % cfg.vocab
    return seqs[:, :-1].contiguous().to(device), seqs[:, 1:].contiguous().to(device)


# ---------------------------------------------------------------------------------------------
# Measuring activation memory: bytes autograd saves for backward, live.

class SavedActivationMeter:
    """Counts the bytes of tensors autograd saves for backward while it is active (as a context
    manager), deduplicated by storage, parameters excluded; each storage is uncounted when the graph
    that saved it is freed. ``live`` and ``peak`` are in bytes."""

    def __init__(self, params: Iterable[torch.Tensor] = ()):
        self._skip = {p.untyped_storage().data_ptr() for p in params}
        self._held: dict[int, list[int]] = {}  # storage ptr -> [references, nbytes]
        self.live = 0
        self.peak = 0
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    class _Saved:
        __slots__ = ("tensor", "__weakref__")

        def __init__(self, tensor):
            self.tensor = tensor

    def _pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self._skip or t.device.type == "meta":
            return t
        entry = self._held.get(ptr)
        if entry is None:
            entry = self._held[ptr] = [0, storage.nbytes()]
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        saved = self._Saved(t)
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
    def _unpack(saved):
        return saved.tensor if isinstance(saved, SavedActivationMeter._Saved) else saved

    def reset_peak(self) -> None:
        self.peak = self.live

    def __enter__(self):
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# ---------------------------------------------------------------------------------------------
# The runner.

class _Batch:
    """The works of one batch_isend_irecv, waited at most once (a second wait on a finished gloo
    send waits for a send that never comes), holding its send tensors alive until then."""

    __slots__ = ("works", "keep", "done")

    def __init__(self, works, keep):
        self.works, self.keep, self.done = works, keep, False

    def wait(self) -> None:
        if not self.done:
            for w in self.works:
                w.wait()
            self.done = True
            self.keep = None


@dataclass
class OpRecord:
    op: sim.Op
    t0: float
    t1: float
    saved_bytes: int = 0  # forwards: activation bytes autograd kept for this block's backward


@dataclass
class StepResult:
    loss: float | None  # the batch's loss, on the rank that holds the last stage
    records: list[OpRecord]
    t_start: float
    t_end: float
    peak_activation_bytes: int


class PipelineRunner:
    """Runs one rank's share of a pipeline schedule.

    ``chunks`` maps each of this rank's virtual stages (``chunk * p + rank``) to its module.
    """

    def __init__(self, chunks: dict[int, nn.Module], *, rank: int, p: int, m: int, schedule: str,
                 v: int = 1, microbatch_size: int, device: torch.device | str = "cpu",
                 loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn,
                 group: dist.ProcessGroup | None = None, events=None, sync_timing: bool | None = None,
                 meter: SavedActivationMeter | None = None,
                 before_backward: Callable[[sim.Op], None] | None = None):
        try:
            self.schedule = sim.validate(schedule, p, m, v)
        except sim.ScheduleError as exc:
            raise PipelineConfigError(str(exc)) from None
        expected = {c * p + rank for c in range(v)}
        if set(chunks) != expected:
            raise PipelineConfigError(f"rank {rank} must hold stages {sorted(expected)}, got {sorted(chunks)}")
        self.chunks = chunks
        self.rank, self.p, self.m, self.v = rank, p, m, v
        self.n_stages = p * v
        self.microbatch_size = microbatch_size
        self.device = torch.device(device)
        self.loss = loss
        self.group = group
        self.events = events
        self.sync_timing = self.device.type == "cuda" if sync_timing is None else sync_timing
        self.timeline = sim.simulate(self.schedule, p, m, v)
        self.order = self.timeline.order[rank]
        self.plan = sim.comm_plan(self.timeline)[rank]
        params = [q for mod in chunks.values() for q in mod.parameters()]
        self.meter = meter if meter is not None else SavedActivationMeter(params)
        self.metas: dict[int, tuple[TensorMeta, TensorMeta]] | None = None
        # called with each backward block's op just before it runs (e.g. to let data parallelism
        # sync a chunk's gradients only in its last microbatch's backward, as Megatron does)
        self.before_backward = before_backward
        self._step = 0

    # -- ranks of stages and the group's global ranks --
    def _peer(self, stage: int) -> int:
        local = stage % self.p
        return dist.get_global_rank(self.group, local) if self.group is not None else local

    def parameters(self):
        for s in sorted(self.chunks):
            yield from self.chunks[s].parameters()

    def validate(self) -> dict[int, tuple[TensorMeta, TensorMeta]]:
        """Check, on every rank at once, that each stage's output is what the next one expects.

        One ``all_gather_object``: every rank sees every stage's declared input and actual output
        (or the error its dry run raised) and raises the same PipelineConfigError if anything does
        not chain, so no rank is left waiting on a receive that never comes."""
        mine: dict[int, tuple] = {}
        for s, mod in self.chunks.items():
            try:
                declared = mod.input_meta(self.microbatch_size)
                with torch.no_grad():
                    x = declared.empty(self.device)
                    if declared.dtype.startswith("int"):
                        x.zero_()
                    else:
                        x.normal_()
                    out = TensorMeta.of(mod(x))
                mine[s] = (declared, out, None)
            except Exception as exc:  # noqa: BLE001 - reported on every rank below
                mine[s] = (None, None, f"{type(exc).__name__}: {exc}")
        gathered: list = [None] * self.p
        dist.all_gather_object(gathered, mine, group=self.group)
        stages: dict[int, tuple] = {}
        for part in gathered:
            stages.update(part)
        problems = []
        for s in range(self.n_stages):
            declared, out, err = stages[s]
            if err is not None:
                problems.append(f"stage {s} (rank {s % self.p}) fails on its own input: {err}")
        for s in range(self.n_stages - 1):
            out, nxt = stages[s][1], stages[s + 1][0]
            if out is not None and nxt is not None and out != nxt:
                problems.append(f"stage {s} (rank {s % self.p}) sends {out} but stage {s + 1} "
                                f"(rank {(s + 1) % self.p}) expects {nxt}")
        if problems:
            raise PipelineConfigError("pipeline shapes do not match: " + "; ".join(problems))
        self.metas = {s: (stages[s][0], stages[s][1]) for s in range(self.n_stages)}
        return self.metas

    def _now(self) -> float:
        if self.sync_timing:
            torch.cuda.synchronize(self.device)
        return time.time()

    def step(self, inputs: Sequence[torch.Tensor] | None = None,
             targets: Sequence[torch.Tensor] | None = None) -> StepResult:
        """One pass of the schedule over the ``m`` microbatches. ``inputs`` (microbatches of token
        ids) are needed on the rank of stage 0, ``targets`` on the rank of the last stage.
        Gradients accumulate into the chunks' ``.grad``."""
        if self.metas is None:
            self.validate()
        first, last = 0, self.n_stages - 1
        if first in self.chunks and (inputs is None or len(inputs) != self.m):
            raise PipelineConfigError(f"the first stage needs {self.m} input microbatches")
        if last in self.chunks and (targets is None or len(targets) != self.m):
            raise PipelineConfigError(f"the last stage needs {self.m} target microbatches")
        if first in self.chunks:
            want = self.metas[0][0]
            for x in inputs:
                if TensorMeta.of(x) != want:
                    raise PipelineConfigError(f"input microbatch is {TensorMeta.of(x)} but stage 0 expects {want}")
        stage_in: dict[tuple[int, int], torch.Tensor] = {}
        stage_out: dict[tuple[int, int], torch.Tensor] = {}
        recv_buf: dict[sim.Message, torch.Tensor] = {}
        recv_work: dict[sim.Message, list] = {}
        sends_in_flight: list = []
        pending: list[sim.Action] = []
        records: list[OpRecord] = []
        comm: list[tuple[str, float, float]] = []  # (what, t0, t1): posting sends/receives, waiting on one
        total_loss = torch.zeros((), dtype=torch.float64, device=self.device) if last in self.chunks else None
        self.meter.reset_peak()

        def flush():
            if not pending:
                return
            ops, recvs, keep = [], [], []
            for a in pending:
                msg = a.message
                if a.kind == "send":
                    if msg.kind == sim.FORWARD:
                        t = stage_out[(msg.from_stage, msg.mb)].detach()
                    else:
                        t = stage_in.pop((msg.from_stage, msg.mb)).grad
                    keep.append(t)
                    ops.append(dist.P2POp(dist.isend, t, self._peer(msg.dst % self.p), self.group))
                else:
                    stage = msg.from_stage + 1 if msg.kind == sim.FORWARD else msg.from_stage - 1
                    meta = self.metas[stage][0] if msg.kind == sim.FORWARD else self.metas[stage][1]
                    buf = meta.empty(self.device)
                    recv_buf[msg] = buf
                    recvs.append(msg)
                    ops.append(dist.P2POp(dist.irecv, buf, self._peer(msg.src % self.p), self.group))
            t0 = time.time()
            batch = _Batch(dist.batch_isend_irecv(ops), keep)
            comm.append((" + ".join(_p2p_label(a.kind, a.message, self.p) for a in pending), t0, time.time()))
            for msg in recvs:
                recv_work[msg] = batch
            if keep:
                sends_in_flight.append(batch)
            pending.clear()

        def receive(msg: sim.Message) -> torch.Tensor:
            t0 = time.time()
            recv_work.pop(msg).wait()
            comm.append((f"wait {_p2p_label('recv', msg, self.p)}", t0, time.time()))
            return recv_buf.pop(msg)

        if self.group is not None:
            dist.barrier(group=self.group)
        else:
            dist.barrier()
        t_start = self._now()
        for action in self.plan:
            if action.kind != "compute":
                pending.append(action)
                continue
            flush()
            op = action.op
            s, mb = op.stage, op.mb
            module = self.chunks[s]
            if op.kind == sim.FORWARD:
                if s == first:
                    x = inputs[mb]
                else:
                    x = receive(sim.Message(sim.FORWARD, mb, s - 1, (s - 1) % self.p, self.rank))
                    x.requires_grad_(True)
                t0 = self._now()
                before = self.meter.live
                with self.meter:
                    out = module(x)
                    if s == last:
                        out = self.loss(out, targets[mb]) / self.m
                saved = self.meter.live - before
                t1 = self._now()
                if s != first:
                    stage_in[(s, mb)] = x
                stage_out[(s, mb)] = out
            else:
                out = stage_out.pop((s, mb))
                if s == last:
                    grad = None
                else:
                    grad = receive(sim.Message(sim.BACKWARD, mb, s + 1, (s + 1) % self.p, self.rank))
                if self.before_backward is not None:
                    self.before_backward(op)
                t0 = self._now()
                if s == last:
                    out.backward()
                    total_loss += out.detach()
                else:
                    out.backward(grad)
                t1 = self._now()
                if s == first:
                    stage_in.pop((s, mb), None)
                saved = 0
            records.append(OpRecord(op, t0, t1, saved))
        flush()
        t0 = time.time()
        for batch in sends_in_flight:
            batch.wait()
        comm.append(("wait sends", t0, time.time()))
        t_end = self._now()
        if recv_work or stage_out:
            raise RuntimeError(f"rank {self.rank}: schedule left {len(recv_work)} receives and "
                               f"{len(stage_out)} activations behind")
        loss = float(total_loss) if total_loss is not None else None
        if self.events is not None:
            for rec in records:
                self.events.emit("pp_op", schedule=self.schedule, step=self._step, op=rec.op.kind,
                                 mb=rec.op.mb, chunk=rec.op.chunk, stage=rec.op.stage, t0=rec.t0, t1=rec.t1)
            stream = "comm" if self.group is None else "comm pp"  # in a mesh: the pipeline's own group
            for what, t0, t1 in comm:
                self.events.emit("span", name=what, stream=stream, t0=t0, t1=t1, schedule=self.schedule,
                                 step=self._step)
        self._step += 1
        return StepResult(loss, records, t_start, t_end, self.meter.peak)


def _p2p_label(kind: str, msg: sim.Message, p: int) -> str:
    """``send F mb3 → rank 2`` / ``recv B mb1 ← rank 0``: one point-to-point message of the plan."""
    if kind == "send":
        return f"send {msg.kind} mb{msg.mb} → rank {msg.dst % p}"
    return f"recv {msg.kind} mb{msg.mb} ← rank {msg.src % p}"


def build_rank_chunks(cfg: ModelConfig, p: int, v: int, rank: int, seed: int = 0,
                      device="cpu") -> dict[int, StageModule]:
    """This rank's chunks of the model built from ``seed`` (identical on every rank)."""
    stages = split_layers(build_layers(cfg, seed), p * v, cfg)
    return {c * p + rank: stages[c * p + rank].to(device) for c in range(v)}


def microbatches(t: torch.Tensor, m: int) -> list[torch.Tensor]:
    if t.shape[0] % m:
        raise PipelineConfigError(f"batch of {t.shape[0]} does not split into {m} equal microbatches")
    return list(t.tensor_split(m))


def reference_grads(cfg: ModelConfig, ids: torch.Tensor, targets: torch.Tensor, seed: int = 0):
    """Loss and gradients of the unsplit model on the whole batch (on the batch's device): what a
    pipeline must reproduce. Returns (loss, list of layers) with ``.grad`` filled."""
    layers = [layer.to(ids.device) for layer in build_layers(cfg, seed)]
    x = ids
    for layer in layers:
        x = layer(x)
    loss = loss_fn(x, targets)
    loss.backward()
    return float(loss.detach()), layers
