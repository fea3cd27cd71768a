"""Hidden tests (instructor-only) for chapter 04_positional_encoding.

generated from course/04_positional_encoding.py by `make generate`; do not edit.
"""



import math

import torch

import solutions.ch04_positional_encoding as ref
from autograder.hidden import HiddenTests, Mistake

hidden = HiddenTests(ref)


def _omega(d, freq="ok", dtype=torch.float64):
    """Frequencies of pairs i = 0..d/2-1 (freq names a common mistake)."""
    i = torch.arange(d // 2, dtype=dtype)
    exponent = {"ok": 2 * i / d, "pair_index": i / d, "four_i": 4 * i / d}[freq]
    return 10000.0 ** (-exponent)


def _pe(max_len, d, layout="interleaved", freq="ok", start=0, swap=False, multiply=False, own_index=False):
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]
    if own_index:   # odd feature 2i+1 uses 10000^(-(2i+1)/d)
        col = torch.arange(d, dtype=torch.float64)
        ang = pos * 10000.0 ** (-col / d)
        pe = torch.where(col.long() % 2 == 0, torch.sin(ang), torch.cos(ang))
        return pe.to(torch.get_default_dtype())
    w = _omega(d, freq)
    ang = pos * (1 / w if multiply else w)
    s, c = torch.sin(ang), torch.cos(ang)
    if swap:
        s, c = c, s
    pe = torch.cat([s, c], dim=-1) if layout == "concat" else torch.stack([s, c], dim=-1).flatten(1)
    return pe.to(torch.get_default_dtype())


PE_MISTAKES = [
    Mistake("sin and cos concatenated ([sin, ..., sin, cos, ..., cos]): the paper interleaves them, "
            "sin on the even features 2i, cos on the odd features 2i+1", lambda L, d: _pe(L, d, layout="concat")),
    Mistake("sin and cos swapped: sine goes to the even features 2i, cosine to the odd features 2i+1",
            lambda L, d: _pe(L, d, swap=True)),
    Mistake("the odd feature 2i+1 must use the same frequency as feature 2i, 10000^(-2i/d_model), "
            "not 10000^(-(2i+1)/d_model)", lambda L, d: _pe(L, d, own_index=True)),
    Mistake("frequencies use 10000^(-i/d_model) with the pair index i: the exponent is 2i/d_model",
            lambda L, d: _pe(L, d, freq="pair_index")),
    Mistake("frequencies use 10000^(-4i/d_model): the exponent is 2i/d_model with i the pair index "
            "(that is, the even feature's index divided by d_model)", lambda L, d: _pe(L, d, freq="four_i")),
    Mistake("positions multiplied by 10000^(2i/d_model) instead of divided by it",
            lambda L, d: _pe(L, d, multiply=True)),
    Mistake("positions start at 1: the first row is position 0 (sin 0 = 0, cos 0 = 1)",
            lambda L, d: _pe(L, d, start=1)),
]


@hidden.test("test_sinusoidal_encoding_values")
def _(t):
    for L, d in [(3, 4), (6, 8), (10, 2)]:
        t.function("sinusoidal_encoding", L, d, mistakes=PE_MISTAKES, label=f"max_len={L}, d_model={d}")


@hidden.test("test_sinusoidal_encoding_shapes")
def _(t):
    for L, d in [(1, 2), (7, 6), (5, 10), (2, 32)]:
        t.function("sinusoidal_encoding", L, d, mistakes=PE_MISTAKES, label=f"max_len={L}, d_model={d}")


@hidden.test("test_sinusoidal_encoding_long")
def _(t):
    for L, d in [(64, 128), (48, 16), (40, 512)]:
        t.function("sinusoidal_encoding", L, d, mistakes=PE_MISTAKES, label=f"max_len={L}, d_model={d}")


def _rel(k, d, transpose=False, layout="interleaved", freq="ok", use_k=True):
    w = _omega(d, freq)
    b = (k if use_k else 1) * w
    c, s = torch.cos(b), torch.sin(b)
    M = torch.zeros(d, d, dtype=torch.float64)
    even = torch.arange(d // 2) * 2 if layout == "interleaved" else torch.arange(d // 2)
    odd = even + 1 if layout == "interleaved" else even + d // 2
    M[even, even], M[even, odd], M[odd, even], M[odd, odd] = c, -s, s, c
    if transpose:
        M = M.T
    return M.to(torch.get_default_dtype())


REL_MISTAKES = [
    Mistake("blocks transposed: [[cos, sin], [-sin, cos]] is the matrix for column vectors (M @ pe), "
            "and shifts by -k here. With row vectors, pe[pos] @ M, block i is [[cos b, -sin b], [sin b, cos b]]",
            lambda k, d: _rel(k, d, transpose=True)),
    Mistake("blocks placed for a concatenated [sin..., cos...] layout (rows i and i + d_model/2): "
            "in the paper's interleaved layout pair i is features 2i, 2i+1",
            lambda k, d: _rel(k, d, layout="concat")),
    Mistake("blocks placed for a concatenated layout and transposed: pair i is features 2i, 2i+1 and, "
            "with row vectors, block i is [[cos b, -sin b], [sin b, cos b]]",
            lambda k, d: _rel(k, d, layout="concat", transpose=True)),
    Mistake("the angle must be b = k * omega_i: the offset k is missing",
            lambda k, d: _rel(k, d, use_k=False)),
    Mistake("frequencies use 10000^(-i/d_model) with the pair index i: the exponent is 2i/d_model",
            lambda k, d: _rel(k, d, freq="pair_index")),
]


def _shift_property(probe, M):
    """PE[pos + k] == PE[pos] @ M for every pos of a long float64 table."""
    if not isinstance(M, torch.Tensor) or not M.is_floating_point():
        return None
    k, d = probe.args
    angle = torch.arange(80 + abs(k), dtype=torch.float64)[:, None] * _omega(d)
    pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)   # (80 + k, d)
    lhs = pe[:80] @ M.double()
    rhs = pe[k:k + 80]
    err = (lhs - rhs).abs().max().item()
    if not err < 1e-4:
        return (f"PE[pos] @ M differs from PE[pos + k] by up to {err:.2g} (k={k}, d_model={d}, "
                "pos = 0..79): the defining property does not hold")
    return None


REL = dict(mistakes=REL_MISTAKES, checks=[_shift_property], deps=("sinusoidal_encoding",))


@hidden.test("test_relative_position_matrix_values")
def _(t):
    for k, d in [(1, 4), (0, 6), (2, 8), (5, 10)]:
        t.function("relative_position_matrix", k, d, label=f"k={k}, d_model={d}", **REL)


@hidden.test("test_relative_position_matrix_every_pos")
def _(t):
    for k, d in [(3, 16), (10, 32), (25, 6), (7, 64)]:
        t.function("relative_position_matrix", k, d, label=f"k={k}, d_model={d}", **REL)


def _rope(x, base=10000.0, layout="interleaved", direction=1, start=0, freq="ok", angle_dtype=None):
    N, d = x.shape[-2], x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    exponent = {"ok": 2 * i / d, "pair_index": i / d}[freq]
    theta = base ** (-exponent)
    ang = (torch.arange(start, start + N, dtype=torch.float64)[:, None] * theta) * direction
    if angle_dtype is not None:
        ang = ang.to(angle_dtype)
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if layout == "interleaved":
        return torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([ra, rb], dim=-1)


ROPE_MISTAKES = [
    Mistake("half-split pairs (i, i + d/2), the GPT-NeoX / 'rotate half' layout: this exercise pairs "
            "neighbouring features (2i, 2i+1), as in RoFormer", lambda x, base=10000.0: _rope(x, base, layout="half")),
    Mistake("rotated the wrong way: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)",
            lambda x, base=10000.0: _rope(x, base, direction=-1)),
    Mistake("positions start at 1: the first position is 0 and is left unchanged",
            lambda x, base=10000.0: _rope(x, base, start=1)),
    Mistake("frequencies use base^(-i/d) with the pair index i: the exponent is 2i/d",
            lambda x, base=10000.0: _rope(x, base, freq="pair_index")),
    Mistake("the base argument is ignored: theta_i = base^(-2i/d)", lambda x, base=10000.0: _rope(x)),
]


# Tolerances follow the spec, which keeps the dtype but does not ask for float64 angles:
# angles computed in float32 (as most public implementations do) and applied to a float64
# input agree to float32 precision and earn full marks (see autograder.hidden.tolerance).
ROPE = dict(mistakes=ROPE_MISTAKES)


@hidden.test("test_apply_rope_values")
def _(t):
    t.function("apply_rope", t.randn(6, 4), label="x (6, 4)", **ROPE)
    t.function("apply_rope", t.randn(2, 9, 8), label="x (2, 9, 8)", **ROPE)
    t.function("apply_rope", t.randn(1, 12, 16), label="x (1, 12, 16)", **ROPE)


@hidden.test("test_apply_rope_batch_dims")
def _(t):
    t.function("apply_rope", t.randn(2, 3, 7, 8), label="x (B, h, N, d) = (2, 3, 7, 8)", **ROPE)
    t.function("apply_rope", t.randn(2, 5, 6), base=100.0, label="base=100", **ROPE)
    t.function("apply_rope", t.randn(3, 1, 4), label="a single position (N=1)", **ROPE)
    t.function("apply_rope", t.randn(2, 2, 2, 10, 2), base=500.0, label="d=2, three leading dims, base=500",
               **ROPE)


@hidden.test("test_apply_rope_relative")
def _(t):
    t.function("apply_rope", t.randn(2, 64, 16, dtype=torch.float64), grad=True,
               label="float64 x (2, 64, 16), gradients too", **ROPE)
    t.function("apply_rope", t.randn(200, 32, dtype=torch.float64), label="float64 x (200, 32)", **ROPE)


def _alibi(H, n, slopes="ok", sign=-1, signed=False):
    h = torch.arange(H, dtype=torch.float64)
    m = {"ok": 2.0 ** (-8 * (h + 1) / H), "reversed": 2.0 ** (-8 * (H - h) / H),
         "off_by_one": 2.0 ** (-8 * h / H), "eight_heads_only": 2.0 ** (-(h + 1))}[slopes]
    pos = torch.arange(n, dtype=torch.float64)
    dist = pos[:, None] - pos[None, :]
    if not signed:
        dist = dist.abs()
    return (sign * m[:, None, None] * dist).to(torch.get_default_dtype())


ALIBI_MISTAKES = [
    Mistake("wrong slope order: head 0 has the largest slope 2^(-8/num_heads), the last head the smallest "
            "2^(-8)", lambda H, n: _alibi(H, n, slopes="reversed")),
    Mistake("slopes off by one: m_h = 2^(-8 (h + 1) / num_heads), so head 0's slope is 2^(-8/num_heads), not 1",
            lambda H, n: _alibi(H, n, slopes="off_by_one")),
    Mistake("slopes 2^-(h+1) are right only for 8 heads: use m_h = 2^(-8 (h + 1) / num_heads)",
            lambda H, n: _alibi(H, n, slopes="eight_heads_only")),
    Mistake("the bias must be a penalty: -m_h * |i - j| (the sign is missing)",
            lambda H, n: _alibi(H, n, sign=1)),
    Mistake("use the absolute distance |i - j|: the bias is symmetric",
            lambda H, n: _alibi(H, n, signed=True)),
    Mistake("use the absolute distance |i - j|: the bias is symmetric",
            lambda H, n: _alibi(H, n, sign=1, signed=True)),
]


@hidden.test("test_alibi_bias_values")
def _(t):
    for H, n in [(8, 5), (4, 6), (2, 3)]:
        t.function("alibi_bias", H, n, mistakes=ALIBI_MISTAKES, label=f"num_heads={H}, n={n}")


@hidden.test("test_alibi_bias_slopes")
def _(t):
    for H, n in [(1, 4), (6, 7), (12, 3), (16, 2), (3, 1)]:
        t.function("alibi_bias", H, n, mistakes=ALIBI_MISTAKES, label=f"num_heads={H}, n={n}")
