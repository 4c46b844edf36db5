"""A run's events as files the field's tools open: a Chrome trace, and its metrics as CSV/JSON lines.

:func:`chrome_trace` turns the ranks' events into the Trace Event Format that Perfetto
(ui.perfetto.dev) and chrome://tracing read (the format's reference: "Trace Event Format",
Google, docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU): one process
per rank (pid R + 1; ``M`` metadata events name it ``rank R``), one thread per stream (``compute``,
``comm`` — or one per process group in the capstone, ``comm tp``/``comm pp``/``comm dp`` — ``io``…), each timed operation a complete event (``ph: "X"``, ``ts``/``dur`` in µs
from the run's first event), and failures, restarts and a rank's error instant events (``ph: "i"``;
a run that did not end ``ok`` also gets a global one at its end, and its status in ``otherData``). Where
events of one stream overlap without nesting (bucket all-reduces in flight together, requests
being served side by side) the later ones go to a second track of that stream (``comm 2``…),
so every track is a proper stack, as the format's viewers expect.

Which events are timed operations (and the experiments that emit them):

* ``span`` (:meth:`~distai.engine.events.EventSink.span`): ``name``, ``stream``, ``t0``, ``t1``;
  ``step`` with ``t0``: a training step (lesson 3) ending at ``t``;
* ``pp_op`` (lesson 5's pipeline): a forward or backward block, ``t0``/``t1``; ``pp_step``: a step;
  from them and the ``wait recv`` spans, each rank's step decomposed as lesson 5's check reads it
  (``lessons/lesson5/breakdown.py``): its waits for a peer on a ``wait`` track, on an ``idle``
  track the rest of the step when it neither computes nor waits (the schedule's head and tail,
  the runner's overhead), the step being from the first rank's start to the last rank's end, and on
  a ``no core`` track each block's time runnable without a core (its wall time beyond its CPU
  time, ``compute``: the check's ``cpu_contention``, counted as no work), drawn at the block's end;
* ``span`` with ``check`` and ``block`` (``comm_trace.trace_causes``: lessons 1, 2, 4, 6, 7 and
  the capstone): a check's timed region as the check decomposes it, each rank's ``compute``,
  ``wait`` (for the last peer in a collective or on a message), ``comm`` and ``idle`` spans
  tiling each block from the first rank's start to the last rank's end — lesson 5's tracks, for
  the other lessons, emitted by the ranks themselves;
* ``ring_step`` with ``t0`` (lesson 1's traced ring): one step of the ring, its chunk and bytes;
* ``checkpoint`` (lesson 3): ``seconds`` ending at ``t_end`` (or ``t``); ``failure``/``restart``: instants;
* ``timeline`` (lesson 6): one step's per-layer backward and bucket all-reduces (ms from ``t_begin``);
* ``kv_step`` with ``t0`` (lesson 7): one decode iteration; ``request``: a request from its
  arrival to its last token.

:func:`check_trace` lists what breaks the format's rules (required keys, complete events with a
duration, times that never go back on a track, begin/end pairs that match, complete events on one
track that nest rather than overlap); :func:`metric_rows` flattens the numeric fields of the
runs's ``step``/``metric`` events into ``(step, rank, name, value)`` rows.

Pure Python: no torch, no UI.
"""
from __future__ import annotations

import csv
import io
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from ..lessons.context.events import CP_STEP
from ..lessons.events import ERROR, METRIC, RELAUNCH, SPAN, STEP, json_ready
from ..lessons.lesson1.events import RING_STEP
from ..lessons.lesson3.events import CHECKPOINT, FAILURE, RESTART
from ..lessons.lesson5.events import PP_OP, PP_STEP
from ..lessons.lesson6.events import TIMELINE
from ..lessons.lesson7.events import KV_STEP, REQUEST
from .events import is_number

STREAM_ORDER = ("compute", "no core", "wait", "idle", "comm", "comm tp", "comm cp", "comm pp", "comm dp", "io", "requests")
# event fields that are bookkeeping, not metrics
_NOT_METRICS = {"kind", "t", "rank", "step", "of", "t0", "t1", "t_start", "t_end", "attempt"}
# string fields that say which series a step's numbers belong to (lesson 5's schedule, lesson 2's strategy…)
_SERIES_FIELDS = ("impl", "strategy", "schedule", "mode", "cache", "dtype")


# -------------------------------------------------------------------------- timed operations
def _span(rank, stream, name, t0, t1, cat, args=None) -> dict | None:
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (t0, t1)) or t1 < t0:
        return None
    return {"rank": rank, "stream": stream, "name": name, "t0": float(t0), "t1": float(t1), "cat": cat,
            "args": args or {}}


def _args(e: dict, drop: Iterable[str]) -> dict:
    skip = set(drop) | {"kind", "t", "rank"}
    return {k: v for k, v in e.items() if k not in skip and isinstance(v, (int, float, str, bool))}


def operations(events: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """The timed operations (spans) and instants in the ranks' events."""
    spans: list[dict] = []
    instants: list[dict] = []

    def add(s):
        if s is not None:
            spans.append(s)

    for e in events:
        kind, rank = e.get("kind"), e.get("rank")
        if rank is None:
            continue
        if kind == SPAN.name:
            add(_span(rank, str(e.get("stream") or "compute"), str(e.get("name", "?")), e.get("t0"), e.get("t1"),
                      "span", _args(e, ("name", "stream", "t0", "t1"))))
        elif kind == STEP.name and "t0" in e:
            add(_span(rank, "compute", step_span_name(e), e.get("t0"), e.get("t"), "step", _args(e, ("t0",))))
        elif kind == PP_OP.name:
            name = f"{e.get('op')} mb{e.get('mb')} stage{e.get('stage')}"
            add(_span(rank, "compute", name, e.get("t0"), e.get("t1"), "pp",
                      _args(e, ("t0", "t1"))))
            t0, t1, work = e.get("t0"), e.get("t1"), e.get("compute")
            if is_number(t0) and is_number(t1) and is_number(work) and all(map(math.isfinite, (t0, t1, work))) \
                    and t1 - t0 - work > 1e-6:
                # the block's time runnable without a core (lesson 5's cpu_contention), drawn at its end: the
                # clocks say how long, not when
                add(_span(rank, "no core", f"{name}: no core", t0 + work, t1, "no_core",
                          {k: e[k] for k in ("schedule", "step") if k in e}))
        elif kind == PP_STEP.name:
            add(_span(rank, "compute", f"{e.get('schedule')} step {e.get('step')} ({e.get('impl')})",
                      e.get("t_start"), e.get("t_end"), "pp_step", _args(e, ("t_start", "t_end"))))
        elif kind == RING_STEP.name and "t0" in e:
            phase = e.get("phase", "")
            name = f"ring {phase} step {int(e.get('step', 0)) + 1}/{e.get('of')}: chunk {e.get('chunk')} → rank {e.get('to')}"
            add(_span(rank, "comm", name, e.get("t0"), e.get("t"), "ring", _args(e, ("t0",))))
        elif kind == CHECKPOINT.name and isinstance(e.get("seconds"), (int, float)):
            name = f"checkpoint after step {e.get('step')}" + (" (async)" if e.get("mode") == "async" else "")
            end = e.get("t_end") or e["t"]  # an async checkpoint is reported after it was published
            add(_span(rank, "io", name, end - e["seconds"], end, "checkpoint", _args(e, ())))
        elif kind == TIMELINE.name and isinstance(e.get("t_begin"), (int, float)):
            base, label = e["t_begin"], f"{e.get('mode')} {e.get('bucket_mb')} MiB"
            for layer, a, b in e.get("layers") or []:
                add(_span(rank, "compute", f"backward {layer}", base + a / 1e3, base + b / 1e3, "backward",
                          {"run": label}))
            for index, nbytes, a, b in e.get("buckets") or []:
                add(_span(rank, "comm", f"all-reduce bucket {index}", base + a / 1e3, base + b / 1e3, "bucket",
                          {"run": label, "bytes": nbytes}))
        elif kind == CP_STEP.name and isinstance(e.get("t0"), (int, float)):
            name = f"attention {e.get('phase')} L{e.get('layer')} ring step {e.get('step')}: K/V of rank {e.get('owner')}"
            computed = e["t0"] + float(e.get("compute_s") or 0.0)
            add(_span(rank, "compute", name, e["t0"], computed, "cp", _args(e, ("t0", "wait_s"))))
            if e.get("wait_s"):
                add(_span(rank, "wait", f"wait for the next K/V block ({e.get('phase')} L{e.get('layer')})", computed,
                          computed + float(e["wait_s"]), "cp_wait", {"step": e.get("step")}))
        elif kind == KV_STEP.name and "t0" in e:
            add(_span(rank, "compute", f"decode step {e.get('step')} ({e.get('cache')})", e.get("t0"), e.get("t"),
                      "decode", {k: e[k] for k in ("running", "waiting", "used_blocks") if k in e}))
        elif kind == REQUEST.name and "t_arrival" in e:
            add(_span(rank, "requests", f"request {e.get('rid')} ({e.get('cache')})", e.get("t_arrival"), e.get("t"),
                      "request", _args(e, ("t_arrival", "tokens"))))
        elif kind in (FAILURE.name, RESTART.name, RELAUNCH.name, ERROR.name) and isinstance(e.get("t"), (int, float)):
            name = f"error: {e.get('error')}"[:200] if kind == ERROR.name else kind  # the rank's own words
            instants.append({"rank": rank, "stream": "compute", "name": name, "t": e["t"], "cat": kind,
                             "args": _args(e, ())})
    spans.extend(pipeline_wait_and_idle(spans, events))
    return spans, instants


def step_span_name(e: dict, number: int | None = None) -> str:
    """A training step's name on the trace: its own ``name`` if it has one, else ``step N`` (``number``, else
    its 0-based ``step``), and for a step done again after a restart (lesson 3) what it is, ``step N (redo,
    attempt A)``: the redone step is a second span of the same number."""
    if isinstance(e.get("name"), str):
        return e["name"]
    extra = ", ".join((["redo"] if e.get("redo") is True else [])
                      + ([f"attempt {e['attempt']}"] if isinstance(e.get("attempt"), int) and e["attempt"] > 0 else []))
    return f"step {e.get('step') if number is None else number}" + (f" ({extra})" if extra else "")


def uncovered(t0: float, t1: float, covered: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [t0, t1] outside every interval of ``covered``."""
    gaps, at = [], t0
    for a, b in sorted(covered):
        if a > at:
            gaps.append((at, min(a, t1)))
        at = max(at, b)
        if at >= t1:
            break
    if at < t1:
        gaps.append((at, t1))
    return [(a, b) for a, b in gaps if b > a]


def pipeline_wait_and_idle(spans: list[dict], events: Iterable[dict]) -> list[dict]:
    """Lesson 5's decomposition of each rank's steps (our runner's): a ``wait`` track (the waits on
    a peer's message, and for the step's sends) and an ``idle`` track (the step's time with neither
    a block nor a wait)."""
    steps: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("kind") == PP_STEP.name and e.get("impl") == "ours":
            steps[(str(e.get("schedule")), int(e.get("step", 0)))].append((e["t_start"], e["t_end"]))
    busy: dict[tuple[Any, str, int], list[tuple[float, float]]] = defaultdict(list)
    out: list[dict | None] = []
    for s in spans:
        key = (s["rank"], str(s["args"].get("schedule")), s["args"].get("step"))
        if s["cat"] == "pp":
            busy[key].append((s["t0"], s["t1"]))
        elif s["cat"] == "span" and s["name"].startswith(("wait recv", "wait sends")) and key[2] is not None:
            busy[key].append((s["t0"], s["t1"]))
            out.append(_span(s["rank"], "wait", s["name"][len("wait "):], s["t0"], s["t1"], "wait", s["args"]))
    for (rank, schedule, step), blocks in busy.items():
        bounds = steps.get((schedule, int(step)))
        if not bounds:
            continue
        t0, t1 = min(a for a, _ in bounds), max(b for _, b in bounds)
        for a, b in uncovered(t0, t1, blocks):
            out.append(_span(rank, "idle", "idle", a, b, "idle", {"schedule": schedule, "step": step}))
    return [s for s in out if s is not None]


# -------------------------------------------------------------------------- the Chrome trace
def _ns(t: float, origin: float) -> int:
    return round((t - origin) * 1e9)


def _may_nest(inner: dict, outer: dict) -> bool:
    """Whether ``inner``, inside ``outer`` in time, is a part of it. Two operations of one kind (two
    requests served side by side, two buckets' all-reduces in flight, two steps) are never parent and
    child, however their times fall: a viewer would draw one as the other's sub-slice. Generic spans
    (``span``) may hold one another (a step and the blocks it times)."""
    return inner["cat"] != outer["cat"] or inner["cat"] == "span"


def _lanes(spans: list[dict]) -> list[tuple[dict, int]]:
    """Each span of one (rank, stream) with the lane it fits in: on a lane, spans nest (when the inner one
    is part of the outer, :func:`_may_nest`) or follow."""
    placed = []
    stacks: list[list[dict]] = []  # per lane: the spans still open
    for s in sorted(spans, key=lambda s: (s["a"], -s["b"])):
        for lane, stack in enumerate(stacks + [[]]):
            while stack and stack[-1]["b"] <= s["a"]:
                stack.pop()
            if not stack or (s["b"] <= stack[-1]["b"] and _may_nest(s, stack[-1])):
                if lane == len(stacks):
                    stacks.append(stack)
                stack.append(s)
                placed.append((s, lane))
                break
    return placed


def trace_pid(rank: int) -> int:
    """The process id a rank's events carry: rank + 1, since pid 0 is the kernel's idle task and trace
    viewers treat it apart (Perfetto's JSON import among them); the process is named "rank R"."""
    return rank + 1


def chrome_trace(events: list[dict], run_id: str | None = None, lesson: str | None = None,
                 ended: dict | None = None, hosts: dict[int, str] | None = None) -> dict:
    """The events as a Trace Event Format object (``{"traceEvents": [...], ...}``). ``ended``: how the run
    ended, from its record (``status``, ``error``, ``failed_rank``, ``t``: when, if known): written into
    ``otherData``, and a run that did not end ``ok`` gets a global instant saying so at its end (or after
    its last event), so a failed or killed run's timeline does not look like one that simply stopped.
    ``hosts``: each rank's host, for a run over several nodes (its processes are named ``rank R (host)``);
    the nodes' events share one origin, their clocks being the hosts' wall clocks (as close as NTP keeps them)."""
    spans, instants = operations(events)
    if ended and ended.get("status") not in (None, "ok", "running"):
        last = max([s["t1"] for s in spans] + [i["t"] for i in instants], default=None)
        at = ended.get("t") if isinstance(ended.get("t"), (int, float)) else last
        if at is not None:
            name = f"run {ended['status']}" + (f": {ended['error']}" if ended.get("error") else "")
            instants.append({"rank": None, "stream": "compute", "name": name[:200], "t": max(at, last or at),
                             "cat": "run_end", "args": {k: v for k, v in ended.items() if k != "t" and v is not None}})
    times = [s["t0"] for s in spans] + [i["t"] for i in instants]
    origin = min(times) if times else 0.0
    by_track: dict[tuple[int, str], list[dict]] = defaultdict(list)
    for s in spans:
        s["a"], s["b"] = _ns(s["t0"], origin), _ns(s["t1"], origin)
        by_track[(s["rank"], s["stream"])].append(s)
    ranks = sorted({r for r, _ in by_track} | {i["rank"] for i in instants if i["rank"] is not None})
    streams = sorted({st for _, st in by_track} | {"compute"},
                     key=lambda st: (STREAM_ORDER.index(st) if st in STREAM_ORDER else len(STREAM_ORDER), st))
    out: list[dict] = []
    tids: dict[tuple[int, str, int], int] = {}
    body: list[dict] = []
    for (rank, stream), track in by_track.items():
        for s, lane in _lanes(track):
            tid = tids.setdefault((rank, stream, lane), 0)
            body.append({"name": s["name"], "cat": s["cat"], "ph": "X", "ts": s["a"] / 1000,
                         "dur": (s["b"] - s["a"]) / 1000, "pid": trace_pid(rank), "tid": (rank, stream, lane),
                         "args": s["args"]})
    for i in instants:
        if i["rank"] is None:  # the whole run's: a global instant, drawn across every track
            body.append({"name": i["name"], "cat": i["cat"], "ph": "i", "s": "g", "ts": _ns(i["t"], origin) / 1000,
                         "pid": trace_pid(ranks[0]) if ranks else 1, "tid": 0, "args": i["args"]})
            continue
        tids.setdefault((i["rank"], "compute", 0), 0)
        body.append({"name": i["name"], "cat": i["cat"], "ph": "i", "s": "t", "ts": _ns(i["t"], origin) / 1000,
                     "pid": trace_pid(i["rank"]), "tid": (i["rank"], "compute", 0), "args": i["args"]})
    # thread ids: streams in a fixed order, lanes after their stream, per rank
    numbered: dict[tuple[int, str, int], int] = {}
    for rank in ranks:
        n = 0
        for stream in streams:
            for lane in sorted(lane for (r, st, lane) in tids if r == rank and st == stream):
                n += 1
                numbered[(rank, stream, lane)] = n
    for rank in ranks:
        host = (hosts or {}).get(rank)
        out.append({"name": "process_name", "ph": "M", "pid": trace_pid(rank), "tid": 0,
                    "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": trace_pid(rank), "tid": 0,
                    "args": {"sort_index": rank}})
        for (r, stream, lane), tid in sorted(numbered.items(), key=lambda kv: kv[1]):
            if r != rank:
                continue
            label = stream if lane == 0 else f"{stream} {lane + 1}"
            out.append({"name": "thread_name", "ph": "M", "pid": trace_pid(rank), "tid": tid, "args": {"name": label}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": trace_pid(rank), "tid": tid,
                        "args": {"sort_index": tid}})
    for ev in body:
        if ev["tid"] != 0:
            ev["tid"] = numbered[ev["tid"]]
    # time order; on equal starts the enclosing (longer) event first, as a viewer nests them
    body.sort(key=lambda ev: (ev["ts"], -ev.get("dur", 0.0)))
    meta = {"run_id": run_id, "lesson": lesson, "origin_unix_s": origin,
            **({"hosts": {str(r): h for r, h in sorted(hosts.items())}} if hosts else {}),
            "source": "distai runs export --format chrome-trace",
            **{k: v for k, v in (ended or {}).items() if k in ("status", "error", "failed_rank") and v is not None}}
    return {"traceEvents": out + body, "displayTimeUnit": "ms", "otherData": meta}


# -------------------------------------------------------------------------- the format's rules
_REQUIRED = {"X": ("name", "ph", "ts", "dur", "pid", "tid"), "B": ("name", "ph", "ts", "pid", "tid"),
             "E": ("ph", "ts", "pid", "tid"), "i": ("name", "ph", "ts", "pid", "tid"),
             "I": ("name", "ph", "ts", "pid", "tid"), "M": ("name", "ph", "pid", "args"),
             "C": ("name", "ph", "ts", "pid", "args")}


def check_trace(trace: Any) -> list[str]:
    """Every way ``trace`` breaks the Trace Event Format's rules (empty when it keeps them all)."""
    problems: list[str] = []
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        return ["no traceEvents list"]
    last_ts: dict[tuple, float] = {}
    open_b: dict[tuple, list[str]] = defaultdict(list)
    x_by_track: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for k, ev in enumerate(events):
        if not isinstance(ev, dict):
            problems.append(f"event {k} is not an object")
            continue
        ph = ev.get("ph")
        if ph not in _REQUIRED:
            problems.append(f"event {k}: unknown phase {ph!r}")
            continue
        missing = [key for key in _REQUIRED[ph] if key not in ev]
        if missing:
            problems.append(f"event {k} ({ph}): missing {', '.join(missing)}")
            continue
        if ph == "M":
            if ev["name"] in ("process_name", "thread_name") and not isinstance(ev["args"].get("name"), str):
                problems.append(f"event {k}: {ev['name']} without args.name")
            continue
        ts = ev["ts"]
        if not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            problems.append(f"event {k}: ts {ts!r} is not a time in µs")
            continue
        track = (ev["pid"], ev.get("tid"))
        if ts < last_ts.get(track, -math.inf):
            problems.append(f"event {k} ({ev.get('name')}): ts {ts} goes back on track {track}")
        last_ts[track] = ts
        if ph == "X":
            dur = ev["dur"]
            if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
                problems.append(f"event {k} ({ev['name']}): dur {dur!r} is not a duration")
                continue
            x_by_track[track].append((round(ts * 1000), round((ts + dur) * 1000), str(ev["name"])))
        elif ph == "B":
            open_b[track].append(str(ev["name"]))
        elif ph == "E":
            if not open_b[track]:
                problems.append(f"event {k}: end without a begin on track {track}")
            else:
                open_b[track].pop()
    for track, names in open_b.items():
        if names:
            problems.append(f"track {track}: {len(names)} begin event(s) never ended ({names[-1]})")
    for track, xs in x_by_track.items():
        stack: list[tuple[int, int, str]] = []
        for a, b, name in sorted(xs, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack and b > stack[-1][1]:
                problems.append(f"track {track}: {name!r} overlaps {stack[-1][2]!r} without nesting in it")
            stack.append((a, b, name))
    return problems


# -------------------------------------------------------------------------- metrics
def metric_rows(events: Iterable[dict]) -> list[dict]:
    """``{"step", "rank", "name", "value"}`` for every number of every ``step`` event (its series
    prefixed: ``gpipe.loss``) and every ``metric`` event (``step`` empty), in time order."""
    rows = []
    for e in sorted(events, key=lambda e: e.get("t") or 0.0):
        kind = e.get("kind")
        # a value as the event holds it: a count stays whole in the CSV and the JSONL ("4096", not "4096.0")
        if kind == METRIC.name and is_number(e.get("value")):
            rows.append({"step": e.get("step"), "rank": e.get("rank"), "name": str(e.get("name")),
                         "value": e["value"]})
        elif kind == STEP.name:
            series = ".".join(str(e[f]) for f in _SERIES_FIELDS if isinstance(e.get(f), str))
            for key, value in e.items():
                if key in _NOT_METRICS or not is_number(value):
                    continue
                rows.append({"step": e.get("step"), "rank": e.get("rank"),
                             "name": f"{series}.{key}" if series else key, "value": value})
    return rows


def metrics_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["step", "rank", "name", "value"], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row[k] is None else row[k]) for k in ("step", "rank", "name", "value")})
    return buf.getvalue()


def metrics_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(json_ready(row), ensure_ascii=False, allow_nan=False) + "\n" for row in rows)
