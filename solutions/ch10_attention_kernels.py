"""Reference solution (instructor-only) for chapter 10_attention_kernels.

generated from course/10_attention_kernels.py by `make generate`; do not edit.
"""



import math
import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton's interpreter runs the kernels on the CPU, with numpy
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton
import triton.language as tl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def softmax_of_columns(x, start, stop):
    """Given, for the grader: softmax of the column slice x[:, start:stop], a view whose rows are
    x.stride(0) elements apart (a test's inputs reach your kernel contiguous otherwise)."""
    return softmax(x[:, start:stop])


def naive_attention(q, k, v, causal=False, scale=None):
    """softmax(scale q k^T) v and the scores' logsumexp, in float32, with the (N, N) scores materialised."""
    N, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (q.float() @ k.float().transpose(-1, -2)) * scale                  # (B, H, N, N)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)


def naive_attention_gradients(q, k, v, do, causal=False, scale=None):
    """(o, lse, dq, dk, dv) of naive attention in float32: the forward's results and autograd's gradients."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    o, lse = naive_attention(q, k, v, causal=causal, scale=scale)
    o.backward(do.float())
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def saved_numels(q, k, v, causal=False, scale=None):
    """Given, for the grader: the sizes (numel) of the tensors flash_attention saves for its backward, sorted."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, causal, scale)
    return torch.tensor(sorted(t.numel() for t in o.grad_fn.saved_tensors))


@triton.jit
def softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    # Program r of an (R,) grid: row r of x into row r of y. A suggested signature: change it as
    # you like, with the launch in the wrapper.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))                   # the largest is exp(0) = 1: no overflow
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


def softmax(x):
    """Row-wise softmax computed by a Triton kernel, one program per row.

    x: (R, C) float32 or float16, 1 <= C <= 4096, x.stride(1) == 1; rows may be strided
    (x.stride(0) >= C, a column slice of a wider tensor).
    Returns a new (R, C) tensor in x's dtype: softmax over each row, computed in float32
    with the row's maximum subtracted, so that entries of +-1e4 do not overflow. The
    wrapper only allocates, computes the grid and launches.
    """
    R, C = x.shape
    y = torch.empty((R, C), dtype=x.dtype, device=x.device)
    softmax_kernel[(R,)](x, y, x.stride(0), y.stride(0), C, BLOCK=triton.next_power_of_2(C))
    return y


@triton.jit
def online_softmax_kernel(x_ptr, m_ptr, l_ptr, n_rows, n_cols, n_blocks,
                          BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    # Program i of a (ceil(R / BLOCK_R),) grid: rows i * BLOCK_R to i * BLOCK_R + BLOCK_R - 1, one pass over
    # their columns in blocks of BLOCK. A suggested signature: change it as you like.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    real_rows = rows < n_rows
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)          # running maximum of each row
    l = tl.zeros((BLOCK_R,), tl.float32)                         # running sum, against m
    for b in range(0, n_blocks):
        cols = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :],
                    mask=real_rows[:, None] & (cols[None, :] < n_cols), other=0.0)
        x = tl.where(cols[None, :] < n_cols, x, float("-inf"))  # the ragged block's missing columns count 0
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
        tl.store(m_ptr + rows * n_blocks + b, m, mask=real_rows)
        tl.store(l_ptr + rows * n_blocks + b, l, mask=real_rows)


def online_softmax_states(x, block_size):
    """The online softmax's running state after each block of columns, computed by a kernel.

    x: (R, C) float32; block_size: a power of two >= 16.
    Returns (m, l), both (R, n_b) float32 with n_b = ceil(C / block_size):
    m[:, b] = max(x[:, :(b + 1) * block_size]) and
    l[:, b] = sum of exp(x[:, j] - m[:, b]) over those columns (the last block ragged),
    so that m[:, -1] + log(l[:, -1]) is each row's logsumexp.
    """
    R, C = x.shape
    x = x.contiguous()
    n_blocks = triton.cdiv(C, block_size)
    m = torch.empty((R, n_blocks), dtype=torch.float32, device=x.device)
    l = torch.empty((R, n_blocks), dtype=torch.float32, device=x.device)
    online_softmax_kernel[(triton.cdiv(R, 16),)](x, m, l, R, C, n_blocks, BLOCK_R=16, BLOCK=block_size)
    return m, l


@triton.jit
def flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, scale,
                         D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Program (i, bh) of a (cdiv(N, BLOCK_M), B * H) grid: query tile i of head bh, all its key tiles
    # (or those up to the diagonal). A suggested signature: change it as you like.
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64) * N                    # first row of this (batch, head)
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + (head + rows[:, None]) * D + dims[None, :], mask=rows[:, None] < N, other=0.0)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)          # running maximum of each query's scores
    l = tl.zeros((BLOCK_M,), tl.float32)                         # running sum of exp(s - m)
    acc = tl.zeros((BLOCK_M, D), tl.float32)                     # running sum of exp(s - m) v
    end = N
    if CAUSAL:
        end = tl.minimum(N, start_m + BLOCK_M)                   # later key tiles are hidden from every row
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        at = (head + cols[:, None]) * D + dims[None, :]
        k = tl.load(k_ptr + at, mask=cols[:, None] < N, other=0.0)
        v = tl.load(v_ptr + at, mask=cols[:, None] < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale                       # (BLOCK_M, BLOCK_N) float32
        keep = cols[None, :] < N
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)                                # rescales what was summed against the old m
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    o = acc / l[:, None]
    tl.store(o_ptr + (head + rows[:, None]) * D + dims[None, :], o.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < N)
    tl.store(lse_ptr + head + rows, m + tl.log(l), mask=rows < N)


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    """FlashAttention-2's forward pass, computed by a Triton kernel.

    q, k, v: (B, H, N, d) contiguous, float32 or float16, d in {16, 32, 64, 128}; any N >= 1.
    causal: query i attends to keys j <= i only. scale: None means 1 / sqrt(d).
    block_m, block_n: queries and keys per tile, powers of two >= 16; they never change the result.
    Returns (o, lse): o (B, H, N, d) in q's dtype, o_i = sum_j softmax_j(scale q_i . k_j) v_j;
    lse (B, H, N) float32, lse_i = log sum_j exp(scale q_i . k_j). One program per
    (query tile, batch x head); no tensor of N x N elements is allocated.
    """
    B, H, N, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(N, block_m), B * H)
    flash_forward_kernel[grid](q, k, v, o, lse, N, scale, D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return o, lse


@triton.jit
def flash_backward_preprocess_kernel(o_ptr, do_ptr, delta_ptr, N, D: tl.constexpr, BLOCK_M: tl.constexpr):
    # Program (i, bh) of a (cdiv(N, BLOCK_M), B * H) grid: D = rowsum(dO * O) for query tile i of head bh.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1).to(tl.int64) * N
    dims = tl.arange(0, D)
    at = (head + rows[:, None]) * D + dims[None, :]
    o = tl.load(o_ptr + at, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + at, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    tl.store(delta_ptr + head + rows, tl.sum(o * do, axis=1), mask=rows < N)


@triton.jit
def flash_backward_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, N, scale,
                               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               CAUSAL: tl.constexpr):
    # Program (j, bh) of a (cdiv(N, BLOCK_N), B * H) grid: dK and dV of key tile j of head bh.
    start_n = tl.program_id(0) * BLOCK_N
    head = tl.program_id(1).to(tl.int64) * N
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    at_n = (head + cols[:, None]) * D + dims[None, :]
    k = tl.load(k_ptr + at_n, mask=cols[:, None] < N, other=0.0)
    v = tl.load(v_ptr + at_n, mask=cols[:, None] < N, other=0.0)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    begin = 0
    if CAUSAL:
        begin = (start_n // BLOCK_M) * BLOCK_M                    # earlier query tiles see none of these keys
    for start_m in range(begin, N, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        at_m = (head + rows[:, None]) * D + dims[None, :]
        q = tl.load(q_ptr + at_m, mask=rows[:, None] < N, other=0.0)
        do = tl.load(do_ptr + at_m, mask=rows[:, None] < N, other=0.0)
        lse = tl.load(lse_ptr + head + rows, mask=rows < N, other=0.0)
        delta = tl.load(delta_ptr + head + rows, mask=rows < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale                        # (BLOCK_M, BLOCK_N)
        keep = (rows[:, None] < N) & (cols[None, :] < N)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)         # the forward's probabilities, recomputed
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    tl.store(dk_ptr + at_n, (dk * scale).to(dk_ptr.dtype.element_ty), mask=cols[:, None] < N)
    tl.store(dv_ptr + at_n, dv.to(dv_ptr.dtype.element_ty), mask=cols[:, None] < N)


@triton.jit
def flash_backward_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, N, scale,
                             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Program (i, bh) of a (cdiv(N, BLOCK_M), B * H) grid: dQ of query tile i of head bh.
    start_m = tl.program_id(0) * BLOCK_M
    head = tl.program_id(1).to(tl.int64) * N
    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    at_m = (head + rows[:, None]) * D + dims[None, :]
    q = tl.load(q_ptr + at_m, mask=rows[:, None] < N, other=0.0)
    do = tl.load(do_ptr + at_m, mask=rows[:, None] < N, other=0.0)
    lse = tl.load(lse_ptr + head + rows, mask=rows < N, other=0.0)
    delta = tl.load(delta_ptr + head + rows, mask=rows < N, other=0.0)
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    end = N
    if CAUSAL:
        end = tl.minimum(N, start_m + BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        at_n = (head + cols[:, None]) * D + dims[None, :]
        k = tl.load(k_ptr + at_n, mask=cols[:, None] < N, other=0.0)
        v = tl.load(v_ptr + at_n, mask=cols[:, None] < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = (rows[:, None] < N) & (cols[None, :] < N)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(dq_ptr + at_m, (dq * scale).to(dq_ptr.dtype.element_ty), mask=rows[:, None] < N)


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
    """FlashAttention-2's backward pass, computed by Triton kernels.

    q, k, v, o, do: (B, H, N, d), float32 or float16 (do: the gradient of the loss with respect to o);
    lse: (B, H, N) float32, as flash_attention_forward returned them; causal, scale, block_m,
    block_n as there. Returns (dq, dk, dv), each (B, H, N, d) in q's dtype, equal to autograd
    of the forward: P_ij = exp(scale q_i . k_j - lse_i) (0 where causal hides j > i),
    D_i = sum_c do_ic o_ic, dS = P * (do v^T - D), dq = scale dS k, dk = scale dS^T q, dv = P^T do.
    dK and dV per key tile; dQ per query tile (a second kernel) or by tl.atomic_add.
    No tensor of N x N elements is allocated.
    """
    B, H, N, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    do = do.contiguous()
    delta = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flash_backward_preprocess_kernel[(triton.cdiv(N, block_m), B * H)](o, do, delta, N, D=d, BLOCK_M=block_m)
    flash_backward_dkdv_kernel[(triton.cdiv(N, block_n), B * H)](
        q, k, v, do, lse, delta, dk, dv, N, scale, D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    flash_backward_dq_kernel[(triton.cdiv(N, block_m), B * H)](
        q, k, v, do, lse, delta, dq, N, scale, D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention by the Triton kernels: forward by flash_attention_forward, backward by flash_attention_backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None):
        """Returns o (B, H, N, d); saves q, k, v, o, lse and nothing else (causal and scale on ctx)."""
        o, lse = flash_attention_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o

    @staticmethod
    def backward(ctx, do):
        """Returns (dq, dk, dv, None, None) from the saved tensors."""
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, causal=False, scale=None):
    """Differentiable attention: FlashAttention.apply(q, k, v, causal, scale), o (B, H, N, d) in q's dtype."""
    return FlashAttention.apply(q, k, v, causal, scale)


@triton.jit
def decode_partials_kernel(q_ptr, k_ptr, v_ptr, o_part_ptr, lse_part_ptr, n_keys, split_len, scale,
                           D: tl.constexpr, BLOCK_N: tl.constexpr):
    # Program (split, bh) of a (num_splits, B * H) grid: head bh's keys from split * split_len to the split's
    # end (n_keys at most); it writes row bh * num_splits + split of o_part and of lse_part. A suggested
    # signature: change it as you like, with the launch in the wrapper.
    split, bh = tl.program_id(0), tl.program_id(1)
    num_splits = tl.num_programs(0)
    cols = tl.arange(0, D)
    q = tl.load(q_ptr + bh * D + cols)                                     # (D,)
    start = split * split_len
    end = tl.minimum(start + split_len, n_keys)                            # this split's keys: [start, end)
    m = tl.full((), float("-inf"), tl.float32)                             # running maximum
    l = tl.zeros((), tl.float32)                                           # running sum
    acc = tl.zeros((D,), tl.float32)                                       # running output
    for t0 in range(start, end, BLOCK_N):
        rows = t0 + tl.arange(0, BLOCK_N)
        inside = rows < end                                                # the split's end, not N
        offsets = (bh * n_keys + rows)[:, None] * D + cols[None, :]
        k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0)     # (BLOCK_N, D)
        v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0)
        s = tl.sum(k * q[None, :], axis=1) * scale                        # (BLOCK_N,) one query: no tl.dot
        s = tl.where(inside, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)                                          # rescales the old sums
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    row = bh * num_splits + split
    # An empty split (start >= end) leaves l = 0: it writes o = 0 and lse = -inf, which the
    # combine then weights by exp(-inf) = 0.
    tl.store(o_part_ptr + row * D + cols, acc / tl.where(l > 0, l, 1.0))
    tl.store(lse_part_ptr + row, m + tl.log(l))


def flash_decoding_partials(q, k, v, num_splits, scale=None, block_n=16):
    """Flash-decoding's first kernel: attention of one query per head over each split of the keys.

    Args:
        q: (B, H, d) float32, the step's query of each (batch, head); d is 16, 32, 64 or 128.
        k, v: (B, H, N, d) float32, the cached keys and values.
        num_splits: S >= 1; split s covers keys [s * L, min((s + 1) * L, N)), L = ceil(N / S).
        scale: the scores are scale * q . k_j; None means 1 / sqrt(d).
        block_n: keys per tile inside a split, a power of two >= 16; never changes the result.

    Returns (o_part (B, H, S, d), lse_part (B, H, S)), both float32: for each split, the
    softmax-weighted values over its own keys and the logsumexp of its scores. One program
    per (split, batch x head), launched by this wrapper, which only allocates and launches.
    """
    B, H, N, d = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o_part = torch.empty(B, H, num_splits, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    grid = (num_splits, B * H)
    decode_partials_kernel[grid](q, k, v, o_part, lse_part, N, triton.cdiv(N, num_splits), scale,
                                 D=d, BLOCK_N=block_n)
    return o_part, lse_part


@triton.jit
def combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, num_splits,
                   D: tl.constexpr, BLOCK_S: tl.constexpr):
    # Program bh of a (B * H,) grid: the num_splits partial results of head bh, in one block of BLOCK_S lanes
    # (a power of two >= num_splits). A suggested signature: change it as you like, with the launch.
    bh = tl.program_id(0)
    splits = tl.arange(0, BLOCK_S)
    cols = tl.arange(0, D)
    present = splits < num_splits
    rows = bh * num_splits + splits
    lse_s = tl.load(lse_part_ptr + rows, mask=present, other=float("-inf"))           # (BLOCK_S,)
    m = tl.max(lse_s, axis=0)                                                          # keeps exp in range
    lse = m + tl.log(tl.sum(tl.exp(lse_s - m), axis=0))
    weight = tl.exp(lse_s - lse)                                                       # each split's share
    o_s = tl.load(o_part_ptr + rows[:, None] * D + cols[None, :], mask=present[:, None], other=0.0)
    tl.store(o_ptr + bh * D + cols, tl.sum(weight[:, None] * o_s, axis=0))
    tl.store(lse_ptr + bh, lse)


def combine_partials(o_part, lse_part):
    """Flash-decoding's second kernel: the attention over all keys from the splits' partial results.

    Args:
        o_part: (B, H, S, d) float32, each split's output (from flash_decoding_partials).
        lse_part: (B, H, S) float32, each split's logsumexp.

    Returns (o (B, H, d), lse (B, H)), float32: lse = log sum_s exp(lse_part_s) and
    o = sum_s exp(lse_part_s - lse) o_part_s, computed without overflow for any finite
    lse_part. One program per (batch, head), launched by this wrapper.
    """
    B, H, S, d = o_part.shape
    o_part, lse_part = o_part.contiguous(), lse_part.contiguous()
    o = torch.empty(B, H, d, dtype=torch.float32, device=o_part.device)
    lse = torch.empty(B, H, dtype=torch.float32, device=o_part.device)
    combine_kernel[(B * H,)](o_part, lse_part, o, lse, S, D=d, BLOCK_S=triton.next_power_of_2(S))
    return o, lse


@triton.jit
def paged_decoding_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, o_ptr, scale,
                          stride_table, stride_block, stride_head, stride_slot,
                          H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # Program (b, h) of a (B, H) grid: sequence b's blocks, read through row b of the block table, for head h.
    # A suggested signature: change it as you like, with the launch in the wrapper.
    b, h = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, D)
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + (b * H + h) * D + cols).to(tl.float32)            # (D,)
    seq_len = tl.load(lens_ptr + b)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for j in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):                       # this sequence's blocks only
        block = tl.load(table_ptr + b * stride_table + j).to(tl.int64)     # the physical block
        inside = j * BLOCK_SIZE + slots < seq_len                         # slots after the last token: masked
        offsets = block * stride_block + h * stride_head + slots[:, None] * stride_slot + cols[None, :]
        k = tl.load(k_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)   # (BLOCK_SIZE, D)
        v = tl.load(v_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
        s = tl.where(inside, tl.sum(k * q[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(o_ptr + (b * H + h) * D + cols, (acc / l).to(o_ptr.dtype.element_ty))


def paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    """One decoding step per sequence, keys and values read through the block table inside the kernel.

    Args:
        q: (B, H, d), the newest query of each sequence (float32 or float16; d is 16 to 128).
        k_cache, v_cache: (num_blocks, H, block_size, d) float32, the pool of blocks (Chapter 8's
            layout); block_size is a power of two.
        block_table: (B, max_blocks) int32 or int64; token t < seq_lens[b] of sequence b sits in
            physical block block_table[b, t // block_size] at slot t % block_size. Entries after
            a sequence's last block are padding and must not be read.
        seq_lens: (B,) int32 or int64, each >= 1.
        scale: the scores are scale * q . k_t; None means 1 / sqrt(d).

    Returns (B, H, d) in q's dtype: for each b and h, softmax attention of q[b, h] over the
    seq_lens[b] cached keys and values of sequence b. One program per (sequence, head).
    """
    B, H, d = q.shape
    block_size = k_cache.size(2)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    o = torch.empty_like(q)
    paged_decoding_kernel[(B, H)](q, k_cache, v_cache, block_table, seq_lens, o, scale,
                                  block_table.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                   H=H, D=d, BLOCK_SIZE=block_size)
    return o


EXPORTS_SOURCE = 'import math\nimport os\n\nimport torch\n\nif not torch.cuda.is_available():  # no GPU: Triton\'s interpreter runs the kernels on the CPU, with numpy\n    os.environ.setdefault("TRITON_INTERPRET", "1")\nimport triton\nimport triton.language as tl\n\nDEVICE = "cuda" if torch.cuda.is_available() else "cpu"\ndef softmax_of_columns(x, start, stop):\n    """Given, for the grader: softmax of the column slice x[:, start:stop], a view whose rows are\n    x.stride(0) elements apart (a test\'s inputs reach your kernel contiguous otherwise)."""\n    return softmax(x[:, start:stop])\ndef naive_attention(q, k, v, causal=False, scale=None):\n    """softmax(scale q k^T) v and the scores\' logsumexp, in float32, with the (N, N) scores materialised."""\n    N, d = q.shape[-2], q.shape[-1]\n    scale = 1.0 / math.sqrt(d) if scale is None else scale\n    s = (q.float() @ k.float().transpose(-1, -2)) * scale                  # (B, H, N, N)\n    if causal:\n        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))\n    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)\ndef naive_attention_gradients(q, k, v, do, causal=False, scale=None):\n    """(o, lse, dq, dk, dv) of naive attention in float32: the forward\'s results and autograd\'s gradients."""\n    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))\n    o, lse = naive_attention(q, k, v, causal=causal, scale=scale)\n    o.backward(do.float())\n    return o.detach(), lse.detach(), q.grad, k.grad, v.grad\ndef saved_numels(q, k, v, causal=False, scale=None):\n    """Given, for the grader: the sizes (numel) of the tensors flash_attention saves for its backward, sorted."""\n    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))\n    o = flash_attention(q, k, v, causal, scale)\n    return torch.tensor(sorted(t.numel() for t in o.grad_fn.saved_tensors))'
