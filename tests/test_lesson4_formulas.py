"""Lesson 4's scalar formulas (used by the lesson text's checks) against the per-layer dictionary
and hand-computed worked examples."""
from __future__ import annotations

import pytest

from distai.lessons.lesson1.formulas import ring_allreduce_time
from distai.lessons.lesson4 import formulas as f

MiB = 2 ** 20


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_scalar_bytes_match_the_per_layer_dict(sp, t):
    d = f.tp_comm_per_layer(4096, 2048, 2, t, sp)
    assert f.tp_comm_bytes_per_layer(4096, 2048, 2, t, sp) == d["total_bytes_per_rank"]
    # four all-reduces' worth, with or without sequence parallelism
    assert d["total_bytes_per_rank"] == pytest.approx(4 * 2 * (t - 1) / t * 4096 * 2048 * 2 * 2)


def test_gpt3_layer_worked_example():
    assert f.tp_comm_per_layer(12288, 2048, 1, 8)["tensor_bytes"] == 48 * MiB
    assert f.tp_comm_bytes_per_layer(12288, 2048, 1, 8) == 336 * MiB
    nvlink = f.tp_comm_time_per_layer(12288, 2048, 1, 8, alpha=0, beta=1 / 450e9)
    assert nvlink == pytest.approx(336 * MiB / 450e9)
    # four ring all-reduces of 48 MiB, each with its 2(t-1) latency steps
    assert f.tp_comm_time_per_layer(12288, 2048, 1, 8, alpha=5e-6, beta=1 / 450e9) == pytest.approx(
        4 * ring_allreduce_time(48 * MiB, 8, 5e-6, 1 / 450e9))


def test_vocab_parallel_loss_bytes():
    assert f.vocab_parallel_ce_bytes_per_rank(2048, 1, 1) == 0
    assert f.vocab_parallel_ce_bytes_per_rank(2048, 1, 8) == 3 * 2 * 7 / 8 * 2048 * 4
    assert f.gathered_logits_bytes_per_rank(2048, 1, 50304, 8) == 7 / 8 * 2048 * 50304 * 4
    # the ratio does not depend on s or b: V / 6 for fp32 of both
    ratio = f.gathered_logits_bytes_per_rank(512, 3, 50304, 4) / f.vocab_parallel_ce_bytes_per_rank(512, 3, 4)
    assert ratio == pytest.approx(50304 / 6)


@pytest.mark.parametrize("bad", [0, -1, 1.5, None, True])
def test_bad_inputs_raise(bad):
    with pytest.raises(ValueError):
        f.vocab_parallel_ce_bytes_per_rank(bad, 1, 2)
    with pytest.raises(ValueError):
        f.gathered_logits_bytes_per_rank(8, 1, bad, 2)
    with pytest.raises(ValueError):
        f.tp_comm_bytes_per_layer(64, 8, 1, bad)
