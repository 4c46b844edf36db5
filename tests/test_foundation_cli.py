"""The CLI: help and tutor start without torch, lesson names, one-line errors, --version."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.metadata import version

import pytest

from distai.lessons.registry import all_lessons, resolve_lesson
from distai.tutor import cli

HEAVY = ("torch", "numpy", "textual")


def run_py(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=120)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distai.tutor.cli", *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=120)


def test_help_lists_the_commands_without_importing_heavy_modules():
    res = run_py(f"""
        import sys
        from distai.tutor.cli import main
        rc = main(["--help"])
        heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
        print("RC", rc, "HEAVY", heavy)
    """)
    assert res.returncode == 0, res.stderr
    assert "RC 0 HEAVY []" in res.stdout, res.stdout[-500:]
    for command in ("tutor", "lessons", "quiz", "calc", "run"):
        assert f" {command} " in res.stdout


def test_distai_tutor_starts_and_walks_a_lesson_without_torch():
    """`distai tutor --lesson 1 --lang es` through main(), driven headless by Pilot."""
    res = run_py("""
        import asyncio, sys
        from distai.tutor import app as app_module
        from distai.tutor.cli import main

        seen = {}

        async def drive(app):
            async with app.run_test(size=(120, 40)) as pilot:
                await pilot.pause()
                seen["screen"] = type(app.screen).__name__
                seen["lang"] = app.language
                for _ in app.screen.lesson.steps:  # every step, including the code step
                    await pilot.press("right")
                await pilot.press("q", "q")

        app_module.DistaiApp.run = lambda self: asyncio.run(drive(self))
        rc = main(["tutor", "--lesson", "1", "--lang", "es"])
        print("RC", rc, seen["screen"], seen["lang"], "torch" in sys.modules)
    """)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "RC 0 LessonScreen es False" in res.stdout, (res.stdout, res.stderr[-2000:])


@pytest.mark.parametrize("name", ["1", "lesson1", "ring-allreduce", " Lesson1 ", "RING-ALLREDUCE"])
def test_lesson_names_resolve(name):
    assert resolve_lesson(name).id == "lesson1"


def test_every_lesson_resolves_by_number_id_and_slug():
    for lesson in all_lessons():
        for name in (str(lesson.number), lesson.id, lesson.slug):
            assert resolve_lesson(name) is lesson


@pytest.mark.parametrize("name", ["1", "lesson1", "ring-allreduce"])
def test_tutor_command_opens_the_named_lesson(name, monkeypatch):
    from distai.tutor import app as app_module

    opened = []
    monkeypatch.setattr(app_module.DistaiApp, "run",
                        lambda self: opened.append((self.initial_lesson.id, self.language)))
    assert cli.main(["tutor", "--lesson", name, "--lang", "en"]) == 0
    assert opened == [("lesson1", "en")]


@pytest.mark.parametrize("argv", [
    ["tutor", "--lesson", "lesson11"],
    ["tutor", "--lesson", "foo"],
    ["quiz", "lesson11"],
    ["run", "foo"],
    ["run", "0"],
])
def test_unknown_lessons_give_a_one_line_error_listing_valid_names(argv):
    res = run_cli(*argv)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "unknown lesson" in lines[0]
    for lesson in all_lessons():
        assert lesson.id in lines[0] and lesson.slug in lines[0]
    assert "Traceback" not in res.stderr


def test_bad_language_is_a_one_line_error():
    for argv in (["tutor", "--lang", "fr"], ["lessons", "--lang", "de"]):
        res = run_cli(*argv)
        assert res.returncode == 2
        assert len(res.stderr.strip().splitlines()) == 1 and "en, es" in res.stderr


def test_unknown_distai_lang_is_a_one_line_error(monkeypatch, capsys):
    """A typo in DISTAI_LANG gave English without a word; it is refused as --lang is, in the locale's
    language, unless --lang overrides it."""
    monkeypatch.setenv("DISTAI_LANG", "sp")
    monkeypatch.setenv("LANG", "es_ES.UTF-8")
    assert cli.main(["lessons"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["distai: error: idioma desconocido DISTAI_LANG='sp'; elige uno de en, es"]
    assert cli.main(["lessons", "--lang", "en"]) == 0
    monkeypatch.setenv("DISTAI_LANG", "ES")
    assert cli.main(["lessons"]) == 0 and "lección" in capsys.readouterr().out


def test_unknown_command_is_a_usage_error_without_traceback():
    res = run_cli("frobnicate")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr and "frobnicate" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run_cli("lessons", "--no-such-option")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_version():
    res = run_cli("--version")
    assert res.returncode == 0
    assert res.stdout.strip() == f"distai {version('distai')}"


def test_language_from_locale(monkeypatch):
    from distai.tutor import app as app_module

    langs = []
    monkeypatch.setattr(app_module.DistaiApp, "run", lambda self: langs.append(self.language))
    monkeypatch.setenv("LANG", "es_ES.UTF-8")
    assert cli.main(["tutor"]) == 0
    monkeypatch.setenv("LANG", "en_GB.UTF-8")
    assert cli.main(["tutor"]) == 0
    assert cli.main(["tutor", "--lang", "es"]) == 0
    assert langs == ["es", "en", "es"]


def test_help_counts_the_lessons_from_the_registry():
    """Issue 27.5: the help said "the seven lessons" and "Lesson: 1-7" while the registry had more."""
    from typer.testing import CliRunner

    import distai.tutor.cli_quiz  # noqa: F401 - registers its commands
    import distai.tutor.cli_run  # noqa: F401
    import distai.tutor.cli_slurm  # noqa: F401

    numbers = sorted(lesson.number for lesson in all_lessons())
    runner = CliRunner()
    top = runner.invoke(cli.app, ["--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert f"List the {len(all_lessons())} lessons" in top.output and "seven" not in top.output
    for command in ("run", "quiz", "slurm", "tutor"):
        out = runner.invoke(cli.app, [command, "--help"], terminal_width=200, env={"COLUMNS": "200"}).output
        assert f"{numbers[0]}-{numbers[-1]}, lessonN" in out, (command, out)


def test_lessons_table_keeps_its_columns_and_says_what_its_scores_mean(isolated_distai_home, capsys, monkeypatch):
    """Lesson 10 pushed its row one column right; "dominio" and "quiz" were not explained anywhere in it."""
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["lessons", "--lang", "es"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head, rows = lines[0], lines[1:11]
    slug_at = head.index("nombre corto")
    assert [row[slug_at:] for row in rows][-1] == "5d-parallelism"
    assert len({row.index(row.split()[1]) for row in rows}) == 1  # every title starts in one column
    notes = " ".join(" ".join(lines[11:]).split())
    assert notes.startswith("Quiz: tu mejor nota") and "Dominio: la parte de los tipos de pregunta" in notes
    assert "`" not in notes  # markdown's backticks are the tutor's, not the shell's


def test_lang_before_the_command_is_the_language_of_the_command(isolated_distai_home, monkeypatch, capsys):
    """`distai --lang es lessons` and `distai calc --lang es allreduce …` answered "no such option --lang"
    in Spanish; `runs export` took no --lang at all."""
    monkeypatch.setenv("DISTAI_LANG", "en")  # restored after the test: --lang before a command sets it
    assert cli.main(["--lang", "es", "lessons"]) == 0 and "lección" in capsys.readouterr().out
    monkeypatch.setenv("DISTAI_LANG", "en")
    assert cli.main(["calc", "--lang", "es", "allreduce", "-s", "1GB", "-n", "8"]) == 0
    assert capsys.readouterr().out.startswith("All-reduce (anillo)")
    monkeypatch.setenv("DISTAI_LANG", "en")
    assert cli.main(["--lang", "xx", "lessons"]) == 2
    assert capsys.readouterr().err.strip() == "distai: error: unknown language 'xx'; choose one of en, es"
    assert cli.main(["runs", "export", "nope", "--lang", "es"]) == 2
    assert "nope" in capsys.readouterr().err


def test_help_shows_flags_without_a_type_and_lang_with_its_choices(monkeypatch):
    """`--json <bool>` read as if it took a value (`--json true` is refused); `--lang <str>` hid its choices."""
    monkeypatch.setenv("COLUMNS", "100")
    res = run_cli("runs", "--help")
    rows = {line.split()[1]: line for line in res.stdout.splitlines() if line.startswith("│ --")}
    assert "<bool>" not in res.stdout and "<" not in rows["--json"] and "<" not in rows["--help"]
    assert "en|es" in rows["--lang"] and rows["--limit"].split()[3] == "N"  # a value named, not typed (<int>)


def test_lessons_table_fits_an_80_column_terminal(isolated_distai_home, capsys, monkeypatch):
    """Its rows were 111 to 122 characters: at 80 columns the slug column goes and the titles wrap."""
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["lessons", "--lang", "es"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) < 80 and "nombre corto" not in lines[0]
    table = lines[:lines.index("")]
    titles = " ".join(line[5:].split("  ")[0].strip() for line in table[1:])
    assert "Sharding de modelo y optimizador (ZeRO y FSDP)" in " ".join(titles.split())  # wrapped, whole


def test_a_ctrl_c_while_the_cli_is_still_being_imported_exits_130_without_a_traceback(monkeypatch):
    import builtins

    from distai.tutor import entry

    real_import = builtins.__import__

    def interrupted(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 1 and name == "cli":  # `from .cli import main`, the first fraction of a second of `distai`
            raise KeyboardInterrupt
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert entry.main() == 130


class _Interrupted:
    """A class attribute whose ``__set_name__`` is where the Ctrl-C lands, as in pydantic's import."""

    def __set_name__(self, owner, name):
        raise KeyboardInterrupt


def _ctrl_c_wrapped_by_python() -> BaseException:
    try:
        type("Model", (), {"field": _Interrupted()})
    except BaseException as exc:  # noqa: BLE001 - what Python made of the Ctrl-C is the point
        return exc
    raise AssertionError("unreachable")


def test_a_ctrl_c_python_wrapped_in_another_error_is_still_a_quiet_130(monkeypatch, capsys):
    """A Ctrl-C in the first half second of `distai run` printed a traceback ending "RuntimeError: Error calling
    __set_name__ on 'Field' instance …": Python 3.11 wraps a KeyboardInterrupt raised in a class's __set_name__
    (pydantic's, which Typer imports when a command runs)."""
    import builtins

    from distai.tutor import cli, entry

    wrapped = _ctrl_c_wrapped_by_python()
    if isinstance(wrapped, KeyboardInterrupt):
        pytest.skip("this Python does not wrap it")
    assert isinstance(wrapped, RuntimeError) and cli.interrupted(wrapped) and not cli.interrupted(RuntimeError("x"))

    def command(*args, **kwargs):
        raise _ctrl_c_wrapped_by_python()

    monkeypatch.setattr(cli, "app", command)
    assert cli.main(["run", "lesson1"]) == 130
    assert capsys.readouterr().err.splitlines() == ["distai: interrupted"]

    real_import = builtins.__import__

    def import_interrupted(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 1 and name == "cli":
            raise _ctrl_c_wrapped_by_python()
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", import_interrupted)
    assert entry.main() == 130


def test_a_closed_stdout_is_one_line_and_exit_1_and_a_closed_stdin_an_empty_input(monkeypatch, capsys):
    """`>&-` lost every command's output with exit 0 (`runs prune --yes --json` removed runs and said nothing);
    `<&-` gave the quiz a traceback."""
    from distai.tutor import cli

    monkeypatch.setattr(sys, "stdout", None)
    assert cli.main(["runs", "--json"]) == 1
    monkeypatch.undo()
    assert capsys.readouterr().err == "distai: error: cannot write the output: the standard output is closed\n"
    monkeypatch.setattr(sys, "stdin", None)
    assert cli.main(["quiz", "1", "-n", "1", "--seed", "1"]) == 0
    assert "Input ended before the first answer" in capsys.readouterr().out


def test_the_tutor_off_a_terminal_is_one_line_not_a_busy_loop(capsys):
    """`distai tutor < /dev/null` redrew its screen for ever (410 MB of output in 10 minutes), deaf to SIGTERM."""
    from distai.tutor import cli

    assert not sys.stdin.isatty()  # pytest's captured input
    assert cli.main(["tutor", "--lang", "es"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "distai: error: el tutor necesita un terminal para su entrada y su salida (un script puede usar distai calc, "
        "quiz, run y runs)"]


@pytest.mark.parametrize("columns", ["0", "1"])
def test_a_terminal_zero_or_one_column_wide_is_written_at_twenty(columns, monkeypatch, capsys):
    """COLUMNS=0 hung `distai run` and `runs show` at full CPU (a wrap that never advanced), COLUMNS=1 `quiz`;
    `lessons` raised a traceback."""
    from rich.text import Text

    from distai.tutor import cli
    from distai.visualizers.ring_drawing import wrap_text

    pieces = [t.plain for t in wrap_text(Text("ab cd"), 0)]  # it returns: one character a line at most
    assert all(len(piece) <= 1 for piece in pieces) and "".join(pieces) == "abcd"
    monkeypatch.setenv("COLUMNS", columns)
    assert cli.terminal_columns() >= cli.MIN_COLUMNS  # 0: Python asks the terminal (piped: 200); 1: 20
    assert cli.main(["lessons", "--lang", "en"]) == 0 and "distai quiz" in capsys.readouterr().out
