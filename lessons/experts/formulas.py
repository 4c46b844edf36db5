"""Every number lesson 8 (Mixture of Experts and expert parallelism) quotes, with its source."""
from __future__ import annotations


def all_to_all_calls_per_layer(dropless: bool = True) -> dict[str, int]:
    """All-to-alls one MoE layer runs per training step under expert parallelism: forward, the
    counts exchange (plus the owners' answer of how many they keep, under a capacity limit), the
    dispatch and the combine; backward, the dispatch's and the combine's reverses."""
    return {"fwd": 3 if dropless else 4, "bwd": 2}
