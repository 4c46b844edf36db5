"""3D parallelism: data × tensor × pipeline parallelism on one device mesh (the capstone).

The ranks form a ``torch.distributed.device_mesh.DeviceMesh`` of shape ``(pp, dp, tp)`` with
tensor parallelism innermost (consecutive ranks, i.e. one node), then data, then pipeline: the
order of Megatron-LM and torchtitan (Narayanan et al., SC 2021, Sec. 3: keep TP inside a node).
Nothing here re-implements a parallelism; it composes the lessons' own engine:

* **TP with sequence parallelism** (lesson 4, :func:`~distai.engine.tensor_parallel.apply_tp`):
  each pipeline stage of the one model (:func:`~distai.engine.pipeline.split_stages`) is split in
  place — its blocks' projections column- and row-parallel, the embedding and the LM head over the
  vocabulary, the loss a vocabulary-parallel cross-entropy; after backward
  :func:`~distai.engine.tensor_parallel.sync_tp_grads` sums the layer-norm and row-bias gradients
  over the TP group.
* **PP** (lesson 5, :mod:`distai.engine.pipeline`): the blocks are cut into ``pp·v`` virtual
  stages; a :class:`PipelineRunner` executes the lesson simulator's 1F1B or interleaved order
  on the PP group. With SP a stage boundary carries the rank's ``s/t`` sequence shard, so each
  TP rank talks to the same TP rank of the next stage and every message is 1/t of the
  activation (Megatron's scatter/gather optimisation, Narayanan et al. 2021, Sec. 4.1).
* **DP** (lessons 1 and 6, :mod:`distai.engine.bucketing`): each chunk is wrapped in a
  :class:`BucketedDataParallel` whose bucket all-reduces stay off (``no_sync``) until the last
  microbatch's backward of that chunk, where they overlap with the rest of it (what Megatron and
  DDP do under gradient accumulation). With ``zero=1``, lesson 2's :class:`ZeroEngine` (stage 1)
  reduce-scatters the gradients and shards the optimizer state over the DP group instead.

The LM head is not tied to the embedding (Megatron's ``--untie-embeddings-and-output-weights``,
the Llama layout): with tied weights the first and last pipeline stages would need one more
gradient all-reduce of their own. The course's :class:`~distai.engine.model.GPT` with
``tie_embeddings=False`` is the same model on one process, the reference every 3D run must
reproduce step by step.

:func:`expected_comm` gives, from the configuration alone, the collectives and bytes each of the
three groups carries per step on a rank (lessons 1, 2, 4, 5 and 6's formulas, cited there);
:class:`MeshCommMeter` (the course's :class:`~distai.engine.metering.CommMeter`, which intercepts
every c10d call) attributes what was measured to the process group it ran on.
"""
from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..lessons.capstone.formulas import pp_p2p_bytes_per_microbatch
from ..lessons.lesson1.formulas import allreduce_bytes_per_rank
from ..lessons.lesson4.formulas import tp_comm_per_layer, vocab_parallel_ce_bytes_per_rank
from ..lessons.lesson5 import simulator as sim
from ..lessons.lesson6.formulas import ddp_buckets
from . import pipeline as pl
from .bucketing import BucketedDataParallel, bucket_limits
from .mesh_args import DIMS, MeshConfigError, MeshShape, check_plan
from .metering import CommMeter
from .model import GPT, GPTConfig, make_batch
from .tensor_parallel import TPGroup, apply_tp, shard_dense_state, sync_tp_grads, vocab_parallel_loss
from .zero import ZeroEngine

# ---------------------------------------------------------------------------------------------
# The mesh

@dataclass
class Mesh3D:
    """The device mesh, its three process groups and this rank's coordinates in it."""

    shape: MeshShape
    mesh: object  # torch.distributed.device_mesh.DeviceMesh
    groups: dict[str, dist.ProcessGroup]
    coords: dict[str, int]

    @property
    def pp_rank(self) -> int:
        return self.coords["pp"]

    @property
    def dp_rank(self) -> int:
        return self.coords["dp"]

    @property
    def tp_rank(self) -> int:
        return self.coords["tp"]


def build_mesh(shape: MeshShape, device_type: str = "cpu") -> Mesh3D:
    """``init_device_mesh(device_type, (pp, dp, tp))`` and its groups (a collective call: every
    rank of the world must make it, with the same shape)."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, shape.dims, mesh_dim_names=DIMS)
    coordinate = mesh.get_coordinate()
    assert coordinate is not None  # every rank of the world is in the mesh
    coords = dict(zip(DIMS, coordinate))
    return Mesh3D(shape, mesh, {d: mesh.get_group(d) for d in DIMS}, coords)


# ---------------------------------------------------------------------------------------------
# The model: the course's GPT with an untied LM head, cut into stages (pipeline.split_stages),
# each split over TP (tensor_parallel.apply_tp)

def stage_layers(cfg: GPTConfig, n_stages: int, stage: int) -> range:
    per = cfg.layers // n_stages
    return range(stage * per, (stage + 1) * per)


# ---------------------------------------------------------------------------------------------
# Training

@dataclass
class StepOutcome:
    loss: float | None  # this DP shard's loss, on the last pipeline stage's ranks
    pipeline: pl.StepResult
    t_start: float
    t_end: float


class MeshTrainer:
    """One rank of a 3D-parallel training run (SGD with momentum: its one state tensor per
    parameter is what ZeRO-1 shards).

    ``step(ids, targets)`` takes this DP rank's share of the batch, ``[s, m·b]`` (any rank may
    pass it; only the first and last stages use it), runs the pipeline schedule over the m
    microbatches, syncs the gradients over DP and the sequence-parallel ones over TP, and
    updates the weights.
    """

    def __init__(self, dense: GPT, mesh: Mesh3D, *, microbatches: int, microbatch_size: int,
                 schedule: str = "1f1b", chunks: int = 1, zero: int = 0, lr: float = 0.1,
                 momentum: float = 0.9, bucket_cap_mb: float | None = None, device="cpu", events=None):
        shape = mesh.shape
        if zero not in (0, 1):
            raise MeshConfigError(f"--zero must be 0 or 1 (ZeRO-1 shards the optimizer state), got {zero}")
        v = chunks if sim.normalize_schedule(schedule) == "interleaved" else 1
        cfg = dense.cfg
        if cfg.tie_embeddings or not cfg.gpt2_shape:
            raise MeshConfigError("the 3D run splits the untied GPT-2 shape (GPTConfig(..., tie_embeddings=False))")
        self.schedule = check_plan(shape, shape.world, cfg, microbatches=microbatches, schedule=schedule, chunks=v)
        self.mesh, self.cfg, self.m, self.v, self.mb = mesh, dense.cfg, microbatches, v, microbatch_size
        self.zero_stage = zero
        self.tp = TPGroup(mesh.groups["tp"], sequence_parallel=True)
        p, r = shape.pp, mesh.pp_rank
        n_stages = p * v
        stages = pl.split_stages(copy.deepcopy(dense), n_stages)  # the reference stays dense
        self.chunks: dict[int, pl.StageModule] = {}
        for c in range(v):
            s = c * p + r
            apply_tp(stages[s], self.tp)
            self.chunks[s] = stages[s].to(device)
        self.first, self.last = 0 in self.chunks, n_stages - 1 in self.chunks
        self.vocab_start = self.tp.rank * (dense.cfg.vocab // self.tp.size)
        params = [q for s in sorted(self.chunks) for q in self.chunks[s].parameters()]

        def make_sgd(ps):
            return torch.optim.SGD(ps, lr=lr, momentum=momentum)

        self.ddp: dict[int, BucketedDataParallel] = {}
        self.zero: ZeroEngine | None = None
        self.bucket_cap_mb = bucket_cap_mb
        if zero:
            units = [u for s in sorted(self.chunks) for u in self.chunks[s].units()]
            self.zero = ZeroEngine(units, 1, make_sgd, group=mesh.groups["dp"])
            self.optimizer = self.zero.optimizer
        else:
            if shape.dp > 1:
                self.ddp = {s: BucketedDataParallel(mod, bucket_cap_mb, process_group=mesh.groups["dp"],
                                                    rebuild_buckets=False)
                            for s, mod in self.chunks.items()}
            self.optimizer = make_sgd(params)
        self.runner = pl.PipelineRunner(self.chunks, rank=r, p=p, m=microbatches, schedule=self.schedule, v=v,
                                        microbatch_size=microbatch_size, device=device, loss=self._loss,
                                        group=mesh.groups["pp"], events=events,
                                        before_backward=self._before_backward)
        self.runner.validate()

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_loss(logits, targets, self.tp, self.vocab_start)

    def _before_backward(self, op: sim.Op) -> None:
        # Gradients accumulate over the microbatches; only the last backward of a chunk syncs
        # them over DP, overlapped with the rest of that backward.
        sync = op.mb == self.m - 1
        if self.zero is not None:
            self.zero.require_backward_grad_sync = sync
        elif op.stage in self.ddp:
            self.ddp[op.stage].require_backward_grad_sync = sync

    def microbatches(self, t: torch.Tensor) -> list[torch.Tensor]:
        if t.shape[0] != self.m * self.mb:
            raise MeshConfigError(f"a DP rank's batch has {t.shape[0]} sequences, expected m·b = "
                                  f"{self.m}·{self.mb}")
        return [x.contiguous() for x in t.tensor_split(self.m, dim=0)]

    def step(self, ids: torch.Tensor, targets: torch.Tensor) -> StepOutcome:
        if self.zero is None:
            self.optimizer.zero_grad(set_to_none=True)
        res = self.runner.step(self.microbatches(ids) if self.first else None,
                               self.microbatches(targets) if self.last else None)
        if self.zero is not None:
            self.zero.wait_gradients()
        for s in sorted(self.chunks):
            sync_tp_grads(self.chunks[s], self.tp)
        if self.zero is not None:
            self.zero.step()
            self.zero.synchronize()
        else:
            self.optimizer.step()
        t_end = self.runner._now()
        return StepOutcome(res.loss, res, res.t_start, t_end)

    def global_loss(self, outcome: StepOutcome, dtype=torch.float64) -> float:
        """The whole batch's loss, on every rank (one small all-reduce over the world)."""
        counts = self.last and self.tp.rank == 0 and outcome.loss is not None
        mine = outcome.loss / self.mesh.shape.dp if counts and outcome.loss is not None else 0.0
        t = torch.tensor([mine], dtype=dtype, device=self.runner.device)
        dist.all_reduce(t)
        return float(t)

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under the dense model's names."""
        out: dict[str, torch.Tensor] = {}
        for s in sorted(self.chunks):  # ModuleDict keys are the global layer indices
            out.update(self.chunks[s].named_parameters())
        return out


def global_batch(cfg: GPTConfig, shape: MeshShape, microbatches: int, microbatch_size: int,
                 step: int, seed: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch ``[dp·m·b, s]`` (identical on every rank and for the dense run)."""
    return make_batch(cfg, shape.dp * microbatches * microbatch_size, seed=seed, step=step, device=device)


def dp_share(t: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    """DP rank ``dp_rank``'s rows of a ``[B, s]`` batch."""
    return t.tensor_split(dp, dim=0)[dp_rank].contiguous()


def dense_step(dense: GPT, optimizer: torch.optim.Optimizer, ids: torch.Tensor,
               targets: torch.Tensor) -> float:
    """One step of the single-process reference on the whole batch."""
    optimizer.zero_grad(set_to_none=True)
    loss = dense(ids, targets)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def max_relative_diff(trainer: MeshTrainer, dense: GPT) -> float:
    """Largest ``max|ours − dense| / max|dense|`` over this rank's parameters."""
    want = shard_dense_state({n: p.detach() for n, p in dense.named_parameters()}, trainer.tp.rank, trainer.tp.size)
    worst = 0.0
    for name, p in trainer.named_parameters().items():
        ref = want[name].to(p.device)
        scale = float(ref.abs().max()) or 1.0
        worst = max(worst, float((p.detach() - ref).abs().max()) / scale)
    return worst


# ---------------------------------------------------------------------------------------------
# The communication account: measured per group, and from the formulas

def _new_tally() -> dict:
    return defaultdict(lambda: {"calls": 0, "bytes": 0.0})


class MeshCommMeter(CommMeter):
    """The course's :class:`~distai.engine.metering.CommMeter`, its records attributed to the mesh
    dimension whose process group each ran on: ``account()[dim]["ops"][op] = {"calls", "bytes"}``.
    Bytes are what one rank sends with ring algorithms (:attr:`CommRecord.wire_bytes`: the account
    is of the algorithm, not of gloo's shortcut of running a reduce-scatter as an all-reduce);
    receives count as calls with 0 bytes. Calls on other groups go to ``"other"``; barriers are not
    communication of the model and are not counted."""

    def __init__(self, groups: dict[str, dist.ProcessGroup]):
        super().__init__()
        self.dims: dict[str, str] = {str(g.group_name): name for name, g in groups.items()}

    def account(self) -> dict[str, dict]:
        """``{dim: {"ops": {op: {"calls", "bytes"}}, "calls", "bytes"}}`` for pp, dp, tp."""
        tally: dict[str, dict] = defaultdict(_new_tally)
        for r in self.records:
            cell = tally[self.dims.get(r.group, "other")][r.op]
            cell["calls"] += 1
            cell["bytes"] += r.wire_bytes
        return _account(tally)


def _account(tally: dict) -> dict:
    """Per group (pp, dp, tp): each op's calls and bytes, and their totals: the one shape in which the
    measured and the expected accounts are compared."""
    out = {}
    for dim in DIMS:
        ops = {op: dict(cell) for op, cell in sorted(tally.get(dim, {}).items())}
        out[dim] = {"ops": ops, "calls": sum(c["calls"] for c in ops.values()),
                    "bytes": sum(c["bytes"] for c in ops.values())}
    return out


def stage_parameter_sizes(cfg: GPTConfig, tp: int, layers: range, first: bool, last: bool) -> list[int]:
    """Elements of each parameter tensor of a stage split over ``tp`` ranks, in ``named_parameters``
    order, from the configuration alone (the model's registration order; Megatron's TP layout:
    column-parallel W_q, W_k, W_v, fc1 and their biases split by t, row-parallel W_o / fc2 split by t
    with whole biases, layer norms whole, embedding and head split over the vocabulary)."""
    h, f, V = cfg.hidden, cfg.ffn_size, cfg.vocab
    sizes = [V // tp * h] if first else []
    for _ in layers:
        sizes += block_param_sizes(h, f, tp)
    if last:
        sizes += [h, h, V // tp * h]     # final norm, head
    return sizes


def block_param_sizes(h: int, f: int, tp: int) -> list[int]:
    """One GPT-2-shape block's parameter sizes on a TP rank, in registration order."""
    return [h, h, h, h,                  # ln1, ln2 weight and bias
            h * h // tp, h // tp,        # wq (column-parallel) and its bias
            h * h // tp, h,              # wo (row-parallel), its bias whole
            h * h // tp,                 # wk (keys unbiased)
            h * h // tp, h // tp,        # wv and its bias
            f * h // tp, f // tp,        # fc1 (column-parallel)
            h * f // tp, h]              # fc2 (row-parallel)


def _ring(op: str, payload_bytes: float, n: int) -> float:
    """Bytes one rank sends in a ring collective over ``payload_bytes`` (Thakur et al. 2005, as in
    lesson 1: all-reduce 2(n−1)/n·S; all-gather, reduce-scatter, all-to-all (n−1)/n·S)."""
    if op == "all_reduce":
        return allreduce_bytes_per_rank(payload_bytes, n)
    return (n - 1) / n * payload_bytes if n > 1 else 0.0


def expected_comm(cfg: GPTConfig, shape: MeshShape, pp_rank: int, *, microbatches: int, microbatch_size: int,
                  schedule: str = "1f1b", chunks: int = 1, zero: int = 0, bucket_cap_mb: float | None = None,
                  elem_size: int = 4, backend: str = "gloo") -> dict[str, dict]:
    """Per step, what rank ``pp_rank`` of the pipeline sends on each group, from the formulas.

    * **tp** (lesson 4, Korthikanti et al. 2022 Sec. 4.2.2): per layer and microbatch,
      ``tp_comm_per_layer`` with SP — 2 all-gathers and 2 reduce-scatters of ``s·b·h`` forward
      and backward — plus Megatron's re-gather of the two column-parallel inputs in backward
      (2 all-gathers); the embedding's g (a reduce-scatter forward, an all-gather backward), the
      head's f (an all-gather forward, a re-gather and a reduce-scatter backward) and the
      vocabulary-parallel loss's 3 all-reduces of ``s·b`` (``vocab_parallel_ce_bytes_per_rank``);
      once per step, one all-reduce per layer of the sequence-parallel gradients (2 layer norms
      and 2 row biases, 6h numbers; the final layer norm, 2h).
    * **dp** (lessons 1 and 6): one ring all-reduce per DDP bucket (``ddp_buckets`` over the
      chunk's parameter sizes in reverse order), ``2(d−1)/d`` of every gradient byte; with ZeRO-1
      (lesson 2, Rajbhandari et al. 2020 Sec. 7.1: the same volume as DP), per unit a
      reduce-scatter of the padded flat gradient (an all-to-all on gloo) and an all-gather of
      the updated parameters, ``(d−1)/d`` of it each.
    * **pp** (lesson 5): the messages of the simulator's plan for this rank (one activation
      forward and one gradient backward per microbatch and stage boundary), each ``s/t·b·h``
      elements (the capstone's ``pp_p2p_bytes_per_microbatch``: Narayanan et al. 2021, Sec. 4.1).

    Returns ``{dim: {"ops": {op: {"calls", "bytes"}}, "calls", "bytes"}}`` like
    :meth:`MeshCommMeter.account`.
    """
    p, d, t = shape.dims
    v = chunks if sim.normalize_schedule(schedule) == "interleaved" else 1
    n_stages = p * v
    m, b, s, h, e = microbatches, microbatch_size, cfg.seq, cfg.hidden, elem_size
    held = [c * p + pp_rank for c in range(v)]
    tally: dict[str, dict] = defaultdict(_new_tally)

    def add(dim: str, op: str, calls: int, sent: float) -> None:
        if calls:
            tally[dim][op]["calls"] += calls
            tally[dim][op]["bytes"] += sent

    x = s * b * h * e  # one microbatch's activation, bytes
    if t > 1:
        layers = sum(len(stage_layers(cfg, n_stages, st)) for st in held)
        per_layer = tp_comm_per_layer(h, s, b, t, sequence_parallel=True, bytes_per_elem=e)
        for direction in ("forward", "backward"):
            for op, n in per_layer[direction].items():
                add("tp", op, m * layers * n, m * layers * n * _ring(op, x, t))
        add("tp", "all_gather", m * layers * 2, m * layers * 2 * _ring("all_gather", x, t))  # re-gathers
        if 0 in held:
            add("tp", "reduce_scatter", m, m * _ring("reduce_scatter", x, t))
            add("tp", "all_gather", m, m * _ring("all_gather", x, t))
        if n_stages - 1 in held:
            add("tp", "all_gather", 2 * m, 2 * m * _ring("all_gather", x, t))
            add("tp", "reduce_scatter", m, m * _ring("reduce_scatter", x, t))
            add("tp", "all_reduce", 3 * m, m * vocab_parallel_ce_bytes_per_rank(s, b, t, e))
            add("tp", "all_reduce", 1, _ring("all_reduce", 2 * h * e, t))
        add("tp", "all_reduce", layers, layers * _ring("all_reduce", 6 * h * e, t))
    if d > 1:
        for st in held:
            sizes = stage_parameter_sizes(cfg, t, stage_layers(cfg, n_stages, st), st == 0, st == n_stages - 1)
            if zero:
                units = _zero_units(sizes, st == 0, st == n_stages - 1)
                for numel in units:
                    padded = math.ceil(numel / d) * d * e
                    add("dp", "all_to_all" if backend == "gloo" else "reduce_scatter", 1, _ring("reduce_scatter", padded, d))
                    add("dp", "all_gather", 1, _ring("all_gather", padded, d))
            else:
                limits = bucket_limits(bucket_cap_mb)
                rev = [n * e for n in reversed(sizes)]
                for bucket in ddp_buckets(rev, bucket_cap_bytes=limits[-1], first_bucket_bytes=limits[0]):
                    add("dp", "all_reduce", 1, _ring("all_reduce", sum(rev[i] for i in bucket), d))
    if p > 1:
        message = pp_p2p_bytes_per_microbatch(s, b, h, t, e)
        plan = sim.comm_plan(sim.simulate(sim.normalize_schedule(schedule), p, m, v))[pp_rank]
        sends = sum(1 for a in plan if a.kind == "send")
        add("pp", "send", sends, sends * float(message))
        add("pp", "recv", sum(1 for a in plan if a.kind == "recv"), 0.0)
    return _account(tally)


def _zero_units(sizes: list[int], first: bool, last: bool) -> list[int]:
    """Elements per ZeRO unit of a stage (embedding, each block, head with its final norm)."""
    per_block = len(block_param_sizes(1, 1, 1))
    units, i = [], 0
    if first:
        units.append(sizes[0])
        i = 1
    body_end = len(sizes) - (3 if last else 0)
    while i < body_end:
        units.append(sum(sizes[i:i + per_block]))
        i += per_block
    if last:
        units.append(sum(sizes[-3:]))
    return units


def compare_accounts(measured: dict, expected: dict, rel: float = 1e-9) -> dict[str, bool]:
    """Per dimension: the same calls per op and the same bytes (to rounding)."""
    ok = {}
    for dim in DIMS:
        a, b = measured[dim], expected[dim]
        same_calls = {op: c["calls"] for op, c in a["ops"].items()} == {op: c["calls"] for op, c in b["ops"].items()}
        same_bytes = abs(a["bytes"] - b["bytes"]) <= rel * max(1.0, b["bytes"])
        ok[dim] = same_calls and same_bytes
    return ok

