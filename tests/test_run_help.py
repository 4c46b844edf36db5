"""`distai run LESSON -- --help` in the learner's language: every experiment's options, description and groups
have their text in ``lessons/catalog/run_help.toml`` in English and Spanish, the help prints them with the
defaults in the language's number format, and the catalog keeps no text for an option that is gone."""
from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Mapping

import pytest

from distai.lessons.arg_help import AREA, COMMON, ExperimentParser, default_text, option_help, option_text
from distai.lessons.registry import all_lessons
from distai.lessons.strings import LANG_ENV, LANGUAGES, strings

EXPERIMENTS = sorted(lesson.experiment for lesson in all_lessons() if lesson.experiment)
NOT_OPTIONS = ("description", "groups")


def _parser(module: str) -> ExperimentParser:
    parser = importlib.import_module(module).build_parser()
    assert isinstance(parser, ExperimentParser), module
    return parser


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]


@pytest.fixture(scope="module")
def parsers() -> dict[str, ExperimentParser]:
    return {module: _parser(module) for module in EXPERIMENTS}


def test_every_lesson_with_an_experiment_is_checked():
    assert len(EXPERIMENTS) >= 10 and "distai.engine.experiments.capstone" in EXPERIMENTS


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_option_description_and_group_has_its_text(parsers, lang):
    missing = []
    for module, parser in parsers.items():
        own = strings(AREA, lang).get(parser.experiment, {})
        if "description" not in own:
            missing.append(f"{parser.experiment}.description")
        missing += [f"{parser.experiment}.{a.dest}" for a in _options(parser)
                    if option_text(parser.experiment, a.dest, lang) is None]
        titles = own.get("groups", {})
        missing += [f"{parser.experiment}.groups.{g.title}" for g in parser._action_groups
                    if g not in (parser._optionals, parser._positionals) and g.title not in titles]
    assert not missing


def test_the_catalog_holds_no_text_for_an_option_that_is_gone(parsers):
    table = strings(AREA, "en")
    dests = {p.experiment: {a.dest for a in _options(p)} for p in parsers.values()}
    stale = [f"{name}.{key}" for name, keys in dests.items() for key in table.get(name, {})
             if key not in NOT_OPTIONS and key not in keys]
    sections = {k for k, v in table.items() if isinstance(v, Mapping)} - {COMMON, "metavar"}
    used_common = {a.dest for p in parsers.values() for a in _options(p)
                   if not isinstance(table.get(p.experiment, {}).get(a.dest), str)}
    assert not stale and sections == set(dests)
    assert set(table[COMMON]) <= used_common, set(table[COMMON]) - used_common


def test_spanish_help_is_spanish_with_its_defaults_in_spanish_numbers(parsers, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    for parser in parsers.values():
        monkeypatch.setenv(LANG_ENV, "es")
        text = " ".join(parser.format_help().split())  # argparse wraps lines: compare words
        assert text.startswith(f"uso: distai run {parser.experiment}") and " opciones: " in text
        assert "-h, --help muestra esta ayuda y termina" in text
        assert " ".join(strings(AREA, "es")[parser.experiment]["description"].split()) in text
        for action in _options(parser):
            spanish = option_help(parser, action, "es")
            english = option_help(parser, action, "en")
            assert "{" not in spanish + english, (parser.experiment, action.dest)  # every field filled
            assert " ".join(spanish.split()) in text, (parser.experiment, action.dest)
            said = default_text(action.default, "es")
            if said is not None:
                assert spanish.endswith(f"(por defecto: {said})"), (parser.experiment, action.dest)
            own = option_text(parser.experiment, action.dest, "en")
            if own != option_text(parser.experiment, action.dest, "es") and len(own or "") > 12:
                assert " ".join(english.split()) not in text, (parser.experiment, action.dest)
        monkeypatch.setenv(LANG_ENV, "en")
        english_text = " ".join(parser.format_help().split())
        assert english_text.startswith(f"usage: distai run {parser.experiment}") and " options: " in english_text


def test_defaults_are_said_in_the_languages_number_format():
    assert default_text(0.1, "es") == "0,1" and default_text(0.1, "en") == "0.1"
    assert default_text(65536.0, "es") == "65536" and default_text(262144, "es") == "262.144"
    assert default_text(None, "en") is None and default_text(False, "es") is None and default_text([], "en") is None
    assert default_text("1KiB", "es") == "1KiB"  # a value as it is typed


def test_a_value_s_name_is_the_language_s_and_a_flag_never_breaks_across_lines(monkeypatch):
    monkeypatch.setenv(LANG_ENV, "es")
    monkeypatch.setenv("COLUMNS", "60")
    text = _parser("distai.engine.experiments.lesson1").format_help()
    assert "--sweep-min TAMAÑO" in text and "--steps N" in text and "--lr X" in text and "STEPS" not in text
    assert "--sweep-\n" not in text and not any(line.rstrip().endswith("-") for line in text.splitlines())
    parser = _parser("distai.engine.experiments.lesson1")  # one parser, two languages: the value names follow
    monkeypatch.setenv(LANG_ENV, "es")
    assert "--sweep-min TAMAÑO" in parser.format_help()
    monkeypatch.setenv(LANG_ENV, "en")
    assert "--sweep-min SIZE" in parser.format_help() and "TAMAÑO" not in parser.format_help()
    assert "--slow-stage K" in _parser("distai.engine.experiments.lesson5").format_help()  # the code's own name


def test_capstone_help_through_the_cli_is_in_the_language_asked_and_leaves_the_environment(capsys, tmp_path,
                                                                                             monkeypatch):
    """The capstone reads its options inside the run (its plan needs the world size) but parses them up front
    too, so its help comes from its own process like every experiment's, in the --lang given."""
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    monkeypatch.delenv(LANG_ENV, raising=False)
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    from distai.tutor.cli import main

    assert main(["run", "capstone", "--lang", "es", "--", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("uso: distai run capstone") and "grado de paralelismo de datos" in out
    assert LANG_ENV not in os.environ


def test_a_default_that_lives_in_the_code_is_said_from_it(monkeypatch):
    """Texts whose default depends on the machine take its values from the code (help_fields): lesson 5's and the
    capstone's GPT on CPU and GPU, their microbatch, lesson 1's ring pieces."""
    from distai.engine import mesh_args
    from distai.engine.experiments import lesson5

    five = _parser("distai.engine.experiments.lesson5")
    hidden = next(a for a in five._actions if a.dest == "hidden")
    assert option_help(five, hidden, "en") == (f"hidden size h (default: {lesson5.MODEL_CPU.hidden} on CPU, "
                                               f"{lesson5.MODEL_GPU.hidden} on GPU)")
    capstone = _parser("distai.engine.experiments.capstone")
    size = next(a for a in capstone._actions if a.dest == "microbatch_size")
    assert option_help(capstone, size, "es") == (f"secuencias por microlote (por defecto: {mesh_args.MICROBATCH_CPU} "
                                                 f"en CPU, {mesh_args.MICROBATCH_GPU} en GPU)")
    one = _parser("distai.engine.experiments.lesson1")
    pieces = next(a for a in one._actions if a.dest == "pieces")
    assert "8 MiB" in option_help(one, pieces, "en") and "4 MiB" in option_help(one, pieces, "es")


def test_an_experiments_help_printed_by_its_own_process_follows_the_runs_language(capsys, tmp_path, monkeypatch):
    """`distai run lesson3 --lang es -- --help`: the experiment parses --help in a process of its own, which
    reads the language from DISTAI_LANG as the ranks do."""
    monkeypatch.setenv("DISTAI_HOME", str(tmp_path))
    monkeypatch.delenv(LANG_ENV, raising=False)
    monkeypatch.setenv("LANG", "en_US.UTF-8")
    from distai.tutor.cli import main

    assert main(["run", "lesson3", "--lang", "es", "--", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("uso: distai run lesson3") and "--ckpt-dir CARPETA" in out and "por defecto: 0,01" in out
