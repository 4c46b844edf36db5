"""A real pipeline: the GPT (:mod:`distai.engine.model`, untied) cut into stages, one process per stage, driven by the
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

It runs what :func:`~distai.lessons.lesson5.formulas.check_schedule` accepts for ``engine="distai"``: GPipe
and 1F1B on any number of microbatches m (1F1B's warm-up cut at m when m < p), and the interleaved
schedule on torch.distributed.pipelining's rule, whose order it runs (``ScheduleInterleaved1F1B``:
max(1, m // p) equal rounds, so any m < p too). torch's ``Schedule1F1B`` wants m ≥ p and Megatron-LM's
interleaved schedule m a multiple of p; ``engine="torch"`` and ``engine="megatron"`` check those.

Before the first step, :meth:`PipelineRunner.validate` gathers every stage's declared input and
the output it actually produces, so a stage that expects a different shape or dtype than its
predecessor sends stops every rank with the same clear error instead of a hang.

The loss of each microbatch is divided by ``m``; gradients accumulate over the microbatches, so
after a step they equal the gradients of the whole batch through the unsplit model (the tests
check it, and check them against ``torch.distributed.pipelining`` too).

:class:`~distai.engine.metering.SavedActivationMeter` counts the bytes autograd keeps for
backward (parameters excluded) as they are saved and freed, so the peak activation memory of a stage is measured the
same way for our schedules and for torch's.

Each block's work is timed twice: its wall time and, on a CPU, the process's CPU time (per intra-op
thread), so that a block that waited for a core (more ranks than cores) can be told from one with
more work (``OpRecord.compute``); each wait on a peer's message is kept (``StepResult.waits``), and when each send was posted
(``StepResult.sends``): lesson 5's check times a message from its post to the end of its wait.

Events: a ``pp_op`` per block (``lessons/lesson5/events.py``; its times on CUDA after a
synchronize; ``compute``: its work) and ``span`` events on the ``comm`` stream for posting the plan's sends and receives and for each wait on a receive (emitted after the
step, so recording them does not slow it).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn

from ..lessons.events import SPAN
from ..lessons.lesson5 import simulator as sim
from ..lessons.lesson5.events import PP_OP
from .metering import SavedActivationMeter
from .model import GPT, GPTConfig, ModelStage, lm_loss


class PipelineConfigError(ValueError):
    """A pipeline that cannot run as configured (too few microbatches, shapes that do not chain)."""


# ---------------------------------------------------------------------------------------------
# The model: the one GPT (``distai.engine.model``), cut into stages that share its modules.

loss_fn = lm_loss


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


class Stage(Protocol):
    """What the runner needs of a stage: call it, its parameters, what it receives."""

    def __call__(self, x: torch.Tensor) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def input_meta(self, microbatch_size: int) -> TensorMeta: ...


class StageModule(ModelStage):
    """One virtual stage: a :class:`~distai.engine.model.ModelStage` of the model (the model's
    own modules, the model's parameter names) and what it expects to receive."""

    def input_meta(self, microbatch_size: int) -> TensorMeta:
        if self.embed is not None:
            return TensorMeta((microbatch_size, self.cfg.seq), "int64")
        blocks = self.block_list()
        shard = blocks[0].sequence_shard if blocks else None  # sequence parallelism: this rank's tokens
        seq = self.cfg.seq // shard[1] if shard is not None else self.cfg.seq
        dtype = next(self.parameters()).dtype
        return TensorMeta((seq, microbatch_size, self.cfg.hidden), str(dtype).replace("torch.", ""))


def split_stages(model: GPT, n_stages: int) -> list[StageModule]:
    """Cut the model's blocks into ``n_stages`` runs of equal length (the embedding joins the
    first, the head the last); the stages share the model's modules (a plan such as
    ``apply_tp`` then transforms each in place)."""
    cfg = model.cfg
    if cfg.tie_embeddings and n_stages > 1:
        raise PipelineConfigError("the first and the last stage would each hold a copy of a tied "
                                  "embedding: pipeline an untied model (tie_embeddings=False)")
    if cfg.layers < n_stages:
        raise PipelineConfigError(f"{cfg.layers} transformer blocks cannot fill {n_stages} stages; "
                                  f"use at least {n_stages} layers")
    if cfg.layers % n_stages:
        raise PipelineConfigError(f"{cfg.layers} transformer blocks do not split evenly into {n_stages} "
                                  f"stages; use a multiple of {n_stages} layers")
    per = cfg.layers // n_stages
    return [StageModule(model, range(s * per, (s + 1) * per), s == 0, s == n_stages - 1) for s in range(n_stages)]


MIN_DEFAULT_LAYERS = 8  # lesson 5's GPT has at least these blocks when --layers is not given


def default_layers(p: int, v: int, minimum: int = MIN_DEFAULT_LAYERS) -> int:
    """The fewest blocks ≥ ``minimum`` that split evenly for both v = 1 and v chunks per rank."""
    unit = p * v
    return unit * max(1, math.ceil(minimum / unit))


def make_batch(cfg: GPTConfig, batch: int, seed: int = 1234, device="cpu"):
    """A learnable toy task: predict the next token of sequences that count up modulo vocab."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, cfg.vocab, (batch, 1), generator=g)
    step = torch.randint(1, 4, (batch, 1), generator=g)
    idx = torch.arange(cfg.seq + 1).unsqueeze(0)
    seqs = (start + step * idx) % cfg.vocab
    return seqs[:, :-1].contiguous().to(device), seqs[:, 1:].contiguous().to(device)


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
    c0: float | None = None  # the process's CPU clock (PipelineRunner.cpu_clock) at t0 and t1; None on a GPU
    c1: float | None = None

    @property
    def compute(self) -> float:
        """The block's own work: the CPU time it got (at most its wall time) on a CPU, what it
        takes on a core of its own; its wall time on a GPU."""
        wall = self.t1 - self.t0
        return wall if self.c0 is None or self.c1 is None else min(max(self.c1 - self.c0, 0.0), wall)


@dataclass
class StepResult:
    loss: float | None  # the batch's loss, on the rank that holds the last stage
    records: list[OpRecord]
    t_start: float
    t_end: float
    peak_activation_bytes: int
    waits: list[tuple[sim.Message, float, float]]  # each wait on a peer's message: (message, t0, t1)
    send_wait: tuple[float, float]  # the wait, after the last block, for the step's sends to complete
    cpu_start: float | None  # the CPU clock at t_start and t_end (None on a GPU)
    cpu_end: float | None
    sends: list[tuple[sim.Message, float]] = field(default_factory=list)  # each send: (message, when posted)


class PipelineRunner:
    """Runs one rank's share of a pipeline schedule.

    ``chunks`` maps each of this rank's virtual stages (``chunk * p + rank``) to its module.
    """

    def __init__(self, chunks: Mapping[int, Stage], *, rank: int, p: int, m: int, schedule: str,
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

    def cpu_clock(self) -> float | None:
        """CPU seconds so far: this thread's when torch computes on it alone (one intra-op thread:
        a block's CPU time is then exactly its work), else the process's per intra-op thread (an
        estimate: it counts a block that keeps its threads only partly busy as waiting for a core);
        None when the blocks run on a GPU (their wall time is their work)."""
        if self.sync_timing:
            return None
        threads = torch.get_num_threads()
        return time.thread_time() if threads == 1 else time.process_time() / threads

    def step(self, inputs: Sequence[torch.Tensor] | None = None,
             targets: Sequence[torch.Tensor] | None = None) -> StepResult:
        """One pass of the schedule over the ``m`` microbatches. ``inputs`` (microbatches of token
        ids) are needed on the rank of stage 0, ``targets`` on the rank of the last stage.
        Gradients accumulate into the chunks' ``.grad``."""
        metas = self.metas if self.metas is not None else self.validate()
        run = _ScheduleRun(self, metas, *self._checked_batches(metas, inputs, targets))
        self.meter.reset_peak()
        if self.group is not None:
            dist.barrier(group=self.group)
        else:
            dist.barrier()
        t_start, cpu_start = self._now(), self.cpu_clock()
        for action in self.plan:
            if action.kind != "compute":
                run.pending.append(action)
                continue
            run.flush()
            op = action.op
            assert op is not None  # a compute action runs a block
            if op.kind == sim.FORWARD:
                run.forward(op)
            else:
                run.backward(op)
        run.flush()
        send_wait = run.wait_sends()
        t_end, cpu_end = self._now(), self.cpu_clock()
        if run.recv_work or run.stage_out:
            raise RuntimeError(f"rank {self.rank}: schedule left {len(run.recv_work)} receives and "
                               f"{len(run.stage_out)} activations behind")
        loss = float(run.total_loss) if self.n_stages - 1 in self.chunks else None
        self._emit_trace(run.records, run.comm)
        self._step += 1
        return StepResult(loss, run.records, t_start, t_end, self.meter.peak, run.waits, send_wait, cpu_start,
                          cpu_end, run.sends)

    def _checked_batches(self, metas, inputs: Sequence[torch.Tensor] | None,
                         targets: Sequence[torch.Tensor] | None) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
        """The microbatches this rank's stages need, checked against the plan and the first
        stage's declared input."""
        first, last = 0, self.n_stages - 1
        if first in self.chunks and (inputs is None or len(inputs) != self.m):
            raise PipelineConfigError(f"the first stage needs {self.m} input microbatches")
        if last in self.chunks and (targets is None or len(targets) != self.m):
            raise PipelineConfigError(f"the last stage needs {self.m} target microbatches")
        inputs, targets = inputs or (), targets or ()
        if first in self.chunks:
            want = metas[0][0]
            for x in inputs:
                if TensorMeta.of(x) != want:
                    raise PipelineConfigError(f"input microbatch is {TensorMeta.of(x)} but stage 0 expects {want}")
        return inputs, targets

    def _emit_trace(self, records: list[OpRecord], comm: list[tuple[str, float, float]]) -> None:
        """The step's blocks (``pp_op``) and its point-to-point posts and waits (``span``), after
        the step so that recording them does not slow it."""
        if self.events is None:
            return
        for rec in records:
            PP_OP.emit(self.events, {"schedule": self.schedule, "step": self._step, "op": rec.op.kind,
                                     "mb": rec.op.mb, "chunk": rec.op.chunk, "stage": rec.op.stage,
                                     "t0": rec.t0, "t1": rec.t1, "compute": rec.compute})
        stream = "comm" if self.group is None else "comm pp"  # in a mesh: the pipeline's own group
        for what, t0, t1 in comm:
            SPAN.emit(self.events, {"name": what, "stream": stream, "t0": t0, "t1": t1, "schedule": self.schedule,
                                    "step": self._step})


class _ScheduleRun:
    """One step of a :class:`PipelineRunner`'s plan in flight: the activations each stage keeps
    for its backward, the point-to-point messages posted and awaited, the blocks' timings."""

    def __init__(self, runner: PipelineRunner, metas, inputs: Sequence[torch.Tensor],
                 targets: Sequence[torch.Tensor]):
        self.runner, self.metas, self.inputs, self.targets = runner, metas, inputs, targets
        self.first, self.last = 0, runner.n_stages - 1
        self.stage_in: dict[tuple[int, int], torch.Tensor] = {}
        self.stage_out: dict[tuple[int, int], torch.Tensor] = {}
        self.recv_buf: dict[sim.Message, torch.Tensor] = {}
        self.recv_work: dict[sim.Message, _Batch] = {}
        self.sends_in_flight: list = []
        self.pending: list[sim.Action] = []
        self.records: list[OpRecord] = []
        self.comm: list[tuple[str, float, float]] = []  # (what, t0, t1): posting sends/receives, waiting on one
        self.waits: list[tuple[sim.Message, float, float]] = []  # (message, t0, t1): each wait on a receive
        self.sends: list[tuple[sim.Message, float]] = []  # (message, t): each send, when its batch was posted
        self.total_loss = torch.zeros((), dtype=torch.float64, device=runner.device)

    def flush(self) -> None:
        """Post the pending sends and receives as one batch."""
        if not self.pending:
            return
        r = self.runner
        ops, recvs, keep, labels = [], [], [], []
        for a in self.pending:
            msg = a.message
            assert msg is not None  # a send or a receive carries its message
            labels.append(_p2p_label(a.kind, msg, r.p))
            if a.kind == "send":
                if msg.kind == sim.FORWARD:
                    t = self.stage_out[(msg.from_stage, msg.mb)].detach()
                else:
                    grad = self.stage_in.pop((msg.from_stage, msg.mb)).grad
                    assert grad is not None  # the backward of this block just filled it
                    t = grad
                keep.append(t)
                ops.append(dist.P2POp(dist.isend, t, r._peer(msg.dst % r.p), r.group))
            else:
                stage = msg.from_stage + 1 if msg.kind == sim.FORWARD else msg.from_stage - 1
                meta = self.metas[stage][0] if msg.kind == sim.FORWARD else self.metas[stage][1]
                buf = meta.empty(r.device)
                self.recv_buf[msg] = buf
                recvs.append(msg)
                ops.append(dist.P2POp(dist.irecv, buf, r._peer(msg.src % r.p), r.group))
        t0 = time.time()
        batch = _Batch(dist.batch_isend_irecv(ops), keep)
        self.sends += [(a.message, t0) for a in self.pending if a.kind == "send" and a.message is not None]
        self.comm.append((" + ".join(labels), t0, time.time()))
        for msg in recvs:
            self.recv_work[msg] = batch
        if keep:
            self.sends_in_flight.append(batch)
        self.pending.clear()

    def receive(self, msg: sim.Message) -> torch.Tensor:
        t0 = time.time()
        self.recv_work.pop(msg).wait()
        t1 = time.time()
        self.comm.append((f"wait {_p2p_label('recv', msg, self.runner.p)}", t0, t1))
        self.waits.append((msg, t0, t1))
        return self.recv_buf.pop(msg)

    def forward(self, op) -> None:
        r, s, mb = self.runner, op.stage, op.mb
        if s == self.first:
            x = self.inputs[mb]
        else:
            x = self.receive(sim.Message(sim.FORWARD, mb, s - 1, (s - 1) % r.p, r.rank))
            x.requires_grad_(True)
        t0, c0 = r._now(), r.cpu_clock()
        before = r.meter.live
        with r.meter:
            out = r.chunks[s](x)
            if s == self.last:
                out = r.loss(out, self.targets[mb]) / r.m
        saved = r.meter.live - before
        t1, c1 = r._now(), r.cpu_clock()
        if s != self.first:
            self.stage_in[(s, mb)] = x
        self.stage_out[(s, mb)] = out
        self.records.append(OpRecord(op, t0, t1, saved, c0, c1))

    def backward(self, op) -> None:
        r, s, mb = self.runner, op.stage, op.mb
        out = self.stage_out.pop((s, mb))
        if s == self.last:
            grad = None
        else:
            grad = self.receive(sim.Message(sim.BACKWARD, mb, s + 1, (s + 1) % r.p, r.rank))
        if r.before_backward is not None:
            r.before_backward(op)
        t0, c0 = r._now(), r.cpu_clock()
        if s == self.last:
            out.backward()
            self.total_loss += out.detach()
        else:
            out.backward(grad)
        t1, c1 = r._now(), r.cpu_clock()
        if s == self.first:
            self.stage_in.pop((s, mb), None)
        self.records.append(OpRecord(op, t0, t1, 0, c0, c1))

    def wait_sends(self) -> tuple[float, float]:
        t0 = time.time()
        for batch in self.sends_in_flight:
            batch.wait()
        t1 = time.time()
        self.comm.append(("wait sends", t0, t1))
        return t0, t1


def _p2p_label(kind: str, msg: sim.Message, p: int) -> str:
    """``send F mb3 → stage 2`` / ``recv B mb1 ← stage 0``: one point-to-point message of the plan, its peer
    named by pipeline stage (lesson 5's rank; in a capstone mesh the trace's processes are global ranks)."""
    if kind == "send":
        return f"send {msg.kind} mb{msg.mb} → stage {msg.dst % p}"
    return f"recv {msg.kind} mb{msg.mb} ← stage {msg.src % p}"


def build_rank_chunks(cfg: GPTConfig, p: int, v: int, rank: int, seed: int = 0,
                      device="cpu") -> dict[int, StageModule]:
    """This rank's chunks of the model built from ``seed`` (identical on every rank)."""
    stages = split_stages(GPT(cfg, seed=seed), p * v)
    return {c * p + rank: stages[c * p + rank].to(device) for c in range(v)}


def microbatches(t: torch.Tensor, m: int) -> list[torch.Tensor]:
    if t.shape[0] % m:
        raise PipelineConfigError(f"batch of {t.shape[0]} does not split into {m} equal microbatches")
    return list(t.tensor_split(m))


def reference_grads(cfg: GPTConfig, ids: torch.Tensor, targets: torch.Tensor, seed: int = 0) -> tuple[float, GPT]:
    """Loss and gradients of the unsplit model on the whole batch (on the batch's device): what a
    pipeline must reproduce. Returns (loss, the model) with ``.grad`` filled (cut it with
    :func:`split_stages` to compare stage by stage)."""
    if cfg.tie_embeddings:
        raise PipelineConfigError("pipeline an untied model (tie_embeddings=False)")
    model = GPT(cfg, seed=seed).to(ids.device)
    loss = loss_fn(model(ids), targets)
    loss.backward()
    return float(loss.detach()), model
