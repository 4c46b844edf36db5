"""Run exports: the Chrome trace keeps the Trace Event format's rules (and the checker catches each
way of breaking them), overlapping operations of one stream get their own track, metrics flatten
to (step, rank, name, value), and `distai runs export` writes them or fails in one line."""
from __future__ import annotations

import csv
import io
import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from distai.engine.events import EventSink
from distai.engine.runs import create_run
from distai.engine.trace_export import check_trace, chrome_trace, metric_rows, operations, trace_pid
from distai.tutor.cli import main

T = 1_800_000_000.0  # a wall-clock second: times are offsets from it


def _x(name, ts, dur, tid=1, pid=0):
    return {"name": name, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def test_checker_accepts_nesting_and_catches_each_broken_rule():
    good = [_x("step", 0, 10), _x("fwd", 1, 3), _x("bwd", 5, 4), _x("other track", 2, 20, tid=2),
            {"name": "a", "ph": "B", "ts": 30, "pid": 0, "tid": 1}, {"ph": "E", "ts": 31, "pid": 0, "tid": 1},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "compute"}}]
    assert check_trace({"traceEvents": good}) == []
    broken = {
        "missing": [{"name": "x", "ph": "X", "ts": 0, "pid": 0, "tid": 1}],
        "overlaps": [_x("a", 0, 10), _x("b", 5, 10)],
        "goes back": [_x("a", 5, 1), _x("b", 1, 1)],
        "never ended": [{"name": "a", "ph": "B", "ts": 0, "pid": 0, "tid": 1}],
        "end without a begin": [{"ph": "E", "ts": 0, "pid": 0, "tid": 1}],
        "not a duration": [_x("a", 0, -1)],
        "unknown phase": [{"name": "a", "ph": "Q", "ts": 0, "pid": 0, "tid": 1}],
        "without args.name": [{"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {}}],
    }
    for words, events in broken.items():
        problems = check_trace({"traceEvents": events})
        assert len(problems) == 1 and words in problems[0], (words, problems)


def test_overlapping_operations_of_one_stream_get_their_own_track():
    events = [  # two bucket all-reduces in flight together, nested in nothing; a step around compute
        {"kind": "span", "rank": 1, "name": "all-reduce bucket 0", "stream": "comm", "t0": T + 0.001, "t1": T + 0.004},
        {"kind": "span", "rank": 1, "name": "all-reduce bucket 1", "stream": "comm", "t0": T + 0.002, "t1": T + 0.005},
        {"kind": "span", "rank": 1, "name": "step 0", "stream": "compute", "t0": T, "t1": T + 0.006},
        {"kind": "span", "rank": 1, "name": "backward", "stream": "compute", "t0": T + 0.0005, "t1": T + 0.003},
        {"kind": "failure", "rank": 0, "t": T + 0.007, "step": 3, "cause": "--kill-rank"},
        {"kind": "step", "rank": 0, "t": T, "step": 0, "loss": 1.0},  # not timed: not in the trace
    ]
    trace = chrome_trace(events, run_id="r")
    assert check_trace(trace) == []
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    xs = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert threads[(trace_pid(1), xs["all-reduce bucket 0"]["tid"])] == "comm"
    assert threads[(trace_pid(1), xs["all-reduce bucket 1"]["tid"])] == "comm 2"
    assert xs["step 0"]["tid"] == xs["backward"]["tid"] and threads[(trace_pid(1), xs["step 0"]["tid"])] == "compute"
    assert xs["step 0"]["ts"] == 0 and xs["step 0"]["dur"] == pytest.approx(6000, abs=0.5)  # µs from the first event
    assert xs["all-reduce bucket 1"]["ts"] == pytest.approx(2000, abs=0.5)
    (failure,) = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert failure["pid"] == trace_pid(0) and failure["ts"] == pytest.approx(7000, abs=0.5) and failure["args"]["cause"] == "--kill-rank"


def test_operations_of_one_kind_inside_one_another_in_time_are_not_drawn_as_parent_and_child():
    # lesson 7's requests served side by side, one arriving and finishing inside another, and lesson 6's
    # second bucket's all-reduce within the first's: each on its own track, where a viewer would have drawn
    # the inner one as the outer one's part; a step's own block still nests in the step
    events = [
        {"kind": "request", "rank": 0, "t_arrival": T, "t": T + 0.25, "rid": 0, "cache": "paged"},
        {"kind": "request", "rank": 0, "t_arrival": T + 0.01, "t": T + 0.06, "rid": 1, "cache": "paged"},
        {"kind": "timeline", "rank": 1, "t": T + 1, "t_begin": T, "mode": "overlap", "bucket_mb": 1.0,
         "layers": [], "buckets": [[0, 4096, 1.0, 18.0], [1, 4096, 5.0, 17.0]]},
        {"kind": "span", "rank": 1, "name": "step 0", "stream": "compute", "t0": T, "t1": T + 0.02},
        {"kind": "span", "rank": 1, "name": "forward", "stream": "compute", "t0": T + 0.001, "t1": T + 0.01},
    ]
    trace = chrome_trace(events)
    assert check_trace(trace) == []
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    track = {e["name"]: threads[(e["pid"], e["tid"])] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert (track["request 0 (paged)"], track["request 1 (paged)"]) == ("requests", "requests 2")
    assert (track["all-reduce bucket 0"], track["all-reduce bucket 1"]) == ("comm", "comm 2")
    assert track["step 0"] == track["forward"] == "compute"


def test_a_run_that_did_not_end_ok_says_so_in_its_trace():
    events = [
        {"kind": "span", "rank": 0, "name": "step 0", "stream": "compute", "t0": T, "t1": T + 0.01},
        {"kind": "span", "rank": 1, "name": "step 0", "stream": "compute", "t0": T, "t1": T + 0.01},
        {"kind": "error", "rank": 1, "t": T + 0.012, "error": "RuntimeError: injected failure on rank 1 at step 1",
         "traceback": "Traceback ..."},
    ]
    ended = {"status": "failed", "error": "rank 1 failed", "failed_rank": 1, "t": T + 0.02}
    trace = chrome_trace(events, run_id="r", ended=ended)
    assert check_trace(trace) == []
    assert trace["otherData"]["status"] == "failed" and trace["otherData"]["failed_rank"] == 1
    instants = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "i"}
    error = instants["error: RuntimeError: injected failure on rank 1 at step 1"]
    assert error["pid"] == trace_pid(1) and error["s"] == "t" and error["ts"] == pytest.approx(12000, abs=0.5)
    end = instants["run failed: rank 1 failed"]
    assert end["s"] == "g" and end["ts"] == pytest.approx(20000, abs=0.5)
    # a run that ended well has no such instant, and a run still going neither
    for status in ("ok", "running"):
        trace = chrome_trace(events[:2], ended={"status": status, "t": T + 0.02})
        assert not [e for e in trace["traceEvents"] if e["ph"] == "i"] and trace["otherData"]["status"] == status
    # rank 0 is not pid 0 (the kernel's idle task, which viewers treat apart)
    assert {e["pid"] for e in trace["traceEvents"]} == {1, 2}


def test_each_lessons_timed_events_become_operations():
    events = [
        {"kind": "ring_step", "rank": 2, "t0": T, "t": T + 1e-3, "phase": "reduce-scatter", "step": 0, "of": 6,
         "chunk": 2, "to": 3, "bytes": 4096},
        {"kind": "checkpoint", "rank": 0, "t": T + 2, "seconds": 0.5, "step": 10, "bytes": 100, "mode": "async"},
        {"kind": "timeline", "rank": 1, "t": T + 3, "t_begin": T + 2.5, "mode": "overlap", "bucket_mb": 1.0,
         "layers": [["fc2", 0.0, 2.0], ["fc1", 2.0, 3.5]], "buckets": [[0, 4096, 2.1, 3.0]]},
        {"kind": "kv_step", "rank": 0, "t0": T + 4, "t": T + 4.01, "step": 5, "cache": "paged", "running": 3},
        {"kind": "request", "rank": 0, "t_arrival": T + 3.9, "t": T + 4.2, "rid": 7, "cache": "paged", "tokens": [1]},
        {"kind": "step", "rank": 0, "t0": T + 5, "t": T + 5.5, "step": 3, "loss": 2.0},
        {"kind": "pp_op", "rank": 1, "t0": T, "t1": T + 0.1, "op": "F", "mb": 0, "stage": 1, "chunk": 0,
         "schedule": "1f1b", "step": 0},
        # a context-parallel ring step: its compute, then the wait for the next K/V block (the run exported none)
        {"kind": "cp_step", "rank": 3, "t0": T + 6, "t": T + 6.5, "train_step": 0, "phase": "fwd", "step": 1,
         "owner": 2, "layer": "0", "compute_s": 0.02, "wait_s": 0.005, "messages": 2, "sent_bytes": 1024},
    ]
    spans, _ = operations(events)
    by = {s["name"]: s for s in spans}
    assert by["ring reduce-scatter step 1/6: chunk 2 → rank 3"]["args"]["bytes"] == 4096
    assert by["checkpoint after step 10 (async)"]["stream"] == "io"
    assert by["checkpoint after step 10 (async)"]["t0"] == pytest.approx(T + 1.5)
    assert by["backward fc1"]["t1"] == pytest.approx(T + 2.5035)
    assert by["all-reduce bucket 0"]["stream"] == "comm" and by["all-reduce bucket 0"]["args"]["bytes"] == 4096
    assert by["decode step 5 (paged)"]["t1"] - by["decode step 5 (paged)"]["t0"] == pytest.approx(0.01)
    assert by["F mb0 stage1"]["stream"] == "compute"
    assert by["request 7 (paged)"]["stream"] == "requests" and "tokens" not in by["request 7 (paged)"]["args"]
    assert by["step 3"]["t1"] == pytest.approx(T + 5.5) and by["step 3"]["args"]["loss"] == 2.0
    ring = by["attention fwd L0 ring step 1: K/V of rank 2"]
    assert ring["stream"] == "compute" and ring["t1"] - ring["t0"] == pytest.approx(0.02)
    wait = by["wait for the next K/V block (fwd L0)"]
    assert wait["stream"] == "wait" and (wait["t0"], wait["t1"]) == pytest.approx((T + 6.02, T + 6.025))
    assert check_trace(chrome_trace(events)) == []


def test_metric_rows_flatten_steps_and_metrics():
    rows = metric_rows([
        {"kind": "step", "rank": 3, "t": T + 1, "step": 0, "of": 2, "loss": 4.5, "schedule": "gpipe", "redo": False},
        {"kind": "metric", "rank": 0, "t": T + 2, "name": "gpipe.bubble_measured", "value": 0.25},
        {"kind": "step", "rank": 0, "t": T, "step": 7, "loss": 1.5, "comm_s": 0.01},
    ])
    assert rows == [{"step": 7, "rank": 0, "name": "loss", "value": 1.5},
                    {"step": 7, "rank": 0, "name": "comm_s", "value": 0.01},
                    {"step": 0, "rank": 3, "name": "gpipe.loss", "value": 4.5},
                    {"step": None, "rank": 0, "name": "gpipe.bubble_measured", "value": 0.25}]


def test_cli_export_writes_trace_and_metrics_and_fails_in_one_line(isolated_distai_home, tmp_path, capsys):
    rec = create_run(isolated_distai_home / "runs", "lesson1", "distai.engine.experiments.lesson1")
    for rank in (0, 1):
        sink = EventSink(rank, rec.events_dir)
        with sink.span("forward", "compute", step=0):
            time.sleep(0.002)
        with sink.span("all-reduce", "comm", bytes=1024):
            time.sleep(0.001)
        sink.emit("step", step=0, loss=2.0 + rank)
        sink.emit("step", step=1, loss=float("nan"))  # fp16 without a scaler: a NaN loss leaves as null
        sink.close()

    def distai(*args):
        capsys.readouterr()
        code = main(["runs", "export", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    out = distai(rec.id)
    assert out.returncode == 0, out.stderr
    trace = json.loads((rec.dir / "trace.json").read_text())
    assert check_trace(trace) == [] and str(rec.dir / "trace.json") in out.stdout
    assert sorted(e["name"] for e in trace["traceEvents"] if e["ph"] == "X") == ["all-reduce"] * 2 + ["forward"] * 2
    table = list(csv.DictReader(io.StringIO(distai("last", "--format", "csv", "-o", "-").stdout)))
    assert sorted((r["rank"], r["name"], float(r["value"])) for r in table if r["step"] == "0") == [
        ("0", "loss", 2.0), ("1", "loss", 3.0)]
    target = tmp_path / "m.jsonl"
    assert distai(rec.id, "-f", "jsonl", "-o", str(target)).returncode == 0
    strict = {"NaN": lambda c: pytest.fail(f"{c} is not JSON")}
    assert [json.loads(line, parse_constant=strict["NaN"])["value"]
            for line in target.read_text().splitlines()] == [2.0, None, 3.0, None]
    assert "NaN" not in distai(rec.id, "-f", "chrome-trace", "-o", "-").stdout
    empty = create_run(isolated_distai_home / "runs", "lesson6", "distai.engine.experiments.lesson6")
    none = distai(empty.id)  # killed before its first step: one line, no empty file
    assert none.returncode == 1 and "recorded no timed events" in none.stderr and not (empty.dir / "trace.json").exists()
    for args, words in (((rec.id, "--format", "pdf"), "--format must be one of"),
                        (("nope",), "no run matches"),
                        ((rec.id, "-o", str(tmp_path)), "is a folder"),
                        ((rec.id, "-o", str(tmp_path / "missing" / "t.json")), "cannot write"),
                        ((rec.id, "-o", ""), "-o needs a file's name (it was empty)")):
        bad = distai(*args)
        assert bad.returncode == 2 and words in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # any run's own files are refused (README's "-o run.json" typed inside the run's folder overwrote its
    # record), this run's or another's; a file of the learner's own beside them can be written again
    other = create_run(isolated_distai_home / "runs", "lesson2", "distai.engine.experiments.lesson2")
    for own in (rec.dir / "run.json", rec.dir / "events" / "rank0.jsonl", other.dir / "run.json"):
        before = own.read_bytes()
        bad = distai(rec.id, "-o", str(own))
        assert bad.returncode == 2 and "is one of the run's own files" in bad.stderr and own.read_bytes() == before
    mine = rec.dir / "mine.csv"
    assert distai(rec.id, "-f", "csv", "-o", str(mine)).returncode == 0
    # a file that exists is the learner's: replaced only with --force (it was overwritten without a word)
    mine.write_text("my notes\n")
    bad = distai(rec.id, "-f", "csv", "-o", str(mine))
    assert bad.returncode == 2 and "already exists; pass --force" in bad.stderr and mine.read_text() == "my notes\n"
    assert distai(rec.id, "-f", "csv", "-o", str(mine), "--force").returncode == 0
    assert mine.read_text().startswith("step,rank")
    # the run's own export in its folder is renewed, named or not
    assert distai(rec.id, "-o", str(rec.dir / "trace.json")).returncode == 0 and distai(rec.id).returncode == 0
    # a link is followed, not replaced; what is not a regular file is written into, never replaced by one
    (tmp_path / "link.csv").symlink_to(tmp_path / "target.csv")
    assert distai(rec.id, "-f", "csv", "-o", str(tmp_path / "link.csv")).returncode == 0
    assert (tmp_path / "link.csv").is_symlink() and (tmp_path / "target.csv").read_text().startswith("step,rank")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)  # never hangs the session
    reader.start()
    assert distai(rec.id, "-f", "csv", "-o", str(fifo)).returncode == 0
    reader.join(timeout=30)
    assert got and got[0].startswith("step,rank") and stat.S_ISFIFO(fifo.lstat().st_mode)
    # /dev/stdout is stdout itself: appended to, never replaced by a renamed file (`>> log` lost the log)
    code = ("import sys; from distai.tutor.cli import main; "
            f"sys.exit(main(['runs', 'export', {rec.id!r}, '-f', 'csv', '-o', '/dev/stdout']))")
    log = tmp_path / "log.txt"
    log.write_text("HEADER\n")
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True, timeout=60,
                       env=dict(os.environ, DISTAI_HOME=str(isolated_distai_home)))
    assert log.read_text().startswith("HEADER\nstep,rank,name,value\n")


def test_runs_show_says_which_lines_keep_the_runs_language(isolated_distai_home, capsys):
    """A run made in English replayed with --lang es: its ranks' own lines stay as they wrote them (an audit
    found them in English with nothing saying why); one line says so, in the learner's language."""
    from distai.tutor.cli import main

    rec = create_run(isolated_distai_home / "runs", "lesson1", "distai.engine.experiments.lesson1")
    rec.config["lang"] = "en"
    rec.save()
    sink = EventSink(0, rec.events_dir)
    sink.emit("step", step=0, loss=2.0)
    sink.close()
    capsys.readouterr()
    assert main(["runs", "show", rec.id, "--lang", "es"]) == 0
    assert "esta ejecución se hizo en inglés" in capsys.readouterr().err
    assert main(["runs", "show", rec.id, "--lang", "en"]) == 0
    assert "this run was made in" not in capsys.readouterr().err


def test_runs_show_writes_rank_0s_summary_again_in_the_learners_language(isolated_distai_home, capsys):
    """Lessons whose summary is their recorded summary alone (1, 3, 6): a replay in the other language writes
    rank 0's summary again in it, found line for line among rank 0's output; what is not found stays as written."""
    from distai.engine.experiments.lesson6 import summary_from_event
    from distai.tutor.cli import main

    summary = {"overlap": {"step_ms": {"1": {"overlap": 28.9, "no-overlap": 28.7, "ddp": 27.5},
                                       "4": {"overlap": 23.2, "no-overlap": 23.0, "ddp": 23.6}},
                           "best_bucket_mb": 4, "overlap_speedup": 0.99, "ours_over_ddp": 0.98}}
    rec = create_run(isolated_distai_home / "runs", "lesson6", "distai.engine.experiments.lesson6")
    rec.config["lang"] = "en"
    rec.save()
    sink = EventSink(0, rec.events_dir)
    sink.emit("step", step=0, loss=2.0)
    sink.emit("summary", **summary)
    sink.close()
    rec.logs_dir.mkdir(parents=True, exist_ok=True)
    (rec.logs_dir / "rank0.log").write_text("a note of rank 0\n" + summary_from_event(summary, "en") + "\n")
    capsys.readouterr()
    assert main(["runs", "show", rec.id, "--lang", "es"]) == 0
    out, err = capsys.readouterr()
    assert "el resumen del rank 0 se escribe de nuevo en español" in err
    assert "solapado (nuestro)" in out and "overlap (ours)" not in out and "a note of rank 0" in out
    # a summary the run did not print as this version writes it: left as written, and said so
    (rec.logs_dir / "rank0.log").write_text("overlap (ours) as another version wrote it\n")
    assert main(["runs", "show", rec.id, "--lang", "es"]) == 0
    out, err = capsys.readouterr()
    assert "se muestran como las escribieron" in err and "overlap (ours) as another version" in out


def test_every_summary_renderer_is_its_experiments_own():
    """Every lesson's experiment has the function ``runs show`` re-renders rank 0's summary with in another
    language (``summary_from_event``), and prints that summary with it."""
    import importlib
    import inspect

    from distai.lessons.registry import all_lessons
    from distai.tutor.cli_runs import summary_renderer

    for lesson in all_lessons():
        render = summary_renderer(lesson.id)
        source = inspect.getsource(importlib.import_module(lesson.experiment))
        assert callable(render) and source.count(f"{render.__name__}(") >= 2, lesson.id  # defined, and printed with


def test_profiler_traces_keep_every_attempt_their_own_name_and_say_when_there_are_none(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from distai.engine import profiling
    from distai.lessons.strings import translated
    from distai.tutor.cli_run import profile_traces_line

    # a restarted run (torchrun's TORCHELASTIC_RESTART_COUNT) writes its attempt beside the first one's
    assert profiling.profile_file(tmp_path, 1).name == "rank1.pt.trace.json"
    assert profiling.profile_file(tmp_path, 1, attempt=2).name == "rank1.attempt2.pt.trace.json"
    # and the supervisor's relaunch, a fresh torchrun whose restart count starts again at 0, beside both
    assert profiling.profile_file(tmp_path, 1, attempt=0, relaunch=1).name == "rank1.relaunch1.pt.trace.json"
    record = SimpleNamespace(config={"profile_dir": str(tmp_path)}, effective_status="stopped")
    for lang, words in (("en", "none in"), ("es", "ninguna en")):
        say = lambda key, **f: translated("cli", f"run_says.{key}", lang, **f)  # noqa: E731
        assert words in profile_traces_line(record, say)
        assert "none" not in profile_traces_line(SimpleNamespace(config=record.config, effective_status="running"),
                                                 say)  # a run still going writes them as its ranks end
    # Kineto writes the name it was given into the file, as it is (UTF-8: a learner's folder "josé"): the
    # final name replaces the temporary one
    (tmp_path / "josé").mkdir()
    tmp, final = tmp_path / "josé" / ".rank0.pt.trace.json.tmp", tmp_path / "josé" / "rank0.pt.trace.json"
    tmp.write_text(json.dumps({"traceEvents": [], "traceName": str(tmp)}, indent=2, ensure_ascii=False))
    profiling._name_trace(tmp, final)
    assert json.loads(tmp.read_text())["traceName"] == str(final)
    for name in ("rank0.pt.trace.json", "rank0.attempt1.pt.trace.json"):
        (tmp_path / name).write_text("{}")
    say = lambda key, **f: translated("cli", f"run_says.{key}", "en", **f)  # noqa: E731
    assert "(2 files" in profile_traces_line(record, say)
    assert profile_traces_line(SimpleNamespace(config={}), say) is None


def test_a_pipeline_blocks_time_without_a_core_has_its_own_track():
    # lesson 5's check counts a block's CPU time as its work and the rest as cpu_contention: the trace draws
    # that rest on a "no core" track (at the block's end), so idle + wait + no core add up to the bubble printed
    events = [{"kind": "pp_op", "rank": 0, "t0": T, "t1": T + 0.010, "op": "F", "mb": 0, "stage": 0, "chunk": 0,
               "schedule": "1f1b", "step": 0, "compute": 0.004},
              {"kind": "pp_op", "rank": 0, "t0": T + 0.010, "t1": T + 0.012, "op": "B", "mb": 0, "stage": 0,
               "chunk": 0, "schedule": "1f1b", "step": 0, "compute": 0.002}]  # all of it on a core: nothing drawn
    spans, _ = operations(events)
    (no_core,) = [s for s in spans if s["stream"] == "no core"]
    assert no_core["name"] == "F mb0 stage0: no core"
    assert (no_core["t0"], no_core["t1"]) == pytest.approx((T + 0.004, T + 0.010))
    assert check_trace(chrome_trace(events)) == []


def test_metrics_keep_a_count_whole_in_csv_and_jsonl():
    """A count (tokens, bytes, a step's calls) is written "4096", not "4096.0"; a float stays a float."""
    from distai.engine.trace_export import metrics_csv, metrics_jsonl

    events = [{"kind": "step", "t": 1.0, "rank": 0, "step": 0, "tokens": 4096, "loss": 2.5},
              {"kind": "metric", "t": 2.0, "rank": 0, "name": "bytes", "value": 1048576}]
    rows = metric_rows(events)
    cells = {r["name"]: r["value"] for r in csv.DictReader(io.StringIO(metrics_csv(rows)))}
    assert cells == {"tokens": "4096", "loss": "2.5", "bytes": "1048576"}
    values = {r["name"]: r["value"] for r in map(json.loads, metrics_jsonl(rows).splitlines())}
    assert values == {"tokens": 4096, "loss": 2.5, "bytes": 1048576}
    assert isinstance(values["tokens"], int) and isinstance(values["bytes"], int)
