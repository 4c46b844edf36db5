"""The capstone run's own step time, predicted by the planner from this machine's measured rates.

The planner (:mod:`.planner`) predicts a GPU cluster's step time from a GPU's peak FLOP/s, its HBM
bandwidth and the links' α and β. Here the same model — :func:`~.planner.evaluate`, no second one —
is applied to the capstone run's small GPT and mesh with the rates ``distai calc plan --calibrate``
measured on this machine (:mod:`distai.engine.calibrate`) at the run's own sizes:

- the GEMMs run at the measured matmul rate (E = 1, w½ = 0: the rate was measured at these shapes);
- the memory-bound kernels and the attention core at the measured rate of the planner's byte count;
- every group's collectives with the measured α and β of the loopback, all ranks talking at once;
- β is per byte of the run's dtype: the planner counts bf16 (2-byte) activations, so it is scaled by
  the run's bytes per element / 2;
- the pipeline's bubble as the planner counts it, (pp − 1)/v slots.

That is the planner's view (:func:`predict`), and on a tiny CPU run it is 2-3× too low: the run makes
more calls than the planner counts. :func:`predict_run` is the run's own step: every group's calls as
the formulas count them (the run's meter matches them exactly; ring attention's hops for CP), each at
lesson 1's α-β time; the run's own layer, embedding and head timed by the calibration (every module's
overheads: most of a small run's computing); lesson 5's simulator replaying the schedule with these
unequal stages. The calibration and the run see the same CPU contention: the rates are measured with
as many processes as the run has ranks.

With more ranks than cores (8 gloo ranks on 2 cores) that critical path is not what sets the step:
every rank's CPU work must pass through the cores. The calibration measures each rank's CPU seconds
in the run's own step and the cores the ranks get; :func:`cores_bound_s` turns them into the step
of a greedy scheduler (Graham's bound: W/P + (1 − 1/P)·L), and the step is the longer of the two.

Pure: a profile is a plain dict (``gemm_flops``, ``elementwise_bytes_per_s``, ``alpha_s``,
``beta_s_per_byte``; ``layer_s``, ``first_s``, ``last_s``; ``cpu_step_s``, ``cpu_forward_s``,
``cpu_backward_s`` per pipeline stage and ``cores``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .. import units
from ..lesson1.formulas import ring_allgather_time, ring_allreduce_time
from ..lesson4.formulas import tp_comm_per_layer
from ..model_size import ModelSize
from ..model_spec import ModelSpec
from ..strings import detect_language, translated
from . import formulas as f
from . import planner as pl

#: the planner's bytes per activation element (bf16), against which the run's dtype scales β
PLANNER_ELEM_BYTES = 2
#: what the prediction's terms are called (the planner's ``time`` keys)
TERMS = ("compute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "bubble_s", "dp_comm_exposed_s", "optimizer_s")
#: the run's own terms (:func:`predict_run`): the planner's and the wait for a core
RUN_TERMS = (*TERMS, "cores_s")



@dataclass(frozen=True)
class RunShape:
    """The capstone run the prediction is for: its mesh, its GPT and its batch."""
    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    seq: int
    vocab: int
    ffn: int
    micro_batch: int
    microbatches: int
    chunks: int = 1
    zero: int = 0
    elem_bytes: int = 8

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def tokens(self) -> int:
        """Rows of one microbatch on one rank: b·s/cp."""
        return self.micro_batch * self.seq // self.cp

    def as_dict(self) -> dict:
        return asdict(self)

    def model_size(self) -> ModelSize:
        return ModelSize(vocab=self.vocab, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                         layers=self.layers, seq=self.seq, ffn=self.ffn, tie_embeddings=False)


def gemm_shapes(run: RunShape) -> list[tuple[int, int, int]]:
    """(rows, in, out) of one layer's GEMMs on one rank: QKV, the attention's output, the MLP's two."""
    t, h, rows = run.tp, run.hidden, run.tokens
    qkv = h + 2 * run.kv_heads * (h // run.heads)
    return [(rows, h, qkv // t), (rows, h // t, h), (rows, h, run.ffn // t), (rows, run.ffn // t, h)]


def layer_bytes(run: RunShape) -> float:
    """The planner's bytes of one layer's memory-bound kernels, forward, on one rank
    (:func:`~.formulas.layer_forward_seconds` with FlashAttention: no score matrix)."""
    sbh = run.tokens * run.hidden
    sp = run.tp > 1
    return sbh * (f.ELEMENTWISE_REPLICATED / (run.tp if sp else 1) + f.ELEMENTWISE_SPLIT / run.tp)


def model_spec(run: RunShape) -> ModelSpec:
    """The run's GPT as the planner sees it: its output layer has its own V·h table (untied), which
    the planner counts apart from the layers (the logits GEMM)."""
    size = run.model_size()
    return ModelSpec(params=size.num_params(), layers=run.layers, hidden=run.hidden, heads=run.heads,
                     kv_heads=run.kv_heads, seq=run.seq, vocab=run.vocab, tied_embeddings=False)


def cluster(run: RunShape, profile: dict) -> pl.Cluster:
    """This machine as the planner's cluster: one node of ``world`` ranks at the measured rates."""
    beta = profile["beta_s_per_byte"] * run.elem_bytes / PLANNER_ELEM_BYTES
    bandwidth = 1 / beta if beta > 0 else 1e30
    return pl.Cluster(gpus=run.world, gpu_memory=1e18, gpus_per_node=run.world, flops=profile["gemm_flops"],
                      intra_bandwidth=bandwidth, inter_bandwidth=bandwidth, alpha=profile["alpha_s"],
                      inter_alpha=profile["alpha_s"], nccl_collectives=False,  # gloo's measured ring, not NCCL
                      hbm_bandwidth=profile["elementwise_bytes_per_s"],
                      gemm_peak_fraction=1.0, gemm_half_width=0.0, flash_attention=True)


def predict(run: RunShape, profile: dict) -> dict:
    """The planner's step time for ``run`` on the profiled machine: {"step_time_s", the terms of
    :data:`TERMS` (seconds), "microbatches"}; ValueError when the planner refuses the run."""
    config = pl.Config(run.tp, run.pp, run.dp, run.micro_batch, run.zero, "none", run.chunks, run.tp > 1,
                       run.cp, run.ep)
    global_batch = run.dp * run.microbatches * run.micro_batch
    # the run's schedules are distai's own (engine.pipeline): interleaved on 2 stages too, which Megatron-LM refuses
    c = pl.evaluate(model_spec(run), cluster(run, profile), global_batch, config, optimizer="sgd",
                    axes=pl.Axes(engine="distai"))
    if c.reason:
        raise ValueError(f"the planner cannot evaluate the capstone run: {c.reason}")
    return {"step_time_s": c.step_time_s, "microbatches": c.microbatches, **{k: c.time[k] for k in TERMS}}


def call_s(op: str, sent: float, n: int, alpha: float, beta: float) -> float:
    """One call's time at lesson 1's α-β cost, from the bytes one rank sent in it (the meter's and
    the formulas' account): a ring all-reduce sends 2(n−1)/n·S, an all-gather or reduce-scatter
    (n−1)/n·S; a send (or anything else) is one message α + S·β; a receive is the other end of a
    send, priced on the sender (0)."""
    if op == "recv":
        return 0.0
    if op == "all_reduce" and n > 1:
        return ring_allreduce_time(sent * n / (2 * (n - 1)), n, alpha, beta)
    if op in ("all_gather", "reduce_scatter", "all_to_all") and n > 1:
        return ring_allgather_time(sent * n / (n - 1), n, alpha, beta)
    return alpha + sent * beta


def account_s(run: RunShape, profile: dict, account: dict[str, dict]) -> dict[str, float]:
    """Seconds of every group's calls in ``account`` (``{group: {"ops": {op: {"calls", "bytes"}}}}``,
    the run's exact count from the formulas, :func:`distai.engine.mesh.expected_comm`), each call at
    :func:`call_s` with the measured α and β."""
    alpha, beta = profile["alpha_s"], profile["beta_s_per_byte"]
    out: dict[str, float] = {}
    for dim, group in account.items():
        n = _group_size(run, dim)
        out[dim] = sum(cell["calls"] * call_s(op, cell["bytes"] / cell["calls"], n, alpha, beta)
                       for op, cell in group.get("ops", {}).items() if cell["calls"])
    return out


def layer_s(run: RunShape, profile: dict) -> float:
    """One layer's forward and backward for one microbatch on one rank at the measured rates (the
    planner's :func:`~.formulas.layer_forward_seconds`, its GEMMs and memory-bound kernels), or the
    run's own layer timed by the calibration (``layer_s``: every module's overheads included)."""
    if "layer_s" in profile:
        return float(profile["layer_s"])
    c = cluster(run, profile)
    fwd = f.layer_forward_seconds(hidden=run.hidden, heads=run.heads, seq=run.seq, micro_batch=run.micro_batch,
                                  layer_params=model_spec(run).active_layer_params, tp=run.tp, cp=run.cp,
                                  sequence_parallel=run.tp > 1, flash=True, peak_flops=c.flops,
                                  hbm_bandwidth=c.hbm_bandwidth, peak_fraction=1.0, half_width=0.0)
    return f.layer_train_seconds(fwd, "none")


def ends_s(run: RunShape, profile: dict) -> tuple[float, float]:
    """What the first and the last stage do beyond their layers, per microbatch, forward and
    backward: the embedding's lookup and gradient (b·s/cp·h numbers, read and written: memory-bound)
    on the first; on the last the final LayerNorm, the head's GEMM (3 · 2·rows·h·V/t FLOPs) and the
    vocabulary-parallel loss over rows × V/t logits (softmax forward and backward: memory-bound, as
    many passes as a layer's elementwise kernels count per number); or the run's own modules timed
    by the calibration (``first_s``, ``last_s``)."""
    if "first_s" in profile and "last_s" in profile:
        return float(profile["first_s"]), float(profile["last_s"])
    rows, h, vt = run.tokens, run.hidden, run.vocab // run.tp
    rate, flops = profile["elementwise_bytes_per_s"], profile["gemm_flops"]
    first = 3 * 2 * rows * h * run.elem_bytes / rate
    last = 3 * 2 * rows * h * vt / flops + 3 * rows * (vt * f.ELEMENTWISE_SPLIT / run.tp + h) * run.elem_bytes / rate
    return first, last


def cores_bound_s(run: RunShape, profile: dict) -> float:
    """The step of ranks sharing fewer cores, from each rank's CPU seconds (``cpu_step_s``, per
    pipeline stage: a stage's world/pp ranks alike), its blocks' (``cpu_forward_s``,
    ``cpu_backward_s``) and the cores P the ranks get (``cores``), measured by the calibration: the operating system's scheduler leaves a core
    idle only while fewer ranks than cores can run, so the step takes at most the work over the
    cores, W/P, plus (1 − 1/P) of the critical path L (Graham's bound for a greedy scheduler, 1969);
    L is lesson 5's replay of the schedule with the blocks' CPU times and, after it, the most CPU
    a stage spends outside its blocks (its optimizer, gradient synchronisation, messages). 0 for
    a profile without them (one measured before they were)."""
    from ..lesson5 import simulator as sim

    if "cpu_step_s" not in profile:
        return 0.0
    p, m, v = run.pp, run.microbatches, run.chunks if run.pp > 1 else 1
    step, fwd, bwd = (list(profile[k]) for k in ("cpu_step_s", "cpu_forward_s", "cpu_backward_s"))
    cores = max(0.25, float(profile["cores"]))
    work = sum(step) * run.world / p
    schedule = "1f1b" if v == 1 else "interleaved"
    durations = {op: (fwd if op.kind == "F" else bwd)[r] for r, ops in enumerate(sim.schedule_order(schedule, p, m, v))
                 for op in ops}
    blocks = sim.replay(schedule, p, m, v, durations).makespan
    rest = max(step[i] - m * v * (fwd[i] + bwd[i]) for i in range(p))
    return work / cores + max(0.0, 1 - 1 / cores) * (blocks + max(rest, 0.0))


def optimizer_s(run: RunShape, profile: dict, layers: list[int]) -> float:
    """The run's optimizer step on the pipeline rank holding the most parameters: the planner's
    :func:`~.planner.optimizer_step_bytes` for what the run does (MeshTrainer: SGD with momentum in the
    run's dtype, the parameters their own master copy, no clipping; ZeRO-1 updates a 1/(dp·cp) shard), at
    the measured rate of the memory-bound kernels. Each rank's layers split t ways; the first also holds
    the embedding, the last the untied head (V·h/t each)."""
    spec, p = model_spec(run), run.pp
    table = run.vocab * run.hidden / run.tp
    most = max(layers[i] * spec.layer_params / run.tp + (table if i == 0 else 0.0) + (table if i == p - 1 else 0.0)
               for i in range(p))
    owned = most / (run.dp * run.cp if run.zero else 1)
    fp32 = pl.optimizer_step_bytes(owned, "sgd", 4, precision="fp32", clip=False)  # 4-byte elements
    return fp32 * run.elem_bytes / 4 / profile["elementwise_bytes_per_s"]


def predict_run(run: RunShape, profile: dict, accounts: list[dict[str, dict]], layers: list[int]) -> dict:
    """The run's step time from what it does (``accounts[i]``: pipeline rank i's exact calls per
    group, :func:`distai.engine.mesh.expected_comm`; ``layers[i]``: the layers it holds): each
    stage's time per microbatch is its layers
    (:func:`layer_s`), its ends (:func:`ends_s`) and its TP and CP calls (:func:`account_s`) per
    microbatch; lesson 5's simulator replays the schedule with these unequal stages (forward a third,
    backward two thirds) and one pipeline message (α + S·β) per hop; the gradients' all-reduce after
    it, on the stage with the most, and the optimizer step (:func:`optimizer_s`): the critical path,
    the step where every rank has a core
    (``cpus`` at least the world). With more ranks than cores the cores set the step instead: it is
    :func:`cores_bound_s`, and ``cores_s`` is what that adds to the critical path's terms (less than
    0 when the α-β prices, measured with every rank busy, count more waiting than the cores cause). Terms as
    :data:`RUN_TERMS`, of the slowest stage; their sum is the step."""
    from ..lesson5 import simulator as sim

    m, p, v = run.microbatches, run.pp, run.chunks if run.pp > 1 else 1
    first, last = ends_s(run, profile)
    priced = [account_s(run, profile, a) for a in accounts]
    slots, comm = [], []
    for i, cost in enumerate(priced):
        work = layers[i] * layer_s(run, profile) + (first if i == 0 else 0.0) + (last if i == p - 1 else 0.0)
        comm.append((cost.get("tp", 0.0) / m, cost.get("cp", 0.0) / m))
        slots.append((work, sum(comm[-1])))
    durations = {}
    for r, ops in enumerate(sim.schedule_order("1f1b" if v == 1 else "interleaved", p, m, v)):
        for op in ops:
            share = 1 / 3 if op.kind == "F" else 2 / 3
            durations[op] = sum(slots[r]) * share / v
    sends = [a.get("pp", {}).get("ops", {}).get("send", {"calls": 0, "bytes": 0.0}) for a in accounts]
    hop = max((call_s("send", s["bytes"] / s["calls"], 2, profile["alpha_s"], profile["beta_s_per_byte"])
               for s in sends if s["calls"]), default=0.0)
    schedule = "1f1b" if v == 1 else "interleaved"
    span = sim.replay(schedule, p, m, v, durations, t_comm=hop).makespan
    bare = sim.replay(schedule, p, m, v, durations, t_comm=0.0).makespan
    slow = max(range(p), key=lambda r: sum(slots[r]))
    dp = max(c.get("dp", 0.0) for c in priced)
    busy = m * sum(slots[slow])
    bound = cores_bound_s(run, profile)
    update = optimizer_s(run, profile, layers)
    cores = bound - span - dp - update if bound and run.world > profile.get("cpus", run.world) else 0.0
    return {"step_time_s": span + dp + update + cores, "microbatches": m, "compute_s": m * slots[slow][0],
            # differences of sums: rounding leaves -7e-18 s where they are 0 (one stage), printed as a negative bubble
            "tp_comm_s": m * comm[slow][0], "cp_comm_s": m * comm[slow][1], "pp_comm_s": max(0.0, span - bare),
            "bubble_s": max(0.0, bare - busy), "dp_comm_exposed_s": dp, "optimizer_s": update, "cores_s": cores}


def planner_tp_calls(run: RunShape) -> dict[str, int]:
    """The tensor-parallel collectives the planner counts on one rank per step: lesson 4's per-layer
    forward and backward ops (:func:`~distai.lessons.lesson4.formulas.tp_comm_per_layer`) for the
    stage's layers and the m microbatches; none without tensor parallelism."""
    if run.tp == 1:
        return {}
    per_layer = tp_comm_per_layer(run.hidden, run.seq // run.cp, run.micro_batch, run.tp, sequence_parallel=True)
    stage = f.stage_layers(run.layers, run.pp)
    out: dict[str, int] = {}
    for direction in ("forward", "backward"):
        for op, calls in per_layer[direction].items():
            out[op] = out.get(op, 0) + calls * stage * run.microbatches
    return out


def _group_size(run: RunShape, dim: str) -> int:
    return {"tp": run.tp, "cp": run.cp, "dp": run.dp * run.cp}.get(dim, 2)


def compute(measured: dict) -> dict:
    """``distai calc plan --calibrate``'s JSON: {"calibrated": true, "run" (the RunShape's fields),
    "profile" (the measured rates, load, CPUs, the ranks' CPU per step and the cores they got, dtype),
    "prediction" (:func:`predict_run`), "planner" (:func:`predict`)}."""
    run = RunShape(**measured["run"])
    profile = measured["profile"]
    rates = {k: profile[k] for k in ("gemm_flops", "elementwise_bytes_per_s", "alpha_s", "beta_s_per_byte", "load",
                                     "cpus", "measured_at", "layer_s", "cpu_step_s", "cores") if k in profile}
    return {"calibrated": True, "run": run.as_dict(), "profile": dict(rates, dtype=profile["dtype"]),
            "prediction": predict_run(run, profile, measured["accounts"], measured["layers"]),
            "planner": predict(run, profile), "command": measured["command"]}


def text(r: dict, lang: str | None = None) -> list[str]:
    """The lines of ``distai calc plan --calibrate``."""
    lang = lang or detect_language()
    run, p, pr = r["run"], r["profile"], r["prediction"]
    t = lambda x: units.format_time(x, lang=lang)  # noqa: E731 - one formatter, read six times
    signed = lambda x: ("−" if x < 0 else "+") + t(abs(x))  # noqa: E731 - the cores' term, either way
    world = run["dp"] * run["tp"] * run["pp"] * run["cp"]
    return [
        translated("checks", "calib_machine", lang, cpus=p["cpus"], load=units.format_number(p["load"], lang=lang),
                   ranks=world, dtype=p["dtype"]),
        translated("checks", "calib_rates", lang, gemm=units.format_count(p["gemm_flops"], lang=lang),
                   other=units.format_bandwidth(p["elementwise_bytes_per_s"], lang=lang), alpha=t(p["alpha_s"]),
                   beta=t(p["beta_s_per_byte"])),
        translated("checks", "calib_run", lang, m=run["microbatches"], b=run["micro_batch"],
                   **{k: run[k] for k in ("dp", "tp", "pp", "cp", "ep", "layers", "hidden", "heads", "seq", "vocab")}),
        translated("checks", "calib_step", lang, step=t(pr["step_time_s"]), compute=t(pr["compute_s"]),
                   tp_comm=t(pr["tp_comm_s"]), cp_comm=t(pr["cp_comm_s"]), pp_comm=t(pr["pp_comm_s"]),
                   bubble=t(pr["bubble_s"]), dp_comm=t(pr["dp_comm_exposed_s"]),
                   optimizer=t(pr.get("optimizer_s", 0.0)), cores=signed(pr.get("cores_s", 0.0))),
        translated("checks", "calib_run_it", lang, command=r["command"]),
    ]
