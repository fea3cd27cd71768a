# %% [markdown]
# # Chapter 3: Multi-head attention
#
# The self-attention layer of Chapter 2 gives every token one row of weights: one
# distribution over the other tokens, one blend of their values. A word often needs
# more than one thing from its context at the same time, though. This chapter runs
# several attentions side by side, each on its own slice of the model width, and joins
# their results: *multi-head attention*, the form in which attention appears in every
# Transformer. The layer you build here is the attention of every model in the rest of
# the course: the encoder and decoder of Chapter 5, the long-sequence variants of
# Chapter 6, and GPT-2 in Chapter 7.
#
# **Learning goals.** After this chapter you can
#
# - explain why a single attention head must average what it finds, and how several
#   heads keep different findings apart;
# - write $\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots,
#   \mathrm{head}_h)\,W^O$ and give the shape of every tensor in it;
# - count its parameters and show that $h$ heads of width $d_\text{model}/h$ cost the same
#   as one head of width $d_\text{model}$;
# - split a tensor into heads and merge it back with `view`, `transpose` and `reshape`,
#   and explain why a `view` alone gives the wrong answer;
# - show by experiment that your layer computes exactly what `torch.nn.MultiheadAttention`
#   computes, including the opposite meaning of its boolean mask;
# - draw the weights of each head, and watch heads specialise in a model trained in
#   a few seconds.
#
# **Prerequisites.** Chapter 2 (scaled dot-product attention, boolean masks, cross-
# attention). Matrix products, and tensor shapes in PyTorch: `view`, `transpose` and
# broadcasting over leading dimensions.
#
# **Time.** About 2 hours: an hour for the reading and the three exercises, the rest
# for the experiments and the questions. The whole notebook runs in well under a minute
# on a laptop CPU (the three small models of Section 7 train in about ten seconds).
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `split_heads(x, num_heads)` | `(B, N, h*d)` → `(B, h, N, d)`: give every head its own slice of the features | ★ | 1 |
# | `merge_heads(x)` | `(B, h, N, d)` → `(B, N, h*d)`: concatenate the heads again, in order | ★ | 1 |
# | `MultiHeadAttention(d_model, num_heads)` | project, split, attend in every head at once, merge, project with $W^O$ | ★★ | 8 |

# %% [export]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# Chapter 2's attention function is given here, so that this notebook stands on its
# own. It is the same computation you wrote there: scores scaled by $1/\sqrt{d_k}$, a
# boolean mask where True means "may attend", any number of leading batch dimensions.
# Because it accepts any leading dimensions, it will run all heads at once when the
# heads are one of those dimensions.

# %% [export name=given_attention]
def scaled_dot_product_attention(query, key, value, mask=None):
    """Given (Chapter 2): softmax(query @ key^T / sqrt(d_k)) @ value.

    query (..., N_q, d_k), key (..., N_k, d_k), value (..., N_k, d_v); mask: bool,
    broadcastable to (..., N_q, N_k), True = may attend.
    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)                   # (..., N_q, N_k)
    return weights @ value, weights                           # (..., N_q, d_v)


# %%
import time

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

try:                      # the book puts numbers from these cells into its text
    from myst_nb import glue
except ImportError:       # in plain Jupyter: just show them
    def glue(name, value, display=True):
        print(f"{name} = {value}")

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)   # the tensors in this chapter are tiny: one CPU thread is fastest

# %% [markdown]
# ## 1. Why one head is not enough
#
# Take the sentence
#
# > The animal didn't cross the street because it was too tired.
#
# (The sentence first appeared in Google's research-blog post introducing the Transformer,
# Uszkoreit, 2017; Alammar's *The Illustrated Transformer*, 2018, made it well known.)
# To understand "it", a reader links it to "animal" (what "it" refers to) and to
# "tired" (what is said about it). A single attention head gives "it" one row of
# weights $\alpha_j$ and returns one blend $\sum_j \alpha_j v_j$. To take something from
# both words, the row must split its weight between them, and the two values are
# *added*. The sum keeps what was found, but not which word played which role.
#
# Let us make this concrete with values that simply name their token (one-hot
# vectors over a tiny vocabulary).

# %%
vocab = ["animal", "street", "tired", "cross"]
onehot = torch.eye(len(vocab))           # row t is the value vector of token t
v_animal, v_tired = onehot[0], onehot[2]

one_head = 0.5 * v_animal + 0.5 * v_tired              # one row of weights, split 50/50
swapped_roles = 0.5 * v_tired + 0.5 * v_animal          # "tired" as referent, "animal" as predicate
two_heads = torch.cat([v_animal, v_tired])              # head 1 -> referent, head 2 -> predicate
print("one head :", one_head.tolist())
print("roles swapped, one head:", swapped_roles.tolist())
print("two heads:", two_heads.tolist(), " (first 4: head 1, last 4: head 2)")

# %% [markdown]
# With one head, "the referent is *animal* and the predicate is *tired*" and the
# swapped reading produce the same vector. With two heads, each with its own row of
# weights, one head can put all its weight on "animal" and the other all its weight
# on "tired", and their outputs occupy *different coordinates* of the result. Nothing
# is averaged away. Section 7 shows the same effect in a trained model: one head cannot
# learn a task that two heads learn perfectly.
#
# The idea of multi-head attention is exactly this: run $h$ attentions in
# parallel, each with its own projections, so that each can follow its own pattern
# (syntax, reference, nearby words, ...), and concatenate the results.

# %% [markdown]
# ## 2. The formula, and what it costs
#
# With $X$ the queries' sequence and $Y$ the keys' and values' sequence ($X = Y$ in
# self-attention), head $i$ is ordinary scaled dot-product attention on its own
# projections:
#
# $$\mathrm{head}_i = \mathrm{Attention}(X W_i^Q,\ Y W_i^K,\ Y W_i^V), \qquad
# W_i^Q, W_i^K \in \mathbb{R}^{d_\text{model} \times d_k},\ W_i^V \in \mathbb{R}^{d_\text{model} \times d_v}.$$
#
# The heads' outputs, each $N_q \times d_v$, are concatenated along the features and
# mixed by one more matrix:
#
# $$\mathrm{MultiHead} = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O,
# \qquad W^O \in \mathbb{R}^{h d_v \times d_\text{model}} .$$
#
# The paper takes $d_k = d_v = d_\text{model} / h$ (with $d_\text{model} = 512$ and
# $h = 8$, each head works in 64 dimensions), so the concatenation is
# $d_\text{model}$ wide again and the layer maps $d_\text{model}$ to $d_\text{model}$.
# $W^O$ is what lets the heads' findings interact: without it, the output's first
# $d_k$ features would only ever hold head 1's result, the next $d_k$ head 2's, and so on.
#
# **Parameters.** Each head has three $d_\text{model} \times d_\text{model}/h$ matrices,
# so the $h$ heads together hold $3\, d_\text{model}^2$ weights, plus
# $d_\text{model}^2$ for $W^O$: exactly what one head of full width $d_k = d_v =
# d_\text{model}$ (with an output projection) would hold. Splitting into heads costs no
# parameters. Let us count, for the paper's sizes, with a bias on every projection as
# `nn.Linear` has by default.

# %%
d_model, h = 512, 8
d_k = d_model // h

def n_params(*modules):
    return sum(p.numel() for m in modules for p in m.parameters())

per_head = [nn.Linear(d_model, d_k) for _ in range(3 * h)]    # W_i^Q, W_i^K, W_i^V for every head
W_o = nn.Linear(h * d_k, d_model)
one_big = [nn.Linear(d_model, d_model) for _ in range(3)]     # one head with d_k = d_model
print(f"{h} heads of width {d_k}: {n_params(*per_head):,} + W_o {n_params(W_o):,} = {n_params(*per_head, W_o):,}")
print(f"1 head of width {d_model}: {n_params(*one_big):,} + W_o {n_params(W_o):,} = {n_params(*one_big, W_o):,}")
print(f"formula 4 * (d_model^2 + d_model) = {4 * (d_model**2 + d_model):,}")

# %% [markdown]
# **All heads in one matrix.** Placing the $h$ matrices $W_i^Q$ side by side gives one
# $d_\text{model} \times d_\text{model}$ matrix $W^Q = [W_1^Q \mid W_2^Q \mid \dots \mid
# W_h^Q]$, and $XW^Q$ then holds every head's queries side by side: head $i$'s are the
# columns $i\,d_k$ to $(i+1)\,d_k - 1$. So an implementation needs only one
# `nn.Linear(d_model, d_model)` per role and then *reads* each head's slice. A quick
# check that one big projection equals separate per-head projections:

# %%
torch.manual_seed(0)
x_demo = torch.randn(2, 5, d_model)                       # (B, N, d_model)
W_q_big = nn.Linear(d_model, d_model)
with torch.no_grad():
    q_big = W_q_big(x_demo)                               # (B, N, d_model)
    for i in range(h):
        head_i = nn.Linear(d_model, d_k)                  # a separate W_i^Q ...
        head_i.weight.copy_(W_q_big.weight[i * d_k:(i + 1) * d_k])   # ... with head i's rows
        head_i.bias.copy_(W_q_big.bias[i * d_k:(i + 1) * d_k])
        assert torch.allclose(head_i(x_demo), q_big[..., i * d_k:(i + 1) * d_k], atol=1e-5), \
            f"head {i}'s own projection differs from columns {i * d_k}..{(i + 1) * d_k - 1} of the big one"
print("per-head projections == slices of one big projection")

# %% [markdown]
# (`nn.Linear` stores its weight as `(out_features, in_features)`, so head $i$'s
# *columns* of $W^Q$ are *rows* of `weight`.)
#
# **Compute and memory.** The projections cost the same as for one wide head. In the
# attention core every head computes $N_q \times N_k$ scores, each a dot product of
# $d_k$-dimensional vectors, and then as many blends of $d_k$-dimensional values. With
# the counting of Chapter 2 (one multiply-add is 2 FLOPs), the scores of the $h$ heads
# cost $N_q N_k h d_k = N_q N_k d_\text{model}$ multiply-adds, the blends as many, so the
# core costs $2 N_q N_k d_\text{model}$ multiply-adds, that is
# $4 N_q N_k d_\text{model}$ FLOPs: again the same as one head of width
# $d_\text{model}$. What grows is the memory for the weights: there are now $h$
# matrices of $N_q \times N_k$ instead of one.

# %% [markdown]
# ## 3. Splitting and merging heads
#
# We never build $h$ separate tensors. After the big projection, `(B, N, d_model)` is
# regrouped so that the head index becomes a batch dimension: `(B, h, N, d_k)`. The
# attention function of Chapter 2 multiplies the last two dimensions and broadcasts
# the rest, so one call then runs every head of every sequence. The diagram follows
# one layer from input to output: the shapes on the left, and on the right what happens
# to the features of one sequence, coloured by the head they belong to.

# %% [tags=hide-input]
HEADS_TEXT = dict(
    title="Multi-head attention: splitting the features into heads and merging them back",
    x="input  (B, N, d_model)",
    proj="W_q, W_k, W_v: one nn.Linear(d_model, d_model) each\n→ (B, N, d_model)",
    view="view: cut each token's features into h pieces\n→ (B, N, h, d_k)",
    transpose="transpose(1, 2): heads become a batch axis\n→ (B, h, N, d_k)",
    attend="attention in every head at once, scaled by 1/√d_k\nweights (B, h, N_q, N_k) → output (B, h, N_q, d_k)",
    merge="transpose(1, 2) → (B, N, h, d_k)\nreshape → (B, N, d_model)",
    out="W_o: nn.Linear(d_model, d_model)\n→ output (B, N, d_model)",
    split_heads="split_heads", merge_heads="merge_heads",
    grid_in="one sequence: N tokens × d_model features",
    grid_heads="h heads, each N × d_k:\nhead i gets features i·d_k … (i+1)·d_k − 1 of every token",
    grid_out="heads concatenated in order, then mixed by W_o",
    head="head {i}",
    arrow_split="split_heads",
    arrow_merge="attention in each head,\nthen merge_heads",
)


def draw_heads_diagram(text=HEADS_TEXT, n_tokens=3, n_heads=4, d_k=2):
    fig, ax = plt.subplots(figsize=(11, 7))
    ax.set_xlim(0, 11)
    ax.set_ylim(0.2, 8.4)
    ax.axis("off")
    head_colors = ["#f4a582", "#92c5de", "#b8e186", "#c2a5cf", "#fdd49e", "#80cdc1"]

    def box(x, y, w, h, label, color, size=8.5):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                    fc=color, ec="black", lw=0.8))
        ax.text(x, y, label, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, color="black"):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10,
                                     color=color, lw=1.0))

    def grid(x0, y_top, rows, cols, color_of_col, cell=0.25):
        for r in range(rows):
            for c in range(cols):
                ax.add_patch(plt.Rectangle((x0 + c * cell, y_top - (r + 1) * cell), cell, cell,
                                           fc=color_of_col(c), ec="white", lw=1.0))

    # left: the data flow, with the shape after every step
    fx, fw = 3.1, 5.4
    steps = [("x", 7.6, "#dcdcdc"), ("proj", 6.5, "#c9d7f2"), ("view", 5.4, "#f3f1a7"),
             ("transpose", 4.3, "#f3f1a7"), ("attend", 3.2, "#f6d8a8"), ("merge", 2.05, "#bfe3c0"),
             ("out", 0.9, "#c9d7f2")]
    for key, y, color in steps:
        box(fx, y, fw, 0.72, text[key], color)
    for (_, y0, _), (_, y1, _) in zip(steps, steps[1:]):
        arrow(fx, y0 - 0.4, fx, y1 + 0.4)
    for label, y0, y1 in [(text["split_heads"], 4.0, 5.7), (text["merge_heads"], 1.75, 2.35)]:
        ax.plot([0.3, 0.2, 0.2, 0.3], [y1, y1, y0, y0], color="#555555", lw=1.2)
        ax.text(0.1, (y0 + y1) / 2, label, rotation=90, ha="right", va="center", fontsize=8.5,
                family="monospace")

    # right: the features of one sequence, coloured by head
    cell, width = 0.25, n_heads * d_k * 0.25
    gx = 8.9 - width / 2
    by_head = lambda c: head_colors[(c // d_k) % len(head_colors)]
    ax.text(8.9, 8.05, text["grid_in"], ha="center", fontsize=8.5)
    grid(gx, 7.85, n_tokens, n_heads * d_k, by_head)
    gap = 0.3
    hx = 8.9 - (n_heads * d_k * cell + (n_heads - 1) * gap) / 2
    ax.text(8.9, 5.45, text["grid_heads"], ha="center", va="bottom", fontsize=8.5)
    for i in range(n_heads):
        x0 = hx + i * (d_k * cell + gap)
        grid(x0, 5.2, n_tokens, d_k, lambda c, i=i: head_colors[i % len(head_colors)])
        ax.text(x0 + d_k * cell / 2, 5.2 - n_tokens * cell - 0.2, text["head"].format(i=i),
                ha="center", fontsize=7.5)
    ax.text(8.9, 2.35, text["grid_out"], ha="center", fontsize=8.5)
    grid(gx, 2.15, n_tokens, n_heads * d_k, by_head)
    arrow(8.9, 7.85 - n_tokens * cell - 0.1, 8.9, 6.25)
    ax.text(9.05, 6.6, text["arrow_split"], fontsize=8, family="monospace", va="center")
    arrow(8.9, 5.2 - n_tokens * cell - 0.35, 8.9, 2.75)
    ax.text(9.05, 3.45, text["arrow_merge"], fontsize=8, va="center")
    ax.set_title(text["title"], fontsize=11)
    return fig


draw_heads_diagram()
plt.show()

# %% [markdown]
# Two steps do the regrouping:
#
# 1. `x.view(B, N, h, d_k)` cuts each token's feature vector into $h$ consecutive
#    pieces of $d_k$: piece $i$ is head $i$'s slice. Nothing moves in memory.
# 2. `.transpose(1, 2)` swaps the token and head axes: `(B, h, N, d_k)`.
#
# The tempting shortcut `x.view(B, h, N, d_k)` has the right shape but the wrong
# contents: `view` only reinterprets the memory, which is laid out token after
# token, so "head 0" would receive the first $N/h$ tokens' complete feature vectors
# rather than the first slice of every token. Look at a tiny example whose entries
# say where they come from: entry `10 * n + f` is feature `f` of token `n`.

# %%
B, N, h_demo, d_demo = 1, 3, 2, 2
x_small = (10 * torch.arange(N)[:, None] + torch.arange(h_demo * d_demo)[None, :]).float()
x_small = x_small[None]                                    # (B, N, h*d) = (1, 3, 4)
print("x: token n has features 10n + 0..3\n", x_small[0])
right = x_small.view(B, N, h_demo, d_demo).transpose(1, 2)  # (B, h, N, d)
wrong = x_small.view(B, h_demo, N, d_demo)                  # same shape, scrambled
print("view + transpose, head 0 (features 0-1 of every token):\n", right[0, 0])
print("view only, 'head 0':\n", wrong[0, 0])

# %% [markdown]
# With `view + transpose`, head 0 sees features 0 and 1 of each of the three tokens, as
# it should. With `view` alone, its "token 1" is really features 2 and 3 of token 0:
# tokens and heads are mixed up, and no error is raised. Checking shapes is not
# enough; check contents on a small example like this one.
#
# ### Exercise: split into heads

# %% [exercise split_heads]
def split_heads(x, num_heads):
    """Regroup the features of x into heads.

    Args:
        x: tensor of shape (B, N, h*d), with h = num_heads.
        num_heads: the number of heads h; the last dimension of x is a
            multiple of it.

    Returns a tensor of shape (B, h, N, d) whose [b, i, n] entry is head i's
    slice of token n, that is the features i*d : (i+1)*d of x[b, n]
    (consecutive blocks, head 0 first).
    """
    ### BEGIN SOLUTION
    B, N, C = x.size()
    d = C // num_heads
    # reshape, not view: it also accepts an input that is not contiguous in memory
    return x.reshape(B, N, num_heads, d).transpose(1, 2)  # (B, h, N, d)
    ### END SOLUTION


# %% [test test_split_heads points=1]
"""split_heads: (B, N, h*d) -> (B, h, N, d), head i gets features i*d:(i+1)*d of every token."""
sp_x = (10 * torch.arange(3)[:, None] + torch.arange(6)[None, :]).float()[None]  # (1, 3, 6)
sp = split_heads(sp_x, 3)
assert isinstance(sp, torch.Tensor) and sp.shape == (1, 3, 3, 2), \
    f"split_heads of a (1, 3, 6) tensor into 3 heads should have shape (B, h, N, d) = (1, 3, 3, 2), got {tuple(sp.shape)}"
assert not torch.equal(sp, sp_x.view(1, 3, 3, 2)), \
    "view to (B, h, N, d) without a transpose mixes tokens and heads: view to (B, N, h, d), then transpose(1, 2)"
assert not torch.equal(sp, sp_x.view(1, 3, 2, 3).permute(0, 3, 1, 2)), \
    "heads interleaved: head i must take the consecutive features i*d:(i+1)*d, not every h-th feature"
assert torch.equal(sp[0, 1], torch.tensor([[2., 3.], [12., 13.], [22., 23.]])), \
    f"head 1 should hold features 2 and 3 of tokens 0, 1, 2, that is [[2, 3], [12, 13], [22, 23]]; got\n{sp[0, 1]}"
torch.manual_seed(0)
sp_r = torch.randn(2, 5, 8, dtype=torch.float64)
sp_out = split_heads(sp_r, 2)
assert sp_out.shape == (2, 2, 5, 4) and sp_out.dtype == torch.float64, \
    f"split_heads of (2, 5, 8) into 2 heads: expected a float64 (2, 2, 5, 4) tensor, got {sp_out.dtype} {tuple(sp_out.shape)}"
assert torch.equal(sp_out[1, 1, 3], sp_r[1, 3, 4:]), "head 1 of token 3 must be x[b, 3, 4:8]"
assert torch.equal(split_heads(sp_r, 1)[:, 0], sp_r), "with one head, split_heads(x, 1)[:, 0] must equal x"

# %% [markdown]
# ### Exercise: merge the heads
#
# After attention, each head has produced `(B, h, N, d)`. Concatenating the heads means
# undoing the split, so that each token's output is head 0's $d$ features, then head
# 1's, and so on. Flattening `(B, h, N, d)` straight to `(B, N, h*d)` raises no error
# at all: it silently merges the heads in the wrong order, for the same reason as the
# `view`-only split above.
#
# :::{dropdown} Hint: undoing the split
# Retrace the two steps of `split_heads` backwards: transpose back to `(B, N, h, d)`,
# then flatten the last two axes to `(B, N, h*d)`. After a transpose the tensor is no
# longer contiguous in memory, and `.view` refuses to flatten it (it raises an error).
# Use `.reshape`, which copies when it must, or `.contiguous().view(...)`.
# :::

# %% [exercise merge_heads]
def merge_heads(x):
    """Concatenate the heads of x again (the inverse of split_heads).

    Args:
        x: tensor of shape (B, h, N, d).

    Returns a tensor of shape (B, N, h*d) whose [b, n] row is the
    concatenation x[b, 0, n], x[b, 1, n], ..., x[b, h-1, n] (head 0 first).
    """
    ### BEGIN SOLUTION
    B, h, N, d = x.size()
    return x.transpose(1, 2).reshape(B, N, h * d)  # (B, N, h*d)
    ### END SOLUTION


# %% [test test_merge_heads points=1]
"""merge_heads: (B, h, N, d) -> (B, N, h*d), heads concatenated in order; it undoes the split."""
mg_x = (100 * torch.arange(2)[:, None, None] + 10 * torch.arange(3)[None, :, None]
        + torch.arange(4)[None, None, :]).float()[None]   # (B=1, h=2, N=3, d=4): 100*head + 10*token + feature
mg = merge_heads(mg_x)
assert isinstance(mg, torch.Tensor) and mg.shape == (1, 3, 8), \
    f"merge_heads of a (1, 2, 3, 4) tensor should have shape (B, N, h*d) = (1, 3, 8), got {tuple(mg.shape)}"
assert not torch.equal(mg, mg_x.reshape(1, 3, 8)), \
    "heads merged in the wrong order: reshaping (B, h, N, d) directly mixes tokens and heads; transpose(1, 2) first"
assert not torch.equal(mg, mg_x.permute(0, 2, 3, 1).reshape(1, 3, 8)), \
    "heads interleaved: token n's row must be head 0's d features, then head 1's, not alternating"
assert torch.equal(mg[0, 1], torch.tensor([10., 11, 12, 13, 110, 111, 112, 113])), \
    f"token 1's row should be head 0's [10..13] then head 1's [110..113]; got {mg[0, 1].tolist()}"
torch.manual_seed(1)
mg_r = torch.randn(2, 4, 5, 3, dtype=torch.float64)
mg_out = merge_heads(mg_r)
assert mg_out.shape == (2, 5, 12) and mg_out.dtype == torch.float64, \
    f"merge_heads of (2, 4, 5, 3): expected a float64 (2, 5, 12) tensor, got {mg_out.dtype} {tuple(mg_out.shape)}"
assert torch.equal(mg_out[1, 2, 6:9], mg_r[1, 2, 2]), "token 2, features 6:9 must be head 2's output for token 2"
mg_back = torch.randn(3, 7, 12)
assert torch.equal(merge_heads(mg_back.view(3, 7, 4, 3).transpose(1, 2)), mg_back), \
    "merge_heads must undo a split into heads: merge(split(x)) == x"

# %% [markdown]
# ## 4. Exercise: the multi-head attention layer
#
# Now the whole layer. Its `__init__` is given: four `nn.Linear(d_model, d_model)`,
# `W_q`, `W_k`, `W_v` for all heads' projections (head $i$ uses output features
# $i\,d_k$ to $(i+1)\,d_k - 1$) and `W_o` for the output, plus `num_heads` and `d_k`.
# `forward` takes three sequences, so that the same layer serves both self-attention
# (`mha(x, x, x)`) and cross-attention (`mha(target, source, source)`, Chapter 2,
# Section 6). `query` has shape $(B, N_q, d_\text{model})$, `key` and `value`
# $(B, N_k, d_\text{model})$; the layer returns the output, $(B, N_q, d_\text{model})$,
# and the weights of every head, $(B, h, N_q, N_k)$. The diagram of Section 3 shows the
# steps in between.
#
# The scores of each head are scaled by $1/\sqrt{d_k}$, the width of *one head*, not
# $1/\sqrt{d_\text{model}}$: each head is an attention of width $d_k$, and its dot products
# have variance $d_k$ (Chapter 2, Section 4). The given `scaled_dot_product_attention`
# takes $d_k$ from the last dimension of its query, so it does this for you once the
# heads are split.
#
# **Masks** are passed straight on. They only need to broadcast to $(B, h, N_q, N_k)$:
#
# | mask | shape |
# |---|---|
# | causal, the same for every sequence and head | $(N, N)$ |
# | padding, per sequence, the same for every head and query | $(B, 1, 1, N_k)$ |
# | anything per head | $(B, h, N_q, N_k)$ |
#
# Careful with a `(B, N_k)` padding mask: add the two singleton axes first
# (`mask[:, None, None, :]`); as it is, it would line up $B$ with $N_q$.
#
# :::{dropdown} Hint: the steps and their shapes
# `forward` needs five lines, one per row of this table, using your two functions:
#
# | step | shape |
# |---|---|
# | `split_heads(self.W_q(query), self.num_heads)` | $(B, h, N_q, d_k)$ |
# | the same for `self.W_k(key)` and `self.W_v(value)` | $(B, h, N_k, d_k)$ |
# | `scaled_dot_product_attention(q, k, v, mask)`: output, weights | $(B, h, N_q, d_k)$, $(B, h, N_q, N_k)$ |
# | `merge_heads(...)`, then `self.W_o` | $(B, N_q, d_\text{model})$ |
#
# Return the output of `self.W_o` together with the weights, unaveraged.
# :::

# %% [exercise MultiHeadAttention]
class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        """Attend from every position of query to every position of key/value.

        Args:
            query: (B, N_q, d_model).
            key:   (B, N_k, d_model).
            value: (B, N_k, d_model).
            mask:  optional bool tensor broadcastable to (B, h, N_q, N_k),
                   True = may attend.

        Project query, key and value with self.W_q, self.W_k, self.W_v, split
        each into self.num_heads heads (split_heads), attend in every head at
        once with scaled_dot_product_attention (scores scaled by 1/sqrt(d_k),
        d_k = d_model // num_heads), concatenate the heads in order
        (merge_heads) and apply self.W_o.

        Returns:
            (output, weights) with output (B, N_q, d_model) and weights
            (B, h, N_q, N_k), the attention weights of every head.
        """
        ### BEGIN SOLUTION
        q = split_heads(self.W_q(query), self.num_heads)   # (B, h, N_q, d_k)
        k = split_heads(self.W_k(key), self.num_heads)     # (B, h, N_k, d_k)
        v = split_heads(self.W_v(value), self.num_heads)   # (B, h, N_k, d_k)
        out, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, h, N_q, d_k), (B, h, N_q, N_k)
        return self.W_o(merge_heads(out)), weights         # (B, N_q, d_model)
        ### END SOLUTION


# %% [test test_MultiHeadAttention_shapes points=1]
"""Output (B, N_q, d_model), weights (B, h, N_q, N_k), for self- and cross-attention."""
torch.manual_seed(0)
ms = MultiHeadAttention(d_model=16, num_heads=4)
ms_x = torch.randn(2, 5, 16)
ms_out, ms_w = ms(ms_x, ms_x, ms_x)
assert ms_out.shape == (2, 5, 16), f"output should be (B, N, d_model) = (2, 5, 16), got {tuple(ms_out.shape)}"
assert ms_w.shape == (2, 4, 5, 5), \
    f"weights should be (B, h, N, N) = (2, 4, 5, 5), got {tuple(ms_w.shape)}: return every head's weights, not their average"
ms_out, ms_w = ms(torch.randn(2, 3, 16), ms_x, ms_x)
assert ms_out.shape == (2, 3, 16) and ms_w.shape == (2, 4, 3, 5), \
    f"with 3 queries and 5 keys: expected output (2, 3, 16) and weights (2, 4, 3, 5), got {tuple(ms_out.shape)}, {tuple(ms_w.shape)}"

# %% [test test_MultiHeadAttention_values points=2]
"""Values: each head attends on its own slice, scaled by 1/sqrt(d_k), heads concatenated in order, then W_o.

Query, key and value are three different sequences (of one length), so that each must be projected by its own matrix."""
torch.manual_seed(1)
mv = MultiHeadAttention(d_model=12, num_heads=3)
mv_x, mv_key, mv_value = torch.randn(2, 6, 12), torch.randn(2, 6, 12), torch.randn(2, 6, 12)
mv_out, mv_w = mv(mv_x, mv_key, mv_value)
assert mv_w.shape == (2, 3, 6, 6), \
    f"weights should be (B, h, N, N) = (2, 3, 6, 6), got {tuple(mv_w.shape)}: return every head's weights, not their average"
with torch.no_grad():
    mv_q, mv_k, mv_v = mv.W_q(mv_x), mv.W_k(mv_key), mv.W_v(mv_value)   # (B, N, 12) each
    mv_heads, mv_ws, mv_ws_dmodel, mv_ws_twice, mv_heads_vk = [], [], [], [], []
    for i in range(3):                                            # the formula, one head at a time
        sl = slice(4 * i, 4 * (i + 1))
        s = mv_q[..., sl] @ mv_k[..., sl].transpose(-2, -1)
        mv_ws.append(torch.softmax(s / math.sqrt(4), dim=-1))
        mv_ws_dmodel.append(torch.softmax(s / math.sqrt(12), dim=-1))
        mv_ws_twice.append(torch.softmax(s / 4, dim=-1))         # 1/sqrt(d_k), twice
        mv_heads.append(mv_ws[-1] @ mv_v[..., sl])
        mv_heads_vk.append(mv_ws[-1] @ mv.W_v(mv_key)[..., sl])  # values projected from the keys
    mv_concat = torch.cat(mv_heads, dim=-1)                       # (B, N, 12), head 0 first
    mv_expected = mv.W_o(mv_concat)
assert not torch.allclose(mv_w, torch.stack(mv_ws_twice, 1), atol=1e-5), \
    "scores scaled twice (by 1/d_k): scale by 1/sqrt(d_k) once, in the layer or in scaled_dot_product_attention, not in both"
assert not torch.allclose(mv_w, torch.stack(mv_ws_dmodel, 1), atol=1e-5), \
    "scores scaled by 1/sqrt(d_model): each head is scaled by 1/sqrt(d_k), d_k = d_model // num_heads"
assert torch.allclose(mv_w, torch.stack(mv_ws, 1), atol=1e-5), \
    "weights differ from softmax(q_i k_i^T / sqrt(d_k)) per head: head i must use features i*d_k:(i+1)*d_k of W_q(x) and W_k(x) (view to (B, N, h, d_k), then transpose)"
assert not torch.allclose(mv_out, mv_concat, atol=1e-5), "W_o forgotten: apply self.W_o to the concatenated heads"
assert not torch.allclose(mv_out, mv.W_o(torch.stack(mv_heads, 1).reshape(2, 6, 12)), atol=1e-5), \
    "heads merged in the wrong order: transpose (B, h, N, d_k) to (B, N, h, d_k) before flattening"
assert not torch.allclose(mv_out, mv.W_o(torch.cat(mv_heads_vk, dim=-1)), atol=1e-5), \
    "values projected from the keys: the values are W_v(value), the third argument, not W_v(key)"
assert torch.allclose(mv_out, mv_expected, atol=1e-5), "output differs from W_o(Concat(head_1, ..., head_h))"
# The same layer in PyTorch: nn.MultiheadAttention with our weights copied in.
mv_torch = nn.MultiheadAttention(12, 3, batch_first=True)
with torch.no_grad():
    mv_torch.in_proj_weight.copy_(torch.cat([mv.W_q.weight, mv.W_k.weight, mv.W_v.weight]))
    mv_torch.in_proj_bias.copy_(torch.cat([mv.W_q.bias, mv.W_k.bias, mv.W_v.bias]))
    mv_torch.out_proj.weight.copy_(mv.W_o.weight)
    mv_torch.out_proj.bias.copy_(mv.W_o.bias)
    mv_t_out, mv_t_w = mv_torch(mv_x, mv_key, mv_value, average_attn_weights=False)
assert torch.allclose(mv_out, mv_t_out, atol=1e-5) and torch.allclose(mv_w, mv_t_w, atol=1e-5), \
    "differs from torch.nn.MultiheadAttention with the same weights"

# %% [test test_MultiHeadAttention_heads points=1]
"""Any number of heads: 1 head (d_k = d_model), 2, 4, and d_model heads of width 1."""
torch.manual_seed(2)
mh_x = torch.randn(1, 5, 8)
for mh_h in [1, 2, 4, 8]:
    mh = MultiHeadAttention(d_model=8, num_heads=mh_h)
    mh_out, mh_w = mh(mh_x, mh_x, mh_x)
    with torch.no_grad():
        mh_q = mh.W_q(mh_x).view(1, 5, mh_h, 8 // mh_h).transpose(1, 2)
        mh_k = mh.W_k(mh_x).view(1, 5, mh_h, 8 // mh_h).transpose(1, 2)
        mh_ref_w = torch.softmax(mh_q @ mh_k.transpose(-2, -1) / math.sqrt(8 // mh_h), dim=-1)
        mh_twice = torch.softmax(mh_q @ mh_k.transpose(-2, -1) / (8 // mh_h), dim=-1)
    assert mh_w.shape == (1, mh_h, 5, 5), \
        f"with num_heads={mh_h} the weights should be (1, {mh_h}, 5, 5), got {tuple(mh_w.shape)}: " \
        "return every head's weights, not their average"
    assert mh_h == 8 or not torch.allclose(mh_w, mh_twice, atol=1e-5), \
        f"scores scaled twice (by 1/d_k = 1/{8 // mh_h}, num_heads={mh_h}): " \
        "scale by 1/sqrt(d_k) once, in the layer or in scaled_dot_product_attention, not in both"
    assert torch.allclose(mh_w, mh_ref_w, atol=1e-5), \
        f"weights wrong with num_heads={mh_h}: split W_q(x), W_k(x) into num_heads slices of d_k = d_model // num_heads and scale by 1/sqrt(d_k)"

# %% [test test_MultiHeadAttention_cross_attention points=1]
"""Cross-attention: queries from one sequence, keys and values from another (N_q != N_k, key != value)."""
torch.manual_seed(3)
mc = MultiHeadAttention(d_model=8, num_heads=2)
mc_tgt, mc_src, mc_val = torch.randn(2, 3, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
mc_out, mc_w = mc(mc_tgt, mc_src, mc_val)
with torch.no_grad():
    mc_q = mc.W_q(mc_tgt).view(2, 3, 2, 4).transpose(1, 2)
    mc_k = mc.W_k(mc_src).view(2, 6, 2, 4).transpose(1, 2)
    mc_v = mc.W_v(mc_val).view(2, 6, 2, 4).transpose(1, 2)
    mc_ref_w = torch.softmax(mc_q @ mc_k.transpose(-2, -1) / 2.0, dim=-1)
    mc_ref = mc.W_o((mc_ref_w @ mc_v).transpose(1, 2).reshape(2, 3, 8))
assert mc_w.shape == (2, 2, 3, 6), \
    f"weights should be (B, h, N_q, N_k) = (2, 2, 3, 6), got {tuple(mc_w.shape)}: return every head's weights, not their average"
assert not torch.allclose(mc_w, torch.softmax(mc_q @ mc_k.transpose(-2, -1) / 4.0, dim=-1), atol=1e-5), \
    "scores scaled twice (by 1/d_k): scale by 1/sqrt(d_k) once, in the layer or in scaled_dot_product_attention, not in both"
assert torch.allclose(mc_w, mc_ref_w, atol=1e-5), \
    "weights wrong: queries come from W_q(query), keys from W_k(key)"
assert torch.allclose(mc_out, mc_ref, atol=1e-5), \
    "output wrong: values come from W_v(value) (the third argument), not from key"

# %% [test test_MultiHeadAttention_causal_mask points=1]
"""A causal (N, N) mask broadcasts over the batch and the heads and hides the future in every head."""
torch.manual_seed(4)
mm = MultiHeadAttention(d_model=8, num_heads=2)
mm_x = torch.randn(2, 5, 8)
mm_causal = torch.ones(5, 5, dtype=torch.bool).tril()
mm_out, mm_w = mm(mm_x, mm_x, mm_x, mask=mm_causal)
assert mm_w.dim() == 4, f"weights are {tuple(mm_w.shape)}: return every head's weights, (B, h, N, N), not their average"
assert mm_w.shape == (2, 2, 5, 5), f"an (N, N) mask must broadcast to (B, h, N, N); weights are {tuple(mm_w.shape)}"
assert not torch.isnan(mm_w).any(), "NaN weights: is the mask polarity inverted? True means MAY attend"
assert (mm_w[..., ~mm_causal] == 0).all(), \
    "with a causal mask every head's weights above the diagonal must be 0: pass the mask on (True = may attend)"
mm_x2 = mm_x.clone()
mm_x2[:, 3:] = torch.randn(2, 2, 8)
mm_out2, _ = mm(mm_x2, mm_x2, mm_x2, mask=mm_causal)
assert torch.allclose(mm_out[:, :3], mm_out2[:, :3], atol=1e-5), \
    "with a causal mask, outputs 0..2 must not depend on tokens 3 and 4"

# %% [test test_MultiHeadAttention_padding_mask points=1]
"""A (B, 1, 1, N_k) padding mask hides the padded keys of each sequence in every head."""
torch.manual_seed(5)
mp = MultiHeadAttention(d_model=8, num_heads=2)
mp_q, mp_kv, mp_val = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
mp_pad = (torch.arange(6) < torch.tensor([6, 2])[:, None])[:, None, None, :]   # (B, 1, 1, N_k)
mp_out, mp_w = mp(mp_q, mp_kv, mp_val, mask=mp_pad)
assert mp_w.dim() == 4, f"weights are {tuple(mp_w.shape)}: return every head's weights, (B, h, N_q, N_k), not their average"
assert mp_w.shape == (2, 2, 4, 6), f"a (B, 1, 1, N_k) mask must broadcast to (B, h, N_q, N_k); weights are {tuple(mp_w.shape)}"
assert not torch.isnan(mp_w).any(), "NaN weights: is the mask polarity inverted? True means MAY attend"
assert (mp_w[1, :, :, 2:] == 0).all(), "padded keys (mask False) must get 0 weight in every head"
assert torch.allclose(mp_w.sum(-1), torch.ones(2, 2, 4), atol=1e-5), \
    "rows must still sum to 1: mask the scores before the softmax"
mp_kv2, mp_val2 = mp_kv.clone(), mp_val.clone()
mp_kv2[1, 2:], mp_val2[1, 2:] = torch.randn(4, 8), torch.randn(4, 8)   # change only the padding of sequence 1
mp_out2, _ = mp(mp_q, mp_kv2, mp_val2, mask=mp_pad)
assert torch.allclose(mp_out[1], mp_out2[1], atol=1e-5), "the output must not depend on padded keys or values"
with torch.no_grad():
    mp_v = mp.W_v(mp_val).view(2, 6, 2, 4).transpose(1, 2)
    mp_expected = mp.W_o((mp_w @ mp_v).transpose(1, 2).reshape(2, 4, 8))
assert torch.allclose(mp_out, mp_expected, atol=1e-5), \
    "the output is not W_o of the weights times the values: values come from W_v(value), the third argument, not from key"

# %% [test test_MultiHeadAttention_gradients points=1]
"""Gradients reach W_q, W_k, W_v and W_o, and each of query, key and value."""
torch.manual_seed(5)
mgr = MultiHeadAttention(d_model=8, num_heads=2)
mgr_x, mgr_key, mgr_value = (torch.randn(2, 4, 8, requires_grad=True) for _ in range(3))
mgr_out, _ = mgr(mgr_x, mgr_key, mgr_value)
(mgr_out * torch.randn_like(mgr_out)).sum().backward()
for mgr_name in ["W_q.weight", "W_k.weight", "W_v.weight", "W_v.bias", "W_o.weight", "W_o.bias"]:
    mgr_p = dict(mgr.named_parameters())[mgr_name]
    assert mgr_p.grad is not None and mgr_p.grad.abs().sum() > 0, \
        f"{mgr_name} received no gradient: is it used in forward (no .detach(), .data, .numpy())?"
for mgr_name, mgr_input in [("query", mgr_x), ("key", mgr_key), ("value", mgr_value)]:
    assert mgr_input.grad is not None and torch.isfinite(mgr_input.grad).all() and mgr_input.grad.abs().sum() > 0, \
        f"no gradient reaches `{mgr_name}`: queries come from W_q(query), keys from W_k(key), values from W_v(value)"

# %% [markdown]
# ## 5. The same computation as `torch.nn.MultiheadAttention`
#
# PyTorch ships this layer as `torch.nn.MultiheadAttention`. Its parameters are
# arranged differently: the three input projections are stacked in one
# `in_proj_weight` of shape `(3 d_model, d_model)` (queries, then keys, then values)
# with one `in_proj_bias`, and $W^O$ is `out_proj`. Copy your layer's weights into
# it and the two must agree to rounding error, for the outputs and for every head's
# weights (`average_attn_weights=False`; by default it returns the *average* over the
# heads).

# %%
torch.manual_seed(0)
d_model, h, N = 32, 4, 7
ours = MultiHeadAttention(d_model, h)
theirs = nn.MultiheadAttention(d_model, h, batch_first=True)
with torch.no_grad():
    theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))  # (3 d_model, d_model)
    theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
    theirs.out_proj.weight.copy_(ours.W_o.weight)
    theirs.out_proj.bias.copy_(ours.W_o.bias)

x = torch.randn(2, N, d_model)
with torch.no_grad():
    out_ours, w_ours = ours(x, x, x)
    out_theirs, w_theirs = theirs(x, x, x, average_attn_weights=False)
print("max |output difference| :", (out_ours - out_theirs).abs().max().item())
print("max |weights difference|:", (w_ours - w_theirs).abs().max().item())

# %% [markdown]
# The differences are of the order of float32 rounding. The formula, one head at a
# time with explicit slices and a `torch.cat`, gives the same numbers too: splitting
# into a head axis is only a faster way to compute it.

# %%
with torch.no_grad():
    q, k, v = ours.W_q(x), ours.W_k(x), ours.W_v(x)                    # (B, N, d_model)
    d_k = d_model // h
    heads = [scaled_dot_product_attention(q[..., i * d_k:(i + 1) * d_k],
                                          k[..., i * d_k:(i + 1) * d_k],
                                          v[..., i * d_k:(i + 1) * d_k])[0]   # head_i: (B, N, d_k)
             for i in range(h)]
    out_formula = ours.W_o(torch.cat(heads, dim=-1))                  # Concat(head_1..head_h) W^O
print("formula, head by head, max |difference|:", (out_formula - out_ours).abs().max().item())

# %% [markdown]
# ### Masks mean the opposite there
#
# `nn.MultiheadAttention` takes a boolean `attn_mask` of shape $(N_q, N_k)$ (or
# $(B h, N_q, N_k)$), and a `key_padding_mask` of shape $(B, N_k)$, and in both
# **True means "do not attend"**: the opposite of this course's convention (that of
# `F.scaled_dot_product_attention`). A mask passed across unchanged raises no error;
# it just attends to exactly the wrong keys. Invert it with `~`:

# %%
causal = torch.ones(N, N, dtype=torch.bool).tril()                 # True = may attend (ours)
lengths = torch.tensor([N, 4])
keep = torch.arange(N)[None, :] < lengths[:, None]                 # (B, N_k), True = real token
with torch.no_grad():
    out_ours, w_ours = ours(x, x, x, mask=causal & keep[:, None, None, :])
    out_theirs, w_theirs = theirs(x, x, x, attn_mask=~causal, key_padding_mask=~keep,
                                  average_attn_weights=False)
    out_unchanged, _ = theirs(x, x, x, attn_mask=causal, average_attn_weights=False)
    out_future, _ = ours(x, x, x, mask=~causal)                    # ours, told to see only the future
print("masks inverted with ~ : max |difference| =", (out_ours - out_theirs).abs().max().item())
print("causal mask passed unchanged:")
print("  last query has no key left, output is NaN:", torch.isnan(out_unchanged[:, -1]).all().item())
print("  other queries = attending only to later keys, max |difference| =",
      (out_unchanged[:, :-1] - out_future[:, :-1]).abs().max().item())

# %% [markdown]
# Passed unchanged, the causal mask hides the past instead of the future: every query
# sees only the keys *after* it, and the last query sees no key at all, so its output
# is NaN. A padding mask passed unchanged would, in the same way, attend to nothing but
# the padding.
#
# From here on, the course may use `nn.MultiheadAttention` in given code: we have
# shown it computes the same thing as the layer you wrote. It also has options we do
# not need (biases added to the keys and values, separate key and value widths), and
# one that every trained Transformer uses: dropout.
#
# ### Dropout on the attention weights
#
# Vaswani et al. (2017, Section 5.4) regularise with *residual dropout*: each
# sub-layer's output is dropped with probability $P_\text{drop} = 0.1$ before it is
# added to the residual stream, and so is the sum of the embeddings and the positional
# encodings (Chapter 5 builds both). Their released code (the tensor2tensor library)
# also drops entries of the **attention weights**, between the softmax and the blend of
# the values; BERT does the same with probability 0.1, and PyTorch does it when you
# create `nn.MultiheadAttention(..., dropout=p)` (and `F.scaled_dot_product_attention`
# takes a `dropout_p`). In training mode each weight is set to 0 with probability $p$
# and the survivors are multiplied by $1/(1-p)$, so that each weight keeps its
# expected value; a query then cannot rely on any single key. In evaluation mode
# nothing is dropped. Our exercise has no dropout, so that its output is
# deterministic and easy to test; adding it is one line,
# `weights = F.dropout(weights, p, training=self.training)` before `weights @ value`.
#
# Let us look at the weights PyTorch returns with $p = 0.1$, with the same parameters
# as our layer:

# %%
p_drop = 0.1
theirs_drop = nn.MultiheadAttention(d_model, h, dropout=p_drop, batch_first=True)
theirs_drop.load_state_dict(theirs.state_dict())            # the same parameters as `ours`
torch.manual_seed(0)
x_many = torch.randn(8, 32, d_model)                         # many weights, for stable fractions
with torch.no_grad():
    theirs_drop.train()
    _, w_train = theirs_drop(x_many, x_many, x_many, average_attn_weights=False)   # (B, h, N, N)
    theirs_drop.eval()
    out_eval, w_eval = theirs_drop(x_many, x_many, x_many, average_attn_weights=False)
    out_plain, w_plain = ours(x_many, x_many, x_many)
dropped = w_train == 0                                       # softmax weights are never exactly 0
row_sums = w_train.sum(-1)                                   # (B, h, N): no longer all 1
print(f"training mode: fraction of weights set to 0 = {dropped.float().mean():.3f} (p = {p_drop})")
print(f"  survivors / undropped weights = {(w_train[~dropped] / w_eval[~dropped]).mean():.4f}"
      f" (1 / (1 - p) = {1 / (1 - p_drop):.4f})")
print(f"  row sums from {row_sums.min():.3f} to {row_sums.max():.3f}, mean {row_sums.mean():.3f}")
print(f"evaluation mode: max |difference| from our layer = {(out_eval - out_plain).abs().max():.1e}")
glue("drop_p", p_drop, display=False)
glue("drop_fraction", dropped.float().mean().item(), display=False)
glue("drop_scale", (w_train[~dropped] / w_eval[~dropped]).mean().item(), display=False)
glue("drop_row_min", row_sums.min().item(), display=False)
glue("drop_row_max", row_sums.max().item(), display=False)
glue("drop_eval_diff", (out_eval - out_plain).abs().max().item(), display=False)

# %% [markdown]
# In training mode a fraction {glue:text}`drop_fraction:.3f` of the weights is 0 (for
# $p$ = {glue:text}`drop_p:.1f`), the others are {glue:text}`drop_scale:.4f` times
# their undropped value, and a row no longer sums to 1 (here from
# {glue:text}`drop_row_min:.2f` to {glue:text}`drop_row_max:.2f`): it sums to 1 only
# on average. In evaluation mode the layer is our layer again (a difference of
# {glue:text}`drop_eval_diff:.0e`). Remember to call `model.eval()` before you measure
# or look at attention weights, or you will be looking at a random sample of them.

# %% [markdown]
# ## 6. Looking at the heads
#
# Each head has its own weight matrix, so we draw one heatmap per head: row $i$ is
# how query $i$ spreads its attention over the keys. The helper below does that for
# the weights of one sequence, `(h, N_q, N_k)`.

# %%
def visualize_attention(weights, query_tokens, key_tokens, titles=None, ncols=4, size=2.6):
    """Heatmaps of attention weights (h, N_q, N_k), one panel per head."""
    weights = weights.detach()
    n_heads = weights.shape[0]
    ncols = min(ncols, n_heads)
    nrows = math.ceil(n_heads / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols + 1.2, size * nrows + 0.4),
                             squeeze=False, layout="constrained")
    for i, ax in enumerate(axes.flat):
        if i >= n_heads:
            ax.axis("off")
            continue
        im = ax.imshow(weights[i], cmap="viridis", vmin=0, vmax=1)
        ax.set_title(titles[i] if titles else f"head {i}", fontsize=9)
        ax.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
        ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
    fig.colorbar(im, ax=axes, shrink=0.8, label="weight")
    return fig

# %% [markdown]
# **Two heads built by hand.** To see what "each head follows its own pattern" means,
# we set the weights of a 2-head layer ourselves for the sentence above. Every token
# gets a small hand-made feature vector (is it a noun? animate? a pronoun? an
# adjective? a verb?). Head 0 (output features 0 to 3 of each projection) lets a
# pronoun's query match an *animate noun's* key; head 1 (features 4 to 7) lets a
# pronoun's query match an *adjective's* key. We write them into the rows of the
# weight matrices that `split_heads` will hand to each head.

# %%
sentence = ["The", "animal", "didn't", "cross", "the", "street", "because", "it", "was", "too", "tired"]
features = ["noun", "animate", "pronoun", "adjective", "verb", "function word"]
tags = {"animal": ["noun", "animate"], "street": ["noun"], "it": ["pronoun"], "tired": ["adjective"],
        "cross": ["verb"], "was": ["verb"], "didn't": ["verb"]}
emb = torch.zeros(1, len(sentence), 8)                       # (B, N, d_model=8)
for n, word in enumerate(sentence):
    for f in tags.get(word, ["function word"]):
        emb[0, n, features.index(f)] = 1.0

hand = MultiHeadAttention(d_model=8, num_heads=2)            # d_k = 4
with torch.no_grad():
    for p in hand.parameters():
        p.zero_()
    strength = 3.0
    F_pron, F_anim, F_adj = (features.index(f) for f in ("pronoun", "animate", "adjective"))
    hand.W_q.weight[0, F_pron] = strength      # head 0, query feature 0: "I am a pronoun"
    hand.W_k.weight[0, F_anim] = strength      # head 0, key feature 0:   "I am animate"
    hand.W_q.weight[4, F_pron] = strength      # head 1, query feature 4: "I am a pronoun"
    hand.W_k.weight[4, F_adj] = strength       # head 1, key feature 4:   "I am an adjective"
    hand.W_v.weight.copy_(torch.eye(8))        # values: the features themselves
    hand.W_o.weight.copy_(torch.eye(8))
    _, w_hand = hand(emb, emb, emb)            # (1, 2, N, N)
it = sentence.index("it")
for i in range(2):
    top = w_hand[0, i, it].argmax().item()
    print(f"head {i}: 'it' attends most to '{sentence[top]}' (weight {w_hand[0, i, it, top]:.2f})")

# %% [tags=hide-input]
visualize_attention(w_hand[0], sentence, sentence,
                    titles=["head 0: pronoun -> animate noun", "head 1: pronoun -> adjective"], size=3.6)
plt.show()

# %% [markdown]
# The row of "it" is sharp in both heads, on different words: head 0 finds the
# referent "animal", head 1 the property "tired". Every other row is uniform, because
# we gave the other tokens nothing to look for. A trained model learns such weights
# from data instead. Real heads are rarely this tidy, but some are strikingly
# specialised, as the next section shows.

# %% [markdown]
# ## 7. Heads that specialise: a model trained in seconds
#
# The task: a sequence of 8 random digits (a vocabulary of 10), and at every position
# the model must output **both** its left neighbour and its right neighbour (the
# sequence wraps around, so position 0's left neighbour is position 7). This is the
# situation of Section 1 in miniature: every token needs two different things from
# two different places.
#
# The model is as small as it gets: token embedding plus a learned position embedding
# (position information is the subject of Chapter 4; here a learned vector per
# position is enough), **one** `MultiHeadAttention` layer with `d_model = 32`, and a
# linear read-out that predicts the two digits from the attention output. We train it
# with $h = 1$, $2$ and $4$ heads: same width, same number of parameters.

# %%
VOCAB, SEQ, WIDTH = 10, 8, 32

class NeighbourModel(nn.Module):
    def __init__(self, num_heads):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.attn = MultiHeadAttention(WIDTH, num_heads)
        self.readout = nn.Linear(WIDTH, 2 * VOCAB)        # logits for (left, right)

    def forward(self, tokens):                            # tokens: (B, N)
        B, N = tokens.size()
        x = self.tok(tokens) + self.pos.weight[:N]        # (B, N, WIDTH)
        out, weights = self.attn(x, x, x)                 # (B, N, WIDTH), (B, h, N, N)
        return self.readout(out).view(B, N, 2, VOCAB), weights


def neighbour_batch(n, generator):
    tokens = torch.randint(0, VOCAB, (n, SEQ), generator=generator)
    targets = torch.stack([tokens.roll(1, dims=1), tokens.roll(-1, dims=1)], dim=-1)  # (n, N, 2)
    return tokens, targets


def train_neighbour_model(num_heads, steps=600, seed=1):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = NeighbourModel(num_heads)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens, targets = neighbour_batch(128, gen)
        logits, _ = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


started = time.perf_counter()
models = {h: train_neighbour_model(h) for h in (1, 2, 4)}
print(f"trained 3 models in {time.perf_counter() - started:.1f} s")

test_tokens, test_targets = neighbour_batch(2000, torch.Generator().manual_seed(123))
print(f"{pad_to('heads', 5, '>')} {pad_to('left acc', 9, '>')} {pad_to('right acc', 10, '>')}")
neighbour_weights, neighbour_acc = {}, {}
for h, model in models.items():
    with torch.no_grad():
        logits, weights = model(test_tokens)
    acc = (logits.argmax(-1) == test_targets).float().mean(dim=(0, 1))   # (2,): left, right
    neighbour_weights[h], neighbour_acc[h] = weights, acc
    print(f"{h:5d} {acc[0]:9.3f} {acc[1]:10.3f}")
glue("one_head_best", neighbour_acc[1].max().item(), display=False)
glue("one_head_worst", neighbour_acc[1].min().item(), display=False)
glue("chance", 1 / VOCAB, display=False)
glue("multi_head_worst", min(neighbour_acc[h].min().item() for h in (2, 4)), display=False)

# %% [markdown]
# With one head, the model gets one side nearly right (accuracy
# {glue:text}`one_head_best:.3f`) and the other far from it
# ({glue:text}`one_head_worst:.3f`, where guessing a digit at random would give
# {glue:text}`chance:.1f`). Its single weight row must share itself between the two
# neighbours, and the read-out receives their values added together; it can recover
# the neighbour with the larger weight, but hardly which digit sat on the other side.
# Two heads solve the task, as do four (no side below
# {glue:text}`multi_head_worst:.3f`). Where do the heads look? For each head we
# average, over the test set, the weight that position $n$ gives to position $n-1$ and
# to position $n+1$ (cyclically):

# %%
def neighbour_focus(weights):
    """Mean weight each head puts on the left and on the right neighbour."""
    B, H, N, _ = weights.shape
    n = torch.arange(N)
    left = weights[:, :, n, (n - 1) % N].mean(dim=(0, 2))     # (H,)
    right = weights[:, :, n, (n + 1) % N].mean(dim=(0, 2))    # (H,)
    return left, right

for h in (1, 2, 4):
    left, right = neighbour_focus(neighbour_weights[h])
    print(f"{h} head(s): " + "   ".join(f"head {i}: left {l:.2f} right {r:.2f}"
                                       for i, (l, r) in enumerate(zip(left, right))))
left, right = neighbour_focus(neighbour_weights[2])
glue("two_head_focus", torch.maximum(left, right).min().item(), display=False)

# %% [tags=hide-input]
digits = [str(t) for t in test_tokens[0].tolist()]
for h in (2, 4):
    left, right = neighbour_focus(neighbour_weights[h])
    visualize_attention(neighbour_weights[h][0], digits, digits,
                        titles=[f"head {i}: left ({l:.2f})" if l > r else f"head {i}: right ({r:.2f})"
                                for i, (l, r) in enumerate(zip(left, right))])
    plt.suptitle(f"{h} heads, one test sequence (rows: queries, columns: keys)", fontsize=10)
    plt.show()

# %% [markdown]
# The heads have divided the work between them: with two heads, one attends almost
# entirely to the left neighbour and the other to the right one (each puts at least
# {glue:text}`two_head_focus:.3f` of its weight on its side; see the bright
# off-diagonals, which wrap around in the corners). With four heads there are two
# heads for each side, or a head that is left over; which head takes which side
# depends only on the random initialisation. Nobody told the model to do this: the
# split emerges because it is the only way to deliver both digits.
#
# In large trained models, researchers have found heads with similarly clear jobs:
# heads that attend to the previous or the next token, heads that follow a syntactic
# relation or link a pronoun to its noun (Voita et al., 2019; Clark et al., 2019),
# heads that copy a token seen earlier (Olsson et al., 2022). Many other heads are hard to interpret, and
# whole heads can often be removed after training with little loss (Michel, Levy and
# Neubig, 2019; Voita et al., 2019). Attention weights show where
# a head *looks*, not what the rest of the network does with it, so read such pictures
# as clues rather than explanations (Jain and Wallace, 2019).

# %% [markdown]
# ## Check your understanding
#
# 1. A layer has $d_\text{model} = 768$ and $h = 12$ heads. What is $d_k$, what are
#    the shapes of the queries after `split_heads` and of the weights, for a batch of
#    4 sequences of 100 tokens, and by what is each score divided?
#
#    :::{dropdown} Answer
#    $d_k = 768 / 12 = 64$. The queries are $(4, 12, 100, 64)$ and the weights
#    $(4, 12, 100, 100)$. Each score is divided by $\sqrt{64} = 8$, the square root of
#    the width of one head, not by $\sqrt{768}$.
#    :::
#
# 2. Going from 1 head to 8 heads at the same $d_\text{model}$, what changes in the
#    number of parameters, in the FLOPs, and in the memory of the layer?
#
#    :::{dropdown} Answer
#    The parameters stay $4(d_\text{model}^2 + d_\text{model})$ and the FLOPs stay the
#    same: the projections are the same four matrices, and the attention core does
#    $2 N_q N_k d_k$ FLOPs per head for the scores, $h$ times, which is
#    $2 N_q N_k d_\text{model}$ in both cases (and as many for the blend). What grows is
#    the memory for the weights: $h$ matrices of $N_q \times N_k$ instead of one.
#    :::
#
# 3. Someone writes `x.view(B, h, N, d_k)` instead of
#    `x.view(B, N, h, d_k).transpose(1, 2)`. Why does no error appear, and what does
#    "head 0" then see?
#
#    :::{dropdown} Answer
#    Both have the shape $(B, h, N, d_k)$, and `view` only reinterprets memory that is
#    laid out token after token, so nothing fails. But "head 0" then receives the
#    complete feature vectors of the first $N/h$ tokens, cut into pieces, instead of the
#    first $d_k$ features of every token: tokens and heads are mixed up. Only a check
#    of the contents on a small example catches it.
#    :::

# %% [markdown]
# 4. What would be lost without $W^O$?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_output_projection points=2]
# ### BEGIN SOLUTION
# **Model answer.** Without $W^O$ the output's first $d_k$ features would only ever hold
# head 1's result, the next $d_k$ head 2's, and so on: no output feature could combine
# what different heads found. $W^O$ mixes the heads' findings, so every output feature
# can use all of them, and it maps the concatenation back into the model's own
# $d_\text{model}$ features, the ones the residual connection of Chapter 5 adds it to.
#
# **Rubric (2 points).**
#
# - 1 point: without $W^O$ the heads' results stay side by side in separate blocks of
#   features, never combined.
# - 1 point: $W^O$ mixes them into every output feature and maps the concatenation into
#   the model's feature space (the one the residual stream uses). "It changes the shape"
#   alone earns nothing: the concatenation already has $d_\text{model}$ features.
# ### END SOLUTION

# %% [markdown]
# 5. You pass the causal mask of this course, True = may attend, unchanged to
#    `nn.MultiheadAttention`. What happens?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_mask_convention points=2]
# ### BEGIN SOLUTION
# **Model answer.** `nn.MultiheadAttention` reads True in `attn_mask` as "do not attend",
# the opposite of this course's convention, so the causal mask is inverted: every query
# sees only the keys *after* it, the future instead of the past. The last query has no key
# left, its row of scores is all $-\infty$, and its output is NaN. Nothing fails on the
# shape. Pass `~mask`.
#
# **Rubric (2 points).**
#
# - 1 point: PyTorch's module takes True as "masked out", so the mask is inverted and each
#   query attends to the future (the keys after it) instead of the past.
# - 1 point: a consequence or the fix: the last query keeps no key and gives NaN, and
#   passing `~mask` (or a float mask) repairs it.
# ### END SOLUTION

# %% [markdown]
# ## Challenges (optional, not graded)
#
# - **Attention-weight dropout as an option.** Write a subclass of your
#   `MultiHeadAttention` with an extra argument `dropout=0.0` that drops attention
#   weights in training mode only. Check that in evaluation mode it equals your layer,
#   and that with the same random seed and the same parameters it matches
#   `nn.MultiheadAttention(..., dropout=p)` in training mode too (look at how PyTorch
#   calls `F.dropout`).
# - **Grouped heads.** Recent language models (Ainslie et al., 2023) let several query
#   heads share one key head and one value head: with $h$ query heads and $g$ key/value
#   groups, `W_k` and `W_v` map to $g\,d_k$ features only. Implement it with
#   `repeat_interleave` on the key and value heads, check that $g = h$ gives back
#   multi-head attention and $g = 1$ gives *multi-query* attention (Shazeer, 2019), and
#   count how much smaller the keys and values become.
# - **Pruning heads.** Train the neighbour model of Section 7 with 4 heads, then set the
#   output of one head at a time to zero (before `W_o`) and measure the accuracy. Which
#   heads can go? Compare with Michel, Levy and Neubig (2019).
# - **More roles than heads.** Change the task to "output the left neighbour, the right
#   neighbour and the token two to the left". How many heads does it need?
#
# ## Summary
#
# - One head returns one blend of values per query; information that must be taken
#   from several places at once gets averaged together. Several heads, each with its
#   own projections, keep their findings in separate coordinates.
# - $\mathrm{head}_i = \mathrm{Attention}(XW_i^Q, YW_i^K, YW_i^V)$,
#   $\mathrm{MultiHead} = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)W^O$,
#   with $d_k = d_v = d_\text{model}/h$: the same parameters and FLOPs as one head of
#   full width, and $h$ weight matrices instead of one.
# - In code: one `nn.Linear(d_model, d_model)` per role, `view(B, N, h, d_k)` and
#   `transpose(1, 2)` to make the heads a batch dimension, one attention call for all
#   heads, then the inverse (`transpose`, `reshape`) and `W_o`. Scale by
#   $1/\sqrt{d_k}$, the width of a head.
# - `nn.MultiheadAttention` computes the same function; its boolean masks mean
#   "do not attend", so pass `~mask`. With `dropout=p` it also drops attention weights
#   in training mode, and only then.
# - Trained heads specialise: in a task that needs two neighbours, two heads split the
#   work, while one head gets one side right and the other wrong.
#
# ## What's next
#
# Our neighbour model needed a learned position embedding: without it, attention
# cannot tell a left neighbour from a right one, or any position from any other.
# Chapter 4 is about that missing ingredient: positional encodings, from the sinusoids
# of the original Transformer to the rotations (RoPE) and distance penalties (ALiBi)
# of recent language models.
#
# ## References
#
# - Vaswani, A., Shazeer, N., Parmar, N., Uszkoreit, J., Jones, L., Gomez, A. N.,
#   Kaiser, Ł. and Polosukhin, I. (2017). Attention Is All You Need. *Advances in
#   Neural Information Processing Systems 30*. <https://arxiv.org/abs/1706.03762>
# - Michel, P., Levy, O. and Neubig, G. (2019). Are Sixteen Heads Really Better than
#   One? *Advances in Neural Information Processing Systems 32*.
#   <https://arxiv.org/abs/1905.10650>
# - Voita, E., Talbot, D., Moiseev, F., Sennrich, R. and Titov, I. (2019). Analyzing
#   Multi-Head Self-Attention: Specialized Heads Do the Heavy Lifting, the Rest Can Be
#   Pruned. *ACL 2019*. <https://arxiv.org/abs/1905.09418>
# - Clark, K., Khandelwal, U., Levy, O. and Manning, C. D. (2019). What Does BERT Look
#   At? An Analysis of BERT's Attention. *BlackboxNLP Workshop at ACL 2019*.
#   <https://arxiv.org/abs/1906.04341>
# - Jain, S. and Wallace, B. C. (2019). Attention is not Explanation. *NAACL 2019*.
#   <https://arxiv.org/abs/1902.10186>
# - Olsson, C., Elhage, N., Nanda, N., et al. (2022). In-context Learning and Induction
#   Heads. *Transformer Circuits Thread*.
#   <https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/index.html>
# - Shazeer, N. (2019). Fast Transformer Decoding: One Write-Head is All You Need.
#   *arXiv:1911.02150*. <https://arxiv.org/abs/1911.02150>
# - Ainslie, J., Lee-Thorp, J., de Jong, M., Zemlyanskiy, Y., Lebrón, F. and Sanghai, S.
#   (2023). GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
#   Checkpoints. *EMNLP 2023*. <https://arxiv.org/abs/2305.13245>
# - Devlin, J., Chang, M.-W., Lee, K. and Toutanova, K. (2019). BERT: Pre-training of
#   Deep Bidirectional Transformers for Language Understanding. *NAACL 2019*.
#   <https://arxiv.org/abs/1810.04805>
# - Uszkoreit, J. (2017). Transformer: A Novel Neural Network Architecture for Language
#   Understanding. *Google Research Blog*, 31 August 2017 (the first appearance of the "it"
#   and "animal" sentence of Section 1).
#   <https://research.google/blog/transformer-a-novel-neural-network-architecture-for-language-understanding/>
# - Alammar, J. (2018). The Illustrated Transformer (the same sentence, drawn head by
#   head). <https://jalammar.github.io/illustrated-transformer/>
# - Rush, A. (2018). The Annotated Transformer. *Proceedings of Workshop for NLP Open
#   Source Software*. <https://nlp.seas.harvard.edu/annotated-transformer/>
# - PyTorch documentation: `torch.nn.MultiheadAttention`.
#   <https://pytorch.org/docs/stable/generated/torch.nn.MultiheadAttention.html>

# %% [hidden]
import math

import torch

import solutions.ch03_multi_head_attention as ref
from autograder.hidden import HiddenTests, Mistake, rows_sum_to_one

hidden = HiddenTests(ref, from_scratch={"MultiHeadAttention"})


def _split(x, h, how="ok"):
    B, N, C = x.shape
    d = C // h
    if how == "view_only":               # view to (B, h, N, d) without a transpose
        return x.reshape(B, h, N, d)
    if how == "interleaved":             # head i gets every h-th feature
        return x.reshape(B, N, d, h).permute(0, 3, 1, 2)
    return x.reshape(B, N, h, d).transpose(1, 2)


def _merge(x, how="ok"):
    B, h, N, d = x.shape
    if how == "no_transpose":            # flatten (B, h, N, d) directly
        return x.reshape(B, N, h * d)
    if how == "interleaved":             # features alternate between heads
        return x.permute(0, 2, 3, 1).reshape(B, N, d * h)
    return x.transpose(1, 2).reshape(B, N, h * d)


SPLIT_MISTAKES = [
    Mistake("view to (B, h, N, d) without a transpose: that mixes tokens and heads; "
            "view to (B, N, h, d), then transpose(1, 2)", lambda x, h: _split(x, h, "view_only")),
    Mistake("heads interleaved: head i must take the consecutive features i*d:(i+1)*d, "
            "not every h-th feature", lambda x, h: _split(x, h, "interleaved")),
]
MERGE_MISTAKES = [
    Mistake("heads merged in the wrong order: reshaping (B, h, N, d) straight to (B, N, h*d) "
            "mixes tokens and heads; transpose(1, 2) first", lambda x: _merge(x, "no_transpose")),
    Mistake("heads interleaved: each token's row must be head 0's d features, then head 1's, ...",
            lambda x: _merge(x, "interleaved")),
]


# %% [hidden]
@hidden.test("test_split_heads")
def _(t):
    t.function("split_heads", torch.arange(24.0).reshape(1, 4, 6), 3, mistakes=SPLIT_MISTAKES,
               label="an arange (1, 4, 6) tensor, 3 heads")
    t.function("split_heads", t.randn(2, 5, 8), 2, mistakes=SPLIT_MISTAKES, label="(2, 5, 8), 2 heads")
    t.function("split_heads", t.randn(3, 7, 12, dtype=torch.float64), 4, mistakes=SPLIT_MISTAKES,
               label="float64 (3, 7, 12), 4 heads")
    t.function("split_heads", t.randn(2, 3, 6), 1, mistakes=SPLIT_MISTAKES, label="one head")
    t.function("split_heads", t.randn(1, 1, 8), 8, mistakes=SPLIT_MISTAKES, label="one token, 8 heads of width 1")


@hidden.test("test_merge_heads")
def _(t):
    t.function("merge_heads", torch.arange(24.0).reshape(1, 2, 3, 4), mistakes=MERGE_MISTAKES,
               label="an arange (1, 2, 3, 4) tensor")
    t.function("merge_heads", t.randn(2, 4, 5, 3), mistakes=MERGE_MISTAKES, label="(2, 4, 5, 3)")
    t.function("merge_heads", t.randn(3, 2, 6, 4, dtype=torch.float64), mistakes=MERGE_MISTAKES,
               label="float64 (3, 2, 6, 4)")
    t.function("merge_heads", t.randn(2, 1, 4, 5), mistakes=MERGE_MISTAKES, label="one head")


# %% [hidden]
def _mha(m, query, key, value, mask=None, scale=None, split="ok", merge="ok", w_o=True,
         invert=False, fill=float("-inf"), kv_from=None):
    """The reference layer with one deliberate change, to recognise a common mistake."""
    h = m.num_heads
    if kv_from == "query":
        key = value = query
    elif kv_from == "swap":
        key, value = value, key
    elif kv_from == "key":
        value = key
    q = _split(m.W_q(query), h, split)
    k = _split(m.W_k(key), h, split)
    v = _split(m.W_v(value), h, split)
    d_k = q.shape[-1]
    scale = 1 / math.sqrt(d_k) if scale is None else scale(query.shape[-1], d_k)
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    weights = torch.softmax(scores, dim=-1)
    out = _merge(weights @ v, merge)
    return (m.W_o(out) if w_o else out), weights


def _scaled_twice(d_model, d_k, coinciding):
    """1/d_k: scaled by 1/sqrt(d_k) in the layer and again in scaled_dot_product_attention. Where
    d_k * d_k == d_model that is also 1/sqrt(d_model): one model for each case, so a message never
    blames one of the two for the other."""
    if (d_k * d_k == d_model) != coinciding:
        raise ValueError("this mistake model does not apply to these sizes")
    return 1 / d_k


def _weights_averaged(m, *args, **kwargs):
    out, weights = _mha(m, *args, **kwargs)
    return out, weights.mean(dim=1)


MHA_MISTAKES = [
    Mistake("W_o forgotten: apply self.W_o to the concatenated heads",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, w_o=False)),
    Mistake("scores scaled by 1/d_k, which for these sizes is also 1/sqrt(d_model): scores scaled twice "
            "(in the layer and again in scaled_dot_product_attention), or by 1/sqrt(d_model); scale each "
            "head once, by 1/sqrt(d_k)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: _scaled_twice(d, dk, True))),
    Mistake("scores scaled twice (by 1/d_k): scale by 1/sqrt(d_k) once, in the layer or in "
            "scaled_dot_product_attention, not in both",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: _scaled_twice(d, dk, False))),
    Mistake("scores scaled by 1/sqrt(d_model): each head is scaled by 1/sqrt(d_k), d_k = d_model // num_heads",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: 1 / math.sqrt(d))),
    Mistake("scores not scaled by 1/sqrt(d_k)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, scale=lambda d, dk: 1.0)),
    Mistake("heads split with a view to (B, h, N, d_k) without a transpose: that mixes tokens and heads; "
            "view to (B, N, h, d_k), then transpose(1, 2)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, split="view_only", merge="no_transpose")),
    Mistake("heads split with a view to (B, h, N, d_k) without a transpose: that mixes tokens and heads; "
            "view to (B, N, h, d_k), then transpose(1, 2)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, split="view_only")),
    Mistake("heads merged in the wrong order: transpose (B, h, N_q, d_k) to (B, N_q, h, d_k) before "
            "flattening to (B, N_q, d_model)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, merge="no_transpose")),
    Mistake("heads interleaved: head i uses the consecutive features i*d_k:(i+1)*d_k of each projection",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, split="interleaved", merge="interleaved")),
    Mistake("keys and values taken from the query: use the key and value arguments (cross-attention)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, kv_from="query")),
    Mistake("key and value swapped: keys come from W_k(key), values from W_v(value)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, kv_from="swap")),
    Mistake("values projected from the keys: the values are W_v(value), the third argument, not W_v(key)",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, kv_from="key")),
    Mistake("weights averaged over the heads: return every head's weights, shape (B, h, N_q, N_k)",
            lambda m, q, k, v, mask=None: _weights_averaged(m, q, k, v, mask)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, invert=True)),
    Mistake("mask polarity inverted: True means the query MAY attend to the key",
            lambda m, q, k, v, mask=None: _mha(m, q, k, v, mask, invert=True, fill=-1e9)),
    Mistake("mask ignored: pass it on to the attention", lambda m, q, k, v, mask=None: _mha(m, q, k, v)),
]
MHA = dict(mistakes=MHA_MISTAKES, deps=("split_heads", "merge_heads"))


def _self(t, B, N, d):
    x = t.randn(B, N, d)
    return x, x.clone(), x.clone()


@hidden.test("test_MultiHeadAttention_shapes")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=16, num_heads=4), *_self(t, 2, 5, 16),
             checks=[rows_sum_to_one], label="self-attention, d_model=16, 4 heads", **MHA)
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), t.randn(3, 1, 8), t.randn(3, 6, 8),
             t.randn(3, 6, 8), label="one query, 6 keys", **MHA)


@hidden.test("test_MultiHeadAttention_values")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=12, num_heads=3), *_self(t, 2, 6, 12),
             checks=[rows_sum_to_one], label="self-attention, d_model=12, 3 heads", **MHA)
    t.module("MultiHeadAttention", dict(d_model=32, num_heads=4), *_self(t, 2, 9, 32),
             label="self-attention, d_model=32, 4 heads", **MHA)


@hidden.test("test_MultiHeadAttention_heads")
def _(t):
    x = t.randn(2, 5, 8)
    for h in (1, 2, 4, 8):
        t.module("MultiHeadAttention", dict(d_model=8, num_heads=h), x, x.clone(), x.clone(),
                 label=f"d_model=8, num_heads={h}", **MHA)


@hidden.test("test_MultiHeadAttention_cross_attention")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), t.randn(2, 3, 8), t.randn(2, 6, 8),
             t.randn(2, 6, 8), label="N_q=3, N_k=6, key != value", **MHA)
    t.module("MultiHeadAttention", dict(d_model=12, num_heads=4), t.randn(1, 7, 12), t.randn(1, 4, 12),
             t.randn(1, 4, 12), label="N_q=7, N_k=4", **MHA)


@hidden.test("test_MultiHeadAttention_causal_mask")
def _(t):
    n = 6
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), *_self(t, 2, n, 8), mask=causal,
             label="a causal (N, N) mask", **MHA)
    t.module("MultiHeadAttention", dict(d_model=16, num_heads=4), *_self(t, 1, n, 16), mask=causal,
             label="a causal (N, N) mask, 4 heads", **MHA)


@hidden.test("test_MultiHeadAttention_padding_mask")
def _(t):
    n = 6
    keep = (torch.arange(n)[None, :] < torch.tensor([n, 3])[:, None])[:, None, None, :]
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), t.randn(2, 4, 8), t.randn(2, n, 8),
             t.randn(2, n, 8), mask=keep, label="a (B, 1, 1, N_k) padding mask", **MHA)
    per_head = t.rand_bool(2, 4, n, n, p=0.6)
    per_head[..., 0] = True
    t.module("MultiHeadAttention", dict(d_model=16, num_heads=4), *_self(t, 2, n, 16), mask=per_head,
             label="a (B, h, N, N) mask, different for every head", **MHA)


@hidden.test("test_MultiHeadAttention_gradients")
def _(t):
    t.module("MultiHeadAttention", dict(d_model=8, num_heads=2), *_self(t, 2, 5, 8), grad=True,
             label="self-attention, gradients", **MHA)
    t.module("MultiHeadAttention", dict(d_model=12, num_heads=3), t.randn(2, 3, 12), t.randn(2, 5, 12),
             t.randn(2, 5, 12), mask=torch.ones(3, 5, dtype=torch.bool).tril(1), grad=True,
             label="cross-attention with a mask, gradients", **MHA)
