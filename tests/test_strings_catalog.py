"""The one string catalog (lessons/catalog/*.toml, read by lessons/strings.py).

Both languages hold the same keys with the same ``{fields}``; every literal lookup in the code
names a string that exists; no module keeps translations of its own (a dict with ``en`` and
``es`` keys, or ``"…" if lang == "es" else "…"``) nor formats numbers by hand for a language
(``.replace(".", ",")``): that is what the catalog and lessons/units.py are for.
"""
from __future__ import annotations

import ast
import string
from pathlib import Path

import pytest

from distai.lessons import strings as catalog

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tutor", "lessons", "visualizers", "engine")
# lessons/units.py is where a language's number convention lives.
NUMBER_FORMATTING_HOME = {"lessons/units.py"}
# Files still carrying their own tables while they move to the catalog (issue 18); empty when done.
NOT_YET_IN_CATALOG: set[str] = set()


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _shape(table, prefix: str = "") -> dict[str, object]:
    """Key path -> the set of format fields (a string) or the element count (a list)."""
    out: dict[str, object] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_shape(value, path + "."))
        elif isinstance(value, list):
            out[path] = len(value)
        else:
            assert isinstance(value, str), f"{path}: {value!r} is not text"
            out[path] = _fields(value)
    return out


@pytest.mark.parametrize("area", catalog.areas())
def test_both_languages_hold_the_same_keys_and_fields(area):
    raw = catalog._area(area)
    assert set(raw) == set(catalog.LANGUAGES), f"{area}.toml: tables {sorted(raw)}, want {catalog.LANGUAGES}"
    english, spanish = _shape(raw["en"]), _shape(raw["es"])
    assert english.keys() == spanish.keys(), (
        f"{area}.toml: only in en {sorted(english.keys() - spanish.keys())}, "
        f"only in es {sorted(spanish.keys() - english.keys())}")
    differing = {k: (english[k], spanish[k]) for k in english if english[k] != spanish[k]}
    assert not differing, f"{area}.toml: fields differ between en and es: {differing}"


def test_lookup_formats_falls_back_and_reports_unknown_keys(tmp_path):
    area, key = next((a, k) for a in catalog.areas() for k, v in catalog.strings(a, "en").items()
                     if isinstance(v, str))
    assert catalog.strings(area, "fr") == catalog.strings(area, "en")  # unknown language: English
    assert catalog.has(area, key) and not catalog.has(area, key + "_missing")
    with pytest.raises(KeyError):
        catalog.translated(area, key + "_missing", "en")
    with pytest.raises(KeyError):
        catalog.translated("no_such_area", "x", "en")
    assert catalog.translated("tutor", "step_counter", "es", k=2, n=9) == "Paso 2 de 9"


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def test_every_literal_lookup_names_a_string_of_the_catalog():
    missing = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            if node.func.id in ("translated", "has") and len(node.args) >= 2:
                area, key = _literal(node.args[0]), _literal(node.args[1])
                if area and key and not catalog.has(area, key):
                    missing.append(f"{rel}:{node.lineno} {area}.{key}")
            if node.func.id == "strings" and node.args and _literal(node.args[0]):
                if _literal(node.args[0]) not in catalog.areas():
                    missing.append(f"{rel}:{node.lineno} area {_literal(node.args[0])}")
    assert not missing, "lookups of strings the catalog lacks: " + ", ".join(missing)


def _own_translations(tree) -> list[int]:
    lines = []
    languages = set(catalog.LANGUAGES)
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = {_literal(k) for k in node.keys if k is not None}
            if languages <= keys:
                lines.append(node.lineno)
        elif isinstance(node, ast.IfExp):
            body, other = _literal(node.body), _literal(node.orelse)
            asks_language = any(_literal(n) in languages for n in ast.walk(node.test))
            # choosing a language code ("es" if … else "en") is not a translation
            if asks_language and body is not None and other is not None and {body, other} - languages:
                lines.append(node.lineno)
    return lines


def test_no_module_keeps_its_own_translations_or_number_conventions():
    found = {}
    for rel, tree in _modules():
        if rel in NUMBER_FORMATTING_HOME:
            continue
        lines = _own_translations(tree)
        if lines:
            found[rel] = lines
    unexpected = {rel: lines for rel, lines in found.items() if rel not in NOT_YET_IN_CATALOG}
    assert not unexpected, f"translations outside lessons/catalog/ (lines): {unexpected}"
    moved = NOT_YET_IN_CATALOG - found.keys()
    assert not moved, f"{sorted(moved)} no longer keep their own strings: drop them from NOT_YET_IN_CATALOG"


def test_a_count_chooses_its_word():
    """"{n} {n:step|steps}": the singular for one (a number, or the text units made of it), else the plural,
    through translated() and through a table's string alike; without a choice, str.format's own rules."""
    from distai.lessons.strings import strings, translated

    assert translated("quiz_cli", "header", "en", title="T", n=1, seed=7) == "T — 1 question (seed 7)"
    assert translated("quiz_cli", "header", "es", title="T", n="12", seed=7) == "T — 12 preguntas (semilla 7)"
    review = strings("quiz_cli", "es")["review_header"]
    assert review.format(n="1", seed=3) == "Repaso espaciado — 1 pregunta pendiente (semilla 3)"
    assert review.format(n=0, seed=3) == "Repaso espaciado — 0 preguntas pendientes (semilla 3)"
    assert strings("failures", "en")["simulating"].format(n=1) == "simulating 1 failure…"
    assert strings("failures", "en")["simulating"].format(n=1.5) == "simulating 1.5 failures…"
