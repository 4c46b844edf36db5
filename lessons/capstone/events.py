"""The capstone's run events (``engine/experiments/capstone.py``, ``engine/mesh.py``): see
``lessons/events.py``. Its pipeline's blocks are lesson 5's ``pp_op``."""
from typing import Any, NotRequired, TypedDict

from .. import events as shared
from ..events import Envelope, EventKind
from ..lesson5.events import PP_OP


class MeshShape(TypedDict):
    """The run's mesh, model and pipeline schedule (also the summary's ``config``)."""
    pp: int
    dp: int
    tp: int
    world: int
    schedule: str
    v: int
    m: int
    microbatch_size: int
    zero: int
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    dtype: str
    device: str
    cp: NotRequired[int]  # context-parallel degree (absent: 1)
    ep: NotRequired[int]  # expert-parallel degree, inside dp·cp (absent: 1)
    experts: NotRequired[int]  # experts per MoE layer (0 or absent: dense MLPs)
    top_k: NotRequired[int]


class MeshConfig(Envelope, MeshShape):
    """Rank 0, first: the mesh, and every rank's ``[rank, pp, dp, tp, cp, ep]`` coordinates (a 3D
    run's recorded before cp and ep: ``[rank, pp, dp, tp]``)."""
    ranks: list[list[int]]


class Step(shared.Step):
    """One step of the 3D run against one process's (None: ``--no-check``)."""
    ref_loss: float | None
    loss_rel_diff: float | None
    param_rel_diff: float | None
    step_time_s: float


class MeshStep(Envelope):
    """One rank's step and its mesh coordinates (wall-clock seconds: the schedule ran from
    ``t_start`` to ``t_pipeline_end``, the gradient syncs that remain and the optimizer until
    ``t_end``)."""
    step: int
    pp: int
    dp: int
    tp: int
    cp: NotRequired[int]
    ep: NotRequired[int]
    t_start: float
    t_pipeline_end: float
    t_end: float


class MeshComm(Envelope):
    """Rank 0, after the metered ``step``: for every rank ``{"rank", "pp", "dp", "tp", "cp", "ep",
    "measured", "expected", "match"}``, where ``measured`` and ``expected`` are ``{dim: {"ops":
    {op: {"calls", "bytes"}}, "calls", "bytes"}}`` for each group of the mesh: pp, dp (dp·cp ranks),
    tp, and cp, ep, edp, moe where the run has them (bytes one rank sends with ring algorithms), and
    ``match`` is ``{dim: bool}``."""
    step: int
    ranks: list[dict[str, Any]]


MESH_CONFIG = EventKind("mesh_config", MeshConfig)
STEP = EventKind("step", Step)
MESH_STEP = EventKind("mesh_step", MeshStep)
MESH_COMM = EventKind("mesh_comm", MeshComm)

EVENTS = (MESH_CONFIG, STEP, MESH_STEP, MESH_COMM, PP_OP)
