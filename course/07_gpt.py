# %% [markdown]
# # Chapter 7: Self-attention in a language model (GPT-2)
#
# Chapters 2 to 5 built every part of the Transformer: scaled dot-product attention, heads,
# positions, and the encoder and decoder stacks. Chapter 6 made attention cheaper. This
# chapter puts the pieces to work the way today's large language models do. A GPT
# ("generative pre-trained Transformer") is the Transformer's *decoder* alone, trained for
# one task: read some text and predict the next token. You will write it with the same
# parameter names as OpenAI's GPT-2, train a small one on text that every Python
# installation carries, make it generate text with greedy decoding and with sampling, make
# generation fast with a **key/value cache**, and finally load a GPT-2 checkpoint into your
# code and check that it computes exactly what the Hugging Face `transformers` library
# computes. The book is built without a network, so its pages show that check on a GPT-2
# with random weights made by `transformers`, and the cell that would load OpenAI's
# published weights only reports that it was skipped. Run the notebook on a machine that
# can reach huggingface.co, and the same cell downloads GPT-2 small (about 500 MB) and
# your own code continues a prompt with it (Section 10).
#
# **Learning goals.** After this chapter you can
#
# - say what a decoder-only model is, and why its self-attention must be causal; show by
#   experiment what happens when the mask is missing;
# - write the causal language-modelling loss with shifted targets, and read it as a
#   perplexity;
# - implement GPT-2's attention, block and model, including a key/value cache that lets
#   each generation step process only the newest token;
# - decode greedily, and sample with a temperature, top-$k$ and nucleus (top-$p$)
#   filtering, knowing what each one keeps;
# - measure what the cache saves and compute what it costs in memory for real models;
# - copy a GPT-2 checkpoint into your model (including the transposed weights) and prove
#   that your model is GPT-2.
#
# **Prerequisites.** Chapter 2 (scaled dot-product attention, the causal mask), Chapter 3
# (splitting heads), Chapter 5 (residual connections, layer normalisation, the decoder).
# Softmax and cross-entropy.
#
# **Time.** About 3 hours, of which about 2 minutes are training.
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `CausalSelfAttention(d_model, num_heads)` | GPT-2's masked multi-head self-attention, with a key/value cache | ★★★ | 6 |
# | `Block(d_model, num_heads)` | one pre-LN Transformer block: attention and MLP, each with a residual | ★ | 2 |
# | `GPT(vocab_size, max_len, d_model, num_heads, num_layers)` | embeddings, blocks, final norm and tied output layer | ★★ | 4 |
# | `filter_logits(logits, top_k=None, top_p=None)` | keep the top-$k$ tokens and/or the nucleus, set the rest to $-\infty$ | ★★ | 3 |
# | `generate(model, idx, max_new_tokens, use_cache=True)` | greedy decoding, with or without the cache | ★★ | 2 |
# | `load_gpt2_weights(model, state_dict)` | copy a GPT-2 checkpoint into your `GPT` | ★★ | 2 |

# %% [export]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# %%
import ast
import os
import pathlib
import socket
import sysconfig
import time
import urllib.parse

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

try:                      # Section 10 compares your model with Hugging Face's GPT-2
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel
    transformers.logging.set_verbosity_error()
except ImportError:
    transformers = None

try:                      # MyST-NB puts numbers computed here into the book's prose
    from myst_nb import glue
except ImportError:       # in plain Jupyter: just show them
    def glue(name, value, display=True):
        print(f"{name} = {value}")

torch.set_printoptions(precision=4, sci_mode=False)
# The models of this chapter are small: a second thread gains little and, on a machine
# shared with other programs, can make training several times slower.
torch.set_num_threads(1)

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# ## 1. GPT is a Transformer decoder, and nothing else
#
# The Transformer of Vaswani et al. (2017) has two stacks. The *encoder* reads the whole
# input with unmasked self-attention: every token sees every other token. The *decoder*
# writes the output one token at a time; its self-attention is **causal** (a token sees
# only itself and the tokens before it), and a second attention, *cross-attention*, reads
# the encoder's output.
#
# Radford et al. (2018, GPT) noticed that for plain text there is no separate input to
# encode: the text *is* the sequence being written. So they kept the decoder and dropped
# the encoder and the cross-attention. What remains is a stack of identical blocks, each
# with causal self-attention and a position-wise MLP. GPT-2 (Radford et al., 2019) moved
# the layer normalisations to the *start* of each sub-layer ("pre-LN") and added one more
# at the end; GPT-3 (Brown et al., 2020) kept that design at a much larger scale (175
# billion parameters, and some layers with sparse attention). The model you will build in
# this chapter is exactly GPT-2's:
#
# $$x^{(0)} = W_\text{te}[\text{idx}] + W_\text{pe}[\text{positions}] \in \mathbb{R}^{B\times N\times d},$$
#
# $$a^{(\ell)} = \operatorname{Attn}_\text{causal}\!\big(\operatorname{LN}_1(x^{(\ell-1)})\big),\quad
# h^{(\ell)} = x^{(\ell-1)} + a^{(\ell)},\quad
# x^{(\ell)} = h^{(\ell)} + \operatorname{MLP}\!\big(\operatorname{LN}_2(h^{(\ell)})\big),$$
#
# $$\text{logits} = \operatorname{LN}_f(x^{(L)})\, W_\text{te}^\top \in \mathbb{R}^{B\times N\times V},$$
#
# with $W_\text{te} \in \mathbb{R}^{V\times d}$ the token embedding (reused, "tied", as the
# output layer), $W_\text{pe} \in \mathbb{R}^{N_\text{max}\times d}$ a learned position
# embedding (Chapter 4), $d = d_\text{model}$, and $L$ blocks. The diagram shows the data
# flow and the shape at every step, with the parameter names of GPT-2's checkpoints.

# %% [tags=hide-input]
def draw_gpt_diagram():
    """Data flow of GPT-2, with the shape at each step (parameter names as in the checkpoints)."""
    text = {
        "title": "GPT-2: a stack of decoder blocks (no encoder, no cross-attention)",
        "idx": "token ids idx  (B, N)",
        "emb": "wte(idx) + wpe(P .. P+N-1)  (B, N, d)",
        "ln1": "ln_1",
        "attn": "attn: c_attn -> q, k, v  (B, h, N, d_head)\ncausal attention over past + new keys\nc_proj  (B, N, d)",
        "ln2": "ln_2",
        "mlp": "mlp: c_fc (B, N, 4d) -> GELU -> c_proj (B, N, d)",
        "lnf": "ln_f",
        "head": "lm_head = wte^T  ->  logits (B, N, V)",
        "block": "Block  x L",
        "cache_in": "past (k, v)\n(B, h, P, d_head)",
        "cache_out": "present (k, v)\n(B, h, P+N, d_head)",
        "add": "+",
    }
    fig, ax = plt.subplots(figsize=(9, 8.2))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 11)
    ax.axis("off")
    def box(x, y, w, h, label, color):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                    fc=color, ec="black", lw=1))
        ax.text(x, y, label, ha="center", va="center", fontsize=8.5)
    def arrow(x0, y0, x1, y1, style="-|>"):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=12, lw=1))
    ax.add_patch(FancyBboxPatch((1.2, 2.55), 6.6, 6.0, boxstyle="round,pad=0.1", fc="#f4f4f4",
                                ec="grey", ls="--"))
    ax.text(1.35, 8.35, text["block"], fontsize=10, weight="bold", color="dimgrey")
    box(4.5, 0.4, 3.2, 0.5, text["idx"], "#ffffff")
    box(4.5, 1.6, 4.6, 0.55, text["emb"], "#dbe9f6")
    box(4.5, 3.2, 1.2, 0.45, text["ln1"], "#fde9c9")
    box(4.5, 4.55, 4.8, 1.05, text["attn"], "#f9d3d3")
    box(4.5, 6.25, 1.2, 0.45, text["ln2"], "#fde9c9")
    box(4.5, 7.45, 4.8, 0.55, text["mlp"], "#d9efd9")
    box(4.5, 9.35, 1.2, 0.45, text["lnf"], "#fde9c9")
    box(4.5, 10.45, 4.6, 0.55, text["head"], "#dbe9f6")
    box(8.9, 4.95, 1.9, 0.75, text["cache_in"], "#ece4f7")
    box(8.9, 3.75, 1.9, 0.75, text["cache_out"], "#ece4f7")
    arrow(7.95, 4.95, 6.95, 4.8)
    arrow(6.95, 4.2, 7.95, 3.75)
    for y0, y1 in [(0.65, 1.32), (1.88, 2.97), (3.43, 4.02), (6.48, 7.17), (7.73, 9.12), (9.58, 10.17)]:
        arrow(4.5, y0, 4.5, y1)
    # residual paths
    for y_from, y_to, y_add in [(2.7, 5.55, 5.55), (5.75, 8.25, 8.25)]:
        ax.plot([4.5, 2.2, 2.2], [y_from, y_from, y_add], color="black", lw=1)
        arrow(2.2, y_add, 4.25, y_add)
        ax.add_patch(plt.Circle((4.5, y_add), 0.2, fc="white", ec="black"))
        ax.text(4.5, y_add, text["add"], ha="center", va="center", fontsize=11)
    arrow(4.5, 5.08, 4.5, 5.35)
    arrow(4.5, 5.75, 4.5, 6.02)
    ax.set_title(text["title"], fontsize=11)
    return fig

draw_gpt_diagram()
plt.show()

# %% [markdown]
# ```{admonition} Three claims to correct
# :class: warning
# A popular Chinese introduction to self-attention in large language models makes three
# mistakes that this chapter corrects:
#
# 1. *"GPT-3 style models usually use the encoder-decoder architecture."* They do not.
#    GPT-1, 2 and 3, and most later large language models (LLaMA, Mistral, ...), are
#    **decoder-only**. Encoder-decoder language models exist (T5, BART), but GPT is not
#    one of them.
# 2. *"GPT-2 stacks Transformer encoder blocks."* A GPT-2 block has no cross-attention,
#    which makes it look like an encoder block, but its self-attention is causally
#    masked, which makes it a decoder block. The mask is not a detail: it is what lets
#    the model be trained on every position of a text at once.
# 3. *Its GPT-2 attention code has no causal mask.* Without the mask, every position can
#    read the token it is asked to predict. Section 7 trains that model: its training
#    loss falls far below that of the correct model, and the text it generates is
#    nonsense.
# ```

# %% [markdown]
# ## 2. The task: predict the next token
#
# A language model assigns a probability to a text $t_1, \dots, t_T$ by the chain rule,
#
# $$p(t_1, \dots, t_T) = \prod_{i=1}^{T} p(t_i \mid t_1, \dots, t_{i-1}),$$
#
# and a GPT computes every factor in one pass. Feed it the tokens $t_1 \dots t_N$ as
# `idx` of shape $(B, N)$; the logits at position $i$, a vector of $V$ scores, give the
# distribution of the **next** token, $t_{i+1}$. So the targets are the inputs shifted by
# one: from a window of $N+1$ tokens of text, the input is the first $N$ and the target
# the last $N$. The loss is the average cross-entropy over all $B \times N$ positions,
#
# $$\mathcal{L} = -\frac{1}{BN}\sum_{b=1}^{B}\sum_{i=1}^{N}
# \log \operatorname{softmax}(\text{logits}_{b,i})_{\,y_{b,i}}, \qquad y_{b,i} = t_{b,i+1},$$
#
# and its exponential, the **perplexity** $e^{\mathcal{L}}$, is the number of equally
# likely tokens the model is, on average, hesitating between. A model that knows nothing
# and spreads its probability evenly over $V$ tokens has $\mathcal{L} = \log V$ and a
# perplexity of exactly $V$.
#
# One forward pass thus yields $N$ training examples per sequence, *provided* position
# $i$ cannot see tokens after $i$: otherwise the answer $t_{i+1}$ is among its inputs.
# That is the job of the causal mask. Here is the shift on a short string, with
# characters as tokens:

# %%
example = "attention"
print("input :", list(example[:-1]))
print("target:", list(example[1:]))
V_demo = 96
print(f"uniform model over {V_demo} tokens: loss = log {V_demo} = {math.log(V_demo):.3f}, "
      f"perplexity = {math.exp(math.log(V_demo)):.0f}")
# %% [markdown]
# ## 3. Causal self-attention, with a key/value cache
#
# GPT-2's attention layer is Chapter 3's multi-head attention with three particular
# choices:
#
# - **One projection for q, k and v.** `c_attn = nn.Linear(d, 3d)` computes all three at
#   once: its output's first $d$ features are the queries, the next $d$ the keys, the
#   last $d$ the values. Head $i$ uses features $i\,d_\text{head}$ to $(i+1)\,d_\text{head}-1$
#   of each, $d_\text{head} = d / h$, and `c_proj = nn.Linear(d, d)` mixes the
#   concatenated heads, as $W^O$ did.
# - **A causal mask** (Chapter 2): the query at position $p$ may attend to the keys at
#   positions $\le p$.
# - **A cache.** The layer returns, instead of its attention weights, the keys and values
#   it used, so that a later call can reuse them.
#
# Why a cache? When a model generates text, step $s$ appends one token and runs the
# model again. Without a cache it recomputes the keys and values of all earlier tokens,
# although they have not changed: causal attention guarantees that a token's keys and
# values depend only on the tokens before it. With a cache, each step feeds only the new
# token, computes its query, key and value, and attends to the stored keys and values
# plus its own. Section 9 measures the difference.
#
# So `forward(x, past=None)` receives $N$ new tokens, and optionally
# `past = (k_past, v_past)`, each $(B, h, P, d_\text{head})$, from earlier calls on the
# $P$ tokens before them. The new tokens sit at positions $P, \dots, P+N-1$:
#
# $$K = \big[K_\text{past};\ K_\text{new}\big],\quad V = \big[V_\text{past};\ V_\text{new}\big]
# \in \mathbb{R}^{B\times h\times (P+N)\times d_\text{head}},\qquad
# S = \frac{Q_\text{new} K^\top}{\sqrt{d_\text{head}}} \in \mathbb{R}^{B\times h\times N\times (P+N)},$$
#
# $$M_{ij} = \big[\,j \le P + i\,\big] \quad (i < N,\ j < P+N),\qquad
# y = \operatorname{Concat}_{\text{heads}}\big(\operatorname{softmax}(S \text{ masked by } M)\, V\big)\, W_\text{c\_proj}.$$
#
# The mask is an $N \times (P+N)$ grid, not a square: new token $i$ sees all $P$ cached
# keys and the new keys up to itself. With $P = 0$ it is the familiar lower triangle.
# The layer returns `(y, present)` with `present = (K, V)`: the past followed by the new
# keys and values, ready to be passed as `past` in the next call. The picture shows the
# mask for $P = 5$ cached tokens and $N = 3$ new ones.

# %% [tags=hide-input]
def draw_cache_mask(P=5, N=3):
    text = {"title": f"Causal mask with a cache: N = {N} new queries, P = {P} cached keys",
            "x": "key position j (cached: 0 .. P-1, new: P .. P+N-1)",
            "y": "new query i (position P + i)", "past": "cached keys", "new": "new keys",
            "legend": ["hidden (-inf)", "may attend"]}
    mask = torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P)
    fig, ax = plt.subplots(figsize=(7, 2.8))
    ax.imshow(mask, cmap="Blues", vmin=-0.3, vmax=1.2)
    ax.axvline(P - 0.5, color="black", lw=2)
    ax.set_xticks(range(P + N))
    ax.set_yticks(range(N), [f"{i} (pos {P + i})" for i in range(N)])
    top = ax.secondary_xaxis("top")   # the groups' names: matplotlib then puts the title above them
    top.set_xticks([(P - 1) / 2, P + (N - 1) / 2], [text["past"], text["new"]])
    top.tick_params(length=0, labelsize=9)
    for i in range(N):
        for j in range(P + N):
            ax.text(j, i, "1" if mask[i, j] else "0", ha="center", va="center", fontsize=8)
    ax.set_xlabel(text["x"])
    ax.set_ylabel(text["y"])
    ax.set_title(text["title"], fontsize=10)
    fig.tight_layout()
    return fig

draw_cache_mask()
plt.show()

# %% [markdown]
# ### Exercise: `CausalSelfAttention`
#
# Write `forward`. The `__init__` is given, with GPT-2's names. Keep the heads as a batch
# dimension, as in Chapter 3: `(B, N, d)` → `(B, N, h, d_head)` → `transpose(1, 2)`.
# Do not call `F.scaled_dot_product_attention` (the grader checks): compute the scores
# and the mask yourself; `torch.softmax` (or `F.softmax`) is the right tool for the
# softmax. A row of scores always has at least one visible key (its own), so filling
# masked scores with `float("-inf")` is safe here.
#
# ```{dropdown} Hint: splitting q, k and v
# `self.c_attn(x).split(d_model, dim=-1)` returns the three slices in order. Then
# `q.view(B, N, h, d_head).transpose(1, 2)`, and the same for k and v.
# ```
#
# ```{dropdown} Hint: the mask with a cache
# Concatenate along the position axis, `torch.cat([k_past, k], dim=2)`, so that
# `P = k.size(2) - N` after it. `torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P)`
# is True exactly where $j \le P + i$. A mask built as `tril()` of an $(N, P+N)$ grid
# without `diagonal=P` hides the cached keys from the first new tokens: correct without a
# cache, wrong with one.
# ```

# %% [exercise CausalSelfAttention]
class CausalSelfAttention(nn.Module):
    """GPT-2's masked multi-head self-attention, with a key/value cache."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)   # q, k, v for all heads, in that order
        self.c_proj = nn.Linear(d_model, d_model)       # mixes the concatenated heads

    def forward(self, x, past=None):
        """Causal self-attention over the cached tokens and the N new ones.

        Args:
            x: (B, N, d_model) float tensor, the N new tokens (positions P .. P+N-1).
            past: None (P = 0), or a pair (k_past, v_past), each of shape
                (B, num_heads, P, d_head), d_head = d_model // num_heads, the keys
                and values of the P earlier tokens (what earlier calls returned as
                `present`).

        q, k, v are the three consecutive d_model-wide slices of self.c_attn(x), in
        that order; head i uses features i*d_head:(i+1)*d_head of each. Scores are
        scaled by 1/sqrt(d_head); the query at position p attends to every key at a
        position <= p, cached or new. The heads are concatenated in order and passed
        through self.c_proj. Works in float32 and float64 (keep the input's dtype).

        Returns:
            (y, present): y of shape (B, N, d_model); present = (k_all, v_all), each
            (B, num_heads, P + N, d_head): the past followed by the new keys/values.
        """
        ### BEGIN SOLUTION
        B, N, C = x.shape
        h = self.num_heads
        d_head = C // h
        q, k, v = self.c_attn(x).split(C, dim=-1)                  # (B, N, d) each
        q = q.view(B, N, h, d_head).transpose(1, 2)                # (B, h, N, d_head)
        k = k.view(B, N, h, d_head).transpose(1, 2)
        v = v.view(B, N, h, d_head).transpose(1, 2)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)                     # (B, h, P+N, d_head)
            v = torch.cat([past[1], v], dim=2)
        P = k.size(2) - N
        scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)       # (B, h, N, P+N)
        mask = torch.ones(N, P + N, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = (weights @ v).transpose(1, 2).reshape(B, N, C)         # heads concatenated in order
        return self.c_proj(y), (k, v)
        ### END SOLUTION


# %% [test test_CausalSelfAttention_shapes points=1]
"""Output (B, N, d_model); present = (k, v), each (B, h, P + N, d_head), with and without a cache."""
torch.manual_seed(0)
cs = CausalSelfAttention(d_model=16, num_heads=4)
cs_x = torch.randn(2, 5, 16)
cs_out = cs(cs_x)
assert isinstance(cs_out, tuple) and len(cs_out) == 2, \
    "forward must return a pair (y, present), as GPT-2 does (not the attention weights)"
cs_y, cs_present = cs_out
assert cs_y.shape == (2, 5, 16), f"y should be (B, N, d_model) = (2, 5, 16), got {tuple(cs_y.shape)}"
assert len(cs_present) == 2 and cs_present[0].shape == (2, 4, 5, 4) and cs_present[1].shape == (2, 4, 5, 4), \
    "present should be (k, v), each (B, h, N, d_head) = (2, 4, 5, 4) without a cache"
cs_y2, cs_present2 = cs(torch.randn(2, 3, 16), past=cs_present)
assert cs_y2.shape == (2, 3, 16), f"with a cache y is still (B, N_new, d_model) = (2, 3, 16), got {tuple(cs_y2.shape)}"
assert cs_present2[0].shape == (2, 4, 8, 4), \
    f"with 5 cached and 3 new tokens, present keys should be (2, 4, 8, 4), got {tuple(cs_present2[0].shape)}: concatenate past and new on dim 2"

# %% [test test_CausalSelfAttention_no_cache points=2]
"""Without a cache: q, k, v slices in order, heads, 1/sqrt(d_head), causal mask, c_proj."""
torch.manual_seed(1)
cn = CausalSelfAttention(d_model=12, num_heads=3)
cn_x = torch.randn(2, 6, 12)
cn_y, (cn_k, cn_v) = cn(cn_x)
with torch.no_grad():
    cn_q_all, cn_k_all, cn_v_all = cn.c_attn(cn_x).split(12, dim=-1)         # (B, N, 12) each
    cn_heads = []
    for i in range(3):                                                     # the formula, head by head
        sl = slice(4 * i, 4 * (i + 1))
        s = cn_q_all[..., sl] @ cn_k_all[..., sl].transpose(-2, -1) / math.sqrt(4)
        s = s.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
        cn_heads.append(torch.softmax(s, dim=-1) @ cn_v_all[..., sl])
    cn_expected = cn.c_proj(torch.cat(cn_heads, dim=-1))
assert torch.allclose(cn_k, cn_k_all.view(2, 6, 3, 4).transpose(1, 2), atol=1e-6), \
    "present keys differ from the second d_model slice of c_attn(x), split into heads: q, k, v are sliced in that order"
assert torch.allclose(cn_v, cn_v_all.view(2, 6, 3, 4).transpose(1, 2), atol=1e-6), \
    "present values differ from the third d_model slice of c_attn(x), split into heads (view (B, N, h, d_head), then transpose(1, 2))"
cn_x2 = cn_x.clone()
cn_x2[:, 4:] = torch.randn(2, 2, 12)
assert torch.allclose(cn(cn_x2)[0][:, :4], cn_y[:, :4], atol=1e-5), \
    "no causal mask: outputs 0..3 changed when only tokens 4 and 5 changed; hide keys at later positions"
assert torch.allclose(cn_y, cn_expected, atol=1e-5), \
    "y differs from c_proj(Concat_i softmax(q_i k_i^T / sqrt(d_head) + causal mask) v_i): check the scale (d_head, not d_model) and the head order"
cn64 = CausalSelfAttention(8, 2).double()
assert cn64(torch.randn(1, 3, 8, dtype=torch.float64))[0].dtype == torch.float64, "keep the input's dtype (float64 in, float64 out)"

# %% [test test_CausalSelfAttention_cache points=3]
"""With a cache: calling on a prefix, then on the rest with the returned present, equals one call on everything."""
torch.manual_seed(2)
cc = CausalSelfAttention(d_model=16, num_heads=4)
cc_x = torch.randn(3, 7, 16)
with torch.no_grad():
    cc_full, (cc_k_full, cc_v_full) = cc(cc_x)
    cc_a, cc_pa = cc(cc_x[:, :4])                      # 4 tokens, no cache
    cc_b, cc_pb = cc(cc_x[:, 4:5], past=cc_pa)          # 1 new token, 4 cached
    cc_c, cc_pc = cc(cc_x[:, 5:], past=cc_pb)           # 2 new tokens, 5 cached
assert cc_pb[0].shape == (3, 4, 5, 4), \
    f"present after 4 + 1 tokens should be (B, h, 5, d_head) = (3, 4, 5, 4), got {tuple(cc_pb[0].shape)}"
assert torch.allclose(cc_pc[0], cc_k_full, atol=1e-5) and torch.allclose(cc_pc[1], cc_v_full, atol=1e-5), \
    "present after three calls differs from the keys/values of one call: present must be the past FOLLOWED by the new keys (torch.cat([k_past, k], dim=2))"
assert torch.allclose(cc_b, cc_full[:, 4:5], atol=1e-5), \
    "one new token with a cache of 4 differs from position 4 of the full call: the new token must attend to every cached key and to itself"
assert torch.allclose(cc_c[:, 0], cc_full[:, 5], atol=1e-5), \
    "the first of 2 new tokens (cache of 5) differs from position 5 of the full call: the mask must let it see the 5 cached keys (tril(diagonal=P) on an (N, P+N) grid)"
assert torch.allclose(cc_c, cc_full[:, 5:], atol=1e-5), \
    "several new tokens with a cache: each may attend to the cached keys and to the new keys up to itself, not beyond"

# %% [markdown]
# The tests of `Block`, `GPT` and `generate` run your earlier classes too. So that a
# mistake in one of them is not blamed on the exercise under test, each of these tests
# first checks the parts it uses on a small case, with the given function below, and
# if one is wrong says which exercise to fix first. (The grader grades every exercise
# on its own, with correct versions of the others.)

# %% [export tags=hide-input]
def check_parts_first(*names):
    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""
    with torch.random.fork_rng(), torch.no_grad():          # the test's own random numbers stay the same
        torch.manual_seed(0)
        x = torch.randn(2, 5, 8)
        for name in names:
            try:
                _check_part(name, x)
            except NotImplementedError:
                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None


def _check_part(name, x):
    if name == "CausalSelfAttention":
        attn = CausalSelfAttention(8, 2)
        q, k, v = attn.c_attn(x).split(8, dim=-1)
        heads = []
        for i in range(2):                                  # the formula, head by head, no cache
            sl = slice(4 * i, 4 * (i + 1))
            s = q[..., sl] @ k[..., sl].transpose(-2, -1) / 2.0
            s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
            heads.append(torch.softmax(s, dim=-1) @ v[..., sl])
        y, present = attn(x)
        assert torch.allclose(y, attn.c_proj(torch.cat(heads, dim=-1)), atol=1e-5), \
            "fix `CausalSelfAttention` first: without a cache its output differs from the formula, and this test uses it"
        y_cached, _ = attn(x[:, 3:], tuple(t[:, :, :3] for t in present))
        assert torch.allclose(y_cached, y[:, 3:], atol=1e-5), \
            "fix `CausalSelfAttention` first: with a cache its output differs from one call on all tokens, and this test uses it"
    elif name == "Block":
        block = Block(8, 2)
        a, _ = block.attn(block.ln_1(x))
        h = x + a
        y, present = block(x)
        assert torch.allclose(y, h + block.mlp(block.ln_2(h)), atol=1e-5), \
            "fix `Block` first: its output differs from h + mlp(ln_2(h)), h = x + attn(ln_1(x)), and this test uses it"
        y_cached, _ = block(x[:, 3:], tuple(t[:, :, :3] for t in present))
        assert torch.allclose(y_cached, y[:, 3:], atol=1e-5), \
            "fix `Block` first: with a cache its output differs from one call on all tokens, and this test uses it"
    elif name == "GPT":
        gpt = GPT(vocab_size=7, max_len=8, d_model=8, num_heads=2, num_layers=2)
        idx = torch.randint(0, 7, (2, 6))
        logits, presents = gpt(idx)
        h = gpt.wte(idx) + gpt.wpe.weight[:6]
        for block in gpt.blocks:
            h, _ = block(h)
        assert torch.allclose(logits, gpt.lm_head(gpt.ln_f(h)), atol=1e-5), \
            "fix `GPT` first: its logits differ from lm_head(ln_f(blocks(wte(idx) + wpe(0..N-1)))), and this test uses it"
        cached, _ = gpt(idx[:, 4:], [tuple(t[:, :, :4] for t in p) for p in presents])
        assert torch.allclose(cached, logits[:, 4:], atol=1e-5), \
            "fix `GPT` first: with a cache its logits differ from one call on all tokens, and this test uses it"


# %% [markdown]
# ## 4. The block
#
# GPT-2's MLP widens each token's vector to $4d$, applies the GELU non-linearity
# (Hendrycks and Gimpel, 2016) in its tanh approximation, which GPT-2 used, and
# projects back:
#
# $$\operatorname{MLP}(x) = \operatorname{GELU}_\text{tanh}(x W_\text{fc} + b_\text{fc})\, W_\text{proj} + b_\text{proj},
# \qquad W_\text{fc} \in \mathbb{R}^{d\times 4d},\ W_\text{proj} \in \mathbb{R}^{4d\times d}.$$
#
# It works on each position separately; all mixing between positions happens in the
# attention. It is given:

# %% [export]
class MLP(nn.Module):
    """Given: GPT-2's position-wise feed-forward network, d -> 4d -> GELU (tanh) -> d."""

    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):                      # (..., d_model) -> (..., d_model)
        return self.c_proj(self.gelu(self.c_fc(x)))


# %% [markdown]
# A block normalises *before* each sub-layer and adds the sub-layer's output to its
# input (pre-LN, Chapter 5):
#
# $$h = x + \operatorname{Attn}(\operatorname{LN}_1(x)), \qquad x' = h + \operatorname{MLP}(\operatorname{LN}_2(h)).$$
#
# The residual stream $x$ itself is never normalised inside a block, so a signal can pass
# from the embedding to the output through the additions alone; this is what makes deep
# pre-LN stacks easy to train (Xiong et al., 2020). The block passes the cache through: it
# hands `past` to its attention and returns the attention's `present`.
#
# ### Exercise: `Block`

# %% [exercise Block]
class Block(nn.Module):
    """One GPT-2 block: pre-LN causal self-attention and MLP, each with a residual."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, num_heads)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x, past=None):
        """x: (B, N, d_model); past: None or this block's (k_past, v_past).

        a, present = attn(ln_1(x), past); x = x + a; x = x + mlp(ln_2(x)).

        Returns (x, present): x of shape (B, N, d_model), present as returned by
        self.attn.
        """
        ### BEGIN SOLUTION
        a, present = self.attn(self.ln_1(x), past)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, present
        ### END SOLUTION


# %% [test test_Block points=2]
"""Pre-LN: x + attn(ln_1(x)), then + mlp(ln_2(.)); the cache goes through to the attention."""
check_parts_first("CausalSelfAttention")
torch.manual_seed(3)
bl = Block(d_model=8, num_heads=2)
with torch.no_grad():                      # non-default norms, so that a swapped LayerNorm shows
    for bl_p in [bl.ln_1.weight, bl.ln_1.bias, bl.ln_2.weight, bl.ln_2.bias]:
        bl_p.copy_(torch.randn_like(bl_p))
bl_x = torch.randn(2, 5, 8)
with torch.no_grad():
    bl_y, bl_present = bl(bl_x)
    bl_a, bl_attn_present = bl.attn(bl.ln_1(bl_x))
    bl_h = bl_x + bl_a
    bl_expected = bl_h + bl.mlp(bl.ln_2(bl_h))
    bl_post = bl.ln_2(bl.ln_1(bl_x + bl_a) + bl.mlp(bl.ln_1(bl_x + bl_a)))
assert bl_y.shape == (2, 5, 8), f"x should keep its shape (2, 5, 8), got {tuple(bl_y.shape)}"
assert not torch.allclose(bl_y, bl_post, atol=1e-5), "post-LN: GPT-2 normalises the input of each sub-layer, not the sum"
assert torch.allclose(bl_y, bl_expected, atol=1e-5), \
    "x differs from h + mlp(ln_2(h)) with h = x + attn(ln_1(x)): check the residuals and which LayerNorm goes where"
assert torch.allclose(bl_present[0], bl_attn_present[0]), "return the attention's present (its keys and values)"
with torch.no_grad():
    bl_y2, _ = bl(bl_x[:, 3:], past=tuple(t[:, :, :3] for t in bl_present))
assert torch.allclose(bl_y2, bl_y[:, 3:], atol=1e-5), "pass past on to self.attn: with the cache of tokens 0..2, tokens 3..4 must give the same output"

# %% [markdown]
# ## 5. The model
#
# `GPT` adds the token and position embeddings, runs the blocks in order, normalises once
# more (`ln_f`) and maps each position to $V$ logits with `lm_head`, a linear layer
# without bias whose weight **is** the token embedding matrix (`self.lm_head.weight =
# self.wte.weight`, Press and Wolf, 2017). A token's input vector and its output scores
# then share one set of parameters: for GPT-2 that saves $V d \approx 38.6$ million
# parameters, almost a third of the model.
#
# With a cache, `past` is a list with one `(k, v)` pair per block, and the new tokens'
# positions start at the cached length $P$ (read it from the shape of any cached key):
# the $N$ new tokens get position embeddings $P, \dots, P+N-1$. The forward returns the
# logits and the list of the blocks' presents.
#
# ### Exercise: `GPT`

# %% [exercise GPT]
class GPT(nn.Module):
    """A GPT-2 language model: embeddings, blocks, final LayerNorm, tied output layer."""

    def __init__(self, vocab_size, max_len, d_model, num_heads, num_layers):
        super().__init__()
        self.max_len = max_len
        self.wte = nn.Embedding(vocab_size, d_model)     # token embedding
        self.wpe = nn.Embedding(max_len, d_model)        # position embedding
        self.blocks = nn.ModuleList(Block(d_model, num_heads) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight           # tied: one matrix, two uses

    def forward(self, idx, past=None):
        """idx: (B, N) long token ids; past: None, or a list with one (k, v) pair per
        block, each (B, num_heads, P, d_head), from earlier calls. P + N <= max_len.

        x = wte(idx) + wpe(positions), positions P .. P+N-1 (P = 0 without a cache);
        then every block in order (block i gets past[i]); then ln_f and lm_head.

        Returns (logits, presents): logits (B, N, vocab_size), presents the list of
        the blocks' presents, in order.
        """
        ### BEGIN SOLUTION
        B, N = idx.shape
        P = 0 if past is None else past[0][0].size(2)
        pos = torch.arange(P, P + N, device=idx.device)           # (N,)
        x = self.wte(idx) + self.wpe(pos)                          # (B, N, d)
        presents = []
        for i, block in enumerate(self.blocks):
            x, present = block(x, None if past is None else past[i])
            presents.append(present)
        return self.lm_head(self.ln_f(x)), presents               # (B, N, V)
        ### END SOLUTION


# %% [test test_GPT_no_cache points=2]
"""Without a cache: embeddings of tokens and positions 0..N-1, the blocks, ln_f, tied lm_head."""
check_parts_first("CausalSelfAttention", "Block")
torch.manual_seed(4)
gm = GPT(vocab_size=11, max_len=16, d_model=8, num_heads=2, num_layers=2)
gm_idx = torch.randint(0, 11, (2, 6))
gm_out = gm(gm_idx)
assert isinstance(gm_out, tuple) and len(gm_out) == 2, "forward must return (logits, presents)"
gm_logits, gm_presents = gm_out
assert gm_logits.shape == (2, 6, 11), f"logits should be (B, N, vocab_size) = (2, 6, 11), got {tuple(gm_logits.shape)}"
assert len(gm_presents) == 2 and gm_presents[1][0].shape == (2, 2, 6, 4), \
    "presents should hold one (k, v) per block, each (B, h, N, d_head) = (2, 2, 6, 4)"
with torch.no_grad():
    gm_x = gm.wte(gm_idx) + gm.wpe.weight[:6]
    for gm_b in gm.blocks:
        gm_x, _ = gm_b(gm_x)
    gm_expected = gm.ln_f(gm_x) @ gm.wte.weight.T
    gm_no_lnf = gm_x @ gm.wte.weight.T
assert not torch.allclose(gm_logits, gm_no_lnf, atol=1e-5), "ln_f forgotten: normalise after the last block"
assert torch.allclose(gm_logits, gm_expected, atol=1e-5), \
    "logits differ from lm_head(ln_f(blocks(wte(idx) + wpe(0..N-1)))): are the position embeddings added, and the blocks run in order?"

# %% [test test_GPT_cache points=2]
"""With a cache: positions continue at P, each block gets its own past, presents grow to P + N."""
check_parts_first("CausalSelfAttention", "Block")
torch.manual_seed(5)
gc = GPT(vocab_size=13, max_len=16, d_model=8, num_heads=2, num_layers=3)
gc_idx = torch.randint(0, 13, (2, 9))
with torch.no_grad():
    gc_full, _ = gc(gc_idx)
    gc_a, gc_pa = gc(gc_idx[:, :5])
    gc_b, gc_pb = gc(gc_idx[:, 5:6], gc_pa)
    gc_c, gc_pc = gc(gc_idx[:, 6:], gc_pb)
assert len(gc_pc) == 3 and gc_pc[2][1].shape == (2, 2, 9, 4), \
    "after 5 + 1 + 3 tokens each block's present should be (B, h, 9, d_head) = (2, 2, 9, 4)"
assert torch.allclose(gc_b, gc_full[:, 5:6], atol=1e-5), \
    "one new token with a cache of 5 differs from position 5 of the full call: do its positions restart at 0? they start at P = past[0][0].size(2)"
assert torch.allclose(gc_c, gc_full[:, 6:], atol=1e-5), \
    "three new tokens with a cache of 6 differ from the full call: block i must receive past[i], and positions must be P .. P+N-1"
# %% [markdown]
# Before training anything, count parameters. The formula for a GPT with tied embeddings
# is $V d + N_\text{max} d + L\,(12 d^2 + 13 d) + 2d$: each block holds $3d^2 + 3d$ in
# `c_attn`, $d^2 + d$ in `c_proj`, $8d^2 + 5d$ in the MLP and $4d$ in its two
# LayerNorms. For GPT-2's smallest size ($V = 50257$, $N_\text{max} = 1024$, $d = 768$,
# $h = 12$, $L = 12$) your class gives the "124M" of its name:

# %%
def gpt_params(V, n_max, d, L):
    return V * d + n_max * d + L * (12 * d * d + 13 * d) + 2 * d

with torch.device("meta"):                      # shapes only: no memory, no time
    gpt2_small = GPT(vocab_size=50257, max_len=1024, d_model=768, num_heads=12, num_layers=12)
n_gpt2 = sum(p.numel() for p in gpt2_small.parameters())   # a tied weight is counted once
print(f"GPT-2 small: {n_gpt2:,} parameters (formula: {gpt_params(50257, 1024, 768, 12):,})")
glue("n_gpt2", f"{n_gpt2:,}", display=False)

# %% [markdown]
# ## 6. Training a character-level GPT on Python's own documentation
#
# Every Python installation carries a few megabytes of English prose: the documentation
# strings of its standard library. We read them from the modules' source files with the
# `ast` module (nothing is downloaded), keep printable ASCII, and use **characters** as
# tokens, as Karpathy's char-rnn and nanoGPT's Shakespeare example do. The vocabulary is
# then about a hundred symbols instead of GPT-2's 50,257 sub-word pieces, and a small
# model learns the look of the text in {glue:text}`train_seconds` seconds of training on
# one CPU thread (when this book was built). The exact text, and so the numbers below,
# depend a little on the Python version.

# %% [name=docstring_corpus tags=hide-input]
STDLIB_MODULES = ["argparse", "calendar", "collections/__init__", "csv", "datetime", "difflib", "fractions",
                  "functools", "heapq", "inspect", "json/__init__", "logging/__init__", "pathlib", "random",
                  "shutil", "statistics", "string", "textwrap", "threading", "typing", "zipfile", "pprint",
                  "_pydecimal", "email/message", "subprocess", "tarfile", "unittest/case", "os"]


def stdlib_docstrings(modules=STDLIB_MODULES):
    """The docstrings of some standard-library modules, read from this interpreter's own files."""
    lib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for name in modules:
        path = lib / f"{name}.py"
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(doc)
    text = "\n\n".join(docs)
    return "".join(c for c in text if c == "\n" or 32 <= ord(c) < 127)


corpus = stdlib_docstrings()
chars = sorted(set(corpus))
stoi = {c: i for i, c in enumerate(chars)}


def encode(s):
    return torch.tensor([stoi[c] for c in s if c in stoi], dtype=torch.long)


def decode(ids):
    return "".join(chars[i] for i in ids)


data = encode(corpus)
n_train = int(0.9 * len(data))
train_data, val_data = data[:n_train], data[n_train:]
print(f"{len(corpus):,} characters, vocabulary of {len(chars)}; "
      f"{len(train_data):,} for training, {len(val_data):,} for validation")
print(corpus[20000:20400])

# %% [markdown]
# The model: $d = 64$, $h = 4$ heads, $L = 2$ blocks, a context of $N_\text{max} = 64$
# characters. GPT-2 initialises the weight matrices and embeddings from
# $\mathcal{N}(0, 0.02^2)$ and the biases at zero, except the two matrices that write into
# the residual stream, `attn.c_proj` and `mlp.c_proj`: Radford et al. (2019) scale the
# weights of these residual layers by $1/\sqrt{N}$, $N = 2L$ being the number of residual
# layers, so that the sum of $2L$ contributions to the residual stream does not grow with
# depth. nanoGPT and Hugging Face's `GPT2LMHeadModel` draw them from
# $\mathcal{N}(0, (0.02/\sqrt{2L})^2)$, and so do we. Batches are random windows of 65
# characters: the first 64 are the input, the last 64 the targets (Section 2). AdamW with
# a one-cycle learning rate schedule, gradient clipping, fixed seeds.

# %%
CONFIG = dict(vocab_size=len(chars), max_len=64, d_model=64, num_heads=4, num_layers=2)
STEPS, BATCH = 1200, 32


def init_gpt2_(model):
    """GPT-2's initialisation: N(0, 0.02) for weight matrices and embeddings, N(0, 0.02 / sqrt(2L)) for
    the residual projections (c_proj), zero biases, unit LayerNorms."""
    residual_std = 0.02 / math.sqrt(2 * len(model.blocks))       # 2L residual layers
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = residual_std if name.endswith("c_proj") else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
    return model


def get_batch(split_data, batch_size, n, generator):
    starts = torch.randint(len(split_data) - n - 1, (batch_size,), generator=generator)
    window = torch.stack([split_data[s:s + n + 1] for s in starts.tolist()])   # (B, n+1)
    return window[:, :-1], window[:, 1:]                                        # inputs, shifted targets


def lm_loss(model, x, y):
    logits, _ = model(x)                                                        # (B, N, V)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


@torch.no_grad()
def evaluate(model, split_data, batches=20, seed=123):
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    losses = [lm_loss(model, *get_batch(split_data, BATCH, model.max_len, gen)).item() for _ in range(batches)]
    model.train()
    return sum(losses) / len(losses)


def train_gpt(model, steps=STEPS, lr=3e-3, seed=0, log_every=50):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    history = []
    model.train()
    for step in range(steps):
        x, y = get_batch(train_data, BATCH, model.max_len, gen)
        loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            history.append((step, loss.item()))
    model.eval()
    return history


@torch.no_grad()
def sample_text(model, prompt, n, temperature=1.0, top_k=None, top_p=None, seed=0, filter_fn=None):
    """Sample n characters after prompt (no cache: the context window slides past max_len)."""
    gen = torch.Generator().manual_seed(seed)
    idx = encode(prompt)[None]
    for _ in range(n):
        logits, _ = model(idx[:, -model.max_len:])
        logits = logits[:, -1] / temperature
        if filter_fn is not None:
            logits = filter_fn(logits, top_k=top_k, top_p=top_p)
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)
        idx = torch.cat([idx, nxt], dim=1)
    return decode(idx[0].tolist())

# %% [markdown]
# Samples from the untrained model are uniform noise over the vocabulary, and its loss is
# that of the uniform model, $\log V$:

# %%
torch.manual_seed(0)
model = init_gpt2_(GPT(**CONFIG))
PROMPT = "Return the "
n_model = sum(p.numel() for p in model.parameters())
print(f"parameters: {n_model:,}")
glue("n_model", f"{n_model:,}", display=False)
glue("gpt2_ratio", f"{n_gpt2 / n_model:,.0f}", display=False)
loss_before = evaluate(model, val_data)
print(f"validation loss before training: {loss_before:.3f}   (log V = {math.log(len(chars)):.3f})")
print("sample before training:\n", sample_text(model, PROMPT, 200))

# %%
started = time.perf_counter()
history = train_gpt(model)
train_seconds = time.perf_counter() - started
val_loss = evaluate(model, val_data)
train_loss = evaluate(model, train_data)
print(f"trained {STEPS} steps in {train_seconds:.0f} s; loss: train {train_loss:.3f}, "
      f"validation {val_loss:.3f} (perplexity {math.exp(val_loss):.2f})")
glue("train_seconds", f"{train_seconds:.0f}", display=False)
glue("val_loss", f"{val_loss:.2f}", display=False)
glue("val_ppl", f"{math.exp(val_loss):.1f}", display=False)
glue("uniform_ppl", f"{len(chars)}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Training a character-level GPT on standard-library docstrings",
            "x": "training step", "y": "cross-entropy loss (nats per character)",
            "train": "training batch", "val": "validation (after training)", "uniform": "uniform model, log V"}
fig, ax = plt.subplots(figsize=(7, 3.6))
steps_logged, losses_logged = zip(*history)
ax.plot(steps_logged, losses_logged, label=fig_text["train"])
ax.axhline(val_loss, color="C1", ls="--", label=fig_text["val"])
ax.axhline(math.log(len(chars)), color="grey", ls=":", label=fig_text["uniform"])
ax.set_xlabel(fig_text["x"])
ax.set_ylabel(fig_text["y"])
ax.set_title(fig_text["title"], fontsize=10)
ax.legend()
fig.tight_layout()
plt.show()

# %%
print(sample_text(model, PROMPT, 300, temperature=0.8, seed=1))

# %% [markdown]
# In {glue:text}`train_seconds` seconds of training the validation loss falls to
# {glue:text}`val_loss` nats per character, a perplexity of {glue:text}`val_ppl` against
# {glue:text}`uniform_ppl` for the uniform model. The sample has learned the look of the
# docstrings: words separated by spaces, capitalised sentences, indentation, parameter
# names and parentheses, mostly real short English words and many invented long ones. A
# model this small ({glue:text}`n_model` parameters), with a context of 64 characters,
# cannot keep a sentence's meaning; GPT-2 small has {glue:text}`gpt2_ratio` times as many
# parameters and was trained on 40 GB of text (Radford et al., 2019).
# %% [markdown]
# ## 7. Experiment: the same model without the causal mask
#
# Now the model of Section 1's third claim: the same GPT, the same data, seed and
# optimiser, but attention that lets every position see every other position. The class
# below is your attention layer with the mask line removed.

# %%
class UnmaskedSelfAttention(CausalSelfAttention):
    """CausalSelfAttention WITHOUT the causal mask (wrong for a language model, on purpose)."""

    def forward(self, x, past=None):
        B, N, C = x.shape
        h, d_head = self.num_heads, C // self.num_heads
        q, k, v = (t.view(B, N, h, d_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=-1))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d_head), dim=-1)   # no mask
        return self.c_proj((weights @ v).transpose(1, 2).reshape(B, N, C)), (k, v)


torch.manual_seed(0)
unmasked = init_gpt2_(GPT(**CONFIG))
for block in unmasked.blocks:
    block.attn.__class__ = UnmaskedSelfAttention        # same parameters, no mask
NOMASK_STEPS = STEPS                                   # the same schedule as the masked model
history_unmasked = train_gpt(unmasked, steps=NOMASK_STEPS)


@torch.no_grad()
def last_position_loss(model, split_data, batches=20, seed=123):
    """Loss at the last position of each window only: there, no later token exists to be read."""
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(batches):
        x, y = get_batch(split_data, BATCH, model.max_len, gen)
        logits, _ = model(x)
        losses.append(F.cross_entropy(logits[:, -1], y[:, -1]).item())
    return sum(losses) / len(losses)


nomask_val = evaluate(unmasked, val_data)
nomask_last = last_position_loss(unmasked, val_data)
masked_last = last_position_loss(model, val_data)
print(f"without mask: validation loss {nomask_val:.3f} over all positions, "
      f"{nomask_last:.3f} at the last position (the only one used in generation)")
print(f"with mask   : validation loss {val_loss:.3f} over all positions, {masked_last:.3f} at the last position")
print("\nsample without the mask:\n", sample_text(unmasked, PROMPT, 200, temperature=0.8, seed=1))
glue("nomask_val", f"{nomask_val:.2f}", display=False)
glue("nomask_train", f"{history_unmasked[-1][1]:.2f}", display=False)
glue("masked_train", f"{history[-1][1]:.2f}", display=False)
glue("nomask_last", f"{nomask_last:.2f}", display=False)
glue("masked_last", f"{masked_last:.2f}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Without the causal mask the loss collapses: the model reads the answer",
            "x": "training step", "y": "training loss (nats per character)",
            "masked": "causal mask (correct)", "unmasked": "no mask (the answer is visible)"}
fig, ax = plt.subplots(figsize=(7, 3.4))
ax.plot(*zip(*history), label=fig_text["masked"])
ax.plot(*zip(*history_unmasked), label=fig_text["unmasked"], color="C3")
ax.set_xlabel(fig_text["x"])
ax.set_ylabel(fig_text["y"])
ax.set_title(fig_text["title"], fontsize=10)
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# For a few hundred steps both models learn alike; then the unmasked model discovers that
# the answer is one position ahead, and its loss falls abruptly. It ends at
# {glue:text}`nomask_train` nats per character on its last training batch (the masked
# model: {glue:text}`masked_train`), and at {glue:text}`nomask_val` on validation text
# over all positions: it has learned to copy the character it is asked to predict. That skill
# is useless when generating, because the next character does not exist yet. At the last
# position of a window, where nothing lies ahead, the unmasked model's loss is
# {glue:text}`nomask_last`, against {glue:text}`masked_last` for the masked one, and its
# samples are noise. A loss that looks too good to be true in a language model is very
# often a leaking mask.

# %% [markdown]
# ## 8. From logits to text: greedy decoding and sampling
#
# The model gives a distribution over the next token; a *decoding* rule picks one, appends
# it, and repeats. Four rules are common.
#
# - **Greedy**: take the most probable token, $\arg\max_v \text{logits}_v$. Deterministic,
#   and prone to loops ("the the the ...") because the most probable continuation of a
#   repetition is often more repetition.
# - **Temperature** $\tau$: sample from $\operatorname{softmax}(\text{logits}/\tau)$.
#   $\tau < 1$ sharpens the distribution (towards greedy), $\tau > 1$ flattens it
#   (towards uniform).
# - **Top-$k$** (Fan et al., 2018): keep the $k$ most probable tokens, renormalise,
#   sample. A fixed $k$ is too many where the model is sure and too few where it is not.
# - **Nucleus, top-$p$** (Holtzman et al., 2020): sort the tokens by probability and keep
#   the smallest set whose probabilities add up to at least $p$; its size adapts to the
#   model's certainty. With sorted probabilities $\pi_{(1)} \ge \pi_{(2)} \ge \dots$ it
#   keeps the tokens $(1), \dots, (m)$ with
#
# $$m = \min\Big\{\, m' : \sum_{r=1}^{m'} \pi_{(r)} \ge p \Big\},$$
#
#   so the token whose probability *crosses* $p$ is kept, and at least one token always
#   is. Equivalently: a token is dropped when the probability mass strictly before it in
#   the sorted order is already $\ge p$.
#
# Filtering sets the excluded tokens' logits to $-\infty$ (probability 0 after the
# softmax) and leaves the others unchanged, so filters compose: top-$k$ first, then the
# nucleus among the $k$ survivors, renormalised, as the `transformers` library does.
#
# ### Exercise: `filter_logits`
#
# ```{dropdown} Hint: top-k
# `torch.topk(logits, k, dim=-1).values[..., -1:]` is the $k$-th largest logit of each
# row; keep the logits that are at least that. Ties at the boundary are not graded.
# ```
#
# ```{dropdown} Hint: top-p
# Sort each row in descending order (`torch.sort(..., descending=True)` also returns the
# indices), take the softmax of the sorted logits and its `cumsum`. The mass *before*
# token $r$ is `cumsum - probs`; drop where it is `>= top_p`. Write the sorted result back
# to the original order with `scatter` (or compute a boolean mask and `scatter` it). Do
# not drop where `cumsum > top_p`: that removes the token that crosses the threshold.
# ```

# %% [exercise filter_logits]
def filter_logits(logits, top_k=None, top_p=None):
    """Keep the top-k logits and/or the nucleus of each row; set the others to -inf.

    Args:
        logits: (..., V) float tensor (float32 or float64), any leading dimensions.
        top_k: None, or an int k >= 1: keep the k largest logits of each row
            (k >= V keeps every token).
        top_p: None, or a float in (0, 1]: keep the smallest set of most probable tokens
            whose softmax probabilities sum to at least top_p (never fewer than one;
            the token that crosses top_p is kept; top_p = 1.0 keeps every token).
        With both, top_k is applied first and the nucleus is taken among the kept
        tokens, with their probabilities renormalised (softmax of the filtered logits).

    Returns a tensor of the same shape and dtype: excluded tokens are -inf, the
    others keep their logits unchanged. Ties at the boundary are not graded. A new
    tensor, or `logits` itself changed in place (as older Hugging Face code does):
    both are fine.
    """
    ### BEGIN SOLUTION
    out = logits.clone()
    if top_k is not None:
        k = min(top_k, out.size(-1))
        kth = torch.topk(out, k, dim=-1).values[..., -1:]                  # (..., 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs                         # mass of the tokens ranked above
        drop_sorted = mass_before >= top_p                                 # the crossing token is kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out
    ### END SOLUTION


# %% [test test_filter_logits_top_k points=1]
"""top_k keeps the k largest logits of each row unchanged and sets the others to -inf."""
fl_x = torch.tensor([[1.0, 3.0, 2.0, 0.5, -1.0], [0.0, -2.0, 4.0, 1.0, 3.5]])
fl_filter = lambda x, **kw: filter_logits(x.clone(), **kw)   # on a copy: changing logits in place is allowed
fl_k = fl_filter(fl_x, top_k=2)
fl_inf = float("-inf")
assert fl_k.shape == fl_x.shape, f"the result must have the input's shape {tuple(fl_x.shape)}, got {tuple(fl_k.shape)}"
assert not torch.equal(fl_k, torch.tensor([[fl_inf, fl_inf, fl_inf, 0.5, -1.0], [0.0, -2.0, fl_inf, fl_inf, fl_inf]])), \
    "top_k kept the k SMALLEST logits: keep the largest"
assert not (fl_k == 0).any(), "excluded tokens must be -inf (probability 0 after softmax), not 0; kept ones unchanged"
assert torch.equal(fl_k, torch.tensor([[fl_inf, 3.0, 2.0, fl_inf, fl_inf], [fl_inf, fl_inf, 4.0, fl_inf, 3.5]])), \
    f"top_k=2 should keep [3, 2] in row 0 and [4, 3.5] in row 1, unchanged, the rest -inf; got\n{fl_k}"
assert torch.equal(fl_filter(fl_x), fl_x), "with top_k=None and top_p=None nothing is filtered"
assert torch.equal(fl_filter(fl_x, top_k=5), fl_x), "top_k = V keeps every token"
assert torch.equal(fl_filter(fl_x, top_k=8), fl_x), \
    "top_k larger than V keeps every token: take min(top_k, V) before torch.topk"
assert fl_filter(fl_x[0], top_k=1).isfinite().sum() == 1, \
    "works on a single row (V,) too: top_k=1 keeps one token"

# %% [test test_filter_logits_top_p points=2]
"""top_p keeps the smallest most-probable set with mass >= p (the crossing token included); with top_k, k first."""
fp_probs = torch.tensor([0.05, 0.5, 0.3, 0.15])
fp_x = fp_probs.log()
fp_keep = lambda out: out.isfinite().tolist()
fp_filter = lambda x, **kw: filter_logits(x.clone(), **kw)   # on a copy: changing logits in place is allowed
assert fp_keep(fp_filter(fp_x, top_p=0.7)) != [False, True, False, False], \
    "the nucleus dropped the token that crosses top_p: 0.5 < 0.7, so 0.3 must be kept too (drop where the mass BEFORE a token is >= p)"
assert fp_keep(fp_filter(fp_x, top_p=0.7)) == [False, True, True, False], \
    f"top_p=0.7 on probabilities [0.05, 0.5, 0.3, 0.15] should keep 0.5 and 0.3; kept {fp_keep(fp_filter(fp_x, top_p=0.7))}"
assert fp_keep(fp_filter(fp_x, top_p=0.9)) == [False, True, True, True], \
    "top_p=0.9 should keep 0.5, 0.3 and 0.15 (0.8 < 0.9 <= 0.95)"
assert fp_keep(fp_filter(fp_x, top_p=0.01)) == [False, True, False, False], \
    "never fewer than one token: a tiny top_p keeps the most probable token"
assert fp_keep(fp_filter(fp_x, top_p=1.0)) == [True, True, True, True], \
    "top_p=1.0 keeps every token: drop a token only when the mass BEFORE it is already >= top_p"
assert torch.equal(fp_filter(fp_x, top_p=0.7)[1:3], fp_x[1:3]), "kept logits must be unchanged"
# top_k first: among the 2 kept tokens the probabilities are 0.5/0.8 and 0.3/0.8 = 0.625, 0.375
assert fp_keep(fp_filter(fp_x, top_k=2, top_p=0.6)) == [False, True, False, False], \
    "with both, apply top_k first and take the nucleus of the probabilities renormalised over the k kept tokens: 0.5 / 0.8 = 0.625 >= 0.6 already"
assert fp_keep(fp_filter(fp_x, top_k=2, top_p=0.7)) == [False, True, True, False], \
    "top_k=2 then top_p=0.7: the renormalised probabilities are 0.625 and 0.375, so both kept tokens stay"
fp_rows = torch.randn(3, 4, 50, dtype=torch.float64)
fp_out = fp_filter(fp_rows, top_p=0.9)
assert fp_out.shape == (3, 4, 50) and fp_out.dtype == torch.float64, "keep the shape (..., V) and the dtype"
fp_mass = torch.where(fp_out.isfinite(), torch.softmax(fp_rows, -1), 0).sum(-1)
assert (fp_mass >= 0.9 - 1e-9).all(), "each row's kept probability mass must be at least top_p"
# %% [markdown]
# What does each rule keep? Take the trained model's distribution for the character after
# "Return the " (the first letter of a word, a genuinely uncertain choice) and look at it
# through each filter. The figure shows the 20 most
# probable characters; a bar is coloured when the rule can still sample it.

# %%
with torch.no_grad():
    next_logits = model(encode("Return the ")[None])[0][0, -1]          # (V,)
top20 = torch.topk(next_logits, 20).indices
rules = {"temperature 0.5": (next_logits / 0.5, {}), "temperature 1": (next_logits, {}),
         "temperature 1.5": (next_logits / 1.5, {}), "top-k, k = 5": (next_logits, dict(top_k=5)),
         "top-p, p = 0.9": (next_logits, dict(top_p=0.9)), "top-k 5, then top-p 0.9": (next_logits, dict(top_k=5, top_p=0.9))}
kept = {}
for name, (scaled, kwargs) in rules.items():
    filtered = filter_logits(scaled.clone(), **kwargs)        # a copy: a filter may work in place
    kept[name] = (torch.softmax(filtered, dim=-1), filtered.isfinite())
    print(f"{pad_to(name, 25)} keeps {int(kept[name][1].sum()):3d} of {len(chars)} characters")
top_prob = torch.softmax(next_logits, -1).max().item()
glue("top_prob", f"{top_prob:.2f}", display=False)
glue("kept_p", f"{int(kept['top-p, p = 0.9'][1].sum())}", display=False)
glue("kept_kp", f"{int(kept['top-k 5, then top-p 0.9'][1].sum())}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Next character after 'Return the ': what each rule keeps",
            "y": "probability", "kept": "can be sampled", "dropped": "filtered out (-inf)"}
labels = [repr(chars[i])[1:-1] or " " for i in top20.tolist()]
fig, axes = plt.subplots(2, 3, figsize=(11, 5.2), sharey=True, layout="constrained")
for ax, (name, (probs, keep)) in zip(axes.flat, kept.items()):
    base = torch.softmax(rules[name][0], dim=-1)
    colors = ["C0" if keep[i] else "lightgrey" for i in top20.tolist()]
    ax.bar(range(20), [(probs if keep[i] else base)[i].item() for i in top20.tolist()], color=colors)
    ax.set_xticks(range(20), labels, fontsize=8)
    ax.set_title(name, fontsize=9)
for ax in axes[:, 0]:
    ax.set_ylabel(fig_text["y"])
handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("C0", "lightgrey")]
fig.legend(handles, [fig_text["kept"], fig_text["dropped"]], loc="upper right", fontsize=8)
fig.suptitle(fig_text["title"], fontsize=10)
plt.show()

# %% [markdown]
# The most probable first letter has probability {glue:text}`top_prob`. The nucleus with
# $p = 0.9$ keeps the {glue:text}`kept_p` letters that together carry 90% of the mass,
# where a fixed top-$k$ keeps five whatever the distribution; top-$k$ followed by top-$p$
# keeps {glue:text}`kept_kp`. Lower temperatures make the distribution peakier without
# removing anything. Grey bars show the probability a character had before it was
# filtered out; blue bars the renormalised probability it is sampled with. Samples with
# each rule:

# %%
for name, kwargs in {"greedy-like, temperature 0.2": dict(temperature=0.2),
                     "temperature 1.0": dict(temperature=1.0),
                     "top-k 10": dict(top_k=10), "top-p 0.9": dict(top_p=0.9)}.items():
    text_out = sample_text(model, PROMPT, 120, seed=2, filter_fn=filter_logits, **kwargs)
    print(f"--- {name}\n{text_out}\n")

# %% [markdown]
# ## 9. Greedy generation and the key/value cache
#
# Greedy decoding appends $\arg\max$ of the last position's logits, step after step. Done
# naively, step $s$ runs the model on all $N + s$ tokens and throws away all logits but
# the last: the keys and values of the first $N + s - 1$ tokens are recomputed, although
# causal attention guarantees they have not changed. With the cache, the prompt runs once
# (filling the cache) and each later step runs the model on **one** token, whose query
# attends to the cached keys and values.
#
# Per generated token, for a model with $L$ layers of width $d$, the work without the
# cache grows with the length $n$ of the sequence so far. Counting FLOPs as in Chapter 2
# (one multiply-add is 2 FLOPs): a block holds $12 d^2$ weights, so each token costs
# $24 d^2$ FLOPs in its matrix products, and a query attending to $n$ keys costs $4 n d$
# (scores and blend). Without the cache a step runs the whole sequence, roughly
# $L(24 n d^2 + 4 n^2 d)$ FLOPs; with the cache it is $L(24 d^2 + 4 n d)$: the cost of
# one token plus one row of attention. (Both leave out the output layer, $2 V d$ FLOPs
# per token processed, and count all $n^2$ scores, as the code computes them, although the
# mask then discards about half.)
#
# ### Exercise: `generate`
#
# Use only `model(idx, past)`, which returns `(logits, presents)`. Both ways must give the
# same tokens.
#
# ```{dropdown} Hint: the loop with the cache
# Before the loop: `past = None`, and the input of the first step is the whole prompt.
# In each step: `logits, past = model(inp, past)`, the next token is
# `logits[:, -1].argmax(-1, keepdim=True)` of shape `(B, 1)`, append it, and make it the
# next step's `inp`. Do not feed the whole sequence together with the cache (the cached
# tokens would be counted twice), and do not feed only the newest token without it (the
# model would see a one-token text at position 0).
# ```

# %% [exercise generate]
def generate(model, idx, max_new_tokens, use_cache=True):
    """Greedy decoding.

    Args:
        model: a GPT, called only as model(idx, past), which returns (logits,
            presents). Where there is no cache (the first step, or use_cache=False),
            pass past=None or leave it out: both are fine.
        idx: (B, N) long tensor, the prompt. N + max_new_tokens <= model.max_len.
        max_new_tokens: int >= 0, how many tokens to append.
        use_cache: if True, run the prompt through the model once and then feed only
            the newest token with the cache (past) at every later step; if False, run
            the whole sequence at every step without a cache.

    Returns a (B, N + max_new_tokens) long tensor: the prompt followed, at each step,
    by the argmax of the last position's logits. Both settings give the same tokens.
    """
    ### BEGIN SOLUTION
    out, inp, past = idx, idx, None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if use_cache:
                logits, past = model(inp, past)
            else:
                logits, _ = model(out)
            nxt = logits[:, -1].argmax(dim=-1, keepdim=True)      # (B, 1)
            out = torch.cat([out, nxt], dim=1)
            inp = nxt
    return out
    ### END SOLUTION


# %% [test test_generate points=2]
"""Greedy tokens: the prompt, then argmax of the last position; the same with and without the cache."""
check_parts_first("CausalSelfAttention", "Block", "GPT")
torch.manual_seed(6)
ge_model = GPT(vocab_size=12, max_len=24, d_model=16, num_heads=2, num_layers=2).eval()
with torch.no_grad():
    for ge_p in ge_model.parameters():
        ge_p.copy_(torch.randn_like(ge_p) * 0.5)
ge_idx = torch.randint(0, 12, (2, 4))
ge_expected = ge_idx.clone()
with torch.no_grad():
    for _ in range(6):                                        # the definition, without any cache
        ge_next = ge_model(ge_expected)[0][:, -1].argmax(-1, keepdim=True)
        ge_expected = torch.cat([ge_expected, ge_next], dim=1)
ge_cached = generate(ge_model, ge_idx, 6)
ge_plain = generate(ge_model, ge_idx, 6, use_cache=False)
assert ge_cached.shape == (2, 10), f"prompt (2, 4) + 6 new tokens should be (2, 10), got {tuple(ge_cached.shape)}: return the prompt too"
assert torch.equal(ge_cached[:, :4], ge_idx), "the result must start with the prompt"
assert torch.equal(ge_plain, ge_expected), \
    "use_cache=False differs from greedy decoding: at each step run the WHOLE sequence and take argmax of the LAST position"
assert torch.equal(ge_cached, ge_expected), \
    "use_cache=True gives other tokens than decoding without a cache: after the prompt, feed only the newest token together with past"
assert torch.equal(generate(ge_model, ge_idx[:1], 1), ge_expected[:1, :5]), "one new token, batch of one"
# %% [markdown]
# Both ways give the same text on the trained model:

# %%
prompt_ids = encode("The default ")[None]
n_new = CONFIG["max_len"] - prompt_ids.size(1)
with_cache = generate(model, prompt_ids, n_new)
without_cache = generate(model, prompt_ids, n_new, use_cache=False)
print("same tokens with and without the cache:", torch.equal(with_cache, without_cache))
print(repr(decode(with_cache[0].tolist())))

# %% [markdown]
# Greedy decoding soon repeats itself, as promised. Now the cost. For each length $n$ we
# time one decoding step both ways: without the cache, a forward pass over all $n$
# tokens; with it, a forward pass over the newest token with a cache of $n - 1$. We do it
# for the trained model and for a model with GPT-2 small's shapes (random weights: the
# time does not depend on them). Each time is the best of a few repetitions, in
# milliseconds, on one CPU thread.

# %%
@torch.no_grad()
def step_times(net, lengths, repeats=3, vocab=None):
    """ms for one decoding step at each length: (without cache, with cache)."""
    gen = torch.Generator().manual_seed(0)
    vocab = vocab or net.wte.num_embeddings
    plain, cached = [], []
    for n in lengths:
        seq = torch.randint(vocab, (1, n), generator=gen)
        _, past = net(seq[:, :-1])                                   # the cache of n - 1 tokens
        for store, call in ((plain, lambda: net(seq)), (cached, lambda: net(seq[:, -1:], past))):
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                call()
                best = min(best, time.perf_counter() - t0)
            store.append(1000 * best)
    return plain, cached


small_lengths = [2, 8, 16, 24, 32, 40, 48, 56, 64]
small_plain, small_cached = step_times(model, small_lengths)
torch.manual_seed(0)
gpt2_sized = GPT(vocab_size=50257, max_len=1024, d_model=768, num_heads=12, num_layers=12).eval()
big_lengths = [8, 32, 64, 128]
big_plain, big_cached = step_times(gpt2_sized, big_lengths, repeats=1)
del gpt2_sized
for name, lengths, plain, cached in (("trained model", small_lengths, small_plain, small_cached),
                                     ("GPT-2 small shapes", big_lengths, big_plain, big_cached)):
    print(f"{name}: " + ", ".join(f"n={n}: {p:.1f} vs {c:.1f} ms" for n, p, c in zip(lengths, plain, cached)))
speedup_big = big_plain[-1] / big_cached[-1]
glue("speedup_big", f"{speedup_big:.0f}", display=False)
glue("speedup_small", f"{small_plain[-1] / small_cached[-1]:.1f}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Time for one decoding step", "x": "sequence length n (tokens so far)",
            "y": "milliseconds per generated token", "plain": "no cache: whole sequence",
            "cached": "cache: newest token only", "small": "trained model (d=64, L=2)",
            "big": "GPT-2 small shapes (d=768, L=12, V=50257)"}
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
for ax, lengths, plain, cached, title in ((axes[0], small_lengths, small_plain, small_cached, fig_text["small"]),
                                          (axes[1], big_lengths, big_plain, big_cached, fig_text["big"])):
    ax.plot(lengths, plain, "o-", label=fig_text["plain"])
    ax.plot(lengths, cached, "s-", label=fig_text["cached"])
    ax.set_xlabel(fig_text["x"])
    ax.set_ylabel(fig_text["y"])
    ax.set_title(title, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
fig.suptitle(fig_text["title"], fontsize=10)
plt.show()

# %% [markdown]
# Without the cache the time per token grows with the length; with it, it stays nearly
# flat, because at these lengths a step is dominated by the $d^2$ matrix products of one
# token, not by the $n d$ attention row. At 128 tokens, a GPT-2-sized step is
# {glue:text}`speedup_big` times faster with the cache (the tiny trained model gains
# {glue:text}`speedup_small` times at 64, where fixed Python overheads dominate). The
# saving grows with the length: over a whole generation, the work without the cache
# grows as $n^2$ and with it as $n$ (until, for very long texts, the attention row over
# the cache dominates both).
#
# **What the cache costs.** The cache holds a key and a value vector per layer, per
# key/value head and per token:
#
# $$\text{bytes} = 2 \times L \times h_{kv} \times d_\text{head} \times n \times B \times \text{bytes per number},$$
#
# with $h_{kv} = h$ in GPT-2. For large models it is the main memory cost of serving long
# texts, which is why recent models share each key/value head among several query heads:
# grouped-query attention (Ainslie et al., 2023), the `GroupedQueryAttention` of
# Chapter 6, divides the cache by $h / h_{kv}$. For published model shapes, in 16-bit
# numbers, for one sequence:

# %%
MODEL_SHAPES = {  # name: (layers L, query heads h, key/value heads h_kv, d_head)
    "GPT-2 small (124M)": (12, 12, 12, 64),
    "GPT-2 XL (1.5B)": (48, 25, 25, 64),
    "Llama 2 7B": (32, 32, 32, 128),
    "Llama 2 70B (GQA)": (80, 64, 8, 128),
    "Mistral 7B (GQA)": (32, 32, 8, 128),
}


def kv_cache_bytes(L, h_kv, d_head, n, batch=1, bytes_per_number=2):
    return 2 * L * h_kv * d_head * n * batch * bytes_per_number


print(f"{pad_to('model', 22)} {pad_to('L', 3, '>')} {pad_to('h', 3, '>')} {pad_to('h_kv', 4, '>')} {pad_to('d_head', 6, '>')} {pad_to('per token', 10, '>')} "
      f"{pad_to('n = 1,024', 10, '>')} {pad_to('n = 4,096', 10, '>')} {pad_to('if h_kv = h', 12, '>')}")
for name, (L, h, h_kv, d_head) in MODEL_SHAPES.items():
    per_token = kv_cache_bytes(L, h_kv, d_head, 1)
    print(f"{pad_to(name, 22)} {L:3d} {h:3d} {h_kv:4d} {d_head:6d} {per_token / 2**10:7.0f} KiB "
          f"{kv_cache_bytes(L, h_kv, d_head, 1024) / 2**30:6.2f} GiB {kv_cache_bytes(L, h_kv, d_head, 4096) / 2**30:6.2f} GiB "
          f"{kv_cache_bytes(L, h, d_head, 4096) / 2**30:8.2f} GiB")
llama70 = MODEL_SHAPES["Llama 2 70B (GQA)"]
glue("kv_llama70_gqa", f"{kv_cache_bytes(llama70[0], llama70[2], llama70[3], 4096) / 2**30:.2f}", display=False)
glue("kv_llama70_mha", f"{kv_cache_bytes(llama70[0], llama70[1], llama70[3], 4096) / 2**30:.0f}", display=False)

# %% [markdown]
# Llama 2 70B's cache for 4,096 tokens takes {glue:text}`kv_llama70_gqa` GiB with its 8
# key/value heads; with one key/value head per query head it would take
# {glue:text}`kv_llama70_mha` GiB, per sequence, on top of 140 GB of weights. (The shapes
# are those published with the models: Radford et al., 2019; Touvron et al., 2023;
# Jiang et al., 2023.)
# %% [markdown]
# ## 10. Your code is GPT-2
#
# OpenAI published GPT-2's weights, and the Hugging Face `transformers` library serves
# them as a *state dict*: a dictionary from parameter names to tensors. Because your
# classes use GPT-2's names, the names almost match: a checkpoint's
# `transformer.h.3.attn.c_attn.weight` is your `blocks[3].attn.c_attn.weight`. Two
# differences remain:
#
# - GPT-2's original code implemented its linear layers as a 1×1 convolution (`Conv1D`)
#   whose weight is stored as `(in_features, out_features)`, the transpose of
#   `nn.Linear`'s `(out_features, in_features)`. So `attn.c_attn`, `attn.c_proj`,
#   `mlp.c_fc` and `mlp.c_proj` weights must be **transposed**. For `c_attn` and
#   `mlp.c_proj` a forgotten transpose raises a shape error; `attn.c_proj` is square
#   ($d \times d$), so there a forgotten transpose loads silently and gives a wrong model.
# - Some checkpoints also store buffers that are not parameters: `attn.bias` (the causal
#   mask as a tensor) and `attn.masked_bias`. They are skipped. `lm_head.weight`, when
#   present, is the same matrix as `transformer.wte.weight` (tied).
#
# ### Exercise: `load_gpt2_weights`
#
# ```{dropdown} Hint: a name map
# Build the checkpoint name for each of your parameters: `wte.weight` →
# `transformer.wte.weight`, `blocks.{i}.X` → `transformer.h.{i}.X`, `ln_f.X` →
# `transformer.ln_f.X`. Loop over `model.named_parameters()` (which lists the tied
# weight once), look each name up, transpose the four Conv1D weights, check the shape,
# and `copy_` under `torch.no_grad()`.
# ```

# %% [exercise load_gpt2_weights]
def load_gpt2_weights(model, state_dict):
    """Copy a GPT-2 checkpoint into a GPT of matching size, in place.

    Args:
        model: a GPT (this chapter's class).
        state_dict: dict from names to tensors, keyed as in GPT-2's public
            checkpoints: transformer.wte.weight, transformer.wpe.weight,
            transformer.h.{i}.ln_1.weight / .bias, transformer.h.{i}.attn.c_attn.weight
            / .bias, transformer.h.{i}.attn.c_proj.*, transformer.h.{i}.ln_2.*,
            transformer.h.{i}.mlp.c_fc.*, transformer.h.{i}.mlp.c_proj.*,
            transformer.ln_f.weight / .bias, and optionally lm_head.weight (the same
            matrix as wte). Buffers such as transformer.h.{i}.attn.bias and
            attn.masked_bias may be present and are skipped.

    The attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights are stored as
    (in_features, out_features) and must be transposed. A missing key, or a tensor
    whose shape does not fit, raises an error (KeyError, ValueError, ...) whose
    message names it.

    Returns the model, with every parameter overwritten (in place).
    """
    ### BEGIN SOLUTION
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.") else name)
            if key not in state_dict:
                raise KeyError(f"the checkpoint has no {key!r} (for the model's {name!r})")
            value = state_dict[key]
            if name.endswith(conv1d):
                value = value.t()
            if value.shape != param.shape:
                raise ValueError(f"{key!r}: shape {tuple(value.shape)} does not fit {name!r} {tuple(param.shape)}")
            param.copy_(value)
    return model
    ### END SOLUTION


# %% [test test_load_gpt2_weights points=2]
"""Every parameter copied, the four Conv1D weights transposed, buffers skipped, errors name the key."""
torch.manual_seed(7)
lw_src = GPT(vocab_size=10, max_len=8, d_model=8, num_heads=2, num_layers=2)
lw_sd = {}
for lw_name, lw_p in lw_src.named_parameters():            # a checkpoint in GPT-2's layout
    lw_key = "transformer." + lw_name.replace("blocks.", "h.")
    is_conv1d = lw_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
    lw_sd[lw_key] = (lw_p.detach().t() if is_conv1d else lw_p.detach()).clone()
for lw_i in range(2):
    lw_sd[f"transformer.h.{lw_i}.attn.bias"] = torch.ones(1, 1, 8, 8).tril()
    lw_sd[f"transformer.h.{lw_i}.attn.masked_bias"] = torch.tensor(-1e4)
lw_sd["lm_head.weight"] = lw_sd["transformer.wte.weight"].clone()
lw_dst = GPT(vocab_size=10, max_len=8, d_model=8, num_heads=2, num_layers=2)
lw_ret = load_gpt2_weights(lw_dst, lw_sd)
assert lw_ret is lw_dst, "return the model you were given (loaded in place)"
lw_have, lw_want = dict(lw_dst.named_parameters()), dict(lw_src.named_parameters())
assert torch.equal(lw_have["blocks.0.attn.c_proj.weight"], lw_want["blocks.0.attn.c_proj.weight"]), \
    "attn.c_proj.weight not transposed: GPT-2 stores every Conv1D weight as (in, out); transpose it even when it is square"
for lw_name in lw_want:
    assert torch.equal(lw_have[lw_name], lw_want[lw_name]), \
        f"{lw_name} differs from the checkpoint's tensor (transpose the c_attn, c_proj and c_fc weights, nothing else)"
assert lw_dst.lm_head.weight is lw_dst.wte.weight, "keep lm_head tied to wte: copy into the parameter, do not replace it"
lw_missing = dict(lw_sd)
del lw_missing["transformer.h.1.mlp.c_fc.bias"]
try:
    load_gpt2_weights(GPT(vocab_size=10, max_len=8, d_model=8, num_heads=2, num_layers=2), lw_missing)
except Exception as lw_err:                                    # noqa: BLE001 - any error type is fine
    assert "h.1.mlp.c_fc.bias" in str(lw_err) or "blocks.1.mlp.c_fc.bias" in str(lw_err), \
        f"the error for a missing key must name it; got: {lw_err!r}"
else:
    raise AssertionError("a checkpoint without transformer.h.1.mlp.c_fc.bias must raise an error naming it")
lw_longer = dict(lw_sd, **{"transformer.wpe.weight": torch.randn(12, 8)})   # 12 positions, the model has 8
try:
    load_gpt2_weights(GPT(vocab_size=10, max_len=8, d_model=8, num_heads=2, num_layers=2), lw_longer)
except Exception as lw_err:                                    # noqa: BLE001 - any error type is fine
    assert "wpe.weight" in str(lw_err), f"the error for a tensor of the wrong shape must name its key; got: {lw_err!r}"
else:
    raise AssertionError("a transformer.wpe.weight of shape (12, 8) for a model of max_len 8 must raise an error naming it")

# %% [markdown]
# Now the proof. `transformers.GPT2LMHeadModel` is the Hugging Face implementation of
# GPT-2 (Wolf et al., 2020). We build one from a small `GPT2Config` with random weights,
# so nothing is downloaded, load its state dict into your `GPT`, and compare the logits,
# with and without a cache, and the greedy tokens. (The configuration's names:
# `n_embd` = $d$, `n_head` = $h$, `n_layer` = $L$, `n_positions` = $N_\text{max}$; GPT-2
# uses LayerNorm's $\epsilon = 10^{-5}$ and the tanh GELU, as PyTorch's defaults and our
# `MLP` do.)

# %%
if transformers is None:                                     # imported in the first cell
    print("transformers is not installed here (pip install transformers): this section is skipped")
else:
    torch.manual_seed(0)
    hf_config = GPT2Config(vocab_size=97, n_positions=48, n_embd=64, n_layer=3, n_head=4,
                           bos_token_id=0, eos_token_id=0)
    hf_model = GPT2LMHeadModel(hf_config).eval()
    ours = GPT(vocab_size=97, max_len=48, d_model=64, num_heads=4, num_layers=3).eval()
    load_gpt2_weights(ours, hf_model.state_dict())
    ids = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_logits = hf_model(ids).logits
        our_logits, our_past = ours(ids[:, :15])
        our_rest, _ = ours(ids[:, 15:], our_past)
        our_full, _ = ours(ids)
    err_full = (our_full - hf_logits).abs().max().item()
    err_cache = (torch.cat([our_logits, our_rest], dim=1) - hf_logits).abs().max().item()
    print(f"transformers {transformers.__version__}: max |logit difference| = {err_full:.2e} "
          f"(with a cache: {err_cache:.2e}); logits are of size {hf_logits.abs().mean():.2f} on average")
    with torch.no_grad():                                     # greedy tokens, computed by transformers itself
        hf_tokens = ids[:, :5]
        for _ in range(20):
            hf_tokens = torch.cat([hf_tokens, hf_model(hf_tokens).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    our_tokens = generate(ours, ids[:, :5], 20)
    print("same 20 greedy tokens for all 3 prompts:", torch.equal(our_tokens, hf_tokens))
    glue("hf_err", f"{max(err_full, err_cache):.1e}", display=False)

# %% [markdown]
# The logits agree to about {glue:text}`hf_err`, float32 rounding, and the greedy tokens
# are identical: your code computes GPT-2. The cell below takes the last step, the real
# 124M-parameter checkpoint (about 500 MB) and its tokenizer, and lets *your* `GPT` and
# `generate` continue a prompt. It needs a network; without one, it says so and moves on.
# The book was built without one, so below you see that message, not GPT-2's text. To
# see the text, run this notebook where `transformers` is installed and huggingface.co
# can be reached: the first run downloads the checkpoint into the Hugging Face cache
# (`~/.cache/huggingface`), later runs load it from there, offline too.

# %%
SKIP_TEXT = dict(missing="transformers is not installed",
                 offline="{variable} is set, and no GPT-2 checkpoint is cached on this machine",
                 network="no network ({host} could not be reached in {timeout:g} s)")


def load_real_gpt2(timeout=3.0):
    """Your GPT with OpenAI's GPT-2 small weights, and its tokenizer; or (None, None, reason)."""
    if transformers is None:
        return None, None, SKIP_TEXT["missing"]
    from transformers import AutoTokenizer
    offline = [v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(v, "0") not in ("0", "")]
    try:                                                      # a checkpoint already on this machine?
        tok = AutoTokenizer.from_pretrained("gpt2", local_files_only=True)
        hf = GPT2LMHeadModel.from_pretrained("gpt2", local_files_only=True)
    except Exception:                                         # noqa: BLE001 - not cached: download it
        if offline:
            return None, None, SKIP_TEXT["offline"].format(variable=offline[0])
        hub = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")  # a mirror, if set
        try:
            socket.create_connection((hub.hostname, hub.port or (80 if hub.scheme == "http" else 443)),
                                     timeout=timeout).close()
        except OSError:
            return None, None, SKIP_TEXT["network"].format(host=hub.hostname, timeout=timeout)
        tok = AutoTokenizer.from_pretrained("gpt2")
        hf = GPT2LMHeadModel.from_pretrained("gpt2")
    c = hf.config
    gpt2 = GPT(c.vocab_size, c.n_positions, c.n_embd, c.n_head, c.n_layer).eval()
    return load_gpt2_weights(gpt2, hf.state_dict()), tok, None


started = time.perf_counter()
gpt2, gpt2_tokenizer, skipped = load_real_gpt2()
if skipped:
    print(f"Skipped loading the real GPT-2 checkpoint: {skipped}. ({time.perf_counter() - started:.1f} s)")
else:
    prompt = "Attention is all you need, because"
    out = generate(gpt2, gpt2_tokenizer(prompt, return_tensors="pt").input_ids, 30)
    print(gpt2_tokenizer.decode(out[0]))
# %% [markdown]
# ## 11. What the trained model attends to
#
# Each of the trained model's 2 layers has 4 heads. The helper below runs your model's
# blocks on a text and recomputes, from each block's `c_attn`, the attention weights that
# its heads used (your layer returns keys and values, not weights). Row $i$ of a map is
# how character $i$ spreads its attention over the characters up to it.

# %%
@torch.no_grad()
def attention_maps(net, idx):
    """(L, h, N, N) causal attention weights of every layer and head, for one sequence idx (1, N)."""
    N = idx.size(1)
    x = net.wte(idx) + net.wpe(torch.arange(N))
    maps = []
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    for block in net.blocks:
        h = block.attn.num_heads
        q, k, _ = block.attn.c_attn(block.ln_1(x)).split(x.size(-1), dim=-1)
        q, k = (t.view(1, N, h, -1).transpose(1, 2) for t in (q, k))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        maps.append(torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)[0])
        x, _ = block(x)
    return torch.stack(maps)


map_text = "Return a new list of the items."
maps = attention_maps(model, encode(map_text)[None])          # (L, h, N, N)
N_map = maps.size(-1)
prev_weight = maps[..., torch.arange(1, N_map), torch.arange(N_map - 1)].mean(-1)   # (L, h): weight on i-1
self_weight = maps.diagonal(dim1=-2, dim2=-1).mean(-1)                               # (L, h): weight on i
for layer in range(maps.size(0)):
    print(f"layer {layer}: mean weight on the previous character per head "
          f"{[round(w, 2) for w in prev_weight[layer].tolist()]}, on itself {[round(w, 2) for w in self_weight[layer].tolist()]}")
best_layer, best_head = divmod(int(prev_weight.argmax()), maps.size(1))
glue("prev_layer", str(best_layer), display=False)
glue("prev_head", str(best_head), display=False)
glue("prev_weight", f"{prev_weight.max():.2f}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Attention of the trained character model (rows: queries, columns: keys)",
            "panel": "layer {layer}, head {head}", "colorbar": "weight"}
labels = [c if c != " " else "_" for c in map_text]
L_map, H_map = maps.shape[:2]
fig, axes = plt.subplots(L_map, H_map, figsize=(3.0 * H_map, 3.1 * L_map), layout="constrained")
for layer in range(L_map):
    for head in range(H_map):
        ax = axes[layer, head]
        im = ax.imshow(maps[layer, head], cmap="viridis", vmin=0, vmax=1)
        ax.set_title(fig_text["panel"].format(layer=layer, head=head), fontsize=9)
        ax.set_xticks(range(N_map), labels, fontsize=5)
        ax.set_yticks(range(N_map), labels, fontsize=5)
fig.colorbar(im, ax=axes, shrink=0.6, label=fig_text["colorbar"])
fig.suptitle(fig_text["title"], fontsize=10)
plt.show()

# %% [markdown]
# Every map is lower-triangular: the mask at work. The heads differ. The head that looks
# most at the *previous* character (layer {glue:text}`prev_layer`, head {glue:text}`prev_head`)
# puts on average {glue:text}`prev_weight` of its weight there: a bright sub-diagonal, a "previous-token
# head" of the kind found in large trained models (Olsson et al., 2022). Other heads
# spread their weight over the current word, or jump back to spaces and word starts, which
# tells the model where the current word began; some attend mostly to the first
# character, a common way for a head to do "nothing" when the softmax must put its weight
# somewhere. As in Chapter 3, these maps show where each head looks, not what the next
# layers make of it.

# %% [markdown]
# ## Check your understanding
#
# 1. Why can one forward pass of a GPT on $N$ tokens be trained on $N$ predictions at
#    once, and what would break this if the causal mask were missing?
#
#    ```{dropdown} Answer
#    Position $i$'s logits predict token $i+1$, and with the causal mask they depend only
#    on tokens $1..i$; so all $N$ predictions are honest and can share one pass. Without
#    the mask, position $i$ sees token $i+1$ among its inputs, learns to copy it, and the
#    training loss no longer measures prediction (Section 7).
#    ```
#
# 2. With a cache of $P = 10$ tokens you feed $N = 3$ new tokens. What is the shape of the
#    mask, and which keys may the second new token attend to?
#
#    ```{dropdown} Answer
#    $3 \times 13$. The second new token is at position 11; it may attend to keys
#    $0, \dots, 11$: all ten cached ones, the first new one and itself.
#    ```
#
# 3. Sorted next-token probabilities are $0.4, 0.3, 0.2, 0.1$. Which tokens does top-$p$
#    keep for $p = 0.5$, and for $p = 0.9$? What does top-$k$ with $k = 3$ followed by
#    top-$p$ with $p = 0.8$ keep?
#
#    ```{dropdown} Answer
#    $p = 0.5$: the first two (0.4 alone is less than 0.5; 0.4 + 0.3 crosses it).
#    $p = 0.9$: the first three (0.9 reaches 0.9). Top-3 leaves 0.4, 0.3, 0.2,
#    renormalised to 0.444, 0.333, 0.222; the first two sum to 0.778 < 0.8, so all three
#    stay.
#    ```

# %% [markdown]
# 4. Why does a GPT-2 checkpoint need some weights transposed, and why would a forgotten
#    transpose of `attn.c_proj.weight` go unnoticed by a shape check?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_conv1d_transpose points=2]
# ### BEGIN SOLUTION
# **Model answer.** GPT-2's `Conv1D` stores its weights as (in, out), while `nn.Linear`
# stores (out, in), so the Conv1D weights must be transposed when loaded into linear
# layers. `attn.c_proj` maps $d$ to $d$: its weight is square and fits either way, so a
# shape check passes. Only the values reveal the mistake, for instance comparing the
# logits with those of the original model.
#
# **Rubric (2 points).**
#
# - 1 point: the two layouts: `Conv1D` (in, out) against `nn.Linear` (out, in).
# - 1 point: `c_proj`'s weight is square ($d \times d$), so the untransposed matrix has the
#   right shape; only a comparison of values (logits with the original model) catches it.
# ### END SOLUTION

# %% [markdown]
# 5. How large is GPT-2 small's key/value cache for one sequence of 1,024 tokens in
#    32-bit floats?
#
#    ```{dropdown} Answer
#    $2 \times 12 \times 12 \times 64 \times 1024 \times 4$ bytes $= 75{,}497{,}472$ bytes
#    $= 72$ MiB: 72 KiB per token.
#    ```
#
# ## Challenges (optional, not graded)
#
# - Train the character model longer, wider ($d = 128$) or deeper ($L = 4$), and plot the
#   validation loss against the number of parameters.
# - Make `generate` sample: add `temperature`, `top_k` and `top_p` arguments that use your
#   `filter_logits`, and compare samples of the same prompt.
# - Extend `CausalSelfAttention` to grouped-query attention (Chapter 6) with $h_{kv} < h$
#   and measure the size of the cache.
# - With a network, load the real GPT-2 (Section 10) and draw its attention maps for an
#   English sentence: can you find a previous-token head?
#
# ## Summary
#
# - GPT is the Transformer's decoder without cross-attention: causal self-attention and an
#   MLP in pre-LN blocks, token and position embeddings, a final LayerNorm and an output
#   layer tied to the token embedding. GPT-2 small has {glue:text}`n_gpt2` parameters.
# - It is trained to predict the next token at every position at once (targets shifted by
#   one); the causal mask is what makes this honest. Without it the training loss
#   collapses and generation fails.
# - A character-level GPT trained for {glue:text}`train_seconds` s on Python's docstrings
#   reaches a validation perplexity of {glue:text}`val_ppl` (uniform: {glue:text}`uniform_ppl`).
# - Greedy decoding, temperature, top-$k$ and nucleus sampling turn logits into text; the
#   nucleus keeps the token that crosses $p$.
# - The key/value cache makes each generation step process one token: about
#   {glue:text}`speedup_big` times faster at 128 tokens for GPT-2-sized layers. It costs
#   $2 L h_{kv} d_\text{head}$ numbers per token, which grouped-query attention reduces.
# - Your model, loaded with a GPT-2 state dict (Conv1D weights transposed), computes the
#   same logits as `transformers`' GPT-2 to float32 precision.
#
# ## References
#
# - A. Vaswani, N. Shazeer, N. Parmar, J. Uszkoreit, L. Jones, A. N. Gomez, Ł. Kaiser,
#   I. Polosukhin (2017). *Attention Is All You Need.* NeurIPS.
#   <https://arxiv.org/abs/1706.03762>
# - A. Radford, K. Narasimhan, T. Salimans, I. Sutskever (2018). *Improving Language
#   Understanding by Generative Pre-Training.* OpenAI technical report.
#   <https://cdn.openai.com/research-covers/language-unsupervised/language_understanding_paper.pdf>
# - A. Radford, J. Wu, R. Child, D. Luan, D. Amodei, I. Sutskever (2019). *Language Models
#   are Unsupervised Multitask Learners.* OpenAI technical report.
#   <https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf>
# - T. Brown et al. (2020). *Language Models are Few-Shot Learners.* NeurIPS.
#   <https://arxiv.org/abs/2005.14165>
# - D. Hendrycks, K. Gimpel (2016). *Gaussian Error Linear Units (GELUs).*
#   <https://arxiv.org/abs/1606.08415>
# - O. Press, L. Wolf (2017). *Using the Output Embedding to Improve Language Models.*
#   EACL. <https://arxiv.org/abs/1608.05859>
# - R. Xiong et al. (2020). *On Layer Normalization in the Transformer Architecture.* ICML.
#   <https://arxiv.org/abs/2002.04745>
# - A. Fan, M. Lewis, Y. Dauphin (2018). *Hierarchical Neural Story Generation.* ACL.
#   <https://arxiv.org/abs/1805.04833>
# - A. Holtzman, J. Buys, L. Du, M. Forbes, Y. Choi (2020). *The Curious Case of Neural
#   Text Degeneration.* ICLR. <https://arxiv.org/abs/1904.09751>
# - J. Ainslie, J. Lee-Thorp, M. de Jong, Y. Zemlyanskiy, F. Lebrón, S. Sanghai (2023).
#   *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
#   Checkpoints.* EMNLP. <https://arxiv.org/abs/2305.13245>
# - H. Touvron et al. (2023). *Llama 2: Open Foundation and Fine-Tuned Chat Models.*
#   <https://arxiv.org/abs/2307.09288>
# - A. Q. Jiang et al. (2023). *Mistral 7B.* <https://arxiv.org/abs/2310.06825>
# - C. Olsson et al. (2022). *In-context Learning and Induction Heads.* Transformer
#   Circuits Thread. <https://transformer-circuits.pub/2022/in-context-learning-and-induction-heads/index.html>
# - T. Wolf et al. (2020). *Transformers: State-of-the-Art Natural Language Processing.*
#   EMNLP (demos). <https://arxiv.org/abs/1910.03771>
# - A. Karpathy. *nanoGPT* (2022), <https://github.com/karpathy/nanoGPT>, and *char-rnn*
#   (2015), <https://github.com/karpathy/char-rnn>: the character-level setting and much
#   of the code style of this chapter.

# %% [hidden]
import math

import torch

import solutions.ch07_gpt as ref
from autograder.hidden import HiddenTests, Mistake

hidden = HiddenTests(ref, from_scratch={"CausalSelfAttention"})


def _csa(m, x, past=None, order=(0, 1, 2), mask="causal", cat="past_first", scale="d_head", split="ok",
         proj=True, present="all", offset=0, cat_dim=2):
    """The reference attention with one deliberate change, to recognise a common mistake."""
    B, N, C = x.shape
    h = m.num_heads
    d = C // h
    parts = m.c_attn(x).split(C, dim=-1)
    q, k, v = (parts[i] for i in order)

    def heads(t):
        return t.reshape(B, h, N, d) if split == "view_only" else t.reshape(B, N, h, d).transpose(1, 2)
    q, k, v = heads(q), heads(k), heads(v)
    k_new, v_new = k, v
    if past is not None and cat != "ignored":
        if cat == "past_first":
            k, v = torch.cat([past[0], k], dim=cat_dim), torch.cat([past[1], v], dim=cat_dim)
        else:
            k, v = torch.cat([k, past[0]], dim=cat_dim), torch.cat([v, past[1]], dim=cat_dim)
    P = k.size(2) - N
    s = q @ k.transpose(-2, -1)
    s = s / math.sqrt(d) if scale == "d_head" else s / math.sqrt(C) if scale == "d_model" else s
    if mask == "causal":
        s = s.masked_fill(~torch.ones(N, P + N, dtype=torch.bool).tril(diagonal=P + offset), float("-inf"))
    elif mask == "no_offset":
        s = s.masked_fill(~torch.ones(N, P + N, dtype=torch.bool).tril(), float("-inf"))
    y = s.softmax(-1) @ v
    y = y.reshape(B, N, C) if split == "view_only" else y.transpose(1, 2).reshape(B, N, C)
    y = m.c_proj(y) if proj else y
    return y, ((k, v) if present == "all" else (k_new, v_new))


def _csa_with(**change):
    return lambda m, x, past=None: _csa(m, x, past, **change)


CSA_MISTAKES = [
    Mistake("no causal mask: the query at position p must not attend to keys at later positions",
            _csa_with(mask="none")),
    Mistake("the causal mask ignores the cached length: with P cached tokens, new token i sits at position P+i "
            "and may attend to every cached key and to new keys up to itself (tril(diagonal=P) on an (N, P+N) "
            "grid)", _csa_with(mask="no_offset")),
    Mistake("cache concatenated in the wrong order: present (and the keys attended to) must be the past FOLLOWED "
            "by the new keys and values, torch.cat([k_past, k], dim=2)", _csa_with(cat="new_first")),
    Mistake("present holds only the new keys and values (the cache is not extended): return the past followed "
            "by the new ones, each (B, h, P + N, d_head)", _csa_with(present="new")),
    Mistake("the cache is ignored: concatenate past keys and values before attending", _csa_with(cat="ignored")),
    *[Mistake("the causal mask is off by one: the query at position p attends to the keys at positions 0 .. p, "
              "itself included (with a cache of P, new token i is at position P + i: tril(diagonal=P) on an "
              "(N, P+N) grid)", _csa_with(offset=o)) for o in (-1, 1)],
    *[Mistake("past and new keys/values concatenated along the wrong dimension: they are (B, h, P, d_head) and "
              "(B, h, N, d_head), so join them along the positions, torch.cat([k_past, k], dim=2)",
              _csa_with(cat=c, cat_dim=d)) for c in ("past_first", "new_first") for d in (1, 3)],
    *[Mistake("q, k and v sliced in the wrong order: c_attn(x) holds q, then k, then v, each d_model wide",
              _csa_with(order=o)) for o in [(1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)]],
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(d_head), d_head = d_model // num_heads",
            _csa_with(scale="d_model")),
    Mistake("scores not scaled by 1/sqrt(d_head)", _csa_with(scale="none")),
    Mistake("heads split with a view to (B, h, N, d_head) without a transpose: view to (B, N, h, d_head), "
            "then transpose(1, 2)", _csa_with(split="view_only")),
    Mistake("c_proj forgotten: apply self.c_proj to the concatenated heads", _csa_with(proj=False)),
]
CSA = dict(mistakes=CSA_MISTAKES, returns=("y", "present"))


def _same_shapes(student, expected):
    """The shapes test judges shapes and dtypes only: the values are the other tests' business."""
    if isinstance(expected, tuple):
        return isinstance(student, (tuple, list)) and len(student) == len(expected) and all(
            _same_shapes(s, e) for s, e in zip(student, expected))
    return isinstance(student, torch.Tensor) and student.shape == expected.shape and student.dtype == expected.dtype


def _past(t, B, h, P, d, dtype=torch.float32):
    return (t.randn(B, h, P, d, dtype=dtype), t.randn(B, h, P, d, dtype=dtype))


# %% [hidden]
@hidden.test("test_CausalSelfAttention_shapes")
def _(t):
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(2, 5, 16),
             label="shapes: d_model=16, 4 heads, no cache", equivalent=_same_shapes, **CSA)
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(2, 2, 16), _past(t, 2, 4, 3, 4),
             label="shapes: 2 new tokens, a cache of 3", equivalent=_same_shapes, **CSA)


@hidden.test("test_CausalSelfAttention_no_cache")
def _(t):
    t.module("CausalSelfAttention", dict(d_model=12, num_heads=3), t.randn(2, 6, 12),
             label="d_model=12, 3 heads", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=1), t.randn(3, 5, 8), label="one head", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=8), t.randn(1, 4, 8), label="8 heads of width 1", **CSA)
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(2, 7, 16, dtype=torch.float64),
             dtype=torch.float64, label="float64, d_model=16, 4 heads", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 5, 8), grad=True,
             label="gradients", **CSA)


@hidden.test("test_CausalSelfAttention_cache")
def _(t):
    t.module("CausalSelfAttention", dict(d_model=12, num_heads=3), t.randn(1, 1, 12), _past(t, 1, 3, 6, 4),
             label="one new token, a cache of 6 (several earlier calls)", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 1, 8), _past(t, 2, 2, 1, 4),
             label="one new token, a cache of one earlier token", **CSA)
    t.module("CausalSelfAttention", dict(d_model=16, num_heads=4), t.randn(3, 4, 16), _past(t, 3, 4, 5, 4),
             label="4 new tokens, a cache of 5, batch of 3", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 3, 8, dtype=torch.float64),
             _past(t, 2, 2, 4, 4, dtype=torch.float64), dtype=torch.float64,
             label="float64, 3 new tokens, a cache of 4", **CSA)
    t.module("CausalSelfAttention", dict(d_model=8, num_heads=2), t.randn(2, 3, 8), past=_past(t, 2, 2, 2, 4),
             grad=True, label="gradients with a cache (past as a keyword)", **CSA)


# %% [hidden]
def _block(m, x, past=None, how="ok"):
    if how == "post_ln":
        a, present = m.attn(x, past)
        x = m.ln_1(x + a)
        return m.ln_2(x + m.mlp(x)), present
    if how == "swapped_ln":
        a, present = m.attn(m.ln_2(x), past)
        x = x + a
        return x + m.mlp(m.ln_1(x)), present
    if how == "no_residual":
        a, present = m.attn(m.ln_1(x), past)
        return a + m.mlp(m.ln_2(a)), present
    if how == "parallel":
        a, present = m.attn(m.ln_1(x), past)
        return x + a + m.mlp(m.ln_2(x)), present
    if how == "mlp_raw":
        a, present = m.attn(m.ln_1(x), past)
        x = x + a
        return x + m.mlp(x), present
    if how == "past_dropped":
        a, present = m.attn(m.ln_1(x))
        x = x + a
        return x + m.mlp(m.ln_2(x)), present
    raise ValueError(how)


BLOCK_MISTAKES = [
    Mistake("post-LN: GPT-2 normalises the input of each sub-layer (pre-LN), x = x + attn(ln_1(x)), "
            "x = x + mlp(ln_2(x))", lambda m, x, past=None: _block(m, x, past, "post_ln")),
    Mistake("ln_1 and ln_2 swapped: ln_1 goes before the attention, ln_2 before the MLP",
            lambda m, x, past=None: _block(m, x, past, "swapped_ln")),
    Mistake("residual connections missing: add each sub-layer's output to its input",
            lambda m, x, past=None: _block(m, x, past, "no_residual")),
    Mistake("the MLP reads x from before the attention (a parallel block): it must read x + attn(ln_1(x))",
            lambda m, x, past=None: _block(m, x, past, "parallel")),
    Mistake("the MLP's input is not normalised: x = x + mlp(ln_2(x))",
            lambda m, x, past=None: _block(m, x, past, "mlp_raw")),
    Mistake("past is not passed on to self.attn", lambda m, x, past=None: _block(m, x, past, "past_dropped")),
]
BLOCK = dict(mistakes=BLOCK_MISTAKES, deps=("CausalSelfAttention",), returns=("x", "present"))


@hidden.test("test_Block")
def _(t):
    t.module("Block", dict(d_model=8, num_heads=2), t.randn(2, 5, 8), label="d_model=8, 2 heads", **BLOCK)
    t.module("Block", dict(d_model=16, num_heads=4), t.randn(1, 6, 16, dtype=torch.float64), dtype=torch.float64,
             label="float64", **BLOCK)
    t.module("Block", dict(d_model=8, num_heads=2), t.randn(3, 2, 8), _past(t, 3, 2, 4, 4),
             label="2 new tokens, a cache of 4", **BLOCK)
    t.module("Block", dict(d_model=8, num_heads=2), t.randn(2, 4, 8), grad=True, label="gradients", **BLOCK)


# %% [hidden]
def _gpt(m, idx, past=None, how="ok"):
    B, N = idx.shape
    P = 0 if past is None else past[0][0].size(2)
    start = {"positions_restart": 0, "positions_plus_one": P + 1, "positions_minus_one": P - 1,
             "p_from_heads": 0 if past is None else past[0][0].size(1)}.get(how, P)
    x = m.wte(idx) if how == "no_positions" else m.wte(idx) + m.wpe(torch.arange(start, start + N))
    presents = []
    for i, block in enumerate(m.blocks):
        block_past = None if past is None else past[0] if how == "first_past" else past[i]
        x, present = block(x, block_past)
        presents.append(present)
    if how != "no_ln_f":
        x = m.ln_f(x)
    return m.lm_head(x), presents


GPT_MISTAKES = [
    Mistake("positions restart at 0 when a cache is given: the new tokens sit at positions P .. P+N-1, "
            "P = past[0][0].size(2)", lambda m, idx, past=None: _gpt(m, idx, past, "positions_restart")),
    *[Mistake("positions off by one: the N new tokens sit at positions P .. P+N-1 (P = 0 without a cache, "
              "P = past[0][0].size(2) with one)", lambda m, idx, past=None, how=how: _gpt(m, idx, past, how))
      for how in ("positions_plus_one", "positions_minus_one")],
    Mistake("the cached length P read from the wrong dimension: each cached key is (B, h, P, d_head), so "
            "P = past[0][0].size(2)", lambda m, idx, past=None: _gpt(m, idx, past, "p_from_heads")),
    Mistake("position embeddings missing: x = wte(idx) + wpe(positions)",
            lambda m, idx, past=None: _gpt(m, idx, past, "no_positions")),
    Mistake("ln_f forgotten: normalise after the last block, before lm_head",
            lambda m, idx, past=None: _gpt(m, idx, past, "no_ln_f")),
    Mistake("every block got past[0]: block i must receive past[i]",
            lambda m, idx, past=None: _gpt(m, idx, past, "first_past")),
]
GPT_ARGS = dict(mistakes=GPT_MISTAKES, deps=("CausalSelfAttention", "Block"), returns=("logits", "presents"))
SMALL = dict(vocab_size=11, max_len=16, d_model=8, num_heads=2, num_layers=2)


def _gpt_past(t, B, P, layers=2, h=2, d=4, dtype=torch.float32):
    return [_past(t, B, h, P, d, dtype) for _ in range(layers)]


@hidden.test("test_GPT_no_cache")
def _(t):
    t.module("GPT", SMALL, t.randint(0, 11, (2, 6)), label="2 layers, no cache", **GPT_ARGS)
    t.module("GPT", dict(vocab_size=7, max_len=10, d_model=12, num_heads=3, num_layers=3), t.randint(0, 7, (3, 10)),
             label="3 layers, N = max_len", **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (1, 5)), dtype=torch.float64, label="float64", **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (2, 4)), grad=True, label="gradients", **GPT_ARGS)


@hidden.test("test_GPT_cache")
def _(t):
    t.module("GPT", SMALL, t.randint(0, 11, (2, 1)), _gpt_past(t, 2, 5), label="one new token, a cache of 5",
             **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (1, 3)), _gpt_past(t, 1, 1), label="3 new tokens, a cache of 1",
             **GPT_ARGS)
    t.module("GPT", dict(vocab_size=9, max_len=12, d_model=12, num_heads=3, num_layers=3), t.randint(0, 9, (3, 2)),
             _gpt_past(t, 3, 7, layers=3, h=3), label="3 layers, 2 new tokens, a cache of 7", **GPT_ARGS)
    t.module("GPT", SMALL, t.randint(0, 11, (2, 2)), _gpt_past(t, 2, 3, dtype=torch.float64), dtype=torch.float64,
             label="float64, a cache of 3", **GPT_ARGS)


# %% [hidden]
def _filter(logits, top_k=None, top_p=None, k_side="largest", p_rule="before", order="k_first",
            fill=float("-inf"), renormalise=True, sort=True, clamp=True):
    out = logits.clone()
    original = logits.clone()

    def apply_k(out):
        if top_k is None:
            return out
        k = min(top_k, out.size(-1)) if clamp else top_k
        if k_side == "largest":
            kth = torch.topk(out, k, dim=-1).values[..., -1:]
            return out.masked_fill(out < kth, fill)
        kth = torch.topk(out, k, dim=-1, largest=False).values[..., -1:]
        return out.masked_fill(out > kth, fill)

    def apply_p(out):
        if top_p is None:
            return out
        base = out if renormalise else original
        if sort:
            sorted_logits, order_ = torch.sort(base, dim=-1, descending=True)
        else:
            sorted_logits, order_ = base, torch.arange(base.size(-1)).expand_as(base)
        probs = torch.softmax(sorted_logits, dim=-1)
        cum = probs.cumsum(-1)
        drop_sorted = {"before": cum - probs >= top_p, "crossing_dropped": cum > top_p,
                       "crossing_dropped_ge": cum >= top_p}[p_rule]
        drop = torch.zeros_like(drop_sorted).scatter(-1, order_, drop_sorted)
        return out.masked_fill(drop, fill)

    return apply_p(apply_k(out)) if order == "k_first" else apply_k(apply_p(out))


FILTER_MISTAKES = [
    Mistake("top_k kept the k smallest logits: keep the k largest",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, k_side="smallest")),
    Mistake("the nucleus dropped the token that crosses top_p: keep the smallest set whose mass is AT LEAST "
            "top_p (drop a token only when the mass before it is >= top_p)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, p_rule="crossing_dropped")),
    Mistake("the nucleus dropped the token that crosses top_p: keep the smallest set whose mass is AT LEAST "
            "top_p (drop a token only when the mass before it is >= top_p)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, p_rule="crossing_dropped_ge")),
    Mistake("top_k larger than V raised an error: such a top_k keeps every token, so take k = min(top_k, V)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, clamp=False)),
    Mistake("excluded tokens must be -inf (probability 0 after a softmax), not 0",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, fill=0.0)),
    Mistake("excluded tokens must be -inf, not a large negative number",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, fill=-1e9)),
    Mistake("top_p applied before top_k: apply top_k first, then take the nucleus among the kept tokens",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, order="p_first")),
    Mistake("with top_k, the nucleus must use the probabilities renormalised over the k kept tokens "
            "(the softmax of the top-k-filtered logits)",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, renormalise=False)),
    Mistake("the nucleus was taken in vocabulary order: sort the probabilities in descending order first",
            lambda lg, top_k=None, top_p=None: _filter(lg, top_k, top_p, sort=False)),
]


@hidden.test("test_filter_logits_top_k")
def _(t):
    t.function("filter_logits", t.randn(2, 10) * 2, top_k=3, mistakes=FILTER_MISTAKES, label="(2, 10), top_k=3")
    t.function("filter_logits", t.randn(12) * 2, top_k=1, mistakes=FILTER_MISTAKES, label="one row (V,), top_k=1")
    t.function("filter_logits", t.randn(2, 3, 8, dtype=torch.float64), top_k=5, mistakes=FILTER_MISTAKES,
               label="float64 (2, 3, 8), top_k=5")
    t.function("filter_logits", t.randn(3, 6), top_k=6, mistakes=FILTER_MISTAKES, label="top_k = V keeps all")
    t.function("filter_logits", t.randn(2, 5), top_k=9, mistakes=FILTER_MISTAKES, label="top_k > V keeps all")
    t.function("filter_logits", t.randn(3, 6), mistakes=FILTER_MISTAKES, label="no filter")


@hidden.test("test_filter_logits_top_p")
def _(t):
    t.function("filter_logits", t.randn(4, 20) * 2, top_p=0.9, mistakes=FILTER_MISTAKES, label="(4, 20), top_p=0.9")
    t.function("filter_logits", t.randn(3, 10) * 3, top_p=0.5, mistakes=FILTER_MISTAKES, label="(3, 10), top_p=0.5")
    t.function("filter_logits", t.randn(2, 12), top_p=1e-4, mistakes=FILTER_MISTAKES,
               label="tiny top_p keeps one token")
    t.function("filter_logits", t.randn(3, 8), top_p=1.0, mistakes=FILTER_MISTAKES, label="top_p = 1.0 keeps all")
    t.function("filter_logits", t.randn(2, 2, 15, dtype=torch.float64) * 2, top_p=0.8, mistakes=FILTER_MISTAKES,
               label="float64 (2, 2, 15), top_p=0.8")
    t.function("filter_logits", t.randn(3, 16) * 2, top_k=6, top_p=0.7, mistakes=FILTER_MISTAKES,
               label="top_k=6 then top_p=0.7")
    t.function("filter_logits", t.randn(20) * 2, top_k=4, top_p=0.6, mistakes=FILTER_MISTAKES,
               label="one row, top_k=4 then top_p=0.6")


# %% [hidden]
def _generate(model, idx, max_new_tokens, use_cache=True, how="ok"):
    out, inp, past = idx, idx, None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if how == "refeed_with_cache" and use_cache:
                logits, past = model(out, past)
            elif how == "last_only_without_cache" and not use_cache:
                logits, _ = model(inp)                        # the prompt, then only the newest token
            elif how == "last_token_always" and not use_cache:
                logits, _ = model(out[:, -1:])
            elif use_cache:
                logits, past = model(inp, past)
            else:
                logits, _ = model(out)
            position = 0 if how == "first_position" else -1
            nxt = logits[:, position].argmax(dim=-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
            inp = nxt
    return out[:, idx.size(1):] if how == "new_only" else out


GENERATE_MISTAKES = [
    Mistake("with use_cache, the whole sequence was fed again together with the cache: after the prompt, "
            "feed only the newest token with past",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "refeed_with_cache")),
    Mistake("without the cache, only the newest token was fed: with use_cache=False run the whole sequence "
            "at every step",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "last_only_without_cache")),
    Mistake("without the cache, only the newest token was fed: with use_cache=False run the whole sequence "
            "at every step",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "last_token_always")),
    Mistake("the argmax was taken at the first position: take the LAST position's logits, logits[:, -1]",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "first_position")),
    Mistake("only the new tokens were returned: return the prompt followed by them",
            lambda m, idx, n, use_cache=True: _generate(m, idx, n, use_cache, "new_only")),
]
GEN_MODEL = dict(vocab_size=13, max_len=40, d_model=16, num_heads=2, num_layers=2)


def _feeds_as_asked(probe, calls):
    """What generate fed the model at each step (the grader's own record of its calls): with the
    cache, the prompt once and then only the newest token with past; without it, the whole
    sequence, no cache, at every step."""
    if calls is None:
        return None
    use_cache = probe.kwargs.get("use_cache", probe.args[3] if len(probe.args) > 3 else True)
    prompt = probe.args[1].shape[1]
    for index, call in enumerate(c for c in calls if c["method"] == "forward"):
        step, tokens, expected = index + 1, call["tokens"], prompt + index
        if use_cache and index == 0 and call["past"]:
            return f"with use_cache=True the first step runs the prompt ({prompt} tokens) without a cache, but it was given one"
        if use_cache and index == 0 and tokens != prompt:
            return (f"with use_cache=True the first step runs the whole prompt ({prompt} tokens), but it fed "
                    f"the model {tokens} token(s)")
        if use_cache and index > 0 and not call["past"]:
            return (f"with use_cache=True every step after the first feeds only the newest token with past "
                    f"(the cache the model returned), but step {step} fed the model {tokens} token(s) "
                    f"without a cache: the cache is not used")
        if use_cache and index > 0 and tokens != 1:
            return (f"with use_cache=True every step after the first feeds only the newest token with the "
                    f"cache, but step {step} fed the model {tokens} tokens")
        if not use_cache and call["past"]:
            return (f"with use_cache=False every step runs the whole sequence without a cache, but step "
                    f"{step} passed a cache (past)")
        if not use_cache and tokens != expected:
            return (f"with use_cache=False every step runs the whole sequence ({expected} tokens at step "
                    f"{step}), but step {step} fed the model {tokens} token(s)")
    return None


GEN = dict(mistakes=GENERATE_MISTAKES, call_checks=[_feeds_as_asked])


def _sensitive_model(t, init, cases, dtype=None, tries=40):
    """A random GPT whose greedy tokens tell every generation mistake apart on these cases.

    A random model often emits the same token whatever the context; such a model would
    not show a cache fed twice or a context dropped. Draw until each case separates the
    reference from the mistakes that apply to it (deterministic: the builder is seeded).
    """
    for _ in range(tries):
        m = t.model("GPT", init, dtype=dtype)
        ok = True
        for idx, n, use_cache in cases:
            want = _generate(m.fresh(), idx, n, use_cache)
            hows = ["first_position", "refeed_with_cache" if use_cache else "last_only_without_cache"]
            if any(torch.equal(_generate(m.fresh(), idx, n, use_cache, how), want) for how in hows):
                ok = False
                break
        if ok:
            return m
    raise RuntimeError("no discriminating model found")


@hidden.test("test_generate")
def _(t):
    cases = [(t.randint(0, 13, (1, 4)), 5, True), (t.randint(0, 13, (3, 3)), 6, False),
             (t.randint(0, 13, (3, 2)), 6, True), (t.randint(0, 13, (2, 5)), 2, True)]
    m = _sensitive_model(t, GEN_MODEL, cases)
    labels = ["batch of 1, prompt of 4, 5 new tokens, with the cache", "batch of 3, 6 new tokens, use_cache=False",
              "batch of 3, prompt of 2, 6 new tokens, with the cache (positional)",
              "2 new tokens after a prompt of 5"]
    for i, ((idx, n, use_cache), label) in enumerate(zip(cases, labels)):
        if i == 1:
            t.function("generate", m, idx, n, use_cache=False, **GEN, label=label)
        elif i == 2:
            t.function("generate", m, idx, n, True, **GEN, label=label)
        else:
            t.function("generate", m, idx, n, **GEN, label=label)
    t.function("generate", m, t.randint(0, 13, (2, 3)), 1, **GEN, label="one new token")
    cases64 = [(t.randint(0, 13, (2, 3)), 4, True), (t.randint(0, 13, (2, 3)), 4, False)]
    m64 = _sensitive_model(t, dict(GEN_MODEL, num_layers=1), cases64, dtype=torch.float64)
    t.function("generate", m64, cases64[0][0], 4, **GEN, label="a float64 model, 4 new tokens")
    t.function("generate", m64, cases64[1][0], 4, use_cache=False, **GEN,
               label="a float64 model, use_cache=False")


# %% [hidden]
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _checkpoint(t, init, lm_head=True, buffers=True, dtype=torch.float32):
    """A GPT-2 state dict for a GPT of size ``init``: random values, Conv1D weights as (in, out)."""
    shapes = ref.GPT(**init).state_dict()
    sd = {}
    for name, tensor in shapes.items():
        if name == "lm_head.weight":
            continue
        key = "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.") else name)
        shape = tensor.shape[::-1] if name.endswith(CONV1D) else tensor.shape
        sd[key] = t.randn(*shape, dtype=dtype) * 0.5
    if lm_head:
        sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    if buffers:
        n = init["max_len"]
        for i in range(init["num_layers"]):
            sd[f"transformer.h.{i}.attn.bias"] = torch.ones(1, 1, n, n).tril()
            sd[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return sd


def _load(model, sd, how="ok"):
    with torch.no_grad():
        for name, param in model.named_parameters():
            key = "transformer." + (name.replace("blocks.", "h.", 1) if name.startswith("blocks.") else name)
            value = sd[key]
            if how == "transpose_if_needed":
                value = value.t() if value.shape != param.shape else value
            elif how == "reshape":
                value = value.reshape(param.shape)
            elif name.endswith(CONV1D):
                value = value.t()
            param.copy_(value)
    return model


LOAD_MISTAKES = [
    Mistake("attn.c_proj.weight not transposed: GPT-2 stores every Conv1D weight (attn.c_attn, attn.c_proj, "
            "mlp.c_fc, mlp.c_proj) as (in_features, out_features); transpose it even when it is square",
            lambda m, sd: _load(m, sd, "transpose_if_needed")),
    Mistake("Conv1D weights reshaped instead of transposed: GPT-2 stores them as (in_features, out_features); "
            "use .t(), not reshape or view",
            lambda m, sd: _load(m, sd, "reshape")),
]
LOAD_MODEL = dict(vocab_size=10, max_len=12, d_model=8, num_heads=2, num_layers=2)


@hidden.test("test_load_gpt2_weights")
def _(t):
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL), _checkpoint(t, LOAD_MODEL), mistakes=LOAD_MISTAKES,
               label="2 layers, with lm_head.weight and attn.bias buffers")
    big = dict(vocab_size=7, max_len=6, d_model=12, num_heads=3, num_layers=3)
    t.function("load_gpt2_weights", t.model("GPT", big), _checkpoint(t, big, lm_head=False, buffers=False),
               mistakes=LOAD_MISTAKES, label="3 layers, no lm_head.weight, no buffers")
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL, dtype=torch.float64),
               _checkpoint(t, LOAD_MODEL, dtype=torch.float64), mistakes=LOAD_MISTAKES,
               label="a float64 model and checkpoint")
    missing = _checkpoint(t, LOAD_MODEL)
    del missing["transformer.h.1.mlp.c_fc.bias"]
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL), missing,
               raises=("h.1.mlp.c_fc.bias", "blocks.1.mlp.c_fc.bias"),
               label="a checkpoint without transformer.h.1.mlp.c_fc.bias must raise an error naming it")
    longer = dict(_checkpoint(t, LOAD_MODEL), **{"transformer.wpe.weight": t.randn(LOAD_MODEL["max_len"] + 4, 8)})
    t.function("load_gpt2_weights", t.model("GPT", LOAD_MODEL), longer, raises=("wpe.weight",),
               label="a transformer.wpe.weight with 16 positions for a model of 12 must raise an error naming it")
