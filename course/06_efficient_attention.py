# %% [markdown]
# # Chapter 6: Efficient attention, measured
#
# Chapter 5 assembled the Transformer. Every one of its attention layers compares every
# query with every key: for a sequence of $N$ tokens that is an $N \times N$ matrix of
# scores, in time and in memory. At $N = 512$ nobody notices; at $N = 16\,384$ one such
# matrix in float32 takes 1 GiB ($16\,384^2 \times 4$ bytes), per head and per layer. Since 2019 dozens of
# "efficient" attentions have been proposed to get around it. This chapter builds the
# main families (sparse patterns, low-rank projections, kernels, hashing, an exact
# blocked algorithm, and shared key/value heads) and keeps asking one question of each:
# **what does it save, and what does it cost in accuracy?** Every answer is measured.
#
# **Learning goals.** After this chapter you can
#
# - measure the time and peak memory of attention against the sequence length, on
#   log-log axes, and read the exponent off the slope;
# - build sliding-window, dilated, global (Longformer) and random-block (BigBird) masks
#   and say how many layers it takes for information to cross the sequence;
# - implement Linformer's projection along the sequence and measure its error against
#   the projected length $k$, for random, pooling and trained projections;
# - use the associativity of matrix products to make attention linear in $N$, and
#   write causal linear attention as a recurrence computed in chunks;
# - build Performer's positive random features, measure how many it needs, and show
#   that its error grows with the size of the queries and keys;
# - hash vectors into buckets with Reformer's angular LSH;
# - derive the online softmax and implement FlashAttention's exact blocked forward pass,
#   then see why training also needs a backward pass that recomputes blocks;
# - implement grouped-query attention and compute the key/value cache of real models.
#
# **Prerequisites.** Chapters 2 and 3 (scaled dot-product and multi-head attention,
# masks with True = may attend). Matrix products and their associativity; the
# exponential and the logarithm. No GPU is needed: everything runs on a CPU.
#
# **Time.** About 4 to 5 hours: 1.5 hours of reading and experiments, the rest for
# the seven exercises. Running the whole notebook takes about 3 minutes.
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `local_attention_mask(n, radius, causal, global_tokens)` | the sliding-window mask with Longformer's global tokens | ★ | 3 |
# | `linformer_attention(query, key, value, E, F)` | attention over keys and values projected along the sequence to length $k$ | ★ | 3 |
# | `linear_attention(query, key, value, causal, eps)` | kernelised attention with $\phi(x) = \mathrm{elu}(x) + 1$, linear in $N$, causal as a chunked recurrence | ★★★ | 4 |
# | `performer_features(x, omega)` | FAVOR+ positive random features | ★ | 2 |
# | `lsh_hash(x, rotations)` | Reformer's angular locality-sensitive hash | ★ | 2 |
# | `flash_attention(query, key, value, block_size, causal)` | exact attention, block by block, with an online softmax | ★★★ | 5 |
# | `GroupedQueryAttention(d_model, num_heads, num_kv_heads)` | query heads that share key/value heads | ★★ | 5 |

# %% [export]
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


# %%
import time

import matplotlib.pyplot as plt
plt.rcParams["axes.unicode_minus"] = False  # a log axis's 10^-1 with a hyphen, which every figure font has
import numpy as np

try:                      # the book puts numbers from these cells into its text
    from myst_nb import glue
except ImportError:       # in plain Jupyter: just show them
    def glue(name, value, display=True):
        print(f"{name} = {value}")

torch.set_printoptions(precision=4, sci_mode=False)
# One thread: on a 2-core machine shared with other programs, more threads make timings
# slower and much noisier. Every method below is measured under the same setting.
torch.set_num_threads(1)

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# Two small tools measure everything in this chapter. `best_time` runs a function a few
# times and keeps the fastest run. `peak_memory` runs it once and reports how far the
# process's **peak resident memory** rose above what it used before: on Linux the
# kernel keeps that peak (`VmHWM` in `/proc/self/status`) and lets a process reset it,
# so we measure what the operating system saw, allocator and temporaries included.
# (On other systems it returns NaN and the memory plots stay empty.)

# %% [export tags=hide-input]
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


# %% [tags=hide-input]
try:   # glibc keeps freed memory for reuse; malloc_trim returns it, so that the next peak is measured from a clean start
    import ctypes
    _libc = ctypes.CDLL("libc.so.6")

    def release_free_memory():
        _libc.malloc_trim(0)
except (OSError, AttributeError):
    pass


def best_time(fn, repeat=3, budget=2.0):
    """Fastest of `repeat` runs of fn(), in seconds (fewer runs once `budget` s are spent)."""
    times, started = [], time.perf_counter()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - started > budget:
            break
    return min(times)


def slope(ns, ys, last=3):
    """Slope of log(y) against log(N) over the `last` largest sizes."""
    ns, ys = np.asarray(ns[-last:], float), np.asarray(ys[-last:], float)
    ok = ys > 0
    if ok.sum() < 2:
        return float("nan")
    ns, ys = ns[ok], ys[ok]
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])

# %% [markdown]
# ## 1. Why attention is quadratic, measured
#
# For one head, with $Q \in \mathbb{R}^{N_q \times d_k}$, $K \in \mathbb{R}^{N_k \times d_k}$
# and $V \in \mathbb{R}^{N_k \times d_v}$,
#
# $$S = \frac{Q K^\top}{\sqrt{d_k}} \in \mathbb{R}^{N_q \times N_k}, \qquad
# P = \mathrm{softmax}(S) \in \mathbb{R}^{N_q \times N_k}, \qquad
# O = P V \in \mathbb{R}^{N_q \times d_v}.$$
#
# We count work as in Chapter 2: in FLOPs, one multiply-add being 2 FLOPs. Computing $S$
# takes $N_q N_k d_k$ multiply-adds, $2 N_q N_k d_k$ FLOPs, and $P V$ another
# $2 N_q N_k d_v$: with $N_q = N_k = N$ and $d_k = d_v = d$, that is $4 N^2 d$ FLOPs,
# quadratic in $N$. The inputs and the output hold only $4 N d$ numbers, but the
# straightforward computation stores $S$ and $P$, $2N^2$ numbers, and training keeps $P$
# for the backward pass.
# The picture below shows the two shapes side by side.

# %% [tags=hide-input]
FIG_QUADRATIC = dict(
    title="Naive attention: the inputs are thin, the score matrix is square",
    q="Q  (N x d)", k="K^T  (d x N)", s="S = QK^T / sqrt(d)\nP = softmax(S)\n(N x N):\nstored in memory",
    v="V  (N x d)", o="O = PV  (N x d)", note="N = 16384, d = 64:  Q, K, V, O: 4 MiB each;  S or P: 1 GiB",
)


def draw_quadratic(text=FIG_QUADRATIC):
    fig, ax = plt.subplots(figsize=(9, 4.2))
    boxes = [  # x, y, width, height, label key, colour
        (0.0, 0.0, 0.6, 4.0, "q", "#9ecae1"), (1.0, 4.4, 4.0, 0.6, "k", "#a1d99b"),
        (1.0, 0.0, 4.0, 4.0, "s", "#fdae6b"), (5.4, 0.0, 0.6, 4.0, "v", "#bcbddc"),
        (6.4, 0.0, 0.6, 4.0, "o", "#9ecae1"),
    ]
    for x, y, w, h, key, colour in boxes:
        ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=colour, edgecolor="black"))
        ax.text(x + w / 2, y + h / 2, text[key], ha="center", va="center", fontsize=9,
                rotation=0 if w >= h else 90)
    ax.annotate("", xy=(6.35, 2.0), xytext=(6.05, 2.0), arrowprops=dict(arrowstyle="->"))
    ax.text(3.5, -0.6, text["note"], ha="center", fontsize=9)
    ax.set_xlim(-0.3, 7.3)
    ax.set_ylim(-1.0, 5.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(text["title"], fontsize=11)
    return fig


draw_quadratic()
plt.show()

# %% [markdown]
# Let us measure it, for the naive computation (the given `attention`, which builds
# $P$) and for PyTorch's fused `F.scaled_dot_product_attention`, forward only and
# forward plus backward, on one head with $d = 64$. On log-log axes a cost
# $c N^p$ is a straight line of slope $p$, so the slope says how the cost grows: 1 for
# linear, 2 for quadratic.

# %% [tags=hide-input]
def qkv(n, d=64, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, n, d, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def measure(fn, n, backward=False, repeat=3):
    """(seconds, peak MiB) of fn(q, k, v) at length n; with backward=True, forward plus backward."""
    def run():
        q, k, v = qkv(n, requires_grad=backward)
        out = fn(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        if backward:
            out.sum().backward()
    run()                                                   # warm-up
    seconds = best_time(run, repeat=repeat)
    _, mib = peak_memory(run)
    return seconds, mib


def naive(q, k, v):
    return attention(q, k, v)[0]


def builtin(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def sweep(methods, sizes):
    """{(name, backward): (sizes, seconds, MiB)} for methods {name: (fn, max forward N, max backward N)}."""
    results = {}
    for name, (fn, max_fwd, max_bwd) in methods.items():
        for backward, max_n in ((False, max_fwd), (True, max_bwd)):
            ns = [n for n in sizes if n <= max_n]
            rows = [measure(fn, n, backward) for n in ns]
            results[name, backward] = (ns, [r[0] for r in rows], [r[1] for r in rows])
    return results


FIG_SCALING = dict(time="time (s)", memory="peak memory above start (MiB)", n="sequence length N",
                   fwd="forward", bwd="forward + backward", slope="slope",
                   baseline="Attention cost against sequence length (1 head, d = 64, float32, 1 CPU thread)",
                   everything="Every method: cost against sequence length (1 head, d = 64, float32, 1 CPU thread)")


def plot_scaling(results, title, text=FIG_SCALING):
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), layout="constrained")
    axes = [axes[0, 0], axes[0, 1], axes[1, 0], axes[1, 1]]
    for col, backward in enumerate((False, True)):
        for name in dict.fromkeys(n for n, _ in results):
            if (name, backward) not in results:
                continue
            ns, secs, mibs = results[name, backward]
            axes[col].loglog(ns, secs, "o-", label=f"{name} ({text['slope']} {slope(ns, secs):.2f})")
            ok = [(n, m) for n, m in zip(ns, mibs) if m > 0.5]   # below 0.5 MiB: not measurable
            if ok:
                axes[col + 2].loglog(*zip(*ok), "o-", label=name)
        axes[col].set_title(f"{text['time']}: {text['bwd' if backward else 'fwd']}", fontsize=10)
        axes[col + 2].set_title(f"{text['memory']}: {text['bwd' if backward else 'fwd']}", fontsize=10)
    for ax in axes:
        ax.set_xlabel(text["n"])
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(title, fontsize=11)
    return fig

# %%
SIZES_1 = [256, 512, 1024, 2048, 4096]
started = time.perf_counter()
baseline = sweep({"naive attention": (naive, 4096, 4096), "F.scaled_dot_product_attention": (builtin, 4096, 4096)},
                 SIZES_1)
print(f"measured in {time.perf_counter() - started:.0f} s")
plot_scaling(baseline, FIG_SCALING["baseline"])
plt.show()

ns, secs, mibs = baseline["naive attention", False]
glue("naive_time_slope", slope(ns, secs), display=False)
glue("naive_mem_slope", slope(ns, mibs), display=False)
glue("naive_mem_4096", mibs[-1], display=False)
glue("sdpa_mem_4096", baseline["F.scaled_dot_product_attention", False][2][-1], display=False)
for (name, backward), (ns, secs, mibs) in baseline.items():
    print("  ".join(f"N={n}: {s * 1e3:7.1f} ms {m:6.0f} MiB" for n, s, m in zip(ns[-2:], secs[-2:], mibs[-2:])) +
          f"   {'fwd+bwd' if backward else 'fwd':8s} {name}")                  # names last: any width

# %% [markdown]
# Over the three largest sizes, the naive forward pass grows with slope
# {glue:text}`naive_mem_slope:.2f` in memory: quadratic, as the formula says (at small
# $N$ fixed overheads flatten the curves, which is why the slopes are read off the
# largest sizes). Its time slope, {glue:text}`naive_time_slope:.2f` in this run, scatters
# around 2 from run to run: timings on a machine shared with other work are noisy,
# peak memory is not. At $N = 4096$ the naive forward pass
# needs {glue:text}`naive_mem_4096:.0f` MiB above its starting point, two $N \times N$
# float32 matrices being 128 MiB. The fused built-in needs
# {glue:text}`sdpa_mem_4096:.1f` MiB, a few vectors per query: on a CPU it runs a blocked algorithm (Section 6
# builds one) and never stores $P$. Its *time* is still quadratic: it does the same
# $4N^2 d$ FLOPs. Two different problems, then: **memory**, which can be fixed
# without changing the result, and **time**, which can only drop if we compute
# something other than exact attention. The next sections try both.
#
# (The times are those of this machine when the book was built; they vary from run to
# run. The script `benchmarks/efficient_attention.py` repeats these measurements up to
# $N = 16\,384$.)

# %% [markdown]
# ## 2. Sparse patterns: attend to fewer keys
#
# The simplest saving: let each query see only some keys. Most of the weight of a
# trained model sits near the diagonal anyway, so a **sliding window** of radius $r$
# (key $j$ is visible to query $i$ when $|i - j| \le r$) keeps $N(2r+1)$ of the $N^2$
# scores. Child et al. (2019) trained the first large *sparse Transformers*;
# **Longformer** (Beltagy, Peters and Cohan, 2020) combines a sliding window with a few
# **global tokens** (a classification token, the question in question answering) that
# attend to every position and are attended to by every position; **BigBird** (Zaheer
# et al., 2020) works on blocks of tokens and adds, to windows and global blocks, a few
# **random** blocks per row. As masks, with True = may attend:
#
# $$M_{ij} = \big[\,|i - j| \le r\,\big] \;\lor\; [\,i \in G\,] \;\lor\; [\,j \in G\,],
# \qquad \text{and, when causal, } M_{ij} \leftarrow M_{ij} \land [\,j \le i\,],$$
#
# where $G$ is the set of global tokens. A mask alone saves nothing if the $N \times N$
# scores are still computed and then masked; real implementations compute only the
# visible blocks (Longformer and BigBird with custom kernels). Here we use the masks
# to see *what* each pattern can and cannot see.
#
# ### Exercise: the local attention mask

# %% [exercise local_attention_mask]
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
    ### BEGIN SOLUTION
    i = torch.arange(n)[:, None]                                  # (n, 1) queries
    j = torch.arange(n)[None, :]                                  # (1, n) keys
    mask = (i - j).abs() <= radius                                # (n, n) the window
    is_global = torch.zeros(n, dtype=torch.bool)
    is_global[torch.as_tensor(list(global_tokens), dtype=torch.long)] = True
    mask = mask | is_global[:, None] | is_global[None, :]         # global rows and columns
    if causal:
        mask = mask & (j <= i)                                    # last: nobody sees the future
    return mask
    ### END SOLUTION


# %% [test test_local_attention_mask_window points=1]
"""The window: True exactly where |i - j| <= radius, a bool (n, n) tensor."""
lw = local_attention_mask(6, 1)
assert isinstance(lw, torch.Tensor) and lw.dtype == torch.bool and lw.shape == (6, 6), \
    f"expected a bool (6, 6) tensor, got {getattr(lw, 'dtype', type(lw))} {tuple(getattr(lw, 'shape', ()))}"
assert lw[2, 3] and lw[3, 2], "|i - j| = radius must be inside the window: use <=, not <"
assert not lw[0, 2] and not lw[5, 3], "keys further than radius must be masked (False)"
assert torch.equal(local_attention_mask(5, 0), torch.eye(5, dtype=torch.bool)), \
    "radius 0: every query sees only itself (the diagonal)"
assert local_attention_mask(4, 10).all(), "a radius longer than the sequence lets everyone see everyone"

# %% [test test_local_attention_mask_causal points=1]
"""Causal: no key after the query, inside the window."""
lc = local_attention_mask(6, 2, causal=True)
assert not lc[1, 2], "causal: query 1 must not see key 2 (j > i is the future)"
assert lc[4, 2] and lc[4, 4] and not lc[4, 1], "causal window of radius 2: query 4 sees keys 2, 3, 4 only"
assert torch.equal(lc, local_attention_mask(6, 2) & torch.ones(6, 6, dtype=torch.bool).tril()), \
    "causal mask must be the window AND the lower triangle"

# %% [test test_local_attention_mask_global points=1]
"""Global tokens see everyone and are seen by everyone; causal still hides the future."""
lg = local_attention_mask(8, 1, global_tokens=(0, 5))
assert lg[0].all() and lg[5].all(), "a global token's row must be all True: it attends to every key"
assert lg[:, 0].all() and lg[:, 5].all(), "a global token's column must be all True: every query attends to it"
assert not lg[2, 7], "query 2 and key 7 are neither close nor global: masked"
lgc = local_attention_mask(8, 1, causal=True, global_tokens=[5])
assert not lgc[5, 7], "causal: even a global token must not see the future; apply the causal rule last"
assert lgc[7, 5] and lgc[5, 0], "causal: query 7 sees global token 5, and 5 sees every earlier key"

# %% [markdown]
# The other two patterns are given. A **dilated** window (Longformer uses them in upper
# layers) keeps every $\delta$-th key within radius $r\delta$: the same number of keys,
# a wider reach. BigBird's pattern works on blocks of $b$ tokens: each block row sees its
# neighbouring blocks, the global blocks, and a few blocks chosen at random.

# %% [tags=hide-input]
def dilated_mask(n, radius, dilation):
    """Query i sees key j when |i - j| <= radius * dilation and |i - j| is a multiple of dilation."""
    dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs()
    return (dist <= radius * dilation) & (dist % dilation == 0)


def bigbird_mask(n, block, radius_blocks=1, global_blocks=1, random_blocks=1, seed=0):
    """BigBird-style block mask: neighbouring, global and random blocks (token level, (n, n))."""
    nb = n // block
    g = torch.Generator().manual_seed(seed)
    blocks = local_attention_mask(nb, radius_blocks, global_tokens=range(global_blocks))
    for row in range(nb):
        blocks[row, torch.randperm(nb, generator=g)[:random_blocks]] = True
    return blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)


FIG_MASKS = dict(title="Sparse attention patterns (n = 64; yellow: query row may attend to key column)",
                 panels=["sliding window, r = 3", "dilated window, r = 3, dilation 2",
                         "window + global tokens 0, 32 (Longformer)", "BigBird: blocks of 8, window,\nglobal and random blocks",
                         "causal window, r = 3"],
                 xlabel="key j", ylabel="query i", density="{:.0%} of the scores")

n_demo = 64
patterns = [local_attention_mask(n_demo, 3), dilated_mask(n_demo, 3, 2),
            local_attention_mask(n_demo, 3, global_tokens=(0, 32)), bigbird_mask(n_demo, 8),
            local_attention_mask(n_demo, 3, causal=True)]
fig, axes = plt.subplots(1, 5, figsize=(15, 3.6), layout="constrained")
for ax, mask, name in zip(axes, patterns, FIG_MASKS["panels"]):
    ax.imshow(mask, cmap="viridis", interpolation="nearest")
    ax.set_title(name + "\n" + FIG_MASKS["density"].format(mask.float().mean().item()), fontsize=8)
    ax.set_xlabel(FIG_MASKS["xlabel"], fontsize=8)
    ax.set_ylabel(FIG_MASKS["ylabel"], fontsize=8)
fig.suptitle(FIG_MASKS["title"], fontsize=10)
plt.show()

# %% [markdown]
# **What they cost.** A window of radius $r$ keeps $(2r + 1)$ keys per query, so the
# work is $O(N r d)$: linear in $N$ for a fixed window. Each global token adds a full row
# and a full column, $O(N)$ each.
#
# **What they cannot see.** In one layer, a query with a window of radius $r$ sees only
# $r$ tokens to each side. Stacking layers widens the view: after $L$ layers,
# information has travelled at most $L r$ positions. The mask of $L$ layers stacked is
# the boolean matrix power $M^L$ (query $i$ reaches key $j$ in $L$ steps when some
# path $i \to k_1 \to \dots \to j$ exists), so we can count how many layers each
# pattern needs before every token can influence every other one, at $N = 1024$:

# %%
def layers_to_connect(mask, max_layers=2000):
    """Smallest L with (mask^L)[i, j] True for every i, j (boolean matrix power)."""
    m = mask.float()
    reach = m.clone()
    for layers in range(1, max_layers + 1):
        if bool((reach > 0).all()):
            return layers
        reach = ((reach @ m) > 0).float()
    return None


n_reach = 1024
reach_table = {
    "sliding window, r = 8": local_attention_mask(n_reach, 8),
    "dilated window, r = 8, dilation 4": dilated_mask(n_reach, 8, 4) | local_attention_mask(n_reach, 1),
    "window r = 8 + 1 global token": local_attention_mask(n_reach, 8, global_tokens=(0,)),
    "BigBird, blocks of 16, 1 random block": bigbird_mask(n_reach, 16, global_blocks=0, random_blocks=1),
}
layers_needed = {}
for name, mask in reach_table.items():
    layers_needed[name] = layers_to_connect(mask)
    print(f"{pad_to(name, 40)} keys per query {mask.sum(1).float().mean():6.1f}   layers to connect all: {layers_needed[name]}")
glue("window_layers", layers_needed["sliding window, r = 8"], display=False)
glue("global_layers", layers_needed["window r = 8 + 1 global token"], display=False)
glue("bigbird_layers", layers_needed["BigBird, blocks of 16, 1 random block"], display=False)

# %% [markdown]
# With a window alone, a token at one end needs {glue:text}`window_layers` layers to
# hear from the other end, far more than any real model has. One global token cuts
# this to {glue:text}`global_layers`: every token writes to it in one layer and reads
# from it in the next, a hub with a capacity of one vector. A few random blocks behave
# like the shortcuts of a small-world graph: BigBird's pattern (without its global
# blocks) connects everything in {glue:text}`bigbird_layers` layers, which is the
# intuition behind its proof that sparse attention with global tokens keeps the
# expressive power of full attention. What a sparse pattern cannot do is look directly,
# in one layer, at a token chosen by its *content* far away: the pattern is fixed before
# the data arrives. Section 5 (hashing) chooses the keys by content instead.

# %% [markdown]
# ## 3. Low rank: Linformer
#
# Wang, Li, Khabsa, Fang and Ma (2020) observed that trained attention matrices $P$ are
# close to low rank: a few singular values carry most of their energy. **Linformer**
# exploits it by projecting the keys and values *along the sequence* to a fixed length
# $k \ll N$, with two learned matrices $E, F \in \mathbb{R}^{k \times N_k}$:
#
# $$\bar K = E K \in \mathbb{R}^{k \times d_k}, \qquad \bar V = F V \in \mathbb{R}^{k \times d_v},
# \qquad O = \mathrm{softmax}\!\Big(\frac{Q \bar K^\top}{\sqrt{d_k}}\Big)\, \bar V
# \in \mathbb{R}^{N_q \times d_v}.$$
#
# The weights are now $N_q \times k$: linear in $N$ for a fixed $k$. Each of the $k$
# "keys" is a mixture of all $N_k$ original keys, so nothing is cut off as in a window,
# but everything is blurred together. Two costs: $E$ and $F$ fix $N_k$ (a Linformer
# cannot take a longer input than it was built for), and mixing keys from every
# position does not allow a causal mask (a mixed key contains the future).
#
# ### Exercise: Linformer attention
#
# One trap: the argument is called `F` as in the paper, which hides
# `torch.nn.functional` inside the function. Use `torch.softmax`.

# %% [exercise linformer_attention]
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
    ### BEGIN SOLUTION
    k_proj = E @ key                                                # (..., k, d_k)
    v_proj = F @ value                                              # (..., k, d_v)
    scores = query @ k_proj.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., N_q, k)
    weights = torch.softmax(scores, dim=-1)
    return weights @ v_proj, weights
    ### END SOLUTION


# %% [test test_linformer_attention_values points=2]
"""Values: softmax(Q (E K)^T / sqrt(d_k)) (F V)."""
torch.manual_seed(0)
lf_q, lf_k, lf_v = torch.randn(2, 5, 4), torch.randn(2, 7, 4), torch.randn(2, 7, 3)
lf_E, lf_F = torch.randn(3, 7), torch.randn(3, 7)
lf_out, lf_w = linformer_attention(lf_q, lf_k, lf_v, lf_E, lf_F)
assert lf_out.shape == (2, 5, 3) and lf_w.shape == (2, 5, 3), \
    f"expected output (2, 5, 3) and weights (B, N_q, k) = (2, 5, 3), got {tuple(lf_out.shape)}, {tuple(lf_w.shape)}"
lf_ref_w = torch.softmax(lf_q @ (lf_E @ lf_k).transpose(-2, -1) / 2.0, dim=-1)
assert not torch.allclose(lf_w, torch.softmax(lf_q @ (lf_F @ lf_k).transpose(-2, -1) / 2.0, -1), atol=1e-5), \
    "E and F swapped: keys are projected with E, values with F"
assert not torch.allclose(lf_w, torch.softmax(lf_q @ (lf_E @ lf_k).transpose(-2, -1), -1), atol=1e-5), \
    "scores not scaled by 1/sqrt(d_k)"
assert torch.allclose(lf_w, lf_ref_w, atol=1e-5), "weights differ from softmax(Q (E K)^T / sqrt(d_k))"
assert torch.allclose(lf_out, lf_ref_w @ (lf_F @ lf_v), atol=1e-5), "output differs from weights @ (F V)"

# %% [test test_linformer_attention_sequence_axis points=1]
"""E and F project along the sequence (E @ key mixes the N_k positions, not the features), for any
leading dimensions and any k: the outputs and weights are compared."""
torch.manual_seed(1)
ls_x = torch.randn(1, 2, 6, 6)                      # N_k == d_k: both sides fit, only one is right
ls_E, ls_F = torch.randn(2, 6), torch.randn(2, 6)
ls_out, ls_w = linformer_attention(ls_x, ls_x, ls_x, ls_E, ls_F)
assert ls_w.shape == (1, 2, 6, 2), f"weights should be (..., N_q, k) = (1, 2, 6, 2), got {tuple(ls_w.shape)}"
assert torch.allclose(ls_w, torch.softmax(ls_x @ (ls_E @ ls_x).transpose(-2, -1) / math.sqrt(6), -1), atol=1e-5), \
    "project along the sequence: E @ key mixes the N_k positions; key @ E.T would mix the features"

# %% [markdown]
# ### How good is a low-rank projection?
#
# We measure the relative error $\lVert O_\text{Linformer} - O \rVert / \lVert O \rVert$
# against $k$ on sequences of $N = 256$ tokens whose content varies smoothly along
# the sequence (a sum of a few slow waves plus noise, passed through fixed random query,
# key and value maps), with three kinds of projection:
#
# - **random**: entries drawn from $\mathcal{N}(0, 1/N)$, so that a projected key has
#   the size of one key (Linformer's analysis uses such Johnson-Lindenstrauss
#   projections);
# - **pooling**: row $r$ of $E$ and $F$ averages the $r$-th consecutive segment of
#   $N/k$ positions (no learning, but it respects the order of the sequence);
# - **trained**: $E$ and $F$ start random and are trained with Adam for 120 steps to
#   reproduce full attention on training sequences; the error is measured on other
#   sequences.

# %% [tags=hide-input]
def smooth_sequences(batch, n=256, d=32, seed=0):
    """Sequences that vary slowly along n: random slow waves plus a little noise, (batch, n, d)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, n)
    waves = torch.stack([torch.cos(2 * math.pi * f * t) for f in range(6)], dim=-1)   # (n, 6)
    coeff = torch.randn(batch, 6, d, generator=g) / (1 + torch.arange(6.0))[:, None]
    return waves @ coeff + 0.1 * torch.randn(batch, n, d, generator=g)


g_lin = torch.Generator().manual_seed(1)
W_q, W_k, W_v = (torch.randn(32, 32, generator=g_lin) / math.sqrt(32) * s for s in (2.0, 2.0, 1.0))


def project(x):
    return x @ W_q, x @ W_k, x @ W_v


def relative_error(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


def linformer_error(k, kind, steps=120, n=256):
    q_tr, k_tr, v_tr = project(smooth_sequences(32, n, seed=1))
    q_te, k_te, v_te = project(smooth_sequences(32, n, seed=2))
    exact_tr, exact_te = attention(q_tr, k_tr, v_tr)[0], attention(q_te, k_te, v_te)[0]
    g = torch.Generator().manual_seed(k)
    if kind == "pooling":
        E = torch.kron(torch.eye(k), torch.ones(1, n // k)) / (n // k)             # (k, n) segment means
        return relative_error(linformer_attention(q_te, k_te, v_te, E, E)[0], exact_te)
    E = (torch.randn(k, n, generator=g) / math.sqrt(n)).requires_grad_(kind == "trained")
    Fm = (torch.randn(k, n, generator=g) / math.sqrt(n)).requires_grad_(kind == "trained")
    if kind == "trained":
        opt = torch.optim.Adam([E, Fm], lr=1e-2)
        for _ in range(steps):
            loss = (linformer_attention(q_tr, k_tr, v_tr, E, Fm)[0] - exact_tr).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return relative_error(linformer_attention(q_te, k_te, v_te, E, Fm)[0], exact_te)

# %%
ks = [8, 16, 32, 64, 128]
started = time.perf_counter()
lin_errors = {kind: [linformer_error(k, kind) for k in ks] for kind in ("random", "pooling", "trained")}
print(f"measured in {time.perf_counter() - started:.0f} s")
glue("lin_random_64", lin_errors["random"][ks.index(64)], display=False)
glue("lin_trained_64", lin_errors["trained"][ks.index(64)], display=False)
glue("lin_pool_64", lin_errors["pooling"][ks.index(64)], display=False)
glue("lin_trained_128", lin_errors["trained"][ks.index(128)], display=False)

FIG_LINFORMER = dict(title="Linformer: error against the projected length k (N = 256)",
                     xlabel="projected length k", ylabel="relative error of the output",
                     labels={"random": "random projection", "pooling": "segment pooling",
                             "trained": "trained projection (120 Adam steps)"})
for kind, errs in lin_errors.items():
    print("  ".join(f"k={k}: {e:.3f}" for k, e in zip(ks, errs)) + f"   {FIG_LINFORMER['labels'][kind]}")
fig, ax = plt.subplots(figsize=(6.5, 3.8))
for kind, errs in lin_errors.items():
    ax.semilogx(ks, errs, "o-", base=2, label=FIG_LINFORMER["labels"][kind])
ax.set_xlabel(FIG_LINFORMER["xlabel"])
ax.set_ylabel(FIG_LINFORMER["ylabel"])
ax.set_title(FIG_LINFORMER["title"], fontsize=10)
ax.grid(True, alpha=0.3)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# Random projections are useless here: at $k = 64$ the output is off by
# {glue:text}`lin_random_64:.0%`, no better than an unrelated vector. A random $E$
# mixes distant positions with random signs, and the softmax over mixed keys is not
# a mixture of the softmax. Training the same projections for 120 steps brings the
# error down only to {glue:text}`lin_trained_64:.0%` at $k = 64$, and more rank hardly
# helps ({glue:text}`lin_trained_128:.0%` at $k = 128$). A projection that is not learned
# at all but respects the order of the sequence, segment pooling, reaches
# {glue:text}`lin_pool_64:.1%`: these inputs vary slowly along the sequence, so the mean
# of a segment's keys and values stands in well for each of them. So in this run it is
# not learning that makes a low-rank projection accurate, but its fit to the structure
# of the inputs; the learned projections are worse because 120 steps of Adam from a
# random start do not find such a structure, although pooling is one of the matrices
# they could reach. Linformer learns $E$ and $F$ over a whole training, together with
# the layers that produce the keys and values, which adapt to the projection; our short
# run on fixed inputs cannot show how good that gets. On inputs without such structure
# no $k \ll N$ can be accurate.

# %% [markdown]
# ## 4. Kernels: linear attention and Performer
#
# ### The associativity trick
#
# Write the softmax weights with a similarity function, $\mathrm{sim}(q, k) =
# \exp(q \cdot k / \sqrt{d})$:
#
# $$o_i = \frac{\sum_j \mathrm{sim}(q_i, k_j)\, v_j}{\sum_j \mathrm{sim}(q_i, k_j)} .$$
#
# Katharopoulos, Vyas, Pappas and Fleuret (2020) replace $\mathrm{sim}$ by a dot
# product of features, $\mathrm{sim}(q, k) = \phi(q) \cdot \phi(k)$ with a feature map
# $\phi: \mathbb{R}^d \to \mathbb{R}^{m}$ whose values are positive. Then the sums over
# $j$ no longer depend on $i$:
#
# $$o_i = \frac{\phi(q_i)^\top \sum_j \phi(k_j)\, v_j^\top}{\phi(q_i)^\top \sum_j \phi(k_j)}
# = \frac{\phi(q_i)^\top S}{\phi(q_i) \cdot z}, \qquad
# S = \sum_j \phi(k_j)\, v_j^\top \in \mathbb{R}^{m \times d_v}, \quad
# z = \sum_j \phi(k_j) \in \mathbb{R}^{m}.$$
#
# In matrix form this is the associativity of matrix products:
# $(\phi(Q)\,\phi(K)^\top)\,V = \phi(Q)\,(\phi(K)^\top V)$. The left side builds an
# $N_q \times N_k$ matrix and costs $O(N_q N_k m)$; the right side builds the
# $m \times d_v$ matrix $S$ once and costs $O((N_q + N_k)\, m\, d_v)$, linear in $N$.
# Their choice of feature map is $\phi(x) = \mathrm{elu}(x) + 1$ (elementwise,
# $m = d$), which is positive everywhere: $\mathrm{elu}(x) = x$ for $x > 0$ and
# $e^x - 1$ otherwise, so $\mathrm{elu}(x) + 1 > 0$. Without the $+1$, features can be
# negative and the denominator can be zero or negative.
#
# ### Causal: a recurrence, that is an RNN
#
# With a causal mask the sums run over $j \le i$ only, $S_i = \sum_{j \le i}
# \phi(k_j) v_j^\top$ and $z_i = \sum_{j \le i} \phi(k_j)$, so they are **running
# states**:
#
# $$S_i = S_{i-1} + \phi(k_i)\, v_i^\top, \qquad z_i = z_{i-1} + \phi(k_i), \qquad
# o_i = \frac{\phi(q_i)^\top S_i}{\phi(q_i) \cdot z_i + \varepsilon}.$$
#
# This is a recurrent network whose state is the $m \times d_v$ matrix $S_i$ (hence
# the paper's title, *Transformers are RNNs*): generation costs $O(1)$ per token
# instead of attending over the whole past. A Python loop over tokens is slow, though.
# The fast way is **chunks** of $C$ tokens: inside a chunk, compute the small causal
# $C \times C$ matrix $\phi(Q_c)\phi(K_c)^\top$ (masked to $j \le i$) directly; from
# earlier chunks, use the state carried over; then add the chunk's keys and values to
# the state. Each chunk costs $O(C^2 m + C m d_v)$, and nothing ever has $N^2$ entries.
#
# ### Exercise: linear attention

# %% [exercise linear_attention]
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
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %% [test test_linear_attention_values points=1]
"""Non-causal: phi(Q) (phi(K)^T V) / (phi(Q) . sum_j phi(k_j) + eps), phi = elu + 1."""
torch.manual_seed(0)
la_q, la_k, la_v = torch.randn(2, 5, 4), torch.randn(2, 7, 4), torch.randn(2, 7, 3)
la_out = linear_attention(la_q, la_k, la_v)
assert isinstance(la_out, torch.Tensor) and la_out.shape == (2, 5, 3), \
    f"return only the output, shape (B, N_q, d_v) = (2, 5, 3); got {type(la_out).__name__} {tuple(getattr(la_out, 'shape', ()))}"
la_pq, la_pk = F.elu(la_q) + 1, F.elu(la_k) + 1
la_ref = (la_pq @ la_pk.transpose(-2, -1)) @ la_v / ((la_pq @ la_pk.transpose(-2, -1)).sum(-1, keepdim=True) + 1e-6)
la_no1 = (F.elu(la_q) @ F.elu(la_k).transpose(-2, -1))
assert not torch.allclose(la_out, la_no1 @ la_v / (la_no1.sum(-1, keepdim=True) + 1e-6), atol=1e-4), \
    "feature map without +1: phi(x) = elu(x) + 1 keeps every feature positive"
assert torch.allclose(la_out, la_ref, atol=1e-4), "output differs from phi(Q) (phi(K)^T V) / (phi(Q) . z + eps)"
la_big = linear_attention(la_q, la_k, la_v, eps=100.0)
assert torch.allclose(la_big, (la_pq @ la_pk.transpose(-2, -1)) @ la_v
                      / ((la_pq @ la_pk.transpose(-2, -1)).sum(-1, keepdim=True) + 100.0), atol=1e-4), \
    "eps is added to the denominator phi(q_i) . z (use the eps argument)"

# %% [test test_linear_attention_causal points=2]
"""Causal: query i sums over keys j <= i only, and the result is the token-by-token recurrence."""
torch.manual_seed(1)
lcq, lck, lcv = torch.randn(1, 2, 150, 4), torch.randn(1, 2, 150, 4), torch.randn(1, 2, 150, 3)
lc_out = linear_attention(lcq, lck, lcv, causal=True)
assert lc_out.shape == (1, 2, 150, 3), f"expected (1, 2, 150, 3), got {tuple(lc_out.shape)}"
assert not torch.allclose(lc_out, linear_attention(lcq, lck, lcv), atol=1e-4), \
    "causal output equals the non-causal one: the sums must run over j <= i only"
lc_pq, lc_pk = F.elu(lcq) + 1, F.elu(lck) + 1
lc_a = (lc_pq @ lc_pk.transpose(-2, -1)).tril()                 # fine here: N is small
lc_ref = lc_a @ lcv / (lc_a.sum(-1, keepdim=True) + 1e-6)
assert torch.allclose(lc_out, lc_ref, atol=1e-4), \
    "causal output differs from sum_{j<=i} phi(q_i).phi(k_j) v_j / (sum_{j<=i} phi(q_i).phi(k_j) + eps): " \
    "does every chunk use the state of all earlier chunks, and its own keys up to i (diagonal included)?"
lcv2 = lcv.clone()
lcv2[..., 100:, :] += 1.0
assert torch.allclose(linear_attention(lcq, lck, lcv2, causal=True)[..., :100, :], lc_out[..., :100, :], atol=1e-5), \
    "causal: outputs 0..99 must not depend on values at positions >= 100 (future keys included?)"

# %% [test test_linear_attention_memory points=1]
"""No N x N tensor: at N = 4096, peak memory stays far below one 4096 x 4096 matrix (64 MiB). Graded at
N = 8192, causal and not: the memory, and the outputs too."""
lm_q, lm_k, lm_v = (torch.randn(1, 4096, 16) for _ in range(3))
for lm_causal in (False, True):
    _, lm_mib = peak_memory(lambda: linear_attention(lm_q, lm_k, lm_v, causal=lm_causal))
    if lm_mib == lm_mib:                     # NaN where the peak cannot be measured (not Linux)
        assert lm_mib < 32, f"causal={lm_causal}: memory rose by {lm_mib:.0f} MiB: an N x N tensor was built " \
            "(use phi(K)^T V, and chunks with a running state when causal)"

# %% [markdown]
# Let us check that the chunked computation is the recurrence: a plain loop over tokens
# that updates $S$ and $z$ gives the same outputs, and we time both.

# %%
def linear_attention_rnn(query, key, value, eps=1e-6):
    """Causal linear attention as an RNN: one token at a time, state (S, z)."""
    q, k = F.elu(query) + 1, F.elu(key) + 1
    S = query.new_zeros(*q.shape[:-2], q.size(-1), value.size(-1))
    z = query.new_zeros(*q.shape[:-2], q.size(-1))
    outs = []
    for i in range(q.size(-2)):
        S = S + k[..., i, :, None] * value[..., i, None, :]          # (..., d, d_v)
        z = z + k[..., i, :]
        outs.append((q[..., i, None, :] @ S)[..., 0, :] / ((q[..., i, :] * z).sum(-1, keepdim=True) + eps))
    return torch.stack(outs, dim=-2)


q_r, k_r, v_r = (torch.randn(1, 2048, 32, generator=torch.Generator().manual_seed(s)) for s in range(3))
t_rnn = best_time(lambda: linear_attention_rnn(q_r, k_r, v_r), repeat=1)
t_chunk = best_time(lambda: linear_attention(q_r, k_r, v_r, causal=True))
diff_rnn = (linear_attention_rnn(q_r, k_r, v_r) - linear_attention(q_r, k_r, v_r, causal=True)).abs().max().item()
print(f"N = 2048: token loop {t_rnn * 1e3:.0f} ms, chunks {t_chunk * 1e3:.1f} ms, max |difference| {diff_rnn:.1e}")
glue("rnn_speedup", t_rnn / t_chunk, display=False)

# %% [markdown]
# Same numbers, {glue:text}`rnn_speedup:.0f` times faster in chunks: the loop pays
# Python's overhead 2048 times; chunks turn the work into a few large matrix products.
#
# Linear attention is a different model, not an approximation of softmax attention:
# $\mathrm{elu}(q) + 1$ dotted with $\mathrm{elu}(k) + 1$ is a much flatter similarity
# than $\exp(q \cdot k/\sqrt{d})$, and a model must be trained with it. Performer asks
# whether features can *approximate* the softmax kernel instead.
#
# ### Performer: positive random features
#
# Choromanski et al. (2021) use the identity, for $\omega \sim \mathcal{N}(0, I_d)$,
#
# $$\exp(x \cdot y) = \mathbb{E}_\omega\Big[\exp\big(\omega \cdot x - \tfrac{\lVert x\rVert^2}{2}\big)
# \exp\big(\omega \cdot y - \tfrac{\lVert y\rVert^2}{2}\big)\Big],$$
#
# which follows from $\mathbb{E}[e^{\omega \cdot u}] = e^{\lVert u\rVert^2/2}$ with
# $u = x + y$. Averaging over $m$ samples $\omega_1, \dots, \omega_m$ (the columns of
# $\Omega \in \mathbb{R}^{d \times m}$) gives the feature map of **FAVOR+**,
#
# $$\phi(x) = \frac{1}{\sqrt m} \exp\Big(x\,\Omega - \frac{\lVert x\rVert^2}{2}\Big) \in \mathbb{R}^{m},
# \qquad \phi(x) \cdot \phi(y) \approx \exp(x \cdot y),$$
#
# positive (so the denominators stay positive, unlike with $\cos$/$\sin$ features) and
# unbiased. For attention, apply it to $q / d^{1/4}$ and $k / d^{1/4}$, so that
# $\exp(q \cdot k/\sqrt d)$ is estimated, and use the associativity trick as above.
# The $-\lVert x\rVert^2/2$ term is what makes the estimate unbiased: without it, every
# feature of $x$ is multiplied by $e^{\lVert x\rVert^2/2}$.

# %% [exercise performer_features]
def performer_features(x, omega):
    """FAVOR+ positive random features (Choromanski et al., 2021).

    Args:
        x: (..., d) float tensor.
        omega: (d, m) float tensor of random directions (same dtype as x).

    Returns:
        (..., m) tensor phi(x) = exp(x @ omega - |x|^2 / 2) / sqrt(m), where |x|^2
        is the squared Euclidean norm of x over its last dimension.
    """
    ### BEGIN SOLUTION
    m = omega.size(-1)
    sq_norm = (x * x).sum(dim=-1, keepdim=True)                    # (..., 1)
    return torch.exp(x @ omega - sq_norm / 2) / math.sqrt(m)       # (..., m)
    ### END SOLUTION


# %% [test test_performer_features_values points=2]
"""phi(x) = exp(x @ omega - |x|^2/2) / sqrt(m), and phi(x).phi(y) estimates exp(x.y)."""
torch.manual_seed(0)
pf_x, pf_om = torch.randn(2, 3, 4) * 0.5, torch.randn(4, 6)
pf = performer_features(pf_x, pf_om)
assert pf.shape == (2, 3, 6), f"expected (..., m) = (2, 3, 6), got {tuple(pf.shape)}"
pf_sq = (pf_x ** 2).sum(-1, keepdim=True)
assert not torch.allclose(pf, torch.exp(pf_x @ pf_om) / math.sqrt(6), atol=1e-5), \
    "missing -|x|^2/2: the estimate of exp(x.y) is then biased by exp((|x|^2 + |y|^2)/2)"
assert not torch.allclose(pf, torch.exp(pf_x @ pf_om - pf_sq / 2), atol=1e-5), "missing the 1/sqrt(m) factor"
assert torch.allclose(pf, torch.exp(pf_x @ pf_om - pf_sq / 2) / math.sqrt(6), atol=1e-5), \
    "differs from exp(x @ omega - |x|^2/2) / sqrt(m) (|x|^2: the squared norm over the last dimension)"
pf_big = torch.randn(4, 200000, generator=torch.Generator().manual_seed(0))
pf_a, pf_b = torch.tensor([0.3, -0.2, 0.1, 0.4]), torch.tensor([0.2, 0.1, -0.3, 0.2])
pf_est = (performer_features(pf_a, pf_big) * performer_features(pf_b, pf_big)).sum()
assert abs(pf_est - torch.exp(pf_a @ pf_b)) < 0.02, \
    f"with 200000 features phi(a).phi(b) should be close to exp(a.b) = {torch.exp(pf_a @ pf_b):.3f}, got {pf_est:.3f}"

# %% [markdown]
# How many features does it take? We compare Performer attention with exact softmax
# attention on random queries and keys at three scales: small vectors (entries of size
# 0.25, scores near zero), twice as large, and standard-normal entries (norm about
# $\sqrt d$). $N = 512$, $d = 32$, 5 draws of $\Omega$ each. At all three scales the
# attention weights are nearly uniform; we measure how flat after the figure.

# %%
def performer_attention(q, k, v, omega):
    """softmax(q k^T / sqrt(d)) v estimated with positive random features, linear in N."""
    d = q.size(-1)
    pq, pk = performer_features(q / d ** 0.25, omega), performer_features(k / d ** 0.25, omega)  # (..., N, m)
    return (pq @ (pk.transpose(-2, -1) @ v)) / (pq @ pk.sum(-2, keepdim=True).transpose(-2, -1))


def performer_error(m, scale, n=512, d=32, draws=5):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    q, k = q * scale, k * scale
    exact = attention(q, k, v)[0]
    errs = [relative_error(performer_attention(q, k, v, torch.randn(d, m, generator=g, dtype=torch.float64)), exact)
            for _ in range(draws)]
    return float(np.median(errs))


ms = [16, 64, 256, 1024, 4096]
scales = {"small scores (x 0.25)": 0.25, "moderate (x 0.5)": 0.5, "norm ~ sqrt(d) (x 1)": 1.0}
started = time.perf_counter()
perf_errors = {name: [performer_error(m, s) for m in ms] for name, s in scales.items()}
print(f"measured in {time.perf_counter() - started:.0f} s")
for name, errs in perf_errors.items():
    print(f"{pad_to(name, 22)} " + "  ".join(f"m={m}: {e:.3f}" for m, e in zip(ms, errs)))
glue("perf_small_256", perf_errors["small scores (x 0.25)"][ms.index(256)], display=False)
glue("perf_mid_256", perf_errors["moderate (x 0.5)"][ms.index(256)], display=False)
glue("perf_peak_4096", perf_errors["norm ~ sqrt(d) (x 1)"][ms.index(4096)], display=False)

FIG_PERFORMER = dict(title="Performer (FAVOR+): error against the number of random features (N = 512, d = 32)",
                     xlabel="number of features m", ylabel="relative error of the output")
fig, ax = plt.subplots(figsize=(6.5, 3.8))
for name, errs in perf_errors.items():
    ax.loglog(ms, errs, "o-", label=name)
ax.loglog(ms, [perf_errors["small scores (x 0.25)"][0] * (ms[0] / m) ** 0.5 for m in ms], "k:", label="1/sqrt(m)")
ax.set_xlabel(FIG_PERFORMER["xlabel"])
ax.set_ylabel(FIG_PERFORMER["ylabel"])
ax.set_title(FIG_PERFORMER["title"], fontsize=9)
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# With small scores the error falls like $1/\sqrt m$, the rate of any Monte Carlo
# average, so each halving costs four times the features: {glue:text}`perf_small_256:.0%`
# error at $m = 256$. At twice the scale it is {glue:text}`perf_mid_256:.0%` at
# $m = 256$, and for vectors of norm about $\sqrt d$ even $m = 4096$ features (more
# than the $N = 512$ keys, where linear attention no longer saves anything) leave an
# error of {glue:text}`perf_peak_4096:.0%` (the median of 5 draws).
#
# What makes the estimate bad is the size of the vectors, not the shape of the
# attention. For $x = q/d^{1/4}$, $y = k/d^{1/4}$ and one feature, the product
# $Z = e^{\omega \cdot x - \lVert x\rVert^2/2}\, e^{\omega \cdot y - \lVert y\rVert^2/2}$
# has mean $e^{x \cdot y}$ and $\mathbb{E}[Z^2] = e^{2\lVert x+y\rVert^2 - \lVert x\rVert^2 - \lVert y\rVert^2}$,
# so its relative variance is
#
# $$\frac{\operatorname{Var} Z}{(\mathbb{E} Z)^2} = e^{\lVert x + y\rVert^2} - 1,$$
#
# divided by $m$ for $m$ features: it grows exponentially with the squared norm of
# $x + y$, whatever the weights look like. The table below separates the two. For each
# scale it gives the mean $\lVert q' + k' \rVert^2$ over pairs of a query and a key
# ($q' = q/d^{1/4}$, $k' = k/d^{1/4}$), how flat the weights are (the entropy of a row
# divided by $\log N$, 1 for uniform weights, and the largest weight of a row divided by
# the uniform weight $1/N$), and the error with $m = 256$. The last row has the norms of
# the scale-1 row but queries and keys in orthogonal halves of the features, so that
# every score is 0 and the weights are *exactly* uniform.

# %%
def performer_error_of(q, k, v, m=256, draws=5):
    """Median relative error of Performer attention over draws of Omega, for given q, k, v."""
    g = torch.Generator().manual_seed(0)
    exact = attention(q, k, v)[0]
    return float(np.median([relative_error(performer_attention(q, k, v, torch.randn(q.size(-1), m, generator=g,
                                                                                    dtype=q.dtype)), exact)
                            for _ in range(draws)]))


g_norm = torch.Generator().manual_seed(0)
n_pf, d_pf = 512, 32
q_pf, k_pf, v_pf = (torch.randn(4, n_pf, d_pf, generator=g_norm, dtype=torch.float64) for _ in range(3))
first_half = (torch.arange(d_pf) < d_pf // 2).double()
norm_settings = {f"x {s}": (s * q_pf, s * k_pf) for s in (0.25, 0.5, 0.75, 1.0)}
norm_settings.update({"x 1, q and k orthogonal": (math.sqrt(2) * q_pf * first_half,
                                                   math.sqrt(2) * k_pf * (1 - first_half))})
norm_rows = {}
for name, (q_s, k_s) in norm_settings.items():
    w = torch.softmax(q_s @ k_s.transpose(-2, -1) / math.sqrt(d_pf), dim=-1)          # (4, N, N)
    flatness = -(w * w.log()).sum(-1).mean().item() / math.log(n_pf)
    peak = n_pf * w.amax(-1).mean().item()
    pair_norm = (q_s.pow(2).sum(-1).mean(-1) + k_s.pow(2).sum(-1).mean(-1)            # mean over all (i, j)
                 + 2 * (q_s.mean(1) * k_s.mean(1)).sum(-1)).mean().item() / math.sqrt(d_pf)   # of |q_i + k_j|^2
    norm_rows[name] = (pair_norm, flatness, peak, performer_error_of(q_s, k_s, v_pf))
print(f"{pad_to('|q+k|^2 / sqrt(d)', 17, '>')} {pad_to('entropy / log N', 15, '>')} {pad_to('max weight x N', 14, '>')} {pad_to('error, m = 256', 14, '>')}"
      "   queries and keys")                                                  # names last: any width
for name, (pair_norm, flatness, peak, err) in norm_rows.items():
    print(f"{pair_norm:17.2f} {flatness:15.3f} {peak:14.1f} {err:14.2f}   {name}")
glue("pf_norm_x1", norm_rows["x 1.0"][0], display=False)
glue("pf_flat_x1", norm_rows["x 1.0"][1], display=False)
glue("pf_peak_x1", norm_rows["x 1.0"][2], display=False)
glue("pf_err_x1", norm_rows["x 1.0"][3], display=False)
glue("pf_err_x025", norm_rows["x 0.25"][3], display=False)
glue("pf_err_orth", norm_rows["x 1, q and k orthogonal"][3], display=False)

# %% [markdown]
# At the largest scale the weights are still nearly flat: a row's entropy is
# {glue:text}`pf_flat_x1:.2f` of the uniform one, and its largest weight only
# {glue:text}`pf_peak_x1:.0f` times $1/N$. Yet $\lVert q' + k' \rVert^2$ is about
# {glue:text}`pf_norm_x1:.0f` there, and the error {glue:text}`pf_err_x1:.0%`, against
# {glue:text}`pf_err_x025:.0%` at scale 0.25. With the same norms and exactly uniform
# weights (the orthogonal row) the error is just as bad, {glue:text}`pf_err_orth:.0%`:
# it follows the norms, as the formula says. (Peaked weights need large scores, so
# they come with large norms; the converse fails.) That is the honest summary of random
# features: they approximate softmax attention poorly unless the queries and keys are
# small or the features many, or the model is trained (or fine-tuned) with them so that
# it adapts to the approximation, which is how Performers are used in practice.
#
# :::{admonition} Correction: what Performer costs
# :class: warning
# A popular summary states that Performer reduces attention to $O(N \cdot d)$ with $d$
# the feature dimension. The cost is $O(N\, m\, d)$, with $m$ the number of random
# features, and as measured above $m$ must be large (hundreds to thousands) for a
# useful approximation. The same summary credits **Nyströmformer** to "Dao et al.,
# 2021": it is by Xiong, Zeng, Chakraborty, Tan, Fung, Li and Singh (AAAI 2021). Tri
# Dao is the first author of FlashAttention (Section 6).
# :::

# %% [markdown]
# ## 5. Hashing: Reformer's LSH attention
#
# Softmax weights are dominated by the keys most similar to the query. **Reformer**
# (Kitaev, Kaiser and Levskaya, 2020) finds them by hashing: vectors that point in
# similar directions should land in the same bucket, and each query attends only
# within its bucket (after sorting by bucket and cutting into chunks, $O(N \log N)$).
# Reformer shares queries and keys ($Q = K$) so that a query's bucket holds its keys.
#
# The hash is the **angular LSH** of Andoni et al. (2015): draw a random matrix
# $R \in \mathbb{R}^{d \times b/2}$, project, and take the largest of the $b$ numbers
# $x R$ and $-x R$:
#
# $$h(x) = \arg\max\big(\,[\,xR\,;\,-xR\,]\,\big) \in \{0, \dots, b-1\}.$$
#
# Each column $r$ of $R$ is a random direction, and $[\,xR\,;\,-xR\,]$ lists $x$'s
# projections on the $b/2$ directions *and on their opposites*: $x$ lands in the bucket
# of the one of these $b$ directions it is closest to in angle. So $b/2$ random
# directions give $b$ buckets, angular cells that together cover the whole sphere, and
# $x$ and $-x$ always land in buckets $b/2$ apart. (It is not that $xR$ alone would put
# a vector and its opposite in one bucket: the argmax of $-xR$ is the argmin of $xR$, a
# different bucket. We measure both after the exercise.)

# %% [exercise lsh_hash]
def lsh_hash(x, rotations):
    """Reformer's angular LSH bucket of every vector.

    Args:
        x: (..., N, d) float tensor.
        rotations: (d, b/2) float tensor R (same dtype as x), b the number of buckets (even).

    Returns:
        (..., N) long tensor of buckets in [0, b): argmax over the last dimension of
        cat([x @ R, -x @ R], dim=-1) (ties: not graded).
    """
    ### BEGIN SOLUTION
    projected = x @ rotations                                       # (..., N, b/2)
    return torch.cat([projected, -projected], dim=-1).argmax(dim=-1)
    ### END SOLUTION


# %% [test test_lsh_hash_values points=2]
"""Buckets argmax(cat(xR, -xR)): a long tensor in [0, b), opposite vectors b/2 apart."""
torch.manual_seed(0)
lh_x, lh_R = torch.randn(2, 50, 8), torch.randn(8, 4)
lh = lsh_hash(lh_x, lh_R)
assert isinstance(lh, torch.Tensor) and lh.shape == (2, 50) and lh.dtype == torch.long, \
    f"expected a long (2, 50) tensor of buckets, got {getattr(lh, 'dtype', type(lh))} {tuple(getattr(lh, 'shape', ()))}"
assert lh.max() >= 4, "every bucket is < b/2: take the argmax over cat([x @ R, -x @ R]), not x @ R alone"
assert torch.equal(lh, torch.cat([lh_x @ lh_R, -lh_x @ lh_R], -1).argmax(-1)), \
    "buckets differ from argmax(cat([x @ R, -x @ R], dim=-1)) (x @ R first, then -x @ R)"
assert torch.equal(lsh_hash(-lh_x, lh_R), (lh + 4) % 8), "the bucket of -x must be that of x shifted by b/2"

# %% [markdown]
# Here are buckets drawn for real inputs: 2-dimensional vectors around the circle
# ($b = 8$ buckets, one random $R$), and random unit vectors in 64 dimensions (Gaussian
# directions, no structure), paired with a second unit vector at a chosen angle, where
# we ask how often the two share a bucket, for $b = 2$ to $32$ (estimated over 2000
# pairs, each with its own random $R$).

# %% [tags=hide-input]
FIG_LSH = dict(title_circle="8 buckets of one random R (d = 2)", title_curve="P(same bucket) against the angle (d = 64)",
               xlabel="angle between the two vectors (degrees)", ylabel="probability of the same bucket",
               buckets="b = {} buckets")
g_lsh = torch.Generator().manual_seed(0)
angles_2d = torch.linspace(0, 2 * math.pi, 720)
circle = torch.stack([angles_2d.cos(), angles_2d.sin()], -1)          # (720, 2)
buckets_2d = lsh_hash(circle, torch.randn(2, 4, generator=g_lsh))

degrees = torch.arange(0, 181, 10)
same_bucket = {}
d_lsh, trials = 64, 2000
base = torch.randn(trials, d_lsh, generator=g_lsh)
base = base / base.norm(dim=-1, keepdim=True)
ortho = torch.randn(trials, d_lsh, generator=g_lsh)
ortho = ortho - (ortho * base).sum(-1, keepdim=True) * base
ortho = ortho / ortho.norm(dim=-1, keepdim=True)
for b in (2, 8, 32):
    R = torch.randn(trials, d_lsh, b // 2, generator=g_lsh)            # one R per trial
    probs = []
    for deg in degrees:
        theta = math.radians(deg)
        other = math.cos(theta) * base + math.sin(theta) * ortho       # at angle theta from base
        same = lsh_hash(base[:, None], R)[:, 0] == lsh_hash(other[:, None], R)[:, 0]
        probs.append(same.float().mean().item())
    same_bucket[b] = probs

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
ax1.scatter(circle[:, 0], circle[:, 1], c=buckets_2d, cmap="tab10", s=6, vmin=0, vmax=9)
for b_id in range(8):
    pts = circle[buckets_2d == b_id]
    if len(pts):
        mid = pts.mean(0)
        ax1.text(1.25 * mid[0] / mid.norm(), 1.25 * mid[1] / mid.norm(), str(b_id), ha="center", va="center")
ax1.set_aspect("equal")
ax1.set_xlim(-1.5, 1.5)
ax1.set_ylim(-1.5, 1.5)
ax1.set_title(FIG_LSH["title_circle"], fontsize=10)
for b, probs in same_bucket.items():
    ax2.plot(degrees, probs, "o-", label=FIG_LSH["buckets"].format(b))
ax2.set_xlabel(FIG_LSH["xlabel"])
ax2.set_ylabel(FIG_LSH["ylabel"])
ax2.set_title(FIG_LSH["title_curve"], fontsize=10)
ax2.grid(True, alpha=0.3)
ax2.legend(fontsize=8)
plt.show()
glue("lsh_30_8", same_bucket[8][3], display=False)
glue("lsh_30_32", same_bucket[32][3], display=False)
glue("lsh_90_8", same_bucket[8][9], display=False)

# %% [markdown]
# On the circle the buckets are arcs, and opposite arcs carry buckets $b/2$ apart. In
# 64 dimensions, two vectors $30°$ apart share one of 8 buckets with probability
# {glue:text}`lsh_30_8:.2f` and one of 32 buckets with probability
# {glue:text}`lsh_30_32:.2f`, while orthogonal vectors share one of 8 buckets with
# probability {glue:text}`lsh_90_8:.2f`. More buckets make the buckets smaller and
# purer, but close neighbours get split more often; Reformer therefore hashes several
# times with independent $R$ and attends within the union of the buckets. Each query
# can miss a key that matters: LSH attention is an approximation whose error depends
# on the data, the number of buckets and the number of hashing rounds.

# %% [markdown]
# **Why both signs?** Three hashes of the same 2000 random unit vectors in 64
# dimensions, each vector with its own random directions: $\arg\max [\,xR\,;\,-xR\,]$
# with $b/2 = 4$ directions (Reformer's), $\arg\max xR$ with the same 4 directions, and
# $\arg\max xR$ with 8 directions. For each we count the buckets used, how often $x$ and
# $-x$ share a bucket, and how often two vectors $30°$ and $90°$ apart do.

# %%
def plain_hash(x, rotations):
    """argmax(x R) without the opposite directions: as many buckets as columns of R."""
    return (x @ rotations).argmax(dim=-1)


g_signs = torch.Generator().manual_seed(1)
unit = torch.randn(trials, 1, d_lsh, generator=g_signs)
unit = unit / unit.norm(dim=-1, keepdim=True)                        # (trials, 1, d): one vector per R
side = torch.randn(trials, 1, d_lsh, generator=g_signs)
side = side - (side * unit).sum(-1, keepdim=True) * unit
side = side / side.norm(dim=-1, keepdim=True)                        # orthogonal to unit
R4, R8 = torch.randn(trials, d_lsh, 4, generator=g_signs), torch.randn(trials, d_lsh, 8, generator=g_signs)
hashes = {"argmax [xR; -xR], 4 directions": lambda x: lsh_hash(x, R4),
          "argmax xR, 4 directions": lambda x: plain_hash(x, R4),
          "argmax xR, 8 directions": lambda x: plain_hash(x, R8)}
sign_rows = {}
for name, hash_fn in hashes.items():
    h0 = hash_fn(unit)
    at = {deg: (h0 == hash_fn(math.cos(math.radians(deg)) * unit + math.sin(math.radians(deg)) * side)).float().mean().item()
          for deg in (30, 90)}
    sign_rows[name] = (h0.unique().numel(), (h0 == hash_fn(-unit)).float().mean().item(), at[30], at[90])
print(f"{pad_to('hash', 32)} {pad_to('buckets', 7, '>')} {pad_to('P(x, -x)', 9, '>')} {pad_to('P(30 deg)', 9, '>')} {pad_to('P(90 deg)', 9, '>')}")
for name, (used, opposite, p30, p90) in sign_rows.items():
    print(f"{pad_to(name, 32)} {used:7d} {opposite:9.3f} {p30:9.3f} {p90:9.3f}")
glue("lsh_plain_opposite", sign_rows["argmax xR, 4 directions"][1], display=False)
glue("lsh_pm_90", sign_rows["argmax [xR; -xR], 4 directions"][3], display=False)
glue("lsh_plain4_90", sign_rows["argmax xR, 4 directions"][3], display=False)
glue("lsh_plain8_90", sign_rows["argmax xR, 8 directions"][3], display=False)

# %% [markdown]
# Without $-xR$, $x$ and $-x$ still never share a bucket (a fraction of
# {glue:text}`lsh_plain_opposite:.3f`): what the opposite directions add is *buckets*.
# With the same 4 directions, $\arg\max xR$ has 4 buckets, each twice as wide, and two
# orthogonal vectors share one with probability {glue:text}`lsh_plain4_90:.2f` against
# {glue:text}`lsh_pm_90:.2f`. To get 8 buckets from $xR$ alone takes 8 directions, twice
# the projections, for nearly the same collision rates ({glue:text}`lsh_plain8_90:.2f`
# at $90°$). With orthonormal directions, the $b$ vectors $\pm r$ are the vertices of a
# cross-polytope: Andoni et al. (2015) call the hash *cross-polytope LSH* and take the
# directions from a random rotation; Reformer takes a Gaussian $R$.

# %% [markdown]
# ## 6. FlashAttention: exact attention, block by block
#
# Everything so far changes the result. **FlashAttention** (Dao, Fu, Ermon, Rudra and
# Ré, 2022) computes *exact* attention, with the same $4N^2 d$ FLOPs, but never
# stores the $N \times N$ matrix: it walks over blocks of keys and keeps, for each query,
# only a running maximum, a running sum and a running output. On a GPU this saves the
# slow trips to main memory; on any hardware it turns $O(N^2)$ memory into $O(N)$. The
# idea of computing a softmax in one pass goes back to Milakov and Gimelshein (2018);
# Rabe and Staats (2021) showed that attention needs only $O(\sqrt N)$ or $O(\log N)$
# extra memory this way.
#
# ### The online softmax
#
# Fix one query $q$ and split its scores $s_j = q \cdot k_j / \sqrt d$ into blocks
# $B_1, B_2, \dots$ of keys. We want $o = \sum_j e^{s_j} v_j / \sum_j e^{s_j}$. To avoid
# overflow, subtract the maximum $m$ of the scores (it cancels between numerator and
# denominator). After the blocks seen so far, keep
#
# $$m = \max_{j \text{ seen}} s_j, \qquad \ell = \sum_{j \text{ seen}} e^{s_j - m}, \qquad
# a = \sum_{j \text{ seen}} e^{s_j - m}\, v_j \in \mathbb{R}^{d_v}.$$
#
# A new block $B$ arrives. Its maximum may exceed $m$: the new maximum is
# $m' = \max(m, \max_{j \in B} s_j)$. Every term already summed was computed with
# $e^{s_j - m}$, and $e^{s_j - m'} = e^{s_j - m}\, e^{m - m'}$, so the old sums are
# **rescaled** by $\alpha = e^{m - m'} \le 1$:
#
# $$\ell' = \alpha\,\ell + \sum_{j \in B} e^{s_j - m'}, \qquad
# a' = \alpha\, a + \sum_{j \in B} e^{s_j - m'}\, v_j, \qquad m \leftarrow m' .$$
#
# After the last block, $o = a / \ell$. Both $\ell$ and $a$ must be rescaled: forget
# $\alpha$ on either one and the result is wrong whenever a later block holds a larger
# score. With a block of queries at once, $m, \ell \in \mathbb{R}^{B_r}$ and
# $a \in \mathbb{R}^{B_r \times d_v}$, and the block of scores is
# $S_{ij} = Q_i K_j^\top / \sqrt d \in \mathbb{R}^{B_r \times B_c}$: memory
# $O(B_r B_c)$ instead of $O(N^2)$. The picture shows one query block's walk.

# %% [tags=hide-input]
FIG_FLASH = dict(title="FlashAttention: one block of queries walks over the blocks of keys",
                 q="Q block i\n(B_r x d)", kv="K, V blocks j = 1 ... N_k / B_c", s="S_ij = Q_i K_j^T / sqrt(d)\n(B_r x B_c), then dropped",
                 state="per query row:\nrunning max m,\nrunning sum l,\nrunning output a\n(B_r x d_v)",
                 done="rows never computed at once:\nonly one B_r x B_c block lives", out="O_i = a / l")


def draw_flash(text=FIG_FLASH, n_blocks=6):
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for j in range(n_blocks):
        colour = "#a1d99b" if j != 2 else "#31a354"
        ax.add_patch(plt.Rectangle((1.2 + j * 0.9, 3.6), 0.8, 0.5, facecolor=colour, edgecolor="black"))
    ax.text(1.2 + n_blocks * 0.45, 4.35, text["kv"], ha="center", fontsize=9)
    ax.add_patch(plt.Rectangle((0, 1.6), 0.8, 1.4, facecolor="#9ecae1", edgecolor="black"))
    ax.text(0.4, 2.3, text["q"], ha="center", va="center", fontsize=8)
    for j in range(n_blocks):
        colour = "#fdae6b" if j == 2 else ("#eeeeee" if j > 2 else "#fdd0a2")
        ax.add_patch(plt.Rectangle((1.2 + j * 0.9, 1.6), 0.8, 1.4, facecolor=colour, edgecolor="black",
                                   linestyle="-" if j == 2 else ":"))
    ax.text(1.2 + 2 * 0.9 + 0.4, 1.1, text["s"], ha="center", va="top", fontsize=8)
    ax.annotate("", xy=(1.2 + 3 * 0.9 + 0.4, 2.3), xytext=(1.2 + 2 * 0.9 + 0.6, 2.3),
                arrowprops=dict(arrowstyle="->", lw=1.5))
    ax.add_patch(plt.Rectangle((7.0, 1.4), 1.9, 1.8, facecolor="#fff7bc", edgecolor="black"))
    ax.text(7.95, 2.3, text["state"], ha="center", va="center", fontsize=8)
    ax.annotate("", xy=(6.95, 2.3), xytext=(6.6, 2.3), arrowprops=dict(arrowstyle="->"))
    ax.text(9.3, 2.3, text["out"], ha="left", va="center", fontsize=9)
    ax.text(4.0, 0.2, text["done"], ha="center", fontsize=8, style="italic")
    ax.set_xlim(-0.2, 10.6)
    ax.set_ylim(-0.2, 4.7)
    ax.axis("off")
    ax.set_title(text["title"], fontsize=11)
    return fig


draw_flash()
plt.show()

# %% [markdown]
# A small check of the recurrence on one row of 10 scores in blocks of 4, against
# the softmax computed at once:

# %%
scores_row = torch.tensor([1.0, 3.0, 0.5, 2.0, 6.0, 1.0, 0.0, 2.5, 7.0, 1.5])
values_row = torch.arange(10.0)
m, l, a = float("-inf"), 0.0, 0.0
for j0 in range(0, 10, 4):
    s_block, v_block = scores_row[j0:j0 + 4], values_row[j0:j0 + 4]
    m_new = max(m, s_block.max().item())
    alpha = math.exp(m - m_new)
    l = alpha * l + torch.exp(s_block - m_new).sum().item()
    a = alpha * a + (torch.exp(s_block - m_new) * v_block).sum().item()
    print(f"block at {j0}: m = {m_new:.1f}, rescale by alpha = {alpha:.4f}, l = {l:.4f}, a = {a:.4f}")
    m = m_new
print(f"online: {a / l:.6f}   at once: {(torch.softmax(scores_row, 0) @ values_row).item():.6f}")

# %% [markdown]
# ### Exercise: FlashAttention's forward pass
#
# Loop over blocks of `block_size` queries; for each, loop over blocks of
# `block_size` keys with the recurrence above. With `causal=True`, query $i$ sees keys
# $j \le i$: blocks entirely in the future can be skipped, and the block on the
# diagonal needs a mask. Fold the scale $1/\sqrt{d_k}$ into the queries once, and let
# the last blocks be shorter when $N$ is not a multiple of `block_size`.
#
# :::{dropdown} Hint: the shapes in the inner loop
# For a query block `q_i` of shape `(..., B_r, d)` keep `m` and `l` of shape
# `(..., B_r, 1)` and `acc` of shape `(..., B_r, d_v)`. Start with `m = -inf`,
# `l = 0`, `acc = 0`. In each step, `s = q_i @ k_j.transpose(-2, -1)` is
# `(..., B_r, B_c)`; `m_new = torch.maximum(m, s.amax(-1, keepdim=True))`;
# `p = torch.exp(s - m_new)`; `alpha = torch.exp(m - m_new)`. Then rescale *both*
# `l` and `acc` by `alpha` before adding the block's contribution.
# :::
#
# :::{dropdown} Hint: the causal mask of a diagonal block
# For the block of queries starting at `i0` and keys starting at `j0`, key
# `j0 + c` is in the future of query `i0 + r` when `j0 + c > i0 + r`; fill those scores
# with `-inf` before the maximum. Keys from `i0 + B_r` on are all in the future of the
# block: stop the inner loop there.
# :::

# %% [exercise flash_attention]
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
    ### BEGIN SOLUTION
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
    ### END SOLUTION


# %% [test test_flash_attention_values points=2]
"""Equal to softmax(QK^T/sqrt(d)) V for N not a multiple of block_size, N_q != N_k, d_v != d_k."""
torch.manual_seed(0)
fa_q, fa_k, fa_v = torch.randn(2, 37, 8), torch.randn(2, 50, 8), torch.randn(2, 50, 5)
fa_out = flash_attention(fa_q, fa_k, fa_v, block_size=16)
assert isinstance(fa_out, torch.Tensor) and fa_out.shape == (2, 37, 5), \
    f"return only the output, shape (2, 37, 5); got {type(fa_out).__name__} {tuple(getattr(fa_out, 'shape', ()))}"
fa_ref = attention(fa_q, fa_k, fa_v)[0]
assert torch.allclose(fa_out, fa_ref, atol=1e-5), \
    f"output differs from exact attention by {(fa_out - fa_ref).abs().max():.2e}: rescale both the running sum " \
    "and the running output by exp(m_old - m_new) whenever the maximum grows"
for fa_bs in (1, 7, 64):
    assert torch.allclose(flash_attention(fa_q, fa_k, fa_v, block_size=fa_bs), fa_ref, atol=1e-5), \
        f"block_size={fa_bs} gives a different output: the result must not depend on the block size"

# %% [test test_flash_attention_causal points=1]
"""Causal: query i sees keys j <= i, also inside the blocks on the diagonal."""
torch.manual_seed(1)
fc_q, fc_k, fc_v = torch.randn(1, 2, 45, 8), torch.randn(1, 2, 45, 8), torch.randn(1, 2, 45, 8)
fc_ref = attention(fc_q, fc_k, fc_v, torch.ones(45, 45, dtype=torch.bool).tril())[0]
for fc_bs in (8, 16, 45):
    fc_out = flash_attention(fc_q, fc_k, fc_v, block_size=fc_bs, causal=True)
    assert torch.allclose(fc_out, fc_ref, atol=1e-5), \
        f"causal, block_size={fc_bs}: differs from attention with a causal mask (is the diagonal block masked " \
        "with key > query, and key blocks after the query block skipped?)"

# %% [test test_flash_attention_stability points=1]
"""Large scores: no overflow (subtract the running maximum), float64 stays float64."""
torch.manual_seed(2)
fs_q, fs_k, fs_v = torch.randn(1, 40, 4) * 30, torch.randn(1, 40, 4) * 30, torch.randn(1, 40, 4)
fs_out = flash_attention(fs_q, fs_k, fs_v, block_size=16)
assert torch.isfinite(fs_out).all(), "inf or NaN with large scores: subtract the running maximum before exp"
assert torch.allclose(fs_out, attention(fs_q, fs_k, fs_v)[0], atol=1e-4), "wrong output with large scores"
fs_64 = flash_attention(fs_q.double(), fs_k.double(), fs_v.double(), block_size=16)
assert fs_64.dtype == torch.float64, f"float64 inputs must give a float64 output, got {fs_64.dtype}"

# %% [test test_flash_attention_memory points=1]
"""Never N_q x N_k: at N = 4096 with block_size=256, memory stays far below one 4096 x 4096 matrix (64 MiB).
Graded at N = 8192, causal and not: the memory, and the outputs too."""
fm_q, fm_k, fm_v = (torch.randn(1, 4096, 32) for _ in range(3))
for fm_causal in (False, True):
    _, fm_mib = peak_memory(lambda: flash_attention(fm_q, fm_k, fm_v, block_size=256, causal=fm_causal))
    if fm_mib == fm_mib:                     # NaN where the peak cannot be measured (not Linux)
        assert fm_mib < 32, f"causal={fm_causal}: memory rose by {fm_mib:.0f} MiB: an N x N tensor (scores, " \
            "weights or mask) was built; keep only one block of scores at a time"

# %% [markdown]
# ### Training needs a backward pass that recomputes
#
# Your `flash_attention` is differentiable: autograd can backpropagate through the
# loops. But autograd keeps every tensor that the backward pass needs, and here that is
# every block $e^{S_{ij} - m}$ of every step: all $N^2$ numbers again, in pieces. The
# saving disappears exactly when training. FlashAttention therefore comes with its own
# backward pass. It stores only the output $O$ and, per query, the log-sum-exp
# $L_i = m_i + \log \ell_i$, and recomputes each block of weights
# $P_{ij} = \exp(S_{ij} - L_i)$ when it needs it. With $dO$ the gradient of the output
# and $D_i = \sum_c dO_{ic}\, O_{ic}$, the gradients of softmax attention are, block by
# block,
#
# $$dV_j \mathrel{+}= P_{ij}^\top dO_i, \quad dP_{ij} = dO_i V_j^\top, \quad
# dS_{ij} = P_{ij} \odot (dP_{ij} - D_i), \quad
# dQ_i \mathrel{+}= \frac{dS_{ij} K_j}{\sqrt d}, \quad dK_j \mathrel{+}= \frac{dS_{ij}^\top Q_i}{\sqrt d}.$$
#
# The given code below wraps your forward pass in a `torch.autograd.Function` with that
# backward pass. It computes $L$ in a second blocked pass over the keys (a fused
# implementation gets it for free from the forward's $m$ and $\ell$); the backward
# pass recomputes each block once. The algorithm, with this loop order (blocks of keys
# outside, blocks of queries inside), is the backward pass of Dao et al. (2022).
# FlashAttention-2 (Dao, 2023) kept that order for the backward pass and swapped it in
# the forward pass, blocks of queries outside, as in your exercise: each query block's
# $m$, $\ell$ and output then stay in fast memory while the keys stream past, and query
# blocks can run in parallel.

# %% [export]
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


# %% [markdown]
# Now the measurement: forward plus backward at $N = 4096$, $d = 64$, for the naive
# computation, your forward pass under plain autograd, and the same forward pass with
# the recomputing backward. First, the three give the same gradients.

# %%
def loss_and_grads(fn, n, seed=0):
    q, k, v = qkv(n, seed=seed, requires_grad=True)
    out = fn(q, k, v)
    out = out[0] if isinstance(out, tuple) else out
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


exact = loss_and_grads(lambda q, k, v: attention(q, k, v, torch.ones(300, 300, dtype=torch.bool).tril()), 300)
for name, fn in {"flash_attention under autograd": lambda q, k, v: flash_attention(q, k, v, 64, True),
                 "flash_attention_trainable": lambda q, k, v: flash_attention_trainable(q, k, v, 64, True)}.items():
    got = loss_and_grads(fn, 300)
    print(f"{pad_to(name, 32)} causal, N = 300: max |difference| output, dQ, dK, dV: " +
          ", ".join(f"{(a - b).abs().max():.1e}" for a, b in zip(got, exact)))

# %%
N_TRAIN = 4096
train_methods = {
    "naive (stores P)": lambda q, k, v: attention(q, k, v)[0],
    "flash_attention under autograd": lambda q, k, v: flash_attention(q, k, v, 512),
    "flash_attention_trainable": lambda q, k, v: flash_attention_trainable(q, k, v, 512),
    "F.scaled_dot_product_attention": builtin,
}
train_cost = {}
for name, fn in train_methods.items():
    train_cost[name] = measure(fn, N_TRAIN, backward=True, repeat=1)
    print(f"{pad_to(name, 32)} forward + backward: {train_cost[name][0]:6.2f} s, peak memory +{train_cost[name][1]:6.0f} MiB")
glue("train_naive_mib", train_cost["naive (stores P)"][1], display=False)
glue("train_autograd_mib", train_cost["flash_attention under autograd"][1], display=False)
glue("train_flash_mib", train_cost["flash_attention_trainable"][1], display=False)

FIG_TRAIN = dict(title=f"Forward + backward at N = {N_TRAIN}, d = 64: peak memory", xlabel="peak memory above start (MiB)")
fig, ax = plt.subplots(figsize=(7.5, 2.6))
ax.barh(list(train_cost), [c[1] for c in train_cost.values()], color=["#fdae6b", "#fdae6b", "#31a354", "#9ecae1"])
ax.invert_yaxis()
ax.set_xlabel(FIG_TRAIN["xlabel"])
ax.set_title(FIG_TRAIN["title"], fontsize=10)
plt.show()

# %% [markdown]
# Under plain autograd the blocked forward pass keeps
# {glue:text}`train_autograd_mib:.0f` MiB alive for the backward pass: autograd saves
# every block of weights it computed, $N^2$ numbers in all, so its memory grows as
# $N^2$ like the naive computation's ({glue:text}`train_naive_mib:.0f` MiB, which keeps
# both the scores and the weights). Tiling alone saved a constant factor, not the
# square. With the recomputing backward pass the whole
# training step needs {glue:text}`train_flash_mib:.0f` MiB: the inputs, the output,
# the gradients and a few blocks. The price is time. Counted in products of
# $N \times N$ by $d$ ($2N^2 d$ FLOPs each), plain attention does 6 for a forward and
# backward pass: $QK^\top$ and $PV$ forward; $dV$, $dP$, $dQ$ and $dK$ backward.
# Recomputing every block of scores in the backward pass adds one $QK^\top$: 7 instead of
# 6, a sixth more arithmetic, which is cheap next to moving $N^2$ numbers to
# and from memory. The given code above does 8, a third more, because it computes the
# log-sum-exp in a separate pass over the keys, another $QK^\top$, where a fused
# implementation keeps it from the forward pass's $m$ and $\ell$.
#
# :::{admonition} Correction: FlashAttention changes memory, not the arithmetic
# :class: note
# Summaries often say FlashAttention "does not change the complexity, only the
# speed". Half right: the number of FLOPs is still $O(N^2 d)$, but the
# memory drops from $O(N^2)$ to $O(N)$, as measured here, and that is what lets
# long sequences be trained at all.
# :::

# %% [markdown]
# ## 7. Grouped-query attention: smaller key/value caches
#
# When a language model generates text, it keeps the keys and values of every past
# token of every layer (the **key/value cache**, built in Chapter 7) so that each new
# token costs one row of attention instead of the whole sequence. That cache, not the
# $N \times N$ scores, is what fills memory during generation. **Multi-query
# attention** (Shazeer, 2019) gives all query heads one shared key head and value
# head; **grouped-query attention** (Ainslie et al., 2023) sits between: $h$ query
# heads in $g$ groups, each group sharing one of $h_{kv} = g$ key/value heads:
#
# $$\mathrm{head}_i = \mathrm{Attention}\big(X W^Q_i,\; X W^K_{\lfloor i / (h/h_{kv}) \rfloor},\;
# X W^V_{\lfloor i / (h/h_{kv}) \rfloor}\big), \qquad
# W^Q_i \in \mathbb{R}^{d_\text{model} \times d_h}, \quad
# W^K_{c}, W^V_{c} \in \mathbb{R}^{d_\text{model} \times d_h},$$
#
# with $d_h = d_\text{model}/h$, scores scaled by $1/\sqrt{d_h}$, and the $h$ heads
# concatenated and mixed by $W^O$ as in Chapter 3. Query heads $0, \dots, h/h_{kv}-1$
# use key/value head 0, the next $h/h_{kv}$ use head 1, and so on. $h_{kv} = h$ is
# multi-head attention; $h_{kv} = 1$ is multi-query attention. The cache shrinks by
# the factor $h / h_{kv}$.
#
# ### Exercise: grouped-query attention
#
# `self.W_k` and `self.W_v` produce `num_kv_heads * d_head` features: split them into
# `num_kv_heads` heads, then give every query head its key/value head. Be careful
# which one: `torch.repeat_interleave` and `Tensor.repeat` produce different orders.

# %% [exercise GroupedQueryAttention]
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
        ### BEGIN SOLUTION
        B, N, _ = x.shape
        q = self.W_q(x).view(B, N, self.num_heads, self.d_head).transpose(1, 2)     # (B, h, N, d_h)
        k = self.W_k(x).view(B, N, self.num_kv_heads, self.d_head).transpose(1, 2)  # (B, h_kv, N, d_h)
        v = self.W_v(x).view(B, N, self.num_kv_heads, self.d_head).transpose(1, 2)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)                                       # (B, h, N, d_h)
        v = v.repeat_interleave(group, dim=1)
        out, weights = attention(q, k, v, mask)                                     # (B, h, N, d_h)
        return self.W_o(out.transpose(1, 2).reshape(B, N, -1)), weights
        ### END SOLUTION


# %% [test test_GroupedQueryAttention_values points=2]
"""Query head i uses key/value head i // (num_heads // num_kv_heads); scale 1/sqrt(d_head); W_o."""
torch.manual_seed(0)
gq = GroupedQueryAttention(d_model=16, num_heads=4, num_kv_heads=2)
gq_x = torch.randn(2, 5, 16)
gq_out, gq_w = gq(gq_x)
assert gq_out.shape == (2, 5, 16) and gq_w.shape == (2, 4, 5, 5), \
    f"expected output (2, 5, 16) and weights (B, num_heads, N, N) = (2, 4, 5, 5), got {tuple(gq_out.shape)}, {tuple(gq_w.shape)}"
with torch.no_grad():
    gq_q = gq.W_q(gq_x).view(2, 5, 4, 4).transpose(1, 2)             # (B, 4 heads, N, 4)
    gq_k = gq.W_k(gq_x).view(2, 5, 2, 4).transpose(1, 2)             # (B, 2 kv heads, N, 4)
    gq_v = gq.W_v(gq_x).view(2, 5, 2, 4).transpose(1, 2)
    gq_kv_of = [0, 0, 1, 1]                                          # i // (4 // 2)
    gq_ws = torch.stack([torch.softmax(gq_q[:, i] @ gq_k[:, c].transpose(-2, -1) / 2.0, -1)
                         for i, c in enumerate(gq_kv_of)], 1)
    gq_wrong = torch.stack([torch.softmax(gq_q[:, i] @ gq_k[:, i % 2].transpose(-2, -1) / 2.0, -1)
                            for i in range(4)], 1)
    gq_heads = torch.stack([gq_ws[:, i] @ gq_v[:, c] for i, c in enumerate(gq_kv_of)], 1)
    gq_ref = gq.W_o(gq_heads.transpose(1, 2).reshape(2, 5, 16))
assert not torch.allclose(gq_w, gq_wrong, atol=1e-5), \
    "query head i paired with key/value head i % num_kv_heads: it must be i // (num_heads // num_kv_heads) " \
    "(repeat_interleave, not repeat)"
assert torch.allclose(gq_w, gq_ws, atol=1e-5), \
    "weights differ from softmax(q_i k_c^T / sqrt(d_head)) with c = i // (num_heads // num_kv_heads)"
assert torch.allclose(gq_out, gq_ref, atol=1e-5), "output differs from W_o(concat of the heads, in order)"

# %% [test test_GroupedQueryAttention_mha_mqa points=1]
"""num_kv_heads == num_heads is multi-head attention; num_kv_heads == 1 is multi-query attention."""
torch.manual_seed(1)
gm_x = torch.randn(1, 6, 8)
for gm_kv in (4, 1):
    gm = GroupedQueryAttention(d_model=8, num_heads=4, num_kv_heads=gm_kv)
    gm_out, gm_w = gm(gm_x)
    with torch.no_grad():
        gm_q = gm.W_q(gm_x).view(1, 6, 4, 2).transpose(1, 2)
        gm_k = gm.W_k(gm_x).view(1, 6, gm_kv, 2).transpose(1, 2)     # broadcasts when gm_kv == 1
        gm_ref_w = torch.softmax(gm_q @ gm_k.transpose(-2, -1) / math.sqrt(2), -1)
    assert gm_w.shape == (1, 4, 6, 6), f"num_kv_heads={gm_kv}: weights should be (1, 4, 6, 6), got {tuple(gm_w.shape)}"
    assert torch.allclose(gm_w, gm_ref_w, atol=1e-5), \
        f"num_kv_heads={gm_kv}: weights wrong (scale by 1/sqrt(d_head), d_head = d_model // num_heads)"

# %% [test test_GroupedQueryAttention_mask points=1]
"""A causal (N, N) mask and a (B, 1, 1, N) padding mask, True = may attend."""
torch.manual_seed(2)
gk = GroupedQueryAttention(d_model=8, num_heads=4, num_kv_heads=2)
gk_x = torch.randn(2, 5, 8)
_, gk_w = gk(gk_x, mask=torch.ones(5, 5, dtype=torch.bool).tril())
assert not torch.isnan(gk_w).any(), "NaN weights: is the mask polarity inverted? True means MAY attend"
assert (gk_w[..., ~torch.ones(5, 5, dtype=torch.bool).tril()] == 0).all(), \
    "causal mask: weights above the diagonal must be 0 in every head"
gk_pad = (torch.arange(5) < torch.tensor([5, 3])[:, None])[:, None, None, :]
_, gk_wp = gk(gk_x, mask=gk_pad)
assert (gk_wp[1, ..., 3:] == 0).all(), "padding mask: the padded keys of sequence 1 must get weight 0"

# %% [test test_GroupedQueryAttention_gradients points=1]
"""Gradients reach every projection and the input (the output is compared too)."""
torch.manual_seed(3)
gg = GroupedQueryAttention(d_model=8, num_heads=2, num_kv_heads=1)
gg_x = torch.randn(2, 4, 8, requires_grad=True)
(gg(gg_x)[0] * torch.randn(2, 4, 8)).sum().backward()
for gg_name, gg_p in gg.named_parameters():
    assert gg_p.grad is not None and gg_p.grad.abs().sum() > 0, \
        f"{gg_name} received no gradient: is it used in forward (no .detach(), .data)?"
assert gg_x.grad is not None and torch.isfinite(gg_x.grad).all(), "no finite gradient reaches the input"

# %% [markdown]
# Shown by computation: with `num_kv_heads == num_heads`, the layer *is* Chapter 3's
# multi-head attention (the same projections, the same heads), and with
# `num_kv_heads == 1` every query head uses the single key/value head, which we can
# pass to the attention function as one head that broadcasts over all of them.

# %%
torch.manual_seed(0)
x_g = torch.randn(2, 7, 32)
gqa_full = GroupedQueryAttention(32, num_heads=8, num_kv_heads=8)
with torch.no_grad():
    out_g, _ = gqa_full(x_g)
    heads = lambda t, h: t.view(2, 7, h, 32 // 8).transpose(1, 2)        # (B, h, N, d_h)
    mha_out = attention(heads(gqa_full.W_q(x_g), 8), heads(gqa_full.W_k(x_g), 8), heads(gqa_full.W_v(x_g), 8))[0]
    mha_out = gqa_full.W_o(mha_out.transpose(1, 2).reshape(2, 7, 32))
print("num_kv_heads = num_heads vs multi-head attention, max |difference|:", (out_g - mha_out).abs().max().item())

gqa_mqa = GroupedQueryAttention(32, num_heads=8, num_kv_heads=1)
with torch.no_grad():
    out_m, _ = gqa_mqa(x_g)
    k1, v1 = heads(gqa_mqa.W_k(x_g), 1), heads(gqa_mqa.W_v(x_g), 1)    # (B, 1, N, d_h): one shared head
    mqa_out = attention(heads(gqa_mqa.W_q(x_g), 8), k1, v1)[0]          # broadcasts over the 8 query heads
    mqa_out = gqa_mqa.W_o(mqa_out.transpose(1, 2).reshape(2, 7, 32))
print("num_kv_heads = 1 vs multi-query attention, max |difference|:", (out_m - mqa_out).abs().max().item())
print("parameters: MHA", sum(p.numel() for p in gqa_full.parameters()),
      " GQA (8 -> 2)", sum(p.numel() for p in GroupedQueryAttention(32, 8, 2).parameters()),
      " MQA", sum(p.numel() for p in gqa_mqa.parameters()))

# %% [markdown]
# ### The key/value cache of real models
#
# Per token, the cache holds a key and a value vector of $d_h$ numbers for every
# key/value head of every layer: $2 \cdot L \cdot h_{kv} \cdot d_h$ numbers, 2 bytes
# each in 16-bit precision. The shapes below are those published for each model
# (Llama 2 70B: 80 layers, 64 query heads, 8 key/value heads of width 128).

# %%
models = {  # name: (layers, query heads, key/value heads, head width)
    "GPT-2 small (MHA)": (12, 12, 12, 64),
    "Llama 2 7B (MHA)": (32, 32, 32, 128),
    "Mistral 7B (GQA)": (32, 32, 8, 128),
    "Falcon 7B (MQA)": (32, 71, 1, 64),
    "Llama 2 70B (GQA)": (80, 64, 8, 128),
    "Llama 2 70B if it were MHA": (80, 64, 64, 128),
}
context, batch_cache = 4096, 1
print(f"{pad_to('model', 28)} {pad_to('L', 3, '>')} {pad_to('h', 3, '>')} {pad_to('h_kv', 4, '>')} {pad_to('d_h', 4, '>')} {pad_to('KiB/token', 10, '>')} {pad_to('GiB at 4096 tokens', 19, '>')}")
cache_gib = {}
for name, (layers, h_q, h_kv, d_h) in models.items():
    per_token = 2 * layers * h_kv * d_h * 2                        # keys and values, 2 bytes each
    cache_gib[name] = per_token * context * batch_cache / 2**30
    print(f"{pad_to(name, 28)} {layers:3d} {h_q:3d} {h_kv:4d} {d_h:4d} {per_token / 1024:10.0f} {cache_gib[name]:19.2f}")
glue("cache_70b", cache_gib["Llama 2 70B (GQA)"], display=False)
glue("cache_70b_mha", cache_gib["Llama 2 70B if it were MHA"], display=False)

# %% [markdown]
# With grouped-query attention, Llama 2 70B caches {glue:text}`cache_70b:.2f` GiB per
# sequence of 4096 tokens; with 64 key/value heads it would need
# {glue:text}`cache_70b_mha:.0f` GiB, for every sequence in a batch. Ainslie et al.
# report that GQA keeps quality close to multi-head attention while decoding almost as
# fast as multi-query attention, and that an existing multi-head checkpoint can be
# converted by mean-pooling its key and value heads within each group, then trained a
# little more ("uptraining").

# %% [markdown]
# ## 8. Every method, measured
#
# Back to the opening question, for every method of the chapter, with your
# implementations: time and peak memory against $N$, forward and forward plus backward
# (one head, $d = 64$). Linformer uses $k = 256$; linear attention is non-causal;
# FlashAttention uses blocks of 512 and the recomputing backward pass. The memory-light
# methods are measured up to $N = 16\,384$ in the forward pass.

# %%
def linformer_fixed_k(q, k, v, k_proj=256):
    g = torch.Generator().manual_seed(0)
    E = torch.randn(k_proj, k.size(-2), generator=g) / math.sqrt(k_proj)
    return linformer_attention(q, k, v, E, E)[0]


all_methods = {  # name: (function, largest N forward, largest N forward + backward)
    "naive attention": (naive, 8192, 4096),
    "F.scaled_dot_product_attention": (builtin, 16384, 4096),
    "flash_attention (blocks of 512)": (lambda q, k, v: flash_attention_trainable(q, k, v, 512), 16384, 4096),
    "linear_attention": (lambda q, k, v: linear_attention(q, k, v), 16384, 16384),
    "linformer_attention (k = 256)": (linformer_fixed_k, 16384, 16384),
}
started = time.perf_counter()
everything = sweep(all_methods, [256, 1024, 4096, 8192, 16384])
print(f"measured in {time.perf_counter() - started:.0f} s")
plot_scaling(everything, FIG_SCALING["everything"])
plt.show()
ns_f, secs_f, mibs_f = everything["flash_attention (blocks of 512)", False]
ns_s, secs_s, mibs_s = everything["F.scaled_dot_product_attention", False]
ns_l, secs_l, mibs_l = everything["linear_attention", False]
glue("flash_vs_sdpa_16k", secs_f[-1] / secs_s[-1], display=False)
glue("flash_time_slope", slope(ns_f, secs_f), display=False)
glue("linear_time_slope", slope(ns_l, secs_l), display=False)
glue("flash_mem_16k", mibs_f[-1], display=False)
glue("naive_mem_8k", everything["naive attention", False][2][-1], display=False)

# %% [markdown]
# What each method saves, read off the curves:
#
# - **FlashAttention** keeps the quadratic time (slope {glue:text}`flash_time_slope:.2f`;
#   at $N = 16\,384$ it takes {glue:text}`flash_vs_sdpa_16k:.2f` times as long as the
#   fused built-in, which does the same blocked computation in C++), but its memory
#   stays linear: {glue:text}`flash_mem_16k:.0f` MiB at $N = 16\,384$, where the naive
#   forward pass already needs {glue:text}`naive_mem_8k:.0f` MiB at half that length.
#   It costs nothing in accuracy.
# - **Linear attention** is linear in time too (slope
#   {glue:text}`linear_time_slope:.2f`) and far faster at long lengths, but it is a
#   different model: its similarity is flatter than the softmax's and a model must be
#   trained with it.
# - **Linformer** is linear for a fixed $k$; its accuracy depends on how well the
#   projection fits the inputs, not on training it: in Section 3, at $k = 64$, untrained
#   segment pooling was off by {glue:text}`lin_pool_64:.1%`, the projection trained for 120
#   steps by {glue:text}`lin_trained_64:.0%` and a random one by {glue:text}`lin_random_64:.0%`.
#   It fixes the sequence length and cannot be causal.
# - **Sparse patterns** and **LSH** cut the keys each query sees; their cost is what
#   they miss (Sections 2 and 5).
#
# In practice the exact, memory-efficient computation won: current models use
# FlashAttention-style kernels (what `F.scaled_dot_product_attention` dispatches to),
# often with grouped-query attention for a small cache, and sliding windows in some
# layers.

# %% [markdown]
# ## Check your understanding
#
# 1. A model uses a sliding window of radius 128 in each of its 12 layers. Can the
#    first token of a 4096-token input influence the last token's output?
#
#    :::{dropdown} Answer
#    No. Each layer moves information at most 128 positions, so after 12 layers at most
#    $12 \cdot 128 = 1536$ positions: the last token cannot depend on the first. A single
#    global token would connect them in two layers.
#    :::
#
# 2. Why can't Linformer be used in a decoder with a causal mask, while linear attention
#    can?
#
#    :::{dropdown} Answer
#    Each projected key $\bar k_r = \sum_j E_{rj} k_j$ mixes keys from every position,
#    including the future of most queries, and no mask on the $N_q \times k$ weights can
#    separate them again. Linear attention keeps one term per key in its sums, so the
#    sums can simply stop at $j = i$ (a running state).
#    :::
#
# 3. In the online softmax, a student rescales the running output $a$ by
#    $\alpha = e^{m - m'}$ but forgets to rescale the running sum $\ell$. When is the
#    result still right?
#
#    :::{dropdown} Answer
#    Only when the running maximum never grows after the first block (then $\alpha = 1$
#    every time), for instance when the largest score of every row is in its first key
#    block. Otherwise $\ell$ mixes terms relative to different maxima and the output is
#    scaled wrongly.
#    :::
#
# 4. Llama 2 70B has 64 query heads and 8 key/value heads. By what factor is its
#    key/value cache smaller than with multi-head attention, and what does the attention
#    cost in FLOPs change?
#
#    :::{dropdown} Answer
#    By $64 / 8 = 8$. The number of score computations does not change: each of the 64
#    query heads still compares its query with every key. What shrinks is the memory
#    (and memory traffic) of the keys and values, which dominates the cost of generating
#    one token at a time.
#    :::

# %% [markdown]
# 5. Why does Performer's feature map contain $-\lVert x \rVert^2 / 2$, and what happens
#    to the attention output if it is dropped?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_performer_norm_term points=2]
# ### BEGIN SOLUTION
# **Model answer.** The term makes the random features unbiased:
# $\mathbb{E}[\phi(x) \cdot \phi(y)] = \exp(x \cdot y)$, the softmax's kernel. Without it
# the estimate is $\exp(x \cdot y)\, e^{(\lVert x \rVert^2 + \lVert y \rVert^2)/2}$. The
# query's factor is the same for all keys and cancels in the normalisation, but the key
# factor $e^{\lVert k_j \rVert^2 / 2}$ does not: keys with large norms get too much weight,
# and the output is no longer an estimate of softmax attention.
#
# **Rubric (2 points).**
#
# - 1 point: with the term, the expected product of the features is exactly
#   $\exp(x \cdot y)$ (the estimate is unbiased).
# - 1 point: without it each key's weight is multiplied by $e^{\lVert k_j \rVert^2/2}$,
#   which does not cancel in the normalisation (the query's factor does), so keys with
#   large norms are over-weighted.
# ### END SOLUTION

# %% [markdown]
# ## Challenges (optional, not graded)
#
# - Write a blocked *local* attention that computes only the blocks a sliding window
#   touches, and measure its time against $N$: the slope should be 1.
# - Implement Reformer's attention: hash queries (= keys) with `lsh_hash`, sort by
#   bucket, attend within chunks of the sorted sequence, and measure the error against
#   full attention as a function of the number of buckets and hashing rounds.
# - Replace the random $\Omega$ of Performer by orthogonal random features (the rows of
#   a random orthogonal matrix, rescaled) and measure whether the error at a given $m$
#   drops.
# - Make `FlashAttentionFunction` compute the log-sum-exp inside the forward pass
#   (return it from a variant of your `flash_attention`) and measure the time saved.
#
# ## Summary
#
# - Attention's time is $O(N^2 d)$ and its naive memory $O(N^2)$; measured on log-log
#   axes, both curves have slope 2.
# - **Sparse** masks (windows, dilation, global tokens, random blocks) cut the work to
#   $O(N r)$; information then needs several layers to cross the sequence, and global
#   or random connections shorten the path.
# - **Linformer** projects keys and values along the sequence to length $k$; random
#   projections are inaccurate, and in our run a fixed projection that fits the inputs'
#   structure (segment pooling) beat briefly trained ones by far.
# - **Linear attention** with $\phi = \mathrm{elu} + 1$ uses associativity,
#   $\phi(Q)(\phi(K)^\top V)$; causal, it is an RNN with a matrix state, fast when
#   computed in chunks. **Performer**'s positive random features estimate the softmax
#   kernel without bias, but need many features, the more the larger the queries and
#   keys: the error grows with $e^{\lVert q' + k' \rVert^2}$, even when the weights are flat.
# - **Reformer**'s angular LSH puts similar vectors in the same bucket with a
#   probability that falls with their angle and the number of buckets.
# - **FlashAttention** is exact: an online softmax (running maximum, rescaled running
#   sum and output) over blocks, with $O(N)$ memory; training needs a backward pass
#   that recomputes the blocks.
# - **Grouped-query attention** shares key/value heads between groups of query heads,
#   shrinking the key/value cache by $h / h_{kv}$.
#
# ## What's next
#
# Chapter 7 builds GPT-2: a decoder-only Transformer with causal self-attention, whose
# key/value cache makes generation fast, the cache whose size this chapter computed.
#
# ## References
#
# - Vaswani, A., et al. (2017). Attention is all you need. *NeurIPS 2017*.
#   <https://arxiv.org/abs/1706.03762>
# - Child, R., Gray, S., Radford, A., & Sutskever, I. (2019). Generating long sequences
#   with sparse Transformers. <https://arxiv.org/abs/1904.10509>
# - Beltagy, I., Peters, M. E., & Cohan, A. (2020). Longformer: The long-document
#   Transformer. <https://arxiv.org/abs/2004.05150>
# - Zaheer, M., et al. (2020). Big Bird: Transformers for longer sequences.
#   *NeurIPS 2020*. <https://arxiv.org/abs/2007.14062>
# - Wang, S., Li, B. Z., Khabsa, M., Fang, H., & Ma, H. (2020). Linformer:
#   Self-attention with linear complexity. <https://arxiv.org/abs/2006.04768>
# - Katharopoulos, A., Vyas, A., Pappas, N., & Fleuret, F. (2020). Transformers are
#   RNNs: Fast autoregressive Transformers with linear attention. *ICML 2020*.
#   <https://arxiv.org/abs/2006.16236>
# - Choromanski, K., et al. (2021). Rethinking attention with Performers. *ICLR 2021*.
#   <https://arxiv.org/abs/2009.14794>
# - Kitaev, N., Kaiser, Ł., & Levskaya, A. (2020). Reformer: The efficient Transformer.
#   *ICLR 2020*. <https://arxiv.org/abs/2001.04451>
# - Andoni, A., Indyk, P., Laarhoven, T., Razenshteyn, I., & Schmidt, L. (2015).
#   Practical and optimal LSH for angular distance. *NeurIPS 2015*.
#   <https://arxiv.org/abs/1509.02897>
# - Xiong, Y., Zeng, Z., Chakraborty, R., Tan, M., Fung, G., Li, Y., & Singh, V.
#   (2021). Nyströmformer: A Nyström-based algorithm for approximating self-attention.
#   *AAAI 2021*. <https://arxiv.org/abs/2102.03902>
# - Milakov, M., & Gimelshein, N. (2018). Online normalizer calculation for softmax.
#   <https://arxiv.org/abs/1805.02867>
# - Rabe, M. N., & Staats, C. (2021). Self-attention does not need O(n²) memory.
#   <https://arxiv.org/abs/2112.05682>
# - Dao, T., Fu, D. Y., Ermon, S., Rudra, A., & Ré, C. (2022). FlashAttention: Fast and
#   memory-efficient exact attention with IO-awareness. *NeurIPS 2022*.
#   <https://arxiv.org/abs/2205.14135>
# - Dao, T. (2023). FlashAttention-2: Faster attention with better parallelism and work
#   partitioning. <https://arxiv.org/abs/2307.08691>
# - Shazeer, N. (2019). Fast Transformer decoding: One write-head is all you need.
#   <https://arxiv.org/abs/1911.02150>
# - Ainslie, J., Lee-Thorp, J., de Jong, M., Zemlyanskiy, Y., Lebrón, F., & Sanghai, S.
#   (2023). GQA: Training generalized multi-query Transformer models from multi-head
#   checkpoints. *EMNLP 2023*. <https://arxiv.org/abs/2305.13245>
# - Touvron, H., et al. (2023). Llama 2: Open foundation and fine-tuned chat models.
#   <https://arxiv.org/abs/2307.09288>
# - Tay, Y., Dehghani, M., Bahri, D., & Metzler, D. (2022). Efficient Transformers: A
#   survey. *ACM Computing Surveys* 55(6). <https://arxiv.org/abs/2009.06732>

# %% [hidden]
import math

import torch
import torch.nn.functional as F

import solutions.ch06_efficient_attention as ref
from autograder.hidden import HiddenTests, Mistake, rows_sum_to_one

hidden = HiddenTests(ref, from_scratch={"linformer_attention", "linear_attention", "flash_attention",
                                        "GroupedQueryAttention"})


# %% [hidden]
def _local(n, radius, causal=False, global_tokens=(), how="ok"):
    """The reference mask with one deliberate change, to recognise a common mistake."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    window = (i - j).abs() < radius if how == "strict" else (i - j).abs() <= radius
    g = torch.zeros(n, dtype=torch.bool)
    g[torch.as_tensor(list(global_tokens), dtype=torch.long)] = True
    rows = g[:, None] if how != "global_cols" else torch.zeros(n, 1, dtype=torch.bool)
    cols = g[None, :] if how != "global_rows" else torch.zeros(1, n, dtype=torch.bool)
    if how == "no_global":
        rows, cols = torch.zeros(n, 1, dtype=torch.bool), torch.zeros(1, n, dtype=torch.bool)
    if causal and how == "causal_first":
        return (window & (j <= i)) | rows | cols
    mask = window | rows | cols
    if causal and how == "causal_strict":
        return mask & (j < i)
    if causal and how != "no_causal":
        mask = mask & (j <= i)
    return mask


def _lm(how):
    return lambda n, radius, causal=False, global_tokens=(): _local(n, radius, causal, global_tokens, how)


LOCAL_MISTAKES = [
    Mistake("|i - j| == radius is inside the window: use <=, not <", _lm("strict")),
    Mistake("global tokens must also be attended to by every query: set their columns True, not only their rows",
            _lm("global_rows")),
    Mistake("global tokens must attend to every key: set their rows True, not only their columns",
            _lm("global_cols")),
    Mistake("global_tokens ignored: their rows and columns are True", _lm("no_global")),
    Mistake("causal ignored: with causal=True every key after the query (j > i) is False", _lm("no_causal")),
    Mistake("causal rule applied before the global tokens: with causal=True even a global token's row and "
            "column are False for j > i; apply the causal rule last", _lm("causal_first")),
    Mistake("causal mask hides the diagonal: a query may attend to itself (j <= i, not j < i)", _lm("causal_strict")),
]


@hidden.test("test_local_attention_mask_window")
def _(t):
    for n, r in [(10, 2), (7, 0), (5, 9), (1, 0), (12, 3)]:
        t.function("local_attention_mask", n, r, mistakes=LOCAL_MISTAKES, label=f"n={n}, radius={r}")


@hidden.test("test_local_attention_mask_causal")
def _(t):
    for n, r in [(9, 2), (6, 0), (8, 10)]:
        t.function("local_attention_mask", n, r, causal=True, mistakes=LOCAL_MISTAKES,
                   label=f"n={n}, radius={r}, causal")


@hidden.test("test_local_attention_mask_global")
def _(t):
    t.function("local_attention_mask", 12, 1, global_tokens=(0, 7), mistakes=LOCAL_MISTAKES,
               label="n=12, radius=1, global tokens (0, 7)")
    t.function("local_attention_mask", 10, 2, global_tokens=[4], mistakes=LOCAL_MISTAKES,
               label="n=10, radius=2, global tokens [4]")
    t.function("local_attention_mask", 12, 2, causal=True, global_tokens=(2, 9), mistakes=LOCAL_MISTAKES,
               label="n=12, radius=2, causal, global tokens (2, 9)")


# %% [hidden]
def _linformer(query, key, value, E, Fm, how="ok"):
    if how == "swapped":
        E, Fm = Fm, E
    if how == "features":                      # projected along the features (needs N_k == d)
        k_proj = (key @ E.transpose(-2, -1)).transpose(-2, -1)
        v_proj = (value @ Fm.transpose(-2, -1)).transpose(-2, -1)
    else:
        k_proj, v_proj = E @ key, Fm @ value
    scale = {"no_scale": 1.0, "sqrt_k": 1 / math.sqrt(E.size(0))}.get(how, 1 / math.sqrt(query.size(-1)))
    scores = query @ k_proj.transpose(-2, -1) * scale
    weights = torch.softmax(scores, dim=-2 if how == "softmax_dim" else -1)
    return weights @ v_proj, weights


def _lf(how):
    return lambda q, k, v, E, Fm: _linformer(q, k, v, E, Fm, how)


LINFORMER_MISTAKES = [
    Mistake("E and F swapped: keys are projected with E (E @ key), values with F (F @ value)", _lf("swapped")),
    Mistake("projected along the features: E must mix the N_k positions, E @ key (k, d_k), not key @ E.T",
            _lf("features")),
    Mistake("scores not scaled by 1/sqrt(d_k)", _lf("no_scale")),
    Mistake("scores scaled by 1/sqrt(k): the scale is 1/sqrt(d_k), the width of the queries and keys",
            _lf("sqrt_k")),
    Mistake("softmax over the wrong dimension: take it over the last one (the k projected keys)", _lf("softmax_dim")),
]


@hidden.test("test_linformer_attention_values")
def _(t):
    t.function("linformer_attention", t.randn(2, 5, 4), t.randn(2, 7, 4), t.randn(2, 7, 3), t.randn(3, 7),
               t.randn(3, 7), mistakes=LINFORMER_MISTAKES, checks=[rows_sum_to_one], label="N_q=5, N_k=7, k=3")
    t.function("linformer_attention", t.randn(3, 9, 8, dtype=torch.float64), t.randn(3, 12, 8, dtype=torch.float64),
               t.randn(3, 12, 5, dtype=torch.float64), t.randn(4, 12, dtype=torch.float64),
               t.randn(4, 12, dtype=torch.float64), mistakes=LINFORMER_MISTAKES, label="float64, k=4")
    t.function("linformer_attention", t.randn(1, 6, 16), t.randn(1, 6, 16), t.randn(1, 6, 16), t.randn(6, 6) / 2,
               t.randn(6, 6) / 2, mistakes=LINFORMER_MISTAKES, label="k = N_k")


@hidden.test("test_linformer_attention_sequence_axis")
def _(t):
    x = t.randn(1, 2, 6, 6)
    t.function("linformer_attention", x, x.clone(), x.clone(), t.randn(2, 6), t.randn(2, 6),
               mistakes=LINFORMER_MISTAKES, label="(1, 2, 6, 6) with N_k == d_k, k=2")
    t.function("linformer_attention", t.randn(2, 3, 4, 8), t.randn(2, 3, 10, 8), t.randn(2, 3, 10, 8),
               t.randn(5, 10), t.randn(5, 10), mistakes=LINFORMER_MISTAKES, label="(B, h, N, d) inputs, k=5")
    t.function("linformer_attention", t.randn(2, 3, 4), t.randn(2, 5, 4), t.randn(2, 5, 2), t.randn(1, 5),
               t.randn(1, 5), mistakes=LINFORMER_MISTAKES, label="k=1")


# %% [hidden]
def _linear(query, key, value, causal=False, eps=1e-6, how="ok"):
    """Quadratic form of the reference (fine for the small inputs of mistake models)."""
    phi = (lambda x: F.elu(x)) if how == "no_plus_one" else (lambda x: F.elu(x) + 1)
    q, k = phi(query), phi(key)
    a = q @ k.transpose(-2, -1)                                     # (..., N_q, N_k)
    n_q, n_k = a.shape[-2:]
    lower = torch.ones(n_q, n_k, dtype=torch.bool).tril(-1 if how == "strict" else 0)
    if causal and how != "future":
        num_a = a.masked_fill(~lower, 0)
        den_a = a if how == "den_future" else num_a
    else:
        num_a = den_a = a
    eps_den = 0.0 if how in ("no_eps", "eps_outside") else eps
    out = num_a @ value / (den_a.sum(-1, keepdim=True) + eps_den)
    if how == "no_norm":
        out = num_a @ value
    return out + eps if how == "eps_outside" else out


def _lin(how):
    return lambda q, k, v, causal=False, eps=1e-6: _linear(q, k, v, causal, eps, how)


LINEAR_MISTAKES = [
    Mistake("feature map missing its +1: phi(x) = elu(x) + 1 (elu alone can be negative)", _lin("no_plus_one")),
    Mistake("causal sum includes future keys: with causal=True, query i sums over keys j <= i only", _lin("future")),
    Mistake("causal denominator includes future keys: z must also run over j <= i only", _lin("den_future")),
    Mistake("causal sums leave out the query's own key: sum over j <= i, diagonal included", _lin("strict")),
    Mistake("eps ignored: add the eps argument to the denominator phi(q_i) . z", _lin("no_eps")),
    Mistake("eps added to the output: it belongs in the denominator, phi(q_i) . z + eps", _lin("eps_outside")),
    Mistake("output not normalised: divide phi(q_i) S by phi(q_i) . z + eps", _lin("no_norm")),
]


@hidden.test("test_linear_attention_values")
def _(t):
    t.function("linear_attention", t.randn(2, 5, 4), t.randn(2, 7, 4), t.randn(2, 7, 3), mistakes=LINEAR_MISTAKES,
               label="N_q=5, N_k=7")
    t.function("linear_attention", t.randn(2, 3, 6, 8, dtype=torch.float64), t.randn(2, 3, 9, 8, dtype=torch.float64),
               t.randn(2, 3, 9, 5, dtype=torch.float64), mistakes=LINEAR_MISTAKES, label="float64 (B, h, N, d)")
    t.function("linear_attention", t.randn(1, 4, 4), t.randn(1, 6, 4), t.randn(1, 6, 2), eps=3.0,
               mistakes=LINEAR_MISTAKES, label="eps=3.0")


@hidden.test("test_linear_attention_causal")
def _(t):
    t.function("linear_attention", t.randn(2, 10, 4), t.randn(2, 10, 4), t.randn(2, 10, 3), causal=True,
               mistakes=LINEAR_MISTAKES, label="causal, N=10")
    t.function("linear_attention", t.randn(1, 2, 150, 8), t.randn(1, 2, 150, 8), t.randn(1, 2, 150, 6),
               causal=True, mistakes=LINEAR_MISTAKES, label="causal, N=150 (several chunks of any usual size)")
    t.function("linear_attention", t.randn(1, 200, 4, dtype=torch.float64), t.randn(1, 200, 4, dtype=torch.float64),
               t.randn(1, 200, 4, dtype=torch.float64), causal=True, eps=2.0, mistakes=LINEAR_MISTAKES,
               label="causal, float64, N=200, eps=2.0")


@hidden.test("test_linear_attention_memory",
             max_memory=(64 * 2**20, "linear_attention built an N_q x N_k tensor: use phi(K)^T V (d x d_v) and "
                                     "phi(Q) @ that, and for causal a running state carried from chunk to chunk"))
def _(t):
    n, d = 8192, 16
    t.function("linear_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d),
               label=f"N={n}, d={d}")
    t.function("linear_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d), causal=True,
               label=f"causal, N={n}, d={d}")


# %% [hidden]
def _performer(x, omega, how="ok"):
    m = omega.size(-1)
    sq = (x * x).sum(-1, keepdim=True)
    shift = {"no_norm": 0.0, "norm_not_squared": sq.sqrt() / 2, "no_half": sq,
             "global_norm": (x * x).sum() / 2}.get(how, sq / 2)
    div = {"no_sqrt_m": 1.0, "sqrt_d": math.sqrt(x.size(-1))}.get(how, math.sqrt(m))
    return torch.exp(x @ omega - shift) / div


def _pf(how):
    return lambda x, omega: _performer(x, omega, how)


PERFORMER_MISTAKES = [
    Mistake("missing -|x|^2/2 in the exponent: phi(x) = exp(x @ omega - |x|^2/2) / sqrt(m)", _pf("no_norm")),
    Mistake("|x|^2 is the squared norm: use (x * x).sum(-1), not the norm itself", _pf("norm_not_squared")),
    Mistake("the exponent subtracts |x|^2 / 2, not |x|^2", _pf("no_half")),
    Mistake("|x|^2 per vector: sum over the last dimension only, not over the whole tensor", _pf("global_norm")),
    Mistake("missing the 1/sqrt(m) factor", _pf("no_sqrt_m")),
    Mistake("divide by sqrt(m), m = omega.size(-1) the number of features, not sqrt(d)", _pf("sqrt_d")),
]


@hidden.test("test_performer_features_values")
def _(t):
    t.function("performer_features", t.randn(2, 3, 4) * 0.5, t.randn(4, 6), mistakes=PERFORMER_MISTAKES,
               label="x (2, 3, 4), m=6")
    t.function("performer_features", t.randn(5, 8, dtype=torch.float64) * 0.4, t.randn(8, 3, dtype=torch.float64),
               mistakes=PERFORMER_MISTAKES, label="float64 x (5, 8), m=3")
    t.function("performer_features", t.randn(2, 2, 3, 6) * 0.5, t.randn(6, 16), mistakes=PERFORMER_MISTAKES,
               label="x (2, 2, 3, 6), m=16")


# %% [hidden]
def _lsh(x, rotations, how="ok"):
    p = x @ rotations
    if how == "half":
        return p.argmax(-1)
    return torch.cat([-p, p] if how == "reversed" else [p, -p], dim=-1).argmax(-1)


LSH_MISTAKES = [
    Mistake("buckets from only x @ R: take the argmax over cat([x @ R, -x @ R]) so that there are b buckets",
            lambda x, r: _lsh(x, r, "half")),
    Mistake("concatenated in the wrong order: x @ R first, then -x @ R", lambda x, r: _lsh(x, r, "reversed")),
]


@hidden.test("test_lsh_hash_values")
def _(t):
    t.function("lsh_hash", t.randn(2, 20, 8), t.randn(8, 4), mistakes=LSH_MISTAKES, label="x (2, 20, 8), b=8")
    t.function("lsh_hash", t.randn(3, 2, 16, 6, dtype=torch.float64), t.randn(6, 2, dtype=torch.float64),
               mistakes=LSH_MISTAKES, label="float64 x (3, 2, 16, 6), b=4")
    t.function("lsh_hash", t.randn(30, 4), t.randn(4, 8), mistakes=LSH_MISTAKES, label="x (30, 4), b=16")


# %% [hidden]
def _flash(query, key, value, block_size=64, causal=False, how="ok"):
    """A blocked forward pass with one deliberate change."""
    d = query.size(-1)
    scale = 1.0 if how == "no_scale" else 1 / math.sqrt(d)
    n_q, n_k = query.size(-2), key.size(-2)
    outs = []
    for i0 in range(0, n_q, block_size):
        q_i = query[..., i0:i0 + block_size, :] * scale
        m = torch.full((*q_i.shape[:-1], 1), -math.inf, dtype=q_i.dtype)
        if how == "no_max":
            m = torch.zeros_like(m)
        l = torch.zeros_like(m)
        acc = torch.zeros(*q_i.shape[:-1], value.size(-1), dtype=q_i.dtype)
        stop = min(n_k, i0 + q_i.size(-2)) if causal and how != "no_causal" else n_k
        for j0 in range(0, stop, block_size):
            s = q_i @ key[..., j0:j0 + block_size, :].transpose(-2, -1)
            if causal and how not in ("no_causal", "no_diag_mask"):
                s = s.masked_fill(torch.arange(j0, j0 + s.size(-1))[None, :]
                                  > torch.arange(i0, i0 + s.size(-2))[:, None], -math.inf)
            m_new = m if how == "no_max" else torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = (l if how == "no_rescale_sum" else alpha * l) + p.sum(-1, keepdim=True)
            acc = (acc if how == "no_rescale_acc" else alpha * acc) + p @ value[..., j0:j0 + block_size, :]
            m = m_new
        outs.append(acc / l)
    return torch.cat(outs, dim=-2)


def _fl(how):
    return lambda q, k, v, block_size=64, causal=False: _flash(q, k, v, block_size, causal, how)


FLASH_MISTAKES = [
    Mistake("the online softmax does not rescale the running sum: l = exp(m_old - m_new) * l + rowsum(p)",
            _fl("no_rescale_sum")),
    Mistake("the online softmax does not rescale the running output: acc = exp(m_old - m_new) * acc + p @ v_j",
            _fl("no_rescale_acc")),
    Mistake("exp overflowed: subtract the running maximum before exp (these scores are large)", _fl("no_max")),
    Mistake("scores not scaled by 1/sqrt(d_k)", _fl("no_scale")),
    Mistake("causal ignored: with causal=True query i attends to keys j <= i only", _fl("no_causal")),
    Mistake("causal: the block on the diagonal needs a mask too (key j > query i is the future)",
            _fl("no_diag_mask")),
]


@hidden.test("test_flash_attention_values")
def _(t):
    t.function("flash_attention", t.randn(2, 37, 8), t.randn(2, 50, 8), t.randn(2, 50, 5), block_size=16,
               mistakes=FLASH_MISTAKES, label="N_q=37, N_k=50, block_size=16")
    # increasing scores along the keys: the maximum grows in every block, so the rescaling matters
    ramp = torch.linspace(0, 3, 40)[None, :, None]
    t.function("flash_attention", t.randn(1, 24, 4) + 1.0, t.randn(1, 40, 4) * 0.5 + ramp, t.randn(1, 40, 3),
               block_size=8, mistakes=FLASH_MISTAKES, label="scores growing from block to block")
    t.function("flash_attention", t.randn(2, 2, 30, 8, dtype=torch.float64), t.randn(2, 2, 30, 8, dtype=torch.float64),
               t.randn(2, 2, 30, 8, dtype=torch.float64), block_size=7, mistakes=FLASH_MISTAKES,
               label="float64 (B, h, N, d), block_size=7")
    t.function("flash_attention", t.randn(1, 5, 4), t.randn(1, 9, 4), t.randn(1, 9, 4), mistakes=FLASH_MISTAKES,
               label="default block_size, one block")
    t.function("flash_attention", t.randn(1, 12, 4), t.randn(1, 12, 4), t.randn(1, 12, 2), block_size=1,
               mistakes=FLASH_MISTAKES, label="block_size=1")


@hidden.test("test_flash_attention_causal")
def _(t):
    for n, bs in [(45, 8), (33, 16), (20, 64)]:
        t.function("flash_attention", t.randn(1, 2, n, 8), t.randn(1, 2, n, 8), t.randn(1, 2, n, 6), block_size=bs,
                   causal=True, mistakes=FLASH_MISTAKES, label=f"causal, N={n}, block_size={bs}")
    t.function("flash_attention", t.randn(2, 26, 4, dtype=torch.float64), t.randn(2, 26, 4, dtype=torch.float64),
               t.randn(2, 26, 4, dtype=torch.float64), block_size=5, causal=True, mistakes=FLASH_MISTAKES,
               label="causal, float64, block_size=5")


@hidden.test("test_flash_attention_stability")
def _(t):
    t.function("flash_attention", t.randn(1, 40, 4) * 30, t.randn(1, 40, 4) * 30, t.randn(1, 40, 4),
               block_size=16, mistakes=FLASH_MISTAKES, label="scores of several hundreds")
    t.function("flash_attention", t.randn(2, 33, 8) * 20, t.randn(2, 33, 8) * 20, t.randn(2, 33, 3),
               block_size=8, causal=True, mistakes=FLASH_MISTAKES, label="causal, scores of several hundreds")


@hidden.test("test_flash_attention_memory",
             max_memory=(64 * 2**20, "flash_attention built an N_q x N_k tensor (scores, weights or a mask): "
                                     "keep only one block of block_size x block_size scores at a time"))
def _(t):
    n, d = 8192, 32
    t.function("flash_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d), block_size=256,
               label=f"N={n}, d={d}, block_size=256")
    t.function("flash_attention", t.randn(1, n, d), t.randn(1, n, d), t.randn(1, n, d), block_size=256,
               causal=True, label=f"causal, N={n}, d={d}, block_size=256")


# %% [hidden]
def _gqa(m, x, mask=None, how="ok"):
    B, N, _ = x.shape
    h, h_kv, d_h = m.num_heads, m.num_kv_heads, m.d_head
    q = m.W_q(x).view(B, N, h, d_h).transpose(1, 2)
    k = m.W_k(x).view(B, N, h_kv, d_h).transpose(1, 2)
    v = m.W_v(x).view(B, N, h_kv, d_h).transpose(1, 2)
    if how == "repeat":
        k, v = k.repeat(1, h // h_kv, 1, 1), v.repeat(1, h // h_kv, 1, 1)
    else:
        k, v = k.repeat_interleave(h // h_kv, 1), v.repeat_interleave(h // h_kv, 1)
    scale = {"no_scale": 1.0, "sqrt_d_model": 1 / math.sqrt(h * d_h)}.get(how, 1 / math.sqrt(d_h))
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None and how != "mask_ignored":
        scores = scores.masked_fill(mask if how == "mask_inverted" else ~mask, -1e9)
    weights = torch.softmax(scores, -1)
    out = weights @ v
    out = out.reshape(B, N, h * d_h) if how == "merge_order" else out.transpose(1, 2).reshape(B, N, h * d_h)
    return (out if how == "no_w_o" else m.W_o(out)), weights


def _gq(how):
    return lambda m, x, mask=None: _gqa(m, x, mask, how)


GQA_MISTAKES = [
    Mistake("wrong key/value head: query head i must use key/value head i // (num_heads // num_kv_heads); "
            "repeat_interleave the key/value heads, do not repeat (tile) them", _gq("repeat")),
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(d_head), d_head = d_model // num_heads",
            _gq("sqrt_d_model")),
    Mistake("scores not scaled by 1/sqrt(d_head)", _gq("no_scale")),
    Mistake("W_o forgotten: apply self.W_o to the concatenated heads", _gq("no_w_o")),
    Mistake("heads merged in the wrong order: transpose (B, h, N, d_head) to (B, N, h, d_head) before flattening",
            _gq("merge_order")),
    Mistake("mask ignored: pass it on to the attention", _gq("mask_ignored")),
    Mistake("mask polarity inverted: True means the query MAY attend to the key", _gq("mask_inverted")),
]


@hidden.test("test_GroupedQueryAttention_values")
def _(t):
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 5, 16),
             mistakes=GQA_MISTAKES, checks=[rows_sum_to_one], label="d_model=16, 4 heads, 2 key/value heads")
    t.module("GroupedQueryAttention", dict(d_model=32, num_heads=8, num_kv_heads=2), t.randn(1, 6, 32),
             mistakes=GQA_MISTAKES, label="8 heads, 2 key/value heads (groups of 4)")
    t.module("GroupedQueryAttention", dict(d_model=24, num_heads=6, num_kv_heads=3), t.randn(2, 4, 24, dtype=torch.float64),
             dtype=torch.float64, mistakes=GQA_MISTAKES, label="float64, 6 heads, 3 key/value heads")


@hidden.test("test_GroupedQueryAttention_mha_mqa")
def _(t):
    t.module("GroupedQueryAttention", dict(d_model=8, num_heads=4, num_kv_heads=4), t.randn(2, 5, 8),
             mistakes=GQA_MISTAKES, label="num_kv_heads == num_heads (multi-head)")
    t.module("GroupedQueryAttention", dict(d_model=8, num_heads=4, num_kv_heads=1), t.randn(2, 5, 8),
             mistakes=GQA_MISTAKES, label="num_kv_heads == 1 (multi-query)")
    t.module("GroupedQueryAttention", dict(d_model=8, num_heads=1, num_kv_heads=1), t.randn(1, 3, 8),
             mistakes=GQA_MISTAKES, label="one head")


@hidden.test("test_GroupedQueryAttention_mask")
def _(t):
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 6, 16),
             mask=causal, mistakes=GQA_MISTAKES, label="a causal (N, N) mask")
    pad = (torch.arange(6)[None, :] < torch.tensor([6, 3])[:, None])[:, None, None, :]
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 6, 16),
             mask=pad, mistakes=GQA_MISTAKES, label="a (B, 1, 1, N) padding mask")


@hidden.test("test_GroupedQueryAttention_gradients")
def _(t):
    t.module("GroupedQueryAttention", dict(d_model=16, num_heads=4, num_kv_heads=2), t.randn(2, 5, 16), grad=True,
             mistakes=GQA_MISTAKES, label="gradients, 4 heads, 2 key/value heads")
