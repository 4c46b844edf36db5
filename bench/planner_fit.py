"""The planner's GPU model against published runs: fit E (per GPU kind) and w½ on the FIT runs, then
print the error table, fitted and held out (``python bench/planner_fit.py``).

E and w½ (``lessons/capstone/formulas.py``, :func:`gemm_efficiency`) are chosen on a grid to minimise
the sum of squared log(predicted / published MFU) over the fitted runs: w½ and the A100's E on
Megatron-LM's Table 1, then the H100's E on Llama 3's 8,192-GPU run with that w½. Every other run of
``published.PUBLISHED`` is held out: its error is what the planner would have said without seeing it.

Then a what-if for DeepSeek-V3, the run the planner describes least well (``published.py``): its
prediction with each published fact the description leaves out put back, alone and together —
Multi-head Latent Attention's wider attention core (128 heads of q·k width 192 and v width 128, where
plain attention has h = 7168: a·(192 + 128)/(2h) = 2.86 times the FLOPs), the 20 of the H800's 132 SMs
DeepSeek gives its all-to-all (Sec. 3.2.2: compute on 112), and the linear layers' GEMMs in FP8 at
twice the bf16 rate (Sec. 3.3; the H800's dense FP8 peak is 2× its bf16 peak). Not the planner: its
layer model patched for this one run.
"""
from __future__ import annotations

import itertools
import math

from _bench import options

from distai.lessons.capstone import formulas as fc
from distai.lessons.capstone import published as pub

MLA_ATTENTION = 128 * (192 + 128) / (2 * 7168)  # MLA's attention core over plain attention's (DeepSeek-V3)
COMPUTE_SMS = 112 / 132  # the SMs left to compute while 20 run the all-to-all
FP8_SPEEDUP = 2.0  # H800 dense FP8 over bf16 peak


def loss(names: list[str], peak_fraction: float, half_width: float) -> float:
    total = 0.0
    for name in names:
        r = pub.reproduce_run(pub.with_gpu_model(pub.PUBLISHED[name], peak_fraction, half_width))
        total += math.log(r["predicted_mfu"] / r["published_mfu"]) ** 2 if r["predicted_mfu"] else 10.0
    return total


def fit(names: list[str], fractions: list[float], widths: list[float]) -> tuple[float, float, float]:
    return min((loss(names, e, w), e, w) for e in fractions for w in widths)


def main() -> None:
    args = options(__doc__, step=(0.01, "grid step of E")).parse_args()
    grid = [round(0.5 + args.step * i, 4) for i in range(int(0.5 / args.step) + 1)]
    a100 = [n for n in pub.FIT if pub.PUBLISHED[n].cluster.flops == 312e12]
    h100 = [n for n in pub.FIT if n not in a100]
    err, e_a100, w = fit(a100, grid, [0, 50, 100, 150, 200, 250, 300, 400, 500, 600, 800])
    _, e_h100, _ = fit(h100, grid, [w])
    print(f"fitted: A100 E = {e_a100:.2f}, H100 E = {e_h100:.2f}, w½ = {w:g} (A100 loss {err:.4f})")
    print(f"in the module: A100 E = {pub.A100_GEMM:.2f}, H100 E = {pub.H100_GEMM:.2f}, "
          f"w½ = {pub.pl.GEMM_HALF_WIDTH:g}")
    print(f"{'run':<22} {'set':<9} {'TP PP DP CP EP':<18} {'rank':>7} {'predicted':>9} {'published':>9} {'error':>7}")
    for row in pub.error_table():
        layout = " ".join(str(x) for x in row["layout"])
        predicted = f"{row['predicted_mfu']:.1%}" if row["predicted_mfu"] else "—"
        error = f"{row['error']:+.1%}" if row["error"] is not None else "—"
        print(f"{row['name']:<22} {row['set']:<9} {layout:<18} {row['rank']:>3}/{row['layouts']:<3} "
              f"{predicted:>9} {row['published_mfu']:>9.1%} {error:>7}")
    for which in ("fitted", "held out"):
        print(f"worst |error|, {which}: {pub.worst_error(which):.1%}")
    print_deepseek_what_if()


def deepseek_what_if(mla: bool, sms: bool, fp8: bool) -> dict:
    """DeepSeek-V3's reproduction with the layer model patched by the facts its description leaves out."""
    plain = fc.layer_forward_seconds

    def patched(**kw) -> dict:
        r = dict(plain(**kw))
        r["attention_s"] *= MLA_ATTENTION if mla else 1.0
        r["gemm_s"] /= FP8_SPEEDUP if fp8 else 1.0
        r["total_s"] = r["gemm_s"] + r["attention_s"] + r["memory_s"]
        for key in ("gemm_s", "attention_s", "softmax_s", "total_s"):
            r[key] /= COMPUTE_SMS if sms else 1.0
        return r

    fc.layer_forward_seconds = patched
    try:
        return pub.reproduce_run(pub.PUBLISHED["deepseek-v3"])
    finally:
        fc.layer_forward_seconds = plain


def print_deepseek_what_if() -> None:
    print("DeepSeek-V3 what-if (not the planner): MLA core, 20 SMs for the all-to-all, FP8 GEMMs")
    for mla, sms, fp8 in itertools.product((False, True), repeat=3):
        r = deepseek_what_if(mla, sms, fp8)
        c = r["config"]
        print(f"  MLA {'on ' if mla else 'off'}  SMs {'112' if sms else '132'}  FP8 {'on ' if fp8 else 'off'}: "
              f"{r['predicted_mfu']:.1%} vs {r['published_mfu']:.1%} ({r['error']:+.1%}), "
              f"{c.recompute} recomputation, microbatch {c.microbatch}")


if __name__ == "__main__":
    main()
