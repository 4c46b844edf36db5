"""What a lesson-7 run measured, folded from its events: the model, its KV shards, its paged blocks.

Fed the events of ``distai run lesson7`` (live, or replayed from a run folder by the tutor),
:class:`ServingRun` keeps the run's ``config`` (its model and mesh), the bytes of KV cache each
rank measured per parallel mode (``kv_shard``), the pool after every scheduler iteration of the
paged, contiguous and prefix-sharing caches (``kv_step``, rebuilt as
:class:`~distai.lessons.lesson7.paging.Snapshot`, the model's own type, so the run and the model
are drawn alike) and the two comparisons (``kv_compare``, ``prefix_compare``). The KV-cache
visualizer draws from it. Pure Python, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..events import RUN_START
from .events import (
    CONFIG,
    KV_COMPARE,
    KV_SHARD,
    KV_STEP,
    PREFIX_COMPARE,
    Config,
    KVCompare,
    KVShard,
    KVStep,
    PrefixCompare,
)
from .paging import Snapshot

CACHES = ("paged", "contiguous", "prefix")  # the kv_step caches drawn (not the no-sharing twin of prefix)
DTYPE_BYTES = {"float32": 4, "float64": 8}  # otherwise 2 (bfloat16, float16)


@dataclass
class ServingRun:
    """Everything one run has said so far (see the module docstring)."""

    run_id: str | None = None
    config: Config | None = None
    shards: dict[tuple[str, int], KVShard] = field(default_factory=dict)  # (mode, rank) -> kv_shard event
    paged: list[Snapshot] = field(default_factory=list)
    paged_pool: tuple[int, int] | None = None  # (blocks, block size)
    contiguous: list[Snapshot] = field(default_factory=list)
    contiguous_len: int | None = None  # tokens reserved per sequence (the slot size)
    prefix: list[Snapshot] = field(default_factory=list)
    prefix_pool: tuple[int, int] | None = None
    kv_compare: KVCompare | None = None
    prefix_compare: PrefixCompare | None = None

    def feed(self, event: dict) -> bool:
        """Take one event; True if it changed what the run says (a ``run_start`` starts afresh)."""
        if RUN_START.matches(event):
            ServingRun.__init__(self, run_id=event.get("run_id"))
        elif CONFIG.matches(event) and "kv_heads" in event and "head_dim" in event:
            self.config = event
            self.shards, self.paged, self.contiguous = {}, [], []
        elif KV_SHARD.matches(event):
            self.shards[(event["mode"], int(event.get("rank") or 0))] = event
        elif KV_STEP.matches(event) and event.get("cache") in CACHES:
            snap = snapshot(event)
            pool = (int(event["num_blocks"]), int(event["block_size"]))
            if event["cache"] == "paged":
                self.paged_pool = pool
                self.paged.append(snap)
            elif event["cache"] == "prefix":
                self.prefix_pool = pool
                self.prefix.append(snap)
            else:
                self.contiguous.append(snap)
                self.contiguous_len = pool[1]
        elif KV_COMPARE.matches(event):
            self.kv_compare = event
        elif PREFIX_COMPARE.matches(event):
            self.prefix_compare = event
        else:
            return False
        return True

    @property
    def world_size(self) -> int:
        return int(self.config["W"]) if self.config else 1

    def dtype_bytes(self) -> float:
        """Bytes per element of the run's model."""
        dtype = self.config.get("dtype") if self.config else None
        return DTYPE_BYTES.get(str(dtype), 2)

    def mesh(self, shard: KVShard) -> tuple[int, int]:
        """(TP, PP) of the layout a ``kv_shard`` event measured: a (pp, tp) mesh, all ranks in TP, or in PP."""
        if shard["mode"] == "tp-pp":  # rank = stage·tp + TP rank
            return int(shard["tp"]), int(shard["pp"])
        if shard["mode"] == "tp":
            return self.world_size, 1
        return 1, self.world_size

    def mode_of(self, tp: int, pp: int) -> str | None:
        """The parallel mode whose ``kv_shard`` events measured the layout (tp, pp), if the run measured it."""
        if not self.config:
            return None
        w = self.world_size
        if (tp, pp) == (self.config.get("tp"), self.config.get("pp")):
            return "tp-pp"
        return "tp" if (tp, pp) == (w, 1) else "pp" if (tp, pp) == (1, w) else None


def snapshot(event: KVStep) -> Snapshot:
    """The pool a ``kv_step`` event describes: each block's owner and fill from the block tables (a block
    in several tables is shared, its reference count theirs), the cached blocks' fills."""
    n, bs = int(event["num_blocks"]), int(event["block_size"])
    owners: list = [None] * n
    fills = [0] * n
    refs = [0] * n
    lengths = {int(k): int(v) for k, v in (event.get("lengths") or {}).items()}
    for rid, table in (event.get("tables") or {}).items():
        left = lengths.get(int(rid), len(table) * bs)
        for b in table:
            owners[b] = int(rid)
            fills[b] = max(0, min(bs, left))
            refs[b] += 1
            left -= bs
    cached = {int(b): int(t) for b, t in (event.get("cached") or {}).items()}
    for b, t in cached.items():
        fills[b] = t
    return Snapshot(int(event["step"]), owners, fills, list(event.get("allocated", [])),
                    list(event.get("freed", [])), list(event.get("running", [])),
                    list(event.get("waiting", [])), list(event.get("admitted", [])),
                    list(event.get("finished", [])), list(event.get("preempted", [])),
                    int(event.get("tokens_stored", 0)), int(event.get("reserved_tokens", 0)),
                    refs=refs, cached=sorted(cached), cow=list(event.get("cow", [])),
                    evicted=list(event.get("evicted", [])), reused_tokens=int(event.get("reused_tokens", 0)))
