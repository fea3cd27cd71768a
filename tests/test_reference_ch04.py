"""The Chapter 4 reference against independent implementations and its mathematical properties."""
import math

import pytest
import torch

from solutions import ch04_positional_encoding as ref


def _pe_loop(max_len, d_model):
    """The paper's formula, written out with math in float64."""
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos, 2 * i], pe[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


@pytest.mark.parametrize("max_len, d_model", [(1, 2), (10, 4), (50, 16), (64, 128)])
def test_sinusoidal_matches_the_formula(max_len, d_model):
    pe = ref.sinusoidal_encoding(max_len, d_model)
    assert pe.dtype == torch.float32 and pe.shape == (max_len, d_model)
    torch.testing.assert_close(pe.double(), _pe_loop(max_len, d_model), atol=1e-7, rtol=0)


def test_sinusoidal_follows_the_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        pe = ref.sinusoidal_encoding(200, 32)
    finally:
        torch.set_default_dtype(previous)
    assert pe.dtype == torch.float64
    torch.testing.assert_close(pe, _pe_loop(200, 32), atol=1e-12, rtol=0)


def test_seed_style_float32_table_is_within_the_grader_tolerance():
    """The widespread float32 div_term implementation passes the float32 tolerance up to 64 positions."""
    max_len, d_model = 64, 128
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    torch.testing.assert_close(pe, ref.sinusoidal_encoding(max_len, d_model), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("k", [0, 1, 5, 37, -3])
@pytest.mark.parametrize("d_model", [2, 8, 64])
def test_relative_matrix_shifts_every_position(k, d_model):
    pe = _pe_loop(200, d_model)
    M = ref.relative_position_matrix(k, d_model).double()
    lo, hi = max(0, -k), 200 - max(0, k)
    torch.testing.assert_close(pe[lo:hi] @ M, pe[lo + k:hi + k], atol=1e-6, rtol=0)


def test_relative_matrix_is_a_rotation_group():
    d = 16
    M = {k: ref.relative_position_matrix(k, d).double() for k in (-4, 0, 3, 4, 7)}
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(M[0], eye)
    torch.testing.assert_close(M[3] @ M[4], M[7], atol=1e-6, rtol=0)
    torch.testing.assert_close(M[7] @ M[7].T, eye, atol=1e-6, rtol=0)
    torch.testing.assert_close(M[-4], M[4].T, atol=1e-7, rtol=0)


def _rope_complex(x, base=10000.0):
    """RoPE with complex numbers, as in Meta's LLaMA code (pairs (2i, 2i+1) as real, imag)."""
    N, d = x.shape[-2:]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(N, d // 2, dtype=torch.float64), torch.outer(torch.arange(N, dtype=torch.float64), theta))
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


@pytest.mark.parametrize("shape, base", [((7, 4), 10000.0), ((2, 3, 50, 16), 10000.0), ((5, 10), 100.0)])
def test_rope_matches_complex_rotation(shape, base):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(ref.apply_rope(x, base), _rope_complex(x, base), atol=1e-12, rtol=0)
    x32 = x.float()
    out = ref.apply_rope(x32, base)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, _rope_complex(x32, base), atol=1e-6, rtol=1e-5)


def test_rope_scores_depend_only_on_distance():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(32, generator=g, dtype=torch.float64), torch.randn(32, generator=g, dtype=torch.float64)
    Q, K = ref.apply_rope(q.expand(300, 32)), ref.apply_rope(k.expand(300, 32))
    S = Q @ K.T
    for offset in range(-299, 300, 13):
        diag = torch.diagonal(S, offset)
        assert (diag.max() - diag.min()).item() < 1e-10


def test_rope_is_the_transposed_shift_matrix_and_preserves_norms():
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = ref.apply_rope(x)
    torch.testing.assert_close(out[0], x[0], rtol=0, atol=0)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    for p in range(12):
        torch.testing.assert_close(out[p], x[p] @ ref.relative_position_matrix(p, 8).double().T, atol=1e-6, rtol=0)


def test_rope_equals_rotate_half_on_deinterleaved_features():
    """The GPT-NeoX 'rotate half' layout is the same rotation on permuted features."""
    x = torch.randn(2, 9, 12, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    d = 12
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])       # (x0, x2, ..., x1, x3, ...)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(9, dtype=torch.float64)[:, None] * theta
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    xp = x[..., perm]
    half = xp * cos + torch.cat([-xp[..., d // 2:], xp[..., : d // 2]], -1) * sin
    torch.testing.assert_close(half, ref.apply_rope(x)[..., perm])


def test_rope_gradient_is_the_inverse_rotation():
    x = torch.randn(3, 10, 6, dtype=torch.float64, requires_grad=True)
    cot = torch.randn(3, 10, 6, dtype=torch.float64)
    (ref.apply_rope(x) * cot).sum().backward()
    # Rotations are orthogonal: the gradient rotates the cotangent back by -p * theta_i.
    d = 6
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(10, dtype=torch.float64)[:, None] * theta
    a, b = cot[..., 0::2], cot[..., 1::2]
    back = torch.stack([a * ang.cos() + b * ang.sin(), -a * ang.sin() + b * ang.cos()], -1).flatten(-2)
    torch.testing.assert_close(x.grad, back)


def test_alibi_slopes_and_symmetry():
    bias = ref.alibi_bias(8, 6)
    assert bias.shape == (8, 6, 6) and bias.dtype == torch.float32
    torch.testing.assert_close(-bias[:, 0, 1], torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    torch.testing.assert_close(bias, bias.transpose(-2, -1))
    i = torch.arange(6)
    torch.testing.assert_close(bias[3], -(1 / 16) * (i[:, None] - i[None, :]).abs().float())
    for H in (1, 3, 12):
        slopes = -ref.alibi_bias(H, 2)[:, 0, 1]
        torch.testing.assert_close(slopes, torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)]))


def test_alibi_with_a_causal_mask_equals_the_original_causal_form():
    """Press et al. add -m (i - j) for j <= i; under a causal mask that is the symmetric bias."""
    H, n = 4, 7
    scores = torch.randn(2, H, n, n, generator=torch.Generator().manual_seed(4))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    i = torch.arange(n)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)])
    original = -slopes[:, None, None] * (i[:, None] - i[None, :]).float()
    ours = torch.softmax((scores + ref.alibi_bias(H, n)).masked_fill(~causal, float("-inf")), -1)
    theirs = torch.softmax((scores + original).masked_fill(~causal, float("-inf")), -1)
    torch.testing.assert_close(ours, theirs)
