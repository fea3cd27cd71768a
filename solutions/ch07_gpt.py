"""Reference solution (instructor-only) for chapter 07_gpt.

generated from course/07_gpt.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def check_parts_first(*names):
    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""
    with torch.random.fork_rng(), torch.no_grad():          # the test's own random numbers stay the same
        torch.manual_seed(0)
        x = torch.randn(2, 5, 8)
        for name in names:
            try:
                _check_part(name, x)
            except NotImplementedError:
                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None


def _check_part(name, x):
    if name == "CausalSelfAttention":
        attn = CausalSelfAttention(8, 2)
        q, k, v = attn.c_attn(x).split(8, dim=-1)
        heads = []
        for i in range(2):                                  # the formula, head by head, no cache
            sl = slice(4 * i, 4 * (i + 1))
            s = q[..., sl] @ k[..., sl].transpose(-2, -1) / 2.0
            s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[..., sl])
        y, present = attn(x)
        assert torch.allclose(y, attn.c_proj(torch.cat(heads, dim=-1)), atol=1e-5), \
            "fix `CausalSelfAttention` first: without a cache its output differs from the formula, and this test uses it"
        y_cached, _ = attn(x[:, 3:], tuple(t[:, :, :3] for t in present))
        assert torch.allclose(y_cached, y[:, 3:], atol=1e-5), \
            "fix `CausalSelfAttention` first: with a cache its output differs from one call on all tokens, and this test uses it"
    elif name == "Block":
        block = Block(8, 2)
        a, _ = block.attn(block.ln_1(x))
        h = x + a
        y, present = block(x)
        assert torch.allclose(y, h + block.mlp(block.ln_2(h)), atol=1e-5), \
            "fix `Block` first: its output differs from h + mlp(ln_2(h)), h = x + attn(ln_1(x)), and this test uses it"
        y_cached, _ = block(x[:, 3:], tuple(t[:, :, :3] for t in present))
        assert torch.allclose(y_cached, y[:, 3:], atol=1e-5), \
            "fix `Block` first: with a cache its output differs from one call on all tokens, and this test uses it"
    elif name == "GPT":
        gpt = GPT(vocab_size=7, max_len=8, d_model=8, num_heads=2, num_layers=2)
        idx = torch.randint(0, 7, (2, 6))
        logits, presents = gpt(idx)
        h = gpt.wte(idx) + gpt.wpe.weight[:6]
        for block in gpt.blocks:
            h, _ = block(h)
        assert torch.allclose(logits, gpt.lm_head(gpt.ln_f(h)), atol=1e-5), \
            "fix `GPT` first: its logits differ from lm_head(ln_f(blocks(wte(idx) + wpe(0..N-1)))), and this test uses it"
        cached, _ = gpt(idx[:, 4:], [tuple(t[:, :, :4] for t in p) for p in presents])
        assert torch.allclose(cached, logits[:, 4:], atol=1e-5), \
            "fix `GPT` first: with a cache its logits differ from one call on all tokens, and this test uses it"


class MLP(nn.Module):
    """Given: GPT-2's position-wise feed-forward network, d -> 4d -> GELU (tanh) -> d."""

    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):                      # (..., d_model) -> (..., d_model)
        return self.c_proj(self.gelu(self.c_fc(x)))


class CausalSelfAttention(nn.Module):
    """GPT-2's masked multi-head self-attention, with a key/value cache."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)   # q, k, v for all heads, in that order
        self.c_proj = nn.Linear(d_model, d_model)       # mixes the concatenated heads

    def forward(self, x, past=None):
        """Causal self-attention over the cached tokens and the N new ones.

        Args:
            x: (B, N, d_model) float tensor, the N new tokens (positions P .. P+N-1).
            past: None (P = 0), or a pair (k_past, v_past), each of shape
                (B, num_heads, P, d_head), d_head = d_model // num_heads, the keys
                and values of the P earlier tokens (what earlier calls returned as
                `present`).

        q, k, v are the three consecutive d_model-wide slices of self.c_attn(x), in
        that order; head i uses features i*d_head:(i+1)*d_head of each. Scores are
        scaled by 1/sqrt(d_head); the query at position p attends to every key at a
        position <= p, cached or new. The heads are concatenated in order and passed
        through self.c_proj. Works in float32 and float64 (keep the input's dtype).

        Returns:
            (y, present): y of shape (B, N, d_model); present = (k_all, v_all), each
            (B, num_heads, P + N, d_head): the past followed by the new keys/values.
        """
        B, N, C = x.shape
        h = self.num_heads
        d_head = C // h
        q, k, v = self.c_attn(x).split(C, dim=-1)                  # (B, N, d) each
        q = q.view(B, N, h, d_head).transpose(1, 2)                # (B, h, N, d_head)
        k = k.view(B, N, h, d_head).transpose(1, 2)
        v = v.view(B, N, h, d_head).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)                     # (B, h, P+N, d_head)
            v = torch.cat([past[1], v], dim=2)
        P = k.size(2) - N
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)       # (B, h, N, P+N)
        mask = torch.ones(N, P + N, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(B, N, C)         # heads concatenated in order
        return self.c_proj(y), (k, v)


class Block(nn.Module):
    """One GPT-2 block: pre-LN causal self-attention and MLP, each with a residual."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x, past=None):
        """x: (B, N, d_model); past: None or this block's (k_past, v_past).

        a, present = attn(ln_1(x), past); x = x + a; x = x + mlp(ln_2(x)).

        Returns (x, present): x of shape (B, N, d_model), present as returned by
        self.attn.
        """
        a, present = self.attn(self.ln_1(x), past)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, present


class GPT(nn.Module):
    """A GPT-2 language model: embeddings, blocks, final LayerNorm, tied output layer."""

    def __init__(self, vocab_size, max_len, d_model, num_heads, num_layers):
        super().__init__()
        self.max_len = max_len
        self.wte = nn.Embedding(vocab_size, d_model)     # token embedding
        self.wpe = nn.Embedding(max_len, d_model)        # position embedding
        self.blocks = nn.ModuleList(Block(d_model, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight           # tied: one matrix, two uses

    def forward(self, idx, past=None):
        """idx: (B, N) long token ids; past: None, or a list with one (k, v) pair per
        block, each (B, num_heads, P, d_head), from earlier calls. P + N <= max_len.

        x = wte(idx) + wpe(positions), positions P .. P+N-1 (P = 0 without a cache);
        then every block in order (block i gets past[i]); then ln_f and lm_head.

        Returns (logits, presents): logits (B, N, vocab_size), presents the list of
        the blocks' presents, in order.
        """
        B, N = idx.shape
        P = 0 if past is None else past[0][0].size(2)
        pos = torch.arange(P, P + N, device=idx.device)           # (N,)
        x = self.wte(idx) + self.wpe(pos)                          # (B, N, d)
        presents = []
        for i, block in enumerate(self.blocks):
            x, present = block(x, None if past is None else past[i])
            presents.append(present)
        return self.lm_head(self.ln_f(x)), presents               # (B, N, V)


def filter_logits(logits, top_k=None, top_p=None):
    """Keep the top-k logits and/or the nucleus of each row; set the others to -inf.

    Args:
        logits: (..., V) float tensor (float32 or float64), any leading dimensions.
        top_k: None, or an int k >= 1: keep the k largest logits of each row
            (k >= V keeps every token).
        top_p: None, or a float in (0, 1]: keep the smallest set of most probable tokens
            whose softmax probabilities sum to at least top_p (never fewer than one;
            the token that crosses top_p is kept; top_p = 1.0 keeps every token).
        With both, top_k is applied first and the nucleus is taken among the kept
        tokens, with their probabilities renormalised (softmax of the filtered logits).

    Returns a tensor of the same shape and dtype: excluded tokens are -inf, the
    others keep their logits unchanged. Ties at the boundary are not graded. A new
    tensor, or `logits` itself changed in place (as older Hugging Face code does):
    both are fine.
    """
    out = logits.clone()
    if top_k is not None:
        k = min(top_k, out.size(-1))
        kth = torch.topk(out, k, dim=-1).values[..., -1:]                  # (..., 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs                         # mass of the tokens ranked above
        drop_sorted = mass_before >= top_p                                 # the crossing token is kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def generate(model, idx, max_new_tokens, use_cache=True):
    """Greedy decoding.

    Args:
        model: a GPT, called only as model(idx, past), which returns (logits,
            presents). Where there is no cache (the first step, or use_cache=False),
            pass past=None or leave it out: both are fine.
        idx: (B, N) long tensor, the prompt. N + max_new_tokens <= model.max_len.
        max_new_tokens: int >= 0, how many tokens to append.
        use_cache: if True, run the prompt through the model once and then feed only
            the newest token with the cache (past) at every later step; if False, run
            the whole sequence at every step without a cache.

    Returns a (B, N + max_new_tokens) long tensor: the prompt followed, at each step,
    by the argmax of the last position's logits. Both settings give the same tokens.
    """
    out, inp, past = idx, idx, None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if use_cache:
                logits, past = model(inp, past)
            else:
                logits, _ = model(out)
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)      # (B, 1)
            out = torch.cat([out, nxt], dim=1)
            inp = nxt
    return out


def load_gpt2_weights(model, state_dict):
    """Copy a GPT-2 checkpoint into a GPT of matching size, in place.

    Args:
        model: a GPT (this chapter's class).
        state_dict: dict from names to tensors, keyed as in GPT-2's public
            checkpoints: transformer.wte.weight, transformer.wpe.weight,
            transformer.h.{i}.ln_1.weight / .bias, transformer.h.{i}.attn.c_attn.weight
            / .bias, transformer.h.{i}.attn.c_proj.*, transformer.h.{i}.ln_2.*,
            transformer.h.{i}.mlp.c_fc.*, transformer.h.{i}.mlp.c_proj.*,
            transformer.ln_f.weight / .bias, and optionally lm_head.weight (the same
            matrix as wte). Buffers such as transformer.h.{i}.attn.bias and
            attn.masked_bias may be present and are skipped.

    The attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are stored as
    (in_features, out_features) and must be transposed. A missing key, or a tensor
    whose shape does not fit, raises an error (KeyError, ValueError, ...) whose
    message names it.

    Returns the model, with every parameter overwritten (in place).
    """
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.") else name)
            if key not in state_dict:
                raise KeyError(f"the checkpoint has no {key!r} (for the model's {name!r})")
            value = state_dict[key]
            if name.endswith(conv1d):
                value = value.t()
            if value.shape != param.shape:
                raise ValueError(f"{key!r}: shape {tuple(value.shape)} does not fit {name!r} {tuple(param.shape)}")
            param.copy_(value)
    return model


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\ndef check_parts_first(*names):\n    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""\n    with torch.random.fork_rng(), torch.no_grad():          # the test\'s own random numbers stay the same\n        torch.manual_seed(0)\n        x = torch.randn(2, 5, 8)\n        for name in names:\n            try:\n                _check_part(name, x)\n            except NotImplementedError:\n                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None\n\n\ndef _check_part(name, x):\n    if name == "CausalSelfAttention":\n        attn = CausalSelfAttention(8, 2)\n        q, k, v = attn.c_attn(x).split(8, dim=-1)\n        heads = []\n        for i in range(2):                                  # the formula, head by head, no cache\n            sl = slice(4 * i, 4 * (i + 1))\n            s = q[..., sl] @ k[..., sl].transpose(-2, -1) / 2.0\n            s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))\n            heads.append(torch.softmax(s, dim=-1) @ v[..., sl])\n        y, present = attn(x)\n        assert torch.allclose(y, attn.c_proj(torch.cat(heads, dim=-1)), atol=1e-5), \\\n            "fix `CausalSelfAttention` first: without a cache its output differs from the formula, and this test uses it"\n        y_cached, _ = attn(x[:, 3:], tuple(t[:, :, :3] for t in present))\n        assert torch.allclose(y_cached, y[:, 3:], atol=1e-5), \\\n            "fix `CausalSelfAttention` first: with a cache its output differs from one call on all tokens, and this test uses it"\n    elif name == "Block":\n        block = Block(8, 2)\n        a, _ = block.attn(block.ln_1(x))\n        h = x + a\n        y, present = block(x)\n        assert torch.allclose(y, h + block.mlp(block.ln_2(h)), atol=1e-5), \\\n            "fix `Block` first: its output differs from h + mlp(ln_2(h)), h = x + attn(ln_1(x)), and this test uses it"\n        y_cached, _ = block(x[:, 3:], tuple(t[:, :, :3] for t in present))\n        assert torch.allclose(y_cached, y[:, 3:], atol=1e-5), \\\n            "fix `Block` first: with a cache its output differs from one call on all tokens, and this test uses it"\n    elif name == "GPT":\n        gpt = GPT(vocab_size=7, max_len=8, d_model=8, num_heads=2, num_layers=2)\n        idx = torch.randint(0, 7, (2, 6))\n        logits, presents = gpt(idx)\n        h = gpt.wte(idx) + gpt.wpe.weight[:6]\n        for block in gpt.blocks:\n            h, _ = block(h)\n        assert torch.allclose(logits, gpt.lm_head(gpt.ln_f(h)), atol=1e-5), \\\n            "fix `GPT` first: its logits differ from lm_head(ln_f(blocks(wte(idx) + wpe(0..N-1)))), and this test uses it"\n        cached, _ = gpt(idx[:, 4:], [tuple(t[:, :, :4] for t in p) for p in presents])\n        assert torch.allclose(cached, logits[:, 4:], atol=1e-5), \\\n            "fix `GPT` first: with a cache its logits differ from one call on all tokens, and this test uses it"\nclass MLP(nn.Module):\n    """Given: GPT-2\'s position-wise feed-forward network, d -> 4d -> GELU (tanh) -> d."""\n\n    def __init__(self, d_model):\n        super().__init__()\n        self.c_fc = nn.Linear(d_model, 4 * d_model)\n        self.gelu = nn.GELU(approximate="tanh")\n        self.c_proj = nn.Linear(4 * d_model, d_model)\n\n    def forward(self, x):                      # (..., d_model) -> (..., d_model)\n        return self.c_proj(self.gelu(self.c_fc(x)))'
