"""Spanish everywhere a learner reads the command line and a run's summary (issue 27.2): each
calculator's text, `distai run`/`calc`/`quiz` errors and help, and every experiment's rank-0
summary, rendered in Spanish, hold no English sentence.

"No English sentence" is checked word by word: common English words (function words and the
words the English summaries are made of) must not appear as whole words once numbers, units,
flags and code identifiers (``dist.all_reduce``, ``--tp-across-nodes``, ``max|Δw|``) are set aside.
Each summary and each calculator is rendered in English too, where the same check must find
English: a check that cannot see English could not fail.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distai.lessons.registry import all_calculators
from distai.lessons.strings import LANG_ENV, detect_language
from distai.tutor.cli import main

RECORDED = Path(__file__).parent / "recorded_runs"

# English words no Spanish sentence of the course uses (Spanish shares "no", "total", "a", "tokens"…;
# the Spanish lessons write "rank", "checkpoint" and "batch" as the field and the course's own outline do)
ENGLISH = frozenset("""
the of and on with per at from by each every sent steps step timings loss time measured lesson
fits fit not is are than without layer layers parameters gradients activations bubble memory identical
restart restarts compare between after before share peak expected weights none only held
ratio training failure failures attempt attempts redone saved must got choose
unknown value whole number greater least most serving requests targets best rejected microbatches
stages chunks sequence sequences flight replica replicas bound within which what when where this that
these those it its be been was were has have had will would can could should into over under
such option see got check diff
""".split())

# set aside before looking for words: code identifiers (`in backticks`, lesson3), flags, units and numbers
CODE = re.compile(r"`[^`]*`|\b[a-z]+\d\w*|\S*[_|]\S*|--?[a-z][\w-]*|\b\w+\.\w+\b|\b[\w-]+\(|\d[\d.,]*\S*")


def english_words(text: str) -> list[str]:
    """The English words of ``text`` outside code, flags and numbers (lower-cased, in order)."""
    plain = CODE.sub(" ", text)
    return [w for w in re.findall(r"[A-Za-zÀ-ÿ]+", plain) if w.lower() in ENGLISH]


def assert_spanish(text: str, what: str) -> None:
    found = english_words(text)
    assert not found, f"{what}: English in the Spanish text: {sorted(set(found))}\n{text}"


def assert_both(render, what: str) -> None:
    """``render(lang)`` is Spanish in Spanish, and English in English (the check can see English)."""
    assert english_words(render("en")), f"{what}: the check finds no English in the English text"
    assert_spanish(render("es"), what)


# --------------------------------------------------------------------------------------- calculators
#: every calculator with arguments that reach its optional lines (fit, activations, chunks, rejections)
CALC_ARGS: dict[str, list[str]] = {
    "allreduce": ["--bytes", "1GB", "--ranks", "8"],
    "memory": ["--params", "175B", "--dp", "8", "--strategy", "zero3", "--tp", "8", "--layers", "96",
               "--hidden", "12288", "--seq", "2048", "--micro-batch", "1", "--heads", "96", "--gpu-memory", "80GB"],
    "checkpoint": ["--mtbf", "24h", "--cost", "5min", "--restart", "10min"],
    "tp-comm": ["--hidden", "8192", "--seq", "2048", "--micro-batch", "1", "--tp", "8", "--sequence-parallel"],
    "bubble": ["--stages", "8", "--microbatches", "32", "--schedule", "interleaved", "--chunks", "4"],
    "kvcache": ["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--tokens", "128k", "--tp", "8"],
    "serve": ["--params", "69B", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads", "8",
              "--gpus", "8", "--gpu-memory", "80GB", "--hbm-bandwidth", "3.35TB/s", "--ttft-slo", "1s", "--tpot-slo", "50ms"],
    "plan": ["--params", "7B", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096",
             "--global-batch", "1024", "--gpus", "64", "--gpu-memory", "80GB"],
    "context": ["--seq", "128k", "--cp", "8", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
                "--layers", "32"],
    "moe": ["--experts", "8", "--top-k", "2", "--hidden", "4096", "--ffn", "14336", "--layers", "32",
            "--vocab", "32000", "--heads", "32", "--kv-heads", "8", "--ep", "8", "--tokens", "4096"],
}

def calc_text(capsys, name: str, lang: str) -> str:
    code = main(["calc", name, *CALC_ARGS[name], "--lang", lang])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_every_calculator_has_arguments_here():
    assert set(CALC_ARGS) == set(all_calculators())


@pytest.mark.parametrize("name", sorted(CALC_ARGS))
def test_calculator_text_in_spanish(capsys, name):
    assert_both(lambda lang: calc_text(capsys, name, lang), f"distai calc {name}")


def test_plan_rejections_in_spanish(capsys):
    """calc plan's "Rejected" lines: each kind of reason the planner gives (ZeRO without dp, memory,
    a TP group off the node, a shape the heads refuse) is printed in Spanish, and the JSON keeps the
    English reason beside each language's text."""
    code = main(["calc", "plan", *CALC_ARGS["plan"], "--json"])
    rejected = json.loads(capsys.readouterr().out)["rejected"]
    assert code == 0 and {"memory", "zero", "node", "heads", "layers"} <= {c["kind"] for c in rejected}
    for c in rejected:
        assert c["reason_text"]["en"] == c["reason"]
    text = calc_text(capsys, "plan", "es")
    lines = text[text.index("Descartadas"):].splitlines()[1:]
    assert len(lines) >= 4 and all(re.match(r"^\s+\d+ × ", line) for line in lines)
    assert_both(lambda lang: "\n".join(c["reason_text"][lang] for c in rejected), "calc plan --json reasons")
    assert_spanish("\n".join(lines), "calc plan's rejections")


def test_calculator_errors_in_spanish(capsys):
    code = main(["calc", "bubble", "--stages", "2.5", "--microbatches", "4", "--lang", "es"])
    err = capsys.readouterr().err
    assert code == 2 and "--stages" in err and "entero" in err
    assert_spanish(err, "calc error")


PLAN = ["calc", "plan", "--params", "175B", "--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048",
        "--global-batch", "1024"]


@pytest.mark.parametrize("argv", [
    ["--gpus", "992", "--gpu-memory", "80GB"],  # the factor 31 no degree can take
    ["--gpus", "8", "--gpu-memory", "8GB"],     # memory: the nearest miss
    ["--gpus", "8", "--gpu-memory", "80GB", "--memory-util", "1.5"],  # a flag out of range
], ids=["factor", "memory", "flag"])
def test_plan_errors_in_spanish(capsys, argv):
    """When nothing fits (or a flag is wrong), calc plan's one line is in the learner's language."""
    def render(lang: str) -> str:
        code = main([*PLAN, *argv, "--lang", lang])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        return err
    assert_both(render, "calc plan's one-line error")


@pytest.mark.parametrize("argv", [
    ["calc", "bubble", "-p", "4", "-m", "6", "--schedule", "interleaved", "--engine", "megatron"],
    ["calc", "bubble", "-p", "4", "-m", "3", "--schedule", "1f1b", "--engine", "torch"],
    ["run", "lesson5", "--cpu", "2", "--microbatches", "1"],
], ids=["megatron-rounds", "torch-1f1b", "run-lesson5"])
def test_pipeline_refusals_in_spanish(capsys, argv):
    """Lesson 5's schedule rules refuse in the learner's language, from the calculator and before a launch."""
    def render(lang: str) -> str:
        code = main([*argv, "--lang", lang])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        return err
    assert_both(render, "a pipeline schedule's refusal")


def test_quiz_errors_in_spanish(capsys):
    code = main(["quiz", "1", "--count", "500", "--lang", "es"])
    err = capsys.readouterr().err
    assert code == 2 and "500" in err
    assert_spanish(err, "quiz error")


@pytest.mark.parametrize("argv", [["--cpu", "0"], ["--gpus", "2", "--cpu", "2"], ["--steps", "-1"],
                                  ["--max-restarts", "500"]])
def test_run_refusals_in_spanish(capsys, argv):
    """`distai run` refuses bad requests before launching anything: one line, in Spanish."""
    code = main(["run", "1", *argv, "--lang", "es"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and argv[0] in err
    assert_spanish(err, f"distai run {' '.join(argv)}")


def test_help_follows_distai_lang():
    """`--help` is read before `--lang`: DISTAI_LANG (or the locale) chooses its language. Every value is
    named in it (N, CARPETA, PUERTO: lessons/catalog/metavar.toml), never by Typer's Python types (<int>, <str>,
    <list[str]>), which the audit of stop 55 found in five commands' help."""
    for command in (["run", "--help"], ["calc", "--help"], ["quiz", "--help"], ["runs", "--help"],
                    ["runs", "show", "--help"], ["runs", "export", "--help"], ["runs", "prune", "--help"],
                    ["doctor", "--help"], ["slurm", "--help"], ["tutor", "--help"], ["lessons", "--help"]):
        env = {**os.environ, LANG_ENV: "es", "COLUMNS": "200"}
        out = subprocess.run([sys.executable, "-m", "distai.tutor.cli", *command], env=env, capture_output=True,
                             text=True, timeout=60).stdout
        # Typer's own frame is Spanish too: "Uso:", "Opciones", the --help option's help
        assert "Uso: " in out and "Opciones" in out and "Muestra esta ayuda y termina." in out, out
        # Click's placeholders on the usage line too (the frame's regex then skips the whole line)
        assert "[OPCIONES]" in out and "[OPTIONS]" not in out and "COMMAND" not in out, out
        assert re.search(r"<[a-z][\w\[\],]*>", out) is None, out
        assert_spanish(TYPER_FRAME.sub(" ", out), " ".join(command))


# ------------------------------------------------------------------------------ doctor and slurm
#: a `distai doctor --quick --json` report of a 2-CPU machine without CUDA (its advice: two lessons)
DOCTOR_REPORT = {
    "machine": {"hostname": "vm", "platform": "Linux-6.18.44-x86_64-with-glibc2.36", "cpu_model": "AMD EPYC",
                "cpus": 2, "cpus_usable": 2, "memory_bytes": 25276194816, "python": "3.11.7",
                "torch": "2.13.0+cpu", "cuda_available": False, "cuda": None, "nccl": None, "gloo": True,
                "gpus": [], "topology": None},
    "bandwidth": {
        "host_memcpy_Bps": 10189586920.351835, "loopback_tcp_Bps": 3490060413.859514,
        "allreduce": {
            "backend": "gloo", "ranks": 2,
            "results": [{"bytes": 1048576, "time_s": 0.001574112000525929, "algbw": 666138114.4732132,
                         "busbw": 666138114.4732132},
                        {"bytes": 16777216, "time_s": 0.008728679000341799, "algbw": 1922079618.1579177,
                         "busbw": 1922079618.1579177}],
            "link": {"alpha_s": 0.0007417444376187632, "beta_s_per_byte": 3.727664925745724e-10,
                     "small_bytes": 4.0, "large_bytes": 4194304.0, "small_s": 0.0007417444376187632,
                     "large_s": 0.002305238937424292}}},
    "advice": [{"lesson": "lesson1", "ranks": 4, "runs_on": "cpu", "run": "distai run lesson1 --cpu 4",
                "why": "no_cuda", "gpus_here": 0,
                "command": "distai run lesson1 --cpu 4  (no CUDA: gloo on CPU processes)"},
               {"lesson": "lesson3", "ranks": 2, "runs_on": "cpu", "run": "distai run lesson3 --cpu 2",
                "why": "no_cuda", "gpus_here": 0,
                "command": "distai run lesson3 --cpu 2  (no CUDA: gloo on CPU processes)"}],
}


def _with_gpus(report: dict) -> dict:
    """The same report on a machine with two GPUs and NVLink: gpu rows, topology, each advice reason."""
    from distai.engine.doctor import lesson_advice
    from distai.lessons.registry import all_lessons

    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984, "capability": "9.0"}
            for i in range(2)]
    machine = {**report["machine"], "gpus": gpus, "cuda": "12.4", "nccl": "2.21.5",
               "topology": "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X "}
    return {**report, "machine": machine, "advice": lesson_advice(machine, all_lessons())}


@pytest.mark.parametrize("gpus", [False, True], ids=["cpu-only", "two-gpus"])
def test_doctor_report_in_spanish(gpus):
    """`distai doctor --lang es`'s report (doctor_lines, from a real report): Spanish labels and
    reasons, decimal commas, the label column as wide as the longest label; the commands stay commands."""
    from distai.tutor.cli_doctor import doctor_lines

    report = _with_gpus(DOCTOR_REPORT) if gpus else DOCTOR_REPORT
    english, spanish = doctor_lines(report, "en"), doctor_lines(report, "es")
    assert len(english) == len(spanish)
    text = "\n".join(spanish)
    assert "memoria 23,5 GiB" in text and "10,19 GB/s" in text and "tiempo     1,57 ms" in text
    assert "alfa 742 µs, beta 3,73e-10 s/B (= 2,68 GB/s)" in text and "2 utilizables de 2" in text
    assert "distai run lesson1 --cpu 4  (" in text
    for label in ("machine", "cpus", "usable", "memory", "time", "alpha", "advice", "host to host"):
        assert label not in text, label
    if gpus:
        assert "GPU 1     NVIDIA H100 80GB HBM3  79,6 GiB" in text and "topología" in text
        assert "(necesita 4 GPU, esta máquina tiene 2;" in text and "(NCCL, un rank por GPU)" in text
    else:
        assert "ninguna (CUDA no disponible)" in text and "(sin CUDA: gloo en procesos de CPU)" in text
    # English keeps its layout: a 10-wide label column
    assert english[0].startswith("machine   vm") and any(line.startswith("allreduce gloo, 2 ranks   (busbw") for line in english)
    assert_both(lambda lang: "\n".join(doctor_lines(report, lang)), "distai doctor's report")


@pytest.mark.parametrize("lang", ["en", "es"])
def test_doctor_report_fits_80_columns(lang):
    """The link line (120 characters) and the shared-cores note (135) wrapped past 80 columns: with
    the terminal's width they wrap under their column, every word kept; piped, lines stay whole."""
    from distai.tutor.cli_doctor import doctor_lines

    report = {**DOCTOR_REPORT, "advice": [{**a, "ranks": 8} for a in DOCTOR_REPORT["advice"]]}  # 8 ranks, 2 cores
    whole, fitted = doctor_lines(report, lang), doctor_lines(report, lang, 79)
    assert max(map(len, whole)) > 79 and max(map(len, fitted)) <= 79, fitted
    assert " ".join(" ".join(fitted).split()) == " ".join(" ".join(whole).split())
    column = whole[0].index("vm")  # where the label column ends: the link line goes on under it
    link = next(i for i, line in enumerate(fitted) if "µs" in line)
    assert fitted[link + 1].startswith(" " * column) and fitted[link + 1][column] != " ", fitted


def test_doctor_in_spanish_for_real(capsys):
    """`distai doctor --quick --lang es` (a few seconds: two gloo processes) prints its report in Spanish."""
    assert main(["doctor", "--quick", "--lang", "es"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("máquina ") and "consejos\n" in out and re.search(r"\d,\d\d GB/s", out)
    assert_spanish(out, "distai doctor --quick --lang es")


SLURM = ["slurm", "lesson1", "--nodes", "2", "--gpus-per-node", "4"]


@pytest.mark.parametrize("argv", [
    ["doctor", "--ranks", "1"], ["slurm", "lesson1", "--nodes", "0", "--gpus-per-node", "4"],
    ["slurm", "lesson1", "--nodes", "2", "--gpus-per-node", "99"], [*SLURM, "--time", "soon"],
    [*SLURM, "--port", "80"], [*SLURM, "--partition", "a b"], ["slurm", "lesson99", "--nodes", "2", "--gpus-per-node", "4"],
], ids=["doctor-ranks", "nodes", "gpus-per-node", "time", "port", "partition", "lesson"])
def test_doctor_and_slurm_refusals_in_spanish(capsys, argv):
    """`distai doctor` and `distai slurm` refuse bad values in one line, in the learner's language."""
    def render(lang: str) -> str:
        code = main([*argv, "--lang", lang])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("distai: error: "), err
        return err.removeprefix("distai: error: ")
    assert_both(render, " ".join(argv))


def test_slurm_says_where_it_wrote_in_spanish(capsys, tmp_path):
    """`distai slurm -o FILE --lang es`: the line on the terminal is Spanish; the script (for SLURM)
    is the English one, and its `distai run` gets the --lang."""
    def render(lang: str) -> str:
        target = tmp_path / f"job_{lang}.sbatch"
        assert main([*SLURM, "-o", str(target), "--force", "--lang", lang]) == 0  # written again: --force
        assert target.read_text().startswith("#!/bin/bash") and f"--lang {lang}'" in target.read_text()
        return capsys.readouterr().err
    assert "envíalo con: sbatch" in render("es")
    assert_both(render, "distai slurm -o FILE")


#: what a help names rather than says: the usage line's metavars (OPTIONS, LESSON), Typer's value
#: types (<bool>) and arguments ({lesson}), a default's value, and a row's first word (a command's or an argument's name)
TYPER_FRAME = re.compile(r"(?:Usage|Uso):.*|<\w+>|\{[\w-]+\}|\[(?:default|por defecto): [^]]*\]|^│ \*? *[\w-]+ ",
                         flags=re.MULTILINE)


@pytest.mark.parametrize("argv", [["calc", "plan", "--bogus", "1"], ["run", "lesson99"], ["runs", "--limit", "x"],
                                  ["run", "lesson1", "--max-restarts", "x"], ["run"], ["nope"], ["runs", "show", "a", "b"],
                                  ["quiz", "99"], ["tutor", "--lesson", "x"]])
def test_command_line_mistakes_in_spanish(capsys, argv):
    """A mistake Click or Typer catches before `--lang` is read (an unknown option or command, a
    value that is not a number, a missing or extra argument) and an unknown lesson: one line, exit
    2, in the language of `--lang`; the same line in English holds English (the check can see it)."""
    said = {}
    for lang in ("en", "es"):
        code = main([*argv, "--lang", lang])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("distai: error: "), err
        said[lang] = err
    assert_both(lambda lang: TYPER_FRAME.sub(" ", said[lang].removeprefix("distai: error: ")), " ".join(argv))


def _json_words(value) -> set[str]:
    """The keys and text values of a calculator's JSON object: names, not sentences (``fits``, ``best``)."""
    if isinstance(value, dict):
        return set(value) | {w for v in value.values() for w in _json_words(v)}
    if isinstance(value, list):
        return {w for v in value for w in _json_words(v)}
    return {value} if isinstance(value, str) else set()


def _given(args: list[str]) -> dict:
    """``CALC_ARGS``' flags as the options' values (a flag without a value is a switch)."""
    given, i = {}, 0
    while i < len(args):
        switch = i + 1 == len(args) or args[i + 1].startswith("--")
        given[args[i].lstrip("-").replace("-", "_")] = True if switch else args[i + 1]
        i += 1 if switch else 2
    return given


def calculator_help(env: dict[str, str], argv_tail: list[str] = ()) -> dict[str, str]:
    """Each calculator's own `distai calc NAME --help`, as a learner's shell prints it (one process:
    the help's language is chosen at start-up)."""
    # sys.argv as `distai calc NAME --help --lang es` gives it: the help's language is read from it at import
    code = (f"import sys\nsys.argv = ['distai', 'calc', 'NAME', '--help', *{list(argv_tail)!r}]\n"
            "from distai.tutor.cli import main\nfrom distai.lessons.registry import all_calculators\n"
            "for name in all_calculators():\n    print('@@', name)\n    sys.stdout.flush()\n"
            f"    main(['calc', name, '--help', *{list(argv_tail)!r}])\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "COLUMNS": "200", **env},
                         capture_output=True, text=True, timeout=120).stdout
    return dict(part.split("\n", 1) for part in out.split("@@ ")[1:])


@pytest.mark.parametrize("how", ["DISTAI_LANG", "LANG", "--lang"])
def test_calculator_help_in_spanish(how):
    """`distai calc NAME --help` (description, sources, JSON keys paragraph, each option's help) is
    Spanish with DISTAI_LANG=es, with a Spanish locale, or with --lang es on the command line; the
    JSON's own names (keys, choices, reason kinds) are code and set aside."""
    base = {LANG_ENV: "", "LANG": "C.UTF-8", "LC_ALL": ""}
    spanish = {"DISTAI_LANG": {LANG_ENV: "es"}, "LANG": {"LANG": "es_ES.UTF-8"}, "--lang": {}}[how]
    helps = {"es": calculator_help({**base, **spanish}, ["--lang", "es"] if how == "--lang" else []),
             "en": calculator_help(base)}
    calculators = all_calculators()
    assert set(helps["es"]) == set(helps["en"]) == set(calculators)
    for name, calc in calculators.items():
        result = calc.run(_given(CALC_ARGS[name]), "en")
        names = _json_words(result) | {c for o in calc.options for c in o.choices}

        def text(lang: str, name: str = name, names: set[str] = names) -> str:
            plain = TYPER_FRAME.sub(" ", helps[lang][name])
            return " ".join(w for w in re.split(r"([\s,;:()/]+)", plain) if w not in names)

        assert calc.help("es").split("\n")[0][:40] in " ".join(helps["es"][name].split()), name
        assert_both(text, f"distai calc {name} --help ({how})")


@pytest.mark.parametrize("lang", ["en", "es"])
def test_calculator_help_says_each_default_once(lang):
    """An option whose help says its default in words ("default 989e12: H100 SXM") got Typer's "[default:
    989e12]" after it as well; now one or the other, in every calculator's help."""
    base = {LANG_ENV: lang, "LANG": "C.UTF-8", "LC_ALL": ""}
    helps = calculator_help(base)
    said = re.compile(r"\b(?:default|por defecto)\b", re.IGNORECASE)
    for name, text in helps.items():
        rows: list[str] = []  # one option's row and its wrapped lines each
        for line in text.splitlines():
            inner = line.strip("│ ")
            if inner.startswith("-"):
                rows.append(inner)
            elif rows and line.startswith("│"):
                rows[-1] += " " + inner
        bracket = re.compile(r"\[(?:default|por defecto): [^]]*\]")
        twice = [row.split()[0] for row in rows if bracket.search(row) and said.search(bracket.sub("", row))]
        assert rows and not twice, (name, twice)
    assert any("[default:" in text or "[por defecto:" in text for text in helps.values())  # Typer's stays elsewhere


def test_distai_lang_wins_over_the_locale():
    assert detect_language(environ={LANG_ENV: "es", "LANG": "en_US.UTF-8"}) == "es"
    assert detect_language(environ={"LANG": "es_ES.UTF-8"}) == "es"
    assert detect_language("en", environ={LANG_ENV: "es"}) == "en"


# ---------------------------------------------------------------------------------- run summaries
def recorded(lesson: str) -> list[dict]:
    return [json.loads(line) for line in (RECORDED / f"{lesson}.jsonl").read_text().splitlines()]


def test_lesson1_summary_in_spanish():
    from distai.engine.experiments.lesson1 import summary_from_event

    # a CPU run's summary as lesson 1 returns it (tests/test_lesson1_experiment.py runs the real one)
    s = {"n": 4, "backend": "gloo", "device": "cpu", "wall_s": 7.6, "steps": 10, "first_loss": 4.2,
         "final_loss": 3.9, "ring_vs_all_reduce_max_abs_diff": 2.4e-7, "sweep_sizes": 6,
         "peak_ring_busbw": 1.1e9, "peak_ar_busbw": 1.3e9, "busbw_ratio_16MiB_plus": 0.84,
         "fit": {"ring": {"alpha_s": 4e-5, "beta_s_per_byte": 9e-10, "bandwidth": 1.1e9}}}
    assert_both(lambda lang: summary_from_event(s, lang), "lesson 1 summary")


def test_lesson2_summary_in_spanish():
    from distai.engine.experiments.lesson2 import summary_table

    events = recorded("lesson2")
    memory = {e["strategy"]: e for e in events if e["kind"] == "memory" and e["rank"] == 0}
    comm = {e["strategy"]: e for e in events if e["kind"] == "comm" and e["rank"] == 0}
    setup = next(e for e in events if e["kind"] == "phase" and e["rank"] == 0)
    rows = [(s, m["total"], m["predicted"], comm[s]["sent"], comm[s]["predicted"], 0.012, 1e-7, [1.0])
            for s, m in memory.items()]
    args = argparse.Namespace(precision="bf16", optimizer=setup["optimizer"], steps=3)
    assert_both(lambda lang: "\n".join(summary_table(rows, setup["num_params"], setup["world_size"], args,
                                                     setup["backend"], lang)), "lesson 2 summary")


def test_lesson3_summary_in_spanish():
    from distai.engine.experiments.lesson3 import summary_from_event

    s = {"steps": 20, "world_size": 4, "attempts": 2, "failures": 1, "restarts": 1, "redone_steps": 3,
         "checkpoints": 4, "form": "dcp", "checkpoint_bytes": 52000, "checkpoint_seconds_mean": 0.012,
         "ckpt_cost": {"every": 5, "none": {"step_s": 0.01}, "sync": {"step_s": 0.014, "blocked_s": 0.02,
                                                                    "per_checkpoint_s": 0.02},
                       "async": {"step_s": 0.011, "blocked_s": 0.004, "per_checkpoint_s": 0.005}},
         "compare": {"identical": False, "equal_steps": 12, "steps": 20, "first_diff_step": 13,
                     "max_abs_diff": 1e-3, "weights_identical": False, "run_sha256": "ab" * 32}, "forgot": ["rng"]}
    assert_both(lambda lang: summary_from_event(s, lang), "lesson 3 summary")
    s["compare"] = {**s["compare"], "identical": True, "weights_identical": True}
    assert_both(lambda lang: summary_from_event(s, lang), "lesson 3 summary (identical)")


def test_lesson6_recorded_summary_in_spanish():
    from distai.engine.experiments.lesson6 import summary_from_event

    summary = next(e for e in recorded("lesson6") if e["kind"] == "summary")
    assert_both(lambda lang: summary_from_event(summary, lang), "lesson 6 summary (recorded)")
    no_scaler = {**summary, "scaling": {**summary["scaling"], "scaler": False, "overflows": 3, "final_loss": 4.1}}
    assert_both(lambda lang: summary_from_event(no_scaler, lang), "lesson 6 summary (no scaler)")


def test_lesson5_summary_in_spanish():
    from types import SimpleNamespace

    from distai.engine.experiments.lesson5 import summary_text

    stage = {"rank": 0, "bubble": 0.3, "peak_bytes": 3 << 20, "peak_expected_bytes": 3 << 20, "peak_microbatches": 4.0,
             "peak_formula": 4, "torch_peak_bytes": 3 << 20}
    r = {"schedule": "interleaved", "loss": [4.1, 4.0], "torch_loss": [4.1, 4.0], "ref_loss": 4.1,
         "max_grad_diff_vs_unsplit": 3e-8, "max_grad_diff_vs_torch": 2e-8, "grad_scale": 0.5, "step_time_s": 0.031,
         "torch_step_time_s": 0.029, "bubble_measured": 0.31, "bubble_formula": 0.27,
         "bubble_check": {"detail": {"replay_work": 0.29}}, "t_f_s": 0.002, "t_b_s": 0.004, "stages": [stage]}
    cfg, args = SimpleNamespace(layers=4, hidden=64, seq=32), argparse.Namespace(microbatch_size=2)
    assert_both(lambda lang: "\n".join(summary_text([r], cfg, args, 4, 8, 2, "cpu", lang, cores=2)),
                "lesson 5 summary")


def test_capstone_summary_in_spanish():
    from distai.engine import mesh
    from distai.engine.experiments.capstone import summary_text

    config = {"pp": 2, "dp": 2, "tp": 2, "world": 8, "device": "cpu", "dtype": "float32", "layers": 4, "hidden": 64,
              "seq": 32, "vocab": 128, "schedule": "interleaved", "v": 2, "m": 4, "microbatch_size": 2, "zero": True}
    account = {dim: {"calls": 4, "bytes": 65536} for dim in mesh.DIMS}
    accounts = [{"pp": 0, "measured": account, "expected": account, "match": {dim: True for dim in mesh.DIMS}}]
    result = {"config": config, "losses": [4.2, 4.1], "ref_losses": [4.2, 4.1], "max_loss_rel_diff": 1e-7,
              "max_param_rel_diff": 2e-7, "step_time_s": 0.05}
    assert_both(lambda lang: "\n".join(summary_text(result, accounts, lang)), "capstone summary")
    # five axes with experts: the cp and experts lines too
    five = dict(config, cp=2, tp=1, zero=False, experts=4, top_k=2, ep=2)
    assert_both(lambda lang: "\n".join(summary_text(dict(result, config=five), accounts, lang)),
                "capstone five-axis summary")
    # the median a step takes, and the mean the step-time check compares; with experts no prediction
    measured = dict(result, step_time_mean_s=0.0612)
    assert "  step time: median 50.0 ms, mean 61.2 ms (the one checked)" in summary_text(measured, accounts, "en")
    assert "  tiempo por paso: mediana 50,0 ms, media 61,2 ms (la comprobada)" in summary_text(measured, accounts, "es")
    assert "  step time (median): 50.0 ms; with experts it is not predicted" in summary_text(
        dict(measured, config=five), accounts, "en")
    # the table's header sits over its rows' columns in both languages (Spanish ran "fórmula bytes" together),
    # the moe row is said, and no line passes 71 columns
    for lang in ("en", "es"):
        lines = [x for line in summary_text(dict(measured, config=five), accounts, lang) for x in line.split("\n")]
        head = next(i for i, line in enumerate(lines) if "/" in line and "KiB" not in line)
        slashes = lambda line: [i for i, c in enumerate(line) if c == "/"]  # noqa: E731
        assert slashes(lines[head]) == slashes(lines[head + 1]), lines[head:head + 2]
        assert lines[head].rstrip().endswith("ok") and lines[-1].lstrip().startswith("(moe:")
        assert max(map(len, lines)) <= 71, [x for x in lines if len(x) > 71]


def test_lesson4_summary_in_spanish():
    from distai.engine.experiments import lesson4

    events = recorded("lesson4")
    config = next(e for e in events if e["kind"] == "config")
    checks = {e["mode"]: e for e in events if e["kind"] == "comm_check" and e["rank"] == 0}
    vocab = {"logits_width": config["vocab"] // config["T"], "vocab": config["vocab"], "ce_allreduce_count": 3, "ce_wire_bytes": 1536,
             "gather_logits_wire_bytes": 98304}
    rows = {m: {"losses": [4.2, 4.1], "dense_losses": [4.2, 4.1], "max_grad_diff": 3e-7,
                "comm_layer0": c["layers"]["0"], "comm_match": c["match"], "memory_measured": 98304,
                "memory_formula": 90112, "memory_ln_stats": 8192, "vocab": vocab, "sp_grads_unsynced_diff": 2e-2}
            for m, c in checks.items()}
    cmp = {"out_ours_vs_dtensor": 1e-7, "grad_ours_vs_dtensor": 2e-7, "out_ours_vs_dense": 3e-7,
           "ours_comm": {"all_reduce": 2}, "dtensor_comm": {"all_reduce": 2}}
    summary = {"T": config["T"], "modes": rows, "seconds": 3.2, "forgotten_g": {"bug": 0.4, "fixed": 1e-7},
               "dtensor": {m: cmp for m in checks}, "backend": config["backend"], "micro_batch": config["micro_batch"],
               "steps": 2, **{k: config[k] for k in ("hidden", "heads", "seq", "layers", "vocab")}}

    def render(lang: str) -> str:
        return lesson4.summary_from_event(summary, lang)

    assert_both(render, "lesson 4 summary")


def test_lesson7_report_in_spanish():
    """Lesson 7's report: its KV cache and prefix parts from the recorded run's events; TP, PP,
    TP × PP and routing from their summaries' shapes."""
    from types import SimpleNamespace

    from distai.engine.experiments import lesson7 as l7

    events = recorded("lesson7")
    config = next(e for e in events if e["kind"] == "config")
    kv = {"throughput_ratio": 1.6, **next(e for e in events if e["kind"] == "kv_compare")}
    px = next(e for e in events if e["kind"] == "prefix_compare")
    px = {"tokens_equal": True, "ttft_ratio": 22.8, **px,
          "prefix": {"logical_blocks_mean": 65.5, "memory_saved": 0.46, "hit_rate": 0.9, "cow": 3, "evicted": 0,
                     "looked_up_tokens": 1500, "reused_tokens": 1350, **px["prefix"]}}
    cfg = SimpleNamespace(layers=config["layers"], hidden=config["hidden"], heads=config["heads"],
                          group_heads=config["kv_heads"])
    W = config["W"]
    tp = {"equal": True, "all_reduces_per_token": 8, "all_reduce_bytes_per_token": 4096,
          "shards": [{"kv_heads": 2, "kv_bytes": 8192, "formula_bytes": 8192}] * W}
    pp = {"equal": True, "microbatches": 2,
          "shards": [{"layers": [0, 1], "kv_bytes": 8192, "formula_bytes": 8192, "sends_per_token": 2}] * W}
    mesh = {"equal": True, "tp": 2, "pp": 1, "microbatches": 1,
            "shards": [{"stage": 0, "tp_rank": r, "layers": [0, 1, 2, 3], "kv_heads": [2 * r, 2 * r + 1], "kv_bytes": 8192,
                        "formula_bytes": 8192, "all_reduces_per_token": 8, "expected_per_token": 8} for r in range(W)]}
    policy = {"ttft_p50_s": 0.02, "ttft_p99_s": 0.1, "tpot_p50_s": 0.01, "tpot_p99_s": 0.02,
              "throughput_tokens_per_s": 812.0, "prefix_hit_rate": 0.4}
    rt = {"replicas": 4, "requests": 200, "rate_per_s": 12.5, "load": 0.8, "cost": {"source": "measured"},
          "cost_examples": {"prefix_len": 100, "prefill_prefix_s": 0.004, "prompt_len": 140, "prefill_prompt_s": 0.005,
                            "decode_1_s": 0.002, "max_batch": 16, "decode_max_s": 0.004},
          "policies": {"round-robin": policy, "prefix-affinity": policy}}

    def render(lang: str) -> str:
        lines = (l7.head_lines(cfg, config["params"], config["dtype"], W, "gloo", lang) + l7.tp_lines(tp, W, cfg.layers, lang)
                 + l7.pp_lines(pp, W, lang) + l7.mesh_lines(mesh, lang) + l7.kv_lines(kv, lang)
                 + l7.prefix_lines(px, lang) + l7.routing_lines(rt, lang))
        return "\n".join(lines)

    assert_both(render, "lesson 7 report")


def _templates(table) -> list[str]:
    from collections.abc import Mapping

    out: list[str] = []
    for value in table.values():
        out += _templates(value) if isinstance(value, Mapping) else [value]
    return out


@pytest.mark.parametrize("area,key", [("summary", None), ("calc", None), ("cli", None), ("experts", "summary"),
                                      ("ring_attention", None), ("run", "placement")])
def test_spanish_templates_hold_no_english(area, key):
    """Every Spanish template of what the CLI and the experiments print, whichever branch prints it
    (the tests above render the common ones), is Spanish; the English ones are English."""
    from distai.lessons.strings import strings

    def text(lang: str) -> str:
        table = strings(area, lang)
        # the fields' names ({steps}, {loss}) are code, not text
        return re.sub(r"\{[^}]*\}", " ", "\n".join(_templates(table[key] if key else table)))

    assert_both(text, f"lessons/catalog/{area}.toml" + (f" [{key}]" if key else ""))


def test_lesson3_run_lines_in_spanish(monkeypatch):
    """What lesson 3 prints while it runs (the fault it will inject, a rank's death, the restart,
    each checkpoint), in the run's language: the launcher's DISTAI_LANG."""
    from distai.engine.experiments import lesson3

    args = argparse.Namespace(no_fault=False, kill_rank=1, at_step=9, fail_every=30.0, max_failures=2, seed=0)

    def render(lang: str) -> str:
        monkeypatch.setenv(LANG_ENV, lang)
        faults = lesson3.Faults(args, 0, 4, 0, None, lambda: (1, "step"))
        where = lesson3._log("during_phase", phase="checkpoint", prev=4)
        return "\n".join([
            lesson3._log("fault", what=faults.describe()),
            lesson3._log("died", rank=1, cause="--kill-rank", where=where),
            lesson3._log("restart", attempt=1, how=lesson3._log("how_in_place"),
                         who=lesson3._log("who_step", rank=1, step=9),
                         origin=lesson3._log("origin_checkpoint", step=5), ms=lesson3._ms(0.03),
                         redo=lesson3._log("lost_many", n=3, first=6, last=8), forget=""),
            lesson3._log("redone", count=3, span="6–8", same=lesson3._log("redone_same"), n=3),
            lesson3._log("saved_async", step=10, size=lesson3._kib(1321779), blocked=lesson3._ms(0.019),
                         written=lesson3._ms(0.05), name="step_00000010")])

    assert "1,26 MiB" in render("es")
    assert_both(render, "lesson 3's run lines")


def test_runs_list_in_spanish(capsys, monkeypatch, tmp_path):
    """`distai runs --lang es`: the table's header, each run's status and its duration (decimal
    comma), and the empty list's message, in Spanish."""
    from distai.engine.runs import create_run

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))

    def render(lang: str) -> str:
        assert main(["runs", "--lang", lang]) == 0
        return capsys.readouterr().out

    assert_both(render, "distai runs (empty)")
    for status, duration in (("ok", 16.3), ("failed", 2.5), ("stopped", 1.0)):
        rec = create_run(tmp_path / "runs", "lesson3", "distai.engine.experiments.lesson3", config={"nproc": 2, "device": "cpu"})
        rec.status, rec.duration_s = status, duration
        rec.save()
    spanish = render("es")
    assert "16,3 s" in spanish and "fallida" in spanish and "detenida" in spanish
    assert_both(render, "distai runs")



@pytest.mark.parametrize("lang", ["en", "es"])
def test_runs_list_fits_80_columns(capsys, monkeypatch, tmp_path, lang):
    """At 80 columns `distai runs` drops its lesson and start columns (the id holds both) and wraps
    a failed run's reason under its mark; a wide terminal keeps every column."""
    from distai.engine.runs import create_run

    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    rec = create_run(tmp_path / "runs", "capstone", "distai.engine.experiments.capstone", config={"nproc": 8, "device": "cpu"})
    rec.status, rec.duration_s, rec.error = "failed", 12.5, "rank 3 exited with code 1: " + "x " * 60
    rec.save()
    for columns, whole in (("80", False), ("200", True)):
        monkeypatch.setenv("COLUMNS", columns)
        assert main(["runs", "--lang", lang]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert max(map(len, lines)) <= int(columns) - 1, lines
        assert lines[1].startswith(rec.id) and ("capstone " in lines[1][len(rec.id):]) == whole, lines
        reason = [line for line in lines[2:] if line.strip()]
        assert reason[0].lstrip().startswith("└ rank 3") and (len(reason) == 1) == whole, lines
        assert all(line.startswith(" " * (len(rec.id) + 4)) for line in reason[1:]), lines


def test_the_run_view_of_lesson_1_in_spanish():
    """`distai run lesson1 --lang es`'s view (training line, ring step, ring check, sweep, fits, check
    table, end line) holds no English; in English it does (the check can see English)."""
    from rich.console import Console

    from distai.engine.run_state import RunState
    from distai.tutor.cli_run import render_state

    state = RunState()
    for e in ({"kind": "run_start", "t": 0.0, "run_id": "r", "nproc": 2, "device": "cpu"},
              {"kind": "step", "t": 1.0, "rank": 0, "step": 0, "of": 40, "loss": 4.7, "comm_s": 0.004, "compute_s": 0.004},
              {"kind": "ring_step", "t": 1.0, "rank": 0, "call": 3, "step": 1, "of": 2, "phase": "all-gather",
               "chunk": 0, "to": 1, "bytes": 1 << 20},
              {"kind": "ring_check", "t": 1.0, "rank": 0, "max_abs_diff": 0.0},
              {"kind": "sweep", "t": 1.0, "rank": 0, "size": 1 << 20, "ring_time_s": 9e-4, "ring_busbw": 1.1e9,
               "ar_time_s": 8e-4, "ar_busbw": 1.2e9},
              {"kind": "fit", "t": 1.0, "rank": 0, "impl": "ring", "alpha_s": 3.9e-4, "beta_s_per_byte": 5e-10,
               "bandwidth": 2e9},
              {"kind": "run_end", "t": 2.0, "status": "ok", "duration_s": 2.0}):
        state.feed(e)

    def shown(lang: str) -> str:
        console = Console(width=120, record=True)
        console.print(render_state(state, lang=lang))
        return TYPER_FRAME.sub(" ", console.export_text())

    assert "dist.all_reduce" in shown("es")
    assert_both(shown, "distai run lesson1's view")


# "rango" is a numeric range or a matrix rank in Spanish; a process is a "rank", as the field says.
# These are the places where "rango(s)" can only mean a process: next to its index (rango 3, rango i,
# rango *r*, rango {r}), after a count (8 rangos, N rangos, {n} rangos), after "cada", "por", "ningún",
# "este"…, as "los rangos", or qualified by a parallelism axis (rango TP, rango global, rangos dp·cp).
# Lesson 6's numeric ranges ("el rango de fp16", "la parte alta del rango", "un rango de 10^±38")
# match none of them.
PROCESS_RANGO = re.compile(
    r"\b[Rr]angos?\s+(?:\d|\*\w\*|`\w`|\{\w+\}|[a-df-np-tv-xz]\b|global\b|[TCDEP]P\b|dp·cp|de\s+(?:TP|CP|datos|expertos)\b)"
    r"|(?i:\b(?:cada|por|ningún|este|ese|otros?|último|demás|los)\s+rangos?\b)"
    r"|(?:\b\d+|\{\w+\}|\b[A-Z]|(?i:\b(?:dos|tres|cuatro|ocho)))\s+rangos\b")
LESSONS = Path(__file__).parent.parent / "lessons"


def spanish_texts(lessons: Path = LESSONS) -> dict[str, str]:
    """Every Spanish text the course holds: each lesson's es/*.md, and every string under an ``es``
    key of the catalogs, quizzes and lesson steps (``[es]``, ``[kind.es]``, ``title = {es = …}``)."""
    import tomllib

    def strings(value, spanish: bool):
        if isinstance(value, dict):
            for key, inner in value.items():
                yield from strings(inner, spanish or key == "es")
        elif isinstance(value, list):
            for inner in value:
                yield from strings(inner, spanish)
        elif isinstance(value, str) and spanish:
            yield value

    texts = {str(p.relative_to(lessons)): p.read_text() for p in sorted(lessons.glob("*/es/*.md"))}
    for p in sorted(lessons.glob("**/*.toml")):
        texts[str(p.relative_to(lessons))] = "\n".join(strings(tomllib.loads(p.read_text()), False))
    return texts


def test_a_process_is_a_rank_in_spanish():
    """No Spanish text calls a process "rango" (a false friend: a numeric range, or a matrix rank);
    lesson 6's numeric ranges keep "rango"."""
    for process in ("el rango 3", "el rango i", "al rango *r*", "cada rango", "por rango", "ningún rango",
                    "los rangos de un grupo", "8 rangos", "{n} rangos", "N rangos", "cada rango TP"):
        assert PROCESS_RANGO.search(process), process
    texts = spanish_texts()
    assert sum(text.count("rank") for text in texts.values()) > 300, "the Spanish texts were not found"
    lesson6 = "\n".join(t for name, t in texts.items() if name.startswith("lesson6/"))
    for numeric in ("el rango de fp16", "la parte alta del rango", "un rango de 10^±38", "bits y rangos"):
        assert numeric in lesson6 and not PROCESS_RANGO.search(numeric), numeric
    found = [f"{name}: …{text[max(0, m.start() - 30):m.end() + 10]}…".replace("\n", " ")
             for name, text in texts.items() for m in PROCESS_RANGO.finditer(text)]
    assert not found, "'rango' for a process (write 'rank'):\n" + "\n".join(found)


def test_a_long_ctrl_z_is_explained_in_spanish(monkeypatch):
    """Why a run failed after a Ctrl-Z longer than its ranks wait for one another, in the learner's language;
    the shortest of the waits counts (lesson 1's --barrier-timeout over DISTAI_BARRIER_TIMEOUT_S), and a shorter
    suspension, or a run that did not fail, explains nothing (its failure is another's)."""
    from types import SimpleNamespace

    from distai.tutor.cli_run import ranks_wait_s, suspended_too_long

    monkeypatch.setenv("DISTAI_COLLECTIVE_TIMEOUT_S", "30")
    monkeypatch.delenv("DISTAI_BARRIER_TIMEOUT_S", raising=False)
    assert ranks_wait_s([]) == 30  # the collectives' 30 s, under the checkpoints' 60 s
    assert ranks_wait_s(["--barrier-timeout", "10"]) == 10 and ranks_wait_s(["--barrier-timeout=12"]) == 12
    assert ranks_wait_s(["--barrier-timeout", "x"]) == 30  # the experiment refuses it before the launch

    def run(suspended_s, wait_s=30.0, status="failed"):
        return SimpleNamespace(status=status, suspended_s=suspended_s, ranks_wait_s=wait_s)

    assert suspended_too_long(run(29.0), "en") is None and suspended_too_long(run(None), "en") is None
    assert suspended_too_long(run(90.0, status="stopped"), "en") is None
    assert suspended_too_long(run(90.0, None), "en") is None
    assert suspended_too_long(run(31.0), "en") == (
        "the run had been suspended (Ctrl-Z) for 31 s, longer than its ranks wait for one another (30 s): on "
        "resuming they gave up. To suspend a run longer, start it with DISTAI_COLLECTIVE_TIMEOUT_S and "
        "DISTAI_BARRIER_TIMEOUT_S (seconds) set above that")
    assert "llevaba 1,5 min suspendida" in suspended_too_long(run(90.0), "es")
    assert suspended_too_long(run(90.0), "es", brief=True) == (
        "falló al reanudarse tras un Ctrl-Z de 1,5 min, más de lo que sus ranks se esperan unos a otros (30 s)")
    assert_both(lambda lang: suspended_too_long(run(90.0), lang, brief=True), "distai runs' reason for it")
    assert_both(lambda lang: suspended_too_long(run(90.0), lang), "the long Ctrl-Z's explanation")
