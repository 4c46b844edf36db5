"""Formula checks embedded in lesson texts: every worked number is tied to the function computing it.

A lesson text states a number in prose and, right after it, an HTML comment (Textual's Markdown
widget does not render HTML comments, so the learner never sees it)::

    ... the all-reduce takes 70.07 ms.
    <!-- check: ring_allreduce_time(size_bytes=1e9, n=8, alpha=5e-6, beta=4e-11) ≈ 70.07 ms -->

The part before the relation (`=` or `≈`, with a space on each side) is a Python expression. It may
call the functions of the step's own lesson module ``distai.lessons.lessonN.formulas`` by their bare
name, or any function of a module under ``distai.lessons`` by a dotted path relative to it
(``lesson2.formulas.model_state_bytes(...)``); it may use numbers, strings, + − * / **, a string or
integer subscript of a result (``kv_cache_total(...)["per_gpu_bytes"]``) and a few
helpers (``abs``, ``min``, ``max``, ``sqrt``, ``exp``, ``log2``, ``ceil``, ``floor``). Keyword arguments are
written without spaces around ``=``.

The part after the relation is the value as printed in the text: a number in the text's language
(English ``1,234.5``; Spanish ``1.234,5``) and an optional unit. The check passes when

(a) the expression, converted to the unit, rounds to the stated number at the stated precision
    (``70.07 ms`` accepts anything in [70.065, 70.075] ms), and
(b) the stated value, exactly as written, appears in the visible text of the same step,

so prose and formula cannot drift apart. Pure Python: no torch, no numpy, no Textual.
"""
from __future__ import annotations

import ast
import importlib
import math
import re
from dataclasses import dataclass

# Unit -> factor that converts a value in that unit to the unit the formulas return (SI: s, bytes,
# bytes/s; plain ratios for %, ×).
UNITS: dict[str, float] = {
    "": 1.0, "×": 1.0, "x": 1.0,
    "%": 0.01,
    "s": 1.0, "ms": 1e-3, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ns": 1e-9,
    "min": 60.0, "h": 3600.0,
    "days": 86400.0, "day": 86400.0, "días": 86400.0, "día": 86400.0,
    "B": 1.0, "bytes": 1.0, "byte": 1.0,
    "KB": 1e3, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40,
    "B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
    "tokens/s": 1.0,
    "FLOP": 1.0, "GFLOP": 1e9, "TFLOP": 1e12,
    "FLOP/s": 1.0, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15,
}

_COMMENT = re.compile(r"<!--(.*?)-->", re.S)
_RELATION = re.compile(r"\s(=|≈)\s")
_VALUE = re.compile(r"^(?P<num>[-−]?\d(?:[\d.,\u202f\u00a0]*\d)?)\s*(?P<unit>[^\d\s].*)?$")

_HELPERS = {
    "abs": abs, "min": min, "max": max, "sqrt": math.sqrt, "exp": math.exp, "log2": math.log2,
    "ceil": math.ceil, "floor": math.floor,
}


class CheckSyntaxError(ValueError):
    """A ``<!-- check: ... -->`` comment that cannot be parsed."""


@dataclass(frozen=True)
class Check:
    expr: str  # the Python expression
    relation: str  # "=" or "≈" (both mean: equal at the precision shown)
    shown: str  # the value exactly as written, e.g. "70.07 ms"
    number: float  # the stated number, in the stated unit
    decimals: int  # digits after the decimal separator
    unit: str
    lang: str

    @property
    def tolerance(self) -> float:
        """Half a unit in the last digit shown (in the stated unit)."""
        return 0.5 * 10.0 ** (-self.decimals)


@dataclass(frozen=True)
class Outcome:
    check: Check
    computed: float  # in the stated unit
    value_ok: bool
    shown_ok: bool

    @property
    def ok(self) -> bool:
        return self.value_ok and self.shown_ok

    def describe(self) -> str:
        parts = []
        if not self.value_ok:
            parts.append(f"{self.check.expr} = {self.computed:.6g} {self.check.unit}".rstrip()
                         + f", but the text says {self.check.shown!r} (±{self.check.tolerance:g})")
        if not self.shown_ok:
            parts.append(f"{self.check.shown!r} does not appear in the visible text")
        return "; ".join(parts) or "ok"


def visible_text(markdown: str) -> str:
    """The Markdown without its HTML comments (what the learner reads)."""
    return _COMMENT.sub("", markdown)


def _normalise_spaces(text: str) -> str:
    return re.sub(r"[\s\u00a0\u202f]+", " ", text)


def parse_number(text: str, lang: str) -> tuple[float, int]:
    """``(value, decimals)`` of a number written in ``lang``'s convention."""
    s = text.strip().replace("−", "-").replace("\u00a0", "").replace("\u202f", "").replace(" ", "")
    thousands, decimal = (".", ",") if lang == "es" else (",", ".")
    body = s.lstrip("-")
    groups = body.split(decimal)
    if len(groups) > 2:
        raise CheckSyntaxError(f"{text!r} has more than one decimal separator for language {lang!r}")
    integer = groups[0]
    if thousands in integer:
        parts = integer.split(thousands)
        if not (1 <= len(parts[0]) <= 3 and all(len(p) == 3 for p in parts[1:])):
            raise CheckSyntaxError(f"{text!r} is not a well-formed number in language {lang!r}")
        integer = "".join(parts)
    frac = groups[1] if len(groups) == 2 else ""
    if not integer.isdigit() or (frac and not frac.isdigit()):
        raise CheckSyntaxError(f"{text!r} is not a number in language {lang!r}")
    value = float(f"{integer}.{frac}" if frac else integer)
    return (-value if s.startswith("-") else value), len(frac)


def parse_check(body: str, lang: str) -> Check:
    """Parse the inside of one ``<!-- check: EXPR (=|≈) VALUE -->`` comment."""
    body = " ".join(body.split())
    if not body.startswith("check:"):
        raise CheckSyntaxError(f"not a check: {body!r}")
    body = body[len("check:"):].strip()
    matches = list(_RELATION.finditer(body))
    if not matches:
        raise CheckSyntaxError(f"no ' = ' or ' ≈ ' in check {body!r}")
    rel = matches[-1]
    expr, shown = body[:rel.start()].strip(), body[rel.end():].strip()
    m = _VALUE.match(shown)
    if not expr or not m:
        raise CheckSyntaxError(f"cannot read the value {shown!r} in check {body!r}")
    unit = (m.group("unit") or "").strip()
    if unit not in UNITS:
        raise CheckSyntaxError(f"unknown unit {unit!r} in check {body!r}; known: {', '.join(sorted(UNITS))}")
    number, decimals = parse_number(m.group("num"), lang)
    try:
        ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise CheckSyntaxError(f"bad expression {expr!r}: {exc}") from None
    return Check(expr=expr, relation=rel.group(1), shown=shown, number=number, decimals=decimals,
                 unit=unit, lang=lang)


def find_checks(markdown: str, lang: str) -> list[Check]:
    """Every check comment in a step's Markdown (other HTML comments are ignored)."""
    found = []
    for m in _COMMENT.finditer(markdown):
        inner = m.group(1).strip()
        if inner.startswith("check"):
            found.append(parse_check(inner, lang))
    return found


class _Evaluator:
    """Evaluates a check expression: numbers, arithmetic and calls to lesson functions only."""

    def __init__(self, default_module: str | None):
        self.default_module = default_module

    def resolve(self, node: ast.AST):
        dotted = []
        while isinstance(node, ast.Attribute):
            dotted.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            raise CheckSyntaxError("only plain or dotted function names can be called")
        dotted.append(node.id)
        dotted.reverse()
        if len(dotted) == 1:
            name = dotted[0]
            if name in _HELPERS:
                return _HELPERS[name]
            if self.default_module is None:
                raise CheckSyntaxError(f"{name!r}: no default formulas module")
            module = importlib.import_module(self.default_module)
        else:
            name = dotted[-1]
            path = ".".join(dotted[:-1])
            if not path.startswith("distai."):
                path = "distai.lessons." + path
            if not path.startswith("distai.lessons."):
                raise CheckSyntaxError(f"{path!r}: checks may only call functions under distai.lessons")
            module = importlib.import_module(path)
        if name.startswith("_") or not hasattr(module, name):
            raise CheckSyntaxError(f"{module.__name__} has no public function {name!r}")
        return getattr(module, name)

    def eval(self, node: ast.AST):
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool, type(None))):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)):
            return [self.eval(e) for e in node.elts]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.eval(node.operand)
            return -v if isinstance(node.op, ast.USub) else +v
        if isinstance(node, ast.BinOp):
            ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                   ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b, ast.FloorDiv: lambda a, b: a // b}
            for kind, fn in ops.items():
                if isinstance(node.op, kind):
                    return fn(self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.Subscript):  # a field of a function's dict or tuple result
            key = self.eval(node.slice)
            if not isinstance(key, (str, int)):
                raise CheckSyntaxError("only string or integer subscripts are allowed in checks")
            return self.eval(node.value)[key]
        if isinstance(node, ast.Call):
            fn = self.resolve(node.func)
            args = [self.eval(a) for a in node.args]
            kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg is not None}
            if len(kwargs) != len(node.keywords):
                raise CheckSyntaxError("**kwargs are not allowed in checks")
            return fn(*args, **kwargs)
        raise CheckSyntaxError(f"not allowed in a check expression: {ast.dump(node)[:80]}")


def evaluate(check: Check, default_module: str | None = None) -> float:
    """The expression's value, converted to the check's unit."""
    value = _Evaluator(default_module).eval(ast.parse(check.expr, mode="eval"))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckSyntaxError(f"{check.expr} returned {value!r}, not a number")
    return float(value) / UNITS[check.unit]


def run_check(check: Check, markdown: str, default_module: str | None = None) -> Outcome:
    """Evaluate one check against the step's Markdown it was found in."""
    computed = evaluate(check, default_module)
    slack = check.tolerance + 1e-9 * max(1.0, abs(check.number))
    value_ok = math.isfinite(computed) and abs(computed - check.number) <= slack
    shown = re.escape(_normalise_spaces(check.shown))
    shown_ok = re.search(r"(?<![\d.,])" + shown + r"(?![\d])", _normalise_spaces(visible_text(markdown))) is not None
    return Outcome(check=check, computed=computed, value_ok=value_ok, shown_ok=shown_ok)


def formulas_module(lesson_package: str) -> str:
    """The default module of a lesson's checks: ``<lesson package>.formulas``."""
    return f"{lesson_package}.formulas"
