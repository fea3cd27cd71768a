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
          f"max error {decode_errors[shape]:.1e}  ({seconds:.2f} s for {steps} tile steps, {DEVICE})")
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
          f"({seconds:.2f} s, {DEVICE})")
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
