"""The planner's GPU model against published runs: fit E (per GPU kind) and w½ on the FIT runs, then
print the error table, fitted and held out (``python bench/planner_fit.py``).

E and w½ (``lessons/capstone/formulas.py``, :func:`gemm_efficiency`) are chosen on a grid to minimise
the sum of squared log(predicted / published MFU) over the fitted runs: w½ and the A100's E on
Megatron-LM's Table 1, then the H100's E on Llama 3's 8,192-GPU run with that w½. Every other run of
``published.PUBLISHED`` is held out: its error is what the planner would have said without seeing it.
"""
from __future__ import annotations

import math

from _bench import options

from distai.lessons.capstone import published as pub


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


if __name__ == "__main__":
    main()
