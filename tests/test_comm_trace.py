"""Collectives timed for a run's trace by the one communication meter (a dispatch mode, no wrapper
of torch.distributed): blocking and async ones, named with their payload, emitted as comm spans
nested in the step; nothing is recorded after the block."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from distai.engine.comm_trace import traced_step
from distai.engine.events import EventSink, read_events
from distai.engine.metering import CommMeter
from distai.engine.testing import run_in_group

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another


def _traced(rank: int, world: int, events_dir: str) -> dict:
    sink = EventSink(rank, events_dir)
    original = dist.all_reduce
    with traced_step(sink, "step 0", step=0):
        untouched = dist.all_reduce is original
        x = torch.ones(1024)
        dist.all_reduce(x)
        out = torch.empty(world * 256)
        dist.all_gather_into_tensor(out, torch.full((256,), float(rank)), async_op=True).wait()
        shard = torch.empty(256)
        dist.reduce_scatter_tensor(shard, torch.ones(world * 256))
        # a functional collective (DTensor's kind): its c10d op is out of sight, its wait is not
        functional = funcol.wait_tensor(funcol.all_gather_tensor(torch.full((128,), float(rank)), 0,
                                                                 dist.group.WORLD))
    dist.all_reduce(torch.ones(4))  # after the block: not recorded
    with traced_step(sink, "step 1", collectives=False, step=1):  # a timed step: no meter, its span only
        metered = torch._C._is_torch_function_mode_enabled() or bool(torch.utils._python_dispatch._get_current_dispatch_mode())
        dist.all_reduce(torch.ones(8))
    caller = CommMeter()  # a step the experiment meters anyway: its meter's records are drawn
    with caller, traced_step(sink, "step 2", meter=caller, step=2):
        meters = len(torch.utils._python_dispatch._get_current_dispatch_mode_stack())
        dist.all_reduce(torch.ones(16))
    sink.close()
    return {"sum": float(x[0]), "gathered": out.tolist()[::256], "untouched": untouched,
            "functional": functional.tolist()[::128], "metered": metered, "meters": meters,
            "caller_ops": [r.op for r in caller.records]}


def test_collectives_become_comm_spans_inside_the_step(tmp_path):
    results = run_in_group(_traced, 2, str(tmp_path), timeout_s=60)
    assert [r["sum"] for r in results] == [2.0, 2.0] and results[0]["gathered"] == [0.0, 1.0]
    assert all(r["untouched"] for r in results) and results[1]["functional"] == [0.0, 1.0]
    for rank in (0, 1):
        events = list(read_events(tmp_path / f"rank{rank}.jsonl"))
        comm = [e for e in events if e["stream"] == "comm" and e["step"] == 0]
        step, timed, shared = [e for e in events if e["stream"] == "compute"]
        assert (step["name"], timed["name"]) == ("step 0", "step 1") and not results[rank]["metered"]
        # with the caller's meter: one dispatch mode, and its record drawn as the step's span
        assert results[rank]["meters"] == 1 and results[rank]["caller_ops"] == ["all_reduce"]
        assert [(e["op"], e["bytes"], e["step"]) for e in events if e["stream"] == "comm" and e["step"] == 2] \
            == [("all_reduce", 64, 2)]
        assert [(e["op"], e["bytes"]) for e in comm] == [("all_reduce", 4096), ("all_gather", 1024),
                                                        ("reduce_scatter", 2048), ("all_gather", 512)]
        assert [e["name"] for e in comm] == ["all_reduce 4 KiB", "all_gather 1 KiB", "reduce_scatter 2 KiB",
                                             "all_gather 512 B"]
        assert all(step["t0"] <= e["t0"] <= e["t1"] <= step["t1"] and e["step"] == 0 for e in comm)


class _Spans:
    """A sink that keeps the span events a run's trace would get."""
    enabled = True

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, float, float]] = []

    def emit(self, kind: str, **f) -> None:
        assert kind == "span"
        self.spans.append((f["stream"], f["name"], round(f["t0"], 9), round(f["t1"], 9)))


def test_trace_causes_draws_known_waits_and_gaps(monkeypatch):
    """``trace_causes`` on made-up spans whose answer is worked out by hand (the runs' traces only show that
    the tracks tile a block, which they do by construction): this rank's block 10.0–11.0 s, its two
    collectives 10.2–10.5 (0.1 s of it waiting for the last peer) and 10.7–10.8, and a third whose wait (0.5 s)
    outlasts it; the other rank's block 9.9–11.2 s, so this one idles before and after its own."""
    from distai.engine import comm_trace

    monkeypatch.setattr(comm_trace, "_everyone", lambda mine, group=None: [mine, [(9.9, 11.2)]])
    sink = _Spans()
    comm_trace.trace_causes(sink, [(10.0, 11.0)], [(10.2, 10.5), (10.7, 10.8), (10.85, 10.9)], [0.1, 0.0, 0.5],
                            names="all_reduce")
    assert sorted(sink.spans, key=lambda s: (s[2], s[0])) == [
        ("idle", "idle", 9.9, 10.0),
        ("compute", "compute", 10.0, 10.2),
        ("wait", "wait for the last peer (all_reduce)", 10.2, 10.3),
        ("comm", "all_reduce", 10.3, 10.5),
        ("compute", "compute", 10.5, 10.7),
        ("comm", "all_reduce", 10.7, 10.8),  # no wait: no zero-length span
        ("compute", "compute", 10.8, 10.85),
        ("wait", "wait for the last peer (all_reduce)", 10.85, 10.9),  # the wait cut at the collective's end
        ("compute", "compute", 10.9, 11.0),
        ("idle", "idle", 11.0, 11.2),
    ]
    quiet = _Spans()  # a sink that writes nowhere draws nothing
    quiet.enabled = False
    comm_trace.trace_causes(quiet, [(10.0, 11.0)], [(10.2, 10.5)], [0.1])
    assert quiet.spans == []
