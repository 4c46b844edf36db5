"""The README's pictures of the tutor, regenerated from the real app: ``python docs/screenshots.py``.

Each scene opens the tutor (``DistaiApp``) under Textual's pilot at a fixed terminal size, goes to a
lesson's step, feeds its visualizer a real run recorded in ``tests/recorded_runs/`` where the picture
shows one (as the tutor replays a run), stops the animation at a fixed frame, and saves what the
terminal shows as an SVG (Textual's ``export_screenshot``), then as a PNG with ``rsvg-convert``
(``apt-get install librsvg2-bin``) into ``docs/img/``, cut to 64 colours by ``pngquant`` where it is
installed (``apt-get install pngquant``):

- ``ring``: lesson 1's ring all-reduce, mid reduce-scatter;
- ``pipeline``: lesson 5's timelines of a real run, measured under simulated;
- ``mesh``: the capstone's five-axis mesh (pp, dp, cp, tp with experts inside dp·cp) replaying a real
  8-rank run of the first command its run-it step shows (``--dp 2 --tp 1 --pp 2 --cp 2 --ep 2 --moe
  --experts 4 --top-k 2``, recorded in ``tests/recorded_runs/capstone.5d.jsonl``), with its bytes per group.

``--svg-only`` stops at the SVGs (no rsvg-convert needed); ``--out DIR`` writes elsewhere; ``--only
ring,mesh`` picks scenes. Saved state goes to a temporary DISTAI_HOME, never the learner's.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "recorded_runs"
OUT = ROOT / "docs" / "img"
CONVERTER = "rsvg-convert"
SHRINKER = "pngquant"  # optional: 64 colours keep each picture near 100-170 KB instead of 400


@dataclass(frozen=True)
class Scene:
    name: str          # the picture's file name, without extension
    lesson: str        # a lesson's id
    step: str          # the key of the step shown
    visualizer: str    # the visualizer that step shows (checked)
    size: tuple[int, int] = (120, 36)
    run: str | None = None  # a recorded run in tests/recorded_runs/, fed to the visualizer
    frame: int = 0     # the animation frame the picture stops at (frames of the visualizer's playback)
    title: str = ""


SCENES = (
    Scene("ring", "lesson1", "reduce-scatter", "ring", frame=2,
          title="distai tutor · lesson 1: the ring all-reduce"),
    Scene("pipeline", "lesson5", "run-it", "pipeline", run="lesson5.jsonl", size=(120, 40),
          title="distai tutor · lesson 5: a real run's pipeline, measured under simulated"),
    Scene("mesh", "capstone", "run-it", "mesh", run="capstone.5d.jsonl", frame=3,
          title="distai tutor · capstone: the five-axis mesh (pp 2, dp 2, cp 2, tp 1, ep 2 inside dp·cp) on 8 ranks"),
)


def recorded_events(name: str) -> list[dict]:
    with open(RECORDED / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


async def scene_svg(scene: Scene) -> str:
    """What the tutor shows for ``scene``, as Textual's SVG."""
    from distai.tutor.app import DistaiApp

    app = DistaiApp("en")
    async with app.run_test(size=scene.size) as pilot:
        app.open_lesson(scene.lesson)
        await pilot.pause()
        screen = app.screen
        await screen.show_step(screen.lesson.step_index(scene.step))
        await pilot.pause()
        vis = screen.visualizer
        if type(vis).__module__.rsplit(".", 1)[-1] != scene.visualizer:
            raise RuntimeError(f"{scene.name}: step {scene.step!r} shows {type(vis).__name__}, not {scene.visualizer}")
        if scene.run:
            for event in recorded_events(scene.run):
                if event.get("kind") != "output":  # as the tutor replays a run (tutor/replay.py)
                    vis.feed_event(event)
            vis.show_step(scene.step)
        vis.playing = False  # a fixed frame, not wherever the clock got to
        vis.rewind()
        if scene.frame:
            vis.seek(scene.frame)
        vis.refresh()
        await pilot.pause(0.2)
        return app.export_screenshot(title=scene.title)


def for_rsvg(svg: str) -> str:
    """Textual writes spaces as no-break spaces and relies on the browser keeping them; librsvg
    collapses them, and the columns drift. Plain spaces kept by ``xml:space``."""
    return re.sub(r"<svg ", '<svg xml:space="preserve" ', svg.replace("&#160;", " "), count=1)


def to_png(svg_path: Path, png_path: Path) -> None:
    subprocess.run([CONVERTER, "--format", "png", "-o", str(png_path), str(svg_path)], check=True)
    if shutil.which(SHRINKER):
        subprocess.run([SHRINKER, "--force", "--speed", "1", "--output", str(png_path), "64", "--", str(png_path)],
                       check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="where the pictures go (default docs/img)")
    ap.add_argument("--svg-only", action="store_true", help="write the SVGs only (no rsvg-convert needed)")
    ap.add_argument("--only", default="", help="comma-separated scene names (default: all)")
    args = ap.parse_args(argv)
    chosen = [s for s in SCENES if not args.only or s.name in args.only.split(",")]
    if not args.svg_only and shutil.which(CONVERTER) is None:
        print(f"screenshots: {CONVERTER} not found; install it (apt-get install librsvg2-bin) or use --svg-only",
              file=sys.stderr)
        return 2
    if not args.svg_only and shutil.which(SHRINKER) is None:
        print(f"screenshots: {SHRINKER} not found: the PNGs keep all their colours (about 3x larger)", file=sys.stderr)
    os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as home:
        os.environ["DISTAI_HOME"] = home  # the tutor's progress store, not the learner's
        for scene in chosen:
            svg = asyncio.run(scene_svg(scene))
            if args.svg_only:
                (args.out / f"{scene.name}.svg").write_text(svg, encoding="utf-8")
                print(args.out / f"{scene.name}.svg")
                continue
            with tempfile.TemporaryDirectory() as tmp:
                svg_path = Path(tmp) / f"{scene.name}.svg"
                svg_path.write_text(for_rsvg(svg), encoding="utf-8")
                to_png(svg_path, args.out / f"{scene.name}.png")
            print(args.out / f"{scene.name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
