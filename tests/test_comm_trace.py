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
