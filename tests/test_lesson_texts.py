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
# Finished lessons: every result quoted with one of RESULT_UNITS in their prose must carry a check,
# unless it is one of the lesson's stated inputs or published facts listed here (written the English
# way; Spanish "12,4 %" is compared as "12.4%"). The others are being written by their engineers: add
# a lesson here once its text is final.
RESULT_UNITS = r"ms|µs|GB/s|TB/s|GB|MB|KB|GiB|MiB|KiB|tokens/s|h|min|%|days|días|×"
CHECKED_LESSONS = {
    # α, the link speed and a compute time of the examples
    "lesson1": {"5 µs", "25 GB/s", "200 ms", "1 GB", "25 MiB", "1 KiB", "64 MiB"},
    # the checkpoint examples' inputs (C, R, intervals) and Llama 3's published percentages
    "lesson3": {"5 min", "10 min", "1 h", "3 h", "54 days", "54 días", "78%", "58.7%", "90%",
                "1 MB", "4 GB", "2 TB/s", "7 TB/s"},
    # GPU capacities, the replicated floors 4Ψ/2Ψ of the 7.5B example, and traffic ratios the experiment
    # measures (not formulas: its printout shows them)
    "lesson2": {"80 GB", "30 GB", "15 GB", "1.00×", "1.50×", "2.00×"},
    # lesson 5 quotes no inputs with units: every percentage and ratio is a formula result
    "lesson5": set(),
    # H100 figures, the examples' prompt and sizes, and the vLLM and DistServe papers' results
    "lesson7": {"3.35 TB/s", "80 GB", "20.4%", "38.2%", "99%", "5 µs", "50 ms", "4×", "2.1×", "7.4×",
                "12.6×"},
    # α, link speeds, sizes and the per-layer backward time of the examples
    "lesson6": {"5 µs", "30 µs", "25 GB/s", "10 GB/s", "2 ms", "1 MiB", "4 MiB", "2 MiB", "25 MiB",
                "0.25 MiB"},
    # H100 NVLink (both directions, one direction) and a 400 Gb/s NIC
    "lesson4": {"900 GB/s", "450 GB/s", "50 GB/s"},
    # a GPU's memory, the links and α of the examples, the hot expert's share
    "experts": {"80 GB", "450 GB/s", "50 GB/s", "5 µs", "30%"},
    # the H100's memory, Llama 3's published MFUs (Table 4), mesh degrees written TP 8 × PP 16, and issue 29's
    # 15% goal for the planner's error
    "capstone": {"80 GB", "43%", "41%", "2 ×", "4 ×", "8 ×", "16 ×", "15%"},
    # the example's link (50 GB/s, α = 5 µs), the layout TP 8 × CP 16 and the experiment's 10% bound
    "context": {"50 GB/s", "5 µs", "8 ×", "16 ×", "10%"},
}
# Steps that teach with numbers: each needs at least one check in every language.
NUMERIC_STEPS = {
    "lesson1": {"naive", "all-gather", "alpha-beta", "worked-example", "busbw", "try-it"},
    "lesson3": {"failures", "lost-work", "young-daly", "worked-example"},
    "lesson6": {"formats", "master-weights", "underflow", "loss-scaling", "dynamic", "bf16", "buckets",
                "limits"},
    "lesson2": {"copies", "bytes", "zero1", "zero2", "zero3", "worked-example", "traffic", "next-limits",
                "what-fits"},
    "lesson4": {"comm", "sequence-parallel", "activation-memory", "vocab-parallel", "inside-a-node"},
    "lesson5": {"stages", "microbatches", "gpipe", "1f1b", "same-time", "bubble", "interleaved", "warmup",
                "run-it"},
    "lesson7": {"prefill-decode", "kv-bytes", "tp-decode", "paged", "prefix", "slo", "planner", "disaggregation"},
    "capstone": {"mesh", "groups", "order", "memory", "communication", "planner", "published"},
    "experts": {"why-experts", "router", "capacity", "balance", "shared", "expert-parallel", "all-to-all",
                "ep-dp-tp", "inference", "run-it"},
    "context": {"long-context", "split-sequence", "online-softmax", "ring", "backward", "load-balance",
                "all-gather", "overlap", "memory", "llama3"},
}


def _steps():
    return [(lesson, step) for lesson in LESSONS for step in lesson.steps]


def _step_id(item):
    lesson, step = item
    return f"{lesson.id}/{step.key}"


STEPS = _steps()


def _step_texts():
    """``(lesson, step, lang, markdown)`` of every step text that exists (the missing ones are reported
    by the existence test)."""
    for lesson, step in STEPS:
        for lang in LANGUAGES:
            if lesson.has_step_text(step.key, lang):
                yield lesson, step, lang, lesson.step_text(step.key, lang)


def _all_checks():
    out = []
    for lesson, step, lang, md in _step_texts():
        for i, check in enumerate(tc.find_checks(md, lang)):
            out.append(pytest.param(lesson, step.key, lang, check, md, id=f"{lesson.id}/{lang}/{step.key}#{i}"))
    return out


# --------------------------------------------------------------------------------------------
# Files: every step in both languages, nothing else, valid UTF-8 Markdown with the step's title.


def test_the_lessons_then_the_capstone_with_steps():
    assert [lesson.number for lesson in LESSONS] == list(range(1, len(LESSONS) + 1))
    ids = [lesson.id for lesson in LESSONS]
    assert ids[:9] == [f"lesson{n}" for n in range(1, 8)] + ["experts", "context"]
    assert ids[-1] == "capstone"
    for lesson in LESSONS:
        keys = [s.key for s in lesson.steps]
        assert len(keys) == len(set(keys)), f"{lesson.id} repeats a step key"
        low, high = (6, 10) if lesson.id == "capstone" else (8, 12)
        assert low <= len(keys) <= high, f"{lesson.id} has {len(keys)} steps"


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


def _canonical(value: str) -> str:
    value = re.sub(r"\s+", " ", value).replace(",", ".").replace(" %", "%")
    return value


@pytest.mark.parametrize("lesson_id", sorted(CHECKED_LESSONS))
def test_checked_lessons_have_no_unchecked_results(lesson_id):
    """In a finished lesson, every number followed by a result unit must be checked, each occurrence by a
    check of its own.

    Catches a worked result added to the prose without its check comment, and a stale number that borrows the
    check of an equal number elsewhere in the step (a table cell of the capstone's published step read −5.7%
    for BLOOM, passing on the check of Korthikanti's +5.7%): a result quoted twice has two checks. Inputs of
    the examples and published facts are listed in CHECKED_LESSONS.
    """
    from collections import Counter

    lesson = next(lesson for lesson in LESSONS if lesson.id == lesson_id)
    unit_re = re.compile(r"(?<![\w.,])(\d[\d.,]*\s?(?:" + RESULT_UNITS + r"))(?![\w/])")
    inputs = {_canonical(v) for v in CHECKED_LESSONS[lesson_id]}
    unchecked = []
    for step in lesson.steps:
        for lang in LANGUAGES:
            md = lesson.step_text(step.key, lang)
            shown = Counter(_canonical(c.shown) for c in tc.find_checks(md, lang))
            prose = re.sub(r"```.*?```", "", tc.visible_text(md), flags=re.S)  # commands, code
            prose = re.sub(r"`[^`]*`", "", prose)
            quoted: Counter = Counter()
            for m in unit_re.finditer(prose):
                if m.group(1).endswith("×") and re.match(r"\s*\d", prose[m.end():]):
                    continue  # a product such as "8192 × 2", not a ratio
                value = _canonical(m.group(1))
                if value in inputs:
                    continue
                quoted[value] += 1
                if quoted[value] > shown[value]:
                    unchecked.append(f"{lang}/{step.key}: {m.group(1)!r} (quoted {quoted[value]}×, "
                                     f"checked {shown[value]}×)")
    assert not unchecked, f"{lesson_id}: results quoted without a check of their own: {unchecked}"


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


# --------------------------------------------------------------------------------------------
# Calculator and SLURM commands quoted in code blocks run as written.


def _quoted_commands():
    out = []
    for lesson, step, lang, text in _step_texts():
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                if line.strip().startswith(("distai calc ", "distai slurm ")):
                    out.append(pytest.param(line.strip(), id=f"{lesson.id}/{lang}/{step.key}:{line.strip()[7:40]}"))
    return out


@pytest.mark.parametrize("command", _quoted_commands())
def test_quoted_commands_run(command, capsys, tmp_path, monkeypatch):
    import shlex

    from distai.tutor.cli import main

    monkeypatch.chdir(tmp_path)  # where `distai slurm … -o job.sh` writes its script
    rc = main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    assert rc == 0, f"`{command}` exits {rc}: {captured.err.strip()}"
    written = [p.read_text() for p in tmp_path.iterdir()]
    assert captured.out.strip() or written, f"`{command}` printed and wrote nothing"
    assert all(text.startswith("#!/bin/bash") and "srun" in text for text in written)
