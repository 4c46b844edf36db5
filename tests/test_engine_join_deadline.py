"""A rank that cannot join its process group exits instead of waiting forever (engine/runtime.join_deadline).

gloo's connectFullMesh was seen waiting more than 7 minutes under a 120 s timeout in lesson 3's
``--plain-init`` restarts (a peer's address from an earlier attempt in torchrun's store): the attempt never
failed, so neither torchrun nor the engine's supervisor could restart the group."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from distai.engine.runtime import JOIN_FAILED_EXIT, JOIN_GRACE_S


def _rank(body: str, timeout_s: float, lang: str = "en") -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import threading, time
        from datetime import timedelta
        import distai.engine.runtime as runtime
        runtime.JOIN_GRACE_S = 0.2
        with runtime.join_deadline(timedelta(seconds={timeout_s}), 1, 2):
            {body}
        print("joined")
        time.sleep(1.0)  # the deadline's thread must not fire once the rank has joined
        print("still here")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DISTAI_LANG": lang})


def test_a_rank_stuck_joining_exits_with_one_line_and_a_failing_code():
    started = time.monotonic()
    out = _rank("threading.Event().wait()  # a join that never returns", 0.5)
    assert out.returncode == JOIN_FAILED_EXIT != 0, out
    # 2 ranks: the store and one peer may each take the timeout, then the grace: 2 × 0.5 + 0.2 s
    assert "rank 1: could not join the process group in 1.2 s" in out.stderr and "joined" not in out.stdout
    assert time.monotonic() - started < 20
    # in the learner's language, as the run's ending says it (it was English in a Spanish run's log)
    es = _rank("threading.Event().wait()", 0.5, "es")
    assert "rank 1: no pudo unirse al grupo de procesos en 1,2 s" in es.stderr, es.stderr


def test_a_rank_that_joins_in_time_goes_on():
    out = _rank("time.sleep(0.7)", 0.5)  # longer than one timeout, shorter than two: a staggered healthy join
    assert out.returncode == 0 and out.stdout.splitlines() == ["joined", "still here"], out
    assert JOIN_GRACE_S > 0
