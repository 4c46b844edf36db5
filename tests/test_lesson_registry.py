"""The lesson is the registry: every piece a lesson has is declared in its folder and discovered.

A lesson that lacks a piece, or names one that does not exist, fails here; CONTRIBUTING.md's
"new lesson" checklist lists the same pieces.
"""
from __future__ import annotations

import pytest

from distai.lessons.calculator import Calculator
from distai.lessons.registry import all_calculators, all_lessons

LESSONS = all_lessons()


def test_calculators_are_declared_where_their_lesson_lives():
    names = all_calculators()
    for lesson in LESSONS:
        for module, calc in zip(lesson.calculator_modules, lesson.own_calculators()):
            assert isinstance(calc, Calculator)
            assert module == f"{lesson.package}.calc_{calc.name.replace('-', '_')}", module
            assert names[calc.name] is calc
            assert calc.help.strip() and "JSON keys" in calc.help, calc.name
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
