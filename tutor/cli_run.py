"""``distai run LESSON`` and ``distai runs [show ID]``: launch experiments, list and replay runs.

``distai run`` starts the lesson's experiment through torchrun (``distai.engine.launcher``)
and shows it live: a Rich view in a terminal, or one JSON object per event on stdout with
``--json``. Options it does not know (``--sweep-max 1MiB``, ``--fail-rank 2``, …) go to the
experiment unchanged. Exit status: 0 when the run succeeded, 1 when it failed, 130 when Ctrl-C
stopped it, 128 + the signal when a signal did (143: SIGTERM), 2 for a bad request.

Under the run, the lesson's checks (its predictions against what the run measured, and the causes
of each gap) as one table (``tutor/check_table.py``), the same in ``distai runs show`` and the tutor.

``distai runs`` lists past runs (id, lesson, date, status, duration, error);
``distai runs show ID`` replays one into the same views.

Imports only typer at module level (``distai --help`` loads this module): the engine, Rich and
the progress store are imported inside the commands.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

import typer

from ..engine.runs import phase_text, reason_text, resumable_checkpoints
from ..lessons.events import json_ready
from ..lessons.strings import TranslatedError, translated
from .cli import (
    HELP,
    LESSON_HELP,
    MIN_COLUMNS,
    CliError,
    app,
    default_ranks_text,
    fit_prose,
    lang_option,
    language_or_fail,
    lesson_or_fail,
    metavar,
    output_gone,
)

if TYPE_CHECKING:
    from rich.live import Live

SPARK = "▁▂▃▄▅▆▇█"


# ------------------------------------------------------------------------------------ helpers
def experiment_refusal(found: dict, lesson: str, lang: str) -> str:
    """The one line for what an experiment's ranks would refuse (``launcher.experiment_argument_error``),
    in ``lang``: an unknown option with the nearest of the experiment's own (or all of them), argparse's
    other messages through :func:`~distai.lessons.arg_errors.argparse_texts`, a usage error in its own words."""
    from ..lessons.arg_errors import argparse_texts, unknown_option_texts

    if found.get("texts", {}).get(lang):
        return found["texts"][lang]
    message = str(found.get("error", ""))
    unknown = unknown_option_texts(message, list(found.get("options", [])), lesson)
    if unknown:
        return unknown.get(lang) or message
    return argparse_texts(message).get(lang) or message


def refuse_what_the_ranks_would(lesson, args: list[str], world: int, lang: str) -> None:
    """A :class:`CliError` (one line) for what ``lesson``'s experiment would refuse in ``args`` on ``world``
    ranks, asked of one process before anything is launched (``distai run``, ``distai slurm``)."""
    from ..engine.launcher import experiment_argument_error

    found = experiment_argument_error(lesson.experiment, args, world, lang)
    if found is not None:
        raise CliError(experiment_refusal(found, lesson.id, lang))


def sparkline(values: list[float], width: int = 40) -> str:
    """Unicode block sparkline of the last ``width`` values (min → ▁, max → █)."""
    if not values:
        return ""
    vals = values[-width:]
    lo, hi = min(vals), max(vals)
    if hi - lo <= 0:
        return SPARK[3] * len(vals)
    return "".join(SPARK[min(7, int((v - lo) / (hi - lo) * 7.999))] for v in vals)


def _fmt_bytes(n: float, lang: str = "en") -> str:
    from ..lessons.units import format_bytes

    return format_bytes(n, binary=True, lang=lang)


def _fmt_bw(bps: float | None, lang: str = "en") -> str:
    from ..lessons.units import format_bandwidth

    return "—" if bps is None else format_bandwidth(bps, lang=lang)


def _fmt_time(s: float | None, lang: str = "en") -> str:
    from ..lessons.units import format_time

    return "—" if s is None else format_time(s, lang=lang)


def resume_command(record) -> str | None:
    """For a run that did not finish and left checkpoints in its folder (lesson 3's): the command that
    starts a new run on them, its own options kept (``--ckpt-dir`` the folder's checkpoints); else None."""
    import shlex

    checkpoints = resumable_checkpoints(record)
    if checkpoints is None:
        return None
    argv, kept = list(record.argv), []
    while argv:  # its own --run-dir would be taken: the new run gets a folder of its own
        arg = argv.pop(0)
        if arg == "--run-dir":
            argv[:1] = []
        elif not arg.startswith("--run-dir="):
            kept.append(arg)
    return shlex.join([*kept, "--ckpt-dir", str(checkpoints)])


def checked_restarts(lesson, max_restarts: int | None, lang: str) -> int:
    """torchrun's restarts for ``lesson``'s run: ``--max-restarts`` (0–100), else the lesson's own."""
    restarts = getattr(lesson, "max_restarts", 0) if max_restarts is None else max_restarts
    if not 0 <= restarts <= 100:
        raise CliError(translated("cli", "run_says.max_restarts", lang, value=restarts))
    return restarts


def steps_args(steps: int | None, lang: str) -> list[str]:
    """``--steps N`` as the experiment takes it (its own check bounds it above), or nothing; below 0 refused."""
    if steps is None:
        return []
    if steps < 0:
        raise CliError(translated("cli", "run_says.steps", lang, value=steps))
    return ["--steps", str(steps)]


def profile_traces_line(record, say) -> str | None:
    """What ``--profile`` left: the folder and how many traces are in it, or that there are none and why
    (each rank writes its trace as it ends normally; a stopped or failed run's ranks did not), or None
    when the run was not profiled."""
    from ..engine.profiling import profile_files

    profile_dir = record.config.get("profile_dir")
    if not profile_dir:
        return None
    n = len(profile_files(profile_dir))
    if n == 0:  # a run still going writes them as its ranks end
        return say("traces_later" if record.effective_status == "running" else "traces_none", path=profile_dir)
    return say("traces_files" if n != 1 else "traces_file", path=profile_dir, n=n)


def export_name(record) -> str:
    """What names ``record`` to ``distai runs export``: its id where the runs listing finds it by that id, else
    its folder (a run shown by its path, outside the listing: its id matched no run)."""
    import shlex

    from ..engine.runs import RunNotFound, find_run
    from .paths import runs_root

    folder = record.dir.resolve()
    try:
        # a run in the runs folder (every run but one made with --run-dir) without reading them all, as
        # find_run would after every run
        if folder.parent == runs_root().resolve() or find_run(runs_root(), record.id).dir.resolve() == folder:
            return record.id
    except (RunNotFound, OSError):
        pass
    return shlex.quote(str(record.dir))


def say_where_it_is(record, say) -> None:
    """After a run (and after its replay): its folder, its profiler traces, how to export it and how to
    resume it."""
    typer.echo(say("folder", path=record.path), err=True)
    traces = profile_traces_line(record, say)
    if traces:
        typer.echo(traces, err=True)
    typer.echo(say("export", id=export_name(record)), err=True)
    resume = resume_command(record)
    if resume:
        typer.echo(say("resume", command=resume), err=True)


def ranks_wait_s(extra: list[str]) -> float:
    """The shortest time the run's ranks wait for one another before giving up: the collectives' timeout or a
    named checkpoint's (lesson 1's ``--barrier-timeout`` over DISTAI_BARRIER_TIMEOUT_S). A timeout in the
    environment that is no number of seconds above 0 is a :class:`~distai.engine.experiment.UsageError`; an
    option's is the experiment's to refuse, before the launch."""
    from ..engine.experiment import barrier_timeout_s, collective_timeout_s

    barrier_flag = "--barrier-timeout"
    given = [a.split("=", 1)[1] if "=" in a else (extra[i + 1] if i + 1 < len(extra) else "")
             for i, a in enumerate(extra) if a == barrier_flag or a.startswith(barrier_flag + "=")]
    try:
        barrier = float(given[-1]) if given else None
    except ValueError:
        barrier = None
    return min(collective_timeout_s(), barrier_timeout_s(barrier))


def suspended_too_long(record, lang: str, brief: bool = False) -> str | None:
    """Why ``record``'s run failed, in ``lang``, where a Ctrl-Z kept it stopped at least as long as its ranks wait
    for one another: a rank tells a dead peer by its silence, and the deadline of a collective it was waiting in
    ran on while it was stopped, so on resuming they gave up. None for any other run. ``brief``: the reason
    alone, as ``distai runs`` lists it under the run, without how to suspend for longer."""
    from ..lessons.units import format_time

    if record.status != "failed" or record.suspended_s is None or record.ranks_wait_s is None:
        return None
    if record.suspended_s < record.ranks_wait_s:
        return None
    key = "run_says.suspended_reason" if brief else "run_says.suspended_too_long"
    return translated("cli", key, lang, suspended=format_time(record.suspended_s, lang=lang),
                      wait=format_time(record.ranks_wait_s, lang=lang))


def record_in_progress_store(record, lang: str = "en") -> None:
    """Note the run in the learner's progress store (never fails the run; a database found unreadable and
    moved aside is said, once, as every command that opens it says it)."""
    try:
        from .cli import warn_recovered
        from .progress import ProgressStore

        store = ProgressStore()
        try:
            store.record_run(record.id, record.lesson, record.effective_status, record.path)
        finally:
            store.close()
        warn_recovered(store, lang)  # after the run is noted: a terminal gone (EIO) must not lose that
    except Exception:  # noqa: BLE001 - progress is a convenience, the run folder is the record
        pass


# ------------------------------------------------------------------------------------ the view
def lesson_view(lesson: str | None, lang: str = "en"):
    """The lesson's own view of a run, drawn under the common one (its ``[run] terminal``), or None."""
    from ..lessons.registry import UnknownLessonError, resolve_lesson

    try:
        return resolve_lesson(lesson).terminal_view(lang) if lesson else None
    except UnknownLessonError:  # a run folder of a lesson this version does not have
        return None


def lesson_summary_is_output(lesson: str | None) -> bool:
    """Whether the lesson's summary is rank 0's printed output (its ``[run] summary``)."""
    from ..lessons.registry import UnknownLessonError, resolve_lesson

    if not lesson:
        return False
    try:
        return resolve_lesson(lesson).run.summary == "output"
    except UnknownLessonError:
        return False


#: the ranks' last lines shown under a run's view
TAIL_LINES = 6
#: the longest paragraph of rank 0's shown whole at the end of a run whose summary is the view
PARAGRAPH_LINES = 16


def last_paragraph(lines: list[str]) -> list[str]:
    """The lines after the last blank line of ``lines`` (trailing blank lines left out), or [] when
    they are more than :data:`PARAGRAPH_LINES` or there is no blank line: a paragraph a lesson printed
    whole, where its last six lines may begin inside a message that wraps."""
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    blank = max((i for i, text in enumerate(lines) if not text.strip()), default=None)
    if blank is None:
        return []
    paragraph = lines[blank + 1:]
    return paragraph if len(paragraph) <= PARAGRAPH_LINES else []


def output_lines(state, summary: bool, lang: str = "en", width: int | None = None):
    """The ranks' output under the view: the last six lines, each with its rank; once a run whose summary
    is rank 0's output ended well, that output whole, as rank 0 printed it (a table keeps its header);
    once a run whose summary is the view ended well, rank 0's last paragraph when it is short
    (:func:`last_paragraph`), so no line is cut from the message it continues. ``width``: rank 0's
    lines wrap to it under their own indent (:func:`~.cli.fit_prose`), not flush left."""
    from rich.text import Text

    def as_printed(lines: list[str]) -> Text:
        if width:
            lines = [part for line in lines for part in fit_prose(line, width)]
        return Text("\n" + "\n".join(lines))

    if state.finished and state.status == "ok":
        lines = [text for rank, text in state.output if rank == 0]
        # the launcher's own notices (logs cut short, a record not saved) stay under rank 0's words
        notices = [text for rank, text in state.output if rank is None and text.startswith("distai: ")]
        if summary:
            while lines and not lines[0].strip():
                lines.pop(0)
            return as_printed(lines + notices) if lines or notices else None
        paragraph = last_paragraph(lines)
        if paragraph:  # as rank 0 printed it, like a summary: a prefix would wrap its lines
            return as_printed(paragraph + notices)
        shown = list(state.output)[-TAIL_LINES:]
    elif state.finished and state.status == "stopped":
        # torchrun answers the stop with a SignalException traceback: noise here (the run panel hides it
        # too), kept in the run folder's logs/torchrun.log
        shown = [(rank, text) for rank, text in state.output if rank is not None][-TAIL_LINES:]
    else:
        shown = list(state.output)[-TAIL_LINES:]
    out = Text()
    for rank, text in shown:
        prefix = "torchrun " if rank is None else translated("cli", "view.rank", lang, rank=f"{rank:<3}")
        out.append(prefix, style="dim")
        # a long line goes on under its own text, not flush left under the rank ("rank 0   40 steps … redone;"
        # then "8 checkpoints …" at column 0)
        parts = fit_prose(text[:160], width - len(prefix) - 1) if width and width > len(prefix) + 20 else [text[:160]]
        out.append(" " + f"\n{' ' * (len(prefix) + 1)}".join(parts) + "\n")
    out.rstrip()
    return out if out else None


class Fields:
    """Styled fields on one line that wraps only between them ("step" / "40/40" and "finished ·" /
    "6.7 s" split at 80 columns); a field wider than the whole line wraps on its own."""

    def __init__(self, fields: list):
        self.fields = fields

    def __rich_console__(self, console, options):
        from rich.text import Text

        line = Text()
        for field in self.fields:
            if line.cell_len and line.cell_len + len(field.plain.rstrip()) > options.max_width:
                line.rstrip()
                yield line
                field = field[len(field.plain) - len(field.plain.lstrip()):]  # a new line starts at its text
                line = Text()
            line.append_text(field)
        line.rstrip()
        yield line


def labelled_line(text, width: int):
    """A view line that starts with its label ("ring   ", "fit    ", "ajuste "), wrapped to ``width`` with
    its later lines under its text, not under the label (``wrap_text``'s one rule for where to break)."""
    import re

    from rich.text import Text

    from ..visualizers.ring_drawing import wrap_text

    label = re.match(r"\S+\s+", text.plain)
    lines = wrap_text(text, width, label.end() if label else 2)
    for line in lines:
        line.rstrip()
    return Text("\n").join(lines)


def render_state(state, title: str = "distai run", extra=None, width: int = 100, now: float | None = None,
                 summary: bool = False, lang: str = "en"):
    """A Rich renderable of a :class:`~distai.engine.run_state.RunState` (plus a lesson's own view), in
    ``lang``;
    ``now`` (a live run's wall clock) keeps its clock running while the ranks start; ``summary``: the
    lesson's summary is rank 0's output (:func:`output_lines`)."""
    from rich.console import Group, RenderableType
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = []
    head: list[Text] = [Text(f"{title} ", style="bold")]  # fields: the line wraps between them, not inside
    if state.run_id:
        head.append(Text(f"· {state.run_id} ", style="dim"))
    if state.nproc:
        head.append(Text(f"· {state.placement_text(lang)} "))
    from ..lessons.strings import has
    from ..lessons.units import format_fixed, format_number

    say = lambda key, **f: translated("cli", f"view.{key}", lang, **f)  # noqa: E731
    status = translated("run", state.status, lang) if has("run", state.status) else state.status
    shown = (translated("run", "starting_status", lang) if state.ranks_starting
             else status if state.finished else (phase_text(state.phase, lang) or status))
    head.append(Text(f"· {shown} ", style="cyan"))
    head.append(Text(f"· {format_fixed(state.clock(now), 1, lang)} s", style="dim"))
    parts.append(Fields(head))
    if state.note:
        parts.append(Text(state.note, style="yellow"))
    bar = Table.grid(padding=(0, 1))
    if state.progress_known:
        bar.add_row(ProgressBar(total=1.0, completed=state.fraction, width=50), Text(f"{100 * state.fraction:3.0f}%"))
    elif not state.finished:  # phases only: a pulse while it runs, not 0 %
        bar.add_row(ProgressBar(total=None, width=50), Text(""))
    if bar.row_count:
        parts.append(bar)

    if state.losses:
        last = state.last_step or {}
        loss = Text(say("train"), style="bold")
        loss.append(say("loss", first=format_fixed(state.losses[0], 4, lang), last=format_fixed(state.losses[-1], 4, lang)))
        fields = [loss, Text(sparkline(state.losses, 40), style="green"),
                  Text(say("step", k=last.get("step", 0) + 1, n=state.steps_of or "?"))]
        if last.get("comm_s") is not None:
            fields.append(Text(say("comm", comm=_fmt_time(last["comm_s"], lang), compute=_fmt_time(last["compute_s"], lang)),
                               style="dim"))
        parts.append(Fields(fields))
    if extra is not None:
        parts.extend(extra.renderables(width))
    if state.checks:  # the lesson's predictions against this run's measurements (issue 28)
        from .check_table import check_table

        parts.append(check_table(state.checks, lang))
    if state.last_ring_step:
        r = state.last_ring_step
        parts.append(labelled_line(Text(say("ring", call=r.get("call"), k=r.get("step", 0) + 1, n=r.get("of"),
                                            phase=r.get("phase"), rank=r.get("rank"), chunk=r.get("chunk"),
                                            to=r.get("to"), size=_fmt_bytes(r.get("bytes", 0), lang),
                                            traced=state.ring_steps), style="magenta"), width))
    if state.ring_check:
        parts.append(labelled_line(Text(say("ring_check", diff=format_number(state.ring_check.get("max_abs_diff", 0),
                                                                             2, lang)), style="dim"), width))
    if state.sweep:
        table = Table(title=say("sweep"), title_justify="left", show_edge=False, pad_edge=False)
        for col in ("size", "ring_time", "ring_busbw", "ar_time", "ar_busbw", "ratio"):
            table.add_column(say(f"sweep_columns.{col}"), justify="right")
        for row in state.sweep:
            ratio = row["ring_busbw"] / row["ar_busbw"] if row.get("ar_busbw") else float("nan")
            table.add_row(_fmt_bytes(row["size"], lang), _fmt_time(row["ring_time_s"], lang),
                          _fmt_bw(row["ring_busbw"], lang), _fmt_time(row["ar_time_s"], lang), _fmt_bw(row["ar_busbw"], lang),
                          Text(format_fixed(ratio, 2, lang), style="green" if ratio >= 0.9 else "yellow"))
        parts.append(table)
    for impl, f in state.fits.items():
        name = say(f"impls.{impl}") if has("cli", f"view.impls.{impl}") else impl
        parts.append(labelled_line(Text(say("fit", impl=name, alpha=_fmt_time(f.get("alpha_s"), lang),
                                            beta=format_number(f.get("beta_s_per_byte", 0), 3, lang),
                                            bw=_fmt_bw(f.get("bandwidth"), lang)), style="dim"), width))
    out = output_lines(state, summary, lang, width)
    if out is not None:
        parts.append(out)
    if state.finished:
        style = {"ok": "bold green", "stopped": "bold yellow"}.get(state.status, "bold red")
        msg = Text(status, style=style)
        if state.duration_s is not None:
            msg.append(say("after", s=format_fixed(state.duration_s, 1, lang)), style="dim")
        if state.error:
            msg.append(f": {reason_text(state.error, lang)}")
        parts.append(msg)
        if state.tail and state.status == "failed":
            who = say("rank", rank=state.failed_rank) if state.failed_rank is not None else "torchrun"
            tail = Text(say("last_lines", who=who) + "\n", style="bold")
            shown = state.tail[-12:]
            if state.tail[0].startswith("(rank ") and state.tail[0] not in shown:  # whose lines these are, kept
                shown = [state.tail[0], *state.tail[-11:]]
            tail.append("\n".join("  " + t for t in shown), style="red")
            parts.append(tail)
    return Group(*parts)


class TerminalView:
    """Live Rich view in a terminal; a plain final render when stdout is not a terminal."""

    def __init__(self, title: str, live: bool | None = None, lesson: str | None = None, replay: bool = False,
                 lang: str = "en"):
        from rich.console import Console

        from ..engine.run_state import RunState

        self.state = RunState()
        self.lang = lang
        self.extra = lesson_view(lesson, lang)
        self.summary = lesson_summary_is_output(lesson)
        self.title = title
        self.replay = replay  # a replay's clock is its events' (a live one's runs from the launch)
        self.console = Console()
        self.live_enabled = self.console.is_terminal if live is None else live
        self._live: Live | None = None

    def __enter__(self):
        if self.live_enabled:
            from rich.live import Live

            self._live = Live(get_renderable=lambda: self.render(),
                              console=self.console, refresh_per_second=8, transient=False)
            self._live.__enter__()
        return self

    def render(self):
        import time

        return render_state(self.state, self.title, self.extra, max(MIN_COLUMNS, self.console.width),
                            now=None if self.replay else time.time(), summary=self.summary, lang=self.lang)

    def __call__(self, event: dict) -> None:
        from ..engine.run_state import feed_readable

        feed_readable(self.state, event)
        if self.extra is not None:
            feed_readable(self.extra, event)

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(*exc)
        else:
            self.console.print(self.render())
        return False


class JsonView:
    """One JSON object per event on stdout (flushed: a pipe sees it at once)."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.reader_gone = False

    def __enter__(self):
        return self

    def __call__(self, event: dict) -> None:
        if self.reader_gone:
            return
        try:
            self.out.write(json.dumps(json_ready(event), ensure_ascii=False, default=str, allow_nan=False) + "\n")
            self.out.flush()
        except OSError as exc:  # the run still ends properly (its record), only unseen from here on
            if not output_gone(exc):
                raise
            self.reader_gone = True

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------ distai run
@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, help=HELP["run"])
def run_cmd(
    ctx: typer.Context,
    lesson: str = typer.Argument(..., help=LESSON_HELP, metavar=metavar("lesson")),
    gpus: int | None = typer.Option(None, "--gpus", metavar=metavar("int"), help=HELP["run_gpus"]),
    cpu: int | None = typer.Option(None, "--cpu", metavar=metavar("int"), help=HELP["run_cpu"].format(ranks=default_ranks_text())),
    nnodes: int = typer.Option(1, "--nnodes", metavar=metavar("int"), help=HELP["run_nnodes"]),
    node_rank: int | None = typer.Option(None, "--node-rank", metavar=metavar("int"), help=HELP["run_node_rank"]),
    master_addr: str | None = typer.Option(None, "--master-addr", metavar=metavar("host"), help=HELP["run_master_addr"]),
    master_port: int | None = typer.Option(None, "--master-port", metavar=metavar("port"), help=HELP["run_master_port"]),
    rdzv_backend: str = typer.Option("static", "--rdzv-backend", metavar="static|c10d", help=HELP["run_rdzv_backend"]),
    rdzv_id: str | None = typer.Option(None, "--rdzv-id", metavar=metavar("name"), help=HELP["run_rdzv_id"]),
    join_timeout: int | None = typer.Option(None, "--join-timeout", metavar=metavar("seconds"), help=HELP["run_join_timeout"]),
    steps: int | None = typer.Option(None, "--steps", metavar=metavar("int"), help=HELP["run_steps"]),
    as_json: bool = typer.Option(False, "--json", help=HELP["run_json"]),
    run_dir: str | None = typer.Option(None, "--run-dir", metavar=metavar("folder"), help=HELP["run_dir"]),
    debug: bool = typer.Option(False, "--debug", help=HELP["run_debug"]),
    profile: bool = typer.Option(False, "--profile", help=HELP["run_profile"]),
    max_restarts: int | None = typer.Option(None, "--max-restarts", metavar=metavar("int"), help=HELP["run_max_restarts"]),
    lang: str | None = lang_option(),
) -> None:
    """Launch the lesson's real torch.distributed experiment (the help text is the catalog's ``cli.run``)."""
    language = language_or_fail(lang)
    say = lambda key, **f: translated("cli", f"run_says.{key}", language, **f)  # noqa: E731
    chosen = lesson_or_fail(lesson, language)
    from ..engine.launcher import (
        LaunchError,
        LaunchSpec,
        check_torch_version,
        choose_placement,
        experiment_available,
        validate_args,
        validate_nodes,
    )

    if not experiment_available(chosen.experiment):
        raise CliError(say("unavailable", n=chosen.number))
    restarts = checked_restarts(chosen, max_restarts, language)
    extra = list(ctx.args)
    if "-h" in extra or "--help" in extra:  # the experiment's own options (distai run LESSON -- --help): no launch
        from ..engine.launcher import experiment_help

        typer.echo(experiment_help(chosen.experiment, language), nl=False)
        raise typer.Exit(0)
    extra = steps_args(steps, language) + extra
    default_ranks = chosen.ranks
    try:
        check_torch_version()
        validate_nodes(nnodes, node_rank, master_addr, master_port, rdzv_backend, rdzv_id, lang=language,
                       join_timeout=join_timeout)
        validate_args(extra, language)
        placement = choose_placement(gpus=gpus, cpu=cpu, default_nproc=default_ranks, lang=language)
        plan = chosen.launch_plan_function()
        if plan is not None:
            given = cpu if cpu is not None else gpus
            cuda = placement.device == "cuda"
            ranks = plan(extra, None if given is None else given * nnodes, default_ranks, cuda)
            if given is None and ranks != placement.nproc * nnodes:
                placement = choose_placement(gpus=gpus, cpu=cpu, default_nproc=max(1, ranks // nnodes), lang=language)
                plan(extra, placement.nproc * nnodes, default_ranks, placement.device == "cuda")
        # options for the experiment, or a group of another size than its default: refused here as its ranks
        # would refuse them (tp = 3 dividing no heads), not after torchrun's failure banner
        if extra or placement.nproc * nnodes != default_ranks:
            refuse_what_the_ranks_would(chosen, extra, placement.nproc * nnodes, language)
        wait_s = ranks_wait_s(extra)  # DISTAI_COLLECTIVE_TIMEOUT_S=abc: one line here, not every rank's traceback
    except LaunchError as exc:
        raise CliError(str(exc), code=exc.code) from None
    except TranslatedError as exc:  # the shape or the experiment's plan refused: in the learner's language
        raise CliError(exc.text(language)) from None
    except ValueError as exc:  # the experiment's own plan refused the options
        raise CliError(str(exc)) from None
    from ..engine.runs import RunDirError, create_run
    from .paths import run_folder_error, runs_root

    root = runs_root()  # a DataHomeError of its own (DISTAI_HOME a file, or not writable): not the --run-dir's
    try:
        record = create_run(root, chosen.id, chosen.experiment, run_dir=run_dir,
                            argv=["distai", *sys.argv[1:]] if sys.argv else [])
    except FileExistsError:
        raise CliError(say("run_dir_taken", path=run_dir)) from None
    except RunDirError as exc:  # before OSError and ValueError: it is a ValueError
        raise CliError(say("run_dir_" + exc.why, path=exc.path or repr(exc.path))) from None
    except OSError as exc:  # a folder that cannot be made: in the learner's words, not "[Errno 2] …"
        # the folder the learner named, not the file inside it that failed first (".../x/run.json")
        raise CliError(run_folder_error(exc, run_dir or exc.filename or root).text(language)) from None
    except ValueError:
        raise CliError(say("run_dir_nul", path=repr(str(run_dir)))) from None
    spec = LaunchSpec(chosen.experiment, placement, extra, nnodes=nnodes, node_rank=node_rank,
                      master_addr=master_addr, master_port=master_port, rdzv_backend=rdzv_backend,
                      rdzv_id=rdzv_id, join_timeout=join_timeout, debug=debug, profile=profile, lang=language)
    if placement.note and as_json:  # the live view shows it itself
        typer.echo(f"distai: {placement.note}", err=True)
    view = JsonView() if as_json else TerminalView(f"distai run {chosen.id}", lesson=chosen.id, lang=language)
    from ..engine.supervisor import make_launch

    launch = make_launch(spec, record, consumer=view, max_restarts=restarts)

    stopped_by: list[int] = []

    def on_signal(signum, frame):  # closing the terminal or `kill`: stop the ranks too
        stopped_by.append(signum)
        launch.stop(f"stopped by {signal.Signals(signum).name}")

    suspensions: list[float] = []  # seconds each Ctrl-Z kept the run stopped

    def on_suspend(signum, frame):  # Ctrl-Z: the ranks (in a session of their own) stop with the command, and go on
        launch.signal_processes(signal.SIGSTOP)  # with it (fg, bg); they ran on, filling the pipe nobody read
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        stopped_at = time.monotonic()  # CLOCK_MONOTONIC runs on while the process is stopped, as gloo's deadlines do
        os.kill(os.getpid(), signal.SIGTSTP)  # stopped here, as the shell expects, until SIGCONT
        suspensions.append(time.monotonic() - stopped_at)
        signal.signal(signal.SIGTSTP, on_suspend)
        launch.signal_processes(signal.SIGCONT)

    # a SIGHUP inherited as ignored (`nohup distai run …`) stays ignored: the run was asked to outlive the terminal
    watched = [s for s in (signal.SIGTERM, signal.SIGHUP) if s != signal.SIGHUP or signal.getsignal(s) != signal.SIG_IGN]
    previous = {s: signal.signal(s, on_signal) for s in watched}
    if signal.getsignal(signal.SIGTSTP) != signal.SIG_IGN:
        previous[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, on_suspend)
    # Ctrl-C stops the run even where SIGINT was inherited as ignored (a background job)
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupted = terminal_gone = False
    try:
        with view:
            try:
                launch.start()
            except OSError as exc:
                raise CliError(say("no_torchrun", error=exc), code=1) from None
            except KeyboardInterrupt:  # Ctrl-C while torchrun was being spawned: the run below starts stopped
                interrupted = True     # (its processes, if any, are told to stop as they start) and its record
                launch.stop("interrupted (Ctrl-C)")  # says "interrupted", not "killed before its first step"
            record_in_progress_store(record, language)
            try:
                record = launch.run()
            except KeyboardInterrupt:
                interrupted = True
                record = launch.record
    except OSError as exc:  # the terminal closed (SIGHUP): the view's last write fails
        if not output_gone(exc):
            raise
        terminal_gone, record = True, launch.record
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if suspensions:  # kept with the run, so that its replay explains a failure it caused (runs show)
        record.suspended_s, record.ranks_wait_s = max(suspensions), wait_s
        with contextlib.suppress(OSError):  # a full disk: the record keeps what the launcher saved
            record.save()
    record_in_progress_store(record, language)
    if not as_json and not terminal_gone:
        try:
            say_where_it_is(record, say)
        except OSError as exc:
            if not output_gone(exc):
                raise
    if stopped_by and not interrupted:  # the shell's 128 + the signal: 143 for SIGTERM, 129 for SIGHUP
        raise typer.Exit(128 + stopped_by[0])
    if record.status == "stopped" and (record.error or "").startswith("the live view failed: "):
        # its output could not be written (a full disk): an error of its own, not an interruption
        with contextlib.suppress(OSError):
            typer.echo(f"distai: error: {reason_text(record.error, language)}", err=True)
        raise typer.Exit(1)
    if interrupted or record.status == "stopped":
        raise typer.Exit(130)
    if record.status != "ok":
        with contextlib.suppress(OSError):
            if (why := suspended_too_long(record, language)) is not None:
                typer.echo(f"distai: {why}", err=True)
        raise typer.Exit(1)
