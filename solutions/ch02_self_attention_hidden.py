"""Hidden tests (instructor-only) for chapter 02_self_attention.

generated from course/02_self_attention.py by `make generate`; do not edit.
"""



import math

import torch

import solutions.ch02_self_attention as ref
from autograder.hidden import HiddenTests, Mistake, rows_sum_to_one

hidden = HiddenTests(ref, from_scratch={"scaled_dot_product_attention", "SelfAttention"},
                     inputs_kept={"scaled_dot_product_attention"})  # its text: inputs not changed


def _attend(q, k, v, mask=None, scale=None, dim=-1, invert=False, after=False, fill=float("-inf")):
    """Attention with one deliberate change, to recognise a common mistake."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None and invert:
        mask = ~mask
    if mask is not None and not after:
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after:
        weights = weights * mask
    return weights @ v, weights


SDPA_MISTAKES = [
    Mistake("scores not scaled by 1/sqrt(d_k)", lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=1.0)),
    Mistake("scores scaled by 1/d_k instead of 1/sqrt(d_k)",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=1 / q.shape[-1])),
    Mistake("scores scaled by sqrt(d_k) instead of divided by it",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=math.sqrt(q.shape[-1]))),
    Mistake("scores scaled by 1/sqrt(d_v): the scale uses the key/query size d_k",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=1 / math.sqrt(v.shape[-1]))),
    Mistake("softmax taken over the queries (dim -2): weights rows do not sum to 1",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, dim=-2)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, invert=True)),
    # An inverted mask leaves some rows fully masked: -1e9 makes them uniform, -inf NaN.
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, invert=True, fill=-1e9)),
    Mistake("mask applied after the softmax: masked scores must be filled before it, "
            "so the remaining weights still sum to 1",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, after=True)),
    Mistake("mask ignored", lambda q, k, v, mask=None: _attend(q, k, v, None)),
]


def _mask_with_a_key_per_row(t, *shape):
    """A random boolean mask where every query keeps at least one key."""
    mask = t.rand_bool(*shape, p=0.6)
    mask[..., 0] = True
    return mask


@hidden.test("test_scaled_dot_product_attention_worked_example")
def _(t):
    x = torch.tensor([[1.0, 0, 1, 0], [0, 2, 0, 2]])
    w_q = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0]])
    w_k = torch.tensor([[0.0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 1, 1], [1, 1, 0, 0]])
    w_v = torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]])
    t.function("scaled_dot_product_attention", x @ w_q, x @ w_k, x @ w_v, mistakes=SDPA_MISTAKES,
               checks=[rows_sum_to_one], label="the Thinking Machines example")
    t.function("scaled_dot_product_attention", t.randn(2, 3, 4), t.randn(2, 3, 4), t.randn(2, 3, 4),
               mistakes=SDPA_MISTAKES, checks=[rows_sum_to_one], label="a batch of 2, 3 tokens")


@hidden.test("test_scaled_dot_product_attention_shapes")
def _(t):
    for lead in [(), (3,), (2, 3)]:
        t.function("scaled_dot_product_attention", t.randn(*lead, 4, 8), t.randn(*lead, 6, 8),
                   t.randn(*lead, 6, 5), mistakes=SDPA_MISTAKES, checks=[rows_sum_to_one],
                   label=f"batch dims {lead}, N_q=4, N_k=6, d_k=8, d_v=5")
    t.function("scaled_dot_product_attention", t.randn(2, 3, 8, dtype=torch.float64),
               t.randn(2, 5, 8, dtype=torch.float64), t.randn(2, 5, 3, dtype=torch.float64),
               mistakes=SDPA_MISTAKES, label="float64 inputs")


@hidden.test("test_scaled_dot_product_attention_values")
def _(t):
    q, k, v = t.randn(2, 5, 16) * 2, t.randn(2, 7, 16) * 2, t.randn(2, 7, 6)
    t.function("scaled_dot_product_attention", q, k, v, grad=True, mistakes=SDPA_MISTAKES,
               checks=[rows_sum_to_one], label="random inputs with d_k=16, gradients too")
    q, k, v = (t.randn(3, 4, 9, dtype=torch.float64) for _ in range(3))
    t.function("scaled_dot_product_attention", q, k, v, grad=True, mistakes=SDPA_MISTAKES,
               label="float64, gradients too")


@hidden.test("test_scaled_dot_product_attention_mask")
def _(t):
    n = 6
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    t.function("scaled_dot_product_attention", t.randn(2, n, 8), t.randn(2, n, 8), t.randn(2, n, 5),
               mask=causal, grad=True, mistakes=SDPA_MISTAKES, label="a causal (n, n) mask")
    keys = torch.tensor([[True] * 7, [True] * 4 + [False] * 3]).unsqueeze(1)  # (B, 1, N_k)
    t.function("scaled_dot_product_attention", t.randn(2, 5, 8), t.randn(2, 7, 8), t.randn(2, 7, 3),
               mask=keys, mistakes=SDPA_MISTAKES, label="a padding mask of shape (B, 1, N_k)")
    t.function("scaled_dot_product_attention", t.randn(2, 3, 4, 8), t.randn(2, 3, 5, 8),
               t.randn(2, 3, 5, 8), mask=_mask_with_a_key_per_row(t, 2, 1, 4, 5),
               mistakes=SDPA_MISTAKES, label="a (B, 1, N_q, N_k) mask over 3 heads")


@hidden.test("test_causal_mask")
def _(t):
    mistakes = [
        Mistake("mask polarity inverted: True goes on and below the diagonal (what a token may see)",
                lambda n: ~torch.ones(n, n, dtype=torch.bool).tril()),
        Mistake("True is above the diagonal: that lets a token see the future",
                lambda n: torch.ones(n, n, dtype=torch.bool).triu()),
        Mistake("the diagonal must be True: a token may attend to itself",
                lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1)),
    ]
    for n in (1, 4, 7):
        t.function("causal_mask", n, mistakes=mistakes, label=f"n={n}")


@hidden.test("test_padding_mask")
def _(t):
    def positions(lengths, max_len):
        return torch.arange(max_len).unsqueeze(0), lengths.unsqueeze(1)
    mistakes = [
        Mistake("mask polarity inverted: True marks the positions that exist (< length)",
                lambda lengths, max_len: (lambda p, l: p >= l)(*positions(lengths, max_len))),
        Mistake("off by one: position `length` itself is padding (use <, not <=)",
                lambda lengths, max_len: (lambda p, l: p <= l)(*positions(lengths, max_len))),
        Mistake("width taken from lengths.max(): use max_len, the padded length, which can be longer "
                "than every sequence in the batch",
                lambda lengths, max_len: (lambda p, l: p < l)(*positions(lengths, int(lengths.max())))),
    ]
    t.function("padding_mask", torch.tensor([3, 5, 1]), 5, mistakes=mistakes, label="lengths [3, 5, 1]")
    t.function("padding_mask", torch.tensor([2, 0, 6, 4]), 6, mistakes=mistakes,
               label="lengths [2, 0, 6, 4]")
    # max_len longer than every sequence: the batch was padded for a longer one elsewhere.
    t.function("padding_mask", torch.tensor([3, 1, 2]), 7, mistakes=mistakes,
               label="lengths [3, 1, 2], max_len=7")
    t.function("padding_mask", torch.tensor([0, 4]), 5, mistakes=mistakes, label="lengths [0, 4], max_len=5")


def _module_attend(module, x, mask=None, scale=None, swap=False, raw_values=False, invert=False,
                   fill=float("-inf")):
    q, k = module.W_q(x), module.W_k(x)
    if swap:
        q, k = k, q
    v = x if raw_values else module.W_v(x)
    return _attend(q, k, v, mask, scale=scale, invert=invert, fill=fill)


SELF_ATTENTION_MISTAKES = [
    Mistake("scores scaled by 1/sqrt(d_model): the scale uses d_k, the size of the projected keys",
            lambda m, x, mask=None: _module_attend(m, x, mask, scale=1 / math.sqrt(x.shape[-1]))),
    Mistake("scores not scaled by 1/sqrt(d_k)", lambda m, x, mask=None: _module_attend(m, x, mask, scale=1.0)),
    Mistake("queries and keys swapped: queries come from W_q, keys from W_k",
            lambda m, x, mask=None: _module_attend(m, x, mask, swap=True)),
    Mistake("missing value projection: values are W_v(x), not x",
            lambda m, x, mask=None: _module_attend(m, x, mask, raw_values=True)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, x, mask=None: _module_attend(m, x, mask, invert=True)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, x, mask=None: _module_attend(m, x, mask, invert=True, fill=-1e9)),
    Mistake("mask ignored: pass it on to the attention", lambda m, x, mask=None: _module_attend(m, x)),
]
SA = dict(mistakes=SELF_ATTENTION_MISTAKES, deps=("scaled_dot_product_attention",))


@hidden.test("test_SelfAttention_shapes")
def _(t):
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, 5, 8), checks=[rows_sum_to_one],
             label="d_model=8, d_k=4, d_v=6", **SA)
    t.module("SelfAttention", dict(d_model=6, d_k=10, d_v=3), t.randn(1, 3, 6), label="d_k > d_model", **SA)


@hidden.test("test_SelfAttention_values")
def _(t):
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=8), t.randn(2, 5, 8) * 2,
             label="d_model=8, d_k=4, d_v=8", **SA)
    t.module("SelfAttention", dict(d_model=12, d_k=3, d_v=5), t.randn(3, 7, 12),
             label="d_model=12, d_k=3, d_v=5", **SA)
    t.module("SelfAttention", dict(d_model=6, d_k=4, d_v=3), t.randn(2, 4, 6, dtype=torch.float64),
             dtype=torch.float64, label="a float64 layer", **SA)


@hidden.test("test_SelfAttention_mask")
def _(t):
    n = 5
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, n, 8),
             mask=torch.ones(n, n, dtype=torch.bool).tril(), label="a causal mask", **SA)
    keys = torch.tensor([[True] * n, [True] * 2 + [False] * (n - 2)]).unsqueeze(1)
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, n, 8), mask=keys,
             label="a (B, 1, N) padding mask", **SA)


@hidden.test("test_SelfAttention_gradients")
def _(t):
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, 5, 8), grad=True,
             mask=torch.ones(5, 5, dtype=torch.bool).tril(), label="gradients", **SA)
