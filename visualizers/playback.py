"""The playback base: what every animated visualizer shares (one timer, play/pause, step, seek).

A subclass says how its animation moves (``advance``: on by ``dt`` seconds; ``seek``: by whole
frames; ``rewind``/``to_end``/``at_end``) and gets the reactive ``playing`` flag, the timer that
runs only while playing, the speed, and the actions of ``base.PLAYBACK_CONTROLS`` (space,
``,`` ``.``, ``0``, ``End``, ``-`` ``+``).
"""
from __future__ import annotations

import time
from typing import ClassVar

from textual.reactive import reactive
from textual.timer import Timer

from .base import LessonVisualizer

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # multiples of a visualizer's own pace


class PlaybackVisualizer(LessonVisualizer):
    """A lesson visualizer that animates (see the module docstring)."""

    TICK_S: ClassVar[float] = 1 / 25  # the timer's period while playing; nothing runs while paused
    playing: reactive[bool] = reactive(False)
    speed: reactive[float] = reactive(1.0)

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self._timer: Timer | None = None
        self._last_tick = time.monotonic()

    # -- what a subclass says --------------------------------------------------------------------
    def advance(self, dt: float) -> bool:
        """Move the animation on by ``dt`` seconds (already scaled by ``speed``); False once it
        has ended (playing stops)."""
        return False

    def seek(self, frames: int) -> None:
        """Move by ``frames`` whole frames (negative: back), clamped to the animation."""

    def rewind(self) -> None:
        """Back to the first frame."""

    def to_end(self) -> None:
        """To the last frame that can be shown."""

    def at_end(self) -> bool:
        """Whether the animation stands at its end (play then starts it again)."""
        return False

    # -- the machinery ---------------------------------------------------------------------------
    def on_mount(self) -> None:
        self._timer = self.set_interval(self.TICK_S, self._on_tick, pause=not self.playing)

    def watch_playing(self, playing: bool) -> None:
        self._last_tick = time.monotonic()
        if self._timer is not None:
            self._timer.resume() if playing else self._timer.pause()

    def _on_tick(self) -> None:
        now = time.monotonic()
        dt, self._last_tick = min(0.25, now - self._last_tick), now
        if self.playing and not self.advance(dt * self.speed):
            self.playing = False

    # -- actions (base.PLAYBACK_CONTROLS) --------------------------------------------------------
    def action_play(self) -> None:
        if not self.playing and self.at_end():
            self.rewind()  # play again from the start
        self.playing = not self.playing
        self.refresh()

    def action_step(self, frames: int) -> None:
        self.playing = False
        self.seek(frames)
        self.refresh()

    def action_restart(self) -> None:
        self.playing = False
        self.rewind()
        self.refresh()

    def action_to_end(self) -> None:
        self.playing = False
        self.to_end()
        self.refresh()

    def action_speed(self, delta: int) -> None:
        i = min(range(len(SPEEDS)), key=lambda j: abs(SPEEDS[j] - self.speed))
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + delta))]
        self.refresh()
