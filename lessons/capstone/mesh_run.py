"""What the mesh visualizer draws: the phases of one 3D-parallel step, and a capstone run folded from
its events. Pure Python: no torch, no Textual, no I/O.

A step, followed for one microbatch (Megatron-LM's order; Narayanan et al. 2021, Sec. 2-3): the
forward runs stage by stage — inside each stage the TP group's collectives (lesson 4), then a send
of the activation to the next stage over the PP group (lesson 5) — the backward comes back the same
way with gradients, and once the last backward is done each DP group reduces its gradients (lessons 1,
2 and 6) before the optimizer step. :func:`step_phases` lists those phases for a (pp, dp, tp) mesh.

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

DIMS = ("tp", "pp", "dp")


@dataclass(frozen=True)
class Phase:
    """One moment of a step: which group talks (``dim``: tp, pp, dp, or "" for none), which pipeline
    stages take part, and what happens (``what``: forward, backward, send, send-grad, reduce, update)."""
    dim: str
    stages: tuple[int, ...]
    what: str
    microbatch: int = 0
    t0: float | None = None  # measured start (s, relative to the step) when replayed from a run
    t1: float | None = None


def step_phases(pp: int, dp: int, tp: int) -> list[Phase]:
    """The phases of one step for one microbatch on a (pp, dp, tp) mesh (see the module docstring).
    Degrees of 1 have no group: a tp of 1 computes without collectives, a pp of 1 sends nothing."""
    f.world_size(pp, dp, tp)  # validates the degrees
    tp_dim = "tp" if tp > 1 else ""
    out: list[Phase] = []
    for s in range(pp):
        out.append(Phase(tp_dim, (s,), "forward"))
        if s < pp - 1:
            out.append(Phase("pp", (s, s + 1), "send"))
    for s in reversed(range(pp)):
        out.append(Phase(tp_dim, (s,), "backward"))
        if s > 0:
            out.append(Phase("pp", (s, s - 1), "send-grad"))
    out.append(Phase("dp" if dp > 1 else "", tuple(range(pp)), "reduce"))
    out.append(Phase("", tuple(range(pp)), "update"))
    return out


def active_ranks(phase: Phase, pp: int, dp: int, tp: int) -> set[int]:
    """The ranks that take part in ``phase``: every rank of its stages (each stage's TP groups work at
    once, the PP pairs of two stages exchange, every DP group reduces)."""
    return {r for r in range(f.world_size(pp, dp, tp)) if f.mesh_coords(r, pp, dp, tp)["pp"] in phase.stages}


@dataclass
class MeshRun:
    """A capstone run folded from its events (see the module docstring)."""
    shape: tuple[int, int, int] | None = None  # (pp, dp, tp)
    config: dict = field(default_factory=dict)
    coords: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rank -> (pp, dp, tp)
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
            self.config = {k: v for k, v in event.items() if k not in ("kind", "ranks", "t")}
            self.coords = {int(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in event.get("ranks") or ()}
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
        if step is None or self.shape is None:
            return []
        pp, dp, tp = self.shape
        blocks = sorted(self.ops[step].items(), key=lambda kv: kv[1][0])
        origin = blocks[0][1][0]
        out: list[Phase] = []
        for (stage, op, mb, _chunk), (t0, t1) in blocks:
            forward = op.upper().startswith("F")
            out.append(Phase("tp" if tp > 1 else "", (stage,), "forward" if forward else "backward", mb,
                             t0 - origin, t1 - origin))
            nxt = stage + 1 if forward else stage - 1
            if 0 <= nxt < pp:
                out.append(Phase("pp", (stage, nxt), "send" if forward else "send-grad", mb, t1 - origin, t1 - origin))
        end = max(t1 for _, (_, t1) in blocks) - origin
        out.append(Phase("dp" if dp > 1 else "", tuple(range(pp)), "reduce", 0, end, end))
        out.append(Phase("", tuple(range(pp)), "update", 0, end, end))
        return out

    def coords_match_formulas(self) -> bool:
        """Every rank sits where :func:`~.formulas.mesh_coords` puts it (the mesh is row-major)."""
        if self.shape is None or not self.coords:
            return False
        pp, dp, tp = self.shape
        return all(tuple(f.mesh_coords(r, pp, dp, tp)[d] for d in ("pp", "dp", "tp")) == c
                   for r, c in self.coords.items())

    def comm_by_stage(self) -> dict[int, dict[str, dict]]:
        """Per pipeline stage (every rank of a stage sends the same), per group: {"bytes", "calls",
        "expected_bytes", "match"} from the metered step."""
        out: dict[int, dict[str, dict]] = {}
        for a in self.comm:
            stage = int(a["pp"])
            if stage in out:
                continue
            out[stage] = {d: {"bytes": a["measured"][d]["bytes"], "calls": a["measured"][d]["calls"],
                              "expected_bytes": a["expected"][d]["bytes"], "match": bool(a["match"][d])}
                          for d in DIMS if d in a["measured"]}
        return dict(sorted(out.items()))
