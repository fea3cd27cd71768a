"""Hidden tests (instructor-only) for chapter 10_attention_kernels.

generated from course/10_attention_kernels.py by `make generate`; do not edit.
"""



import math
import types

import torch
import torch.nn.functional as F

from autograder.hidden import HiddenTests, Mistake
from autograder.judge.compare import close


# The reference the judge compares with: plain PyTorch in float32, computed in a process that never ran
# submitted code (the chapter's Triton kernels are the learner's to write; under the interpreter they would
# only be slower copies of these).
def _scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else scale


def _hide_above(n, m, allowed):
    """(n, m) bool, True where query i may NOT see key j; ``allowed(i, j)`` the keys it may see."""
    i = torch.arange(n)[:, None]
    j = torch.arange(m)[None, :]
    return ~allowed(i, j)


def _scores(q, k, causal=False, scale=None, allowed=None):
    """float32 scores (..., N, N): scale * q k^T, -inf where causal hides j > i (or where ``allowed`` says)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * _scale(q.size(-1), scale)
    if causal or allowed is not None:
        rule = allowed or (lambda i, j: j <= i)
        s = s.masked_fill(_hide_above(s.size(-2), s.size(-1), rule), float("-inf"))
    return s


def _attend(s, v, dtype):
    return (torch.softmax(s, -1) @ v.float()).to(dtype), torch.logsumexp(s, -1)


def softmax(x):
    return torch.softmax(x.float(), -1).to(x.dtype)


def softmax_of_columns(x, start, stop):
    return softmax(x[:, start:stop])


def _block_ends(C, block_size):
    return [min((b + 1) * block_size, C) for b in range((C + block_size - 1) // block_size)]


def online_softmax_states(x, block_size):
    x = x.float()
    ends = _block_ends(x.size(1), block_size)
    m = torch.stack([x[:, :e].amax(-1) for e in ends], -1)
    l = torch.stack([torch.exp(x[:, :e] - m[:, b:b + 1]).sum(-1) for b, e in enumerate(ends)], -1)
    return m, l


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    return _attend(_scores(q, k, causal, scale), v, q.dtype)


def _naive_gradients(q, k, v, do, causal=False, scale=None):
    with torch.enable_grad():          # a stand-in answers inside the learner's backward, where grad is off
        q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
        o = torch.softmax(_scores(q, k, causal, scale), -1) @ v
        o.backward(do.float())
    return q.grad, k.grad, v.grad


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
    return tuple(g.to(q.dtype) for g in _naive_gradients(q, k, v, do, causal, scale))


def flash_attention(q, k, v, causal=False, scale=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * _scale(q.size(-1), scale)
    if causal:
        s = s.masked_fill(_hide_above(s.size(-2), s.size(-1), lambda i, j: j <= i), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def saved_numels(q, k, v, causal=False, scale=None):
    B, H, N, d = q.shape
    return torch.tensor(sorted([q.numel(), k.numel(), v.numel(), q.numel(), B * H * N]))


def _split_bounds(N, num_splits):
    L = -(-N // num_splits)
    return [(s * L, min((s + 1) * L, N)) for s in range(num_splits)]


def _decode_scores(q, k, scale=None):
    """(B, H, N) scores of one query per head."""
    return torch.einsum("bhd,bhnd->bhn", q.float(), k.float()) * _scale(q.size(-1), scale)


def flash_decoding_partials(q, k, v, num_splits, scale=None, block_n=16, bounds=None):
    s = _decode_scores(q, k, scale)
    parts = bounds(k.size(2), num_splits) if bounds else _split_bounds(k.size(2), num_splits)
    o = torch.stack([torch.einsum("bhn,bhnd->bhd", s[..., a:b].softmax(-1), v[:, :, a:b].float())
                     for a, b in parts], dim=2)
    lse = torch.stack([s[..., a:b].logsumexp(-1) for a, b in parts], dim=-1)
    return o, lse


def combine_partials(o_part, lse_part):
    lse = torch.logsumexp(lse_part.float(), -1)
    weights = torch.exp(lse_part.float() - lse[..., None])                    # (B, H, S)
    return (weights[..., None] * o_part.float()).sum(2), lse


def _gathered(k_cache, block_table, seq_len, b, physical=None, slot=None):
    """(H, L, d): sequence b's keys (or values) gathered with torch."""
    bs = k_cache.size(2)
    t = torch.arange(int(seq_len))
    blocks = block_table[b, t // bs].long() if physical is None else physical(block_table, b, t, bs)
    slots = t % bs if slot is None else slot(t, bs)
    return k_cache[blocks, :, slots].transpose(0, 1)


def paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale=None, lengths=None, **gather):
    out = []
    for b in range(q.size(0)):
        n = int(seq_lens[b]) if lengths is None else lengths(seq_lens, b, k_cache.size(2))
        k = _gathered(k_cache, block_table, n, b, **gather).float()
        v = _gathered(v_cache, block_table, n, b, **gather).float()
        w = torch.softmax(torch.einsum("hd,hld->hl", q[b].float(), k) * _scale(q.size(-1), scale), -1)
        out.append(torch.einsum("hl,hld->hd", w, v))
    return torch.stack(out).to(q.dtype)


REFERENCE = types.SimpleNamespace(
    softmax=softmax, softmax_of_columns=softmax_of_columns, online_softmax_states=online_softmax_states,
    flash_attention_forward=flash_attention_forward, flash_attention_backward=flash_attention_backward,
    flash_attention=flash_attention, saved_numels=saved_numels, flash_decoding_partials=flash_decoding_partials,
    combine_partials=combine_partials, paged_decoding=paged_decoding)
KERNEL_ONLY = {"softmax", "online_softmax_states", "flash_attention_forward", "flash_attention_backward",
               "flash_attention", "flash_decoding_partials", "combine_partials", "paged_decoding"}
hidden = HiddenTests(REFERENCE, kernel_only=KERNEL_ONLY)


def within(atol, rtol):
    """An ``equivalent`` rule for half-precision results: same shapes and dtypes, values within (atol, rtol)."""
    def rule(student, expected):
        if isinstance(expected, tuple):
            return (isinstance(student, (tuple, list)) and len(student) == len(expected)
                    and all(rule(s, e) for s, e in zip(student, expected)))
        if not (isinstance(student, torch.Tensor) and isinstance(expected, torch.Tensor)):
            return False
        if student.shape != expected.shape or student.dtype != expected.dtype:
            return False
        if not student.is_floating_point() or student.dtype in (torch.float32, torch.float64):
            return close(student, expected)
        return bool(torch.allclose(student.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=True))
    return rule


HALF = within(3e-3, 3e-3)


def _softmax_padded_with_zeros(x):
    """The lanes past C loaded as 0 (not -inf): each of them adds exp(0 - max) to the row's sum."""
    C = x.size(1)
    pad = max(1, 1 << (C - 1).bit_length()) - C
    z = torch.cat([x.float(), torch.zeros(x.size(0), pad)], 1)
    return torch.softmax(z, -1)[:, :C].to(x.dtype)


def _softmax_without_max(x):
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def _softmax_rows_contiguous(x, start, stop):
    """Row r read at r * C from the slice's start, as if the rows were contiguous."""
    R, C = x.size(0), stop - start
    flat = x.reshape(-1)[start:start + R * C].reshape(R, C)
    return softmax(flat)


def _softmax_over_columns(x):
    return torch.softmax(x.float(), 0).to(x.dtype)


SOFTMAX_MISTAKES = [
    Mistake("the lanes past C were loaded as 0, not -inf: each adds exp(0 - max) to the sum; load them with "
            "other=float(\"-inf\")", _softmax_padded_with_zeros),
    Mistake("the softmax runs over the columns of the tensor (its first axis): one program normalises one row",
            _softmax_over_columns),
]


@hidden.test("test_softmax_values")
def _(t):
    P = dict(mistakes=SOFTMAX_MISTAKES)
    t.function("softmax", t.randn(7, 50), label="(7, 50): C not a power of two", **P)
    t.function("softmax", t.randn(3, 64) * 3, label="(3, 64): C a power of two", **P)
    t.function("softmax", t.randn(4, 1), label="one column", **P)
    t.function("softmax", t.randn(2, 1000), label="(2, 1000)", **P)
    t.function("softmax", t.randn(1, 4096), label="C = 4,096", **P)


@hidden.test("test_softmax_strided_rows")
def _(t):
    M = dict(mistakes=[Mistake("the rows were read as if contiguous (row r at r * C): row r starts x.stride(0) "
                               "elements after row r - 1; pass the row stride to the kernel",
                               _softmax_rows_contiguous)])
    t.function("softmax_of_columns", t.randn(5, 80), 3, 60, label="a (5, 57) column slice of a (5, 80) tensor", **M)
    t.function("softmax_of_columns", t.randn(3, 40), 0, 17, label="the first 17 of 40 columns", **M)
    t.function("softmax_of_columns", t.randn(4, 70, dtype=torch.float16), 5, 38, equivalent=HALF,
               label="float16, a column slice", **M)
    t.function("softmax", t.randn(6, 33, dtype=torch.float16), equivalent=HALF, label="float16 in, float16 out",
               mistakes=SOFTMAX_MISTAKES)


@hidden.test("test_softmax_large_entries")
def _(t):
    M = dict(mistakes=[Mistake("exp overflowed on large entries: subtract the row's maximum (tl.max) before exp",
                               _softmax_without_max)] + SOFTMAX_MISTAKES)
    big = t.randn(3, 40) * 3000
    big[0, 5] = 1.0e4
    t.function("softmax", big, label="(3, 40), entries up to 1e4", **M)
    t.function("softmax", torch.tensor([[1.0e4, 0.0, -1.0e4], [5.0e3, 5.0e3, -3.0e3]]), label="1e4 and -1e4", **M)
    t.function("softmax", -2000 + t.randn(2, 25), label="every entry near -2,000 (exp underflows without the max)",
               **M)


def _states(x, block_size, rescale=True, block_max_only=False, pad_with_zeros=False, exp_of_x=False):
    """The online update, block by block, with one step replaceable."""
    x = x.float()
    R, C = x.shape
    if pad_with_zeros:
        n = len(_block_ends(C, block_size)) * block_size
        x = torch.cat([x, torch.zeros(R, n - C)], 1)
        C = n
    m = torch.full((R,), float("-inf"))
    l = torch.zeros(R)
    ms, ls = [], []
    for start in range(0, C, block_size):
        block = x[:, start:start + block_size]
        m_new = block.amax(-1) if block_max_only else torch.maximum(m, block.amax(-1))
        terms = torch.exp(block).sum(-1) if exp_of_x else torch.exp(block - m_new[:, None]).sum(-1)
        l = (l * torch.exp(m - m_new) if rescale else l) + terms
        m = m_new
        ms.append(m)
        ls.append(l)
    return torch.stack(ms, -1), torch.stack(ls, -1)


def _states_with(**wrong):
    return lambda x, block_size: _states(x, block_size, **wrong)


STATES_MISTAKES = [
    Mistake("l was not rescaled when the maximum grew: l_new = l * exp(m_old - m_new) + sum(exp(x - m_new))",
            _states_with(rescale=False)),
    Mistake("m is the maximum of the current block only: the running maximum is max(m_old, max of the block)",
            _states_with(block_max_only=True)),
    Mistake("the columns past C were counted as 0 in the last block: load them as -inf (exp(-inf) = 0)",
            _states_with(pad_with_zeros=True)),
    Mistake("l sums exp(x), not exp(x - m): the exponent must be x - m_new, at most 0",
            _states_with(exp_of_x=True)),
]


@hidden.test("test_online_softmax_states_values")
def _(t):
    P = dict(mistakes=STATES_MISTAKES, returns=("m", "l"))
    t.function("online_softmax_states", t.randn(3, 70) * 3, 16, label="(3, 70), blocks of 16, the last ragged", **P)
    t.function("online_softmax_states", torch.arange(40.0).reshape(1, 40) / 4, 16,
               label="an increasing row: the maximum grows at every block", **P)
    t.function("online_softmax_states", t.randn(2, 64), 32, label="(2, 64), blocks of 32, none ragged", **P)
    t.function("online_softmax_states", t.randn(17, 50) * 2, 16, label="17 rows, 50 columns", **P)
    t.function("online_softmax_states", t.randn(2, 20), 64, label="one block wider than the row", **P)


@hidden.test("test_online_softmax_states_logsumexp")
def _(t):
    P = dict(mistakes=STATES_MISTAKES, returns=("m", "l"))
    big = t.randn(2, 33) * 10
    big[0, 20] = 1.0e4
    big[1, 2] = -1.0e4
    t.function("online_softmax_states", big, 16, label="entries of +-1e4", **P)
    t.function("online_softmax_states", -60 + t.randn(2, 48), 16, label="every entry near -60", **P)


def _online_attention(q, k, v, causal=False, scale=None, block_m=16, block_n=16, allowed=None, rescale=True,
                      normalise=True, ragged_scores_zero=False, lse_of=None):
    """FlashAttention's loop over key tiles in torch, with one step replaceable (float32)."""
    N, M = q.size(-2), k.size(-2)
    s = _scores(q, k, causal, scale, allowed)
    if ragged_scores_zero:          # the keys past N of the last tile: loaded as 0 and not masked, score 0
        pad = -(-M // block_n) * block_n - M
        s = torch.cat([s, torch.zeros(*s.shape[:-1], pad)], -1)
        if causal:
            s[..., M:] = torch.where(torch.arange(N)[:, None] >= torch.arange(M, M + pad)[None, :], 0.0,
                                     float("-inf"))
        v = torch.cat([v.float(), torch.zeros(*v.shape[:-2], pad, v.size(-1))], -2)
    m = torch.full(s.shape[:-1], float("-inf"))
    l = torch.zeros(s.shape[:-1])
    acc = torch.zeros(*s.shape[:-1], v.size(-1))
    for start in range(0, s.size(-1), block_n):
        tile = s[..., start:start + block_n]
        m_new = torch.maximum(m, tile.amax(-1))
        alpha = torch.exp(torch.where(torch.isinf(m) & torch.isinf(m_new), 0.0, m - m_new))
        p = torch.exp(tile - torch.where(torch.isinf(m_new), 0.0, m_new)[..., None])
        l = l * alpha + p.sum(-1)
        acc = (acc * alpha[..., None] if rescale else acc) + p @ v[..., start:start + block_n, :].float()
        m = m_new
    o = acc / l[..., None] if normalise else acc
    lse = m + torch.log(l) if lse_of is None else lse_of(m, l)
    return o.to(q.dtype), lse


def _forward_with(**wrong):
    def compute(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        return _online_attention(q, k, v, causal, scale, block_m, block_n, **wrong)
    return compute


def _forward_scaled(times):
    """The scores scaled ``times`` times (0: no scale; 2: twice)."""
    def compute(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        return _attend(_scores(q, k, causal, _scale(q.size(-1), scale) ** times), v, q.dtype)
    return compute


def _forward_default_scale(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    return _attend(_scores(q, k, causal), v, q.dtype)


def _forward_lse_unscaled(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    o, _ = _attend(_scores(q, k, causal, scale), v, q.dtype)
    return o, torch.logsumexp(_scores(q, k, causal, 1.0), -1)


def _forward_causal(rule):
    def compute(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        if not causal:
            return _attend(_scores(q, k, False, scale), v, q.dtype)
        return _attend(_scores(q, k, scale=scale, allowed=rule(block_m)), v, q.dtype)
    return compute


def _forward_not_causal(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    return _attend(_scores(q, k, False, scale), v, q.dtype)


FORWARD_MISTAKES = [
    Mistake("lse is log(l) without the maximum: it is m + log(l)",
            _forward_with(lse_of=lambda m, l: torch.log(l))),
    Mistake("lse is in base 2: with exp2 and scores times log2(e), convert back: lse = (m + log2(l)) * ln(2)",
            _forward_with(lse_of=lambda m, l: (m + torch.log(l)) / math.log(2))),
    Mistake("the output was not divided by l at the end: o = acc / l", _forward_with(normalise=False)),
    Mistake("acc was not rescaled by exp(m_old - m_new) when the maximum grew", _forward_with(rescale=False)),
    Mistake("the scores were scaled twice (the scale applied to q and again to q . k)", _forward_scaled(2)),
    Mistake("the scores were not scaled: they are scale * q . k with scale = 1 / sqrt(d) by default",
            _forward_scaled(0)),
    Mistake("the scale argument was ignored: 1 / sqrt(d) is only the default, when scale is None",
            _forward_default_scale),
    Mistake("lse is the logsumexp of the unscaled scores: save the logsumexp of scale * q . k, the scores the "
            "softmax used", _forward_lse_unscaled),
    Mistake("the keys past N in the last tile were loaded as 0 and scored 0, not -inf: mask cols >= N in the "
            "scores", _forward_with(ragged_scores_zero=True)),
]
CAUSAL_MISTAKES = [
    Mistake("causal=True was ignored: query i sees keys j <= i only", _forward_not_causal),
    Mistake("the causal mask hides the diagonal: query i sees keys j <= i, itself included",
            _forward_causal(lambda bm: lambda i, j: j < i)),
    Mistake("the diagonal tile was not masked: inside the query tile's last key tile, keys j > i must get -inf",
            _forward_causal(lambda bm: lambda i, j: j < (i // bm + 1) * bm)),
    Mistake("the key loop stops one tile early: it runs to the end of the query tile, (i + 1) * block_m, "
            "the diagonal tile included", _forward_causal(lambda bm: lambda i, j: j < (i // bm) * bm)),
]


def _qkv(t, *shape, dtype=torch.float32):
    return tuple(t.randn(*shape, dtype=dtype) for _ in range(3))


FORWARD = dict(mistakes=FORWARD_MISTAKES + CAUSAL_MISTAKES, returns=("o", "lse"))
LONG_N = 2048          # one head: its (N, N) float32 scores would be 16 MiB


@hidden.test("test_flash_attention_forward_values",
             max_memory=(8 * 2**20, "flash_attention_forward used more than 8 MiB at N = 2,048 (one head of 16): "
                                    "a tensor of N x N elements was allocated; keep only tiles"))
def _(t):
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 32, 16), label="(1, 2, 32, 16)", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 2, 1, 64, 32), block_m=32, block_n=16,
               label="(2, 1, 64, 32), tiles 32 x 16", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 48, 16), block_m=16, block_n=32,
               label="tiles 16 x 32", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 32, 16), scale=0.3, label="scale=0.3", **FORWARD)
    t.function("flash_attention_forward", *(x * 3 for x in _qkv(t, 1, 1, 64, 16)), label="large scores", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 16, 128), label="d = 128", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, LONG_N, 16), block_m=128, block_n=128,
               label="N = 2,048, tiles of 128", **FORWARD)


@hidden.test("test_flash_attention_forward_causal")
def _(t):
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 48, 16), causal=True, label="causal, 48, tiles 16", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 64, 16), causal=True, block_m=32, block_n=16,
               label="causal, tiles 32 x 16", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 64, 32), causal=True, block_m=16, block_n=32,
               label="causal, tiles 16 x 32", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 2, 1, 32, 16), causal=True, scale=0.7,
               label="causal, scale=0.7", **FORWARD)


def _ragged_keys_read_unmasked(probe, value):
    """Hint: the outputs of every head but the last are attention over its N keys and the next head's first
    keys up to the end of the last tile, as unmasked loads of contiguous q, k, v read them (the last head's
    tile runs past the tensor, into memory nobody can model)."""
    q, k, v = probe.args[:3]
    B, H, N, d = q.shape
    block_n = probe.kwargs.get("block_n", 16)
    end = -(-N // block_n) * block_n
    if probe.kwargs.get("causal") or end == N or B * H < 2 or not isinstance(value, (tuple, list)):
        return None
    k_rows, v_rows = k.reshape(B * H * N, d).float(), v.reshape(B * H * N, d).float()   # (B*H*N, d)
    o = value[0].reshape(B * H, N, d)
    for z in range(B * H - 1):
        keys, values = k_rows[z * N:z * N + end], v_rows[z * N:z * N + end]            # (end, d): past N too
        s = q.reshape(B * H, N, d)[z].float() @ keys.T * _scale(d, probe.kwargs.get("scale"))
        if not close(o[z].float(), torch.softmax(s, -1) @ values):
            return None
    return ("the keys past N in the last tile were read unmasked (here the next head's keys): mask the loads of "
            "k and v and the scores at cols >= N")


@hidden.test("test_flash_attention_forward_ragged")
def _(t):
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 37, 32), label="N = 37",
               checks=[_ragged_keys_read_unmasked], **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 37, 16), causal=True, label="N = 37, causal", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 2, 1, 5, 16), label="N = 5, smaller than a tile", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 1, 16), causal=True, label="N = 1", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 70, 16), block_m=32, block_n=32, causal=True,
               label="N = 70, tiles 32, causal", **FORWARD)


@hidden.test("test_flash_attention_forward_float16")
def _(t):
    H = dict(FORWARD, equivalent=HALF)
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 40, 64, dtype=torch.float16), causal=True,
               label="float16, causal, N = 40, d = 64", **H)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 33, 16, dtype=torch.float16),
               label="float16, N = 33", **H)


def _forward_results(q, k, v, causal=False, scale=None):
    """(o, lse) of the reference: the backward's tests get them as given inputs."""
    o, lse = flash_attention_forward(q, k, v, causal, scale)
    return o, lse


def _manual_gradients(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16, delta_of_p=False,
                      dq_scale=1, ds_scale=True, p_scale=True, swap_dk_dv=False, dv_untransposed=False,
                      ignore_causal=False):
    """FlashAttention-2's backward formulas in torch (float32), with one step replaceable."""
    c = _scale(q.size(-1), scale)
    qf, kf, vf, of, dof = (x.float() for x in (q, k, v, o, do))
    s = _scores(qf, kf, causal and not ignore_causal, c if p_scale else 1.0)
    p = torch.exp(s - lse[..., None])
    dp = dof @ vf.transpose(-1, -2)
    delta = p.sum(-1) if delta_of_p else (dof * of).sum(-1)
    ds = p * (dp - delta[..., None])
    w = c if ds_scale else 1.0
    dq = (ds @ kf) * w * (c if dq_scale == 2 else 1.0)
    dk = (ds.transpose(-1, -2) @ qf) * w
    dv = (p if dv_untransposed else p.transpose(-1, -2)) @ dof
    if swap_dk_dv:
        dk, dv = dv, dk
    return tuple(g.to(q.dtype) for g in (dq, dk, dv))


def _backward_with(**wrong):
    def compute(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
        return _manual_gradients(q, k, v, o, lse, do, causal, scale, **wrong)
    return compute


BACKWARD_MISTAKES = [
    Mistake("D was computed from P: D_i = rowsum(dO * O), the output's, not the probabilities' (whose rows sum "
            "to 1)", _backward_with(delta_of_p=True)),
    Mistake("dq was scaled twice: dS already carries no scale, multiply dq = dS k by the scale once",
            _backward_with(dq_scale=2)),
    Mistake("dq and dk miss the scale: the scores are scale * q . k, so dq = scale * dS k and dk = scale * dS^T q",
            _backward_with(ds_scale=False)),
    Mistake("the probabilities were recomputed without the scale: P = exp(scale * q . k - lse)",
            _backward_with(p_scale=False)),
    Mistake("dk and dv were swapped: return (dq, dk, dv) in that order", _backward_with(swap_dk_dv=True)),
    Mistake("dv = P dO: it is P^T dO, each key's probabilities over the queries", _backward_with(dv_untransposed=True)),
    Mistake("causal=True was ignored in the backward: P is 0 where j > i", _backward_with(ignore_causal=True)),
]
BACKWARD = dict(mistakes=BACKWARD_MISTAKES, returns=("dq", "dk", "dv"))


def _backward_probe(t, shape, causal=False, scale=None, dtype=torch.float32, **kwargs):
    q, k, v = _qkv(t, *shape, dtype=dtype)
    do = t.randn(*shape, dtype=dtype)
    o, lse = _forward_results(q, k, v, causal, scale)
    t.function("flash_attention_backward", q, k, v, o, lse, do, causal=causal, scale=scale, **kwargs, **BACKWARD)


@hidden.test("test_flash_attention_backward_values")
def _(t):
    _backward_probe(t, (1, 2, 32, 16), label="(1, 2, 32, 16)")
    _backward_probe(t, (1, 1, 48, 16), block_m=32, block_n=16, label="tiles 32 x 16")   # block_m is not d
    _backward_probe(t, (2, 1, 32, 16), block_m=16, block_n=32, scale=0.25, label="tiles 16 x 32, scale=0.25")
    _backward_probe(t, (1, 1, 32, 16), dtype=torch.float16, equivalent=within(2e-2, 2e-2), label="float16")


# Memory is judged here, not in the cell above: that cell's visible test is the notebook's first autograd
# backward, whose engine start-up alone raises the kernel's memory by about 30 MiB.
@hidden.test("test_flash_attention_backward_causal",
             max_memory=(8 * 2**20, "flash_attention_backward used more than 8 MiB at N = 2,048 (one head of 16): "
                                    "a tensor of N x N elements was allocated; recompute P tile by tile"))
def _(t):
    _backward_probe(t, (1, 1, LONG_N, 16), causal=True, block_m=128, block_n=128,
                    label="causal, N = 2,048, tiles of 128")
    _backward_probe(t, (1, 1, 37, 32), causal=True, block_m=16, block_n=32, label="causal, N = 37, tiles 16 x 32")
    _backward_probe(t, (1, 2, 40, 16), causal=True, block_m=32, block_n=16, label="causal, N = 40, tiles 32 x 16")
    _backward_probe(t, (1, 1, 5, 16), causal=True, label="causal, N = 5")
    _backward_probe(t, (1, 1, 37, 16), label="not causal, N = 37")
    _backward_probe(t, (1, 1, 32, 16), causal=True, scale=0.5, label="causal, scale=0.5")


FLASH_DEPS = ("flash_attention_forward", "flash_attention_backward")


@hidden.test("test_flash_attention_gradients")
def _(t):
    t.function("flash_attention", *_qkv(t, 1, 2, 24, 16), causal=True, grad=True, deps=FLASH_DEPS,
               label="causal, gradients through loss.backward()")
    t.function("flash_attention", *_qkv(t, 1, 1, 20, 16), scale=0.5, grad=True, deps=FLASH_DEPS,
               label="scale=0.5, gradients")
    t.function("flash_attention", *_qkv(t, 2, 1, 16, 32), grad=True, deps=FLASH_DEPS, label="B = 2, gradients")


@hidden.test("test_flash_attention_saved")
def _(t):
    t.function("saved_numels", *_qkv(t, 1, 1, 40, 16), deps=FLASH_DEPS, label="sizes of the saved tensors, N = 40")
    t.function("saved_numels", *_qkv(t, 2, 2, 24, 16), causal=True, deps=FLASH_DEPS,
               label="sizes of the saved tensors, causal")


def _partials_with(bounds):
    return lambda q, k, v, num_splits, scale=None, block_n=16: flash_decoding_partials(
        q, k, v, num_splits, scale, block_n, bounds=bounds)


def _partials_scaled(times):
    return lambda q, k, v, num_splits, scale=None, block_n=16: flash_decoding_partials(
        q, k, v, num_splits, _scale(q.size(-1), scale) ** times, block_n)


def _overlapping_bounds(block_n):
    """A split's tiles masked only at N: split s covers [s * L, the end of the tile that holds its last key)."""
    def bounds(N, S):
        L = -(-N // S)
        return [(s * L, min(s * L + -(-L // block_n) * block_n, N)) for s in range(S)]
    return bounds


_ROUNDED_DOWN = ("the splits have N // num_splits keys, rounded down: L = ceil(N / num_splits), the last split "
                 "shorter")
# the models that do not depend on the tile width are shared by every probe: each is alive if any probe tells it apart
_SPLIT_MISTAKES = (  # L = N // num_splits: the last split stretched to N, or the last N % num_splits keys never read
    Mistake(_ROUNDED_DOWN, _partials_with(lambda N, S: [(s * (N // S), (s + 1) * (N // S) if s < S - 1 else N)
                                                        for s in range(S)])),
    Mistake(_ROUNDED_DOWN, _partials_with(lambda N, S: [(s * (N // S), (s + 1) * (N // S)) for s in range(S)])),
)
_UNSCALED = Mistake("the scores were not scaled: they are scale * q . k, scale = 1 / sqrt(d) by default",
                    _partials_scaled(0))


def _partials_mistakes(block_n):
    return [*_SPLIT_MISTAKES,
            Mistake("a split's last tile runs past the split's end: mask keys at or after min((s + 1) * L, N), so "
                    "that no key is counted by two splits", _partials_with(_overlapping_bounds(block_n))),
            _UNSCALED]


# one list per tile width
_PARTIALS_MISTAKES = {block_n: _partials_mistakes(block_n) for block_n in (16, 32, 64)}


def _decode_inputs(t, B, H, N, d):
    return t.randn(B, H, d), t.randn(B, H, N, d), t.randn(B, H, N, d)


@hidden.test("test_flash_decoding_partials_values")
def _(t):
    R = ("o_part", "lse_part")
    t.function("flash_decoding_partials", *_decode_inputs(t, 2, 2, 100, 16), 3, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="N = 100, 3 splits")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 3, 64, 32), 4, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="N = 64, 4 splits of 16")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 1, 90, 16), 5, scale=0.2, block_n=32, returns=R,
               mistakes=_PARTIALS_MISTAKES[32], label="scale=0.2, block_n=32")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 2, 20, 64), 1, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="one split, d = 64")


@hidden.test("test_flash_decoding_partials_split_edges")
def _(t):
    R = ("o_part", "lse_part")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 2, 70, 32), 2, block_n=16, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="splits of 35, tiles of 16")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 1, 50, 16), 3, block_n=16, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="splits of 17, the last 16")
    t.function("flash_decoding_partials", *_decode_inputs(t, 2, 1, 33, 16), 2, block_n=64, returns=R,
               mistakes=_PARTIALS_MISTAKES[64], label="tiles of 64 wider than a split")


def _combine_mean(o_part, lse_part):
    return o_part.float().mean(2), torch.logsumexp(lse_part.float(), -1)


def _combine_weights(weights_of):
    def compute(o_part, lse_part):
        lse = torch.logsumexp(lse_part.float(), -1)
        return (weights_of(lse_part.float(), lse)[..., None] * o_part.float()).sum(2), lse
    return compute


def _combine_lse_max(o_part, lse_part):
    o, _ = combine_partials(o_part, lse_part)
    return o, lse_part.float().amax(-1)


def _combine_unstable(o_part, lse_part):
    e = torch.exp(lse_part.float())
    s = e.sum(-1)
    return ((e / s[..., None])[..., None] * o_part.float()).sum(2), torch.log(s)


COMBINE_MISTAKES = [
    Mistake("the splits' outputs were averaged: weight split s by exp(lse_s - lse), its share of the softmax",
            _combine_mean),
    Mistake("the weights are exp(lse_s), not divided by the total: weight by exp(lse_s - lse)",
            _combine_weights(lambda part, lse: torch.exp(part))),
    Mistake("the weights are lse_s / sum(lse): weight by exp(lse_s - lse)",
            _combine_weights(lambda part, lse: part / part.sum(-1, keepdim=True))),
    Mistake("lse is the largest lse_s: it is log(sum_s exp(lse_s)) = m + log(sum_s exp(lse_s - m))",
            _combine_lse_max),
    Mistake("exp(lse_s) overflowed: subtract the largest lse_s before exp", _combine_unstable),
]


def _partials_of(t, B, H, S, d, spread=3.0):
    return t.randn(B, H, S, d), t.randn(B, H, S) * spread


@hidden.test("test_combine_partials_values")
def _(t):
    P = dict(mistakes=COMBINE_MISTAKES, returns=("o", "lse"))
    t.function("combine_partials", *_partials_of(t, 2, 3, 5, 16), label="5 splits", **P)
    t.function("combine_partials", *_partials_of(t, 1, 2, 8, 32), label="8 splits", **P)
    t.function("combine_partials", *_partials_of(t, 1, 1, 1, 16), label="one split", **P)
    t.function("combine_partials", *_partials_of(t, 1, 4, 3, 64, spread=0.1), label="close logsumexps", **P)
    q, k, v = _decode_inputs(t, 1, 2, 45, 16)
    t.function("combine_partials", *flash_decoding_partials(q, k, v, 3), label="the partials of 45 keys in 3 splits",
               **P)


@hidden.test("test_combine_partials_stability")
def _(t):
    P = dict(mistakes=COMBINE_MISTAKES, returns=("o", "lse"))
    o = t.randn(1, 2, 3, 16)
    # -60, not -100: exp(-100) is a subnormal float32, where any two orders of the unshifted sum disagree
    t.function("combine_partials", o, torch.tensor([[[100.0, 98.0, 101.0], [-60.0, -63.0, -59.0]]]),
               label="logsumexps of 100 and -60", **P)
    t.function("combine_partials", t.randn(2, 1, 4, 16), 200 + t.randn(2, 1, 4) * 5, label="logsumexps near 200",
               **P)


def _paged_with(**wrong):
    def compute(q, k_cache, v_cache, block_table, seq_lens, scale=None):
        return paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale, **wrong)
    return compute


PAGED_MISTAKES = [
    Mistake("the logical block j was read as the physical block: token t is in block block_table[b, t // "
            "block_size]", _paged_with(physical=lambda table, b, t, bs: t // bs)),
    Mistake("the block after the right one was read: token t is in block_table[b, t // block_size], slot "
            "t % block_size", _paged_with(physical=lambda table, b, t, bs: table[b, (t // bs + 1) % table.size(1)]
                                          .long())),
    Mistake("the slots past seq_lens[b] in the last block were counted: mask t >= seq_lens[b]",
            _paged_with(lengths=lambda lens, b, bs: -(-int(lens[b]) // bs) * bs)),
    Mistake("the last token was left out: a sequence has seq_lens[b] tokens, 0 to seq_lens[b] - 1",
            _paged_with(lengths=lambda lens, b, bs: int(lens[b]) - 1)),
]


def _pool(t, num_blocks, H, block_size, d):
    return t.randn(num_blocks, H, block_size, d), t.randn(num_blocks, H, block_size, d)


@hidden.test("test_paged_decoding_values")
def _(t):
    P = dict(mistakes=PAGED_MISTAKES)
    k, v = _pool(t, 16, 2, 4, 16)
    table = torch.tensor([[11, 3, 14], [5, 0, 0], [8, 0, 0], [2, 13, 0]])
    t.function("paged_decoding", t.randn(4, 2, 16), k, v, table, torch.tensor([9, 4, 1, 6]),
               label="4 sequences, blocks of 4", **P)
    k, v = _pool(t, 12, 1, 16, 32)
    table = torch.tensor([[7, 2, 9, 0], [4, 11, 1, 6]])
    t.function("paged_decoding", t.randn(2, 1, 32), k, v, table, torch.tensor([40, 64]),
               label="blocks of 16, one sequence filling its 4 blocks", **P)
    k, v = _pool(t, 6, 2, 8, 16)
    t.function("paged_decoding", t.randn(1, 2, 16), k, v, torch.tensor([[5, 3, 1]]), torch.tensor([20]),
               scale=0.4, label="scale=0.4", **P)


@hidden.test("test_paged_decoding_unused_slots")
def _(t):
    P = dict(mistakes=PAGED_MISTAKES)
    k, v = _pool(t, 6, 1, 8, 16)
    q = t.randn(2, 1, 16)
    k[1, 0, 3:], v[1, 0, 3:] = 50 * q[0, 0], 1e4
    k[4, 0], v[4, 0] = 50 * q[1, 0], 1e4
    # sequence 0's row is not [0, 1, ...]: reading it for every sequence differs from reading j as block j
    t.function("paged_decoding", q, k, v, torch.tensor([[3, 1, 4], [2, 5, 4]]), torch.tensor([11, 16]),
               label="stale slots past seq_lens and a padding block of 1e4", **P)
    k, v = _pool(t, 5, 2, 4, 16)
    v[2] = 1e4
    t.function("paged_decoding", t.randn(3, 2, 16), k, v, torch.tensor([[0, 2], [3, 2], [1, 2]]),
               torch.tensor([1, 3, 4]), label="one-token and part-full sequences, padding block of 1e4", **P)


@hidden.test("test_paged_decoding_dtypes")
def _(t):
    P = dict(mistakes=PAGED_MISTAKES)
    k, v = _pool(t, 5, 2, 4, 32)
    t.function("paged_decoding", t.randn(2, 2, 32), k, v, torch.tensor([[3, 1], [4, 0]], dtype=torch.int32),
               torch.tensor([7, 2], dtype=torch.int32), label="int32 table and lengths", **P)
    t.function("paged_decoding", t.randn(2, 2, 32, dtype=torch.float16), k, v, torch.tensor([[3, 1], [4, 0]]),
               torch.tensor([7, 2]), equivalent=HALF, label="a float16 query", **P)
