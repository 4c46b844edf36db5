"""Lesson 7 planner and ``distai calc serve``: Llama-2-70B on 8 × 80 GB H100s, numbers equal to the
formulas', rejections with their reasons, ranking by throughput within the SLO."""
from __future__ import annotations

import json

import pytest

from distai.lessons.lesson1.formulas import nccl_ring_allreduce, ring_allreduce_time
from distai.lessons.lesson7 import formulas as f
from distai.lessons.lesson7 import planner as pl
from distai.tutor.cli import main

M = pl.llama2_70b()
HW = pl.h100_node(8)
WL = pl.Workload(prompt=2048, output=2048, ttft_slo=1.0, tpot_slo=0.05)
ARGS = ["calc", "serve", "--params", "69B", "--layers", "80", "--hidden", "8192", "--heads", "64",
        "--kv-heads", "8", "--gpus", "8", "--gpu-memory", "80GB", "--hbm-bandwidth", "3.35TB/s",
        "--ttft-slo", "1s", "--tpot-slo", "50ms"]


@pytest.fixture(scope="module")
def result():
    return pl.plan(M, HW, WL)


def _find(result, tp, pp):
    for c in result["accepted"] + result["rejected"]:
        if (c.tp, c.pp) == (tp, pp):
            return c
    raise KeyError((tp, pp))


def test_every_split_of_8_gpus_is_considered(result):
    got = sorted((c.tp, c.pp, c.replicas) for c in result["accepted"] + result["rejected"])
    assert got == sorted((t, p, 8 // (t * p)) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if 8 % (t * p) == 0)
    assert all(c.tp * c.pp * c.replicas == 8 for c in result["accepted"] + result["rejected"])


def test_tp1_does_not_fit_fp16_weights(result):
    c = _find(result, 1, 1)
    assert not c.accepted and c.reason == "memory"
    assert c.weights_per_gpu_bytes == pytest.approx(138e9)
    assert "weights 138 GB per GPU exceed the 72 GB usable" in c.detail  # 3 digits, as every size


def test_tp2_fits_weights_with_little_room_for_kv(result):
    c = _find(result, 2, 1)
    assert c.weights_per_gpu_bytes == pytest.approx(69e9)
    kv_seq = f.kv_cache_total(80, 8, 128, 2, 4096, tp=2)["per_gpu_bytes"]
    assert c.kv_per_seq_per_gpu_bytes == kv_seq
    assert c.max_seqs == f.max_kv_tokens(72e9 - 69e9, kv_seq / 4096) // 4096 == 4


def test_numbers_equal_the_formulas(result):
    c = _find(result, 4, 1)
    assert c.accepted
    b = c.batch
    kv_mean = f.kv_cache_total(80, 8, 128, 2, 2048 + 1024, tp=4)["per_gpu_bytes"]
    want_tpot = (f.decode_time_per_token(69e9 / 4, 2 * 69e9 / 4, kv_mean, 989e12, 3.35e12, b)
                 + f.tp_decode_comm_time(80, 8192, b, 4, None, 1 / 450e9))
    assert c.tpot_s == pytest.approx(want_tpot, rel=1e-12)
    # inside a node the all-reduces are NCCL's model of them (its fastest protocol at the message's size)
    assert c.comm_per_token_s == pytest.approx(2 * 80 * nccl_ring_allreduce(b * 8192 * 2, 4, 450e9)["time_s"])
    want_ttft = (f.prefill_time(69e9 / 4, 2048, 2 * 69e9 / 4, 989e12, 3.35e12)
                 + f.tp_decode_comm_time(80, 8192, 2048, 4, None, 1 / 450e9))
    assert c.ttft_s == pytest.approx(want_ttft, rel=1e-12)
    assert c.throughput_tokens_per_s == pytest.approx(c.replicas * b / want_tpot)
    # the batch is the largest the memory allows, or the TPOT target: one more would break a limit
    assert b <= c.max_seqs
    assert b == c.max_seqs or pl.tpot(M, HW, WL, 4, 1, b + 1)[0] > WL.tpot_slo
    # decode at this batch is memory-bandwidth bound: bytes/bandwidth > FLOPs/peak
    assert f.decode_step_bytes(2 * 69e9 / 4, kv_mean, b) / 3.35e12 > f.forward_flops(69e9 / 4, b) / 989e12
    assert c.decode_bound == "memory-bandwidth"


def test_fp8_serving_halves_weights_and_kv_but_not_the_all_reduces():
    """The audit: --dtype fp8 made the TP all-reduces and PP hops 1 byte a value. FP8 serving keeps its
    weights and KV cache in 8 bits, but its GEMMs write bf16, which the all-reduces sum."""
    fp8, bf16 = pl.llama2_70b(dtype_bytes=1), M
    assert (fp8.activation_bytes, bf16.activation_bytes, pl.llama2_70b(dtype_bytes=4).activation_bytes) == (2, 2, 4)
    for tp, pp in ((4, 1), (4, 2)):
        # everything but the stages' prefill is the same: the all-reduces and the hops carry bf16 in both
        prefill = {m: f.prefill_time(*pl.stage_params(m, tp, pp)[:1], WL.prompt, pl.stage_params(m, tp, pp)[1],
                                     HW.flops, HW.bandwidth) for m in (fp8, bf16)}
        rest = {m: pl.ttft(m, HW, WL, tp, pp) - pp * prefill[m] for m in (fp8, bf16)}
        assert rest[fp8] == pytest.approx(rest[bf16], rel=1e-12) and rest[bf16] > 0
        assert pl.hop_time(fp8, HW, WL.prompt, tp, pp) == pl.hop_time(bf16, HW, WL.prompt, tp, pp)


def test_pipeline_tpot_is_stages_in_turn(result):
    c = _find(result, 4, 2)
    st = pl.stage_decode_time(M, HW, WL, 4, 2, c.microbatch_size)
    assert c.microbatches == 2 and c.microbatch_size * 2 >= c.batch
    assert c.tpot_s == pytest.approx(2 * st["time"])
    kv_mean = f.kv_cache_total(80, 8, 128, 2, 3072, tp=4, pp=2)["per_gpu_bytes"]
    assert st["roofline"] == pytest.approx(f.decode_time_per_token(69e9 / 8, 2 * 69e9 / 8, kv_mean, 989e12, 3.35e12,
                                                                   c.microbatch_size))
    assert st["comm"] == pytest.approx(f.tp_decode_comm_time(40, 8192, c.microbatch_size, 4, None, 1 / 450e9))


def test_ranked_by_throughput_within_slo(result):
    acc = result["accepted"]
    assert acc and result["best"] is acc[0]
    thr = [c.throughput_tokens_per_s for c in acc]
    assert thr == sorted(thr, reverse=True)
    assert all(c.tpot_s <= WL.tpot_slo and c.ttft_s <= WL.ttft_slo for c in acc)
    # the best uses tensor parallelism inside the node and keeps the whole model within 8 GPUs
    assert result["best"].tp >= 4


def test_tight_slo_rejects_with_reasons():
    r = pl.plan(M, HW, pl.Workload(prompt=2048, output=2048, ttft_slo=0.08, tpot_slo=0.02))
    reasons = {(c.tp, c.pp): c.reason for c in r["rejected"]}
    assert reasons[(1, 1)] == "memory"
    assert reasons[(1, 2)] in ("tpot", "ttft")  # one GPU's bandwidth per stage: too slow per token
    for c in r["rejected"]:
        if c.reason == "tpot":
            assert c.tpot_at_1_s > 0.02 and "exceeds the 20 ms target" in c.detail
        if c.reason == "ttft":
            assert c.ttft_s > 0.08
    for c in r["accepted"]:
        assert c.tpot_s <= 0.02 and c.ttft_s <= 0.08


def test_kv_heads_shape_rejection():
    m = pl.ModelSpec(params=7e9, layers=32, hidden=4096, heads=32, kv_heads=8)
    r = pl.plan(m, pl.h100_node(16), WL)
    c = next(c for c in r["rejected"] + r["accepted"] if c.tp == 16)
    # 16 > 8 KV heads: replicated (allowed, like vLLM); 32 query heads split 16 ways
    assert c.reason != "shape"
    m3 = pl.ModelSpec(params=7e9, layers=32, hidden=4096, heads=32, kv_heads=8)
    hw = pl.Hardware(gpus=12, gpu_memory=80e9, bandwidth=3.35e12)
    r = pl.plan(m3, hw, WL)
    c = next(c for c in r["rejected"] if c.tp == 3)
    assert c.reason == "shape" and "3" in c.detail


def _run(capsys, argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_text_and_json_agree(result, capsys):
    code, out, err = _run(capsys, ARGS)
    assert code == 0, err
    assert "Rejected:" in out and "138 GB per GPU exceed" in out
    best = result["best"]
    assert f"→ TP = {best.tp}, PP = {best.pp}" in out
    code, out, err = _run(capsys, ARGS + ["--json"])
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"best", "accepted", "rejected", "inputs"}
    assert [(c["tp"], c["pp"], c["replicas"]) for c in data["accepted"]] == \
        [(c.tp, c.pp, c.replicas) for c in result["accepted"]]
    best = data["best"]
    assert best["tpot_s"] == pytest.approx(result["best"].tpot_s)
    assert best["throughput_tokens_per_s"] == pytest.approx(result["best"].throughput_tokens_per_s)
    for key in ("weights_per_gpu_bytes", "kv_per_seq_per_gpu_bytes", "max_seqs", "batch", "ttft_s", "tpot_s",
                "decode_bound", "throughput_tokens_per_s", "reason", "detail", "batch_limit"):
        assert key in best
    assert data["rejected"][0]["reason"] == "memory" and data["rejected"][0]["ttft_s"] is None
    assert data["inputs"]["head_dim"] == 128 and data["inputs"]["kv_heads"] == 8
    assert data["inputs"]["allreduce_model"] == "nccl" and data["inputs"]["alpha_s"] == pl.MESSAGE_ALPHA


def test_alpha_puts_the_alpha_beta_ring_back_in_place_of_nccls_model(capsys):
    """`--alpha` (a latency one's link measured) prices the all-reduces inside a node with the α-β ring;
    without it they are NCCL's model. Batch-1 TPOT of TP 4: the roofline plus 160 all-reduces of 16 KiB."""
    tpot_at_1 = {}
    for extra, model in (([], "nccl"), (["--alpha", "2us"], "alpha-beta")):
        code, out, err = _run(capsys, ARGS + extra + ["--json"])
        assert code == 0, err
        data = json.loads(out)
        assert data["inputs"]["allreduce_model"] == model
        tpot_at_1[model] = next(c for c in data["accepted"] if (c["tp"], c["pp"]) == (4, 1))["tpot_at_1_s"]
    # and the text says which model priced them
    assert "All-reduces inside a node: NCCL's model" in _run(capsys, ARGS)[1]
    assert "All-reduces inside a node: the α-β ring, α = 2 µs a step" in _run(capsys, ARGS + ["--alpha", "2us"])[1]
    ring = 2 * 80 * ring_allreduce_time(8192 * 2, 4, 2e-6, 1 / 450e9)
    nccl = 2 * 80 * nccl_ring_allreduce(8192 * 2, 4, 450e9)["time_s"]
    assert tpot_at_1["alpha-beta"] - tpot_at_1["nccl"] == pytest.approx(ring - nccl, rel=1e-9)


@pytest.mark.parametrize("bad,msg", [
    (["--gpus", "0"], "--gpus"),
    (["--hbm-bandwidth", "fast"], "--hbm-bandwidth"),
    (["--kv-heads", "7"], "--kv-heads"),
    (["--memory-util", "1.5"], "--memory-util"),
    (["--tpot-slo", "-1ms"], "--tpot-slo"),
    (["--dtype", "int3"], "--dtype"),
])
def test_cli_bad_input_one_line_error(bad, msg, capsys):
    args = list(ARGS)
    for i in range(0, len(bad), 2):
        if bad[i] in args:
            args[args.index(bad[i]) + 1] = bad[i + 1]
        else:
            args += bad[i:i + 2]
    code, out, err = _run(capsys, args)
    assert code == 2
    assert err.startswith("distai: error: ") and err.count("\n") == 1, err
    assert msg in err and "Traceback" not in err and out == ""
