"""The Chapter 6 reference agrees with PyTorch and with independent computations."""
import math

import pytest
import torch
import torch.nn.functional as F

from solutions import ch06_efficient_attention as ref


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=_gen(seed), dtype=dtype)


# ------------------------------------------------------------------ local_attention_mask
@pytest.mark.parametrize("n, r, causal, g", [(10, 2, False, ()), (9, 0, True, ()), (12, 1, False, (0, 7)),
                                             (12, 2, True, [2, 9]), (5, 9, False, ()), (1, 0, True, (0,))])
def test_local_mask_matches_the_definition_entry_by_entry(n, r, causal, g):
    mask = ref.local_attention_mask(n, r, causal=causal, global_tokens=g)
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    for i in range(n):
        for j in range(n):
            want = abs(i - j) <= r or i in g or j in g
            if causal:
                want = want and j <= i
            assert bool(mask[i, j]) == want, (i, j)


# ------------------------------------------------------------------ linformer_attention
def test_linformer_with_identity_projection_is_full_attention():
    q, k, v = _randn(2, 5, 8), _randn(2, 7, 8, seed=1), _randn(2, 7, 3, seed=2)
    eye = torch.eye(7, dtype=torch.float64)
    out, w = ref.linformer_attention(q, k, v, eye, eye)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5, dtype=torch.float64))


def test_linformer_equals_attention_on_projected_sequences():
    q, k, v = _randn(2, 3, 4, 8), _randn(2, 3, 10, 8, seed=1), _randn(2, 3, 10, 5, seed=2)
    E, Fm = _randn(4, 10, seed=3), _randn(4, 10, seed=4)
    out, w = ref.linformer_attention(q, k, v, E, Fm)
    kp = torch.einsum("rn,bhnd->bhrd", E, k)
    vp = torch.einsum("rn,bhnd->bhrd", Fm, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, kp, vp))
    assert w.shape == (2, 3, 4, 4)


# ------------------------------------------------------------------ linear_attention
def _linear_quadratic(q, k, v, causal, eps):
    a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
    if causal:
        a = a.tril()
    return a @ v / (a.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 63, 64, 65, 200])
def test_linear_attention_matches_the_quadratic_form(causal, n):
    q, k, v = _randn(2, n, 6), _randn(2, n, 6, seed=1), _randn(2, n, 4, seed=2)
    for eps in (1e-6, 2.0):
        torch.testing.assert_close(ref.linear_attention(q, k, v, causal=causal, eps=eps),
                                   _linear_quadratic(q, k, v, causal, eps))


def test_linear_attention_causal_is_the_token_recurrence():
    q, k, v = _randn(1, 2, 130, 4), _randn(1, 2, 130, 4, seed=1), _randn(1, 2, 130, 3, seed=2)
    pq, pk = F.elu(q) + 1, F.elu(k) + 1
    S = torch.zeros(1, 2, 4, 3, dtype=torch.float64)
    z = torch.zeros(1, 2, 4, dtype=torch.float64)
    outs = []
    for i in range(130):
        S = S + pk[..., i, :, None] * v[..., i, None, :]
        z = z + pk[..., i, :]
        outs.append(torch.einsum("bhd,bhde->bhe", pq[..., i, :], S) / ((pq[..., i, :] * z).sum(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(ref.linear_attention(q, k, v, causal=True), torch.stack(outs, -2))


# ------------------------------------------------------------------ performer_features
def test_performer_features_formula_and_unbiased_kernel():
    x, om = _randn(3, 4) * 0.3, _randn(4, 7, seed=1)
    want = torch.exp(x @ om - (x ** 2).sum(-1, keepdim=True) / 2) / math.sqrt(7)
    torch.testing.assert_close(ref.performer_features(x, om), want)
    a, b = _randn(6, seed=2) * 0.3, _randn(6, seed=3) * 0.3
    big = _randn(6, 400000, seed=4)
    est = (ref.performer_features(a, big) * ref.performer_features(b, big)).sum()
    assert abs(est - torch.exp(a @ b)) < 0.01


# ------------------------------------------------------------------ lsh_hash
def test_lsh_hash_range_dtype_and_antipodes():
    x, R = _randn(2, 40, 8), _randn(8, 4, seed=1)
    h = ref.lsh_hash(x, R)
    assert h.dtype == torch.long and h.shape == (2, 40)
    assert 0 <= h.min() and h.max() < 8 and h.max() >= 4
    torch.testing.assert_close(ref.lsh_hash(-x, R), (h + 4) % 8)
    # bucket c < b/2 means projection c is the largest positive one
    p = x @ R
    for b_, n_ in [(0, 0), (1, 5)]:
        c = int(h[b_, n_])
        val = p[b_, n_, c] if c < 4 else -p[b_, n_, c - 4]
        assert val == torch.cat([p[b_, n_], -p[b_, n_]]).max()


# ------------------------------------------------------------------ flash_attention
@pytest.mark.parametrize("shape_q, shape_k, bs", [((2, 37, 8), (2, 50, 8), 16), ((1, 2, 33, 8), (1, 2, 33, 8), 1),
                                                  ((3, 64, 4), (3, 64, 4), 64), ((1, 5, 4), (1, 130, 4), 7)])
def test_flash_attention_equals_sdpa(shape_q, shape_k, bs):
    q, k = _randn(*shape_q), _randn(*shape_k, seed=1)
    v = _randn(*shape_k[:-1], 5, seed=2)
    torch.testing.assert_close(ref.flash_attention(q, k, v, block_size=bs), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("n, bs", [(45, 8), (33, 16), (20, 64), (64, 16), (7, 1)])
def test_flash_attention_causal_equals_sdpa(n, bs):
    q, k, v = _randn(2, 3, n, 8), _randn(2, 3, n, 8, seed=1), _randn(2, 3, n, 6, seed=2)
    torch.testing.assert_close(ref.flash_attention(q, k, v, block_size=bs, causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_flash_attention_large_scores_and_float32():
    q, k, v = (_randn(1, 40, 4, seed=s, dtype=torch.float32) * 30 for s in range(3))
    out = ref.flash_attention(q, k, v, block_size=16)
    assert torch.isfinite(out).all() and out.dtype == torch.float32
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_recomputing_backward_gives_the_gradients_of_sdpa(causal):
    qs = [_randn(2, 2, 45, 8, seed=s).requires_grad_() for s in range(3)]
    out = ref.flash_attention_trainable(*qs, 16, causal)
    cot = _randn(*out.shape, seed=9)
    grads = torch.autograd.grad(out, qs, cot)
    want_out = F.scaled_dot_product_attention(*qs, is_causal=causal)
    want = torch.autograd.grad(want_out, qs, cot)
    torch.testing.assert_close(out, want_out)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(lambda q, k, v: ref.flash_attention_trainable(q, k, v, 4, causal),
                                    tuple(_randn(1, 9, 3, seed=s).requires_grad_() for s in range(3)))


def test_blocked_logsumexp_matches_torch():
    q, k = _randn(2, 30, 4), _randn(2, 30, 4, seed=1)
    s = q @ k.transpose(-2, -1) / 2.0
    torch.testing.assert_close(ref.blocked_logsumexp(q, k, 8)[..., 0], torch.logsumexp(s, -1))
    causal = s.masked_fill(torch.ones(30, 30, dtype=torch.bool).triu(1), -math.inf)
    torch.testing.assert_close(ref.blocked_logsumexp(q, k, 8, causal=True)[..., 0], torch.logsumexp(causal, -1))


# ------------------------------------------------------------------ GroupedQueryAttention
@pytest.mark.parametrize("h, h_kv", [(4, 4), (4, 2), (8, 2), (4, 1)])
def test_gqa_matches_sdpa_with_enable_gqa(h, h_kv):
    torch.manual_seed(0)
    m = ref.GroupedQueryAttention(32, h, h_kv).double()
    x = _randn(2, 6, 32)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    out, w = m(x, mask)
    d_h = 32 // h
    q = m.W_q(x).view(2, 6, h, d_h).transpose(1, 2)
    k = m.W_k(x).view(2, 6, h_kv, d_h).transpose(1, 2)
    v = m.W_v(x).view(2, 6, h_kv, d_h).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(out, m.W_o(o.transpose(1, 2).reshape(2, 6, 32)))
    assert w.shape == (2, h, 6, 6)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, h, 6, dtype=torch.float64))


def test_gqa_with_all_heads_is_multi_head_attention_of_chapter_3():
    from solutions import ch03_multi_head_attention as ch3
    torch.manual_seed(1)
    g = ref.GroupedQueryAttention(16, 4, 4)
    mha = ch3.MultiHeadAttention(16, 4)
    mha.load_state_dict(g.state_dict())
    x = torch.randn(2, 5, 16)
    out_g, w_g = g(x)
    out_m, w_m = mha(x, x, x)
    torch.testing.assert_close(out_g, out_m)
    torch.testing.assert_close(w_g, w_m)
