"""The serving planner against published serving runs it was not fitted on (lessons/lesson7/published.py):
the roofline is a floor under every one of them, and the planner's only prediction above a published run is
the α-β ring's batch-1 all-reduces on 8 GPUs, which the lesson names."""
from __future__ import annotations

import pytest

from distai.lessons.lesson7 import planner as pl
from distai.lessons.lesson7 import published as pub


@pytest.mark.parametrize("name", list(pub.PUBLISHED))
def test_the_roofline_is_a_floor_under_every_published_run(name):
    assert 0 < pub.roofline_only(name) < pub.published(name), name


def test_only_the_8_gpu_batch_1_ring_predicts_slower_than_published():
    slower = {n for n in pub.PUBLISHED if pub.predicted(n) > pub.published(n)}
    assert slower == {"gpt-fast-70b-tp8"}
    run = pub.PUBLISHED["gpt-fast-70b-tp8"]
    hw, wl = pl.Hardware(gpus=8, **run.hardware), pl.Workload(prompt=run.prompt, output=run.output)
    stage = pl.stage_decode_time(run.model, hw, wl, 8, 1, 1)
    # its all-reduces alone exceed what the measured step leaves beyond the roofline, and are most of that step
    assert stage["comm"] > pub.published("gpt-fast-70b-tp8") - stage["roofline"]
    assert stage["comm"] > 0.5 * pub.published("gpt-fast-70b-tp8")


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
    assert 1 < lo <= hi and pub.published_over_predicted("tpot")[0] < 1  # TP 8's overestimated all-reduces
    args = ["calc", "serve", "--params", "69B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads",
            "8", "--gpus", "8", "--gpu-memory", "80GB", "--bandwidth", "3.35TB/s", "--ttft-slo", "1s",
            "--tpot-slo", "50ms"]
    for lang, words in (("en", "published batch-1 runs took"), ("es", "las ejecuciones publicadas con batch 1")):
        assert main([*args, "--lang", lang]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert words in out and f"{format_fixed(lo, 2, lang)}–{format_fixed(hi, 2, lang)}" in out
