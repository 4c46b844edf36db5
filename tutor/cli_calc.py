"""``distai calc NAME``: the lessons' calculators as commands, built from their declarations.

Each lesson declares its calculators in its own folder (``lessons/lessonN/calc_<name>.py``, a
:class:`~distai.lessons.calculator.Calculator`: options, computation, text); the registry finds
them and this module turns each into a Typer command with the same options, plus ``--json``. The
computation calls the same formulas the lesson text, the quiz and the tests use. ``--json`` prints
one JSON object with stable keys: sizes in bytes, times in seconds, fractions in [0, 1]. Bad or
out-of-range values give a one-line error and exit code 2.

Imports only typer and the (light) declarations at module level: ``distai --help`` loads this module.
"""
from __future__ import annotations

import inspect
import json
import re

import typer

from ..lessons.calculator import REQUIRED, CalcError, Calculator
from ..lessons.registry import all_calculators
from ..lessons.strings import has, translated
from .cli import (
    HELP,
    HELP_LANG,
    CliError,
    calc_app,
    fit_prose,
    lang_option,
    language_or_fail,
    metavar,
    terminal_columns,
)

JSON_HELP = HELP["calc_json"]


def _jsonable(value):
    """Whole floats as integers (16640625000, not 16640625000.0), recursively."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        return int(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _reflow(doc: str) -> str:
    """A docstring with each paragraph on one line (Typer's rich help keeps hard line breaks)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def _measured(calc: Calculator, given: dict) -> dict:
    """``given`` with the measuring flag's value replaced by the machine's measurement (when set)."""
    if not calc.measure or not given.get(calc.measure[0]):
        return given
    import importlib

    module, _, name = calc.measure[1].partition(":")
    measure = getattr(importlib.import_module(module, __package__), name)
    return dict(given, **{calc.measure[0]: measure(calc.parse(given))})


def run_calculator(calc: Calculator, given: dict, as_json: bool, lang: str | None = None) -> None:
    """``calc`` on the options ``given``: its JSON object, or its text in ``lang`` (else the locale's)."""
    language = language_or_fail(lang)
    try:
        result = calc.run(_measured(calc, given), language)
    except CalcError as exc:  # the measurement's refusals (--calibrate) included: in the learner's language
        raise CliError(exc.text(language)) from None
    if as_json:
        typer.echo(json.dumps(_jsonable(result), ensure_ascii=False, indent=2))
    else:
        width = terminal_columns()
        for line in calc.text(result, language):
            for part in fit_prose(line, width):
                typer.echo(part)


#: the name (lessons/catalog/metavar.toml) of each calculator option kind's value (lessons.calculator.KINDS)
CALC_METAVARS = {"whole": "int", "length": "tokens", "count": "int", "bytes": "size", "capacity": "size",
                 "time": "time", "bandwidth": "rate", "per-byte": "per_byte", "flops": "flops", "number": "float",
                 "choice": "name"}


def _metavar(option) -> str | None:
    """What the help shows instead of <str>: the kind of value the option reads, in the help's language
    (a choice's help lists the choices)."""
    if option.kind == "flag":
        return None
    return metavar(CALC_METAVARS[option.kind])


def _parameter(calc: Calculator, option) -> inspect.Parameter:
    names = (option.flag,) + ((option.short,) if option.short else ())
    annotation: object
    if option.kind == "flag":
        annotation, default = bool, bool(option.default)
    else:
        annotation = str if option.default is REQUIRED or option.default is not None else str | None
        default = option.default
    help_text = calc.option_help(option, HELP_LANG)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                             default=typer.Option(default, *names, help=help_text, metavar=_metavar(option),
                                                  show_default=_shown_default(default, help_text)))


_SAYS_DEFAULT = re.compile(r"\b(?:default|por defecto)\b", re.IGNORECASE)


def _shown_default(default: object, help_text: str) -> bool:
    """Whether Typer adds "[default: …]" after the help: not where the help already says the default, in its
    words ("default 989e12: H100 SXM"), nor where the help's language writes a decimal comma ("0,9")."""
    if _SAYS_DEFAULT.search(help_text):
        return False
    return not (HELP_LANG == "es" and isinstance(default, str) and re.search(r"\d\.\d", default) is not None)


def command_for(calc: Calculator):
    """A function Typer reads as ``calc``'s command: one keyword parameter per option, plus ``--json``."""
    params = [_parameter(calc, o) for o in calc.options]
    params.append(inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                    default=typer.Option(False, "--json", help=JSON_HELP)))
    params.append(inspect.Parameter("lang", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                                    default=lang_option()))

    def command(**given) -> None:
        as_json, lang = given.pop("as_json"), given.pop("lang")
        run_calculator(calc, given, as_json, lang)

    command.__name__ = calc.name.replace("-", "_")
    # what Typer reads (inspect.signature honours __signature__, PEP 362; typeshed's functions lack it)
    command.__dict__["__signature__"] = inspect.Signature(params, return_annotation=None)
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command


def register(calc: Calculator) -> None:
    # the listing (`distai calc --help`) and the calculator's own help (its options, sources and JSON
    # keys) in the help's language (DISTAI_LANG, else the locale: --help is read before --lang)
    short = translated("calc", f"summaries.{calc.name}", HELP_LANG) if has("calc", f"summaries.{calc.name}") else None
    calc_app.command(calc.name, help=_reflow(calc.help(HELP_LANG)), short_help=short)(command_for(calc))


for _calc in all_calculators().values():
    register(_calc)
