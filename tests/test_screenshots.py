"""docs/screenshots.py, the README's pictures: its scenes name lessons, steps, visualizers and recorded
runs that exist, and each renders what its picture is of. The PNG conversion needs rsvg-convert, so
it is tested only where that tool is installed."""
from __future__ import annotations

import asyncio
import html
import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

from distai.lessons.registry import resolve_lesson

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("docs_screenshots", ROOT / "docs" / "screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


shots = _script()


def test_scenes_name_lessons_steps_visualizers_and_runs_that_exist():
    names = [s.name for s in shots.SCENES]
    assert names == ["ring", "pipeline", "mesh"] and len(set(names)) == len(names)
    for scene in shots.SCENES:
        lesson = resolve_lesson(scene.lesson)
        step = lesson.steps[lesson.step_index(scene.step)]
        assert (step.visualizer or lesson.visualizer) == scene.visualizer, scene
        assert (ROOT / "visualizers" / f"{scene.visualizer}.py").exists()
        if scene.run:
            events = shots.recorded_events(scene.run)
            assert events[0]["kind"] == "run_start" and events[0]["lesson"] == scene.lesson, scene
            assert events[-1]["kind"] == "run_end" and events[-1]["status"] == "ok"
        assert (shots.OUT / f"{scene.name}.png").exists(), f"docs/img/{scene.name}.png: run docs/screenshots.py"


def _text(svg: str) -> str:
    return " ".join(html.unescape(" ".join(re.findall(r">([^<]*)</text>", svg))).replace("\xa0", " ").split())


# what each picture is of, as the tutor draws it
SHOWS = {
    "ring": ("Ring all-reduce", "reduce-scatter · 2 of 6 steps done"),
    "pipeline": ("measured Interleaved 1F1B", "Run a real pipeline"),
    "mesh": ("mesh (pp, dp, cp, tp) = (2, 2, 2, 1) · ep 2", "261 KiB/261 KiB", "256 KiB/256 KiB", "edp", "PP: stage 0 sends the",
             "activation to stage 1"),
}


def test_the_mesh_picture_replays_the_command_its_step_shows():
    """The run-it step's text and its replay in one picture: the recorded run is its first command's."""
    scene = next(s for s in shots.SCENES if s.name == "mesh")
    command = shots.recorded_events(scene.run)[0]["command"]
    options = command[command.index("distai.engine.experiments.capstone") + 1:]
    del options[options.index("--steps"):options.index("--steps") + 2]  # the recording's length, not the lesson's
    shown = " ".join(resolve_lesson(scene.lesson).step_text(scene.step, "en").replace("\\\n", " ").split())
    assert f"distai run capstone --cpu {shots.recorded_events(scene.run)[0]['nproc']} {' '.join(options)}" in shown


@pytest.mark.parametrize("scene", shots.SCENES, ids=lambda s: s.name)
def test_each_scene_renders_what_its_picture_shows(scene):
    svg = asyncio.run(shots.scene_svg(scene))
    text = _text(svg)
    for words in SHOWS[scene.name]:
        assert words in text, (scene.name, words)
    assert "&#160;" not in shots.for_rsvg(svg) and 'xml:space="preserve"' in shots.for_rsvg(svg)


def test_png_conversion(tmp_path):
    if shutil.which(shots.CONVERTER) is None:
        pytest.skip(f"{shots.CONVERTER} is not installed (apt-get install librsvg2-bin)")
    svg = tmp_path / "a.svg"
    svg.write_text(shots.for_rsvg(asyncio.run(shots.scene_svg(shots.SCENES[0]))), encoding="utf-8")
    shots.to_png(svg, tmp_path / "a.png")
    data = (tmp_path / "a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 600_000
