"""Chapter 10's catalog, correct style 2: as Triton's own tutorials write kernels (triton 3.9).

Triton 3.9 removed ``tl.make_block_ptr``/``tl.advance`` ("Block pointers have been removed in
favor of the tensor descriptor API"), so the tutorials' block loads are ``tl.make_tensor_descriptor``
(3-D, ``[batch x head, N, d]`` with ``[1, BLOCK, d]`` blocks: the interpreter bounds-checks and
zero-pads them; a descriptor's strides must be multiples of 16 bytes, so the softmax and the
logsumexps, whose rows may be any length, keep pointers). Scores prescaled by ``scale * log2(e)``
and ``tl.exp2`` (FlashAttention-2's and the tutorial's trick), the logsumexp turned back into
natural log at the end; a persistent softmax (each program strides over rows); online states in
a ``while`` loop; the backward in one kernel per key tile, ``D`` computed inside it, dQ by
``tl.atomic_add`` into a float32 buffer; wrappers that call ``.contiguous()`` and let the kernels
compute offsets from the shapes; grids as lambdas of ``META``; paged decoding one key at a time;
the combine as a running merge over the splits.
"""

SOFTMAX = '''
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

ONLINE_SOFTMAX_STATES = '''
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

FLASH_ATTENTION_FORWARD = '''
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

FLASH_ATTENTION_BACKWARD = '''
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

FLASH_ATTENTION = '''
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

FLASH_DECODING_PARTIALS = '''
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

COMBINE_PARTIALS = '''
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

PAGED_DECODING = '''
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
