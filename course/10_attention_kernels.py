# %% [markdown]
# # Chapter 10: The attention kernel, written in Triton
#
# Chapter 6 explained why FlashAttention saves memory: it cuts the queries and keys into
# tiles, streams the keys and values past each tile of queries and keeps only a running
# maximum, a running sum and a running output per query (the online softmax), so the
# $N \times N$ matrix of scores never exists. But the tiled attention written there was a
# Python loop over tiles, slower than the naive version it replaced. What makes
# FlashAttention fast is that the whole loop runs inside one **kernel**, a function that
# thousands of GPU programs execute at once, each keeping its tile in fast on-chip memory.
# This chapter writes that kernel, forward and backward, in **Triton** (Tillet, Kung and
# Cox, 2019), a Python-embedded language in which a program operates on whole blocks of
# numbers and the compiler decides how the threads of a GPU share them. It is the
# assignment that Stanford's CS336 sets (FlashAttention-2 in Triton), which needs an NVIDIA
# GPU. Here it runs everywhere: with `TRITON_INTERPRET=1`, Triton's interpreter executes
# the same kernels on a CPU with numpy, slowly but exactly, so you can write, test and be
# graded on the real kernel on a laptop.
#
# **Learning goals.** After this chapter you can
#
# - write a Triton kernel and its launcher: programs and their ids, blocks of offsets,
#   masks for the ragged edge, loads and stores, and a grid computed by the wrapper;
# - compute a softmax row by row in a kernel, without overflow, and the online softmax
#   one block of columns at a time, keeping only a running maximum and sum;
# - write FlashAttention-2's forward kernel: one program per tile of queries, keys and
#   values streamed in tiles, float32 accumulation, the logsumexp written, the causal
#   tiles above the diagonal skipped, any sequence length;
# - derive and write its backward: $D = \mathrm{rowsum}(dO \circ O)$, the probabilities
#   recomputed from the logsumexp, dK and dV per key tile, dQ per query tile;
# - wrap both in a `torch.autograd.Function` that keeps only $q, k, v, o$ and the
#   logsumexp for the backward, and say how much memory that saves;
# - write the decoding kernels (flash-decoding and the combine of its partial results,
#   and paged decoding through Chapter 8's block table), and place attention on a
#   roofline.
#
# **Prerequisites.** Chapter 6 (tiling and the online softmax) and Chapter 8 (the
# key/value cache and its pages). No GPU: the interpreter needs only the `triton` package,
# which is installed with the course on Linux. On **macOS or Windows** there is no
# `triton` wheel: use Colab (its PyTorch comes with Triton) or a Linux machine (WSL 2 on
# Windows).
#
# **Time.** About 4 hours. The interpreter is slow (Section 1 measures how slow), so each
# test runs on small shapes; the whole notebook runs in about 1 minute.
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `softmax(x)` | row-wise softmax, one program per row, the max subtracted | ★ | 3 |
# | `online_softmax_states(x, block_size)` | the online softmax's running maximum and sum after each block | ★★ | 2 |
# | `flash_attention_forward(q, k, v, causal, scale, block_m, block_n)` | FlashAttention-2's forward: output and logsumexp | ★★★ | 5 |
# | `flash_attention_backward(q, k, v, o, lse, do, ...)` | its backward: dQ, dK, dV from the saved logsumexp | ★★★ | 4 |
# | `flash_attention(q, k, v, causal=False, scale=None)` | both as a `torch.autograd.Function` | ★ | 2 |
# | `flash_decoding_partials(q, k, v, num_splits, ...)` | one query against a long cache, split across programs | ★★ | 3 |
# | `combine_partials(o_part, lse_part)` | the splits' partial results combined by their logsumexps | ★ | 3 |
# | `paged_decoding(q, k_cache, v_cache, block_table, seq_lens)` | decoding through Chapter 8's block table | ★★ | 4 |
#
# Every exercise is a small Python **wrapper** that allocates its outputs, computes a
# launch grid and launches `@triton.jit` kernels that you write in the same cell. The
# wrapper itself computes nothing: arithmetic on tensors in a wrapper (a `torch.exp`, a
# matrix product, a `softmax`) earns no points, and the grader says so.

# %% [export]
import math
import os

import torch

if not torch.cuda.is_available():  # no GPU: Triton's interpreter runs the kernels on the CPU, with numpy
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton
import triton.language as tl

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# %% [hidden]
import math
import types

import torch
import torch.nn.functional as F

from autograder.hidden import HiddenTests, Mistake
from autograder.judge.compare import close


# The reference the judge compares with: plain PyTorch in float32, computed in a process that never ran
# submitted code (the chapter's Triton kernels are the learner's to write; under the interpreter they would
# only be slower copies of these).
def _scale(d, scale):
    return 1.0 / math.sqrt(d) if scale is None else scale


def _hide_above(n, m, allowed):
    """(n, m) bool, True where query i may NOT see key j; ``allowed(i, j)`` the keys it may see."""
    i = torch.arange(n)[:, None]
    j = torch.arange(m)[None, :]
    return ~allowed(i, j)


def _scores(q, k, causal=False, scale=None, allowed=None):
    """float32 scores (..., N, N): scale * q k^T, -inf where causal hides j > i (or where ``allowed`` says)."""
    s = (q.float() @ k.float().transpose(-1, -2)) * _scale(q.size(-1), scale)
    if causal or allowed is not None:
        rule = allowed or (lambda i, j: j <= i)
        s = s.masked_fill(_hide_above(s.size(-2), s.size(-1), rule), float("-inf"))
    return s


def _attend(s, v, dtype):
    return (torch.softmax(s, -1) @ v.float()).to(dtype), torch.logsumexp(s, -1)


def softmax(x):
    return torch.softmax(x.float(), -1).to(x.dtype)


def softmax_of_columns(x, start, stop):
    return softmax(x[:, start:stop])


def _block_ends(C, block_size):
    return [min((b + 1) * block_size, C) for b in range((C + block_size - 1) // block_size)]


def online_softmax_states(x, block_size):
    x = x.float()
    ends = _block_ends(x.size(1), block_size)
    m = torch.stack([x[:, :e].amax(-1) for e in ends], -1)
    l = torch.stack([torch.exp(x[:, :e] - m[:, b:b + 1]).sum(-1) for b, e in enumerate(ends)], -1)
    return m, l


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    return _attend(_scores(q, k, causal, scale), v, q.dtype)


def _naive_gradients(q, k, v, do, causal=False, scale=None):
    with torch.enable_grad():          # a stand-in answers inside the learner's backward, where grad is off
        q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
        o = torch.softmax(_scores(q, k, causal, scale), -1) @ v
        o.backward(do.float())
    return q.grad, k.grad, v.grad


def flash_attention_backward(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
    return tuple(g.to(q.dtype) for g in _naive_gradients(q, k, v, do, causal, scale))


def flash_attention(q, k, v, causal=False, scale=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * _scale(q.size(-1), scale)
    if causal:
        s = s.masked_fill(_hide_above(s.size(-2), s.size(-1), lambda i, j: j <= i), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def saved_numels(q, k, v, causal=False, scale=None):
    B, H, N, d = q.shape
    return torch.tensor(sorted([q.numel(), k.numel(), v.numel(), q.numel(), B * H * N]))


def _split_bounds(N, num_splits):
    L = -(-N // num_splits)
    return [(s * L, min((s + 1) * L, N)) for s in range(num_splits)]


def _decode_scores(q, k, scale=None):
    """(B, H, N) scores of one query per head."""
    return torch.einsum("bhd,bhnd->bhn", q.float(), k.float()) * _scale(q.size(-1), scale)


def flash_decoding_partials(q, k, v, num_splits, scale=None, block_n=16, bounds=None):
    s = _decode_scores(q, k, scale)
    parts = bounds(k.size(2), num_splits) if bounds else _split_bounds(k.size(2), num_splits)
    o = torch.stack([torch.einsum("bhn,bhnd->bhd", s[..., a:b].softmax(-1), v[:, :, a:b].float())
                     for a, b in parts], dim=2)
    lse = torch.stack([s[..., a:b].logsumexp(-1) for a, b in parts], dim=-1)
    return o, lse


def combine_partials(o_part, lse_part):
    lse = torch.logsumexp(lse_part.float(), -1)
    weights = torch.exp(lse_part.float() - lse[..., None])                    # (B, H, S)
    return (weights[..., None] * o_part.float()).sum(2), lse


def _gathered(k_cache, block_table, seq_len, b, physical=None, slot=None):
    """(H, L, d): sequence b's keys (or values) gathered with torch."""
    bs = k_cache.size(2)
    t = torch.arange(int(seq_len))
    blocks = block_table[b, t // bs].long() if physical is None else physical(block_table, b, t, bs)
    slots = t % bs if slot is None else slot(t, bs)
    return k_cache[blocks, :, slots].transpose(0, 1)


def paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale=None, lengths=None, **gather):
    out = []
    for b in range(q.size(0)):
        n = int(seq_lens[b]) if lengths is None else lengths(seq_lens, b, k_cache.size(2))
        k = _gathered(k_cache, block_table, n, b, **gather).float()
        v = _gathered(v_cache, block_table, n, b, **gather).float()
        w = torch.softmax(torch.einsum("hd,hld->hl", q[b].float(), k) * _scale(q.size(-1), scale), -1)
        out.append(torch.einsum("hl,hld->hd", w, v))
    return torch.stack(out).to(q.dtype)


REFERENCE = types.SimpleNamespace(
    softmax=softmax, softmax_of_columns=softmax_of_columns, online_softmax_states=online_softmax_states,
    flash_attention_forward=flash_attention_forward, flash_attention_backward=flash_attention_backward,
    flash_attention=flash_attention, saved_numels=saved_numels, flash_decoding_partials=flash_decoding_partials,
    combine_partials=combine_partials, paged_decoding=paged_decoding)
KERNEL_ONLY = {"softmax", "online_softmax_states", "flash_attention_forward", "flash_attention_backward",
               "flash_attention", "flash_decoding_partials", "combine_partials", "paged_decoding"}
hidden = HiddenTests(REFERENCE, kernel_only=KERNEL_ONLY)


def within(atol, rtol):
    """An ``equivalent`` rule for half-precision results: same shapes and dtypes, values within (atol, rtol)."""
    def rule(student, expected):
        if isinstance(expected, tuple):
            return (isinstance(student, (tuple, list)) and len(student) == len(expected)
                    and all(rule(s, e) for s, e in zip(student, expected)))
        if not (isinstance(student, torch.Tensor) and isinstance(expected, torch.Tensor)):
            return False
        if student.shape != expected.shape or student.dtype != expected.dtype:
            return False
        if not student.is_floating_point() or student.dtype in (torch.float32, torch.float64):
            return close(student, expected)
        return bool(torch.allclose(student.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=True))
    return rule


HALF = within(3e-3, 3e-3)

# %%
import time

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

try:                      # MyST-NB puts numbers computed here into the book's prose
    from myst_nb import glue
except ImportError:       # in plain Jupyter: just show them
    def glue(name, value, display=True):
        print(f"{name} = {value}")

plt.rcParams["axes.unicode_minus"] = False
torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)   # the interpreter runs one program at a time: more threads would only make timings noisy

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# ## 1. How Triton runs here
#
# A Triton kernel is a Python function decorated with `@triton.jit`. It is not called
# like a function but **launched** over a grid: `kernel[grid](arguments)` starts one
# **program** per point of the grid, and every program runs the same code. A program
# learns which one it is from `tl.program_id(axis)` and uses that to pick its part of the
# data. Inside, it does not handle one number at a time, as a CUDA thread does, but a
# **block**: `tl.arange(0, BLOCK)` is the vector $0, 1, \dots, \text{BLOCK}-1$, and adding
# it to an offset gives the addresses of `BLOCK` neighbouring elements. Block sizes are
# compile-time constants (`tl.constexpr`) and powers of two.
#
# Tensors arrive in the kernel as **pointers** to their first element; the kernel computes
# addresses itself from the shapes and strides it is given. `tl.load(ptr + offsets,
# mask=..., other=...)` reads a block, `tl.store(ptr + offsets, values, mask=...)` writes
# one. The **mask** is a block of booleans that says which lanes are real: when the data's
# length is not a multiple of the block, the last program's block runs past the end, and
# the masked lanes are neither read (they get `other`) nor written.
#
# Here is the smallest kernel: the sum of two vectors, one block of 1,024 elements per
# program, and its wrapper, which allocates the output, computes the grid with
# `triton.cdiv` (division rounded up) and launches.

# %%
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)   # this program's block of indices
    inside = offsets < n                                        # the last block is ragged
    x = tl.load(x_ptr + offsets, mask=inside)
    y = tl.load(y_ptr + offsets, mask=inside)
    tl.store(out_ptr + offsets, x + y, mask=inside)


def add(x, y, block=1024):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out


add_x, add_y = torch.randn(10_000), torch.randn(10_000)
assert torch.equal(add(add_x, add_y), add_x + add_y), "the kernel's sum differs from torch's"
add_programs = triton.cdiv(add_x.numel(), 1024)
add(add_x, add_y)                                   # the first launch also parses the kernel
add_start = time.perf_counter()
for _ in range(10):
    add(add_x, add_y)
add_ms = (time.perf_counter() - add_start) / 10 * 1000
add_big_start = time.perf_counter()
add(torch.randn(1_000_000), torch.randn(1_000_000))
add_big_ms = (time.perf_counter() - add_big_start) * 1000
add_torch_start = time.perf_counter()
for _ in range(10):
    add_x + add_y
add_torch_ms = (time.perf_counter() - add_torch_start) / 10 * 1000
print(f"interpreter: {add_programs} programs of 1,024 lanes, {add_ms:.2f} ms a launch "
      f"({add_ms / add_programs:.2f} ms a program); torch: {add_torch_ms:.3f} ms")
print(f"a million elements, {triton.cdiv(1_000_000, 1024)} programs: {add_big_ms:.0f} ms")
glue("add_programs", f"{add_programs}", display=False)
glue("add_ms", f"{add_ms:.1f}", display=False)
glue("add_program_ms", f"{add_ms / add_programs:.2f}", display=False)
glue("add_torch_ms", f"{add_torch_ms:.3f}", display=False)
glue("add_big_ms", f"{add_big_ms:.0f}", display=False)

# %% [markdown]
# On a GPU, the compiler turns the kernel into machine code and the programs run in
# parallel on the streaming multiprocessors. There is no GPU here: the export cell set
# `TRITON_INTERPRET=1`, and Triton's **interpreter** runs the kernel instead. It compiles
# nothing. It runs the programs one after the other, and in each it executes every block
# operation (`tl.load`, `+`, `tl.store`, `tl.dot`, ...) as a numpy call on arrays of the
# block's shape. Adding {glue:text}`add_programs` blocks takes {glue:text}`add_ms` ms,
# {glue:text}`add_program_ms` ms a program, where torch adds the same vectors in
# {glue:text}`add_torch_ms` ms; a million elements take {glue:text}`add_big_ms` ms. The
# cost is per operation and per program, almost independent of the block's size, so the
# interpreter shows whether a kernel is **correct**, never whether it is fast. Every
# timing in this chapter measures the interpreter; what a GPU does with the same kernels
# is the subject of the roofline section.

# %% [markdown]
# ## 2. A first kernel: softmax, one row per program
#
# The softmax of a row $x \in \mathbb{R}^C$ is $y_j = e^{x_j} / \sum_c e^{x_c}$. In
# float32, $e^{x}$ overflows to infinity as soon as $x > 88.7$, and a row with one entry
# of $10^4$ gives $\infty / \infty = \mathrm{NaN}$. Since
# $e^{x_j - m} / \sum_c e^{x_c - m}$ is the same number for any $m$, every softmax
# subtracts the row's maximum first: then the largest exponent is $e^0 = 1$ and nothing
# overflows.

# %%
overflow_row = torch.tensor([[1.0e4, 0.0, -1.0e4]])
overflow_naive = torch.exp(overflow_row) / torch.exp(overflow_row).sum(-1, keepdim=True)
print("without the max:", overflow_naive.tolist())
print("with the max:   ", torch.softmax(overflow_row, -1).tolist())
print(f"largest float32 exponent that does not overflow: {math.log(torch.finfo(torch.float32).max):.1f}")

# %% [markdown]
# A softmax kernel gives each row its own program: a grid of `(R,)` for `R` rows. Program
# `r` loads its row as one block of `BLOCK = triton.next_power_of_2(C)` lanes, reduces it
# with `tl.max` and `tl.sum` (a reduction over a block's axis), computes `tl.exp` and
# stores the row. The lanes past `C` must not change the maximum or the sum: load them
# with `other=float("-inf")`, whose exponential is 0. The rows need not be next to each
# other in memory: `x[:, 3:60]` of a wider tensor has rows `x.stride(0)` elements apart,
# so the kernel takes the row stride as an argument. Compute in float32 (`.to(tl.float32)`
# after the load) and store in the output's dtype (`y_ptr.dtype.element_ty`).
#
# ### Exercise: `softmax`

# %% [exercise softmax]
@triton.jit
def softmax_kernel(x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols, BLOCK: tl.constexpr):
    # Program r of an (R,) grid: row r of x into row r of y. A suggested signature: change it as
    # you like, with the launch in the wrapper.
    ### BEGIN SOLUTION
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))                   # the largest is exp(0) = 1: no overflow
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    ### END SOLUTION


def softmax(x):
    """Row-wise softmax computed by a Triton kernel, one program per row.

    x: (R, C) float32 or float16, 1 <= C <= 4096, x.stride(1) == 1; rows may be strided
    (x.stride(0) >= C, a column slice of a wider tensor).
    Returns a new (R, C) tensor in x's dtype: softmax over each row, computed in float32
    with the row's maximum subtracted, so that entries of +-1e4 do not overflow. The
    wrapper only allocates, computes the grid and launches.
    """
    ### BEGIN SOLUTION
    R, C = x.shape
    y = torch.empty((R, C), dtype=x.dtype, device=x.device)
    softmax_kernel[(R,)](x, y, x.stride(0), y.stride(0), C, BLOCK=triton.next_power_of_2(C))
    return y
    ### END SOLUTION


# %% [export tags=hide-input]
def softmax_of_columns(x, start, stop):
    """Given, for the grader: softmax of the column slice x[:, start:stop], a view whose rows are
    x.stride(0) elements apart (a test's inputs reach your kernel contiguous otherwise)."""
    return softmax(x[:, start:stop])


# %% [test test_softmax_values points=1]
"""Rows of random numbers, C not a power of two: equal to torch.softmax, each row summing to 1."""
torch.manual_seed(0)
sv_x = torch.randn(7, 50, device=DEVICE)
sv_y = softmax(sv_x)
assert sv_y.shape == (7, 50) and sv_y.dtype == torch.float32, \
    f"the softmax of a (7, 50) float32 tensor is (7, 50) float32, got {tuple(sv_y.shape)} {sv_y.dtype}"
assert torch.allclose(sv_y.sum(-1), torch.ones(7, device=DEVICE), atol=1e-5), \
    "a row does not sum to 1: the lanes past C (50 of a block of 64) must be loaded as -inf, whose exp is 0"
assert torch.allclose(sv_y, torch.softmax(sv_x, -1), atol=1e-6), \
    "differs from torch.softmax: divide each row's exponentials by that row's own sum"
sv_one = softmax(torch.randn(3, 1, device=DEVICE))
assert torch.allclose(sv_one, torch.ones(3, 1, device=DEVICE)), "a row of one column has softmax 1"

# %% [test test_softmax_strided_rows points=1]
"""A column slice of a wider tensor: rows x.stride(0) apart, and float16 in, float16 out."""
torch.manual_seed(1)
ss_wide = torch.randn(5, 80, device=DEVICE)
ss_x = ss_wide[:, 3:60]                                  # (5, 57), rows 80 elements apart
ss_y = softmax(ss_x)
assert ss_y.shape == (5, 57), f"the softmax of a (5, 57) slice is (5, 57), got {tuple(ss_y.shape)}"
assert torch.allclose(ss_y, torch.softmax(ss_x, -1), atol=1e-6), \
    "wrong on a column slice: row r starts at x_ptr + r * x.stride(0), not at r * C"
ss_half = softmax(ss_x.half())
assert ss_half.dtype == torch.float16, f"the output is in the input's dtype (float16), got {ss_half.dtype}"
assert torch.allclose(ss_half.float(), torch.softmax(ss_x, -1), atol=2e-3), \
    "float16 rows are wrong: compute in float32 (.to(tl.float32) after the load), store in the output's dtype"

# %% [test test_softmax_large_entries points=1]
"""Entries of +-1e4 do not overflow: the row's maximum is subtracted before exp."""
sl_x = torch.tensor([[1.0e4, 0.0, -1.0e4], [5.0e3, 5.0e3, -3.0e3]], device=DEVICE)
sl_y = softmax(sl_x)
assert not torch.isnan(sl_y).any(), \
    "NaN for entries of 1e4: exp(1e4) overflows to inf in float32; subtract the row's maximum (tl.max) first"
assert torch.allclose(sl_y, torch.softmax(sl_x, -1), atol=1e-6), \
    "rows with large entries differ from torch.softmax: subtract the maximum of the row, then exp"

# %% [hidden]
def _softmax_padded_with_zeros(x):
    """The lanes past C loaded as 0 (not -inf): each of them adds exp(0 - max) to the row's sum."""
    C = x.size(1)
    pad = max(1, 1 << (C - 1).bit_length()) - C
    z = torch.cat([x.float(), torch.zeros(x.size(0), pad)], 1)
    return torch.softmax(z, -1)[:, :C].to(x.dtype)


def _softmax_without_max(x):
    e = torch.exp(x.float())
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def _softmax_rows_contiguous(x, start, stop):
    """Row r read at r * C from the slice's start, as if the rows were contiguous."""
    R, C = x.size(0), stop - start
    flat = x.reshape(-1)[start:start + R * C].reshape(R, C)
    return softmax(flat)


def _softmax_over_columns(x):
    return torch.softmax(x.float(), 0).to(x.dtype)


SOFTMAX_MISTAKES = [
    Mistake("the lanes past C were loaded as 0, not -inf: each adds exp(0 - max) to the sum; load them with "
            "other=float(\"-inf\")", _softmax_padded_with_zeros),
    Mistake("the softmax runs over the columns of the tensor (its first axis): one program normalises one row",
            _softmax_over_columns),
]


@hidden.test("test_softmax_values")
def _(t):
    P = dict(mistakes=SOFTMAX_MISTAKES)
    t.function("softmax", t.randn(7, 50), label="(7, 50): C not a power of two", **P)
    t.function("softmax", t.randn(3, 64) * 3, label="(3, 64): C a power of two", **P)
    t.function("softmax", t.randn(4, 1), label="one column", **P)
    t.function("softmax", t.randn(2, 1000), label="(2, 1000)", **P)
    t.function("softmax", t.randn(1, 4096), label="C = 4,096", **P)


@hidden.test("test_softmax_strided_rows")
def _(t):
    M = dict(mistakes=[Mistake("the rows were read as if contiguous (row r at r * C): row r starts x.stride(0) "
                               "elements after row r - 1; pass the row stride to the kernel",
                               _softmax_rows_contiguous)])
    t.function("softmax_of_columns", t.randn(5, 80), 3, 60, label="a (5, 57) column slice of a (5, 80) tensor", **M)
    t.function("softmax_of_columns", t.randn(3, 40), 0, 17, label="the first 17 of 40 columns", **M)
    t.function("softmax_of_columns", t.randn(4, 70, dtype=torch.float16), 5, 38, equivalent=HALF,
               label="float16, a column slice", **M)
    t.function("softmax", t.randn(6, 33, dtype=torch.float16), equivalent=HALF, label="float16 in, float16 out",
               mistakes=SOFTMAX_MISTAKES)


@hidden.test("test_softmax_large_entries")
def _(t):
    M = dict(mistakes=[Mistake("exp overflowed on large entries: subtract the row's maximum (tl.max) before exp",
                               _softmax_without_max)] + SOFTMAX_MISTAKES)
    big = t.randn(3, 40) * 3000
    big[0, 5] = 1.0e4
    t.function("softmax", big, label="(3, 40), entries up to 1e4", **M)
    t.function("softmax", torch.tensor([[1.0e4, 0.0, -1.0e4], [5.0e3, 5.0e3, -3.0e3]]), label="1e4 and -1e4", **M)
    t.function("softmax", -2000 + t.randn(2, 25), label="every entry near -2,000 (exp underflows without the max)",
               **M)

# %% [markdown]
# ## 3. The online softmax, one block at a time
#
# The softmax above holds a whole row in one block. An attention row has one score per
# key, as many as there are tokens, and FlashAttention never holds them all: it sees the
# scores one tile of keys at a time. The **online softmax** (Milakov and Gimelshein, 2018)
# computes the normaliser in that one pass. After the first $b$ blocks of the row it keeps
#
# $$m_b = \max_{j < bB} x_j, \qquad \ell_b = \sum_{j < bB} e^{x_j - m_b},$$
#
# for blocks of $B$ columns. The next block $x^{(b)}$ changes the maximum to
# $m_{b+1} = \max(m_b, \max x^{(b)})$, and the old sum, computed against the old maximum,
# is rescaled before the new terms are added:
#
# $$\ell_{b+1} = \ell_b\, e^{m_b - m_{b+1}} + \sum_{j \in \text{block } b} e^{x_j - m_{b+1}}.$$
#
# At the end $m + \log \ell = \log \sum_j e^{x_j}$, the row's **logsumexp**: exactly what
# the attention kernel saves for its backward. At the start $m_0 = -\infty$ and
# $\ell_0 = 0$, and $e^{-\infty} = 0$ makes the first update need no special case.
#
# ### Exercise: `online_softmax_states`
#
# Write the update as a kernel that returns the state after every block: for a row of
# 70 columns and blocks of 16, five states, the last one over a ragged block of 6. One
# program can take one row, or a tile of rows with a vector `m` and `l` of one entry per
# row, as the attention kernel will (a scalar state is `tl.full((), float("-inf"),
# tl.float32)`; a vector one `tl.full((BLOCK_R,), ...)`). A `for b in range(0, n_blocks)`
# loop inside a kernel runs the blocks in order; store the state after each.

# %% [exercise online_softmax_states]
@triton.jit
def online_softmax_kernel(x_ptr, m_ptr, l_ptr, n_rows, n_cols, n_blocks,
                          BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
    # Program i of a (ceil(R / BLOCK_R),) grid: rows i * BLOCK_R to i * BLOCK_R + BLOCK_R - 1, one pass over
    # their columns in blocks of BLOCK. A suggested signature: change it as you like.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


def online_softmax_states(x, block_size):
    """The online softmax's running state after each block of columns, computed by a kernel.

    x: (R, C) float32; block_size: a power of two >= 16.
    Returns (m, l), both (R, n_b) float32 with n_b = ceil(C / block_size):
    m[:, b] = max(x[:, :(b + 1) * block_size]) and
    l[:, b] = sum of exp(x[:, j] - m[:, b]) over those columns (the last block ragged),
    so that m[:, -1] + log(l[:, -1]) is each row's logsumexp.
    """
    ### BEGIN SOLUTION
    R, C = x.shape
    x = x.contiguous()
    n_blocks = triton.cdiv(C, block_size)
    m = torch.empty((R, n_blocks), dtype=torch.float32, device=x.device)
    l = torch.empty((R, n_blocks), dtype=torch.float32, device=x.device)
    online_softmax_kernel[(triton.cdiv(R, 16),)](x, m, l, R, C, n_blocks, BLOCK_R=16, BLOCK=block_size)
    return m, l
    ### END SOLUTION


# %% [test test_online_softmax_states_values points=1]
"""Each state: the maximum and the sum over the columns seen so far (70 columns, blocks of 16, the last ragged)."""
torch.manual_seed(2)
os_x = torch.randn(3, 70, device=DEVICE) * 3
os_m, os_l = online_softmax_states(os_x, 16)
assert os_m.shape == (3, 5) and os_l.shape == (3, 5), \
    f"70 columns in blocks of 16 give ceil(70 / 16) = 5 states per row; got m {tuple(os_m.shape)}, l {tuple(os_l.shape)}"
for os_b in range(5):
    os_seen = os_x[:, :(os_b + 1) * 16]
    os_want_m = os_seen.max(-1).values
    assert torch.allclose(os_m[:, os_b], os_want_m), \
        f"m after block {os_b} is not the maximum of the first {os_seen.shape[1]} columns: m_new = max(m, max of the block)"
    assert torch.allclose(os_l[:, os_b], torch.exp(os_seen - os_want_m[:, None]).sum(-1), rtol=1e-5), \
        f"l after block {os_b} is wrong: rescale the old sum by exp(m_old - m_new) before adding the block's " \
        "exp(x - m_new), and count no column past C (load them as -inf)"

# %% [test test_online_softmax_states_logsumexp points=1]
"""m + log(l) of the last state is the row's logsumexp, for a block that covers the row and for large entries."""
ol_x = torch.tensor([[1.0e4, 0.0, -1.0e4] + [0.0] * 30, [-50.0] * 33], device=DEVICE)
ol_m, ol_l = online_softmax_states(ol_x, 16)
assert torch.isfinite(ol_l).all(), "l overflowed: every exponent is x - m_new <= 0, never x itself"
assert torch.allclose(ol_m[:, -1] + torch.log(ol_l[:, -1]), torch.logsumexp(ol_x, -1)), \
    "m + log(l) of the last block is not the row's logsumexp: check the rescaling by exp(m_old - m_new)"
ol_one_m, ol_one_l = online_softmax_states(ol_x, 64)
assert ol_one_m.shape == (2, 1), f"one block of 64 covers 33 columns: one state per row, got {tuple(ol_one_m.shape)}"
assert torch.allclose(ol_one_m[:, 0] + torch.log(ol_one_l[:, 0]), torch.logsumexp(ol_x, -1)), \
    "with one block the state is the plain max and sum of the row"

# %% [hidden]
def _states(x, block_size, rescale=True, block_max_only=False, pad_with_zeros=False, exp_of_x=False):
    """The online update, block by block, with one step replaceable."""
    x = x.float()
    R, C = x.shape
    if pad_with_zeros:
        n = len(_block_ends(C, block_size)) * block_size
        x = torch.cat([x, torch.zeros(R, n - C)], 1)
        C = n
    m = torch.full((R,), float("-inf"))
    l = torch.zeros(R)
    ms, ls = [], []
    for start in range(0, C, block_size):
        block = x[:, start:start + block_size]
        m_new = block.amax(-1) if block_max_only else torch.maximum(m, block.amax(-1))
        terms = torch.exp(block).sum(-1) if exp_of_x else torch.exp(block - m_new[:, None]).sum(-1)
        l = (l * torch.exp(m - m_new) if rescale else l) + terms
        m = m_new
        ms.append(m)
        ls.append(l)
    return torch.stack(ms, -1), torch.stack(ls, -1)


def _states_with(**wrong):
    return lambda x, block_size: _states(x, block_size, **wrong)


STATES_MISTAKES = [
    Mistake("l was not rescaled when the maximum grew: l_new = l * exp(m_old - m_new) + sum(exp(x - m_new))",
            _states_with(rescale=False)),
    Mistake("m is the maximum of the current block only: the running maximum is max(m_old, max of the block)",
            _states_with(block_max_only=True)),
    Mistake("the columns past C were counted as 0 in the last block: load them as -inf (exp(-inf) = 0)",
            _states_with(pad_with_zeros=True)),
    Mistake("l sums exp(x), not exp(x - m): the exponent must be x - m_new, at most 0",
            _states_with(exp_of_x=True)),
]


@hidden.test("test_online_softmax_states_values")
def _(t):
    P = dict(mistakes=STATES_MISTAKES, returns=("m", "l"))
    t.function("online_softmax_states", t.randn(3, 70) * 3, 16, label="(3, 70), blocks of 16, the last ragged", **P)
    t.function("online_softmax_states", torch.arange(40.0).reshape(1, 40) / 4, 16,
               label="an increasing row: the maximum grows at every block", **P)
    t.function("online_softmax_states", t.randn(2, 64), 32, label="(2, 64), blocks of 32, none ragged", **P)
    t.function("online_softmax_states", t.randn(17, 50) * 2, 16, label="17 rows, 50 columns", **P)
    t.function("online_softmax_states", t.randn(2, 20), 64, label="one block wider than the row", **P)


@hidden.test("test_online_softmax_states_logsumexp")
def _(t):
    P = dict(mistakes=STATES_MISTAKES, returns=("m", "l"))
    big = t.randn(2, 33) * 10
    big[0, 20] = 1.0e4
    big[1, 2] = -1.0e4
    t.function("online_softmax_states", big, 16, label="entries of +-1e4", **P)
    t.function("online_softmax_states", -60 + t.randn(2, 48), 16, label="every entry near -60", **P)

# %% [markdown]
# The figure follows one row of 128 scores through blocks of 16: the running maximum
# steps up whenever a block holds a larger score. The sum grows with every block, except
# where the maximum steps up far enough: then every earlier term is rescaled by
# $e^{m_\text{old} - m_\text{new}} < 1$ and the sum can fall. The last state gives the
# row's logsumexp.

# %% [tags=hide-input]
def draw_online_softmax():
    """One row's scores and the online softmax's state (m, l) after each block of 16."""
    text = {
        "title_m": "the running maximum m after each block",
        "title_l": "the running sum l (against the current m)",
        "x": "column j", "block": "blocks seen", "scores": "scores x_j", "m": "m",
        "l": "l", "lse": "m + log l = logsumexp",
    }
    gen = torch.Generator().manual_seed(3)
    row = torch.randn(1, 128, generator=gen) * 2 + torch.linspace(0, 3, 128)
    m, l = online_softmax_states(row, 16)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax.plot(range(128), row[0].tolist(), ".", color="#888888", label=text["scores"])
    edges = [16 * (b + 1) for b in range(m.shape[1])]
    ax.step([0] + edges, [m[0, 0].item()] + m[0].tolist(), where="pre", color="#c0392b", label=text["m"])
    for e in edges[:-1]:
        ax.axvline(e, color="#dddddd", lw=0.8, zorder=0)
    ax.set_xlabel(text["x"])
    ax.set_title(text["title_m"], fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    bx.plot(range(1, m.shape[1] + 1), l[0].tolist(), "o-", color="#2e86c1", label=text["l"])
    bx.set_xlabel(text["block"])
    bx.set_title(text["title_l"], fontsize=10)
    lse = (m[0, -1] + torch.log(l[0, -1])).item()
    bx.text(0.02, 0.92, f"{text['lse']} = {lse:.3f}", transform=bx.transAxes, fontsize=9)
    bx.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


draw_online_softmax()
plt.show()

# %% [markdown]
# ## 4. FlashAttention-2's forward kernel
#
# Attention for one (batch, head) computes, for every query $i$,
#
# $$o_i = \sum_j \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}\, v_j, \qquad s_{ij} = \text{scale}\cdot q_i \cdot k_j,
# \qquad \mathrm{lse}_i = \log \sum_j e^{s_{ij}},$$
#
# with $q, k, v$ of shape $(N, d)$ and scale $= 1/\sqrt{d}$. FlashAttention (Dao et al.,
# 2022) computes it without the $N \times N$ matrix $S$; FlashAttention-2 (Dao, 2023)
# arranges the work so that each program owns a tile of **queries**: program
# $(i, bh)$ loads the queries $i \cdot B_m, \dots, (i+1) B_m - 1$ of head $bh$ once, then
# loops over the keys and values in tiles of $B_n$. For each key tile it computes the
# $(B_m, B_n)$ scores with `tl.dot`, updates the online softmax of each of its $B_m$ rows
# (Section 3, now with a vector `m` and `l` of $B_m$ entries), rescales its running output
# `acc` $(B_m, d)$ by $e^{m_\text{old} - m_\text{new}}$ and adds $P\,V$ of the tile. Only
# at the end does it divide by $\ell$ and write $o$ and $\mathrm{lse} = m + \log \ell$.
# Nothing it holds grows with $N$.
#
# With the **causal** mask, query $i$ sees only keys $j \le i$. A key tile that starts
# after the query tile's last row is hidden from all its rows: the loop simply stops
# before it. That skips almost half of the tiles, which is what makes a causal kernel
# about twice as fast. Only the tiles that the diagonal crosses need the mask
# `cols <= rows` inside.

# %% [tags=hide-input]
def draw_forward_tiles(n_tiles=6, program=3):
    """The (N, N) scores cut into tiles: one program's row of tiles, streamed; causal tiles skipped."""
    text = {
        "title": "one program = one tile of queries; key/value tiles streamed left to right",
        "title_causal": "causal: tiles above the diagonal are skipped, the diagonal ones masked",
        "queries": "query tiles (B_m rows each)", "keys": "key / value tiles (B_n columns each)",
        "program": "program i", "skipped": "skipped", "masked": "masked inside", "full": "computed",
    }
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for ax, causal in zip(axes, (False, True)):
        ax.set_xlim(-1.6, n_tiles + 0.3)
        ax.set_ylim(n_tiles + 0.3, -0.8)
        ax.axis("off")
        for r in range(n_tiles):
            for c in range(n_tiles):
                if causal and c > r:
                    fc, hatch = "#f2f2f2", None
                elif causal and c == r:
                    fc, hatch = "#fde9c9", "///"
                else:
                    fc, hatch = "#dbe9f6", None
                if r == program and not (causal and c > r):
                    fc = "#f5b7b1" if not (causal and c == r) else "#f5cba7"
                ax.add_patch(Rectangle((c, r), 1, 1, fc=fc, ec="#555555", hatch=hatch, lw=0.8))
        ax.add_patch(Rectangle((0, program), n_tiles if not causal else program + 1, 1, fill=False, ec="#c0392b", lw=2.5))
        last = n_tiles if not causal else program + 1
        ax.add_patch(FancyArrowPatch((0.2, program + 1.35), (last - 0.2, program + 1.35), arrowstyle="-|>",
                                     mutation_scale=14, color="#c0392b"))
        ax.text(-0.2, program + 0.5, text["program"], ha="right", va="center", fontsize=9, color="#c0392b")
        ax.text(n_tiles / 2, -0.4, text["keys"], ha="center", fontsize=9)
        ax.text(-1.5, n_tiles / 2 - 1.2, text["queries"], rotation=90, va="center", fontsize=9)
        if causal:
            ax.text(n_tiles - 1.5, 1.5, text["skipped"], ha="center", fontsize=10, color="#777777")
        ax.set_title(text["title_causal" if causal else "title"], fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, fc="#dbe9f6", ec="#555555"),
               Rectangle((0, 0), 1, 1, fc="#fde9c9", ec="#555555", hatch="///"),
               Rectangle((0, 0), 1, 1, fc="#f2f2f2", ec="#555555")]
    fig.legend(handles, [text["full"], text["masked"], text["skipped"]], loc="lower center", ncol=3, fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


draw_forward_tiles()
plt.show()

# %% [markdown]
# ### Exercise: `flash_attention_forward`
#
# The grid is `(triton.cdiv(N, block_m), B * H)`. With `q`, `k`, `v` contiguous, head
# `bh`'s row `t` starts `(bh * N + t) * d` elements after the tensor's start, so a tile of
# rows `rows = start + tl.arange(0, BLOCK)` and the head dimension `dims = tl.arange(0, D)`
# give the block of addresses `(bh * N + rows)[:, None] * D + dims[None, :]`. Three things
# decide whether the kernel is right:
#
# - **Ragged tiles.** When $N$ is not a multiple of the tile, rows and columns past $N$
#   are loaded with `mask=..., other=0.0`, and the scores of keys past $N$ set to `-inf`
#   (`tl.where`), or they would count $e^0 = 1$ each. Query rows past $N$ are computed
#   and not stored.
# - **Float32.** `tl.dot` of two float16 tiles returns float32: keep the scores, `m`, `l`
#   and `acc` in float32, and cast `p` to the values' dtype only for the product `P V`
#   (as the tensor cores want). The output is stored in `q`'s dtype, `lse` in float32.
# - **Causal.** Stop the key loop at `min(N, (i + 1) * block_m)` and mask `cols <= rows`.
#   A row never meets a tile in which all its keys are hidden before it has seen key 0,
#   so `m` is finite after the first tile and $e^{-\infty - m} = 0$ handles the rest.
#
# :::{dropdown} Hint: the inner loop
# ```
# s = tl.dot(q, tl.trans(k)) * scale                 # (BLOCK_M, BLOCK_N) float32
# s = tl.where(keep, s, float("-inf"))
# m_new = tl.maximum(m, tl.max(s, axis=1))
# p = tl.exp(s - m_new[:, None])
# alpha = tl.exp(m - m_new)
# l = l * alpha + tl.sum(p, axis=1)
# acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
# m = m_new
# ```
# :::

# %% [exercise flash_attention_forward]
@triton.jit
def flash_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, N, scale,
                         D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Program (i, bh) of a (cdiv(N, BLOCK_M), B * H) grid: query tile i of head bh, all its key tiles
    # (or those up to the diagonal). A suggested signature: change it as you like.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


def flash_attention_forward(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    """FlashAttention-2's forward pass, computed by a Triton kernel.

    q, k, v: (B, H, N, d) contiguous, float32 or float16, d in {16, 32, 64, 128}; any N >= 1.
    causal: query i attends to keys j <= i only. scale: None means 1 / sqrt(d).
    block_m, block_n: queries and keys per tile, powers of two >= 16; they never change the result.
    Returns (o, lse): o (B, H, N, d) in q's dtype, o_i = sum_j softmax_j(scale q_i . k_j) v_j;
    lse (B, H, N) float32, lse_i = log sum_j exp(scale q_i . k_j). One program per
    (query tile, batch x head); no tensor of N x N elements is allocated.
    """
    ### BEGIN SOLUTION
    B, H, N, d = q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(N, block_m), B * H)
    flash_forward_kernel[grid](q, k, v, o, lse, N, scale, D=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal)
    return o, lse
    ### END SOLUTION


# %% [markdown]
# The tests compare your kernel with the naive attention below, written in torch and
# computed in float32: every score materialised, then `softmax` and `logsumexp`.

# %% [export]
def naive_attention(q, k, v, causal=False, scale=None):
    """softmax(scale q k^T) v and the scores' logsumexp, in float32, with the (N, N) scores materialised."""
    N, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (q.float() @ k.float().transpose(-1, -2)) * scale                  # (B, H, N, N)
    if causal:
        s = s.masked_fill(torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.float(), torch.logsumexp(s, -1)


# %% [test test_flash_attention_forward_values points=2]
"""Output and logsumexp equal naive attention (N = 32, d = 16, two heads), and tile sizes do not change them."""
torch.manual_seed(4)
fv_q, fv_k, fv_v = (torch.randn(1, 2, 32, 16, device=DEVICE) for _ in range(3))
fv_o, fv_lse = flash_attention_forward(fv_q, fv_k, fv_v)
fv_want_o, fv_want_lse = naive_attention(fv_q, fv_k, fv_v)
assert fv_o.shape == (1, 2, 32, 16) and fv_lse.shape == (1, 2, 32), \
    f"o is (B, H, N, d) = (1, 2, 32, 16) and lse (B, H, N) = (1, 2, 32); got {tuple(fv_o.shape)}, {tuple(fv_lse.shape)}"
assert fv_lse.dtype == torch.float32, f"lse is float32, got {fv_lse.dtype}"
assert torch.allclose(fv_lse, fv_want_lse, atol=1e-5), \
    "lse differs from logsumexp of the scaled scores: it is m + log(l), natural log, with the maximum added back"
assert torch.allclose(fv_o, fv_want_o, atol=1e-5), \
    "o differs from naive attention: rescale acc and l by exp(m_old - m_new) at each key tile, divide by l at the end"
fv_o2, fv_lse2 = flash_attention_forward(fv_q, fv_k, fv_v, block_m=32, block_n=16)
assert torch.allclose(fv_o2, fv_want_o, atol=1e-5) and torch.allclose(fv_lse2, fv_want_lse, atol=1e-5), \
    "block_m=32 gives another result: the tile sizes must only change how the work is cut"
fv_o3, _ = flash_attention_forward(fv_q, fv_k, fv_v, scale=0.5)
assert torch.allclose(fv_o3, naive_attention(fv_q, fv_k, fv_v, scale=0.5)[0], atol=1e-5), \
    "scale=0.5 is not used: the scores are scale * q . k, and scale=None means 1 / sqrt(d)"

# %% [test test_flash_attention_forward_causal points=1]
"""Causal: query i sees keys j <= i only, for tiles of 16 x 16 and 16 x 32."""
torch.manual_seed(5)
fc_q, fc_k, fc_v = (torch.randn(1, 1, 48, 16, device=DEVICE) for _ in range(3))
fc_want_o, fc_want_lse = naive_attention(fc_q, fc_k, fc_v, causal=True)
for fc_bm, fc_bn in ((16, 16), (16, 32)):
    fc_o, fc_lse = flash_attention_forward(fc_q, fc_k, fc_v, causal=True, block_m=fc_bm, block_n=fc_bn)
    assert torch.allclose(fc_o[..., 0, :], fc_v[..., 0, :], atol=1e-5), \
        "query 0 of a causal attention sees key 0 only: its output is v_0"
    assert torch.allclose(fc_lse, fc_want_lse, atol=1e-5), \
        f"causal lse wrong with tiles {fc_bm} x {fc_bn}: mask cols <= rows inside the diagonal tiles and stop " \
        "the key loop after the query tile's last row, (i + 1) * block_m, not before"
    assert torch.allclose(fc_o, fc_want_o, atol=1e-5), \
        f"causal output wrong with tiles {fc_bm} x {fc_bn}: keys j > i must get the score -inf"

# %% [test test_flash_attention_forward_ragged points=1]
"""N = 37 and N = 5, not multiples of the tile: the last query and key tiles are masked."""
torch.manual_seed(6)
for fr_n, fr_causal in ((37, False), (37, True), (5, False)):
    fr_qkv = torch.randn(3, 2, 1, fr_n, 32, device=DEVICE)          # q, k, v stacked
    fr_o, fr_lse = flash_attention_forward(*fr_qkv, causal=fr_causal)
    assert torch.isfinite(fr_o).all(), f"N={fr_n}: NaN or inf in o: a row whose scores are all -inf divides 0 by 0"
    fr_want_o, fr_want_lse = naive_attention(*fr_qkv, causal=fr_causal)
    assert torch.allclose(fr_lse, fr_want_lse, atol=1e-5), \
        f"N={fr_n}, causal={fr_causal}: lse too large: the keys past N must get the score -inf, " \
        "not the 0 that a masked load gives them"
    assert torch.allclose(fr_o, fr_want_o, atol=1e-5), \
        f"N={fr_n}, causal={fr_causal}: o wrong in the ragged tile: load rows past N with a mask and store with one"

# %% [test test_flash_attention_forward_float16 points=1]
"""float16 inputs: o in float16, lse in float32, both computed in float32 inside the kernel."""
torch.manual_seed(7)
fh_q, fh_k, fh_v = (torch.randn(1, 2, 40, 64, device=DEVICE).half() for _ in range(3))
fh_o, fh_lse = flash_attention_forward(fh_q, fh_k, fh_v, causal=True)
fh_want_o, fh_want_lse = naive_attention(fh_q, fh_k, fh_v, causal=True)
assert fh_o.dtype == torch.float16 and fh_lse.dtype == torch.float32, \
    f"o is in q's dtype (float16) and lse float32; got {fh_o.dtype} and {fh_lse.dtype}"
assert torch.allclose(fh_lse, fh_want_lse, atol=1e-3), \
    "float16 lse wrong: keep the scores, m and l in float32 (tl.dot of float16 tiles returns float32)"
assert torch.allclose(fh_o.float(), fh_want_o, atol=2e-3), \
    "float16 output too far from the float32 reference: accumulate acc in float32, cast only when storing"

# %% [hidden]
def _online_attention(q, k, v, causal=False, scale=None, block_m=16, block_n=16, allowed=None, rescale=True,
                      normalise=True, ragged_scores_zero=False, lse_of=None):
    """FlashAttention's loop over key tiles in torch, with one step replaceable (float32)."""
    N, M = q.size(-2), k.size(-2)
    s = _scores(q, k, causal, scale, allowed)
    if ragged_scores_zero:          # the keys past N of the last tile: loaded as 0 and not masked, score 0
        pad = -(-M // block_n) * block_n - M
        s = torch.cat([s, torch.zeros(*s.shape[:-1], pad)], -1)
        if causal:
            s[..., M:] = torch.where(torch.arange(N)[:, None] >= torch.arange(M, M + pad)[None, :], 0.0,
                                     float("-inf"))
        v = torch.cat([v.float(), torch.zeros(*v.shape[:-2], pad, v.size(-1))], -2)
    m = torch.full(s.shape[:-1], float("-inf"))
    l = torch.zeros(s.shape[:-1])
    acc = torch.zeros(*s.shape[:-1], v.size(-1))
    for start in range(0, s.size(-1), block_n):
        tile = s[..., start:start + block_n]
        m_new = torch.maximum(m, tile.amax(-1))
        alpha = torch.exp(torch.where(torch.isinf(m) & torch.isinf(m_new), 0.0, m - m_new))
        p = torch.exp(tile - torch.where(torch.isinf(m_new), 0.0, m_new)[..., None])
        l = l * alpha + p.sum(-1)
        acc = (acc * alpha[..., None] if rescale else acc) + p @ v[..., start:start + block_n, :].float()
        m = m_new
    o = acc / l[..., None] if normalise else acc
    lse = m + torch.log(l) if lse_of is None else lse_of(m, l)
    return o.to(q.dtype), lse


def _forward_with(**wrong):
    def compute(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        return _online_attention(q, k, v, causal, scale, block_m, block_n, **wrong)
    return compute


def _forward_scaled(times):
    """The scores scaled ``times`` times (0: no scale; 2: twice)."""
    def compute(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        return _attend(_scores(q, k, causal, _scale(q.size(-1), scale) ** times), v, q.dtype)
    return compute


def _forward_default_scale(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    return _attend(_scores(q, k, causal), v, q.dtype)


def _forward_lse_unscaled(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    o, _ = _attend(_scores(q, k, causal, scale), v, q.dtype)
    return o, torch.logsumexp(_scores(q, k, causal, 1.0), -1)


def _forward_causal(rule):
    def compute(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
        if not causal:
            return _attend(_scores(q, k, False, scale), v, q.dtype)
        return _attend(_scores(q, k, scale=scale, allowed=rule(block_m)), v, q.dtype)
    return compute


def _forward_not_causal(q, k, v, causal=False, scale=None, block_m=16, block_n=16):
    return _attend(_scores(q, k, False, scale), v, q.dtype)


FORWARD_MISTAKES = [
    Mistake("lse is log(l) without the maximum: it is m + log(l)",
            _forward_with(lse_of=lambda m, l: torch.log(l))),
    Mistake("lse is in base 2: with exp2 and scores times log2(e), convert back: lse = (m + log2(l)) * ln(2)",
            _forward_with(lse_of=lambda m, l: (m + torch.log(l)) / math.log(2))),
    Mistake("the output was not divided by l at the end: o = acc / l", _forward_with(normalise=False)),
    Mistake("acc was not rescaled by exp(m_old - m_new) when the maximum grew", _forward_with(rescale=False)),
    Mistake("the scores were scaled twice (the scale applied to q and again to q . k)", _forward_scaled(2)),
    Mistake("the scores were not scaled: they are scale * q . k with scale = 1 / sqrt(d) by default",
            _forward_scaled(0)),
    Mistake("the scale argument was ignored: 1 / sqrt(d) is only the default, when scale is None",
            _forward_default_scale),
    Mistake("lse is the logsumexp of the unscaled scores: save the logsumexp of scale * q . k, the scores the "
            "softmax used", _forward_lse_unscaled),
    Mistake("the keys past N in the last tile were loaded as 0 and scored 0, not -inf: mask cols >= N in the "
            "scores", _forward_with(ragged_scores_zero=True)),
]
CAUSAL_MISTAKES = [
    Mistake("causal=True was ignored: query i sees keys j <= i only", _forward_not_causal),
    Mistake("the causal mask hides the diagonal: query i sees keys j <= i, itself included",
            _forward_causal(lambda bm: lambda i, j: j < i)),
    Mistake("the diagonal tile was not masked: inside the query tile's last key tile, keys j > i must get -inf",
            _forward_causal(lambda bm: lambda i, j: j < (i // bm + 1) * bm)),
    Mistake("the key loop stops one tile early: it runs to the end of the query tile, (i + 1) * block_m, "
            "the diagonal tile included", _forward_causal(lambda bm: lambda i, j: j < (i // bm) * bm)),
]


def _qkv(t, *shape, dtype=torch.float32):
    return tuple(t.randn(*shape, dtype=dtype) for _ in range(3))


FORWARD = dict(mistakes=FORWARD_MISTAKES + CAUSAL_MISTAKES, returns=("o", "lse"))
LONG_N = 2048          # one head: its (N, N) float32 scores would be 16 MiB


@hidden.test("test_flash_attention_forward_values",
             max_memory=(8 * 2**20, "flash_attention_forward used more than 8 MiB at N = 2,048 (one head of 16): "
                                    "a tensor of N x N elements was allocated; keep only tiles"))
def _(t):
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 32, 16), label="(1, 2, 32, 16)", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 2, 1, 64, 32), block_m=32, block_n=16,
               label="(2, 1, 64, 32), tiles 32 x 16", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 48, 16), block_m=16, block_n=32,
               label="tiles 16 x 32", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 32, 16), scale=0.3, label="scale=0.3", **FORWARD)
    t.function("flash_attention_forward", *(x * 3 for x in _qkv(t, 1, 1, 64, 16)), label="large scores", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 16, 128), label="d = 128", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, LONG_N, 16), block_m=128, block_n=128,
               label="N = 2,048, tiles of 128", **FORWARD)


@hidden.test("test_flash_attention_forward_causal")
def _(t):
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 48, 16), causal=True, label="causal, 48, tiles 16", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 64, 16), causal=True, block_m=32, block_n=16,
               label="causal, tiles 32 x 16", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 64, 32), causal=True, block_m=16, block_n=32,
               label="causal, tiles 16 x 32", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 2, 1, 32, 16), causal=True, scale=0.7,
               label="causal, scale=0.7", **FORWARD)


def _ragged_keys_read_unmasked(probe, value):
    """Hint: the outputs of every head but the last are attention over its N keys and the next head's first
    keys up to the end of the last tile, as unmasked loads of contiguous q, k, v read them (the last head's
    tile runs past the tensor, into memory nobody can model)."""
    q, k, v = probe.args[:3]
    B, H, N, d = q.shape
    block_n = probe.kwargs.get("block_n", 16)
    end = -(-N // block_n) * block_n
    if probe.kwargs.get("causal") or end == N or B * H < 2 or not isinstance(value, (tuple, list)):
        return None
    k_rows, v_rows = k.reshape(B * H * N, d).float(), v.reshape(B * H * N, d).float()   # (B*H*N, d)
    o = value[0].reshape(B * H, N, d)
    for z in range(B * H - 1):
        keys, values = k_rows[z * N:z * N + end], v_rows[z * N:z * N + end]            # (end, d): past N too
        s = q.reshape(B * H, N, d)[z].float() @ keys.T * _scale(d, probe.kwargs.get("scale"))
        if not close(o[z].float(), torch.softmax(s, -1) @ values):
            return None
    return ("the keys past N in the last tile were read unmasked (here the next head's keys): mask the loads of "
            "k and v and the scores at cols >= N")


@hidden.test("test_flash_attention_forward_ragged")
def _(t):
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 37, 32), label="N = 37",
               checks=[_ragged_keys_read_unmasked], **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 37, 16), causal=True, label="N = 37, causal", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 2, 1, 5, 16), label="N = 5, smaller than a tile", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 1, 16), causal=True, label="N = 1", **FORWARD)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 70, 16), block_m=32, block_n=32, causal=True,
               label="N = 70, tiles 32, causal", **FORWARD)


@hidden.test("test_flash_attention_forward_float16")
def _(t):
    H = dict(FORWARD, equivalent=HALF)
    t.function("flash_attention_forward", *_qkv(t, 1, 2, 40, 64, dtype=torch.float16), causal=True,
               label="float16, causal, N = 40, d = 64", **H)
    t.function("flash_attention_forward", *_qkv(t, 1, 1, 33, 16, dtype=torch.float16),
               label="float16, N = 33", **H)

# %% [markdown]
# ### How far from the naive attention, and how slow here
#
# The cell below runs the kernel at the chapter's shape, two heads of $d = 64$ and
# $N = 100$ (not a multiple of any tile), with and without the causal mask, and times one
# launch under the interpreter for square tiles of 16, 32 and 64 at $N = 128$.

# %%
def max_error(a, b):
    return (a.float() - b.float()).abs().max().item()


torch.manual_seed(8)
chapter_q, chapter_k, chapter_v = (torch.randn(1, 2, 100, 64, device=DEVICE) for _ in range(3))
forward_errors = {}
for causal in (False, True):
    o, lse = flash_attention_forward(chapter_q, chapter_k, chapter_v, causal=causal, block_m=32, block_n=32)
    want_o, want_lse = naive_attention(chapter_q, chapter_k, chapter_v, causal=causal)
    forward_errors[causal] = (max_error(o, want_o), max_error(lse, want_lse))
    print(f"causal={causal!s:5}  max |o - naive| = {forward_errors[causal][0]:.1e}   "
          f"max |lse - naive| = {forward_errors[causal][1]:.1e}")
glue("fwd_error_o", f"{max(e[0] for e in forward_errors.values()):.1e}", display=False)
glue("fwd_error_lse", f"{max(e[1] for e in forward_errors.values()):.1e}", display=False)

time_q, time_k, time_v = (torch.randn(1, 1, 128, 64, device=DEVICE) for _ in range(3))
launch_seconds = {}
for tile in (16, 32, 64):
    flash_attention_forward(time_q, time_k, time_v, block_m=tile, block_n=tile)     # parsed once
    start = time.perf_counter()
    flash_attention_forward(time_q, time_k, time_v, block_m=tile, block_n=tile)
    launch_seconds[tile] = time.perf_counter() - start
    steps = triton.cdiv(128, tile) ** 2
    print(f"tiles {tile:2d} x {tile:2d}: {steps:3d} tile steps, {launch_seconds[tile] * 1000:6.0f} ms a launch, "
          f"{launch_seconds[tile] / steps * 1000:5.1f} ms a step")
launch_ms = {tile: seconds * 1000 for tile, seconds in launch_seconds.items()}
glue("launch_ms_16", f"{launch_ms[16]:.0f}", display=False)
glue("step_ms_16", f"{launch_ms[16] / 64:.1f}", display=False)   # 8 x 8 tile steps
glue("launch_ms_32", f"{launch_ms[32]:.0f}", display=False)
glue("launch_ms_64", f"{launch_ms[64]:.0f}", display=False)
glue("step_ms_64", f"{launch_ms[64] / 4:.1f}", display=False)    # 2 x 2 tile steps

# %% [markdown]
# The kernel agrees with naive attention to {glue:text}`fwd_error_o` in the output and
# {glue:text}`fwd_error_lse` in the logsumexp: float32 rounding, summed in another order.
# Under the interpreter one launch at $N = 128$ takes {glue:text}`launch_ms_16` ms with
# tiles of 16 (64 tile steps, {glue:text}`step_ms_16` ms each), {glue:text}`launch_ms_32`
# ms with tiles of 32 and {glue:text}`launch_ms_64` ms with tiles of 64 (4 steps,
# {glue:text}`step_ms_64` ms each). A step costs about the same whatever its size, since
# the interpreter pays per numpy call, so larger tiles are faster here for a reason that
# has nothing to do with a GPU. On a GPU the best tile is the largest whose $q$, $k$, $v$
# and `acc` fit in a multiprocessor's registers and shared memory, typically 64 to 128
# rows; these timings cannot tell you that, and they are not meant to.
#
# ### Memory: what the naive attention needs and what the kernel allocates
#
# The point of the kernel is what it does not allocate. Naive attention at $N = 4{,}096$
# materialises the scores $S$ and the probabilities $P$, each $N \times N$ float32 per
# head; the kernel allocates only its output and the logsumexp. The cell computes both
# from the shapes, for one sequence of 16 heads of $d = 64$ in float16.

# %%
def naive_attention_bytes(batch, heads, n, d, element=2):
    """Scores and probabilities (N, N) in float32 per head, plus the output, as the naive version holds them."""
    return batch * heads * (2 * n * n * 4 + n * d * element)


def flash_forward_allocated_bytes(batch, heads, n, d, element=2):
    """What flash_attention_forward allocates: o in the input's dtype and lse in float32."""
    return batch * heads * (n * d * element + n * 4)


memory_shape = dict(batch=1, heads=16, n=4096, d=64)
naive_mib = naive_attention_bytes(**memory_shape) / 2**20
flash_mib = flash_forward_allocated_bytes(**memory_shape) / 2**20
print(f"N = 4,096, 16 heads of 64, float16: naive {naive_mib:,.0f} MiB, kernel {flash_mib:.2f} MiB "
      f"({naive_mib / flash_mib:,.0f} times less)")
glue("naive_mib", f"{naive_mib:,.0f}", display=False)
glue("flash_mib", f"{flash_mib:.2f}", display=False)
glue("memory_ratio", f"{naive_mib / flash_mib:,.0f}", display=False)

# %% [markdown]
# The naive version needs {glue:text}`naive_mib` MiB for one sequence of 4,096 tokens, the
# kernel {glue:text}`flash_mib` MiB, {glue:text}`memory_ratio` times less, and the ratio
# grows linearly with $N$. The grader checks this property on your kernel: it measures the
# memory one call uses at a long $N$ and refuses any tensor of $N \times N$ elements.

# %% [markdown]
# ## 5. The backward pass
#
# Let $dO = \partial L / \partial O$ be the gradient that arrives from the rest of the
# network, of shape $(N, d)$ per head. With $P = \mathrm{softmax}(S)$ row by row and
# $O = PV$, the chain rule gives
#
# $$dV = P^\top dO, \qquad dP = dO\, V^\top, \qquad dS_{ij} = P_{ij}\,(dP_{ij} - D_i),
# \qquad dQ = \text{scale}\cdot dS\, K, \qquad dK = \text{scale}\cdot dS^\top Q,$$
#
# where $D_i = \sum_j P_{ij}\, dP_{ij}$ comes from the softmax's Jacobian. FlashAttention's
# backward needs two observations to compute this without $P$:
#
# - **$P$ is recomputed**, tile by tile, from the saved logsumexp: $P_{ij} =
#   e^{s_{ij} - \mathrm{lse}_i}$, exactly the normalised probability, with no running
#   maximum needed because the forward already found the normaliser;
# - **$D$ needs no $P$ either**: $D_i = \sum_j P_{ij} (dO_i \cdot v_j) = dO_i \cdot
#   \sum_j P_{ij} v_j = dO_i \cdot o_i$, a row sum of $dO \circ O$, $N$ numbers that a
#   small kernel computes first.
#
# The sums then run along different axes: $dK_j$ and $dV_j$ sum over queries $i$, $dQ_i$
# over keys $j$. FlashAttention-2 gives each **key tile** a program that loops over the
# query tiles and accumulates its $dK$ and $dV$ in registers, and computes $dQ$ with a
# second kernel, one program per **query tile** looping over the key tiles; both
# recompute $P$. The other correct way computes $dQ$ in the same loop as $dK$ and $dV$ and
# adds each tile's contribution with `tl.atomic_add` into a float32 buffer shared by the
# programs (FlashAttention-2's own CUDA code does this): less recomputation, but atomics
# make the order of the additions, and so the last bits of $dQ$, vary from run to run.
# With `causal`, a key tile needs only the query tiles from the diagonal on, a query
# tile only the key tiles up to it.

# %% [tags=hide-input]
def draw_backward_flow():
    """The backward's three kernels: D from dO and O, then dK/dV per key tile and dQ per query tile."""
    text = {
        "title": "FlashAttention-2 backward: three kernels, P recomputed from lse, never stored",
        "saved": "saved by the forward\nq, k, v, o, lse", "do": "from the loss\ndO",
        "pre": "kernel 1, per query tile\nD = rowsum(dO * O)",
        "kv": "kernel 2, per key tile j\nloop over query tiles i:\nP = exp(scale q k^T - lse)\n"
              "dV += P^T dO\ndS = P * (dO v^T - D)\ndK += dS^T q",
        "q": "kernel 3, per query tile i\nloop over key tiles j:\nP = exp(scale q k^T - lse)\n"
             "dS = P * (dO v^T - D)\ndQ += dS k",
        "dkdv": "dK = scale * sum, dV", "dq": "dQ = scale * sum",
        "atomic": "or: dQ by tl.atomic_add\ninside kernel 2",
        "d_and_inputs": "D (and q, k, v, dO, lse)",
    }
    fig, ax = plt.subplots(figsize=(11, 5))
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 7)
    ax.axis("off")

    def box(x, y, w, h, label, color, size=8):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.08", fc=color, ec="black"))
        ax.text(x, y, label, ha="center", va="center", fontsize=size)
    box(1.6, 5.6, 2.6, 1.0, text["saved"], "#ece4f7")
    box(1.6, 3.4, 2.6, 0.9, text["do"], "#fde9c9")
    box(5.0, 6.2, 3.0, 0.9, text["pre"], "#d9efd9")
    box(5.0, 3.2, 3.2, 2.4, text["kv"], "#dbe9f6")
    box(9.0, 3.2, 3.2, 2.4, text["q"], "#f9d3d3")
    box(5.0, 0.9, 2.6, 0.6, text["dkdv"], "#dbe9f6")
    box(9.0, 0.9, 2.6, 0.6, text["dq"], "#f9d3d3")
    box(9.0, 6.2, 2.6, 0.9, text["atomic"], "#f2f2f2", size=7)
    ax.text(7.3, 5.2, text["d_and_inputs"], fontsize=7, rotation=-52)
    arrows = [((2.9, 5.8), (3.5, 6.1)), ((2.9, 3.5), (3.5, 6.0)), ((2.9, 5.3), (3.4, 4.1)),
              ((2.9, 3.4), (3.4, 3.3)), ((5.0, 5.75), (5.0, 4.4)), ((6.5, 6.2), (7.4, 4.0)),
              ((5.0, 2.0), (5.0, 1.2)), ((9.0, 2.0), (9.0, 1.2))]
    ax.set_title(text["title"], fontsize=10)
    for tail, head in arrows:            # inputs into the kernels, D into both loops, sums out
        ax.add_patch(FancyArrowPatch(tail, head, arrowstyle="-|>", mutation_scale=12, color="#333333"))
    return fig


draw_backward_flow().tight_layout()
plt.show()

# %% [markdown]
# ### Exercise: `flash_attention_backward`
#
# Three kernels, each with a grid of `(tiles, B * H)`: the preprocessing kernel writes
# `D` (float32, `(B, H, N)`) with one program per query tile; the dK/dV kernel has one
# program per key tile, `(triton.cdiv(N, block_n), B * H)`; the dQ kernel one per query
# tile. In the dK/dV kernel a program holds its tile of $k$ and $v$, starts `dk` and `dv`
# at zero in float32, and for each query tile loads $q$, $dO$, lse and $D$ of those rows
# and adds its terms. Both the scale of the scores and the factor scale of $dQ$ and $dK$
# appear once each: apply the second one when storing.
#
# Masks: a probability is zero for a key or a query past $N$ and, with `causal`, for
# $j > i$; set it with `tl.where(keep, tl.exp(s - lse[:, None]), 0.0)` rather than
# relying on the loaded zeros. The lse of a query past $N$ is whatever the masked load
# gave it, so the mask is what makes its row vanish.
#
# :::{dropdown} Hint: where a causal key tile's loop starts
# Key tile $j$ covers keys $j B_n$ to $(j+1) B_n - 1$. A query tile whose last row is
# before $j B_n$ sees none of them; the first query tile that sees any is the one
# containing row $j B_n$, which starts at `(start_n // BLOCK_M) * BLOCK_M`.
# :::

# %% [exercise flash_attention_backward]
@triton.jit
def flash_backward_preprocess_kernel(o_ptr, do_ptr, delta_ptr, N, D: tl.constexpr, BLOCK_M: tl.constexpr):
    # Program (i, bh) of a (cdiv(N, BLOCK_M), B * H) grid: D = rowsum(dO * O) for query tile i of head bh.
    ### BEGIN SOLUTION
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    head = tl.program_id(1).to(tl.int64) * N
    dims = tl.arange(0, D)
    at = (head + rows[:, None]) * D + dims[None, :]
    o = tl.load(o_ptr + at, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + at, mask=rows[:, None] < N, other=0.0).to(tl.float32)
    tl.store(delta_ptr + head + rows, tl.sum(o * do, axis=1), mask=rows < N)
    ### END SOLUTION


@triton.jit
def flash_backward_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, N, scale,
                               D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               CAUSAL: tl.constexpr):
    # Program (j, bh) of a (cdiv(N, BLOCK_N), B * H) grid: dK and dV of key tile j of head bh.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


@triton.jit
def flash_backward_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, N, scale,
                             D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    # Program (i, bh) of a (cdiv(N, BLOCK_M), B * H) grid: dQ of query tile i of head bh.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


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
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %% [markdown]
# The tests below build $o$ and lse with the naive attention, so that a mistake in your
# forward kernel is not blamed on the backward, and compare with torch's autograd of the
# same naive attention.

# %% [export tags=hide-input]
def naive_attention_gradients(q, k, v, do, causal=False, scale=None):
    """(o, lse, dq, dk, dv) of naive attention in float32: the forward's results and autograd's gradients."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    o, lse = naive_attention(q, k, v, causal=causal, scale=scale)
    o.backward(do.float())
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


# %% [test test_flash_attention_backward_values points=2]
"""dq, dk, dv equal autograd of naive attention (N = 32, d = 16, two heads), for two tile shapes."""
torch.manual_seed(9)
bv_q, bv_k, bv_v, bv_do = (torch.randn(1, 2, 32, 16, device=DEVICE) for _ in range(4))
bv_o, bv_lse, bv_dq, bv_dk, bv_dv = naive_attention_gradients(bv_q, bv_k, bv_v, bv_do)
for bv_bm, bv_bn in ((16, 16), (32, 16)):
    bv_have = flash_attention_backward(bv_q, bv_k, bv_v, bv_o, bv_lse, bv_do, block_m=bv_bm, block_n=bv_bn)
    assert len(bv_have) == 3 and bv_have[0].shape == (1, 2, 32, 16), "return (dq, dk, dv), each (B, H, N, d)"
    assert torch.allclose(bv_have[2], bv_dv, atol=1e-5), \
        f"dv wrong (tiles {bv_bm} x {bv_bn}): dv = P^T dO with P = exp(scale * q k^T - lse), summed over query tiles"
    assert torch.allclose(bv_have[1], bv_dk, atol=1e-5), \
        "dk wrong: dS = P * (dO v^T - D) with D = rowsum(dO * O) (not of P), and dk = scale * dS^T q"
    assert torch.allclose(bv_have[0], bv_dq, atol=1e-5), \
        "dq wrong: dq = scale * dS k, the scale applied once (not also inside dS), summed over key tiles"
bv_half = flash_attention_backward(*(t.half() for t in (bv_q, bv_k, bv_v, bv_o)), bv_lse, bv_do.half())
assert all(t.dtype == torch.float16 for t in bv_half), "the gradients are in q's dtype (float16 here)"
assert torch.allclose(bv_half[0].float(), bv_dq, atol=2e-2), \
    "float16 dq too far from the reference: accumulate dq, dk, dv in float32 and cast when storing"

# %% [test test_flash_attention_backward_causal points=2]
"""Causal and ragged (N = 37): no gradient flows from a query to a later key, and the tiles past N count nothing."""
torch.manual_seed(10)
bc_q, bc_k, bc_v, bc_do = (torch.randn(1, 1, 37, 32, device=DEVICE) for _ in range(4))
bc_o, bc_lse, bc_dq, bc_dk, bc_dv = naive_attention_gradients(bc_q, bc_k, bc_v, bc_do, causal=True)
bc_have = flash_attention_backward(bc_q, bc_k, bc_v, bc_o, bc_lse, bc_do, causal=True, block_m=16, block_n=32)
assert torch.isfinite(torch.stack(bc_have)).all(), "NaN or inf in the gradients: mask P to 0 past N, not only the loads"
assert torch.allclose(bc_have[2], bc_dv, atol=1e-5), \
    "causal dv wrong: P is 0 where j > i, and a key tile's loop must start at the query tile that holds its first key"
assert torch.allclose(bc_have[1], bc_dk, atol=1e-5), "causal dk wrong: dS is 0 wherever P is"
assert torch.allclose(bc_have[0], bc_dq, atol=1e-5), \
    "causal dq wrong: a query tile's loop over key tiles stops after its diagonal tile"

# %% [hidden]
def _forward_results(q, k, v, causal=False, scale=None):
    """(o, lse) of the reference: the backward's tests get them as given inputs."""
    o, lse = flash_attention_forward(q, k, v, causal, scale)
    return o, lse


def _manual_gradients(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16, delta_of_p=False,
                      dq_scale=1, ds_scale=True, p_scale=True, swap_dk_dv=False, dv_untransposed=False,
                      ignore_causal=False):
    """FlashAttention-2's backward formulas in torch (float32), with one step replaceable."""
    c = _scale(q.size(-1), scale)
    qf, kf, vf, of, dof = (x.float() for x in (q, k, v, o, do))
    s = _scores(qf, kf, causal and not ignore_causal, c if p_scale else 1.0)
    p = torch.exp(s - lse[..., None])
    dp = dof @ vf.transpose(-1, -2)
    delta = p.sum(-1) if delta_of_p else (dof * of).sum(-1)
    ds = p * (dp - delta[..., None])
    w = c if ds_scale else 1.0
    dq = (ds @ kf) * w * (c if dq_scale == 2 else 1.0)
    dk = (ds.transpose(-1, -2) @ qf) * w
    dv = (p if dv_untransposed else p.transpose(-1, -2)) @ dof
    if swap_dk_dv:
        dk, dv = dv, dk
    return tuple(g.to(q.dtype) for g in (dq, dk, dv))


def _backward_with(**wrong):
    def compute(q, k, v, o, lse, do, causal=False, scale=None, block_m=16, block_n=16):
        return _manual_gradients(q, k, v, o, lse, do, causal, scale, **wrong)
    return compute


BACKWARD_MISTAKES = [
    Mistake("D was computed from P: D_i = rowsum(dO * O), the output's, not the probabilities' (whose rows sum "
            "to 1)", _backward_with(delta_of_p=True)),
    Mistake("dq was scaled twice: dS already carries no scale, multiply dq = dS k by the scale once",
            _backward_with(dq_scale=2)),
    Mistake("dq and dk miss the scale: the scores are scale * q . k, so dq = scale * dS k and dk = scale * dS^T q",
            _backward_with(ds_scale=False)),
    Mistake("the probabilities were recomputed without the scale: P = exp(scale * q . k - lse)",
            _backward_with(p_scale=False)),
    Mistake("dk and dv were swapped: return (dq, dk, dv) in that order", _backward_with(swap_dk_dv=True)),
    Mistake("dv = P dO: it is P^T dO, each key's probabilities over the queries", _backward_with(dv_untransposed=True)),
    Mistake("causal=True was ignored in the backward: P is 0 where j > i", _backward_with(ignore_causal=True)),
]
BACKWARD = dict(mistakes=BACKWARD_MISTAKES, returns=("dq", "dk", "dv"))


def _backward_probe(t, shape, causal=False, scale=None, dtype=torch.float32, **kwargs):
    q, k, v = _qkv(t, *shape, dtype=dtype)
    do = t.randn(*shape, dtype=dtype)
    o, lse = _forward_results(q, k, v, causal, scale)
    t.function("flash_attention_backward", q, k, v, o, lse, do, causal=causal, scale=scale, **kwargs, **BACKWARD)


@hidden.test("test_flash_attention_backward_values")
def _(t):
    _backward_probe(t, (1, 2, 32, 16), label="(1, 2, 32, 16)")
    _backward_probe(t, (1, 1, 48, 16), block_m=32, block_n=16, label="tiles 32 x 16")   # block_m is not d
    _backward_probe(t, (2, 1, 32, 16), block_m=16, block_n=32, scale=0.25, label="tiles 16 x 32, scale=0.25")
    _backward_probe(t, (1, 1, 32, 16), dtype=torch.float16, equivalent=within(2e-2, 2e-2), label="float16")


# Memory is judged here, not in the cell above: that cell's visible test is the notebook's first autograd
# backward, whose engine start-up alone raises the kernel's memory by about 30 MiB.
@hidden.test("test_flash_attention_backward_causal",
             max_memory=(8 * 2**20, "flash_attention_backward used more than 8 MiB at N = 2,048 (one head of 16): "
                                    "a tensor of N x N elements was allocated; recompute P tile by tile"))
def _(t):
    _backward_probe(t, (1, 1, LONG_N, 16), causal=True, block_m=128, block_n=128,
                    label="causal, N = 2,048, tiles of 128")
    _backward_probe(t, (1, 1, 37, 32), causal=True, block_m=16, block_n=32, label="causal, N = 37, tiles 16 x 32")
    _backward_probe(t, (1, 2, 40, 16), causal=True, block_m=32, block_n=16, label="causal, N = 40, tiles 32 x 16")
    _backward_probe(t, (1, 1, 5, 16), causal=True, label="causal, N = 5")
    _backward_probe(t, (1, 1, 37, 16), label="not causal, N = 37")
    _backward_probe(t, (1, 1, 32, 16), causal=True, scale=0.5, label="causal, scale=0.5")

# %% [markdown]
# ### Exercise: `flash_attention`, a differentiable attention
#
# A `torch.autograd.Function` tells autograd how to differentiate an operation that it
# cannot see into, as here, where the computing happens in kernels. Its static `forward`
# runs the operation and saves, with `ctx.save_for_backward`, what the backward needs;
# its static `backward` receives the gradient of the output and returns one gradient per
# input of `forward` (`None` for `causal` and `scale`, which are not tensors). Save
# $q, k, v, o$ and the logsumexp, nothing else: with them, the backward recomputes every
# probability it needs, and the memory kept between the passes grows with $N$, not $N^2$.

# %% [exercise flash_attention]
class FlashAttention(torch.autograd.Function):
    """Attention by the Triton kernels: forward by flash_attention_forward, backward by flash_attention_backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, scale=None):
        """Returns o (B, H, N, d); saves q, k, v, o, lse and nothing else (causal and scale on ctx)."""
        ### BEGIN SOLUTION
        o, lse = flash_attention_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do):
        """Returns (dq, dk, dv, None, None) from the saved tensors."""
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, ctx.causal, ctx.scale)
        return dq, dk, dv, None, None
        ### END SOLUTION


def flash_attention(q, k, v, causal=False, scale=None):
    """Differentiable attention: FlashAttention.apply(q, k, v, causal, scale), o (B, H, N, d) in q's dtype."""
    ### BEGIN SOLUTION
    return FlashAttention.apply(q, k, v, causal, scale)
    ### END SOLUTION


# %% [export tags=hide-input]
def saved_numels(q, k, v, causal=False, scale=None):
    """Given, for the grader: the sizes (numel) of the tensors flash_attention saves for its backward, sorted."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, causal, scale)
    return torch.tensor(sorted(t.numel() for t in o.grad_fn.saved_tensors))


# %% [test test_flash_attention_gradients points=1]
"""loss.backward() through flash_attention gives autograd's gradients of naive attention."""
torch.manual_seed(11)
fa_q, fa_k, fa_v = (torch.randn(1, 2, 24, 16, device=DEVICE, requires_grad=True) for _ in range(3))
fa_do = torch.randn(1, 2, 24, 16, device=DEVICE)
fa_o = flash_attention(fa_q, fa_k, fa_v, causal=True)
assert fa_o.requires_grad, "the output does not require grad: return FlashAttention.apply(...), not the forward's o"
(fa_o * fa_do).sum().backward()
_, _, fa_dq, fa_dk, fa_dv = naive_attention_gradients(fa_q, fa_k, fa_v, fa_do, causal=True)
assert fa_q.grad is not None and torch.allclose(fa_q.grad, fa_dq, atol=1e-5), \
    "q.grad is wrong: backward returns (dq, dk, dv, None, None) in the order of forward's inputs"
assert torch.allclose(fa_k.grad, fa_dk, atol=1e-5) and torch.allclose(fa_v.grad, fa_dv, atol=1e-5), \
    "k.grad or v.grad is wrong: pass ctx.causal and ctx.scale on to the backward"

# %% [test test_flash_attention_saved points=1]
"""Only q, k, v, o and lse are saved for the backward: no probabilities."""
torch.manual_seed(12)
fs_q, fs_k, fs_v = (torch.randn(1, 1, 40, 16, device=DEVICE, requires_grad=True) for _ in range(3))
fs_o = flash_attention(fs_q, fs_k, fs_v)
fs_saved = fs_o.grad_fn.saved_tensors
assert len(fs_saved) == 5, f"save exactly q, k, v, o, lse with ctx.save_for_backward; {len(fs_saved)} tensors saved"
assert max(t.numel() for t in fs_saved) <= 40 * 16, \
    "a saved tensor is larger than q: the (N, N) probabilities must not be kept, the backward recomputes them"
assert fs_saved[4].shape == (1, 1, 40) and fs_saved[4].dtype == torch.float32, \
    "the fifth saved tensor is lse, (B, H, N) float32"

# %% [hidden]
FLASH_DEPS = ("flash_attention_forward", "flash_attention_backward")


@hidden.test("test_flash_attention_gradients")
def _(t):
    t.function("flash_attention", *_qkv(t, 1, 2, 24, 16), causal=True, grad=True, deps=FLASH_DEPS,
               label="causal, gradients through loss.backward()")
    t.function("flash_attention", *_qkv(t, 1, 1, 20, 16), scale=0.5, grad=True, deps=FLASH_DEPS,
               label="scale=0.5, gradients")
    t.function("flash_attention", *_qkv(t, 2, 1, 16, 32), grad=True, deps=FLASH_DEPS, label="B = 2, gradients")


@hidden.test("test_flash_attention_saved")
def _(t):
    t.function("saved_numels", *_qkv(t, 1, 1, 40, 16), deps=FLASH_DEPS, label="sizes of the saved tensors, N = 40")
    t.function("saved_numels", *_qkv(t, 2, 2, 24, 16), causal=True, deps=FLASH_DEPS,
               label="sizes of the saved tensors, causal")

# %% [markdown]
# ### The gradients at the chapter's shape
#
# The same check as Section 4's, for the whole differentiable attention: forward and
# backward through `flash_attention` at two heads of $d = 64$, $N = 100$, causal, against
# autograd of the naive attention; and the memory that autograd keeps between the passes,
# counted from the saved tensors, against what the naive attention keeps (its
# probabilities, $N \times N$ per head) at $N = 4{,}096$.

# %%
gradient_q, gradient_k, gradient_v = (t.clone().requires_grad_() for t in (chapter_q, chapter_k, chapter_v))
gradient_do = torch.randn_like(chapter_q)
start = time.perf_counter()
gradient_o = flash_attention(gradient_q, gradient_k, gradient_v, causal=True)
saved_bytes = sum(t.numel() * t.element_size() for t in gradient_o.grad_fn.saved_tensors)   # before backward frees them
gradient_o.backward(gradient_do)
gradient_seconds = time.perf_counter() - start
_, _, want_dq, want_dk, want_dv = naive_attention_gradients(chapter_q, chapter_k, chapter_v, gradient_do, causal=True)
gradient_errors = [max_error(gradient_q.grad, want_dq), max_error(gradient_k.grad, want_dk),
                   max_error(gradient_v.grad, want_dv)]
print(f"max error dq {gradient_errors[0]:.1e}, dk {gradient_errors[1]:.1e}, dv {gradient_errors[2]:.1e}; "
      f"forward + backward {gradient_seconds:.1f} s under the interpreter (tiles of 16)")
glue("grad_error", f"{max(gradient_errors):.1e}", display=False)
glue("grad_seconds", f"{gradient_seconds:.1f}", display=False)

kept_per_head = {"kernel": 4 * 4096 * 64 * 2 + 4096 * 4, "naive": 4096 * 4096 * 4 + 4 * 4096 * 64 * 2}
print(f"saved at N = 100: {saved_bytes:,} bytes; at N = 4,096, float16, per head: kernel "
      f"{kept_per_head['kernel'] / 2**20:.2f} MiB, naive {kept_per_head['naive'] / 2**20:.1f} MiB")
glue("kept_kernel_mib", f"{kept_per_head['kernel'] / 2**20:.2f}", display=False)
glue("kept_naive_mib", f"{kept_per_head['naive'] / 2**20:.1f}", display=False)

# %% [markdown]
# Through `loss.backward()` the gradients agree with autograd of the naive attention to
# {glue:text}`grad_error`, and one forward and backward of this small problem takes
# {glue:text}`grad_seconds` s under the interpreter. Between the passes a head of
# $N = 4{,}096$ keeps {glue:text}`kept_kernel_mib` MiB ($q, k, v, o$ in float16 and the
# float32 logsumexp) where the naive attention keeps {glue:text}`kept_naive_mib` MiB,
# almost all of it the probabilities. The price is the recomputation of $P$ in the
# backward, a second matrix product per tile, which on a GPU costs less than reading $P$
# back from memory would.

# %% [markdown]
# ## 6. Decoding: one query, a long cache
#
# A language model generates one token at a time (Chapter 7). At each step, every layer
# and head has **one** new query, which attends to all $N$ keys and values cached so far
# (Chapter 8's key/value cache): `q (B, H, d)` against `k, v (B, H, N, d)`. The
# arithmetic is small, $4Nd$ FLOPs per head, but every key and value must be read from
# memory once, $2Nd$ numbers: about one FLOP per byte in bf16 (two bytes a number).
# Section 8 shows what that means on a GPU: a decoding step is limited by how fast the
# memory can be read, and a GPU reads at full speed only when many of its streaming
# multiprocessors (SMs) are loading at once; one SM alone draws a small part of the
# bandwidth.
#
# FlashAttention-2's forward kernel gives each program one tile of queries of one
# (batch, head). With a single query there is one tile per head, so a decoding step
# launches only $B \cdot H$ programs, each of which walks through all $N$ keys alone. The
# cell below counts them for a realistic decoding step (one sequence, $H = 32$ heads of
# $d = 128$, a cache of $N = 32{,}768$ tokens) on an H100 SXM, which has 132 SMs
# (NVIDIA's H100 architecture whitepaper, 2022).

# %%
def programs_per_launch(batch, heads, n_queries, block_m=16, num_splits=1):
    """Programs a kernel parallelised over (query tile, split, batch x head) launches."""
    return triton.cdiv(n_queries, block_m) * num_splits * batch * heads


H100_SMS = 132                                    # NVIDIA H100 SXM5 (whitepaper, 2022)
decode_shape = dict(batch=1, heads=32, n_keys=32_768, d=128)
split_keys = 512                                  # keys per split (vLLM's second kernel uses 512 too)
decode_splits = decode_shape["n_keys"] // split_keys
unsplit = programs_per_launch(decode_shape["batch"], decode_shape["heads"], n_queries=1)
split = programs_per_launch(decode_shape["batch"], decode_shape["heads"], n_queries=1, num_splits=decode_splits)
kv_bytes = 2 * decode_shape["heads"] * decode_shape["n_keys"] * decode_shape["d"] * 2   # K and V, bf16
partial_bytes = 2 * decode_shape["heads"] * decode_splits * (decode_shape["d"] + 1) * 4  # written, read back
busy = 100 * min(unsplit, H100_SMS) / H100_SMS           # % of the SMs with a program to run
print(f"one query per head, B=1, H=32, N=32,768, d=128; an H100 has {H100_SMS} SMs")
print(f"  without splitting: {unsplit:5d} programs, at most {busy:.0f}% of the SMs busy, "
      f"each reading {kv_bytes / unsplit / 2**20:.0f} MiB of keys and values")
glue("decode_programs", f"{unsplit}", display=False)
glue("decode_busy", f"{busy:.0f}", display=False)
glue("decode_program_mib", f"{kv_bytes / unsplit / 2**20:.0f}", display=False)
print(f"  {decode_splits} splits of {split_keys} keys: {split:5d} programs, {split / H100_SMS:.1f} per SM, "
      f"each reading {kv_bytes / split / 2**10:.0f} KiB")
glue("decode_splits", f"{decode_splits}", display=False)
glue("decode_split_programs", f"{split:,}", display=False)
glue("decode_per_sm", f"{split / H100_SMS:.1f}", display=False)
print(f"  the partial results cost {partial_bytes / 2**20:.1f} MiB of extra traffic, "
      f"{100 * partial_bytes / kv_bytes:.2f}% of the cache's {kv_bytes / 2**20:.0f} MiB")
glue("decode_partial_share", f"{100 * partial_bytes / kv_bytes:.2f}", display=False)

# %% [markdown]
# Without splitting, {glue:text}`decode_programs` programs keep at most
# {glue:text}`decode_busy`% of the SMs busy, each reading
# {glue:text}`decode_program_mib` MiB on its own while the others idle. **Flash-decoding**
# (Dao, Haziza, Massa and Sizov, 2023) adds parallelism along the keys instead: cut the
# cache into `num_splits` parts and give each (split, batch × head) its own program, which
# computes attention over its part only and writes a partial output and that part's
# logsumexp. A second, small kernel combines the partial results of each head. With
# {glue:text}`decode_splits` splits of 512 keys the same step launches
# {glue:text}`decode_split_programs` programs, {glue:text}`decode_per_sm` per SM, and the
# partial results add only {glue:text}`decode_partial_share`% to the bytes read.
#
# **Why the logsumexps combine the parts.** Write $x_j = \text{scale} \cdot q \cdot k_j$ for
# the scores of one head, and let split $s$ hold the keys $J_s$. Program $s$ computes
#
# $$\ell_s = \log \sum_{j \in J_s} e^{x_j}, \qquad
# o_s = \sum_{j \in J_s} e^{x_j - \ell_s}\, v_j \in \mathbb{R}^d ,$$
#
# its own softmax over its own keys. The attention over all keys is
# $o = \sum_j e^{x_j - \ell} v_j$ with $\ell = \log \sum_j e^{x_j}$; grouping the keys by
# split and multiplying each group by $e^{\ell_s} e^{-\ell_s} = 1$,
#
# $$o = \sum_s e^{\ell_s - \ell} \sum_{j \in J_s} e^{x_j - \ell_s} v_j
#     = \sum_s w_s\, o_s, \qquad w_s = e^{\ell_s - \ell}, \qquad
# \ell = \log \sum_s e^{\ell_s} .$$
#
# The weight $w_s$ is the share of the softmax's mass that falls in split $s$; the
# weights sum to 1. Averaging the $o_s$, $w_s = 1/S$, is right only when every split holds
# the same mass, and nothing makes it so: the keys that matter to a query can sit anywhere
# in the cache. This is the online softmax again, applied once to whole splits instead of
# tile by tile; the maximum of the $\ell_s$ is subtracted before `exp` for the same reason
# (an $\ell_s$ of 100 overflows float32's `exp`).

# %% [tags=hide-input]
FIG_DECODE = dict(
    title="Flash-decoding: the keys of one head are split; each split is one program; a second kernel combines",
    cache="keys and values of one (batch, head): N = {n} positions", split="split {s}\nkeys [{a}, {b})",
    program="program ({s}, bh)\no_{s}, lse_{s}", q="the step's query q (d,)\ngoes to every split",
    combine="combine (one program per head)\nlse = log sum_s exp(lse_s)\no = sum_s exp(lse_s - lse) o_s",
    tiles="each program walks its split in tiles of block_n keys")


def finish_schematic(fig, ax, width, height, title):
    """A diagram's frame: its extent, no axes, its title."""
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    ax.set_title(title, fontsize=10)
    return fig


def draw_flash_decoding(text=FIG_DECODE, n=40, num_splits=4, block_n=4):
    colours = ["#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fc9272"]
    fig, ax = plt.subplots(figsize=(11, 4.6))
    length = -(-n // num_splits)
    unit = 9.6 / n
    ax.text(5.0, 5.35, text["cache"].format(n=n), ha="center", fontsize=9)
    for s in range(num_splits):
        a, b = s * length, min((s + 1) * length, n)
        for t0 in range(a, b, block_n):                                # the tiles inside the split
            ax.add_patch(plt.Rectangle((0.2 + t0 * unit, 4.5), min(block_n, b - t0) * unit, 0.6,
                                       facecolor=colours[s % len(colours)], edgecolor="white", lw=1))
        ax.add_patch(plt.Rectangle((0.2 + a * unit, 4.5), (b - a) * unit, 0.6, fill=False, edgecolor="black", lw=1.2))
        centre = 0.2 + (a + b) / 2 * unit
        ax.text(centre, 4.05, text["split"].format(s=s, a=a, b=b), ha="center", va="top", fontsize=8)
        ax.add_patch(plt.Rectangle((centre - 0.95, 2.3), 1.9, 0.8, facecolor=colours[s % len(colours)],
                                   edgecolor="black"))
        ax.text(centre, 2.7, text["program"].format(s=s), ha="center", va="center", fontsize=8)
        ax.annotate("", xy=(centre, 3.12), xytext=(centre, 3.55), arrowprops=dict(arrowstyle="->"))
        ax.annotate("", xy=(5.0, 1.25), xytext=(centre, 2.28), arrowprops=dict(arrowstyle="->", color="#555555"))
    ax.add_patch(plt.Rectangle((3.2, 0.1), 3.6, 1.15, facecolor="#fff7bc", edgecolor="black"))
    ax.text(5.0, 0.67, text["combine"], ha="center", va="center", fontsize=8)
    ax.text(10.0, 2.7, text["q"], ha="left", va="center", fontsize=8)
    ax.text(10.0, 4.8, text["tiles"], ha="left", va="center", fontsize=8, style="italic", wrap=True)
    return finish_schematic(fig, ax, 12.6, 5.7, text["title"])


draw_flash_decoding()
plt.show()

# %% [markdown]
# ### Exercise: `flash_decoding_partials`
#
# One program per (split, batch × head): a grid of `(num_splits, B * H)`. Program
# $(s, bh)$ loads the query of head $bh$ once, then walks the keys
# $[s L, \min((s+1) L, N))$ of that head, $L = \lceil N / \text{num\_splits} \rceil$, in
# tiles of `block_n`, with the online softmax (running maximum, running sum, running
# output, all float32), and writes its $o_s$ and $\ell_s$. Two differences from the
# FlashAttention-2 forward kernel:
#
# - there is one query, so a tile's scores are a matrix-vector product. `tl.dot` needs
#   tiles of at least $16 \times 16$; multiply the tile of keys `(block_n, d)` by the query
#   broadcast to `(1, d)` and sum over `d` (on a GPU this is no loss: the step is limited
#   by reading the keys, not by the arithmetic);
# - the last tile of a split can run past the **split's** end, not only past $N$: mask the
#   keys at the split's end, or a key is counted by two programs.
#
# :::{dropdown} Hint: the state of one program
# `m` and `l` are scalars (`tl.full((), float("-inf"), tl.float32)` and
# `tl.zeros((), tl.float32)`), `acc` is `tl.zeros((D,), tl.float32)`. For a tile of keys
# starting at `t0`, the rows are `t0 + tl.arange(0, BLOCK_N)`; those at or after the split's
# end get the score `-inf` (`tl.where`) and are loaded with `mask=..., other=0.0`. The
# partial result is `acc / l`, its logsumexp `m + tl.log(l)`.
# :::
#
# :::{dropdown} Hint: where program (s, bh) reads and writes
# With `q`, `k`, `v` contiguous, the query of head `bh` starts at `q_ptr + bh * D`, its key
# `t` at `k_ptr + (bh * N + t) * D`. Its outputs are row `bh * num_splits + s` of
# `o_part` viewed as `(B * H * num_splits, D)`, and element `bh * num_splits + s` of
# `lse_part`. A loop `for t0 in range(start, end, BLOCK_N)` may have bounds computed in
# the kernel.
# :::

# %% [exercise flash_decoding_partials]
@triton.jit
def decode_partials_kernel(q_ptr, k_ptr, v_ptr, o_part_ptr, lse_part_ptr, n_keys, split_len, scale,
                           D: tl.constexpr, BLOCK_N: tl.constexpr):
    # Program (split, bh) of a (num_splits, B * H) grid: head bh's keys from split * split_len to the split's
    # end (n_keys at most); it writes row bh * num_splits + split of o_part and of lse_part. A suggested
    # signature: change it as you like, with the launch in the wrapper.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


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
    ### BEGIN SOLUTION
    B, H, N, d = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    o_part = torch.empty(B, H, num_splits, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    grid = (num_splits, B * H)
    decode_partials_kernel[grid](q, k, v, o_part, lse_part, N, triton.cdiv(N, num_splits), scale,
                                 D=d, BLOCK_N=block_n)
    return o_part, lse_part
    ### END SOLUTION


# %% [test test_flash_decoding_partials_values points=2]
"""Each split's output and logsumexp equal softmax attention over that split's keys alone (N = 100, 3 splits)."""
torch.manual_seed(10)
fdp_q, fdp_k, fdp_v = torch.randn(2, 2, 16), torch.randn(2, 2, 100, 16), torch.randn(2, 2, 100, 16)
fdp_o, fdp_lse = flash_decoding_partials(fdp_q, fdp_k, fdp_v, num_splits=3)
assert fdp_o.shape == (2, 2, 3, 16) and fdp_lse.shape == (2, 2, 3), \
    f"o_part is (B, H, num_splits, d) = (2, 2, 3, 16) and lse_part (2, 2, 3); got {tuple(fdp_o.shape)}, " \
    f"{tuple(fdp_lse.shape)}"
assert fdp_o.dtype == torch.float32 and fdp_lse.dtype == torch.float32, "both results are float32"
for fdp_s, (fdp_a, fdp_b) in enumerate([(0, 34), (34, 68), (68, 100)]):     # L = ceil(100 / 3) = 34
    fdp_scores = torch.einsum("bhd,bhnd->bhn", fdp_q, fdp_k[:, :, fdp_a:fdp_b]) / math.sqrt(16)
    fdp_want = torch.einsum("bhn,bhnd->bhd", fdp_scores.softmax(-1), fdp_v[:, :, fdp_a:fdp_b])
    assert torch.allclose(fdp_lse[:, :, fdp_s], fdp_scores.logsumexp(-1), atol=1e-5), \
        f"lse_part of split {fdp_s} (keys {fdp_a} to {fdp_b - 1}) is wrong: it is m + log(l), the natural log " \
        "of the split's sum of exp(scale * q . k_j), with the running maximum m added back"
    assert torch.allclose(fdp_o[:, :, fdp_s], fdp_want, atol=1e-5), \
        f"o_part of split {fdp_s} (keys {fdp_a} to {fdp_b - 1}) differs from the softmax over that split's keys: " \
        "divide the running output by the running sum, and rescale both by exp(m_old - m_new)"

# %% [test test_flash_decoding_partials_split_edges points=1]
"""Tiles that cross a split's end stop there; block_n does not change the result; one split is full attention."""
torch.manual_seed(11)
fde_q, fde_k, fde_v = torch.randn(1, 2, 32), torch.randn(1, 2, 70, 32), torch.randn(1, 2, 70, 32)
fde_o, fde_lse = flash_decoding_partials(fde_q, fde_k, fde_v, num_splits=2, block_n=16)   # splits of 35
fde_scores = torch.einsum("bhd,bhnd->bhn", fde_q, fde_k) / math.sqrt(32)
fde_first = fde_scores[:, :, :35].logsumexp(-1)
assert torch.allclose(fde_lse[:, :, 0], fde_first, atol=1e-5), \
    "split 0 (keys 0 to 34) has the wrong logsumexp: its third tile, keys 32 to 47, must be masked at the " \
    "split's end (35), not at N; otherwise keys 35 to 47 are counted by two splits"
fde_o32, fde_lse32 = flash_decoding_partials(fde_q, fde_k, fde_v, num_splits=2, block_n=32)
assert torch.allclose(fde_o32, fde_o, atol=1e-5) and torch.allclose(fde_lse32, fde_lse, atol=1e-5), \
    "block_n=32 gives another result than block_n=16: the tile size must not change what a split covers"
fde_one, fde_one_lse = flash_decoding_partials(fde_q, fde_k, fde_v, num_splits=1, block_n=16)
fde_want = torch.einsum("bhn,bhnd->bhd", fde_scores.softmax(-1), fde_v)
assert torch.allclose(fde_one[:, :, 0], fde_want, atol=1e-5), \
    "with num_splits=1 the one split is all 70 keys: the result must be attention over all of them"
assert torch.allclose(fde_one_lse[:, :, 0], fde_scores.logsumexp(-1), atol=1e-5), \
    "with num_splits=1 lse_part is the logsumexp of all 70 scores"

# %% [hidden]
def _partials_with(bounds):
    return lambda q, k, v, num_splits, scale=None, block_n=16: flash_decoding_partials(
        q, k, v, num_splits, scale, block_n, bounds=bounds)


def _partials_scaled(times):
    return lambda q, k, v, num_splits, scale=None, block_n=16: flash_decoding_partials(
        q, k, v, num_splits, _scale(q.size(-1), scale) ** times, block_n)


def _overlapping_bounds(block_n):
    """A split's tiles masked only at N: split s covers [s * L, the end of the tile that holds its last key)."""
    def bounds(N, S):
        L = -(-N // S)
        return [(s * L, min(s * L + -(-L // block_n) * block_n, N)) for s in range(S)]
    return bounds


_ROUNDED_DOWN = ("the splits have N // num_splits keys, rounded down: L = ceil(N / num_splits), the last split "
                 "shorter")
# the models that do not depend on the tile width are shared by every probe: each is alive if any probe tells it apart
_SPLIT_MISTAKES = (  # L = N // num_splits: the last split stretched to N, or the last N % num_splits keys never read
    Mistake(_ROUNDED_DOWN, _partials_with(lambda N, S: [(s * (N // S), (s + 1) * (N // S) if s < S - 1 else N)
                                                        for s in range(S)])),
    Mistake(_ROUNDED_DOWN, _partials_with(lambda N, S: [(s * (N // S), (s + 1) * (N // S)) for s in range(S)])),
)
_UNSCALED = Mistake("the scores were not scaled: they are scale * q . k, scale = 1 / sqrt(d) by default",
                    _partials_scaled(0))


def _partials_mistakes(block_n):
    return [*_SPLIT_MISTAKES,
            Mistake("a split's last tile runs past the split's end: mask keys at or after min((s + 1) * L, N), so "
                    "that no key is counted by two splits", _partials_with(_overlapping_bounds(block_n))),
            _UNSCALED]


# one list per tile width
_PARTIALS_MISTAKES = {block_n: _partials_mistakes(block_n) for block_n in (16, 32, 64)}


def _decode_inputs(t, B, H, N, d):
    return t.randn(B, H, d), t.randn(B, H, N, d), t.randn(B, H, N, d)


@hidden.test("test_flash_decoding_partials_values")
def _(t):
    R = ("o_part", "lse_part")
    t.function("flash_decoding_partials", *_decode_inputs(t, 2, 2, 100, 16), 3, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="N = 100, 3 splits")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 3, 64, 32), 4, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="N = 64, 4 splits of 16")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 1, 90, 16), 5, scale=0.2, block_n=32, returns=R,
               mistakes=_PARTIALS_MISTAKES[32], label="scale=0.2, block_n=32")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 2, 20, 64), 1, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="one split, d = 64")


@hidden.test("test_flash_decoding_partials_split_edges")
def _(t):
    R = ("o_part", "lse_part")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 2, 70, 32), 2, block_n=16, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="splits of 35, tiles of 16")
    t.function("flash_decoding_partials", *_decode_inputs(t, 1, 1, 50, 16), 3, block_n=16, returns=R,
               mistakes=_PARTIALS_MISTAKES[16], label="splits of 17, the last 16")
    t.function("flash_decoding_partials", *_decode_inputs(t, 2, 1, 33, 16), 2, block_n=64, returns=R,
               mistakes=_PARTIALS_MISTAKES[64], label="tiles of 64 wider than a split")

# %% [markdown]
# ### Exercise: `combine_partials`
#
# The second kernel: one program per (batch, head), a grid of `(B * H,)`. It loads the
# head's `S` logsumexps at once, a block of `triton.next_power_of_2(S)` lanes with those
# past `S` masked (loaded as `-inf`, so that their weight is $e^{-\infty} = 0$), and the
# `(S, d)` partial outputs; it computes $\ell = \log \sum_s e^{\ell_s}$ with the maximum
# subtracted first, and $o = \sum_s e^{\ell_s - \ell} o_s$.

# %% [exercise combine_partials]
@triton.jit
def combine_kernel(o_part_ptr, lse_part_ptr, o_ptr, lse_ptr, num_splits,
                   D: tl.constexpr, BLOCK_S: tl.constexpr):
    # Program bh of a (B * H,) grid: the num_splits partial results of head bh, in one block of BLOCK_S lanes
    # (a power of two >= num_splits). A suggested signature: change it as you like, with the launch.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


def combine_partials(o_part, lse_part):
    """Flash-decoding's second kernel: the attention over all keys from the splits' partial results.

    Args:
        o_part: (B, H, S, d) float32, each split's output (from flash_decoding_partials).
        lse_part: (B, H, S) float32, each split's logsumexp.

    Returns (o (B, H, d), lse (B, H)), float32: lse = log sum_s exp(lse_part_s) and
    o = sum_s exp(lse_part_s - lse) o_part_s, computed without overflow for any finite
    lse_part. One program per (batch, head), launched by this wrapper.
    """
    ### BEGIN SOLUTION
    B, H, S, d = o_part.shape
    o_part, lse_part = o_part.contiguous(), lse_part.contiguous()
    o = torch.empty(B, H, d, dtype=torch.float32, device=o_part.device)
    lse = torch.empty(B, H, dtype=torch.float32, device=o_part.device)
    combine_kernel[(B * H,)](o_part, lse_part, o, lse, S, D=d, BLOCK_S=triton.next_power_of_2(S))
    return o, lse
    ### END SOLUTION


# %% [test test_combine_partials_values points=2]
"""Partial results of 5 splits (computed here with torch) combine into attention over all N = 60 keys."""
torch.manual_seed(12)
cp_q, cp_k, cp_v = torch.randn(2, 3, 16), torch.randn(2, 3, 60, 16), torch.randn(2, 3, 60, 16)
cp_scores = torch.einsum("bhd,bhnd->bhn", cp_q, cp_k) / math.sqrt(16)
cp_lse_part = torch.stack([cp_scores[:, :, a:a + 12].logsumexp(-1) for a in range(0, 60, 12)], dim=-1)
cp_o_part = torch.stack([torch.einsum("bhn,bhnd->bhd", cp_scores[:, :, a:a + 12].softmax(-1), cp_v[:, :, a:a + 12])
                         for a in range(0, 60, 12)], dim=2)                            # (2, 3, 5, 16)
cp_o, cp_lse = combine_partials(cp_o_part, cp_lse_part)
assert cp_o.shape == (2, 3, 16) and cp_lse.shape == (2, 3), \
    f"o is (B, H, d) = (2, 3, 16) and lse (2, 3); got {tuple(cp_o.shape)}, {tuple(cp_lse.shape)}"
assert torch.allclose(cp_lse, cp_scores.logsumexp(-1), atol=1e-5), \
    "lse differs from the logsumexp of all 60 scores: lse = m + log(sum_s exp(lse_s - m)); with 5 splits, " \
    "mask the lanes 5 to 7 of the block of 8 (loaded as -inf)"
cp_want = torch.einsum("bhn,bhnd->bhd", cp_scores.softmax(-1), cp_v)
cp_mean = cp_o_part.mean(2)
assert not torch.allclose(cp_o, cp_mean, atol=1e-3), \
    "o is the plain average of the splits' outputs: weight split s by exp(lse_s - lse), its share of the softmax"
assert torch.allclose(cp_o, cp_want, atol=1e-5), \
    "o differs from attention over all 60 keys: o = sum_s exp(lse_s - lse) * o_s, with lse the combined logsumexp"

# %% [test test_combine_partials_stability points=1]
"""Logsumexps of 100 and more (exp overflows float32) still combine: subtract their maximum first."""
torch.manual_seed(13)
cs_o_part = torch.randn(1, 2, 3, 16)
cs_lse_part = torch.tensor([[[100.0, 98.0, 101.0], [-100.0, -103.0, -99.0]]])
cs_o, cs_lse = combine_partials(cs_o_part, cs_lse_part)
assert torch.isfinite(cs_o).all() and torch.isfinite(cs_lse).all(), \
    "inf or NaN with logsumexps of 100: exp(100) overflows float32; subtract the largest lse_s before exp"
cs_want_lse = cs_lse_part.logsumexp(-1)
assert torch.allclose(cs_lse, cs_want_lse, atol=1e-4), "lse is wrong when the partial logsumexps are large"
cs_want = (torch.softmax(cs_lse_part, -1)[..., None] * cs_o_part).sum(2)
assert torch.allclose(cs_o, cs_want, atol=1e-5), "o is wrong when the partial logsumexps are large or very negative"

# %% [hidden]
def _combine_mean(o_part, lse_part):
    return o_part.float().mean(2), torch.logsumexp(lse_part.float(), -1)


def _combine_weights(weights_of):
    def compute(o_part, lse_part):
        lse = torch.logsumexp(lse_part.float(), -1)
        return (weights_of(lse_part.float(), lse)[..., None] * o_part.float()).sum(2), lse
    return compute


def _combine_lse_max(o_part, lse_part):
    o, _ = combine_partials(o_part, lse_part)
    return o, lse_part.float().amax(-1)


def _combine_unstable(o_part, lse_part):
    e = torch.exp(lse_part.float())
    s = e.sum(-1)
    return ((e / s[..., None])[..., None] * o_part.float()).sum(2), torch.log(s)


COMBINE_MISTAKES = [
    Mistake("the splits' outputs were averaged: weight split s by exp(lse_s - lse), its share of the softmax",
            _combine_mean),
    Mistake("the weights are exp(lse_s), not divided by the total: weight by exp(lse_s - lse)",
            _combine_weights(lambda part, lse: torch.exp(part))),
    Mistake("the weights are lse_s / sum(lse): weight by exp(lse_s - lse)",
            _combine_weights(lambda part, lse: part / part.sum(-1, keepdim=True))),
    Mistake("lse is the largest lse_s: it is log(sum_s exp(lse_s)) = m + log(sum_s exp(lse_s - m))",
            _combine_lse_max),
    Mistake("exp(lse_s) overflowed: subtract the largest lse_s before exp", _combine_unstable),
]


def _partials_of(t, B, H, S, d, spread=3.0):
    return t.randn(B, H, S, d), t.randn(B, H, S) * spread


@hidden.test("test_combine_partials_values")
def _(t):
    P = dict(mistakes=COMBINE_MISTAKES, returns=("o", "lse"))
    t.function("combine_partials", *_partials_of(t, 2, 3, 5, 16), label="5 splits", **P)
    t.function("combine_partials", *_partials_of(t, 1, 2, 8, 32), label="8 splits", **P)
    t.function("combine_partials", *_partials_of(t, 1, 1, 1, 16), label="one split", **P)
    t.function("combine_partials", *_partials_of(t, 1, 4, 3, 64, spread=0.1), label="close logsumexps", **P)
    q, k, v = _decode_inputs(t, 1, 2, 45, 16)
    t.function("combine_partials", *flash_decoding_partials(q, k, v, 3), label="the partials of 45 keys in 3 splits",
               **P)


@hidden.test("test_combine_partials_stability")
def _(t):
    P = dict(mistakes=COMBINE_MISTAKES, returns=("o", "lse"))
    o = t.randn(1, 2, 3, 16)
    # -60, not -100: exp(-100) is a subnormal float32, where any two orders of the unshifted sum disagree
    t.function("combine_partials", o, torch.tensor([[[100.0, 98.0, 101.0], [-60.0, -63.0, -59.0]]]),
               label="logsumexps of 100 and -60", **P)
    t.function("combine_partials", t.randn(2, 1, 4, 16), 200 + t.randn(2, 1, 4) * 5, label="logsumexps near 200",
               **P)

# %% [markdown]
# **Averaging is wrong, weighting is right.** One head's cache of 96 keys in 4 splits,
# where four keys, all in the last split, match the query better than the others (nothing
# spreads the keys a step needs evenly over the cache); the partial results come from
# your `flash_decoding_partials`:

# %%
torch.manual_seed(0)
avg_q, avg_k, avg_v = torch.randn(1, 1, 64), torch.randn(1, 1, 96, 64), torch.randn(1, 1, 96, 64)
avg_k[0, 0, 80:84] += 0.5 * avg_q[0, 0]               # four keys of the last split match the query
avg_scores = torch.einsum("bhd,bhnd->bhn", avg_q, avg_k) / math.sqrt(64)
avg_exact = torch.einsum("bhn,bhnd->bhd", avg_scores.softmax(-1), avg_v)
avg_o_part, avg_lse_part = flash_decoding_partials(avg_q, avg_k, avg_v, num_splits=4, block_n=16)
avg_weights = torch.exp(avg_lse_part - avg_lse_part.logsumexp(-1, keepdim=True))  # w_s = exp(lse_s - lse)
avg_mean = avg_o_part.mean(2)
avg_weighted = (avg_weights[..., None] * avg_o_part).sum(2)
avg_combined, _ = combine_partials(avg_o_part, avg_lse_part)
print("lse_s of the 4 splits:", [f"{x:.2f}" for x in avg_lse_part[0, 0].tolist()])
print("weights w_s:          ", [f"{x:.3f}" for x in avg_weights[0, 0].tolist()],
      f"(sum {avg_weights.sum().item():.4f})")
glue("avg_last_weight", f"{avg_weights[0, 0, -1].item():.3f}", display=False)
avg_err_mean = (avg_mean - avg_exact).abs().max().item()
avg_err_weighted = (avg_weighted - avg_exact).abs().max().item()
avg_err_kernel = (avg_combined - avg_exact).abs().max().item()
print(f"max |average of o_s - exact|            = {avg_err_mean:.3f}")
print(f"max |sum of w_s o_s - exact|            = {avg_err_weighted:.1e}")
print(f"max |combine_partials - exact|          = {avg_err_kernel:.1e}")
print(f"largest |exact output|                  = {avg_exact.abs().max().item():.3f}")
glue("avg_err_mean", f"{avg_err_mean:.2f}", display=False)
glue("avg_err_weighted", f"{max(avg_err_weighted, avg_err_kernel):.0e}", display=False)
glue("avg_exact_max", f"{avg_exact.abs().max().item():.2f}", display=False)

# %% [markdown]
# The last split holds a share of {glue:text}`avg_last_weight` of the softmax's mass. The
# average gives it a quarter of the say, and the other three splits, which hold the rest,
# three quarters: it misses the exact output by {glue:text}`avg_err_mean`, on outputs whose
# largest entry is {glue:text}`avg_exact_max`. Weighted by $e^{\ell_s - \ell}$, the parts give the
# exact output to {glue:text}`avg_err_weighted`, float32 rounding.
#
# How close are the two kernels to torch on other shapes? The cell runs them on several,
# with ragged splits and tiles, against `softmax(q kᵀ · scale) v` in float64:

# %%
def decode_reference(q, k, v, scale=None):
    """One decoding step in float64 with torch: (B, H, d) outputs and (B, H) logsumexps."""
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = torch.einsum("bhd,bhnd->bhn", q.double(), k.double()) * scale
    return torch.einsum("bhn,bhnd->bhd", scores.softmax(-1), v.double()), scores.logsumexp(-1)


decode_errors = {}
for shape in [(1, 2, 100, 16, 1, 16), (1, 2, 100, 16, 7, 16), (2, 4, 257, 64, 8, 32),
              (1, 2, 1000, 128, 16, 32), (1, 1, 4096, 64, 32, 64)]:
    batch, heads, n, d, splits, block_n = shape
    torch.manual_seed(n)
    q_, k_, v_ = torch.randn(batch, heads, d), torch.randn(batch, heads, n, d), torch.randn(batch, heads, n, d)
    started = time.perf_counter()
    o_, lse_ = combine_partials(*flash_decoding_partials(q_, k_, v_, splits, block_n=block_n))
    seconds = time.perf_counter() - started
    want_o, want_lse = decode_reference(q_, k_, v_)
    decode_errors[shape] = max((o_ - want_o).abs().max().item(), (lse_ - want_lse).abs().max().item())
    length = triton.cdiv(n, splits)                             # tile steps: every program's tiles, all programs
    steps = batch * heads * sum(triton.cdiv(min(length, n - a), block_n) for a in range(0, n, length))
    print(f"B={batch} H={heads} N={n:5d} d={d:3d} splits={splits:2d} block_n={block_n:2d}: "
          f"max error {decode_errors[shape]:.1e}  ({seconds:.2f} s for {steps} tile steps, {DEVICE.upper()})")
glue("decode_max_error", f"{max(decode_errors.values()):.0e}", display=False)
glue("decode_seconds", f"{seconds:.2f}", display=False)           # the last shape: N = 4,096 in 32 splits
glue("decode_ms_per_step", f"{1000 * seconds / steps:.0f}", display=False)

# %% [markdown]
# Over all these shapes the largest difference from float64 is
# {glue:text}`decode_max_error`: the split and the combine change the order of the
# additions, not the result. The seconds printed are the interpreter's (the book runs on a
# CPU): the last shape's two launches, {glue:text}`decode_seconds` s for a cache of 4,096
# keys, cost about {glue:text}`decode_ms_per_step` ms per tile step, because the
# interpreter runs the programs one after another and every `tl` operation of a step as
# a numpy call. They say nothing about a GPU; Section 8 explains what does.

# %% [markdown]
# ## 7. Paged decoding
#
# Chapter 8 stored the cache in **blocks**: a pool `k_cache, v_cache (num_blocks, H,
# block_size, d)`, and for each sequence a row of the **block table** listing the physical
# blocks that hold its tokens $0 \ldots \text{block\_size}-1$, then the next ones, and so
# on; token $t$ of sequence $b$ sits in block `block_table[b, t // block_size]` at slot
# `t % block_size`. There, `paged_attention` gathered a sequence's blocks into a
# contiguous tensor with torch and then attended; that copy is exactly the memory traffic a
# decoding step cannot afford. vLLM's first PagedAttention kernel (Kwon et al., 2023,
# adapted from NVIDIA FasterTransformer's decoding kernel) reads the table **inside** the
# kernel instead: one program per (sequence, head) walks that sequence's logical blocks,
# looks each one up in the table, and loads the keys and values of that physical block
# straight from the pool, one block per step of the online softmax.

# %% [tags=hide-input]
FIG_PAGED = dict(
    title="Paged decoding: program (b, h) reads block_table[b, t // block_size], then slot t % block_size",
    table="block_table[b]", logical="sequence b: {n} tokens\nin logical blocks of {bs}",
    pool="the pool: k_cache[physical, h] (num_blocks blocks)", padding="padding entry:\nnever read",
    token="token t = {t}: block_table[b, {t} // {bs}] = {p}, slot {t} % {bs} = {slot}",
    unused="slots past seq_lens[b]: masked")


def draw_block_table(text=FIG_PAGED, n=10, bs=4, table=(7, 2, 9, 0), num_blocks=12, t=6):
    fig, ax = plt.subplots(figsize=(11, 4.4))
    n_logical = -(-n // bs)
    for j in range(len(table)):
        y = 3.6 - j * 0.9
        for slot in range(bs):
            token = j * bs + slot
            used = j < n_logical and token < n
            colour = "#f6b26b" if token == t else ("#cfe2f3" if used else "#eeeeee")
            ax.add_patch(plt.Rectangle((0.3 + slot * 0.45, y), 0.45, 0.6, facecolor=colour, edgecolor="black", lw=0.8))
            if used:
                ax.text(0.3 + slot * 0.45 + 0.225, y + 0.3, str(token), ha="center", va="center", fontsize=7)
        ax.add_patch(plt.Rectangle((3.0, y), 0.7, 0.6, facecolor="#fff7bc" if j < n_logical else "#eeeeee",
                                   edgecolor="black"))
        ax.text(3.35, y + 0.3, str(table[j]), ha="center", va="center", fontsize=9)
        if j < n_logical:
            ax.annotate("", xy=(5.0 + table[j] * 0.5 + 0.2, 2.1), xytext=(3.72, y + 0.3),
                        arrowprops=dict(arrowstyle="->", color="#f6b26b" if j == t // bs else "#777777",
                                        lw=1.6 if j == t // bs else 0.8))
    ax.text(1.2, 4.45, text["logical"].format(n=n, bs=bs), ha="center", fontsize=8)
    ax.text(3.35, 4.45, text["table"], ha="center", fontsize=8)
    ax.text(1.2, 0.45, text["unused"], ha="center", fontsize=7, style="italic")
    ax.text(4.3, 0.55, text["padding"], ha="center", fontsize=7, style="italic")
    for p in range(num_blocks):
        mine = p in table[:n_logical]
        ax.add_patch(plt.Rectangle((5.0 + p * 0.5, 1.2), 0.4, 0.9, facecolor="#cfe2f3" if mine else "#eeeeee",
                                   edgecolor="#f6b26b" if p == table[t // bs] else "black",
                                   lw=2.2 if p == table[t // bs] else 0.8))
        ax.text(5.2 + p * 0.5, 1.0, str(p), ha="center", va="top", fontsize=7)
    ax.text(8.0, 0.55, text["pool"], ha="center", fontsize=8)
    ax.text(8.0, 0.15, text["token"].format(t=t, bs=bs, p=table[t // bs], slot=t % bs), ha="center", fontsize=8)
    return finish_schematic(fig, ax, 11.2, 4.9, text["title"])


draw_block_table()
plt.show()

# %% [markdown]
# ### Exercise: `paged_decoding`
#
# A grid of `(B, H)`. Program $(b, h)$ loads `seq_lens[b]` and its query, then, for each
# logical block $j = 0, 1, \ldots, \lceil \text{seq\_lens}[b] / \text{block\_size} \rceil - 1$,
# loads the physical block number `block_table[b, j]` (a scalar `tl.load`) and the tile
# `(block_size, d)` of keys and values of head $h$ in that block, and updates the online
# softmax. Two things must not count: the table's entries after the sequence's last
# block (the loop stops before them) and, in the last block, the slots at or after
# `seq_lens[b]` (mask them: they hold whatever an earlier sequence left there). Pass the
# pool's strides to the kernel rather than assuming its layout, and convert the physical
# block number to `tl.int64` before multiplying it by a stride: in a real pool
# `block * stride` exceeds $2^{31}$.
#
# :::{dropdown} Hint: the addresses of one block
# Block `p`, head `h`, slot `r`, feature `c` of a `(num_blocks, H, block_size, d)` pool is at
# `p * stride_block + h * stride_head + r * stride_slot + c`. With
# `slots = tl.arange(0, BLOCK_SIZE)`, token `j * BLOCK_SIZE + slots` of the sequence is in
# the sequence when it is `< seq_len`.
# :::

# %% [exercise paged_decoding]
@triton.jit
def paged_decoding_kernel(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, o_ptr, scale,
                          stride_table, stride_block, stride_head, stride_slot,
                          H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    # Program (b, h) of a (B, H) grid: sequence b's blocks, read through row b of the block table, for head h.
    # A suggested signature: change it as you like, with the launch in the wrapper.
    ### BEGIN SOLUTION
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
    ### END SOLUTION


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
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %% [test test_paged_decoding_values points=2]
"""Equal to attention over each sequence's keys gathered with torch: blocks from the table, slot t % block_size."""
torch.manual_seed(14)
pd_k_cache, pd_v_cache = torch.randn(16, 2, 4, 16), torch.randn(16, 2, 4, 16)       # 16 blocks of 4 slots
pd_lens = torch.tensor([9, 4, 1, 6])
pd_table = torch.tensor([[11, 3, 14], [5, 0, 0], [8, 0, 0], [2, 13, 0]])             # 0: padding
pd_q = torch.randn(4, 2, 16)
pd_out = paged_decoding(pd_q, pd_k_cache, pd_v_cache, pd_table, pd_lens)
assert pd_out.shape == (4, 2, 16), f"the output is (B, H, d) = (4, 2, 16), got {tuple(pd_out.shape)}"
for pd_b in range(4):
    pd_t = torch.arange(pd_lens[pd_b].item())                                        # the sequence's tokens
    pd_blocks = pd_table[pd_b, pd_t // 4]                                            # physical block of each
    pd_k = pd_k_cache[pd_blocks, :, pd_t % 4].transpose(0, 1)                        # (H, L, d)
    pd_v = pd_v_cache[pd_blocks, :, pd_t % 4].transpose(0, 1)
    pd_w = torch.softmax(torch.einsum("hd,hld->hl", pd_q[pd_b], pd_k) / math.sqrt(16), dim=-1)
    pd_want = torch.einsum("hl,hld->hd", pd_w, pd_v)
    assert torch.allclose(pd_out[pd_b], pd_want, atol=1e-5), \
        f"sequence {pd_b} (length {pd_lens[pd_b].item()}, table {pd_table[pd_b].tolist()}) differs from attention " \
        "over its keys: token t is in physical block block_table[b, t // block_size] at slot t % block_size " \
        "(the logical block j is not the physical block)"

# %% [test test_paged_decoding_unused_slots points=1]
"""Slots past seq_lens[b] and the table's padding entries do not count, even when they hold huge values."""
torch.manual_seed(15)
pu_k_cache, pu_v_cache = torch.randn(6, 1, 8, 16), torch.randn(6, 1, 8, 16)
pu_q = torch.randn(2, 1, 16)
pu_k_cache[1, 0, 3:], pu_v_cache[1, 0, 3:] = 50 * pu_q[0, 0], 1e4                   # stale slots after token 10
pu_k_cache[4, 0], pu_v_cache[4, 0] = 50 * pu_q[1, 0], 1e4                           # block 4: not this step's
pu_table = torch.tensor([[0, 1, 4], [2, 5, 4]])                                       # 4 is padding in both rows
pu_lens = torch.tensor([11, 16])                                                      # 16: two full blocks
pu_out = paged_decoding(pu_q, pu_k_cache, pu_v_cache, pu_table, pu_lens)
assert torch.isfinite(pu_out).all() and pu_out.abs().max() < 100, \
    "the output holds the stale values 1e4: slots at or after seq_lens[b] and the table's entries after the " \
    "last block must be masked or never read"
for pu_b in range(2):
    pu_t = torch.arange(pu_lens[pu_b].item())
    pu_k = pu_k_cache[pu_table[pu_b, pu_t // 8], :, pu_t % 8].transpose(0, 1)
    pu_v = pu_v_cache[pu_table[pu_b, pu_t // 8], :, pu_t % 8].transpose(0, 1)
    pu_want = torch.einsum("hl,hld->hd", torch.softmax(torch.einsum("hd,hld->hl", pu_q[pu_b], pu_k) / 4, -1), pu_v)
    assert torch.allclose(pu_out[pu_b], pu_want, atol=1e-5), \
        f"sequence {pu_b} of length {pu_lens[pu_b].item()} with blocks of 8 is wrong: attend to its first " \
        "seq_lens[b] tokens, all of them (a full last block too)"

# %% [test test_paged_decoding_dtypes points=1]
"""int32 block tables and lengths work; a float16 query gives a float16 output."""
torch.manual_seed(16)
pt_k_cache, pt_v_cache = torch.randn(5, 2, 4, 32), torch.randn(5, 2, 4, 32)
pt_table, pt_lens = torch.tensor([[3, 1], [4, 0]], dtype=torch.int32), torch.tensor([7, 2], dtype=torch.int32)
pt_q = torch.randn(2, 2, 32)
pt_out = paged_decoding(pt_q, pt_k_cache, pt_v_cache, pt_table, pt_lens)
pt_want = paged_decoding(pt_q, pt_k_cache, pt_v_cache, pt_table.long(), pt_lens.long())
assert torch.allclose(pt_out, pt_want, atol=1e-6), \
    "int32 and int64 tables give different outputs: load the block number and convert it (.to(tl.int64)) before " \
    "multiplying it by the pool's stride"
pt_half = paged_decoding(pt_q.half(), pt_k_cache, pt_v_cache, pt_table, pt_lens)
assert pt_half.dtype == torch.float16, f"the output is in q's dtype (float16 here), got {pt_half.dtype}"
assert torch.allclose(pt_half.float(), pt_out, atol=5e-3), \
    "a float16 query gives another result: convert q to float32 in the kernel, compute in float32, store in q's dtype"

# %% [hidden]
def _paged_with(**wrong):
    def compute(q, k_cache, v_cache, block_table, seq_lens, scale=None):
        return paged_decoding(q, k_cache, v_cache, block_table, seq_lens, scale, **wrong)
    return compute


PAGED_MISTAKES = [
    Mistake("the logical block j was read as the physical block: token t is in block block_table[b, t // "
            "block_size]", _paged_with(physical=lambda table, b, t, bs: t // bs)),
    Mistake("the block after the right one was read: token t is in block_table[b, t // block_size], slot "
            "t % block_size", _paged_with(physical=lambda table, b, t, bs: table[b, (t // bs + 1) % table.size(1)]
                                          .long())),
    Mistake("the slots past seq_lens[b] in the last block were counted: mask t >= seq_lens[b]",
            _paged_with(lengths=lambda lens, b, bs: -(-int(lens[b]) // bs) * bs)),
    Mistake("the last token was left out: a sequence has seq_lens[b] tokens, 0 to seq_lens[b] - 1",
            _paged_with(lengths=lambda lens, b, bs: int(lens[b]) - 1)),
]


def _pool(t, num_blocks, H, block_size, d):
    return t.randn(num_blocks, H, block_size, d), t.randn(num_blocks, H, block_size, d)


@hidden.test("test_paged_decoding_values")
def _(t):
    P = dict(mistakes=PAGED_MISTAKES)
    k, v = _pool(t, 16, 2, 4, 16)
    table = torch.tensor([[11, 3, 14], [5, 0, 0], [8, 0, 0], [2, 13, 0]])
    t.function("paged_decoding", t.randn(4, 2, 16), k, v, table, torch.tensor([9, 4, 1, 6]),
               label="4 sequences, blocks of 4", **P)
    k, v = _pool(t, 12, 1, 16, 32)
    table = torch.tensor([[7, 2, 9, 0], [4, 11, 1, 6]])
    t.function("paged_decoding", t.randn(2, 1, 32), k, v, table, torch.tensor([40, 64]),
               label="blocks of 16, one sequence filling its 4 blocks", **P)
    k, v = _pool(t, 6, 2, 8, 16)
    t.function("paged_decoding", t.randn(1, 2, 16), k, v, torch.tensor([[5, 3, 1]]), torch.tensor([20]),
               scale=0.4, label="scale=0.4", **P)


@hidden.test("test_paged_decoding_unused_slots")
def _(t):
    P = dict(mistakes=PAGED_MISTAKES)
    k, v = _pool(t, 6, 1, 8, 16)
    q = t.randn(2, 1, 16)
    k[1, 0, 3:], v[1, 0, 3:] = 50 * q[0, 0], 1e4
    k[4, 0], v[4, 0] = 50 * q[1, 0], 1e4
    # sequence 0's row is not [0, 1, ...]: reading it for every sequence differs from reading j as block j
    t.function("paged_decoding", q, k, v, torch.tensor([[3, 1, 4], [2, 5, 4]]), torch.tensor([11, 16]),
               label="stale slots past seq_lens and a padding block of 1e4", **P)
    k, v = _pool(t, 5, 2, 4, 16)
    v[2] = 1e4
    t.function("paged_decoding", t.randn(3, 2, 16), k, v, torch.tensor([[0, 2], [3, 2], [1, 2]]),
               torch.tensor([1, 3, 4]), label="one-token and part-full sequences, padding block of 1e4", **P)


@hidden.test("test_paged_decoding_dtypes")
def _(t):
    P = dict(mistakes=PAGED_MISTAKES)
    k, v = _pool(t, 5, 2, 4, 32)
    t.function("paged_decoding", t.randn(2, 2, 32), k, v, torch.tensor([[3, 1], [4, 0]], dtype=torch.int32),
               torch.tensor([7, 2], dtype=torch.int32), label="int32 table and lengths", **P)
    t.function("paged_decoding", t.randn(2, 2, 32, dtype=torch.float16), k, v, torch.tensor([[3, 1], [4, 0]]),
               torch.tensor([7, 2]), equivalent=HALF, label="a float16 query", **P)

# %% [markdown]
# A batch of the kind a server decodes: six sequences of different lengths in one shared
# pool, their blocks drawn at random from it. The cell runs `paged_decoding` with three
# block sizes and head widths and compares it with torch in float64 on each sequence's
# keys gathered into a contiguous array, and with your flash-decoding on that array:

# %%
def random_pool(lens, num_blocks, heads, block_size, d, seed=0):
    """A pool of random keys and values, and a block table giving each sequence shuffled blocks (0 pads)."""
    gen = torch.Generator().manual_seed(seed)
    k_cache, v_cache = (torch.randn(num_blocks, heads, block_size, d, generator=gen) for _ in range(2))
    free = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(lens), triton.cdiv(max(lens), block_size), dtype=torch.int32)
    for b, n in enumerate(lens):
        for j in range(triton.cdiv(n, block_size)):
            table[b, j] = free.pop()
    return k_cache, v_cache, table


def gathered(cache, table, b, n):
    """Sequence b's n keys (or values) of every head, gathered from the pool: (1, H, n, d)."""
    t = torch.arange(n)
    block_size = cache.size(2)
    return cache[table[b, t // block_size].long(), :, t % block_size].transpose(0, 1)[None].contiguous()


pool_lens = [3, 97, 40, 161, 9, 64]
paged_errors, paged_vs_flash = {}, {}
for block_size, heads, d in [(16, 4, 64), (32, 2, 128), (8, 2, 32)]:
    k_cache, v_cache, table = random_pool(pool_lens, 64, heads, block_size, d)
    q_ = torch.randn(len(pool_lens), heads, d, generator=torch.Generator().manual_seed(1))
    started = time.perf_counter()
    paged_out = paged_decoding(q_, k_cache, v_cache, table, torch.tensor(pool_lens))
    seconds = time.perf_counter() - started
    errors, gaps = [], []
    for b, n in enumerate(pool_lens):
        k_b, v_b = gathered(k_cache, table, b, n), gathered(v_cache, table, b, n)
        errors.append((paged_out[b] - decode_reference(q_[b:b + 1], k_b, v_b)[0][0]).abs().max().item())
        flash_b, _ = combine_partials(*flash_decoding_partials(q_[b:b + 1], k_b, v_b, num_splits=2))
        gaps.append((paged_out[b] - flash_b[0]).abs().max().item())
    paged_errors[block_size], paged_vs_flash[block_size] = max(errors), max(gaps)
    print(f"block_size={block_size:2d} H={heads} d={d:3d}: {len(pool_lens) * heads:2d} programs, "
          f"max |paged - torch float64| = {max(errors):.1e}, max |paged - flash-decoding| = {max(gaps):.1e} "
          f"({seconds:.2f} s, {DEVICE.upper()})")
for b, n in enumerate(pool_lens[:3]):
    print(f"  sequence {b} ({n:3d} tokens) in blocks of {block_size}: {table[b, :triton.cdiv(n, block_size)].tolist()}")
glue("paged_max_error", f"{max(paged_errors.values()):.0e}", display=False)
glue("paged_decode_gap", f"{max(paged_vs_flash.values()):.0e}", display=False)

# %% [markdown]
# The largest difference from float64 is {glue:text}`paged_max_error`, and paged and flash
# decoding agree to {glue:text}`paged_decode_gap`, with the keys read from scattered
# blocks in one case and from one contiguous array in the other.
#
# The program of a long sequence walks all its blocks alone, the weakness of Section 6.
# vLLM's second kernel fixes it the same way flash-decoding does: it splits each
# sequence into partitions of 512 tokens, one program each, and reduces their results by
# the logsumexps in a second kernel (one of this chapter's challenges).

# %% [markdown]
# ## 8. The roofline
#
# Is a kernel limited by its arithmetic or by its memory? The **roofline model** (Williams,
# Waterman and Patterson, 2009) answers with one number per kernel, its **arithmetic
# intensity** $I$: the FLOPs it performs per byte it moves between the GPU's main memory
# (HBM) and the chip. A GPU with a peak of $P$ FLOP/s and a bandwidth of $W$ bytes/s runs a
# kernel at most at
#
# $$\min(P,\; W \cdot I) \ \text{FLOP/s}.$$
#
# Below the **ridge point** $I = P / W$ the memory is the limit, above it the arithmetic.
# For attention of one head, $N$ queries against $N$ keys of dimension $d$, without a
# mask: $QK^\top$ and $PV$ cost $2N^2 d$ FLOPs each, $4N^2 d$ in all (the softmax's
# $O(N^2)$ operations are few beside them). The bytes depend on the algorithm, in bf16
# (2 bytes a number):
#
# - **naive attention** reads $Q, K, V$ and writes $O$ ($4Nd$ numbers), and writes the
#   scores $S$, reads them for the softmax, writes $P$ and reads it for $PV$: $4N^2$ numbers;
# - **FlashAttention-2's forward** reads $Q$ and writes $O$ once, but each program, one
#   tile of $B_r$ = `block_m` queries, reads all of $K$ and $V$: $2Nd + 2Nd \lceil N / B_r
#   \rceil$ numbers, and writes the logsumexp ($N$ float32s);
# - **a decoding step** (Section 6) reads $K$ and $V$ once for $4Nd$ FLOPs.
#
# The given code computes these for the shapes of this chapter and for long sequences, and
# compares them with the ridge points of two GPUs from their datasheets: an H100 SXM,
# 989 TFLOP/s of dense bf16 and 3.35 TB/s of HBM3 (NVIDIA's H100 datasheet), and an A100
# SXM, 312 TFLOP/s and 2.0 TB/s (NVIDIA's A100 datasheet). FlashAttention-2 uses tiles of
# $B_r = 64$ or $128$ queries on these GPUs (Dao, 2023); the interpreter's tests use
# $B_r = 16$.

# %%
BF16, FP32 = 2, 4                                              # bytes per number
GPUS = {"H100 SXM": (989e12, 3.35e12), "A100 SXM": (312e12, 2.0e12)}   # (bf16 dense FLOP/s, HBM bytes/s), datasheets
CS336_H100_MS = {"baseline": 80.0, "best": 5.4}   # CS336's leaderboard: causal fwd+bwd, 16 heads of 64, N = 16,384


def attention_flops(n, d):
    """FLOPs of one head's attention, N queries against N keys, no mask: QK^T and PV."""
    return 4 * n * n * d


def naive_attention_bytes(n, d, size=BF16):
    """Q, K, V read, O written, and S, P each written once and read once, all in HBM."""
    return size * (4 * n * d + 4 * n * n)


def flash_forward_bytes(n, d, block_m, size=BF16):
    """Q read and O written once; K and V read once per tile of block_m queries; lse written."""
    return size * (2 * n * d + 2 * n * d * triton.cdiv(n, block_m)) + FP32 * n


def decoding_flops(n, d):
    return 4 * n * d


def decoding_bytes(n, d, size=BF16):
    return size * (2 * n * d + 2 * d)                           # K and V, then q in and o out


ridge = {gpu: peak / bandwidth for gpu, (peak, bandwidth) in GPUS.items()}
h100_peak, h100_bandwidth = GPUS["H100 SXM"]
intensity = {}
print("     N    d  block_m | FLOP/byte: naive  FA-2  decoding | H100 bound, TFLOP/s: naive  FA-2 | bytes naive/FA-2")
for n, d, block_m in [(128, 64, 16), (4096, 64, 128), (4096, 128, 128), (16384, 64, 128), (16384, 128, 128)]:
    intensity[("naive", n, d)] = attention_flops(n, d) / naive_attention_bytes(n, d)
    intensity[("flash", n, d)] = attention_flops(n, d) / flash_forward_bytes(n, d, block_m)
    intensity[("decode", n, d)] = decoding_flops(n, d) / decoding_bytes(n, d)
    naive_bound, flash_bound = (min(h100_peak, h100_bandwidth * intensity[(kind, n, d)]) / 1e12
                                for kind in ("naive", "flash"))
    print(f"{n:6,d} {d:4d} {block_m:8d} | {intensity[('naive', n, d)]:16.1f} {intensity[('flash', n, d)]:5.1f} "
          f"{intensity[('decode', n, d)]:9.2f} | {naive_bound:26.0f} {flash_bound:5.0f} | "
          f"{naive_attention_bytes(n, d) / flash_forward_bytes(n, d, block_m):16.1f}")
print("ridge points:", ", ".join(f"{gpu} {r:.0f} FLOP/byte" for gpu, r in ridge.items()))
for gpu, r in ridge.items():
    glue(f"ridge_{gpu[:4].lower()}", f"{r:.0f}", display=False)
for (kind, n, d), value in intensity.items():
    glue(f"ai_{kind}_{n}_{d}", f"{value:.1f}" if kind != "decode" else f"{value:.2f}", display=False)
glue("bytes_ratio_16384_64", f"{naive_attention_bytes(16384, 64) / flash_forward_bytes(16384, 64, 128):.1f}",
     display=False)
for kind, digits in [("flash", 0), ("naive", 0), ("decode", 1)]:
    glue(f"bound_{kind}_h100", f"{h100_bandwidth * intensity[(kind, 16384, 64)] / 1e12:.{digits}f}", display=False)
glue("cs336_speedup", f"{CS336_H100_MS['baseline'] / CS336_H100_MS['best']:.1f}", display=False)
glue("decode_peak_share", f"{100 * h100_bandwidth * intensity[('decode', 16384, 64)] / h100_peak:.1f}", display=False)

# %% [tags=hide-input]
FIG_ROOF = dict(title="The roofline: attainable bf16 TFLOP/s against arithmetic intensity (datasheet figures)",
                x="arithmetic intensity (FLOP per byte of HBM traffic)", y="attainable TFLOP/s",
                roof="{gpu}: ridge at {r:.0f} FLOP/byte",
                naive="naive attention", flash="FlashAttention-2 forward", decode="decoding step (N = 16,384)",
                naive_shape="N={n:,}, d={d}", flash_shape="N={n:,}, block_m={m}", points="points on the H100's roof")


def draw_roofline(text=FIG_ROOF):
    fig, ax = plt.subplots(figsize=(9, 5))
    xs = [2 ** (e / 4) for e in range(-8, 45)]
    for (gpu, (peak, bandwidth)), style in zip(GPUS.items(), ["-", "--"]):
        ax.plot(xs, [min(peak, bandwidth * x) / 1e12 for x in xs], style, color="black",
                label=text["roof"].format(gpu=gpu, r=peak / bandwidth))
    peak, bandwidth = GPUS["H100 SXM"]
    points = [("naive", 128, 64, None), ("naive", 16384, 64, None), ("naive", 16384, 128, None),
              ("flash", 128, 64, 16), ("flash", 16384, 64, 128), ("decode", 16384, 64, None)]
    markers = {"naive": ("o", "#d62728"), "flash": ("s", "#1f77b4"), "decode": ("^", "#2ca02c")}
    seen = set()
    for kind, n, d, block_m in points:
        marker, colour = markers[kind]
        x = intensity[(kind, n, d)]
        y = min(peak, bandwidth * x) / 1e12
        ax.scatter([x], [y], marker=marker, color=colour, zorder=3, label=None if kind in seen else text[kind])
        seen.add(kind)
        if kind != "decode":
            label = text["naive_shape"].format(n=n, d=d) if kind == "naive" else \
                text["flash_shape"].format(n=n, m=block_m)
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -12), fontsize=7, color=colour)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(text["x"])
    ax.set_ylabel(text["y"])
    ax.set_title(text["title"], fontsize=10)
    ax.legend(fontsize=8, loc="lower right", title=text["points"], title_fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


draw_roofline()
plt.show()

# %% [markdown]
# The ridge points are {glue:text}`ridge_h100` FLOP/byte for the H100 and
# {glue:text}`ridge_a100` for the A100. Three things follow.
#
# - **Naive attention is memory-bound, whatever $N$.** Its intensity tends to $d/2$:
#   {glue:text}`ai_naive_4096_64` at $N = 4{,}096$ and {glue:text}`ai_naive_16384_64` at
#   $N = 16{,}384$ with $d = 64$, {glue:text}`ai_naive_16384_128` with $d = 128$, far below
#   the ridge. Reading and writing the $N \times N$ matrices bounds it at
#   {glue:text}`bound_naive_h100` TFLOP/s on an H100 at $N = 16{,}384$, $d = 64$.
# - **FlashAttention-2's intensity is its tile of queries.** Every program reads all of
#   $K$ and $V$ for $4 B_r N d$ FLOPs, so $I \approx B_r$: {glue:text}`ai_flash_16384_64`
#   at $N = 16{,}384$ with tiles of $B_r = 128$, moving {glue:text}`bytes_ratio_16384_64`
#   times fewer bytes than naive attention and bounded at {glue:text}`bound_flash_h100`
#   TFLOP/s. With the tiles of $B_r = 16$ that the interpreter runs, at $N = 128$,
#   $d = 64$, the intensity is {glue:text}`ai_flash_128_64` against naive attention's {glue:text}`ai_naive_128_64`:
#   small tiles re-read $K$ and $V$ too often. This is why a GPU kernel uses the largest
#   tiles its fast on-chip memory holds. A causal mask halves both the FLOPs and the
#   tiles of $K$ and $V$ read, and leaves the intensity as it is. The count is
#   pessimistic: programs of the same head that run at the same time share their reads
#   of $K$ and $V$ through the GPU's L2 cache, which moves a real kernel to the right of
#   its point.
# - **A decoding step sits at {glue:text}`ai_decode_16384_64` FLOP/byte**, whatever $N$:
#   each key and value is used once, so an H100 runs it at {glue:text}`bound_decode_h100`
#   TFLOP/s at most, {glue:text}`decode_peak_share`% of its peak. Nothing but bandwidth
#   helps, which is why flash-decoding puts every SM to work reading (Section 6) and why
#   a paged cache (Section 7) must read its blocks in place rather than copy them.
#
# **What the CPU measures here, and what it does not.** Without a GPU, every kernel of this
# chapter runs in Triton's interpreter, which executes each program one after another with
# numpy arrays; it checks that a kernel computes the right numbers with the right masks,
# and says nothing about its speed (a tile step takes milliseconds in the interpreter, a
# microsecond or less on a GPU). For a reference point from real hardware: the public
# leaderboard of Stanford's CS336 (assignment 2, FlashAttention-2 in Triton) times a
# causal forward and backward pass with $16$ heads of $d = 64$ at $N = 16{,}384$ in bf16 on
# an H100; its baseline takes 80 ms and its best entry 5.4 ms,
# {glue:text}`cs336_speedup` times faster. On a machine with a CUDA GPU,
# `benchmarks/attention_kernels_gpu.py` times the chapter's FlashAttention-2 kernels (the
# reference's, or any module's with the same wrappers: `--kernels`) against
# `F.scaled_dot_product_attention` and naive attention, forward and forward+backward, and
# prints the TFLOP/s they reach, to set against the roofline above; its options
# `--batch 1 --heads 16 --d 64 --dtype bf16 --causal on --n 16384` give CS336's shape.

# %% [markdown]
# ## Check your understanding
#
# 1. The softmax kernel loads the lanes past `C` with `other=float("-inf")`. What would
#    go wrong with `other=0.0`, and for which rows would it not matter?
#
#    ```{dropdown} Answer
#    The masked lanes would enter the maximum and the sum as scores of 0: each adds
#    $e^{0 - m}$ to the sum, so every row's probabilities would be too small and would
#    not sum to 1. With $-\infty$ they add $e^{-\infty} = 0$. It would not matter only
#    when $C$ is a power of two, since then no lane is masked (and, for the maximum alone,
#    in rows whose maximum is positive).
#    ```
#
# 2. In the online softmax, why is the old sum multiplied by $e^{m_\text{old} -
#    m_\text{new}}$, and why can this factor never overflow?
#
#    ```{dropdown} Answer
#    Each term of the old sum was computed as $e^{x_j - m_\text{old}}$; against the new
#    maximum it must be
#    $e^{x_j - m_\text{new}} = e^{x_j - m_\text{old}}\,e^{m_\text{old} - m_\text{new}}$,
#    so the whole sum takes the same factor. Since $m_\text{new} \ge m_\text{old}$, the
#    exponent is at most 0 and the factor at most 1.
#    ```
#
# 3. With causal attention, $N = 4{,}096$ and tiles of $128 \times 128$, how many of the
#    tile steps of the non-causal forward does the causal kernel compute, and how many
#    of those need the mask inside?
#
#    ```{dropdown} Answer
#    There are $32 \times 32 = 1{,}024$ tiles. Query tile $i$ (from 0) computes key tiles
#    0 to $i$: $1 + 2 + \dots + 32 = 528$ tiles, about half; only the 32 diagonal tiles
#    need the mask `cols <= rows`, the others are wholly below the diagonal.
#    ```
#
# 4. Why does FlashAttention-2 compute dQ in a second kernel, or with atomics, instead of
#    in the loop that computes dK and dV?
#
#    ```{dropdown} Answer
#    $dK_j$ and $dV_j$ are sums over the queries, $dQ_i$ a sum over the keys. A program
#    that owns a key tile sees, for every query tile, only its own keys' part of $dQ_i$;
#    the other parts belong to other programs running at the same time. Either those
#    parts are added into a shared buffer with atomic additions, or a second kernel gives
#    each query tile a program that loops over all key tiles and sums them itself, at the
#    cost of recomputing $P$ once more.
#    ```

# %% [markdown]
# 5. The backward computes $D_i = \sum_c dO_{ic}\, O_{ic}$ from the output instead of
#    $D_i = \sum_j P_{ij}\, dP_{ij}$. Why are the two equal, and why does it matter for
#    a kernel?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_delta_from_output points=2]
# ### BEGIN SOLUTION
# **Model answer.** $dP_{ij} = dO_i \cdot v_j$, so $\sum_j P_{ij}\, dP_{ij} = dO_i \cdot
# \sum_j P_{ij} v_j = dO_i \cdot o_i$: the sum over keys of the probabilities against
# their gradients collapses into one dot product of two rows of length $d$ that are
# already in memory. Computed from $P$, $D_i$ would need the whole row of $P$ and $dP$,
# every key tile, before any $dS_{ij} = P_{ij}(dP_{ij} - D_i)$ could be formed, so the
# kernel would need an extra pass over all tiles (or the stored $N \times N$ matrix).
# From $O$ and $dO$ a small kernel computes all $N$ values of $D$ first, in $O(Nd)$, and
# every tile of the backward can then use its rows' $D$ at once.
#
# **Rubric (2 points).**
#
# - 1 point: the algebra: $dP = dO\,V^\top$ and $O = PV$ give $\sum_j P_{ij} dP_{ij} =
#   dO_i \cdot o_i$.
# - 1 point: why it matters: $D$ is needed for each tile's $dS$ before the loop over all
#   keys has finished; from $O$ it is available first, for $O(Nd)$ work, without $P$.
# ### END SOLUTION

# %% [markdown]
# ## Challenges (optional, not graded)
#
# - Compute dQ with `tl.atomic_add` into a float32 buffer inside the dK/dV kernel, drop
#   the third kernel, and check that the gradients still agree with autograd. Run it
#   twice: are the results identical bit for bit?
# - Rewrite the forward with tensor descriptors (`tl.make_tensor_descriptor`, which
#   load whole tiles and mask the ragged edge themselves) instead of offsets and masks.
#   (Block pointers, `tl.make_block_ptr`, do the same on a GPU, but Triton 3.9's
#   interpreter does not run them.)
# - Add a dropout on the probabilities that the backward regenerates from a seed
#   (`tl.rand`), as FlashAttention does, instead of storing the mask.
# - Support grouped-query attention (Chapter 8): several query heads share one key and
#   value head. Which program reads which head of $k$ and $v$?
# - On a machine with a CUDA GPU, run `benchmarks/attention_kernels_gpu.py` and compare
#   your kernels' TFLOP/s with `F.scaled_dot_product_attention`.
#
# ## Summary
#
# - A Triton program works on blocks: `tl.program_id` picks its part of the grid,
#   `tl.arange` its offsets, masks its ragged edge. On a CPU the interpreter runs the
#   programs one by one with numpy: a vector add of {glue:text}`add_programs` programs
#   takes {glue:text}`add_ms` ms, so the interpreter shows correctness, not speed.
# - A softmax kernel subtracts each row's maximum; the online softmax keeps a running
#   maximum and a sum rescaled whenever the maximum grows, and ends with the logsumexp.
# - FlashAttention-2's forward gives each program a tile of queries, streams the keys
#   and values through the online softmax in float32 and writes $o$ and lse; it matches
#   naive attention to {glue:text}`fwd_error_o`, skips the causal tiles above the
#   diagonal, and at $N = 4{,}096$ allocates {glue:text}`flash_mib` MiB where the naive
#   version needs {glue:text}`naive_mib` MiB.
# - Its backward recomputes $P$ from lse, takes $D$ from $dO$ and $O$, accumulates dK and
#   dV per key tile and dQ per query tile; through a `torch.autograd.Function` that saves
#   only $q, k, v, o$ and lse, the gradients match autograd to {glue:text}`grad_error`.
#
# ## References
#
# - T. Dao, D. Y. Fu, S. Ermon, A. Rudra, C. Ré (2022). *FlashAttention: Fast and
#   Memory-Efficient Exact Attention with IO-Awareness.* NeurIPS.
#   <https://arxiv.org/abs/2205.14135>
# - T. Dao (2023). *FlashAttention-2: Faster Attention with Better Parallelism and Work
#   Partitioning.* ICLR 2024. <https://arxiv.org/abs/2307.08691>
# - P. Tillet, H. T. Kung, D. Cox (2019). *Triton: An Intermediate Language and Compiler
#   for Tiled Neural Network Computations.* MAPL (PLDI workshop).
#   <https://doi.org/10.1145/3315508.3329973>
# - M. Milakov, N. Gimelshein (2018). *Online normalizer calculation for softmax.*
#   <https://arxiv.org/abs/1805.02867>
# - W. Kwon, Z. Li, S. Zhuang, Y. Sheng, L. Zheng, C. H. Yu, J. E. Gonzalez, H. Zhang,
#   I. Stoica (2023). *Efficient Memory Management for Large Language Model Serving with
#   PagedAttention.* SOSP. <https://arxiv.org/abs/2309.06180>
# - T. Dao, D. Haziza, F. Massa, G. Sizov (2023). *Flash-Decoding for long-context
#   inference.* PyTorch blog. <https://pytorch.org/blog/flash-decoding/>
# - Stanford CS336, *Language Modeling from Scratch*, assignment 2 (systems):
#   FlashAttention-2 in Triton. <https://stanford-cs336.github.io/>
# - The Triton tutorials: fused softmax and fused attention.
#   <https://triton-lang.org/main/getting-started/tutorials/>
