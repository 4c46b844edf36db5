"""The lessons, discovered from their folders.

Each ``lessons/lessonN/`` folder is a lesson's whole story: ``lesson.toml`` (ids, titles,
step outline, wiring to a visualizer, calculators and an experiment), Markdown per language
in ``en/`` and ``es/`` (one file per step key), and its models and quiz generators as Python
modules. Adding a lesson means adding a folder. Nothing here imports torch or Textual.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from .calculator import Calculator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LANGUAGES = ("en", "es")


class UnknownLessonError(ValueError):
    """A lesson name that matches no lesson; its message lists the valid names."""


@dataclass(frozen=True)
class Step:
    key: str
    title: dict[str, str]
    visualizer: str | None = None
    calc: str | None = None
    code: str | None = None  # "module:qualname" of the engine function this step shows
    experiment: bool = False


@dataclass(frozen=True)
class Lesson:
    id: str
    number: int
    slug: str
    duration_min: int
    title: dict[str, str]
    summary: dict[str, str]
    steps: tuple[Step, ...]
    package: str
    visualizer: str | None = None
    experiment: str | None = None
    ranks: int = 4  # processes (GPUs) the experiment uses by default
    max_restarts: int = 0  # restarts after a failure (torchrun --max-restarts, then relaunches)
    calculators: tuple[str, ...] = ()  # the calculators its steps use (its own or another lesson's)
    calculator_modules: tuple[str, ...] = ()  # its own: the ``calc_<name>.py`` modules in its folder
    references: tuple[str, ...] = field(default_factory=tuple)

    def step_text(self, key: str, lang: str) -> str:
        """The Markdown of one step in ``lang`` (``en`` or ``es``)."""
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; choose one of {', '.join(LANGUAGES)}")
        return resources.files(self.package).joinpath(lang, f"{key}.md").read_text(encoding="utf-8")

    def has_step_text(self, key: str, lang: str) -> bool:
        return resources.files(self.package).joinpath(lang, f"{key}.md").is_file()

    def step_index(self, key: str) -> int:
        return [s.key for s in self.steps].index(key)

    def own_calculators(self) -> tuple[Calculator, ...]:
        """The calculators this lesson declares (``calc_<name>.py`` -> its ``CALCULATOR``)."""
        return tuple(importlib.import_module(m).CALCULATOR for m in self.calculator_modules)


def _parse(package: str, data: dict, files: list[str]) -> Lesson:
    steps = tuple(
        Step(
            key=s["key"],
            title=dict(s["title"]),
            visualizer=s.get("visualizer"),
            calc=s.get("calc"),
            code=s.get("code"),
            experiment=bool(s.get("experiment", False)),
        )
        for s in data["steps"]
    )
    return Lesson(
        id=data["id"],
        number=int(data["number"]),
        slug=data["slug"],
        duration_min=int(data["duration_min"]),
        title=dict(data["title"]),
        summary=dict(data["summary"]),
        steps=steps,
        package=package,
        visualizer=data.get("visualizer"),
        experiment=data.get("experiment"),
        ranks=int(data.get("ranks", 4)),
        max_restarts=int(data.get("max_restarts", 0)),
        calculators=tuple(data.get("calculators", ())),
        calculator_modules=tuple(f"{package}.{name[:-3]}" for name in sorted(files)
                                 if name.startswith("calc_") and name.endswith(".py")),
        references=tuple(r["text"] for r in data.get("references", ())),
    )


@lru_cache(maxsize=1)
def all_lessons() -> tuple[Lesson, ...]:
    """Every lesson folder that holds a ``lesson.toml``, ordered by lesson number."""
    root = resources.files(__package__)
    found = []
    for entry in root.iterdir():
        toml = entry.joinpath("lesson.toml")
        if entry.is_dir() and toml.is_file():
            data = tomllib.loads(toml.read_text(encoding="utf-8"))
            files = [f.name for f in entry.iterdir()]
            found.append(_parse(f"{__package__}.{entry.name}", data, files))
    return tuple(sorted(found, key=lambda lesson: lesson.number))


@lru_cache(maxsize=1)
def all_calculators() -> dict[str, Calculator]:
    """Every lesson's own calculators by name, in lesson order (``distai calc NAME``)."""
    found: dict[str, Calculator] = {}
    for lesson in all_lessons():
        for calc in lesson.own_calculators():
            if calc.name in found:
                raise ValueError(f"two lessons declare the calculator {calc.name!r}")
            found[calc.name] = calc
    return found


def valid_names() -> list[str]:
    return [f"{lesson.id} ({lesson.number}, {lesson.slug})" for lesson in all_lessons()]


def resolve_lesson(name: str | int) -> Lesson:
    """Accepts ``lesson3``, ``3`` or the slug (``fault-tolerance``)."""
    wanted = str(name).strip().lower()
    for lesson in all_lessons():
        if wanted in (lesson.id, str(lesson.number), lesson.slug):
            return lesson
    raise UnknownLessonError(f"unknown lesson {str(name)!r}; valid lessons: {', '.join(valid_names())}")
