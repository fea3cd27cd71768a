"""Reference solution (instructor-only) for chapter 01_bahdanau_attention.

generated from course/01_bahdanau_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # (..., T)
    return torch.softmax(scores, dim=-1)                    # (..., T)


def dot_score(query, keys):
    """Luong's dot-product alignment scores.

    Args:
        query: tensor of shape (B, d), one decoder state per example.
        keys:  tensor of shape (B, T, d), T encoder states per example.

    Returns:
        scores of shape (B, T) with scores[b, t] = query[b] . keys[b, t]
        (a plain dot product: no scaling, no softmax).
    """
    return (keys @ query.unsqueeze(-1)).squeeze(-1)  # (B, T, d) @ (B, d, 1) -> (B, T, 1) -> (B, T)


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
        B, T, _ = keys.size()
        q = self.W_a(query).unsqueeze(1)                         # (B, 1, d_a)
        k = self.U_a(keys)                                       # (B, T, d_a)
        scores = self.v_a(torch.tanh(q + k)).squeeze(-1)         # (B, T, 1) -> (B, T)
        weights = masked_softmax(scores, mask)                   # (B, T)
        context = (weights.unsqueeze(1) @ values).squeeze(1)     # (B, 1, T) @ (B, T, d_v) -> (B, d_v)
        return context, weights


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
        embedded = self.embedding(token)                                          # (B, d_e)
        context, weights = self.attention(state, enc_outputs, enc_outputs, enc_mask)  # (B, d_h), (B, T)
        new_state = self.gru(torch.cat([embedded, context], dim=-1), state)      # (B, d_s)
        logits = self.out(torch.cat([new_state, context], dim=-1))               # (B, V)
        return logits, new_state, weights


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F'
