"""Any combination of `distai run`'s own flags gives a launch or a one-line error with exit 2, never a
traceback (hypothesis). The launch itself is replaced by a recorder: a valid request is checked up
to the LaunchSpec it would hand torchrun, without starting torchrun."""
from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distai.tutor.cli import main

JUNK = st.one_of(st.text(alphabet=string.printable + "\x00é→", max_size=12), st.sampled_from(["", "\x00", "-1", "1e3"]))
COUNT = st.one_of(st.integers(-3, 8), st.integers(), JUNK)  # mostly near the edges, sometimes anything
FLAGS = {
    "--gpus": COUNT, "--cpu": COUNT, "--nnodes": COUNT, "--node-rank": COUNT, "--master-port": COUNT,
    "--steps": COUNT, "--max-restarts": COUNT,
    "--master-addr": st.one_of(st.just("10.0.0.1"), JUNK),
    "--rdzv-backend": st.one_of(st.sampled_from(["static", "c10d"]), JUNK),
    "--rdzv-id": JUNK,
    "--run-dir": st.one_of(st.text(alphabet=string.ascii_letters + "-._ \x00", min_size=1, max_size=10),
                           st.sampled_from(["a\x00b", ".", "..", "~", "-"])),
}
SWITCHES = ("--json", "--debug", "--profile")
LESSONS = st.one_of(st.sampled_from(["1", "lesson3", "pipeline", "5", "inference", "capstone"]), JUNK)
EDGES = [  # found by this test or on the way to it; kept as explicit examples
    (["--run-dir", "a\x00b"]), (["--steps", str(10 ** 30)]), (["--master-port", "0"]),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--master-addr", "x\x00"]), (["--rdzv-id", "\x00"]),
    (["--cpu", str(2 ** 63)]), (["--max-restarts", "-1"]), (["--run-dir", "."]), (["--master-addr", "a b"]),
    (["--sweep-max", "1\x00"]),  # an option for the experiment
]


class Recorder:
    """Stands in for the launch: keeps the spec, says the run went well."""

    specs: list = []

    def __init__(self, spec, record, consumer=None, max_restarts=0, grace_s=5.0):
        self.spec, self.record = spec, record
        Recorder.specs.append(spec)

    def start(self):  # what the real start does first: the exact torchrun command, which must be executable
        from distai.engine.launcher import torchrun_command

        cmd = torchrun_command(self.spec, self.record.dir / "torchrun")
        assert all(isinstance(a, str) and "\0" not in a for a in cmd), cmd

    def stop(self, reason=""):
        pass

    def run(self):
        self.record.status = "ok"
        return self.record


@pytest.fixture
def no_torchrun(monkeypatch, tmp_path):
    import distai.engine.supervisor as supervisor

    monkeypatch.setattr(supervisor, "make_launch", Recorder)
    monkeypatch.chdir(tmp_path)  # --run-dir names land here
    Recorder.specs = []
    return Recorder


@pytest.mark.parametrize("extra", EDGES)
def test_edge_run_flags(no_torchrun, capsys, extra):
    _check(no_torchrun, capsys, ["run", "lesson1", *extra], set())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lesson=LESSONS, flags=st.dictionaries(st.sampled_from(sorted(FLAGS)), st.none()),
       switches=st.sets(st.sampled_from(SWITCHES)), data=st.data())
def test_any_run_flags_give_a_launch_or_a_one_line_error(no_torchrun, capsys, lesson, flags, switches, data):
    argv = ["run", lesson]
    for flag in flags:
        value = data.draw(FLAGS[flag], label=flag)
        argv += [flag, str(value)]
    argv += sorted(switches)
    _check(no_torchrun, capsys, argv, switches)


def _check(no_torchrun, capsys, argv, switches):
    launched_before = len(no_torchrun.specs)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 0:
        assert len(no_torchrun.specs) == launched_before + 1  # a valid request reaches the launch...
        spec = no_torchrun.specs[-1]
        assert spec.placement.nproc >= 1 and spec.nnodes >= 1
        assert spec.profile == ("--profile" in switches) and spec.debug == ("--debug" in switches)
    else:
        assert code == 2, (argv, code, err)  # ...an invalid one is refused before it, in one line
        assert len(no_torchrun.specs) == launched_before
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("distai: error: "), (argv, err)
