"""Shared test setup: every test gets its own DISTAI_HOME; Textual renders deterministically; events are
checked against their declarations."""
from __future__ import annotations

import gc
import os
import tempfile

import pytest

# Snapshot and Pilot tests must not depend on animation timing or the developer's terminal.
os.environ["TEXTUAL_ANIMATIONS"] = "none"
for _var in ("LC_ALL", "LC_MESSAGES"):
    os.environ.pop(_var, None)
os.environ["LANG"] = "C.UTF-8"
# pytest-xdist passes its terminal's width to workers as COLUMNS: the CLI's output would wrap at it,
# where the serial suite's captured stdout wraps as a pipe does (the tests' expected width)
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers on two cores: torch's pool of one thread per core in each would oversubscribe them
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# every event an experiment emits in the suite (in-process or launched) is checked against its
# declaration (distai/lessons/events.py): a field the declaration lacks fails the run
os.environ["DISTAI_CHECK_EVENTS"] = "1"
# module-scoped fixtures (a module's one launched run) start before the per-test home below: they get a
# fresh one too, never the developer's (a machine profile saved there by `calc plan --calibrate` an
# hour before made the capstone run's check use it, and its test expect none)
os.environ["DISTAI_HOME"] = tempfile.mkdtemp(prefix="distai_home_")

# imported after the environment above, which Textual reads as it is imported
from distai.tutor.app import GC_THRESHOLDS  # noqa: E402

# the tutor's own thresholds (tutor/app.py: Textual's cached lines made each full collection walk ~400k
# objects), which its run() sets and the Pilot tests (run_test) never reach: with Python's, collections took
# 35 of test_tutor_app.py's and test_themes.py's 109 s, 30 of them full ones; with these 12 s, for 45 MB more
gc.set_threshold(*GC_THRESHOLDS)


@pytest.fixture(autouse=True)
def isolated_distai_home(tmp_path_factory, monkeypatch):
    """Saved state (progress database, runs) goes to a fresh directory for each test."""
    home = tmp_path_factory.mktemp("distai_home")
    monkeypatch.setenv("DISTAI_HOME", str(home))
    return home


TIMED_MARK = "pytest.mark.timed"  # how a module marks its tests timed (pytestmark = pytest.mark.timed)


def pytest_ignore_collect(collection_path, config):
    """README's second part (``-m timed``) imports only the modules whose text marks tests timed: importing
    the other ninety to deselect every test in them took 13 s of its 140 (the same tests are selected)."""
    if config.getoption("markexpr", "") != "timed" or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    try:
        return TIMED_MARK not in collection_path.read_text(encoding="utf-8")
    except OSError:
        return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n 2 --dist loadgroup`` (README's command): the modules marked ``multi_rank``
    or ``timed`` (they start process groups or launch runs, whose ranks use both cores) run on one
    worker, one module after another, so no two groups compete; every other module is a group of its
    own (its fixtures start once) and they fill the other core. README's command runs the ``timed``
    modules apart, after the rest: their checks measure the machine, and a busy second core shows up
    in them as contention the check was not built to name."""
    for item in items:
        ranks = item.get_closest_marker("multi_rank") or item.get_closest_marker("timed")
        item.add_marker(pytest.mark.xdist_group("multi_rank" if ranks else item.nodeid.split("::")[0]))
