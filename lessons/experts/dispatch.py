"""A pure model of one MoE layer's dispatch under expert parallelism: what the visualizer draws.

Each of ``ep`` ranks holds ``tokens`` tokens; each token makes ``top_k`` choices among ``experts``
experts, drawn from router preferences that favour the first experts by ``skew`` (0: uniform). The
experts are sharded ``experts/ep`` per rank; a capacity factor keeps the first ``C = ceil(c·T·k/E)``
choices of each expert in (choice, source rank, token) order, GShard's priority and the order the
engine (:mod:`distai.engine.moe`) keeps. Pure Python and numpy, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formulas import capacity as capacity_of


@dataclass(frozen=True)
class Dispatch:
    ep: int
    experts: int
    top_k: int
    capacity: int | None  # per expert (None: dropless)
    routed: list[int]  # choices per expert
    kept: list[int]  # … kept under the capacity
    sent: list[list[int]]  # sent[source][destination]: kept token rows leaving each rank

    @property
    def dropped(self) -> list[int]:
        return [r - k for r, k in zip(self.routed, self.kept)]

    def owner(self, expert: int) -> int:
        return expert // (self.experts // self.ep)


def simulate(ep: int = 4, experts: int = 8, top_k: int = 2, tokens: int = 16, capacity_factor: float | None = 1.25,
             skew: float = 0.6, seed: int = 0) -> Dispatch:
    """One layer's routing of ``ep·tokens`` tokens, dropped and dispatched as the engine does."""
    rng = np.random.default_rng(seed)
    weights = np.exp(-skew * np.arange(experts) / max(1, experts - 1) * 3)
    prefs = weights / weights.sum()
    choices = np.array([[rng.choice(experts, size=top_k, replace=False, p=prefs) for _ in range(tokens)]
                        for _ in range(ep)])  # [source, token, choice]
    return plan(choices, experts, capacity_factor)


def plan(choices: np.ndarray, experts: int, capacity_factor: float | None) -> Dispatch:
    """The drops and the rows each rank sends, for ``choices[source, token, choice]`` (expert ids)."""
    ep, tokens, top_k = choices.shape
    cap = None if capacity_factor is None else capacity_of(ep * tokens, experts, top_k, capacity_factor)
    routed = np.bincount(choices.reshape(-1), minlength=experts)
    filled = np.zeros(experts, dtype=int)
    sent = np.zeros((ep, ep), dtype=int)
    local = experts // ep
    for j in range(top_k):  # first choices first, then source rank, then token
        for source in range(ep):
            for t in range(tokens):
                e = int(choices[source, t, j])
                if cap is None or filled[e] < cap:
                    filled[e] += 1
                    sent[source, e // local] += 1
    return Dispatch(ep, experts, top_k, cap, routed.tolist(), filled.tolist(), sent.tolist())
