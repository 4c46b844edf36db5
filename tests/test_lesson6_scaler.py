"""Lesson 6: the from-scratch loss scaler against torch.amp.GradScaler, master weights, and the
lesson's pure models (scaler simulation, exponent histograms, overlap timeline)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from distai.engine.bucketing import assign_buckets, bucket_limits
from distai.engine.loss_scaling import DynamicLossScaler, MasterWeightOptimizer, to_float32
from distai.engine.model import GPT, GPTConfig, lm_loss, make_batch
from distai.lessons.lesson6 import formulas as F
from distai.lessons.lesson6 import simulation as S

INJECT = {4: float("inf"), 5: float("inf"), 11: float("nan"), 19: float("-inf")}


CFG = GPTConfig(vocab=32, hidden=16, heads=2, layers=1, seq=8)  # the lesson's GPT, tiny


def _train(scaler, steps=28, explicit=False, dtype=torch.float16):
    """A training run with injected infs/NaNs; returns per-step scale, params and Adam step counts."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second thread only adds synchronisation (slow on a busy machine)
    try:
        return _train_run(scaler, steps, explicit, dtype)
    finally:
        torch.set_num_threads(threads)


def _train_run(scaler, steps, explicit, dtype):
    model = GPT(CFG, seed=0, dtype=dtype if explicit else torch.float32)
    if explicit:
        opt = MasterWeightOptimizer(model.parameters(), lambda ps: torch.optim.Adam(ps, lr=1e-2))
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scales, params, counts = [], [], []
    for i in range(steps):
        opt.zero_grad()
        ids, targets = make_batch(CFG, 8, seed=1, step=i)
        with torch.autocast("cpu", dtype=dtype, enabled=not explicit):
            logits = model(ids)
        loss = lm_loss(logits.float(), targets)
        scaler.scale(loss).backward()
        if i in INJECT:
            model.blocks[0].mlp.fc1.weight.grad[1, 2] = INJECT[i]
        if explicit:
            opt.grads_to_master()
        scales.append(scaler.get_scale())
        scaler.step(opt)
        scaler.update()
        params.append([p.detach().clone() for p in model.parameters()])
        state = opt.state[next(iter(opt.param_groups[0]["params"]))]
        counts.append(int(state["step"]) if "step" in state else 0)
    scales.append(scaler.get_scale())
    return scales, params, counts


@pytest.mark.parametrize("kwargs", [
    # natural fp16 overflows from a huge initial scale, growth every 3 good steps
    dict(init_scale=2.0 ** 30, growth_interval=3),
    # factors that are not powers of two: the float32 rounding of each product matters
    dict(init_scale=3.0e5, growth_factor=1.7, backoff_factor=0.3, growth_interval=2),
])
def test_scaler_matches_gradscaler_step_for_step(kwargs):
    theirs = _train(torch.amp.GradScaler("cpu", **kwargs))
    ours = _train(DynamicLossScaler(**kwargs))
    assert ours[0] == theirs[0]                        # the scale trajectory, every step
    assert ours[2] == theirs[2]                        # the same steps were skipped
    for step, (pa, pb) in enumerate(zip(ours[1], theirs[1])):
        assert all(torch.equal(a, b) for a, b in zip(pa, pb)), f"parameters differ at step {step}"
    # the run really exercised backoff, growth and skipping
    s = ours[0]
    assert any(b < a for a, b in zip(s, s[1:])) and any(b > a for a, b in zip(s, s[1:]))
    assert ours[2][-1] < len(ours[1]) - len(INJECT) + 1


def test_scaler_matches_gradscaler_with_fp16_model_and_master_weights():
    kwargs = dict(init_scale=2.0 ** 24, growth_interval=4)
    theirs = _train(torch.amp.GradScaler("cpu", **kwargs), explicit=True)
    ours = _train(DynamicLossScaler(**kwargs), explicit=True)
    assert ours[0] == theirs[0] and ours[2] == theirs[2]
    for pa, pb in zip(ours[1], theirs[1]):
        assert all(torch.equal(a, b) and a.dtype == torch.float16 for a, b in zip(pa, pb))


def test_scale_rule_details():
    class Opt:  # the scaler only needs param_groups and step()
        def __init__(self):
            self.p = torch.nn.Parameter(torch.zeros(3))
            self.param_groups = [{"params": [self.p]}]
            self.steps = 0

        def step(self):
            self.steps += 1

    opt, sc = Opt(), DynamicLossScaler(init_scale=2.0 ** 126, growth_interval=2)
    for overflow, want_scale, want_tracker in [(False, 2.0 ** 126, 1), (False, 2.0 ** 127, 0),
                                               (False, 2.0 ** 127, 1), (False, 2.0 ** 127, 0),  # 2^128 is inf: no growth
                                               (True, 2.0 ** 126, 0)]:
        opt.p.grad = torch.tensor([1.0, float("inf") if overflow else 2.0, 3.0])
        sc.step(opt)
        rec = sc.update()
        assert (sc.get_scale(), sc.growth_tracker, rec.skipped) == (want_scale, want_tracker, overflow)
    assert opt.steps == 4
    assert opt.p.grad[0].item() == 1.0 / 2.0 ** 127  # unscaled in place by the old scale
    with pytest.raises(RuntimeError):
        sc.update()  # no step since the last update
    for bad in (dict(init_scale=0), dict(growth_factor=1.0), dict(backoff_factor=1.0),
                dict(growth_interval=0), dict(growth_interval=2.5)):
        with pytest.raises(ValueError):
            DynamicLossScaler(**bad)
    assert to_float32(1e39) == math.inf and to_float32(0.1) == float(np.float32(0.1))


def test_master_weights_keep_updates_fp16_loses():
    # 1.0 in fp16: the next number is 1 + 2^-10, so an update of 1e-4 (< 2^-11) rounds away.
    assert F.update_is_lost(1.0, -1e-4, "fp16") and not F.update_is_lost(1.0, -1e-4, "fp32")
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    plain_opt = torch.optim.SGD([plain], lr=1e-4)
    model_p = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    master = MasterWeightOptimizer([model_p], lambda ps: torch.optim.SGD(ps, lr=1e-4))
    for _ in range(100):
        plain.grad = torch.full((4,), -1.0, dtype=torch.float16)
        plain_opt.step()
        model_p.grad = torch.full((4,), -1.0, dtype=torch.float16)
        master.grads_to_master()
        master.step()
    assert torch.all(plain == 1.0)                               # every update lost
    assert master.master_params[0].dtype == torch.float32
    assert abs(master.master_params[0][0].item() - 1.01) < 1e-5  # all kept (fp32 rounding aside)
    assert model_p[0].item() == float(np.float16(1.01))          # the model sees it, rounded
    master.zero_grad()
    assert model_p.grad is None and master.master_params[0].grad is None


# ---- bucket assignment against torch's own -------------------------------------------------
@pytest.mark.parametrize("limits_mb", [(1, 25), (0.25, 0.25), (0.01, 0.5)])
def test_assign_buckets_matches_torch(limits_mb):
    rng = np.random.default_rng(0)
    tensors = []
    for i in range(40):
        n = int(rng.integers(1, 120_000))
        dtype = torch.float16 if i % 7 == 3 else torch.float32
        tensors.append(torch.empty(n, dtype=dtype))
    limits = [int(m * F.MiB) for m in limits_mb]
    want, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    got = assign_buckets([t.numel() * t.element_size() for t in tensors], limits,
                         [t.dtype for t in tensors])
    assert got == [list(b) for b in want]


def test_bucket_limits_follow_ddp():
    assert bucket_limits(None) == [F.MiB, 25 * F.MiB]   # default: small first bucket
    assert bucket_limits(4) == [4 * F.MiB]                # explicit cap: first bucket the same
    assert bucket_limits(4, first_bucket_mb=1) == [F.MiB, 4 * F.MiB]
    with pytest.raises(ValueError):
        bucket_limits(0)


# ---- the lesson's models ---------------------------------------------------------------------
def test_histogram_regions_agree_with_fp16_rounding():
    rng = np.random.default_rng(1)
    values = 2.0 ** rng.uniform(-40, 20, 200_000)
    h = S.exponent_histogram(values)
    assert h.total == len(values) and h.lo == S.HIST_LO
    assert h.exponents()[int(np.argmax(h.counts))] in range(-40, 20)
    with np.errstate(over="ignore"):
        half = values.astype(np.float16).astype(np.float64)
    truth = np.where(half == 0, "zero", np.where(np.isinf(half), "overflow",
                     np.where(half < F.smallest_normal("fp16"), "subnormal", "normal")))
    e = np.frexp(values)[1] - 1
    model = np.array([S.region_of_bin(int(x)) for x in e])
    wrong = values[model != truth]
    # the bins disagree only for values that round across a boundary: up to 2^-14 or to inf
    assert len(wrong) < 1e-3 * len(values)
    assert all((2.0 ** -15 < v < 2.0 ** -14) or (65504 < v < 65536) for v in wrong)
    shares = h.region_shares()
    for region in S.REGIONS:
        assert shares[region] == pytest.approx(np.mean(truth == region), abs=2e-3)
    # scaling by 2^16 moves everything 16 bins up
    up = h.region_shares(16)
    assert up["zero"] == pytest.approx(np.mean(values * 2 ** 16 < 2.0 ** -25), abs=1e-9)
    assert S.region_of_bin(-26) == "zero" and S.region_of_bin(-25) == "subnormal"
    assert S.region_of_bin(-14) == "normal" and S.region_of_bin(16) == "overflow"
    assert S.region_of_bin(-120, "bf16") == "normal" and S.region_of_bin(-130, "bf16") == "subnormal"
    assert S.region_of_bin(-136, "bf16") == "zero"  # bf16 has fp32's range
    assert S.fp16_limits_log2() == {"zero_below": -25.0, "subnormal": -24.0, "normal": -14.0,
                                    "max": pytest.approx(math.log2(65504))}


def test_scaler_simulation_dynamics():
    sim = S.simulate_scaler(steps=300, growth_interval=20, forced_overflows=(50, 51))
    cfg = sim.config
    # its scale follows GradScaler's rule for its own overflow sequence
    traj = F.gradscaler_trajectory(sim.overflow, cfg.init_scale, cfg.growth_factor,
                                   cfg.backoff_factor, cfg.growth_interval)
    assert sim.scale[1:] == traj[:-1] and sim.scale[0] == cfg.init_scale
    assert sim.overflow[50] and sim.overflow[51] and sim.forced[50]
    natural = [i for i, (o, f) in enumerate(zip(sim.overflow, sim.forced)) if o and not f]
    assert natural, "the scale should grow into real overflows"
    for i in natural:  # a natural overflow means the largest scaled value passed fp16's max
        assert sim.max_log2[i] + math.log2(sim.scale[i]) > math.log2(F.max_value("fp16"))
    assert all(z_s <= z_u for z_s, z_u in zip(sim.zero_scaled, sim.zero_unscaled))
    assert sim.zero_unscaled[-1] > sim.zero_unscaled[0]  # gradients shrink as training goes on
    assert sim.loss[-1] < sim.loss[0]
    h = sim.histogram(100)
    assert h.region_shares()["zero"] == pytest.approx(sim.zero_unscaled[100], abs=0.02)
    # a long growth interval with the default settings: fewer overflows
    calm = S.simulate_scaler(steps=300, growth_interval=2000)
    assert calm.skipped < sim.skipped
    with pytest.raises(ValueError):
        S.simulate_scaler(growth_interval=0)


def test_overlap_simulation():
    m = S.OverlapModel()
    on, off = m.run(True), m.run(False)
    assert on.backward_end == off.backward_end == pytest.approx(m.n_layers * m.layer_backward_ms / 1e3)
    comm = sum(b[3] - b[2] for b in off.buckets)
    assert off.end == pytest.approx(off.backward_end + comm)  # nothing hidden
    assert on.end < off.end and on.exposed_comm < off.exposed_comm
    # one bucket holding everything cannot overlap
    one = S.OverlapModel(bucket_mib=1000)
    assert one.run(True).end == pytest.approx(one.run(False).end)
    # buckets never overlap each other, and none starts before it is full
    for a, b in zip(on.buckets, on.buckets[1:]):
        assert b[2] >= a[3] - 1e-12
    first_ready = on.layers[1][2]  # bucket 0 (8 MiB) is full after two 4 MiB layers
    assert on.buckets[0][2] == pytest.approx(first_ready)
    assert [name for name, _, _ in on.layers] == [f"L{i}" for i in reversed(range(m.n_layers))]
    sweep = m.sweep([0.01, 1, 8, 1000])
    assert min(sweep, key=sweep.get) not in (0.01, 1000)  # latency vs. no overlap: a middle wins
    # tiny buckets: one all-reduce per tensor, each paying the ring's 2(n-1) latencies
    tiny = S.OverlapModel(bucket_mib=0.01).run(True)
    assert len(tiny.buckets) == m.n_layers * m.tensors_per_layer
    assert tiny.end > on.end
