"""Slow independent launches started together in a module fixture, each test then reading the one it checks."""
from __future__ import annotations

import threading
from collections.abc import Callable


def run_concurrently(jobs: dict[str, Callable[[], object]], timeout_s: float) -> dict[str, object]:
    """Each job in its own thread, all at once: name -> what it returned, or the exception it raised
    (kept for ``outcome`` to raise in the test that reads it, so one failed launch fails one test)."""
    results: dict[str, object] = {}

    def run(name, fn):
        try:
            results[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the test that needs it
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    return results


def outcome(results: dict[str, object], name: str):
    """What job ``name`` returned; the exception it raised, raised again here."""
    value = results[name]
    if isinstance(value, BaseException):
        raise value
    return value
