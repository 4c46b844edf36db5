"""``distai run``'s checks before the launch speak the learner's language: one line, exit 2, nothing
launched (the capstone's mesh, lesson 7's decode mesh, the experts' run, lesson 5's options, the
model's size, argparse's own refusals, the multi-node flags)."""
from __future__ import annotations

import pytest

from distai.lessons.arg_errors import argparse_texts, unknown_option_texts
from distai.tutor.cli import main

CASES = [
    (["capstone", "--cpu", "8", "--dp", "3"],
     "dp·tp·pp = 3·2·2 = 12 no coincide con los 8 ranks; ejecútalo con --cpu 12 (o --gpus 12) o cambia los grados"),
    (["capstone", "--cpu", "8", "--dp", "3", "--cp", "2"],
     "dp·tp·pp·cp = 3·2·2·2 = 24 no coincide con los 8 ranks; ejecútalo con --cpu 24 (o --gpus 24) o cambia los grados"),
    (["capstone", "--cpu", "8", "--dp", "0"], "--dp debe ser un entero positivo, no 0"),
    (["capstone", "--cpu", "8", "--ep", "2"], "--ep 2 reparte expertos: añade --moe (o usa --ep 1)"),
    (["capstone", "--cpu", "8", "--ep", "3", "--moe"],
     "--ep 3 no divide dp·cp = 2·1 = 2 (los ranks de los expertos son ranks de paralelismo de datos y de contexto)"),
    (["capstone", "--cpu", "8", "--steps", "0"], "--steps debe ser al menos 1, no 0"),
    (["capstone", "--cpu", "8", "--schedule", "interleaved", "--chunks", "1"],
     "la planificación intercalada necesita --chunks >= 2, no 1"),
    (["capstone", "--cpu", "8", "--microbatch-size", "-1"], "--microbatch-size debe ser positivo, no -1"),
    (["capstone", "--cpu", "8", "--microbatch-size", "0"], "--microbatch-size debe ser positivo, no 0"),
    (["capstone", "--cpu", "8", "--moe", "--top-k", "9"], "--top-k 9 debe estar entre 1 y el número de expertos (8)"),
    (["capstone", "--cpu", "8", "--moe", "--zero", "1"],
     "--zero 1 reparte el estado replicado del optimizador; con --moe usa --zero 0"),
    (["capstone", "--cpu", "8", "--schedule", "foo"],  # a ScheduleError's texts, carried over
     "planificación desconocida 'foo'; elige una de gpipe, 1f1b, interleaved"),
    (["capstone", "--cpu", "8", "--dp", "x"], "argumento --dp: 'x' no es un número entero"),
    (["capstone", "--cpu", "8", "--zero", "2"], "argumento --zero: opción no válida: 2 (elige entre 0, 1)"),
    (["capstone", "--cpu", "8", "--heads", "3"], "hidden 32 no es divisible entre heads 3"),
    (["lesson7", "--cpu", "4", "--tp", "3"],
     "--tp 3 × --pp 1 = 3 ranks, pero esta ejecución tiene 4 (iníciala con --cpu 3 o --gpus 3)"),
    (["lesson7", "--cpu", "4", "--tp", "0"], "--tp debe ser ≥ 1, no 0"),
    (["lesson7", "--cpu", "4", "--pp", "x"], "--pp debe ser un número entero, no 'x'"),
    (["experts", "--cpu", "4", "--ep", "3"], "--ep 3 no divide los 4 ranks"),
    (["experts", "--cpu", "4", "--capacity-factor", "0"], "--capacity-factor debe ser un número finito positivo, no 0.0"),
    (["experts", "--cpu", "4", "--aux-alpha", "-1"], "--aux-alpha debe ser un número finito, 0 o más, no -1.0"),
    (["experts", "--cpu", "4", "--bias-balance", "inf"], "--bias-balance debe ser un número finito, 0 o más, no inf"),
    (["lesson5", "--cpu", "4", "--microbatches", "x"], "argumento --microbatches/-m: 'x' no es un número entero"),
    (["lesson1", "--nnodes", "2"],
     "una ejecución en varios nodos necesita --master-addr HOST (la dirección del nodo 0)"),
    # the experiments' own usage errors, asked of one process that parses and checks the options as a
    # rank would (engine/experiment.py's check), not found by the ranks after the launch
    (["lesson2", "--cpu", "2", "--strategies", "foo"],
     "estrategias desconocidas ['foo']; elige entre ddp, zero1, zero2, zero3, fsdp2"),
    (["lesson3", "--cpu", "2", "--kill-rank", "5"], "--kill-rank 5: esta ejecución tiene los ranks 0..1"),
    (["lesson4", "--cpu", "2", "--modes", "foo"], "modo desconocido 'foo'; elige entre tp, tp+sp"),
    (["lesson6", "--cpu", "2", "--slow-rank", "7"], "--slow-rank debe ser un rank de esta ejecución (0…1), no 7"),
    (["lesson7", "--cpu", "2", "--skip", "foo"], "--skip: parte desconocida 'foo'"),
    (["context", "--cpu", "2", "--cp", "3"], "--cp 3 no divide los 2 ranks"),
    (["experts", "--cpu", "2", "--dropless", "--capacity-factor", "2"],
     "argumento --capacity-factor: no se puede usar junto con --dropless"),
    (["context", "--cpu", "2", "--seq", "7"],
     "--seq: la disposición en zigzag necesita que 2·cp = 4 divida la longitud de secuencia 7"),
    (["context", "--cpu", "2", "--memory-seqs", "8,x"],
     "--memory-seqs: '8,x' no es una lista de números enteros separados por comas"),
    (["lesson1", "--cpu", "2", "--sweep-min", "64MiB", "--sweep-max", "1KiB"],
     "hace falta 4 bytes <= --sweep-min <= --sweep-max"),
    (["lesson1", "--cpu", "2", "--lr", "inf"], "--lr debe ser un número finito, no inf"),
    (["lesson1", "--cpu", "2", "--run-dir", "/proc/nope"],
     "no se puede crear la carpeta de la ejecución /proc/nope: esa carpeta no deja crear nada en ella"),  # /proc is there: it refuses
    (["lesson5", "--cpu", "2", "--pp", "3"], "el experimento de lesson5 no acepta --pp 3 (sus opciones: --chunks, "
     "--heads, --hidden, --layers, --lr, --microbatch-size, --microbatches, --no-torch, --schedules, --seed, --seq, "
     "--slow-ms, --slow-stage, --steps, --vocab)"),
]


@pytest.fixture
def learner(monkeypatch, tmp_path):
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))

    def run(argv: list[str], lang: str, capsys) -> tuple[int, list[str]]:
        monkeypatch.setenv("DISTAI_LANG", lang)
        code = main(["run", *argv])
        return code, capsys.readouterr().err.splitlines()
    return run


@pytest.mark.parametrize("argv,spanish", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_run_refuses_before_the_launch_in_spanish(learner, capsys, tmp_path, argv, spanish):
    code, lines = learner(argv, "es", capsys)
    assert code == 2
    assert lines == [f"distai: error: {spanish}"]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing launched


@pytest.mark.parametrize("argv,english", [
    (["capstone", "--cpu", "8", "--dp", "3"],
     "dp·tp·pp = 3·2·2 = 12 does not match the 8 ranks; run with --cpu 12 (or --gpus 12) or change the degrees"),
    (["capstone", "--cpu", "8", "--dp", "x"], "argument --dp: invalid int value: 'x'"),
    # no abbreviations: --m is no option (argparse guessed among --moe, --microbatches, --microbatch-size)
    (["capstone", "--cpu", "8", "--m", "3"],
     "capstone's experiment does not take --m 3 (its options: --microbatch-size, --microbatches, --moe)"),
    (["lesson7", "--cpu", "4", "--heads", "3"], "hidden 128 is not divisible by heads 3"),
])
def test_the_english_lines_are_unchanged(learner, capsys, argv, english):
    code, lines = learner(argv, "en", capsys)
    assert (code, lines) == (2, [f"distai: error: {english}"])


def test_an_unknown_option_names_the_nearest_options_in_every_language():
    options = ["--help", "--microbatches", "--microbatch-size", "--schedule", "-m"]
    texts = unknown_option_texts("unrecognized arguments: --micro 2", options, "capstone")
    assert texts == {"en": "capstone's experiment does not take --micro 2 (its options: --microbatch-size, --microbatches)",
                     "es": "el experimento de capstone no acepta --micro 2 (sus opciones: --microbatch-size, "
                           "--microbatches)"}
    assert unknown_option_texts("unrecognized arguments: --sched x", options, "x")["en"].endswith("(its options: --schedule)")
    # nothing near: every long option but --help
    assert unknown_option_texts("unrecognized arguments: --zz", options, "x")["en"].endswith(
        "(its options: --microbatches, --microbatch-size, --schedule)")
    assert unknown_option_texts("argument --x: expected one argument", options, "x") == {}


def test_an_argparse_message_it_does_not_know_stays_english():
    assert argparse_texts("argument --x: expected 2 arguments") == {}
    assert argparse_texts("the following arguments are required: --x")["es"] == "faltan argumentos obligatorios: --x"
    assert argparse_texts("argument --x: invalid parse_size value: 'q'")["es"] == "argumento --x: valor parse_size no válido: 'q'"
    assert argparse_texts("unrecognized arguments: --foo")["es"] == "argumentos no reconocidos: --foo"


def test_an_unknown_lang_is_refused_in_the_environments_language(learner, capsys):
    code, lines = learner(["lesson1", "--lang", "fr"], "es", capsys)
    assert (code, lines) == (2, ["distai: error: idioma desconocido 'fr'; elige uno de en, es"])
    code, lines = learner(["lesson1", "--lang", "fr"], "en", capsys)
    assert (code, lines) == (2, ["distai: error: unknown language 'fr'; choose one of en, es"])


def test_calc_plan_calibrate_refuses_the_capstone_run_in_spanish(monkeypatch, capsys, tmp_path):
    """The capstone plan ``distai calc plan --calibrate`` measures is refused before measuring, in Spanish."""
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    monkeypatch.setenv("DISTAI_LANG", "es")
    code = main(["calc", "plan", "--calibrate", "--dp", "3", "--global-batch", "7"])
    lines = capsys.readouterr().err.splitlines()
    assert (code, lines) == (2, ["distai: error: la ejecución del proyecto final no puede con esto: "
                                 "--global-batch 7 no se reparte en dp·microlote = 3·2"])


def test_why_a_run_ended_reads_in_the_learners_language():
    """The reasons a record keeps in English (the launcher's stop, torchrun's failure, a killed launcher)
    read back unchanged in English and translated in Spanish, where `runs` and the final view show them."""
    from distai.engine.runs import reason_text

    cases = {"interrupted (Ctrl-C)": "interrupción con Ctrl-C",
             "stopped by SIGTERM": "señal SIGTERM",
             "the launcher was killed at step 72/100": "el lanzador murió en el paso 72/100",
             "rank 0 exited with code 2": "el rank 0 salió con el código 2",
             "rank 1 was killed by SIGKILL": "el rank 1 murió por SIGKILL",
             "rank 1 failed: OverflowError: x": "el rank 1 falló: OverflowError: x",
             "rank 1 did not arrive at barrier 'after-train' within 3 s (hung or too slow)":
                 "el rank 1 no llegó a la barrera «after-train» en 3 s (colgado o demasiado lento)",
             "ranks 1, 2 did not arrive within 2.5 s (hung or too slow)":
                 "los ranks 1, 2 no llegaron en 2,5 s (colgados o demasiado lentos)"}
    for english, spanish in cases.items():
        assert reason_text(english, "en") == english and reason_text(english, "es") == spanish
    assert reason_text("a reason of another shape", "es") == "a reason of another shape"


def test_the_phases_a_run_announces_read_in_the_learners_language():
    """The panel printed "fase gpipe: ours and torch.distributed.pipelining" in Spanish: every phase name the
    experiments announce has a translation, and the composed ones translate their known part."""
    import re
    from pathlib import Path

    from distai.engine.runs import phase_text
    from distai.lessons.strings import strings

    source = "\n".join(p.read_text() for p in (Path(__file__).parents[1] / "engine" / "experiments").glob("*.py"))
    named = set(re.findall(r'(?:PHASE\.emit\([^{]*|phase\(ctx, ){"name": "([^"]+)"', source))
    assert {"train", "sweep", "prefix sharing", "single-process reference"} <= named
    assert named <= set(strings("run", "es")["phases"]), named - set(strings("run", "es")["phases"])
    assert phase_text("gpipe: ours and torch.distributed.pipelining", "es") == "gpipe: la nuestra y torch.distributed.pipelining"
    assert phase_text("mesh run: pp=2 × dp=2 × tp=2, 1f1b", "es") == "ejecución de la malla: pp=2 × dp=2 × tp=2, 1f1b"
    assert phase_text("MoE: 8 experts over EP = 4 (× DP = 2)", "es") == "MoE: 8 expertos sobre EP = 4 (× DP = 2)"
    assert phase_text("zero1", "es") == "zero1"  # a strategy's own name


def test_too_old_a_torch_is_one_line_before_anything_starts(monkeypatch, capsys):
    """An audit ran every lesson on torch 2.4 to 2.15: on 2.6 and 2.7 lesson 5 hung two minutes in torch's own
    schedule, and older ones failed in a rank's traceback. distai run refuses at once, in the learner's language."""
    import importlib.metadata

    from distai.engine import launcher as L
    from distai.tutor.cli import main

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.6.0+cu124" if name == "torch" else real(name))
    assert main(["run", "lesson5", "--lang", "es"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "necesitan torch 2.8 o posterior, y este Python tiene torch 2.6.0+cu124" in err
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.8.0" if name == "torch" else real(name))
    L.check_torch_version()  # the floor itself is enough
    assert L.MIN_TORCH == (2, 8)
