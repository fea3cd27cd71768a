"""Hidden tests (instructor-only) for chapter 03_multi_head_attention.

generated from course/03_multi_head_attention.py by `make generate`; do not edit.
"""



import math

import torch

import solutions.ch03_multi_head_attention as ref
from autograder.hidden import HiddenTests, Mistake, rows_sum_to_one

hidden = HiddenTests(ref, from_scratch={"MultiHeadAttention"})


def _split(x, h, how="ok"):
    B, N, C = x.shape
    d = C // h
    if how == "view_only":               # view to (B, h, N, d) without a transpose
        return x.reshape(B, h, N, d)
    if how == "interleaved":             # head i gets every h-th feature
        return x.reshape(B, N, d, h).permute(0, 3, 1, 2)
    return x.reshape(B, N, h, d).transpose(1, 2)


def _merge(x, how="ok"):
    B, h, N, d = x.shape
    if how == "no_transpose":            # flatten (B, h, N, d) directly
        return x.reshape(B, N, h * d)
    if how == "interleaved":             # features alternate between heads
        return x.permute(0, 2, 3, 1).reshape(B, N, d * h)
    return x.transpose(1, 2).reshape(B, N, h * d)


SPLIT_MISTAKES = [
    Mistake("view to (B, h, N, d) without a transpose: that mixes tokens and heads; "
            "view to (B, N, h, d), then transpose(1, 2)", lambda x, h: _split(x, h, "view_only")),
    Mistake("heads interleaved: head i must take the consecutive features i*d:(i+1)*d, "
            "not every h-th feature", lambda x, h: _split(x, h, "interleaved")),
]
MERGE_MISTAKES = [
    Mistake("heads merged in the wrong order: reshaping (B, h, N, d) straight to (B, N, h*d) "
            "mixes tokens and heads; transpose(1, 2) first", lambda x: _merge(x, "no_transpose")),
    Mistake("heads interleaved: each token's row must be head 0's d features, then head 1's, ...",
            lambda x: _merge(x, "interleaved")),
]


@hidden.test("test_split_heads")
def _(t):
    t.function("split_heads", torch.arange(24.0).reshape(1, 4, 6), 3, mistakes=SPLIT_MISTAKES,
               label="an arange (1, 4, 6) tensor, 3 heads")
    t.function("split_heads", t.randn(2, 5, 8), 2, mistakes=SPLIT_MISTAKES, label="(2, 5, 8), 2 heads")
    t.function("split_heads", t.randn(3, 7, 12, dtype=torch.float64), 4, mistakes=SPLIT_MISTAKES,
               label="float64 (3, 7, 12), 4 heads")
    t.function("split_heads", t.randn(2, 3, 6), 1, mistakes=SPLIT_MISTAKES, label="one head")
    t.function("split_heads", t.randn(1, 1, 8), 8, mistakes=SPLIT_MISTAKES, label="one token, 8 heads of width 1")


@hidden.test("test_merge_heads")
def _(t):
    t.function("merge_heads", torch.arange(24.0).reshape(1, 2, 3, 4), mistakes=MERGE_MISTAKES,
               label="an arange (1, 2, 3, 4) tensor")
    t.function("merge_heads", t.randn(2, 4, 5, 3), mistakes=MERGE_MISTAKES, label="(2, 4, 5, 3)")
    t.function("merge_heads", t.randn(3, 2, 6, 4, dtype=torch.float64), mistakes=MERGE_MISTAKES,
               label="float64 (3, 2, 6, 4)")
    t.function("merge_heads", t.randn(2, 1, 4, 5), mistakes=MERGE_MISTAKES, label="one head")


def _mha(m, query, key, value, mask=None, scale=None, split="ok", merge="ok", w_o=True,
         invert=False, fill=float("-inf"), kv_from=None):
    """The reference layer with one deliberate change, to recognise a common mistake."""
    h = m.num_heads
    if kv_from == "query":
        key = value = query
    elif kv_from == "swap":
        key, value = value, key
    elif kv_from == "key":
        value = key
    q = _split(m.W_q(query), h, split)
    k = _split(m.W_k(key), h, split)
    v = _split(m.W_v(value), h, split)
    d_k = q.shape[-1]
    scale = 1 / math.sqrt(d_k) if scale is None else scale(query.shape[-1], d_k)
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    weights = torch.softmax(scores, dim=-1)
    out = _merge(weights @ v, merge)
    return (m.W_o(out) if w_o else out), weights


def _scaled_twice(d_model, d_k, coinciding):
    """1/d_k: scaled by 1/sqrt(d_k) in the layer and again in scaled_dot_product_attention. Where
    d_k * d_k == d_model that is also 1/sqrt(d_model): one model for each case, so a message never
    blames one of the two for the other."""
    if (d_k * d_k == d_model) != coinciding:
        raise ValueError("this mistake model does not apply to these sizes")
    return 1 / d_k


def _weights_averaged(m, *args, **kwargs):
    out, weights = _mha(m, *args, **kwargs)
    return out, weights.mean(dim=1)


MHA_MISTAKES = [
    Mistake("W_o forgotten: apply self.W_o to the concatenated heads",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, w_o=False)),
    Mistake("scores scaled by 1/d_k, which for these sizes is also 1/sqrt(d_model): scores scaled twice "
            "(in the layer and again in scaled_dot_product_attention), or by 1/sqrt(d_model); scale each "
            "head once, by 1/sqrt(d_k)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: _scaled_twice(d, dk, True))),
    Mistake("scores scaled twice (by 1/d_k): scale by 1/sqrt(d_k) once, in the layer or in "
            "scaled_dot_product_attention, not in both",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: _scaled_twice(d, dk, False))),
    Mistake("scores scaled by 1/sqrt(d_model): each head is scaled by 1/sqrt(d_k), d_k = d_model // num_heads",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: 1 / math.sqrt(d))),
    Mistake("scores not scaled by 1/sqrt(d_k)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: 1.0)),
    Mistake("heads split with a view to (B, h, N, d_k) without a transpose: that mixes tokens and heads; "
            "view to (B, N, h, d_k), then transpose(1, 2)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, split="view_only", merge="no_transpose")),
    Mistake("heads split with a view to (B, h, N, d_k) without a transpose: that mixes tokens and heads; "
            "view to (B, N, h, d_k), then transpose(1, 2)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, split="view_only")),
    Mistake("heads merged in the wrong order: transpose (B, h, N_q, d_k) to (B, N_q, h, d_k) before "
            "flattening to (B, N_q, d_model)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, merge="no_transpose")),
    Mistake("heads interleaved: head i uses the consecutive features i*d_k:(i+1)*d_k of each projection",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, split="interleaved", merge="interleaved")),
    Mistake("keys and values taken from the query: use the key and value arguments (cross-attention)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, kv_from="query")),
    Mistake("key and value swapped: keys come from W_k(key), values from W_v(value)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, kv_from="swap")),
    Mistake("values projected from the keys: the values are W_v(value), the third argument, not W_v(key)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, kv_from="key")),
    Mistake("weights averaged over the heads: return every head's weights, shape (B, h, N_q, N_k)",
            lambda m, q, k, v, mask=None: _weights_averaged(m, q, k, v, mask)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, invert=True)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, invert=True, fill=-1e9)),
    Mistake("mask ignored: pass it on to the attention", lambda m, q, k, v, mask=None: _mha(m, q, k, v)),
]
MHA = dict(mistakes=MHA_MISTAKES, deps=("split_heads", "merge_heads"))


def _self(t, B, N, d):
    x = t.randn(B, N, d)
    return x, x.clone(), x.clone()


@hidden.test("test_MultiHeadAttention_shapes")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=16, num_heads=4), *_self(t, 2, 5, 16),
             checks=[rows_sum_to_one], label="self-attention, d_model=16, 4 heads", **MHA)
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), t.randn(3, 1, 8), t.randn(3, 6, 8),
             t.randn(3, 6, 8), label="one query, 6 keys", **MHA)


@hidden.test("test_MultiHeadAttention_values")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=12, num_heads=3), *_self(t, 2, 6, 12),
             checks=[rows_sum_to_one], label="self-attention, d_model=12, 3 heads", **MHA)
    t.module("MultiHeadAttention", dict(d_model=32, num_heads=4), *_self(t, 2, 9, 32),
             label="self-attention, d_model=32, 4 heads", **MHA)


@hidden.test("test_MultiHeadAttention_heads")
def _(t):
    x = t.randn(2, 5, 8)
    for h in (1, 2, 4, 8):
        t.module("MultiHeadAttention", dict(d_model=8, num_heads=h), x, x.clone(), x.clone(),
                 label=f"d_model=8, num_heads={h}", **MHA)


@hidden.test("test_MultiHeadAttention_cross_attention")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), t.randn(2, 3, 8), t.randn(2, 6, 8),
             t.randn(2, 6, 8), label="N_q=3, N_k=6, key != value", **MHA)
    t.module("MultiHeadAttention", dict(d_model=12, num_heads=4), t.randn(1, 7, 12), t.randn(1, 4, 12),
             t.randn(1, 4, 12), label="N_q=7, N_k=4", **MHA)


@hidden.test("test_MultiHeadAttention_causal_mask")
def _(t):
    n = 6
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), *_self(t, 2, n, 8), mask=causal,
             label="a causal (N, N) mask", **MHA)
    t.module("MultiHeadAttention", dict(d_model=16, num_heads=4), *_self(t, 1, n, 16), mask=causal,
             label="a causal (N, N) mask, 4 heads", **MHA)


@hidden.test("test_MultiHeadAttention_padding_mask")
def _(t):
    n = 6
    keep = (torch.arange(n)[None, :] < torch.tensor([n, 3])[:, None])[:, None, None, :]
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), t.randn(2, 4, 8), t.randn(2, n, 8),
             t.randn(2, n, 8), mask=keep, label="a (B, 1, 1, N_k) padding mask", **MHA)
    per_head = t.rand_bool(2, 4, n, n, p=0.6)
    per_head[..., 0] = True
    t.module("MultiHeadAttention", dict(d_model=16, num_heads=4), *_self(t, 2, n, 16), mask=per_head,
             label="a (B, h, N, N) mask, different for every head", **MHA)


@hidden.test("test_MultiHeadAttention_gradients")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), *_self(t, 2, 5, 8), grad=True,
             label="self-attention, gradients", **MHA)
    t.module("MultiHeadAttention", dict(d_model=12, num_heads=3), t.randn(2, 3, 12), t.randn(2, 5, 12),
             t.randn(2, 5, 12), mask=torch.ones(3, 5, dtype=torch.bool).tril(1), grad=True,
             label="cross-attention with a mask, gradients", **MHA)
