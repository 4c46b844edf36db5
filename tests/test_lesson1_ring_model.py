"""The pure ring model: its chunk schedule reduces correctly for every N from 2 to 16."""
import numpy as np
import pytest

from distai.lessons.lesson1 import ring_model as rm


@pytest.mark.parametrize("n", range(2, 17))
def test_schedule_reduces_to_the_sum_on_every_rank(n):
    rng = np.random.default_rng(n)
    for length in (n, 3 * n + 1, 5 * n - 1, 1, n - 1, 97):
        buffers = [rng.integers(-1000, 1000, size=length) for _ in range(n)]
        out = rm.simulate(buffers)
        expected = np.sum(buffers, axis=0)
        for r in range(n):
            np.testing.assert_array_equal(out[r], expected, err_msg=f"N={n} length={length} rank={r}")


@pytest.mark.parametrize("n", range(2, 17))
def test_each_rank_owns_one_finished_chunk_after_reduce_scatter(n):
    length = 4 * n + 3
    buffers = [np.full(length, 1 << r, dtype=np.int64) for r in range(n)]  # bit r marks rank r
    mid = rm.simulate(buffers, steps=n - 1)
    bounds = rm.chunk_bounds(length, n)
    full = (1 << n) - 1
    for r in range(n):
        owned = rm.owned_chunk(r, n)
        a, b = bounds[owned]
        assert np.all(mid[r][a:b] == full)
        # every other chunk of rank r is still partial
        for c in range(n):
            if c != owned and bounds[c][1] > bounds[c][0]:
                assert not np.all(mid[r][slice(*bounds[c])] == full)


@pytest.mark.parametrize("n", range(2, 17))
def test_schedule_shape_and_stream_property(n):
    sched = rm.schedule(n)
    assert len(sched) == 2 * (n - 1) == rm.num_steps(n)
    for step, transfers in enumerate(sched):
        phase, _ = rm.phase_of(step, n)
        assert [t.src for t in transfers] == list(range(n))
        assert all(t.dst == (t.src + 1) % n for t in transfers)
        assert all(t.reduce == (phase == rm.REDUCE_SCATTER) for t in transfers)
        # what rank r receives is what its left neighbour sends
        for r in range(n):
            assert rm.recv_chunk(r, step, n) == transfers[rm.left(r, n)].chunk
        # at every step every chunk is on the move exactly once
        assert sorted(t.chunk for t in transfers) == list(range(n))
        # a rank forwards at step s+1 the chunk it received at step s
        if step + 1 < len(sched):
            for r in range(n):
                assert rm.send_chunk(r, step + 1, n) == rm.recv_chunk(r, step, n)


@pytest.mark.parametrize("n", range(2, 17))
def test_states_count_contributions(n):
    states = list(rm.states(n))
    assert len(states) == 2 * (n - 1) + 1
    assert all(states[0].count(r, c) == 1 for r in range(n) for c in range(n))
    after_rs = states[n - 1]
    for r in range(n):
        assert after_rs.count(r, rm.owned_chunk(r, n)) == n
    assert states[-1].complete and not states[-2].complete


def test_chunk_bounds_cover_the_buffer_like_array_split():
    for n in range(1, 17):
        for length in (0, 1, n - 1, n, n + 1, 1000, 1001):
            bounds = rm.chunk_bounds(length, n)
            ref = np.array_split(np.arange(length), n)
            assert [b - a for a, b in bounds] == [len(x) for x in ref]
            assert bounds[0][0] == 0 and bounds[-1][1] == length


def test_bytes_sent_is_the_bandwidth_optimal_amount():
    assert rm.bytes_sent(1024, 4) == pytest.approx(2 * 3 / 4 * 1024)
    assert rm.bytes_sent(1024, 4, steps_done=1) == 256


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError):
        rm.num_steps(0)
    with pytest.raises(ValueError):
        rm.phase_of(6, 4)
    with pytest.raises(ValueError):
        rm.simulate([np.zeros(3), np.zeros(4)])
