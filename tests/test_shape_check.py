"""One shape check (lessons/model_size.refusals), one verdict: a grid of model shapes and degrees
walked through every caller — the formulas, the calculators (memory, tp-comm, kvcache, serve, plan),
the planners, the engine's model and decode path, the capstone's pre-launch check — each gives
exactly the reasons the one check gives for what that caller splits, or none."""
from __future__ import annotations

import itertools
import json

import pytest

from distai.engine.mesh_args import MeshShape, check_decode, check_plan, decode_launch_ranks, launch_ranks
from distai.lessons.calculator import CalcError
from distai.lessons.capstone.calc_plan import CALCULATOR as CALC_PLAN
from distai.lessons.context import formulas as f9
from distai.lessons.lesson2 import formulas as f2
from distai.lessons.lesson2.calc_memory import CALCULATOR as CALC_MEMORY
from distai.lessons.lesson4 import formulas as f4
from distai.lessons.lesson4.calc_tp_comm import CALCULATOR as CALC_TP_COMM
from distai.lessons.lesson7 import formulas as f7
from distai.lessons.lesson7 import planner as serving
from distai.lessons.lesson7.calc_kvcache import CALCULATOR as CALC_KVCACHE
from distai.lessons.lesson7.calc_serve import CALCULATOR as CALC_SERVE
from distai.lessons.model_size import ModelSize, Refusal, ShapeError, explain, refusals
from distai.lessons.model_spec import ModelSpec
from distai.tutor.cli import main

# (heads, kv_heads, hidden, vocab, seq, layers): MHA, GQA, MQA, odd head counts, odd vocabularies
SHAPES = [(8, 2, 128, 512, 24, 4), (8, 8, 128, 96, 16, 3), (6, 3, 96, 64, 18, 6), (4, 1, 64, 100, 32, 5),
          (12, 4, 192, 48, 36, 8)]
TPS, PPS = (1, 2, 3, 4, 6, 8, 16), (1, 2, 3, 6)
GRID = list(itertools.product(SHAPES, TPS, PPS))


def reason(call) -> str:
    """The one-line error of ``call()``, or "" when it accepts."""
    try:
        call()
    except (ValueError, CalcError) as exc:
        return str(exc)
    return ""


def model(shape) -> ModelSize:
    heads, kv, hidden, vocab, seq, layers = shape
    return ModelSize(heads=heads, kv_heads=kv, hidden=hidden, vocab=vocab, seq=seq, layers=layers,
                     tie_embeddings=False)


@pytest.mark.parametrize("shape,tp,pp", GRID)
def test_every_caller_gives_the_one_verdict(shape, tp, pp):
    heads, kv, hidden, vocab, seq, layers = shape
    m = model(shape)
    for sp in (False, True):
        # the formulas: lesson 2's check, activations, lesson 4's collectives
        want = explain(refusals(tp=tp, sequence_parallel=sp, hidden=hidden, heads=heads, kv_heads=kv, seq=seq))
        assert reason(lambda: f2.check_tp_degree(tp, hidden=hidden, heads=heads, kv_heads=kv, seq=seq,
                                                 sequence_parallel=sp)) == want
        want = explain(refusals(tp=tp, sequence_parallel=sp, hidden=hidden, heads=heads, seq=seq))
        assert reason(lambda: f2.activation_bytes_per_layer(seq, 1, hidden, heads, tp, sp)) == want
        given = {"params": "1M", "layers": str(layers), "hidden": str(hidden), "seq": str(seq), "micro_batch": "1",
                 "heads": str(heads), "tp": str(tp), "sequence_parallel": sp}
        assert reason(lambda: CALC_MEMORY.run(given)) == want
        want = explain(refusals(tp=tp, sequence_parallel=sp, hidden=hidden, seq=seq))
        assert reason(lambda: f4.tp_comm_per_layer(hidden, seq, 1, tp, sp)) == want
        assert reason(lambda: CALC_TP_COMM.run({"hidden": str(hidden), "seq": str(seq), "tp": str(tp),
                                                "sequence_parallel": sp})) == want
        # the engine's model: what tensor-parallel training splits (heads, hidden, MLP, vocabulary, KV heads)
        want = explain(refusals(tp=tp, sequence_parallel=sp, heads=heads, kv_heads=kv, hidden=hidden,
                                ffn=4 * hidden, vocab=vocab, seq=seq))
        assert reason(lambda: m.check_tp(tp, sp)) == want

    # lesson 7: the KV cache (TP over KV heads, PP over layers), the decode path, the serving planner
    want = explain(refusals(tp=tp, kv_heads=kv, pp=pp, layers=layers))
    assert reason(lambda: f7.kv_cache_total(layers, kv, hidden // heads, 2, 1024, tp, pp)) == want
    assert reason(lambda: CALC_KVCACHE.run({"layers": str(layers), "kv_heads": str(kv), "head_dim": "16",
                                            "tokens": "1024", "tp": str(tp), "pp": str(pp)})) == want
    want = explain(refusals(tp=tp, pp=pp, heads=heads, kv_heads=kv, hidden=hidden, ffn=4 * hidden, layers=layers))
    assert reason(lambda: check_decode(m, tp=tp, pp=pp)) == want
    argv = ["--tp", str(tp), "--pp", str(pp), "--heads", str(heads), "--kv-heads", str(kv), "--hidden", str(hidden),
            "--layers", str(layers), "--vocab", str(vocab)]  # distai run lesson7's check: its Llama shape, SwiGLU
    want = explain(refusals(tp=tp, pp=pp, heads=heads, kv_heads=kv, hidden=hidden, ffn=3 * hidden, layers=layers))
    assert reason(lambda: decode_launch_ranks(argv, None, 2, False)) == want
    want = explain(refusals(tp=tp, pp=pp, heads=heads, kv_heads=kv, hidden=hidden, layers=layers))
    spec = ModelSpec(params=1e6, layers=layers, hidden=hidden, heads=heads, kv_heads=kv)
    c = serving.evaluate(spec, serving.Hardware(gpus=tp * pp, gpu_memory=80e9, bandwidth=3e12), serving.Workload(),
                         tp, pp)  # what calc serve runs for each split (test_calc_serve_gives_it_too: the whole)
    assert (c.detail if c.reason == "shape" else "") == want

    # the capstone: its planner (with --sp on: SP whenever tp > 1; stages with the embedding and output slots) ...
    want = explain(refusals(tp=tp, sequence_parallel=tp > 1, heads=heads, kv_heads=kv, hidden=hidden, vocab=vocab,
                            seq=seq, pp=pp, stages="with-ends", layers=layers))
    given = {"params": "1M", "layers": str(layers), "hidden": str(hidden), "heads": str(heads), "kv_heads": str(kv),
             "seq": str(seq), "vocab": str(vocab), "global_batch": "64", "gpus": str(tp * pp), "gpu_memory": "80GB",
             "tp": str(tp), "pp": str(pp), "dp": "1", "tp_across_nodes": True, "sp": "on"}
    assert reason(lambda: CALC_PLAN.run(given)) == want
    # with sequence parallelism left to the search (the default), only what tp and pp alone refuse
    want = explain(refusals(tp=tp, sequence_parallel=False, heads=heads, kv_heads=kv, hidden=hidden, vocab=vocab,
                            seq=seq, pp=pp, stages="with-ends", layers=layers))
    assert reason(lambda: CALC_PLAN.run(dict(given, sp="any"))) == want
    # ... and its run (SP always, pp·v equal stages): the check every rank makes and distai run's before launching
    want = explain(refusals(tp=tp, sequence_parallel=True, heads=heads, kv_heads=kv, hidden=hidden, ffn=4 * hidden,
                            vocab=vocab, seq=seq, pp=pp, stages="even", layers=layers))
    assert reason(lambda: check_plan(MeshShape(pp, 1, tp), tp * pp, m, microbatches=2 * pp,
                                     schedule="1f1b")) == want
    argv = ["--tp", str(tp), "--pp", str(pp), "--dp", "1", "--heads", str(heads), "--hidden", str(hidden),
            "--vocab", str(vocab), "--seq", str(seq), "--layers", str(layers)]
    if kv == heads:  # the capstone trains GPT-2's shape (multi-head attention)
        assert reason(lambda: launch_ranks(argv, None, 8, False)) == want


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_calc_serve_gives_it_too(shape):
    heads, kv, hidden, _vocab, _seq, layers = shape
    serve = CALC_SERVE.run({"params": "1M", "layers": str(layers), "hidden": str(hidden), "heads": str(heads),
                            "kv_heads": str(kv), "gpus": "24", "gpu_memory": "80GB", "hbm_bandwidth": "3TB/s",
                            "ttft_slo": "1s", "tpot_slo": "50ms"})
    for c in serve["accepted"] + serve["rejected"]:
        want = explain(refusals(tp=c["tp"], pp=c["pp"], heads=heads, kv_heads=kv, hidden=hidden, layers=layers))
        assert (c["detail"] if c["reason"] == "shape" else "") == want


@pytest.mark.parametrize("experts,ep", list(itertools.product((1, 6, 8, 12), (1, 2, 3, 4, 8))))
def test_every_expert_caller_gives_the_one_verdict(experts, ep):
    """Lesson 8's formulas, its calculator and the engine's MoE layer: ep divides the experts."""
    from distai.engine.moe import MoEConfig
    from distai.lessons.experts import formulas as f8
    from distai.lessons.experts.calc_moe import CALCULATOR as CALC_MOE

    want = explain(refusals(ep=ep, experts=experts))
    assert reason(lambda: f8.experts_per_rank(experts, ep)) == want
    assert reason(lambda: MoEConfig(experts=experts, top_k=1).check_ep(ep)) == want
    given = {"layers": "2", "hidden": "64", "ffn": "128", "experts": str(experts), "top_k": "1", "vocab": "100",
             "heads": "4", "kv_heads": "2", "ep": str(ep)}
    assert reason(lambda: CALC_MOE.run(given)) == want


def test_the_kv_rule_splits_replicates_or_refuses():
    """Split when tp divides the KV heads, replicate when the KV heads divide tp (vLLM), else refuse."""
    assert f7.kv_heads_per_gpu(8, 4) == 2 and f7.kv_heads_per_gpu(8, 16) == 1 and f7.kv_heads_per_gpu(1, 8) == 1
    assert refusals(tp=16, heads=64, kv_heads=8) == []  # Llama-2-70B on 16 GPUs: each KV head on 2 ranks
    assert refusals(tp=4, kv_heads=6) == [Refusal("tp", "kv_heads", (("tp", 4), ("size", 6)))]
    assert refusals(tp=6, kv_heads=4)[0].rule == "kv_heads"


@pytest.mark.parametrize("degrees,rules", [
    ({"cp": 4, "seq": 18}, ["seq_cp"]),
    ({"cp": 3, "zigzag": True, "seq": 18}, []),
    ({"cp": 3, "zigzag": True, "seq": 15}, ["seq_cp_zigzag"]),
    ({"cp": 2, "tp": 4, "sequence_parallel": True, "seq": 12}, ["seq_sp_cp"]),
    ({"pp": 2, "chunks": 3, "layers": 5}, ["stages"]),
    ({"pp": 2, "chunks": 2, "stages": "even", "layers": 6}, ["even_stages"]),
    ({"pp": 6, "stages": "with-ends", "layers": 10}, []),  # 10 + 2 = 6 × 2: the ends take a slot each
    ({"ep": 3, "experts": 8}, ["experts"]),
])
def test_context_pipeline_and_expert_rules(degrees, rules):
    assert [r.rule for r in refusals(**degrees)] == rules


def test_context_parallel_formulas_use_the_one_check():
    with pytest.raises(ShapeError, match="^context parallelism needs cp = 3 to divide the sequence length 100$"):
        f9.activation_bytes_per_layer(100, 1, 64, 4, cp=3)


@pytest.mark.parametrize("locale,line", [
    ("C.UTF-8", "tp = 3 neither divides the 8 KV heads nor is a multiple of them"),
    ("es_ES.UTF-8", "tp = 3 ni divide las 8 cabezas KV ni es múltiplo de ellas"),
])
def test_the_learner_reads_the_reason_in_their_language(locale, line, monkeypatch, capsys):
    monkeypatch.setenv("LANG", locale)
    code = main(["calc", "kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "4096",
                 "--tp", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"distai: error: {line}") and len(err.strip().splitlines()) == 1


def test_the_engine_raises_one_english_line():
    with pytest.raises(ShapeError) as refused:
        ModelSize.preset("llama-tiny").check_degrees(tp=3, pp=5)
    assert str(refused.value) == (
        "tp = 3 does not divide the 8 attention heads; tp = 3 does not divide the hidden size 128; tp = 3 does not "
        "divide the vocabulary of 512 tokens; tp = 3 neither divides the 2 KV heads nor is a multiple of them (each "
        "rank holds whole KV heads, or one replicated); pp = 5 pipeline stages are more than the 4 layers")
    assert json.dumps([r.rule for r in refused.value.refusals]) == \
        '["heads", "hidden", "vocab", "kv_heads", "stages_one_chunk"]'
