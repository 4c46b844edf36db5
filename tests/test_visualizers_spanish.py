"""Every visualizer, drawn in Spanish at each of its lesson's steps, writes numbers the Spanish way
(issue 18): no '1.5'-style decimal point anywhere (``lessons/units.py`` gives '1,5')."""
from __future__ import annotations

import asyncio
import re

from textual.geometry import Region

from distai.lessons.registry import all_lessons
from distai.visualizers.base import visualizer_class
from pilot_harness import mounted

# a decimal point between digits ('1.5', '0.25'), not Spanish thousands ('16.384') nor a version
# or a dotted name ('Llama-3.1'); and English thousands ('9,903' where Spanish writes '9.903')
DECIMAL_POINT = re.compile(r"(?<![\w.,-])(?!\d{1,3}(?:\.\d{3})+(?![\d.,]))\d+\.\d+(?![\w.])")
ENGLISH_THOUSANDS = re.compile(r"(?<![\w.,-])[1-9]\d{0,2}(?:,\d{3})+(?![\d,])(?!,\d)")


def _screen_text(widget) -> str:
    out = []
    for node in [widget, *widget.query("*")]:
        if not node.display or not node.region.area:
            continue
        strips = node.render_lines(Region(0, 0, node.region.width, node.region.height))
        out.extend(strip.text for strip in strips)
    return "\n".join(out)


def test_every_visualizer_writes_spanish_numbers():
    by_name: dict[str, list[str]] = {}
    for lesson in all_lessons():
        for step in lesson.steps:
            name = step.visualizer or lesson.visualizer
            if name and visualizer_class(name) is not None:
                by_name.setdefault(name, []).append(step.key)

    async def draw(name: str, steps: list[str]) -> list[str]:
        bad = []
        async with mounted(visualizer_class(name), "es", size=(120, 40)) as (pilot, vis):
            for key in steps:
                vis.show_step(key)
                await pilot.pause()
                await pilot.app.workers.wait_for_complete()
                await pilot.pause()
                for line in _screen_text(vis).splitlines():
                    if DECIMAL_POINT.search(line) or ENGLISH_THOUSANDS.search(line):
                        bad.append(f"{name}/{key}: {line.strip()}")
        return bad

    bad = []
    for name, steps in by_name.items():
        bad += asyncio.run(draw(name, steps))
    assert not bad, "decimal points in Spanish:\n" + "\n".join(dict.fromkeys(bad))
