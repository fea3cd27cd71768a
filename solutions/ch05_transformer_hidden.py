"""Hidden tests (instructor-only) for chapter 05_transformer.

generated from course/05_transformer.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn.functional as F

import solutions.ch05_transformer as ref
from autograder.hidden import HiddenTests, Mistake

hidden = HiddenTests(ref, from_scratch={"FeedForward", "EncoderLayer", "DecoderLayer", "Transformer",
                                        "greedy_decode"})


# ----------------------------------------------------------------------------- FeedForward
def _ffn(m, x, how="ok"):
    h = m.linear1(x)
    if how == "no_relu":
        return m.linear2(h)
    if how == "gelu":
        return m.linear2(F.gelu(h))
    out = m.linear2(torch.relu(h))
    return torch.relu(out) if how == "relu_out" else out


FFN_MISTAKES = [
    Mistake("ReLU missing: apply torch.relu between linear1 and linear2", lambda m, x: _ffn(m, x, "no_relu")),
    Mistake("ReLU applied to the output too: the network ends with linear2, no activation after it",
            lambda m, x: _ffn(m, x, "relu_out")),
    Mistake("GELU instead of ReLU: the paper's network uses max(0, x W_1 + b_1)", lambda m, x: _ffn(m, x, "gelu")),
]


def _dropout_in_eval(probe, value):
    """Hint when the output is the network with dropout ACTIVE: in eval() mode it must do nothing.

    Dropout keeps each value or zeroes it and scales the rest by 1/(1-p). After the ReLU
    (with d_ff <= d_model, so the hidden units can be read back through linear2) or on
    the output, every value is then either 0 or the eval-mode value / (1-p).
    """
    m, x = probe.reference, probe.args[0]
    keep = 1 - m.dropout.p
    if not isinstance(value, torch.Tensor) or value.shape != x.shape or keep == 1:
        return None
    with torch.no_grad():
        w2, b2 = m.linear2.weight.double(), m.linear2.bias.double()
        hidden_units = torch.relu(m.linear1(x)).double()
        expected, y = hidden_units @ w2.T + b2, value.double()
        if torch.allclose(y, expected, atol=1e-4):
            return None
        read_back = torch.linalg.lstsq(w2, (y - b2).reshape(-1, w2.shape[0]).T).solution.T.reshape(hidden_units.shape)

        def kept_or_zeroed(got, full):
            return bool(((got.abs() < 1e-4) | torch.isclose(got, full / keep, atol=1e-4, rtol=1e-3)).all())
        if kept_or_zeroed(read_back, hidden_units) or kept_or_zeroed(y, expected):
            return ("dropout active in eval() mode: F.dropout(h, p) defaults to training=True; use self.dropout "
                    "(an nn.Dropout, which eval() turns off) or pass training=self.training")
    return None


@hidden.test("test_FeedForward")
def _(t):
    t.module("FeedForward", dict(d_model=16, d_ff=8, dropout=0.5), t.randn(3, 6, 16), mistakes=FFN_MISTAKES,
             checks=[_dropout_in_eval], label="dropout=0.5 in eval() mode, where dropout does nothing")
    t.module("FeedForward", dict(d_model=8, d_ff=32), t.randn(2, 5, 8), mistakes=FFN_MISTAKES,
             label="(B, N, d_model) = (2, 5, 8), d_ff = 32")
    t.module("FeedForward", dict(d_model=6, d_ff=10), t.randn(7, 6), mistakes=FFN_MISTAKES,
             label="a (N, d_model) input without a batch dimension")
    t.module("FeedForward", dict(d_model=4, d_ff=16), t.randn(2, 3, 5, 4, dtype=torch.float64),
             dtype=torch.float64, mistakes=FFN_MISTAKES, label="float64, two leading dimensions")
    t.module("FeedForward", dict(d_model=8, d_ff=24, dropout=0.0), t.randn(3, 4, 8), grad=True,
             mistakes=FFN_MISTAKES, label="gradients")


# ----------------------------------------------------------------------------- EncoderLayer
def _enc(m, x, mask=None, *, norm_first=None, how="ok"):
    """The reference encoder layer with one deliberate change."""
    pre = m.norm_first if norm_first is None else norm_first
    n1, n2 = (m.norm2, m.norm1) if how == "norms_swapped" else (m.norm1, m.norm2)
    mask = None if how == "mask_dropped" else mask

    def attn(z):
        return m.self_attn(z, z, z, mask)[0]

    if how == "norm_inside":                       # x + norm(sublayer(x)): norm before the residual sum
        x = x + n1(attn(x))
        return x + n2(m.ffn(x))
    if how == "no_residual":
        if pre:
            x = attn(n1(x))
            return m.ffn(n2(x))
        x = n1(attn(x))
        return n2(m.ffn(x))
    if pre:
        h = n1(x)
        x = (h if how == "pre_residual_normed" else x) + attn(h)
        h = n2(x)
        return (h if how == "pre_residual_normed" else x) + m.ffn(h)
    x = n1(x + attn(x))
    return n2(x + m.ffn(x))


ENC_MISTAKES = [
    Mistake("norm before the residual sum: post-LN normalises the sum, x = norm1(x + attn(x)), "
            "not the sub-layer's output (x + norm1(attn(x)))", lambda m, x, mask=None: _enc(m, x, mask, how="norm_inside")),
    Mistake("norm_first ignored: with norm_first=True the layer is pre-LN, x = x + attn(norm1(x))",
            lambda m, x, mask=None: _enc(m, x, mask, norm_first=False)),
    Mistake("norm_first inverted: the default (norm_first=False) is post-LN, x = norm1(x + attn(x))",
            lambda m, x, mask=None: _enc(m, x, mask, norm_first=not m.norm_first)),
    Mistake("pre-LN residual adds the normalised input: x = x + attn(norm1(x)), not norm1(x) + attn(norm1(x))",
            lambda m, x, mask=None: _enc(m, x, mask, how="pre_residual_normed")),
    Mistake("mask not passed down: call self.self_attn(..., mask)", lambda m, x, mask=None: _enc(m, x, mask, how="mask_dropped")),
    Mistake("residual connection missing: add the sub-layer's input to its output",
            lambda m, x, mask=None: _enc(m, x, mask, how="no_residual")),
    Mistake("norm1 and norm2 swapped: norm1 belongs to the attention sub-layer, norm2 to the feed-forward",
            lambda m, x, mask=None: _enc(m, x, mask, how="norms_swapped")),
]
ENC = dict(mistakes=ENC_MISTAKES, deps=("FeedForward",))


def _padding(lengths, n):
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]   # (B, 1, 1, n)


def _random_mask(t, *shape):
    """A random bool mask whose rows all keep at least one key (the diagonal when square)."""
    mask = t.rand_bool(*shape, p=0.6)
    mask[..., 0] = True
    return mask


@hidden.test("test_EncoderLayer_post_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16)
    t.module("EncoderLayer", init, t.randn(2, 5, 8), label="post-LN, no mask", **ENC)
    t.module("EncoderLayer", dict(d_model=12, num_heads=3, d_ff=48), t.randn(3, 4, 12, dtype=torch.float64),
             dtype=torch.float64, label="post-LN, float64, 3 heads", **ENC)
    t.module("EncoderLayer", init, t.randn(1, 7, 8), grad=True, label="post-LN, gradients", **ENC)


@hidden.test("test_EncoderLayer_pre_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=True)
    t.module("EncoderLayer", init, t.randn(2, 5, 8), label="pre-LN, no mask", **ENC)
    t.module("EncoderLayer", dict(d_model=16, num_heads=4, d_ff=32, norm_first=True),
             t.randn(2, 3, 16, dtype=torch.float64), dtype=torch.float64, label="pre-LN, float64, 4 heads", **ENC)
    t.module("EncoderLayer", init, t.randn(1, 6, 8), mask=_padding([4], 6), grad=True,
             label="pre-LN, padding mask, gradients", **ENC)


@hidden.test("test_EncoderLayer_mask")
def _(t):
    for norm_first in (False, True):
        init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=norm_first)
        tag = "pre-LN" if norm_first else "post-LN"
        t.module("EncoderLayer", init, t.randn(3, 6, 8), mask=_padding([6, 4, 2], 6),
                 label=f"{tag}, a (B, 1, 1, N) padding mask", **ENC)
        t.module("EncoderLayer", init, t.randn(2, 5, 8), mask=_random_mask(t, 5, 5),
                 label=f"{tag}, an (N, N) mask", **ENC)
        t.module("EncoderLayer", init, t.randn(2, 4, 8), mask=_random_mask(t, 2, 2, 4, 4),
                 label=f"{tag}, a (B, h, N, N) mask, different per head", **ENC)


# ----------------------------------------------------------------------------- DecoderLayer
def _dec(m, x, memory, tgt_mask=None, memory_mask=None, *, norm_first=None, how="ok"):
    """The reference decoder layer with one deliberate change."""
    pre = m.norm_first if norm_first is None else norm_first
    n1, n2, n3 = m.norm1, m.norm2, m.norm3
    if how == "norms_swapped":
        n2, n3 = n3, n2
    if how == "tgt_mask_dropped":
        tgt_mask = None
    if how == "memory_mask_dropped":
        memory_mask = None
    if how == "masks_swapped":
        tgt_mask, memory_mask = memory_mask, tgt_mask

    def self_attn(z):
        return m.self_attn(z, z, z, tgt_mask)[0]

    def cross(z):
        if how == "kv_from_x":
            return m.cross_attn(z, z, z, memory_mask)[0]
        if how == "k_from_x":
            return m.cross_attn(z, z, memory, memory_mask)[0]
        if how == "q_from_memory":
            return m.cross_attn(memory, z, z, memory_mask)[0]
        if how == "memory_normed":
            mem = n2(memory)
            return m.cross_attn(z, mem, mem, memory_mask)[0]
        return m.cross_attn(z, memory, memory, memory_mask)[0]

    subs = [(n1, self_attn), (n2, cross), (n3, m.ffn)]
    if how == "no_cross":
        subs = [(n1, self_attn), (n3, m.ffn)]
    for norm, sub in subs:
        if how == "norm_inside":
            x = x + norm(sub(x))
        elif how == "no_residual":
            x = sub(norm(x)) if pre else norm(sub(x))
        elif pre:
            h = norm(x)
            x = (h if how == "pre_residual_normed" else x) + sub(h)
        else:
            x = norm(x + sub(x))
    return x


def _dm(how=None, norm_first=None):
    return lambda m, x, memory, tgt_mask=None, memory_mask=None: _dec(
        m, x, memory, tgt_mask, memory_mask, norm_first=None if norm_first is None else norm_first(m),
        how=how or "ok")


DEC_MISTAKES = [
    Mistake("cross-attention keys and values taken from the decoder input: use cross_attn(x, memory, memory, memory_mask)",
            _dm("kv_from_x")),
    Mistake("cross-attention keys taken from the decoder input: keys and values both come from memory",
            _dm("k_from_x")),
    Mistake("cross-attention queries taken from memory: queries come from the decoder, cross_attn(x, memory, memory)",
            _dm("q_from_memory")),
    Mistake("cross-attention missing: the decoder layer has three sub-layers", _dm("no_cross")),
    Mistake("norm before the residual sum: post-LN normalises the sum, x = norm1(x + sublayer(x))",
            _dm("norm_inside")),
    Mistake("norm_first ignored: with norm_first=True the decoder layer is pre-LN", _dm(norm_first=lambda m: False)),
    Mistake("norm_first inverted: the default (norm_first=False) is post-LN",
            _dm(norm_first=lambda m: not m.norm_first)),
    Mistake("pre-LN residual adds the normalised input: x = x + sublayer(norm(x))", _dm("pre_residual_normed")),
    Mistake("memory normalised: only the decoder's own input goes through norm2; keys and values are the raw memory",
            _dm("memory_normed")),
    Mistake("tgt_mask not passed down: the self-attention needs it, self_attn(x, x, x, tgt_mask)",
            _dm("tgt_mask_dropped")),
    Mistake("memory_mask not passed down: the cross-attention needs it, cross_attn(x, memory, memory, memory_mask)",
            _dm("memory_mask_dropped")),
    Mistake("masks swapped: tgt_mask goes to the self-attention, memory_mask to the cross-attention",
            _dm("masks_swapped")),
    Mistake("norm2 and norm3 swapped: norm2 belongs to the cross-attention, norm3 to the feed-forward",
            _dm("norms_swapped")),
    Mistake("residual connection missing: add each sub-layer's input to its output", _dm("no_residual")),
]
DEC = dict(mistakes=DEC_MISTAKES, deps=("FeedForward",))


@hidden.test("test_DecoderLayer_post_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16)
    t.module("DecoderLayer", init, t.randn(2, 4, 8), t.randn(2, 6, 8), label="post-LN, N_tgt=4, N_src=6", **DEC)
    t.module("DecoderLayer", dict(d_model=12, num_heads=4, d_ff=24), t.randn(1, 5, 12, dtype=torch.float64),
             t.randn(1, 3, 12, dtype=torch.float64), dtype=torch.float64, label="post-LN, float64, N_tgt=5, N_src=3", **DEC)
    t.module("DecoderLayer", init, t.randn(2, 3, 8), t.randn(2, 3, 8), grad=True,
             label="post-LN, N_tgt = N_src = 3, gradients", **DEC)


@hidden.test("test_DecoderLayer_pre_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=True)
    t.module("DecoderLayer", init, t.randn(2, 4, 8), t.randn(2, 6, 8), label="pre-LN, N_tgt=4, N_src=6", **DEC)
    t.module("DecoderLayer", dict(d_model=16, num_heads=4, d_ff=32, norm_first=True),
             t.randn(3, 2, 16, dtype=torch.float64), t.randn(3, 5, 16, dtype=torch.float64), dtype=torch.float64,
             label="pre-LN, float64, 4 heads", **DEC)
    t.module("DecoderLayer", init, t.randn(1, 3, 8), t.randn(1, 3, 8), grad=True,
             label="pre-LN, N_tgt = N_src = 3, gradients", **DEC)


@hidden.test("test_DecoderLayer_masks")
def _(t):
    for norm_first in (False, True):
        init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=norm_first)
        tag = "pre-LN" if norm_first else "post-LN"
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        t.module("DecoderLayer", init, t.randn(2, 4, 8), t.randn(2, 4, 8),
                 tgt_mask=torch.ones(4, 4, dtype=torch.bool).tril() & _padding([4, 2], 4),
                 memory_mask=_random_mask(t, 2, 2, 4, 4),
                 label=f"{tag}, causal + padding (B, 1, N, N) tgt_mask, (B, h, N_tgt, N_src) memory_mask", **DEC)
        t.module("DecoderLayer", init, t.randn(3, 5, 8), t.randn(3, 6, 8), causal, _padding([6, 3, 1], 6),
                 label=f"{tag}, causal (N, N) tgt_mask, (B, 1, 1, N_src) memory_mask", **DEC)
        t.module("DecoderLayer", init, t.randn(2, 3, 8), t.randn(2, 5, 8), tgt_mask=_random_mask(t, 2, 1, 3, 3),
                 label=f"{tag}, tgt_mask only", **DEC)
        t.module("DecoderLayer", init, t.randn(2, 3, 8), t.randn(2, 5, 8), memory_mask=_padding([2, 5], 5),
                 label=f"{tag}, memory_mask only", **DEC)


# ----------------------------------------------------------------------------- Transformer
def _embed(m, emb, tokens, how):
    x = emb(tokens)
    if how == "no_scale":
        pass
    elif how == "inverse_scale":
        x = x / math.sqrt(m.d_model)
    else:
        x = x * math.sqrt(m.d_model)
    if how != "no_pe":
        x = x + m.pe[:tokens.size(1)]
    return x


def _encode(m, src, src_mask=None, how="ok"):
    x = _embed(m, m.src_embed, src, how)
    for layer in m.encoder_layers:
        x = layer(x, None if how == "src_mask_dropped" else src_mask)
    return F.layer_norm(x, x.shape[-1:]) if how == "final_norm" else x


def _decode(m, tgt, memory, src_mask=None, tgt_mask=None, how="ok"):
    x = _embed(m, m.src_embed if how == "src_embed" else m.tgt_embed, tgt, how)
    for layer in m.decoder_layers:
        if how == "masks_swapped":
            x = layer(x, memory, src_mask, tgt_mask)
        else:
            x = layer(x, memory, None if how == "tgt_mask_dropped" else tgt_mask,
                      None if how in ("src_mask_dropped", "memory_mask_dropped") else src_mask)
    return F.layer_norm(x, x.shape[-1:]) if how == "final_norm" else x


def _forward(m, src, tgt, src_mask=None, tgt_mask=None, how="ok"):
    shared = ("no_scale", "inverse_scale", "final_norm", "no_pe")
    memory = _encode(m, src, src_mask, how if how in shared + ("src_mask_dropped",) else "ok")
    hidden_states = _decode(m, tgt, memory, src_mask, tgt_mask, "ok" if how == "src_mask_dropped" else how)
    if how == "no_out":
        return hidden_states
    logits = m.out(hidden_states)
    return torch.log_softmax(logits, -1) if how == "log_softmax" else (
        torch.softmax(logits, -1) if how == "softmax" else logits)


def _variant(fn, how, message):
    """A mistake model: ``fn`` (one of the reference computations above) with one deliberate change."""
    return Mistake(message, lambda m, *a, **k: fn(m, *a, how=how, **k))


def _common(fn):
    """Mistakes that encode, decode and forward share (each message a literal, for the translations)."""
    return [
        _variant(fn, "no_scale", message="embeddings not scaled by sqrt(d_model): "
                                         "x = embed(tokens) * sqrt(d_model) + pe[:N]"),
        _variant(fn, "inverse_scale", message="embeddings divided by sqrt(d_model): multiply by sqrt(d_model)"),
        _variant(fn, "no_pe", message="positional encoding missing: add self.pe[:N] to the scaled embeddings"),
        _variant(fn, "final_norm", message="extra final norm: the course's Transformer has no LayerNorm after "
                                           "either stack"),
    ]


ENCODE_MISTAKES = _common(_encode) + [
    _variant(_encode, "src_mask_dropped", message="src_mask not passed down: give it to every encoder layer")]
DECODE_MISTAKES = _common(_decode) + [
    _variant(_decode, "src_embed", message="decode must embed the target with tgt_embed, not src_embed"),
    _variant(_decode, "masks_swapped",
             message="masks swapped: a decoder layer is called as layer(x, memory, tgt_mask, src_mask)"),
    _variant(_decode, "tgt_mask_dropped", message="tgt_mask not passed down: give it to every decoder layer"),
    _variant(_decode, "memory_mask_dropped",
             message="src_mask not passed down to the decoder layers: it is their memory_mask")]
FORWARD_MISTAKES = _common(_forward) + [
    _variant(_forward, "src_embed", message="decode must embed the target with tgt_embed, not src_embed"),
    _variant(_forward, "tgt_mask_dropped", message="tgt_mask not passed down: give it to every decoder layer"),
    _variant(_forward, "src_mask_dropped", message="src_mask not passed down to the encoder layers"),
    _variant(_forward, "memory_mask_dropped",
             message="src_mask not passed to decode: the decoder layers need it as their memory_mask"),
    _variant(_forward, "no_out",
             message="forward returns the decoder's hidden states: apply self.out to get the logits"),
    _variant(_forward, "softmax", message="forward returns probabilities: return the logits, without a softmax"),
    _variant(_forward, "log_softmax",
             message="forward returns log-probabilities: return the logits, without a log_softmax")]
TRANSFORMER_DEPS = ("FeedForward", "EncoderLayer", "DecoderLayer")
SMALL = dict(src_vocab=13, tgt_vocab=11, d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=24)


def _tokens(t, vocab, B, N):
    return t.randint(0, vocab, (B, N))


@hidden.test("test_Transformer_encode")
def _(t):
    enc = dict(method="encode", mistakes=ENCODE_MISTAKES, deps=TRANSFORMER_DEPS)
    t.module("Transformer", SMALL, _tokens(t, 13, 2, 6), label="encode, no mask", **enc)
    t.module("Transformer", SMALL, _tokens(t, 13, 3, 7), _padding([7, 5, 2], 7),
             label="encode with a (B, 1, 1, N_src) padding mask", **enc)
    t.module("Transformer", dict(SMALL, d_model=8, num_heads=2, num_layers=3, d_ff=16), _tokens(t, 13, 2, 5),
             src_mask=_padding([3, 5], 5), dtype=torch.float64, label="encode, float64, 3 layers", **enc)
    t.module("Transformer", dict(SMALL, num_layers=1), _tokens(t, 13, 1, 4), label="encode, one layer", **enc)


@hidden.test("test_Transformer_decode")
def _(t):
    dec = dict(method="decode", mistakes=DECODE_MISTAKES, deps=TRANSFORMER_DEPS)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    t.module("Transformer", SMALL, _tokens(t, 11, 2, 5), t.randn(2, 6, 16), _padding([6, 3], 6), causal,
             label="decode, N_tgt=5, N_src=6, both masks", **dec)
    t.module("Transformer", SMALL, _tokens(t, 11, 3, 4), t.randn(3, 4, 16),
             tgt_mask=torch.ones(4, 4, dtype=torch.bool).tril() & _padding([4, 3, 2], 4),
             src_mask=_padding([2, 4, 3], 4), label="decode, causal + padding tgt_mask, N_tgt = N_src", **dec)
    t.module("Transformer", dict(SMALL, d_model=8, num_heads=2, d_ff=16), _tokens(t, 11, 2, 3),
             t.randn(2, 5, 8, dtype=torch.float64), dtype=torch.float64, label="decode, float64, no masks", **dec)


@hidden.test("test_Transformer_forward")
def _(t):
    fwd = dict(mistakes=FORWARD_MISTAKES, deps=TRANSFORMER_DEPS)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    t.module("Transformer", SMALL, _tokens(t, 13, 2, 6), _tokens(t, 11, 2, 4), _padding([6, 4], 6), causal,
             label="forward, both masks", **fwd)
    t.module("Transformer", SMALL, _tokens(t, 13, 3, 5), _tokens(t, 11, 3, 6),
             tgt_mask=torch.ones(6, 6, dtype=torch.bool).tril(), label="forward, tgt_mask only", **fwd)
    t.module("Transformer", dict(SMALL, num_layers=1, tgt_vocab=5), _tokens(t, 13, 2, 3), _tokens(t, 5, 2, 3),
             src_mask=_padding([1, 3], 3), label="forward, src_mask only", **fwd)
    t.module("Transformer", dict(SMALL, d_model=8, num_heads=2, d_ff=16), _tokens(t, 13, 2, 4),
             _tokens(t, 11, 2, 3), _padding([4, 2], 4), torch.ones(3, 3, dtype=torch.bool).tril(), grad=True,
             label="forward, gradients", **fwd)


# ----------------------------------------------------------------------------- greedy_decode
def _same_up_to_eos(eos_id):
    """Compare decoded batches as the spec grades them: same shape and, in every row, the same
    tokens up to and including the row's first eos_id (all of them in a row without one).
    What a row holds after its end is left open (the argmax, eos, padding)."""
    def equivalent(student, expected):
        if not isinstance(student, torch.Tensor) or student.shape != expected.shape \
                or student.dtype != expected.dtype:
            return False
        is_eos = (expected == eos_id).int()
        after_end = (is_eos.cumsum(dim=1) - is_eos) > 0          # strictly after the first eos
        return bool(((student == expected) | after_end).all())
    return equivalent


@torch.no_grad()
def _greedy(model, src, max_len, bos_id, eos_id, src_mask=None, how="ok"):
    """The reference greedy decoding with one deliberate change."""
    memory = model.encode(src, None if how == "src_mask_dropped" else src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len - 1 if how == "one_short" else max_len):
        n = ys.size(1)
        causal = None if how == "no_causal" else torch.ones(n, n, dtype=torch.bool).tril()
        if how == "causal_triu":
            causal = torch.ones(n, n, dtype=torch.bool).triu()
        elif how == "causal_inverted":
            causal = ~causal
        logits = model.out(model.decode(ys, memory, None if how == "src_mask_dropped" else src_mask, causal))
        next_token = logits[:, 0 if how == "first_position" else -1].argmax(dim=-1)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if how == "any_row" and finished.any():
            break
        if how != "never_stops" and finished.all():
            break
    return ys[:, 1:] if how == "drop_bos" else ys


def _greedy_mistake(how, message):
    return Mistake(message, lambda *a, **k: _greedy(*a, how=how, **k))


GREEDY_MISTAKES = [
    _greedy_mistake("any_row", message="decoding stops when any row ends: continue until EVERY row has produced "
                                       "eos_id"),
    _greedy_mistake("drop_bos", message="start token dropped: the output begins with bos_id in column 0"),
    _greedy_mistake("first_position", message="argmax taken at the wrong position: the next token comes from the "
                                              "logits of the LAST position, logits[:, -1]"),
    _greedy_mistake("never_stops", message="decoding never stops early: stop as soon as every row has produced "
                                           "eos_id"),
    _greedy_mistake("no_causal", message="no causal tgt_mask: decode the prefix with a causal mask, as in training"),
    _greedy_mistake("causal_triu", message="causal mask upside down: True (may attend) must be on and below the "
                                           "diagonal, torch.ones(n, n).tril(), not triu"),
    _greedy_mistake("causal_inverted", message="causal mask polarity inverted: True means MAY attend, so the causal "
                                               "mask is True on and below the diagonal"),
    _greedy_mistake("src_mask_dropped", message="src_mask not passed to model.encode and model.decode"),
    _greedy_mistake("one_short", message="one token short: max_len counts the tokens generated after bos_id, so "
                                         "without eos the output has max_len + 1 columns"),
]


def _eos_for(m, src, max_len, src_mask=None, how="staggered"):
    """Pick an eos id for a model argument from its own greedy output without any eos.

    "absent": a token no row produces (decoding runs all max_len steps);
    "staggered": a token every row produces, at first steps as different as possible
    (rows end at different steps; decoding stops when the last one ends), else one most
    rows produce.
    """
    free = ref.greedy_decode(m.module, src, max_len, BOS_ID, -1, src_mask)[:, 1:]     # (B, max_len)
    vocab = m.module.out.out_features
    if how == "absent":
        unused = [v for v in range(3, vocab) if not (free == v).any()]
        return unused[0] if unused else vocab
    best, best_key = None, None
    for v in range(3, vocab):
        hits = free == v
        rows = hits.any(1)
        firsts = torch.where(rows, hits.float().argmax(1), torch.full_like(rows, max_len, dtype=torch.long))
        key = (int(rows.sum()), len(set(firsts.tolist())), -int(firsts.max()))
        if best_key is None or key > best_key:
            best, best_key = v, key
    return best


BOS_ID = 1
GREEDY = dict(mistakes=GREEDY_MISTAKES)
MODEL = dict(src_vocab=9, tgt_vocab=12, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=32)


def _lively(m):
    """Random weights make a deep post-LN stack collapse: every position ends with nearly the same
    vector, and greedy decoding repeats one token. Smaller sub-layer outputs and biases, LayerNorm
    gains near 1 and smaller target embeddings keep positions, rows and the prefix apart."""
    model = m.module
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.mul_(0.1)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * p)
        for mod in model.modules():
            if isinstance(mod, ref.MultiHeadAttention):
                mod.W_o.weight.mul_(0.5)
            if isinstance(mod, ref.FeedForward):
                mod.linear2.weight.mul_(0.2)
        model.tgt_embed.weight.mul_(0.3)
        model.out.weight.mul_(3.0)
    m.state = {n: p.detach().clone() for n, p in model.named_parameters()}
    return m


def greedy_case(t, cfg, shape, max_len, draw, how="staggered", mask_lengths=None, dtype=None):
    """A model, a source batch, an eos id and a source mask for one greedy-decoding probe.

    Random models often decode one token over and over, which tells few mistakes apart;
    ``draw`` picks, among the builder's successive random models, one whose decoding is
    varied. The draws were chosen once, offline; the chapter's reference tests check
    that the cases together tell every mistake in GREEDY_MISTAKES from the reference.
    """
    for _ in range(draw + 1):
        m = _lively(t.model("Transformer", cfg, dtype=dtype))
        src = t.randint(0, cfg["src_vocab"], shape)
    mask = None if mask_lengths is None else _padding(mask_lengths, shape[1])
    return m, src, _eos_for(m, src, max_len, mask, how), mask


def _encodes_once(probe, calls):
    """How greedy_decode used the model (the kernel's record of its calls): encode once per source row."""
    if calls is None:
        return None
    if any(c["method"] == "forward" for c in calls):
        return ("greedy_decode calls the model itself (model(...), its forward), which runs the encoder again "
                "at every step: use only model.encode, once before the loop, then model.decode and model.out")
    rows = sum(c["rows"] or 0 for c in calls if c["method"] == "encode")
    if rows > probe.args[1].shape[0]:
        return ("the encoder runs at every step: the memory does not change while the target grows, so call "
                "model.encode once, before the loop")
    return None


def _greedy_probe(t, case, max_len, label):
    m, src, eos, mask = case
    kwargs = {} if mask is None else dict(src_mask=mask)
    return t.function("greedy_decode", m, src, max_len, BOS_ID, eos, label=label,
                      equivalent=_same_up_to_eos(eos), call_checks=[_encodes_once], **kwargs, **GREEDY)


# Each case: its label, the model config, the source shape, max_len, keyword arguments of greedy_case.
GREEDY_CASES = [
    dict(label="no row produces eos_id: max_len steps", cfg=MODEL, shape=(3, 5), max_len=6,
         how=dict(draw=0, how="absent")),
    dict(label="one row, stops at its eos_id", cfg=MODEL, shape=(1, 4), max_len=8, how=dict(draw=0)),
    dict(label="four rows that end at different steps", cfg=MODEL, shape=(4, 6), max_len=10, how=dict(draw=3)),
    dict(label="3 layers, a padded source with src_mask", cfg=dict(MODEL, num_layers=3, d_model=8, d_ff=16),
         shape=(3, 6), max_len=9, how=dict(draw=1, mask_lengths=[6, 4, 2])),
    dict(label="a float64 model, two rows", cfg=dict(MODEL, tgt_vocab=10), shape=(2, 3), max_len=7,
         how=dict(draw=5, dtype=torch.float64)),
    dict(label="max_len = 1", cfg=MODEL, shape=(3, 5), max_len=1, how=dict(draw=0, how="absent")),
]


@hidden.test("test_greedy_decode")
def _(t):
    for case in GREEDY_CASES:
        _greedy_probe(t, greedy_case(t, case["cfg"], case["shape"], case["max_len"], **case["how"]),
                      case["max_len"], case["label"])
