"""``distai calc plan``: published 3D layouts come out feasible and near the top, every figure comes from
the lessons' formulas, and bad input is a one-line error (exit 2)."""
import dataclasses
import json

import pytest

from distai.lessons.capstone import formulas as fc
from distai.lessons.capstone import planner as pl
from distai.lessons.capstone import published as pub
from distai.lessons.lesson2 import formulas as f2
from distai.lessons.lesson5 import formulas as f5
from distai.tutor.cli import main

ISSUE_ARGS = ["--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads", "8",
              "--seq", "4096", "--global-batch", "1024", "--gpus", "512", "--gpu-memory", "80GB",
              "--gpus-per-node", "8"]


def issue_args_with(extra: list[str]) -> list[str]:
    """The issue's 70B example with ``extra``'s flags replacing (or added to) its own."""
    args = list(ISSUE_ARGS)
    for flag, value in zip(extra[::2], extra[1::2]):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def run(capsys, *argv):
    code = main(["calc", "plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# Runs where the planner misses the goal (top 5, within 15%), each with how far: they stay inside these
# bounds, and every other run meets the goal (python bench/planner_fit.py prints the table).
# Megatron-LM's 18.4B and 39.1B: TP 8 ranks 7th and 8th, its step 12.7% and 12.8% longer than the best
# (TP 2 or 4 with an interleaved pipeline of 4 stages: TP 8's all-reduces, 1.2 and 1.6 s a step, and its
# replicated elementwise kernels, Megatron-LM having no sequence parallelism then). Checked against Megatron-LM's
# code of 2021 and examples/sc21 (published.megatron_rank_account, what_if_run): the pipeline's blocking sends
# are counted (0.16 s of the 18.4B best's 8.27 s step, against a 1.05 s gap); the TP all-gathers of what a stage
# receives (0.015 s) are not; PyTorch's DDP on the pp = 1 runs, as NVIDIA ran them, is left out: refitted
# (E 0.63, w½ 0: no shape left in the GPU model) it ranks them 4th and 7th.
# DeepSeek-V3 (published.py): 16.7% high in MFU (14.3% short in step time, within the goal) with its FP8
# GEMMs, casts, attention kernels and DualPipe as DeepSeek published them, and the planner's full
# recomputation (its activation count knows no FP8 caching); with DeepSeek's own recomputation 36% high: a
# layer takes 25.3 ms where DeepSeek's training profile spends 29.5 ms on its compute stream (MoE permutation,
# norms, RoPE: kernels the planner does not count).
# GPT-NeoX-20B: 15.6% high in MFU (13.5% short in step time, within the goal), its throughput counted as its code
# counted it (6Ψ + 60·s·h·l a token); the planner leaves out its parallel attention and MLP, which would make it
# faster still.
RANK_MISSES = ("megatron-18.4b", "megatron-39.1b")  # issue 29's named misses: outside the top 5
ERROR_MISSES = ("deepseek-v3", "gpt-neox-20b")  # more than 15 % off in MFU (within it in step time)


def _known_misses(names: tuple[str, ...], reason: str) -> list:
    """Every published run, the named misses marked strict xfail: each must fail the goal (a miss fixed, or
    one more, fails the test) against the goal itself, not a bound set from what the planner gave."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=reason)) if n in names else n
            for n in pub.PUBLISHED]


@pytest.mark.parametrize("name", list(pub.PUBLISHED))
def test_published_layouts_are_feasible(name):
    assert pub.reproduce(name)["config"] is not None, f"{name}: the published layout does not fit"


@pytest.mark.parametrize("name", _known_misses(RANK_MISSES, "issue 29: ranked 7th and 8th (TP 8's all-reduces)"))
def test_published_layouts_are_in_the_top_5(name):
    r = pub.reproduce(name)
    assert 1 <= r["layout_rank"] <= 5, (name, r["layout_rank"], r["best"].layout)


def test_the_module_constants_are_the_fits_optimum():
    """E (A100, H100) and w½ in the planner are the least-squares optimum on pub.FIT, to the printed
    precision (E two decimals, w½ on its grid): the fit re-run, its walks started at the module's E."""
    fit = pub.fit_gpu_model(start=(pl.A100_GEMM, pl.H100_GEMM))
    assert (fit["a100"], fit["h100"], fit["half_width"]) == (pl.A100_GEMM, pl.H100_GEMM, pl.GEMM_HALF_WIDTH), fit
    assert pub.A100["gemm_peak_fraction"] == pl.A100_GEMM and pub.H100["gemm_peak_fraction"] == pl.H100_GEMM
    assert all(pub.PUBLISHED[n].cluster.gemm_half_width == pl.GEMM_HALF_WIDTH for n in pub.PUBLISHED)


@pytest.mark.parametrize("name", _known_misses(ERROR_MISSES, "more than 15 % high in MFU, within it in step time"))
def test_prediction_error_fitted_and_held_out(name):
    """The shape-aware GPU model's constants were fitted on pub.FIT only; every other run is held out and
    must come within 15% of its published MFU (step time, tokens/s or TFLOP/s turned into MFU)."""
    error = abs(pub.prediction_error(name))
    bound = 0.08 if name in pub.FIT else 0.15
    assert error <= bound, (name, pub.predicted_mfu(name), pub.published_mfu(name))


def test_error_table_splits_fitted_and_held_out():
    rows = pub.error_table()
    assert {r["set"] for r in rows} == {"fitted", "held out"}
    held = [r for r in rows if r["set"] == "held out"]
    # Korthikanti 2022, MT-NLG, OPT, BLOOM, GPT-NeoX-20B, Llama 3 (16K GPUs, 128K tokens) and DeepSeek-V3 are held out
    assert {"korthikanti-1t", "mt-nlg-530b-280", "opt-175b", "bloom-176b", "gpt-neox-20b", "llama3-405b-128k",
            "deepseek-v3"} <= {r["name"] for r in held}
    assert pub.worst_error("held out") == max(abs(r["error"]) for r in held)


def test_the_goal_in_mfu_or_step_time():
    """Issue 29's goal, "within 15 % in MFU or step time": the step time's error is the published MFU
    over the predicted one (both count the same FLOPs); every held-out run meets it, DeepSeek-V3 and
    GPT-NeoX-20B in step time only (+16.7 % and +15.6 % in MFU, -14.3 % and -13.5 % in step time)."""
    rows = pub.error_table()
    for r in rows:
        assert r["step_error"] == pytest.approx(r["published_mfu"] / r["predicted_mfu"] - 1)
        assert (r["error"] > 0) == (r["step_error"] < 0)  # a faster predicted step is a higher predicted MFU
    missed = {r["name"] for r in rows if r["set"] == "held out" and min(abs(r["error"]), abs(r["step_error"])) > 0.15}
    assert missed == set()
    assert {r["name"] for r in rows if r["set"] == "held out" and abs(r["error"]) > 0.15} == {"deepseek-v3",
                                                                                              "gpt-neox-20b"}
    assert pub.worst_error("held out", "step_error") == max(abs(r["step_error"]) for r in rows
                                                            if r["set"] == "held out")


def test_published_mfu_of_a_step_time_and_of_tokens_per_second():
    # MT-NLG on 280 nodes: 60.1 s per step of 1920 × 2048 tokens on 2240 A100s
    flops = 1920 * 2048 * (6 * 529.6e9 + 12 * 105 * 20480 * 2048)
    assert pub.published_mfu("mt-nlg-530b-280") == pytest.approx(flops / (2240 * 312e12 * 60.1))
    # DeepSeek-V3: 180K GPU hours per trillion tokens, active parameters only, MLA's attention core
    # (128 heads, q·k 192 and v 128 wide: a·(192 + 128)/2 in place of h), on the bf16 peak
    m = pub.DEEPSEEK_V3_MODEL
    assert m.attention_width == 128 * (192 + 128) / 2
    per_token = 6 * m.active_params + 12 * m.layers * m.attention_width * m.seq
    assert pub.published_mfu("deepseek-v3") == pytest.approx(1e12 / (180e3 * 3600) * per_token / 989e12)
    assert 37e9 < m.active_params < 42e9  # 37B active (DeepSeek-V3 report), plus the MTP layer it trains


def test_gpt_neox_throughput_is_counted_as_its_code_counted_it():
    # 117 TFLOP/s a GPU of 6Ψ + 60·s·h·l FLOPs a token (gpt-neox's get_flops, 2021-2023), Ψ = 20,556,201,984
    # (the model card), on the A100's 312 TFLOP/s; the MFU counts the model's 6Ψ + 12·s·h·l
    counted, model = 6 * 20.556e9 + 60 * 2048 * 6144 * 44, 6 * 20.556e9 + 12 * 2048 * 6144 * 44
    assert pub.published_mfu("gpt-neox-20b") == pytest.approx(117e12 * model / counted / 312e12)
    p = pub.PUBLISHED["gpt-neox-20b"]
    # configs/20B.yml: micro-batch 4, 32 accumulation steps, 12 data-parallel ranks; 40 GB A100s
    assert p.global_batch == 4 * 32 * 12 and p.microbatch == 4 and p.cluster.gpu_memory == 40e9


def test_gpt_neox_layout_near_the_top_and_tp8_behind():
    """Held out, nothing fitted on it: the layout GPT-NeoX-20B's authors trained on (TP 2 × PP 4) is near the
    top on their cluster, and TP 8 on one node (Megatron-LM's Table 1 choice at 18.4B) well behind."""
    place = pub.layout_place("gpt-neox-20b", (2, 4, 12))
    assert place["rank"] == pub.layout_rank("gpt-neox-20b") <= 2  # the authors' layout, 2nd at worst
    assert 0 <= place["slower"] <= 0.05  # within 5 % of the planner's best: near the top, not a pinned output
    tp8 = pub.layout_place("gpt-neox-20b", (8, 1, 12))
    assert tp8["rank"] > 5 and tp8["slower"] > 0.1
    assert pub.layout_place("gpt-neox-20b", (3, 1, 32))["rank"] == 0  # no such layout: 3 divides no head count


def test_mtnlg_micro_batch_is_not_published_and_two_would_double_the_bubble():
    # the paper states no micro-batch size: the planner takes the layout's best (1); with 2 sequences the
    # 34 bubble slots are twice as long, and 1920 / (8 · 8) = 30 microbatches are fewer than 35 stages
    name = "mt-nlg-530b-280"
    assert pub.PUBLISHED[name].microbatch is None and pub.reproduce(name)["config"].microbatch == 1
    assert pub.microbatch_error(name, 1) == pytest.approx(pub.prediction_error(name))
    assert pub.microbatch_error(name, 2) < pub.prediction_error(name)
    terms = pub.step_terms(name)
    assert terms["bubble_s"] == pytest.approx(34 * (terms["compute_s"] + terms["tp_comm_s"] + terms["pp_comm_s"]) / 240)
    with pytest.raises(ValueError):
        pub.microbatch_error(name, 8)


def test_llama3_16k_layout_is_the_planners_first_choice_and_bloom_runs_as_published():
    assert pub.layout_rank("llama3-405b-16k") == 1
    exact = pub.reproduce("bloom-176b")["exact"]  # micro-batch 2, full recomputation, ZeRO-1 at most
    assert exact is not None and exact.recompute == "full" and exact.zero <= 1 and not exact.sp
    long = pub.reproduce("llama3-405b-128k")["config"]
    assert long.cp == 16 and long.time["cp_comm_s"] > 0


def test_deepseek_v3_counts_what_its_report_states():
    """MLA's wider attention core, FP8 linear GEMMs at the FP8 peak, 112 of 132 SMs computing, and the
    expert all-to-all over InfiniBand: each changes the prediction the way it should, and DualPipe hides
    the all-to-all only as far as the compute lasts."""
    p = pub.PUBLISHED["deepseek-v3"]

    def step(model=p.model, **cluster):
        return pl.evaluate(model, dataclasses.replace(p.cluster, **cluster), p.global_batch,
                           pl.Config(1, 16, 128, 1, 1, "full", 1, False, 1, 64))

    base = step()
    assert base.time["ep_comm_s"] == 0.0  # hidden: the all-to-all is shorter than the compute
    exposed = step(expert_a2a_overlap=False)
    a2a = exposed.time["ep_comm_s"] / exposed.microbatches
    # a stage's 4 slots, 59 of 62 layers MoE; each token to 4 of the EP group's 8 nodes, 7/8 of them remote,
    # dispatch in FP8 (1 + 4/128 bytes) and bf16 combine forward, bf16 both ways backward, at 50 GB/s
    moe = 4 * 59 / 62
    per_token = 4 * 7 / 8 * 7168 * ((1 + 4 / 128 + 2) + (2 + 2))
    assert a2a == pytest.approx(moe * 4096 * per_token / 50e9)
    assert a2a < base.time["compute_s"] / base.microbatches
    assert step(linear_flops=None).step_time_s > base.step_time_s  # bf16 GEMMs: slower
    assert step(compute_share=1.0).step_time_s < base.step_time_s  # all 132 SMs computing: faster
    plain = dataclasses.replace(p.model, qk_head_dim=0, v_head_dim=0)
    assert step(model=plain).time["compute_s"] < base.time["compute_s"]  # plain attention: less work


def test_deepseek_v3_fp8_rates_casts_and_attention_come_from_deepseeks_sources():
    """The FP8 GEMM rate is DeepGEMM's TFLOP/s over its speedup, FLOP-weighted over the layer's shapes; the
    casts are the report's Sec. 3.5.2 workflow counted in bytes; the attention core is the profile's."""
    rows = pub.DEEPSEEK_V3_LINEARS
    # the shapes hold an MoE layer's linear parameters: MLA's ~187M projection parameters, the experts'
    mla = sum(k * n for name, k, n, _, _, _ in rows if name.startswith("MLA"))
    assert mla == 7168 * 2112 + 1536 * 24576 + 512 * 32768 + 16384 * 7168
    experts = sum(k * n * copies for name, k, n, copies, _, _ in rows if "expert" in name)
    assert experts == 9 * 3 * 7168 * 2048  # 1 shared + 8 routed SwiGLU experts, 2048 wide
    flops = sum(k * n * c for _, k, n, c, _, _ in rows)
    hand = flops / sum(k * n * c * s / t for _, k, n, c, t, s in rows) / (2 * 989e12)
    assert pub.deepseek_fp8_gemm_fraction() == pytest.approx(hand)
    assert 0.45 < pub.deepseek_fp8_gemm_fraction() < pub.deepseek_fp8_gemm_fraction("deepgemm") < 0.7
    # a dense layer's input cast (3 bytes), transposed again (2) and its output gradient cast twice (6)
    assert pub.deepseek_fp8_cast_bytes_per_token() == pytest.approx(sum(
        3 * k * (1 if name.startswith("routed experts gate") else c) + 2 * k * c + 6 * n * c
        for name, k, n, c, _, _ in rows))
    fraction, backward = pub.deepseek_attention_profile()
    forward_s = 4 * 4096 ** 2 * 128 * (192 + 128) / 2 * 0.5 / (fraction * 989e12 * 112 / 132)
    assert forward_s == pytest.approx((1248 + 1199 + 1280 + 1221) / 4 * 1e-6)
    assert 3 < backward < 4  # FlashAttention's backward at head dims 192/128: 3.4x its forward
    cl = pub.PUBLISHED["deepseek-v3"].cluster
    assert (cl.linear_efficiency, cl.attention_efficiency, cl.attention_backward) == (
        pub.deepseek_fp8_gemm_fraction(), fraction, backward)


def test_dualpipe_bubble_states_and_hidden_sends():
    """DualPipe (report Table 2): bubble (PP/2 - 1)(F&B + B - 3W), two stages' states per GPU, PP + 1
    microbatches of activations, the PP sends hidden; it needs even pp and microbatches, at least 2·pp."""
    p = pub.PUBLISHED["deepseek-v3"]
    config = pl.Config(1, 16, 128, 1, 1, "none", 1, False, 1, 64)
    roomy = dataclasses.replace(p.cluster, gpu_memory=1e12)
    dual = pl.evaluate(p.model, roomy, p.global_batch, dataclasses.replace(config), axes=pl.Axes(dualpipe=True))
    plain = pl.evaluate(p.model, roomy, p.global_batch, dataclasses.replace(config))
    slot = dual.time["compute_s"] / dual.microbatches
    _, fwd = pl.layer_seconds(p.model, roomy, 1, "none")
    F, B, W = fwd["total_s"], fwd["backward_s"], fwd["gemm_s"]
    assert dual.time["bubble_s"] == pytest.approx((16 / 2 - 1) * slot * (F + 2 * B - 3 * W) / (F + B))
    assert dual.time["bubble_s"] < plain.time["bubble_s"] and dual.time["pp_comm_s"] == 0 < plain.time["pp_comm_s"]
    assert dual.memory["model_states_bytes"] == pytest.approx(2 * plain.memory["model_states_bytes"])
    assert dual.memory["microbatches_in_flight"] == 17
    enough = pl.evaluate(p.model, roomy, 128 * 32, dataclasses.replace(config), axes=pl.Axes(dualpipe=True))
    assert enough.reason == "" and enough.microbatches == 32  # 2·pp
    for m in (30, 33):  # fewer than 2·pp; odd
        refused = pl.evaluate(p.model, roomy, 128 * m, dataclasses.replace(config), axes=pl.Axes(dualpipe=True))
        assert "DualPipe" in refused.reason and "DualPipe" in refused.reason_text["es"]


def test_megatron_runs_interleave_only_beyond_two_stages_and_reduce_after_the_pipeline():
    p = pub.PUBLISHED["megatron-39.1b"]
    r = pl.plan(p.model, p.cluster, p.global_batch, axes=p.axes)
    assert {c.chunks for c in r["configs"] if c.pp == 2} == {1}
    assert any(c.chunks > 1 for c in r["configs"] if c.pp > 2)
    two = pl.evaluate(p.model, p.cluster, p.global_batch, pl.Config(8, 2, 32, 2, 0, "full", 2),
                      axes=pl.Axes(engine="megatron"))
    assert "more than 2 stages" in two.reason
    published = pub.reproduce("megatron-39.1b")["config"]
    assert published.time["dp_comm_exposed_s"] > 0  # all of the all-reduce: Megatron-LM does not overlap it


def test_published_mfu_converts_megatron_counts():
    # 1T model: 163 TFLOP/s counted with recomputation (eq. 3) on 312 → MFU from 6Ψ + 12·L·h·s per token.
    p = pub.PUBLISHED["megatron-1008b"]
    counted = 96 * 3072 * 2048 * 128 * 25600 ** 2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    model = 3072 * 2048 * (6 * 1008e9 + 12 * 128 * 25600 * 2048)
    assert pub.published_mfu("megatron-1008b") == pytest.approx(163e12 * model / counted / 312e12)
    assert p.layout == (8, 64, 6, 1, 1)


def test_every_figure_comes_from_the_lessons_formulas():
    model = pl.ModelSpec(70e9, 80, 8192, 64, 8, 4096, 128256)
    cluster = pl.Cluster(512, 80e9)
    configs = pl.plan(model, cluster, 1024)["configs"]
    assert [c.step_time_s for c in configs] == sorted(c.step_time_s for c in configs)
    for c in (configs[0], configs[len(configs) // 2], configs[-1]):
        m = 1024 // (c.dp * c.microbatch)
        assert c.microbatches == m and c.tp * c.pp * c.dp == 512
        assert c.bubble_fraction == pytest.approx((c.pp - 1) / (c.chunks * m + c.pp - 1))
        stage = fc.stage_layers(80, c.pp)
        psi = 70e9 / (c.tp * c.pp)
        shard = {0: (1, 1, 1), 1: (1, 1, c.dp), 2: (1, c.dp, c.dp), 3: (c.dp, c.dp, c.dp)}[c.zero]
        per = f2.bytes_per_param("adam")  # bf16 parameters, fp32 gradient buffer, Adam's 12 bytes
        states = 2 * psi / shard[0] + 4 * psi / shard[1] + per["optimizer"] * psi / shard[2]
        stored = "selective" if c.recompute == "none" else c.recompute  # FlashAttention keeps no scores
        act = f2.activation_bytes(stage, 4096, c.microbatch, 8192, 64, c.tp, c.sp, stored)
        inflight = f5.peak_inflight_microbatches(c.pp, m, "interleaved" if c.chunks > 1 else "1f1b", c.chunks)
        assert c.memory["model_states_bytes"] == pytest.approx(states)
        mem = c.memory
        assert mem["first_stage_bytes"] == pytest.approx(
            states + mem["activations_bytes"] + mem["comm_buffers_bytes"] + mem["allocator_bytes"])
        assert mem["activations_bytes"] >= act * inflight
        assert mem["allocator_bytes"] == pytest.approx(pl.CONTEXT_BYTES + pl.ALLOCATOR_FRACTION * (
            max(mem["first_stage_bytes"], mem["last_stage_bytes"]) - mem["allocator_bytes"]))
        assert c.memory_bytes <= 80e9
        model_flops = 1024 * 4096 * (6 * 70e9 + 12 * 80 * 8192 * 4096)
        assert c.mfu == pytest.approx(model_flops / (512 * 989e12 * c.step_time_s))
        t = c.time
        assert c.step_time_s == pytest.approx(t["compute_s"] + t["tp_comm_s"] + t["cp_comm_s"] + t["pp_comm_s"]
                                              + t["ep_comm_s"] + t["bubble_s"] + t["dp_comm_exposed_s"]
                                              + t["optimizer_s"])
        # the update streams the shard whose Adam states it holds: 12 bytes read and written, the fp32
        # gradient read twice (clipping norm, update), the bf16 copy written
        owned = psi / shard[2]
        assert t["optimizer_s"] == pytest.approx(owned * (2 * per["optimizer"] + 2 * 4 + 2) / 3.35e12)


def test_tp_stays_inside_a_node_unless_allowed():
    model = pl.ModelSpec(70e9, 80, 8192, 64, 64, 4096)
    inside = pl.plan(model, pl.Cluster(256, 80e9, gpus_per_node=8), 512, axes=pl.Axes(recompute=("selective",)))
    assert max(c.tp for c in inside["configs"]) == 8
    assert any(c.tp == 16 and "node" in c.reason for c in inside["rejected"])
    # A TP of 6 on 8-GPU nodes would straddle two nodes in some groups: rejected as well.
    assert pl.shape_reason(pl.ModelSpec(1e9, 24, 1536, 12, 12, 2048), pl.Cluster(48, 80e9), 6, 1)
    across = pl.plan(model, pl.Cluster(256, 80e9, gpus_per_node=8, tp_across_nodes=True), 512,
                     axes=pl.Axes(recompute=("selective",)))
    assert any(c.tp == 16 and c.time["tp_over_nodes"] for c in across["configs"])


def test_dp_over_nodes_is_the_gradient_groups_link():
    # dp 1, cp 2 on TP 8: no data-parallel group, but the gradients are reduced over the 2 CP ranks
    model = pl.ModelSpec(8e9, 32, 4096, 32, 8, 32768)
    config = pl.Config(tp=8, pp=1, dp=1, cp=2, microbatch=1, zero=1, recompute="full", chunks=1)
    for gpus_per_node, across in ((8, True), (16, False)):  # the CP ranks a node apart, or on one node
        cluster = pl.Cluster(16, 80e9, gpus_per_node=gpus_per_node)
        c = pl.evaluate(model, cluster, 1, dataclasses.replace(config))
        assert not c.reason, c.reason
        assert c.time["cp_over_nodes"] == c.time["dp_over_nodes"] == across
        assert pl._dp_link(cluster, c)[0] == (cluster.inter_alpha if across else cluster.alpha)


def test_cli_json_keys_and_text(capsys):
    code, out, err = run(capsys, *ISSUE_ARGS, "--json")
    assert code == 0, err
    r = json.loads(out)
    for c in r["configs"][:5]:
        assert {"tp", "pp", "dp", "microbatch", "zero", "recompute", "memory_bytes", "step_time_s", "mfu",
                "bubble_fraction"} <= set(c)
    assert r["rejected"] and all(x["reason"] for x in r["rejected"])
    # every memory key is in the help's list, and every byte count is whole (the allocator's allowance was not)
    code, help_text, _ = run(capsys, "--help")
    listed = " ".join(help_text.replace("│", " ").split())
    for c in r["configs"]:
        assert all(key in listed for key in c["memory"]), [key for key in c["memory"] if key not in listed]
        assert all(float(v).is_integer() for k, v in c["memory"].items() if k.endswith("_bytes") and k != "usable_bytes")
        assert float(c["memory_bytes"]).is_integer()
    assert r["inputs"]["engine"] == "megatron"  # Megatron-LM's schedules unless --engine says otherwise
    assert all(c["microbatches"] % c["pp"] == 0 for c in r["configs"] if c["chunks"] > 1)
    code, out, _ = run(capsys, *ISSUE_ARGS, "--engine", "torch", "--pp", "8", "--micro-batch", "8", "--json")
    fewer = [c for c in json.loads(out)["configs"] if c["chunks"] > 1 and c["microbatches"] < c["pp"]]
    assert code == 0 and fewer  # torch's interleaved schedule runs m < p ...
    c = fewer[0]  # ... and its step is p + (m−1)/v slots
    units = f5.step_time_units(c["pp"], c["microbatches"], c["chunks"])
    assert c["time"]["bubble_s"] == pytest.approx(
        (units - c["microbatches"]) / c["microbatches"]
        * (c["time"]["compute_s"] + c["time"]["tp_comm_s"] + c["time"]["pp_comm_s"]))
    code, out, _ = run(capsys, *ISSUE_ARGS, "--top", "3")
    assert code == 0 and "TP kept inside a node" in out and "Rejected" in out and "MFU" in out


def _tp8_pp8(max_zero: int) -> list[str]:
    """The issue's command with one configuration's degrees fixed: TP 8 × PP 8, 1F1B, full recomputation."""
    return [*ISSUE_ARGS, "--tp", "8", "--pp", "8", "--micro-batch", "1", "--max-chunks", "1", "--max-zero",
            str(max_zero), "--recompute", "full", "--sp", "on"]


def _best_for_each(capsys, fixed: list[str], option: str, values: tuple[str, ...]) -> dict:
    """The best configuration of ``calc plan … --json`` for each value of ``option``, which the inputs echo."""
    best = {}
    for value in values:
        code, out, err = run(capsys, *fixed, f"--{option.replace('_', '-')}", value, "--json")
        assert code == 0, err
        r = _strict(out)
        assert r["inputs"][option] == value
        best[value] = r["best"]
    return best


def _says(capsys, fixed: list[str], option: str, value: str, english: str, spanish: str, bad: str) -> None:
    """``calc plan … --<option> <value>`` shows ``english`` (``--lang es``: ``spanish``), the default does not,
    and ``bad`` is refused in one line with exit 2."""
    flag = f"--{option.replace('_', '-')}"
    for lang, words in (("en", english), ("es", spanish)):
        code, out, _ = run(capsys, *fixed, flag, value, "--top", "1", "--lang", lang)
        assert code == 0 and words in out, (lang, out)
    code, out, _ = run(capsys, *fixed, "--top", "1")
    assert english not in out
    code, out, err = run(capsys, *fixed, flag, bad)
    assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_cli_grad_accumulation(capsys):
    """``--grad-accumulation``: the framework's pass, in the JSON's inputs and time terms, a line of its own
    in the text (en, es), the step longer by the pass over the pipeline's slots; an unknown value refused."""
    fixed = _tp8_pp8(max_zero=1)
    steps = _best_for_each(capsys, fixed, "grad_accumulation", ("fused", "cast-add"))
    fused, cast = steps["fused"], steps["cast-add"]
    assert fused["time"]["grad_accumulation_s"] == 0 < cast["time"]["grad_accumulation_s"]
    m = cast["microbatches"]
    slots = f5.step_time_units(8, m, 1)
    # (the data-parallel reduction overlaps the longer backward a little more: compared apart)
    apart = {how: c["step_time_s"] - c["time"]["dp_comm_exposed_s"] for how, c in steps.items()}
    assert apart["cast-add"] - apart["fused"] == pytest.approx(cast["time"]["grad_accumulation_s"] / m * slots)
    _says(capsys, fixed, "grad_accumulation", "cast-add", "adds each microbatch's gradients into the buffer (cast-add",
          "suman los gradientes de cada microlote al búfer (cast-add", bad="sum")  # fused: nothing outside the GEMM


def test_cli_bf16_moments(capsys):
    """``--moments bf16``: the optimizer term of every configuration at lesson 2's 8 bytes instead of 12, in
    the JSON's inputs and in the text's memory line (en, es); an unknown value refused."""
    fixed = _tp8_pp8(max_zero=0)
    got = {k: c["memory"] for k, c in _best_for_each(capsys, fixed, "moments", ("fp32", "bf16")).items()}
    assert got["bf16"]["optimizer_bytes"] == pytest.approx(got["fp32"]["optimizer_bytes"] * 8 / 12)
    assert got["bf16"]["params_bytes"] == got["fp32"]["params_bytes"]
    _says(capsys, fixed, "moments", "bf16", "(bf16 moments)", "(momentos bf16)", bad="fp8")


@pytest.mark.parametrize("extra, words", [
    (["--tp", "3"], "does not divide the 512 GPUs"),
    (["--tp", "16"], "tp = 16 spans more than one node of 8 GPUs"),  # 8 KV heads replicated: the shape allows it
    (["--tp", "8", "--vocab", "50257"], "tp = 8 does not divide the vocabulary of 50,257 tokens"),
    (["--gpus", "448", "--pp", "7"], "divides neither the 80 layers"),
    (["--dp", "512", "--global-batch", "1000"], "global batch"),
    (["--gpus", "8", "--gpu-memory", "16GB"], "no configuration fits"),
    (["--heads", "60"], "not a multiple"),
    (["--gpus", "8", "--tp", "8", "--pp", "2"], "tp·pp = 8·2 = 16 does not divide the 8 GPUs"),  # each divides 8
    (["--shared-experts", "2"], "a mixture of experts needs --experts"),  # shared experts of no MoE: refused
])
def test_bad_input_is_a_one_line_error(capsys, extra, words):
    args = issue_args_with(extra)
    code, out, err = run(capsys, *args)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def _strict(text: str):
    def refuse(constant):
        raise AssertionError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("extra, words", [
    (["--flops", "1e-300"], "came out as inf"),
    (["--params", "7B", "--layers", "1", "--hidden", "8", "--heads", "1", "--kv-heads", "1"], "does not fit the shape: 1 layer of width 8 holds"),
    (["--params", "70T"], "does not fit the shape"),
])
def test_non_finite_and_impossible_shapes_are_one_line_exit_2_even_with_json(capsys, extra, words):
    args = issue_args_with(extra)
    for json_flag in ([], ["--json"]):
        code, out, err = run(capsys, *args, *json_flag)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        assert out == ""


def test_json_is_strict_and_has_the_five_axes(capsys):
    code, out, _ = run(capsys, *ISSUE_ARGS, "--max-cp", "4", "--json")
    assert code == 0
    r = _strict(out)
    assert {"tp", "pp", "dp", "cp", "ep", "sp"} <= set(r["best"])
    assert {c["cp"] for c in r["configs"]} == {1, 2, 4}
    terms = ("params_bytes", "grad_buffer_bytes", "optimizer_bytes", "activations_bytes", "logits_bytes",
             "comm_buffers_bytes", "allocator_bytes")
    assert all(r["best"]["memory"][k] >= 0 for k in terms) and r["best"]["memory"]["grad_buffer_bytes"] > 0


def test_a_fixed_cp_and_ep_are_searched_without_max_cp(capsys):
    """--cp alone fixes the degree (--max-cp's default 1 caps only a free cp), with --ep on an MoE."""
    mixtral = ["--params", "46.7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
               "--experts", "8", "--top-k", "2", "--ffn", "14336", "--seq", "16384", "--global-batch", "256",
               "--gpus", "128", "--gpu-memory", "80GB"]
    code, out, err = run(capsys, *mixtral, "--cp", "2", "--ep", "8", "--json")
    assert code == 0, err
    r = _strict(out)
    assert {(c["cp"], c["ep"]) for c in r["configs"]} == {(2, 8)}


def test_when_nothing_fits_the_real_obstacle_is_named(capsys):
    # OPT-175B's shape on 992 GPUs with 1024 sequences: 992 = 32 · 31, and no degree takes 31
    code, _, err = run(capsys, "--params", "175B", "--layers", "96", "--hidden", "12288", "--heads", "96",
                       "--seq", "2048", "--global-batch", "1024", "--gpus", "992", "--gpu-memory", "80GB")
    assert code == 2 and "factor 31" in err and "96 layers or 98" in err, err
    # every layout out of memory: the nearest miss, not the first rejection
    code, _, err = run(capsys, *ISSUE_ARGS[:-6], "--gpus", "8", "--gpu-memory", "16GB")
    assert code == 2 and "no configuration fits: the smallest needs" in err
    # 3 GPUs, and only CP could take the 3 (2·3 divides the sequence of 4,104), which --max-cp 2 forbids: said so,
    # not "the global batch 512 does not split into dp·microbatch = 3·1 pieces"
    shape = ["--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--global-batch", "512",
             "--gpu-memory", "80GB", "--seq", "4104", "--gpus", "3"]
    code, _, err = run(capsys, *shape, "--max-cp", "2")
    assert code == 2 and "factor 3" in err and "at most --max-cp 2" in err, err
    code, out, _ = run(capsys, *shape, "--max-cp", "3")
    assert code == 0 and "Rejected" in out


def test_sequence_parallelism_and_zero_with_a_pipeline_are_options():
    model = pl.ModelSpec(70e9, 80, 8192, 64, 8, 4096)
    cluster = pl.Cluster(512, 80e9)
    both = pl.plan(model, cluster, 1024, axes=pl.Axes(recompute=("selective",), chunks=(1,)))["configs"]
    assert {c.sp for c in both if c.tp > 1} == {False, True}
    off = pl.plan(model, cluster, 1024, axes=pl.Axes(recompute=("selective",), chunks=(1,), sp=(False,)))
    assert not any(c.sp for c in off["configs"])
    # the same layout: SP shards the activations the TP ranks otherwise replicate
    pick = next(c for c in both if c.sp and c.layout == (8, 4, 16, 1, 1) and c.zero == 1 and c.microbatch == 1)
    twin = next(c for c in both if not c.sp and c.layout == pick.layout and c.zero == 1 and c.microbatch == 1)
    assert pick.memory["activations_bytes"] < twin.memory["activations_bytes"]
    fsdp_pp = [c for c in both if c.pp > 1 and c.zero >= 2]
    assert fsdp_pp, "ZeRO-2/3 with a pipeline (Llama 3's FSDP with PP) is searched"
    deepspeed = pl.plan(model, cluster, 1024, axes=pl.Axes(recompute=("selective",), chunks=(1,), max_zero_pp=1))
    assert not any(c.pp > 1 and c.zero >= 2 for c in deepspeed["configs"])
    assert any("ZeRO-2 with pp" in c.reason for c in deepspeed["rejected"])


def test_mixture_of_experts_searches_expert_parallelism(capsys):
    # Mixtral 8x7B's shape (the flags of calc moe) on 64 GPUs
    code, out, err = run(capsys, "--params", "46.7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
                         "--kv-heads", "8", "--seq", "4096", "--global-batch", "512", "--gpus", "64", "--gpu-memory",
                         "80GB", "--experts", "8", "--top-k", "2", "--ffn", "14336", "--vocab", "32000", "--json")
    assert code == 0, err
    r = _strict(out)
    assert {c["ep"] for c in r["configs"]} >= {1, 2, 4, 8}
    assert all(c["dp"] % c["ep"] == 0 for c in r["configs"])
    assert r["inputs"]["active_params"] == pytest.approx(46.7e9 - 32 * 8 * 3 * 4096 * 14336 * (1 - 2 / 8))


def test_pipeline_schedules_follow_the_frameworks_rule_and_lesson5s_step_with_fewer_microbatches():
    """The planner runs what its engine accepts (lesson 5's check_schedule) and times it with lesson 5's
    step: interleaved with m < p never fills the pipeline, p + (m−1)/v slots, and holds all m microbatches."""
    model = pl.ModelSpec(70e9, 80, 8192, 64, 8, 4096, 128256)
    cluster = pl.Cluster(512, 80e9)

    def config(engine, v, b=4):  # TP 8, PP 8, DP 8, 64 sequences per replica in microbatches of 4: m = 2 < p
        return pl.evaluate(model, cluster, 64, pl.Config(8, 8, 8, b, 1, "full", v, True),
                           axes=pl.Axes(engine=engine))

    torch_v2 = config("torch", 2)
    assert not torch_v2.reason and torch_v2.microbatches == 2
    def slot(c):  # one microbatch on one stage: compute, TP and PP sends
        return (c.time["compute_s"] + c.time["tp_comm_s"] + c.time["pp_comm_s"]) / c.microbatches

    assert torch_v2.time["bubble_s"] == pytest.approx(slot(torch_v2) * (8 + (2 - 1) / 2 - 2))
    assert torch_v2.bubble_fraction == pytest.approx(f5.bubble_fraction(8, 2, 2))
    assert torch_v2.memory["microbatches_in_flight"] == 2
    assert "multiple of p = 8" in config("megatron", 2).reason  # Megatron-LM's interleaved: m = 8k
    assert "Schedule1F1B" in config("torch", 1).reason  # torch's 1F1B needs m >= p
    megatron_1f1b = config("megatron", 1)
    assert not megatron_1f1b.reason
    assert megatron_1f1b.time["bubble_s"] == pytest.approx(slot(megatron_1f1b) * 7)  # m + p − 1
    # with m < p, interleaving shortens the step less than the (p−1)/v of a full pipeline
    assert torch_v2.step_time_s > torch_v2.time["compute_s"] * (1 + 7 / (2 * 2)) * 0.99
    # each published run follows its framework's rule: Megatron-LM's, Llama 3's flexible schedule (torch's)
    assert pub.PUBLISHED["megatron-310.1b"].axes.engine == "megatron"
    assert all(pub.PUBLISHED[n].axes.engine == "torch" for n in pub.PUBLISHED if n.startswith("llama3"))
    configs = pl.plan(model, cluster, 1024)["configs"]
    assert all(c.microbatches % c.pp == 0 for c in configs if c.chunks > 1)


def test_deepspeed_pipeline_partitions_over_tp_and_metaseq_distributes_checkpoints():
    """DeepSpeed's PipelineEngine sends each TP rank's 1/t of a stage's output and input gradient (4 blocking
    messages of s·b·h·2/t and 4 meta tensors) and rebuilds it with 3 TP all-gathers; metaseq's distributed
    checkpoints keep 1/t of each saved layer input and all-gather it once per layer before the recompute."""
    from distai.lessons.lesson1.formulas import nccl_ring_time

    def gather(size: float) -> float:  # inside a DGX node: NCCL's model of the ring at NVLink's 300 GB/s
        return nccl_ring_time(size, 8, 300e9, "all_gather")["time_s"]

    p = pub.PUBLISHED["mt-nlg-530b-280"]
    c = pl.evaluate(p.model, p.cluster, p.global_batch, pl.Config(8, 35, 8, 1, 1, "full", 1),
                    axes=pl.Axes(p2p="deepspeed"))
    part = 2048 * 20480 * 2 / 8
    inter = 4 * (10e-6 + part / 25e9) + 4 * 10e-6
    gathers = 3 * gather(part * 8)
    assert c.time["pp_comm_s"] / c.microbatches == pytest.approx(inter + gathers)
    opt = pub.PUBLISHED["opt-175b"]
    assert opt.cluster.distributed_checkpoints and opt.cluster.grad_bytes == 2
    config = pl.Config(8, 1, 124, 8, 3, "full", 1)
    on = pl.evaluate(opt.model, opt.cluster, 992, dataclasses.replace(config))
    off = pl.evaluate(opt.model, dataclasses.replace(opt.cluster, distributed_checkpoints=False), 992,
                      dataclasses.replace(config))
    extra = 96 * gather(2048 * 8 * 12288 * 2)
    assert on.time["tp_comm_s"] - off.time["tp_comm_s"] == pytest.approx(extra)
    saved = 96 * 2 * 2048 * 8 * 12288  # full recomputation keeps each layer's input: 2·s·b·h bytes
    assert off.memory["activations_bytes"] - on.memory["activations_bytes"] == pytest.approx(saved * (1 - 1 / 8))


def _hbm_bytes_per_element(statement) -> dict[str, float]:
    """Bytes each aten op of ``statement()`` reads and writes (its inputs and outputs), per element of a
    4096-element gradient, as PyTorch dispatches them: {op name: bytes}."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    moved: dict[str, float] = {}

    class CountBytes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            flat = [*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))]
            size = sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))
            moved[str(func)] = moved.get(str(func), 0.0) + size / 4096
            return out

    with CountBytes():
        statement()
    return moved


def test_gradient_accumulation_outside_the_gemm():
    """Axes.grad_accumulation and Axes.zero1_reduction: DeepSpeed's BF16_Optimizer.update_hp_grads
    (``hp_grad.add_(lp.grad.to(fp32))``) moves 18 bytes a parameter, PyTorch's AccumulateGrad in fp16 6, both
    counted here from what PyTorch itself dispatches; the planner adds them to every microbatch's slot ("add":
    all but the first), so the step grows by the pass times the pipeline's slots."""
    import torch

    lp_grad, hp_grad = torch.ones(4096, dtype=torch.bfloat16), torch.zeros(4096)
    cast_add = _hbm_bytes_per_element(lambda: hp_grad.add_(lp_grad.to(hp_grad.dtype)))
    assert cast_add == {"aten._to_copy.default": 2 + 4, "aten.add_.Tensor": 4 + 4 + 4}
    assert sum(cast_add.values()) == pl.PARAM_BYTES + 16
    weight, x = torch.zeros(4096, dtype=torch.float16, requires_grad=True), torch.ones(4096, dtype=torch.float16)
    (weight * x).sum().backward()  # the first microbatch's gradient becomes weight.grad: nothing added
    second = _hbm_bytes_per_element(lambda: (weight * x).sum().backward())
    assert second["aten.add_.Tensor"] == pl.PARAM_BYTES + 2 * 2  # AccumulateGrad: weight.grad += the new one
    assert pl.grad_accumulation_seconds(1e9, "cast-add", 4, 2e12, 8) == pytest.approx(1e9 * 18 / 2e12)
    assert pl.grad_accumulation_seconds(1e9, "add", 2, 2e12, 8) == pytest.approx(1e9 * 6 / 2e12 * 7 / 8)
    assert pl.grad_accumulation_seconds(1e9, "add", 2, 2e12, 1) == 0.0  # one microbatch: nothing to add to
    assert pl.grad_accumulation_seconds(1e9, "fused", 4, 2e12, 8) == 0.0
    with pytest.raises(ValueError, match="grad_accumulation"):
        pl.grad_accumulation_seconds(1e9, "sum", 4, 2e12, 8)

    p = pub.PUBLISHED["mt-nlg-530b-280"]
    assert p.axes.grad_accumulation == "cast-add" and pub.PUBLISHED["megatron-18.4b"].axes.grad_accumulation == "add"
    assert pub.PUBLISHED["korthikanti-530b"].axes.grad_accumulation == "fused"

    def run(zero=1, **how):  # the published layout at microbatch 1 with DeepSpeed's pipeline
        return pl.evaluate(p.model, p.cluster, p.global_batch, pl.Config(8, 35, 8, 1, zero, "full", 1),
                           axes=pl.Axes(p2p="deepspeed", dp_overlap=False, **how))

    fused, cast = run(grad_accumulation="fused"), run(grad_accumulation="cast-add")
    per_mb = 529.6e9 / 280 * 18 / pub.A100["hbm_bandwidth"]  # each GPU's 1/(TP·PP) of the layers, roughly
    assert cast.time["grad_accumulation_s"] == pytest.approx(240 * per_mb, rel=0.01)
    assert fused.time["grad_accumulation_s"] == 0.0
    assert cast.time["compute_s"] - fused.time["compute_s"] == pytest.approx(cast.time["grad_accumulation_s"])
    slots = f5.step_time_units(35, 240, 1)
    assert cast.step_time_s - fused.step_time_s == pytest.approx(cast.time["grad_accumulation_s"] / 240 * slots)
    # DeepSpeed's BF16_Optimizer reduces the fp32 gradients whole (its ZeRO-1 then all-gathers the bf16
    # weights): an all-reduce where ZeRO-1 elsewhere reduce-scatters
    from distai.lessons.lesson1.formulas import (
        ring_allgather_time,
        ring_allreduce_time,
        ring_reduce_scatter_time,
    )

    assert p.axes.zero1_reduction == "all-reduce"
    held, link = 529.6e9 / 280, (10e-6, 1 / 25e9)  # the GPU's parameters; DP 8 crosses nodes
    for how, reduce in (("all-reduce", ring_allreduce_time), ("reduce-scatter", ring_reduce_scatter_time)):
        zero1 = run(zero1_reduction=how)
        assert zero1.time["dp_comm_exposed_s"] == pytest.approx(
            reduce(held * 4, 8, *link) + ring_allgather_time(held * 2, 8, *link), rel=0.01)
    # ZeRO-2 adds into the gradient shard the GPU keeps: an eighth on DP 8
    sharded = run(zero=2, grad_accumulation="cast-add")
    assert sharded.time["grad_accumulation_s"] == pytest.approx(cast.time["grad_accumulation_s"] / 8)


def test_megatron_2021_overlaps_the_gradient_all_reduce_only_without_a_pipeline():
    """Axes.dp_overlap "no-pipeline" (Megatron-LM 2021: PyTorch's DDP only when pp = 1, local DDP with a
    pipeline): a pp = 1 layout hides its all-reduce behind the last backward, a pipelined one hides none."""
    p = pub.PUBLISHED["megatron-18.4b"]

    def exposed(config, overlap):
        return pl.evaluate(p.model, p.cluster, p.global_batch, config,
                           axes=pl.Axes(max_zero_pp=0, dp_overlap=overlap)).time["dp_comm_exposed_s"]

    flat, piped = pl.Config(8, 1, 32, 8, 0, "full", 1), pl.Config(2, 4, 32, 2, 0, "full", 5)
    assert exposed(flat, "no-pipeline") == exposed(flat, True) < exposed(flat, False)
    assert exposed(piped, "no-pipeline") == exposed(piped, False) > exposed(piped, True)
    assert pub.what_if_run("torch-ddp", "megatron-18.4b")["config"].step_time_s < pub.reproduce("megatron-18.4b")["config"].step_time_s


def test_the_layer_being_backpropagated_holds_what_recomputation_rebuilds():
    """Korthikanti et al. 2022, Table 2, one layer: full recomputation rebuilds a layer's whole forward for its
    backward, sbh·(10 + 24/t + 5as/(ht)) without sequence parallelism when the attention scores are materialized
    (no FlashAttention, as on the A100 runs); selective recomputation rebuilds the attention core's 5as/h·sbh/t
    with sequence parallelism. The 530B shape (105 layers, h 20480, a 128, s 2048, b 1, TP 8, PP 35)."""
    model = pl.ModelSpec(529.6e9, 105, 20480, 128, 128, 2048, 51200)
    roomy = pl.Cluster(280, 1e15, **pub.A100)
    sbh = 2048 * 1 * 20480
    for recompute, sp, rebuilt in (("full", False, sbh * (10 + 24 / 8 + 5 * 128 * 2048 / (20480 * 8))),
                                   ("selective", True, 5 * 128 * 2048 / 20480 * sbh / 8)):
        c = pl.evaluate(model, roomy, 280, pl.Config(8, 35, 1, 1, 0, recompute, 1, sp))
        stored = f2.activation_bytes(3, 2048, 1, 20480, 128, 8, sp, recompute)
        assert c.memory["activations_bytes"] == pytest.approx(stored * c.memory["microbatches_in_flight"] + rebuilt)
    assert rebuilt == 335_544_320  # 64 · 5,242,880: the 530B's scores, one layer, over TP 8
    flash = pl.evaluate(model, pl.Cluster(280, 1e15), 280, pl.Config(8, 35, 1, 1, 0, "selective", 1, True))
    assert flash.memory["activations_bytes"] == pytest.approx(
        f2.activation_bytes(3, 2048, 1, 20480, 128, 8, True, "selective") * flash.memory["microbatches_in_flight"])


def test_a_fixed_efficiency_counts_a_wide_attention_core_in_the_hardware_flops_too():
    """With a fixed efficiency the GPU runs the hardware FLOPs at efficiency · peak; without recomputation they
    are the model FLOPs (Chowdhery et al. 2022, App. B: HFU = MFU), so one GPU's MFU is the efficiency, MLA's wider
    attention core (16 heads of q·k 192 and v 128: width 2560, not h = 2048) included; selective recomputation
    adds its forward, 4·L·2560·s per token."""
    model = pl.ModelSpec(2e9, 8, 2048, 16, 16, 4096, 32000, qk_head_dim=192, v_head_dim=128)
    per_token = 6 * 2e9 + 12 * 8 * 2560 * 4096
    for recompute, hardware in (("none", per_token), ("selective", per_token + 4 * 8 * 2560 * 4096)):
        best = pl.plan(model, pl.Cluster(1, 1e15, efficiency=0.5), 8, axes=pl.Axes(recompute=(recompute,)))["configs"][0]
        # the optimizer step (memory-bound, no FLOPs) is the only time outside the compute
        computing = (best.step_time_s - best.time["optimizer_s"]) / best.step_time_s
        assert best.time["optimizer_s"] > 0
        assert best.mfu == pytest.approx(0.5 * per_token / hardware * computing)


def test_stages_with_embedding_and_output_slots_hold_the_busier_of_the_first_two_stages():
    """BLOOM's 70 layers on PP 12 fill 72 slots, 6 a stage (formulas.stage_layers): the first stage holds 5 layers
    and 12 microbatches in flight (1F1B), the second 6 layers and 11: 66 layer-microbatches of 2·s·b·h with full
    recomputation (Korthikanti et al. 2022, Table 2), not 6 · 12 = 72; plus the layer being rebuilt, its whole
    forward without FlashAttention, sbh·(10 + 24/4 + 5·112·2048/(14336·4))."""
    p = pub.PUBLISHED["bloom-176b"]
    c = pl.evaluate(p.model, dataclasses.replace(p.cluster, gpu_memory=1e15), 2048,
                    pl.Config(4, 12, 8, 2, 1, "full", 1, False))
    sbh = 2048 * 2 * 14336
    assert c.microbatches == 128 and c.memory["microbatches_in_flight"] == 12
    assert c.memory["activations_bytes"] == pytest.approx(66 * 2 * sbh + sbh * (10 + 24 / 4 + 5 * 112 * 2048 / (14336 * 4)))


@pytest.mark.parametrize("tied", [True, False])
def test_a_layer_holds_neither_vocabulary_table(tied):
    """Llama 3 8B's shape (Llama 3 paper, Table 3; its head untied): the planner's average layer has a
    layer's parameters as the course's one GPT counts them, whether the output layer shares the
    embedding's table or has its own (the logits GEMM is counted apart: a table spread over the
    layers would count the head twice, 6.5% more GEMM FLOPs on this shape)."""
    from distai.lessons.model_size import ModelSize

    def size(layers):
        return ModelSize(vocab=128256, hidden=4096, heads=32, kv_heads=8, layers=layers, seq=8192, ffn=14336,
                         mlp="swiglu", tie_embeddings=tied).num_params()

    one_layer = size(32) - size(31)
    spec = pl.ModelSpec(size(32), 32, 4096, 32, 8, 8192, 128256, tied_embeddings=tied)
    assert spec.layer_params == pytest.approx(one_layer, rel=1e-5)
    assert spec.active_layer_params == spec.layer_params


def test_calc_plan_head_untied_shortens_the_layers_by_one_table(capsys):
    """``--head untied``: the same parameters hold a second V·h table, so each layer's GEMMs shrink
    by V·h/L parameters (the --json inputs say which head was planned)."""
    args = issue_args_with(["--vocab", "128256", "--tp", "8", "--pp", "4", "--micro-batch", "1"]) + ["--json"]
    tied, untied = (json.loads(run(capsys, *args, *extra)[1]) for extra in ([], ["--head", "untied"]))
    assert (tied["inputs"]["head"], untied["inputs"]["head"]) == ("tied", "untied")
    assert untied["best"]["step_time_s"] < tied["best"]["step_time_s"]
    assert run(capsys, *args, "--head", "shared")[0] == 2


def test_full_recomputation_repeats_the_layers_not_the_output_layer():
    """Full recomputation reruns each layer's forward, not the output layer's: for a GPT of Ψ = 12·l·h² + V·h
    (tied head) the hardware FLOPs per sequence are Megatron-LM's 96·s·l·h²·(1 + s/(6h) + V/(16lh))
    (Narayanan et al. 2021, eq. 3) exactly, the logits' 6·s·h·V counted once."""
    L, h, s, V = 96, 12288, 2048, 51200
    layers = 12 * L * h * h
    per_token = fc.hardware_flops_per_token(layers + V * h, L, h, s, "full", layer_params=layers)
    assert per_token * s == pytest.approx(fc.megatron_flops_per_step(1, s, L, h, V), rel=1e-12)
    model = pl.ModelSpec(layers + V * h, L, h, 96, 96, s, V)
    assert model.layer_params * L == layers


MIXTRAL_16K = ["--params", "46.7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
               "--experts", "8", "--top-k", "2", "--ffn", "14336", "--seq", "16384", "--global-batch", "256",
               "--gpu-memory", "80GB"]


@pytest.mark.parametrize("extra, words", [
    (["--gpus", "128", "--dp", "3"], "--dp 3 no divide las 128 GPU"),
    (["--gpus", "128", "--tp", "8", "--pp", "32"], "tp·pp = 8·32 = 256 no divide las 128 GPU"),
    (["--gpus", "128", "--tp", "64"], "no divide las 32 cabezas"),
    (["--gpus", "128", "--params", "7T"], "no cabe en la forma"),
    (["--gpus", "128", "--flops", "1e-300"], "«paso» salió inf"),
    (["--gpus", "32", "--dp", "4", "--cp", "2", "--ep", "16"], "no divide los 8 expertos"),
    (["--gpus", "32", "--dp", "2", "--cp", "2", "--ep", "8", "--tp", "1"], "--ep 8 debe dividir dp·cp = 2·2 = 4"),
    (["--gpus", "128", "--tp", "8", "--pp", "1", "--cp", "2", "--dp", "4"], "tp·pp·dp·cp = 8·1·4·2 = 64 no son las 128 GPU"),
])
def test_the_planners_input_errors_are_in_the_learners_language(capsys, monkeypatch, extra, words):
    monkeypatch.setenv("DISTAI_LANG", "es")
    code, out, err = run(capsys, *MIXTRAL_16K, *extra)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and "does not" not in err


def test_expert_parallelism_folds_into_the_data_and_context_ranks(capsys):
    """EP divides dp·cp, not dp alone (Megatron-core's MoE parallel folding; the run's mesh, formulas.mesh5_group):
    EP 8 on DP 4 × CP 2 is planned, its 8 ranks consecutive (stride tp) and so inside one node of 8 GPUs."""
    code, out, err = run(capsys, *MIXTRAL_16K, "--gpus", "32", "--dp", "4", "--cp", "2", "--ep", "8", "--tp", "1",
                         "--json")
    assert code == 0, err
    best = _strict(out)["best"]
    assert (best["dp"], best["cp"], best["ep"]) == (4, 2, 8)
    c = pl.Config(1, 4, 4, 1, 0, "none", 1, False, 2, 8)
    assert pl.strides(c)["ep"] == 1
    assert fc.mesh5_group(0, "ep", pp=4, dp=4, cp=2, tp=1, ep=8) == list(range(8))


def test_the_optimizer_step_streams_the_states_the_memory_holds_at_hbm_bandwidth():
    """Adam's update reads and writes the fp32 master copy and both moments (lesson 2's 12 bytes, the bytes the
    memory count holds), reads the fp32 gradient for the clipping norm and for the update, and writes the bf16
    copy; ZeRO-1 on DP 8 leaves each GPU an eighth of it. The step time adds it after everything else."""
    psi = 1.3e9
    model = pl.ModelSpec(psi, 24, 2048, 16, 16, 2048, 51200)
    cluster = pl.Cluster(8, 80e9)
    steps = {}
    for zero in (0, 1):
        c = pl.evaluate(model, cluster, 64, pl.Config(1, 1, 8, 1, zero, "none", 1))
        assert not c.reason, c.reason
        owned = psi / (8 if zero else 1)
        adam = f2.bytes_per_param("adam")["optimizer"]
        assert adam == 12 and c.memory["optimizer_bytes"] == pytest.approx(adam * owned)
        assert c.time["optimizer_s"] == pytest.approx(owned * (2 * adam + 2 * 4 + 2) / cluster.hbm_bandwidth)
        # the states streamed are exactly twice what the memory count holds (read, then written)
        streamed = pl.optimizer_step_bytes(c.memory["optimizer_params"], "adam", cluster.grad_bytes)
        assert streamed - owned * (2 * 4 + 2) == pytest.approx(2 * c.memory["optimizer_bytes"])
        t = c.time
        terms = t["compute_s"] + t["bubble_s"] + t["dp_comm_exposed_s"] + t["optimizer_s"]
        assert c.step_time_s == pytest.approx(terms)
        steps[zero] = t["optimizer_s"]
    assert steps[1] == pytest.approx(steps[0] / 8)
    # SGD with momentum keeps the master copy and one moment: 8 bytes, the update's states shrink with them
    sgd = pl.evaluate(model, cluster, 64, pl.Config(1, 1, 8, 1, 0, "none", 1), optimizer="sgd")
    assert sgd.time["optimizer_s"] == pytest.approx(psi * (2 * 8 + 2 * 4 + 2) / cluster.hbm_bandwidth)
    # BF16 moments (DeepSeek-V3): lesson 2's 8 bytes, held and streamed; nothing else moves
    bf16 = pl.evaluate(model, cluster, 64, pl.Config(1, 1, 8, 1, 0, "none", 1), axes=pl.Axes(moments="bf16"))
    fp32 = pl.evaluate(model, cluster, 64, pl.Config(1, 1, 8, 1, 0, "none", 1))
    assert bf16.memory["optimizer_bytes"] == pytest.approx(8 * psi)
    assert bf16.time["optimizer_s"] == pytest.approx(psi * (2 * 8 + 2 * 4 + 2) / cluster.hbm_bandwidth)
    assert fp32.memory["model_states_bytes"] - bf16.memory["model_states_bytes"] == pytest.approx(4 * psi)
    assert fp32.step_time_s - bf16.step_time_s == pytest.approx(fp32.time["optimizer_s"] - bf16.time["optimizer_s"])
    assert pub.DEEPSEEK_V3.axes.moments == "bf16" and pl.Axes().moments == "fp32"


def test_cp_memory_holds_the_blocks_the_step_time_sends():
    """Context parallelism as the planner times it (Llama 3's all-gather): each ring step of the all-gather and
    of the gradients' reduce-scatter sends one rank's K and V for the layer (the context lesson's block); the
    memory holds the gathered K and V, cp blocks, and their gradients before the reduce-scatter, cp more."""
    from distai.lessons.context.formulas import kv_block_bytes
    from distai.lessons.lesson1.formulas import nccl_ring_time

    model = pl.ModelSpec(1.3e9, 24, 2048, 16, 4, 8192, 51200)  # 4 KV heads of 128
    cluster = pl.Cluster(4, 80e9)
    c = pl.evaluate(model, cluster, 4, pl.Config(1, 1, 1, 1, 0, "none", 1, cp=4))
    assert not c.reason, c.reason
    block = kv_block_bytes(8192, 1, 4, 128, cp=4)  # 2 · 2048 tokens · 4 heads · 128 · 2 bytes
    assert block == 2 * 2048 * 4 * 128 * 2 == pl.cp_kv_block_bytes(model, 1, 1, 4)
    held = c.memory["comm_buffers_bytes"] - 2 * pl.DDP_BUCKET_BYTES  # the rest: DDP's two buckets over dp·cp
    assert held == pytest.approx(pl.CP_KV_BUFFERS * 4 * block) and pl.CP_KV_BUFFERS == 2
    # the time: per layer and microbatch two all-gathers (forward, backward) and a reduce-scatter of 4 blocks
    per_layer = 2 * nccl_ring_time(4 * block, 4, cluster.intra_bandwidth, "all_gather")["time_s"] \
        + nccl_ring_time(4 * block, 4, cluster.intra_bandwidth, "reduce_scatter")["time_s"]
    assert c.time["cp_comm_s"] == pytest.approx(c.microbatches * 24 * per_layer)
    # TP beyond the KV heads replicates them: a rank still holds (and sends) whole heads
    assert pl.cp_kv_block_bytes(model, 1, 8, 4) == pl.cp_kv_block_bytes(model, 1, 4, 4) == block / 4


def test_fsdp_gathers_and_reduces_one_layer_at_a_time():
    """ZeRO-3 (FSDP, each block its own unit) all-gathers every layer's weights for the forward and the
    backward and reduce-scatters its gradients: the whole stage's bytes, but a ring's (n − 1) latencies per
    layer and collective, so on a thousand ranks the latency is the layers' count times larger."""
    p = pub.PUBLISHED["llama3-405b-8k"]

    def exposed(inter_alpha):  # a slow network, so that the gathers outlast the compute
        cluster = pl.Cluster(1024, 1e12, inter_bandwidth=1e9, inter_alpha=inter_alpha)
        return pl.evaluate(p.model, cluster, 256, pl.Config(8, 1, 128, 1, 3, "full", 1),
                           axes=pl.Axes(max_zero_pp=3)).time["dp_comm_exposed_s"]

    layers, ranks, microbatches = p.model.layers, 128, 2
    assert exposed(0.0) > 0
    assert exposed(1e-4) - exposed(0.0) == pytest.approx(microbatches * layers * 3 * (ranks - 1) * 1e-4)


def test_a_data_parallel_ring_with_a_nic_per_rank():
    """Cluster.dp_ring_nics "per-rank": a ring with k ranks on each node runs at k NICs' bandwidth (NCCL's
    channel per NIC), at most NVLink's; "one" (the planner's model) at one NIC's whatever k. Megatron-LM
    2021 hides none of the all-reduce behind a pipeline, so the exposed time is the ring's."""
    p = pub.PUBLISHED["megatron-18.4b"]
    no_latency = dataclasses.replace(p.cluster, inter_alpha=0.0)
    for tp, pp, on_node in ((2, 4, 4), (8, 1, 1), (1, 8, 8)):
        exposed = {nics: pl.evaluate(p.model, dataclasses.replace(no_latency, dp_ring_nics=nics), p.global_batch,
                                     pl.Config(tp, pp, 32, 1, 0, "full", 1),
                                     axes=dataclasses.replace(p.axes, dp_overlap=False)).time["dp_comm_exposed_s"]
                   for nics in ("one", "per-rank")}
        assert exposed["one"] > 0
        assert exposed["per-rank"] == pytest.approx(exposed["one"] / on_node)
    wide = dataclasses.replace(no_latency, intra_bandwidth=100e9, dp_ring_nics="per-rank")  # NVLink the bound
    capped = pl.evaluate(p.model, wide, p.global_batch, pl.Config(1, 8, 32, 1, 0, "full", 1),
                         axes=dataclasses.replace(p.axes, dp_overlap=False)).time["dp_comm_exposed_s"]
    assert capped == pytest.approx(exposed["one"] / 4)
    with pytest.raises(ValueError, match="dp_ring_nics"):  # a misspelt model is refused, not read as "one"
        dataclasses.replace(no_latency, dp_ring_nics="per_rank")


def test_cli_dp_ring_nics(capsys):
    """``--dp-ring-nics per-rank``: a data-parallel ring with 4 ranks on each node (TP 2) gets their 4 NICs,
    only the data-parallel term moves; the hardware line says so (en, es); an unknown value refused."""
    fixed = [*ISSUE_ARGS, "--tp", "2", "--pp", "8", "--micro-batch", "1", "--max-chunks", "1", "--max-zero", "1",
             "--recompute", "full", "--sp", "on", "--internode-alpha", "0"]
    got = _best_for_each(capsys, fixed, "dp_ring_nics", ("one", "per-rank"))
    one, per_rank = got["one"], got["per-rank"]
    assert (one["zero"], per_rank["zero"]) == (1, 1)
    # what ZeRO-1 leaves exposed: the all-gather of the updated bf16 weights over DP 32, at 4 NICs' 200 GB/s
    # (the reduce-scatter before it now hides behind the backward), at one NIC's 50 GB/s and more before
    gather = 31 / 32 * per_rank["memory"]["params_bytes"]
    assert per_rank["time"]["dp_comm_exposed_s"] == pytest.approx(gather / 200e9)
    assert one["time"]["dp_comm_exposed_s"] > gather / 50e9
    for term in ("compute_s", "tp_comm_s", "pp_comm_s", "bubble_s"):
        assert per_rank["time"][term] == pytest.approx(one["time"][term])
    _says(capsys, fixed, "dp_ring_nics", "per-rank", "a data-parallel ring uses the NICs of all its ranks on a node",
          "un anillo de datos usa las NIC de todos sus ranks en un nodo", bad="two")


def test_an_moe_layer_stores_its_experts_activations_not_a_gelu_mlps():
    """Mixtral 8x7B's layer: each token's two SwiGLU experts (f = 3.5h) store 2h + 6f bytes each, in place of
    the 2h + 16h of Korthikanti's 4h GeLU MLP: 62·s·b·h a layer where the dense count says 34 (the planner
    counted 34 and put the README's Mixtral plan at 61.9 GB, about 30 GB short). Under full recomputation
    only the layer's input is kept, and the layer rebuilt for its backward is the experts' one."""
    import dataclasses

    from distai.lessons.experts.formulas import MIXTRAL_8X7B, moe_model_params

    _, layers, h, f, vocab, heads, kv, experts, top_k = MIXTRAL_8X7B
    total = moe_model_params(layers, h, f, experts, top_k, vocab, heads, kv)["total_params"]
    moe = pl.ModelSpec(total, layers, h, heads, kv, 4096, vocab, experts=experts, top_k=top_k, expert_ffn=f,
                       tied_embeddings=False)
    dense = dataclasses.replace(moe, experts=0, top_k=0, expert_ffn=0)
    cluster = pl.Cluster(64, 1e15, flash_attention=True)
    sbh = 4096 * 1 * h

    def activations(model, recompute, sp=False, tp=1):
        c = pl.evaluate(model, cluster, 64, pl.Config(tp, 1, 64 // tp, 1, 3, recompute, 1, sp, 1, 8 if model.experts else 1))
        assert not c.reason, c.reason
        return c.memory["activations_bytes"]

    assert activations(moe, "none") - activations(dense, "none") == pytest.approx(layers * (62 - 34) * sbh, rel=1e-12)
    assert activations(moe, "none", True, 2) - activations(dense, "none", True, 2) == \
        pytest.approx(layers * (62 - 34) * sbh / 2, rel=1e-12)
    # tensor parallelism without sequence parallelism splits the experts' GEMM outputs, not their inputs
    extra = 2 * (2 * h + 6 * f / 2) - (2 * h + 16 * h / 2)
    assert activations(moe, "none", sp=False, tp=2) - activations(dense, "none", sp=False, tp=2) == \
        pytest.approx(layers * extra * 4096, rel=1e-12)
    assert activations(moe, "full") - activations(dense, "full") == pytest.approx((62 - 34) * sbh, rel=1e-12)


def test_collectives_inside_a_node_are_nccls_model_and_across_nodes_or_with_alpha_the_ring():
    """One rule for a collective inside an NVLink node, the serving planner's and lesson 1's: NCCL's tuner
    model (lesson1.formulas.nccl_ring_time); across nodes, and with nccl_collectives off (calc plan --alpha, the
    calibrated CPU run), the α-β ring. TP's ops are lesson 4's count: 4 all-reduces a layer, or with SP 4
    all-gathers and 4 reduce-scatters."""
    from distai.lessons.lesson1.formulas import nccl_ring_time, ring_allgather_time, ring_reduce_scatter_time
    from distai.lessons.lesson1.formulas import ring_allreduce_time as ring

    cluster = pl.Cluster(64, 80e9)
    x = 4096 * 2 * 8192 * 2  # s·b·h in bf16
    nccl = pl.tp_layer_comm_seconds(cluster, False, 8192, 4096, 2, 8, sequence_parallel=False)
    assert nccl == pytest.approx(4 * nccl_ring_time(x, 8, 450e9, "all_reduce")["time_s"])
    with_sp = pl.tp_layer_comm_seconds(cluster, False, 8192, 4096, 2, 8, sequence_parallel=True)
    assert with_sp == pytest.approx(4 * (nccl_ring_time(x, 8, 450e9, "all_gather")["time_s"]
                                         + nccl_ring_time(x, 8, 450e9, "reduce_scatter")["time_s"]))
    across = pl.tp_layer_comm_seconds(cluster, True, 8192, 4096, 2, 8, sequence_parallel=True)
    assert across == pytest.approx(4 * (ring_allgather_time(x, 8, 10e-6, 1 / 50e9)
                                         + ring_reduce_scatter_time(x, 8, 10e-6, 1 / 50e9)))
    measured = dataclasses.replace(cluster, nccl_collectives=False, alpha=2e-6)
    assert pl.tp_layer_comm_seconds(measured, False, 8192, 4096, 2, 8, False) == pytest.approx(
        4 * ring(x, 8, 2e-6, 1 / 450e9))
    # NCCL's Simple protocol pays a base latency the α-β ring does not: at microbatch 1, 4 ranks, SP, the
    # model's TP time is above the ring's at 5 µs a step, and within a few percent of it
    model = pl.ModelSpec(70e9, 80, 8192, 64, 8, 4096)
    config = pl.Config(4, 8, 16, 1, 1, "none", 2, sp=True)
    by_nccl = pl.evaluate(model, pl.Cluster(512, 80e9), 1024, dataclasses.replace(config))
    by_ring = pl.evaluate(model, pl.Cluster(512, 80e9, nccl_collectives=False), 1024, dataclasses.replace(config))
    assert 1 < by_nccl.time["tp_comm_s"] / by_ring.time["tp_comm_s"] < 1.05


def test_nccl_ring_time_is_nccls_tuner_for_every_ring_collective():
    """tuning.cc (v2.18.5-1): an all-gather or a reduce-scatter is a ring of n − 1 steps whose LL protocol
    moves a third of the bus bandwidth inside a node (an all-reduce's: a quarter, over 2(n − 1) steps); time =
    baseLat + steps·hwLat + S / (busBw·n/steps)."""
    from distai.lessons.lesson1.formulas import nccl_ring_allreduce, nccl_ring_time

    gather = nccl_ring_time(16384, 8, 450e9, "all_gather")
    ll = 6.6e-6 + 7 * 0.6e-6 + 16384 / (87.7e9 * 8 / 7)  # a third of 450 GB/s is above llMaxBw: capped
    assert gather["protocol"] == "LL" and gather["time_s"] == pytest.approx(ll)
    assert gather["times_s"]["Simple"] == pytest.approx(8.4e-6 + 7 * 3.4e-6 + 16384 / (450e9 * 8 / 7))
    slow = nccl_ring_time(1 << 20, 4, 120e9, "reduce_scatter")["times_s"]["LL"]
    assert slow == pytest.approx(6.6e-6 + 3 * 0.6e-6 + (1 << 20) / (120e9 / 3 * 4 / 3))
    assert nccl_ring_time(1 << 30, 8, 450e9) == nccl_ring_allreduce(1 << 30, 8, 450e9)
    with pytest.raises(ValueError, match="unknown collective"):
        nccl_ring_time(1024, 8, 450e9, "broadcast")


def test_calc_plan_says_which_model_priced_the_collectives_and_alpha_switches_to_the_ring(capsys):
    """`calc plan` prices collectives inside a node with NCCL's model unless `--alpha` gives the latency of a
    measured link (then the α-β ring, as `calc serve --alpha`); the text's fifth line and `inputs` say which."""
    steps = {}
    for extra, model in (([], "nccl"), (["--alpha", "2us"], "alpha-beta")):
        code, out, err = run(capsys, *ISSUE_ARGS, *extra, "--json")
        assert code == 0, err
        data = json.loads(out)
        assert data["inputs"]["collective_model"] == model
        steps[model] = data["best"]["time"]["tp_comm_s"]
    assert steps["nccl"] != steps["alpha-beta"]
    assert json.loads(run(capsys, *ISSUE_ARGS, "--json")[1])["inputs"]["alpha_s"] == pl.Cluster.alpha
    lines = run(capsys, *ISSUE_ARGS)[1].splitlines()
    assert lines[4].startswith("Collectives inside a node: NCCL's model")
    assert run(capsys, *ISSUE_ARGS, "--alpha", "2us")[1].splitlines()[4] == \
        "Collectives inside a node: the α-β ring, α = 2 µs a step (--alpha); between nodes, with --internode-alpha"
    assert run(capsys, *ISSUE_ARGS, "--lang", "es")[1].splitlines()[4].startswith(
        "Colectivas dentro de un nodo: el modelo de NCCL")


@pytest.mark.parametrize("lang", ["en", "es"])
def test_the_published_steps_error_tables_are_the_error_table(lang):
    """Every row of the published step's tables (run, layout, rank, predicted, published, error) reads as
    pub.error_table() gives it, in the text's language: a table cell has no check of its own (its check's number
    can appear elsewhere in the step), so a stale cell was possible."""
    import re
    from pathlib import Path

    import distai.lessons.capstone as capstone
    from distai.lessons.units import format_fixed_percent

    def pct(x: float, sign: bool = False) -> str:  # as the tables write it: the error signed with "−"
        shown = format_fixed_percent(abs(x), 1, lang)
        return ("+" if x >= 0 else "−") + shown if sign else shown

    text = (Path(capstone.__file__).parent / lang / "published.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| ([\d·]+) \| (\d+) (?:of|de) (\d+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", text, re.M)
    table = {r["name"]: r for r in pub.error_table()}
    assert sorted(name for name, *_ in rows) == sorted(table)
    for name, layout, rank, layouts, predicted, published, error in rows:
        r = table[name]
        assert (layout, int(rank), int(layouts)) == ("·".join(map(str, r["layout"])), r["rank"], r["layouts"]), name
        assert (predicted.strip(), published.strip(), error.strip()) == (
            pct(r["predicted_mfu"]), pct(r["published_mfu"]), pct(r["error"], True)), name


def test_readmes_mixtral_plan_is_what_calc_plan_prints(capsys):
    """README's `calc plan` example with --cp and --ep states its result (layout, ZeRO stage, step time, memory):
    the command, run as README writes it, prints that (4.99 s had gone stale when the collectives' model changed)."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if "distai calc plan" in line and "--cp 2 --ep 8" in line)
    command = re.search(r"`(distai calc plan [^`]*)`", row).group(1)
    claims = re.search(r"TP (\d+) × CP (\d+) × DP (\d+) with EP (\d+).*ZeRO-(\d), ([\d.]+) s a step, ([\d.]+) GB per GPU",
                       row)
    assert claims, row
    tp, cp, dp, ep, zero, step, memory = claims.groups()
    code, out, err = run(capsys, *shlex.split(command)[3:], "--json")
    assert code == 0, err
    best = json.loads(out)["best"]
    assert (best["tp"], best["cp"], best["pp"], best["dp"], best["ep"], best["zero"]) == \
        (int(tp), int(cp), 1, int(dp), int(ep), int(zero))
    assert f"{best['step_time_s']:.2f}" == step and f"{best['memory_bytes'] / 1e9:.1f}" == memory
