"""Lesson 1 formulas: the cost of all-reduce (and its halves) in the alpha-beta model.

The alpha-beta (Hockney) model: sending one message of ``S`` bytes over one link costs
``alpha + S * beta`` seconds, ``alpha`` the latency per message (s) and ``beta`` the time per
byte (s/B, the inverse of the link bandwidth). Every rank has one full-duplex link (it can send
one message and receive one message at the same time); messages a rank sends one after the
other are serialised. Reduction arithmetic is free.

Sources:
- Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  J. Parallel Distrib. Comput. 69(2), 2009 (the ring all-reduce and its optimality).
- Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH",
  IJHPCA 19(1), 2005 (alpha-beta costs of ring, binomial-tree and naive collectives, Sec. 4).
- NVIDIA nccl-tests, doc/PERFORMANCE.md (algbw and busbw definitions).

Sizes are in bytes, times in seconds. Pure Python: no torch, no numpy.
"""
from __future__ import annotations

import math

ALGORITHMS = ("ring", "tree", "naive")


MAX_RANKS = 2 ** 53  # beyond any cluster; past it 2(n−1) no longer fits a float


def _check_n(n: int) -> int:
    if int(n) != n or n < 1:
        raise ValueError(f"the number of ranks must be a positive integer, got {n!r}")
    if n > MAX_RANKS:
        raise ValueError(f"the number of ranks must be at most {MAX_RANKS:.3g}, got {n!r}")
    return int(n)


def _check_size(size_bytes: float) -> float:
    if not (size_bytes >= 0) or math.isinf(size_bytes):
        raise ValueError(f"the message size must be a finite number of bytes >= 0, got {size_bytes!r}")
    return size_bytes


def _check_alpha_beta(alpha: float, beta: float) -> None:
    if not (alpha >= 0) or not (beta >= 0) or math.isinf(alpha) or math.isinf(beta):
        raise ValueError("alpha and beta must be finite and >= 0")


def ring_allreduce_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Time of a ring all-reduce of ``size_bytes`` on ``n`` ranks: 2(n-1)α + 2(n-1)/n·S·β.

    The buffer is cut into n chunks of S/n bytes. Reduce-scatter: n-1 steps, in each every rank
    sends one chunk to its right neighbour and adds the chunk it receives from its left one. All-gather:
    n-1 more steps passing the finished chunks around. 2(n-1) steps of one S/n-byte message each
    (Patarasuk & Yuan 2009; Thakur et al. 2005, Sec. 4.4). n = 1 costs nothing.
    """
    n = _check_n(n)
    _check_size(size_bytes)
    _check_alpha_beta(alpha, beta)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size_bytes * beta


# NCCL's own cost model of a ring collective (all-reduce, all-gather, reduce-scatter) inside a node over
# NVLink, as its tuner ranks its three protocols (src/graph/tuning.cc of NCCL 2.18 to 2.20, the versions of
# 2023's serving runs, read at v2.18.5-1: baseLat, hwLat[NVLINK][RING], the LL and LL128 bus bandwidth
# refinements; ncclTopoGetAlgoTime's time = latency + bytes / algorithm bandwidth). LL sends 8-byte lines of 4
# data bytes and a flag, so a message needs no separate synchronisation but moves slowly: the tuner gives it a
# quarter of the bus bandwidth in an all-reduce, a third in an all-gather or a reduce-scatter inside a node (at
# most NCCL's llMaxBw for one node of Ampere or Hopper GPUs); LL128 sends 120 of 128 bytes, which the tuner
# counts as 0.92 of the bus; Simple has the whole bandwidth and the longest latency. NCCL takes the fastest:
# LL for small messages, Simple for large. The bus bandwidth is NCCL's topology figure (channels × each
# channel's bandwidth inside the node), taken here as the link's per-direction bandwidth. Left out: the tree
# algorithm (all-reduce only; within one node its latency is the ring's to a few percent, and its LL bandwidth
# lower after NCCL's tree correction, so ring LL wins at decode's sizes), NVLS on NVSwitch H100s (23 µs, for
# large messages; from 2.19 also for all-gather and reduce-scatter), LL128's per-channel cap (20 GB/s a channel
# on Ampere, 36.7 on Hopper: it binds only for large messages at a high bus bandwidth) and the inter-node
# terms (this is the model inside a node).
NCCL_PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_RING_BASE_LATENCY = {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}  # s, baseLat[RING]
NCCL_RING_NVLINK_HOP_LATENCY = {"LL": 0.6e-6, "LL128": 1.9e-6, "Simple": 3.4e-6}  # s per step, hwLat[NVLINK][RING]
NCCL_BUS_BANDWIDTH_SHARE = {"LL": 0.25, "LL128": 0.92, "Simple": 1.0}  # LL's: an all-reduce's
NCCL_LL_SHARE_GATHER_SCATTER = 1 / 3  # LL's share for the other rings inside a node (nNodes == 1)
NCCL_LL_MAX_BANDWIDTH = 87.7e9  # B/s, llMaxBws for one node of Ampere or Hopper GPUs


def nccl_ring_latency(steps: int, protocol: str) -> float:
    """The latency NCCL's tuner gives a ring of ``steps`` steps inside an NVLink node with ``protocol``
    (LL, LL128 or Simple): its base plus a hop's latency per step, seconds (model above)."""
    if protocol not in NCCL_PROTOCOLS:
        raise ValueError(f"unknown NCCL protocol {protocol!r}; choose one of {', '.join(NCCL_PROTOCOLS)}")
    if int(steps) != steps or steps < 0:
        raise ValueError(f"the number of steps must be an integer >= 0, got {steps!r}")
    return NCCL_RING_BASE_LATENCY[protocol] + steps * NCCL_RING_NVLINK_HOP_LATENCY[protocol]


#: the collectives NCCL's tuner prices as rings (tuning.cc: a ring of 2(n−1) steps for an all-reduce, n−1 for the
#: others), named as :func:`~distai.lessons.lesson4.formulas.tp_comm_per_layer` counts them
NCCL_RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def nccl_ring_time(size_bytes: float, n: int, bus_bandwidth: float, collective: str = "all_reduce") -> dict:
    """NCCL's predicted time of a ring ``collective`` (:data:`NCCL_RING_COLLECTIVES`) of ``size_bytes`` (the
    whole buffer: an all-gather's output, a reduce-scatter's input) on ``n`` GPUs of one NVLink node whose
    link moves ``bus_bandwidth`` B/s (the Simple protocol's busbw): {"time_s", "protocol" (the fastest, as
    NCCL picks it), "times_s" (each protocol's)}. With k steps (2(n−1) for an all-reduce, n−1 for the
    others) each protocol p costs baseLat_p + k·hwLat_p + k/n·S / (share_p·busbw); LL's share is a quarter
    for an all-reduce and a third for the others inside a node, capped at llMaxBw (model above)."""
    n = _check_n(n)
    _check_size(size_bytes)
    if collective not in NCCL_RING_COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; choose one of {', '.join(NCCL_RING_COLLECTIVES)}")
    if not (bus_bandwidth > 0) or math.isinf(bus_bandwidth):
        raise ValueError("the bus bandwidth must be a finite number of bytes/s > 0")
    if n == 1:
        return {"time_s": 0.0, "protocol": None, "times_s": dict.fromkeys(NCCL_PROTOCOLS, 0.0)}
    steps = 2 * (n - 1) if collective == "all_reduce" else n - 1
    times = {}
    for p in NCCL_PROTOCOLS:
        share = NCCL_BUS_BANDWIDTH_SHARE[p]
        if p == "LL" and collective != "all_reduce":
            share = NCCL_LL_SHARE_GATHER_SCATTER
        bandwidth = share * bus_bandwidth
        if p == "LL":
            bandwidth = min(bandwidth, NCCL_LL_MAX_BANDWIDTH)
        times[p] = nccl_ring_latency(steps, p) + steps / n * size_bytes / bandwidth
    fastest = min(times, key=times.__getitem__)
    return {"time_s": times[fastest], "protocol": fastest, "times_s": times}


def nccl_ring_allreduce(size_bytes: float, n: int, bus_bandwidth: float) -> dict:
    """NCCL's predicted time of a ring all-reduce (:func:`nccl_ring_time`): each protocol p costs
    baseLat_p + 2(n−1)·hwLat_p + 2(n−1)/n·S / (share_p·busbw), the share capped for LL (model above)."""
    return nccl_ring_time(size_bytes, n, bus_bandwidth, "all_reduce")


def serial_messages_time(messages: int, message_bytes: float, alpha: float, beta: float) -> float:
    """Time of ``messages`` messages of ``message_bytes`` each, sent one after the other:
    messages·(α + message_bytes·β).

    The alpha-beta (Hockney) cost every algorithm here is built from: after k of its steps the ring
    has spent k·(α + S/n·β), the naive and tree all-reduces k·(α + S·β) (Thakur et al. 2005, Sec. 4).
    With k = 2(n-1) and S/n bytes this is :func:`ring_allreduce_time`.
    """
    if int(messages) != messages or messages < 0:
        raise ValueError(f"the number of messages must be an integer >= 0, got {messages!r}")
    _check_size(message_bytes)
    _check_alpha_beta(alpha, beta)
    return messages * (alpha + message_bytes * beta)


def ring_reduce_scatter_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Ring reduce-scatter of an ``size_bytes`` input on ``n`` ranks: (n-1)α + (n-1)/n·S·β.

    The first half of the ring all-reduce (Thakur et al. 2005, Sec. 4.5): n-1 steps of S/n bytes;
    each rank ends with one fully reduced S/n chunk.
    """
    n = _check_n(n)
    _check_size(size_bytes)
    _check_alpha_beta(alpha, beta)
    if n == 1:
        return 0.0
    return (n - 1) * alpha + (n - 1) / n * size_bytes * beta


def ring_allgather_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Ring all-gather producing ``size_bytes`` (the full output) on ``n`` ranks: (n-1)α + (n-1)/n·S·β.

    Each rank starts with S/n bytes and passes chunks around the ring for n-1 steps
    (Thakur et al. 2005, Sec. 4.1): the second half of the ring all-reduce. Its messages are the
    reduce-scatter's (n-1 steps of S/n bytes), without the additions: the same time.
    """
    return ring_reduce_scatter_time(size_bytes, n, alpha, beta)


def naive_allreduce_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Naive all-reduce: every rank sends its whole buffer to rank 0, which adds them and sends
    the result back to each rank in turn: 2(n-1)(α + S·β).

    Rank 0's single link receives n-1 full messages one after the other (reduce), then sends n-1 full
    messages one after the other (broadcast): 2(n-1) serialised steps of S bytes each. The busiest link
    carries (n-1)·S bytes each way — it grows with n, where the ring's stays below 2S.
    """
    n = _check_n(n)
    _check_size(size_bytes)
    _check_alpha_beta(alpha, beta)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * (alpha + size_bytes * beta)


def tree_depth(n: int) -> int:
    """Rounds of a binomial tree over ``n`` ranks: ⌈log2 n⌉ (0 for n = 1)."""
    n = _check_n(n)
    return (n - 1).bit_length()


def tree_allreduce_time(size_bytes: float, n: int, alpha: float, beta: float) -> float:
    """Tree all-reduce: a binomial-tree reduce to rank 0, then a binomial-tree broadcast back:
    2⌈log2 n⌉(α + S·β).

    Model (Thakur et al. 2005, Sec. 4.2 and 4.6, "binomial tree" reduce and broadcast, whole
    messages, no pipelining): in round k = 1..⌈log2 n⌉ of the reduce, every rank whose index has bit
    k-1 set (and no lower bit) sends its whole partial sum of S bytes to the rank 2^(k-1) below it;
    the broadcast mirrors this. Each round is one message of S bytes, so 2⌈log2 n⌉ steps — few steps
    (good for latency) but each moves the whole buffer (poor bandwidth). NCCL's own "tree" pipelines
    chunks through a double binary tree and behaves differently; this is the textbook tree.
    """
    n = _check_n(n)
    _check_size(size_bytes)
    _check_alpha_beta(alpha, beta)
    return 2 * tree_depth(n) * (alpha + size_bytes * beta)


def allreduce_time(size_bytes: float, n: int, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """Dispatch to :func:`ring_allreduce_time`, :func:`tree_allreduce_time` or :func:`naive_allreduce_time`."""
    funcs = {"ring": ring_allreduce_time, "tree": tree_allreduce_time, "naive": naive_allreduce_time}
    if algorithm not in funcs:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return funcs[algorithm](size_bytes, n, alpha, beta)


def allreduce_steps(n: int, algorithm: str = "ring") -> int:
    """Serialised message steps on the critical path: ring 2(n-1), tree 2⌈log2 n⌉, naive 2(n-1).

    Same models as the ``*_allreduce_time`` functions: the α term is ``steps × α``.
    """
    n = _check_n(n)
    if algorithm == "ring" or algorithm == "naive":
        return 2 * (n - 1)
    if algorithm == "tree":
        return 2 * tree_depth(n)
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def allreduce_bytes_per_rank(size_bytes: float, n: int, algorithm: str = "ring") -> float:
    """Bytes sent by the busiest rank during one all-reduce of ``size_bytes`` (it receives as many).

    - ring: every rank sends 2(n-1)/n·S (2(n-1) chunks of S/n) — the same on every rank;
    - tree (binomial): the root sends ⌈log2 n⌉·S in the broadcast (and received as much in the reduce);
    - naive: rank 0 sends (n-1)·S in the broadcast (and received (n-1)·S in the reduce).
    This is also the bytes the busiest link carries in each direction.
    """
    n = _check_n(n)
    _check_size(size_bytes)
    if algorithm == "ring":
        return 2 * (n - 1) / n * size_bytes
    if algorithm == "tree":
        return tree_depth(n) * size_bytes
    if algorithm == "naive":
        return (n - 1) * size_bytes
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")


def ring_busiest_link_bytes(size_bytes: float, n: int) -> float:
    """Bytes on any ring link, one direction, for one ring all-reduce: 2(n-1)/n·S (< 2S for all n).

    Every link of the ring is equally loaded, which is why the ring is bandwidth-optimal
    (Patarasuk & Yuan 2009, Sec. 3: no all-reduce can send less than 2(n-1)/n·S per rank).
    """
    return allreduce_bytes_per_rank(size_bytes, n, "ring")


def busbw_factor(n: int) -> float:
    """nccl-tests' all-reduce bus-bandwidth factor 2(n-1)/n (doc/PERFORMANCE.md, "AllReduce")."""
    n = _check_n(n)
    return 2 * (n - 1) / n


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth S / t in bytes/s (nccl-tests doc/PERFORMANCE.md, "Algorithm bandwidth")."""
    _check_size(size_bytes)
    if not (time_s > 0) or math.isinf(time_s):
        raise ValueError(f"the time must be a finite number of seconds > 0, got {time_s!r}")
    return size_bytes / time_s


def busbw(size_bytes: float, time_s: float, n: int) -> float:
    """Bus bandwidth of an all-reduce: algbw × 2(n-1)/n (nccl-tests doc/PERFORMANCE.md, "Bus bandwidth").

    It is the per-link bandwidth the ring actually achieved, comparable to the hardware's peak
    whatever the number of ranks.
    """
    return algbw(size_bytes, time_s) * busbw_factor(n)


def alpha_beta_fit(sizes_bytes: list[float], times_s: list[float]) -> tuple[float, float]:
    """Least-squares fit of t = a + b·S to measured all-reduce times, in relative error, with a ≥ 0 and
    b ≥ 0; returns (a, b).

    For a ring on n ranks, a = 2(n-1)α and b = 2(n-1)/n·β (from :func:`ring_allreduce_time`), so
    α = a / (2(n-1)) and β = b / busbw_factor(n). Each time is weighted by 1/t² (minimizing
    Σ((t − a − b·S)/t)²): the sizes span almost five decades, and in absolute error the noise of the largest
    messages (milliseconds) sets the intercept that the smallest (microseconds) measure — a sweep on
    2 loaded cores fitted α = 616 µs where its 1-32 KiB times were 0.35-0.56 ms. Closed form; where it
    gives a negative latency or a negative time per byte, the constrained optimum lies on that bound:
    the line through the origin (a = 0), or the weighted mean time (b = 0). A time of 0 weighs as the
    least positive one does. Every α-β fit of the course is this one: lesson 1's sweep, ``distai doctor``,
    lesson 7's and the capstone's calibration (two sizes: the line through both, whatever the weights).
    """
    if len(sizes_bytes) != len(times_s) or len(sizes_bytes) < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    if len(set(sizes_bytes)) < 2:
        raise ValueError("the sizes must not all be equal")
    positive = [t for t in times_s if t > 0]
    floor = min(positive) if positive else 1.0
    w = [1.0 / max(t, floor) ** 2 for t in times_s]
    total = sum(w)
    mean_s = sum(wi * s for wi, s in zip(w, sizes_bytes)) / total
    mean_t = sum(wi * t for wi, t in zip(w, times_s)) / total
    var = sum(wi * (s - mean_s) ** 2 for wi, s in zip(w, sizes_bytes))
    cov = sum(wi * (s - mean_s) * (t - mean_t) for wi, s, t in zip(w, sizes_bytes, times_s))
    b = cov / var
    a = mean_t - b * mean_s
    if b < 0:
        return max(mean_t, 0.0), 0.0
    if a < 0:
        through_origin = sum(wi * s * t for wi, s, t in zip(w, sizes_bytes, times_s)) / \
            sum(wi * s * s for wi, s in zip(w, sizes_bytes))
        return 0.0, max(through_origin, 0.0)
    return a, b


def ring_crossover_bytes(n: int, alpha: float, beta: float) -> float:
    """Message size where the ring's latency and bandwidth terms are equal:
    2(n-1)α = 2(n-1)/n·S·β  ⇒  S = n·α/β. Below it the all-reduce is latency-bound."""
    n = _check_n(n)
    _check_alpha_beta(alpha, beta)
    if beta == 0:
        raise ValueError("beta must be > 0")
    return n * alpha / beta
