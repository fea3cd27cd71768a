"""Hidden tests of Chapter 10 against a catalog of correct, wrong and hostile submissions.

Correct styles and mistakes are judged in process by the kernel's own call routine and the
grader's judge, the kernels run by Triton's interpreter on the CPU (TRITON_INTERPRET=1); tampering,
the kernel-only cases and a sample go through the real pipeline (see tests/catalog.py). A correct
style gets every point; a mistake loses exactly the listed tests, each with the given message
fragment, and passes every other test.

The styles are written as other codebases write the same kernels: plain offsets with the strides
passed (as most hand-written Triton kernels), and Triton's own tutorials (tensor descriptors, which
replaced ``tl.make_block_ptr``/``tl.advance`` in triton 3.9; scores prescaled by ``scale * log2(e)``
for ``tl.exp2``; a persistent softmax; the backward in one kernel per key tile with dQ added by
``tl.atomic_add`` into a float32 buffer; grids as lambdas of ``META``; vLLM's first PagedAttention
kernel reading one key at a time). drafts/ch10/catalog/check.py checked both against naive attention
and autograd before the chapter existed.
"""
from __future__ import annotations

import pytest

from autograder.chapters import ChapterInfo
from catalog import Catalog, CatalogTests, common_tampering, others_stubbed, replaced, submitter, tampered

CHAPTER = "10_attention_kernels"
INFO = ChapterInfo(CHAPTER)
ALL_TESTS = list(INFO.tests)


def exercise_tests(exercise: str, *having: str) -> list[str]:
    """The tests of EXERCISE (those whose id contains one of ``having``, if given)."""
    return [t for t in ALL_TESTS if INFO.exercise_of(t) == exercise and (not having or any(h in t for h in having))]


sub = submitter(CHAPTER)

# ------------------------------------------------------------------ correct, other styles
# 1. Plain offsets (the base every mistake below changes): pointers from offsets and the strides the
#    wrapper passes, tuple grids, natural exp, the backward in three kernels (D on its own, dK/dV per
#    key tile, dQ per query tile), paged decoding loading a whole block, the combine over all splits
#    in one program.
OFFSETS_SOFTMAX = '''
@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)                    # the largest entry becomes exp(0) = 1: no overflow
    num = tl.exp(x)
    tl.store(y_ptr + row * y_row_stride + cols, num / tl.sum(num, axis=0), mask=inside)


def softmax(x):
    R, C = x.shape
    y = torch.empty((R, C), dtype=x.dtype, device=x.device)
    softmax_kernel[(R,)](x, y, C, x.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(C))
    return y
'''

OFFSETS_ONLINE_SOFTMAX_STATES = '''
@triton.jit
def online_states_kernel(x_ptr, m_ptr, l_ptr, n_cols, n_blocks, x_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    m = float("-inf")
    l = 0.0
    for b in range(0, n_blocks):
        cols = b * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_row_stride + cols, mask=cols < n_cols, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
        tl.store(m_ptr + row * n_blocks + b, m)
        tl.store(l_ptr + row * n_blocks + b, l)


def online_softmax_states(x, block_size):
    R, C = x.shape
    n_b = triton.cdiv(C, block_size)
    m = torch.empty((R, n_b), dtype=torch.float32, device=x.device)
    l = torch.empty((R, n_b), dtype=torch.float32, device=x.device)
    online_states_kernel[(R,)](x, m, l, C, n_b, x.stride(0), BLOCK=block_size)
    return m, l
'''

OFFSETS_FLASH_ATTENTION_FORWARD = '''
@triton.jit
def fa_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, scale,
                      stride_z, stride_n,
                      CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    z = tl.program_id(1)                                  # batch x head
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    base = z * stride_z
    q = tl.load(q_ptr + base + rows[:, None] * stride_n + dims[None, :], mask=rows[:, None] < N, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N)      # tiles wholly above the diagonal: skipped
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = tl.load(k_ptr + base + cols[:, None] * stride_n + dims[None, :], mask=cols[:, None] < N, other=0.0)
        v = tl.load(v_ptr + base + cols[:, None] * stride_n + dims[None, :], mask=cols[:, None] < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale                # (BLOCK_M, BLOCK_N) float32
        keep = cols[None, :] < N
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + base + rows[:, None] * stride_n + dims[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=rows[:, None] < N)
    tl.store(lse_ptr + z * N + rows, m_i + tl.log(l_i), mask=rows < N)


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    B, H, N, d = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(N, block_m), B * H)
    fa_forward_kernel[grid](q, k, v, o, lse, N, scale, q.stride(1), q.stride(2),
                            CAUSAL=causal, D=d, BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse
'''

OFFSETS_FLASH_ATTENTION_BACKWARD = '''
@triton.jit
def fa_backward_delta_kernel(o_ptr, do_ptr, delta_ptr, N, stride_z, stride_n,
                             D: tl.constexpr, BLOCK_M: tl.constexpr):
    start_m = tl.program_id(0)
    z = tl.program_id(1)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    offs = z * stride_z + rows[:, None] * stride_n + dims[None, :]
    o = tl.load(o_ptr + offs, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    tl.store(delta_ptr + z * N + rows, tl.sum(o * do, axis=1), mask=rows < N)


@triton.jit
def fa_backward_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, N, scale,
                            stride_z, stride_n,
                            CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0)
    z = tl.program_id(1)
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    base = z * stride_z
    kv_offs = base + cols[:, None] * stride_n + dims[None, :]
    k = tl.load(k_ptr + kv_offs, mask=cols[:, None] < N, other=0.0)
    v = tl.load(v_ptr + kv_offs, mask=cols[:, None] < N, other=0.0)
    dk = tl.zeros((BLOCK_N, D), tl.float32)
    dv = tl.zeros((BLOCK_N, D), tl.float32)
    lo = 0
    if CAUSAL:
        lo = (start_n * BLOCK_N) // BLOCK_M * BLOCK_M       # query tiles wholly above: nothing to add
    for start_m in range(lo, N, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q_offs = base + rows[:, None] * stride_n + dims[None, :]
        q = tl.load(q_ptr + q_offs, mask=rows[:, None] < N, other=0.0)
        do = tl.load(do_ptr + q_offs, mask=rows[:, None] < N, other=0.0)
        lse = tl.load(lse_ptr + z * N + rows, mask=rows < N, other=0.0)
        delta = tl.load(delta_ptr + z * N + rows, mask=rows < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = (rows[:, None] < N) & (cols[None, :] < N)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * scale
    tl.store(dk_ptr + kv_offs, dk.to(dk_ptr.dtype.element_ty), mask=cols[:, None] < N)
    tl.store(dv_ptr + kv_offs, dv.to(dv_ptr.dtype.element_ty), mask=cols[:, None] < N)


@triton.jit
def fa_backward_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, N, scale,
                          stride_z, stride_n,
                          CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    z = tl.program_id(1)
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    base = z * stride_z
    q_offs = base + rows[:, None] * stride_n + dims[None, :]
    q = tl.load(q_ptr + q_offs, mask=rows[:, None] < N, other=0.0)
    do = tl.load(do_ptr + q_offs, mask=rows[:, None] < N, other=0.0)
    lse = tl.load(lse_ptr + z * N + rows, mask=rows < N, other=0.0)
    delta = tl.load(delta_ptr + z * N + rows, mask=rows < N, other=0.0)
    dq = tl.zeros((BLOCK_M, D), tl.float32)
    hi = N
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, N)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_offs = base + cols[:, None] * stride_n + dims[None, :]
        k = tl.load(k_ptr + kv_offs, mask=cols[:, None] < N, other=0.0)
        v = tl.load(v_ptr + kv_offs, mask=cols[:, None] < N, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = (rows[:, None] < N) & (cols[None, :] < N)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * scale
    tl.store(dq_ptr + q_offs, dq.to(dq_ptr.dtype.element_ty), mask=rows[:, None] < N)


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
    B, H, N, d = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    do = do.contiguous()
    delta = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sz, sn = q.stride(1), q.stride(2)
    fa_backward_delta_kernel[(triton.cdiv(N, block_m), B * H)](o, do, delta, N, sz, sn, D=d, BLOCK_M=block_m)
    fa_backward_dkdv_kernel[(triton.cdiv(N, block_n), B * H)](q, k, v, do, lse, delta, dk, dv, N, scale, sz, sn,
                                                                CAUSAL=causal, D=d, BLOCK_M=block_m, BLOCK_N=block_n)
    fa_backward_dq_kernel[(triton.cdiv(N, block_m), B * H)](q, k, v, do, lse, delta, dq, N, scale, sz, sn,
                                                              CAUSAL=causal, D=d, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq, dk, dv
'''

OFFSETS_FLASH_ATTENTION = '''
class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None):
        out, logsumexp = flash_attention_forward(q, k, v, causal=causal, scale=scale)
        ctx.causal = causal
        ctx.scale = scale
        ctx.save_for_backward(q, k, v, out, logsumexp)    # the logsumexp: all the backward needs of P
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grads = flash_attention_backward(*ctx.saved_tensors, grad_out.contiguous(), causal=ctx.causal,
                                         scale=ctx.scale)
        return (*grads, None, None)                       # nothing for causal and scale


def flash_attention(q, k, v, causal=False, scale=None):
    return FlashAttention.apply(q, k, v, causal, scale)
'''

OFFSETS_FLASH_DECODING_PARTIALS = '''
@triton.jit
def decoding_split_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, split_len, num_splits, scale,
                          stride_kz, stride_kn,
                          D: tl.constexpr, BLOCK_N: tl.constexpr):
    split = tl.program_id(0)
    z = tl.program_id(1)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + z * D + dims).to(tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, N)
    m = float("-inf")
    l = 0.0
    acc = tl.zeros((D,), tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        inside = cols < end
        offs = z * stride_kz + cols[:, None] * stride_kn + dims[None, :]
        k = tl.load(k_ptr + offs, mask=inside[:, None], other=0.0)
        v = tl.load(v_ptr + offs, mask=inside[:, None], other=0.0)
        s = tl.sum(k * q[None, :], axis=1) * scale       # (BLOCK_N,)
        s = tl.where(inside, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(o_ptr + (z * num_splits + split) * D + dims, acc / l)
    tl.store(lse_ptr + z * num_splits + split, m + tl.log(l))


def flash_decoding_partials(q, k, v, num_splits, scale=None, block_n=16):
    B, H, N, d = k.shape
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    split_len = triton.cdiv(N, num_splits)
    o_part = torch.empty((B, H, num_splits, d), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((B, H, num_splits), dtype=torch.float32, device=q.device)
    decoding_split_kernel[(num_splits, B * H)](q, k, v, o_part, lse_part, N, split_len, num_splits, scale,
                                                 k.stride(1), k.stride(2), D=d, BLOCK_N=block_n)
    return o_part, lse_part
'''

OFFSETS_COMBINE_PARTIALS = '''
@triton.jit
def combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, num_splits,
                   D: tl.constexpr, BLOCK_S: tl.constexpr):
    z = tl.program_id(0)                                   # batch x head
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, D)
    inside = splits < num_splits
    lse_s = tl.load(lse_part_ptr + z * num_splits + splits, mask=inside, other=float("-inf"))
    o_s = tl.load(o_part_ptr + (z * num_splits + splits[:, None]) * D + dims[None, :],
                  mask=inside[:, None], other=0.0)
    m = tl.max(lse_s, axis=0)
    w = tl.exp(lse_s - m)                                  # exp(lse_s - lse) up to the common factor
    total = tl.sum(w, axis=0)
    lse = m + tl.log(total)
    o = tl.sum(w[:, None] * o_s, axis=0) / total
    tl.store(o_ptr + z * D + dims, o)
    tl.store(lse_ptr + z, lse)


def combine_partials(o_part, lse_part):
    B, H, S, d = o_part.shape
    o_part, lse_part = o_part.contiguous(), lse_part.contiguous()
    o = torch.empty((B, H, d), dtype=torch.float32, device=o_part.device)
    lse = torch.empty((B, H), dtype=torch.float32, device=o_part.device)
    combine_kernel[(B * H,)](o_part, lse_part, o, lse, S, D=d, BLOCK_S=triton.next_power_of_2(S))
    return o, lse
'''

OFFSETS_PAGED_DECODING = '''
@triton.jit
def paged_decoding_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, seq_lens_ptr, o_ptr, scale,
                          H, max_blocks, stride_cb, stride_ch, stride_cs,
                          BLOCK_SIZE: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    dims = tl.arange(0, D)
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + (b * H + h) * D + dims).to(tl.float32)
    seq_len = tl.load(seq_lens_ptr + b)
    m = float("-inf")
    l = 0.0
    acc = tl.zeros((D,), tl.float32)
    for logical in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        physical = tl.load(block_table_ptr + b * max_blocks + logical)
        t = logical * BLOCK_SIZE + slots
        valid = t < seq_len
        offs = physical * stride_cb + h * stride_ch + slots[:, None] * stride_cs + dims[None, :]
        k = tl.load(k_cache_ptr + offs, mask=valid[:, None], other=0.0)   # slots past seq_len: never read
        v = tl.load(v_cache_ptr + offs, mask=valid[:, None], other=0.0)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(o_ptr + (b * H + h) * D + dims, (acc / l).to(o_ptr.dtype.element_ty))


def paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    B, H, d = q.shape
    block_size = k_cache.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    q, block_table, seq_lens = q.contiguous(), block_table.contiguous(), seq_lens.contiguous()
    o = torch.empty((B, H, d), dtype=q.dtype, device=q.device)
    paged_decoding_kernel[(B, H)](q, k_cache, v_cache, block_table, seq_lens, o, scale,
                                  H, block_table.shape[1], k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                  BLOCK_SIZE=block_size, D=d)
    return o
'''


# 2. Triton's tutorials (triton 3.9): tensor descriptors (3-D, [batch x head, N, d], [1, BLOCK, d] blocks;
#    their strides must be multiples of 16 bytes, so softmax rows and logsumexps keep pointers), exp2
#    of prescaled scores with the logsumexp turned back to natural log, the causal loop in two stages
#    (left of the diagonal unmasked, the diagonal masked), a persistent softmax, online states in a
#    while loop, the backward in one kernel per key tile with D inside and dQ by tl.atomic_add,
#    .contiguous() wrappers whose kernels compute offsets from the shapes, META grids, setup_context
#    and once_differentiable, paged decoding one key at a time, the combine as a running merge.
TUTORIAL_SOFTMAX = '''
@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols, BLOCK_SIZE: tl.constexpr):
    first_row = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(first_row, n_rows, row_step):
        col_offsets = tl.arange(0, BLOCK_SIZE)
        in_bounds = col_offsets < n_cols
        row = tl.load(in_ptr + row_idx * in_row_stride + col_offsets, mask=in_bounds, other=-float("inf"))
        row = row.to(tl.float32)
        numerator = tl.exp(row - tl.max(row, axis=0))
        denominator = tl.sum(numerator, axis=0)
        tl.store(out_ptr + row_idx * out_row_stride + col_offsets, numerator / denominator, mask=in_bounds)


def softmax(x):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    grid = lambda META: (min(n_rows, 4),)                 # a few programs, each striding over the rows
    softmax_kernel[grid](y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                         BLOCK_SIZE=triton.next_power_of_2(n_cols))
    return y
'''

TUTORIAL_ONLINE_SOFTMAX_STATES = '''
@triton.jit
def running_state_kernel(X, M, L, n_cols, n_blocks, BLOCK: tl.constexpr):
    LOG2E: tl.constexpr = 1.4426950408889634
    r = tl.program_id(0)
    x_row = X + r * n_cols
    running_max = -float("inf")
    running_sum = 0.0
    block = 0
    while block < n_blocks:
        idx = block * BLOCK + tl.arange(0, BLOCK)
        chunk = tl.load(x_row + idx, mask=idx < n_cols, other=-float("inf"))
        new_max = tl.maximum(running_max, tl.max(chunk, 0))
        running_sum = (running_sum * tl.exp2((running_max - new_max) * LOG2E)
                       + tl.sum(tl.exp2((chunk - new_max) * LOG2E), 0))
        running_max = new_max
        tl.store(M + r * n_blocks + block, running_max)
        tl.store(L + r * n_blocks + block, running_sum)
        block += 1


def online_softmax_states(x, block_size):
    x = x.contiguous()
    n_blocks = triton.cdiv(x.shape[1], block_size)
    m = torch.empty(x.shape[0], n_blocks, device=x.device, dtype=torch.float32)
    l = torch.empty_like(m)
    running_state_kernel[lambda META: (x.shape[0],)](x, m, l, x.shape[1], n_blocks, BLOCK=block_size)
    return m, l
'''

TUTORIAL_FLASH_ATTENTION_FORWARD = '''
@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, off_hz, start_m, qk_scale, N_CTX,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    STAGE: tl.constexpr, offs_m, offs_n):
    # STAGE 1: the key tiles left of the diagonal (no mask but the ragged end); 2: the diagonal ones; 3: all.
    if STAGE == 1:
        lo, hi = 0, start_m * BLOCK_M // BLOCK_N * BLOCK_N
    elif STAGE == 2:
        lo, hi = start_m * BLOCK_M // BLOCK_N * BLOCK_N, tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
    else:
        lo, hi = 0, N_CTX
    for start_n in range(lo, hi, BLOCK_N):
        k = desc_k.load([off_hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)
        valid = (start_n + offs_n[None, :]) < N_CTX
        if STAGE == 2:
            valid = valid & (offs_m[:, None] >= start_n + offs_n[None, :])
        qk = tl.where(valid, qk * qk_scale, -1.0e38)      # in log2 units from here on
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([off_hz, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, Out, LSE, sm_scale, Z_H, N_CTX,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    desc_q = tl.make_tensor_descriptor(Q, shape=[Z_H, N_CTX, HEAD_DIM], strides=[N_CTX * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K, shape=[Z_H, N_CTX, HEAD_DIM], strides=[N_CTX * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, shape=[Z_H, N_CTX, HEAD_DIM], strides=[N_CTX * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_N, HEAD_DIM])
    desc_o = tl.make_tensor_descriptor(Out, shape=[Z_H, N_CTX, HEAD_DIM], strides=[N_CTX * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_M, HEAD_DIM])
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0    # multiplied away by the first alpha = exp2(-inf)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504                      # exp(x) = exp2(x * log2(e))
    q = desc_q.load([off_hz, start_m * BLOCK_M, 0]).reshape(BLOCK_M, HEAD_DIM)
    if STAGE & 1:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, off_hz, start_m, qk_scale, N_CTX,
                                        BLOCK_M, BLOCK_N, HEAD_DIM, 4 - STAGE, offs_m, offs_n)
    if STAGE & 2:
        acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, desc_k, desc_v, off_hz, start_m, qk_scale, N_CTX,
                                        BLOCK_M, BLOCK_N, HEAD_DIM, 2, offs_m, offs_n)
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    tl.store(LSE + off_hz * N_CTX + offs_m, m_i * 0.6931471805599453, mask=offs_m < N_CTX)  # log2 -> ln
    desc_o.store([off_hz, start_m * BLOCK_M, 0], acc.to(Out.dtype.element_ty).reshape(1, BLOCK_M, HEAD_DIM))


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    HEAD_DIM = q.shape[-1]
    sm_scale = HEAD_DIM ** -0.5 if scale is None else scale
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    grid = lambda META: (triton.cdiv(q.shape[2], META["BLOCK_M"]), q.shape[0] * q.shape[1])
    _attn_fwd[grid](q, k, v, o, lse, sm_scale, q.shape[0] * q.shape[1], q.shape[2],
                    HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, STAGE=3 if causal else 1)
    return o, lse
'''

TUTORIAL_FLASH_ATTENTION_BACKWARD = '''
@triton.jit
def _attn_bwd(Q, K, V, O, DO, LSE, DQ_ACC, DK, DV, sm_scale, N_CTX,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    LN2: tl.constexpr = 0.6931471805599453
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64) * N_CTX * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, HEAD_DIM)
    kv_ptrs = bh + offs_n[:, None] * HEAD_DIM + offs_k[None, :]
    k = tl.load(K + kv_ptrs, mask=offs_n[:, None] < N_CTX, other=0.0)
    v = tl.load(V + kv_ptrs, mask=offs_n[:, None] < N_CTX, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    start_m = 0
    if CAUSAL:
        start_m = start_n // BLOCK_M * BLOCK_M
    for curr_m in range(start_m, N_CTX, BLOCK_M):
        offs_m = curr_m + tl.arange(0, BLOCK_M)
        q_ptrs = bh + offs_m[:, None] * HEAD_DIM + offs_k[None, :]
        row_ok = offs_m < N_CTX
        q = tl.load(Q + q_ptrs, mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + q_ptrs, mask=row_ok[:, None], other=0.0)
        o = tl.load(O + q_ptrs, mask=row_ok[:, None], other=0.0)
        Di = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)      # D of this query tile, here
        lse2 = tl.load(LSE + tl.program_id(1) * N_CTX + offs_m, mask=row_ok, other=0.0) / LN2
        qkT = tl.dot(k, tl.trans(q))                                  # (BLOCK_N, BLOCK_M)
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        keep = row_ok[None, :] & (offs_n[:, None] < N_CTX)
        if CAUSAL:
            keep = keep & (offs_m[None, :] >= offs_n[:, None])
        pT = tl.where(keep, pT, 0.0)
        dv += tl.dot(pT.to(do.dtype), do)
        dpT = tl.dot(v, tl.trans(do)).to(tl.float32)
        dsT = pT * (dpT - Di[None, :])
        dk += tl.dot(dsT.to(q.dtype), q)
        dq_part = tl.dot(tl.trans(dsT), k.to(tl.float32)) * sm_scale  # this key tile's share of dQ
        tl.atomic_add(DQ_ACC + q_ptrs, dq_part, mask=row_ok[:, None])
    tl.store(DK + kv_ptrs, (dk * sm_scale).to(DK.dtype.element_ty), mask=offs_n[:, None] < N_CTX)
    tl.store(DV + kv_ptrs, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < N_CTX)


@triton.jit
def _cast_kernel(SRC, DST, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(DST + offs, tl.load(SRC + offs, mask=offs < numel).to(DST.dtype.element_ty), mask=offs < numel)


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
    q, k, v, o, lse, do = (t.contiguous() for t in (q, k, v, o, lse, do))
    BATCH, N_HEAD, N_CTX, HEAD_DIM = q.shape
    sm_scale = 1.0 / math.sqrt(HEAD_DIM) if scale is None else scale
    dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)   # every key tile adds its share
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    grid = lambda META: (triton.cdiv(N_CTX, META["BLOCK_N"]), BATCH * N_HEAD)
    _attn_bwd[grid](q, k, v, o, do, lse, dq_acc, dk, dv, sm_scale, N_CTX,
                    HEAD_DIM=HEAD_DIM, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    if q.dtype == torch.float32:
        return dq_acc, dk, dv
    dq = torch.empty_like(q)
    _cast_kernel[lambda META: (triton.cdiv(dq.numel(), META["BLOCK"]),)](dq_acc, dq, dq.numel(), BLOCK=1024)
    return dq, dk, dv
'''

TUTORIAL_FLASH_ATTENTION = '''
from torch.autograd.function import once_differentiable


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(q, k, v, causal, scale):
        return flash_attention_forward(q, k, v, causal, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        o, lse = output
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale

    @staticmethod
    @once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        return (*flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale), None, None)


def flash_attention(q, k, v, causal=False, scale=None):
    o, _ = FlashAttention.apply(q, k, v, causal, scale)
    return o
'''

TUTORIAL_FLASH_DECODING_PARTIALS = '''
@triton.jit
def _split_kv_kernel(Q, K, V, O_PART, LSE_PART, sm_scale, Z_H, N_CTX, SPLIT_LEN, NUM_SPLITS,
                     HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
    sid = tl.program_id(0)
    zh = tl.program_id(1)
    desc_k = tl.make_tensor_descriptor(K, shape=[Z_H, N_CTX, HEAD_DIM], strides=[N_CTX * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V, shape=[Z_H, N_CTX, HEAD_DIM], strides=[N_CTX * HEAD_DIM, HEAD_DIM, 1],
                                       block_shape=[1, BLOCK_N, HEAD_DIM])
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + zh * HEAD_DIM + d) * (sm_scale * 1.44269504)     # prescaled: scores in log2 units
    lo = sid * SPLIT_LEN
    hi = tl.minimum(lo + SPLIT_LEN, N_CTX)
    m2 = -float("inf")
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        key_idx = n0 + tl.arange(0, BLOCK_N)
        k = desc_k.load([zh, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        v = desc_v.load([zh, n0, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.where(key_idx < hi, tl.sum(q[None, :] * k, 1), -float("inf"))  # the next split's keys: out
        m_new = tl.maximum(m2, tl.max(qk, 0))
        corr = tl.exp2(m2 - m_new)
        p = tl.exp2(qk - m_new)
        l = l * corr + tl.sum(p, 0)
        acc = acc * corr + tl.sum(p[:, None] * v, 0)
        m2 = m_new
    out = zh * NUM_SPLITS + sid
    tl.store(O_PART + out * HEAD_DIM + d, acc / l)
    tl.store(LSE_PART + out, (m2 + tl.log2(l)) * 0.6931471805599453)


def flash_decoding_partials(q, k, v, num_splits, scale=None, block_n=16):
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    Z, H, N_CTX, HEAD_DIM = k.shape
    sm_scale = HEAD_DIM ** -0.5 if scale is None else scale
    o_part = torch.empty(Z, H, num_splits, HEAD_DIM, device=q.device, dtype=torch.float32)
    lse_part = torch.empty(Z, H, num_splits, device=q.device, dtype=torch.float32)
    grid = lambda META: (num_splits, Z * H)
    _split_kv_kernel[grid](q, k, v, o_part, lse_part, sm_scale, Z * H, N_CTX, triton.cdiv(N_CTX, num_splits),
                           num_splits, HEAD_DIM=HEAD_DIM, BLOCK_N=block_n)
    return o_part, lse_part
'''

TUTORIAL_COMBINE_PARTIALS = '''
@triton.jit
def _merge_splits(O_PART, LSE_PART, O, LSE, NUM_SPLITS, HEAD_DIM: tl.constexpr):
    zh = tl.program_id(0)
    d = tl.arange(0, HEAD_DIM)
    lse_acc = -float("inf")
    o_acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for s in range(0, NUM_SPLITS):                        # merge one split at a time into the running result
        lse_s = tl.load(LSE_PART + zh * NUM_SPLITS + s)
        o_s = tl.load(O_PART + (zh * NUM_SPLITS + s) * HEAD_DIM + d)
        new = tl.maximum(lse_acc, lse_s) + tl.log(tl.exp(lse_acc - tl.maximum(lse_acc, lse_s))
                                                  + tl.exp(lse_s - tl.maximum(lse_acc, lse_s)))
        o_acc = o_acc * tl.exp(lse_acc - new) + o_s * tl.exp(lse_s - new)
        lse_acc = new
    tl.store(O + zh * HEAD_DIM + d, o_acc)
    tl.store(LSE + zh, lse_acc)


def combine_partials(o_part, lse_part):
    o_part, lse_part = o_part.contiguous(), lse_part.contiguous()
    Z, H, NUM_SPLITS, HEAD_DIM = o_part.shape
    o = torch.empty(Z, H, HEAD_DIM, device=o_part.device, dtype=torch.float32)
    lse = torch.empty(Z, H, device=o_part.device, dtype=torch.float32)
    _merge_splits[lambda META: (Z * H,)](o_part, lse_part, o, lse, NUM_SPLITS, HEAD_DIM=HEAD_DIM)
    return o, lse
'''

TUTORIAL_PAGED_DECODING = '''
@triton.jit
def _paged_attention_v1(out, query, key_cache, value_cache, block_tables, context_lens, sm_scale,
                        num_heads, max_num_blocks_per_seq,
                        HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    seq_idx = tl.program_id(0)
    head_idx = tl.program_id(1)
    d = tl.arange(0, HEAD_SIZE)
    q = tl.load(query + (seq_idx * num_heads + head_idx) * HEAD_SIZE + d).to(tl.float32) * sm_scale
    context_len = tl.load(context_lens + seq_idx)
    qk_max = -float("inf")
    exp_sum = 0.0
    acc = tl.zeros([HEAD_SIZE], dtype=tl.float32)
    for token_idx in range(0, context_len):              # one key at a time, as vLLM's v1 kernel reads them
        block_number = tl.load(block_tables + seq_idx * max_num_blocks_per_seq + token_idx // BLOCK_SIZE)
        block_offset = token_idx % BLOCK_SIZE
        kv = ((block_number.to(tl.int64) * num_heads + head_idx) * BLOCK_SIZE + block_offset) * HEAD_SIZE + d
        qk = tl.sum(q * tl.load(key_cache + kv), 0)
        new_max = tl.maximum(qk_max, qk)
        rescale = tl.exp(qk_max - new_max)
        weight = tl.exp(qk - new_max)
        exp_sum = exp_sum * rescale + weight
        acc = acc * rescale + weight * tl.load(value_cache + kv)
        qk_max = new_max
    tl.store(out + (seq_idx * num_heads + head_idx) * HEAD_SIZE + d, (acc / exp_sum).to(out.dtype.element_ty))


def paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale=None):
    q, k_cache, v_cache = q.contiguous(), k_cache.contiguous(), v_cache.contiguous()
    block_table, seq_lens = block_table.contiguous(), seq_lens.contiguous()
    num_seqs, num_heads, head_size = q.shape
    out = torch.empty_like(q)
    sm_scale = head_size ** -0.5 if scale is None else scale
    _paged_attention_v1[lambda META: (num_seqs, num_heads)](
        out, q, k_cache, v_cache, block_table, seq_lens, sm_scale, num_heads, block_table.shape[1],
        HEAD_SIZE=head_size, BLOCK_SIZE=k_cache.shape[2])
    return out
'''

OFFSETS = {
    "softmax": OFFSETS_SOFTMAX,
    "online_softmax_states": OFFSETS_ONLINE_SOFTMAX_STATES,
    "flash_attention_forward": OFFSETS_FLASH_ATTENTION_FORWARD,
    "flash_attention_backward": OFFSETS_FLASH_ATTENTION_BACKWARD,
    "flash_attention": OFFSETS_FLASH_ATTENTION,
    "flash_decoding_partials": OFFSETS_FLASH_DECODING_PARTIALS,
    "combine_partials": OFFSETS_COMBINE_PARTIALS,
    "paged_decoding": OFFSETS_PAGED_DECODING,
}
TUTORIAL = {
    "softmax": TUTORIAL_SOFTMAX,
    "online_softmax_states": TUTORIAL_ONLINE_SOFTMAX_STATES,
    "flash_attention_forward": TUTORIAL_FLASH_ATTENTION_FORWARD,
    "flash_attention_backward": TUTORIAL_FLASH_ATTENTION_BACKWARD,
    "flash_attention": TUTORIAL_FLASH_ATTENTION,
    "flash_decoding_partials": TUTORIAL_FLASH_DECODING_PARTIALS,
    "combine_partials": TUTORIAL_COMBINE_PARTIALS,
    "paged_decoding": TUTORIAL_PAGED_DECODING,
}
STYLES = {"offsets": OFFSETS, "tutorial": TUTORIAL}

CORRECT = {
    "reference": sub(),
    "offsets": sub(OFFSETS),
    "tutorial": sub(TUTORIAL),
}

# ------------------------------------------------------------------ common mistakes
# Each mistake is one named change of a correct style's cell (the style, the exercise, the edits: each
# ``old`` is in the cell once), as drafts/ch10/catalog/check.py checked it against plain PyTorch: it gets
# exactly its own exercise wrong (the memory cases: right values, an N x N tensor).
EDITS = {
    # softmax
    "softmax_max_not_subtracted": ("offsets", "softmax", [(
        "    x = x - tl.max(x, axis=0)                    # the largest entry becomes exp(0) = 1: no overflow\n",
        "")]),
    "softmax_masked_lanes_zero": ("offsets", "softmax", [(
        'mask=inside, other=-float("inf")', "mask=inside, other=0.0")]),
    # online softmax states
    "online_l_not_rescaled": ("offsets", "online_softmax_states", [(
        "l = l * tl.exp(m - m_new) + ", "l = l + ")]),
    "online_m_of_block_only": ("offsets", "online_softmax_states", [(
        "m_new = tl.maximum(m, tl.max(x, axis=0))", "m_new = tl.max(x, axis=0)")]),
    # FlashAttention-2 forward
    "forward_masked_scores_zero": ("offsets", "flash_attention_forward", [(
        's = tl.where(keep, s, float("-inf"))', "s = tl.where(keep, s, 0.0)")]),
    "forward_lse_without_max": ("offsets", "flash_attention_forward", [(
        "m_i + tl.log(l_i)", "tl.log(l_i)")]),
    "forward_lse_in_log2": ("tutorial", "flash_attention_forward", [(
        "m_i * 0.6931471805599453, mask", "m_i, mask")]),
    "forward_causal_strict": ("offsets", "flash_attention_forward", [(
        "keep = keep & (cols[None, :] <= rows[:, None])", "keep = keep & (cols[None, :] < rows[:, None])")]),
    "forward_causal_one_tile_short": ("offsets", "flash_attention_forward", [(
        "hi = tl.minimum((start_m + 1) * BLOCK_M, N)", "hi = tl.minimum(start_m * BLOCK_M, N)")]),
    "forward_diagonal_tile_unmasked": ("tutorial", "flash_attention_forward", [(
        "        if STAGE == 2:\n            valid = valid & (offs_m[:, None] >= start_n + offs_n[None, :])\n", "")]),
    "forward_ragged_keys_counted": ("offsets", "flash_attention_forward", [(
        "keep = cols[None, :] < N", "keep = cols[None, :] >= 0")]),
    "forward_ragged_loads_unmasked": ("offsets", "flash_attention_forward", [
        (", mask=cols[:, None] < N, other=0.0)\n        v = ", ")\n        v = "),
        (", mask=cols[:, None] < N, other=0.0)\n        s = ", ")\n        s = "),
        ("keep = cols[None, :] < N", "keep = cols[None, :] >= 0")]),
    "forward_scale_twice": ("offsets", "flash_attention_forward", [(
        "s = tl.dot(q, tl.trans(k)) * scale", "s = tl.dot(q * scale, tl.trans(k)) * scale")]),
    "forward_scale_missing": ("offsets", "flash_attention_forward", [(
        "s = tl.dot(q, tl.trans(k)) * scale", "s = tl.dot(q, tl.trans(k))")]),
    "forward_scale_argument_ignored": ("offsets", "flash_attention_forward", [(
        "    if scale is None:\n        scale = 1.0 / math.sqrt(d)", "    scale = 1.0 / math.sqrt(d)")]),
    # FlashAttention-2 backward
    "backward_D_from_P_of_one_key_tile": ("offsets", "flash_attention_backward", [(
        "ds = p * (dp - delta[:, None])\n        dk +=", "ds = p * (dp - tl.sum(p * dp, axis=1)[:, None])\n        dk +=")]),
    "backward_dq_scaled_twice": ("offsets", "flash_attention_backward", [(
        "dq += tl.dot(ds.to(k.dtype), k)", "dq += tl.dot((ds * scale).to(k.dtype), k)")]),
    "backward_dk_missing_scale": ("offsets", "flash_attention_backward", [(
        "    dk = dk * scale\n", "")]),
    "backward_dk_dv_swapped": ("offsets", "flash_attention_backward", [(
        "    return dq, dk, dv", "    return dq, dv, dk")]),
    "backward_p_without_lse": ("offsets", "flash_attention_backward", [(
        "p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)  # (BLOCK_M, BLOCK_N)",
        "p = tl.where(keep, tl.exp(s), 0.0)  # (BLOCK_M, BLOCK_N)")]),
    "backward_atomic_dq_unscaled": ("tutorial", "flash_attention_backward", [(
        "k.to(tl.float32)) * sm_scale", "k.to(tl.float32))")]),
    # autograd.Function
    "function_three_gradients": ("offsets", "flash_attention", [(
        "return (*grads, None, None)", "return grads")]),
    "function_backward_forgets_causal": ("offsets", "flash_attention", [(
        "causal=ctx.causal,\n", "\n")]),
    # flash-decoding
    "partials_split_floor": ("offsets", "flash_decoding_partials", [(
        "split_len = triton.cdiv(N, num_splits)", "split_len = N // num_splits")]),
    "partials_lse_without_max": ("offsets", "flash_decoding_partials", [(
        "m + tl.log(l))", "tl.log(l))")]),
    "combine_average": ("offsets", "combine_partials", [(
        "o = tl.sum(w[:, None] * o_s, axis=0) / total", "o = tl.sum(o_s, axis=0) / num_splits")]),
    "combine_not_shifted": ("offsets", "combine_partials", [
        ("w = tl.exp(lse_s - m) ", "w = tl.exp(lse_s) "), ("lse = m + tl.log(total)", "lse = tl.log(total)")]),
    # paged decoding
    "paged_logical_as_physical": ("offsets", "paged_decoding", [(
        "physical = tl.load(block_table_ptr + b * max_blocks + logical)", "physical = logical")]),
    "paged_table_row_of_sequence_0": ("offsets", "paged_decoding", [(
        "block_table_ptr + b * max_blocks + logical", "block_table_ptr + logical")]),
    "paged_div_mod_swapped": ("tutorial", "paged_decoding", [
        ("max_num_blocks_per_seq + token_idx // BLOCK_SIZE)", "max_num_blocks_per_seq + token_idx % BLOCK_SIZE)"),
        ("block_offset = token_idx % BLOCK_SIZE", "block_offset = token_idx // BLOCK_SIZE")]),
    "paged_slots_past_seq_len": ("offsets", "paged_decoding", [(
        "valid = t < seq_len", "valid = slots < BLOCK_SIZE")]),
    # memory: right values, an N x N tensor
    "forward_scores_buffer": ("offsets", "flash_attention_forward", [
        ("def fa_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, scale,",
         "def fa_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, s_ptr, N, scale,"),
        ('        s = tl.where(keep, s, float("-inf"))\n',
         '        s = tl.where(keep, s, float("-inf"))\n'
         "        tl.store(s_ptr + z * N * N + rows[:, None] * N + cols[None, :], s,\n"
         "                 mask=(rows[:, None] < N) & (cols[None, :] < N))  # kept to look at\n"),
        ("    grid = (triton.cdiv(N, block_m), B * H)\n",
         "    scores = torch.empty((B, H, N, N), dtype=torch.float32, device=q.device)\n"
         "    grid = (triton.cdiv(N, block_m), B * H)\n"),
        ("(q, k, v, o, lse, N, scale,", "(q, k, v, o, lse, scores, N, scale,")]),
    "function_saves_probabilities": ("offsets", "flash_attention", [
        ("        ctx.save_for_backward(q, k, v, out, logsumexp)    # the logsumexp: all the backward needs of P\n",
         "        p = torch.exp(q @ k.transpose(-2, -1) * (scale or q.shape[-1] ** -0.5) - logsumexp[..., None])\n"
         "        ctx.save_for_backward(q, k, v, out, logsumexp, p)   # P too, for a backward that might want it\n"),
        ("flash_attention_backward(*ctx.saved_tensors,", "flash_attention_backward(*ctx.saved_tensors[:5],")]),
}


# The tests each mistake loses, with words their message must contain. FORWARD_ALL: every forward test
# sees a causal call or a ragged N or the logsumexp.
FWD = "flash_attention_forward"
BWD = "flash_attention_backward"


def lose(exercise: str, words: str, *having: str) -> dict:
    return {t: words for t in exercise_tests(exercise, *having)}


LOSSES = {
    "softmax_max_not_subtracted": lose("softmax", "subtract the row's maximum", "large"),
    # the strided test models only rows read as contiguous: the lanes' mistake there is "values differ"
    "softmax_masked_lanes_zero": {**lose("softmax", "-inf"), "test_softmax_strided_rows": "values differ"},
    "online_l_not_rescaled": lose("online_softmax_states", "not rescaled"),
    "online_m_of_block_only": lose("online_softmax_states", "current block only"),
    # future keys scored 0 is no model's mistake: named where the ragged keys show it (tiles 16 x 32 in values)
    "forward_masked_scores_zero": {**lose(FWD, "differ from the reference"), **lose(FWD, "-inf", "values", "ragged")},
    "forward_lse_without_max": lose(FWD, "without the maximum"),
    "forward_lse_in_log2": lose(FWD, "base 2"),
    "forward_causal_strict": lose(FWD, "hides the diagonal", "causal", "ragged", "float16"),
    "forward_causal_one_tile_short": lose(FWD, "one tile early", "causal", "ragged", "float16"),
    "forward_diagonal_tile_unmasked": lose(FWD, "diagonal tile was not masked", "causal", "ragged", "float16"),
    "forward_ragged_keys_counted": lose(FWD, "keys past N", "values", "ragged", "float16"),
    # the spec names the ragged tile read unmasked (here the next head's keys, or past the tensor)
    "forward_ragged_loads_unmasked": {**lose(FWD, "from the reference", "values", "float16"),
                                      **lose(FWD, "keys past N", "ragged")},
    "forward_scale_twice": lose(FWD, "scaled twice"),
    "forward_scale_missing": lose(FWD, "not scaled"),
    "forward_scale_argument_ignored": lose(FWD, "scale argument was ignored", "values", "causal"),
    # D as the sum over one key tile of P * dP: not the model's rowsum of P, so dk is only "wrong"
    "backward_D_from_P_of_one_key_tile": lose(BWD, "`dk` differs"),
    "backward_dq_scaled_twice": lose(BWD, "dq was scaled twice"),
    "backward_dk_missing_scale": lose(BWD, "dk"),
    "backward_dk_dv_swapped": lose(BWD, "swapped"),
    "backward_p_without_lse": lose(BWD, "differ from the reference"),
    "backward_atomic_dq_unscaled": lose(BWD, "dq"),
    "function_three_gradients": lose("flash_attention", "incorrect number of gradients", "gradients"),
    "function_backward_forgets_causal": lose("flash_attention", "differs from the reference", "gradients"),
    "partials_split_floor": lose("flash_decoding_partials", "rounded down"),
    "partials_lse_without_max": lose("flash_decoding_partials", "lse"),
    "combine_average": lose("combine_partials", "averaged"),
    "combine_not_shifted": lose("combine_partials", "overflowed", "stability"),
    "paged_logical_as_physical": lose("paged_decoding", "logical block j was read as the physical block"),
    "paged_table_row_of_sequence_0": lose("paged_decoding", "values differ"),
    "paged_div_mod_swapped": lose("paged_decoding", "did not run"),
    "paged_slots_past_seq_len": lose("paged_decoding", "slots past seq_lens[b]"),
    "forward_scores_buffer": {"test_flash_attention_forward_values": "N x N elements"},
    # P computed with torch in forward: the kernel-only rule takes the exercise before the saved sizes count
    "function_saves_probabilities": lose("flash_attention", "outside a kernel"),
}

# ------------------------------------------------------------------ computing outside the kernels
# Right values, computed by torch or numpy in the wrapper, or by torch inside a kernel's body (which
# runs only under the interpreter): the kernel-only rule must name each, on every test of its exercise.
CHEATS = {
    "cheat_softmax_by_torch": ("softmax", '''
@triton.jit
def softmax_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def softmax(x):
    y = torch.softmax(x.float(), dim=-1).to(x.dtype)
    softmax_kernel[(1,)](y, y.numel(), BLOCK=16)          # a kernel launched, for the look of it
    return y
'''),
    "cheat_forward_by_torch": ("flash_attention_forward", '''
@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype)
    o = torch.empty_like(out)
    copy_kernel[(triton.cdiv(o.numel(), 1024),)](out, o, o.numel(), BLOCK=1024)
    return o, lse
'''),
    "cheat_kernel_body_calls_torch": ("combine_partials", '''
_HANDED = {}


@triton.jit
def combine_kernel(o_ptr, lse_ptr):
    # under the interpreter a kernel is Python: torch runs here, on no GPU ever
    w = torch.softmax(_HANDED["lse_part"], dim=-1)
    _HANDED["o"].copy_((w[..., None] * _HANDED["o_part"]).sum(-2))
    _HANDED["lse"].copy_(torch.logsumexp(_HANDED["lse_part"], dim=-1))


def combine_partials(o_part, lse_part):
    B, H, S, d = o_part.shape
    o = torch.empty((B, H, d), dtype=torch.float32)
    lse = torch.empty((B, H), dtype=torch.float32)
    _HANDED.update(o_part=o_part, lse_part=lse_part, o=o, lse=lse)
    combine_kernel[(1,)](o, lse)
    return o, lse
'''),
    "cheat_numpy_in_wrapper": ("online_softmax_states", '''
import numpy as np


@triton.jit
def touch_kernel(m_ptr):
    tl.store(m_ptr, tl.load(m_ptr))


def online_softmax_states(x, block_size):
    a = x.numpy()
    ends = [min(e, a.shape[1]) for e in range(block_size, a.shape[1] + block_size, block_size)]
    m = np.stack([a[:, :e].max(1) for e in ends], 1)
    l = np.stack([np.exp(a[:, :e] - m[:, [i]]).sum(1) for i, e in enumerate(ends)], 1)
    m, l = torch.from_numpy(m.astype(np.float32)), torch.from_numpy(l.astype(np.float32))
    touch_kernel[(1,)](m)
    return m, l
'''),
}

CHEAT_WORDS = "kernel"


def mistaken(style: str, exercise: str, edits) -> str:
    cell = STYLES[style][exercise]
    for old, new in edits:
        cell = replaced(cell, old, new)
    return cell


# A mistake is graded beside every other exercise left as its stub (``others_stubbed``): its own tests
# lose what they lose beside the reference (each test of another exercise runs the reference through the
# stand-ins), and the interpreter runs only that exercise's kernels: a whole notebook takes far longer.
# The first two mistakes are also graded beside the reference's answers, to see them cost nothing else.
EXERCISES = set(INFO.exercises)
MISTAKES, INDEPENDENT = {}, {}
for _name, (_style, _exercise, _edits) in EDITS.items():
    if _exercise in EXERCISES:
        INDEPENDENT[_name] = others_stubbed(CHAPTER, {_exercise: mistaken(_style, _exercise, _edits)},
                                            LOSSES[_name])
for _name, (_exercise, _cell) in CHEATS.items():
    if _exercise in EXERCISES:
        INDEPENDENT[_name] = others_stubbed(CHAPTER, {_exercise: _cell}, lose(_exercise, CHEAT_WORDS))
for _name in ("softmax_masked_lanes_zero", "forward_causal_strict"):
    _style, _exercise, _edits = EDITS[_name]
    MISTAKES[f"with_reference:{_name}"] = (sub({_exercise: mistaken(_style, _exercise, _edits)}), LOSSES[_name])

# ------------------------------------------------------------------ tampering (stubs + tricks: 0 points)
TAMPERING_AFTER_STUBS = {
    # every wrapper the built-in way, after its stub: the kernel-only rule gives nothing for it
    "torch_after_stubs": ["def softmax(x):\n    return torch.softmax(x.float(), -1).to(x.dtype)\n"],
}

CATALOG = Catalog(CHAPTER, correct=CORRECT, mistakes=MISTAKES, independent=INDEPENDENT,
                  tampering={**common_tampering(CHAPTER),
                             **{k: tampered(CHAPTER, after_stubs=v) for k, v in TAMPERING_AFTER_STUBS.items()}},
                  kernel_only={k for k in ("paged_div_mod_swapped",) if k in INDEPENDENT})


# Cases the grader gets wrong: (kind of case, name) -> why. Strict: a case that starts passing fails here
# until it is taken out. None today (drafts/ch10/catalog/NOTES.md has the ones fixed and how).
KNOWN_GRADER_BUGS: dict[tuple[str, str], str] = {}


class TestCatalog(CatalogTests):
    catalog = CATALOG

    @pytest.fixture(autouse=True)
    def _known_grader_bugs(self, request):
        for kind in ("correct", "mistake", "tamper", "disguised", "sample"):
            if f"{kind}_case" in request.fixturenames:
                reason = KNOWN_GRADER_BUGS.get((kind, request.getfixturevalue(f"{kind}_case")))
                if reason:
                    request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
