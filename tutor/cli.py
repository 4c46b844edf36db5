"""The ``distai`` command line (Typer).

Start-up stays light: ``distai --help`` and ``distai tutor`` must not import torch, and heavy
modules (Textual, numpy, the engine) are imported inside the commands that use them.
"""
from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from distai.lessons.registry import UnknownLessonError, all_lessons, resolve_lesson

app = typer.Typer(
    name="distai",
    help="A terminal tutor and live laboratory for distributed AI.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
calc_app = typer.Typer(help="Calculators for the lessons' formulas (memory, bubble, all-reduce, …).",
                       no_args_is_help=True)
app.add_typer(calc_app, name="calc")

USAGE_ERROR = 2


class CliError(Exception):
    """An error the learner caused: printed as one line, exit code 2 unless told otherwise."""

    def __init__(self, message: str, code: int = USAGE_ERROR):
        super().__init__(message)
        self.code = code


def lesson_or_fail(name: str):
    try:
        return resolve_lesson(name)
    except UnknownLessonError as exc:
        raise CliError(str(exc)) from None


def not_yet_available(what: str) -> None:
    raise CliError(f"{what} is not yet available in this version of distai")


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"distai {version('distai')}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """A terminal tutor and live laboratory for distributed AI."""
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@app.command()
def tutor(
    lesson: Optional[str] = typer.Option(None, "--lesson", "-l", help="Open this lesson (1-7, lessonN or its slug)."),
    lang: Optional[str] = typer.Option(None, "--lang", help="Language: en or es (default: from the locale)."),
) -> None:
    """Start the Textual tutor."""
    from distai.tutor.i18n import detect_language

    try:
        language = detect_language(lang)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    chosen = lesson_or_fail(lesson) if lesson else None
    from distai.tutor.app import DistaiApp

    DistaiApp(language=language, lesson_id=chosen.id if chosen else None).run()


@app.command()
def lessons(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    lang: Optional[str] = typer.Option(None, "--lang", help="Language: en or es."),
) -> None:
    """List the seven lessons with their duration and your progress."""
    from distai.tutor.i18n import detect_language

    try:
        language = detect_language(lang)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    rows = [
        {"id": l.id, "number": l.number, "slug": l.slug, "title": l.title[language],
         "duration_min": l.duration_min, "steps": len(l.steps)}
        for l in all_lessons()
    ]
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    for r in rows:
        typer.echo(f"{r['number']}. {r['title']} — {r['duration_min']} min ({r['slug']})")


@app.command()
def quiz(
    lesson: Optional[str] = typer.Argument(None, help="Lesson: 1-7, lessonN or its slug."),
    count: int = typer.Option(5, "--count", "-n", help="How many questions."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for reproducible questions."),
    review: bool = typer.Option(False, "--review", help="Ask the questions due for spaced review."),
    lang: Optional[str] = typer.Option(None, "--lang", help="Language: en or es."),
) -> None:
    """Quiz yourself on a lesson's formulas and ideas."""
    if lesson is not None:
        lesson_or_fail(lesson)
    not_yet_available("distai quiz")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    lesson: str = typer.Argument(..., help="Lesson: 1-7, lessonN or its slug."),
) -> None:
    """Launch the lesson's real torch.distributed experiment."""
    lesson_or_fail(lesson)
    not_yet_available("distai run")


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors and exit code 2 for bad input, never a traceback."""
    try:
        app(args=argv, standalone_mode=False)
    except CliError as exc:
        typer.echo(f"distai: error: {exc}", err=True)
        return exc.code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("distai: aborted", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo("distai: interrupted", err=True)
        return 130
    except Exception as exc:  # click usage errors and the like
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
