"""The Chapter 8 reference is Qwen3: same logits as `transformers`' Qwen3ForCausalLM, with and without a cache;
its RoPE is Chapter 4's up to a permutation; MLA's absorbed form equals the plain one; the paged cache equals
the contiguous one."""
import math

import pytest
import torch

from solutions import ch08_modern_attention as ref

transformers = pytest.importorskip("transformers")
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()


def _pair(layers=2, heads=4, kv_heads=2, head_dim=8, d=32, seed=0, dtype=torch.float32, theta=10000.0, tie=False):
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=53, hidden_size=d, intermediate_size=3 * d, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         max_position_embeddings=128, initializer_range=0.1, tie_word_embeddings=tie,
                         rope_parameters={"rope_type": "default", "rope_theta": theta})
    hf = Qwen3ForCausalLM(config).eval().to(dtype)
    with torch.no_grad():                                 # norms away from one, so their place matters
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    ours = ref.ModernLM(53, d, layers, heads, kv_heads, head_dim, 3 * d, rope_base=theta, eps=config.rms_norm_eps)
    ours.load_state_dict({k.removeprefix("model."): v for k, v in hf.state_dict().items()})
    return hf, ours.eval().to(dtype)


@pytest.mark.parametrize("layers, heads, kv_heads, head_dim, d, theta",
                         [(1, 2, 1, 8, 16, 10000.0), (2, 4, 2, 8, 32, 1e6), (3, 6, 3, 12, 24, 500.0),
                          (2, 4, 4, 6, 20, 10000.0)])
def test_logits_equal_transformers_qwen3(layers, heads, kv_heads, head_dim, d, theta):
    hf, ours = _pair(layers, heads, kv_heads, head_dim, d, theta=theta)
    ids = torch.randint(0, 53, (3, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        have, presents = ours(ids)
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-4)
    assert len(presents) == layers and presents[0][0].shape == (3, kv_heads, 30, head_dim)
    assert want.abs().mean() > 0.1                       # not a comparison of near-zero logits


def test_logits_equal_in_float64_to_float32_precision():
    """transformers' Qwen3 computes RMSNorm and the rotary angles in float32 even for a float64 model, so a
    float64 comparison agrees to float32 precision (and no better: ours is float64 throughout)."""
    hf, ours = _pair(dtype=torch.float64)
    ids = torch.randint(0, 53, (2, 25), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        have, want = ours(ids)[0], hf(ids).logits
    assert have.dtype == want.dtype == torch.float64
    torch.testing.assert_close(have, want, atol=1e-5, rtol=1e-5)


def test_tied_embeddings_load_too():
    hf, ours = _pair(tie=True)
    ids = torch.randint(0, 53, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(ids).logits, atol=1e-5, rtol=1e-4)


def test_cache_matches_transformers_step_by_step():
    hf, ours = _pair(layers=3)
    ids = torch.randint(0, 53, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf(ids).logits
        parts, past = [], None
        for chunk in (ids[:, :7], ids[:, 7:8], ids[:, 8:13], ids[:, 13:14], ids[:, 14:]):
            logits, past = ours(chunk, past)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), want, atol=1e-5, rtol=1e-4)


def test_greedy_tokens_equal_transformers_with_its_cache():
    hf, ours = _pair(seed=5)
    prompt = torch.randint(0, 53, (3, 5), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = hf.generate(prompt, max_new_tokens=20, do_sample=False, attention_mask=torch.ones_like(prompt),
                           pad_token_id=0)
        have = prompt
        logits, past = ours(prompt)
        for _ in range(20):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            have = torch.cat([have, nxt], 1)
            logits, past = ours(nxt, past)
    assert torch.equal(have, want)


def test_halves_rope_is_interleaved_rope_up_to_a_permutation():
    d = 12
    x = torch.randn(3, 7, d, dtype=torch.float64)
    pos = torch.arange(4, 11)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * theta
    even, odd = x[..., 0::2], x[..., 1::2]
    interleaved = torch.stack([even * ang.cos() - odd * ang.sin(), even * ang.sin() + odd * ang.cos()], -1).flatten(-2)
    torch.testing.assert_close(ref.apply_rope_halves(x[..., perm], pos), interleaved[..., perm])


def test_mla_absorbed_equals_plain_and_formula():
    torch.manual_seed(7)
    m = ref.MultiHeadLatentAttention(24, 4, 10, 6, 4, 5, rope_base=300.0).double()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    y, present = m(x)
    y_abs, present_abs = m(x, absorb=True)
    want, _ = ref.mla_by_formula(m, x)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(y_abs, want)
    assert present[0].shape == (2, 9, 10) and present[1].shape == (2, 9, 4)
    y2, _ = m(x[:, 5:], tuple(t[:, :5] for t in present), absorb=True)
    torch.testing.assert_close(y2, want[:, 5:])


def test_paged_attention_equals_contiguous_with_shared_prefix():
    torch.manual_seed(8)
    cache = ref.PagedKVCache(num_blocks=32, num_heads=2, block_size=4, head_dim=3) \
        if hasattr(ref, "PagedKVCache") else None
    k_all, v_all = torch.randn(32, 2, 4, 3), torch.randn(32, 2, 4, 3)
    table = torch.tensor([[5, 9, 1, 0], [5, 9, 30, 12], [7, 0, 0, 0]])
    lens = torch.tensor([11, 16, 2])
    q = torch.randn(3, 2, 3)
    out = ref.paged_attention(q, k_all, v_all, table, lens)
    for b in range(3):
        L = int(lens[b])
        k = torch.cat([k_all[int(i)] for i in table[b]], dim=1)[:, :L]
        v = torch.cat([v_all[int(i)] for i in table[b]], dim=1)[:, :L]
        want = torch.nn.functional.scaled_dot_product_attention(q[b][:, None], k, v)[:, 0]
        torch.testing.assert_close(out[b], want)
    assert cache is None or cache.block_size == 4


def test_sliding_window_mask_equals_streaming_llm_rule():
    m = ref.sliding_window_mask(9, 3, 2)
    for i in range(9):
        for j in range(9):
            assert bool(m[i, j]) == (j <= i and (i - j < 3 or j < 2))


def test_cache_arithmetic_of_the_93_percent_claim():
    ds67 = 95 * 2 * 8 * 128                # DeepSeek LLM 67B: 95 layers, GQA with 8 key/value heads of 128
    ds2 = 60 * (512 + 64)                  # DeepSeek-V2: 60 layers, latent 512 + rotary key 64
    assert math.isclose(1 - ds2 / ds67, 0.8224, abs_tol=1e-4)
    assert math.isclose(1 - (ds2 * 6) / (ds67 * 16), 0.9334, abs_tol=1e-4)
