"""Lesson 3's failure simulator: simulated goodput against Daly's closed form, and the simulated
optimum interval against Young's and Daly's formulas over a grid of cluster parameters."""
from __future__ import annotations

import math

import numpy as np
import pytest

from distai.lessons.lesson3 import failure_sim as fs
from distai.lessons.lesson3 import formulas as f

HOUR = 3600.0
# job MTBF, checkpoint cost, restart: from a checkpoint that is cheap against M to one that is not
GRID = [(M, C, R) for M in (1800.0, 3 * HOUR, 86400.0, 30 * 86400.0) for C in (1.0, 10.0, 60.0, 300.0, 1800.0)
        for R in (0.0, 300.0) if C < M]


@pytest.mark.parametrize("M,C,R", GRID)
def test_simulated_optimum_lands_on_daly(M, C, R):
    opt = fs.simulated_optimum(M, C, R)
    daly = f.daly_interval(M, C, R)
    assert abs(opt - daly) / daly < 0.02, (opt, daly)
    # ... and Daly's is the true optimum of the model (the numeric minimum of the closed form)
    assert abs(daly - f.optimal_interval_numeric(M, C, R)) / daly < 0.01


def test_young_is_off_where_the_checkpoint_is_expensive_and_the_simulation_sides_with_daly():
    M, C = 3 * HOUR, 1800.0  # C/M = 1/6: the first-order formula is off by ~12%
    opt, young, daly = fs.simulated_optimum(M, C), f.young_interval(M, C), f.daly_interval(M, C)
    assert abs(young - daly) / daly > 0.10
    assert abs(opt - daly) < 0.2 * abs(opt - young)


@pytest.mark.parametrize("tau,M,C,R", [(600, 3.09 * HOUR, 60, 300), (1113, 3.09 * HOUR, 60, 300),
                                       (3 * HOUR, 3.09 * HOUR, 60, 300), (100, 1000, 50, 20)])
def test_simulated_goodput_matches_dalys_expected_time(tau, M, C, R):
    good = fs.goodput(tau, M, C, R)
    expected = 1 - f.expected_waste_fraction(tau, M, C, R)
    assert abs(good - expected) < 0.004, (good, expected)


def test_a_cluster_fails_g_times_as_often_as_one_gpu():
    gpu_mtbf = 1000.0
    for g in (1, 8, 64):
        first, who = fs.first_failure_times(g, gpu_mtbf, samples=20_000, seed=g)
        assert first.mean() == pytest.approx(f.job_mtbf(gpu_mtbf, g), rel=0.03)
        # any GPU is as likely to be the one that stops the job
        counts = np.bincount(who, minlength=g)
        assert counts.min() > 0.7 * counts.mean()


def test_sweep_uses_job_mtbf_and_marks_the_intervals():
    llama_gpu = f.component_mtbf_from_log(16384, 54 * 86400, 419)
    s = fs.sweep(16384, llama_gpu, 60, 300)
    assert s.mtbf == pytest.approx(f.job_mtbf(llama_gpu, 16384))
    assert s.young == pytest.approx(f.young_interval(s.mtbf, 60))
    assert s.daly == pytest.approx(f.daly_interval(s.mtbf, 60, 300))
    assert s.agreement() < 0.02
    assert s.intervals[0] < s.daly < s.intervals[-1]
    assert np.all(np.abs(s.goodput - s.expected) < 0.01)
    # the lesson's worked example: 12.4% wasted at Daly's interval
    i = int(np.argmin(np.abs(s.intervals - s.daly)))
    assert 1 - s.goodput[i] == pytest.approx(0.124, abs=0.01)


def test_play_log_counts_only_checkpointed_work():
    gaps = np.array([10.0, 3.0, 25.0])  # failures after these gaps
    work, wall = fs.play_log(gaps, interval=4.0, cost=1.0, restart=2.0)
    # gap 10: restart 2, then one interval of 4+1 (a second would end at 12 > 10) -> 4 kept
    # gap 3: restart 2, no interval fits -> 0; gap 25: restart 2, 4 intervals (2 + 20 = 22) -> 16
    assert (work, wall) == (20.0, 38.0)


def test_timeline_accounts_for_every_second():
    tl = fs.simulate_timeline(gpus=1024, gpu_mtbf=50_000 * HOUR, cost=60, restart=300, interval=1800,
                              horizon=7 * 86400, seed=1)
    total = sum(tl.total(k) for k in ("work", "checkpoint", "lost", "restart"))
    assert total == pytest.approx(tl.horizon)
    assert len(tl.failures) > 0 and all(0 <= g < 1024 for _t, g in tl.failures)


def test_a_long_timeline_fails_once_per_job_mtbf_and_keeps_dalys_share():
    """One week's 4 failures against rel=0.6 let a job MTBF off by 2x pass: 2,000 days (about 980 failures)
    hold the count to 10% (3 standard deviations), the work kept to Daly's closed form within 1%, and the
    failed GPU to a uniform draw."""
    gpus, gpu_mtbf, cost, restart, interval = 1024, 50_000 * HOUR, 60, 300, 1800
    horizon = 2000 * 86400
    tl = fs.simulate_timeline(gpus=gpus, gpu_mtbf=gpu_mtbf, cost=cost, restart=restart, interval=interval,
                              horizon=horizon, seed=1)
    mtbf = f.job_mtbf(gpu_mtbf, gpus)
    assert len(tl.failures) == pytest.approx(f.expected_failures(horizon, mtbf), rel=0.1)
    kept = tl.total("work") / tl.horizon
    assert kept == pytest.approx(1 - f.expected_waste_fraction(interval, mtbf, cost, restart), abs=0.01)
    failed = np.bincount([g for _t, g in tl.failures], minlength=gpus)
    assert failed[: gpus // 2].sum() == pytest.approx(len(tl.failures) / 2, rel=0.15)


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError):
        fs.failure_log(0)
    with pytest.raises(ValueError):
        fs.play_log(np.ones(3), 0, 1)
    with pytest.raises(ValueError):
        fs.sweep(8, 1000, 0)
    assert math.isfinite(fs.goodput(10, 100, 1))
