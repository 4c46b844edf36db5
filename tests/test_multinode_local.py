"""Two nodes on one host: two launchers, each a torchrun agent with its own node rank, meeting at
127.0.0.1 as two machines meet at node 0's address. Lesson 1's prediction times the link its ring waits
on, the hop between nodes (rank 0 with node 1's first rank), and its summary says so."""
from __future__ import annotations

import threading
import time

import pytest

from distai.engine import launcher as L
from distai.engine.doctor import slowest_hop_peer
from distai.engine.experiments.lesson1 import summary_from_event
from distai.engine.runs import create_run
from distai.engine.testing import free_port

pytestmark = pytest.mark.multi_rank

LESSON1 = "distai.engine.experiments.lesson1"
ARGS = ["--steps", "2", "--sweep-min", "1KiB", "--sweep-max", "4KiB", "--iters", "2"]
PER_NODE = 2


def test_the_slowest_hop_is_the_next_nodes_first_rank():
    assert slowest_hop_peer(4, 2) == 2 and slowest_hop_peer(16, 8) == 8
    assert slowest_hop_peer(4, 4) == 1 and slowest_hop_peer(2, 2) == 1  # one node: any link of it
    assert slowest_hop_peer(3, 0) == 1  # no LOCAL_WORLD_SIZE worth reading: rank 1


def launch_two_nodes(tmp_path_factory, args: tuple[list[str], list[str]], rdzv_backend: str = "static"
                     ) -> dict[int, tuple]:
    """Node 0 and node 1 launched together, each with its own experiment options: {node: (record, events)}
    (under c10d, "node 0" is the first launcher, whatever node rank the rendezvous gives it)."""
    port = free_port()
    results: dict[int, tuple] = {}

    def node(rank: int) -> None:
        root = tmp_path_factory.mktemp(f"node{rank}")
        record = create_run(root, "lesson1", LESSON1)
        events: list[dict] = []
        spec = L.LaunchSpec(LESSON1, L.Placement("cpu", PER_NODE), args[rank], nnodes=2, master_addr="127.0.0.1",
                            master_port=port, rdzv_backend=rdzv_backend,
                            node_rank=rank if rdzv_backend == "static" else None)
        results[rank] = (L.Launch(spec, record, consumer=events.append).run(), events)

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert set(results) == {0, 1} and not any(t.is_alive() for t in threads)
    return results


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Lesson 1 on two nodes met through c10d: {node rank the rendezvous gave: (record, events)}."""
    launched = launch_two_nodes(tmp_path_factory, (ARGS, ARGS), rdzv_backend="c10d").values()
    return {min(int(p.stem[4:]) for p in record.events_dir.glob("rank*.jsonl")) // PER_NODE: (record, events)
            for record, events in launched}


def test_lesson1_across_two_nodes_times_the_hop_between_them(two_nodes):
    for rank in (0, 1):
        record, _ = two_nodes[rank]
        assert record.status == "ok", (rank, record.error, record.error_tail)
    record, events = two_nodes[0]
    s = record.summary
    assert s["n"] == 2 * PER_NODE and s["nodes"] == 2
    checks = [e for e in events if e.get("kind") == "check"]
    assert len(checks) == 2 and all(c["detail"]["link_peer"] == PER_NODE for c in checks)
    printed = [e["line"] for e in events if e.get("kind") == "output" and e.get("rank") == 0]
    assert any("between rank 0 and rank 2, on the next host" in line for line in printed)
    assert "entre el rank 0 y el rank 2, en el host siguiente" in summary_from_event(s, "es")
    assert "loopback" not in summary_from_event(s, "en")
    # each node's view counts the run's ranks, not its own (node 0's said 4, node 1's 2), and the nodes
    from distai.engine.run_state import RunState, replay_events

    for record, events in two_nodes.values():
        state, replayed = RunState(), RunState()
        for e in events:
            state.feed(e)
        for e in replay_events(record):
            replayed.feed(e)
        assert state.placement_text("en") == "4 × cpu (gloo, 2 nodes)"
        assert replayed.placement_text("es").startswith("4 × cpu (") and "2 nodos)" in replayed.placement_text("es")


def test_nodes_started_with_different_options_stop_at_once_saying_which(tmp_path_factory):
    """A node started with other options met its peers at a barrier they never reached: the run ended 120 s
    later as "did not arrive". Every rank now compares its options with node 0's on joining."""
    started = time.monotonic()
    nodes = launch_two_nodes(tmp_path_factory, (ARGS, [*ARGS[:-2], "--iters", "3"]))
    assert time.monotonic() - started < 60
    for rank in (0, 1):
        record, _ = nodes[rank]
        assert record.status == "failed" and record.exit_code != 0
        assert any("node 1 runs with --iters 3, node 0 with --iters 2: start every node with the same options" in line
                   for line in record.error_tail), record.error_tail


def test_a_failure_on_node_0_is_not_blamed_on_node_1s_ranks(tmp_path_factory):
    """Node 1's ranks only see node 0's rank 1 go away (a reset connection): node 1 says the failure began on
    another node, node 0 names the rank and its error."""
    fail = [*ARGS, "--fail-rank", "1", "--fail-step", "1"]
    nodes = launch_two_nodes(tmp_path_factory, (fail, fail))
    (here, _), (there, _) = nodes[0], nodes[1]
    assert here.status == there.status == "failed"
    assert here.failed_rank == 1 and "injected failure on rank 1" in here.error
    assert there.error.startswith("a rank on another node failed first: rank ") and "that node's output" in there.error
    assert there.failed_rank in (2, 3)


def test_a_node_that_never_comes_is_waited_for_join_timeout_seconds(tmp_path_factory):
    """Node 0 alone: torchrun's own wait was 600 to 900 s; --join-timeout sets it, and the record says how many
    nodes came."""
    record = create_run(tmp_path_factory.mktemp("alone"), "lesson1", LESSON1)
    spec = L.LaunchSpec(LESSON1, L.Placement("cpu", 1), ARGS, nnodes=2, node_rank=0, master_addr="127.0.0.1",
                        master_port=free_port(), join_timeout=3)
    started = time.monotonic()
    record = L.Launch(spec, record).run()
    assert time.monotonic() - started < 60
    assert record.status == "failed" and record.error.startswith("only 1 of 2 nodes joined within ")



def test_c10d_nodes_label_their_ranks_as_the_rendezvous_numbered_them(two_nodes):
    """Under c10d a node learns its ranks at the rendezvous: node 1's ranks 2 and 3 had their output and logs
    labelled ranks 0 and 1 (from --node-rank, which c10d ignores). Each line now carries its global rank."""
    for node, (record, events) in two_nodes.items():
        ranks = sorted(int(p.stem[4:]) for p in record.events_dir.glob("rank*.jsonl"))
        logs = sorted(int(p.stem[4:]) for p in record.logs_dir.glob("rank*.log"))
        printed = {e["rank"] for e in events if e.get("kind") == "output" and e.get("rank") is not None}
        assert ranks == [node * PER_NODE, node * PER_NODE + 1] and logs == ranks and printed <= set(ranks)
    assert sorted(two_nodes) == [0, 1]
    assert "lesson 1 on 4 ranks" in two_nodes[0][0].rank_log(0).read_text()  # rank 0's own words, in its own log


def test_the_nodes_runs_export_as_one_timeline_named_by_host(two_nodes, tmp_path, capsys):
    """Each node keeps its own run folder; `distai runs export NODE0 NODE1` merges them into one Chrome trace
    on one time origin, each process named with its rank and host, as Perfetto shows a multi-host job."""
    import json

    from distai.engine.trace_export import check_trace
    from distai.tutor.cli import main

    folders = [str(two_nodes[n][0].dir) for n in (0, 1)]
    out = tmp_path / "both.json"
    assert main(["runs", "export", *folders, "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert check_trace(trace) == []
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    host = two_nodes[0][0].host
    assert names == {r + 1: f"rank {r} ({host})" for r in range(4)}
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2, 3, 4}  # every rank's ring steps
    assert trace["otherData"]["hosts"] == {str(r): host for r in range(4)}
    capsys.readouterr()
    assert main(["runs", "export", folders[0], folders[0], "--lang", "es"]) == 2
    assert "tienen las dos el rank 0" in capsys.readouterr().err
