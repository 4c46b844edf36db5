"""Lesson 6: our bucketed, overlapped data parallelism against torch DDP on gloo (2 and 4 ranks).

One process group per world size runs every check (``checks``) and returns a dict; the tests
assert on it. The 2-rank group ends by running the lesson's experiment with tiny settings.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distai.engine.bucketing import BucketedDataParallel, StepTimeline, ddp_timed_allreduce_hook
from distai.engine.model import GPT, GPTConfig, make_batch
from distai.engine.testing import run_in_group

pytestmark = pytest.mark.timed  # its checks time the run: README's command runs these alone, last


def _config(width=64, depth=2) -> GPTConfig:
    """The lesson's GPT, small: its tied embedding is a parameter used twice (head and input)."""
    return GPTConfig(vocab=64, hidden=width, heads=4, layers=depth, seq=8)


def _net(width=64, depth=2, seed=0):
    return GPT(_config(width, depth), seed=seed)


def _compare_with_ddp(rank, cap, width, steps=3, train_steps=2):
    """Ours (overlap and not) beside DDP: gradients of ``steps`` batches from the same weights,
    then ``train_steps`` SGD steps."""
    ours = BucketedDataParallel(_net(width), bucket_cap_mb=cap)
    after = BucketedDataParallel(_net(width), bucket_cap_mb=cap, overlap=False)
    ddp = DDP(_net(width), bucket_cap_mb=cap)
    models = (ours, after, ddp)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    out = {"grads_equal": [], "grads_close": [], "no_overlap_equal": []}
    for step in range(steps + train_steps):
        ids, targets = make_batch(_config(width), 8, seed=10 + rank, step=step)
        for m, o in zip(models, opts):
            o.zero_grad()
            m(ids, targets).backward()
        g = [[p.grad.clone() for p in m.parameters()] for m in models]
        out["grads_equal"].append(all(torch.equal(a, b) for a, b in zip(g[0], g[2])))
        out["grads_close"].append(all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(g[0], g[2])))
        out["no_overlap_equal"].append(all(torch.equal(a, b) for a, b in zip(g[0], g[1])))
        if step >= steps:
            for o in opts:
                o.step()
    out["params_equal"] = all(torch.equal(a, b) for a, b in zip(ours.parameters(), ddp.parameters()))
    out["bucket_names"] = ours.bucket_names()
    out["bucket_bytes"] = ours.bucket_bytes()
    return out


def _ddp_layout(cap, width):
    """DDP's buckets after its rebuild (step 2), as parameter names, via a recording comm hook."""
    ddp = DDP(_net(width), bucket_cap_mb=cap)
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    seen: dict[int, list[str]] = {}

    def hook(state, bucket):
        seen[bucket.index()] = [names[id(p)] for p in bucket.parameters()]
        buf = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, hook)
    ids, targets = make_batch(_config(width), 4)
    for _ in range(2):
        seen.clear()
        ddp(ids, targets).backward()
    return [seen[i] for i in sorted(seen)]


def _timelines(width):
    out = {}
    ids, targets = make_batch(_config(width), 8)
    for mode in ("overlap", "no-overlap", "ddp"):
        net = _net(width)
        if mode == "ddp":
            model = DDP(net, bucket_cap_mb=0.1)
        else:
            model = BucketedDataParallel(net, bucket_cap_mb=0.1, overlap=mode == "overlap")
        for _ in range(2):
            model(ids, targets).backward()
        tl = StepTimeline()
        if mode == "ddp":
            tl.attach(net)
            model.register_comm_hook(tl, ddp_timed_allreduce_hook)
        else:
            model.timeline = tl
        tl.begin()
        loss = model(ids, targets)
        tl.mark("backward")
        loss.backward()
        tl.mark("backward_done")
        out[mode] = tl.to_event()
    return out


#: the negative control's straggler: milliseconds the last rank sleeps in each backward
STRAGGLER_MS = 200


def checks(rank, world_size, full):
    torch.manual_seed(0)
    res = {}
    # 0.05 MiB buckets: several buckets (an MLP weight of the 64-wide GPT is 64 KiB, W_q 16 KiB)
    res["small"] = _compare_with_ddp(rank, 0.05, 64)
    res["ddp_layout_small"] = _ddp_layout(0.05, 64)
    if full:  # on 2 ranks only, to keep the module short
        # DDP's defaults (25 MiB, first bucket 1 MiB) on a model of ~1.5 MiB of gradients
        res["default"] = _compare_with_ddp(rank, None, 128, steps=2, train_steps=1)
        res["ddp_layout_default"] = _ddp_layout(None, 128)  # DDP's own [1 MiB, 25 MiB] after its rebuild
        res["timelines"] = _timelines(64)
    # the average: every rank's gradient of a known function
    m = BucketedDataParallel(torch.nn.Linear(3, 1, bias=False), bucket_cap_mb=1)
    with torch.no_grad():
        m.module.weight.fill_(1.0)
    (m(torch.full((1, 3), float(rank + 1))).sum()).backward()
    res["mean_grad"] = m.module.weight.grad.tolist()
    # a parameter with no gradient: a clear error, like DDP without find_unused_parameters
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.a(x)
    try:
        BucketedDataParallel(TwoHeads(), bucket_cap_mb=1)(torch.randn(2, 4)).sum().backward()
        res["unused_error"] = None
    except RuntimeError as exc:
        res["unused_error"] = str(exc)
    dist.barrier()
    from distai.engine.experiments import lesson6
    d = tempfile.mkdtemp(prefix="lesson6-events-")
    os.environ["DISTAI_EVENTS_DIR"] = d
    if full:
        lesson6.main(["--steps", "14", "--inject-overflow", "3,9", "--growth-interval", "2",
                      "--hist-every", "7", "--bucket-mb", "0.1,1", "--hidden", "32", "--vocab", "128",
                      "--seq", "8", "--dp-hidden", "64", "--dp-batch", "2", "--timed-steps", "1", "--rounds", "1"])
    else:  # the negative control: the last rank sleeps in every backward (the experiment ends the group: last)
        lesson6.main(["--skip-scaling", "--bucket-mb", "0.1", "--dp-hidden", "64", "--dp-batch", "2",
                      "--timed-steps", "1", "--rounds", "1", "--slow-rank", str(world_size - 1),
                      "--slow-backward-ms", str(STRAGGLER_MS)])
    res["events"] = [json.loads(line) for line in Path(d, f"rank{rank}.jsonl").read_text().splitlines()]
    return res


def _exposed_check_again(rank, world_size):
    """The overlap part of ``checks``' 2-rank run alone (no loss scaling): its events."""
    from distai.engine.experiments import lesson6
    d = tempfile.mkdtemp(prefix="lesson6-events-")
    os.environ["DISTAI_EVENTS_DIR"] = d
    lesson6.main(["--skip-scaling", "--bucket-mb", "0.1,1", "--dp-hidden", "64", "--dp-batch", "2",
                  "--timed-steps", "1", "--rounds", "1"])
    return [json.loads(line) for line in Path(d, f"rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two():
    return run_in_group(checks, 2, True, timeout_s=150)


@pytest.fixture(scope="module")
def four():
    return run_in_group(checks, 4, False, timeout_s=150)


@pytest.fixture(params=["two", "four"])
def group(request):
    return request.getfixturevalue(request.param)


def test_gradients_equal_torch_ddp(group):
    for case in ("small", "default"):
        if case not in group[0]:
            continue
        r = group[0][case]
        # step 1: one bucket in parameters() order, as DDP's first iteration; from step 2 on, buckets
        # rebuilt in gradient-ready order, exactly as DDP's: same buckets, same gloo all-reduce, so
        # bit-identical gradients at every step, on 4 ranks too, where gloo's ring adds four
        # contributions in an order that depends on each element's place in the bucket (and, after
        # SGD steps from equal weights, bit-identical parameters)
        assert all(r["grads_equal"]), (case, r["grads_equal"])
        assert all(r["grads_close"]), case
        assert all(r["no_overlap_equal"]), case
        assert r["params_equal"], case


def test_every_rank_holds_the_same_average(group):
    n = len(group)
    avg = sum(range(1, n + 1)) / n
    for r in group:
        assert r["mean_grad"] == [[avg] * 3]
        assert r["small"]["bucket_names"] == group[0]["small"]["bucket_names"]


def test_buckets_follow_ddp_rules(group):
    r = group[0]
    # same buckets as DDP's after its rebuild (in the order gradients became ready)
    assert r["small"]["bucket_names"] == r["ddp_layout_small"]
    names = [n for b in r["small"]["bucket_names"] for n in b]
    assert names[0] in ("head.norm.bias", "head.norm.weight")  # the final norm first
    assert names[-1] == "embed.weight"  # tied: complete once the input embedding's share arrives
    if "default" not in r:
        return
    # defaults: a first bucket closed once it reaches 1 MiB, then the rest (< 25 MiB) in one, as DDP's own
    assert r["default"]["bucket_names"] == r["ddp_layout_default"]
    sizes = r["default"]["bucket_bytes"]
    assert len(sizes) == 2 and 2 ** 20 <= sizes[0] < 2 ** 20 + 300_000
    assert sum(sizes) == _config(128).num_params() * 4


def test_timeline_shows_overlap(two):
    tl = two[0]["timelines"]
    last_grad = {m: max(end for _, _, end in t["layers"]) if t["layers"] else None for m, t in tl.items()}
    ov, after = tl["overlap"], tl["no-overlap"]
    assert len(ov["buckets"]) == len(after["buckets"]) >= 3
    assert len(ov["layers"]) == len({name.rsplit(".", 1)[0] for name, _ in _net().named_parameters()})
    # with overlap the first all-reduce starts before backward has finished the first layer
    assert ov["buckets"][0][2] < last_grad["overlap"]
    # without, every all-reduce starts after the last gradient
    assert all(b[2] >= last_grad["no-overlap"] for b in after["buckets"])
    for t in tl.values():
        assert all(b[3] >= b[2] for b in t["buckets"])
    # DDP's timeline recorded through its communication hook: same number of buckets
    assert len(tl["ddp"]["buckets"]) == len(ov["buckets"])
    assert tl["ddp"]["buckets"][0][2] < last_grad["ddp"]


def test_unused_parameter_is_a_clear_error(group):
    err = group[0]["unused_error"]
    assert err and "b.weight" in err and "unused" in err


def test_experiment_events(two):
    events = two[0]["events"]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "phase" and kinds[-1] == "summary"
    progress = [e for e in events if e["kind"] == "progress"]
    assert progress[-1]["done"] == progress[-1]["total"] == 14 + 2 * 3
    assert [e["step"] for e in events if e["kind"] == "step"] == list(range(14))
    assert not any(e["kind"] in ("phase", "progress", "step") for e in two[1]["events"])
    scale = [e for e in events if e["kind"] == "scale"]
    assert [e["step"] for e in scale] == list(range(14))
    for e in scale:
        if e["injected"]:
            assert e["overflow"] and e["skipped"] and e["new_scale"] == e["scale"] / 2
    assert {e["step"] for e in scale if e["injected"]} == {3, 9}
    grown = [e for e in scale if e["new_scale"] > e["scale"]]
    assert grown and all(not e["overflow"] for e in grown)
    hists = [e for e in events if e["kind"] == "grad_hist"]
    assert [e["step"] for e in hists] == [0, 7]
    for h in hists:
        assert sum(h["counts"]) > 10_000 and 0 <= h["zero_unscaled"] <= 1
        assert h["zero_scaled"] <= h["zero_unscaled"]
    sweep = [e for e in events if e["kind"] == "bucket_sweep"]
    assert {(e["bucket_mb"], e["mode"]) for e in sweep} == {(c, m) for c in (0.1, 1.0)
                                                            for m in ("overlap", "no-overlap", "ddp")}
    assert all(e["step_ms"] > 0 for e in sweep)
    timelines = [e for e in events if e["kind"] == "timeline"]
    assert len(timelines) == 6 and all(t["layers"] and t["buckets"] for t in timelines)
    # rank 1 wrote its own timelines too
    assert sum(e["kind"] == "timeline" for e in two[1]["events"]) == 6
    summary = events[-1]
    assert summary["scaling"]["injected"] == 2 and summary["scaling"]["skipped"] >= 2
    # torch's GradScaler beside ours, on a twin with the same batches and injected infs: the same scale and
    # bit-identical weights after each of the 14 steps, on both ranks (it backed off and grew: growth every 2)
    from run_checks import assert_checks_hold

    same = assert_checks_hold(events, {"steps_as_gradscaler"})["steps_as_gradscaler"]
    assert same["ok"] and same["predicted"] == same["measured"] == 14 and same["tolerance"] == 0
    scales = [e["new_scale"] for e in events if e["kind"] == "scale"]
    assert any(b < a for a, b in zip(scales, scales[1:])) and any(b > a for a, b in zip(scales, scales[1:]))
    assert summary["overlap"]["best_bucket_mb"] in (0.1, 1.0)
    assert summary["overlap"]["overlap_speedup"] > 0


def test_exposed_communication_matches_the_overlap_model_or_is_explained(two):
    """The best bucket size's overlapped steps: the communication left after backward against the
    overlap model at the group's α-β (issue 28), ok or explained by the measured causes: the
    peers' launches, each bucket's all-reduce timed alone after the step, and what it took in the
    step beyond that (the time from the last all-reduce's end to the step seeing it stays unexplained)."""
    from distai.lessons.checks import explained
    from run_checks import assert_checks_hold, checks_of

    assert checks_of(two[0]["events"])["exposed_comm"]["detail"]["alone_s"] > 0
    events = two[0]["events"]
    if not explained(checks_of(events)["exposed_comm"]):
        # sub-millisecond times on 2 loaded cores: one step the scheduler stalls can leave 0.3 ms
        # no cause names (CI, 1 run in ~10); the decomposition must hold in a second, fresh run
        events = run_in_group(_exposed_check_again, 2, timeout_s=150)[0]
    found = assert_checks_hold(events, {"exposed_comm"})["exposed_comm"]
    assert found["detail"]["bucket_mb"] == events[-1]["overlap"]["best_bucket_mb"]
    assert found["measured"] >= 0 and found["predicted"] >= 0
    assert not any(e["kind"] == "check" for e in two[1]["events"])  # rank 0 alone emits it
    if not found["ok"]:
        assert set(found["causes"]) == {"peer_wait", "slow_collective", "cpu_contention", "slower_in_step"}


def test_trace_draws_the_exposed_communication(two, four):
    """The best bucket size's recorded steps (the check's ``--check-steps``) on the run's Chrome trace (issue 28): per rank, compute,
    the wait for the last peer's launches, the collectives left exposed and idle time tile the
    step, and the check's rank's wait is the ``peer_wait`` its check reports; with a straggler
    (four ranks), its peers wait most of its sleep, and it does not wait."""
    from run_checks import assert_trace_decomposes, checks_of

    waited = {}
    for name, group in (("two", two), ("four", four)):
        events = [e for r in group for e in r["events"]]
        found = checks_of(group[0]["events"])["exposed_comm"]
        waited[name] = assert_trace_decomposes(events, found, blocks=int(found["detail"]["steps"]))
    assert min(waited["four"][r] for r in range(3)) > STRAGGLER_MS / 1e3 * 0.7
    assert waited["four"].get(3, 0.0) < STRAGGLER_MS / 1e3 * 0.1


def test_a_straggler_is_waited_for_not_slow_bandwidth(four):
    """Negative control: the last rank sleeps STRAGGLER_MS in every backward. Its peers' buckets
    wait for its launches: the extra exposed time goes to ``peer_wait`` (measured from every
    rank's launch times), not to collectives slower than α-β, and the check is explained."""
    from run_checks import assert_checks_hold

    found = assert_checks_hold(four[0]["events"], {"exposed_comm"})["exposed_comm"]
    causes = found["causes"]
    assert not found["ok"] and found["measured"] > STRAGGLER_MS / 1e3 * 0.8
    assert found["detail"]["rank"] != len(four) - 1  # a rank that waited, not the straggler itself
    assert causes["peer_wait"] > STRAGGLER_MS / 1e3 * 0.7
    assert causes["slow_collective"] < STRAGGLER_MS / 1e3 * 0.5 and causes["peer_wait"] > causes["slow_collective"]


def test_exposed_comm_causes_attribute_a_late_peer_and_a_slow_link():
    """The decomposition on made-up timelines (seconds on this rank's clock): backward ends at 10,
    two buckets launched at 4 and 10, each 1 s by α-β; ``alone``: each all-reduce timed alone."""
    from distai.lessons.lesson6.simulation import exposed_comm_causes

    own, ab = [4.0, 10.0], [1.0, 1.0]
    on_time = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0)
    assert on_time == {"predicted": 1.0, "peer_wait": 0.0, "slow_collective": 0.0}
    late = exposed_comm_causes(own, [4.0, 13.0], [1.0, 1.0], ab, 10.0)  # a peer launched the last one at 13
    assert late == {"predicted": 1.0, "peer_wait": 3.0, "slow_collective": 0.0}
    slow = exposed_comm_causes(own, own, [1.0, 3.0], ab, 10.0)  # the last all-reduce takes 3 s alone, not 1
    assert slow == {"predicted": 1.0, "peer_wait": 0.0, "slow_collective": 2.0}
    both = exposed_comm_causes(own, [4.0, 13.0], [1.0, 3.0], ab, 10.0)  # late and slow: the causes add up
    assert both == {"predicted": 1.0, "peer_wait": 3.0, "slow_collective": 2.0}
    hidden = exposed_comm_causes(own, [8.0, 10.0], [1.0, 1.0], ab, 10.0)  # a late first bucket, hidden by backward
    assert hidden["peer_wait"] == 0.0
    # gloo's threads waited 2 s for a core in the last bucket, 0.5 s in the first (hidden by backward)
    starved = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.5, 2.0])
    assert starved == {"predicted": 1.0, "peer_wait": 0.0, "slow_collective": 0.0, "cpu_contention": 2.0}
    # each bucket's end in the step (the last one at 13.5, 3.5 s after its launch at 10, 2.5 s beyond
    # alone): of that, the threads' waits (2 s) are CPU contention, the rest is slower in the step
    ran = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.5, 2.0], [5.0, 13.5])
    assert ran == {"predicted": 1.0, "peer_wait": 0.0, "slow_collective": 0.0, "cpu_contention": 2.0,
                   "slower_in_step": 0.5}
    # waits larger than the whole slowdown in the step count only up to it
    capped = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.5, 2.0], [5.0, 12.0])
    assert capped == {"predicted": 1.0, "peer_wait": 0.0, "slow_collective": 0.0, "cpu_contention": 1.0,
                      "slower_in_step": 0.0}
    # an all-reduce faster in the step than alone: a negative slowdown, no contention
    faster = exposed_comm_causes(own, own, [1.0, 3.0], ab, 10.0, [0.0, 0.0], [5.0, 12.0])
    assert faster["slow_collective"] == 2.0 and faster["slower_in_step"] == -1.0
    # the step saw the last end 0.8 s late, its thread 0.5 s of that waiting for a core: contention too;
    # a wait longer than the time between counts only up to it
    seen = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.5, 2.0], [5.0, 13.5], (14.3, 0.5))
    assert seen["cpu_contention"] == 2.5 and seen["slower_in_step"] == 0.5
    assert exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.5, 2.0], [5.0, 13.5], (14.0, 3.0))[
        "cpu_contention"] == 2.5
    # gloo's two threads: the first bucket ends after the second; the chain ends at the latest end
    out_of_order = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.0, 0.0], [11.5, 11.0])
    assert out_of_order["slower_in_step"] == 0.5
    # an end read before the last rank's launch (clocks a few µs apart): the chain ends at that launch
    assert exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0, [0.0, 0.0], [5.0, 9.8])["slower_in_step"] == -1.0
    # without the ends the step's own end is not an input: a step slower than its measured causes stays unexplained
    from distai.lessons.checks import check

    parts = exposed_comm_causes(own, own, [1.0, 1.0], ab, 10.0)
    assert not check("exposed_comm", parts["predicted"], 2.0, "s",
                     causes={k: v for k, v in parts.items() if k != "predicted"}).explained
