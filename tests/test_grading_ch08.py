"""Hidden tests of Chapter 8 against a catalog of correct, wrong and hostile submissions.

Correct styles and mistakes are judged in process by the kernel's own call routine and the
grader's judge; tampering and a sample go through the real pipeline (see tests/catalog.py).
A correct style gets every point; a mistake loses exactly the listed tests, each with the
given message fragment, and passes every other test.
"""
from __future__ import annotations

import textwrap

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, body, common_tampering, fn, others_stubbed, submitter, with_methods

CHAPTER = "08_modern_attention"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
ATTN_TESTS = ["test_ModernAttention_no_cache", "test_ModernAttention_cache"]
MLA_TESTS = ["test_MultiHeadLatentAttention_cache", "test_MultiHeadLatentAttention_values",
             "test_MultiHeadLatentAttention_absorb"]


def given(exercise: str, signature: str, forward_body: str, methods: str = "") -> str:
    """The exercise's class with its ``__init__`` as the chapter source gives it, and ``forward``
    (and any ``methods``) as a learner wrote them."""
    forward = f"def {signature}:\n" + body(forward_body, 4)
    return with_methods(CHAPTER, exercise, forward + textwrap.dedent(methods))


def rmsnorm(forward_body: str) -> str:
    return given("RMSNorm", "forward(self, x)", forward_body)


def attention(forward_body: str, methods: str = "") -> str:
    return given("ModernAttention", "forward(self, x, past=None)", forward_body, methods)


def swiglu(forward_body: str) -> str:
    return given("SwiGLU", "forward(self, x)", forward_body)


def mla(forward_body: str) -> str:
    return given("MultiHeadLatentAttention", "forward(self, x, past=None, absorb=False)", forward_body)


sub = submitter(CHAPTER)


ROPE_SIG = "apply_rope_halves(x, positions, base=10000.0)"
WINDOW_SIG = "sliding_window_mask(n, window, num_sinks=0)"
EVICT_SIG = "evict_to_sinks(k, v, num_sinks, window)"
PAGED_SIG = "paged_attention(query, k_cache, v_cache, block_table, seq_lens)"

# ------------------------------------------------------------------ correct, other styles
HF_STYLE = {   # the way transformers writes Qwen3 (rotate_half, repeat_kv with expand), SDPA for the paged cache
    "RMSNorm": rmsnorm("""
        input_dtype = x.dtype
        hidden = x.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.eps)
        return self.weight * hidden.to(input_dtype)
    """),
    "apply_rope_halves": fn(ROPE_SIG, """
        dim = x.shape[-1]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        freqs = positions[:, None].float() * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        x1, x2 = x[..., : dim // 2], x[..., dim // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * cos + rotated * sin
    """),
    "ModernAttention": attention("""
        input_shape = x.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_norm(self.q_proj(x).view(hidden_shape)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(hidden_shape)).transpose(1, 2)
        v = self.v_proj(x).view(hidden_shape).transpose(1, 2)
        past_len = 0 if past is None else past[0].shape[-2]
        position_ids = torch.arange(past_len, past_len + x.shape[1])
        q = apply_rope_halves(q, position_ids, self.rope_base)
        k = apply_rope_halves(k, position_ids, self.rope_base)
        if past is not None:
            k = torch.cat([past[0], k], dim=-2)
            v = torch.cat([past[1], v], dim=-2)
        present = (k, v)
        k, v = self._repeat_kv(k), self._repeat_kv(v)
        attn = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        q_len, kv_len = q.shape[-2], k.shape[-2]
        causal = torch.full((q_len, kv_len), torch.finfo(attn.dtype).min, dtype=attn.dtype).triu(kv_len - q_len + 1)
        attn = nn.functional.softmax(attn + causal, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), present
    """, methods="""
        def _repeat_kv(self, hidden):
            batch, kv_heads, slen, head_dim = hidden.shape
            n_rep = self.num_heads // kv_heads
            hidden = hidden[:, :, None, :, :].expand(batch, kv_heads, n_rep, slen, head_dim)
            return hidden.reshape(batch, kv_heads * n_rep, slen, head_dim)
    """),
    "SwiGLU": swiglu("""
        act = nn.SiLU()
        return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))
    """),
    "paged_attention": fn(PAGED_SIG, """
        outs = []
        bs = k_cache.shape[2]
        for b in range(query.shape[0]):
            n = int(seq_lens[b])
            ks = [k_cache[block_table[b, t // bs], :, t % bs] for t in range(n)]
            vs = [v_cache[block_table[b, t // bs], :, t % bs] for t in range(n)]
            k = torch.stack(ks, dim=1)
            v = torch.stack(vs, dim=1)
            o = F.scaled_dot_product_attention(query[b][:, None, :], k, v)
            outs.append(o[:, 0])
        return torch.stack(outs)
    """),
}

EINSUM_STYLE = {
    "RMSNorm": rmsnorm("""
        d = x.shape[-1]
        return self.weight * x * (x.norm(dim=-1, keepdim=True) ** 2 / d + self.eps) ** -0.5
    """),
    "apply_rope_halves": fn(ROPE_SIG, """
        half = x.shape[-1] // 2
        i = torch.arange(half, dtype=x.dtype)
        angle = positions.to(x.dtype)[:, None] * torch.pow(torch.tensor(base, dtype=x.dtype), -2 * i / x.shape[-1])
        c, s = torch.cos(angle), torch.sin(angle)
        a, b = x.split(half, dim=-1)
        return torch.cat([a * c - b * s, b * c + a * s], -1)
    """),
    "ModernAttention": attention("""
        B, N, _ = x.shape
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        P = past[0].shape[2] if past is not None else 0
        pos = torch.arange(P, P + N)
        q = apply_rope_halves(self.q_norm(self.q_proj(x).unflatten(-1, (H, D))).permute(0, 2, 1, 3), pos, self.rope_base)
        k = apply_rope_halves(self.k_norm(self.k_proj(x).unflatten(-1, (G, D))).permute(0, 2, 1, 3), pos, self.rope_base)
        v = self.v_proj(x).unflatten(-1, (G, D)).permute(0, 2, 1, 3)
        if past is not None:
            k, v = torch.cat((past[0], k), 2), torch.cat((past[1], v), 2)
        qg = q.unflatten(1, (G, H // G))                                  # (B, G, group, N, D)
        s = torch.einsum("bgrnd,bgtd->bgrnt", qg, k) / D ** 0.5
        T = k.shape[2]
        allowed = torch.arange(T)[None, :] <= torch.arange(P, P + N)[:, None]
        w = torch.where(allowed, s, torch.tensor(float("-inf"), dtype=s.dtype)).softmax(-1)
        y = torch.einsum("bgrnt,bgtd->bngrd", w, v).reshape(B, N, H * D)
        return self.o_proj(y), (k, v)
    """),
    "SwiGLU": swiglu("""
        g = self.gate_proj(x)
        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))
    """),
    "MultiHeadLatentAttention": mla("""
        B, N, _ = x.shape
        H, R, Dn, Dr, Dv = self.num_heads, self.kv_rank, self.nope_dim, self.rope_dim, self.v_dim
        P = 0 if past is None else past[0].shape[1]
        pos = torch.arange(P, P + N)
        q = self.q_proj(x).unflatten(-1, (H, Dn + Dr))                     # (B, N, H, Dn+Dr)
        q_c, q_r = q[..., :Dn], apply_rope_halves(q[..., Dn:].transpose(1, 2), pos, self.rope_base)
        c = self.kv_norm(self.kv_down(x))
        kr = apply_rope_halves(self.k_rope_proj(x), pos, self.rope_base)
        if past is not None:
            c, kr = torch.cat([past[0], c], 1), torch.cat([past[1], kr], 1)
        T = c.shape[1]
        if absorb:
            Wk = self.k_up.weight.unflatten(0, (H, Dn))                    # (H, Dn, R)
            q_lat = torch.einsum("bnhd,hdr->bhnr", q_c, Wk)
            s = torch.einsum("bhnr,btr->bhnt", q_lat, c)
        else:
            k_c = self.k_up(c).unflatten(-1, (H, Dn))
            s = torch.einsum("bnhd,bthd->bhnt", q_c, k_c)
        s = (s + torch.einsum("bhnd,btd->bhnt", q_r, kr)) / math.sqrt(Dn + Dr)
        keep = torch.arange(T)[None, :] <= torch.arange(P, P + N)[:, None]
        w = s.masked_fill(~keep, -1e9).softmax(-1)
        if absorb:
            Wv = self.v_up.weight.unflatten(0, (H, Dv))                    # (H, Dv, R)
            y = torch.einsum("bhnt,btr,hvr->bnhv", w, c, Wv)
        else:
            y = torch.einsum("bhnt,bthv->bnhv", w, self.v_up(c).unflatten(-1, (H, Dv)))
        return self.o_proj(y.flatten(2)), (c, kr)
    """),
    "sliding_window_mask": fn(WINDOW_SIG, """
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        band = causal & ~torch.ones(n, n, dtype=torch.bool).tril(-window)
        sinks = causal.clone()
        sinks[:, num_sinks:] = False
        return band | sinks
    """),
    "evict_to_sinks": fn(EVICT_SIG, """
        T = k.shape[-2]
        if T > num_sinks + window:
            k = torch.cat([k[..., :num_sinks, :], k[..., -window:, :]], dim=-2)
            v = torch.cat([v[..., :num_sinks, :], v[..., -window:, :]], dim=-2)
        return k, v
    """),
    "paged_attention": fn(PAGED_SIG, """
        B, H, d = query.shape
        nb, _, bs, _ = k_cache.shape
        width = block_table.shape[1]
        k = k_cache[block_table].permute(0, 2, 1, 3, 4).reshape(B, H, width * bs, d)   # every listed block
        v = v_cache[block_table].permute(0, 2, 1, 3, 4).reshape(B, H, width * bs, d)
        s = torch.einsum("bhd,bhtd->bht", query, k) / math.sqrt(d)
        valid = torch.arange(width * bs)[None, :] < seq_lens[:, None]
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        return torch.einsum("bht,bhtd->bhd", s.softmax(-1), v)
    """),
}

LOOP_STYLE = {
    "ModernAttention": attention("""
        B, N, _ = x.shape
        d = self.head_dim
        group = self.num_heads // self.num_kv_heads
        P = 0 if past is None else past[0].size(2)
        positions = torch.arange(P, P + N)
        ks, vs, outs = [], [], []
        for j in range(self.num_kv_heads):
            k_j = self.k_norm(self.k_proj(x)[..., j * d:(j + 1) * d])
            k_j = apply_rope_halves(k_j, positions, self.rope_base)
            v_j = self.v_proj(x)[..., j * d:(j + 1) * d]
            if past is not None:
                k_j = torch.cat([past[0][:, j], k_j], dim=1)
                v_j = torch.cat([past[1][:, j], v_j], dim=1)
            ks.append(k_j)
            vs.append(v_j)
        for i in range(self.num_heads):
            q_i = apply_rope_halves(self.q_norm(self.q_proj(x)[..., i * d:(i + 1) * d]), positions, self.rope_base)
            s = q_i @ ks[i // group].transpose(1, 2) / math.sqrt(d)
            mask = torch.ones(N, P + N, dtype=torch.bool).tril(P)
            s = s.masked_fill(~mask, float("-inf"))
            outs.append(torch.softmax(s, -1) @ vs[i // group])
        return self.o_proj(torch.cat(outs, -1)), (torch.stack(ks, 1), torch.stack(vs, 1))
    """),
    "MultiHeadLatentAttention": mla("""
        B, N, _ = x.shape
        dn, dr, dv, h = self.nope_dim, self.rope_dim, self.v_dim, self.num_heads
        P = 0 if past is None else past[0].size(1)
        pos = torch.arange(P, P + N)
        c = self.kv_norm(self.kv_down(x))
        k_rope = apply_rope_halves(self.k_rope_proj(x), pos, self.rope_base)
        if past is not None:
            c = torch.cat([past[0], c], 1)
            k_rope = torch.cat([past[1], k_rope], 1)
        T = c.size(1)
        q_all = self.q_proj(x)
        mask = torch.ones(N, T, dtype=torch.bool).tril(P)
        heads = []
        for i in range(h):
            q = q_all[..., i * (dn + dr):(i + 1) * (dn + dr)]
            q_nope = q[..., :dn]
            q_rope = apply_rope_halves(q[..., dn:], pos, self.rope_base)
            w_k = self.k_up.weight[i * dn:(i + 1) * dn]                    # (dn, r)
            w_v = self.v_up.weight[i * dv:(i + 1) * dv]                    # (dv, r)
            if absorb:
                s = (q_nope @ w_k) @ c.transpose(1, 2)
            else:
                s = q_nope @ (c @ w_k.T).transpose(1, 2)
            s = (s + q_rope @ k_rope.transpose(1, 2)) / math.sqrt(dn + dr)
            a = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
            heads.append((a @ c) @ w_v.T if absorb else a @ (c @ w_v.T))
        return self.o_proj(torch.cat(heads, -1)), (c, k_rope)
    """),
    "sliding_window_mask": fn(WINDOW_SIG, """
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            for j in range(i + 1):
                if i - j < window or j < num_sinks:
                    m[i, j] = True
        return m
    """),
    "evict_to_sinks": fn(EVICT_SIG, """
        T = k.shape[2]
        if T <= num_sinks + window:
            return k, v
        idx = list(range(num_sinks)) + list(range(T - window, T))
        return k.index_select(2, torch.tensor(idx)), v.index_select(2, torch.tensor(idx))
    """),
}

CORRECT = {
    "reference": sub(),
    "hugging_face_style": sub(HF_STYLE),
    "einsum_style": sub(EINSUM_STYLE, prepend=["def unused_helper(x):\n    return x\n"]),
    "loop_style": sub(LOOP_STYLE),
}

# ------------------------------------------------------------------ common mistakes
RMS_CENTRED = rmsnorm("""
    x = x - x.mean(-1, keepdim=True)
    return self.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
""")
RMS_NO_EPS = rmsnorm("return self.weight * x / x.pow(2).mean(-1, keepdim=True).sqrt()")
RMS_WRONG_AXIS = rmsnorm("return self.weight * x / torch.sqrt(x.pow(2).mean(0, keepdim=True) + self.eps)")
ROPE_INTERLEAVED = fn(ROPE_SIG, """
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None] * theta
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
""")


def rope_variant(pos="positions", sign="-"):
    other = "+" if sign == "-" else "-"
    return fn(ROPE_SIG, f"""
        d = x.shape[-1]
        theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        pos = {pos}
        ang = pos.double()[:, None] * theta
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        a, b = x[..., :d // 2], x[..., d // 2:]
        return torch.cat([a * cos {sign} b * sin, b * cos {other} a * sin], -1)
    """)


def attn_variant(norm="before", repeat="repeat_interleave(g, dim=1)", start="P", diagonal="P"):
    if norm == "before":
        qk = ("q = apply_rope_halves(self.q_norm(q), pos, self.rope_base)\n"
              "k = apply_rope_halves(self.k_norm(k), pos, self.rope_base)")
    elif norm == "after":
        qk = ("q = self.q_norm(apply_rope_halves(q, pos, self.rope_base))\n"
              "k = self.k_norm(apply_rope_halves(k, pos, self.rope_base))")
    else:
        qk = ("q = apply_rope_halves(q, pos, self.rope_base)\n"
              "k = apply_rope_halves(k, pos, self.rope_base)")
    return attention(f"""
        B, N, _ = x.shape
        h, g, d = self.num_heads, self.num_heads // self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, N, h, d).transpose(1, 2)
        k = self.k_proj(x).view(B, N, self.num_kv_heads, d).transpose(1, 2)
        v = self.v_proj(x).view(B, N, self.num_kv_heads, d).transpose(1, 2)
        P = 0 if past is None else past[0].size(2)
        pos = torch.arange({start}, {start} + N)
{textwrap.indent(qk, '        ')}
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        kk, vv = k.{repeat}, v.{repeat}
        s = q @ kk.transpose(-2, -1) / math.sqrt(d)
        s = s.masked_fill(~torch.ones(N, P + N, dtype=torch.bool).tril({diagonal}), float("-inf"))
        y = (s.softmax(-1) @ vv).transpose(1, 2).reshape(B, N, h * d)
        return self.o_proj(y), (k, v)
    """)


ATTN_SDPA = attention("""
    B, N, _ = x.shape
    h, g, d = self.num_heads, self.num_heads // self.num_kv_heads, self.head_dim
    P = 0 if past is None else past[0].size(2)
    pos = torch.arange(P, P + N)
    q = apply_rope_halves(self.q_norm(self.q_proj(x).view(B, N, h, d).transpose(1, 2)), pos, self.rope_base)
    k = apply_rope_halves(self.k_norm(self.k_proj(x).view(B, N, -1, d).transpose(1, 2)), pos, self.rope_base)
    v = self.v_proj(x).view(B, N, -1, d).transpose(1, 2)
    if past is not None:
        k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
    mask = torch.ones(N, P + N, dtype=torch.bool).tril(P)
    y = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=mask)
    return self.o_proj(y.transpose(1, 2).reshape(B, N, h * d)), (k, v)
""")
SWIGLU_SWAPPED = swiglu("return self.down_proj(F.silu(self.up_proj(x)) * self.gate_proj(x))")
SWIGLU_GELU = swiglu("return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))")


def mla_variant(scale="math.sqrt(dn + dr)", rope_latent=False, store="(c, k_rope)", absorb_code=None):
    """MLA with one named change; its absorbed form builds no key or value of the cache unless
    ``absorb_code`` does (or ``store`` caches them)."""
    latent = "c = apply_rope_halves(c, pos, self.rope_base)\n" if rope_latent else ""
    absorbed = absorb_code or """
        w_k = self.k_up.weight.view(h, dn, -1)
        nope = (q_nope @ w_k) @ c[:, None].transpose(-2, -1)
    """
    full = "k = self.k_up(c).view(B, T, h, dn).transpose(1, 2)\nv = self.v_up(c).view(B, T, h, dv).transpose(1, 2)"
    upfront = full if store != "(c, k_rope)" else ""
    return mla(f"""
        B, N, _ = x.shape
        h, dn, dr, dv = self.num_heads, self.nope_dim, self.rope_dim, self.v_dim
        P = 0 if past is None else past[0].size(1)
        pos = torch.arange(P, P + N)
        q = self.q_proj(x).view(B, N, h, dn + dr).transpose(1, 2)
        q_nope, q_rope = q[..., :dn], apply_rope_halves(q[..., dn:], pos, self.rope_base)
        c = self.kv_norm(self.kv_down(x))
{textwrap.indent(latent, '        ')}        k_rope = apply_rope_halves(self.k_rope_proj(x), pos, self.rope_base)
        if past is not None:
            c, k_rope = torch.cat([past[0], c], 1), torch.cat([past[1], k_rope], 1)
        T = c.size(1)
{textwrap.indent(upfront, '        ')}
        if absorb:
{textwrap.indent(textwrap.dedent(absorbed).strip(), '            ')}
        else:
            k = self.k_up(c).view(B, T, h, dn).transpose(1, 2)
            nope = q_nope @ k.transpose(-2, -1)
        s = (nope + q_rope @ k_rope[:, None].transpose(-2, -1)) / {scale}
        a = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(P), float("-inf")).softmax(-1)
        if absorb:
            y = (a @ c[:, None]) @ self.v_up.weight.view(h, dv, -1).transpose(-2, -1)
        else:
            y = a @ self.v_up(c).view(B, T, h, dv).transpose(1, 2)
        y = y.transpose(1, 2).reshape(B, N, h * dv)
        return self.o_proj(y), {store}
    """)


WINDOW_OFF_BY_ONE = fn(WINDOW_SIG, """
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & ((i - j <= window) | (j < num_sinks))
""")
WINDOW_NO_SINKS = fn(WINDOW_SIG, """
    return torch.ones(n, n, dtype=torch.bool).tril() & ~torch.ones(n, n, dtype=torch.bool).tril(-window)
""")


def evict_variant(keep: str) -> str:
    return fn(EVICT_SIG, f"""
        T = k.size(2)
        if T <= num_sinks + window:
            return k, v
        keep = {keep}
        return k[:, :, keep], v[:, :, keep]
    """)


EVICT_NO_SINKS = evict_variant("torch.arange(T - window, T)")
EVICT_REVERSED = evict_variant("torch.cat([torch.arange(T - window, T), torch.arange(num_sinks)])")
EVICT_OFF_BY_ONE = evict_variant("torch.cat([torch.arange(num_sinks), torch.arange(T - window - 1, T)])")


def paged_variant(blocks="block_table[b, :n_blocks]", keys="[:, :L]") -> str:
    return fn(PAGED_SIG, f"""
        B, H, d = query.shape
        bs = k_cache.size(2)
        out = []
        for b in range(B):
            L = int(seq_lens[b])
            n_blocks = (L + bs - 1) // bs
            blocks = {blocks}
            k = k_cache[blocks].transpose(0, 1).reshape(H, -1, d){keys}
            v = v_cache[blocks].transpose(0, 1).reshape(H, -1, d){keys}
            w = torch.softmax((k @ query[b][:, :, None]).squeeze(-1) / math.sqrt(d), -1)
            out.append((w[:, None] @ v).squeeze(1))
        return torch.stack(out)
    """)


PAGED_LOGICAL = paged_variant(blocks="torch.arange(n_blocks)")
PAGED_PAST_LEN = paged_variant(keys="")
PAGED_TABLE_OFF = paged_variant(blocks="block_table[b, 1:n_blocks + 1]")

MISTAKES = {
    "rmsnorm_centred_like_layernorm": (sub({"RMSNorm": RMS_CENTRED}), {"test_RMSNorm": "LayerNorm"}),
    "rmsnorm_without_eps": (sub({"RMSNorm": RMS_NO_EPS}), {"test_RMSNorm": "eps left out"}),
    "rmsnorm_mean_over_batch": (sub({"RMSNorm": RMS_WRONG_AXIS}), {"test_RMSNorm": "wrong axis"}),
    "rope_interleaved": (sub({"apply_rope_halves": ROPE_INTERLEAVED}), {"test_apply_rope_halves": "interleaved"}),
    "rope_positions_ignored": (sub({"apply_rope_halves": rope_variant(pos="torch.arange(x.shape[-2])")}),
                               {"test_apply_rope_halves": "positions argument is ignored"}),
    "rope_clockwise": (sub({"apply_rope_halves": rope_variant(sign="+")}), {"test_apply_rope_halves": "clockwise"}),
    "qk_norm_skipped": (sub({"ModernAttention": attn_variant(norm="none")}),
                        {t: "QK-norm skipped" for t in ATTN_TESTS}),
    "qk_norm_after_rope": (sub({"ModernAttention": attn_variant(norm="after")}),
                           {t: "after the rotation" for t in ATTN_TESTS}),
    # repeat for repeat_interleave: the cache is right, so only the output's test is lost (3 of 5 points)
    "gqa_heads_modulo": (sub({"ModernAttention": attn_variant(repeat="repeat(1, g, 1, 1)")}),
                         {"test_ModernAttention_no_cache": "i % num_kv_heads"}),
    "rope_positions_restart_with_cache": (sub({"ModernAttention": attn_variant(start="0")}),
                                          {"test_ModernAttention_cache": "positions restart at 0"}),
    "attention_mask_ignores_cache": (sub({"ModernAttention": attn_variant(diagonal="0")}),
                                     {"test_ModernAttention_cache": "mask ignores the cache"}),
    "attention_builtin_sdpa": (sub({"ModernAttention": ATTN_SDPA}), {t: "from scratch" for t in ATTN_TESTS}),
    "swiglu_gate_and_up_swapped": (sub({"SwiGLU": SWIGLU_SWAPPED}), {"test_SwiGLU": "gate and up swapped"}),
    "swiglu_with_gelu": (sub({"SwiGLU": SWIGLU_GELU}), {"test_SwiGLU": "GELU instead of SiLU"}),
    # caching the keys and values: present has another shape than the spec's, so every test that reads
    # (y, present) rejects it (the absorb test's long-cache probe too, whose shapes it judges)
    "mla_caches_full_keys": (sub({"MultiHeadLatentAttention": mla_variant(store="(k, v)")}),
                             {t: "holds the up-projected keys" for t in MLA_TESTS}),
    # rotating the latent: a wrong cache and a wrong output; both forms agree, so absorption is not lost
    "mla_rope_on_latent": (sub({"MultiHeadLatentAttention": mla_variant(rope_latent=True)}),
                           {t: "compressed part" for t in MLA_TESTS[:2]}),
    # a wrong scale: the cache and the absorption are right, so only the values test is lost (3 of 7 points)
    "mla_scaled_by_nope_dim": (sub({"MultiHeadLatentAttention": mla_variant(scale="math.sqrt(dn)")}),
                               {"test_MultiHeadLatentAttention_values": "wrong scale"}),
    "mla_absorb_still_calls_k_up": (sub({"MultiHeadLatentAttention": mla_variant(
        absorb_code="nope = q_nope @ self.k_up(c).view(B, T, h, dn).transpose(1, 2).transpose(-2, -1)")}),
        {"test_MultiHeadLatentAttention_absorb": "up-projected the cached latents"}),
    "mla_fake_absorption_f_linear": (sub({"MultiHeadLatentAttention": mla_variant(
        absorb_code="nope = q_nope @ F.linear(c, self.k_up.weight).view(B, T, h, dn).transpose(1, 2).transpose(-2, -1)")}),
        {"test_MultiHeadLatentAttention_absorb": "up-projected the cached latents"}),
    "mla_absorbed_rotary_part_left_out": (sub({"MultiHeadLatentAttention": mla_variant(
        absorb_code="""
            nope = (q_nope @ self.k_up.weight.view(h, dn, -1)) @ c[:, None].transpose(-2, -1)
            q_rope = torch.zeros_like(q_rope)
        """)}), {"test_MultiHeadLatentAttention_absorb": "another output than absorb=False"}),
    "window_counts_current_token_twice": (sub({"sliding_window_mask": WINDOW_OFF_BY_ONE}),
                                          {"test_sliding_window_mask": "off by one"}),
    "window_without_sinks": (sub({"sliding_window_mask": WINDOW_NO_SINKS}),
                             {"test_sliding_window_mask": "sinks are missing"}),
    "eviction_drops_sinks": (sub({"evict_to_sinks": EVICT_NO_SINKS}), {"test_evict_to_sinks": "sink tokens were dropped"}),
    "eviction_order_reversed": (sub({"evict_to_sinks": EVICT_REVERSED}), {"test_evict_to_sinks": "order reversed"}),
    "eviction_window_off_by_one": (sub({"evict_to_sinks": EVICT_OFF_BY_ONE}), {"test_evict_to_sinks": "off by one"}),
    "paged_logical_block_as_physical": (sub({"paged_attention": PAGED_LOGICAL}),
                                        {"test_paged_attention": "logical block index"}),
    "paged_reads_past_seq_len": (sub({"paged_attention": PAGED_PAST_LEN}), {"test_paged_attention": "past seq_lens"}),
    "paged_block_table_off_by_one": (sub({"paged_attention": PAGED_TABLE_OFF}),
                                     {"test_paged_attention": "read off by one"}),
}

# ------------------------------------------------------------------ independence


def alone(exercise: str, code: str, losses: dict) -> tuple:
    """The exercise with every other exercise left as its stub: it loses the same tests, the stubs theirs."""
    return others_stubbed(CHAPTER, {exercise: code}, losses)


INDEPENDENT = {
    # RMSNorm and RoPE broken: ModernAttention and MLA, which use them, lose nothing.
    "stub_rmsnorm_and_rope": (sub({"RMSNorm": rmsnorm("raise NotImplementedError()"),
                                   "apply_rope_halves": fn(ROPE_SIG, "raise NotImplementedError()")}),
                              {"test_RMSNorm": "not implemented yet", "test_apply_rope_halves": "not implemented yet"}),
    "wrong_rmsnorm_only": (sub({"RMSNorm": RMS_CENTRED}), {"test_RMSNorm": "LayerNorm"}),
    "looping_window_mask": (sub({"sliding_window_mask": fn(WINDOW_SIG, "while True:\n    pass")}),
                            {"test_sliding_window_mask": "longer than"}),
    "alone_reference_attention": alone("ModernAttention", attn_variant(), {}),
    "alone_gqa_heads_modulo": alone("ModernAttention", attn_variant(repeat="repeat(1, g, 1, 1)"),
                                    {"test_ModernAttention_no_cache": "i % num_kv_heads"}),
    "alone_mla_rope_on_latent": alone("MultiHeadLatentAttention", mla_variant(rope_latent=True),
                                      {t: "compressed part" for t in MLA_TESTS[:2]}),
    "alone_mla_einsum": alone("MultiHeadLatentAttention", EINSUM_STYLE["MultiHeadLatentAttention"], {}),
    "alone_rope_interleaved": alone("apply_rope_halves", ROPE_INTERLEAVED, {"test_apply_rope_halves": "interleaved"}),
    "alone_eviction_drops_sinks": alone("evict_to_sinks", EVICT_NO_SINKS,
                                        {"test_evict_to_sinks": "sink tokens were dropped"}),
    "alone_paged_past_seq_len": alone("paged_attention", PAGED_PAST_LEN, {"test_paged_attention": "past seq_lens"}),
    "kernel_exits_in_evict": (sub({"evict_to_sinks": "import os\nos._exit(0)\n"}),
                              {"test_evict_to_sinks": "did not run", "test_paged_attention": "did not run"}),
}

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering=common_tampering(CHAPTER),
                  kernel_only={"kernel_exits_in_evict", "looping_window_mask"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
