"""The lesson is the registry: every piece a lesson has is declared in its folder and discovered.

A lesson that lacks a piece, or names one that does not exist, fails here; CONTRIBUTING.md's
"new lesson" checklist lists the same pieces.
"""
from __future__ import annotations

import pytest
import tomllib

from distai.lessons.calculator import Calculator
from distai.lessons.registry import all_calculators, all_lessons

LESSONS = all_lessons()
# a visualizer still being written (the tutor shows a placeholder meanwhile): lesson id -> its module;
# the test fails once it exists, so the entry goes when it lands
PENDING_VISUALIZERS: dict[str, str] = {}


def test_calculators_are_declared_where_their_lesson_lives():
    names = all_calculators()
    for lesson in LESSONS:
        for module, calc in zip(lesson.calculator_modules, lesson.own_calculators()):
            assert isinstance(calc, Calculator)
            assert module == f"{lesson.package}.calc_{calc.name.replace('-', '_')}", module
            assert names[calc.name] is calc
            assert calc.help("en").strip() and "JSON keys" in calc.help("en"), calc.name
        used = set(lesson.calculators) | {s.calc for s in lesson.steps if s.calc}
        assert used <= set(names), f"{lesson.id} uses calculators no lesson declares: {used - set(names)}"


def test_every_calculator_is_a_calc_command():
    from distai.tutor.cli import calc_app

    commands = {c.name for c in calc_app.registered_commands}
    assert commands == set(all_calculators())


@pytest.mark.parametrize("name", sorted(all_calculators()))
def test_each_option_default_parses(name):
    calc = all_calculators()[name]
    for option in calc.options:
        if isinstance(option.default, str):
            option.parse(option.default)  # a default the parser rejects would fail every call


# --------------------------------------------------------------------------------------------
# Every piece of every lesson (CONTRIBUTING.md, "A new lesson", lists the same).
@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.id for lesson in LESSONS])
def test_lesson_has_every_piece(lesson):
    import importlib
    from importlib import resources

    from distai.lessons.registry import LANGUAGES, RUN_PANELS, RUN_SUMMARIES
    from distai.visualizers.base import LessonVisualizer, visualizer_class

    folder = resources.files(lesson.package)
    # lesson.toml: ids, titles in both languages, steps with unique keys
    assert lesson.id and lesson.slug and lesson.duration_min > 0
    for text in (lesson.title, lesson.summary, *(s.title for s in lesson.steps)):
        assert set(text) == set(LANGUAGES), text
    keys = [s.key for s in lesson.steps]
    assert keys and len(keys) == len(set(keys))
    # the step texts (their content is checked by test_lesson_texts.py)
    for key in keys:
        for lang in LANGUAGES:
            assert lesson.has_step_text(key, lang), f"{lesson.id}: missing {lang}/{key}.md"
    # formulas and quiz kinds
    assert folder.joinpath("formulas.py").is_file()
    kinds = lesson.quiz_kinds()
    assert kinds and all(callable(g) for g in importlib.import_module(f"{lesson.package}.quiz").GENERATORS.values())
    # its visualizer, and the visualizers its steps switch to
    for name in {lesson.visualizer, *(s.visualizer for s in lesson.steps)} - {None}:
        cls = visualizer_class(name)
        if PENDING_VISUALIZERS.get(lesson.id) == name:
            assert cls is None, f"visualizers/{name}.py landed: remove it from PENDING_VISUALIZERS"
            continue
        assert cls is not None and issubclass(cls, LessonVisualizer), f"{lesson.id}: no visualizer {name!r}"
    # its experiment (it may land after the lesson: `distai run` then says "not yet available"), and how
    # a run of it is shown
    assert lesson.experiment and lesson.experiment.startswith("distai.engine.experiments."), lesson.experiment
    toml = tomllib.loads(folder.joinpath("lesson.toml").read_text(encoding="utf-8"))
    assert "run" in toml, f"{lesson.id}: lesson.toml declares no [run] (how a run of its experiment is shown)"
    run = lesson.run
    assert set(run.panel) <= set(RUN_PANELS) and run.summary in RUN_SUMMARIES
    if run.terminal:
        view = lesson.terminal_view("es")
        view.feed({"kind": "run_start", "run_id": "x"})
        assert isinstance(view.renderables(80), list)
    if run.fold:  # a pure module of the lesson's folder (test_import_rules.py keeps lessons/ free of UI)
        fold = lesson.fold_class()
        assert fold.__module__.startswith(lesson.package + ".")
        fold().feed({"kind": "run_start", "run_id": "x"})
    if run.launch_plan:
        assert callable(lesson.launch_plan_function())


def test_lessons_are_numbered_in_order_and_resolvable():
    from distai.lessons.registry import resolve_lesson

    assert [lesson.number for lesson in LESSONS] == list(range(1, len(LESSONS) + 1))
    for lesson in LESSONS:
        assert resolve_lesson(lesson.id) == resolve_lesson(str(lesson.number)) == resolve_lesson(lesson.slug)
        assert resolve_lesson(f"lesson{lesson.number}") == lesson  # the help's "lessonN", lesson8-10 too


def test_a_lesson_without_a_number_comes_after_the_numbered_ones(tmp_path, monkeypatch):
    """The capstone may leave out ``number``: it is ordered, and numbered, after the last lesson."""
    from distai.lessons import registry

    data = {"id": "zz-capstone", "slug": "zz", "duration_min": 1, "title": {"en": "Z", "es": "Z"},
            "summary": {"en": "z", "es": "z"}, "steps": [{"key": "a", "title": {"en": "A", "es": "A"}}]}
    unnumbered = registry._parse("distai.lessons.zz_capstone", data, [])
    assert not unnumbered.numbered
    numbered = [registry._parse(f"distai.lessons.l{i}", dict(data, id=f"l{i}", number=i), []) for i in (2, 1)]
    monkeypatch.setattr(registry, "_found_lessons", lambda: [unnumbered, *numbered])
    registry.all_lessons.cache_clear()
    try:
        assert [(lesson.id, lesson.number) for lesson in registry.all_lessons()] == [
            ("l1", 1), ("l2", 2), ("zz-capstone", 3)]
    finally:
        registry.all_lessons.cache_clear()


def test_the_tutors_run_options_are_a_run_the_experiment_plans_on_the_lessons_ranks():
    """The capstone's r ran the 3D mesh while its text described the 5D one: [run] args are what the text
    runs, and the experiment's own plan takes them on the lesson's rank count."""
    from distai.lessons.registry import resolve_lesson

    capstone = resolve_lesson("capstone")
    assert "--cp" in capstone.run.args and "--moe" in capstone.run.args
    assert capstone.launch_plan_function()(list(capstone.run.args), None, capstone.ranks, False) == capstone.ranks
    text = capstone.step_text("run-it", "en")
    assert "distai run capstone --cpu 8 " + " ".join(capstone.run.args) in text
