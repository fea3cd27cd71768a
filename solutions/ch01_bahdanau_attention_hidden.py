"""Hidden tests (instructor-only) for chapter 01_bahdanau_attention.

generated from course/01_bahdanau_attention.py by `make generate`; do not edit.
"""



import torch

import solutions.ch01_bahdanau_attention as ref
from autograder.hidden import HiddenTests, Mistake, close, rows_sum_to_one

# No PyTorch built-in computes these exercises, so there is nothing to forbid.
hidden = HiddenTests(ref, from_scratch=set(), inputs_kept={"masked_softmax"})  # its text: scores not changed
NEG_INF = float("-inf")


def _softmax(scores, mask=None, dim=-1, invert=False, after=False, fill=NEG_INF, zero_fill=False):
    """masked_softmax with one deliberate change, to recognise a common mistake."""
    if mask is not None and invert:
        mask = ~mask
    if mask is not None and zero_fill:
        scores = scores * mask
    elif mask is not None and not after:
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after:
        weights = weights * mask
    return weights


INVERTED = "mask polarity inverted: True means the position MAY be attended to"
AFTER = ("mask applied after the softmax: fill the masked scores with -inf before it, "
         "so the remaining weights still sum to 1")
ZERO_FILL = ("masked scores set to 0 instead of -inf: a score of 0 still gets weight exp(0) > 0; "
             "use scores.masked_fill(~mask, float('-inf'))")
IGNORED = "mask ignored: positions where the mask is False must get weight 0"
SOFTMAX_MISTAKES = [
    Mistake("softmax taken over dimension 0 (the batch): normalise each row over its own "
            "positions, the last dimension (dim=-1)", lambda s, mask=None: _softmax(s, mask, dim=0)),
    Mistake("softmax taken over dimension 1: use dim=-1 (the last dimension), so that any number "
            "of leading dimensions works", lambda s, mask=None: _softmax(s, mask, dim=1)),
    Mistake("softmax taken over dimension -2: the weights are normalised over the last dimension",
            lambda s, mask=None: _softmax(s, mask, dim=-2)),
    Mistake(INVERTED, lambda s, mask=None: _softmax(s, mask, invert=True)),
    # Inverting an all-True row masks it completely: -inf gives NaN, -1e9 uniform weights.
    Mistake(INVERTED, lambda s, mask=None: _softmax(s, mask, invert=True, fill=-1e9)),
    Mistake(AFTER, lambda s, mask=None: _softmax(s, mask, after=True)),
    Mistake(ZERO_FILL, lambda s, mask=None: _softmax(s, mask, zero_fill=True)),
    Mistake(IGNORED, lambda s, mask=None: _softmax(s, None)),
]


def _masked_weights_are_zero(probe, value):
    """Hint: masked positions carry weight."""
    mask = probe.kwargs.get("mask")
    if mask is None and len(probe.args) > 1:
        mask = probe.args[1]
    if isinstance(value, torch.Tensor) and value.is_floating_point() and mask is not None:
        try:
            leaked = (value.abs() * (~mask)).amax()
        except RuntimeError:
            return None
        if leaked > 1e-6:
            return "positions where the mask is False got a non-zero weight"
    return None


def _sums_to_one(probe, value):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        sums = value.sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            return "weights do not sum to 1 along the last dimension"
    return None


def _padding(lengths, T):
    """(B, T) bool, True at positions < length."""
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def _random_mask(t, B, T):
    """A random (B, T) mask whose every row keeps at least one position."""
    mask = t.rand_bool(B, T, p=0.6)
    mask[:, 0] = True
    return mask


MS = dict(mistakes=SOFTMAX_MISTAKES, checks=[_sums_to_one, _masked_weights_are_zero])


@hidden.test("test_masked_softmax_no_mask")
def _(t):
    t.function("masked_softmax", t.randn(4, 6) * 2, label="scores (4, 6)", **MS)
    t.function("masked_softmax", t.randn(2, 3, 5), label="scores (2, 3, 5)", **MS)
    t.function("masked_softmax", t.randn(3, 7, dtype=torch.float64), label="float64 scores (3, 7)", **MS)
    t.function("masked_softmax", t.randn(5, 5), label="square scores (5, 5)", **MS)


@hidden.test("test_masked_softmax_mask")
def _(t):
    t.function("masked_softmax", t.randn(4, 6), _padding([6, 3, 1, 5], 6),
               label="a (B, T) padding mask, lengths [6, 3, 1, 5]", **MS)
    t.function("masked_softmax", t.randn(3, 8), mask=_random_mask(t, 3, 8),
               label="a random (B, T) mask passed as mask=", **MS)
    t.function("masked_softmax", t.randn(2, 4, 6), _padding([6, 2], 6).unsqueeze(1),
               label="scores (2, 4, 6) with a (B, 1, T) mask", **MS)
    t.function("masked_softmax", t.randn(3, 5, dtype=torch.float64) * 3, _padding([2, 5, 4], 5),
               label="float64 scores with a padding mask", **MS)


@hidden.test("test_masked_softmax_gradients")
def _(t):
    t.function("masked_softmax", t.randn(4, 7), _padding([7, 5, 2, 6], 7), grad=True,
               label="gradients with a padding mask", **MS)
    t.function("masked_softmax", t.randn(2, 3, 6, dtype=torch.float64), _random_mask(t, 2, 6).unsqueeze(1),
               grad=True, label="float64 gradients, (B, 1, T) mask", **MS)


DOT_MISTAKES = [
    Mistake("scores divided by sqrt(d): Luong's dot score is the plain dot product",
            lambda q, k: (k @ q.unsqueeze(-1)).squeeze(-1) / q.shape[-1] ** 0.5),
    Mistake("the scores went through a softmax: dot_score returns raw scores "
            "(the softmax is masked_softmax's job)",
            lambda q, k: torch.softmax((k @ q.unsqueeze(-1)).squeeze(-1), dim=-1)),
    Mistake("query t was paired with key t across the batch: (B, d) * (B, T, d) broadcasts the wrong way; "
            "use query.unsqueeze(1) so that example b uses its own query",
            lambda q, k: (q.unsqueeze(0) * k).sum(-1)),
]


@hidden.test("test_dot_score_values")
def _(t):
    t.function("dot_score", torch.tensor([[1.0, 2.0]]), torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]),
               mistakes=DOT_MISTAKES, label="the hand example")
    t.function("dot_score", t.randn(2, 4), t.randn(2, 6, 4), mistakes=DOT_MISTAKES, label="B=2, T=6, d=4")


@hidden.test("test_dot_score_batch")
def _(t):
    t.function("dot_score", t.randn(4, 3), t.randn(4, 4, 3), grad=True, mistakes=DOT_MISTAKES,
               label="B = T = 4, gradients too")
    t.function("dot_score", t.randn(3, 8, dtype=torch.float64), t.randn(3, 5, 8, dtype=torch.float64),
               grad=True, mistakes=DOT_MISTAKES, label="float64, B=3, T=5, d=8, gradients too")


def _additive(m, query, keys, values, mask=None, *, tanh=True, v_a=True, v_first=False, swap=False,
              dim=-1, from_keys=False, from_scores=False, **softmax_change):
    """AdditiveAttention with one deliberate change, to recognise a common mistake."""
    q, k = (m.W_a(keys), m.U_a(query)) if swap else (m.W_a(query), m.U_a(keys))
    if swap:
        pre = q + k.unsqueeze(1)                                        # (B, T, d_a)
    else:
        pre = q.unsqueeze(1) + k                                        # (B, T, d_a)
    if v_first:
        scores = torch.tanh(m.v_a(pre)).squeeze(-1)
    elif not v_a:
        scores = torch.tanh(pre).sum(-1)
    else:
        scores = m.v_a(torch.tanh(pre) if tanh else pre).squeeze(-1)   # (B, T)
    weights = _softmax(scores, mask, dim=dim, **softmax_change)         # (B, T)
    mixed = scores if from_scores else weights
    context = (mixed.unsqueeze(1) @ (keys if from_keys else values)).squeeze(1)
    return context, weights


ADDITIVE_MISTAKES = [
    Mistake("tanh missing: the score is v_a(tanh(W_a(query) + U_a(keys)))",
            lambda m, *a, **k: _additive(m, *a, **k, tanh=False)),
    Mistake("v_a missing: the tanh features must be projected to one score by self.v_a, not summed",
            lambda m, *a, **k: _additive(m, *a, **k, v_a=False)),
    Mistake("tanh and v_a in the wrong order: the score is v_a(tanh(...)), not tanh(v_a(...))",
            lambda m, *a, **k: _additive(m, *a, **k, v_first=True)),
    Mistake("W_a and U_a swapped: W_a projects the query (decoder state), U_a the keys",
            lambda m, *a, **k: _additive(m, *a, **k, swap=True)),
    Mistake("softmax taken over the batch (dim 0): each example's weights are normalised over its "
            "own T positions", lambda m, *a, **k: _additive(m, *a, **k, dim=0)),
    Mistake("the context is a weighted sum of the keys: it must average the VALUES",
            lambda m, *a, **k: _additive(m, *a, **k, from_keys=True)),
    Mistake("the context was built from the raw scores: average the values with the softmax weights",
            lambda m, *a, **k: _additive(m, *a, **k, from_scores=True)),
    Mistake(INVERTED, lambda m, *a, **k: _additive(m, *a, **k, invert=True)),
    Mistake(INVERTED, lambda m, *a, **k: _additive(m, *a, **k, invert=True, fill=-1e9)),
    Mistake(AFTER, lambda m, *a, **k: _additive(m, *a, **k, after=True)),
    Mistake(ZERO_FILL, lambda m, *a, **k: _additive(m, *a, **k, zero_fill=True)),
    Mistake("mask ignored: pass it on to masked_softmax", lambda m, q, k, v, mask=None: _additive(m, q, k, v)),
]
AA = dict(mistakes=ADDITIVE_MISTAKES, checks=[rows_sum_to_one], deps=("masked_softmax",))


def _context_averages_values(probe, value):
    """The context is the returned weights' average of the values (whatever the scores were)."""
    context, weights = value
    if torch.allclose(context, (weights.unsqueeze(1) @ probe.args[2]).squeeze(1), atol=1e-5):
        return None
    return "the context is not sum_t weights[b, t] * values[b, t]: average the VALUES with the returned weights"


def _sums_to_one_over_positions(weights):
    sums = weights.sum(-1)
    return torch.allclose(sums, torch.ones_like(sums), atol=1e-4)


def _same_shapes_and_distributions(student, other):
    """The shapes test's rule: against the reference (or a mistake whose weights are distributions), the
    same shapes and weights that sum to 1; against any other mistake, its values (so it can be named)."""
    if not isinstance(student, tuple) or any(getattr(s, "shape", None) != o.shape for s, o in zip(student, other)):
        return False
    if _sums_to_one_over_positions(other[1]):
        return _sums_to_one_over_positions(student[1])
    return all(close(s, o) for s, o in zip(student, other))


# The shapes test judges shapes, weights that are distributions and a context that averages the values:
# a wrong score (tanh missing, v_a missing) costs the values and mask tests, not this one.
AA_SHAPES = dict(AA, checks=[_context_averages_values], equivalent=_same_shapes_and_distributions)


@hidden.test("test_AdditiveAttention_shapes")
def _(t):
    t.module("AdditiveAttention", dict(query_dim=5, key_dim=6, hidden_dim=4),
             t.randn(2, 5), t.randn(2, 7, 6), t.randn(2, 7, 3), label="d_q=5, d_k=6, d_v=3, d_a=4", **AA_SHAPES)
    t.module("AdditiveAttention", dict(query_dim=3, key_dim=8, hidden_dim=10),
             t.randn(4, 3), t.randn(4, 2, 8), t.randn(4, 2, 8), label="B=4, T=2, keys = values", **AA_SHAPES)


@hidden.test("test_AdditiveAttention_values")
def _(t):
    # Equal sizes first, so that swapped projections and keys-for-values run and can be named.
    keys = t.randn(3, 6, 4)
    t.module("AdditiveAttention", dict(query_dim=4, key_dim=4, hidden_dim=5),
             t.randn(3, 4), keys, t.randn(3, 6, 4), grad=True, label="d_q = d_k = d_v = 4, gradients too", **AA)
    # (Modules are probed in float32: the grader copies the reference's float32 parameters.)
    t.module("AdditiveAttention", dict(query_dim=6, key_dim=5, hidden_dim=7),
             t.randn(2, 6) * 2, t.randn(2, 9, 5) * 2, t.randn(2, 9, 3), grad=True,
             label="d_q=6, d_k=5, d_v=3, T=9, gradients too", **AA)


@hidden.test("test_AdditiveAttention_mask")
def _(t):
    t.module("AdditiveAttention", dict(query_dim=4, key_dim=4, hidden_dim=6),
             t.randn(4, 4), t.randn(4, 6, 4), t.randn(4, 6, 4), mask=_padding([6, 3, 1, 4], 6),
             label="a (B, T) padding mask, lengths [6, 3, 1, 4]", **AA)
    t.module("AdditiveAttention", dict(query_dim=3, key_dim=5, hidden_dim=4),
             t.randn(3, 3), t.randn(3, 7, 5), t.randn(3, 7, 2), mask=_random_mask(t, 3, 7), grad=True,
             label="a random (B, T) mask, gradients too", **AA)


def _step(m, token, state, enc, enc_mask=None, *, attend_new=False, input_order=False, output_order=False,
          zero_state=False, logits_from_old=False, return_old=False, drop_mask=False):
    """BahdanauDecoder.forward_step with one deliberate change, to recognise a common mistake."""
    embedded = m.embedding(token)
    context, weights = m.attention(state, enc, enc, None if drop_mask else enc_mask)
    x = torch.cat([context, embedded] if input_order else [embedded, context], dim=-1)
    new_state = m.gru(x) if zero_state else m.gru(x, state)
    if attend_new:
        context, weights = m.attention(new_state, enc, enc, enc_mask)
    s = state if logits_from_old else new_state
    logits = m.out(torch.cat([context, s] if output_order else [s, context], dim=-1))
    return logits, (state if return_old else new_state), weights


DECODER_MISTAKES = [
    Mistake("context computed from the NEW state: Bahdanau attends with the previous state s_{i-1}, "
            "before the GRU step, and uses that context for both the GRU input and the output",
            lambda m, *a, **k: _step(m, *a, **k, attend_new=True)),
    Mistake("GRU input in the wrong order: use torch.cat([embedded, context], dim=-1)",
            lambda m, *a, **k: _step(m, *a, **k, input_order=True)),
    Mistake("output layer input in the wrong order: logits = self.out(torch.cat([new_state, context], dim=-1))",
            lambda m, *a, **k: _step(m, *a, **k, output_order=True)),
    Mistake("the GRU started from zeros: pass the previous state, self.gru(x, state)",
            lambda m, *a, **k: _step(m, *a, **k, zero_state=True)),
    Mistake("logits computed from the previous state: predict from the NEW state and the context",
            lambda m, *a, **k: _step(m, *a, **k, logits_from_old=True)),
    Mistake("returned the previous state: return the GRU's new state",
            lambda m, *a, **k: _step(m, *a, **k, return_old=True)),
    Mistake("enc_mask ignored: pass it on to self.attention",
            lambda m, *a, **k: _step(m, *a, **k, drop_mask=True)),
]


def _which_part_differs(probe, value):
    """For a (logits, new_state, weights) result: name the parts that differ."""
    if not (isinstance(value, tuple) and len(value) == 3):
        return None
    reference = getattr(probe.reference, probe.method)(*[a.clone() for a in probe.args],
                                                       **{k: v.clone() for k, v in probe.kwargs.items()})
    names = ("logits", "new_state", "weights")
    wrong = [n for n, got, want in zip(names, value, reference) if not close(got, want)]
    if not wrong:
        return None
    hints = {"weights": "weights: self.attention(state, enc_outputs, enc_outputs, enc_mask) with the previous state",
             "new_state": "new_state: self.gru(torch.cat([embedded, context], dim=-1), state)",
             "logits": "logits: self.out(torch.cat([new_state, context], dim=-1))"}
    return "these outputs differ from the reference: " + "; ".join(hints[n] for n in wrong)


BD = dict(method="forward_step", mistakes=DECODER_MISTAKES, checks=[_which_part_differs],
          deps=("masked_softmax", "AdditiveAttention"))
SQUARE = dict(vocab_size=9, embed_dim=6, enc_dim=6, hidden_dim=6, attn_dim=4)   # every cat order runs


@hidden.test("test_BahdanauDecoder_shapes")
def _(t):
    t.module("BahdanauDecoder", SQUARE, t.randint(0, 9, (3,)), t.randn(3, 6), t.randn(3, 5, 6),
             label="embed_dim = enc_dim = hidden_dim = 6", **BD)
    t.module("BahdanauDecoder", dict(vocab_size=13, embed_dim=4, enc_dim=10, hidden_dim=7, attn_dim=5),
             t.randint(0, 13, (2,)), t.randn(2, 7), t.randn(2, 8, 10),
             label="vocab 13, embed 4, enc 10, hidden 7, attn 5", **BD)


@hidden.test("test_BahdanauDecoder_step")
def _(t):
    t.module("BahdanauDecoder", SQUARE, t.randint(0, 9, (4,)), t.randn(4, 6), t.randn(4, 6, 6), grad=True,
             label="embed_dim = enc_dim = hidden_dim = 6, gradients too", **BD)
    t.module("BahdanauDecoder", dict(vocab_size=11, embed_dim=5, enc_dim=8, hidden_dim=6, attn_dim=7),
             t.randint(0, 11, (3,)), t.randn(3, 6), t.randn(3, 4, 8), grad=True,
             label="vocab 11, embed 5, enc 8, hidden 6, attn 7, gradients too", **BD)


@hidden.test("test_BahdanauDecoder_mask")
def _(t):
    t.module("BahdanauDecoder", SQUARE, t.randint(0, 9, (4,)), t.randn(4, 6), t.randn(4, 7, 6),
             _padding([7, 4, 1, 6], 7), label="a (B, T) padding mask, lengths [7, 4, 1, 6]", **BD)
    t.module("BahdanauDecoder", dict(vocab_size=10, embed_dim=3, enc_dim=4, hidden_dim=5, attn_dim=6),
             t.randint(0, 10, (3,)), t.randn(3, 5), t.randn(3, 6, 4), enc_mask=_random_mask(t, 3, 6), grad=True,
             label="a random (B, T) mask passed as enc_mask=, gradients too", **BD)
