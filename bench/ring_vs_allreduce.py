"""Our from-scratch ring all-reduce against ``dist.all_reduce``, side by side in one run.

    python bench/ring_vs_allreduce.py [--nproc 4] [--sizes 16MiB 32MiB 64MiB] [--iters 7]
                                      [--channels 1|2] [--pieces K] [--gpus]

Launches lesson 1's experiment through the engine's launcher (torchrun, gloo on CPU processes;
NCCL with ``--gpus``), with training off and the sweep limited to the given sizes. For each size
the experiment times the two implementations in alternation (ring, all_reduce, all_reduce, ring,
…) so both see the same machine load, takes the median over iterations of the slowest rank,
and reports time, algbw = S/t and busbw = algbw·2(N-1)/N (nccl-tests' definitions). This script
prints those rows and the ratio of our busbw to theirs. The issue's target: >= 0.9 at 16 MiB and
above.
"""
from __future__ import annotations

import statistics
import sys
import tempfile

from _bench import options


def main(argv=None) -> int:
    p = options(__doc__, nproc=4, iters=7)
    p.add_argument("--sizes", nargs="+", default=["16MiB", "32MiB", "64MiB"])
    p.add_argument("--channels", type=int, default=None, help="ring channels (default: the ring's choice)")
    p.add_argument("--pieces", type=int, default=None, help="sub-chunks per chunk (default: the ring's choice)")
    p.add_argument("--gpus", action="store_true", help="NCCL on GPUs instead of gloo on CPU processes")
    args = p.parse_args(argv)

    from distai.engine.launcher import Launch, LaunchSpec, Placement
    from distai.engine.runs import create_run
    from distai.lessons.units import format_bandwidth, format_time, parse_bytes

    sizes = sorted(int(parse_bytes(s)) for s in args.sizes)
    exp_args = ["--steps", "0", "--trace", "none", "--iters", str(args.iters),
                "--sweep-min", str(sizes[0]), "--sweep-max", str(sizes[-1])]
    if args.channels:
        exp_args += ["--channels", str(args.channels)]
    if args.pieces:
        exp_args += ["--pieces", str(args.pieces)]
    rows: list[dict] = []
    start: list[dict] = []

    def consumer(e: dict) -> None:
        if e.get("kind") == "sweep":
            rows.append(e)
        elif e.get("kind") == "phase" and e.get("name") == "start":
            start.append(e)

    with tempfile.TemporaryDirectory() as root:
        record = create_run(root, "lesson1", "distai.engine.experiments.lesson1")
        placement = Placement("cuda" if args.gpus else "cpu", args.nproc)
        record = Launch(LaunchSpec("distai.engine.experiments.lesson1", placement, exp_args), record,
                        consumer=consumer).run()
    if record.status != "ok":
        print(f"run failed: {record.error}", file=sys.stderr)
        print("\n".join(record.error_tail), file=sys.stderr)
        return 1
    backend = start[0]["backend"] if start else "?"
    print(f"{backend}, N={args.nproc}, {args.iters} timed iterations per size, channels={args.channels or 'auto'}, "
          f"pieces={args.pieces or 'auto'}")
    print(f"{'size':>10} {'ring time':>10} {'ring busbw':>12} {'ar time':>10} {'ar busbw':>12} {'ratio':>6}")
    ratios = []
    for r in rows:
        ratio = r["ring_busbw"] / r["ar_busbw"]
        if r["size"] >= 16 << 20:
            ratios.append(ratio)
        print(f"{r['size'] / (1 << 20):8.1f}Mi {format_time(r['ring_time_s']):>10} {format_bandwidth(r['ring_busbw']):>12} "
              f"{format_time(r['ar_time_s']):>10} {format_bandwidth(r['ar_busbw']):>12} {ratio:6.2f}")
    if ratios:
        print(f"busbw ratio ring / dist.all_reduce at >= 16 MiB: median {statistics.median(ratios):.2f}, "
              f"min {min(ratios):.2f} (target >= 0.9)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
