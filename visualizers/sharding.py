"""Lesson 2's visualizer: what every GPU holds under DDP, ZeRO-1, ZeRO-2 and ZeRO-3/FSDP.

One bar per GPU (rows, side by side), its length the bytes that GPU holds, split into its states:
``P`` parameters, ``G`` gradients, ``M`` fp32 master copy, ``m`` momentum, ``v`` variance (Adam) and
``A`` activations. The background colour of each cell is the *owner* of that slice: under DDP every
GPU holds every owner's slice of everything (all colours), a sharded state holds only its own. The
``┃`` line is the GPU's capacity; whatever lies past it is red and the total says it does not fit.

``space`` plays one ZeRO-3/FSDP training step (``.``/``,`` one phase at a time): each layer's
parameters are all-gathered before its forward, freed, gathered again before its backward, its
gradients reduce-scattered, with the bytes each rank has sent against DDP's. Keys: ``s`` strategy,
``+``/``-`` model size Ψ, ``]``/``[`` N, ``m`` precision, ``o`` optimizer, ``c`` capacity,
``a`` activations (none / selective / full recomputation), ``f`` prefetch. Numbers come from
:mod:`distai.lessons.lesson2.layout` (on top of the formulas). A run of the lesson's experiment
(``feed_event``) adds the bytes its ranks really held and sent. No torch, no I/O.
"""
from __future__ import annotations

from rich.text import Text
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Static

from ..lessons.lesson2 import formulas as F
from ..lessons.lesson2 import layout as L
from ..lessons.lesson2.sharding_run import ShardingRun
from ..lessons.strings import strings
from ..lessons.units import format_bytes, format_count, format_fixed, format_integer
from .base import Control, wrap_words
from .playback import PlaybackVisualizer

STRATEGIES = ("ddp", "zero1", "zero2", "zero3")
STRATEGY_NAME = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3 / FSDP"}
#: (label, Ψ, (layers, hidden, heads) or None). GPT-3 shapes: Brown et al. 2020, Table 2.1;
#: Llama 2 70B: Touvron et al. 2023. 7.5B is the ZeRO paper's example (no shape given there).
PRESETS = (
    ("1.3B", 1.3e9, (24, 2048, 24)),
    ("6.7B", 6.7e9, (32, 4096, 32)),
    ("7.5B", 7.5e9, None),
    ("13B", 13e9, (40, 5140, 40)),
    ("70B", 70e9, (80, 8192, 64)),
    ("175B", 175e9, (96, 12288, 96)),
)
DP_CHOICES = (1, 2, 4, 8, 16, 64, 256, 1024)
CAPACITIES = (24e9, 40e9, 80e9, 141e9)
OPTIMIZERS = ("adam", "sgd", "sgd-nomomentum")
PRECISIONS = ("mixed", "fp32")
ACTIVATIONS = (None, "none", "selective", "full")  # None: not shown; else the recomputation
SEQ, MICRO_BATCH = 2048, 1
ANIMATION_LAYERS = 4
MAX_BARS = 8
COMPACT_BELOW = 12  # rows of the bars' pane under which one GPU's bar stands for them all
OWNER_COLORS = ("dodger_blue2", "green3", "gold3", "magenta3", "turquoise2", "dark_orange3",
                "medium_purple2", "spring_green3")
LETTER = {"params": "P", "grads": "G", "master": "M", "momentum": "m", "variance": "v", "activations": "A"}
LABEL_W, VALUE_W = 7, 10


def segment_widths(sizes: list[float], cells_per_byte: float, cap_col: int, fits: bool) -> list[int]:
    """Cells for each of a bar's segments: each rounded on its own, so that equal states are equally wide,
    and at least one cell when it holds any bytes (a small state stays in sight); then trimmed or grown,
    largest first, so that the bar ends inside the capacity mark exactly when the bytes fit."""
    widths = [max(1, round(b * cells_per_byte)) if b > 0 else 0 for b in sizes]
    widest = lambda: max(range(len(widths)), key=widths.__getitem__)  # noqa: E731
    while fits and sum(widths) > cap_col and max(widths) > 1:
        widths[widest()] -= 1
    while not fits and widths and sum(widths) <= cap_col:
        widths[widest()] += 1
    return widths


class ShardingVisualizer(PlaybackVisualizer):
    """Per-GPU memory bars for DDP and ZeRO-1/2/3, and one ZeRO-3 step animated."""

    can_focus = True
    TICK_S = 0.6
    STEP_SETTINGS = frozenset({"strategy", "model", "gpus", "activations", "animate", "prefetch"})  # lessons/lesson2/lesson.toml
    CONTROLS = (
        Control("s", "cycle_strategy(1)", "sharding.cycle_strategy",
                back_keys="S", back_action="cycle_strategy(-1)", hint=True),
        Control("plus,equals_sign", "psi(1)", "sharding.psi",
                back_keys="minus,underscore", back_action="psi(-1)", hint=True),
        Control("right_square_bracket", "dp(1)", "sharding.dp",
                back_keys="left_square_bracket", back_action="dp(-1)", hint=True),
        Control("m", "precision", "sharding.precision"),
        Control("o", "optimizer", "sharding.optimizer"),
        Control("c", "capacity", "sharding.capacity"),
        Control("a", "activations", "sharding.activations"),
        Control("space", "play", "sharding.play", hint=True),
        Control("full_stop", "step(1)", "sharding.step", back_keys="comma", back_action="step(-1)"),
        Control("f", "prefetch", "sharding.prefetch"),
    )
    DEFAULT_CSS = """
    ShardingVisualizer { layout: vertical; }
    ShardingVisualizer #sh-scroll { height: 1fr; }
    ShardingVisualizer #sh-body { height: auto; padding: 0 1; }
    ShardingVisualizer #sh-buttons { height: 1; padding: 0 1; }
    ShardingVisualizer #sh-buttons Button { margin: 0 1 0 0; width: auto; min-width: 4; }
    """

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.strategy = "ddp"
        self.preset = 2  # 7.5B
        self.dp = 4
        self.precision = "mixed"
        self.optimizer = "adam"
        self.capacity = 80e9
        self.activations: str | None = None
        self.prefetch = False
        self.phase: int | None = None  # index into the ZeRO-3 step phases while animating
        self.run = ShardingRun()

    # -- model -----------------------------------------------------------------------------------
    @property
    def params(self) -> float:
        return PRESETS[self.preset][1]

    @property
    def shape(self):
        return PRESETS[self.preset][2]

    def activation_bytes(self) -> float:
        if self.activations is None or self.shape is None:
            return 0.0
        layers, hidden, heads = self.shape
        return F.activation_bytes(layers, SEQ, MICRO_BATCH, hidden, heads, recompute=self.activations)

    def current_layout(self) -> L.Layout:
        shown = self.shown_ranks()
        return L.layout(self.params, self.dp, self.strategy, self.optimizer, self.precision,
                        capacity=self.capacity, activations=self.activation_bytes(),
                        ranks=[r for r in shown if r is not None])

    def shown_ranks(self) -> list[int | None]:
        """The GPUs drawn (None marks the elided middle when N > MAX_BARS)."""
        if self.dp <= MAX_BARS:
            return list(range(self.dp))
        return [0, 1, 2, 3, None, self.dp - 2, self.dp - 1]

    def phases(self) -> list[L.Phase]:
        return L.zero3_step(self.params, self.dp, ANIMATION_LAYERS, self.precision, self.prefetch)

    def transient(self) -> list[L.Segment]:
        """Extra segments one GPU holds at the current phase of the ZeRO-3 step."""
        if self.phase is None:
            return []
        ph = self.phases()[self.phase]
        b = L.layer_bytes(self.params, ANIMATION_LAYERS, self.precision)
        owners = tuple(range(self.dp))
        out = [L.Segment("params", b, owners, False) for _ in ph.gathered]
        out += [L.Segment("grads", b, owners, False) for _ in ph.full_grads]
        return out

    # -- composition -----------------------------------------------------------------------------
    def compose(self):
        with VerticalScroll(id="sh-scroll"):
            yield Static(id="sh-body")
        with Horizontal(id="sh-buttons"):
            s = strings("sharding", self.language)
            yield Button(s["b_strategy"], id="sh-strategy", compact=True, variant="primary")
            yield Button(s["b_psi"], id="sh-psi", compact=True)
            yield Button(s["b_dp"], id="sh-dp", compact=True)
            yield Button(s["b_play"], id="sh-play", compact=True, variant="success")

    def on_mount(self) -> None:
        super().on_mount()
        self.refresh_view()

    def on_resize(self) -> None:
        self.refresh_view()

    # -- public API (the lesson screen) -------------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        view = self.step_view(step_key)  # lessons/lesson2/lesson.toml
        if not view:
            return
        self.strategy = view["strategy"]
        self.preset = next(i for i, p in enumerate(PRESETS) if p[0] == view["model"])
        self.dp = view["gpus"]
        self.activations = view.get("activations")
        self.prefetch = view.get("prefetch", False)
        self.playing = False
        self.phase = 0 if view.get("animate") else None
        self.refresh_view()

    def feed_event(self, event: dict) -> None:
        if self.run.feed(event):
            self.refresh_view()

    # -- actions -----------------------------------------------------------------------------------
    def action_cycle_strategy(self, step: int) -> None:
        self.strategy = _cycled(STRATEGIES, self.strategy, step)
        if self.strategy != "zero3":
            self.playing = False
            self.phase = None
        self.refresh_view()

    def action_psi(self, step: int) -> None:
        self.preset = max(0, min(len(PRESETS) - 1, self.preset + step))
        self.refresh_view()

    def action_dp(self, step: int) -> None:
        i = DP_CHOICES.index(self.dp) if self.dp in DP_CHOICES else 2
        self.dp = DP_CHOICES[max(0, min(len(DP_CHOICES) - 1, i + step))]
        self.refresh_view()

    def action_precision(self) -> None:
        self.precision = _cycled(PRECISIONS, self.precision)
        self.refresh_view()

    def action_optimizer(self) -> None:
        self.optimizer = _cycled(OPTIMIZERS, self.optimizer)
        self.refresh_view()

    def action_capacity(self) -> None:
        self.capacity = _cycled(CAPACITIES, self.capacity)
        self.refresh_view()

    def action_activations(self) -> None:
        self.activations = _cycled(ACTIVATIONS, self.activations)
        self.refresh_view()

    def action_prefetch(self) -> None:
        self.prefetch = not self.prefetch
        if self.phase is not None:
            self.phase = min(self.phase, len(self.phases()) - 1)
        self.refresh_view()

    def action_phase(self, step: int) -> None:
        self.strategy = "zero3"
        n = len(self.phases())
        self.phase = max(0, min(n - 1, (self.phase if self.phase is not None else -1) + step))
        self.refresh_view()

    # playback (visualizers/playback.py): one ZeRO-3 step, a phase per tick
    def at_end(self) -> bool:
        return self.phase is None or self.phase >= len(self.phases()) - 1

    def rewind(self) -> None:
        self.strategy = "zero3"
        self.phase = 0
        self.refresh_view()

    def to_end(self) -> None:
        self.action_phase(len(self.phases()))

    def seek(self, frames: int) -> None:
        self.action_phase(frames)

    def advance(self, dt: float) -> bool:
        if self.phase is None or self.at_end():
            return False
        self.phase += 1
        self.refresh_view()
        return True

    def watch_playing(self, playing: bool) -> None:
        super().watch_playing(playing)
        self.refresh_view()  # the Play button's label

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        {"sh-strategy": lambda: self.action_cycle_strategy(1), "sh-psi": self._cycle_psi,
         "sh-dp": self._cycle_dp, "sh-play": self.action_play}.get(event.button.id or "", lambda: None)()

    def _cycle_psi(self) -> None:
        self.preset = (self.preset + 1) % len(PRESETS)
        self.refresh_view()

    def _cycle_dp(self) -> None:
        self.dp = _cycled(DP_CHOICES, self.dp)
        self.refresh_view()

    # -- rendering ---------------------------------------------------------------------------------
    def refresh_view(self) -> None:
        if not self.is_mounted:
            return
        self.query_one("#sh-body", Static).update(self.render_body())
        play = self.query_one("#sh-play", Button)
        play.label = strings("sharding", self.language)["b_pause" if self.playing else "b_play"]

    def _fmt(self, n: float) -> str:
        return format_bytes(n, lang=self.language)

    def bar_width(self) -> int:
        width = self.size.width or 60
        return max(16, width - 2 - LABEL_W - VALUE_W - 3)

    def render_body(self) -> Text:
        s = strings("sharding", self.language)
        lay = self.current_layout()
        extra = self.transient()
        text = Text(no_wrap=True, overflow="ellipsis")
        # header
        k = F.optimizer_k(self.optimizer, self.precision)
        gpu0 = lay.gpus[0]
        total = gpu0.total + sum(x.bytes for x in extra)
        fits = total <= self.capacity
        # a short pane: one GPU's bar (the others hold the same bytes) and the verdict on the first line
        compact = self.is_mounted and 0 < self.query_one("#sh-scroll").size.height < COMPACT_BELOW
        text.append(STRATEGY_NAME[self.strategy], style="bold reverse")
        text.append(f"  Ψ = {format_count(self.params, lang=self.language)} · N = {self.dp}", style="bold")
        if compact:
            text.append(" · ")
            text.append_text(self._verdict(total, fits, total - gpu0.total))
        text.append("\n")
        text.append(f"{s['prec'][self.precision]} · {s['opt'][self.optimizer]} K = {k} · "
                    f"GPU {self._fmt(self.capacity)}\n", style="dim")
        # axis and bars
        width = self.bar_width()
        scale = max(self.capacity, total) * 1.05
        cap_col = round(self.capacity / scale * width)
        axis = " " * (LABEL_W + 1) + "0" + " " * max(0, cap_col - 1) + "┃ " + self._fmt(self.capacity)
        text.append(axis + "\n", style="dim")
        by_rank = {g.rank: g for g in lay.gpus}
        shown = [0, None] if compact and self.dp > 1 else self.shown_ranks()
        for rank in shown:
            if rank is None:
                hidden = self.dp - len([r for r in shown if r is not None])
                text.append(" " * (LABEL_W + 1) + s["more"].format(k=hidden) + "\n", style="dim")
                continue
            text.append_text(self._bar(by_rank[rank], extra, width, scale, cap_col))
            text.append("\n")
        # summary
        text.append_text(self._verdict(total, fits, total - gpu0.total))
        text.append("\n")
        text.append(s["states_line"].format(b=self._fmt(gpu0.model_states)))
        if self.activations is not None:
            if self.shape is None:
                text.append("\n" + s["act_noshape"], style="yellow")
            else:
                text.append(s["act_line"].format(b=self._fmt(gpu0.bytes_of("activations")),
                                                 mode=s["act_modes"][self.activations]))
        text.append("\n")
        text.append(s["redundancy"].format(x=_num(lay.redundancy, self.language)) + "\n", style="dim")
        fit = F.max_params_that_fit(self.capacity, self.dp, self.strategy, self.optimizer, self.precision,
                                    reserved_bytes=gpu0.bytes_of("activations"))
        text.append(s["largest"].format(p=format_count(fit, lang=self.language)) + "\n", style="dim")
        text.append_text(self._legend(gpu0))
        if self.phase is not None:
            text.append_text(self._animation(self.phase))
        if not self.run.empty:
            text.append_text(self._run())
        for line in wrap_words(self.controls_hint(), max(20, self.content_size.width - 2)):
            text.append(line + "\n", style="dim italic")
        return text

    def _verdict(self, total: float, fits: bool, in_flight: float = 0.0) -> Text:
        """"per GPU 116 GB · ✗ does not fit" (or "✓ fits"); during the ZeRO-3 step, what the formula counts
        and what the step gathers apart ("30 GB + 7.5 GB gathered now = 37.5 GB"): the text's 30 GB stays."""
        s = strings("sharding", self.language)
        per_gpu = s["per_gpu_now"].format(b=self._fmt(total - in_flight), t=self._fmt(in_flight),
                                          total=self._fmt(total)) if in_flight else s["per_gpu"].format(b=self._fmt(total))
        out = Text(per_gpu + " · ", style="bold")
        out.append("✓ " + s["fits"] if fits else "✗ " + s["nofit"], style="bold green" if fits else "bold red")
        return out

    def _bar(self, gpu: L.GPU, extra: list[L.Segment], width: int, scale: float, cap_col: int) -> Text:
        s = strings("sharding", self.language)
        out = Text()
        segments = list(gpu.segments) + extra
        total = sum(x.bytes for x in segments)
        fits = total <= self.capacity
        out.append(f"{s['gpu']} {gpu.rank:<{LABEL_W - 4}}"[:LABEL_W].ljust(LABEL_W) + "▕",
                   style="bold" if fits else "bold red")
        cells: list[tuple[str, str]] = []
        widths = segment_widths([x.bytes for x in segments], width / scale, cap_col, fits)
        c1 = 0
        for index, (seg, cells_wide) in enumerate(zip(segments, widths)):
            c0, c1 = c1, c1 + cells_wide
            transient = index >= len(gpu.segments)
            for c in range(c0, c1):
                if seg.state == "activations":
                    color = "grey50"
                elif len(seg.owners) == 1:
                    color = OWNER_COLORS[seg.owners[0] % len(OWNER_COLORS)]
                elif len(seg.owners) <= c1 - c0:  # a replica: every owner's slice, in owner order
                    k = int((c - c0) / (c1 - c0) * len(seg.owners))
                    color = OWNER_COLORS[seg.owners[k] % len(OWNER_COLORS)]
                else:  # more owners than cells: every cell stands for several, colours cycle
                    color = OWNER_COLORS[(c - c0) % len(OWNER_COLORS)]
                letter = LETTER[seg.state].lower() if transient and seg.state == "params" else LETTER[seg.state]
                style = f"bold black on {color}" + (" underline" if transient else "")
                cells.append((letter, style))
        for c in range(width):
            if c < len(cells):
                letter, style = cells[c]
                if c >= cap_col:
                    style = "bold white on red"
                out.append(letter, style=style)
            elif c == cap_col:
                out.append("┃", style="bold")
            else:
                out.append(" ")
        out.append(" " + self._fmt(total).rjust(VALUE_W - 1), style="bold" if fits else "bold red")
        return out

    def _legend(self, gpu: L.GPU) -> Text:
        s = strings("sharding", self.language)
        out = Text()
        for seg in gpu.segments:
            out.append(f" {LETTER[seg.state]} ", style="bold black on grey70")
            tag = "" if seg.state == "activations" else (" " + (s["shard"] if seg.sharded else s["replica"]))
            out.append(f" {s['states'][seg.state]} {self._fmt(seg.bytes)}{tag}\n")
        out.append(s["owners"], style="dim")
        for r in range(min(self.dp, len(OWNER_COLORS))):
            out.append(f" {r} ", style=f"bold black on {OWNER_COLORS[r]}")
        if self.dp > len(OWNER_COLORS):
            out.append(" …", style="dim")
        out.append("\n")
        return out

    def _animation(self, phase: int) -> Text:
        s = strings("sharding", self.language)
        phases = self.phases()
        ph = phases[phase]
        out = Text()
        pf = s["prefetch"] if self.prefetch else ""
        out.append(s["anim_title"].format(k=ANIMATION_LAYERS, pf=pf) + "\n", style="bold underline")
        what = s["actions"][ph.action].format(l=ph.layer)
        if ph.moved:
            what += f" (+{self._fmt(ph.moved)})"
        style = {"all_gather": "bold cyan", "reduce_scatter": "bold orchid", "free": "yellow"}.get(ph.action, "bold")
        out.append(s["phase"].format(i=phase + 1, n=len(phases), stage=s["stages"][ph.stage], what=what) + "\n",
                   style=style)
        gathered = ", ".join(f"L{g}" for g in ph.gathered) or s["none"]
        out.append(s["in_mem"].format(g=gathered) + "\n")
        last = phases[-1]
        out.append(s["sent"] + "\n")
        for name, value, end, color in (("ZeRO-3", ph.sent, last.sent, "cyan"),
                                         ("DDP", ph.sent_ddp, last.sent_ddp, "white")):
            out.append(f"{name:<7}")
            out.append_text(self._progress(value, end, last.sent, color))
            out.append(f" {self._fmt(value)} / {self._fmt(end)}\n")
        if last.sent_ddp:
            out.append(s["ratio"].format(x=format_fixed(last.sent / last.sent_ddp, 2, self.language)) + "\n", style="dim")
        return out

    def _progress(self, value: float, end: float, scale: float, color: str) -> Text:
        """``value`` sent so far out of ``end`` this step; both on a common ``scale``."""
        width = max(6, min(20, (self.size.width or 60) - 2 - 7 - 21))
        k = round(value / scale * width) if scale else 0
        e = round(end / scale * width) if scale else 0
        out = Text("█" * k, style=color)
        out.append("░" * max(0, e - k), style=color)
        out.append(" " * (width - max(e, k)))
        return out

    def _run(self) -> Text:
        s = strings("sharding", self.language)
        info = self.run.setup
        out = Text()
        out.append(s["run"].format(p=format_integer(info.get('num_params') or 0, self.language), n=info.get("world_size"),
                                   prec=info.get("precision")) + "\n", style="bold")
        for name, ev in self.run.memory.items():
            pred = ev.get("predicted") or 0
            ok = pred and abs(ev.get("total", 0) - pred) <= 0.05 * pred
            sent = self.run.sent_bytes(name)
            out.append("  " + s["run_row"].format(s=name, m=self._fmt(ev.get("total", 0)), c=self._fmt(pred),
                                                  x=self._fmt(sent) if sent is not None else "—"),
                       style="green" if ok else "yellow")
            out.append(" ✓\n" if ok else "\n", style="green")
        return out


def _cycled(choices: tuple, value, step: int = 1):
    """The choice ``step`` places after ``value`` (round the end; from the third when ``value`` is none of them)."""
    i = choices.index(value) if value in choices else 2
    return choices[(i + step) % len(choices)]


def _num(x: float, lang: str) -> str:
    return format_fixed(x, 1, lang) if abs(x - round(x)) > 0.05 else str(round(x))


VISUALIZER = ShardingVisualizer
