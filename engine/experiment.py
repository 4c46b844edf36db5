"""The one entry point every experiment runs in, and the small helpers experiments share.

:func:`run_experiment` parses the arguments, joins the process group, runs the experiment's body,
emits the summary it returns (rank 0 only), and always shuts down (in a ``finally``):

* bad input — argparse's own errors, or an exception of one of the experiment's ``usage_errors``
  types — is one line on stderr (``lessonN: error: …``) and exit status 2, never a traceback;
* any other exception on a rank becomes an ``error`` event (with its traceback) and exit status
  1, so the launcher can say which rank failed first and why.

Run as a script (``python -m …``), :func:`exit_with` ends the process with that status through
``os._exit``, success included: no interpreter teardown, no C++ static destructors, no ``atexit``
hooks. Native threads can still be running at that point — gloo's (``destroy_process_group``
does not stop them once a c10d op went through a ``TorchDispatchMode`` such as ``CommMeter``,
which keeps the group alive: torch 2.13), a torch op in a daemon thread — and a native thread
that meets a finalizing interpreter ends the rank with ``terminate called without an active
exception`` (SIGABRT) after its work was done; a dead peer can make a teardown hang there too.
No signal handlers are installed (but ``--profile``'s, which writes the trace on SIGTERM first:
``engine/profiling.py``): torchrun's SIGTERM (and the launcher's SIGKILL) must end a rank even while it
is blocked inside a collective.

:func:`checkpoint` is a ``monitored_barrier`` between phases: when a rank does not arrive in
time, rank 0's error names it ("Rank 2 failed to pass monitoredBarrier …"), which the launcher
turns into "rank 2 did not arrive". It needs a gloo group; on NCCL runs a side gloo group is
made once.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..lessons.checks import EQUAL_TO_ONE_PROCESS, equal_to_one_process
from ..lessons.events import ERROR, PROGRESS, SUMMARY, Error
from ..lessons.strings import TranslatedError, detect_language, translated
from ..lessons.units import format_integer, format_number
from .events import EventSink

__all__ = ["run_experiment", "UsageError", "launch_world_size", "exit_with", "checkpoint", "Progress", "device_sync", "max_over_ranks",
           "all_ranks_true", "BARRIER_TIMEOUT_ENV", "TIMEOUT_ENV", "collective_timeout_s", "barrier_timeout_s", "folder_refusal", "CHECK_ARGS_ENV", "run_language", "summary_lines",
           "equality_verdict"]

BARRIER_TIMEOUT_ENV = "DISTAI_BARRIER_TIMEOUT_S"
TIMEOUT_ENV = "DISTAI_COLLECTIVE_TIMEOUT_S"


def _seconds_from_env(name: str, default: str) -> float:
    """The environment's ``name``, a number of seconds above 0, else ``default``; a :class:`UsageError` (one
    line) for anything else ("abc" was a ValueError's traceback on every rank, -5 a failed first barrier)."""
    text = os.environ.get(name, default)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError.keyed("timeout_env", name=name, value=repr(text))
    return seconds


def collective_timeout_s(timeout_s: float | None = None) -> float:
    """How long a rank waits for its peers in a collective before it gives up (so a dead or frozen peer ends
    the run instead of hanging it): ``timeout_s``, else DISTAI_COLLECTIVE_TIMEOUT_S, else 120 s."""
    return float(timeout_s) if timeout_s else _seconds_from_env(TIMEOUT_ENV, "120")


def barrier_timeout_s(timeout_s: float | None = None) -> float:
    """How long every rank waits at a named :func:`checkpoint` for the others: ``timeout_s``, else
    DISTAI_BARRIER_TIMEOUT_S, else 60 s."""
    return float(timeout_s) if timeout_s is not None else _seconds_from_env(BARRIER_TIMEOUT_ENV, "60")


#: set by ``distai run`` for one process before the launch: parse and check the options, print what is
#: wrong as one JSON line (:func:`_check_arguments`) and exit, without joining a group
CHECK_ARGS_ENV = "DISTAI_CHECK_ARGS"
_gloo_group: Any = None



def run_language() -> str:
    """The language of rank 0's printed summary: the learner's, which the launcher passes in
    ``DISTAI_LANG`` (else the locale the ranks inherit, else English)."""
    return detect_language()


def summary_lines(section: str, lang: str) -> Callable[..., str]:
    """``say(key, **fields)``: one line of an experiment's printed summary, the template
    ``<section>.<key>`` of ``lessons/catalog/summary.toml`` in ``lang`` (numbers already formatted
    by ``lessons/units.py``)."""
    def say(key: str, /, **fields: Any) -> str:
        return translated("summary", f"{section}.{key}", lang, **fields)
    return say


def equality_verdict(loss_rel_diff: float, param_rel_diff: float, dtype: str, lang: str) -> str:
    """"equal (≤ 1e-12 in float64)" or "NOT equal (…)": a run's largest differences from one
    process against the bound for its dtype (``lessons/checks.py``), in ``lang``."""
    key = "equal" if equal_to_one_process(dtype, loss_rel_diff, param_rel_diff) else "not_equal"
    return translated("summary", f"equality.{key}", lang, bound=format_number(EQUAL_TO_ONE_PROCESS[dtype], 1, lang),
                      dtype=dtype)


class UsageError(TranslatedError):
    """Bad input an experiment finds itself (after argparse): one line, exit status 2, in every
    language (``keyed``: ``lessons/catalog/run_checks.toml``'s ``usage.*``)."""

    area, prefix = "run_checks", "usage."


#: the most training steps a run may ask for: a learner's run ends in minutes or hours, and some experiments
#: build their data up front (``--steps 1e23`` filled memory before the first step)
MAX_STEPS = 1_000_000


#: options that are sizes or counts in every experiment that has them: a model's and a batch's sizes, degrees,
#: microbatches, chunks, requests … (0 or less was a rank's traceback, "negative dimension -4", or the
#: default put in its place without a word, or a refusal only after the launch)
AT_LEAST_ONE = frozenset({
    "hidden", "heads", "kv_heads", "layers", "vocab", "seq", "ffn", "batch", "batch_per_rank", "micro_batch",
    "microbatch_size", "microbatches", "chunks", "dp_hidden", "dp_layers", "dp_batch", "prompt", "new_tokens",
    "requests", "block_size", "kv_budget", "max_batch", "replicas", "route_requests", "prefix_slots", "tp", "pp",
    "dp", "cp", "ep", "experts", "top_k", "samples", "features", "ckpt_every", "keep", "iters", "pieces",
    "channels", "growth_interval"})


def folder_refusal(folder: str | os.PathLike) -> OSError | None:
    """Why this process could not make or write ``folder`` (its nearest existing ancestor is not a folder it may
    write into, or a file stands in its place), else None: an option naming a folder is checked by the one
    process that checks the options before the launch, where each rank raised a PermissionError's traceback."""
    import errno

    path = os.path.abspath(os.fspath(folder))
    while not os.path.exists(path) and os.path.dirname(path) != path:  # exists: False where stat is refused too
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        return OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    if not os.access(path, os.W_OK | os.X_OK):
        return OSError(errno.EACCES, os.strerror(errno.EACCES), path)
    return None


#: options that are seconds a rank waits (0 or less failed the first barrier, on every rank, with a traceback)
ABOVE_ZERO = frozenset({"barrier_timeout"})


def check_values(args: argparse.Namespace) -> None:
    """What no experiment can run, whatever its options mean: a non-finite number (``--lr nan`` trained to a
    NaN loss and said "finished"), a size or count below 1 (:data:`AT_LEAST_ONE`), a wait of 0 s or less
    (:data:`ABOVE_ZERO`), more than :data:`MAX_STEPS` steps. A :class:`UsageError` (one line)."""
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError.keyed("not_finite", flag="--" + name.replace("_", "-"), value=value)
        if name in ABOVE_ZERO and isinstance(value, (int, float)) and value <= 0:
            raise UsageError.keyed("above_zero", flag="--" + name.replace("_", "-"), value=value)
        if name in AT_LEAST_ONE and isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise UsageError.keyed("at_least_one", flag="--" + name.replace("_", "-"), value=value)
    steps = getattr(args, "steps", None)
    if isinstance(steps, int) and steps > MAX_STEPS:
        raise UsageError.keyed("steps_most", most=lambda lang: format_integer(MAX_STEPS, lang), value=steps)


def launch_world_size() -> int:
    """The ranks the run has, as torchrun (or ``distai run``'s check before the launch) says in
    ``WORLD_SIZE``; without it, the size of a group already joined, else 1. For the checks of the
    options that need it (:func:`run_experiment`'s ``check``)."""
    if "WORLD_SIZE" not in os.environ:  # a group joined by hand (the tests' run_in_group): its size
        dist = sys.modules.get("torch.distributed")
        return dist.get_world_size() if dist is not None and dist.is_initialized() else 1
    try:
        return max(1, int(os.environ["WORLD_SIZE"]))
    except ValueError:
        return 1


#: ``body(ctx, args)`` returns the summary (rank 0's is emitted; None: nothing), or
#: ``(summary, status)`` to end with a non-zero status that is not an error (a verdict)
Body = Callable[[Any, argparse.Namespace], Any]


def _report_error(exc: BaseException, events: EventSink | None) -> None:
    """An ``error`` event (this rank's sink, or a fresh one) and the traceback on stderr."""
    tb = traceback.format_exc()
    fields: Error = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tb[-6000:]}
    try:
        if events is not None and events.enabled:
            ERROR.emit(events, fields)
        else:
            sink = EventSink(int(os.environ.get("RANK", "0")))
            ERROR.emit(sink, fields)
            sink.close()
    except OSError:
        pass
    sys.stderr.write(tb)
    sys.stderr.flush()


def run_experiment(prog: str, parse: Callable[[list[str] | None], argparse.Namespace], body: Body,
                   argv: list[str] | None = None, *,
                   usage_errors: tuple[type[BaseException], ...] = (),
                   check: Callable[[argparse.Namespace], object] | None = None,
                   before_init: Callable[[argparse.Namespace], None] | None = None) -> int:
    """Parse ``argv`` with ``parse`` (an ``ArgumentParser.parse_args``: bad flags exit 2 with its
    one-line message), join the group, run ``body(ctx, args)``, emit the summary it returns on
    rank 0, shut down. Returns the exit status: 0, 1 (an exception, reported as an ``error``
    event) or 2 (bad input: a :class:`UsageError` or a ``usage_errors`` exception, one line on
    stderr). ``check(args)`` refuses what the options cannot run (a usage error; the world size from
    :func:`launch_world_size`): pure, so that ``distai run`` asks it before launching anything;
    ``before_init(args)`` runs next (environment a run needs, a custom rendezvous)."""
    bad_input: tuple[type[BaseException], ...] = (UsageError, *usage_errors)
    if os.environ.get(CHECK_ARGS_ENV):
        return _check_arguments(parse, argv, bad_input, check)
    ctx = None
    try:
        from .lifeline import watch_launcher
        from .runtime import init_distributed

        # before anything that can block (lesson 3's own rendezvous in before_init waits for torchrun's store):
        # a rank never outlives torchrun or the command that started it
        watch_launcher()
        args = parse(argv)  # a usage error raised while parsing is bad input too
        check_values(args)
        if check is not None:
            check(args)

        if before_init is not None:
            before_init(args)
        ctx = init_distributed()
        same_options_on_every_node(args, ctx.world_size)
        result = body(ctx, args)
        summary, status = result if isinstance(result, tuple) else (result, 0)
        if summary is not None and ctx.rank == 0:
            SUMMARY.emit_fields(ctx.events, summary)
        return status
    except bad_input as exc:
        # every rank says why, in the run's language: whichever one the launcher reports first shows it
        why = exc.text(run_language()) if isinstance(exc, TranslatedError) else str(exc)
        print(f"{prog}: error: {why}", file=sys.stderr, flush=True)
        return 2
    except Exception as exc:  # noqa: BLE001 - reported as an event, then the status says it
        _report_error(exc, ctx.events if ctx is not None else None)
        return 1
    finally:
        sys.stdout.flush()
        from .runtime import shutdown

        shutdown(ctx)


#: options a node may set for itself: a checkpoint folder on each node's own disk
PER_NODE_OPTIONS = frozenset({"ckpt_dir"})


def same_options_on_every_node(args: argparse.Namespace, world_size: int) -> None:
    """Across nodes (``distai run`` started on each with its own command line), every rank's parsed options
    against node 0's; a difference is a usage error on every rank at once (each sees them all, so none goes
    on to a collective the others left): two nodes with different ``--steps`` otherwise met at a barrier
    one of them never reached, and the run ended 120 s later as "did not arrive"."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if not 0 < local < world_size:
        return
    import torch.distributed as dist

    mine = {k: v for k, v in vars(args).items() if k not in PER_NODE_OPTIONS}
    every: list[dict | None] = [None] * world_size
    dist.all_gather_object(every, mine)
    first = every[0] or {}
    for rank, theirs in enumerate(every):
        differ = sorted(k for k in set(first) | set(theirs or {}) if first.get(k) != (theirs or {}).get(k))
        if differ:
            flag = "--" + differ[0].replace("_", "-")
            raise UsageError.keyed("options_differ", node=rank // local, flag=flag,
                                   theirs=_shown(first.get(differ[0])), value=_shown((theirs or {}).get(differ[0])))


def _shown(value: object) -> str:
    """An option's parsed value as the learner typed it, near enough: lists comma-joined, None as 'unset'."""
    if value is None:
        return "(unset)"
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


class _ArgumentError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser, self.message = parser, message


def _check_arguments(parse: Callable[[list[str] | None], argparse.Namespace], argv: list[str] | None,
                     bad_input: tuple[type[BaseException], ...],
                     check: Callable[[argparse.Namespace], object] | None) -> int:
    """The options checked as a rank would check them before joining its group (``parse``, then
    ``check``), for ``distai run`` before it launches anything: 0, or 2 with one JSON line on
    stdout, ``{"error": argparse's or the usage error's message, "texts": its message per language
    (a translated error), "options": the option strings the experiment takes (argparse's errors)}``."""
    import json

    def refuse(self: argparse.ArgumentParser, message: str):
        raise _ArgumentError(self, message)

    argparse.ArgumentParser.error = refuse  # type: ignore[method-assign,assignment]
    try:
        args = parse(argv)
        check_values(args)
        if check is not None:
            check(args)
    except _ArgumentError as exc:
        options = sorted({s for a in exc.parser._actions for s in a.option_strings if s.startswith("--")})
        print(json.dumps({"error": exc.message, "options": options}), flush=True)
        return 2
    except bad_input as exc:
        print(json.dumps({"error": str(exc), "texts": getattr(exc, "texts", {})}), flush=True)
        return 2
    return 0


def exit_with(main: Callable[[list[str] | None], int | None], argv: list[str] | None = None) -> None:
    """End the process with ``main(argv)``'s status (for ``if __name__ == "__main__"``), through
    ``os._exit`` once stdout and stderr are flushed. An exception that escapes ``main`` is
    reported like one inside it."""
    try:
        code = main(argv) or 0
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported, then the process ends
        _report_error(exc, None)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # never the interpreter's teardown: threads still in native code abort it (see the module's doc)
    os._exit(code)


# ----------------------------------------------------------------------------------------------
# Helpers every experiment uses
# ----------------------------------------------------------------------------------------------

class Progress:
    """``progress`` events (``done``, ``total``, ``label``) from rank 0 for the run view."""

    def __init__(self, ctx: Any, total: int):
        self.ctx, self.total, self.done = ctx, max(1, total), 0

    def advance(self, label: str = "", k: int = 1) -> None:
        self.done += k
        if self.ctx.rank == 0:
            PROGRESS.emit(self.ctx.events, {"done": self.done, "total": self.total, "label": label})

    __call__ = advance


def device_sync(device: Any) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU. Timings need it."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _group_device(device: Any) -> Any:
    """Where the running group reduces: ``device``, else CUDA under NCCL and the CPU otherwise."""
    import torch.distributed as dist

    return device if device is not None else "cuda" if dist.get_backend() == "nccl" else "cpu"


def max_over_ranks(value: float, device: Any = None) -> float:
    """The largest ``value`` over all ranks (itself on one rank or outside a group)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=_group_device(device))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def slowest_rank_parts(total: float, parts: tuple[float, ...], device: Any = None) -> tuple[float, ...]:
    """``(total, *parts)`` as the rank with the largest ``total`` measured them: its time and what it
    was made of. Taking each part's maximum separately could mix ranks, and then the parts no
    longer add up to the total they explain."""
    import torch
    import torch.distributed as dist

    row = (float(total), *map(float, parts))
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return row
    mine = torch.tensor(row, dtype=torch.float64, device=_group_device(device))
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return tuple(float(x) for x in max(rows, key=lambda r: float(r[0])).tolist())


def share_cores_among_local_ranks(world_size: int) -> None:
    """Intra-op threads for one of this node's ranks on CPU: the node's cores split among its ranks
    (``LOCAL_WORLD_SIZE``, torchrun's; else ``world_size``), at least one."""
    import torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))


def all_ranks_true(flag: bool, device: Any = None) -> bool:
    return max_over_ranks(0.0 if flag else 1.0, device) == 0.0


def barrier_group() -> Any:
    """A gloo group for monitored barriers (the world group itself when it is gloo)."""
    global _gloo_group
    import torch.distributed as dist

    if dist.get_backend() == "gloo":
        return None
    if _gloo_group is None:
        _gloo_group = dist.new_group(backend="gloo")
    return _gloo_group


def checkpoint(name: str, timeout_s: float | None = None) -> None:
    """Every rank must reach ``name`` within ``timeout_s``; otherwise rank 0 names the missing ranks."""
    import torch.distributed as dist

    seconds = barrier_timeout_s(timeout_s)
    try:
        dist.monitored_barrier(group=barrier_group(), timeout=timedelta(seconds=seconds), wait_all_ranks=True)
    except RuntimeError as exc:
        raise RuntimeError(f"checkpoint {name!r}: {exc}") from None
