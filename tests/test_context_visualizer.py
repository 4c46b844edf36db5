"""Lesson 9's ring-attention visualizer against the lesson: the idle share it shows is the one the
text checks, ``z`` compares the same sequence and says how it is cut, every glyph it draws is in its
legend, and a short pane says how many lines it hides instead of dropping them."""
from __future__ import annotations

import re

from textual.geometry import Region

from distai.lessons.context import formulas as F
from distai.lessons.context import ring_schedule as plan
from distai.lessons.registry import resolve_lesson
from distai.lessons.strings import strings, translated
from distai.lessons.units import format_percent
from distai.tutor.app import DistaiApp
from distai.visualizers.ring_attention import RingAttentionVisualizer
from pilot_harness import async_test, drawn_text


def _vis(lang: str, cp: int = 4, layout: str = "contiguous") -> RingAttentionVisualizer:
    vis = RingAttentionVisualizer(language=lang)
    vis.cp, vis.seq_layout = cp, layout
    return vis


def _visible(md: str) -> str:
    return re.sub(r"<!--.*?-->", "", md, flags=re.S)


def test_the_idle_share_shown_is_the_one_the_text_checks():
    """The load-balance step quotes the visualizer's exact-pair share and the long-chunk share
    ``(cp−1)/(2cp−1)``; the visualizer shows both, each computed by the formula the text's checks use."""
    lesson = resolve_lesson("context")
    for lang in ("en", "es"):
        vis = _vis(lang)
        exact = format_percent(F.idle_fraction(4, seq=vis.seq), 3, lang)
        long = format_percent(F.idle_fraction(4), 3, lang)
        assert exact != long  # 8- or 16-token diagonal tiles are more than half full
        assert long == format_percent(3 / 7, 3, lang)  # the half-tile count, exact for long chunks
        shown = drawn_text(vis, 200)
        idle_line = next(line for line in shown.splitlines() if exact in line)
        assert long in idle_line and "16" in idle_line, idle_line
        text = _visible(lesson.step_text("load-balance", lang))
        assert exact in text and long in text and f"s = {vis.seq}" in text
        # the zigzag layout idles nothing, counted either way: one number, no long-chunk aside
        zig = _vis(lang, layout="zigzag")
        zero = format_percent(0.0, 3, lang)
        line = next(line for line in drawn_text(zig, 200).splitlines()
                    if line.startswith(strings("ring_attention", lang)["idle_share"].split("{")[0]))
        assert line.count(zero) == 1 and "(" not in line.split("·")[0], line


def test_switching_the_layout_keeps_the_sequence_and_says_how_it_is_cut():
    for lang in ("en", "es"):
        vis = _vis(lang)
        before = (vis.seq, drawn_text(vis, 76))
        vis.action_layout()  # z
        after = (vis.seq, drawn_text(vis, 76))
        assert before[0] == after[0] == 64
        tr = strings("ring_attention", lang)
        assert f"s={before[0]}" in before[1].splitlines()[0] and f"s={after[0]}" in after[1].splitlines()[0]
        assert tr["axes"].format(n=4, c=16).split(" · ")[0] in before[1]
        assert tr["axes"].format(n=8, c=8).split(" · ")[0] in after[1]


def test_every_glyph_the_matrix_draws_is_in_the_legend():
    for lang in ("en", "es"):
        legend = strings("ring_attention", lang)["legend"]
        for layout in plan.LAYOUTS:
            for step in range(4):
                vis = _vis(lang, layout=layout)
                vis.step = step
                cells = {ch for line in drawn_text(vis, 200).splitlines() if re.match(r"q\d+ ", line)
                         for ch in line.split()[1]}
                assert "◣" in cells if step == 0 else "█" in cells
                for ch in cells:
                    assert ch * 2 in legend, (lang, layout, step, ch)


def test_a_short_pane_counts_its_hidden_rows_and_no_row_is_wider_than_the_pane():
    """At 76 × 19 (the maximized pane of an 80 × 24 terminal) the lines wrap: the visualizer cuts rows,
    not lines, and says how many it hides; the hint stays last."""
    vis = _vis("es")
    vis.step = 2
    full = vis.build_lines(76)
    cut = vis.build_lines(76, 19)
    assert all(len(line.plain) <= 76 for line in full)
    assert len(cut) == 19
    notice = translated("visualizer", "more_lines", "es", n=len(full) - 18)
    assert cut[-2].plain == notice and cut[-1].plain == full[-1].plain
    row_title = strings("ring_attention", "es")["row_title"].split("{")[0]
    assert any(line.plain.startswith(row_title) for line in full)


@async_test
async def test_the_maximized_visualizer_at_80x24_says_what_it_hides():
    """The tutor at 80 × 24, in Spanish, lesson 9's ring step with V (the visualizer alone): the m/l
    panel does not fit, and the pane says so above the keys' hint instead of dropping it silently."""
    app = DistaiApp("es", lesson_id="context")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        keys = [s.key for s in resolve_lesson("context").steps]
        await screen.show_step(keys.index("ring"))
        await pilot.press("V")
        await pilot.pause()
        vis = screen.query_one(RingAttentionVisualizer)
        rows = [s.text.rstrip() for s in vis.render_lines(Region(0, 0, vis.region.width, vis.region.height))]
        shown = [r for r in rows if r.strip()]
        marks = [r for r in shown if r.strip().startswith("▼")]
        assert len(marks) == 1 and "líneas más: se ven con una terminal más alta" in marks[0], rows
        assert shown[-1].strip().startswith(translated("visualizer", "more_keys", "es").split()[0]) or \
            "?" in shown[-1], rows
        hidden = int(re.search(r"▼ (\d+)", marks[0]).group(1))
        width = vis.content_size.width
        assert hidden == len(vis.build_lines(width)) - (vis.content_size.height - 1) > 0
