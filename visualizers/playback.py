"""The playback base: what every animated visualizer shares (one timer, play/pause, step, seek).

A subclass says how its animation moves (``advance``: on by ``dt`` seconds; ``seek``: by whole
frames; ``rewind``/``to_end``/``at_end``) and gets the reactive ``playing`` flag, the timer that
runs only while playing, the speed, and the actions of ``base.PLAYBACK_CONTROLS`` (space,
``,`` ``.``, ``0``, ``End``, ``-`` ``+``).

An animation costs a share of a core while it plays (lesson 5's pipeline 10 to 20 %), so it plays only
where it is seen and watched: its screen covered by another (the help, a quiz, the run panel) holds it
(:func:`hold_animations`), and one left to play alone for :attr:`PlaybackVisualizer.AUTO_PAUSE_S` pauses
(space plays it on). A looping one left open kept a core busy all day, behind the help window too.
"""
from __future__ import annotations

import time
from typing import ClassVar

from textual.dom import DOMNode
from textual.reactive import reactive
from textual.timer import Timer

from .base import LessonVisualizer

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # multiples of a visualizer's own pace


class PlaybackVisualizer(LessonVisualizer):
    """A lesson visualizer that animates (see the module docstring)."""

    TICK_S: ClassVar[float] = 1 / 25  # the timer's period while playing; nothing runs while paused
    AUTO_PAUSE_S: ClassVar[float] = 600.0  # played this long since the learner last started it: paused
    playing: reactive[bool] = reactive(False)
    speed: reactive[float] = reactive(1.0)

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self._timer: Timer | None = None
        self._last_tick = time.monotonic()
        self._held = False  # its screen is covered: the timer waits, ``playing`` stays as it was
        self._unattended_s = 0.0  # played since the learner last started it

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
        self._unattended_s = 0.0
        self._run_timer()

    def hold(self, held: bool) -> None:
        """Its screen covered (``held``) or shown again: the animation waits where it is meanwhile."""
        self._held = held
        self._run_timer()

    def _run_timer(self) -> None:
        self._last_tick = time.monotonic()
        if self._timer is not None:
            self._timer.resume() if self.playing and not self._held else self._timer.pause()

    def _on_tick(self) -> None:
        now = time.monotonic()
        dt, self._last_tick = min(0.25, now - self._last_tick), now
        if not self.playing:
            return
        self._unattended_s += dt
        if self._unattended_s > self.AUTO_PAUSE_S or not self.advance(dt * self.speed):
            self.playing = False
            self.refresh()

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


def hold_animations(screen: DOMNode, held: bool) -> None:
    """Every animation on ``screen`` waits while another screen covers it (``held``), and goes on after."""
    for visualizer in screen.query(PlaybackVisualizer):
        visualizer.hold(held)
