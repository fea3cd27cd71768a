"""Reference solution (instructor-only) for chapter 02_self_attention.

generated from course/02_self_attention.py by `make generate`; do not edit.
"""



import math

import torch
import torch.nn as nn
import torch.nn.functional as F


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
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., N_q, N_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))     # (..., N_q, N_k)
    weights = torch.softmax(scores, dim=-1)                   # (..., N_q, N_k)
    output = weights @ value                                  # (..., N_q, d_v)
    return output, weights


def causal_mask(n):
    """Look-ahead mask for a sequence of length n.

    Returns a bool tensor of shape (n, n) whose entry [i, j] is True when
    query position i may attend to key position j, that is when j <= i:
    True on and below the diagonal, False above it.
    """
    return torch.tril(torch.ones(n, n, dtype=torch.bool))  # (n, n)


def padding_mask(lengths, max_len):
    """Key padding mask for a batch of padded sequences.

    Args:
        lengths: tensor of shape (B,) holding the true length of each sequence.
        max_len: the padded length N.

    Returns a bool tensor of shape (B, max_len) whose entry [b, j] is True
    when position j is a real token of sequence b, that is when
    j < lengths[b], and False at the padding positions.
    """
    lengths = torch.as_tensor(lengths)
    positions = torch.arange(max_len, device=lengths.device)  # (max_len,)
    return positions[None, :] < lengths[:, None]               # (B, max_len)


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
        q = self.W_q(x)  # (B, N, d_k)
        k = self.W_k(x)  # (B, N, d_k)
        v = self.W_v(x)  # (B, N, d_v)
        return scaled_dot_product_attention(q, k, v, mask)  # (B, N, d_v), (B, N, N)


EXPORTS_SOURCE = 'import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F'
