"""Helpers of the Textual tests: an event loop per test, one visualizer mounted alone, and what a
visualizer draws as plain text."""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from textual.app import App
from textual.pilot import Pilot
from textual.widget import Widget


async def wait_for(pilot: Pilot, predicate, timeout: float) -> bool:
    """Whether ``predicate()`` came true within ``timeout`` seconds, asked every 0.05 s of the app's time
    (a fixed pause lost a race on a loaded machine: the screen a key opens was not up yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await pilot.pause(0.05)
    return predicate()


def async_test(fn):
    """Run an async test in its own event loop (no pytest-asyncio needed)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))
    return wrapper


class VisualizerHost(App):
    """An app whose only widget is one visualizer, with id ``v`` (for ``pilot.click("#v")``)."""

    def __init__(self, visualizer_class: type[Widget], language: str = "en"):
        super().__init__()
        self.visualizer_class = visualizer_class
        self.visualizer_language = language

    def compose(self):
        yield self.visualizer_class(language=self.visualizer_language, id="v")


@asynccontextmanager
async def mounted(visualizer_class: type[Widget], language: str = "en",
                  size: tuple[int, int] = (120, 40)) -> AsyncIterator[tuple[Pilot, Widget]]:
    """The visualizer mounted, focused and drawn once in a ``size`` terminal: ``(pilot, visualizer)``."""
    app = VisualizerHost(visualizer_class, language)
    async with app.run_test(size=size) as pilot:
        vis = app.query_one(visualizer_class)
        vis.focus()
        await pilot.pause()
        yield pilot, vis


async def lesson_step(app, pilot: Pilot, lesson_id: str, step_key: str):
    """The tutor's lesson screen for ``lesson_id`` at its step ``step_key``, settled (``app``: a DistaiApp
    running under ``pilot``)."""
    app.open_lesson(lesson_id)
    await pilot.pause()
    screen = app.screen
    await screen.show_step(screen.lesson.step_index(step_key))
    await pilot.pause()
    return screen


def saved_run(runs_dir, lesson_id: str, events: list[dict], **fields):
    """A finished run of ``lesson_id`` saved under ``runs_dir`` (``fields`` set on its record, status ok by
    default) whose rank 0 recorded ``events``, as the tutor and ``distai runs`` find it."""
    import json

    from distai.engine.runs import create_run

    record = create_run(runs_dir, lesson_id, f"distai.engine.experiments.{lesson_id}",
                        config=fields.pop("config", {}))
    for name, value in {"status": "ok", **fields}.items():
        setattr(record, name, value)
    record.save()
    record.events_dir.mkdir(exist_ok=True)
    (record.events_dir / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return record


def drawn_text(vis, width: int, height: int | None = None) -> str:
    """What ``vis.build_lines`` draws in ``width`` columns (and ``height`` rows), as plain text."""
    return "\n".join(line.plain for line in vis.build_lines(width, height))


def scripted_launch(events: list[dict]):
    """A run panel's launch factory whose launch emits ``events`` at once, then ends the run ok (no ranks)."""

    class Launch:
        class spec:
            class placement:
                nproc = 2

        class record:
            id, path = "fake", "/tmp/fake"

        stopping = False

        def __init__(self, lesson, consumer, nproc=None, args=None):
            self.consumer = consumer

        def stop(self, reason="stopped"):
            pass

        def run(self):
            for e in events:
                self.consumer(e)
            self.consumer({"kind": "run_end", "status": "ok", "error": None, "exit_code": 0, "failed_rank": None,
                           "tail": [], "duration_s": 1.0, "t": 1.0})

    return Launch
