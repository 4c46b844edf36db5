"""Every `distai calc` subcommand over its whole option space (hypothesis, in-process): a finite,
physically possible answer, or a one-line error with exit code 2 — never a traceback (issues 19, 17)."""
import contextlib
import io
import json
import math
from unittest import mock

import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def options(**named):
    """Optional options: (name, strategy) pairs, each present or not."""
    parts = [st.one_of(st.none(), strat.map(lambda v, n=name: (n, v))) for name, strat in named.items()]
    return st.tuples(*parts).map(lambda xs: [a for x in xs if x for a in x])


@SETTINGS
@given(params=COUNTS, rest=options(**{"--dp": SMALL, "--tp": SMALL, "--layers": SMALL, "--hidden": SMALL,
                                      "--seq": SMALL, "--micro-batch": SMALL, "--heads": SMALL,
                                      "--gpu-memory": SIZES, "--strategy": st.sampled_from(["ddp", "zero2", "fsdp", "x"]),
                                      "--recompute": st.sampled_from(["none", "selective", "full"])}),
       sp=st.booleans())
def test_memory(params, rest, sp):
    r = outcome("memory", "--params", params, *rest, *(["--sequence-parallel"] if sp else []))
    if r is None:
        return
    parts = [r["params_bytes"], r["grads_bytes"], r["optimizer_bytes"]]
    if r["activations_bytes"] is not None:
        parts.append(r["activations_bytes"])
    assert finite(*parts, r["total_bytes"]) and min(parts) >= 0
    assert r["total_bytes"] == sum(parts)
    assert all(float(x).is_integer() for x in parts[:3])  # whole bytes
    if "fits" in r:
        assert r["fits"] == (r["total_bytes"] <= r["gpu_memory_bytes"])


@SETTINGS
@given(p=SMALL, m=SMALL, schedule=st.sampled_from(["gpipe", "1f1b", "interleaved", "zb"]),
       v=st.one_of(st.none(), SMALL))
def test_bubble(p, m, schedule, v):
    r = outcome("bubble", "-p", p, "-m", m, "--schedule", schedule, *(["-v", v] if v is not None else []))
    if r is None:
        return
    P, M = r["stages"], r["microbatches"]
    assert finite(r["bubble_fraction"], r["bubble_ratio"], r["step_time_units"], r["peak_inflight_microbatches"])
    assert 0 <= r["bubble_fraction"] <= 1 and r["bubble_ratio"] >= 0  # 1.0 only by rounding, p ≫ m
    # the step is never shorter than the useful work, nor than one microbatch through every stage
    assert r["step_time_units"] >= max(M, P) - 1e-9
    assert 0 < r["peak_inflight_microbatches"] <= M


@SETTINGS
@given(size=SIZES, n=SMALL, alpha=st.one_of(st.none(), TIMES), beta=st.one_of(st.none(), BANDWIDTHS, TIMES),
       algorithm=st.sampled_from(["ring", "tree", "naive"]))
def test_allreduce(size, n, alpha, beta, algorithm):
    r = outcome("allreduce", "-s", size, "-n", n, *(["--alpha", alpha] if alpha else []),
                *(["--beta", beta] if beta else []), "--algorithm", algorithm)
    if r is None:
        return
    assert finite(r["time_s"], r["bytes_per_rank"], r["size_bytes"])
    assert r["time_s"] >= r["steps"] * r["alpha_s"] * (1 - 1e-12)  # at least the latency of every step
    assert r["bytes_per_rank"] >= 0 and float(r["size_bytes"]).is_integer()


@SETTINGS
@given(mtbf=TIMES, cost=TIMES, rest=options(**{"--restart": TIMES, "--gpus": SMALL | COUNTS, "--interval": TIMES}))
def test_checkpoint(mtbf, cost, rest):
    r = outcome("checkpoint", "--mtbf", mtbf, "--cost", cost, *rest)
    if r is None:
        return
    assert finite(r["young_interval_s"], r["daly_interval_s"], r["interval_s"])
    assert r["young_interval_s"] > 0 and r["daly_interval_s"] > 0
    for waste in (r["expected_waste_fraction"], r["waste_at_young_fraction"]):
        assert finite(waste) and 0 <= waste <= 1


@SETTINGS
@given(layers=SMALL, kv=SMALL, d=SMALL, tokens=COUNTS, tp=SMALL, pp=SMALL,
       dtype=st.sampled_from(["fp16", "fp8", "fp32", "int3"]))
def test_kvcache(layers, kv, d, tokens, tp, pp, dtype):
    r = outcome("kvcache", "--layers", layers, "--kv-heads", kv, "--head-dim", d, "--tokens", tokens,
                "--tp", tp, "--pp", pp, "--dtype", dtype)
    if r is None:
        return
    assert finite(r["bytes_per_token"], r["total_bytes"], r["per_gpu_bytes"])
    assert 0 <= r["per_gpu_bytes"] <= r["total_bytes"]


@SETTINGS
@given(h=SMALL | st.sampled_from(["8192", "4096", "12288"]), s=SMALL | st.sampled_from(["2048", "2047"]),
       tp=SMALL | st.sampled_from(["16384", "8", "3"]), sp=st.booleans(),
       comm=st.one_of(st.none(), st.tuples(TIMES, BANDWIDTHS)))
def test_tp_comm(h, s, tp, sp, comm):
    r = outcome("tp-comm", "--hidden", h, "--seq", s, "--tp", tp, *(["--sequence-parallel"] if sp else []),
                *(["--alpha", comm[0], "--beta", comm[1]] if comm else []))
    if r is None:
        return
    assert r["hidden"] % r["tp"] == 0 and (not sp or r["seq"] % r["tp"] == 0)
    for key in ("forward_bytes_per_rank", "backward_bytes_per_rank", "total_bytes_per_rank"):
        assert finite(r[key]) and r[key] >= 0 and float(r[key]).is_integer()  # no fractional bytes
    if "total_time_s" in r:
        assert finite(r["total_time_s"]) and r["total_time_s"] >= 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=COUNTS, layers=SMALL, hidden=st.sampled_from(["8192", "4096", "5120", "100", "0"]),
       gpus=st.sampled_from(["1", "2", "8", "16", "0", "3"]), mem=SIZES, bw=BANDWIDTHS,
       ttft=TIMES, tpot=TIMES, kv=st.sampled_from([None, "8", "1", "3"]))
def test_serve(params, layers, hidden, gpus, mem, bw, ttft, tpot, kv):
    r = outcome("serve", "--params", params, "--layers", layers, "--hidden", hidden, "--gpus", gpus,
                "--gpu-memory", mem, "--bandwidth", bw, "--ttft-slo", ttft, "--tpot-slo", tpot,
                *(["--kv-heads", kv] if kv else []))
    if r is None:
        return
    for c in r["accepted"]:
        assert finite(c["ttft_s"], c["tpot_s"], c["throughput_tokens_per_s"])
        assert c["ttft_s"] <= r["inputs"]["ttft_slo_s"] and c["tpot_s"] <= r["inputs"]["tpot_slo_s"]
        assert c["weights_per_gpu_bytes"] >= 0 and c["kv_per_gpu_bytes"] >= 0
        assert c["weights_per_gpu_bytes"] + c["kv_per_gpu_bytes"] <= c["usable_bytes"] * (1 + 1e-9)
