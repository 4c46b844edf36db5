"""What the mesh visualizer draws: the phases of one step on a (pp, dp, cp, tp) mesh with experts
inside dp·cp, and a capstone run folded from its events. Pure Python: no torch, no Textual, no I/O.

A step, followed for one microbatch (Megatron-LM's order; Narayanan et al. 2021, Sec. 2-3): the
forward runs stage by stage — inside each stage the TP group's collectives (lesson 4), the CP group's
ring of keys and values in every attention (the context lesson) and the EP group's all-to-alls that
send tokens to their experts and back (the experts lesson), then a send of the activation to the next
stage over the PP group (lesson 5) — the backward comes back the same way with gradients, and once the
last backward is done the dp·cp ranks reduce their gradients (lessons 1, 2 and 6; the experts' over
the ranks holding the same ones, ``edp``) before the optimizer step. :func:`step_phases` lists them.

:class:`Layout` is the mesh's arithmetic, as the engine's ``build_mesh`` lays the ranks out (torchtitan's
``ParallelDims``): rank = ((p·dp + d)·cp + c)·tp + t; the gradient group every (d, c) of a (p, t); an
EP group ``ep`` consecutive ones of those in (d, c) order; ``edp`` the same place in each EP group. With
cp = ep = 1 it is :func:`~.formulas.mesh_coords`' (pp, dp, tp) mesh.

:class:`MeshRun` folds the events of ``distai.engine.experiments.capstone``: ``mesh_config`` (the
shape and every rank's coordinates), ``pp_op`` (each forward/backward block with its times),
``mesh_step``, ``step`` (loss against one process), ``mesh_comm`` (each rank's bytes per group,
measured and from the formulas) and ``summary``. :meth:`MeshRun.replay_phases` turns the latest
complete step's blocks into the same phases, in the order the run executed them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START, SUMMARY
from ..lesson5.events import PP_OP
from . import formulas as f
from .events import MESH_COMM, MESH_CONFIG, STEP

#: the groups of a run, in the order the communication account lists them
GROUPS = ("tp", "pp", "dp", "cp", "ep", "edp", "moe")
#: the device mesh's axes, outermost first
AXES = ("pp", "dp", "cp", "tp")


@dataclass(frozen=True)
class Layout:
    """A mesh's degrees: ``pp × dp × cp × tp`` ranks, ``ep`` dividing dp·cp (``moe``: the blocks' MLPs
    are experts). The one definition of a capstone mesh: the views draw it, and the engine
    (``distai.engine.mesh_args``) checks, builds and accounts a run by it."""
    pp: int
    dp: int
    tp: int
    cp: int = 1
    ep: int = 1
    moe: bool = False

    def __post_init__(self) -> None:
        f.world_size(self.pp, self.dp, self.tp)  # validates the three
        if self.cp < 1 or self.ep < 1 or (self.dp * self.cp) % self.ep:
            raise ValueError(f"cp = {self.cp} and ep = {self.ep} must be positive, ep dividing dp·cp")

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def replicas(self) -> int:
        """Ranks over which gradients are reduced: dp·cp (torchtitan's ``dp_shard_cp``)."""
        return self.dp * self.cp

    @property
    def mesh_dims(self) -> tuple[int, ...]:
        """The device mesh's shape, in :data:`AXES` order."""
        return tuple(getattr(self, axis) for axis in AXES)

    @property
    def five_d(self) -> bool:
        return self.cp > 1 or self.moe

    def size(self, dim: str) -> int:
        """Ranks in one group of ``dim`` (dp: the dp·cp gradient group)."""
        replicas = self.replicas
        return {"pp": self.pp, "dp": replicas, "tp": self.tp, "cp": self.cp, "ep": self.ep if self.moe else 1,
                "edp": replicas // self.ep if self.moe else 1, "moe": replicas * self.tp if self.moe else 1}[dim]

    def groups(self, every: bool = False) -> tuple[str, ...]:
        """The groups that talk in a step (a group of one does not), in :data:`GROUPS` order; with
        ``every``, every process group a run builds and accounts, one rank or more: pp, dp (dp·cp
        ranks) and tp; cp when > 1; with experts ep, edp (the ranks holding the same experts) and moe
        (every rank of a stage: the routing statistics of the global batch)."""
        built = ("pp", "dp", "tp") + (("cp",) if self.cp > 1 else ()) + (("ep", "edp", "moe") if self.moe else ())
        return tuple(d for d in GROUPS if d in built and (every or self.size(d) > 1))

    def __str__(self) -> str:
        extra = (f" × cp={self.cp}" if self.cp > 1 else "") + (f", ep={self.ep}" if self.moe else "")
        return f"pp={self.pp} × dp={self.dp} × tp={self.tp}" + extra

    def coords(self, rank: int) -> dict[str, int]:
        """``{pp, dp, cp, tp, ep, edp}`` of a global rank (ep, edp: its place among the dp·cp ranks)."""
        return f.mesh5_coords(rank, self.pp, self.dp, self.cp, self.tp, self.ep)

    def rank_at(self, pp: int, dp: int, cp: int, tp: int) -> int:
        return f.mesh5_rank(pp, dp, cp, tp, self.pp, self.dp, self.cp, self.tp)

    def group(self, rank: int, dim: str) -> list[int]:
        """The ranks of ``rank``'s group along ``dim`` (as the engine builds it)."""
        if dim == "moe":
            stage = self.coords(rank)["pp"]
            return [r for r in range(self.world) if r // (self.world // self.pp) == stage]
        if dim in f.MESH5_GROUPS:
            return f.mesh5_group(rank, dim, self.pp, self.dp, self.cp, self.tp, self.ep)
        raise ValueError(f"unknown mesh group {dim!r}; choose one of {', '.join(GROUPS)}")


@dataclass(frozen=True)
class Phase:
    """One moment of a step: which group talks (``dim``: one of :data:`GROUPS`, or "" for none), which
    pipeline stages take part, and what happens (``what``: forward, backward, ring, ring-grad, dispatch,
    dispatch-grad, send, send-grad, reduce, reduce-experts, update)."""
    dim: str
    stages: tuple[int, ...]
    what: str
    microbatch: int = 0
    t0: float | None = None  # measured start (s, relative to the step) when replayed from a run
    t1: float | None = None


def _inside(layout: Layout, stage: int, backward: bool, mb: int = 0, t0: float | None = None,
            t1: float | None = None) -> list[Phase]:
    """What a stage's block does: its TP collectives, then CP's ring and EP's all-to-alls."""
    out = [Phase("tp" if layout.tp > 1 else "", (stage,), "backward" if backward else "forward", mb, t0, t1)]
    if layout.cp > 1:
        out.append(Phase("cp", (stage,), "ring-grad" if backward else "ring", mb, t0, t1))
    if layout.size("ep") > 1:
        out.append(Phase("ep", (stage,), "dispatch-grad" if backward else "dispatch", mb, t0, t1))
    return out


def _closing(layout: Layout, t: float | None = None) -> list[Phase]:
    stages = tuple(range(layout.pp))
    out = [Phase("dp" if layout.size("dp") > 1 else "", stages, "reduce", 0, t, t)]
    if layout.size("edp") > 1:
        out.append(Phase("edp", stages, "reduce-experts", 0, t, t))
    return out + [Phase("", stages, "update", 0, t, t)]


def step_phases(pp: int, dp: int, tp: int, cp: int = 1, ep: int = 1, moe: bool = False) -> list[Phase]:
    """The phases of one step for one microbatch (see the module docstring). Groups of one have no
    phase of their own: a tp of 1 computes without collectives, a pp of 1 sends nothing."""
    layout = Layout(pp, dp, tp, cp, ep, moe)
    out: list[Phase] = []
    for s in range(pp):
        out += _inside(layout, s, backward=False)
        if s < pp - 1:
            out.append(Phase("pp", (s, s + 1), "send"))
    for s in reversed(range(pp)):
        out += _inside(layout, s, backward=True)
        if s > 0:
            out.append(Phase("pp", (s, s - 1), "send-grad"))
    return out + _closing(layout)


@dataclass
class MeshRun:
    """A capstone run folded from its events (see the module docstring)."""
    shape: tuple[int, int, int] | None = None  # (pp, dp, tp)
    layout: Layout | None = None  # the five axes
    config: dict = field(default_factory=dict)
    coords: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> (pp, dp, tp[, cp, ep])
    ops: dict[int, dict[tuple, tuple[float, float]]] = field(default_factory=dict)  # step -> block -> (t0, t1)
    steps: list[dict] = field(default_factory=list)
    comm: list[dict] = field(default_factory=list)  # mesh_comm's ranks
    summary: dict | None = None

    def feed(self, event: dict) -> bool:
        """Fold one event; True when it changed what there is to draw."""
        if RUN_START.matches(event):
            MeshRun.__init__(self)
            return True
        if MESH_CONFIG.matches(event):
            MeshRun.__init__(self)
            self.shape = (int(event["pp"]), int(event["dp"]), int(event["tp"]))
            self.layout = Layout(*self.shape, int(event.get("cp") or 1), int(event.get("ep") or 1),
                                 bool(event.get("experts")))
            self.config = {k: v for k, v in event.items() if k not in ("kind", "ranks", "t")}
            self.coords = {int(r[0]): tuple(int(x) for x in r[1:]) for r in event.get("ranks") or ()}
            return True
        if self.shape is None:
            return False
        if PP_OP.matches(event):
            key = (int(event["stage"]), str(event["op"]), int(event["mb"]), int(event.get("chunk") or 0))
            blocks = self.ops.setdefault(int(event["step"]), {})
            t0, t1 = float(event["t0"]), float(event["t1"])
            old = blocks.get(key)  # every rank of a stage reports its block: keep the widest span
            blocks[key] = (min(t0, old[0]), max(t1, old[1])) if old else (t0, t1)
            return False  # drawn once a step is complete
        if STEP.matches(event):
            self.steps.append({k: event.get(k) for k in ("step", "loss", "ref_loss", "loss_rel_diff",
                                                         "param_rel_diff", "step_time_s")})
            return True
        if MESH_COMM.matches(event):
            self.comm = list(event.get("ranks") or ())
            return True
        if event.get("kind") == SUMMARY.name:  # open: the lesson's own figures
            self.summary = {k: v for k, v in event.items() if k not in ("kind", "t")}
            return True
        return False

    @property
    def blocks_per_step(self) -> int:
        """Forward and backward blocks of a complete step: 2 · m · v per stage."""
        pp = self.shape[0] if self.shape else 0
        return 2 * int(self.config.get("m", 0)) * int(self.config.get("v", 1) or 1) * pp

    def latest_complete_step(self) -> int | None:
        want = self.blocks_per_step
        done = [s for s, blocks in self.ops.items() if want and len(blocks) >= want]
        return max(done) if done else None

    def replay_phases(self) -> list[Phase]:
        """The latest complete step as phases, in the order its blocks started: each forward or
        backward block of a stage (its TP group talks), a send to the next stage after a forward and to
        the previous one after a backward (PP), then the DP reduction and the update."""
        step = self.latest_complete_step()
        if step is None or self.layout is None:
            return []
        pp = self.layout.pp
        blocks = sorted(self.ops[step].items(), key=lambda kv: kv[1][0])
        origin = blocks[0][1][0]
        out: list[Phase] = []
        for (stage, op, mb, _chunk), (t0, t1) in blocks:
            forward = op.upper().startswith("F")
            out += _inside(self.layout, stage, not forward, mb, t0 - origin, t1 - origin)
            nxt = stage + 1 if forward else stage - 1
            if 0 <= nxt < pp:
                out.append(Phase("pp", (stage, nxt), "send" if forward else "send-grad", mb, t1 - origin, t1 - origin))
        return out + _closing(self.layout, max(t1 for _, (_, t1) in blocks) - origin)

    def coords_match_formulas(self) -> bool:
        """Every rank sits where :class:`Layout` puts it (the mesh is row-major; a 3D run's coordinates
        are :func:`~.formulas.mesh_coords`')."""
        if self.layout is None or not self.coords:
            return False
        names = ("pp", "dp", "tp", "cp", "ep")
        return all(0 <= r < self.layout.world and tuple(self.layout.coords(r)[d] for d in names[:len(c)]) == c
                   for r, c in self.coords.items())

    def comm_by_stage(self) -> dict[int, dict[str, dict]]:
        """Per pipeline stage (every rank of a stage sends the same but the experts' tokens, which
        routing decides: its first rank's), per group: {"bytes", "calls", "expected_bytes", "match"}
        from the metered step."""
        out: dict[int, dict[str, dict]] = {}
        for a in self.comm:
            stage = int(a["pp"])
            if stage in out:
                continue
            out[stage] = {d: {"bytes": a["measured"][d]["bytes"], "calls": a["measured"][d]["calls"],
                              "expected_bytes": a["expected"][d]["bytes"], "match": bool(a["match"][d])}
                          for d in GROUPS if d in a["measured"]}
        return dict(sorted(out.items()))
