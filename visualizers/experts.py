"""The Mixture-of-Experts visualizer: tokens leaving their ranks for their experts and coming back.

Three phases a step: **dispatch** (the rows each rank sends to each EP rank, its own kept at home),
**experts** (the load histogram: each expert's routing choices, the capacity line ``│`` and the
dropped choices ``✗`` beyond it), **combine** (the same rows going back). The model is one layer's
routing from :mod:`distai.lessons.experts.dispatch` (``[``/``]`` the capacity factor, ``d``
dropless, ``k`` top-1/top-2, ``s`` a router's skew); ``o`` replays the latest run of
``distai run experts``, step by step, with its real loads, drops and rows (all its MoE layers summed:
the capacity line stands at the layers' capacities added, the title gives one layer's). A run's view
follows its latest step as the steps arrive (the step the run's summary ends with), unless the
learner stepped back to an earlier one (``0`` the first step, ``,`` ``.`` a phase, ``End`` the latest).
Rich ``Text``; no torch, no I/O.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Group
from rich.text import Text

from ..lessons.experts.dispatch import Dispatch, simulate
from ..lessons.experts.experts_run import ExpertsRun
from ..lessons.strings import strings
from ..lessons.units import format_fixed, format_integer, format_percent
from .base import PLAYBACK_CONTROLS, Control, wrap_words
from .playback import PlaybackVisualizer

RANK_COLOURS = ("dodger_blue1", "orange1", "green3", "magenta", "yellow1", "cyan", "red1", "purple")
PHASES = ("dispatch", "experts", "combine")
CAPACITIES = (None, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)  # None: dropless
FRAME_S = 1.2


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


class ExpertsVisualizer(PlaybackVisualizer):
    """Dispatch, the experts' loads, combine (see the module docstring)."""

    can_focus = True
    DEFAULT_CLASSES = "panel"
    STEP_SETTINGS = frozenset({"capacity_factor", "top_k", "skew", "phase"})  # lessons/experts/lesson.toml
    CONTROLS = PLAYBACK_CONTROLS + (
        Control("right_square_bracket", "capacity(1)", "experts.capacity", back_keys="left_square_bracket",
                back_action="capacity(-1)", hint=True),
        Control("d", "dropless", "experts.dropless", hint=True),
        Control("k", "top_k", "experts.top_k", hint=True),
        Control("s", "skew", "experts.skew"),
        Control("o", "source", "experts.source", hint=True),
    )

    # what a step's view leaves unsaid: every step starts from it, not from the keys pressed on the step before
    DEFAULT_VIEW: Mapping[str, Any] = {"capacity_factor": 1.25, "top_k": 2, "skew": 0.6, "phase": "dispatch"}

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.capacity_factor: float | None = self.DEFAULT_VIEW["capacity_factor"]
        self.top_k, self.skew = self.DEFAULT_VIEW["top_k"], self.DEFAULT_VIEW["skew"]
        self.frame, self.progress = 0, 0.0
        self.source = "model"
        self.run = ExpertsRun()

    def tr(self) -> Mapping[str, Any]:
        return strings("experts", self.language)

    # -- what is drawn -------------------------------------------------------------------------------
    def steps(self) -> int:
        return len(self.run.loads) if self.source == "run" and self.run.loads else 1

    def shown_step(self) -> int:
        """The index of the run's step on show (0 for the model)."""
        return min(self.frame // len(PHASES), self.steps() - 1)

    def dispatch(self) -> Dispatch:
        """The step shown: the model's, or the run's loads (all layers summed, and so their capacities:
        the line the summed bars meet) at this frame's step."""
        if self.source == "run" and self.run.loads and self.run.config:
            c, load = self.run.config, self.run.loads[self.shown_step()]
            cap = None if load.capacity is None else load.capacity * load.layers
            return Dispatch(int(c["ep"]), int(c["experts"]), int(c["top_k"]), cap, load.routed, load.kept,
                            load.sent)
        return simulate(ep=4, experts=8, top_k=self.top_k, capacity_factor=self.capacity_factor, skew=self.skew)

    @property
    def phase(self) -> str:
        return PHASES[self.frame % len(PHASES)]

    # -- playback --------------------------------------------------------------------------------------
    def _last(self) -> int:
        return self.steps() * len(PHASES) - 1

    def advance(self, dt: float) -> bool:
        self.progress += dt
        if self.progress < FRAME_S:
            return True
        self.progress = 0.0
        if self.frame >= self._last():
            return False
        self.frame += 1
        self.refresh()
        return True

    def seek(self, frames: int) -> None:
        self.progress = 0.0
        self.frame = max(0, min(self._last(), self.frame + frames))

    def rewind(self) -> None:
        self.frame = 0

    def to_end(self) -> None:
        self.frame = self._last()

    def at_end(self) -> bool:
        return self.frame >= self._last()

    # -- the lesson screen -------------------------------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        view = self.step_view(step_key)  # lessons/experts/lesson.toml
        if not view and self.source == "run":  # a step without a view of its own keeps a run on show
            return
        view = {**self.DEFAULT_VIEW, **view}
        self.source = "model"
        factor = view["capacity_factor"]
        self.capacity_factor = None if factor is None or factor == "dropless" else float(factor)  # None: dropless
        self.top_k = int(view["top_k"])
        self.skew = float(view["skew"])
        self.frame = PHASES.index(view["phase"])
        self.playing = False
        self.refresh()

    def feed_event(self, event: dict) -> None:
        """A run's event: a run's view starts with its ``moe_config`` and follows its latest step while
        the learner stays on it (they stepped back: the frame stays where they put it)."""
        latest = not self.run.loads or self.frame // len(PHASES) >= len(self.run.loads) - 1
        if not self.run.feed(event):
            return
        if event.get("kind") == "moe_config":
            self.source, self.frame = "run", 0
        elif self.source == "run" and latest and self.run.loads:
            self.frame = (len(self.run.loads) - 1) * len(PHASES) + self.frame % len(PHASES)
        self.refresh()

    # -- actions -------------------------------------------------------------------------------------------
    def _to_model(self) -> None:
        if self.source == "run":
            self.source, self.frame = "model", self.frame % len(PHASES)

    def action_capacity(self, delta: int) -> None:
        self._to_model()
        i = CAPACITIES.index(self.capacity_factor) if self.capacity_factor in CAPACITIES else 4
        self.capacity_factor = CAPACITIES[max(1, min(len(CAPACITIES) - 1, i + delta))]
        self.refresh()

    def action_dropless(self) -> None:
        self._to_model()
        self.capacity_factor = 1.25 if self.capacity_factor is None else None
        self.refresh()

    def action_top_k(self) -> None:
        self._to_model()
        self.top_k = 1 if self.top_k == 2 else 2
        self.refresh()

    def action_skew(self) -> None:
        self._to_model()
        self.skew = {0.0: 0.6, 0.6: 1.5}.get(self.skew, 0.0)
        self.refresh()

    def action_source(self) -> None:
        if self.source == "run":
            self._to_model()
        elif self.run.config and self.run.loads:
            self.source, self.frame = "run", 0
        else:
            self.post_message(self.ReplayRequested(self))
        self.refresh()

    # -- drawing -------------------------------------------------------------------------------------------
    def render(self):
        size = self.content_size
        return Group(*self.build_lines(size.width or 80, size.height or None))

    def build_lines(self, width: int, height: int | None = None) -> list[Text]:
        width = max(40, width)
        tr, lang, d = self.tr(), self.language, self.dispatch()
        layers = self.moe_layers()
        limit = (tr["dropless"] if d.capacity is None
                 else tr["capacity"].format(c=format_integer(d.capacity // layers, lang)) if layers == 1
                 else tr["capacity_layer"].format(c=format_integer(d.capacity // layers, lang)))
        src = tr["src_run"].format(k=self.shown_step() + 1, n=self.steps()) if self.source == "run" \
            else tr["src_model"]
        out = [Text(tr["title"].format(e=d.experts, ep=d.ep, k=d.top_k, limit=limit, phase=tr[self.phase], src=src),
                    style="bold")]
        owners = Text(tr["owners"] + " ", style="grey62")
        local = d.experts // d.ep
        for r in range(d.ep):
            owners.append(f"R{r}[" + " ".join(f"e{r * local + i}" for i in range(local)) + "] ", style=_colour(r))
        out.append(owners)
        if self.phase == "experts":
            out += self._histogram(d, width)
        else:
            out += self._exchange(d, width, back=self.phase == "combine")
        dropped = sum(d.dropped)
        out.append(Text(tr["drops"].format(n=format_integer(dropped, lang),
                                           share=format_percent(dropped / max(1, sum(d.routed)), 3, lang)),
                        style="red" if dropped else "green"))
        out += [Text(line, style="grey50") for line in wrap_words(self.controls_hint(width), width)]
        return self.fit_height(out, height)

    def moe_layers(self) -> int:
        """How many MoE layers the step on show sums (1 for the model: one layer)."""
        if self.source == "run" and self.run.loads and self.run.config:
            return max(1, self.run.loads[self.shown_step()].layers)
        return 1

    def _exchange(self, d: Dispatch, width: int, back: bool) -> list[Text]:
        """Rows leaving each rank for each EP rank (dispatch), or coming back (combine), each on one
        line of ``width``: the bars as wide as the room lets them, the rows leaving the rank last where
        they fit."""
        tr, lang = self.tr(), self.language
        out = [Text(tr["combine_head" if back else "dispatch_head"], style="bold")]
        if not d.sent:
            return out + [Text(tr["no_rows"], style="grey50")]
        most = max(max(row) for row in d.sent) or 1
        ep = max(1, d.ep)
        num_w = max(len(format_integer(n, lang)) for row in d.sent for n in row)
        aways = [tr["away"].format(n=format_integer(sum(n for dest, n in enumerate(row) if dest != src % ep), lang))
                 for src, row in enumerate(d.sent)]
        fixed = len("R0 → ") + ep * len(f"R0  {'0' * num_w}  ")  # all but the bars and the rows leaving
        away_w = max(map(len, aways))
        show_away = (width - fixed - away_w) // ep >= 3
        bar_w = max(1, min(12, (width - fixed - (away_w if show_away else 0)) // ep))
        for src, row in enumerate(d.sent):
            home = src % ep
            line = Text(f"R{src} {'←' if back else '→'} ", style=_colour(src))
            for dest, n in enumerate(row):
                glyph = "·" if dest == home else ("◂" if back else "▸")
                line.append(f"R{dest} ", style=_colour(dest))
                line.append((glyph * max(1 if n else 0, round(bar_w * n / most))).ljust(bar_w), style=_colour(dest))
                line.append(f" {format_integer(n, lang):>{num_w}}  ")
            if show_away:
                line.append(aways[src], style="grey62")
            out.append(line)
        return out

    def _histogram(self, d: Dispatch, width: int) -> list[Text]:
        """Each expert's choices: kept (its owner's colour), the capacity line, dropped (✗)."""
        tr, lang = self.tr(), self.language
        out = [Text(tr["load_head"], style="bold")]
        layers = self.moe_layers()
        if d.capacity is not None and layers > 1:  # the bars sum the layers: so does the line
            out.append(Text(tr["cap_line"].format(l=layers, c=format_integer(d.capacity // layers, lang),
                                                  t=format_integer(d.capacity, lang)), style="grey62"))
        top = max(max(d.routed), d.capacity or 0) or 1
        bar_w = max(10, min(50, width - 28))
        for e, (routed, kept) in enumerate(zip(d.routed, d.kept)):
            owner = d.owner(e)
            line = Text(f"e{e:<3}R{owner} ", style=_colour(owner))
            kept_w = round(bar_w * kept / top)
            drop_w = round(bar_w * routed / top) - kept_w
            # on one scale: the kept, the dropped, the capacity line where it stands (one layer: where the
            # kept end; layers summed: an expert may drop in one layer below the line the layers add up to)
            cells = [("█", _colour(owner))] * kept_w + [("✗", "red")] * max(0, drop_w)
            if d.capacity is not None:
                cap_at = round(bar_w * d.capacity / top)
                cells += [(" ", "")] * max(0, cap_at - len(cells))
                cells.insert(cap_at, ("│", "bold white"))
            for ch, style in cells:
                line.append(ch, style=style)
            line.append(f" {format_integer(routed, lang)}")
            if routed > kept:
                line.append(" " + tr["dropped"].format(n=format_integer(routed - kept, lang)), style="red")
            out.append(line)
        mean = sum(d.routed) / len(d.routed)
        out.append(Text(tr["imbalance"].format(x=format_fixed(max(d.routed) / mean if mean else 0.0, 2, lang)),
                        style="grey62"))
        return out


VISUALIZER = ExpertsVisualizer
