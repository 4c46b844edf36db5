"""A held-out check of the planner's choice between tensor and pipeline parallelism: Narayanan et al.
2021, Fig. 13 (a 162.2B GPT on 64 A100s, every TP × PP split; NVIDIA's examples/sc21/run_figure_13.sh).
No planner constant is fitted on it (``published.FIT`` holds Table 1 and Llama 3's 8K run)."""
from __future__ import annotations

import pytest

from distai.lessons.capstone import published as P


def test_figure_13_is_not_fitted_on():
    assert not any("figure" in name for name in P.FIT)


@pytest.mark.parametrize("global_batch", P.FIGURE_13_BATCHES)
def test_the_fastest_split_is_the_papers(global_batch):
    """Takeaway #1 of the paper: TP up to a server's 8 GPUs, then PP; (TP 8, PP 8) was the fastest of
    the figure's splits at batch 32 and at batch 128."""
    ranking = P.figure_13_ranking(global_batch)
    assert set(ranking) == {(64 // pp, pp) for pp in (1, 2, 4, 8, 16, 32)}
    assert ranking[0] == P.FIGURE_13_BEST
    # TP beyond a node falls behind every split that keeps TP inside it
    inside = [split for split in ranking if split[0] <= 8]
    assert ranking[:len(inside)] == inside


def test_what_puts_tp_16_behind_is_the_network():
    """The same splits with 16 GPUs on one NVLink domain: TP 16 no longer crosses the network and moves
    ahead of TP 2 × PP 32 (the ranking above depends on where a node ends, as the paper explains it)."""
    selene, wider = P.figure_13_ranking(128), P.figure_13_ranking(128, gpus_per_node=16)
    assert selene.index((16, 4)) > selene.index((2, 32))
    assert wider.index((16, 4)) < wider.index((2, 32))
