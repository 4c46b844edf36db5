"""The serving planner against published serving runs it was not fitted on (lessons/lesson7/published.py):
the roofline is a floor under every one of them, and so is the planner, whose all-reduces inside a node are
NCCL's own model of them (lesson1.formulas.nccl_ring_allreduce)."""
from __future__ import annotations

import pytest

from distai.lessons.lesson1 import formulas as f1
from distai.lessons.lesson7 import planner as pl
from distai.lessons.lesson7 import published as pub


@pytest.mark.parametrize("name", list(pub.PUBLISHED))
def test_the_roofline_and_the_planner_are_floors_under_every_published_run(name):
    assert 0 < pub.roofline_only(name) <= pub.predicted(name) < pub.published(name), name


def test_the_8_gpu_batch_1_all_reduces_are_nccls_ll_protocol_and_the_alpha_beta_ring_overestimates_them():
    """The run the α-β ring (α 5 µs a step) put above its published step: 160 all-reduces of 16 KiB on 8 A100s.
    NCCL sends them with LL, 6.6 µs + 14 steps of 0.6 µs, plus 1.75 × 16 KiB at a quarter of 300 GB/s."""
    run = pub.PUBLISHED["gpt-fast-70b-tp8"]
    hw, wl = pl.Hardware(gpus=8, **run.hardware), pl.Workload(prompt=run.prompt, output=run.output)
    stage = pl.stage_decode_time(run.model, hw, wl, 8, 1, 1)
    one = 6.6e-6 + 14 * 0.6e-6 + 14 / 8 * 16384 / (300e9 / 4)
    assert f1.nccl_ring_allreduce(16384, 8, 300e9) == pytest.approx(
        {"time_s": one, "protocol": "LL", "times_s": pytest.approx(
            {"LL": one, "LL128": 14e-6 + 14 * 1.9e-6 + 14 / 8 * 16384 / (0.92 * 300e9),
             "Simple": 8.4e-6 + 14 * 3.4e-6 + 14 / 8 * 16384 / 300e9})})
    assert stage["comm"] == pytest.approx(160 * one)
    ring = pl.stage_decode_time(run.model, pl.Hardware(gpus=8, nccl_allreduce=False, **run.hardware), wl, 8, 1, 1)
    assert ring["comm"] == pytest.approx(160 * f1.ring_allreduce_time(16384, 8, 5e-6, 1 / 300e9))
    assert ring["time"] > pub.published("gpt-fast-70b-tp8") > stage["time"]
    # and the planner orders gpt-fast's TP 2, 4, 8 as they were measured
    names = ("gpt-fast-70b-tp2", "gpt-fast-70b-tp4", "gpt-fast-70b-tp8")
    assert sorted(names, key=pub.predicted) == sorted(names, key=pub.published)


def test_nccls_protocols_cross_where_their_latency_and_bandwidth_do():
    """LL for small messages, Simple for large (NCCL's tuner picks the fastest); one GPU costs nothing."""
    assert f1.nccl_ring_allreduce(16384, 8, 450e9)["protocol"] == "LL"
    assert f1.nccl_ring_allreduce(1 << 30, 8, 450e9)["protocol"] == "Simple"
    assert f1.nccl_ring_allreduce(1 << 30, 1, 450e9)["time_s"] == 0.0
    with pytest.raises(ValueError):
        f1.nccl_ring_allreduce(16384, 8, 0.0)


def test_published_figures_are_read_as_their_sources_state_them():
    assert pub.published("gpt-fast-70b-tp4") == pytest.approx(1 / 38.01)  # tokens/s at batch 1
    # LMDeploy: 2048 tokens at 32.38 tokens/s, the first after 0.074 s, the other 2047 one step each
    assert pub.published("lmdeploy-70b-tp4") == pytest.approx((2048 / 32.38 - 0.074) / 2047)
    assert pub.published("trtllm-70b-h100-2048") == 0.109 and pub.PUBLISHED["trtllm-70b-h100-2048"].model.dtype_bytes == 1
    assert {r.metric for r in pub.PUBLISHED.values()} == {"tpot", "ttft"}


def test_error_table_and_worst_errors():
    rows = pub.error_table()
    assert [r["name"] for r in rows] == list(pub.PUBLISHED)
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted_s"] / r["published_s"] - 1)
    assert pub.worst_error("tpot") == max(abs(r["error"]) for r in rows if r["metric"] == "tpot")
    low, high = pub.roofline_shares("tpot")
    assert 0 < low <= high < 1


def test_calc_serve_says_how_far_published_runs_were_from_its_times(capsys):
    """`calc serve` prints roofline times; its last line says, in the learner's language, how much longer the
    published batch-1 runs took than the planner's times for them (from this module, not typed in)."""
    from distai.lessons.units import format_fixed
    from distai.tutor.cli import main

    lo, hi = pub.published_over_predicted("ttft")
    assert 1 < lo <= hi and pub.published_over_predicted("tpot")[0] > 1  # a floor under every run
    args = ["calc", "serve", "--params", "69B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads",
            "8", "--gpus", "8", "--gpu-memory", "80GB", "--hbm-bandwidth", "3.35TB/s", "--ttft-slo", "1s",
            "--tpot-slo", "50ms"]
    for lang, words in (("en", "published batch-1 runs took"), ("es", "las ejecuciones publicadas con batch 1")):
        assert main([*args, "--lang", lang]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert words in out and f"{format_fixed(lo, 2, lang)}–{format_fixed(hi, 2, lang)}" in out
