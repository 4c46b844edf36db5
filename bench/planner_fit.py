"""The planner's GPU model against published runs: fit E (per GPU kind) and w½ on the FIT runs, then
print the error table, fitted and held out (``python bench/planner_fit.py``).

The fit is ``published.fit_gpu_model`` (least squares of log(predicted / published MFU) over
``published.FIT``: w½ on a grid of 25 and the A100's E to two decimals on Megatron-LM's Table 1, then the
H100's E on Llama 3's 8,192-GPU run with that w½); the planner's constants must be its optimum (a test
checks it). Every other run of ``published.PUBLISHED`` is held out: its error is what the planner would
have said without seeing it.

Then DeepSeek-V3, the run the planner describes least well: its prediction as the planner runs it (full
recomputation: the planner's activation count, which knows no FP8 caching, fits the published layout
only so) and with DeepSeek's own recomputation (RMSNorm and MLA's up-projections only, about the
planner's "selective"), outside the memory check.
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
    print(f"{'run':<22} {'set':<9} {'TP PP DP CP EP':<18} {'rank':>7} {'predicted':>9} {'published':>9} {'error':>7}")
    for row in pub.error_table():
        layout = " ".join(str(x) for x in row["layout"])
        predicted = f"{row['predicted_mfu']:.1%}" if row["predicted_mfu"] else "—"
        error = f"{row['error']:+.1%}" if row["error"] is not None else "—"
        print(f"{row['name']:<22} {row['set']:<9} {layout:<18} {row['rank']:>3}/{row['layouts']:<3} "
              f"{predicted:>9} {row['published_mfu']:>9.1%} {error:>7}")
    for which in ("fitted", "held out"):
        print(f"worst |error|, {which}: {pub.worst_error(which):.1%}")
    print_deepseek()


def print_deepseek() -> None:
    p = pub.PUBLISHED["deepseek-v3"]
    published = pub.published_mfu("deepseek-v3")
    r = pub.reproduce("deepseek-v3")
    c = r["config"]
    print(f"DeepSeek-V3 (published {published:.1%} of the bf16 peak, 989 TFLOP/s):")
    print(f"  as the planner runs it: {r['predicted_mfu']:.1%} ({r['error']:+.1%}), {c.recompute} recomputation, "
          f"microbatch {c.microbatch}, all-to-all {c.time['ep_comm_s']:.2f} s not hidden")
    roomy = dataclasses.replace(p.cluster, gpu_memory=1e12)
    for name, cluster in (("DeepSeek's recomputation", roomy),
                          ("that, the all-to-all not overlapped", dataclasses.replace(roomy, expert_a2a_overlap=False)),
                          ("that, the linear GEMMs in bf16", dataclasses.replace(roomy, linear_flops=None))):
        x = pl.evaluate(p.model, cluster, p.global_batch, pl.Config(1, 16, 128, 1, 1, "selective", 1, False, 1, 64))
        print(f"  {name} (memory not checked): {x.mfu:.1%} ({x.mfu / published - 1:+.1%})")


if __name__ == "__main__":
    main()
