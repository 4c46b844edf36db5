"""Keep a run going through failures: torchrun's in-place restarts, and a relaunch when those fail.

torchrun's elastic agent (``--max-restarts N``) restarts the whole worker group in place when a
worker dies. With gloo that restart can itself fail to form the new group ("Gloo connectFullMesh
failed … Connection refused", seen on this machine); after N such tries torchrun gives up. The
:class:`Supervisor` then launches torchrun again — a fresh ``--standalone`` launch, so a fresh
rendezvous port — into the same run folder, up to ``relaunches`` times. The experiment resumes
from its last checkpoint whichever way it was restarted (it must always start by resuming).

:class:`Supervisor` has :class:`~distai.engine.launcher.Launch`'s interface (``start``, ``run``,
``stop``, ``record``), so a caller swaps one for the other (:func:`make_launch`). The consumer
sees one run: the ``run_end`` of a failed attempt that will be relaunched becomes a ``relaunch``
(attempt ``k`` of ``relaunches``, with the failure's error, rank, exit code and duration;
``lessons/events.py``), and only the last attempt's ``run_end`` (with the total duration) goes through. Each relaunch
streams only the events written after it starts (the run folder keeps every attempt's). The
record's ``config["relaunches"]`` lists the failures that caused them. Single node only: a
multi-node run is launched once, as before (its port is the user's).

Nothing here imports torch.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace

from ..lessons.events import RELAUNCH, RUN_END, RUN_START
from .durable import DISK_FULL
from .launcher import Consumer, Launch, LaunchSpec, Stoppable
from .profiling import RELAUNCH_ENV
from .runs import RunRecord


class Supervisor(Stoppable):
    """A run that is relaunched (fresh torchrun, fresh port) after a failure, ``relaunches`` times at most."""

    def __init__(self, spec: LaunchSpec, record: RunRecord, consumer: Consumer | None = None,
                 relaunches: int = 3, grace_s: float = 5.0, launch_cls: type[Launch] = Launch):
        if relaunches < 0:
            raise ValueError("relaunches must be >= 0")
        self.spec, self.record, self.consumer = spec, record, consumer
        self.relaunches = 0 if spec.multinode else relaunches
        self.grace_s = grace_s
        self.launch_cls = launch_cls
        self.attempt = 0  # relaunches so far
        self.current: Launch | None = None
        self.failures: list[dict] = []
        self._stop_reason: str | None = None
        self._started: float | None = None

    # ---- Launch's interface ----
    def start(self) -> None:
        if self._started is None:
            self._started = time.time()
        spec = replace(self.spec, env={**self.spec.env, RELAUNCH_ENV: str(self.attempt)}) if self.attempt else self.spec
        self.current = self.launch_cls(spec, self.record, self._forward, grace_s=self.grace_s)
        if self._stop_reason is not None:  # a stop that came between the last attempt's end and this one
            self.current.stop(self._stop_reason)  # Launch.start then stops its processes as they start
        self.current.start()

    def stop(self, reason: str = "stopped by the user") -> None:
        self._stop_reason = self._stop_reason or reason
        if self.current is not None:
            self.current.stop(reason)

    def run(self) -> RunRecord:
        """Run, relaunching after failures; Ctrl-C stops the current attempt and is re-raised."""
        if self.current is None:
            self.start()
        while True:
            assert self.current is not None
            record = self.current.run()
            if not self._will_relaunch(record.status, record.error):
                break
            self.failures.append({"attempt": self.attempt, "error": record.error, "failed_rank": record.failed_rank,
                                  "exit_code": record.exit_code})
            self.attempt += 1
            record.error, record.failed_rank, record.error_tail, record.exit_code = None, None, [], None
            record.config["relaunches"] = list(self.failures)
            with contextlib.suppress(OSError):  # a full disk: the launch has said its record could not be saved
                record.save()
            self.start()
        if self.failures:
            record.config["relaunches"] = list(self.failures)
        if self._started is not None:
            record.duration_s = time.time() - self._started
        with contextlib.suppress(OSError):
            record.save()
        return record

    # ---- internals ----
    def _will_relaunch(self, status: str | None, error: str | None = None) -> bool:
        """After a failure that a fresh start could get past: not a stop, not past the count, and not a full disk
        (a rank's ``OSError: [Errno 28]``: ``durable.DISK_FULL``), where every relaunch would fail the same way."""
        disk_full = any(f"[Errno {code}]" in (error or "") for code in DISK_FULL)
        return status == "failed" and self._stop_reason is None and self.attempt < self.relaunches and not disk_full

    def _forward(self, event: dict) -> None:
        if self.consumer is None:
            return
        if RUN_END.matches(event):
            if self._will_relaunch(event.get("status"), event.get("error")):
                event = RELAUNCH.event({"t": event.get("t", time.time()), "attempt": self.attempt + 1,
                                        "of": self.relaunches, "error": event.get("error"),
                                        "failed_rank": event.get("failed_rank"), "exit_code": event.get("exit_code"),
                                        "duration_s": event.get("duration_s")})
            elif self._started is not None:
                event = {**event, "duration_s": time.time() - self._started, "relaunches": self.attempt}
        elif RUN_START.matches(event) and self.attempt:
            event = {**event, "relaunch": self.attempt}
        self.consumer(event)


def make_launch(spec: LaunchSpec, record: RunRecord, consumer: Consumer | None = None,
                max_restarts: int = 0, grace_s: float = 5.0):
    """A plain :class:`Launch` when no restart is wanted; otherwise torchrun with
    ``--max-restarts max_restarts`` under a :class:`Supervisor` allowed as many relaunches."""
    if max_restarts <= 0:
        return Launch(spec, record, consumer, grace_s=grace_s)
    spec.max_restarts = max_restarts
    return Supervisor(spec, record, consumer, relaunches=max_restarts, grace_s=grace_s)
