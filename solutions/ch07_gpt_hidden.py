"""Hidden tests (instructor-only) for chapter 07_gpt.

generated from course/07_gpt.py by `make generate`; do not edit.
"""



import math

import torch

import solutions.ch07_gpt as ref
from autograder.hidden import HiddenTests, Mistake

hidden = HiddenTests(ref, from_scratch={"CausalSelfAttention"})


def _csa(m, x, past=None, order=(0, 1, 2), mask="causal", cat="past_first", scale="d_head", split="ok",
         proj=True, present="all", offset=0, cat_dim=2):
    """The reference attention with one deliberate change, to recognise a common mistake."""
    B, N, C = x.shape
    h = m.num_heads
    d = C // h
    parts = m.c_attn(x).split(C, dim=-1)
    q, k, v = (parts[i] for i in order)

    def heads(t):
        return t.reshape(B, h, N, d) if split == "view_only" else t.reshape(B, N, h, d).transpose(1, 2)
    q, k, v = heads(q), heads(k), heads(v)
    k_new, v_new = k, v
    if past is not None and cat != "ignored":
        if cat == "past_first":
            k, v = torch.cat([past[0], k], dim=cat_dim), torch.cat([past[1], v], dim=cat_dim)
        else:
            k, v = torch.cat([k, past[0]], dim=cat_dim), torch.cat([v, past[1]], dim=cat_dim)
    P = k.size(2) - N
    s = q @ k.transpose(-2, -1)
    s = s / math.sqrt(d) if scale == "d_head" else s / math.sqrt(C) if scale == "d_model" else s
    if mask == "causal":
        s = s.masked_fill(~torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P + offset), float("-inf"))
    elif mask == "no_offset":
        s = s.masked_fill(~torch.ones(N, P + N, dtype=torch.bool).tril(), float("-inf"))
    y = s.softmax(-1) @ v
    y = y.reshape(B, N, C) if split == "view_only" else y.transpose(1, 2).reshape(B, N, C)
    y = m.c_proj(y) if proj else y
    return y, ((k, v) if present == "all" else (k_new, v_new))


def _csa_with(**change):
    return lambda m, x, past=None: _csa(m, x, past, **change)


CSA_MISTAKES = [
    Mistake("no causal mask: the query at position p must not attend to keys at later positions",
            _csa_with(mask="none")),
    Mistake("the causal mask ignores the cached length: with P cached tokens, new token i sits at position P+i "
            "and may attend to every cached key and to new keys up to itself (tril(diagonal=P) on an (N, P+N) "
            "grid)", _csa_with(mask="no_offset")),
    Mistake("cache concatenated in the wrong order: present (and the keys attended to) must be the past FOLLOWED "
            "by the new keys and values, torch.cat([k_past, k], dim=2)", _csa_with(cat="new_first")),
    Mistake("present holds only the new keys and values (the cache is not extended): return the past followed "
            "by the new ones, each (B, h, P + N, d_head)", _csa_with(present="new")),
    Mistake("the cache is ignored: concatenate past keys and values before attending", _csa_with(cat="ignored")),
    *[Mistake("the causal mask is off by one: the query at position p attends to the keys at positions 0 .. p, "
              "itself included (with a cache of P, new token i is at position P + i: tril(diagonal=P) on an "
              "(N, P+N) grid)", _csa_with(offset=o)) for o in (-1, 1)],
    *[Mistake("past and new keys/values concatenated along the wrong dimension: they are (B, h, P, d_head) and "
              "(B, h, N, d_head), so join them along the positions, torch.cat([k_past, k], dim=2)",
              _csa_with(cat=c, cat_dim=d)) for c in ("past_first", "new_first") for d in (1, 3)],
    *[Mistake("q, k and v sliced in the wrong order: c_attn(x) holds q, then k, then v, each d_model wide",
              _csa_with(order=o)) for o in [(1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)]],
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(d_head), d_head = d_model // num_heads",
            _csa_with(scale="d_model")),
    Mistake("scores not scaled by 1/sqrt(d_head)", _csa_with(scale="none")),
    Mistake("heads split with a view to (B, h, N, d_head) without a transpose: view to (B, N, h, d_head), "
            "then transpose(1, 2)", _csa_with(split="view_only")),
    Mistake("c_proj forgotten: apply self.c_proj to the concatenated heads", _csa_with(proj=False)),
]
CSA = dict(mistakes=CSA_MISTAKES, returns=("y", "present"))


def _same_shapes(student, expected):
    """The shapes test judges shapes and dtypes only: the values are the other tests' business."""
    if isinstance(expected, tuple):
        return isinstance(student, (tuple, list)) and len(student) == len(expected) and all(
            _same_shapes(s, e) for s, e in zip(student, expected))
    return isinstance(student, torch.Tensor) and student.shape == expected.shape and student.dtype == expected.dtype


def _past(t, B, h, P, d, dtype=torch.float32):
    return (t.randn(B, h, P, d, dtype=dtype), t.randn(B, h, P, d, dtype=dtype))


@hidden.test("test_CausalSelfAttention_shapes")
def _(t):
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(2, 5, 16),
             label="shapes: d_model=16, 4 heads, no cache", equivalent=_same_shapes, **CSA)
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(2, 2, 16), _past(t, 2, 4, 3, 4),
             label="shapes: 2 new tokens, a cache of 3", equivalent=_same_shapes, **CSA)


@hidden.test("test_CausalSelfAttention_no_cache")
def _(t):
    t.module("CausalSelfAttention", dict(d_model=12, num_heads=3), t.randn(2, 6, 12),
             label="d_model=12, 3 heads", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=1), t.randn(3, 5, 8), label="one head", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=8), t.randn(1, 4, 8), label="8 heads of width 1", **CSA)
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(2, 7, 16, dtype=torch.float64),
             dtype=torch.float64, label="float64, d_model=16, 4 heads", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 5, 8), grad=True,
             label="gradients", **CSA)


@hidden.test("test_CausalSelfAttention_cache")
def _(t):
    t.module("CausalSelfAttention", dict(d_model=12, num_heads=3), t.randn(1, 1, 12), _past(t, 1, 3, 6, 4),
             label="one new token, a cache of 6 (several earlier calls)", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 1, 8), _past(t, 2, 2, 1, 4),
             label="one new token, a cache of one earlier token", **CSA)
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(3, 4, 16), _past(t, 3, 4, 5, 4),
             label="4 new tokens, a cache of 5, batch of 3", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 3, 8, dtype=torch.float64),
             _past(t, 2, 2, 4, 4, dtype=torch.float64), dtype=torch.float64,
             label="float64, 3 new tokens, a cache of 4", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 3, 8), past=_past(t, 2, 2, 2, 4),
             grad=True, label="gradients with a cache (past as a keyword)", **CSA)


def _block(m, x, past=None, how="ok"):
    if how == "post_ln":
        a, present = m.attn(x, past)
        x = m.ln_1(x + a)
        return m.ln_2(x + m.mlp(x)), present
    if how == "swapped_ln":
        a, present = m.attn(m.ln_2(x), past)
        x = x + a
        return x + m.mlp(m.ln_1(x)), present
    if how == "no_residual":
        a, present = m.attn(m.ln_1(x), past)
        return a + m.mlp(m.ln_2(a)), present
    if how == "parallel":
        a, present = m.attn(m.ln_1(x), past)
        return x + a + m.mlp(m.ln_2(x)), present
    if how == "mlp_raw":
        a, present = m.attn(m.ln_1(x), past)
        x = x + a
        return x + m.mlp(x), present
    if how == "past_dropped":
        a, present = m.attn(m.ln_1(x))
        x = x + a
        return x + m.mlp(m.ln_2(x)), present
    raise ValueError(how)


BLOCK_MISTAKES = [
    Mistake("post-LN: GPT-2 normalises the input of each sub-layer (pre-LN), x = x + attn(ln_1(x)), "
            "x = x + mlp(ln_2(x))", lambda m, x, past=None: _block(m, x, past, "post_ln")),
    Mistake("ln_1 and ln_2 swapped: ln_1 goes before the attention, ln_2 before the MLP",
            lambda m, x, past=None: _block(m, x, past, "swapped_ln")),
    Mistake("residual connections missing: add each sub-layer's output to its input",
            lambda m, x, past=None: _block(m, x, past, "no_residual")),
    Mistake("the MLP reads x from before the attention (a parallel block): it must read x + attn(ln_1(x))",
            lambda m, x, past=None: _block(m, x, past, "parallel")),
    Mistake("the MLP's input is not normalised: x = x + mlp(ln_2(x))",
            lambda m, x, past=None: _block(m, x, past, "mlp_raw")),
    Mistake("past is not passed on to self.attn", lambda m, x, past=None: _block(m, x, past, "past_dropped")),
]
BLOCK = dict(mistakes=BLOCK_MISTAKES, deps=("CausalSelfAttention",), returns=("x", "present"))


@hidden.test("test_Block")
def _(t):
    t.module("Block", dict(d_model=8, num_heads=2), t.randn(2, 5, 8), label="d_model=8, 2 heads", **BLOCK)
    t.module("Block", dict(d_model=16, num_heads=4), t.randn(1, 6, 16, dtype=torch.float64), dtype=torch.float64,
             label="float64", **BLOCK)
    t.module("Block", dict(d_model=8, num_heads=2), t.randn(3, 2, 8), _past(t, 3, 2, 4, 4),
             label="2 new tokens, a cache of 4", **BLOCK)
    t.module("Block", dict(d_model=8, num_heads=2), t.randn(2, 4, 8), grad=True, label="gradients", **BLOCK)


def _gpt(m, idx, past=None, how="ok"):
    B, N = idx.shape
    P = 0 if past is None else past[0][0].size(2)
    start = {"positions_restart": 0, "positions_plus_one": P + 1, "positions_minus_one": P - 1,
             "p_from_heads": 0 if past is None else past[0][0].size(1)}.get(how, P)
    x = m.wte(idx) if how == "no_positions" else m.wte(idx) + m.wpe(torch.arange(start, start + N))
    presents = []
    for i, block in enumerate(m.blocks):
        block_past = None if past is None else past[0] if how == "first_past" else past[i]
        x, present = block(x, block_past)
        presents.append(present)
    if how != "no_ln_f":
        x = m.ln_f(x)
    return m.lm_head(x), presents


GPT_MISTAKES = [
    Mistake("positions restart at 0 when a cache is given: the new tokens sit at positions P .. P+N-1, "
            "P = past[0][0].size(2)", lambda m, idx, past=None: _gpt(m, idx, past, "positions_restart")),
    *[Mistake("positions off by one: the N new tokens sit at positions P .. P+N-1 (P = 0 without a cache, "
              "P = past[0][0].size(2) with one)", lambda m, idx, past=None, how=how: _gpt(m, idx, past, how))
      for how in ("positions_plus_one", "positions_minus_one")],
    Mistake("the cached length P read from the wrong dimension: each cached key is (B, h, P, d_head), so "
            "P = past[0][0].size(2)", lambda m, idx, past=None: _gpt(m, idx, past, "p_from_heads")),
    Mistake("position embeddings missing: x = wte(idx) + wpe(positions)",
            lambda m, idx, past=None: _gpt(m, idx, past, "no_positions")),
    Mistake("ln_f forgotten: normalise after the last block, before lm_head",
            lambda m, idx, past=None: _gpt(m, idx, past, "no_ln_f")),
    Mistake("every block got past[0]: block i must receive past[i]",
            lambda m, idx, past=None: _gpt(m, idx, past, "first_past")),
]
GPT_ARGS = dict(mistakes=GPT_MISTAKES, deps=("CausalSelfAttention", "Block"), returns=("logits", "presents"))
SMALL = dict(vocab_size=11, max_len=16, d_model=8, num_heads=2, num_layers=2)


def _gpt_past(t, B, P, layers=2, h=2, d=4, dtype=torch.float32):
    return [_past(t, B, h, P, d, dtype) for _ in range(layers)]


@hidden.test("test_GPT_no_cache")
def _(t):
    t.module("GPT", SMALL, t.randint(0, 11, (2, 6)), label="2 layers, no cache", **GPT_ARGS)
    t.module("GPT", dict(vocab_size=7, max_len=10, d_model=12, num_heads=3, num_layers=3), t.randint(0, 7, (3, 10)),
             label="3 layers, N = max_len", **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (1, 5)), dtype=torch.float64, label="float64", **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (2, 4)), grad=True, label="gradients", **GPT_ARGS)


@hidden.test("test_GPT_cache")
def _(t):
    t.module("GPT", SMALL, t.randint(0, 11, (2, 1)), _gpt_past(t, 2, 5), label="one new token, a cache of 5",
             **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (1, 3)), _gpt_past(t, 1, 1), label="3 new tokens, a cache of 1",
             **GPT_ARGS)
    t.module("GPT", dict(vocab_size=9, max_len=12, d_model=12, num_heads=3, num_layers=3), t.randint(0, 9, (3, 2)),
             _gpt_past(t, 3, 7, layers=3, h=3), label="3 layers, 2 new tokens, a cache of 7", **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (2, 2)), _gpt_past(t, 2, 3, dtype=torch.float64), dtype=torch.float64,
             label="float64, a cache of 3", **GPT_ARGS)


def _filter(logits, top_k=None, top_p=None, k_side="largest", p_rule="before", order="k_first",
            fill=float("-inf"), renormalise=True, sort=True, clamp=True):
    out = logits.clone()
    original = logits.clone()

    def apply_k(out):
        if top_k is None:
            return out
        k = min(top_k, out.size(-1)) if clamp else top_k
        if k_side == "largest":
            kth = torch.topk(out, k, dim=-1).values[..., -1:]
            return out.masked_fill(out < kth, fill)
        kth = torch.topk(out, k, dim=-1, largest=False).values[..., -1:]
        return out.masked_fill(out > kth, fill)

    def apply_p(out):
        if top_p is None:
            return out
        base = out if renormalise else original
        if sort:
            sorted_logits, order_ = torch.sort(base, dim=-1, descending=True)
        else:
            sorted_logits, order_ = base, torch.arange(base.size(-1)).expand_as(base)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = probs.cumsum(-1)
        drop_sorted = {"before": cum - probs >= top_p, "crossing_dropped": cum > top_p,
                       "crossing_dropped_ge": cum >= top_p}[p_rule]
        drop = torch.zeros_like(drop_sorted).scatter(-1, order_, drop_sorted)
        return out.masked_fill(drop, fill)

    return apply_p(apply_k(out)) if order == "k_first" else apply_k(apply_p(out))


FILTER_MISTAKES = [
    Mistake("top_k kept the k smallest logits: keep the k largest",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, k_side="smallest")),
    Mistake("the nucleus dropped the token that crosses top_p: keep the smallest set whose mass is AT LEAST "
            "top_p (drop a token only when the mass before it is >= top_p)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, p_rule="crossing_dropped")),
    Mistake("the nucleus dropped the token that crosses top_p: keep the smallest set whose mass is AT LEAST "
            "top_p (drop a token only when the mass before it is >= top_p)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, p_rule="crossing_dropped_ge")),
    Mistake("top_k larger than V raised an error: such a top_k keeps every token, so take k = min(top_k, V)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, clamp=False)),
    Mistake("excluded tokens must be -inf (probability 0 after a softmax), not 0",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, fill=0.0)),
    Mistake("excluded tokens must be -inf, not a large negative number",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, fill=-1e9)),
    Mistake("top_p applied before top_k: apply top_k first, then take the nucleus among the kept tokens",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, order="p_first")),
    Mistake("with top_k, the nucleus must use the probabilities renormalised over the k kept tokens "
            "(the softmax of the top-k-filtered logits)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, renormalise=False)),
    Mistake("the nucleus was taken in vocabulary order: sort the probabilities in descending order first",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, sort=False)),
]


@hidden.test("test_filter_logits_top_k")
def _(t):
    t.function("filter_logits", t.randn(2, 10) * 2, top_k=3, mistakes=FILTER_MISTAKES, label="(2, 10), top_k=3")
    t.function("filter_logits", t.randn(12) * 2, top_k=1, mistakes=FILTER_MISTAKES, label="one row (V,), top_k=1")
    t.function("filter_logits", t.randn(2, 3, 8, dtype=torch.float64), top_k=5, mistakes=FILTER_MISTAKES,
               label="float64 (2, 3, 8), top_k=5")
    t.function("filter_logits", t.randn(3, 6), top_k=6, mistakes=FILTER_MISTAKES, label="top_k = V keeps all")
    t.function("filter_logits", t.randn(2, 5), top_k=9, mistakes=FILTER_MISTAKES, label="top_k > V keeps all")
    t.function("filter_logits", t.randn(3, 6), mistakes=FILTER_MISTAKES, label="no filter")


@hidden.test("test_filter_logits_top_p")
def _(t):
    t.function("filter_logits", t.randn(4, 20) * 2, top_p=0.9, mistakes=FILTER_MISTAKES, label="(4, 20), top_p=0.9")
    t.function("filter_logits", t.randn(3, 10) * 3, top_p=0.5, mistakes=FILTER_MISTAKES, label="(3, 10), top_p=0.5")
    t.function("filter_logits", t.randn(2, 12), top_p=1e-4, mistakes=FILTER_MISTAKES,
               label="tiny top_p keeps one token")
    t.function("filter_logits", t.randn(3, 8), top_p=1.0, mistakes=FILTER_MISTAKES, label="top_p = 1.0 keeps all")
    t.function("filter_logits", t.randn(2, 2, 15, dtype=torch.float64) * 2, top_p=0.8, mistakes=FILTER_MISTAKES,
               label="float64 (2, 2, 15), top_p=0.8")
    t.function("filter_logits", t.randn(3, 16) * 2, top_k=6, top_p=0.7, mistakes=FILTER_MISTAKES,
               label="top_k=6 then top_p=0.7")
    t.function("filter_logits", t.randn(20) * 2, top_k=4, top_p=0.6, mistakes=FILTER_MISTAKES,
               label="one row, top_k=4 then top_p=0.6")


def _generate(model, idx, max_new_tokens, use_cache=True, how="ok"):
    out, inp, past = idx, idx, None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if how == "refeed_with_cache" and use_cache:
                logits, past = model(out, past)
            elif how == "last_only_without_cache" and not use_cache:
                logits, _ = model(inp)                        # the prompt, then only the newest token
            elif how == "last_token_always" and not use_cache:
                logits, _ = model(out[:, -1:])
            elif use_cache:
                logits, past = model(inp, past)
            else:
                logits, _ = model(out)
            position = 0 if how == "first_position" else -1
            nxt = logits[:, position].argmax(dim=-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            inp = nxt
    return out[:, idx.size(1):] if how == "new_only" else out


GENERATE_MISTAKES = [
    Mistake("with use_cache, the whole sequence was fed again together with the cache: after the prompt, "
            "feed only the newest token with past",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "refeed_with_cache")),
    Mistake("without the cache, only the newest token was fed: with use_cache=False run the whole sequence "
            "at every step",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "last_only_without_cache")),
    Mistake("without the cache, only the newest token was fed: with use_cache=False run the whole sequence "
            "at every step",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "last_token_always")),
    Mistake("the argmax was taken at the first position: take the LAST position's logits, logits[:, -1]",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "first_position")),
    Mistake("only the new tokens were returned: return the prompt followed by them",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "new_only")),
]
GEN_MODEL = dict(vocab_size=13, max_len=40, d_model=16, num_heads=2, num_layers=2)


def _feeds_as_asked(probe, calls):
    """What generate fed the model at each step (the grader's own record of its calls): with the
    cache, the prompt once and then only the newest token with past; without it, the whole
    sequence, no cache, at every step."""
    if calls is None:
        return None
    use_cache = probe.kwargs.get("use_cache", probe.args[3] if len(probe.args) > 3 else True)
    prompt = probe.args[1].shape[1]
    for index, call in enumerate(c for c in calls if c["method"] == "forward"):
        step, tokens, expected = index + 1, call["tokens"], prompt + index
        if use_cache and index == 0 and call["past"]:
            return f"with use_cache=True the first step runs the prompt ({prompt} tokens) without a cache, but it was given one"
        if use_cache and index == 0 and tokens != prompt:
            return (f"with use_cache=True the first step runs the whole prompt ({prompt} tokens), but it fed "
                    f"the model {tokens} token(s)")
        if use_cache and index > 0 and not call["past"]:
            return (f"with use_cache=True every step after the first feeds only the newest token with past "
                    f"(the cache the model returned), but step {step} fed the model {tokens} token(s) "
                    f"without a cache: the cache is not used")
        if use_cache and index > 0 and tokens != 1:
            return (f"with use_cache=True every step after the first feeds only the newest token with the "
                    f"cache, but step {step} fed the model {tokens} tokens")
        if not use_cache and call["past"]:
            return (f"with use_cache=False every step runs the whole sequence without a cache, but step "
                    f"{step} passed a cache (past)")
        if not use_cache and tokens != expected:
            return (f"with use_cache=False every step runs the whole sequence ({expected} tokens at step "
                    f"{step}), but step {step} fed the model {tokens} token(s)")
    return None


GEN = dict(mistakes=GENERATE_MISTAKES, call_checks=[_feeds_as_asked])


def _sensitive_model(t, init, cases, dtype=None, tries=40):
    """A random GPT whose greedy tokens tell every generation mistake apart on these cases.

    A random model often emits the same token whatever the context; such a model would
    not show a cache fed twice or a context dropped. Draw until each case separates the
    reference from the mistakes that apply to it (deterministic: the builder is seeded).
    """
    for _ in range(tries):
        m = t.model("GPT", init, dtype=dtype)
        ok = True
        for idx, n, use_cache in cases:
            want = _generate(m.fresh(), idx, n, use_cache)
            hows = ["first_position", "refeed_with_cache" if use_cache else "last_only_without_cache"]
            if any(torch.equal(_generate(m.fresh(), idx, n, use_cache, how), want) for how in hows):
                ok = False
                break
        if ok:
            return m
    raise RuntimeError("no discriminating model found")


@hidden.test("test_generate")
def _(t):
    cases = [(t.randint(0, 13, (1, 4)), 5, True), (t.randint(0, 13, (3, 3)), 6, False),
             (t.randint(0, 13, (3, 2)), 6, True), (t.randint(0, 13, (2, 5)), 2, True)]
    m = _sensitive_model(t, GEN_MODEL, cases)
    labels = ["batch of 1, prompt of 4, 5 new tokens, with the cache", "batch of 3, 6 new tokens, use_cache=False",
              "batch of 3, prompt of 2, 6 new tokens, with the cache (positional)",
              "2 new tokens after a prompt of 5"]
    for i, ((idx, n, use_cache), label) in enumerate(zip(cases, labels)):
        if i == 1:
            t.function("generate", m, idx, n, use_cache=False, **GEN, label=label)
        elif i == 2:
            t.function("generate", m, idx, n, True, **GEN, label=label)
        else:
            t.function("generate", m, idx, n, **GEN, label=label)
    t.function("generate", m, t.randint(0, 13, (2, 3)), 1, **GEN, label="one new token")
    cases64 = [(t.randint(0, 13, (2, 3)), 4, True), (t.randint(0, 13, (2, 3)), 4, False)]
    m64 = _sensitive_model(t, dict(GEN_MODEL, num_layers=1), cases64, dtype=torch.float64)
    t.function("generate", m64, cases64[0][0], 4, **GEN, label="a float64 model, 4 new tokens")
    t.function("generate", m64, cases64[1][0], 4, use_cache=False, **GEN,
               label="a float64 model, use_cache=False")


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _checkpoint(t, init, lm_head=True, buffers=True, dtype=torch.float32):
    """A GPT-2 state dict for a GPT of size ``init``: random values, Conv1D weights as (in, out)."""
    shapes = ref.GPT(**init).state_dict()
    sd = {}
    for name, tensor in shapes.items():
        if name == "lm_head.weight":
            continue
        key = "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.") else name)
        shape = tensor.shape[::-1] if name.endswith(CONV1D) else tensor.shape
        sd[key] = t.randn(*shape, dtype=dtype) * 0.5
    if lm_head:
        sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    if buffers:
        n = init["max_len"]
        for i in range(init["num_layers"]):
            sd[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, n, n).tril()
            sd[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return sd


def _load(model, sd, how="ok"):
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.") else name)
            value = sd[key]
            if how == "transpose_if_needed":
                value = value.t() if value.shape != param.shape else value
            elif how == "reshape":
                value = value.reshape(param.shape)
            elif name.endswith(CONV1D):
                value = value.t()
            param.copy_(value)
    return model


LOAD_MISTAKES = [
    Mistake("attn.c_proj.weight not transposed: GPT-2 stores every Conv1D weight (attn.c_attn, attn.c_proj, "
            "mlp.c_fc, mlp.c_proj) as (in_features, out_features); transpose it even when it is square",
            lambda m, sd: _load(m, sd, "transpose_if_needed")),
    Mistake("Conv1D weights reshaped instead of transposed: GPT-2 stores them as (in_features, out_features); "
            "use .t(), not reshape or view",
            lambda m, sd: _load(m, sd, "reshape")),
]
LOAD_MODEL = dict(vocab_size=10, max_len=12, d_model=8, num_heads=2, num_layers=2)


@hidden.test("test_load_gpt2_weights")
def _(t):
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL), _checkpoint(t, LOAD_MODEL), mistakes=LOAD_MISTAKES,
               label="2 layers, with lm_head.weight and attn.bias buffers")
    big = dict(vocab_size=7, max_len=6, d_model=12, num_heads=3, num_layers=3)
    t.function("load_gpt2_weights", t.model("GPT", big), _checkpoint(t, big, lm_head=False, buffers=False),
               mistakes=LOAD_MISTAKES, label="3 layers, no lm_head.weight, no buffers")
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL, dtype=torch.float64),
               _checkpoint(t, LOAD_MODEL, dtype=torch.float64), mistakes=LOAD_MISTAKES,
               label="a float64 model and checkpoint")
    missing = _checkpoint(t, LOAD_MODEL)
    del missing["transformer.h.1.mlp.c_fc.bias"]
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL), missing,
               raises=("h.1.mlp.c_fc.bias", "blocks.1.mlp.c_fc.bias"),
               label="a checkpoint without transformer.h.1.mlp.c_fc.bias must raise an error naming it")
    longer = dict(_checkpoint(t, LOAD_MODEL), **{"transformer.wpe.weight": t.randn(LOAD_MODEL["max_len"] + 4, 8)})
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL), longer, raises=("wpe.weight",),
               label="a transformer.wpe.weight with 16 positions for a model of 12 must raise an error naming it")
