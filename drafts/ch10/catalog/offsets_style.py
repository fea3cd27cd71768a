"""Chapter 10's catalog, correct style 1: plain offsets (the base every mistake changes).

One answer cell per exercise, as a learner types it: the kernels and the wrapper. Pointers built
from offsets and the strides the wrapper passes, tuple grids, ``tl.exp`` in natural units, the
backward in three kernels (D on its own, dK/dV per key tile, dQ per query tile), paged decoding
loading one whole block of the cache at a time, the combine in one kernel over all splits.
"""

SOFTMAX = '''
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

ONLINE_SOFTMAX_STATES = '''
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

FLASH_ATTENTION_FORWARD = '''
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

FLASH_ATTENTION_BACKWARD = '''
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

FLASH_ATTENTION = '''
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

FLASH_DECODING_PARTIALS = '''
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

COMBINE_PARTIALS = '''
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

PAGED_DECODING = '''
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

ANSWERS = {
    "softmax": SOFTMAX,
    "online_softmax_states": ONLINE_SOFTMAX_STATES,
    "flash_attention_forward": FLASH_ATTENTION_FORWARD,
    "flash_attention_backward": FLASH_ATTENTION_BACKWARD,
    "flash_attention": FLASH_ATTENTION,
    "flash_decoding_partials": FLASH_DECODING_PARTIALS,
    "combine_partials": COMBINE_PARTIALS,
    "paged_decoding": PAGED_DECODING,
}
