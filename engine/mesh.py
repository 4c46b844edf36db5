"""The capstone's mesh: pipeline × data × context × tensor parallelism, experts inside data × context.

The ranks form a ``torch.distributed.device_mesh.DeviceMesh`` of shape ``(pp, dp, cp, tp)`` with
tensor parallelism innermost (consecutive ranks, i.e. one node), then context, data and pipeline:
the order of Megatron-LM and torchtitan (Narayanan et al., SC 2021, Sec. 3: keep TP inside a node).
Gradients are reduced over the dp·cp ranks of a (pp, tp) coordinate (torchtitan's ``dp_shard_cp``;
Megatron's data-parallel group with context parallelism), and expert parallelism borrows its ranks
from them (torchtitan's ``ParallelDims``: EP inside dp_shard × cp; Megatron-Core's expert-data-
parallel group is the rest). Nothing here re-implements a parallelism; it composes the lessons'
own engine on the one model (:func:`build_mesh`, :class:`MeshTrainer`):

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
* **CP** (the context lesson, :func:`~distai.engine.context_parallel.apply_cp`): ring attention
  as every block's ``attn.core``, each CP rank holding the zigzag shard of every sequence
  (``s/cp`` tokens; with SP each TP rank ``s/(cp·t)`` of them between the blocks).
* **EP** (the experts lesson, :func:`~distai.engine.moe.apply_ep`): with ``--moe`` the blocks'
  MLPs are routed experts (dropless), ``E/ep`` per rank, tokens dispatched and combined by
  all-to-alls over the EP group; under TP+SP the experts stay whole and see the rank's sequence
  shard (their gradients then summed over TP, as the layer norms'): Megatron-Core's expert-tensor-
  parallel size 1, where torchtitan's default (etp = tp) would split each expert over TP instead.
  torchtitan also asks ``ep`` to be a multiple of ``cp`` (EP = dp_shard_in_ep × cp); here any ``ep``
  dividing dp·cp is laid out the same way, consecutive in (dp, cp) order.
* **DP** (lessons 1 and 6, :mod:`distai.engine.bucketing`): each chunk is wrapped in a
  :class:`BucketedDataParallel` whose bucket all-reduces stay off (``no_sync``) until the last
  microbatch's backward of that chunk, where they overlap with the rest of it (what Megatron and
  DDP do under gradient accumulation). With ``zero=1``, lesson 2's :class:`ZeroEngine` (stage 1)
  reduce-scatters the gradients and shards the optimizer state over the DP group instead.

The LM head is not tied to the embedding (Megatron's ``--untie-embeddings-and-output-weights``,
the Llama layout): with tied weights the first and last pipeline stages would need one more
gradient all-reduce of their own. The course's :class:`~distai.engine.model.GPT` with
``tie_embeddings=False`` is the same model on one process, the reference every mesh run must
reproduce step by step.

:func:`expected_comm` gives, from the configuration alone, the collectives and bytes each of the
groups carries per step on a rank (lessons 1, 2, 4, 5, 6, context and experts formulas, cited there);
:class:`MeshCommMeter` (the course's :class:`~distai.engine.metering.CommMeter`, which intercepts
every c10d call) attributes what was measured to the process group it ran on.
"""
from __future__ import annotations

import copy
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import cast

import torch
import torch.distributed as dist
import torch.nn as nn

from ..lessons.capstone.formulas import DIMS, pp_p2p_bytes_per_microbatch
from ..lessons.context.formulas import cp_comm_per_layer
from ..lessons.experts.formulas import (
    COUNT_BYTES,
    all_to_all_calls_per_layer,
    count_all_to_all_bytes,
    expert_params,
    token_all_to_all_bytes,
)
from ..lessons.lesson1.formulas import allreduce_bytes_per_rank
from ..lessons.lesson4.formulas import tp_comm_per_layer, vocab_parallel_ce_bytes_per_rank
from ..lessons.lesson5 import simulator as sim
from ..lessons.lesson6.formulas import ddp_buckets
from . import pipeline as pl
from .bucketing import BucketedDataParallel, bucket_limits
from .context_parallel import CPGroup, apply_cp, shard_sequence
from .mesh_args import MESH_DIMS, MeshConfigError, MeshShape, check_plan
from .metering import CommMeter
from .model import GPT, GPTConfig, make_batch
from .moe import MoEConfig, MoELayer, apply_ep, moe_layers, sync_moe_grads
from .tensor_parallel import TPGroup, apply_tp, shard_dense_state, sync_tp_grads, vocab_parallel_loss
from .zero import ZeroEngine

# ---------------------------------------------------------------------------------------------
# The mesh

@dataclass
class Mesh:
    """The device mesh, the process groups of the run and this rank's coordinates in it: ``pp``,
    ``dp`` (the gradient group: dp·cp ranks), ``tp``; ``cp`` when > 1; with experts ``ep``,
    ``edp`` (the ranks holding the same experts) and ``moe`` (every rank of a pipeline stage)."""

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

    @property
    def cp_rank(self) -> int:
        return self.coords.get("cp", 0)

    @property
    def ep_rank(self) -> int:
        return self.coords.get("ep", 0)


#: the 3D run's mesh is the five-dimensional one with cp = ep = 1
Mesh3D = Mesh


def build_mesh(shape: MeshShape, device_type: str = "cpu") -> Mesh:
    """``init_device_mesh(device_type, (pp, dp, cp, tp))`` and its groups (a collective call: every
    rank of the world must make it, with the same shape).

    As torchtitan's ``ParallelDims`` (``dp_shard_cp``): the gradients are reduced over the dp·cp
    ranks (one flattened group), and expert parallelism borrows its ranks from them: the dp·cp
    ranks of a (pp, tp) coordinate, in (dp, cp) order, form ``dp·cp/ep`` EP groups of ``ep``
    consecutive ones (the inner factor, CP's ranks first in it, then DP's), and the ranks at the
    same place in each (``edp``) hold the same experts."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    mesh = init_device_mesh(device_type, shape.mesh_dims, mesh_dim_names=MESH_DIMS)
    coordinate = mesh.get_coordinate()
    assert coordinate is not None  # every rank of the world is in the mesh
    at = dict(zip(MESH_DIMS, coordinate))
    coords = {d: at[d] for d in DIMS}
    groups = {"pp": mesh.get_group("pp"), "dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")}
    wanted = shape.groups(every=True)  # the lesson's Layout says which groups a run builds
    if "cp" in wanted:
        groups["dp"] = mesh["dp", "cp"]._flatten().get_group()  # type: ignore[index]  # torch's stubs
        groups["cp"], coords["cp"] = mesh.get_group("cp"), at["cp"]
    if "ep" in wanted:
        layout = mesh.mesh.reshape(shape.pp, shape.replicas // shape.ep, shape.ep, shape.tp)
        experts = DeviceMesh(device_type, layout, mesh_dim_names=("pp", "edp", "ep", "tp"))
        mine = experts.get_coordinate()
        assert mine is not None
        groups["ep"], groups["edp"] = experts.get_group("ep"), experts.get_group("edp")
        coords["ep"], coords["edp"] = mine[2], mine[1]
        groups["moe"] = mesh["dp", "cp", "tp"]._flatten().get_group()  # type: ignore[index]
    assert set(groups) == set(wanted)  # every group the Layout names, no other
    return Mesh(shape, mesh, groups, coords)


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
    """One rank of a run on the mesh (SGD with momentum: its one state tensor per parameter is
    what ZeRO-1 shards).

    ``dense`` is the one model (``GPT(cfg, seed)``, with its MLPs made experts by
    :func:`~distai.engine.moe.make_moe` for an MoE mesh); each pipeline stage of a copy of it gets
    the plans in turn: ``split_stages`` → ``apply_tp`` (with SP) → ``apply_cp`` (ring attention, the
    zigzag layout) → ``apply_ep`` → data parallelism (bucketed all-reduce or ZeRO-1) over the dp·cp
    ranks. With experts the gradients are synced by :func:`~distai.engine.moe.sync_moe_grads`: the
    replicated ones averaged over dp·cp, the experts' summed over ``edp`` and divided by dp·cp.

    ``step(ids, targets)`` takes this DP rank's share of the batch, ``[m·b, s]`` (any rank may
    pass it; only the first and last stages use it, each CP rank its zigzag shard of the
    sequence), runs the pipeline schedule over the m microbatches, syncs the gradients over DP
    and the sequence-parallel ones over TP, and updates the weights.
    """

    def __init__(self, dense: GPT, mesh: Mesh, *, microbatches: int, microbatch_size: int,
                 schedule: str = "1f1b", chunks: int = 1, zero: int = 0, lr: float = 0.1,
                 momentum: float = 0.9, bucket_cap_mb: float | None = None, device="cpu", events=None):
        shape = mesh.shape
        v = chunks if sim.normalize_schedule(schedule) == "interleaved" else 1
        self.moe = _moe_config(dense)
        _check_trainer(dense.cfg, shape, zero, self.moe)
        self.schedule = check_plan(shape, shape.world, dense.cfg, microbatches=microbatches, schedule=schedule,
                                   chunks=v, experts=self.moe.experts if self.moe else None)
        self.mesh, self.cfg, self.m, self.v, self.mb = mesh, dense.cfg, microbatches, v, microbatch_size
        self.zero_stage = zero
        self.tp = TPGroup(mesh.groups["tp"], sequence_parallel=True)
        self.cp = CPGroup(mesh.groups["cp"], layout="zigzag") if shape.cp > 1 else None
        p, r = shape.pp, mesh.pp_rank
        n_stages = p * v
        stages = pl.split_stages(copy.deepcopy(dense), n_stages)  # the reference stays dense
        self.chunks: dict[int, pl.StageModule] = {s: self._parallelize(stages[s]).to(device)
                                                  for s in (c * p + r for c in range(v))}
        self.first, self.last = 0 in self.chunks, n_stages - 1 in self.chunks
        self.vocab_start = self.tp.rank * (dense.cfg.vocab // self.tp.size)
        self.routed_rows: list[tuple[int, int]] = []  # per MoE forward: rows sent to / received from other EP ranks
        for layer in (x for s in sorted(self.chunks) for x in moe_layers(self.chunks[s])):
            layer.register_forward_hook(self._count_rows)
        self._data_parallel(lr, momentum, bucket_cap_mb)
        self.runner = pl.PipelineRunner(self.chunks, rank=r, p=p, m=microbatches, schedule=self.schedule, v=v,
                                        microbatch_size=microbatch_size, device=device, loss=self._loss,
                                        group=mesh.groups["pp"], events=events,
                                        before_backward=self._before_backward)
        self.runner.validate()

    def _parallelize(self, stage: pl.StageModule) -> pl.StageModule:
        """The plans, in torchtitan's order, on one pipeline stage (in place)."""
        groups = self.mesh.groups
        if self.cp is not None:  # the stage runs on this rank's s/cp tokens
            stage.cfg = replace(stage.cfg, seq=stage.cfg.seq // self.cp.size)
        apply_tp(stage, self.tp)
        if self.cp is not None:
            apply_cp(stage, self.cp)
        if self.moe is not None:
            shape = self.mesh.shape
            apply_ep(stage, groups["ep"], groups["edp"] if shape.replicas > shape.ep else None, groups["moe"])
        return stage

    def _data_parallel(self, lr: float, momentum: float, bucket_cap_mb: float | None) -> None:
        """ZeRO-1, bucketed DP or (with experts) a sync after the step, over the dp·cp ranks."""
        params = [q for s in sorted(self.chunks) for q in self.chunks[s].parameters()]

        def make_sgd(ps):
            return torch.optim.SGD(ps, lr=lr, momentum=momentum)

        self.ddp: dict[int, BucketedDataParallel] = {}
        self.zero: ZeroEngine | None = None
        self.bucket_cap_mb = bucket_cap_mb
        group = self.mesh.groups["dp"]
        if self.zero_stage:
            units = [u for s in sorted(self.chunks) for u in self.chunks[s].units()]
            self.zero = ZeroEngine(units, 1, make_sgd, group=group)
            self.optimizer = self.zero.optimizer
            return
        if self.mesh.shape.replicas > 1 and self.moe is None:
            self.ddp = {s: BucketedDataParallel(mod, bucket_cap_mb, process_group=group, rebuild_buckets=False)
                        for s, mod in self.chunks.items()}
        self.optimizer = make_sgd(params)

    def _count_rows(self, layer: nn.Module, _inputs: object, _out: object) -> None:
        stats, me = cast(MoELayer, layer).stats, cast(MoELayer, layer).ep_rank
        self.routed_rows.append((sum(n for q, n in enumerate(stats.sent_rows) if q != me),
                                 sum(n for q, n in enumerate(stats.received_rows) if q != me)))

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
        if self.cp is not None:
            t = shard_sequence(t, self.cp)
        return [x.contiguous() for x in t.tensor_split(self.m, dim=0)]

    def step(self, ids: torch.Tensor, targets: torch.Tensor) -> StepOutcome:
        if self.zero is None:
            self.optimizer.zero_grad(set_to_none=True)
        self.routed_rows = []
        res = self.runner.step(self.microbatches(ids) if self.first else None,
                               self.microbatches(targets) if self.last else None)
        if self.zero is not None:
            self.zero.wait_gradients()
        for s in sorted(self.chunks):
            sync_tp_grads(self.chunks[s], self.tp)
            if self.moe is not None and self.mesh.shape.replicas > 1:
                sync_moe_grads(self.chunks[s], self.mesh.groups["dp"])
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
        share = self.mesh.shape.replicas  # each of the dp·cp ranks holds the mean of an equal share
        mine = outcome.loss / share if counts and outcome.loss is not None else 0.0
        t = torch.tensor([mine], dtype=dtype, device=self.runner.device)
        dist.all_reduce(t)
        return float(t)

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """This rank's parameters under the dense model's names (an expert under its index among
        all ``E``, not among this rank's ``E/ep``)."""
        out: dict[str, torch.Tensor] = {}
        first = self.mesh.ep_rank * (self.moe.experts // self.mesh.shape.ep) if self.moe else 0
        for s in sorted(self.chunks):  # ModuleDict keys are the global layer indices
            for name, q in self.chunks[s].named_parameters():
                head, sep, rest = name.partition(".mlp.experts.")
                if sep:
                    j, _, tail = rest.partition(".")
                    name = f"{head}{sep}{int(j) + first}.{tail}"
                out[name] = q
        return out


def _moe_config(model: GPT) -> MoEConfig | None:
    """The experts' configuration of a model whose blocks are MoE layers (None: dense MLPs)."""
    layers = moe_layers(model)
    return layers[0].moe if layers else None


def _check_trainer(cfg: GPTConfig, shape: MeshShape, zero: int, moe: MoEConfig | None) -> None:
    if zero not in (0, 1):
        raise MeshConfigError(f"--zero must be 0 or 1 (ZeRO-1 shards the optimizer state), got {zero}")
    if cfg.tie_embeddings or not cfg.gpt2_shape:
        raise MeshConfigError("the mesh run splits the untied GPT-2 shape (GPTConfig(..., tie_embeddings=False))")
    if shape.moe != (moe is not None):
        raise MeshConfigError("an MoE mesh trains a model whose MLPs are experts (make_moe), and only it")
    if moe is not None and (zero or moe.capacity_factor is not None or moe.aux_alpha or moe.shared_experts):
        raise MeshConfigError("the mesh's experts are dropless, without ZeRO-1, shared experts or a balancing "
                              "loss (aux_alpha=0: under PP the last stage cannot add the others' terms)")


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
        """``{dim: {"ops": {op: {"calls", "bytes"}}, "calls", "bytes"}}`` for each of the mesh's groups."""
        tally: dict[str, dict] = defaultdict(_new_tally)
        for r in self.records:
            cell = tally[self.dims.get(r.group, "other")][r.op]
            cell["calls"] += 1
            cell["bytes"] += r.wire_bytes
        return _account(tally, tuple(self.dims.values()))


def _account(tally: dict, dims: tuple[str, ...] = DIMS) -> dict:
    """Per group (pp, dp, tp and those of a 5D mesh): each op's calls and bytes, and their totals:
    the one shape in which the measured and the expected accounts are compared."""
    out = {}
    for dim in dims:
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
                  elem_size: int = 4, backend: str = "gloo", moe: MoEConfig | None = None,
                  routed_rows: list[tuple[int, int]] | None = None) -> dict[str, dict]:
    """Per step, what rank ``pp_rank`` of the pipeline sends on each group, from the formulas.
    Every activation is this rank's ``s/cp`` tokens of ``b`` sequences (its CP shard).

    * **tp** (lesson 4, Korthikanti et al. 2022 Sec. 4.2.2): per layer and microbatch,
      ``tp_comm_per_layer`` with SP — 2 all-gathers and 2 reduce-scatters of ``s·b·h`` forward
      and backward — plus Megatron's re-gather of the two column-parallel inputs in backward
      (2 all-gathers); the embedding's g (a reduce-scatter forward, an all-gather backward), the
      head's f (an all-gather forward, a re-gather and a reduce-scatter backward) and the
      vocabulary-parallel loss's 3 all-reduces of ``s·b`` (``vocab_parallel_ce_bytes_per_rank``);
      once per step, one all-reduce per layer of the sequence-parallel gradients (2 layer norms
      and 2 row biases, 6h numbers; the final layer norm, 2h). With experts the MLP is not split:
      only the attention's half of the per-layer collectives, and its whole parameters (router,
      this rank's experts) join the sequence-parallel all-reduce.
    * **dp** over the dp·cp ranks (lessons 1 and 6): one ring all-reduce per DDP bucket
      (``ddp_buckets`` over the chunk's parameter sizes in reverse order), ``2(d−1)/d`` of every
      gradient byte; with ZeRO-1 (lesson 2, Rajbhandari et al. 2020 Sec. 7.1: the same volume as
      DP), per unit a reduce-scatter of the padded flat gradient (an all-to-all on gloo) and an
      all-gather of the updated parameters, ``(d−1)/d`` of it each. With experts one all-reduce of
      the chunk's replicated gradients, and (**edp**) one of its experts' over their replicas.
    * **pp** (lesson 5): the messages of the simulator's plan for this rank (one activation
      forward and one gradient backward per microbatch and stage boundary), each ``s/t·b·h``
      elements (the capstone's ``pp_p2p_bytes_per_microbatch``: Narayanan et al. 2021, Sec. 4.1).
    * **cp** (the context lesson, ``cp_comm_per_layer``): per layer and microbatch, ``cp − 1``
      K/V hops forward, ``cp − 1`` K/V and ``cp`` gradient hops backward, each this rank's K/V of
      its ``heads/t`` heads.
    * **ep** (the experts lesson): per MoE layer and microbatch ``all_to_all_calls_per_layer``
      all-to-alls, the counts' bytes (``count_all_to_all_bytes``) and the token rows this rank
      moved (``token_all_to_all_bytes`` of ``routed_rows``: per MoE forward, the rows sent to and
      received from the other EP ranks, which routing decides), forward and backward; **moe**: two
      all-reduces per layer and microbatch of the routing statistics (``2E + 1`` int64 counts and the
      balancing term) over the stage's ranks.

    Returns ``{dim: {"ops": {op: {"calls", "bytes"}}, "calls", "bytes"}}`` like
    :meth:`MeshCommMeter.account`.
    """
    v = chunks if sim.normalize_schedule(schedule) == "interleaved" else 1
    run = _Run(cfg, shape, pp_rank, microbatches, microbatch_size, v, elem_size, moe)
    tally: dict[str, dict] = defaultdict(_new_tally)

    def add(dim: str, op: str, calls: int, sent: float) -> None:
        if calls:
            tally[dim][op]["calls"] += calls
            tally[dim][op]["bytes"] += sent

    if shape.tp > 1:
        _tp_comm(add, run)
    if shape.replicas > 1:
        _dp_comm(add, run, zero, bucket_cap_mb, backend)
    if shape.pp > 1:
        message = pp_p2p_bytes_per_microbatch(run.s, run.b, cfg.hidden, shape.tp, elem_size)
        plan = sim.comm_plan(sim.simulate(sim.normalize_schedule(schedule), shape.pp, microbatches, v))[pp_rank]
        sends = sum(1 for a in plan if a.kind == "send")
        add("pp", "send", sends, sends * float(message))
        add("pp", "recv", sum(1 for a in plan if a.kind == "recv"), 0.0)
    if shape.cp > 1:
        ring = cp_comm_per_layer(cfg.seq, run.b, cfg.heads, cfg.hidden // cfg.heads, shape.cp, "ring", elem_size,
                                 tp=shape.tp)
        hops = run.m * run.layers * (ring["forward_messages"] + ring["backward_messages"])
        add("cp", "send", hops, run.m * run.layers * ring["total_bytes_per_rank"])
        add("cp", "recv", hops, 0.0)
    if moe is not None:
        _moe_comm(add, run, moe, routed_rows or [])
    return _account(tally, shape.groups(every=True))


@dataclass
class _Run:
    """What one rank of the pipeline holds and runs in a step (for :func:`expected_comm`)."""
    cfg: GPTConfig
    shape: MeshShape
    pp_rank: int
    m: int
    b: int
    v: int
    e: int  # bytes per element
    moe: MoEConfig | None

    @property
    def s(self) -> int:  # this rank's tokens of a sequence
        return self.cfg.seq // self.shape.cp

    @property
    def held(self) -> list[int]:
        return [c * self.shape.pp + self.pp_rank for c in range(self.v)]

    @property
    def n_stages(self) -> int:
        return self.shape.pp * self.v

    @property
    def layers(self) -> int:
        return sum(len(stage_layers(self.cfg, self.n_stages, st)) for st in self.held)

    def local_experts(self) -> int:
        return self.moe.experts // self.shape.ep if self.moe is not None else 0

    def expert_numel(self) -> int:
        """Parameters of one expert (a GeLU MLP with biases, the model's own)."""
        return expert_params(self.cfg.hidden, self.cfg.ffn_size, gated=False, bias=True)


def _tp_comm(add, run: _Run) -> None:
    t, m, h, e, moe = run.shape.tp, run.m, run.cfg.hidden, run.e, run.moe
    x = run.s * run.b * h * e  # one microbatch's activation, bytes
    layers, share = run.layers, 2 if moe is None else 1  # with experts only the attention is split
    per_layer = tp_comm_per_layer(h, run.s, run.b, t, sequence_parallel=True, bytes_per_elem=e)
    for direction in ("forward", "backward", "regather"):  # regather: Megatron's backward all-gathers again
        for op, n in per_layer[direction].items():
            k = m * layers * n * share // 2
            add("tp", op, k, k * _ring(op, x, t))
    if 0 in run.held:
        add("tp", "reduce_scatter", m, m * _ring("reduce_scatter", x, t))
        add("tp", "all_gather", m, m * _ring("all_gather", x, t))
    if run.n_stages - 1 in run.held:
        add("tp", "all_gather", 2 * m, 2 * m * _ring("all_gather", x, t))
        add("tp", "reduce_scatter", m, m * _ring("reduce_scatter", x, t))
        add("tp", "all_reduce", 3 * m, m * vocab_parallel_ce_bytes_per_rank(run.s, run.b, t, e))
        add("tp", "all_reduce", 1, _ring("all_reduce", 2 * h * e, t))
    # per layer: 2 norms, W_o's bias and fc2's (6h); or with experts 5h, the router and the experts
    whole = 6 * h if moe is None else 5 * h + h * moe.experts + run.local_experts() * run.expert_numel()
    add("tp", "all_reduce", layers, layers * _ring("all_reduce", whole * e, t))


def _dp_comm(add, run: _Run, zero: int, bucket_cap_mb: float | None, backend: str) -> None:
    d, t, e, cfg = run.shape.replicas, run.shape.tp, run.e, run.cfg
    for st in run.held:
        first, last = st == 0, st == run.n_stages - 1
        sizes = stage_parameter_sizes(cfg, t, stage_layers(cfg, run.n_stages, st), first, last)
        if run.moe is not None:
            blocks = len(stage_layers(cfg, run.n_stages, st))
            mlp = sum(block_param_sizes(cfg.hidden, cfg.ffn_size, t)[-4:])  # fc1, fc2: experts instead
            replicated = sum(sizes) - blocks * (mlp - cfg.hidden * run.moe.experts)  # … and a router
            add("dp", "all_reduce", 1, _ring("all_reduce", replicated * e, d))
            edp = d // run.shape.ep
            if edp > 1:
                experts = blocks * run.local_experts() * run.expert_numel()
                add("edp", "all_reduce", 1, _ring("all_reduce", experts * e, edp))
        elif zero:
            for numel in _zero_units(sizes, first, last):
                padded = math.ceil(numel / d) * d * e
                add("dp", "all_to_all" if backend == "gloo" else "reduce_scatter", 1, _ring("reduce_scatter", padded, d))
                add("dp", "all_gather", 1, _ring("all_gather", padded, d))
        else:
            limits = bucket_limits(bucket_cap_mb)
            rev = [n * e for n in reversed(sizes)]
            for bucket in ddp_buckets(rev, bucket_cap_bytes=limits[-1], first_bucket_bytes=limits[0]):
                add("dp", "all_reduce", 1, _ring("all_reduce", sum(rev[i] for i in bucket), d))


def _moe_comm(add, run: _Run, moe: MoEConfig, routed_rows: list[tuple[int, int]]) -> None:
    forwards = run.m * run.layers  # MoE layer forwards in a step
    ep, h, e = run.shape.ep, run.cfg.hidden, run.e
    if ep > 1:
        calls = all_to_all_calls_per_layer(dropless=True)
        counts = forwards * (calls["fwd"] - 2)
        tokens = 2 * sum(token_all_to_all_bytes(sent, got, h, e) for sent, got in routed_rows)  # fwd and bwd
        add("ep", "all_to_all", forwards * sum(calls.values()),
            counts * count_all_to_all_bytes(ep, moe.top_k, run.local_experts()) + tokens)
    stage = run.shape.replicas * run.shape.tp
    if stage > 1:
        stats = (2 * moe.experts + 1) * COUNT_BYTES
        add("moe", "all_reduce", 2 * forwards,
            forwards * (_ring("all_reduce", stats, stage) + _ring("all_reduce", e, stage)))


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
    """Per group of the expected account: the same calls per op and the same bytes (to rounding)."""
    ok = {}
    for dim in expected:
        a, b = measured[dim], expected[dim]
        same_calls = {op: c["calls"] for op, c in a["ops"].items()} == {op: c["calls"] for op, c in b["ops"].items()}
        same_bytes = abs(a["bytes"] - b["bytes"]) <= rel * max(1.0, b["bytes"])
        ok[dim] = same_calls and same_bytes
    return ok

