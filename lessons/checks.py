"""A lesson's prediction against the run's measurement: one rule for every lesson (issue 28).

A run checks each quantity its lesson predicts (a bubble, a step time, an all-reduce time, the
bytes a strategy keeps) with one ``check`` event (``lessons/events.CHECK``). A check is ``ok`` when
the measurement is within ``tolerance`` (relative) of the prediction. When it is not, the run names
the causes of the gap and measures each (unequal stages, waiting for a peer, CPU contention…):
they must account for it, ``predicted + Σ causes`` within ``tolerance`` of ``measured``, or the
decomposition itself is wrong and the check says so (``explained`` false). Where the causes are the
measurement's own parts, timed together (a second of the step is on a core, waiting for one, or
asleep), they add up to it by construction: such a check (``decomposition``) cannot come out
unexplained, and a miss is shown as broken down into its parts, not as explained.

Pure: the engine builds checks from its measurements, the tutor and ``distai run`` show them.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Check", "check", "explained", "reconcile", "DEFAULT_TOLERANCE", "EQUAL_TO_ONE_PROCESS",
           "equal_to_one_process"]

#: the tolerance a decomposition must meet (issue 28: predicted + Σ causes within 10 % of measured)
DEFAULT_TOLERANCE = 0.10

#: the largest relative difference from one process that a run still calls equal, by its dtype (issue 29):
#: rounding in a step's sums leaves 1e-16 to 1e-14 in float64 and 1e-8 to 1e-6 in float32, where a bug
#: (a gradient summed twice, a group left out of a reduction) leaves 1e-3 or more
EQUAL_TO_ONE_PROCESS = {"float64": 1e-12, "float32": 1e-5}


def equal_to_one_process(dtype: str, *relative_differences: float) -> bool:
    """Every relative difference from the one-process run is within :data:`EQUAL_TO_ONE_PROCESS` for
    ``dtype`` ("float64", "float32")."""
    bound = EQUAL_TO_ONE_PROCESS[dtype]
    return all(d <= bound for d in relative_differences)


def _relative_gap(expected: float, measured: float) -> float:
    """|measured − expected| relative to the measurement (the quantity the learner sees)."""
    scale = abs(measured) if measured else abs(expected)
    return abs(measured - expected) / scale if scale else 0.0


@dataclass(frozen=True)
class Check:
    """One prediction checked against one measurement (the ``check`` event's fields)."""
    name: str
    predicted: float
    measured: float
    unit: str
    tolerance: float = DEFAULT_TOLERANCE
    causes: Mapping[str, float] = field(default_factory=dict)
    detail: Mapping[str, float] = field(default_factory=dict)
    decomposition: bool = False  # the causes are the measurement's own parts: they add up to it by construction

    @property
    def ok(self) -> bool:
        """The prediction alone is within tolerance of the measurement."""
        return _relative_gap(self.predicted, self.measured) <= self.tolerance

    @property
    def explained_value(self) -> float:
        """The prediction plus every named cause."""
        return self.predicted + sum(self.causes.values())

    @property
    def unexplained(self) -> float:
        """What no named cause accounts for (measured − predicted − Σ causes); a float's rounding residue
        (under 10⁻⁹ of the measurement) is 0, not "+4.34e-19 s"."""
        gap = self.measured - self.explained_value
        return 0.0 if abs(gap) <= 1e-9 * abs(self.measured) else gap

    @property
    def broken_down(self) -> bool:
        """Missed, and its causes, the measurement's own parts, add up to it (a ``decomposition`` whose
        parts do not, a clamped part, is read as any other check: explained or not)."""
        return self.decomposition and not self.ok and self.unexplained == 0.0

    @property
    def explained(self) -> bool:
        """Ok, or the causes account for the gap within tolerance."""
        return self.ok or _relative_gap(self.explained_value, self.measured) <= self.tolerance

    def event(self) -> dict[str, Any]:
        """The ``check`` event's fields (``causes`` only when the prediction alone misses)."""
        fields: dict[str, Any] = {"name": self.name, "predicted": float(self.predicted),
                                  "measured": float(self.measured), "unit": self.unit,
                                  "tolerance": float(self.tolerance), "ok": self.ok}
        if not self.ok:
            fields["causes"] = {k: float(v) for k, v in self.causes.items()}
        if self.detail:
            fields["detail"] = {k: float(v) for k, v in self.detail.items()}
        if self.decomposition:
            fields["decomposition"] = True
        return fields


def check(name: str, predicted: float, measured: float, unit: str, *,
          tolerance: float = DEFAULT_TOLERANCE, causes: Mapping[str, float] | None = None,
          detail: Mapping[str, float] | None = None, decomposition: bool = False) -> Check:
    """A check (its causes kept only for when the prediction alone misses)."""
    return Check(name, predicted, measured, unit, tolerance, dict(causes or {}), dict(detail or {}), decomposition)


def reconcile(event: Mapping[str, Any]) -> Check:
    """A recorded ``check`` event back as a :class:`Check` (the tutor's and ``runs show``'s reading)."""
    return Check(str(event["name"]), float(event["predicted"]), float(event["measured"]),
                 str(event["unit"]), float(event.get("tolerance", DEFAULT_TOLERANCE)),
                 dict(event.get("causes") or {}), dict(event.get("detail") or {}),
                 bool(event.get("decomposition", False)))


def explained(event: Mapping[str, Any]) -> bool:
    """Whether a recorded check is ok or accounted for by its causes."""
    return reconcile(event).explained
