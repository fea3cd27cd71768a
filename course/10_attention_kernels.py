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
import solutions.ch10_attention_kernels as ref
from autograder.hidden import HiddenTests

hidden = HiddenTests(ref)

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
# <!-- (decoding and roofline sections: drafts/ch10/decoding.py) -->
#
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
#    maximum it must be $e^{x_j - m_\text{new}} = e^{x_j - m_\text{old}}\,e^{m_\text{old}
#    - m_\text{new}}$, so the whole sum takes the same factor. Since $m_\text{new} \ge
#    m_\text{old}$, the exponent is at most 0 and the factor at most 1.
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
