"""Reference solution (instructor-only) for chapter 06_efficient_attention.

generated from course/06_efficient_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def attention(query, key, value, mask=None):
    """Given (Chapter 2): softmax(query @ key^T / sqrt(d_k)) @ value, the N_q x N_k way.

    query (..., N_q, d_k), key (..., N_k, d_k), value (..., N_k, d_v); mask: bool,
    broadcastable to (..., N_q, N_k), True = may attend.
    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).
    """
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., N_q, N_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


import gc
from pathlib import Path


def _status_kib(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(field)


def release_free_memory():
    """Hand freed memory back to the operating system (a given cell below does it on Linux)."""


def peak_memory(fn):
    """(result of fn(), peak resident memory above the starting point, in MiB)."""
    gc.collect()
    release_free_memory()
    try:
        Path("/proc/self/clear_refs").write_text("5")      # reset VmHWM to the current RSS
        before = _status_kib("VmRSS")
    except OSError:
        return fn(), float("nan")
    result = fn()
    return result, (_status_kib("VmHWM") - before) / 1024


def blocked_logsumexp(query, key, block_size=64, causal=False):
    """Given: log sum_j exp(q_i . k_j / sqrt(d)) for every query, block by block: (..., N_q, 1)."""
    *lead, n_q, d = query.shape
    n_k = key.size(-2)
    q = query.reshape(-1, n_q, d) * (1 / math.sqrt(d))
    k_t = key.reshape(-1, n_k, d).transpose(1, 2)
    out = []
    for i0 in range(0, n_q, block_size):
        q_i = q[:, i0:i0 + block_size]
        m = torch.full((q_i.size(0), q_i.size(1), 1), -math.inf, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)
        for j0 in range(0, min(n_k, i0 + q_i.size(1)) if causal else n_k, block_size):
            s = q_i @ k_t[:, :, j0:j0 + block_size]
            if causal and j0 + s.size(-1) - 1 > i0:
                s = s.masked_fill(torch.arange(j0, j0 + s.size(-1), device=q.device)[None, :]
                                  > torch.arange(i0, i0 + s.size(-2), device=q.device)[:, None], -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            l = l * torch.exp(m - m_new) + s.sub_(m_new).exp_().sum(dim=-1, keepdim=True)   # s in place
            m = m_new
        out.append(m + torch.log(l))
    return torch.cat(out, dim=1).reshape(*lead, n_q, 1)


class FlashAttentionFunction(torch.autograd.Function):
    """Given: flash_attention's forward, and a backward pass that recomputes every block."""

    @staticmethod
    def forward(ctx, query, key, value, block_size, causal):
        with torch.no_grad():
            out = flash_attention(query, key, value, block_size, causal)
            lse = blocked_logsumexp(query, key, block_size, causal)   # (..., N_q, 1)
        ctx.save_for_backward(query, key, value, out, lse)           # O(N d): no N x N tensor
        ctx.block_size, ctx.causal = block_size, causal
        return out

    @staticmethod
    def backward(ctx, d_out):
        query, key, value, out, lse = ctx.saved_tensors
        bs, causal = ctx.block_size, ctx.causal
        *lead, n_q, d = query.shape
        n_k, d_v = value.shape[-2:]
        scale = 1 / math.sqrt(d)
        q = query.reshape(-1, n_q, d) * scale
        k, v = key.reshape(-1, n_k, d), value.reshape(-1, n_k, d_v)
        d_o = d_out.reshape(-1, n_q, d_v).to(q.dtype)
        lse = lse.reshape(-1, n_q, 1)
        delta = (d_o * out.reshape(-1, n_q, d_v)).sum(dim=-1, keepdim=True)      # D_i, (B, N_q, 1)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for j0 in range(0, n_k, bs):                                 # key blocks outside (as in FlashAttention-1)
            k_j, v_j = k[:, j0:j0 + bs], v[:, j0:j0 + bs]
            dk_j, dv_j = dk[:, j0:j0 + bs], dv[:, j0:j0 + bs]          # views: updated in place
            for i0 in range((j0 // bs) * bs if causal else 0, n_q, bs):
                q_i, do_i = q[:, i0:i0 + bs], d_o[:, i0:i0 + bs]
                s = torch.bmm(q_i, k_j.transpose(1, 2))              # recomputed (B, B_r, B_c)
                if causal and j0 + s.size(-1) - 1 > i0:
                    s.masked_fill_(torch.arange(j0, j0 + s.size(-1), device=q.device)[None, :]
                                   > torch.arange(i0, i0 + s.size(-2), device=q.device)[:, None], -math.inf)
                p = s.sub_(lse[:, i0:i0 + bs]).exp_()                # P_ij, recomputed in place
                dv_j.baddbmm_(p.transpose(1, 2), do_i)
                dp = torch.bmm(do_i, v_j.transpose(1, 2))
                ds = p.mul_(dp.sub_(delta[:, i0:i0 + bs]))           # dS_ij (scale applied at the end)
                dq[:, i0:i0 + bs].baddbmm_(ds, k_j)
                dk_j.baddbmm_(ds.transpose(1, 2), q_i)
        return (dq.mul_(scale).reshape(query.shape), dk.reshape(key.shape), dv.reshape(value.shape), None, None)


def flash_attention_trainable(query, key, value, block_size=64, causal=False):
    """Given: flash_attention with the recomputing backward pass."""
    return FlashAttentionFunction.apply(query, key, value, block_size, causal)


def local_attention_mask(n, radius, causal=False, global_tokens=()):
    """Sliding-window attention mask with optional global tokens (Longformer).

    Args:
        n: sequence length (int).
        radius: window radius r >= 0 (int): query i may attend to key j when |i - j| <= r.
        causal: if True, additionally forbid every key after the query (j > i),
            global tokens included.
        global_tokens: iterable of int positions in [0, n) (tuple or list, possibly
            empty); a global token attends to every key and every query attends to it.

    Returns:
        bool tensor of shape (n, n), True where query i (row) may attend to key j (column).
    """
    i = torch.arange(n)[:, None]                                  # (n, 1) queries
    j = torch.arange(n)[None, :]                                  # (1, n) keys
    mask = (i - j).abs() <= radius                                # (n, n) the window
    is_global = torch.zeros(n, dtype=torch.bool)
    is_global[torch.as_tensor(list(global_tokens), dtype=torch.long)] = True
    mask = mask | is_global[:, None] | is_global[None, :]         # global rows and columns
    if causal:
        mask = mask & (j <= i)                                    # last: nobody sees the future
    return mask


def linformer_attention(query, key, value, E, F):
    """Linformer: attention over keys and values projected along the sequence.

    Args:
        query: (..., N_q, d_k) float tensor.
        key:   (..., N_k, d_k).
        value: (..., N_k, d_v).
        E, F:  (k, N_k) projections of the same dtype: projected keys E @ key
               (..., k, d_k), projected values F @ value (..., k, d_v).
               Note: F is this argument here, not torch.nn.functional.

    Returns:
        (output (..., N_q, d_v), weights (..., N_q, k)): scaled dot-product
        attention of the queries over the k projected keys and values, scores
        scaled by 1/sqrt(d_k); weights rows sum to 1.
    """
    k_proj = E @ key                                                # (..., k, d_k)
    v_proj = F @ value                                              # (..., k, d_v)
    scores = query @ k_proj.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., N_q, k)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v_proj, weights


def linear_attention(query, key, value, causal=False, eps=1e-6):
    """Linear attention (Katharopoulos et al., 2020) with phi(x) = elu(x) + 1.

    Args:
        query: (..., N_q, d) float tensor.
        key:   (..., N_k, d).
        value: (..., N_k, d_v).
        causal: if True (then N_q == N_k), query i uses only keys j <= i.
        eps: added to the denominator (a float >= 0).

    Returns:
        output (..., N_q, d_v) only (no weights), with
        out_i = phi(q_i) S / (phi(q_i) . z + eps), S = sum_j phi(k_j)^T v_j (d, d_v),
        z = sum_j phi(k_j) (d,), the sums over all j, or over j <= i when causal.
        Must not build any N_q x N_k tensor: for causal, carry S and z from chunk
        to chunk (any chunk size you like).
    """
    q, k = F.elu(query) + 1, F.elu(key) + 1                        # (..., N, d) positive features
    if not causal:
        S = k.transpose(-2, -1) @ value                             # (..., d, d_v)
        z = k.sum(dim=-2, keepdim=True)                             # (..., 1, d)
        return (q @ S) / ((q * z).sum(-1, keepdim=True) + eps)      # (..., N_q, d_v)
    n, chunk = q.size(-2), 64
    S = query.new_zeros(*q.shape[:-2], q.size(-1), value.size(-1))  # (..., d, d_v) running state
    z = query.new_zeros(*q.shape[:-2], 1, q.size(-1))               # (..., 1, d)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=query.device).tril()
    outs = []
    for c0 in range(0, n, chunk):
        qc, kc, vc = q[..., c0:c0 + chunk, :], k[..., c0:c0 + chunk, :], value[..., c0:c0 + chunk, :]
        c = qc.size(-2)
        a = (qc @ kc.transpose(-2, -1)).masked_fill(~lower[:c, :c], 0)   # (..., C, C) inside the chunk
        num = qc @ S + a @ vc                                       # earlier chunks + this chunk
        den = (qc * z).sum(-1, keepdim=True) + a.sum(-1, keepdim=True)
        outs.append(num / (den + eps))
        S = S + kc.transpose(-2, -1) @ vc
        z = z + kc.sum(dim=-2, keepdim=True)
    return torch.cat(outs, dim=-2)


def performer_features(x, omega):
    """FAVOR+ positive random features (Choromanski et al., 2021).

    Args:
        x: (..., d) float tensor.
        omega: (d, m) float tensor of random directions (same dtype as x).

    Returns:
        (..., m) tensor phi(x) = exp(x @ omega - |x|^2 / 2) / sqrt(m), where |x|^2
        is the squared Euclidean norm of x over its last dimension.
    """
    m = omega.size(-1)
    sq_norm = (x * x).sum(dim=-1, keepdim=True)                    # (..., 1)
    return torch.exp(x @ omega - sq_norm / 2) / math.sqrt(m)       # (..., m)


def lsh_hash(x, rotations):
    """Reformer's angular LSH bucket of every vector.

    Args:
        x: (..., N, d) float tensor.
        rotations: (d, b/2) float tensor R (same dtype as x), b the number of buckets (even).

    Returns:
        (..., N) long tensor of buckets in [0, b): argmax over the last dimension of
        cat([x @ R, -x @ R], dim=-1) (ties: not graded).
    """
    projected = x @ rotations                                       # (..., N, b/2)
    return torch.cat([projected, -projected], dim=-1).argmax(dim=-1)


def flash_attention(query, key, value, block_size=64, causal=False):
    """Exact scaled dot-product attention computed block by block (FlashAttention).

    Args:
        query: (..., N_q, d_k) float tensor.
        key:   (..., N_k, d_k).
        value: (..., N_k, d_v).
        block_size: number of queries and of keys per block (int >= 1); the last
            blocks may be shorter.
        causal: if True (then N_q == N_k), query i attends to keys j <= i.

    Returns:
        output (..., N_q, d_v) only: softmax(Q K^T / sqrt(d_k)) V, equal (to float
        rounding) to scaled_dot_product_attention, computed with an online softmax
        (running maximum, running sum, running output, rescaled block by block).
        Must never build a tensor with N_q * N_k elements when N_q, N_k > block_size.
    """
    *lead, n_q, d = query.shape
    n_k, d_v = key.size(-2), value.size(-1)
    q = query.reshape(-1, n_q, d) * (1 / math.sqrt(d))              # (B, N_q, d), scale folded in
    k_t = key.reshape(-1, n_k, d).transpose(1, 2)                   # (B, d, N_k)
    v = value.reshape(-1, n_k, d_v)                                 # (B, N_k, d_v)
    blocks = []
    for i0 in range(0, n_q, block_size):
        q_i = q[:, i0:i0 + block_size]                              # (B, B_r, d)
        m = torch.full((q_i.size(0), q_i.size(1), 1), -math.inf, dtype=q.dtype, device=q.device)
        l = torch.zeros_like(m)                                     # running sum      (B, B_r, 1)
        acc = q.new_zeros(q_i.size(0), q_i.size(1), d_v)            # running output   (B, B_r, d_v)
        stop = min(n_k, i0 + q_i.size(1)) if causal else n_k        # later key blocks: all future
        for j0 in range(0, stop, block_size):
            s = torch.bmm(q_i, k_t[:, :, j0:j0 + block_size])       # (B, B_r, B_c)
            if causal and j0 + s.size(-1) - 1 > i0:                 # a block on the diagonal
                rows = torch.arange(i0, i0 + s.size(-2), device=q.device)[:, None]
                cols = torch.arange(j0, j0 + s.size(-1), device=q.device)[None, :]
                s.masked_fill_(cols > rows, -math.inf)
            # The maximum only keeps exp() in range; the result does not depend on it, so it
            # needs no gradient, and the block can then be turned into p in place.
            m_new = torch.maximum(m, s.detach().amax(dim=-1, keepdim=True))
            p = s.sub_(m_new).exp_()                                # (B, B_r, B_c)
            alpha = torch.exp(m - m_new)                            # rescales the old sums
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = torch.baddbmm(alpha * acc, p, v[:, j0:j0 + block_size])   # alpha * acc + p @ v_j
            m = m_new
        blocks.append(acc / l)
    return torch.cat(blocks, dim=1).reshape(*lead, n_q, d_v)


class GroupedQueryAttention(nn.Module):
    """Grouped-query self-attention (Ainslie et al., 2023)."""

    def __init__(self, d_model, num_heads, num_kv_heads):
        super().__init__()
        assert d_model % num_heads == 0 and num_heads % num_kv_heads == 0, \
            "d_model must be divisible by num_heads, and num_heads by num_kv_heads"
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_head = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, num_kv_heads * self.d_head)
        self.W_v = nn.Linear(d_model, num_kv_heads * self.d_head)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        """Self-attention with num_heads query heads sharing num_kv_heads key/value heads.

        Args:
            x: (B, N, d_model) float tensor.
            mask: optional bool tensor broadcastable to (B, num_heads, N, N),
                True = may attend.

        Query head i uses features i*d_head:(i+1)*d_head of self.W_q(x); key/value
        head c uses features c*d_head:(c+1)*d_head of self.W_k(x) and self.W_v(x);
        query head i attends with key/value head i // (num_heads // num_kv_heads).
        Scores scaled by 1/sqrt(d_head); heads concatenated in order, then self.W_o.

        Returns:
            (output (B, N, d_model), weights (B, num_heads, N, N)).
        """
        B, N, _ = x.shape
        q = self.W_q(x).view(B, N, self.num_heads, self.d_head).transpose(1, 2)     # (B, h, N, d_h)
        k = self.W_k(x).view(B, N, self.num_kv_heads, self.d_head).transpose(1, 2)  # (B, h_kv, N, d_h)
        v = self.W_v(x).view(B, N, self.num_kv_heads, self.d_head).transpose(1, 2)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)                                       # (B, h, N, d_h)
        v = v.repeat_interleave(group, dim=1)
        out, weights = attention(q, k, v, mask)                                     # (B, h, N, d_h)
        return self.W_o(out.transpose(1, 2).reshape(B, N, -1)), weights


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\ndef attention(query, key, value, mask=None):\n    """Given (Chapter 2): softmax(query @ key^T / sqrt(d_k)) @ value, the N_q x N_k way.\n\n    query (..., N_q, d_k), key (..., N_k, d_k), value (..., N_k, d_v); mask: bool,\n    broadcastable to (..., N_q, N_k), True = may attend.\n    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).\n    """\n    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., N_q, N_k)\n    if mask is not None:\n        scores = scores.masked_fill(~mask, float("-inf"))\n    weights = torch.softmax(scores, dim=-1)\n    return weights @ value, weights\nimport gc\nfrom pathlib import Path\n\n\ndef _status_kib(field):\n    for line in Path("/proc/self/status").read_text().splitlines():\n        if line.startswith(field + ":"):\n            return int(line.split()[1])\n    raise OSError(field)\n\n\ndef release_free_memory():\n    """Hand freed memory back to the operating system (a given cell below does it on Linux)."""\n\n\ndef peak_memory(fn):\n    """(result of fn(), peak resident memory above the starting point, in MiB)."""\n    gc.collect()\n    release_free_memory()\n    try:\n        Path("/proc/self/clear_refs").write_text("5")      # reset VmHWM to the current RSS\n        before = _status_kib("VmRSS")\n    except OSError:\n        return fn(), float("nan")\n    result = fn()\n    return result, (_status_kib("VmHWM") - before) / 1024\ndef blocked_logsumexp(query, key, block_size=64, causal=False):\n    """Given: log sum_j exp(q_i . k_j / sqrt(d)) for every query, block by block: (..., N_q, 1)."""\n    *lead, n_q, d = query.shape\n    n_k = key.size(-2)\n    q = query.reshape(-1, n_q, d) * (1 / math.sqrt(d))\n    k_t = key.reshape(-1, n_k, d).transpose(1, 2)\n    out = []\n    for i0 in range(0, n_q, block_size):\n        q_i = q[:, i0:i0 + block_size]\n        m = torch.full((q_i.size(0), q_i.size(1), 1), -math.inf, dtype=q.dtype, device=q.device)\n        l = torch.zeros_like(m)\n        for j0 in range(0, min(n_k, i0 + q_i.size(1)) if causal else n_k, block_size):\n            s = q_i @ k_t[:, :, j0:j0 + block_size]\n            if causal and j0 + s.size(-1) - 1 > i0:\n                s = s.masked_fill(torch.arange(j0, j0 + s.size(-1), device=q.device)[None, :]\n                                  > torch.arange(i0, i0 + s.size(-2), device=q.device)[:, None], -math.inf)\n            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))\n            l = l * torch.exp(m - m_new) + s.sub_(m_new).exp_().sum(dim=-1, keepdim=True)   # s in place\n            m = m_new\n        out.append(m + torch.log(l))\n    return torch.cat(out, dim=1).reshape(*lead, n_q, 1)\n\n\nclass FlashAttentionFunction(torch.autograd.Function):\n    """Given: flash_attention\'s forward, and a backward pass that recomputes every block."""\n\n    @staticmethod\n    def forward(ctx, query, key, value, block_size, causal):\n        with torch.no_grad():\n            out = flash_attention(query, key, value, block_size, causal)\n            lse = blocked_logsumexp(query, key, block_size, causal)   # (..., N_q, 1)\n        ctx.save_for_backward(query, key, value, out, lse)           # O(N d): no N x N tensor\n        ctx.block_size, ctx.causal = block_size, causal\n        return out\n\n    @staticmethod\n    def backward(ctx, d_out):\n        query, key, value, out, lse = ctx.saved_tensors\n        bs, causal = ctx.block_size, ctx.causal\n        *lead, n_q, d = query.shape\n        n_k, d_v = value.shape[-2:]\n        scale = 1 / math.sqrt(d)\n        q = query.reshape(-1, n_q, d) * scale\n        k, v = key.reshape(-1, n_k, d), value.reshape(-1, n_k, d_v)\n        d_o = d_out.reshape(-1, n_q, d_v).to(q.dtype)\n        lse = lse.reshape(-1, n_q, 1)\n        delta = (d_o * out.reshape(-1, n_q, d_v)).sum(dim=-1, keepdim=True)      # D_i, (B, N_q, 1)\n        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n        for j0 in range(0, n_k, bs):                                 # key blocks outside (as in FlashAttention-1)\n            k_j, v_j = k[:, j0:j0 + bs], v[:, j0:j0 + bs]\n            dk_j, dv_j = dk[:, j0:j0 + bs], dv[:, j0:j0 + bs]          # views: updated in place\n            for i0 in range((j0 // bs) * bs if causal else 0, n_q, bs):\n                q_i, do_i = q[:, i0:i0 + bs], d_o[:, i0:i0 + bs]\n                s = torch.bmm(q_i, k_j.transpose(1, 2))              # recomputed (B, B_r, B_c)\n                if causal and j0 + s.size(-1) - 1 > i0:\n                    s.masked_fill_(torch.arange(j0, j0 + s.size(-1), device=q.device)[None, :]\n                                   > torch.arange(i0, i0 + s.size(-2), device=q.device)[:, None], -math.inf)\n                p = s.sub_(lse[:, i0:i0 + bs]).exp_()                # P_ij, recomputed in place\n                dv_j.baddbmm_(p.transpose(1, 2), do_i)\n                dp = torch.bmm(do_i, v_j.transpose(1, 2))\n                ds = p.mul_(dp.sub_(delta[:, i0:i0 + bs]))           # dS_ij (scale applied at the end)\n                dq[:, i0:i0 + bs].baddbmm_(ds, k_j)\n                dk_j.baddbmm_(ds.transpose(1, 2), q_i)\n        return (dq.mul_(scale).reshape(query.shape), dk.reshape(key.shape), dv.reshape(value.shape), None, None)\n\n\ndef flash_attention_trainable(query, key, value, block_size=64, causal=False):\n    """Given: flash_attention with the recomputing backward pass."""\n    return FlashAttentionFunction.apply(query, key, value, block_size, causal)'
