"""Lesson texts: every step has its Markdown in both languages, and every worked number is checked.

The check mechanism (``distai.lessons.text_checks``, documented in CONTRIBUTING.md): a comment
``<!-- check: EXPR = VALUE -->`` after a number ties it to the function that computes it; these
tests evaluate every such comment in every lesson and language, and require the value shown in
the comment to appear in the step's visible text.
"""
from __future__ import annotations

import asyncio
import re
from importlib import resources

import pytest
from markdown_it import MarkdownIt

from distai.lessons import text_checks as tc
from distai.lessons.registry import LANGUAGES, all_lessons

LESSONS = all_lessons()
# Lessons whose every worked number must carry a check (the others are being written by their
# engineers; add a lesson here once its text is final).
CHECKED_LESSONS = {"lesson1"}
# Steps that teach with numbers: each needs at least one check in every language.
NUMERIC_STEPS = {
    "lesson1": {"naive", "all-gather", "alpha-beta", "worked-example", "busbw", "try-it"},
}


def _steps():
    return [(lesson, step) for lesson in LESSONS for step in lesson.steps]


def _step_id(item):
    lesson, step = item
    return f"{lesson.id}/{step.key}"


STEPS = _steps()


def _all_checks():
    out = []
    for lesson, step in STEPS:
        for lang in LANGUAGES:
            if not lesson.has_step_text(step.key, lang):
                continue
            md = lesson.step_text(step.key, lang)
            for i, check in enumerate(tc.find_checks(md, lang)):
                out.append(pytest.param(lesson, step.key, lang, check, md,
                                        id=f"{lesson.id}/{lang}/{step.key}#{i}"))
    return out


# --------------------------------------------------------------------------------------------
# Files: every step in both languages, nothing else, valid UTF-8 Markdown with the step's title.


def test_seven_lessons_with_steps():
    assert [lesson.number for lesson in LESSONS] == [1, 2, 3, 4, 5, 6, 7]
    for lesson in LESSONS:
        keys = [s.key for s in lesson.steps]
        assert len(keys) == len(set(keys)), f"{lesson.id} repeats a step key"
        assert 8 <= len(keys) <= 12, f"{lesson.id} has {len(keys)} steps"


@pytest.mark.parametrize("item", STEPS, ids=_step_id)
@pytest.mark.parametrize("lang", LANGUAGES)
def test_step_text_exists_utf8_and_titled(item, lang):
    lesson, step = item
    assert lesson.has_step_text(step.key, lang), f"missing {lesson.id}/{lang}/{step.key}.md"
    raw = resources.files(lesson.package).joinpath(lang, f"{step.key}.md").read_bytes()
    text = raw.decode("utf-8")  # strict: invalid UTF-8 raises
    assert not text.startswith("\ufeff"), "no byte-order mark"
    assert "\r" not in text, "Unix line endings"
    first, _, body = text.partition("\n")
    assert first == f"# {step.title[lang]}", (
        f"{lesson.id}/{lang}/{step.key}.md must open with the step title from lesson.toml: "
        f"'# {step.title[lang]}', not {first!r}")
    words = re.findall(r"\w+", tc.visible_text(body))
    assert len(words) >= 40, f"{lesson.id}/{lang}/{step.key}.md has only {len(words)} words"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.id)
def test_no_stray_text_files(lesson):
    keys = {s.key for s in lesson.steps}
    root = resources.files(lesson.package)
    for lang in LANGUAGES:
        found = {p.name for p in root.joinpath(lang).iterdir()}
        stray = sorted(found - {f"{k}.md" for k in keys})
        assert not stray, f"{lesson.id}/{lang} has files without a step in lesson.toml: {stray}"


_MD = MarkdownIt("gfm-like")  # the parser Textual's Markdown widget uses


@pytest.mark.parametrize("item", STEPS, ids=_step_id)
@pytest.mark.parametrize("lang", LANGUAGES)
def test_markdown_renders_cleanly(item, lang):
    """Balanced code fences, no LaTeX, no raw HTML except whole-line comments at block ends."""
    lesson, step = item
    if not lesson.has_step_text(step.key, lang):
        pytest.skip("missing file is reported by the existence test")
    text = lesson.step_text(step.key, lang)
    name = f"{lesson.id}/{lang}/{step.key}.md"
    fences = [line for line in text.splitlines() if line.lstrip().startswith("```")]
    assert len(fences) % 2 == 0, f"{name}: unbalanced code fence"
    visible = tc.visible_text(text)
    for latex in ("$$", "\\frac", "\\cdot", "\\(", "\\[", "\\sqrt", "\\alpha", "\\beta"):
        assert latex not in visible, f"{name}: LaTeX {latex!r} does not render in the terminal"
    for token in _MD.parse(text):
        children = token.children or []
        for t in [token, *children]:
            if t.type in ("html_block", "html_inline"):
                assert t.content.strip().startswith("<!--") and t.content.strip().endswith("-->"), (
                    f"{name}: raw HTML {t.content.strip()[:60]!r} is not rendered by Textual")
                assert t.type == "html_block", (
                    f"{name}: put comments on their own line at the end of a paragraph, "
                    f"not inside a sentence: {t.content.strip()[:60]!r}")
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if "-->" in line:
            after = line.split("-->")[-1]
            assert not after.strip(), (
                f"{name}:{i + 1}: text after '-->' on the same line is swallowed by the comment")
            nxt = next((x for x in lines[i + 1:] if not x.strip().startswith("<!--")), "")
            assert (not nxt.strip()) or re.match(r"\s*([-*] |\d+\. )", nxt), (
                f"{name}:{i + 1}: a comment must end its paragraph (blank line after it); here the "
                f"text continues with {nxt.strip()[:40]!r} and would render as a new paragraph")


# --------------------------------------------------------------------------------------------
# Formula checks.


CHECKS = _all_checks()


@pytest.mark.parametrize("lesson,key,lang,check,md", CHECKS)
def test_formula_check(lesson, key, lang, check, md):
    outcome = tc.run_check(check, md, tc.formulas_module(lesson.package))
    assert outcome.ok, f"{lesson.id}/{lang}/{key}.md: {outcome.describe()}"


@pytest.mark.parametrize("item", STEPS, ids=_step_id)
def test_both_languages_check_the_same_numbers(item):
    """English and Spanish quote the same worked numbers, tied to the same expressions."""
    lesson, step = item
    if not all(lesson.has_step_text(step.key, lang) for lang in LANGUAGES):
        pytest.skip("missing file is reported by the existence test")
    per_lang = {}
    for lang in LANGUAGES:
        checks = tc.find_checks(lesson.step_text(step.key, lang), lang)
        per_lang[lang] = sorted((re.sub(r"\s+", "", c.expr), c.number * tc.UNITS[c.unit]) for c in checks)
    en, es = per_lang["en"], per_lang["es"]
    assert [e for e, _ in en] == [e for e, _ in es], f"{lesson.id}/{step.key}: en and es check different formulas"
    for (expr, a), (_, b) in zip(en, es):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), f"{lesson.id}/{step.key}: {expr} is {a} in en, {b} in es"


@pytest.mark.parametrize("lesson_id", sorted(NUMERIC_STEPS))
def test_numeric_steps_carry_checks(lesson_id):
    lesson = next(lesson for lesson in LESSONS if lesson.id == lesson_id)
    for key in NUMERIC_STEPS[lesson_id]:
        for lang in LANGUAGES:
            checks = tc.find_checks(lesson.step_text(key, lang), lang)
            assert checks, f"{lesson_id}/{lang}/{key}.md quotes worked numbers but has no check"


@pytest.mark.parametrize("lesson_id", sorted(CHECKED_LESSONS))
def test_checked_lessons_have_no_unchecked_results(lesson_id):
    """In a finished lesson, a number followed by a time or bandwidth unit must be checked.

    Catches a worked result added to the prose without its check comment. Inputs such as
    "α = 5 µs" or "25 GB/s" are allowed when they appear in a check's expression too (as
    themselves) or are listed among the step's stated inputs below.
    """
    lesson = next(lesson for lesson in LESSONS if lesson.id == lesson_id)
    unit_re = re.compile(r"(?<![\w.,])(\d[\d.,]*\s?(?:ms|µs|GB/s))")
    inputs = {"5 µs", "25 GB/s", "25GB/s", "200 ms"}  # α, the link speed, the compute time of an example
    for step in lesson.steps:
        for lang in LANGUAGES:
            md = lesson.step_text(step.key, lang)
            shown = {re.sub(r"\s+", " ", c.shown) for c in tc.find_checks(md, lang)}
            for m in unit_re.finditer(tc.visible_text(md)):
                value = re.sub(r"\s+", " ", m.group(1))
                assert value in shown or value in inputs or value.replace(",", ".") in inputs, (
                    f"{lesson_id}/{lang}/{step.key}.md: {value!r} is quoted without a check")


# --------------------------------------------------------------------------------------------
# The mechanism itself can fail: wrong values, values missing from the prose, bad syntax.


SAMPLE = """# T

The ring takes 70.07 ms on eight ranks.

<!-- check: lesson1.formulas.ring_allreduce_time(1e9, 8, 5e-6, 4e-11) ≈ 70.07 ms -->
"""


def test_mechanism_accepts_a_right_value():
    [check] = tc.find_checks(SAMPLE, "en")
    assert (check.number, check.decimals, check.unit) == (70.07, 2, "ms")
    assert tc.run_check(check, SAMPLE).ok


def test_mechanism_rejects_a_wrong_value():
    md = SAMPLE.replace("70.07", "70.17")
    [check] = tc.find_checks(md, "en")
    outcome = tc.run_check(check, md)
    assert not outcome.value_ok and outcome.shown_ok


def test_mechanism_respects_the_precision_shown():
    for shown, ok in [("70.1 ms", True), ("70 ms", True), ("70.1", False), ("70.070 ms", True),
                      ("70.072 ms", False), ("0.07 s", True), ("70070 µs", True)]:
        md = f"It takes {shown}.\n\n<!-- check: lesson1.formulas.ring_allreduce_time(1e9, 8, 5e-6, 4e-11) = {shown} -->\n"
        [check] = tc.find_checks(md, "en")
        assert tc.run_check(check, md).value_ok is ok, shown


def test_mechanism_requires_the_value_in_the_visible_text():
    md = SAMPLE.replace("The ring takes 70.07 ms", "The ring takes about 70 ms")
    [check] = tc.find_checks(md, "en")
    outcome = tc.run_check(check, md)
    assert outcome.value_ok and not outcome.shown_ok
    # a longer number that merely contains the value does not count
    md = SAMPLE.replace("The ring takes 70.07 ms", "The ring takes 170.07 ms")
    assert not tc.run_check(tc.find_checks(md, "en")[0], md).shown_ok


def test_mechanism_reads_spanish_numbers():
    md = ("El anillo tarda 70,07 ms y mueve 1.750.000.000 bytes.\n\n"
          "<!-- check: lesson1.formulas.ring_allreduce_time(1e9, 8, 5e-6, 4e-11) ≈ 70,07 ms -->\n"
          "<!-- check: lesson1.formulas.ring_busiest_link_bytes(1e9, 8) = 1.750.000.000 bytes -->\n")
    checks = tc.find_checks(md, "es")
    assert [c.number for c in checks] == [70.07, 1.75e9]
    assert all(tc.run_check(c, md).ok for c in checks)
    # the English reading of "70,07" is not a number: the mistake is reported, not guessed
    with pytest.raises(tc.CheckSyntaxError):
        tc.find_checks(md, "en")


@pytest.mark.parametrize("bad", [
    "<!-- check: 1 + 1 -->",  # no value
    "<!-- check: ring_allreduce_time(1e9, 8, 5e-6, 4e-11) = 70 parsecs -->",  # unknown unit
    "<!-- check: (1 + = 2 -->",  # not an expression
])
def test_mechanism_rejects_malformed_checks(bad):
    with pytest.raises(tc.CheckSyntaxError):
        tc.find_checks(bad, "en")


@pytest.mark.parametrize("expr", ["__import__('os').getcwd()", "os.path.join('a')",
                                  "lesson1.formulas._check_n(3)", "[x for x in (1,)]"])
def test_mechanism_only_calls_lesson_functions(expr):
    md = f"x 3\n\n<!-- check: {expr} = 3 -->\n"
    [check] = tc.find_checks(md, "en")
    with pytest.raises((tc.CheckSyntaxError, ModuleNotFoundError)):
        tc.run_check(check, md, "distai.lessons.lesson1.formulas")


# --------------------------------------------------------------------------------------------
# Textual does not show the check comments.


def test_textual_markdown_hides_check_comments():
    from textual.app import App
    from textual.widgets import Markdown

    lesson = LESSONS[0]
    md = lesson.step_text("worked-example", "en")
    assert "<!-- check:" in md

    class Probe(App):
        def compose(self):
            yield Markdown(md)

    async def render() -> str:
        app = Probe()
        async with app.run_test(size=(120, 80)) as pilot:
            await pilot.pause()
            svg = app.export_screenshot()
        text = re.sub(r"<[^>]+>", "", svg)
        for a, b in (("&#160;", " "), ("&nbsp;", " "), ("&lt;", "<"), ("&gt;", ">"), ("&amp;", "&")):
            text = text.replace(a, b)
        return text

    screen = asyncio.run(render())
    assert "70.07" in screen and "ms" in screen  # the prose is rendered...
    assert "check:" not in screen and "ring_allreduce_time" not in screen  # ...the checks are not
