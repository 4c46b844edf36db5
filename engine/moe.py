"""Mixture of Experts on the course's GPT, and expert parallelism from scratch.

A :class:`MoELayer` replaces a :class:`~distai.engine.model.Block`'s MLP (:func:`make_moe`):

* **router** — ``softmax(x·W_r)`` over ``E`` experts; each token goes to its top ``k``
  (Switch Transformer, Fedus et al. 2021, ``k = 1``, the gate is the probability itself;
  GShard, Lepikhin et al. 2020, ``k = 2``, the ``k`` gates renormalised to sum to 1, as Mixtral
  does). Optionally DeepSeek-V3's auxiliary-loss-free balancing (Liu et al. 2024, §2.1.2): a
  per-expert bias added to the scores only to *choose* the experts (the gates stay the
  probabilities), nudged after each step by ``γ·sign(mean load − load_i)``
  (:meth:`MoELayer.update_balance_bias`). DeepSeek-V3 scores with a sigmoid; here it is the same
  softmax as the other routers, so one router serves all three.
* **capacity** — with a capacity factor ``c`` each expert takes at most
  ``C = ceil(c·T·k/E)`` of the ``T`` tokens of the EP group (GShard's "expert capacity"); first
  choices before second choices, then in token order (GShard's priority); the rest are dropped
  (the token keeps only its residual). ``capacity_factor=None`` is dropless (MegaBlocks, Gale et
  al. 2022).
* **load-balancing loss** — Switch's ``α·E·Σ_i f_i·P_i`` over the *global* batch: ``f_i`` the
  fraction of the ``T·k`` routing choices that picked expert ``i`` (counted before drops), ``P_i``
  the mean router probability of ``i``. ``f`` is summed over the data-parallel group; each rank
  then keeps the differentiable term ``α·E·Σ f_i·(its own mean of p_i)``, whose mean over ranks
  is the global loss, exactly as the ranks' mean language-model losses are the global one.
* **shared experts** — DeepSeekMoE's (Dai et al. 2024): MLPs every token goes through, beside
  the routed ones.

:func:`apply_ep` shards the experts of every MoE layer over an EP group: rank ``r`` of ``ep``
keeps experts ``[r·E/ep, (r+1)·E/ep)``. A forward then

1. sorts the routing choices by expert (then choice, then token),
2. exchanges the counts per (choice, expert) with ``all_to_all_single`` — and, with a capacity
   limit, each expert's owner answers with how many of them it keeps (a second small
   all-to-all), so a dropped token never travels,
3. sends the kept tokens with the autograd-aware functional ``all_to_all_single`` (uneven splits),
4. runs its local experts, and
5. sends the outputs back by the reverse all-to-all (combine), where each token sums its ``k``
   outputs weighted by its gates.

Backward runs both token all-to-alls in reverse. Gradients: the replicated parameters
(attention, norms, router, shared experts) are averaged over the data-parallel group; an
expert's gradient already holds every rank's tokens and is divided by the group's size
(:func:`sync_moe_grads`). With EP = 1 the same code runs without a collective: the
single-process MoE every EP layout is compared with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..lessons.model_size import check_degrees
from .metering import comm_scope
from .model import GPT, MLP, GPTConfig, ModelConfigError

__all__ = ["MoEConfig", "MoEConfigError", "MoELayer", "MoEStats", "make_moe", "apply_ep", "ep_groups",
           "moe_layers", "moe_aux_loss", "sync_moe_grads", "expert_param_bytes"]


class MoEConfigError(ModelConfigError):
    """A Mixture-of-Experts shape that cannot be built or sharded as asked (one line)."""


@dataclass(frozen=True)
class MoEConfig:
    experts: int = 8
    top_k: int = 2
    capacity_factor: float | None = None  # None: dropless
    aux_alpha: float = 0.01  # Switch's α
    shared_experts: int = 0
    expert_ffn: int | None = None  # each expert's MLP width; default the model's ffn
    bias_rate: float = 0.0  # DeepSeek-V3's γ (auxiliary-loss-free balancing); 0: off

    def __post_init__(self) -> None:
        if self.experts < 1:
            raise MoEConfigError(f"experts must be at least 1, got {self.experts}")
        if not 1 <= self.top_k <= self.experts:
            raise MoEConfigError(f"top-k must be between 1 and the number of experts ({self.experts}), "
                                 f"got {self.top_k}")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise MoEConfigError(f"the capacity factor must be positive, got {self.capacity_factor}")
        if self.shared_experts < 0:
            raise MoEConfigError(f"shared experts cannot be negative, got {self.shared_experts}")
        # a negative weight or rate would push the load apart instead of balancing it
        if not 0 <= self.aux_alpha < math.inf:
            raise MoEConfigError(f"the balancing loss weight (--aux-alpha) must be 0 or more, got {self.aux_alpha}")
        if not 0 <= self.bias_rate < math.inf:
            raise MoEConfigError(f"the bias step (--bias-balance) must be 0 or more, got {self.bias_rate}")

    def check_ep(self, ep: int) -> None:
        """Raise ShapeError (a ModelConfigError) unless the course's one shape check lets ``ep`` ranks
        hold whole experts."""
        check_degrees(ep=ep, experts=self.experts)

    def capacity(self, tokens: int) -> int | None:
        """Tokens one expert takes of ``tokens`` (the EP group's), or None when dropless."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)


@dataclass
class MoEStats:
    """One forward of one layer, over the whole data-parallel group (the same on every rank)."""

    routed: list[int] = field(default_factory=list)  # routing choices per expert (before drops)
    kept: list[int] = field(default_factory=list)  # … that an expert processed
    tokens: int = 0  # tokens of the group
    capacity: int | None = None  # per expert: its limit in each EP group times the groups (None: dropless)
    aux_loss: float = 0.0  # Switch's loss over the global batch
    sent_rows: list[int] = field(default_factory=list)  # this rank: token rows sent to each EP rank
    received_rows: list[int] = field(default_factory=list)  # … and received from each

    @property
    def dropped(self) -> int:
        return sum(self.routed) - sum(self.kept)

    @property
    def drop_rate(self) -> float:
        return self.dropped / max(1, sum(self.routed))


def _expert_config(cfg: GPTConfig, moe: MoEConfig) -> GPTConfig:
    return replace(cfg, ffn=moe.expert_ffn or cfg.ffn_size)


def _all_to_all_counts(counts: torch.Tensor, group: Any) -> torch.Tensor:
    """``counts[q]`` goes to EP rank ``q``; returns ``out[q]``, what rank ``q`` sent here."""
    counts = counts.contiguous()
    out = torch.empty_like(counts)
    dist.all_to_all_single(out, counts, group=group)
    return out


def _all_to_all_rows(x: torch.Tensor, recv: list[int], send: list[int], group: Any) -> torch.Tensor:
    """Rows ``x`` split ``send`` over the EP ranks, received split ``recv``; differentiable."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    return wait_tensor(all_to_all_single_autograd(x.contiguous(), recv, send, group))


class MoELayer(nn.Module):
    """Router, ``E`` experts (this rank's ``E/ep`` after :meth:`shard`), shared experts. ``[s, b, h]``
    in and out; after a forward, ``aux_loss`` holds this rank's differentiable balancing term and
    ``stats`` the layer's loads (:class:`MoEStats`)."""

    def __init__(self, cfg: GPTConfig, moe: MoEConfig, layer: int = 0, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        super().__init__()
        self.moe, self.layer, self.hidden = moe, layer, cfg.hidden
        ecfg = _expert_config(cfg, moe)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + 7919 * layer + 1)
            self.router = nn.Linear(cfg.hidden, moe.experts, bias=False)
            self.experts = nn.ModuleList(MLP(ecfg) for _ in range(moe.experts))
            self.shared = nn.ModuleList(MLP(ecfg) for _ in range(moe.shared_experts))
        self.to(dtype=dtype, device=device)
        self.balance_bias: torch.Tensor  # float64 whatever the model's dtype: a sum of many tiny steps
        self.register_buffer("balance_bias", torch.zeros(moe.experts, dtype=torch.float64, device=device))
        self.ep_group: Any = None  # None: every expert here
        self.dp_group: Any = None  # whose tokens make the global batch (None: the world once sharded)
        self.ep, self.ep_rank = 1, 0
        self.sharded = False  # set by shard(): the global batch is the data-parallel group's
        # unsharded: the tokens form this many consecutive groups, each with its own capacity (the
        # single-process twin of EP groups inside data parallelism)
        self.capacity_groups = 1
        self.aux_loss: torch.Tensor = torch.zeros(())
        self.stats = MoEStats()

    # -- layout ------------------------------------------------------------------------------------
    @property
    def local_experts(self) -> int:
        return self.moe.experts // self.ep

    @property
    def first_expert(self) -> int:
        return self.ep_rank * self.local_experts

    def shard(self, ep_group: Any, dp_group: Any = None) -> None:
        """Keep only this rank's experts of ``ep_group``; ``dp_group``: the ranks whose tokens make
        the global batch of the balancing loss (None: the world)."""
        ep = dist.get_world_size(ep_group)
        self.moe.check_ep(ep)
        self.ep_group, self.dp_group, self.ep, self.ep_rank = ep_group, dp_group, ep, dist.get_rank(ep_group)
        self.sharded = True
        first = self.first_expert
        self.experts = nn.ModuleList(list(self.experts)[first:first + self.local_experts])

    def _global_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the data-parallel group (itself when not sharded: one process)."""
        if not self.sharded:
            return t
        t = t.clone()
        dist.all_reduce(t, group=self.dp_group)
        return t

    # -- routing -----------------------------------------------------------------------------------
    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(probs [n, E], chosen experts [n, k], gates [n, k])``."""
        probs = self.router(tokens).softmax(dim=-1)
        scores = probs.detach().to(torch.float64) + self.balance_bias if self.moe.bias_rate else probs
        chosen = scores.topk(self.moe.top_k, dim=-1).indices
        gates = probs.gather(1, chosen)
        if self.moe.top_k > 1:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return probs, chosen, gates

    def update_balance_bias(self) -> None:
        """DeepSeek-V3's step: raise the bias of an under-loaded expert, lower an over-loaded one's."""
        if not self.moe.bias_rate or not self.stats.routed:
            return
        load = torch.tensor(self.stats.routed, dtype=torch.float64, device=self.balance_bias.device)
        self.balance_bias += self.moe.bias_rate * torch.sign(load.mean() - load)

    # -- forward -----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        tokens = x.transpose(0, 1).reshape(-1, h)  # batch-major: the group's tokens are the ranks' in order
        with comm_scope(layer=self.layer):
            out = self._routed(tokens)
        for expert in self.shared:
            out = out + expert(tokens)
        return out.reshape(b, s, h).transpose(0, 1)

    def _routed(self, tokens: torch.Tensor) -> torch.Tensor:
        moe, n, dev = self.moe, tokens.shape[0], tokens.device
        E, k, ep, El = moe.experts, moe.top_k, self.ep, self.local_experts
        G = self.capacity_groups if ep == 1 else 1  # capacity groups among my tokens
        if n % G:
            raise MoEConfigError(f"{n} tokens do not split into {G} capacity groups")
        probs, chosen, gates = self.route(tokens)
        # the k·n routing choices, first choices first (GShard's priority), sorted by expert
        expert_of = chosen.t().reshape(-1)
        token_of = torch.arange(n, device=dev).repeat(k)
        slot_of = torch.arange(k, device=dev).repeat_interleave(n)
        group_of = token_of // (n // G)
        gate_of = gates.t().reshape(-1)
        order = torch.sort(group_of * E + expert_of, stable=True).indices  # (group), expert, choice, token
        counts = torch.bincount((group_of * k + slot_of) * E + expert_of, minlength=G * k * E).view(G, k, E)
        # exchange the counts: what I send to each owner's experts, what each source sends to mine
        to_owner = counts if ep == 1 else counts[0].view(k, ep, El).transpose(0, 1)  # [owner, choice, local expert]
        with comm_scope(site="moe.counts"):
            from_source = to_owner if ep == 1 else _all_to_all_counts(to_owner, self.ep_group)
        capacity = moe.capacity(n * ep // G)  # over the EP group's tokens (or one group's)
        if capacity is not None:
            # an expert keeps its first C choices in (choice, source rank, token) order; the
            # sources of an EP group share C, capacity groups each have their own
            per = from_source.permute(1, 0, 2).reshape(k * ep, El) if ep > 1 else from_source.transpose(0, 1)
            before = per.cumsum(0) - per
            kept_from = (capacity - before).clamp(min=0).minimum(per)
            kept_from = kept_from.view(k, ep, El).permute(1, 0, 2) if ep > 1 else kept_from.transpose(0, 1)
            with comm_scope(site="moe.kept"):
                kept_to = kept_from if ep == 1 else _all_to_all_counts(kept_from, self.ep_group)
        else:
            kept_from, kept_to = from_source, to_owner
        kept = kept_to if ep == 1 else kept_to.transpose(0, 1).reshape(1, k, E)  # [group, choice, expert] of mine
        # keep, within each (group, expert, choice) run of the sorted choices, its first kept[...]
        sorted_key = ((group_of * E + expert_of) * k + slot_of)[order]
        run_counts = counts.transpose(1, 2).reshape(-1)  # [group, expert, choice], as sorted
        run_start = run_counts.cumsum(0) - run_counts
        position = torch.arange(k * n, device=dev) - run_start[sorted_key]
        send = order[position < kept.transpose(1, 2).reshape(-1)[sorted_key]]
        send_splits = kept_to.sum(dim=(1, 2)).tolist()
        recv_splits = kept_from.sum(dim=(1, 2)).tolist()
        rows = tokens.index_select(0, token_of[send])
        with comm_scope(site="moe.dispatch"):
            rows = rows if ep == 1 else _all_to_all_rows(rows, recv_splits, send_splits, self.ep_group)
        rows = self._run_experts(rows, kept_from)
        with comm_scope(site="moe.combine"):
            rows = rows if ep == 1 else _all_to_all_rows(rows, send_splits, recv_splits, self.ep_group)
        out = torch.zeros_like(tokens).index_add(0, token_of[send], rows * gate_of[send, None].to(rows.dtype))
        self._balance(probs, counts.sum((0, 1)), kept.sum((0, 1)), n, capacity, G, send_splits, recv_splits)
        return out

    def _run_experts(self, rows: torch.Tensor, kept_from: torch.Tensor) -> torch.Tensor:
        """Rows arrive by (source, local expert, choice); each local expert runs on its own."""
        per_run = kept_from.transpose(1, 2).reshape(-1)  # [source, local expert, choice]
        local = torch.arange(self.local_experts, device=rows.device)
        expert_row = local[None, :, None].expand_as(kept_from.transpose(1, 2)).reshape(-1).repeat_interleave(per_run)
        by_expert = torch.sort(expert_row, stable=True).indices
        sizes = torch.bincount(expert_row, minlength=self.local_experts).tolist()
        outs = [expert(chunk) for expert, chunk in zip(self.experts, rows[by_expert].split(sizes))]
        return torch.cat(outs).index_select(0, torch.argsort(by_expert))

    def _balance(self, probs: torch.Tensor, routed: torch.Tensor, kept: torch.Tensor, n: int,
                 capacity: int | None, groups: int, send_splits: list[int], recv_splits: list[int]) -> None:
        """Switch's loss over the global batch, and this forward's :class:`MoEStats`."""
        moe = self.moe
        totals = self._global_sum(torch.cat([routed, kept, routed.new_tensor([n])]))
        routed_all, kept_all, tokens = totals[:moe.experts], totals[moe.experts:-1], int(totals[-1])
        f = routed_all.to(probs.dtype) / (tokens * moe.top_k)
        self.aux_loss = moe.aux_alpha * moe.experts * (f * probs.mean(0)).sum()
        aux_mean = self._global_sum(self.aux_loss.detach().reshape(1))
        ranks = tokens // n
        limit = None if capacity is None else capacity * groups * (ranks // self.ep)
        self.stats = MoEStats(routed_all.tolist(), kept_all.tolist(), tokens, limit,
                              float(aux_mean) / ranks, send_splits, recv_splits)


# ----------------------------------------------------------------------------------------------
# The plan: experts into a GPT, sharded over an EP group, and their gradients
# ----------------------------------------------------------------------------------------------

def make_moe(model: GPT, moe: MoEConfig, seed: int = 0) -> GPT:
    """Replace every block's MLP with a :class:`MoELayer` (the same weights on every rank)."""
    p = next(model.parameters())
    for block in model.block_list():
        # Block.mlp is declared an MLP; a MoELayer has its call signature ([s, b, h] in and out)
        block.mlp = MoELayer(model.cfg, moe, block.layer, seed, dtype=p.dtype, device=p.device)  # type: ignore[assignment]
    return model


def moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def ep_groups(ep: int) -> tuple[Any, Any]:
    """``(ep_group, expert_dp_group)`` of this rank: EP groups of ``ep`` consecutive ranks; the
    expert-data-parallel group, the ranks holding the same experts (every rank takes part in
    every ``new_group``)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if ep < 1 or world % ep:
        raise MoEConfigError(f"EP = {ep} does not divide the {world} ranks")
    mine: dict[str, Any] = {}
    for g in range(world // ep):
        ranks = list(range(g * ep, (g + 1) * ep))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["ep"] = group
    for r in range(ep):
        ranks = list(range(r, world, ep))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine["dp"] = group
    return mine["ep"], mine["dp"]


def apply_ep(model: nn.Module, ep_group: Any, expert_dp_group: Any = None, dp_group: Any = None) -> nn.Module:
    """Shard the experts of every MoE layer over ``ep_group`` (each rank keeps ``E/ep``).
    ``expert_dp_group``: the ranks holding the same experts (None: one copy of each in the
    data-parallel group); ``dp_group``: the ranks whose tokens make the global batch (None: the
    world)."""
    for layer in moe_layers(model):
        layer.shard(ep_group, dp_group)
    model.expert_dp_group = expert_dp_group  # type: ignore[assignment]  # nn.Module's setattr types it Module|Tensor
    return model


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def sync_moe_grads(model: nn.Module, group: Any = None) -> None:
    """Average the replicated parameters' gradients over the data-parallel ``group`` (None: the
    world); an expert's gradient, which holds every EP rank's tokens, is summed over the ranks
    holding the same expert and divided by the group's size."""
    if not any(layer.sharded for layer in moe_layers(model)):
        return
    size = dist.get_world_size(group)
    replicated = [p for n, p in model.named_parameters() if p.grad is not None and not _is_expert(n)]
    experts = [p for n, p in model.named_parameters() if p.grad is not None and _is_expert(n)]
    expert_dp = getattr(model, "expert_dp_group", None)
    for params, g in ((replicated, group), (experts, expert_dp)):
        if not params:
            continue
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        if params is replicated or g is not None:  # experts: EP spanning the world holds one copy
            dist.all_reduce(flat, group=g)
        flat /= size
        offset = 0
        for p in params:
            assert p.grad is not None
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
            offset += p.numel()


def moe_aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum of every MoE layer's balancing term from the last forward (this rank's part)."""
    return sum((layer.aux_loss for layer in moe_layers(model)), torch.zeros(()))


def expert_param_bytes(model: nn.Module) -> int:
    """Bytes of the expert weights this rank holds (E/ep of them after :func:`apply_ep`)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters() if _is_expert(n))
