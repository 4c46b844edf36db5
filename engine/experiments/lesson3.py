"""Lesson 3 experiment: kill a rank mid-training, restart, resume from a checkpoint — exactly.

Run by torchrun (``distai run lesson3 --cpu 2`` or ``python -m torch.distributed.run
--nproc-per-node 2 --max-restarts 3 -m distai.engine.experiments.lesson3``).

A small GPT (:mod:`distai.engine.model`, with dropout) learns next-token prediction on a fixed
set of token sequences (``make_batch``), data parallel: every rank takes its own batch from a
:class:`~distai.engine.checkpoint.ResumableSampler`, corrupts its input tokens (the share comes
from Python's ``random``, which tokens and what they become from numpy), drops activations with
masks seeded from torch's generator (:class:`~distai.engine.model.DropoutMasks`), and the ranks
average gradients (and the loss) with one ``all_reduce`` of a flat buffer in a fixed layout. Adam with a warm-up + cosine learning-rate schedule (and, with ``--amp
fp16``, a ``GradScaler``). Every ``--ckpt-every`` steps it writes a checkpoint with
:class:`~distai.engine.checkpoint.Checkpointer` (``--format file`` or ``dcp``) into the run
folder's ``checkpoints/``.

Fault injection: ``--kill-rank R --at-step S`` sends SIGKILL to rank R in the middle of step S
(after its backward, before the gradient all-reduce), in the first attempt only (default: rank 1
at step steps/2 + 3 — 23 of 40 — when no other fault is chosen; ``--no-fault`` for none). ``--fail-every SECONDS``
kills a random rank at random times (exponential, mean SECONDS; at most ``--max-failures``).
The surviving ranks' all-reduce fails; torchrun's elastic agent (``--max-restarts``) or the
engine's supervisor starts the group again, and every start begins by resuming from the newest
good checkpoint. ``--ckpt-mode async`` writes the checkpoints with
``torch.distributed.checkpoint.async_save`` (the step goes on while they are written);
``--kill-in-flight`` kills the rank while one is being written. At the end, the ranks train again from scratch without faults or checkpoints
(same seed) and compare: every loss of the resumed run must equal (``==``) the uninterrupted
one, and the final weights must be bit-identical. ``--forget PART`` leaves a piece of state out of
the resume (``rng``, ``rng.numpy``, ``sampler``, ``optimizer``, ``scheduler``, …) to see the
comparison fail.

Events (rank 0 unless noted): ``phase`` (``start``, ``train``, ``compare``), ``restart``, ``step``
and ``progress``, ``checkpoint``, ``ckpt_cost``, ``failure`` (from the rank about to die),
``redone``, ``compare`` and the ``summary``, their fields declared in ``lessons/lesson3/events.py``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ...lessons.arg_help import ExperimentParser
from ...lessons.events import CHECK, PROGRESS, SPAN
from ...lessons.lesson3 import checks as lesson_checks
from ...lessons.lesson3.events import CHECKPOINT, CKPT_COST, COMPARE, FAILURE, PHASE, REDONE, RESTART, STEP
from ...lessons.model_size import ModelSize, add_model_options
from ...lessons.strings import os_error_text
from ...lessons.units import format_bytes, format_fixed, format_plain, format_range
from ..checkpoint import (
    Checkpointer,
    CheckpointFolder,
    ResumableSampler,
    TrainingState,
    read_checked,
    write_checked,
)
from ..events import EVENTS_DIR_ENV, read_events
from ..experiment import (
    UsageError,
    exit_with,
    folder_refusal,
    launch_world_size,
    max_over_ranks,
    run_experiment,
    run_language,
    slowest_rank_parts,
    summary_lines,
)
from ..model import GPT, DropoutMasks, ModelConfigError, lm_loss, make_batch
from ..trace_export import step_span_name

#: the GPT the run trains (its size flags default to this), with dropout: resuming must redraw the masks
DEFAULT_MODEL = ModelSize(vocab=64, hidden=64, heads=4, layers=2, seq=16, dropout=0.1)
FORGETTABLE = ("rng", "rng.torch", "rng.numpy", "rng.python", "sampler", "optimizer", "scheduler", "scaler")


def build_parser() -> ExperimentParser:
    p = ExperimentParser(allow_abbrev=False, prog="distai run lesson3")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--step-time", type=float, default=None)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--format", choices=("file", "dcp"), default="file")
    p.add_argument("--ckpt-mode", choices=("sync", "async"), default="sync")
    p.add_argument("--no-ckpt-cost", action="store_true")
    p.add_argument("--kill-in-flight", action="store_true")
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--at-step", type=int, default=None)
    p.add_argument("--fail-every", type=float, default=0.0)
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--no-fault", action="store_true")
    p.add_argument("--forget", choices=FORGETTABLE, action="append", default=[])
    p.add_argument("--no-compare", action="store_true")
    p.add_argument("--plain-init", action="store_true")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--amp", choices=("off", "fp16", "bf16"), default="off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=1024)
    add_model_options(p, DEFAULT_MODEL, ("hidden", "heads", "layers", "vocab", "seq", "dropout"))
    p.add_argument("--features", type=int, default=None, help=argparse.SUPPRESS)  # the MLP's; refused below
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--noise", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup", type=int, default=5)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 200 if args.fail_every else 40
    if args.step_time is None:
        args.step_time = 0.1 if args.fail_every else 0.0
    if args.step_time < 0:
        p.error("--step-time must be >= 0 seconds")
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.features is not None:
        p.error("--features is gone: lesson 3 trains a GPT now; size it with --vocab, --seq, --hidden, --layers")
    if args.samples < 1 or args.batch < 1 or not 0.0 <= args.noise <= 1.0:
        p.error("--samples and --batch must be at least 1, --noise between 0 and 1")
    try:
        args.model = ModelSize.from_args(args, DEFAULT_MODEL)
    except ModelConfigError as exc:
        p.error(str(exc))
    if args.at_step is None:
        args.at_step = min(args.steps, args.steps // 2 + 3)
    if args.ckpt_every < 1:
        p.error("--ckpt-every must be at least 1")
    if args.fail_every < 0:
        p.error("--fail-every must be >= 0 seconds")
    if args.ckpt_mode == "async":
        args.format = "dcp"  # async_save is torch.distributed.checkpoint's
    if args.kill_in_flight and (args.ckpt_mode != "async" or args.at_step % args.ckpt_every):
        p.error("--kill-in-flight needs --ckpt-mode async and an --at-step that is a multiple of --ckpt-every")
    return args


# ------------------------------------------------------------------------------------ model and data
def make_data(args) -> tuple[torch.Tensor, torch.Tensor]:
    """The data set: ``--samples`` token sequences and their next-token targets ``[samples, seq]``."""
    return make_batch(args.model, args.samples, seed=10_000 + args.seed)


def seed_rank(seed: int, rank: int) -> None:
    """Each rank's own generators: its dropout masks and corrupted tokens differ from the others'."""
    s = seed * 1_000_003 + 7919 * (rank + 1)
    torch.manual_seed(s)
    np.random.seed(s % 2**32)
    random.seed(s)


def warmup_cosine(optimizer, warmup: int, total: int):
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    warmup = max(1, min(warmup, total - 1)) if total > 1 else 1
    return SequentialLR(optimizer, [LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
                                    CosineAnnealingLR(optimizer, T_max=max(1, total - warmup))],
                        milestones=[warmup])


def build(args, rank: int, world_size: int, device: torch.device) -> TrainingState:
    """A fresh model, optimizer, schedule, scaler and sampler, and seeded generators."""
    model = GPT(args.model, seed=args.seed, device=device)  # the same initial weights on every rank
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = warmup_cosine(optimizer, args.warmup, args.steps)
    scaler = torch.amp.GradScaler(device.type, growth_interval=5) if args.amp == "fp16" else None
    sampler = ResumableSampler(args.samples, world_size, rank, seed=args.seed)
    seed_rank(args.seed, rank)
    return TrainingState(model, optimizer, scheduler, scaler, sampler, step=0, extra={"losses": []})


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class Trainer:
    """One step at a time; ``hook(step, phase)`` runs mid-step (fault injection).

    Each step draws from all three generators a rank owns, as real input pipelines do: Python's
    ``random`` the share of input tokens to corrupt, numpy which tokens and what they become,
    torch the seed of the step's dropout masks (:class:`DropoutMasks` turns (seed, step, layer,
    site) into masks, so the masks are exactly what torch's generator says, on any device)."""

    def __init__(self, args, state: TrainingState, data, rank: int, world_size: int, device: torch.device):
        self.args, self.state, self.rank, self.world_size, self.device = args, state, rank, world_size, device
        self.ids, self.targets = (t.to(device) for t in data)
        self.params = [p for p in state.model.parameters()]
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(args.amp)
        self.masks = DropoutMasks(args.model.dropout)
        state.model.set_masks(self.masks)

    def step(self, mid_step=None) -> float:
        """One data-parallel step; returns the loss averaged over all ranks."""
        st, args = self.state, self.args
        assert st.sampler is not None  # build() gives every training state its sampler
        idx = torch.tensor(st.sampler.next_batch(args.batch), device=self.device)
        ids, targets = self.ids[idx], self.targets[idx]
        share = random.uniform(0.0, args.noise)  # Python's generator
        corrupt = np.random.random_sample(tuple(ids.shape)) < share  # numpy's
        tokens = np.random.randint(0, args.model.vocab, size=tuple(ids.shape))
        ids = torch.where(torch.from_numpy(corrupt).to(self.device), torch.from_numpy(tokens).to(ids), ids)
        self.masks.seed = int(torch.randint(0, 2 ** 31 - 1, ()))  # torch's generator
        self.masks.step = st.step
        st.model.train()
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            logits = st.model(ids)
        loss = lm_loss(logits.float(), targets)
        (st.scaler.scale(loss) if st.scaler is not None else loss).backward()
        if mid_step is not None:
            mid_step()
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [loss.detach().reshape(1)])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p))
            offset += n
        if st.scaler is not None:
            st.scaler.step(st.optimizer)
            st.scaler.update()
        else:
            st.optimizer.step()
        st.scheduler.step()
        st.optimizer.zero_grad(set_to_none=True)
        st.step += 1
        return float(flat[-1].item())


# ------------------------------------------------------------------------------------ faults

def _log(key: str, /, **fields) -> str:
    """One of the lines the run prints as it goes (``summary.toml`` ``[<lang>.lesson3.log]``), in the run's language."""
    return summary_lines("lesson3", run_language())(f"log.{key}", **fields)


def _ms(seconds: float) -> str:
    return format_fixed(seconds * 1e3, 1, run_language()) + " ms"


def _kib(size: float) -> str:
    return format_bytes(size, binary=True, lang=run_language())

class Faults:
    """The injected failures of this attempt."""

    def __init__(self, args, rank: int, world_size: int, attempt: int, events, progress):
        self.args, self.rank, self.attempt, self.events, self.progress = args, rank, attempt, events, progress
        self.kill_rank = None
        self.kill_step = None
        if not args.no_fault and (args.kill_rank is not None or not args.fail_every):
            self.kill_rank = args.kill_rank if args.kill_rank is not None else (1 if world_size > 1 else 0)
            self.kill_step = args.at_step
        self.random_at: float | None = None
        self.random_rank: int | None = None
        if not args.no_fault and args.fail_every > 0 and attempt < args.max_failures:
            r = random.Random(args.seed * 7919 + attempt)  # its own generator: training's are untouched
            self.random_at = r.expovariate(1.0 / args.fail_every)
            self.random_rank = r.randrange(world_size)

    def describe(self) -> str:
        parts = []
        if self.kill_rank is not None:
            parts.append(_log("fault_kill", rank=self.kill_rank, step=self.kill_step))
        if self.args.fail_every > 0 and not self.args.no_fault:
            parts.append(_log("fault_random", every=format_plain(self.args.fail_every, run_language()),
                              most=self.args.max_failures))
        return "; ".join(parts) or _log("fault_none")

    def die(self, step: int, cause: str, phase: str = "step") -> None:
        FAILURE.emit(self.events, {"rank": self.rank, "step": step, "phase": phase, "cause": cause,
                                   "attempt": self.attempt})
        where = _log("during_step", step=step) if phase == "step" else _log("during_phase", phase=phase, prev=step - 1)
        print(_log("died", rank=self.rank, cause=cause, where=where), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def mid_step(self, step: int):
        """The hook for step ``step`` (from 1), or None."""
        if self.attempt == 0 and self.rank == self.kill_rank and step == self.kill_step \
                and not self.args.kill_in_flight:
            return lambda: self.die(step, "--kill-rank")
        return None

    def in_flight(self, step: int) -> None:
        """Called once this rank's asynchronous checkpoint of ``step`` is written, not yet published."""
        if self.attempt == 0 and self.rank == self.kill_rank and step == self.kill_step and self.args.kill_in_flight:
            self.die(step + 1, "--kill-in-flight", "asynchronous checkpoint")

    def arm_timer(self) -> None:
        delay = self.random_at
        if delay is None or self.rank != self.random_rank:
            return

        def fire():
            time.sleep(delay)
            step, phase = self.progress()
            self.die(step, "--fail-every", phase)

        threading.Thread(target=fire, daemon=True, name="distai-fail-every").start()


# ------------------------------------------------------------------------------------ the run
def _attempt_number(root: Path, rank: int, device) -> int:
    """How many times this run has started before (rank 0 counts in the checkpoint folder)."""
    n = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        # before this attempt writes anything: a killed attempt's half-written checkpoint may be what filled
        # the disk, and every relaunch would die here on it (Checkpointer.find cleans too, later)
        CheckpointFolder(root).clean_stale()
        path = root / "attempts"
        try:
            count = int(json.loads(read_checked(path))["attempts"])
        except Exception:  # noqa: BLE001 - missing or unreadable: a first start
            count = 0
        write_checked(path, json.dumps({"attempts": count + 1}).encode())
        n[0] = count
    dist.broadcast(n, src=0)
    return int(n[0])


def _history(events_dir: Path | None, before_attempt: int) -> dict:
    """What earlier attempts recorded: the last failure, and the losses they computed per step."""
    out: dict[str, Any] = {"failure": None, "losses": {}, "last_step": 0, "failures": 0, "checkpoints": [],
                           "restarts": [], "starts": 0}
    if events_dir is None or not events_dir.is_dir():
        return out
    for path in sorted(events_dir.glob("rank*.jsonl")):
        for e in read_events(path):
            if e.get("attempt", 0) >= before_attempt:
                continue
            if FAILURE.matches(e):
                out["failures"] += 1
                if out["failure"] is None or e.get("t", 0) > out["failure"].get("t", 0):
                    out["failure"] = e
            elif STEP.matches(e):
                out["losses"][int(e["step"]) + 1] = e["loss"]
                out["last_step"] = max(out["last_step"], int(e["step"]) + 1)
            elif CHECKPOINT.matches(e):
                out["checkpoints"].append(e)
            elif RESTART.matches(e):
                out["restarts"].append(e)
            elif PHASE.matches(e) and e.get("name") == "start":
                out["starts"] += 1  # an earlier attempt of this run began (in this run's folder)
    return out


def started_on_another_runs_checkpoints(attempt: int, restart_count: int, history: dict) -> bool:
    """Whether this attempt's earlier ones (the checkpoint folder counts them) were another run's: none of
    them started in this run's folder (``history["starts"]``, :func:`_history`), and torchrun did not
    restart it in place. A new `distai run --ckpt-dir` on a stopped run's checkpoints, not a relaunch."""
    return attempt > 0 and not restart_count and not history.get("starts")


def steps_done(history: dict) -> int:
    """The last step earlier attempts completed: the last rank 0 reported, or the one before the step the
    failed rank died in (it finished that one with every peer: the gradients were reduced). Rank 0 reports
    a step after its update, so a peer's death just after can stop rank 0 first (CI once read 1 lost step
    for 2)."""
    fail = history.get("failure") or {}
    return max(history["last_step"], int(fail["step"]) - 1 if fail.get("step") else 0)


def _check_args(args, world: int) -> None:
    if args.ckpt_dir and (refused := folder_refusal(args.ckpt_dir)) is not None:
        raise UsageError.keyed("ckpt_dir_unwritable", path=args.ckpt_dir, why=lambda lang: os_error_text(refused, lang))
    if args.kill_rank is not None and not 0 <= args.kill_rank < world:
        raise UsageError.keyed("kill_rank", rank=args.kill_rank, last=world - 1)
    if not args.no_fault and (args.kill_rank is not None or not args.fail_every) \
            and not 1 <= args.at_step <= args.steps:
        raise UsageError.keyed("at_step", steps=args.steps)


def _checkpoint_root(args, events_dir: Path | None) -> Path:
    if args.ckpt_dir:
        return Path(args.ckpt_dir)
    if events_dir is not None:
        return events_dir.parent / "checkpoints"
    raise UsageError.keyed("ckpt_dir")


def run(ctx, args) -> tuple[dict | None, int]:
    rank, world = ctx.rank, ctx.world_size  # the options were checked before joining (main's check)
    if ctx.is_cuda:
        torch.use_deterministic_algorithms(True)
    events_dir = Path(os.environ[EVENTS_DIR_ENV]) if os.environ.get(EVENTS_DIR_ENV) else None
    root = _checkpoint_root(args, events_dir)
    attempt = _attempt_number(root, rank, ctx.device)
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    PHASE.emit(ctx.events, {"name": "start", "backend": ctx.backend, "n": world, "attempt": attempt,
                            "restart_count": restart_count})
    this = Attempt(ctx, args, root, attempt)
    if attempt == 0:
        this.announce()
    history = _history(events_dir, attempt) if rank == 0 else {}
    redo_until = this.resume(history, restart_count)
    losses = this.train(history, redo_until)
    result = {"lesson": "lesson3", "world_size": world, "steps": args.steps, "ckpt_every": args.ckpt_every,
              "form": args.format, "attempts": attempt + 1, "final_loss": losses[-1] if losses else None,
              "run_sha256": weights_digest(this.state.model), "forgot": list(args.forget), "losses": losses}
    this.where["phase"] = "compare"
    if not args.no_compare:
        result.update(compare=this.compare(losses, result["run_sha256"]))
    if not args.no_ckpt_cost:
        result.update(ckpt_cost=this.checkpoint_cost())
    if rank == 0:
        result.update(_run_history(events_dir, attempt, root))
        result["checks"] = emit_checks(ctx.events, events_dir, args, result.get("ckpt_cost"))
        print(summary_from_event(result), flush=True)
    # a resumed run that differs from the uninterrupted one is the lesson's failure, not a crash
    status = 3 if not args.no_compare and not result["compare"]["identical"] and not args.forget else 0
    return (result if rank == 0 else None), status


def _run_history(events_dir: Path | None, attempt: int, root: Path) -> dict:
    """The summary's account of every attempt so far (rank 0)."""
    hist = _history(events_dir, attempt + 1)
    cks, restarts = hist["checkpoints"], hist["restarts"]
    return {"failures": hist["failures"], "restarts": len(restarts),
            "redone_steps": sum(r.get("lost_steps", 0) for r in restarts), "checkpoints": len(cks),
            "checkpoint_bytes": cks[-1]["bytes"] if cks else 0,
            "checkpoint_seconds_mean": (sum(c["seconds"] for c in cks) / len(cks)) if cks else 0.0,
            "checkpoint_dir": str(root)}


def emit_checks(sink, events_dir: Path | None, args, cost: dict | None) -> list[dict]:
    """The lesson's predictions against this run (rank 0, at the end; issue 28): the interval's
    waste under the failures against Young's model, from every rank's and attempt's events, and
    a synchronous checkpoint's cost against its write time (``lessons/lesson3/checks.py``)."""
    events: list[dict] = []
    if events_dir is not None and events_dir.is_dir():
        for path in sorted(events_dir.glob("rank*.jsonl")):
            events.extend(read_events(path))
    found = [lesson_checks.interval_waste(events, args.steps, args.ckpt_every),
             lesson_checks.checkpoint_cost(cost) if cost else None]
    out = [c.event() for c in found if c is not None]
    for fields in out:
        CHECK.emit_fields(sink, fields)
    return out


class Attempt:
    """One start of the run on this rank: resume from the newest good checkpoint, train to the
    end with checkpoints, then compare with a run without faults and measure what checkpoints cost."""

    def __init__(self, ctx, args, root: Path, attempt: int):
        self.ctx, self.args, self.root, self.attempt = ctx, args, root, attempt
        self.rank, self.world, self.events = ctx.rank, ctx.world_size, ctx.events
        self.state = build(args, self.rank, self.world, ctx.device)
        self.trainer = Trainer(args, self.state, make_data(args), self.rank, self.world, ctx.device)
        self.ckpt = Checkpointer(root, self.rank, self.world, form=args.format, keep=args.keep)
        # what this rank is doing, for a failure at a random moment: the step in progress is the one
        # after the last step reported
        self.where: dict[str, Any] = {"phase": "step", "reported": 0}
        self.faults = Faults(args, self.rank, self.world, attempt, self.events,
                             lambda: (self.where["reported"] + 1, self.where["phase"]))
        self.say = print if self.rank == 0 else (lambda *a, **k: None)
        self.resumed: Any = None

    def announce(self) -> None:
        args = self.args
        self.say(_log("announce", world=self.world, backend=self.ctx.backend, steps=args.steps, every=args.ckpt_every,
                      form=args.format, root=self.root), flush=True)
        self.say(_log("fault", what=self.faults.describe()), flush=True)
        if args.step_time:
            self.say(_log("paced", seconds=format_plain(args.step_time, run_language())), flush=True)

    def resume(self, history: dict, restart_count: int) -> int:
        """Load the newest good checkpoint; rank 0 reports the restart. Returns the last step
        whose work the failure threw away (0: none), which the training redoes."""
        args = self.args
        resumed = self.resumed = self.ckpt.resume(self.state, skip=args.forget)
        if not (self.rank == 0 and (self.attempt > 0 or resumed.step is not None)):
            return 0
        fail = history.get("failure") or {}
        new_run = started_on_another_runs_checkpoints(self.attempt, restart_count, history)
        from_step = resumed.step or 0
        last_done = steps_done(history)
        lost = max(0, last_done - from_step)  # completed steps whose work was thrown away
        RESTART.emit(self.events, {
            "attempt": self.attempt, "from_step": from_step,
            "checkpoint": Path(resumed.path).name if resumed.path else None,
            "skipped": [list(s) for s in resumed.skipped], "failed_rank": fail.get("rank"),
            "failed_step": fail.get("step"), "failed_phase": fail.get("phase"), "last_done": last_done,
            "lost_steps": lost, "restart_count": restart_count, "load_s": resumed.seconds,
            "forgot": list(args.forget), "new_run": new_run})
        how = _log("how_in_place" if restart_count else "how_new_run" if new_run else "how_relaunched")
        for name, why in resumed.skipped:
            self.say(_log("skipped", name=name, why=why), flush=True)
        origin = _log("origin_checkpoint", step=from_step) if resumed.path else _log("origin_start")
        if fail:
            who = (_log("who_step", rank=fail["rank"], step=fail["step"]) if fail.get("phase") == "step"
                   else _log("who_phase", rank=fail["rank"], phase=fail.get("phase"), prev=fail["step"] - 1))
        else:
            who = _log("who_group")
        redo = _log("lost_none") if not lost else _log("lost_one" if lost == 1 else "lost_many", n=lost,
                                                      first=from_step + 1, last=last_done)
        forget = _log("forgetting", what=", ".join(args.forget)) if args.forget else ""
        self.say(_log("restart", attempt=self.attempt, how=how, who=who, origin=origin, ms=_ms(resumed.seconds),
                      redo=redo, forget=forget), flush=True)
        return last_done if lost else 0

    def train(self, history: dict, redo_until: int) -> list[float]:
        """Train from the resumed step to ``--steps``, checkpointing every ``--ckpt-every``."""
        args, state = self.args, self.state
        losses: list[float] = list(state.extra.get("losses", []))
        self.where["reported"] = state.step
        self.faults.arm_timer()
        PHASE.emit(self.events, {"name": "train", "steps": args.steps, "attempt": self.attempt})
        redone_reported = False
        while state.step < args.steps:
            step = state.step + 1  # counted from 1
            t_step, t_wall = time.perf_counter(), time.time()
            loss = self.trainer.step(self.faults.mid_step(step))
            if args.step_time:
                time.sleep(max(0.0, args.step_time - (time.perf_counter() - t_step)))
            losses.append(loss)
            state.extra["losses"] = losses
            # on the trace as the lesson counts it, from 1 ("the checkpoint after step 4", "redone step 5")
            span = {"step": step - 1, "attempt": self.attempt, "redo": step <= redo_until}
            name = step_span_name(span, number=step)
            if self.rank == 0:
                STEP.emit(self.events, {"step": step - 1, "of": args.steps, "loss": loss,
                                        "lr": state.scheduler.get_last_lr()[0], "attempt": self.attempt,
                                        "redo": step <= redo_until, "t0": t_wall, "name": name})
                PROGRESS.emit(self.events, {"done": step, "total": args.steps})
            else:  # every rank trains: its steps on the trace too (rank 0's step event carries the numbers)
                SPAN.emit(self.events, {"name": name, "stream": "compute", "t0": t_wall, "t1": time.time(),
                                        "step": step - 1, "attempt": self.attempt, "redo": step <= redo_until})
            self.where["reported"] = step
            if self.rank == 0 and redo_until and not redone_reported and step >= redo_until:
                self._report_redone(history["losses"], losses, redo_until)
                redone_reported = True
            if step % args.ckpt_every == 0 or step == args.steps:
                self.where["phase"] = "checkpoint"
                self._checkpoint(step)
                self.where["phase"] = "step"
        self._report_async(self.ckpt.wait())
        return losses

    def _report_redone(self, before: dict[int, float], losses: list[float], redo_until: int) -> None:
        """Once the lost steps are done again: whether their losses equal the first time's."""
        first = (self.resumed.step or 0) + 1
        compared = [s for s in range(first, redo_until + 1) if s in before]
        same = all(before[s] == losses[s - 1] for s in compared)
        REDONE.emit(self.events, {"first": first, "last": redo_until, "steps": redo_until - first + 1,
                                  "compared": len(compared), "identical": same})
        self.say(_log("redone", count=redo_until - first + 1, span=format_range(first, redo_until),
                      same=_log("redone_same" if same else "redone_different"), n=len(compared)), flush=True)

    def _checkpoint(self, step: int) -> None:
        if self.args.ckpt_mode == "async":
            t_block = time.perf_counter()
            self._report_async(self.ckpt.wait())  # the previous one, published: waiting for it blocks this save too
            self.ckpt.save_async(self.state, on_written=self.faults.in_flight).seconds = time.perf_counter() - t_block
            return
        info = self.ckpt.save(self.state)
        if self.rank == 0:
            CHECKPOINT.emit(self.events, {"step": step, "bytes": info.bytes, "seconds": info.seconds,
                                          "name": Path(info.path).name, "form": info.form, "attempt": self.attempt,
                                          "pruned": info.pruned, "mode": "sync"})
            self.say(_log("saved", step=step, size=_kib(info.bytes), ms=_ms(info.seconds), name=Path(info.path).name),
                     flush=True)

    def _report_async(self, info) -> None:
        """An asynchronous checkpoint, once published: ``seconds`` from the call to publication,
        ``blocked_s`` the part the training waited for."""
        if info is None or self.rank != 0:
            return
        CHECKPOINT.emit(self.events, {"step": info.step, "bytes": info.bytes, "seconds": info.written_s,
                                      "blocked_s": info.seconds, "t_end": info.published_t,
                                      "name": Path(info.path).name, "form": info.form, "attempt": self.attempt,
                                      "pruned": info.pruned, "mode": "async"})
        self.say(_log("saved_async", step=info.step, size=_kib(info.bytes), blocked=_ms(info.seconds),
                      written=_ms(info.written_s), name=Path(info.path).name), flush=True)

    def compare(self, losses: list[float], run_sha: str) -> dict:
        """Train again from scratch without faults or checkpoints (same seed): every loss and the
        final weights must be identical."""
        args, device = self.args, self.ctx.device
        PHASE.emit(self.events, {"name": "compare", "attempt": self.attempt})
        ref_state = build(args, self.rank, self.world, device)
        ref = Trainer(args, ref_state, make_data(args), self.rank, self.world, device)
        ref_losses = [ref.step() for _ in range(args.steps)]
        ref_sha = weights_digest(ref_state.model)
        diffs = [abs(a - b) for a, b in zip(losses, ref_losses)]
        unequal = [i + 1 for i, (a, b) in enumerate(zip(losses, ref_losses)) if a != b]
        identical = not unequal and len(losses) == len(ref_losses)
        cmp = {"steps": len(ref_losses), "identical": identical, "equal_steps": len(ref_losses) - len(unequal),
               "first_diff_step": unequal[0] if unequal else None, "max_abs_diff": max(diffs, default=0.0),
               "weights_identical": ref_sha == run_sha, "run_sha256": run_sha, "reference_sha256": ref_sha}
        if self.rank == 0:
            COMPARE.emit_fields(self.events, {"attempt": self.attempt, **cmp})
        return cmp

    def checkpoint_cost(self) -> dict:
        PHASE.emit(self.events, {"name": "checkpoint cost", "attempt": self.attempt})
        cost = checkpoint_cost(self.args, self.rank, self.world, self.ctx.device, self.root / ".cost")
        if self.rank == 0:
            CKPT_COST.emit_fields(self.events, {"attempt": self.attempt, **cost})
        return cost


def checkpoint_cost(args, rank: int, world: int, device, folder: Path, checkpoints: int = 3, rounds: int = 3) -> dict:
    """What checkpoints cost the training loop, measured on this run's model and ranks.

    A warm-up times a step and a synchronous "dcp" save; the interval ``every`` is then the
    fewest steps in which a write fits twice (``every·t_step ≥ 2·t_write``, as one would choose it
    for asynchronous checkpoints: a save that starts before the previous one is written waits
    for it). Then the same ``checkpoints·every`` steps run with no checkpoint, with a synchronous
    save every ``every`` steps, and with an asynchronous one (``async_save``), one after the other,
    ``rounds`` times; the extra time of a saving mode taken against the run without checkpoints of the
    same round (neighbours in time share the machine's load).
    Per mode: ``step_s``, the loop's time per step (the slowest rank's, a mean over the rounds, so that
    ``(step_s − none's step_s)·every`` is ``per_checkpoint_s``); ``blocked_s``, how long
    one save call held the loop (the median over the rounds); and for the two saving modes ``per_checkpoint_s``, the loop's
    extra time per checkpoint against none (a mean over the rounds, like the next two, so that
    they add up; for async: the staging, and the background write's
    share of the cores), ``slower_steps_s``, the part of it the steps themselves took longer
    (each step timed alone; a save leaves caches cold and, async, a writer sharing the cores), and
    ``save_s``, the save calls' time per checkpoint, timed around each call."""
    import shutil
    import statistics

    def fresh():
        state = build(args, rank, world, device)
        return state, Trainer(args, state, make_data(args), rank, world, device)

    state, trainer = fresh()
    trainer.step()
    t0 = time.perf_counter()
    for _ in range(3):
        trainer.step()
    t_step = max_over_ranks((time.perf_counter() - t0) / 3, device)
    warm = Checkpointer(folder / "warm-up", rank, world, form="dcp", keep=1)
    warm.save(state)  # the first save pays one-time costs (planner, imports)
    t_write = max_over_ranks(warm.save(state).seconds, device)
    every = max(2, min(50, math.ceil(2 * t_write / max(t_step, 1e-6))))
    steps = checkpoints * every
    loops: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
    blocked: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
    stepping: dict[str, list[float]] = {"none": [], "sync": [], "async": []}  # the steps alone, per round
    saving: dict[str, list[float]] = {"none": [], "sync": [], "async": []}  # the save calls, per round
    for _ in range(rounds):
        for mode in ("none", "sync", "async"):
            state, trainer = fresh()
            ckpt = Checkpointer(folder / mode, rank, world, form="dcp", keep=1)
            dist.barrier()
            t0, in_steps, in_saves = time.perf_counter(), 0.0, 0.0
            for i in range(1, steps + 1):
                t_step0 = time.perf_counter()
                trainer.step()
                in_steps += time.perf_counter() - t_step0
                if mode != "none" and i % every == 0:
                    t_save0 = time.perf_counter()
                    blocked[mode].append((ckpt.save if mode == "sync" else ckpt.save_async)(state).seconds)
                    in_saves += time.perf_counter() - t_save0
            # the slowest rank's loop with its own steps and saves, so that they add up to it
            loop, in_steps, in_saves = slowest_rank_parts(time.perf_counter() - t0, (in_steps, in_saves), device)
            loops[mode].append(loop)
            stepping[mode].append(in_steps)
            saving[mode].append(in_saves)
            ckpt.wait()
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    med, mean = statistics.median, statistics.fmean
    # the mean, as the extra time per checkpoint below: (sync − none)·every is then its per_checkpoint_s (the
    # median beside a mean printed 16.7 and 24.6 ms a step, every 7 steps, with "+45.8 ms per checkpoint")
    out = {mode: {"step_s": mean(loops[mode]) / steps, "blocked_s": max_over_ranks(med(blocked[mode]), device) if blocked[mode] else 0.0}
           for mode in loops}
    for mode in ("sync", "async"):  # paired with the run without checkpoints of the same round
        out[mode]["per_checkpoint_s"] = mean(a - b for a, b in zip(loops[mode], loops["none"])) / checkpoints
        out[mode]["slower_steps_s"] = mean(a - b for a, b in zip(stepping[mode], stepping["none"])) / checkpoints
        out[mode]["save_s"] = mean(saving[mode]) / checkpoints
    return {"steps": steps, "every": every, "write_s": t_write, **out}


def summary_from_event(s: dict, lang: str | None = None) -> str:
    """Rank 0's printed summary, in the learner's language (``lang``, else the run's)."""
    from ...lessons.units import format_bytes, format_fixed, format_number, number_separator

    lang = lang or run_language()
    say = summary_lines("lesson3", lang)
    ms = lambda x: format_fixed(x * 1e3, 1, lang) + " ms"  # noqa: E731
    lines = [say("head", steps=s["steps"], world=s["world_size"], attempts=s["attempts"],
                 failures=s.get("failures", 0), restarts=s.get("restarts", 0), redone=s.get("redone_steps", 0),
                 checkpoints=s.get("checkpoints", 0), form=say(f"forms.{s['form']}"),
                 size=format_bytes(s.get("checkpoint_bytes", 0), binary=True, lang=lang),
                 each=ms(s.get("checkpoint_seconds_mean", 0)))]
    k = s.get("ckpt_cost")
    if k:
        lines.append(say("cost", every=k["every"], step=ms(k["none"]["step_s"])))
        labels = {mode: say(f"modes.{mode}") + ":" for mode in ("sync", "async")}
        for mode, label in labels.items():
            lines.append(say("cost_mode", mode=label.ljust(max(map(len, labels.values()))), step=ms(k[mode]["step_s"]),
                             blocked=ms(k[mode]["blocked_s"]), extra=ms(k[mode]["per_checkpoint_s"])))
    c = s.get("compare")
    if c:
        weights = say("identical" if c["weights_identical"] else "different")
        if c["identical"]:
            lines.append(say("same", equal=c["equal_steps"], steps=c["steps"], weights=weights,
                             sha=c["run_sha256"][:12]))
        else:
            forgot = say("forgot", what=number_separator(lang).join(s["forgot"])) if s.get("forgot") else ""
            # the weights on a line of their own: the launcher keeps three wrapped lines of each, and the reason
            # ("resumed without: rng") came last and was cut
            lines += [say("not_same", equal=c["equal_steps"], steps=c["steps"], first=c["first_diff_step"],
                          diff=format_number(c["max_abs_diff"], 3, lang)),
                      say("not_same_weights", weights=weights, forgot=forgot)]
    return "\n".join(lines)


def init_group_per_attempt(timeout_s: float | None = None) -> None:
    """Join the group with store keys private to this attempt of the run.

    torchrun's elastic agent hosts one TCPStore for every restart of the group, and the keys the
    previous attempt's group wrote are still in it: a restarted rank can be sent to a peer's *old*
    address and fail with "Gloo connectFullMesh failed … Connection refused" (here: in 4 of 5
    runs without this, intermittently; in none of the runs since). Prefixing the store with
    ``TORCHELASTIC_RESTART_COUNT`` gives every attempt fresh keys. Outside torchrun's agent store
    this is a plain ``init_process_group``.
    """
    from datetime import timedelta

    from ..experiment import collective_timeout_s
    from ..runtime import choose_device, join_deadline

    if dist.is_initialized() or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = choose_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timedelta(seconds=collective_timeout_s(timeout_s))
    with join_deadline(timeout, rank, world):
        agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                    is_master=False, timeout=timeout)
        store = dist.PrefixStore(f"distai/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent_store)
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout,
                                device_id=device if backend == "nccl" else None)


def main(argv=None) -> int:
    return run_experiment("lesson3", parse_args, run, argv, check=lambda args: _check_args(args, launch_world_size()),
                          before_init=prepare)


def prepare(args) -> None:
    """Where events go without a launcher, deterministic cuBLAS, and the per-attempt rendezvous."""
    if not os.environ.get(EVENTS_DIR_ENV):
        # no launcher: keep events (the journal a restart reads) next to the checkpoints
        base = Path(args.ckpt_dir or "lesson3-run").resolve()
        os.environ[EVENTS_DIR_ENV] = str(base.parent / f"{base.name}-events" if args.ckpt_dir else base / "events")
        if not args.ckpt_dir:
            args.ckpt_dir = str(base / "checkpoints")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS on GPUs
    if not args.plain_init:
        init_group_per_attempt()


if __name__ == "__main__":
    exit_with(main)
