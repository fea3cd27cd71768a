# %% [markdown]
# # Chapter 4: Positional encoding
#
# Attention compares every token with every other token, and nothing in that
# comparison refers to *where* the tokens are. Shuffle a sentence and each word gets
# the same output as before, only in a different place. This chapter shows that by
# experiment and then repairs it, in the ways the field has tried since 2017: adding a
# position vector to each token (sinusoidal or learned), rotating queries and keys by
# an angle that grows with the position (RoPE), and penalising attention scores by
# distance (ALiBi). At the end we train the same tiny model with each of them and see
# which ones still work on sequences longer than those they were trained on. Chapter 3
# already needed this: its neighbour model could tell a left neighbour from a right one
# only because we gave it a learned vector per position. Here we see why, and what the
# alternatives are.
#
# **Learning goals.** After this chapter you can
#
# - show that self-attention is permutation equivariant, and why that is a problem;
# - compute the sinusoidal encoding of the original Transformer, explain its
#   wavelengths, and compare it with a learned position table;
# - prove in code that a fixed rotation matrix $M_k$ maps the encoding of position
#   $pos$ to that of $pos + k$, for every $pos$;
# - implement rotary position embedding (RoPE) and show that the score between a
#   rotated query and key depends only on their distance;
# - build the ALiBi bias, and compare how the methods extrapolate to longer sequences.
#
# **Prerequisites.** Chapters 2 and 3 (scaled dot-product attention, masks, splitting
# into heads). Sines, cosines and the angle-sum formulas; rotations of the plane as
# $2 \times 2$ matrices; broadcasting in PyTorch.
#
# **Time.** About 2.5 hours: 1.5 for the reading and the four exercises, the rest for
# the experiments and the questions. The whole notebook runs in about a minute on a
# laptop CPU (the five small models of Section 7 take most of it).
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `sinusoidal_encoding(max_len, d_model)` | the `(max_len, d_model)` table of the original Transformer, sin and cos interleaved | ★ | 3 |
# | `relative_position_matrix(k, d_model)` | the matrix $M_k$ with $PE_{pos+k} = PE_{pos} M_k$ | ★★ | 2 |
# | `apply_rope(x, base=10000.0)` | rotate each feature pair of `x (..., N, d)` by an angle proportional to its position | ★★ | 3 |
# | `alibi_bias(num_heads, n)` | the `(num_heads, n, n)` distance penalty $-m_h\,\lvert i - j\rvert$ | ★ | 2 |

# %% [export]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# %%
import time

import matplotlib.pyplot as plt
plt.rcParams["axes.unicode_minus"] = False  # a log axis's 10^-1 with a hyphen, which every figure font has
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

try:                      # the book puts numbers from these cells into its text
    from myst_nb import glue
except ImportError:       # in plain Jupyter: just show them
    def glue(name, value, display=True):
        print(f"{name} = {value}")

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)   # the tensors in this chapter are tiny: one CPU thread is fastest

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# ## 1. Attention does not know the order
#
# Chapter 2 proved it for one head: permuting the input tokens permutes the outputs in
# the same way, and changes nothing else. The same holds for multi-head attention,
# which is several such heads side by side. Chapter 3 showed that
# `nn.MultiheadAttention` computes exactly the layer you built there, so we use it here.

# %%
torch.manual_seed(0)
d_model, N = 16, 6
mha = nn.MultiheadAttention(d_model, num_heads=4, batch_first=True)
x = torch.randn(1, N, d_model)                    # (B, N, d_model)
perm = torch.randperm(N)
with torch.no_grad():
    out, _ = mha(x, x, x)
    out_perm, _ = mha(x[:, perm], x[:, perm], x[:, perm])
print("permutation:", perm.tolist())
print("outputs of the shuffled input == shuffled outputs:", torch.allclose(out_perm, out[:, perm], atol=1e-6))

# %% [markdown]
# The layer is *permutation equivariant*: $\mathrm{Attn}(PX) = P\,\mathrm{Attn}(X)$ for every
# permutation matrix $P$. For language this is a disaster. "我爱你" (I love you) and
# "你爱我" (you love me) contain the same three characters; only the order says who
# loves whom. Give each character an embedding and look at what attention makes of the
# two sentences:

# %%
torch.manual_seed(0)
chars = {"我": 0, "爱": 1, "你": 2}
embed = nn.Embedding(len(chars), d_model)
s1 = torch.tensor([[chars[c] for c in "我爱你"]])    # (1, 3)
s2 = torch.tensor([[chars[c] for c in "你爱我"]])
with torch.no_grad():
    out1, _ = mha(embed(s1), embed(s1), embed(s1))    # (1, 3, d_model)
    out2, _ = mha(embed(s2), embed(s2), embed(s2))
print("output of 我 in 我爱你 == output of 我 in 你爱我:", torch.allclose(out1[0, 0], out2[0, 2], atol=1e-6))
print("output of 爱 is the same in both:           ", torch.allclose(out1[0, 1], out2[0, 1], atol=1e-6))
print("sentence vectors (mean over tokens) equal:   ", torch.allclose(out1.mean(1), out2.mean(1), atol=1e-6))

# %% [markdown]
# Every character gets the same vector in both sentences, so nothing built on top
# of these outputs (another layer, a classifier on the average) can tell the two
# sentences apart. A recurrent network reads tokens one after the other, so order is
# part of its computation. Attention reads them all at once, so order has to be
# *supplied*: that is what positional encodings do.
#
# There are two broad ways to supply it.
#
# - **Absolute**: give every position $pos$ a vector $p_{pos}$ and add it to the
#   token's embedding before the first layer, $x_{pos} = e(\text{token}_{pos}) + p_{pos}$.
#   The vectors can be learned (BERT, GPT-2) or fixed by a formula (the sinusoids of
#   the original Transformer).
# - **Relative**: leave the embeddings alone and make the attention score between
#   positions $i$ and $j$ depend on the offset $i - j$. Shaw, Uszkoreit and Vaswani
#   (2018) first learned a vector per clipped offset; T5 (Raffel et al., 2020) adds a
#   learned scalar per offset bucket and head to the scores. RoPE (LLaMA, Mistral, Qwen
#   and most recent open models) and ALiBi (BLOOM, MPT) are the two we build here.
#
# The diagram shows where each method of this chapter enters one attention layer. The
# layer is the same in all three columns; only the red box moves.

# %% [tags=hide-input]
POSITION_TEXT = dict(
    title="Where position enters an attention layer",
    absolute="absolute (sinusoidal or learned):\nadded to the input",
    rope="RoPE:\nqueries and keys rotated",
    alibi="ALiBi:\nscores penalised by distance",
    ids="token ids  (N,)",
    embed="embedding  (N, d_model)",
    add_pe="+ positional encoding  (N, d_model)\n= x  (N, d_model)",
    proj="W_q, W_k, W_v, split into heads\nq, k, v  (h, N, d_k)",
    rotate="rotate q and k: pair i at position p\nby the angle p·θ_i  (v unchanged)",
    scores="scores q kᵀ / √d_k  (h, N, N)",
    bias="+ bias −m_h |i − j|  (h, N, N)",
    softmax="softmax, blend the values\n→ (N, d_model)",
)


def draw_position_diagram(text=POSITION_TEXT):
    fig, ax = plt.subplots(figsize=(11, 6.4))
    ax.set_xlim(0, 11)
    ax.set_ylim(0.05, 8.6)
    ax.axis("off")
    plain, position = "#dcdcdc", "#f4a3a3"
    rows = {"ids": 7.5, "embed": 6.55, "add_pe": 5.55, "proj": 4.5, "rotate": 3.45, "scores": 2.45,
            "bias": 1.5, "softmax": 0.5}
    columns = [(1.85, "absolute", "add_pe"), (5.5, "rope", "rotate"), (9.15, "alibi", "bias")]
    w, hgt = 3.3, 0.7

    def box(x, y, label, color):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - hgt / 2), w, hgt, boxstyle="round,pad=0.04",
                                    fc=color, ec="black", lw=0.8))
        ax.text(x, y, label, ha="center", va="center", fontsize=8.5)

    for x, title, where in columns:
        ax.text(x, 8.45, text[title], ha="center", va="top", fontsize=9.5, weight="bold")
        used = [key for key in rows if key in ("ids", "embed", "proj", "scores", "softmax") or key == where]
        for key in used:
            box(x, rows[key], text[key], position if key == where else plain)
        for a, b in zip(used, used[1:]):
            ax.add_patch(FancyArrowPatch((x, rows[a] - hgt / 2 - 0.04), (x, rows[b] + hgt / 2 + 0.04),
                                         arrowstyle="-|>", mutation_scale=10, color="black", lw=1.0))
    ax.set_title(text["title"], fontsize=11, pad=14)
    return fig


draw_position_diagram()
plt.show()

# %% [markdown]
# ## 2. Learned absolute positions
#
# The simplest idea: a table with one trainable vector per position,
# `nn.Embedding(max_len, d_model)`, trained with the rest of the model. It can represent
# anything, but it has two limits built in. It has no row for a position beyond
# `max_len`, and a row for a position that training sequences rarely reach is barely
# trained.

# %%
table = nn.Embedding(16, 8)                    # max_len = 16 positions, d_model = 8
print("positions 0..15:", tuple(table(torch.arange(16)).shape))
try:
    table(torch.tensor([16]))
except IndexError as err:
    print("position 16:", repr(err))

# %% [markdown]
# GPT-2, for instance, learned 1024 such vectors, and could therefore never read a
# 1025th token. Section 7 measures what happens on positions that exist in the table
# but were never trained.

# %% [markdown]
# ## 3. Sinusoidal encoding
#
# The original Transformer fixes the vectors by a formula instead. For position $pos$
# (counted from 0) and $i = 0, 1, \dots, d_\text{model}/2 - 1$:
#
# $$PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right), \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right).$$
#
# Features $2i$ and $2i+1$ form a pair that shares one angular frequency
# $\omega_i = 10000^{-2i/d_\text{model}}$: the sine goes to the even feature, the cosine
# to the odd one right after it, so sines and cosines **interleave**. As $pos$ grows,
# each pair turns around a circle at its own speed. The wavelength of pair $i$ is
# $\lambda_i = 2\pi \cdot 10000^{2i/d_\text{model}}$ positions: $2\pi \approx 6.3$ for the
# first pair, growing geometrically to almost $2\pi \cdot 10000$ for the last. Like the
# hands of a clock, fast pairs tell nearby positions apart and slow pairs tell far-apart
# positions apart. All values lie in $[-1, 1]$, every position gets a different vector,
# and the formula works for any $pos$, including positions longer than any training
# sequence.
#
# Some code bases, including the tensor2tensor library by the paper's authors, put
# all sines first and all cosines after them. That is a permutation of the features and
# works just as well inside a model, but it is not the paper's formula, and it is not
# what this exercise asks for.
#
# ### Exercise: the sinusoidal table
#
# Write the table of the formula above, without a Python loop over positions or
# features.
#
# :::{dropdown} Hint: building the table
# Build the angle table `pos * omega_i` of shape `(max_len, d_model / 2)` by
# broadcasting a column of positions against a row of frequencies, then fill the even
# columns with its sine and the odd columns with its cosine (slices `0::2` and `1::2`,
# or `torch.stack(..., dim=-1)` followed by a flatten). Computing the angles in float64
# and converting at the end costs nothing and keeps the table accurate at large
# positions.
# :::

# %% [exercise sinusoidal_encoding]
def sinusoidal_encoding(max_len, d_model):
    """Sinusoidal positional encoding of the original Transformer.

    Args:
        max_len: number of positions, pos = 0, 1, ..., max_len - 1.
        d_model: number of features (even).

    Returns a tensor PE of shape (max_len, d_model), in torch's default dtype
    (float32), with, for i = 0, 1, ..., d_model/2 - 1,
        PE[pos, 2i]     = sin(pos / 10000 ** (2i / d_model))
        PE[pos, 2i + 1] = cos(pos / 10000 ** (2i / d_model))
    (sine on the even features, cosine on the odd ones, interleaved).
    """
    ### BEGIN SOLUTION
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]                 # (max_len, 1)
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    angles = pos * omega                                                      # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe.to(torch.get_default_dtype())                                   # (max_len, d_model)
    ### END SOLUTION


# %% [test test_sinusoidal_encoding_values points=1]
"""A small table checked against the formula: interleaved sin/cos, frequencies 10000^(-2i/d_model)."""
se = sinusoidal_encoding(3, 4)
assert isinstance(se, torch.Tensor) and se.shape == (3, 4), \
    f"sinusoidal_encoding(3, 4) should have shape (max_len, d_model) = (3, 4), got {getattr(se, 'shape', se)}"
se_expected = torch.tensor([[0.0, 1.0, 0.0, 1.0],
                            [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
                            [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)]])
assert torch.allclose(se[0], torch.tensor([0.0, 1.0, 0.0, 1.0]), atol=1e-6), \
    f"position 0 should be [sin 0, cos 0, sin 0, cos 0] = [0, 1, 0, 1], got {se[0].tolist()}: do positions start at 0?"
assert not torch.allclose(se, se_expected[:, [0, 2, 1, 3]], atol=1e-6), \
    "sin and cos concatenated ([sin, sin, ..., cos, cos, ...]): the paper interleaves them, sin on even features, cos on odd"
assert not torch.allclose(se, se_expected[:, [1, 0, 3, 2]], atol=1e-6), \
    "sin and cos swapped: sine goes to the even features 2i, cosine to the odd features 2i+1"
assert torch.allclose(se[:, 0:2], se_expected[:, 0:2], atol=1e-6), \
    f"features 0 and 1 should be sin(pos) and cos(pos); got {se[:, 0:2].tolist()}"
assert torch.allclose(se[:, 2], se_expected[:, 2], atol=1e-6), \
    "feature 2 should be sin(pos / 10000^(2/4)) = sin(pos / 100): check the frequencies 10000^(-2i/d_model)"
assert torch.allclose(se[:, 3], se_expected[:, 3], atol=1e-6), \
    "feature 3 should be cos(pos / 100): the odd feature 2i+1 uses the SAME frequency as feature 2i"
assert torch.allclose(se, se_expected, atol=1e-6), f"expected\n{se_expected}\ngot\n{se}"

# %% [test test_sinusoidal_encoding_shapes points=1]
"""Shapes and dtype for several sizes: (max_len, d_model), torch's default dtype."""
for se_len, se_d in [(1, 2), (7, 6), (5, 10)]:
    se_t = sinusoidal_encoding(se_len, se_d)
    assert se_t.shape == (se_len, se_d), f"sinusoidal_encoding({se_len}, {se_d}) has shape {tuple(se_t.shape)}"
    assert se_t.dtype == torch.get_default_dtype(), \
        f"sinusoidal_encoding must return torch's default dtype ({torch.get_default_dtype()}), got {se_t.dtype}"
se_t = sinusoidal_encoding(7, 6)
assert torch.allclose(se_t[:, 1::2] ** 2 + se_t[:, 0::2] ** 2, torch.ones(7, 3), atol=1e-5), \
    "each pair (2i, 2i+1) must be (sin, cos) of the same angle, so that sin^2 + cos^2 = 1"

# %% [test test_sinusoidal_encoding_long points=1]
"""A long, wide table: every entry matches the formula (computed here in float64)."""
sl = sinusoidal_encoding(64, 128)
sl_pos = torch.arange(64, dtype=torch.float64)[:, None]
sl_angle = sl_pos / 10000 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
assert sl.shape == (64, 128), f"expected shape (64, 128), got {tuple(sl.shape)}"
assert torch.allclose(sl[:, 0::2].double(), torch.sin(sl_angle), atol=2e-5), "even features must be sin(pos * omega_i)"
assert torch.allclose(sl[:, 1::2].double(), torch.cos(sl_angle), atol=2e-5), "odd features must be cos(pos * omega_i)"

# %% [markdown]
# ### Looking at the encoding
#
# Below, each row of the left picture is one position's vector. The first pairs (left
# columns) oscillate quickly down the positions; the last ones barely move, so over
# these 100 positions their sines stay near 0 and their cosines near 1. The right
# picture shows the wavelength of each pair: a straight line on a log scale, a
# geometric progression from $2\pi$ towards $2\pi \cdot 10000$.

# %%
pe = sinusoidal_encoding(100, 64)                                   # (100, 64)
wavelengths = 2 * math.pi * 10000 ** (torch.arange(0, 64, 2) / 64)  # (32,)
print(f"d_model=64: wavelengths from {wavelengths[0]:.2f} to {wavelengths[-1]:,.0f} positions")
print(f"d_model=512: longest wavelength {2 * math.pi * 10000 ** (510 / 512):,.0f} positions")

# %% [tags=hide-input]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1.6, 1]})
im = ax1.imshow(pe, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
ax1.set_xlabel("feature")
ax1.set_ylabel("position")
ax1.set_title("Sinusoidal encoding, d_model = 64")
fig.colorbar(im, ax=ax1)
ax2.semilogy(range(32), wavelengths, "o", markersize=3)
ax2.set_xlabel("pair i (features 2i, 2i+1)")
ax2.set_ylabel("wavelength (positions)")
ax2.set_title(r"$\lambda_i = 2\pi \cdot 10000^{2i/d_{model}}$")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Similarity depends on distance only
#
# Take the dot product of two position vectors. Each pair contributes
# $\sin a \sin b + \cos a \cos b = \cos(a - b)$, so
#
# $$PE_{p} \cdot PE_{q} = \sum_{i} \cos\big(\omega_i\,(p - q)\big),$$
#
# a function of the distance $p - q$ alone, equal to $d_\text{model}/2$ at distance 0
# and smaller elsewhere. Nearby positions look alike, and the same distance gives the
# same similarity anywhere in the sequence. Since cosine is even, though, the dot
# product cannot tell "3 before" from "3 after".

# %%
gram = pe @ pe.T                                 # (100, 100): PE_p . PE_q
dist = torch.arange(-40, 41)
for p in (40, 50, 59):
    same = torch.allclose(gram[p, p + dist], gram[40, 40 + dist], atol=1e-3)
    print(f"row p={p}: PE_p . PE_(p+k) for k = -40..40 equals row p=40: {same}")

# %% [tags=hide-input]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
im = ax1.imshow(gram, cmap="viridis")
ax1.set_xlabel("position q")
ax1.set_ylabel("position p")
ax1.set_title(r"$PE_p \cdot PE_q$ (constant along diagonals)")
fig.colorbar(im, ax=ax1)
ax2.plot(dist, gram[50, 50 + dist], "-")
ax2.set_xlabel("distance q - p")
ax2.set_ylabel(r"$PE_p \cdot PE_q$")
ax2.set_title("Similarity against distance (p = 50)")
plt.tight_layout()
plt.show()

# %% [markdown]
# ### Back to 我爱你
#
# Add the encoding to the embeddings and the two sentences are no longer the same
# bag of vectors: 我 at position 0 and 我 at position 2 now enter the layer as
# different vectors, and so do the outputs.

# %%
with torch.no_grad():
    pos3 = sinusoidal_encoding(3, d_model)                   # (3, d_model)
    x1, x2 = embed(s1) + pos3, embed(s2) + pos3             # (1, 3, d_model)
    out1, _ = mha(x1, x1, x1)
    out2, _ = mha(x2, x2, x2)
print("with positions, output of 我 the same in both sentences:", torch.allclose(out1[0, 0], out2[0, 2], atol=1e-6))
print("sentence vectors equal:", torch.allclose(out1.mean(1), out2.mean(1), atol=1e-6))
print("distance between the two sentence vectors:", (out1.mean(1) - out2.mean(1)).norm().item())

# %% [markdown]
# ## 4. Relative positions as rotations
#
# The paper chose sinusoids partly for a property it states in one line: for any fixed
# offset $k$, $PE_{pos+k}$ is a *linear function* of $PE_{pos}$. Here is why. Write
# $a = pos\,\omega_i$ and $b = k\,\omega_i$ for pair $i$. The angle-sum formulas
#
# $$\sin(a + b) = \sin a \cos b + \cos a \sin b, \qquad \cos(a + b) = \cos a \cos b - \sin a \sin b$$
#
# say, for the row vector $(\sin a, \cos a)$ of pair $i$,
#
# $$\big(\sin(a+b),\ \cos(a+b)\big) = \big(\sin a,\ \cos a\big)
# \begin{bmatrix} \cos b & -\sin b \\ \sin b & \cos b \end{bmatrix}.$$
#
# The $2 \times 2$ matrix is a rotation, and it depends on $k$ and $i$ but **not on
# $pos$**. Put one such block per pair on the diagonal of a $d_\text{model} \times
# d_\text{model}$ matrix $M_k$ (block $i$ in rows and columns $2i, 2i+1$, zeros
# elsewhere) and the whole vector obeys
#
# $$PE_{pos + k} = PE_{pos}\, M_k \quad \text{for every } pos .$$
#
# A layer that wants to "look $k$ positions ahead" can therefore use the same linear
# map everywhere in the sequence. Note the convention: positions are *row* vectors
# multiplied from the left, as in `pe[pos] @ M`, so the block is the transpose of the
# rotation matrix you may know from column vectors.
#
# ### Exercise: the shift matrix

# %% [exercise relative_position_matrix]
def relative_position_matrix(k, d_model):
    """The matrix M_k with sinusoidal_encoding(...)[pos + k] == sinusoidal_encoding(...)[pos] @ M_k.

    Args:
        k: the offset (an int).
        d_model: number of features (even).

    Returns a (d_model, d_model) tensor in torch's default dtype (float32),
    block diagonal: for each pair i = 0, ..., d_model/2 - 1, with
    b = k * omega_i and omega_i = 10000 ** (-2i / d_model),
        M[2i, 2i]     = cos(b)    M[2i, 2i + 1]     = -sin(b)
        M[2i + 1, 2i] = sin(b)    M[2i + 1, 2i + 1] =  cos(b)
    and zeros everywhere else.
    """
    ### BEGIN SOLUTION
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    cos, sin = torch.cos(k * omega), torch.sin(k * omega)                    # (d_model/2,)
    blocks = torch.stack([torch.stack([cos, -sin], dim=-1),
                          torch.stack([sin, cos], dim=-1)], dim=-2)          # (d_model/2, 2, 2)
    return torch.block_diag(*blocks).to(torch.get_default_dtype())          # (d_model, d_model)
    ### END SOLUTION


# %% [test test_relative_position_matrix_values points=1]
"""Block-diagonal rotations [[cos b, -sin b], [sin b, cos b]] with b = k * omega_i; M_0 is the identity."""
rm = relative_position_matrix(1, 4)
assert isinstance(rm, torch.Tensor) and rm.shape == (4, 4), \
    f"relative_position_matrix(1, 4) should have shape (d_model, d_model) = (4, 4), got {getattr(rm, 'shape', rm)}"
assert rm.dtype == torch.get_default_dtype(), f"return torch's default dtype ({torch.get_default_dtype()}), got {rm.dtype}"
rm_c, rm_s = math.cos(1), math.sin(1)
rm_c2, rm_s2 = math.cos(0.01), math.sin(0.01)
rm_expected = torch.tensor([[rm_c, -rm_s, 0, 0], [rm_s, rm_c, 0, 0],
                            [0, 0, rm_c2, -rm_s2], [0, 0, rm_s2, rm_c2]])
assert not torch.allclose(rm, rm_expected.T, atol=1e-6), \
    "blocks transposed: that is the matrix for column vectors (M @ pe). With row vectors, pe[pos] @ M, " \
    "the block is [[cos b, -sin b], [sin b, cos b]]"
assert torch.allclose(rm, rm_expected, atol=1e-6), f"relative_position_matrix(1, 4) should be\n{rm_expected}\ngot\n{rm}"
assert torch.allclose(relative_position_matrix(0, 6), torch.eye(6), atol=1e-6), \
    "relative_position_matrix(0, d_model) must be the identity: a shift by 0 changes nothing"

# %% [test test_relative_position_matrix_every_pos points=1]
"""PE[pos + k] == PE[pos] @ M_k for every pos, several k and d_model (PE computed here in float64)."""
def rm_pe(max_len, d):                       # the paper's formula, in float64
    angle = torch.arange(max_len, dtype=torch.float64)[:, None] / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)
for rm_k, rm_d in [(1, 8), (3, 16), (10, 32), (25, 6)]:
    rm_m = relative_position_matrix(rm_k, rm_d)
    rm_table = rm_pe(60 + rm_k, rm_d)
    rm_err = (rm_table[:60] @ rm_m.double() - rm_table[rm_k:]).abs().max().item()
    assert rm_err < 1e-5, \
        f"k={rm_k}, d_model={rm_d}: PE[pos] @ M differs from PE[pos + k] by up to {rm_err:.2g}: " \
        "check the angle k * omega_i and the layout (block i in rows and columns 2i, 2i+1)"

# %% [markdown]
# Now the proof by experiment, with your two functions: the identity holds at every
# position of a long table, $M_k$ is orthogonal (a rotation does not change lengths),
# and shifts compose: $M_a M_b = M_{a+b}$.

# %%
pe_long = sinusoidal_encoding(500, 64).double()          # (500, 64)
for k in (1, 7, 100):
    M = relative_position_matrix(k, 64).double()
    err = (pe_long[:500 - k] @ M - pe_long[k:]).abs().max().item()
    print(f"k={k:3d}: max over all {500 - k} positions of |PE[pos] @ M_k - PE[pos+k]| = {err:.1e}")
M3, M4, M7 = (relative_position_matrix(k, 64).double() for k in (3, 4, 7))
print("M_k orthogonal (M M^T = I):", torch.allclose(M7 @ M7.T, torch.eye(64, dtype=torch.float64), atol=1e-6))
print("M_3 M_4 = M_7:", torch.allclose(M3 @ M4, M7, atol=1e-6))


def pe_table(max_len, d_model, dtype):
    """The same table with every step (angles included) computed in `dtype`."""
    angle = torch.arange(max_len, dtype=dtype)[:, None] * 10000.0 ** (-torch.arange(0, d_model, 2, dtype=dtype) / d_model)
    return torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)   # (max_len, d_model)

omega = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)          # M_100 in float64
c100, s100 = torch.cos(100 * omega), torch.sin(100 * omega)
M100_f64 = torch.block_diag(*torch.stack([torch.stack([c100, -s100], -1), torch.stack([s100, c100], -1)], -2))
shift_err = {}
for name, table, M in [("float64, rounded to float32", pe_long, relative_position_matrix(100, 64)),
                       ("angles in float32", pe_table(500, 64, torch.float32), relative_position_matrix(100, 64)),
                       ("float64 throughout", pe_table(500, 64, torch.float64), M100_f64)]:
    shift_err[name] = (table[:400].double() @ M.double() - table[100:].double()).abs().max().item()
    print(f"k=100, {pad_to(name, 28)}: max |PE[pos] @ M_k - PE[pos+k]| = {shift_err[name]:.1e}")
glue("shift_err_rounded", shift_err["float64, rounded to float32"], display=False)
glue("shift_err_f32", shift_err["angles in float32"], display=False)
glue("shift_err_f64", shift_err["float64 throughout"], display=False)

# %% [markdown]
# The residuals are rounding errors: {glue:text}`shift_err_rounded:.0e` when the tables
# are computed in float64 and rounded to float32 at the end,
# {glue:text}`shift_err_f32:.0e` at these positions if the angles themselves are
# computed in float32, and {glue:text}`shift_err_f64:.0e` in float64 throughout.
#
# ### What the projections do to it
#
# In a real Transformer, though, the encoding is *added* to the token embedding $e$,
# and queries and keys are linear maps of the sum: $q_i = (e_i + PE_i) W_Q$,
# $k_j = (e_j + PE_j) W_K$. The score $q_i \cdot k_j$ splits into a token-token, two
# token-position and one position-position term,
#
# $$q_i \cdot k_j = e_i A e_j^\top + e_i A PE_j^\top + PE_i A e_j^\top
# + PE_i A PE_j^\top, \qquad A = W_Q W_K^\top \ (d_\text{model} \times d_\text{model}).$$
#
# It is tempting to say that the last term is a function of $i - j$, like
# $PE_i \cdot PE_j$. It is not, in general: the matrix $A$ sits between the two
# encodings. Write $u_i = (\sin \omega i, \cos \omega i)$ for one pair. If the block of
# $A$ for that pair has the form $\begin{bmatrix} a & -b \\ b & a \end{bmatrix}$ (a
# scaled rotation), then $u_i\,[\cdot]\,u_j^\top = a\cos\omega(i-j) - b\sin\omega(i-j)$,
# a function of $i - j$. Any other block brings in $\cos\omega(i + j)$, and any entry
# of $A$ that links two different pairs brings in angles such as
# $\omega_a i - \omega_b j$: both depend on where the two positions are, not only on
# their distance. So the term depends on $i - j$ alone only in special cases, such as
# $A = I$ or $A = M_k$.
#
# Let us measure it. For a matrix $S$ of shape $(n, n)$, take the share of its
# variance that the offset $i - j$ does *not* explain: replace every entry by the mean
# of its diagonal and compare the residual sum of squares with the total. It is 0 for
# a function of $i - j$ and 1 when the offset tells nothing. We compute it for
# $PE_i \cdot PE_j$, for $PE_i M_5 PE_j^\top$ (a special $A$), and for
# $PE_i W_Q W_K^\top PE_j^\top$ with random projections, as at the start of training
# ($d_\text{model} = 64$, $d_k = 16$, five draws), and with tied projections
# $W_Q = W_K$.

# %%
def unexplained_by_offset(S):
    """Share of the variance of S (n, n) that the offset i - j does not explain:
    0 when S[i, j] depends on i - j only, 1 when the offset explains nothing."""
    n = S.shape[0]
    diagonal = (torch.arange(n)[:, None] - torch.arange(n)[None, :] + n - 1).flatten()   # (n*n,): 0..2n-2
    sums = torch.zeros(2 * n - 1, dtype=S.dtype).index_add_(0, diagonal, S.flatten())
    counts = torch.bincount(diagonal, minlength=2 * n - 1).to(S.dtype)
    diagonal_mean = (sums / counts)[diagonal].view(n, n)                  # (n, n): mean of each diagonal
    return (((S - diagonal_mean) ** 2).sum() / ((S - S.mean()) ** 2).sum()).item()


d_pe, d_head, n_pe = 64, 16, 48
pe_n = sinusoidal_encoding(n_pe, d_pe).double()                          # (n, d_model)
S_pe = pe_n @ pe_n.T                                                     # PE_i . PE_j
S_shift = pe_n @ relative_position_matrix(5, d_pe).double() @ pe_n.T    # A = M_5
S_random, shares = None, []
for seed in range(5):
    g = torch.Generator().manual_seed(seed)
    W_Q = torch.randn(d_pe, d_head, generator=g, dtype=torch.float64) / math.sqrt(d_pe)   # (d_model, d_k)
    W_K = torch.randn(d_pe, d_head, generator=g, dtype=torch.float64) / math.sqrt(d_pe)
    S = (pe_n @ W_Q) @ (pe_n @ W_K).T                                    # PE_i W_Q W_K^T PE_j^T
    shares.append(unexplained_by_offset(S))
    S_random = S if S_random is None else S_random
S_tied = (pe_n @ W_Q) @ (pe_n @ W_Q).T                                   # W_K = W_Q
print(f"PE_i . PE_j                        : {unexplained_by_offset(S_pe):.1e}")
print(f"PE_i M_5 PE_j^T                    : {unexplained_by_offset(S_shift):.1e}")
print("PE_i W_Q W_K^T PE_j^T, random      : " + ", ".join(f"{v:.2f}" for v in shares))
print(f"PE_i W_Q W_Q^T PE_j^T, tied        : {unexplained_by_offset(S_tied):.2f}")
glue("unexplained_pe", unexplained_by_offset(S_pe), display=False)
glue("unexplained_shift", unexplained_by_offset(S_shift), display=False)
glue("unexplained_random_min", min(shares), display=False)
glue("unexplained_random_max", max(shares), display=False)
glue("unexplained_tied", unexplained_by_offset(S_tied), display=False)

# %% [tags=hide-input]
fig, axes = plt.subplots(1, 3, figsize=(12, 3.7))
for ax, S, title in [(axes[0], S_pe, r"$PE_i \cdot PE_j$"),
                     (axes[1], S_shift, r"$PE_i\, M_5\, PE_j^\top$"),
                     (axes[2], S_random, r"$PE_i\, W_Q W_K^\top PE_j^\top$ (random, seed 0)")]:
    im = ax.imshow(S, cmap="viridis")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(title + f"\nnot explained by i - j: {unexplained_by_offset(S):.2f}", fontsize=10)
    fig.colorbar(im, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# The first two matrices are constant along their diagonals (the share is
# {glue:text}`unexplained_pe:.0e` and {glue:text}`unexplained_shift:.0e`, rounding
# error). With random projections the offset explains little of the
# position-position term: between {glue:text}`unexplained_random_min:.2f` and
# {glue:text}`unexplained_random_max:.2f` of its variance is left over, depending on
# the draw, and still {glue:text}`unexplained_tied:.2f` with tied projections (a
# symmetric $A$ keeps the $\cos\omega(i-j)$ part of each block, but adds
# $\cos\omega(i+j)$ terms and mixes pairs). In the right picture the values change
# along every diagonal. A trained model *can* learn projections that keep the relative structure,
# or use the absolute positions instead; nothing forces either. RoPE, the next method,
# builds the relative structure into the score itself, after the projections.

# %% [markdown]
# ## 5. Rotary position embedding (RoPE)
#
# RoPE (Su et al., RoFormer, 2021) takes the rotations of the last section and applies
# them to the **queries and keys**, after their projections, instead of adding
# anything to the embeddings. The vector at position $p$ is cut into pairs
# $(x_{2i}, x_{2i+1})$, and pair $i$ is rotated by the angle $p\,\theta_i$ with
# $\theta_i = \text{base}^{-2i/d}$ (base 10000, as for the sinusoids):
#
# $$\begin{aligned}
# x'_{2i}   &= x_{2i} \cos(p\theta_i) - x_{2i+1} \sin(p\theta_i), \\
# x'_{2i+1} &= x_{2i} \sin(p\theta_i) + x_{2i+1} \cos(p\theta_i).
# \end{aligned}$$
#
# Write $R_p$ for this rotation as a matrix acting on row vectors, $x' = x R_p$. A
# rotation by $p\theta$ followed by the inverse of a rotation by $n\theta$ is a rotation
# by $(p - n)\theta$, so $R_p R_n^\top = R_{p-n}$, and the score of a query at position
# $m$ with a key at position $n$ is
#
# $$(q R_m) \cdot (k R_n) = q\, R_m R_n^\top\, k^\top = q\, R_{m-n}\, k^\top :$$
#
# it depends on the two vectors and on the distance $m - n$, and on nothing else.
# Absolute position has dropped out of the score; and unlike the sinusoidal dot
# product, $R_{m-n} \ne R_{n-m}$, so RoPE *can* tell before from after. (In fact
# $R_p$ is the transpose of the shift matrix of Section 4: `x[p] @ relative_position_matrix(p, d).T`.)
#
# Values are not rotated: positions only decide *where* to look, not what is passed on.
# In a multi-head layer RoPE is applied to every head's queries and keys, with
# $d = d_k$, which is why `apply_rope` accepts any leading dimensions `(..., N, d)`.
#
# Libraries differ in how they form the pairs. RoFormer, and this exercise, pair
# neighbouring features $(2i, 2i+1)$. The GPT-NeoX code, and LLaMA's code in Hugging
# Face Transformers, pair feature $i$ with feature $i + d/2$ ("rotate half"). Both work
# if used consistently, since they differ by a fixed permutation of the features;
# but the numbers differ, and weights trained with one layout give garbage with the
# other.
#
# ### Exercise: apply RoPE
#
# Rotate every pair of every position at once, for any number of leading dimensions
# (batch, heads), and return a new tensor. Compute the angles in the dtype of `x`, or
# in float64, so that a float64 input gets a float64-accurate result.
#
# :::{dropdown} Hint: the steps
# Take the even and odd features with `x[..., 0::2]` and `x[..., 1::2]` (each
# `(..., N, d/2)`), build the angles `(N, d/2)` from a column of positions
# `0, 1, ..., N-1` and a row of $\theta_i$, rotate with the two formulas above, and put
# the pairs back in their interleaved places (`torch.stack([...], dim=-1).flatten(-2)`
# does it). The angles `(N, d/2)` broadcast against `(..., N, d/2)` on their own.
# :::

# %% [exercise apply_rope]
def apply_rope(x, base=10000.0):
    """Rotary position embedding (RoFormer), interleaved pairs.

    Args:
        x: tensor of shape (..., N, d), d even. The position of x[..., p, :]
           is its index p = 0, 1, ..., N-1 along dimension -2.
        base: the base of the frequencies theta_i = base ** (-2i / d).

    For each position p and pair i = 0, ..., d/2 - 1, rotate the pair
    (x[..., p, 2i], x[..., p, 2i+1]) by the angle p * theta_i:
        out[..., p, 2i]     = x[..., p, 2i] * cos - x[..., p, 2i+1] * sin
        out[..., p, 2i + 1] = x[..., p, 2i] * sin + x[..., p, 2i+1] * cos
    Returns a new tensor of the same shape and dtype as x (x is unchanged).
    """
    ### BEGIN SOLUTION
    N, d = x.shape[-2], x.shape[-1]
    pos = torch.arange(N, dtype=torch.float64)[:, None]                       # (N, 1)
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)         # (d/2,)
    angles = pos * theta                                                      # (N, d/2)
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]                                # (..., N, d/2) each
    rotated = torch.stack([x_even * cos - x_odd * sin,
                           x_even * sin + x_odd * cos], dim=-1)               # (..., N, d/2, 2)
    return rotated.flatten(-2)                                                # (..., N, d)
    ### END SOLUTION


# %% [test test_apply_rope_values points=1]
"""Interleaved pairs rotated by p * theta_i (counter-clockwise); position 0 is unchanged."""
ro_x = torch.tensor([[1.0, 0.0, 1.0, 0.0],
                     [1.0, 0.0, 1.0, 0.0],
                     [0.0, 1.0, 0.0, 2.0]])             # (N=3, d=4)
ro = apply_rope(ro_x)
assert isinstance(ro, torch.Tensor) and ro.shape == (3, 4), f"apply_rope must keep the shape (3, 4), got {getattr(ro, 'shape', ro)}"
assert torch.allclose(ro[0], ro_x[0], atol=1e-6), "position 0 must be unchanged (angle 0): positions start at 0"
ro_expected1 = torch.tensor([math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)])
assert not torch.allclose(ro[1], torch.tensor([math.cos(1), -math.sin(1), math.cos(0.01), -math.sin(0.01)]), atol=1e-6), \
    "rotated the wrong way: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)"
assert not torch.allclose(ro[1], torch.tensor([math.cos(1), math.cos(0.01), math.sin(1), math.sin(0.01)]), atol=1e-6), \
    "half-split pairs (i, i + d/2): this exercise pairs neighbouring features (2i, 2i+1), as in RoFormer"
assert torch.allclose(ro[1], ro_expected1, atol=1e-6), \
    f"position 1 of [1, 0, 1, 0] should be [cos 1, sin 1, cos 0.01, sin 0.01] = {ro_expected1.tolist()}, got {ro[1].tolist()}"
ro_expected2 = torch.tensor([-math.sin(2), math.cos(2), -2 * math.sin(0.02), 2 * math.cos(0.02)])
assert torch.allclose(ro[2], ro_expected2, atol=1e-6), \
    f"position 2 of [0, 1, 0, 2] should be {ro_expected2.tolist()}, got {ro[2].tolist()}"
assert torch.equal(ro_x[1], torch.tensor([1.0, 0.0, 1.0, 0.0])), "apply_rope must not modify its input"

# %% [test test_apply_rope_batch_dims points=1]
"""Any leading dimensions (batch, heads); positions along dimension -2; the base argument is used."""
torch.manual_seed(0)
rb_x = torch.randn(2, 3, 5, 8)                          # (B, h, N, d)
rb = apply_rope(rb_x)
assert rb.shape == rb_x.shape and rb.dtype == rb_x.dtype, f"expected shape {tuple(rb_x.shape)}, got {tuple(rb.shape)}"
assert torch.allclose(rb[1, 2], apply_rope(rb_x[1, 2]), atol=1e-6), \
    "each (N, d) slice must be rotated on its own: positions are the index along dimension -2"
assert torch.allclose(rb.norm(dim=-1), rb_x.norm(dim=-1), atol=1e-5), "a rotation must not change the length of a vector"
rb_100 = apply_rope(rb_x, base=100.0)
rb_angle = 3 * 100.0 ** (-2 / 8)                        # position 3, pair 1
rb_pair = rb_x[0, 0, 3, 2:4]
assert torch.allclose(rb_100[0, 0, 3, 2:4], torch.stack([rb_pair[0] * math.cos(rb_angle) - rb_pair[1] * math.sin(rb_angle),
                                                          rb_pair[0] * math.sin(rb_angle) + rb_pair[1] * math.cos(rb_angle)]),
                      atol=1e-5), "with base=100, pair 1 at position 3 must be rotated by 3 * 100^(-2/8): use the base argument"

# %% [test test_apply_rope_relative points=1]
"""The score of a rotated query and key depends only on their distance (float64 input, to 1e-5)."""
torch.manual_seed(1)
rr_q, rr_k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
rr_Q = apply_rope(rr_q.expand(40, 16))                  # the same query at positions 0..39
rr_K = apply_rope(rr_k.expand(40, 16))                  # the same key at positions 0..39
assert rr_Q.dtype == torch.float64, f"a float64 input must give a float64 output, got {rr_Q.dtype}"
rr_S = rr_Q @ rr_K.T                                    # (40, 40): S[m, n] = score of query at m, key at n
for rr_off in (-7, 0, 3, 20):
    rr_diag = torch.diagonal(rr_S, offset=rr_off)
    assert torch.allclose(rr_diag, rr_diag[0].expand_as(rr_diag), atol=1e-5, rtol=0), \
        f"scores at distance {-rr_off} vary with the position (spread {(rr_diag.max() - rr_diag.min()).item():.2g}): " \
        "rotate pair i of the vector at position m by the angle m * theta_i"
assert not torch.allclose(torch.diagonal(rr_S, 3), torch.diagonal(rr_S, -3)[:1].expand(37), atol=1e-6), \
    "distance +3 and -3 give the same score: is the rotation applied at all?"

# %% [markdown]
# Let us see the relative property in a picture. We place one fixed query vector at
# every position $m$ and one fixed key vector at every position $n$ and draw the score
# $S_{mn}$. With RoPE it is constant along every diagonal: only $m - n$ matters. With
# the sinusoidal encoding *added* to the same two vectors, the score also depends on
# where the pair sits.

# %%
torch.manual_seed(0)
d, n_pos = 64, 48
q_vec, k_vec = torch.randn(d), torch.randn(d)
S_rope = apply_rope(q_vec.expand(n_pos, d)) @ apply_rope(k_vec.expand(n_pos, d)).T     # (n_pos, n_pos)
pe_d = sinusoidal_encoding(n_pos, d)
S_added = (q_vec + pe_d) @ (k_vec + pe_d).T                                             # (n_pos, n_pos)

def diagonal_spread(S):
    """Largest range of values along any diagonal (0 for a function of m - n)."""
    return max((torch.diagonal(S, o).max() - torch.diagonal(S, o).min()).item()
               for o in range(-S.shape[0] + 1, S.shape[0]))

print(f"RoPE:              spread along diagonals = {diagonal_spread(S_rope):.1e}  (float32 rounding)")
print(f"sinusoids, added:  spread along diagonals = {diagonal_spread(S_added):.1f}")
R5 = relative_position_matrix(5, d).double()
x_demo = torch.randn(8, d, dtype=torch.float64)
print("apply_rope(x)[5] == x[5] @ relative_position_matrix(5, d).T:",
      torch.allclose(apply_rope(x_demo)[5], x_demo[5] @ R5.T, atol=1e-6))

# %% [tags=hide-input]
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
for ax, S, title in [(axes[0], S_rope, "RoPE: $(qR_m)\\cdot(kR_n)$"),
                     (axes[1], S_added, "added sinusoids: $(q+PE_m)\\cdot(k+PE_n)$")]:
    im = ax.imshow(S, cmap="viridis")
    ax.set_xlabel("key position n")
    ax.set_ylabel("query position m")
    ax.set_title(title)
    fig.colorbar(im, ax=ax)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 6. ALiBi: a penalty on distance
#
# ALiBi (Press et al., "Train Short, Test Long", 2022) goes further and adds no
# position information to the tokens at all. Each head $h$ adds a fixed penalty to its
# attention scores, proportional to the distance between query and key:
#
# $$\mathrm{score}_h(i, j) = \frac{q_i \cdot k_j}{\sqrt{d_k}} - m_h \, \lvert i - j \rvert .$$
#
# The slopes $m_h$ are not learned. They form a geometric sequence,
# $m_h = 2^{-8(h+1)/H}$ for heads $h = 0, \dots, H-1$: with $H = 8$ heads they are
# $\tfrac12, \tfrac14, \dots, \tfrac1{256}$. The first head has the steepest penalty and
# attends locally; the last is almost flat and can look far. Because the bias depends
# only on $i - j$, there is nothing in it that was tuned to the training length.
#
# ALiBi was designed for causal language models, where a key is never to the right of
# its query and the bias is $-m_h (i - j)$ for $j \le i$. This course uses the
# symmetric form $-m_h \lvert i - j \rvert$, which also serves a bidirectional encoder;
# combined with a causal mask the two agree. On its own, the symmetric bias cannot tell
# left from right: in a causal model the mask supplies the direction. (For a number of
# heads that is not a power of two the paper interpolates the slopes differently; we
# keep the one formula above.)
#
# ### Exercise: the ALiBi bias
#
# Build the whole `(num_heads, n, n)` bias without a Python loop.
#
# :::{dropdown} Hint: two tensors and a broadcast
# Build the distance matrix `(n, n)` from `torch.arange(n)` by broadcasting a column
# against a row, and the slopes `(num_heads,)`, then multiply with broadcasting to
# `(num_heads, n, n)`.
# :::

# %% [exercise alibi_bias]
def alibi_bias(num_heads, n):
    """ALiBi attention bias.

    Returns a tensor of shape (num_heads, n, n), in torch's default dtype
    (float32), with
        bias[h, i, j] = -m_h * |i - j|,   m_h = 2 ** (-8 * (h + 1) / num_heads)
    for heads h = 0, ..., num_heads - 1 (so head 0 has the largest slope).
    It is added to the scores q.k / sqrt(d_k) of head h before the softmax.
    """
    ### BEGIN SOLUTION
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)  # (H,)
    pos = torch.arange(n, dtype=torch.float64)
    distance = (pos[:, None] - pos[None, :]).abs()                            # (n, n)
    return (-slopes[:, None, None] * distance).to(torch.get_default_dtype())  # (H, n, n)
    ### END SOLUTION


# %% [test test_alibi_bias_values points=1]
"""8 heads: slopes 1/2, 1/4, ..., 1/256 (head 0 steepest), bias = -slope * |i - j|."""
ab = alibi_bias(8, 4)
assert isinstance(ab, torch.Tensor) and ab.shape == (8, 4, 4), \
    f"alibi_bias(8, 4) should have shape (num_heads, n, n) = (8, 4, 4), got {getattr(ab, 'shape', ab)}"
assert ab.dtype == torch.get_default_dtype(), f"return torch's default dtype ({torch.get_default_dtype()}), got {ab.dtype}"
ab_slopes = -ab[:, 1, 0]
assert (ab <= 0).all(), "the bias must be a penalty: -m_h * |i - j| is never positive"
assert torch.allclose(ab, ab.transpose(-2, -1)), \
    "the bias must be symmetric: use the absolute distance |i - j|, not the signed i - j"
assert not torch.allclose(ab_slopes, torch.tensor([2.0 ** -(8 - h) for h in range(8)])), \
    "wrong slope order: head 0 has the largest slope 2^(-8/num_heads), the last head the smallest"
assert not torch.allclose(ab_slopes, torch.tensor([2.0 ** -h for h in range(8)])), \
    "slopes off by one: m_h = 2^(-8 (h + 1) / num_heads), so head 0 has slope 1/2 with 8 heads, not 1"
assert torch.allclose(ab_slopes, torch.tensor([2.0 ** -(h + 1) for h in range(8)])), \
    f"with 8 heads the slopes should be 1/2, 1/4, ..., 1/256; got {ab_slopes.tolist()}"
assert torch.allclose(ab[2], -0.125 * torch.tensor([[0., 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]])), \
    f"head 2 should be -1/8 * |i - j|; got\n{ab[2]}"

# %% [test test_alibi_bias_slopes points=1]
"""Any number of heads: m_h = 2^(-8 (h + 1) / num_heads)."""
for ab_h in (1, 4, 6, 12):
    ab_t = alibi_bias(ab_h, 3)
    assert ab_t.shape == (ab_h, 3, 3), f"alibi_bias({ab_h}, 3) should have shape ({ab_h}, 3, 3), got {tuple(ab_t.shape)}"
    ab_want = torch.tensor([2.0 ** (-8 * (h + 1) / ab_h) for h in range(ab_h)])
    assert torch.allclose(-ab_t[:, 0, 1], ab_want, rtol=1e-5), \
        f"with {ab_h} heads the slopes should be 2^(-8 (h + 1) / {ab_h}) = {[round(s, 4) for s in ab_want.tolist()]}; " \
        f"got {[round(s, 4) for s in (-ab_t[:, 0, 1]).tolist()]} (2^-(h+1) is right only for 8 heads)"

# %% [markdown]
# On its own, before any query or key is involved, the bias already shapes the
# attention: the softmax of one row of it is the "prior" of each head, how its weight
# would spread over the keys if all $q \cdot k$ scores were equal. Below, for the last
# query of a causal sequence of 64 tokens, each of 8 heads:

# %%
H, n = 8, 64
bias = alibi_bias(H, n)                                   # (H, n, n)
causal = torch.ones(n, n, dtype=torch.bool).tril()
prior = torch.softmax(bias.masked_fill(~causal, float("-inf")), dim=-1)[:, -1]   # (H, n): last query
distance_back = torch.arange(n - 1, -1, -1)               # key j is n-1-j tokens back
for h in range(H):
    mean_dist = (prior[h] * distance_back).sum().item()
    print(f"head {h}: slope 1/{2 ** (h + 1):<4d} weight on the query itself {prior[h, -1]:.3f},"
          f" mean distance looked back {mean_dist:5.1f}")

# %% [tags=hide-input]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
im = ax1.imshow(bias[0, :16, :16], cmap="viridis")
ax1.set_title("bias of head 0 (slope 1/2), first 16 positions")
ax1.set_xlabel("key j")
ax1.set_ylabel("query i")
fig.colorbar(im, ax=ax1)
for h in range(H):
    ax2.plot(distance_back, prior[h], label=f"head {h}")
ax2.set_xlabel("distance i - j")
ax2.set_ylabel("weight")
ax2.set_title("softmax of the bias alone (last query, causal)")
ax2.legend(fontsize=7, ncol=2)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. Longer than in training: a tiny extrapolation test
#
# A model that will read longer texts than it was trained on needs position
# information that still makes sense at unseen positions. Let us measure that on a task
# small enough to train in a couple of seconds per model.
#
# **Task: previous token.** A sequence of random tokens (vocabulary 16); at every
# position $i \ge 1$ the model must output the token at position $i - 1$. This is the
# job of the "previous-token heads" found in real language models (Olsson et al.,
# 2022), and it needs exact relative position and nothing else.
#
# **Model.** Token embedding, one causal multi-head attention layer (4 heads, $d_\text{model}
# = 32$), a linear read-out. Five versions differ only in how position enters:
#
# | method | where position enters |
# |---|---|
# | none | nowhere (only the causal mask) |
# | learned | a learned vector per position (a table of 128 rows) added to the embedding |
# | sinusoidal | `sinusoidal_encoding` added to the embedding |
# | RoPE | `apply_rope` on every head's queries and keys |
# | ALiBi | `alibi_bias` added to every head's scores |
#
# All are trained on sequences of **16** tokens and then tested on sequences of 128.

# %%
class TinyPositionModel(nn.Module):
    """Embedding -> one causal multi-head attention layer -> read-out, with a choice of position method."""

    def __init__(self, method, vocab=16, d_model=32, num_heads=4, max_len=128):
        super().__init__()
        self.method, self.num_heads = method, num_heads
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model) if method == "learned" else None
        self.qkv = nn.Linear(d_model, 3 * d_model)      # W_q, W_k, W_v side by side
        self.proj = nn.Linear(d_model, d_model)         # W_o
        self.out = nn.Linear(d_model, vocab)

    def forward(self, tokens):                          # tokens: (B, N)
        B, N = tokens.size()
        x = self.tok(tokens)                            # (B, N, C)
        C, H = x.size(-1), self.num_heads
        if self.method == "learned":
            x = x + self.pos.weight[:N]
        elif self.method == "sinusoidal":
            x = x + sinusoidal_encoding(N, C)
        q, k, v = self.qkv(x).split(C, dim=-1)          # (B, N, C) each
        q, k, v = (t.view(B, N, H, C // H).transpose(1, 2) for t in (q, k, v))   # (B, H, N, d)
        if self.method == "rope":
            q, k = apply_rope(q), apply_rope(k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(C // H)                    # (B, H, N, N)
        if self.method == "alibi":
            scores = scores + alibi_bias(H, N)
        causal = torch.ones(N, N, dtype=torch.bool, device=tokens.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(B, N, C)                      # (B, N, C)
        return self.out(self.proj(y))                   # (B, N, vocab)


def previous_token_batch(n, length, generator, vocab=16):
    tokens = torch.randint(0, vocab, (n, length), generator=generator)
    targets = tokens.roll(1, dims=1)
    targets[:, 0] = -100                                # position 0 has no previous token: ignored
    return tokens, targets


def train_position_model(method, train_len=16, steps=400, seed=0):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyPositionModel(method)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        tokens, targets = previous_token_batch(64, train_len, gen)
        loss = F.cross_entropy(model(tokens).reshape(-1, 16), targets.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


methods = ["none", "learned", "sinusoidal", "rope", "alibi"]
METHOD_TEXT = dict(none="none", learned="learned", sinusoidal="sinusoidal", rope="RoPE", alibi="ALiBi")
started = time.perf_counter()
position_models = {m: train_position_model(m) for m in methods}
print(f"trained {len(methods)} models in {time.perf_counter() - started:.1f} s")

test_tokens, test_targets = previous_token_batch(300, 128, torch.Generator().manual_seed(123))
correct = {}
with torch.no_grad():
    for m, model in position_models.items():
        correct[m] = (model(test_tokens).argmax(-1) == test_targets).float().mean(0)   # (128,) per position
ranges = [(1, 16), (16, 32), (32, 64), (64, 128)]
print(" ".join(f"{f'pos {a}-{b - 1}':>11}" for a, b in ranges) + "   method")   # names last: any width
for m in methods:
    print(" ".join(f"{correct[m][a:b].mean().item():11.2f}" for a, b in ranges) + f"   {METHOD_TEXT[m]}")

def mean_accuracy(method, a, b):
    return correct[method][a:b].mean().item()

glue("chance16", 1 / 16, display=False)
glue("none_inside", mean_accuracy("none", 1, 16), display=False)
glue("none_after", mean_accuracy("none", 16, 32), display=False)
glue("absolute_after", max(mean_accuracy(m, 16, 32) for m in ("learned", "sinusoidal")), display=False)
glue("rope_after", mean_accuracy("rope", 16, 32), display=False)
glue("rope_until", next((p for p in range(16, 128) if correct["rope"][p] < 0.9), 128), display=False)
glue("rope_long", mean_accuracy("rope", 64, 128), display=False)
glue("alibi_inside", mean_accuracy("alibi", 1, 16), display=False)
glue("alibi_long", mean_accuracy("alibi", 64, 128), display=False)
glue("others_long", max(mean_accuracy(m, 64, 128) for m in methods if m != "alibi"), display=False)

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(8, 3.8))
window = 4
for m in methods:
    smooth = F.avg_pool1d(correct[m][1:][None, None], window, stride=1)[0, 0]   # running mean over 4 positions
    ax.plot(torch.arange(1, 1 + smooth.numel()) + (window - 1) / 2, smooth, label=METHOD_TEXT[m])
ax.axvline(15.5, color="gray", ls="--")
ax.text(16.5, 0.05, "trained up to here", color="gray", fontsize=8)
ax.axhline(1 / 16, color="gray", ls=":", lw=1)
ax.set_xlabel("position in the test sequence")
ax.set_ylabel("accuracy (running mean of 4 positions)")
ax.set_ylim(0, 1.05)
ax.set_title("Previous-token task: trained on 16 tokens, tested on 128")
ax.legend(loc="center right", fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# What the table and the figure show (the seeds are fixed; other seeds give somewhat
# different numbers, but the same picture):
#
# - **None.** Without position information the model cannot find "the previous
#   token" at all, inside the training length or beyond it: an accuracy of
#   {glue:text}`none_inside:.2f` on positions 1 to 15. What it gets right comes from
#   the shortest prefixes, where there are only a handful of tokens to guess from, and
#   from chance ({glue:text}`chance16:.4f`, 1 in 16).
# - **Learned and sinusoidal.** Perfect on the first 16 positions, and right after
#   them no better than the model without positions (at most
#   {glue:text}`absolute_after:.2f` on positions 16 to 31, against
#   {glue:text}`none_after:.2f` without positions).
#   For the learned table this is no surprise: rows 16 to 127 were never trained. The
#   sinusoidal formula does define those positions, but the model never saw their
#   vectors, and what it learned about positions 0 to 15 does not carry over. "Defined
#   for every position" is not the same as "extrapolates".
# - **RoPE.** Right well beyond the training length: {glue:text}`rope_after:.2f` on
#   positions 16 to 31; the first position where it falls below 0.9 is
#   {glue:text}`rope_until:.0f`. The score depends only on the distance, and the
#   distance to the previous token is always 1. Further out it collapses as well
#   ({glue:text}`rope_long:.2f` on positions 64 to 127): a query now meets keys at
#   distances it never saw in training, and some of them happen to score as high as the
#   previous token. Real RoPE models behave similarly, and extending their context
#   takes extra tricks (interpolating the positions, or changing the base) and usually
#   some fine-tuning.
# - **ALiBi.** It never learns the task perfectly, not even inside the training
#   length ({glue:text}`alibi_inside:.2f` on positions 1 to 15). With 4 heads the
#   steepest slope is $\tfrac14$, so the bias prefers distance 1 over distance 2 by only
#   a quarter of a logit; the model makes up part of the difference from the tokens'
#   contents, but the more keys compete, the more often it picks a wrong one. Nothing
#   in it depends on the training length, though, and it degrades gently instead of
#   collapsing: {glue:text}`alibi_long:.2f` on positions 64 to 127, where no other
#   method does better than {glue:text}`others_long:.2f`.
#
# One tiny task cannot rank methods in general: language modelling rewards recency,
# which suits ALiBi, while tasks that need exact long-range positions favour other
# choices. The lesson that carries over is where position information lives.
# Anything tied to absolute positions (a learned table, an added sinusoid) is only
# reliable where training has been; information about *distances* (RoPE, ALiBi) can
# carry further, as far as the distances themselves have been seen or are harmless.
# Larger studies agree that the choice matters and that it depends on the task:
# Kazemnejad et al. (2023) even found decoder-only models *without* any positional
# encoding, relying on the causal mask alone, to generalise to longer inputs better than
# all of these methods on their reasoning tasks.

# %% [markdown]
# ## Check your understanding
#
# 1. A model has no positional encoding and no causal mask. Which outputs change when
#    you swap the first two tokens of its input, and how?
#
#    :::{dropdown} Answer
#    Only the first two outputs, and they swap places: self-attention is permutation
#    equivariant, so every token's output depends only on the token and on the *set*
#    of tokens around it. The other outputs do not change at all.
#    :::
#
# 2. With $d_\text{model} = 512$, what are the shortest and the longest wavelengths of
#    the sinusoidal encoding, and what is each good for?
#
#    :::{dropdown} Answer
#    Pair 0 has wavelength $2\pi \approx 6.3$ positions, pair 255 has
#    $2\pi \cdot 10000^{510/512} \approx 60{,}600$. The fast pairs tell neighbouring
#    positions apart; the slow ones change little between neighbours but tell positions
#    far apart from each other.
#    :::
#
# 3. $PE_i \cdot PE_j$ depends only on $i - j$. Does the attention score of a
#    Transformer with sinusoidal encodings depend only on $i - j$?
#
#    :::{dropdown} Answer
#    No. The score also contains the token-token and token-position terms, and even the
#    position-position term is $PE_i W_Q W_K^\top PE_j^\top$, which depends on $i - j$
#    alone only for special $W_Q W_K^\top$ (for instance block-diagonal scaled
#    rotations). Section 4 measured it: with random projections, most of its variance
#    is not explained by the offset. RoPE is built so that the score does depend only on
#    the two vectors and $i - j$.
#    :::

# %% [markdown]
# 4. Why does RoPE rotate the queries and keys but not the values?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_rope_not_values points=2]
# ### BEGIN SOLUTION
# **Model answer.** Position should decide *where* a query looks, and that is the job of
# the scores, which are computed from queries and keys only. With both rotated,
# $(q R_m) \cdot (k R_n) = q R_{m-n} k^\top$: only the distance $m - n$ enters the score.
# Rotating the values would change *what* is passed on according to the absolute position
# of each key, which is what the relative design avoids.
#
# **Rubric (2 points).**
#
# - 1 point: positions act through the scores (queries and keys), and rotating both makes
#   the score depend only on the relative offset $m - n$.
# - 1 point: rotating the values would bring the absolute position into what is passed on
#   (the output), which the relative design avoids; the values need no position for the
#   weights to use it.
# ### END SOLUTION

# %% [markdown]
# 5. With ALiBi and 16 heads, what are the steepest and the gentlest slopes? How much
#    does the steepest head penalise a key 10 tokens away, and what weight does that
#    leave compared with the query itself, other things equal?
#
#    :::{dropdown} Answer
#    $m_h = 2^{-8(h+1)/16} = 2^{-(h+1)/2}$: from $2^{-1/2} \approx 0.71$ for head 0 to
#    $2^{-8} = 1/256$ for head 15. Head 0 subtracts $10 \cdot 0.71 \approx 7.1$ from the
#    score at distance 10, so that key gets $e^{-7.1} \approx 0.0008$ times the
#    weight of the query's own position.
#    :::
#
# ## Challenges (optional, not graded)
#
# - **Rotate half.** GPT-NeoX and LLaMA's code in Hugging Face Transformers pair
#   feature $i$ with feature $i + d/2$ instead of $2i$ with $2i+1$. Write
#   `apply_rope_half(x)` with the `rotate_half` trick
#   (`torch.cat([-x2, x1], dim=-1)`), check that scores still depend only on distance,
#   and find the fixed permutation `P` of the features with
#   `apply_rope_half(x[..., P]) == apply_rope(x)[..., P]`. What goes wrong if you load
#   weights trained with one layout into a model using the other?
# - **A T5-style relative bias.** Instead of ALiBi's fixed slopes, learn one scalar per
#   head and per offset bucket, added to the scores (Raffel et al., 2020: exact buckets
#   for small offsets, logarithmic buckets up to a maximum distance). Add it as a sixth
#   method to Section 7. Does it learn the previous-token task perfectly, and how does
#   it extrapolate?
# - **Longer training, interpolated positions.** Train the RoPE model on 16 tokens and
#   test on 64 with the positions divided by 4 (position interpolation, Chen et al.,
#   2023), with and without a few steps of fine-tuning on 64 tokens.
# - **Causal ALiBi.** Replace the symmetric bias by the causal form $-m_h (i - j)$ for
#   $j \le i$ and check that, with a causal mask, the model of Section 7 computes
#   exactly the same thing.
#
# ## Summary
#
# - Self-attention is permutation equivariant: without position information,
#   "我爱你" and "你爱我" are the same set of vectors.
# - Absolute encodings add a vector per position to the embeddings. Learned tables are
#   flexible but stop at `max_len`; the sinusoidal table
#   $PE_{(pos,2i)} = \sin(pos\,\omega_i)$, $PE_{(pos,2i+1)} = \cos(pos\,\omega_i)$,
#   $\omega_i = 10000^{-2i/d_\text{model}}$, interleaves sines and cosines with
#   wavelengths from $2\pi$ to about $2\pi \cdot 10000$.
# - $PE_{pos} \cdot PE_{pos+k}$ depends only on $k$, and $PE_{pos+k} = PE_{pos} M_k$
#   with a block-diagonal rotation $M_k$ that does not depend on $pos$. Once the
#   encoding goes through the projections, though, the position-position term
#   $PE_i W_Q W_K^\top PE_j^\top$ is in general *not* a function of $i - j$.
# - RoPE applies such rotations to queries and keys, so that $q \cdot k$ depends only on
#   the two vectors and their distance. ALiBi adds $-m_h \lvert i - j \rvert$ to the
#   scores with fixed geometric slopes.
# - Trained on 16 tokens on a previous-token task, absolute methods fail right after
#   position 16; RoPE holds for a while, then fails; ALiBi never learns the task
#   perfectly but degrades gently.
#
# ## What's next
#
# Chapter 5 assembles the full Transformer of the original paper: token embeddings
# scaled by $\sqrt{d_\text{model}}$ plus the sinusoidal encoding you built here,
# multi-head attention from Chapter 3, feed-forward layers, residual connections and
# layer normalisation, in an encoder and a decoder.
#
# ## References
#
# - Vaswani, A., Shazeer, N., Parmar, N., Uszkoreit, J., Jones, L., Gomez, A. N.,
#   Kaiser, Ł. and Polosukhin, I. (2017). Attention Is All You Need. *Advances in
#   Neural Information Processing Systems 30*. <https://arxiv.org/abs/1706.03762>
# - Shaw, P., Uszkoreit, J. and Vaswani, A. (2018). Self-Attention with Relative
#   Position Representations. *NAACL 2018*. <https://arxiv.org/abs/1803.02155>
# - Raffel, C., Shazeer, N., Roberts, A., Lee, K., Narang, S., Matena, M., Zhou, Y.,
#   Li, W. and Liu, P. J. (2020). Exploring the Limits of Transfer Learning with a
#   Unified Text-to-Text Transformer. *Journal of Machine Learning Research* 21(140),
#   1–67. <https://arxiv.org/abs/1910.10683>
# - Su, J., Ahmed, M., Lu, Y., Pan, S., Bo, W. and Liu, Y. (2024). RoFormer: Enhanced
#   Transformer with Rotary Position Embedding. *Neurocomputing* 568, 127063 (preprint
#   2021). <https://arxiv.org/abs/2104.09864>
# - Press, O., Smith, N. A. and Lewis, M. (2022). Train Short, Test Long: Attention
#   with Linear Biases Enables Input Length Extrapolation. *ICLR 2022*.
#   <https://arxiv.org/abs/2108.12409>
# - Kazemnejad, A., Padhi, I., Natesan Ramamurthy, K., Das, P. and Reddy, S. (2023).
#   The Impact of Positional Encoding on Length Generalization in Transformers.
#   *Advances in Neural Information Processing Systems 36*.
#   <https://arxiv.org/abs/2305.19466>
# - Chen, S., Wong, S., Chen, L. and Tian, Y. (2023). Extending Context Window of
#   Large Language Models via Positional Interpolation. *arXiv:2306.15595*.
#   <https://arxiv.org/abs/2306.15595>
# - Black, S., Biderman, S., Hallahan, E., et al. (2022). GPT-NeoX-20B: An
#   Open-Source Autoregressive Language Model. *Proceedings of BigScience Episode #5,
#   Workshop on Challenges & Perspectives in Creating Large Language Models*.
#   <https://arxiv.org/abs/2204.06745>
# - Olsson, C., Elhage, N., Nanda, N., et al. (2022). In-context Learning and Induction
#   Heads (previous-token heads). *Transformer Circuits Thread*.
#   <https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/index.html>
# - Kazemnejad, A. (2019). Transformer Architecture: The Positional Encoding.
#   <https://kazemnejad.com/blog/transformer_architecture_positional_encoding/>
# - Rush, A. (2018). The Annotated Transformer. *Proceedings of Workshop for NLP Open
#   Source Software*. <https://nlp.seas.harvard.edu/annotated-transformer/>

# %% [hidden]
import math

import torch

import solutions.ch04_positional_encoding as ref
from autograder.hidden import HiddenTests, Mistake

hidden = HiddenTests(ref)


def _omega(d, freq="ok", dtype=torch.float64):
    """Frequencies of pairs i = 0..d/2-1 (freq names a common mistake)."""
    i = torch.arange(d // 2, dtype=dtype)
    exponent = {"ok": 2 * i / d, "pair_index": i / d, "four_i": 4 * i / d}[freq]
    return 10000.0 ** (-exponent)


def _pe(max_len, d, layout="interleaved", freq="ok", start=0, swap=False, multiply=False, own_index=False):
    pos = torch.arange(start, start + max_len, dtype=torch.float64)[:, None]
    if own_index:   # odd feature 2i+1 uses 10000^(-(2i+1)/d)
        col = torch.arange(d, dtype=torch.float64)
        ang = pos * 10000.0 ** (-col / d)
        pe = torch.where(col.long() % 2 == 0, torch.sin(ang), torch.cos(ang))
        return pe.to(torch.get_default_dtype())
    w = _omega(d, freq)
    ang = pos * (1 / w if multiply else w)
    s, c = torch.sin(ang), torch.cos(ang)
    if swap:
        s, c = c, s
    pe = torch.cat([s, c], dim=-1) if layout == "concat" else torch.stack([s, c], dim=-1).flatten(1)
    return pe.to(torch.get_default_dtype())


PE_MISTAKES = [
    Mistake("sin and cos concatenated ([sin, ..., sin, cos, ..., cos]): the paper interleaves them, "
            "sin on the even features 2i, cos on the odd features 2i+1", lambda L, d: _pe(L, d, layout="concat")),
    Mistake("sin and cos swapped: sine goes to the even features 2i, cosine to the odd features 2i+1",
            lambda L, d: _pe(L, d, swap=True)),
    Mistake("the odd feature 2i+1 must use the same frequency as feature 2i, 10000^(-2i/d_model), "
            "not 10000^(-(2i+1)/d_model)", lambda L, d: _pe(L, d, own_index=True)),
    Mistake("frequencies use 10000^(-i/d_model) with the pair index i: the exponent is 2i/d_model",
            lambda L, d: _pe(L, d, freq="pair_index")),
    Mistake("frequencies use 10000^(-4i/d_model): the exponent is 2i/d_model with i the pair index "
            "(that is, the even feature's index divided by d_model)", lambda L, d: _pe(L, d, freq="four_i")),
    Mistake("positions multiplied by 10000^(2i/d_model) instead of divided by it",
            lambda L, d: _pe(L, d, multiply=True)),
    Mistake("positions start at 1: the first row is position 0 (sin 0 = 0, cos 0 = 1)",
            lambda L, d: _pe(L, d, start=1)),
]


@hidden.test("test_sinusoidal_encoding_values")
def _(t):
    for L, d in [(3, 4), (6, 8), (10, 2)]:
        t.function("sinusoidal_encoding", L, d, mistakes=PE_MISTAKES, label=f"max_len={L}, d_model={d}")


@hidden.test("test_sinusoidal_encoding_shapes")
def _(t):
    for L, d in [(1, 2), (7, 6), (5, 10), (2, 32)]:
        t.function("sinusoidal_encoding", L, d, mistakes=PE_MISTAKES, label=f"max_len={L}, d_model={d}")


@hidden.test("test_sinusoidal_encoding_long")
def _(t):
    for L, d in [(64, 128), (48, 16), (40, 512)]:
        t.function("sinusoidal_encoding", L, d, mistakes=PE_MISTAKES, label=f"max_len={L}, d_model={d}")


# %% [hidden]
def _rel(k, d, transpose=False, layout="interleaved", freq="ok", use_k=True):
    w = _omega(d, freq)
    b = (k if use_k else 1) * w
    c, s = torch.cos(b), torch.sin(b)
    M = torch.zeros(d, d, dtype=torch.float64)
    even = torch.arange(d // 2) * 2 if layout == "interleaved" else torch.arange(d // 2)
    odd = even + 1 if layout == "interleaved" else even + d // 2
    M[even, even], M[even, odd], M[odd, even], M[odd, odd] = c, -s, s, c
    if transpose:
        M = M.T
    return M.to(torch.get_default_dtype())


REL_MISTAKES = [
    Mistake("blocks transposed: [[cos, sin], [-sin, cos]] is the matrix for column vectors (M @ pe), "
            "and shifts by -k here. With row vectors, pe[pos] @ M, block i is [[cos b, -sin b], [sin b, cos b]]",
            lambda k, d: _rel(k, d, transpose=True)),
    Mistake("blocks placed for a concatenated [sin..., cos...] layout (rows i and i + d_model/2): "
            "in the paper's interleaved layout pair i is features 2i, 2i+1",
            lambda k, d: _rel(k, d, layout="concat")),
    Mistake("blocks placed for a concatenated layout and transposed: pair i is features 2i, 2i+1 and, "
            "with row vectors, block i is [[cos b, -sin b], [sin b, cos b]]",
            lambda k, d: _rel(k, d, layout="concat", transpose=True)),
    Mistake("the angle must be b = k * omega_i: the offset k is missing",
            lambda k, d: _rel(k, d, use_k=False)),
    Mistake("frequencies use 10000^(-i/d_model) with the pair index i: the exponent is 2i/d_model",
            lambda k, d: _rel(k, d, freq="pair_index")),
]


def _shift_property(probe, M):
    """PE[pos + k] == PE[pos] @ M for every pos of a long float64 table."""
    if not isinstance(M, torch.Tensor) or not M.is_floating_point():
        return None
    k, d = probe.args
    angle = torch.arange(80 + abs(k), dtype=torch.float64)[:, None] * _omega(d)
    pe = torch.stack([torch.sin(angle), torch.cos(angle)], dim=-1).flatten(1)   # (80 + k, d)
    lhs = pe[:80] @ M.double()
    rhs = pe[k:k + 80]
    err = (lhs - rhs).abs().max().item()
    if not err < 1e-4:
        return (f"PE[pos] @ M differs from PE[pos + k] by up to {err:.2g} (k={k}, d_model={d}, "
                "pos = 0..79): the defining property does not hold")
    return None


REL = dict(mistakes=REL_MISTAKES, checks=[_shift_property], deps=("sinusoidal_encoding",))


@hidden.test("test_relative_position_matrix_values")
def _(t):
    for k, d in [(1, 4), (0, 6), (2, 8), (5, 10)]:
        t.function("relative_position_matrix", k, d, label=f"k={k}, d_model={d}", **REL)


@hidden.test("test_relative_position_matrix_every_pos")
def _(t):
    for k, d in [(3, 16), (10, 32), (25, 6), (7, 64)]:
        t.function("relative_position_matrix", k, d, label=f"k={k}, d_model={d}", **REL)


# %% [hidden]
def _rope(x, base=10000.0, layout="interleaved", direction=1, start=0, freq="ok", angle_dtype=None):
    N, d = x.shape[-2], x.shape[-1]
    i = torch.arange(d // 2, dtype=torch.float64)
    exponent = {"ok": 2 * i / d, "pair_index": i / d}[freq]
    theta = base ** (-exponent)
    ang = (torch.arange(start, start + N, dtype=torch.float64)[:, None] * theta) * direction
    if angle_dtype is not None:
        ang = ang.to(angle_dtype)
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    if layout == "interleaved":
        return torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([ra, rb], dim=-1)


ROPE_MISTAKES = [
    Mistake("half-split pairs (i, i + d/2), the GPT-NeoX / 'rotate half' layout: this exercise pairs "
            "neighbouring features (2i, 2i+1), as in RoFormer", lambda x, base=10000.0: _rope(x, base, layout="half")),
    Mistake("rotated the wrong way: (x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)",
            lambda x, base=10000.0: _rope(x, base, direction=-1)),
    Mistake("positions start at 1: the first position is 0 and is left unchanged",
            lambda x, base=10000.0: _rope(x, base, start=1)),
    Mistake("frequencies use base^(-i/d) with the pair index i: the exponent is 2i/d",
            lambda x, base=10000.0: _rope(x, base, freq="pair_index")),
    Mistake("the base argument is ignored: theta_i = base^(-2i/d)", lambda x, base=10000.0: _rope(x)),
]


# Tolerances follow the spec, which keeps the dtype but does not ask for float64 angles:
# angles computed in float32 (as most public implementations do) and applied to a float64
# input agree to float32 precision and earn full marks (see autograder.hidden.tolerance).
ROPE = dict(mistakes=ROPE_MISTAKES)


@hidden.test("test_apply_rope_values")
def _(t):
    t.function("apply_rope", t.randn(6, 4), label="x (6, 4)", **ROPE)
    t.function("apply_rope", t.randn(2, 9, 8), label="x (2, 9, 8)", **ROPE)
    t.function("apply_rope", t.randn(1, 12, 16), label="x (1, 12, 16)", **ROPE)


@hidden.test("test_apply_rope_batch_dims")
def _(t):
    t.function("apply_rope", t.randn(2, 3, 7, 8), label="x (B, h, N, d) = (2, 3, 7, 8)", **ROPE)
    t.function("apply_rope", t.randn(2, 5, 6), base=100.0, label="base=100", **ROPE)
    t.function("apply_rope", t.randn(3, 1, 4), label="a single position (N=1)", **ROPE)
    t.function("apply_rope", t.randn(2, 2, 2, 10, 2), base=500.0, label="d=2, three leading dims, base=500",
               **ROPE)


@hidden.test("test_apply_rope_relative")
def _(t):
    t.function("apply_rope", t.randn(2, 64, 16, dtype=torch.float64), grad=True,
               label="float64 x (2, 64, 16), gradients too", **ROPE)
    t.function("apply_rope", t.randn(200, 32, dtype=torch.float64), label="float64 x (200, 32)", **ROPE)


# %% [hidden]
def _alibi(H, n, slopes="ok", sign=-1, signed=False):
    h = torch.arange(H, dtype=torch.float64)
    m = {"ok": 2.0 ** (-8 * (h + 1) / H), "reversed": 2.0 ** (-8 * (H - h) / H),
         "off_by_one": 2.0 ** (-8 * h / H), "eight_heads_only": 2.0 ** (-(h + 1))}[slopes]
    pos = torch.arange(n, dtype=torch.float64)
    dist = pos[:, None] - pos[None, :]
    if not signed:
        dist = dist.abs()
    return (sign * m[:, None, None] * dist).to(torch.get_default_dtype())


ALIBI_MISTAKES = [
    Mistake("wrong slope order: head 0 has the largest slope 2^(-8/num_heads), the last head the smallest "
            "2^(-8)", lambda H, n: _alibi(H, n, slopes="reversed")),
    Mistake("slopes off by one: m_h = 2^(-8 (h + 1) / num_heads), so head 0's slope is 2^(-8/num_heads), not 1",
            lambda H, n: _alibi(H, n, slopes="off_by_one")),
    Mistake("slopes 2^-(h+1) are right only for 8 heads: use m_h = 2^(-8 (h + 1) / num_heads)",
            lambda H, n: _alibi(H, n, slopes="eight_heads_only")),
    Mistake("the bias must be a penalty: -m_h * |i - j| (the sign is missing)",
            lambda H, n: _alibi(H, n, sign=1)),
    Mistake("use the absolute distance |i - j|: the bias is symmetric",
            lambda H, n: _alibi(H, n, signed=True)),
    Mistake("use the absolute distance |i - j|: the bias is symmetric",
            lambda H, n: _alibi(H, n, sign=1, signed=True)),
]


@hidden.test("test_alibi_bias_values")
def _(t):
    for H, n in [(8, 5), (4, 6), (2, 3)]:
        t.function("alibi_bias", H, n, mistakes=ALIBI_MISTAKES, label=f"num_heads={H}, n={n}")


@hidden.test("test_alibi_bias_slopes")
def _(t):
    for H, n in [(1, 4), (6, 7), (12, 3), (16, 2), (3, 1)]:
        t.function("alibi_bias", H, n, mistakes=ALIBI_MISTAKES, label=f"num_heads={H}, n={n}")
