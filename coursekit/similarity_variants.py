"""Independent correct solutions, and Chapter 2's first disguised copies, to measure the similarity report.

Instructor-only (the copies are made from the reference). ``INDEPENDENT`` (Chapter 2) and ``MORE``
(chapters 1 and 3-8: more styles of the exercises with enough code of their own to be ranked,
beside the catalogs' correct styles) are answers written as other learners would; benchmarks/similarity_accuracy.py adds the catalogs' correct styles and
disguises every one of them with coursekit.disguises. The disguises kept below (``DISGUISES``)
are the first three, on Chapter 2 only, which benchmarks/class_report_scale.py still uses.
A disguised copy here is renamed
(every local name and parameter), reordered (adjacent statements that do not depend on
each other swapped) and recommented (comments and docstrings replaced), one at a time
and all together. The independent solutions are correct answers written differently,
as different learners would.
"""
from __future__ import annotations

import ast
import itertools
import textwrap

CHAPTER = "02_self_attention"

INDEPENDENT = {
    "scaled_dot_product_attention": [
        '''def scaled_dot_product_attention(query, key, value, mask=None):
    scale = 1.0 / query.shape[-1] ** 0.5
    logits = torch.matmul(query, key.transpose(-1, -2)) * scale
    if mask is not None:
        logits = torch.where(mask, logits, torch.full_like(logits, float("-inf")))
    attn = logits.softmax(dim=-1)
    return torch.matmul(attn, value), attn
''',
        '''def scaled_dot_product_attention(query, key, value, mask=None):
    d = query.shape[-1]
    s = torch.einsum("...qd,...kd->...qk", query, key) / math.sqrt(d)
    if mask is not None:
        s = s.masked_fill(mask == 0, -1e9)
    p = F.softmax(s, dim=-1)
    out = torch.einsum("...qk,...kv->...qv", p, value)
    return out, p
''',
        '''def scaled_dot_product_attention(query, key, value, mask=None):
    kt = key.transpose(-2, -1)
    raw = torch.matmul(query / math.sqrt(query.size(-1)), kt)
    if mask is not None:
        raw = raw.masked_fill(mask.logical_not(), float("-inf"))
    raw = raw - raw.amax(dim=-1, keepdim=True)
    e = raw.exp()
    weights = e / e.sum(dim=-1, keepdim=True)
    return weights.matmul(value), weights
''',
    ],
    "causal_mask": [
        "def causal_mask(n):\n    idx = torch.arange(n)\n    return idx[:, None] >= idx[None, :]\n",
        "def causal_mask(n):\n    m = torch.ones(n, n).tril()\n    return m.bool()\n",
        "def causal_mask(n):\n    upper = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)\n    return ~upper\n",
    ],
    "padding_mask": [
        '''def padding_mask(lengths, max_len):
    lengths = torch.as_tensor(lengths)
    return torch.arange(max_len).unsqueeze(0) < lengths.unsqueeze(1)
''',
        '''def padding_mask(lengths, max_len):
    mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :int(n)] = True
    return mask
''',
        '''def padding_mask(lengths, max_len):
    lengths = torch.as_tensor(lengths).view(-1, 1)
    grid = torch.arange(max_len, device=lengths.device).expand(lengths.shape[0], max_len)
    return grid.lt(lengths)
''',
    ],
    "SelfAttention": [
        '''class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_k)
        self.W_k = nn.Linear(d_model, d_k)
        self.W_v = nn.Linear(d_model, d_v)

    def forward(self, x, mask=None):
        return scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x), mask=mask)
''',
        '''class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        nn.Module.__init__(self)
        self.W_q, self.W_k, self.W_v = (nn.Linear(d_model, d) for d in (d_k, d_k, d_v))

    def forward(self, x, mask=None):
        out, attn = scaled_dot_product_attention(*(layer(x) for layer in (self.W_q, self.W_k, self.W_v)),
                                                 mask)
        return out, attn
''',
        '''class SelfAttention(torch.nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super(SelfAttention, self).__init__()
        layers = {"W_q": d_k, "W_k": d_k, "W_v": d_v}
        for name, size in layers.items():
            setattr(self, name, torch.nn.Linear(d_model, size))

    def forward(self, x, mask=None):
        projected = [getattr(self, name)(x) for name in ("W_q", "W_k", "W_v")]
        return scaled_dot_product_attention(projected[0], projected[1], projected[2], mask)
''',
    ],
}

# Other chapters: correct answers in other authors' styles (loops, einsum, complex numbers, index
# arithmetic, folded batch dimensions, reduce, per-head loops; a class's methods only, indented, put in
# its released stub), for the exercises the catalogs (tests/test_grading_chNN.py CORRECT) cover least.
# One-line exercises (split_heads, FeedForward, Block, performer_features, lsh_hash) get none: every
# answer to them is too short to rank.
# Each is graded in process at full marks before it is used (benchmarks/similarity_accuracy.py --verify).
MORE = {
    "01_bahdanau_attention": {
        "AdditiveAttention": [
            '''    def forward(self, query, keys, values, mask=None):
        projected_keys = self.U_a(keys)
        projected_query = self.W_a(query)
        energies = []
        for t in range(keys.shape[1]):
            e = self.v_a(torch.tanh(projected_query + projected_keys[:, t]))
            energies.append(e[:, 0])
        energy = torch.stack(energies, dim=1)
        alpha = masked_softmax(energy, mask)
        ctx = torch.einsum("bt,btd->bd", alpha, values)
        return ctx, alpha
''',
            '''    def forward(self, query, keys, values, mask=None):
        e = torch.tanh(self.U_a(keys) + self.W_a(query).unsqueeze(-2)) @ self.v_a.weight.t()
        w = masked_softmax(e.squeeze(2), mask)
        return torch.bmm(w.unsqueeze(1), values).squeeze(1), w
''',
        ],
    },
    "03_multi_head_attention": {
        "MultiHeadAttention": [
            '''    def forward(self, query, key, value, mask=None):
        h, d = self.num_heads, self.d_k
        heads, maps = [], []
        for i in range(h):
            rows = slice(i * d, (i + 1) * d)
            q_i = F.linear(query, self.W_q.weight[rows], self.W_q.bias[rows])
            k_i = F.linear(key, self.W_k.weight[rows], self.W_k.bias[rows])
            v_i = F.linear(value, self.W_v.weight[rows], self.W_v.bias[rows])
            m_i = None
            if mask is not None:
                m_i = torch.broadcast_to(mask, (query.shape[0], h, query.shape[1], key.shape[1]))[:, i]
            o_i, w_i = scaled_dot_product_attention(q_i, k_i, v_i, m_i)
            heads.append(o_i)
            maps.append(w_i)
        return self.W_o(torch.cat(heads, dim=-1)), torch.stack(maps, dim=1)
''',
            '''    def forward(self, query, key, value, mask=None):
        B, n_q, _ = query.shape
        n_k = key.shape[1]
        h, d = self.num_heads, self.d_k

        def fold(t, n):
            return t.reshape(B, n, h, d).permute(0, 2, 1, 3).reshape(B * h, n, d)
        q, k, v = fold(self.W_q(query), n_q), fold(self.W_k(key), n_k), fold(self.W_v(value), n_k)
        logits = torch.bmm(q, k.transpose(1, 2)) * d ** -0.5
        if mask is not None:
            allowed = mask.expand(B, h, n_q, n_k).reshape(B * h, n_q, n_k)
            logits = logits.masked_fill(allowed.logical_not(), float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        ctx = torch.bmm(probs, v).reshape(B, h, n_q, d).transpose(1, 2).reshape(B, n_q, h * d)
        return self.W_o(ctx), probs.view(B, h, n_q, n_k)
''',
        ],
    },
    "04_positional_encoding": {
        "sinusoidal_encoding": [
            '''def sinusoidal_encoding(max_len, d_model):
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            angle = pos / (10000 ** (i / d_model))
            pe[pos, i] = math.sin(angle)
            if i + 1 < d_model:
                pe[pos, i + 1] = math.cos(angle)
    return pe.to(torch.get_default_dtype())
''',
            '''def sinusoidal_encoding(max_len, d_model):
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = position * div_term
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
    return pe[:, :d_model].to(torch.get_default_dtype())
''',
        ],
    },
    "05_transformer": {
        "EncoderLayer": [
            '''    def forward(self, x, mask=None):
        def attend(z):
            out, _ = self.self_attn(z, z, z, mask)
            return out
        for norm, sublayer in ((self.norm1, attend), (self.norm2, self.ffn)):
            if self.norm_first:
                x = x + self.dropout(sublayer(norm(x)))
            else:
                x = norm(x + self.dropout(sublayer(x)))
        return x
''',
            '''    def forward(self, x, mask=None):
        residual = x
        h = self.norm1(x) if self.norm_first else x
        attn_out = self.self_attn(h, h, h, mask=mask)[0]
        x = residual + self.dropout(attn_out)
        if not self.norm_first:
            x = self.norm1(x)
        residual = x
        h = self.norm2(x) if self.norm_first else x
        x = residual + self.dropout(self.ffn(h))
        if not self.norm_first:
            x = self.norm2(x)
        return x
''',
        ],
        "DecoderLayer": [
            '''    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        def residual(x, i, sublayer):
            norm = getattr(self, f"norm{i}")
            if self.norm_first:
                return x + self.dropout(sublayer(norm(x)))
            return norm(x + self.dropout(sublayer(x)))

        def attend_self(h):
            return self.self_attn(h, h, h, tgt_mask)[0]

        def attend_memory(h):
            return self.cross_attn(h, memory, memory, memory_mask)[0]
        x = residual(x, 1, attend_self)
        x = residual(x, 2, attend_memory)
        return residual(x, 3, self.ffn)
''',
            '''    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        pre = self.norm_first
        y = self.norm1(x) if pre else x
        sa, _ = self.self_attn(y, y, y, tgt_mask)
        x = x + self.dropout(sa)
        x = x if pre else self.norm1(x)
        y = self.norm2(x) if pre else x
        ca, _ = self.cross_attn(y, memory, memory, memory_mask)
        x = x + self.dropout(ca)
        x = x if pre else self.norm2(x)
        y = self.norm3(x) if pre else x
        x = x + self.dropout(self.ffn(y))
        return x if pre else self.norm3(x)
''',
        ],
        "Transformer": [
            '''    def encode(self, src, src_mask=None):
        import functools
        n = src.shape[-1]
        h = self.dropout(self.src_embed(src) * self.d_model ** 0.5 + self.pe[:n].unsqueeze(0))
        return functools.reduce(lambda acc, layer: layer(acc, src_mask), self.encoder_layers, h)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        import functools
        n = tgt.shape[-1]
        h = self.dropout(self.tgt_embed(tgt) * self.d_model ** 0.5 + self.pe[:n].unsqueeze(0))
        return functools.reduce(lambda acc, layer: layer(acc, memory, tgt_mask, src_mask), self.decoder_layers, h)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        hidden = self.decode(tgt, self.encode(src, src_mask), src_mask, tgt_mask)
        return hidden @ self.out.weight.T + self.out.bias
''',
            '''    def _stack(self, table, ids, layers, step):
        positions = torch.arange(ids.size(1), device=ids.device)
        x = table(ids).mul(math.sqrt(self.d_model)).add(self.pe.index_select(0, positions))
        x = self.dropout(x)
        i = 0
        while i < len(layers):
            x = step(layers[i], x)
            i += 1
        return x

    def encode(self, src, src_mask=None):
        return self._stack(self.src_embed, src, self.encoder_layers, lambda layer, x: layer(x, src_mask))

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        return self._stack(self.tgt_embed, tgt, self.decoder_layers,
                           lambda layer, x: layer(x, memory, tgt_mask, src_mask))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encode(src, src_mask=src_mask)
        return self.out(self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask))
''',
        ],
        "greedy_decode": [
            '''def greedy_decode(model, src, max_len, bos_id, eos_id, src_mask=None):
    memory = model.encode(src, src_mask)
    batch = src.shape[0]
    columns = [torch.full((batch,), bos_id, dtype=torch.long, device=src.device)]
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    step = 0
    while step < max_len and not bool(done.all()):
        tokens = torch.stack(columns, dim=1)
        size = tokens.shape[1]
        mask = torch.arange(size)[None, :] <= torch.arange(size)[:, None]
        hidden = model.decode(tokens, memory, src_mask, mask.to(src.device))
        choice = model.out(hidden[:, -1, :]).max(dim=-1).indices
        columns.append(choice)
        done = done | choice.eq(eos_id)
        step += 1
    return torch.stack(columns, dim=1)
''',
            '''def greedy_decode(model, src, max_len, bos_id, eos_id, src_mask=None):
    B = src.size(0)
    enc = model.encode(src, src_mask)
    out = torch.empty(B, max_len + 1, dtype=torch.long, device=src.device)
    out[:, 0] = bos_id
    seen_end = torch.zeros(B, dtype=torch.bool, device=src.device)
    length = 1
    for t in range(1, max_len + 1):
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=src.device), diagonal=1)
        logits = model.out(model.decode(out[:, :t], enc, src_mask, ~future))
        out[:, t] = torch.argmax(logits[:, t - 1], dim=-1)
        length = t + 1
        seen_end |= out[:, t] == eos_id
        if seen_end.all():
            break
    return out[:, :length]
''',
        ],
    },
    "06_efficient_attention": {
        "local_attention_mask": [
            '''def local_attention_mask(n, radius, causal=False, global_tokens=()):
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        lo, hi = max(0, q - radius), min(n, q + radius + 1)
        allowed[q, lo:hi] = True
    hubs = [int(t) for t in global_tokens]
    if hubs:
        allowed[hubs] = True
        allowed[:, hubs] = True
    return allowed & torch.ones(n, n, dtype=torch.bool).tril() if causal else allowed
''',
            '''def local_attention_mask(n, radius, causal=False, global_tokens=()):
    ones = torch.ones(n, n, dtype=torch.bool)
    band = torch.triu(ones, diagonal=-radius) & torch.tril(ones, diagonal=0 if causal else radius)
    g = torch.tensor(sorted({int(t) for t in global_tokens}), dtype=torch.long)
    flag = torch.zeros(n, dtype=torch.bool).index_fill(0, g, True)
    extra = flag.unsqueeze(0) | flag.unsqueeze(1)
    if causal:
        extra = extra & ones.tril()
    return band | extra
''',
        ],
        "linformer_attention": [
            '''def linformer_attention(query, key, value, E, F):
    keys = torch.einsum("kn,...nd->...kd", E, key)
    vals = torch.einsum("kn,...nd->...kd", F, value)
    logits = torch.einsum("...qd,...kd->...qk", query, keys) * query.shape[-1] ** -0.5
    w = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    w = w / w.sum(-1, keepdim=True)
    return torch.einsum("...qk,...kd->...qd", w, vals), w
''',
        ],
        "linear_attention": [
            '''def linear_attention(query, key, value, causal=False, eps=1e-6):
    phi_q = torch.nn.functional.elu(query) + 1.0
    phi_k = torch.nn.functional.elu(key) + 1.0
    if not causal:
        kv = torch.einsum("...nd,...ne->...de", phi_k, value)
        norm = phi_k.sum(dim=-2)
        num = torch.einsum("...nd,...de->...ne", phi_q, kv)
        den = torch.einsum("...nd,...d->...n", phi_q, norm).unsqueeze(-1)
        return num / (den + eps)
    state = phi_k.new_zeros(*phi_k.shape[:-2], phi_k.shape[-1], value.shape[-1])
    total = phi_k.new_zeros(*phi_k.shape[:-2], 1, phi_k.shape[-1])
    rows = []
    for start in range(0, phi_q.shape[-2], 128):
        qb, kb, vb = (t[..., start:start + 128, :] for t in (phi_q, phi_k, value))
        n = qb.shape[-2]
        local = torch.einsum("...id,...jd->...ij", qb, kb) * torch.ones(n, n, dtype=qb.dtype, device=qb.device).tril()
        num = torch.einsum("...ij,...je->...ie", local, vb) + torch.einsum("...id,...de->...ie", qb, state)
        den = local.sum(-1, keepdim=True) + torch.einsum("...id,...jd->...ij", qb, total)
        rows.append(num / (den + eps))
        state = state + torch.einsum("...jd,...je->...de", kb, vb)
        total = total + kb.sum(-2, keepdim=True)
    return torch.cat(rows, dim=-2)
''',
            '''def linear_attention(query, key, value, causal=False, eps=1e-6):
    fq, fk = F.elu(query).add(1), F.elu(key).add(1)
    if not causal:
        S = fk.mT @ value
        z = fk.sum(-2)
        return (fq @ S) / ((fq @ z.unsqueeze(-1)) + eps)
    outs = []
    S = torch.zeros(fk.shape[:-2] + (fk.shape[-1], value.shape[-1]), dtype=fk.dtype, device=fk.device)
    z = torch.zeros(fk.shape[:-2] + (fk.shape[-1],), dtype=fk.dtype, device=fk.device)
    step = 32
    for s in range(0, fq.shape[-2], step):
        kc, vc, qc = fk[..., s:s + step, :], value[..., s:s + step, :], fq[..., s:s + step, :]
        S_run = S.unsqueeze(-3) + torch.cumsum(kc.unsqueeze(-1) * vc.unsqueeze(-2), dim=-3)
        z_run = z.unsqueeze(-2) + torch.cumsum(kc, dim=-2)
        num = (qc.unsqueeze(-1) * S_run).sum(-2)
        den = (qc * z_run).sum(-1, keepdim=True)
        outs.append(num / (den + eps))
        S, z = S_run[..., -1, :, :], z_run[..., -1, :]
    return torch.cat(outs, dim=-2)
''',
        ],
        "flash_attention": [
            '''def flash_attention(query, key, value, block_size=64, causal=False):
    scale = query.shape[-1] ** -0.5
    n_q, n_k = query.shape[-2], key.shape[-2]
    out_blocks = []
    for qs in range(0, n_q, block_size):
        qb = query[..., qs:qs + block_size, :] * scale
        rows = qb.shape[-2]
        run_max = torch.full(qb.shape[:-1] + (1,), float("-inf"), dtype=query.dtype, device=query.device)
        run_sum = torch.zeros_like(run_max)
        run_out = torch.zeros(qb.shape[:-1] + (value.shape[-1],), dtype=query.dtype, device=query.device)
        for ks in range(0, n_k, block_size):
            if causal and ks > qs + rows - 1:
                break
            kb = key[..., ks:ks + block_size, :]
            vb = value[..., ks:ks + block_size, :]
            s = qb @ kb.transpose(-2, -1)
            if causal:
                qi = torch.arange(qs, qs + rows, device=query.device).unsqueeze(-1)
                kj = torch.arange(ks, ks + kb.shape[-2], device=query.device).unsqueeze(0)
                s = s.masked_fill(kj > qi, float("-inf"))
            new_max = torch.maximum(run_max, s.amax(-1, keepdim=True))
            p = torch.exp(s - new_max)
            correction = torch.exp(run_max - new_max)
            run_sum = run_sum * correction + p.sum(-1, keepdim=True)
            run_out = run_out * correction + p @ vb
            run_max = new_max
        out_blocks.append(run_out / run_sum)
    return torch.cat(out_blocks, dim=-2)
''',
            '''def flash_attention(query, key, value, block_size=64, causal=False):
    n_q, d = query.shape[-2:]
    n_k, d_v = key.shape[-2], value.shape[-1]
    Q = query.reshape(-1, n_q, d)
    K = key.reshape(-1, n_k, d)
    V = value.reshape(-1, n_k, d_v)
    G = Q.shape[0]
    O = [Q.new_zeros(G, min(block_size, n_q - i), d_v) for i in range(0, n_q, block_size)]
    L = [Q.new_zeros(G, o.shape[1], 1) for o in O]
    M = [Q.new_full((G, o.shape[1], 1), -math.inf) for o in O]
    for k0 in range(0, n_k, block_size):
        Kj, Vj = K[:, k0:k0 + block_size], V[:, k0:k0 + block_size]
        for i, q0 in enumerate(range(0, n_q, block_size)):
            if causal and k0 > q0 + O[i].shape[1] - 1:
                continue
            S = torch.bmm(Q[:, q0:q0 + block_size], Kj.transpose(1, 2)) / math.sqrt(d)
            if causal:
                future = torch.arange(k0, k0 + Kj.shape[1])[None, :] > torch.arange(q0, q0 + S.shape[1])[:, None]
                S = S.masked_fill(future.to(S.device), -math.inf)
            m = torch.maximum(M[i], S.max(dim=-1, keepdim=True).values)
            P = torch.exp(S - m)
            a = torch.exp(M[i] - m)
            L[i] = a * L[i] + P.sum(-1, keepdim=True)
            O[i] = a * O[i] + torch.bmm(P, Vj)
            M[i] = m
    return torch.cat([o / s for o, s in zip(O, L)], dim=1).reshape(*query.shape[:-1], d_v)
''',
        ],
        "GroupedQueryAttention": [
            '''    def forward(self, x, mask=None):
        B, N, _ = x.shape
        g = self.num_heads // self.num_kv_heads
        q = self.W_q(x).reshape(B, N, self.num_kv_heads, g, self.d_head)
        k = self.W_k(x).reshape(B, N, self.num_kv_heads, self.d_head)
        v = self.W_v(x).reshape(B, N, self.num_kv_heads, self.d_head)
        s = torch.einsum("bqcgd,bkcd->bcgqk", q, k) / math.sqrt(self.d_head)
        s = s.reshape(B, self.num_heads, N, N)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(dim=-1)
        o = torch.einsum("bcgqk,bkcd->bqcgd", w.view(B, self.num_kv_heads, g, N, N), v)
        return self.W_o(o.reshape(B, N, -1)), w
''',
            '''    def forward(self, x, mask=None):
        B, N, _ = x.shape
        d = self.d_head
        per_group = self.num_heads // self.num_kv_heads
        q_all, k_all, v_all = self.W_q(x), self.W_k(x), self.W_v(x)
        outputs, weights = [], []
        for head in range(self.num_heads):
            c = head // per_group
            q = q_all[..., head * d:(head + 1) * d]
            k = k_all[..., c * d:(c + 1) * d]
            v = v_all[..., c * d:(c + 1) * d]
            m = None if mask is None else torch.broadcast_to(mask, (B, self.num_heads, N, N))[:, head]
            o, w = attention(q, k, v, m)
            outputs.append(o)
            weights.append(w)
        return self.W_o(torch.cat(outputs, -1)), torch.stack(weights, 1)
''',
        ],
    },
    "07_gpt": {
        "CausalSelfAttention": [
            '''    def forward(self, x, past=None):
        B, N, C = x.shape
        H = self.num_heads
        D = C // H
        proj = self.c_attn(x)
        q, k_new, v_new = [proj[..., i * C:(i + 1) * C].reshape(B, N, H, D).permute(0, 2, 1, 3) for i in range(3)]
        k = k_new if past is None else torch.cat((past[0], k_new), dim=-2)
        v = v_new if past is None else torch.cat((past[1], v_new), dim=-2)
        total = k.shape[-2]
        qpos = torch.arange(total - N, total, device=x.device).view(N, 1)
        kpos = torch.arange(total, device=x.device).view(1, total)
        att = torch.matmul(q, k.transpose(-1, -2)) * D ** -0.5
        att = att.masked_fill(kpos > qpos, float("-inf")).softmax(-1)
        y = torch.matmul(att, v).permute(0, 2, 1, 3).reshape(B, N, C)
        return self.c_proj(y), (k, v)
''',
            '''    def forward(self, x, past=None):
        B, N, C = x.shape
        h = self.num_heads
        hd = C // h
        q_all, k_all, v_all = torch.chunk(self.c_attn(x), 3, dim=-1)
        new_k = torch.stack([k_all[..., i * hd:(i + 1) * hd] for i in range(h)], dim=1)
        new_v = torch.stack([v_all[..., i * hd:(i + 1) * hd] for i in range(h)], dim=1)
        if past is not None:
            new_k = torch.cat([past[0], new_k], dim=2)
            new_v = torch.cat([past[1], new_v], dim=2)
        P = new_k.shape[2] - N
        allowed = torch.tril(torch.ones(N, P + N, dtype=torch.bool, device=x.device), diagonal=P)
        outs = []
        for i in range(h):
            s = q_all[..., i * hd:(i + 1) * hd] @ new_k[:, i].transpose(1, 2) / math.sqrt(hd)
            s = torch.where(allowed, s, torch.tensor(float("-inf"), dtype=s.dtype, device=s.device))
            outs.append(torch.softmax(s, dim=-1) @ new_v[:, i])
        return self.c_proj(torch.cat(outs, dim=-1)), (new_k, new_v)
''',
        ],
        "GPT": [
            '''    def forward(self, idx, past=None):
        n = idx.shape[1]
        start = past[0][0].shape[-2] if past else 0
        positions = torch.arange(start, start + n, dtype=torch.long, device=idx.device).unsqueeze(0)
        h = self.wte(idx) + self.wpe(positions)
        caches = past if past is not None else [None] * len(self.blocks)
        presents = []
        for block, cache in zip(self.blocks, caches):
            h, kv = block(h, cache)
            presents.append(kv)
        return self.lm_head(self.ln_f(h)), presents
''',
            '''    def forward(self, idx, past=None):
        B, N = idx.size()
        cached = 0
        if past is not None:
            cached = past[0][0].size(-2)
        x = self.wte(idx) + self.wpe.weight[cached:cached + N][None]
        presents = []
        i = 0
        while i < len(self.blocks):
            layer_past = None if past is None else past[i]
            x, present = self.blocks[i](x, layer_past)
            presents += [present]
            i += 1
        logits = self.lm_head(self.ln_f(x))
        return logits, presents
''',
        ],
        "filter_logits": [
            '''def filter_logits(logits, top_k=None, top_p=None):
    result = logits.clone()
    vocab = result.shape[-1]
    if top_k is not None and top_k < vocab:
        threshold = result.sort(dim=-1, descending=True).values[..., top_k - 1, None]
        result = torch.where(result < threshold, torch.full_like(result, float("-inf")), result)
    if top_p is not None:
        probs = torch.softmax(result, dim=-1)
        ranked, index = probs.sort(dim=-1, descending=True)
        cut = torch.cumsum(ranked, dim=-1) - ranked >= top_p
        result = result.masked_fill(cut.scatter(-1, index, cut), float("-inf"))
    return result
''',
            '''def filter_logits(logits, top_k=None, top_p=None):
    flat = logits.reshape(-1, logits.shape[-1]).clone()
    for row in flat:
        if top_k is not None:
            k = min(int(top_k), row.numel())
            kth_value = torch.topk(row, k).values.min()
            row[row < kth_value] = -math.inf
        if top_p is not None:
            order = torch.argsort(row, descending=True)
            p = torch.softmax(row[order], dim=0)
            keep = torch.cumsum(p, dim=0) - p < top_p
            row[order[~keep]] = -math.inf
    return flat.reshape(logits.shape)
''',
        ],
        "generate": [
            '''def generate(model, idx, max_new_tokens, use_cache=True):
    with torch.inference_mode():
        sequence = idx.clone()
        past = None
        step_input = sequence
        for _ in range(max_new_tokens):
            if not use_cache:
                step_input, past = sequence, None
            logits, presents = model(step_input, past)
            chosen = logits[:, -1, :].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, chosen], dim=-1)
            if use_cache:
                past, step_input = presents, chosen
    return sequence
''',
            '''def generate(model, idx, max_new_tokens, use_cache=True):
    generated = [idx]
    past = None
    last = idx
    for _ in range(max_new_tokens):
        with torch.no_grad():
            if use_cache:
                logits, past = model(last, past)
            else:
                logits = model(torch.cat(generated, dim=1))[0]
        last = logits[:, -1].max(dim=-1, keepdim=True)[1]
        generated.append(last)
    return torch.cat(generated, dim=1)
''',
        ],
        "load_gpt2_weights": [
            '''def load_gpt2_weights(model, state_dict):
    def put(param, name, transpose=False):
        if name not in state_dict:
            raise KeyError(f"missing {name} in the checkpoint")
        tensor = state_dict[name].T if transpose else state_dict[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(tensor)
    put(model.wte.weight, "transformer.wte.weight")
    put(model.wpe.weight, "transformer.wpe.weight")
    for i, block in enumerate(model.blocks):
        prefix = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            put(getattr(block, norm).weight, prefix + norm + ".weight")
            put(getattr(block, norm).bias, prefix + norm + ".bias")
        for name, layer in (("attn.c_attn", block.attn.c_attn), ("attn.c_proj", block.attn.c_proj),
                            ("mlp.c_fc", block.mlp.c_fc), ("mlp.c_proj", block.mlp.c_proj)):
            put(layer.weight, prefix + name + ".weight", transpose=True)
            put(layer.bias, prefix + name + ".bias")
    put(model.ln_f.weight, "transformer.ln_f.weight")
    put(model.ln_f.bias, "transformer.ln_f.bias")
    return model
''',
            '''def load_gpt2_weights(model, state_dict):
    theirs = {}
    for key, tensor in state_dict.items():
        if not key.startswith("transformer.") or key.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        name = key[len("transformer."):]
        if name.startswith("h."):
            name = "blocks." + name[2:]
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            tensor = tensor.transpose(0, 1)
        theirs[name] = tensor
    for name, param in model.named_parameters():
        if name not in theirs:
            raise KeyError(f"no checkpoint tensor for {name} (transformer.{name.replace('blocks.', 'h.', 1)})")
        if theirs[name].shape != param.shape:
            raise ValueError(f"shape mismatch for {name}: {tuple(theirs[name].shape)} vs {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(theirs[name])
    return model
''',
        ],
    },
    "08_modern_attention": {
        "RMSNorm": [
            '''    def forward(self, x):
        inv = torch.rsqrt(torch.mean(x * x, -1, keepdim=True) + self.eps)
        return x * inv * self.weight
''',
            '''    def forward(self, x):
        mean_square = (x ** 2).sum(-1, keepdim=True) / x.shape[-1]
        return self.weight * x / (mean_square + self.eps) ** 0.5
''',
        ],
        "apply_rope_halves": [
            '''def apply_rope_halves(x, positions, base=10000.0):
    half = x.size(-1) // 2
    freqs = 1.0 / base ** (torch.arange(half, dtype=torch.float64, device=x.device) * 2 / x.size(-1))
    ang = torch.outer(positions.to(torch.float64), freqs)
    ang = torch.cat((ang, ang), dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * ang.cos().to(x.dtype) + rotated * ang.sin().to(x.dtype)
''',
            '''def apply_rope_halves(x, positions, base=10000.0):
    h = x.shape[-1] // 2
    inv = base ** (-torch.arange(h, dtype=torch.float64) / h)
    rot = torch.polar(torch.ones(len(positions), h, dtype=torch.float64),
                      positions.to(torch.float64).cpu()[:, None] * inv)
    z = torch.complex(x[..., :h].double(), x[..., h:].double()) * rot.to(x.device)
    return torch.cat([z.real, z.imag], -1).to(x.dtype)
''',
        ],
        "SwiGLU": [
            '''    def forward(self, x):
        g = self.gate_proj(x)
        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))
''',
            '''    def forward(self, x):
        h = x @ self.gate_proj.weight.T
        h = h * h.sigmoid()
        h = h * (x @ self.up_proj.weight.T)
        return h @ self.down_proj.weight.T
''',
        ],
        "sliding_window_mask": [
            '''def sliding_window_mask(n, window, num_sinks=0):
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, max(0, i - window + 1):i + 1] = True
        mask[i, :min(num_sinks, i + 1)] = True
    return mask
''',
            '''def sliding_window_mask(n, window, num_sinks=0):
    ones = torch.ones(n, n, dtype=torch.bool)
    band = torch.tril(ones) & torch.triu(ones, diagonal=-(window - 1))
    sinks = torch.zeros(n, n, dtype=torch.bool)
    sinks[:, :num_sinks] = True
    return band | (sinks & torch.tril(ones))
''',
        ],
        "evict_to_sinks": [
            '''def evict_to_sinks(k, v, num_sinks, window):
    length = k.shape[2]
    if length > num_sinks + window:
        k = torch.cat((k[:, :, :num_sinks], k[:, :, length - window:]), dim=2)
        v = torch.cat((v[:, :, :num_sinks], v[:, :, length - window:]), dim=2)
    return k, v
''',
            '''def evict_to_sinks(k, v, num_sinks, window):
    T = k.size(-2)
    if T > num_sinks + window:
        keep = [t for t in range(T) if t < num_sinks or t >= T - window]
    else:
        keep = list(range(T))
    idx = torch.tensor(keep, dtype=torch.long, device=k.device)
    return k.index_select(2, idx), v.index_select(2, idx)
''',
        ],
        "paged_attention": [
            '''def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    B, H, d = query.shape
    bs = k_cache.shape[2]
    out = query.new_zeros(B, H, v_cache.shape[-1])
    for b in range(B):
        n = int(seq_lens[b])
        keys = torch.stack([k_cache[block_table[b, t // bs], :, t % bs] for t in range(n)], dim=1)
        vals = torch.stack([v_cache[block_table[b, t // bs], :, t % bs] for t in range(n)], dim=1)
        s = torch.einsum("hd,hnd->hn", query[b], keys) / d ** 0.5
        out[b] = torch.einsum("hn,hnd->hd", s.softmax(-1), vals)
    return out
''',
            '''def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    num_blocks, H, bs, d = k_cache.shape
    B, max_blocks = block_table.shape
    table = block_table.long().clamp(0, num_blocks - 1)
    k = k_cache[table].permute(0, 2, 1, 3, 4).reshape(B, H, max_blocks * bs, d)
    v = v_cache[table].permute(0, 2, 1, 3, 4).reshape(B, H, max_blocks * bs, -1)
    scores = (query.unsqueeze(2) @ k.transpose(-1, -2)).squeeze(2) * d ** -0.5
    valid = torch.arange(max_blocks * bs, device=query.device)[None, :] < seq_lens.to(query.device)[:, None]
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return (scores.softmax(dim=-1).unsqueeze(2) @ v).squeeze(2)
''',
        ],
    },
}


def _in_stub(chapter: str, exercise: str, methods: str) -> str:
    """A class exercise's released stub with the methods it asks for replaced by those of METHODS
    (indented method definitions; a helper method is added): the given __init__ kept."""
    from .sample_submissions import learner_notebook
    stub = next(c.source for c in learner_notebook(chapter).cells
                if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == exercise)
    tree = ast.parse(stub)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    written = ast.parse(textwrap.dedent(methods)).body
    names = {n.name for n in written}
    cls.body = [n for n in cls.body if getattr(n, "name", None) not in names] + written
    return ast.unparse(tree) + "\n"


def independent_solutions(chapter: str) -> dict[str, list[str]]:
    """exercise -> the independent correct answers kept here for chapter (Chapter 2's and MORE)."""
    found: dict[str, list[str]] = {}
    for ex, sols in [*(INDEPENDENT.items() if chapter == CHAPTER else ()), *MORE.get(chapter, {}).items()]:
        found.setdefault(ex, []).extend(_in_stub(chapter, ex, s) if s[:1].isspace() else s for s in sols)
    return found


class _Rename(ast.NodeTransformer):
    """Every parameter and every assigned local name gets a new name (names of defs kept)."""

    def __init__(self, local: set[str]):
        self.map = {name: f"{name[:1]}{i}_val" for i, name in enumerate(sorted(local))}

    def visit_Name(self, node):
        node.id = self.map.get(node.id, node.id)
        return node

    def visit_arg(self, node):
        node.arg = self.map.get(node.arg, node.arg)
        return node


def _locals(tree) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.arg != "self":
            found.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
    return found


def renamed(source: str) -> str:
    tree = ast.parse(source)
    return ast.unparse(_Rename(_locals(tree)).visit(tree)) + "\n"


def _names(node, ctx) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def _independent(a, b) -> bool:
    if any(isinstance(s, (ast.Return, ast.Raise, ast.Expr)) for s in (a, b)):
        return False
    wa, wb = _names(a, ast.Store), _names(b, ast.Store)
    ra, rb = _names(a, ast.Load), _names(b, ast.Load)
    return not (wa & rb or wb & ra or wa & wb)


def reordered(source: str) -> str:
    """Swap every adjacent pair of statements that do not depend on each other (first come first)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        i = 0
        while i + 1 < len(body):
            if _independent(body[i], body[i + 1]) and not isinstance(body[i], ast.Expr):
                body[i], body[i + 1] = body[i + 1], body[i]
                i += 2
            else:
                i += 1
    return ast.unparse(tree) + "\n"


def recommented(source: str) -> str:
    """Docstrings dropped, every comment removed, a new comment before every other line."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    lines = []
    for i, line in enumerate(ast.unparse(tree).splitlines()):
        if i % 2 and line.strip():
            indent = line[:len(line) - len(line.lstrip())]
            lines.append(f"{indent}# my own step {i}: see the lecture notes")
        lines.append(line + ("  # checked" if i % 3 == 0 else ""))
    return "\n".join(lines) + "\n"


def padded(source: str) -> str:
    """A statement of no use added at the start of every function (what a copier adds to look different)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body.insert(0, ast.parse("debug_steps = []").body[0])
    return ast.unparse(tree) + "\n"


DISGUISES = {
    "renamed": renamed,
    "reordered": reordered,
    "recommented": recommented,
    "all three": lambda s: recommented(reordered(renamed(s))),
    "all three and a line added": lambda s: recommented(reordered(renamed(padded(s)))),
}


def disguised(answers: dict[str, str]) -> dict[str, dict[str, str]]:
    """disguise name -> answers with that disguise applied to every exercise."""
    return {name: {ex: how(src) for ex, src in answers.items()} for name, how in DISGUISES.items()}


def independent_sets() -> list[dict[str, str]]:
    """Independent learners: the i-th solution of every exercise of Chapter 2."""
    solutions = independent_solutions(CHAPTER)
    count = min(len(v) for v in solutions.values())
    return [{ex: sols[i] for ex, sols in solutions.items()} for i in range(count)]


def pairs_of(names) -> list[tuple[str, str]]:
    return list(itertools.combinations(names, 2))
