"""The lessons, discovered from their folders: the lesson is the registry.

Each folder under ``lessons/`` that holds a ``lesson.toml`` is a lesson's whole story:

- ``lesson.toml``: id, number (optional: a lesson without one, like the capstone, comes after
  the numbered ones), titles, the steps (key, titles, the visualizer and its settings for the
  step, the calculator and the engine code it shows), the experiment, and ``[run]``: how a run
  of the experiment is shown (:class:`RunView`);
- ``en/<step>.md`` and ``es/<step>.md``: the text of each step;
- ``formulas.py``: the formulas every number comes from;
- ``quiz.py``: ``GENERATORS``, the quiz's question kinds;
- ``calc_<name>.py``: the calculators it owns (``distai calc NAME``, see ``lessons/calculator.py``);
- the run-event fold its ``[run]`` table names (a pure module of the folder).

The tutor, the CLI and the tests find everything here; adding a lesson means adding a folder
(and its visualizer under ``visualizers/``). ``tests/test_lesson_registry.py`` fails when a lesson
lacks a piece. Nothing here imports torch or Textual.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources

from .calculator import Calculator
from .strings import LANGUAGES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


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
    view: dict = field(default_factory=dict)  # the visualizer's settings for this step (``view = {...}``)


# what the tutor's run panel can show beside the lesson's visualizer while a run goes
RUN_PANELS = ("loss", "sweep", "view")
# what the learner reads once the run has ended: rank 0's printed summary, or the lesson's own view
RUN_SUMMARIES = ("output", "view")


@dataclass(frozen=True)
class RunView:
    """How a run of the lesson's experiment is shown (``[run]`` in ``lesson.toml``).

    ``panel``: the run panel's charts, top to bottom: ``loss`` (the training loss), ``sweep``
    (lesson 1's bandwidth sweep), ``view`` (the lesson's own view of the run, ``terminal``).
    ``summary``: what the learner reads once the run ended: ``output`` (the log grows to show
    rank 0's printed summary) or ``view`` (the lesson's own view holds it).
    ``terminal``: ``"module:Class"`` in ``distai.visualizers`` drawing the run as text (``feed(event)``,
    ``renderables(width)``): under ``distai run``'s common view, and the run panel's ``view``.
    ``fold``: ``"module:Class"`` in the lesson's folder folding the run's events into what its
    views draw (pure: ``feed(event)``).
    ``launch_plan``: ``"module:function"`` (torch-free) for an experiment that sizes its own group from
    its options (the capstone: dp·tp·pp ranks), checked before anything is launched.
    ``args``: the experiment's options for the tutor's run key, the run the lesson's text describes
    (the capstone's 5D mesh); ``distai run`` takes them from the command line.
    """
    panel: tuple[str, ...] = ("loss",)
    summary: str = "output"
    terminal: str | None = None
    fold: str | None = None
    launch_plan: str | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lesson:
    id: str
    number: int  # from lesson.toml, or the next after the numbered lessons
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
    run: RunView = field(default_factory=RunView)
    numbered: bool = True  # False: no number in lesson.toml (ordered after the numbered lessons)
    aliases: tuple[str, ...] = ()  # its former slugs: still resolve, and progress saved under them is its own

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the lesson answers to but its number: its id, its slug and its former slugs."""
        return (self.id, self.slug, *self.aliases)

    def step_text(self, key: str, lang: str) -> str:
        """The Markdown of one step in ``lang`` (``en`` or ``es``)."""
        if lang not in LANGUAGES:
            raise ValueError(f"unknown language {lang!r}; choose one of {', '.join(LANGUAGES)}")
        return resources.files(self.package).joinpath(lang, f"{key}.md").read_text(encoding="utf-8")

    def has_step_text(self, key: str, lang: str) -> bool:
        return resources.files(self.package).joinpath(lang, f"{key}.md").is_file()

    def step_index(self, key: str) -> int:
        return [s.key for s in self.steps].index(key)

    def quiz_kinds(self) -> tuple[str, ...]:
        """The question kinds of its quiz (``quiz.py``'s ``GENERATORS``)."""
        return tuple(importlib.import_module(f"{self.package}.quiz").GENERATORS)

    def fold_class(self) -> type | None:
        """The class its ``[run] fold`` names, in the lesson's folder (None if it declares none)."""
        if not self.run.fold:
            return None
        module, name = self.run.fold.split(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), name)

    def launch_plan_function(self):
        """The function its ``[run] launch_plan`` names (None if it declares none): the lesson's
        check of its own group size, ``function(experiment_args, ranks_or_None, lesson_default,
        cuda) -> ranks``, raising ValueError; torch-free, called before anything is launched."""
        if not self.run.launch_plan:
            return None
        module, name = self.run.launch_plan.split(":")
        return getattr(importlib.import_module(module), name)

    def terminal_view(self, language: str = "en"):
        """A new instance of its ``[run] terminal`` view (None if it declares none). Imports Rich."""
        if not self.run.terminal:
            return None
        module, name = self.run.terminal.split(":")
        cls = getattr(importlib.import_module(f"distai.visualizers.{module}"), name)
        return cls(language=language)

    def own_calculators(self) -> tuple[Calculator, ...]:
        """The calculators this lesson declares (``calc_<name>.py`` -> its ``CALCULATOR``)."""
        return tuple(importlib.import_module(m).CALCULATOR for m in self.calculator_modules)


def _run_view(lesson_id: str, data: dict) -> RunView:
    view = RunView(panel=tuple(data.get("panel", RunView.panel)), summary=data.get("summary", RunView.summary),
                   terminal=data.get("terminal"), fold=data.get("fold"), launch_plan=data.get("launch_plan"),
                   args=tuple(str(a) for a in data.get("args", ())))
    unknown = [p for p in view.panel if p not in RUN_PANELS]
    if unknown or view.summary not in RUN_SUMMARIES:
        raise ValueError(f"{lesson_id}: [run] panel takes {RUN_PANELS} and summary one of {RUN_SUMMARIES}")
    if "view" in view.panel + (view.summary,) and not view.terminal:
        raise ValueError(f"{lesson_id}: [run] shows its view but names no terminal view")
    return view


def _parse(package: str, data: dict, files: list[str]) -> Lesson:
    steps = tuple(
        Step(
            key=s["key"],
            title=dict(s["title"]),
            visualizer=s.get("visualizer"),
            calc=s.get("calc"),
            code=s.get("code"),
            experiment=bool(s.get("experiment", False)),
            view=dict(s.get("view", {})),
        )
        for s in data["steps"]
    )
    return Lesson(
        id=data["id"],
        number=int(data.get("number", 0)),
        numbered="number" in data,
        slug=data["slug"],
        aliases=tuple(data.get("aliases", ())),
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
        run=_run_view(data["id"], data.get("run", {})),
    )


def _found_lessons() -> list[Lesson]:
    found = []
    for entry in resources.files(__package__).iterdir():
        toml = entry.joinpath("lesson.toml")
        if entry.is_dir() and toml.is_file():
            data = tomllib.loads(toml.read_text(encoding="utf-8"))
            files = [f.name for f in entry.iterdir()]
            found.append(_parse(f"{__package__}.{entry.name}", data, files))
    return found


@lru_cache(maxsize=1)
def all_lessons() -> tuple[Lesson, ...]:
    """Every lesson folder that holds a ``lesson.toml``: the numbered ones by number, then the others
    by folder name, numbered on from the last."""
    found = _found_lessons()
    numbered = sorted((lesson for lesson in found if lesson.numbered), key=lambda lesson: lesson.number)
    last = max((lesson.number for lesson in numbered), default=0)
    others = sorted((lesson for lesson in found if not lesson.numbered), key=lambda lesson: lesson.package)
    return tuple(numbered) + tuple(replace(lesson, number=last + i) for i, lesson in enumerate(others, 1))


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


def step_view(visualizer: str, step_key: str) -> dict:
    """What the step ``step_key`` asks of the visualizer ``visualizer`` (its ``view = {...}`` in
    ``lesson.toml``): ``{}`` when the step declares nothing or shows another visualizer."""
    return _step_views().get((visualizer.replace("-", "_"), step_key), {})


@lru_cache(maxsize=1)
def _step_views() -> dict[tuple[str, str], dict]:
    views: dict[tuple[str, str], dict] = {}
    for lesson in all_lessons():
        for step in lesson.steps:
            shown = step.visualizer or lesson.visualizer
            if shown and step.view:
                views[(shown.replace("-", "_"), step.key)] = step.view
    return views


def valid_names() -> list[str]:
    return [f"{lesson.id} ({lesson.number}, {lesson.slug})" for lesson in all_lessons()]


def resolve_lesson(name: str | int) -> Lesson:
    """Accepts ``lesson3``, ``3``, the slug (``fault-tolerance``), a former slug (``aliases``) or
    ``lessonN`` for a lesson whose id is a word (``lesson8``: experts), as the help says."""
    wanted = str(name).strip().lower()
    for lesson in all_lessons():
        if wanted in (str(lesson.number), f"lesson{lesson.number}", *lesson.names):
            return lesson
    raise UnknownLessonError(f"unknown lesson {str(name)!r}; valid lessons: {', '.join(valid_names())}")
