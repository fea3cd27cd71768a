# %% [markdown]
# # Chapter 1: From sequence-to-sequence to attention
#
# In 2014 the best neural translation systems read a sentence with one recurrent
# network and wrote the translation with a second one. Everything the second network
# knew about the input had passed through a single vector handed over between the two.
# This chapter measures what that costs, and then builds the repair that Bahdanau, Cho
# and Bengio proposed in *Neural Machine Translation by Jointly Learning to Align and
# Translate*: before it writes each word, the decoder looks back at **all** the encoder's
# states and decides which of them to read. That look-back is attention. The rest of the
# course keeps the look-back and, from Chapter 2 on, throws the recurrent networks away.
#
# **Learning goals.** After this chapter you can
#
# - describe an encoder-decoder model, point to its fixed context vector, and show by
#   measurement how its accuracy falls as inputs grow longer;
# - compute alignment scores in three ways (dot, general, additive), turn them into
#   attention weights with a softmax that respects padding, and form the context vector;
# - write one step of Bahdanau's attention decoder, knowing which state asks the
#   question and where the answer goes;
# - train a small attention model on a CPU in well under a minute, compare it with the
#   same model without attention, and read the alignment it learned;
# - explain, and measure, why gradients fade along a long recurrent path and how
#   attention gives every output a short path to every input;
# - say what attention did *not* fix: recurrent networks compute one step after
#   another, which is the starting point of Chapter 2.
#
# **Prerequisites.** None from this course: this is the first chapter. You should be
# comfortable with Python and PyTorch tensors (shapes, broadcasting, `nn.Module`, a
# training loop with a loss and an optimiser), and know what a recurrent network
# (an RNN or a GRU) computes at each step. The maths is matrix products and the
# softmax.
#
# **Time.** About 2.5 hours: an hour and a half for reading and the four exercises,
# the rest for the experiments and the questions. The whole notebook runs on a laptop
# CPU in two to three minutes; the longest cell trains two small models on dates.
#
# **What you will build.** Four pieces, each checked by tests:
#
# | exercise | what it does | difficulty | points |
# |---|---|---|---|
# | `masked_softmax(scores, mask=None)` | a softmax over the last dimension that gives masked positions a weight of exactly 0 | ★ | 3 |
# | `dot_score(query, keys)` | Luong's dot-product alignment scores for a batch | ★ | 2 |
# | `AdditiveAttention(query_dim, key_dim, hidden_dim)` | Bahdanau's scores $v_a^\top \tanh(W_a s + U_a h_j)$, weights and context | ★★ | 3 |
# | `BahdanauDecoder.forward_step(...)` | one step of a GRU decoder that attends before it updates its state | ★★ | 3 |

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
# The models of this chapter are tiny: a second thread gains nothing and, on a machine
# shared with other programs, can make training several times slower.
torch.set_num_threads(1)

# %% [name=text_width tags=hide-input]
import unicodedata


def pad_to(text, width, align="<"):
    """TEXT with spaces up to WIDTH columns of a fixed-width font, in which a Chinese
    character takes two: f"{text:10s}" counts characters, and a table's columns go uneven."""
    text = str(text)
    columns = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    spaces = " " * max(0, width - columns)
    return spaces + text if align == ">" else text + spaces

# %% [markdown]
# ## 1. Sequence to sequence, and its bottleneck
#
# Translating a sentence, summarising a paragraph and rewriting a date all map one
# sequence to another of a different length, with no fixed position-to-position
# correspondence between them. The *encoder-decoder* (Sutskever, Vinyals and Le 2014;
# Cho et al. 2014) handles this with two recurrent networks. The **encoder** reads the
# input $x_1, \dots, x_T$ one symbol at a time and updates its state,
#
# $$h_j = f(x_j,\ h_{j-1}), \qquad j = 1, \dots, T .$$
#
# When it has read everything, a summary $c$ of the input is taken from its states,
# typically the last one. The **decoder** then writes the output one symbol at a time.
# Its own state $s_i$ starts from $c$ and is updated from the symbol it wrote last (the
# start symbol $y_0$ at first) and, in Cho et al.'s version, from $c$ again at every step:
#
# $$s_i = g(s_{i-1},\ y_{i-1},\ c), \qquad
# p(y_i \mid y_{<i}, x) = \mathrm{softmax}\big(W_o\,[s_i; c] + b_o\big).$$
#
# Here $f$ and $g$ are GRU cells and $[a; b]$ is concatenation. Look at what $c$ is: a
# vector of a fixed size, chosen before training, whether the input has 5 symbols or 500.
# All the decoder ever learns about the input has to fit through it. This is the
# **bottleneck** of the plain encoder-decoder.
#
# ### The task: writing dates the ISO way
#
# We need a task small enough to train on a laptop CPU in seconds, with outputs a person
# can check by eye. Date normalisation fits: the input is a date written the way people
# write dates, the output is the same date in ISO 8601 form,
#
# $$\text{"Saturday, 21 November 2026"} \ \longrightarrow\ \text{"2026-11-21"} .$$
#
# It is a real sequence-to-sequence problem in miniature. The model must *reorder* (the
# year comes first in the output but last in most inputs), *look things up* ("Nov" means
# 11), *pad* ("3" becomes "03") and *ignore* words that carry no information here (the
# weekday). Python's `datetime` gives us unlimited correct examples: we draw a day between
# 1900 and 2099 and write it in one of nine formats. The 2,000 days kept for testing are
# never seen in training, in any format.

# %% [name=date_task tags=hide-input]
MONTHS = ["January", "February", "March", "April", "May", "June", "July",
          "August", "September", "October", "November", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def ordinal(n):
    """1 -> '1st', 2 -> '2nd', 11 -> '11th', 23 -> '23rd'."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


FORMATS = [
    lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year}",
    lambda d: f"{MONTHS[d.month - 1][:3]} {d.day}, {d.year}",
    lambda d: f"{WEEKDAYS[d.weekday()]}, {d.day} {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{WEEKDAYS[d.weekday()][:3]} {MONTHS[d.month - 1][:3]} {d.day:02d} {d.year}",
    lambda d: f"the {ordinal(d.day)} of {MONTHS[d.month - 1]} {d.year}",
    lambda d: f"{d.day:02d}/{d.month:02d}/{d.year}",
    lambda d: f"{d.day}.{d.month}.{d.year}",
]

FIRST_DAY = datetime.date(1900, 1, 1)
NUM_DAYS = (datetime.date(2099, 12, 31) - FIRST_DAY).days + 1   # 73,049 days
all_days = list(range(NUM_DAYS))
random.Random(0).shuffle(all_days)
test_days, train_days = all_days[:2000], all_days[2000:]

# Vocabularies: index 0 pads in both; the target side also has start and end symbols.
PAD, BOS, EOS = 0, 1, 2
SRC_ITOS = ["<pad>"] + sorted(set("".join(MONTHS + WEEKDAYS) + "0123456789 ,./" + "the of st nd rd th"))
SRC_STOI = {ch: i for i, ch in enumerate(SRC_ITOS)}
TGT_ITOS = ["<pad>", "<bos>", "<eos>"] + list("0123456789-")
TGT_STOI = {ch: i for i, ch in enumerate(TGT_ITOS)}


def date_pairs(days, rng):
    """(human-written date, ISO date) for each day number, each in a random format."""
    pairs = []
    for k in days:
        d = FIRST_DAY + datetime.timedelta(days=k)
        pairs.append((rng.choice(FORMATS)(d), d.isoformat()))
    return pairs


def encode_pairs(pairs):
    """Pad a list of (source, target) strings into id tensors.

    Returns src (B, T) with PAD after each string, and tgt (B, 12) = BOS, 10 characters, EOS.
    """
    T = max(len(s) for s, _ in pairs)
    src = torch.full((len(pairs), T), PAD, dtype=torch.long)        # (B, T)
    for b, (s, _) in enumerate(pairs):
        src[b, :len(s)] = torch.tensor([SRC_STOI[ch] for ch in s])
    tgt = torch.tensor([[BOS] + [TGT_STOI[ch] for ch in t] + [EOS] for _, t in pairs])  # (B, 12)
    return src, tgt


test_src, test_tgt = encode_pairs(date_pairs(test_days, random.Random(1)))   # the held-out dates

# %%
example = datetime.date(2026, 11, 21)
for fmt in FORMATS:
    print(f"{fmt(example):30s} -> {example.isoformat()}")
print(f"\n{len(SRC_ITOS)} source symbols, {len(TGT_ITOS)} target symbols, "
      f"{len(train_days):,} training days, {len(test_days):,} held-out days")
print("held-out batch:", tuple(test_src.shape), tuple(test_tgt.shape))

# %% [markdown]
# ### An encoder that reads in both directions
#
# Our encoder is the one Bahdanau et al. used: a *bidirectional* GRU. One GRU reads the
# characters left to right, a second one right to left, and position $j$ is described by
# both of their states side by side,
#
# $$h_j = [\overrightarrow{h}_j;\ \overleftarrow{h}_j] \in \mathbb{R}^{2H}.$$
#
# So $h_j$ is about character $j$ *and* what surrounds it on both sides; the paper calls
# these vectors *annotations*. A batch holds strings of different lengths padded with
# `<pad>`. PyTorch's packed sequences let the GRUs skip the padding, so the states of a
# short string are exactly what they would be without it, and a boolean `mask` of shape
# $(B, T)$ records which positions are real characters.
#
# For a model *without* attention the input's summary is
# $c = [\overrightarrow{h}_T;\ \overleftarrow{h}_1]$: the forward GRU after the last real
# character and the backward GRU after the first, each having read the whole string.
# Both models start their decoder from $s_0 = \tanh(W_s\, c)$.

# %% [tags=hide-input]
class Encoder(nn.Module):
    """Embedding and a bidirectional GRU over padded character ids."""

    def __init__(self, vocab_size, embed_dim, hidden_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        self.gru = nn.GRU(embed_dim, hidden_dim, batch_first=True, bidirectional=True)

    def forward(self, src, mask):
        B, T = src.size()
        lengths = mask.sum(dim=1)                                   # (B,) real characters
        x = self.embedding(src)                                     # (B, T, E)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.gru(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=T)
        return out                                                  # (B, T, 2H), zeros at padding


def sentence_summary(enc_outputs, enc_mask):
    """The fixed context c = [forward state at the last real position; backward state at position 0]."""
    B, T, D = enc_outputs.size()
    H = D // 2
    lengths = enc_mask.sum(dim=1)                                   # (B,)
    forward_last = enc_outputs[torch.arange(B), lengths - 1, :H]    # (B, H)
    backward_first = enc_outputs[:, 0, H:]                          # (B, H)
    return torch.cat([forward_last, backward_first], dim=-1)        # (B, 2H)


# %% [markdown]
# ### The decoder without attention
#
# The decoder runs one step per output symbol, so we write that step as a method,
# `forward_step(token, state, enc_outputs, enc_mask)`, which returns the logits for the
# next symbol, the new state, and attention weights (here `None`: there are none). It
# feeds $[E y_{i-1};\ c]$ into a `GRUCell` and predicts from $[s_i;\ c]$. The attention
# decoder you will write in Section 3 has the same signature and the same layers plus an
# attention module. The two models differ in exactly one place: where the context comes
# from.
#
# `Seq2Seq` holds the encoder, the bridge $W_s$ and a decoder, and runs the decoder step
# by step. During training it uses *teacher forcing*: the input at step $i$ is the
# correct previous symbol, not the model's own guess, so all steps get a useful learning
# signal from the start. `generate` decodes greedily, feeding back its own argmax.

# %% [tags=hide-input]
class FixedContextDecoder(nn.Module):
    """One decoder step of a plain encoder-decoder: the same context c at every step."""

    def __init__(self, vocab_size, embed_dim, enc_dim, hidden_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.gru = nn.GRUCell(embed_dim + enc_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + enc_dim, vocab_size)

    def forward_step(self, token, state, enc_outputs, enc_mask=None):
        context = sentence_summary(enc_outputs, enc_mask)                     # (B, enc_dim)
        embedded = self.embedding(token)                                      # (B, embed_dim)
        new_state = self.gru(torch.cat([embedded, context], dim=-1), state)  # (B, hidden_dim)
        logits = self.out(torch.cat([new_state, context], dim=-1))           # (B, vocab)
        return logits, new_state, None


class Seq2Seq(nn.Module):
    """Encoder, bridge s_0 = tanh(W_s c), and any decoder with a forward_step method."""

    def __init__(self, src_vocab, decoder, embed_dim, enc_hidden, hidden_dim):
        super().__init__()
        self.encoder = Encoder(src_vocab, embed_dim, enc_hidden)
        self.bridge = nn.Linear(2 * enc_hidden, hidden_dim)
        self.decoder = decoder

    def encode(self, src):
        mask = src != PAD                                                    # (B, T) True = real character
        enc_outputs = self.encoder(src, mask)                                # (B, T, 2H)
        state = torch.tanh(self.bridge(sentence_summary(enc_outputs, mask)))  # (B, hidden_dim)
        return enc_outputs, mask, state

    def forward(self, src, tgt_in):
        """Teacher forcing: tgt_in (B, L) holds the correct previous symbols; returns (B, L, vocab)."""
        enc_outputs, mask, state = self.encode(src)
        logits = []
        for i in range(tgt_in.size(1)):
            step_logits, state, _ = self.decoder.forward_step(tgt_in[:, i], state, enc_outputs, mask)
            logits.append(step_logits)                                       # (B, vocab)
        return torch.stack(logits, dim=1)                                    # (B, L, vocab)

    @torch.no_grad()
    def generate(self, src, steps):
        """Greedy decoding: ids (B, steps) and attention weights (B, steps, T) or None."""
        enc_outputs, mask, state = self.encode(src)
        token = torch.full((src.size(0),), BOS, dtype=torch.long)            # (B,)
        tokens, weights = [], []
        for _ in range(steps):
            step_logits, state, w = self.decoder.forward_step(token, state, enc_outputs, mask)
            token = step_logits.argmax(dim=-1)                               # (B,)
            tokens.append(token)
            weights.append(w)
        attn = torch.stack(weights, dim=1) if weights[0] is not None else None
        return torch.stack(tokens, dim=1), attn


def train(model, next_batch, steps, evaluate=None, every=25, lr=3e-3):
    """Adam with teacher forcing; returns [(step, evaluate(model)), ...] every `every` steps."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    curve = []
    for step in range(1, steps + 1):
        src, tgt = next_batch()                                              # (B, T), (B, L+1)
        logits = model(src, tgt[:, :-1])                                     # (B, L, vocab)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if evaluate is not None and step % every == 0:
            curve.append((step, evaluate(model)))
    return curve


def exact_match(model, src, tgt):
    """Fraction of sequences whose greedy output equals the target exactly (EOS included)."""
    out, _ = model.generate(src, tgt.size(1) - 1)                            # (B, L)
    return (out == tgt[:, 1:]).all(dim=1).float().mean().item()


# %% [markdown]
# ### Measuring the bottleneck: copying digits
#
# How much does the fixed vector let through? Dates are too short to strain it, so we
# measure on the purest possible task: **copy** a string of random digits. A human finds
# this trivial, and for a network it is all memory: random digits cannot be compressed, so
# a string of length $L$ carries $L \log_2 10 \approx 3.3\,L$ bits, and every one of them
# has to pass through $c$. We train the plain encoder-decoder (embeddings of 32, a
# bidirectional encoder of $2 \times 64$, so $c$ has 128 numbers, decoder state 128) for
# 250 steps on batches of 64 strings of lengths 2 to 16, then score each length on 200
# fresh strings: the fraction of digits that come out right in the right place.

# %% [tags=hide-input]
COPY_MAX_LEN, COPY_STEPS, BATCH = 16, 250, 64
COPY_SIZES = dict(embed_dim=32, enc_hidden=64, hidden_dim=128)


def copy_batch(gen, n, lengths=None):
    """Random digit strings: src (B, T) with ids 1..10, tgt (B, T+2) = BOS, digits, EOS, PAD..."""
    if lengths is None:
        lengths = torch.randint(2, COPY_MAX_LEN + 1, (n,), generator=gen)   # (B,)
    T = int(lengths.max())
    digits = torch.randint(0, 10, (n, T), generator=gen)                     # (B, T)
    real = torch.arange(T)[None, :] < lengths[:, None]                       # (B, T)
    src = torch.where(real, digits + 1, PAD)                                 # source ids: 1..10
    body = torch.where(real, digits + 3, PAD)                                # target ids: 3..12
    tgt = torch.cat([torch.full((n, 1), BOS), body, torch.full((n, 1), PAD)], dim=1)  # (B, T+2)
    tgt[torch.arange(n), lengths + 1] = EOS
    return src, tgt


def copy_accuracy_by_length(model, lengths=range(2, COPY_MAX_LEN + 1, 2), n=200):
    gen = torch.Generator().manual_seed(2)
    accuracy = {}
    for L in lengths:
        src, tgt = copy_batch(gen, n, torch.full((n,), L))
        out, _ = model.generate(src, L)                                      # (n, L)
        accuracy[L] = (out == tgt[:, 1:L + 1]).float().mean().item()
    return accuracy


torch.manual_seed(0)
copy_fixed = Seq2Seq(11, FixedContextDecoder(13, 32, 128, 128), **COPY_SIZES)
copy_gen = torch.Generator().manual_seed(1)
started = time.perf_counter()
train(copy_fixed, lambda: copy_batch(copy_gen, BATCH), COPY_STEPS)
print(f"trained in {time.perf_counter() - started:.0f} s")
acc_fixed = copy_accuracy_by_length(copy_fixed)
print("length          " + "".join(f"{L:6d}" for L in acc_fixed))
print("digits correct  " + "".join(f"{a:6.2f}" for a in acc_fixed.values()))
glue("copy_fixed_6", 100 * acc_fixed[6], display=False)
glue("copy_fixed_16", 100 * acc_fixed[16], display=False)

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.plot(list(acc_fixed), list(acc_fixed.values()), "o-", label="fixed context (no attention)")
ax.axhline(0.1, color="gray", ls=":", label="chance (1 in 10)")
ax.set_xlabel("length of the digit string")
ax.set_ylabel("fraction of digits copied correctly")
ax.set_ylim(0, 1.05)
ax.set_title("Copying through a fixed vector")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Short strings come through intact. From about six digits on the accuracy slides
# steadily: {glue:text}`copy_fixed_6:.0f`% of the digits at length 6,
# {glue:text}`copy_fixed_16:.0f`% at length 16 (chance is 10%). More
# training or a larger $c$ would move the curve to the right but not change its shape:
# whatever its size, a fixed vector must hold more and more as the inputs grow. Cho et
# al. (2014) found the same in translation: the quality of a plain encoder-decoder
# falls quickly as sentences get longer, the observation that led to attention. (One
# honest caveat: with our small budget, part of the drop is also "not trained enough".
# Section 5 repeats this experiment with attention, on exactly the same budget.)
#
# ### Long paths, fading gradients
#
# The fixed vector has a second weakness, one that shows up during training rather than
# in the finished model. A network learns from gradients, and the gradient of the loss
# with respect to an early input has to travel back through every recurrent step
# between that input and the place where the loss is computed. Each step multiplies it
# by a Jacobian $\partial h_j / \partial h_{j-1}$. When these matrices tend to shrink
# vectors, as they do at initialisation and whenever the gates saturate, the product of
# $T - j$ of them shrinks exponentially with the distance. The early inputs then barely
# influence the updates, and the network struggles to learn long-range dependencies.
# Hochreiter (1991) and Bengio, Simard and Frasconi (1994) analysed this *vanishing
# gradient* problem; gated cells such as the LSTM and the GRU soften it, but do not
# remove the long path.
#
# Attention shortens the path. Its context $c = \sum_j \alpha_j h_j$ is a direct
# function of every encoder state, so the gradient reaches $h_j$, and from there input
# $x_j$, in one step, whatever the distance. We can measure the difference on a GRU at
# initialisation, reading a sequence of 64 random vectors. For each input position $j$
# we compute the size of the gradient $\|\partial y / \partial x_j\|$ of a scalar
# readout $y = u^\top c$ in two cases: $c = h_T$, the last state, as in a plain
# encoder-decoder (using one direction for simplicity), and $c$ the attention average of
# all states, with $h_T$ as the query.

# %% [tags=hide-input]
torch.manual_seed(0)
GRAD_T, GRAD_IN, GRAD_H = 64, 32, 64
grad_gru = nn.GRU(GRAD_IN, GRAD_H, batch_first=True)
grad_x = torch.randn(16, GRAD_T, GRAD_IN, requires_grad=True)     # (B, T, d_in)
grad_h, _ = grad_gru(grad_x)                                         # (B, T, H): states h_1..h_T
readout = torch.randn(GRAD_H)                                        # u: y = u . c


def input_gradient_norms(context):
    """Mean over the batch of ||dy/dx_j|| for every position j, with y = u . context."""
    (gx,) = torch.autograd.grad((context @ readout).sum(), grad_x, retain_graph=True)
    return gx.norm(dim=-1).mean(0)                                   # (T,)


fixed_context = grad_h[:, -1]                                        # (B, H): the last state
grad_scores = (grad_h @ fixed_context.unsqueeze(-1)).squeeze(-1) / math.sqrt(GRAD_H)   # (B, T)
attn_context = (torch.softmax(grad_scores, dim=-1).unsqueeze(1) @ grad_h).squeeze(1)   # (B, H)
grad_fixed = input_gradient_norms(fixed_context)
grad_attn = input_gradient_norms(attn_context)
glue("grad_fixed_ratio", (grad_fixed[-1] / grad_fixed[0]).item(), display=False)
glue("grad_attn_ratio", (grad_attn[-1] / grad_attn[0]).item(), display=False)
glue("grad_per_step", (grad_fixed[-1] / grad_fixed[0]).item() ** (1 / (GRAD_T - 1)), display=False)

fig, ax = plt.subplots(figsize=(5.5, 3.6))
positions = range(1, GRAD_T + 1)
ax.semilogy(positions, grad_fixed, label=r"fixed context $c = h_T$")
ax.semilogy(positions, grad_attn, label="attention over all states")
ax.set_xlabel("input position j (the readout is after position 64)")
ax.set_ylabel(r"mean $\|\partial y / \partial x_j\|$")
ax.set_title("Gradient reaching each input, GRU at initialisation")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Through the fixed context, the gradient reaching the last input is
# {glue:text}`grad_fixed_ratio:.1e` times the one reaching the first: on average each
# step back divides it by {glue:text}`grad_per_step:.2f`. Through attention the curve is
# flat; the last input gets {glue:text}`grad_attn_ratio:.1f` times the gradient of the
# first. Training changes the numbers but not the picture: a recurrent path of length
# $T - j$ against a path of length one. Chapter 2 takes the idea to its end, giving
# every position a direct path to every other.

# %% [markdown]
# ## 2. Attention: a new context for every output step
#
# Bahdanau et al.'s remedy is to stop summarising. Keep *all* the encoder states
# $h_1, \dots, h_T$ and, before each output step $i$, let the decoder build a fresh
# context $c_i$ from them, weighted by how useful each one is right now. Three steps:
#
# 1. **Alignment scores.** Compare the decoder's state with every encoder state:
#    $e_{ij} = a(s_{i-1}, h_j)$, a number that says how well input position $j$ matches
#    what the decoder needs for output $i$.
# 2. **Attention weights.** A softmax over the input positions turns scores into
#    positive weights that sum to one:
#
#    $$\alpha_{ij} = \frac{\exp(e_{ij})}{\sum_{k=1}^{T} \exp(e_{ik})} .$$
#
# 3. **Context.** The weighted average of the encoder states:
#
#    $$c_i = \sum_{j=1}^{T} \alpha_{ij}\, h_j .$$
#
# The context now changes from step to step, and the input can be as long as it likes:
# nothing has to be squeezed into one vector in advance. The weights $\alpha_{ij}$ also
# form a *soft alignment* between output and input positions, which we can look at.
#
# The diagram shows one step $t$ of the decoder we are going to build, with the shape of
# every tensor for a batch of $B$ inputs of length $T$: the bidirectional encoder's
# annotations $h_j$, the previous decoder state $s_{t-1}$ as the query, one score per
# input position, the softmax, the context, and the GRU update that produces $s_t$ and
# the prediction. Section 3 writes this step as code.

# %% [tags=hide-input]
ATTN_TEXT = dict(
    title="One decoder step with attention (Bahdanau et al., 2015)",
    inputs=["$x_1$", "$x_2$", "$x_3$", "$x_T$"], dots="…",
    input_label="input characters (B, T)",
    annotations=["$h_1$", "$h_2$", "$h_3$", "$h_T$"],
    encoder_label="bidirectional GRU:\nannotations $h_j = [\\overrightarrow{h}_j; \\overleftarrow{h}_j]$\n(B, T, 2H)",
    scores=["$e_{t1}$", "$e_{t2}$", "$e_{t3}$", "$e_{tT}$"],
    score_label="scores $e_{tj} = a(s_{t-1}, h_j)$\n(B, T)",
    query="query",
    softmax="softmax over j: weights $\\alpha_{tj}$  (B, T)",
    context="context $c_t = \\sum_j \\alpha_{tj} h_j$   (B, 2H)",
    values="values $h_j$",
    s_prev="previous state $s_{t-1}$\n(B, $d_s$)",
    embed="$E\\,y_{t-1}$\n(B, $d_e$)",
    gru="GRUCell$([E y_{t-1}; c_t],\\ s_{t-1})$\n$\\to$ new state $s_t$  (B, $d_s$)",
    out="logits $= W_o [s_t; c_t] + b_o$\n(B, V)",
    loop="$s_t$ is the $s_{t-1}$\nof the next step",
)


def draw_attention_decoder_diagram(text=ATTN_TEXT):
    fig, ax = plt.subplots(figsize=(11, 7.2))
    ax.set_xlim(-0.2, 13.4)
    ax.set_ylim(0, 9)
    ax.axis("off")
    colors = dict(io="#dcdcdc", enc="#f4c2c2", attn="#f6d8a8", ctx="#f3f1a7", dec="#bfe3c0", out="#c9d7f2")

    def box(x, y, w, h, label, color, size=9):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04",
                                    fc=color, ec="black", lw=0.8))
        ax.text(x, y, label, ha="center", va="center", fontsize=size)

    def arrow(x0, y0, x1, y1, color="black", style="-|>", ls="-", rad=0.0):
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle=style, mutation_scale=11,
                                     color=color, lw=1.0, ls=ls, connectionstyle=f"arc3,rad={rad}"))

    xs = [1.4, 2.7, 4.0, 5.8]
    y_in, y_h, y_e, y_q, y_sm, y_c, y_out = 0.5, 2.0, 3.6, 4.35, 5.3, 6.6, 8.0
    for j, x in enumerate(xs):
        box(x, y_in, 0.8, 0.5, text["inputs"][j], colors["io"])
        box(x, y_h, 0.8, 0.55, text["annotations"][j], colors["enc"])
        box(x, y_e, 0.8, 0.5, text["scores"][j], colors["attn"])
        arrow(x, y_in + 0.27, x, y_h - 0.3)
        arrow(x, y_h + 0.3, x, y_e - 0.27)
        arrow(x - 0.2, y_q, x - 0.2, y_e + 0.27, color="#1f5fa8")     # the query reaches every score
        arrow(x + 0.2, y_e + 0.27, x + 0.2, y_sm - 0.27)               # every score enters the softmax
    ax.text(4.9, y_in, text["dots"], ha="center", va="center", fontsize=12)
    ax.text(4.9, y_h, text["dots"], ha="center", va="center", fontsize=12)
    ax.text(4.9, y_e, text["dots"], ha="center", va="center", fontsize=12)
    for a, b in [(0, 1), (1, 2)]:                                      # the two GRU directions
        arrow(xs[a] + 0.42, y_h + 0.1, xs[b] - 0.42, y_h + 0.1)
        arrow(xs[b] - 0.42, y_h - 0.1, xs[a] + 0.42, y_h - 0.1)
    ax.text(6.6, y_in, text["input_label"], ha="left", va="center", fontsize=8.5)
    ax.text(6.6, y_h, text["encoder_label"], ha="left", va="center", fontsize=8.5)
    # query line from the previous decoder state across all scores
    box(10.0, y_q, 2.6, 0.75, text["s_prev"], colors["dec"])
    ax.plot([xs[0] - 0.2, 8.7], [y_q, y_q], color="#1f5fa8", lw=1.2)
    ax.text(7.4, y_q + 0.12, text["query"], color="#1f5fa8", fontsize=8.5, ha="center", va="bottom")
    ax.text(6.6, y_e, text["score_label"], ha="left", va="center", fontsize=8.5)
    # softmax and context
    box(3.6, y_sm, 5.2, 0.5, text["softmax"], colors["attn"])
    box(3.6, y_c, 5.2, 0.55, text["context"], colors["ctx"])
    arrow(3.6, y_sm + 0.27, 3.6, y_c - 0.3)
    # values: the annotations again, along the left edge
    ax.plot([xs[0] - 0.42, 0.3, 0.3], [y_h, y_h, y_c], color="gray", lw=1.0, ls="--")
    arrow(0.3, y_c, 1.0, y_c, color="gray")
    ax.text(0.2, (y_h + y_c) / 2, text["values"], rotation=90, color="gray", fontsize=8.5,
            ha="right", va="center")
    # decoder
    box(12.3, y_sm, 1.6, 0.7, text["embed"], colors["dec"])
    box(10.6, y_c, 4.0, 0.8, text["gru"], colors["dec"])
    box(10.6, y_out, 4.0, 0.7, text["out"], colors["out"])
    arrow(6.2, y_c, 8.6, y_c)                                           # context -> GRU input
    arrow(9.4, y_q + 0.38, 9.4, y_c - 0.4)                              # s_{t-1} -> GRU
    arrow(12.3, y_sm + 0.36, 12.3, y_c - 0.4)                           # embedding -> GRU
    arrow(10.6, y_c + 0.4, 10.6, y_out - 0.36)                          # s_t -> output
    ax.plot([3.6, 3.6, 7.9], [y_c + 0.3, y_out, y_out], color="black", lw=1.0)
    arrow(7.9, y_out, 8.6, y_out)                                       # c_t -> output
    ax.text(12.75, y_out - 0.75, text["loop"], fontsize=8, ha="center", va="center", color="#555555")
    ax.set_title(text["title"], fontsize=11)
    return fig


draw_attention_decoder_diagram()
plt.show()

# %% [markdown]
# ### Three ways to score
#
# | name | $e_{ij}$ | parameters | note |
# |---|---|---|---|
# | dot (Luong) | $s^\top h_j$ | none | needs $s$ and $h_j$ of the same size |
# | general (Luong) | $s^\top W_a h_j$ | $W_a$ | a learned bilinear form |
# | additive, or concat (Bahdanau) | $v_a^\top \tanh(W_a s + U_a h_j)$ | $W_a, U_a, v_a$ | a small network with one hidden layer |
#
# The additive score projects the decoder state and the encoder state into a common
# space of some size $d_a$, adds them, squashes with $\tanh$, and reads out one number
# with the vector $v_a$. It works for any two sizes and is the most flexible of the
# three; the dot score costs nothing and has no parameters.
#
# **Which decoder state asks?** Bahdanau et al. score with $s_{i-1}$, the state *before*
# step $i$, and feed the context into the GRU update that produces $s_i$. Luong, Pham
# and Manning (2015) first update the state and then score with the new $s_i$; their
# context is combined with $s_i$ to predict $y_i$ (and, with what they call input
# feeding, handed on to the next step). Both work, but they are different models, and
# mixing them up is a classic bug. This chapter follows Bahdanau.
#
# **Queries, keys and values.** Chapter 2 names the three roles in play. The decoder
# state is the **query**; the encoder states are scored as **keys** and averaged as
# **values**. Here keys and values are the same vectors $h_j$, but our functions take
# them as separate arguments, as every attention layer in this course does.
#
# **Padding.** In a batch, short inputs are padded to the length of the longest. A
# padded position is not part of the input and must get weight 0. A boolean mask of
# shape $(B, T)$ says which positions are real. The course uses the convention of
# PyTorch's `F.scaled_dot_product_attention`: **True means "may attend"**.

# %% [markdown]
# ### Exercise: a softmax with a mask
#
# Setting a score to $-\infty$ before the softmax gives its position a weight of
# $e^{-\infty} = 0$, and the softmax spreads the whole weight over the remaining
# positions, which still sum to one. (A large negative number such as $-10^9$ works just
# as well.) Zeroing the weights *after* the softmax would not: the rows would no longer
# sum to one.
#
# :::{dropdown} Hint: the PyTorch calls
# `scores.masked_fill(~mask, float("-inf"))` returns a copy of the scores with
# $-\infty$ wherever the mask is False; `torch.softmax(..., dim=-1)` then normalises
# over the last dimension. Note the `~`: `masked_fill` fills where its own mask is
# *True*, and our mask is True where attending is *allowed*. Do not use `masked_fill_`
# (with an underscore), which overwrites the caller's tensor.
# :::

# %% [exercise masked_softmax]
def masked_softmax(scores, mask=None):
    """Softmax over the last dimension of `scores`, giving masked positions weight 0.

    Args:
        scores: float tensor of shape (..., T), e.g. (B, T) alignment scores.
        mask:   optional bool tensor that broadcasts to the shape of `scores`,
                e.g. (B, T). True means the position MAY receive weight; where
                the mask is False the weight must be exactly 0, and the other
                weights along the last dimension must still sum to 1.

    Returns:
        weights, a tensor with the shape and dtype of `scores`.

    With mask=None this is an ordinary softmax over the last dimension. Do not
    modify `scores` or `mask` in place. You may assume every row keeps at least
    one allowed position.
    """
    ### BEGIN SOLUTION
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., T)
    return torch.softmax(scores, dim=-1)                    # (..., T)
    ### END SOLUTION


# %% [test test_masked_softmax_no_mask points=1]
"""Without a mask: an ordinary softmax over the LAST dimension, any leading dims, dtype kept."""
ms_scores = torch.tensor([[1.0, 2.0, 3.0],
                          [0.0, 0.0, 0.0]])
ms_w = masked_softmax(ms_scores)
assert isinstance(ms_w, torch.Tensor) and ms_w.shape == (2, 3), \
    f"weights must have the shape of the scores, (2, 3); got {getattr(ms_w, 'shape', ms_w)}"
assert not torch.allclose(ms_w, torch.softmax(ms_scores, dim=0)), \
    "softmax taken over dimension 0 (the batch): each row must be normalised over its own T positions (dim=-1)"
assert torch.allclose(ms_w.sum(-1), torch.ones(2)), "each row of weights must sum to 1: softmax over dim=-1"
assert torch.allclose(ms_w[1], torch.full((3,), 1 / 3)), "equal scores must give equal weights (1/3 each)"
assert torch.allclose(ms_w, torch.softmax(ms_scores, dim=-1)), f"expected softmax over the last dim, got\n{ms_w}"
torch.manual_seed(0)
ms_3d = torch.randn(2, 3, 4, dtype=torch.float64)
ms_3d_copy = ms_3d.clone()
ms_w3 = masked_softmax(ms_3d)
assert torch.equal(ms_3d, ms_3d_copy), "the scores were modified in place: return a new tensor"
assert ms_w3.dtype == torch.float64, f"dtype changed to {ms_w3.dtype}: keep the dtype of the scores"
assert torch.allclose(ms_w3, torch.softmax(ms_3d, dim=-1)), \
    "with 3-D scores (2, 3, 4) the softmax must run over the last dimension: use dim=-1, not dim=1"

# %% [test test_masked_softmax_mask points=1]
"""With a (B, T) mask: exactly 0 where the mask is False, the rest renormalised to sum to 1."""
mm_scores = torch.tensor([[0.5, 1.0, -0.3, 2.0],
                          [0.2, 0.1, 0.4, -1.0],
                          [1.0, 1.0, 1.0, 1.0]])
mm_mask = torch.tensor([[True, True, True, True],
                        [True, True, False, False],    # a sequence of length 2, padded to 4
                        [True, False, True, False]])
mm_mask_copy = mm_mask.clone()
mm_w = masked_softmax(mm_scores, mm_mask)
assert torch.equal(mm_mask, mm_mask_copy), "the mask was modified in place"
assert not torch.isnan(mm_w).any(), "NaN weights: is the mask polarity inverted? True means MAY attend"
assert (mm_w[~mm_mask] == 0).all(), \
    f"positions where the mask is False must get weight exactly 0 (True = may attend); got\n{mm_w}"
assert (mm_w[mm_mask] > 0).all(), \
    "an allowed (True) position got weight 0: is the mask polarity inverted? True means MAY attend"
assert torch.allclose(mm_w.sum(-1), torch.ones(3)), \
    "rows must still sum to 1: mask the scores BEFORE the softmax (fill with -inf), not the weights after it"
assert torch.allclose(mm_w[1, :2], torch.softmax(torch.tensor([0.2, 0.1]), dim=-1)), \
    "the allowed weights must be the softmax over the allowed scores only"
assert torch.allclose(mm_w[2], torch.tensor([0.5, 0.0, 0.5, 0.0])), "row 3 should be [0.5, 0, 0.5, 0]"
# A (B, 1, T) mask broadcasts over a middle dimension.
mm_w3 = masked_softmax(torch.zeros(2, 3, 4), torch.tensor([[True] * 4, [True, False] * 2]).unsqueeze(1))
assert mm_w3.shape == (2, 3, 4), "a mask that broadcasts to the scores must give weights with the scores' shape"
assert torch.allclose(mm_w3[1], torch.tensor([[0.5, 0, 0.5, 0]] * 3)), "a (B, 1, T) mask must apply to every row"

# %% [test test_masked_softmax_gradients points=1]
"""Gradients flow to the allowed scores, none to the masked ones, and float64 is kept."""
mg_scores = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
mg_mask = torch.tensor([[True, True, True, False, False],
                        [True, True, True, True, True],
                        [False, True, False, True, False]])
mg_w = masked_softmax(mg_scores, mg_mask)
assert mg_w.dtype == torch.float64, f"dtype changed to {mg_w.dtype}: keep the dtype of the scores"
(mg_w * torch.arange(5.0, dtype=torch.float64)).sum().backward()
assert mg_scores.grad is not None, \
    "no gradient reached the scores: keep everything in torch (no .detach(), .numpy(), .item())"
assert torch.isfinite(mg_scores.grad).all(), "non-finite gradient"
assert (mg_scores.grad[~mg_mask] == 0).all(), "masked scores must get zero gradient: they have no effect on the weights"
assert (mg_scores.grad[mg_mask].abs() > 0).any(), "the allowed scores must receive a gradient"

# %% [markdown]
# ### Exercise: the dot score
#
# For each example $b$ of the batch and each input position $t$, the dot score is
# `query[b] · keys[b, t]`. Compute all $B \times T$ of them at once, without a Python
# loop: one batched matrix product does it.
#
# :::{dropdown} Hint: one batched product
# View the query as a column, `query.unsqueeze(-1)` of shape $(B, d, 1)$; then
# `keys @ column` has shape $(B, T, 1)$, and you squeeze the last dimension away.
# Equivalent spellings are `torch.einsum("bd,btd->bt", query, keys)` and
# `(query.unsqueeze(1) * keys).sum(-1)`. Watch the `unsqueeze(1)` in the last one:
# multiplying `(B, d)` by `(B, T, d)` directly lines up the *batch* of the query with
# the *positions* of the keys.
# :::
#
# Luong's dot score is not scaled. Chapter 2 shows why Transformers divide it by
# $\sqrt{d}$.

# %% [exercise dot_score]
def dot_score(query, keys):
    """Luong's dot-product alignment scores.

    Args:
        query: tensor of shape (B, d), one decoder state per example.
        keys:  tensor of shape (B, T, d), T encoder states per example.

    Returns:
        scores of shape (B, T) with scores[b, t] = query[b] . keys[b, t]
        (a plain dot product: no scaling, no softmax).
    """
    ### BEGIN SOLUTION
    return (keys @ query.unsqueeze(-1)).squeeze(-1)  # (B, T, d) @ (B, d, 1) -> (B, T, 1) -> (B, T)
    ### END SOLUTION


# %% [test test_dot_score_values points=1]
"""A hand-checked example: scores are plain dot products, shape (B, T)."""
ds_query = torch.tensor([[1.0, 2.0]])                         # (B=1, d=2)
ds_keys = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-2.0, 1.0]]])  # (B=1, T=4, d=2)
ds = dot_score(ds_query, ds_keys)
assert isinstance(ds, torch.Tensor) and ds.shape == (1, 4), \
    f"scores must have shape (B, T) = (1, 4), got {getattr(ds, 'shape', ds)}"
assert not torch.allclose(ds, torch.tensor([[1.0, 2.0, 3.0, 0.0]]) / math.sqrt(2)), \
    "scores divided by sqrt(d): Luong's dot score is the plain dot product (the scaling comes in Chapter 2)"
assert not torch.allclose(ds.sum(-1), torch.ones(1)), \
    "the scores look like softmax weights: dot_score returns raw scores; the softmax comes later"
assert torch.allclose(ds, torch.tensor([[1.0, 2.0, 3.0, 0.0]])), f"expected [[1, 2, 3, 0]], got {ds}"

# %% [test test_dot_score_batch points=1]
"""A batch: each example scores its own query against its own keys; gradients flow; float64 kept."""
db_gen = torch.Generator().manual_seed(3)
db_query = torch.randn(3, 5, generator=db_gen, dtype=torch.float64, requires_grad=True)     # (B=3, d=5)
db_keys = torch.randn(3, 3, 5, generator=db_gen, dtype=torch.float64, requires_grad=True)   # (B=3, T=3, d=5)
db = dot_score(db_query, db_keys)
assert db.shape == (3, 3) and db.dtype == torch.float64, f"expected a float64 (3, 3) tensor, got {db.dtype} {tuple(db.shape)}"
db_pairing = (db_query.unsqueeze(0) * db_keys).sum(-1)
assert not torch.allclose(db, db_pairing), \
    "query t was paired with key t across the batch: use query.unsqueeze(1) so each example uses its own query"
db_expected = torch.einsum("bd,btd->bt", db_query, db_keys)
assert torch.allclose(db, db_expected), "scores[b, t] must be query[b] . keys[b, t]"
db.sum().backward()
assert db_query.grad is not None and db_keys.grad is not None, "gradients must reach the query and the keys"
assert torch.allclose(db_query.grad, db_keys.detach().sum(1)), "wrong gradient with respect to the query"
db_wide = dot_score(torch.randn(2, 4), torch.randn(2, 7, 4))
assert db_wide.shape == (2, 7), f"with B=2, T=7, d=4 the scores must be (2, 7), got {tuple(db_wide.shape)}"

# %% [markdown]
# A dot score is already a small attention mechanism. Below, the query points almost the
# same way as key 2, and `masked_softmax` turns the scores into weights. Key 2 gets the
# largest, {glue:text}`dot_w_near:.3f`, but key {glue:text}`dot_second` is close behind with
# {glue:text}`dot_w_second:.3f`: it points a less similar way (cosine
# {glue:text}`dot_cos_second:.2f` against {glue:text}`dot_cos_near:.2f`) but is longer
# (length {glue:text}`dot_len_second:.2f` against {glue:text}`dot_len_near:.2f`), and a dot
# score grows with a key's length as well as with its direction. The *general* score $s^\top W_a h_j$ is a dot score too, taken after the keys pass
# through a linear map: $s^\top (W_a h_j)$. It lets the query and the keys have different
# sizes.

# %%
torch.manual_seed(0)
keys = torch.randn(1, 5, 4)                          # (B, T, d)
query = keys[:, 2] + 0.3 * torch.randn(1, 4)         # (B, d): close to key 2
scores = dot_score(query, keys)                      # (B, T)
print("scores :", scores)
print("weights:", masked_softmax(scores))
dot_weights = masked_softmax(scores)[0]
second = dot_weights.argsort(descending=True)[1].item()   # the runner-up after key 2
cosine = F.cosine_similarity(query[:, None], keys, dim=-1)[0]
glue("dot_w_near", dot_weights[2].item(), display=False)
glue("dot_second", second, display=False)
glue("dot_w_second", dot_weights[second].item(), display=False)
glue("dot_cos_near", cosine[2].item(), display=False)
glue("dot_cos_second", cosine[second].item(), display=False)
glue("dot_len_near", keys[0, 2].norm().item(), display=False)
glue("dot_len_second", keys[0, second].norm().item(), display=False)
print("weights with positions 3, 4 masked:",
      masked_softmax(scores, torch.tensor([[True, True, True, False, False]])))

W_general = nn.Linear(4, 6, bias=False)              # maps keys of size 4 to the query size 6
state = torch.randn(1, 6)                            # (B, d_s = 6)
general = dot_score(state, W_general(keys))          # (B, T)
by_formula = torch.einsum("bs,sk,btk->bt", state, W_general.weight, keys)
print("general score = s^T W_a h_j:", torch.allclose(general, by_formula, atol=1e-6))

# %% [markdown]
# ### Exercise: additive attention
#
# Now Bahdanau's score, as a layer. Its three weight matrices are given as `nn.Linear`
# layers without bias: $W_a$ (`self.W_a`) for the query, $U_a$ (`self.U_a`) for the
# keys, $v_a$ (`self.v_a`) to read out one number. `nn.Linear` acts on the last
# dimension, so one call projects a whole batch. The shapes along the way:
#
# | quantity | shape |
# |---|---|
# | query $s$ (a decoder state) | $(B, d_q)$ |
# | keys $h_j$, values (encoder states) | $(B, T, d_k)$, $(B, T, d_v)$ |
# | $W_a s$ | $(B, d_a)$ |
# | $U_a h_j$, for every $j$ | $(B, T, d_a)$ |
# | scores $e_j = v_a^\top \tanh(W_a s + U_a h_j)$ | $(B, T)$ |
# | weights $\alpha_j$ | $(B, T)$ |
# | context $\sum_j \alpha_j\, \text{value}_j$ | $(B, d_v)$ |
#
# Use your `masked_softmax` for the weights.
#
# :::{dropdown} Hint: lining up the shapes
# $W_a s$ has no position axis: `unsqueeze(1)` makes it $(B, 1, d_a)$, which
# broadcasts against $U_a h$ of shape $(B, T, d_a)$. `self.v_a` then gives $(B, T, 1)$;
# squeeze the last dimension to get scores $(B, T)$. For the context,
# `weights.unsqueeze(1) @ values` is $(B, 1, T) @ (B, T, d_v) = (B, 1, d_v)$.
# :::

# %% [exercise AdditiveAttention]
class AdditiveAttention(nn.Module):
    """Bahdanau's additive attention: e_j = v_a^T tanh(W_a s + U_a h_j)."""

    def __init__(self, query_dim, key_dim, hidden_dim):
        super().__init__()
        self.W_a = nn.Linear(query_dim, hidden_dim, bias=False)
        self.U_a = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v_a = nn.Linear(hidden_dim, 1, bias=False)

    def forward(self, query, keys, values, mask=None):
        """Score every key against the query, then average the values.

        Args:
            query:  (B, d_q), e.g. the previous decoder state s_{i-1}.
            keys:   (B, T, d_k), e.g. the encoder states h_1..h_T.
            values: (B, T, d_v), the vectors to average (often the same as keys).
            mask:   optional bool (B, T), True where a position MAY be attended to.

        Scores: e[b, t] = v_a(tanh(W_a(query[b]) + U_a(keys[b, t]))), shape (B, T).
        Weights: masked_softmax(scores, mask) over the T positions, shape (B, T).
        Context: context[b] = sum_t weights[b, t] * values[b, t], shape (B, d_v).

        Returns:
            (context, weights) with shapes (B, d_v) and (B, T).
        """
        ### BEGIN SOLUTION
        B, T, _ = keys.size()
        q = self.W_a(query).unsqueeze(1)                         # (B, 1, d_a)
        k = self.U_a(keys)                                       # (B, T, d_a)
        scores = self.v_a(torch.tanh(q + k)).squeeze(-1)         # (B, T, 1) -> (B, T)
        weights = masked_softmax(scores, mask)                   # (B, T)
        context = (weights.unsqueeze(1) @ values).squeeze(1)     # (B, 1, T) @ (B, T, d_v) -> (B, d_v)
        return context, weights
        ### END SOLUTION


# %% [test test_AdditiveAttention_shapes points=1]
"""Shapes with d_q, d_k, d_v all different: context (B, d_v), weights (B, T) summing to 1."""
torch.manual_seed(0)
as_attn = AdditiveAttention(query_dim=5, key_dim=6, hidden_dim=4)
as_context, as_weights = as_attn(torch.randn(2, 5), torch.randn(2, 7, 6), torch.randn(2, 7, 3))
assert as_weights.shape == (2, 7), f"weights must be (B, T) = (2, 7), got {tuple(as_weights.shape)}"
assert as_context.shape == (2, 3), \
    f"context must be (B, d_v) = (2, 3), got {tuple(as_context.shape)}: it is a weighted sum of the VALUES over T"
assert torch.allclose(as_weights.sum(-1), torch.ones(2), atol=1e-6), \
    "each example's weights must sum to 1 over its T positions: softmax over the last dim, not over the batch"

# %% [test test_AdditiveAttention_values points=1]
"""Values: e = v_a(tanh(W_a(query) + U_a(keys))), weights = softmax(e), context = weights @ values."""
torch.manual_seed(1)
av_attn = AdditiveAttention(query_dim=4, key_dim=4, hidden_dim=8)
av_query, av_keys, av_values = torch.randn(3, 4), torch.randn(3, 6, 4), torch.randn(3, 6, 5)
av_context, av_weights = av_attn(av_query, av_keys, av_values)
with torch.no_grad():
    av_pre = av_attn.W_a(av_query)[:, None, :] + av_attn.U_a(av_keys)           # (B, T, d_a)
    av_expected_w = torch.softmax(av_attn.v_a(torch.tanh(av_pre)).squeeze(-1), dim=-1)
    av_no_tanh = torch.softmax(av_attn.v_a(av_pre).squeeze(-1), dim=-1)
    av_swapped = torch.softmax(av_attn.v_a(torch.tanh(
        av_attn.W_a(av_keys) + av_attn.U_a(av_query)[:, None, :])).squeeze(-1), dim=-1)
    av_batch = torch.softmax(av_attn.v_a(torch.tanh(av_pre)).squeeze(-1), dim=0)
assert not torch.allclose(av_weights, av_no_tanh, atol=1e-6), \
    "tanh missing: the score is v_a(tanh(W_a(query) + U_a(keys)))"
assert not torch.allclose(av_weights, av_swapped, atol=1e-6), \
    "W_a and U_a swapped: W_a projects the query (decoder state), U_a the keys (encoder states)"
assert not torch.allclose(av_weights, av_batch, atol=1e-6), \
    "softmax over the batch (dim 0): each example's weights are normalised over its own T positions"
assert torch.allclose(av_weights, av_expected_w, atol=1e-6), \
    "weights differ from softmax(v_a(tanh(W_a(query) + U_a(keys)))) over the last dimension"
assert torch.allclose(av_context, torch.einsum("bt,btd->bd", av_expected_w, av_values), atol=1e-6), \
    "weights are right but the context is not sum_t weights[b, t] * values[b, t]"

# %% [test test_AdditiveAttention_mask points=1]
"""A (B, T) padding mask: padded positions get weight 0 and their values cannot change the context."""
torch.manual_seed(2)
am_attn = AdditiveAttention(query_dim=3, key_dim=4, hidden_dim=5)
am_query, am_keys, am_values = torch.randn(2, 3), torch.randn(2, 5, 4), torch.randn(2, 5, 2)
am_mask = torch.tensor([[True, True, True, True, True],
                        [True, True, False, False, False]])     # second input has 2 real positions
am_context, am_weights = am_attn(am_query, am_keys, am_values, am_mask)
assert not torch.isnan(am_weights).any(), "NaN weights: is the mask polarity inverted? True means MAY attend"
assert (am_weights[1, 2:] == 0).all(), "padded positions (mask False) must get weight exactly 0: pass the mask on"
assert torch.allclose(am_weights.sum(-1), torch.ones(2), atol=1e-6), \
    "masked rows must still sum to 1: mask the scores before the softmax"
am_values2 = am_values.clone()
am_values2[1, 2:] = 100.0                                         # change only padded values
am_context2, _ = am_attn(am_query, am_keys, am_values2, am_mask)
assert torch.allclose(am_context, am_context2, atol=1e-5), "padded values must not affect the context"
_, am_unmasked = am_attn(am_query, am_keys, am_values)
assert torch.allclose(am_weights[0], am_unmasked[0], atol=1e-6), \
    "an all-True mask row must give the same weights as no mask"

# %% [markdown]
# ## 3. One decoder step with attention
#
# Everything is in place for Bahdanau's decoder. At step $i$ it holds its previous state
# $s_{i-1}$ and the symbol it wrote last, $y_{i-1}$, and does four things:
#
# $$
# \begin{aligned}
# (c_i,\ \alpha_i) &= \mathrm{Attention}(s_{i-1},\ H,\ H,\ \text{mask}) && \text{look at the input, with the previous state}\\
# x_i &= [E\,y_{i-1};\ c_i] && \text{embed the last symbol, append the context}\\
# s_i &= \mathrm{GRUCell}(x_i,\ s_{i-1}) && \text{update the state}\\
# \text{logits}_i &= W_o\,[s_i;\ c_i] + b_o && \text{predict the next symbol}
# \end{aligned}
# $$
#
# where $H = (h_1, \dots, h_T)$ are the encoder outputs, used as both keys and values.
# (The paper's output layer differs in detail: it mixes the state, the embedded
# previous symbol and the context through a maxout layer. A plain linear layer on
# $[s_i; c_i]$, as here, is the usual simplification.) Once your tests pass, Section 4
# trains a model built on your `forward_step`.
#
# | tensor | shape | size set by |
# |---|---|---|
# | `token` $y_{i-1}$ | $(B,)$ ids | |
# | `state` $s_{i-1}$ | $(B, d_s)$ | `hidden_dim` |
# | `enc_outputs` $H$ | $(B, T, d_h)$ | `enc_dim` |
# | embedded token $E\,y_{i-1}$ | $(B, d_e)$ | `embed_dim` |
# | context $c_i$, weights $\alpha_i$ | $(B, d_h)$, $(B, T)$ | |
# | GRU input $x_i = [E\,y_{i-1};\ c_i]$ | $(B, d_e + d_h)$ | |
# | new state $s_i$ | $(B, d_s)$ | |
# | logits | $(B, V)$ | `vocab_size` |
#
# The order inside each concatenation matters: the weights of `self.gru` and `self.out`
# expect the pieces in exactly the order of the formulas.
#
# :::{dropdown} Hint: the four lines
# `self.embedding(token)` embeds the last symbol; `self.attention(state, enc_outputs,
# enc_outputs, enc_mask)` returns the context and the weights (the previous state is the
# query, the encoder outputs are both keys and values); `self.gru(x, state)` with
# `x = torch.cat([embedded, context], dim=-1)` gives the new state; and
# `self.out(torch.cat([new_state, context], dim=-1))` the logits.
# :::

# %% [exercise BahdanauDecoder]
class BahdanauDecoder(nn.Module):
    """A GRU decoder with additive attention over the encoder outputs (Bahdanau et al., 2015)."""

    def __init__(self, vocab_size, embed_dim, enc_dim, hidden_dim, attn_dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.attention = AdditiveAttention(hidden_dim, enc_dim, attn_dim)
        self.gru = nn.GRUCell(embed_dim + enc_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + enc_dim, vocab_size)

    def forward_step(self, token, state, enc_outputs, enc_mask=None):
        """One decoding step.

        Args:
            token:       (B,) long, the previous output symbol y_{i-1}.
            state:       (B, hidden_dim), the previous decoder state s_{i-1}.
            enc_outputs: (B, T, enc_dim), the encoder states (keys and values).
            enc_mask:    optional bool (B, T), True at real (non-padding) positions.

        1. attend with the PREVIOUS state s_{i-1} as the query and enc_outputs
           as keys and values, passing enc_mask on: context (B, enc_dim),
           weights (B, T);
        2. new_state = GRU cell on [embedded token; context] (in this order),
           starting from the previous state;
        3. logits = output layer on [new_state; context] (in this order).

        Returns:
            (logits (B, vocab_size), new_state (B, hidden_dim), weights (B, T)).
        """
        ### BEGIN SOLUTION
        embedded = self.embedding(token)                                          # (B, d_e)
        context, weights = self.attention(state, enc_outputs, enc_outputs, enc_mask)  # (B, d_h), (B, T)
        new_state = self.gru(torch.cat([embedded, context], dim=-1), state)      # (B, d_s)
        logits = self.out(torch.cat([new_state, context], dim=-1))               # (B, V)
        return logits, new_state, weights
        ### END SOLUTION


# %% [test test_BahdanauDecoder_shapes points=1]
"""forward_step returns logits (B, vocab), new state (B, hidden_dim), weights (B, T) summing to 1."""
torch.manual_seed(0)
bs_dec = BahdanauDecoder(vocab_size=11, embed_dim=4, enc_dim=6, hidden_dim=5, attn_dim=3)
try:
    bs_out = bs_dec.forward_step(torch.tensor([1, 4]), torch.randn(2, 5), torch.randn(2, 7, 6))
except NotImplementedError:
    raise
except RuntimeError as err:
    raise AssertionError(
        "forward_step raised a shape error. self.gru expects cat([embedded, context]) of size "
        "embed_dim + enc_dim, and self.out expects cat([new_state, context]) of size "
        f"hidden_dim + enc_dim. The error was: {err}") from err
assert isinstance(bs_out, tuple) and len(bs_out) == 3, "forward_step must return (logits, new_state, weights)"
bs_logits, bs_state, bs_weights = bs_out
assert bs_logits.shape == (2, 11), f"logits must be (B, vocab_size) = (2, 11), got {tuple(bs_logits.shape)}"
assert bs_state.shape == (2, 5), f"new_state must be (B, hidden_dim) = (2, 5), got {tuple(bs_state.shape)}"
assert bs_weights.shape == (2, 7), f"weights must be (B, T) = (2, 7), got {tuple(bs_weights.shape)}"
assert torch.allclose(bs_weights.sum(-1), torch.ones(2), atol=1e-6), "the attention weights must sum to 1 over T"

# %% [test test_BahdanauDecoder_step points=1]
"""Values: attend with the PREVIOUS state, GRU on cat(embedded, context), logits from cat(new_state, context)."""
torch.manual_seed(1)
bv_dec = BahdanauDecoder(vocab_size=9, embed_dim=6, enc_dim=6, hidden_dim=6, attn_dim=4)
bv_token, bv_state, bv_enc = torch.tensor([3, 0, 8]), torch.randn(3, 6), torch.randn(3, 5, 6)
bv_logits, bv_new, bv_w = bv_dec.forward_step(bv_token, bv_state, bv_enc)
with torch.no_grad():
    bv_emb = bv_dec.embedding(bv_token)
    bv_ctx, bv_expected_w = bv_dec.attention(bv_state, bv_enc, bv_enc)
    bv_expected_new = bv_dec.gru(torch.cat([bv_emb, bv_ctx], -1), bv_state)
    bv_expected_logits = bv_dec.out(torch.cat([bv_expected_new, bv_ctx], -1))
    _, bv_w_from_new = bv_dec.attention(bv_expected_new, bv_enc, bv_enc)
assert not torch.allclose(bv_w, bv_w_from_new, atol=1e-6), \
    "attention computed from the NEW state: Bahdanau attends with the previous state s_{i-1}, before the GRU step"
assert torch.allclose(bv_w, bv_expected_w, atol=1e-6), \
    "weights differ from self.attention(state, enc_outputs, enc_outputs): the previous state is the query"
assert not torch.allclose(bv_new, bv_dec.gru(torch.cat([bv_ctx, bv_emb], -1), bv_state), atol=1e-6), \
    "GRU input in the wrong order: use torch.cat([embedded, context], dim=-1)"
assert not torch.allclose(bv_new, bv_dec.gru(torch.cat([bv_emb, bv_ctx], -1)), atol=1e-6), \
    "the GRU started from zeros: pass the previous state, self.gru(x, state)"
assert torch.allclose(bv_new, bv_expected_new, atol=1e-6), \
    "new_state differs from self.gru(cat([embedded, context]), state)"
assert not torch.allclose(bv_logits, bv_dec.out(torch.cat([bv_ctx, bv_expected_new], -1)), atol=1e-6), \
    "output layer input in the wrong order: logits = self.out(torch.cat([new_state, context], dim=-1))"
assert torch.allclose(bv_logits, bv_expected_logits, atol=1e-5), \
    "logits differ from self.out(cat([new_state, context])): predict from the NEW state and the context"

# %% [test test_BahdanauDecoder_mask points=1]
"""enc_mask reaches the attention: padded encoder positions get weight 0 and do not change the logits."""
torch.manual_seed(2)
bm_dec = BahdanauDecoder(vocab_size=7, embed_dim=3, enc_dim=4, hidden_dim=5, attn_dim=6)
bm_token, bm_state, bm_enc = torch.tensor([2, 5]), torch.randn(2, 5), torch.randn(2, 6, 4)
bm_mask = torch.tensor([[True] * 6, [True, True, True, False, False, False]])
bm_logits, bm_new, bm_w = bm_dec.forward_step(bm_token, bm_state, bm_enc, bm_mask)
assert (bm_w[1, 3:] == 0).all(), "padded positions got attention weight: pass enc_mask on to self.attention"
bm_enc2 = bm_enc.clone()
bm_enc2[1, 3:] = 50.0                                               # change only the padding
bm_logits2, bm_new2, _ = bm_dec.forward_step(bm_token, bm_state, bm_enc2, bm_mask)
assert torch.allclose(bm_logits, bm_logits2, atol=1e-5) and torch.allclose(bm_new, bm_new2, atol=1e-5), \
    "padded encoder outputs changed the result: the mask must hide them from the attention"
bm_logits.sum().backward()
for bm_name, bm_p in bm_dec.named_parameters():
    assert bm_p.grad is not None, f"{bm_name} received no gradient: is every layer used, without .detach()?"

# %% [markdown]
# ## 4. Training on dates, with and without attention
#
# Time to train. Both models get the same encoder, the same sizes (embeddings of 32, a
# bidirectional encoder of $2 \times 64$, a decoder state of 128; the attention layer
# works in $d_a = 64$), the same initial encoder, the same 300
# batches of 64 dates, and the same optimiser (Adam, learning rate $3 \cdot 10^{-3}$). The
# only difference is `BahdanauDecoder` (your code) against `FixedContextDecoder`. Every 25
# steps we measure exact-match accuracy on 500 of the held-out dates; at the end, on all
# 2,000 of them. Exact match means all ten characters right: "2026-11-12" for
# "2026-11-21" counts as wrong.

# %%
DATE_STEPS = 300
DATE_SIZES = dict(embed_dim=32, enc_hidden=64, hidden_dim=128)


def date_model(attention):
    torch.manual_seed(0)
    if attention:
        decoder = BahdanauDecoder(len(TGT_ITOS), embed_dim=32, enc_dim=128, hidden_dim=128, attn_dim=64)
    else:
        decoder = FixedContextDecoder(len(TGT_ITOS), embed_dim=32, enc_dim=128, hidden_dim=128)
    torch.manual_seed(1)   # same encoder and bridge for both models
    return Seq2Seq(len(SRC_ITOS), decoder, **DATE_SIZES)


def date_batches(seed):
    rng = random.Random(seed)
    return lambda: encode_pairs(date_pairs(rng.sample(train_days, BATCH), rng))


date_results = {}
for name, attention in [("attention", True), ("no attention", False)]:
    model = date_model(attention)
    started = time.perf_counter()
    curve = train(model, date_batches(seed=2), DATE_STEPS,
                  evaluate=lambda m: exact_match(m, test_src[:500], test_tgt[:500]))
    seconds = time.perf_counter() - started
    accuracy = exact_match(model, test_src, test_tgt)
    n_params = sum(p.numel() for p in model.parameters())
    date_results[name] = dict(model=model, curve=curve, seconds=seconds, accuracy=accuracy)
    print(f"{pad_to(name, 13)} {n_params:7,d} parameters   trained in {seconds:4.0f} s   "
          f"held-out exact match {accuracy:.2%}")
date_attn = date_results["attention"]["model"]
steps_to_99 = next((step for step, acc in date_results["attention"]["curve"] if acc >= 0.99), DATE_STEPS)
glue("date_steps_99", steps_to_99, display=False)
glue("date_examples_99", steps_to_99 * BATCH, display=False)
glue("date_acc_attn", 100 * date_results["attention"]["accuracy"], display=False)
glue("date_acc_plain", 100 * date_results["no attention"]["accuracy"], display=False)

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5.5, 3.6))
for name, marker in [("attention", "o-"), ("no attention", "s-")]:
    steps, accs = zip(*date_results[name]["curve"])
    ax.plot(steps, accs, marker, markersize=4, label=name)
ax.set_xlabel("training step (batches of 64)")
ax.set_ylabel("held-out exact match")
ax.set_ylim(0, 1.02)
ax.set_title("Learning to write ISO dates")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# With attention the model gets 99% of the monitored held-out dates right after
# {glue:text}`date_steps_99` steps ({glue:text}`date_examples_99:,d` examples), and ends
# at {glue:text}`date_acc_attn:.1f`% exact match on all 2,000. Without attention it
# learns too, but more slowly: at the end of the same budget it gets
# {glue:text}`date_acc_plain:.1f`% of the dates right. Dates are
# short, so the fixed vector is not yet the hard limit it was for long digit strings;
# what attention buys here is an easier learning problem. To write the day, the attention
# model can simply *look at* the day's digits, where the plain model must first learn to
# store them in $c$ and then to retrieve them from it. Attention costs time per step, since
# every output step now scores every input position, and the printed times show it.
#
# Some predictions of the attention model, on held-out dates:

# %%
show_src, show_tgt = encode_pairs(date_pairs(test_days[:8], random.Random(5)))
out, _ = date_attn.generate(show_src, 11)
for s, o in zip(show_src, out):
    text = "".join(SRC_ITOS[i] for i in s if i != PAD)
    pred = "".join(TGT_ITOS[i] for i in o if i > EOS)
    print(f"{text:30s} -> {pred}")

# %% [markdown]
# ## 5. What the model looks at
#
# At every output step the decoder produced a weight for every input character. Stacked
# up, these weights form a matrix with one row per output character and one column per
# input character: the *alignment* the model learned, without ever being told which
# characters correspond.

# %%
def alignment(model, text):
    """Greedy output string and attention weights (output chars, input chars) for one input."""
    src = torch.tensor([[SRC_STOI[ch] for ch in text]])                  # (1, T)
    out, weights = model.generate(src, 11)                               # (1, 11), (1, 11, T)
    chars = [TGT_ITOS[i] for i in out[0].tolist()]
    n = chars.index("<eos>") if "<eos>" in chars else len(chars)
    return chars[:n], weights[0, :n]                                     # (n, T)


held_out = [FIRST_DAY + datetime.timedelta(days=k) for k in test_days[10:13]]
examples = [FORMATS[4](held_out[0]), FORMATS[6](held_out[1]), FORMATS[7](held_out[2])]
aligned = [(text, *alignment(date_attn, text)) for text in examples]
for text, chars, _ in aligned:
    print(f"{text:30s} -> {''.join(chars)}")

# %% [tags=hide-input]
fig, axes = plt.subplots(len(aligned), 1, figsize=(9, 2.6 * len(aligned)), layout="constrained")
for ax, (text, chars, w) in zip(axes, aligned):
    im = ax.imshow(w, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(text)), list(text))
    ax.set_yticks(range(len(chars)), chars)
    ax.set_ylabel("output")
axes[-1].set_xlabel("input character")
fig.colorbar(im, ax=axes, label="attention weight", fraction=0.03)
fig.suptitle("Learned alignments on held-out dates")
plt.show()

# %% [markdown]
# Read each row as "while writing this output character, the model looked here". A few
# patterns stand out, and each one matches something about the task.
#
# - **The year** is copied digit by digit, and each year digit looks at (or right next
#   to) the matching input digit: a near-diagonal line, although the year sits at the
#   *end* of the input and the *start* of the output. Attention reorders for free.
# - **The month digits** look at the month's name, or at the month number in the
#   numeric format. Their weight is spread over the name rather than placed on its
#   first letter, which would not be enough: "A" could be April or August, "J"
#   January, June or July. A leading zero that the input does not contain (the "0" of
#   "08" for August) has nothing in particular to look at, and its row is spread thin.
# - **The day digits** find the day wherever the format puts it: after a weekday,
#   after "the", or at the very start, and read it digit by digit.
# - **Some characters look at nothing in particular.** The weekday gets little weight:
#   it is redundant given the date. The hyphens are always the same, and their rows are
#   often diffuse or parked on an arbitrary character, because the model does not need
#   the input to write them.
#
# Two cautions. The encoder is bidirectional, so $h_j$ already mixes in information from
# its neighbours, and a weight on character $j$ is not a proof that only character $j$
# was used. And attention weights show where the model *read*, not why it decided:
# treat heatmaps as a useful diagnostic, not as an explanation (Jain and Wallace, 2019,
# *Attention is not Explanation*, give examples where very different weights yield the
# same prediction).
#
# ### Back to the bottleneck
#
# Now the copy experiment of Section 1 again, with the same encoder, sizes, data and
# 250 steps, but with your `BahdanauDecoder`.

# %%
torch.manual_seed(0)
copy_attn = Seq2Seq(11, BahdanauDecoder(13, 32, 128, 128, 64), **COPY_SIZES)
copy_gen = torch.Generator().manual_seed(1)
started = time.perf_counter()
train(copy_attn, lambda: copy_batch(copy_gen, BATCH), COPY_STEPS)
print(f"trained in {time.perf_counter() - started:.0f} s")
acc_attn = copy_accuracy_by_length(copy_attn)
print(f"{pad_to('length', 16)}" + "".join(f"{L:6d}" for L in acc_attn))
print(pad_to("no attention", 16) + "".join(f"{a:6.2f}" for a in acc_fixed.values()))
print(pad_to("attention", 16) + "".join(f"{a:6.2f}" for a in acc_attn.values()))

# %% [tags=hide-input]
digits = "3141592653589793"
src = torch.tensor([[int(ch) + 1 for ch in digits]])                     # (1, 16)
out, w = copy_attn.generate(src, len(digits))                           # (1, 16), (1, 16, 16)
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1.2, 1]})
ax1.plot(list(acc_fixed), list(acc_fixed.values()), "s-", label="fixed context")
ax1.plot(list(acc_attn), list(acc_attn.values()), "o-", label="attention")
ax1.axhline(0.1, color="gray", ls=":", label="chance")
ax1.set_xlabel("length of the digit string")
ax1.set_ylabel("fraction of digits copied correctly")
ax1.set_ylim(0, 1.05)
ax1.set_title("Same budget, with and without attention")
ax1.legend()
ax2.imshow(w[0], cmap="viridis", vmin=0, vmax=1)
ax2.set_xticks(range(len(digits)), list(digits))
ax2.set_yticks(range(len(digits)), [str(i - 3) if i >= 3 else "?" for i in out[0].tolist()])
ax2.set_xlabel("input digit")
ax2.set_ylabel("output digit")
ax2.set_title("Copying pi: the alignment")
plt.tight_layout()
plt.show()

# %% [markdown]
# With attention the curve stays high across the lengths it was trained on, and the
# alignment for copying is what you would draw by hand: a diagonal, each output digit
# reading its own input digit. The decoder no longer has to remember the string; it only
# has to keep track of *where it is*, and look.

# %% [markdown]
# ## 6. What attention did not fix
#
# Attention removed the bottleneck between encoder and decoder, but the model is still
# built from recurrent networks, and they compute **one step after another**. The
# encoder's state $h_j$ needs $h_{j-1}$, which needs $h_{j-2}$, and so on: reading $T$
# characters takes $T$ dependent steps, however many processors are available. The only
# independent work a recurrent network can hand to parallel hardware is the other
# sequences of the batch, never the other positions of the same sequence.
#
# We can see this even on one CPU thread. A GRU with input and state of width $d$ does
# $6d^2$ multiply-adds per position (three gates, each reading the input and the
# previous state). A linear layer from $d$ to $6d$ features does exactly the same
# amount of arithmetic per position, but its positions do not depend on each other, so
# it can process all of them in one matrix product. We time both on sequences of 512
# positions, $d = 64$, for growing batch sizes, and report the time per position.

# %%
torch.manual_seed(0)
d, T = 64, 512
gru = nn.GRU(d, d, batch_first=True)     # 6 d^2 multiply-adds per position, T dependent steps
same_work = nn.Linear(d, 6 * d)          # 6 d^2 multiply-adds per position, no dependencies


def best_time(fn, repeats=3):
    fn()                                 # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


batch_sizes = [1, 4, 16, 64]
gru_us, linear_us = [], []
with torch.no_grad():
    for B in batch_sizes:
        x = torch.randn(B, T, d)         # (B, T, d)
        gru_us.append(best_time(lambda: gru(x)) / (B * T) * 1e6)
        linear_us.append(best_time(lambda: same_work(x)) / (B * T) * 1e6)
print(f"{pad_to('batch', 5, '>')}   {pad_to('GRU (us/position)', 17, '>')}   "
      f"{pad_to('linear layer (us/position)', 26, '>')}   {pad_to('ratio', 5, '>')}")
for B, g, l in zip(batch_sizes, gru_us, linear_us):
    print(f"{B:5d}   {g:17.3f}   {l:26.3f}   {g / l:5.1f}")
glue("gru_time_ratio_1", gru_us[0] / linear_us[0], display=False)
glue("gru_time_ratio_64", gru_us[-1] / linear_us[-1], display=False)

# %% [tags=hide-input]
fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.loglog(batch_sizes, gru_us, "s-", label="GRU: positions one after another")
ax.loglog(batch_sizes, linear_us, "o-", label="linear layer: all positions at once")
ax.set_xticks(batch_sizes, [str(B) for B in batch_sizes])
ax.xaxis.set_minor_formatter(plt.NullFormatter())
ax.set_xlabel("batch size (sequences of 512 positions)")
ax.set_ylabel("time per position (µs)")
ax.set_title(r"The same $6d^2$ multiply-adds per position")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# For a single sequence the GRU was {glue:text}`gru_time_ratio_1:.0f` times slower than the
# linear layer when this book was built, although both do the same arithmetic: 512
# small dependent steps leave most of the processor idle. A larger batch gives each step
# more independent work and the gap narrows (to a factor of
# {glue:text}`gru_time_ratio_64:.1f` at a batch of 64), but
# the batch is the recurrence's only source of parallelism. (Exact numbers depend on
# your machine; on a GPU, with thousands of cores waiting, the effect is far stronger.)
# A layer whose positions do not wait for each other can use all of them at once.
#
# Two more limits are worth naming. The decoder is sequential too: during training with
# teacher forcing all of its inputs are known in advance, yet step $i$ still waits for
# the state of step $i-1$. And attention only connects the *two* sequences: within the
# input, characters $j$ and $k$ still exchange information through $|j - k|$ steps of
# recurrence, a long path for information and for gradients alike.
#
# The next chapter asks the obvious question: if attention lets the decoder look at any
# input position directly, why not let every position of a sequence look at every other
# position the same way, and drop the recurrence altogether? That is self-attention.
#
# ## Check your understanding
#
# 1. The plain encoder-decoder of Section 1 copies short digit strings without
#    error. Why does making its context larger not solve the problem of long inputs?
#
#    :::{dropdown} Answer
#    Whatever its size, the context is fixed before training, while the information in
#    the input grows with its length: random digits carry about 3.3 bits each, all of
#    which must pass through $c$. A larger $c$ moves the point where accuracy falls, but
#    some longer input always needs more than it can hold. Attention keeps one vector
#    per input position, so the memory grows with the input.
#    :::
#
# 2. In `masked_softmax`, why must the masked scores be set to $-\infty$ *before* the
#    softmax, rather than the masked weights set to 0 after it?
#
#    :::{dropdown} Answer
#    After the softmax, the padded positions already took their share of the total
#    weight. Zeroing them leaves rows that sum to less than one, and the context is
#    shrunk by an amount that depends on the padding. With $-\infty$ before the softmax,
#    $e^{-\infty} = 0$ and the normalisation spreads all the weight over the real
#    positions.
#    :::
#
# 3. Bahdanau's decoder scores with $s_{i-1}$, Luong's with $s_i$. What does each of
#    them use the context for?
#
#    :::{dropdown} Answer
#    Bahdanau: the context, computed from the previous state, is part of the GRU's
#    input for the step that produces $s_i$, and of the output layer. Luong: the state
#    is updated first, without the new context; the context computed from $s_i$ is
#    combined with $s_i$ to predict $y_i$ and, with input feeding, passed on as an input
#    of the next step.
#    :::
#
# 4. Through how many recurrent steps must the gradient travel from the decoder's first
#    output back to the first input character, with a fixed context (unidirectional
#    encoder) and with attention? What did Section 1 measure about this?
#
#    :::{dropdown} Answer
#    With a fixed context $c = h_T$, through all $T - 1$ encoder steps after the first
#    character; with attention, the context is a direct function of $h_1$, which is one
#    step away from $x_1$. In the measurement at initialisation the gradient through the
#    fixed context fell exponentially with the distance, and through attention it stayed
#    flat.
#    :::

# %% [markdown]
# 5. The attention weights of the date model put little weight on the weekday. Does
#    that prove the model ignores the weekday?
#
#    *Written answer, graded by hand (2 points): answer in the cell below, in a few sentences.*

# %% [written written_weekday_weights points=2]
# ### BEGIN SOLUTION
# **Model answer.** No. The encoder is bidirectional, so every annotation $h_j$ carries
# information from its neighbours on both sides, possibly including the weekday: a small
# weight on the weekday's characters does not mean that none of the weekday's information
# reaches the decoder. An attention map shows where the decoder read, not which input
# information caused its decision.
#
# **Rubric (2 points).**
#
# - 1 point: no, and the reason is that an attention weight says where the decoder reads,
#   not which information its output depends on.
# - 1 point: names the route the weekday's information can still take: the bidirectional
#   encoder mixes it into the annotations of other positions (their $h_j$), which do get
#   weight.
# - 0 points for "yes", or for "no" with no reason.
# ### END SOLUTION

# %% [markdown]
# ## Challenges (optional, not graded)
#
# - **Luong's input feeding.** Write a `LuongDecoder` with the same `forward_step`
#   signature: update the GRU state first from $[E y_{i-1}; \tilde{h}_{i-1}]$, score
#   with the new state $s_i$ (dot or general score), and compute the *attentional
#   state* $\tilde{h}_i = \tanh(W_c [c_i; s_i])$, which predicts $y_i$ and is fed to the
#   next step's input. The state becomes a pair $(s_i, \tilde{h}_i)$. Train it with the
#   same budget on dates and on the copy task; compare with Bahdanau's decoder.
# - **Longer copies.** Train both copy models on lengths 2 to 16 and test them on
#   lengths 17 to 32. Which one generalises beyond the lengths it has seen, and what do
#   its alignments look like there?
# - **Scores compared.** Replace the additive score by the dot and the general score
#   (the encoder states have 128 numbers, the decoder state too, so the dot score
#   works). Which one learns the dates fastest on this budget?
# - **Gradients after training.** Repeat the gradient measurement of Section 1 on the
#   trained encoders of the copy models. Has training changed the decay through the
#   fixed context?
#
# ## Summary
#
# - A plain encoder-decoder passes the whole input through one fixed-size vector $c$.
#   On a copy task its accuracy falls steadily with the input length.
# - Gradients that travel through many recurrent steps shrink: at initialisation, the
#   gradient reaching early inputs through the last state was smaller by many orders of
#   magnitude, while through attention every input got a comparable share.
# - Attention builds a new context for every output step: scores
#   $e_{ij} = a(s_{i-1}, h_j)$, weights $\alpha_{ij} = \mathrm{softmax}_j(e_{ij})$,
#   context $c_i = \sum_j \alpha_{ij} h_j$.
# - Scores can be a dot product $s^\top h_j$, a bilinear form $s^\top W_a h_j$, or
#   Bahdanau's additive $v_a^\top \tanh(W_a s + U_a h_j)$, which works for any sizes.
# - Padding is masked *before* the softmax (True = may attend), so masked positions get
#   weight exactly 0 and the rest still sum to 1.
# - Bahdanau's decoder attends with the previous state $s_{i-1}$, feeds
#   $[E y_{i-1}; c_i]$ to its GRU, and predicts from $[s_i; c_i]$.
# - On dates, attention reaches {glue:text}`date_acc_attn:.1f`% held-out exact match
#   on the budget where the same model without it reaches
#   {glue:text}`date_acc_plain:.1f`%, and its weights show a readable alignment.
# - Recurrent networks remain sequential along the sequence; attention itself is a
#   handful of matrix products. Chapter 2 keeps only the attention.
#
# ## References
#
# - Bahdanau, D., Cho, K. and Bengio, Y. (2015). Neural Machine Translation by Jointly
#   Learning to Align and Translate. *ICLR 2015*. <https://arxiv.org/abs/1409.0473>
# - Luong, M.-T., Pham, H. and Manning, C. D. (2015). Effective Approaches to
#   Attention-based Neural Machine Translation. *EMNLP 2015*.
#   <https://arxiv.org/abs/1508.04025>
# - Cho, K., van Merriënboer, B., Gulcehre, C., Bahdanau, D., Bougares, F., Schwenk, H.
#   and Bengio, Y. (2014). Learning Phrase Representations using RNN Encoder-Decoder
#   for Statistical Machine Translation. *EMNLP 2014*. <https://arxiv.org/abs/1406.1078>
# - Cho, K., van Merriënboer, B., Bahdanau, D. and Bengio, Y. (2014). On the Properties
#   of Neural Machine Translation: Encoder-Decoder Approaches. *SSST-8 Workshop*.
#   <https://arxiv.org/abs/1409.1259>
# - Sutskever, I., Vinyals, O. and Le, Q. V. (2014). Sequence to Sequence Learning with
#   Neural Networks. *Advances in Neural Information Processing Systems 27*.
#   <https://arxiv.org/abs/1409.3215>
# - Hochreiter, S. (1991). *Untersuchungen zu dynamischen neuronalen Netzen*. Diploma
#   thesis, Technische Universität München.
#   <https://people.idsia.ch/~juergen/SeppHochreiter1991ThesisAdvisorSchmidhuber.pdf>
# - Bengio, Y., Simard, P. and Frasconi, P. (1994). Learning Long-Term Dependencies with
#   Gradient Descent is Difficult. *IEEE Transactions on Neural Networks* 5(2), 157–166.
#   <https://doi.org/10.1109/72.279181>
# - Pascanu, R., Mikolov, T. and Bengio, Y. (2013). On the Difficulty of Training
#   Recurrent Neural Networks. *ICML 2013*. <https://arxiv.org/abs/1211.5063>
# - Jain, S. and Wallace, B. C. (2019). Attention is not Explanation. *NAACL 2019*.
#   <https://arxiv.org/abs/1902.10186>
# - Olah, C. and Carter, S. (2016). Attention and Augmented Recurrent Neural Networks.
#   *Distill*. <https://distill.pub/2016/augmented-rnns/>
# - Alammar, J. (2018). Visualizing A Neural Machine Translation Model (Mechanics of
#   Seq2seq Models With Attention).
#   <https://jalammar.github.io/visualizing-neural-machine-translation-mechanics-of-seq2seq-models-with-attention/>
# - PyTorch tutorial: NLP From Scratch: Translation with a Sequence to Sequence Network
#   and Attention. <https://pytorch.org/tutorials/intermediate/seq2seq_translation_tutorial.html>

# %% [hidden]
import torch

import solutions.ch01_bahdanau_attention as ref
from autograder.hidden import HiddenTests, Mistake, close, rows_sum_to_one

# No PyTorch built-in computes these exercises, so there is nothing to forbid.
hidden = HiddenTests(ref, from_scratch=set(), inputs_kept={"masked_softmax"})  # its text: scores not changed
NEG_INF = float("-inf")


def _softmax(scores, mask=None, dim=-1, invert=False, after=False, fill=NEG_INF, zero_fill=False):
    """masked_softmax with one deliberate change, to recognise a common mistake."""
    if mask is not None and invert:
        mask = ~mask
    if mask is not None and zero_fill:
        scores = scores * mask
    elif mask is not None and not after:
        scores = scores.masked_fill(~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after:
        weights = weights * mask
    return weights


INVERTED = "mask polarity inverted: True means the position MAY be attended to"
AFTER = ("mask applied after the softmax: fill the masked scores with -inf before it, "
         "so the remaining weights still sum to 1")
ZERO_FILL = ("masked scores set to 0 instead of -inf: a score of 0 still gets weight exp(0) > 0; "
             "use scores.masked_fill(~mask, float('-inf'))")
IGNORED = "mask ignored: positions where the mask is False must get weight 0"
SOFTMAX_MISTAKES = [
    Mistake("softmax taken over dimension 0 (the batch): normalise each row over its own "
            "positions, the last dimension (dim=-1)", lambda s, mask=None: _softmax(s, mask, dim=0)),
    Mistake("softmax taken over dimension 1: use dim=-1 (the last dimension), so that any number "
            "of leading dimensions works", lambda s, mask=None: _softmax(s, mask, dim=1)),
    Mistake("softmax taken over dimension -2: the weights are normalised over the last dimension",
            lambda s, mask=None: _softmax(s, mask, dim=-2)),
    Mistake(INVERTED, lambda s, mask=None: _softmax(s, mask, invert=True)),
    # Inverting an all-True row masks it completely: -inf gives NaN, -1e9 uniform weights.
    Mistake(INVERTED, lambda s, mask=None: _softmax(s, mask, invert=True, fill=-1e9)),
    Mistake(AFTER, lambda s, mask=None: _softmax(s, mask, after=True)),
    Mistake(ZERO_FILL, lambda s, mask=None: _softmax(s, mask, zero_fill=True)),
    Mistake(IGNORED, lambda s, mask=None: _softmax(s, None)),
]


def _masked_weights_are_zero(probe, value):
    """Hint: masked positions carry weight."""
    mask = probe.kwargs.get("mask")
    if mask is None and len(probe.args) > 1:
        mask = probe.args[1]
    if isinstance(value, torch.Tensor) and value.is_floating_point() and mask is not None:
        try:
            leaked = (value.abs() * (~mask)).amax()
        except RuntimeError:
            return None
        if leaked > 1e-6:
            return "positions where the mask is False got a non-zero weight"
    return None


def _sums_to_one(probe, value):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        sums = value.sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-4):
            return "weights do not sum to 1 along the last dimension"
    return None


def _padding(lengths, T):
    """(B, T) bool, True at positions < length."""
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def _random_mask(t, B, T):
    """A random (B, T) mask whose every row keeps at least one position."""
    mask = t.rand_bool(B, T, p=0.6)
    mask[:, 0] = True
    return mask


MS = dict(mistakes=SOFTMAX_MISTAKES, checks=[_sums_to_one, _masked_weights_are_zero])


@hidden.test("test_masked_softmax_no_mask")
def _(t):
    t.function("masked_softmax", t.randn(4, 6) * 2, label="scores (4, 6)", **MS)
    t.function("masked_softmax", t.randn(2, 3, 5), label="scores (2, 3, 5)", **MS)
    t.function("masked_softmax", t.randn(3, 7, dtype=torch.float64), label="float64 scores (3, 7)", **MS)
    t.function("masked_softmax", t.randn(5, 5), label="square scores (5, 5)", **MS)


@hidden.test("test_masked_softmax_mask")
def _(t):
    t.function("masked_softmax", t.randn(4, 6), _padding([6, 3, 1, 5], 6),
               label="a (B, T) padding mask, lengths [6, 3, 1, 5]", **MS)
    t.function("masked_softmax", t.randn(3, 8), mask=_random_mask(t, 3, 8),
               label="a random (B, T) mask passed as mask=", **MS)
    t.function("masked_softmax", t.randn(2, 4, 6), _padding([6, 2], 6).unsqueeze(1),
               label="scores (2, 4, 6) with a (B, 1, T) mask", **MS)
    t.function("masked_softmax", t.randn(3, 5, dtype=torch.float64) * 3, _padding([2, 5, 4], 5),
               label="float64 scores with a padding mask", **MS)


@hidden.test("test_masked_softmax_gradients")
def _(t):
    t.function("masked_softmax", t.randn(4, 7), _padding([7, 5, 2, 6], 7), grad=True,
               label="gradients with a padding mask", **MS)
    t.function("masked_softmax", t.randn(2, 3, 6, dtype=torch.float64), _random_mask(t, 2, 6).unsqueeze(1),
               grad=True, label="float64 gradients, (B, 1, T) mask", **MS)


# %% [hidden]
DOT_MISTAKES = [
    Mistake("scores divided by sqrt(d): Luong's dot score is the plain dot product",
            lambda q, k: (k @ q.unsqueeze(-1)).squeeze(-1) / q.shape[-1] ** 0.5),
    Mistake("the scores went through a softmax: dot_score returns raw scores "
            "(the softmax is masked_softmax's job)",
            lambda q, k: torch.softmax((k @ q.unsqueeze(-1)).squeeze(-1), dim=-1)),
    Mistake("query t was paired with key t across the batch: (B, d) * (B, T, d) broadcasts the wrong way; "
            "use query.unsqueeze(1) so that example b uses its own query",
            lambda q, k: (q.unsqueeze(0) * k).sum(-1)),
]


@hidden.test("test_dot_score_values")
def _(t):
    t.function("dot_score", torch.tensor([[1.0, 2.0]]), torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]),
               mistakes=DOT_MISTAKES, label="the hand example")
    t.function("dot_score", t.randn(2, 4), t.randn(2, 6, 4), mistakes=DOT_MISTAKES, label="B=2, T=6, d=4")


@hidden.test("test_dot_score_batch")
def _(t):
    t.function("dot_score", t.randn(4, 3), t.randn(4, 4, 3), grad=True, mistakes=DOT_MISTAKES,
               label="B = T = 4, gradients too")
    t.function("dot_score", t.randn(3, 8, dtype=torch.float64), t.randn(3, 5, 8, dtype=torch.float64),
               grad=True, mistakes=DOT_MISTAKES, label="float64, B=3, T=5, d=8, gradients too")


# %% [hidden]
def _additive(m, query, keys, values, mask=None, *, tanh=True, v_a=True, v_first=False, swap=False,
              dim=-1, from_keys=False, from_scores=False, **softmax_change):
    """AdditiveAttention with one deliberate change, to recognise a common mistake."""
    q, k = (m.W_a(keys), m.U_a(query)) if swap else (m.W_a(query), m.U_a(keys))
    if swap:
        pre = q + k.unsqueeze(1)                                        # (B, T, d_a)
    else:
        pre = q.unsqueeze(1) + k                                        # (B, T, d_a)
    if v_first:
        scores = torch.tanh(m.v_a(pre)).squeeze(-1)
    elif not v_a:
        scores = torch.tanh(pre).sum(-1)
    else:
        scores = m.v_a(torch.tanh(pre) if tanh else pre).squeeze(-1)   # (B, T)
    weights = _softmax(scores, mask, dim=dim, **softmax_change)         # (B, T)
    mixed = scores if from_scores else weights
    context = (mixed.unsqueeze(1) @ (keys if from_keys else values)).squeeze(1)
    return context, weights


ADDITIVE_MISTAKES = [
    Mistake("tanh missing: the score is v_a(tanh(W_a(query) + U_a(keys)))",
            lambda m, *a, **k: _additive(m, *a, **k, tanh=False)),
    Mistake("v_a missing: the tanh features must be projected to one score by self.v_a, not summed",
            lambda m, *a, **k: _additive(m, *a, **k, v_a=False)),
    Mistake("tanh and v_a in the wrong order: the score is v_a(tanh(...)), not tanh(v_a(...))",
            lambda m, *a, **k: _additive(m, *a, **k, v_first=True)),
    Mistake("W_a and U_a swapped: W_a projects the query (decoder state), U_a the keys",
            lambda m, *a, **k: _additive(m, *a, **k, swap=True)),
    Mistake("softmax taken over the batch (dim 0): each example's weights are normalised over its "
            "own T positions", lambda m, *a, **k: _additive(m, *a, **k, dim=0)),
    Mistake("the context is a weighted sum of the keys: it must average the VALUES",
            lambda m, *a, **k: _additive(m, *a, **k, from_keys=True)),
    Mistake("the context was built from the raw scores: average the values with the softmax weights",
            lambda m, *a, **k: _additive(m, *a, **k, from_scores=True)),
    Mistake(INVERTED, lambda m, *a, **k: _additive(m, *a, **k, invert=True)),
    Mistake(INVERTED, lambda m, *a, **k: _additive(m, *a, **k, invert=True, fill=-1e9)),
    Mistake(AFTER, lambda m, *a, **k: _additive(m, *a, **k, after=True)),
    Mistake(ZERO_FILL, lambda m, *a, **k: _additive(m, *a, **k, zero_fill=True)),
    Mistake("mask ignored: pass it on to masked_softmax", lambda m, q, k, v, mask=None: _additive(m, q, k, v)),
]
AA = dict(mistakes=ADDITIVE_MISTAKES, checks=[rows_sum_to_one], deps=("masked_softmax",))


def _context_averages_values(probe, value):
    """The context is the returned weights' average of the values (whatever the scores were)."""
    context, weights = value
    if torch.allclose(context, (weights.unsqueeze(1) @ probe.args[2]).squeeze(1), atol=1e-5):
        return None
    return "the context is not sum_t weights[b, t] * values[b, t]: average the VALUES with the returned weights"


def _sums_to_one_over_positions(weights):
    sums = weights.sum(-1)
    return torch.allclose(sums, torch.ones_like(sums), atol=1e-4)


def _same_shapes_and_distributions(student, other):
    """The shapes test's rule: against the reference (or a mistake whose weights are distributions), the
    same shapes and weights that sum to 1; against any other mistake, its values (so it can be named)."""
    if not isinstance(student, tuple) or any(getattr(s, "shape", None) != o.shape for s, o in zip(student, other)):
        return False
    if _sums_to_one_over_positions(other[1]):
        return _sums_to_one_over_positions(student[1])
    return all(close(s, o) for s, o in zip(student, other))


# The shapes test judges shapes, weights that are distributions and a context that averages the values:
# a wrong score (tanh missing, v_a missing) costs the values and mask tests, not this one.
AA_SHAPES = dict(AA, checks=[_context_averages_values], equivalent=_same_shapes_and_distributions)


@hidden.test("test_AdditiveAttention_shapes")
def _(t):
    t.module("AdditiveAttention", dict(query_dim=5, key_dim=6, hidden_dim=4),
             t.randn(2, 5), t.randn(2, 7, 6), t.randn(2, 7, 3), label="d_q=5, d_k=6, d_v=3, d_a=4", **AA_SHAPES)
    t.module("AdditiveAttention", dict(query_dim=3, key_dim=8, hidden_dim=10),
             t.randn(4, 3), t.randn(4, 2, 8), t.randn(4, 2, 8), label="B=4, T=2, keys = values", **AA_SHAPES)


@hidden.test("test_AdditiveAttention_values")
def _(t):
    # Equal sizes first, so that swapped projections and keys-for-values run and can be named.
    keys = t.randn(3, 6, 4)
    t.module("AdditiveAttention", dict(query_dim=4, key_dim=4, hidden_dim=5),
             t.randn(3, 4), keys, t.randn(3, 6, 4), grad=True, label="d_q = d_k = d_v = 4, gradients too", **AA)
    # (Modules are probed in float32: the grader copies the reference's float32 parameters.)
    t.module("AdditiveAttention", dict(query_dim=6, key_dim=5, hidden_dim=7),
             t.randn(2, 6) * 2, t.randn(2, 9, 5) * 2, t.randn(2, 9, 3), grad=True,
             label="d_q=6, d_k=5, d_v=3, T=9, gradients too", **AA)


@hidden.test("test_AdditiveAttention_mask")
def _(t):
    t.module("AdditiveAttention", dict(query_dim=4, key_dim=4, hidden_dim=6),
             t.randn(4, 4), t.randn(4, 6, 4), t.randn(4, 6, 4), mask=_padding([6, 3, 1, 4], 6),
             label="a (B, T) padding mask, lengths [6, 3, 1, 4]", **AA)
    t.module("AdditiveAttention", dict(query_dim=3, key_dim=5, hidden_dim=4),
             t.randn(3, 3), t.randn(3, 7, 5), t.randn(3, 7, 2), mask=_random_mask(t, 3, 7), grad=True,
             label="a random (B, T) mask, gradients too", **AA)


# %% [hidden]
def _step(m, token, state, enc, enc_mask=None, *, attend_new=False, input_order=False, output_order=False,
          zero_state=False, logits_from_old=False, return_old=False, drop_mask=False):
    """BahdanauDecoder.forward_step with one deliberate change, to recognise a common mistake."""
    embedded = m.embedding(token)
    context, weights = m.attention(state, enc, enc, None if drop_mask else enc_mask)
    x = torch.cat([context, embedded] if input_order else [embedded, context], dim=-1)
    new_state = m.gru(x) if zero_state else m.gru(x, state)
    if attend_new:
        context, weights = m.attention(new_state, enc, enc, enc_mask)
    s = state if logits_from_old else new_state
    logits = m.out(torch.cat([context, s] if output_order else [s, context], dim=-1))
    return logits, (state if return_old else new_state), weights


DECODER_MISTAKES = [
    Mistake("context computed from the NEW state: Bahdanau attends with the previous state s_{i-1}, "
            "before the GRU step, and uses that context for both the GRU input and the output",
            lambda m, *a, **k: _step(m, *a, **k, attend_new=True)),
    Mistake("GRU input in the wrong order: use torch.cat([embedded, context], dim=-1)",
            lambda m, *a, **k: _step(m, *a, **k, input_order=True)),
    Mistake("output layer input in the wrong order: logits = self.out(torch.cat([new_state, context], dim=-1))",
            lambda m, *a, **k: _step(m, *a, **k, output_order=True)),
    Mistake("the GRU started from zeros: pass the previous state, self.gru(x, state)",
            lambda m, *a, **k: _step(m, *a, **k, zero_state=True)),
    Mistake("logits computed from the previous state: predict from the NEW state and the context",
            lambda m, *a, **k: _step(m, *a, **k, logits_from_old=True)),
    Mistake("returned the previous state: return the GRU's new state",
            lambda m, *a, **k: _step(m, *a, **k, return_old=True)),
    Mistake("enc_mask ignored: pass it on to self.attention",
            lambda m, *a, **k: _step(m, *a, **k, drop_mask=True)),
]


def _which_part_differs(probe, value):
    """For a (logits, new_state, weights) result: name the parts that differ."""
    if not (isinstance(value, tuple) and len(value) == 3):
        return None
    reference = getattr(probe.reference, probe.method)(*[a.clone() for a in probe.args],
                                                       **{k: v.clone() for k, v in probe.kwargs.items()})
    names = ("logits", "new_state", "weights")
    wrong = [n for n, got, want in zip(names, value, reference) if not close(got, want)]
    if not wrong:
        return None
    hints = {"weights": "weights: self.attention(state, enc_outputs, enc_outputs, enc_mask) with the previous state",
             "new_state": "new_state: self.gru(torch.cat([embedded, context], dim=-1), state)",
             "logits": "logits: self.out(torch.cat([new_state, context], dim=-1))"}
    return "these outputs differ from the reference: " + "; ".join(hints[n] for n in wrong)


BD = dict(method="forward_step", mistakes=DECODER_MISTAKES, checks=[_which_part_differs],
          deps=("masked_softmax", "AdditiveAttention"))
SQUARE = dict(vocab_size=9, embed_dim=6, enc_dim=6, hidden_dim=6, attn_dim=4)   # every cat order runs


@hidden.test("test_BahdanauDecoder_shapes")
def _(t):
    t.module("BahdanauDecoder", SQUARE, t.randint(0, 9, (3,)), t.randn(3, 6), t.randn(3, 5, 6),
             label="embed_dim = enc_dim = hidden_dim = 6", **BD)
    t.module("BahdanauDecoder", dict(vocab_size=13, embed_dim=4, enc_dim=10, hidden_dim=7, attn_dim=5),
             t.randint(0, 13, (2,)), t.randn(2, 7), t.randn(2, 8, 10),
             label="vocab 13, embed 4, enc 10, hidden 7, attn 5", **BD)


@hidden.test("test_BahdanauDecoder_step")
def _(t):
    t.module("BahdanauDecoder", SQUARE, t.randint(0, 9, (4,)), t.randn(4, 6), t.randn(4, 6, 6), grad=True,
             label="embed_dim = enc_dim = hidden_dim = 6, gradients too", **BD)
    t.module("BahdanauDecoder", dict(vocab_size=11, embed_dim=5, enc_dim=8, hidden_dim=6, attn_dim=7),
             t.randint(0, 11, (3,)), t.randn(3, 6), t.randn(3, 4, 8), grad=True,
             label="vocab 11, embed 5, enc 8, hidden 6, attn 7, gradients too", **BD)


@hidden.test("test_BahdanauDecoder_mask")
def _(t):
    t.module("BahdanauDecoder", SQUARE, t.randint(0, 9, (4,)), t.randn(4, 6), t.randn(4, 7, 6),
             _padding([7, 4, 1, 6], 7), label="a (B, T) padding mask, lengths [7, 4, 1, 6]", **BD)
    t.module("BahdanauDecoder", dict(vocab_size=10, embed_dim=3, enc_dim=4, hidden_dim=5, attn_dim=6),
             t.randint(0, 10, (3,)), t.randn(3, 5), t.randn(3, 6, 4), enc_mask=_random_mask(t, 3, 6), grad=True,
             label="a random (B, T) mask passed as enc_mask=, gradients too", **BD)
