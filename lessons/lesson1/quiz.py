"""Lesson 1 quiz: data parallelism and the ring all-reduce. Answers from :mod:`.formulas`;
texts in ``quiz.toml``."""
from __future__ import annotations

from ..quiz import Choice, Numeric, build
from . import formulas as f

SIZES = [64e6, 100e6, 256e6, 500e6, 1e9, 2e9, 4e9]
BETAS = [1 / bw for bw in (12.5e9, 25e9, 50e9, 100e9, 200e9)]
ALPHAS = [2e-6, 5e-6, 10e-6, 20e-6]
RANKS = [2, 4, 8, 16, 32, 64]
LINK = {"size_bytes": SIZES, "n": RANKS, "alpha": ALPHAS, "beta": BETAS}


def _worked(n: int = 2, beta: float = 1.0, size_bytes: float = 0.0, alpha: float = 0.0,
            time_s: float = 1.0) -> dict:
    """The intermediate numbers the explanations show."""
    return {"n1": n - 1, "steps": 2 * (n - 1), "bw": 1 / beta, "factor": f.busbw_factor(n),
            "depth": f.tree_depth(n), "algbw": f.algbw(size_bytes, time_s),
            "latency": 2 * (n - 1) * alpha, "bandwidth_term": 2 * (n - 1) / n * size_bytes * beta,
            "naive": f.naive_allreduce_time(size_bytes, n, alpha, beta),
            "ring": f.ring_allreduce_time(size_bytes, n, alpha, beta),
            "tree": f.tree_allreduce_time(size_bytes, n, alpha, beta)}


GENERATORS = build("lesson1", __package__, values=_worked, kinds=[
    Numeric("ring-time", draw=LINK, answer=f.ring_allreduce_time, quantity="seconds", unit="ms",
            wrong={"the latency term alone": lambda n, alpha: 2 * (n - 1) * alpha}),
    # from 64 GPUs on, 2(N−1)/N·S is within 2% of 2S: the question would not tell them apart
    Numeric("ring-bytes", draw={"size_bytes": SIZES, "n": RANKS[:-1]},
            answer=lambda size_bytes, n: f.allreduce_bytes_per_rank(size_bytes, n, "ring"), quantity="bytes",
            unit="MB", wrong={"2S": lambda size_bytes: 2 * size_bytes}),
    Numeric("ring-steps", draw={"n": RANKS + [3, 5, 6, 12, 24]}, answer=lambda n: f.allreduce_steps(n, "ring"),
            integer=True, wrong={"N − 1 (one half only)": lambda n: n - 1}),
    Numeric("tree-steps", draw={"n": [4, 8, 16, 32, 64, 128, 256, 1000, 1024]},
            answer=lambda n: f.allreduce_steps(n, "tree"), integer=True,
            wrong={"⌈log2 N⌉ (one way only)": f.tree_depth}),
    Numeric("busbw", draw={"size_bytes": SIZES, "n": RANKS[1:], "time_s": [2e-3, 5e-3, 8e-3, 10e-3, 20e-3, 40e-3, 80e-3]},
            answer=f.busbw, quantity="bandwidth", unit="GB/s", wrong={"algbw S/t": f.algbw}),
    Numeric("algbw", draw={"size_bytes": SIZES, "time_s": [2e-3, 5e-3, 8e-3, 10e-3, 20e-3, 40e-3]},
            answer=f.algbw, quantity="bandwidth", unit="GB/s"),
    Numeric("naive-ratio", draw=LINK,
            answer=lambda size_bytes, n, alpha, beta: (f.naive_allreduce_time(size_bytes, n, alpha, beta)
                                                       / f.ring_allreduce_time(size_bytes, n, alpha, beta))),
    Numeric("crossover", draw={"n": RANKS, "alpha": ALPHAS, "beta": BETAS}, answer=f.ring_crossover_bytes,
            quantity="bytes", unit="MB"),
    Choice("why-ring", draw={"n": RANKS[2:]}),
    Choice("small-messages", draw={"n": [64, 128, 256, 512, 1024], "size_bytes": [256, 1024, 4096],
                                   "alpha": 5e-6, "beta": 1 / 25e9}),
    Choice("averaging", draw={"n": [2, 4, 8], "per_gpu_batch": [8, 16, 32]},
           values=lambda n, per_gpu_batch: {"total": n * per_gpu_batch}),
    Choice("phases"),
])
