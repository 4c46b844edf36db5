"""Every `distai calc` subcommand over its whole option space (hypothesis, in-process): a finite,
physically possible answer, or a one-line error with exit code 2 — never a traceback (issues 19, 17)."""
import contextlib
import io
import json
import math
import random
from unittest import mock

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distai.lessons.calculator import REQUIRED
from distai.lessons.registry import all_calculators
from distai.tutor.cli import main

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SPECIAL = ["0", "-1", "1", "2", "3", "7", "8", "1.5", "1e300", "1e-300", "1e18", "nan", "inf", "-inf", "", "abc",
           "1,5", "1.000", "0.1", "64", "4096", "2047", "2048", "8192", "16384", "1e6"]


def _numbers():
    return st.one_of(st.sampled_from(SPECIAL), st.integers(-5, 10 ** 7).map(str),
                     st.floats(allow_nan=True, allow_infinity=True, width=64).map(repr))


def _with(units):
    return st.builds(lambda n, u: n + u, _numbers(), st.sampled_from(units))


COUNTS = _with(["", "", "k", "M", "B", "T"])
SIZES = _with(["", "B", "kB", "MB", "GB", "GiB", "TB", " bytes"])
TIMES = _with(["", "us", "ms", "s", "min", "h", "d"])
BANDWIDTHS = _with(["", "B/s", "GB/s", "Gb/s", "TB/s"])
SMALL = st.one_of(st.integers(-2, 70).map(str), st.sampled_from(SPECIAL))


_COMMANDS: dict = {}
_build_command = typer.main.get_command


def _built_once(app):
    """Typer rebuilds the whole click command tree on every call (most of a call's time); build it once."""
    if app not in _COMMANDS:
        _COMMANDS[app] = _build_command(app)
    return _COMMANDS[app]


def calc(*argv):
    """``distai calc ... --json`` through the CLI's own entry point, in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(typer.main, "get_command", _built_once):
        code = main(["calc", *[str(a) for a in argv], "--json"])
    return code, out.getvalue(), err.getvalue()


def outcome(*argv):
    """The parsed JSON of a successful run, or None after checking the refusal is one line, exit 2."""
    code, out, err = calc(*argv)
    if code == 0:
        return json.loads(out)
    assert code == 2, (argv, code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distai: error: "), (argv, err)
    assert "Traceback" not in err
    return None


def finite(*values):
    for v in values:
        assert v is not None and math.isfinite(v), values
    return True


STRATEGIES = {
    "whole": st.one_of(SMALL, COUNTS), "length": st.one_of(SMALL, _with(["", "k", "K", "M", "B"])), "count": COUNTS, "bytes": SIZES, "capacity": SIZES, "time": TIMES,
    "bandwidth": BANDWIDTHS, "per-byte": st.one_of(TIMES, BANDWIDTHS),
    "flops": st.builds(lambda n, u: n + u, _numbers(), st.sampled_from(["", "T", " TFLOP/s", "TFLOPS", "P"])),
    "number": st.one_of(st.sampled_from(["0.9", "1", "0.5", "0", "1.5", "-1"]), _numbers()),
}


def _option_values(option):
    """Every value the option can take, plus nonsense; an optional option may be left out."""
    if option.flag == "--calibrate":  # measures the machine with 8 processes: tests/test_calibrate.py runs it
        values = st.just(False)
    elif option.kind == "flag":
        values = st.booleans()
    elif option.kind == "choice":
        values = st.sampled_from(list(option.choices) + ["bogus"])
    else:
        values = STRATEGIES[option.kind]
    return values if option.default is REQUIRED else st.one_of(st.none(), values)


def _argv(calc):
    def build(values):
        argv = []
        for option, value in zip(calc.options, values):
            if value is None or value is False:
                continue
            argv += [option.flag] if value is True else [option.flag, value]
        return argv
    return st.tuples(*[_option_values(o) for o in calc.options]).map(build)


def _walk(value, key=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v, key)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield key, value


def _physical(result: dict) -> None:
    """What holds for every calculator: finite numbers; sizes, times, rates and counts >= 0; fractions in [0, 1]."""
    for key, value in _walk(result):
        assert math.isfinite(value), (key, value)
        if key == "free_bytes":
            continue  # a difference: negative when a rejected split does not fit
        if key.endswith(("_bytes", "_s", "_per_s", "_units", "fraction", "_microbatches")) or key.startswith("bytes"):
            assert value >= 0, (key, value)
        if "fraction" in key:
            assert value <= 1, (key, value)


def check_memory(r, argv):
    parts = [r["params_bytes"], r["grads_bytes"], r["optimizer_bytes"]]
    if r["activations_bytes"] is not None:
        parts.append(r["activations_bytes"])
    # float arithmetic: at 1e17 bytes and beyond, a few activation bytes vanish in the rounding of the sum
    assert math.isclose(r["total_bytes"], sum(parts), rel_tol=1e-12)
    assert all(float(x).is_integer() for x in parts[:3])  # whole bytes
    if "fits" in r:
        assert r["fits"] == (r["total_bytes"] <= r["gpu_memory_bytes"])


def check_bubble(r, argv):
    P, M = r["stages"], r["microbatches"]
    assert r["bubble_fraction"] <= 1 and r["bubble_ratio"] >= 0  # 1.0 only by rounding, p ≫ m
    # the step is never shorter than the useful work, nor than one microbatch through every stage
    assert r["step_time_units"] >= max(M, P) - 1e-9
    assert 0 < r["peak_inflight_microbatches"] <= M


def check_allreduce(r, argv):
    assert r["time_s"] >= r["steps"] * r["alpha_s"] * (1 - 1e-12)  # at least the latency of every step
    assert float(r["size_bytes"]).is_integer()


def check_checkpoint(r, argv):
    assert r["young_interval_s"] > 0 and r["daly_interval_s"] > 0
    for waste in (r["expected_waste_fraction"], r["waste_at_young_fraction"]):
        assert 0 <= waste <= 1


def check_kvcache(r, argv):
    assert 0 <= r["per_gpu_bytes"] <= r["total_bytes"]


def check_tp_comm(r, argv):
    assert r["hidden"] % r["tp"] == 0 and (not r["sequence_parallel"] or r["seq"] % r["tp"] == 0)
    for key in ("forward_bytes_per_rank", "backward_bytes_per_rank", "total_bytes_per_rank"):
        assert float(r[key]).is_integer()  # no fractional bytes


def check_serve(r, argv):
    for c in r["accepted"]:
        assert c["ttft_s"] <= r["inputs"]["ttft_slo_s"] and c["tpot_s"] <= r["inputs"]["tpot_slo_s"]
        assert c["weights_per_gpu_bytes"] + c["kv_per_gpu_bytes"] <= c["usable_bytes"] * (1 + 1e-9)
        assert c["tp"] * c["pp"] * c["replicas"] <= r["inputs"]["gpus"]


def check_moe(r, argv):
    assert r["active_params"] <= r["total_params"] and r["expert_params"] < r["total_params"]
    assert r["experts_per_gpu"] * r["ep"] == r["experts"]
    # sharding the experts over ep GPUs divides their bytes by ep, never the replicated rest
    elem = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}[r["dtype"]]
    assert r["expert_bytes_per_gpu"] * r["ep"] == r["expert_params"] * elem
    assert r["replicated_bytes_per_gpu"] == (r["total_params"] - r["expert_params"]) * elem
    assert 0 <= r["expected_drop_rate"] <= 1 and r["capacity"] >= 1
    assert (r["all_to_all_forward_bytes_per_layer"] == 0) == (r["ep"] == 1)


def check_context(r, argv):
    cp = r["cp"]
    assert r["tokens_per_gpu"] * cp == r["seq"]  # the sequence is split evenly over the CP group
    # CP divides the activations by cp, nothing else: every saved tensor is per token
    assert math.isclose(r["activation_bytes_per_gpu"] * cp, r["activation_bytes_per_gpu_without_cp"], rel_tol=1e-12)
    assert r["activation_bytes_per_gpu"] <= r["activation_bytes_per_gpu_with_scores"]
    for variant in ("ring", "allgather"):
        v = r[variant]
        assert v["total_bytes_per_rank"] == v["forward_bytes_per_rank"] + v["backward_bytes_per_rank"]
    if cp > 1:  # ring: cp - 1 hops forward, K/V again and dK/dV back in backward; all-gather: one call each way
        assert (r["ring"]["forward_messages"], r["ring"]["backward_messages"]) == (cp - 1, 2 * cp - 1)
        assert r["allgather"]["forward_bytes_per_rank"] == r["ring"]["forward_bytes_per_rank"]
    o = r["overlap"]
    assert o["hidden"] == (o["compute_s"] >= o["hop_s"]) and o["shard_tokens"] == r["tokens_per_gpu"]


CHECKS = {"context": check_context, "moe": check_moe, "memory": check_memory, "bubble": check_bubble, "allreduce": check_allreduce,
          "checkpoint": check_checkpoint, "kvcache": check_kvcache, "tp-comm": check_tp_comm, "serve": check_serve}
CALCULATORS = all_calculators()


@pytest.mark.parametrize("name", sorted(CALCULATORS))
@SETTINGS
@given(data=st.data())
def test_every_option_of_every_calculator(name, data):
    """Any combination of every option a calculator declares: a physically possible answer, or one line and exit 2."""
    argv = data.draw(_argv(CALCULATORS[name]))
    r = outcome(name, *argv)
    if r is not None:
        _holds(name, r, argv)


def _holds(name: str, r: dict, argv) -> None:
    """What every calculator's answer obeys, and what this one's own checks add (:data:`CHECKS`)."""
    _physical(r)
    CHECKS.get(name, lambda r, argv: None)(r, argv)


#: one accepted command for each calculator, most of them a lesson's own example: the option space above is
#: mostly nonsense, refused before any check runs (an audit counted 0 accepted of 300 draws for context, moe,
#: serve and plan), so the checks also run on these and on variations of them, one or two options at a time
BASES = {
    "allreduce": ["--bytes", "1GB", "--ranks", "8", "--alpha", "5us", "--beta", "25GB/s"],
    "bubble": ["--stages", "4", "--microbatches", "8", "--schedule", "interleaved", "--chunks", "2"],
    "checkpoint": ["--mtbf", "50000h", "--gpus", "16384", "--cost", "10s", "--restart", "5min"],
    "context": ["--seq", "128K", "--hidden", "16384", "--heads", "128", "--kv-heads", "8", "--layers", "126",
                "--cp", "16", "--tp", "8", "--pp", "16"],
    "kvcache": ["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "262144", "--tp", "2",
                "--pp", "2"],
    "memory": ["--params", "6.7B", "--dp", "8", "--strategy", "zero3", "--layers", "32", "--hidden", "4096",
               "--heads", "32", "--seq", "2048", "--micro-batch", "1", "--recompute", "selective",
               "--gpu-memory", "80GB"],
    "moe": ["--layers", "32", "--hidden", "4096", "--ffn", "14336", "--experts", "8", "--top-k", "2", "--vocab",
            "32000", "--heads", "32", "--kv-heads", "8", "--ep", "8"],
    "plan": ["--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096",
             "--global-batch", "64", "--gpus", "16", "--gpu-memory", "80GB"],
    "serve": ["--params", "69B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads", "8", "--gpus",
              "8", "--gpu-memory", "80GB", "--hbm-bandwidth", "3.35TB/s", "--ttft-slo", "1s", "--tpot-slo", "50ms"],
    "tp-comm": ["--hidden", "12288", "--seq", "2048", "--micro-batch", "1", "--tp", "8", "--sequence-parallel"],
}
#: values a learner would type, by kind: mostly accepted, where the whole space above is mostly refused
PLAUSIBLE = {
    "whole": ["1", "2", "3", "4", "8", "16", "32", "64", "128"], "length": ["1024", "4096", "32K", "128K"],
    "count": ["1B", "7B", "13B", "70B"], "bytes": ["1MB", "1GB", "40GB"], "capacity": ["24GB", "80GB", "141GB"],
    "time": ["1us", "5us", "1ms", "10s", "5min", "1000h"],
    "bandwidth": ["25GB/s", "100GB/s", "450GB/s", "3.35TB/s"], "per-byte": ["25GB/s", "450GB/s", "1e-10"],
    "flops": ["312T", "989T"], "number": ["0.5", "0.9", "1", "1.25"],
}


def _varied(name: str, rng) -> list[str]:
    """The calculator's base command with one or two of its options set to a plausible value (or a flag
    toggled)."""
    argv = list(BASES[name])
    options = [o for o in CALCULATORS[name].options if o.flag != "--calibrate"]
    for option in rng.sample(options, rng.choice([1, 2])):
        if option.flag in argv:
            at = argv.index(option.flag)
            del argv[at:at + (1 if option.kind == "flag" else 2)]
            if option.kind == "flag":
                continue  # toggled off
        if option.kind == "flag":
            argv.append(option.flag)
        else:
            values = list(option.choices) if option.kind == "choice" else PLAUSIBLE[option.kind]
            argv += [option.flag, rng.choice(values)]
    return argv


@pytest.mark.parametrize("name", sorted(BASES))
def test_checks_run_on_each_calculators_example_and_its_variations(name):
    """The base is accepted and passes its checks; so does at least a third of 24 variations of it (8 for plan's
    search), every accepted one checked and every refused one a single line with exit 2."""
    assert set(BASES) == set(CALCULATORS)
    base = outcome(name, *BASES[name])
    assert base is not None, BASES[name]
    _holds(name, base, BASES[name])
    rng, tries, accepted = random.Random(name), 8 if name == "plan" else 24, 0
    for _ in range(tries):
        argv = _varied(name, rng)
        r = outcome(name, *argv)
        if r is not None:
            accepted += 1
            _holds(name, r, argv)
    assert accepted >= tries // 3, f"{name}: {accepted} of {tries} variations accepted"


def test_every_calculator_has_its_own_checks():
    assert set(CHECKS) <= set(CALCULATORS)
    missing = set(CALCULATORS) - set(CHECKS)
    assert not missing - {"plan"}, f"calculators without physical checks: {missing}"


@SETTINGS
@given(p=SMALL, m=SMALL, schedule=st.sampled_from(["gpipe", "1f1b", "interleaved"]), v=st.one_of(st.none(), SMALL))
def test_bubble_over_small_pipelines(p, m, schedule, v):
    """Most random whole numbers are refused; this one stays where pipelines are accepted."""
    r = outcome("bubble", "-p", p, "-m", m, "--schedule", schedule, *(["-v", v] if v is not None else []))
    if r is not None:
        _holds("bubble", r, None)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.sampled_from(["7B", "13B", "70B", "1e12", "1"]), layers=st.sampled_from(["32", "80", "1"]),
       hidden=st.sampled_from(["8192", "4096", "5120"]), gpus=st.sampled_from(["1", "2", "8", "16"]),
       mem=st.sampled_from(["80GB", "40GB", "141GB", "1GB"]), bw=st.sampled_from(["3.35TB/s", "2TB/s", "100GB/s"]),
       ttft=st.sampled_from(["1s", "200ms", "10s"]), tpot=st.sampled_from(["50ms", "20ms", "1s"]),
       kv=st.sampled_from([None, "8", "1"]))
def test_serve_over_real_models(params, layers, hidden, gpus, mem, bw, ttft, tpot, kv):
    """Random option values are mostly refused; plans for models that exist must hold up too."""
    r = outcome("serve", "--params", params, "--layers", layers, "--hidden", hidden, "--gpus", gpus,
                "--gpu-memory", mem, "--hbm-bandwidth", bw, "--ttft-slo", ttft, "--tpot-slo", tpot,
                *(["--kv-heads", kv] if kv else []))
    if r is not None:
        _holds("serve", r, None)


@pytest.mark.parametrize("tokens, experts, top_k, factor", [(32, 4, 1, 1.0), (128, 8, 2, 1.25), (4096, 8, 2, 1.0),
                                                            (4096, 64, 8, 0.5), (64, 4, 2, 0.25), (20000, 8, 2, 1.1)])
def test_expected_drop_rate_sums_the_whole_binomial_tail(tokens, experts, top_k, factor):
    """The drop rate sums E[(load − C)+] over loads within 40 standard deviations of the mean only; the
    whole sum, every load from C + 1 to T (an expert's load is Binomial(T, k/E)), gives the same number."""
    from distai.lessons.experts import formulas as fe

    n, p, c = tokens, top_k / experts, fe.capacity(tokens, experts, top_k, factor)
    whole = sum((load - c) * math.exp(math.lgamma(n + 1) - math.lgamma(load + 1) - math.lgamma(n - load + 1)
                                      + load * math.log(p) + (n - load) * math.log1p(-p)) for load in range(c + 1, n + 1))
    assert fe.expected_drop_rate(tokens, experts, top_k, factor) == pytest.approx(experts * whole / (tokens * top_k),
                                                                                   rel=1e-12, abs=1e-300)


def test_expected_drop_rate_of_huge_batches_is_the_normal_limit_and_quick():
    """`calc moe --tokens 9007199254740992` never ended (O(√T) terms). Past a window of 200,000 terms the rate is
    the binomial load's normal limit: at the edge of the window it agrees with the term-by-term sum to 1e-6,
    and the largest batch a float counts exactly takes no time."""
    import time

    from distai.lessons.experts import formulas as fe

    for tokens in (10**7, 10**8):  # inside the window: the exact sum, against the normal limit
        n, p = tokens, 2 / 8
        normal = 8 * fe._normal_excess(n * p, math.sqrt(n * p * (1 - p)), fe.capacity(n, 8, 2, 1.0)) / (2 * n)
        assert fe.expected_drop_rate(n, 8, 2, 1.0) == pytest.approx(normal, rel=1e-6)
    started = time.perf_counter()
    rate = fe.expected_drop_rate(2**53, 8, 2, 1.0)
    assert time.perf_counter() - started < 0.1 and 0 < rate < 1e-8
