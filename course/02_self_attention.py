# %% [markdown]
# # Chapter 2: Queries, keys and values
#
# In Chapter 1 attention was an add-on: a recurrent decoder looked back at the
# states of a recurrent encoder. In this chapter we take away the recurrence and keep
# only the attention. Every token of a sequence looks at every other token of the same
# sequence, decides how relevant each one is, and builds its new representation as a
# weighted blend of what it finds. This operation, *scaled dot-product
# self-attention*, is the core of every Transformer.
#
# **Learning goals.** After this chapter you can
#
# - explain queries, keys and values as a soft, differentiable dictionary lookup, and
#   give the shape of every tensor involved;
# - compute self-attention by hand for a tiny example, and with one line of tensor
#   algebra for a whole batch: $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$;
# - show by measurement why the scores are divided by $\sqrt{d_k}$;
# - build padding and causal (look-ahead) masks, combine them, and know what each one
#   protects against;
# - tell self-attention from cross-attention, show that self-attention ignores the
#   order of its inputs, and count what it costs as the sequence grows.
#
# **Prerequisites.** Chapter 1 (alignment scores, the masked softmax, the dot score and
# the idea of a context as a weighted average). PyTorch tensors: matrix products with
# `@`, broadcasting, `nn.Linear`. A little probability: mean and variance of a sum of
# independent variables.
#
# **Time.** About 2 hours: an hour for reading and the four exercises, the rest for the
# experiments and the questions. The whole notebook runs on a laptop CPU in well under
# a minute.
#
# **What you will build.** Four small pieces, each checked by tests:
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `scaled_dot_product_attention(query, key, value, mask=None)` | the attention formula over any batch dimensions, with an optional mask | ★★ | 4 |
# | `causal_mask(n)` | the look-ahead mask of a decoder | ★ | 1 |
# | `padding_mask(lengths, max_len)` | which positions of a padded batch are real tokens | ★ | 1 |
# | `SelfAttention(d_model, d_k, d_v)` | a layer that projects its input to queries, keys and values and attends | ★★ | 4 |

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

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# ## 1. Attention as a soft dictionary lookup
#
# A Python dictionary answers a query by *exact match*: it finds the one key equal to
# the query and returns that key's value. Attention relaxes all three parts of this.
#
# 1. The query is compared with **every** key, and each comparison yields a real-valued
#    score $s_j = \mathrm{score}(q, k_j)$ instead of a yes or no. Here the score is a
#    dot product: large when $q$ and $k_j$ point the same way.
# 2. A softmax turns the scores into weights that are positive and sum to one:
#
#    $$\alpha_j = \frac{\exp(s_j)}{\sum_{j'} \exp(s_{j'})}.$$
#
# 3. The answer is a **blend** of all values, each in proportion to its weight:
#
#    $$\mathrm{out}(q) = \sum_j \alpha_j\, v_j .$$
#
# If one score dwarfs the others, the weights become one-hot and we are back to an
# ordinary lookup. Otherwise the lookup is soft, and, unlike an exact match, every step
# is differentiable, so the network can learn what to look for.
#
# **Where do queries, keys and values come from?** In *self*-attention, from the
# sequence itself. Stack the $N$ token vectors of a sequence as the rows of a matrix
# $X \in \mathbb{R}^{N \times d_\text{model}}$. Three learned matrices give every token
# three roles:
#
# $$Q = X W^Q, \qquad K = X W^K, \qquad V = X W^V,$$
#
# | tensor | shape | row $i$ means |
# |---|---|---|
# | $X$ | $N \times d_\text{model}$ | token $i$ as it enters the layer |
# | $W^Q,\ W^K$ | $d_\text{model} \times d_k$ | (learned) |
# | $W^V$ | $d_\text{model} \times d_v$ | (learned) |
# | $Q$ | $N \times d_k$ | what token $i$ is looking for |
# | $K$ | $N \times d_k$ | what token $i$ offers to be matched on |
# | $V$ | $N \times d_v$ | what token $i$ hands over when it is chosen |
#
# Queries and keys are compared with each other, so they must share the width $d_k$.
# Values are only blended, so their width $d_v$ is free.
#
# Why three matrices and not simply $X X^\top$ as the scores? Two reasons. First,
# $x_i \cdot x_j$ is symmetric, but relevance is not: the pronoun "it" needs to find its
# noun, while the noun has no need to find "it". With separate $W^Q$ and $W^K$,
# $q_i \cdot k_j \neq q_j \cdot k_i$ in general. Second, $x_i \cdot x_i = \|x_i\|^2$ tends
# to be the largest score in its row, so every token would mostly look at itself.
# Separate projections let the model learn which features matter for matching (keys)
# and which for passing on (values).
#
# The whole computation, which Sections 2 to 5 build step by step, fits in one picture:
# three projections, one matrix of scores, an optional mask, a softmax over each row,
# and a weighted sum of the values. The shapes are those of one sequence of $N$ tokens;
# a batch adds a leading dimension $B$ everywhere.

# %% [tags=hide-input]
QKV_TEXT = dict(
    title="Scaled dot-product self-attention, one sequence",
    x="X\n(N, $d_{model}$)",
    wq="$W^Q$", wk="$W^K$", wv="$W^V$",
    q="Q = X$W^Q$\n(N, $d_k$)", k="K = X$W^K$\n(N, $d_k$)", v="V = X$W^V$\n(N, $d_v$)",
    scores="scores $QK^\\top / \\sqrt{d_k}$\n(N, N)",
    mask="mask: $-\\infty$ where not allowed\n(N, N), optional",
    softmax="softmax over each row\nweights A  (N, N), rows sum to 1",
    out="output A V\n(N, $d_v$)",
    transpose="$K^\\top$",
)


def draw_self_attention_diagram(text=QKV_TEXT):
    fig, ax = plt.subplots(figsize=(10, 4.2))
    ax.set_xlim(0, 10.4)
    ax.set_ylim(0.35, 4.95)
    ax.axis("off")
    colors = dict(io="#dcdcdc", proj="#f4c2c2", qkv="#c9d7f2", attn="#f6d8a8", mask="#eeeeee",
                  out="#bfe3c0")

    def box(x, y, w, h, label, color, size=9, ls="-"):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                    fc=color, ec="black", lw=0.8, ls=ls))
        ax.text(x, y, label, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, label=None, color="black"):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=11,
                                     color=color, lw=1.0))
        if label:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, label, ha="center", va="bottom", fontsize=9)

    ys = dict(q=4.2, k=2.6, v=1.0)
    box(0.8, 2.6, 1.3, 0.8, text["x"], colors["io"])
    for name in ("q", "k", "v"):
        y = ys[name]
        arrow(1.5, 2.6, 2.7, y, label=None)
        ax.text(2.05, (2.6 + y) / 2 + (0.15 if y >= 2.6 else -0.15), text["w" + name], ha="center",
                va="center", fontsize=9, bbox=dict(fc=colors["proj"], ec="black", lw=0.6,
                                                   boxstyle="round,pad=0.2"))
        box(3.45, y, 1.5, 0.75, text[name], colors["qkv"])
    box(5.6, 3.4, 2.2, 0.75, text["scores"], colors["attn"])
    arrow(4.2, ys["q"], 4.5, 3.55)
    arrow(4.2, ys["k"], 4.5, 3.25)
    ax.text(4.5, 2.9, text["transpose"], fontsize=8.5, ha="left", va="top")
    box(5.6, 2.0, 2.6, 0.75, text["mask"], colors["mask"], size=8.5, ls="--")
    arrow(5.6, 2.38, 5.6, 3.02)
    box(8.3, 3.4, 2.6, 0.75, text["softmax"], colors["attn"], size=8.5)
    arrow(6.7, 3.4, 7.0, 3.4)
    box(8.3, 1.0, 1.8, 0.75, text["out"], colors["out"])
    arrow(8.3, 3.02, 8.3, 1.38)
    arrow(4.2, ys["v"], 7.4, 1.0)
    ax.set_title(text["title"], fontsize=11)
    return fig


draw_self_attention_diagram()
plt.show()

# %% [markdown]
# ## 2. A worked example by hand: "Thinking Machines"
#
# The two-word sentence "Thinking Machines" is the running example of Jay Alammar's
# *The Illustrated Transformer* (2018), which draws the vectors as coloured boxes. Here
# we give it numbers. Take a two-token sequence with $d_\text{model} = d_k = d_v = 4$:
#
# $$x_1 = [1, 0, 1, 0] \ \text{("Thinking")}, \qquad x_2 = [0, 2, 0, 2] \ \text{("Machines")},$$
#
# and these (made-up) projection matrices:
#
# $$
# W^Q = \begin{bmatrix} 1&0&1&0\\ 0&1&0&1\\ 1&0&0&1\\ 0&1&1&0 \end{bmatrix},\quad
# W^K = \begin{bmatrix} 0&1&1&0\\ 1&0&0&1\\ 0&0&1&1\\ 1&1&0&0 \end{bmatrix},\quad
# W^V = \begin{bmatrix} 1&1&0&0\\ 0&1&1&0\\ 0&0&1&1\\ 1&0&0&1 \end{bmatrix}.
# $$
#
# Tokens are row vectors, so a projection is a row times a matrix: $q_i = x_i W^Q$.
# Since $x_1$ has ones in positions 1 and 3, $q_1$ is the sum of rows 1 and 3 of $W^Q$;
# since $x_2$ has twos in positions 2 and 4, $q_2$ is twice the sum of rows 2 and 4.
#
# **Step 1: queries, keys and values.**

# %%
X = torch.tensor([[1., 0., 1., 0.],    # x1, "Thinking"
                  [0., 2., 0., 2.]])   # x2, "Machines"
W_Q = torch.tensor([[1., 0., 1., 0.],
                    [0., 1., 0., 1.],
                    [1., 0., 0., 1.],
                    [0., 1., 1., 0.]])
W_K = torch.tensor([[0., 1., 1., 0.],
                    [1., 0., 0., 1.],
                    [0., 0., 1., 1.],
                    [1., 1., 0., 0.]])
W_V = torch.tensor([[1., 1., 0., 0.],
                    [0., 1., 1., 0.],
                    [0., 0., 1., 1.],
                    [1., 0., 0., 1.]])

Q = X @ W_Q  # (2, 4): row i is q_i
K = X @ W_K  # (2, 4): row i is k_i
V = X @ W_V  # (2, 4): row i is v_i
for i in range(2):
    print(f"q{i+1} = {Q[i].tolist()}   k{i+1} = {K[i].tolist()}   v{i+1} = {V[i].tolist()}")

# %% [markdown]
# **Step 2: scores.** The query of "Thinking" is compared with both keys by a dot
# product: $s_{1j} = q_1 \cdot k_j$.

# %%
s11 = torch.dot(Q[0], K[0])  # 2*0 + 0*1 + 1*2 + 1*1
s12 = torch.dot(Q[0], K[1])  # 2*4 + 0*2 + 1*0 + 1*2
print(f"q1.k1 = {s11.item():g}   q1.k2 = {s12.item():g}")

# %% [markdown]
# **Step 3: scale, then softmax.** Divide by $\sqrt{d_k} = \sqrt{4} = 2$ (Section 4
# explains why), then normalise.

# %%
d_k = K.shape[-1]
scaled = torch.stack([s11, s12]) / math.sqrt(d_k)
alpha1 = torch.softmax(scaled, dim=-1)
print("scaled scores:", scaled.tolist())
print("weights      :", [round(a, 4) for a in alpha1.tolist()])
glue("tm_a11", alpha1[0].item(), display=False)
glue("tm_a12", alpha1[1].item(), display=False)
glue("tm_a12_pct", 100 * alpha1[1].item(), display=False)

# %% [markdown]
# "Thinking" puts {glue:text}`tm_a12_pct:.0f`% of its attention on "Machines": its query lines up much
# better with $k_2$ than with its own key.
#
# **Step 4: blend the values.** $z_1 = \alpha_{11} v_1 + \alpha_{12} v_2$.

# %%
z1 = alpha1[0] * V[0] + alpha1[1] * V[1]
print("z1 =", z1)

# %% [markdown]
# ```{admonition} A widely copied version of this example has wrong numbers
# :class: warning
# Numeric versions of the "Thinking Machines" example circulate in online tutorials.
# One of them uses exactly the matrices above but prints different intermediate values.
# Every one of them can be checked in a line of code, and several do not follow from
# the matrices. The table compares that tutorial's values with ours; the cell after it
# checks the claims that follow.
# ```
#
# | quantity | tutorial | recomputed |
# |---|---|---|
# | $q_1$ | $[2, 0, 2, 0]$ | $[2, 0, 1, 1]$ |
# | $k_1$ | $[0, 2, 2, 0]$ | $[0, 1, 2, 1]$ |
# | $q_2$ | $[0, 4, 0, 4]$ | $[0, 4, 2, 2]$ |
# | $k_2$ | $[4, 0, 4, 0]$ | $[4, 2, 0, 2]$ |
# | $v_1,\ v_2$ | $[1,1,1,1],\ [2,2,2,2]$ | same |
# | $q_1\cdot k_1,\ q_1 \cdot k_2$ | $4,\ 16$ | $3,\ 10$ |
# | scaled | $2,\ 8$ | $1.5,\ 5$ |
# | softmax | $[0.012, 0.988]$ | [{glue:text}`tm_a11:.3f`, {glue:text}`tm_a12:.3f`] |
# | $z_1$ | $\approx [1.97, 1.97, 1.97, 1.97]$ | $\approx [1.97, 1.97, 1.97, 1.97]$ |
#
# The tutorial's softmax is also off on its own terms: $\mathrm{softmax}([2, 8])$ is
# about [{glue:text}`sm28_lo:.4f`, {glue:text}`sm28_hi:.4f`], not $[0.012, 0.988]$. And
# its final $z_1$ agrees with ours only by coincidence. Because $v_2 = 2 v_1$, every
# component of $z_1$ equals $\alpha_{11} + 2\alpha_{12} = 1 + \alpha_{12}$, so $z_1$ is
# fixed by a single weight. The tutorial's weights would give $1.988$ (or
# {glue:text}`sm28_z:.4f` with its softmax done right); {glue:text}`tm_z1:.2f` is what
# the *correct* weight $\alpha_{12} \approx$ {glue:text}`tm_a12:.3f` gives. The cell
# below checks each of these claims.

# %%
print("softmax([2, 8])          =", torch.softmax(torch.tensor([2., 8.]), dim=-1))
print("0.012*v1 + 0.988*v2      =", 0.012 * V[0] + 0.988 * V[1])
print("1 + alpha_12 (recomputed) =", 1 + alpha1[1].item())
sm28 = torch.softmax(torch.tensor([2., 8.]), dim=-1)
glue("sm28_lo", sm28[0].item(), display=False)
glue("sm28_hi", sm28[1].item(), display=False)
glue("sm28_z", 1 + sm28[1].item(), display=False)
glue("tm_z1", 1 + alpha1[1].item(), display=False)

# %% [markdown]
# Worked examples in tutorials, slides and even papers contain slips like these. Checking
# them with a few lines of code is a habit worth keeping.
#
# ### All queries at once: the matrix form
#
# Doing step 2 for every query and every key is one matrix product: entry $(i, j)$ of
# $QK^\top$ is $q_i \cdot k_j$. The softmax is applied to each row (each query) and the
# blend of step 4 is another matrix product:
#
# $$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V .$$
#
# | step | result | shape |
# |---|---|---|
# | $S = QK^\top / \sqrt{d_k}$ | scores | $N_q \times N_k$ |
# | $A = \mathrm{softmax}(S)$, row by row | weights; row $i$ sums to 1 | $N_q \times N_k$ |
# | $Z = A V$ | outputs; row $i$ is $\sum_j A_{ij} v_j$ | $N_q \times d_v$ |
#
# We write $N_q$ and $N_k$ separately: nothing in the formula requires as many queries
# as keys. In self-attention $N_q = N_k = N$; in cross-attention (Section 6) they differ.
# For our example:

# %%
S = Q @ K.T / math.sqrt(d_k)        # (2, 2) scaled scores
A = torch.softmax(S, dim=-1)        # (2, 2) weights, rows sum to 1
Z = A @ V                           # (2, 4) outputs
print("scores:\n", S, "\nweights:\n", A, "\noutputs:\n", Z)
glue("tm_a21", A[1, 0].item(), display=False)
glue("tm_a22", A[1, 1].item(), display=False)
glue("tm_z2", Z[1, 0].item(), display=False)

# %% [markdown]
# Row 1 reproduces $z_1$. Row 2 is the new "Machines": its scores are $q_2 \cdot k_1 = 10$
# and $q_2 \cdot k_2 = 12$, scaled to $5$ and $6$, giving weights of about
# [{glue:text}`tm_a21:.2f`, {glue:text}`tm_a22:.2f`], and every component of $z_2$ is
# about {glue:text}`tm_z2:.2f`.

# %% [markdown]
# ## 3. Exercise: scaled dot-product attention
#
# Now write the formula as a function that works on whole batches. Real inputs carry
# extra leading dimensions, for the batch and later (Chapter 3) for attention heads, so
# the function takes `query (..., N_q, d_k)`, `key (..., N_k, d_k)` and
# `value (..., N_k, d_v)`, and must work for any number of leading dimensions, including
# none.
#
# The optional `mask` says which keys each query may look at; Section 5 is all about
# it. The convention is that of PyTorch's own `F.scaled_dot_product_attention`:
# **True means "may attend"**. Where the mask is False, the score is replaced by
# $-\infty$ before the softmax, so its weight $e^{-\infty}$ is exactly 0 and the
# remaining weights still sum to 1, exactly as in Chapter 1's `masked_softmax`. The
# mask only needs to *broadcast* to `(..., N_q, N_k)`: an `(N_q, N_k)` mask applies to
# every batch element, a `(B, 1, N_k)` mask to every query of its batch element.
#
# :::{dropdown} Hint: the PyTorch calls
# - `torch.matmul` (the `@` operator) multiplies the last two dimensions and broadcasts
#   all the others, so `query @ key.transpose(-2, -1)` has shape `(..., N_q, N_k)`
#   (`key.T` would reverse *all* dimensions of a batched tensor);
# - `scores.masked_fill(~mask, float("-inf"))` fills the forbidden scores and, unlike
#   `masked_fill_` with an underscore, returns a new tensor instead of overwriting one;
# - `torch.softmax(scores, dim=-1)` normalises over the last dimension, the keys;
# - `weights @ value` has shape `(..., N_q, d_v)`.
# :::

# %% [exercise scaled_dot_product_attention]
def scaled_dot_product_attention(query, key, value, mask=None):
    """Scaled dot-product attention: softmax(query @ key^T / sqrt(d_k)) @ value.

    Args:
        query: tensor of shape (..., N_q, d_k).
        key:   tensor of shape (..., N_k, d_k).
        value: tensor of shape (..., N_k, d_v).
        mask:  optional bool tensor that broadcasts to (..., N_q, N_k).
               True means the query MAY attend to that key. Where the mask is
               False, set the score to float("-inf") (or a large negative
               number) BEFORE the softmax, so that its weight becomes 0.

    The leading dimensions "..." can be any number of batch dimensions
    (including none). d_k is the size of the last dimension of `query`. The
    softmax runs over the last dimension of the scores (the keys), so every
    row of the weights sums to 1.

    Returns:
        (output, weights), where
        output:  (..., N_q, d_v), row i is the weighted sum of the value rows;
        weights: (..., N_q, N_k), the attention weights after the softmax.

    Do not modify the inputs in place, keep their dtype (float64 in gives
    float64 out), and do not call F.scaled_dot_product_attention.
    """
    ### BEGIN SOLUTION
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))     # (..., N_q, N_k)
    weights = torch.softmax(scores, dim=-1)                   # (..., N_q, N_k)
    output = weights @ value                                  # (..., N_q, d_v)
    return output, weights
    ### END SOLUTION


# %% [test test_scaled_dot_product_attention_worked_example points=1]
"""Reproduces the "Thinking Machines" example: weights softmax([[1.5, 5], [5, 6]])."""
tm_x = torch.tensor([[1., 0., 1., 0.], [0., 2., 0., 2.]])
tm_wq = torch.tensor([[1., 0., 1., 0.], [0., 1., 0., 1.], [1., 0., 0., 1.], [0., 1., 1., 0.]])
tm_wk = torch.tensor([[0., 1., 1., 0.], [1., 0., 0., 1.], [0., 0., 1., 1.], [1., 1., 0., 0.]])
tm_wv = torch.tensor([[1., 1., 0., 0.], [0., 1., 1., 0.], [0., 0., 1., 1.], [1., 0., 0., 1.]])
tm_out, tm_w = scaled_dot_product_attention(tm_x @ tm_wq, tm_x @ tm_wk, tm_x @ tm_wv)

tm_expected_w = torch.softmax(torch.tensor([[1.5, 5.0], [5.0, 6.0]]), dim=-1)
tm_unscaled_w = torch.softmax(torch.tensor([[3.0, 10.0], [10.0, 12.0]]), dim=-1)
tm_by_dk_w = torch.softmax(torch.tensor([[0.75, 2.5], [2.5, 3.0]]), dim=-1)

assert tm_w.shape == (2, 2), f"weights should have shape (N_q, N_k) = (2, 2), got {tuple(tm_w.shape)}"
assert not torch.allclose(tm_w, tm_unscaled_w, atol=1e-5), \
    "scores not scaled by 1/sqrt(d_k): divide query @ key^T by sqrt(d_k) = 2 before the softmax"
assert not torch.allclose(tm_w, tm_by_dk_w, atol=1e-5), \
    "scores divided by d_k = 4 instead of sqrt(d_k) = 2"
assert torch.allclose(tm_w.sum(-1), torch.ones(2), atol=1e-5), \
    "weights rows do not sum to 1: did you take the softmax over the last dimension (the keys)?"
assert torch.allclose(tm_w, tm_expected_w, atol=1e-5), \
    f"weights should be softmax([[1.5, 5], [5, 6]]) =\n{tm_expected_w}\nbut got\n{tm_w}"
assert torch.allclose(tm_out, tm_expected_w @ (tm_x @ tm_wv), atol=1e-5), \
    "weights are right but the output is not weights @ value"
assert torch.allclose(tm_out[0], torch.full((4,), 1.9707), atol=1e-4), \
    "z1 should be about [1.97, 1.97, 1.97, 1.97]"
print("worked example reproduced: z1 =", [round(t, 4) for t in tm_out[0].tolist()])

# %% [test test_scaled_dot_product_attention_shapes points=1]
"""Shapes and dtype: leading batch dims, N_q != N_k, d_k != d_v, float64 kept."""
torch.manual_seed(0)
sh_q = torch.randn(2, 3, 5, 4, dtype=torch.float64)   # (..., N_q=5, d_k=4)
sh_k = torch.randn(2, 3, 7, 4, dtype=torch.float64)   # (..., N_k=7, d_k=4)
sh_v = torch.randn(2, 3, 7, 6, dtype=torch.float64)   # (..., N_k=7, d_v=6)
sh_out, sh_w = scaled_dot_product_attention(sh_q, sh_k, sh_v)
assert sh_w.shape == (2, 3, 5, 7), \
    f"weights should be (..., N_q, N_k) = (2, 3, 5, 7), got {tuple(sh_w.shape)}: transpose only the last two dims of key"
assert sh_out.shape == (2, 3, 5, 6), \
    f"output should be (..., N_q, d_v) = (2, 3, 5, 6), got {tuple(sh_out.shape)}"
assert sh_out.dtype == torch.float64 and sh_w.dtype == torch.float64, \
    f"dtype changed (got {sh_out.dtype}, {sh_w.dtype}): do not convert to float32; keep the input dtype"
sh_out2, sh_w2 = scaled_dot_product_attention(sh_q[0, 0], sh_k[0, 0], sh_v[0, 0])
assert sh_out2.shape == (5, 6) and sh_w2.shape == (5, 7), \
    "with no batch dimensions, (N_q, d_k), (N_k, d_k), (N_k, d_v) inputs must also work: use key.transpose(-2, -1), not key.T"

# %% [test test_scaled_dot_product_attention_values points=1]
"""Values: random inputs match torch's F.scaled_dot_product_attention; rows sum to 1; inputs untouched."""
torch.manual_seed(1)
va_q = torch.randn(3, 6, 8)
va_k = torch.randn(3, 9, 8)
va_v = torch.randn(3, 9, 5)
va_copies = [t.clone() for t in (va_q, va_k, va_v)]
va_out, va_w = scaled_dot_product_attention(va_q, va_k, va_v)
assert all(torch.equal(a, b) for a, b in zip((va_q, va_k, va_v), va_copies)), \
    "an input was modified in place: use out-of-place operations (masked_fill, not masked_fill_)"
assert torch.allclose(va_w.sum(-1), torch.ones(3, 6), atol=1e-5), \
    "weights rows do not sum to 1: did you take the softmax over the last dimension (the keys)?"
assert (va_w >= 0).all(), "weights must be non-negative: apply a softmax to the scores"
va_ref = F.scaled_dot_product_attention(va_q, va_k, va_v)
va_ref_w = torch.softmax(va_q @ va_k.transpose(-2, -1) / math.sqrt(8), dim=-1)
assert torch.allclose(va_w, va_ref_w, atol=1e-5), \
    "weights differ from softmax(q k^T / sqrt(d_k)): check the scale (1/sqrt of the query's last dim) and the transpose of key"
assert torch.allclose(va_out, va_ref, atol=1e-5), \
    "weights are right but the output differs from F.scaled_dot_product_attention: the output must be weights @ value"

# %% [test test_scaled_dot_product_attention_mask points=1]
"""Masks: False entries get exactly zero weight, causal and (B, 1, N_k) padding masks broadcast."""
torch.manual_seed(2)
ma_q = torch.randn(2, 5, 4)
ma_k = torch.randn(2, 5, 4)
ma_v = torch.randn(2, 5, 3)

# causal: (N, N) mask, broadcast over the batch
ma_causal = torch.ones(5, 5, dtype=torch.bool).tril()
ma_causal_copy = ma_causal.clone()
ma_out, ma_w = scaled_dot_product_attention(ma_q, ma_k, ma_v, mask=ma_causal)
assert torch.equal(ma_causal, ma_causal_copy), "the mask was modified in place"
assert not torch.isnan(ma_w).any(), \
    "NaN weights: some row had no allowed key. Is the mask polarity inverted? True means MAY attend"
assert (ma_w[:, ~ma_causal] == 0).all(), \
    "masked (False) positions must get exactly 0 weight: fill their scores with -inf before the softmax (True means MAY attend)"
assert (ma_w[:, ma_causal] > 0).all(), \
    "an allowed (True) position got 0 weight: mask polarity inverted? True means MAY attend"
assert torch.allclose(ma_w.sum(-1), torch.ones(2, 5), atol=1e-5), \
    "masked rows must still sum to 1: mask the scores BEFORE the softmax, not the weights after it"
assert torch.allclose(ma_out, F.scaled_dot_product_attention(ma_q, ma_k, ma_v, attn_mask=ma_causal), atol=1e-5), \
    "output with a causal mask differs from F.scaled_dot_product_attention(..., attn_mask=mask)"

# padding: (B, 1, N_k) mask, broadcast over the queries; batch element 1 has 2 real keys
ma_pad = (torch.arange(5) < torch.tensor([5, 2])[:, None]).unsqueeze(1)  # (2, 1, 5)
ma_out, ma_w = scaled_dot_product_attention(ma_q, ma_k, ma_v, mask=ma_pad)
assert ma_w.shape == (2, 5, 5), f"a (B, 1, N_k) mask must broadcast to (B, N_q, N_k); weights have shape {tuple(ma_w.shape)}"
assert (ma_w[1, :, 2:] == 0).all(), "padded keys (mask False) must get exactly 0 weight"
assert torch.allclose(ma_out, F.scaled_dot_product_attention(ma_q, ma_k, ma_v, attn_mask=ma_pad), atol=1e-5), \
    "output with a (B, 1, N_k) padding mask differs from F.scaled_dot_product_attention(..., attn_mask=mask)"

# %% [markdown]
# With your function in hand, the worked example becomes a single call. The heatmap
# shows the weight matrix $A$: row $i$ is how query $i$ spreads its attention over the
# keys.

# %%
Z_fn, A_fn = scaled_dot_product_attention(X @ W_Q, X @ W_K, X @ W_V)
print("outputs:\n", Z_fn)
print("matches the step-by-step result:", torch.allclose(Z_fn, Z) and torch.allclose(A_fn, A))

# %% [tags=hide-input]
tokens = ["Thinking", "Machines"]
fig, ax = plt.subplots(figsize=(4.2, 3.4))
im = ax.imshow(A_fn, cmap="viridis", vmin=0, vmax=1)
for i in range(2):
    for j in range(2):
        ax.text(j, i, f"{A_fn[i, j]:.3f}", ha="center", va="center",
                color="black" if A_fn[i, j] > 0.5 else "white")
ax.set_xticks(range(2), tokens)
ax.set_yticks(range(2), tokens)
ax.set_xlabel("key (attended to)")
ax.set_ylabel("query (attending)")
ax.set_title("Worked example: weights")
fig.colorbar(im, ax=ax, label="weight")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 4. Why divide by $\sqrt{d_k}$?
#
# Suppose the components of $q$ and $k$ are independent with mean 0 and variance 1.
# (This is the convenient case for the algebra, not exactly what a freshly initialised
# layer gives: part (a) ends by measuring that, and by showing why the conclusion does
# not depend on it.) Each product $q_i k_i$ then has mean 0 and variance
# $\mathbb{E}[q_i^2]\,\mathbb{E}[k_i^2] = 1$, and the $d_k$ products are independent, so
#
# $$\mathbb{E}[q \cdot k] = 0, \qquad \mathrm{Var}[q \cdot k] = \sum_{i=1}^{d_k} \mathrm{Var}[q_i k_i] = d_k .$$
#
# The typical size of a raw score grows like $\sqrt{d_k}$; dividing by $\sqrt{d_k}$
# brings its variance back to 1 whatever the width. Let us check the claim, and then
# see why the size of the scores matters at all.
#
# **(a) Variance of the dot product.** We draw 20,000 random pairs per width.

# %%
torch.manual_seed(0)
dims = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
var_raw, var_scaled = [], []
for d in dims:
    q = torch.randn(20_000, d)
    k = torch.randn(20_000, d)
    dot = (q * k).sum(-1)                        # (20000,) one score per pair
    var_raw.append(dot.var().item())
    var_scaled.append((dot / math.sqrt(d)).var().item())
for d, vr, vs in zip(dims, var_raw, var_scaled):
    print(f"d_k={d:5d}   Var[q.k] = {vr:8.1f}   Var[q.k/sqrt(d_k)] = {vs:.3f}")

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5, 3.8))
ax.loglog(dims, var_raw, "o", label=r"measured Var$[q\cdot k]$")
ax.loglog(dims, dims, "-", color="gray", label=r"theory: $d_k$")
ax.loglog(dims, var_scaled, "s", label=r"measured Var$[q\cdot k/\sqrt{d_k}]$")
ax.set_xlabel(r"$d_k$")
ax.set_ylabel("variance of the score")
ax.set_title("Raw dot products grow with the width")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The measurements sit on the line $\mathrm{Var} = d_k$, and the scaled scores stay at
# variance 1.
#
# **What an initialised layer gives.** Layer normalisation (Chapter 5) does hand the
# attention layer token vectors whose features have mean 0 and variance 1. But
# `nn.Linear`'s default initialisation draws each weight uniformly from
# $[-1/\sqrt{d_\text{model}},\ 1/\sqrt{d_\text{model}}]$, a variance of
# $1/(3\, d_\text{model})$. A component of $q = x W^Q$ sums $d_\text{model}$ such
# products, so its variance is about $d_\text{model} \cdot 1/(3\, d_\text{model}) = 1/3$,
# not 1, and the same holds for $k$. We measure it for $d_\text{model} = 512$ and
# $d_k = 64$, pairing the query of each token with the key of another.

# %%
torch.manual_seed(0)
tokens = F.layer_norm(torch.randn(4096, 512), (512,))       # (4096, d_model): each token mean 0, variance 1
init_W_q, init_W_k = nn.Linear(512, 64), nn.Linear(512, 64)  # PyTorch's default initialisation
with torch.no_grad():
    q0, k0 = init_W_q(tokens), init_W_k(tokens)              # (4096, d_k = 64)
    score0 = (q0 * k0.roll(1, dims=0)).sum(-1) / math.sqrt(64)   # (4096,) scaled scores of distinct pairs
print(f"variance of the input features   {tokens.var().item():.3f}")
print(f"variance of the query components {q0.var().item():.3f}")
print(f"variance of the key components   {k0.var().item():.3f}")
print(f"variance of q.k / sqrt(d_k)      {score0.var().item():.3f}")
glue("init_var_q", q0.var().item(), display=False)
glue("init_var_k", k0.var().item(), display=False)
glue("init_score_var", score0.var().item(), display=False)

# %% [markdown]
# The query and key components have variances of {glue:text}`init_var_q:.3f` and
# {glue:text}`init_var_k:.3f`, and the scaled scores {glue:text}`init_score_var:.3f`,
# close to $(1/3)^2 = 1/9$. The argument needs only the general rule: with component
# variances $\sigma_q^2$ and $\sigma_k^2$,
# $\mathrm{Var}[q \cdot k] = d_k\, \sigma_q^2 \sigma_k^2$. The constant changes with the
# initialisation; the growth in proportion to $d_k$ does not, and dividing by
# $\sqrt{d_k}$ removes it whatever the constant. (At initialisation the scaled scores are
# even smaller than 1, so the softmax starts out flatter; training then grows or shrinks
# $W^Q$ and $W^K$ as it needs.)
#
# **(b) Large scores saturate the softmax.** The softmax does not care about adding a
# constant to all scores, but it does care about *multiplying* them: a factor $c$ acts
# like an inverse temperature, and as $c$ grows the softmax turns into an argmax. Raw
# scores of standard deviation $\sqrt{d_k}$ are such a factor. We measure, for one query
# against $N = 16$ random keys, the largest weight and the entropy of the weight row
# (its maximum, for 16 keys, is $\ln 16 \approx 2.77$, reached by uniform weights).

# %%
torch.manual_seed(0)
n_keys, n_trials = 16, 2_000
sat_dims = [4, 16, 64, 256, 1024]
stats = {"raw": {"max": [], "entropy": [], "jac": []},
         "scaled": {"max": [], "entropy": [], "jac": []}}
for d in sat_dims:
    q = torch.randn(n_trials, 1, d)
    k = torch.randn(n_trials, n_keys, d)
    s = (q @ k.transpose(-2, -1)).squeeze(1)             # (trials, 16) raw scores
    for name, z in [("raw", s), ("scaled", s / math.sqrt(d))]:
        p = torch.softmax(z, dim=-1)                     # (trials, 16)
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
        # Jacobian of the softmax: dp_i/dz_j = p_i (delta_ij - p_j)
        jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]   # (trials, 16, 16)
        stats[name]["max"].append(p.max(-1).values.mean().item())
        stats[name]["entropy"].append(entropy.mean().item())
        stats[name]["jac"].append(torch.linalg.matrix_norm(jac).mean().item())
print("          mean max weight     mean entropy     mean Jacobian norm")
print("            raw   scaled         raw  scaled         raw  scaled")
for i, d in enumerate(sat_dims):
    print(f"d_k={d:5d}  {stats['raw']['max'][i]:.3f}   {stats['scaled']['max'][i]:.3f}"
          f"        {stats['raw']['entropy'][i]:.2f}   {stats['scaled']['entropy'][i]:.2f}"
          f"        {stats['raw']['jac'][i]:.3f}   {stats['scaled']['jac'][i]:.3f}")
glue("sat_raw_max", stats["raw"]["max"][-1], display=False)
glue("sat_raw_entropy", stats["raw"]["entropy"][-1], display=False)
glue("sat_scaled_max", stats["scaled"]["max"][-1], display=False)
glue("sat_jac_ratio", stats["scaled"]["jac"][-1] / stats["raw"]["jac"][-1], display=False)

# %% [tags=hide-input]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
for name, marker in [("raw", "o-"), ("scaled", "s-")]:
    label = r"$q\cdot k$" if name == "raw" else r"$q\cdot k/\sqrt{d_k}$"
    ax1.semilogx(sat_dims, stats[name]["max"], marker, label=label)
    ax2.semilogx(sat_dims, stats[name]["entropy"], marker, label=label)
ax1.axhline(1 / n_keys, color="gray", ls=":", label="uniform (1/16)")
ax2.axhline(math.log(n_keys), color="gray", ls=":", label=r"uniform ($\ln 16$)")
ax1.set_xlabel(r"$d_k$"); ax1.set_ylabel("mean largest weight"); ax1.set_ylim(0, 1.05)
ax2.set_xlabel(r"$d_k$"); ax2.set_ylabel("mean entropy (nats)")
ax1.set_title("Softmax saturation"); ax2.set_title("Entropy of the weights")
ax1.legend(); ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Without scaling the attention collapses onto a single key as $d_k$ grows: at
# $d_k = 1024$ the largest weight averages {glue:text}`sat_raw_max:.3f` and the entropy
# is {glue:text}`sat_raw_entropy:.2f` nats, close to 0. With scaling, the distribution
# looks the same at every width (largest weight {glue:text}`sat_scaled_max:.3f` at
# $d_k = 1024$).
#
# **(c) Saturation kills the gradient.** Training adjusts the scores through the
# softmax's Jacobian, $\partial p_i / \partial z_j = p_i(\delta_{ij} - p_j)$. For a
# one-hot $p$ every entry of this matrix is 0: whatever the loss wants, almost no
# gradient reaches $q$ and $k$. We plot its (Frobenius) norm, measured in the same
# experiment.

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5, 3.8))
ax.loglog(sat_dims, stats["raw"]["jac"], "o-", label=r"softmax of $q\cdot k$")
ax.loglog(sat_dims, stats["scaled"]["jac"], "s-", label=r"softmax of $q\cdot k/\sqrt{d_k}$")
ax.set_xlabel(r"$d_k$")
ax.set_ylabel(r"mean $\|\partial p / \partial z\|_F$")
ax.set_title("Size of the softmax Jacobian")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# At $d_k = 4$ the raw scores are still small (standard deviation 2) and both curves
# start at the same level. From there the unscaled Jacobian shrinks steadily with the
# width: at $d_k = 1024$ it is {glue:text}`sat_jac_ratio:.1f` times smaller than the
# scaled one in the table above, and that average hides many rows where it is
# essentially zero. Scaled, it stays constant. That is the whole argument of the
# original Transformer paper for the factor $1/\sqrt{d_k}$: it keeps the softmax in the
# region where it still has a useful gradient, independently of $d_k$. The model can
# still learn sharper or flatter attention later, by growing or shrinking the norms of
# $W^Q$ and $W^K$; the scale only fixes a sensible starting point.
#
# ```{note}
# Chapter 1's dot-product (Luong) score had no scaling. With small hidden sizes that
# works; with the widths of modern models it would start training with saturated,
# nearly gradient-free attention.
# ```

# %% [markdown]
# ## 5. Masks: who may look at whom
#
# Left alone, every query attends to every key. Two situations forbid some pairs.
#
# **Padding.** Sentences in a batch have different lengths, but a tensor needs one
# length, so short sequences are filled up with a padding token. Those positions are not
# words, and no query should take information from them. A padding mask marks, for each
# sequence, which key positions exist. For lengths $[6, 4]$ and `max_len = 6`:
#
# $$\text{mask} = \begin{bmatrix} 1&1&1&1&1&1 \\ 1&1&1&1&0&0 \end{bmatrix} \quad (B \times N_k).$$
#
# **Look-ahead (causal).** A decoder that generates text one token at a time is trained
# on whole sentences at once. If position $i$ could attend to position $i+1$, it could
# simply read the word it is supposed to predict. The causal mask allows query $i$ to
# see keys $j \le i$ only: True on and below the diagonal,
#
# $$\text{mask}_{ij} = [\, j \le i \,] \quad (N \times N).$$
#
# In both cases the rule from Section 3 does the work: where the mask is False the score
# becomes $-\infty$, the weight becomes exactly 0, and the softmax renormalises the
# allowed weights to sum to 1. Zeroing weights *after* the softmax would not do that:
# the rows would no longer sum to 1.
#
# ### Exercise: the causal mask
#
# Write the look-ahead mask for a sequence of length $n$: a boolean $n \times n$ matrix,
# True where $j \le i$.
#
# :::{dropdown} Hint: a lower triangle
# `torch.tril` keeps the lower triangle (diagonal included) of a matrix;
# `torch.ones(n, n, dtype=torch.bool)` is a good matrix to start from.
# :::

# %% [exercise causal_mask]
def causal_mask(n):
    """Look-ahead mask for a sequence of length n.

    Returns a bool tensor of shape (n, n) whose entry [i, j] is True when
    query position i may attend to key position j, that is when j <= i:
    True on and below the diagonal, False above it.
    """
    ### BEGIN SOLUTION
    return torch.tril(torch.ones(n, n, dtype=torch.bool))  # (n, n)
    ### END SOLUTION


# %% [test test_causal_mask points=1]
"""causal_mask(n) is (n, n) bool, True on and below the diagonal."""
cm = causal_mask(4)
cm_expected = torch.tensor([[1, 0, 0, 0],
                            [1, 1, 0, 0],
                            [1, 1, 1, 0],
                            [1, 1, 1, 1]], dtype=torch.bool)
assert isinstance(cm, torch.Tensor), "causal_mask must return a torch tensor"
assert cm.dtype == torch.bool, f"the mask must have dtype torch.bool, got {cm.dtype}"
assert cm.shape == (4, 4), f"causal_mask(4) must have shape (4, 4), got {tuple(cm.shape)}"
assert not torch.equal(cm, ~cm_expected), \
    "mask polarity inverted: True means MAY attend, so True goes on and below the diagonal"
assert not torch.equal(cm, cm_expected.T), \
    "True is above the diagonal: query i may see keys j <= i, so use the lower triangle (tril), not triu"
assert not torch.equal(cm, cm_expected.tril(-1)), \
    "the diagonal is False: a token may attend to itself, so the diagonal must be True"
assert torch.equal(cm, cm_expected), f"causal_mask(4) should be\n{cm_expected}\ngot\n{cm}"
assert torch.equal(causal_mask(1), torch.ones(1, 1, dtype=torch.bool)), "causal_mask(1) should be [[True]]"
assert torch.equal(causal_mask(7), torch.ones(7, 7).tril().bool()), "causal_mask(7) is wrong"

# %% [markdown]
# ### Exercise: the padding mask
#
# Given the true length of every sequence of a batch, mark the real tokens: position
# $j$ of sequence $b$ is real when $j < \text{lengths}[b]$ (positions count from 0).
# One comparison, without a loop, does it.
#
# :::{dropdown} Hint: broadcasting a comparison
# Compare a row of positions `torch.arange(max_len)` with a column of lengths: with
# shapes `(1, max_len)` and `(B, 1)`, the comparison `<` broadcasts to `(B, max_len)`.
# :::

# %% [exercise padding_mask]
def padding_mask(lengths, max_len):
    """Key padding mask for a batch of padded sequences.

    Args:
        lengths: tensor of shape (B,) holding the true length of each sequence.
        max_len: the padded length N.

    Returns a bool tensor of shape (B, max_len) whose entry [b, j] is True
    when position j is a real token of sequence b, that is when
    j < lengths[b], and False at the padding positions.
    """
    ### BEGIN SOLUTION
    lengths = torch.as_tensor(lengths)
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]               # (B, max_len)
    ### END SOLUTION


# %% [test test_padding_mask points=1]
"""padding_mask(lengths, max_len) is (B, max_len) bool, True at positions < length."""
pm = padding_mask(torch.tensor([3, 1, 4, 0]), 4)
pm_expected = torch.tensor([[1, 1, 1, 0],
                            [1, 0, 0, 0],
                            [1, 1, 1, 1],
                            [0, 0, 0, 0]], dtype=torch.bool)
assert isinstance(pm, torch.Tensor), "padding_mask must return a torch tensor"
assert pm.dtype == torch.bool, f"the mask must have dtype torch.bool, got {pm.dtype}"
assert pm.shape == (4, 4), f"expected shape (B, max_len) = (4, 4), got {tuple(pm.shape)}"
assert not torch.equal(pm, ~pm_expected), \
    "mask polarity inverted: True marks the REAL tokens (positions that may be attended to), False the padding"
assert not torch.equal(pm, torch.arange(4)[None, :] <= torch.tensor([3, 1, 4, 0])[:, None]), \
    "off by one: position j is real when j < length (positions count from 0), not j <= length"
assert torch.equal(pm, pm_expected), f"padding_mask([3, 1, 4, 0], 4) should be\n{pm_expected}\ngot\n{pm}"
pm2 = padding_mask(torch.tensor([2, 5]), 6)
assert pm2.shape == (2, 6), \
    f"padding_mask([2, 5], 6) should have shape (B, max_len) = (2, 6), got {tuple(pm2.shape)}: is it transposed?"
assert torch.equal(pm2, torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)), \
    "padding_mask([2, 5], 6) is wrong"

# %% [markdown]
# ### Combining masks and broadcasting
#
# A decoder over a padded batch needs both rules: query $i$ may attend to key $j$ only
# if $j \le i$ **and** $j$ is a real token. Boolean masks combine with `&` (and `|`), and
# broadcasting lines them up, provided each mask has singleton dimensions where it does
# not vary:
#
# | mask | shape | broadcasts against scores of shape |
# |---|---|---|
# | causal | $(N, N)$ | $(B, N, N)$ and $(B, h, N, N)$ |
# | padding, one row per sequence | $(B, N_k)$ | nothing yet: add the query axis |
# | padding for one head | $(B, 1, N_k)$ | $(B, N_q, N_k)$ |
# | padding for many heads (Chapter 3) | $(B, 1, 1, N_k)$ | $(B, h, N_q, N_k)$ |
# | causal & padding | $(B, N, N)$ | $(B, N, N)$ |
#
# The `1`s matter. Multiplying a `(B, N_k)` mask into `(B, N_q, N_k)` scores directly
# would line up $B$ with $N_q$, which either fails or, when $B = N_q$, silently does the
# wrong thing.

# %%
lengths = torch.tensor([6, 4])
N = 6
pad = padding_mask(lengths, N)           # (B, N): real tokens
look = causal_mask(N)                    # (N, N)
both = look & pad[:, None, :]            # (N, N) & (B, 1, N) -> (B, N, N)
print("pad:", tuple(pad.shape), " causal:", tuple(look.shape), " combined:", tuple(both.shape))
print("combined mask of sequence 2 (length 4):\n", both[1].int())

# %% [tags=hide-input]
fig, axes = plt.subplots(1, 3, figsize=(10, 3.4), layout="constrained")
panels = [(look, "causal, (N, N)"),
          (pad[1][None, :].expand(N, N), "padding (len 4), (1, N) broadcast"),
          (both[1], "causal & padding")]
for ax, (m, title) in zip(axes, panels):
    im = ax.imshow(m.int(), cmap="Greys", vmin=0, vmax=1)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("key position j")
    ax.set_xticks(range(N))
    ax.set_yticks(range(N))
axes[0].set_ylabel("query position i")
cbar = fig.colorbar(im, ax=axes, ticks=[0, 1], fraction=0.025)
cbar.ax.set_yticklabels(["False:\nmasked", "True:\nmay attend"])
fig.suptitle("Masks (black = True = may attend)")
plt.show()

# %% [markdown]
# And the weights they produce, for random queries and keys of the same batch:

# %%
torch.manual_seed(0)
q = torch.randn(2, N, 8)   # (B, N, d_k)
k = torch.randn(2, N, 8)   # (B, N, d_k)
v = torch.randn(2, N, 8)   # (B, N, d_v)
_, w_masked = scaled_dot_product_attention(q, k, v, mask=both)  # (B, N, N)
print("row sums:", w_masked[1].sum(-1))

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(4.6, 3.8))
im = ax.imshow(w_masked[1], cmap="viridis", vmin=0, vmax=1)
ax.set_xlabel("key position j")
ax.set_ylabel("query position i")
ax.set_xticks(range(N))
ax.set_yticks(range(N))
ax.set_title("Weights with causal & padding mask\n(sequence of length 4, padded to 6)", fontsize=10)
fig.colorbar(im, ax=ax, label="weight")
plt.tight_layout()
plt.show()

# %% [markdown]
# Everything above the diagonal and everything in columns 4 and 5 is exactly 0, and
# each row still sums to 1. Rows 4 and 5 are *queries* at padding positions: they
# still get an output (here from keys 0 to 3). That output is meaningless but harmless,
# since the loss ignores padding positions. Masking padded queries too is unnecessary
# and, as we see next, risky.
#
# ```{admonition} Which way round is a boolean mask?
# :class: warning
# This course uses the convention of `torch.nn.functional.scaled_dot_product_attention`:
# **True = may attend**. `torch.nn.MultiheadAttention` uses the opposite one: in its
# boolean `attn_mask` and `key_padding_mask`, True means *masked out* (for padding:
# "this is a pad token"). Pass `~mask` when moving between the two. Many code bases
# also use 0/1 float masks with `masked_fill(mask == 0, ...)`. When reading someone
# else's attention code, find out the convention before anything else.
# ```
#
# ### $-\infty$ or $-10^9$?
#
# Both give masked keys a weight of exactly 0 in float32: $e^{-10^9}$ underflows to 0 just
# like $e^{-\infty}$. They differ in two corner cases.
#
# - **A fully masked row.** If a query may attend to *nothing*, all its scores are
#   $-\infty$, and the softmax computes $e^{-\infty - (-\infty)}$, that is NaN. The NaN
#   spreads into the output and, through the backward pass, into every parameter.
#   With $-10^9$ the row's scores are all equal and the weights come out uniform: wrong,
#   but finite. Such rows appear when padded queries are masked as well as padded keys,
#   for an empty sequence, or with sparse patterns (Chapter 6).
# - **Half precision.** The largest float16 number is 65504, so $-10^9$ does not fit:
#   `masked_fill(..., -1e9)` on a float16 tensor raises an overflow error, and the
#   constant converted by hand becomes $-\infty$ anyway.
#   `torch.finfo(scores.dtype).min` is a "large negative" that is safe for any dtype.
#
# Neither corner case is part of this chapter's exercise: with sensible masks every
# row has at least one allowed key. The cell below shows both, and then what your
# `scaled_dot_product_attention` and PyTorch's built-in do with a query that may attend
# to nothing.

# %%
scores = torch.tensor([[0.5, 1.0, -0.3],
                       [0.2, 0.1, 0.4]])
row_mask = torch.tensor([[True, True, False],
                         [False, False, False]])    # second query may attend to nothing
print("fill -inf :", torch.softmax(scores.masked_fill(~row_mask, float("-inf")), dim=-1))
print("fill -1e9 :", torch.softmax(scores.masked_fill(~row_mask, -1e9), dim=-1))
try:
    scores.half().masked_fill(~row_mask, -1e9)
except RuntimeError as err:
    print("fill -1e9 in float16:", repr(err))                # PyTorch's message, as Python shows it
print("fill finfo.min in float16:",
      torch.softmax(scores.half().masked_fill(~row_mask, torch.finfo(torch.float16).min).float(), dim=-1))
qq = torch.randn(1, 2, 4)   # (B, N_q = 2, d_k): the second query has no allowed key
kk = torch.randn(1, 3, 4)   # (B, N_k = 3, d_k)
vv = torch.randn(1, 3, 4)   # (B, N_k = 3, d_v)
ours, ours_w = scaled_dot_product_attention(qq, kk, vv, mask=row_mask[None])
builtin = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=row_mask[None])
print("yours, output of the fully masked query:   ", ours[0, 1])
print("built-in, output of the fully masked query:", builtin[0, 1])
glue("torch_version", torch.__version__.split("+")[0], display=False)

# %% [markdown]
# The first two lines show the two fills on the second query, which may attend to
# nothing: $-\infty$ gives NaN weights, $-10^9$ uniform ones. The last two lines
# disagree, and both are deliberate. Your function, like the formula, takes a softmax
# over a row of $-\infty$ and returns NaN for that query. PyTorch's built-in returns a
# row of zeros (this book was built with PyTorch {glue:text}`torch_version`): since
# version 2.5, `F.scaled_dot_product_attention` uses a "safe" softmax that gives every
# key of a fully masked row a weight of 0, so the query receives nothing, and the output
# and the gradients stay finite (earlier versions returned NaN, like the formula). For
# a batch in which some rows are legitimately empty, for instance padded queries under a
# padding mask on both sides, zeros are the practical choice: those outputs are ignored
# by the loss anyway, and NaN would poison the whole batch. For this chapter we keep the
# plain formula. A fully masked row there is a bug in the mask, and a NaN makes the bug
# loud instead of hiding it behind zeros.

# %% [markdown]
# ## 6. A self-attention layer
#
# The last exercise packages projections and attention into an `nn.Module`. One detail of
# PyTorch first: `nn.Linear(d_in, d_out)` stores a weight of shape `(d_out, d_in)` and
# computes $x W^\top + b$. So the $W^Q$ of the formulas is `self.W_q.weight.T`, and the
# layer also has a bias on each projection (the paper's formulas have none; `nn.Linear`
# and `nn.MultiheadAttention` include one by default). `nn.Linear` acts on the last dimension, so
# `self.W_q(x)` maps `(B, N, d_model)` to `(B, N, d_k)` in one call.
#
# | tensor | shape |
# |---|---|
# | `x` | $(B, N, d_\text{model})$ |
# | `self.W_q(x)`, `self.W_k(x)` | $(B, N, d_k)$ |
# | `self.W_v(x)` | $(B, N, d_v)$ |
# | `mask` (optional) | broadcasts to $(B, N, N)$, e.g. $(N, N)$ or $(B, 1, N)$ |
# | output, weights | $(B, N, d_v)$, $(B, N, N)$ |
#
# `forward` needs three projections and one call to your `scaled_dot_product_attention`.

# %% [exercise SelfAttention]
class SelfAttention(nn.Module):
    """Single-head scaled dot-product self-attention."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.d_k = d_k
        self.W_q = nn.Linear(d_model, d_k)
        self.W_k = nn.Linear(d_model, d_k)
        self.W_v = nn.Linear(d_model, d_v)

    def forward(self, x, mask=None):
        """Attend from every position of x to every position of x.

        Args:
            x:    tensor of shape (B, N, d_model).
            mask: optional bool tensor broadcastable to (B, N, N), True = may
                  attend (for example causal_mask(N), or a padding mask of
                  shape (B, 1, N)).

        Project x to queries (B, N, d_k), keys (B, N, d_k) and values
        (B, N, d_v) with self.W_q, self.W_k and self.W_v, then apply
        scaled_dot_product_attention (scores scaled by 1/sqrt(d_k)).

        Returns:
            (output, weights) with output (B, N, d_v) and weights (B, N, N).
        """
        ### BEGIN SOLUTION
        q = self.W_q(x)  # (B, N, d_k)
        k = self.W_k(x)  # (B, N, d_k)
        v = self.W_v(x)  # (B, N, d_v)
        return scaled_dot_product_attention(q, k, v, mask)  # (B, N, d_v), (B, N, N)
        ### END SOLUTION


# %% [test test_SelfAttention_shapes points=1]
"""SelfAttention returns output (B, N, d_v) and weights (B, N, N)."""
torch.manual_seed(0)
sa = SelfAttention(d_model=8, d_k=4, d_v=6)
sa_out, sa_w = sa(torch.randn(2, 5, 8))
assert sa_out.shape == (2, 5, 6), \
    f"output should be (B, N, d_v) = (2, 5, 6), got {tuple(sa_out.shape)}: are the values projected with W_v?"
assert sa_w.shape == (2, 5, 5), f"weights should be (B, N, N) = (2, 5, 5), got {tuple(sa_w.shape)}"

# %% [test test_SelfAttention_values points=1]
"""SelfAttention equals attention over its own W_q, W_k, W_v projections, scaled by 1/sqrt(d_k)."""
torch.manual_seed(1)
sv = SelfAttention(d_model=12, d_k=4, d_v=3)
sv_x = torch.randn(3, 7, 12)
sv_out, sv_w = sv(sv_x)
with torch.no_grad():
    sv_q, sv_k, sv_v = sv.W_q(sv_x), sv.W_k(sv_x), sv.W_v(sv_x)
    sv_ref = F.scaled_dot_product_attention(sv_q, sv_k, sv_v)
    sv_ref_w = torch.softmax(sv_q @ sv_k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    sv_wrong_scale = torch.softmax(sv_q @ sv_k.transpose(-2, -1) / math.sqrt(12), dim=-1)
assert not torch.allclose(sv_w, sv_wrong_scale, atol=1e-5), \
    "scores scaled by 1/sqrt(d_model): the scale uses d_k, the width of the queries and keys"
assert torch.allclose(sv_w, sv_ref_w, atol=1e-5), \
    "weights differ from softmax(W_q(x) W_k(x)^T / sqrt(d_k)): queries must come from W_q and keys from W_k"
assert torch.allclose(sv_out, sv_ref, atol=1e-5), \
    "output differs from the reference: the values must come from W_v(x)"

# %% [test test_SelfAttention_mask points=1]
"""SelfAttention passes the mask on: a causal mask hides the future, a (B, 1, N) padding mask hides pads."""
torch.manual_seed(2)
sm = SelfAttention(d_model=8, d_k=4, d_v=4)
sm_x = torch.randn(2, 6, 8)
sm_causal = torch.ones(6, 6, dtype=torch.bool).tril()
sm_out, sm_w = sm(sm_x, mask=sm_causal)
assert (sm_w[:, ~sm_causal] == 0).all(), \
    "with a causal mask, weights above the diagonal must be 0: is the mask passed on to scaled_dot_product_attention (True = may attend)?"
sm_x2 = sm_x.clone()
sm_x2[:, 4:] = torch.randn(2, 2, 8)   # change only the future tokens 4 and 5
sm_out2, _ = sm(sm_x2, mask=sm_causal)
assert torch.allclose(sm_out[:, :4], sm_out2[:, :4], atol=1e-5), \
    "with a causal mask, outputs at positions 0..3 must not depend on tokens 4 and 5"
sm_pad = (torch.arange(6) < torch.tensor([6, 3])[:, None]).unsqueeze(1)  # (B, 1, N)
_, sm_w = sm(sm_x, mask=sm_pad)
assert sm_w.shape == (2, 6, 6), f"a (B, 1, N) mask must broadcast to (B, N, N), weights have shape {tuple(sm_w.shape)}"
assert (sm_w[1, :, 3:] == 0).all(), "padded keys (mask False) must get 0 weight"

# %% [test test_SelfAttention_gradients points=1]
"""Gradients flow back to the weights and biases of W_q, W_k and W_v, and are finite."""
torch.manual_seed(3)
sg = SelfAttention(d_model=8, d_k=4, d_v=5)
sg_out, _ = sg(torch.randn(2, 6, 8))
(sg_out * torch.randn_like(sg_out)).sum().backward()
for sg_name, sg_p in sg.named_parameters():
    assert sg_p.grad is not None, \
        f"{sg_name} received no gradient: use the module's own W_q, W_k, W_v and keep everything in torch (no .detach(), .numpy(), .item())"
    assert torch.isfinite(sg_p.grad).all(), f"{sg_name} has a non-finite gradient"
for sg_name in ["W_q.weight", "W_q.bias", "W_k.weight", "W_v.weight", "W_v.bias"]:
    assert dict(sg.named_parameters())[sg_name].grad.abs().sum() > 0, \
        f"the gradient of {sg_name} is zero: is its projection used in the computation?"
# W_k.bias is deliberately not checked for a non-zero gradient: see the text below.

# %% [markdown]
# ### A gradient that is always zero
#
# The gradient test checks five of the six parameters for a non-zero gradient. The sixth,
# the bias of `W_k`, gets a gradient of zero (up to rounding) in *every* correct
# implementation. The key bias adds the same vector $b$ to every key, so query $i$'s
# scores all change by the same amount $q_i \cdot b / \sqrt{d_k}$, and the softmax
# ignores a constant added to a whole row. The parameter has no effect, hence no
# gradient. (This is why some models, OpenAI's Whisper for instance, build their key
# projection without a bias.) The query bias is different: it adds $b \cdot k_j$, which
# varies with the key $j$.

# %%
torch.manual_seed(0)
layer = SelfAttention(d_model=8, d_k=4, d_v=4)
out, _ = layer(torch.randn(2, 5, 8))
(out * torch.randn_like(out)).sum().backward()
for name, p in layer.named_parameters():
    print(f"{name:10s} gradient norm {p.grad.norm():.2e}")

# %% [markdown]
# ### Self-attention versus cross-attention
#
# In self-attention, queries, keys and values all come from one sequence. In
# **cross-attention** the queries come from one sequence and the keys and values from
# another. It is how a Transformer decoder reads the encoder's output: each target
# position asks a question (query) of the source sentence (keys) and receives a blend of
# source information (values). This is exactly the set-up of Chapter 1, with the
# decoder state as the query and the encoder states as both keys and values, now
# written for all target positions at once.
#
# Nothing in `scaled_dot_product_attention` changes: $N_q$ is the target length, $N_k$
# the source length, the weights are $N_q \times N_k$ (no longer square), and the only
# mask that makes sense is the source's padding mask; a causal mask between two
# different sequences has no meaning.

# %%
torch.manual_seed(0)
d_model, d_k_demo, d_v_demo = 16, 8, 8
source = torch.randn(1, 5, d_model)     # (B, N_src=5, d_model), e.g. encoder output
target = torch.randn(1, 3, d_model)     # (B, N_tgt=3, d_model), e.g. decoder states
to_q = nn.Linear(d_model, d_k_demo)
to_k = nn.Linear(d_model, d_k_demo)
to_v = nn.Linear(d_model, d_v_demo)
with torch.no_grad():
    cross_out, cross_w = scaled_dot_product_attention(
        to_q(target),    # queries from the target: (1, 3, d_k)
        to_k(source),    # keys from the source:    (1, 5, d_k)
        to_v(source),    # values from the source:  (1, 5, d_v)
    )
print("cross-attention output:", tuple(cross_out.shape), " weights:", tuple(cross_w.shape))

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5, 3.2))
im = ax.imshow(cross_w[0], cmap="viridis", vmin=0)
ax.set_xlabel("source position (key)")
ax.set_ylabel("target position (query)")
ax.set_xticks(range(5))
ax.set_yticks(range(3))
ax.set_title("Cross-attention weights: $N_q = 3$, $N_k = 5$")
fig.colorbar(im, ax=ax, label="weight")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. Self-attention does not see order
#
# Shuffle the tokens of the input. Nothing in the layer refers to positions: the same
# projections act on every row, and the scores between two tokens depend only on the
# two tokens. So the shuffled input produces the same outputs, shuffled the same way.
# In matrix terms, for a permutation matrix $P$,
#
# $$\mathrm{softmax}\!\left(\frac{(PQ)(PK)^\top}{\sqrt{d_k}}\right) PV
# = P\,\mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) P^\top P V
# = P\,\mathrm{Attention}(Q, K, V),$$
#
# because permuting the rows and columns of the scores just permutes the rows and columns
# of the weights, and $P^\top P = I$. The layer is **permutation equivariant**. Let us
# check it.

# %%
torch.manual_seed(0)
layer = SelfAttention(d_model=8, d_k=4, d_v=4)
x = torch.randn(1, 6, 8)                 # (B, N, d_model)
perm = torch.randperm(6)
with torch.no_grad():
    out, w = layer(x)
    out_p, w_p = layer(x[:, perm])       # shuffled tokens
print("permutation:", perm.tolist())
print("outputs permute the same way:", torch.allclose(out_p, out[:, perm], atol=1e-6))
print("weights permute rows and columns:", torch.allclose(w_p, w[:, perm][:, :, perm], atol=1e-6))

# %% [markdown]
# The consequence is striking: in "dog bites man" and "man bites dog" the token "dog"
# gets *exactly the same* output vector, because it sees the same set of other tokens.
# For language that is unacceptable, so Transformers add information about position to
# the token vectors before the first layer: positional encodings, the subject of
# Chapter 4. (A causal mask breaks the symmetry too, since it treats positions
# differently, and decoder-only models can learn a little about position from it alone.
# Positional encodings supply that information directly.)

# %% [markdown]
# ## 8. What self-attention costs
#
# We count work in floating-point operations (FLOPs) and count one multiply-add, the
# unit of a matrix product, as **2 FLOPs**: a multiplication and an addition. A product
# of an $(n \times m)$ and an $(m \times p)$ matrix is then $2nmp$ FLOPs. (Chapters 3, 6
# and 7 count the same way.) For a sequence of $N$ tokens, one self-attention layer does
#
# | step | multiply-adds $\times 2$ = FLOPs | memory for the result |
# |---|---|---|
# | projections $XW^Q, XW^K, XW^V$ | $2N d_\text{model}(2 d_k + d_v)$ | $N(2d_k + d_v)$ |
# | scores $QK^\top$ | $2 N^2 d_k$ | $N^2$ |
# | softmax | about $5 N^2$ | $N^2$ |
# | blend $AV$ | $2 N^2 d_v$ | $N d_v$ |
#
# The projections grow linearly with $N$; the scores and the blend grow with $N^2$, and
# so does the memory for the $N \times N$ weight matrix, which is kept for the backward
# pass. With $d_k = d_v = d$ the attention core costs $4N^2 d$ FLOPs against
# $6 N d_\text{model} d$ for the projections: below $N \approx 1.5\, d_\text{model}$ the
# projections dominate, above it the quadratic term takes over.

# %%
d_model_c, d_head = 512, 64      # one head of a base-size Transformer
print(f"{pad_to('N', 7, '>')} {pad_to('projections', 13, '>')} {pad_to('attention core', 15, '>')} {pad_to('weights (float32)', 18, '>')}")
for n in [128, 512, 2_048, 8_192, 32_768, 131_072]:
    proj = 2 * n * d_model_c * 3 * d_head
    core = 2 * n * n * d_head + 5 * n * n + 2 * n * n * d_head
    mem = n * n * 4
    print(f"{n:7d} {proj / 1e9:10.2f} GF {core / 1e9:12.2f} GF {mem / 2**20:14.1f} MiB")
glue("weights_gib_max", mem / 2**30, display=False)

# %% [markdown]
# At 131,072 tokens the weight matrix of a *single* head of a *single* sequence needs
# {glue:text}`weights_gib_max:.0f` GiB. Now let us time your function. We use one sequence, $d_k = d_v = 64$, and
# take the best of several runs to reduce noise.

# %%
torch.manual_seed(0)
ns = [128, 256, 512, 768, 1024, 1536, 2048]
times = []
with torch.no_grad():
    for n in ns:
        q, k, v = (torch.randn(1, n, 64) for _ in range(3))
        scaled_dot_product_attention(q, k, v)            # warm-up
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            scaled_dot_product_attention(q, k, v)
            best = min(best, time.perf_counter() - t0)
        times.append(best)
for n, t in zip(ns, times):
    print(f"N={n:5d}   {t * 1e3:8.2f} ms")
slope = torch.linalg.lstsq(
    torch.stack([torch.log(torch.tensor(ns[2:], dtype=torch.float64)),
                 torch.ones(len(ns) - 2, dtype=torch.float64)], dim=1),
    torch.log(torch.tensor(times[2:], dtype=torch.float64))[:, None]).solution[0].item()
print(f"fitted log-log slope for N >= {ns[2]}: {slope:.2f}")
glue("attn_slope", slope, display=False)

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5, 3.8))
ax.loglog(ns, [t * 1e3 for t in times], "o-", label="measured")
guide = [times[-1] * 1e3 * (n / ns[-1]) ** 2 for n in ns]
ax.loglog(ns, guide, "--", color="gray", label=r"slope 2 ($\propto N^2$)")
ax.set_xticks(ns, [str(n) for n in ns], rotation=45)
ax.xaxis.set_minor_formatter(plt.NullFormatter())
ax.set_xlabel("sequence length N")
ax.set_ylabel("time (ms)")
ax.set_title("Wall time of scaled_dot_product_attention")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The arithmetic grows exactly as $N^2$, a slope of 2 on this plot: doubling the
# sequence quadruples the work. The time measured when this book was built grew with a
# fitted slope of {glue:text}`attn_slope:.2f` from $N = 512$ on. Measured times can grow
# more slowly than the work, for short sequences where fixed overheads dominate, or
# faster, once the $N \times N$ matrices no longer fit in the processor's caches and
# every operation waits longer for memory. Exact numbers depend on your machine (and, on
# a shared one, on what else it is doing). This quadratic wall is what the efficient
# attention variants of Chapter 6 attack, either by computing fewer scores (sparse and
# low-rank attention) or by never storing the $N \times N$ matrix (FlashAttention).
#
# ## Check your understanding
#
# 1. In a self-attention layer with $d_\text{model} = 512$, $d_k = 64$ and $d_v = 32$,
#    what are the shapes of $W^Q$, $W^V$, the weights and the output, for a batch of 8
#    sequences of 100 tokens?
#
#    :::{dropdown} Answer
#    $W^Q$ is $512 \times 64$ and $W^V$ is $512 \times 32$ (in `nn.Linear`, stored
#    transposed: `weight` of shape $(64, 512)$ and $(32, 512)$). The weights are
#    $(8, 100, 100)$, one distribution over the 100 keys for each query, and the output
#    is $(8, 100, 32)$: its width is $d_v$, not $d_k$.
#    :::
#
# 2. Why is the scale $1/\sqrt{d_k}$ and not $1/d_k$? What goes wrong with each choice
#    when $d_k$ is large?
#
#    :::{dropdown} Answer
#    If the components of $q$ and $k$ have a fixed variance, $q \cdot k$ has a variance
#    proportional to $d_k$, so a standard deviation proportional to $\sqrt{d_k}$:
#    dividing by $\sqrt{d_k}$ keeps the scores at the same size for every width. Without
#    the scale the scores grow, the softmax saturates and its gradient vanishes. With
#    $1/d_k$ they shrink like $1/\sqrt{d_k}$, and the weights tend to be uniform: the
#    layer starts out unable to prefer any key.
#    :::
#
# 3. A decoder processes a padded batch. Which mask does it need, of which shape, and
#    why would multiplying the weights by the mask after the softmax be wrong?
#
#    :::{dropdown} Answer
#    The causal mask $(N, N)$ combined with the key padding mask $(B, 1, N)$, by `&`,
#    which broadcasts to $(B, N, N)$. Zeroing weights after the softmax leaves rows that
#    no longer sum to 1; filling the scores with $-\infty$ before it gives the forbidden
#    keys weight 0 *and* renormalises the rest.
#    :::
#
# 4. Your `scaled_dot_product_attention` and PyTorch's built-in disagree on one kind of
#    input. Which, and what does each return?
#
#    :::{dropdown} Answer
#    A query whose mask row is entirely False. The formula takes a softmax over a row of
#    $-\infty$ and gives NaN (your function); PyTorch's built-in, since version 2.5,
#    gives that query weights of 0 and an output of zeros. With $-10^9$ instead of
#    $-\infty$ the weights would be uniform.
#    :::

# %% [markdown]
# 5. Why does the bias of `W_k` always get a zero gradient, while the bias of `W_q`
#    does not?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_key_bias_gradient points=2]
# ### BEGIN SOLUTION
# **Model answer.** A key bias $b$ adds $q_i \cdot b / \sqrt{d_k}$ to *every* score of
# query $i$: the same constant across its row, whatever the key $j$. The softmax is
# unchanged by a constant added to a row, so the weights, the output and the loss do not
# depend on $b$, and its gradient is zero. A query bias adds $b \cdot k_j / \sqrt{d_k}$,
# which varies with the key $j$, and so changes the weights.
#
# **Rubric (2 points).**
#
# - 1 point: the key bias adds the same amount to every score of a query's row (the term
#   $q_i \cdot b$ does not depend on $j$).
# - 1 point: the softmax is invariant to a constant added to its row, so nothing downstream
#   depends on the key bias; the query bias's term $b \cdot k_j$ differs from key to key
#   and does change the weights.
# ### END SOLUTION

# %% [markdown]
# ## Challenges (optional, not graded)
#
# - **Additive scores in self-attention.** Replace the dot product by Chapter 1's
#   additive score, $e_{ij} = v^\top \tanh(W q_i + U k_j)$, for all pairs at once
#   (broadcast to a $(B, N, N, d_a)$ tensor). Compare its cost in time and memory with
#   the dot-product version as $N$ grows, and explain why Transformers use the dot
#   product.
# - **Saturation at initialisation.** Repeat the saturation experiment of Section 4(b)
#   with queries and keys produced by freshly initialised `nn.Linear` layers from
#   LayerNorm-ed tokens, for $d_k \in \{16, 64, 256, 1024\}$, with and without the
#   $1/\sqrt{d_k}$ scale. How large must $d_k$ be before the unscaled softmax saturates?
# - **Learned temperature.** Replace $1/\sqrt{d_k}$ by a learned scalar initialised
#   to it, train a small layer on a task of your choice (for example, each token must
#   output the value of the token most similar to it), and plot how the scalar moves.
# - **A fast path.** Write `scaled_dot_product_attention` in terms of
#   `F.scaled_dot_product_attention` (remember that it returns no weights) and time
#   both for $N$ up to 4096. Where does the difference come from?
#
# ## Summary
#
# - Attention is a soft dictionary lookup: a query is scored against every key, a
#   softmax turns the scores into weights, and the output is the weighted blend of the
#   values.
# - In self-attention, $Q = XW^Q$, $K = XW^K$, $V = XW^V$ all come from the same
#   sequence, and $\mathrm{Attention}(Q,K,V) = \mathrm{softmax}(QK^\top/\sqrt{d_k})V$
#   maps $(N_q, d_k), (N_k, d_k), (N_k, d_v)$ to $(N_q, d_v)$, over any batch
#   dimensions. Checked by hand on "Thinking Machines", the computation also exposed
#   wrong numbers in a widely copied version of that example.
# - Raw dot products have variance proportional to $d_k$ ($d_k$ itself for unit-variance
#   components; about $d_k/9$ with PyTorch's default initialisation); dividing by
#   $\sqrt{d_k}$ keeps the softmax out of saturation, where its gradient vanishes.
# - Masks are boolean, True = may attend; masked scores become $-\infty$ before the
#   softmax. Padding masks hide keys that do not exist, causal masks hide the future;
#   combine them with `&` and shape them to broadcast, e.g. $(B, 1, N_k)$. A fully
#   masked row gives NaN in the formula and zeros in PyTorch's built-in.
# - Cross-attention takes queries from one sequence and keys and values from another.
# - Self-attention is permutation equivariant, so order must be supplied separately;
#   and its cost grows as $N^2$ in time and memory (counting a multiply-add as 2 FLOPs,
#   $4N^2 d$ for the attention core).
#
# ## What's next
#
# One attention layer computes one weight matrix: each token can follow only one
# pattern of relevance at a time. In Chapter 3 we run several attentions side by side
# on smaller slices of the model width, *multi-head attention*, so that one head can
# track syntax while another tracks reference, at the same total cost.
#
# ## References
#
# - Vaswani, A., Shazeer, N., Parmar, N., Uszkoreit, J., Jones, L., Gomez, A. N.,
#   Kaiser, Ł. and Polosukhin, I. (2017). Attention Is All You Need. *Advances in
#   Neural Information Processing Systems 30*. <https://arxiv.org/abs/1706.03762>
# - Alammar, J. (2018). The Illustrated Transformer.
#   <https://jalammar.github.io/illustrated-transformer/> (the "Thinking Machines"
#   example).
# - Cheng, J., Dong, L. and Lapata, M. (2016). Long Short-Term Memory-Networks for
#   Machine Reading. *EMNLP 2016*. <https://arxiv.org/abs/1601.06733>
# - Lin, Z., Feng, M., dos Santos, C. N., Yu, M., Xiang, B., Zhou, B. and Bengio, Y.
#   (2017). A Structured Self-attentive Sentence Embedding. *ICLR 2017*.
#   <https://arxiv.org/abs/1703.03130>
# - Parikh, A., Täckström, O., Das, D. and Uszkoreit, J. (2016). A Decomposable
#   Attention Model for Natural Language Inference. *EMNLP 2016*.
#   <https://arxiv.org/abs/1606.01933>
# - Bahdanau, D., Cho, K. and Bengio, Y. (2015). Neural Machine Translation by Jointly
#   Learning to Align and Translate. *ICLR 2015*. <https://arxiv.org/abs/1409.0473>
# - Luong, M.-T., Pham, H. and Manning, C. D. (2015). Effective Approaches to
#   Attention-based Neural Machine Translation. *EMNLP 2015*.
#   <https://arxiv.org/abs/1508.04025>
# - Rush, A. (2018). The Annotated Transformer. *Proceedings of Workshop for NLP Open
#   Source Software*. <https://nlp.seas.harvard.edu/annotated-transformer/>
# - Zhang, A., Lipton, Z. C., Li, M. and Smola, A. J. (2023). *Dive into Deep
#   Learning*, chapter 11, Attention Mechanisms and Transformers. Cambridge University
#   Press. <https://d2l.ai/chapter_attention-mechanisms-and-transformers/>
# - PyTorch documentation: `torch.nn.functional.scaled_dot_product_attention`.
#   <https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html>
# - Guessous, D. (2024). Add a private `_safe_softmax`. PyTorch pull request #131060,
#   the change that makes `scaled_dot_product_attention` return zeros for fully masked
#   rows. <https://github.com/pytorch/pytorch/pull/131060>

# %% [hidden]
import math

import torch

import solutions.ch02_self_attention as ref
from autograder.hidden import HiddenTests, Mistake, rows_sum_to_one

hidden = HiddenTests(ref, from_scratch={"scaled_dot_product_attention", "SelfAttention"},
                     inputs_kept={"scaled_dot_product_attention"})  # its text: inputs not changed


def _attend(q, k, v, mask=None, scale=None, dim=-1, invert=False, after=False, fill=float("-inf")):
    """Attention with one deliberate change, to recognise a common mistake."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None and invert:
        mask = ~mask
    if mask is not None and not after:
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after:
        weights = weights * mask
    return weights @ v, weights


SDPA_MISTAKES = [
    Mistake("scores not scaled by 1/sqrt(d_k)", lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=1.0)),
    Mistake("scores scaled by 1/d_k instead of 1/sqrt(d_k)",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=1 / q.shape[-1])),
    Mistake("scores scaled by sqrt(d_k) instead of divided by it",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=math.sqrt(q.shape[-1]))),
    Mistake("scores scaled by 1/sqrt(d_v): the scale uses the key/query size d_k",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, scale=1 / math.sqrt(v.shape[-1]))),
    Mistake("softmax taken over the queries (dim -2): weights rows do not sum to 1",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, dim=-2)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, invert=True)),
    # An inverted mask leaves some rows fully masked: -1e9 makes them uniform, -inf NaN.
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, invert=True, fill=-1e9)),
    Mistake("mask applied after the softmax: masked scores must be filled before it, "
            "so the remaining weights still sum to 1",
            lambda q, k, v, mask=None: _attend(q, k, v, mask, after=True)),
    Mistake("mask ignored", lambda q, k, v, mask=None: _attend(q, k, v, None)),
]


def _mask_with_a_key_per_row(t, *shape):
    """A random boolean mask where every query keeps at least one key."""
    mask = t.rand_bool(*shape, p=0.6)
    mask[..., 0] = True
    return mask


# %% [hidden]
@hidden.test("test_scaled_dot_product_attention_worked_example")
def _(t):
    x = torch.tensor([[1.0, 0, 1, 0], [0, 2, 0, 2]])
    w_q = torch.tensor([[1.0, 0, 1, 0], [0, 1, 0, 1], [1, 0, 0, 1], [0, 1, 1, 0]])
    w_k = torch.tensor([[0.0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 1, 1], [1, 1, 0, 0]])
    w_v = torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]])
    t.function("scaled_dot_product_attention", x @ w_q, x @ w_k, x @ w_v, mistakes=SDPA_MISTAKES,
               checks=[rows_sum_to_one], label="the Thinking Machines example")
    t.function("scaled_dot_product_attention", t.randn(2, 3, 4), t.randn(2, 3, 4), t.randn(2, 3, 4),
               mistakes=SDPA_MISTAKES, checks=[rows_sum_to_one], label="a batch of 2, 3 tokens")


@hidden.test("test_scaled_dot_product_attention_shapes")
def _(t):
    for lead in [(), (3,), (2, 3)]:
        t.function("scaled_dot_product_attention", t.randn(*lead, 4, 8), t.randn(*lead, 6, 8),
                   t.randn(*lead, 6, 5), mistakes=SDPA_MISTAKES, checks=[rows_sum_to_one],
                   label=f"batch dims {lead}, N_q=4, N_k=6, d_k=8, d_v=5")
    t.function("scaled_dot_product_attention", t.randn(2, 3, 8, dtype=torch.float64),
               t.randn(2, 5, 8, dtype=torch.float64), t.randn(2, 5, 3, dtype=torch.float64),
               mistakes=SDPA_MISTAKES, label="float64 inputs")


@hidden.test("test_scaled_dot_product_attention_values")
def _(t):
    q, k, v = t.randn(2, 5, 16) * 2, t.randn(2, 7, 16) * 2, t.randn(2, 7, 6)
    t.function("scaled_dot_product_attention", q, k, v, grad=True, mistakes=SDPA_MISTAKES,
               checks=[rows_sum_to_one], label="random inputs with d_k=16, gradients too")
    q, k, v = (t.randn(3, 4, 9, dtype=torch.float64) for _ in range(3))
    t.function("scaled_dot_product_attention", q, k, v, grad=True, mistakes=SDPA_MISTAKES,
               label="float64, gradients too")


@hidden.test("test_scaled_dot_product_attention_mask")
def _(t):
    n = 6
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    t.function("scaled_dot_product_attention", t.randn(2, n, 8), t.randn(2, n, 8), t.randn(2, n, 5),
               mask=causal, grad=True, mistakes=SDPA_MISTAKES, label="a causal (n, n) mask")
    keys = torch.tensor([[True] * 7, [True] * 4 + [False] * 3]).unsqueeze(1)  # (B, 1, N_k)
    t.function("scaled_dot_product_attention", t.randn(2, 5, 8), t.randn(2, 7, 8), t.randn(2, 7, 3),
               mask=keys, mistakes=SDPA_MISTAKES, label="a padding mask of shape (B, 1, N_k)")
    t.function("scaled_dot_product_attention", t.randn(2, 3, 4, 8), t.randn(2, 3, 5, 8),
               t.randn(2, 3, 5, 8), mask=_mask_with_a_key_per_row(t, 2, 1, 4, 5),
               mistakes=SDPA_MISTAKES, label="a (B, 1, N_q, N_k) mask over 3 heads")


# %% [hidden]
@hidden.test("test_causal_mask")
def _(t):
    mistakes = [
        Mistake("mask polarity inverted: True goes on and below the diagonal (what a token may see)",
                lambda n: ~torch.ones(n, n, dtype=torch.bool).tril()),
        Mistake("True is above the diagonal: that lets a token see the future",
                lambda n: torch.ones(n, n, dtype=torch.bool).triu()),
        Mistake("the diagonal must be True: a token may attend to itself",
                lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1)),
    ]
    for n in (1, 4, 7):
        t.function("causal_mask", n, mistakes=mistakes, label=f"n={n}")


@hidden.test("test_padding_mask")
def _(t):
    def positions(lengths, max_len):
        return torch.arange(max_len).unsqueeze(0), lengths.unsqueeze(1)
    mistakes = [
        Mistake("mask polarity inverted: True marks the positions that exist (< length)",
                lambda lengths, max_len: (lambda p, l: p >= l)(*positions(lengths, max_len))),
        Mistake("off by one: position `length` itself is padding (use <, not <=)",
                lambda lengths, max_len: (lambda p, l: p <= l)(*positions(lengths, max_len))),
        Mistake("width taken from lengths.max(): use max_len, the padded length, which can be longer "
                "than every sequence in the batch",
                lambda lengths, max_len: (lambda p, l: p < l)(*positions(lengths, int(lengths.max())))),
    ]
    t.function("padding_mask", torch.tensor([3, 5, 1]), 5, mistakes=mistakes, label="lengths [3, 5, 1]")
    t.function("padding_mask", torch.tensor([2, 0, 6, 4]), 6, mistakes=mistakes,
               label="lengths [2, 0, 6, 4]")
    # max_len longer than every sequence: the batch was padded for a longer one elsewhere.
    t.function("padding_mask", torch.tensor([3, 1, 2]), 7, mistakes=mistakes,
               label="lengths [3, 1, 2], max_len=7")
    t.function("padding_mask", torch.tensor([0, 4]), 5, mistakes=mistakes, label="lengths [0, 4], max_len=5")


# %% [hidden]
def _module_attend(module, x, mask=None, scale=None, swap=False, raw_values=False, invert=False,
                   fill=float("-inf")):
    q, k = module.W_q(x), module.W_k(x)
    if swap:
        q, k = k, q
    v = x if raw_values else module.W_v(x)
    return _attend(q, k, v, mask, scale=scale, invert=invert, fill=fill)


SELF_ATTENTION_MISTAKES = [
    Mistake("scores scaled by 1/sqrt(d_model): the scale uses d_k, the size of the projected keys",
            lambda m, x, mask=None: _module_attend(m, x, mask, scale=1 / math.sqrt(x.shape[-1]))),
    Mistake("scores not scaled by 1/sqrt(d_k)", lambda m, x, mask=None: _module_attend(m, x, mask, scale=1.0)),
    Mistake("queries and keys swapped: queries come from W_q, keys from W_k",
            lambda m, x, mask=None: _module_attend(m, x, mask, swap=True)),
    Mistake("missing value projection: values are W_v(x), not x",
            lambda m, x, mask=None: _module_attend(m, x, mask, raw_values=True)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, x, mask=None: _module_attend(m, x, mask, invert=True)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, x, mask=None: _module_attend(m, x, mask, invert=True, fill=-1e9)),
    Mistake("mask ignored: pass it on to the attention", lambda m, x, mask=None: _module_attend(m, x)),
]
SA = dict(mistakes=SELF_ATTENTION_MISTAKES, deps=("scaled_dot_product_attention",))


@hidden.test("test_SelfAttention_shapes")
def _(t):
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, 5, 8), checks=[rows_sum_to_one],
             label="d_model=8, d_k=4, d_v=6", **SA)
    t.module("SelfAttention", dict(d_model=6, d_k=10, d_v=3), t.randn(1, 3, 6), label="d_k > d_model", **SA)


@hidden.test("test_SelfAttention_values")
def _(t):
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=8), t.randn(2, 5, 8) * 2,
             label="d_model=8, d_k=4, d_v=8", **SA)
    t.module("SelfAttention", dict(d_model=12, d_k=3, d_v=5), t.randn(3, 7, 12),
             label="d_model=12, d_k=3, d_v=5", **SA)
    t.module("SelfAttention", dict(d_model=6, d_k=4, d_v=3), t.randn(2, 4, 6, dtype=torch.float64),
             dtype=torch.float64, label="a float64 layer", **SA)


@hidden.test("test_SelfAttention_mask")
def _(t):
    n = 5
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, n, 8),
             mask=torch.ones(n, n, dtype=torch.bool).tril(), label="a causal mask", **SA)
    keys = torch.tensor([[True] * n, [True] * 2 + [False] * (n - 2)]).unsqueeze(1)
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, n, 8), mask=keys,
             label="a (B, 1, N) padding mask", **SA)


@hidden.test("test_SelfAttention_gradients")
def _(t):
    t.module("SelfAttention", dict(d_model=8, d_k=4, d_v=6), t.randn(2, 5, 8), grad=True,
             mask=torch.ones(5, 5, dtype=torch.bool).tril(), label="gradients", **SA)
