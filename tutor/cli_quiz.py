"""``distai quiz``: a lesson's quiz in the terminal, or the spaced review of what is due.

Answers are read line by line from standard input, so a quiz can be scripted:
``printf '1\\n2\\n' | distai quiz 1 --seed 3``. End of input ends the quiz gracefully (the answers
given so far are kept; the score of an unfinished quiz is not saved).

Imports only typer at module level: ``distai --help`` loads this module.
"""
from __future__ import annotations

import sys

import typer

from ..lessons.strings import strings, translated
from ..lessons.units import format_score
from .cli import (
    HELP,
    LESSON_HELP,
    CliError,
    app,
    lang_option,
    language_or_fail,
    lesson_or_fail,
    metavar,
    open_progress,
    terminal_columns,
)


def _read_line() -> str | None:
    """The next answer, without its line ending; None at the end of the input. A byte-order mark goes: answers
    written by a Windows editor into a file begin with one ("\ufeff20" could not be read as a number)."""
    line = sys.stdin.readline()
    if line == "":
        return None
    return line.rstrip("\r\n").lstrip("\ufeff")


def _given(q, check, text: str) -> str:
    """What the learner typed, as typed: a rounded echo of 125.9 as "126" would read as right."""
    if check.value is None:
        return repr(text)
    if q.is_choice:
        return str(check.value + 1)
    return text.strip()


def _say(text: str, hanging: int = 0, after: str = "") -> None:
    """A line of the quiz wrapped at the terminal's width, never between a number and its unit
    (``wrap_text``, the one rule); ``hanging``: where its wrapped lines start (under the text after a
    "Q1/5" or "2." mark); ``after``: what the line already holds (the answer's "> " prompt)."""
    from rich.text import Text

    from ..visualizers.ring_drawing import wrap_text

    for part in wrap_text(Text(after + text), terminal_columns(), hanging):
        typer.echo(part.plain[len(after):].rstrip() if after else part.plain.rstrip())
        after = ""


def run_quiz(questions, store, session_lesson, lang: str, header: str) -> int:
    """Ask ``questions`` on the terminal; returns the exit code (0)."""
    from .review import QuizSession

    T = strings("quiz_cli", lang)
    session = QuizSession(questions, store, session_lesson)
    _say(header)
    tips = [T["howto"]] if any(not q.is_choice for q in questions) else []
    if any(q.is_choice for q in questions):
        tips.append(T["howto_choice"])
    _say(" ".join(tips + [T["howto_end"]]))
    n = len(questions)
    eof = False
    while (q := session.current) is not None:
        typer.echo("")
        tol = "" if q.is_choice else " " + T["tolerance"].format(tol=q.tolerance_text())
        mark = f"{T['q'].format(i=session.index + 1, n=n)}  "
        _say(f"{mark}{q.prompt}{tol}", len(mark))
        for i, c in enumerate(q.choices):
            _say(f"  {i + 1}. {c}", len(f"  {i + 1}. "))
        while True:
            typer.echo(T["prompt"], nl=False)
            sys.stdout.flush()
            text = _read_line()
            if text is None:
                eof = True
                typer.echo("")
                break
            out = session.answer(text)
            if out.final:
                if out.correct:
                    _say(T["right"], 2, T["prompt"])
                elif not out.check.valid:
                    _say(T["unread"].format(msg=out.check.message, answer=q.answer_text()), 2, T["prompt"])
                else:
                    _say(T["wrong"].format(given=_given(q, out.check, text), answer=q.answer_text()), 2,
                         T["prompt"])
                _say(T["why"].format(text=q.explanation), 2)
                break
            _say(T["again"].format(msg=out.check.message), 2, T["prompt"])
        if eof:
            break
    typer.echo("")
    if session.finished:
        pct = format_score(session.correct / n if n else 0, lang)
        typer.echo(T["score"].format(c=session.correct, n=n, pct=pct))
        if session.saved:
            typer.echo(T["saved"])
    elif session.answered:
        typer.echo(T["ended"].format(a=session.answered, n=n))
    else:
        typer.echo(T["ended_none"])
    if session.unsaved is not None:  # the answers went on; what could not be saved is said once, at the end
        typer.echo(translated("cli", "progress.warning", lang, text=translated(
            "tutor", "progress_unsaved", lang, error=session.unsaved.text(lang))), err=True)
    return 0


@app.command("quiz", help=HELP["quiz"])
def quiz(
    lesson: str | None = typer.Argument(None, help=LESSON_HELP, metavar=metavar("lesson")),
    # read as text and checked here (a clear one-line error, exit 2); the help says what they take
    count: str = typer.Option("5", "--count", "-n", metavar=metavar("int"), help=HELP["quiz_count"]),
    seed: str | None = typer.Option(None, "--seed", metavar=metavar("int"), help=HELP["quiz_seed"]),
    review: bool = typer.Option(False, "--review", help=HELP["quiz_review"]),
    lang: str | None = lang_option(),
) -> None:
    """Quiz yourself on a lesson's formulas and ideas (the help text is the catalog's ``cli.quiz``)."""
    import random

    language = language_or_fail(lang)
    T = strings("quiz_cli", language)
    try:
        n = int(count)
    except ValueError:
        raise CliError(T["count_whole"].format(value=repr(count))) from None
    if not 1 <= n <= 100:
        raise CliError(T["count_range"].format(value=n))
    if seed is None:
        s = random.SystemRandom().randrange(10 ** 6)
    else:
        try:
            s = int(seed)
        except ValueError:
            raise CliError(T["seed_whole"].format(value=repr(seed))) from None
    chosen = lesson_or_fail(lesson, language) if lesson is not None else None
    if chosen is None and not review:
        raise CliError(T["need_lesson"])
    store = open_progress(language)
    try:
        if review or chosen is None:  # (no lesson without --review was refused above)
            from .review import next_due, review_items, review_questions

            questions = review_questions(store, n, language, s, lesson_id=chosen.id if chosen else None)
            if not questions:
                typer.echo(T["nothing_due"])
                upcoming = next_due(store, lesson_id=chosen.id if chosen else None)
                if upcoming is not None:
                    import time

                    from ..lessons.units import format_time

                    typer.echo(T["next_due"].format(when=format_time(upcoming.due_at - time.time(), 2, language),
                                                    lesson=upcoming.lesson_id, kind=upcoming.kind))
                elif not review_items(store):
                    typer.echo(T["no_history"])
                return
            run_quiz(questions, store, None, language, T["review_header"].format(n=len(questions), seed=s))
            return
        from ..lessons.quiz import build_quiz

        questions = build_quiz(chosen.id, n, s, language)
        title = f"{chosen.number}. {chosen.title[language]}"
        run_quiz(questions, store, chosen.id, language, T["header_one" if n == 1 else "header"].format(title=title, n=n, seed=s))
    finally:
        store.close()
