"""``distai runs export ID --format chrome-trace|csv|jsonl [-o FILE]``: a past run as files the
field's tools open (Perfetto / chrome://tracing for the trace, pandas or a notebook for the metrics).

Also ``distai runs`` (list) and ``distai runs show ID`` (replay). Imports only typer at module
level (the engine's pure-Python exporter and the run views are imported inside the commands).
"""
from __future__ import annotations

import errno
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import typer

from ..engine.runs import reason_text
from ..lessons.events import json_ready
from ..lessons.strings import os_error_text
from ..lessons.units import format_bytes, format_fixed, format_plain
from .cli import (
    HELP,
    CliError,
    adopt_language,
    app,
    fit_prose,
    lang_option,
    language_or_fail,
    lesson_or_fail,
    metavar,
    terminal_columns,
    write_failure_code,
    write_named_file,
)

# ------------------------------------------------------------------------------------ distai runs
RUNS = HELP["runs"]
runs_app = typer.Typer(help=RUNS["help"],
                       invoke_without_command=True, no_args_is_help=False)
app.add_typer(runs_app, name="runs")


def _duration(record, lang: str) -> str:
    return "—" if record.duration_s is None else format_fixed(record.duration_s, 1, lang) + " s"


@runs_app.callback(invoke_without_command=True)
def runs_list(
    ctx: typer.Context,
    lesson: str | None = typer.Option(None, "--lesson", "-l", metavar=metavar("lesson"), help=RUNS["lesson"]),
    as_json: bool = typer.Option(False, "--json", help=RUNS["json"]),
    limit: int = typer.Option(50, "--limit", "-n", metavar=metavar("int"), help=RUNS["limit"]),
    lang: str | None = lang_option(),
) -> None:
    if ctx.invoked_subcommand is not None:
        adopt_language(lang)  # distai runs --lang es show …
        return
    from ..lessons.strings import strings, translated

    language = language_or_fail(lang)
    say = strings("cli", language)["runs"]
    if limit < 1:  # "no runs yet" would be false
        raise CliError(translated("cli", "runs.errors.limit", language, value=limit))
    from ..engine.runs import list_runs, settle_killed
    from .paths import runs_root

    wanted = lesson_or_fail(lesson, language).id if lesson else None
    runs = [settle_killed(r) for r in list_runs(runs_root(), wanted)][:max(0, limit)]
    rows: list[dict[str, Any]] = [{"id": r.id, "lesson": r.lesson, "started": r.started, "status": r.effective_status,
             "duration_s": r.duration_s, "device": r.config.get("device"),
             "nproc": r.config["nproc"] * r.nodes if isinstance(r.config.get("nproc"), int) else None,
             "error": r.error, "failed_rank": r.failed_rank, "last_step": r.last_step, "path": r.path}
            for r in runs]
    if as_json:
        typer.echo(json.dumps(json_ready(rows), ensure_ascii=False, indent=2, allow_nan=False))
        return
    if not rows:  # none of this lesson's: say so, and how to make one
        typer.echo(say["empty_lesson"].format(lesson=wanted) if wanted else say["empty"])
        return
    for line in _runs_table(rows, runs, say, language):
        typer.echo(line)


def _runs_table(rows: list[dict[str, Any]], runs: list, say: dict, language: str) -> list[str]:
    """``distai runs``' lines: id, lesson, start, status, duration, processes, and under a failed run
    its reason. Where that is wider than the terminal, the lesson and start columns go (a run's id
    is its start and its lesson) and the reasons wrap under their mark."""
    columns = terminal_columns()
    width = max(len(r["id"]) for r in rows)
    table = [(say["id"], say["lesson_column"], say["started"], say["status"], say["duration"], say["procs"])]
    table += [(r["id"], r["lesson"], r["started"], say["statuses"].get(r["status"], r["status"]),
               _duration(rec, language), f"{r['nproc']}×{r['device']}" if r["nproc"] else "")
              for r, rec in zip(rows, runs)]
    status_width = max(11, *(len(cells[3]) for cells in table))

    def lines_of(whole: bool) -> list[str]:
        return [f"{run_id:<{width}}{f'  {lesson:<8} {started:<19}' if whole else ''}  "
                f"{status:<{status_width}} {duration:>9}  {proc}".rstrip()
                for run_id, lesson, started, status, duration, proc in table]

    head, *body = lines_of(True)
    if max(len(head), *map(len, body)) > columns:
        head, *body = lines_of(False)
    # imported here: cli_run, when imported first, loads this module through cli's end before it is whole
    from .cli_run import suspended_too_long

    lines = [head]
    for r, rec, line in zip(rows, runs, body):
        lines.append(line)
        if r["error"] and r["status"] != "ok":
            # its first 150 characters (runs show gives it whole), wrapped under the mark
            reason = suspended_too_long(rec, language, brief=True) or reason_text(r["error"], language) or ""
            if r["status"] == "stopped" and r["last_step"]:  # a killed run's reason names its step itself
                reason = say["reached"].format(reason=reason, step=r["last_step"])
            lines += fit_prose(f"{'':<{width}}  └ {reason[:150]}", columns)
    return lines


@runs_app.command("show", help=RUNS["show"])
def runs_show(
    run_id: str = typer.Argument(..., help=RUNS["show_id"], metavar=metavar("run")),
    as_json: bool = typer.Option(False, "--json", help=RUNS["show_json"]),
    speed: float = typer.Option(0.0, "--speed", metavar=metavar("float"), help=RUNS["show_speed"]),
    lang: str | None = lang_option(),
) -> None:
    from ..engine.run_state import replay_events
    from ..engine.runs import RunNotFound, find_run, settle_killed
    from ..lessons.strings import translated
    from .cli_run import JsonView, TerminalView, say_where_it_is, suspended_too_long
    from .paths import runs_root

    language = language_or_fail(lang)
    if not (speed >= 0 and math.isfinite(speed)):  # nan and inf included
        raise CliError(translated("cli", "runs.errors.speed", language, value=format_plain(speed, language)))
    try:
        record = settle_killed(find_run(runs_root(), run_id))
    except RunNotFound as exc:
        raise CliError(exc.text(language)) from None
    if not record.events_dir.is_dir():  # what the record says is all there is to replay
        typer.echo(translated("cli", "runs.errors.no_events", language, id=record.id, path=record.events_dir), err=True)
    events = replay_events(record)
    made_in = record.config.get("lang")
    if not as_json and made_in in ("en", "es") and made_in != language:  # the ranks' own lines stay as written
        key = "runs.made_in_summary" if rerender_summary(events, record.lesson, made_in, language) else "runs.made_in"
        typer.echo(translated("cli", key, language, lang=translated("cli", f"runs.lang_{made_in}", language)), err=True)
    view: JsonView | TerminalView
    if as_json:
        view = JsonView()
    else:
        view = TerminalView(f"distai runs show {record.lesson}", live=None if speed > 0 else False,
                            lesson=record.lesson, replay=True, lang=language)
    with view:
        prev_t = None
        for event in events:
            t = event.get("t")
            if speed > 0 and isinstance(t, (int, float)):
                if prev_t is not None and t > prev_t:
                    time.sleep(min(2.0, (t - prev_t) / speed))
                prev_t = t
            view(event)
    if not as_json:
        say_where_it_is(record, lambda key, **f: translated("cli", f"run_says.{key}", language, **f))
    if (why := suspended_too_long(record, language)) is not None:  # as `distai run` said it at the end
        typer.echo(f"distai: {why}", err=True)


#: what every experiment names the function that writes rank 0's printed summary from its summary event
#: alone, ``f(summary, lang) -> str``: ``runs show`` writes it again in the learner's language
SUMMARY_RENDERER = "summary_from_event"


def summary_renderer(lesson_id: str):
    """The lesson's experiment's :data:`SUMMARY_RENDERER`, or None (imports the experiment, and torch)."""
    import importlib

    from ..lessons.registry import UnknownLessonError, resolve_lesson

    try:
        lesson = resolve_lesson(lesson_id)
    except UnknownLessonError:  # a run of a lesson this version no longer has
        return None
    if not lesson.experiment:
        return None
    return getattr(importlib.import_module(lesson.experiment), SUMMARY_RENDERER, None)


def rerender_summary(events: list[dict], lesson: str, made_in: str, language: str) -> bool:
    """Rank 0's printed summary in ``events`` (a replay's), written again in ``language``: the summary event
    rendered in the run's language ``made_in`` must be found, line for line, among rank 0's output (else
    nothing changes: an older run, another version's wording); those lines are replaced. True if replaced.
    Imports the lesson's experiment (torch) only here, for a replay in another language."""
    from ..lessons.events import OUTPUT, SUMMARY

    summary = next((e for e in reversed(events) if SUMMARY.matches(e)), None)
    if summary is None:
        return False
    render = summary_renderer(lesson)
    if render is None:
        return False
    fields = {k: v for k, v in summary.items() if k not in ("kind", "t", "rank")}
    try:
        written, wanted = render(fields, made_in).splitlines(), render(fields, language).splitlines()
    except (KeyError, TypeError, ValueError):  # a summary recorded by another version of the experiment
        return False
    mine = [i for i, e in enumerate(events) if OUTPUT.matches(e) and e.get("rank") == 0]
    lines = [events[i]["line"] for i in mine]
    for start in range(len(lines) - len(written) + 1):
        if written and lines[start:start + len(written)] == written:
            at = mine[start:start + len(written)]
            if at != list(range(at[0], at[0] + len(at))):  # another rank's line in between: not one block
                continue
            template = events[at[0]]
            events[at[0]:at[-1] + 1] = [{**template, "line": line} for line in wanted]
            return True
    return False


EXPORT_FORMATS = {"chrome-trace": "trace.json", "csv": "metrics.csv", "jsonl": "metrics.jsonl"}


def default_export_path(run_path: str | os.PathLike, fmt: str, nodes: int = 1) -> Path:
    """Where ``distai runs export`` writes when no ``-o`` is given: beside the run's events (``nodes`` merged:
    beside node 0's, named for them, so that node 0's own export stays)."""
    name = Path(EXPORT_FORMATS[fmt])
    return Path(run_path) / (name.name if nodes == 1 else f"{name.stem}-{nodes}-nodes{name.suffix}")


#: what a run's folder holds (engine/runs.py, the launcher, lesson 3's checkpoints, --profile): never an export's target
RUN_OWN_FILES = ("run.json", "command.txt", "events", "logs", "torchrun", "checkpoints", "profile")


def write_export(path: Path, text: str, run_folder: Path, say, replace: bool = False) -> None:
    """Write an export at ``path``: a new or regular file through a temporary file and a rename (a reader
    never sees half of it; a link is followed, not replaced); anything else that exists and is not a
    regular file (a pipe, ``/dev/null``) written into as it is. Any run's own files (:data:`RUN_OWN_FILES`, in this run's
    folder or any under the runs folder) are refused: ``-o run.json`` inside a run's folder overwrote its
    record. An existing regular file is the learner's: replaced only with ``replace`` (:func:`~.cli.write_named_file`)."""
    if not (path.exists() and not path.is_file()):  # a pipe or /dev/null is no run's file
        _refuse_run_files(path, run_folder, say)
    write_named_file(path, text, replace, lambda: CliError(say("exists", path=path)))


def _refuse_run_files(path: Path, run_folder: Path, say) -> None:
    """A CliError where ``path`` is one of a run's own files, this run's or another's under the runs folder."""
    from .paths import runs_root

    target, root = path.resolve(), runs_root().resolve()
    folders = {run_folder.resolve()}
    if target.is_relative_to(root) and len(target.relative_to(root).parts) >= 2:
        folders.add(root / target.relative_to(root).parts[0])  # another run's folder
    for folder in folders:
        inside = target.relative_to(folder).parts if target.is_relative_to(folder) else ()
        if inside and inside[0] in RUN_OWN_FILES:
            raise CliError(say("run_file", path=path, run=folder))


def export_text(records, fmt: str, lang: str = "en") -> str:
    """The export in ``fmt`` as text of one run, or of the nodes of one multi-node run (``records``, each node's
    folder: their ranks merged into one timeline, each process named with its host); a trace that breaks the
    format's rules is refused (in ``lang``)."""
    from ..engine import trace_export as tx
    from ..lessons.strings import translated

    records = records if isinstance(records, list) else [records]
    seen: dict[int, str] = {}
    for record in records:
        if not record.events_dir.is_dir():
            raise CliError(translated("cli", "runs.errors.no_events", lang, id=record.id, path=record.events_dir),
                           code=1)
        for rank in sorted(record.event_ranks()):
            if rank in seen:  # two folders of one node, or of two runs: not one run's nodes
                raise CliError(translated("cli", "runs.errors.same_rank", lang, a=seen[rank], b=record.id, rank=rank))
            seen[rank] = record.id
    events = sorted((e for record in records for e in record.events()), key=lambda e: float(e.get("t") or 0.0))
    if fmt == "chrome-trace":
        # how the whole run ended: a node's own failure before another's "a rank on another node failed first"
        record = min(records, key=lambda r: (r.effective_status == "ok",
                                             (r.error or "").startswith("a rank on another node")))
        end = record.created + record.duration_s if record.duration_s is not None else None
        ended = {"status": record.effective_status, "error": record.error, "failed_rank": record.failed_rank, "t": end}
        nodes = len(records) > 1 or "--nnodes" in records[0].command
        hosts = {rank: r.host for r in records for rank in r.event_ranks() if r.host} if nodes else None
        trace = tx.chrome_trace(events, run_id="+".join(r.id for r in records), lesson=records[0].lesson, ended=ended,
                                hosts=hosts)
        if not any(e.get("ph") in ("X", "i") for e in trace["traceEvents"]):  # an empty timeline is no answer
            raise CliError(translated("cli", "runs.errors.no_timed_events", lang, id=record.id), code=1)
        problems = tx.check_trace(trace)
        if problems:  # never hand a viewer a file it would misdraw
            raise CliError(translated("cli", "runs.errors.bad_trace", lang, id=record.id, problem=problems[0]), code=1)
        return json.dumps(json_ready(trace), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    rows = tx.metric_rows(events)
    return tx.metrics_csv(rows) if fmt == "csv" else tx.metrics_jsonl(rows)


@runs_app.command("export", help=RUNS["export"])
def runs_export(
    run_ids: list[str] = typer.Argument(..., help=RUNS["export_ids"], metavar=metavar("run")),
    fmt: str = typer.Option("chrome-trace", "--format", "-f", metavar="chrome-trace|csv|jsonl",
                            help=RUNS["export_format"]),
    output: str | None = typer.Option(None, "--output", "-o", metavar=metavar("file"),
                                      help=RUNS["export_output"]),
    force: bool = typer.Option(False, "--force", help=RUNS["export_force"]),
    lang: str | None = lang_option(),
) -> None:
    from ..engine.runs import RunNotFound, find_run
    from ..lessons.strings import translated
    from .paths import runs_root

    language = language_or_fail(lang)
    say = lambda key, **f: translated("cli", f"runs.errors.{key}", language, **f)  # noqa: E731
    if fmt not in EXPORT_FORMATS:
        raise CliError(say("format", formats=", ".join(EXPORT_FORMATS), value=repr(fmt)))
    if output is not None and not output.strip():  # "" would quietly mean the default file
        raise CliError(say("empty_output"))
    try:
        records = [find_run(runs_root(), run_id) for run_id in run_ids]
    except RunNotFound as exc:
        raise CliError(exc.text(language)) from None
    text = export_text(records, fmt, language)
    record = records[0]  # the default file goes beside node 0's (or the one run's) events
    if output in ("-", "/dev/stdout", "/proc/self/fd/1"):  # stdout itself: a rename would replace what it appends to
        typer.echo(text, nl=bool(text) and not text.endswith("\n"))  # no metrics: nothing, not a blank line
        return
    path = Path(output).expanduser() if output else default_export_path(record.path, fmt, len(records))
    try:
        if path.is_dir():
            raise CliError(say("folder", path=path, example=path / EXPORT_FORMATS[fmt]))
        ours = path.resolve() == default_export_path(record.path, fmt, len(records)).resolve()  # its own: renewed
        write_export(path, text, Path(record.path), say, replace=force or ours)
    except OSError as exc:
        # the run's own folder refused it (another user's run, a read-only disk): -o is the way out
        key = "cannot_write_in_run" if not output and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "cannot_write"
        raise CliError(say(key, path=path, why=os_error_text(exc, language)), code=write_failure_code(exc)) from None
    typer.echo(say("wrote_trace" if fmt == "chrome-trace" else "wrote_metrics", path=path))


# ------------------------------------------------------------------------------ distai runs prune
@runs_app.command("prune", help=RUNS["prune"])
def runs_prune(
    keep: int = typer.Option(10, "--keep", "-k", metavar=metavar("int"), help=RUNS["prune_keep"]),
    older_than: float | None = typer.Option(None, "--older-than", metavar=metavar("days"), help=RUNS["prune_older_than"]),
    lesson: str | None = typer.Option(None, "--lesson", "-l", metavar=metavar("lesson"), help=RUNS["lesson"]),
    yes: bool = typer.Option(False, "--yes", "-y", help=RUNS["prune_yes"]),
    as_json: bool = typer.Option(False, "--json", help=RUNS["json"]),
    lang: str | None = lang_option(),
) -> None:
    from ..engine.prune import finish_removals, prune_plan, remove_runs
    from ..lessons.strings import translated
    from .paths import runs_root

    language = language_or_fail(lang)
    if keep < 0:
        raise CliError(translated("cli", "runs.errors.keep", language, value=keep))
    if older_than is not None and not (older_than >= 0 and math.isfinite(older_than)):
        raise CliError(translated("cli", "runs.errors.older_than", language,
                                  value=format_plain(older_than, language)))
    wanted = lesson_or_fail(lesson, language).id if lesson else None
    root = runs_root()
    plan = prune_plan(root, keep, None if older_than is None else older_than * 86400, wanted)
    failed: list = []
    if yes:
        finish_removals(root)  # what a prune killed midway had renamed
        plan.remove, failed = remove_runs(root, plan.remove)
    kept = {"running": plan.kept_running, "checkpoints": plan.kept_checkpoints, "elsewhere": plan.kept_elsewhere}
    if as_json:
        typer.echo(json.dumps({"removed": yes, "bytes": plan.bytes,
                               "runs": [{"id": r.id, "lesson": r.lesson, "status": r.status, "path": r.path}
                                        for r in plan.remove],
                               "kept": {why: [r.id for r in runs] for why, runs in kept.items()},
                               "failed": [{"id": r.id, "error": os_error_text(exc, language)} for r, exc in failed]},
                              ensure_ascii=False, indent=2))
    else:
        for line in _prune_lines(plan, kept, yes, language, failed=len(failed)):
            typer.echo(line)
    for run, exc in failed:  # the runs it could not remove: said, and the command fails
        typer.echo(translated("cli", "runs.errors.not_removed", language, id=run.id, why=os_error_text(exc, language)),
                   err=True)
    if failed:
        raise typer.Exit(1)


def _prune_lines(plan, kept: dict[str, list], removed: bool, language: str, failed: int = 0) -> list[str]:
    """``runs prune``'s report: the runs it would remove (a dry run), the total, and what it kept and why."""
    from ..lessons.strings import strings

    say = strings("cli", language)["runs"]
    said = say["prune_says"]

    def counted(key: str, n: int, **fields) -> str:  # a single run has its own words ("remove it", "se borraría")
        return said[f"{key}_one" if n == 1 else key].format(n=n, **fields)

    lines = [] if removed else [f"  {r.id}  {say['statuses'].get(r.status, r.status)}" for r in plan.remove]
    if plan.remove:
        lines.append(counted("removed" if removed else "would", len(plan.remove),
                             size=format_bytes(plan.bytes, lang=language)))
    elif not failed:  # "nothing to remove" would be false: the runs it could not remove follow
        lines.append(said["nothing"])
    lines += [counted(f"kept_{why}", len(runs)) for why, runs in kept.items() if runs]
    columns = terminal_columns()
    return [part for line in lines for part in fit_prose(line, columns)]
