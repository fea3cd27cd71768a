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
# which ones still work on sequences longer than those they were trained on.
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
# **What you will build.**
#
# | exercise | what it does |
# |---|---|
# | `sinusoidal_encoding(max_len, d_model)` | the `(max_len, d_model)` table of the original Transformer, sin and cos interleaved |
# | `relative_position_matrix(k, d_model)` | the matrix $M_k$ with $PE_{pos+k} = PE_{pos} M_k$ |
# | `apply_rope(x, base=10000.0)` | rotate each feature pair of `x (..., N, d)` by an angle proportional to its position |
# | `alibi_bias(num_heads, n)` | the `(num_heads, n, n)` distance penalty $-m_h\,\lvert i - j\rvert$ |

# %% [export]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# %%
import time

import matplotlib.pyplot as plt

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)   # the tensors in this chapter are tiny: one CPU thread is fastest

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
#   positions $i$ and $j$ depend on the offset $i - j$. RoPE (LLaMA, Mistral, Qwen and
#   most recent open models) and ALiBi (BLOOM, MPT) are two ways to do it.

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
    print("position 16:", type(err).__name__, "-", err)

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
# Build the angle table `pos * omega_i` of shape `(max_len, d_model / 2)` by
# broadcasting a column of positions against a row of frequencies, then fill the even
# columns with its sine and the odd columns with its cosine (slices `0::2` and `1::2`,
# or `torch.stack(..., dim=-1)` followed by a flatten). Computing the angles in float64
# and converting at the end costs nothing and keeps the table accurate at large
# positions.

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

# %% [markdown]
# The residuals are float32 rounding errors: about $10^{-7}$ when the tables are
# computed in float64 and rounded at the end, and up to about $10^{-5}$ at these
# positions if the angles themselves are computed in float32. In float64 throughout
# they would be about $10^{-13}$.
#
# In a real Transformer, though, the encoding is *added* to the token embedding, and
# queries and keys are linear maps of the sum. The score $q_i \cdot k_j$ then mixes
# token-token, token-position and position-position terms, and only the last is a
# clean function of $i - j$. Whether the model makes use of the rotation structure is
# left to training. The next method builds it into the score directly.

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
# Take the even and odd features with `x[..., 0::2]` and `x[..., 1::2]` (each
# `(..., N, d/2)`), build the angles `(N, d/2)` from a column of positions
# `0, 1, ..., N-1` and a row of $\theta_i$, rotate, and put the pairs back in their
# interleaved places (`torch.stack([...], dim=-1).flatten(-2)` does it). Compute the
# angles in the dtype of `x`, or in float64, so that a float64 input gets a float64-accurate
# result.

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
# Build the distance matrix `(n, n)` from `torch.arange(n)` by broadcasting a column
# against a row, and the slopes `(num_heads,)`, then multiply with broadcasting to
# `(num_heads, n, n)`.

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
# job of the "previous-token heads" found in real language models, and it needs exact
# relative position and nothing else.
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
started = time.perf_counter()
position_models = {m: train_position_model(m) for m in methods}
print(f"trained {len(methods)} models in {time.perf_counter() - started:.1f} s")

test_tokens, test_targets = previous_token_batch(300, 128, torch.Generator().manual_seed(123))
correct = {}
with torch.no_grad():
    for m, model in position_models.items():
        correct[m] = (model(test_tokens).argmax(-1) == test_targets).float().mean(0)   # (128,) per position
ranges = [(1, 16), (16, 32), (32, 64), (64, 128)]
print(f"{'method':>11} " + " ".join(f"{f'pos {a}-{b - 1}':>11}" for a, b in ranges))
for m in methods:
    print(f"{m:>11} " + " ".join(f"{correct[m][a:b].mean().item():11.2f}" for a, b in ranges))

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(8, 3.8))
window = 4
for m in methods:
    smooth = F.avg_pool1d(correct[m][1:][None, None], window, stride=1)[0, 0]   # running mean over 4 positions
    ax.plot(torch.arange(1, 1 + smooth.numel()) + (window - 1) / 2, smooth, label=m)
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
# What the table and the figure show (the exact numbers vary a little from run to run):
#
# - **None.** Without position information the model cannot find "the previous
#   token" at all, inside the training length or beyond it. What it gets right comes
#   from the shortest prefixes, where there are only a handful of tokens to guess
#   from, and from chance (1 in 16).
# - **Learned and sinusoidal.** Perfect on the first 16 positions and at chance level
#   right after them. For the learned table this is no surprise: rows 16 to 127 were
#   never trained. The sinusoidal formula does define those positions, but the model
#   never saw their vectors, and what it learned about positions 0 to 15 does not carry
#   over. "Defined for every position" is not the same as "extrapolates".
# - **RoPE.** Perfect well beyond the training length (in our run, up to about twice
#   that length), because the score depends only on the distance, and the distance to
#   the previous token is always 1. Further out, it collapses as well: a query now meets keys at distances it never saw in training,
#   and some of them happen to score as high as the previous token. Real RoPE models
#   behave similarly, and extending their context takes extra tricks (interpolating the
#   positions, or changing the base) and usually some fine-tuning.
# - **ALiBi.** It never learns the task perfectly, not even inside the training
#   length. With 4 heads the steepest slope is $\tfrac14$, so the bias prefers distance
#   1 over distance 2 by only a quarter of a logit; the model makes up part of the
#   difference from the tokens' contents, but the more keys compete, the more often it
#   picks a wrong one. Nothing in it depends on the training length, though, and it
#   degrades gently instead of collapsing: in our run it levels off a little above 0.5
#   and ends up far ahead of every other method on the longest sequences.
#
# One tiny task cannot rank methods in general: language modelling rewards recency,
# which suits ALiBi, while tasks that need exact long-range positions favour other
# choices. The lesson that carries over is where position information lives.
# Anything tied to absolute positions (a learned table, an added sinusoid) is only
# reliable where training has been; information about *distances* (RoPE, ALiBi) can
# carry further, as far as the distances themselves have been seen or are harmless.

# %% [markdown]
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
#   with a block-diagonal rotation $M_k$ that does not depend on $pos$.
# - RoPE applies such rotations to queries and keys, so that $q \cdot k$ depends only on
#   the two vectors and their distance. ALiBi adds $-m_h \lvert i - j \rvert$ to the
#   scores with fixed geometric slopes.
# - Trained on 16 tokens, absolute methods fail right after position 16; RoPE holds
#   for a while, then fails; ALiBi degrades gently.
#
# ## What's next
#
# Chapter 5 assembles the full Transformer of the original paper: token embeddings
# scaled by $\sqrt{d_\text{model}}$ plus the sinusoidal encoding you built here,
# multi-head attention from Chapter 3, feed-forward layers, residual connections and
# layer normalisation, in an encoder and a decoder.

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
