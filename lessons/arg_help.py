"""An experiment's ``--help`` (``distai run LESSON -- --help``) in the learner's language.

Each experiment's parser is an :class:`ExperimentParser` whose ``prog`` ends with the experiment's name
("distai run lesson1"). Its options carry no help text in the code: when the help is printed, every option's
text, the description, the groups' titles and argparse's own words ("usage:", "options", "-h") come from
``lessons/catalog/run_help.toml`` in the run's language (``DISTAI_LANG``, which the launcher sets), and the
metavars from ``lessons/catalog/metavar.toml`` (every command's). An option's text is
``[<lang>.<experiment>].<dest>``, else ``[<lang>.common].<dest>`` (the options several experiments share: the
GPT's size, ``--seed`` …); its default is said after it, formatted by ``lessons/units.py`` ("por defecto:
0,1"), unless it is None (the text then says what happens) or a flag's. A value a text states that lives in
the code (lesson 5's GPT on CPU: ``{cpu}``) comes from the parser's ``help_fields``.
``tests/test_run_help.py`` checks that every option of every experiment has its text, in both languages.
"""
from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from .strings import detect_language, strings
from .units import format_integer, format_plain

__all__ = ["AREA", "COMMON", "ExperimentParser", "HelpFields", "by_machine", "option_help", "option_text", "default_text"]

AREA = "run_help"
COMMON = "common"
METAVAR_AREA = "metavar"
#: the kind of value an experiment's option reads, where its type alone does not say it (metavar.toml names it)
OPTION_KINDS = {"sweep_min": "size", "sweep_max": "size", "ckpt_dir": "folder", "strategies": "list", "modes": "list",
                "schedules": "list", "inject_overflow": "list", "bucket_mb": "list", "skip": "list",
                "memory_seqs": "list", "schedule": "name"}
TYPE_KINDS = {"int": "int", "float": "float", "positive_float": "float", "str": "str"}


#: a help text's fields, per option (``{cpu}`` in "default: {cpu} on CPU"): a value said as a default is, or a
#: function of the language that says it (a size through ``units``)
HelpFields = Mapping[str, Mapping[str, Any]]


def by_machine(cpu: Any, gpu: Any, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """:data:`HelpFields` for options whose default depends on the machine: each name's value on the CPU
    (``cpu``'s attribute) and on a GPU, as "default: {cpu} on CPU, {gpu} on GPU" says them."""
    return {name: {"cpu": getattr(cpu, name), "gpu": getattr(gpu, name)} for name in names}


def option_text(experiment: str, dest: str, lang: str) -> str | None:
    """The help of ``experiment``'s option ``dest`` in ``lang``: the experiment's own text, else the shared one."""
    table = strings(AREA, lang)
    for section in (table.get(experiment, {}), table[COMMON]):
        text = section.get(dest)
        if isinstance(text, str):
            return text
    return None


def default_text(value: Any, lang: str) -> str | None:
    """A default as the help says it in ``lang`` (``0,1``, ``1.024``: units' formats), or None when it
    goes unsaid: None (the option's text says what happens then), a flag's, an empty one, a suppressed one."""
    if value is None or isinstance(value, bool) or value == argparse.SUPPRESS or value in ("", []):
        return None
    if isinstance(value, int):
        return format_integer(value, lang)
    if isinstance(value, float):
        return format_plain(value, lang)
    return str(value)


def option_help(parser: ExperimentParser, action: argparse.Action, lang: str) -> str:
    """The help of one of ``parser``'s options in ``lang``, its fields filled from the code's values
    (``parser.help_fields``), its default said after it."""
    text = option_text(parser.experiment, action.dest, lang) or ""
    fields = parser.help_fields.get(action.dest)
    if fields:
        text = text.format(**{k: v(lang) if callable(v) else default_text(v, lang) or str(v)
                              for k, v in fields.items()})
    said = default_text(action.default, lang)
    if said is None:
        return text
    words = strings(AREA, lang)["default"].format(value=said)
    return f"{text} ({words})" if text else words


class _Formatter(argparse.HelpFormatter):
    """argparse's layout, except that a line never breaks inside a flag ("--growth-" / "interval"), and that a
    value the code names no metavar for is named by the catalog, in the run's language: for the option (a size,
    a list), else for its type (N, X) — where argparse would write the option's name in capitals."""

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        if action.dest == "lang":
            return "en|es"
        type_name = getattr(action.type, "__name__", "str") if action.type is not None else "str"
        kind = OPTION_KINDS.get(action.dest) or TYPE_KINDS.get(type_name, "str")
        return str(strings(METAVAR_AREA, detect_language())[kind])

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


class ExperimentParser(argparse.ArgumentParser):
    """An experiment's parser whose help is in the run's language (the module's doc says from where)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.help_fields: HelpFields = {}  # the values a text states that live in the code (its CPU model's size …)

    @property
    def experiment(self) -> str:
        return self.prog.rsplit(" ", 1)[-1]

    def format_help(self) -> str:
        lang = detect_language()
        words = strings(AREA, lang)
        own = words.get(self.experiment, {})
        for action in self._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._HelpAction):
                action.help = words["help"]
                continue
            action.help = option_help(self, action, lang).replace("%", "%%")  # argparse formats the help with %
        titles = own.get("groups", {})
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups, prefix=words["usage"])
        formatter.add_text(own.get("description", self.description))
        for group in self._action_groups:
            title = words["options"] if group is self._optionals else titles.get(group.title, group.title)
            formatter.start_section(title)
            formatter.add_text(group.description)
            formatter.add_arguments(group._group_actions)
            formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()
