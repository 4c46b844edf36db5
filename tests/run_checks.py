"""A run's ``check`` events, as a test reads them (issue 28): each one ok, or explained by its
causes within its tolerance (``lessons/checks.explained``), its name and its causes' names keys of
``lessons/catalog/checks.toml`` in both languages."""
from __future__ import annotations

import re

import pytest

from distai.lessons.checks import reconcile
from distai.lessons.strings import strings


def checks_of(events: list[dict]) -> dict[str, dict]:
    """The run's check events by name."""
    return {e["name"]: e for e in events if e.get("kind") == "check"}


def assert_checks_hold(events: list[dict], names: set[str]) -> dict[str, dict]:
    """Every check of ``names`` is there, ok or explained, and named in the catalog; returns them."""
    found = checks_of(events)
    assert names <= set(found), f"missing checks {sorted(names - set(found))}"
    for lang in ("en", "es"):
        table = strings("checks", lang)
        for e in found.values():
            assert e["name"] in table["name"] and set(e.get("causes", {})) <= set(table["cause"]), e
    for name in names:
        c = reconcile(found[name])
        why = (f"{name}: predicted {c.predicted:.4g} + causes {dict(c.causes)} = "
               f"{c.explained_value:.4g}, measured {c.measured:.4g} {c.unit}")
        assert c.explained, why
    return found


def assert_trace_decomposes(events: list[dict], check: dict, blocks: int | None = None) -> dict[int, float]:
    """The run's Chrome trace (``trace_export.chrome_trace`` over every rank's ``events``) draws the
    check ``check`` (issue 28): valid for the format; on each rank, for each traced block, its
    ``compute``, ``wait``, ``comm`` and ``idle`` spans (one track each, no second lane but the
    collectives', where the lesson draws its own) tile the block
    from the first rank's start to the last rank's end, no gap, no overlap (to the ns the trace
    keeps); and, where the check names a ``peer_wait`` cause, its rank's wait spans per block are it
    (within 1 µs per collective: times rounded to the ns, and a wait cut at its collective's end).
    ``blocks``: the number of blocks the check averages over (all drawn). Returns each rank's
    seconds of wait spans per block."""
    from collections import defaultdict

    from distai.engine.trace_export import check_trace, chrome_trace, trace_pid

    trace = chrome_trace(events)
    assert check_trace(trace) == []
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    tiles: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["args"].get("check") == check["name"]:
            track = threads[(e["pid"], e["tid"])]  # a collective overlapping the lesson's own may take "comm 2"
            track = "comm" if re.fullmatch(r"comm \d+", track) else track
            tiles[(e["pid"], e["args"]["block"])].append((e["ts"], e["ts"] + e["dur"], track))
    ranks = sorted({e["rank"] for e in events if e.get("rank") is not None})
    drawn = sorted({b for _r, b in tiles})
    assert drawn == list(range(blocks if blocks is not None else len(drawn))) and drawn, drawn
    waited: dict[int, float] = defaultdict(float)
    for b in drawn:
        start = min(a for r in ranks for a, _, _ in tiles[(trace_pid(r), b)])
        end = max(z for r in ranks for _, z, _ in tiles[(trace_pid(r), b)])
        for r in ranks:
            mine = sorted(tiles[(trace_pid(r), b)])
            assert {track for *_, track in mine} <= {"compute", "wait", "comm", "idle"}, mine
            assert "compute" in {track for *_, track in mine}
            edges = [start] + [z for _, z, _ in mine]
            assert all(abs(a - edge) < 1e-2 for (a, _, _), edge in zip(mine, edges)), (r, b, mine)
            assert abs(mine[-1][1] - end) < 1e-2
            waited[r] += sum(z - a for a, z, track in mine if track == "wait") / 1e6 / len(drawn)
    if "peer_wait" not in check.get("causes", {}):  # a check that names no peer wait: nothing to agree with
        return dict(waited)
    rank = check["detail"]["rank"]
    n_waits = sum(track == "wait" for p, b in tiles if p == trace_pid(rank) for *_, track in tiles[(p, b)])
    # a check averaged over steps (lesson 6) says what its trace draws: each step's wait cut to
    # [0, its exposed time] (``peer_wait_drawn_s``), where the check averages the uncut ones
    drawn = check["detail"].get("peer_wait_drawn_s", check["causes"]["peer_wait"])
    assert waited[rank] == pytest.approx(drawn, abs=1e-6 * max(1, n_waits))
    return dict(waited)


def assert_summary_rerenders(events: list[dict], lesson_id: str, printed: str | None = None) -> None:
    """Rank 0's summary event, as recorded (JSON), is all ``distai runs show`` needs to write rank 0's
    printed summary again in the other language (its experiment's ``summary_from_event``): it renders in en
    and in es, differently; ``printed`` (rank 0's output, in English), where the test has it, holds the
    English rendering line for line."""
    from distai.tutor.cli_runs import summary_renderer

    summary = next(e for e in events if e.get("kind") == "summary" and e.get("rank", 0) == 0)
    fields = {k: v for k, v in summary.items() if k not in ("kind", "t", "rank")}
    render = summary_renderer(lesson_id)
    assert render is not None, lesson_id
    en, es = render(fields, "en"), render(fields, "es")
    assert en.strip() and es.strip() and en != es, (en, es)
    if printed is not None:
        assert en.strip("\n") in printed, (en, printed)
