"""The ``distai`` command line (Typer).

Start-up stays light: ``distai --help`` and ``distai tutor`` must not import torch, and heavy
modules (Textual, numpy, the engine) are imported inside the commands that use them.
"""
from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import typer

from ..engine.durable import DISK_FULL
from ..lessons.registry import UnknownLessonError, all_lessons, resolve_lesson, valid_names
from ..lessons.strings import (
    FALLBACK,
    LANG_ENV,
    LANGUAGES,
    detect_language,
    os_error_text,
    strings,
    translated,
)
from ..lessons.units import format_score
from .entry import interrupted
from .paths import DataHomeError
from .progress import ProgressError


def output_gone(exc: OSError) -> bool:
    """Whether a write failed because nobody reads any more: the terminal closed (EIO) or the pipe's reader
    left (EPIPE)."""
    return exc.errno in (errno.EIO, errno.EPIPE)


def _help_language(argv: list[str]) -> str:
    """The language of the help texts: a ``--lang`` on the command line (Click answers ``--help``
    before it parses ``--lang``, so it is read here, in either order), else ``DISTAI_LANG``, else
    the locale. An unknown ``--lang`` is left to the command's own one-line error."""
    for i, arg in enumerate(argv):
        given = arg.partition("=")[2] if arg.startswith("--lang=") else (
            argv[i + 1] if arg == "--lang" and i + 1 < len(argv) else None)
        if given:
            try:
                return detect_language(given)
            except ValueError:
                break
    return detect_language()


#: the language of the help texts (``distai --help``, ``distai calc NAME --help``)
HELP_LANG = _help_language(sys.argv[1:])
HELP = strings("cli", HELP_LANG)

def _help_shows_no_python_types() -> None:
    """Typer's rich help writes a value's Python type beside it: ``<bool>`` beside a flag (``--json <bool>``),
    as if it took a value (``--json true`` is refused), and ``<str>`` beside an argument whose column already
    shows its metavar (``LESSON <str>``). A flag's row shows no type, as click's own help does, and an argument
    only its metavar (every option has one: :func:`metavar`)."""
    try:
        from typer.core import TyperArgument, TyperOption
    except ImportError:  # another Typer: its own help
        return
    hidden: list[tuple[type, Callable[[Any], bool]]] = [(TyperOption, lambda param: param.is_flag),
                                                         (TyperArgument, lambda param: param.metavar is not None)]
    for param_class, hides in hidden:
        shown = getattr(param_class, "display_type_rich", None)
        if shown is None or getattr(shown, "_distai", False):
            continue

        def display_type_rich(self, ctx, shown=shown, hides=hides):
            return None if hides(self) else shown(self, ctx)

        display_type_rich._distai = True  # type: ignore[attr-defined]
        param_class.display_type_rich = display_type_rich  # type: ignore[attr-defined]


_help_shows_no_python_types()

app = typer.Typer(
    name="distai",
    help=HELP["app"],
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
calc_app = typer.Typer(help=HELP["calc"], no_args_is_help=True)
app.add_typer(calc_app, name="calc")

USAGE_ERROR = 2


def lesson_numbers() -> str:
    """The lessons' numbers as the help names them (``1-8``), from the registry: it grows."""
    numbers = sorted(lesson.number for lesson in all_lessons())
    return f"{numbers[0]}-{numbers[-1]}"


def default_ranks_text() -> str:
    """The lessons' default ranks as ``--cpu``'s help says them: the most common, then the others by lesson
    ("4 (lessons 3, 6, 7: 2; lesson 10: 8)"), from the registry."""
    by_ranks: dict[int, list[int]] = {}
    for lesson in sorted(all_lessons(), key=lambda lesson: lesson.number):
        by_ranks.setdefault(lesson.ranks, []).append(lesson.number)
    common = max(by_ranks, key=lambda r: len(by_ranks[r]))
    others = [HELP["run_cpu_others"].format(n=len(numbers), numbers=", ".join(map(str, numbers)), ranks=r)
              for r, numbers in sorted(by_ranks.items()) if r != common]
    return f"{common} ({'; '.join(others)})" if others else str(common)


def metavar(kind: str) -> str:
    """What a help shows for an option's value of ``kind`` (``lessons/catalog/metavar.toml``: N, FOLDER,
    PORT …), in the help's language, where Typer would show its Python type (<int>, <str>)."""
    return str(strings("metavar", HELP_LANG)[kind])


LESSON_HELP = HELP["lesson"].format(numbers=lesson_numbers())
LANG_HELP = HELP["lang"]


def lang_option():
    """Every command's ``--lang`` (and ``distai --lang es <command>``'s): en or es, else DISTAI_LANG or the locale."""
    return typer.Option(None, "--lang", metavar="en|es", help=LANG_HELP)


class CliError(Exception):
    """An error the learner caused: printed as one line, exit code 2 unless told otherwise."""

    def __init__(self, message: str, code: int = USAGE_ERROR):
        super().__init__(message)
        self.code = code


def write_named_file(path: Path, text: str, replace: bool, exists: Callable[[], CliError]) -> bool:
    """Write ``text`` at ``path``, a file the learner named with ``-o``: a new or regular file through a temporary
    file and a rename (a reader never sees half of it; a link is followed, not replaced), an existing regular
    file only with ``replace`` (else ``exists()`` is raised); anything else that exists (a pipe, ``/dev/null``)
    written into as it is. True where a regular file was written (False: nothing of ours to ``chmod``)."""
    if path.exists() and not path.is_file():  # /dev/null, a FIFO
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return False
    if path.is_file() and not replace:  # it was overwritten without a word
        raise exists()
    target = path.resolve()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)  # a reader never sees half a file
    finally:
        tmp.unlink(missing_ok=True)
    return True


def write_failure_code(exc: OSError) -> int:
    """The exit status of a failed write to a path the learner named: 2 where the path is wrong (no such
    folder, a folder where the file goes: as ``runs export -o FOLDER`` refuses it), 1 where the machine refused
    it (a full disk, no permission), as for standard output."""
    return USAGE_ERROR if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR) else 1


def lesson_or_fail(name: str, lang: str = "en"):
    """The lesson ``name`` names; else a one-line error in ``lang`` listing the valid ones."""
    try:
        return resolve_lesson(name)
    except UnknownLessonError:
        raise CliError(translated("cli", "errors.unknown_lesson", lang, name=repr(str(name)),
                                  valid=", ".join(valid_names()))) from None


MIN_COLUMNS = 20  # what COLUMNS=0 or 1 (some CI systems set them) is written at: a narrower line is no line


def terminal_columns() -> int:
    """The columns a line of output may fill: the terminal's less one (a full line wraps in some
    terminals); piped output, 199 (lines and tables as they are)."""
    import shutil

    return max(MIN_COLUMNS, shutil.get_terminal_size((200, 24)).columns - 1)


def fit_prose(line: str, width: int) -> list[str]:
    """``line`` wrapped to ``width`` under its own indent plus two, never between a number and its unit
    (``wrap_text``, the one rule); a label's row (cells two spaces apart) keeps its cells whole and goes
    on under its second column (:func:`_row_lines`); a wider table's row is left whole."""
    body = line.lstrip(" ")
    if len(line) <= width:
        return [line]
    from rich.text import Text

    from ..visualizers.ring_drawing import wrap_indented

    if "  " in body.rstrip():
        return _row_lines(line, width)
    return [part.plain.rstrip() for part in wrap_indented(Text(body), width, len(line) - len(body), hanging=2)]


#: the most cells a row wrapped by :func:`_row_lines` has: a label, its value and two notes
LABEL_ROW_CELLS = 4


def _row_lines(row: str, width: int) -> list[str]:
    """A table's row too wide for ``width``: its cells (two spaces apart) in their columns as they fit;
    the last cell, where 20 columns are left for it, wrapped by words under its own column; any other
    cell on a line of its own under the second column ("  ring: sent per layer   1.48 GB  (…)" with
    "(7 + 15 messages fwd + bwd)" under "1.48 GB")."""
    import re

    from rich.text import Text

    from ..visualizers.ring_drawing import wrap_text

    cells = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", row)]
    if not 2 <= len(cells) <= LABEL_ROW_CELLS:  # a table of many columns is left whole: split, it reads as none
        return [row]
    column = cells[1][0]
    out: list[str] = []
    line = row[:cells[0][0] + len(cells[0][1])]

    def under(lead: str, cell: str) -> list[str]:  # the cell's words under the end of ``lead``
        parts = wrap_text(Text(cell), max(10, width - len(lead)))
        return [lead + parts[0].plain, *(" " * len(lead) + p.plain for p in parts[1:])]

    for i, (start, cell) in enumerate(cells[1:], 1):
        lead = line + " " * (start - len(line)) if not out else line + "  "  # the first line keeps its columns
        if len(lead + cell) <= width:
            line = lead + cell
            continue
        if i == len(cells) - 1 and width - len(lead) >= 20:
            out += under(lead, cell)
            return [x.rstrip() for x in out]
        out.append(line)
        wrapped = under(" " * column, cell)
        out += wrapped[:-1]
        line = wrapped[-1]
    out.append(line)
    return [x.rstrip() for x in out]


def language_or_fail(explicit: str | None) -> str:
    """``--lang`` (or the locale's language); an unknown one is a one-line error, in the language
    ``DISTAI_LANG`` or the locale gives. So is an unknown ``DISTAI_LANG`` when no ``--lang`` overrides it
    (a typo there would otherwise give English without a word)."""
    try:
        lang = detect_language(explicit)
    except ValueError:
        raise CliError(translated("cli", "errors.unknown_language", detect_language(None), value=repr(explicit),
                                  choices=", ".join(LANGUAGES))) from None
    chosen = os.environ.get(LANG_ENV, "").strip()
    if not explicit and chosen and chosen.lower() not in LANGUAGES:
        locale = detect_language(None, {k: v for k, v in os.environ.items() if k != LANG_ENV})
        raise CliError(translated("cli", "errors.unknown_language", locale, value=f"{LANG_ENV}={chosen!r}",
                                  choices=", ".join(LANGUAGES)))
    return lang


def open_progress(lang: str = "en"):
    """The progress store; a recovered (moved-aside) database is reported on stderr, once, in ``lang``."""
    from .progress import ProgressError, ProgressStore

    try:
        store = ProgressStore()
    except ProgressError as exc:
        raise CliError(exc.text(lang), code=1) from None
    warn_recovered(store, lang)
    return store


def warn_recovered(store, lang: str) -> None:
    """On stderr, that the progress database was unreadable and moved aside (nothing if it was not)."""
    if store.recovered_from:
        typer.echo(translated("cli", "progress.warning", lang, text=store.recovered_text(lang)), err=True)


def _version_callback(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"distai {version('distai')}")
        raise typer.Exit()


def adopt_language(explicit: str | None) -> None:
    """``--lang`` given before a command (``distai --lang es lessons``, ``distai calc --lang es …``):
    checked, then the language of every command after it (as ``DISTAI_LANG``)."""
    if explicit is not None:
        os.environ[LANG_ENV] = language_or_fail(explicit)


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version_callback, is_eager=True,
                                 help=HELP["version"]),
    lang: str | None = lang_option(),
) -> None:
    """A terminal tutor and live laboratory for distributed AI."""
    adopt_language(lang)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@calc_app.callback()
def calc_root(lang: str | None = lang_option()) -> None:
    adopt_language(lang)


@app.command(help=HELP["tutor"])
def tutor(
    lesson: str | None = typer.Option(None, "--lesson", "-l", metavar=metavar("lesson"),
                                      help=HELP["tutor_lesson"].format(numbers=lesson_numbers())),
    lang: str | None = lang_option(),
) -> None:
    """Start the Textual tutor."""
    language = language_or_fail(lang)
    chosen = lesson_or_fail(lesson, language) if lesson else None
    from .app import DistaiApp, NoTerminal

    tutor_app = DistaiApp(language=language, lesson_id=chosen.id if chosen else None)
    try:
        tutor_app.run()
    except NoTerminal:
        raise CliError(translated("cli", "errors.no_terminal", language)) from None
    if tutor_app.return_code:  # Textual printed what ended it; the shell must not read a crash as success
        raise typer.Exit(tutor_app.return_code)


@app.command(help=HELP["lessons"].format(n=len(all_lessons())))
def lessons(
    as_json: bool = typer.Option(False, "--json", help=HELP["lessons_json"]),
    lang: str | None = lang_option(),
) -> None:
    language = language_or_fail(lang)
    from .progress import lesson_mastery

    store = open_progress(language)
    summary = store.summary()
    for lesson_id, row in summary.items():
        row["mastery"] = lesson_mastery(store, lesson_id)
    store.close()
    rows = []
    for l in all_lessons():
        p = summary[l.id]
        rows.append({"id": l.id, "number": l.number, "slug": l.slug, "title": l.title[language],
                     "duration_min": l.duration_min, "steps": len(l.steps),
                     "steps_done": p["steps_done"], "steps_total": p["steps_total"],
                     "best_quiz": p["best_quiz"], "mastery": p["mastery"], "runs": p["runs"]})
    if as_json:
        typer.echo(json.dumps(rows, ensure_ascii=False, indent=2))
        return
    import textwrap

    head = strings("tutor", language)["progress_columns"]
    w = [max(len(head[i]), n) for i, n in ((1, 3), (2, 5), (3, 4), (4, 7), (5, 4))]  # the column's head fits
    number = max(len(str(r["number"])) for r in rows)  # lesson 10 keeps the columns in line
    columns = terminal_columns()
    slug_width = max(len(head[6]), *(len(r["slug"]) for r in rows))
    numbers_width = 1 + number + sum(2 + x for x in w)
    title_width = max(len(head[0]), *(len(r["title"]) for r in rows))
    show_slug = numbers_width + 2 + title_width + 2 + slug_width <= columns
    if not show_slug:  # a narrow terminal: no slug column, and the titles wrap in theirs
        title_width = max(len(head[0]), min(title_width, columns - numbers_width - 2))
    slug_head = f"  {head[6]}" if show_slug else ""
    typer.echo(f" {'#':>{number}}  {head[0]:<{title_width}}  {head[1]:>{w[0]}}  {head[2]:>{w[1]}}  {head[3]:>{w[2]}}  "
               f"{head[4]:>{w[3]}}  {head[5]:>{w[4]}}{slug_head}")
    for r in rows:
        steps_txt = f"{r['steps_done']}/{r['steps_total']}"
        best, mastery = format_score(r["best_quiz"], language), format_score(r["mastery"], language)
        title, *more = textwrap.wrap(r["title"], title_width) or [""]
        slug = f"  {r['slug']}" if show_slug else ""
        typer.echo(f" {r['number']:>{number}}  {title:<{title_width}}  {r['duration_min']:>{w[0]}}  {steps_txt:>{w[1]}}  "
                   f"{best:>{w[2]}}  {mastery:>{w[3]}}  {r['runs']:>{w[4]}}{slug}")
        for line in more:
            typer.echo(f" {'':>{number}}  {line}")
    # what the two scores mean, as the tutor's progress screen says it
    typer.echo()
    for explained in (translated("tutor", "best_quiz_explained", language),
                      translated("tutor", "mastery_explained", language)):
        explained = explained.replace("`", "")
        typer.echo(textwrap.fill(explained, width=min(100, columns),
                                 initial_indent=" ", subsequent_indent=" ", break_on_hyphens=False))


# --- sub-commands that live in their own modules ------------------------------------------------
# A module ``distai.tutor.cli_<name>`` registers its commands on import, e.g.
#     from .cli import app, calc_app, CliError, lesson_or_fail
#     @app.command()
#     def quiz(...): ...
# It must import nothing heavy (torch, numpy, textual) at module level: `distai --help` imports it.
COMMAND_MODULES = ("cli_calc", "cli_quiz", "cli_run", "cli_runs", "cli_doctor", "cli_slurm")


def _load_command_modules() -> None:
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"distai.tutor.{name}")


if __name__ != "__main__":  # `python -m distai.tutor.cli` delegates to the imported module
    _load_command_modules()


class _ClickError(Protocol):
    """What :func:`main` reads of a ClickException (of click, or of the copy Typer vendors)."""
    exit_code: int

    def format_message(self) -> str: ...


def _click_exception_types() -> tuple[type, ...]:
    """ClickException as Typer raises it (recent Typer vendors click as ``typer._click``)."""
    types = {cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException"}
    try:
        import click

        types.add(click.exceptions.ClickException)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


#: pydantic's error kinds for a value Typer could not read, as the catalog names what was expected
_EXPECTED = {"int_parsing": "integer", "int_from_float": "integer", "float_parsing": "number", "bool_parsing": "switch"}


def _missing_options(error: Any, args: list[str]) -> list[str]:
    """Every required option of the refused command that ``args`` does not give, as the help writes them
    (Click stops at the first: ``calc serve`` said one missing option per try)."""
    ctx = getattr(error, "ctx", None)
    params = getattr(getattr(ctx, "command", None), "params", None) or []
    given = {a.split("=", 1)[0] for a in args if a.startswith("-")}
    return ["'" + p.opts[0] + "'" for p in params
            if getattr(p, "required", False) and getattr(p, "param_type_name", "") == "option"
            and not given & set(p.opts)]


def click_error_line(error: Any, lang: str, args: list[str] | None = None) -> str:
    """A usage error Click or Typer raised (an unknown option, a missing value, an extra argument…)
    as one line in ``lang``; a kind this does not know keeps Click's English words. ``args``: the command
    line, to name every missing option at once."""
    kind, say = type(error).__name__, lambda key, **f: translated("cli", f"errors.{key}", lang, **f)  # noqa: E731
    message = str(getattr(error, "message", "") or "")
    if kind == "NoSuchOption":
        line = say("no_such_option", name=error.option_name)
        if error.possibilities:
            line += say("possible_options", options=", ".join(sorted(error.possibilities)))
        return line
    if kind == "BadOptionUsage":
        return say("needs_value", name=error.option_name)
    param = getattr(error, "param", None)
    hint = " / ".join(repr(o) for o in getattr(param, "opts", ()) or [getattr(param, "name", "") or "?"])
    if kind == "MissingParameter":  # an argument named as the usage line writes it: {lesson}
        if getattr(param, "param_type_name", "") == "argument":
            return say("missing_argument", name=f"{{{getattr(param, 'name', '?')}}}")
        missing = _missing_options(error, args or [])
        if len(missing) > 1:
            return say("missing_options", names=", ".join(missing))
        return say("missing_option", name=hint)
    if kind == "BadParameter" and param is not None:
        cause = getattr(error.__cause__, "errors", None)  # pydantic's reason, as Typer reads values
        found = cause()[0] if callable(cause) else {}
        expected = _EXPECTED.get(found.get("type", ""))
        value = translated("cli", f"errors.expected.{expected}", lang, value=repr(found.get("input"))) if expected \
            else message
        return say("invalid_value", name=hint, value=value)
    import re

    for key, pattern in (("no_such_command", r"No such command (.+)\.$"), ("extra_arguments", r"Got unexpected extra argument\(s\) \((.+)\)$"),
                         ("missing_command", r"Missing command\.$")):
        found_words = re.match(pattern, message)
        if found_words:
            return say(key, name=found_words.group(1), arguments=found_words.group(1)) if found_words.groups() else say(key)
    return " ".join(error.format_message().split())


#: the words :func:`typer_frame_in` set last (empty until a help is shown in-process)
_FRAME: dict[str, Any] = {}


def typer_frame_in(lang: str) -> None:
    """Typer's own words around the help texts (Usage, Options, Commands, [default: …], the --help
    option's help) in ``lang``: the help is read before ``--lang``, so ``main`` sets them from the
    language :func:`_help_language` reads. Imports Typer's formatter (~0.1 s): only for a help."""
    from typer import rich_utils
    from typer.core import TyperCommand, TyperGroup

    words = strings("cli", lang)["frame"]
    for constant, key in (("OPTIONS_PANEL_TITLE", "options"), ("ARGUMENTS_PANEL_TITLE", "arguments"),
                          ("COMMANDS_PANEL_TITLE", "commands"), ("DEFAULT_STRING", "default"),
                          ("REQUIRED_LONG_STRING", "required"), ("ENVVAR_STRING", "env_var")):
        setattr(rich_utils, constant, words[key])
    _FRAME["words"] = words
    for cls in (TyperCommand, TyperGroup):
        if getattr(cls.get_help_option, "in_language", False):  # ours already
            continue
        base_option = cls.get_help_option

        def get_help_option(self: Any, ctx: Any, base: Callable = base_option) -> Any:
            option = base(self, ctx)
            if option is not None:
                option.help = _FRAME["words"]["help"]
            return option

        def format_usage(self: Any, ctx: Any, formatter: Any) -> None:
            words = _FRAME["words"]  # Click's "[OPTIONS]" and "COMMAND [ARGS]..." too
            pieces = [words["usage_pieces"].get(piece, piece) for piece in self.collect_usage_pieces(ctx)]
            formatter.write_usage(ctx.command_path, " ".join(pieces), prefix=words["usage"])

        get_help_option.in_language = True  # type: ignore[attr-defined]
        cls.get_help_option, cls.format_usage = get_help_option, format_usage  # type: ignore[method-assign]


def _may_print_help(args: list[str]) -> bool:
    """Whether the command line may print a help: ``--help``, or at most one command word (``distai``,
    ``distai --lang es``, ``distai --lang es calc``: a group without its command prints its help)."""
    words = [a for k, a in enumerate(args) if not a.startswith("-") and (k == 0 or args[k - 1] != "--lang")]
    return "--help" in args or len(words) <= 1


def show_what_the_terminal_cannot_as_question_marks() -> None:
    """Standard output and error in an encoding that lacks some of distai's characters (a Latin-1 terminal:
    Ψ, σ, →, the box drawing) write "?" for those: a UnicodeEncodeError ended the command with a traceback."""
    import codecs
    import io

    for stream in (sys.stdout, sys.stderr):
        if not isinstance(stream, io.TextIOWrapper):  # closed (None), or replaced by a test's capture
            continue
        try:
            if not codecs.lookup(stream.encoding).name.startswith("utf-"):
                stream.reconfigure(errors="replace")
        except (LookupError, ValueError):  # an encoding Python does not know, or a stream closed under us
            pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: one-line errors and exit code 2 for bad input, never a traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    lang = _help_language(args)  # --lang is not read yet when Click refuses the command line
    if sys.stdout is None:  # `>&-`: Click's echo wrote nothing and every command said 0 (runs prune --yes too)
        if sys.stderr is not None:
            sys.stderr.write(f"distai: error: {translated('cli', 'errors.stdout_closed', lang)}\n")
        return 1
    if sys.stdin is None:  # `<&-`: read as an empty input (the quiz then says it ended), not a traceback
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - stdin for the rest of the process
    show_what_the_terminal_cannot_as_question_marks()
    if _FRAME or (lang != FALLBACK and _may_print_help(args)):
        typer_frame_in(lang)
    try:
        result = app(args=argv, standalone_mode=False)
        # click returns (not raises) the code of a `typer.Exit(code)` when standalone_mode is off
        if isinstance(result, int) and not isinstance(result, bool) and result != 0:
            return result
    except CliError as exc:
        typer.echo(f"distai: error: {exc}", err=True)
        return exc.code
    except typer.Exit as exc:
        return exc.exit_code
    except (DataHomeError, ProgressError) as exc:  # raised wherever saved state is touched (a write that
        typer.echo(f"distai: error: {exc.text(lang)}", err=True)  # waited for another distai's lock, too)
        return 1
    except typer.Abort:
        typer.echo(f"distai: {translated('cli', 'errors.aborted', lang)}", err=True)
        return 130
    except KeyboardInterrupt:
        typer.echo(f"distai: {translated('cli', 'errors.interrupted', lang)}", err=True)
        return 130
    except OSError as exc:  # the disk filled, or the output went (a full /dev/full, a closed terminal): one line
        why = os_error_text(exc, lang)
        if exc.filename:
            line = translated("cli", "errors.os_error", lang, path=exc.filename, why=why)
        elif exc.errno in DISK_FULL or output_gone(exc):
            line = translated("cli", "errors.output_failed", lang, why=why)
        else:  # a system error of another kind (a refused connection …): its own words, not the output's
            line = why
        try:
            typer.echo(f"distai: error: {line}", err=True)
        except OSError:
            pass  # stderr is gone too: the exit code says it
        return 1
    except Exception as exc:  # click usage errors and the like
        if interrupted(exc):  # a Ctrl-C Python wrapped: as the one above
            typer.echo(f"distai: {translated('cli', 'errors.interrupted', lang)}", err=True)
            return 130
        if isinstance(exc, _click_exception_types()):
            error = cast(_ClickError, exc)
            if type(exc).__name__ == "NoArgsIsHelpError":  # the help, printed already, is the answer
                return error.exit_code
            ctx = getattr(exc, "ctx", None)
            hint = translated("cli", "errors.see_help", lang, command=ctx.command_path) if ctx is not None else ""
            typer.echo(f"distai: error: {click_error_line(error, lang, args)}{hint}", err=True)
            return error.exit_code
        raise
    return 0


if __name__ == "__main__":
    from .cli import main as _main

    sys.exit(_main())
