# %% [markdown]
# # Chapter 8: Attention as today's language models use it
#
# Chapter 7 built GPT-2 (2019) and proved it equal to the real one. The models people use
# in 2026 (Llama, Qwen, DeepSeek, Mistral) are still decoder-only Transformers with a
# key/value cache, but almost every part of the block has been replaced, and their
# attention differs in ways every serving engine depends on. This chapter rebuilds the
# block the way Qwen3 does it (RMSNorm, rotary positions, QK-norm, grouped-query
# attention and a SwiGLU feed-forward network) and proves, as Chapter 7 did for GPT-2,
# that your code computes exactly what Hugging Face's `transformers` computes for a
# Qwen3 model. Then it builds the three ideas that make long contexts affordable when a
# model is *served*: DeepSeek's **multi-head latent attention**, which caches a small
# latent vector instead of keys and values; **attention sinks** with a sliding window
# (StreamingLLM), which keep a fixed-size cache for an endless stream; and vLLM's
# **paged key/value cache**, which stores the cache in fixed-size blocks like an
# operating system's virtual memory. Each one is measured: cache sizes of real models, a
# published claim checked at its own configuration, perplexities and times per token on
# a model you train here, and memory wasted by a contiguous cache.
#
# **Learning goals.** After this chapter you can
#
# - write RMSNorm, rotary positions in the "halves" layout that `transformers` uses for Llama and Qwen, QK-norm,
#   grouped-query attention with a cache and a SwiGLU feed-forward network, and show
#   that together they compute Qwen3;
# - explain why the halves layout and Chapter 4's interleaved layout are the same rotary
#   embedding, and show it by computation;
# - implement multi-head latent attention with its decoupled rotary key, cache only
#   what it needs, and fold the key up-projection into the query ("absorption");
# - compute the key/value cache of MHA, GQA, MQA and MLA for real configurations, and
#   check a paper's headline number;
# - stream text through a fixed-size cache with attention sinks, and measure what the
#   sinks change;
# - read a paged key/value cache through its block table, and measure the memory it
#   saves.
#
# **Prerequisites.** Chapter 4 (rotary position embedding), Chapter 6 (grouped-query
# attention), Chapter 7 (the decoder-only model, the key/value cache, the character
# corpus).
#
# **Time.** About 3 hours, of which about 2 minutes are training.
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `RMSNorm(dim, eps=1e-6)` | normalise by the root mean square, no centring, no bias | ★ | 2 |
# | `apply_rope_halves(x, positions, base=10000.0)` | rotary positions in the halves layout, at given positions | ★★ | 2 |
# | `ModernAttention(d_model, num_heads, num_kv_heads, head_dim, rope_base=10000.0, eps=1e-6)` | QK-norm, rotary positions and grouped-query attention, with a key/value cache | ★★★ | 5 |
# | `SwiGLU(d_model, d_ff)` | the gated feed-forward network of Llama and Qwen | ★ | 2 |
# | `MultiHeadLatentAttention(d_model, num_heads, kv_rank, nope_dim, rope_dim, v_dim, rope_base=10000.0)` | DeepSeek's latent attention: cache a latent and one rotary key; the absorbed form | ★★★ | 7 |
# | `sliding_window_mask(n, window, num_sinks=0)` | a sliding-window causal mask with attention sinks | ★ | 2 |
# | `evict_to_sinks(k, v, num_sinks, window)` | keep the first tokens and the last `window` of a cache | ★ | 2 |
# | `paged_attention(query, k_cache, v_cache, block_table, seq_lens)` | one decoding step that reads keys and values through a block table | ★★ | 3 |

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
import unicodedata
import urllib.parse

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch

try:                      # Section 7 compares your model with Hugging Face's Qwen3
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
    transformers.logging.set_verbosity_error()
except ImportError:
    transformers = None

try:                      # MyST-NB puts numbers computed here into the book's prose
    from myst_nb import glue
except ImportError:       # in plain Jupyter: just show them
    def glue(name, value, display=True):
        print(f"{name} = {value}")

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)


def pad(text, width, align="<"):
    """`text` padded to `width` columns, a wide (CJK) character counting as two, so that tables line up."""
    text = str(text)
    fill = " " * max(width - sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text), 0)
    return fill + text if align == ">" else text + fill  # small models: a second thread gains little on a shared machine

# %% [markdown]
# ## 1. From GPT-2 to a 2025 decoder
#
# A Qwen3 or Llama 3 block has the same skeleton as GPT-2's: pre-norm, attention with a
# residual, a feed-forward network with a residual. What changed is inside each part:
#
# | part | GPT-2 (2019) | Llama 3, Qwen3 (2024-2025) | why |
# |---|---|---|---|
# | normalisation | LayerNorm (centre, scale, shift) | RMSNorm (scale only) | cheaper, as good (Zhang and Sennrich, 2019) |
# | positions | learned, added to the input | rotary, applied to queries and keys in every layer | scores depend on relative positions (Su et al., 2021); no position table, but still no use of lengths beyond training without rescaling (Section 9; position interpolation, Chen et al., 2023; YaRN, Peng et al., 2023) |
# | keys and values | one per query head | shared by groups of query heads (GQA) | a cache several times smaller (Ainslie et al., 2023) |
# | queries and keys | as projected | each head normalised by RMSNorm first (QK-norm, Qwen3) | keeps attention logits bounded in training (Dehghani et al., 2023) |
# | feed-forward | GELU MLP, $d \to 4d \to d$ | SwiGLU, a gated MLP | better quality for the same compute (Shazeer, 2020) |
# | biases | everywhere | none | PaLM dropped them for training stability in large models (Chowdhery et al., 2022); Qwen3 drops Qwen2's query/key/value biases too (Yang et al., 2025) |
#
# The diagram shows one block of Qwen3 with the names of its parameters (which your
# classes will use, so that a checkpoint can be copied in) and the shape at each step.

# %% [tags=hide-input]
def draw_modern_block():
    """Data flow of a Qwen3 decoder block, with parameter names and shapes."""
    text = {
        "title": "A Qwen3 decoder block (Llama 3 is the same without q_norm and k_norm)",
        "x": "x  (B, N, d)",
        "ln1": "input_layernorm (RMSNorm)",
        "proj": "q_proj -> (B, h, N, d_head)     k_proj, v_proj -> (B, h_kv, N, d_head)",
        "qk": "q_norm, k_norm: RMSNorm over d_head of each head (QK-norm)",
        "rope": "rotary positions P .. P+N-1 on q and k (halves layout)",
        "attn": "causal attention: query head i reads key/value head i // (h / h_kv)\nover cached + new keys",
        "o": "o_proj  (B, N, d)",
        "ln2": "post_attention_layernorm (RMSNorm)",
        "mlp": "mlp: down_proj( silu(gate_proj(x)) * up_proj(x) )   d -> d_ff -> d",
        "cache_in": "past (k, v)\n(B, h_kv, P, d_head)",
        "cache_out": "present (k, v)\n(B, h_kv, P+N, d_head)\nk after norm and rotation",
        "add": "+",
    }
    fig, ax = plt.subplots(figsize=(9.5, 8.4))
    ax.set_xlim(0, 11)
    ax.set_ylim(0, 11.3)
    ax.axis("off")

    def box(x, y, w, h, label, color):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05",
                                    fc=color, ec="black", lw=1))
        ax.text(x, y, label, ha="center", va="center", fontsize=8.3)

    def arrow(x0, y0, x1, y1):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12, lw=1))
    box(4.5, 0.4, 2.6, 0.5, text["x"], "#ffffff")
    box(4.5, 1.5, 3.6, 0.5, text["ln1"], "#fde9c9")
    box(4.5, 2.6, 6.6, 0.5, text["proj"], "#f9d3d3")
    box(4.5, 3.6, 6.0, 0.5, text["qk"], "#fde9c9")
    box(4.5, 4.6, 5.4, 0.5, text["rope"], "#dbe9f6")
    box(4.5, 5.75, 6.2, 0.75, text["attn"], "#f9d3d3")
    box(4.5, 6.9, 2.6, 0.5, text["o"], "#f9d3d3")
    box(4.5, 8.6, 4.2, 0.5, text["ln2"], "#fde9c9")
    box(4.5, 9.7, 6.4, 0.5, text["mlp"], "#d9efd9")
    box(9.5, 6.3, 2.3, 0.75, text["cache_in"], "#ece4f7")
    box(9.5, 4.6, 2.3, 1.0, text["cache_out"], "#ece4f7")
    arrow(8.35, 6.3, 7.6, 5.95)
    arrow(7.6, 5.5, 8.35, 4.8)
    for y0, y1 in [(0.65, 1.25), (1.75, 2.35), (2.85, 3.35), (3.85, 4.35), (4.85, 5.37), (6.13, 6.65),
                   (8.85, 9.45)]:
        arrow(4.5, y0, 4.5, y1)
    for y_from, y_add in [(0.95, 7.65), (7.85, 10.55)]:
        ax.plot([4.5, 0.6, 0.6], [y_from, y_from, y_add], color="black", lw=1)
        arrow(0.6, y_add, 4.25, y_add)
        ax.add_patch(plt.Circle((4.5, y_add), 0.2, fc="white", ec="black"))
        ax.text(4.5, y_add, text["add"], ha="center", va="center", fontsize=11)
    arrow(4.5, 7.15, 4.5, 7.45)
    arrow(4.5, 7.85, 4.5, 8.35)
    arrow(4.5, 9.95, 4.5, 10.35)
    ax.set_title(text["title"], fontsize=10.5)
    return fig


draw_modern_block()
plt.show()

# %% [markdown]
# ## 2. RMSNorm
#
# LayerNorm (Chapter 5) subtracts each vector's mean, divides by its standard deviation,
# then multiplies by a learned weight and adds a learned bias. Zhang and Sennrich (2019)
# found that the centring and the bias can be dropped: dividing by the **root mean
# square** is enough to stabilise training, and costs less. For a vector
# $x \in \mathbb{R}^{d}$ (the last dimension of a tensor),
#
# $$\operatorname{RMSNorm}(x) = w \odot \frac{x}{\sqrt{\frac{1}{d}\sum_{i=1}^{d} x_i^2 + \epsilon}},
# \qquad w \in \mathbb{R}^{d}\ (\text{initialised to ones}),$$
#
# with a small $\epsilon$ (Qwen3: $10^{-6}$) inside the square root, so that a vector of
# zeros gives zeros and not a division by zero. Unlike LayerNorm, RMSNorm keeps the
# mean: the vector $(1, 1, 1, 1)$ stays $(1, 1, 1, 1)$ (with $w = 1$), where LayerNorm
# would map it to zeros.
#
# ### Exercise: `RMSNorm`

# %% [exercise RMSNorm]
class RMSNorm(nn.Module):
    """Root-mean-square normalisation over the last dimension, with a learned weight."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        """x: (..., dim) float tensor.

        Returns weight * x / sqrt(mean(x ** 2) + eps), the mean taken over the last
        dimension only (one value per vector); same shape and dtype as x.
        """
        ### BEGIN SOLUTION
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)   # (..., 1)
        return self.weight * (x / rms)
        ### END SOLUTION


# %% [test test_RMSNorm points=2]
"""Divide by the root mean square over the last dimension (eps inside the root), no centring, times weight."""
torch.manual_seed(0)
rn = RMSNorm(4)
rn_ones = rn(torch.ones(2, 4))
assert rn_ones.shape == (2, 4), f"the output keeps the input's shape (2, 4), got {tuple(rn_ones.shape)}"
assert torch.allclose(rn_ones, torch.ones(2, 4), atol=1e-5), \
    "RMSNorm of (1, 1, 1, 1) must stay (1, 1, 1, 1): do not subtract the mean (that is LayerNorm)"
rn_x = torch.tensor([[3.0, -4.0, 0.0, 0.0]])
assert torch.allclose(rn(rn_x), rn_x / 2.5, atol=1e-5), \
    "(3, -4, 0, 0) has mean square 25/4, so the output is x / 2.5: take the mean of x**2 over the LAST dimension"
rn_small = torch.full((1, 4), 1e-3)
assert torch.allclose(rn(rn_small), rn_small / math.sqrt(1e-6 + 1e-6), atol=1e-5), \
    "for tiny x, eps matters: divide by sqrt(mean(x**2) + eps), eps inside the square root"
with torch.no_grad():
    rn.weight.copy_(torch.tensor([1.0, 2.0, -1.0, 0.5]))
rn_y = torch.randn(3, 5, 4)
rn_expected = rn.weight * rn_y / torch.sqrt(rn_y.pow(2).mean(-1, keepdim=True) + 1e-6)
assert torch.allclose(rn(rn_y), rn_expected, atol=1e-5), "multiply by self.weight, feature by feature"
assert RMSNorm(4).double()(rn_y.double()).dtype == torch.float64, "keep the input's dtype"


# %% [hidden]
import math

import torch
import torch.nn.functional as F

import solutions.ch08_modern_attention as ref
from autograder.hidden import HiddenTests, Mistake, close

hidden = HiddenTests(ref, from_scratch={"ModernAttention", "MultiHeadLatentAttention"})


# The reference: m.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps). Each mistake
# below is that line with one thing changed.
def _rms_without_eps(m, x):
    return m.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True))


def _rms_eps_outside_the_root(m, x):
    return m.weight * x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + m.eps)


def _rms_centred(m, x):
    c = x - x.mean(-1, keepdim=True)
    return m.weight * c / torch.sqrt(c.pow(2).mean(-1, keepdim=True) + m.eps)


def _rms_mean_over(dim):
    """The mean of x**2 over dimension ``dim`` instead of the last."""
    return lambda m, x: m.weight * x / torch.sqrt(x.pow(2).mean(dim, keepdim=True) + m.eps)


def _rms_mean_over_everything(m, x):
    return m.weight * x / torch.sqrt(x.pow(2).mean() + m.eps)


def _rms_without_root(m, x):
    return m.weight * x / (x.pow(2).mean(-1, keepdim=True) + m.eps)


def _rms_without_weight(m, x):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + m.eps)


def _rms_sum_of_squares(m, x):
    return m.weight * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + m.eps)


RMS_MISTAKES = [
    Mistake("eps left out: divide by sqrt(mean(x**2) + eps)", _rms_without_eps),
    Mistake("eps added outside the square root: divide by sqrt(mean(x**2) + eps)", _rms_eps_outside_the_root),
    Mistake("the mean was subtracted (LayerNorm): RMSNorm does not centre, it divides x itself by its root mean "
            "square", _rms_centred),
    *[Mistake("the mean of x**2 was taken over the wrong axis: one value per vector, over the LAST dimension",
              _rms_mean_over(dim)) for dim in (0, 1, -2)],
    Mistake("the mean of x**2 was taken over the whole tensor: one value per vector, over the last dimension "
            "(mean(dim=-1, keepdim=True))", _rms_mean_over_everything),
    Mistake("the square root is missing: divide by sqrt(mean(x**2) + eps), not by the mean square",
            _rms_without_root),
    Mistake("self.weight is not applied: multiply the normalised x by self.weight", _rms_without_weight),
    Mistake("the sum of x**2 instead of its mean: divide by the ROOT MEAN square", _rms_sum_of_squares),
]
RMS = dict(mistakes=RMS_MISTAKES)


@hidden.test("test_RMSNorm")
def _(t):
    t.module("RMSNorm", dict(dim=8), t.randn(2, 5, 8), label="(2, 5, 8)", **RMS)
    t.module("RMSNorm", dict(dim=6), t.randn(3, 6) * 1e-3, label="tiny values, where eps matters", **RMS)
    t.module("RMSNorm", dict(dim=4, eps=0.5), t.randn(2, 3, 4), label="eps=0.5", **RMS)
    t.module("RMSNorm", dict(dim=5), t.randn(2, 4, 5) + 3.0, label="inputs with a large mean", **RMS)
    t.module("RMSNorm", dict(dim=8), t.randn(2, 2, 3, 8, dtype=torch.float64), dtype=torch.float64,
             label="float64, 4 dimensions", **RMS)
    t.module("RMSNorm", dict(dim=6), t.randn(3, 6), grad=True, label="gradients", **RMS)


# %% [markdown]
# ## 3. Rotary positions in the halves layout (GPT-NeoX, and `transformers`' Llama and Qwen)
#
# Chapter 4's `apply_rope` followed RoFormer (Su et al., 2021): it cut each query or key
# vector into pairs of **neighbouring** features $(x_{2i}, x_{2i+1})$ and rotated pair
# $i$ at position $p$ by the angle $p\,\theta_i$, $\theta_i = b^{-2i/d}$. The scores
# $q_m \cdot k_n$ then depend on the positions only through $m - n$.
#
# Meta's reference code for Llama pairs features the same way (as complex numbers). GPT-NeoX
# (Black et al., 2022) pairs them differently: feature $i$ with feature $i + d/2$, the
# **first half** with the **second half**. The `transformers` library uses this halves layout
# for Llama and Qwen (Qwen's checkpoints are published in it; Meta's Llama checkpoints are
# converted, below). For $i < d/2$ the pair $(a, b) = (x_i, x_{i+d/2})$ at position $p$ becomes
#
# $$\big(a\cos(p\theta_i) - b\sin(p\theta_i),\ \ a\sin(p\theta_i) + b\cos(p\theta_i)\big),
# \qquad \theta_i = b_\text{base}^{-2i/d},$$
#
# the same counter-clockwise rotation by the same angle as in Chapter 4; only *which*
# features form a pair differs. It is written with half-size slices instead of strided
# ones (`x[..., :d/2]` and `x[..., d/2:]`).
# Another change: a model with a cache must rotate its $N$ new tokens at their **true
# positions** $P, \dots, P+N-1$, not at $0, \dots, N-1$, so this function takes the
# positions as an argument.
#
# ### Exercise: `apply_rope_halves`
#
# ```{dropdown} Hint
# Compute the angles as `positions[:, None] * theta[None, :]`, shape $(N, d/2)$, and
# their cosine and sine (in float64 if you like, then cast to `x.dtype`). Split `x` into
# `a = x[..., :d//2]` and `b = x[..., d//2:]`, and concatenate the two rotated halves.
# ```

# %% [exercise apply_rope_halves]
def apply_rope_halves(x, positions, base=10000.0):
    """Rotary position embedding in the halves layout (GPT-NeoX; transformers' Llama and Qwen).

    Args:
        x: (..., N, d) float tensor, d even.
        positions: (N,) long tensor, the position of each of the N rows of x.
        base: the base of the frequencies theta_i = base ** (-2i / d).

    For i < d/2 the pair (a, b) = (x[..., n, i], x[..., n, i + d/2]) is rotated by
    the angle positions[n] * theta_i:
        out[..., n, i]       = a * cos - b * sin
        out[..., n, i + d/2] = a * sin + b * cos
    Returns a new tensor of the same shape and dtype as x.
    """
    ### BEGIN SOLUTION
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)   # (d/2,)
    angles = positions.to(torch.float64)[:, None] * theta[None, :]                      # (N, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]                                            # (..., N, d/2) each
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    ### END SOLUTION


# %% [test test_apply_rope_halves points=2]
"""Pairs (i, i + d/2) rotated counter-clockwise by positions[n] * base^(-2i/d)."""
ar_x = torch.tensor([[1.0, 0.0, 0.0, 0.0]])                      # N = 1, d = 4: a = (1, 0), b = (0, 0)
ar_out = apply_rope_halves(ar_x, torch.tensor([0]))
assert ar_out.shape == (1, 4), f"the output keeps the input's shape (1, 4), got {tuple(ar_out.shape)}"
assert torch.allclose(ar_out, ar_x), "position 0 must leave x unchanged"
ar_1 = apply_rope_halves(ar_x, torch.tensor([1]))
assert torch.allclose(ar_1, torch.tensor([[math.cos(1.0), 0.0, math.sin(1.0), 0.0]]), atol=1e-6), \
    ("x = (1, 0, 0, 0) at position 1 pairs feature 0 with feature 2 (i and i + d/2, not neighbours) and rotates "
     "counter-clockwise by 1 radian: expected (cos 1, 0, sin 1, 0)")
ar_2 = apply_rope_halves(torch.tensor([[0.0, 1.0, 0.0, 0.0]]), torch.tensor([3]), base=100.0)
ar_angle = 3 * 100.0 ** (-2 / 4)
assert torch.allclose(ar_2, torch.tensor([[0.0, math.cos(ar_angle), 0.0, math.sin(ar_angle)]]), atol=1e-6), \
    "pair 1 at position 3 rotates by 3 * base^(-2/4): use the base argument and theta_i = base^(-2i/d)"
torch.manual_seed(1)
ar_q, ar_k = torch.randn(2, 6, 8), torch.randn(2, 6, 8)
ar_s1 = apply_rope_halves(ar_q, torch.arange(6)) @ apply_rope_halves(ar_k, torch.arange(6)).transpose(-2, -1)
ar_s2 = apply_rope_halves(ar_q, torch.arange(10, 16)) @ apply_rope_halves(ar_k, torch.arange(10, 16)).transpose(-2, -1)
assert torch.allclose(ar_s1, ar_s2, atol=1e-4), "scores must depend only on position differences: rotate by positions[n]"
assert not torch.allclose(apply_rope_halves(ar_q, torch.arange(10, 16)), apply_rope_halves(ar_q, torch.arange(6))), \
    "the positions argument is ignored: row n must be rotated by positions[n], not by n"


# %% [hidden]
# The reference in three steps (frequencies, angles, the rotation of the two halves); each
# mistake below changes one of them.
def _frequencies(d, base):
    """theta_i = base ** (-2i / d), i = 0 .. d/2 - 1, in float64."""
    return base ** (-(torch.arange(0, d, 2, dtype=torch.float64) / d))


def _cos_sin(x, positions, theta):
    angles = positions.to(torch.float64)[:, None] * theta
    return angles.cos().to(x.dtype), angles.sin().to(x.dtype)


def _halves(x):
    d = x.shape[-1]
    return x[..., :d // 2], x[..., d // 2:]


def _rotated(x, cos, sin):
    """Feature i and feature i + d/2 rotated counter-clockwise by their angle."""
    a, b = _halves(x)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _rope(x, positions, base=10000.0):
    return _rotated(x, *_cos_sin(x, positions, _frequencies(x.shape[-1], base)))


def _rope_interleaved(x, positions, base=10000.0):
    cos, sin = _cos_sin(x, positions, _frequencies(x.shape[-1], base))
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rope_positions_ignored(x, positions, base=10000.0):
    return _rope(x, torch.arange(x.shape[-2]), base)


def _rope_clockwise(x, positions, base=10000.0):
    cos, sin = _cos_sin(x, positions, _frequencies(x.shape[-1], base))
    a, b = _halves(x)
    return torch.cat([a * cos + b * sin, -a * sin + b * cos], dim=-1)


def _rope_halves_swapped(x, positions, base=10000.0):
    cos, sin = _cos_sin(x, positions, _frequencies(x.shape[-1], base))
    a, b = _halves(x)
    return torch.cat([a * sin + b * cos, a * cos - b * sin], dim=-1)


def _rope_base_ignored(x, positions, base=10000.0):
    return _rope(x, positions, 10000.0)


def _rope_i_over_d(x, positions, base=10000.0):
    d = x.shape[-1]
    return _rotated(x, *_cos_sin(x, positions, base ** (-(torch.arange(0, d // 2, dtype=torch.float64) / d))))


ROPE_MISTAKES = [
    Mistake("neighbouring pairs (2i, 2i+1) rotated (Chapter 4's interleaved layout): here feature i pairs with "
            "feature i + d/2", _rope_interleaved),
    Mistake("the positions argument is ignored: row n is rotated by positions[n], not by n", _rope_positions_ignored),
    Mistake("rotated clockwise (the sign of sin flipped): out_i = a cos - b sin, out_(i+d/2) = a sin + b cos",
            _rope_clockwise),
    Mistake("the two rotated halves were concatenated in the wrong order: first a cos - b sin, then a sin + b cos",
            _rope_halves_swapped),
    Mistake("the base argument is ignored: theta_i = base ** (-2i / d)", _rope_base_ignored),
    Mistake("frequencies base ** (-i / d) instead of base ** (-2i / d)", _rope_i_over_d),
]


@hidden.test("test_apply_rope_halves")
def _(t):
    t.function("apply_rope_halves", t.randn(2, 5, 8), torch.arange(5), mistakes=ROPE_MISTAKES,
               label="(2, 5, 8), positions 0..4")
    t.function("apply_rope_halves", t.randn(3, 4, 6), torch.tensor([7, 8, 9, 10]), base=100.0,
               mistakes=ROPE_MISTAKES, label="positions 7..10, base=100")
    t.function("apply_rope_halves", t.randn(2, 3, 1, 4), torch.tensor([13]), mistakes=ROPE_MISTAKES,
               label="one position (13), 4 dimensions")
    t.function("apply_rope_halves", t.randn(4, 12, dtype=torch.float64), torch.tensor([0, 2, 5, 40]), base=500.0,
               mistakes=ROPE_MISTAKES, label="float64, positions not consecutive")
    t.function("apply_rope_halves", t.randn(2, 3, 6), torch.arange(3, 6), grad=True, mistakes=ROPE_MISTAKES,
               label="gradients")


# %% [markdown]
# **The two layouts are one embedding.** Let $\Pi$ be the permutation of the $d$ features
# that puts features $0, 2, 4, \dots$ first and $1, 3, 5, \dots$ after them. Then
# neighbouring pair $(2i, 2i+1)$ becomes pair $(i, i+d/2)$, and rotating before or
# after the permutation is the same:
#
# $$\operatorname{RoPE}_\text{halves}(x\,\Pi) = \operatorname{RoPE}_\text{interleaved}(x)\,\Pi .$$
#
# Because a dot product does not change when both vectors are permuted the same way, a
# model trained with one layout is the same model as one with the other layout and the
# rows of its query and key projections permuted: this is what conversion scripts do
# when they move Meta's original Llama checkpoints (interleaved) into `transformers`
# (halves). Check it, with Chapter 4's interleaved formula written out below:

# %%
def rope_interleaved(x, positions, base=10000.0):
    """Chapter 4's RoPE: neighbouring pairs (2i, 2i+1), at the given positions."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[:, None] * theta
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


torch.manual_seed(0)
d_demo = 8
perm = torch.cat([torch.arange(0, d_demo, 2), torch.arange(1, d_demo, 2)])   # even features first, then odd
x_demo, y_demo = torch.randn(5, d_demo, dtype=torch.float64), torch.randn(5, d_demo, dtype=torch.float64)
pos_demo = torch.arange(3, 8)
layout_gap = (apply_rope_halves(x_demo[:, perm], pos_demo) - rope_interleaved(x_demo, pos_demo)[:, perm]).abs().max()
scores_halves = apply_rope_halves(x_demo[:, perm], pos_demo) @ apply_rope_halves(y_demo[:, perm], pos_demo).T
scores_inter = rope_interleaved(x_demo, pos_demo) @ rope_interleaved(y_demo, pos_demo).T
print("permutation:", perm.tolist())
print(f"max |halves(x permuted) - interleaved(x) permuted| = {layout_gap:.1e}")
print(f"max |score difference| = {(scores_halves - scores_inter).abs().max():.1e}")
print(f"without the permutation the layouts differ by up to "
      f"{(apply_rope_halves(x_demo, pos_demo) - rope_interleaved(x_demo, pos_demo)).abs().max():.2f}")
score_gap = (scores_halves - scores_inter).abs().max().item()
glue("layout_gap", f"{max(layout_gap, score_gap):.0e}", display=False)

# %% [tags=hide-input]
def draw_rope_layouts(d=8):
    """Which features each layout rotates together: a colour per pair, arcs joining the two features."""
    text = {"title": "Which features form a rotated pair (d = 8)",
            "inter": "interleaved (RoFormer, Meta's Llama code, Chapter 4)",
            "halves": "halves (GPT-NeoX, transformers' Llama and Qwen)"}
    colors = plt.cm.tab10(range(d // 2))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for row, (y, name) in enumerate([(2.2, "inter"), (0.4, "halves")]):
        for f in range(d):
            pair = f // 2 if name == "inter" else f % (d // 2)
            ax.add_patch(plt.Rectangle((f, y), 0.9, 0.6, fc=colors[pair], ec="black", alpha=0.8))
            ax.text(f + 0.45, y + 0.3, str(f), ha="center", va="center", fontsize=9)
        for i in range(d // 2):
            a, b = (2 * i, 2 * i + 1) if name == "inter" else (i, i + d // 2)
            ax.annotate("", xy=(b + 0.45, y + 0.62), xytext=(a + 0.45, y + 0.62),
                        arrowprops=dict(arrowstyle="-", color=colors[i], lw=1.5,
                                        connectionstyle=f"arc3,rad={-0.25 if name == 'inter' else -0.12}"))
        ax.text(-0.2, y + 1.15, text[name], fontsize=9, ha="left")
    ax.set_xlim(-0.3, d + 1.2)
    ax.set_ylim(0, 3.8)
    ax.axis("off")
    ax.set_title(text["title"], fontsize=10)
    return fig


draw_rope_layouts()
plt.show()

# %% [markdown]
# The two agree to {glue:text}`layout_gap` (float64 rounding) once the features are
# permuted, and differ without the permutation. A checkpoint converted without
# permuting the rows of `q_proj` and `k_proj` loads without any error and gives a
# broken model. The figure shows which features each layout pairs, for $d = 8$.
#
# ## 4. Attention with QK-norm, rotary positions and shared key/value heads
#
# Qwen3's attention layer combines four things you know, in this order:
#
# 1. **Projections without bias.** `q_proj` gives $h$ query heads, `k_proj` and `v_proj`
#    give $h_{kv}$ key and value heads, all of width $d_\text{head}$ (given explicitly:
#    in Qwen3, $h \cdot d_\text{head}$ need not equal $d$).
# 2. **QK-norm** (Henry et al., 2020; Dehghani et al., 2023; in Qwen3 since 2025):
#    every query head and every key head is normalised by an RMSNorm over its
#    $d_\text{head}$ features (`q_norm`, `k_norm`, one weight vector shared by all
#    heads), *before* the rotation. Dot products of unit-scale vectors cannot grow
#    without bound, which keeps training stable at large learning rates.
# 3. **Rotary positions** at the tokens' true positions $P, \dots, P+N-1$ (Section 3),
#    on queries and keys, not on values.
# 4. **Grouped-query attention** (Ainslie et al., 2023; Chapter 6): query head $i$ reads
#    key/value head $\lfloor i / (h / h_{kv}) \rfloor$, so consecutive query heads
#    share a key/value head. Only the $h_{kv}$ key and value heads are cached.
#
# With the cache of Chapter 7 (`past`, `present`, the causal mask on an $N \times (P+N)$
# grid), scores scaled by $1/\sqrt{d_\text{head}}$, and the heads concatenated in order
# before `o_proj`. The cached keys are stored *after* normalisation and rotation: a
# key's rotation depends only on its own position, so it never has to be redone.
#
# ### Exercise: `ModernAttention`
#
# Do not call `F.scaled_dot_product_attention` here (the grader checks); compute the
# scores and the mask yourself, as in Chapter 7.
#
# ```{dropdown} Hint: sharing key/value heads
# After the cache is concatenated, `k.repeat_interleave(h // h_kv, dim=1)` turns
# $(B, h_{kv}, T, d_\text{head})$ into $(B, h, T, d_\text{head})$ with key head $j$
# repeated for query heads $j\,g, \dots, j\,g + g - 1$. `k.repeat(1, g, 1, 1)` would
# repeat the whole list instead: query head $i$ would read head $i \bmod h_{kv}$.
# ```

# %% [exercise ModernAttention]
class ModernAttention(nn.Module):
    """Qwen3's attention: QK-norm, rotary positions, grouped-query heads, a key/value cache."""

    def __init__(self, d_model, num_heads, num_kv_heads, head_dim, rope_base=10000.0, eps=1e-6):
        super().__init__()
        assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rope_base = rope_base
        self.q_proj = nn.Linear(d_model, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, d_model, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)      # QK-norm: one RMSNorm over each head's features
        self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x, past=None):
        """Causal self-attention over the cached tokens and the N new ones.

        Args:
            x: (B, N, d_model), the N new tokens, at positions P .. P+N-1.
            past: None (P = 0) or (k_past, v_past), each (B, num_kv_heads, P, head_dim).

        Head i uses features i*head_dim:(i+1)*head_dim of each projection. Each query
        and key head is normalised by self.q_norm / self.k_norm, then rotated by
        apply_rope_halves at positions P .. P+N-1 (base self.rope_base). Query head i
        uses key/value head i // (num_heads // num_kv_heads). Scores are scaled by
        1/sqrt(head_dim); the query at position p sees the keys at positions <= p.
        The heads are concatenated in order and passed through self.o_proj.

        Returns (y, present): y (B, N, d_model); present = (k_all, v_all), each
        (B, num_kv_heads, P + N, head_dim), the past followed by the new keys (after
        normalisation and rotation) and values.
        """
        ### BEGIN SOLUTION
        B, N, _ = x.shape
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x).view(B, N, h, d).transpose(1, 2)        # (B, h, N, d)
        k = self.k_proj(x).view(B, N, h_kv, d).transpose(1, 2)     # (B, h_kv, N, d)
        v = self.v_proj(x).view(B, N, h_kv, d).transpose(1, 2)
        P = 0 if past is None else past[0].size(2)
        positions = torch.arange(P, P + N, device=x.device)
        q = apply_rope_halves(self.q_norm(q), positions, self.rope_base)
        k = apply_rope_halves(self.k_norm(k), positions, self.rope_base)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)                     # (B, h_kv, P+N, d)
            v = torch.cat([past[1], v], dim=2)
        group = h // h_kv
        k_all, v_all = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)   # (B, h, P+N, d)
        scores = q @ k_all.transpose(-2, -1) / math.sqrt(d)        # (B, h, N, P+N)
        mask = torch.ones(N, P + N, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = (weights @ v_all).transpose(1, 2).reshape(B, N, h * d)  # heads concatenated in order
        return self.o_proj(y), (k, v)
        ### END SOLUTION


# %% [markdown]
# The tests of `ModernAttention` use your `RMSNorm` and `apply_rope_halves`. So that a
# mistake in one of them is not blamed on the attention, each test first checks them on
# a small case with the given function below, and says which exercise to fix first.
# (The grader grades every exercise on its own, with correct versions of the others.)

# %% [export tags=hide-input]
def check_parts_first(*names):
    """Given: fail with "fix `NAME` first" when one of the earlier exercises NAMES is wrong on a small case."""
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        x = torch.randn(2, 5, 8)
        for name in names:
            try:
                if name == "RMSNorm":
                    norm = RMSNorm(8)
                    norm.weight.copy_(torch.randn(8))
                    want = norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
                    assert torch.allclose(norm(x), want, atol=1e-5), \
                        "fix `RMSNorm` first: it differs from weight * x / sqrt(mean(x**2) + eps), and this test uses it"
                elif name == "apply_rope_halves":
                    pos = torch.arange(3, 8)
                    ang = pos[:, None].double() * 100.0 ** (-torch.arange(0, 8, 2).double() / 8)
                    cos, sin = ang.cos().float(), ang.sin().float()
                    a, b = x[..., :4], x[..., 4:]
                    want = torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
                    assert torch.allclose(apply_rope_halves(x, pos, 100.0), want, atol=1e-5), \
                        "fix `apply_rope_halves` first: it differs from the rotation of pairs (i, i + d/2), and this test uses it"
            except NotImplementedError:
                raise NotImplementedError(f"fix `{name}` first: it is not implemented yet, and this test uses it") from None


def attention_by_formula(attn, x, P=0):
    """Given: ModernAttention's output without a cache, head by head, written as plainly as possible."""
    B, N, _ = x.shape
    h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q_all, k_all, v_all = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    positions = torch.arange(P, P + N)
    heads = []
    for i in range(h):
        j = i // (h // h_kv)                                       # the key/value head of query head i
        q = apply_rope_halves(attn.q_norm(q_all[..., i * d:(i + 1) * d]), positions, attn.rope_base)
        k = apply_rope_halves(attn.k_norm(k_all[..., j * d:(j + 1) * d]), positions, attn.rope_base)
        s = q @ k.transpose(-2, -1) / math.sqrt(d)
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v_all[..., j * d:(j + 1) * d])
    return attn.o_proj(torch.cat(heads, dim=-1))


def built_with(cls, init, state, dtype=torch.float32):
    """Given: cls(**init) in eval mode, its parameters set to `state` (name -> tensor), in `dtype`."""
    module = cls(**init).to(dtype)
    with torch.no_grad():
        for name, value in state.items():
            module.get_parameter(name).copy_(value)
    return module.eval()


def relative_gap(a, b):
    """Given: the largest |a - b|, relative to the largest |b|."""
    return (a - b).abs().max() / b.abs().max().clamp_min(1e-30)


def attention_steps_gap(init, state, x, split):
    """Given, for the grader's cache test: your ModernAttention on x[:, :split], then on the rest with
    the cache. Returns (present, gap): the cache after both calls, and how far their outputs are from
    one call on all of x (rounding only when the cache is used right, whatever else the layer does)."""
    attn = built_with(ModernAttention, init, state, x.dtype)
    y_all, _ = attn(x)
    y_first, past = attn(x[:, :split])
    y_rest, present = attn(x[:, split:], past)
    return present, relative_gap(torch.cat([y_first, y_rest], dim=1), y_all)


# %% [test test_ModernAttention_no_cache points=3]
"""Without a cache: QK-norm, then rotary positions 0..N-1, query head i reads key/value head i // group."""
check_parts_first("RMSNorm", "apply_rope_halves")
torch.manual_seed(2)
ma = ModernAttention(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0)
with torch.no_grad():                                   # non-default norm weights, so that QK-norm shows
    ma.q_norm.weight.copy_(torch.randn(6))
    ma.k_norm.weight.copy_(torch.randn(6))
ma_x = torch.randn(2, 5, 16)
ma_out = ma(ma_x)
assert isinstance(ma_out, tuple) and len(ma_out) == 2, "forward must return (y, present)"
ma_y, (ma_k, ma_v) = ma_out
assert ma_y.shape == (2, 5, 16), f"y should be (B, N, d_model) = (2, 5, 16), got {tuple(ma_y.shape)}"
assert ma_k.shape == (2, 2, 5, 6) and ma_v.shape == (2, 2, 5, 6), \
    "present keys and values should be (B, num_kv_heads, N, head_dim) = (2, 2, 5, 6): cache the 2 key/value heads, not the 4 repeated ones"
with torch.no_grad():
    ma_expected = attention_by_formula(ma, ma_x)
    ma_k_expected = apply_rope_halves(ma.k_norm(ma.k_proj(ma_x).view(2, 5, 2, 6).transpose(1, 2)), torch.arange(5), 100.0)
assert torch.allclose(ma_k, ma_k_expected, atol=1e-5), \
    "present keys differ from k_norm(k_proj(x) split into heads), rotated at positions 0..N-1: normalise BEFORE the rotation"
assert torch.allclose(ma_y, ma_expected, atol=1e-5), \
    "y differs from the formula: check the head mapping (query head i reads key/value head i // (num_heads // num_kv_heads), use repeat_interleave), the scale 1/sqrt(head_dim) and the causal mask"

# %% [test test_ModernAttention_cache points=2]
"""With a cache: new tokens rotated at positions P..P+N-1; a prefix call then the rest equals one call."""
check_parts_first("RMSNorm", "apply_rope_halves")
torch.manual_seed(3)
mc = ModernAttention(d_model=12, num_heads=6, num_kv_heads=2, head_dim=4)
mc_x = torch.randn(2, 8, 12)
with torch.no_grad():
    mc_full, (mc_kf, mc_vf) = mc(mc_x)
    mc_a, mc_pa = mc(mc_x[:, :5])
    mc_b, mc_pb = mc(mc_x[:, 5:6], mc_pa)
    mc_c, mc_pc = mc(mc_x[:, 6:], mc_pb)
assert mc_pc[0].shape == (2, 2, 8, 4), \
    f"after 5 + 1 + 2 tokens the cached keys should be (2, 2, 8, 4), got {tuple(mc_pc[0].shape)}: concatenate past and new on dim 2"
assert torch.allclose(mc_pc[0], mc_kf, atol=1e-5), \
    "the cached keys after three calls differ from one call on all tokens: rotate the new keys at positions P .. P+N-1 (P = past[0].size(2)), not from 0"
assert torch.allclose(mc_b, mc_full[:, 5:6], atol=1e-5) and torch.allclose(mc_c, mc_full[:, 6:], atol=1e-5), \
    "with a cache the output differs from one call on all tokens: queries at positions P .. P+N-1, mask tril(diagonal=P) on an (N, P+N) grid"


# %% [hidden]
# The reference forward in named steps; `_attention` takes each step as a keyword, and each
# mistake below is one step written wrong (`_attention_with(step=the wrong one)`).
def _norm_then_rotate(m, q, k, rotate):
    """QK-norm on each head, then the rotation: (queries, keys, the keys the cache keeps)."""
    q, k = m.q_norm(q), m.k_norm(k)
    k_r = rotate(k)
    return rotate(q), k_r, k_r


def _positions_after_past(P, N):
    return torch.arange(P, P + N)


def _past_first(past, new, dim):
    return torch.cat([past, new], dim)


def _grouped_heads(kv, group):
    """Query head i reads key/value head i // group."""
    return kv.repeat_interleave(group, 1)


def _head_scale(m, x):
    return math.sqrt(m.head_dim)


def _causal_after_past(N, T):
    """The diagonal of tril on the (N, T) grid: the query at position T - N + n sees keys 0 .. T - N + n."""
    return T - N


def _attention(m, x, past=None, qk=_norm_then_rotate, positions=_positions_after_past, join=_past_first,
               heads=_grouped_heads, scale=_head_scale, diagonal=_causal_after_past):
    B, N, _ = x.shape
    h, h_kv, d = m.num_heads, m.num_kv_heads, m.head_dim
    q = m.q_proj(x).view(B, N, h, d).transpose(1, 2)
    k = m.k_proj(x).view(B, N, h_kv, d).transpose(1, 2)
    v = m.v_proj(x).view(B, N, h_kv, d).transpose(1, 2)
    pos = positions(0 if past is None else past[0].size(2), N)
    q_r, k_r, k_cached = qk(m, q, k, lambda z: ref.apply_rope_halves(z, pos, m.rope_base))
    if past is None:
        k_all, v_all, k_store = k_r, v, k_cached
    else:
        k_all, v_all, k_store = join(past[0], k_r, 2), join(past[1], v, 2), join(past[0], k_cached, 2)
    s = q_r @ heads(k_all, h // h_kv).transpose(-2, -1) / scale(m, x)
    T = k_all.size(2)
    s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=diagonal(N, T)), float("-inf"))
    y = (s.softmax(-1) @ heads(v_all, h // h_kv)).transpose(1, 2).reshape(B, N, h * d)
    return m.o_proj(y), (k_store, v_all)


def _attention_with(**wrong_step):
    return lambda m, x, past=None: _attention(m, x, past, **wrong_step)


def _no_qk_norm(m, q, k, rotate):
    k_r = rotate(k)
    return rotate(q), k_r, k_r


def _norm_after_rotation(m, q, k, rotate):
    k_r = m.k_norm(rotate(k))
    return m.q_norm(rotate(q)), k_r, k_r


def _norms_swapped(m, q, k, rotate):
    k_r = rotate(m.q_norm(k))
    return rotate(m.k_norm(q)), k_r, k_r


def _cached_before_rotation(m, q, k, rotate):
    q, k = m.q_norm(q), m.k_norm(k)
    return rotate(q), rotate(k), k


def _positions_from_zero(P, N):
    return torch.arange(N)


def _new_first(past, new, dim):
    return torch.cat([new, past], dim)


def _cycled_heads(kv, group):
    """Query head i reads key/value head i % num_kv_heads."""
    return kv.repeat(1, group, 1, 1)


def _model_scale(m, x):
    return math.sqrt(x.size(-1))


def _query_width_scale(m, x):
    return math.sqrt(m.num_heads * m.head_dim)


def _no_scale(m, x):
    return 1.0


def _causal_off_by(offset):
    return lambda N, T: T - N + offset


def _causal_ignoring_past(N, T):
    return 0


# The cache's mistakes: judged on the layer's output and cache, and on two calls against one (STEPS_MISTAKES).
CACHE_MISTAKES = [
    Mistake("positions restart at 0 with a cache: the new tokens are rotated at positions P .. P+N-1, "
            "P = past[0].size(2)", _attention_with(positions=_positions_from_zero)),
    Mistake("the cached keys were stored before the rotation: present holds the keys after normalisation AND "
            "rotation", _attention_with(qk=_cached_before_rotation)),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new keys and values",
            _attention_with(join=_new_first)),
]
ATTN_MISTAKES = [
    Mistake("QK-norm skipped: normalise each query head with q_norm and each key head with k_norm",
            _attention_with(qk=_no_qk_norm)),
    Mistake("QK-norm applied after the rotation: Qwen3 normalises each head first, then rotates it",
            _attention_with(qk=_norm_after_rotation)),
    Mistake("q_norm and k_norm swapped: q_norm is for the queries, k_norm for the keys",
            _attention_with(qk=_norms_swapped)),
    Mistake("query head i read key/value head i % num_kv_heads: it reads head i // (num_heads // num_kv_heads) "
            "(repeat_interleave, not repeat)", _attention_with(heads=_cycled_heads)),
    Mistake("scores scaled by 1/sqrt(d_model): scale by 1/sqrt(head_dim)", _attention_with(scale=_model_scale)),
    Mistake("scores scaled by 1/sqrt(num_heads * head_dim): scale by 1/sqrt(head_dim)",
            _attention_with(scale=_query_width_scale)),
    Mistake("scores not scaled by 1/sqrt(head_dim)", _attention_with(scale=_no_scale)),
    *CACHE_MISTAKES,
    *[Mistake("the causal mask is off by one: the query at position p attends to keys 0 .. p, itself included",
              _attention_with(diagonal=_causal_off_by(o))) for o in (-1, 1)],
]
ATTN = dict(mistakes=ATTN_MISTAKES, deps=("RMSNorm", "apply_rope_halves"), returns=("y", "present"))


def _kv_past(t, B, h_kv, P, d, dtype=torch.float32):
    return (t.randn(B, h_kv, P, d, dtype=dtype), t.randn(B, h_kv, P, d, dtype=dtype))


def _close_all(a, b):
    if isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and all(_close_all(x, y) for x, y in zip(a, b))
    return close(a, b)


def _judge_part(index):
    """Judge one returned value of (y, present) only: each test judges its own property."""
    return lambda student, expected: isinstance(student, (tuple, list)) and len(student) == len(expected) \
        and _close_all(student[index], expected[index])


def _state(t, name, init, dtype=torch.float32):
    """Random parameter values for the reference class `name`, as a probe of a given helper passes them."""
    return {n: t.randn(*p.shape, dtype=dtype) * 0.5 for n, p in getattr(ref, name)(**init).named_parameters()}


def _steps_with(layer):
    """attention_steps_gap for a mistake model of the layer: (present, gap) as the helper returns them."""
    def compute(init, state, x, split):
        m = ref.built_with(ref.ModernAttention, init, state, x.dtype)
        y_all, _ = layer(m, x)
        y_first, past = layer(m, x[:, :split])
        y_rest, present = layer(m, x[:, split:], past)
        return present, ref.relative_gap(torch.cat([y_first, y_rest], dim=1), y_all)
    return compute


def _steps_hint(probe, value):
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[1], torch.Tensor) \
            and value[1].numel() == 1 and not value[1].item() < 1e-4:
        return (f"a prefix call and then the rest with the cache give another output than one call on all tokens "
                f"(largest relative difference {value[1].item():.1e}): rotate the new queries at positions "
                f"P .. P+N-1 and mask with tril(diagonal=P) on the (N, P+N) grid")
    return None


STEPS_MISTAKES = [
    *[Mistake(mistake.message, _steps_with(mistake.compute)) for mistake in CACHE_MISTAKES],
    Mistake("the causal mask ignores the cache: on the (N, P+N) grid of a call with a cache, the query at "
            "position P+n sees keys 0 .. P+n (tril(diagonal=P))",
            _steps_with(_attention_with(diagonal=_causal_ignoring_past))),
]


@hidden.test("test_ModernAttention_no_cache")
def _(t):
    t.module("ModernAttention", dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0),
             t.randn(2, 5, 16), label="4 query heads, 2 key/value heads, head_dim 6", **ATTN)
    t.module("ModernAttention", dict(d_model=12, num_heads=6, num_kv_heads=3, head_dim=4), t.randn(1, 7, 12),
             label="6 query heads, 3 key/value heads", **ATTN)
    t.module("ModernAttention", dict(d_model=8, num_heads=4, num_kv_heads=1, head_dim=8, eps=0.1),
             t.randn(2, 4, 8), label="one key/value head (MQA), eps=0.1", **ATTN)
    t.module("ModernAttention", dict(d_model=8, num_heads=2, num_kv_heads=2, head_dim=4), t.randn(3, 5, 8),
             label="as many key/value heads as query heads (MHA)", **ATTN)
    t.module("ModernAttention", dict(d_model=12, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=30.0),
             t.randn(2, 6, 12, dtype=torch.float64), dtype=torch.float64, label="float64", **ATTN)
    t.module("ModernAttention", dict(d_model=8, num_heads=4, num_kv_heads=2, head_dim=4), t.randn(2, 4, 8),
             grad=True, label="gradients", **ATTN)


@hidden.test("test_ModernAttention_cache")
def _(t):
    # The cache's contents, against the reference's (the output with a random past also depends on
    # the head mapping and the scale, which test_ModernAttention_no_cache judges) ...
    present = dict(ATTN, equivalent=_judge_part(1))
    t.module("ModernAttention", dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0),
             t.randn(2, 1, 16), _kv_past(t, 2, 2, 6, 6), label="one new token, a cache of 6", **present)
    t.module("ModernAttention", dict(d_model=12, num_heads=6, num_kv_heads=2, head_dim=4, rope_base=50.0),
             t.randn(3, 3, 12), _kv_past(t, 3, 2, 4, 4), label="3 new tokens, a cache of 4", **present)
    t.module("ModernAttention", dict(d_model=8, num_heads=2, num_kv_heads=1, head_dim=4), t.randn(1, 2, 8),
             past=_kv_past(t, 1, 1, 9, 4), label="2 new tokens, a cache of 9 (past as a keyword)", **present)
    # ... and the cache's use: your layer in two calls against your layer in one (attention_steps_gap).
    def steps(init, shape, split, dtype=torch.float32, label=""):
        t.function("attention_steps_gap", init, _state(t, "ModernAttention", init, dtype),
                   t.randn(*shape, dtype=dtype), split, mistakes=STEPS_MISTAKES, checks=(_steps_hint,),
                   deps=("RMSNorm", "apply_rope_halves"), returns=("present", "gap"), label=label)
    steps(dict(d_model=16, num_heads=4, num_kv_heads=2, head_dim=6, rope_base=100.0), (2, 7, 16), 5,
          label="5 tokens, then 2 with the cache")
    steps(dict(d_model=12, num_heads=6, num_kv_heads=2, head_dim=4, rope_base=50.0), (1, 9, 12), 8,
          label="8 tokens, then 1 with the cache")
    steps(dict(d_model=8, num_heads=4, num_kv_heads=1, head_dim=4), (2, 6, 8), 3, torch.float64,
          label="3 tokens, then 3 with the cache, float64")


# %% [markdown]
# ## 5. SwiGLU
#
# GPT-2's MLP applies GELU to one projection. Shazeer (2020) compared *gated* variants
# (Dauphin et al., 2017): two projections of the input, one passed through a
# non-linearity and used as a gate on the other, multiplied feature by feature. With the
# SiLU (also called swish, $\operatorname{silu}(z) = z\,\sigma(z)$) as the gate's
# non-linearity, this is **SwiGLU**, used by PaLM, Llama, Qwen and DeepSeek:
#
# $$\operatorname{SwiGLU}(x) = \big(\operatorname{silu}(x W_\text{gate}) \odot x W_\text{up}\big)\, W_\text{down},
# \qquad W_\text{gate}, W_\text{up} \in \mathbb{R}^{d\times d_\text{ff}},\ W_\text{down} \in \mathbb{R}^{d_\text{ff}\times d}.$$
#
# It has three matrices instead of two. Shazeer (2020) shrank $d_\text{ff}$ to $\frac{8}{3}d$
# to keep the parameter count of a $4d$ MLP, as LLaMA 1 and 2 do (Touvron et al., 2023:
# 11,008 for $d = 4{,}096$). Later models chose wider ones: Llama 3 uses $3.5\,d$ (14,336 for
# $d = 4{,}096$; Grattafiori et al., 2024) and Qwen3 $3\,d$ (Qwen3-8B: 12,288 for $d = 4{,}096$).
#
# ### Exercise: `SwiGLU`

# %% [exercise SwiGLU]
class SwiGLU(nn.Module):
    """The gated feed-forward network of Llama and Qwen: down(silu(gate(x)) * up(x))."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        """x: (..., d_model) -> (..., d_model) = down_proj(silu(gate_proj(x)) * up_proj(x))."""
        ### BEGIN SOLUTION
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        ### END SOLUTION


# %% [test test_SwiGLU points=2]
"""down_proj(silu(gate_proj(x)) * up_proj(x)): SiLU on the gate, not on up; not GELU."""
torch.manual_seed(4)
sg = SwiGLU(d_model=6, d_ff=10)
sg_x = torch.randn(3, 4, 6)
sg_y = sg(sg_x)
assert sg_y.shape == (3, 4, 6), f"the output is (..., d_model) = (3, 4, 6), got {tuple(sg_y.shape)}"
with torch.no_grad():
    sg_g, sg_u = sg.gate_proj(sg_x), sg.up_proj(sg_x)
    sg_expected = sg.down_proj(sg_g * torch.sigmoid(sg_g) * sg_u)
    sg_swapped = sg.down_proj(sg_u * torch.sigmoid(sg_u) * sg_g)
    sg_gelu = sg.down_proj(F.gelu(sg_g) * sg_u)
assert not torch.allclose(sg_y, sg_swapped, atol=1e-5), "gate and up swapped: the SiLU goes on gate_proj(x)"
assert not torch.allclose(sg_y, sg_gelu, atol=1e-5), "GELU instead of SiLU: SwiGLU uses silu(z) = z * sigmoid(z)"
assert torch.allclose(sg_y, sg_expected, atol=1e-5), "output differs from down_proj(silu(gate_proj(x)) * up_proj(x))"


# %% [hidden]
# The reference: m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x)); each mistake changes one thing.
def _swiglu_swapped(m, x):
    return m.down_proj(F.silu(m.up_proj(x)) * m.gate_proj(x))


def _gated_by(activation):
    """The gate through ``activation`` instead of SiLU."""
    return lambda m, x: m.down_proj(activation(m.gate_proj(x)) * m.up_proj(x))


def _swiglu_without_up(m, x):
    return m.down_proj(F.silu(m.gate_proj(x)))


def _swiglu_silu_on_both(m, x):
    return m.down_proj(F.silu(m.gate_proj(x)) * F.silu(m.up_proj(x)))


SWIGLU_MISTAKES = [
    Mistake("gate and up swapped: the SiLU goes on gate_proj(x), which multiplies up_proj(x)", _swiglu_swapped),
    *[Mistake("GELU instead of SiLU: SwiGLU's gate is silu(z) = z * sigmoid(z)", _gated_by(gelu))
      for gelu in (F.gelu, lambda z: F.gelu(z, approximate="tanh"))],
    Mistake("sigmoid instead of SiLU (that is GLU): the gate is silu(z) = z * sigmoid(z)", _gated_by(torch.sigmoid)),
    Mistake("ReLU instead of SiLU (that is ReGLU): the gate is silu(z) = z * sigmoid(z)", _gated_by(F.relu)),
    Mistake("up_proj is not used: multiply silu(gate_proj(x)) by up_proj(x)", _swiglu_without_up),
    Mistake("SiLU applied to both projections: only gate_proj(x) goes through the SiLU", _swiglu_silu_on_both),
]


@hidden.test("test_SwiGLU")
def _(t):
    t.module("SwiGLU", dict(d_model=6, d_ff=10), t.randn(3, 4, 6), mistakes=SWIGLU_MISTAKES, label="(3, 4, 6)")
    t.module("SwiGLU", dict(d_model=4, d_ff=3), t.randn(5, 4) * 3, mistakes=SWIGLU_MISTAKES, label="d_ff < d_model")
    t.module("SwiGLU", dict(d_model=8, d_ff=16), t.randn(2, 3, 8, dtype=torch.float64), dtype=torch.float64,
             mistakes=SWIGLU_MISTAKES, label="float64")
    t.module("SwiGLU", dict(d_model=6, d_ff=8), t.randn(2, 6), grad=True, mistakes=SWIGLU_MISTAKES, label="gradients")


# %% [markdown]
# ## 6. The model, and the proof that it is Qwen3
#
# The block and the model are given: they only assemble your four pieces, with
# Qwen3's names. The block is pre-norm, as GPT-2's; the model has no position
# embedding (the positions live in the rotations) and ends with an RMSNorm and an
# output layer. Small Qwen3 models tie that output layer to the token embedding, large
# ones do not; this class keeps them separate and copies whatever the checkpoint has.

# %% [export]
class ModernBlock(nn.Module):
    """Given: a pre-norm Qwen3 decoder block assembled from the exercises."""

    def __init__(self, d_model, num_heads, num_kv_heads, head_dim, d_ff, rope_base=10000.0, eps=1e-6):
        super().__init__()
        self.input_layernorm = RMSNorm(d_model, eps)
        self.self_attn = ModernAttention(d_model, num_heads, num_kv_heads, head_dim, rope_base, eps)
        self.post_attention_layernorm = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x, past=None):                     # (B, N, d) -> (B, N, d), present
        a, present = self.self_attn(self.input_layernorm(x), past)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class ModernLM(nn.Module):
    """Given: a decoder-only language model with Qwen3's parameter names."""

    def __init__(self, vocab_size, d_model, num_layers, num_heads, num_kv_heads, head_dim, d_ff,
                 rope_base=10000.0, eps=1e-6):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(ModernBlock(d_model, num_heads, num_kv_heads, head_dim, d_ff, rope_base, eps)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(d_model, eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx, past=None):
        """idx (B, N) long; past None or one (k, v) per layer -> (logits (B, N, vocab), presents)."""
        x = self.embed_tokens(idx)                       # (B, N, d): no position embedding
        presents = []
        for i, layer in enumerate(self.layers):
            x, present = layer(x, None if past is None else past[i])
            presents.append(present)
        return self.lm_head(self.norm(x)), presents


# %% [markdown]
# Because the names are Qwen3's, a `transformers` checkpoint loads by dropping the
# prefix `model.` from its keys. We build a small `Qwen3ForCausalLM` with random
# weights from a `Qwen3Config` (nothing is downloaded), give its norms random weights
# too (they start at one, which would hide a misplaced QK-norm), copy everything into a
# `ModernLM`, and compare logits, with and without a cache, and greedy tokens.

# %%
def modern_lm_from_qwen3(hf):
    """Your ModernLM with the weights of a transformers Qwen3ForCausalLM (any size)."""
    c = hf.config
    ours = ModernLM(c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                    c.num_key_value_heads, c.head_dim, c.intermediate_size,
                    rope_base=c.rope_parameters["rope_theta"], eps=c.rms_norm_eps)
    ours.load_state_dict({k.removeprefix("model."): v for k, v in hf.state_dict().items()})
    return ours.to(hf.dtype).eval()


@torch.no_grad()
def greedy(step, prompt, n_new):
    """Greedy decoding with a cache: step(ids, past) -> (logits, presents)."""
    logits, past = step(prompt, None)
    out = prompt
    for _ in range(n_new):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], dim=1)
        logits, past = step(nxt, past)
    return out


if transformers is None:
    print("transformers is not installed here (pip install transformers): this section is skipped")
else:
    torch.manual_seed(0)
    qwen_config = Qwen3Config(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=24,
                              max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.1,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    qwen = Qwen3ForCausalLM(qwen_config).eval()
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    ours = modern_lm_from_qwen3(qwen)
    ids = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hf_logits = qwen(ids).logits
        our_full, _ = ours(ids)
        part1, past = ours(ids[:, :25])
        part2, _ = ours(ids[:, 25:], past)
    qwen_err = (our_full - hf_logits).abs().max().item()
    qwen_err_cache = (torch.cat([part1, part2], dim=1) - hf_logits).abs().max().item()
    print(f"transformers {transformers.__version__}, Qwen3 with 3 layers, 8 query heads, 2 key/value heads:")
    print(f"max |logit difference| = {qwen_err:.2e} (with a cache: {qwen_err_cache:.2e}); "
          f"mean |logit| = {hf_logits.abs().mean():.2f}")
    hf_tokens = greedy(lambda x, p: (lambda o: (o.logits, o.past_key_values))(qwen(x, past_key_values=p, use_cache=True)),
                       ids[:, :6], 30)
    our_tokens = greedy(ours, ids[:, :6], 30)
    same_tokens = torch.equal(hf_tokens, our_tokens)
    print("same 30 greedy tokens for all 3 prompts:", same_tokens)
    glue("qwen_err", f"{max(qwen_err, qwen_err_cache):.1e}", display=False)

# %% [markdown]
# The logits agree to {glue:text}`qwen_err`, float32 rounding, with and without the
# cache, and the greedy tokens are identical: your four classes compute Qwen3. Had
# QK-norm come after the rotation, or query head $i$ read key head $i \bmod h_{kv}$, the
# difference would be of the size of the logits themselves.
#
# The cell below loads the real Qwen3-0.6B into your `ModernLM` and lets it continue a
# prompt. **It downloads about 1.5 GB** the first time (Hugging Face's cache keeps it
# afterwards). It needs a network, or a copy already in that cache; it uses the mirror that
# `HF_ENDPOINT` names, if set (e.g. `HF_ENDPOINT=https://hf-mirror.com`). The book was built
# without a network, so below you see that it was skipped.

# %%
QWEN_SKIP_TEXT = dict(missing="transformers is not installed",
                      offline="{variable} is set, and no {name} checkpoint is cached on this machine",
                      network="no network ({host} could not be reached in {timeout:g} s)",
                      download="downloading {name} (about 1.5 GB) from {host} ...")


def load_real_qwen3(name="Qwen/Qwen3-0.6B", timeout=3.0):
    """Your ModernLM with Qwen3-0.6B's weights, and its tokenizer; or (None, None, reason)."""
    if transformers is None:
        return None, None, QWEN_SKIP_TEXT["missing"]
    from transformers import AutoTokenizer
    offline = [v for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(v, "0") not in ("0", "")]
    try:                                                      # a checkpoint already on this machine?
        tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
        hf = Qwen3ForCausalLM.from_pretrained(name, local_files_only=True, dtype=torch.float32)
    except Exception:                                         # noqa: BLE001 - not cached: download it
        if offline:
            return None, None, QWEN_SKIP_TEXT["offline"].format(variable=offline[0], name=name)
        endpoint = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        host, port = endpoint.hostname, endpoint.port or (80 if endpoint.scheme == "http" else 443)
        try:                                                  # the hub, or the mirror HF_ENDPOINT names
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError:
            return None, None, QWEN_SKIP_TEXT["network"].format(host=host, timeout=timeout)
        print(QWEN_SKIP_TEXT["download"].format(name=name, host=host))
        tok = AutoTokenizer.from_pretrained(name)
        hf = Qwen3ForCausalLM.from_pretrained(name, dtype=torch.float32)
    return modern_lm_from_qwen3(hf), tok, None


started = time.perf_counter()
qwen3_real, qwen3_tokenizer, skipped = load_real_qwen3()
if skipped:
    print(f"Skipped loading the real Qwen3-0.6B: {skipped}. ({time.perf_counter() - started:.1f} s)")
else:
    prompt_ids = qwen3_tokenizer("The key/value cache of a language model", return_tensors="pt").input_ids
    print(qwen3_tokenizer.decode(greedy(qwen3_real, prompt_ids, 30)[0]))

# %% [markdown]
# ## 7. Training a small modern model
#
# Section 9 measures things that only a *trained* model shows (Section 10's paged cache
# works on any keys and values, and uses random ones), so we train a `ModernLM` on
# Chapter 7's corpus: the docstrings of Python's standard library, read
# from this interpreter's own files, with characters as tokens. The code is Chapter 7's.

# %% [include 07_gpt:docstring_corpus tags=hide-input]

# %% [markdown]
# The model: $d = 64$, $L = 2$ layers, $h = 4$ query heads sharing $h_{kv} = 2$
# key/value heads of width 16, $d_\text{ff} = 192$, a training context of 64
# characters, random windows of the text as batches, AdamW with a one-cycle schedule, as
# in Chapter 7.

# %%
LM_CONFIG = dict(vocab_size=len(chars), d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 d_ff=192)
CONTEXT, STEPS, BATCH = 64, 800, 32


def init_weights_(model):
    """N(0, 0.02) for matrices and embeddings, N(0, 0.02 / sqrt(2L)) for the residual projections."""
    residual_std = 0.02 / math.sqrt(2 * len(model.layers))
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = residual_std if name.endswith(("o_proj", "down_proj")) else 0.02
            nn.init.normal_(module.weight, mean=0.0, std=std)
    return model


def get_batch(split_data, batch_size, n, generator):
    starts = torch.randint(len(split_data) - n - 1, (batch_size,), generator=generator)
    window = torch.stack([split_data[s:s + n + 1] for s in starts.tolist()])   # (B, n+1)
    return window[:, :-1], window[:, 1:]


def train_lm(model, steps=STEPS, lr=3e-3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    history = []
    model.train()
    for step in range(steps):
        x, y = get_batch(train_data, BATCH, CONTEXT, gen)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            history.append((step, loss.item()))
    return model.eval(), history


torch.manual_seed(0)
lm = init_weights_(ModernLM(**LM_CONFIG))
started = time.perf_counter()
lm, lm_history = train_lm(lm)
train_seconds = time.perf_counter() - started
with torch.no_grad():
    gen_val = torch.Generator().manual_seed(123)
    val_losses = []
    for _ in range(20):
        x, y = get_batch(val_data, BATCH, CONTEXT, gen_val)
        val_losses.append(F.cross_entropy(lm(x)[0].reshape(-1, len(chars)), y.reshape(-1)).item())
lm_val_loss = sum(val_losses) / len(val_losses)
n_lm = sum(p.numel() for p in lm.parameters())
print(f"{n_lm:,} parameters, trained {STEPS} steps in {train_seconds:.0f} s; "
      f"validation loss {lm_val_loss:.3f} (perplexity {math.exp(lm_val_loss):.2f})")
print(repr(decode(greedy(lm, encode("Return the ")[None], 60)[0].tolist())))
glue("train_seconds", f"{train_seconds:.0f}", display=False)
glue("lm_val_ppl", f"{math.exp(lm_val_loss):.2f}", display=False)

# %% [markdown]
# In {glue:text}`train_seconds` seconds the model reaches a validation perplexity of
# {glue:text}`lm_val_ppl` per character on windows of 64 characters. We use it in
# Section 9.

# %% [markdown]
# ## 8. Multi-head latent attention (DeepSeek-V2)
#
# Grouped-query attention shrinks the cache by sharing key/value heads, at some cost in
# quality; multi-query attention (Shazeer, 2019), one key/value head for all, costs
# more. DeepSeek-AI (2024) found another way in DeepSeek-V2, kept in DeepSeek-V3 and R1:
# **multi-head latent attention** (MLA). Each token's keys and values for all heads are
# computed from one small **latent** vector $c \in \mathbb{R}^{r}$, and only $c$ is
# cached:
#
# $$c_t = \operatorname{RMSNorm}(x_t W_\text{down}) \in \mathbb{R}^{r},\qquad
# k^{C}_{t,i} = c_t\,W^{K}_{\text{up},i} \in \mathbb{R}^{d_\text{nope}},\qquad
# v_{t,i} = c_t\,W^{V}_{\text{up},i} \in \mathbb{R}^{d_v}$$
#
# for head $i$. Rotary positions cannot be put on $k^{C}$: a rotation that depends on
# the key's position would sit between $c_t$ and the query, and spoil the trick below.
# So MLA adds a small **decoupled** rotary key, one per token and *shared by all heads*,
# $k^{R}_t = \operatorname{RoPE}(x_t W_\text{kr}) \in \mathbb{R}^{d_\text{rope}}$, and
# gives every query head a rotary part too. Head $i$'s query and key are the
# concatenations
#
# $$q_{t,i} = \big[q^{C}_{t,i};\ \operatorname{RoPE}(q^{R}_{t,i})\big],\qquad
# k_{s,i} = \big[k^{C}_{s,i};\ k^{R}_{s}\big],\qquad
# \text{score}_{t,s,i} = \frac{q^{C}_{t,i}\cdot k^{C}_{s,i} + \operatorname{RoPE}(q^{R}_{t,i})\cdot k^{R}_{s}}
# {\sqrt{d_\text{nope} + d_\text{rope}}},$$
#
# and the cache per token and layer is $c_t$ and $k^{R}_t$: $r + d_\text{rope}$ numbers,
# whatever the number of heads. (DeepSeek-V2 also compresses the queries through a
# latent of their own, to save activation memory in training; that does not change the
# cache, and we leave it out.)
#
# **Absorption.** At decoding time, up-projecting the whole cache to keys at every step
# would throw the saving away in compute. But the up-projection is linear, so it can
# move to the query side:
#
# $$q^{C}_{t,i}\cdot k^{C}_{s,i} = q^{C}_{t,i}\,\big(c_s W^{K}_{\text{up},i}\big)^{\!\top}
# = \big(q^{C}_{t,i}\,W^{K\top}_{\text{up},i}\big)\cdot c_s ,$$
#
# a query of size $r$ scored directly against the cached latents. Likewise for the
# values: $\sum_s a_{t,s}\, c_s W^{V}_{\text{up},i} = \big(\sum_s a_{t,s}\, c_s\big) W^{V}_{\text{up},i}$,
# so the weighted sum is taken over latents and up-projected once. With absorption,
# no per-head key or value of a cached token is ever built.
#
# ### Exercise: `MultiHeadLatentAttention`
#
# `forward(x, past=None, absorb=False)` computes MLA with the cache `(c_all, k_rope_all)`
# and returns the same `(y, present)` whether `absorb` is False (up-project the cached
# latents to keys and values) or True (the absorbed form: `self.k_up` and `self.v_up` are
# not called; use their weights). `nn.Linear(r, n).weight` has shape $(n, r)$: head
# $i$'s rows of `k_up.weight` are `i*nope_dim:(i+1)*nope_dim`. Do not call
# `F.scaled_dot_product_attention`.
#
# ```{dropdown} Hint: shapes in the absorbed form
# `W = self.k_up.weight.view(h, nope_dim, kv_rank)`; with `q_nope` of shape
# $(B, h, N, d_\text{nope})$, `q_lat = q_nope @ W` (broadcast over $B$) is
# $(B, h, N, r)$, and `q_lat @ c_all[:, None].transpose(-2, -1)` gives the scores
# $(B, h, N, T)$. After the softmax, `weights @ c_all[:, None]` is $(B, h, N, r)$; multiply
# by `self.v_up.weight.view(h, v_dim, kv_rank).transpose(-2, -1)`.
# ```

# %% [exercise MultiHeadLatentAttention]
class MultiHeadLatentAttention(nn.Module):
    """DeepSeek-V2's multi-head latent attention (without query compression), with its cache."""

    def __init__(self, d_model, num_heads, kv_rank, nope_dim, rope_dim, v_dim, rope_base=10000.0):
        super().__init__()
        self.num_heads, self.kv_rank = num_heads, kv_rank
        self.nope_dim, self.rope_dim, self.v_dim, self.rope_base = nope_dim, rope_dim, v_dim, rope_base
        self.q_proj = nn.Linear(d_model, num_heads * (nope_dim + rope_dim), bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank, bias=False)        # x -> latent c (cached)
        self.kv_norm = RMSNorm(kv_rank)
        self.k_rope_proj = nn.Linear(d_model, rope_dim, bias=False)   # x -> the shared rotary key (cached)
        self.k_up = nn.Linear(kv_rank, num_heads * nope_dim, bias=False)
        self.v_up = nn.Linear(kv_rank, num_heads * v_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * v_dim, d_model, bias=False)

    def forward(self, x, past=None, absorb=False):
        """Causal MLA over the cached tokens and the N new ones (positions P .. P+N-1).

        Args:
            x: (B, N, d_model).
            past: None (P = 0) or (c_past (B, P, kv_rank), k_rope_past (B, P, rope_dim)).
            absorb: if True, compute the same result without up-projecting the cache
                (self.k_up and self.v_up are not called; their weights are used).

        c = kv_norm(kv_down(x)); k_rope = apply_rope_halves(k_rope_proj(x)) at positions
        P .. P+N-1, shared by all heads. Head i's query is its (nope_dim + rope_dim)
        slice of q_proj(x): the first nope_dim features as they are, the last rope_dim
        rotated (same positions, base self.rope_base). Head i's key is
        cat(k_up(c) head slice, k_rope); its value is the v_up(c) head slice. Scores
        are scaled by 1/sqrt(nope_dim + rope_dim); causal; heads concatenated in order
        before o_proj.

        Returns (y (B, N, d_model), present = (c_all (B, P + N, kv_rank),
        k_rope_all (B, P + N, rope_dim))), the past followed by the new entries.
        """
        ### BEGIN SOLUTION
        B, N, _ = x.shape
        h, r, dn, dr, dv = self.num_heads, self.kv_rank, self.nope_dim, self.rope_dim, self.v_dim
        P = 0 if past is None else past[0].size(1)
        positions = torch.arange(P, P + N, device=x.device)
        q = self.q_proj(x).view(B, N, h, dn + dr).transpose(1, 2)           # (B, h, N, dn+dr)
        q_nope, q_rope = q[..., :dn], apply_rope_halves(q[..., dn:], positions, self.rope_base)
        c = self.kv_norm(self.kv_down(x))                                   # (B, N, r)
        k_rope = apply_rope_halves(self.k_rope_proj(x), positions, self.rope_base)   # (B, N, dr)
        if past is not None:
            c = torch.cat([past[0], c], dim=1)                              # (B, T, r), T = P + N
            k_rope = torch.cat([past[1], k_rope], dim=1)                    # (B, T, dr)
        T = c.size(1)
        rope_scores = q_rope @ k_rope[:, None].transpose(-2, -1)            # (B, h, N, T)
        if absorb:
            w_k = self.k_up.weight.view(h, dn, r)                           # head i: (dn, r)
            nope_scores = (q_nope @ w_k) @ c[:, None].transpose(-2, -1)     # (B, h, N, r) @ (B, 1, r, T)
        else:
            k_nope = self.k_up(c).view(B, T, h, dn).transpose(1, 2)         # (B, h, T, dn)
            nope_scores = q_nope @ k_nope.transpose(-2, -1)
        scores = (nope_scores + rope_scores) / math.sqrt(dn + dr)
        mask = torch.ones(N, T, dtype=torch.bool, device=x.device).tril(diagonal=P)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        if absorb:
            w_v = self.v_up.weight.view(h, dv, r)
            y = (weights @ c[:, None]) @ w_v.transpose(-2, -1)              # (B, h, N, r) -> (B, h, N, dv)
        else:
            y = weights @ self.v_up(c).view(B, T, h, dv).transpose(1, 2)    # (B, h, N, dv)
        y = y.transpose(1, 2).reshape(B, N, h * dv)
        return self.o_proj(y), (c, k_rope)
        ### END SOLUTION


# %% [markdown]
# The tests below compare your layer with the formula, written head by head with full
# keys and values (the way MLA is defined, not the way it is computed):

# %% [export tags=hide-input]
def mla_by_formula(m, x, past=None):
    """Given: MLA's output, head by head, with every key and value up-projected."""
    B, N, _ = x.shape
    dn, dr, dv = m.nope_dim, m.rope_dim, m.v_dim
    P = 0 if past is None else past[0].size(1)
    positions = torch.arange(P, P + N)
    c = m.kv_norm(m.kv_down(x))
    k_rope = apply_rope_halves(m.k_rope_proj(x), positions, m.rope_base)
    if past is not None:
        c, k_rope = torch.cat([past[0], c], 1), torch.cat([past[1], k_rope], 1)
    T = c.size(1)
    q_all, k_up, v_up = m.q_proj(x), m.k_up(c), m.v_up(c)
    heads = []
    for i in range(m.num_heads):
        q = q_all[..., i * (dn + dr):(i + 1) * (dn + dr)]
        q = torch.cat([q[..., :dn], apply_rope_halves(q[..., dn:], positions, m.rope_base)], dim=-1)
        k = torch.cat([k_up[..., i * dn:(i + 1) * dn], k_rope], dim=-1)               # (B, T, dn + dr)
        s = q @ k.transpose(-2, -1) / math.sqrt(dn + dr)
        s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=P), float("-inf"))
        heads.append(torch.softmax(s, dim=-1) @ v_up[..., i * dv:(i + 1) * dv])
    return m.o_proj(torch.cat(heads, dim=-1)), (c, k_rope)


def absorption_gap(init, state, x, past=None):
    """Given, for the grader's absorption test: your layer with absorb=True against your own layer with
    absorb=False, on the same input and cache. Returns (output gap, cache gap), each rounding only
    when the absorbed form computes what the plain one does."""
    mla = built_with(MultiHeadLatentAttention, init, state, x.dtype)
    y, present = mla(x, past)
    y_absorbed, present_absorbed = mla(x, past, absorb=True)
    cache_gap = torch.stack([relative_gap(a, b) for a, b in zip(present_absorbed, present)]).max()
    return relative_gap(y_absorbed, y), cache_gap


# %% [test test_MultiHeadLatentAttention_cache points=2]
"""present = (latents, shared rotary keys), (B, P + N, kv_rank) and (B, P + N, rope_dim): not full keys."""
check_parts_first("RMSNorm", "apply_rope_halves")
torch.manual_seed(5)
ml = MultiHeadLatentAttention(d_model=16, num_heads=4, kv_rank=6, nope_dim=5, rope_dim=4, v_dim=3)
ml_x = torch.randn(2, 7, 16)
with torch.no_grad():
    ml_y, ml_present = ml(ml_x)
assert ml_y.shape == (2, 7, 16), f"y should be (B, N, d_model) = (2, 7, 16), got {tuple(ml_y.shape)}"
assert len(ml_present) == 2 and ml_present[0].shape == (2, 7, 6) and ml_present[1].shape == (2, 7, 4), \
    ("present should be (latents (B, T, kv_rank), rotary keys (B, T, rope_dim)) = ((2, 7, 6), (2, 7, 4)): "
     "cache the latent c and the shared k_rope, not the up-projected keys and values")
with torch.no_grad():
    ml_c = ml.kv_norm(ml.kv_down(ml_x))
    ml_kr = apply_rope_halves(ml.k_rope_proj(ml_x), torch.arange(7), ml.rope_base)
    _, ml_present2 = ml(ml_x[:, 4:], tuple(t[:, :4] for t in ml_present))
assert torch.allclose(ml_present[0], ml_c, atol=1e-5), "the cached latent must be c = kv_norm(kv_down(x)), not rotated"
assert torch.allclose(ml_present[1], ml_kr, atol=1e-5), "the cached rotary key must be apply_rope_halves(k_rope_proj(x)) at positions 0..N-1"
assert torch.allclose(ml_present2[1], ml_kr, atol=1e-5) and torch.allclose(ml_present2[0], ml_c, atol=1e-5), \
    "with a cache of 4, present must be the past followed by the new entries, rotated at positions 4, 5, 6"

# %% [test test_MultiHeadLatentAttention_values points=3]
"""Output equals the formula: decoupled rotary part, scale 1/sqrt(nope_dim + rope_dim), with and without a cache."""
check_parts_first("RMSNorm", "apply_rope_halves")
torch.manual_seed(6)
mv = MultiHeadLatentAttention(d_model=16, num_heads=3, kv_rank=8, nope_dim=6, rope_dim=4, v_dim=5, rope_base=50.0)
with torch.no_grad():
    mv.kv_norm.weight.copy_(torch.randn(8))
mv_x = torch.randn(2, 9, 16)
with torch.no_grad():
    mv_y, mv_present = mv(mv_x)
    mv_want, _ = mla_by_formula(mv, mv_x)
    mv_y2, _ = mv(mv_x[:, 6:], tuple(t[:, :6] for t in mv_present))
assert torch.allclose(mv_y, mv_want, atol=1e-5), \
    ("y differs from the formula: the LAST rope_dim features of each query head are rotated, the key is "
     "cat(k_up(c) head slice, k_rope), and the scale is 1/sqrt(nope_dim + rope_dim)")
assert torch.allclose(mv_y2, mv_want[:, 6:], atol=1e-5), \
    "with a cache of 6 the output differs from one call: rotate the new queries and keys at positions P .. P+N-1"

# %% [test test_MultiHeadLatentAttention_absorb points=2]
"""absorb=True gives the same output and cache without building the cached tokens' keys or values."""
from torch.utils.flop_counter import FlopCounterMode

check_parts_first("RMSNorm", "apply_rope_halves")
torch.manual_seed(7)
mb = MultiHeadLatentAttention(d_model=12, num_heads=4, kv_rank=5, nope_dim=6, rope_dim=2, v_dim=7)
mb_x = torch.randn(2, 6, 12)
with torch.no_grad():
    mb_plain, mb_present = mb(mb_x)
    mb_plain2, _ = mb(mb_x[:, 4:], tuple(t[:, :4] for t in mb_present))


def mb_forbidden(*args):
    raise AssertionError("absorb=True called self.k_up or self.v_up: use their weights (self.k_up.weight), "
                         "folded into the query and applied after the weighted sum")


mb.k_up.forward = mb_forbidden
mb.v_up.forward = mb_forbidden
with torch.no_grad():
    mb_abs, mb_abs_present = mb(mb_x, absorb=True)
    mb_abs2, _ = mb(mb_x[:, 4:], tuple(t[:, :4] for t in mb_present), absorb=True)
assert torch.allclose(mb_abs, mb_plain, atol=1e-5), "absorb=True gives another output than absorb=False"
assert torch.allclose(mb_abs_present[0], mb_present[0]), "absorb=True must return the same cache"
assert torch.allclose(mb_abs2, mb_plain2, atol=1e-5), "absorb=True with a cache gives another output than absorb=False"
# Using the weights is not enough: F.linear(c, self.k_up.weight) still builds every cached token's keys.
# Count the multiply-adds of one decoding step over a cache of 256 (torch's FLOP counter).
mb_long = MultiHeadLatentAttention(d_model=8, num_heads=4, kv_rank=4, nope_dim=16, rope_dim=2, v_dim=16)
mb_long_past = (torch.randn(1, 256, 4), torch.randn(1, 256, 2))
with torch.no_grad(), FlopCounterMode(display=False) as mb_count:
    mb_long(torch.randn(1, 1, 8), mb_long_past, absorb=True)
mb_up_flops = 2 * 256 * 4 * (4 * 16)                     # up-projecting the 256 latents to keys, alone
assert mb_count.get_total_flops() < mb_up_flops, \
    (f"absorb=True used {mb_count.get_total_flops():,} FLOPs for one token, more than up-projecting the cache to "
     f"keys alone ({mb_up_flops:,}): it still builds keys or values of the cached tokens (F.linear(c, "
     "self.k_up.weight) is k_up(c)); fold k_up's weight into the query, and apply v_up's weight after the weighted sum")


# %% [hidden]
# The reference forward in named steps, as for ModernAttention above: `_latent_attention`
# takes each step as a keyword, and each mistake is one step written wrong.
def _rope_part_last(q, nope_dim, rope_dim):
    """(content part, rotary part) of each query head: the first nope_dim features, then rope_dim."""
    return q[..., :nope_dim], q[..., nope_dim:]


def _unrotated(m, z, rotate):
    """The latent and the content parts carry no position."""
    return z


def _content_unrotated(m, q_nope, k_nope, rotate):
    return q_nope, k_nope


def _qk_scale(m):
    return math.sqrt(m.nope_dim + m.rope_dim)


def _latent_cache(past, c, k_rope, k_nope, v):
    return c, k_rope


def _latent_attention(m, x, past=None, absorb=False, positions=_positions_after_past, split=_rope_part_last,
                      latent=_unrotated, content=_content_unrotated, join=_past_first, scale=_qk_scale,
                      cache=_latent_cache):
    B, N, _ = x.shape
    h, dn, dr, dv = m.num_heads, m.nope_dim, m.rope_dim, m.v_dim
    pos = positions(0 if past is None else past[0].size(1), N)
    rot = lambda z: ref.apply_rope_halves(z, pos, m.rope_base)   # noqa: E731
    q_nope, q_rope = split(m.q_proj(x).view(B, N, h, dn + dr).transpose(1, 2), dn, dr)
    c_new = latent(m, m.kv_norm(m.kv_down(x)), rot)
    kr_new = rot(m.k_rope_proj(x))
    c, kr = (c_new, kr_new) if past is None else (join(past[0], c_new, 1), join(past[1], kr_new, 1))
    T = c.size(1)
    q_nope, k_nope = content(m, q_nope, m.k_up(c).view(B, T, h, dn).transpose(1, 2), rot)
    s = q_nope @ k_nope.transpose(-2, -1) + rot(q_rope) @ kr[:, None].transpose(-2, -1)
    s = s / scale(m)
    s = s.masked_fill(~torch.ones(N, T, dtype=torch.bool).tril(diagonal=T - N), float("-inf"))
    v = m.v_up(c).view(B, T, h, dv).transpose(1, 2)
    y = m.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(B, N, h * dv))
    return y, cache(past, c, kr, k_nope, v)


def _latent_attention_with(**wrong_step):
    return lambda m, x, past=None, absorb=False: _latent_attention(m, x, past, absorb, **wrong_step)


def _full_cache(past, c, k_rope, k_nope, v):
    if past is not None:
        raise ValueError("a full-key cache cannot read a latent past")
    return k_nope, v


def _full_keys_cache(past, c, k_rope, k_nope, v):
    B, h, T, _ = k_nope.shape
    return torch.cat([k_nope, k_rope[:, None].expand(B, h, T, k_rope.size(-1))], -1), v


def _rotated_latent(m, z, rotate):
    return rotate(z)


def _content_rotated(m, q_nope, k_nope, rotate):
    """Rotary positions on the content parts too (the keys at 0 .. T-1, the new queries at theirs)."""
    return rotate(q_nope), ref.apply_rope_halves(k_nope, torch.arange(k_nope.size(2)), m.rope_base)


def _rope_part_first(q, nope_dim, rope_dim):
    return q[..., rope_dim:], q[..., :rope_dim]


def _nope_scale(m):
    return math.sqrt(m.nope_dim)


def _v_scale(m):
    return math.sqrt(m.v_dim)


def _rank_scale(m):
    return math.sqrt(m.kv_rank)


def _no_latent_scale(m):
    return 1.0


MLA_MISTAKES = [
    *[Mistake("the cache holds the up-projected keys and values: MLA caches only the latent c = kv_norm(kv_down(x)) "
              "(B, T, kv_rank) and the shared rotary key (B, T, rope_dim)", _latent_attention_with(cache=full))
      for full in (_full_cache, _full_keys_cache)],
    Mistake("rotary positions applied to the compressed part: rotate only the last rope_dim features of each "
            "query head and k_rope; the latent and the up-projected keys carry no position",
            _latent_attention_with(latent=_rotated_latent)),
    Mistake("rotary positions applied to the compressed part: rotate only the last rope_dim features of each "
            "query head and k_rope; the latent and the up-projected keys carry no position",
            _latent_attention_with(content=_content_rotated)),
    Mistake("the FIRST rope_dim features of each query head were rotated: the first nope_dim features are the "
            "content part, the last rope_dim the rotary part", _latent_attention_with(split=_rope_part_first)),
    *[Mistake("wrong scale: the scores of head i are q_i . k_i over nope_dim + rope_dim features, so scale by "
              "1/sqrt(nope_dim + rope_dim)", _latent_attention_with(scale=wrong))
      for wrong in (_nope_scale, _v_scale, _rank_scale, _no_latent_scale)],
    Mistake("positions restart at 0 with a cache: rotate the new queries and keys at positions P .. P+N-1, "
            "P = past[0].size(1)", _latent_attention_with(positions=_positions_from_zero)),
    Mistake("cache concatenated in the wrong order: the past FOLLOWED by the new entries, along dim 1",
            _latent_attention_with(join=_new_first)),
]
MLA = dict(mistakes=MLA_MISTAKES, deps=("RMSNorm", "apply_rope_halves"), returns=("y", "present"))
SMALL_MLA = dict(d_model=16, num_heads=4, kv_rank=6, nope_dim=5, rope_dim=4, v_dim=3, rope_base=100.0)


def _latent_past(t, B, P, r, dr, dtype=torch.float32):
    return (t.randn(B, P, r, dtype=dtype), t.randn(B, P, dr, dtype=dtype))


@hidden.test("test_MultiHeadLatentAttention_cache")
def _(t):
    cache = dict(MLA, equivalent=_judge_part(1))       # the cache's contents; the output is the values test's
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(2, 7, 16), label="no cache", **cache)
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(2, 2, 16), _latent_past(t, 2, 5, 6, 4),
             label="2 new tokens, a cache of 5", **cache)
    t.module("MultiHeadLatentAttention", dict(d_model=8, num_heads=2, kv_rank=3, nope_dim=4, rope_dim=2, v_dim=4),
             t.randn(1, 1, 8), _latent_past(t, 1, 8, 3, 2), label="one new token, a cache of 8", **cache)


@hidden.test("test_MultiHeadLatentAttention_values")
def _(t):
    values = dict(MLA, equivalent=_judge_part(0))      # the output; the cache is the cache test's
    t.module("MultiHeadLatentAttention", dict(d_model=16, num_heads=3, kv_rank=8, nope_dim=6, rope_dim=4, v_dim=5,
                                              rope_base=50.0), t.randn(2, 9, 16), label="3 heads, no cache", **values)
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(3, 3, 16), _latent_past(t, 3, 4, 6, 4),
             label="3 new tokens, a cache of 4", **values)
    t.module("MultiHeadLatentAttention", dict(d_model=12, num_heads=2, kv_rank=4, nope_dim=2, rope_dim=6, v_dim=7),
             t.randn(2, 5, 12, dtype=torch.float64), _latent_past(t, 2, 3, 4, 6, dtype=torch.float64),
             dtype=torch.float64, label="float64, rope_dim > nope_dim", **values)
    t.module("MultiHeadLatentAttention", SMALL_MLA, t.randn(2, 4, 16), grad=True, label="gradients", **values)


def _absorb_hint(probe, value):
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(g, torch.Tensor) and g.numel() == 1 for g in value)):
        return None
    if not value[0].item() < 1e-4:
        return (f"absorb=True gives another output than absorb=False of your own layer (largest relative "
                f"difference {value[0].item():.1e}): the absorbed scores are (q_nope @ W_k) @ c^T plus the same "
                f"rotary scores, and the weighted sum of latents is multiplied by v_up's weight transposed")
    if not value[1].item() < 1e-4:
        return "absorb=True returns another cache than absorb=False: the cache is the same (c, k_rope) in both forms"
    return None


@hidden.test("test_MultiHeadLatentAttention_absorb",
             max_memory=(96 * 2**20, "absorb=True up-projected the cached latents to keys or values (self.k_up or "
                                     "self.v_up on the cache): fold k_up's weight into the query and apply v_up's "
                                     "weight after the weighted sum"))
def _(t):
    # Absorption judged as what it is: your absorb=True against your own absorb=False (absorption_gap),
    # so that a mistake both forms share (a scale, the cache) is judged by the values and cache tests only.
    def both_forms(init, x, past=None, dtype=torch.float32, label=""):
        t.function("absorption_gap", init, _state(t, "MultiHeadLatentAttention", init, dtype),
                   t.randn(*x, dtype=dtype), None if past is None else _latent_past(t, *past, dtype=dtype),
                   checks=(_absorb_hint,), deps=("RMSNorm", "apply_rope_halves"), returns=("output gap", "cache gap"),
                   label=label)
    both_forms(SMALL_MLA, (2, 6, 16), label="absorb=True against absorb=False, no cache")
    both_forms(dict(d_model=12, num_heads=3, kv_rank=6, nope_dim=4, rope_dim=2, v_dim=6), (2, 2, 12), (2, 6, 6, 2),
               label="absorb=True against absorb=False, a cache of 6")
    both_forms(SMALL_MLA, (1, 3, 16), (1, 4, 6, 4), torch.float64, label="absorb=True against absorb=False, float64")
    # The memory rule's probe: a long cache, where up-projecting it shows. Its values are the
    # values test's; here the returned shapes only.
    big = dict(d_model=16, num_heads=64, kv_rank=16, nope_dim=32, rope_dim=8, v_dim=32)
    t.module("MultiHeadLatentAttention", big, t.randn(1, 1, 16), _latent_past(t, 1, 16384, 16, 8), absorb=True,
             label="absorb=True, 64 heads, one new token, a cache of 16384",
             **dict(MLA, equivalent=lambda student, expected: True))


# %% [markdown]
# Now the proof that absorption computes the same scores, and what it saves. We take a
# layer with DeepSeek-V3's head shapes ($r = 512$, $d_\text{nope} = 128$,
# $d_\text{rope} = 64$, $d_v = 128$) but 16 heads instead of 128 and $d = 1024$ (so
# that it runs in a moment on a CPU), random weights, a cache of 1,024 tokens and one
# new token; we compare the two forms and time them (one CPU thread, best of three).

# %%
torch.manual_seed(0)
V3 = dict(d_model=1024, num_heads=16, kv_rank=512, nope_dim=128, rope_dim=64, v_dim=128)
mla_v3 = MultiHeadLatentAttention(**V3).eval()
with torch.no_grad():
    for p in mla_v3.parameters():
        p.normal_(0, 0.02)
    cache_len = 1024
    past_v3 = (torch.randn(1, cache_len, V3["kv_rank"]), torch.randn(1, cache_len, V3["rope_dim"]))
    x_new = torch.randn(1, 1, V3["d_model"])
    timings = {}
    outputs = {}
    for absorb in (False, True):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            outputs[absorb], _ = mla_v3(x_new, past_v3, absorb=absorb)
            best = min(best, time.perf_counter() - t0)
        timings[absorb] = 1000 * best
absorb_err = (outputs[True] - outputs[False]).abs().max().item()
rel_err = absorb_err / outputs[False].abs().max().item()
print(f"max |difference| between the two forms: {absorb_err:.1e} (relative to the largest output: {rel_err:.1e})")
print(f"one decoding step with a cache of {cache_len}: up-projecting {timings[False]:.1f} ms, "
      f"absorbed {timings[True]:.1f} ms")
up_numbers = cache_len * V3["num_heads"] * (V3["nope_dim"] + V3["v_dim"])
print(f"keys and values that the up-projecting form builds: {up_numbers:,} numbers; "
      f"the cache itself: {cache_len * (V3['kv_rank'] + V3['rope_dim']):,}")
glue("absorb_rel_err", f"{rel_err:.0e}", display=False)
glue("absorb_speedup", f"{timings[False] / timings[True]:.0f}", display=False)
del mla_v3

# %% [markdown]
# The two forms agree to float32 rounding (relative difference {glue:text}`absorb_rel_err`)
# and the absorbed step is {glue:text}`absorb_speedup` times faster here: it never
# builds the heads' keys and values for the whole cache.
#
# **How large is the cache?** Per token and per layer, in numbers ("elements"):
#
# | attention | cached per token and layer |
# |---|---|
# | multi-head (MHA), $h$ heads of $d_\text{head}$ | $2\,h\,d_\text{head}$ |
# | grouped-query (GQA), $h_{kv}$ key/value heads | $2\,h_{kv}\,d_\text{head}$ |
# | multi-query (MQA), one key/value head | $2\,d_\text{head}$ |
# | latent (MLA) | $r + d_\text{rope}$ |
#
# Here they are for published configurations (Meta's Llama 3 8B and 70B, DeepSeek LLM
# 67B, DeepSeek-V2 and V3, read from their papers and `config.json` files), in 16-bit
# numbers. "MHA equivalent" is the same model with one key/value head per query head.

# %%
CONFIGS = {  # name: (layers, query heads h, cached numbers per token and layer, d_head, kind)
    "Llama 3 8B (GQA, 8 kv heads)": (32, 32, 2 * 8 * 128, 128, "GQA"),
    "Llama 3 70B (GQA, 8 kv heads)": (80, 64, 2 * 8 * 128, 128, "GQA"),
    "DeepSeek LLM 67B (GQA, 8 kv heads)": (95, 64, 2 * 8 * 128, 128, "GQA"),
    "Llama 3 8B as MQA (1 kv head)": (32, 32, 2 * 1 * 128, 128, "MQA"),
    "DeepSeek-V2 (MLA, r = 512, rope 64)": (60, 128, 512 + 64, 128, "MLA"),
    "DeepSeek-V3 (MLA, r = 512, rope 64)": (61, 128, 512 + 64, 128, "MLA"),
}
BYTES = 2                                                        # bf16
print(f"{pad('model', 38)} {pad('per token, layer', 17, '>')} {pad('MHA equivalent', 15, '>')} "
      f"{pad('ratio', 6, '>')} {pad('per token, model', 17, '>')}")
cache_rows = {}
for name, (L, h, per_layer, d_head, kind) in CONFIGS.items():
    mha = 2 * h * d_head
    cache_rows[name] = (L, per_layer)
    print(f"{pad(name, 38)} {per_layer:8,d} = {per_layer * BYTES / 1024:4.2f} KiB {mha:9,d} elem. {per_layer / mha:6.3f} "
          f"{L * per_layer * BYTES / 1024:9.1f} KiB")
v3_per_layer, v3_mha = 512 + 64, 2 * 128 * 128
glue("v3_elems", f"{v3_per_layer}", display=False)
glue("v3_mha_elems", f"{v3_mha:,}", display=False)
glue("v3_ratio", f"{v3_mha / v3_per_layer:.0f}", display=False)
glue("v3_gqa_groups", f"{v3_per_layer / (2 * 128):.2f}", display=False)

# %% [markdown]
# DeepSeek-V3 caches {glue:text}`v3_elems` numbers per token and layer where multi-head
# attention with its 128 heads of 128 would cache {glue:text}`v3_mha_elems`:
# {glue:text}`v3_ratio` times fewer, as small as a grouped-query cache with
# {glue:text}`v3_gqa_groups` key/value heads (the comparison DeepSeek-V2's paper makes),
# while every head keeps its own keys and values.
#
# **Checking a headline number.** DeepSeek-V2's abstract says that, compared with
# DeepSeek 67B, it "reduces the KV cache by 93.3%". DeepSeek 67B is a dense model with
# grouped-query attention (95 layers, 8 key/value heads of 128); DeepSeek-V2 has 60 MLA
# layers with $r = 512$ and $d_\text{rope} = 64$. The computation:

# %%
ds67_L, ds67_per_layer = cache_rows["DeepSeek LLM 67B (GQA, 8 kv heads)"]
ds2_L, ds2_per_layer = cache_rows["DeepSeek-V2 (MLA, r = 512, rope 64)"]
ds67_elems, ds2_elems = ds67_L * ds67_per_layer, ds2_L * ds2_per_layer
mla_alone = 1 - ds2_elems / ds67_elems
ds67_bytes, ds2_bytes_6bit = ds67_elems * 16 / 8, ds2_elems * 6 / 8         # 16-bit cache vs 6 bits per number
with_quant = 1 - ds2_bytes_6bit / ds67_bytes
print(f"{pad('DeepSeek 67B', 13)}: {ds67_L} layers x {ds67_per_layer:,} = {ds67_elems:,} numbers per token "
      f"({ds67_bytes / 1024:.0f} KiB in 16 bits)")
print(f"{pad('DeepSeek-V2', 13)}: {ds2_L} layers x {ds2_per_layer:,} = {ds2_elems:,} numbers per token "
      f"({ds2_elems * 2 / 1024:.1f} KiB in 16 bits, {ds2_bytes_6bit / 1024:.1f} KiB in 6 bits)")
print(f"{pad('reduction with the same 16-bit numbers', 39)}: {100 * mla_alone:.1f}%")
print(f"{pad('reduction with the 6-bit cache of V2', 39)}: {100 * with_quant:.1f}%")
glue("mla_alone", f"{100 * mla_alone:.1f}", display=False)
glue("with_quant", f"{100 * with_quant:.1f}", display=False)

# %% [markdown]
# ```{admonition} What reproduces the "93.3%"
# :class: note
# Counting numbers, MLA's cache is {glue:text}`mla_alone`% smaller than DeepSeek 67B's,
# not 93.3%. Counting the numbers' *size* too reproduces the paper's figure exactly:
# DeepSeek-V2's deployment quantises its cache to about 6 bits per number on average
# (DeepSeek-AI, 2024, Section 3.2.3), against 16 bits for DeepSeek 67B, which gives
# {glue:text}`with_quant`%. Both are fair, but they measure different things: the
# architecture saves about five sixths of the cache, the quantisation the rest. A
# comparison of MLA with another attention should use the first number, or quantise
# both caches alike.
# ```

# %% [markdown]
# ## 9. A fixed-size cache for an endless stream: sliding windows and attention sinks
#
# A cache that keeps every token grows without end, and a model trained on windows of
# $n$ tokens has never seen positions beyond $n$. One answer is a **sliding window**: each
# token attends to the last $W$ tokens only, so only they are cached. Models *trained* that
# way work with it: Mistral 7B (a window of 4,096, Jiang et al., 2023), and Gemma 2 and 3 and
# gpt-oss, which alternate windowed and full-attention layers (Gemma Team, 2024, 2025;
# OpenAI, 2025). Qwen2, 2.5 and 3 have the option in their configuration but ship with it
# off (`use_sliding_window: false`; Qwen3-0.6B's `sliding_window` is null).
#
# Xiao et al. (2023) asked what happens to a model trained with **full** attention when it
# is run with a window cache. Its perplexity jumps the moment the *first* tokens leave the
# window. They found that such models put a large share of their attention on the first
# token or two whatever they contain; their explanation: a softmax must put its weight
# somewhere, and the first tokens are the only ones every later token can see. These
# **attention sinks** carry little meaning but a lot of weight; evict them and every
# attention distribution changes. Their fix, *StreamingLLM*: keep the first few tokens
# (four in the paper) for ever, and a sliding window of the most recent ones.
#
# As a mask over a sequence of length $n$ (for training or for prefilling a prompt),
# query $i$ sees key $j$ when
#
# $$j \le i \quad\text{and}\quad \big(\, i - j < W \ \text{ or } \ j < S \,\big),$$
#
# itself and the $W - 1$ tokens before it, plus the first $S$ tokens, the sinks.
# (Below the exercise, a figure draws this mask with your function.)
#
# ### Exercise: `sliding_window_mask`

# %% [exercise sliding_window_mask]
def sliding_window_mask(n, window, num_sinks=0):
    """(n, n) bool mask, True where query i may attend to key j.

    True where j <= i and (i - j < window or j < num_sinks): each query sees itself
    and the window - 1 tokens before it, plus the first num_sinks tokens (attention
    sinks), never a later token.
    """
    ### BEGIN SOLUTION
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    return (j <= i) & ((i - j < window) | (j < num_sinks))
    ### END SOLUTION


# %% [test test_sliding_window_mask points=2]
"""Causal, the last `window` tokens including the query itself, plus the first num_sinks tokens."""
sw = sliding_window_mask(6, 3)
assert sw.shape == (6, 6) and sw.dtype == torch.bool, f"expected a (6, 6) bool tensor, got {tuple(sw.shape)} {sw.dtype}"
assert sw[5].tolist() == [False, False, False, True, True, True], \
    f"query 5 with window 3 sees keys 3, 4, 5 (itself and the 2 before it), got row {sw[5].int().tolist()}: is the window off by one?"
assert not sw.triu(1).any(), "a query must never see a later key (causal)"
sw_s = sliding_window_mask(7, 2, num_sinks=2)
assert sw_s[6].tolist() == [True, True, False, False, False, True, True], \
    f"query 6 with window 2 and 2 sinks sees keys 0, 1 (sinks) and 5, 6, got row {sw_s[6].int().tolist()}"
assert sw_s[0].tolist() == [True] + [False] * 6, "query 0 sees only itself: the sinks are still causal (j <= i)"
assert torch.equal(sliding_window_mask(5, 10), torch.ones(5, 5, dtype=torch.bool).tril()), \
    "a window longer than the sequence gives the plain causal mask"


# %% [hidden]
# The reference: (j <= i) & ((i - j < window) | (j < num_sinks)) on the (n, n) grid of query i and
# key j; each mistake changes one comparison.
def _grid(n):
    return torch.arange(n)[:, None], torch.arange(n)[None, :]


def _window_one_too_wide(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & ((i - j <= window) | (j < num_sinks))


def _window_one_too_narrow(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & ((i - j < window - 1) | (j < num_sinks))


def _window_without_sinks(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & (i - j < window)


def _sinks_not_causal(n, window, num_sinks=0):
    i, j = _grid(n)
    return ((j <= i) & (i - j < window)) | (j < num_sinks)


def _one_sink_too_many(n, window, num_sinks=0):
    i, j = _grid(n)
    return (j <= i) & ((i - j < window) | (j <= num_sinks))


def _window_not_causal(n, window, num_sinks=0):
    i, j = _grid(n)
    return ((i - j).abs() < window) | (j < num_sinks)


WINDOW_MISTAKES = [
    *[Mistake("the window is off by one: query i sees itself and the window - 1 tokens before it (i - j < window), "
              "window tokens in all", off_by_one) for off_by_one in (_window_one_too_wide, _window_one_too_narrow)],
    Mistake("the sinks are missing: the first num_sinks tokens stay visible to every later query",
            _window_without_sinks),
    Mistake("the sinks are visible to earlier queries: the mask stays causal, j <= i, for the sinks too",
            _sinks_not_causal),
    Mistake("one sink too many: the sinks are the tokens j < num_sinks", _one_sink_too_many),
    Mistake("the mask is not causal: a query never sees a later key (j <= i)", _window_not_causal),
]


@hidden.test("test_sliding_window_mask")
def _(t):
    t.function("sliding_window_mask", 8, 3, mistakes=WINDOW_MISTAKES, label="n=8, window=3")
    t.function("sliding_window_mask", 10, 4, 2, mistakes=WINDOW_MISTAKES, label="n=10, window=4, 2 sinks")
    t.function("sliding_window_mask", 9, 2, num_sinks=3, mistakes=WINDOW_MISTAKES,
               label="n=9, window=2, 3 sinks (keyword)")
    t.function("sliding_window_mask", 5, 8, 1, mistakes=WINDOW_MISTAKES, label="window longer than n")
    t.function("sliding_window_mask", 6, 1, mistakes=WINDOW_MISTAKES, label="window=1: each query sees itself")


# %% [tags=hide-input]
def draw_window_mask(n=16, window=5, num_sinks=2):
    """Your sliding_window_mask with sinks: which key each query sees, the window and the sinks told apart."""
    text = {"title": f"sliding_window_mask({n}, window={window}, num_sinks={num_sinks})",
            "x": "key position j", "y": "query position i",
            "window": "window: i - j < W", "sink": "sink only: j < S", "hidden": "not seen"}
    seen = sliding_window_mask(n, window, num_sinks)
    in_window = sliding_window_mask(n, window)
    kind = torch.zeros(n, n)
    kind[seen & ~in_window] = 1                      # seen only because it is a sink
    kind[in_window] = 2
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    ax.imshow(kind, cmap=ListedColormap(["#f2f2f2", "#f6b26b", "#6fa8dc"]), vmin=0, vmax=2)
    ax.set_xlabel(text["x"])
    ax.set_ylabel(text["y"])
    ax.set_title(text["title"], fontsize=10)
    ax.legend(handles=[Patch(color="#6fa8dc", label=text["window"]), Patch(color="#f6b26b", label=text["sink"]),
                       Patch(color="#f2f2f2", label=text["hidden"])],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    return fig


draw_window_mask()
plt.show()

# %% [markdown]
# When decoding token by token, the same rule becomes an **eviction policy** for the
# cache: after appending the newest token's key and value, keep the first $S$ positions
# and the last $W$, in their order, and drop the middle.
#
# ### Exercise: `evict_to_sinks`

# %% [exercise evict_to_sinks]
def evict_to_sinks(k, v, num_sinks, window):
    """Keep the attention sinks and the most recent tokens of a key/value cache.

    Args:
        k, v: (B, H, T, d) cached keys and values, oldest first.
        num_sinks: how many of the first positions to keep.
        window: how many of the last positions to keep.

    Returns (k, v) holding positions 0 .. num_sinks-1 followed by the last `window`
    positions, in their original order: min(T, num_sinks + window) positions; the
    cache unchanged when T <= num_sinks + window.
    """
    ### BEGIN SOLUTION
    T = k.size(2)
    if T <= num_sinks + window:
        return k, v
    keep = torch.cat([torch.arange(num_sinks), torch.arange(T - window, T)]).to(k.device)
    return k[:, :, keep], v[:, :, keep]
    ### END SOLUTION


# %% [test test_evict_to_sinks points=2]
"""The first num_sinks positions, then the last `window`, in order; nothing dropped while the cache fits."""
ev_k = torch.arange(10.0).view(1, 1, 10, 1).expand(2, 3, 10, 4)          # position t holds the value t
ev_v = -ev_k
ev_k2, ev_v2 = evict_to_sinks(ev_k, ev_v, num_sinks=2, window=3)
assert ev_k2.shape == (2, 3, 5, 4), f"2 sinks + a window of 3 keep 5 positions: expected (2, 3, 5, 4), got {tuple(ev_k2.shape)}"
assert ev_k2[0, 0, :, 0].tolist() == [0.0, 1.0, 7.0, 8.0, 9.0], \
    f"keep positions 0, 1 (the sinks) and 7, 8, 9 (the last 3), in that order; got {ev_k2[0, 0, :, 0].tolist()}"
assert torch.equal(ev_v2, -ev_k2), "evict the same positions from v as from k"
ev_k3, _ = evict_to_sinks(ev_k[:, :, :4], ev_v[:, :, :4], num_sinks=2, window=3)
assert ev_k3.shape[2] == 4 and ev_k3[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0, 3.0], \
    "a cache of 4 positions fits in 2 sinks + a window of 3: return it unchanged"
ev_k4, _ = evict_to_sinks(ev_k, ev_v, num_sinks=0, window=4)
assert ev_k4[0, 0, :, 0].tolist() == [6.0, 7.0, 8.0, 9.0], "with num_sinks=0 this is a plain sliding window: the last 4"


# %% [hidden]
# The reference keeps the positions `_kept(T, num_sinks, window)`; each mistake keeps others.
def _kept(T, num_sinks, window):
    if T <= num_sinks + window:                             # the cache still fits: unchanged
        return torch.arange(T)
    return torch.cat([torch.arange(num_sinks), torch.arange(T - window, T)])


def _evict_keeping(positions):
    """evict_to_sinks that keeps ``positions(T, num_sinks, window)`` of the cache, in that order."""
    def evict(k, v, num_sinks, window):
        keep = positions(k.size(2), num_sinks, window)
        return k[:, :, keep], v[:, :, keep]
    return evict


def _last_window_only(T, num_sinks, window):
    return torch.arange(max(T - window, 0), T)


def _last_sinks_plus_window(T, num_sinks, window):
    return torch.arange(max(T - window - num_sinks, 0), T)


def _window_before_sinks(T, num_sinks, window):
    if T <= num_sinks + window:
        return torch.arange(T)
    return torch.cat([torch.arange(T - window, T), torch.arange(num_sinks)])


def _kept_backwards(T, num_sinks, window):
    return _kept(T, num_sinks, window).flip(0) if T > num_sinks + window else torch.arange(T)


def _window_off_by(offset):
    return lambda T, num_sinks, window: _kept(T, num_sinks, window + offset)


def _evicted_always(T, num_sinks, window):
    return torch.cat([torch.arange(min(num_sinks, T)), torch.arange(max(T - window, 0), T)])


EVICT_MISTAKES = [
    *[Mistake("the sink tokens were dropped on eviction: keep positions 0 .. num_sinks-1 as well as the last window",
              _evict_keeping(kept)) for kept in (_last_window_only, _last_sinks_plus_window)],
    *[Mistake("eviction order reversed: the sinks come first, then the recent tokens, oldest first",
              _evict_keeping(kept)) for kept in (_window_before_sinks, _kept_backwards)],
    *[Mistake("the window is off by one: keep exactly the last `window` positions after the sinks",
              _evict_keeping(_window_off_by(offset))) for offset in (-1, 1)],
    Mistake("positions were duplicated or dropped when the cache still fits: return it unchanged when "
            "T <= num_sinks + window", _evict_keeping(_evicted_always)),
]


@hidden.test("test_evict_to_sinks")
def _(t):
    t.function("evict_to_sinks", t.randn(2, 3, 12, 4), t.randn(2, 3, 12, 4), 2, 5, mistakes=EVICT_MISTAKES,
               label="T=12, 2 sinks, window 5")
    t.function("evict_to_sinks", t.randn(1, 2, 20, 3), t.randn(1, 2, 20, 3), 4, 6, mistakes=EVICT_MISTAKES,
               label="T=20, 4 sinks, window 6")
    t.function("evict_to_sinks", t.randn(2, 2, 6, 3), t.randn(2, 2, 6, 3), 2, 5, mistakes=EVICT_MISTAKES,
               label="T=6 fits in 2 sinks + 5: unchanged")
    t.function("evict_to_sinks", t.randn(1, 1, 7, 2), t.randn(1, 1, 7, 2), 2, 5, mistakes=EVICT_MISTAKES,
               label="T=7 = 2 sinks + 5 exactly: unchanged")
    t.function("evict_to_sinks", t.randn(1, 2, 9, 4), t.randn(1, 2, 9, 4), 0, 4, mistakes=EVICT_MISTAKES,
               label="no sinks (a plain window)")
    t.function("evict_to_sinks", t.randn(1, 2, 11, 4, dtype=torch.float64), t.randn(1, 2, 11, 4, dtype=torch.float64),
               3, 4, mistakes=EVICT_MISTAKES, label="float64, T=11, 3 sinks, window 4")
    t.function("evict_to_sinks", t.randn(1, 2, 7, 8), t.randn(1, 2, 7, 8), 1, 4, mistakes=EVICT_MISTAKES,
               label="T=7, 1 sink, window 4, d=8: evict as soon as T > num_sinks + window")


# %% [markdown]
# **Positions inside the cache.** Once tokens are evicted, which position does a cached
# key have? StreamingLLM uses the key's position *in the cache*, not in the text: with
# 4 sinks and a window, the sinks are at positions 0 to 3 and the window follows at 4,
# 5, 6, ... however far the stream has gone. The model then never sees a position
# larger than the cache, which it was trained on. This needs the keys cached *before*
# the rotation, rotated again at every step at their current cache positions (rotating
# a whole cache is cheap next to a model's matrix products). The function below runs
# one token through the trained `ModernLM` that way, with your `evict_to_sinks`.
#
# We compare four ways to read a stream of 512 characters of validation text, 8 times
# the training context, each with room for 32 tokens:
#
# - **window**: a rolling cache of the last 32 tokens (no sinks);
# - **sinks**: 4 sinks and the last 28 tokens (StreamingLLM);
# - **recompute**: for each token, run the model afresh on the last 32 tokens (Xiao et
#   al.'s "sliding window with re-computation": the window's oldest token is then at
#   position 0, where a sink would be; accurate, but each step costs a forward pass over
#   the window);
# - **full cache**: no eviction, the text's own positions, up to 511: the model is
#   asked about positions it never saw.

# %%
@torch.no_grad()
def stream_step(model, token, caches, num_sinks, window):
    """Next-token logits for one token (1, 1), with per-layer caches of keys BEFORE rotation.

    The cache keeps num_sinks + window positions (evict_to_sinks); positions are those in the cache.
    """
    x = model.embed_tokens(token)                                   # (1, 1, d)
    for layer, cache in zip(model.layers, caches):
        attn = layer.self_attn
        h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        u = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(u).view(1, 1, h, d).transpose(1, 2))      # (1, h, 1, d)
        k = attn.k_norm(attn.k_proj(u).view(1, 1, h_kv, d).transpose(1, 2))   # (1, h_kv, 1, d), not rotated
        v = attn.v_proj(u).view(1, 1, h_kv, d).transpose(1, 2)
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        k, v = evict_to_sinks(k, v, num_sinks, window)
        cache[:] = [k, v]
        T = k.size(2)
        positions = torch.arange(T)                                  # positions inside the cache
        k_rot = apply_rope_halves(k, positions, attn.rope_base).repeat_interleave(h // h_kv, dim=1)
        q_rot = apply_rope_halves(q, positions[-1:], attn.rope_base)
        w = torch.softmax(q_rot @ k_rot.transpose(-2, -1) / math.sqrt(d), dim=-1)   # (1, h, 1, T)
        y = w @ v.repeat_interleave(h // h_kv, dim=1)
        x = x + attn.o_proj(y.transpose(1, 2).reshape(1, 1, h * d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.norm(x))[0, -1]                       # (vocab,)


@torch.no_grad()
def stream_nll(model, ids, mode, cache_size=32, num_sinks=4):
    """Per-token negative log-likelihood of ids[1:] given the stream before, and seconds per token."""
    nll = []
    caches = [[] for _ in model.layers]
    past = None
    started = time.perf_counter()
    for t in range(len(ids) - 1):
        token = ids[t].view(1, 1)
        if mode == "window":
            logits = stream_step(model, token, caches, 0, cache_size)
        elif mode == "sinks":
            logits = stream_step(model, token, caches, num_sinks, cache_size - num_sinks)
        elif mode == "recompute":
            logits = model(ids[max(0, t - cache_size + 1):t + 1][None])[0][0, -1]
        else:                                                        # "full": the model's own cache, text positions
            out, past = model(token, past)
            logits = out[0, -1]
        nll.append(-torch.log_softmax(logits, dim=-1)[ids[t + 1]].item())
    return torch.tensor(nll), (time.perf_counter() - started) / (len(ids) - 1)


STREAM_LEN, CACHE_SIZE, NUM_SINKS = 512, 32, 4
stream = val_data[:STREAM_LEN]
MODES = ["window", "sinks", "recompute", "full"]
MODE_TEXT = {"window": "window", "sinks": "sinks", "recompute": "recompute", "full": "full"}  # the table's row names
stream_results = {mode: stream_nll(lm, stream, mode, CACHE_SIZE, NUM_SINKS) for mode in MODES}
print(f"{pad('mode', 10)} {pad('perplexity, first 32', 21, '>')} {pad('after 32', 9, '>')} "
      f"{pad('after 64', 9, '>')} {pad('ms per token', 13, '>')}")
for mode, (nll, seconds) in stream_results.items():
    print(f"{pad(MODE_TEXT[mode], 10)} {math.exp(nll[:CACHE_SIZE].mean()):21.2f} {math.exp(nll[CACHE_SIZE:].mean()):9.2f} "
          f"{math.exp(nll[CONTEXT:].mean()):9.2f} {1000 * seconds:13.2f}")
for mode, (nll, seconds) in stream_results.items():
    glue(f"ppl_{mode}", f"{math.exp(nll[CONTEXT:].mean()):.2f}", display=False)
    glue(f"ms_{mode}", f"{1000 * seconds:.2f}", display=False)
SMOOTH = 64                                                          # the figure's moving average
smoothed = {mode: F.conv1d(nll.view(1, 1, -1), torch.ones(1, 1, SMOOTH) / SMOOTH).view(-1)
            for mode, (nll, _) in stream_results.items()}           # entry p: tokens p+1 .. p+SMOOTH of the stream
above = (smoothed["full"] - smoothed["recompute"] > 0.1).nonzero()
full_departs = int(above[0]) + SMOOTH if len(above) else None        # the end of the first window 0.1 nats above
ppl = {mode: math.exp(nll[CONTEXT:].mean()) for mode, (nll, _) in stream_results.items()}
print(f"the full cache's moving average first lies 0.1 nats above recompute's at position {full_departs}")
glue("full_departs", f"{full_departs}", display=False)
glue("sinks_vs_window", f"{100 * (ppl['sinks'] / ppl['window'] - 1):+.1f}", display=False)
glue("window_vs_recompute", f"{100 * (ppl['window'] / ppl['recompute'] - 1):+.1f}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Reading a 512-character stream with room for 32 tokens",
            "x": "position in the stream (characters)", "y": "loss (nats per character,\nmoving average of 64)",
            "window": "window: last 32 tokens", "sinks": "4 sinks + last 28 (StreamingLLM)",
            "recompute": "recompute the last 32 for each token", "full": "full cache (positions beyond training)",
            "train": "training context (64)", "gap": "difference from recompute (nats)"}
styles = {"window": dict(ls="--", lw=2.2, zorder=5), "sinks": dict(ls="-", lw=1.2, zorder=6),
          "recompute": dict(ls=":", lw=2.4, zorder=4), "full": dict(ls="-", lw=1.6, zorder=3)}
fig, (ax, ax_gap) = plt.subplots(2, 1, figsize=(8, 5.6), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
for mode, smooth in smoothed.items():
    x_pos = torch.arange(len(smooth)) + SMOOTH
    ax.plot(x_pos, smooth, label=fig_text[mode], color=f"C{MODES.index(mode)}", **styles[mode])
    if mode != "full":                # the three bounded caches lie on top of each other above: their gaps
        ax_gap.plot(x_pos, smooth - smoothed["recompute"], color=f"C{MODES.index(mode)}", **styles[mode])
for axis in (ax, ax_gap):
    axis.axvline(CONTEXT, color="grey", ls=":", label=fig_text["train"] if axis is ax else None)
ax_gap.set_xlabel(fig_text["x"])
ax.set_ylabel(fig_text["y"])
ax_gap.set_ylabel(fig_text["gap"])
ax.set_title(fig_text["title"], fontsize=10)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# Does the trained model have an attention sink? For each layer: the mean weight that
# queries at positions 16 to 63 of a 64-character window put on position 0 (uniform
# attention would give it the value printed last), and the mean weight they put on the
# 8 most recent characters, themselves included:

# %%
@torch.no_grad()
def attention_profile(model, ids, recent=8):
    """Per layer: mean weight on position 0, and on the last `recent` keys, of queries 16..N-1; and the
    attention weights averaged over heads (N, N)."""
    N = ids.size(1)
    x = model.embed_tokens(ids)
    first, local, maps = [], [], []
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    near = causal & ~torch.ones(N, N, dtype=torch.bool).tril(-recent)
    for layer in model.layers:
        attn = layer.self_attn
        h, h_kv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        u = layer.input_layernorm(x)
        pos = torch.arange(N)
        q = apply_rope_halves(attn.q_norm(attn.q_proj(u).view(1, N, h, d).transpose(1, 2)), pos, attn.rope_base)
        k = apply_rope_halves(attn.k_norm(attn.k_proj(u).view(1, N, h_kv, d).transpose(1, 2)), pos, attn.rope_base)
        s = q @ k.repeat_interleave(h // h_kv, dim=1).transpose(-2, -1) / math.sqrt(d)
        w = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)[0]           # (h, N, N)
        first.append(w[:, 16:, 0].mean().item())
        local.append((w * near)[:, 16:].sum(-1).mean().item())
        maps.append(w.mean(0))
        x, _ = layer(x)
    return first, local, maps


sink_weights, local_weights, attention_maps = attention_profile(lm, val_data[5000:5000 + CONTEXT][None])
uniform_weight = (1 / torch.arange(17, CONTEXT + 1).double()).mean().item()
print(f"{pad('mean weight on position 0, per layer', 41)}:", [round(w, 3) for w in sink_weights],
      f"(uniform attention: {uniform_weight:.3f})")
print(f"{pad('mean weight on the last 8 keys, per layer', 41)}:", [round(w, 2) for w in local_weights])
glue("sink_w_max", f"{max(sink_weights):.3f}", display=False)
glue("sink_uniform", f"{uniform_weight:.3f}", display=False)
glue("local_w_min", f"{min(local_weights):.2f}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "Layer {layer}",
            "x": "key position", "y": "query position",
            "suptitle": "The trained model's attention weights on 64 characters, mean over heads:\n"
                        "an attention sink would be a bright first column",
            "bar": "square root of the weight"}
fig, axes = plt.subplots(1, len(attention_maps), figsize=(4.6 * len(attention_maps), 4.6))
for layer, (ax, weights) in enumerate(zip(axes, attention_maps), start=1):
    image = ax.imshow(weights ** 0.5, cmap="viridis", vmin=0, vmax=1)   # square root: small weights show
    ax.set_title(fig_text["title"].format(layer=layer), fontsize=9)
    ax.set_xlabel(fig_text["x"])
    ax.set_ylabel(fig_text["y"])
fig.colorbar(image, ax=axes, shrink=0.8, label=fig_text["bar"])
fig.suptitle(fig_text["suptitle"], fontsize=10)
plt.show()

# %% [markdown]
# What the measurement shows, for this model: **no attention sink**. Its layers put at
# most {glue:text}`sink_w_max` of their weight on the first token, less than uniform
# attention would ({glue:text}`sink_uniform`), and at least {glue:text}`local_w_min` on
# the 8 most recent characters: the maps above have a bright diagonal band and no bright
# first column. Past the first 64 characters of the stream, the perplexities per character
# are: plain window {glue:text}`ppl_window`, with sinks {glue:text}`ppl_sinks`,
# recomputing the window {glue:text}`ppl_recompute`, full cache {glue:text}`ppl_full`.
#
# **What this run shows.** Keeping the sinks does not help this model: its perplexity
# with sinks differs from the plain window's by {glue:text}`sinks_vs_window`%, and the
# plain window's from recomputation's by {glue:text}`window_vs_recompute`% (the lower
# panel of the figure draws each curve's distance from recomputation). Evicting the first
# token loses nothing, because this model does not use it. The full cache, which keeps
# the text's own positions, degrades past the trained length: its moving average first
# lies 0.1 nats per character above recomputation's at position
# {glue:text}`full_departs`, gradually rather than at position 64 itself, and ends far
# above it, while every cache that keeps positions inside the cache stays at the
# perplexity of the first 64 characters for as long as the stream goes on. That is the
# half of StreamingLLM's argument this model can show.
#
# **What it cannot show.** The other half, the plain window's blow-up and the sinks'
# repair, needs a model in which sinks have emerged. Xiao et al. measured it on models of
# billions of parameters (Llama 2, MPT, Falcon, Pythia) trained on trillions of tokens
# with contexts of 2K-4K tokens. Gu et al. (2025) studied when sinks emerge: they appear
# during pre-training after effective optimisation on sufficient data, and their
# position depends on the loss and the data distribution. Our model, two layers trained
# for {glue:text}`train_seconds` seconds on characters, has none, so the figure's window
# and sinks curves lie close together. Nor can this toy show StreamingLLM's speed: Xiao et al.
# report up to 22.2 times less time per token than recomputing the window, whose cost
# grows with the window (a forward pass over all of it at every step, with attention
# quadratic in its length), for large models and windows of thousands of tokens. Here the
# model is tiny, the window 32 tokens, and each step of the window and sinks caches runs
# a Python loop over layers with many small tensor operations (evict, rotate the cache
# again), so the per-call overhead of Python and PyTorch dominates every mode. The times
# per token in this run ({glue:text}`ms_window` ms for the window,
# {glue:text}`ms_sinks` ms with sinks, {glue:text}`ms_recompute` ms recomputing the
# window) therefore say nothing about the method.

# %% [markdown]
# ## 10. A paged key/value cache (vLLM)
#
# A server decodes many sequences at once, and does not know in advance how long each
# will grow. Early serving systems reserved, for every sequence, a contiguous cache of
# the maximum length; most of it stayed empty. Kwon et al. (2023) borrowed the answer
# of operating systems to the same problem, **paging**: the cache is a pool of
# fixed-size *blocks* (16 tokens in vLLM), each sequence has a **block table** listing
# the physical blocks that hold its tokens $0..15$, $16..31$, ..., and a block is taken
# from the pool only when a sequence needs it. Blocks need not be adjacent, at most one
# block per sequence is partly empty, and sequences that start with the same prompt can
# point to the **same** blocks for it (a reference count tells when a block is free).
#
# Token $t$ of sequence $b$ then lives in physical block `block_table[b, t // block_size]`
# at slot `t % block_size`. The given class below manages the pool; its blocks come from
# a shuffled free list, so that physical and logical block numbers differ.

# %% [export]
class PagedKVCache:
    """Given: a pool of fixed-size key/value blocks and one block table per sequence."""

    def __init__(self, num_blocks, num_heads, block_size, head_dim, seed=0):
        self.k = torch.zeros(num_blocks, num_heads, block_size, head_dim)
        self.v = torch.zeros(num_blocks, num_heads, block_size, head_dim)
        self.block_size = block_size
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
        self.free = order.tolist()                  # physical blocks not in use
        self.refs = [0] * num_blocks                # how many sequences use each block
        self.tables, self.lengths = {}, {}

    def add_sequence(self, seq, share_prefix_of=None, prefix_len=0):
        """A new sequence; optionally sharing the FULL blocks of another's first prefix_len tokens."""
        shared = []
        if share_prefix_of is not None:
            shared = self.tables[share_prefix_of][:prefix_len // self.block_size]
            for block in shared:
                self.refs[block] += 1
        self.tables[seq], self.lengths[seq] = list(shared), len(shared) * self.block_size

    def append(self, seq, k, v):
        """Write keys and values (H, n, d) of n new tokens at the end of sequence seq."""
        for i in range(k.size(1)):
            t = self.lengths[seq]
            if t % self.block_size == 0:            # the last block is full: take a new one
                block = self.free.pop()
                self.refs[block] = 1
                self.tables[seq].append(block)
            block = self.tables[seq][t // self.block_size]
            self.k[block, :, t % self.block_size] = k[:, i]
            self.v[block, :, t % self.block_size] = v[:, i]
            self.lengths[seq] = t + 1

    def batch(self, seqs):
        """(block_table (B, max_blocks) long, padded with block 0; seq_lens (B,) long)."""
        width = max(len(self.tables[s]) for s in seqs)
        table = torch.zeros(len(seqs), width, dtype=torch.long)
        for b, s in enumerate(seqs):
            table[b, :len(self.tables[s])] = torch.tensor(self.tables[s])
        return table, torch.tensor([self.lengths[s] for s in seqs])


# %% [markdown]
# ### Exercise: `paged_attention`
#
# One decoding step for a batch: each sequence's newest query attends to all of that
# sequence's cached keys and values, read through its block table. Sequences have
# different lengths, so no mask is needed if you treat each sequence on its own (a
# loop over the batch is fine); slots after a sequence's last token hold stale values
# and must not be read. Here you may use `F.scaled_dot_product_attention`.
#
# ```{dropdown} Hint
# For sequence $b$ of length $L$, the blocks `block_table[b, :ceil(L / block_size)]`
# index `k_cache` to give $(n_\text{blocks}, H, \text{block\_size}, d)$; move the head
# axis first and merge the block and slot axes to get $(H, n_\text{blocks}\cdot
# \text{block\_size}, d)$, then keep the first $L$ positions.
# ```

# %% [exercise paged_attention]
def paged_attention(query, k_cache, v_cache, block_table, seq_lens):
    """One decoding step per sequence, reading keys and values through a block table.

    Args:
        query: (B, H, d), the newest query of each sequence.
        k_cache, v_cache: (num_blocks, H, block_size, d), the pool of blocks.
        block_table: (B, max_blocks) long; token t < seq_lens[b] of sequence b sits in
            physical block block_table[b, t // block_size] at slot t % block_size.
            Entries after a sequence's last block hold some valid block index
            (padding) and must not be read.
        seq_lens: (B,) long, the number of cached tokens of each sequence (>= 1).

    Returns (B, H, d): for each b, softmax(q k^T / sqrt(d)) v over the seq_lens[b]
    cached keys and values of sequence b.
    """
    ### BEGIN SOLUTION
    B, H, d = query.shape
    block_size = k_cache.size(2)
    out = []
    for b in range(B):
        L = int(seq_lens[b])
        blocks = block_table[b, :(L + block_size - 1) // block_size]              # (n,)
        k = k_cache[blocks].transpose(0, 1).reshape(H, -1, d)[:, :L]               # (H, L, d)
        v = v_cache[blocks].transpose(0, 1).reshape(H, -1, d)[:, :L]
        scores = (k @ query[b][:, :, None]).squeeze(-1) / math.sqrt(d)             # (H, L)
        out.append((torch.softmax(scores, dim=-1)[:, None, :] @ v).squeeze(1))   # (H, d)
    return torch.stack(out)
    ### END SOLUTION


# %% [test test_paged_attention points=3]
"""Equal to attention over each sequence's contiguous cache: blocks from the table, slots t % block_size, only seq_len keys."""
torch.manual_seed(8)
pa_cache = PagedKVCache(num_blocks=12, num_heads=2, block_size=4, head_dim=3)
pa_k = {s: torch.randn(2, n, 3) for s, n in [("a", 9), ("b", 4), ("c", 1)]}
pa_v = {s: torch.randn(2, n, 3) for s, n in [("a", 9), ("b", 4), ("c", 1)]}
for pa_s in pa_k:
    pa_cache.add_sequence(pa_s)
pa_cache.k += 100 * torch.randn_like(pa_cache.k)           # stale values in unused slots
pa_cache.v += 100 * torch.randn_like(pa_cache.v)
for pa_s in pa_k:
    pa_cache.append(pa_s, pa_k[pa_s], pa_v[pa_s])
pa_table, pa_lens = pa_cache.batch(["a", "b", "c"])
pa_q = torch.randn(3, 2, 3)
pa_out = paged_attention(pa_q, pa_cache.k, pa_cache.v, pa_table, pa_lens)
assert pa_out.shape == (3, 2, 3), f"the output is (B, H, d) = (3, 2, 3), got {tuple(pa_out.shape)}"
for pa_b, pa_s in enumerate(["a", "b", "c"]):
    pa_w = torch.softmax(pa_k[pa_s] @ pa_q[pa_b][:, :, None] / math.sqrt(3), dim=1)
    pa_want = (pa_w * pa_v[pa_s]).sum(1)
    assert torch.allclose(pa_out[pa_b], pa_want, atol=1e-5), \
        (f"sequence {pa_s!r} (length {pa_lens[pa_b].item()}, blocks {pa_table[pa_b].tolist()}) differs from attention "
         "over its contiguous keys: token t is in block block_table[b, t // block_size] at slot t % block_size, "
         "and only the first seq_lens[b] slots are keys")


# %% [hidden]
# The reference, one sequence at a time, in named steps; `_paged` takes each step as a keyword,
# and each mistake below is one step written wrong.
def _table_blocks(block_table, b, n_blocks, num_blocks):
    """The physical blocks of sequence b: its first n_blocks entries of the block table."""
    return block_table[b, :n_blocks]


def _first_keys(k, v, L):
    """The sequence's L keys and values; the slots after them hold stale values."""
    return k[:, :L], v[:, :L]


def _paged(query, k_cache, v_cache, block_table, seq_lens, blocks=_table_blocks, keys=_first_keys, scale=math.sqrt):
    B, H, d = query.shape
    bs = k_cache.size(2)
    out = []
    for b in range(B):
        L = int(seq_lens[b])
        physical = blocks(block_table, b, -(-L // bs), k_cache.size(0))
        k, v = keys(k_cache[physical].transpose(0, 1).reshape(H, -1, d),
                    v_cache[physical].transpose(0, 1).reshape(H, -1, d), L)
        s = (k @ query[b][:, :, None]).squeeze(-1) / scale(d)
        out.append((s.softmax(-1)[:, None] @ v).squeeze(1))
    return torch.stack(out)


def _paged_with(**wrong_step):
    return lambda *args: _paged(*args, **wrong_step)


def _logical_blocks(block_table, b, n_blocks, num_blocks):
    return torch.arange(n_blocks)


def _table_read_one_late(block_table, b, n_blocks, num_blocks):
    return block_table[b, 1:n_blocks + 1]


def _next_physical_blocks(block_table, b, n_blocks, num_blocks):
    return (block_table[b, :n_blocks] + 1) % num_blocks


def _all_slots(k, v, L):
    return k, v


def _last_key_left_out(k, v, L):
    return k[:, :L - 1], v[:, :L - 1]


PAGED_MISTAKES = [
    Mistake("the logical block index was used as the physical block: token t is in block block_table[b, t // "
            "block_size], not in block t // block_size", _paged_with(blocks=_logical_blocks)),
    *[Mistake("the block table was read off by one: token t is in block block_table[b, t // block_size]",
              _paged_with(blocks=off_by_one)) for off_by_one in (_table_read_one_late, _next_physical_blocks)],
    Mistake("keys past seq_lens[b] were read: the slots after a sequence's last token hold stale values; attend "
            "to the first seq_lens[b] only", _paged_with(keys=_all_slots)),
    Mistake("the last cached token was left out: attend to all seq_lens[b] keys, 0 .. seq_lens[b]-1",
            _paged_with(keys=_last_key_left_out)),
    Mistake("scores scaled by 1/d: scale by 1/sqrt(d)", _paged_with(scale=lambda d: d)),
    Mistake("scores not scaled by 1/sqrt(d)", _paged_with(scale=lambda d: 1.0)),
]


def _pool(t, num_blocks, H, bs, d, lens, dtype=torch.float32, shared=0):
    """A pool full of random (stale) values and a block table with shuffled blocks; padding entries are 0."""
    k, v = t.randn(num_blocks, H, bs, d, dtype=dtype) * 3, t.randn(num_blocks, H, bs, d, dtype=dtype)
    order = torch.randperm(num_blocks, generator=t.gen).tolist()
    width = max(-(-n // bs) for n in lens)
    table = torch.zeros(len(lens), width, dtype=torch.long)
    prefix = [order.pop() for _ in range(shared)]
    for b, n in enumerate(lens):
        blocks = prefix + [order.pop() for _ in range(-(-n // bs) - shared)]
        table[b, :len(blocks)] = torch.tensor(blocks)
    return k, v, table, torch.tensor(lens)


@hidden.test("test_paged_attention")
def _(t):
    k, v, table, lens = _pool(t, 16, 2, 4, 3, [9, 4, 1, 6])
    t.function("paged_attention", t.randn(4, 2, 3), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="4 sequences of lengths 9, 4, 1, 6, blocks of 4")
    k, v, table, lens = _pool(t, 20, 3, 8, 4, [17, 30, 8], shared=2)
    t.function("paged_attention", t.randn(3, 3, 4), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="3 sequences sharing their first 2 blocks")
    k, v, table, lens = _pool(t, 10, 1, 5, 6, [23])
    t.function("paged_attention", t.randn(1, 1, 6), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="one sequence of 23 tokens, blocks of 5")
    k, v, table, lens = _pool(t, 12, 2, 3, 4, [7, 2], dtype=torch.float64)
    t.function("paged_attention", t.randn(2, 2, 4, dtype=torch.float64), k, v, table, lens, mistakes=PAGED_MISTAKES,
               label="float64")


# %% [markdown]
# Now a batch of the kind a server decodes: 6 requests that start with the same prompt of
# 40 tokens (a system prompt, say) and continue for different lengths. The first request
# writes the prompt; the others share its two full blocks and write the rest themselves.
# Your `paged_attention` must give what attention over each request's contiguous cache
# gives, up to float32 rounding: the same numbers are summed, but not necessarily in the
# same order (`F.scaled_dot_product_attention`, which is allowed here, has its own order),
# so we compare within $10^{-6}$, not bit for bit.

# %%
torch.manual_seed(0)
H_demo, D_demo, BS_demo = 4, 16, 16
prompt_len, extra = 40, [3, 57, 20, 101, 9, 64]
prompt_k, prompt_v = torch.randn(H_demo, prompt_len, D_demo), torch.randn(H_demo, prompt_len, D_demo)
paged = PagedKVCache(num_blocks=64, num_heads=H_demo, block_size=BS_demo, head_dim=D_demo)
contiguous = {}
for r, n in enumerate(extra):
    k_new, v_new = torch.randn(H_demo, n, D_demo), torch.randn(H_demo, n, D_demo)
    if r == 0:
        paged.add_sequence(r)
        paged.append(r, prompt_k, prompt_v)
    else:                                             # share the prompt's full blocks, write the rest
        paged.add_sequence(r, share_prefix_of=0, prefix_len=prompt_len)
        shared = paged.lengths[r]
        paged.append(r, prompt_k[:, shared:], prompt_v[:, shared:])
    paged.append(r, k_new, v_new)
    contiguous[r] = (torch.cat([prompt_k, k_new], 1), torch.cat([prompt_v, v_new], 1))
table, lens = paged.batch(list(range(len(extra))))
q_step = torch.randn(len(extra), H_demo, D_demo)
paged_out = paged_attention(q_step, paged.k, paged.v, table, lens)
contig_out = torch.stack([                            # the same formula on each request's contiguous cache
    (torch.softmax((contiguous[r][0] @ q_step[r][:, :, None]).squeeze(-1) / math.sqrt(D_demo), dim=-1)[:, None, :]
     @ contiguous[r][1]).squeeze(1) for r in range(len(extra))])
print("block tables:")
for r in range(len(extra)):
    print(f"  request {r} ({lens[r].item():3d} tokens): {paged.tables[r]}")
paged_gap = (paged_out - contig_out).abs().max().item()
print(f"max |paged - contiguous| = {paged_gap:.1e}; equal within float32 rounding (1e-6): {paged_gap < 1e-6}")
blocks_used = sum(1 for c in paged.refs if c > 0)
blocks_unshared = sum(-(-int(n) // BS_demo) for n in lens)
print(f"blocks in use: {blocks_used} (without sharing the prompt: {blocks_unshared})")
glue("paged_gap", f"{paged_gap:.1e}", display=False)

# %% [tags=hide-input]
fig_text = {"title": "The batch's block tables: each cell is a physical block",
            "x": "logical block (16 tokens each)", "y": "request",
            "shared": "shared prompt block (stored once)", "own": "the request's own block"}
rows = len(extra)
width = max(len(paged.tables[r]) for r in range(rows))
owner = torch.full((rows, width), float("nan"))   # 1: a block several requests share, 0: a request's own
for r in range(rows):
    for j, block in enumerate(paged.tables[r]):
        owner[r, j] = float(paged.refs[block] > 1)
fig, ax = plt.subplots(figsize=(10, 3.2))
ax.imshow(owner, cmap=ListedColormap(["#cfe2f3", "#f6b26b"]), vmin=0, vmax=1, aspect="auto")
for r in range(rows):
    for j, block in enumerate(paged.tables[r]):
        ax.text(j, r, str(block), ha="center", va="center", fontsize=8)
ax.set_xticks(range(width))
ax.set_yticks(range(rows))
ax.set_xlabel(fig_text["x"])
ax.set_ylabel(fig_text["y"])
ax.set_title(fig_text["title"], fontsize=10)
ax.legend(handles=[Patch(color="#f6b26b", label=fig_text["shared"]),
                   Patch(color="#cfe2f3", label=fig_text["own"])],
          loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# The block tables start with the same two physical blocks, the prompt's first 32
# tokens, stored once; the largest difference between the two outputs is
# {glue:text}`paged_gap`.
#
# vLLM shares blocks in two ways. The paper's (Kwon et al., 2023) serves several samples of
# one prompt: they share *all* of the prompt's blocks, its partly filled last block too
# (reference count 2), and a sample that is about to write into a shared block first gets
# its own copy of it ("copy on write"). Later versions added automatic prefix caching
# across requests, which finds blocks by a hash of their tokens and shares only *full*
# blocks, which are never written again. The demo above shares the way prefix caching
# does: the two full blocks, while each request writes the prompt's partial third block
# itself.
#
# **The memory it saves.** Take 64 requests with the cache of Llama 3 8B (Section 8:
# {glue:text}`llama_token_kib` KiB per token in 16 bits), and lengths between 16 and 4,096 tokens drawn
# at random so that many are short and a few long (synthetic lengths, not a measured
# trace). A contiguous cache reserves the maximum length for every request; a paged one
# reserves whole blocks of 16. With a shared system prompt of 512 tokens, the paged cache
# stores it once.

# %%
def cache_memory(lengths, max_len, block_size, bytes_per_token, shared_prefix=0):
    """Bytes used by tokens, reserved contiguously, and reserved by pages (prefix blocks shared)."""
    used = sum(lengths) * bytes_per_token
    contiguous_bytes = len(lengths) * max_len * bytes_per_token
    prefix_blocks = shared_prefix // block_size
    blocks = prefix_blocks + sum(-(-n // block_size) - prefix_blocks for n in lengths)
    return used, contiguous_bytes, blocks * block_size * bytes_per_token


gen = torch.Generator().manual_seed(0)
lengths = (16 + (4096 - 16) * torch.rand(64, generator=gen) ** 2).long().tolist()   # many short, a few long
LLAMA3_8B_TOKEN = 32 * 2 * 8 * 128 * 2                          # layers x (k, v) x 8 heads x 128 x 2 bytes
glue("llama_token_kib", f"{LLAMA3_8B_TOKEN // 1024}", display=False)
used, contiguous_bytes, paged_bytes = cache_memory(lengths, 4096, 16, LLAMA3_8B_TOKEN)
waste_contig = 1 - used / contiguous_bytes
waste_paged = 1 - used / paged_bytes
prompt_lengths = [512 + n for n in lengths]
used_p, contig_p, paged_p = cache_memory(prompt_lengths, 4096 + 512, 16, LLAMA3_8B_TOKEN, shared_prefix=512)
print(f"mean length {sum(lengths) / len(lengths):.0f} tokens, longest {max(lengths)}")
print(f"{pad('the tokens’ keys and values', 24)}: {used / 2**30:6.2f} GiB")
print(f"{pad('contiguous, 4,096 each', 24)}: {contiguous_bytes / 2**30:6.2f} GiB  "
      f"({100 * waste_contig:.1f}% reserved but empty)")
print(f"{pad('paged, blocks of 16', 24)}: {paged_bytes / 2**30:6.2f} GiB  ({100 * waste_paged:.2f}% reserved but empty)")
print(f"with a shared prompt of 512 tokens: contiguous {contig_p / 2**30:.2f} GiB, paged {paged_p / 2**30:.2f} GiB "
      f"(the tokens themselves, prompt counted per request: {used_p / 2**30:.2f} GiB)")
glue("waste_contig", f"{100 * waste_contig:.0f}", display=False)
glue("waste_paged", f"{100 * waste_paged:.1f}", display=False)
glue("contig_gib", f"{contiguous_bytes / 2**30:.1f}", display=False)
glue("paged_gib", f"{paged_bytes / 2**30:.1f}", display=False)
glue("shared_ratio", f"{contig_p / paged_p:.1f}", display=False)

# %% [markdown]
# The contiguous cache reserves {glue:text}`contig_gib` GiB, of which
# {glue:text}`waste_contig`% is never written; the paged one reserves
# {glue:text}`paged_gib` GiB, with {glue:text}`waste_paged`% empty (the unfilled end of
# each request's last block). With the shared prompt the contiguous cache needs
# {glue:text}`shared_ratio` times the paged one's memory. Kwon et al. (2023) measured the
# same effect in the serving systems before vLLM: only 20.4% to 38.2% of their cache memory
# held tokens' keys and values. Memory is what limits how many requests a GPU serves at
# once, so this is what made vLLM's throughput higher than theirs (2 to 4 times, in the
# same paper).
#
# The price: attention must gather keys through a table instead of reading one
# contiguous array, so vLLM ships its own attention kernel. Its first PagedAttention
# kernel (Kwon et al., 2023) is a decoding kernel: for each sequence's newest query it
# walks that sequence's blocks through the block table, one block of keys and values at a
# time, as your `paged_attention` does; it is not FlashAttention's tiling of many queries
# (Chapter 6).

# %% [markdown]
# ## Check your understanding
#
# 1. A checkpoint trained with interleaved RoPE is loaded into code that uses the halves
#    layout, without changing any weight. Does it load? Does it work? What must a
#    conversion script do?
#
#    ```{dropdown} Answer
#    It loads (the shapes are the same) and gives a broken model: the code pairs
#    features $i$ and $i + d/2$ where training paired $2i$ and $2i+1$. The conversion
#    permutes the output rows of `q_proj` and `k_proj` in every head, even features
#    first and odd features after them (Section 3); values and all other weights stay.
#    ```
#
# 2. Why does QK-norm come before the rotation and not after? Would it matter if
#    `q_norm.weight` were all ones?
#
#    ```{dropdown} Answer
#    A rotation does not change a vector's length, so the RMS is the same before and
#    after; but the weight multiplies feature by feature, and the rotation mixes
#    features $i$ and $i + d/2$, so $w \odot R x \ne R (w \odot x)$ unless the two
#    features of each pair have the same weight. With all-ones weights the order would
#    not matter, which is why the comparison with Qwen3 gave its norms random weights.
#    ```
#
# 3. DeepSeek-V3 has 61 layers and caches 576 numbers per token and layer. How many
#    bytes does one token cost in a 16-bit cache, and how many would a Llama-3-8B-style
#    GQA cache (8 key/value heads of 128) cost with the same 61 layers?
#
#    ```{dropdown} Answer
#    $61 \times 576 \times 2 = 70{,}272$ bytes, about 68.6 KiB. GQA:
#    $61 \times 2 \times 8 \times 128 \times 2 = 249{,}856$ bytes, about 244 KiB: a
#    ratio of 3.6, with 16 times fewer key heads than MLA's 128.
#    ```

# %% [markdown]
# 4. With absorption, MLA scores queries against the cached latents directly. Why can
#    the rotary part not be absorbed in the same way?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_rotary_not_absorbed points=2]
# ### BEGIN SOLUTION
# **Model answer.** Absorption folds the key's up-projection into the query, once, because
# the score $q^\top W^\top c_s$ uses the same matrix for every position. The rotation of a
# key depends on the key's position $s$ and sits between the latent and the query:
# $q^\top R_t^\top R_s W^\top c_s$ depends on $s$ through $R_s$, so there is no single
# matrix to fold into the query. That is why MLA carries a separate, small rotary key
# shared by all heads, and caches it next to the latent.
#
# **Rubric (2 points).**
#
# - 1 point: the rotation depends on each key's position, between the latent and the
#   query, so no one fixed matrix can be absorbed into the query for all keys.
# - 1 point: MLA's answer: a separate small rotary key (shared by the heads), cached
#   beside the latent, while the latent part stays unrotated and absorbed.
# ### END SOLUTION

# %% [markdown]
# 5. A sequence has 37 tokens in a paged cache with blocks of 16, and block table
#    `[7, 2, 9]`. Where is token 20? Token 36? How many slots are reserved but empty?
#
#    ```{dropdown} Answer
#    Token 20: block `block_table[20 // 16] = 2`, slot $20 \bmod 16 = 4$. Token 36: block
#    9, slot 4. Three blocks reserve 48 slots for 37 tokens: 11 are empty.
#    ```
#
# ## Challenges (optional, not graded)
#
# - Add query compression to `MultiHeadLatentAttention` (DeepSeek-V2's `q_down`, a
#   norm and `q_up`) and check that the absorbed form still works.
# - Train the model of Section 7 with a few layers using `sliding_window_mask` (window
#   16) and measure what it costs in perplexity on 64-character windows.
# - Gated attention: multiply each head's output by a sigmoid gate computed from the
#   layer's input (Qiu et al., 2025), train, and measure the weight on the first token
#   again. Does the sink shrink?
# - Extend `PagedKVCache` with copy on write: when a request writes into a shared
#   block, give it a private copy first.
#
# ## Summary
#
# - A 2025 decoder block replaces LayerNorm by RMSNorm, learned positions by rotary ones
#   (in the halves layout, which is Chapter 4's up to a fixed permutation), one
#   key/value head per query head by grouped-query attention, the GELU MLP by SwiGLU,
#   and adds QK-norm. Assembled from your pieces, it matches `transformers`' Qwen3 to
#   {glue:text}`qwen_err` in the logits, with the same greedy tokens.
# - Multi-head latent attention caches a latent and one shared rotary key,
#   {glue:text}`v3_elems` numbers per token and layer in DeepSeek-V3 against
#   {glue:text}`v3_mha_elems` for multi-head attention; absorption computes the same
#   output without up-projecting the cache. DeepSeek-V2's "93.3%" smaller cache is
#   {glue:text}`mla_alone`% from the architecture and reaches {glue:text}`with_quant`%
#   with its 6-bit cache.
# - Sliding windows with attention sinks keep the cache and the positions bounded:
#   streaming 512 characters through a cache of 32, the perplexity is
#   {glue:text}`ppl_window` with a plain window, {glue:text}`ppl_sinks` with 4 sinks,
#   {glue:text}`ppl_recompute` recomputing the window for every token, and
#   {glue:text}`ppl_full` with a full cache whose positions outgrow training. This small
#   model has no attention sink (weight {glue:text}`sink_w_max` on the first token), so
#   the sinks change nothing here; the window's blow-up that sinks repair needs a model in
#   which sinks have emerged (Xiao et al., 2023; Gu et al., 2025).
# - A paged cache reads keys and values through a block table, gives the contiguous
#   cache's output (to {glue:text}`paged_gap`, float32 rounding), and reserves {glue:text}`paged_gib` GiB where a
#   contiguous one reserves {glue:text}`contig_gib` GiB for the same 64 requests.
#
# ## References
#
# - DeepSeek-AI (2024). *DeepSeek-V2: A Strong, Economical, and Efficient
#   Mixture-of-Experts Language Model.* <https://arxiv.org/abs/2405.04434>
# - DeepSeek-AI (2024). *DeepSeek-V3 Technical Report.* <https://arxiv.org/abs/2412.19437>
# - DeepSeek-AI (2024). *DeepSeek LLM: Scaling Open-Source Language Models with
#   Longtermism.* <https://arxiv.org/abs/2401.02954>
# - G. Xiao, Y. Tian, B. Chen, S. Han, M. Lewis (2023). *Efficient Streaming Language
#   Models with Attention Sinks.* ICLR 2024. <https://arxiv.org/abs/2309.17453>
# - W. Kwon, Z. Li, S. Zhuang, Y. Sheng, L. Zheng, C. H. Yu, J. E. Gonzalez, H. Zhang,
#   I. Stoica (2023). *Efficient Memory Management for Large Language Model Serving with
#   PagedAttention.* SOSP. <https://arxiv.org/abs/2309.06180>
# - J. Ainslie, J. Lee-Thorp, M. de Jong, Y. Zemlyanskiy, F. Lebrón, S. Sanghai (2023).
#   *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
#   Checkpoints.* EMNLP. <https://arxiv.org/abs/2305.13245>
# - N. Shazeer (2019). *Fast Transformer Decoding: One Write-Head is All You Need.*
#   <https://arxiv.org/abs/1911.02150>
# - A. Yang et al., Qwen Team (2025). *Qwen3 Technical Report.*
#   <https://arxiv.org/abs/2505.09388>
# - A. Grattafiori et al., Llama Team (2024). *The Llama 3 Herd of Models.*
#   <https://arxiv.org/abs/2407.21783>
# - B. Zhang, R. Sennrich (2019). *Root Mean Square Layer Normalization.* NeurIPS.
#   <https://arxiv.org/abs/1910.07467>
# - N. Shazeer (2020). *GLU Variants Improve Transformer.* <https://arxiv.org/abs/2002.05202>
# - Y. N. Dauphin, A. Fan, M. Auli, D. Grangier (2017). *Language Modeling with Gated
#   Convolutional Networks.* ICML. <https://arxiv.org/abs/1612.08083>
# - J. Su, Y. Lu, S. Pan, A. Murtadha, B. Wen, Y. Liu (2021). *RoFormer: Enhanced
#   Transformer with Rotary Position Embedding.* <https://arxiv.org/abs/2104.09864>
# - A. Henry, P. R. Dachapally, S. S. Pawar, Y. Chen (2020). *Query-Key Normalization for
#   Transformers.* Findings of EMNLP. <https://arxiv.org/abs/2010.04245>
# - M. Dehghani et al. (2023). *Scaling Vision Transformers to 22 Billion Parameters.*
#   ICML. <https://arxiv.org/abs/2302.05442>
# - A. Q. Jiang et al. (2023). *Mistral 7B.* <https://arxiv.org/abs/2310.06825>
# - Z. Qiu et al. (2025). *Gated Attention for Large Language Models: Non-linearity,
#   Sparsity, and Attention-Sink-Free.* <https://arxiv.org/abs/2505.06708>
# - T. Wolf et al. (2020). *Transformers: State-of-the-Art Natural Language Processing.*
#   EMNLP (demos). <https://arxiv.org/abs/1910.03771>
# - X. Gu, T. Pang, C. Du, Q. Liu, F. Zhang, C. Du, Y. Wang, M. Lin (2025). *When Attention
#   Sink Emerges in Language Models: An Empirical View.* ICLR. <https://arxiv.org/abs/2410.10781>
# - A. Chowdhery et al. (2022). *PaLM: Scaling Language Modeling with Pathways.*
#   <https://arxiv.org/abs/2204.02311>
# - S. Black et al. (2022). *GPT-NeoX-20B: An Open-Source Autoregressive Language Model.*
#   <https://arxiv.org/abs/2204.06745>
# - H. Touvron et al. (2023). *LLaMA: Open and Efficient Foundation Language Models.*
#   <https://arxiv.org/abs/2302.13971>; *Llama 2: Open Foundation and Fine-Tuned Chat
#   Models.* <https://arxiv.org/abs/2307.09288>
# - S. Chen, S. Wong, L. Chen, Y. Tian (2023). *Extending Context Window of Large Language
#   Models via Positional Interpolation.* <https://arxiv.org/abs/2306.15595>
# - B. Peng, J. Quesnelle, H. Fan, E. Shippole (2023). *YaRN: Efficient Context Window
#   Extension of Large Language Models.* <https://arxiv.org/abs/2309.00071>
# - Gemma Team (2024). *Gemma 2: Improving Open Language Models at a Practical Size.*
#   <https://arxiv.org/abs/2408.00118>
# - Gemma Team (2025). *Gemma 3 Technical Report.* <https://arxiv.org/abs/2503.19786>
# - OpenAI (2025). *gpt-oss-120b & gpt-oss-20b Model Card.* <https://arxiv.org/abs/2508.10925>
