"""The lessons' formulas reproduce their sources' worked examples and agree with brute force.

Each figure below comes from the source named in the test (paper, section, table) or is worked by
hand in the comment next to it; where an independent computation exists (PyTorch's DDP bucketing,
numpy's spacing, a numerical minimum) the formula is checked against it.
"""
import math

import pytest

from distai.lessons.lesson1 import formulas as f1
from distai.lessons.lesson2 import formulas as f2
from distai.lessons.lesson3 import formulas as f3
from distai.lessons.lesson4 import formulas as f4
from distai.lessons.lesson5 import formulas as f5
from distai.lessons.lesson6 import formulas as f6
from distai.lessons.lesson7 import formulas as f7

# ----------------------------------------------------------------------------- lesson 1

def test_ring_worked_example():
    # 1 GB on 8 ranks, alpha = 5 us, beta = 1/(100 GB/s):
    # 2*7*5e-6 = 70 us latency + 2*7/8 * 1e9 / 1e11 = 17.5 ms bandwidth -> 17.57 ms.
    t = f1.ring_allreduce_time(1e9, 8, 5e-6, 1e-11)
    assert t == pytest.approx(0.01757, rel=1e-12)
    assert f1.allreduce_bytes_per_rank(1e9, 8, "ring") == pytest.approx(1.75e9)
    assert f1.allreduce_steps(8, "ring") == 14
    assert f1.busbw_factor(8) == pytest.approx(1.75)


def test_lesson1_text_worked_example():
    # Lesson 1, step "worked-example": 1 GB of fp16 gradients, N = 8, 25 GB/s links (beta = 4e-11 s/B),
    # alpha = 5 us: 70 us + 70 ms = 70.07 ms; naive 560 ms (8.0x); N = 64: 79.38 ms; crossover 1 MB.
    assert f1.ring_allreduce_time(1e9, 8, 5e-6, 4e-11) == pytest.approx(0.07007)
    assert f1.naive_allreduce_time(1e9, 8, 5e-6, 4e-11) == pytest.approx(0.56007)
    assert f1.ring_allreduce_time(1e9, 64, 5e-6, 4e-11) == pytest.approx(0.07938)
    assert f1.ring_crossover_bytes(8, 5e-6, 4e-11) == pytest.approx(1e6)
    assert f1.ring_allreduce_time(1e6, 8, 5e-6, 4e-11) == pytest.approx(140e-6)


def test_ring_vs_naive_vs_tree():
    S, a, b = 256e6, 2e-6, 1 / 50e9
    for n in (2, 3, 4, 8, 16, 64, 1000):
        ring = f1.ring_allreduce_time(S, n, a, b)
        naive = f1.naive_allreduce_time(S, n, a, b)
        tree = f1.tree_allreduce_time(S, n, a, b)
        assert ring <= naive + 1e-15
        # The ring's bandwidth term stays below 2*S*beta; the others grow with n.
        assert f1.ring_busiest_link_bytes(S, n) < 2 * S
        assert f1.allreduce_bytes_per_rank(S, n, "naive") == (n - 1) * S
        assert f1.allreduce_bytes_per_rank(S, n, "tree") == math.ceil(math.log2(n)) * S
        assert tree == pytest.approx(2 * math.ceil(math.log2(n)) * (a + S * b))
    # With tiny messages the tree's log steps beat the ring's 2(n-1) steps.
    assert f1.tree_allreduce_time(8, 64, 5e-6, 1e-11) < f1.ring_allreduce_time(8, 64, 5e-6, 1e-11)
    assert f1.ring_allreduce_time(123, 1, 1, 1) == 0.0
    assert f1.allreduce_steps(5, "tree") == 6 and f1.tree_depth(1) == 0


def test_busbw_nccl_definition():
    # nccl-tests PERFORMANCE.md: busbw = algbw * 2(n-1)/n; a 1 GB all-reduce in 10 ms on 8 ranks:
    assert f1.algbw(1e9, 0.01) == pytest.approx(1e11)
    assert f1.busbw(1e9, 0.01, 8) == pytest.approx(1.75e11)
    # The time from the model, turned back into busbw, gives the link bandwidth 1/beta when alpha=0.
    t = f1.ring_allreduce_time(4e8, 16, 0, 1 / 80e9)
    assert f1.busbw(4e8, t, 16) == pytest.approx(80e9)


def test_alpha_beta_fit_recovers_parameters():
    n, alpha, beta = 4, 7e-6, 1 / 12e9
    sizes = [2 ** k for k in range(10, 28)]
    times = [f1.ring_allreduce_time(s, n, alpha, beta) for s in sizes]
    a, b = f1.alpha_beta_fit(sizes, times)
    assert a / (2 * (n - 1)) == pytest.approx(alpha, rel=1e-6)
    assert b / f1.busbw_factor(n) == pytest.approx(beta, rel=1e-6)
    # noise that tilts the line below the origin: no negative latency, the best line through it (in relative
    # error, each time weighted 1/t²)
    sizes, times = [1e3, 1e4, 1e5], [1e-7, 2e-6, 2e-5]
    assert f1.alpha_beta_fit(sizes, times) == (0.0, pytest.approx(sum(s / t for s, t in zip(sizes, times))
                                                                  / sum((s / t) ** 2 for s, t in zip(sizes, times))))
    # slower for smaller: the weighted mean, Σ(1/t)/Σ(1/t²)
    assert f1.alpha_beta_fit([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]) == (pytest.approx((1 / 3 + 1 / 2 + 1) /
                                                                                  (1 / 9 + 1 / 4 + 1)), 0.0)
    # the largest messages' noise does not set the latency: 1-32 KiB at 0.4-0.5 ms, 8-64 MiB scattered by
    # milliseconds around 20 ms/64 MiB (the sweep of the review, 2 loaded cores)
    small = [1 << k for k in range(10, 16)]
    large = [8 << 20, 16 << 20, 32 << 20, 64 << 20]
    sizes = small + large
    times = [4e-4 + s * 3e-10 for s in small] + [2.5e-3 + 4e-3, 5e-3 - 3e-3, 1e-2 + 5e-3, 2e-2 - 4e-3]
    a, _ = f1.alpha_beta_fit(sizes, times)
    assert 3.9e-4 < a < 4.2e-4  # the small messages' intercept; absolute error put it at 1.9 ms


def test_lesson1_rejects_bad_input():
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError):
            f1.ring_allreduce_time(1, bad, 0, 0)
    with pytest.raises(ValueError):
        f1.allreduce_time(1, 2, 0, 0, "butterfly")
    with pytest.raises(ValueError):
        f1.ring_allreduce_time(-5, 2, 0, 0)


# ----------------------------------------------------------------------------- lesson 2

def test_zero_paper_worked_example():
    # Rajbhandari et al. 2020, Fig. 1: Psi = 7.5B, N_d = 64, K = 12.
    psi, n = 7.5e9, 64
    ddp = f2.model_state_bytes(psi, n, "ddp")
    z1 = f2.model_state_bytes(psi, n, "zero1")
    z2 = f2.model_state_bytes(psi, n, "zero2")
    z3 = f2.model_state_bytes(psi, n, "zero3")
    assert ddp["total_bytes"] == 120_000_000_000                       # 120 GB
    assert round(z1["total_bytes"] / 1e9, 1) == 31.4                    # 31.4 GB
    assert round(z2["total_bytes"] / 1e9, 1) == 16.6                    # 16.6 GB
    assert round(z3["total_bytes"] / 1e9, 2) == 1.88                    # 1.88 GB
    assert z1["total_bytes"] == 4 * 7_500_000_000 + 12 * 117_187_500
    assert z2 == {"params_bytes": 15_000_000_000, "grads_bytes": 234_375_000,
                  "optimizer_bytes": 1_406_250_000, "total_bytes": 16_640_625_000}
    assert f2.model_state_bytes(psi, n, "fsdp") == z3


def test_bytes_per_param_assumptions():
    assert f2.bytes_per_param("adam", "mixed") == {"params": 2, "grads": 2, "optimizer": 12}
    assert f2.optimizer_k("sgd", "mixed") == 8
    assert f2.optimizer_k("sgd-nomomentum", "mixed") == 4
    assert f2.bytes_per_param("adam", "fp32") == {"params": 4, "grads": 4, "optimizer": 8}
    assert f2.bytes_per_param("sgd", "fp32")["optimizer"] == 4
    assert f2.bytes_per_param("sgd-nomomentum", "fp32")["optimizer"] == 0
    assert f2.bytes_per_param("adamw") == f2.bytes_per_param("adam")
    # DeepSeek-V3's AdamW (Sec. 3.3.3): BF16 moments beside the fp32 master copy, 8 bytes
    assert f2.bytes_per_param("adam", "mixed", "bf16") == {"params": 2, "grads": 2, "optimizer": 8}
    assert f2.bytes_per_param("sgd", "mixed", "bf16")["optimizer"] == 6
    with pytest.raises(ValueError, match="moment precision"):
        f2.bytes_per_param("adam", "mixed", "fp8")


@pytest.mark.parametrize("moments", sorted(f2.MOMENT_BYTES))
def test_moment_bytes_are_what_torch_adamw_and_sgd_allocate(moments):
    """PyTorch's optimizers keep each moment in the dtype of what they update: the bytes of the states
    torch.optim.AdamW and SGD with momentum actually allocate, per element, against lesson 2's parts."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[moments]
    for name, make in (("adam", lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
                       ("sgd", lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9))):
        p = torch.nn.Parameter(torch.randn(64, dtype=dtype))
        opt = make([p])
        p.grad = torch.randn_like(p)
        opt.step()
        state = {k: v for k, v in opt.state[p].items() if torch.is_tensor(v) and v.numel() == p.numel()}
        held = {k: v.element_size() for k, v in state.items()}
        parts = f2.optimizer_state_parts(name, "mixed", moments)
        assert sum(held.values()) == parts["momentum"] + parts["variance"], (name, held)
        assert held.get("exp_avg", held.get("momentum_buffer")) == parts["momentum"]


def test_sharding_rounds_up_and_dp1_is_ddp():
    # 10 parameters over 4 ranks: each holds ceil(10/4) = 3 elements of a sharded state.
    z3 = f2.model_state_bytes(10, 4, "zero3")
    assert z3 == {"params_bytes": 6, "grads_bytes": 6, "optimizer_bytes": 36, "total_bytes": 48}
    for s in f2.STRATEGIES:
        assert f2.model_state_bytes(1000, 1, s) == f2.model_state_bytes(1000, 1, "ddp")


def test_max_params_that_fit_inverts_model_state():
    for strategy in f2.STRATEGIES:
        for n in (1, 8, 64):
            mem = 80e9
            psi = f2.max_params_that_fit(mem, n, strategy)
            assert f2.model_state_bytes(psi, n, strategy)["total_bytes"] <= mem
            assert f2.model_state_bytes(psi + n, n, strategy)["total_bytes"] > mem
    assert f2.max_params_that_fit(80e9, 1, "ddp") == 5_000_000_000  # 80 GB / 16 B


def test_comm_volume_2psi_vs_3psi():
    assert f2.comm_volume_per_step(1000, "ddp")["elements"] == 2000
    assert f2.comm_volume_per_step(1000, "zero1")["elements"] == 2000
    assert f2.comm_volume_per_step(1000, "zero2")["elements"] == 2000
    z3 = f2.comm_volume_per_step(1000, "zero3", dp=4)
    assert z3["elements"] == 3000 and z3["bytes"] == 6000
    assert z3["exact_elements"] == pytest.approx(2250)
    assert z3["elements"] / f2.comm_volume_per_step(1000, "ddp")["elements"] == 1.5


def test_korthikanti_activation_formulas_gpt3():
    # GPT-3 175B (Korthikanti et al. 2022, Table 3): a = 96, h = 12288, s = 2048, t = 8; b = 1.
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert 5 * a * s / h == 80  # the attention term that selective recomputation removes
    assert f2.activation_bytes_per_layer(s, b, h, a) == sbh * 114  # 34 + 80
    assert f2.activation_bytes_per_layer(s, b, h, a) == pytest.approx(2.869e9, rel=1e-3)
    assert f2.activation_bytes_per_layer(s, b, h, a, t) == pytest.approx(sbh * (10 + 24 / 8 + 80 / 8))
    assert f2.activation_bytes_per_layer(s, b, h, a, t, True) == pytest.approx(sbh * 114 / 8)
    assert f2.activation_bytes_per_layer(s, b, h, a, t, True, "selective") == pytest.approx(sbh * 34 / 8)
    assert f2.activation_bytes_per_layer(s, b, h, a, t, False, "selective") == pytest.approx(sbh * 13)
    assert f2.activation_bytes_per_layer(s, b, h, a, t, False, "full") == 2 * sbh
    # Korthikanti Sec. 4.3: TP+SP+selective is ~5x less than TP alone for this model (23 sbh vs 4.25 sbh).
    ratio = f2.activation_bytes_per_layer(s, b, h, a, t) / f2.activation_bytes_per_layer(s, b, h, a, t, True, "selective")
    assert ratio == pytest.approx(23 / 4.25)
    assert f2.activation_bytes(96, s, b, h, a, t, True, "selective") == pytest.approx(96 * sbh * 34 / 8)


def test_memory_per_gpu_adds_activations():
    m = f2.memory_per_gpu(7.5e9, 64, "zero2", layers=2, hidden=64, seq=8, micro_batch=1, heads=4)
    act = 2 * 8 * 64 * (34 + 5 * 4 * 8 / 64)
    assert m["activations_bytes"] == act
    assert m["total_bytes"] == 16_640_625_000 + act
    assert f2.memory_per_gpu(1000)["activations_bytes"] is None
    with pytest.raises(ValueError):
        f2.memory_per_gpu(1000, layers=2)


# ----------------------------------------------------------------------------- lesson 3

def test_young_and_daly_worked_numbers():
    # M = 24 h, delta = 5 min: Young sqrt(2*300*86400) = 7200 s exactly.
    assert f3.young_interval(86400, 300) == pytest.approx(7200)
    # Daly: delta/(2M) = 1/576, sqrt = 1/24: 7200*(1 + 1/72 + 1/5184) - 300 = 7001.389 s.
    assert f3.daly_interval(86400, 300) == pytest.approx(7200 * (1 + 1 / 72 + 1 / 5184) - 300)
    assert f3.daly_interval(86400, 300) == pytest.approx(7001.389, abs=1e-3)
    assert f3.daly_interval(100, 300) == 100  # delta >= 2M: checkpoint every M


def test_daly_is_near_the_true_optimum():
    # Daly's estimate lands within a few percent of the numerically minimised waste of his model,
    # and its waste is within 0.1% (absolute) of the minimum.
    for M in (600, 3600, 86400, 10 * 86400):
        for d in (1, 10, 60, 300):
            if d > M / 4:
                continue
            for R in (0, 60, 600):
                best = f3.optimal_interval_numeric(M, d, R)
                daly = f3.daly_interval(M, d, R)
                assert daly == pytest.approx(best, rel=0.05), (M, d, R)
                w_best = f3.expected_waste_fraction(best, M, d, R)
                assert f3.expected_waste_fraction(daly, M, d, R) - w_best < 1e-3


def test_waste_model_limits():
    # Small tau, delta, R against M: the exact model approaches the first-order one.
    x = f3.first_order_overhead(600, 1e7, 10, 30)
    assert f3.expected_wall_time(1.0, 600, 1e7, 10, 30) - 1 == pytest.approx(x, rel=1e-3)
    assert f3.expected_waste_fraction(600, 1e7, 10, 30) == pytest.approx(x / (1 + x), rel=1e-3)
    # No checkpoint cost and no restart: waste is the expected redone work, about tau/(2M).
    assert f3.expected_waste_fraction(100, 1e6, 0, 0) == pytest.approx(100 / 2e6, rel=1e-3)


def test_job_mtbf_llama3_log():
    # Llama 3 (arXiv:2407.21783, Sec. 3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs.
    gpu = f3.component_mtbf_from_log(16384, 54 * 86400, 419)
    job = f3.job_mtbf(gpu, 16384)
    assert job == pytest.approx(54 * 86400 / 419)
    assert job / 3600 == pytest.approx(3.093, abs=1e-3)       # a failure about every 3.1 hours
    assert gpu / 3600 / 24 / 365 == pytest.approx(5.78, abs=0.01)  # ~5.8 years per GPU


# ----------------------------------------------------------------------------- lesson 4

def test_tp_comm_same_bytes_with_and_without_sp():
    h, s, b, t = 4096, 2048, 1, 4
    plain = f4.tp_comm_per_layer(h, s, b, t, False)
    sp = f4.tp_comm_per_layer(h, s, b, t, True)
    x = s * b * h * 2
    assert plain["tensor_bytes"] == x
    assert plain["forward"] == {"all_reduce": 2} and plain["backward"] == {"all_reduce": 2}
    assert sp["forward"] == {"all_gather": 2, "reduce_scatter": 2}
    assert plain["forward_bytes_per_rank"] == pytest.approx(2 * 2 * 3 / 4 * x)
    assert sp["total_bytes_per_rank"] == pytest.approx(plain["total_bytes_per_rank"])
    timed = f4.tp_comm_per_layer(h, s, b, t, False, alpha=1e-5, beta=1e-11)
    assert timed["forward_time_s"] == pytest.approx(2 * f1.ring_allreduce_time(x, t, 1e-5, 1e-11))
    timed_sp = f4.tp_comm_per_layer(h, s, b, t, True, alpha=1e-5, beta=1e-11)
    assert timed_sp["total_time_s"] == pytest.approx(timed["total_time_s"])
    assert f4.tp_comm_per_layer(h, s, b, 1)["total_bytes_per_rank"] == 0


def test_sp_activation_saving():
    # GPT-3 numbers: (10 + 3 + 10) / (114/8) = 23 / 14.25.
    assert f4.tp_activation_saving(2048, 1, 12288, 96, 8) == pytest.approx(23 / 14.25)


# ----------------------------------------------------------------------------- lesson 5

def test_bubble_worked_numbers():
    # p = 4, m = 8: (p-1)/(m+p-1) = 3/11 of the step, (p-1)/m = 3/8 of the ideal time.
    r = f5.pipeline_bubble(4, 8, "1f1b")
    assert r == {"bubble_fraction": 3 / 11, "bubble_ratio": 3 / 8, "peak_inflight_microbatches": 4.0,
                 "step_time_units": 11.0}
    assert f5.pipeline_bubble(4, 8, "gpipe")["peak_inflight_microbatches"] == 8.0
    # GPipe Sec. 2.3: with M >= 4K the bubble is small: K = 4, M = 16 -> 3/19 = 15.8%.
    assert f5.bubble_fraction(4, 16) == pytest.approx(0.158, abs=1e-3)
    # Narayanan et al. 2021: interleaving with v chunks divides the bubble by v.
    inter = f5.pipeline_bubble(4, 8, "interleaved", 2)
    assert inter["bubble_ratio"] == pytest.approx(3 / 16)
    assert inter["bubble_fraction"] == pytest.approx(3 / 19)
    assert inter["step_time_units"] == pytest.approx(9.5)
    # Rank 0 warm-up (v-1)p + 2(p-1) = 4 + 6 = 10 chunks, +1 -> 11 chunks of half a stage = 5.5.
    assert inter["peak_inflight_microbatches"] == pytest.approx(5.5)
    assert f5.microbatches_for_bubble(8, 0.1) == 63  # 7/(63+7) = 0.1


def test_bubble_identities_over_grid():
    for p in range(1, 17):
        for m in range(1, 40):
            for v in (1, 2, 3, 4):
                if v > 1 and (m < p or m % (m // p)):
                    continue  # the interleaved schedule refuses these (tests/test_lesson5_simulator.py)
                frac = f5.bubble_fraction(p, m, v)
                steps = f5.step_time_units(p, m, v)
                assert frac == pytest.approx((steps - m) / steps)
                assert f5.bubble_ratio(p, m, v) == pytest.approx((steps - m) / m)
            assert f5.peak_inflight_microbatches(p, m, "1f1b") == min(p, m)
            assert f5.warmup_forwards("1f1b", p, m, 0) + 1 == min(p, m + 1)


def test_interleaved_warmup_matches_torch_pipelining():
    import inspect

    import torch
    from torch.distributed.pipelining import schedules

    # a private helper, not kept stable across releases: compared where it takes the six arguments of torch 2.13
    _get_warmup_ops = getattr(schedules, "_get_warmup_ops", None)
    if _get_warmup_ops is None or len(inspect.signature(_get_warmup_ops).parameters) != 6:
        pytest.skip(f"torch {torch.__version__} has no _get_warmup_ops(rank, v, p, p, m, factor) to compare with")
    for p in (2, 3, 4, 8):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 4 * p):
                for rank in range(p):
                    assert f5.warmup_forwards("interleaved", p, m, rank, v) == _get_warmup_ops(rank, v, p, p, m, 2)


def test_lesson5_rejects_bad_input():
    with pytest.raises(ValueError):
        f5.pipeline_bubble(4, 8, "gpipe", 2)
    with pytest.raises(ValueError):
        f5.pipeline_bubble(4, 8, "interleaved", 1)
    with pytest.raises(ValueError):
        f5.pipeline_bubble(0, 8)
    with pytest.raises(ValueError):
        f5.pipeline_bubble(4, 8, "zb")


# ----------------------------------------------------------------------------- lesson 6

def test_format_constants():
    assert f6.max_value("fp16") == 65504
    assert f6.smallest_normal("fp16") == 2 ** -14
    assert f6.smallest_subnormal("fp16") == 2 ** -24
    assert f6.machine_epsilon("bf16") == 2 ** -7
    assert f6.max_value("fp8_e5m2") == 57344 and f6.max_value("fp8_e4m3") == 448
    torch = pytest.importorskip("torch")
    for name, dt in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        fi = torch.finfo(dt)
        assert f6.max_value(name) == fi.max
        assert f6.smallest_normal(name) == fi.tiny
        assert f6.machine_epsilon(name) == fi.eps
        assert f6.smallest_subnormal(name) == fi.smallest_normal * fi.eps  # 2^(1-bias) * 2^-m


def test_spacing_and_rounding_match_numpy_and_torch():
    import random

    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    rng = random.Random(0)
    values = [rng.uniform(-1, 1) * 10 ** rng.uniform(-9, 4.8) for _ in range(2000)] + [1.0, 2048, 65504, 1e-7]
    for x in values:
        h = abs(np.float16(x))
        if 0 < h < 65504:  # numpy's spacing of the largest value is inf (the next one overflows)
            assert f6.spacing(float(h), "fp16") == float(np.spacing(h))
        assert f6.spacing(x, "fp32") == float(np.spacing(np.float32(abs(x)))) or abs(np.float32(x)) != abs(x)
        assert f6.round_to_format(x, "fp16") == float(torch.tensor(x, dtype=torch.float64).to(torch.float16))
        assert f6.round_to_format(x, "bf16") == float(torch.tensor(x, dtype=torch.float64).to(torch.bfloat16))
        assert f6.round_to_format(x, "fp32") == float(torch.tensor(x, dtype=torch.float64).to(torch.float32))
    assert f6.round_to_format(65520, "fp16") == math.inf
    assert f6.round_to_format(65519, "fp16") == 65504


def test_master_weights_and_underflow_examples():
    # Micikevicius et al. 2018: a weight of 1 and an update of 1e-4 — lost in fp16 (spacing 2^-10),
    # kept in fp32.
    assert f6.spacing(1.0, "fp16") == 2 ** -10
    assert f6.update_is_lost(1.0, 1e-4, "fp16")
    assert not f6.update_is_lost(1.0, 1e-4, "fp32")
    assert f6.underflows(2e-8, "fp16") and not f6.underflows(4e-8, "fp16")
    assert not f6.underflows(2e-8, "bf16")


def test_gradscaler_trajectory_matches_torch():
    torch = pytest.importorskip("torch")
    pattern = [False] * 5 + [True] + [False] * 7 + [True, True] + [False] * 9
    ours = f6.gradscaler_trajectory(pattern, init_scale=2.0 ** 10, growth_interval=3)
    scale = torch.tensor([2.0 ** 10])
    tracker = torch.tensor([0], dtype=torch.int32)
    theirs = []
    for overflow in pattern:
        torch._amp_update_scale_(scale, tracker, torch.tensor([1.0 if overflow else 0.0]), 2.0, 0.5, 3)
        theirs.append(scale.item())
    assert ours == theirs
    assert f6.GRADSCALER_DEFAULTS == {"init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                      "growth_interval": 2000}
    assert f6.gradscaler_scale_after(4000, 3) == 2 ** 16 / 8 * 4
    assert f6.gradscaler_trajectory([False] * 4000 + [True] * 3)[-1] == 2 ** 16 * 4 / 8


def test_ddp_buckets_match_torch_assignment():
    torch = pytest.importorskip("torch")
    import random

    import torch.distributed as dist

    rng = random.Random(1)
    for trial in range(30):
        numels = [rng.choice([1, 10, 1000, 65536, 262144, 1 << 20, 3 << 20]) for _ in range(rng.randint(1, 40))]
        tensors = [torch.empty(n, dtype=torch.float32) for n in numels]
        expect, _ = dist._compute_bucket_assignment_by_size(tensors, [1 << 20, 25 << 20], [False] * len(tensors))
        assert f6.ddp_buckets([4 * n for n in numels]) == [list(b) for b in expect]
    assert f6.ddp_uniform_bucket_count(100, 1 << 20) == 1 + math.ceil(99 / 25)


# ----------------------------------------------------------------------------- lesson 7

def test_kv_cache_llama2_70b():
    # Llama-2-70B, GQA: 80 layers, 8 KV heads, d = 128, fp16: 2*80*8*128*2 = 327,680 B = 320 KiB per token.
    assert f7.kv_cache_bytes_per_token(80, 8, 128, 2) == 327_680 == 320 * 1024
    # The same model with multi-head attention (64 KV heads) needs 8x: 2.5 MiB per token.
    assert f7.kv_cache_bytes_per_token(80, 64, 128, 2) == 8 * 327_680
    r = f7.kv_cache_total(80, 8, 128, 2, tokens=4096, tp=8, pp=1)
    assert r["total_bytes"] == 327_680 * 4096 and r["per_gpu_bytes"] == 327_680 * 4096 // 8
    r = f7.kv_cache_total(80, 8, 128, 2, tokens=4096, tp=2, pp=4)
    assert r["per_gpu_bytes"] == 2 * 20 * 4 * 128 * 2 * 4096
    # t > H_kv: heads are replicated, each rank holds one.
    assert f7.kv_heads_per_gpu(8, 16) == 1
    with pytest.raises(ValueError):
        f7.kv_heads_per_gpu(8, 3)
    with pytest.raises(ValueError):
        f7.kv_cache_total(80, 8, 128, 2, tokens=1, pp=81)
    assert f7.dtype_bytes("fp8") == 1 and f7.dtype_bytes("bf16") == 2


def test_decode_roofline():
    # 70B parameters in fp16 = 140 GB of weights; at 3.35 TB/s one sequence decodes at most ~23.9 tok/s.
    w = 70e9 * 2
    assert f7.decode_tokens_per_s_upper_bound(3.35e12, w) == pytest.approx(23.93, abs=0.01)
    # Batch 1 is memory-bound: FLOPs 2N = 1.4e11 at 989e12 FLOP/s = 0.14 ms << 140e9/3.35e12 = 41.8 ms.
    t = f7.decode_time_per_token(70e9, w, 327_680 * 1000, 989e12, 3.35e12, batch=1)
    assert t == pytest.approx((w + 327_680_000) / 3.35e12)
    # Prefill of 2048 tokens is compute-bound: 2*70e9*2048 / 989e12 = 0.29 s.
    assert f7.prefill_time(70e9, 2048, w, 989e12, 3.35e12) == pytest.approx(2 * 70e9 * 2048 / 989e12)
    assert f7.ridge_point(989e12, 3.35e12) == pytest.approx(295.2, abs=0.1)
    assert f7.arithmetic_intensity(2 * 70e9, w) == 1.0
    assert f7.tp_decode_comm_time(80, 8192, 1, 8, 5e-6, 1e-11) == pytest.approx(
        160 * f1.ring_allreduce_time(8192 * 2, 8, 5e-6, 1e-11))
    assert f7.max_kv_tokens(10 * 327_680 + 5, 327_680) == 10
