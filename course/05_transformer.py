# %% [markdown]
# # Chapter 5: The Transformer
#
# Chapters 2 to 4 built the parts: scaled dot-product attention, several heads side by
# side, and a way to tell positions apart. This chapter assembles them into the model
# of Vaswani et al. (2017), *Attention Is All You Need*: an **encoder** that turns the
# input into one vector per token, a **decoder** that writes the output one token at a
# time while it looks back at the encoder's vectors, and between the attention layers
# a small feed-forward network, residual connections and layer normalisation. You will
# prove that your layers compute exactly what PyTorch's own `nn.TransformerEncoderLayer`
# and `nn.TransformerDecoderLayer` compute, train the model on a CPU on the date task
# of Chapter 1 and on a toy translation, and look inside it.
#
# **Learning goals.** After this chapter you can
#
# - draw the encoder and decoder layers, and say for every sub-layer where its
#   queries, keys and values come from and which mask it uses;
# - write the post-LN layer of the paper and the pre-LN layer of most recent models,
#   and measure how differently they behave without learning-rate warm-up;
# - explain what layer normalisation normalises (the features of one token), and show
#   by computation what goes wrong when it is taken over the sequence instead;
# - count the parameters of every component, and say why the feed-forward network
#   holds most of them;
# - train an encoder-decoder with teacher forcing, padding masks, Adam with warm-up and
#   gradient clipping, and decode greedily;
# - read the encoder, decoder and cross-attention maps of a trained model, and state
#   what self-attention costs compared with recurrent and convolutional layers.
#
# **Prerequisites.** Chapters 2 and 3 (attention with masks, multi-head attention) and
# the sinusoidal encoding of Chapter 4; the date task of Chapter 1 is reused. Linear
# algebra at the level of matrix products, and the basics of training a network in
# PyTorch (a loss, an optimiser, `backward`).
#
# **Time.** About 3 hours: 1.5 for reading and the exercises, the rest for the
# experiments and the questions. Every cell of the chapter runs on a laptop CPU: the
# whole notebook takes about two minutes on two cores (when this book was built, the date
# model trained in {glue:text}`date_seconds:.0f` s and the translation model in
# {glue:text}`mt_seconds:.0f` s).
#
# **What you will build.**
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `FeedForward(d_model, d_ff, dropout)` | the position-wise network $\max(0, xW_1 + b_1)W_2 + b_2$ | ★ | 2 |
# | `EncoderLayer(...)` | self-attention and feed-forward, each with a residual connection and a LayerNorm, post-LN or pre-LN | ★★ | 4 |
# | `DecoderLayer(...)` | masked self-attention, cross-attention to the encoder output, feed-forward | ★★ | 4 |
# | `Transformer(...)` | embeddings, positions, the two stacks: `encode`, `decode`, `forward` | ★★ | 3 |
# | `greedy_decode(model, src, ...)` | write the output one token at a time, for a whole batch | ★★★ | 3 |

# %% [export]
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# %%
import datetime
import random
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
# The models of this chapter are small: on a machine shared with other programs a
# second thread gains nothing and makes timings noisy.
torch.set_num_threads(1)

# %% [include 01_bahdanau_attention:text_width tags=hide-input]

# %% [markdown]
# ## 1. The parts we already have
#
# Three pieces from earlier chapters are given here so that this notebook stands on
# its own. They are the computations you wrote there (Chapter 3 showed that the
# multi-head layer equals `nn.MultiheadAttention`):
#
# - `scaled_dot_product_attention(query, key, value, mask)`:
#   $\mathrm{softmax}(QK^\top/\sqrt{d_k})\,V$, with a boolean mask where True means
#   "may attend";
# - `MultiHeadAttention(d_model, num_heads)` with the parameters `W_q`, `W_k`, `W_v`,
#   `W_o`, called as `mha(query, key, value, mask)` and returning `(output, weights)`.
#   It also keeps the weights of its last call in `last_weights`, so that we can draw
#   them at the end of the chapter;
# - `sinusoidal_encoding(max_len, d_model)`: the table $PE$ of Chapter 4,
#   $PE_{pos, 2i} = \sin(pos / 10000^{2i/d_\text{model}})$,
#   $PE_{pos, 2i+1} = \cos(pos / 10000^{2i/d_\text{model}})$.

# %% [include 03_multi_head_attention:given_attention]

# %% [export]
class MultiHeadAttention(nn.Module):
    """Given (Chapter 3): multi-head attention; head i uses features i*d_k:(i+1)*d_k."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.last_weights = None   # (B, h, N_q, N_k) of the last call, for plots

    def forward(self, query, key, value, mask=None):
        """query (B, N_q, d_model), key and value (B, N_k, d_model); mask broadcastable
        to (B, h, N_q, N_k), True = may attend. Returns (output (B, N_q, d_model),
        weights (B, h, N_q, N_k))."""
        B, N_q, d_model = query.shape
        h, d_k = self.num_heads, self.d_k
        q = self.W_q(query).view(B, N_q, h, d_k).transpose(1, 2)   # (B, h, N_q, d_k)
        k = self.W_k(key).view(B, -1, h, d_k).transpose(1, 2)      # (B, h, N_k, d_k)
        v = self.W_v(value).view(B, -1, h, d_k).transpose(1, 2)    # (B, h, N_k, d_k)
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        self.last_weights = weights.detach()
        return self.W_o(out.transpose(1, 2).reshape(B, N_q, d_model)), weights


def sinusoidal_encoding(max_len, d_model):
    """Given (Chapter 4): the (max_len, d_model) sinusoidal table, sin and cos interleaved."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]          # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)           # (d_model / 2,)
    angle = pos / 10000 ** (two_i / d_model)                           # (max_len, d_model / 2)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe


# %% [markdown]
# ## 2. The architecture at a glance
#
# The Transformer maps a source sequence $x_1, \dots, x_n$ (say, an English sentence)
# to a target sequence $y_1, \dots, y_m$ (its translation). Like the encoder-decoder of
# Chapter 1, it has two halves, but neither contains a recurrence:
#
# - The **encoder** embeds each source token, adds its position vector, and passes the
#   sequence through $L$ identical *encoder layers*. Each layer has two sub-layers:
#   multi-head **self-attention**, in which every source token looks at every other
#   one, and a **position-wise feed-forward network**, which transforms each token on
#   its own. The result, one $d_\text{model}$-dimensional vector per source token, is
#   called the *memory*.
# - The **decoder** does the same for the target tokens written so far, with three
#   sub-layers per layer: **masked self-attention** (a target token may look only at
#   itself and the tokens before it), **cross-attention** (queries from the decoder,
#   keys and values from the memory: this is where the decoder reads the source, as
#   Bahdanau's decoder did in Chapter 1), and the feed-forward network. A final linear
#   layer turns each decoder vector into scores over the target vocabulary.
#
# Around every sub-layer sit a **residual connection** (the sub-layer's input is added
# to its output) and a **layer normalisation**. The diagram shows both stacks as the
# paper draws them, with the normalisation after each sum ("post-LN"); Section 5
# compares this with the "pre-LN" arrangement of most recent models.

# %% [tags=hide-input]
ARCH_TEXT = dict(
    title="The Transformer (post-LN, as in the paper)",
    encoder="Encoder layer (× L)", decoder="Decoder layer (× L)",
    src="source tokens (B, N_src)", tgt="target tokens so far (B, N_tgt)",
    embed="Embedding × √d_model\n+ positional encoding",
    self_attn="Multi-head self-attention\nQ = K = V = x, padding mask",
    masked_attn="Masked multi-head self-attention\nQ = K = V = y, causal mask",
    cross_attn="Cross-attention\nQ from the decoder,\nK = V = memory",
    ffn="Feed-forward\nReLU(x W₁ + b₁) W₂ + b₂",
    add_norm="Add & LayerNorm",
    memory="memory (B, N_src, d_model)",
    out="Linear → logits (B, N_tgt, vocab)",
    residual="residual",
)


def draw_transformer_diagram(text=ARCH_TEXT):
    fig, ax = plt.subplots(figsize=(10, 8.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10.6)
    ax.axis("off")
    colors = dict(attn="#f6d8a8", ffn="#bfe3c0", norm="#f3f1a7", embed="#f4c2c2", io="#dcdcdc",
                  out="#c9d7f2")

    def box(x, y, w, h, label, color, size=8.5):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                    fc=color, ec="black", lw=0.8))
        ax.text(x, y, label, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, style="-|>", color="black", rad=0.0):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=10,
                                     color=color, lw=1.0, connectionstyle=f"arc3,rad={rad}"))

    def residual(x, y0, y1, side):
        xs = x + side
        ax.plot([x, xs, xs], [y0, y0, y1], color="gray", lw=1.0, ls="--")
        arrow(xs, y1, x + side * 0.62, y1, color="gray")
        ax.text(xs + side * 0.05, (y0 + y1) / 2, text["residual"], rotation=90, fontsize=7,
                color="gray", ha="left" if side > 0 else "right", va="center")

    # encoder (left), decoder (right)
    ex, dx, w = 2.6, 7.2, 3.0
    ax.add_patch(FancyBboxPatch((ex - 1.95, 2.15), 3.9, 4.35, boxstyle="round,pad=0.05",
                                fc="none", ec="#555555", lw=1.2, ls="-"))
    ax.text(ex - 1.85, 6.3, text["encoder"], fontsize=9, weight="bold", va="top")
    ax.add_patch(FancyBboxPatch((dx - 1.95, 2.15), 3.9, 6.3, boxstyle="round,pad=0.05",
                                fc="none", ec="#555555", lw=1.2))
    ax.text(dx - 1.85, 8.3, text["decoder"], fontsize=9, weight="bold", va="top")

    box(ex, 0.35, w, 0.45, text["src"], colors["io"])
    box(ex, 1.35, w, 0.7, text["embed"], colors["embed"])
    box(ex, 2.85, w, 0.75, text["self_attn"], colors["attn"])
    box(ex, 3.75, w, 0.4, text["add_norm"], colors["norm"])
    box(ex, 4.75, w, 0.75, text["ffn"], colors["ffn"])
    box(ex, 5.65, w, 0.4, text["add_norm"], colors["norm"])
    box(ex, 7.3, w, 0.45, text["memory"], colors["io"])
    for y0, y1 in [(0.58, 1.0), (1.7, 2.47), (3.23, 3.55), (3.95, 4.37), (5.13, 5.45), (5.85, 7.07)]:
        arrow(ex, y0, ex, y1)
    residual(ex - w / 2, 2.2, 3.75, -0.25)
    residual(ex - w / 2, 4.1, 5.65, -0.25)

    box(dx, 0.35, w, 0.45, text["tgt"], colors["io"])
    box(dx, 1.35, w, 0.7, text["embed"], colors["embed"])
    box(dx, 2.85, w, 0.75, text["masked_attn"], colors["attn"])
    box(dx, 3.75, w, 0.4, text["add_norm"], colors["norm"])
    box(dx, 4.85, w, 0.95, text["cross_attn"], colors["attn"])
    box(dx, 5.85, w, 0.4, text["add_norm"], colors["norm"])
    box(dx, 6.85, w, 0.75, text["ffn"], colors["ffn"])
    box(dx, 7.75, w, 0.4, text["add_norm"], colors["norm"])
    box(dx, 9.35, w, 0.55, text["out"], colors["out"])
    for y0, y1 in [(0.58, 1.0), (1.7, 2.47), (3.23, 3.55), (3.95, 4.37), (5.33, 5.65), (6.05, 6.47),
                   (7.23, 7.55), (7.95, 9.07)]:
        arrow(dx, y0, dx, y1)
    residual(dx + w / 2, 2.2, 3.75, 0.25)
    residual(dx + w / 2, 4.1, 5.85, 0.25)
    residual(dx + w / 2, 6.2, 7.75, 0.25)
    # memory -> cross-attention keys and values
    ax.plot([ex + w / 2, 5.0, 5.0], [7.3, 7.3, 4.85], color="#b05a00", lw=1.4)
    arrow(5.0, 4.85, dx - w / 2, 4.85, color="#b05a00")
    ax.set_title(text["title"], fontsize=11)
    return fig


draw_transformer_diagram()
plt.show()

# %% [markdown]
# Every tensor between the boxes has the same shape, $(B, N, d_\text{model})$: batch,
# tokens, features. This is what makes the layers stackable, and what makes the
# residual sums possible. Only two boxes change the shape: the embedding (token ids
# $(B, N)$ in) and the final linear layer (scores $(B, N_\text{tgt}, V)$ out).
#
# ## 3. Residual connections and layer normalisation
#
# A sub-layer $\mathrm{Sublayer}$ (attention or feed-forward) does not replace its
# input; its output is *added* to it, and the sum is normalised:
#
# $$x \leftarrow \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{Sublayer}(x))\big),
# \qquad x \in \mathbb{R}^{B \times N \times d_\text{model}}.$$
#
# **Residual connections** (He et al., 2016) give every layer an identity path: a
# layer only has to learn a *change* to its input, and gradients reach the lowest
# layers through the sums without being multiplied by every layer's Jacobian on the
# way. **Layer normalisation** (Ba, Kiros and Hinton, 2016) keeps the scale of the
# vectors under control. For one token's vector $x \in \mathbb{R}^{d_\text{model}}$,
#
# $$\mu = \frac{1}{d}\sum_{j=1}^{d} x_j, \qquad
# \sigma^2 = \frac{1}{d}\sum_{j=1}^{d} (x_j - \mu)^2, \qquad
# \mathrm{LayerNorm}(x)_j = \gamma_j\,\frac{x_j - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta_j ,$$
#
# with learned $\gamma, \beta \in \mathbb{R}^{d_\text{model}}$ and a small $\epsilon$
# ($10^{-5}$ in PyTorch). The mean and variance are taken over the **features of one
# token**, at one position of one sequence: every token is normalised on its own,
# whatever the batch and whatever the other tokens. `nn.LayerNorm(d_model)` does exactly
# this on the last dimension.
#
# :::{admonition} Correction: LayerNorm does not normalise over the sequence
# :class: warning
# A popular introduction to the Transformer explains that, "unlike BatchNorm,
# LayerNorm normalises over the sequence dimension, which suits variable-length
# sequences". It is the other way round: LayerNorm normalises over the *feature*
# dimension of each token, and that is precisely why sequence length does not matter.
# Statistics taken over the sequence would mix the tokens, and in a decoder they would
# let a token see the future. The cell below shows both.
# :::

# %%
torch.manual_seed(0)
B, N, d = 2, 5, 8
x = torch.randn(B, N, d) * 3 + 1                         # (B, N, d): tokens with varied scales

ln = nn.LayerNorm(d, elementwise_affine=False)           # the real LayerNorm: over the features
by_hand = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
print("nn.LayerNorm == normalising each token over its features:",
      torch.allclose(ln(x), by_hand, atol=1e-5))
print("per-token mean after LayerNorm:", ln(x).mean(-1)[0])


def norm_over_sequence(x, eps=1e-5):
    """The mistaken version: statistics over the tokens (dim 1), per feature."""
    return (x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, unbiased=False, keepdim=True) + eps)


x_future = x.clone()
x_future[:, -1] += 10.0                                  # change only the LAST token
leak_feature = (ln(x_future)[:, :-1] - ln(x)[:, :-1]).abs().max().item()
leak_sequence = (norm_over_sequence(x_future)[:, :-1] - norm_over_sequence(x)[:, :-1]).abs().max().item()
print(f"change the last token; largest change in the outputs of the OTHER tokens:")
print(f"  normalised over the features (LayerNorm): {leak_feature:.2e}")
print(f"  normalised over the sequence            : {leak_sequence:.2e}")

x_padded = torch.cat([x, torch.zeros(B, 3, d)], dim=1)   # the same sequences with 3 padding tokens
pad_feature = (ln(x_padded)[:, :N] - ln(x)).abs().max().item()
pad_sequence = (norm_over_sequence(x_padded)[:, :N] - norm_over_sequence(x)).abs().max().item()
print("append 3 padding tokens; largest change in the real tokens' outputs:")
print(f"  normalised over the features (LayerNorm): {pad_feature:.2e}")
print(f"  normalised over the sequence            : {pad_sequence:.2e}")
glue("leak_sequence", leak_sequence, display=False)
glue("pad_sequence", pad_sequence, display=False)

# %% [markdown]
# With the real LayerNorm, no token's output depends on any other token: changing the
# last token or appending padding leaves the others exactly as they were. Normalised
# over the sequence, changing the last token moves every earlier token's output (by up
# to {glue:text}`leak_sequence:.2f` here): in a decoder, that is information flowing
# from the future into the past, which the causal mask was supposed to prevent. And
# three padding tokens shift the real tokens by up to {glue:text}`pad_sequence:.2f`, so the
# same sentence would be represented differently in batches padded to different
# lengths.
#
# ## 4. The position-wise feed-forward network
#
# Attention mixes information *between* tokens; on its own it only forms weighted
# averages of (projected) value vectors. The second sub-layer transforms each token
# *separately*, with the same two-layer network at every position:
#
# $$\mathrm{FFN}(x) = \max(0,\ x W_1 + b_1)\, W_2 + b_2, \qquad
# W_1 \in \mathbb{R}^{d_\text{model} \times d_\text{ff}},\ W_2 \in \mathbb{R}^{d_\text{ff} \times d_\text{model}} .$$
#
# Applied to $(B, N, d_\text{model})$, `nn.Linear` acts on the last dimension, so the
# network runs on every token at once: $(B, N, d_\text{model}) \to (B, N, d_\text{ff})
# \to (B, N, d_\text{model})$. "Position-wise" means no token sees another here.
#
# **Why $d_\text{ff} = 4\,d_\text{model}$?** The paper uses $d_\text{model} = 512$ and
# $d_\text{ff} = 2048$, and most models since keep the factor 4. There is no theorem
# behind it; it is a choice that worked, and it has a clear consequence: the network
# has $2\,d_\text{model}\,d_\text{ff} = 8\,d_\text{model}^2$ weights, twice the
# $4\,d_\text{model}^2$ of the attention sub-layer. Two thirds of an encoder layer's
# parameters, and of its arithmetic per token, are in the feed-forward network
# (Section 6 counts them). One useful reading (Geva et al., 2021) treats the
# $d_\text{ff}$ hidden units as a memory of key-value pairs: each row of $W_1$ is a
# pattern the token is compared with, the ReLU keeps the patterns that match, and the
# matching rows of $W_2$ are added to the token. The wider the layer, the more patterns
# it can store.
#
# **Dropout** (Srivastava et al., 2014) randomly zeroes a fraction $p$ of the values
# during training and scales the rest by $1/(1-p)$; in `eval()` mode it does nothing.
# The paper applies it ($p = 0.1$) to the output of every sub-layer before the residual
# sum, and to the sums of embeddings and positions; PyTorch also applies it inside the
# feed-forward network, after the ReLU, and so do we.
#
# ### Exercise: the feed-forward network

# %% [exercise FeedForward]
class FeedForward(nn.Module):
    """Position-wise feed-forward network: linear2(dropout(relu(linear1(x))))."""

    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        """Apply the same two-layer network to every position.

        Args:
            x: float tensor (..., d_model), usually (B, N, d_model).

        Returns:
            a tensor of the same shape and dtype as x:
            linear2(dropout(relu(linear1(x)))). Dropout comes after the ReLU,
            inside the network; in eval() mode it does nothing.
        """
        ### BEGIN SOLUTION
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))
        ### END SOLUTION


# %% [test test_FeedForward points=2]
"""FeedForward: linear2(dropout(relu(linear1(x)))), position by position, any leading dimensions; the input's
dtype kept, and no dropout in eval() mode."""
torch.manual_seed(0)
ff = FeedForward(d_model=6, d_ff=24)
ff_x = torch.randn(2, 5, 6)
ff_out = ff(ff_x)
assert isinstance(ff_out, torch.Tensor) and ff_out.shape == (2, 5, 6), \
    f"FeedForward maps (B, N, d_model) to (B, N, d_model) = (2, 5, 6); got {getattr(ff_out, 'shape', ff_out)}"
with torch.no_grad():
    ff_hidden = ff.linear1(ff_x)
    ff_expected = ff.linear2(torch.relu(ff_hidden))
    assert not torch.allclose(ff_out, ff.linear2(ff_hidden), atol=1e-5), \
        "ReLU missing: apply torch.relu between linear1 and linear2"
    assert not torch.allclose(ff_out, torch.relu(ff_expected), atol=1e-5), \
        "ReLU applied to the output too: the network ends with linear2, no activation after it"
    assert torch.allclose(ff_out, ff_expected, atol=1e-5), \
        "values differ from linear2(relu(linear1(x)))"
    ff_one = ff(ff_x[1:, 2:3])                              # one token on its own
assert torch.allclose(ff_one[0, 0], ff_out[1, 2], atol=1e-5), \
    "the network must act on each position separately: token (1, 2) alone gives a different result"
ff_drop = FeedForward(6, 24, dropout=0.5).eval()
ff_drop.load_state_dict(ff.state_dict())
assert torch.allclose(ff_drop(ff_x), ff_out, atol=1e-5), \
    "in eval() mode dropout must do nothing: use self.dropout (an nn.Dropout), not F.dropout with training=True"
ff64 = FeedForward(6, 24).double()
ff64.load_state_dict(ff.state_dict())
ff64_out = ff64(ff_x.double())
assert ff64_out.dtype == torch.float64 and torch.allclose(ff64_out, ff_out.double(), atol=1e-5), \
    f"a float64 network on a float64 input must return float64 (got {ff64_out.dtype}): do not convert x or the result"

# %% [markdown]
# ## 5. The encoder layer, post-LN and pre-LN
#
# An encoder layer is self-attention and the feed-forward network, each wrapped in a
# residual connection and a LayerNorm. Where the LayerNorm goes is the one real design
# choice. The paper normalises **after** the residual sum (**post-LN**):
#
# $$\begin{aligned}
# x &\leftarrow \mathrm{LN}_1\big(x + \mathrm{Dropout}(\mathrm{SelfAttn}(x))\big),\\
# x &\leftarrow \mathrm{LN}_2\big(x + \mathrm{Dropout}(\mathrm{FFN}(x))\big).
# \end{aligned}$$
#
# Most models since GPT-2 normalise the sub-layer's **input** instead (**pre-LN**), and
# leave the residual path untouched:
#
# $$\begin{aligned}
# x &\leftarrow x + \mathrm{Dropout}\big(\mathrm{SelfAttn}(\mathrm{LN}_1(x))\big),\\
# x &\leftarrow x + \mathrm{Dropout}\big(\mathrm{FFN}(\mathrm{LN}_2(x))\big).
# \end{aligned}$$
#
# Here $\mathrm{SelfAttn}(z)$ is `self_attn(z, z, z, mask)`: queries, keys and values
# all come from the same (normalised or not) input, and we keep only the output, not
# the weights. In post-LN every layer's output is normalised, so the residual stream
# is renormalised at every step and the gradient to the lower layers passes through
# every LayerNorm. In pre-LN the sum $x + \dots$ runs from the embeddings to the top
# without any normalisation on the way: an identity path, as in a ResNet. Xiong et
# al. (2020) showed that at initialisation the gradients of the post-LN layers near
# the output are large, which is why post-LN needs a *warm-up* of the learning rate;
# pre-LN trains without one. Section 13 measures this.
#
# The `mask` is passed to the attention. In the encoder it is a padding mask: real
# tokens must not attend to padding. Its shape is $(B, 1, 1, N)$ so that it broadcasts
# over the heads and over the queries.
#
# ### Exercise: the encoder layer
#
# Use the same `self.dropout` module for both sub-layers (dropout has no parameters).

# %% [exercise EncoderLayer]
class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each with a residual connection and a LayerNorm."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        """One encoder layer.

        Args:
            x: float tensor (B, N, d_model).
            mask: optional bool tensor broadcastable to (B, h, N, N), True = may
                attend; usually a padding mask of shape (B, 1, 1, N). Pass it to
                the self-attention.

        Returns:
            x after both sub-layers, (B, N, d_model), same dtype.
            Post-LN (norm_first False):
                x = norm1(x + dropout(attn(x))); x = norm2(x + dropout(ffn(x)))
            Pre-LN (norm_first True):
                x = x + dropout(attn(norm1(x))); x = x + dropout(ffn(norm2(x)))
            where attn(z) is the output (not the weights) of
            self.self_attn(z, z, z, mask).
        """
        ### BEGIN SOLUTION
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, mask)[0])
            x = x + self.dropout(self.ffn(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, mask)[0]))
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x
        ### END SOLUTION


# %% [markdown]
# :::{dropdown} Hint: keeping the two arrangements apart
# Write the two branches of an `if self.norm_first:` separately, each as two lines that
# follow the formulas above. In post-LN the LayerNorm is the *outermost* call of each
# line; in pre-LN it is the innermost, and the line starts with `x + ...`. A frequent
# slip in post-LN is `x + norm1(attn(x))`: that normalises the sub-layer's output, not
# the sum.
# :::

# %% [test test_EncoderLayer_post_ln points=2]
"""Post-LN (the default): x = norm1(x + attn(x)); x = norm2(x + ffn(x))."""
torch.manual_seed(1)
el = EncoderLayer(d_model=8, num_heads=2, d_ff=16)
# the specified network, not your FeedForward: this test checks EncoderLayer alone
el.ffn = nn.Sequential(el.ffn.linear1, nn.ReLU(), el.ffn.linear2)
with torch.no_grad():                                       # non-trivial LayerNorm parameters
    for el_norm in (el.norm1, el.norm2):
        el_norm.weight.uniform_(0.5, 1.5)
        el_norm.bias.uniform_(-0.5, 0.5)
el_x = torch.randn(2, 5, 8)
el_out = el(el_x)
assert isinstance(el_out, torch.Tensor) and el_out.shape == (2, 5, 8), \
    f"an encoder layer maps (B, N, d_model) to the same shape (2, 5, 8); got {getattr(el_out, 'shape', el_out)}"
with torch.no_grad():
    el_a = el.self_attn(el_x, el_x, el_x)[0]
    el_h = el.norm1(el_x + el_a)
    el_expected = el.norm2(el_h + el.ffn(el_h))
    assert not torch.allclose(el_out, el_x + el.norm1(el_a) + el.norm2(el.ffn(el_x + el.norm1(el_a))), atol=1e-4), \
        "norm before the residual sum: post-LN normalises the sum, norm1(x + attn(x)), not the sub-layer's output"
    el_pre_h = el_x + el.self_attn(el.norm1(el_x), el.norm1(el_x), el.norm1(el_x))[0]
    assert not torch.allclose(el_out, el_pre_h + el.ffn(el.norm2(el_pre_h)), atol=1e-4), \
        "this is pre-LN: with norm_first=False (the default) the layer is post-LN, norm1(x + attn(x))"
    assert torch.allclose(el_out, el_expected, atol=1e-4), \
        "post-LN output differs from norm2(h + ffn(h)) with h = norm1(x + self_attn(x, x, x)[0])"

# %% [test test_EncoderLayer_pre_ln points=1]
"""Pre-LN (norm_first=True): x = x + attn(norm1(x)); x = x + ffn(norm2(x))."""
torch.manual_seed(2)
ep = EncoderLayer(d_model=8, num_heads=2, d_ff=16, norm_first=True)
# the specified network, not your FeedForward: this test checks EncoderLayer alone
ep.ffn = nn.Sequential(ep.ffn.linear1, nn.ReLU(), ep.ffn.linear2)
with torch.no_grad():
    for ep_norm in (ep.norm1, ep.norm2):
        ep_norm.weight.uniform_(0.5, 1.5)
        ep_norm.bias.uniform_(-0.5, 0.5)
ep_x = torch.randn(2, 4, 8)
ep_out = ep(ep_x)
with torch.no_grad():
    ep_n = ep.norm1(ep_x)
    ep_h = ep_x + ep.self_attn(ep_n, ep_n, ep_n)[0]
    ep_expected = ep_h + ep.ffn(ep.norm2(ep_h))
    ep_post_h = ep.norm1(ep_x + ep.self_attn(ep_x, ep_x, ep_x)[0])
    assert not torch.allclose(ep_out, ep.norm2(ep_post_h + ep.ffn(ep_post_h)), atol=1e-4), \
        "norm_first ignored: with norm_first=True the layer must be pre-LN"
    assert torch.allclose(ep_out, ep_expected, atol=1e-4), \
        "pre-LN output differs from h + ffn(norm2(h)) with h = x + self_attn(norm1(x), norm1(x), norm1(x))[0]"

# %% [test test_EncoderLayer_mask points=1]
"""The mask reaches the self-attention: padded tokens do not change the real tokens' outputs."""
torch.manual_seed(3)
for em_first in (False, True):
    em = EncoderLayer(d_model=8, num_heads=2, d_ff=16, norm_first=em_first)
    # the specified network, not your FeedForward: this test checks EncoderLayer alone
    em.ffn = nn.Sequential(em.ffn.linear1, nn.ReLU(), em.ffn.linear2)
    em_x = torch.randn(2, 6, 8)
    em_mask = (torch.arange(6) < torch.tensor([6, 3])[:, None])[:, None, None, :]   # (B, 1, 1, N)
    em_out = em(em_x, em_mask)
    em_x2 = em_x.clone()
    em_x2[1, 3:] = torch.randn(3, 8)                            # change only sequence 1's padding
    em_out2 = em(em_x2, em_mask)
    assert torch.allclose(em_out[1, :3], em_out2[1, :3], atol=1e-5), \
        f"mask not passed down (norm_first={em_first}): the real tokens of sequence 1 changed when only its padding did; call self.self_attn(..., mask)"
    assert not torch.isnan(em_out).any(), "NaN in the output: is the mask polarity inverted? True means MAY attend"

# %% [markdown]
# ## 6. The decoder layer
#
# The decoder layer has three sub-layers. With $x$ the decoder's sequence
# $(B, N_\text{tgt}, d_\text{model})$ and $m$ the memory $(B, N_\text{src}, d_\text{model})$,
# post-LN reads
#
# $$\begin{aligned}
# x &\leftarrow \mathrm{LN}_1\big(x + \mathrm{Dropout}(\mathrm{MHA}_\text{self}(x, x, x;\ M_\text{tgt}))\big),\\
# x &\leftarrow \mathrm{LN}_2\big(x + \mathrm{Dropout}(\mathrm{MHA}_\text{cross}(x, m, m;\ M_\text{mem}))\big),\\
# x &\leftarrow \mathrm{LN}_3\big(x + \mathrm{Dropout}(\mathrm{FFN}(x))\big),
# \end{aligned}$$
#
# and pre-LN, as before, moves each LayerNorm onto the sub-layer's input:
# $x \leftarrow x + \mathrm{MHA}_\text{self}(\mathrm{LN}_1(x), \dots)$, then
# $x \leftarrow x + \mathrm{MHA}_\text{cross}(\mathrm{LN}_2(x), m, m)$, then
# $x \leftarrow x + \mathrm{FFN}(\mathrm{LN}_3(x))$. The memory is used as it is.
#
# - **Masked self-attention.** During training the decoder sees the whole target at
#   once (Section 10), so token $i$ must be kept from attending to tokens $j > i$:
#   the causal mask $M_\text{tgt}$ of shape $(N_\text{tgt}, N_\text{tgt})$, True on and
#   below the diagonal, possibly combined with a padding mask.
# - **Cross-attention.** The queries come from the decoder ($N_\text{tgt}$ of them),
#   the keys and values from the memory ($N_\text{src}$ of them), so the weights have
#   shape $(B, h, N_\text{tgt}, N_\text{src})$: for each target position, a distribution
#   over the source tokens. $M_\text{mem}$ hides the source padding; shaped
#   $(B, 1, 1, N_\text{src})$, it broadcasts over heads and target positions.
#
# ### Exercise: the decoder layer

# %% [exercise DecoderLayer]
class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention and feed-forward, each with residual and LayerNorm."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        """One decoder layer.

        Args:
            x: float tensor (B, N_tgt, d_model), the decoder's sequence.
            memory: float tensor (B, N_src, d_model), the encoder's output.
            tgt_mask: optional bool mask for the self-attention, broadcastable to
                (B, h, N_tgt, N_tgt), True = may attend (usually causal).
            memory_mask: optional bool mask for the cross-attention,
                broadcastable to (B, h, N_tgt, N_src) (usually (B, 1, 1, N_src)).

        Returns:
            x after the three sub-layers, (B, N_tgt, d_model):
            self_attn(x, x, x, tgt_mask), then cross_attn(x, memory, memory,
            memory_mask) (queries from x, keys and values from memory), then
            ffn, each with dropout, residual and norm1 / norm2 / norm3, post-LN
            by default and pre-LN when self.norm_first (as in EncoderLayer;
            memory itself is never normalised here).
        """
        ### BEGIN SOLUTION
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.dropout(self.self_attn(h, h, h, tgt_mask)[0])
            x = x + self.dropout(self.cross_attn(self.norm2(x), memory, memory, memory_mask)[0])
            x = x + self.dropout(self.ffn(self.norm3(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, x, x, tgt_mask)[0]))
            x = self.norm2(x + self.dropout(self.cross_attn(x, memory, memory, memory_mask)[0]))
            x = self.norm3(x + self.dropout(self.ffn(x)))
        return x
        ### END SOLUTION


# %% [test test_DecoderLayer_post_ln points=1]
"""Post-LN decoder layer: self-attention, cross-attention to memory, feed-forward, each Add & Norm."""
torch.manual_seed(4)
dl = DecoderLayer(d_model=8, num_heads=2, d_ff=16)
# the specified network, not your FeedForward: this test checks DecoderLayer alone
dl.ffn = nn.Sequential(dl.ffn.linear1, nn.ReLU(), dl.ffn.linear2)
with torch.no_grad():
    for dl_norm in (dl.norm1, dl.norm2, dl.norm3):
        dl_norm.weight.uniform_(0.5, 1.5)
        dl_norm.bias.uniform_(-0.5, 0.5)
dl_x, dl_mem = torch.randn(2, 4, 8), torch.randn(2, 6, 8)
dl_out = dl(dl_x, dl_mem)
assert isinstance(dl_out, torch.Tensor) and dl_out.shape == (2, 4, 8), \
    f"a decoder layer returns (B, N_tgt, d_model) = (2, 4, 8); got {getattr(dl_out, 'shape', dl_out)}"
with torch.no_grad():
    dl_h = dl.norm1(dl_x + dl.self_attn(dl_x, dl_x, dl_x)[0])
    dl_self = dl.norm2(dl_h + dl.cross_attn(dl_h, dl_h, dl_h)[0])
    assert not torch.allclose(dl_out, dl.norm3(dl_self + dl.ffn(dl_self)), atol=1e-4), \
        "cross-attention keys and values taken from the decoder input: use cross_attn(x, memory, memory, ...)"
    dl_h2 = dl.norm2(dl_h + dl.cross_attn(dl_h, dl_mem, dl_mem)[0])
    assert torch.allclose(dl_out, dl.norm3(dl_h2 + dl.ffn(dl_h2)), atol=1e-4), \
        "post-LN decoder output differs from norm3(h2 + ffn(h2)), h2 = norm2(h1 + cross_attn(h1, memory, memory)), h1 = norm1(x + self_attn(x, x, x))"

# %% [test test_DecoderLayer_pre_ln points=1]
"""Pre-LN decoder layer (norm_first=True): each sub-layer reads its LayerNorm'ed input."""
torch.manual_seed(5)
dp = DecoderLayer(d_model=8, num_heads=4, d_ff=16, norm_first=True)
# the specified network, not your FeedForward: this test checks DecoderLayer alone
dp.ffn = nn.Sequential(dp.ffn.linear1, nn.ReLU(), dp.ffn.linear2)
with torch.no_grad():
    for dp_norm in (dp.norm1, dp.norm2, dp.norm3):
        dp_norm.weight.uniform_(0.5, 1.5)
        dp_norm.bias.uniform_(-0.5, 0.5)
dp_x, dp_mem = torch.randn(1, 3, 8), torch.randn(1, 5, 8)
dp_out = dp(dp_x, dp_mem)
with torch.no_grad():
    dp_n = dp.norm1(dp_x)
    dp_h = dp_x + dp.self_attn(dp_n, dp_n, dp_n)[0]
    dp_h = dp_h + dp.cross_attn(dp.norm2(dp_h), dp_mem, dp_mem)[0]
    dp_expected = dp_h + dp.ffn(dp.norm3(dp_h))
    dp_p = dp.norm1(dp_x + dp.self_attn(dp_x, dp_x, dp_x)[0])
    dp_p = dp.norm2(dp_p + dp.cross_attn(dp_p, dp_mem, dp_mem)[0])
    assert not torch.allclose(dp_out, dp.norm3(dp_p + dp.ffn(dp_p)), atol=1e-4), \
        "norm_first ignored: with norm_first=True the decoder layer must be pre-LN"
assert torch.allclose(dp_out, dp_expected, atol=1e-4), \
    "pre-LN decoder output differs: with norm_first=True, x = x + self_attn(norm1(x)...), x = x + cross_attn(norm2(x), memory, memory), x = x + ffn(norm3(x)); is norm_first ignored?"

# %% [test test_DecoderLayer_masks points=2]
"""tgt_mask goes to the self-attention, memory_mask to the cross-attention."""
torch.manual_seed(6)
for dm_first in (False, True):
    dm = DecoderLayer(d_model=8, num_heads=2, d_ff=16, norm_first=dm_first)
    # the specified network, not your FeedForward: this test checks DecoderLayer alone
    dm.ffn = nn.Sequential(dm.ffn.linear1, nn.ReLU(), dm.ffn.linear2)
    dm_x, dm_mem = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    dm_causal = torch.ones(5, 5, dtype=torch.bool).tril()
    dm_pad = (torch.arange(4) < torch.tensor([4, 2])[:, None])[:, None, None, :]   # (B, 1, 1, N_src)
    dm_out = dm(dm_x, dm_mem, dm_causal, dm_pad)
    dm_x2 = dm_x.clone()
    dm_x2[:, 3:] = torch.randn(2, 2, 8)                           # change the future targets
    assert torch.allclose(dm_out[:, :3], dm(dm_x2, dm_mem, dm_causal, dm_pad)[:, :3], atol=1e-5), \
        f"tgt_mask not passed down (norm_first={dm_first}): position 2 changed when only positions 3 and 4 did; call self.self_attn(..., tgt_mask)"
    dm_mem2 = dm_mem.clone()
    dm_mem2[1, 2:] = torch.randn(2, 8)                            # change sequence 1's source padding
    assert torch.allclose(dm_out[1], dm(dm_x, dm_mem2, dm_causal, dm_pad)[1], atol=1e-5), \
        f"memory_mask not passed down (norm_first={dm_first}): padded source positions changed the output; call self.cross_attn(..., memory_mask)"

# %% [markdown]
# ## 7. Proof by weight copy: the same layers as PyTorch's
#
# PyTorch ships both layers: `nn.TransformerEncoderLayer` and
# `nn.TransformerDecoderLayer`. If ours compute the same function, then copying our
# weights into theirs must give the same outputs, for both arrangements of the
# LayerNorm. Their parameters are named differently: the attention projections are
# stacked in `in_proj_weight` (Chapter 3), the feed-forward layers are `linear1` and
# `linear2` (as ours), and the decoder's cross-attention is `multihead_attn`. We use
# `batch_first=True` (their default is `(N, B, d)`), ReLU (their default), and masks
# inverted with `~`, because their boolean masks mean "do **not** attend".

# %%
def copy_attention(ours, theirs):
    """Our MultiHeadAttention's weights into an nn.MultiheadAttention."""
    theirs.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
    theirs.out_proj.weight.copy_(ours.W_o.weight)
    theirs.out_proj.bias.copy_(ours.W_o.bias)


def copy_common(ours, theirs, norms):
    for a, b in [(ours.ffn.linear1, theirs.linear1), (ours.ffn.linear2, theirs.linear2)] + norms:
        b.weight.copy_(a.weight)
        b.bias.copy_(a.bias)


def torch_encoder_layer(ours, d_model, num_heads, d_ff):
    theirs = nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, batch_first=True,
                                        norm_first=ours.norm_first)
    with torch.no_grad():
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_common(ours, theirs, [(ours.norm1, theirs.norm1), (ours.norm2, theirs.norm2)])
    return theirs.eval()


def torch_decoder_layer(ours, d_model, num_heads, d_ff):
    theirs = nn.TransformerDecoderLayer(d_model, num_heads, d_ff, dropout=0.0, batch_first=True,
                                        norm_first=ours.norm_first)
    with torch.no_grad():
        copy_attention(ours.self_attn, theirs.self_attn)
        copy_attention(ours.cross_attn, theirs.multihead_attn)
        copy_common(ours, theirs, [(ours.norm1, theirs.norm1), (ours.norm2, theirs.norm2),
                                   (ours.norm3, theirs.norm3)])
    return theirs.eval()


torch.manual_seed(0)
d_model, num_heads, d_ff, B, N_src, N_tgt = 32, 4, 128, 3, 7, 5
src_x, tgt_x = torch.randn(B, N_src, d_model), torch.randn(B, N_tgt, d_model)
keep_src = torch.arange(N_src)[None, :] < torch.tensor([7, 5, 3])[:, None]     # (B, N_src), True = real token
causal = torch.ones(N_tgt, N_tgt, dtype=torch.bool).tril()
equivalence = {}
for norm_first in (False, True):
    enc = EncoderLayer(d_model, num_heads, d_ff, norm_first=norm_first).eval()
    dec = DecoderLayer(d_model, num_heads, d_ff, norm_first=norm_first).eval()
    with torch.no_grad():
        for p in [*enc.parameters(), *dec.parameters()]:     # LayerNorms away from their defaults too
            p.add_(0.1 * torch.randn_like(p))
        memory = enc(src_x, keep_src[:, None, None, :])
        memory_t = torch_encoder_layer(enc, d_model, num_heads, d_ff)(src_x, src_key_padding_mask=~keep_src)
        # compare real tokens only: PyTorch may leave padded positions' outputs unspecified
        enc_err = (memory - memory_t)[keep_src].abs().max().item()
        out = dec(tgt_x, memory, causal, keep_src[:, None, None, :])
        out_t = torch_decoder_layer(dec, d_model, num_heads, d_ff)(
            tgt_x, memory, tgt_mask=~causal, memory_key_padding_mask=~keep_src)
        dec_err = (out - out_t).abs().max().item()
    equivalence[norm_first] = (enc_err, dec_err)
    print(f"norm_first={norm_first!s:5}  max |ours - torch|: encoder layer {enc_err:.1e}, decoder layer {dec_err:.1e}")
glue("equiv_max", max(max(v) for v in equivalence.values()), display=False)

# %% [markdown]
# The largest difference over both layers and both settings is
# {glue:text}`equiv_max:.1e`, float32 rounding: your layers compute PyTorch's layers,
# with padding masks, a causal mask and cross-attention. From here on the course may use
# `nn.TransformerEncoderLayer` and `nn.TransformerDecoderLayer` in given code.
#
# **Where the parameters are.** Counting them per component, for the sizes of the base
# model of the paper ($d_\text{model} = 512$, $h = 8$, $d_\text{ff} = 2048$, 6 layers
# each side, vocabulary 37,000 shared between source and target):

# %%
def count(module):
    return sum(p.numel() for p in module.parameters())


base = dict(d_model=512, num_heads=8, d_ff=2048)
enc_base, dec_base = EncoderLayer(**base), DecoderLayer(**base)
rows = [("encoder layer: self-attention", count(enc_base.self_attn)),
        ("encoder layer: feed-forward", count(enc_base.ffn)),
        ("encoder layer: 2 LayerNorms", count(enc_base.norm1) + count(enc_base.norm2)),
        ("decoder layer: self-attention", count(dec_base.self_attn)),
        ("decoder layer: cross-attention", count(dec_base.cross_attn)),
        ("decoder layer: feed-forward", count(dec_base.ffn)),
        ("decoder layer: 3 LayerNorms", 3 * count(dec_base.norm1))]
for name, n in rows:
    print(f"{pad_to(name, 32)} {n:>10,d}")
vocab = 37_000
stack = 6 * count(enc_base) + 6 * count(dec_base)
embeddings = vocab * 512                      # the paper shares one matrix for both embeddings and the output
print(f"{pad_to('6 + 6 layers', 32)} {stack:>10,d}")
print(f"{pad_to('one shared embedding matrix', 32)} {embeddings:>10,d}")
print(f"{pad_to('total (with an output bias)', 32)} {stack + embeddings + vocab:>10,d}")
print(f"feed-forward share of an encoder layer: {count(enc_base.ffn) / count(enc_base):.1%}")
glue("ffn_share", 100 * count(enc_base.ffn) / count(enc_base), display=False)
glue("base_total", (stack + embeddings + vocab) / 1e6, display=False)

# %% [markdown]
# An attention sub-layer holds $4(d_\text{model}^2 + d_\text{model})$ parameters, the
# feed-forward network $2\,d_\text{model} d_\text{ff} + d_\text{ff} + d_\text{model}$, a
# LayerNorm $2\,d_\text{model}$. The feed-forward network is
# {glue:text}`ffn_share:.1f`% of an encoder layer, and a decoder layer has one more
# attention sub-layer. The whole base model comes to {glue:text}`base_total:.0f`
# million parameters, close to the 65 million the paper reports (its exact count
# depends on the shared vocabulary's size).
#
# ## 8. The whole model
#
# The `Transformer` class holds the two embeddings, the table of sinusoidal
# positions (a *buffer*: saved with the model but not trained), the two stacks of
# layers and the output layer. Three methods use them:
#
# - `encode(src, src_mask)`: $X_0 = \mathrm{Embed}_\text{src}(src)\sqrt{d_\text{model}} + PE_{[0:N_\text{src}]}$,
#   then $X_\ell = \mathrm{EncoderLayer}_\ell(X_{\ell-1}, M_\text{src})$; returns the
#   memory $X_L$, $(B, N_\text{src}, d_\text{model})$.
# - `decode(tgt, memory, src_mask, tgt_mask)`: the same with the target embedding, and
#   decoder layers that receive the memory, $M_\text{tgt}$ for their self-attention
#   and the **source** mask as their `memory_mask`; returns $(B, N_\text{tgt}, d_\text{model})$.
# - `forward(src, tgt, src_mask, tgt_mask)`: `out(decode(tgt, encode(src, src_mask), ...))`,
#   the logits $(B, N_\text{tgt}, V_\text{tgt})$. No softmax: the loss takes logits.
#
# **Why multiply the embeddings by $\sqrt{d_\text{model}}$?** The paper does it
# without comment, and it specifies no initialisation. The authors' code,
# tensor2tensor (Vaswani et al., 2018), draws an embedding matrix's entries with
# standard deviation $d_\text{model}^{-1/2}$ (so that, shared with the output layer, it
# gives logits of a sensible size), and with that the factor makes sense: a token's
# vector then has a norm of about 1, while the position vector $PE_{pos}$ has a norm of
# $\sqrt{d_\text{model}/2}$ (half its entries are sines, half cosines, and
# $\sin^2 + \cos^2 = 1$). The factor brings the token to the positions' scale, so that
# neither drowns the other. PyTorch's `nn.Embedding` initialises with entries of size 1
# instead: multiplied by $\sqrt{d_\text{model}}$ the tokens are then
# $\sqrt{d_\text{model}}$ times *larger* than the positions, and the model has trouble
# telling positions apart. Our training code therefore initialises the embeddings as
# tensor2tensor does (Section 10). (How much this matters for our small models is not
# measured here: one of the challenges at the end.)
#
# The spec of this course is the paper's model with nothing added: no LayerNorm after
# either stack (PyTorch's `nn.Transformer` adds one, which pre-LN models need; Chapter
# 7's GPT-2 has one too), and one dropout on the sum of embeddings and positions, which
# `__init__` provides as `self.dropout`.
#
# ### Exercise: the Transformer
#
# Write the three methods: `decode` mirrors `encode`, and `forward` is one line on top
# of the two.

# %% [exercise Transformer]
class Transformer(nn.Module):
    """Encoder-decoder Transformer (post-LN, as in the paper)."""

    def __init__(self, src_vocab, tgt_vocab, d_model, num_heads, num_layers, d_ff, max_len=512, dropout=0.0):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model))   # (max_len, d_model)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout) for _ in range(num_layers))
        self.out = nn.Linear(d_model, tgt_vocab)
        self.dropout = nn.Dropout(dropout)   # on embeddings + positions, as in the paper

    def encode(self, src, src_mask=None):
        """src: long (B, N_src) token ids; src_mask: optional bool, broadcastable to
        (B, h, N_src, N_src), True = may attend (usually (B, 1, 1, N_src)).

        Embed (src_embed), multiply by sqrt(d_model), add self.pe[:N_src], apply
        self.dropout, then every encoder layer in order with src_mask.
        Returns the memory (B, N_src, d_model). No LayerNorm after the stack.
        """
        ### BEGIN SOLUTION
        x = self.src_embed(src) * math.sqrt(self.d_model) + self.pe[:src.size(1)]   # (B, N_src, d_model)
        x = self.dropout(x)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return x
        ### END SOLUTION

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        """tgt: long (B, N_tgt); memory: (B, N_src, d_model); src_mask: the source mask
        (each decoder layer's memory_mask); tgt_mask: optional bool mask for the decoder
        self-attention, broadcastable to (B, h, N_tgt, N_tgt).

        Embed (tgt_embed), multiply by sqrt(d_model), add self.pe[:N_tgt], dropout, then
        every decoder layer in order: layer(x, memory, tgt_mask, src_mask).
        Returns the hidden states (B, N_tgt, d_model), not the logits.
        """
        ### BEGIN SOLUTION
        x = self.tgt_embed(tgt) * math.sqrt(self.d_model) + self.pe[:tgt.size(1)]   # (B, N_tgt, d_model)
        x = self.dropout(x)
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_mask, src_mask)
        return x
        ### END SOLUTION

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        """Logits (B, N_tgt, tgt_vocab) = self.out(decode(tgt, encode(src, src_mask),
        src_mask, tgt_mask)). No softmax."""
        ### BEGIN SOLUTION
        memory = self.encode(src, src_mask)
        return self.out(self.decode(tgt, memory, src_mask, tgt_mask))
        ### END SOLUTION


# %% [markdown]
# The tests of `Transformer` and `greedy_decode` below run on simple stand-in layers
# (given here; they are not the paper's layers), so that each checks only its own
# exercise: a mistake in your `EncoderLayer` or `DecoderLayer` shows in their tests, not
# here.

# %% [export]
class StandInEncoderLayer(nn.Module):
    """EncoderLayer's interface, a simpler computation: x -> tanh(x + self_attn(x, x, x, mask))."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)

    def forward(self, x, mask=None):
        return torch.tanh(x + self.self_attn(x, x, x, mask)[0])


class StandInDecoderLayer(nn.Module):
    """DecoderLayer's interface: masked self-attention, then cross-attention to memory, no norms."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads)
        self.cross_attn = MultiHeadAttention(d_model, num_heads)

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = x + self.self_attn(x, x, x, tgt_mask)[0]
        return torch.tanh(x + self.cross_attn(x, memory, memory, memory_mask)[0])


def with_stand_in_layers(model):
    """The Transformer `model` with each of its layers replaced by a stand-in of the same width."""
    d_model, num_heads = model.d_model, model.encoder_layers[0].self_attn.num_heads
    model.encoder_layers = nn.ModuleList(StandInEncoderLayer(d_model, num_heads) for _ in model.encoder_layers)
    model.decoder_layers = nn.ModuleList(StandInDecoderLayer(d_model, num_heads) for _ in model.decoder_layers)
    return model


# %% [test test_Transformer_encode points=1]
"""encode: embeddings * sqrt(d_model) + pe[:N], then the encoder layers with src_mask."""
torch.manual_seed(7)
tm = with_stand_in_layers(Transformer(src_vocab=11, tgt_vocab=9, d_model=16, num_heads=4, num_layers=2,
                                       d_ff=32, max_len=20))
tm_src = torch.randint(0, 11, (2, 6))
tm_mem = tm.encode(tm_src)
assert isinstance(tm_mem, torch.Tensor) and tm_mem.shape == (2, 6, 16), \
    f"encode returns the memory (B, N_src, d_model) = (2, 6, 16); got {getattr(tm_mem, 'shape', tm_mem)}"
with torch.no_grad():
    def tm_stack(x, layers, *args):
        for layer in layers:
            x = layer(x, *args)
        return x
    tm_emb = tm.src_embed(tm_src)
    assert not torch.allclose(tm_mem, tm_stack(tm_emb + tm.pe[:6], tm.encoder_layers), atol=1e-4), \
        "embeddings not scaled by sqrt(d_model): x = src_embed(src) * sqrt(d_model) + pe[:N]"
    assert not torch.allclose(tm_mem, tm_stack(tm_emb * 4.0, tm.encoder_layers), atol=1e-4), \
        "positional encoding missing: add self.pe[:N_src] to the scaled embeddings"
    tm_expected = tm_stack(tm_emb * 4.0 + tm.pe[:6], tm.encoder_layers)
    assert not torch.allclose(tm_mem, F.layer_norm(tm_expected, (16,)), atol=1e-4), \
        "extra final norm: the course's Transformer has no LayerNorm after the encoder stack"
    assert torch.allclose(tm_mem, tm_expected, atol=1e-4), \
        "memory differs from the encoder layers applied in order to src_embed(src) * sqrt(d_model) + pe[:N_src]"
tm_keep = (torch.arange(6) < torch.tensor([6, 4])[:, None])[:, None, None, :]
tm_src2 = tm_src.clone()
tm_src2[1, 4:] = (tm_src2[1, 4:] + 1) % 11                    # change sequence 1's padding
assert torch.allclose(tm.encode(tm_src, tm_keep)[1, :4], tm.encode(tm_src2, tm_keep)[1, :4], atol=1e-5), \
    "src_mask not passed down: pass it to every encoder layer"

# %% [test test_Transformer_decode points=1]
"""decode: target embeddings, then decoder layers with memory, tgt_mask and src_mask."""
torch.manual_seed(7)
tm = with_stand_in_layers(Transformer(src_vocab=11, tgt_vocab=9, d_model=16, num_heads=4, num_layers=2,
                                       d_ff=32, max_len=20))
tm_mem = torch.randn(2, 6, 16)                               # any memory: decode does not need encode
tm_keep = (torch.arange(6) < torch.tensor([6, 4])[:, None])[:, None, None, :]
tm_tgt = torch.randint(0, 9, (2, 5))
tm_causal = torch.ones(5, 5, dtype=torch.bool).tril()
tm_hidden = tm.decode(tm_tgt, tm_mem, tm_keep, tm_causal)
assert isinstance(tm_hidden, torch.Tensor) and tm_hidden.shape == (2, 5, 16), \
    f"decode returns hidden states (B, N_tgt, d_model) = (2, 5, 16), not logits; got {getattr(tm_hidden, 'shape', tm_hidden)}"
with torch.no_grad():
    def tm_stack(x, layers, *args):
        for layer in layers:
            x = layer(x, *args)
        return x
    tm_y = tm.tgt_embed(tm_tgt) * 4.0 + tm.pe[:5]
    assert not torch.allclose(tm_hidden, tm_stack(tm.src_embed(tm_tgt) * 4.0 + tm.pe[:5], tm.decoder_layers,
                                                  tm_mem, tm_causal, tm_keep), atol=1e-4), \
        "decode must embed the target with tgt_embed, not src_embed"
    assert torch.allclose(tm_hidden, tm_stack(tm_y, tm.decoder_layers, tm_mem, tm_causal, tm_keep), atol=1e-4), \
        "hidden states differ from the decoder layers applied in order to tgt_embed(tgt) * sqrt(d_model) + pe[:N_tgt], each called as layer(x, memory, tgt_mask, src_mask)"

# %% [test test_Transformer_forward points=1]
"""forward: logits = out(decode(tgt, encode(src, src_mask), src_mask, tgt_mask)), no softmax."""
torch.manual_seed(7)
tm = with_stand_in_layers(Transformer(src_vocab=11, tgt_vocab=9, d_model=16, num_heads=4, num_layers=2,
                                       d_ff=32, max_len=20))
tm_src, tm_tgt = torch.randint(0, 11, (2, 6)), torch.randint(0, 9, (2, 5))
tm_keep = (torch.arange(6) < torch.tensor([6, 4])[:, None])[:, None, None, :]
tm_causal = torch.ones(5, 5, dtype=torch.bool).tril()
tm_logits = tm(tm_src, tm_tgt, tm_keep, tm_causal)
assert isinstance(tm_logits, torch.Tensor) and tm_logits.shape == (2, 5, 9), \
    f"forward returns logits (B, N_tgt, tgt_vocab) = (2, 5, 9); got {getattr(tm_logits, 'shape', tm_logits)}"
with torch.no_grad():
    tm_expected_logits = tm.out(tm.decode(tm_tgt, tm.encode(tm_src, tm_keep), tm_keep, tm_causal))
assert not torch.allclose(tm_logits.exp().sum(-1), torch.ones(2, 5), atol=1e-3), \
    "forward returns logits, not probabilities: no softmax (the loss applies it)"
assert torch.allclose(tm_logits, tm_expected_logits, atol=1e-4), \
    "logits differ from out(decode(tgt, encode(src, src_mask), src_mask, tgt_mask))"
tm_tgt2 = tm_tgt.clone()
tm_tgt2[:, 3:] = (tm_tgt2[:, 3:] + 1) % 9
assert torch.allclose(tm_logits[:, :3], tm(tm_src, tm_tgt2, tm_keep, tm_causal)[:, :3], atol=1e-5), \
    "tgt_mask not passed down: with a causal mask, logits at positions 0..2 must not depend on later targets"

# %% [markdown]
# ## 9. Greedy decoding
#
# At inference time there is no target to feed in: the decoder must consume its own
# output. Greedy decoding starts every row with the start token `bos_id` and repeats:
# run the decoder on the tokens so far (with a causal mask, as in training), take the
# logits of the **last** position, append their argmax. The encoder runs only once:
# the memory does not change while the target grows.
#
# $$y_0 = \texttt{bos}, \qquad y_{t} = \arg\max_{v}\ \big[\mathrm{out}(\mathrm{decode}(y_{0..t-1}, m))\big]_{t-1,\ v} .$$
#
# In a batch, rows finish at different steps. Decoding stops when *every* row has
# produced `eos_id` at least once, or after `max_len` new tokens. What a row holds
# after its first `eos_id` does not matter (the caller cuts it there), so you may keep
# appending the argmax, or write `eos_id` there, as you like.
#
# Each step re-runs the decoder on the whole prefix, so writing $m$ tokens costs
# $O(m^2)$ decoder positions. Chapter 7 removes that waste with a cache of keys and
# values; here the sequences are short.
#
# ### Exercise: greedy decoding

# %% [exercise greedy_decode]
def greedy_decode(model, src, max_len, bos_id, eos_id, src_mask=None):
    """Greedy decoding with a trained Transformer, for a whole batch.

    Args:
        model: a Transformer; use only model.encode (once, before the loop: the
            memory does not change), model.decode and model.out.
        src: long (B, N_src) source ids.
        max_len: the largest number of tokens to generate after bos_id.
        bos_id, eos_id: the start and end token ids (ints).
        src_mask: optional bool source mask, as for model.encode.

    Returns:
        a long tensor (B, L) with L <= max_len + 1: column 0 is bos_id, and each
        next column holds, for every row, the argmax of the logits at the LAST
        position of model.out(model.decode(tokens so far, memory, src_mask,
        causal mask)). Stop as soon as every row has produced eos_id (then L is
        the number of steps taken + 1), else after max_len steps. What a row
        holds after its first eos_id is not graded.
    """
    ### BEGIN SOLUTION
    memory = model.encode(src, src_mask)                                   # (B, N_src, d_model), once
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)   # (B, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        n = ys.size(1)
        causal = torch.ones(n, n, dtype=torch.bool, device=src.device).tril()
        logits = model.out(model.decode(ys, memory, src_mask, causal)[:, -1])   # (B, V): last position
        next_token = logits.argmax(dim=-1)                                 # (B,)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return ys
    ### END SOLUTION


# %% [markdown]
# :::{dropdown} Hint: the loop
# Keep a boolean vector `finished` of shape `(B,)`, all False at first. At each step,
# `logits = model.out(model.decode(ys, memory, src_mask, causal))[:, -1]` has shape
# `(B, V)`; its argmax over the last dimension is the next token of every row. Append
# it with `torch.cat([ys, next_token[:, None]], dim=1)`, update
# `finished |= next_token == eos_id`, and `break` when `finished.all()`.
# :::

# %% [test test_greedy_decode points=3]
"""greedy_decode: bos first, then the argmax of the last position (causal tgt_mask), until every row has
produced eos_id or after max_len tokens; it encodes once and uses only encode, decode and out."""
class GreedyStandIn(nn.Module):
    """A stand-in for a trained Transformer, so that this test checks greedy_decode alone; it notes its calls."""

    def __init__(self):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(7, 16), nn.Embedding(6, 16)
        self.pe = sinusoidal_encoding(20, 16)
        self.layer = StandInDecoderLayer(16, 2)
        self.out = nn.Linear(16, 6)
        self.encoded_rows, self.tgt_masks = 0, []

    def encode(self, src, src_mask=None):
        self.encoded_rows += src.size(0)
        return self.src_embed(src)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None):
        self.tgt_masks.append((tgt.size(1), tgt_mask))
        return self.layer(self.tgt_embed(tgt) + self.pe[:tgt.size(1)], memory, tgt_mask, src_mask)

    def forward(self, *args, **kwargs):
        raise AssertionError("greedy_decode called model(...), its forward, which encodes the source again at "
                             "every step: call model.encode once, then only model.decode and model.out")


torch.manual_seed(8)
gd_model = GreedyStandIn().eval()
gd_src = torch.randint(0, 7, (3, 5))
with torch.no_grad():
    gd_out = greedy_decode(gd_model, gd_src, max_len=6, bos_id=1, eos_id=99)   # eos never produced
assert isinstance(gd_out, torch.Tensor) and gd_out.dtype == torch.long, \
    f"greedy_decode returns a long tensor of token ids; got {getattr(gd_out, 'dtype', type(gd_out))}"
assert gd_out.shape == (3, 7), \
    f"with no eos, decoding runs max_len=6 steps: shape (B, max_len + 1) = (3, 7) with bos in column 0; got {tuple(gd_out.shape)}"
assert (gd_out[:, 0] == 1).all(), "column 0 must be bos_id: the output starts with the start token"
assert gd_model.encoded_rows == 3, \
    f"the encoder ran on {gd_model.encoded_rows} source rows for a batch of 3: call model.encode once, before the loop"
for gd_n, gd_mask in gd_model.tgt_masks:
    assert gd_mask is not None and torch.equal(gd_mask.expand(*gd_mask.shape[:-2], gd_n, gd_n).reshape(-1, gd_n, gd_n)[0],
                                               torch.ones(gd_n, gd_n, dtype=torch.bool).tril()), \
        f"decode got tgt_mask={gd_mask}: pass a causal mask, True on and below the diagonal (torch.ones(n, n).tril())"
with torch.no_grad():
    gd_mem = gd_model.encode(gd_src)
    for gd_t in range(1, 7):
        gd_prefix = gd_out[:, :gd_t]
        gd_c = torch.ones(gd_t, gd_t, dtype=torch.bool).tril()
        gd_all = gd_model.out(gd_model.decode(gd_prefix, gd_mem, None, gd_c))
        assert torch.equal(gd_out[:, gd_t], gd_all[:, -1].argmax(-1)), \
            f"token {gd_t} is not the argmax of the LAST position's logits given the tokens before it (decode with a causal tgt_mask; not the first position, not the whole sequence)"
    gd_eos = int(gd_out[0, 3])                                  # a token row 0 produces at step 3
    gd_stop = greedy_decode(gd_model, gd_src[:1], max_len=6, bos_id=1, eos_id=gd_eos)
gd_first = (gd_out[0, 1:] == gd_eos).nonzero()[0, 0].item() + 1
assert gd_stop.shape == (1, gd_first + 1) and torch.equal(gd_stop[0], gd_out[0, :gd_first + 1]), \
    f"a single row must stop right after producing eos_id: expected {gd_out[0, :gd_first + 1].tolist()}, got {gd_stop[0].tolist()}"

# %% [markdown]
# ## 10. Training: the date task of Chapter 1
#
# Training an encoder-decoder uses **teacher forcing**, as in Chapter 1: the decoder
# receives the correct target shifted right by one, and at every position predicts the
# next token. For a target `<bos> 2 0 2 6 - 1 1 - 2 1 <eos>`,
#
# | decoder input `tgt[:, :-1]` | `<bos>` | `2` | `0` | `2` | ... | `1` |
# |---|---|---|---|---|---|---|
# | label `tgt[:, 1:]` | `2` | `0` | `2` | `6` | ... | `<eos>` |
#
# With the causal mask, all positions are trained in one pass: unlike the recurrent
# decoder of Chapter 1, nothing here runs step by step. The loss is the cross-entropy
# averaged over real target tokens, with `ignore_index` set to the padding id so that
# padding counts for nothing. The source padding is hidden by
# `src_mask = (src != PAD)[:, None, None, :]`, shape $(B, 1, 1, N_\text{src})$.
#
# The paper's optimiser is Adam with $\beta_1 = 0.9$, $\beta_2 = 0.98$,
# $\epsilon = 10^{-9}$, and a learning rate that first grows linearly for $w$ warm-up
# steps and then decays as the inverse square root of the step $s$:
#
# $$\mathrm{lr}(s) = d_\text{model}^{-0.5}\cdot\min\big(s^{-0.5},\ s \cdot w^{-1.5}\big)
# = \mathrm{lr}_\text{peak}\cdot\min\Big(\frac{s}{w},\ \sqrt{\frac{w}{s}}\Big),
# \qquad \mathrm{lr}_\text{peak} = (d_\text{model}\, w)^{-0.5} .$$
#
# The paper uses $w = 4000$. Our models are small and train for a few hundred steps,
# so we keep the shape and choose the peak and $w$ ourselves. We also clip the
# gradient norm at 1 (Pascanu et al., 2013), a cheap guard against a rare huge step,
# and initialise the embeddings with standard deviation $d_\text{model}^{-0.5}$
# (Section 8).

# %%
PAD, BOS, EOS = 0, 1, 2      # the same ids in every vocabulary of this chapter


def warmup_schedule(peak, warmup):
    """lr(step) = peak * min(step / warmup, sqrt(warmup / step)), step = 1, 2, ..."""
    return lambda step: peak * min(step / warmup, math.sqrt(warmup / step))


def make_masks(src, tgt_in):
    """Source padding mask (B, 1, 1, N_src) and causal + target padding mask (B, 1, N, N)."""
    n = tgt_in.size(1)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return (src != PAD)[:, None, None, :], causal & (tgt_in != PAD)[:, None, None, :]


def new_transformer(src_vocab, tgt_vocab, d_model=64, num_heads=4, num_layers=2, seed=0, norm_first=False):
    torch.manual_seed(seed)
    model = Transformer(src_vocab, tgt_vocab, d_model, num_heads, num_layers, 4 * d_model)
    for emb in (model.src_embed, model.tgt_embed):
        nn.init.normal_(emb.weight, 0.0, d_model ** -0.5)        # tensor2tensor's scale (Section 8)
    for layer in [*model.encoder_layers, *model.decoder_layers]:
        layer.norm_first = norm_first
    return model


def train_transformer(model, next_batch, steps, lr, evaluate=None, every=50):
    """Teacher forcing, padding ignored, Adam(0.9, 0.98, 1e-9), lr(step), clipping at 1.

    Returns (losses per step, [(step, evaluate(model)), ...]).
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr(i + 1))   # i counts from 0
    losses, curve = [], []
    model.train()
    for step in range(1, steps + 1):
        src, tgt = next_batch()                                        # (B, N_src), (B, N_tgt + 1)
        tgt_in, labels = tgt[:, :-1], tgt[:, 1:]                       # shifted by one
        src_mask, tgt_mask = make_masks(src, tgt_in)
        logits = model(src, tgt_in, src_mask, tgt_mask)                # (B, N_tgt, V)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if evaluate is not None and step % every == 0:
            curve.append((step, evaluate(model)))
            model.train()
    return losses, curve


@torch.no_grad()
def exact_match(model, src, tgt, batch=500):
    """Held-out exact match: the greedy output up to its first <eos> equals the target exactly."""
    model.eval()
    hits = 0
    for i in range(0, len(src), batch):
        s, t = src[i:i + batch], tgt[i:i + batch]
        out = greedy_decode(model, s, t.size(1) - 1, BOS, EOS, (s != PAD)[:, None, None, :])
        for o, ref in zip(out.tolist(), t.tolist()):
            ref = ref[:ref.index(EOS) + 1]
            hits += o[:len(ref)] == ref
    return hits / len(src)


# %% [markdown]
# The data are exactly those of Chapter 1: a day between 1900 and 2099 written in one
# of nine formats ("Saturday, 21 November 2026", "21.11.2026", "the 21st of November
# 2026", ...), to be rewritten as "2026-11-21", with the same 2,000 held-out days,
# never seen in training in any format. The code is collapsed below.

# %% [include 01_bahdanau_attention:date_task tags=hide-input]

# %% [tags=hide-input]
def date_batches(seed, batch=64):
    rng = random.Random(seed)
    return lambda: encode_pairs(date_pairs(rng.sample(train_days, batch), rng))


date_test_src, date_test_tgt = test_src, test_tgt
print(f"{len(train_days):,} training days, {len(test_days):,} held-out days; held-out batch "
      f"{tuple(date_test_src.shape)} -> {tuple(date_test_tgt.shape)}")

# %% [markdown]
# The model is small: $d_\text{model} = 64$, 4 heads, 2 encoder and 2 decoder layers,
# $d_\text{ff} = 256$: {glue:text}`date_params:,d` parameters. We train on batches of 64 dates
# with a peak learning rate of $3 \cdot 10^{-3}$ after 50 warm-up steps, and measure
# held-out exact match every 100 steps on 500 of the held-out dates, and at the end on
# all 2,000 of them. Exact match means the whole ISO date and the `<eos>` after it.

# %%
DATE_STEPS = 800
date_model = new_transformer(len(SRC_ITOS), len(TGT_ITOS))
started = time.perf_counter()
date_losses, date_curve = train_transformer(
    date_model, date_batches(seed=2), DATE_STEPS, warmup_schedule(3e-3, 50),
    evaluate=lambda m: exact_match(m, date_test_src[:500], date_test_tgt[:500]), every=100)
date_seconds = time.perf_counter() - started
date_accuracy = exact_match(date_model, date_test_src, date_test_tgt)
print(f"Transformer: {count(date_model):,} parameters, {DATE_STEPS} steps in {date_seconds:.0f} s "
      f"(evaluations included), held-out exact match {date_accuracy:.2%}")
glue("date_accuracy", 100 * date_accuracy, display=False)
glue("date_seconds", date_seconds, display=False)
glue("date_params", count(date_model), display=False)

# %% [markdown]
# ### Side by side with Chapter 1's recurrent model
#
# For comparison we train Chapter 1's model with attention again, on the same data:
# a bidirectional GRU encoder and a GRU decoder with Bahdanau's additive attention,
# with the sizes and settings of Chapter 1 (Adam at $3 \cdot 10^{-3}$, batches of 64).
# Its code, a compact copy of Chapter 1's, is collapsed below.

# %% [tags=hide-input]
class RecurrentAttention(nn.Module):
    """Chapter 1's model: bidirectional GRU encoder, GRU decoder with additive attention."""

    def __init__(self, src_vocab, tgt_vocab, embed_dim=32, enc_hidden=64, hidden_dim=128, attn_dim=64):
        super().__init__()
        enc_dim = 2 * enc_hidden
        self.src_embed = nn.Embedding(src_vocab, embed_dim, padding_idx=PAD)
        self.encoder = nn.GRU(embed_dim, enc_hidden, batch_first=True, bidirectional=True)
        self.bridge = nn.Linear(enc_dim, hidden_dim)
        self.tgt_embed = nn.Embedding(tgt_vocab, embed_dim)
        self.W_a = nn.Linear(hidden_dim, attn_dim, bias=False)
        self.U_a = nn.Linear(enc_dim, attn_dim, bias=False)
        self.v_a = nn.Linear(attn_dim, 1, bias=False)
        self.cell = nn.GRUCell(embed_dim + enc_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + enc_dim, tgt_vocab)

    def encode(self, src):
        mask = src != PAD                                                   # (B, T)
        lengths = mask.sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(self.src_embed(src), lengths, batch_first=True,
                                                   enforce_sorted=False)
        h, _ = self.encoder(packed)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=src.size(1))  # (B, T, 2H)
        H = h.size(-1) // 2
        summary = torch.cat([h[torch.arange(src.size(0)), lengths - 1, :H], h[:, 0, H:]], dim=-1)
        return h, self.U_a(h), mask, torch.tanh(self.bridge(summary))

    def step(self, token, state, h, keys, mask):
        scores = self.v_a(torch.tanh(self.W_a(state)[:, None] + keys)).squeeze(-1)      # (B, T)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        context = (weights[:, :, None] * h).sum(1)                                       # (B, 2H)
        state = self.cell(torch.cat([self.tgt_embed(token), context], dim=-1), state)
        return self.out(torch.cat([state, context], dim=-1)), state

    def forward(self, src, tgt_in, *masks):                      # masks unused: the same call as the Transformer
        h, keys, mask, state = self.encode(src)
        logits = []
        for i in range(tgt_in.size(1)):                          # one decoder step after another
            step_logits, state = self.step(tgt_in[:, i], state, h, keys, mask)
            logits.append(step_logits)
        return torch.stack(logits, dim=1)                        # (B, N_tgt, V)

    @torch.no_grad()
    def generate(self, src, steps):
        h, keys, mask, state = self.encode(src)
        token, out = torch.full((src.size(0),), BOS, dtype=torch.long), []
        for _ in range(steps):
            step_logits, state = self.step(token, state, h, keys, mask)
            token = step_logits.argmax(-1)
            out.append(token)
        return torch.stack(out, dim=1)


@torch.no_grad()
def recurrent_exact_match(model, src, tgt):
    model.eval()
    out = model.generate(src, tgt.size(1) - 1)
    return (out == tgt[:, 1:]).all(dim=1).float().mean().item()


# %%
RNN_STEPS = 300
torch.manual_seed(0)
rnn_model = RecurrentAttention(len(SRC_ITOS), len(TGT_ITOS))
started = time.perf_counter()
_, rnn_curve = train_transformer(   # the same loop: teacher forcing, clipping; constant lr as in Chapter 1
    rnn_model, date_batches(seed=2), RNN_STEPS, lambda step: 3e-3,
    evaluate=lambda m: recurrent_exact_match(m, date_test_src[:500], date_test_tgt[:500]), every=50)
rnn_seconds = time.perf_counter() - started
rnn_accuracy = recurrent_exact_match(rnn_model, date_test_src, date_test_tgt)
print(f"{pad_to('model', 22)} {pad_to('parameters', 10, '>')} {pad_to('steps', 6, '>')} {pad_to('seconds', 8, '>')} {pad_to('held-out exact match', 21, '>')}")
print(f"{pad_to('GRU + attention (Ch. 1)', 22)} {count(rnn_model):>10,d} {RNN_STEPS:>6d} {rnn_seconds:>8.0f} {rnn_accuracy:>21.2%}")
print(f"{pad_to('Transformer', 22)} {count(date_model):>10,d} {DATE_STEPS:>6d} {date_seconds:>8.0f} {date_accuracy:>21.2%}")
glue("rnn_accuracy", 100 * rnn_accuracy, display=False)

# %% [markdown]
# Both models write essentially every held-out date correctly: the recurrent model
# {glue:text}`rnn_accuracy:.1f`%, the Transformer {glue:text}`date_accuracy:.1f`%
# (two decimals in the table above). The recurrent model needs fewer steps here: its
# recurrence hands it the order of the characters for free, while the Transformer
# must learn to use the sinusoidal positions, which takes a few hundred steps. (The
# wall times in the table depend on the machine and on whatever else it is running.)
# What changes with the architecture is how the time of a step grows with the input.
# We time one training step (forward and backward, batch of 64) of each model on
# sources of increasing length.

# %%
def time_training_step(model, src_len, tgt_len=11, batch=64, repeats=3):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, len(SRC_ITOS), (batch, src_len), generator=g)
    tgt = torch.randint(3, len(TGT_ITOS), (batch, tgt_len + 1), generator=g)
    model.train()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        src_mask, tgt_mask = make_masks(src, tgt[:, :-1])
        logits = model(src, tgt[:, :-1], src_mask, tgt_mask)
        F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten()).backward()
        best = min(best, time.perf_counter() - started)
    model.zero_grad()
    return best * 1000


lengths = [16, 32, 64, 128, 256]
step_ms = {"GRU + attention (Ch. 1)": [time_training_step(rnn_model, n) for n in lengths],
           "Transformer": [time_training_step(date_model, n) for n in lengths]}
print(f"{pad_to('source length', 24)}" + "".join(f"{n:>8d}" for n in lengths))
for name, ms in step_ms.items():
    print(f"{pad_to(name, 24)}" + "".join(f"{t:8.1f}" for t in ms) + "   ms per training step")
glue("rnn_ms_short", step_ms["GRU + attention (Ch. 1)"][0], display=False)
glue("rnn_ms_long", step_ms["GRU + attention (Ch. 1)"][-1], display=False)
glue("tr_ms_short", step_ms["Transformer"][0], display=False)
glue("tr_ms_long", step_ms["Transformer"][-1], display=False)

# %% [tags=hide-input]
STEP_TEXT = dict(title="Learning curves on the date task", time_title="Time per training step",
                 x_steps="training step (batches of 64)", y_acc="held-out exact match (500 dates)",
                 x_len="source length (characters)", y_ms="ms per step (batch 64, forward + backward)",
                 rnn="GRU + attention (Ch. 1)", transformer="Transformer")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
for curve, label, marker in [(rnn_curve, STEP_TEXT["rnn"], "s-"), (date_curve, STEP_TEXT["transformer"], "o-")]:
    ax1.plot(*zip(*curve), marker, markersize=4, label=label)
ax1.set_xlabel(STEP_TEXT["x_steps"])
ax1.set_ylabel(STEP_TEXT["y_acc"])
ax1.set_ylim(0, 1.02)
ax1.set_title(STEP_TEXT["title"])
ax1.legend()
for (name, ms), marker, label in zip(step_ms.items(), ["s-", "o-"], [STEP_TEXT["rnn"], STEP_TEXT["transformer"]]):
    ax2.loglog(lengths, ms, marker, markersize=4, label=label)
ax2.set_xticks(lengths, [str(n) for n in lengths])
ax2.xaxis.set_minor_formatter(plt.NullFormatter())
ax2.set_xlabel(STEP_TEXT["x_len"])
ax2.set_ylabel(STEP_TEXT["y_ms"])
ax2.set_title(STEP_TEXT["time_title"])
ax2.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The recurrent model's encoder walks along the source one character after another, and
# its decoder along the target: every training step is a chain of small dependent
# operations, {glue:text}`rnn_ms_short:.0f` ms at 16 characters and
# {glue:text}`rnn_ms_long:.0f` ms at 256 here. The Transformer runs each layer on all
# positions at once in a few large matrix products ({glue:text}`tr_ms_short:.0f` ms and
# {glue:text}`tr_ms_long:.0f` ms): its cost per position is nearly constant at short
# lengths and rises at long ones, where the $n \times n$ attention matrices of every
# head and layer take over (Section 14). On one CPU thread both models are limited by
# arithmetic and the two curves stay within a small factor of each other; the
# Transformer's advantage is that nothing in a layer waits for the previous position,
# so on parallel hardware (a GPU runs thousands of positions at once) its step time
# hardly grows until the attention matrices become large, while the recurrence keeps
# its $n$ sequential steps. That, more than accuracy, is what made it practical to
# train Transformers on billions of tokens.
#
# ## 11. A toy translation: English to Chinese
#
# Dates need little more than copying characters into a new order.
# For a task where the decoder must really look around, we translate small English
# sentences into Chinese, written here in pinyin without tones (the figures need no
# Chinese font). The sentences follow one template,
#
# > subject · verb · (adjective) object · (place) · (time)
#
# and Chinese puts the time and place **before** the verb:
#
# | English | Chinese | pinyin, as the model sees it |
# |---|---|---|
# | my friend buys red apples in the park every day | 我的朋友每天在公园买红色的苹果 | wo de pengyou meitian zai gongyuan mai hongse de pingguo |
# | she likes cheap shoes at night | 她晚上喜欢便宜的鞋子 | ta wanshang xihuan pianyi de xiezi |
#
# So the time phrase jumps from the end of the English sentence to the second place in
# Chinese, and the place phrase moves in front of the verb. Each English word must be
# found wherever it is, the adjective gains a particle *de*, "he" and "she" both become
# *ta*, and the verb loses its English *-s*. Every combination of 8 subjects, 6 verbs,
# 6 adjective choices, 8 objects, 7 place choices and 6 time choices gives 96,768
# sentence pairs; 2,000 of them are held out. (The example in spirit comes from a
# popular tutorial that trains on five sentence pairs; with five examples a model can
# only memorise, so we generate enough to learn from.)

# %% [tags=hide-input]
import itertools

SUBJECTS = [("I", "wo", 1), ("you", "ni", 1), ("he", "ta", 3), ("she", "ta", 3), ("we", "women", 1),
            ("they", "tamen", 1), ("the teacher", "laoshi", 3), ("my friend", "wo de pengyou", 3)]
VERBS = [("eat", "chi"), ("buy", "mai"), ("see", "kanjian"), ("like", "xihuan"), ("want", "yao"),
         ("draw", "hua")]
ADJECTIVES = [(None, None), ("big", "da de"), ("small", "xiao de"), ("red", "hongse de"),
              ("new", "xin de"), ("cheap", "pianyi de")]
OBJECTS = [("apples", "pingguo"), ("books", "shu"), ("flowers", "huar"), ("noodles", "miantiao"),
           ("cars", "qiche"), ("shoes", "xiezi"), ("cakes", "dangao"), ("pens", "bi")]
PLACES = [(None, None), ("in the park", "zai gongyuan"), ("at school", "zai xuexiao"), ("at home", "zai jia"),
          ("in the shop", "zai shangdian"), ("in the city", "zai chengli"), ("at the station", "zai chezhan")]
TIMES = [(None, None), ("every day", "meitian"), ("today", "jintian"), ("on weekends", "zhoumo"),
         ("in the morning", "zaoshang"), ("at night", "wanshang")]
# How printouts and figures show a target word: the model's tokens stay pinyin, which this
# edition shows as they are (a translation of the course may show characters instead).
ZH_WORD_TEXT = dict(
    wo="wo", ni="ni", ta="ta", women="women", tamen="tamen", laoshi="laoshi", de="de", pengyou="pengyou",
    chi="chi", mai="mai", kanjian="kanjian", xihuan="xihuan", yao="yao", hua="hua", da="da", xiao="xiao",
    hongse="hongse", xin="xin", pianyi="pianyi", pingguo="pingguo", shu="shu", huar="huar",
    miantiao="miantiao", qiche="qiche", xiezi="xiezi", dangao="dangao", bi="bi", zai="zai",
    gongyuan="gongyuan", xuexiao="xuexiao", jia="jia", shangdian="shangdian", chengli="chengli",
    chezhan="chezhan", meitian="meitian", jintian="jintian", zhoumo="zhoumo", zaoshang="zaoshang",
    wanshang="wanshang")


def shown(zh):
    """A target sentence (or word) as printed and drawn."""
    return " ".join(ZH_WORD_TEXT.get(w, w) for w in zh.split())


def sentence_pair(subject, verb, adjective, obj, place, time_):
    """English (subject verb adj object place time) and Chinese (subject time place verb adj object)."""
    en = [subject[0], verb[0] + ("s" if subject[2] == 3 else ""), adjective[0], obj[0], place[0], time_[0]]
    zh = [subject[1], time_[1], place[1], verb[1], adjective[1], obj[1]]
    return " ".join(w for w in en if w), " ".join(w for w in zh if w)


ALL_PAIRS = [sentence_pair(*c) for c in itertools.product(SUBJECTS, VERBS, ADJECTIVES, OBJECTS, PLACES, TIMES)]
random.Random(0).shuffle(ALL_PAIRS)
pair_test, pair_train = ALL_PAIRS[:2000], ALL_PAIRS[2000:]
EN_ITOS = ["<pad>", "<bos>", "<eos>"] + sorted({w for en, _ in ALL_PAIRS for w in en.split()})
ZH_ITOS = ["<pad>", "<bos>", "<eos>"] + sorted({w for _, zh in ALL_PAIRS for w in zh.split()})
EN_STOI = {w: i for i, w in enumerate(EN_ITOS)}
ZH_STOI = {w: i for i, w in enumerate(ZH_ITOS)}


def encode_sentences(pairs):
    """src (B, N_src) English word ids, padded; tgt (B, N_tgt) = <bos> Chinese ids <eos>, padded."""
    S = max(len(en.split()) for en, _ in pairs)
    T = max(len(zh.split()) for _, zh in pairs) + 2
    src = torch.full((len(pairs), S), PAD, dtype=torch.long)
    tgt = torch.full((len(pairs), T), PAD, dtype=torch.long)
    for b, (en, zh) in enumerate(pairs):
        ids = [EN_STOI[w] for w in en.split()]
        src[b, :len(ids)] = torch.tensor(ids)
        ids = [BOS] + [ZH_STOI[w] for w in zh.split()] + [EOS]
        tgt[b, :len(ids)] = torch.tensor(ids)
    return src, tgt


def sentence_batches(seed, batch=64):
    rng = random.Random(seed)
    return lambda: encode_sentences(rng.sample(pair_train, batch))


pair_test_src, pair_test_tgt = encode_sentences(pair_test)
print(f"{len(ALL_PAIRS):,} sentence pairs ({len(pair_train):,} for training, {len(pair_test):,} held out); "
      f"vocabularies: {len(EN_ITOS)} English, {len(ZH_ITOS)} Chinese words")
for en, zh in pair_train[:3]:
    print(f"  {en:50s} -> {shown(zh)}")

# %% [markdown]
# The same model size and recipe as for the dates, with word-level tokens. Exact match
# again means the whole sentence and its `<eos>`.

# %%
TRANSLATION_STEPS = 200
mt_model = new_transformer(len(EN_ITOS), len(ZH_ITOS))
started = time.perf_counter()
mt_losses, mt_curve = train_transformer(
    mt_model, sentence_batches(seed=3), TRANSLATION_STEPS, warmup_schedule(3e-3, 30),
    evaluate=lambda m: exact_match(m, pair_test_src[:500], pair_test_tgt[:500]), every=50)
mt_seconds = time.perf_counter() - started
mt_accuracy = exact_match(mt_model, pair_test_src, pair_test_tgt)
print(f"{TRANSLATION_STEPS} steps in {mt_seconds:.0f} s, held-out exact match {mt_accuracy:.2%}")
print("learning curve (step, exact match on 500 held-out):", [(s, round(a, 3)) for s, a in mt_curve])
glue("mt_accuracy", 100 * mt_accuracy, display=False)
glue("mt_seconds", mt_seconds, display=False)


def translate(model, sentence):
    src = torch.tensor([[EN_STOI[w] for w in sentence.split()]])
    out = greedy_decode(model.eval(), src, 12, BOS, EOS)[0].tolist()
    words = [ZH_ITOS[i] for i in out[1:]]
    return " ".join(words[:words.index("<eos>")] if "<eos>" in words else words)


for en, zh in pair_test[:4]:
    print(f"  {pad_to(en, 50)} -> {pad_to(shown(translate(mt_model, en)), 45)} {'ok' if translate(mt_model, en) == zh else 'WRONG'}")

# %% [markdown]
# The model translates {glue:text}`mt_accuracy:.1f`% of the held-out sentences exactly,
# after {glue:text}`mt_seconds:.0f` seconds of training. It has never seen these
# combinations of words, so it cannot have memorised them: it has learned where each
# phrase goes.

# %% [markdown]
# ## 12. Inside the trained models: attention maps
#
# Every `MultiHeadAttention` keeps the weights of its last call, so one forward pass
# with teacher forcing on a held-out sentence gives us all of them: for each of the 2
# layers and 4 heads, the encoder's self-attention $(N_\text{src} \times N_\text{src})$,
# the decoder's masked self-attention $(N_\text{tgt} \times N_\text{tgt})$ and the
# cross-attention $(N_\text{tgt} \times N_\text{src})$. Rows are queries, columns keys.

# %%
def attention_maps(model, src_words, tgt_words, src_itos_map, tgt_itos_map):
    """One teacher-forced pass; returns {kind: tensor (layers, heads, N_q, N_k)}."""
    src = torch.tensor([[src_itos_map[w] for w in src_words]])
    tgt = torch.tensor([[BOS] + [tgt_itos_map[w] for w in tgt_words]])
    n = tgt.size(1)
    model.eval()
    with torch.no_grad():
        model(src, tgt, None, torch.ones(n, n, dtype=torch.bool).tril())
    return {"encoder self-attention": torch.stack([l.self_attn.last_weights[0] for l in model.encoder_layers]),
            "decoder masked self-attention": torch.stack([l.self_attn.last_weights[0] for l in model.decoder_layers]),
            "cross-attention": torch.stack([l.cross_attn.last_weights[0] for l in model.decoder_layers])}


def plot_maps(weights, query_labels, key_labels, title, size=2.5, first_layer=0):
    """weights (layers, heads, N_q, N_k): one panel per layer (rows) and head (columns), numbered from 0 as in the
    code (and in Chapters 3 and 7); the layers from first_layer."""
    L, H = weights.shape[:2]
    fig, axes = plt.subplots(L, H, figsize=(size * H + 1.0, size * L + 0.6), squeeze=False,
                             layout="constrained")
    for l in range(L):
        for h in range(H):
            ax = axes[l, h]
            im = ax.imshow(weights[l, h], cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {l + first_layer}, head {h}", fontsize=8)
            ax.set_xticks(range(len(key_labels)), key_labels, rotation=90, fontsize=6.5)
            ax.set_yticks(range(len(query_labels)), query_labels, fontsize=6.5)
            ax.tick_params(labelleft=h == 0)
    fig.colorbar(im, ax=axes, shrink=0.7, label="attention weight")
    fig.suptitle(title, fontsize=10)
    return fig


example_en, example_zh = next((en, zh) for en, zh in pair_test
                              if len(en.split()) >= 9 and "de" in zh.split())
src_words, tgt_words = example_en.split(), example_zh.split()
maps = attention_maps(mt_model, src_words, tgt_words, EN_STOI, ZH_STOI)
tgt_queries = ["<bos>"] + [shown(w) for w in tgt_words]  # query t predicts word t + 1
print("source:", example_en)
print("target:", shown(example_zh))
cross_last = maps["cross-attention"][-1].mean(0)                 # (N_tgt, N_src), last layer, heads averaged
for q, row in zip(tgt_queries, cross_last):
    print(f"  query {pad_to(q, 10)} (predicts the next word) reads most: {src_words[row.argmax()]:8s} ({row.max():.2f})")

# %% [tags=hide-input]
MAP_TEXT = {"cross-attention": "Cross-attention: target queries (rows) read source words (columns)",
            "encoder self-attention": "Encoder self-attention over the English sentence",
            "decoder masked self-attention": "Decoder masked self-attention over the Chinese prefix"}
plot_maps(maps["cross-attention"], tgt_queries, src_words, MAP_TEXT["cross-attention"])
plt.show()

# %% [markdown]
# Read row $t$ of a cross-attention map as "while predicting target word $t + 1$, the
# decoder read these source words". In the last layer the pattern is the translation's
# word order: the query that predicts the time word reads the time phrase at the *end*
# of the English sentence, the one that predicts the place reads the place phrase, and
# only then does the decoder go back to the verb and the object. The alignment is far
# from diagonal, which is exactly what the word order of the two languages requires.
# Heads differ: some are sharp and carry the alignment, others are spread out or fix
# on one word (often the subject or the last word) as a kind of resting place.
# The two self-attentions:

# %% [tags=hide-input]
plot_maps(maps["encoder self-attention"], src_words, src_words, MAP_TEXT["encoder self-attention"])
plt.show()
plot_maps(maps["decoder masked self-attention"], tgt_queries, tgt_queries,
          MAP_TEXT["decoder masked self-attention"])
plt.show()

# %% [markdown]
# - **Encoder self-attention** is free to look both ways. Several heads attend to
#   neighbours or to the other words of the same phrase ("in the park", "every day"),
#   which lets a word's vector carry the phrase it belongs to: the decoder then needs
#   to find only one position per phrase.
# - **Decoder masked self-attention** is lower-triangular by construction (the causal
#   mask). Heads look at the previous word or at the start token; what the decoder has
#   already written tells it which phrase comes next.
#
# As in Chapter 1, keep in mind that attention weights show where a layer *read*,
# not why the model decided; and after one layer every position already mixes
# information from others, so a weight on the word "park" in layer 1 (the second: layers
# and heads are numbered from 0, as in the code) is a weight on a vector that knows about
# more than "park".
#
# The date model, for comparison: the cross-attention of its last layer on a held-out
# date.

# %%
date_text = FORMATS[4](FIRST_DAY + datetime.timedelta(days=test_days[10]))
date_target = (FIRST_DAY + datetime.timedelta(days=test_days[10])).isoformat()
date_maps = attention_maps(date_model, list(date_text), list(date_target), SRC_STOI, TGT_STOI)
print(date_text, "->", date_target)

# %% [tags=hide-input]
date_layers = date_maps["cross-attention"].size(0)
plot_maps(date_maps["cross-attention"][-1:], ["<bos>"] + list(date_target), list(date_text),
          "Date model, last layer: cross-attention of each head", size=3.0, first_layer=date_layers - 1)
plt.show()

# %% [markdown]
# The year digits, written first, read the year at the end of the input; the month
# digits read the month's name; the day digits read the day after the weekday. The
# Transformer learned the same alignment as the recurrent model of Chapter 1, without
# a recurrence, from positions it had to learn to use.

# %% [markdown]
# ## 13. Post-LN against pre-LN: does warm-up matter?
#
# Section 5 claimed that the paper's post-LN layers need a warm-up of the learning rate
# and pre-LN layers do not. We test it on the translation task with a deeper model (4
# encoder and 4 decoder layers, otherwise as before) and an aggressive peak learning
# rate of $10^{-2}$, for 100 steps of 32 sentences: once with 30 steps of linear
# warm-up, once without (the full rate from the first step), for each arrangement.
# Everything else, initial weights included, is identical.

# %%
STABILITY = dict(layers=4, steps=100, peak=1e-2, warmup=30, batch=32)


def stability_run(norm_first, warmup):
    model = new_transformer(len(EN_ITOS), len(ZH_ITOS), num_layers=STABILITY["layers"], seed=1,
                            norm_first=norm_first)
    peak, w = STABILITY["peak"], STABILITY["warmup"]
    lr = (lambda step: peak * min(1.0, step / w)) if warmup else (lambda step: peak)
    losses, _ = train_transformer(model, sentence_batches(seed=4, batch=STABILITY["batch"]),
                                  STABILITY["steps"], lr)
    return losses, exact_match(model, pair_test_src[:500], pair_test_tgt[:500])


started = time.perf_counter()
stability = {(nf, w): stability_run(nf, w) for nf in (False, True) for w in (True, False)}
print(f"4 runs in {time.perf_counter() - started:.0f} s")
print(f"{pad_to('layers', 8)} {pad_to('warm-up', 8)} {pad_to('mean loss, last 20 steps', 25, '>')} {pad_to('held-out exact match', 21, '>')}")
for (nf, w), (losses, acc) in stability.items():
    print(f"{pad_to('pre-LN' if nf else 'post-LN', 8)} {pad_to('yes' if w else 'no', 8)} {sum(losses[-20:]) / 20:25.3f} {acc:21.1%}")
    glue(f"stab_{'pre' if nf else 'post'}_{'warm' if w else 'cold'}", 100 * acc, display=False)

# %% [tags=hide-input]
STAB_TEXT = dict(title="Training loss, 4 + 4 layers, peak learning rate 1e-2",
                 x="training step", y="cross-entropy (moving average of 5 steps)",
                 labels={(False, True): "post-LN, warm-up", (False, False): "post-LN, no warm-up",
                         (True, True): "pre-LN, warm-up", (True, False): "pre-LN, no warm-up"})
fig, ax = plt.subplots(figsize=(6.5, 3.8))
styles = {(False, True): ("tab:blue", "-"), (False, False): ("tab:blue", "--"),
          (True, True): ("tab:orange", "-"), (True, False): ("tab:orange", "--")}
for key, (losses, _) in stability.items():
    smooth = torch.tensor(losses).unfold(0, 5, 1).mean(1)
    color, ls = styles[key]
    ax.plot(range(5, len(losses) + 1), smooth, color=color, ls=ls, label=STAB_TEXT["labels"][key])
ax.set_yscale("log")
ax.set_xlabel(STAB_TEXT["x"])
ax.set_ylabel(STAB_TEXT["y"])
ax.set_title(STAB_TEXT["title"])
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Without warm-up, the post-LN model reaches only {glue:text}`stab_post_cold:.1f`%
# held-out exact match in this budget, against {glue:text}`stab_post_warm:.1f`% with
# warm-up. The pre-LN model does not care: {glue:text}`stab_pre_cold:.1f`% without
# warm-up, {glue:text}`stab_pre_warm:.1f`% with it. This is the behaviour Xiong et al.
# (2020) explained: at initialisation, a post-LN model's gradients are largest in the
# layers nearest the output, and large steps there early in training disturb what the
# lower layers are learning; warm-up keeps those first steps small. In pre-LN the
# residual path is an identity from the input to the output, gradients are of similar
# size in all layers, and the full learning rate is safe from the first step. The
# price: with a careful schedule, a post-LN model often ends slightly better (Liu et
# al., 2020, who compare the two where both train well), and a pre-LN stack needs a
# final LayerNorm, because its residual stream is never normalised (Xiong et al., 2020,
# add one). GPT-2 and most large models since chose pre-LN
# (Chapter 7). One small experiment with one seed is an illustration, not a proof:
# try other seeds and learning rates (see the challenges).

# %% [markdown]
# ## 14. What self-attention costs, and what it does not do
#
# The paper compares a self-attention layer with a recurrent and a convolutional
# layer (kernel width $k$) that map $n$ vectors of width $d$ to $n$ vectors of width $d$:
#
# | layer | operations per layer | sequential operations | longest path between two positions |
# |---|---|---|---|
# | self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(\log_k n)$ (dilated) or $O(n/k)$ |
#
# Self-attention compares all $n^2$ pairs of positions, each in $d$ multiply-adds; a
# recurrent layer does a $d \times d$ matrix product per position, one position after
# another; a convolution does $k$ such products per position, all positions at once.
# The "path length" is the number of layers or steps a signal needs to go from one
# position to another: one attention layer connects every pair directly, which is what
# makes long-range dependencies easy to learn.
#
# :::{admonition} Correction: recurrent layers are not simply $O(n)$
# :class: warning
# A widely read comparison table lists the computational complexity of RNNs as $O(n)$
# and of the Transformer as $O(n^2)$, and concludes that the Transformer is the more
# expensive. Both entries leave out the width $d$, which is where the comparison is
# decided: per layer, $n^2 d$ against $n d^2$. Self-attention is *cheaper* than a
# recurrent layer whenever $n < d$, which was the usual case in translation (sentences
# of tens of tokens, $d = 512$ or more), and only more expensive for long sequences.
# And the recurrent layer's $O(n)$ steps are *sequential*. The measurement below shows
# both effects.
# :::
#
# We time one forward pass of each layer, $d = 64$, one sequence, for growing $n$:
# self-attention (the projections and one head of width $d$), a GRU, and a
# convolution of width 3.

# %%
torch.manual_seed(0)
d = 64
layers = {"self-attention (1 head)": MultiHeadAttention(d, 1),
          "recurrent (GRU)": nn.GRU(d, d, batch_first=True),
          "convolution (k = 3)": nn.Conv1d(d, d, 3, padding=1)}
calls = {"self-attention (1 head)": lambda m, x: m(x, x, x),
         "recurrent (GRU)": lambda m, x: m(x),
         "convolution (k = 3)": lambda m, x: m(x.transpose(1, 2))}


def best_ms(fn, repeats=3):
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


ns = [32, 64, 128, 256, 512, 1024, 2048]
layer_ms = {name: [] for name in layers}
with torch.no_grad():
    for n in ns:
        x = torch.randn(1, n, d)
        for name, layer in layers.items():
            layer_ms[name].append(best_ms(lambda: calls[name](layer, x)))
print("".join(f"{n:>9d}" for n in ns) + "   n (times in ms)")          # names last: any width
for name, ms in layer_ms.items():
    print("".join(f"{t:9.2f}" for t in ms) + f"   {name}")
growth = {name: math.log(ms[-1] / ms[-3]) / math.log(ns[-1] / ns[-3]) for name, ms in layer_ms.items()}
print("growth exponent over the last two doublings:", {k: round(v, 2) for k, v in growth.items()})
glue("attn_exponent", growth["self-attention (1 head)"], display=False)
glue("gru_exponent", growth["recurrent (GRU)"], display=False)
glue("attn_ms_long", layer_ms["self-attention (1 head)"][-1], display=False)
glue("gru_ms_long", layer_ms["recurrent (GRU)"][-1], display=False)

# %% [tags=hide-input]
COST_TEXT = dict(title=r"One layer, $d = 64$, one sequence", x="sequence length n",
                 y="forward time (ms)", ref2=r"$\propto n^2$", ref1=r"$\propto n$")
fig, ax = plt.subplots(figsize=(6.2, 3.9))
for (name, ms), marker in zip(layer_ms.items(), ["o-", "s-", "^-"]):
    ax.loglog(ns, ms, marker, markersize=4, label=name)
ref = layer_ms["self-attention (1 head)"][-1]
ax.loglog(ns, [ref * (n / ns[-1]) ** 2 for n in ns], ":", color="gray", label=COST_TEXT["ref2"])
ax.loglog(ns, [ref * (n / ns[-1]) for n in ns], "-.", color="lightgray", label=COST_TEXT["ref1"])
ax.set_xticks(ns, [str(n) for n in ns])
ax.xaxis.set_minor_formatter(plt.NullFormatter())
ax.set_xlabel(COST_TEXT["x"])
ax.set_ylabel(COST_TEXT["y"])
ax.set_title(COST_TEXT["title"])
ax.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# The measured exponents, over the last two doublings, are {glue:text}`attn_exponent:.2f`
# for self-attention and {glue:text}`gru_exponent:.2f` for the GRU. Self-attention is
# fast at short lengths and grows towards $n^2$: double the sequence, and its work and
# the memory for its $n \times n$ weights grow four-fold; at $n = 2048$ it takes
# {glue:text}`attn_ms_long:.1f` ms here. The GRU grows linearly but runs $n$ small
# dependent steps ({glue:text}`gru_ms_long:.1f` ms at $n = 2048$). The convolution is
# the cheapest, but one layer connects only neighbours. (Timings on a shared machine
# are noisy and depend on the hardware; the slopes are what carries over.)
#
# **The honest limits.** Two properties of the Transformer follow directly from its
# design:
#
# 1. **Quadratic cost.** The weights of every head, layer and sequence form an
#    $n \times n$ matrix. At $n = 100{,}000$ tokens that is $10^{10}$ scores per head
#    and layer: beyond what fits in memory. Chapter 6 builds the remedies: attention
#    restricted to windows (Longformer), to buckets of similar keys (Reformer), to a
#    projected or linearised form (Linformer, Performer), and FlashAttention, which
#    computes exact attention without ever storing the $n \times n$ matrix.
# 2. **No built-in notion of order.** Without the positional encoding, the encoder is
#    permutation-equivariant (Chapter 4): "dog bites man" and "man bites dog" give the
#    same set of vectors. Order is an addition, not a property of the layer, and the
#    sinusoidal table of the paper is only one choice; Chapter 4 showed RoPE and ALiBi,
#    which behave better on sequences longer than those seen in training.
#
# **Three families.** The encoder-decoder of this chapter is one of three ways to use
# the layers you built:
#
# | family | layers used | attention | trained to | examples |
# |---|---|---|---|---|
# | encoder-only | `EncoderLayer` | bidirectional | fill in masked tokens, classify | BERT (Devlin et al., 2019), ViT |
# | decoder-only | a decoder layer *without* cross-attention | causal | predict the next token | GPT-2, GPT-3, Llama |
# | encoder-decoder | both, with cross-attention | bidirectional + causal + cross | map a sequence to a sequence | the original Transformer, T5, Whisper |
#
# An encoder-only model reads the whole input in both directions at once, which suits
# understanding tasks; it cannot generate text token by token. A decoder-only model
# drops the encoder and the cross-attention: its causal self-attention reads its own
# prefix, and the prompt plays the role of the source. That is the model of Chapter 7,
# where you build GPT-2 with pre-LN blocks, load its public weights, and generate text.
#
# ## Check your understanding
#
# 1. In the decoder's cross-attention, where do the queries, keys and values come
#    from, and what shape do its weights have for $N_\text{tgt} = 7$,
#    $N_\text{src} = 10$ and 4 heads?
#
#    :::{dropdown} Answer
#    Queries from the decoder's own sequence (the output of its masked self-attention
#    sub-layer), keys and values from the encoder's output, the memory. The weights are
#    $(B, 4, 7, 10)$: for each head and each target position, a distribution over the
#    10 source positions.
#    :::
#
# 2. Why does the decoder's self-attention need a causal mask during training, but the
#    encoder's does not?
#
#    :::{dropdown} Answer
#    With teacher forcing, the decoder receives the whole target at once and predicts
#    token $t+1$ at position $t$. Without the mask, position $t$ could attend to
#    position $t+1$ and simply copy the answer; at inference that token does not exist
#    yet. The encoder reads a source that is entirely known, in training and at
#    inference alike, so every token may look at every other.
#    :::

# %% [markdown]
# 3. A model normalises with statistics over the sequence dimension instead of the
#    features. Name two things that go wrong.
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_norm_over_sequence points=2]
# ### BEGIN SOLUTION
# **Model answer.** Statistics over the sequence make each token's output depend on the
# other tokens of the sequence. In the decoder, earlier positions then see later ones
# through the mean and variance: a leak around the causal mask. And in any layer the
# padding changes the real tokens, so a sentence is represented differently in batches
# padded to different lengths. Section 3 measured both.
#
# **Rubric (2 points).**
#
# - 1 point: the causal leak: an early position's output depends on later tokens through
#   the statistics, although the mask forbids it.
# - 1 point: padding: the padded positions enter the statistics, so a real token's output
#   changes with the amount of padding (batch composition).
# - Another true consequence of the same cause (each output depends on the whole
#   sequence, e.g. a different result in training and one-token-at-a-time inference) may
#   replace one of them.
# ### END SOLUTION

# %% [markdown]
# 4. In pre-LN, what is normalised, and what is not? Why does a pre-LN stack usually
#    end with one extra LayerNorm?
#
#    :::{dropdown} Answer
#    The input of each sub-layer is normalised; the residual stream itself, the sum of
#    the embeddings and all sub-layer outputs, is never normalised. It grows as layers
#    add to it, so a final LayerNorm brings it back to a fixed scale before the output
#    layer. In post-LN each layer ends with a LayerNorm, so the stack's output is
#    already normalised.
#    :::
#
# 5. For $d = 512$, up to which sequence length is one self-attention layer cheaper
#    in multiply-adds than one recurrent layer, by the table of Section 14?
#
#    :::{dropdown} Answer
#    $n^2 d < n d^2$ exactly when $n < d$: up to about 512 tokens. (Counting the
#    attention layer's four $d \times d$ projections as well moves the break-even point
#    but not the conclusion.) Beyond that, attention does more arithmetic, but it can
#    still be faster in wall time, since its operations do not wait for each other.
#    :::
#
# ## Challenges (optional, not graded)
#
# - **Sharing embeddings.** The paper shares one matrix between the target embedding
#   and the output layer (`model.out.weight = model.tgt_embed.weight`, with the bias
#   kept). Try it on the translation task: does it change the number of steps to 99%?
# - **Embedding scale.** Train the date model of Section 10 with PyTorch's default
#   embedding initialisation (remove the `nn.init.normal_` line of `new_transformer`)
#   and compare its held-out exact match every 100 steps with that of the reference run.
# - **Label smoothing.** The paper trains with label smoothing $\epsilon = 0.1$
#   (`F.cross_entropy(..., label_smoothing=0.1)`). It makes the model less sure of
#   itself. Measure its effect on held-out exact match and on the loss.
# - **Warm-up, more seriously.** Repeat Section 13 with three seeds, several peak
#   learning rates and 6 layers, and plot the final accuracy against the learning rate
#   for the four settings. Where does post-LN without warm-up break?
# - **Longer sentences.** Add a second clause ("... and my friend buys pens at night")
#   and hold out every sentence with two clauses of a given kind. Does the model
#   generalise to more clauses than it was trained on?
#
# ## Summary
#
# - An **encoder layer** is self-attention and a position-wise feed-forward network;
#   a **decoder layer** adds cross-attention (queries from the decoder, keys and values
#   from the encoder's output) after a masked self-attention. Every sub-layer has a
#   residual connection and a LayerNorm, after the sum (**post-LN**, the paper) or on
#   the sub-layer's input (**pre-LN**, most later models).
# - **LayerNorm** normalises each token over its features. Taken over the sequence, it
#   would let future tokens and padding change a token's output.
# - The feed-forward network, with $d_\text{ff} = 4\,d_\text{model}$, holds two thirds
#   of an encoder layer's parameters.
# - Your layers compute exactly what `nn.TransformerEncoderLayer` and
#   `nn.TransformerDecoderLayer` compute, for both LayerNorm positions (errors of
#   order {glue:text}`equiv_max:.0e`).
# - Embeddings are multiplied by $\sqrt{d_\text{model}}$ and added to sinusoidal
#   positions; with embeddings initialised at the scale $d_\text{model}^{-1/2}$, as in
#   the authors' tensor2tensor code, tokens and positions are of the same size.
# - Training: teacher forcing with the target shifted by one, a causal mask, padding
#   ignored in the loss, Adam $(0.9, 0.98)$ with warm-up and inverse-square-root decay,
#   gradient clipping. A model of {glue:text}`date_params:,d` parameters reached
#   {glue:text}`date_accuracy:.1f`% exact match on held-out dates and
#   {glue:text}`mt_accuracy:.1f`% on held-out sentences of a toy translation whose word
#   order differs between the languages; its cross-attention shows the reordering.
# - Without warm-up at a high learning rate, post-LN trained poorly in our experiment
#   and pre-LN did not mind.
# - Self-attention costs $O(n^2 d)$ per layer, in $O(1)$ sequential steps, with a path
#   of length 1 between any two positions; the quadratic cost is the subject of
#   Chapter 6, decoder-only models of Chapter 7.
#
# ## References
#
# - Vaswani, A., Shazeer, N., Parmar, N., Uszkoreit, J., Jones, L., Gomez, A. N.,
#   Kaiser, Ł. and Polosukhin, I. (2017). Attention Is All You Need. *Advances in
#   Neural Information Processing Systems 30*. <https://arxiv.org/abs/1706.03762>
# - He, K., Zhang, X., Ren, S. and Sun, J. (2016). Deep Residual Learning for Image
#   Recognition. *CVPR 2016*. <https://arxiv.org/abs/1512.03385>
# - Ba, J. L., Kiros, J. R. and Hinton, G. E. (2016). Layer Normalization.
#   *arXiv:1607.06450*. <https://arxiv.org/abs/1607.06450>
# - Srivastava, N., Hinton, G., Krizhevsky, A., Sutskever, I. and Salakhutdinov, R.
#   (2014). Dropout: A Simple Way to Prevent Neural Networks from Overfitting. *JMLR*
#   15, 1929–1958. <https://jmlr.org/papers/v15/srivastava14a.html>
# - Xiong, R., Yang, Y., He, D., Zheng, K., Zheng, S., Xing, C., Zhang, H., Lan, Y.,
#   Wang, L. and Liu, T.-Y. (2020). On Layer Normalization in the Transformer
#   Architecture. *ICML 2020*. <https://arxiv.org/abs/2002.04745>
# - Liu, L., Liu, X., Gao, J., Chen, W. and Han, J. (2020). Understanding the
#   Difficulty of Training Transformers. *EMNLP 2020*. <https://arxiv.org/abs/2004.08249>
# - Vaswani, A., Bengio, S., Brevdo, E., Chollet, F., Gomez, A. N., Gouws, S., Jones,
#   L., Kaiser, Ł., Kalchbrenner, N., Parmar, N., Sepassi, R., Shazeer, N. and
#   Uszkoreit, J. (2018). Tensor2Tensor for Neural Machine Translation. *AMTA 2018*.
#   <https://arxiv.org/abs/1803.07416>
# - Geva, M., Schuster, R., Berant, J. and Levy, O. (2021). Transformer Feed-Forward
#   Layers Are Key-Value Memories. *EMNLP 2021*. <https://arxiv.org/abs/2012.14913>
# - Pascanu, R., Mikolov, T. and Bengio, Y. (2013). On the Difficulty of Training
#   Recurrent Neural Networks. *ICML 2013*. <https://arxiv.org/abs/1211.5063>
# - Devlin, J., Chang, M.-W., Lee, K. and Toutanova, K. (2019). BERT: Pre-training of
#   Deep Bidirectional Transformers for Language Understanding. *NAACL 2019*.
#   <https://arxiv.org/abs/1810.04805>
# - Rush, A. (2018). The Annotated Transformer. *Proceedings of Workshop for NLP Open
#   Source Software*. <https://nlp.seas.harvard.edu/annotated-transformer/>
# - Alammar, J. (2018). The Illustrated Transformer.
#   <https://jalammar.github.io/illustrated-transformer/>
# - PyTorch documentation: `nn.TransformerEncoderLayer`, `nn.TransformerDecoderLayer`.
#   <https://pytorch.org/docs/stable/generated/torch.nn.TransformerEncoderLayer.html>

# %% [hidden]
import math

import torch
import torch.nn.functional as F

import solutions.ch05_transformer as ref
from autograder.hidden import HiddenTests, Mistake

hidden = HiddenTests(ref, from_scratch={"FeedForward", "EncoderLayer", "DecoderLayer", "Transformer",
                                        "greedy_decode"})


# ----------------------------------------------------------------------------- FeedForward
def _ffn(m, x, how="ok"):
    h = m.linear1(x)
    if how == "no_relu":
        return m.linear2(h)
    if how == "gelu":
        return m.linear2(F.gelu(h))
    out = m.linear2(torch.relu(h))
    return torch.relu(out) if how == "relu_out" else out


FFN_MISTAKES = [
    Mistake("ReLU missing: apply torch.relu between linear1 and linear2", lambda m, x: _ffn(m, x, "no_relu")),
    Mistake("ReLU applied to the output too: the network ends with linear2, no activation after it",
            lambda m, x: _ffn(m, x, "relu_out")),
    Mistake("GELU instead of ReLU: the paper's network uses max(0, x W_1 + b_1)", lambda m, x: _ffn(m, x, "gelu")),
]


def _dropout_in_eval(probe, value):
    """Hint when the output is the network with dropout ACTIVE: in eval() mode it must do nothing.

    Dropout keeps each value or zeroes it and scales the rest by 1/(1-p). After the ReLU
    (with d_ff <= d_model, so the hidden units can be read back through linear2) or on
    the output, every value is then either 0 or the eval-mode value / (1-p).
    """
    m, x = probe.reference, probe.args[0]
    keep = 1 - m.dropout.p
    if not isinstance(value, torch.Tensor) or value.shape != x.shape or keep == 1:
        return None
    with torch.no_grad():
        w2, b2 = m.linear2.weight.double(), m.linear2.bias.double()
        hidden_units = torch.relu(m.linear1(x)).double()
        expected, y = hidden_units @ w2.T + b2, value.double()
        if torch.allclose(y, expected, atol=1e-4):
            return None
        read_back = torch.linalg.lstsq(w2, (y - b2).reshape(-1, w2.shape[0]).T).solution.T.reshape(hidden_units.shape)

        def kept_or_zeroed(got, full):
            return bool(((got.abs() < 1e-4) | torch.isclose(got, full / keep, atol=1e-4, rtol=1e-3)).all())
        if kept_or_zeroed(read_back, hidden_units) or kept_or_zeroed(y, expected):
            return ("dropout active in eval() mode: F.dropout(h, p) defaults to training=True; use self.dropout "
                    "(an nn.Dropout, which eval() turns off) or pass training=self.training")
    return None


@hidden.test("test_FeedForward")
def _(t):
    t.module("FeedForward", dict(d_model=16, d_ff=8, dropout=0.5), t.randn(3, 6, 16), mistakes=FFN_MISTAKES,
             checks=[_dropout_in_eval], label="dropout=0.5 in eval() mode, where dropout does nothing")
    t.module("FeedForward", dict(d_model=8, d_ff=32), t.randn(2, 5, 8), mistakes=FFN_MISTAKES,
             label="(B, N, d_model) = (2, 5, 8), d_ff = 32")
    t.module("FeedForward", dict(d_model=6, d_ff=10), t.randn(7, 6), mistakes=FFN_MISTAKES,
             label="a (N, d_model) input without a batch dimension")
    t.module("FeedForward", dict(d_model=4, d_ff=16), t.randn(2, 3, 5, 4, dtype=torch.float64),
             dtype=torch.float64, mistakes=FFN_MISTAKES, label="float64, two leading dimensions")
    t.module("FeedForward", dict(d_model=8, d_ff=24, dropout=0.0), t.randn(3, 4, 8), grad=True,
             mistakes=FFN_MISTAKES, label="gradients")


# ----------------------------------------------------------------------------- EncoderLayer
def _enc(m, x, mask=None, *, norm_first=None, how="ok"):
    """The reference encoder layer with one deliberate change."""
    pre = m.norm_first if norm_first is None else norm_first
    n1, n2 = (m.norm2, m.norm1) if how == "norms_swapped" else (m.norm1, m.norm2)
    mask = None if how == "mask_dropped" else mask

    def attn(z):
        return m.self_attn(z, z, z, mask)[0]

    if how == "norm_inside":                       # x + norm(sublayer(x)): norm before the residual sum
        x = x + n1(attn(x))
        return x + n2(m.ffn(x))
    if how == "no_residual":
        if pre:
            x = attn(n1(x))
            return m.ffn(n2(x))
        x = n1(attn(x))
        return n2(m.ffn(x))
    if pre:
        h = n1(x)
        x = (h if how == "pre_residual_normed" else x) + attn(h)
        h = n2(x)
        return (h if how == "pre_residual_normed" else x) + m.ffn(h)
    x = n1(x + attn(x))
    return n2(x + m.ffn(x))


ENC_MISTAKES = [
    Mistake("norm before the residual sum: post-LN normalises the sum, x = norm1(x + attn(x)), "
            "not the sub-layer's output (x + norm1(attn(x)))", lambda m, x, mask=None: _enc(m, x, mask, how="norm_inside")),
    Mistake("norm_first ignored: with norm_first=True the layer is pre-LN, x = x + attn(norm1(x))",
            lambda m, x, mask=None: _enc(m, x, mask, norm_first=False)),
    Mistake("norm_first inverted: the default (norm_first=False) is post-LN, x = norm1(x + attn(x))",
            lambda m, x, mask=None: _enc(m, x, mask, norm_first=not m.norm_first)),
    Mistake("pre-LN residual adds the normalised input: x = x + attn(norm1(x)), not norm1(x) + attn(norm1(x))",
            lambda m, x, mask=None: _enc(m, x, mask, how="pre_residual_normed")),
    Mistake("mask not passed down: call self.self_attn(..., mask)", lambda m, x, mask=None: _enc(m, x, mask, how="mask_dropped")),
    Mistake("residual connection missing: add the sub-layer's input to its output",
            lambda m, x, mask=None: _enc(m, x, mask, how="no_residual")),
    Mistake("norm1 and norm2 swapped: norm1 belongs to the attention sub-layer, norm2 to the feed-forward",
            lambda m, x, mask=None: _enc(m, x, mask, how="norms_swapped")),
]
ENC = dict(mistakes=ENC_MISTAKES, deps=("FeedForward",))


def _padding(lengths, n):
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]   # (B, 1, 1, n)


def _random_mask(t, *shape):
    """A random bool mask whose rows all keep at least one key (the diagonal when square)."""
    mask = t.rand_bool(*shape, p=0.6)
    mask[..., 0] = True
    return mask


@hidden.test("test_EncoderLayer_post_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16)
    t.module("EncoderLayer", init, t.randn(2, 5, 8), label="post-LN, no mask", **ENC)
    t.module("EncoderLayer", dict(d_model=12, num_heads=3, d_ff=48), t.randn(3, 4, 12, dtype=torch.float64),
             dtype=torch.float64, label="post-LN, float64, 3 heads", **ENC)
    t.module("EncoderLayer", init, t.randn(1, 7, 8), grad=True, label="post-LN, gradients", **ENC)


@hidden.test("test_EncoderLayer_pre_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=True)
    t.module("EncoderLayer", init, t.randn(2, 5, 8), label="pre-LN, no mask", **ENC)
    t.module("EncoderLayer", dict(d_model=16, num_heads=4, d_ff=32, norm_first=True),
             t.randn(2, 3, 16, dtype=torch.float64), dtype=torch.float64, label="pre-LN, float64, 4 heads", **ENC)
    t.module("EncoderLayer", init, t.randn(1, 6, 8), mask=_padding([4], 6), grad=True,
             label="pre-LN, padding mask, gradients", **ENC)


@hidden.test("test_EncoderLayer_mask")
def _(t):
    for norm_first in (False, True):
        init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=norm_first)
        tag = "pre-LN" if norm_first else "post-LN"
        t.module("EncoderLayer", init, t.randn(3, 6, 8), mask=_padding([6, 4, 2], 6),
                 label=f"{tag}, a (B, 1, 1, N) padding mask", **ENC)
        t.module("EncoderLayer", init, t.randn(2, 5, 8), mask=_random_mask(t, 5, 5),
                 label=f"{tag}, an (N, N) mask", **ENC)
        t.module("EncoderLayer", init, t.randn(2, 4, 8), mask=_random_mask(t, 2, 2, 4, 4),
                 label=f"{tag}, a (B, h, N, N) mask, different per head", **ENC)


# ----------------------------------------------------------------------------- DecoderLayer
def _dec(m, x, memory, tgt_mask=None, memory_mask=None, *, norm_first=None, how="ok"):
    """The reference decoder layer with one deliberate change."""
    pre = m.norm_first if norm_first is None else norm_first
    n1, n2, n3 = m.norm1, m.norm2, m.norm3
    if how == "norms_swapped":
        n2, n3 = n3, n2
    if how == "tgt_mask_dropped":
        tgt_mask = None
    if how == "memory_mask_dropped":
        memory_mask = None
    if how == "masks_swapped":
        tgt_mask, memory_mask = memory_mask, tgt_mask

    def self_attn(z):
        return m.self_attn(z, z, z, tgt_mask)[0]

    def cross(z):
        if how == "kv_from_x":
            return m.cross_attn(z, z, z, memory_mask)[0]
        if how == "k_from_x":
            return m.cross_attn(z, z, memory, memory_mask)[0]
        if how == "q_from_memory":
            return m.cross_attn(memory, z, z, memory_mask)[0]
        if how == "memory_normed":
            mem = n2(memory)
            return m.cross_attn(z, mem, mem, memory_mask)[0]
        return m.cross_attn(z, memory, memory, memory_mask)[0]

    subs = [(n1, self_attn), (n2, cross), (n3, m.ffn)]
    if how == "no_cross":
        subs = [(n1, self_attn), (n3, m.ffn)]
    for norm, sub in subs:
        if how == "norm_inside":
            x = x + norm(sub(x))
        elif how == "no_residual":
            x = sub(norm(x)) if pre else norm(sub(x))
        elif pre:
            h = norm(x)
            x = (h if how == "pre_residual_normed" else x) + sub(h)
        else:
            x = norm(x + sub(x))
    return x


def _dm(how=None, norm_first=None):
    return lambda m, x, memory, tgt_mask=None, memory_mask=None: _dec(
        m, x, memory, tgt_mask, memory_mask, norm_first=None if norm_first is None else norm_first(m),
        how=how or "ok")


DEC_MISTAKES = [
    Mistake("cross-attention keys and values taken from the decoder input: use cross_attn(x, memory, memory, memory_mask)",
            _dm("kv_from_x")),
    Mistake("cross-attention keys taken from the decoder input: keys and values both come from memory",
            _dm("k_from_x")),
    Mistake("cross-attention queries taken from memory: queries come from the decoder, cross_attn(x, memory, memory)",
            _dm("q_from_memory")),
    Mistake("cross-attention missing: the decoder layer has three sub-layers", _dm("no_cross")),
    Mistake("norm before the residual sum: post-LN normalises the sum, x = norm1(x + sublayer(x))",
            _dm("norm_inside")),
    Mistake("norm_first ignored: with norm_first=True the decoder layer is pre-LN", _dm(norm_first=lambda m: False)),
    Mistake("norm_first inverted: the default (norm_first=False) is post-LN",
            _dm(norm_first=lambda m: not m.norm_first)),
    Mistake("pre-LN residual adds the normalised input: x = x + sublayer(norm(x))", _dm("pre_residual_normed")),
    Mistake("memory normalised: only the decoder's own input goes through norm2; keys and values are the raw memory",
            _dm("memory_normed")),
    Mistake("tgt_mask not passed down: the self-attention needs it, self_attn(x, x, x, tgt_mask)",
            _dm("tgt_mask_dropped")),
    Mistake("memory_mask not passed down: the cross-attention needs it, cross_attn(x, memory, memory, memory_mask)",
            _dm("memory_mask_dropped")),
    Mistake("masks swapped: tgt_mask goes to the self-attention, memory_mask to the cross-attention",
            _dm("masks_swapped")),
    Mistake("norm2 and norm3 swapped: norm2 belongs to the cross-attention, norm3 to the feed-forward",
            _dm("norms_swapped")),
    Mistake("residual connection missing: add each sub-layer's input to its output", _dm("no_residual")),
]
DEC = dict(mistakes=DEC_MISTAKES, deps=("FeedForward",))


@hidden.test("test_DecoderLayer_post_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16)
    t.module("DecoderLayer", init, t.randn(2, 4, 8), t.randn(2, 6, 8), label="post-LN, N_tgt=4, N_src=6", **DEC)
    t.module("DecoderLayer", dict(d_model=12, num_heads=4, d_ff=24), t.randn(1, 5, 12, dtype=torch.float64),
             t.randn(1, 3, 12, dtype=torch.float64), dtype=torch.float64, label="post-LN, float64, N_tgt=5, N_src=3", **DEC)
    t.module("DecoderLayer", init, t.randn(2, 3, 8), t.randn(2, 3, 8), grad=True,
             label="post-LN, N_tgt = N_src = 3, gradients", **DEC)


@hidden.test("test_DecoderLayer_pre_ln")
def _(t):
    init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=True)
    t.module("DecoderLayer", init, t.randn(2, 4, 8), t.randn(2, 6, 8), label="pre-LN, N_tgt=4, N_src=6", **DEC)
    t.module("DecoderLayer", dict(d_model=16, num_heads=4, d_ff=32, norm_first=True),
             t.randn(3, 2, 16, dtype=torch.float64), t.randn(3, 5, 16, dtype=torch.float64), dtype=torch.float64,
             label="pre-LN, float64, 4 heads", **DEC)
    t.module("DecoderLayer", init, t.randn(1, 3, 8), t.randn(1, 3, 8), grad=True,
             label="pre-LN, N_tgt = N_src = 3, gradients", **DEC)


@hidden.test("test_DecoderLayer_masks")
def _(t):
    for norm_first in (False, True):
        init = dict(d_model=8, num_heads=2, d_ff=16, norm_first=norm_first)
        tag = "pre-LN" if norm_first else "post-LN"
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        t.module("DecoderLayer", init, t.randn(2, 4, 8), t.randn(2, 4, 8),
                 tgt_mask=torch.ones(4, 4, dtype=torch.bool).tril() & _padding([4, 2], 4),
                 memory_mask=_random_mask(t, 2, 2, 4, 4),
                 label=f"{tag}, causal + padding (B, 1, N, N) tgt_mask, (B, h, N_tgt, N_src) memory_mask", **DEC)
        t.module("DecoderLayer", init, t.randn(3, 5, 8), t.randn(3, 6, 8), causal, _padding([6, 3, 1], 6),
                 label=f"{tag}, causal (N, N) tgt_mask, (B, 1, 1, N_src) memory_mask", **DEC)
        t.module("DecoderLayer", init, t.randn(2, 3, 8), t.randn(2, 5, 8), tgt_mask=_random_mask(t, 2, 1, 3, 3),
                 label=f"{tag}, tgt_mask only", **DEC)
        t.module("DecoderLayer", init, t.randn(2, 3, 8), t.randn(2, 5, 8), memory_mask=_padding([2, 5], 5),
                 label=f"{tag}, memory_mask only", **DEC)


# ----------------------------------------------------------------------------- Transformer
def _embed(m, emb, tokens, how):
    x = emb(tokens)
    if how == "no_scale":
        pass
    elif how == "inverse_scale":
        x = x / math.sqrt(m.d_model)
    else:
        x = x * math.sqrt(m.d_model)
    if how != "no_pe":
        x = x + m.pe[:tokens.size(1)]
    return x


def _encode(m, src, src_mask=None, how="ok"):
    x = _embed(m, m.src_embed, src, how)
    for layer in m.encoder_layers:
        x = layer(x, None if how == "src_mask_dropped" else src_mask)
    return F.layer_norm(x, x.shape[-1:]) if how == "final_norm" else x


def _decode(m, tgt, memory, src_mask=None, tgt_mask=None, how="ok"):
    x = _embed(m, m.src_embed if how == "src_embed" else m.tgt_embed, tgt, how)
    for layer in m.decoder_layers:
        if how == "masks_swapped":
            x = layer(x, memory, src_mask, tgt_mask)
        else:
            x = layer(x, memory, None if how == "tgt_mask_dropped" else tgt_mask,
                      None if how in ("src_mask_dropped", "memory_mask_dropped") else src_mask)
    return F.layer_norm(x, x.shape[-1:]) if how == "final_norm" else x


def _forward(m, src, tgt, src_mask=None, tgt_mask=None, how="ok"):
    shared = ("no_scale", "inverse_scale", "final_norm", "no_pe")
    memory = _encode(m, src, src_mask, how if how in shared + ("src_mask_dropped",) else "ok")
    hidden_states = _decode(m, tgt, memory, src_mask, tgt_mask, "ok" if how == "src_mask_dropped" else how)
    if how == "no_out":
        return hidden_states
    logits = m.out(hidden_states)
    return torch.log_softmax(logits, -1) if how == "log_softmax" else (
        torch.softmax(logits, -1) if how == "softmax" else logits)


def _variant(fn, how, message):
    """A mistake model: ``fn`` (one of the reference computations above) with one deliberate change."""
    return Mistake(message, lambda m, *a, **k: fn(m, *a, how=how, **k))


def _common(fn):
    """Mistakes that encode, decode and forward share (each message a literal, for the translations)."""
    return [
        _variant(fn, "no_scale", message="embeddings not scaled by sqrt(d_model): "
                                         "x = embed(tokens) * sqrt(d_model) + pe[:N]"),
        _variant(fn, "inverse_scale", message="embeddings divided by sqrt(d_model): multiply by sqrt(d_model)"),
        _variant(fn, "no_pe", message="positional encoding missing: add self.pe[:N] to the scaled embeddings"),
        _variant(fn, "final_norm", message="extra final norm: the course's Transformer has no LayerNorm after "
                                           "either stack"),
    ]


ENCODE_MISTAKES = _common(_encode) + [
    _variant(_encode, "src_mask_dropped", message="src_mask not passed down: give it to every encoder layer")]
DECODE_MISTAKES = _common(_decode) + [
    _variant(_decode, "src_embed", message="decode must embed the target with tgt_embed, not src_embed"),
    _variant(_decode, "masks_swapped",
             message="masks swapped: a decoder layer is called as layer(x, memory, tgt_mask, src_mask)"),
    _variant(_decode, "tgt_mask_dropped", message="tgt_mask not passed down: give it to every decoder layer"),
    _variant(_decode, "memory_mask_dropped",
             message="src_mask not passed down to the decoder layers: it is their memory_mask")]
FORWARD_MISTAKES = _common(_forward) + [
    _variant(_forward, "src_embed", message="decode must embed the target with tgt_embed, not src_embed"),
    _variant(_forward, "tgt_mask_dropped", message="tgt_mask not passed down: give it to every decoder layer"),
    _variant(_forward, "src_mask_dropped", message="src_mask not passed down to the encoder layers"),
    _variant(_forward, "memory_mask_dropped",
             message="src_mask not passed to decode: the decoder layers need it as their memory_mask"),
    _variant(_forward, "no_out",
             message="forward returns the decoder's hidden states: apply self.out to get the logits"),
    _variant(_forward, "softmax", message="forward returns probabilities: return the logits, without a softmax"),
    _variant(_forward, "log_softmax",
             message="forward returns log-probabilities: return the logits, without a log_softmax")]
TRANSFORMER_DEPS = ("FeedForward", "EncoderLayer", "DecoderLayer")
SMALL = dict(src_vocab=13, tgt_vocab=11, d_model=16, num_heads=4, num_layers=2, d_ff=32, max_len=24)


def _tokens(t, vocab, B, N):
    return t.randint(0, vocab, (B, N))


@hidden.test("test_Transformer_encode")
def _(t):
    enc = dict(method="encode", mistakes=ENCODE_MISTAKES, deps=TRANSFORMER_DEPS)
    t.module("Transformer", SMALL, _tokens(t, 13, 2, 6), label="encode, no mask", **enc)
    t.module("Transformer", SMALL, _tokens(t, 13, 3, 7), _padding([7, 5, 2], 7),
             label="encode with a (B, 1, 1, N_src) padding mask", **enc)
    t.module("Transformer", dict(SMALL, d_model=8, num_heads=2, num_layers=3, d_ff=16), _tokens(t, 13, 2, 5),
             src_mask=_padding([3, 5], 5), dtype=torch.float64, label="encode, float64, 3 layers", **enc)
    t.module("Transformer", dict(SMALL, num_layers=1), _tokens(t, 13, 1, 4), label="encode, one layer", **enc)


@hidden.test("test_Transformer_decode")
def _(t):
    dec = dict(method="decode", mistakes=DECODE_MISTAKES, deps=TRANSFORMER_DEPS)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    t.module("Transformer", SMALL, _tokens(t, 11, 2, 5), t.randn(2, 6, 16), _padding([6, 3], 6), causal,
             label="decode, N_tgt=5, N_src=6, both masks", **dec)
    t.module("Transformer", SMALL, _tokens(t, 11, 3, 4), t.randn(3, 4, 16),
             tgt_mask=torch.ones(4, 4, dtype=torch.bool).tril() & _padding([4, 3, 2], 4),
             src_mask=_padding([2, 4, 3], 4), label="decode, causal + padding tgt_mask, N_tgt = N_src", **dec)
    t.module("Transformer", dict(SMALL, d_model=8, num_heads=2, d_ff=16), _tokens(t, 11, 2, 3),
             t.randn(2, 5, 8, dtype=torch.float64), dtype=torch.float64, label="decode, float64, no masks", **dec)


@hidden.test("test_Transformer_forward")
def _(t):
    fwd = dict(mistakes=FORWARD_MISTAKES, deps=TRANSFORMER_DEPS)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    t.module("Transformer", SMALL, _tokens(t, 13, 2, 6), _tokens(t, 11, 2, 4), _padding([6, 4], 6), causal,
             label="forward, both masks", **fwd)
    t.module("Transformer", SMALL, _tokens(t, 13, 3, 5), _tokens(t, 11, 3, 6),
             tgt_mask=torch.ones(6, 6, dtype=torch.bool).tril(), label="forward, tgt_mask only", **fwd)
    t.module("Transformer", dict(SMALL, num_layers=1, tgt_vocab=5), _tokens(t, 13, 2, 3), _tokens(t, 5, 2, 3),
             src_mask=_padding([1, 3], 3), label="forward, src_mask only", **fwd)
    t.module("Transformer", dict(SMALL, d_model=8, num_heads=2, d_ff=16), _tokens(t, 13, 2, 4),
             _tokens(t, 11, 2, 3), _padding([4, 2], 4), torch.ones(3, 3, dtype=torch.bool).tril(), grad=True,
             label="forward, gradients", **fwd)


# ----------------------------------------------------------------------------- greedy_decode
def _same_up_to_eos(eos_id):
    """Compare decoded batches as the spec grades them: same shape and, in every row, the same
    tokens up to and including the row's first eos_id (all of them in a row without one).
    What a row holds after its end is left open (the argmax, eos, padding)."""
    def equivalent(student, expected):
        if not isinstance(student, torch.Tensor) or student.shape != expected.shape \
                or student.dtype != expected.dtype:
            return False
        is_eos = (expected == eos_id).int()
        after_end = (is_eos.cumsum(dim=1) - is_eos) > 0          # strictly after the first eos
        return bool(((student == expected) | after_end).all())
    return equivalent


@torch.no_grad()
def _greedy(model, src, max_len, bos_id, eos_id, src_mask=None, how="ok"):
    """The reference greedy decoding with one deliberate change."""
    memory = model.encode(src, None if how == "src_mask_dropped" else src_mask)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len - 1 if how == "one_short" else max_len):
        n = ys.size(1)
        causal = None if how == "no_causal" else torch.ones(n, n, dtype=torch.bool).tril()
        if how == "causal_triu":
            causal = torch.ones(n, n, dtype=torch.bool).triu()
        elif how == "causal_inverted":
            causal = ~causal
        logits = model.out(model.decode(ys, memory, None if how == "src_mask_dropped" else src_mask, causal))
        next_token = logits[:, 0 if how == "first_position" else -1].argmax(dim=-1)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if how == "any_row" and finished.any():
            break
        if how != "never_stops" and finished.all():
            break
    return ys[:, 1:] if how == "drop_bos" else ys


def _greedy_mistake(how, message):
    return Mistake(message, lambda *a, **k: _greedy(*a, how=how, **k))


GREEDY_MISTAKES = [
    _greedy_mistake("any_row", message="decoding stops when any row ends: continue until EVERY row has produced "
                                       "eos_id"),
    _greedy_mistake("drop_bos", message="start token dropped: the output begins with bos_id in column 0"),
    _greedy_mistake("first_position", message="argmax taken at the wrong position: the next token comes from the "
                                              "logits of the LAST position, logits[:, -1]"),
    _greedy_mistake("never_stops", message="decoding never stops early: stop as soon as every row has produced "
                                           "eos_id"),
    _greedy_mistake("no_causal", message="no causal tgt_mask: decode the prefix with a causal mask, as in training"),
    _greedy_mistake("causal_triu", message="causal mask upside down: True (may attend) must be on and below the "
                                           "diagonal, torch.ones(n, n).tril(), not triu"),
    _greedy_mistake("causal_inverted", message="causal mask polarity inverted: True means MAY attend, so the causal "
                                               "mask is True on and below the diagonal"),
    _greedy_mistake("src_mask_dropped", message="src_mask not passed to model.encode and model.decode"),
    _greedy_mistake("one_short", message="one token short: max_len counts the tokens generated after bos_id, so "
                                         "without eos the output has max_len + 1 columns"),
]


def _eos_for(m, src, max_len, src_mask=None, how="staggered"):
    """Pick an eos id for a model argument from its own greedy output without any eos.

    "absent": a token no row produces (decoding runs all max_len steps);
    "staggered": a token every row produces, at first steps as different as possible
    (rows end at different steps; decoding stops when the last one ends), else one most
    rows produce.
    """
    free = ref.greedy_decode(m.module, src, max_len, BOS_ID, -1, src_mask)[:, 1:]     # (B, max_len)
    vocab = m.module.out.out_features
    if how == "absent":
        unused = [v for v in range(3, vocab) if not (free == v).any()]
        return unused[0] if unused else vocab
    best, best_key = None, None
    for v in range(3, vocab):
        hits = free == v
        rows = hits.any(1)
        firsts = torch.where(rows, hits.float().argmax(1), torch.full_like(rows, max_len, dtype=torch.long))
        key = (int(rows.sum()), len(set(firsts.tolist())), -int(firsts.max()))
        if best_key is None or key > best_key:
            best, best_key = v, key
    return best


BOS_ID = 1
GREEDY = dict(mistakes=GREEDY_MISTAKES)
MODEL = dict(src_vocab=9, tgt_vocab=12, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_len=32)


def _lively(m):
    """Random weights make a deep post-LN stack collapse: every position ends with nearly the same
    vector, and greedy decoding repeats one token. Smaller sub-layer outputs and biases, LayerNorm
    gains near 1 and smaller target embeddings keep positions, rows and the prefix apart."""
    model = m.module
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.mul_(0.1)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.3 * p)
        for mod in model.modules():
            if isinstance(mod, ref.MultiHeadAttention):
                mod.W_o.weight.mul_(0.5)
            if isinstance(mod, ref.FeedForward):
                mod.linear2.weight.mul_(0.2)
        model.tgt_embed.weight.mul_(0.3)
        model.out.weight.mul_(3.0)
    m.state = {n: p.detach().clone() for n, p in model.named_parameters()}
    return m


def greedy_case(t, cfg, shape, max_len, draw, how="staggered", mask_lengths=None, dtype=None):
    """A model, a source batch, an eos id and a source mask for one greedy-decoding probe.

    Random models often decode one token over and over, which tells few mistakes apart;
    ``draw`` picks, among the builder's successive random models, one whose decoding is
    varied. The draws were chosen once, offline; the chapter's reference tests check
    that the cases together tell every mistake in GREEDY_MISTAKES from the reference.
    """
    for _ in range(draw + 1):
        m = _lively(t.model("Transformer", cfg, dtype=dtype))
        src = t.randint(0, cfg["src_vocab"], shape)
    mask = None if mask_lengths is None else _padding(mask_lengths, shape[1])
    return m, src, _eos_for(m, src, max_len, mask, how), mask


def _encodes_once(probe, calls):
    """How greedy_decode used the model (the kernel's record of its calls): encode once per source row."""
    if calls is None:
        return None
    if any(c["method"] == "forward" for c in calls):
        return ("greedy_decode calls the model itself (model(...), its forward), which runs the encoder again "
                "at every step: use only model.encode, once before the loop, then model.decode and model.out")
    rows = sum(c["rows"] or 0 for c in calls if c["method"] == "encode")
    if rows > probe.args[1].shape[0]:
        return ("the encoder runs at every step: the memory does not change while the target grows, so call "
                "model.encode once, before the loop")
    return None


def _greedy_probe(t, case, max_len, label):
    m, src, eos, mask = case
    kwargs = {} if mask is None else dict(src_mask=mask)
    return t.function("greedy_decode", m, src, max_len, BOS_ID, eos, label=label,
                      equivalent=_same_up_to_eos(eos), call_checks=[_encodes_once], **kwargs, **GREEDY)


# Each case: its label, the model config, the source shape, max_len, keyword arguments of greedy_case.
GREEDY_CASES = [
    dict(label="no row produces eos_id: max_len steps", cfg=MODEL, shape=(3, 5), max_len=6,
         how=dict(draw=0, how="absent")),
    dict(label="one row, stops at its eos_id", cfg=MODEL, shape=(1, 4), max_len=8, how=dict(draw=0)),
    dict(label="four rows that end at different steps", cfg=MODEL, shape=(4, 6), max_len=10, how=dict(draw=3)),
    dict(label="3 layers, a padded source with src_mask", cfg=dict(MODEL, num_layers=3, d_model=8, d_ff=16),
         shape=(3, 6), max_len=9, how=dict(draw=1, mask_lengths=[6, 4, 2])),
    dict(label="a float64 model, two rows", cfg=dict(MODEL, tgt_vocab=10), shape=(2, 3), max_len=7,
         how=dict(draw=5, dtype=torch.float64)),
    dict(label="max_len = 1", cfg=MODEL, shape=(3, 5), max_len=1, how=dict(draw=0, how="absent")),
]


@hidden.test("test_greedy_decode")
def _(t):
    for case in GREEDY_CASES:
        _greedy_probe(t, greedy_case(t, case["cfg"], case["shape"], case["max_len"], **case["how"]),
                      case["max_len"], case["label"])
