"""Hidden tests (instructor-only) for chapter 06_efficient_attention.

generated from course/06_efficient_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn.functional as F

import solutions.ch06_efficient_attention as ref
from autograder.hidden import HiddenTests, Mistake, rows_sum_to_one

hidden = HiddenTests(ref, from_scratch={"linformer_attention", "linear_attention", "flash_attention",
                                        "GroupedQueryAttention"})


def _local(n, radius, causal=False, global_tokens=(), how="ok"):
    """The reference mask with one deliberate change, to recognise a common mistake."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    window = (i - j).abs() < radius if how == "strict" else (i - j).abs() <= radius
    g = torch.zeros(n, dtype=torch.bool)
    g[torch.as_tensor(list(global_tokens), dtype=torch.long)] = True
    rows = g[:, None] if how != "global_cols" else torch.zeros(n, 1, dtype=torch.bool)
    cols = g[None, :] if how != "global_rows" else torch.zeros(1, n, dtype=torch.bool)
    if how == "no_global":
        rows, cols = torch.zeros(n, 1, dtype=torch.bool), torch.zeros(1, n, dtype=torch.bool)
    if causal and how == "causal_first":
        return (window & (j <= i)) | rows | cols
    mask = window | rows | cols
    if causal and how == "causal_strict":
        return mask & (j < i)
    if causal and how != "no_causal":
        mask = mask & (j <= i)
    return mask


def _lm(how):
    return lambda n, radius, causal=False, global_tokens=(): _local(n, radius, causal, global_tokens, how)


LOCAL_MISTAKES = [
    Mistake("|i - j| == radius is inside the window: use <=, not <", _lm("strict")),
    Mistake("global tokens must also be attended to by every query: set their columns True, not only their rows",
            _lm("global_rows")),
    Mistake("global tokens must attend to every key: set their rows True, not only their columns",
            _lm("global_cols")),
    Mistake("global_tokens ignored: their rows and columns are True", _lm("no_global")),
    Mistake("causal ignored: with causal=True every key after the query (j > i) is False", _lm("no_causal")),
    Mistake("causal rule applied before the global tokens: with causal=True even a global token's row and "
            "column are False for j > i; apply the causal rule last", _lm("causal_first")),
    Mistake("causal mask hides the diagonal: a query may attend to itself (j <= i, not j < i)", _lm("causal_strict")),
]


@hidden.test("test_local_attention_mask_window")
def _(t):
    for n, r in [(10, 2), (7, 0), (5, 9), (1, 0), (12, 3)]:
        t.function("local_attention_mask", n, r, mistakes=LOCAL_MISTAKES, label=f"n={n}, radius={r}")


@hidden.test("test_local_attention_mask_causal")
def _(t):
    for n, r in [(9, 2), (6, 0), (8, 10)]:
        t.function("local_attention_mask", n, r, causal=True, mistakes=LOCAL_MISTAKES,
                   label=f"n={n}, radius={r}, causal")


@hidden.test("test_local_attention_mask_global")
def _(t):
    t.function("local_attention_mask", 12, 1, global_tokens=(0, 7), mistakes=LOCAL_MISTAKES,
               label="n=12, radius=1, global tokens (0, 7)")
    t.function("local_attention_mask", 10, 2, global_tokens=[4], mistakes=LOCAL_MISTAKES,
               label="n=10, radius=2, global tokens [4]")
    t.function("local_attention_mask", 12, 2, causal=True, global_tokens=(2, 9), mistakes=LOCAL_MISTAKES,
               label="n=12, radius=2, causal, global tokens (2, 9)")


def _linformer(query, key, value, E, Fm, how="ok"):
    if how == "swapped":
        E, Fm = Fm, E
    if how == "features":                      # projected along the features (needs N_k == d)
        k_proj = (key @ E.transpose(-2, -1)).transpose(-2, -1)
        v_proj = (value @ Fm.transpose(-2, -1)).transpose(-2, -1)
    else:
        k_proj, v_proj = E @ key, Fm @ value
    scale = {"no_scale": 1.0, "sqrt_k": 1 / math.sqrt(E.size(0))}.get(how, 1 / math.sqrt(query.size(-1)))
    scores = query @ k_proj.transpose(-2, -1) * scale
    weights = torch.softmax(scores, dim=-2 if how == "softmax_dim" else -1)
    return weights @ v_proj, weights


def _lf(how):
    return lambda q, k, v, E, Fm: _linformer(q, k, v, E, Fm, how)


LINFORMER_MISTAKES = [
    Mistake("E and F swapped: keys are projected with E (E @ key), values with F (F @ value)", _lf("swapped")),
    Mistake("projected along the features: E must mix the N_k positions, E @ key (k, d_k), not key @ E.T",
            _lf("features")),
    Mistake("scores not scaled by 1/sqrt(d_k)", _lf("no_scale")),
    Mistake("scores scaled by 1/sqrt(k): the scale is 1/sqrt(d_k), the width of the queries and keys",
            _lf("sqrt_k")),
    Mistake("softmax over the wrong dimension: take it over the last one (the k projected keys)", _lf("softmax_dim")),
]


@hidden.test("test_linformer_attention_values")
def _(t):
    t.function("linformer_attention", t.randn(2, 5, 4), t.randn(2, 7, 4), t.randn(2, 7, 3), t.randn(3, 7),
               t.randn(3, 7), mistakes=LINFORMER_MISTAKES, checks=[rows_sum_to_one], label="N_q=5, N_k=7, k=3")
    t.function("linformer_attention", t.randn(3, 9, 8, dtype=torch.float64), t.randn(3, 12, 8, dtype=torch.float64),
               t.randn(3, 12, 5, dtype=torch.float64), t.randn(4, 12, dtype=torch.float64),
               t.randn(4, 12, dtype=torch.float64), mistakes=LINFORMER_MISTAKES, label="float64, k=4")
    t.function("linformer_attention", t.randn(1, 6, 16), t.randn(1, 6, 16), t.randn(1, 6, 16), t.randn(6, 6) / 2,
               t.randn(6, 6) / 2, mistakes=LINFORMER_MISTAKES, label="k = N_k")


@hidden.test("test_linformer_attention_sequence_axis")
def _(t):
    x = t.randn(1, 2, 6, 6)
    t.function("linformer_attention", x, x.clone(), x.clone(), t.randn(2, 6), t.randn(2, 6),
               mistakes=LINFORMER_MISTAKES, label="(1, 2, 6, 6) with N_k == d_k, k=2")
    t.function("linformer_attention", t.randn(2, 3, 4, 8), t.randn(2, 3, 10, 8), t.randn(2, 3, 10, 8),
               t.randn(5, 10), t.randn(5, 10), mistakes=LINFORMER_MISTAKES, label="(B, h, N, d) inputs, k=5")
    t.function("linformer_attention", t.randn(2, 3, 4), t.randn(2, 5, 4), t.randn(2, 5, 2), t.randn(1, 5),
               t.randn(1, 5), mistakes=LINFORMER_MISTAKES, label="k=1")


def _linear(query, key, value, causal=False, eps=1e-6, how="ok"):
    """Quadratic form of the reference (fine for the small inputs of mistake models)."""
    phi = (lambda x: F.elu(x)) if how == "no_plus_one" else (lambda x: F.elu(x) + 1)
    q, k = phi(query), phi(key)
    a = q @ k.transpose(-2, -1)                                     # (..., N_q, N_k)
    n_q, n_k = a.shape[-2:]
    lower = torch.ones(n_q, n_k, dtype=torch.bool).tril(-1 if how == "strict" else 0)
    if causal and how != "future":
        num_a = a.masked_fill(~lower, 0)
        den_a = a if how == "den_future" else num_a
    else:
        num_a = den_a = a
    eps_den = 0.0 if how in ("no_eps", "eps_outside") else eps
    out = num_a @ value / (den_a.sum(-1, keepdim=True) + eps_den)
    if how == "no_norm":
        out = num_a @ value
    return out + eps if how == "eps_outside" else out


def _lin(how):
    return lambda q, k, v, causal=False, eps=1e-6: _linear(q, k, v, causal, eps, how)


LINEAR_MISTAKES = [
    Mistake("feature map missing its +1: phi(x) = elu(x) + 1 (elu alone can be negative)", _lin("no_plus_one")),
    Mistake("causal sum includes future keys: with causal=True, query i sums over keys j <= i only", _lin("future")),
    Mistake("causal denominator includes future keys: z must also run over j <= i only", _lin("den_future")),
    Mistake("causal sums leave out the query's own key: sum over j <= i, diagonal included", _lin("strict")),
    Mistake("eps ignored: add the eps argument to the denominator phi(q_i) . z", _lin("no_eps")),
    Mistake("eps added to the output: it belongs in the denominator, phi(q_i) . z + eps", _lin("eps_outside")),
    Mistake("output not normalised: divide phi(q_i) S by phi(q_i) . z + eps", _lin("no_norm")),
]


@hidden.test("test_linear_attention_values")
def _(t):
    t.function("linear_attention", t.randn(2, 5, 4), t.randn(2, 7, 4), t.randn(2, 7, 3), mistakes=LINEAR_MISTAKES,
               label="N_q=5, N_k=7")
    t.function("linear_attention", t.randn(2, 3, 6, 8, dtype=torch.float64), t.randn(2, 3, 9, 8, dtype=torch.float64),
               t.randn(2, 3, 9, 5, dtype=torch.float64), mistakes=LINEAR_MISTAKES, label="float64 (B, h, N, d)")
    t.function("linear_attention", t.randn(1, 4, 4), t.randn(1, 6, 4), t.randn(1, 6, 2), eps=3.0,
               mistakes=LINEAR_MISTAKES, label="eps=3.0")


@hidden.test("test_linear_attention_causal")
def _(t):
    t.function("linear_attention", t.randn(2, 10, 4), t.randn(2, 10, 4), t.randn(2, 10, 3), causal=True,
               mistakes=LINEAR_MISTAKES, label="causal, N=10")
    t.function("linear_attention", t.randn(1, 2, 150, 8), t.randn(1, 2, 150, 8), t.randn(1, 2, 150, 6),
               causal=True, mistakes=LINEAR_MISTAKES, label="causal, N=150 (several chunks of any usual size)")
    t.function("linear_attention", t.randn(1, 200, 4, dtype=torch.float64), t.randn(1, 200, 4, dtype=torch.float64),
               t.randn(1, 200, 4, dtype=torch.float64), causal=True, eps=2.0, mistakes=LINEAR_MISTAKES,
               label="causal, float64, N=200, eps=2.0")


@hidden.test("test_linear_attention_memory",
             max_memory=(64 * 2**20, "linear_attention built an N_q x N_k tensor: use phi(K)^T V (d x d_v) and "
                                     "phi(Q) @ that, and for causal a running state carried from chunk to chunk"))
def _(t):
    n, d = 8192, 16
    t.function("linear_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d),
               label=f"N={n}, d={d}")
    t.function("linear_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d), causal=True,
               label=f"causal, N={n}, d={d}")


def _performer(x, omega, how="ok"):
    m = omega.size(-1)
    sq = (x * x).sum(-1, keepdim=True)
    shift = {"no_norm": 0.0, "norm_not_squared": sq.sqrt() / 2, "no_half": sq,
             "global_norm": (x * x).sum() / 2}.get(how, sq / 2)
    div = {"no_sqrt_m": 1.0, "sqrt_d": math.sqrt(x.size(-1))}.get(how, math.sqrt(m))
    return torch.exp(x @ omega - shift) / div


def _pf(how):
    return lambda x, omega: _performer(x, omega, how)


PERFORMER_MISTAKES = [
    Mistake("missing -|x|^2/2 in the exponent: phi(x) = exp(x @ omega - |x|^2/2) / sqrt(m)", _pf("no_norm")),
    Mistake("|x|^2 is the squared norm: use (x * x).sum(-1), not the norm itself", _pf("norm_not_squared")),
    Mistake("the exponent subtracts |x|^2 / 2, not |x|^2", _pf("no_half")),
    Mistake("|x|^2 per vector: sum over the last dimension only, not over the whole tensor", _pf("global_norm")),
    Mistake("missing the 1/sqrt(m) factor", _pf("no_sqrt_m")),
    Mistake("divide by sqrt(m), m = omega.size(-1) the number of features, not sqrt(d)", _pf("sqrt_d")),
]


@hidden.test("test_performer_features_values")
def _(t):
    t.function("performer_features", t.randn(2, 3, 4) * 0.5, t.randn(4, 6), mistakes=PERFORMER_MISTAKES,
               label="x (2, 3, 4), m=6")
    t.function("performer_features", t.randn(5, 8, dtype=torch.float64) * 0.4, t.randn(8, 3, dtype=torch.float64),
               mistakes=PERFORMER_MISTAKES, label="float64 x (5, 8), m=3")
    t.function("performer_features", t.randn(2, 2, 3, 6) * 0.5, t.randn(6, 16), mistakes=PERFORMER_MISTAKES,
               label="x (2, 2, 3, 6), m=16")


def _lsh(x, rotations, how="ok"):
    p = x @ rotations
    if how == "half":
        return p.argmax(-1)
    return torch.cat([-p, p] if how == "reversed" else [p, -p], dim=-1).argmax(-1)


LSH_MISTAKES = [
    Mistake("buckets from only x @ R: take the argmax over cat([x @ R, -x @ R]) so that there are b buckets",
            lambda x, r: _lsh(x, r, "half")),
    Mistake("concatenated in the wrong order: x @ R first, then -x @ R", lambda x, r: _lsh(x, r, "reversed")),
]


@hidden.test("test_lsh_hash_values")
def _(t):
    t.function("lsh_hash", t.randn(2, 20, 8), t.randn(8, 4), mistakes=LSH_MISTAKES, label="x (2, 20, 8), b=8")
    t.function("lsh_hash", t.randn(3, 2, 16, 6, dtype=torch.float64), t.randn(6, 2, dtype=torch.float64),
               mistakes=LSH_MISTAKES, label="float64 x (3, 2, 16, 6), b=4")
    t.function("lsh_hash", t.randn(30, 4), t.randn(4, 8), mistakes=LSH_MISTAKES, label="x (30, 4), b=16")


def _flash(query, key, value, block_size=64, causal=False, how="ok"):
    """A blocked forward pass with one deliberate change."""
    d = query.size(-1)
    scale = 1.0 if how == "no_scale" else 1 / math.sqrt(d)
    n_q, n_k = query.size(-2), key.size(-2)
    outs = []
    for i0 in range(0, n_q, block_size):
        q_i = query[..., i0:i0 + block_size, :] * scale
        m = torch.full((*q_i.shape[:-1], 1), -math.inf, dtype=q_i.dtype)
        if how == "no_max":
            m = torch.zeros_like(m)
        l = torch.zeros_like(m)
        acc = torch.zeros(*q_i.shape[:-1], value.size(-1), dtype=q_i.dtype)
        stop = min(n_k, i0 + q_i.size(-2)) if causal and how != "no_causal" else n_k
        for j0 in range(0, stop, block_size):
            s = q_i @ key[..., j0:j0 + block_size, :].transpose(-2, -1)
            if causal and how not in ("no_causal", "no_diag_mask"):
                s = s.masked_fill(torch.arange(j0, j0 + s.size(-1))[None, :]
                                  > torch.arange(i0, i0 + s.size(-2))[:, None], -math.inf)
            m_new = m if how == "no_max" else torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = (l if how == "no_rescale_sum" else alpha * l) + p.sum(-1, keepdim=True)
            acc = (acc if how == "no_rescale_acc" else alpha * acc) + p @ value[..., j0:j0 + block_size, :]
            m = m_new
        outs.append(acc / l)
    return torch.cat(outs, dim=-2)


def _fl(how):
    return lambda q, k, v, block_size=64, causal=False: _flash(q, k, v, block_size, causal, how)


FLASH_MISTAKES = [
    Mistake("the online softmax does not rescale the running sum: l = exp(m_old - m_new) * l + rowsum(p)",
            _fl("no_rescale_sum")),
    Mistake("the online softmax does not rescale the running output: acc = exp(m_old - m_new) * acc + p @ v_j",
            _fl("no_rescale_acc")),
    Mistake("exp overflowed: subtract the running maximum before exp (these scores are large)", _fl("no_max")),
    Mistake("scores not scaled by 1/sqrt(d_k)", _fl("no_scale")),
    Mistake("causal ignored: with causal=True query i attends to keys j <= i only", _fl("no_causal")),
    Mistake("causal: the block on the diagonal needs a mask too (key j > query i is the future)",
            _fl("no_diag_mask")),
]


@hidden.test("test_flash_attention_values")
def _(t):
    t.function("flash_attention", t.randn(2, 37, 8), t.randn(2, 50, 8), t.randn(2, 50, 5), block_size=16,
               mistakes=FLASH_MISTAKES, label="N_q=37, N_k=50, block_size=16")
    # increasing scores along the keys: the maximum grows in every block, so the rescaling matters
    ramp = torch.linspace(0, 3, 40)[None, :, None]
    t.function("flash_attention", t.randn(1, 24, 4) + 1.0, t.randn(1, 40, 4) * 0.5 + ramp, t.randn(1, 40, 3),
               block_size=8, mistakes=FLASH_MISTAKES, label="scores growing from block to block")
    t.function("flash_attention", t.randn(2, 2, 30, 8, dtype=torch.float64), t.randn(2, 2, 30, 8, dtype=torch.float64),
               t.randn(2, 2, 30, 8, dtype=torch.float64), block_size=7, mistakes=FLASH_MISTAKES,
               label="float64 (B, h, N, d), block_size=7")
    t.function("flash_attention", t.randn(1, 5, 4), t.randn(1, 9, 4), t.randn(1, 9, 4), mistakes=FLASH_MISTAKES,
               label="default block_size, one block")
    t.function("flash_attention", t.randn(1, 12, 4), t.randn(1, 12, 4), t.randn(1, 12, 2), block_size=1,
               mistakes=FLASH_MISTAKES, label="block_size=1")


@hidden.test("test_flash_attention_causal")
def _(t):
    for n, bs in [(45, 8), (33, 16), (20, 64)]:
        t.function("flash_attention", t.randn(1, 2, n, 8), t.randn(1, 2, n, 8), t.randn(1, 2, n, 6), block_size=bs,
                   causal=True, mistakes=FLASH_MISTAKES, label=f"causal, N={n}, block_size={bs}")
    t.function("flash_attention", t.randn(2, 26, 4, dtype=torch.float64), t.randn(2, 26, 4, dtype=torch.float64),
               t.randn(2, 26, 4, dtype=torch.float64), block_size=5, causal=True, mistakes=FLASH_MISTAKES,
               label="causal, float64, block_size=5")


@hidden.test("test_flash_attention_stability")
def _(t):
    t.function("flash_attention", t.randn(1, 40, 4) * 30, t.randn(1, 40, 4) * 30, t.randn(1, 40, 4),
               block_size=16, mistakes=FLASH_MISTAKES, label="scores of several hundreds")
    t.function("flash_attention", t.randn(2, 33, 8) * 20, t.randn(2, 33, 8) * 20, t.randn(2, 33, 3),
               block_size=8, causal=True, mistakes=FLASH_MISTAKES, label="causal, scores of several hundreds")


@hidden.test("test_flash_attention_memory",
             max_memory=(64 * 2**20, "flash_attention built an N_q x N_k tensor (scores, weights or a mask): "
                                     "keep only one block of block_size x block_size scores at a time"))
def _(t):
    n, d = 8192, 32
    t.function("flash_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d), block_size=256,
               label=f"N={n}, d={d}, block_size=256")
    t.function("flash_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d), block_size=256,
               causal=True, label=f"causal, N={n}, d={d}, block_size=256")


def _gqa(m, x, mask=None, how="ok"):
    B, N, _ = x.shape
    h, h_kv, d_h = m.num_heads, m.num_kv_heads, m.d_head
    q = m.W_q(x).view(B, N, h, d_h).transpose(1, 2)
    k = m.W_k(x).view(B, N, h_kv, d_h).transpose(1, 2)
    v = m.W_v(x).view(B, N, h_kv, d_h).transpose(1, 2)
    if how == "repeat":
        k, v = k.repeat(1, h // h_kv, 1, 1), v.repeat(1, h // h_kv, 1, 1)
    else:
        k, v = k.repeat_interleave(h // h_kv, 1), v.repeat_interleave(h // h_kv, 1)
    scale = {"no_scale": 1.0, "sqrt_d_model": 1 / math.sqrt(h * d_h)}.get(how, 1 / math.sqrt(d_h))
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None and how != "mask_ignored":
        scores = scores.masked_fill(mask if how == "mask_inverted" else ~mask, -1e9)
    weights = torch.softmax(scores, -1)
    out = weights @ v
    out = out.reshape(B, N, h * d_h) if how == "merge_order" else out.transpose(1, 2).reshape(B, N, h * d_h)
    return (out if how == "no_w_o" else m.W_o(out)), weights


def _gq(how):
    return lambda m, x, mask=None: _gqa(m, x, mask, how)


GQA_MISTAKES = [
    Mistake("wrong key/value head: query head i must use key/value head i // (num_heads // num_kv_heads); "
            "repeat_interleave the key/value heads, do not repeat (tile) them", _gq("repeat")),
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(d_head), d_head = d_model // num_heads",
            _gq("sqrt_d_model")),
    Mistake("scores not scaled by 1/sqrt(d_head)", _gq("no_scale")),
    Mistake("W_o forgotten: apply self.W_o to the concatenated heads", _gq("no_w_o")),
    Mistake("heads merged in the wrong order: transpose (B, h, N, d_head) to (B, N, h, d_head) before flattening",
            _gq("merge_order")),
    Mistake("mask ignored: pass it on to the attention", _gq("mask_ignored")),
    Mistake("mask polarity inverted: True means the query MAY attend to the key", _gq("mask_inverted")),
]


@hidden.test("test_GroupedQueryAttention_values")
def _(t):
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 5, 16),
             mistakes=GQA_MISTAKES, checks=[rows_sum_to_one], label="d_model=16, 4 heads, 2 key/value heads")
    t.module("GroupedQueryAttention", dict(d_model=32, num_heads=8, num_kv_heads=2), t.randn(1, 6, 32),
             mistakes=GQA_MISTAKES, label="8 heads, 2 key/value heads (groups of 4)")
    t.module("GroupedQueryAttention", dict(d_model=24, num_heads=6, num_kv_heads=3), t.randn(2, 4, 24, dtype=torch.float64),
             dtype=torch.float64, mistakes=GQA_MISTAKES, label="float64, 6 heads, 3 key/value heads")


@hidden.test("test_GroupedQueryAttention_mha_mqa")
def _(t):
    t.module("GroupedQueryAttention", dict(d_model=8, num_heads=4, num_kv_heads=4), t.randn(2, 5, 8),
             mistakes=GQA_MISTAKES, label="num_kv_heads == num_heads (multi-head)")
    t.module("GroupedQueryAttention", dict(d_model=8, num_heads=4, num_kv_heads=1), t.randn(2, 5, 8),
             mistakes=GQA_MISTAKES, label="num_kv_heads == 1 (multi-query)")
    t.module("GroupedQueryAttention", dict(d_model=8, num_heads=1, num_kv_heads=1), t.randn(1, 3, 8),
             mistakes=GQA_MISTAKES, label="one head")


@hidden.test("test_GroupedQueryAttention_mask")
def _(t):
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 6, 16),
             mask=causal, mistakes=GQA_MISTAKES, label="a causal (N, N) mask")
    pad = (torch.arange(6)[None, :] < torch.tensor([6, 3])[:, None])[:, None, None, :]
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 6, 16),
             mask=pad, mistakes=GQA_MISTAKES, label="a (B, 1, 1, N) padding mask")


@hidden.test("test_GroupedQueryAttention_gradients")
def _(t):
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 5, 16), grad=True,
             mistakes=GQA_MISTAKES, label="gradients, 4 heads, 2 key/value heads")
