"""Shared test setup: every test gets its own DISTAI_HOME; Textual renders deterministically; events are
checked against their declarations."""
from __future__ import annotations

import os

import pytest

# Snapshot and Pilot tests must not depend on animation timing or the developer's terminal.
os.environ["TEXTUAL_ANIMATIONS"] = "none"
for _var in ("LC_ALL", "LC_MESSAGES"):
    os.environ.pop(_var, None)
os.environ["LANG"] = "C.UTF-8"
# every event an experiment emits in the suite (in-process or launched) is checked against its
# declaration (distai/lessons/events.py): a field the declaration lacks fails the run
os.environ["DISTAI_CHECK_EVENTS"] = "1"


@pytest.fixture(autouse=True)
def isolated_distai_home(tmp_path_factory, monkeypatch):
    """Saved state (progress database, runs) goes to a fresh directory for each test."""
    home = tmp_path_factory.mktemp("distai_home")
    monkeypatch.setenv("DISTAI_HOME", str(home))
    return home
