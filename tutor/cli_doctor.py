"""``distai doctor``: this machine's hardware, versions and bandwidth, with advice per lesson."""
from __future__ import annotations

import json
from typing import Any

import typer

from ..lessons.strings import strings, translated
from ..lessons.units import format_fixed, format_number, format_plain, format_time
from .cli import HELP, CliError, app, fit_prose, lang_option, language_or_fail, metavar, terminal_columns


def _gb_s(bps: float, lang: str) -> str:
    """A bandwidth in GB/s with two decimals (a column of them lines up)."""
    return f"{format_fixed(bps / 1e9, 2, lang)} GB/s"


def _size(n: int, lang: str) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{format_plain(n / div, lang)} {unit}"
    return f"{n} B"


def _gib(n: int | None, lang: str) -> str:
    return f"{format_fixed(n / (1 << 30), 1, lang)} GiB" if n else "?"


def doctor_lines(report: dict[str, Any], lang: str = "en", columns: int | None = None) -> list[str]:
    """``diagnose()``'s report as the lines ``distai doctor`` prints, in ``lang``: a label column
    (as wide as the language's longest label) and each line's text, numbers in ``lang``'s convention;
    with ``columns``, a text longer than that wraps under its column (``wrap_text``, never between a
    number and its unit), the advice under its indent."""
    say = strings("cli", lang)["doctor_says"]
    labels = say["labels"]
    m = report["machine"]
    gpu_labels = [labels["gpu"].format(index=g["index"]) for g in m["gpus"]]
    width = max(len(label) for label in [*(v for k, v in labels.items() if k != "gpu"), *gpu_labels]) + 1
    pad = " " * width
    lines: list[str] = []

    def line(label: str, text: str) -> None:
        if columns is None or width + len(text) <= columns:
            lines.append(f"{label:<{width}}{text}")
            return
        from rich.text import Text

        from ..visualizers.ring_drawing import wrap_text

        parts = [part.plain.rstrip() for part in wrap_text(Text(text), max(10, columns - width))]
        lines.extend([f"{label:<{width}}{parts[0]}", *(pad + part for part in parts[1:])])

    line(labels["machine"], f"{m['hostname']}  {m['platform']}")
    line(labels["cpus"], say["cpus"].format(usable=m["cpus_usable"], total=m["cpus"], model=m["cpu_model"] or "?",
                                            memory=_gib(m["memory_bytes"], lang)))
    line(labels["torch"], say["versions"].format(torch=m["torch"], cuda=m["cuda"] or "-", nccl=m["nccl"] or "-",
                                                 gloo=say["yes"] if m["gloo"] else say["no"], python=m["python"]))
    if m["gpus"]:
        for label, g in zip(gpu_labels, m["gpus"]):
            line(label, say["gpu"].format(name=g["name"], memory=_gib(g["memory_bytes"], lang),
                                          capability=g["capability"]))
        if m["topology"]:
            line(labels["topology"], say["topology"])
            lines.extend(pad + row for row in m["topology"].splitlines())
    else:
        line(labels["gpus"], say["no_gpus"])
    bw = report["bandwidth"]
    line(labels["memcpy"], say["memcpy"].format(bw=_gb_s(bw["host_memcpy_Bps"], lang)))
    line(labels["loopback"], say["loopback"].format(bw=_gb_s(bw["loopback_tcp_Bps"], lang)))
    ar = bw["allreduce"]
    line(labels["allreduce"], say["allreduce"].format(backend=ar["backend"], ranks=ar["ranks"]))
    for r in ar["results"]:
        lines.append(pad + say["row"].format(
            size=f"{_size(r['bytes'], lang):>8}", time=f"{format_fixed(r['time_s'] * 1e3, 2, lang):>8} ms",
            algbw=f"{_gb_s(r['algbw'], lang):>11}", busbw=f"{_gb_s(r['busbw'], lang):>11}"))
    link = ar["link"]
    beta = link["beta_s_per_byte"]
    line(labels["link"], say["link"].format(alpha=format_time(link["alpha_s"], lang=lang),
                                            beta=format_number(beta, 3, lang),
                                            bw=_gb_s(1 / beta, lang) if beta else "-"))
    lines.append(labels["advice"])
    for a in report["advice"]:
        why = translated("cli", f"doctor_says.why.{a['why']}", lang, ranks=a["ranks"], gpus=a["gpus_here"])
        lines.append("  " + say["advice"].format(lesson=a["lesson"], command=a["run"], why=why))
    cores = m["cpus_usable"] or 1
    crowded = max((a["ranks"] for a in report["advice"] if a["runs_on"] == "cpu"), default=0)
    if crowded > cores:  # more ranks than cores: say so before the learner reads the timings
        note = "  " + say["shared_cores"].format(ranks=crowded, cores=cores,
                                                 name=translated("checks", "cause.cpu_contention", lang))
        lines.extend([note] if columns is None else fit_prose(note, columns))
    return lines


@app.command(help=HELP["doctor"])
def doctor(
    as_json: bool = typer.Option(False, "--json", help=HELP["doctor_json"]),
    quick: bool = typer.Option(False, "--quick", help=HELP["doctor_quick"]),
    ranks: int = typer.Option(None, "--ranks", metavar=metavar("int"), help=HELP["doctor_ranks"]),
    lang: str | None = lang_option(),
) -> None:
    language = language_or_fail(lang)
    if ranks is not None and not 2 <= ranks <= 64:
        raise CliError(translated("cli", "doctor_says.ranks", language, value=ranks))
    from ..engine.doctor import diagnose

    report = diagnose(quick=quick, ranks=ranks)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    for text in doctor_lines(report, language, terminal_columns()):
        typer.echo(text)
    from ..engine.launcher import TorchTooOld, check_torch_version

    try:
        check_torch_version()
    except TorchTooOld as exc:  # what every `distai run` would refuse: said where the learner checks the machine
        typer.echo(f"distai: {exc.text(language)}", err=True)
