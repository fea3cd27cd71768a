"""Hidden tests (instructor-only) for chapter 08_modern_attention.

generated from course/08_modern_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn.functional as F

import solutions.ch08_modern_attention as ref
from autograder.hidden import HiddenTests, Mistake, close

hidden = HiddenTests(ref, from_scratch={"ModernAttention", "MultiHeadLatentAttention"})


def _rms(m, x, how="ok"):
    if how == "no_eps":
        return m.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True))
    if how == "eps_outside":
        return m.weight * x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + m.eps)
    if how == "centred":
        c = x - x.mean(-1, keepdim=True)
        return m.weight * c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + m.eps)
    if how.startswith("axis"):                              # the mean over another dimension than the last
        return m.weight * x / torch.sqrt(x.pow(2).mean(int(how[4:]), keepdim=True) + m.eps)
    if how == "all_axes":
        return m.weight * x / torch.sqrt(x.pow(2).mean() + m.eps)
    if how == "no_sqrt":
        return m.weight * x / (x.pow(2).mean(-1, keepdim=True) + m.eps)
    if how == "no_weight":
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)
    if how == "sum":
        return m.weight * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + m.eps)
    raise ValueError(how)


RMS_MISTAKES = [
    Mistake("eps left out: divide by sqrt(mean(x**2) + eps)", lambda m, x: _rms(m, x, "no_eps")),
    Mistake("eps added outside the square root: divide by sqrt(mean(x**2) + eps)",
            lambda m, x: _rms(m, x, "eps_outside")),
    Mistake("the mean was subtracted (LayerNorm): RMSNorm does not centre, it divides x itself by its root mean "
            "square", lambda m, x: _rms(m, x, "centred")),
    *[Mistake("the mean of x**2 was taken over the wrong axis: one value per vector, over the LAST dimension",
              lambda m, x, dim=dim: _rms(m, x, f"axis{dim}")) for dim in (0, 1, -2)],
    Mistake("the mean of x**2 was taken over the whole tensor: one value per vector, over the last dimension "
            "(mean(dim=-1, keepdim=True))", lambda m, x: _rms(m, x, "all_axes")),
    Mistake("the square root is missing: divide by sqrt(mean(x**2) + eps), not by the mean square",
            lambda m, x: _rms(m, x, "no_sqrt")),
    Mistake("self.weight is not applied: multiply the normalised x by self.weight",
            lambda m, x: _rms(m, x, "no_weight")),
    Mistake("the sum of x**2 instead of its mean: divide by the ROOT MEAN square",
            lambda m, x: _rms(m, x, "sum")),
]
RMS = dict(mistakes=RMS_MISTAKES)


@hidden.test("test_RMSNorm")
def _(t):
    t.module("RMSNorm", dict(dim=8), t.randn(2, 5, 8), label="(2, 5, 8)", **RMS)
    t.module("RMSNorm", dict(dim=6), t.randn(3, 6) * 1e-3, label="tiny values, where eps matters", **RMS)
    t.module("RMSNorm", dict(dim=4, eps=0.5), t.randn(2, 3, 4), label="eps=0.5", **RMS)
    t.module("RMSNorm", dict(dim=5), t.randn(2, 4, 5) + 3.0, label="inputs with a large mean", **RMS)
    t.module("RMSNorm", dict(dim=8), t.randn(2, 2, 3, 8, dtype=torch.float64), dtype=torch.float64,
             label="float64, 4 dimensions", **RMS)
    t.module("RMSNorm", dict(dim=6), t.randn(3, 6), grad=True, label="gradients", **RMS)


def _rope(x, positions, base=10000.0, how="ok"):
    d = x.shape[-1]
    expo = torch.arange(0, d, 2, dtype=torch.float64) / d if how != "i_over_d" else \
        torch.arange(0, d // 2, dtype=torch.float64) / d
    theta = (10000.0 if how == "base_ignored" else base) ** (-expo)
    pos = torch.arange(x.shape[-2]) if how == "positions_ignored" else positions
    angles = pos.to(torch.float64)[:, None] * theta
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if how == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    a, b = x[..., :d // 2], x[..., d // 2:]
    if how == "clockwise":
        return torch.cat([a * cos + b * sin, -a * sin + b * cos], dim=-1)
    if how == "halves_swapped":
        return torch.cat([a * sin + b * cos, a * cos - b * sin], dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


ROPE_MISTAKES = [
    Mistake("neighbouring pairs (2i, 2i+1) rotated (Chapter 4's interleaved layout): here feature i pairs with "
            "feature i + d/2", lambda x, positions, base=10000.0: _rope(x, positions, base, "interleaved")),
    Mistake("the positions argument is ignored: row n is rotated by positions[n], not by n",
            lambda x, positions, base=10000.0: _rope(x, positions, base, "positions_ignored")),
    Mistake("rotated clockwise (the sign of sin flipped): out_i = a cos - b sin, out_(i+d/2) = a sin + b cos",
            lambda x, positions, base=10000.0: _rope(x, positions, base, "clockwise")),
    Mistake("the two rotated halves were concatenated in the wrong order: first a cos - b sin, then a sin + b cos",
            lambda x, positions, base=10000.0: _rope(x, positions, base, "halves_swapped")),
    Mistake("the base argument is ignored: theta_i = base ** (-2i / d)",
            lambda x, positions, base=10000.0: _rope(x, positions, base, "base_ignored")),
    Mistake("frequencies base ** (-i / d) instead of base ** (-2i / d)",
            lambda x, positions, base=10000.0: _rope(x, positions, base, "i_over_d")),
]


@hidden.test("test_apply_rope_halves")
def _(t):
    t.function("apply_rope_halves", t.randn(2, 5, 8), torch.arange(5), mistakes=ROPE_MISTAKES,
               label="(2, 5, 8), positions 0..4")
    t.function("apply_rope_halves", t.randn(3, 4, 6), torch.tensor([7, 8, 9, 10]), base=100.0,
               mistakes=ROPE_MISTAKES, label="positions 7..10, base=100")
    t.function("apply_rope_halves", t.randn(2, 3, 1, 4), torch.tensor([13]), mistakes=ROPE_MISTAKES,
               label="one position (13), 4 dimensions")
    t.function("apply_rope_halves", t.randn(4, 12, dtype=torch.float64), torch.tensor([0, 2, 5, 40]), base=500.0,
               mistakes=ROPE_MISTAKES, label="float64, positions not consecutive")
    t.function("apply_rope_halves", t.randn(2, 3, 6), torch.arange(3, 6), grad=True, mistakes=ROPE_MISTAKES,
               label="gradients")


def _attn(m, x, past=None, qk_norm="before", heads="group", scale="head", offset=True, store="rotated",
          cache_order="past_first", mask_offset=0, cache_mask=True):
    B, N, _ = x.shape
    h, h_kv, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x).view(B, N, h, d).transpose(1, 2)
    k = m.k_proj(x).view(B, N, h_kv, d).transpose(1, 2)
    v = m.v_proj(x).view(B, N, h_kv, d).transpose(1, 2)
    P = 0 if past is None else past[0].size(2)
    pos = torch.arange(P, P + N) if offset else torch.arange(N)
    if qk_norm == "before":
        q, k = m.q_norm(q), m.k_norm(k)
        q_r, k_r = ref.apply_rope_halves(q, pos, m.rope_base), ref.apply_rope_halves(k, pos, m.rope_base)
    elif qk_norm == "after":
        q_r = m.q_norm(ref.apply_rope_halves(q, pos, m.rope_base))
        k_r = m.k_norm(ref.apply_rope_halves(k, pos, m.rope_base))
    elif qk_norm == "swapped":
        q_r = ref.apply_rope_halves(m.k_norm(q), pos, m.rope_base)
        k_r = ref.apply_rope_halves(m.q_norm(k), pos, m.rope_base)
    else:
        q_r, k_r = ref.apply_rope_halves(q, pos, m.rope_base), ref.apply_rope_halves(k, pos, m.rope_base)
    k_cached = k_r if store == "rotated" else k
    if past is not None:
        if cache_order == "past_first":
            k_all, v_all = torch.cat([past[0], k_r], 2), torch.cat([past[1], v], 2)
            k_store = torch.cat([past[0], k_cached], 2)
        else:
            k_all, v_all = torch.cat([k_r, past[0]], 2), torch.cat([v, past[1]], 2)
            k_store = torch.cat([k_cached, past[0]], 2)
    else:
        k_all, v_all, k_store = k_r, v, k_cached
    g = h // h_kv
    if heads == "group":
        k_rep, v_rep = k_all.repeat_interleave(g, 1), v_all.repeat_interleave(g, 1)
    else:                                                   # query head i reads key head i % h_kv
        k_rep, v_rep = k_all.repeat(1, g, 1, 1), v_all.repeat(1, g, 1, 1)
    s = q_r @ k_rep.transpose(-2, -1)
    s = s / {"head": math.sqrt(d), "model": math.sqrt(x.size(-1)), "none": 1.0, "qdim": math.sqrt(h * d)}[scale]
    T = k_all.size(2)
    diagonal = (T - N if cache_mask else 0) + mask_offset
    s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=diagonal), float("-inf"))
    y = (s.softmax(-1) @ v_rep).transpose(1, 2).reshape(B, N, h * d)
    return m.o_proj(y), (k_store, v_all)


def _attn_with(**change):
    return lambda m, x, past=None: _attn(m, x, past, **change)


ATTN_MISTAKES = [
    Mistake("QK-norm skipped: normalise each query head with q_norm and each key head with k_norm",
            _attn_with(qk_norm="none")),
    Mistake("QK-norm applied after the rotation: Qwen3 normalises each head first, then rotates it",
            _attn_with(qk_norm="after")),
    Mistake("q_norm and k_norm swapped: q_norm is for the queries, k_norm for the keys",
            _attn_with(qk_norm="swapped")),
    Mistake("query head i read key/value head i % num_kv_heads: it reads head i // (num_heads // num_kv_heads) "
            "(repeat_interleave, not repeat)", _attn_with(heads="modulo")),
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(head_dim)", _attn_with(scale="model")),
    Mistake("scores scaled by 1/sqrt(num_heads * head_dim): scale by 1/sqrt(head_dim)", _attn_with(scale="qdim")),
    Mistake("scores not scaled by 1/sqrt(head_dim)", _attn_with(scale="none")),
    Mistake("positions restart at 0 with a cache: the new tokens are rotated at positions P .. P+N-1, "
            "P = past[0].size(2)", _attn_with(offset=False)),
    Mistake("the cached keys were stored before the rotation: present holds the keys after normalisation AND "
            "rotation", _attn_with(store="raw")),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new keys and values",
            _attn_with(cache_order="new_first")),
    *[Mistake("the causal mask is off by one: the query at position p attends to keys 0 .. p, itself included",
              _attn_with(mask_offset=o)) for o in (-1, 1)],
]
ATTN = dict(mistakes=ATTN_MISTAKES, deps=("RMSNorm", "apply_rope_halves"), returns=("y", "present"))


def _kv_past(t, B, h_kv, P, d, dtype=torch.float32):
    return (t.randn(B, h_kv, P, d, dtype=dtype), t.randn(B, h_kv, P, d, dtype=dtype))


def _close_all(a, b):
    if isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and all(_close_all(x, y) for x, y in zip(a, b))
    return close(a, b)


def _judge_part(index):
    """Judge one returned value of (y, present) only: each test judges its own property."""
    return lambda student, expected: isinstance(student, (tuple, list)) and len(student) == len(expected) \
        and _close_all(student[index], expected[index])


def _state(t, name, init, dtype=torch.float32):
    """Random parameter values for the reference class `name`, as a probe of a given helper passes them."""
    return {n: t.randn(*p.shape, dtype=dtype) * 0.5 for n, p in getattr(ref, name)(**init).named_parameters()}


def _steps_with(**change):
    """attention_steps_gap for the reference layer with a mistake: (present, gap) as the helper returns them."""
    def compute(init, state, x, split):
        m = ref.built_with(ref.ModernAttention, init, state, x.dtype)
        y_all, _ = _attn(m, x, **change)
        y_first, past = _attn(m, x[:, :split], **change)
        y_rest, present = _attn(m, x[:, split:], past, **change)
        return present, ref.relative_gap(torch.cat([y_first, y_rest], dim=1), y_all)
    return compute


def _steps_hint(probe, value):
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], torch.Tensor) \
            and value[1].numel() == 1 and not value[1].item() < 1e-4:
        return (f"a prefix call and then the rest with the cache give another output than one call on all tokens "
                f"(largest relative difference {value[1].item():.1e}): rotate the new queries at positions "
                f"P .. P+N-1 and mask with tril(diagonal=P) on the (N, P+N) grid")
    return None


STEPS_MISTAKES = [
    Mistake("positions restart at 0 with a cache: the new tokens are rotated at positions P .. P+N-1, "
            "P = past[0].size(2)", _steps_with(offset=False)),
    Mistake("the cached keys were stored before the rotation: present holds the keys after normalisation AND "
            "rotation", _steps_with(store="raw")),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new keys and values",
            _steps_with(cache_order="new_first")),
    Mistake("the causal mask ignores the cache: on the (N, P+N) grid of a call with a cache, the query at "
            "position P+n sees keys 0 .. P+n (tril(diagonal=P))", _steps_with(cache_mask=False)),
]


@hidden.test("test_ModernAttention_no_cache")
def _(t):
    t.module("ModernAttention", dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0),
             t.randn(2, 5, 16), label="4 query heads, 2 key/value heads, head_dim 6", **ATTN)
    t.module("ModernAttention", dict(d_model=12, num_heads=6, num_kv_heads=3, head_dim=4), t.randn(1, 7, 12),
             label="6 query heads, 3 key/value heads", **ATTN)
    t.module("ModernAttention", dict(d_model=8, num_heads=4, num_kv_heads=1, head_dim=8, eps=0.1),
             t.randn(2, 4, 8), label="one key/value head (MQA), eps=0.1", **ATTN)
    t.module("ModernAttention", dict(d_model=8, num_heads=2, num_kv_heads=2, head_dim=4), t.randn(3, 5, 8),
             label="as many key/value heads as query heads (MHA)", **ATTN)
    t.module("ModernAttention", dict(d_model=12, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=30.0),
             t.randn(2, 6, 12, dtype=torch.float64), dtype=torch.float64, label="float64", **ATTN)
    t.module("ModernAttention", dict(d_model=8, num_heads=4, num_kv_heads=2, head_dim=4), t.randn(2, 4, 8),
             grad=True, label="gradients", **ATTN)


@hidden.test("test_ModernAttention_cache")
def _(t):
    # The cache's contents, against the reference's (the output with a random past also depends on
    # the head mapping and the scale, which test_ModernAttention_no_cache judges) ...
    present = dict(ATTN, equivalent=_judge_part(1))
    t.module("ModernAttention", dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0),
             t.randn(2, 1, 16), _kv_past(t, 2, 2, 6, 6), label="one new token, a cache of 6", **present)
    t.module("ModernAttention", dict(d_model=12, num_heads=6, num_kv_heads=2, head_dim=4, rope_base=50.0),
             t.randn(3, 3, 12), _kv_past(t, 3, 2, 4, 4), label="3 new tokens, a cache of 4", **present)
    t.module("ModernAttention", dict(d_model=8, num_heads=2, num_kv_heads=1, head_dim=4), t.randn(1, 2, 8),
             past=_kv_past(t, 1, 1, 9, 4), label="2 new tokens, a cache of 9 (past as a keyword)", **present)
    # ... and the cache's use: your layer in two calls against your layer in one (attention_steps_gap).
    def steps(init, shape, split, dtype=torch.float32, label=""):
        t.function("attention_steps_gap", init, _state(t, "ModernAttention", init, dtype),
                   t.randn(*shape, dtype=dtype), split, mistakes=STEPS_MISTAKES, checks=(_steps_hint,),
                   deps=("RMSNorm", "apply_rope_halves"), returns=("present", "gap"), label=label)
    steps(dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0), (2, 7, 16), 5,
          label="5 tokens, then 2 with the cache")
    steps(dict(d_model=12, num_heads=6, num_kv_heads=2, head_dim=4, rope_base=50.0), (1, 9, 12), 8,
          label="8 tokens, then 1 with the cache")
    steps(dict(d_model=8, num_heads=4, num_kv_heads=1, head_dim=4), (2, 6, 8), 3, torch.float64,
          label="3 tokens, then 3 with the cache, float64")


def _swiglu(m, x, how="ok"):
    g, u = m.gate_proj(x), m.up_proj(x)
    if how == "swapped":
        return m.down_proj(F.silu(u) * g)
    if how == "gelu":
        return m.down_proj(F.gelu(g) * u)
    if how == "gelu_tanh":
        return m.down_proj(F.gelu(g, approximate="tanh") * u)
    if how == "sigmoid":
        return m.down_proj(torch.sigmoid(g) * u)
    if how == "relu":
        return m.down_proj(F.relu(g) * u)
    if how == "no_gate":
        return m.down_proj(F.silu(g))
    if how == "both":
        return m.down_proj(F.silu(g) * F.silu(u))
    raise ValueError(how)


SWIGLU_MISTAKES = [
    Mistake("gate and up swapped: the SiLU goes on gate_proj(x), which multiplies up_proj(x)",
            lambda m, x: _swiglu(m, x, "swapped")),
    *[Mistake("GELU instead of SiLU: SwiGLU's gate is silu(z) = z * sigmoid(z)",
              lambda m, x, how=how: _swiglu(m, x, how)) for how in ("gelu", "gelu_tanh")],
    Mistake("sigmoid instead of SiLU (that is GLU): the gate is silu(z) = z * sigmoid(z)",
            lambda m, x: _swiglu(m, x, "sigmoid")),
    Mistake("ReLU instead of SiLU (that is ReGLU): the gate is silu(z) = z * sigmoid(z)",
            lambda m, x: _swiglu(m, x, "relu")),
    Mistake("up_proj is not used: multiply silu(gate_proj(x)) by up_proj(x)", lambda m, x: _swiglu(m, x, "no_gate")),
    Mistake("SiLU applied to both projections: only gate_proj(x) goes through the SiLU",
            lambda m, x: _swiglu(m, x, "both")),
]


@hidden.test("test_SwiGLU")
def _(t):
    t.module("SwiGLU", dict(d_model=6, d_ff=10), t.randn(3, 4, 6), mistakes=SWIGLU_MISTAKES, label="(3, 4, 6)")
    t.module("SwiGLU", dict(d_model=4, d_ff=3), t.randn(5, 4) * 3, mistakes=SWIGLU_MISTAKES, label="d_ff < d_model")
    t.module("SwiGLU", dict(d_model=8, d_ff=16), t.randn(2, 3, 8, dtype=torch.float64), dtype=torch.float64,
             mistakes=SWIGLU_MISTAKES, label="float64")
    t.module("SwiGLU", dict(d_model=6, d_ff=8), t.randn(2, 6), grad=True, mistakes=SWIGLU_MISTAKES, label="gradients")


def _mla(m, x, past=None, absorb=False, store="latent", rope_on="rope_part", scale="qk", offset=True,
         rope_slice="last", cache_order="past_first"):
    B, N, _ = x.shape
    h, r, dn, dr, dv = m.num_heads, m.kv_rank, m.nope_dim, m.rope_dim, m.v_dim
    if past is not None and store == "full":
        raise ValueError("a full-key cache cannot read a latent past")
    P = 0 if past is None else past[0].size(1)
    pos = torch.arange(P, P + N) if offset else torch.arange(N)
    rot = lambda z: ref.apply_rope_halves(z, pos, m.rope_base)   # noqa: E731
    q = m.q_proj(x).view(B, N, h, dn + dr).transpose(1, 2)
    if rope_slice == "last":
        q_nope, q_rope = q[..., :dn], q[..., dn:]
    else:                                                   # the first rope_dim features rotated
        q_rope, q_nope = q[..., :dr], q[..., dr:]
    c_new = m.kv_norm(m.kv_down(x))
    kr_new = rot(m.k_rope_proj(x))
    if rope_on == "latent":
        c_new = rot(c_new)
    if past is not None:
        if cache_order == "past_first":
            c, kr = torch.cat([past[0], c_new], 1), torch.cat([past[1], kr_new], 1)
        else:
            c, kr = torch.cat([c_new, past[0]], 1), torch.cat([kr_new, past[1]], 1)
    else:
        c, kr = c_new, kr_new
    T = c.size(1)
    k_nope = m.k_up(c).view(B, T, h, dn).transpose(1, 2)
    if rope_on == "all":                                    # rotary positions on the up-projected keys too
        k_nope = ref.apply_rope_halves(k_nope, torch.arange(T), m.rope_base)
        q_nope = rot(q_nope)
    q_rope = rot(q_rope)
    s = q_nope @ k_nope.transpose(-2, -1) + q_rope @ kr[:, None].transpose(-2, -1)
    s = s / {"qk": math.sqrt(dn + dr), "nope": math.sqrt(dn), "v": math.sqrt(dv), "rank": math.sqrt(r),
             "none": 1.0}[scale]
    s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=T - N), float("-inf"))
    v = m.v_up(c).view(B, T, h, dv).transpose(1, 2)
    y = m.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, h * dv))
    if store == "full":
        return y, (k_nope, v)
    if store == "full_keys":
        return y, (torch.cat([k_nope, kr[:, None].expand(B, h, T, dr)], -1), v)
    return y, (c, kr)


def _mla_with(**change):
    return lambda m, x, past=None, absorb=False: _mla(m, x, past, absorb, **change)


MLA_MISTAKES = [
    *[Mistake("the cache holds the up-projected keys and values: MLA caches only the latent c = kv_norm(kv_down(x)) "
              "(B, T, kv_rank) and the shared rotary key (B, T, rope_dim)", _mla_with(store=s))
      for s in ("full", "full_keys")],
    Mistake("rotary positions applied to the compressed part: rotate only the last rope_dim features of each "
            "query head and k_rope; the latent and the up-projected keys carry no position", _mla_with(rope_on="latent")),
    Mistake("rotary positions applied to the compressed part: rotate only the last rope_dim features of each "
            "query head and k_rope; the latent and the up-projected keys carry no position", _mla_with(rope_on="all")),
    Mistake("the FIRST rope_dim features of each query head were rotated: the first nope_dim features are the "
            "content part, the last rope_dim the rotary part", _mla_with(rope_slice="first")),
    *[Mistake("wrong scale: the scores of head i are q_i . k_i over nope_dim + rope_dim features, so scale by "
              "1/sqrt(nope_dim + rope_dim)", _mla_with(scale=s)) for s in ("nope", "v", "rank", "none")],
    Mistake("positions restart at 0 with a cache: rotate the new queries and keys at positions P .. P+N-1, "
            "P = past[0].size(1)", _mla_with(offset=False)),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new entries, along dim 1",
            _mla_with(cache_order="new_first")),
]
MLA = dict(mistakes=MLA_MISTAKES, deps=("RMSNorm", "apply_rope_halves"), returns=("y", "present"))
SMALL_MLA = dict(d_model=16, num_heads=4, kv_rank=6, nope_dim=5, rope_dim=4, v_dim=3, rope_base=100.0)


def _latent_past(t, B, P, r, dr, dtype=torch.float32):
    return (t.randn(B, P, r, dtype=dtype), t.randn(B, P, dr, dtype=dtype))


@hidden.test("test_MultiHeadLatentAttention_cache")
def _(t):
    cache = dict(MLA, equivalent=_judge_part(1))       # the cache's contents; the output is the values test's
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(2, 7, 16), label="no cache", **cache)
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(2, 2, 16), _latent_past(t, 2, 5, 6, 4),
             label="2 new tokens, a cache of 5", **cache)
    t.module("MultiHeadLatentAttention", dict(d_model=8, num_heads=2, kv_rank=3, nope_dim=4, rope_dim=2, v_dim=4),
             t.randn(1, 1, 8), _latent_past(t, 1, 8, 3, 2), label="one new token, a cache of 8", **cache)


@hidden.test("test_MultiHeadLatentAttention_values")
def _(t):
    values = dict(MLA, equivalent=_judge_part(0))      # the output; the cache is the cache test's
    t.module("MultiHeadLatentAttention", dict(d_model=16, num_heads=3, kv_rank=8, nope_dim=6, rope_dim=4, v_dim=5,
                                              rope_base=50.0), t.randn(2, 9, 16), label="3 heads, no cache", **values)
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(3, 3, 16), _latent_past(t, 3, 4, 6, 4),
             label="3 new tokens, a cache of 4", **values)
    t.module("MultiHeadLatentAttention", dict(d_model=12, num_heads=2, kv_rank=4, nope_dim=2, rope_dim=6, v_dim=7),
             t.randn(2, 5, 12, dtype=torch.float64), _latent_past(t, 2, 3, 4, 6, dtype=torch.float64),
             dtype=torch.float64, label="float64, rope_dim > nope_dim", **values)
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(2, 4, 16), grad=True, label="gradients", **values)


def _absorb_hint(probe, value):
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(g, torch.Tensor) and g.numel() == 1 for g in value)):
        return None
    if not value[0].item() < 1e-4:
        return (f"absorb=True gives another output than absorb=False of your own layer (largest relative "
                f"difference {value[0].item():.1e}): the absorbed scores are (q_nope @ W_k) @ c^T plus the same "
                f"rotary scores, and the weighted sum of latents is multiplied by v_up's weight transposed")
    if not value[1].item() < 1e-4:
        return "absorb=True returns another cache than absorb=False: the cache is the same (c, k_rope) in both forms"
    return None


@hidden.test("test_MultiHeadLatentAttention_absorb",
             max_memory=(96 * 2**20, "absorb=True up-projected the cached latents to keys or values (self.k_up or "
                                     "self.v_up on the cache): fold k_up's weight into the query and apply v_up's "
                                     "weight after the weighted sum"))
def _(t):
    # Absorption judged as what it is: your absorb=True against your own absorb=False (absorption_gap),
    # so that a mistake both forms share (a scale, the cache) is judged by the values and cache tests only.
    def both_forms(init, x, past=None, dtype=torch.float32, label=""):
        t.function("absorption_gap", init, _state(t, "MultiHeadLatentAttention", init, dtype),
                   t.randn(*x, dtype=dtype), None if past is None else _latent_past(t, *past, dtype=dtype),
                   checks=(_absorb_hint,), deps=("RMSNorm", "apply_rope_halves"), returns=("output gap", "cache gap"),
                   label=label)
    both_forms(SMALL_MLA, (2, 6, 16), label="absorb=True against absorb=False, no cache")
    both_forms(dict(d_model=12, num_heads=3, kv_rank=6, nope_dim=4, rope_dim=2, v_dim=6), (2, 2, 12), (2, 6, 6, 2),
               label="absorb=True against absorb=False, a cache of 6")
    both_forms(SMALL_MLA, (1, 3, 16), (1, 4, 6, 4), torch.float64, label="absorb=True against absorb=False, float64")
    # The memory rule's probe: a long cache, where up-projecting it shows. Its values are the
    # values test's; here the returned shapes only.
    big = dict(d_model=16, num_heads=64, kv_rank=16, nope_dim=32, rope_dim=8, v_dim=32)
    t.module("MultiHeadLatentAttention", big, t.randn(1, 1, 16), _latent_past(t, 1, 16384, 16, 8), absorb=True,
             label="absorb=True, 64 heads, one new token, a cache of 16384",
             **dict(MLA, equivalent=lambda student, expected: True))


def _window(n, window, num_sinks=0, how="ok"):
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    if how == "off_by_one":
        return (j <= i) & ((i - j <= window) | (j < num_sinks))
    if how == "short_by_one":
        return (j <= i) & ((i - j < window - 1) | (j < num_sinks))
    if how == "no_sinks":
        return (j <= i) & (i - j < window)
    if how == "sinks_not_causal":
        return ((j <= i) & (i - j < window)) | (j < num_sinks)
    if how == "sinks_inclusive":
        return (j <= i) & ((i - j < window) | (j <= num_sinks))
    if how == "not_causal":
        return ((i - j).abs() < window) | (j < num_sinks)
    raise ValueError(how)


WINDOW_MISTAKES = [
    Mistake("the window is off by one: query i sees itself and the window - 1 tokens before it (i - j < window), "
            "window tokens in all", lambda n, w, s=0: _window(n, w, s, "off_by_one")),
    Mistake("the window is off by one: query i sees itself and the window - 1 tokens before it (i - j < window), "
            "window tokens in all", lambda n, w, s=0: _window(n, w, s, "short_by_one")),
    Mistake("the sinks are missing: the first num_sinks tokens stay visible to every later query",
            lambda n, w, s=0: _window(n, w, s, "no_sinks")),
    Mistake("the sinks are visible to earlier queries: the mask stays causal, j <= i, for the sinks too",
            lambda n, w, s=0: _window(n, w, s, "sinks_not_causal")),
    Mistake("one sink too many: the sinks are the tokens j < num_sinks",
            lambda n, w, s=0: _window(n, w, s, "sinks_inclusive")),
    Mistake("the mask is not causal: a query never sees a later key (j <= i)",
            lambda n, w, s=0: _window(n, w, s, "not_causal")),
]


@hidden.test("test_sliding_window_mask")
def _(t):
    t.function("sliding_window_mask", 8, 3, mistakes=WINDOW_MISTAKES, label="n=8, window=3")
    t.function("sliding_window_mask", 10, 4, 2, mistakes=WINDOW_MISTAKES, label="n=10, window=4, 2 sinks")
    t.function("sliding_window_mask", 9, 2, num_sinks=3, mistakes=WINDOW_MISTAKES,
               label="n=9, window=2, 3 sinks (keyword)")
    t.function("sliding_window_mask", 5, 8, 1, mistakes=WINDOW_MISTAKES, label="window longer than n")
    t.function("sliding_window_mask", 6, 1, mistakes=WINDOW_MISTAKES, label="window=1: each query sees itself")


def _evict(k, v, num_sinks, window, how="ok"):
    T = k.size(2)
    if how == "no_sinks":
        keep = torch.arange(max(T - window, 0), T)
    elif how == "no_sinks_total":
        keep = torch.arange(max(T - window - num_sinks, 0), T)
    elif how == "reversed":
        keep = torch.cat([torch.arange(T - window, T), torch.arange(num_sinks)]) if T > num_sinks + window \
            else torch.arange(T)
    elif how in ("window_minus", "window_plus"):
        w = window - 1 if how == "window_minus" else window + 1
        keep = torch.cat([torch.arange(num_sinks), torch.arange(T - w, T)]) if T > num_sinks + w else torch.arange(T)
    elif how == "always":
        keep = torch.cat([torch.arange(min(num_sinks, T)), torch.arange(max(T - window, 0), T)])
    elif how == "flipped":
        keep = torch.cat([torch.arange(num_sinks), torch.arange(T - window, T)]).flip(0) \
            if T > num_sinks + window else torch.arange(T)
    else:
        raise ValueError(how)
    return k[:, :, keep], v[:, :, keep]


EVICT_MISTAKES = [
    Mistake("the sink tokens were dropped on eviction: keep positions 0 .. num_sinks-1 as well as the last window",
            lambda k, v, s, w: _evict(k, v, s, w, "no_sinks")),
    Mistake("the sink tokens were dropped on eviction: keep positions 0 .. num_sinks-1 as well as the last window",
            lambda k, v, s, w: _evict(k, v, s, w, "no_sinks_total")),
    Mistake("eviction order reversed: the sinks come first, then the recent tokens, oldest first",
            lambda k, v, s, w: _evict(k, v, s, w, "reversed")),
    Mistake("eviction order reversed: the sinks come first, then the recent tokens, oldest first",
            lambda k, v, s, w: _evict(k, v, s, w, "flipped")),
    *[Mistake("the window is off by one: keep exactly the last `window` positions after the sinks",
              lambda k, v, s, w, how=how: _evict(k, v, s, w, how)) for how in ("window_minus", "window_plus")],
    Mistake("positions were duplicated or dropped when the cache still fits: return it unchanged when "
            "T <= num_sinks + window", lambda k, v, s, w: _evict(k, v, s, w, "always")),
]


@hidden.test("test_evict_to_sinks")
def _(t):
    t.function("evict_to_sinks", t.randn(2, 3, 12, 4), t.randn(2, 3, 12, 4), 2, 5, mistakes=EVICT_MISTAKES,
               label="T=12, 2 sinks, window 5")
    t.function("evict_to_sinks", t.randn(1, 2, 20, 3), t.randn(1, 2, 20, 3), 4, 6, mistakes=EVICT_MISTAKES,
               label="T=20, 4 sinks, window 6")
    t.function("evict_to_sinks", t.randn(2, 2, 6, 3), t.randn(2, 2, 6, 3), 2, 5, mistakes=EVICT_MISTAKES,
               label="T=6 fits in 2 sinks + 5: unchanged")
    t.function("evict_to_sinks", t.randn(1, 1, 7, 2), t.randn(1, 1, 7, 2), 2, 5, mistakes=EVICT_MISTAKES,
               label="T=7 = 2 sinks + 5 exactly: unchanged")
    t.function("evict_to_sinks", t.randn(1, 2, 9, 4), t.randn(1, 2, 9, 4), 0, 4, mistakes=EVICT_MISTAKES,
               label="no sinks (a plain window)")
    t.function("evict_to_sinks", t.randn(1, 2, 11, 4, dtype=torch.float64), t.randn(1, 2, 11, 4, dtype=torch.float64),
               3, 4, mistakes=EVICT_MISTAKES, label="float64, T=11, 3 sinks, window 4")
    t.function("evict_to_sinks", t.randn(1, 2, 7, 8), t.randn(1, 2, 7, 8), 1, 4, mistakes=EVICT_MISTAKES,
               label="T=7, 1 sink, window 4, d=8: evict as soon as T > num_sinks + window")


def _paged(query, k_cache, v_cache, block_table, seq_lens, how="ok"):
    B, H, d = query.shape
    bs = k_cache.size(2)
    out = []
    for b in range(B):
        L = int(seq_lens[b])
        n_blocks = -(-L // bs)
        if how == "logical":
            blocks = torch.arange(n_blocks)
        elif how == "table_plus_one":
            blocks = block_table[b, 1:n_blocks + 1]
        elif how == "block_plus_one":
            blocks = (block_table[b, :n_blocks] + 1) % k_cache.size(0)
        else:
            blocks = block_table[b, :n_blocks]
        k = k_cache[blocks].transpose(0, 1).reshape(H, -1, d)
        v = v_cache[blocks].transpose(0, 1).reshape(H, -1, d)
        if how != "past_len":
            k, v = k[:, :L], v[:, :L]
        if how == "len_minus_one":
            k, v = k[:, :L - 1], v[:, :L - 1]
        s = (k @ query[b][:, :, None]).squeeze(-1) / (d if how == "scale_d" else 1.0 if how == "no_scale"
                                                       else math.sqrt(d))
        out.append((s.softmax(-1)[:, None] @ v).squeeze(1))
    return torch.stack(out)


PAGED_MISTAKES = [
    Mistake("the logical block index was used as the physical block: token t is in block block_table[b, t // "
            "block_size], not in block t // block_size", lambda *a: _paged(*a, how="logical")),
    Mistake("the block table was read off by one: token t is in block block_table[b, t // block_size]",
            lambda *a: _paged(*a, how="table_plus_one")),
    Mistake("the block table was read off by one: token t is in block block_table[b, t // block_size]",
            lambda *a: _paged(*a, how="block_plus_one")),
    Mistake("keys past seq_lens[b] were read: the slots after a sequence's last token hold stale values; attend "
            "to the first seq_lens[b] only", lambda *a: _paged(*a, how="past_len")),
    Mistake("the last cached token was left out: attend to all seq_lens[b] keys, 0 .. seq_lens[b]-1",
            lambda *a: _paged(*a, how="len_minus_one")),
    Mistake("scores scaled by 1/d: scale by 1/sqrt(d)", lambda *a: _paged(*a, how="scale_d")),
    Mistake("scores not scaled by 1/sqrt(d)", lambda *a: _paged(*a, how="no_scale")),
]


def _pool(t, num_blocks, H, bs, d, lens, dtype=torch.float32, shared=0):
    """A pool full of random (stale) values and a block table with shuffled blocks; padding entries are 0."""
    k, v = t.randn(num_blocks, H, bs, d, dtype=dtype) * 3, t.randn(num_blocks, H, bs, d, dtype=dtype)
    order = torch.randperm(num_blocks, generator=t.gen).tolist()
    width = max(-(-n // bs) for n in lens)
    table = torch.zeros(len(lens), width, dtype=torch.long)
    prefix = [order.pop() for _ in range(shared)]
    for b, n in enumerate(lens):
        blocks = prefix + [order.pop() for _ in range(-(-n // bs) - shared)]
        table[b, :len(blocks)] = torch.tensor(blocks)
    return k, v, table, torch.tensor(lens)


@hidden.test("test_paged_attention")
def _(t):
    k, v, table, lens = _pool(t, 16, 2, 4, 3, [9, 4, 1, 6])
    t.function("paged_attention", t.randn(4, 2, 3), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="4 sequences of lengths 9, 4, 1, 6, blocks of 4")
    k, v, table, lens = _pool(t, 20, 3, 8, 4, [17, 30, 8], shared=2)
    t.function("paged_attention", t.randn(3, 3, 4), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="3 sequences sharing their first 2 blocks")
    k, v, table, lens = _pool(t, 10, 1, 5, 6, [23])
    t.function("paged_attention", t.randn(1, 1, 6), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="one sequence of 23 tokens, blocks of 5")
    k, v, table, lens = _pool(t, 12, 2, 3, 4, [7, 2], dtype=torch.float64)
    t.function("paged_attention", t.randn(2, 2, 4, dtype=torch.float64), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="float64")
