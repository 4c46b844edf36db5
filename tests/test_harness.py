import torch
import torch.distributed as dist

from distai.engine.testing import run_in_group


def _sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def test_run_in_group_returns_every_rank_result():
    assert run_in_group(_sum_of_ranks, 3) == [3.0, 3.0, 3.0]
