"""Reference solution (instructor-only) for chapter 08_modern_attention.

generated from course/08_modern_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def check_parts_first(*names):
    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        x = torch.randn(2, 5, 8)
        for name in names:
            try:
                if name == "RMSNorm":
                    norm = RMSNorm(8)
                    norm.weight.copy_(torch.randn(8))
                    want = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                    assert torch.allclose(norm(x), want, atol=1e-5), \
                        "fix `RMSNorm` first: it differs from weight * x / sqrt(mean(x**2) + eps), and this test uses it"
                elif name == "apply_rope_halves":
                    pos = torch.arange(3, 8)
                    ang = pos[:, None].double() * 100.0 ** (-torch.arange(0, 8, 2).double() / 8)
                    cos, sin = ang.cos().float(), ang.sin().float()
                    a, b = x[..., :4], x[..., 4:]
                    want = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
                    assert torch.allclose(apply_rope_halves(x, pos, 100.0), want, atol=1e-5), \
                        "fix `apply_rope_halves` first: it differs from the rotation of pairs (i, i + d/2), and this test uses it"
            except NotImplementedError:
                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None


def attention_by_formula(attn, x, P=0):
    """Given: ModernAttention's output without a cache, head by head, written as plainly as possible."""
    B, N, _ = x.shape
    h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q_all, k_all, v_all = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    positions = torch.arange(P, P + N)
    heads = []
    for i in range(h):
        j = i // (h // h_kv)                                       # the key/value head of query head i
        q = apply_rope_halves(attn.q_norm(q_all[..., i * d:(i + 1) * d]), positions, attn.rope_base)
        k = apply_rope_halves(attn.k_norm(k_all[..., j * d:(j + 1) * d]), positions, attn.rope_base)
        s = q @ k.transpose(-2, -1) / math.sqrt(d)
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v_all[..., j * d:(j + 1) * d])
    return attn.o_proj(torch.cat(heads, dim=-1))


def built_with(cls, init, state, dtype=torch.float32):
    """Given: cls(**init) in eval mode, its parameters set to `state` (name -> tensor), in `dtype`."""
    module = cls(**init).to(dtype)
    with torch.no_grad():
        for name, value in state.items():
            module.get_parameter(name).copy_(value)
    return module.eval()


def relative_gap(a, b):
    """Given: the largest |a - b|, relative to the largest |b|."""
    return (a - b).abs().max() / b.abs().max().clamp_min(1e-30)


def attention_steps_gap(init, state, x, split):
    """Given, for the grader's cache test: your ModernAttention on x[:, :split], then on the rest with
    the cache. Returns (present, gap): the cache after both calls, and how far their outputs are from
    one call on all of x (rounding only when the cache is used right, whatever else the layer does)."""
    attn = built_with(ModernAttention, init, state, x.dtype)
    y_all, _ = attn(x)
    y_first, past = attn(x[:, :split])
    y_rest, present = attn(x[:, split:], past)
    return present, relative_gap(torch.cat([y_first, y_rest], dim=1), y_all)


class ModernBlock(nn.Module):
    """Given: a pre-norm Qwen3 decoder block assembled from the exercises."""

    def __init__(self, d_model, num_heads, num_kv_heads, head_dim, d_ff, rope_base=10000.0, eps=1e-6):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps)
        self.self_attn = ModernAttention(d_model, num_heads, num_kv_heads, head_dim, rope_base, eps)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x, past=None):                     # (B, N, d) -> (B, N, d), present
        a, present = self.self_attn(self.input_layernorm(x), past)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class ModernLM(nn.Module):
    """Given: a decoder-only language model with Qwen3's parameter names."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, num_kv_heads, head_dim, d_ff,
                 rope_base=10000.0, eps=1e-6):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(ModernBlock(d_model, num_heads, num_kv_heads, head_dim, d_ff, rope_base, eps)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx, past=None):
        """idx (B, N) long; past None or one (k, v) per layer -> (logits (B, N, vocab), presents)."""
        x = self.embed_tokens(idx)                       # (B, N, d): no position embedding
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, None if past is None else past[i])
            presents.append(present)
        return self.lm_head(self.norm(x)), presents


def mla_by_formula(m, x, past=None):
    """Given: MLA's output, head by head, with every key and value up-projected."""
    B, N, _ = x.shape
    dn, dr, dv = m.nope_dim, m.rope_dim, m.v_dim
    P = 0 if past is None else past[0].size(1)
    positions = torch.arange(P, P + N)
    c = m.kv_norm(m.kv_down(x))
    k_rope = apply_rope_halves(m.k_rope_proj(x), positions, m.rope_base)
    if past is not None:
        c, k_rope = torch.cat([past[0], c], 1), torch.cat([past[1], k_rope], 1)
    T = c.size(1)
    q_all, k_up, v_up = m.q_proj(x), m.k_up(c), m.v_up(c)
    heads = []
    for i in range(m.num_heads):
        q = q_all[..., i * (dn + dr):(i + 1) * (dn + dr)]
        q = torch.cat([q[..., :dn], apply_rope_halves(q[..., dn:], positions, m.rope_base)], dim=-1)
        k = torch.cat([k_up[..., i * dn:(i + 1) * dn], k_rope], dim=-1)               # (B, T, dn + dr)
        s = q @ k.transpose(-2, -1) / math.sqrt(dn + dr)
        s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=P), float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v_up[..., i * dv:(i + 1) * dv])
    return m.o_proj(torch.cat(heads, dim=-1)), (c, k_rope)


def absorption_gap(init, state, x, past=None):
    """Given, for the grader's absorption test: your layer with absorb=True against your own layer with
    absorb=False, on the same input and cache. Returns (output gap, cache gap), each rounding only
    when the absorbed form computes what the plain one does."""
    mla = built_with(MultiHeadLatentAttention, init, state, x.dtype)
    y, present = mla(x, past)
    y_absorbed, present_absorbed = mla(x, past, absorb=True)
    cache_gap = torch.stack([relative_gap(a, b) for a, b in zip(present_absorbed, present)]).max()
    return relative_gap(y_absorbed, y), cache_gap


class PagedKVCache:
    """Given: a pool of fixed-size key/value blocks and one block table per sequence."""

    def __init__(self, num_blocks, num_heads, block_size, head_dim, seed=0):
        self.k = torch.zeros(num_blocks, num_heads, block_size, head_dim)
        self.v = torch.zeros(num_blocks, num_heads, block_size, head_dim)
        self.block_size = block_size
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
        self.free = order.tolist()                  # physical blocks not in use
        self.refs = [0] * num_blocks                # how many sequences use each block
        self.tables, self.lengths = {}, {}

    def add_sequence(self, seq, share_prefix_of=None, prefix_len=0):
        """A new sequence; optionally sharing the FULL blocks of another's first prefix_len tokens."""
        shared = []
        if share_prefix_of is not None:
            shared = self.tables[share_prefix_of][:prefix_len // self.block_size]
            for block in shared:
                self.refs[block] += 1
        self.tables[seq], self.lengths[seq] = list(shared), len(shared) * self.block_size

    def append(self, seq, k, v):
        """Write keys and values (H, n, d) of n new tokens at the end of sequence seq."""
        for i in range(k.size(1)):
            t = self.lengths[seq]
            if t % self.block_size == 0:            # the last block is full: take a new one
                block = self.free.pop()
                self.refs[block] = 1
                self.tables[seq].append(block)
            block = self.tables[seq][t // self.block_size]
            self.k[block, :, t % self.block_size] = k[:, i]
            self.v[block, :, t % self.block_size] = v[:, i]
            self.lengths[seq] = t + 1

    def batch(self, seqs):
        """(block_table (B, max_blocks) long, padded with block 0; seq_lens (B,) long)."""
        width = max(len(self.tables[s]) for s in seqs)
        table = torch.zeros(len(seqs), width, dtype=torch.long)
        for b, s in enumerate(seqs):
            table[b, :len(self.tables[s])] = torch.tensor(self.tables[s])
        return table, torch.tensor([self.lengths[s] for s in seqs])


class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learned weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        """x: (..., dim) float tensor.

        Returns weight * x / sqrt(mean(x ** 2) + eps), the mean taken over the last
        dimension only (one value per vector); same shape and dtype as x.
        """
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)   # (..., 1)
        return self.weight * (x / rms)


def apply_rope_halves(x, positions, base=10000.0):
    """Rotary position embedding in the halves layout (GPT-NeoX; transformers' Llama and Qwen).

    Args:
        x: (..., N, d) float tensor, d even.
        positions: (N,) long tensor, the position of each of the N rows of x.
        base: the base of the frequencies theta_i = base ** (-2i / d).

    For i < d/2 the pair (a, b) = (x[..., n, i], x[..., n, i + d/2]) is rotated by
    the angle positions[n] * theta_i:
        out[..., n, i]       = a * cos - b * sin
        out[..., n, i + d/2] = a * sin + b * cos
    Returns a new tensor of the same shape and dtype as x.
    """
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)   # (d/2,)
    angles = positions.to(torch.float64)[:, None] * theta[None, :]                      # (N, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]                                            # (..., N, d/2) each
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class ModernAttention(nn.Module):
    """Qwen3's attention: QK-norm, rotary positions, grouped-query heads, a key/value cache."""

    def __init__(self, d_model, num_heads, num_kv_heads, head_dim, rope_base=10000.0, eps=1e-6):
        super().__init__()
        assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_base = rope_base
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)      # QK-norm: one RMSNorm over each head's features
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x, past=None):
        """Causal self-attention over the cached tokens and the N new ones.

        Args:
            x: (B, N, d_model), the N new tokens, at positions P .. P+N-1.
            past: None (P = 0) or (k_past, v_past), each (B, num_kv_heads, P, head_dim).

        Head i uses features i*head_dim:(i+1)*head_dim of each projection. Each query
        and key head is normalised by self.q_norm / self.k_norm, then rotated by
        apply_rope_halves at positions P .. P+N-1 (base self.rope_base). Query head i
        uses key/value head i // (num_heads // num_kv_heads). Scores are scaled by
        1/sqrt(head_dim); the query at position p sees the keys at positions <= p.
        The heads are concatenated in order and passed through self.o_proj.

        Returns (y, present): y (B, N, d_model); present = (k_all, v_all), each
        (B, num_kv_heads, P + N, head_dim), the past followed by the new keys (after
        normalisation and rotation) and values.
        """
        B, N, _ = x.shape
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, N, h, d).transpose(1, 2)        # (B, h, N, d)
        k = self.k_proj(x).view(B, N, h_kv, d).transpose(1, 2)     # (B, h_kv, N, d)
        v = self.v_proj(x).view(B, N, h_kv, d).transpose(1, 2)
        P = 0 if past is None else past[0].size(2)
        positions = torch.arange(P, P + N, device=x.device)
        q = apply_rope_halves(self.q_norm(q), positions, self.rope_base)
        k = apply_rope_halves(self.k_norm(k), positions, self.rope_base)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)                     # (B, h_kv, P+N, d)
            v = torch.cat([past[1], v], dim=2)
        group = h // h_kv
        k_all, v_all = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # (B, h, P+N, d)
        scores = q @ k_all.transpose(-2, -1) / math.sqrt(d)        # (B, h, N, P+N)
        mask = torch.ones(N, P + N, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = (weights @ v_all).transpose(1, 2).reshape(B, N, h * d)  # heads concatenated in order
        return self.o_proj(y), (k, v)


class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama and Qwen: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        """x: (..., d_model) -> (..., d_model) = down_proj(silu(gate_proj(x)) * up_proj(x))."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek-V2's multi-head latent attention (without query compression), with its cache."""

    def __init__(self, d_model, num_heads, kv_rank, nope_dim, rope_dim, v_dim, rope_base=10000.0):
        super().__init__()
        self.num_heads, self.kv_rank = num_heads, kv_rank
        self.nope_dim, self.rope_dim, self.v_dim, self.rope_base = nope_dim, rope_dim, v_dim, rope_base
        self.q_proj = nn.Linear(d_model, num_heads * (nope_dim + rope_dim), bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)        # x -> latent c (cached)
        self.kv_norm = RMSNorm(kv_rank)
        self.k_rope_proj = nn.Linear(d_model, rope_dim, bias=False)   # x -> the shared rotary key (cached)
        self.k_up = nn.Linear(kv_rank, num_heads * nope_dim, bias=False)
        self.v_up = nn.Linear(kv_rank, num_heads * v_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * v_dim, d_model, bias=False)

    def forward(self, x, past=None, absorb=False):
        """Causal MLA over the cached tokens and the N new ones (positions P .. P+N-1).

        Args:
            x: (B, N, d_model).
            past: None (P = 0) or (c_past (B, P, kv_rank), k_rope_past (B, P, rope_dim)).
            absorb: if True, compute the same result without up-projecting the cache
                (self.k_up and self.v_up are not called; their weights are used).

        c = kv_norm(kv_down(x)); k_rope = apply_rope_halves(k_rope_proj(x)) at positions
        P .. P+N-1, shared by all heads. Head i's query is its (nope_dim + rope_dim)
        slice of q_proj(x): the first nope_dim features as they are, the last rope_dim
        rotated (same positions, base self.rope_base). Head i's key is
        cat(k_up(c) head slice, k_rope); its value is the v_up(c) head slice. Scores
        are scaled by 1/sqrt(nope_dim + rope_dim); causal; heads concatenated in order
        before o_proj.

        Returns (y (B, N, d_model), present = (c_all (B, P + N, kv_rank),
        k_rope_all (B, P + N, rope_dim))), the past followed by the new entries.
        """
        B, N, _ = x.shape
        h, r, dn, dr, dv = self.num_heads, self.kv_rank, self.nope_dim, self.rope_dim, self.v_dim
        P = 0 if past is None else past[0].size(1)
        positions = torch.arange(P, P + N, device=x.device)
        q = self.q_proj(x).view(B, N, h, dn + dr).transpose(1, 2)           # (B, h, N, dn+dr)
        q_nope, q_rope = q[..., :dn], apply_rope_halves(q[..., dn:], positions, self.rope_base)
        c = self.kv_norm(self.kv_down(x))                                   # (B, N, r)
        k_rope = apply_rope_halves(self.k_rope_proj(x), positions, self.rope_base)   # (B, N, dr)
        if past is not None:
            c = torch.cat([past[0], c], dim=1)                              # (B, T, r), T = P + N
            k_rope = torch.cat([past[1], k_rope], dim=1)                    # (B, T, dr)
        T = c.size(1)
        rope_scores = q_rope @ k_rope[:, None].transpose(-2, -1)            # (B, h, N, T)
        if absorb:
            w_k = self.k_up.weight.view(h, dn, r)                           # head i: (dn, r)
            nope_scores = (q_nope @ w_k) @ c[:, None].transpose(-2, -1)     # (B, h, N, r) @ (B, 1, r, T)
        else:
            k_nope = self.k_up(c).view(B, T, h, dn).transpose(1, 2)         # (B, h, T, dn)
            nope_scores = q_nope @ k_nope.transpose(-2, -1)
        scores = (nope_scores + rope_scores) / math.sqrt(dn + dr)
        mask = torch.ones(N, T, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        if absorb:
            w_v = self.v_up.weight.view(h, dv, r)
            y = (weights @ c[:, None]) @ w_v.transpose(-2, -1)              # (B, h, N, r) -> (B, h, N, dv)
        else:
            y = weights @ self.v_up(c).view(B, T, h, dv).transpose(1, 2)    # (B, h, N, dv)
        y = y.transpose(1, 2).reshape(B, N, h * dv)
        return self.o_proj(y), (c, k_rope)


def sliding_window_mask(n, window, num_sinks=0):
    """(n, n) bool mask, True where query i may attend to key j.

    True where j <= i and (i - j < window or j < num_sinks): each query sees itself
    and the window - 1 tokens before it, plus the first num_sinks tokens (attention
    sinks), never a later token.
    """
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    return (j <= i) & ((i - j < window) | (j < num_sinks))


def evict_to_sinks(k, v, num_sinks, window):
    """Keep the attention sinks and the most recent tokens of a key/value cache.

    Args:
        k, v: (B, H, T, d) cached keys and values, oldest first.
        num_sinks: how many of the first positions to keep.
        window: how many of the last positions to keep.

    Returns (k, v) holding positions 0 .. num_sinks-1 followed by the last `window`
    positions, in their original order: min(T, num_sinks + window) positions; the
    cache unchanged when T <= num_sinks + window.
    """
    T = k.size(2)
    if T <= num_sinks + window:
        return k, v
    keep = torch.cat([torch.arange(num_sinks), torch.arange(T - window, T)]).to(k.device)
    return k[:, :, keep], v[:, :, keep]


def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    """One decoding step per sequence, reading keys and values through a block table.

    Args:
        query: (B, H, d), the newest query of each sequence.
        k_cache, v_cache: (num_blocks, H, block_size, d), the pool of blocks.
        block_table: (B, max_blocks) long; token t < seq_lens[b] of sequence b sits in
            physical block block_table[b, t // block_size] at slot t % block_size.
            Entries after a sequence's last block hold some valid block index
            (padding) and must not be read.
        seq_lens: (B,) long, the number of cached tokens of each sequence (>= 1).

    Returns (B, H, d): for each b, softmax(q k^T / sqrt(d)) v over the seq_lens[b]
    cached keys and values of sequence b.
    """
    B, H, d = query.shape
    block_size = k_cache.size(2)
    out = []
    for b in range(B):
        L = int(seq_lens[b])
        blocks = block_table[b, :(L + block_size - 1) // block_size]              # (n,)
        k = k_cache[blocks].transpose(0, 1).reshape(H, -1, d)[:, :L]               # (H, L, d)
        v = v_cache[blocks].transpose(0, 1).reshape(H, -1, d)[:, :L]
        scores = (k @ query[b][:, :, None]).squeeze(-1) / math.sqrt(d)             # (H, L)
        out.append((torch.softmax(scores, dim=-1)[:, None, :] @ v).squeeze(1))   # (H, d)
    return torch.stack(out)


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\ndef check_parts_first(*names):\n    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""\n    with torch.random.fork_rng(), torch.no_grad():\n        torch.manual_seed(0)\n        x = torch.randn(2, 5, 8)\n        for name in names:\n            try:\n                if name == "RMSNorm":\n                    norm = RMSNorm(8)\n                    norm.weight.copy_(torch.randn(8))\n                    want = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n                    assert torch.allclose(norm(x), want, atol=1e-5), \\\n                        "fix `RMSNorm` first: it differs from weight * x / sqrt(mean(x**2) + eps), and this test uses it"\n                elif name == "apply_rope_halves":\n                    pos = torch.arange(3, 8)\n                    ang = pos[:, None].double() * 100.0 ** (-torch.arange(0, 8, 2).double() / 8)\n                    cos, sin = ang.cos().float(), ang.sin().float()\n                    a, b = x[..., :4], x[..., 4:]\n                    want = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)\n                    assert torch.allclose(apply_rope_halves(x, pos, 100.0), want, atol=1e-5), \\\n                        "fix `apply_rope_halves` first: it differs from the rotation of pairs (i, i + d/2), and this test uses it"\n            except NotImplementedError:\n                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None\n\n\ndef attention_by_formula(attn, x, P=0):\n    """Given: ModernAttention\'s output without a cache, head by head, written as plainly as possible."""\n    B, N, _ = x.shape\n    h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim\n    q_all, k_all, v_all = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)\n    positions = torch.arange(P, P + N)\n    heads = []\n    for i in range(h):\n        j = i // (h // h_kv)                                       # the key/value head of query head i\n        q = apply_rope_halves(attn.q_norm(q_all[..., i * d:(i + 1) * d]), positions, attn.rope_base)\n        k = apply_rope_halves(attn.k_norm(k_all[..., j * d:(j + 1) * d]), positions, attn.rope_base)\n        s = q @ k.transpose(-2, -1) / math.sqrt(d)\n        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))\n        heads.append(torch.softmax(s, dim=-1) @ v_all[..., j * d:(j + 1) * d])\n    return attn.o_proj(torch.cat(heads, dim=-1))\n\n\ndef built_with(cls, init, state, dtype=torch.float32):\n    """Given: cls(**init) in eval mode, its parameters set to `state` (name -> tensor), in `dtype`."""\n    module = cls(**init).to(dtype)\n    with torch.no_grad():\n        for name, value in state.items():\n            module.get_parameter(name).copy_(value)\n    return module.eval()\n\n\ndef relative_gap(a, b):\n    """Given: the largest |a - b|, relative to the largest |b|."""\n    return (a - b).abs().max() / b.abs().max().clamp_min(1e-30)\n\n\ndef attention_steps_gap(init, state, x, split):\n    """Given, for the grader\'s cache test: your ModernAttention on x[:, :split], then on the rest with\n    the cache. Returns (present, gap): the cache after both calls, and how far their outputs are from\n    one call on all of x (rounding only when the cache is used right, whatever else the layer does)."""\n    attn = built_with(ModernAttention, init, state, x.dtype)\n    y_all, _ = attn(x)\n    y_first, past = attn(x[:, :split])\n    y_rest, present = attn(x[:, split:], past)\n    return present, relative_gap(torch.cat([y_first, y_rest], dim=1), y_all)\nclass ModernBlock(nn.Module):\n    """Given: a pre-norm Qwen3 decoder block assembled from the exercises."""\n\n    def __init__(self, d_model, num_heads, num_kv_heads, head_dim, d_ff, rope_base=10000.0, eps=1e-6):\n        super().__init__()\n        self.input_layernorm = RMSNorm(d_model, eps)\n        self.self_attn = ModernAttention(d_model, num_heads, num_kv_heads, head_dim, rope_base, eps)\n        self.post_attention_layernorm = RMSNorm(d_model, eps)\n        self.mlp = SwiGLU(d_model, d_ff)\n\n    def forward(self, x, past=None):                     # (B, N, d) -> (B, N, d), present\n        a, present = self.self_attn(self.input_layernorm(x), past)\n        x = x + a\n        return x + self.mlp(self.post_attention_layernorm(x)), present\n\n\nclass ModernLM(nn.Module):\n    """Given: a decoder-only language model with Qwen3\'s parameter names."""\n\n    def __init__(self, vocab_size, d_model, num_layers, num_heads, num_kv_heads, head_dim, d_ff,\n                 rope_base=10000.0, eps=1e-6):\n        super().__init__()\n        self.embed_tokens = nn.Embedding(vocab_size, d_model)\n        self.layers = nn.ModuleList(ModernBlock(d_model, num_heads, num_kv_heads, head_dim, d_ff, rope_base, eps)\n                                    for _ in range(num_layers))\n        self.norm = RMSNorm(d_model, eps)\n        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)\n\n    def forward(self, idx, past=None):\n        """idx (B, N) long; past None or one (k, v) per layer -> (logits (B, N, vocab), presents)."""\n        x = self.embed_tokens(idx)                       # (B, N, d): no position embedding\n        presents = []\n        for i, layer in enumerate(self.layers):\n            x, present = layer(x, None if past is None else past[i])\n            presents.append(present)\n        return self.lm_head(self.norm(x)), presents\ndef mla_by_formula(m, x, past=None):\n    """Given: MLA\'s output, head by head, with every key and value up-projected."""\n    B, N, _ = x.shape\n    dn, dr, dv = m.nope_dim, m.rope_dim, m.v_dim\n    P = 0 if past is None else past[0].size(1)\n    positions = torch.arange(P, P + N)\n    c = m.kv_norm(m.kv_down(x))\n    k_rope = apply_rope_halves(m.k_rope_proj(x), positions, m.rope_base)\n    if past is not None:\n        c, k_rope = torch.cat([past[0], c], 1), torch.cat([past[1], k_rope], 1)\n    T = c.size(1)\n    q_all, k_up, v_up = m.q_proj(x), m.k_up(c), m.v_up(c)\n    heads = []\n    for i in range(m.num_heads):\n        q = q_all[..., i * (dn + dr):(i + 1) * (dn + dr)]\n        q = torch.cat([q[..., :dn], apply_rope_halves(q[..., dn:], positions, m.rope_base)], dim=-1)\n        k = torch.cat([k_up[..., i * dn:(i + 1) * dn], k_rope], dim=-1)               # (B, T, dn + dr)\n        s = q @ k.transpose(-2, -1) / math.sqrt(dn + dr)\n        s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=P), float("-inf"))\n        heads.append(torch.softmax(s, dim=-1) @ v_up[..., i * dv:(i + 1) * dv])\n    return m.o_proj(torch.cat(heads, dim=-1)), (c, k_rope)\n\n\ndef absorption_gap(init, state, x, past=None):\n    """Given, for the grader\'s absorption test: your layer with absorb=True against your own layer with\n    absorb=False, on the same input and cache. Returns (output gap, cache gap), each rounding only\n    when the absorbed form computes what the plain one does."""\n    mla = built_with(MultiHeadLatentAttention, init, state, x.dtype)\n    y, present = mla(x, past)\n    y_absorbed, present_absorbed = mla(x, past, absorb=True)\n    cache_gap = torch.stack([relative_gap(a, b) for a, b in zip(present_absorbed, present)]).max()\n    return relative_gap(y_absorbed, y), cache_gap\nclass PagedKVCache:\n    """Given: a pool of fixed-size key/value blocks and one block table per sequence."""\n\n    def __init__(self, num_blocks, num_heads, block_size, head_dim, seed=0):\n        self.k = torch.zeros(num_blocks, num_heads, block_size, head_dim)\n        self.v = torch.zeros(num_blocks, num_heads, block_size, head_dim)\n        self.block_size = block_size\n        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))\n        self.free = order.tolist()                  # physical blocks not in use\n        self.refs = [0] * num_blocks                # how many sequences use each block\n        self.tables, self.lengths = {}, {}\n\n    def add_sequence(self, seq, share_prefix_of=None, prefix_len=0):\n        """A new sequence; optionally sharing the FULL blocks of another\'s first prefix_len tokens."""\n        shared = []\n        if share_prefix_of is not None:\n            shared = self.tables[share_prefix_of][:prefix_len // self.block_size]\n            for block in shared:\n                self.refs[block] += 1\n        self.tables[seq], self.lengths[seq] = list(shared), len(shared) * self.block_size\n\n    def append(self, seq, k, v):\n        """Write keys and values (H, n, d) of n new tokens at the end of sequence seq."""\n        for i in range(k.size(1)):\n            t = self.lengths[seq]\n            if t % self.block_size == 0:            # the last block is full: take a new one\n                block = self.free.pop()\n                self.refs[block] = 1\n                self.tables[seq].append(block)\n            block = self.tables[seq][t // self.block_size]\n            self.k[block, :, t % self.block_size] = k[:, i]\n            self.v[block, :, t % self.block_size] = v[:, i]\n            self.lengths[seq] = t + 1\n\n    def batch(self, seqs):\n        """(block_table (B, max_blocks) long, padded with block 0; seq_lens (B,) long)."""\n        width = max(len(self.tables[s]) for s in seqs)\n        table = torch.zeros(len(seqs), width, dtype=torch.long)\n        for b, s in enumerate(seqs):\n            table[b, :len(self.tables[s])] = torch.tensor(self.tables[s])\n        return table, torch.tensor([self.lengths[s] for s in seqs])'
