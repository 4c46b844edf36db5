"""Context parallelism: the sequence split over a group of ranks, attention by ring or all-gather.

At long sequence lengths the activations, not the weights, stop fitting, and splitting them by
tensor parallelism stops at a node. Context parallelism gives each of ``cp`` ranks a slice of the
sequence for the *whole* model: every layer but attention works token by token, so it runs on the
slice unchanged; attention needs every earlier key, so the ranks exchange keys and values.

* **Ring** (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Megatron-LM's context
  parallelism): each rank keeps its queries and passes its K/V block to the right, ``cp − 1`` hops,
  posting the next hop before computing with the block it holds, so the transfer hides behind the
  compute. Each block's partial result is merged with the online softmax (Milakov & Gimelshein
  2018; FlashAttention, Dao et al. 2022): a running row maximum ``m`` and sum ``l`` of
  ``exp(score − m)``, rescaled when ``m`` grows, so the merged result is exactly full attention.
  The backward runs the ring again from the saved log-sum-exp ``m + log l``: the K/V travel the
  same way, and their gradients travel with them, one hop behind, ``cp`` hops home.
* **All-gather** (Llama 3, Dubey et al. 2024, §3.3.2): all-gather the K/V first, attend, and
  reduce-scatter their gradients in the backward. With grouped-query attention the K/V are
  ``heads/kv_heads`` times smaller than the queries, so gathering them is cheap: Llama 3 leaves the
  all-gather exposed (the first tile waits for it) and keeps one collective, simpler than a ring and
  easier to combine with any mask.
* **Layouts** (:mod:`distai.lessons.context.ring_schedule`): under the causal mask the contiguous
  split leaves the first ranks idle most of the ring; the zigzag split (chunks ``i`` and
  ``2·cp − 1 − i`` on rank ``i``) gives every rank the same work at every step.

The core works on ``[b, heads, n, d]`` queries and ``[b, kv_heads, n, d]`` keys and values of this
rank's ``n = s/cp`` tokens; every tile is computed with the causal mask of the two chunks' absolute
positions (a rank skips the tiles that lie wholly in the future). Dropout on the attention
probabilities is not supported (the ring never forms them). :func:`apply_cp` installs it into the
one model's attention; :func:`shard_sequence` cuts ids, targets and positions to this rank's
tokens; :func:`cp_loss` and :func:`sync_cp_grads` make the loss and gradients those of the whole
sequence.
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from ..lessons.context import ring_schedule as plan
from .metering import comm_scope, comm_tags
from .zero import Collectives

__all__ = ["CPGroup", "ring_attention", "attention_reference", "apply_cp", "shard_sequence", "cp_loss",
           "sync_cp_grads", "LayoutError"]

LayoutError = plan.LayoutError


class CPGroup:
    """The context-parallel group of this rank, the sequence layout and the attention variant.

    ``trace``: when a list, every ring step of every attention call appends one record to it
    (``phase``, ``step``, the ``owner`` of the K/V it used, the tiles' kinds, the causal ``scores``
    it computed, its ``compute_s`` and the ``wait_s`` for the next block).
    """

    def __init__(self, group: Any = None, layout: str = "zigzag", variant: str = "ring"):
        if variant not in plan.VARIANTS:
            raise LayoutError(f"variant must be one of {', '.join(plan.VARIANTS)}, not {variant!r}")
        if layout not in plan.LAYOUTS:
            raise LayoutError(f"layout must be one of {', '.join(plan.LAYOUTS)}, not {layout!r}")
        self.group, self.layout, self.variant = group, layout, variant
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.right = self._global((self.rank + 1) % self.size)
        self.left = self._global((self.rank - 1) % self.size)
        self.trace: list[dict] | None = None

    def _global(self, group_rank: int) -> int:
        if not dist.is_initialized():
            return group_rank
        return dist.get_global_rank(self.group, group_rank) if self.group is not None else group_rank

    def chunks(self) -> tuple[int, ...]:
        return plan.rank_chunks(self.rank, self.size, self.layout)

    def positions(self, seq: int, device: Any = None) -> torch.Tensor:
        """The absolute positions of this rank's tokens (LayoutError if ``seq`` does not split)."""
        return torch.tensor(plan.positions(self.rank, seq, self.size, self.layout), device=device)


# ----------------------------------------------------------------------------------------------
# One tile: queries of one chunk against keys of one chunk
# ----------------------------------------------------------------------------------------------

def _expand(kv: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V ``[b, kv_heads, c, d]`` → ``[b, heads, c, d]``: each K/V head serves its group."""
    return kv if kv.shape[1] == heads else kv.repeat_interleave(heads // kv.shape[1], dim=1)


def _fold_groups(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of :func:`_expand`: sum over each group's query heads."""
    b, heads, c, d = grad.shape
    return grad if heads == kv_heads else grad.view(b, kv_heads, heads // kv_heads, c, d).sum(2)


def _scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool, scale: float) -> torch.Tensor:
    s = q.matmul(_expand(k, q.shape[1]).transpose(-1, -2)) * scale
    if diagonal:  # the same chunk: query i sees keys 0..i
        c = s.shape[-1]
        s = s.masked_fill(torch.ones(c, c, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _tile_forward(q, k, v, diagonal: bool, scale: float):
    """The tile's unnormalised output, row maximum and row sum of ``exp(score − max)``, and how
    many query-key pairs the mask let through (of one head and sequence)."""
    s = _scores(q, k, diagonal, scale)
    m = s.amax(dim=-1)
    p = torch.exp(s - m[..., None])
    return p.matmul(_expand(v, q.shape[1])), m, p.sum(dim=-1), int(torch.isfinite(s[0, 0]).sum())


def _merge(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, o_t, m_t, l_t) -> None:
    """Online softmax: fold one tile's (output, max, sum) into the running ones, in place."""
    m_new = torch.maximum(m, m_t)
    old, new = torch.exp(m - m_new), torch.exp(m_t - m_new)  # exp(−inf) = 0 before the first tile
    acc.mul_(old[..., None]).add_(o_t * new[..., None])
    l.mul_(old).add_(l_t * new)
    m.copy_(m_new)


def _tile_backward(q, k, v, do, lse, delta, diagonal: bool, scale: float):
    """Gradients of one tile from the saved log-sum-exp: dq, dk, dv (dk and dv per K/V head)."""
    p = torch.exp(_scores(q, k, diagonal, scale) - lse[..., None])  # the softmax, recomputed
    dv = p.transpose(-1, -2).matmul(do)
    ds = p * (do.matmul(_expand(v, q.shape[1]).transpose(-1, -2)) - delta[..., None])
    dq = ds.matmul(_expand(k, q.shape[1])) * scale
    dk = ds.transpose(-1, -2).matmul(q) * scale
    return dq, _fold_groups(dk, k.shape[1]), _fold_groups(dv, k.shape[1])


# ----------------------------------------------------------------------------------------------
# The ring (and the all-gather variant)
# ----------------------------------------------------------------------------------------------

_TAGS = {"cp.kv": 1, "cp.dkv": 2}


class _Hop:
    """One step's point-to-point exchange on the ring: send to the right, receive from the left."""

    def __init__(self, cp: CPGroup, send: torch.Tensor, site: str):
        self.received = torch.empty_like(send)
        tag = _TAGS[site]  # K/V and their gradients, same shape, in flight at once: never confused
        with comm_scope(site=site):
            ops = [dist.P2POp(dist.isend, send, cp.right, cp.group, tag),
                   dist.P2POp(dist.irecv, self.received, cp.left, cp.group, tag)]
            self.works = dist.batch_isend_irecv(ops)

    def wait(self) -> torch.Tensor:
        for w in self.works:
            w.wait()
        return self.received


def _chunk(x: torch.Tensor, i: int, c: int) -> torch.Tensor:
    """Chunk ``i`` (in the shard's order) of a ``[..., n, d]`` or ``[..., n]`` tensor along n."""
    return x.narrow(-2 if x.dim() >= 4 else -1, i * c, c)


def _tiles(cp: CPGroup, step: int, src: int):
    """(query slot, key slot, diagonal) of the tiles this rank computes at ``step`` with the K/V
    of rank ``src``: slots index the chunks in each shard's order; wholly future tiles skipped."""
    mine, theirs = cp.chunks(), plan.rank_chunks(src, cp.size, cp.layout)
    return [(a, b, kind == plan.DIAGONAL)
            for a, qc in enumerate(mine) for b, kc in enumerate(theirs)
            if (kind := plan.tile_kind(qc, kc)) != plan.SKIP]


def _record(cp: CPGroup, phase: str, step: int, src: int, tiles, scores: int, sent: list[torch.Tensor],
            t0: float, t1: float, t2: float, cpu_s: float | None) -> None:
    """One ring step in ``cp.trace``: ``sent`` the tensors this rank handed to the network in it;
    ``cpu_s``, this thread's CPU seconds computing on a CPU device (the work, without its waits for a
    core; None on a GPU, whose kernels the thread only launches)."""
    if cp.trace is None:
        return
    cp.trace.append({"phase": phase, "step": step, "owner": src, "layer": comm_tags()["layer"],
                     "tiles": [plan.DIAGONAL if diag else plan.FULL for _, _, diag in tiles],
                     "scores": scores, "compute_s": t1 - t0, "wait_s": t2 - t1, "messages": len(sent),
                     "t0": time.time() - (time.perf_counter() - t0),  # wall clock, as the trace's spans
                     "sent_bytes": sum(_sent_bytes(cp, t) for t in sent),
                     **({"compute_cpu_s": cpu_s} if cpu_s is not None else {})})


def _sent_bytes(cp: CPGroup, t: torch.Tensor) -> float:
    """What this rank sends for ``t``: all of a hop; ``(cp−1)/cp`` of a gathered or scattered whole."""
    nbytes = t.numel() * t.element_size()
    return nbytes if cp.variant == "ring" else nbytes * (cp.size - 1) / cp.size


def _step_block(cp: CPGroup, step: int, kv: torch.Tensor, gathered: torch.Tensor | None):
    """At ring ``step``: whose K/V this rank uses, the hop passing the block it holds on (posted
    now, before the compute; None on the last step and with the all-gather), what it sends in the
    step (for the trace) and the block ``[2, b, kv_heads, n, d]`` it computes with."""
    src = plan.owner(cp.rank, step, cp.size)
    hop = _Hop(cp, kv, "cp.kv") if gathered is None and step < cp.size - 1 else None
    sent = [kv] if hop is not None else [gathered] if gathered is not None and step == 0 and cp.size > 1 else []
    return src, hop, sent, gathered[src] if gathered is not None else kv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPGroup) -> torch.Tensor:  # type: ignore[override]
        n = q.shape[-2]
        c = n // len(cp.chunks())
        scale = 1.0 / math.sqrt(q.shape[-1])
        acc = torch.zeros_like(q)
        m = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        l = torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device)
        kv = torch.stack((k, v))  # one message a hop
        gathered = _gather(cp, kv) if cp.variant == "allgather" else None
        for step in range(cp.size):
            src, hop, sent, block = _step_block(cp, step, kv, gathered)
            t0, c0 = time.perf_counter(), time.thread_time()
            tiles, scores = _tiles(cp, step, src), 0
            for a, b, diag in tiles:
                o_t, m_t, l_t, seen = _tile_forward(_chunk(q, a, c), _chunk(block[0], b, c), _chunk(block[1], b, c),
                                                    diag, scale)
                _merge(_chunk(acc, a, c), _chunk(m, a, c), _chunk(l, a, c), o_t, m_t, l_t)
                scores += seen
            t1, cpu_s = time.perf_counter(), time.thread_time() - c0 if q.device.type == "cpu" else None
            if hop is not None:
                kv = hop.wait()
            _record(cp, "fwd", step, src, tiles, scores, sent, t0, t1, time.perf_counter(), cpu_s)
        out = acc / l[..., None]
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp, ctx.tags, ctx.c = cp, comm_tags(), c
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        cp, c = ctx.cp, ctx.c
        scale = 1.0 / math.sqrt(q.shape[-1])
        delta = (dout * out).sum(dim=-1)  # rowsum(dO ∘ O): the softmax backward's correction
        dq = torch.zeros_like(q)
        with comm_scope(layer=ctx.tags["layer"], phase="bwd"):
            kv = torch.stack((k, v))
            gathered = _gather(cp, kv) if cp.variant == "allgather" else None
            dkv_all = torch.zeros_like(gathered) if gathered is not None else None
            dkv_hop: _Hop | None = None
            for step in range(cp.size):
                src, hop, sent, block = _step_block(cp, step, kv, gathered)
                t0, c0 = time.perf_counter(), time.thread_time()
                dkv = dkv_all[src] if dkv_all is not None else torch.zeros_like(kv)
                tiles = _tiles(cp, step, src)
                for a, b, diag in tiles:
                    dq_t, dk_t, dv_t = _tile_backward(_chunk(q, a, c), _chunk(block[0], b, c), _chunk(block[1], b, c),
                                                      _chunk(dout, a, c), _chunk(lse, a, c), _chunk(delta, a, c),
                                                      diag, scale)
                    _chunk(dq, a, c).add_(dq_t)
                    _chunk(dkv[0], b, c).add_(dk_t)
                    _chunk(dkv[1], b, c).add_(dv_t)
                t1, cpu_s = time.perf_counter(), time.thread_time() - c0 if q.device.type == "cpu" else None
                if gathered is None and cp.size > 1:
                    if dkv_hop is not None:  # the gradient of this block so far, from the left
                        dkv.add_(dkv_hop.wait())
                    dkv_hop = _Hop(cp, dkv, "cp.dkv")  # one hop behind its block; the last one goes home
                    sent.append(dkv)
                    if hop is not None:
                        kv = hop.wait()
                elif dkv_all is not None and step == cp.size - 1 and cp.size > 1:
                    dkv = _scatter(cp, dkv_all)
                    sent.append(dkv_all)
                _record(cp, "bwd", step, src, tiles, sum(plan.tile_scores(plan.DIAGONAL if d else plan.FULL, c)
                                                         for _, _, d in tiles), sent, t0, t1, time.perf_counter(), cpu_s)
            if dkv_hop is not None:  # the ring's last hop: this rank's own block's gradient, home
                dkv = dkv_hop.wait()
        return dq, dkv[0], dkv[1], None


def _gather(cp: CPGroup, kv: torch.Tensor) -> torch.Tensor:
    """Every rank's K/V ``[cp, 2, b, kv_heads, n, d]`` (the all-gather variant)."""
    out = torch.empty((cp.size * kv.shape[0], *kv.shape[1:]), dtype=kv.dtype, device=kv.device)
    with comm_scope(site="cp.kv"):
        Collectives(cp.group).all_gather(out, kv.contiguous(), async_op=False).wait()
    return out.view(cp.size, *kv.shape)


def _scatter(cp: CPGroup, dkv_all: torch.Tensor) -> torch.Tensor:
    """This rank's K/V gradient: the sum over ranks of their gradients of its block."""
    out = torch.empty(dkv_all.shape[1:], dtype=dkv_all.dtype, device=dkv_all.device)
    with comm_scope(site="cp.dkv"):
        Collectives(cp.group).reduce_scatter(out.view(-1), dkv_all.contiguous().view(-1), async_op=False).wait()
    return out


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: CPGroup) -> torch.Tensor:
    """Causal attention of this rank's queries ``[b, heads, n, d]`` over the keys and values
    ``[b, kv_heads, n, d]`` of the whole sequence, spread over ``cp``'s ranks in its layout."""
    if q.shape[-2] % len(cp.chunks()):
        raise LayoutError(f"a shard of {q.shape[-2]} tokens does not split into the {cp.layout} layout's chunks")
    return _RingAttention.apply(q, k, v, cp)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of the whole sequence on one process (what the ring must equal)."""
    return torch.nn.functional.scaled_dot_product_attention(q, _expand(k, q.shape[1]), _expand(v, q.shape[1]),
                                                            is_causal=True)


# ----------------------------------------------------------------------------------------------
# The model under context parallelism
# ----------------------------------------------------------------------------------------------

def apply_cp(model: Any, cp: CPGroup) -> Any:
    """Install ring (or all-gather) attention in every block of the one model (in place), for a
    model that will be called on this rank's sequence shard with its ``positions``."""
    if model.cfg.dropout:
        raise ValueError("context parallelism never forms the attention probabilities: use dropout 0")
    for block in model.block_list():
        block.attn.core = CPCore(cp)
    return model


class CPCore:
    """The attention core :class:`~distai.engine.model.Attention` calls (``block.attn.core``):
    causal attention of this rank's queries over the whole sequence's keys and values."""

    def __init__(self, cp: CPGroup):
        self.cp = cp

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                 dropout: Any = None) -> torch.Tensor:
        if mask is not None or dropout is not None:
            raise ValueError("ring attention is causal training attention: no KV cache, no dropout")
        return ring_attention(q, k, v, self.cp)


def shard_sequence(x: torch.Tensor, cp: CPGroup, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of ``x`` along ``dim`` (``[b, s]`` ids and targets: dim 1)."""
    return x.index_select(dim, cp.positions(x.shape[dim], x.device))


def cp_loss(local_loss: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The whole batch's mean loss from this rank's mean over its equal share of the tokens: the
    mean of the ranks' means over ``group`` (the CP group, or with data parallelism every rank that
    holds a share; None: the world). Detached, for reporting: backward uses the local loss, then
    :func:`sync_cp_grads`."""
    total = local_loss.detach().clone()
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    if size > 1:
        with comm_scope(phase="loss", site="cp.loss"):
            dist.all_reduce(total, group=group)
    return total / size


def sync_cp_grads(model: Any, group: Any = None) -> None:
    """Average the parameters' gradients over ``group`` (as :func:`cp_loss`): each rank's are
    those of its share of the tokens' mean loss, so their mean is the whole batch's gradient
    (Megatron-LM reduces over data × context parallel ranks alike)."""
    size = dist.get_world_size(group) if dist.is_initialized() else 1
    if size == 1:
        return
    with comm_scope(phase="grad-sync", site="cp.grads"):
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(size)
