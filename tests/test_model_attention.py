"""The one attention forward (engine/model.py): its core equals PyTorch's scaled_dot_product_attention,
and decoding through its KV cache gives the logits of the whole sequence run at once."""
import torch
import torch.nn.functional as F

from distai.engine.model import GPT, GPTConfig, GrowingKVCache, attend

LLAMA = GPTConfig(vocab=64, hidden=32, heads=4, kv_heads=2, layers=2, seq=12, norm="rms", mlp="swiglu",
                  rope_theta=1e4, bias=False, tie_embeddings=False)


def test_attend_equals_sdpa_causal_and_masked_with_gqa():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    allowed = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    allowed[..., 0] = True  # every query sees at least one key
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    assert torch.allclose(attend(q, k, v, mask=allowed), ref, atol=1e-12)
    kc, vc = k[:, :, :5], v[:, :, :5]
    ref = F.scaled_dot_product_attention(q, kc, vc, is_causal=True, enable_gqa=True)
    assert torch.allclose(attend(q, kc, vc), ref, atol=1e-12)


def test_decoding_through_the_cache_equals_the_whole_sequence():
    model = GPT(LLAMA, seed=1, dtype=torch.float64)
    ids = torch.randint(0, LLAMA.vocab, (3, 10), generator=torch.Generator().manual_seed(2))
    whole = model(ids)  # [s, b, V]
    caches = [GrowingKVCache() for _ in range(LLAMA.layers)]
    prefill = model(ids[:, :6], caches=caches)
    steps = [model(ids[:, p:p + 1], positions=torch.tensor([p]), caches=caches) for p in range(6, 10)]
    assert torch.allclose(torch.cat([prefill, *steps]), whole, atol=1e-12)
    # per-sequence positions ([b, s]) give the same
    caches = [GrowingKVCache() for _ in range(LLAMA.layers)]
    model(ids[:, :9], caches=caches)
    last = model(ids[:, 9:], positions=torch.full((3, 1), 9), caches=caches)
    assert torch.allclose(last[0], whole[9], atol=1e-12)
