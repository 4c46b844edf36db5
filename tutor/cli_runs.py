"""``distai runs export ID --format chrome-trace|csv|jsonl [-o FILE]``: a past run as files the
field's tools open (Perfetto / chrome://tracing for the trace, pandas or a notebook for the metrics).

Registers on the ``distai runs`` group of :mod:`distai.tutor.cli_run`; imports only typer at
module level (the engine's pure-Python exporter is imported inside the command).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from .cli import CliError
from .cli_run import runs_app

EXPORT_FORMATS = {"chrome-trace": "trace.json", "csv": "metrics.csv", "jsonl": "metrics.jsonl"}


def default_export_path(run_path: str | os.PathLike, fmt: str) -> Path:
    """Where ``distai runs export`` writes when no ``-o`` is given: beside the run's events."""
    return Path(run_path) / EXPORT_FORMATS[fmt]


def export_text(record, fmt: str) -> str:
    """The run's export in ``fmt`` as text; a trace that breaks the format's rules is refused."""
    from ..engine import trace_export as tx

    events = record.events()
    if fmt == "chrome-trace":
        trace = tx.chrome_trace(events, run_id=record.id, lesson=record.lesson)
        problems = tx.check_trace(trace)
        if problems:  # never hand a viewer a file it would misdraw
            raise CliError(f"the trace of {record.id} breaks the Trace Event format: {problems[0]}", code=1)
        return json.dumps(trace, ensure_ascii=False, separators=(",", ":"))
    rows = tx.metric_rows(events)
    return tx.metrics_csv(rows) if fmt == "csv" else tx.metrics_jsonl(rows)


@runs_app.command("export")
def runs_export(
    run_id: str = typer.Argument(..., help="Run id (or a unique part of it, or `last`)."),
    fmt: str = typer.Option("chrome-trace", "--format", "-f",
                            help="chrome-trace (Perfetto, chrome://tracing), csv or jsonl (metrics: step, rank, name, value)."),
    output: str | None = typer.Option(None, "--output", "-o",
                                      help="Write here ('-' for stdout). Default: trace.json / metrics.csv / "
                                           "metrics.jsonl in the run's folder."),
) -> None:
    """Export a run's timeline as a Chrome trace, or its metrics as CSV / JSON lines."""
    from ..engine.runs import RunNotFound, find_run
    from .paths import runs_root

    if fmt not in EXPORT_FORMATS:
        raise CliError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    try:
        record = find_run(runs_root(), run_id)
    except RunNotFound as exc:
        raise CliError(str(exc)) from None
    text = export_text(record, fmt)
    if output == "-":
        typer.echo(text, nl=not text.endswith("\n"))
        return
    path = Path(output).expanduser() if output else default_export_path(record.path, fmt)
    try:
        if path.is_dir():
            raise CliError(f"{path} is a folder; give a file name (e.g. {path / EXPORT_FORMATS[fmt]})")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)  # a reader never sees half a file
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
    what = "trace (open it in ui.perfetto.dev or chrome://tracing)" if fmt == "chrome-trace" else "metrics"
    typer.echo(f"{what}: {path}")
