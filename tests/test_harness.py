import pytest
import torch
import torch.distributed as dist

from distai.engine.testing import run_in_group

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another


def _sum_of_ranks(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def test_run_in_group_returns_every_rank_result():
    assert run_in_group(_sum_of_ranks, 3) == [3.0, 3.0, 3.0]


def _rank_1_never_returns(rank, world_size):
    import time

    if rank == 1:
        time.sleep(600)  # stuck outside any collective, as a deadlocked rank would be
    return rank


def test_a_rank_stuck_after_its_peer_exited_fails_with_its_stack_instead_of_stalling():
    import time

    import pytest

    start = time.monotonic()
    with pytest.raises(RuntimeError) as stuck:
        run_in_group(_rank_1_never_returns, 2, stuck_after_s=2)
    assert time.monotonic() - start < 60
    message = str(stuck.value)
    assert message.startswith("rank(s) [1] still running 2 s after a peer exited")
    assert "_rank_1_never_returns" in message  # the stuck rank's Python stack


def _rank_0_fails_while_rank_1_waits_for_it(rank, world_size):
    import time

    if rank == 0:
        raise ValueError("rank 0 could not join the next group")
    time.sleep(600)  # waiting for rank 0 in a rendezvous that never comes
    return rank


def test_a_failed_rank_is_reported_at_once_with_its_traceback_and_its_waiting_peers_stacks():
    """A rank's failure written by the worker (it exits 0) left its peer waiting: CI spent 120 s before
    saying "rank 0 still running after a peer exited", without the peer's traceback."""
    import time

    start = time.monotonic()
    with pytest.raises(RuntimeError) as failed:
        run_in_group(_rank_0_fails_while_rank_1_waits_for_it, 2)  # the default grace: 180 s
    assert time.monotonic() - start < 60
    message = str(failed.value)
    assert message.startswith("rank 0 failed:") and "could not join the next group" in message
    assert "_rank_0_fails_while_rank_1_waits_for_it" in message.split("were at:")[1]  # rank 1's stack
