"""The run events' shapes, declared once: what an experiment emits and what the folds read.

Every rank writes its events as JSON lines (``engine/events.py``); the launcher adds its own
(``run_start``, ``output``, ``run_end``) and the tutor folds them (``lessons/*/…_run.py``, the run
panel, the visualizers). Each kind is an :class:`EventKind`: its name on disk and a ``TypedDict``
of its fields. The kinds every experiment shares are below; a lesson declares its own in
``lessons/<lesson>/events.py`` (``EVENTS``, which may narrow a shared kind: lesson 3's ``step``
carries ``attempt`` and ``redo``). :func:`lesson_events` is one lesson's vocabulary.

An experiment emits through the kind, so mypy checks the fields against the declaration::

    STEP.emit(ctx.events, {"step": i, "of": n, "loss": loss})

and a fold reads through it, the event narrowed to its fields::

    if STEP.matches(event):
        losses.append(event["loss"])

``t`` (wall-clock seconds) and ``rank`` are added by the sink (:class:`Envelope`). A sink whose
``check_events`` is true (``DISTAI_CHECK_EVENTS=1``, set by the test suite) also checks at run
time every event against its declaration, fields gathered in a dict (``emit_fields``) included.

No ``from __future__ import annotations`` here or in the lessons' ``events.py``: Python 3.11's
``TypedDict`` finds ``NotRequired`` only in evaluated annotations.
"""
import importlib
import math
import types
from collections.abc import Mapping
from typing import (
    Any,
    Generic,
    Literal,
    NotRequired,
    Protocol,
    TypedDict,
    TypeGuard,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

__all__ = ["Envelope", "EventKind", "SHARED", "lesson_events", "problems"]


class Envelope(TypedDict, total=False):
    """What every event carries besides its fields: the kind, and what the sink adds."""
    kind: str
    t: float | None  # None: a log line replayed from a rank's file
    rank: int | None  # None: torchrun's own output


F = TypeVar("F", bound=Envelope)

#: the envelope's keys: allowed on every event, never required
ENVELOPE_KEYS = frozenset(Envelope.__annotations__)


class Sink(Protocol):
    """Where events go (``engine.events.EventSink``)."""
    check_events: bool

    def emit(self, kind: str, **fields: Any) -> None: ...


class EventKind(Generic[F]):
    """One kind of event: its ``name`` on disk and its ``fields`` (a TypedDict). ``open``: fields
    beyond the declared ones are allowed (a summary: the figures a lesson prints)."""

    def __init__(self, name: str, fields: type[F], *, open: bool = False) -> None:
        self.name, self.fields, self.open = name, fields, open
        self._hints: tuple[dict[str, Any], frozenset[str]] | None = None

    def __repr__(self) -> str:
        return f"EventKind({self.name!r}, {self.fields.__name__})"

    def matches(self, event: Mapping[str, Any]) -> TypeGuard[F]:
        """Whether ``event`` is of this kind (then typed as its fields; a malformed one still
        needs the fold's own checks)."""
        return event.get("kind") == self.name

    def emit(self, sink: Sink | None, fields: F) -> None:
        """Emit one event of this kind (nothing without a sink)."""
        self.emit_fields(sink, fields)

    def emit_fields(self, sink: Sink | None, fields: Mapping[str, Any]) -> None:
        """Emit fields gathered elsewhere (a measurement's dict): checked at run time only."""
        if sink is None:
            return
        if getattr(sink, "check_events", False):
            found = self.problems({"kind": self.name, **fields})
            if found:
                raise ValueError(f"event {self.name!r} does not match its declaration: {'; '.join(found)}")
        sink.emit(self.name, **fields)

    def event(self, fields: F) -> dict[str, Any]:
        """The event as a dict (``kind`` first), for the launcher's own events."""
        return {"kind": self.name, **fields}

    def _declared(self) -> tuple[dict[str, Any], frozenset[str]]:
        """Its fields' types and the required ones, read on first use (the CLI imports every declaration
        and checks none)."""
        if self._hints is None:
            declared: Any = self.fields  # a TypedDict class (mypy's type[F] lacks its keys)
            self._hints = get_type_hints(declared), declared.__required_keys__
        return self._hints

    def types_hold(self, event: Mapping[str, Any]) -> bool:
        """Whether every field of ``event`` this kind declares holds its declared type (missing and
        undeclared fields aside: :meth:`problems` says those)."""
        hints = self._declared()[0]
        return all(_conforms(value, hints[key]) for key, value in event.items() if key in hints)

    def problems(self, event: Mapping[str, Any]) -> list[str]:
        """What in ``event`` does not match this declaration: missing fields, fields of the
        wrong type, fields it does not declare (none for an open kind)."""
        hints, required = self._declared()
        out = [f"missing {key!r}" for key in sorted(required) if key not in event]
        for key, value in event.items():
            if key not in hints:
                if not self.open:
                    out.append(f"undeclared {key!r}")
            elif not _conforms(value, hints[key]):
                out.append(f"{key!r} = {_short(value)} is not {_type_name(hints[key])}")
        return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _conforms(value: Any, tp: Any) -> bool:
    """Whether a JSON value has type ``tp`` (an int is a float, a bool is neither)."""
    if tp is Any or tp is object:
        return True
    if tp is None or tp is type(None):
        return value is None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(_conforms(value, arg) for arg in get_args(tp))
    if origin is Literal:
        return value in get_args(tp)
    if origin is NotRequired:
        return _conforms(value, get_args(tp)[0])
    if origin in (list, tuple):
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args))
        return not args or all(_conforms(v, args[0]) for v in value)
    if origin is dict:
        key_type, value_type = get_args(tp) or (Any, Any)
        return isinstance(value, dict) and all(_conforms(k, key_type) and _conforms(v, value_type)
                                               for k, v in value.items())
    if is_typeddict(tp):
        return isinstance(value, dict) and not EventKind("", tp).problems(value)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


# ---------------------------------------------------------------------------- the shared kinds
class RunStart(Envelope):
    """The launcher's first event (``relaunch``: which relaunch of the supervisor this is)."""
    run_id: str
    lesson: NotRequired[str | None]
    command: NotRequired[list[str]]
    nproc: NotRequired[int | None]  # the run's ranks, every node's
    nnodes: NotRequired[int]
    device: NotRequired[str | None]
    backend: NotRequired[str]  # the process group's: gloo on CPU processes, nccl on GPUs
    note: NotRequired[str | None]
    relaunch: NotRequired[int]


class RunEnd(Envelope):
    """The launcher's last event; ``relaunches``: how many the supervisor made."""
    run_id: NotRequired[str]
    status: str
    exit_code: NotRequired[int | None]
    error: NotRequired[str | None]
    failed_rank: NotRequired[int | None]
    tail: NotRequired[list[str] | None]
    duration_s: NotRequired[float | None]
    relaunches: NotRequired[int]


class Output(Envelope):
    """A line a rank (``rank``) or torchrun (``rank`` None) printed."""
    line: str


class Relaunch(Envelope):
    """The supervisor's word that a failed attempt is launched again (``attempt`` of ``of``)."""
    attempt: int
    of: int
    error: str | None
    failed_rank: int | None
    exit_code: int | None
    duration_s: float | None


class Phase(Envelope):
    """A phase of the experiment begins (a lesson may declare the figures it adds)."""
    name: str


class Progress(Envelope):
    """``done`` of ``total`` units of work (``label``: which part)."""
    done: int
    total: int
    label: NotRequired[str]


class Step(Envelope):
    """A training step ends (0-based ``step`` of ``of``); a lesson narrows it with its figures (its start,
    ``t0``, puts it on the run's trace; ``name``, its name there where the lesson's texts count steps
    otherwise: lesson 3 counts from 1)."""
    step: int
    of: int
    loss: float
    name: NotRequired[str]


class Summary(Envelope):
    """Rank 0's figures at the end (the lesson's own, beyond the declared ones)."""


class Error(Envelope):
    """An exception on a rank: its one-line message and its traceback."""
    error: str
    traceback: str


class Log(Envelope):
    """A message for the run's log."""
    msg: str


class Metric(Envelope):
    """One named number (``distai runs export --format csv``)."""
    name: str
    value: float
    step: NotRequired[int]


class Span(Envelope):
    """A timed operation (``t0``…``t1`` wall-clock seconds) on ``stream``'s track of the trace;
    the fields after ``t1`` say what it was (a collective's ``op`` and ``bytes``, the step's;
    ``check`` and ``block``: a part of a check's timed region, its ``block``-th step or phase, as
    the check decomposes it: ``engine/comm_trace.trace_causes``)."""
    name: str
    stream: str
    t0: float
    t1: float
    op: NotRequired[str]
    bytes: NotRequired[int]
    step: NotRequired[int]
    schedule: NotRequired[str]
    strategy: NotRequired[str]
    mode: NotRequired[str]
    check: NotRequired[str]
    block: NotRequired[int]
    attempt: NotRequired[int]  # a training step's, on a rank other than 0 (lesson 3: after a restart)
    redo: NotRequired[bool]
    skipped: NotRequired[bool]  # lesson 6: the scaler skipped the step's update


class Check(Envelope):
    """A lesson's prediction checked against the run's measurement (issue 28): ``name`` (a catalog
    key of ``lessons/catalog/checks.toml``), ``predicted`` and ``measured`` in ``unit``
    (``"s"``, ``"B"``, ``"fraction"``, ``"B/s"``, ``"count"``), ``tolerance`` (relative), ``ok``, and
    when not ok ``causes``: each named cause (a catalog key) and its amount in ``unit``, such that
    predicted + Σ causes ≈ measured (``lessons/checks.reconcile``). ``detail``: the figures behind
    the prediction (for ``runs show --json``). ``decomposition`` (true, or absent): the causes are the
    measurement's own parts, timed together, and add up to it by construction (shown broken down)."""
    name: str
    predicted: float
    measured: float
    unit: str
    tolerance: float
    ok: bool
    causes: NotRequired[dict[str, float]]
    detail: NotRequired[dict[str, float]]
    decomposition: NotRequired[bool]


RUN_START = EventKind("run_start", RunStart)
RUN_END = EventKind("run_end", RunEnd)
OUTPUT = EventKind("output", Output)
RELAUNCH = EventKind("relaunch", Relaunch)
PHASE = EventKind("phase", Phase)
PROGRESS = EventKind("progress", Progress)
STEP = EventKind("step", Step)
SUMMARY = EventKind("summary", Summary, open=True)
ERROR = EventKind("error", Error)
LOG = EventKind("log", Log)
METRIC = EventKind("metric", Metric)
SPAN = EventKind("span", Span)
CHECK = EventKind("check", Check)

#: the kinds of every run
SHARED: tuple[EventKind[Any], ...] = (RUN_START, RUN_END, OUTPUT, RELAUNCH, PHASE, PROGRESS, STEP, SUMMARY,
                                      ERROR, LOG, METRIC, SPAN, CHECK)


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float (a NaN loss, an inf scale) as None, recursively: what leaves
    distai as JSON (``--json`` streams, ``runs export``, ``runs show --json``) is strict JSON (RFC 8259),
    which Python's ``NaN`` and ``Infinity`` are not."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def lesson_events(lesson: str) -> dict[str, EventKind[Any]]:
    """Every kind a run of ``lesson`` (its folder's name) may hold, by name: the shared ones,
    as its ``events.py`` narrows or adds to them."""
    kinds = {k.name: k for k in SHARED}
    try:
        module = importlib.import_module(f"{__package__}.{lesson}.events")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.{lesson}.events":
            raise
        return kinds
    for kind in module.EVENTS:
        kinds[kind.name] = kind
    return kinds


def fields_readable(event: Mapping[str, Any], kinds: Mapping[str, EventKind[Any]]) -> bool:
    """Whether every field ``event``'s kind declares holds its declared type, as every reader of it assumes
    (a damaged or hand-edited file's ``"step": Infinity``, ``"done": 1e999``: not counts). Missing and
    undeclared fields are the readers' to handle; an undeclared kind is read as it is."""
    kind = kinds.get(str(event.get("kind")))
    return kind is None or kind.types_hold(event)


def problems(event: Mapping[str, Any], kinds: Mapping[str, EventKind[Any]]) -> list[str]:
    """What in ``event`` does not match the declaration of its kind among ``kinds``."""
    kind = kinds.get(str(event.get("kind")))
    if kind is None:
        return [f"undeclared kind {event.get('kind')!r}"]
    return kind.problems(event)
