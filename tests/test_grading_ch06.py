"""Hidden tests of Chapter 6 against a catalog of correct, wrong and hostile submissions.

Every notebook is graded by the real pipeline (nbgrader autograde in the sandboxed kernel,
judged in the grader's own process; the memory rules read the kernel's peak memory from
outside). A correct style gets every point; a mistake loses exactly the listed tests, each
with the given message fragment, and passes every other test.
"""
from __future__ import annotations

import textwrap

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, common_tampering, others_stubbed, replaced, submitter, tampered, with_body

CHAPTER = "06_efficient_attention"
ALL_TESTS = list(ChapterInfo(CHAPTER).tests)
LOCAL_TESTS = [t for t in ALL_TESTS if t.startswith("test_local")]
LINFORMER_TESTS = [t for t in ALL_TESTS if t.startswith("test_linformer")]
LINEAR_TESTS = [t for t in ALL_TESTS if t.startswith("test_linear_")]
FLASH_TESTS = [t for t in ALL_TESTS if t.startswith("test_flash")]
GQA_TESTS = [t for t in ALL_TESTS if t.startswith("test_GroupedQuery")]

SIGNATURES = {
    "local_attention_mask": "def local_attention_mask(n, radius, causal=False, global_tokens=()):",
    "linformer_attention": "def linformer_attention(query, key, value, E, F):",
    "linear_attention": "def linear_attention(query, key, value, causal=False, eps=1e-6):",
    "performer_features": "def performer_features(x, omega):",
    "lsh_hash": "def lsh_hash(x, rotations):",
    "flash_attention": "def flash_attention(query, key, value, block_size=64, causal=False):",
}


def fn(name: str, body: str) -> str:
    return SIGNATURES[name] + "\n" + textwrap.indent(textwrap.dedent(body).strip(), "    ") + "\n"


def gqa(forward_body: str) -> str:
    return with_body(CHAPTER, "GroupedQueryAttention", "GroupedQueryAttention.forward", forward_body)


# One correct forward (repeat_interleave, explicit scores); each GQA mistake below is a named change of it.
GQA_BODY = """
    B, N, _ = x.shape
    q = self.W_q(x).view(B, N, self.num_heads, self.d_head).transpose(1, 2)
    k = self.W_k(x).view(B, N, self.num_kv_heads, self.d_head).transpose(1, 2)
    v = self.W_v(x).view(B, N, self.num_kv_heads, self.d_head).transpose(1, 2)
    group = self.num_heads // self.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = scores.softmax(-1)
    return self.W_o((w @ v).transpose(1, 2).reshape(B, N, -1)), w
"""


def gqa_with(old: str, new: str) -> str:
    return gqa(replaced(GQA_BODY, old, new))


sub = submitter(CHAPTER)


# ------------------------------------------------------------------ correct, other styles
# 1. As published code writes them: band matrices, einsum (lucidrains' linformer, performer-pytorch,
#    reformer-pytorch), fast-transformers' linear attention with cumsum for causal, FlashAttention-1's
#    loop order (key blocks outside, normalised output updated in place), Hugging Face's repeat_kv.
PUBLISHED = {
    "local_attention_mask": fn("local_attention_mask", """
        mask = torch.ones(n, n).triu(-radius).tril(radius).bool()
        for g in global_tokens:
            mask[g, :] = True
            mask[:, g] = True
        if causal:
            mask &= torch.ones(n, n, dtype=torch.bool).tril()
        return mask
    """),
    "linformer_attention": fn("linformer_attention", """
        keys = torch.einsum('...nd,kn->...kd', key, E)
        values = torch.einsum('...nd,kn->...kd', value, F)
        dots = torch.einsum('...id,...jd->...ij', query, keys) * query.shape[-1] ** -0.5
        attn = dots.softmax(dim=-1)
        return torch.einsum('...ij,...jd->...id', attn, values), attn
    """),
    "linear_attention": fn("linear_attention", """
        Q = torch.nn.functional.elu(query) + 1
        K = torch.nn.functional.elu(key) + 1
        if not causal:
            KV = torch.einsum("...sd,...sm->...dm", K, value)
            Z = 1 / (torch.einsum("...ld,...d->...l", Q, K.sum(dim=-2)) + eps)
            return torch.einsum("...ld,...dm,...l->...lm", Q, KV, Z)
        context = torch.einsum('...nd,...ne->...nde', K, value).cumsum(dim=-3)
        D_inv = 1. / (torch.einsum('...nd,...nd->...n', Q, K.cumsum(dim=-2)) + eps)
        return torch.einsum('...nde,...nd,...n->...ne', context, Q, D_inv)
    """),
    "performer_features": fn("performer_features", """
        ratio = omega.shape[-1] ** -0.5
        data_dash = torch.einsum('...d,dm->...m', x, omega)
        diag_data = (x ** 2).sum(dim=-1) / 2.0
        return ratio * torch.exp(data_dash - diag_data.unsqueeze(-1))
    """),
    "lsh_hash": fn("lsh_hash", """
        rotated = torch.einsum('...nd,dr->...nr', x, rotations)
        rotated = torch.cat([rotated, -rotated], dim=-1)
        return torch.argmax(rotated, dim=-1)
    """),
    "flash_attention": fn("flash_attention", """
        N_q, N_k, d = query.shape[-2], key.shape[-2], query.shape[-1]
        O = torch.zeros(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
        l = torch.zeros(*query.shape[:-1], 1, dtype=query.dtype)
        m = torch.full((*query.shape[:-1], 1), float('-inf'), dtype=query.dtype)
        for j in range(0, N_k, block_size):
            K_j, V_j = key[..., j:j + block_size, :], value[..., j:j + block_size, :]
            for i in range(0, N_q, block_size):
                if causal and j > i + block_size - 1:
                    continue
                Q_i = query[..., i:i + block_size, :]
                S_ij = Q_i @ K_j.transpose(-2, -1) / math.sqrt(d)
                if causal:
                    rows = torch.arange(i, i + S_ij.shape[-2])[:, None]
                    cols = torch.arange(j, j + S_ij.shape[-1])[None, :]
                    S_ij = S_ij.masked_fill(cols > rows, float('-inf'))
                m_ij = S_ij.max(dim=-1, keepdim=True).values
                P_ij = torch.exp(S_ij - m_ij)
                l_ij = P_ij.sum(dim=-1, keepdim=True)
                m_i, l_i, O_i = m[..., i:i + block_size, :], l[..., i:i + block_size, :], O[..., i:i + block_size, :]
                m_new = torch.maximum(m_i, m_ij)
                l_new = torch.exp(m_i - m_new) * l_i + torch.exp(m_ij - m_new) * l_ij
                O[..., i:i + block_size, :] = (l_i * torch.exp(m_i - m_new) * O_i
                                               + torch.exp(m_ij - m_new) * (P_ij @ V_j)) / l_new
                m[..., i:i + block_size, :] = m_new
                l[..., i:i + block_size, :] = l_new
        return O
    """),
    "GroupedQueryAttention": gqa("""
        bsz, q_len, _ = x.size()
        query_states = self.W_q(x).view(bsz, q_len, self.num_heads, self.d_head).transpose(1, 2)
        key_states = self.W_k(x).view(bsz, q_len, self.num_kv_heads, self.d_head).transpose(1, 2)
        value_states = self.W_v(x).view(bsz, q_len, self.num_kv_heads, self.d_head).transpose(1, 2)
        n_rep = self.num_heads // self.num_kv_heads
        def repeat_kv(hidden_states):
            b, kvh, slen, hd = hidden_states.shape
            return hidden_states[:, :, None, :, :].expand(b, kvh, n_rep, slen, hd).reshape(b, kvh * n_rep, slen, hd)
        key_states, value_states = repeat_kv(key_states), repeat_kv(value_states)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.d_head)
        if mask is not None:
            attn_weights = torch.where(mask, attn_weights, torch.finfo(attn_weights.dtype).min)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
        return self.W_o(attn_output.reshape(bsz, q_len, -1)), attn_weights
    """),
}

# 2. Loops and log-space: Python loops for the mask, a token-by-token recurrence for causal linear
#    attention, an online softmax kept as a running log-sum-exp, one head at a time in GQA.
LOOPS = {
    "local_attention_mask": fn("local_attention_mask", """
        rows = []
        for i in range(n):
            row = []
            for j in range(n):
                ok = abs(i - j) <= radius or i in global_tokens or j in global_tokens
                row.append(ok and (j <= i or not causal))
            rows.append(row)
        return torch.tensor(rows, dtype=torch.bool).reshape(n, n)
    """),
    "linformer_attention": fn("linformer_attention", """
        k_proj = torch.matmul(E, key)
        v_proj = torch.matmul(F, value)
        scores = torch.matmul(query, k_proj.transpose(-1, -2)) / math.sqrt(query.size(-1))
        w = nn.functional.softmax(scores, dim=-1)
        return torch.matmul(w, v_proj), w
    """),
    "linear_attention": fn("linear_attention", """
        phi_q = torch.where(query > 0, query + 1, torch.exp(query))
        phi_k = torch.where(key > 0, key + 1, torch.exp(key))
        if not causal:
            S = phi_k.transpose(-1, -2) @ value
            z = phi_k.sum(-2)
            return (phi_q @ S) / ((phi_q * z.unsqueeze(-2)).sum(-1, keepdim=True) + eps)
        S = torch.zeros(*query.shape[:-2], query.shape[-1], value.shape[-1], dtype=query.dtype)
        z = torch.zeros(*query.shape[:-2], query.shape[-1], dtype=query.dtype)
        outs = []
        for i in range(query.shape[-2]):
            S = S + phi_k[..., i, :].unsqueeze(-1) * value[..., i, :].unsqueeze(-2)
            z = z + phi_k[..., i, :]
            num = (phi_q[..., i, :].unsqueeze(-1) * S).sum(-2)
            outs.append(num / ((phi_q[..., i, :] * z).sum(-1, keepdim=True) + eps))
        return torch.stack(outs, dim=-2)
    """),
    "performer_features": fn("performer_features", """
        m = omega.shape[1]
        proj = torch.einsum('...d,dm->...m', x, omega)
        return torch.exp(proj - 0.5 * torch.linalg.vector_norm(x, dim=-1, keepdim=True) ** 2) / math.sqrt(m)
    """),
    "lsh_hash": fn("lsh_hash", """
        xr = x @ rotations
        return torch.max(torch.cat((xr, -xr), dim=-1), dim=-1).indices
    """),
    "flash_attention": fn("flash_attention", """
        scale = query.shape[-1] ** -0.5
        outs = []
        for i in range(0, query.shape[-2], block_size):
            q = query[..., i:i + block_size, :] * scale
            lse = torch.full(q.shape[:-1] + (1,), -float('inf'), dtype=q.dtype)
            acc = torch.zeros(q.shape[:-1] + (value.shape[-1],), dtype=q.dtype)
            for j in range(0, key.shape[-2], block_size):
                if causal and j >= i + q.shape[-2]:
                    break
                s = q @ key[..., j:j + block_size, :].transpose(-1, -2)
                if causal:
                    future = torch.arange(j, j + s.shape[-1]) > torch.arange(i, i + s.shape[-2]).unsqueeze(1)
                    s = torch.where(future, torch.tensor(-float('inf'), dtype=s.dtype), s)
                lse_new = torch.logaddexp(lse, torch.logsumexp(s, dim=-1, keepdim=True))
                acc = acc * torch.exp(lse - lse_new) + torch.exp(s - lse_new) @ value[..., j:j + block_size, :]
                lse = lse_new
            outs.append(acc)
        return torch.cat(outs, dim=-2)
    """),
    "GroupedQueryAttention": gqa("""
        B, N, _ = x.shape
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        group = self.num_heads // self.num_kv_heads
        heads, weights = [], []
        for i in range(self.num_heads):
            c = i // group
            qi = q[..., i * self.d_head:(i + 1) * self.d_head]
            kc = k[..., c * self.d_head:(c + 1) * self.d_head]
            vc = v[..., c * self.d_head:(c + 1) * self.d_head]
            m = None if mask is None else mask.expand(B, self.num_heads, N, N)[:, i]
            o, w = attention(qi, kc, vc, m)
            heads.append(o)
            weights.append(w)
        return self.W_o(torch.cat(heads, dim=-1)), torch.stack(weights, dim=1)
    """),
}

# 3. In place and preallocated: isin for the globals, chunked causal linear attention with another
#    chunk size, an output buffer filled block by block with in-place updates, head indexing in GQA.
INPLACE = {
    "local_attention_mask": fn("local_attention_mask", """
        idx = torch.arange(n)
        mask = (idx.unsqueeze(0) - idx.unsqueeze(1)).abs() <= radius
        g = torch.isin(idx, torch.tensor(list(global_tokens), dtype=torch.long))
        mask = mask | g.unsqueeze(0) | g.unsqueeze(1)
        return mask & (idx.unsqueeze(0) <= idx.unsqueeze(1)) if causal else mask
    """),
    "linformer_attention": fn("linformer_attention", """
        kp, vp = E @ key, F @ value
        w = torch.softmax((query @ kp.mT) * query.shape[-1] ** -0.5, dim=-1)
        return w @ vp, w
    """),
    "linear_attention": fn("linear_attention", """
        q, k = torch.nn.functional.elu(query) + 1, torch.nn.functional.elu(key) + 1
        if not causal:
            return (q @ (k.mT @ value)) / (q @ k.sum(-2).unsqueeze(-1) + eps)
        C = 37
        out = torch.empty(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
        S = torch.zeros(*query.shape[:-2], q.shape[-1], value.shape[-1], dtype=query.dtype)
        z = torch.zeros(*query.shape[:-2], q.shape[-1], 1, dtype=query.dtype)
        for c in range(0, q.shape[-2], C):
            qc, kc, vc = q[..., c:c + C, :], k[..., c:c + C, :], value[..., c:c + C, :]
            a = torch.tril(qc @ kc.mT)
            out[..., c:c + C, :] = (qc @ S + a @ vc) / (qc @ z + a.sum(-1, keepdim=True) + eps)
            S += kc.mT @ vc
            z += kc.sum(-2).unsqueeze(-1)
        return out
    """),
    "performer_features": fn("performer_features", """
        out = x @ omega
        out -= x.pow(2).sum(-1, keepdim=True).div(2)
        return out.exp_().div_(math.sqrt(omega.size(1)))
    """),
    "lsh_hash": fn("lsh_hash", """
        p = torch.matmul(x, rotations)
        buckets = p.argmax(-1)
        neg = (-p).argmax(-1) + p.shape[-1]
        return torch.where((-p).amax(-1) > p.amax(-1), neg, buckets)
    """),
    "flash_attention": fn("flash_attention", """
        n_q, n_k = query.shape[-2], key.shape[-2]
        out = torch.empty(*query.shape[:-1], value.shape[-1], dtype=query.dtype)
        q_all = query / math.sqrt(query.shape[-1])
        for i in range(0, n_q, block_size):
            q = q_all[..., i:i + block_size, :]
            m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
            l = torch.zeros_like(m)
            acc = torch.zeros(*q.shape[:-1], value.shape[-1], dtype=q.dtype)
            end = min(n_k, i + block_size) if causal else n_k
            for j in range(0, end, block_size):
                s = q @ key[..., j:j + block_size, :].transpose(-1, -2)
                if causal and j + block_size > i:
                    s.masked_fill_(torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).triu(i - j + 1), -math.inf)
                m_new = torch.maximum(m, s.amax(-1, keepdim=True))
                s.sub_(m_new).exp_()
                alpha = (m - m_new).exp_()
                l.mul_(alpha).add_(s.sum(-1, keepdim=True))
                acc.mul_(alpha).add_(s @ value[..., j:j + block_size, :])
                m = m_new
            out[..., i:i + block_size, :] = acc / l
        return out
    """),
    "GroupedQueryAttention": gqa("""
        B, N, _ = x.shape
        q = self.W_q(x).reshape(B, N, self.num_heads, self.d_head).permute(0, 2, 1, 3)
        k = self.W_k(x).reshape(B, N, self.num_kv_heads, self.d_head).permute(0, 2, 1, 3)
        v = self.W_v(x).reshape(B, N, self.num_kv_heads, self.d_head).permute(0, 2, 1, 3)
        kv_of = torch.arange(self.num_heads) // (self.num_heads // self.num_kv_heads)
        out, w = attention(q, k[:, kv_of], v[:, kv_of], mask)
        return self.W_o(out.permute(0, 2, 1, 3).flatten(2)), w
    """),
}

CORRECT = {
    "reference": sub(),
    "published_style": sub(PUBLISHED),
    "loops_and_log_space": sub(LOOPS),
    "in_place_and_preallocated": sub(INPLACE, prepend=["def helper_unused(x):\n    return x\n"]),
}

# ------------------------------------------------------------------ common mistakes
FLASH_BODY = """
    scale = 1 / math.sqrt(query.shape[-1])
    outs = []
    for i in range(0, query.shape[-2], block_size):
        q = query[..., i:i + block_size, :] * scale
        m = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(*q.shape[:-1], value.shape[-1], dtype=q.dtype)
        stop = min(key.shape[-2], i + q.shape[-2]) if causal else key.shape[-2]
        for j in range(0, stop, block_size):
            s = q @ key[..., j:j + block_size, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > torch.arange(i, i + s.shape[-2])[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = L_UPDATE + p.sum(-1, keepdim=True)
            acc = alpha * acc + p @ value[..., j:j + block_size, :]
            m = m_new
        outs.append(acc / l)
    return torch.cat(outs, dim=-2)
"""

MISTAKES = {
    "local_causal_before_globals": (sub({"local_attention_mask": fn("local_attention_mask", """
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = (i - j).abs() <= radius
        if causal:
            mask = mask & (j <= i)
        for g in global_tokens:
            mask[g, :] = True
            mask[:, g] = True
        return mask
    """)}), {"test_local_attention_mask_global": "apply the causal rule last"}),
    "local_strict_window": (sub({"local_attention_mask": fn("local_attention_mask", """
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = (i - j).abs() < radius
        mask[list(global_tokens), :] = True
        mask[:, list(global_tokens)] = True
        return mask & (j <= i) if causal else mask
    """)}), {t: "use <=, not <" for t in LOCAL_TESTS}),
    # Projected along the features: only runs when N_k == d_k; elsewhere the shapes do not fit.
    "linformer_wrong_projection_side": (sub({"linformer_attention": fn("linformer_attention", """
        k_proj = (key @ E.transpose(-2, -1)).transpose(-2, -1)
        v_proj = (value @ F.transpose(-2, -1)).transpose(-2, -1)
        w = torch.softmax(query @ k_proj.transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
        return w @ v_proj, w
    """)}), {t: "projected along the features" for t in LINFORMER_TESTS}),
    "linformer_E_F_swapped": (sub({"linformer_attention": fn("linformer_attention", """
        w = torch.softmax(query @ (F @ key).transpose(-2, -1) / math.sqrt(query.shape[-1]), dim=-1)
        return w @ (E @ value), w
    """)}), {t: "E and F swapped" for t in LINFORMER_TESTS}),
    "linear_missing_plus_one": (sub({"linear_attention": fn("linear_attention", """
        q, k = torch.nn.functional.elu(query), torch.nn.functional.elu(key)
        if causal:
            a = (q @ k.transpose(-2, -1)).tril()
            return a @ value / (a.sum(-1, keepdim=True) + eps)
        return (q @ (k.transpose(-2, -1) @ value)) / (q @ k.sum(-2).unsqueeze(-1) + eps)
    """)}), {"test_linear_attention_values": "missing its +1", "test_linear_attention_causal": "missing its +1",
             "test_linear_attention_memory": "from the reference"}),
    "linear_causal_includes_future": (sub({"linear_attention": fn("linear_attention", """
        q, k = torch.nn.functional.elu(query) + 1, torch.nn.functional.elu(key) + 1
        return (q @ (k.transpose(-2, -1) @ value)) / (q @ k.sum(-2).unsqueeze(-1) + eps)
    """)}), {"test_linear_attention_causal": "future keys", "test_linear_attention_memory": "from the reference"}),
    "performer_missing_norm_term": (sub({"performer_features": fn("performer_features", """
        return torch.exp(x @ omega) / math.sqrt(omega.shape[-1])
    """)}), {"test_performer_features_values": "missing -|x|^2/2"}),
    "lsh_buckets_from_x_R_only": (sub({"lsh_hash": fn("lsh_hash", """
        return (x @ rotations).argmax(dim=-1)
    """)}), {"test_lsh_hash_values": "only x @ R"}),
    "flash_running_sum_not_rescaled": (sub({"flash_attention": fn("flash_attention", FLASH_BODY.replace("L_UPDATE", "l"))}),
                                       {"test_flash_attention_values": "not rescale the running sum",
                                        "test_flash_attention_causal": "not rescale the running sum",
                                        "test_flash_attention_stability": "not rescale the running sum",
                                        "test_flash_attention_memory": "from the reference"}),
    "gqa_wrong_kv_head": (sub({"GroupedQueryAttention": gqa_with(
        "k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)",
        "k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)")}), {"test_GroupedQueryAttention_values": "wrong key/value head", "test_GroupedQueryAttention_mask": "wrong key/value head",
             "test_GroupedQueryAttention_gradients": "wrong key/value head"}),
    # Correct but quadratic: every value right, only the memory rules fail.
    "flash_quadratic": (sub({"flash_attention": fn("flash_attention", """
        scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
        if causal:
            n = scores.shape[-1]
            scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float('-inf'))
        return torch.softmax(scores, dim=-1) @ value
    """)}), {"test_flash_attention_memory": "built an N_q x N_k tensor"}),
    "linear_quadratic": (sub({"linear_attention": fn("linear_attention", """
        a = (torch.nn.functional.elu(query) + 1) @ (torch.nn.functional.elu(key) + 1).transpose(-2, -1)
        if causal:
            a = a.tril()
        return a @ value / (a.sum(-1, keepdim=True) + eps)
    """)}), {"test_linear_attention_memory": "built an N_q x N_k tensor"}),
    "flash_builtin_sdpa": (sub({"flash_attention": fn("flash_attention", """
        return F.scaled_dot_product_attention(query, key, value, is_causal=causal)
    """)}), {t: "from scratch" for t in FLASH_TESTS}),
    "gqa_builtin_enable_gqa": (sub({"GroupedQueryAttention": gqa_with(
        "    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)\n"
        "    scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)\n"
        "    if mask is not None:\n"
        '        scores = scores.masked_fill(~mask, float("-inf"))\n'
        "    w = scores.softmax(-1)\n"
        "    return self.W_o((w @ v).transpose(1, 2).reshape(B, N, -1)), w",
        "    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)\n"
        "    _, w = attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask)\n"
        "    return self.W_o(out.transpose(1, 2).reshape(B, N, -1)), w")}), {t: "from scratch" for t in GQA_TESTS}),
}

# ------------------------------------------------------------------ independence
# More mistakes, written as a learner would: the causal triangle without its diagonal, the diagonal
# block of FlashAttention left unmasked, GQA scaled by the model width, and a mask read the wrong way.
MISTAKES.update({
    "local_causal_hides_diagonal": (sub({"local_attention_mask": fn("local_attention_mask", """
        mask = torch.ones(n, n).triu(-radius).tril(radius).bool()
        for g in global_tokens:
            mask[g, :] = True
            mask[:, g] = True
        if causal:
            mask &= torch.ones(n, n, dtype=torch.bool).tril(-1)
        return mask
    """)}), {"test_local_attention_mask_causal": "hides the diagonal",
             "test_local_attention_mask_global": "hides the diagonal"}),
    "flash_diagonal_block_unmasked": (sub({"flash_attention": fn("flash_attention", FLASH_BODY.replace(
        "L_UPDATE", "alpha * l").replace("            if causal:\n                s = s.masked_fill(", "            if False:\n                s = s.masked_fill("))}),
        {"test_flash_attention_causal": "block on the diagonal needs a mask",
         "test_flash_attention_stability": "block on the diagonal needs a mask",
         "test_flash_attention_memory": "from the reference"}),
    "gqa_scaled_by_d_model": (sub({"GroupedQueryAttention": gqa_with("math.sqrt(self.d_head)", "math.sqrt(self.num_heads * self.d_head)")}), {t: "1/sqrt(d_model)" for t in GQA_TESTS}),
    "gqa_mask_inverted": (sub({"GroupedQueryAttention": gqa_with('masked_fill(~mask, float("-inf"))', "masked_fill(mask, -1e9)")}), {"test_GroupedQueryAttention_mask": "mask polarity inverted"}),
})

INDEPENDENT = {
    "looping_lsh_hash": (sub({"lsh_hash": fn("lsh_hash", "while True:\n    pass")}),
                         {"test_lsh_hash_values": "longer than"}),
    "kernel_exits_before_gqa": (sub(answers={"GroupedQueryAttention": "import os\nos._exit(0)\n"}),
                                {t: "did not run" for t in GQA_TESTS}),
    "stub_flash_only": (sub({"flash_attention": fn("flash_attention", "raise NotImplementedError()")}),
                        {t: "not implemented yet" for t in FLASH_TESTS}),
}


def alone(mistake: str, exercise: str) -> tuple:
    """A mistake's answer with every other exercise left as its stub: its own losses, plus the stubs'."""
    notebook, losses = MISTAKES[mistake]
    answer = next(c.source for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                  == exercise)
    return others_stubbed(CHAPTER, {exercise: answer}, losses)


INDEPENDENT.update({
    "alone:local_causal_hides_diagonal": alone("local_causal_hides_diagonal", "local_attention_mask"),
    "alone:gqa_mask_inverted": alone("gqa_mask_inverted", "GroupedQueryAttention"),
    "alone:linformer_E_F_swapped": alone("linformer_E_F_swapped", "linformer_attention"),
})

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
# After every stub (tests/catalog.py: tampered): built-ins under the exercise names.
TAMPERING_AFTER_STUBS = {
    "builtins_after_stubs": ["def flash_attention(query, key, value, block_size=64, causal=False):\n"
                             "    return F.scaled_dot_product_attention(query, key, value, is_causal=causal)\n"],
}

CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER),
                             **{k: tampered(CHAPTER, after_stubs=v) for k, v in TAMPERING_AFTER_STUBS.items()}},
                  kernel_only={"kernel_exits_before_gqa", "looping_lsh_hash"})


class TestCatalog(CatalogTests):
    catalog = CATALOG
