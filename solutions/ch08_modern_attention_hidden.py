"""Hidden tests (instructor-only) for chapter 08_modern_attention.

generated from course/08_modern_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn.functional as F

import solutions.ch08_modern_attention as ref
from autograder.hidden import HiddenTests, Mistake, close

hidden = HiddenTests(ref, from_scratch={"ModernAttention", "MultiHeadLatentAttention"})


# The reference: m.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps). Each mistake
# below is that line with one thing changed.
def _rms_without_eps(m, x):
    return m.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True))


def _rms_eps_outside_the_root(m, x):
    return m.weight * x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + m.eps)


def _rms_centred(m, x):
    c = x - x.mean(-1, keepdim=True)
    return m.weight * c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + m.eps)


def _rms_mean_over(dim):
    """The mean of x**2 over dimension ``dim`` instead of the last."""
    return lambda m, x: m.weight * x / torch.sqrt(x.pow(2).mean(dim, keepdim=True) + m.eps)


def _rms_mean_over_everything(m, x):
    return m.weight * x / torch.sqrt(x.pow(2).mean() + m.eps)


def _rms_without_root(m, x):
    return m.weight * x / (x.pow(2).mean(-1, keepdim=True) + m.eps)


def _rms_without_weight(m, x):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)


def _rms_sum_of_squares(m, x):
    return m.weight * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + m.eps)


RMS_MISTAKES = [
    Mistake("eps left out: divide by sqrt(mean(x**2) + eps)", _rms_without_eps),
    Mistake("eps added outside the square root: divide by sqrt(mean(x**2) + eps)", _rms_eps_outside_the_root),
    Mistake("the mean was subtracted (LayerNorm): RMSNorm does not centre, it divides x itself by its root mean "
            "square", _rms_centred),
    *[Mistake("the mean of x**2 was taken over the wrong axis: one value per vector, over the LAST dimension",
              _rms_mean_over(dim)) for dim in (0, 1, -2)],
    Mistake("the mean of x**2 was taken over the whole tensor: one value per vector, over the last dimension "
            "(mean(dim=-1, keepdim=True))", _rms_mean_over_everything),
    Mistake("the square root is missing: divide by sqrt(mean(x**2) + eps), not by the mean square",
            _rms_without_root),
    Mistake("self.weight is not applied: multiply the normalised x by self.weight", _rms_without_weight),
    Mistake("the sum of x**2 instead of its mean: divide by the ROOT MEAN square", _rms_sum_of_squares),
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


# The reference in three steps (frequencies, angles, the rotation of the two halves); each
# mistake below changes one of them.
def _frequencies(d, base):
    """theta_i = base ** (-2i / d), i = 0 .. d/2 - 1, in float64."""
    return base ** (-(torch.arange(0, d, 2, dtype=torch.float64) / d))


def _cos_sin(x, positions, theta):
    angles = positions.to(torch.float64)[:, None] * theta
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _halves(x):
    d = x.shape[-1]
    return x[..., :d // 2], x[..., d // 2:]


def _rotated(x, cos, sin):
    """Feature i and feature i + d/2 rotated counter-clockwise by their angle."""
    a, b = _halves(x)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _rope(x, positions, base=10000.0):
    return _rotated(x, *_cos_sin(x, positions, _frequencies(x.shape[-1], base)))


def _rope_interleaved(x, positions, base=10000.0):
    cos, sin = _cos_sin(x, positions, _frequencies(x.shape[-1], base))
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rope_positions_ignored(x, positions, base=10000.0):
    return _rope(x, torch.arange(x.shape[-2]), base)


def _rope_clockwise(x, positions, base=10000.0):
    cos, sin = _cos_sin(x, positions, _frequencies(x.shape[-1], base))
    a, b = _halves(x)
    return torch.cat([a * cos + b * sin, -a * sin + b * cos], dim=-1)


def _rope_halves_swapped(x, positions, base=10000.0):
    cos, sin = _cos_sin(x, positions, _frequencies(x.shape[-1], base))
    a, b = _halves(x)
    return torch.cat([a * sin + b * cos, a * cos - b * sin], dim=-1)


def _rope_base_ignored(x, positions, base=10000.0):
    return _rope(x, positions, 10000.0)


def _rope_i_over_d(x, positions, base=10000.0):
    d = x.shape[-1]
    return _rotated(x, *_cos_sin(x, positions, base ** (-(torch.arange(0, d // 2, dtype=torch.float64) / d))))


ROPE_MISTAKES = [
    Mistake("neighbouring pairs (2i, 2i+1) rotated (Chapter 4's interleaved layout): here feature i pairs with "
            "feature i + d/2", _rope_interleaved),
    Mistake("the positions argument is ignored: row n is rotated by positions[n], not by n", _rope_positions_ignored),
    Mistake("rotated clockwise (the sign of sin flipped): out_i = a cos - b sin, out_(i+d/2) = a sin + b cos",
            _rope_clockwise),
    Mistake("the two rotated halves were concatenated in the wrong order: first a cos - b sin, then a sin + b cos",
            _rope_halves_swapped),
    Mistake("the base argument is ignored: theta_i = base ** (-2i / d)", _rope_base_ignored),
    Mistake("frequencies base ** (-i / d) instead of base ** (-2i / d)", _rope_i_over_d),
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


# The reference forward in named steps; `_attention` takes each step as a keyword, and each
# mistake below is one step written wrong (`_attention_with(step=the wrong one)`).
def _norm_then_rotate(m, q, k, rotate):
    """QK-norm on each head, then the rotation: (queries, keys, the keys the cache keeps)."""
    q, k = m.q_norm(q), m.k_norm(k)
    k_r = rotate(k)
    return rotate(q), k_r, k_r


def _positions_after_past(P, N):
    return torch.arange(P, P + N)


def _past_first(past, new, dim):
    return torch.cat([past, new], dim)


def _grouped_heads(kv, group):
    """Query head i reads key/value head i // group."""
    return kv.repeat_interleave(group, 1)


def _head_scale(m, x):
    return math.sqrt(m.head_dim)


def _causal_after_past(N, T):
    """The diagonal of tril on the (N, T) grid: the query at position T - N + n sees keys 0 .. T - N + n."""
    return T - N


def _attention(m, x, past=None, qk=_norm_then_rotate, positions=_positions_after_past, join=_past_first,
               heads=_grouped_heads, scale=_head_scale, diagonal=_causal_after_past):
    B, N, _ = x.shape
    h, h_kv, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x).view(B, N, h, d).transpose(1, 2)
    k = m.k_proj(x).view(B, N, h_kv, d).transpose(1, 2)
    v = m.v_proj(x).view(B, N, h_kv, d).transpose(1, 2)
    pos = positions(0 if past is None else past[0].size(2), N)
    q_r, k_r, k_cached = qk(m, q, k, lambda z: ref.apply_rope_halves(z, pos, m.rope_base))
    if past is None:
        k_all, v_all, k_store = k_r, v, k_cached
    else:
        k_all, v_all, k_store = join(past[0], k_r, 2), join(past[1], v, 2), join(past[0], k_cached, 2)
    s = q_r @ heads(k_all, h // h_kv).transpose(-2, -1) / scale(m, x)
    T = k_all.size(2)
    s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=diagonal(N, T)), float("-inf"))
    y = (s.softmax(-1) @ heads(v_all, h // h_kv)).transpose(1, 2).reshape(B, N, h * d)
    return m.o_proj(y), (k_store, v_all)


def _attention_with(**wrong_step):
    return lambda m, x, past=None: _attention(m, x, past, **wrong_step)


def _no_qk_norm(m, q, k, rotate):
    k_r = rotate(k)
    return rotate(q), k_r, k_r


def _norm_after_rotation(m, q, k, rotate):
    k_r = m.k_norm(rotate(k))
    return m.q_norm(rotate(q)), k_r, k_r


def _norms_swapped(m, q, k, rotate):
    k_r = rotate(m.q_norm(k))
    return rotate(m.k_norm(q)), k_r, k_r


def _cached_before_rotation(m, q, k, rotate):
    q, k = m.q_norm(q), m.k_norm(k)
    return rotate(q), rotate(k), k


def _positions_from_zero(P, N):
    return torch.arange(N)


def _new_first(past, new, dim):
    return torch.cat([new, past], dim)


def _cycled_heads(kv, group):
    """Query head i reads key/value head i % num_kv_heads."""
    return kv.repeat(1, group, 1, 1)


def _model_scale(m, x):
    return math.sqrt(x.size(-1))


def _query_width_scale(m, x):
    return math.sqrt(m.num_heads * m.head_dim)


def _no_scale(m, x):
    return 1.0


def _causal_off_by(offset):
    return lambda N, T: T - N + offset


def _causal_ignoring_past(N, T):
    return 0


# The cache's mistakes: judged on the layer's output and cache, and on two calls against one (STEPS_MISTAKES).
CACHE_MISTAKES = [
    Mistake("positions restart at 0 with a cache: the new tokens are rotated at positions P .. P+N-1, "
            "P = past[0].size(2)", _attention_with(positions=_positions_from_zero)),
    Mistake("the cached keys were stored before the rotation: present holds the keys after normalisation AND "
            "rotation", _attention_with(qk=_cached_before_rotation)),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new keys and values",
            _attention_with(join=_new_first)),
]
ATTN_MISTAKES = [
    Mistake("QK-norm skipped: normalise each query head with q_norm and each key head with k_norm",
            _attention_with(qk=_no_qk_norm)),
    Mistake("QK-norm applied after the rotation: Qwen3 normalises each head first, then rotates it",
            _attention_with(qk=_norm_after_rotation)),
    Mistake("q_norm and k_norm swapped: q_norm is for the queries, k_norm for the keys",
            _attention_with(qk=_norms_swapped)),
    Mistake("query head i read key/value head i % num_kv_heads: it reads head i // (num_heads // num_kv_heads) "
            "(repeat_interleave, not repeat)", _attention_with(heads=_cycled_heads)),
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(head_dim)", _attention_with(scale=_model_scale)),
    Mistake("scores scaled by 1/sqrt(num_heads * head_dim): scale by 1/sqrt(head_dim)",
            _attention_with(scale=_query_width_scale)),
    Mistake("scores not scaled by 1/sqrt(head_dim)", _attention_with(scale=_no_scale)),
    *CACHE_MISTAKES,
    *[Mistake("the causal mask is off by one: the query at position p attends to keys 0 .. p, itself included",
              _attention_with(diagonal=_causal_off_by(o))) for o in (-1, 1)],
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


def _steps_with(layer):
    """attention_steps_gap for a mistake model of the layer: (present, gap) as the helper returns them."""
    def compute(init, state, x, split):
        m = ref.built_with(ref.ModernAttention, init, state, x.dtype)
        y_all, _ = layer(m, x)
        y_first, past = layer(m, x[:, :split])
        y_rest, present = layer(m, x[:, split:], past)
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
    *[Mistake(mistake.message, _steps_with(mistake.compute)) for mistake in CACHE_MISTAKES],
    Mistake("the causal mask ignores the cache: on the (N, P+N) grid of a call with a cache, the query at "
            "position P+n sees keys 0 .. P+n (tril(diagonal=P))",
            _steps_with(_attention_with(diagonal=_causal_ignoring_past))),
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


# The reference: m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x)); each mistake changes one thing.
def _swiglu_swapped(m, x):
    return m.down_proj(F.silu(m.up_proj(x)) * m.gate_proj(x))


def _gated_by(activation):
    """The gate through ``activation`` instead of SiLU."""
    return lambda m, x: m.down_proj(activation(m.gate_proj(x)) * m.up_proj(x))


def _swiglu_without_up(m, x):
    return m.down_proj(F.silu(m.gate_proj(x)))


def _swiglu_silu_on_both(m, x):
    return m.down_proj(F.silu(m.gate_proj(x)) * F.silu(m.up_proj(x)))


SWIGLU_MISTAKES = [
    Mistake("gate and up swapped: the SiLU goes on gate_proj(x), which multiplies up_proj(x)", _swiglu_swapped),
    *[Mistake("GELU instead of SiLU: SwiGLU's gate is silu(z) = z * sigmoid(z)", _gated_by(gelu))
      for gelu in (F.gelu, lambda z: F.gelu(z, approximate="tanh"))],
    Mistake("sigmoid instead of SiLU (that is GLU): the gate is silu(z) = z * sigmoid(z)", _gated_by(torch.sigmoid)),
    Mistake("ReLU instead of SiLU (that is ReGLU): the gate is silu(z) = z * sigmoid(z)", _gated_by(F.relu)),
    Mistake("up_proj is not used: multiply silu(gate_proj(x)) by up_proj(x)", _swiglu_without_up),
    Mistake("SiLU applied to both projections: only gate_proj(x) goes through the SiLU", _swiglu_silu_on_both),
]


@hidden.test("test_SwiGLU")
def _(t):
    t.module("SwiGLU", dict(d_model=6, d_ff=10), t.randn(3, 4, 6), mistakes=SWIGLU_MISTAKES, label="(3, 4, 6)")
    t.module("SwiGLU", dict(d_model=4, d_ff=3), t.randn(5, 4) * 3, mistakes=SWIGLU_MISTAKES, label="d_ff < d_model")
    t.module("SwiGLU", dict(d_model=8, d_ff=16), t.randn(2, 3, 8, dtype=torch.float64), dtype=torch.float64,
             mistakes=SWIGLU_MISTAKES, label="float64")
    t.module("SwiGLU", dict(d_model=6, d_ff=8), t.randn(2, 6), grad=True, mistakes=SWIGLU_MISTAKES, label="gradients")


# The reference forward in named steps, as for ModernAttention above: `_latent_attention`
# takes each step as a keyword, and each mistake is one step written wrong.
def _rope_part_last(q, nope_dim, rope_dim):
    """(content part, rotary part) of each query head: the first nope_dim features, then rope_dim."""
    return q[..., :nope_dim], q[..., nope_dim:]


def _unrotated(m, z, rotate):
    """The latent and the content parts carry no position."""
    return z


def _content_unrotated(m, q_nope, k_nope, rotate):
    return q_nope, k_nope


def _qk_scale(m):
    return math.sqrt(m.nope_dim + m.rope_dim)


def _latent_cache(past, c, k_rope, k_nope, v):
    return c, k_rope


def _latent_attention(m, x, past=None, absorb=False, positions=_positions_after_past, split=_rope_part_last,
                      latent=_unrotated, content=_content_unrotated, join=_past_first, scale=_qk_scale,
                      cache=_latent_cache):
    B, N, _ = x.shape
    h, dn, dr, dv = m.num_heads, m.nope_dim, m.rope_dim, m.v_dim
    pos = positions(0 if past is None else past[0].size(1), N)
    rot = lambda z: ref.apply_rope_halves(z, pos, m.rope_base)   # noqa: E731
    q_nope, q_rope = split(m.q_proj(x).view(B, N, h, dn + dr).transpose(1, 2), dn, dr)
    c_new = latent(m, m.kv_norm(m.kv_down(x)), rot)
    kr_new = rot(m.k_rope_proj(x))
    c, kr = (c_new, kr_new) if past is None else (join(past[0], c_new, 1), join(past[1], kr_new, 1))
    T = c.size(1)
    q_nope, k_nope = content(m, q_nope, m.k_up(c).view(B, T, h, dn).transpose(1, 2), rot)
    s = q_nope @ k_nope.transpose(-2, -1) + rot(q_rope) @ kr[:, None].transpose(-2, -1)
    s = s / scale(m)
    s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=T - N), float("-inf"))
    v = m.v_up(c).view(B, T, h, dv).transpose(1, 2)
    y = m.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, h * dv))
    return y, cache(past, c, kr, k_nope, v)


def _latent_attention_with(**wrong_step):
    return lambda m, x, past=None, absorb=False: _latent_attention(m, x, past, absorb, **wrong_step)


def _full_cache(past, c, k_rope, k_nope, v):
    if past is not None:
        raise ValueError("a full-key cache cannot read a latent past")
    return k_nope, v


def _full_keys_cache(past, c, k_rope, k_nope, v):
    B, h, T, _ = k_nope.shape
    return torch.cat([k_nope, k_rope[:, None].expand(B, h, T, k_rope.size(-1))], -1), v


def _rotated_latent(m, z, rotate):
    return rotate(z)


def _content_rotated(m, q_nope, k_nope, rotate):
    """Rotary positions on the content parts too (the keys at 0 .. T-1, the new queries at theirs)."""
    return rotate(q_nope), ref.apply_rope_halves(k_nope, torch.arange(k_nope.size(2)), m.rope_base)


def _rope_part_first(q, nope_dim, rope_dim):
    return q[..., rope_dim:], q[..., :rope_dim]


def _nope_scale(m):
    return math.sqrt(m.nope_dim)


def _v_scale(m):
    return math.sqrt(m.v_dim)


def _rank_scale(m):
    return math.sqrt(m.kv_rank)


def _no_latent_scale(m):
    return 1.0


MLA_MISTAKES = [
    *[Mistake("the cache holds the up-projected keys and values: MLA caches only the latent c = kv_norm(kv_down(x)) "
              "(B, T, kv_rank) and the shared rotary key (B, T, rope_dim)", _latent_attention_with(cache=full))
      for full in (_full_cache, _full_keys_cache)],
    Mistake("rotary positions applied to the compressed part: rotate only the last rope_dim features of each "
            "query head and k_rope; the latent and the up-projected keys carry no position",
            _latent_attention_with(latent=_rotated_latent)),
    Mistake("rotary positions applied to the compressed part: rotate only the last rope_dim features of each "
            "query head and k_rope; the latent and the up-projected keys carry no position",
            _latent_attention_with(content=_content_rotated)),
    Mistake("the FIRST rope_dim features of each query head were rotated: the first nope_dim features are the "
            "content part, the last rope_dim the rotary part", _latent_attention_with(split=_rope_part_first)),
    *[Mistake("wrong scale: the scores of head i are q_i . k_i over nope_dim + rope_dim features, so scale by "
              "1/sqrt(nope_dim + rope_dim)", _latent_attention_with(scale=wrong))
      for wrong in (_nope_scale, _v_scale, _rank_scale, _no_latent_scale)],
    Mistake("positions restart at 0 with a cache: rotate the new queries and keys at positions P .. P+N-1, "
            "P = past[0].size(1)", _latent_attention_with(positions=_positions_from_zero)),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new entries, along dim 1",
            _latent_attention_with(join=_new_first)),
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


# The reference: (j <= i) & ((i - j < window) | (j < num_sinks)) on the (n, n) grid of query i and
# key j; each mistake changes one comparison.
def _grid(n):
    return torch.arange(n)[:, None], torch.arange(n)[None, :]


def _window_one_too_wide(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & ((i - j <= window) | (j < num_sinks))


def _window_one_too_narrow(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & ((i - j < window - 1) | (j < num_sinks))


def _window_without_sinks(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & (i - j < window)


def _sinks_not_causal(n, window, num_sinks=0):
    i, j = _grid(n)
    return ((j <= i) & (i - j < window)) | (j < num_sinks)


def _one_sink_too_many(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & ((i - j < window) | (j <= num_sinks))


def _window_not_causal(n, window, num_sinks=0):
    i, j = _grid(n)
    return ((i - j).abs() < window) | (j < num_sinks)


WINDOW_MISTAKES = [
    *[Mistake("the window is off by one: query i sees itself and the window - 1 tokens before it (i - j < window), "
              "window tokens in all", off_by_one) for off_by_one in (_window_one_too_wide, _window_one_too_narrow)],
    Mistake("the sinks are missing: the first num_sinks tokens stay visible to every later query",
            _window_without_sinks),
    Mistake("the sinks are visible to earlier queries: the mask stays causal, j <= i, for the sinks too",
            _sinks_not_causal),
    Mistake("one sink too many: the sinks are the tokens j < num_sinks", _one_sink_too_many),
    Mistake("the mask is not causal: a query never sees a later key (j <= i)", _window_not_causal),
]


@hidden.test("test_sliding_window_mask")
def _(t):
    t.function("sliding_window_mask", 8, 3, mistakes=WINDOW_MISTAKES, label="n=8, window=3")
    t.function("sliding_window_mask", 10, 4, 2, mistakes=WINDOW_MISTAKES, label="n=10, window=4, 2 sinks")
    t.function("sliding_window_mask", 9, 2, num_sinks=3, mistakes=WINDOW_MISTAKES,
               label="n=9, window=2, 3 sinks (keyword)")
    t.function("sliding_window_mask", 5, 8, 1, mistakes=WINDOW_MISTAKES, label="window longer than n")
    t.function("sliding_window_mask", 6, 1, mistakes=WINDOW_MISTAKES, label="window=1: each query sees itself")


# The reference keeps the positions `_kept(T, num_sinks, window)`; each mistake keeps others.
def _kept(T, num_sinks, window):
    if T <= num_sinks + window:                             # the cache still fits: unchanged
        return torch.arange(T)
    return torch.cat([torch.arange(num_sinks), torch.arange(T - window, T)])


def _evict_keeping(positions):
    """evict_to_sinks that keeps ``positions(T, num_sinks, window)`` of the cache, in that order."""
    def evict(k, v, num_sinks, window):
        keep = positions(k.size(2), num_sinks, window)
        return k[:, :, keep], v[:, :, keep]
    return evict


def _last_window_only(T, num_sinks, window):
    return torch.arange(max(T - window, 0), T)


def _last_sinks_plus_window(T, num_sinks, window):
    return torch.arange(max(T - window - num_sinks, 0), T)


def _window_before_sinks(T, num_sinks, window):
    if T <= num_sinks + window:
        return torch.arange(T)
    return torch.cat([torch.arange(T - window, T), torch.arange(num_sinks)])


def _kept_backwards(T, num_sinks, window):
    return _kept(T, num_sinks, window).flip(0) if T > num_sinks + window else torch.arange(T)


def _window_off_by(offset):
    return lambda T, num_sinks, window: _kept(T, num_sinks, window + offset)


def _evicted_always(T, num_sinks, window):
    return torch.cat([torch.arange(min(num_sinks, T)), torch.arange(max(T - window, 0), T)])


EVICT_MISTAKES = [
    *[Mistake("the sink tokens were dropped on eviction: keep positions 0 .. num_sinks-1 as well as the last window",
              _evict_keeping(kept)) for kept in (_last_window_only, _last_sinks_plus_window)],
    *[Mistake("eviction order reversed: the sinks come first, then the recent tokens, oldest first",
              _evict_keeping(kept)) for kept in (_window_before_sinks, _kept_backwards)],
    *[Mistake("the window is off by one: keep exactly the last `window` positions after the sinks",
              _evict_keeping(_window_off_by(offset))) for offset in (-1, 1)],
    Mistake("positions were duplicated or dropped when the cache still fits: return it unchanged when "
            "T <= num_sinks + window", _evict_keeping(_evicted_always)),
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


# The reference, one sequence at a time, in named steps; `_paged` takes each step as a keyword,
# and each mistake below is one step written wrong.
def _table_blocks(block_table, b, n_blocks, num_blocks):
    """The physical blocks of sequence b: its first n_blocks entries of the block table."""
    return block_table[b, :n_blocks]


def _first_keys(k, v, L):
    """The sequence's L keys and values; the slots after them hold stale values."""
    return k[:, :L], v[:, :L]


def _paged(query, k_cache, v_cache, block_table, seq_lens, blocks=_table_blocks, keys=_first_keys, scale=math.sqrt):
    B, H, d = query.shape
    bs = k_cache.size(2)
    out = []
    for b in range(B):
        L = int(seq_lens[b])
        physical = blocks(block_table, b, -(-L // bs), k_cache.size(0))
        k, v = keys(k_cache[physical].transpose(0, 1).reshape(H, -1, d),
                    v_cache[physical].transpose(0, 1).reshape(H, -1, d), L)
        s = (k @ query[b][:, :, None]).squeeze(-1) / scale(d)
        out.append((s.softmax(-1)[:, None] @ v).squeeze(1))
    return torch.stack(out)


def _paged_with(**wrong_step):
    return lambda *args: _paged(*args, **wrong_step)


def _logical_blocks(block_table, b, n_blocks, num_blocks):
    return torch.arange(n_blocks)


def _table_read_one_late(block_table, b, n_blocks, num_blocks):
    return block_table[b, 1:n_blocks + 1]


def _next_physical_blocks(block_table, b, n_blocks, num_blocks):
    return (block_table[b, :n_blocks] + 1) % num_blocks


def _all_slots(k, v, L):
    return k, v


def _last_key_left_out(k, v, L):
    return k[:, :L - 1], v[:, :L - 1]


PAGED_MISTAKES = [
    Mistake("the logical block index was used as the physical block: token t is in block block_table[b, t // "
            "block_size], not in block t // block_size", _paged_with(blocks=_logical_blocks)),
    *[Mistake("the block table was read off by one: token t is in block block_table[b, t // block_size]",
              _paged_with(blocks=off_by_one)) for off_by_one in (_table_read_one_late, _next_physical_blocks)],
    Mistake("keys past seq_lens[b] were read: the slots after a sequence's last token hold stale values; attend "
            "to the first seq_lens[b] only", _paged_with(keys=_all_slots)),
    Mistake("the last cached token was left out: attend to all seq_lens[b] keys, 0 .. seq_lens[b]-1",
            _paged_with(keys=_last_key_left_out)),
    Mistake("scores scaled by 1/d: scale by 1/sqrt(d)", _paged_with(scale=lambda d: d)),
    Mistake("scores not scaled by 1/sqrt(d)", _paged_with(scale=lambda d: 1.0)),
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
