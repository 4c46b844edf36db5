"""Held-out checks of the planner's choices between data, tensor and pipeline parallelism: the three sweeps of
Narayanan et al. 2021, Sec. 5.4 (Figs. 13, 14 and 15; NVIDIA's examples/sc21/run_figure_1[345].sh), each one
model over every split of 64 A100s, whose measured order the paper states. No planner constant is fitted on
them (``published.FIT`` holds Table 1 and Llama 3's 8K run)."""
from __future__ import annotations

import pytest

from distai.lessons.capstone import published as P


def test_no_sweep_is_fitted_on():
    fitted = {P.PUBLISHED[name].model for name in P.FIT}
    assert all(sweep.model not in fitted for sweep in P.SWEEPS.values())


@pytest.mark.parametrize("nics", ["one", "per-rank"])
@pytest.mark.parametrize("global_batch", P.SWEEPS["fig13"].batches)
def test_figure_13_fastest_split_is_the_papers(global_batch, nics):
    """Takeaway #1 of the paper: TP up to a server's 8 GPUs, then PP; (TP 8, PP 8) was the fastest of
    the figure's splits at batch 32 and at batch 128 (no data parallelism: the NIC model is not read)."""
    ranking = P.sweep_ranking("fig13", global_batch, dp_ring_nics=nics)
    assert set(ranking) == {(64 // pp, pp) for pp in (1, 2, 4, 8, 16, 32)}
    assert ranking[0] == (8, 8) and P.sweep_agrees("fig13", global_batch, nics)
    # TP beyond a node falls behind every split that keeps TP inside it
    inside = [split for split in ranking if split[0] <= 8]
    assert ranking[:len(inside)] == inside


def test_what_puts_tp_16_behind_is_the_network():
    """The same splits with 16 GPUs on one NVLink domain: TP 16 no longer crosses the network and moves
    ahead of TP 2 × PP 32 (the ranking above depends on where a node ends, as the paper explains it)."""
    selene, wider = P.sweep_ranking("fig13", 128), P.sweep_ranking("fig13", 128, gpus_per_node=16)
    assert selene.index((16, 4)) > selene.index((2, 32))
    assert wider.index((16, 4)) < wider.index((2, 32))


@pytest.mark.parametrize("sweep", ["fig14", "fig15"])
def test_with_a_nic_per_rank_every_order_is_the_papers(sweep):
    """Figs. 14 and 15: the throughput falls with every step of PP (DP = 64/PP) and of TP (DP = 64/TP), at
    every batch. A data-parallel ring that uses the NICs of its ranks on a node (NCCL's channel per NIC)
    orders them all as the paper measured them."""
    for batch in P.SWEEPS[sweep].batches:
        assert P.sweep_ranking(sweep, batch, dp_ring_nics="per-rank") == list(P.SWEEPS[sweep].papers_order)


def test_with_one_nic_a_ring_the_small_batches_come_out_of_order():
    """The planner's model (one NIC a data-parallel ring) misorders the small batches, as the capstone text
    states: with one microbatch a replica, the gradient all-reduce of PP 2 (TP 2), whose ring holds 8 (4)
    ranks a node, is charged as if they shared one 25 GB/s port."""
    assert P.sweep_agrees("fig14", 512) and P.sweep_agrees("fig15", 512)
    assert P.sweep_ranking("fig14", 32)[0] == (1, 8)
    assert P.sweep_ranking("fig15", 32).index((2, 1)) > P.sweep_ranking("fig15", 32).index((4, 1))
    assert not P.sweep_agrees("fig15", 128)
