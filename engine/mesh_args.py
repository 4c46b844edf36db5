"""The capstone run's plan from its arguments, without torch: ``distai run capstone`` checks it
before launching anything, and the experiment builds exactly this plan on every rank.

A run needs ``pp·dp·cp·tp`` = the number of ranks, an expert-parallel degree that divides
``dp·cp`` (EP borrows its ranks from the data- and context-parallel ones, as in torchtitan's
``ParallelDims`` and Megatron-Core; ``--ep`` > 1 needs ``--moe``), degrees the model's shape allows
(the course's one shape check, :func:`distai.lessons.model_size.refusals`: TP over the heads, the
hidden and feed-forward widths, the vocabulary and, with sequence parallelism, the sequence shard
of each CP rank; CP's zigzag chunks; ``pp·v`` stages that split the layers evenly; experts that
split over EP), and a microbatch count the schedule accepts (lesson 5's simulator says which).
Anything else is refused with one line that says what to change.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from ..lessons.arg_errors import argparse_texts, unknown_option_texts
from ..lessons.arg_help import ExperimentParser, by_machine
from ..lessons.capstone.mesh_run import AXES, Layout
from ..lessons.experts.formulas import RUN_CAPACITY_FACTOR, RUN_EXPERTS, RUN_TOP_K
from ..lessons.lesson5 import simulator as sim
from ..lessons.model_size import ModelSize, add_model_options, check_degrees
from ..lessons.strings import TranslatedError, translated
from .host import host_memory_bytes

#: the device mesh's dimensions, outermost first (TP innermost: one node; CP next to it)
MESH_DIMS = AXES
#: the GPT the 3D run trains: GPT-2's shape, untied (the pipeline's ends are on different ranks)
MODEL_CPU = ModelSize(vocab=64, hidden=32, heads=4, seq=16, tie_embeddings=False)
MODEL_GPU = ModelSize(vocab=1024, hidden=512, heads=8, seq=256, tie_embeddings=False)
MICROBATCH_CPU, MICROBATCH_GPU = 2, 4  # sequences per microbatch by default
MIN_DEFAULT_LAYERS = 4  # the GPT has at least these blocks when --layers is not given (a multiple of pp·v)


class MeshConfigError(TranslatedError):
    """A mesh that cannot run this model, or options a run cannot take: the message says what to
    change, in every language (``lessons/catalog/run_checks.toml``; ``text(lang)``)."""

    area = "run_checks"


#: the degrees of a run: the lesson's one definition of a capstone mesh (degrees, world, groups)
MeshShape = Layout


def mesh_shape(pp: int, dp: int, tp: int, cp: int = 1, ep: int = 1, moe: bool = False) -> MeshShape:
    """The run's :class:`~distai.lessons.capstone.mesh_run.Layout`, or MeshConfigError (one line, in the
    flags' words) when a degree is not a positive integer or ``ep`` does not divide ``dp·cp``."""
    for name, value in zip(MESH_DIMS + ("ep",), (pp, dp, cp, tp, ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MeshConfigError.keyed("positive", name=name, value=repr(value))
    if (dp * cp) % ep:
        raise MeshConfigError.keyed("ep_divides", ep=ep, dp=dp, cp=cp, replicas=dp * cp)
    return Layout(pp, dp, tp, cp, ep, moe)


class _Parser(ExperimentParser):
    def error(self, message: str):  # one line, no usage dump: the CLI and the ranks report it
        options = [o for action in self._actions for o in action.option_strings]
        raise MeshConfigError(message, texts=unknown_option_texts(message, options, "capstone")
                              or argparse_texts(message))


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(allow_abbrev=False, prog="distai run capstone")
    ap.add_argument("--dp", type=int, default=None)
    ap.add_argument("--tp", type=int, default=None)
    ap.add_argument("--pp", type=int, default=None)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--experts", type=int, default=RUN_EXPERTS)
    ap.add_argument("--top-k", type=int, default=RUN_TOP_K)
    ap.add_argument("--zero", type=int, default=0, choices=(0, 1))
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--chunks", "-v", type=int, default=2)
    ap.add_argument("--microbatches", "-m", type=int, default=None)
    ap.add_argument("--microbatch-size", type=int, default=None)
    add_model_options(ap, None)  # default: MODEL_CPU or MODEL_GPU, with layers a multiple of pp·v (>= 4)
    ap.add_argument("--dtype", choices=("float32", "float64"), default=None)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.help_fields = {**by_machine(MODEL_CPU, MODEL_GPU, ("hidden", "heads", "vocab", "seq")),
                      "layers": {"least": MIN_DEFAULT_LAYERS},
                      "microbatch_size": {"cpu": MICROBATCH_CPU, "gpu": MICROBATCH_GPU},
                      "schedule": {"choices": ", ".join(sim.SCHEDULES)}}
    return ap


def choose_shape(tp: int | None, pp: int | None, dp: int | None, world: int, cp: int = 1, ep: int = 1,
                 moe: bool = False) -> MeshShape:
    """The degrees given; the missing ones filled so that pp·dp·cp·tp = world (tp 2 first, then pp
    2, dp the rest). Checked by :func:`check_plan`, not here."""
    rest = world
    for given in (cp, tp, pp, dp):
        if given is not None and given >= 1 and rest % given == 0:
            rest //= given
    if tp is None:
        tp = 2 if rest % 2 == 0 and rest > 1 else 1
        rest //= tp
    if pp is None:
        pp = 2 if rest % 2 == 0 and rest > 1 else 1
        rest //= pp
    if dp is None:
        dp = max(1, rest)
    return mesh_shape(pp, dp, tp, cp, ep, moe)


def check_plan(shape: MeshShape, world: int, model: ModelSize, *, microbatches: int, schedule: str,
               chunks: int = 1, experts: int | None = None) -> str:
    """Raise MeshConfigError unless the mesh runs this model on ``world`` ranks, or ShapeError (the
    course's one shape check: tensor parallelism with sequence parallelism over each CP rank's
    zigzag shard, pp·v equal stages, ``experts`` over EP) unless its shape allows the degrees;
    returns the schedule's canonical name (``chunks`` = v, for the interleaved schedule)."""
    if shape.world != world:
        names, values = ("dp·tp·pp", f"{shape.dp}·{shape.tp}·{shape.pp}") if shape.cp == 1 else \
            ("dp·tp·pp·cp", f"{shape.dp}·{shape.tp}·{shape.pp}·{shape.cp}")
        raise MeshConfigError.keyed("world", names=names, values=values, world=shape.world, ranks=world)
    if shape.ep > 1 and not shape.moe:
        raise MeshConfigError.keyed("ep_needs_moe", ep=shape.ep)
    model.check_degrees(tp=shape.tp, sequence_parallel=True, pp=shape.pp, chunks=chunks, stages="even",
                        cp=shape.cp, zigzag=True, ep=shape.ep, **({"experts": experts} if shape.moe else {}))
    try:
        return sim.validate(schedule, shape.pp, microbatches, chunks)
    except sim.ScheduleError as exc:
        raise MeshConfigError(str(exc), texts=exc.texts) from None


@dataclass(frozen=True)
class RunPlan:
    shape: MeshShape
    schedule: str
    chunks: int  # v (1 unless interleaved)
    microbatches: int
    microbatch_size: int
    model: ModelSize
    dtype: str
    args: argparse.Namespace


def plan_run(argv: list[str] | None, world: int, cuda: bool) -> RunPlan:
    """Parse the experiment's arguments and check the whole plan (MeshConfigError if it cannot run)."""
    args = build_parser().parse_args(argv)
    shape = choose_shape(args.tp, args.pp, args.dp, world, args.cp, args.ep, args.moe)
    try:
        schedule = sim.normalize_schedule(args.schedule)
    except sim.ScheduleError as exc:
        raise MeshConfigError(str(exc), texts=exc.texts) from None
    v = args.chunks if schedule == "interleaved" else 1
    if schedule == "interleaved" and v < 2:
        raise MeshConfigError.keyed("chunks", v=v)
    if args.steps < 1:
        raise MeshConfigError.keyed("steps", steps=args.steps)
    stages = shape.pp * v
    layers = args.layers if args.layers is not None else stages * max(1, -(-MIN_DEFAULT_LAYERS // stages))
    model = ModelSize.from_args(args, MODEL_GPU if cuda else MODEL_CPU, layers=layers)
    m = args.microbatches if args.microbatches is not None else 2 * shape.pp
    b = args.microbatch_size if args.microbatch_size is not None else (MICROBATCH_GPU if cuda else MICROBATCH_CPU)
    if b < 1:
        raise MeshConfigError.keyed("microbatch_size", value=b)
    if args.moe and not 1 <= args.top_k <= args.experts:
        raise MeshConfigError.keyed("top_k", top_k=args.top_k, experts=args.experts)
    if args.moe and args.zero:
        raise MeshConfigError.keyed("zero_moe")
    schedule = check_plan(shape, world, model, microbatches=m, schedule=schedule, chunks=v, experts=args.experts)
    plan = RunPlan(shape, schedule, v, m, b, model, args.dtype or ("float32" if cuda else "float64"), args)
    if not cuda:
        check_host_memory(plan, world)
    return plan


def check_host_memory(plan: RunPlan, world: int, have: int | None = None) -> None:
    """MeshConfigError when the run's CPU ranks could not hold what every one of them builds: the whole
    model (it splits its own copy into its shard), kept with its gradients and SGD's momentum by the
    check against one process. A lower bound (the shards, activations and experts come on top), so a
    shape that cannot fit is refused at once, not after the kernel kills the ranks minutes later."""
    have = host_memory_bytes() if have is None else have
    copies = 3 if plan.args.check else 1  # weights (+ gradients and momentum for the reference)
    per_rank = plan.model.num_params() * (8 if plan.dtype == "float64" else 4) * copies
    if have and world * per_rank > have:
        from ..lessons.units import format_bytes, format_count

        kept = "host_memory_check" if plan.args.check else "host_memory_no_check"
        raise MeshConfigError.keyed(
            "host_memory", ranks=world, dtype=plan.dtype,
            params=lambda lang: format_count(plan.model.num_params(), lang=lang),
            check=lambda lang: translated("run_checks", kept, lang, per_rank=format_bytes(per_rank, lang=lang)),
            need=lambda lang: format_bytes(world * per_rank, lang=lang), have=lambda lang: format_bytes(have, lang=lang))


def launch_ranks(argv: list[str], ranks: int | None, default: int, cuda: bool) -> int:
    """For ``distai run capstone``: how many ranks to launch (``ranks`` when --cpu/--gpus gave
    it, else dp·tp·pp·cp when dp, tp and pp are given, else ``default``), after checking the plan."""
    if ranks is None:
        args = build_parser().parse_known_args(argv)[0]
        degrees = (args.dp, args.tp, args.pp, args.cp)
        given = all(d is not None and d >= 1 for d in degrees)
        ranks = degrees[0] * degrees[1] * degrees[2] * degrees[3] if given else default
    plan_run(argv, ranks, cuda)
    return ranks


# ------------------------------------------------------------- lesson 7's (pp, tp) decode mesh
#: the GPT lesson 7 serves, in Llama's shape, and the size flags its run takes (defaulting to it)
DECODE_MODEL = ModelSize.preset("llama-tiny", kv_heads=4)
DECODE_SIZE_FLAGS = ("hidden", "layers", "heads", "kv_heads", "vocab", "norm")


def check_decode(cfg: ModelSize, tp: int = 1, pp: int = 1) -> None:
    """Raise ShapeError (a ModelConfigError) unless the course's one shape check allows decoding on
    ``tp`` × ``pp`` ranks: heads, MLP and KV heads (split or replicated) over tp, at most one stage
    per layer. The embedding and the output projection are replicated: the vocabulary is not split."""
    cfg.check_degrees(tp=tp, pp=pp, split_vocab=False)


def check_decode_parts(cfg: ModelSize, args, W: int, skip: set[str]) -> tuple[tuple[int, int] | None, set[str]]:
    """The (tp, pp) mesh of a lesson-7 run on ``W`` ranks (None without --tp/--pp) and the parts it
    skips, after checking each decode it runs against the shape: the combined (pp, tp) decode, which
    replaces the separate TP and PP parts, or TP over W and PP over W. ValueError if one cannot run."""
    mesh = mesh_degrees(args, W)
    if mesh is not None:
        check_decode(cfg, tp=mesh[0], pp=mesh[1])
        skip = skip | {"tp", "pp"}
    if "tp" not in skip:
        check_decode(cfg, tp=W)
    if "pp" not in skip:
        check_decode(cfg, pp=W)
    return mesh, skip


def mesh_degrees(args, W: int) -> tuple[int, int] | None:
    """(tp, pp) of a combined decode from ``--tp``/``--pp`` (the missing one is W / the other), or
    None when neither is given. Raises MeshConfigError (a ValueError) when they do not multiply to the W ranks."""
    if args.tp is None and args.pp is None:
        return None
    for name, v in (("--tp", args.tp), ("--pp", args.pp)):
        if v is not None and v < 1:
            raise MeshConfigError.keyed("decode_at_least_1", flag=name, value=v)
    tp = args.tp if args.tp is not None else max(1, W // args.pp)
    pp = args.pp if args.pp is not None else max(1, W // args.tp)
    if tp * pp != W:
        raise MeshConfigError.keyed("decode_world", tp=tp, pp=pp, ranks=tp * pp, world=W)
    return tp, pp


def decode_launch_ranks(argv: list[str], ranks: int | None, default: int, cuda: bool) -> int:
    """For ``distai run lesson7 --tp T --pp P``: T·P ranks when --cpu/--gpus did not say how many,
    after checking that the degrees fit the ranks and the model's shape (the experiment checks the
    same on every rank: :func:`check_decode_parts`)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--tp", default=None)
    ap.add_argument("--pp", default=None)
    raw = ap.parse_known_args(argv)[0]
    degrees = {}
    for name in ("tp", "pp"):
        value = getattr(raw, name)
        try:
            degrees[name] = None if value is None else int(value)
        except ValueError:
            raise MeshConfigError.keyed("whole_number", name=name, value=repr(value)) from None
    args = argparse.Namespace(**degrees)
    if ranks is None and args.tp is not None and args.pp is not None:
        ranks = args.tp * args.pp
    ranks = default if ranks is None else ranks
    sizes = _Parser(add_help=False, allow_abbrev=False)
    add_model_options(sizes, DECODE_MODEL, DECODE_SIZE_FLAGS)
    sizes.add_argument("--skip", default="")
    given = sizes.parse_known_args(argv)[0]
    skip = {s.strip() for s in given.skip.split(",") if s.strip()}
    check_decode_parts(ModelSize.from_args(given, DECODE_MODEL), args, ranks, skip)
    return ranks


def experts_launch_ranks(argv: list[str], ranks: int | None, default: int, cuda: bool) -> int:
    """For ``distai run experts``: what every rank would refuse, refused before anything is launched
    (one line, exit 2): an EP degree that does not divide the ranks or the experts (the one shape
    check), top-k outside 1..experts, a capacity factor that is not positive."""
    ap = _Parser(add_help=False, allow_abbrev=False)
    ap.add_argument("--ep", type=int, default=None)
    ap.add_argument("--experts", type=int, default=RUN_EXPERTS)
    ap.add_argument("--top-k", type=int, default=RUN_TOP_K)
    ap.add_argument("--capacity-factor", type=float, default=RUN_CAPACITY_FACTOR)
    ap.add_argument("--aux-alpha", type=float, default=0.0)
    ap.add_argument("--bias-balance", type=float, default=0.0)
    args = ap.parse_known_args(argv)[0]
    ranks = default if ranks is None else ranks
    ep = ranks if args.ep is None else args.ep
    if ep < 1 or ranks % ep:
        raise MeshConfigError.keyed("ep_ranks", ep=ep, ranks=ranks)
    if args.experts < 1:  # said of --experts, not of the --top-k it leaves no room for
        raise MeshConfigError.keyed("experts_count", value=args.experts)
    if not 1 <= args.top_k <= args.experts:
        raise MeshConfigError.keyed("top_k", top_k=args.top_k, experts=args.experts)
    if not (args.capacity_factor > 0 and math.isfinite(args.capacity_factor)):
        raise MeshConfigError.keyed("capacity_factor", value=args.capacity_factor)
    for flag, value in (("--aux-alpha", args.aux_alpha), ("--bias-balance", args.bias_balance)):
        if not 0 <= value < math.inf:  # negative: it would push the load apart (MoEConfig refuses it too)
            raise MeshConfigError.keyed("not_negative", flag=flag, value=value)
    check_degrees(ep=ep, experts=args.experts)
    return ranks
