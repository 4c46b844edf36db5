"""Replicas behind a router: a discrete-event simulation of serving on a synthetic Poisson workload.

Requests arrive as a Poisson process. Each starts with one of a few shared **prefixes** (system
prompts, popular with a Zipf law) followed by its own suffix, and asks for a random number of output
tokens (geometric, so a few answers are long). A **router** sends each request, on arrival, to one of
``R`` identical replicas:

* ``round-robin`` — replica ``i mod R``, blind to load;
* ``least-outstanding`` — the replica with the fewest requests waiting or running (ties rotate);
* ``prefix-aware`` — the replica the router last sent this prefix to (whose prefix cache most likely
  still holds it), unless that replica is overloaded — more than ``balance_abs`` requests *and*
  ``balance_rel`` times the least loaded one — in which case least-outstanding decides (the rule of
  SGLang's cache-aware router).

Each replica runs continuous batching (Orca/vLLM iteration-level scheduling): an iteration admits
waiting requests up to ``max_batch`` and prefills them, and decodes one token for every request
already running; its duration is ``cost.prefill(uncached prompt tokens) + cost.decode(batch)``.
A replica keeps the KV cache of its ``prefix_slots`` most recently used prefixes (LRU): a request
whose prefix is there prefills only its suffix — this is where prefix-aware routing wins.

Per request: TTFT = end of the iteration that prefilled it − arrival; TPOT = (finish − first token) /
(output − 1). Per policy: p50/p99 of both, output tokens per second (all output tokens / time from
the first arrival to the last finish), prefix-cache hit rate, requests per replica.

The per-replica costs come from a :class:`CostModel`: either :meth:`CostModel.fit` to times measured
on the real model (the lesson's experiment times prefills and batched decode steps of
``distai.engine.inference``), or :meth:`CostModel.roofline` from lesson 7's formulas. Its ``source``
says which. Pure Python.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from . import formulas as f

POLICIES = ("round-robin", "least-outstanding", "prefix-aware")


# ---------------------------------------------------------------------------------------------
# costs
# ---------------------------------------------------------------------------------------------

def linear_fit(xs, ys) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    n = len(xs)
    if n < 2:
        raise ValueError("need at least two points to fit a line")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("the points must not all have the same x")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


@dataclass(frozen=True)
class CostModel:
    """Time of one replica's work: ``prefill(tokens)`` and ``decode(batch)`` (one decode step).

    Linear: prefill = ``prefill_fixed + prefill_per_token · tokens`` (0 for 0 tokens), decode =
    ``decode_fixed + decode_per_seq · batch`` (0 for an empty batch). With ``roofline`` set, the
    formulas are used instead (see :meth:`roofline`)."""

    prefill_fixed: float
    prefill_per_token: float
    decode_fixed: float
    decode_per_seq: float
    source: str = "measured"
    roofline_args: tuple | None = None

    def prefill(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        if self.roofline_args:
            params, wbytes, peak, bw, _kv = self.roofline_args
            return f.prefill_time(params, tokens, wbytes, peak, bw)
        return max(0.0, self.prefill_fixed + self.prefill_per_token * tokens)

    def decode(self, batch: int) -> float:
        if batch <= 0:
            return 0.0
        if self.roofline_args:
            params, wbytes, peak, bw, kv = self.roofline_args
            return f.decode_time_per_token(params, wbytes, kv, peak, bw, batch)
        return max(0.0, self.decode_fixed + self.decode_per_seq * batch)

    @classmethod
    def fit(cls, prefill_points, decode_points, source: str = "measured") -> CostModel:
        """From measurements: ``prefill_points`` [(tokens, seconds)], ``decode_points`` [(batch, seconds)],
        each fitted by least squares (a negative slope — noise — becomes a flat line at the mean)."""
        def fit_line(points):
            a, b = linear_fit([p[0] for p in points], [p[1] for p in points])
            if b < 0:  # timing noise can tilt a flat line; a cost never falls with more work
                a, b = sum(p[1] for p in points) / len(points), 0.0
            return a, b

        pa, pb = fit_line(prefill_points)
        da, db = fit_line(decode_points)
        return cls(pa, pb, da, db, source)

    @classmethod
    def roofline(cls, params: float, weight_bytes: float, kv_bytes_per_seq: float, peak_flops: float,
                 bandwidth: float) -> CostModel:
        """From the formulas: prefill :func:`~.formulas.prefill_time`, decode step
        :func:`~.formulas.decode_time_per_token` (KV read per sequence ``kv_bytes_per_seq``)."""
        args = (params, weight_bytes, peak_flops, bandwidth, kv_bytes_per_seq)
        pf = f.prefill_time(params, 1, weight_bytes, peak_flops, bandwidth)
        d1 = f.decode_time_per_token(params, weight_bytes, kv_bytes_per_seq, peak_flops, bandwidth, 1)
        d2 = f.decode_time_per_token(params, weight_bytes, kv_bytes_per_seq, peak_flops, bandwidth, 2)
        return cls(pf, 0.0, 2 * d1 - d2, d2 - d1, "roofline", args)

    def as_dict(self) -> dict:
        return {"source": self.source, "prefill_fixed_s": self.prefill_fixed,
                "prefill_per_token_s": self.prefill_per_token, "decode_fixed_s": self.decode_fixed,
                "decode_per_seq_s": self.decode_per_seq}


# ---------------------------------------------------------------------------------------------
# workload
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SimRequest:
    rid: int
    arrival: float  # seconds
    prefix_id: int
    prefix_len: int
    suffix_len: int
    output_len: int

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.suffix_len


def poisson_workload(n: int, rate: float, prefixes: int = 16, prefix_len: int = 48, suffix_range=(4, 16),
                     mean_output: float = 16.0, max_output: int = 64, zipf: float = 1.0,
                     seed: int = 0) -> list[SimRequest]:
    """``n`` requests arriving at ``rate`` per second (exponential gaps); prefix ``k`` drawn with weight
    1/(k+1)^zipf; suffix length uniform; output length 1 + geometric with mean ``mean_output``
    (capped at ``max_output``)."""
    if n < 1 or not rate > 0:
        raise ValueError("need n ≥ 1 requests and a rate > 0")
    rng = random.Random(seed)
    weights = [1 / (k + 1) ** zipf for k in range(prefixes)]
    p_stop = 1 / max(1.0, mean_output)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        k = rng.choices(range(prefixes), weights)[0]
        o = 1
        while o < max_output and rng.random() > p_stop:
            o += 1
        out.append(SimRequest(i, t, k, prefix_len, rng.randint(*suffix_range), o))
    return out


# ---------------------------------------------------------------------------------------------
# replicas and the event loop
# ---------------------------------------------------------------------------------------------

@dataclass
class _Running:
    req: SimRequest
    generated: int = 0
    first: float | None = None


@dataclass
class Replica:
    idx: int
    max_batch: int
    prefix_slots: int
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)
    busy: bool = False
    cache: OrderedDict = field(default_factory=OrderedDict)  # prefix id -> None, LRU order
    admitted: list = field(default_factory=list)  # in the current iteration
    hits: int = 0
    prefills: int = 0

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.admitted)


class Router:
    def __init__(self, policy: str, replicas: int, balance_abs: int = 4, balance_rel: float = 1.5):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.policy, self.n = policy, replicas
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.next = 0
        self.prefix_home: dict[int, int] = {}

    def _least(self, reps: list[Replica]) -> int:
        loads = [r.outstanding for r in reps]
        low = min(loads)
        # rotate ties so that equal replicas share the work
        for k in range(self.n):
            i = (self.next + k) % self.n
            if loads[i] == low:
                self.next = (i + 1) % self.n
                return i
        raise AssertionError

    def route(self, req: SimRequest, reps: list[Replica]) -> int:
        if self.policy == "round-robin":
            i = self.next
            self.next = (self.next + 1) % self.n
            return i
        if self.policy == "least-outstanding":
            return self._least(reps)
        home = self.prefix_home.get(req.prefix_id)
        if home is not None:
            low = min(r.outstanding for r in reps)
            load = reps[home].outstanding
            if not (load > low + self.balance_abs and load > self.balance_rel * low):
                return home
        i = self._least(reps)
        self.prefix_home[req.prefix_id] = i
        return i


def percentile(values, q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def simulate(requests: list[SimRequest], policy: str, replicas: int, cost: CostModel, max_batch: int = 16,
             prefix_slots: int = 4, balance_abs: int = 4, balance_rel: float = 1.5) -> dict:
    """Serve ``requests`` on ``replicas`` replicas behind a ``policy`` router. Returns ``requests``
    (per request: rid, replica, prefix_hit, arrival, first_token, finish, ttft_s, tpot_s), ``metrics``
    (ttft_p50_s, ttft_p99_s, tpot_p50_s, tpot_p99_s, mean_ttft_s, throughput_tokens_per_s,
    requests_per_s, prefix_hit_rate, makespan_s, per_replica requests) and the inputs."""
    if replicas < 1:
        raise ValueError("need at least one replica")
    reps = [Replica(i, max_batch, prefix_slots) for i in range(replicas)]
    router = Router(policy, replicas, balance_abs, balance_rel)
    events: list = []  # (time, order, kind, payload)
    seq = 0
    for r in sorted(requests, key=lambda r: r.arrival):
        heapq.heappush(events, (r.arrival, seq, "arrive", r))
        seq += 1
    rows: dict[int, dict] = {}

    def start(rep: Replica, now: float) -> None:
        nonlocal seq
        if rep.busy or not (rep.waiting or rep.running):
            return
        decode_batch = len(rep.running)
        uncached = 0
        while rep.waiting and len(rep.running) + len(rep.admitted) < rep.max_batch:
            req = rep.waiting.popleft()
            hit = req.prefix_id in rep.cache
            rep.hits += hit
            rep.prefills += 1
            uncached += req.suffix_len if hit else req.prompt_len
            rep.cache[req.prefix_id] = None
            rep.cache.move_to_end(req.prefix_id)
            while len(rep.cache) > rep.prefix_slots:
                rep.cache.popitem(last=False)
            rows[req.rid]["prefix_hit"] = hit
            rep.admitted.append(_Running(req))
        dt = cost.prefill(uncached) + cost.decode(decode_batch)
        rep.busy = True
        heapq.heappush(events, (now + dt, seq, "done", rep.idx))
        seq += 1

    while events:
        now, _o, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            req = payload
            i = router.route(req, reps)
            rows[req.rid] = {"rid": req.rid, "replica": i, "arrival": req.arrival, "prefix_id": req.prefix_id,
                             "prompt_len": req.prompt_len, "output_len": req.output_len}
            reps[i].waiting.append(req)
            start(reps[i], now)
            continue
        rep = reps[payload]
        rep.busy = False
        still = []
        for run in rep.running:
            run.generated += 1
            if run.generated >= run.req.output_len:
                row = rows[run.req.rid]
                row["finish"] = now
                n = run.req.output_len
                row["tpot_s"] = (now - run.first) / (n - 1) if n > 1 else 0.0
            else:
                still.append(run)
        for run in rep.admitted:
            run.generated, run.first = 1, now
            row = rows[run.req.rid]
            row["first_token"] = now
            row["ttft_s"] = now - run.req.arrival
            if run.req.output_len == 1:
                row["finish"], row["tpot_s"] = now, 0.0
            else:
                still.append(run)
        rep.running, rep.admitted = still, []
        start(rep, now)

    done = [rows[r.rid] for r in requests]
    ttft = [r["ttft_s"] for r in done]
    tpot = [r["tpot_s"] for r in done if r["output_len"] > 1]
    t0 = min(r.arrival for r in requests)
    makespan = max(r["finish"] for r in done) - t0
    out_tokens = sum(r.output_len for r in requests)
    prefills = sum(r.prefills for r in reps)
    metrics = {
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
        "mean_ttft_s": sum(ttft) / len(ttft),
        "throughput_tokens_per_s": out_tokens / makespan if makespan > 0 else float("nan"),
        "requests_per_s": len(requests) / makespan if makespan > 0 else float("nan"),
        "prefix_hit_rate": sum(r.hits for r in reps) / prefills if prefills else 0.0,
        "makespan_s": makespan,
        "per_replica": [sum(1 for r in done if r["replica"] == i) for i in range(replicas)],
    }
    return {"policy": policy, "replicas": replicas, "requests": done, "metrics": metrics,
            "cost": cost.as_dict()}


def compare(requests: list[SimRequest], replicas: int, cost: CostModel, **kwargs) -> dict:
    """:func:`simulate` for every policy on the same requests: {policy: result}."""
    return {p: simulate(requests, p, replicas, cost, **kwargs) for p in POLICIES}


def offered_load(requests: list[SimRequest], cost: CostModel, replicas: int, batch: int) -> float:
    """Rough utilisation: work per second the requests bring (prefill + their share of decode steps at
    ``batch``) over what ``replicas`` replicas can do. Above ~1 queues grow without bound."""
    span = max(r.arrival for r in requests) - min(r.arrival for r in requests)
    if span <= 0:
        return float("inf")
    work = sum(cost.prefill(r.prompt_len) + (r.output_len - 1) * cost.decode(batch) / batch for r in requests)
    return work / span / replicas
