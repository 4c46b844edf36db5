"""The one experiment entry point (``distai.engine.experiment.run_experiment``): a body that raises
mid-run becomes an ``error`` event and exit status 1, bad input exit status 2 with one line, a
finished body's summary is emitted by rank 0 alone; the process group is shut down every time."""
from __future__ import annotations

import pytest

from distai.engine.testing import run_in_group

pytestmark = pytest.mark.multi_rank  # README's command runs these on one worker, one after another


class Boom(RuntimeError):
    pass


def _body_ok(ctx, args):
    ctx.events.emit("step", step=0)
    return {"answer": args.value}


def _body_raises(ctx, args):
    ctx.events.emit("step", step=0)
    raise Boom(f"failed mid-run at value {args.value}")


def _body_bad_input(ctx, args):
    from distai.engine.experiment import UsageError

    raise UsageError(f"--value must be positive, got {args.value}")


_BODIES = {"ok": _body_ok, "raises": _body_raises, "bad_input": _body_bad_input}


def _entry_check(rank: int, world_size: int, name: str, events_root: str) -> dict:
    """One run of ``run_experiment`` in the group run_in_group started (the run ends it: each body gets its
    own group; re-joining a fresh group in the same processes failed now and then under load)."""
    import argparse
    import contextlib
    import io
    import os
    from pathlib import Path

    import torch.distributed as dist

    from distai.engine.events import read_events
    from distai.engine.experiment import run_experiment

    parser = argparse.ArgumentParser(prog="demo")
    parser.add_argument("--value", type=int, default=7)
    folder = Path(events_root) / name
    os.environ["DISTAI_EVENTS_DIR"] = str(folder)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = run_experiment("demo", parser.parse_args, _BODIES[name], ["--value", "3"])
    return {"rc": rc, "group_alive": dist.is_initialized(), "stderr": err.getvalue(),
            "events": list(read_events(folder / f"rank{rank}.jsonl"))}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("entry"))
    runs = {name: run_in_group(_entry_check, 2, name, root, timeout_s=60) for name in _BODIES}
    return [{name: runs[name][rank] for name in _BODIES} for rank in range(2)]


def test_an_exception_mid_run_is_an_error_event_and_the_group_is_shut_down(results):
    for r in results:
        run = r["raises"]
        assert run["rc"] == 1 and not run["group_alive"]
        kinds = [e["kind"] for e in run["events"]]
        assert kinds == ["step", "error"]  # what ran before the failure, then the failure itself
        error = run["events"][-1]
        assert error["error"] == "Boom: failed mid-run at value 3"
        assert "_body_raises" in error["traceback"]


def test_bad_input_is_one_line_and_status_2(results):
    for r in results:
        run = r["bad_input"]
        assert run["rc"] == 2 and not run["group_alive"]
        assert run["stderr"] == "demo: error: --value must be positive, got 3\n"
        assert all(e["kind"] != "error" for e in run["events"])


def test_rank_0_alone_emits_the_summary(results):
    for rank, r in enumerate(results):
        run = r["ok"]
        assert run["rc"] == 0 and not run["group_alive"]
        summaries = [e for e in run["events"] if e["kind"] == "summary"]
        assert summaries == ([{**summaries[0], "answer": 3}] if rank == 0 else [])
