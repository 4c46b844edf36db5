"""Lesson 1's visualizer: the ring all-reduce, animated — simulated, or replayed from a real run.

N ranks (2–16) sit on a ring, one row each (rank r sends to the row below, the last rank to rank
0: ``↺``); every rank's buffer is cut into N chunks, drawn as cells labelled and coloured by how
many ranks' contributions the chunk holds (slate 1, blue 2 … orange N−1, green N = complete). The
2(N−1) steps play one after the other: in reduce-scatter a chunk leaves each rank (underlined)
and travels right (the ``●`` on the arrow), the receiver's cell adds it; in all-gather the
finished chunks spread. The status lines give the phase, step k of 2(N−1), the bytes each rank
has sent so far against 2(N−1)/N·S and the alpha-beta time so far; a comparison below shows the
busiest link's bytes, the steps and the time of the ring, a binomial tree and the naive
reduce-to-one + broadcast (``a`` animates those two with the same cells).

Everything drawn comes from the pure view model (``lessons/lesson1/ring_view.py``: the state, its
moves and the figures, over the models ``ring_plan.py``, ``ring_model.py``, ``baselines.py`` and
``formulas.py``), precomputed per (algorithm, N) and cached. ``feed_event`` takes the events of ``distai run lesson1`` (live or
replayed by the tutor, which does the reading: this module does no I/O): the ``ring_step``
events of a traced call replace the model's transfers with the ranks' own (checked against the
model), and the ``sweep``/``fit`` events draw the bandwidth chart (``g``; :func:`sweep_chart`,
also as the stand-alone :class:`SweepChart` widget).

One widget, rendered as Rich ``Text`` (no child widgets); the controls line is clickable.
"""
from __future__ import annotations

from rich.text import Text
from textual import events
from textual.reactive import reactive
from textual.strip import Strip

from ..lessons.lesson1 import ring_view as rv
from ..lessons.lesson1.ring_plan import (
    NAIVE,  # noqa: F401 - the algorithms' names, for callers and tests
    RING,
    TREE,  # noqa: F401
    Plan,
    model_plan,  # noqa: F401 - the simulated plans, for callers and tests
)
from ..lessons.lesson1.ring_run import RecordedCall, RingRun
from ..lessons.lesson1.ring_view import (  # noqa: F401 - the settings' range, for callers and tests
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_SIZE,
    N_MAX,
    N_MIN,
    SIZES,
    RingState,
)
from ..lessons.strings import has, strings
from ..lessons.units import format_bandwidth, format_plain, format_range, format_time
from .base import PLAYBACK_CONTROLS, Control, wrap_words
from .playback import PlaybackVisualizer
from .ring_chart import SweepChart, sweep_chart  # noqa: F401 - SweepChart: the run view's chart
from .ring_drawing import (
    ALGO_STYLE,
    PHASE_STYLE,
    RUN_COLOR,
    cell_style,
    count_rgb,  # noqa: F401 - the colour scale, for callers and tests
    fg_style,
    fmt_bytes,
    fmt_units,
    styled,
    text_strip,
    wrap_text,
)
from .view_state import StateOf

DEFAULT_SPEED = 1.0  # steps per second
FPS = 25  # the animation timer while playing (nothing runs while paused)
PROGRESS_LEVELS = 16  # visible positions of a message on its way: a frame is drawn when one changes
_START = RingState()


class RingVisualizer(PlaybackVisualizer):
    """The ring all-reduce (and the tree and naive all-reduces it beats), step by step.

    Its state is :class:`~distai.lessons.lesson1.ring_view.RingState`, one reactive attribute per
    field (a change repaints; ``progress`` repaints when the message moves a visible position);
    :class:`~distai.lessons.lesson1.ring_view.RingView` computes the next state and the figures."""

    can_focus = True
    TICK_S = 1 / FPS
    CONTROLS = PLAYBACK_CONTROLS + (
        Control("right_square_bracket", "ranks(1)", "ring.ranks",
                back_keys="left_square_bracket", back_action="ranks(-1)", hint=True),
        Control("s", "size(1)", "ring.size", back_keys="S", back_action="size(-1)"),
        Control("a", "algorithm", "ring.algorithm", hint=True),
        Control("g", "chart", "ring.chart"),
        Control("o", "load_run", "ring.load_run"),
        Control("m", "source", "ring.source"),
        Control("c", "next_call", "ring.next_call"),
    )
    DEFAULT_CLASSES = "panel"
    STEP_SETTINGS = frozenset({"show", "algorithm", "ranks", "size_bytes", "alpha_s", "beta_s_per_byte", "start_at",
                               "stop_at", "play", "source", "emphasis"})

    algorithm: reactive[str] = reactive(_START.algorithm)
    n: reactive[int] = reactive(_START.n)
    size_bytes: reactive[float] = reactive(_START.size_bytes)
    alpha: reactive[float] = reactive(_START.alpha)
    beta: reactive[float] = reactive(_START.beta)
    frame: reactive[int] = reactive(_START.frame)
    progress: reactive[float] = reactive(_START.progress, repaint=False)  # see watch_progress
    stop_at: reactive[int | None] = reactive(_START.stop_at, repaint=False)
    view: reactive[str] = reactive(_START.view)
    source: reactive[str] = reactive(_START.source)
    call: reactive[int | None] = reactive(_START.call)
    caption_key: reactive[str | None] = reactive(_START.caption_key)
    emphasis: reactive[str | None] = reactive(_START.emphasis)
    follow_run: reactive[bool] = reactive(_START.follow_run, repaint=False)
    run_version: reactive[int] = reactive(0)  # bumped by every event that changes what is drawn
    state = StateOf(RingState)  # the reactive attributes of its fields, as one RingState

    def __init__(self, language: str = "en", **kwargs):
        super().__init__(language=language, **kwargs)
        self.figures = rv.RingView()
        self.speed = DEFAULT_SPEED
        self.frames_rendered = 0
        self._strips: list[Strip] = []
        self._strips_key: tuple | None = None
        self._strip_cache: dict = {}
        self.hits: list[tuple[int, int, int, str]] = []  # (line, x0, x1, action)

    def watch_progress(self, old: float, new: float) -> None:
        if int(old * PROGRESS_LEVELS) != int(new * PROGRESS_LEVELS):
            self.refresh()  # only when the message moved a visible position

    # -- the state and what it shows (lessons/lesson1/ring_view.py) ------------------------------------
    @property
    def run(self) -> RingRun:
        return self.figures.run

    @property
    def recorded(self) -> RecordedCall | None:
        return self.figures.recorded(self.state)

    @property
    def plan(self) -> Plan:
        return self.figures.plan(self.state)

    @property
    def effective_n(self) -> int:
        return self.figures.effective_n(self.state)

    @property
    def effective_size(self) -> float:
        return self.figures.effective_size(self.state)

    @property
    def alpha_beta(self) -> tuple[float, float, bool]:
        """(α, β, from the run's fit?)"""
        return self.figures.alpha_beta(self.state)

    # -- public API (the lesson screen) ------------------------------------------------------------
    def show_step(self, step_key: str) -> None:
        """Set up what the step declares (``view = {...}`` in lessons/lesson1/lesson.toml): ``show =
        "chart"``, or the ring view's ``algorithm``, ``ranks``, ``size_bytes``, ``alpha_s`` and
        ``beta_s_per_byte``, the frame to start and to stop at (``start_at``/``stop_at``: where a
        phase begins), ``play``, ``source = "run"`` (the learner's run, once one is loaded) and the
        status line to stress (``emphasis``: ``bytes`` or ``time``). A step's caption is
        ``captions.<step>`` in lessons/catalog/ring.toml."""
        caption = step_key if has("ring", f"captions.{step_key}") else None
        view = self.step_view(step_key)
        self.state = self.figures.show_step(self.state, view, caption)
        if self.shows_run(step_key) and not self.run.sweep and not self.run.calls:
            # the step draws the learner's run: the latest one, if there is one (the tutor reads it; the chart
            # said "no sweep yet … press o" with runs saved)
            self.ask_for_the_latest_run()

    def feed_event(self, event: dict) -> None:
        """Fold the event into the run (``lessons/lesson1/ring_run.py``); a new run's first traced
        call takes over the view."""
        state = self.figures.feed(self.state, event)
        if state is not None:
            self.state = state
            self.run_version += 1

    # -- actions -----------------------------------------------------------------------------------
    # playback (visualizers/playback.py): a frame is one step, ``progress`` the way through it
    def at_end(self) -> bool:
        return self.figures.at_end(self.state)

    def rewind(self) -> None:
        self.state = rv.rewound(self.state)

    def to_end(self) -> None:
        self.state = self.figures.to_end(self.state)

    def seek(self, frames: int) -> None:
        self.state = self.figures.seek(self.state, frames)

    def advance(self, dt: float) -> bool:
        self.state = self.figures.advance(self.state, dt)
        return self.playing

    def action_play(self) -> None:
        if self.stop_at is not None and self.frame >= self.stop_at:
            self.stop_at = None
        super().action_play()

    def action_ranks(self, delta: int) -> None:
        self.state = self.figures.ranks(self.state, delta)

    def action_size(self, delta: int) -> None:
        self.state = rv.next_size(self.state, delta)

    def action_algorithm(self) -> None:
        self.state = rv.next_algorithm(self.state)

    def action_chart(self) -> None:
        self.state = rv.toggle_chart(self.state)

    def action_load_run(self) -> None:
        self.post_message(self.ReplayRequested(self))

    def action_source(self) -> None:
        state = self.figures.switch_source(self.state)
        if state is None:
            self.post_message(self.ReplayRequested(self))
        else:
            self.state = state

    def action_next_call(self) -> None:
        self.state = self.figures.next_call(self.state)

    # -- mouse -------------------------------------------------------------------------------------
    async def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        for y, x0, x1, action in self.hits:
            if offset.y == y and x0 <= offset.x < x1:
                event.stop()
                await self.run_action(action)
                return

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        event.stop()
        self.action_step(1)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        event.stop()
        self.action_step(-1)

    # -- rendering ---------------------------------------------------------------------------------
    # Textual's line API: the frame is laid out once (``build``), each line turned into a Strip of
    # segments directly, and lines that did not change since the last frame (title, legend,
    # comparison, controls…) reuse their Strip. Much cheaper than handing Textual one big Text.
    def _state_key(self) -> tuple:
        return (self.size, self.frame, int(self.progress * PROGRESS_LEVELS), self.playing, self.n, self.algorithm,
                self.size_bytes, self.alpha, self.beta, self.speed, self.view, self.source, self.call,
                self.run_version, self.caption_key, self.emphasis, self.language, self.rich_style)

    def _frame_strips(self) -> list[Strip]:
        key = self._state_key()
        if key == self._strips_key:
            return self._strips
        self.frames_rendered += 1
        width, height = self.size.width, self.size.height
        lines, self.hits = self.build(max(20, width), max(1, height))
        cache = self._strip_cache if len(self._strip_cache) < 4000 else {}
        strips = [text_strip(line, width, self.rich_style, cache) for line in lines[:height]]
        self._strip_cache = cache
        self._strips, self._strips_key = strips, key
        return strips

    def render_line(self, y: int) -> Strip:
        strips = self._frame_strips()
        if 0 <= y < len(strips):
            return strips[y]
        return Strip.blank(self.size.width, self.rich_style)

    def build(self, width: int, height: int) -> tuple[list[Text], list[tuple[int, int, int, str]]]:
        """The lines to draw in ``width`` × ``height`` cells, and the clickable regions."""
        s = strings("ring", self.language)
        state = self.state  # one snapshot for the whole frame
        controls, control_hits = self._controls(state, width)
        keys = [Text(line, style="dim") for line in wrap_words(self.controls_hint(), width)]
        if self.view == "chart":
            body = sweep_chart(self.run.sweep, self.run.fits, width,
                               max(3, height - len(controls) - len(keys)), self.language)
            room = height - len(body) - len(controls)
            return self._assemble([body, controls, keys[:max(0, room)]], control_hits, 1)

        n = self.effective_n
        if n > N_MAX:
            msg = [Text(s["too_many"].format(n=n), style="yellow")]
            return self._assemble([msg, controls, keys], control_hits, 1)
        plan = self.figures.plan(state)
        frame = self.figures.shown_frame(state)
        title = self._title(state, width)
        caption = []
        if self.caption_key and self.source == "sim":
            said: str | None = s["captions"][self.caption_key]
            phase, ending = self.figures.status(state, frame).phase, s.get("captions_end", {})
            if phase is None:  # played to the end: a start's caption is stale
                said = ending.get(self.caption_key, said)
            elif frame > 0 and self.caption_key in ending:  # mid-play, a start's caption is stale too: the phase's
                said = s["captions"].get(phase)  # own caption where the lesson has one (the tree's have none)
            caption = [Text(line, style="italic") for line in wrap_words(said, width)] if said else []
        header, rows = self._rows(plan, frame, width)
        status = self._status(state, plan, frame, width)
        base = len(title) + len(rows) + len(status) + len(controls)
        if base > height:  # short pane: the ranks on the left, the figures on the right?
            side_header, side_rows = self._rows(plan, frame, width - 33)
            side_row_w = max(line.cell_len for line in side_header + side_rows)
            if width - side_row_w - 3 >= 30:
                controls, control_hits = self._controls(state, width, max_lines=1)
                return self._side_by_side(state, plan, frame, width, height, title, side_header, side_rows,
                                          side_row_w, controls, control_hits, keys, caption)
        legend = self._legend(n, width)
        compare = self._comparison(state, plan, frame, width)
        # what must show, then what fits, most useful first
        fixed = len(title) + len(status) + len(controls)
        room = height - fixed
        shown_rows = rows
        if len(rows) > room:
            keep = max(1, room - 1)
            shown_rows = rows[:keep] + [styled(s["more_ranks"].format(k=len(rows) - keep), "dim")]
        room -= len(shown_rows)
        parts: dict[str, list[Text]] = {"header": [], "legend": [], "caption": [], "compare": [], "keys": [],
                                        "chart": []}
        for name, block in (("header", header), ("legend", legend), ("caption", caption),
                            ("compare", compare)):
            if block and len(block) <= room:
                parts[name] = block
                room -= len(block)
        chart_room = room - (len(keys) if room - len(keys) >= 12 else 0)  # a roomy chart, then the keys
        if self.run.sweep and chart_room >= 9:
            parts["chart"] = [Text("")] + sweep_chart(self.run.sweep, self.run.fits, width,
                                                      min(chart_room, 18) - 1, self.language)
            room -= len(parts["chart"])
        if len(keys) <= room:
            parts["keys"] = keys
            room -= len(keys)
        gaps = {}
        for after in (1, 4, 5, 6, 7):  # blank lines between sections while there is room
            if room > 0:
                gaps[after] = [Text("")]
                room -= 1
        blocks = [title, parts["caption"], parts["header"], shown_rows, parts["legend"], status,
                  parts["compare"], parts["chart"], controls, parts["keys"]]
        spaced: list[list[Text]] = []
        controls_at = 0
        for i, block in enumerate(blocks):
            if i == 8:
                controls_at = len(spaced)
            spaced.append(block)
            if block and i in gaps:
                spaced.append(gaps[i])
        return self._assemble(spaced, control_hits, controls_at)

    def _side_by_side(self, state, plan, frame, width, height, title, header, rows, row_w, controls,
                      control_hits, keys, caption):
        """A short, wide pane (the tutor at 80×24): the ranks on the left, the figures on the right."""
        s = strings("ring", self.language)
        side_w = width - row_w - 3
        status = self._status(state, plan, frame, side_w, stressed_first=True)  # what the step is about, first
        body_h = max(1, height - len(title) - len(controls))
        left = list(header) + rows if len(rows) + len(header) <= body_h else rows
        if len(left) > body_h:
            keep = max(1, body_h - 1)
            left = rows[:keep] + [styled(s["more_ranks_short"].format(k=len(rows) - keep), "dim")]
        right = list(status)
        for block in (self._comparison(state, plan, frame, side_w), self._legend(plan.n, side_w)):
            if len(right) + len(block) <= max(body_h, len(left)):
                right += block
        h = min(body_h, max(len(left), len(right)))
        body = []
        for y in range(h):
            line = left[y].copy() if y < len(left) else Text()
            line.truncate(row_w)
            line.pad_right(row_w - line.cell_len)
            line.append(" │ ", style="dim")
            if y < len(right):
                line.append_text(right[y])
            body.append(line)
        room = height - len(title) - len(body) - len(controls)
        extra = [b for b in (caption, keys) if b and len(b) <= room]
        blocks = [title, body, controls] + extra[:1]
        return self._assemble(blocks, control_hits, 2)

    @staticmethod
    def _assemble(blocks, control_hits, controls_index):
        lines: list[Text] = []
        hits = []
        for i, block in enumerate(blocks):
            if i == controls_index:
                hits = [(len(lines) + y, x0, x1, a) for y, x0, x1, a in control_hits]
            lines.extend(block)
        return lines, hits

    # -- pieces ------------------------------------------------------------------------------------
    def _title(self, state: RingState, width: int) -> list[Text]:
        s, lang = strings("ring", self.language), self.language
        t = Text()
        rec = self.figures.recorded(state)
        if rec is not None:
            t.append(s["run"], style=f"bold {RUN_COLOR}")
            label = (s["call_train"].format(k=rec.call) if rec.call < 1000 else s["call_sweep"])
            t.append(f" · {label} · N = {rec.n} · S = {fmt_bytes(rec.size, lang)}")
            calls = sorted(self.run.calls)
            if len(calls) > 1:
                t.append(" · " + s["calls"].format(i=calls.index(rec.call) + 1, n=len(calls)), style="dim")
        else:
            t.append(s["title"][self.algorithm], style=ALGO_STYLE[self.algorithm])
            t.append(f" · N = {self.n} · S = {fmt_bytes(self.size_bytes, lang)}")
        return wrap_text(t, width)

    def _status(self, state: RingState, plan: Plan, frame: int, width: int, stressed_first: bool = False) -> list[Text]:
        """The phase and step, the bytes sent and the α-β time, each wrapped to ``width``;
        ``stressed_first``: the line the step stresses (``emphasis``) leads, for a pane that has room
        for only the first few (the tutor at 80×24 cut the time off the alpha-beta step)."""
        s, lang = strings("ring", self.language), self.language
        st = self.figures.status(state, frame)
        size = self.figures.effective_size(state)
        line1 = Text()
        if st.finished_phase is not None:
            line1.append(s["phase"][st.finished_phase] + " ✓", style=PHASE_STYLE[st.finished_phase])
            line1.append(" → ")
        if st.phase is None:
            line1.append(s["done"], style="bold green")
        else:
            line1.append(s["phase"][st.phase], style=PHASE_STYLE[st.phase])
        line1.append(" · " + s["step"].format(k=frame, total=st.total))
        if st.waiting:
            line1.append(" · ")
            line1.append(s["waiting"].format(ranks=",".join(map(str, st.waiting))), style="yellow")
        elif self.playing:
            more = " · " + s["playing"].format(speed=format_plain(self.speed, lang))
            if line1.cell_len + len(more) <= width:
                line1.append(more, style="green")
        total_b = fmt_units(st.total_bytes, size, lang)
        if st.busiest is not None:
            line2 = Text(s["sent_busiest"].format(recv=fmt_units(st.busiest[0], size, lang),
                                                  sent=fmt_units(st.busiest[1], size, lang), total=total_b))
        elif st.sent_range is not None:
            lo, hi = fmt_bytes(st.sent_range[0], lang), fmt_bytes(st.sent_range[1], lang)
            line2 = Text(s["sent_ring"].format(sent=format_range(lo, hi), total=total_b))
        else:
            line2 = Text(s["sent_ring"].format(sent=fmt_units(st.sent, size, lang), total=total_b))
        line3 = Text(s["time"].format(t=format_time(st.time_now, lang=lang), total=format_time(st.time_all, lang=lang)))
        params = (s["time_fit"] if st.fitted else s["time_params"]).format(
            a=format_time(st.alpha, lang=lang), bw=format_bandwidth(1 / st.beta, lang=lang) if st.beta > 0 else "∞")
        line3.append(" " + params, style="dim")
        emphasis = self.emphasis if self.source == "sim" else None
        if emphasis == "bytes":
            line2.stylize("bold yellow")
        elif emphasis == "time":
            line3.stylize("bold yellow", 0, len(line3.plain) - len(params) - 1)
        lines = [line1, line2, line3]
        if stressed_first and emphasis in ("bytes", "time"):
            lines.insert(0, lines.pop(1 if emphasis == "bytes" else 2))
        out = []
        for line in lines:
            out.extend(wrap_text(line, width))
        if st.mismatches is not None:
            ok = st.mismatches == 0
            out.append(Text(s["model_ok"] if ok else s["model_bad"].format(k=st.mismatches),
                            style="green" if ok else "bold red"))
        return out

    def _rows(self, plan: Plan, frame: int, width: int) -> tuple[list[Text], list[Text]]:
        """Column header and one line per rank."""
        s = strings("ring", self.language)
        n = plan.n
        rank_w = len(f"r{n - 1}") + 1
        total = plan.total
        upcoming = frame < total and frame < plan.ready
        senders = plan.senders(frame) if upcoming else {}
        receivers = plan.receivers(frame) if upcoming else {}
        counts = plan.counts[frame]
        nxt = plan.counts[frame + 1] if upcoming else counts  # what the receivers blend to
        blend = int(self.progress * 8) if upcoming else 0
        # the arrow after the cells: " c12 ─●──▶r3"
        label_w = 0 if plan.whole_buffer else len(f"c{n - 1}") + 1
        arrow_w, dest_w = 5, len(f"r{n - 1}") + 1
        for cell_w in (3, 2):
            need = rank_w + cell_w * n + 1 + label_w + arrow_w + dest_w
            if need <= width:
                arrow_w += min(4, width - need)  # a longer arrow: a smoother trip
                break
        else:
            cell_w, arrow_w = 2, 3
            need = rank_w + cell_w * n + 1 + label_w + arrow_w + dest_w
            if need > width:
                dest_w = 0
        header = Text(" " * rank_w, style="dim")
        for c in range(n):
            lab = str(c) if (cell_w >= 3 or n <= 10 or c % 2 == 0) else ""
            header.append(lab.rjust(cell_w), style="dim")
        header.append("  " + s["sends"], style="dim")
        rows = []
        pos = min(arrow_w - 2, int(self.progress * (arrow_w - 1)))
        for r in range(n):
            line = styled(f"r{r}".ljust(rank_w), "bold")
            send = senders.get(r)
            recv = receivers.get(r)
            for c in range(n):
                k = counts[r][c]
                sending = send is not None and c in send.chunks
                if recv is not None and c in recv.chunks and blend:
                    style = cell_style(k, n, c % 2 == 1, sending, nxt[r][c], blend)
                else:
                    style = cell_style(k, n, c % 2 == 1, sending)
                line.append(str(k).rjust(cell_w), style=style)
            line.append(" ")
            if send is not None:
                payload = counts[r][send.chunks[0]]
                if label_w:
                    line.append(f"c{send.chunks[0]}".ljust(label_w - 1) + " ", style=fg_style(payload, n))
                arrow = ["─"] * (arrow_w - 1) + ["▶"]
                line.append("".join(arrow[:pos]), style="dim")
                line.append("●", style=fg_style(payload, n))
                line.append("".join(arrow[pos + 1:]), style="dim")
                if dest_w:
                    wrap = send.dst != r + 1
                    dest = f"r{send.dst}" + ("↺" if wrap and plan.algorithm == RING else "")
                    line.append(dest, style="bold")
            elif recv is not None and plan.whole_buffer:
                line.append(f"◀ r{recv.src}", style="dim")
            elif frame >= total and all(v == n for v in counts[r]):
                line.append("✓", style="bold green")
            rows.append(line)
        return [header], rows

    def _legend(self, n: int, width: int) -> list[Text]:
        s = strings("ring", self.language)
        for prefix, suffix in ((s["legend"] + " 1 ", f" {n} {s['complete']}"), ("1 ", f" {n} {s['complete']}"),
                               ("1 ", f" {n}")):
            if len(prefix) + n + len(suffix) <= width:
                break
        t = styled(prefix, "dim")
        for k in range(1, n + 1):
            t.append("█", style=fg_style(k, n, False))
        t.append(suffix, style="dim")
        return [t]

    def _comparison(self, state: RingState, plan: Plan, frame: int, width: int) -> list[Text]:
        """Busiest link, steps and α-β time of ring, tree and naive for the same N and S."""
        s, lang = strings("ring", self.language), self.language
        size = self.figures.effective_size(state)
        costs = self.figures.comparison(state, frame)
        top = max(c.link_bytes for c in costs) or 1.0
        texts = {c.algorithm: (fmt_units(c.link_bytes, size, lang), str(c.steps), format_time(c.time, lang=lang))
                 for c in costs}
        bw = max(len(t[0]) for t in texts.values())
        tw = max(len(t[2]) for t in texts.values())
        names = s["algorithm"]
        name_w = max(len(v) for v in names.values()) + 2
        bar_w = width - name_w - 1 - bw - 4 - tw - 2
        out = [Text(line, style="dim") for line in _fit_at(s["cmp_head"], " · ", width)]
        if bar_w < 4:
            bar_w = 0
        for c in costs:
            a, cur = c.algorithm, c.done_bytes is not None
            line = styled(("▸ " if cur else "  ") + names[a].ljust(name_w - 1), ALGO_STYLE[a] if cur else "")
            if bar_w:
                full = c.link_bytes / top * bar_w
                filled = min(full, c.done_bytes / top * bar_w) if c.done_bytes is not None else 0.0
                cells = max(1, round(full))
                lit = min(cells, round(filled))
                line.append("█" * lit, style=ALGO_STYLE[a].replace("bold ", ""))
                line.append("█" * (cells - lit), style=f"{ALGO_STYLE[a].replace('bold ', '')} dim")
                line.append(" " * (bar_w - cells))
            line.append(" " + texts[a][0].rjust(bw))
            line.append(texts[a][1].rjust(4), style="bold" if cur else "")
            line.append(" " + texts[a][2].rjust(tw))
            out.append(line)
        return out

    def _controls(self, state: RingState, width: int,
                  max_lines: int = 3) -> tuple[list[Text], list[tuple[int, int, int, str]]]:
        s = strings("ring", self.language)["controls"]
        rec_run = self.figures.recorded(state) is not None
        items = [(s["restart"], "restart"), (s["back"], "step(-1)"),
                 (s["pause"] if self.playing else s["play"], "play"), (s["fwd"], "step(1)"),
                 (s["slower"], "speed(-1)"), (s["faster"], "speed(1)"),
                 (s["n_down"], "ranks(-1)"), (s["n_up"], "ranks(1)"),
                 (s["s_down"], "size(-1)"), (s["s_up"], "size(1)"),
                 (strings("ring", self.language)["algorithm"][self.algorithm], "algorithm"),
                 (s["ring"] if self.view == "chart" else s["chart"], "chart"),
                 (s["source_sim"] if rec_run else (s["source_run"] if self.run.calls else s["load"]),
                  "source" if self.run.calls else "load_run")]
        total_w = sum(len(label) + 3 for label, _ in items) - 1
        lines_needed = 1 if total_w <= width else 2
        if lines_needed > max_lines:  # a one-line bar: |◀ goes (0 and Home still restart)
            items = items[1:]
            total_w = sum(len(label) + 3 for label, _ in items) - 1
        split_at = next(i for i, (_, a) in enumerate(items) if a == "ranks(-1)")
        lines, hits = [Text()], []
        x = 0
        for i, (label, action) in enumerate(items):
            w = len(label) + 2
            if x and (x + w > width or (i == split_at and total_w > width)):  # playback | settings
                lines.append(Text())
                x = 0
            if x:
                lines[-1].append(" ")
                x += 1
            lines[-1].append(f" {label} ", style="reverse")
            hits.append((len(lines) - 1, x, x + w, action))
            x += w
        return lines, hits



VISUALIZER = RingVisualizer


def _fit_at(text: str, separator: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` (a part longer than that alone on its line), broken only at
    ``separator`` (kept at a line's end): the comparison's column names, which Spanish makes wider than a
    narrow pane (they were dropped whole)."""
    parts = text.split(separator)
    lines = [parts[0]]
    mark = separator.rstrip()
    for k, part in enumerate(parts[1:], start=1):
        room = width - (len(mark) if k < len(parts) - 1 else 0)  # a line that continues ends in the mark
        if len(lines[-1]) + len(separator) + len(part) <= room:
            lines[-1] += separator + part
        else:
            lines[-1] += mark
            lines.append(part)
    return lines
