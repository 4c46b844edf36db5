"""A run's ``check`` events, as a test reads them (issue 28): each one ok, or explained by its
causes within its tolerance (``lessons/checks.explained``), its name and its causes' names keys of
``lessons/catalog/checks.toml`` in both languages."""
from __future__ import annotations

from distai.lessons.checks import reconcile
from distai.lessons.strings import strings


def checks_of(events: list[dict]) -> dict[str, dict]:
    """The run's check events by name."""
    return {e["name"]: e for e in events if e.get("kind") == "check"}


def assert_checks_hold(events: list[dict], names: set[str]) -> dict[str, dict]:
    """Every check of ``names`` is there, ok or explained, and named in the catalog; returns them."""
    found = checks_of(events)
    assert names <= set(found), f"missing checks {sorted(names - set(found))}"
    for lang in ("en", "es"):
        table = strings("checks", lang)
        for e in found.values():
            assert e["name"] in table["name"] and set(e.get("causes", {})) <= set(table["cause"]), e
    for name in names:
        c = reconcile(found[name])
        assert c.explained, (f"{name}: predicted {c.predicted:.4g} + causes {dict(c.causes)} = "
                             f"{c.explained_value:.4g}, measured {c.measured:.4g} {c.unit}")
    return found
