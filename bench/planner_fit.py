"""The planner's GPU model against published runs: fit E (per GPU kind) and w½ on the FIT runs, then
print the error table, fitted and held out (``python bench/planner_fit.py``).

The fit is ``published.fit_gpu_model`` (least squares of log(predicted / published MFU) over
``published.FIT``: w½ on a grid of 25 and the A100's E to two decimals on Megatron-LM's Table 1, then the
H100's E on Llama 3's 8,192-GPU run with that w½); the planner's constants must be its optimum (a test
checks it). Every other run of ``published.PUBLISHED`` is held out: its error is what the planner would
have said without seeing it.

Then DeepSeek-V3, the run the planner describes least well: the facts it takes from DeepSeek's sources,
its approximations, its prediction as the planner runs it (full recomputation: the planner's activation
count, which knows no FP8 caching, fits the published layout only so) and with DeepSeek's own
recomputation (RMSNorm and MLA's up-projections only, about the planner's "selective"), outside the
memory check, each fact taken back in turn; and one layer's time against DeepSeek's training profile.
"""
from __future__ import annotations

import dataclasses

from _bench import options

from distai.lessons.capstone import planner as pl
from distai.lessons.capstone import published as pub


def main() -> None:
    options(__doc__).parse_args()
    fit = pub.fit_gpu_model()
    print(f"fitted: A100 E = {fit['a100']:.2f}, H100 E = {fit['h100']:.2f}, w½ = {fit['half_width']:g} "
          f"(A100 loss {fit['loss']:.4f}, H100 loss {fit['h100_loss']:.6f})")
    print(f"in the module: A100 E = {pl.A100_GEMM:.2f}, H100 E = {pl.H100_GEMM:.2f}, w½ = {pl.GEMM_HALF_WIDTH:g}")
    print(f"{'run':<22} {'set':<9} {'TP PP DP CP EP':<18} {'rank':>7} {'predicted':>9} {'published':>9} {'error':>7}"
          f" {'step err':>8}")
    for row in pub.error_table():
        layout = " ".join(str(x) for x in row["layout"])
        predicted = f"{row['predicted_mfu']:.1%}" if row["predicted_mfu"] else "—"
        error = f"{row['error']:+.1%}" if row["error"] is not None else "—"
        step = f"{row['step_error']:+.1%}" if row["step_error"] is not None else "—"
        print(f"{row['name']:<22} {row['set']:<9} {layout:<18} {row['rank']:>3}/{row['layouts']:<3} "
              f"{predicted:>9} {row['published_mfu']:>9.1%} {error:>7} {step:>8}")
    for which in ("fitted", "held out"):
        print(f"worst |error|, {which}: {pub.worst_error(which):.1%} in MFU, "
              f"{pub.worst_error(which, 'step_error'):.1%} in step time")
    print_sweeps()
    print_nic_per_rank(fit["loss"])
    print_megatron_ranks()
    print_grad_accumulation()
    print_deepseek()


def print_sweeps() -> None:
    """Narayanan 2021, Figs. 13-15: the planner's order of the splits of 64 A100s (held out, rankings), with
    the planner's one NIC a data-parallel ring and with the NICs of its ranks on a node."""
    for key, sweep in pub.SWEEPS.items():
        stated = ", ".join(_split(s) for s in sweep.papers_order)
        print(f"{sweep.name} (64 A100s), the paper's fastest first: {stated}")
        for batch in sweep.batches:
            for nics in ("one", "per-rank"):
                steps = pub.sweep_steps(key, batch, dp_ring_nics=nics)
                order = ", ".join(f"{_split(s)} {steps[s]:.2f} s" for s in sorted(steps, key=steps.__getitem__))
                same = "= paper" if pub.sweep_agrees(key, batch, nics) else "MISS"
                print(f"  batch {batch:3d}, DP ring NICs {nics:8s} {same:7s}: {order}")


def _split(split: tuple[int, int]) -> str:
    return f"TP {split[0]} PP {split[1]}"


def print_nic_per_rank(today_loss: float) -> None:
    """The what-if the sweeps argue for, on the published runs: every data-parallel ring with the NICs of its
    ranks on a node, at today's constants and refitted (``today_loss``: the A100 loss of today's fit)."""
    fit = pub.what_if_refit("nic-per-rank")
    print(f"with a NIC per rank in every data-parallel ring: refitted A100 E = {fit['a100']:.2f}, H100 E = "
          f"{fit['h100']:.2f}, w½ = {fit['half_width']:g} (A100 loss {fit['loss']:.4f}; today's "
          f"{today_loss:.4f})")
    for name in pub.PUBLISHED:
        now, refit = pub.what_if_run("nic-per-rank", name), pub.what_if_run("nic-per-rank", name, True)
        if (now["layout_rank"], refit["layout_rank"]) != (pub.layout_rank(name),) * 2 or refit["layout_rank"] > 5:
            print(f"  {name:18s} rank {pub.layout_rank(name)} -> {now['layout_rank']}, refitted {refit['layout_rank']} "
                  f"(best {refit['best'].layout[:3]}); error {refit['error']:+.1%} refitted")
    worst = max(abs(pub.what_if_run("nic-per-rank", n, True)["error"]) for n in pub.PUBLISHED if n not in pub.FIT)
    print(f"  worst held-out error refitted: {worst:.1%} in MFU")


def print_megatron_ranks() -> None:
    """Megatron-LM's 18.4B and 39.1B, whose TP 8 ranks low: what was checked (published.py's account)."""
    fit = pub.what_if_refit("torch-ddp")
    print("Megatron-LM 18.4B and 39.1B (TP 8 ranked low; published.megatron_rank_account):")
    for name in ("megatron-18.4b", "megatron-39.1b"):
        a, r = pub.megatron_rank_account(name), pub.reproduce(name)
        print(f"  {name}: rank {r['layout_rank']}, step {a['step_s']:.2f} s against the best's {a['best_step_s']:.2f} s "
              f"(TP {a['best_tp']}, PP {a['best_pp']}, {a['best_chunks']} chunks): gap {a['gap_s']:.2f} s; the best's "
              f"pipeline sends {a['best_pp_comm_s']:.3f} s, their TP all-gathers (not counted) {a['gathers_s']:.3f} s; "
              f"TP 8's all-reduces {a['tp_comm_s']:.2f} s")
    for name in ("megatron-1.7b", "megatron-18.4b", "megatron-39.1b", "korthikanti-530b", "korthikanti-1t"):
        now, refit = pub.what_if_run("torch-ddp", name), pub.what_if_run("torch-ddp", name, True)
        print(f"  with PyTorch's DDP on the pp = 1 runs (run_table_1.sh), {name}: rank {now['layout_rank']} "
              f"({now['slower']:+.1%}), error {now['error']:+.1%}; refitted (A100 E = {fit['a100']:.2f}, "
              f"w½ = {fit['half_width']:g}): rank {refit['layout_rank']} ({refit['slower']:+.1%}), "
              f"error {refit['error']:+.1%}")
    # the same question, held out: a 20B model on A100s whose authors trained on TP 2 x PP 4
    places = {split: pub.layout_place("gpt-neox-20b", split) for split in ((2, 4, 12), (2, 2, 24), (8, 1, 12))}
    print("  held out, GPT-NeoX-20B (96 A100-40GB): " + ", ".join(
        f"TP {t} x PP {p} rank {x['rank']} ({x['slower']:+.1%})" for (t, p, _), x in places.items()))


def print_grad_accumulation() -> None:
    """What adding each microbatch's gradients into the reduction's buffer costs the runs that do it outside the
    GEMM (Axes.grad_accumulation), and what the run's error would be without it at today's constants."""
    print("Gradients added into the buffer after each microbatch (Axes.grad_accumulation; errors at the module's constants):")
    for name, p in pub.PUBLISHED.items():
        config = pub.reproduce(name)["config"]
        if not config.time["grad_accumulation_s"]:  # fused in the GEMM, or one microbatch
            continue
        fused = pub.reproduce_run(dataclasses.replace(p, axes=dataclasses.replace(p.axes, grad_accumulation="fused")))
        print(f"  {name:<17} {p.axes.grad_accumulation:<8} {config.time['grad_accumulation_s']:6.2f} s of a {config.step_time_s:6.2f} s step; "
              f"error {pub.prediction_error(name):+.1%}, counted as fused {fused['error']:+.1%}")


def print_deepseek() -> None:
    p = pub.PUBLISHED["deepseek-v3"]
    published = pub.published_mfu("deepseek-v3")
    r = pub.reproduce("deepseek-v3")
    c, cl = r["config"], p.cluster
    attention, backward = pub.deepseek_attention_profile()
    print(f"DeepSeek-V3 (published {published:.1%} of the bf16 peak, 989 TFLOP/s):")
    print("  what the planner takes from DeepSeek's sources (published.py cites each):")
    print(f"    FP8 linear GEMMs at {cl.linear_efficiency:.1%} of the FP8 peak (DeepGEMM README's TFLOP/s on the "
          f"layer's shapes over its speedup on DeepSeek's CUTLASS kernels; DeepGEMM's own "
          f"{pub.deepseek_fp8_gemm_fraction('deepgemm'):.1%}), on {cl.compute_share:.0%} of the SMs (112 of 132)")
    print(f"    FP8 casts: {cl.quantize_bytes_per_token / 1e6:.2f} MB per token and layer through HBM (report Sec. 3.5.2)")
    print(f"    attention core (profile-data): forward at {attention:.1%} of the computing SMs' bf16 peak, "
          f"backward {backward:.2f}x the forward")
    print(f"    DualPipe: bubble (PP/2-1)(F&B+B-3W) = {c.time['bubble_s']:.2f} s, two stages' states per GPU, "
          "all-to-all and PP sends hidden")
    print(f"    AdamW's moments in {p.axes.moments} (report Sec. 3.3.3): optimizer states "
          f"{c.memory['optimizer_bytes'] / 1e9:.2f} GB of {c.memory_bytes / 1e9:.1f} GB on the busiest GPU")
    print("  approximations: the backward's FP8 GEMMs at the forward's measured rate; the dense layers and the MTP "
          "module at the MoE layer's rates; full recomputation (the planner's activation count knows no FP8 "
          "caching), where DeepSeek recomputed only RMSNorm, MLA's up-projections and SwiGLU; the published figure "
          "averages the whole pre-training (batch ramp, checkpoints, restarts included)")
    print(f"  as the planner runs it: {r['predicted_mfu']:.1%} ({r['error']:+.1%}), {c.recompute} recomputation, "
          f"microbatch {c.microbatch}, step {c.step_time_s:.2f} s against "
          f"{p.global_batch * p.model.seq / (p.cluster.gpus * p.value):.2f} s published")
    roomy = dataclasses.replace(cl, gpu_memory=1e12)
    for name, cluster, dual in (
            ("DeepSeek's recomputation", roomy, True),
            ("that, 1F1B in place of DualPipe", roomy, False),
            ("that, the all-to-all not overlapped, 1F1B", dataclasses.replace(roomy, expert_a2a_overlap=False), False),
            ("that, the linear GEMMs in bf16", dataclasses.replace(roomy, linear_flops=None), True),
            ("that, the FP8 GEMMs at the bf16 runs' E", dataclasses.replace(roomy, linear_efficiency=None), True),
            ("that, the attention core at the bf16 runs' E", dataclasses.replace(roomy, attention_efficiency=None,
                                                                               attention_backward=2.0), True)):
        x = pl.evaluate(p.model, cluster, p.global_batch, pl.Config(1, 16, 128, 1, 1, "selective", 1, False, 1, 64),
                        axes=dataclasses.replace(p.axes, dualpipe=dual))
        print(f"  {name} (memory not checked): {x.mfu:.1%} ({x.mfu / published - 1:+.1%})")
    layer = pub.deepseek_layer_seconds()
    print(f"  a layer's forward + backward, one 4K sequence: the planner's average layer {layer['planner'] * 1e3:.1f} "
          f"ms, DeepSeek's profile {layer['profile'] * 1e3:.1f} ms on its compute stream (the rest: MoE permutation, norms, RoPE, casts the byte "
          "count misses)")


if __name__ == "__main__":
    main()
