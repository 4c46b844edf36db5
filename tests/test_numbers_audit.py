"""The audit's cases (issue 19), each a number or a crash a learner met: now right, or refused in one line."""
import contextlib
import io
import json
from pathlib import Path

import pytest

from distai.lessons import quiz, units
from distai.lessons.lesson2 import formulas as f2
from distai.lessons.lesson3 import formulas as f3
from distai.lessons.lesson4 import formulas as f4
from distai.tutor.cli import main


def run(*argv, stdin=None):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def refused(*argv):
    code, _out, err = run("calc", *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, code, err)
    return err


# 19.1: interleaved 1F1B with unequal rounds is refused, as the simulator and the text say; 27.8: m < p is
# Megatron-LM's refusal (m a multiple of p), not torch's (ScheduleInterleaved1F1B runs it in one round)
@pytest.mark.parametrize("argv", [("-p", "8", "-m", "1", "-v", "4"), ("-p", "8", "-m", "4"), ("-p", "4", "-m", "9")])
def test_interleaved_refusals(argv):
    assert "interleaved schedule" in refused("bubble", "--schedule", "interleaved", "--engine", "megatron", *argv)
    code, _out, err = run("calc", "bubble", "--schedule", "interleaved", "--engine", "torch", *argv)
    assert (code == 0) == (argv[-1] != "9"), err


def test_interleaved_peak_is_the_simulators():
    code, out, _ = run("calc", "bubble", "-p", "4", "-m", "6", "--schedule", "interleaved", "--json")
    assert code == 0 and json.loads(out)["peak_inflight_microbatches"] == 6.0


# 19.2: checkpoint waste saturates instead of overflowing
@pytest.mark.parametrize("argv", [("--mtbf", "10s", "--cost", "2h"), ("--mtbf", "1s", "--cost", "1h"),
                                  ("--mtbf", "3h", "--cost", "1min", "--interval", "1e300"),
                                  ("--mtbf", "3h", "--cost", "1min", "--restart", "1e6h"),
                                  ("--mtbf", "50000h", "--cost", "1min", "--gpus", "1e18")])
def test_checkpoint_saturates(argv):
    code, out, err = run("calc", "checkpoint", *argv, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["expected_waste_fraction"] == pytest.approx(1.0, abs=1e-6)
    assert 0 <= r["waste_at_young_fraction"] <= 1


def test_waste_in_logarithms_equals_the_closed_form():
    for args in ((600, 3 * 3600, 60, 300), (3600, 86400, 120, 0), (60, 1800, 10, 600)):
        assert f3.expected_waste_fraction(*args) == pytest.approx(1 - 1 / f3.expected_wall_time(1.0, *args), rel=1e-12)
    assert f3.expected_waste_fraction(600, 1, 3600) == 1.0


# 19.3: one tensor-parallel degree check for every command (lessons/model_size.refusals)
@pytest.mark.parametrize("argv,reason", [
    (("memory", "--params", "7B", "--layers", "32", "--hidden", "8192", "--seq", "2048", "--micro-batch", "1",
      "--heads", "64", "--tp", "3"),
     "tp = 3 does not divide the 64 attention heads; tp = 3 does not divide the hidden size 8192"),
    (("tp-comm", "--hidden", "8192", "--seq", "2048", "--tp", "3"), "tp = 3 does not divide the hidden size 8192"),
    (("tp-comm", "--hidden", "8192", "--seq", "2048", "--tp", "16384"),
     "tp = 16,384 does not divide the hidden size 8192"),
    (("tp-comm", "--hidden", "8192", "--seq", "2047", "--tp", "8", "--sequence-parallel"),
     "sequence parallelism needs tp = 8 to divide the sequence length 2047"),
    (("kvcache", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "4096", "--tp", "3"),
     "tp = 3 neither divides the 8 KV heads nor is a multiple of them (each rank holds whole KV heads, or one "
     "replicated)"),
])
def test_tensor_parallel_degree_refused_alike(argv, reason, monkeypatch):
    monkeypatch.setenv("LC_ALL", "C")  # English: the reasons follow the learner's locale
    assert refused(*argv) == f"distai: error: {reason}\n"


def test_one_check_behind_every_formula():
    with pytest.raises(ValueError, match="^tp = 3 does not divide the hidden size 8192$"):
        f4.tp_comm_per_layer(8192, 2048, 1, 3)
    with pytest.raises(ValueError, match="^tp = 8 does not divide the 60 attention heads$"):
        f2.activation_bytes_per_layer(2048, 1, 8192, 60, 8)
    assert f2.check_tp_degree(16, kv_heads=8) == 16  # KV heads replicated, as vLLM does


# 19.4: units a learner misreads
@pytest.mark.parametrize("argv,hint", [
    (("memory", "--params", "7B", "--gpu-memory", "80"), "did you mean 80GB?"),
    (("serve", "--params", "70B", "--layers", "80", "--hidden", "8192", "--gpus", "8", "--gpu-memory", "80",
      "--hbm-bandwidth", "3.35TB/s", "--ttft-slo", "1s", "--tpot-slo", "50ms"), "did you mean 80GB?"),
    (("allreduce", "-s", "70B", "-n", "8"), "70GB"),
    (("allreduce", "-s", "1.5", "-n", "8"), "whole number of bytes"),
])
def test_units_suggested(argv, hint):
    assert hint in refused(*argv)


def test_huge_inputs_print_sanely():
    code, out, _ = run("calc", "memory", "--params", "1e30")
    assert code == 0 and "e+" not in out and "1e30" in out
    assert units.format_count(1e30) == "1e30" and units.format_bytes(1.6e31) == "1.6e31 B"


def test_spanish_billions_are_mil_millones():
    assert units.format_count(7.5e9, lang="es") == "7,5 mil millones"
    assert units.parse_count("7,5 mil millones", "es") == 7.5e9


# 19.5: the quiz echoes what was typed
def test_quiz_echoes_the_typed_answer(monkeypatch):
    q = quiz.make_question("lesson1", "ring-steps", 3)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{q.answer - 0.1}\n"))
    from distai.tutor import cli_quiz

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli_quiz.run_quiz([q], None, "lesson1", "en", "")
    assert f"you answered {q.answer - 0.1}" in out.getvalue()


# 19.6: texts
LESSONS = Path(__file__).resolve().parents[1] / "lessons"


def test_texts_say_what_is_true():
    import math
    import re

    sim = (LESSONS / "lesson6" / "simulation.py").read_text()
    exponent = re.search(r"65504 ≈ 2\^([\d.]+)", sim).group(1)
    assert exponent == f"{math.log2(65504):.4f}"
    for lang in ("en", "es"):
        assert "SHARD_GRAD_OP" in (LESSONS / "lesson2" / lang / "copies.md").read_text()
        interleaved = (LESSONS / "lesson5" / lang / "interleaved.md").read_text()
        assert "one more hop" not in interleaved and "un salto más" not in interleaved


def test_spanish_writes_billions_and_percent_one_way():
    import re

    for path in LESSONS.glob("*/es/*.md"):
        for line in path.read_text().splitlines():
            if "distai " in line or "<!--" in line:
                continue  # commands and check comments use the parser's syntax
            prose = re.sub(r"\b(GPT-3|Llama 3|BLOOM|Megatron-LM) \d+([.,]\d+)?B\b", "", line)  # model names stay names
            assert not re.search(r"(?<![\w.-])\d+(,\d+)?B\b", prose), (path, line)  # 7,5B → 7,5 mil millones
            assert not re.search(r"\d\.\d{3} millones", line), (path, line)  # 7.500 millones → 7,5 mil millones
            assert not re.search(r"\d%", line), (path, line)  # 27,3 % with a space, as units.format_percent
    q = quiz.make_question("lesson2", "max-fit", 1, "es")
    assert "mil millones" in q.prompt and "mil millones" in q.answer_text()


def test_absurd_rank_counts_are_refused_not_overflowed():
    assert "at most" in refused("allreduce", "-s", "0", "-n", "8.98846567431158e+307", "--algorithm", "naive")


def test_a_size_in_bits_is_refused_as_the_bandwidths_read_it():
    """--bytes 1Gb read as 1 GB while --beta 100Gb/s read as 12.5 GB/s: a lowercase b is bits in both."""
    assert "'1Gb' is in bits" in refused("allreduce", "-s", "1Gb", "-n", "8")
    assert "write 4MiB" in refused("allreduce", "-s", "4Mib", "-n", "8")
    code, out, _ = run("calc", "allreduce", "-s", "1GB", "-n", "8", "--beta", "100Gb/s")
    assert code == 0 and "of 1 GB" in out and "12.5 GB/s" in out


def test_the_cli_reviews_small_refusals_say_what_was_given():
    """--recompute alone was told '--sequence-parallel and --recompute need the shape'; --beta 100GB was an
    'unknown time unit'; --bytes 1e-300 was offered '1e-300GB'; the default 5us read 4.9999999999999996e-06."""
    err = refused("memory", "--params", "7B", "--recompute", "full")
    assert err.startswith("distai: error: --recompute needs the shape"), err
    assert "--sequence-parallel and --recompute need" in refused("memory", "--params", "7B", "--recompute", "full",
                                                                 "--sequence-parallel")
    assert "per-second unit, e.g. GB/s: '100GB'" in refused("allreduce", "-s", "1GB", "-n", "8", "--beta", "100GB")
    err = refused("allreduce", "-s", "1e-300", "-n", "8")
    assert "is not a whole number of bytes" in err and "did you mean" not in err
    assert units.parse_time("5us") == 5e-06 and units.parse_time("7ns") == 7e-09 and units.parse_time("2h") == 7200
    code, out, _ = run("calc", "allreduce", "-s", "1GB", "-n", "1", "--json")
    assert code == 0 and '"alpha_s": 5e-06' in out
