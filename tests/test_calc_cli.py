"""``distai calc ...``: JSON keys and values from the lessons' formulas, units, one-line errors."""
import json
import subprocess
import sys

import pytest

from distai.lessons.lesson1 import formulas as f1
from distai.lessons.lesson3 import formulas as f3
from distai.lessons.lesson5 import formulas as f5
from distai.tutor.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def calc_json(capsys, *argv):
    code, out, err = run(capsys, "calc", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_memory_reproduces_zero_paper(capsys):
    expected = {"ddp": 120e9, "zero1": 31.4e9, "zero2": 16.6e9, "zero3": 1.88e9}
    for strategy, total in expected.items():
        r = calc_json(capsys, "memory", "--params", "7.5B", "--dp", "64", "--strategy", strategy)
        assert r["total_bytes"] == pytest.approx(total, rel=3e-3)
        assert r["total_bytes"] == r["params_bytes"] + r["grads_bytes"] + r["optimizer_bytes"]
        assert r["activations_bytes"] is None and r["k"] == 12
    r = calc_json(capsys, "memory", "--params", "7.5e9", "--dp", "64", "--strategy", "zero2")
    assert r["total_bytes"] == 16_640_625_000
    assert isinstance(r["params_bytes"], int)


def test_memory_bf16_moments(capsys):
    """``--moments bf16``: Adam's K from 12 to 8 (the master copy stays fp32), only the optimizer term moves;
    the head says so in the learner's language; an unknown precision is one line and exit 2."""
    fp32 = calc_json(capsys, "memory", "--params", "7.5B", "--dp", "64", "--strategy", "zero1")
    bf16 = calc_json(capsys, "memory", "--params", "7.5B", "--dp", "64", "--strategy", "zero1", "--moments", "bf16")
    assert (fp32["k"], bf16["k"], bf16["moments"]) == (12, 8, "bf16")
    assert bf16["optimizer_bytes"] == 8 * 7.5e9 / 64 and bf16["params_bytes"] == fp32["params_bytes"]
    assert fp32["total_bytes"] - bf16["total_bytes"] == 4 * 7.5e9 / 64
    code, out, _ = run(capsys, "calc", "memory", "--params", "7.5B", "--moments", "bf16")
    assert code == 0 and "bf16 moments (K = 8)" in out.splitlines()[0]
    code, out, _ = run(capsys, "calc", "memory", "--params", "7.5B", "--moments", "bf16", "--lang", "es")
    assert code == 0 and "momentos bf16 (K = 8)" in out.splitlines()[0]
    code, _, err = run(capsys, "calc", "memory", "--params", "7.5B", "--moments", "fp8")
    assert code == 2 and "--moments" in err and len(err.strip().splitlines()) == 1


def test_memory_with_activations_and_fit(capsys):
    args = ["memory", "--params", "175B", "--dp", "8", "--strategy", "zero3", "--tp", "8", "--layers", "96",
            "--hidden", "12288", "--seq", "2048", "--micro-batch", "1", "--heads", "96"]
    plain = calc_json(capsys, *args)
    sp = calc_json(capsys, *args, "--sequence-parallel", "--recompute", "selective")
    sbh = 2048 * 12288
    assert plain["activations_bytes"] == pytest.approx(96 * sbh * (10 + 24 / 8 + 80 / 8))
    assert sp["activations_bytes"] == pytest.approx(96 * sbh * 34 / 8)
    # Model states: 175e9/8 parameters per tensor-parallel rank, then ZeRO-3 over 8: 16 * 175e9 / 64.
    assert sp["params_bytes"] + sp["grads_bytes"] + sp["optimizer_bytes"] == 16 * 175e9 / 64
    fit = calc_json(capsys, *args, "--sequence-parallel", "--recompute", "selective", "--gpu-memory", "80GB")
    assert fit["fits"] is True and fit["gpu_memory_bytes"] == 80e9
    nofit = calc_json(capsys, *args, "--gpu-memory", "40GiB")
    assert nofit["fits"] is False


def test_memory_human_output_has_units(capsys):
    code, out, _ = run(capsys, "calc", "memory", "--params", "7.5B", "--dp", "64", "--strategy", "zero2")
    assert code == 0
    assert "16.6 GB" in out and "16,640,625,000 B" in out


def test_bubble(capsys):
    r = calc_json(capsys, "bubble", "--stages", "4", "--microbatches", "8", "--schedule", "gpipe")
    assert r["bubble_fraction"] == pytest.approx(3 / 11) and r["bubble_ratio"] == pytest.approx(3 / 8)
    assert r["peak_inflight_microbatches"] == 8 and r["step_time_units"] == 11
    r = calc_json(capsys, "bubble", "-p", "8", "-m", "32", "--schedule", "interleaved", "--chunks", "4")
    assert r == {**f5.pipeline_bubble(8, 32, "interleaved", 4), "stages": 8, "microbatches": 32,
                 "schedule": "interleaved", "chunks": 4, "engine": "distai"}
    # issue 27.8: torch's ScheduleInterleaved1F1B runs p = 4, m = 3 (its docstring's example), Megatron-LM
    # wants m a multiple of p, and torch's Schedule1F1B m >= p: each engine's rule, on --engine
    r = calc_json(capsys, "bubble", "-p", "4", "-m", "3", "--schedule", "interleaved", "--engine", "torch")
    assert r["engine"] == "torch" and r["step_time_units"] == 5  # p + (m − 1)/v: the pipeline never fills
    for argv, why in ((["-p", "4", "-m", "3", "--schedule", "interleaved", "--engine", "megatron"],
                       "Megatron-LM's interleaved schedule needs m to be a multiple of p = 4"),
                      (["-p", "4", "-m", "3", "--schedule", "1f1b", "--engine", "torch"],
                       "Schedule1F1B needs at least as many microbatches as stages")):
        code, out, err = run(capsys, "calc", "bubble", *argv)
        assert code == 2 and why in err and err.count("\n") == 1, err


def test_allreduce(capsys):
    r = calc_json(capsys, "allreduce", "--bytes", "1GB", "--ranks", "8", "--alpha", "5us", "--beta", "100GB/s")
    assert r["time_s"] == pytest.approx(0.01757)
    assert r["bytes_per_rank"] == 1.75e9 and r["steps"] == 14 and r["busbw_factor"] == 1.75
    r2 = calc_json(capsys, "allreduce", "--bytes", "64MiB", "--ranks", "16", "--beta", "1e-10", "--algorithm", "tree")
    assert r2["time_s"] == pytest.approx(f1.tree_allreduce_time(64 << 20, 16, 5e-6, 1e-10))
    assert r2["steps"] == 8 and r2["size_bytes"] == 64 << 20


@pytest.mark.parametrize("lang,size,expected", [
    # "1.500MB" in Spanish: a four-digit number is written whole (RAE: 1500), so the dot is a decimal point
    ("es", "1,500MB", 1.5e6), ("es", "1.500MB", 1.5e6), ("es", "12.500MB", 1.25e10), ("es", "1,5GB", 1.5e9),
    ("es", "1.5GB", 1.5e9),
    ("en", "1,500MB", 1.5e9), ("en", "1.500MB", 1.5e6),
])
def test_numbers_read_as_the_learners_language_writes_them(capsys, lang, size, expected):
    """Spanish "1,500MB" is 1,5 MB, as distai writes it back; the calculators read it as 1500 MB."""
    r = calc_json(capsys, "allreduce", "--bytes", size, "--ranks", "8", "--lang", lang)
    assert r["size_bytes"] == pytest.approx(expected)


def test_checkpoint(capsys):
    r = calc_json(capsys, "checkpoint", "--mtbf", "24h", "--cost", "5min", "--restart", "10min")
    assert r["young_interval_s"] == pytest.approx(7200)
    assert r["daly_interval_s"] == pytest.approx(7001.389, abs=1e-3)
    assert r["expected_waste_fraction"] == pytest.approx(f3.expected_waste_fraction(r["daly_interval_s"], 86400, 300, 600))
    g = calc_json(capsys, "checkpoint", "--mtbf", "50000h", "--gpus", "16384", "--cost", "1min")
    assert g["job_mtbf_s"] == pytest.approx(50000 * 3600 / 16384)


def test_kvcache(capsys):
    r = calc_json(capsys, "kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "1")
    assert r["bytes_per_token"] == 327_680
    r = calc_json(capsys, "kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp8",
                  "--tokens", "128k", "--tp", "4", "--pp", "2")
    assert r["total_bytes"] == 163_840 * 131_072  # 128k tokens: K = 1024
    assert r["per_gpu_bytes"] == 2 * 40 * 2 * 128 * 1 * 131_072


def test_tp_comm(capsys):
    r = calc_json(capsys, "tp-comm", "--hidden", "4096", "--seq", "2048", "--tp", "4")
    assert r["forward"] == {"all_reduce": 2} and r["tensor_bytes"] == 4096 * 2048 * 2
    sp = calc_json(capsys, "tp-comm", "--hidden", "4096", "--seq", "2048", "--tp", "4", "--sequence-parallel",
                   "--alpha", "5us", "--beta", "100GB/s")
    assert sp["forward"] == {"all_gather": 2, "reduce_scatter": 2}
    assert sp["total_bytes_per_rank"] == r["total_bytes_per_rank"]
    assert sp["total_time_s"] > 0
    # Megatron-LM's backward gathers QKV's and FC1's inputs again: 2 all-gathers of (t−1)/t·s·b·h·2 bytes,
    # half the forward's bytes; none without SP
    assert sp["regather"] == {"all_gather": 2} and "regather" not in r
    assert sp["regather_bytes_per_rank"] == 2 * 3 / 4 * 4096 * 2048 * 2 == sp["forward_bytes_per_rank"] / 2
    assert sp["regather_time_s"] == pytest.approx(2 * (3 * 5e-6 + 3 / 4 * 4096 * 2048 * 2 / 100e9))
    for lang, ratio in (("en", "1.5×"), ("es", "1,5×")):
        code, out, _ = run(capsys, "calc", "tp-comm", "--hidden", "4096", "--seq", "2048", "--tp", "4",
                           "--sequence-parallel", "--lang", lang)
        assert code == 0 and ratio in out and ("re-gathers" if lang == "en" else "re-gather") in out
    assert "re-gather" not in run(capsys, "calc", "tp-comm", "--hidden", "4096", "--seq", "2048", "--tp", "4")[1]


def test_beta_zero_is_no_cost_per_byte(capsys):
    """--beta 0 is β = 0 s/B, an infinite bandwidth (the α-only limit), and says so; --beta 0GB/s is refused."""
    for lang, words in (("en", "β = 0 (no cost per byte: infinite bandwidth)"),
                        ("es", "β = 0 (sin coste por byte: ancho de banda infinito)")):
        code, out, _ = run(capsys, "calc", "allreduce", "--bytes", "1GB", "--ranks", "8", "--alpha", "5us", "--beta", "0",
                           "--lang", lang)
        assert code == 0 and words in out.splitlines()[0] and "70 µs" in out  # 2(N − 1)·α, nothing per byte


def test_allreduce_gives_nccls_own_model_beside_alpha_beta(capsys):
    """Its last line and JSON give NCCL's model of the ring at 1/β (lesson 1): LL for 16 KiB on 8 GPUs,
    6.6 µs + 14 × 0.6 µs plus the bytes at a quarter of 450 GB/s (capped at 87.7 GB/s); Simple for 1 GB;
    nothing without a bandwidth."""
    code, out, _ = run(capsys, "calc", "allreduce", "-s", "16KiB", "-n", "8", "--beta", "450GB/s", "--json")
    nccl = json.loads(out)["nccl"]
    assert code == 0 and nccl["protocol"] == "LL"
    assert nccl["time_s"] == pytest.approx(6.6e-6 + 14 * 0.6e-6 + 14 / 8 * 16384 / 87.7e9)
    assert nccl == f1.nccl_ring_allreduce(16384, 8, 450e9)  # floats round-trip through JSON exactly
    for lang, words in (("en", "it picks LL"), ("es", "elige LL")):
        code, out, _ = run(capsys, "calc", "allreduce", "-s", "16KiB", "-n", "8", "--beta", "450GB/s", "--lang", lang)
        assert code == 0 and words in out.splitlines()[-1] and "Simple 56" in out.splitlines()[-1]
    assert "it picks Simple" in run(capsys, "calc", "allreduce", "-s", "1GB", "-n", "8")[1]
    code, out, _ = run(capsys, "calc", "allreduce", "-s", "1GB", "-n", "8", "--beta", "0", "--json")
    assert code == 0 and json.loads(out)["nccl"] is None
    assert "NCCL" not in run(capsys, "calc", "allreduce", "-s", "1GB", "-n", "8", "--beta", "0")[1]
    # a β so small that 1/β overflows is an infinite bandwidth too, not an error
    code, out, _ = run(capsys, "calc", "allreduce", "-s", "1GB", "-n", "8", "--beta", "1e-320")
    assert code == 0 and "NCCL" not in out


def test_params_below_the_shape_are_refused_in_serve_and_memory(capsys):
    """--params fewer than the shape's layers hold (an audit ran serve --params 1 --layers 80 --hidden
    8192 and nothing refused it); real counts pass, a mixture of experts' whole count included."""
    serve = ["--gpus", "8", "--gpu-memory", "80GB", "--hbm-bandwidth", "3.35TB/s", "--ttft-slo", "1s", "--tpot-slo", "50ms"]
    memory = ["--seq", "2048", "--micro-batch", "1"]
    for calc, extra in (("serve", serve), ("memory", [*memory, "--heads", "64"])):
        code, out, err = run(capsys, "calc", calc, "--params", "1", "--layers", "80", "--hidden", "8192", *extra)
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "--params 1 is fewer than 80 layers of width 8192 hold: at least" in err
        code, _, err = run(capsys, "calc", calc, "--params", "1", "--layers", "80", "--hidden", "8192", *extra,
                           "--lang", "es")
        assert code == 2 and "--params 1 es menos de lo que tienen 80 capas de ancho 8192" in err
    # Llama 3 70B, Llama 2 7B, Mixtral 8x7B (46.7B in all), Gemma 7B (attention 16 × 256 wider than h = 3072)
    for argv in (["--params", "70.6B", "--layers", "80", "--hidden", "8192", "--kv-heads", "8"],
                 ["--params", "6.7B", "--layers", "32", "--hidden", "4096"],
                 ["--params", "46.7B", "--layers", "32", "--hidden", "4096", "--kv-heads", "8"],
                 ["--params", "8.5B", "--layers", "28", "--hidden", "3072", "--heads", "16", "--head-dim", "256"]):
        assert run(capsys, "calc", "serve", *argv, *serve)[0] == 0, argv
    assert run(capsys, "calc", "memory", "--params", "6.7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
               *memory)[0] == 0


@pytest.mark.parametrize("argv", [
    ["memory", "--params", "7.5X"],
    ["memory", "--params", "-5"],
    ["memory", "--params", "1B", "--dp", "0"],
    ["memory", "--params", "1B", "--dp", "2.5"],
    ["memory", "--params", "1B", "--strategy", "zero4"],
    ["memory", "--params", "1B", "--layers", "2"],
    ["memory", "--params", "nan"],
    ["memory", "--params", "7B", "--layers", "32", "--hidden", "4096", "--seq", "2048", "--micro-batch", "1",
     "--heads", "33"],
    ["bubble", "--stages", "0", "--microbatches", "3"],
    ["bubble", "--stages", "4", "--microbatches", "3", "--chunks", "2"],
    ["allreduce", "--bytes", "1 parsec", "--ranks", "4"],
    ["allreduce", "--bytes", "1GB", "--ranks", "4", "--beta", "0GB/s"],
    ["checkpoint", "--mtbf", "0", "--cost", "1"],
    ["checkpoint", "--mtbf", "1h", "--cost", "-1s"],
    ["kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "1", "--tp", "3"],
    ["kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "1", "--dtype", "fp4"],
    ["tp-comm", "--hidden", "4096", "--seq", "2048", "--tp", "4", "--alpha", "1us"],
    # out of a float's range or dividing by zero (a review found each a traceback or "inf s")
    ["context", "--seq", "128k", "--hidden", "8192", "--heads", "64", "--kv-heads", "8", "--layers", "80", "--cp", "8",
     "--flops", "0"],
    ["context", "--seq", "128k", "--hidden", "8192", "--heads", "64", "--kv-heads", "8", "--layers", "80", "--cp", "8",
     "--beta", "1e300"],
    ["context", "--seq", "128k", "--hidden", "8192", "--heads", "64", "--kv-heads", "8", "--layers", "80", "--cp", "8",
     "--beta", "1e300", "--json"],
    ["tp-comm", "--hidden", "4096", "--seq", "4096", "--tp", "8", "--alpha", "5us", "--beta", "1e300", "--json"],
    ["serve", "--params", "70B", "--layers", "80", "--hidden", "8192", "--kv-heads", "8", "--gpus", "8",
     "--gpu-memory", "80GB", "--hbm-bandwidth", "1e-300", "--ttft-slo", "1s", "--tpot-slo", "50ms", "--json"],
    ["moe", "--layers", "1e300", "--hidden", "4096", "--ffn", "14336", "--experts", "8", "--top-k", "2", "--vocab",
     "32000", "--heads", "32", "--kv-heads", "8"],
    ["plan", "--params", "7B", "--layers", "32", "--hidden", "1e300", "--heads", "32", "--seq", "4096",
     "--global-batch", "512", "--gpus", "64", "--gpu-memory", "80GB"],
    ["bubble", "-p", "1e300", "-m", "8"],
    # an MoE whose experts alone outnumber --params (the planner printed a negative parameter count)
    ["plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096",
     "--global-batch", "512", "--gpu-memory", "80GB", "--gpus", "64", "--experts", "8", "--top-k", "2", "--ffn", "14336"],
])
def test_bad_values_give_one_line_error(capsys, argv):
    code, out, err = run(capsys, "calc", *argv)
    assert code == 2
    assert err.startswith("distai: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""


def test_calc_help_lists_json_keys_and_stays_light():
    code = ("import sys\nfrom distai.tutor.cli import main\n"
            "rc = main(['calc', 'memory', '--help'])\n"
            "heavy = [m for m in ('torch', 'numpy', 'textual') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert "HEAVY []" in proc.stdout, proc.stdout + proc.stderr
    assert "params_bytes" in proc.stdout and "total_bytes" in proc.stdout


@pytest.mark.parametrize("argv, english, spanish", [
    (["calc", "memory", "--params", "abc"], "not a number with a unit: 'abc'", "no es un número con unidad: 'abc'"),
    # a size past a float's range: the time is named, in the learner's language (it said "the time must be a
    # finite number of seconds > 0, got inf", in English, of a time the learner never gave)
    (["calc", "allreduce", "--bytes", "1.7e308", "--ranks", "3"], "the all-reduce takes longer than a float can hold",
     "el all-reduce tarda más de lo que cabe en un float"),
    (["calc", "allreduce", "--bytes", "1XB", "--ranks", "4"], "unknown size unit 'XB'",
     "unidad de tamaño desconocida 'XB'"),
    (["calc", "allreduce", "--bytes", "70B", "--ranks", "4"], "is ambiguous", "es ambiguo"),
    (["calc", "allreduce", "--bytes", "1GB", "--ranks", "4", "--beta", "0GB/s"],
     "a bandwidth must be greater than 0, got '0GB/s' (for no cost per byte, β = 0, give 0)",
     "un ancho de banda debe ser mayor que 0, no '0GB/s' (para ningún coste por byte, β = 0, da 0)"),
    (["calc", "allreduce", "--bytes", "1GB", "--ranks", "4", "--beta", "10GB"], "needs a per-second unit, e.g. GB/s",
     "necesita una unidad por segundo, p. ej. GB/s"),  # a bandwidth without its /s, not an unknown time unit
    (["calc", "allreduce", "--bytes", "1GB", "--ranks", "4", "--beta", "10q"], "unknown time unit 'q'",
     "unidad de tiempo desconocida 'q'"),
    # a GPU's memory given without its unit is 80 bytes: the planner asks, as calc memory and serve do
    (["calc", "plan", "--gpu-memory", "80", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
      "--seq", "4096", "--global-batch", "64", "--gpus", "8"], "did you mean 80GB?", "¿querías decir 80GB?"),
])
def test_a_value_that_cannot_be_read_is_one_line_in_the_learners_language(capsys, monkeypatch, argv, english,
                                                                           spanish):
    for lang, words in (("en", english), ("es", spanish)):
        monkeypatch.setenv("DISTAI_LANG", lang)
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_a_limit_is_shown_as_a_reader_writes_it_and_moe_drops_stay_fast(capsys):
    code, _, err = run(capsys, "calc", "plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
                       "--seq", "4096", "--global-batch", "512", "--gpus", "99999999999999999999", "--gpu-memory", "80GB")
    assert code == 2 and "at most 1,048,576" in err  # not 1.04858e+06
    code, _, err = run(capsys, "calc", "kvcache", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                       "--tokens", "1e300")
    assert code == 2 and "9,007,199,254,740,992" in err and len(err) < 120
    # the expected drop rate sums only the loads a double can tell from 0: 10^8 tokens a rank at once
    r = calc_json(capsys, "moe", "--layers", "32", "--hidden", "4096", "--ffn", "14336", "--experts", "8",
                  "--top-k", "2", "--vocab", "32000", "--heads", "32", "--kv-heads", "8", "--ep", "8", "--tokens", "1e8")
    assert 0 <= r["expected_drop_rate"] < 1e-3


def test_plan_memory_rejections_read_as_more_than_the_usable(capsys):
    """'472 × needs 80 GB per GPU, more than the usable 80 GB' contradicted itself: the need is shown with
    the digits that set it apart, and a group reads as the nearest of many."""
    from distai.lessons import units

    assert units.format_bytes_apart(80_002_307_801.6, 80e9) == ("80.002 GB", "80 GB")
    assert units.format_bytes_apart(116e9, 80e9, "es") == ("116 GB", "80 GB")
    code, out, _ = run(capsys, "calc", "plan", "--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32",
                       "--seq", "4096", "--global-batch", "512", "--gpus", "64", "--gpu-memory", "80GB")
    assert code == 0
    line = next(x for x in out.splitlines() if "usable" in x and "×" in x)
    assert "need 80.002 GB per GPU or more (the nearest miss), more than the usable 80 GB" in line


def test_choices_are_named_in_the_learners_language(capsys):
    """Spanish output said "All-reduce (ring)", "comparación: tree …; naive …", "Pipeline interleaved", "adam, mixed"."""
    _, out, _ = run(capsys, "calc", "allreduce", "-s", "1GB", "-n", "8", "--lang", "es")
    assert out.startswith("All-reduce (anillo)") and "comparación: árbol" in out and "; ingenuo" in out
    _, out, _ = run(capsys, "calc", "bubble", "-p", "8", "-m", "32", "--schedule", "interleaved", "-v", "4", "--lang", "es")
    assert out.startswith("Pipeline 1F1B intercalada:")
    _, out, _ = run(capsys, "calc", "memory", "--params", "70B", "--dp", "64", "--strategy", "zero3", "--lang", "es")
    assert out.startswith("Memoria por GPU: ZeRO-3,") and "Adam, precisión mixta (K = 12)" in out
    _, out, _ = run(capsys, "calc", "memory", "--params", "70B", "--dp", "64", "--strategy", "zero3", "--lang", "en")
    assert "ZeRO-3" in out and "Adam, mixed precision" in out


def test_context_lengths_count_k_as_1024_tokens(capsys):
    """'--tokens 32k' was 32,000 tokens; a 32K context is 32,768 (Llama 3.1's 128K is 131,072)."""
    r = calc_json(capsys, "kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "32k")
    assert r["tokens"] == 32768 and r["total_bytes"] == 2 * 80 * 8 * 128 * 2 * 32768
    code, _, err = run(capsys, "calc", "kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128",
                       "--tokens", "32B")
    assert code == 2 and "k = 1024" in err and len(err.strip().splitlines()) == 1


def test_prose_lines_fit_the_terminal_and_tables_stay_whole(capsys, monkeypatch):
    """calc plan's 'step …' and 'memory per GPU …' lines ran to 143 and 176 characters at 80 columns."""
    from distai.tutor.cli import fit_prose

    line = "  step 21.1 s: compute 19 s (GEMMs at 79.1% of peak), TP 815 ms, CP 0 s, PP 174 ms, EP 0 s, bubble 1.09 s"
    parts = fit_prose(line, 40)
    assert all(len(p) <= 40 for p in parts) and all(p.startswith("    ") for p in parts[1:])
    assert " ".join(" ".join(parts).split()) == " ".join(line.split())
    assert not any(p.rstrip().endswith(("21.1", "815", "1.09")) for p in parts)  # a number keeps its unit
    row = "    1    2   1   8     4   1 on   1    3 none       1   72.6 GB    21.1 s  71.1%  5.19%"
    assert fit_prose(row, 40) == [row]
    # a label's row: its cells whole, the note that does not fit under the value, a long last cell's words
    # under its own column (calc context ran to 98 columns, Spanish calc serve's reasons to 92)
    row = "  ring: sent per layer           1.48 GB  (1.38 GiB, 1,476,395,008 B)  (7 + 15 messages fwd + bwd)"
    assert fit_prose(row, 80) == [row[:row.index("  (7")], " " * 33 + "(7 + 15 messages fwd + bwd)"]
    row = "  1×1×8     memoria  los pesos, 140 GB por GPU, superan los 72 GB utilizables (90 % de 80 GB)"
    assert fit_prose(row, 80) == ["  1×1×8     memoria  los pesos, 140 GB por GPU, superan los 72 GB utilizables",
                                  " " * 21 + "(90 % de 80 GB)"]
    monkeypatch.setenv("COLUMNS", "80")
    plan = ["calc", "plan", "--params", "70B", "--layers", "80", "--hidden", "8192", "--heads", "64",
            "--gpus", "64", "--seq", "4096", "--global-batch", "512", "--gpu-memory", "80GB"]
    for lang in ("en", "es"):  # the prose wraps, the table's columns are as wide as their cells
        code, out, _ = run(capsys, *plan, "--lang", lang)
        assert code == 0
        table = [line for line in out.splitlines() if line.lstrip().startswith("#")]
        assert table and max(len(line) for line in out.splitlines()) < 80, out
    code, out, _ = run(capsys, *plan)
    assert "1671 × need" in out and "(1824;" in out  # the counts written as the total above them (4 digits whole)


def test_counts_read_as_counts(capsys):
    """'on 1 ranks'; moe's default 4096 tokens per GPU printed as '4.1k'."""
    _, out, _ = run(capsys, "calc", "allreduce", "-s", "64MiB", "-n", "1")
    assert " on 1 rank," in out
    _, out, _ = run(capsys, "calc", "allreduce", "-s", "64MiB", "-n", "4", "--lang", "es")
    assert " en 4 ranks," in out
    code, out, err = run(capsys, "calc", "moe", "--layers", "32", "--hidden", "4096", "--ffn", "14336", "--experts", "8",
                         "--top-k", "2", "--vocab", "32000", "--heads", "32", "--kv-heads", "8")
    assert code == 0, err
    assert "4096 tokens per GPU" in out.splitlines()[0]


def test_every_missing_option_is_named_at_once(capsys):
    """Click stops at the first missing required option: `calc serve` took one try per option to learn them.
    The line names all that the command line lacks (given as `--x v` or `--x=v`), in the learner's language."""
    code, out, err = run(capsys, "calc", "serve", "--params=70B", "--layers", "80", "--lang", "es")
    assert code == 2 and out == ""
    assert err.strip().split(" (mira")[0] == ("distai: error: faltan las opciones '--hidden', '--gpus', '--gpu-memory', "
                                              "'--hbm-bandwidth', '--ttft-slo', '--tpot-slo'")
    code, out, err = run(capsys, "calc", "serve", "--params", "70B", "--layers", "80", "--hidden", "8192", "--gpus", "8",
                         "--gpu-memory", "80GB", "--hbm-bandwidth", "2TB/s", "--ttft-slo", "1s")
    assert code == 2 and err.strip().split(" (see")[0] == "distai: error: missing option '--tpot-slo'"


def test_context_activations_follow_the_dtype(capsys):
    """The audit: `calc context --dtype fp32` printed bf16's activation memory (Korthikanti's 34·s·b·h counts
    16-bit values and 1-byte masks) beside fp32 K/V blocks. 34 = 16 values × 2 B + 2 masks: 66 in fp32; the
    stored scores' 5 = 2 tensors × 2 B + 1 mask: 9."""
    shape = ["--seq", "128k", "--hidden", "16384", "--heads", "128", "--kv-heads", "8", "--layers", "126", "--cp", "16",
             "--tp", "8", "--pp", "16"]
    half, full = (calc_json(capsys, "context", *shape, "--dtype", d) for d in ("bf16", "fp32"))
    assert full["activation_bytes_per_gpu"] == half["activation_bytes_per_gpu"] * 66 / 34
    assert full["activation_bytes_per_gpu_without_cp"] == half["activation_bytes_per_gpu_without_cp"] * 66 / 34
    s, h, a, t, cp, layers = 131072, 16384, 128, 8, 16, 8  # 126 layers over 16 stages: 8 on the busiest
    scores = layers * s / cp * h / t * 9 * a * s / h
    assert full["activation_bytes_per_gpu_with_scores"] == pytest.approx(full["activation_bytes_per_gpu"] + scores)
    assert half["activation_bytes_per_gpu"] == 4.25 * 2**30 and full["kv_block_bytes"] == 2 * half["kv_block_bytes"]


def test_an_interleaved_m_that_does_not_split_is_told_the_nearest_that_do(capsys):
    """The audit: m = 9 on p = 4 was told "a multiple of 2 … try m = 8 or another multiple of p = 4", which
    leaves out m = 10 (10 // 4 = 2 rounds of 5) and suggests that any even m works (14 does not)."""
    assert main(["calc", "bubble", "-p", "4", "-m", "9", "--schedule", "interleaved", "--lang", "en"]) == 2
    assert "the nearest that work are m = 8 and m = 10" in capsys.readouterr().err
    for m in (8, 10):
        assert main(["calc", "bubble", "-p", "4", "-m", str(m), "--schedule", "interleaved"]) == 0
    capsys.readouterr()
    assert main(["calc", "bubble", "-p", "4", "-m", "14", "--schedule", "interleaved", "--lang", "en"]) == 2
    assert "m = 12 and m = 15" in capsys.readouterr().err


SERVE_70B = ["calc", "serve", "--params", "70B", "--layers", "80", "--hidden", "8192", "--kv-heads", "8", "--heads",
             "64", "--gpus", "8", "--hbm-bandwidth", "3.35TB/s", "--ttft-slo", "1s", "--tpot-slo", "50ms"]


@pytest.mark.parametrize("argv,words", [
    # a count past any float: it was an OverflowError traceback from the text's number formatting
    (["calc", "memory", "--params", "1e308"], "el resultado params_bytes (su clave en --json) salió > 10³⁰⁸"),
    # a formula's own guard said in English: in Spanish it is said in Spanish
    (["calc", "checkpoint", "--mtbf", "1e-300", "--cost", "1e308"], "fuera del rango de la fórmula"),
    # a search that tried every batch up to 9e15 (it ran for hours): bounded, as any option's range
    ([*SERVE_70B, "--gpu-memory", "80GB", "--max-batch", "9e15"], "--max-batch"),
    # Spanish numbers in the refusal, as the learner typed them
    ([*SERVE_70B, "--gpu-memory", "80GB", "--memory-util", "1,5"], "no 1,5"),
])
def test_extreme_inputs_are_one_spanish_line(capsys, argv, words):
    code, out, err = run(capsys, *argv, "--lang", "es")
    assert code == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not any(w in err for w in ("must be", "the inputs", "--flops")), err


def test_the_bare_command_and_a_bare_group_print_their_help_in_spanish():
    for argv in (["--lang", "es"], ["--lang", "es", "calc"]):
        res = subprocess.run([sys.executable, "-m", "distai.tutor.cli", *argv], capture_output=True, text=True,
                             timeout=60)
        shown = res.stdout + res.stderr
        assert "Uso: " in shown and "Usage:" not in shown and "Options" not in shown, shown
