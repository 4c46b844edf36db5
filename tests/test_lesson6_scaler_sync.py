"""``DynamicLossScaler(sync_found_inf=True)`` (lessons/lesson6 dynamic.md: sharded optimizers, whose ranks hold
different gradients): an inf on one rank's shard makes every rank skip the step and back off together, where
each rank alone would disagree (one skips, the other steps and their scales part)."""
from __future__ import annotations

import pytest

from distai.engine.testing import run_in_group

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another


def _one_rank_overflows(rank: int, world_size: int) -> dict:
    import torch

    from distai.engine.loss_scaling import DynamicLossScaler

    out = {}
    for sync in (False, True):
        p = torch.nn.Parameter(torch.ones(4))
        opt = torch.optim.SGD([p], lr=0.1)
        scaler = DynamicLossScaler(init_scale=2.0 ** 16, sync_found_inf=sync)
        p.grad = torch.full((4,), float("inf") if rank == 0 else 1.0)  # rank 0's shard overflowed
        scaler.step(opt)
        record = scaler.update()
        assert record is not None and record.new_scale == scaler.get_scale()
        out[sync] = {"stepped": bool(p.detach().ne(1.0).any()), "scale": scaler.get_scale()}
    return out


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank_when_synced():
    rank0, rank1 = run_in_group(_one_rank_overflows, 2)
    # alone: rank 0 skips and halves its scale, rank 1 steps and keeps it: the replicas part
    assert (rank0[False]["stepped"], rank1[False]["stepped"]) == (False, True)
    assert rank0[False]["scale"] == 2.0 ** 15 and rank1[False]["scale"] == 2.0 ** 16
    # synced: both skip, both halve
    assert (rank0[True]["stepped"], rank1[True]["stepped"]) == (False, False)
    assert rank0[True]["scale"] == rank1[True]["scale"] == 2.0 ** 15
