"""Prefix sharing on lesson 7's model: KV memory and time to first token, with and without, side by side.

    python bench/prefix_sharing.py                       # ~1 min on a laptop CPU
    python bench/prefix_sharing.py --system-prompt 512 --rounds 5

One request mix — every prompt starts with the same ``--system-prompt`` tokens, then its own
4–24 — is served with continuous batching on a paged KV cache without prefix sharing and with it
(:func:`distai.engine.paged_kv.compare_prefix_sharing`: a radix tree of shared blocks, copy-on-write,
LRU eviction), in ``--rounds`` interleaved rounds, for two pool sizes:

* **same memory**: ``--kv-budget`` tokens, too few for all requests unshared, so sharing also lets
  more requests run at once (queueing shrinks);
* **ample memory**: room for every request unshared, so the TTFT gain is the prefill work saved alone.

Printed per pool: the memory saved (physical blocks in use against the blocks the same sequences
would hold unshared), peak blocks, prompt tokens prefilled, and the median TTFT p50 of each and its
ratio. Outputs must be identical (greedy decoding), or it exits 1.
"""
from __future__ import annotations

import statistics
import sys

from _bench import options


def main(argv=None) -> int:
    args = options(__doc__, hidden=256, layers=4, requests=32, system_prompt=250, block_size=16,
                   kv_budget=(2048, "tokens of KV in the 'same memory' pool"),
                   arrival_rate=(1.0, "requests per iteration"), rounds=3).parse_args(argv)

    import torch

    from distai.engine.inference import DecoderShard, build_model
    from distai.engine.paged_kv import compare_prefix_sharing
    from distai.lessons.lesson7.paging import blocks_for, poisson_requests
    from distai.lessons.model_size import ModelSize

    torch.set_num_threads(1)
    cfg = ModelSize.preset("llama-tiny", vocab=512, hidden=args.hidden, layers=args.layers, heads=8, kv_heads=4)
    w = build_model(cfg, 0, torch.float32)
    reqs = poisson_requests(args.requests, args.arrival_rate, prompt_range=(4, 24), output_range=(2, 24), seed=7,
                            vocab=cfg.vocab, system_prompt=args.system_prompt)
    ample = sum(blocks_for(r.prompt_len + r.output_len - 1, args.block_size) for r in reqs)
    pools = {"same memory": args.kv_budget // args.block_size, "ample memory": ample}
    print(f"{len(reqs)} requests, a {args.system_prompt}-token system prompt + 4–24 own tokens, 2–24 output tokens; "
          f"model h={cfg.hidden}, L={cfg.layers}, float32, CPU 1 thread; blocks of {args.block_size} tokens")
    ok = True
    results: dict = {name: [] for name in pools}
    for _ in range(args.rounds):  # interleaved: a slow moment of the machine hits both pools
        for name, blocks in pools.items():
            res = compare_prefix_sharing(lambda: DecoderShard(cfg, w), reqs, blocks, args.block_size, 16)
            ok &= res["tokens_equal"]
            results[name].append(res)
    for name, runs in results.items():
        last = runs[-1]
        a, b = last["no-sharing"], last["prefix"]
        t0 = statistics.median(r["no-sharing"]["ttft_p50_s"] for r in runs)
        t1 = statistics.median(r["prefix"]["ttft_p50_s"] for r in runs)
        print(f"\n[{name}: {pools[name]} blocks] tokens {'identical' if last['tokens_equal'] else 'DIFFERENT'}")
        print(f"  KV in use: {b['memory_saved']:.0%} saved (mean {b['mean_blocks']:.0f} blocks for "
              f"{b['logical_blocks_mean']:.0f} unshared); peak {b['peak_blocks']} vs {a['peak_blocks']} blocks "
              f"without sharing ({last['peak_memory_ratio']:.2f}×)")
        print(f"  prefill: {b['prefill_tokens']:,} vs {a['prefill_tokens']:,} tokens ({b['hit_rate']:.0%} of prompt "
              f"tokens found cached), {b['cow']} copy-on-write, {b['evicted']} evictions")
        print(f"  TTFT p50 (median of {len(runs)} rounds): {t1 * 1e3:.1f} ms with sharing vs {t0 * 1e3:.1f} ms "
              f"without → {t0 / t1:.1f}× sooner")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
