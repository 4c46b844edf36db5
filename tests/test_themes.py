"""The tutor on themes other than the default dark one, and under NO_COLOR: every character a visualizer
draws stands out from its cell, the code listing follows light and dark, the step counter reads, and the
learner's theme is remembered."""
from __future__ import annotations

import pytest
from textual.geometry import Region

from distai.lessons.registry import all_lessons
from distai.tutor.app import DistaiApp
from distai.tutor.progress import ProgressStore
from distai.tutor.screens.step_text import CodeListing
from distai.visualizers.legibility import MIN_CONTRAST, SHAPES, contrast, grey_of, legible
from pilot_harness import async_test

SIZE = (120, 40)


def test_a_colour_moves_only_as_far_as_it_must_and_always_the_same_way():
    light, dark = (224, 224, 224), (18, 18, 18)
    yellow, slate = (255, 215, 0), (0x3a, 0x44, 0x5c)
    assert contrast(yellow, light) < MIN_CONTRAST <= contrast(legible(yellow, light), light)
    assert contrast(slate, dark) < MIN_CONTRAST <= contrast(legible(slate, dark), dark)
    assert legible(yellow, dark) == yellow  # already legible: kept
    assert contrast(legible(yellow, light), light) < MIN_CONTRAST + 0.6  # the nearest, not black
    red = (255, 0, 0)  # legible as a colour on near-black, but its NO_COLOR grey is not
    assert legible(red, dark) == red and contrast(grey_of(red), grey_of(dark)) < MIN_CONTRAST
    assert contrast(grey_of(legible(red, dark, grey=True)), grey_of(dark)) >= MIN_CONTRAST


def _low_contrast_cells(vis, grey: bool) -> list[tuple[str, float]]:
    found = []
    for strip in vis.render_lines(Region(0, 0, vis.size.width, vis.size.height)):
        for seg in strip:
            style = seg.style
            if style is None or not set(seg.text) - SHAPES - {" "} or style.color is None or style.bgcolor is None:
                continue  # bars and swatches keep the colour their legend shows
            fg, bg = tuple(style.color.get_truecolor()), tuple(style.bgcolor.get_truecolor())
            ratio = contrast(grey_of(fg), grey_of(bg)) if grey else contrast(fg, bg)
            if ratio < MIN_CONTRAST - 0.01:
                found.append((seg.text.strip(), round(ratio, 2)))
    return found


@pytest.mark.parametrize("theme,no_color", [("textual-light", False), ("nord", False), ("textual-dark", True)])
@async_test
async def test_every_visualizer_draws_legibly_on_light_and_dark_themes_and_without_colour(theme, no_color,
                                                                                          monkeypatch):
    # fixed hues chosen on dark grey faded elsewhere: yellow and orange ranks on light grey (1.2:1), the ring's
    # slate labels on Nord (1.3:1), a white capacity mark on light grey, red and blue rows under NO_COLOR (1.7:1)
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    # no painting of the whole screen to the headless terminal (a third of the test's time): the layout
    # still runs, and the check renders the visualizer's lines itself
    monkeypatch.setattr("textual.screen.Screen._compositor_refresh", lambda screen: screen._dirty_widgets.clear())
    app = DistaiApp("en")
    bad = {}
    async with app.run_test(size=SIZE) as pilot:
        app.theme = theme
        assert app.no_color == no_color
        for lesson in all_lessons():
            app.open_lesson(lesson.id)
            await pilot.pause()
            screen = app.screen
            for index in sorted({1, len(lesson.steps) - 1}):
                await screen.show_step(index)
                await pilot.pause()
                if screen.visualizer is None:
                    continue
                for key in ("right_square_bracket", "space", "g"):  # a few frames and views further on
                    if screen.visualizer.control_for(key):
                        await pilot.press(key)
                        await pilot.pause()
                found = _low_contrast_cells(screen.visualizer, no_color)
                if found:
                    bad[(lesson.id, lesson.steps[index].key)] = found[:4]
            counter = screen.query_one("#step-counter")
            assert contrast(counter.rich_style.color.get_truecolor(), counter.rich_style.bgcolor.get_truecolor()) \
                >= MIN_CONTRAST or no_color, (theme, counter.rich_style)
            app.go_home()
    assert not bad, bad


@async_test
async def test_the_code_listing_follows_a_light_or_dark_theme():
    # it was fixed at monokai: near-white names on a light theme's near-white (1.0:1)
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.open_lesson("experts")
        await pilot.pause()
        await app.screen.show_step(app.screen.lesson.step_index("router"))
        await pilot.pause()
        code = app.screen.query_one("#code")
        assert isinstance(code.content, CodeListing) and code.content.dark
        app.theme = "textual-light"
        await pilot.pause()
        assert not code.content.dark
        names = [seg for line in code.content.lines(80) for seg in line.render(app.console)
                 if seg.text.strip() == "tokens" and seg.style and seg.style.color]
        assert all(contrast(tuple(s.style.color.get_truecolor()), (224, 224, 224)) >= MIN_CONTRAST for s in names)
        await app.screen.show_step(app.screen.lesson.step_index("router"))  # drawn anew on the light theme
        await pilot.pause()
        assert not app.screen.query_one("#code").content.dark


@async_test
async def test_the_learners_theme_is_remembered():
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "textual-dark"
        app.theme = "solarized-light"
        await pilot.pause()
    app.store.close()
    assert ProgressStore().setting("theme") == "solarized-light"
    again = DistaiApp("en")
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.theme == "solarized-light"
    again.store.close()


@async_test
async def test_a_legends_swatch_keeps_the_colour_of_the_cells_it_stands_for():
    # the pass moved "■ GPU 1" to a darker orange while that GPU's cells, coloured as backgrounds, kept theirs
    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.theme = "textual-light"
        app.open_lesson("lesson7")
        await pilot.pause()
        await app.screen.show_step(app.screen.lesson.step_index("tp-decode"))
        await pilot.pause()
        vis = app.screen.visualizer
        swatches, fills, labels = set(), set(), []
        for strip in vis.render_lines(Region(0, 0, vis.size.width, vis.size.height)):
            for seg in strip:
                if seg.style is None:
                    continue
                if "■" in seg.text and seg.style.color:
                    swatches.add(tuple(seg.style.color.get_truecolor()))
                if seg.style.bgcolor and seg.style.bgcolor.get_truecolor() != vis.background_colors[1].rich_color.get_truecolor():
                    fills.add(tuple(seg.style.bgcolor.get_truecolor()))
                if "GPU" in seg.text and seg.style.color:
                    labels.append(contrast(tuple(seg.style.color.get_truecolor()),
                                           tuple(seg.style.bgcolor.get_truecolor())))
        assert len(swatches) >= 4 and swatches <= fills, (swatches, fills)
        assert labels and min(labels) >= MIN_CONTRAST  # the words beside them are still moved to be read


@pytest.mark.parametrize("theme", ["ansi-dark", "ansi-light"])
@async_test
async def test_the_terminals_own_colours_are_left_to_it(theme):
    # on the ansi themes every cell is the terminal's default or ANSI colour, whose real values are unknown here:
    # read as black, they were all "1:1" and the pass turned plain text grey
    from textual.widget import Widget

    app = DistaiApp("en")
    async with app.run_test(size=SIZE) as pilot:
        app.theme = theme
        for lesson_id, step in (("experts", "router"), ("lesson1", "reduce-scatter"), ("capstone", "groups")):
            app.open_lesson(lesson_id)
            await pilot.pause()
            await app.screen.show_step(app.screen.lesson.step_index(step))
            await pilot.pause()
            vis = app.screen.visualizer
            if hasattr(vis, "playing"):
                vis.playing = False  # one frame, drawn twice
                await pilot.pause()
            region = Region(0, 0, vis.size.width, vis.size.height)
            raw = [[(seg.text, seg.style) for seg in strip] for strip in Widget.render_lines(vis, region)]
            shown = [[(seg.text, seg.style) for seg in strip] for strip in vis.render_lines(region)]
            assert shown == raw, (lesson_id, step)
            app.go_home()
